/*
 * test_ops.c - every op of the CPU backend against naive references.
 *
 * The references below are written independently of the implementation:
 * plain loops, double accumulation, fp16 rounding done with frexp/ldexp and
 * nearbyint (round to nearest even), fp16 widening with ldexp.  Where the
 * CPU converts fp16 itself (F16C on x86-64, FCVT on AArch64), the fp16
 * conversions of sl_common.h are also compared with the hardware.  Each op runs over a case table (Check loop tests); random
 * values come from a fixed-seed xorshift generator, in [-1, 1] (weights
 * rounded to fp16).  Buffers are malloc'd at their exact size and the
 * memory around the block an op may touch is poisoned (NaN bit patterns,
 * compared bitwise afterwards), so strides, padding and cache slots that an
 * op must not read or write are checked too.
 *
 * Two CPU backends are created per test: the default one (AVX2/F16C
 * kernels where the CPU has them) and one with SLUICE_CPU_KERNELS=generic
 * (the portable paths, the only ones on other architectures); ops whose
 * code differs between the two run on both.
 *
 * The GEMM small-m threshold (SLUICE_GEMM_SMALL_M, default 8) is read once
 * per process, so the m values of the table straddle it instead: m <= 8
 * takes the direct kernel, m >= 9 the packed path.
 *
 * Over 800 lines on purpose: one reference per op with its case table,
 * all sharing the poisoning, random and fp16 helpers at the top; split by
 * op, each file would repeat those helpers or need a header of its own.
 */
#include "backend.h"
#include "sl_q4.h"
#include "cpu/cpu_backend.h"
#include "sl_config.h"
#include "sl_q4.h"

#include "testutil.h"

#include <check.h>
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* ck_assert reports every passing assertion to the parent process, far too
 * slow for element loops: element checks only call Check when they fail. */
#define FAIL_IF(cond, ...)                                                    \
	do {                                                                  \
		if (cond)                                                     \
			ck_abort_msg(__VA_ARGS__);                            \
	} while (0)

#define POISON_F32 0x7fc0deadu /* a quiet NaN no op computes */
#define POISON_F16 0x7e5au     /* an fp16 quiet NaN */

/* ---- helpers ------------------------------------------------------------ */

typedef struct rng {
	uint64_t s;
} rng;

static rng rng_seed(uint64_t seed)
{
	rng r = { (seed + 1) * 0x9E3779B97F4A7C15ull };
	if (!r.s)
		r.s = 1;
	return r;
}

static uint64_t rng_u64(rng *r) /* xorshift64* */
{
	uint64_t x = r->s;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	r->s = x;
	return x * 0x2545F4914F6CDD1Dull;
}

static uint32_t rng_u32(rng *r)
{
	return (uint32_t)(rng_u64(r) >> 32);
}

static float rng_unif(rng *r) /* [-1, 1] */
{
	return (float)((double)(rng_u64(r) >> 11) * 0x1p-52 - 1.0);
}

static int rng_int(rng *r, int n) /* [0, n) */
{
	return (int)(rng_u64(r) % (uint64_t)n);
}

static uint32_t fbits(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof u);
	return u;
}

static float bitsf(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof f);
	return f;
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	ck_assert_ptr_nonnull(p);
	return p;
}

/* Independent fp16 references.  ref_half: exact value (NaN for NaNs). */
static double ref_half(uint16_t h)
{
	const int e = (h >> 10) & 31, m = h & 1023;
	double v;
	if (e == 0)
		v = ldexp(m, -24);
	else if (e == 31)
		v = m ? NAN : INFINITY;
	else
		v = ldexp(1024 + m, e - 25);
	return (h & 0x8000) ? -v : v;
}

/* Round to nearest even; NaN -> the canonical quiet NaN with the sign. */
static uint16_t ref_f2h(float f)
{
	const uint16_t sign = signbit(f) ? 0x8000 : 0;
	if (isnan(f))
		return sign | 0x7e00;
	const double a = fabs((double)f);
	if (a >= 65520.0) /* the tie 65520 rounds to the even 2^16: inf */
		return sign | 0x7c00;
	if (a < 0x1p-14) /* subnormal: multiples of 2^-24, exact scaling */
		return sign | (uint16_t)nearbyint(ldexp(a, 24)); /* 1024 is 2^-14 */
	int ex;
	frexp(a, &ex);
	int e = ex - 1; /* a in [2^e, 2^(e+1)) */
	double q = nearbyint(ldexp(a, 10 - e)); /* [1024, 2048] */
	if (q == 2048.0) {
		q = 1024.0;
		e++;
	}
	return sign | (uint16_t)(((e + 15) << 10) | ((int)q - 1024));
}

static float ref_round_half(float f) /* the value an fp16 cache holds */
{
	return (float)ref_half(ref_f2h(f));
}

static sl_half rand_half(rng *r)
{
	return ref_f2h(rng_unif(r));
}

/* The hardware's fp16 conversions, where the CPU has them: F16C on x86-64,
 * the __fp16 type (FCVT) on AArch64. */
#if defined(__x86_64__)
static bool cpu_has_hw_half(void)
{
	__builtin_cpu_init();
	return __builtin_cpu_supports("f16c");
}

__attribute__((target("f16c"))) static float hw_half_to_float(uint16_t h)
{
	return _cvtsh_ss(h);
}

__attribute__((target("f16c"))) static uint16_t hw_float_to_half(float f)
{
	return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}
#elif defined(__aarch64__)
static bool cpu_has_hw_half(void)
{
	return true;
}

static float hw_half_to_float(uint16_t h)
{
	__fp16 v;
	memcpy(&v, &h, sizeof v);
	return (float)v;
}

static uint16_t hw_float_to_half(float f)
{
	const __fp16 v = (__fp16)f;
	uint16_t h;
	memcpy(&h, &v, sizeof h);
	return h;
}
#else
static bool cpu_has_hw_half(void)
{
	return false;
}

static float hw_half_to_float(uint16_t h)
{
	return sl_half_to_float(h);
}

static uint16_t hw_float_to_half(float f)
{
	return sl_float_to_half(f);
}
#endif

