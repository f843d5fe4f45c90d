/*
 * cpu_gemm.c - y (+)= act(alpha * (x w^T + bias)) with fp16 weights.
 *
 * Every output is computed by one fixed sequence of operations, whatever
 * the number of rows m, the row's place among them, the path below, the
 * thread count or the instruction set (cpu_internal.h, sl_cpu_isa):
 *   lane l (0..7) sums x[kk] * w[kk] for kk = l, l + 8, l + 16, ... below
 *   k8 = k & ~7 with fused multiply-adds in increasing kk, from zero;
 *   the lanes are reduced by the one tree of sl_cpu_lanes_sum; the terms
 *   kk >= k8 are added one at a time (multiply, then add); then the
 *   epilogue: + bias, * alpha, ReLU, + the old y (sl_cpu_epilogue).
 * So a sequence's logits are the same bits alone or in any batch, any
 * micro-batch split, any padding and any --threads (batch invariance), and
 * a portable kernel checks its x86 twin bit for bit (tests/test_ops.c).
 * The paths differ only in speed:
 *  - direct (m <= SLUICE_GEMM_SMALL_M, default 8: decode): each fp16
 *    weight row is widened in registers and multiplied with every x row;
 *    the weights are read from memory once, so decode runs at the memory
 *    bandwidth roofline of 2 bytes per weight.
 *  - packed (prefill): work items of a block of up to GEMM_MB rows and a
 *    panel of columns, shared out to the threads as they come free; per
 *    item, the panel's weights widened to fp32 (at most ~1 MiB: it stays
 *    in the core's cache), then a register-tiled kernel over each (tile of
 *    the kernel's rows, 8 columns), k in chunks of at most GEMM_KSTEPS_CHUNK
 *    steps (the chunk of the tile's x rows stays in the L1 cache) whose
 *    partial lanes wait in memory between chunks, which keeps the order
 *    above.  The conversion costs O(n k) per block against O(mb n k) of
 *    arithmetic.
 * Kernels: AVX-512 and AVX2 in cpu_x86.c, the portable C ones here.
 *
 * 4-bit weights (a->wq, common/sl_q4.h): the same order of operations on
 * the dequantised fp32 weights in place of the widened fp16 ones, so the
 * paths, thread counts and instruction sets agree bit for bit here too.
 * The direct path dequantises in registers as it goes (AVX2: per group of
 * a weight row its 16 values as two vectors, then a permute per 8 codes;
 * the portable kernel a row at a time into a per-thread buffer of k
 * floats); the packed path dequantises straight into its widened panel;
 * the tail terms past k & ~7 one element at a time (sl_cpu_gemm_finish).
 * Never a dequantised copy of the whole matrix.
 *
 * --cpu-gemm amx (cpu_amx.c) gives the packed path's products to AMX tiles
 * in bf16 where the CPU has them: several times the packed path's rate,
 * at bf16's precision, not batch invariant.  --cpu-gemm bf16 computes the
 * same products with AVX512-BF16 dot products (AMD Zen 4 and later, Intel
 * Cooper Lake and later): up to twice the fp32 FMAs' rate; and those of 5
 * to 8 rows (bf16_rows) the direct kernel would compute.
 *
 * --cpu-gemm openblas (sl_cpu_backend_set_gemm, in a build with OpenBLAS)
 * replaces the packed path by OpenBLAS's sgemm on weights widened panel by
 * panel, then the same epilogue.  sgemm's kernel, blocking and threads
 * depend on m, so that path is not batch invariant; it is there for CPUs
 * where OpenBLAS has a kernel faster than the packed path's.
 */
#include "cpu_internal.h"
#include "sl_config.h"

#if defined(SL_HAVE_OPENBLAS) && SL_HAVE_OPENBLAS
#include <cblas.h>
#endif
#include <math.h>
#include <omp.h>
#include <string.h>

enum {
	GEMM_MB = 480,             /* rows per block (a multiple of every kernel's rows) */
	GEMM_PANEL = 1 << 20,      /* bytes of a widened weight panel, at most */
	GEMM_KSTEPS_CHUNK = 96,    /* k steps of an x tile at a time, at most */
	GEMM_MR_GENERIC = 4,       /* rows of the generic tile kernel */
};

