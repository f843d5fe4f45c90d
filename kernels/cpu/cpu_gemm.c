/*
 * cpu_gemm.c - y (+)= act(alpha * (x w^T + bias)) with fp16 weights.
 *
 * Two paths:
 *  - few rows (decode, m <= small_m): a direct kernel (AVX2 in cpu_x86.c
 *    where the CPU has it, the portable twin here) that widens each fp16
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

void sl_cpu_half_to_float(const sl_half *src, float *dst, size_t n, int simd)
{
#if defined(__x86_64__)
	if (simd) {
		sl_cpu_half_to_float_avx2(src, dst, n);
		return;
	}
#endif
	for (size_t i = 0; i < n; i++)
		dst[i] = sl_half_to_float(src[i]);
}

/* Portable twin of sl_cpu_gemm_direct_avx2 (cpu_x86.c) with the same
 * summation order. */
static void gemm_direct_generic(const sl_gemm_args *a, float alpha, int n0, int n1)
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
			sl_cpu_gemm_finish(a, alpha, r, n, (t0 + t2) + (t1 + t3));
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
					y[j] = sl_cpu_epilogue(a, s[j], n0 + j, alpha, y[j]);
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
				*y = sl_cpu_epilogue(a, 0.0f, n, alpha, *y);
			}
	} else if (a->m <= small_m_limit()) {
		/* split n across threads in even chunks */
		const int nt = c->nthreads;
		const int chunk = ((a->n + nt - 1) / nt + 7) & ~7;
#pragma omp parallel for num_threads(nt) schedule(static)
		for (int n0 = 0; n0 < a->n; n0 += chunk) {
			int n1 = SL_MIN(a->n, n0 + chunk);
#if defined(__x86_64__)
			if (c->isa >= SL_CPU_AVX2) {
				sl_cpu_gemm_direct_avx2(a, alpha, n0, n1);
				continue;
			}
#endif
			gemm_direct_generic(a, alpha, n0, n1);
		}
	} else {
		rc = gemm_panel(b, a, alpha);
	}
	b->gemm_seconds += sl_now() - t0;
	b->gemm_flop += 2.0 * a->m * (double)a->n * a->k;
	return rc;
}
