/*
 * cuda_device.cuh - device helpers shared by the kernels: warp and block
 * reductions, fp16 loads.  Device code only (no runtime API), so that the
 * kernel headers that include it can also be built by the CPU emulation in
 * kernels/cuda/emu/ for testing without a GPU.
 *
 * Every reduction here is a full-warp operation: all 32 lanes of each warp
 * must call it (no lane may have returned), and the block versions need
 * every thread of the block, blockDim.x a multiple of 32.
 */
#ifndef SL_CUDA_DEVICE_CUH
#define SL_CUDA_DEVICE_CUH

#ifdef SL_CU_EMU
#include "emu/cuda_emu.h"
#else
#include <cuda_fp16.h>
/* the kernel's dynamic shared memory as an array of type */
#define SL_CU_DYN_SMEM(type, name) extern __shared__ type name[]
#endif

#define SL_CU_FULL_MASK 0xffffffffu

/* Host metadata travels to kernels by value, in chunks of this many ints
 * (kernel parameters are copied at launch, so the host array may change as
 * soon as the launch returns: no staging buffer, no synchronisation).  The
 * 4 KiB parameter limit holds with room for the other arguments. */
#define SL_CU_PARAM_INTS 768
typedef struct sl_cu_ints {
	int v[SL_CU_PARAM_INTS];
} sl_cu_ints;

/* Sum over the 32 lanes; every lane gets the same bits (the butterfly
 * adds the same pair in both partner lanes). */
static __device__ __forceinline__ float sl_warp_sum(float v)
{
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(SL_CU_FULL_MASK, v, o);
	return v;
}

static __device__ __forceinline__ float sl_warp_max(float v)
{
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(SL_CU_FULL_MASK, v, o));
	return v;
}

/* Sum over lanes within aligned groups of width lanes (a power of two <= 32). */
static __device__ __forceinline__ float sl_group_sum(float v, int width)
{
	for (int o = width >> 1; o > 0; o >>= 1)
		v += __shfl_xor_sync(SL_CU_FULL_MASK, v, o);
	return v;
}

/*
 * Block-wide sum and max; red is __shared__ float[32].  Every thread gets
 * the result.  The leading barrier lets one red serve consecutive calls.
 */
static __device__ __forceinline__ float sl_block_sum(float v, float *red)
{
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int nwarps = (blockDim.x + 31) >> 5;
	v = sl_warp_sum(v);
	__syncthreads();
	if (lane == 0)
		red[warp] = v;
	__syncthreads();
	return sl_warp_sum(lane < nwarps ? red[lane] : 0.f);
}

static __device__ __forceinline__ float sl_block_max(float v, float *red)
{
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int nwarps = (blockDim.x + 31) >> 5;
	v = sl_warp_max(v);
	__syncthreads();
	if (lane == 0)
		red[warp] = v;
	__syncthreads();
	return sl_warp_max(lane < nwarps ? red[lane] : -INFINITY);
}

/* 8 consecutive halves (16-byte aligned) widened to float. */
static __device__ __forceinline__ void sl_load_half8(const __half *p, float *f)
{
	const uint4 raw = *reinterpret_cast<const uint4 *>(p);
	const __half2 *h2 = reinterpret_cast<const __half2 *>(&raw);
#pragma unroll
	for (int i = 0; i < 4; i++) {
		const float2 t = __half22float2(h2[i]);
		f[2 * i] = t.x;
		f[2 * i + 1] = t.y;
	}
}

#endif
