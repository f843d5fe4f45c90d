/*
 * rope_kernels.cuh - rotary position embedding in place (the rotate_half
 * convention; backend.h's sl_rope_args).
 */
#ifndef SL_ROPE_KERNELS_CUH
#define SL_ROPE_KERNELS_CUH

#include "cuda_device.cuh"

#define SL_ROPE_THREADS 128
/* rows per launch: their positions and the inverse frequencies travel in
 * the kernel parameters (3 KiB, under the 4 KiB limit) */
#define SL_ROPE_PARAM_ROWS 512

typedef struct sl_rope_params {
	int pos[SL_ROPE_PARAM_ROWS];
	float inv_freq[SL_ROPE_MAX_HD / 2];
} sl_rope_params;

/*
 * One block per row of the chunk (grid: rows <= SL_ROPE_PARAM_ROWS; block:
 * SL_ROPE_THREADS).  The row's cos and sin go to shared memory first (each
 * angle the fp32 product of position and inverse frequency, as the CPU
 * computes it), then the block rotates the nh_q heads of q and the nh_k
 * heads of k, one (head, pair) per thread step.
 */
static __global__ void __launch_bounds__(SL_ROPE_THREADS)
sl_rope_kernel(int hd, int nh_q, int nh_k, float *q, long long ldq, float *k, long long ldk,
	       sl_rope_params prm)
{
	__shared__ float cs[SL_ROPE_MAX_HD];
	const int half = hd / 2, r = blockIdx.x;
	const float p = (float)prm.pos[r];
	for (int i = threadIdx.x; i < half; i += blockDim.x) {
		const float ang = p * prm.inv_freq[i];
		cs[2 * i] = cosf(ang);
		cs[2 * i + 1] = sinf(ang);
	}
	__syncthreads();
	const int pairs = (nh_q + nh_k) * half;
	for (int j = threadIdx.x; j < pairs; j += blockDim.x) {
		const int h = j / half, i = j - h * half;
		float *x = h < nh_q ? q + (size_t)r * ldq + (size_t)h * hd
				    : k + (size_t)r * ldk + (size_t)(h - nh_q) * hd;
		const float x1 = x[i], x2 = x[i + half];
		const float c = cs[2 * i], s = cs[2 * i + 1];
		x[i] = x1 * c - x2 * s;
		x[i + half] = x2 * c + x1 * s;
	}
}

#endif
