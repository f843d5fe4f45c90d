/*
 * rmsnorm_kernels.cuh - row RMS normalisation (Llama's RMSNorm), fp32 math,
 * fp16 gamma.
 */
#ifndef SL_RMSNORM_KERNELS_CUH
#define SL_RMSNORM_KERNELS_CUH

#include "cuda_device.cuh"

/*
 * One block per row (grid: rows; block: a multiple of 32).  One pass over
 * the row for the mean of the squares, a second to write:
 *   y = (x / sqrt(mean(x^2) + eps)) * gamma
 * x == y is allowed: the row is read in full (closed by the barriers in
 * sl_block_sum) before any of it is written, and in the last pass each
 * thread reads and writes only its own elements.
 */
static __global__ void __launch_bounds__(1024)
sl_rmsnorm_kernel(int n, const float *x, long long ldx, const __half *gamma, float eps, float *y,
		  long long ldy)
{
	__shared__ float red[32];
	const float *xr = x + (size_t)blockIdx.x * ldx;
	float *yr = y + (size_t)blockIdx.x * ldy;

	float s = 0.f;
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		s += xr[i] * xr[i];
	const float ms = sl_block_sum(s, red) / (float)n;
	const float rstd = 1.f / sqrtf(ms + eps);

	for (int i = threadIdx.x; i < n; i += blockDim.x)
		yr[i] = (xr[i] * rstd) * __half2float(gamma[i]);
}

#endif
