/*
 * layernorm_kernels.cuh - row layer normalisation, fp32 math, fp16
 * gamma/beta.
 */
#ifndef SL_LAYERNORM_KERNELS_CUH
#define SL_LAYERNORM_KERNELS_CUH

#include "cuda_device.cuh"

/*
 * One block per row (grid: rows; block: a multiple of 32).  Two passes
 * over the row for the mean and the (biased) variance, a third to write:
 *   y = (x - mean) / sqrt(var + eps) * gamma + beta
 * x == y is allowed: the row is read in full (passes 1 and 2, closed by
 * the barriers in sl_block_sum) before any of it is written, and in the
 * last pass each thread reads and writes only its own elements.
 * gamma or beta NULL is taken as 1 or 0.
 */
static __global__ void __launch_bounds__(1024)
sl_layernorm_kernel(int n, const float *x, long long ldx, const __half *gamma,
		    const __half *beta, float eps, float *y, long long ldy)
{
	__shared__ float red[32];
	const float *xr = x + (size_t)blockIdx.x * ldx;
	float *yr = y + (size_t)blockIdx.x * ldy;

	float s = 0.f;
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		s += xr[i];
	const float mean = sl_block_sum(s, red) / (float)n;

	float v = 0.f;
	for (int i = threadIdx.x; i < n; i += blockDim.x) {
		const float d = xr[i] - mean;
		v += d * d;
	}
	const float var = sl_block_sum(v, red) / (float)n;
	const float rstd = 1.f / sqrtf(var + eps);

	for (int i = threadIdx.x; i < n; i += blockDim.x) {
		float t = (xr[i] - mean) * rstd;
		if (gamma)
			t *= __half2float(gamma[i]);
		if (beta)
			t += __half2float(beta[i]);
		yr[i] = t;
	}
}

#endif
