/*
 * profile_measure.c - measuring the machine's topology and rates
 * (profile_measure.h) into a profile (policy/profile.h).
 */
#include "profile_measure.h"
#include "backend.h"
#include "cpu/cpu_backend.h"
#include "disk_store.h"
#include "sl_common.h"
#include "sl_config.h"
#include "topology.h"
#include "zseg.h"
#include "sl_hash.h"

#include <errno.h>
#include <math.h>
#include <zstd.h>
#include <omp.h>
#include <pthread.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)

static void say(const sl_profile_opts *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void say(const sl_profile_opts *o, const char *fmt, ...)
{
	if (!o->log)
		return;
	va_list ap;
	va_start(ap, fmt);
	vfprintf(o->log, fmt, ap);
	va_end(ap);
	fflush(o->log);
}

static double gib(uint64_t b)
{
	return (double)b / (double)(1ull << 30);
}

/* ---- inputs -------------------------------------------------------------------- */

int sl_profile_check_offload_dir(const char *dir)
{
	struct stat st;
	if (stat(dir, &st) != 0) {
		if (errno == ENOENT || errno == ENOTDIR)
			return sl_err(SL_ENOTFOUND, "offload directory %s does not exist; create it or use another --offload-dir",
				      dir);
		return sl_err(SL_EIO, "offload directory %s: %s", dir, strerror(errno));
	}
	if (!S_ISDIR(st.st_mode))
		return sl_err(SL_ENOTFOUND, "offload directory %s is not a directory; use another --offload-dir", dir);
	if (access(dir, W_OK | X_OK) != 0)
		return sl_err(SL_EIO, "offload directory %s is not writable (%s); use another --offload-dir", dir,
			      strerror(errno));
	return 0;
}

/* ---- host memory ---------------------------------------------------------------- */

/* Read bandwidth: every thread sums its share of a buffer larger than the
 * caches (64-bit integer adds vectorise and never limit the rate). */
double sl_profile_mem_read_gbps(size_t bytes, int threads)
{
	size_t n = bytes / sizeof(uint64_t);
	uint64_t *buf = sl_aligned_alloc(n * sizeof(uint64_t));
	if (!buf)
		return 0;
	/* first touch by the same threads that read it: pages near them */
#pragma omp parallel for num_threads(threads) schedule(static)
	for (size_t i = 0; i < n; i++)
		buf[i] = i;
	double r[3];
	uint64_t sink = 0;
	for (int rep = 0; rep < 3; rep++) {
		uint64_t s = 0;
		double t0 = sl_now();
#pragma omp parallel for simd num_threads(threads) schedule(static) reduction(+ : s)
		for (size_t i = 0; i < n; i++)
			s += buf[i];
		double dt = sl_now() - t0;
		sink += s;
		r[rep] = dt > 0 ? (double)(n * sizeof(uint64_t)) / dt / 1e9 : 0;
	}
	free(buf);
	/* n(n-1)/2 summed three times: the compiler cannot drop the loop */
	return sink == 3 * ((uint64_t)n * (n - 1) / 2) ? sl_median(r, 3) : 0;
}

/* ---- backends: GEMM and copies -------------------------------------------------- */

/* A sample lasts about this long (quick: a tenth), so that the clock's
 * resolution and a queue's start-up do not show in a short call's time. */
#define SAMPLE_S 0.02

typedef int (*issue_fn)(sl_backend *b, sl_queue *q, const void *arg);

/*
 * Seconds per call of issue(b, q, arg): a warm-up call (synced, timed to
 * size the samples), then 3 samples of as many calls as fill target_s (1
 * to max_calls), issued back to back and ended by one sync; the median.
 */
static int time_calls(sl_backend *b, sl_queue *q, issue_fn issue, const void *arg, double target_s, int max_calls,
		      double *per_call)
{
	*per_call = 0;
	double t0 = sl_now();
	SL_TRY(issue(b, q, arg));
	SL_TRY(sl_queue_sync(b, q));
	const double once = sl_now() - t0;
	int calls = once > 0 ? (int)SL_MIN((double)max_calls, target_s / once) : max_calls;
	calls = SL_MAX(calls, 1);
	double r[3];
	for (int s = 0; s < 3; s++) {
		t0 = sl_now();
		for (int i = 0; i < calls; i++)
			SL_TRY(issue(b, q, arg));
		SL_TRY(sl_queue_sync(b, q));
		r[s] = (sl_now() - t0) / calls;
	}
	*per_call = sl_median(r, 3);
	return 0;
}

/* Fill n floats of a device buffer with small values in [-1, 1] (through
 * a host buffer: device memory may not be host memory). */
static int fill_floats(sl_backend *b, sl_queue *q, float *d, size_t n, float scale)
{
	float *h = malloc(n * sizeof(float));
	if (!h)
		return sl_err(SL_ENOMEM, "profile: out of memory");
	uint64_t st = 0x9e3779b97f4a7c15ull ^ n;
	for (size_t i = 0; i < n; i++) {
		st = st * 6364136223846793005ull + 1442695040888963407ull;
		h[i] = (float)((int)(st >> 40) % 2001 - 1000) / 1000.f * scale;
	}
	int rc = sl_copy_h2d(b, q, d, h, n * sizeof(float));
	if (rc == 0)
		rc = sl_queue_sync(b, q);
	free(h);
	return rc;
}

/*
 * FLOP/s of sl_gemm on b as the model calls it (fp32 x, fp16 w, an fp16
 * bias) at rows ms[0..nm) (increasing), n, k, on q: time_calls for each.
 * q4: the same weights quantised (sl_gemm_args.wq, compress_weight's
 * dequantising GEMM).
 */
/*
 * Copies of the operand a timed call reads, used in turn, so that their
 * bytes together exceed the last-level cache: a model's decode reads each
 * layer's weights (and its KV cache) once a step from memory, not from a
 * cache that a benchmark reading one matrix over and over keeps hot (on
 * this 2-core VM one hot 2048 x 2048 matrix gave 1.5x the GEMM rate at 8
 * rows that opt-125m's decode reached).  The quick profile (tests) keeps
 * one copy.
 */
#define COLD_BYTES (1024 * MIB)

static int ring_copies(size_t bytes, size_t ring)
{
	return bytes >= ring ? 1 : (int)SL_MIN((ring + bytes - 1) / bytes, 1 << 16);
}

/* ncopies copies stride bytes apart, used in turn: ring_next gives the
 * offset of the next. */
typedef struct cold_ring {
	size_t stride;
	int ncopies, next;
} cold_ring;

static size_t ring_next(cold_ring *r)
{
	const size_t off = r->stride * (size_t)r->next;
	r->next = (r->next + 1) % r->ncopies;
	return off;
}

/* A GEMM over the next copy of its weights. */
typedef struct gemm_ring {
	sl_gemm_args a;
	char *w;
	cold_ring ring;
} gemm_ring;

static int issue_gemm_ring(sl_backend *b, sl_queue *q, const void *arg)
{
	gemm_ring *r = (gemm_ring *)arg;
	sl_gemm_args a = r->a;
	void *w = r->w + ring_next(&r->ring);
	if (a.wq)
		a.wq = w;
	else
		a.w = w;
	return sl_gemm(b, q, &a);
}

static int measure_gemms(sl_backend *b, sl_queue *q, const int *ms, int nm, int n, int k, bool q4,
			 size_t ring, double target_s, double *rate)
{
	const int mmax = ms[nm - 1];
	const size_t xb = (size_t)mmax * k * sizeof(float), hb = (size_t)n * k * sizeof(sl_half),
		     wb = q4 ? sl_q4_bytes((size_t)n, (size_t)k) : hb, yb = (size_t)mmax * n * sizeof(float);
	const size_t stride = (wb + 4095) & ~(size_t)4095;
	const int ncopies = ring_copies(stride, ring);
	sl_half *hw = malloc(SL_MAX(hb, wb));
	sl_buf x = { 0 }, w = { 0 }, y = { 0 }, bias = { 0 };
	int rc = 0;
	if (!hw) {
		rc = sl_err(SL_ENOMEM, "profile: out of memory for a %dx%dx%d GEMM", mmax, n, k);
		goto out;
	}
	uint64_t st = 0x2545f4914f6cdd1dull;
	for (size_t i = 0; i < (size_t)n * k; i++) {
		st = st * 6364136223846793005ull + 1442695040888963407ull;
		hw[i] = sl_float_to_half((float)((int)(st >> 40) % 2001 - 1000) / 32000.f);
	}
	if (q4) { /* in place: the quantised form is smaller, and read after */
		void *qb = malloc(wb);
		if (!qb) {
			rc = sl_err(SL_ENOMEM, "profile: out of memory for a %dx%d 4-bit matrix", n, k);
			goto out;
		}
		sl_q4_quantize_matrix(hw, (size_t)n, (size_t)k, qb);
		memcpy(hw, qb, wb);
		free(qb);
	}
	if ((rc = sl_buf_alloc(b, SL_MEM_DEVICE, xb, "profile GEMM x", &x)) < 0 ||
	    (rc = sl_buf_alloc(b, SL_MEM_DEVICE, stride * (size_t)ncopies, "profile GEMM w", &w)) < 0 ||
	    (rc = sl_buf_alloc(b, SL_MEM_DEVICE, yb, "profile GEMM y", &y)) < 0 ||
	    (rc = sl_buf_alloc(b, SL_MEM_DEVICE, (size_t)n * sizeof(sl_half), "profile GEMM bias", &bias)) < 0 ||
	    (rc = fill_floats(b, q, x.p, (size_t)mmax * k, 1.f)) < 0 ||
	    (rc = sl_memset_dev(b, q, bias.p, 0x1c, (size_t)n * sizeof(sl_half))) < 0 ||
	    (rc = sl_queue_sync(b, q)) < 0)
		goto out;
	for (int i = 0; i < ncopies; i++)
		if ((rc = sl_copy_h2d(b, q, (char *)w.p + stride * (size_t)i, hw, wb)) < 0)
			goto out;
	if ((rc = sl_queue_sync(b, q)) < 0)
		goto out;
	for (int i = 0; i < nm; i++) {
		gemm_ring r = { .a = { .m = ms[i], .n = n, .k = k, .x = x.p, .ldx = k, .w = q4 ? NULL : w.p,
				       .wq = q4 ? w.p : NULL, .bias = bias.p, .y = y.p, .ldy = n, .alpha = 1.f },
				.w = w.p, .ring = { .stride = stride, .ncopies = ncopies } };
		double t;
		if ((rc = time_calls(b, q, issue_gemm_ring, &r, target_s, 1 << 16, &t)) < 0)
			goto out;
		rate[i] = t > 0 ? 2.0 * ms[i] * n * k / t : 0;
	}
out:
	sl_buf_free(b, &bias);
	sl_buf_free(b, &y);
	sl_buf_free(b, &w);
	sl_buf_free(b, &x);
	free(hw);
	return rc;
}

/* FLOP/s of sl_gemm on b at (m, n, k), on a queue of its own. */
static int measure_gemm(sl_backend *b, int m, int n, int k, double target_s, double *rate)
{
	*rate = 0;
	sl_queue *q = NULL;
	int rc = sl_queue_create(b, &q);
	if (rc == 0)
		rc = measure_gemms(b, q, &m, 1, n, k, false, 0, target_s, rate);
	if (q)
		sl_queue_free(b, q);
	return rc;
}

/* Pinned host <-> device copies of bytes, median of 3 each way. */
static int measure_copies(sl_backend *b, size_t bytes, double *h2d, double *d2h)
{
	*h2d = *d2h = 0;
	sl_buf hb = { 0 }, db = { 0 };
	void *h = NULL, *d = NULL;
	sl_queue *q = NULL;
	int rc;
	if ((rc = sl_buf_alloc(b, SL_MEM_HOST, bytes, "profile copies", &hb)) < 0 ||
	    (rc = sl_buf_alloc(b, SL_MEM_DEVICE, bytes, "profile copies", &db)) < 0 ||
	    (rc = sl_queue_create(b, &q)) < 0)
		goto out;
	h = hb.p;
	d = db.p;
	memset(h, 0x5a, bytes);
	if ((rc = sl_copy_h2d(b, q, d, h, bytes)) < 0 || (rc = sl_copy_d2h(b, q, h, d, bytes)) < 0 ||
	    (rc = sl_queue_sync(b, q)) < 0) /* warm-up */
		goto out;
	double r[2][3];
	for (int dir = 0; dir < 2; dir++)
		for (int s = 0; s < 3; s++) {
			double t0 = sl_now();
			rc = dir == 0 ? sl_copy_h2d(b, q, d, h, bytes) : sl_copy_d2h(b, q, h, d, bytes);
			if (rc < 0 || (rc = sl_queue_sync(b, q)) < 0)
				goto out;
			double dt = sl_now() - t0;
			r[dir][s] = dt > 0 ? (double)bytes / dt / 1e9 : 0;
		}
	*h2d = sl_median(r[0], 3);
	*d2h = sl_median(r[1], 3);
out:
	if (q)
		sl_queue_free(b, q);
	sl_buf_free(b, &db);
	sl_buf_free(b, &hb);
	return rc;
}

/* ---- latencies: a stream of tiny calls ------------------------------------------ */

typedef struct copy_arg {
	void *dst;
	const void *src;
	size_t n;
} copy_arg;

static int issue_copy(sl_backend *b, sl_queue *q, const void *arg)
{
	const copy_arg *c = arg;
	return sl_copy_h2d(b, q, c->dst, c->src, c->n);
}

/* ---- the CPU backend: copies beside GEMMs on shared cores ------------------------ */

#define OVL_M 16
#define OVL_NK 2048
#define OVL_COPY (8u << 20)

typedef struct ovl_gemm {
	sl_buf x, w, y;
	sl_queue *q;
	sl_gemm_args g;
} ovl_gemm;

static void ovl_gemm_free(sl_backend *b, ovl_gemm *o)
{
	if (o->q)
		sl_queue_free(b, o->q);
	sl_buf_free(b, &o->y);
	sl_buf_free(b, &o->w);
	sl_buf_free(b, &o->x);
}

/* Decode-sized GEMMs (m = 16, n = k = 2048, fp16 weights) on a queue of their own. */
static int ovl_gemm_make(sl_backend *b, ovl_gemm *o)
{
	memset(o, 0, sizeof *o);
	const size_t xb = (size_t)OVL_M * OVL_NK * sizeof(float), wb = (size_t)OVL_NK * OVL_NK * sizeof(sl_half);
	int rc;
	if ((rc = sl_buf_alloc(b, SL_MEM_DEVICE, xb, "profile overlap x", &o->x)) < 0 ||
	    (rc = sl_buf_alloc(b, SL_MEM_DEVICE, wb, "profile overlap w", &o->w)) < 0 ||
	    (rc = sl_buf_alloc(b, SL_MEM_DEVICE, xb, "profile overlap y", &o->y)) < 0 ||
	    (rc = sl_queue_create(b, &o->q)) < 0 || (rc = fill_floats(b, o->q, o->x.p, (size_t)OVL_M * OVL_NK, 1.f)) < 0 ||
	    (rc = sl_memset_dev(b, o->q, o->w.p, 0x2c, wb)) < 0 || (rc = sl_queue_sync(b, o->q)) < 0) {
		ovl_gemm_free(b, o);
		return rc;
	}
	o->g = (sl_gemm_args){ .m = OVL_M, .n = OVL_NK, .k = OVL_NK, .x = o->x.p, .ldx = OVL_NK, .w = o->w.p,
			       .y = o->y.p, .ldy = OVL_NK, .alpha = 1.f };
	return 0;
}

/* Seconds for ng GEMMs on qg and nc copies on qc, issued together (either
 * count may be 0), to both queues' completion. */
static int time_both(sl_backend *b, sl_queue *qg, const sl_gemm_args *g, int ng, sl_queue *qc,
		     const copy_arg *c, int nc, double *sec)
{
	const double t0 = sl_now();
	for (int i = 0; i < SL_MAX(ng, nc); i++) {
		if (i < ng)
			SL_TRY(sl_gemm(b, qg, g));
		if (i < nc)
			SL_TRY(sl_copy_h2d(b, qc, c->dst, c->src, c->n));
	}
	SL_TRY(sl_queue_sync(b, qg));
	SL_TRY(sl_queue_sync(b, qc));
	*sec = sl_now() - t0;
	return 0;
}

/*
 * The share of a copy stream that hides under a GEMM stream on the CPU
 * backend (profile.h, copy_overlap): the GEMMs alone, the copies alone
 * (their count chosen so that both take about as long), then both at once;
 * (alone + alone - together) / the shorter, median of 5 (a difference of
 * three timings: noisier than one), clamped to [0, 1].
 */
static int measure_overlap(sl_backend *b, double target_s, double *share)
{
	*share = 0;
	ovl_gemm o;
	SL_TRY(ovl_gemm_make(b, &o));
	sl_buf src = { 0 }, dst = { 0 };
	sl_queue *qg = o.q, *qc = NULL;
	const sl_gemm_args g = o.g;
	int rc;
	if ((rc = sl_buf_alloc(b, SL_MEM_HOST, OVL_COPY, "profile overlap copy", &src)) < 0 ||
	    (rc = sl_buf_alloc(b, SL_MEM_DEVICE, OVL_COPY, "profile overlap copy", &dst)) < 0 ||
	    (rc = sl_queue_create(b, &qc)) < 0)
		goto out;
	memset(src.p, 0x3c, OVL_COPY);
	const copy_arg c = { .dst = dst.p, .src = src.p, .n = OVL_COPY };
	/* size the streams: the GEMMs to about 10 x target from a warm call,
	 * then the copies to take as long, from a timed stream of each */
	double tg1, tc1;
	if ((rc = time_both(b, qg, &g, 1, qc, &c, 0, &tg1)) < 0 || (rc = time_both(b, qg, &g, 0, qc, &c, 1, &tc1)) < 0)
		goto out;
	const int ng = (int)SL_MAX(4.0, SL_MIN(4096.0, 10 * target_s / SL_MAX(tg1, 1e-6)));
	int nc = (int)SL_MAX(1.0, SL_MIN(4096.0, ng * tg1 / SL_MAX(tc1, 1e-6)));
	double tgs, tcs;
	if ((rc = time_both(b, qg, &g, ng, qc, &c, 0, &tgs)) < 0 || (rc = time_both(b, qg, &g, 0, qc, &c, nc, &tcs)) < 0)
		goto out;
	nc = (int)SL_MAX(1.0, SL_MIN(8192.0, nc * tgs / SL_MAX(tcs, 1e-9)));
	double r[5];
	for (int s = 0; s < 5; s++) {
		double tg, tc, tb;
		if ((rc = time_both(b, qg, &g, ng, qc, &c, 0, &tg)) < 0 ||
		    (rc = time_both(b, qg, &g, 0, qc, &c, nc, &tc)) < 0 ||
		    (rc = time_both(b, qg, &g, ng, qc, &c, nc, &tb)) < 0)
			goto out;
		const double v = (tg + tc - tb) / SL_MAX(SL_MIN(tg, tc), 1e-9);
		r[s] = SL_MAX(0.0, SL_MIN(1.0, v));
	}
	*share = sl_median(r, 5);
out:
	if (qc)
		sl_queue_free(b, qc);
	sl_buf_free(b, &dst);
	sl_buf_free(b, &src);
	ovl_gemm_free(b, &o);
	return rc;
}

typedef struct ln_arg {
	int n;
	float *x;
	const sl_half *g;
} ln_arg;

static int issue_layernorm(sl_backend *b, sl_queue *q, const void *arg)
{
	const ln_arg *l = arg;
	return sl_layernorm(b, q, 1, l->n, l->x, l->n, l->g, l->g, 1e-5f, l->x, l->n);
}

#define LAT_COPY_BYTES 4096
#define LAT_LN_N 64

/* Microseconds per 4 KiB h2d copy and per 1-row layernorm, each in a
 * stream of them on q ended by one sync. */
static int measure_latencies(sl_backend *b, sl_queue *q, double target_s, double *copy_us, double *op_us)
{
	sl_buf h = { 0 }, d = { 0 }, g = { 0 }, x = { 0 };
	int rc;
	double t;
	if ((rc = sl_buf_alloc(b, SL_MEM_HOST, LAT_COPY_BYTES, "profile latency", &h)) < 0 ||
	    (rc = sl_buf_alloc(b, SL_MEM_DEVICE, LAT_COPY_BYTES, "profile latency", &d)) < 0 ||
	    (rc = sl_buf_alloc(b, SL_MEM_DEVICE, LAT_LN_N * sizeof(sl_half), "profile latency", &g)) < 0 ||
	    (rc = sl_buf_alloc(b, SL_MEM_DEVICE, LAT_LN_N * sizeof(float), "profile latency", &x)) < 0)
		goto out;
	memset(h.p, 0x3c, LAT_COPY_BYTES);
	const copy_arg c = { .dst = d.p, .src = h.p, .n = LAT_COPY_BYTES };
	if ((rc = time_calls(b, q, issue_copy, &c, target_s, 20000, &t)) < 0)
		goto out;
	*copy_us = t * 1e6;
	if ((rc = sl_memset_dev(b, q, g.p, 0x3c, LAT_LN_N * sizeof(sl_half))) < 0 ||
	    (rc = fill_floats(b, q, x.p, LAT_LN_N, 1.f)) < 0)
		goto out;
	const ln_arg l = { .n = LAT_LN_N, .x = x.p, .g = g.p };
	if ((rc = time_calls(b, q, issue_layernorm, &l, target_s, 20000, &t)) < 0)
		goto out;
	*op_us = t * 1e6;
out:
	sl_buf_free(b, &x);
	sl_buf_free(b, &g);
	sl_buf_free(b, &d);
	sl_buf_free(b, &h);
	return rc;
}

/* ---- attention -------------------------------------------------------------------- */

/* The shapes: an OPT-125m-like layer (12 heads of 64). */
#define ATTN_NH 12
#define ATTN_HD 64

/* A decode attention over the next copy of its K and V caches. */
typedef struct attn_ring {
	sl_attn_args a;
	char *k, *v;
	cold_ring ring;
} attn_ring;

static int issue_decode_ring(sl_backend *b, sl_queue *q, const void *arg)
{
	attn_ring *r = (attn_ring *)arg;
	sl_attn_args a = r->a;
	const size_t off = ring_next(&r->ring);
	a.k_cache = r->k + off;
	a.v_cache = r->v + off;
	return sl_attn_decode(b, q, &a);
}

static int issue_prefill(sl_backend *b, sl_queue *q, const void *arg)
{
	return sl_attn_prefill(b, q, arg);
}

/*
 * sl_attn_decode (prefill false: K and V bytes read per second, over cap
 * cached fp16 tokens each, the new one included) or sl_attn_prefill (FLOP/s
 * of a t = cap token causal prompt, 4 * nseq * nh * hd * t * (t + 1) / 2)
 * on b for nseq sequences of ATTN_NH heads of ATTN_HD.
 */
static int measure_attn(sl_backend *b, sl_queue *q, bool prefill, int nseq, int cap, size_t ring, double target_s,
			double *rate)
{
	*rate = 0;
	const int hidden = ATTN_NH * ATTN_HD, t = prefill ? cap : 1;
	const size_t act = (size_t)nseq * t * hidden, cache = (size_t)nseq * cap * hidden;
	/* decode: copies of the caches (K and V together past ring bytes) */
	const size_t stride = (cache * sizeof(sl_half) + 4095) & ~(size_t)4095;
	const int ncopies = prefill ? 1 : ring_copies(2 * stride, ring);
	int *host = calloc((size_t)nseq, sizeof(int));
	sl_buf qb = { 0 }, kn = { 0 }, vn = { 0 }, out = { 0 }, kc = { 0 }, vc = { 0 };
	int rc = 0;
	if (!host) {
		rc = sl_err(SL_ENOMEM, "profile: out of memory");
		goto done;
	}
	if ((rc = sl_buf_alloc(b, SL_MEM_DEVICE, act * sizeof(float), "profile attention q", &qb)) < 0 ||
	    (rc = sl_buf_alloc(b, SL_MEM_DEVICE, act * sizeof(float), "profile attention k", &kn)) < 0 ||
	    (rc = sl_buf_alloc(b, SL_MEM_DEVICE, act * sizeof(float), "profile attention v", &vn)) < 0 ||
	    (rc = sl_buf_alloc(b, SL_MEM_DEVICE, act * sizeof(float), "profile attention out", &out)) < 0 ||
	    (rc = sl_buf_alloc(b, SL_MEM_DEVICE, stride * (size_t)ncopies, "profile K cache", &kc)) < 0 ||
	    (rc = sl_buf_alloc(b, SL_MEM_DEVICE, stride * (size_t)ncopies, "profile V cache", &vc)) < 0 ||
	    (rc = fill_floats(b, q, qb.p, act, 0.125f)) < 0 || (rc = fill_floats(b, q, kn.p, act, 1.f)) < 0 ||
	    (rc = fill_floats(b, q, vn.p, act, 1.f)) < 0 ||
	    /* fp16 0x3a3a (about 0.78) everywhere: finite, not subnormal */
	    (rc = sl_memset_dev(b, q, kc.p, 0x3a, stride * (size_t)ncopies)) < 0 ||
	    (rc = sl_memset_dev(b, q, vc.p, 0x3a, stride * (size_t)ncopies)) < 0 || (rc = sl_queue_sync(b, q)) < 0)
		goto done;
	for (int i = 0; i < nseq; i++)
		host[i] = prefill ? 0 : cap - 1; /* prefill: no padding; decode: the new token in the last slot */
	sl_attn_args a = { .nseq = nseq, .nh = ATTN_NH, .hd = ATTN_HD, .t = t, .cap = cap, .q = qb.p,
			   .k_new = kn.p, .v_new = vn.p, .out = out.p, .k_cache = kc.p, .v_cache = vc.p };
	if (prefill)
		a.npad = host;
	else
		a.len = host;
	attn_ring r = { .a = a, .k = kc.p, .v = vc.p, .ring = { .stride = stride, .ncopies = ncopies } };
	double s;
	if ((rc = prefill ? time_calls(b, q, issue_prefill, &a, target_s, 1 << 16, &s)
			  : time_calls(b, q, issue_decode_ring, &r, target_s, 1 << 16, &s)) < 0 ||
	    !(s > 0))
		goto done;
	if (prefill)
		*rate = 4.0 * nseq * hidden * ((double)t * (t + 1) / 2) / s / 1e9;
	else
		*rate = 2.0 * (double)(cache * sizeof(sl_half)) / s / 1e9;
done:
	sl_buf_free(b, &vc);
	sl_buf_free(b, &kc);
	sl_buf_free(b, &out);
	sl_buf_free(b, &vn);
	sl_buf_free(b, &kn);
	sl_buf_free(b, &qb);
	free(host);
	return rc;
}

/* ---- the disk --------------------------------------------------------------------- */

/*
 * The disk as the stores use it, on one probe file (sl_disk_probe_open:
 * written once, its write rate the fill's), read in DISK_PASSES passes back
 * to back (sustained: seconds of reading, not a burst).  The file is split
 * into equal parts, one per read pattern: the pipelined sequential read
 * (16 MiB requests, 4 outstanding: the engine's full queue) and a
 * segment's read at each size of seg_sizes (2 outstanding: a weight unit's
 * or a micro-batch's cache read, the next queued before the current one is
 * waited for).  In pass k pattern i reads part (i + k) mod parts, so no
 * pattern keeps to one region of the file.  Then the KV cache's decode
 * writes: DISK_PAGES 4 KiB pages scattered over the file, 64 outstanding,
 * once a pass.  Each pattern's rate is the median pass; its spread (max -
 * min) / median.
 */
#define DISK_PASSES 3
#define DISK_PART (256 * MIB)      /* quick: QUICK_DISK_PART */
#define QUICK_DISK_PART (2 * MIB)
#define DISK_PIPE_REQ (16 * MIB)
#define DISK_PIPE_OUT 4
#define DISK_SEG_OUT 2
#define DISK_PAGES 4096             /* quick: 256 */
#define DISK_PAGE_OUT 64
static const size_t seg_sizes[] = { 256 * 1024, MIB, 4 * MIB, 16 * MIB, 64 * MIB };
_Static_assert(SL_ARRAY_LEN(seg_sizes) <= SL_PROFILE_DISK_MAX, "the curve holds every size");

/* The probe file is opened on a thread bound to the I/O node: the engine's
 * threads, started from it, inherit its binding, as a store's bind
 * themselves. */
typedef struct probe_job {
	const char *dir;
	uint64_t bytes;
	int node;
	double write_gbps;
	sl_disk_probe_file *f;
	int rc;
	char err[600];
} probe_job;

static void *probe_thread(void *arg)
{
	probe_job *j = arg;
	sl_topo_bind_thread(j->node, "the disk probe's I/O threads");
	j->rc = sl_disk_probe_open(j->dir, j->bytes, &j->write_gbps, &j->f);
	if (j->rc < 0)
		snprintf(j->err, sizeof j->err, "%s", sl_errmsg()); /* the message is per thread */
	return NULL;
}

static int open_probe(probe_job *j)
{
	pthread_t th;
	int e = pthread_create(&th, NULL, probe_thread, j);
	if (e != 0) {
		probe_thread(j); /* on this thread, unbound */
	} else {
		pthread_join(th, NULL);
	}
	if (j->rc < 0)
		return sl_err(j->rc, "%s", j->err);
	return 0;
}

/* The median of n (sorted in place) and the spread (max - min) / median. */
static double median_spread(double *v, int n, double *spread)
{
	const double med = sl_median(v, n);
	*spread = med > 0 ? (v[n - 1] - v[0]) / med : 0;
	return med;
}

/* GB/s of a pass of bytes in sec. */
static double gbps_of(uint64_t bytes, double sec)
{
	return sec > 0 ? (double)bytes / sec / 1e9 : 0;
}

/* The disk's overlap with the copies' GEMMs (OVL_M, OVL_NK). */
#define DISK_OVL_REQ (16 * MIB) /* quick: 1 MiB */
#define DISK_OVL_REPS 3

/* A read pass on a thread of its own (the CPU backend runs its ops on the
 * calling thread: the reads must be issued and waited for beside them). */
typedef struct disk_run {
	sl_disk_probe_file *f;
	uint64_t off, len;
	size_t req;
	int rc;
	char err[600];
} disk_run;

static void *disk_run_thread(void *arg)
{
	disk_run *d = arg;
	double sec;
	d->rc = sl_disk_probe_pass(d->f, false, d->off, d->len, d->req, DISK_SEG_OUT, 0, &sec);
	if (d->rc < 0)
		snprintf(d->err, sizeof d->err, "%s", sl_errmsg()); /* the message is per thread */
	return NULL;
}

/* Seconds for ng GEMMs on this thread and a read pass of nreq requests of
 * req bytes, 2 outstanding, on another, started together, to both's
 * completion. */
static int time_gemm_disk(sl_backend *b, ovl_gemm *o, int ng, sl_disk_probe_file *f, uint64_t off, size_t req,
			  int nreq, double *sec)
{
	disk_run d = { .f = f, .off = off, .len = (uint64_t)nreq * req, .req = req };
	pthread_t th;
	bool started = false;
	const double t0 = sl_now();
	if (nreq > 0) {
		if (pthread_create(&th, NULL, disk_run_thread, &d) != 0)
			return sl_err(SL_ENOMEM, "profile: cannot start a thread for the disk's reads");
		started = true;
	}
	int rc = 0;
	for (int i = 0; i < ng && rc == 0; i++)
		rc = sl_gemm(b, o->q, &o->g);
	if (rc == 0)
		rc = sl_queue_sync(b, o->q);
	if (started) {
		pthread_join(th, NULL);
		if (d.rc < 0 && rc == 0)
			rc = sl_err(d.rc, "%s", d.err);
	}
	*sec = sl_now() - t0;
	return rc;
}

/*
 * The share of the disk's segment reads that hides under a GEMM stream on
 * the CPU backend (profile.h, disk_overlap), as measure_overlap measures
 * the copies': the GEMMs alone, the reads alone (sized to take as long),
 * both at once; (alone + alone - together) / the shorter, median of 3.
 */
static int measure_disk_overlap(sl_backend *b, sl_disk_probe_file *f, bool quick, double target_s, double *share)
{
	*share = 0;
	ovl_gemm o;
	SL_TRY(ovl_gemm_make(b, &o));
	const size_t req = quick ? MIB : DISK_OVL_REQ;
	const uint64_t fb = sl_disk_probe_bytes(f);
	double tg1, td1, r[DISK_OVL_REPS];
	int rc;
	if ((rc = time_gemm_disk(b, &o, 1, f, 0, req, 0, &tg1)) < 0 || (rc = time_gemm_disk(b, &o, 0, f, 0, req, 2, &td1)) < 0)
		goto out;
	const int ng = (int)SL_MAX(4.0, SL_MIN(4096.0, 10 * target_s / SL_MAX(tg1, 1e-6)));
	/* as many reads as the GEMMs take, within the file */
	const int nr = (int)SL_MAX(2.0, SL_MIN((double)(fb / req), ng * tg1 / SL_MAX(td1 / 2, 1e-6)));
	uint64_t off = 0;
	for (int s = 0; s < DISK_OVL_REPS; s++) {
		double tg, td, tb;
		if ((rc = time_gemm_disk(b, &o, ng, f, off, req, 0, &tg)) < 0 ||
		    (rc = time_gemm_disk(b, &o, 0, f, off, req, nr, &td)) < 0 ||
		    (rc = time_gemm_disk(b, &o, ng, f, off + (uint64_t)nr * req, req, nr, &tb)) < 0)
			goto out;
		off += 2 * (uint64_t)nr * req;
		const double v = (tg + td - tb) / SL_MAX(SL_MIN(tg, td), 1e-9);
		r[s] = SL_MAX(0.0, SL_MIN(1.0, v));
	}
	*share = sl_median(r, DISK_OVL_REPS);
out:
	ovl_gemm_free(b, &o);
	return rc;
}

/* The disk's rates into out (profile.h): the fill's write rate, the
 * pipelined read and the segment curve over the passes, the page writes;
 * on the CPU backend its overlap with GEMMs. */
static int measure_disk(const sl_profile_opts *o, sl_profile *out, sl_backend *be, double target)
{
	const size_t part = o->quick ? QUICK_DISK_PART : DISK_PART;
	size_t sizes[SL_PROFILE_DISK_MAX];
	int nseg = 0;
	for (size_t i = 0; i < SL_ARRAY_LEN(seg_sizes); i++)
		if (seg_sizes[i] <= part / 2)
			sizes[nseg++] = seg_sizes[i];
	const int nparts = 1 + nseg;
	const size_t pipe_req = SL_MIN((size_t)DISK_PIPE_REQ, part / 2);
	probe_job j = { .dir = o->offload_dir, .bytes = (uint64_t)nparts * part, .node = out->io_node };
	SL_TRY(open_probe(&j));
	sl_disk_probe_file *f = j.f;
	out->disk_write_gbps = j.write_gbps;
	out->disk_bytes = sl_disk_probe_bytes(f);
	snprintf(out->disk_engine, sizeof out->disk_engine, "%s", sl_disk_probe_engine(f));
	say(o, "disk write  %8.2f GB/s     (%s, %llu MiB sequential in 1 MiB requests in %s)\n", out->disk_write_gbps,
	    out->disk_engine, (unsigned long long)(out->disk_bytes / MIB), o->offload_dir);

	double rate[1 + SL_PROFILE_DISK_MAX][DISK_PASSES], pages[DISK_PASSES];
	const int npages = o->quick ? 256 : DISK_PAGES;
	const uint64_t stride = out->disk_bytes / (uint64_t)npages / 4096 * 4096;
	int rc = 0;
	for (int k = 0; k < DISK_PASSES && rc == 0; k++) {
		for (int i = 0; i < nparts && rc == 0; i++) {
			const uint64_t off = (uint64_t)((i + k) % nparts) * part;
			const size_t req = i == 0 ? pipe_req : sizes[i - 1];
			double sec;
			rc = sl_disk_probe_pass(f, false, off, part, req, i == 0 ? DISK_PIPE_OUT : DISK_SEG_OUT, 0, &sec);
			rate[i][k] = gbps_of(part, sec);
		}
		double sec;
		if (rc == 0)
			rc = sl_disk_probe_pass(f, true, (uint64_t)k * 4096, (uint64_t)npages * 4096, 4096, DISK_PAGE_OUT,
						stride, &sec);
		pages[k] = gbps_of((uint64_t)npages * 4096, sec);
	}
	if (rc < 0)
		goto out;
	out->disk_passes = DISK_PASSES;
	out->disk_read_gbps = median_spread(rate[0], DISK_PASSES, &out->disk_read_spread);
	say(o, "disk read   %8.2f GB/s     (%s, %zu MiB requests, %d outstanding: median of %d passes, spread %.0f%%)\n",
	    out->disk_read_gbps, out->disk_engine, pipe_req / MIB, DISK_PIPE_OUT, DISK_PASSES,
	    100 * out->disk_read_spread);
	sl_profile_disk_curve *c = &out->disk_seg;
	c->npoints = nseg;
	c->outstanding = DISK_SEG_OUT;
	say(o, "disk seg    GB/s at request size (%d outstanding; median of %d passes, spread):", DISK_SEG_OUT,
	    DISK_PASSES);
	for (int i = 0; i < nseg; i++) {
		c->bytes[i] = sizes[i];
		c->gbps[i] = median_spread(rate[1 + i], DISK_PASSES, &c->spread[i]);
		if (sizes[i] >= MIB)
			say(o, " %zuM: %.2f (%.0f%%)%s", sizes[i] / MIB, c->gbps[i], 100 * c->spread[i],
			    i + 1 < nseg ? "," : "\n");
		else
			say(o, " %zuK: %.2f (%.0f%%)%s", sizes[i] >> 10, c->gbps[i], 100 * c->spread[i],
			    i + 1 < nseg ? "," : "\n");
	}
	double sp;
	out->disk_page_write_gbps = median_spread(pages, DISK_PASSES, &sp);
	say(o, "disk pages  %8.3f GB/s     (%d scattered 4 KiB writes, %d outstanding: %.1f us a page, spread %.0f%%)\n",
	    out->disk_page_write_gbps, npages, DISK_PAGE_OUT, 4096e-3 / out->disk_page_write_gbps, 100 * sp);
	if (!out->have_gpu) {
		if ((rc = measure_disk_overlap(be, f, o->quick, target, &out->disk_overlap)) < 0)
			goto out;
		out->have_disk_overlap = true;
		say(o, "disk ovl    %8.2f          (the share of %zu MiB reads, %d outstanding, hidden under GEMMs, m=%d n=k=%d)\n",
		    out->disk_overlap, (o->quick ? MIB : DISK_OVL_REQ) / MIB, DISK_SEG_OUT, OVL_M, OVL_NK);
	}
out:
	sl_disk_probe_close(f);
	return rc;
}

/* ---- the profile ------------------------------------------------------------------- */

static void print_topology(const sl_profile_opts *o, const sl_profile *p)
{
	const sl_profile_topo *t = &p->topo;
	say(o, "machine     %d package%s, %d cores, %d PUs, %d NUMA node%s%s\n", t->packages,
	    t->packages == 1 ? "" : "s", t->cores, t->pus, t->nnodes, t->nnodes == 1 ? "" : "s",
	    t->loaded ? "" : " (hwloc unavailable: a guess)");
	for (int i = 0; i < SL_MIN(t->nnodes, SL_PROFILE_MAX_NODES); i++) {
		const sl_profile_node *n = &t->node[i];
		say(o, "numa %-6d %.1f GiB, %d cores, %d PUs (cpus %s)\n", n->os_index, gib(n->memory_bytes),
		    n->cores, n->pus, n->cpus[0] ? n->cpus : "none");
	}
	if (t->binding_node >= 0)
		say(o, "binding     PUs %s (%d), within node %d\n", t->binding, t->binding_pus, t->binding_node);
	else
		say(o, "binding     PUs %s (%d), across nodes\n", t->binding, t->binding_pus);
	if (p->have_gpu) {
		char node[32] = "unknown";
		if (p->gpu.numa_node >= 0)
			snprintf(node, sizeof node, "%d", p->gpu.numa_node);
		say(o, "gpu         %s, PCI %s, %.1f GiB, NUMA node %s\n", p->gpu.name,
		    p->gpu.pci_bus_id[0] ? p->gpu.pci_bus_id : "?", gib(p->gpu.memory_bytes), node);
	} else {
		say(o, "gpu         none (backend %s%s)\n", p->backend,
		    sl_backend_cuda_built() ? "" : "; this build has no CUDA");
	}
	char pin[64], io[64];
	if (p->pinned_node >= 0)
		snprintf(pin, sizeof pin, "node %d%s", p->pinned_node,
			 p->have_gpu ? " (the GPU's)" : t->nnodes == 1 ? " (the only one)" : "");
	else
		snprintf(pin, sizeof pin, "first touch");
	if (p->io_node >= 0)
		snprintf(io, sizeof io, "node %d%s", p->io_node,
			 p->have_gpu && p->io_node == p->gpu.numa_node ? " (the GPU's)"
			 : t->nnodes == 1			       ? " (the only one)"
								       : " (the process's)");
	else
		snprintf(io, sizeof io, "unbound (no single node)");
	say(o, "placement   pinned memory: %s; I/O threads: %s\n", pin, io);
}

/* The profile records hwloc's view and the backend's device in plain data
 * of its own (policy/ sees neither topology.h nor backend.h): copied field
 * by field, the same sizes, nothing cut. */
_Static_assert(SL_PROFILE_MAX_NODES == SL_TOPO_MAX_NODES, "a profile lists the nodes topology lists");
_Static_assert(sizeof(((sl_profile_node *)0)->cpus) == sizeof(((sl_topo_node *)0)->cpus), "cpus");
_Static_assert(sizeof(((sl_profile_topo *)0)->binding) == sizeof(((sl_topo_info *)0)->binding), "binding");
_Static_assert(sizeof(((sl_profile_gpu *)0)->name) == sizeof(((sl_device_info *)0)->name), "name");
_Static_assert(sizeof(((sl_profile_gpu *)0)->pci_bus_id) == sizeof(((sl_device_info *)0)->pci_bus_id),
	       "pci_bus_id");

static void record_topology(const sl_topo_info *t, sl_profile_topo *d)
{
	d->loaded = t->loaded;
	d->packages = t->packages;
	d->cores = t->cores;
	d->pus = t->pus;
	d->nnodes = t->nnodes;
	for (int i = 0; i < SL_MIN(t->nnodes, SL_TOPO_MAX_NODES); i++) {
		d->node[i].os_index = t->node[i].os_index;
		d->node[i].memory_bytes = t->node[i].memory_bytes;
		d->node[i].cores = t->node[i].cores;
		d->node[i].pus = t->node[i].pus;
		memcpy(d->node[i].cpus, t->node[i].cpus, sizeof d->node[i].cpus);
	}
	memcpy(d->binding, t->binding, sizeof d->binding);
	d->binding_pus = t->binding_pus;
	d->binding_node = t->binding_node;
}

static void record_gpu(const sl_device_info *g, sl_profile_gpu *d)
{
	memcpy(d->name, g->name, sizeof d->name);
	memcpy(d->pci_bus_id, g->pci_bus_id, sizeof d->pci_bus_id);
	d->memory_bytes = g->memory_bytes;
	d->numa_node = g->numa_node;
}

/* ---- the cache's key ---------------------------------------------------------------- */

/* The CPU's model name as /proc/cpuinfo gives it ("model name"), or
 * "unknown". */
static void cpu_model(char *buf, size_t cap)
{
	snprintf(buf, cap, "unknown");
	FILE *f = fopen("/proc/cpuinfo", "r");
	if (!f)
		return;
	char line[512];
	while (fgets(line, sizeof line, f)) {
		if (strncmp(line, "model name", 10) != 0)
			continue;
		const char *v = strchr(line, ':');
		if (!v)
			continue;
		v++;
		while (*v == ' ' || *v == '\t')
			v++;
		size_t n = strcspn(v, "\n");
		snprintf(buf, cap, "%.*s", (int)SL_MIN(n, cap - 1), v);
		break;
	}
	fclose(f);
}

/* What a cached profile must match: the backend measured, the threads, the
 * CPU backend's GEMM, the build, the CPU and its PU count, the GPU. */
static void machine_key(const char *backend, int threads, const char *cpu_gemm, int pus, const char *gpu,
			char *buf, size_t cap)
{
	char cpu[256];
	cpu_model(cpu, sizeof cpu);
	snprintf(buf, cap, "backend=%s; threads=%d; cpu_gemm=%s; build=%s+%s; cpu=%s; pus=%d; gpu=%s", backend,
		 threads, cpu_gemm, SL_VERSION, sl_build_id, cpu, pus, gpu && gpu[0] ? gpu : "none");
}

static const char *gemm_of(const sl_profile_opts *o)
{
	return o->cpu_gemm ? o->cpu_gemm : "sluice";
}

/* ---- the profile ------------------------------------------------------------------- */

static const int gemm_ms[] = { 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024 };
#define QUICK_GEMM_POINTS 7 /* m up to 64 */
_Static_assert(SL_ARRAY_LEN(gemm_ms) <= SL_PROFILE_CURVE_MAX, "the curve holds every point");

static void say_curve(const sl_profile_opts *o, const sl_profile_curve *c, const char *backend,
		      const char *what)
{
	say(o, "gemm curve  sl_gemm on %s%s, n=k=%d, GFLOP/s at m =", backend, what, c->n);
	for (int i = 0; i < c->npoints; i++)
		say(o, " %d: %.1f%s", c->m[i], c->gflops[i], i + 1 < c->npoints ? "," : "\n");
}

/* The curve's rate at one of its points m (the shapes' m are points of
 * every curve); 0 where it has none there. */
static double curve_at(const sl_profile_curve *c, int m)
{
	for (int i = 0; i < c->npoints; i++)
		if (c->m[i] == m)
			return c->gflops[i];
	return 0;
}

/* Rounds of the shapes' paired measurement (measure_shapes). */
#define SHAPE_ROUNDS 3

/*
 * The model's own shapes (o->shapes) at every power of two up to 64 rows
 * (decode's micro-batches, where the rate moves most and a shape's ratio
 * to the square is not smooth: on a Xeon the square dips at 16 rows and
 * 768 x 768 does not) and at 512 (a prefill), each against the curve's
 * square measured beside it: SHAPE_ROUNDS rounds (one when quick), each
 * the square then every shape, at the same m.  A shape's rate is the
 * curve's point times the median over the rounds of its ratio to that
 * round's square, so that the machine's load drifting in the minutes
 * between the curve and the shapes is not read as an effect of the shape
 * (measured apart, one shape's ratio read 0.67x and 1.09x in two profiles
 * of one quiet machine).
 */
static int measure_shapes(const sl_profile_opts *o, sl_profile *out, sl_backend *be, sl_queue *q, size_t ring,
			  double target)
{
	static const int full_ms[] = { 1, 2, 4, 8, 16, 32, 64, 512 }, quick_ms[] = { 1, 8 };
	enum { NM = SL_ARRAY_LEN(full_ms) };
	const int *shape_ms = o->quick ? quick_ms : full_ms;
	const sl_profile_curve *c = &out->gemm;
	const int nm = o->quick ? (int)SL_ARRAY_LEN(quick_ms) : NM, rounds = o->quick ? 1 : SHAPE_ROUNDS;
	const int ns = SL_MIN(o->nshapes, SL_PROFILE_SHAPES_MAX);
	out->n_gemm_shapes = 0;
	if (ns == 0)
		return 0;
	double ratio[SL_PROFILE_SHAPES_MAX][NM][SHAPE_ROUNDS];
	for (int r = 0; r < rounds; r++) {
		double sq[NM], sh[NM];
		SL_TRY(measure_gemms(be, q, shape_ms, nm, c->n, c->k, false, ring, target, sq));
		for (int i = 0; i < ns; i++) {
			SL_TRY(measure_gemms(be, q, shape_ms, nm, o->shapes[i][0], o->shapes[i][1], false, ring, target,
					     sh));
			for (int j = 0; j < nm; j++)
				ratio[i][j][r] = sq[j] > 0 ? sh[j] / sq[j] : 0;
		}
	}
	for (int i = 0; i < ns; i++) {
		sl_profile_curve *s = &out->gemm_shapes[i];
		memset(s, 0, sizeof *s);
		s->npoints = nm;
		s->n = o->shapes[i][0];
		s->k = o->shapes[i][1];
		memcpy(s->m, shape_ms, (size_t)nm * sizeof(int));
		say(o, "gemm shape  n=%d k=%d, GFLOP/s at m =", s->n, s->k);
		for (int j = 0; j < nm; j++) {
			const double x = sl_median(ratio[i][j], rounds);
			s->gflops[j] = x * curve_at(c, s->m[j]);
			say(o, " %d: %.1f (%.2fx the curve)%s", s->m[j], s->gflops[j], x, j + 1 < nm ? "," : "\n");
		}
		out->n_gemm_shapes = i + 1;
	}
	return 0;
}

/*
 * How much of the last-level cache a layer's weights keep (CPU backend):
 * the curve's GEMM at 1 row re-reading 2, 4, ..., 32 copies of its
 * weights in turn (as a layer's micro-batches re-read its matrices), no
 * more than hwloc's cache; llc_hot_bytes is the largest set still read at
 * the middle of the cold and hot rates or faster.  hwloc reports what the
 * CPU has, and a VM's share of its host's cache can be far less: on the
 * 2-vCPU Xeon hwloc says 480 MiB, and opt-1.3b's 100 MB layers read cold.
 * 0 (not measured) when the hot curve gains less than 10% at 1 row.
 */
static int measure_llc_hot(const sl_profile_opts *o, sl_profile *out, sl_backend *be, sl_queue *q,
			   double target)
{
	const sl_profile_curve *c = &out->gemm, *ch = &out->gemm_hot;
	out->llc_hot_bytes = 0;
	if (strcmp(out->backend, "cpu") || c->npoints == 0 || ch->npoints == 0 ||
	    ch->gflops[0] < 1.1 * c->gflops[0])
		return 0;
	static const int one[] = { 1 };
	const size_t stride = ((size_t)c->n * c->k * sizeof(sl_half) + 4095) & ~(size_t)4095;
	const double mid = 0.5 * (c->gflops[0] + ch->gflops[0]);
	uint64_t hot = stride;
	say(o, "llc hot     sl_gemm at 1 row re-reading copies of its weights, GFLOP/s at");
	for (int copies = 2; copies <= 32; copies *= 2) {
		const size_t set = stride * (size_t)copies;
		if (out->llc_bytes && set > out->llc_bytes)
			break;
		double r;
		SL_TRY(measure_gemms(be, q, one, 1, c->n, c->k, false, set, target, &r));
		r /= 1e9;
		say(o, "%s %.0f MiB: %.1f", copies > 2 ? "," : "", set / 1048576.0, r);
		if (r < mid)
			break;
		hot = set;
	}
	out->llc_hot_bytes = hot;
	say(o, "; kept hot: %.1f MiB (1 row: %.1f cold, %.1f hot)\n", hot / 1048576.0, c->gflops[0],
	    ch->gflops[0]);
	return 0;
}

/*
 * The backend's compute: the GEMM curve (and the CPU's GEMM), attention
 * (and the CPU's beside a GPU), the latencies, then the backend's own
 * device memory, all on one queue.
 */
static int measure_compute(const sl_profile_opts *o, sl_profile *out, sl_backend *be, sl_backend *cpu,
			   double target)
{
	/* one compute queue, as the model's: its workspaces (cuBLAS's, the
	 * scratch) are what dev_reserve_bytes reports */
	sl_queue *q = NULL;
	int rc = sl_queue_create(be, &q);
	if (rc < 0)
		return rc;

	/* the GEMM against its rows, on the profiled backend */
	sl_profile_curve *c = &out->gemm;
	c->npoints = o->quick ? QUICK_GEMM_POINTS : (int)SL_ARRAY_LEN(gemm_ms);
	c->n = c->k = o->quick ? (out->have_gpu ? 1024 : 256) : (out->have_gpu ? 8192 : 2048);
	memcpy(c->m, gemm_ms, (size_t)c->npoints * sizeof(int));
	const size_t ring = o->quick ? 0 : COLD_BYTES;
	if ((rc = measure_gemms(be, q, c->m, c->npoints, c->n, c->k, false, ring, target, c->gflops)) < 0)
		goto out;
	for (int i = 0; i < c->npoints; i++)
		c->gflops[i] /= 1e9;
	say_curve(o, c, out->backend, "");
	/* the same shapes with 4-bit weights (compress_weight's GEMM) */
	sl_profile_curve *c4 = &out->gemm_q4;
	*c4 = *c;
	if ((rc = measure_gemms(be, q, c4->m, c4->npoints, c4->n, c4->k, true, ring, target, c4->gflops)) < 0)
		goto out;
	for (int i = 0; i < c4->npoints; i++)
		c4->gflops[i] /= 1e9;
	say_curve(o, c4, out->backend, " 4-bit weights");
	/* the same weights staying in the cache (one copy), and the cache */
	sl_profile_curve *ch = &out->gemm_hot;
	*ch = *c;
	if ((rc = measure_gemms(be, q, ch->m, ch->npoints, ch->n, ch->k, false, 0, target, ch->gflops)) < 0)
		goto out;
	for (int i = 0; i < ch->npoints; i++)
		ch->gflops[i] /= 1e9;
	say_curve(o, ch, out->backend, " weights in the cache");
	say(o, "llc         %8.1f MiB   (the last-level cache, hwloc)\n", out->llc_bytes / 1048576.0);
	if ((rc = measure_llc_hot(o, out, be, q, target)) < 0)
		goto out;
	if ((rc = measure_shapes(o, out, be, q, ring, target)) < 0)
		goto out;

	out->cpu_gemm_m = o->quick ? 64 : 512;
	out->cpu_gemm_n = out->cpu_gemm_k = o->quick ? 256 : 2048;
	double r;
	if (!out->have_gpu) { /* the curve's point */
		int at = -1;
		for (int i = 0; i < c->npoints; i++)
			if (c->m[i] == out->cpu_gemm_m && c->n == out->cpu_gemm_n && c->k == out->cpu_gemm_k)
				at = i;
		SL_ASSERT(at >= 0);
		out->cpu_gemm_gflops = c->gflops[at];
	} else {
		if ((rc = measure_gemm(cpu, out->cpu_gemm_m, out->cpu_gemm_n, out->cpu_gemm_k, target, &r)) < 0)
			goto out;
		out->cpu_gemm_gflops = r / 1e9;
	}
	const char *g = gemm_of(o);
	const bool bf16 = !strcmp(g, "bf16") || !strcmp(g, "amx");
	say(o, "cpu gemm    %8.1f GFLOP/s  (--cpu-gemm %s, fp16 weights%s, m=%d n=%d k=%d, %d threads, median of 3)\n",
	    out->cpu_gemm_gflops, g, bf16 ? " and activations rounded to bf16" : " x fp32 activations", out->cpu_gemm_m, out->cpu_gemm_n, out->cpu_gemm_k, out->threads);

	/* attention: decode over 16 sequences' 1024 cached tokens, prefill of
	 * 4 sequences' 512-token prompts */
	const int dseq = o->quick ? 4 : 16, dcap = o->quick ? 128 : 1024, pseq = 4, pt = o->quick ? 64 : 512;
	if ((rc = measure_attn(be, q, false, dseq, dcap, ring, target, &out->attn_decode_gbps)) < 0)
		goto out;
	say(o, "attn decode %8.2f GB/s     (sl_attn_decode on %s, K and V read: %d seqs x %d heads x %d over %d fp16 tokens)\n",
	    out->attn_decode_gbps, out->backend, dseq, ATTN_NH, ATTN_HD, dcap);
	if ((rc = measure_attn(be, q, true, pseq, pt, 0, target, &out->attn_prefill_gflops)) < 0)
		goto out;
	say(o, "attn prefill %7.1f GFLOP/s  (sl_attn_prefill on %s: %d seqs x %d heads x %d, a %d-token prompt)\n",
	    out->attn_prefill_gflops, out->backend, pseq, ATTN_NH, ATTN_HD, pt);
	if (out->have_gpu) { /* cpu_cache_compute's attention: the CPU backend's */
		sl_queue *cq = NULL;
		if ((rc = sl_queue_create(cpu, &cq)) == 0)
			rc = measure_attn(cpu, cq, false, dseq, dcap, ring, target, &out->cpu_attn_gbps);
		if (cq)
			sl_queue_free(cpu, cq);
		if (rc < 0)
			goto out;
		say(o, "cpu attn    %8.2f GB/s     (sl_attn_decode on the CPU backend, %d threads, the same shape)\n",
		    out->cpu_attn_gbps, out->threads);
	} else {
		out->cpu_attn_gbps = out->attn_decode_gbps;
	}

	if ((rc = measure_latencies(be, q, target, &out->copy_latency_us, &out->op_latency_us)) < 0)
		goto out;
	say(o, "copy lat    %8.2f us       (a %d-byte sl_copy_h2d in a stream of them on one queue)\n",
	    out->copy_latency_us, LAT_COPY_BYTES);
	say(o, "op lat      %8.2f us       (a 1-row sl_layernorm, n=%d, in a stream of them on one queue)\n",
	    out->op_latency_us, LAT_LN_N);
	/* the backend's own device memory beside the caller's, after its
	 * GEMMs and attention ran on this queue */
	out->dev_reserve_bytes = be->dev_used - be->data_used;
	say(o, "dev reserve %8.1f MiB      (%s's own device workspaces after the GEMMs and attention)\n",
	    (double)out->dev_reserve_bytes / MIB, out->backend);
out:
	sl_queue_free(be, q);
	return rc;
}

/* ---- zstd frames ------------------------------------------------------------------------ */

/* Frames as sluice convert --zstd writes them (zseg.h: byte-shuffled
 * fp16, level 1) of values drawn as a trained layer's are (normal, sd
 * 0.02: OPT's initialisation), decompressed as the weight streamer does
 * (wstage.c: a frame per OpenMP thread at a time, each its own context):
 * the raw bytes out per second, median of 3, and the frames' bytes on disk
 * (each rounded up to a page, as a read moves them) over the raw ones: the
 * ratio the cost model assumes where no store says. */
static int measure_zstd(bool quick, double target_s, double *gbps, double *ratio)
{
	const int nthr = SL_MAX(1, omp_get_max_threads());
	const size_t win = (quick ? 1 : 4) * MIB;
	const int nf = quick ? 2 : 4 * nthr;
	const size_t cap = sl_zseg_bound(win), raw_bytes = (size_t)nf * win;
	unsigned char *raw = malloc(raw_bytes), *comp = malloc((size_t)nf * cap), *out = malloc(raw_bytes);
	unsigned char *scratch = malloc((size_t)nthr * win);
	size_t *clen = calloc((size_t)nf, sizeof *clen);
	ZSTD_DCtx **dctx = calloc((size_t)nthr, sizeof *dctx);
	int rc = 0;
	if (!raw || !comp || !out || !scratch || !clen || !dctx) {
		rc = sl_err(SL_ENOMEM, "profile: out of memory for the zstd frames (%zu bytes)", 3 * raw_bytes);
		goto out;
	}
	sl_half *h = (sl_half *)raw;
	for (size_t i = 0; i < raw_bytes / 2; i += 2) { /* Box-Muller, two values a draw */
		const uint64_t r = sl_splitmix64(0x5eed ^ i);
		const double u1 = ((r >> 11) + 1.0) / 9007199254740993.0, u2 = (double)(r & 0xffffffff) / 4294967296.0;
		const double m = 0.02 * sqrt(-2.0 * log(u1));
		h[i] = sl_float_to_half((float)(m * cos(2 * M_PI * u2)));
		h[i + 1] = sl_float_to_half((float)(m * sin(2 * M_PI * u2)));
	}
	double disk = 0;
	for (int f = 0; f < nf && !rc; f++) {
		rc = sl_zseg_compress(NULL, 1, raw + (size_t)f * win, win, scratch, comp + (size_t)f * cap, cap,
				      &clen[f]);
		disk += clen[f] ? (double)((clen[f] + 4095) & ~(size_t)4095) : (double)win;
	}
	for (int t = 0; t < nthr && !rc; t++)
		if (!(dctx[t] = ZSTD_createDCtx()))
			rc = sl_err(SL_ENOMEM, "profile: out of memory for a zstd context");
	if (rc < 0)
		goto out;
	*ratio = disk / (double)raw_bytes;
	double sec[3];
	for (int s = 0; s < 3 && !rc; s++) {
		int passes = 0, failed = 0;
		const double t0 = sl_now();
		do {
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthr)
			for (int f = 0; f < nf; f++) {
				const int id = omp_get_thread_num();
				if (clen[f] && sl_zseg_decompress(dctx[id], comp + (size_t)f * cap, clen[f],
								  scratch + (size_t)id * win, out + (size_t)f * win,
								  win, "profile", 0, f) < 0) {
#pragma omp atomic write
					failed = 1;
				}
			}
			passes++;
		} while (!failed && sl_now() - t0 < target_s / 3);
		sec[s] = (sl_now() - t0) / passes;
		if (failed)
			rc = sl_err(SL_EFORMAT, "profile: a zstd frame did not decompress");
	}
	for (int f = 0; f < nf && !rc; f++) /* the last pass's output, once */
		if (clen[f] && memcmp(out + (size_t)f * win, raw + (size_t)f * win, win) != 0)
			rc = sl_err(SL_EFORMAT, "profile: zstd frames did not decompress to what was compressed");
	if (!rc)
		*gbps = (double)raw_bytes / sl_median(sec, 3) / 1e9;
out:
	for (int t = 0; t < nthr && dctx; t++)
		ZSTD_freeDCtx(dctx[t]);
	free(dctx);
	free(clen);
	free(scratch);
	free(out);
	free(comp);
	free(raw);
	return rc;
}

