/*
 * test_queues.c - the CPU backend's queues and events, which behave like
 * CUDA streams: copies and memsets run on each queue's worker thread, ops
 * run inline after their queue's earlier work, events order queues.
 *
 * What a user of the interface relies on:
 *  - a copy on queue A, an event, a wait on queue B: an op or a copy on B
 *    sees the copied bytes (and a memset on B is not overwritten by A's
 *    copy);
 *  - a random program of copies, memsets, GEMMs, events, waits and syncs on
 *    three queues, made race-free by construction (vector clocks decide
 *    where an event or a host sync is needed), leaves exactly the bytes of
 *    the same program run sequentially on plain buffers;
 *  - event_sync and queue_sync return only when the work is done;
 *  - a re-recorded event stands for its latest record;
 *  - queue_free and dev_free/host_free wait for pending copies;
 *  - the NULL queue is a queue like the others;
 *  - a schedule that repeats (the per-token loop) allocates nothing once
 *    its tasks in flight have reached their peak (DESIGN.md: nothing is
 *    allocated in the per-token loop).
 * Every test runs in four modes: the default (copies under 64 KiB inline
 * on an idle queue), every copy on the worker (SLUICE_CPU_INLINE_BYTES=0),
 * every copy on the worker and started late (SLUICE_CPU_LATE_COPIES, the
 * adversarial mode), and SLUICE_CPU_SYNC_QUEUES=1 (the serial schedule).
 *
 * Over 800 lines on purpose: the sequential model every check compares
 * against, and the queue modes each test runs in, are shared by all of
 * them.
 */
#include "backend.h"

#include "testutil.h"

#include <check.h>
#include <dirent.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#define FAIL_IF(cond, ...)                                                    \
	do {                                                                  \
		if (cond)                                                     \
			ck_abort_msg(__VA_ARGS__);                            \
	} while (0)

#define ok(expr, what)                                                        \
	do {                                                                  \
		int rc_ = (expr);                                             \
		FAIL_IF(rc_ != 0, "%s failed: %d (%s)", what, rc_, sl_errmsg()); \
	} while (0)

/*
 * malloc, counted.  This program is linked with -Wl,--wrap=malloc
 * (tests/meson.build): every call of malloc in its objects and in the
 * backend's (a static library) comes here; the C library's own calls do
 * not.  Counted while `counting` is set.
 */
void *__real_malloc(size_t n);
void *__wrap_malloc(size_t n);
static atomic_bool counting;
static atomic_long mallocs;

void *__wrap_malloc(size_t n)
{
	if (atomic_load(&counting))
		atomic_fetch_add(&mallocs, 1);
	return __real_malloc(n);
}

enum { MODE_DEFAULT, MODE_ALL_QUEUED, MODE_LATE, MODE_SYNC, N_MODES };
static const char *const mode_names[N_MODES] = { "default", "all copies queued", "copies late",
						 "sync" };

/* A CPU backend in the given mode (the variables are read at creation). */
static sl_backend *make_backend(int mode)
{
	unsetenv("SLUICE_CPU_SYNC_QUEUES");
	unsetenv("SLUICE_CPU_INLINE_BYTES");
	unsetenv("SLUICE_CPU_LATE_COPIES");
	if (mode == MODE_SYNC)
		setenv("SLUICE_CPU_SYNC_QUEUES", "1", 1);
	if (mode == MODE_ALL_QUEUED)
		setenv("SLUICE_CPU_INLINE_BYTES", "0", 1);
	if (mode == MODE_LATE)
		setenv("SLUICE_CPU_LATE_COPIES", "100", 1);
	sl_backend *b = NULL;
	ok(sl_backend_create("cpu", 2, &b), "sl_backend_create");
	unsetenv("SLUICE_CPU_SYNC_QUEUES");
	unsetenv("SLUICE_CPU_INLINE_BYTES");
	unsetenv("SLUICE_CPU_LATE_COPIES");
	return b;
}

typedef struct rng {
	uint64_t s;
} rng;

static uint64_t rng_u64(rng *r) /* xorshift64* */
{
	r->s ^= r->s >> 12;
	r->s ^= r->s << 25;
	r->s ^= r->s >> 27;
	return r->s * 0x2545F4914F6CDD1Dull;
}

static size_t rng_below(rng *r, size_t n)
{
	return n ? (size_t)(rng_u64(r) % n) : 0;
}

