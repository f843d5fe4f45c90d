/*
 * cpu_x86.c - the CPU backend's x86 kernels (AVX2 + FMA + F16C, and
 * AVX-512 F + DQ), built only for x86-64 (meson.build) and used only where
 * the CPU has them (sl_cpu_x86_isa).  Each computes exactly what its
 * portable twin in cpu_gemm.c computes, bit for bit: the same operations in
 * the same order (cpu_gemm.c's header).
 */
#include "cpu_internal.h"

#include <immintrin.h>
#include <string.h>

/*
 * The kernels that end in cpu_internal.h's scalar helpers (the output's
 * finish and epilogue) are flattened: every call inlined, so that the
 * helpers are compiled for the kernel's target (VEX-encoded).  Called out
 * of line they are legacy-SSE code, entered with the upper halves of the
 * vector registers dirty (GCC's vzeroupper insertion leaves the AVX-512
 * kernels' zmm16-31 out), and each SSE instruction then pays for the
 * transition: on the Xeon, opt-125m's 768 x 768 product of one row ran at
 * 18 GFLOP/s, flattened at 77, and decode at batch 1 was slower than at
 * batch 2 (bench/results/small-m-20261207-225646.md).
 */

sl_cpu_isa sl_cpu_x86_isa(void)
{
	__builtin_cpu_init();
	if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") ||
	    !__builtin_cpu_supports("f16c"))
		return SL_CPU_GENERIC;
	if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq"))
		return SL_CPU_AVX512;
	return SL_CPU_AVX2;
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
 * 4-bit weights (common/sl_q4.h): a group's 16 dequantised values
 * q / scale16 + mn16 as two vectors (codes 0-7, 8-15), a division and an
 * addition each, rounded once as in sl_q4_value; then 8 consecutive
 * elements at a time their codes (one 32-bit load: element i's nibble at
 * bit 4 i) select from them.
 */
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline void q4_lut_avx2(sl_half mn16, sl_half s16, __m256 *lo, __m256 *hi)
{
	const __m256 mn = _mm256_set1_ps(sl_half_to_float(mn16));
	if (s16 == 0) {
		*lo = *hi = mn;
		return;
	}
	const __m256 sc = _mm256_set1_ps(sl_half_to_float(s16));
	*lo = _mm256_add_ps(_mm256_div_ps(_mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), sc), mn);
	*hi = _mm256_add_ps(_mm256_div_ps(_mm256_setr_ps(8, 9, 10, 11, 12, 13, 14, 15), sc), mn);
}

__attribute__((target("avx2,fma,f16c"), always_inline))
static inline __m256 q4_8_avx2(const uint8_t *c4, __m256 lo, __m256 hi)
{
	uint32_t word;
	memcpy(&word, c4, 4);
	const __m256i q = _mm256_and_si256(
		_mm256_srlv_epi32(_mm256_set1_epi32((int)word),
				  _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
		_mm256_set1_epi32(0xf));
	const __m256 high = _mm256_castsi256_ps(_mm256_cmpgt_epi32(q, _mm256_set1_epi32(7)));
	return _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo, q), _mm256_permutevar8x32_ps(hi, q),
				high);
}