/* The 1-minute load average (/proc/loadavg), or -1. */
static double load_now(void)
{
	FILE *f = fopen("/proc/loadavg", "r");
	double l = -1;
	if (f) {
		if (fscanf(f, "%lf", &l) != 1 || !(l >= 0))
			l = -1;
		fclose(f);
	}
	return l;
}

int sl_profile_run(const sl_profile_opts *o, sl_profile *out)
{
	memset(out, 0, sizeof *out);
	const double t_start = sl_now();
	out->quick = o->quick;
	out->pinned_node = out->io_node = -1;
	out->load_average = load_now();
	snprintf(out->build, sizeof out->build, "%s+%s", SL_VERSION, sl_build_id);
	if (o->offload_dir) {
		SL_TRY(sl_profile_check_offload_dir(o->offload_dir));
		if (strlen(o->offload_dir) >= sizeof out->offload_dir)
			return sl_err(SL_EINVAL, "offload directory %s: longer than %zu bytes", o->offload_dir,
				      sizeof out->offload_dir - 1);
		strcpy(out->offload_dir, o->offload_dir);
	}

	sl_topo_info topo;
	sl_topo_get(&topo); /* on failure: the fallback description */
	record_topology(&topo, &out->topo);
	out->llc_bytes = topo.llc_bytes;
	sl_backend *be = NULL, *cpu = NULL;
	int rc = sl_backend_create(o->backend ? o->backend : "auto", o->threads, &be);
	if (rc < 0)
		return rc;
	snprintf(out->backend, sizeof out->backend, "%s", be->ops->name);
	out->have_gpu = strcmp(be->ops->name, "cpu") != 0;
	if (out->have_gpu) {
		sl_device_info gpu;
		sl_backend_device_info(be, &gpu);
		record_gpu(&gpu, &out->gpu);
	}
	if (!out->have_gpu)
		cpu = be;
	else if ((rc = sl_backend_create("cpu", o->threads, &cpu)) < 0)
		goto out;
	/* every CPU product below with the GEMM a run of --cpu-gemm uses */
	if ((rc = sl_cpu_backend_set_gemm(cpu, gemm_of(o))) < 0)
		goto out;
	snprintf(out->cpu_gemm, sizeof out->cpu_gemm, "%s", gemm_of(o));

	if (out->have_gpu)
		out->pinned_node = out->gpu.numa_node;
	else if (out->topo.nnodes == 1)
		out->pinned_node = out->topo.node[0].os_index;
	out->io_node = sl_topo_io_node(out->have_gpu ? out->gpu.pci_bus_id : NULL);
	out->threads = o->threads > 0 ? o->threads : omp_get_max_threads();
	machine_key(out->backend, out->threads, out->cpu_gemm, out->topo.pus, out->have_gpu ? out->gpu.name : NULL,
		    out->machine, sizeof out->machine);
	print_topology(o, out);
	if (strcmp(out->cpu_gemm, "sluice"))
		say(o, "cpu gemm    --cpu-gemm %s  (every CPU product below, as a run with it computes)\n",
		    out->cpu_gemm);
	const double target = o->quick ? SAMPLE_S / 10 : SAMPLE_S;

	const size_t mem_bytes = (o->quick ? 16 : 512) * MIB;
	out->mem_bytes = mem_bytes;
	if (out->load_average >= 0)
		say(o, "load        %8.2f          (1-minute average as the profile began, %d CPUs%s)\n",
		    out->load_average, out->topo.pus,
		    out->load_average >= 0.5 * out->topo.pus ? "; busy: the rates below may be low" : "");
	out->mem_read_gbps = sl_profile_mem_read_gbps(mem_bytes, out->threads);
	say(o, "mem read    %8.2f GB/s     (%d threads summing %zu MiB, median of 3)\n", out->mem_read_gbps,
	    out->threads, mem_bytes / MIB);

	if ((rc = measure_compute(o, out, be, cpu, target)) < 0)
		goto out;

	if (o->offload_dir) {
		if ((rc = measure_disk(o, out, be, target)) < 0)
			goto out;
	} else {
		say(o, "disk        not measured  (no --offload-dir)\n");
	}

	/* copies: pinned host <-> GPU; on the CPU backend its copy queue's memcpy */
	const size_t copy_bytes = (out->have_gpu ? (o->quick ? 16 : 256) : (o->quick ? 8 : 64)) * MIB;
	out->copy_bytes = copy_bytes;
	if ((rc = measure_copies(be, copy_bytes, &out->h2d_gbps, &out->d2h_gbps)) < 0)
		goto out;
	out->copy_gbps = out->h2d_gbps;
	const char *how = out->have_gpu ? "pinned" : "the copy queue's memcpy";
	say(o, "h2d         %8.2f GB/s     (%s, %zu MiB, median of 3)\n", out->h2d_gbps, how, copy_bytes / MIB);
	say(o, "d2h         %8.2f GB/s     (%s, %zu MiB, median of 3)\n", out->d2h_gbps, how, copy_bytes / MIB);
	if (!out->have_gpu) {
		if ((rc = measure_overlap(be, target, &out->copy_overlap)) < 0)
			goto out;
		say(o, "overlap     %8.2f          (the share of the copy queue's memcpy hidden under GEMMs, m=%d n=k=%d)\n",
		    out->copy_overlap, OVL_M, OVL_NK);
	}

	if ((rc = measure_zstd(o->quick, target, &out->zstd_gbps, &out->zstd_ratio)) < 0)
		goto out;
	say(o, "zstd        %8.2f GB/s     (decompressing fp16 frames as a --zstd store's, %d threads, median of 3; ratio %.3f)\n",
	    out->zstd_gbps, SL_MAX(1, omp_get_max_threads()), out->zstd_ratio);

	if (out->have_gpu) {
		double r;
		out->gpu_gemm_m = o->quick ? 256 : 2048;
		out->gpu_gemm_n = out->gpu_gemm_k = o->quick ? 1024 : 8192;
		if ((rc = measure_gemm(be, out->gpu_gemm_m, out->gpu_gemm_n, out->gpu_gemm_k, target, &r)) < 0)
			goto out;
		out->gpu_gemm_tflops = r / 1e12;
		say(o, "gpu gemm    %8.1f TFLOP/s  (sl_gemm, fp16 tensor cores, m=%d n=%d k=%d, median of 3)\n",
		    out->gpu_gemm_tflops, out->gpu_gemm_m, out->gpu_gemm_n, out->gpu_gemm_k);
	}
	out->seconds = sl_now() - t_start;
out:
	if (cpu != be)
		sl_backend_free(cpu);
	sl_backend_free(be);
	return rc;
}

