/*
 * test_cross_backend.c - every op of the CUDA backend against the CPU
 * backend (the reference), on fresh random inputs over a table of shapes:
 * odd sizes, one-row decode GEMMs, row strides, every flag combination,
 * prefill with a different padding per sequence, decode with a different
 * length per sequence, with and without the H2O score; H2O compaction and
 * eviction (bit for bit); plus queues and events, copies, the NULL queue,
 * argument errors and the device budget; and first, that both backends
 * fill every entry of kernels/backend_ops.def.
 *
 * Outputs are poisoned (NaN) before each run, the padding columns of
 * strided outputs hold a sentinel that must survive, and cache slots that
 * the op must not touch hold NaN on both sides and are compared bit for
 * bit.  Errors are normalised: max |got - ref| / max(max |ref|, 1e-6), with
 * TOL_FP16 for what goes through fp16 GEMM inputs and TOL_FP32 for fp32
 * math; embed and argmax must match exactly.
 *
 * Exits 77 (meson SKIP) where this build has no CUDA backend or the
 * machine no usable GPU.  SL_CROSS_BACKEND=name compares another backend
 * instead of "cuda" (e.g. "cpu" to check the test itself).  Where it runs:
 * on a GPU (tools/gpu-check.sh) and on the CUDA emulation (meson test
 * cuda_emu_cross_backend, every build), every case; SL_CROSS_SMALL=1 skips
 * the big ones (head_dim 128 with 32 heads, long decodes, the largest
 * GEMMs and H2O prompts) for a quick run.
 *
 * Over 800 lines on purpose: every op's comparison drives the same
 * poison/compare/normalise helpers over its own shape table; one file
 * keeps one place where the tolerances are chosen.
 */
#include "backend.h"
#include "sl_q4.h"
#include "sl_config.h"
#include "sl_q4.h"
#if SL_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

#include <check.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ck_assert_msg for checks that run once per element: Check logs every
 * assertion that passes (a write to its log file), which took a fifth of
 * the emulated run's time */
#define CHECK(cond, ...)                                                      \
	do {                                                                  \
		if (!(cond))                                                  \
			ck_abort_msg(__VA_ARGS__);                            \
	} while (0)

#define TOL_FP16 2e-3
#define TOL_FP32 1e-5
/* 4-bit weights at decode-sized m: both sides multiply the same dequantised
 * fp32 weights in fp32, in different orders */
#define TOL_Q4_FUSED 1e-6
#define SENTINEL 4242.0f

/* side 0 is the reference (cpu), side 1 the backend under test */
static sl_backend *g_be[2];
static sl_queue *g_q[2];
static const char *g_name = "cuda";

/* ---- random numbers ---------------------------------------------------------- */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static void rng_seed(uint64_t s)
{
	g_rng = s * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
	if (!g_rng)
		g_rng = 1;
}

static uint64_t rng_next(void)
{
	g_rng ^= g_rng >> 12;
	g_rng ^= g_rng << 25;
	g_rng ^= g_rng >> 27;
	return g_rng * 0x2545f4914f6cdd1dull;
}