/*
 * One register tile: NR weight rows against MR x rows, NR * MR <= 8
 * accumulators, each summing 8 lanes over k then reduced by hsum256, so
 * every output sees the same order of operations whatever the tile.
 * Weight rows are prefetched a few cache lines ahead: with several rows in
 * flight the hardware prefetcher alone falls behind.  4-bit weights
 * (a->wq) are dequantised in registers, each row's group tables made at
 * the group's first step.
 */
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline void tile_avx2(const sl_gemm_args *a, float alpha, int n, int r0, const int NR,
			     const int MR)
{
	const int k = a->k, k8 = k & ~7;
	const sl_half *w[8];
	const uint8_t *qc[8];
	const sl_half *qm[8];
	const float *x[8];
	const size_t ng = sl_q4_groups((size_t)k);
	for (int j = 0; j < NR; j++) {
		if (a->wq) {
			const uint8_t *codes = (const uint8_t *)a->wq;
			qc[j] = codes + (size_t)(n + j) * ng * SL_Q4_CODE_BYTES;
			qm[j] = (const sl_half *)(codes + (size_t)a->n * ng * SL_Q4_CODE_BYTES) +
				(size_t)(n + j) * ng * 2;
		} else {
			w[j] = a->w + (size_t)(n + j) * k;
		}
	}
	for (int r = 0; r < MR; r++)
		x[r] = a->x + (size_t)(r0 + r) * a->ldx;
	__m256 c[8];
	for (int i = 0; i < NR * MR; i++)
		c[i] = _mm256_setzero_ps();
	__m256 lo[8], hi[8]; /* the rows' current group tables (4-bit) */
	for (int j = 0; j < NR; j++)
		lo[j] = hi[j] = _mm256_setzero_ps();
	for (int kk = 0; kk < k8; kk += 8) {
		__m256 wv[8];
		for (int j = 0; j < NR; j++) {
			if (a->wq) {
				const int g = kk >> 6;
				if ((kk & 63) == 0) {
					_mm_prefetch((const char *)(qc[j] + (size_t)g * 32) + 256,
						     _MM_HINT_T0);
					q4_lut_avx2(qm[j][2 * g], qm[j][2 * g + 1], &lo[j], &hi[j]);
				}
				wv[j] = q4_8_avx2(qc[j] + (size_t)g * 32 + ((kk & 63) >> 1), lo[j],
						  hi[j]);
				continue;
			}
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
__attribute__((target("avx2,fma,f16c"), flatten))
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

/*
 * The direct kernel with AVX-512 (fp16 weights): two weight rows share a
 * register, row n in lanes 0-7 and row n + 1 in lanes 8-15, each x chunk
 * of 8 broadcast to both halves, so each half's lanes see exactly the
 * fused multiply-adds of tile_avx2's (the same order, the same bits), at
 * twice the weights per instruction; each half reduced by
 * sl_cpu_lanes_sum (hsum256's tree).  A tile is NP such pairs (weight
 * rows n .. n + 2 NP - 1) against MR x rows, NP x MR <= 8 accumulators:
 * few x rows take more pairs, so that enough independent multiply-adds
 * are in flight.
 */
__attribute__((target("avx512f,avx512dq,avx512vl,avx2,fma,f16c"), always_inline))
static inline void tilep_avx512(const sl_gemm_args *a, float alpha, int n, int r0, const int NP, const int MR)
{
	const int k = a->k, k8 = k & ~7;
	const sl_half *w[4];
	for (int p = 0; p < NP; p++)
		w[p] = a->w + (size_t)(n + 2 * p) * k;
	const float *x[8];
	for (int r = 0; r < MR; r++)
		x[r] = a->x + (size_t)(r0 + r) * a->ldx;
	__m512 c[8];
	for (int i = 0; i < NP * MR; i++)
		c[i] = _mm512_setzero_ps();
	for (int kk = 0; kk < k8; kk += 8) {
		__m512 wv[4];
		for (int p = 0; p < NP; p++) {
			_mm_prefetch((const char *)(w[p] + kk) + 512, _MM_HINT_T0);
			_mm_prefetch((const char *)(w[p] + k + kk) + 512, _MM_HINT_T0);
			const __m256i h = _mm256_inserti128_si256(
				_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(w[p] + kk))),
				_mm_loadu_si128((const __m128i *)(w[p] + k + kk)), 1);
			wv[p] = _mm512_cvtph_ps(h);
		}
		for (int r = 0; r < MR; r++) {
			const __m512 xv = _mm512_broadcast_f32x8(_mm256_loadu_ps(x[r] + kk));
			for (int p = 0; p < NP; p++)
				c[p * MR + r] = _mm512_fmadd_ps(wv[p], xv, c[p * MR + r]);
		}
	}
	for (int p = 0; p < NP; p++)
		for (int r = 0; r < MR; r++) {
			float l[16];
			_mm512_storeu_ps(l, c[p * MR + r]);
			sl_cpu_gemm_finish(a, alpha, r0 + r, n + 2 * p, sl_cpu_lanes_sum(l));
			sl_cpu_gemm_finish(a, alpha, r0 + r, n + 2 * p + 1, sl_cpu_lanes_sum(l + 8));
		}
}

__attribute__((target("avx512f,avx512dq,avx512vl,avx2,fma,f16c"), flatten))
void sl_cpu_gemm_direct_avx512(const sl_gemm_args *a, float alpha, int n0, int n1)
{
	const int m = a->m;
	int n = n0;
	if (m >= 1 && m < 8) { /* 1 row: 4 pairs; 2 to 7 rows: 2 pairs */
		const int np = m == 1 ? 4 : 2;
		for (; n + 2 * np <= n1; n += 2 * np) {
			if (np == 4) {
				tilep_avx512(a, alpha, n, 0, 4, 1);
				continue;
			}
			int r0 = 0;
			if (m >= 4) {
				tilep_avx512(a, alpha, n, 0, 2, 4);
				r0 = 4;
			}
			if (r0 + 2 <= m) {
				tilep_avx512(a, alpha, n, r0, 2, 2);
				r0 += 2;
			}
			if (r0 < m)
				tilep_avx512(a, alpha, n, r0, 2, 1);
		}
	}
	for (; n + 2 <= n1; n += 2) {
		int r0 = 0;
		for (; r0 + 8 <= m; r0 += 8)
			tilep_avx512(a, alpha, n, r0, 1, 8);
		for (; r0 + 4 <= m; r0 += 4)
			tilep_avx512(a, alpha, n, r0, 1, 4);
		for (; r0 + 2 <= m; r0 += 2)
			tilep_avx512(a, alpha, n, r0, 1, 2);
		for (; r0 < m; r0++)
			tilep_avx512(a, alpha, n, r0, 1, 1);
	}
	if (n < n1)
		sl_cpu_gemm_direct_avx2(a, alpha, n, n1);
}

/* Twin of sl_cpu_q4_rows (cpu_gemm.c), with q4_lut_avx2 and q4_8_avx2. */
__attribute__((target("avx2,fma,f16c")))
void sl_cpu_q4_rows_avx2(const sl_gemm_args *a, int n0, int rows, float *dst, size_t ld, size_t cs,
			 int kend)
{
	const size_t ng = sl_q4_groups((size_t)a->k);
	const uint8_t *codes = (const uint8_t *)a->wq;
	const sl_half *meta = (const sl_half *)(codes + (size_t)a->n * ng * SL_Q4_CODE_BYTES);
	for (int j = 0; j < rows; j++) {
		float *d = dst + (size_t)j * ld;
		for (size_t g = 0; g < ng && (int)g * SL_Q4_GROUP < kend; g++) {
			const size_t gi = (size_t)(n0 + j) * ng + g;
			const uint8_t *cg = codes + gi * SL_Q4_CODE_BYTES;
			const sl_half mn16 = meta[2 * gi], s16 = meta[2 * gi + 1];
			__m256 lo, hi;
			q4_lut_avx2(mn16, s16, &lo, &hi);
			const int c0 = (int)g * SL_Q4_GROUP, cn = SL_MIN(SL_Q4_GROUP, kend - c0);
			int i = 0;
			for (; i + 8 <= cn; i += 8)
				_mm256_storeu_ps(d + (size_t)((c0 + i) >> 3) * cs,
						 q4_8_avx2(cg + i / 2, lo, hi));
			for (; i < cn; i++) {
				const int kk = c0 + i;
				d[(size_t)(kk >> 3) * cs + (kk & 7)] =
					sl_q4_value(sl_q4_code(cg, i), mn16, s16);
			}
		}
	}
}

/* ---- the packed path (cpu_internal.h, sl_gemm_tile) ----------------------- */

/* Twin of cpu_gemm.c's pack_w_generic. */
__attribute__((target("avx2,fma,f16c")))
void sl_cpu_pack_w_avx2(const sl_half *w, int k, int rows, int s0, int s1, float *dst)
{
	for (int j = 0; j < 8; j++) {
		const sl_half *src = w + (size_t)j * k;
		float *d = dst + j * 8;
		for (int s = s0; s < s1; s++, d += 64)
			_mm256_store_ps(d, j < rows ? _mm256_cvtph_ps(_mm_loadu_si128(
							      (const __m128i *)(src + 8 * s)))
						    : _mm256_setzero_ps());
	}
}

/* AVX2 tile: 3 rows, the group's columns four at a time (12 accumulators
 * of 8 lanes), each reduced by hsum256. */
__attribute__((target("avx2,fma,f16c"), flatten))
void sl_cpu_gemm_tile_avx2(const sl_gemm_tile *t)
{
	enum { MR = SL_GEMM_MR_AVX2 };
	const sl_gemm_args *a = t->a;
	const int steps = t->s1 - t->s0;
	for (int c0 = 0; c0 < 8; c0 += 4) {
		__m256 acc[MR][4];
		for (int r = 0; r < MR; r++)
			for (int c = 0; c < 4; c++)
				acc[r][c] = t->s0 ? _mm256_load_ps(t->part + r * 64 + (c0 + c) * 8)
						  : _mm256_setzero_ps();
		const float *ws = t->wp + c0 * 8;
		for (int s = 0; s < steps; s++, ws += 64) {
			/* the 3 x rows held, each column loaded once: 16 registers */
			const __m256 x0 = _mm256_loadu_ps(t->x[0] + 8 * s);
			const __m256 x1 = _mm256_loadu_ps(t->x[1] + 8 * s);
			const __m256 x2 = _mm256_loadu_ps(t->x[2] + 8 * s);
			for (int c = 0; c < 4; c++) {
				const __m256 w = _mm256_load_ps(ws + c * 8);
				acc[0][c] = _mm256_fmadd_ps(w, x0, acc[0][c]);
				acc[1][c] = _mm256_fmadd_ps(w, x1, acc[1][c]);
				acc[2][c] = _mm256_fmadd_ps(w, x2, acc[2][c]);
			}
		}
		for (int r = 0; r < MR; r++)
			for (int c = 0; c < 4; c++) {
				if (t->s1 < t->ks)
					_mm256_store_ps(t->part + r * 64 + (c0 + c) * 8, acc[r][c]);
				else if (t->r0 + r < a->m && t->n0 + c0 + c < a->n)
					sl_cpu_gemm_finish(a, t->alpha, t->r0 + r, t->n0 + c0 + c,
							   hsum256(acc[r][c]));
			}
	}
}

/*
 * The lanes of 16 outputs, two rows of 8 columns, reduced at once: P[p]
 * holds row r's columns 2p and 2p + 1 (8 lanes each), Q[p] row r + 1's.
 * Every sum is the tree of sl_cpu_lanes_sum, done for 16 outputs by
 * whole-register adds between shuffled copies; the result is row r's 8
 * columns then row r + 1's.
 */
__attribute__((target("avx512f,avx512dq")))
static inline __m512 reduce16(const __m512 P[4], const __m512 Q[4])
{
	const int lo = _MM_SHUFFLE(2, 0, 2, 0), hi = _MM_SHUFFLE(3, 1, 3, 1);
	/* 128-bit lanes: [c lanes 0-3 | c lanes 4-7 | c+1 0-3 | c+1 4-7] ->
	 * t_i = l_i + l_{i+4} for 4 columns per register */
	const __m512 p01 = _mm512_add_ps(_mm512_shuffle_f32x4(P[0], P[1], lo),
					 _mm512_shuffle_f32x4(P[0], P[1], hi));
	const __m512 p23 = _mm512_add_ps(_mm512_shuffle_f32x4(P[2], P[3], lo),
					 _mm512_shuffle_f32x4(P[2], P[3], hi));
	const __m512 q01 = _mm512_add_ps(_mm512_shuffle_f32x4(Q[0], Q[1], lo),
					 _mm512_shuffle_f32x4(Q[0], Q[1], hi));
	const __m512 q23 = _mm512_add_ps(_mm512_shuffle_f32x4(Q[2], Q[3], lo),
					 _mm512_shuffle_f32x4(Q[2], Q[3], hi));
	/* u0 = t0 + t2, u1 = t1 + t3: [u0 u1 of column j | u0 u1 of column j+4] */
	const __m512 pu = _mm512_add_ps(_mm512_shuffle_ps(p01, p23, _MM_SHUFFLE(1, 0, 1, 0)),
					_mm512_shuffle_ps(p01, p23, _MM_SHUFFLE(3, 2, 3, 2)));
	const __m512 qu = _mm512_add_ps(_mm512_shuffle_ps(q01, q23, _MM_SHUFFLE(1, 0, 1, 0)),
					_mm512_shuffle_ps(q01, q23, _MM_SHUFFLE(3, 2, 3, 2)));
	/* u0 + u1: 128-bit lane j = [r: j, j+4 | r+1: j, j+4] */
	const __m512 sum = _mm512_add_ps(_mm512_shuffle_ps(pu, qu, _MM_SHUFFLE(2, 0, 2, 0)),
					 _mm512_shuffle_ps(pu, qu, _MM_SHUFFLE(3, 1, 3, 1)));
	const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
	return _mm512_permutexvar_ps(order, sum);
}

/* sl_cpu_epilogue on 16 sums, rows r and r + 1 of the 8 columns from n0. */
__attribute__((target("avx512f,avx512dq,f16c")))
static inline void epilogue16(const sl_gemm_tile *t, int r, __m512 s)
{
	const sl_gemm_args *a = t->a;
	if (a->bias) {
		const __m256 b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a->bias + t->n0)));
		s = _mm512_add_ps(s, _mm512_insertf32x8(_mm512_castps256_ps512(b), b, 1));
	}
	s = _mm512_mul_ps(s, _mm512_set1_ps(t->alpha));
	if (a->flags & SL_GEMM_RELU)
		s = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(s, _mm512_setzero_ps(), _CMP_GT_OQ), s);
	float *y0 = a->y + (size_t)r * a->ldy + t->n0, *y1 = y0 + a->ldy;
	__m256 lo = _mm512_castps512_ps256(s), hi = _mm512_extractf32x8_ps(s, 1);
	if (a->flags & SL_GEMM_ACCUM) {
		lo = _mm256_add_ps(_mm256_loadu_ps(y0), lo);
		hi = _mm256_add_ps(_mm256_loadu_ps(y1), hi);
	}
	_mm256_storeu_ps(y0, lo);
	_mm256_storeu_ps(y1, hi);
}