/* ---- the cached profile -------------------------------------------------------------- */

/* mkdir -p dir (0700 for what it creates: a user's cache). */
static int make_dirs(const char *dir)
{
	char buf[4096];
	if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf)
		return sl_err(SL_EINVAL, "%s: path too long", dir);
	for (char *p = buf + 1;; p++) {
		if (*p != '/' && *p)
			continue;
		const char c = *p;
		*p = 0;
		if (mkdir(buf, 0700) != 0 && errno != EEXIST)
			return sl_err(SL_EIO, "cannot create the cache folder %s (%s)", buf, strerror(errno));
		if (!c)
			break;
		*p = c;
	}
	struct stat st;
	if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
		return sl_err(SL_EIO, "the cache folder %s is not a folder", dir);
	return 0;
}

/* $XDG_CACHE_HOME/sluice, else $HOME/.cache/sluice. */
static int default_cache_dir(char *buf, size_t cap)
{
	const char *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
	int n;
	if (x && x[0] == '/') /* the spec: a relative one is ignored */
		n = snprintf(buf, cap, "%s/sluice", x);
	else if (h && h[0])
		n = snprintf(buf, cap, "%s/.cache/sluice", h);
	else
		return sl_err(SL_ENOTFOUND, "no cache folder: neither XDG_CACHE_HOME nor HOME is set");
	if (n < 0 || (size_t)n >= cap)
		return sl_err(SL_EINVAL, "the cache folder's path is too long");
	return 0;
}