/* uniform in [-1, 1) */
static float rnd(void)
{
	return (float)((double)(rng_next() >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static int rnd_int(int n)
{
	return (int)(rng_next() % (uint64_t)n);
}

static float *fill_f32(size_t n, float scale)
{
	float *p = malloc(n * sizeof(float) + 1);
	ck_assert_ptr_nonnull(p);
	for (size_t i = 0; i < n; i++)
		p[i] = rnd() * scale;
	return p;
}

static sl_half *fill_f16(size_t n, float scale)
{
	sl_half *p = malloc(n * sizeof(sl_half) + 1);
	ck_assert_ptr_nonnull(p);
	for (size_t i = 0; i < n; i++)
		p[i] = sl_float_to_half(rnd() * scale);
	return p;
}

static float *nan_f32(size_t n)
{
	float *p = malloc(n * sizeof(float) + 1);
	ck_assert_ptr_nonnull(p);
	memset(p, 0xff, n * sizeof(float));
	return p;
}

/* ---- device buffers on one side --------------------------------------------------- */

static void ok(int rc, const char *what)
{
	ck_assert_msg(rc == 0, "%s on %s failed: %s (%s)", what, g_be[1] ? g_be[1]->ops->name : "?",
		      sl_errmsg(), sl_strerror(rc));
}

static void *dput(int s, const void *host, size_t bytes)
{
	void *d = NULL;
	ok(sl_dev_alloc(g_be[s], bytes, "test buffer", &d), "sl_dev_alloc");
	ok(g_be[s]->ops->copy_h2d(g_be[s], g_q[s], d, host, bytes), "copy_h2d");
	ok(g_be[s]->ops->queue_sync(g_be[s], g_q[s]), "queue_sync");
	return d;
}

static void dget(int s, void *host, const void *dev, size_t bytes)
{
	ok(g_be[s]->ops->copy_d2h(g_be[s], g_q[s], host, dev, bytes), "copy_d2h");
	ok(g_be[s]->ops->queue_sync(g_be[s], g_q[s]), "queue_sync");
}

static void dfree(int s, void *d, size_t bytes)
{
	sl_dev_free(g_be[s], d, bytes);
}

/* ---- comparisons ---------------------------------------------------------------- */

/* normalised max error of got against ref over n values; NaN counts as a failure */
static void check_close(const char *what, const float *ref, const float *got, size_t n,
			double tol)
{
	double amax = 0.0, emax = 0.0;
	size_t worst = 0;
	for (size_t i = 0; i < n; i++) {
		CHECK(isfinite(ref[i]), "%s: reference value %zu is %f", what, i, ref[i]);
		if (fabs(ref[i]) > amax)
			amax = fabs(ref[i]);
	}
	for (size_t i = 0; i < n; i++) {
		double e = isfinite(got[i]) ? fabs((double)got[i] - ref[i]) : INFINITY;
		if (e > emax) {
			emax = e;
			worst = i;
		}
	}
	const double rel = emax / (amax > 1e-6 ? amax : 1e-6);
	ck_assert_msg(rel <= tol,
		      "%s: normalised error %.3g > %.3g (worst at %zu: ref %.9g got %.9g, max |ref| %.6g)",
		      what, rel, tol, worst, n ? ref[worst] : 0.0, n ? got[worst] : 0.0, amax);
}

/* ---- gemm ------------------------------------------------------------------------ */

typedef struct gemm_case {
	int m, n, k;
	int ldx_pad, ldy_pad;
	float alpha;
	bool big; /* skipped when SL_CROSS_SMALL is set (quick runs) */
} gemm_case;

static const gemm_case gemm_cases[] = {
	{ 1, 64, 64, 0, 0, 0.0f, false },      /* decode, alpha 0 means 1 */
	{ 1, 1000, 768, 0, 0, 1.0f, false },   /* decode, wide */
	{ 1, 77, 129, 3, 5, -2.0f, false },    /* odd, strided */
	{ 3, 129, 77, 0, 7, 0.125f, false },
	{ 7, 50, 1, 2, 0, 1.0f, false },       /* k = 1 */
	{ 16, 256, 128, 0, 0, 1.0f, false },   /* the CPU's last direct-kernel size */
	{ 17, 333, 200, 5, 3, 0.5f, false },   /* the CPU's panel path, odd */
	{ 64, 768, 768, 0, 0, 1.0f, false },
	{ 130, 257, 96, 32, 1, 1.0f, false },
	{ 512, 1024, 512, 0, 0, 1.0f, true },  /* prefill-sized */
	{ 333, 4096, 1024, 8, 8, 1.0f, true },
};

/* q4: the weights quantised to 4 bits (sl_q4_quantize_matrix on the host)
 * and passed as wq on both sides */
static void run_gemm(const gemm_case *c, bool with_bias, unsigned flags, uint64_t seed, bool q4)
{
	const int ldx = c->k + c->ldx_pad, ldy = c->n + c->ldy_pad;
	const float ws = 1.0f / sqrtf((float)c->k);
	rng_seed(seed);
	float *x = fill_f32((size_t)c->m * ldx, 1.0f);
	sl_half *w = fill_f16((size_t)c->n * c->k, ws);
	sl_half *bias = fill_f16((size_t)c->n, 1.0f);
	float *y0 = fill_f32((size_t)c->m * ldy, 1.0f);
	const size_t qb = sl_q4_bytes((size_t)c->n, (size_t)c->k);
	void *wq = NULL;
	if (q4) {
		wq = malloc(qb);
		ck_assert_ptr_nonnull(wq);
		sl_q4_quantize_matrix(w, (size_t)c->n, (size_t)c->k, wq);
	}
	for (int r = 0; r < c->m; r++)
		for (int j = 0; j < ldy; j++)
			if (j >= c->n)
				y0[(size_t)r * ldy + j] = SENTINEL;
			else if (!(flags & SL_GEMM_ACCUM))
				y0[(size_t)r * ldy + j] = NAN; /* poison: must be overwritten */
	float *out[2];
	for (int s = 0; s < 2; s++) {
		const size_t xb = (size_t)c->m * ldx * 4;
		const size_t wb = q4 ? qb : (size_t)c->n * c->k * 2;
		const size_t bb = (size_t)c->n * 2, yb = (size_t)c->m * ldy * 4;
		float *dx = dput(s, x, xb);
		void *dw = dput(s, q4 ? wq : (void *)w, wb);
		sl_half *db = dput(s, bias, bb);
		float *dy = dput(s, y0, yb);
		sl_gemm_args a = { .m = c->m, .n = c->n, .k = c->k, .x = dx, .ldx = ldx,
				   .w = q4 ? NULL : dw, .wq = q4 ? dw : NULL,
				   .bias = with_bias ? db : NULL, .y = dy, .ldy = ldy,
				   .alpha = c->alpha, .flags = flags };
		ok(g_be[s]->ops->gemm(g_be[s], g_q[s], &a), "gemm");
		out[s] = nan_f32((size_t)c->m * ldy);
		dget(s, out[s], dy, yb);
		dfree(s, dx, xb);
		dfree(s, dw, wb);
		dfree(s, db, bb);
		dfree(s, dy, yb);
	}
	char what[160];
	snprintf(what, sizeof(what), "gemm%s m=%d n=%d k=%d ldx=%d ldy=%d alpha=%g bias=%d flags=%u",
		 q4 ? " (4-bit weights)" : "", c->m, c->n, c->k, ldx, ldy, c->alpha, with_bias, flags);
	/* compare the valid columns row by row, as one array */
	float *ref = malloc((size_t)c->m * c->n * sizeof(float) + 1);
	float *got = malloc((size_t)c->m * c->n * sizeof(float) + 1);
	for (int r = 0; r < c->m; r++)
		for (int j = 0; j < ldy; j++) {
			const size_t i = (size_t)r * ldy + j;
			if (j < c->n) {
				ref[(size_t)r * c->n + j] = out[0][i];
				got[(size_t)r * c->n + j] = out[1][i];
			} else {
				CHECK(out[0][i] == SENTINEL && out[1][i] == SENTINEL,
				      "%s: padding column %d of row %d was written (ref %g got %g)",
				      what, j, r, out[0][i], out[1][i]);
			}
		}
	/* 4-bit weights, more rows than the fused kernel takes: weights and x
	 * through fp16 into cuBLAS, as the fp16 path */
	check_close(what, ref, got, (size_t)c->m * c->n,
		    q4 && c->m <= 8 ? TOL_Q4_FUSED : TOL_FP16);
	free(wq);
	free(ref);
	free(got);
	free(out[0]);
	free(out[1]);
	free(x);
	free(w);
	free(bias);
	free(y0);
}

static bool g_small;

START_TEST(test_gemm)
{
	const gemm_case *c = &gemm_cases[_i];
	if (c->big && g_small)
		return;
	/* every combination: bias, relu, accumulate */
	for (unsigned combo = 0; combo < 8; combo++) {
		unsigned flags = 0;
		if (combo & 2)
			flags |= SL_GEMM_RELU;
		if (combo & 4)
			flags |= SL_GEMM_ACCUM;
		run_gemm(c, combo & 1, flags, 1000u * (unsigned)_i + combo, false);
	}
}
END_TEST

/* The same cases with 4-bit weights: both paths of the CUDA GEMM (fused at
 * m <= 8, dequantised panels and cuBLAS above), each flag once and all
 * together. */
START_TEST(test_gemm_q4)
{
	const gemm_case *c = &gemm_cases[_i];
	if (c->big && g_small)
		return;
	static const unsigned combos[] = { 0, 3, 5, 7 };
	for (size_t i = 0; i < SL_ARRAY_LEN(combos); i++) {
		const unsigned combo = combos[i];
		run_gemm(c, combo & 1,
			 ((combo & 2) ? SL_GEMM_RELU : 0u) | ((combo & 4) ? SL_GEMM_ACCUM : 0u),
			 5000u * (unsigned)_i + combo, true);
	}
}
END_TEST

/* ---- layernorm ------------------------------------------------------------------ */

typedef struct ln_case {
	int rows, n, ldx_pad, ldy_pad;
	bool inplace;
} ln_case;

static const ln_case ln_cases[] = {
	{ 1, 768, 0, 0, false },  { 5, 1000, 0, 0, false },  { 3, 4096, 16, 3, false },
	{ 64, 2048, 0, 0, true }, { 2, 12288, 0, 0, false }, { 7, 33, 1, 0, false },
	{ 9, 5, 0, 0, true },     { 200, 96, 4, 4, true },
};

START_TEST(test_layernorm)
{
	const ln_case *c = &ln_cases[_i];
	const int ldx = c->n + c->ldx_pad;
	const int ldy = c->inplace ? ldx : c->n + c->ldy_pad;
	rng_seed(2000 + _i);
	/* an offset and a scale, so the mean and variance matter */
	float *x = fill_f32((size_t)c->rows * ldx, 2.0f);
	for (size_t i = 0; i < (size_t)c->rows * ldx; i++)
		x[i] += 3.0f;
	sl_half *g = fill_f16((size_t)c->n, 1.0f);
	sl_half *bt = fill_f16((size_t)c->n, 1.0f);
	float *y0 = nan_f32((size_t)c->rows * ldy);
	for (int r = 0; r < c->rows; r++)
		for (int j = c->n; j < ldy; j++)
			y0[(size_t)r * ldy + j] = SENTINEL;
	float *out[2];
	const size_t xb = (size_t)c->rows * ldx * 4, yb = (size_t)c->rows * ldy * 4;
	for (int s = 0; s < 2; s++) {
		float *dx = dput(s, x, xb);
		sl_half *dg = dput(s, g, (size_t)c->n * 2);
		sl_half *dbt = dput(s, bt, (size_t)c->n * 2);
		float *dy = c->inplace ? dx : dput(s, y0, yb);
		ok(g_be[s]->ops->layernorm(g_be[s], g_q[s], c->rows, c->n, dx, ldx, dg, dbt, 1e-5f, dy,
					   ldy),
		   "layernorm");
		out[s] = nan_f32((size_t)c->rows * ldy);
		dget(s, out[s], dy, yb);
		dfree(s, dx, xb);
		dfree(s, dg, (size_t)c->n * 2);
		dfree(s, dbt, (size_t)c->n * 2);
		if (!c->inplace)
			dfree(s, dy, yb);
	}
	char what[128];
	snprintf(what, sizeof(what), "layernorm rows=%d n=%d ldx=%d ldy=%d inplace=%d", c->rows,
		 c->n, ldx, ldy, c->inplace);
	for (int r = 0; r < c->rows; r++) {
		check_close(what, out[0] + (size_t)r * ldy, out[1] + (size_t)r * ldy, (size_t)c->n,
			    TOL_FP32);
		for (int j = c->n; j < ldy; j++) {
			const size_t i = (size_t)r * ldy + j;
			const float want = c->inplace ? x[i] : SENTINEL;
			CHECK(out[0][i] == want && out[1][i] == want,
			      "%s: padding column %d of row %d was written", what, j, r);
		}
	}
	free(out[0]);
	free(out[1]);
	free(x);
	free(g);
	free(bt);
	free(y0);
}
END_TEST

/* ---- rmsnorm, rope, swiglu (the Llama family's ops) ---------------------------- */

typedef struct rms_case {
	int rows, n, ldx_pad, ldy_pad;
	bool inplace;
} rms_case;

static const rms_case rms_cases[] = {
	{ 1, 4096, 0, 0, false }, { 5, 1000, 3, 1, false }, { 64, 2048, 0, 0, true },
	{ 7, 33, 1, 0, false },   { 9, 5, 0, 0, true },     { 3, 8192, 16, 3, false },
};

START_TEST(test_rmsnorm)
{
	const rms_case *c = &rms_cases[_i];
	const int ldx = c->n + c->ldx_pad;
	const int ldy = c->inplace ? ldx : c->n + c->ldy_pad;
	rng_seed(2500 + _i);
	/* an offset, so the mean of squares is not the variance */
	float *x = fill_f32((size_t)c->rows * ldx, 2.0f);
	for (size_t i = 0; i < (size_t)c->rows * ldx; i++)
		x[i] += 1.5f;
	sl_half *g = fill_f16((size_t)c->n, 1.0f);
	float *y0 = nan_f32((size_t)c->rows * ldy);
	for (int r = 0; r < c->rows; r++)
		for (int j = c->n; j < ldy; j++)
			y0[(size_t)r * ldy + j] = SENTINEL;
	float *out[2];
	const size_t xb = (size_t)c->rows * ldx * 4, yb = (size_t)c->rows * ldy * 4;
	for (int s = 0; s < 2; s++) {
		float *dx = dput(s, x, xb);
		sl_half *dg = dput(s, g, (size_t)c->n * 2);
		float *dy = c->inplace ? dx : dput(s, y0, yb);
		ok(g_be[s]->ops->rmsnorm(g_be[s], g_q[s], c->rows, c->n, dx, ldx, dg, 1e-6f, dy, ldy),
		   "rmsnorm");
		out[s] = nan_f32((size_t)c->rows * ldy);
		dget(s, out[s], dy, yb);
		dfree(s, dx, xb);
		dfree(s, dg, (size_t)c->n * 2);
		if (!c->inplace)
			dfree(s, dy, yb);
	}
	char what[128];
	snprintf(what, sizeof(what), "rmsnorm rows=%d n=%d ldx=%d ldy=%d inplace=%d", c->rows, c->n,
		 ldx, ldy, c->inplace);
	for (int r = 0; r < c->rows; r++) {
		check_close(what, out[0] + (size_t)r * ldy, out[1] + (size_t)r * ldy, (size_t)c->n,
			    TOL_FP32);
		for (int j = c->n; j < ldy; j++) {
			const size_t i = (size_t)r * ldy + j;
			const float want = c->inplace ? x[i] : SENTINEL;
			CHECK(out[0][i] == want && out[1][i] == want,
			      "%s: padding column %d of row %d was written", what, j, r);
		}
	}
	free(out[0]);
	free(out[1]);
	free(x);
	free(g);
	free(y0);
}
END_TEST

typedef struct rope_xcase {
	int rows, hd, nh_q, nh_k, qpad, kpad;
	bool no_k;
	int maxpos;
	sl_rope_type type;
} rope_xcase;

static const rope_xcase rope_cases[] = {
	{ 1, 128, 32, 8, 0, 0, false, 4096, SL_ROPE_LLAMA3 },  /* llama-3-8b, one decode row */
	{ 37, 128, 4, 4, 8, 0, false, 131072, SL_ROPE_LLAMA3 },
	{ 700, 64, 3, 1, 0, 2, false, 2048, SL_ROPE_DEFAULT }, /* over one launch's rows */
	{ 5, 2, 1, 1, 0, 0, false, 10, SL_ROPE_LINEAR },
	{ 9, 512, 2, 1, 1, 1, false, 9000, SL_ROPE_DEFAULT },  /* the widest head */
	{ 6, 80, 5, 0, 0, 0, true, 500, SL_ROPE_DEFAULT },     /* q only */
};

/* q and k rotated on both sides, each row at its own random position;
 * the padding at the end of each row must survive */
START_TEST(test_rope)
{
	const rope_xcase *c = &rope_cases[_i];
	const int ldq = c->nh_q * c->hd + c->qpad, ldk = c->nh_k * c->hd + c->kpad;
	rng_seed(2700 + _i);
	const size_t nq = (size_t)c->rows * ldq, nk = (size_t)c->rows * ldk;
	float *q = fill_f32(nq, 1.0f), *k = fill_f32(nk, 1.0f);
	for (int r = 0; r < c->rows; r++) {
		for (int j = c->nh_q * c->hd; j < ldq; j++)
			q[(size_t)r * ldq + j] = SENTINEL;
		for (int j = c->nh_k * c->hd; j < ldk; j++)
			k[(size_t)r * ldk + j] = SENTINEL;
	}
	int32_t *pos = malloc(sizeof(int32_t) * (size_t)c->rows);
	ck_assert_ptr_nonnull(pos);
	for (int r = 0; r < c->rows; r++)
		pos[r] = rnd_int(c->maxpos);
	float inv[SL_ROPE_MAX_HD / 2];
	const sl_rope_scaling sc = { c->type, 8.0, 1.0, 4.0, 8192 };
	ok(sl_rope_inv_freq(c->hd, 500000.0, &sc, inv), "sl_rope_inv_freq");
	float *outq[2], *outk[2];
	for (int s = 0; s < 2; s++) {
		float *dq = dput(s, q, nq * 4), *dk = nk ? dput(s, k, nk * 4) : NULL;
		const sl_rope_args a = { .rows = c->rows, .hd = c->hd, .nh_q = c->nh_q,
					 .nh_k = c->nh_k, .q = dq, .ldq = ldq,
					 .k = c->no_k ? NULL : dk, .ldk = ldk, .pos = pos,
					 .inv_freq = inv };
		ok(g_be[s]->ops->rope(g_be[s], g_q[s], &a), "rope");
		outq[s] = nan_f32(nq);
		outk[s] = nan_f32(nk);
		dget(s, outq[s], dq, nq * 4);
		dfree(s, dq, nq * 4);
		if (nk) {
			dget(s, outk[s], dk, nk * 4);
			dfree(s, dk, nk * 4);
		}
	}
	char what[160];
	snprintf(what, sizeof(what), "rope rows=%d hd=%d nh_q=%d nh_k=%d type=%d", c->rows, c->hd,
		 c->nh_q, c->nh_k, (int)c->type);
	check_close(what, outq[0], outq[1], nq, TOL_FP32);
	if (nk)
		check_close(what, outk[0], outk[1], nk, TOL_FP32);
	for (int r = 0; r < c->rows; r++) {
		for (int j = c->nh_q * c->hd; j < ldq; j++)
			CHECK(outq[1][(size_t)r * ldq + j] == SENTINEL, "%s: q padding written", what);
		for (int j = c->nh_k * c->hd; j < ldk; j++)
			CHECK(outk[1][(size_t)r * ldk + j] == SENTINEL, "%s: k padding written", what);
	}
	for (int s = 0; s < 2; s++) {
		free(outq[s]);
		free(outk[s]);
	}
	free(q);
	free(k);
	free(pos);
}
END_TEST

typedef struct swiglu_case {
	int rows, n;
	bool fused; /* gate | up halves of one row, out over gate */
} swiglu_case;

static const swiglu_case swiglu_cases[] = {
	{ 1, 11008, false }, { 3, 14336, true }, { 200, 344, false }, { 70000, 3, true },
	{ 4, 1, false },
};

START_TEST(test_swiglu)
{
	const swiglu_case *c = &swiglu_cases[_i];
	rng_seed(2900 + _i);
	/* fused: one buffer (rows, 2n + 1), gate | up | pad, out over gate;
	 * else: gate (rows, n + 2), up (rows, n), out (rows, n + 1) */
	const int ldg = c->fused ? 2 * c->n + 1 : c->n + 2, ldu = c->fused ? ldg : c->n;
	const int ldo = c->fused ? ldg : c->n + 1;
	const size_t ng = (size_t)c->rows * ldg, nu = (size_t)c->rows * ldu;
	const size_t no = (size_t)c->rows * ldo;
	float *g = fill_f32(ng, 10.0f), *u = fill_f32(nu, 2.0f);
	float *o0 = nan_f32(no);
	for (int r = 0; r < c->rows; r++) /* the columns past gate and up */
		for (int j = c->fused ? 2 * c->n : c->n; j < ldo; j++)
			(c->fused ? g : o0)[(size_t)r * ldo + j] = SENTINEL;
	float *out[2];
	for (int s = 0; s < 2; s++) {
		float *dg = dput(s, g, ng * 4);
		float *du = c->fused ? dg + c->n : dput(s, u, nu * 4);
		float *dout = c->fused ? dg : dput(s, o0, no * 4);
		ok(g_be[s]->ops->swiglu(g_be[s], g_q[s], c->rows, c->n, dg, ldg, du, ldu, dout, ldo),
		   "swiglu");
		out[s] = nan_f32(no);
		dget(s, out[s], dout, no * 4);
		dfree(s, dg, ng * 4);
		if (!c->fused) {
			dfree(s, du, nu * 4);
			dfree(s, dout, no * 4);
		}
	}
	char what[128];
	snprintf(what, sizeof(what), "swiglu rows=%d n=%d fused=%d", c->rows, c->n, c->fused);
	for (int r = 0; r < c->rows; r++) {
		check_close(what, out[0] + (size_t)r * ldo, out[1] + (size_t)r * ldo, (size_t)c->n,
			    TOL_FP32);
		for (int j = c->n; j < ldo; j++) {
			const size_t i = (size_t)r * ldo + j;
			const float want = c->fused ? g[i] : SENTINEL; /* up, or the pad */
			CHECK(out[0][i] == want && out[1][i] == want,
			      "%s: column %d of row %d was written", what, j, r);
		}
	}
	free(out[0]);
	free(out[1]);
	free(g);
	free(u);
	free(o0);
}
END_TEST

/* ---- embed ---------------------------------------------------------------------- */

typedef struct embed_case {
	int rows, n, vocab;
} embed_case;

static const embed_case embed_cases[] = {
	{ 1, 768, 100 }, { 37, 1000, 50 }, { 1000, 64, 3000 }, /* rows over one launch's chunk */
	{ 5, 3, 7 },
};

START_TEST(test_embed)
{
	const embed_case *c = &embed_cases[_i];
	for (int accum = 0; accum < 2; accum++) {
		rng_seed(3000 + 10 * _i + accum);
		sl_half *table = fill_f16((size_t)c->vocab * c->n, 2.0f);
		int32_t *keep = malloc(sizeof(int32_t) * c->rows);
		int32_t *idx = malloc(sizeof(int32_t) * c->rows);
		for (int r = 0; r < c->rows; r++)
			keep[r] = rnd_int(c->vocab);
		float *y0 = accum ? fill_f32((size_t)c->rows * c->n, 1.0f) : nan_f32((size_t)c->rows * c->n);
		const size_t tb = (size_t)c->vocab * c->n * 2, yb = (size_t)c->rows * c->n * 4;
		float *out[2];
		for (int s = 0; s < 2; s++) {
			sl_half *dt = dput(s, table, tb);
			float *dy = dput(s, y0, yb);
			memcpy(idx, keep, sizeof(int32_t) * c->rows);
			ok(g_be[s]->ops->embed(g_be[s], g_q[s], c->rows, c->n, dt, idx, dy, accum),
			   "embed");
			/* the indices are the caller's again as soon as the call returns */
			memset(idx, 0xff, sizeof(int32_t) * c->rows);
			out[s] = nan_f32((size_t)c->rows * c->n);
			dget(s, out[s], dy, yb);
			dfree(s, dt, tb);
			dfree(s, dy, yb);
		}
		ck_assert_msg(!memcmp(out[0], out[1], yb),
			      "embed rows=%d n=%d accumulate=%d: results differ", c->rows, c->n, accum);
		free(out[0]);
		free(out[1]);
		free(table);
		free(idx);
		free(keep);
		free(y0);
	}
}
END_TEST

/* ---- argmax --------------------------------------------------------------------- */

typedef struct argmax_case {
	int rows, n, ldx_pad;
	bool ties;
	bool poison; /* rows 1, 2, 4 mod 5: a NaN, +inf, -inf somewhere: -1 */
} argmax_case;

static const argmax_case argmax_cases[] = {
	{ 1, 50272, 0, false, false }, { 8, 50272, 16, false, false }, { 3, 7, 0, false, false },
	{ 64, 1000, 3, true, false },  { 5, 1, 0, false, false },      { 2, 4097, 0, true, false },
	{ 10, 50272, 5, false, true }, { 10, 3, 0, true, true },
};

START_TEST(test_argmax)
{
	const argmax_case *c = &argmax_cases[_i];
	const int ldx = c->n + c->ldx_pad;
	rng_seed(4000 + _i);
	float *x = fill_f32((size_t)c->rows * ldx, 10.0f);
	int32_t *want = malloc(sizeof(int32_t) * c->rows);
	for (int r = 0; r < c->rows; r++) {
		float *xr = x + (size_t)r * ldx;
		/* a clear maximum (no near-ties), or two exactly equal ones */
		const int i = rnd_int(c->n);
		xr[i] = 11.0f + (float)r;
		want[r] = i;
		if (c->ties && c->n > 1) {
			int j = rnd_int(c->n);
			if (j != i) {
				xr[j] = xr[i];
				want[r] = i < j ? i : j;
			}
		}
		for (int j = c->n; j < ldx; j++)
			xr[j] = 1e30f; /* the stride's padding is not part of the row */
		static const float poison[5] = { 0, NAN, INFINITY, 0, -INFINITY };
		if (c->poison && r % 5 != 0 && r % 5 != 3) {
			xr[rnd_int(c->n)] = poison[r % 5];
			want[r] = -1;
		}
	}
	int32_t *got[2];
	const size_t xb = (size_t)c->rows * ldx * 4;
	for (int s = 0; s < 2; s++) {
		float *dx = dput(s, x, xb);
		got[s] = malloc(sizeof(int32_t) * c->rows);
		memset(got[s], 0xff, sizeof(int32_t) * c->rows);
		ok(g_be[s]->ops->argmax(g_be[s], g_q[s], c->rows, c->n, dx, ldx, got[s]), "argmax");
		dfree(s, dx, xb);
	}
	for (int r = 0; r < c->rows; r++) {
		CHECK(got[0][r] == want[r], "argmax row %d: cpu %d, want %d", r, got[0][r],
		      want[r]);
		CHECK(got[1][r] == want[r], "argmax rows=%d n=%d row %d: %s %d, want %d",
		      c->rows, c->n, r, g_name, got[1][r], want[r]);
	}
	free(got[0]);
	free(got[1]);
	free(want);
	free(x);
}
END_TEST

/* ---- attention ------------------------------------------------------------------ */

#define MAXSEQ 1024

typedef struct attn_case {
	int nseq, nh, hd, t, cap;
	int meta[8]; /* npad (prefill) or len (decode) of the first sequences, random
		      * after them; meta[0] = -1: random for all */
	bool misalign; /* decode: cache pointers off 16-byte alignment */
	bool big;
	int nkv; /* KV heads (grouped-query attention); 0: nh */
} attn_case;

static const attn_case prefill_cases[] = {
	{ 1, 1, 64, 1, 4, { 0 }, false, false, 0 },
	{ 2, 2, 64, 17, 20, { 0, 3 }, false, false, 0 },
	{ 3, 4, 128, 40, 48, { 0, 5, 39 }, false, false, 0 },
	{ 2, 3, 80, 33, 40, { 7, 0 }, false, false, 0 },     /* OPT-2.7b's head dim */
	{ 4, 2, 32, 64, 64, { 0, 63, 64, 10 }, false, false, 0 }, /* one row, all padding */
	{ 1, 2, 256, 20, 24, { 2 }, false, false, 0 },
	{ 3, 2, 36, 19, 25, { -1 }, false, false, 0 },
	{ 2, 1, 8, 50, 50, { 1, 0 }, false, false, 0 },
	{ 2, 2, 30, 21, 24, { 3, 0 }, false, false, 0 },     /* hd % 4 != 0: scalar dots */
	{ 2, 1, 16, 5, 8, { 5, 5 }, false, false, 0 },       /* nothing but padding */
	{ 4, 8, 128, 128, 160, { 0, 17, 100, 127 }, false, true, 0 },
	{ 8, 32, 128, 256, 288, { -1 }, false, true, 0 },
	/* grouped-query attention */
	{ 3, 8, 64, 37, 40, { 0, 36, 9 }, false, false, 2 },
	{ 2, 8, 64, 20, 24, { 3, 0 }, false, false, 1 },   /* multi-query */
	{ 2, 6, 80, 33, 36, { 0, 5 }, false, false, 3 },
	{ 2, 4, 30, 21, 24, { 3, 0 }, false, false, 2 },   /* hd % 4 != 0: scalar dots */
	{ 4, 32, 128, 128, 160, { 0, 17, 100, 127 }, false, true, 8 }, /* llama-3-8b's heads */
};

static const attn_case decode_cases[] = {
	{ 3, 4, 64, 1, 50, { 0, 17, 49 }, false, false, 0 },  /* len 0: only the new token */
	{ 3, 2, 64, 1, 1, { 0, 0, 0 }, false, false, 0 },     /* one slot (an H2O budget of 0) */
	{ 2, 2, 128, 1, 300, { 299, 150 }, false, false, 0 }, /* a full cache */
	{ 5, 3, 80, 1, 40, { -1 }, false, false, 0 },
	{ 2, 2, 36, 1, 20, { 5, 19 }, false, false, 0 },      /* hd % 8 != 0: half loads */
	{ 2, 2, 64, 1, 33, { 31, 2 }, true, false, 0 },       /* misaligned: half loads */
	{ 1, 1, 256, 1, 10, { 9 }, false, false, 0 },
	{ 800, 1, 8, 1, 4, { -1 }, false, false, 0 },         /* more sequences than one launch */
	{ 16, 32, 128, 1, 1100, { -1 }, false, true, 0 },
	{ 4, 2, 64, 1, 4000, { 3999, 2500, 1, 0 }, false, true, 0 }, /* long contexts */
	/* grouped-query attention */
	{ 3, 8, 64, 1, 50, { 0, 17, 49 }, false, false, 2 },
	{ 2, 8, 64, 1, 30, { 29, 4 }, false, false, 1 },   /* multi-query */
	{ 5, 6, 80, 1, 40, { -1 }, false, false, 3 },
	{ 2, 4, 36, 1, 20, { 5, 19 }, false, false, 2 },   /* hd % 8 != 0: half loads */
	{ 2, 8, 64, 1, 33, { 31, 2 }, true, false, 4 },    /* misaligned: half loads */
	{ 16, 32, 128, 1, 600, { -1 }, false, true, 8 },   /* llama-3-8b's heads */
};

static void attn_meta(const attn_case *c, bool prefill, int *meta)
{
	for (int s = 0; s < c->nseq; s++) {
		int v = c->meta[0] >= 0 && s < 8 ? c->meta[s] : -1;
		if (v < 0)
			v = prefill ? rnd_int(c->t + 1) : rnd_int(c->cap);
		meta[s] = v;
	}
}

/*
 * Grouped-query attention against multi-head attention: k_new, v_new and
 * the cache (nkv heads) expanded to nh heads by repeat_kv (query head h
 * gets KV head h / (nh / nkv); a q4 slot's head is its codes and its
 * {mn16, scale16}, copied), run through the CPU backend with nkv 0, must
 * give got_out, and each KV head's score increments got_inc must be the
 * sum of its group's per-head ones.
 */
static void gqa_against_mha(const attn_case *c, bool prefill, bool with_score, bool q4,
			    const int *meta, const float *q, const float *kn, const float *vn,
			    const void *kc0, const void *vc0, const float *got_out,
			    const float *got_inc, const char *what)
{
	const int nh = c->nh, hd = c->hd, nkv = c->nkv, grp = nh / nkv;
	const int hidden = nh * hd, kvw = nkv * hd, rows = prefill ? c->t : 1;
	const size_t act = (size_t)c->nseq * rows * hidden;
	const size_t sbg = sl_kv_slot_bytes(nkv, hd, false, q4), sbx = sl_kv_slot_bytes(nh, hd, false, q4);
	const size_t slots = (size_t)c->nseq * c->cap, nsx = slots * nh;
	float *kx = malloc(sizeof(float) * act), *vx = malloc(sizeof(float) * act);
	for (size_t r = 0; r < (size_t)c->nseq * rows; r++)
		for (int h = 0; h < nh; h++) {
			memcpy(kx + r * hidden + (size_t)h * hd, kn + r * kvw + (size_t)(h / grp) * hd,
			       sizeof(float) * hd);
			memcpy(vx + r * hidden + (size_t)h * hd, vn + r * kvw + (size_t)(h / grp) * hd,
			       sizeof(float) * hd);
		}
	char *kcx = malloc(slots * sbx + 2), *vcx = malloc(slots * sbx + 2);
	const size_t ng = sl_q4_groups((size_t)hd), cb = ng * SL_Q4_CODE_BYTES, mb = ng * SL_Q4_META_BYTES;
	for (size_t j = 0; j < slots; j++)
		for (int kv = 0; kv < 2; kv++) {
			const char *from = (const char *)(kv ? vc0 : kc0) + j * sbg;
			char *to = (kv ? vcx : kcx) + j * sbx;
			for (int h = 0; h < nh; h++) {
				const int g = h / grp;
				if (q4) {
					memcpy(to + (size_t)h * cb, from + (size_t)g * cb, cb);
					memcpy(to + (size_t)nh * cb + (size_t)h * mb,
					       from + (size_t)nkv * cb + (size_t)g * mb, mb);
				} else {
					memcpy(to + (size_t)h * hd * 2, from + (size_t)g * hd * 2,
					       (size_t)hd * 2);
				}
			}
		}
	float *zero = calloc(nsx > act ? nsx : act, sizeof(float)); /* zeroes out and score */
	float *dq = dput(0, q, act * 4), *dk = dput(0, kx, act * 4), *dv = dput(0, vx, act * 4);
	float *dout = dput(0, zero, act * 4), *dscore = dput(0, zero, nsx * 4);
	char *dkc = dput(0, kcx, slots * sbx), *dvc = dput(0, vcx, slots * sbx);
	sl_attn_args a = { .nseq = c->nseq, .nh = nh, .hd = hd, .t = rows, .cap = c->cap,
			   .q = dq, .k_new = dk, .v_new = dv, .out = dout, .k_cache = dkc,
			   .v_cache = dvc, .kv_q4 = q4, .npad = prefill ? meta : NULL,
			   .len = prefill ? NULL : meta, .score = with_score ? dscore : NULL };
	if (prefill)
		ok(g_be[0]->ops->attn_prefill(g_be[0], g_q[0], &a), "attn_prefill (MHA)");
	else
		ok(g_be[0]->ops->attn_decode(g_be[0], g_q[0], &a), "attn_decode (MHA)");
	float *out = malloc(sizeof(float) * act), *sx = malloc(sizeof(float) * nsx);
	dget(0, out, dout, act * 4);
	dget(0, sx, dscore, nsx * 4);
	char swhat[260];
	snprintf(swhat, sizeof swhat, "%s against MHA over repeat_kv", what);
	check_close(swhat, out, got_out, act, TOL_FP32);
	if (with_score) {
		float *sum = calloc(slots * nkv, sizeof(float));
		for (int s = 0; s < c->nseq; s++)
			for (int h = 0; h < nh; h++)
				for (int j = 0; j < c->cap; j++)
					sum[((size_t)s * nkv + h / grp) * c->cap + j] +=
						sx[((size_t)s * nh + h) * c->cap + j];
		snprintf(swhat, sizeof swhat, "%s (score increments) against MHA's summed over groups",
			 what);
		check_close(swhat, sum, got_inc, slots * nkv, TOL_FP32);
		free(sum);
	}
	dfree(0, dq, act * 4);
	dfree(0, dk, act * 4);
	dfree(0, dv, act * 4);
	dfree(0, dout, act * 4);
	dfree(0, dscore, nsx * 4);
	dfree(0, dkc, slots * sbx);
	dfree(0, dvc, slots * sbx);
	free(kx), free(vx), free(kcx), free(vcx), free(zero), free(out), free(sx);
}

/* q4: a compressed cache (backend.h, kv_q4): the slots' bytes must agree
 * exactly (the codes are sl_q4's on both), the outputs within TOL_FP32. */
static void run_attn(const attn_case *c, bool prefill, bool with_score, bool q4, uint64_t seed)
{
	const int hidden = c->nh * c->hd, nkv = c->nkv ? c->nkv : c->nh, kvw = nkv * c->hd;
	const int rows = prefill ? c->t : 1;
	const size_t act = (size_t)c->nseq * rows * hidden; /* q, out */
	const size_t kact = (size_t)c->nseq * rows * kvw;   /* k_new, v_new */
	const size_t sb = sl_kv_slot_bytes(nkv, c->hd, false, q4);
	const size_t cb = (size_t)c->nseq * c->cap * sb; /* bytes of one cache */
	const size_t nscore = (size_t)c->nseq * nkv * c->cap;
	ck_assert_int_le(c->nseq, MAXSEQ);
	int meta[MAXSEQ];
	rng_seed(seed);
	attn_meta(c, prefill, meta);

	/* q arrives scaled by 1/sqrt(hd); a wider spread for some seeds makes
	 * peaked attention */
	const float qs = (seed & 1 ? 4.0f : 1.0f) / sqrtf((float)c->hd);
	float *q = fill_f32(act, qs);
	float *kn = fill_f32(kact, 1.0f);
	float *vn = fill_f32(kact, 1.0f);
	sl_half *kc0 = malloc(cb + 2), *vc0 = malloc(cb + 2);
	memset(kc0, 0xff, cb); /* NaN: any read of a slot outside the range shows */
	memset(vc0, 0xff, cb);
	if (!prefill && q4) { /* decode: slots [0, len) hold earlier tokens, quantised */
		sl_half *row = malloc(sizeof(sl_half) * (size_t)kvw);
		for (int s = 0; s < c->nseq; s++)
			for (int j = 0; j < meta[s]; j++)
				for (int kv = 0; kv < 2; kv++) {
					for (int e = 0; e < kvw; e++)
						row[e] = sl_float_to_half(rnd());
					sl_q4_quantize_matrix(row, (size_t)nkv, (size_t)c->hd,
							      (char *)(kv ? vc0 : kc0) + ((size_t)s * c->cap + j) * sb);
				}
		free(row);
	} else if (!prefill) /* decode: slots [0, len) hold earlier tokens */
		for (int s = 0; s < c->nseq; s++)
			for (int h = 0; h < nkv; h++)
				for (int j = 0; j < meta[s]; j++)
					for (int d = 0; d < c->hd; d++) {
						/* token-major: (nseq, cap, nkv, hd) */
						const size_t i = (((size_t)s * c->cap + j) * nkv + h) * c->hd + d;
						kc0[i] = sl_float_to_half(rnd());
						vc0[i] = sl_float_to_half(rnd());
					}
	float *score0 = fill_f32(nscore, 1.0f);
	for (size_t i = 0; i < nscore; i++)
		score0[i] = fabsf(score0[i]) * 3.0f;
	float *out0 = nan_f32(act);

	const size_t off = c->misalign ? 8 : 0; /* bytes */
	float *out[2], *score[2];
	sl_half *kcache[2], *vcache[2];
	for (int s = 0; s < 2; s++) {
		float *dq = dput(s, q, act * 4), *dk = dput(s, kn, kact * 4), *dv = dput(s, vn, kact * 4);
		float *dout = dput(s, out0, act * 4);
		char *dkc = NULL, *dvc = NULL;
		ok(sl_dev_alloc(g_be[s], cb + off, "test k cache", (void **)&dkc), "alloc");
		ok(sl_dev_alloc(g_be[s], cb + off, "test v cache", (void **)&dvc), "alloc");
		ok(g_be[s]->ops->copy_h2d(g_be[s], g_q[s], dkc + off, kc0, cb), "copy_h2d");
		ok(g_be[s]->ops->copy_h2d(g_be[s], g_q[s], dvc + off, vc0, cb), "copy_h2d");
		float *dscore = dput(s, score0, nscore * 4);
		sl_attn_args a = {
			.nseq = c->nseq, .nh = c->nh, .nkv = c->nkv, .hd = c->hd, .t = rows,
			.cap = c->cap, .q = dq, .k_new = dk, .v_new = dv, .out = dout,
			.k_cache = (sl_half *)(dkc + off), .v_cache = (sl_half *)(dvc + off),
			.kv_q4 = q4,
			.npad = prefill ? meta : NULL, .len = prefill ? NULL : meta,
			.score = with_score ? dscore : NULL,
		};
		if (prefill)
			ok(g_be[s]->ops->attn_prefill(g_be[s], g_q[s], &a), "attn_prefill");
		else
			ok(g_be[s]->ops->attn_decode(g_be[s], g_q[s], &a), "attn_decode");
		out[s] = nan_f32(act);
		score[s] = nan_f32(nscore);
		kcache[s] = malloc(cb + 2);
		vcache[s] = malloc(cb + 2);
		dget(s, out[s], dout, act * 4);
		dget(s, score[s], dscore, nscore * 4);
		dget(s, kcache[s], dkc + off, cb);
		dget(s, vcache[s], dvc + off, cb);
		dfree(s, dq, act * 4);
		dfree(s, dk, kact * 4);
		dfree(s, dv, kact * 4);
		dfree(s, dout, act * 4);
		dfree(s, dkc, cb + off);
		dfree(s, dvc, cb + off);
		dfree(s, dscore, nscore * 4);
	}
	char what[200];
	snprintf(what, sizeof(what), "attn_%s nseq=%d nh=%d nkv=%d hd=%d t=%d cap=%d score=%d%s%s",
		 prefill ? "prefill" : "decode", c->nseq, c->nh, nkv, c->hd, rows, c->cap, with_score,
		 c->misalign ? " misaligned" : "", q4 ? " q4" : "");
	/* the cache: the same fp16 bits (or q4 bytes) everywhere, written slots
	 * and untouched ones */
	ck_assert_msg(!memcmp(kcache[0], kcache[1], cb), "%s: k cache differs", what);
	ck_assert_msg(!memcmp(vcache[0], vcache[1], cb), "%s: v cache differs", what);
	if (prefill) /* padding rows: exact zeros */
		for (int s = 0; s < c->nseq; s++)
			for (int i = 0; i < meta[s]; i++)
				for (int e = 0; e < hidden; e++) {
					const size_t k = ((size_t)s * rows + i) * hidden + e;
					CHECK(out[0][k] == 0.0f && out[1][k] == 0.0f,
					      "%s: padding row %d of sequence %d is not zero (%g)", what,
					      i, s, out[1][k]);
				}
	check_close(what, out[0], out[1], act, TOL_FP32);
	/* the score: slots that got no probability keep their value exactly */
	for (size_t i = 0; i < nscore; i++) {
		const size_t sh = i / c->cap;
		const int slot = (int)(i % c->cap), seq = (int)(sh / nkv);
		const int used = prefill ? c->t - meta[seq] : meta[seq] + 1;
		if (!with_score || slot >= used)
			CHECK(score[0][i] == score0[i] && score[1][i] == score0[i],
			      "%s: score of slot %d (sequence %d) changed", what, slot, seq);
	}
	char swhat[240];
	snprintf(swhat, sizeof(swhat), "%s (H2O score)", what);
	check_close(swhat, score[0], score[1], nscore, TOL_FP32);
	if (with_score) { /* the increments alone, for a sharper comparison */
		for (int s = 0; s < 2; s++)
			for (size_t i = 0; i < nscore; i++)
				score[s][i] -= score0[i];
		snprintf(swhat, sizeof(swhat), "%s (H2O score increments)", what);
		check_close(swhat, score[0], score[1], nscore, TOL_FP32);
	}
	if (nkv != c->nh) /* the increments: score[1] now holds them */
		gqa_against_mha(c, prefill, with_score, q4, meta, q, kn, vn, kc0, vc0, out[1],
				score[1], what);
	for (int s = 0; s < 2; s++) {
		free(out[s]);
		free(score[s]);
		free(kcache[s]);
		free(vcache[s]);
	}
	free(q);
	free(kn);
	free(vn);
	free(kc0);
	free(vc0);
	free(score0);
	free(out0);
}

START_TEST(test_attn_prefill)
{
	const attn_case *c = &prefill_cases[_i];
	if (c->big && g_small)
		return;
	run_attn(c, true, false, false, 5000 + 2 * _i);
	run_attn(c, true, true, false, 5001 + 2 * _i);
	run_attn(c, true, false, true, 5500 + 2 * _i);
	run_attn(c, true, true, true, 5501 + 2 * _i);
}
END_TEST

START_TEST(test_attn_decode)
{
	const attn_case *c = &decode_cases[_i];
	if (c->big && g_small)
		return;
	run_attn(c, false, false, false, 6000 + 2 * _i);
	run_attn(c, false, true, false, 6001 + 2 * _i);
	run_attn(c, false, false, true, 6500 + 2 * _i);
	run_attn(c, false, true, true, 6501 + 2 * _i);
}
END_TEST

/* ---- H2O cache maintenance ------------------------------------------------------ */

/*
 * h2o_compact on a prompt, then a few decode steps of h2o_evict on what it
 * kept (each step writes a new token into slot len and adds to every held
 * slot's score, as attn_decode would).  These ops only move bits and
 * compare floats (evicted adds in the CPU's order), so every output must
 * match bit for bit: caches (untouched rows included), score, pos and
 * evicted.  The CPU's outputs are also checked against a restatement of
 * the specification in backend.h.  Poison: source slots past n hold NaN
 * scores, the destination's rows, scores and positions start as garbage,
 * and before each evict step the free slots past len hold a NaN score and
 * a bogus position that must survive.
 */
typedef struct h2o_case {
	int nseq, nh, hd;
	bool f32;
	int cap_in, cap;
	int heavy, recent; /* for every sequence; -1: random per sequence (B + 1 <= cap) */
	int n[4];          /* prompt tokens of the first sequences, random after them;
			    * n[0] = -1: random for all */
	bool ties;         /* scores from a few levels, zeros of both signs among them */
	bool evicted;      /* with the evicted array (else NULL) */
	int misalign;      /* bytes by which the cache pointers miss 16-byte alignment */
	int steps;         /* decode steps (evict) after the compaction */
	bool big;
} h2o_case;

static const h2o_case h2o_cases[] = {
	{ 1, 1, 1, true, 8, 6, 2, 3, { 8 }, false, true, 0, 4, false },
	{ 4, 2, 8, false, 40, 12, 6, 4, { 40, 10, 3, 0 }, false, true, 0, 3, false }, /* n > B, = B, < B, 0 */
	{ 2, 2, 64, true, 300, 70, 50, 10, { 300, 61 }, true, true, 0, 3, false },
	{ 2, 1, 128, false, 100, 30, 0, 20, { 100, 25 }, false, true, 0, 3, false }, /* H = 0 */
	{ 2, 1, 128, true, 100, 30, 0, 20, { 100, 21 }, true, false, 0, 2, false },  /* H = 0, no evicted */
	{ 2, 2, 64, false, 100, 40, 30, 0, { 100, 31 }, true, true, 0, 4, false }, /* R = 0 */
	{ 3, 2, 64, false, 12, 1, 0, 0, { 12, 1, 0 }, false, true, 0, 3, false },  /* budget 0 */
	{ 2, 2, 8, true, 9, 1, 0, 0, { 9, 3 }, true, false, 0, 2, false },         /* budget 0, no evicted */
	{ 4, 2, 8, true, 50, 48, -1, -1, { -1 }, true, false, 0, 3, false },       /* budgets per sequence */
	{ 2, 2, 8, false, 33, 16, 10, 5, { 33, 20 }, false, true, 2, 2, false },    /* 2-byte words */
	{ 1, 2, 1, false, 20, 8, 4, 3, { 20 }, true, true, 1, 2, false },           /* 1-byte words */
	{ 1, 1, 256, true, 64, 20, 12, 6, { 64 }, true, true, 0, 2, false },
	{ 3, 4, 128, true, 130, 64, 40, 20, { 130, 64, 59 }, true, true, 0, 3, false },
	{ 2, 8, 64, false, 600, 100, 64, 32, { 600, 97 }, false, true, 0, 2, false },
	{ 300, 1, 1, true, 6, 5, 2, 2, { -1 }, true, true, 0, 2, false }, /* several launches */
	{ 1, 1, 1, true, 5000, 40, 30, 8, { 5000 }, false, true, 0, 1, false }, /* > 48 KiB of shared */
	{ 1, 1, 1, true, 26000, 24, 16, 4, { 26000 }, true, true, 0, 1, false }, /* global workspace */
	{ 8, 16, 128, false, 2048, 300, 200, 60, { -1 }, false, true, 0, 3, true },
	{ 4, 32, 64, true, 1100, 200, -1, -1, { -1 }, true, true, 0, 3, true },
};

static void fill_bytes(void *p, size_t n)
{
	unsigned char *c = p;
	for (size_t i = 0; i < n; i++)
		c[i] = (unsigned char)(rng_next() >> 56);
}

/* a score: random, or (ties) one of a few levels, -0 and +0 among them */
static float h2o_score(bool ties)
{
	static const float lv[] = { -0.0f, 0.0f, 0.5f, 1.0f, 1.5f };
	return ties ? lv[rnd_int(5)] : fabsf(rnd()) * 3.0f;
}

typedef struct h2o_rank {
	float s;
	int i;
} h2o_rank;

/* best first: the higher score, then the newer position */
static int h2o_rank_cmp(const void *x, const void *y)
{
	const h2o_rank *a = x, *b = y;
	if (a->s > b->s)
		return -1;
	if (a->s < b->s)
		return 1;
	return b->i - a->i;
}

/* The row (of hd values) of slot j of (sequence, head) t = s * nh + h in a
 * token-major cache (backend.h: (nseq, cap, nh, hd)): (s * cap + j) * nh + h. */
static size_t kv_row(int cap, int nh, size_t t, int j)
{
	const size_t s = t / (size_t)nh, h = t % (size_t)nh;
	return (s * (size_t)cap + (size_t)j) * (size_t)nh + h;
}

/* device copy of host bytes, off bytes into a fresh allocation of bytes + off */
static char *dput_at(int s, const void *host, size_t bytes, size_t off)
{
	char *d = NULL;
	ok(sl_dev_alloc(g_be[s], bytes + off, "test buffer", (void **)&d), "sl_dev_alloc");
	ok(g_be[s]->ops->copy_h2d(g_be[s], g_q[s], d + off, host, bytes), "copy_h2d");
	ok(g_be[s]->ops->queue_sync(g_be[s], g_q[s]), "queue_sync");
	return d;
}

static void dset_at(int s, char *d, const void *host, size_t bytes, size_t off)
{
	ok(g_be[s]->ops->copy_h2d(g_be[s], g_q[s], d + off, host, bytes), "copy_h2d");
	ok(g_be[s]->ops->queue_sync(g_be[s], g_q[s]), "queue_sync");
}

/* the outputs of one side (or the expectation) */
typedef struct h2o_state {
	unsigned char *k, *v;
	float *score, *ev;
	int32_t *pos;
} h2o_state;

static void h2o_state_alloc(h2o_state *st, size_t cb, size_t ncs, size_t heads)
{
	st->k = malloc(cb + 1);
	st->v = malloc(cb + 1);
	st->score = malloc(ncs * 4 + 4);
	st->pos = malloc(ncs * 4 + 4);
	st->ev = malloc(heads * 4 + 4);
	ck_assert(st->k && st->v && st->score && st->pos && st->ev);
}

static void h2o_state_copy(h2o_state *dst, const h2o_state *src, size_t cb, size_t ncs,
			   size_t heads)
{
	memcpy(dst->k, src->k, cb);
	memcpy(dst->v, src->v, cb);
	memcpy(dst->score, src->score, ncs * 4);
	memcpy(dst->pos, src->pos, ncs * 4);
	memcpy(dst->ev, src->ev, heads * 4);
}

static void h2o_state_free(h2o_state *st)
{
	free(st->k);
	free(st->v);
	free(st->score);
	free(st->pos);
	free(st->ev);
}

/* the first difference of two byte arrays, or -1 */
static long long first_diff(const void *a, const void *b, size_t n)
{
	const unsigned char *x = a, *y = b;
	for (size_t i = 0; i < n; i++)
		if (x[i] != y[i])
			return (long long)i;
	return -1;
}

static void h2o_compare(const char *what, const char *side, const h2o_state *want,
			const h2o_state *got, size_t cb, size_t ncs, size_t heads, bool with_ev)
{
	long long d;
	d = first_diff(want->k, got->k, cb);
	ck_assert_msg(d < 0, "%s: %s k cache differs at byte %lld", what, side, d);
	d = first_diff(want->v, got->v, cb);
	ck_assert_msg(d < 0, "%s: %s v cache differs at byte %lld", what, side, d);
	for (size_t i = 0; i < ncs; i++) {
		CHECK(want->pos[i] == got->pos[i], "%s: %s pos[%zu] = %d, want %d", what,
		      side, i, got->pos[i], want->pos[i]);
		CHECK(!memcmp(&want->score[i], &got->score[i], 4),
		      "%s: %s score[%zu] = %.9g, want %.9g", what, side, i, got->score[i],
		      want->score[i]);
	}
	if (with_ev)
		for (size_t i = 0; i < heads; i++)
			CHECK(!memcmp(&want->ev[i], &got->ev[i], 4),
			      "%s: %s evicted[%zu] = %.9g, want %.9g", what, side, i,
			      got->ev[i], want->ev[i]);
}

/*
 * The byte ranges of the row of slot j of (sequence, head) t = s * nh + h:
 * fp16 / fp32 one range of row bytes at kv_row * row; a compressed cache
 * (q4: an sl_q4 (nh, hd) matrix per slot) two, head h's codes and its
 * {mn16, scale16} pairs.  off[k], len[k] for k < the count returned.
 */
static int kv_ranges(int cap, int nh, int hd, bool f32, bool q4, size_t t, int j, size_t *off,
		     size_t *len)
{
	if (q4) {
		const size_t ng = sl_q4_groups((size_t)hd), cbytes = ng * 32, mbytes = ng * 4;
		const size_t slot = (t / (size_t)nh * (size_t)cap + (size_t)j) *
				    sl_kv_slot_bytes(nh, hd, false, true);
		const size_t h = t % (size_t)nh;
		off[0] = slot + h * cbytes;
		len[0] = cbytes;
		off[1] = slot + (size_t)nh * cbytes + h * mbytes;
		len[1] = mbytes;
		return 2;
	}
	const size_t row = (size_t)hd * (f32 ? 4 : 2);
	off[0] = kv_row(cap, nh, t, j) * row;
	len[0] = row;
	return 1;
}

static void kv_copy_row(unsigned char *dst, int dcap, int dj, const unsigned char *src, int scap,
			int sj, int nh, int hd, bool f32, bool q4, size_t t)
{
	size_t doff[2], soff[2], len[2];
	const int n = kv_ranges(dcap, nh, hd, f32, q4, t, dj, doff, len);
	kv_ranges(scap, nh, hd, f32, q4, t, sj, soff, len);
	for (int k = 0; k < n; k++)
		memmove(dst + doff[k], src + soff[k], len[k]);
}

static void kv_fill_row(unsigned char *dst, int cap, int j, int nh, int hd, bool f32, bool q4,
			size_t t)
{
	size_t off[2], len[2];
	const int n = kv_ranges(cap, nh, hd, f32, q4, t, j, off, len);
	for (int k = 0; k < n; k++)
		fill_bytes(dst + off[k], len[k]);
}

/* q4: the same over a compressed cache (kv_q4; c->f32 is ignored): the
 * rows are random bytes, which H2O only moves */
static void run_h2o(const h2o_case *c, bool q4, uint64_t seed)
{
	const int nh = c->nh;
	const bool f32 = c->f32 && !q4;
	const size_t row = sl_kv_slot_bytes(nh, c->hd, f32, q4) / (size_t)nh; /* per (slot, head) */
	const size_t heads = (size_t)c->nseq * nh;
	const size_t nsrc = heads * c->cap_in, ncs = heads * c->cap;
	const size_t srcb = nsrc * row, cb = ncs * row;
	const size_t off = (size_t)c->misalign;
	ck_assert_int_le(c->nseq, MAXSEQ);
	int n[MAXSEQ], H[MAXSEQ], R[MAXSEQ], len[MAXSEQ], cur[MAXSEQ];
	rng_seed(seed);
	for (int s = 0; s < c->nseq; s++) {
		H[s] = c->heavy >= 0 ? c->heavy : rnd_int(c->cap);
		R[s] = c->recent >= 0 ? c->recent : rnd_int(c->cap - H[s]);
		ck_assert_int_lt(H[s] + R[s], c->cap);
		n[s] = c->n[0] >= 0 && s < 4 ? c->n[s] : rnd_int(c->cap_in + 1);
		ck_assert_int_le(n[s], c->cap_in);
	}

	/* sources: random rows, scores for the prompt's slots, NaN after them */
	unsigned char *ksrc = malloc(srcb + 1), *vsrc = malloc(srcb + 1);
	fill_bytes(ksrc, srcb);
	fill_bytes(vsrc, srcb);
	float *ssrc = nan_f32(nsrc);
	for (size_t t = 0; t < heads; t++)
		for (int j = 0; j < n[t / nh]; j++)
			ssrc[t * c->cap_in + j] = h2o_score(c->ties);
	/* destination: garbage everywhere */
	h2o_state in, out[2], want;
	h2o_state_alloc(&in, cb, ncs, heads);
	h2o_state_alloc(&out[0], cb, ncs, heads);
	h2o_state_alloc(&out[1], cb, ncs, heads);
	h2o_state_alloc(&want, cb, ncs, heads);
	fill_bytes(in.k, cb);
	fill_bytes(in.v, cb);
	memset(in.score, 0xff, ncs * 4);
	memset(in.pos, 0x7f, ncs * 4);
	for (size_t t = 0; t < heads; t++)
		in.ev[t] = fabsf(rnd());

	char what[240];
	const int nwhat = snprintf(what, sizeof(what),
				   "h2o nseq=%d nh=%d hd=%d %s cap_in=%d cap=%d H=%d R=%d ties=%d "
				   "evicted=%d misalign=%d",
				   c->nseq, nh, c->hd, q4 ? "q4" : f32 ? "fp32" : "fp16", c->cap_in, c->cap,
				   c->heavy, c->recent, c->ties, c->evicted, c->misalign);

	/* ---- compact: both sides */
	char *dks[2], *dvs[2], *dkc[2], *dvc[2];
	float *dss[2], *dsc[2], *dev[2];
	int32_t *dpos[2];
	for (int s = 0; s < 2; s++) {
		ck_assert_msg(g_be[s]->ops->h2o_compact && g_be[s]->ops->h2o_evict,
			      "backend %s has no H2O ops", g_be[s]->ops->name);
		dks[s] = dput_at(s, ksrc, srcb, off);
		dvs[s] = dput_at(s, vsrc, srcb, off);
		dkc[s] = dput_at(s, in.k, cb, off);
		dvc[s] = dput_at(s, in.v, cb, off);
		dss[s] = dput(s, ssrc, nsrc * 4);
		dsc[s] = dput(s, in.score, ncs * 4);
		dpos[s] = dput(s, in.pos, ncs * 4);
		dev[s] = dput(s, in.ev, heads * 4);
		sl_h2o_args a = {
			.nseq = c->nseq, .nh = nh, .hd = c->hd, .kv_f32 = f32, .kv_q4 = q4,
			.k_src = dks[s] + off, .v_src = dvs[s] + off, .score_src = dss[s],
			.cap_in = c->cap_in, .k_cache = dkc[s] + off, .v_cache = dvc[s] + off,
			.score = dsc[s], .pos = dpos[s], .cap = c->cap, .n = n,
			.heavy = H, .recent = R, .evicted = c->evicted ? dev[s] : NULL,
		};
		ok(g_be[s]->ops->h2o_compact(g_be[s], g_q[s], &a), "h2o_compact");
		dget(s, out[s].k, dkc[s] + off, cb);
		dget(s, out[s].v, dvc[s] + off, cb);
		dget(s, out[s].score, dsc[s], ncs * 4);
		dget(s, out[s].pos, dpos[s], ncs * 4);
		dget(s, out[s].ev, dev[s], heads * 4);
	}
	snprintf(what + nwhat, sizeof(what) - (size_t)nwhat, " compact");
	/* the specification, against the CPU */
	h2o_state_copy(&want, &in, cb, ncs, heads);
	h2o_rank *rk = malloc(sizeof(*rk) * (size_t)c->cap_in + 1);
	int *keep = malloc(sizeof(int) * (size_t)c->cap_in + 1);
	for (size_t t = 0; t < heads; t++) {
		const int s = (int)(t / nh), B = H[s] + R[s];
		const float *sc = ssrc + t * c->cap_in;
		int kept = 0;
		if (n[s] <= B) {
			for (int j = 0; j < n[s]; j++)
				keep[kept++] = j;
		} else {
			const int cand = n[s] - R[s];
			for (int j = 0; j < cand; j++)
				rk[j] = (h2o_rank){ sc[j], j };
			qsort(rk, (size_t)cand, sizeof(*rk), h2o_rank_cmp);
			for (int j = H[s]; j < cand; j++)
				want.ev[t] += rk[j].s;
			memset(keep, 0, sizeof(int) * (size_t)cand);
			for (int j = 0; j < H[s]; j++)
				keep[rk[j].i] = 1;
			for (int j = 0; j < cand; j++)
				if (keep[j])
					keep[kept++] = j;
			for (int j = cand; j < n[s]; j++)
				keep[kept++] = j;
		}
		for (int j = 0; j < c->cap; j++) {
			const size_t o = t * c->cap + j;
			want.score[o] = j < kept ? sc[keep[j]] : 0.0f;
			want.pos[o] = j < kept ? keep[j] : -1;
			if (j < kept) {
				kv_copy_row(want.k, c->cap, j, ksrc, c->cap_in, keep[j], nh, c->hd, f32, q4, t);
				kv_copy_row(want.v, c->cap, j, vsrc, c->cap_in, keep[j], nh, c->hd, f32, q4, t);
			}
		}
		len[s] = SL_MIN(n[s], B);
		cur[s] = n[s];
	}
	h2o_compare(what, "cpu", &want, &out[0], cb, ncs, heads, c->evicted);
	h2o_compare(what, g_name, &out[0], &out[1], cb, ncs, heads, c->evicted);

	/* ---- evict, step by step, from the CPU's result */
	h2o_state st;
	h2o_state_alloc(&st, cb, ncs, heads);
	h2o_state_copy(&st, &out[0], cb, ncs, heads);
	for (int step = 0; step < c->steps; step++) {
		snprintf(what + nwhat, sizeof(what) - (size_t)nwhat, " evict step %d", step);
		/* attn_decode's part: the new token in slot len, scores grown */
		for (size_t t = 0; t < heads; t++) {
			const int L = len[t / nh];
			float *sc = st.score + t * c->cap;
			int32_t *ps = st.pos + t * c->cap;
			kv_fill_row(st.k, c->cap, L, nh, c->hd, f32, q4, t);
			kv_fill_row(st.v, c->cap, L, nh, c->hd, f32, q4, t);
			for (int j = 0; j < L; j++)
				sc[j] += c->ties ? 0.5f * (float)rnd_int(2) : fabsf(rnd()) * 0.1f;
			sc[L] = h2o_score(c->ties);
			if (R[t / nh] == 0 && (step & 1)) /* below all: the new token is the victim */
				sc[L] = -1.0f;
			for (int j = L + 1; j < c->cap; j++) {
				memset(&sc[j], 0xff, 4);
				ps[j] = 0x7f7f7f7f;
			}
		}
		for (int s = 0; s < 2; s++) {
			dset_at(s, dkc[s], st.k, cb, off);
			dset_at(s, dvc[s], st.v, cb, off);
			dset_at(s, (char *)dsc[s], st.score, ncs * 4, 0);
			dset_at(s, (char *)dpos[s], st.pos, ncs * 4, 0);
			dset_at(s, (char *)dev[s], st.ev, heads * 4, 0);
			sl_h2o_args a = {
				.nseq = c->nseq, .nh = nh, .hd = c->hd, .kv_f32 = f32, .kv_q4 = q4,
				.k_cache = dkc[s] + off, .v_cache = dvc[s] + off, .score = dsc[s],
				.pos = dpos[s], .cap = c->cap, .len = len, .cur = cur, .heavy = H,
				.recent = R, .evicted = c->evicted ? dev[s] : NULL,
			};
			ok(g_be[s]->ops->h2o_evict(g_be[s], g_q[s], &a), "h2o_evict");
			dget(s, out[s].k, dkc[s] + off, cb);
			dget(s, out[s].v, dvc[s] + off, cb);
			dget(s, out[s].score, dsc[s], ncs * 4);
			dget(s, out[s].pos, dpos[s], ncs * 4);
			dget(s, out[s].ev, dev[s], heads * 4);
		}
		/* the specification */
		h2o_state_copy(&want, &st, cb, ncs, heads);
		for (size_t t = 0; t < heads; t++) {
			const int s = (int)(t / nh), L = len[s];
			float *sc = want.score + t * c->cap;
			int32_t *ps = want.pos + t * c->cap;
			ps[L] = cur[s];
			if (L + 1 <= H[s] + R[s])
				continue;
			int v = -1; /* the lowest score before the window, the older on a tie */
			for (int j = 0; j <= L; j++)
				if (ps[j] <= cur[s] - R[s] &&
				    (v < 0 || sc[j] < sc[v] || (sc[j] == sc[v] && ps[j] < ps[v])))
					v = j;
			CHECK(v >= 0, "%s: no victim outside the recent window", what);
			if (c->evicted)
				want.ev[t] += sc[v];
			if (v != L) {
				kv_copy_row(want.k, c->cap, v, want.k, c->cap, L, nh, c->hd, f32, q4, t);
				kv_copy_row(want.v, c->cap, v, want.v, c->cap, L, nh, c->hd, f32, q4, t);
				sc[v] = sc[L];
				ps[v] = ps[L];
			}
			sc[L] = 0.0f;
			ps[L] = -1;
		}
		h2o_compare(what, "cpu", &want, &out[0], cb, ncs, heads, c->evicted);
		h2o_compare(what, g_name, &out[0], &out[1], cb, ncs, heads, c->evicted);
		h2o_state_copy(&st, &out[0], cb, ncs, heads);
		for (int s = 0; s < c->nseq; s++) {
			len[s] = SL_MIN(len[s] + 1, H[s] + R[s]);
			cur[s]++;
		}
	}

	for (int s = 0; s < 2; s++) {
		dfree(s, dks[s], srcb + off);
		dfree(s, dvs[s], srcb + off);
		dfree(s, dkc[s], cb + off);
		dfree(s, dvc[s], cb + off);
		dfree(s, dss[s], nsrc * 4);
		dfree(s, dsc[s], ncs * 4);
		dfree(s, dpos[s], ncs * 4);
		dfree(s, dev[s], heads * 4);
	}
	h2o_state_free(&in);
	h2o_state_free(&out[0]);
	h2o_state_free(&out[1]);
	h2o_state_free(&want);
	h2o_state_free(&st);
	free(rk);
	free(keep);
	free(ksrc);
	free(vsrc);
	free(ssrc);
}

START_TEST(test_h2o)
{
	const h2o_case *c = &h2o_cases[_i];
	if (c->big && g_small)
		return;
	run_h2o(c, false, 8000 + _i);
	run_h2o(c, true, 8500 + _i);
}
END_TEST

/* ---- queues, events, copies, errors, budget -------------------------------------- */

START_TEST(test_queues_events)
{
	/* a chain over two queues of the backend under test, ordered by events */
	sl_backend *b = g_be[1];
	sl_queue *q1 = NULL, *q2 = NULL;
	sl_event *e = NULL;
	ok(b->ops->queue_create(b, &q1), "queue_create");
	ok(b->ops->queue_create(b, &q2), "queue_create");
	ok(b->ops->event_create(b, &e), "event_create");
	const size_t n = (size_t)3 << 20;
	unsigned char *h = NULL, *back = malloc(n);
	ok(b->ops->host_alloc(b, n, (void **)&h), "host_alloc");
	for (size_t i = 0; i < n; i++)
		h[i] = (unsigned char)(i * 7 + 3);
	void *d1 = NULL, *d2 = NULL;
	ok(sl_dev_alloc(b, n, "a", &d1), "sl_dev_alloc");
	ok(sl_dev_alloc(b, n, "b", &d2), "sl_dev_alloc");
	ok(b->ops->memset_dev(b, q2, d2, 0x5a, n), "memset_dev");
	ok(b->ops->queue_sync(b, q2), "queue_sync");
	ok(b->ops->copy_h2d(b, q1, d1, h, n), "copy_h2d");
	ok(b->ops->event_record(b, e, q1), "event_record");
	ok(b->ops->queue_wait(b, q2, e), "queue_wait");
	ok(b->ops->copy_d2d(b, q2, d2, d1, n / 2), "copy_d2d");
	ok(b->ops->event_record(b, e, q2), "event_record");
	ok(b->ops->event_sync(b, e), "event_sync");
	ok(b->ops->copy_d2h(b, NULL, back, d2, n), "copy_d2h on the NULL queue");
	ok(b->ops->queue_sync(b, NULL), "queue_sync NULL");
	for (size_t i = 0; i < n; i++) {
		const unsigned char want = i < n / 2 ? h[i] : 0x5a;
		CHECK(back[i] == want, "byte %zu: %d, want %d", i, back[i], want);
	}
	/* zero-byte copies are no-ops */
	ok(b->ops->copy_h2d(b, q1, d1, h, 0), "copy_h2d of 0 bytes");
	sl_dev_free(b, d1, n);
	sl_dev_free(b, d2, n);
	b->ops->host_free(b, h);
	b->ops->event_free(b, e);
	b->ops->queue_free(b, q1);
	b->ops->queue_free(b, q2);
	free(back);
}
END_TEST

START_TEST(test_errors)
{
	for (int s = 0; s < 2; s++) {
		sl_backend *b = g_be[s];
		sl_gemm_args a = { .m = 2, .n = 3, .k = 8, .ldx = 4, .ldy = 3 };
		ck_assert_int_eq(b->ops->gemm(b, g_q[s], &a), SL_EINVAL);
		int npad[2] = { 0, 9 };
		sl_attn_args at = { .nseq = 2, .nh = 1, .hd = 8, .t = 8, .cap = 8, .npad = npad };
		float dummy[64];
		sl_half hdummy[64];
		at.q = at.k_new = at.v_new = at.out = dummy;
		at.k_cache = at.v_cache = hdummy;
		ck_assert_int_eq(b->ops->attn_prefill(b, g_q[s], &at), SL_EINVAL);
		int len[2] = { 3, 8 }; /* 8 == cap: no slot for the new token */
		at.npad = NULL;
		at.len = len;
		at.t = 1;
		ck_assert_int_eq(b->ops->attn_decode(b, g_q[s], &at), SL_EINVAL);
		ck_assert_ptr_nonnull(strstr(sl_errmsg(), "8"));
		/* KV heads that do not divide the query heads, or negative */
		for (int nkv = -1; nkv <= 3; nkv += 4) {
			int zero[1] = { 0 };
			sl_attn_args ag = { .nseq = 1, .nh = 4, .nkv = nkv, .hd = 8, .t = 1, .cap = 2,
					    .q = dummy, .k_new = dummy, .v_new = dummy, .out = dummy,
					    .k_cache = hdummy, .v_cache = hdummy, .npad = zero };
			ck_assert_int_eq(b->ops->attn_prefill(b, g_q[s], &ag), SL_EINVAL);
			ck_assert_ptr_nonnull(strstr(sl_errmsg(), "KV heads"));
			ag.npad = NULL;
			ag.len = zero;
			ck_assert_int_eq(b->ops->attn_decode(b, g_q[s], &ag), SL_EINVAL);
			ck_assert_ptr_nonnull(strstr(sl_errmsg(), "KV heads"));
		}
		/* H2O: more prompt tokens than source slots; a full cache */
		int n[2] = { 4, 9 }, heavy[2] = { 2, 2 }, recent[2] = { 1, 1 }, cur[2] = { 5, 9 };
		int32_t pdummy[64];
		sl_h2o_args ha = { .nseq = 2, .nh = 1, .hd = 8, .k_src = hdummy, .v_src = hdummy,
				   .score_src = dummy, .cap_in = 8, .k_cache = hdummy,
				   .v_cache = hdummy, .score = dummy, .pos = pdummy, .cap = 4,
				   .n = n, .heavy = heavy, .recent = recent };
		ck_assert_int_eq(b->ops->h2o_compact(b, g_q[s], &ha), SL_EINVAL);
		ck_assert_ptr_nonnull(strstr(sl_errmsg(), "9"));
		int len2[2] = { 3, 4 }; /* 4 == cap */
		ha.n = NULL;
		ha.len = len2;
		ha.cur = cur;
		ck_assert_int_eq(b->ops->h2o_evict(b, g_q[s], &ha), SL_EINVAL);
		/* the Llama ops: an odd head dim, rows shorter than n */
		int32_t pos[1] = { 0 };
		sl_rope_args ra = { .rows = 1, .hd = 7, .nh_q = 1, .q = dummy, .ldq = 7,
				    .pos = pos, .inv_freq = dummy };
		ck_assert_int_eq(b->ops->rope(b, g_q[s], &ra), SL_EINVAL);
		ck_assert_ptr_nonnull(strstr(sl_errmsg(), "head dim 7"));
		ck_assert_int_eq(b->ops->rmsnorm(b, g_q[s], 2, 8, dummy, 4, hdummy, 1e-6f, dummy, 8),
				 SL_EINVAL);
		ck_assert_int_eq(b->ops->swiglu(b, g_q[s], 2, 8, dummy, 8, dummy, 8, dummy, 7),
				 SL_EINVAL);
	}
}
END_TEST

/* The backend's own workspaces count against the device budget. */
START_TEST(test_budget)
{
	if (strcmp(g_name, "cuda"))
		return; /* the CPU backend keeps its workspaces in host memory */
	sl_backend *b = NULL;
	ok(sl_backend_create(g_name, 1, &b), "sl_backend_create");
	const int m = 64, n = 256, k = 4096;
	const size_t xb = (size_t)m * k * 4, wb = (size_t)n * k * 2, yb = (size_t)m * n * 4;
	sl_backend_set_dev_limit(b, xb + wb + yb + 4096);
	void *dx, *dw, *dy;
	ok(sl_dev_alloc(b, xb, "x", &dx), "sl_dev_alloc");
	ok(sl_dev_alloc(b, wb, "w", &dw), "sl_dev_alloc");
	ok(sl_dev_alloc(b, yb, "y", &dy), "sl_dev_alloc");
	sl_gemm_args a = { .m = m, .n = n, .k = k, .x = dx, .ldx = k, .w = dw, .y = dy, .ldy = n };
	const int rc = b->ops->gemm(b, NULL, &a);
	ck_assert_msg(rc == SL_EBUDGET, "gemm over the budget returned %d (%s)", rc, sl_errmsg());
	ck_assert_msg(b->dev_used == xb + wb + yb, "accounting leaked: %zu used", b->dev_used);
	/* with room it runs, and the workspaces show in dev_used */
	sl_backend_set_dev_limit(b, 0);
	ok(b->ops->gemm(b, NULL, &a), "gemm with room");
	ok(b->ops->queue_sync(b, NULL), "queue_sync");
	ck_assert_msg(b->dev_used > xb + wb + yb, "workspaces not accounted: %zu used", b->dev_used);
	sl_dev_free(b, dx, xb);
	sl_dev_free(b, dw, wb);
	sl_dev_free(b, dy, yb);
	sl_backend_free(b);
}
END_TEST

/* The chunked paths: a backend whose scratch cap is small. */
START_TEST(test_chunked)
{
	if (strcmp(g_name, "cuda"))
		return;
	setenv("SLUICE_CUDA_SCRATCH_MAX", "64K", 1);
	sl_backend *b = NULL;
	const int rc = sl_backend_create(g_name, 1, &b);
	unsetenv("SLUICE_CUDA_SCRATCH_MAX");
	ok(rc, "sl_backend_create with a 64K scratch cap");
	sl_backend *keep = g_be[1];
	sl_queue *keepq = g_q[1];
	g_be[1] = b;
	g_q[1] = NULL;
	/* 64K of scratch: a few hundred rows of k = 96 per chunk, fewer with relu+accum */
	const gemm_case gc = { 700, 300, 96, 1, 2, 1.0f, false };
	for (unsigned combo = 0; combo < 8; combo++)
		run_gemm(&gc, combo & 1,
			 ((combo & 2) ? SL_GEMM_RELU : 0u) | ((combo & 4) ? SL_GEMM_ACCUM : 0u),
			 7000 + combo, false);
	/* 4-bit weights: panels of 128 weight rows (half the 64K for their fp16
	 * copy), the x rows in chunks */
	for (unsigned combo = 0; combo < 8; combo += 3)
		run_gemm(&gc, combo & 1,
			 ((combo & 2) ? SL_GEMM_RELU : 0u) | ((combo & 4) ? SL_GEMM_ACCUM : 0u),
			 7050 + combo, true);
	/* prefill with score: (m, l) of 2 heads x 200 rows is 3.2K per sequence */
	const attn_case pc = { 30, 2, 16, 200, 210, { -1 }, false, false, 0 };
	run_attn(&pc, true, true, false, 7100);
	run_attn(&pc, true, true, true, 7101);
	/* h2o_compact's sort in global scratch, one block per launch */
	const h2o_case hc = { 1, 2, 1, true, 26000, 24, 16, 4, { 26000 }, true, true, 0, 1, false };
	run_h2o(&hc, false, 7200);
	g_be[1] = keep;
	g_q[1] = keepq;
	sl_backend_free(b);
}
END_TEST

/* Both backends implement every call of backend_ops.def (H2O included):
 * none of their wrappers answers SL_EUNSUPPORTED. */
START_TEST(test_table_complete)
{
	for (int s = 0; s < 2; s++) {
		const sl_backend_ops *o = g_be[s]->ops;
#define SL_BACKEND_CALL(ret, fn, params, args)                                 \
	ck_assert_msg(o->fn != NULL, "backend %s lacks %s", o->name, #fn);
#define SL_BACKEND_OP(fn, params, args) SL_BACKEND_CALL(int, fn, params, args)
#include "backend_ops.def"
	}
}
END_TEST

/* ---- main ----------------------------------------------------------------------- */

static Suite *cross_suite(void)
{
	Suite *s = suite_create("cross_backend");
	TCase *tc = tcase_create("table");
	tcase_add_test(tc, test_table_complete);
	suite_add_tcase(s, tc);
	tc = tcase_create("ops");
	tcase_set_timeout(tc, 600);
	tcase_add_loop_test(tc, test_gemm, 0, (int)SL_ARRAY_LEN(gemm_cases));
	tcase_add_loop_test(tc, test_gemm_q4, 0, (int)SL_ARRAY_LEN(gemm_cases));
	tcase_add_loop_test(tc, test_layernorm, 0, (int)SL_ARRAY_LEN(ln_cases));
	tcase_add_loop_test(tc, test_rmsnorm, 0, (int)SL_ARRAY_LEN(rms_cases));
	tcase_add_loop_test(tc, test_rope, 0, (int)SL_ARRAY_LEN(rope_cases));
	tcase_add_loop_test(tc, test_swiglu, 0, (int)SL_ARRAY_LEN(swiglu_cases));
	tcase_add_loop_test(tc, test_embed, 0, (int)SL_ARRAY_LEN(embed_cases));
	tcase_add_loop_test(tc, test_argmax, 0, (int)SL_ARRAY_LEN(argmax_cases));
	tcase_add_loop_test(tc, test_attn_prefill, 0, (int)SL_ARRAY_LEN(prefill_cases));
	tcase_add_loop_test(tc, test_attn_decode, 0, (int)SL_ARRAY_LEN(decode_cases));
	tcase_add_loop_test(tc, test_h2o, 0, (int)SL_ARRAY_LEN(h2o_cases));
	tcase_add_test(tc, test_queues_events);
	tcase_add_test(tc, test_errors);
	tcase_add_test(tc, test_budget);
	tcase_add_test(tc, test_chunked);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	const char *env = getenv("SL_CROSS_BACKEND");
	if (env && *env)
		g_name = env;
	g_small = getenv("SL_CROSS_SMALL") != NULL;
	if (!strcmp(g_name, "cuda")) {
		if (!sl_backend_cuda_built()) {
			printf("SKIP: this build has no CUDA backend (configure with -Dcuda=enabled)\n");
			return 77;
		}
#if SL_HAVE_CUDA
		if (!sl_cuda_usable()) {
			sl_backend *b = NULL;
			int rc = sl_backend_create("cuda", 0, &b);
			printf("SKIP: no usable CUDA GPU: %s\n", rc < 0 ? sl_errmsg() : "(unknown)");
			sl_backend_free(b);
			return 77;
		}
#endif
	}
	int rc = sl_backend_create("cpu", 0, &g_be[0]);
	if (rc == 0)
		rc = sl_backend_create(g_name, 0, &g_be[1]);
	if (rc < 0) {
		fprintf(stderr, "test_cross_backend: %s\n", sl_errmsg());
		return 1;
	}
	for (int s = 0; s < 2; s++)
		if (g_be[s]->ops->queue_create(g_be[s], &g_q[s]) < 0) {
			fprintf(stderr, "test_cross_backend: %s\n", sl_errmsg());
			return 1;
		}
	printf("comparing backend '%s' against 'cpu'%s\n", g_name,
	       g_small ? " (small cases only)" : "");

	SRunner *sr = srunner_create(cross_suite());
	/* one process: a CUDA context does not survive fork() */
	srunner_set_fork_status(sr, CK_NOFORK);
	srunner_run_all(sr, CK_NORMAL);
	const int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	for (int s = 0; s < 2; s++) {
		g_be[s]->ops->queue_free(g_be[s], g_q[s]);
		sl_backend_free(g_be[s]);
	}
	return failed ? 1 : 0;
}
