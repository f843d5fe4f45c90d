/*
 * argmax_kernels.cuh - the smallest index of each row's maximum.
 */
#ifndef SL_ARGMAX_KERNELS_CUH
#define SL_ARGMAX_KERNELS_CUH

#include "cuda_device.cuh"

#define SL_ARGMAX_THREADS 512

/* Keep (v, i) or take (v2, i2): the larger value, the smaller index on a
 * tie; i < 0 marks "nothing yet" (an empty or all-NaN range). */
static __device__ __forceinline__ void sl_argmax_merge(float &v, int &i, float v2, int i2)
{
	if (i2 < 0)
		return;
	if (i < 0 || v2 > v || (v2 == v && i2 < i)) {
		v = v2;
		i = i2;
	}
}

/*
 * out[r] = argmax x[r, 0..n) (rows of stride ldx), or -1 where the row holds
 * a value that is not finite (NaN or an infinity).  One block per row
 * (grid: rows; block: 512).
 */
static __global__ void __launch_bounds__(SL_ARGMAX_THREADS)
sl_argmax_kernel(int n, const float *__restrict__ x, long long ldx, int *__restrict__ out)
{
	__shared__ float sv[32];
	__shared__ int si[32];
	__shared__ int nonfinite;
	const float *xr = x + (size_t)blockIdx.x * ldx;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

	if (threadIdx.x == 0)
		nonfinite = 0;
	__syncthreads();
	float best = 0.f;
	int bi = -1;
	bool finite = true;
	for (int i = threadIdx.x; i < n; i += SL_ARGMAX_THREADS) {
		const float v = xr[i];
		finite = finite && v - v == 0.f; /* false for NaN and the infinities */
		if (v == v && (bi < 0 || v > best)) { /* indices rise: ties keep the first */
			best = v;
			bi = i;
		}
	}
	if (!finite)
		nonfinite = 1; /* read after the barrier below */
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) {
		const float v2 = __shfl_xor_sync(SL_CU_FULL_MASK, best, o);
		const int i2 = __shfl_xor_sync(SL_CU_FULL_MASK, bi, o);
		sl_argmax_merge(best, bi, v2, i2);
	}
	if (lane == 0) {
		sv[warp] = best;
		si[warp] = bi;
	}
	__syncthreads();
	if (warp == 0) {
		best = lane < SL_ARGMAX_THREADS / 32 ? sv[lane] : 0.f;
		bi = lane < SL_ARGMAX_THREADS / 32 ? si[lane] : -1;
#pragma unroll
		for (int o = 16; o > 0; o >>= 1) {
			const float v2 = __shfl_xor_sync(SL_CU_FULL_MASK, best, o);
			const int i2 = __shfl_xor_sync(SL_CU_FULL_MASK, bi, o);
			sl_argmax_merge(best, bi, v2, i2);
		}
		if (lane == 0)
			out[blockIdx.x] = nonfinite || bi < 0 ? -1 : bi;
	}
}

#endif
