/*
 * gemm_kernels.cuh - the elementwise halves of the gemm op: fp32 -> fp16
 * conversion of the activations before cuBLAS, and the epilogue after it
 * (bias, alpha, ReLU, accumulation).
 */
#ifndef SL_GEMM_KERNELS_CUH
#define SL_GEMM_KERNELS_CUH

#include "cuda_device.cuh"

#define SL_GEMM_EW_THREADS 256

/*
 * x16[r, c] = fp16(x[r, c]) for r < rows, c < k; x (rows, k) with row
 * stride ldx, x16 (rows, k) contiguous.
 * grid: (ceil(k / 256), min(rows, 65535)); block: 256.
 */
static __global__ void __launch_bounds__(SL_GEMM_EW_THREADS)
sl_f32_to_f16_rows_kernel(int rows, int k, const float *__restrict__ x, long long ldx,
			  __half *__restrict__ x16)
{
	const int c = blockIdx.x * SL_GEMM_EW_THREADS + threadIdx.x;
	if (c >= k)
		return;
	for (int r = blockIdx.y; r < rows; r += gridDim.y)
		x16[(size_t)r * k + c] = __float2half_rn(x[(size_t)r * ldx + c]);
}

/*
 * The epilogue, for r < m, c < n:
 *   v = (src ? src[r, c] : 0) + alpha * bias[c]    (src already holds alpha * x w^T)
 *   v = relu ? max(v, 0) : v
 *   y[r, c] = accum ? y[r, c] + v : v
 * src may be y itself (lds == ldy, accum 0): each element is read and
 * written by the same thread.
 * grid: (ceil(n / 256), min(m, 65535)); block: 256.
 */
static __global__ void __launch_bounds__(SL_GEMM_EW_THREADS)
sl_gemm_epilogue_kernel(int m, int n, const float *src, long long lds, const __half *bias,
			float alpha, int relu, int accum, float *y, long long ldy)
{
	const int c = blockIdx.x * SL_GEMM_EW_THREADS + threadIdx.x;
	if (c >= n)
		return;
	const float bv = bias ? alpha * __half2float(bias[c]) : 0.f;
	for (int r = blockIdx.y; r < m; r += gridDim.y) {
		float v = (src ? src[(size_t)r * lds + c] : 0.f) + bv;
		if (relu)
			v = fmaxf(v, 0.f);
		float *yp = y + (size_t)r * ldy + c;
		*yp = accum ? *yp + v : v;
	}
}

#endif