/* --cpu-gemm bf16 also takes the direct kernel's products of BF16_MIN_M
 * rows and more (fp16 weights, k a multiple of 32): with 5 to 8 rows a
 * decode step's fp32 FMAs are compute-bound (opt-1.3b's weights at 13 GB/s
 * on a Zen 4), the dot products' two products an instruction less so (17
 * GB/s: the weights' conversion and transpose into tiles is now the cost),
 * 1.23x to 1.25x the decode; at 4 rows the fp32 kernel is still the faster
 * (bench/results/bf16-decode-20261206.md). */
enum { BF16_MIN_M = 5 };

static bool bf16_rows(const sl_cpu_ctx *c, const sl_gemm_args *a)
{
	return c->gemm_bf16 == SL_CPU_GEMM_DPBF16 && a->m >= BF16_MIN_M && a->w && a->k % 32 == 0;
}

/* Rows up to which the direct kernel is used; SLUICE_GEMM_SMALL_M overrides. */
static int small_m_limit(void)
{
	static int limit = -1;
	if (limit < 0) {
		const char *e = getenv("SLUICE_GEMM_SMALL_M");
		int v = e ? atoi(e) : 8;
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

/* n rounded up to a multiple of 16 floats (64 bytes: every kernel's loads
 * stay aligned in a per-thread slice of a workspace) */
static size_t round16(size_t n)
{
	return (n + 15) & ~(size_t)15;
}

/* The 16 dequantised values of a group's codes (sl_q4_value of each). */
static void q4_lut(sl_half mn16, sl_half scale16, float lut[16])
{
	for (unsigned q = 0; q < 16; q++)
		lut[q] = sl_q4_value(q, mn16, scale16);
}

void sl_cpu_q4_rows(const sl_gemm_args *a, int n0, int rows, float *dst, size_t ld, size_t cs,
		    int kend, int simd)
{
#if defined(__x86_64__)
	if (simd) {
		sl_cpu_q4_rows_avx2(a, n0, rows, dst, ld, cs, kend);
		return;
	}
#endif
	(void)simd;
	const size_t ng = sl_q4_groups((size_t)a->k);
	const uint8_t *codes = (const uint8_t *)a->wq;
	const sl_half *meta = (const sl_half *)(codes + (size_t)a->n * ng * SL_Q4_CODE_BYTES);
	for (int j = 0; j < rows; j++) {
		float *d = dst + (size_t)j * ld;
		for (size_t g = 0; g < ng && (int)g * SL_Q4_GROUP < kend; g++) {
			const size_t gi = (size_t)(n0 + j) * ng + g;
			const uint8_t *cg = codes + gi * SL_Q4_CODE_BYTES;
			float lut[16];
			q4_lut(meta[2 * gi], meta[2 * gi + 1], lut);
			const int c0 = (int)g * SL_Q4_GROUP, cn = SL_MIN(SL_Q4_GROUP, kend - c0);
			for (int i = 0; i < cn; i++) {
				const int kk = c0 + i;
				d[(size_t)(kk >> 3) * cs + (kk & 7)] = lut[sl_q4_code(cg, i)];
			}
		}
	}
}

/* Portable twin of sl_cpu_gemm_direct_avx2 (cpu_x86.c).  buf: k floats, the
 * row of 4-bit weights dequantised. */
static void gemm_direct_generic(const sl_gemm_args *a, float alpha, int n0, int n1, float *buf)
{
	const int k = a->k, k8 = k & ~7;
	for (int n = n0; n < n1; n++) {
		const sl_half *w = a->w ? a->w + (size_t)n * k : NULL;
		if (a->wq)
			sl_cpu_q4_rows(a, n, 1, buf, (size_t)k, 8, k, 0);
		for (int r = 0; r < a->m; r++) {
			const float *x = a->x + (size_t)r * a->ldx;
			float lane[8] = { 0 };
			if (a->wq) {
				for (int kk = 0; kk < k8; kk += 8)
					for (int l = 0; l < 8; l++)
						lane[l] = fmaf(buf[kk + l], x[kk + l], lane[l]);
			} else {
				for (int kk = 0; kk < k8; kk += 8)
					for (int l = 0; l < 8; l++)
						lane[l] = fmaf(sl_half_to_float(w[kk + l]), x[kk + l],
							       lane[l]);
			}
			sl_cpu_gemm_finish(a, alpha, r, n, sl_cpu_lanes_sum(lane));
		}
	}
}

/* ---- the packed path ------------------------------------------------------ */

/* Widen rows [0, rows) of w (8 at most; the rest of the group is zero) for
 * steps [s0, s1) into a group: [s][col][lane]. */
static void pack_w_generic(const sl_half *w, int k, int rows, int s0, int s1, float *dst)
{
	for (int s = s0; s < s1; s++, dst += 64)
		for (int j = 0; j < 8; j++)
			for (int l = 0; l < 8; l++)
				dst[j * 8 + l] = j < rows ? sl_half_to_float(w[(size_t)j * k + 8 * s + l])
							  : 0.0f;
}

/* The generic tile: 4 rows, the group's columns two at a time (64 lanes:
 * 16 vector registers of 4 where the compiler vectorises; unrolled so that
 * GCC keeps them in registers, as it does on aarch64). */
static void tile_generic(const sl_gemm_tile *t)
{
	const sl_gemm_args *a = t->a;
	enum { MR = GEMM_MR_GENERIC };
	const int steps = t->s1 - t->s0;
	for (int c0 = 0; c0 < 8; c0 += 2) {
		float acc[MR][2][8];
		for (int r = 0; r < MR; r++)
			for (int c = 0; c < 2; c++)
				for (int l = 0; l < 8; l++)
					acc[r][c][l] = t->s0 ? t->part[r * 64 + (c0 + c) * 8 + l] : 0.0f;
		for (int s = 0; s < steps; s++) {
			const float *ws = t->wp + (size_t)s * 64 + c0 * 8;
#pragma GCC unroll 4
			for (int r = 0; r < MR; r++)
#pragma GCC unroll 2
				for (int c = 0; c < 2; c++)
#pragma GCC unroll 8
					for (int l = 0; l < 8; l++)
						acc[r][c][l] = fmaf(ws[c * 8 + l], t->x[r][8 * s + l], acc[r][c][l]);
		}
		for (int r = 0; r < MR; r++)
			for (int c = 0; c < 2; c++) {
				if (t->s1 < t->ks) {
					memcpy(t->part + r * 64 + (c0 + c) * 8, acc[r][c], sizeof acc[r][c]);
				} else if (t->r0 + r < a->m && t->n0 + c0 + c < a->n) {
					sl_cpu_gemm_finish(a, t->alpha, t->r0 + r, t->n0 + c0 + c,
							   sl_cpu_lanes_sum(acc[r][c]));
				}
			}
	}
}

typedef void (*tile_fn)(const sl_gemm_tile *t);


static int gemm_packed(sl_backend *b, const sl_gemm_args *a, float alpha)
{
	sl_cpu_ctx *c = sl_cpu(b);
	const int m = a->m, n = a->n, k = a->k, nt = c->nthreads;
	int mr = GEMM_MR_GENERIC;
	tile_fn tile = tile_generic;
	void (*pack_w)(const sl_half *, int, int, int, int, float *) = pack_w_generic;
#if defined(__x86_64__)
	if (c->isa >= SL_CPU_AVX2) {
		pack_w = sl_cpu_pack_w_avx2;
		mr = SL_GEMM_MR_AVX2;
		tile = sl_cpu_gemm_tile_avx2;
	}
	if (c->isa >= SL_CPU_AVX512) {
		mr = SL_GEMM_MR_AVX512;
		tile = sl_cpu_gemm_tile_avx512;
	}
#endif
	const int ks = k / 8;
	const int nchunks = (ks + GEMM_KSTEPS_CHUNK - 1) / GEMM_KSTEPS_CHUNK;
	const int kc = (ks + nchunks - 1) / nchunks; /* steps per chunk, chunks about even */
	const int mb = SL_MIN(GEMM_MB, m), blocks = (m + mb - 1) / mb;
	/* panel columns: the widened panel within GEMM_PANEL bytes, and narrow
	 * enough for some 4 work items per thread */
	int nc = (int)(GEMM_PANEL / ((size_t)ks * 8 * sizeof(float))) & ~7;
	const int want = (4 * nt + blocks - 1) / blocks; /* panels wanted */
	nc = SL_MIN(nc, (((n + want - 1) / want) + 7) & ~7);
	nc = SL_MIN(SL_MAX(nc, 8), (n + 7) & ~7);
	const int panels = (n + nc - 1) / nc, groups_max = nc / 8;
	const size_t wf_len = round16((size_t)nc * ks * 8), part_len = round16((size_t)groups_max * mr * 64);
	SL_TRY(sl_cpu_grow(&c->gemm_wf, &c->gemm_wf_cap, wf_len * nt));
	SL_TRY(sl_cpu_grow(&c->gemm_part, &c->gemm_part_cap, part_len * nt));
	/* Work items (row block, panel), taken by whichever thread is free: each
	 * widens its panel, then per x tile and k chunk runs the kernel over the
	 * panel's groups (the chunk of the tile's rows stays in the L1 cache).
	 * No thread waits for another until the end, so a core that another
	 * process holds costs its share only. */
#pragma omp parallel num_threads(nt)
	{
		const int tid = omp_get_thread_num();
		float *wf = c->gemm_wf + wf_len * tid, *part = c->gemm_part + part_len * tid;
#pragma omp for schedule(dynamic, 1)
		for (int item = 0; item < blocks * panels; item++) {
			const int m0 = item / panels * mb, n0 = item % panels * nc;
			const int tiles = (SL_MIN(mb, m - m0) + mr - 1) / mr;
			const int groups = (SL_MIN(nc, n - n0) + 7) / 8;
			for (int g = 0; g < groups; g++) {
				const int c0 = n0 + 8 * g;
				if (a->wq) {
					/* 4-bit: dequantised straight into the group */
					float *dst = wf + (size_t)g * ks * 64;
					const int rows = SL_MIN(8, n - c0);
					sl_cpu_q4_rows(a, c0, rows, dst, 8, 64, 8 * ks, c->simd);
					for (int j = rows; j < 8; j++)
						for (int st = 0; st < ks; st++)
							memset(dst + (size_t)st * 64 + j * 8, 0, 8 * sizeof(float));
				} else
					pack_w(a->w + (size_t)c0 * k, k, SL_MIN(8, n - c0), 0, ks,
					       wf + (size_t)g * ks * 64);
			}
			for (int i = 0; i < tiles; i++)
				for (int s0 = 0; s0 < ks; s0 += kc) {
					sl_gemm_tile t = { .a = a, .alpha = alpha, .s0 = s0,
							   .s1 = SL_MIN(ks, s0 + kc), .ks = ks,
							   .r0 = m0 + i * mr };
					for (int r = 0; r < mr; r++)
						t.x[r] = a->x + (size_t)SL_MIN(t.r0 + r, m - 1) * a->ldx + 8 * s0;
					for (int g = 0; g < groups; g++) {
						t.wp = wf + ((size_t)g * ks + s0) * 64;
						t.part = part + (size_t)g * mr * 64;
						t.n0 = n0 + 8 * g;
						tile(&t);
					}
				}
		}
	}
	return 0;
}

#if defined(SL_HAVE_OPENBLAS) && SL_HAVE_OPENBLAS
/* --cpu-gemm openblas: panels of weight rows (about 4 MiB of fp32) widened,
 * sgemm over row blocks of up to 2048 into a scratch, then the epilogue. */
static int gemm_openblas(sl_backend *b, const sl_gemm_args *a, float alpha)
{
	sl_cpu_ctx *c = sl_cpu(b);
	const int m = a->m, n = a->n, k = a->k, nt = c->nthreads;
	int nb = (int)((4u << 20) / ((size_t)k * sizeof(float)));
	nb = SL_MIN(SL_MAX(16, nb & ~15), n);
	const int mb = SL_MIN(m, 2048);
	SL_TRY(sl_cpu_grow(&c->gemm_wf, &c->gemm_wf_cap, (size_t)nb * k));
	SL_TRY(sl_cpu_grow(&c->gemm_c, &c->gemm_c_cap, (size_t)mb * nb));
	float *wf = c->gemm_wf, *ct = c->gemm_c;
	for (int n0 = 0; n0 < n; n0 += nb) {
		const int cur = SL_MIN(nb, n - n0);
#pragma omp parallel for num_threads(nt) schedule(static)
		for (int j = 0; j < cur; j++) {
			if (a->wq)
				sl_cpu_q4_rows(a, n0 + j, 1, wf + (size_t)j * k, (size_t)k, 8, k, c->simd);
			else
				sl_cpu_half_to_float(a->w + (size_t)(n0 + j) * k, wf + (size_t)j * k,
						     (size_t)k, c->simd);
		}
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
#endif

int sl_cpu_gemm(sl_backend *b, sl_queue *q, const sl_gemm_args *a)
{
	if (a->m < 0 || a->n < 0 || a->k < 0 || a->ldx < a->k || a->ldy < a->n)
		return sl_err(SL_EINVAL, "gemm: bad shape m=%d n=%d k=%d ldx=%d ldy=%d", a->m, a->n,
			      a->k, a->ldx, a->ldy);
	if (a->w && a->wq)
		return sl_err(SL_EINVAL, "gemm: both fp16 (w) and 4-bit (wq) weights given");
	if (a->m == 0 || a->n == 0)
		return 0;
	if (a->k > 0 && (!a->x || !a->y || (!a->w && !a->wq)))
		return sl_err(SL_EINVAL, "gemm: NULL operand");
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
	} else if ((a->m <= small_m_limit() && !bf16_rows(c, a)) || a->k < 8) {
		/* split n across threads in even chunks */
		const int nt = c->nthreads;
		const int chunk = ((a->n + nt - 1) / nt + 7) & ~7;
		/* 4-bit weights, portable kernel: a dequantised row per thread */
		const bool row_buf = a->wq && c->isa == SL_CPU_GENERIC;
		const size_t buf_len = row_buf ? round16((size_t)a->k) : 0;
		if (row_buf)
			SL_TRY(sl_cpu_grow(&c->gemm_wf, &c->gemm_wf_cap, buf_len * nt));
#pragma omp parallel for num_threads(nt) schedule(static)
		for (int n0 = 0; n0 < a->n; n0 += chunk) {
			int n1 = SL_MIN(a->n, n0 + chunk);
			float *buf = row_buf ? c->gemm_wf + buf_len * omp_get_thread_num() : NULL;
#if defined(__x86_64__)
			/* AVX-512: two weight rows a register (fp16 weights) */
			if (c->isa >= SL_CPU_AVX512 && a->w) {
				sl_cpu_gemm_direct_avx512(a, alpha, n0, n1);
				continue;
			}
			if (c->isa >= SL_CPU_AVX2) {
				sl_cpu_gemm_direct_avx2(a, alpha, n0, n1);
				continue;
			}
#endif
			gemm_direct_generic(a, alpha, n0, n1, buf);
		}
	} else {
		/* the opt-in GEMMs, each SL_EUNSUPPORTED for a shape it does
		 * not take; then the packed kernel */
		rc = SL_EUNSUPPORTED;
		if (c->gemm_bf16 != SL_CPU_GEMM_FP32)
			rc = sl_cpu_bf16_gemm(b, a, alpha);
#if defined(SL_HAVE_OPENBLAS) && SL_HAVE_OPENBLAS
		if (rc == SL_EUNSUPPORTED && c->gemm_openblas)
			rc = gemm_openblas(b, a, alpha);
#endif
		if (rc == SL_EUNSUPPORTED)
			rc = gemm_packed(b, a, alpha);
	}
	b->gemm_seconds += sl_now() - t0;
	b->gemm_flop += 2.0 * a->m * (double)a->n * a->k;
	return rc;
}