/* What the profile of o on this machine would say: its backend (resolved:
 * "auto" becomes cuda or cpu) and its machine key. */
static int expected_key(const sl_profile_opts *o, char *backend, size_t bcap, char *key, size_t kcap)
{
	sl_backend *be;
	SL_TRY(sl_backend_create(o->backend ? o->backend : "auto", o->threads, &be));
	snprintf(backend, bcap, "%s", be->ops->name);
	sl_device_info d = { 0 };
	const bool gpu = strcmp(be->ops->name, "cpu") != 0;
	if (gpu)
		sl_backend_device_info(be, &d);
	sl_backend_free(be);
	sl_topo_info topo;
	sl_topo_get(&topo);
	const int threads = o->threads > 0 ? o->threads : omp_get_max_threads();
	machine_key(backend, threads, gemm_of(o), topo.pus, gpu ? d.name : NULL, key, kcap);
	return 0;
}

/* Whether p has a curve at each of o's shapes. */
static bool has_shapes(const sl_profile *p, const sl_profile_opts *o)
{
	for (int i = 0; i < o->nshapes; i++) {
		bool found = false;
		for (int j = 0; j < p->n_gemm_shapes && !found; j++)
			found = p->gemm_shapes[j].n == o->shapes[i][0] && p->gemm_shapes[j].k == o->shapes[i][1];
		if (!found)
			return false;
	}
	return true;
}