static bool half_is_nan(uint16_t h)
{
	return (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
}

/* fp16 results agree: same bits, or both NaN with the same sign (NaN
 * payloads are not part of the contract). */
static bool half_same(uint16_t a, uint16_t b)
{
	if (half_is_nan(a) || half_is_nan(b))
		return half_is_nan(a) && half_is_nan(b) && (a & 0x8000) == (b & 0x8000);
	return a == b;
}

/* ---- fixture -------------------------------------------------------------- */

static sl_backend *be, *be_scalar; /* default; SLUICE_CPU_KERNELS=generic */
static sl_queue *qu, *qu_scalar;

static void setup(void)
{
	ck_assert_int_eq(sl_backend_create("cpu", 0, &be), 0);
	ck_assert_int_eq(be->ops->queue_create(be, &qu), 0);
	const char *old = getenv("SLUICE_CPU_KERNELS");
	char *saved = old ? strdup(old) : NULL;
	setenv("SLUICE_CPU_KERNELS", "generic", 1);
	int rc = sl_backend_create("cpu", 0, &be_scalar);
	if (saved)
		setenv("SLUICE_CPU_KERNELS", saved, 1);
	else
		unsetenv("SLUICE_CPU_KERNELS");
	free(saved);
	ck_assert_int_eq(rc, 0);
	ck_assert_int_eq(be_scalar->ops->queue_create(be_scalar, &qu_scalar), 0);
}

static void teardown(void)
{
	if (be) {
		be->ops->queue_free(be, qu);
		sl_backend_free(be);
	}
	if (be_scalar) {
		be_scalar->ops->queue_free(be_scalar, qu_scalar);
		sl_backend_free(be_scalar);
	}
	be = be_scalar = NULL;
	qu = qu_scalar = NULL;
}

/* ---- fp16 / bf16 conversion ---------------------------------------------- */

#define H2F_CHUNKS 4

/* sl_half_to_float: all 65536 patterns, in four chunks. */
START_TEST(test_half_to_float_all)
{
	const bool hw = cpu_has_hw_half();
	const uint32_t per = 65536u / H2F_CHUNKS;
	for (uint32_t u = (uint32_t)_i * per; u < (uint32_t)(_i + 1) * per; u++) {
		const sl_half h = (sl_half)u;
		const float got = sl_half_to_float(h);
		const double ref = ref_half(h);
		if (isnan(ref)) {
			/* NaN, same sign, payload kept (the quiet bit may be set) */
			FAIL_IF(!isnan(got) || (fbits(got) >> 31) != (u >> 15) ||
					((fbits(got) >> 13) & 0x1ffu) != (u & 0x1ffu) ||
					(fbits(got) & 0x1fffu),
				"half 0x%04x: got %08x, want a NaN with its payload", u, fbits(got));
		} else {
			FAIL_IF(fbits(got) != fbits((float)ref), "half 0x%04x: got %a (%08x), want %a",
				u, got, fbits(got), ref);
		}
		if (hw) {
			const float want = hw_half_to_float(h);
			if (isnan(want))
				FAIL_IF(!isnan(got) || signbit(got) != signbit(want),
					"half 0x%04x: got %08x, hardware %08x", u, fbits(got), fbits(want));
			else
				FAIL_IF(fbits(got) != fbits(want), "half 0x%04x: got %08x, hardware %08x",
					u, fbits(got), fbits(want));
		}
	}
}
END_TEST

typedef struct f2h_case {
	float x;
	uint16_t want;
	const char *what;
} f2h_case;

static const f2h_case f2h_cases[] = {
	{ 0.0f, 0x0000, "+0" },
	{ -0.0f, 0x8000, "-0" },
	{ 0x1p-24f, 0x0001, "2^-24, the smallest subnormal" },
	{ -0x1p-24f, 0x8001, "-2^-24" },
	{ 0x1p-25f, 0x0000, "2^-25, a tie: to even zero" },
	{ -0x1p-25f, 0x8000, "-2^-25" },
	{ 0x1p-25f * 1.0001f, 0x0001, "2^-25 * 1.0001" },
	{ -0x1p-25f * 1.0001f, 0x8001, "-2^-25 * 1.0001" },
	{ 0x1.fffffep-26f, 0x0000, "just below 2^-25" },
	{ 0x1p-26f, 0x0000, "2^-26" },
	{ 0x1.8p-25f, 0x0001, "0.75 * 2^-24" },
	{ 0x1p-149f, 0x0000, "the smallest float subnormal" },
	{ 0x1p-127f, 0x0000, "a float subnormal" },
	{ 0x1.8p-24f, 0x0002, "1.5 * 2^-24, a tie: to even 2" },
	{ 0x1.4p-23f, 0x0002, "2.5 * 2^-24, a tie: to even 2" },
	{ 0x1p-15f, 0x0200, "2^-15" },
	{ 0x1.ff8p-15f, 0x03ff, "the largest subnormal" },
	{ 0x1.ffcp-15f, 0x0400, "the tie below 2^-14: to even, the smallest normal" },
	{ 0x1.ffbffep-15f, 0x03ff, "just below that tie" },
	{ 0x1p-14f, 0x0400, "2^-14, the smallest normal" },
	{ 1.0f, 0x3c00, "1" },
	{ -1.0f, 0xbc00, "-1" },
	{ 0x1.002p0f, 0x3c00, "1 + 2^-11, a tie: to even 1" },
	{ 0x1.006p0f, 0x3c02, "1 + 3 * 2^-11, a tie: to even" },
	{ 0x1.002002p0f, 0x3c01, "just above a tie" },
	{ 0x1.001ffep0f, 0x3c00, "just below a tie" },
	{ 2049.0f, 0x6800, "2049, a tie: to even 2048" },
	{ 2051.0f, 0x6802, "2051, a tie: to even 2052" },
	{ 0.1f, 0x2e66, "0.1" },
	{ -0.333333343f, 0xb555, "-1/3" },
	{ 65504.0f, 0x7bff, "65504, the largest half" },
	{ -65504.0f, 0xfbff, "-65504" },
	{ 65519.99f, 0x7bff, "65519.99" },
	{ 65520.0f, 0x7c00, "65520, a tie: to even, overflows to inf" },
	{ -65520.0f, 0xfc00, "-65520" },
	{ 65536.0f, 0x7c00, "65536" },
	{ 1e10f, 0x7c00, "1e10" },
	{ FLT_MAX, 0x7c00, "FLT_MAX" },
	{ -FLT_MAX, 0xfc00, "-FLT_MAX" },
	{ INFINITY, 0x7c00, "inf" },
	{ -INFINITY, 0xfc00, "-inf" },
	{ NAN, 0x7e00, "nan" },
	{ -NAN, 0xfe00, "-nan" },
};
#define N_F2H_CASES ((int)SL_ARRAY_LEN(f2h_cases))

START_TEST(test_float_to_half_edges)
{
	const f2h_case *c = &f2h_cases[_i];
	const uint16_t got = sl_float_to_half(c->x);
	ck_assert_msg(half_same(got, c->want), "%s (%a): got 0x%04x, want 0x%04x", c->what,
		      (double)c->x, got, c->want);
	ck_assert_msg(half_same(ref_f2h(c->x), c->want), "the test's reference is wrong on %s",
		      c->what);
	if (cpu_has_hw_half())
		ck_assert_msg(half_same(hw_float_to_half(c->x), c->want),
			      "%s: hardware gives 0x%04x, the table 0x%04x", c->what,
			      hw_float_to_half(c->x), c->want);
}
END_TEST

/* Every finite half survives a round trip, and every midpoint between two
 * neighbouring halves (and the floats either side of it) rounds right. */
START_TEST(test_float_to_half_ties)
{
	const bool hw = cpu_has_hw_half();
	for (uint32_t h = 0; h < 0x7c00; h++) {
		for (uint32_t sign = 0; sign <= 0x8000; sign += 0x8000) {
			const sl_half hs = (sl_half)(h | sign);
			FAIL_IF(sl_float_to_half(sl_half_to_float(hs)) != hs, "round trip of 0x%04x",
				hs);
		}
		const double lo = ref_half((uint16_t)h);
		const double hi = h == 0x7bff ? 65536.0 : ref_half((uint16_t)(h + 1)); /* 0x7c00: inf */
		const float mid = (float)((lo + hi) / 2); /* exact in fp32 */
		const uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
		const float below = nextafterf(mid, 0.0f), above = nextafterf(mid, INFINITY);
		const struct {
			float x;
			uint16_t want;
		} t[] = { { mid, even }, { -mid, even | 0x8000 }, { below, h }, { above, h + 1 },
			  { -below, h | 0x8000 }, { -above, (h + 1) | 0x8000 } };
		for (size_t i = 0; i < SL_ARRAY_LEN(t); i++) {
			const uint16_t got = sl_float_to_half(t[i].x);
			FAIL_IF(got != t[i].want, "%a (near the tie above 0x%04x): got 0x%04x, want 0x%04x",
				(double)t[i].x, h, got, t[i].want);
			FAIL_IF(ref_f2h(t[i].x) != t[i].want, "the test's reference is wrong on %a",
				(double)t[i].x);
			if (hw)
				FAIL_IF(hw_float_to_half(t[i].x) != t[i].want,
					"%a: hardware 0x%04x, want 0x%04x", (double)t[i].x,
					hw_float_to_half(t[i].x), t[i].want);
		}
	}
}
END_TEST

#define F2H_RANDOM_CHUNKS 10
#define F2H_RANDOM_PER (1u << 20)

/* ~10M random fp32 bit patterns: even chunks over all patterns, odd chunks
 * with the exponent where fp16 results are not 0 or inf. */
START_TEST(test_float_to_half_random)
{
	const bool hw = cpu_has_hw_half();
	rng r = rng_seed(1000 + (uint64_t)_i);
	for (uint32_t i = 0; i < F2H_RANDOM_PER; i++) {
		uint32_t u = rng_u32(&r);
		if (_i & 1) /* biased exponent 100..143 */
			u = (u & 0x807fffffu) | ((100u + (u >> 23 & 0xffu) % 44u) << 23);
		const float x = bitsf(u);
		const uint16_t got = sl_float_to_half(x);
		if (hw) {
			const uint16_t want = hw_float_to_half(x);
			FAIL_IF(!half_same(got, want), "float %08x (%a): got 0x%04x, hardware 0x%04x", u,
				(double)x, got, want);
		}
		const uint16_t ref = ref_f2h(x);
		FAIL_IF(!half_same(got, ref), "float %08x (%a): got 0x%04x, reference 0x%04x", u,
			(double)x, got, ref);
	}
}
END_TEST

START_TEST(test_bf16_to_float_all)
{
	for (uint32_t u = 0; u < 65536u; u++) {
		const float got = sl_bf16_to_float((uint16_t)u);
		const int e = (u >> 7) & 0xff, m = u & 0x7f;
		double ref;
		if (e == 0)
			ref = ldexp(m, -133);
		else if (e == 255)
			ref = m ? NAN : INFINITY;
		else
			ref = ldexp(128 + m, e - 134);
		if (u & 0x8000)
			ref = -ref;
		if (isnan(ref))
			FAIL_IF(!isnan(got) || (fbits(got) >> 31) != (u >> 15) ||
					((fbits(got) >> 16) & 0x3fu) != (u & 0x3fu),
				"bf16 0x%04x: got %08x, want a NaN with its payload", u, fbits(got));
		else
			FAIL_IF(fbits(got) != fbits((float)ref), "bf16 0x%04x: got %a, want %a", u,
				(double)got, ref);
	}
}
END_TEST

/* ---- gemm ------------------------------------------------------------------ */

static const int gemm_ms[] = { 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 33, 70 };
static const int gemm_ns[] = { 1, 7, 8, 64, 257 };
static const int gemm_ks[] = { 1, 7, 8, 9, 64, 300 };
#define GEMM_NM ((int)SL_ARRAY_LEN(gemm_ms))
#define GEMM_NN ((int)SL_ARRAY_LEN(gemm_ns))
#define GEMM_NK ((int)SL_ARRAY_LEN(gemm_ks))
/* Beyond the product: several weight panels (n > the ~4 MiB panel; k so
 * large the panel is its 16-row minimum), several 2048-row blocks. */
static const int gemm_extra[][3] = { { 20, 4100, 300 }, { 17, 40, 70000 }, { 2100, 8, 16 },
				     { 16, 1000, 33 } };
/* One case: an (m, n) pair with every k (one fork per case, not per
 * shape: forks are what costs under the sanitizers), or one extra shape. */
#define GEMM_CASES (GEMM_NM * GEMM_NN + (int)SL_ARRAY_LEN(gemm_extra))
#define GEMM_VARIANTS 48 /* 2 strides x 2 bias x 3 alpha x 4 flags */

/* Shape ki of case i; false past the case's last shape. */
static bool gemm_shape(int i, int ki, int *m, int *n, int *k)
{
	const int np = GEMM_NM * GEMM_NN;
	if (i >= np) {
		*m = gemm_extra[i - np][0];
		*n = gemm_extra[i - np][1];
		*k = gemm_extra[i - np][2];
		return ki == 0;
	}
	*m = gemm_ms[i / GEMM_NN];
	*n = gemm_ns[i % GEMM_NN];
	*k = gemm_ks[ki < GEMM_NK ? ki : 0];
	return ki < GEMM_NK;
}

/* test_gemm_amx and _bf16: the reference rounds x and w to bf16 (nearest
 * even) where those paths run: k a multiple of 32 and at least
 * gemm_ref_bf16_rows rows (AMX: above the direct kernel's 8; the dot
 * products: from 5). */
static bool gemm_ref_bf16;
static int gemm_ref_bf16_rows;

static double bf16_round(double v)
{
	uint32_t u = fbits((float)v);
	u += 0x7fffu + ((u >> 16) & 1u);
	return bitsf(u & 0xffff0000u);
}

/*
 * One shape, the variants v = first, first + step, ... < 48 of
 * (stride, bias, alpha, flags).  The reference sums (S = x w^T and
 * A = |x| |w|^T, in double) are computed once; each variant applies the
 * epilogue.  Outside the [m, n] block (the ldy gaps) y must keep its poison;
 * the ldx gaps of x hold NaN, so reading them would show.
 */
static void gemm_check(sl_backend *b, sl_queue *q, int m, int n, int k, uint64_t seed, int first,
		       int step)
{
	rng r = rng_seed(seed);
	const int ldx_w = k + 5, ldy_w = n + 3;
	float *x = xmalloc(sizeof(float) * (size_t)m * k);
	float *xw = xmalloc(sizeof(float) * (size_t)m * ldx_w);
	sl_half *w = xmalloc(sizeof(sl_half) * (size_t)n * k);
	sl_half *bias = xmalloc(sizeof(sl_half) * (size_t)n);
	double *S = xmalloc(sizeof(double) * (size_t)m * n);
	double *A = xmalloc(sizeof(double) * (size_t)m * n);
	float *y0 = xmalloc(sizeof(float) * (size_t)m * n);
	float *y = xmalloc(sizeof(float) * (size_t)m * ldy_w);
	double *wd = xmalloc(sizeof(double) * (size_t)k);
	for (int i = 0; i < m; i++)
		for (int j = 0; j < ldx_w; j++) {
			float v = j < k ? rng_unif(&r) : bitsf(POISON_F32);
			xw[(size_t)i * ldx_w + j] = v;
			if (j < k)
				x[(size_t)i * k + j] = v;
		}
	for (size_t i = 0; i < (size_t)n * k; i++)
		w[i] = rand_half(&r);
	for (int j = 0; j < n; j++)
		bias[j] = rand_half(&r);
	for (size_t i = 0; i < (size_t)m * n; i++)
		y0[i] = rng_unif(&r);
	const bool rb = gemm_ref_bf16 && m >= gemm_ref_bf16_rows && k % 32 == 0;
	for (int j = 0; j < n; j++) {
		for (int kk = 0; kk < k; kk++)
			wd[kk] = rb ? bf16_round(ref_half(w[(size_t)j * k + kk])) : ref_half(w[(size_t)j * k + kk]);
		for (int i = 0; i < m; i++) {
			const float *xr = x + (size_t)i * k;
			double s = 0, a = 0;
			for (int kk = 0; kk < k; kk++) {
				const double xv = rb ? bf16_round(xr[kk]) : xr[kk];
				s += xv * wd[kk];
				a += fabs(xv * wd[kk]);
			}
			S[(size_t)i * n + j] = s;
			A[(size_t)i * n + j] = a;
		}
	}
	static const float alphas[] = { 0.0f, 1.0f, 0.125f };
	for (int v = first; v < GEMM_VARIANTS; v += step) {
		const bool wide = v & 1, use_bias = (v >> 1) & 1;
		const float alpha = alphas[(v >> 2) % 3];
		const unsigned flags = (unsigned)(v / 12); /* RELU = 1, ACCUM = 2 */
		const int ldx = wide ? ldx_w : k, ldy = wide ? ldy_w : n;
		for (int i = 0; i < m; i++)
			for (int j = 0; j < ldy; j++)
				y[(size_t)i * ldy + j] = (j < n && (flags & SL_GEMM_ACCUM))
								 ? y0[(size_t)i * n + j]
								 : bitsf(POISON_F32);
		sl_gemm_args a = { .m = m, .n = n, .k = k, .x = wide ? xw : x, .ldx = ldx, .w = w,
				   .bias = use_bias ? bias : NULL, .y = y, .ldy = ldy,
				   .alpha = alpha, .flags = flags };
		int rc = sl_gemm(b, q, &a);
		ck_assert_msg(rc == 0, "gemm m=%d n=%d k=%d: rc %d (%s)", m, n, k, rc, sl_errmsg());
		const double al = alpha == 0.0f ? 1.0 : alpha;
		for (int i = 0; i < m; i++)
			for (int j = 0; j < ldy; j++) {
				const float got = y[(size_t)i * ldy + j];
				if (j >= n) {
					FAIL_IF(fbits(got) != POISON_F32,
						"gemm m=%d n=%d k=%d ldy=%d: y[%d][%d] past n was written",
						m, n, k, ldy, i, j);
					continue;
				}
				const double bj = use_bias ? ref_half(bias[j]) : 0.0;
				double want = (S[(size_t)i * n + j] + bj) * al;
				if ((flags & SL_GEMM_RELU) && !(want > 0))
					want = 0;
				const double old = (flags & SL_GEMM_ACCUM) ? y0[(size_t)i * n + j] : 0.0;
				want += old;
				const double tol =
					1e-5 * (fabs(al) * (A[(size_t)i * n + j] + fabs(bj)) + fabs(old));
				FAIL_IF(!(fabs(got - want) <= tol),
					"gemm m=%d n=%d k=%d ldx=%d ldy=%d bias=%d alpha=%g flags=%u: "
					"y[%d][%d] = %.9g, want %.9g (tol %.3g)",
					m, n, k, ldx, ldy, use_bias, (double)alpha, flags, i, j,
					(double)got, want, tol);
			}
	}
	free(x);
	free(xw);
	free(w);
	free(bias);
	free(S);
	free(A);
	free(y0);
	free(y);
	free(wd);
}

/* SL_OPS_STRIDE=N: test_gemm checks a rotating Nth of the 48 variants of
 * each shape (tools/test.sh, under qemu-user, where all would take long);
 * default all. */
static int gemm_stride(void)
{
	const char *e = getenv("SL_OPS_STRIDE");
	const int s = e ? atoi(e) : 1;
	return s >= 1 && s <= GEMM_VARIANTS ? s : 1;
}

START_TEST(test_gemm)
{
	int m, n, k;
	const int step = gemm_stride();
	for (int ki = 0; gemm_shape(_i, ki, &m, &n, &k); ki++)
		gemm_check(be, qu, m, n, k, 2000 + 8 * (uint64_t)_i + (uint64_t)ki,
			   (_i + ki) % step, step);
}
END_TEST

#if defined(__x86_64__)
/* The portable (no SIMD) paths: a rotating seventh of the variants. */
START_TEST(test_gemm_scalar)
{
	int m, n, k;
	for (int ki = 0; gemm_shape(_i, ki, &m, &n, &k); ki++)
		gemm_check(be_scalar, qu_scalar, m, n, k, 2000 + 8 * (uint64_t)_i + (uint64_t)ki,
			   (_i + ki) % 7, 7);
}
END_TEST
#endif

/*
 * Batch invariance: an output row's bits depend on its x row and the
 * weights only.  For each shape, the rows of an m_max-row product (default
 * backend) are the reference; the same rows within every m of the list
 * (so both paths, every tile remainder and, for m > 480, two row blocks),
 * each row alone (m = 1), every instruction set the CPU has and 1, 2 and 3
 * threads must give them bit for bit.  Shapes: k tails (k % 8), column
 * tails (n % 8), several weight panels (n = 300 at k = 2048), k in chunks
 * (k > 768), with bias, alpha, ReLU and accumulation.
 */
typedef struct gemm_inv_case {
	int n, k, m_max;
} gemm_inv_case;

static const gemm_inv_case gemm_inv_cases[] = {
	{ 8, 8, 40 },	{ 37, 300, 100 }, { 300, 2048, 40 },
	{ 12, 4104, 40 }, { 12, 40, 500 },	{ 19, 77, 23 },
};
static const int gemm_inv_ms[] = { 1, 2, 3, 4, 5, 6, 7, 11, 16, 17, 18, 23, 40, 97, 100, 481, 500 };
static const char *const gemm_inv_isas[] = { "generic", "avx2", "avx512" };

static sl_backend *backend_with(const char *isa, int threads)
{
	const char *old = getenv("SLUICE_CPU_KERNELS");
	char *saved = old ? strdup(old) : NULL;
	if (isa)
		setenv("SLUICE_CPU_KERNELS", isa, 1);
	sl_backend *b = NULL;
	const int rc = sl_backend_create("cpu", threads, &b);
	if (saved)
		setenv("SLUICE_CPU_KERNELS", saved, 1);
	else
		unsetenv("SLUICE_CPU_KERNELS");
	free(saved);
	ck_assert_msg(rc == 0, "cpu backend (%s, %d threads): %s", isa ? isa : "default", threads,
		      sl_errmsg());
	return b;
}

/* rows [r0, r0 + m) of x through b into y (ldy), the variant's epilogue
 * over y0 */
static void gemm_rows(sl_backend *b, const float *x, int ldx, const sl_half *w,
		      const sl_half *bias, int r0, int m, int n, int k, int variant, const float *y0,
		      float *y, int ldy)
{
	const unsigned flags = variant ? SL_GEMM_RELU | SL_GEMM_ACCUM : 0;
	for (int i = 0; i < m; i++)
		for (int j = 0; j < ldy; j++)
			y[(size_t)i * ldy + j] = j < n && (flags & SL_GEMM_ACCUM)
							 ? y0[(size_t)(r0 + i) * n + j]
							 : bitsf(POISON_F32);
	sl_gemm_args a = { .m = m, .n = n, .k = k, .x = x + (size_t)r0 * ldx, .ldx = ldx, .w = w,
			   .bias = variant ? NULL : bias, .y = y, .ldy = ldy,
			   .alpha = variant ? 1.0f : 0.125f, .flags = flags };
	ck_assert_msg(sl_gemm(b, NULL, &a) == 0, "gemm m=%d n=%d k=%d: %s", m, n, k, sl_errmsg());
}

START_TEST(test_gemm_rows_bit_identical)
{
	const gemm_inv_case *c = &gemm_inv_cases[_i];
	const int n = c->n, k = c->k, mx = c->m_max, ldx = k + 3, ldy = n + 5;
	rng r = rng_seed(3000 + (uint64_t)_i);
	float *x = xmalloc(sizeof(float) * (size_t)mx * ldx);
	sl_half *w = xmalloc(sizeof(sl_half) * (size_t)n * k);
	sl_half *bias = xmalloc(sizeof(sl_half) * (size_t)n);
	float *y0 = xmalloc(sizeof(float) * (size_t)mx * n);
	float *ref = xmalloc(sizeof(float) * (size_t)mx * ldy);
	float *y = xmalloc(sizeof(float) * (size_t)mx * ldy);
	for (size_t i = 0; i < (size_t)mx * ldx; i++)
		x[i] = (int)(i % (size_t)ldx) < k ? rng_unif(&r) : bitsf(POISON_F32);
	for (size_t i = 0; i < (size_t)n * k; i++)
		w[i] = rand_half(&r);
	for (int j = 0; j < n; j++)
		bias[j] = rand_half(&r);
	for (size_t i = 0; i < (size_t)mx * n; i++)
		y0[i] = rng_unif(&r);
	sl_backend *def = backend_with(NULL, 0);
	sl_backend *others[SL_ARRAY_LEN(gemm_inv_isas) + 2];
	int nb = 0;
	for (size_t i = 0; i < SL_ARRAY_LEN(gemm_inv_isas); i++)
		others[nb++] = backend_with(gemm_inv_isas[i], 0);
	others[nb++] = backend_with(NULL, 1);
	others[nb++] = backend_with(NULL, 3);
	for (int variant = 0; variant < 2; variant++) {
		gemm_rows(def, x, ldx, w, bias, 0, mx, n, k, variant, y0, ref, ldy);
		for (size_t mi = 0; mi < SL_ARRAY_LEN(gemm_inv_ms); mi++) {
			const int m = gemm_inv_ms[mi];
			if (m > mx)
				break;
			for (int bi = -1; bi < nb; bi++) {
				/* every backend at the largest m and m = 1, the
				 * default one at every m */
				if (bi >= 0 && m != mx && m != 1)
					continue;
				sl_backend *b = bi < 0 ? def : others[bi];
				/* the last m rows, so that rows sit at other
				 * places in their tiles than in the reference */
				const int r0 = mx - m;
				gemm_rows(b, x, ldx, w, bias, r0, m, n, k, variant, y0, y, ldy);
				for (int i = 0; i < m; i++)
					FAIL_IF(memcmp(y + (size_t)i * ldy, ref + (size_t)(r0 + i) * ldy,
						       sizeof(float) * (size_t)n) != 0,
						"gemm n=%d k=%d variant %d: row %d computed among %d rows "
						"(backend %d) differs from it among %d rows",
						n, k, variant, r0 + i, m, bi, mx);
				for (int i = 0; i < m; i++)
					for (int j = n; j < ldy; j++)
						FAIL_IF(fbits(y[(size_t)i * ldy + j]) != POISON_F32,
							"gemm n=%d k=%d m=%d: y[%d][%d] past n written", n,
							k, m, i, j);
			}
		}
	}
	sl_backend_free(def);
	for (int i = 0; i < nb; i++)
		sl_backend_free(others[i]);
	free(x);
	free(w);
	free(bias);
	free(y0);
	free(ref);
	free(y);
}
END_TEST

/* Bad shapes fail with SL_EINVAL; empty ones do nothing. */
typedef struct gemm_arg_case {
	int m, n, k, ldx, ldy, rc;
} gemm_arg_case;

static const gemm_arg_case gemm_arg_cases[] = {
	{ 2, 3, 4, 3, 3, SL_EINVAL },  /* ldx < k */
	{ 2, 3, 4, 4, 2, SL_EINVAL },  /* ldy < n */
	{ -1, 3, 4, 4, 3, SL_EINVAL }, /* m < 0 */
	{ 2, -1, 4, 4, 3, SL_EINVAL }, /* n < 0 */
	{ 2, 3, -1, 4, 3, SL_EINVAL }, /* k < 0 */
	{ 0, 3, 4, 4, 3, 0 },          /* m = 0: nothing */
	{ 2, 0, 4, 4, 3, 0 },          /* n = 0: nothing */
	{ 40, 0, 4, 4, 3, 0 },         /* n = 0 on the packed path */
};
/* k = 0 is an empty sum: y = act(alpha * bias), on both paths (m = 2 takes
 * the small-m kernel, m = 17 the packed path, which once divided by k). */
START_TEST(test_gemm_k0)
{
	const int ms[2] = { 2, 17 };
	float x[1] = { 0 }, y[17 * 3];
	sl_half w[1] = { 0 }, bias[3] = { 0x3c00, 0x4000, 0xbc00 }; /* 1, 2, -1 */
	for (int i = 0; i < 2; i++) {
		sl_gemm_args a = { .m = ms[i], .n = 3, .k = 0, .x = x, .ldx = 0, .w = w, .bias = bias,
				   .y = y, .ldy = 3, .alpha = 0.5f, .flags = SL_GEMM_RELU };
		ck_assert_int_eq(sl_gemm(be, qu, &a), 0);
		for (int r = 0; r < ms[i]; r++) {
			ck_assert(y[r * 3 + 0] == 0.5f);
			ck_assert(y[r * 3 + 1] == 1.0f);
			ck_assert(y[r * 3 + 2] == 0.0f);
		}
	}
}
END_TEST

START_TEST(test_gemm_args)
{
	const gemm_arg_case *c = &gemm_arg_cases[_i];
	float x[64], y[64];
	sl_half w[64];
	for (int i = 0; i < 64; i++) {
		x[i] = 1.0f;
		w[i] = 0x3c00;
		y[i] = bitsf(POISON_F32);
	}
	sl_gemm_args a = { .m = c->m, .n = c->n, .k = c->k, .x = x, .ldx = c->ldx, .w = w,
			   .y = y, .ldy = c->ldy };
	int rc = sl_gemm(be, qu, &a);
	ck_assert_int_eq(rc, c->rc);
	for (int i = 0; i < 64; i++)
		ck_assert_msg(fbits(y[i]) == POISON_F32, "y[%d] written by a call that does nothing", i);
}
END_TEST

/* ---- gemm with 4-bit weights (wq, common/sl_q4.h) ------------------------- */

/*
 * The reference: the weights quantised by sl_q4_quantize_matrix and
 * dequantised by sl_q4_dequantize_matrix (the scalar definition, held to
 * the numpy reference in test_q4), then a naive GEMM in double.  Each
 * (n, k) case runs every m of q4_ms through the default backend (both
 * paths: m <= 8 direct, larger packed, m = 481 two row blocks) with a
 * rotating epilogue variant; then, at the largest m and at m = 1, every
 * instruction set, 1 and 3 threads and row subsets must give the default
 * backend's bits (the fp16 GEMM's batch invariance, kept), and OpenBLAS's
 * path (where built) the reference within the tolerance.
 */
typedef struct gemm_q4_case {
	int n, k, m_max;
} gemm_q4_case;

static const gemm_q4_case gemm_q4_cases[] = {
	{ 1, 1, 9 },	{ 7, 7, 17 },	{ 8, 64, 33 },	   { 64, 100, 100 }, { 130, 63, 40 },
	{ 37, 192, 481 }, { 257, 300, 40 }, { 16, 1000, 17 }, { 300, 2048, 9 }, { 12, 4104, 40 },
};
static const int gemm_q4_ms[] = { 1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33, 40, 100, 481 };

static void gemm_q4_run(sl_backend *b, const float *x, int ldx, const void *wq,
			const sl_half *bias, int r0, int m, int n, int k, int v, const float *y0,
			float *y, int ldy)
{
	static const float alphas[] = { 0.0f, 1.0f, 0.125f };
	const unsigned flags = (unsigned)(v % 4);
	for (int i = 0; i < m; i++)
		for (int j = 0; j < ldy; j++)
			y[(size_t)i * ldy + j] = j < n && (flags & SL_GEMM_ACCUM)
							 ? y0[(size_t)(r0 + i) * n + j]
							 : bitsf(POISON_F32);
	sl_gemm_args a = { .m = m, .n = n, .k = k, .x = x + (size_t)r0 * ldx, .ldx = ldx,
			   .wq = wq, .bias = (v / 4) % 2 ? bias : NULL, .y = y, .ldy = ldy,
			   .alpha = alphas[v % 3], .flags = flags };
	ck_assert_msg(sl_gemm(b, NULL, &a) == 0, "q4 gemm m=%d n=%d k=%d: %s", m, n, k, sl_errmsg());
}

static void gemm_q4_expect(const char *what, const double *S, const double *A, const sl_half *bias,
			   const float *y0, const float *y, int r0, int m, int n, int k, int ldy,
			   int v)
{
	static const float alphas[] = { 0.0f, 1.0f, 0.125f };
	const unsigned flags = (unsigned)(v % 4);
	const double al = alphas[v % 3] == 0.0f ? 1.0 : alphas[v % 3];
	const bool use_bias = (v / 4) % 2;
	for (int i = 0; i < m; i++)
		for (int j = 0; j < ldy; j++) {
			const float got = y[(size_t)i * ldy + j];
			if (j >= n) {
				FAIL_IF(fbits(got) != POISON_F32, "q4 gemm %s m=%d n=%d k=%d: y[%d][%d] past n written",
					what, m, n, k, i, j);
				continue;
			}
			const size_t o = (size_t)(r0 + i) * n + j;
			const double bj = use_bias ? ref_half(bias[j]) : 0.0;
			double want = (S[o] + bj) * al;
			if ((flags & SL_GEMM_RELU) && !(want > 0))
				want = 0;
			const double old = (flags & SL_GEMM_ACCUM) ? y0[o] : 0.0;
			want += old;
			const double tol = 1e-5 * (fabs(al) * (A[o] + fabs(bj)) + fabs(old)) + 1e-30;
			FAIL_IF(!(fabs(got - want) <= tol),
				"q4 gemm %s m=%d n=%d k=%d variant %d: y[%d][%d] = %.9g, want %.9g (tol %.3g)",
				what, m, n, k, v, r0 + i, j, (double)got, want, tol);
		}
}

START_TEST(test_gemm_q4)
{
	const gemm_q4_case *c = &gemm_q4_cases[_i];
	const int n = c->n, k = c->k, mx = c->m_max, ldx = k + 3, ldy = n + 5;
	rng r = rng_seed(5000 + (uint64_t)_i);
	float *x = xmalloc(sizeof(float) * (size_t)mx * ldx);
	sl_half *w = xmalloc(sizeof(sl_half) * (size_t)n * k);
	void *wq = xmalloc(sl_q4_bytes((size_t)n, (size_t)k));
	float *wd = xmalloc(sizeof(float) * (size_t)n * k);
	sl_half *bias = xmalloc(sizeof(sl_half) * (size_t)n);
	float *y0 = xmalloc(sizeof(float) * (size_t)mx * n);
	double *S = xmalloc(sizeof(double) * (size_t)mx * n);
	double *A = xmalloc(sizeof(double) * (size_t)mx * n);
	float *ref = xmalloc(sizeof(float) * (size_t)mx * ldy);
	float *y = xmalloc(sizeof(float) * (size_t)mx * ldy);
	for (size_t i = 0; i < (size_t)mx * ldx; i++)
		x[i] = (int)(i % (size_t)ldx) < k ? rng_unif(&r) : bitsf(POISON_F32);
	/* weights of a trained layer's scale, each row with its own offset;
	 * row 0's first group constant (scale 0) */
	for (int j = 0; j < n; j++) {
		const float off = 0.02f * rng_unif(&r), sc = 0.05f * (1.0f + rng_unif(&r));
		for (int kk = 0; kk < k; kk++)
			w[(size_t)j * k + kk] =
				ref_f2h(j == 0 && kk < SL_Q4_GROUP ? 0.25f : off + sc * rng_unif(&r));
	}
	for (int j = 0; j < n; j++)
		bias[j] = rand_half(&r);
	for (size_t i = 0; i < (size_t)mx * n; i++)
		y0[i] = rng_unif(&r);
	sl_q4_quantize_matrix(w, (size_t)n, (size_t)k, wq);
	sl_q4_dequantize_matrix(wq, (size_t)n, (size_t)k, wd);
	for (int i = 0; i < mx; i++)
		for (int j = 0; j < n; j++) {
			double s = 0, a = 0;
			for (int kk = 0; kk < k; kk++) {
				const double p = (double)x[(size_t)i * ldx + kk] * wd[(size_t)j * k + kk];
				s += p;
				a += fabs(p);
			}
			S[(size_t)i * n + j] = s;
			A[(size_t)i * n + j] = a;
		}
	sl_backend *def = backend_with(NULL, 0);
	/* every m on the default backend, its last m rows, against the reference */
	for (size_t mi = 0; mi < SL_ARRAY_LEN(gemm_q4_ms) && gemm_q4_ms[mi] <= mx; mi++) {
		const int m = gemm_q4_ms[mi], r0 = mx - m, v = (int)(mi + (size_t)_i) % 24;
		gemm_q4_run(def, x, ldx, wq, bias, r0, m, n, k, v, y0, y, ldy);
		gemm_q4_expect("default", S, A, bias, y0, y, r0, m, n, k, ldy, v);
	}
	/* bit for bit: every ISA and thread count, at m_max and each row alone */
	sl_backend *others[SL_ARRAY_LEN(gemm_inv_isas) + 2];
	int nb = 0;
	for (size_t i = 0; i < SL_ARRAY_LEN(gemm_inv_isas); i++)
		others[nb++] = backend_with(gemm_inv_isas[i], 0);
	others[nb++] = backend_with(NULL, 1);
	others[nb++] = backend_with(NULL, 3);
	for (int v = 0; v < 24; v += 13) {
		gemm_q4_run(def, x, ldx, wq, bias, 0, mx, n, k, v, y0, ref, ldy);
		gemm_q4_expect("default", S, A, bias, y0, ref, 0, mx, n, k, ldy, v);
		for (int bi = -1; bi < nb; bi++) {
			sl_backend *b = bi < 0 ? def : others[bi];
			const int sub[3] = { mx, 3, 1 }; /* all rows, the last 3, the last alone */
			for (int si = 0; si < 3; si++) {
				const int m = sub[si], r0 = mx - m;
				if (m > mx || (si > 0 && m == sub[si - 1]))
					continue;
				gemm_q4_run(b, x, ldx, wq, bias, r0, m, n, k, v, y0, y, ldy);
				for (int i = 0; i < m; i++)
					FAIL_IF(memcmp(y + (size_t)i * ldy, ref + (size_t)(r0 + i) * ldy,
						       sizeof(float) * (size_t)n) != 0,
						"q4 gemm n=%d k=%d variant %d: row %d among %d rows (backend %d) "
						"differs from it among %d rows",
						n, k, v, r0 + i, m, bi, mx);
			}
		}
	}
#if defined(SL_HAVE_OPENBLAS) && SL_HAVE_OPENBLAS
	sl_backend *ob = backend_with(NULL, 0);
	ck_assert_int_eq(sl_cpu_backend_set_gemm(ob, "openblas"), 0);
	gemm_q4_run(ob, x, ldx, wq, bias, 0, mx, n, k, 7, y0, y, ldy);
	gemm_q4_expect("openblas", S, A, bias, y0, y, 0, mx, n, k, ldy, 7);
	sl_backend_free(ob);
#endif
	sl_backend_free(def);
	for (int i = 0; i < nb; i++)
		sl_backend_free(others[i]);
	free(x);
	free(w);
	free(wq);
	free(wd);
	free(bias);
	free(y0);
	free(S);
	free(A);
	free(ref);
	free(y);
}
END_TEST

/* w and wq together are refused; neither, with k > 0, too. */
START_TEST(test_gemm_q4_args)
{
	float x[64] = { 0 }, y[64];
	sl_half w[64] = { 0 };
	uint8_t wq[36] = { 0 };
	sl_gemm_args a = { .m = 1, .n = 1, .k = 64, .x = x, .ldx = 64, .w = w, .wq = wq, .y = y,
			   .ldy = 1 };
	ck_assert_int_eq(sl_gemm(be, qu, &a), SL_EINVAL);
	ck_assert_msg(strstr(sl_errmsg(), "both fp16 (w) and 4-bit (wq)"), "message: %s", sl_errmsg());
	a.w = NULL;
	a.wq = NULL;
	ck_assert_int_eq(sl_gemm(be, qu, &a), SL_EINVAL);
	a.wq = wq; /* one constant group of 0: y = 0 */
	y[0] = 1.0f;
	ck_assert_int_eq(sl_gemm(be, qu, &a), 0);
	ck_assert(y[0] == 0.0f);
}
END_TEST

/* ---- layernorm ---------------------------------------------------------- */

static const int ln_rows[] = { 1, 3, 17 };
static const int ln_ns[] = { 1, 5, 64, 1000 };
#define LN_CASES ((int)(SL_ARRAY_LEN(ln_rows) * SL_ARRAY_LEN(ln_ns)) * 2)

START_TEST(test_layernorm)
{
	const int rows = ln_rows[_i / 8], n = ln_ns[_i / 2 % 4];
	const bool inplace = _i & 1;
	const int ldx = n + 3, ldy = inplace ? ldx : n + 7;
	const float eps = 1e-5f;
	rng r = rng_seed(4000 + (uint64_t)_i);
	float *x = xmalloc(sizeof(float) * (size_t)rows * ldx);
	float *x0 = xmalloc(sizeof(float) * (size_t)rows * ldx);
	float *ybuf = inplace ? x : xmalloc(sizeof(float) * (size_t)rows * ldy);
	sl_half *gamma = xmalloc(sizeof(sl_half) * (size_t)n);
	sl_half *beta = xmalloc(sizeof(sl_half) * (size_t)n);
	for (size_t i = 0; i < (size_t)rows * ldx; i++)
		x[i] = (int)(i % (size_t)ldx) < n ? rng_unif(&r) : bitsf(POISON_F32);
	memcpy(x0, x, sizeof(float) * (size_t)rows * ldx);
	if (!inplace)
		for (size_t i = 0; i < (size_t)rows * ldy; i++)
			ybuf[i] = bitsf(POISON_F32);
	for (int i = 0; i < n; i++) {
		gamma[i] = ref_f2h(1.0f + 0.5f * rng_unif(&r));
		beta[i] = rand_half(&r);
	}
	int rc = be->ops->layernorm(be, qu, rows, n, x, ldx, gamma, beta, eps, ybuf, ldy);
	ck_assert_int_eq(rc, 0);
	for (int i = 0; i < rows; i++) {
		const float *xr = x0 + (size_t)i * ldx;
		double mean = 0, var = 0;
		for (int j = 0; j < n; j++)
			mean += xr[j];
		mean /= n;
		for (int j = 0; j < n; j++)
			var += ((double)xr[j] - mean) * ((double)xr[j] - mean);
		var /= n;
		const double rstd = 1.0 / sqrt(var + (double)eps);
		for (int j = 0; j < ldy; j++) {
			const float got = ybuf[(size_t)i * ldy + j];
			if (j >= n) {
				FAIL_IF(fbits(got) != POISON_F32,
					"layernorm rows=%d n=%d: gap y[%d][%d] written", rows, n, i, j);
				continue;
			}
			const double g = ref_half(gamma[j]), bt = ref_half(beta[j]);
			const double want = (xr[j] - mean) * rstd * g + bt;
			const double tol = 1e-5 * ((fabs(xr[j]) + fabs(mean)) * rstd * fabs(g) + fabs(bt));
			FAIL_IF(!(fabs(got - want) <= tol),
				"layernorm rows=%d n=%d inplace=%d: y[%d][%d] = %.9g, want %.9g", rows,
				n, inplace, i, j, (double)got, want);
		}
	}
	if (!inplace) /* x is const */
		ck_assert_msg(memcmp(x, x0, sizeof(float) * (size_t)rows * ldx) == 0,
			      "layernorm wrote to its input");
	if (!inplace)
		free(ybuf);
	free(x);
	free(x0);
	free(gamma);
	free(beta);
}
END_TEST

/* ---- rmsnorm ------------------------------------------------------------ */

static const int rms_rows[] = { 1, 3, 17 };
static const int rms_ns[] = { 1, 5, 64, 1000 };
#define RMS_CASES ((int)(SL_ARRAY_LEN(rms_rows) * SL_ARRAY_LEN(rms_ns)) * 2)

/* y = x / sqrt(mean(x^2) + eps) * gamma against an fp64 reference; rows with
 * an offset and a scale (the mean of squares must not be the variance),
 * strides, in place, and the gaps between rows left alone */
START_TEST(test_rmsnorm)
{
	const int rows = rms_rows[_i / 8], n = rms_ns[_i / 2 % 4];
	const bool inplace = _i & 1;
	const int ldx = n + 3, ldy = inplace ? ldx : n + 7;
	const float eps = 1e-6f;
	rng r = rng_seed(4500 + (uint64_t)_i);
	float *x = xmalloc(sizeof(float) * (size_t)rows * ldx);
	float *x0 = xmalloc(sizeof(float) * (size_t)rows * ldx);
	float *ybuf = inplace ? x : xmalloc(sizeof(float) * (size_t)rows * ldy);
	sl_half *gamma = xmalloc(sizeof(sl_half) * (size_t)n);
	for (size_t i = 0; i < (size_t)rows * ldx; i++)
		x[i] = (int)(i % (size_t)ldx) < n ? 2.0f + 3.0f * rng_unif(&r) : bitsf(POISON_F32);
	memcpy(x0, x, sizeof(float) * (size_t)rows * ldx);
	if (!inplace)
		for (size_t i = 0; i < (size_t)rows * ldy; i++)
			ybuf[i] = bitsf(POISON_F32);
	for (int i = 0; i < n; i++)
		gamma[i] = ref_f2h(1.0f + 0.5f * rng_unif(&r));
	ck_assert_int_eq(be->ops->rmsnorm(be, qu, rows, n, x, ldx, gamma, eps, ybuf, ldy), 0);
	for (int i = 0; i < rows; i++) {
		const float *xr = x0 + (size_t)i * ldx;
		double ms = 0;
		for (int j = 0; j < n; j++)
			ms += (double)xr[j] * xr[j];
		ms /= n;
		const double rstd = 1.0 / sqrt(ms + (double)eps);
		for (int j = 0; j < ldy; j++) {
			const float got = ybuf[(size_t)i * ldy + j];
			if (j >= n) {
				FAIL_IF(fbits(got) != POISON_F32,
					"rmsnorm rows=%d n=%d: gap y[%d][%d] written", rows, n, i, j);
				continue;
			}
			const double g = ref_half(gamma[j]);
			const double want = xr[j] * rstd * g;
			const double tol = 1e-6 * fabs(want) + 1e-30;
			FAIL_IF(!(fabs(got - want) <= tol),
				"rmsnorm rows=%d n=%d inplace=%d: y[%d][%d] = %.9g, want %.9g", rows, n,
				inplace, i, j, (double)got, want);
		}
	}
	if (!inplace) { /* x is const */
		ck_assert_msg(memcmp(x, x0, sizeof(float) * (size_t)rows * ldx) == 0,
			      "rmsnorm wrote to its input");
		free(ybuf);
	}
	free(x);
	free(x0);
	free(gamma);
}
END_TEST

/* ---- rope --------------------------------------------------------------- */

typedef struct rope_case {
	int rows, hd, nh_q, nh_k;
	int qpad, kpad; /* extra floats at the end of each q / k row */
	bool no_k;
	int maxpos;     /* positions drawn from [0, maxpos) */
	sl_rope_type type;
} rope_case;

static const rope_case rope_cases[] = {
	{ 1, 2, 1, 1, 0, 0, false, 4, SL_ROPE_DEFAULT },
	{ 5, 8, 4, 2, 3, 1, false, 20, SL_ROPE_DEFAULT },     /* GQA */
	{ 7, 64, 8, 1, 0, 5, false, 2048, SL_ROPE_LINEAR },   /* one KV head */
	{ 33, 128, 4, 4, 0, 0, false, 131072, SL_ROPE_LLAMA3 },
	{ 3, 128, 2, 0, 2, 0, true, 100, SL_ROPE_DEFAULT },   /* q only */
	{ 2, 512, 1, 1, 0, 0, false, 9000, SL_ROPE_LLAMA3 },  /* the widest head */
	{ 600, 16, 2, 1, 1, 1, false, 4096, SL_ROPE_DEFAULT },/* over a CUDA launch's rows */
};

/*
 * The rotation against an fp64 reference of the specification (backend.h):
 * the angle is the fp32 product of position and inverse frequency (the one
 * rounding the specification names), its cos and sin and the rotation in
 * double.  Positions are random, repeated and out of order (left padding,
 * H2O's kept tokens); q and k have their own head counts and strides, and
 * the padding at the end of each row stays poisoned.
 */
START_TEST(test_rope)
{
	const rope_case *c = &rope_cases[_i];
	const int half = c->hd / 2;
	const int ldq = c->nh_q * c->hd + c->qpad, ldk = c->nh_k * c->hd + c->kpad;
	rng r = rng_seed(4700 + (uint64_t)_i);
	const size_t nq = (size_t)c->rows * ldq, nk = (size_t)c->rows * ldk;
	float *q = xmalloc(sizeof(float) * nq), *q0 = xmalloc(sizeof(float) * nq);
	float *k = xmalloc(sizeof(float) * (nk ? nk : 1)), *k0 = xmalloc(sizeof(float) * (nk ? nk : 1));
	int32_t *pos = xmalloc(sizeof(int32_t) * (size_t)c->rows);
	float *inv = xmalloc(sizeof(float) * (size_t)half);
	for (size_t i = 0; i < nq; i++)
		q[i] = (int)(i % (size_t)ldq) < c->nh_q * c->hd ? rng_unif(&r) : bitsf(POISON_F32);
	for (size_t i = 0; i < nk; i++)
		k[i] = (int)(i % (size_t)ldk) < c->nh_k * c->hd ? rng_unif(&r) : bitsf(POISON_F32);
	memcpy(q0, q, sizeof(float) * nq);
	memcpy(k0, k, sizeof(float) * nk);
	for (int i = 0; i < c->rows; i++)
		pos[i] = i > 0 && rng_int(&r, 4) == 0 ? pos[i - 1] : rng_int(&r, c->maxpos);
	const sl_rope_scaling sc = { c->type, 8.0, 1.0, 4.0, 8192 };
	ck_assert_int_eq(sl_rope_inv_freq(c->hd, 500000.0, &sc, inv), 0);
	const sl_rope_args a = {
		.rows = c->rows, .hd = c->hd, .nh_q = c->nh_q, .nh_k = c->nh_k,
		.q = q, .ldq = ldq, .k = c->no_k ? NULL : k, .ldk = ldk,
		.pos = pos, .inv_freq = inv,
	};
	ck_assert_msg(be->ops->rope(be, qu, &a) == 0, "rope: %s", sl_errmsg());
	for (int side = 0; side < 2; side++) {
		const int nh = side ? c->nh_k : c->nh_q, ld = side ? ldk : ldq;
		const float *x0 = side ? k0 : q0, *got = side ? k : q;
		for (int i = 0; i < c->rows; i++)
			for (int j = 0; j < ld; j++) {
				const size_t at = (size_t)i * ld + j;
				if (j >= nh * c->hd || (side && c->no_k)) {
					FAIL_IF(fbits(got[at]) != fbits(x0[at]),
						"rope case %d: %s[%d][%d] written", _i, side ? "k" : "q",
						i, j);
					continue;
				}
				const int h = j / c->hd, d = j % c->hd, f = d % half;
				const float *row = x0 + (size_t)i * ld + (size_t)h * c->hd;
				const double ang = (double)((float)pos[i] * inv[f]);
				const double cs = cos(ang), sn = sin(ang);
				const double want = d < half ? row[d] * cs - (double)row[d + half] * sn
							     : row[d] * cs + (double)row[d - half] * sn;
				const double tol = 1e-6 * (fabs(row[f]) + fabs(row[f + half])) + 1e-30;
				FAIL_IF(!(fabs(got[at] - want) <= tol),
					"rope case %d: %s[%d][%d] (pos %d) = %.9g, want %.9g", _i,
					side ? "k" : "q", i, j, pos[i], (double)got[at], want);
			}
	}
	free(q);
	free(q0);
	free(k);
	free(k0);
	free(pos);
	free(inv);
}
END_TEST

/* Bad shapes are refused with a message, and nothing is written. */
START_TEST(test_rope_bad_args)
{
	float q[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
	const float inv[4] = { 1, 0.5f, 0.25f, 0.125f };
	int32_t pos[2] = { 0, 3 };
	sl_rope_args a = { .rows = 2, .hd = 4, .nh_q = 1, .q = q, .ldq = 4, .pos = pos,
			   .inv_freq = inv };
	sl_rope_args bad = a;
	bad.hd = 3;
	ck_assert_int_eq(be->ops->rope(be, qu, &bad), SL_EINVAL);
	ck_assert_msg(strstr(sl_errmsg(), "head dim 3") != NULL, "%s", sl_errmsg());
	bad = a;
	bad.ldq = 3;
	ck_assert_int_eq(be->ops->rope(be, qu, &bad), SL_EINVAL);
	ck_assert_msg(strstr(sl_errmsg(), "ldq 3") != NULL, "%s", sl_errmsg());
	bad = a;
	pos[1] = -1;
	ck_assert_int_eq(be->ops->rope(be, qu, &bad), SL_EINVAL);
	ck_assert_msg(strstr(sl_errmsg(), "row 1 has position -1") != NULL, "%s", sl_errmsg());
	for (int i = 0; i < 8; i++)
		ck_assert_float_eq(q[i], (float)(i + 1));
}
END_TEST

/* The inverse frequencies: against an fp64 evaluation of the formulas
 * (each case's tolerance covers transformers' fp32 rounding), and against
 * the values transformers computed (tests/fixtures/rope-inv-freq.json,
 * tools/make_rope_fixture.py) to one fp32 ulp; bad scalings refused. */
START_TEST(test_rope_inv_freq_formula)
{
	static const int hds[] = { 2, 16, 64, 128 };
	static const double thetas[] = { 10000.0, 500000.0, 1e6 };
	float inv[SL_ROPE_MAX_HD / 2];
	for (size_t ih = 0; ih < SL_ARRAY_LEN(hds); ih++)
		for (size_t it = 0; it < SL_ARRAY_LEN(thetas); it++)
			for (int type = 0; type < 3; type++) {
				const int hd = hds[ih];
				const double th = thetas[it];
				const sl_rope_scaling sc = { (sl_rope_type)type, 8.0, 1.0, 4.0, 8192 };
				ck_assert_int_eq(sl_rope_inv_freq(hd, th, &sc, inv), 0);
				for (int i = 0; i < hd / 2; i++) {
					double f = pow(th, -2.0 * i / hd);
					if (type == SL_ROPE_LINEAR)
						f /= 8.0;
					if (type == SL_ROPE_LLAMA3) {
						const double wl = 2 * M_PI / f;
						if (wl > 8192.0)
							f /= 8.0;
						else if (wl >= 2048.0) {
							const double sm = (8192.0 / wl - 1.0) / 3.0;
							f = (1 - sm) * f / 8.0 + sm * f;
						}
					}
					FAIL_IF(!(fabs(inv[i] - f) <= 4e-7 * f),
						"inv_freq hd=%d theta=%g type=%d [%d] = %.9g, want %.9g",
						hd, th, type, i, (double)inv[i], f);
				}
			}
	/* no scaling and a NULL scaling are the same */
	float a[64], b2[64];
	ck_assert_int_eq(sl_rope_inv_freq(128, 10000.0, NULL, a), 0);
	const sl_rope_scaling none = { SL_ROPE_DEFAULT, 0, 0, 0, 0 };
	ck_assert_int_eq(sl_rope_inv_freq(128, 10000.0, &none, b2), 0);
	ck_assert_mem_eq(a, b2, sizeof a);

	const sl_rope_scaling bad_factor = { SL_ROPE_LINEAR, 0.0, 0, 0, 0 };
	ck_assert_int_eq(sl_rope_inv_freq(64, 1e4, &bad_factor, a), SL_EINVAL);
	ck_assert_msg(strstr(sl_errmsg(), "factor 0") != NULL, "%s", sl_errmsg());
	const sl_rope_scaling bad_lohi = { SL_ROPE_LLAMA3, 8.0, 4.0, 1.0, 8192 };
	ck_assert_int_eq(sl_rope_inv_freq(64, 1e4, &bad_lohi, a), SL_EINVAL);
	ck_assert_msg(strstr(sl_errmsg(), "low_freq_factor") != NULL, "%s", sl_errmsg());
	const sl_rope_scaling bad_ctx = { SL_ROPE_LLAMA3, 8.0, 1.0, 4.0, 0 };
	ck_assert_int_eq(sl_rope_inv_freq(64, 1e4, &bad_ctx, a), SL_EINVAL);
	ck_assert_msg(strstr(sl_errmsg(), "original_max_position_embeddings") != NULL, "%s",
		      sl_errmsg());
	ck_assert_int_eq(sl_rope_inv_freq(63, 1e4, NULL, a), SL_EINVAL);
	ck_assert_int_eq(sl_rope_inv_freq(64, 0.0, NULL, a), SL_EINVAL);
	ck_assert_msg(strstr(sl_errmsg(), "rope_theta") != NULL, "%s", sl_errmsg());
}
END_TEST

static const char *g_rope_fixture; /* argv[1]: tests/fixtures/rope-inv-freq.json */

START_TEST(test_rope_inv_freq_transformers)
{
	ck_assert_msg(g_rope_fixture != NULL, "usage: test_ops ROPE_FIXTURE.json");
	json_error_t err;
	json_t *root = json_load_file(g_rope_fixture, 0, &err);
	ck_assert_msg(root != NULL, "cannot read %s: %s", g_rope_fixture, err.text);
	json_t *cases = json_object_get(root, "cases");
	ck_assert_uint_ge(json_array_size(cases), 4);
	bool seen_llama3_mid = false;
	for (size_t ci = 0; ci < json_array_size(cases); ci++) {
		json_t *cj = json_array_get(cases, ci);
		const char *name = json_string_value(json_object_get(cj, "name"));
		const char *type = json_string_value(json_object_get(cj, "rope_type"));
		ck_assert_ptr_nonnull(name);
		ck_assert_ptr_nonnull(type);
		sl_rope_scaling sc = { SL_ROPE_DEFAULT, 0, 0, 0, 0 };
		if (!strcmp(type, "linear")) {
			sc.type = SL_ROPE_LINEAR;
		} else if (!strcmp(type, "llama3")) {
			sc.type = SL_ROPE_LLAMA3;
			sc.low_freq_factor = json_number_value(json_object_get(cj, "low_freq_factor"));
			sc.high_freq_factor = json_number_value(json_object_get(cj, "high_freq_factor"));
			sc.original_max_position_embeddings = (int)json_integer_value(
				json_object_get(cj, "original_max_position_embeddings"));
		} else {
			ck_assert_str_eq(type, "default");
		}
		if (sc.type != SL_ROPE_DEFAULT)
			sc.factor = json_number_value(json_object_get(cj, "factor"));
		const int hd = (int)json_integer_value(json_object_get(cj, "head_dim"));
		const double theta = json_number_value(json_object_get(cj, "rope_theta"));
		json_t *want = json_object_get(cj, "inv_freq");
		ck_assert_int_eq((int)json_array_size(want), hd / 2);
		float got[SL_ROPE_MAX_HD / 2], plain[SL_ROPE_MAX_HD / 2];
		ck_assert_msg(sl_rope_inv_freq(hd, theta, &sc, got) == 0, "%s: %s", name, sl_errmsg());
		ck_assert_int_eq(sl_rope_inv_freq(hd, theta, NULL, plain), 0);
		int mid = 0;
		for (int i = 0; i < hd / 2; i++) {
			/* the fixture holds each fp32 value exactly (repr of a double) */
			const float w = (float)json_number_value(json_array_get(want, (size_t)i));
			/* pow may differ by an ulp between libm and torch (one
			 * value of the 1e6-theta table does, with transformers
			 * 5.25 and glibc); everything else is the same fp32
			 * arithmetic in the same order */
			const float ulp = nextafterf(w, INFINITY) - w;
			FAIL_IF(!(fabsf(got[i] - w) <= ulp),
				"%s: inv_freq[%d] = %.9g, transformers %.9g", name, i, (double)got[i],
				(double)w);
			const double wl = 2 * M_PI / plain[i];
			if (sc.type == SL_ROPE_LLAMA3 &&
			    wl < sc.original_max_position_embeddings / sc.low_freq_factor &&
			    wl > sc.original_max_position_embeddings / sc.high_freq_factor)
				mid++;
		}
		if (mid)
			seen_llama3_mid = true;
	}
	/* the fixture covers llama3's smooth band, not only its two ends */
	ck_assert_msg(seen_llama3_mid, "%s has no llama3 frequency in the smooth band",
		      g_rope_fixture);
	json_decref(root);
}
END_TEST

/* ---- swiglu ------------------------------------------------------------- */

static const int sw_rows[] = { 1, 4, 19 };
static const int sw_ns[] = { 1, 7, 344, 1100 };
#define SW_CASES ((int)(SL_ARRAY_LEN(sw_rows) * SL_ARRAY_LEN(sw_ns)) * 3)

/* out = silu(gate) * up against fp64; gate and up the two halves of one
 * row (the fused gate/up GEMM's layout) or rows of their own; out apart,
 * or written over gate; values wide enough to reach both tails of silu */
START_TEST(test_swiglu)
{
	const int rows = sw_rows[_i / 12], n = sw_ns[_i / 3 % 4], mode = _i % 3;
	/* mode 0: gate | up in one row (ld 2n + 1), out apart (ld n + 2)
	 * mode 1: separate buffers with their own strides, out apart
	 * mode 2: separate buffers, out over gate */
	rng r = rng_seed(4900 + (uint64_t)_i);
	const int ldg = mode == 0 ? 2 * n + 1 : n + 3, ldu = mode == 0 ? ldg : n + 5;
	const int ldo = mode == 2 ? ldg : n + 2;
	const size_t ng = (size_t)rows * ldg, nu = (size_t)rows * ldu, no = (size_t)rows * ldo;
	float *gbuf = xmalloc(sizeof(float) * ng);
	float *ubuf = mode == 0 ? gbuf : xmalloc(sizeof(float) * nu);
	float *obuf = mode == 2 ? gbuf : xmalloc(sizeof(float) * no);
	float *g0 = xmalloc(sizeof(float) * ng), *u0 = xmalloc(sizeof(float) * nu);
	for (size_t i = 0; i < ng; i++)
		gbuf[i] = bitsf(POISON_F32);
	if (mode)
		for (size_t i = 0; i < nu; i++)
			ubuf[i] = bitsf(POISON_F32);
	if (mode != 2)
		for (size_t i = 0; i < no; i++)
			obuf[i] = bitsf(POISON_F32);
	float *gate = gbuf, *up = mode == 0 ? gbuf + n : ubuf;
	for (int i = 0; i < rows; i++)
		for (int j = 0; j < n; j++) {
			gate[(size_t)i * ldg + j] = 12.0f * rng_unif(&r);
			up[(size_t)i * ldu + j] = 2.0f * rng_unif(&r);
		}
	memcpy(g0, gbuf, sizeof(float) * ng);
	if (mode)
		memcpy(u0, ubuf, sizeof(float) * nu);
	ck_assert_int_eq(be->ops->swiglu(be, qu, rows, n, gate, ldg, up, ldu, obuf, ldo), 0);
	const float *gr0 = g0, *ur0 = mode == 0 ? g0 + n : u0;
	for (int i = 0; i < rows; i++)
		for (int j = 0; j < ldo; j++) {
			const float got = obuf[(size_t)i * ldo + j];
			if (j >= n) { /* the row's rest: untouched */
				const float was = mode == 2 ? g0[(size_t)i * ldo + j] : bitsf(POISON_F32);
				FAIL_IF(fbits(got) != fbits(was), "swiglu rows=%d n=%d mode=%d: "
					"out[%d][%d] written", rows, n, mode, i, j);
				continue;
			}
			const double g = gr0[(size_t)i * ldg + j], u = ur0[(size_t)i * ldu + j];
			const double want = g / (1.0 + exp(-g)) * u;
			FAIL_IF(!(fabs(got - want) <= 1e-6 * fabs(want) + 1e-30),
				"swiglu rows=%d n=%d mode=%d: out[%d][%d] = %.9g, want %.9g", rows, n,
				mode, i, j, (double)got, want);
		}
	if (mode != 2)
		ck_assert_msg(memcmp(gbuf, g0, sizeof(float) * ng) == 0, "swiglu wrote to gate");
	if (mode == 1)
		ck_assert_msg(memcmp(ubuf, u0, sizeof(float) * nu) == 0, "swiglu wrote to up");
	free(gbuf);
	if (mode)
		free(ubuf);
	if (mode != 2)
		free(obuf);
	free(g0);
	free(u0);
}
END_TEST

/* ---- embed ------------------------------------------------------------------ */

static const int emb_rows[] = { 1, 5, 33 };
static const int emb_ns[] = { 1, 7, 64, 1000 };
#define EMB_CASES ((int)(SL_ARRAY_LEN(emb_rows) * SL_ARRAY_LEN(emb_ns)) * 2)
#define EMB_VOCAB 50

/* Table entries are any finite fp16 (subnormals to 65504): widening is
 * exact, and so is one fp32 addition rounded once (double then float
 * rounding of a sum of two floats is the correctly rounded sum). */
static void embed_check(sl_backend *b, sl_queue *q, int rows, int n, bool acc, uint64_t seed)
{
	rng r = rng_seed(seed);
	sl_half *table = xmalloc(sizeof(sl_half) * (size_t)EMB_VOCAB * n);
	int32_t *idx = xmalloc(sizeof(int32_t) * (size_t)rows);
	float *y = xmalloc(sizeof(float) * (size_t)rows * n);
	float *y0 = xmalloc(sizeof(float) * (size_t)rows * n);
	for (size_t i = 0; i < (size_t)EMB_VOCAB * n; i++) {
		uint16_t h;
		do
			h = (uint16_t)rng_u32(&r);
		while ((h & 0x7c00) == 0x7c00);
		table[i] = h;
	}
	for (int i = 0; i < rows; i++)
		idx[i] = i == 1 ? idx[0] : rng_int(&r, EMB_VOCAB); /* a repeat */
	for (size_t i = 0; i < (size_t)rows * n; i++)
		y0[i] = y[i] = acc ? rng_unif(&r) * 100.0f : bitsf(POISON_F32);
	int rc = b->ops->embed(b, q, rows, n, table, idx, y, acc);
	ck_assert_int_eq(rc, 0);
	for (int i = 0; i < rows; i++)
		for (int j = 0; j < n; j++) {
			const double e = ref_half(table[(size_t)idx[i] * n + j]);
			const float want = acc ? (float)((double)y0[(size_t)i * n + j] + e) : (float)e;
			const float got = y[(size_t)i * n + j];
			FAIL_IF(fbits(got) != fbits(want),
				"embed rows=%d n=%d acc=%d: y[%d][%d] = %a, want %a", rows, n, acc, i,
				j, (double)got, (double)want);
		}
	free(table);
	free(idx);
	free(y);
	free(y0);
}

START_TEST(test_embed)
{
	const int rows = emb_rows[_i / 8], n = emb_ns[_i / 2 % 4];
	const bool acc = _i & 1;
	embed_check(be, qu, rows, n, acc, 5000 + (uint64_t)_i);
	embed_check(be_scalar, qu_scalar, rows, n, acc, 5000 + (uint64_t)_i);
}
END_TEST

/* ---- attention -------------------------------------------------------------- */

typedef struct attn_case {
	int nseq, nh, hd, t;
	bool f32, score;
} attn_case;

static const int at_nseq[] = { 1, 3 }, at_nh[] = { 1, 4 }, at_hd[] = { 1, 8, 64 },
		 at_t[] = { 1, 5, 33 };
#define PREFILL_CASES 144 /* 2 nseq x 2 nh x 3 hd x 3 t x 2 dtypes x 2 score */
#define DECODE_CASES 48   /* the same without t */

static attn_case attn_case_of(int i, bool prefill)
{
	attn_case c;
	c.score = i & 1;
	c.f32 = (i >> 1) & 1;
	i >>= 2;
	if (prefill) {
		c.t = at_t[i % 3];
		i /= 3;
	} else {
		c.t = 1;
	}
	c.hd = at_hd[i % 3];
	i /= 3;
	c.nh = at_nh[i % 2];
	c.nseq = at_nseq[i / 2];
	return c;
}

/*
 * The element of a KV cache (backend.h: token-major, (nseq, cap, nh, hd))
 * that holds dim d of head h of the token in slot j of sequence s.  The
 * hand-built tests (test_attn_cache_layout, test_h2o_cache_layout) pin
 * this down with literal offsets.
 */
static size_t kv_index(int cap, int nh, int hd, int s, int j, int h, int d)
{
	return (((size_t)s * cap + (size_t)j) * nh + (size_t)h) * hd + (size_t)d;
}

/* Cache element access for either dtype. */
static uint32_t cache_bits(const void *cache, bool f32, size_t i)
{
	return f32 ? fbits(((const float *)cache)[i]) : ((const sl_half *)cache)[i];
}

static uint32_t cache_poison(bool f32)
{
	return f32 ? POISON_F32 : POISON_F16;
}

/* The bits a cache slot must hold for an fp32 value written to it. */
static uint32_t cache_want(float v, bool f32)
{
	return f32 ? fbits(v) : ref_f2h(v);
}

/*
 * Reference attention of one query over nk keys/values (doubles, rows of
 * hd): writes out (hd) and the probabilities p (nk); the tolerance of each
 * output is 1e-5 * sum_j p_j |v_jd| (error proportional to the terms).
 */
static void ref_attend(const float *q, const double *K, const double *V, int nk, int hd,
		       double *p, double *out, double *tol)
{
	double mx = -INFINITY, sum = 0;
	for (int j = 0; j < nk; j++) {
		double l = 0;
		for (int d = 0; d < hd; d++)
			l += (double)q[d] * K[(size_t)j * hd + d];
		p[j] = l;
		mx = fmax(mx, l);
	}
	for (int j = 0; j < nk; j++) {
		p[j] = exp(p[j] - mx);
		sum += p[j];
	}
	for (int j = 0; j < nk; j++)
		p[j] /= sum;
	for (int d = 0; d < hd; d++) {
		double o = 0, m = 0;
		for (int j = 0; j < nk; j++) {
			o += p[j] * V[(size_t)j * hd + d];
			m += p[j] * fabs(V[(size_t)j * hd + d]);
		}
		out[d] = o;
		tol[d] = 1e-5 * m;
	}
}

static void prefill_check(sl_backend *b, sl_queue *q, const attn_case *c, int mode, uint64_t seed)
{
	const int nseq = c->nseq, nh = c->nh, hd = c->hd, t = c->t, hidden = nh * hd;
	static const int cap_extra[] = { 0, 3, 1, 2 };
	const int cap = t + cap_extra[mode];
	const int pats[4][3] = { { 0, t - 1, t / 2 },
				 { t - 1, t / 2, 0 },
				 { t / 2, 0, t - 1 },
				 { t - 1, t, 0 } }; /* t: a sequence all padding */
	int npad[3];
	for (int s = 0; s < nseq; s++)
		npad[s] = pats[mode][s % 3];
	rng r = rng_seed(seed);
	const size_t nact = (size_t)nseq * t * hidden, ncache = (size_t)nseq * nh * cap * hd;
	const size_t esz = c->f32 ? sizeof(float) : sizeof(sl_half);
	float *qv = xmalloc(sizeof(float) * nact), *kn = xmalloc(sizeof(float) * nact);
	float *vn = xmalloc(sizeof(float) * nact), *out = xmalloc(sizeof(float) * nact);
	void *kc = xmalloc(esz * ncache), *vc = xmalloc(esz * ncache);
	float *score = c->score ? xmalloc(sizeof(float) * (size_t)nseq * nh * cap) : NULL;
	float *score0 = xmalloc(sizeof(float) * (size_t)nseq * nh * cap);
	const float qs = (float)(1.0 / sqrt(hd)); /* q arrives scaled by 1/sqrt(hd) */
	for (int s = 0; s < nseq; s++)
		for (int i = 0; i < t; i++)
			for (int e = 0; e < hidden; e++) {
				const size_t o = ((size_t)s * t + i) * hidden + e;
				/* padding rows hold large finite garbage: using them
				 * anywhere would show in the results */
				const bool pad = i < npad[s];
				qv[o] = pad ? 50.0f + rng_unif(&r) : rng_unif(&r) * qs;
				kn[o] = pad ? 70.0f + rng_unif(&r) : rng_unif(&r);
				vn[o] = pad ? 90.0f + rng_unif(&r) : rng_unif(&r);
				out[o] = bitsf(POISON_F32);
			}
	for (size_t i = 0; i < ncache; i++) {
		if (c->f32) {
			((float *)kc)[i] = bitsf(POISON_F32);
			((float *)vc)[i] = bitsf(POISON_F32);
		} else {
			((sl_half *)kc)[i] = POISON_F16;
			((sl_half *)vc)[i] = POISON_F16;
		}
	}
	for (size_t i = 0; i < (size_t)nseq * nh * cap; i++)
		score0[i] = 1.0f + 0.25f * (float)(i % 7);
	if (score)
		memcpy(score, score0, sizeof(float) * (size_t)nseq * nh * cap);

	sl_attn_args a = { .nseq = nseq, .nh = nh, .hd = hd, .t = t, .cap = cap, .q = qv,
			   .k_new = kn, .v_new = vn, .out = out, .k_cache = kc, .v_cache = vc,
			   .kv_f32 = c->f32, .npad = npad, .score = score };
	int rc = b->ops->attn_prefill(b, q, &a);
	ck_assert_msg(rc == 0, "attn_prefill: rc %d (%s)", rc, sl_errmsg());

	double *K = xmalloc(sizeof(double) * (size_t)t * hd), *V = xmalloc(sizeof(double) * (size_t)t * hd);
	double *p = xmalloc(sizeof(double) * (size_t)t), *colsum = xmalloc(sizeof(double) * (size_t)t);
	double *o = xmalloc(sizeof(double) * (size_t)hd), *tol = xmalloc(sizeof(double) * (size_t)hd);
#define PF_CTX "attn_prefill nseq=%d nh=%d hd=%d t=%d cap=%d f32=%d score=%d npad[%d]=%d h=%d: "
#define PF_ARGS nseq, nh, hd, t, cap, c->f32, c->score, s, np, h
	for (int s = 0; s < nseq; s++)
		for (int h = 0; h < nh; h++) {
			const int np = npad[s], nr = t - np;
			/* (1) real rows cached in slots [0, nr), rounded to the cache
			 * dtype; (2) slots beyond untouched */
			for (int j = 0; j < cap; j++)
				for (int d = 0; d < hd; d++) {
					const size_t ci = kv_index(cap, nh, hd, s, j, h, d);
					if (j >= nr) {
						FAIL_IF(cache_bits(kc, c->f32, ci) != cache_poison(c->f32) ||
								cache_bits(vc, c->f32, ci) != cache_poison(c->f32),
							PF_CTX "slot %d past the real rows was written", PF_ARGS, j);
						continue;
					}
					const size_t src = ((size_t)s * t + np + j) * hidden + (size_t)h * hd + d;
					FAIL_IF(cache_bits(kc, c->f32, ci) != cache_want(kn[src], c->f32),
						PF_CTX "k slot %d [%d] = %x, want %x", PF_ARGS, j, d,
						cache_bits(kc, c->f32, ci), cache_want(kn[src], c->f32));
					FAIL_IF(cache_bits(vc, c->f32, ci) != cache_want(vn[src], c->f32),
						PF_CTX "v slot %d [%d] = %x, want %x", PF_ARGS, j, d,
						cache_bits(vc, c->f32, ci), cache_want(vn[src], c->f32));
					/* attention reads what the cache holds */
					K[(size_t)j * hd + d] = c->f32 ? kn[src] : ref_round_half(kn[src]);
					V[(size_t)j * hd + d] = c->f32 ? vn[src] : ref_round_half(vn[src]);
				}
			/* (3) padding rows of out are zero */
			for (int i = 0; i < np; i++)
				for (int d = 0; d < hd; d++) {
					const float got = out[((size_t)s * t + i) * hidden + (size_t)h * hd + d];
					FAIL_IF(got != 0.0f, PF_CTX "padding row %d out[%d] = %g, want 0",
						PF_ARGS, i, d, (double)got);
				}
			/* (4) causal attention among the real rows */
			for (int j = 0; j < nr; j++)
				colsum[j] = 0;
			for (int i = 0; i < nr; i++) {
				const size_t row = ((size_t)s * t + np + i) * hidden + (size_t)h * hd;
				ref_attend(qv + row, K, V, i + 1, hd, p, o, tol);
				for (int j = 0; j <= i; j++)
					colsum[j] += p[j];
				for (int d = 0; d < hd; d++) {
					const float got = out[row + d];
					FAIL_IF(!(fabs(got - o[d]) <= tol[d]),
						PF_CTX "real row %d out[%d] = %.9g, want %.9g (tol %.3g)",
						PF_ARGS, i, d, (double)got, o[d], tol[d]);
				}
			}
			/* (5) score: column sums added to the old values; the rest kept */
			if (!score)
				continue;
			for (int j = 0; j < cap; j++) {
				const size_t si = (size_t)(s * nh + h) * cap + j;
				if (j >= nr) {
					FAIL_IF(fbits(score[si]) != fbits(score0[si]),
						PF_CTX "score slot %d past the real rows changed", PF_ARGS, j);
					continue;
				}
				const double want = score0[si] + colsum[j];
				FAIL_IF(!(fabs(score[si] - want) <= 1e-5 * want),
					PF_CTX "score slot %d = %.9g, want %.9g", PF_ARGS, j,
					(double)score[si], want);
			}
		}
#undef PF_CTX
#undef PF_ARGS
	free(qv);
	free(kn);
	free(vn);
	free(out);
	free(kc);
	free(vc);
	free(score);
	free(score0);
	free(K);
	free(V);
	free(p);
	free(colsum);
	free(o);
	free(tol);
}

START_TEST(test_attn_prefill)
{
	const attn_case c = attn_case_of(_i, true);
	for (int mode = 0; mode < 4; mode++) {
		prefill_check(be, qu, &c, mode, 6000 + 4 * (uint64_t)_i + mode);
		if (!c.f32) /* fp16 cache reads differ between the two */
			prefill_check(be_scalar, qu_scalar, &c, mode, 6000 + 4 * (uint64_t)_i + mode);
	}
}
END_TEST

static void decode_check(sl_backend *b, sl_queue *q, const attn_case *c, int mode, uint64_t seed)
{
	const int nseq = c->nseq, nh = c->nh, hd = c->hd, hidden = nh * hd;
	static const int caps[] = { 1, 9, 40, 6 };
	static const int lens[4][3] = { { 0, 0, 0 }, { 3, 8, 0 }, { 39, 17, 0 }, { 5, 0, 2 } };
	const int cap = caps[mode];
	int len[3];
	for (int s = 0; s < nseq; s++)
		len[s] = lens[mode][s % 3];
	rng r = rng_seed(seed);
	const size_t nact = (size_t)nseq * hidden, ncache = (size_t)nseq * nh * cap * hd;
	const size_t esz = c->f32 ? sizeof(float) : sizeof(sl_half), nscore = (size_t)nseq * nh * cap;
	float *qv = xmalloc(sizeof(float) * nact), *kn = xmalloc(sizeof(float) * nact);
	float *vn = xmalloc(sizeof(float) * nact), *out = xmalloc(sizeof(float) * nact);
	void *kc = xmalloc(esz * ncache), *vc = xmalloc(esz * ncache);
	void *kc0 = xmalloc(esz * ncache), *vc0 = xmalloc(esz * ncache);
	float *score = c->score ? xmalloc(sizeof(float) * nscore) : NULL;
	float *score0 = xmalloc(sizeof(float) * nscore);
	const float qs = (float)(1.0 / sqrt(hd));
	for (size_t i = 0; i < nact; i++) {
		qv[i] = rng_unif(&r) * qs;
		kn[i] = rng_unif(&r);
		vn[i] = rng_unif(&r);
		out[i] = bitsf(POISON_F32);
	}
	/* slots [0, len) hold earlier tokens; slot len and beyond are poison */
	for (int s = 0; s < nseq; s++)
		for (int h = 0; h < nh; h++)
			for (int j = 0; j < cap; j++)
				for (int d = 0; d < hd; d++) {
					const size_t ci = kv_index(cap, nh, hd, s, j, h, d);
					const bool live = j < len[s];
					if (c->f32) {
						((float *)kc)[ci] = live ? rng_unif(&r) : bitsf(POISON_F32);
						((float *)vc)[ci] = live ? rng_unif(&r) : bitsf(POISON_F32);
					} else {
						((sl_half *)kc)[ci] = live ? rand_half(&r) : POISON_F16;
						((sl_half *)vc)[ci] = live ? rand_half(&r) : POISON_F16;
					}
				}
	memcpy(kc0, kc, esz * ncache);
	memcpy(vc0, vc, esz * ncache);
	for (size_t i = 0; i < nscore; i++)
		score0[i] = 2.0f + 0.5f * (float)(i % 5);
	if (score)
		memcpy(score, score0, sizeof(float) * nscore);

	sl_attn_args a = { .nseq = nseq, .nh = nh, .hd = hd, .t = 1, .cap = cap, .q = qv,
			   .k_new = kn, .v_new = vn, .out = out, .k_cache = kc, .v_cache = vc,
			   .kv_f32 = c->f32, .len = len, .score = score };
	int rc = b->ops->attn_decode(b, q, &a);
	ck_assert_msg(rc == 0, "attn_decode: rc %d (%s)", rc, sl_errmsg());

	double *K = xmalloc(sizeof(double) * (size_t)cap * hd), *V = xmalloc(sizeof(double) * (size_t)cap * hd);
	double *p = xmalloc(sizeof(double) * (size_t)cap);
	double *o = xmalloc(sizeof(double) * (size_t)hd), *tol = xmalloc(sizeof(double) * (size_t)hd);
#define DC_CTX "attn_decode nseq=%d nh=%d hd=%d cap=%d f32=%d score=%d len[%d]=%d h=%d: "
#define DC_ARGS nseq, nh, hd, cap, c->f32, c->score, s, L, h
	for (int s = 0; s < nseq; s++)
		for (int h = 0; h < nh; h++) {
			const int L = len[s];
			const size_t row = (size_t)s * hidden + (size_t)h * hd;
			for (int j = 0; j < cap; j++)
				for (int d = 0; d < hd; d++) {
					const size_t ci = kv_index(cap, nh, hd, s, j, h, d);
					const uint32_t kb = cache_bits(kc, c->f32, ci), vb = cache_bits(vc, c->f32, ci);
					if (j == L) { /* the new token */
						FAIL_IF(kb != cache_want(kn[row + d], c->f32) ||
								vb != cache_want(vn[row + d], c->f32),
							DC_CTX "new k/v not in slot len [%d]", DC_ARGS, d);
					} else {
						FAIL_IF(kb != cache_bits(kc0, c->f32, ci) ||
								vb != cache_bits(vc0, c->f32, ci),
							DC_CTX "slot %d [%d] changed", DC_ARGS, j, d);
					}
					if (j <= L) {
						K[(size_t)j * hd + d] = c->f32 ? bitsf(kb) : ref_half((uint16_t)kb);
						V[(size_t)j * hd + d] = c->f32 ? bitsf(vb) : ref_half((uint16_t)vb);
					}
				}
			ref_attend(qv + row, K, V, L + 1, hd, p, o, tol);
			for (int d = 0; d < hd; d++)
				FAIL_IF(!(fabs(out[row + d] - o[d]) <= tol[d]),
					DC_CTX "out[%d] = %.9g, want %.9g (tol %.3g)", DC_ARGS, d,
					(double)out[row + d], o[d], tol[d]);
			if (!score)
				continue;
			for (int j = 0; j < cap; j++) {
				const size_t si = (size_t)(s * nh + h) * cap + j;
				if (j > L) {
					FAIL_IF(fbits(score[si]) != fbits(score0[si]),
						DC_CTX "score slot %d past len changed", DC_ARGS, j);
					continue;
				}
				const double want = score0[si] + p[j];
				FAIL_IF(!(fabs(score[si] - want) <= 1e-5 * want),
					DC_CTX "score slot %d = %.9g, want %.9g", DC_ARGS, j,
					(double)score[si], want);
			}
		}
#undef DC_CTX
#undef DC_ARGS
	free(qv);
	free(kn);
	free(vn);
	free(out);
	free(kc);
	free(vc);
	free(kc0);
	free(vc0);
	free(score);
	free(score0);
	free(K);
	free(V);
	free(p);
	free(o);
	free(tol);
}

START_TEST(test_attn_decode)
{
	const attn_case c = attn_case_of(_i, false);
	for (int mode = 0; mode < 4; mode++) {
		decode_check(be, qu, &c, mode, 7000 + 4 * (uint64_t)_i + mode);
		if (!c.f32)
			decode_check(be_scalar, qu_scalar, &c, mode, 7000 + 4 * (uint64_t)_i + mode);
	}
}
END_TEST

/* Bad lengths: SL_EINVAL.  nseq = 2, cap = 4. */
typedef struct attn_bad_case {
	bool prefill;
	int t, v0, v1; /* prefill: npad; decode: len */
} attn_bad_case;

static const attn_bad_case attn_bad_cases[] = {
	{ false, 1, 4, 0 },  /* len == cap */
	{ false, 1, 0, 9 },  /* len > cap, second sequence */
	{ false, 1, -1, 0 }, /* len < 0 */
	{ true, 3, 4, 0 },   /* npad > t */
	{ true, 3, 0, -1 },  /* npad < 0 */
	{ true, 6, 1, 0 },   /* t - npad = 6 real rows > cap */
};

START_TEST(test_attn_bad_args)
{
	const attn_bad_case *c = &attn_bad_cases[_i];
	enum { NSEQ = 2, NH = 2, HD = 4, CAP = 4, T = 6 };
	float act[NSEQ * T * NH * HD] = { 0 }, out[NSEQ * T * NH * HD];
	sl_half kc[NSEQ * NH * CAP * HD], vc[NSEQ * NH * CAP * HD];
	float score[NSEQ * NH * CAP] = { 0 };
	const int vals[NSEQ] = { c->v0, c->v1 };
	memset(kc, 0, sizeof kc);
	memset(vc, 0, sizeof vc);
	sl_attn_args a = { .nseq = NSEQ, .nh = NH, .hd = HD, .t = c->t, .cap = CAP, .q = act,
			   .k_new = act, .v_new = act, .out = out, .k_cache = kc, .v_cache = vc,
			   .kv_f32 = false, .score = score };
	int rc;
	sl_err_clear();
	if (c->prefill) {
		a.npad = vals;
		rc = be->ops->attn_prefill(be, qu, &a);
	} else {
		a.len = vals;
		rc = be->ops->attn_decode(be, qu, &a);
	}
	ck_assert_int_eq(rc, SL_EINVAL);
	ck_assert_msg(strstr(sl_errmsg(), c->prefill ? "attn_prefill" : "attn_decode"),
		      "the message does not name the op: %s", sl_errmsg());
}
END_TEST

/*
 * The cache layout, pinned with literal offsets (backend.h: token-major,
 * (nseq, cap, nh, hd)), for attention.  nseq = 2, nh = 2, hd = 2, cap = 4
 * (hidden 4: 16 elements per sequence).  Token j of sequence b has, in head
 * h, dim d, the key code(b, j, h, d) = 1000 b + 100 j + 10 h + d + 1 and
 * the value -code.  A prefill of t = 3 rows with npad = {1, 0} caches
 * tokens 0, 1 of sequence 0 and 0, 1, 2 of sequence 1; a decode with len =
 * {2, 3} adds token 2 of sequence 0 and token 3 of sequence 1.  The k cache
 * must then hold the literal table below element by element (the v cache
 * its negation; 0: never written, poison), after the prefill without those
 * two tokens.  With q = 0 the attention is uniform, so each output is -(the
 * mean of the codes over the slots read): a slot, head or sequence that the
 * decode reads from the wrong place shows there.
 */
static const int layout_attn_k[32] = {
	/* sequence 0: slot 0 (head 0: d 0, 1; head 1: d 0, 1), slot 1, slot 2, slot 3 */
	1, 2, 11, 12, 101, 102, 111, 112, 201, 202, 211, 212, 0, 0, 0, 0,
	/* sequence 1 */
	1001, 1002, 1011, 1012, 1101, 1102, 1111, 1112,
	1201, 1202, 1211, 1212, 1301, 1302, 1311, 1312,
};

static float layout_code(int b, int j, int h, int d)
{
	return (float)(1000 * b + 100 * j + 10 * h + d + 1);
}

/* element i of a cache holds want (0: poison) */
static void layout_check_cache(const char *what, const void *kc, const void *vc, bool f32,
			       const int *want, int n, const bool *skip)
{
	for (int i = 0; i < n; i++) {
		if (skip && skip[i])
			continue;
		const uint32_t wk = want[i] ? cache_want((float)want[i], f32) : cache_poison(f32);
		const uint32_t wv = want[i] ? cache_want((float)-want[i], f32) : cache_poison(f32);
		FAIL_IF(cache_bits(kc, f32, (size_t)i) != wk,
			"%s f32=%d: k cache element %d = %x, want %x (code %d)", what, f32, i,
			cache_bits(kc, f32, (size_t)i), wk, want[i]);
		FAIL_IF(cache_bits(vc, f32, (size_t)i) != wv,
			"%s f32=%d: v cache element %d = %x, want %x (code %d)", what, f32, i,
			cache_bits(vc, f32, (size_t)i), wv, -want[i]);
	}
}

static void layout_poison(void *c, bool f32, int n)
{
	for (int i = 0; i < n; i++) {
		if (f32)
			((float *)c)[i] = bitsf(POISON_F32);
		else
			((sl_half *)c)[i] = POISON_F16;
	}
}

START_TEST(test_attn_cache_layout)
{
	enum { NSEQ = 2, NH = 2, HD = 2, CAP = 4, T = 3, HID = NH * HD, N = NSEQ * CAP * HID };
	const bool f32 = _i & 1;
	sl_backend *b = _i & 2 ? be_scalar : be;
	sl_queue *q = _i & 2 ? qu_scalar : qu;
	/* the test's own index agrees with the literal table */
	ck_assert_int_eq(kv_index(CAP, NH, HD, 0, 1, 1, 0), 6);
	ck_assert_int_eq(kv_index(CAP, NH, HD, 1, 3, 0, 1), 29);
	ck_assert_int_eq(layout_attn_k[29], (int)layout_code(1, 3, 0, 1));

	const int npad[NSEQ] = { 1, 0 };
	int len[NSEQ] = { 2, 3 };
	float qp[NSEQ * T * HID] = { 0 }, kp[NSEQ * T * HID], vp[NSEQ * T * HID], op[NSEQ * T * HID];
	for (int s = 0; s < NSEQ; s++)
		for (int i = 0; i < T; i++)
			for (int e = 0; e < HID; e++) {
				const int j = i - npad[s], o = (s * T + i) * HID + e;
				kp[o] = j < 0 ? 77.0f : layout_code(s, j, e / HD, e % HD);
				vp[o] = j < 0 ? 99.0f : -layout_code(s, j, e / HD, e % HD);
				op[o] = bitsf(POISON_F32);
			}
	float kcf[N], vcf[N]; /* room for either dtype */
	void *kc = kcf, *vc = vcf;
	layout_poison(kc, f32, N);
	layout_poison(vc, f32, N);
	sl_attn_args a = { .nseq = NSEQ, .nh = NH, .hd = HD, .t = T, .cap = CAP, .q = qp,
			   .k_new = kp, .v_new = vp, .out = op, .k_cache = kc, .v_cache = vc,
			   .kv_f32 = f32, .npad = npad };
	ck_assert_int_eq(b->ops->attn_prefill(b, q, &a), 0);
	/* the table without the tokens that the decode adds: what decode reads */
	int after_prefill[N];
	memcpy(after_prefill, layout_attn_k, sizeof after_prefill);
	for (int s = 0; s < NSEQ; s++)
		for (int e = 0; e < HID; e++)
			after_prefill[(s * CAP + len[s]) * HID + e] = 0;
	layout_check_cache("attn prefill", kc, vc, f32, after_prefill, N, NULL);
	for (int s = 0; s < NSEQ; s++)
		for (int i = 0; i < T; i++)
			for (int e = 0; e < HID; e++) {
				const int j = i - npad[s];
				const double want = j < 0 ? 0.0 : -(1000.0 * s + 50.0 * j + 10 * (e / HD) + e % HD + 1);
				const float got = op[(s * T + i) * HID + e];
				FAIL_IF(!(fabs(got - want) <= 1e-3),
					"prefill f32=%d: out of sequence %d row %d [%d] = %g, want %g", f32, s,
					i, e, (double)got, want);
			}

	float qd[NSEQ * HID] = { 0 }, kd[NSEQ * HID], vd[NSEQ * HID], od[NSEQ * HID];
	for (int s = 0; s < NSEQ; s++)
		for (int e = 0; e < HID; e++) {
			kd[s * HID + e] = layout_code(s, len[s], e / HD, e % HD);
			vd[s * HID + e] = -layout_code(s, len[s], e / HD, e % HD);
		}
	sl_attn_args d = { .nseq = NSEQ, .nh = NH, .hd = HD, .t = 1, .cap = CAP, .q = qd,
			   .k_new = kd, .v_new = vd, .out = od, .k_cache = kc, .v_cache = vc,
			   .kv_f32 = f32, .len = len };
	ck_assert_int_eq(b->ops->attn_decode(b, q, &d), 0);
	for (int s = 0; s < NSEQ; s++)
		for (int e = 0; e < HID; e++) {
			const double want = -(1000.0 * s + 50.0 * len[s] + 10 * (e / HD) + e % HD + 1);
			FAIL_IF(!(fabs(od[s * HID + e] - want) <= 1e-3),
				"decode f32=%d: out of sequence %d [%d] = %g, want %g", f32, s, e,
				(double)od[s * HID + e], want);
		}
	layout_check_cache("attn prefill + decode", kc, vc, f32, layout_attn_k, N, NULL);
}
END_TEST

/*
 * The same for H2O: nseq = 2, nh = 2, hd = 2, heavy = recent = 1, cap = 3,
 * a scratch of cap_in = 4 slots holding code(b, j, h, d) (token-major, as
 * above) for every slot.  Scores (head-major): sequence 0 (n = 4) head 0
 * {5, 1, 2, -}, head 1 {1, 2, 5, -}: head 0 keeps tokens {0, 3}, head 1
 * {2, 3}; sequence 1 (n = 2) keeps both tokens in both heads.  Then one
 * evict step with len 2, cur = {4, 2}: the new token (code 1000 b + 500 +
 * 10 h + d + 1) in slot 2 of each head, slot scores chosen so that the
 * victims are slots 1, 0 (sequence 0, heads 0, 1) and 0, 1 (sequence 1).
 */
static const int layout_h2o_compact_k[24] = {
	/* sequence 0: slot 0 (head 0 has token 0, head 1 token 2), slot 1 (token 3), slot 2 */
	1, 2, 211, 212, 301, 302, 311, 312, 0, 0, 0, 0,
	/* sequence 1: tokens 0, 1 */
	1001, 1002, 1011, 1012, 1101, 1102, 1111, 1112, 0, 0, 0, 0,
};
static const int layout_h2o_compact_pos[12] = { 0, 3, -1, 2, 3, -1, 0, 1, -1, 0, 1, -1 };
static const int layout_h2o_evict_k[24] = {
	1, 2, 511, 512, 501, 502, 311, 312, 0, 0, 0, 0,
	1501, 1502, 1011, 1012, 1101, 1102, 1511, 1512, 0, 0, 0, 0,
};
static const int layout_h2o_evict_pos[12] = { 0, 4, -1, 4, 3, -1, 2, 1, -1, 0, 2, -1 };

START_TEST(test_h2o_cache_layout)
{
	enum { NSEQ = 2, NH = 2, HD = 2, CAP_IN = 4, CAP = 3, NS = NSEQ * CAP_IN * NH * HD,
	       NC = NSEQ * CAP * NH * HD };
	const bool f32 = _i & 1;
	sl_backend *b = _i & 2 ? be_scalar : be;
	sl_queue *q = _i & 2 ? qu_scalar : qu;
	ck_assert(b->ops->h2o_compact && b->ops->h2o_evict);
	float ksf[NS], vsf[NS], kcf[NC], vcf[NC];
	void *ks = ksf, *vs = vsf, *kc = kcf, *vc = vcf;
	for (int s = 0; s < NSEQ; s++)
		for (int j = 0; j < CAP_IN; j++)
			for (int h = 0; h < NH; h++)
				for (int d = 0; d < HD; d++) {
					const size_t i = kv_index(CAP_IN, NH, HD, s, j, h, d);
					const float c = layout_code(s, j, h, d);
					if (f32) {
						((float *)ks)[i] = c;
						((float *)vs)[i] = -c;
					} else {
						((sl_half *)ks)[i] = ref_f2h(c);
						((sl_half *)vs)[i] = ref_f2h(-c);
					}
				}
	layout_poison(kc, f32, NC);
	layout_poison(vc, f32, NC);
	const float ssrc[NSEQ * NH * CAP_IN] = { 5, 1, 2, 0, 1, 2, 5, 0, 1, 2, 0, 0, 3, 2, 0, 0 };
	float sc[NSEQ * NH * CAP], ev[NSEQ * NH] = { 0 };
	int32_t pos[NSEQ * NH * CAP];
	for (int i = 0; i < NSEQ * NH * CAP; i++) {
		sc[i] = -7.0f;
		pos[i] = -7;
	}
	int n[NSEQ] = { 4, 2 }, heavy[NSEQ] = { 1, 1 }, recent[NSEQ] = { 1, 1 };
	sl_h2o_args a = { .nseq = NSEQ, .nh = NH, .hd = HD, .kv_f32 = f32, .k_src = ks,
			  .v_src = vs, .score_src = ssrc, .cap_in = CAP_IN, .k_cache = kc,
			  .v_cache = vc, .score = sc, .pos = pos, .cap = CAP, .n = n,
			  .heavy = heavy, .recent = recent, .evicted = ev };
	ck_assert_int_eq(b->ops->h2o_compact(b, q, &a), 0);
	for (int i = 0; i < NSEQ * NH * CAP; i++)
		FAIL_IF(pos[i] != layout_h2o_compact_pos[i], "h2o_compact f32=%d: pos[%d] = %d, want %d",
			f32, i, pos[i], layout_h2o_compact_pos[i]);
	layout_check_cache("h2o_compact", kc, vc, f32, layout_h2o_compact_k, NC, NULL);
	ck_assert(ev[0] == 3.0f && ev[1] == 3.0f && ev[2] == 0.0f && ev[3] == 0.0f);

	/* attn_decode's part: the new token in slot 2 of every head, the scores */
	int len[NSEQ] = { 2, 2 }, cur[NSEQ] = { 4, 2 };
	for (int s = 0; s < NSEQ; s++)
		for (int h = 0; h < NH; h++)
			for (int d = 0; d < HD; d++) {
				const size_t i = kv_index(CAP, NH, HD, s, len[s], h, d);
				const float c = (float)(1000 * s + 500 + 10 * h + d + 1);
				if (f32) {
					((float *)kc)[i] = c;
					((float *)vc)[i] = -c;
				} else {
					((sl_half *)kc)[i] = ref_f2h(c);
					((sl_half *)vc)[i] = ref_f2h(-c);
				}
			}
	const float sc1[NSEQ * NH * CAP] = { 5, 1, 0.5f, 0.125f, 1, 0.5f, 1, 2, 0.5f, 3, 2, 0.5f };
	memcpy(sc, sc1, sizeof sc);
	sl_h2o_args e = a;
	e.len = len;
	e.cur = cur;
	ck_assert_int_eq(b->ops->h2o_evict(b, q, &e), 0);
	for (int i = 0; i < NSEQ * NH * CAP; i++)
		FAIL_IF(pos[i] != layout_h2o_evict_pos[i], "h2o_evict f32=%d: pos[%d] = %d, want %d", f32,
			i, pos[i], layout_h2o_evict_pos[i]);
	/* slot len's rows are free: their content is not specified */
	bool skip[NC] = { false };
	for (int s = 0; s < NSEQ; s++)
		for (int h = 0; h < NH; h++)
			for (int d = 0; d < HD; d++)
				skip[kv_index(CAP, NH, HD, s, len[s], h, d)] = true;
	layout_check_cache("h2o_evict", kc, vc, f32, layout_h2o_evict_k, NC, skip);
	const float want_sc[NSEQ * NH * CAP] = { 5, 0.5f, 0, 0.5f, 1, 0, 0.5f, 2, 0, 3, 0.5f, 0 };
	for (int i = 0; i < NSEQ * NH * CAP; i++)
		FAIL_IF(sc[i] != want_sc[i], "h2o_evict f32=%d: score[%d] = %g, want %g", f32, i,
			(double)sc[i], (double)want_sc[i]);
	ck_assert(ev[0] == 4.0f && ev[1] == 3.125f && ev[2] == 1.0f && ev[3] == 2.0f);
}
END_TEST

/* ---- attention and H2O over the compressed (4-bit) cache ------------------- */

/*
 * kv_q4: each cache slot is an sl_q4 (nh, hd) matrix (backend.h).  The
 * reference is the plain path: the token's k (all heads) rounded to fp16
 * by the test's own ref_f2h, quantised with sl_q4_quantize_matrix, the
 * slot's bytes compared whole; attention over sl_q4_dequantize_matrix's
 * values in fp64.  hd 100 pads its second group; hd 1 is a single-element
 * group (scale 0, codes 0); the first real token's head 0 is constant (an
 * equal group).
 */
static const int q4_nseq[] = { 1, 3 }, q4_nh[] = { 1, 3 }, q4_hd[] = { 1, 64, 100, 128 },
		 q4_t[] = { 1, 5, 33 };
#define Q4_PREFILL_CASES 96 /* 2 nseq x 2 nh x 4 hd x 3 t x 2 score */
#define Q4_DECODE_CASES 32

static attn_case q4_case_of(int i, bool prefill)
{
	attn_case c = { .f32 = false };
	c.score = i & 1;
	i >>= 1;
	c.t = 1;
	if (prefill) {
		c.t = q4_t[i % 3];
		i /= 3;
	}
	c.hd = q4_hd[i % 4];
	i /= 4;
	c.nh = q4_nh[i % 2];
	c.nseq = q4_nseq[i / 2];
	return c;
}

/* The slot bytes a token's fp32 row (hidden values) must become, and the
 * values attention must read (nh rows of hd). */
static void q4_ref_slot(const float *row, int nh, int hd, uint8_t *slot, double *deq)
{
	const size_t n = (size_t)nh * hd;
	sl_half *h = xmalloc(sizeof(sl_half) * n);
	float *f = xmalloc(sizeof(float) * n);
	for (size_t i = 0; i < n; i++)
		h[i] = ref_f2h(row[i]);
	sl_q4_quantize_matrix(h, (size_t)nh, (size_t)hd, slot);
	sl_q4_dequantize_matrix(slot, (size_t)nh, (size_t)hd, f);
	for (size_t i = 0; i < n; i++)
		deq[i] = f[i];
	free(h);
	free(f);
}

static void q4_attn_check(sl_backend *b, sl_queue *q, const attn_case *c, int mode, bool prefill,
			  uint64_t seed)
{
	const int nseq = c->nseq, nh = c->nh, hd = c->hd, t = c->t, hidden = nh * hd;
	static const int pats[4][3] = { { 0, 1, 2 }, { 2, 0, 1 }, { 1, 2, 0 }, { 0, 0, 0 } };
	static const int lens[4][3] = { { 0, 0, 0 }, { 3, 8, 0 }, { 39, 17, 0 }, { 5, 0, 2 } };
	int npad[3], len[3];
	int cap = 0;
	for (int s = 0; s < nseq; s++) {
		npad[s] = SL_MIN(pats[mode][s % 3], t - 1 < 0 ? 0 : t - 1);
		if (mode == 3 && s == 1 && prefill)
			npad[s] = t; /* a sequence all padding */
		len[s] = lens[mode][s % 3];
		cap = SL_MAX(cap, prefill ? t + mode : len[s] + 1 + mode);
	}
	rng r = rng_seed(seed);
	const int rows = prefill ? t : 1; /* new rows per sequence */
	const size_t nact = (size_t)nseq * rows * hidden, sb = sl_q4_bytes((size_t)nh, (size_t)hd);
	const size_t ncache = (size_t)nseq * cap * sb, nscore = (size_t)nseq * nh * cap;
	float *qv = xmalloc(sizeof(float) * nact), *kn = xmalloc(sizeof(float) * nact);
	float *vn = xmalloc(sizeof(float) * nact), *out = xmalloc(sizeof(float) * nact);
	uint8_t *kc = xmalloc(ncache), *vc = xmalloc(ncache);
	uint8_t *kw = xmalloc(ncache), *vw = xmalloc(ncache); /* the reference bytes */
	double *K = xmalloc(sizeof(double) * (size_t)nseq * cap * hidden);
	double *V = xmalloc(sizeof(double) * (size_t)nseq * cap * hidden);
	float *score = c->score ? xmalloc(sizeof(float) * nscore) : NULL;
	float *score0 = xmalloc(sizeof(float) * nscore);
	const float qs = (float)(1.0 / sqrt(hd));
	memset(kc, 0xa5, ncache);
	memset(vc, 0x5a, ncache);
	for (size_t i = 0; i < nact; i++) {
		qv[i] = rng_unif(&r) * qs;
		kn[i] = 2.0f * rng_unif(&r);
		vn[i] = rng_unif(&r) + 0.5f;
		out[i] = bitsf(POISON_F32);
	}
	float *tmp = xmalloc(sizeof(float) * (size_t)hidden);
	for (int s = 0; s < nseq; s++) {
		if (prefill) { /* the first real row's head 0 is constant */
			const int np = npad[s];
			if (np < t)
				for (int d = 0; d < hd; d++)
					kn[((size_t)s * t + np) * hidden + d] = 0.3f;
			for (int i = 0; i < np; i++) /* padding: garbage never to be used */
				for (int e = 0; e < hidden; e++) {
					const size_t o = ((size_t)s * t + i) * hidden + e;
					kn[o] = 70.0f + rng_unif(&r);
					vn[o] = 90.0f + rng_unif(&r);
				}
		} else { /* slots [0, len) hold earlier tokens, quantised */
			for (int j = 0; j < len[s]; j++) {
				const size_t so = ((size_t)s * cap + j) * sb;
				for (int e = 0; e < hidden; e++)
					tmp[e] = rng_unif(&r);
				q4_ref_slot(tmp, nh, hd, kc + so, K + ((size_t)s * cap + j) * hidden);
				for (int e = 0; e < hidden; e++)
					tmp[e] = rng_unif(&r);
				q4_ref_slot(tmp, nh, hd, vc + so, V + ((size_t)s * cap + j) * hidden);
			}
		}
	}
	free(tmp);
	memcpy(kw, kc, ncache);
	memcpy(vw, vc, ncache);
	for (int s = 0; s < nseq; s++) {
		const int first = prefill ? 0 : len[s], nr = prefill ? t - npad[s] : 1;
		for (int i = 0; i < nr; i++) {
			const size_t src = ((size_t)s * rows + (prefill ? npad[s] + i : 0)) * hidden;
			const size_t j = (size_t)s * cap + first + i;
			q4_ref_slot(kn + src, nh, hd, kw + j * sb, K + j * hidden);
			q4_ref_slot(vn + src, nh, hd, vw + j * sb, V + j * hidden);
		}
	}
	for (size_t i = 0; i < nscore; i++)
		score0[i] = 1.0f + 0.25f * (float)(i % 7);
	if (score)
		memcpy(score, score0, sizeof(float) * nscore);

	sl_attn_args a = { .nseq = nseq, .nh = nh, .hd = hd, .t = rows, .cap = cap, .q = qv,
			   .k_new = kn, .v_new = vn, .out = out, .k_cache = kc, .v_cache = vc,
			   .kv_q4 = true, .npad = prefill ? npad : NULL, .len = prefill ? NULL : len,
			   .score = score };
	int rc = prefill ? b->ops->attn_prefill(b, q, &a) : b->ops->attn_decode(b, q, &a);
	ck_assert_msg(rc == 0, "q4 attn: rc %d (%s)", rc, sl_errmsg());

#define Q4_CTX "q4 %s nseq=%d nh=%d hd=%d t=%d cap=%d score=%d mode=%d seq %d: "
#define Q4_ARGS prefill ? "prefill" : "decode", nseq, nh, hd, t, cap, c->score, mode, s
	/* (1) the cache: every written slot holds the reference bytes, every
	 * other slot is untouched */
	for (int s = 0; s < nseq; s++)
		for (int j = 0; j < cap; j++) {
			const size_t o = ((size_t)s * cap + j) * sb;
			FAIL_IF(memcmp(kc + o, kw + o, sb) || memcmp(vc + o, vw + o, sb),
				Q4_CTX "slot %d holds other bytes than the reference's", Q4_ARGS, j);
		}
	/* (2) attention over the dequantised values; (3) the scores */
	const int kmax = prefill ? t : cap;
	double *p = xmalloc(sizeof(double) * (size_t)kmax), *colsum = xmalloc(sizeof(double) * (size_t)kmax);
	double *o = xmalloc(sizeof(double) * (size_t)hd), *tol = xmalloc(sizeof(double) * (size_t)hd);
	double *Kh = xmalloc(sizeof(double) * (size_t)kmax * hd), *Vh = xmalloc(sizeof(double) * (size_t)kmax * hd);
	for (int s = 0; s < nseq; s++)
		for (int h = 0; h < nh; h++) {
			const int np = prefill ? npad[s] : 0, nq = prefill ? t - np : 1;
			const int nk = prefill ? nq : len[s] + 1;
			for (int j = 0; j < nk; j++)
				for (int d = 0; d < hd; d++) {
					const size_t e = ((size_t)s * cap + j) * hidden + (size_t)h * hd + d;
					Kh[(size_t)j * hd + d] = K[e];
					Vh[(size_t)j * hd + d] = V[e];
				}
			for (int j = 0; j < nk; j++)
				colsum[j] = 0;
			for (int i = 0; i < np; i++)
				for (int d = 0; d < hd; d++)
					FAIL_IF(out[((size_t)s * t + i) * hidden + (size_t)h * hd + d] != 0.0f,
						Q4_CTX "padding row %d not zero", Q4_ARGS, i);
			for (int i = 0; i < nq; i++) {
				const size_t row = ((size_t)s * rows + np + i) * hidden + (size_t)h * hd;
				ref_attend(qv + row, Kh, Vh, prefill ? i + 1 : nk, hd, p, o, tol);
				for (int j = 0; j < (prefill ? i + 1 : nk); j++)
					colsum[j] += p[j];
				for (int d = 0; d < hd; d++)
					FAIL_IF(!(fabs(out[row + d] - o[d]) <= tol[d]),
						Q4_CTX "head %d row %d out[%d] = %.9g, want %.9g (tol %.3g)",
						Q4_ARGS, h, i, d, (double)out[row + d], o[d], tol[d]);
			}
			if (!score)
				continue;
			for (int j = 0; j < cap; j++) {
				const size_t si = (size_t)(s * nh + h) * cap + j;
				const double want = j < nk ? score0[si] + colsum[j] : score0[si];
				FAIL_IF(!(fabs(score[si] - want) <= 1e-5 * want),
					Q4_CTX "head %d score slot %d = %.9g, want %.9g", Q4_ARGS, h, j,
					(double)score[si], want);
			}
		}
#undef Q4_CTX
#undef Q4_ARGS
	free(qv);
	free(kn);
	free(vn);
	free(out);
	free(kc);
	free(vc);
	free(kw);
	free(vw);
	free(K);
	free(V);
	free(score);
	free(score0);
	free(p);
	free(colsum);
	free(o);
	free(tol);
	free(Kh);
	free(Vh);
}

START_TEST(test_attn_q4_prefill)
{
	const attn_case c = q4_case_of(_i, true);
	for (int mode = 0; mode < 4; mode++)
		q4_attn_check(be, qu, &c, mode, true, 9000 + 4 * (uint64_t)_i + mode);
}
END_TEST

START_TEST(test_attn_q4_decode)
{
	const attn_case c = q4_case_of(_i, false);
	for (int mode = 0; mode < 4; mode++)
		q4_attn_check(be, qu, &c, mode, false, 9500 + 4 * (uint64_t)_i + mode);
}
END_TEST

/* kv_f32 and kv_q4 together are refused. */
START_TEST(test_attn_q4_f32_refused)
{
	float x[4] = { 0 }, o[4];
	uint8_t kc[2 * 36], vc[2 * 36];
	int npad[1] = { 0 }, len[1] = { 0 };
	sl_attn_args a = { .nseq = 1, .nh = 1, .hd = 4, .t = 1, .cap = 2, .q = x, .k_new = x,
			   .v_new = x, .out = o, .k_cache = kc, .v_cache = vc, .kv_f32 = true,
			   .kv_q4 = true, .npad = npad, .len = len };
	ck_assert_int_eq(be->ops->attn_prefill(be, qu, &a), SL_EINVAL);
	ck_assert_int_eq(be->ops->attn_decode(be, qu, &a), SL_EINVAL);
}
END_TEST

/*
 * H2O on compressed slots against the reference path: the same op on an
 * fp16 cache with the same scores (its behaviour pinned down by
 * test_h2o_cache_layout and test_h2o).  pos, score and evicted must be
 * identical, and every kept (slot, head) of the compressed cache must hold
 * the bytes (that head's codes and {mn16, scale16}) of the token its pos
 * names: for compact the scratch's slot pos, for evict the slot that held
 * that position before (the new token: slot len).
 */
static void q4_head_bytes(const uint8_t *slot, int nh, int hd, int h, uint8_t *out)
{
	const size_t ng = sl_q4_groups((size_t)hd), cb = ng * SL_Q4_CODE_BYTES,
		     mb = ng * SL_Q4_META_BYTES;
	memcpy(out, slot + (size_t)h * cb, cb);
	memcpy(out + cb, slot + (size_t)nh * cb + (size_t)h * mb, mb);
}

START_TEST(test_h2o_q4)
{
	static const int hds[] = { 8, 64, 100 };
	const int nseq = 3, nh = 1 + _i % 3, hd = hds[_i / 3 % 3], cap_in = 20;
	const int H = 3, R = 2, cap = H + R + 1;
	rng r = rng_seed(9900 + (uint64_t)_i);
	const size_t sb = sl_q4_bytes((size_t)nh, (size_t)hd);
	const size_t hb = sl_q4_groups((size_t)hd) * (SL_Q4_CODE_BYTES + SL_Q4_META_BYTES);
	const size_t hidden = (size_t)nh * hd, nsc_in = (size_t)nseq * nh * cap_in,
		     nsc = (size_t)nseq * nh * cap;
	uint8_t *ks = xmalloc((size_t)nseq * cap_in * sb), *vs = xmalloc((size_t)nseq * cap_in * sb);
	uint8_t *kc = xmalloc((size_t)nseq * cap * sb), *vc = xmalloc((size_t)nseq * cap * sb);
	sl_half *hs = xmalloc(sizeof(sl_half) * (size_t)nseq * cap_in * hidden);
	sl_half *hc = xmalloc(sizeof(sl_half) * (size_t)nseq * cap * hidden);
	float *ssrc = xmalloc(sizeof(float) * nsc_in), *row = xmalloc(sizeof(float) * hidden);
	double *deq = xmalloc(sizeof(double) * hidden);
	for (size_t j = 0; j < (size_t)nseq * cap_in; j++) {
		for (size_t e = 0; e < hidden; e++)
			row[e] = rng_unif(&r);
		q4_ref_slot(row, nh, hd, ks + j * sb, deq);
		for (size_t e = 0; e < hidden; e++)
			row[e] = rng_unif(&r);
		q4_ref_slot(row, nh, hd, vs + j * sb, deq);
		for (size_t e = 0; e < hidden; e++)
			hs[j * hidden + e] = (sl_half)rng_u32(&r);
	}
	for (size_t i = 0; i < nsc_in; i++)
		ssrc[i] = (float)rng_int(&r, 6) * 0.25f; /* ties */
	float sc_q[18 * 3], sc_h[18 * 3], ev_q[9] = { 0 }, ev_h[9] = { 0 };
	int32_t pos_q[18 * 3], pos_h[18 * 3];
	memset(kc, 0xa5, (size_t)nseq * cap * sb);
	memset(vc, 0xa5, (size_t)nseq * cap * sb);
	int n[3] = { 4, 20, 9 }, heavy[3] = { H, H, H }, recent[3] = { R, R, R };
	sl_h2o_args a = { .nseq = nseq, .nh = nh, .hd = hd, .kv_q4 = true, .k_src = ks, .v_src = vs,
			  .score_src = ssrc, .cap_in = cap_in, .k_cache = kc, .v_cache = vc,
			  .score = sc_q, .pos = pos_q, .cap = cap, .n = n, .heavy = heavy,
			  .recent = recent, .evicted = ev_q };
	sl_h2o_args ah = a;
	ah.kv_q4 = false;
	ah.k_src = ah.v_src = hs;
	ah.k_cache = ah.v_cache = hc;
	ah.score = sc_h;
	ah.pos = pos_h;
	ah.evicted = ev_h;
	ck_assert_int_eq(be->ops->h2o_compact(be, qu, &a), 0);
	ck_assert_int_eq(be->ops->h2o_compact(be, qu, &ah), 0);
	ck_assert(!memcmp(pos_q, pos_h, sizeof(int32_t) * nsc));
	ck_assert(!memcmp(sc_q, sc_h, sizeof(float) * nsc));
	ck_assert(!memcmp(ev_q, ev_h, sizeof(float) * (size_t)nseq * nh));
	uint8_t *got = xmalloc(hb), *want = xmalloc(hb);
	for (int s = 0; s < nseq; s++)
		for (int h = 0; h < nh; h++)
			for (int j = 0; j < SL_MIN(n[s], H + R); j++) {
				const int p = pos_q[(s * nh + h) * cap + j];
				ck_assert(p >= 0 && p < n[s]);
				for (int kv = 0; kv < 2; kv++) {
					q4_head_bytes((kv ? vc : kc) + ((size_t)s * cap + j) * sb, nh, hd, h, got);
					q4_head_bytes((kv ? vs : ks) + ((size_t)s * cap_in + p) * sb, nh, hd, h, want);
					FAIL_IF(memcmp(got, want, hb), "h2o_compact q4 nh=%d hd=%d: seq %d head %d slot %d is not token %d",
						nh, hd, s, h, j, p);
				}
			}

	/* evict: the new token in slot len (all heads), fresh scores */
	int len[3], cur[3];
	uint8_t *before_k = xmalloc((size_t)nseq * cap * sb), *before_v = xmalloc((size_t)nseq * cap * sb);
	int32_t pos_before[18 * 3];
	for (int s = 0; s < nseq; s++) {
		len[s] = SL_MIN(n[s], H + R);
		cur[s] = n[s];
		for (size_t e = 0; e < hidden; e++)
			row[e] = rng_unif(&r);
		q4_ref_slot(row, nh, hd, kc + ((size_t)s * cap + len[s]) * sb, deq);
		q4_ref_slot(row, nh, hd, vc + ((size_t)s * cap + len[s]) * sb, deq);
	}
	for (size_t i = 0; i < nsc; i++)
		sc_q[i] = sc_h[i] = (float)rng_int(&r, 4) * 0.5f;
	memcpy(before_k, kc, (size_t)nseq * cap * sb);
	memcpy(before_v, vc, (size_t)nseq * cap * sb);
	memcpy(pos_before, pos_q, sizeof pos_before);
	a.len = ah.len = len;
	a.cur = ah.cur = cur;
	ck_assert_int_eq(be->ops->h2o_evict(be, qu, &a), 0);
	ck_assert_int_eq(be->ops->h2o_evict(be, qu, &ah), 0);
	ck_assert(!memcmp(pos_q, pos_h, sizeof(int32_t) * nsc));
	ck_assert(!memcmp(sc_q, sc_h, sizeof(float) * nsc));
	ck_assert(!memcmp(ev_q, ev_h, sizeof(float) * (size_t)nseq * nh));
	for (int s = 0; s < nseq; s++)
		for (int h = 0; h < nh; h++)
			for (int j = 0; j < cap; j++) {
				const int p = pos_q[(s * nh + h) * cap + j];
				if (p < 0)
					continue;
				int from = p == cur[s] ? len[s] : -1;
				for (int k = 0; k < len[s] && from < 0; k++)
					if (pos_before[(s * nh + h) * cap + k] == p)
						from = k;
				ck_assert(from >= 0);
				for (int kv = 0; kv < 2; kv++) {
					q4_head_bytes((kv ? vc : kc) + ((size_t)s * cap + j) * sb, nh, hd, h, got);
					q4_head_bytes((kv ? before_v : before_k) + ((size_t)s * cap + from) * sb, nh, hd, h, want);
					FAIL_IF(memcmp(got, want, hb), "h2o_evict q4 nh=%d hd=%d: seq %d head %d slot %d is not position %d",
						nh, hd, s, h, j, p);
				}
			}
	free(ks);
	free(vs);
	free(kc);
	free(vc);
	free(hs);
	free(hc);
	free(ssrc);
	free(row);
	free(deq);
	free(got);
	free(want);
	free(before_k);
	free(before_v);
}
END_TEST

/* ---- grouped-query attention -------------------------------------------------- */

/*
 * nh = 8 query heads over nkv KV heads (backend.h: query head h reads KV
 * head h / (nh / nkv); q and out have nh heads per row, k_new, v_new, the
 * cache and the score nkv), against a plain reference written here: the
 * values the cache must hold are expanded to nh heads by repeat_kv, plain
 * multi-head attention runs over them, and each KV head's score is the
 * sum over its group of the query heads' probabilities.  Three sequences,
 * left padding (one sequence with a single real row) or cached lengths
 * (one empty), for fp16, fp32 and sl_q4 caches, with and without a score.
 */
enum { GQA_NH = 8, GQA_NSEQ = 3, GQA_T = 9 };
static const int gqa_nkv[] = { 1, 2, 4, 8 }, gqa_hd[] = { 64, 7 };
#define GQA_CASES 96 /* 4 nkv x 2 hd x 3 caches x 2 score x 2 (prefill, decode) */

typedef struct gqa_case {
	int nkv, hd;
	int cache; /* 0 fp16, 1 fp32, 2 q4 */
	bool score, prefill;
} gqa_case;

static gqa_case gqa_case_of(int i)
{
	gqa_case c;
	c.prefill = i & 1;
	c.score = (i >> 1) & 1;
	i >>= 2;
	c.cache = i % 3;
	i /= 3;
	c.hd = gqa_hd[i % 2];
	c.nkv = gqa_nkv[i / 2];
	return c;
}

/* The bytes a slot (all kvh heads) must hold for the fp32 row, and the
 * values attention must read from it (kvh * hd). */
static void gqa_ref_slot(int cache, const float *row, int kvh, int hd, uint8_t *slot, double *deq)
{
	const size_t n = (size_t)kvh * hd;
	if (cache == 2) {
		q4_ref_slot(row, kvh, hd, slot, deq);
		return;
	}
	for (size_t e = 0; e < n; e++) {
		if (cache == 1) {
			memcpy(slot + 4 * e, &row[e], 4);
			deq[e] = row[e];
		} else {
			const uint16_t h = ref_f2h(row[e]);
			memcpy(slot + 2 * e, &h, 2);
			deq[e] = ref_half(h);
		}
	}
}

static void gqa_check(sl_backend *b, sl_queue *q, const gqa_case *c, uint64_t seed)
{
	const int nseq = GQA_NSEQ, nh = GQA_NH, nkv = c->nkv, hd = c->hd, grp = nh / nkv;
	const int hidden = nh * hd, kvw = nkv * hd;
	const int t = c->prefill ? GQA_T : 1;
	const int npad[GQA_NSEQ] = { 0, GQA_T - 1, 3 }, len[GQA_NSEQ] = { 5, 0, 11 };
	const int cap = c->prefill ? GQA_T + 2 : 13;
	const size_t sb = sl_kv_slot_bytes(nkv, hd, c->cache == 1, c->cache == 2);
	const size_t ncache = (size_t)nseq * cap * sb, nscore = (size_t)nseq * nkv * cap;
	rng r = rng_seed(seed);
	float *qv = xmalloc(sizeof(float) * nseq * t * hidden), *out = xmalloc(sizeof(float) * nseq * t * hidden);
	float *kn = xmalloc(sizeof(float) * nseq * t * kvw), *vn = xmalloc(sizeof(float) * nseq * t * kvw);
	uint8_t *kc = xmalloc(ncache), *vc = xmalloc(ncache), *kw = xmalloc(ncache), *vw = xmalloc(ncache);
	/* what attention must read: (nseq, cap, nkv, hd) */
	double *K = xmalloc(sizeof(double) * nseq * cap * kvw), *V = xmalloc(sizeof(double) * nseq * cap * kvw);
	float *score = c->score ? xmalloc(sizeof(float) * nscore) : NULL;
	float *score0 = xmalloc(sizeof(float) * nscore), *row = xmalloc(sizeof(float) * kvw);
	const float qs = (float)(1.0 / sqrt(hd));
	/* NaN in every format (fp16, fp32, q4's mn16): a read of an unwritten
	 * slot shows */
	memset(kc, 0xff, ncache);
	memset(vc, 0xff, ncache);
	for (int s = 0; s < nseq; s++)
		for (int i = 0; i < t; i++) {
			const bool pad = c->prefill && i < npad[s]; /* garbage never to be used */
			for (int e = 0; e < hidden; e++) {
				qv[((size_t)s * t + i) * hidden + e] = pad ? 50.0f + rng_unif(&r) : rng_unif(&r) * qs;
				out[((size_t)s * t + i) * hidden + e] = bitsf(POISON_F32);
			}
			for (int e = 0; e < kvw; e++) {
				kn[((size_t)s * t + i) * kvw + e] = pad ? 70.0f + rng_unif(&r) : rng_unif(&r);
				vn[((size_t)s * t + i) * kvw + e] = pad ? 90.0f + rng_unif(&r) : rng_unif(&r);
			}
		}
	if (!c->prefill) /* slots [0, len) hold earlier tokens */
		for (int s = 0; s < nseq; s++)
			for (int j = 0; j < len[s]; j++)
				for (int kv = 0; kv < 2; kv++) {
					const size_t o = (size_t)s * cap + j;
					for (int e = 0; e < kvw; e++)
						row[e] = rng_unif(&r);
					gqa_ref_slot(c->cache, row, nkv, hd, (kv ? vc : kc) + o * sb,
						     (kv ? V : K) + o * kvw);
				}
	memcpy(kw, kc, ncache);
	memcpy(vw, vc, ncache);
	/* the new rows: where they must land, what attention must read */
	for (int s = 0; s < nseq; s++) {
		const int first = c->prefill ? 0 : len[s], nr = c->prefill ? t - npad[s] : 1;
		for (int i = 0; i < nr; i++) {
			const size_t src = ((size_t)s * t + (c->prefill ? npad[s] + i : 0)) * kvw;
			const size_t o = (size_t)s * cap + first + i;
			gqa_ref_slot(c->cache, kn + src, nkv, hd, kw + o * sb, K + o * kvw);
			gqa_ref_slot(c->cache, vn + src, nkv, hd, vw + o * sb, V + o * kvw);
		}
	}
	for (size_t i = 0; i < nscore; i++)
		score0[i] = 1.0f + 0.25f * (float)(i % 7);
	if (score)
		memcpy(score, score0, sizeof(float) * nscore);

	sl_attn_args a = { .nseq = nseq, .nh = nh, .nkv = nkv, .hd = hd, .t = t, .cap = cap,
			   .q = qv, .k_new = kn, .v_new = vn, .out = out, .k_cache = kc, .v_cache = vc,
			   .kv_f32 = c->cache == 1, .kv_q4 = c->cache == 2,
			   .npad = c->prefill ? npad : NULL, .len = c->prefill ? NULL : len,
			   .score = score };
	int rc = c->prefill ? b->ops->attn_prefill(b, q, &a) : b->ops->attn_decode(b, q, &a);
	ck_assert_msg(rc == 0, "gqa attn: rc %d (%s)", rc, sl_errmsg());

#define GQ_CTX "gqa %s nh=%d nkv=%d hd=%d cache=%d score=%d seq %d: "
#define GQ_ARGS c->prefill ? "prefill" : "decode", nh, nkv, hd, c->cache, c->score, s
	/* (1) the cache: the new rows' bytes in their slots, nothing else
	 * written (the KV heads only: a slot is sb bytes) */
	for (int s = 0; s < nseq; s++)
		for (int j = 0; j < cap; j++) {
			const size_t o = ((size_t)s * cap + j) * sb;
			FAIL_IF(memcmp(kc + o, kw + o, sb) || memcmp(vc + o, vw + o, sb),
				GQ_CTX "slot %d holds other bytes than the reference's", GQ_ARGS, j);
		}
	/* (2) repeat_kv: the cache's values expanded to nh heads,
	 * (nseq, cap, nh, hd) */
	double *Kx = xmalloc(sizeof(double) * nseq * cap * hidden), *Vx = xmalloc(sizeof(double) * nseq * cap * hidden);
	for (int s = 0; s < nseq; s++)
		for (int j = 0; j < cap; j++)
			for (int h = 0; h < nh; h++)
				for (int d = 0; d < hd; d++) {
					const size_t to = (((size_t)s * cap + j) * nh + h) * hd + d;
					const size_t from = (((size_t)s * cap + j) * nkv + h / grp) * hd + d;
					Kx[to] = K[from];
					Vx[to] = V[from];
				}
	/* (3) multi-head attention over them, per query head; its scores
	 * (nseq, nh, cap) summed over each group afterwards */
	double *colsum = xmalloc(sizeof(double) * nseq * nh * cap);
	double *Kh = xmalloc(sizeof(double) * cap * hd), *Vh = xmalloc(sizeof(double) * cap * hd);
	double *p = xmalloc(sizeof(double) * cap), *o = xmalloc(sizeof(double) * hd), *tol = xmalloc(sizeof(double) * hd);
	for (size_t i = 0; i < (size_t)nseq * nh * cap; i++)
		colsum[i] = 0;
	for (int s = 0; s < nseq; s++)
		for (int h = 0; h < nh; h++) {
			const int np = c->prefill ? npad[s] : 0, nq = c->prefill ? t - np : 1;
			const int nk = c->prefill ? nq : len[s] + 1;
			for (int j = 0; j < nk; j++)
				for (int d = 0; d < hd; d++) {
					const size_t e = (((size_t)s * cap + j) * nh + h) * hd + d;
					Kh[(size_t)j * hd + d] = Kx[e];
					Vh[(size_t)j * hd + d] = Vx[e];
				}
			for (int i = 0; i < np; i++)
				for (int d = 0; d < hd; d++)
					FAIL_IF(out[((size_t)s * t + i) * hidden + (size_t)h * hd + d] != 0.0f,
						GQ_CTX "head %d padding row %d not zero", GQ_ARGS, h, i);
			for (int i = 0; i < nq; i++) {
				const size_t rw = ((size_t)s * t + np + i) * hidden + (size_t)h * hd;
				const int nki = c->prefill ? i + 1 : nk;
				ref_attend(qv + rw, Kh, Vh, nki, hd, p, o, tol);
				for (int j = 0; j < nki; j++)
					colsum[((size_t)s * nh + h) * cap + j] += p[j];
				for (int d = 0; d < hd; d++)
					FAIL_IF(!(fabs(out[rw + d] - o[d]) <= tol[d]),
						GQ_CTX "head %d row %d out[%d] = %.9g, want %.9g (tol %.3g)",
						GQ_ARGS, h, i, d, (double)out[rw + d], o[d], tol[d]);
			}
		}
	/* (4) the score per KV head: the group's sum added, other slots kept */
	for (int s = 0; score && s < nseq; s++)
		for (int g = 0; g < nkv; g++)
			for (int j = 0; j < cap; j++) {
				const size_t si = ((size_t)s * nkv + g) * cap + j;
				const int nk = c->prefill ? t - npad[s] : len[s] + 1;
				if (j >= nk) {
					FAIL_IF(fbits(score[si]) != fbits(score0[si]),
						GQ_CTX "KV head %d score slot %d past the tokens changed", GQ_ARGS, g, j);
					continue;
				}
				double want = score0[si];
				for (int h = g * grp; h < (g + 1) * grp; h++)
					want += colsum[((size_t)s * nh + h) * cap + j];
				FAIL_IF(!(fabs(score[si] - want) <= 1e-5 * want),
					GQ_CTX "KV head %d score slot %d = %.9g, want %.9g", GQ_ARGS, g, j,
					(double)score[si], want);
			}
#undef GQ_CTX
#undef GQ_ARGS
	free(qv), free(out), free(kn), free(vn), free(kc), free(vc), free(kw), free(vw);
	free(K), free(V), free(score), free(score0), free(row), free(Kx), free(Vx);
	free(colsum), free(Kh), free(Vh), free(p), free(o), free(tol);
}

START_TEST(test_attn_gqa)
{
	const gqa_case c = gqa_case_of(_i);
	gqa_check(be, qu, &c, 12000 + 2 * (uint64_t)_i);
	gqa_check(be_scalar, qu_scalar, &c, 12001 + 2 * (uint64_t)_i);
}
END_TEST

/* nkv below 0, or not dividing nh, is refused by both ops, naming the op. */
START_TEST(test_attn_gqa_bad_heads)
{
	static const int bad[] = { -1, 3, 5, 16 };
	float act[2 * 8 * 4] = { 0 }, out[2 * 8 * 4];
	sl_half kc[2 * 8 * 4], vc[2 * 8 * 4];
	const int npad[1] = { 0 }, len[1] = { 0 };
	sl_attn_args a = { .nseq = 1, .nh = 8, .nkv = bad[_i], .hd = 4, .t = 2, .cap = 2, .q = act,
			   .k_new = act, .v_new = act, .out = out, .k_cache = kc, .v_cache = vc,
			   .npad = npad };
	sl_err_clear();
	ck_assert_int_eq(be->ops->attn_prefill(be, qu, &a), SL_EINVAL);
	ck_assert_msg(strstr(sl_errmsg(), "attn_prefill") && strstr(sl_errmsg(), "KV heads"),
		      "%s", sl_errmsg());
	a.t = 1;
	a.npad = NULL;
	a.len = len;
	sl_err_clear();
	ck_assert_int_eq(be->ops->attn_decode(be, qu, &a), SL_EINVAL);
	ck_assert_msg(strstr(sl_errmsg(), "attn_decode") && strstr(sl_errmsg(), "KV heads"),
		      "%s", sl_errmsg());
}
END_TEST

/* ---- argmax ------------------------------------------------------------------ */

static const int am_rows[] = { 1, 4, 37 };
static const int am_ns[] = { 1, 2, 7, 1000, 50272 };
#define ARGMAX_CASES ((int)(SL_ARRAY_LEN(am_rows) * SL_ARRAY_LEN(am_ns)) * 2)
#define ARGMAX_KINDS 9

/* Row kinds: random; a tied maximum; NaNs (index 0 among them) around
 * random values; all equal; NaNs with -inf the only numbers; -0 and +0 as
 * the maximum; +inf twice; NaN last and around the maximum; -inf once
 * among numbers.  A row that holds a NaN or an infinity gives -1. */
static void argmax_row(rng *r, float *x, int n, int kind)
{
	for (int i = 0; i < n; i++)
		x[i] = rng_unif(r);
	const int p0 = rng_int(r, n), p1 = p0 + (n - p0 > 1 ? 1 + rng_int(r, n - p0 - 1) : 0);
	switch (kind) {
	case 1: /* the maximum at p0 and p1 (and maybe between) */
		x[p0] = x[p1] = 2.0f;
		if (p1 - p0 > 1)
			x[p0 + 1 + rng_int(r, p1 - p0 - 1)] = 2.0f;
		break;
	case 2: /* NaN at index 0 and at ~1/8 of the rest, one number kept */
		for (int i = 0; i < n; i++)
			if (i == 0 || rng_int(r, 8) == 0)
				x[i] = NAN;
		if (n > 1)
			x[1 + rng_int(r, n - 1)] = 0.5f;
		else
			x[0] = 0.5f;
		break;
	case 3: /* all equal */
		for (int i = 0; i < n; i++)
			x[i] = 0.25f;
		break;
	case 4: /* NaN everywhere but -inf at p0 and p1 */
		for (int i = 0; i < n; i++)
			x[i] = NAN;
		x[p0] = x[p1] = -INFINITY;
		break;
	case 5: /* all negative, then -0 and +0 (either order) at p0 < p1 */
		for (int i = 0; i < n; i++)
			x[i] = -fabsf(x[i]) - 0.001f;
		x[p0] = rng_int(r, 2) ? -0.0f : 0.0f;
		if (p1 != p0)
			x[p1] = signbit(x[p0]) ? 0.0f : -0.0f;
		break;
	case 6: /* +inf twice */
		x[p0] = x[p1] = INFINITY;
		break;
	case 7: /* NaN at the end and around the maximum */
		x[n - 1] = NAN;
		if (p0 != n - 1) {
			x[p0] = 3.0f;
			if (p0 > 0)
				x[p0 - 1] = NAN;
		}
		break;
	case 8: /* -inf once */
		x[p1] = -INFINITY;
		break;
	}
}

START_TEST(test_argmax)
{
	const int rows = am_rows[_i / 10], n = am_ns[_i / 2 % 5];
	const int ldx = (_i & 1) ? n + 5 : n;
	rng r = rng_seed(8000 + (uint64_t)_i);
	float *x = xmalloc(sizeof(float) * (size_t)rows * ldx);
	int32_t *out = xmalloc(sizeof(int32_t) * (size_t)(rows + 1));
	for (int i = 0; i < rows; i++) {
		float *xr = x + (size_t)i * ldx;
		argmax_row(&r, xr, n, (i + _i) % ARGMAX_KINDS);
		for (int j = n; j < ldx; j++)
			xr[j] = INFINITY; /* the stride gap would win if read */
	}
	for (int i = 0; i <= rows; i++)
		out[i] = -7;
	int rc = be->ops->argmax(be, qu, rows, n, x, ldx, out);
	ck_assert_int_eq(rc, 0);
	for (int i = 0; i < rows; i++) {
		const float *xr = x + (size_t)i * ldx;
		float mx = xr[0];
		bool finite = true;
		for (int j = 0; j < n; j++) {
			finite = finite && isfinite(xr[j]);
			mx = xr[j] > mx ? xr[j] : mx;
		}
		int want = 0;
		while (finite && !(xr[want] == mx))
			want++;
		if (!finite)
			want = -1;
		FAIL_IF(out[i] != want, "argmax rows=%d n=%d ldx=%d row %d (kind %d): got %d (%g), want %d (%g)",
			rows, n, ldx, i, (i + _i) % ARGMAX_KINDS, out[i],
			out[i] >= 0 && out[i] < n ? (double)xr[out[i]] : 0.0, want, (double)mx);
	}
	ck_assert_msg(out[rows] == -7, "argmax wrote past its rows");
	free(x);
	free(out);
}
END_TEST

/* ---- kernel choice -------------------------------------------------------- */

/* SLUICE_CPU_KERNELS names an instruction set or the backend is refused,
 * saying which variable is wrong. */
/*
 * --cpu-gemm openblas: OpenBLAS's sgemm above the direct kernel's rows,
 * against the same reference as the default GEMM (a rotating seventh of
 * the variants).  A build without OpenBLAS refuses it, naming the option.
 */
START_TEST(test_gemm_openblas)
{
	sl_backend *b = NULL;
	ck_assert_int_eq(sl_backend_create("cpu", 0, &b), 0);
	const int rc = sl_cpu_backend_set_gemm(b, "openblas");
#if defined(SL_HAVE_OPENBLAS) && SL_HAVE_OPENBLAS
	ck_assert_msg(rc == 0, "--cpu-gemm openblas: %s", sl_errmsg());
	ck_assert_str_eq(sl_cpu_backend_gemm(b), "openblas");
	int m, n, k;
	for (int ki = 0; gemm_shape(_i, ki, &m, &n, &k); ki++)
		gemm_check(b, NULL, m, n, k, 9000 + 8 * (uint64_t)_i + (uint64_t)ki, (_i + ki) % 7, 7);
#else
	ck_assert_int_eq(rc, SL_EUNSUPPORTED);
	ck_assert_msg(strstr(sl_errmsg(), "--cpu-gemm openblas: this build has no OpenBLAS"),
		      "message: %s", sl_errmsg());
	ck_assert_str_eq(sl_cpu_backend_gemm(b), "sluice");
#endif
	ck_assert_int_eq(sl_cpu_backend_set_gemm(b, "sluice"), 0);
	ck_assert_str_eq(sl_cpu_backend_gemm(b), "sluice");
	ck_assert_int_eq(sl_cpu_backend_set_gemm(b, "mkl"), SL_EINVAL);
	sl_backend_free(b);
}
END_TEST

/*
 * --cpu-gemm amx and bf16: the products above the direct kernel's rows on
 * AMX tiles, or from 5 rows with AVX512-BF16 dot products, against the
 * reference on bf16-rounded operands (k a multiple of 32; the other shapes
 * fall back on the fp32 kernels and their exact reference), a rotating seventh of the
 * variants; then shapes of several k chunks, row blocks and weight panels
 * with columns past n.  Where the CPU (or for AMX the kernel) lacks them
 * each is refused, saying why.
 */
static const int amx_extra[][3] = { { 40, 300, 2048 }, { 33, 1100, 512 }, { 100, 50, 96 }, { 9, 16, 32 },
				    { 8, 300, 2048 }, { 5, 1100, 96 }, { 6, 50, 512 } };

static void gemm_bf16_case(const char *mode, int i)
{
	const int _i = i;
	char want[64];
	snprintf(want, sizeof want, "--cpu-gemm %s: ", mode);
	sl_backend *b = NULL;
	ck_assert_int_eq(sl_backend_create("cpu", 0, &b), 0);
	const int rc = sl_cpu_backend_set_gemm(b, mode);
	if (rc == SL_EUNSUPPORTED) {
		ck_assert_msg(strstr(sl_errmsg(), want), "message: %s", sl_errmsg());
		ck_assert_str_eq(sl_cpu_backend_gemm(b), "sluice");
		sl_backend_free(b);
		return;
	}
	ck_assert_msg(rc == 0, "--cpu-gemm %s: %s", mode, sl_errmsg());
	ck_assert_str_eq(sl_cpu_backend_gemm(b), mode);
	gemm_ref_bf16 = true;
	gemm_ref_bf16_rows = strcmp(mode, "bf16") ? 9 : 5;
	int m, n, k;
	for (int ki = 0; gemm_shape(_i, ki, &m, &n, &k); ki++)
		gemm_check(b, NULL, m, n, k, 9500 + 8 * (uint64_t)_i + (uint64_t)ki, (_i + ki) % 7, 7);
	if (_i < (int)SL_ARRAY_LEN(amx_extra))
		gemm_check(b, NULL, amx_extra[_i][0], amx_extra[_i][1], amx_extra[_i][2], 9900 + (uint64_t)_i,
			   _i % 3, 3);
	gemm_ref_bf16 = false;
	ck_assert_int_eq(sl_cpu_backend_set_gemm(b, "sluice"), 0);
	ck_assert_str_eq(sl_cpu_backend_gemm(b), "sluice");
	sl_backend_free(b);
}

START_TEST(test_gemm_amx)
{
	gemm_bf16_case("amx", _i);
}
END_TEST

START_TEST(test_gemm_bf16)
{
	gemm_bf16_case("bf16", _i);
}
END_TEST

START_TEST(test_cpu_kernels_env)
{
	const char *old = getenv("SLUICE_CPU_KERNELS");
	char *saved = old ? strdup(old) : NULL;
	sl_backend *b = NULL;
	setenv("SLUICE_CPU_KERNELS", "sse9", 1);
	const int rc = sl_backend_create("cpu", 0, &b);
	char msg[256];
	snprintf(msg, sizeof msg, "%s", sl_errmsg());
	setenv("SLUICE_CPU_KERNELS", "generic", 1);
	sl_backend *g = NULL;
	const int rc_generic = sl_backend_create("cpu", 0, &g);
	if (saved)
		setenv("SLUICE_CPU_KERNELS", saved, 1);
	else
		unsetenv("SLUICE_CPU_KERNELS");
	free(saved);
	ck_assert_int_eq(rc, SL_EINVAL);
	ck_assert_ptr_null(b);
	ck_assert_msg(strstr(msg, "SLUICE_CPU_KERNELS=sse9") != NULL, "message: %s", msg);
	ck_assert_int_eq(rc_generic, 0);
	sl_backend_free(g);
}
END_TEST

/* ---- main ------------------------------------------------------------------- */

int main(int argc, char **argv)
{
	g_rope_fixture = argc > 1 ? argv[1] : NULL;
	if (!cpu_has_hw_half())
		fprintf(stderr, "test_ops: this CPU has no fp16 conversions: they are checked "
				"against the test's reference only, not the hardware\n");
	Suite *s = suite_create("ops");

	TCase *tc = tcase_create("fp16");
	tcase_set_timeout(tc, 300);
	tcase_add_loop_test(tc, test_half_to_float_all, 0, H2F_CHUNKS);
	tcase_add_loop_test(tc, test_float_to_half_edges, 0, N_F2H_CASES);
	tcase_add_test(tc, test_float_to_half_ties);
	tcase_add_loop_test(tc, test_float_to_half_random, 0, F2H_RANDOM_CHUNKS);
	tcase_add_test(tc, test_bf16_to_float_all);
	suite_add_tcase(s, tc);

	tc = tcase_create("gemm");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 300);
	tcase_add_loop_test(tc, test_gemm, 0, GEMM_CASES);
#if defined(__x86_64__) /* elsewhere the default backend is the generic one */
	tcase_add_loop_test(tc, test_gemm_scalar, 0, GEMM_CASES);
#endif
	tcase_add_loop_test(tc, test_gemm_rows_bit_identical, 0, (int)SL_ARRAY_LEN(gemm_inv_cases));
	tcase_add_test(tc, test_gemm_k0);
	tcase_add_loop_test(tc, test_gemm_args, 0, (int)SL_ARRAY_LEN(gemm_arg_cases));
	tcase_add_loop_test(tc, test_gemm_q4, 0, (int)SL_ARRAY_LEN(gemm_q4_cases));
	tcase_add_test(tc, test_gemm_q4_args);
	suite_add_tcase(s, tc);

	tc = tcase_create("layernorm_embed");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 300);
	tcase_add_loop_test(tc, test_layernorm, 0, LN_CASES);
	tcase_add_loop_test(tc, test_embed, 0, EMB_CASES);
	suite_add_tcase(s, tc);

	tc = tcase_create("llama_ops");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 300);
	tcase_add_loop_test(tc, test_rmsnorm, 0, RMS_CASES);
	tcase_add_loop_test(tc, test_rope, 0, (int)SL_ARRAY_LEN(rope_cases));
	tcase_add_test(tc, test_rope_bad_args);
	tcase_add_test(tc, test_rope_inv_freq_formula);
	tcase_add_test(tc, test_rope_inv_freq_transformers);
	tcase_add_loop_test(tc, test_swiglu, 0, SW_CASES);
	suite_add_tcase(s, tc);

	tc = tcase_create("attention");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 300);
	tcase_add_loop_test(tc, test_attn_prefill, 0, PREFILL_CASES);
	tcase_add_loop_test(tc, test_attn_decode, 0, DECODE_CASES);
	tcase_add_loop_test(tc, test_attn_bad_args, 0, (int)SL_ARRAY_LEN(attn_bad_cases));
	tcase_add_loop_test(tc, test_attn_cache_layout, 0, 4);
	tcase_add_loop_test(tc, test_h2o_cache_layout, 0, 4);
	tcase_add_loop_test(tc, test_attn_q4_prefill, 0, Q4_PREFILL_CASES);
	tcase_add_loop_test(tc, test_attn_q4_decode, 0, Q4_DECODE_CASES);
	tcase_add_test(tc, test_attn_q4_f32_refused);
	tcase_add_loop_test(tc, test_h2o_q4, 0, 9);
	tcase_add_loop_test(tc, test_attn_gqa, 0, GQA_CASES);
	tcase_add_loop_test(tc, test_attn_gqa_bad_heads, 0, 4);
	suite_add_tcase(s, tc);

	tc = tcase_create("backend");
	tcase_add_test(tc, test_cpu_kernels_env);
	tcase_add_loop_test(tc, test_gemm_openblas, 0, GEMM_CASES);
	tcase_add_loop_test(tc, test_gemm_amx, 0, GEMM_CASES);
	tcase_add_loop_test(tc, test_gemm_bf16, 0, GEMM_CASES);
	suite_add_tcase(s, tc);

	tc = tcase_create("argmax");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 300);
	tcase_add_loop_test(tc, test_argmax, 0, ARGMAX_CASES);
	suite_add_tcase(s, tc);

	return sl_test_run(s);
}