static void fill(rng *r, void *p, size_t n)
{
	unsigned char *c = p;
	size_t i = 0;
	for (; i + 8 <= n; i += 8) {
		uint64_t v = rng_u64(r);
		memcpy(c + i, &v, 8);
	}
	for (; i < n; i++)
		c[i] = (unsigned char)rng_u64(r);
}

/* fp32 values in [-1, 1) and fp16 ones, for GEMM inputs */
static void fill_f32(rng *r, float *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		x[i] = (float)((double)(rng_u64(r) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static void fill_f16(rng *r, sl_half *w, size_t n)
{
	for (size_t i = 0; i < n; i++)
		w[i] = sl_float_to_half((float)((double)(rng_u64(r) >> 11) / 9007199254740992.0 - 0.5));
}

static void *dev(sl_backend *b, size_t n, int byte)
{
	void *p = NULL;
	ok(sl_dev_alloc(b, n, "test buffer", &p), "sl_dev_alloc");
	memset(p, byte, n); /* the CPU backend's device memory is host memory */
	return p;
}

static void *pinned(sl_backend *b, size_t n)
{
	void *p = NULL;
	ok(sl_host_alloc(b, n, "test buffer", &p), "sl_host_alloc");
	return p;
}

static void check_bytes(const void *got, const void *want, size_t n, const char *what)
{
	if (memcmp(got, want, n) == 0)
		return;
	const unsigned char *g = got, *w = want;
	size_t i = 0;
	while (g[i] == w[i])
		i++;
	ck_abort_msg("%s: byte %zu of %zu is %d, want %d", what, i, n, g[i], w[i]);
}

/* ---- a copy, an event, a wait, then an op or a memset -------------------------- */

START_TEST(test_chain_gemm)
{
	const int mode = _i;
	sl_backend *b = make_backend(mode);
	sl_queue *qa, *qb;
	sl_event *e;
	ok(b->ops->queue_create(b, &qa), "queue_create");
	ok(b->ops->queue_create(b, &qb), "queue_create");
	ok(b->ops->event_create(b, &e), "event_create");
	const int m = 8, n = 1024, k = 2048; /* x 64 KiB, w 4 MiB: both queued */
	rng r = { 12345 };
	float *hx = pinned(b, (size_t)m * k * 4);
	sl_half *hw = pinned(b, (size_t)n * k * 2);
	fill_f32(&r, hx, (size_t)m * k);
	fill_f16(&r, hw, (size_t)n * k);
	/* the expected result: the same GEMM on buffers filled beforehand */
	float *ry = dev(b, (size_t)m * n * 4, 0);
	sl_gemm_args a = { .m = m, .n = n, .k = k, .x = hx, .ldx = k, .w = hw, .y = ry, .ldy = n };
	ok(b->ops->gemm(b, qb, &a), "reference gemm");

	for (int rep = 0; rep < 4; rep++) {
		/* NaN bytes until the copies land */
		float *dx = dev(b, (size_t)m * k * 4, 0xff);
		sl_half *dw = dev(b, (size_t)n * k * 2, 0xff);
		float *dy = dev(b, (size_t)m * n * 4, 0);
		ok(b->ops->copy_h2d(b, qa, dw, hw, (size_t)n * k * 2), "copy_h2d w");
		ok(b->ops->copy_h2d(b, qa, dx, hx, (size_t)m * k * 4), "copy_h2d x");
		ok(b->ops->event_record(b, e, qa), "event_record");
		ok(b->ops->queue_wait(b, qb, e), "queue_wait");
		sl_gemm_args ga = a;
		ga.x = dx;
		ga.w = dw;
		ga.y = dy;
		ok(b->ops->gemm(b, qb, &ga), "gemm after the wait");
		check_bytes(dy, ry, (size_t)m * n * 4, mode_names[mode]);
		sl_dev_free(b, dx, (size_t)m * k * 4);
		sl_dev_free(b, dw, (size_t)n * k * 2);
		sl_dev_free(b, dy, (size_t)m * n * 4);
	}
	ck_assert_msg(b->gemm_flop > 0 && b->gemm_seconds > 0, "GEMM accounting");
	sl_dev_free(b, ry, (size_t)m * n * 4);
	sl_host_free(b, hx, (size_t)m * k * 4);
	sl_host_free(b, hw, (size_t)n * k * 2);
	b->ops->event_free(b, e);
	b->ops->queue_free(b, qa);
	b->ops->queue_free(b, qb);
	sl_backend_free(b);
}
END_TEST

START_TEST(test_chain_memset)
{
	/* A copies into d; B waits, memsets the first part, copies d back: the
	 * memset must come after A's copy (not be overwritten by it) */
	const int mode = _i;
	sl_backend *b = make_backend(mode);
	sl_queue *qa, *qb;
	sl_event *e;
	ok(b->ops->queue_create(b, &qa), "queue_create");
	ok(b->ops->queue_create(b, &qb), "queue_create");
	ok(b->ops->event_create(b, &e), "event_create");
	const size_t n = (size_t)16 << 20;
	rng r = { 777 };
	unsigned char *h = pinned(b, n), *back = pinned(b, n), *want = malloc(n);
	unsigned char *d = dev(b, n, 0);
	for (int rep = 0; rep < 3; rep++) {
		fill(&r, h, n);
		const size_t part = rep == 0 ? 100 : rep == 1 ? (size_t)40 << 10 : (size_t)5 << 20;
		memcpy(want, h, n);
		memset(want, 0x3c, part);
		ok(b->ops->copy_h2d(b, qa, d, h, n), "copy_h2d");
		ok(b->ops->event_record(b, e, qa), "event_record");
		ok(b->ops->queue_wait(b, qb, e), "queue_wait");
		ok(b->ops->memset_dev(b, qb, d, 0x3c, part), "memset_dev");
		ok(b->ops->copy_d2h(b, qb, back, d, n), "copy_d2h");
		ok(b->ops->queue_sync(b, qb), "queue_sync");
		check_bytes(back, want, n, mode_names[mode]);
		/* h is A's source: A must be done before h is refilled */
		ok(b->ops->queue_sync(b, qa), "queue_sync");
	}
	free(want);
	sl_host_free(b, h, n);
	sl_host_free(b, back, n);
	sl_dev_free(b, d, n);
	b->ops->event_free(b, e);
	b->ops->queue_free(b, qa);
	b->ops->queue_free(b, qb);
	sl_backend_free(b);
}
END_TEST

/* ---- a random program against its sequential model ------------------------------ */

#define NQ 3
#define HOST NQ /* the host is agent NQ */
#define NAG (NQ + 1)
#define NDEV 6
#define NHOST 3
#define NBUF (NDEV + NHOST)
#define NEV 4
#define BUF_BYTES ((size_t)1 << 20)
#define STEPS 400
/* the GEMM of the program: x (GM, GK) fp32, w (GN, GK) fp16, y (GM, GN) */
#define GM 4
#define GN 128
#define GK 64

typedef struct buf_use {
	int w_agent; /* last writer, -1: none since the start */
	uint64_t w_idx;
	uint64_t r_idx[NAG]; /* latest read by each agent since that write */
} buf_use;

typedef struct prog {
	sl_backend *b, *mb; /* under test; the model's (serial) */
	sl_queue *q[NQ];
	sl_event *ev[NEV];
	unsigned char *buf[NBUF];  /* NDEV device then NHOST pinned host buffers */
	unsigned char *mbuf[NBUF]; /* the model's */
	uint64_t cnt[NAG];         /* buffer-touching operations issued per agent */
	uint64_t vc[NAG][NAG];     /* vc[a][g]: g's operations known ordered before a's next */
	uint64_t evc[NEV][NAG];    /* what each event's latest record stands for */
	buf_use use[NBUF];
	rng r;
	int waits, syncs, copies, gemms, host_checks;
} prog;

static void merge(uint64_t *dst, const uint64_t *src)
{
	for (int g = 0; g < NAG; g++)
		if (src[g] > dst[g])
			dst[g] = src[g];
}

/* What agent a has issued so far, with what it is ordered after. */
static void snapshot(const prog *p, int a, uint64_t *out)
{
	memcpy(out, p->vc[a], sizeof p->vc[a]);
	out[a] = p->cnt[a];
}

static void host_sync(prog *p, int qi)
{
	uint64_t s[NAG];
	snapshot(p, qi, s);
	if (rng_below(&p->r, 2)) {
		ok(p->b->ops->queue_sync(p->b, p->q[qi]), "queue_sync");
	} else {
		const int e = (int)rng_below(&p->r, NEV);
		ok(p->b->ops->event_record(p->b, p->ev[e], p->q[qi]), "event_record");
		memcpy(p->evc[e], s, sizeof s);
		ok(p->b->ops->event_sync(p->b, p->ev[e]), "event_sync");
	}
	merge(p->vc[HOST], s);
	p->syncs++;
}

static void queue_wait_on(prog *p, int qa, int qr)
{
	const int e = (int)rng_below(&p->r, NEV);
	ok(p->b->ops->event_record(p->b, p->ev[e], p->q[qr]), "event_record");
	snapshot(p, qr, p->evc[e]);
	ok(p->b->ops->queue_wait(p->b, p->q[qa], p->ev[e]), "queue_wait");
	merge(p->vc[qa], p->evc[e]);
	p->waits++;
}

/* Make operation idx of agent g ordered before agent a's next operation. */
static void order_after(prog *p, int a, int g, uint64_t idx)
{
	if (g == a || p->vc[a][g] >= idx)
		return;
	SL_ASSERT(g != HOST); /* the host's own operations precede what it issues */
	if (a == HOST) {
		host_sync(p, g);
	} else if (rng_below(&p->r, 4)) {
		queue_wait_on(p, a, g);
	} else {
		host_sync(p, g);
		uint64_t h[NAG];
		snapshot(p, HOST, h);
		merge(p->vc[a], h);
	}
}

static void need(prog *p, int a, int bi, bool write)
{
	buf_use *u = &p->use[bi];
	if (u->w_agent >= 0)
		order_after(p, a, u->w_agent, u->w_idx);
	if (write)
		for (int g = 0; g < NAG; g++)
			if (u->r_idx[g])
				order_after(p, a, g, u->r_idx[g]);
}

static void touched(prog *p, int a, int bi, bool write)
{
	buf_use *u = &p->use[bi];
	if (write) {
		u->w_agent = a;
		u->w_idx = p->cnt[a];
		memset(u->r_idx, 0, sizeof u->r_idx);
	} else if (p->cnt[a] > u->r_idx[a]) {
		u->r_idx[a] = p->cnt[a];
	}
}

/* Before a queue operation: what the host did or knows done precedes it. */
static void issue_on(prog *p, int qi)
{
	uint64_t h[NAG];
	snapshot(p, HOST, h);
	merge(p->vc[qi], h);
}

static size_t copy_len(prog *p)
{
	return rng_below(&p->r, 2) ? 1 + rng_below(&p->r, 64 << 10)
				   : ((size_t)64 << 10) + rng_below(&p->r, BUF_BYTES - (64 << 10) + 1);
}

static void step_copy(prog *p)
{
	const int qi = (int)rng_below(&p->r, NQ);
	const int kind = (int)rng_below(&p->r, 4); /* h2d, d2h, d2d, memset */
	int src = -1, dst;
	if (kind == 0) {
		src = NDEV + (int)rng_below(&p->r, NHOST);
		dst = (int)rng_below(&p->r, NDEV);
	} else if (kind == 1) {
		src = (int)rng_below(&p->r, NDEV);
		dst = NDEV + (int)rng_below(&p->r, NHOST);
	} else if (kind == 2) {
		src = (int)rng_below(&p->r, NDEV);
		dst = (src + 1 + (int)rng_below(&p->r, NDEV - 1)) % NDEV;
	} else {
		dst = (int)rng_below(&p->r, NDEV);
	}
	const size_t n = copy_len(p);
	const size_t so = rng_below(&p->r, BUF_BYTES - n + 1), dof = rng_below(&p->r, BUF_BYTES - n + 1);
	const int value = (int)rng_below(&p->r, 256);
	issue_on(p, qi);
	if (src >= 0)
		need(p, qi, src, false);
	need(p, qi, dst, true);
	sl_backend *b = p->b;
	sl_queue *q = p->q[qi];
	void *d = p->buf[dst] + dof;
	const void *s = src >= 0 ? p->buf[src] + so : NULL;
	if (kind == 0)
		ok(b->ops->copy_h2d(b, q, d, s, n), "copy_h2d");
	else if (kind == 1)
		ok(b->ops->copy_d2h(b, q, d, s, n), "copy_d2h");
	else if (kind == 2)
		ok(b->ops->copy_d2d(b, q, d, s, n), "copy_d2d");
	else
		ok(b->ops->memset_dev(b, q, d, value, n), "memset_dev");
	if (kind < 3)
		memcpy(p->mbuf[dst] + dof, p->mbuf[src] + so, n);
	else
		memset(p->mbuf[dst] + dof, value, n);
	p->cnt[qi]++;
	if (src >= 0)
		touched(p, qi, src, false);
	touched(p, qi, dst, true);
	p->copies++;
}

static void step_gemm(prog *p)
{
	const int qi = (int)rng_below(&p->r, NQ);
	int bx = (int)rng_below(&p->r, NDEV), bw, by;
	do
		bw = (int)rng_below(&p->r, NDEV);
	while (bw == bx);
	do
		by = (int)rng_below(&p->r, NDEV);
	while (by == bx || by == bw);
	issue_on(p, qi);
	need(p, qi, bx, false);
	need(p, qi, bw, false);
	need(p, qi, by, true);
	sl_gemm_args a = { .m = GM, .n = GN, .k = GK, .ldx = GK, .ldy = GN };
	a.x = (const float *)p->buf[bx];
	a.w = (const sl_half *)p->buf[bw];
	a.y = (float *)p->buf[by];
	ok(p->b->ops->gemm(p->b, p->q[qi], &a), "gemm");
	a.x = (const float *)p->mbuf[bx];
	a.w = (const sl_half *)p->mbuf[bw];
	a.y = (float *)p->mbuf[by];
	ok(p->mb->ops->gemm(p->mb, NULL, &a), "model gemm");
	p->cnt[qi]++;
	touched(p, qi, bx, false);
	touched(p, qi, bw, false);
	touched(p, qi, by, true);
	p->gemms++;
}

/* The host refills a host buffer, or reads one and compares it. */
static void step_host(prog *p, int step)
{
	const int bi = NDEV + (int)rng_below(&p->r, NHOST);
	const bool write = rng_below(&p->r, 2);
	need(p, HOST, bi, write);
	p->cnt[HOST]++;
	if (write) {
		const size_t off = rng_below(&p->r, BUF_BYTES / 2), n = rng_below(&p->r, BUF_BYTES / 2);
		fill(&p->r, p->buf[bi] + off, n);
		memcpy(p->mbuf[bi] + off, p->buf[bi] + off, n);
	} else {
		char what[64];
		snprintf(what, sizeof what, "host buffer %d at step %d", bi - NDEV, step);
		check_bytes(p->buf[bi], p->mbuf[bi], BUF_BYTES, what);
		p->host_checks++;
	}
	touched(p, HOST, bi, write);
}

static void run_program(int mode, uint64_t seed)
{
	prog *p = calloc(1, sizeof *p);
	p->r.s = seed * 0x9E3779B97F4A7C15ull + 1;
	p->b = make_backend(mode);
	p->mb = make_backend(MODE_SYNC);
	for (int i = 0; i < NQ; i++)
		ok(p->b->ops->queue_create(p->b, &p->q[i]), "queue_create");
	for (int i = 0; i < NEV; i++)
		ok(p->b->ops->event_create(p->b, &p->ev[i]), "event_create");
	for (int i = 0; i < NBUF; i++) {
		p->buf[i] = i < NDEV ? dev(p->b, BUF_BYTES, 0) : pinned(p->b, BUF_BYTES);
		p->mbuf[i] = malloc(BUF_BYTES);
		fill(&p->r, p->buf[i], BUF_BYTES); /* GEMMs see any bits, NaN too: same bits out */
		memcpy(p->mbuf[i], p->buf[i], BUF_BYTES);
		p->use[i].w_agent = -1;
	}
	for (int step = 0; step < STEPS; step++) {
		const int what = (int)rng_below(&p->r, 20);
		if (what < 10) {
			step_copy(p);
		} else if (what < 12) {
			step_gemm(p);
		} else if (what < 14) {
			step_host(p, step);
		} else if (what < 16) { /* an extra wait, maybe on a stale event */
			const int qi = (int)rng_below(&p->r, NQ), e = (int)rng_below(&p->r, NEV);
			ok(p->b->ops->queue_wait(p->b, p->q[qi], p->ev[e]), "queue_wait");
			merge(p->vc[qi], p->evc[e]);
		} else if (what < 18) { /* an extra (re-)record */
			const int qi = (int)rng_below(&p->r, NQ), e = (int)rng_below(&p->r, NEV);
			ok(p->b->ops->event_record(p->b, p->ev[e], p->q[qi]), "event_record");
			snapshot(p, qi, p->evc[e]);
		} else if (what < 19) {
			const int e = (int)rng_below(&p->r, NEV);
			ok(p->b->ops->event_sync(p->b, p->ev[e]), "event_sync");
			merge(p->vc[HOST], p->evc[e]);
		} else {
			host_sync(p, (int)rng_below(&p->r, NQ));
		}
	}
	for (int i = 0; i < NQ; i++)
		ok(p->b->ops->queue_sync(p->b, p->q[i]), "queue_sync");
	for (int i = 0; i < NBUF; i++) {
		char what[80];
		snprintf(what, sizeof what, "%s, seed %llu: buffer %d at the end", mode_names[mode],
			 (unsigned long long)seed, i);
		check_bytes(p->buf[i], p->mbuf[i], BUF_BYTES, what);
	}
	/* the generator did exercise the interface */
	ck_assert_int_gt(p->copies, 100);
	ck_assert_int_gt(p->gemms, 10);
	ck_assert_int_gt(p->waits, 10);
	ck_assert_int_gt(p->host_checks, 5);
	for (int i = 0; i < NBUF; i++) {
		if (i < NDEV)
			sl_dev_free(p->b, p->buf[i], BUF_BYTES);
		else
			sl_host_free(p->b, p->buf[i], BUF_BYTES);
		free(p->mbuf[i]);
	}
	for (int i = 0; i < NEV; i++)
		p->b->ops->event_free(p->b, p->ev[i]);
	for (int i = 0; i < NQ; i++)
		p->b->ops->queue_free(p->b, p->q[i]);
	sl_backend_free(p->b);
	sl_backend_free(p->mb);
	free(p);
}

START_TEST(test_random_program)
{
	/* _i: mode and seed */
	run_program(_i % N_MODES, 1 + (uint64_t)(_i / N_MODES));
}
END_TEST

/* ---- syncs, re-recorded events, freeing with work pending ------------------------ */

START_TEST(test_syncs_block)
{
	const int mode = _i;
	sl_backend *b = make_backend(mode);
	sl_queue *q;
	sl_event *e, *never;
	ok(b->ops->queue_create(b, &q), "queue_create");
	ok(b->ops->event_create(b, &e), "event_create");
	ok(b->ops->event_create(b, &never), "event_create");
	/* an event never recorded is complete */
	ok(b->ops->event_sync(b, never), "event_sync of an unrecorded event");
	ok(b->ops->queue_wait(b, q, never), "queue_wait on an unrecorded event");
	const size_t n = (size_t)32 << 20;
	rng r = { 99 };
	unsigned char *h = pinned(b, n), *back = pinned(b, n);
	unsigned char *d = dev(b, n, 0);
	fill(&r, h, n);
	ok(b->ops->copy_h2d(b, q, d, h, n), "copy_h2d");
	ok(b->ops->event_record(b, e, q), "event_record");
	ok(b->ops->event_sync(b, e), "event_sync");
	check_bytes(d, h, n, "after event_sync");
	memset(back, 0, n);
	ok(b->ops->copy_d2h(b, q, back, d, n), "copy_d2h");
	ok(b->ops->queue_sync(b, q), "queue_sync");
	check_bytes(back, h, n, "after queue_sync");
	/* the NULL queue: the backend's default queue */
	memset(back, 0, n);
	ok(b->ops->copy_d2h(b, NULL, back, d, n), "copy_d2h on the NULL queue");
	ok(b->ops->event_record(b, e, NULL), "event_record on the NULL queue");
	ok(b->ops->queue_wait(b, q, e), "queue_wait");
	ok(b->ops->memset_dev(b, q, d, 0, n), "memset_dev after the NULL queue's copy");
	ok(b->ops->queue_sync(b, NULL), "queue_sync(NULL)");
	check_bytes(back, h, n, "the NULL queue");
	ok(b->ops->queue_sync(b, q), "queue_sync");
	FAIL_IF(d[0] || d[n - 1], "memset_dev lost");
	/* a zero-byte copy is nothing; NULL pointers with bytes are refused */
	ok(b->ops->copy_h2d(b, q, NULL, NULL, 0), "copy of 0 bytes");
	ck_assert_int_eq(b->ops->copy_h2d(b, q, NULL, h, 8), SL_EINVAL);
	sl_host_free(b, h, n);
	sl_host_free(b, back, n);
	sl_dev_free(b, d, n);
	b->ops->event_free(b, e);
	b->ops->event_free(b, never);
	b->ops->queue_free(b, q);
	sl_backend_free(b);
}
END_TEST

START_TEST(test_rerecord)
{
	/* e recorded on A, then re-recorded on B after B's copy: a wait on e
	 * orders after B's copy */
	const int mode = _i;
	sl_backend *b = make_backend(mode);
	sl_queue *qa, *qb, *qc;
	sl_event *e;
	ok(b->ops->queue_create(b, &qa), "queue_create");
	ok(b->ops->queue_create(b, &qb), "queue_create");
	ok(b->ops->queue_create(b, &qc), "queue_create");
	ok(b->ops->event_create(b, &e), "event_create");
	const size_t n = (size_t)8 << 20;
	rng r = { 4242 };
	unsigned char *h1 = pinned(b, n), *h2 = pinned(b, n), *back = pinned(b, n);
	unsigned char *d1 = dev(b, n, 0), *d2 = dev(b, n, 0);
	for (int rep = 0; rep < 4; rep++) {
		fill(&r, h1, n);
		fill(&r, h2, n);
		ok(b->ops->copy_h2d(b, qa, d1, h1, n), "copy_h2d on A");
		ok(b->ops->event_record(b, e, qa), "event_record on A");
		ok(b->ops->copy_h2d(b, qb, d2, h2, n), "copy_h2d on B");
		ok(b->ops->event_record(b, e, qb), "event re-recorded on B");
		ok(b->ops->queue_wait(b, qc, e), "queue_wait on C");
		ok(b->ops->copy_d2h(b, qc, back, d2, n), "copy_d2h on C");
		ok(b->ops->queue_sync(b, qc), "queue_sync");
		check_bytes(back, h2, n, mode_names[mode]);
		/* re-recorded on an idle queue: complete at once */
		ok(b->ops->event_record(b, e, qc), "event_record on idle C");
		ok(b->ops->event_sync(b, e), "event_sync");
		ok(b->ops->queue_sync(b, qa), "queue_sync");
		ok(b->ops->queue_sync(b, qb), "queue_sync");
		check_bytes(d1, h1, n, "A's copy");
	}
	sl_host_free(b, h1, n);
	sl_host_free(b, h2, n);
	sl_host_free(b, back, n);
	sl_dev_free(b, d1, n);
	sl_dev_free(b, d2, n);
	b->ops->event_free(b, e);
	b->ops->queue_free(b, qa);
	b->ops->queue_free(b, qb);
	b->ops->queue_free(b, qc);
	sl_backend_free(b);
}
END_TEST

/* Threads of this process (/proc/self/task). */
static int thread_count(void)
{
	DIR *d = opendir("/proc/self/task");
	if (!d)
		return -1;
	int n = 0;
	struct dirent *de;
	while ((de = readdir(d)))
		if (de->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

START_TEST(test_free_drains)
{
	const int mode = _i;
	sl_backend *b = make_backend(mode);
	sl_queue *q, *q2;
	sl_event *e;
	ok(b->ops->queue_create(b, &q2), "queue_create");
	ok(b->ops->event_create(b, &e), "event_create");
	const size_t n = (size_t)8 << 20;
	const int nc = 4;
	rng r = { 31337 };
	unsigned char *h = pinned(b, n * nc), *back = pinned(b, n * nc);
	unsigned char *d = dev(b, n * nc, 0);
	fill(&r, h, n * nc);
	const int threads0 = thread_count();
	ok(b->ops->queue_create(b, &q), "queue_create");
	for (int i = 0; i < nc; i++)
		ok(b->ops->copy_h2d(b, q, d + i * n, h + i * n, n), "copy_h2d");
	ok(b->ops->event_record(b, e, q), "event_record");
	const int threads1 = thread_count();
	if (threads0 > 0 && mode != MODE_SYNC)
		ck_assert_int_gt(threads1, threads0); /* the queue's worker */
	b->ops->queue_free(b, q); /* drains: the copies are done */
	check_bytes(d, h, n * nc, "after queue_free");
	if (threads0 > 0) { /* the worker is joined; sync queues have none.  A
			     * joined thread can linger in /proc for a moment
			     * after it exits: allow it up to two seconds */
		const int want = threads1 - (mode != MODE_SYNC);
		int now = thread_count();
		for (int i = 0; i < 2000 && now > want; i++) {
			usleep(1000);
			now = thread_count();
		}
		ck_assert_int_eq(now, want);
	}
	/* the event of a freed queue is complete */
	ok(b->ops->event_sync(b, e), "event_sync after queue_free");
	ok(b->ops->queue_wait(b, q2, e), "queue_wait after queue_free");

	/* dev_free and host_free wait for queued copies that use the memory
	 * (ASan would see a copy from freed memory) */
	unsigned char *src = pinned(b, n), *want = malloc(n);
	fill(&r, src, n);
	memcpy(want, src, n);
	ok(b->ops->copy_h2d(b, q2, d, src, n), "copy_h2d");
	sl_host_free(b, src, n);
	unsigned char *dsrc = dev(b, n, 0);
	memcpy(dsrc, want, n);
	ok(b->ops->copy_d2h(b, q2, back, dsrc, n), "copy_d2h");
	sl_dev_free(b, dsrc, n);
	ok(b->ops->queue_sync(b, q2), "queue_sync");
	check_bytes(d, want, n, "copy from memory freed after the issue");
	check_bytes(back, want, n, "copy from device memory freed after the issue");
	free(want);
	b->ops->event_free(b, e);
	b->ops->queue_free(b, q2);
	sl_host_free(b, h, n * nc);
	sl_host_free(b, back, n * nc);
	sl_dev_free(b, d, n * nc);
	/* work left on the NULL queue is done by sl_backend_free */
	unsigned char *m1 = malloc(n), *m2 = calloc(1, n);
	fill(&r, m1, n);
	ok(b->ops->copy_h2d(b, NULL, m2, m1, n), "copy_h2d on the NULL queue");
	sl_backend_free(b);
	check_bytes(m2, m1, n, "after sl_backend_free");
	free(m1);
	free(m2);
}
END_TEST

/* ---- the per-token loop allocates nothing ------------------------------------------ */

START_TEST(test_steps_allocate_nothing)
{
	/* A step as the schedule issues it: a copy on one queue, an event, a
	 * wait for it on another, a copy there, a sync.  At most three tasks
	 * are in flight at once (the sync ends the step with none), so 200
	 * steps may allocate three tasks at most, not one per task. */
	const int mode = _i;
	sl_backend *b = make_backend(mode);
	sl_queue *q1, *q2;
	sl_event *e;
	ok(b->ops->queue_create(b, &q1), "queue_create");
	ok(b->ops->queue_create(b, &q2), "queue_create");
	ok(b->ops->event_create(b, &e), "event_create");
	const size_t n = (size_t)256 << 10; /* above the inline size: queued */
	rng r = { 7 };
	unsigned char *h = pinned(b, n), *back = pinned(b, n);
	unsigned char *d = dev(b, n, 0);
	fill(&r, h, n);
	const int steps = 200;
	atomic_store(&mallocs, 0);
	atomic_store(&counting, true);
	for (int s = 0; s < steps; s++) {
		h[s] = (unsigned char)s;
		ok(b->ops->copy_h2d(b, q1, d, h, n), "copy_h2d");
		ok(b->ops->event_record(b, e, q1), "event_record");
		ok(b->ops->queue_wait(b, q2, e), "queue_wait");
		ok(b->ops->copy_d2h(b, q2, back, d, n), "copy_d2h");
		ok(b->ops->queue_sync(b, q2), "queue_sync");
	}
	atomic_store(&counting, false);
	check_bytes(back, h, n, "after the last step");
	ck_assert_msg(atomic_load(&mallocs) <= 3, "%s: %ld mallocs in %d steps, want at most 3 (the tasks in flight)",
		      mode_names[mode], (long)atomic_load(&mallocs), steps);
	sl_host_free(b, h, n);
	sl_host_free(b, back, n);
	sl_dev_free(b, d, n);
	b->ops->event_free(b, e);
	b->ops->queue_free(b, q1);
	b->ops->queue_free(b, q2);
	sl_backend_free(b);
}
END_TEST

static Suite *queues_suite(void)
{
	Suite *s = suite_create("queues");
	TCase *tc = tcase_create("queues");
	tcase_set_timeout(tc, 300);
	tcase_add_loop_test(tc, test_chain_gemm, 0, N_MODES);
	tcase_add_loop_test(tc, test_chain_memset, 0, N_MODES);
	tcase_add_loop_test(tc, test_random_program, 0, 2 * N_MODES);
	tcase_add_loop_test(tc, test_syncs_block, 0, N_MODES);
	tcase_add_loop_test(tc, test_rerecord, 0, N_MODES);
	tcase_add_loop_test(tc, test_free_drains, 0, N_MODES);
	tcase_add_loop_test(tc, test_steps_allocate_nothing, 0, N_MODES);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return sl_test_run(queues_suite());
}
