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
 *  - packed (prefill): rows in blocks of up to GEMM_MB; per block, the
 *    weights widened to fp32 panel by panel (a panel of ~1 MiB stays in the
 *    core's cache), x copied into tiles of the kernel's rows, and a
 *    register-tiled kernel over each (x tile, 8 columns); where k is long
 *    it is cut into chunks whose partial lanes go to memory between them,
 *    which keeps the order above.  The conversion costs O(n k) per block
 *    against O(mb n k) of arithmetic.
 * Kernels: AVX-512 and AVX2 in cpu_x86.c, the portable C ones here.
 */
#include "cpu_internal.h"

#include <math.h>
#include <omp.h>
#include <string.h>

enum {
	GEMM_MB = 480,             /* rows per block (a multiple of every kernel's rows) */
	GEMM_PANEL = 1 << 20,      /* bytes of a widened weight panel */
	GEMM_KSTEPS_ONE = 512,     /* k up to 8 x this in one chunk */
	GEMM_KSTEPS_CHUNK = 64,    /* else chunks of this many steps */
	GEMM_MR_GENERIC = 4,       /* rows of the generic tile kernel */
};

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

/* Portable twin of sl_cpu_gemm_direct_avx2 (cpu_x86.c). */
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

/* Copy rows [r0, r0 + mr) of x (rows past m repeat row m - 1) for steps
 * [s0, s1) into a tile: [s][row][lane]. */
static void pack_x(const sl_gemm_args *a, int r0, int mr, int s0, int s1, float *dst)
{
	for (int r = 0; r < mr; r++) {
		const float *x = a->x + (size_t)SL_MIN(r0 + r, a->m - 1) * a->ldx;
		for (int s = s0; s < s1; s++)
			memcpy(dst + ((size_t)(s - s0) * mr + r) * 8, x + 8 * s, 8 * sizeof(float));
	}
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
			const float *xs = t->xp + (size_t)s * MR * 8, *ws = t->wp + (size_t)s * 64 + c0 * 8;
#pragma GCC unroll 4
			for (int r = 0; r < MR; r++)
#pragma GCC unroll 2
				for (int c = 0; c < 2; c++)
#pragma GCC unroll 8
					for (int l = 0; l < 8; l++)
						acc[r][c][l] = fmaf(ws[c * 8 + l], xs[r * 8 + l], acc[r][c][l]);
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
	const int kc = ks <= GEMM_KSTEPS_ONE ? ks : GEMM_KSTEPS_CHUNK; /* steps per chunk */
	int nc = (int)(GEMM_PANEL / ((size_t)kc * 8 * sizeof(float))) & ~7; /* panel columns */
	nc = SL_MIN(SL_MAX(nc, 8), (n + 7) & ~7);
	const int mb = SL_MIN(GEMM_MB, m), tiles_max = (mb + mr - 1) / mr;
	SL_TRY(sl_cpu_grow(&c->gemm_wf, &c->gemm_wf_cap, (size_t)nc * kc * 8));
	SL_TRY(sl_cpu_grow(&c->gemm_x, &c->gemm_x_cap, (size_t)tiles_max * mr * kc * 8));
	if (kc < ks)
		SL_TRY(sl_cpu_grow(&c->gemm_part, &c->gemm_part_cap,
				   (size_t)tiles_max * (nc / 8) * mr * 64));
	float *wf = c->gemm_wf, *xp = c->gemm_x, *part = c->gemm_part;
	for (int m0 = 0; m0 < m; m0 += mb) {
		const int tiles = (SL_MIN(mb, m - m0) + mr - 1) / mr;
		int x_steps = -1; /* the chunk whose x tiles are packed */
		for (int n0 = 0; n0 < n; n0 += nc) {
			const int groups = (SL_MIN(nc, n - n0) + 7) / 8;
			for (int s0 = 0; s0 < ks; s0 += kc) {
				const int s1 = SL_MIN(ks, s0 + kc);
				const bool pack_x_now = x_steps != s0;
#pragma omp parallel num_threads(nt)
				{
#pragma omp for schedule(static) nowait
					for (int g = 0; g < groups; g++) {
						const int c0 = n0 + 8 * g;
						pack_w(a->w + (size_t)c0 * k, k, SL_MIN(8, n - c0), s0, s1,
						       wf + (size_t)g * kc * 64);
					}
					if (pack_x_now) {
#pragma omp for schedule(static)
						for (int i = 0; i < tiles; i++)
							pack_x(a, m0 + i * mr, mr, s0, s1,
							       xp + (size_t)i * mr * kc * 8);
					} else {
#pragma omp barrier
					}
#pragma omp for schedule(static)
					for (int i = 0; i < tiles; i++)
						for (int g = 0; g < groups; g++) {
							const sl_gemm_tile t = {
								.a = a, .alpha = alpha,
								.xp = xp + (size_t)i * mr * kc * 8,
								.wp = wf + (size_t)g * kc * 64,
								.part = part + ((size_t)i * (nc / 8) + g) * mr * 64,
								.s0 = s0, .s1 = s1, .ks = ks,
								.r0 = m0 + i * mr, .n0 = n0 + 8 * g };
							tile(&t);
						}
				}
				x_steps = s0;
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
	} else if (a->m <= small_m_limit() || a->k < 8) {
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
		rc = gemm_packed(b, a, alpha);
	}
	b->gemm_seconds += sl_now() - t0;
	b->gemm_flop += 2.0 * a->m * (double)a->n * a->k;
	return rc;
}
