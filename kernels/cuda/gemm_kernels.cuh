/*
 * gemm_kernels.cuh - the elementwise halves of the gemm op: fp32 -> fp16
 * conversion of the activations before cuBLAS, and the epilogue after it
 * (bias, alpha, ReLU, accumulation); and for 4-bit weights the fused
 * dequantising decode kernel and the dequantisation to fp16 before cuBLAS.
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

/* ---- 4-bit weights (sl_gemm_args.wq, common/sl_q4.h) ---------------------- */

/* The dequantised value of code q in a group (mn16, scale16): q / scale16 +
 * mn16, a division and an addition each rounded to nearest as in
 * sl_q4_value (the _rn intrinsics keep nvcc from contracting or
 * approximating; the emulation's C++ operators round the same way). */
static __device__ __forceinline__ float sl_q4_dev_value(unsigned q, float mn, float sc)
{
	if (sc == 0.f)
		return mn;
#ifdef SL_CU_EMU
	return (float)q / sc + mn;
#else
	return __fadd_rn(__fdiv_rn((float)q, sc), mn);
#endif
}

#define SL_GEMM_Q4_THREADS 256 /* 8 warps, one weight row (output column) each */
#define SL_GEMM_Q4_FUSED_M 8   /* rows of x up to which the fused kernel runs */

/*
 * The fused decode GEMM: y[r, c] (+)= act(alpha * (sum_kk x[r, kk] w[c, kk]
 * + bias[c])) for r < m <= SL_GEMM_Q4_FUSED_M, w dequantised in registers.
 * A warp owns one output column c: its lanes stride over the row's 32-bit
 * words of codes (8 elements each), dequantise each element once and
 * multiply it into the m accumulators; then a warp sum, and lane 0 applies
 * the epilogue (in the CPU backend's order: + bias, * alpha, ReLU, + old).
 * Codes: (n, G) groups of 32 bytes; meta after them, {mn16, scale16} each.
 * grid: ceil(n / 8); block: SL_GEMM_Q4_THREADS.
 */
static __global__ void __launch_bounds__(SL_GEMM_Q4_THREADS)
sl_gemm_q4_fused_kernel(int m, int n, int k, const float *__restrict__ x, long long ldx,
			const unsigned char *__restrict__ wq, const __half *bias, float alpha,
			int relu, int accum, float *y, long long ldy)
{
	const int lane = threadIdx.x & 31;
	const int c = blockIdx.x * (SL_GEMM_Q4_THREADS / 32) + (threadIdx.x >> 5);
	if (c >= n) /* a whole warp leaves together: no shuffle is left half-done */
		return;
	const int G = (k + 63) / 64, words = (k + 7) / 8;
	const unsigned char *codes = wq + (size_t)c * G * 32;
	const __half *meta = (const __half *)(wq + (size_t)n * G * 32) + (size_t)c * G * 2;
	float acc[SL_GEMM_Q4_FUSED_M];
#pragma unroll
	for (int r = 0; r < SL_GEMM_Q4_FUSED_M; r++)
		acc[r] = 0.f;
	for (int wi = lane; wi < words; wi += 32) {
		const int g = wi >> 3;
		const float mn = __half2float(meta[2 * g]), sc = __half2float(meta[2 * g + 1]);
		const unsigned word = (unsigned)codes[4 * wi] | (unsigned)codes[4 * wi + 1] << 8 |
				      (unsigned)codes[4 * wi + 2] << 16 |
				      (unsigned)codes[4 * wi + 3] << 24;
		const int k0 = wi * 8, kn = min(8, k - k0);
		for (int e = 0; e < kn; e++) {
			const float wv = sl_q4_dev_value((word >> (4 * e)) & 0xfu, mn, sc);
#pragma unroll
			for (int r = 0; r < SL_GEMM_Q4_FUSED_M; r++)
				if (r < m)
					acc[r] = fmaf(wv, x[(size_t)r * ldx + k0 + e], acc[r]);
		}
	}
	const float bv = bias ? __half2float(bias[c]) : 0.f;
#pragma unroll
	for (int r = 0; r < SL_GEMM_Q4_FUSED_M; r++) {
		if (r >= m) /* m is the same in every lane */
			break;
		float s = sl_warp_sum(acc[r]);
		if (lane == 0) {
			s = (s + bv) * alpha;
			if (relu && !(s > 0.f))
				s = 0.f;
			float *yp = y + (size_t)r * ldy + c;
			*yp = accum ? *yp + s : s;
		}
	}
}

/*
 * Rows [n0, n0 + rows) of 4-bit weights dequantised to fp16 (w16, rows x
 * k contiguous) for cuBLAS at large m.  n: the matrix's rows (the metadata
 * follows all n rows' codes).
 * grid: (ceil(k / 256), min(rows, 65535)); block: 256.
 */
static __global__ void __launch_bounds__(SL_GEMM_EW_THREADS)
sl_q4_to_f16_rows_kernel(int n0, int rows, int n, int k, const unsigned char *__restrict__ wq,
			 __half *__restrict__ w16)
{
	const int kk = blockIdx.x * SL_GEMM_EW_THREADS + threadIdx.x;
	if (kk >= k)
		return;
	const int G = (k + 63) / 64, g = kk >> 6, i = kk & 63;
	const __half *meta = (const __half *)(wq + (size_t)n * G * 32);
	for (int r = blockIdx.y; r < rows; r += gridDim.y) {
		const size_t gi = (size_t)(n0 + r) * G + g;
		const unsigned q = (wq[gi * 32 + (i >> 1)] >> ((i & 1) * 4)) & 0xfu;
		const float v = sl_q4_dev_value(q, __half2float(meta[2 * gi]),
						__half2float(meta[2 * gi + 1]));
		w16[(size_t)r * k + kk] = __float2half_rn(v);
	}
}

#endif