/*
 * AVX-512 tile: 6 rows x 8 columns, each register holding two outputs' 8
 * lanes (columns 2p and 2p + 1 of one row): per step, 4 loads of the group,
 * 6 broadcasts of x and 24 fused multiply-adds.  The lanes are the same as
 * every other kernel's, so are the sums.
 */
__attribute__((target("avx512f,avx512dq,f16c")))
void sl_cpu_gemm_tile_avx512(const sl_gemm_tile *t)
{
	enum { MR = SL_GEMM_MR_AVX512 };
	const sl_gemm_args *a = t->a;
	__m512 acc[MR][4];
	for (int r = 0; r < MR; r++)
		for (int p = 0; p < 4; p++)
			acc[r][p] = t->s0 ? _mm512_load_ps(t->part + r * 64 + p * 16) : _mm512_setzero_ps();
	const float *ws = t->wp;
	for (int s = 0; s < t->s1 - t->s0; s++, ws += 64) {
		const __m512 w0 = _mm512_load_ps(ws), w1 = _mm512_load_ps(ws + 16);
		const __m512 w2 = _mm512_load_ps(ws + 32), w3 = _mm512_load_ps(ws + 48);
		for (int r = 0; r < MR; r++) {
			const __m512 x = _mm512_broadcast_f32x8(_mm256_loadu_ps(t->x[r] + 8 * s));
			acc[r][0] = _mm512_fmadd_ps(w0, x, acc[r][0]);
			acc[r][1] = _mm512_fmadd_ps(w1, x, acc[r][1]);
			acc[r][2] = _mm512_fmadd_ps(w2, x, acc[r][2]);
			acc[r][3] = _mm512_fmadd_ps(w3, x, acc[r][3]);
		}
	}
	if (t->s1 < t->ks) {
		for (int r = 0; r < MR; r++)
			for (int p = 0; p < 4; p++)
				_mm512_store_ps(t->part + r * 64 + p * 16, acc[r][p]);
		return;
	}
	const bool whole = (a->k & 7) == 0 && t->n0 + 8 <= a->n;
	for (int r = 0; r < MR; r += 2) {
		const int row = t->r0 + r;
		if (row >= a->m)
			break;
		const __m512 sum = reduce16(acc[r], acc[r + 1]);
		if (whole && row + 1 < a->m) {
			epilogue16(t, row, sum);
			continue;
		}
		float v[16];
		_mm512_storeu_ps(v, sum);
		for (int q = 0; q < 2 && row + q < a->m; q++)
			for (int c = 0; c < 8 && t->n0 + c < a->n; c++)
				sl_cpu_gemm_finish(a, t->alpha, row + q, t->n0 + c, v[q * 8 + c]);
	}
}
