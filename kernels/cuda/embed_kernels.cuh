/*
 * embed_kernels.cuh - gather fp16 table rows into fp32 activations.
 */
#ifndef SL_EMBED_KERNELS_CUH
#define SL_EMBED_KERNELS_CUH

#include "cuda_device.cuh"

#define SL_EMBED_THREADS 256

/*
 * y[r, c] (+)= table[idx[r], c] for r < rows (the chunk, <= SL_CU_PARAM_INTS),
 * c < n.  The indices come by value in the kernel parameters.
 * grid: (ceil(n / 256), rows); block: 256.
 */
static __global__ void __launch_bounds__(SL_EMBED_THREADS)
sl_embed_kernel(int n, const __half *__restrict__ table, sl_cu_ints idx, float *__restrict__ y,
		int accum)
{
	const int c = blockIdx.x * SL_EMBED_THREADS + threadIdx.x;
	if (c >= n)
		return;
	const int r = blockIdx.y;
	const float v = __half2float(table[(size_t)idx.v[r] * n + c]);
	float *yp = y + (size_t)r * n + c;
	*yp = accum ? *yp + v : v;
}

#endif