int sl_profile_obtain(const sl_profile_opts *o, const char *cache_dir, sl_profile *out, bool *measured)
{
	if (measured)
		*measured = false;
	char backend[16], key[sizeof out->machine];
	SL_TRY(expected_key(o, backend, sizeof backend, key, sizeof key));

	/* the cache's file: where it cannot be named, measure and say so */
	char dir[4096], path[4200];
	int crc = 0;
	if (cache_dir) {
		snprintf(dir, sizeof dir, "%s", cache_dir);
		crc = o->cache_only ? 0 : make_dirs(dir);
	} else if (o->offload_dir) {
		snprintf(dir, sizeof dir, "%s", o->offload_dir); /* sl_profile_run checks it */
	} else if ((crc = default_cache_dir(dir, sizeof dir)) == 0 && !o->cache_only) {
		crc = make_dirs(dir);
	}
	if (crc == 0 && snprintf(path, sizeof path, "%s/sluice-profile-%s.json", dir, backend) >= (int)sizeof path)
		crc = sl_err(SL_EINVAL, "%s: the cache folder's path is too long", dir);

	/* what to measure: o's shapes, and those of a cached profile that
	 * lacks some of o's (so that the cache keeps both models' shapes) */
	sl_profile_opts run = *o;
	if (crc == 0) {
		sl_profile *c = malloc(sizeof *c);
		if (!c)
			return sl_err(SL_ENOMEM, "out of memory");
		const bool same = sl_profile_load(path, c) == 0 && !strcmp(c->machine, key) &&
				  !strcmp(c->backend, backend) && c->quick == o->quick &&
				  !strcmp(c->offload_dir, o->offload_dir ? o->offload_dir : "");
		const bool hit = same && (o->cache_only || has_shapes(c, o));
		if (hit)
			*out = *c;
		for (int j = 0; same && !hit && j < c->n_gemm_shapes; j++)
			if (sl_profile_add_shape(&run, c->gemm_shapes[j].n, c->gemm_shapes[j].k) < 0)
				break; /* o's first: the cache keeps what fits */
		free(c);
		if (hit)
			return 0;
	}
	if (o->cache_only)
		return crc < 0 ? crc
			       : sl_err(SL_ENOTFOUND, "%s: no cached profile of this machine and build", path);
	SL_TRY(sl_profile_run(&run, out));
	if (measured)
		*measured = true;
	if (crc == 0)
		crc = sl_profile_save_json(out, path);
	if (crc < 0) {
		sl_err_prefix(crc, "the profile was not cached");
		return SL_PROFILE_NOT_CACHED;
	}
	return 0;
}
