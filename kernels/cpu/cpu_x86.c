/*
 * cpu_x86.c - the CPU backend's x86 kernels (AVX2 + FMA + F16C), built
 * only for x86-64 (meson.build) and used only where the CPU has them
 * (sl_cpu_x86_isa).  Each computes exactly what its portable twin in
 * cpu_gemm.c computes, bit for bit: the same operations in the same order.
 */
#include "cpu_internal.h"

#include <immintrin.h>

sl_cpu_isa sl_cpu_x86_isa(void)
{
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
	    __builtin_cpu_supports("f16c"))
		return SL_CPU_AVX2;
	return SL_CPU_GENERIC;
}

__attribute__((target("avx2,fma,f16c")))
void sl_cpu_half_to_float_avx2(const sl_half *src, float *dst, size_t n)
{
	size_t i = 0;
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
	for (; i < n; i++)
		dst[i] = sl_half_to_float(src[i]);
}

__attribute__((target("avx2,fma")))
static inline float hsum256(__m256 v)
{
	__m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
	__m128 s = _mm_add_ps(lo, hi);
	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

/*
 * One register tile: NR weight rows against MR x rows, NR * MR <= 8
 * accumulators, each summing 8 lanes over k then reduced by hsum256, so
 * every output sees the same order of operations whatever the tile.
 * Weight rows are prefetched a few cache lines ahead: with several rows in
 * flight the hardware prefetcher alone falls behind.
 */
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline void tile_avx2(const sl_gemm_args *a, float alpha, int n, int r0, const int NR,
			     const int MR)
{
	const int k = a->k, k8 = k & ~7;
	const sl_half *w[8];
	const float *x[8];
	for (int j = 0; j < NR; j++)
		w[j] = a->w + (size_t)(n + j) * k;
	for (int r = 0; r < MR; r++)
		x[r] = a->x + (size_t)(r0 + r) * a->ldx;
	__m256 c[8];
	for (int i = 0; i < NR * MR; i++)
		c[i] = _mm256_setzero_ps();
	for (int kk = 0; kk < k8; kk += 8) {
		__m256 wv[8];
		for (int j = 0; j < NR; j++) {
			_mm_prefetch((const char *)(w[j] + kk) + 512, _MM_HINT_T0);
			wv[j] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w[j] + kk)));
		}
		for (int r = 0; r < MR; r++) {
			__m256 xv = _mm256_loadu_ps(x[r] + kk);
			for (int j = 0; j < NR; j++)
				c[j * MR + r] = _mm256_fmadd_ps(wv[j], xv, c[j * MR + r]);
		}
	}
	for (int j = 0; j < NR; j++)
		for (int r = 0; r < MR; r++)
			sl_cpu_gemm_finish(a, alpha, r0 + r, n + j, hsum256(c[j * MR + r]));
}

/* Columns [n0, n1) for all m rows: row blocks of 8, 4, 2, 1 with the
 * matching weight-row count, weight rows of a block read once from memory. */
__attribute__((target("avx2,fma,f16c")))
void sl_cpu_gemm_direct_avx2(const sl_gemm_args *a, float alpha, int n0, int n1)
{
	const int m = a->m;
	for (int n = n0; n < n1;) {
		int r0 = 0;
		int nr = (m >= 8) ? 1 : (m >= 4) ? 2 : (m >= 2) ? 4 : 8;
		nr = SL_MIN(nr, n1 - n);
		for (; r0 + 8 <= m; r0 += 8)
			for (int j = 0; j < nr; j++)
				tile_avx2(a, alpha, n + j, r0, 1, 8);
		for (; r0 + 4 <= m; r0 += 4) {
			if (nr == 2)
				tile_avx2(a, alpha, n, r0, 2, 4);
			else
				for (int j = 0; j < nr; j++)
					tile_avx2(a, alpha, n + j, r0, 1, 4);
		}
		for (; r0 + 2 <= m; r0 += 2) {
			if (nr == 4)
				tile_avx2(a, alpha, n, r0, 4, 2);
			else
				for (int j = 0; j < nr; j++)
					tile_avx2(a, alpha, n + j, r0, 1, 2);
		}
		for (; r0 < m; r0++) {
			if (nr == 8)
				tile_avx2(a, alpha, n, r0, 8, 1);
			else
				for (int j = 0; j < nr; j++)
					tile_avx2(a, alpha, n + j, r0, 1, 1);
		}
		n += nr;
	}
}
