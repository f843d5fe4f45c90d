/*
 * swiglu_kernels.cuh - out = silu(gate) * up, elementwise in fp32.
 */
#ifndef SL_SWIGLU_KERNELS_CUH
#define SL_SWIGLU_KERNELS_CUH

#include "cuda_device.cuh"

#define SL_SWIGLU_THREADS 256

/*
 * A grid-stride loop over the rows * n elements (a grid's y dimension
 * would cap the rows at 65535).  expf is the accurate one (no fast math),
 * as the CPU's.  out may be gate or up: each element is read before its
 * own write, by the same thread.
 */
static __global__ void __launch_bounds__(SL_SWIGLU_THREADS)
sl_swiglu_kernel(int rows, int n, const float *gate, long long ldg, const float *up,
		 long long ldu, float *out, long long ldo)
{
	const long long total = (long long)rows * n;
	for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total;
	     e += (long long)gridDim.x * blockDim.x) {
		const long long r = e / n, i = e - r * n;
		const float g = gate[r * ldg + i];
		out[r * ldo + i] = g / (1.f + expf(-g)) * up[r * ldu + i];
	}
}

#endif
