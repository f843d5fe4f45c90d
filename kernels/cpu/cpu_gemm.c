/*
 * cpu_gemm.c - y (+)= act(alpha * (x w^T + bias)) with fp16 weights.
 *
 * Two paths:
 *  - few rows (decode, m <= small_m): a direct kernel that widens each fp16
 *    weight row once and multiplies it with every x row.  Weights are read
 *    from memory exactly once, so decode runs at the memory-bandwidth
 *    roofline of 2 bytes per weight.  Each output is summed in the same
 *    order whatever m is (8 lanes over k, then a fixed horizontal sum).
 *  - many rows (prefill): weights are widened panel by panel into an fp32
 *    buffer that stays in cache, and the BLAS sgemm does the product; the
 *    panel conversion costs O(n k) against O(m n k) of arithmetic.
 * Both write through one epilogue (bias, alpha, relu, accumulate).
 */
#include "cpu_internal.h"

#include <cblas.h>
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <string.h>

/* Rows up to which the direct kernel is used; SLUICE_GEMM_SMALL_M overrides. */
static int small_m_limit(void)
{
	static int limit = -1;
	if (limit < 0) {
		const char *e = getenv("SLUICE_GEMM_SMALL_M");
		int v = e ? atoi(e) : 16;
		limit = v < 0 ? 0 : v;
	}
	return limit;
}

static inline float epilogue(const sl_gemm_args *a, float s, int n, float alpha, float old)
{
	if (a->bias)
		s += sl_half_to_float(a->bias[n]);
	s *= alpha;
	if ((a->flags & SL_GEMM_RELU) && !(s > 0.0f))
		s = 0.0f;
	return (a->flags & SL_GEMM_ACCUM) ? old + s : s;
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

void sl_cpu_half_to_float(const sl_half *src, float *dst, size_t n, int simd)
{
	if (simd) {
		sl_cpu_half_to_float_avx2(src, dst, n);
		return;
	}
	for (size_t i = 0; i < n; i++)
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
		for (int r = 0; r < MR; r++) {
			float sum = hsum256(c[j * MR + r]);
			for (int kk = k8; kk < k; kk++)
				sum += sl_half_to_float(w[j][kk]) * x[r][kk];
			float *y = a->y + (size_t)(r0 + r) * a->ldy + n + j;
			*y = epilogue(a, sum, n + j, alpha, *y);
		}
}

/* Columns [n0, n1) for all m rows: row blocks of 8, 4, 2, 1 with the
 * matching weight-row count, weight rows of a block read once from memory. */
__attribute__((target("avx2,fma,f16c")))
static void gemm_small_avx2(const sl_gemm_args *a, float alpha, int n0, int n1)
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

/* Portable twin of gemm_small_avx2 with the same summation order. */
static void gemm_small_scalar(const sl_gemm_args *a, float alpha, int n0, int n1)
{
	const int k = a->k, k8 = k & ~7;
	for (int n = n0; n < n1; n++) {
		const sl_half *w = a->w + (size_t)n * k;
		for (int r = 0; r < a->m; r++) {
			const float *x = a->x + (size_t)r * a->ldx;
			float lane[8] = { 0 };
			for (int kk = 0; kk < k8; kk += 8)
				for (int l = 0; l < 8; l++)
					lane[l] = fmaf(sl_half_to_float(w[kk + l]), x[kk + l], lane[l]);
			/* same tree as hsum256: (l0+l4, l1+l5, l2+l6, l3+l7), then pairs */
			float t0 = lane[0] + lane[4], t1 = lane[1] + lane[5];
			float t2 = lane[2] + lane[6], t3 = lane[3] + lane[7];
			float s = (t0 + t2) + (t1 + t3);
			for (int kk = k8; kk < k; kk++)
				s += sl_half_to_float(w[kk]) * x[kk];
			float *y = a->y + (size_t)r * a->ldy + n;
			*y = epilogue(a, s, n, alpha, *y);
		}
	}
}

static int gemm_panel(sl_backend *b, const sl_gemm_args *a, float alpha)
{
	sl_cpu_ctx *c = sl_cpu(b);
	const int m = a->m, n = a->n, k = a->k, nt = c->nthreads;
	/* panel of nb weight rows: about 4 MiB of fp32, a multiple of 16 rows */
	int nb = (int)((4u << 20) / ((size_t)k * sizeof(float)));
	nb = SL_MAX(16, nb & ~15);
	nb = SL_MIN(nb, n);
	const int mb = SL_MIN(m, 2048);
	SL_TRY(sl_cpu_grow(&c->gemm_wf, &c->gemm_wf_cap, (size_t)nb * k));
	SL_TRY(sl_cpu_grow(&c->gemm_c, &c->gemm_c_cap, (size_t)mb * nb));
	float *wf = c->gemm_wf, *ct = c->gemm_c;
	for (int n0 = 0; n0 < n; n0 += nb) {
		const int cur = SL_MIN(nb, n - n0);
#pragma omp parallel for num_threads(nt) schedule(static)
		for (int j = 0; j < cur; j++)
			sl_cpu_half_to_float(a->w + (size_t)(n0 + j) * k, wf + (size_t)j * k, (size_t)k,
					     c->simd);
		for (int m0 = 0; m0 < m; m0 += mb) {
			const int rows = SL_MIN(mb, m - m0);
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cur, k, 1.0f,
				    a->x + (size_t)m0 * a->ldx, a->ldx, wf, k, 0.0f, ct, cur);
#pragma omp parallel for num_threads(nt) schedule(static)
			for (int r = 0; r < rows; r++) {
				float *y = a->y + (size_t)(m0 + r) * a->ldy + n0;
				const float *s = ct + (size_t)r * cur;
				for (int j = 0; j < cur; j++)
					y[j] = epilogue(a, s[j], n0 + j, alpha, y[j]);
			}
		}
	}
	return 0;
}

int sl_cpu_gemm(sl_backend *b, sl_queue *q, const sl_gemm_args *a)
{
	if (a->m < 0 || a->n < 0 || a->k < 0 || a->ldx < a->k || a->ldy < a->n)
		return sl_err(SL_EINVAL, "gemm: bad shape m=%d n=%d k=%d ldx=%d ldy=%d", a->m, a->n,
			      a->k, a->ldx, a->ldy);
	if (a->m == 0 || a->n == 0)
		return 0;
	sl_cpu_ctx *c = sl_cpu(b);
	const float alpha = a->alpha == 0.0f ? 1.0f : a->alpha;
	double t0 = sl_now();
	int rc = 0;
	if (a->k == 0) { /* an empty sum: the epilogue alone */
		for (int r = 0; r < a->m; r++)
			for (int n = 0; n < a->n; n++) {
				float *y = a->y + (size_t)r * a->ldy + n;
				*y = epilogue(a, 0.0f, n, alpha, *y);
			}
	} else if (a->m <= small_m_limit()) {
		/* split n across threads in even chunks */
		const int nt = c->nthreads;
		const int chunk = ((a->n + nt - 1) / nt + 7) & ~7;
#pragma omp parallel for num_threads(nt) schedule(static)
		for (int n0 = 0; n0 < a->n; n0 += chunk) {
			int n1 = SL_MIN(a->n, n0 + chunk);
			if (c->simd)
				gemm_small_avx2(a, alpha, n0, n1);
			else
				gemm_small_scalar(a, alpha, n0, n1);
		}
	} else {
		rc = gemm_panel(b, a, alpha);
	}
	b->gemm_seconds += sl_now() - t0;
	b->gemm_flop += 2.0 * a->m * (double)a->n * a->k;
	return rc;
}
