/*
 * test_backend_wrappers.c - the thin wrappers of kernels/backend.h, made
 * from kernels/backend_ops.def: sl_<call>(b, ...) must be b->ops-><call>(b,
 * ...), its arguments passed through in order and the backend's result
 * returned, for every queue, event, copy and op call; and a call the
 * backend's table lacks must fail with SL_EUNSUPPORTED and a message naming
 * the backend and the call (the void ones: do nothing).
 *
 * And the buffer handle (sl_buf): sl_buf_free gives back exactly the
 * bytes and the tier the handle was allocated with, through that tier's
 * free, and zeroes the handle, so that freeing it again does nothing.
 *
 * The wrappers run against a backend whose members log their calls; the
 * logging functions and the expected logs are written out here by hand, one
 * per call, independently of the list.
 */
#include "backend.h"

#include <check.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* ---- the wrappers: sl_<call>(b, ...) is b->ops-><call>(b, ...) ------------ */

/*
 * A backend whose every call writes its name and arguments to g_log and
 * returns a value of its own.  Pointer arguments are slots of g_mem, logged
 * by index, so that each argument of a call is told apart from the others
 * (a wrapper passing two of them in the wrong order fails).
 */
static max_align_t g_mem[16];
static char g_log[256];
static sl_backend *g_logged_b;

static int slot(const void *p)
{
	return p ? (int)(((const char *)p - (const char *)g_mem) / (long)sizeof g_mem[0]) : -1;
}

static void *mem(int i)
{
	return &g_mem[i];
}

#define LOGCALL(b, ...)                                                       \
	do {                                                                  \
		g_logged_b = (b);                                             \
		snprintf(g_log, sizeof g_log, __VA_ARGS__);                   \
	} while (0)

static int fk_queue_create(sl_backend *b, sl_queue **out)
{
	LOGCALL(b, "queue_create %d", slot(out));
	return 101;
}
static void fk_queue_free(sl_backend *b, sl_queue *q)
{
	LOGCALL(b, "queue_free %d", slot(q));
}
static int fk_queue_sync(sl_backend *b, sl_queue *q)
{
	LOGCALL(b, "queue_sync %d", slot(q));
	return 102;
}
static int fk_event_create(sl_backend *b, sl_event **out)
{
	LOGCALL(b, "event_create %d", slot(out));
	return 103;
}
static void fk_event_free(sl_backend *b, sl_event *e)
{
	LOGCALL(b, "event_free %d", slot(e));
}
static int fk_event_record(sl_backend *b, sl_event *e, sl_queue *q)
{
	LOGCALL(b, "event_record %d %d", slot(e), slot(q));
	return 104;
}
static int fk_queue_wait(sl_backend *b, sl_queue *q, sl_event *e)
{
	LOGCALL(b, "queue_wait %d %d", slot(q), slot(e));
	return 105;
}
static int fk_event_sync(sl_backend *b, sl_event *e)
{
	LOGCALL(b, "event_sync %d", slot(e));
	return 106;
}
static int fk_copy_h2d(sl_backend *b, sl_queue *q, void *dst, const void *src, size_t n)
{
	LOGCALL(b, "copy_h2d %d %d %d %zu", slot(q), slot(dst), slot(src), n);
	return 107;
}
static int fk_copy_d2h(sl_backend *b, sl_queue *q, void *dst, const void *src, size_t n)
{
	LOGCALL(b, "copy_d2h %d %d %d %zu", slot(q), slot(dst), slot(src), n);
	return 108;
}
static int fk_copy_d2d(sl_backend *b, sl_queue *q, void *dst, const void *src, size_t n)
{
	LOGCALL(b, "copy_d2d %d %d %d %zu", slot(q), slot(dst), slot(src), n);
	return 109;
}
static int fk_memset_dev(sl_backend *b, sl_queue *q, void *dst, int value, size_t n)
{
	LOGCALL(b, "memset_dev %d %d %d %zu", slot(q), slot(dst), value, n);
	return 110;
}
static int fk_gemm(sl_backend *b, sl_queue *q, const sl_gemm_args *a)
{
	LOGCALL(b, "gemm %d %d", slot(q), slot(a));
	return 111;
}
static int fk_layernorm(sl_backend *b, sl_queue *q, int rows, int n, const float *x, int ldx,
			const sl_half *gamma, const sl_half *beta, float eps, float *y, int ldy)
{
	LOGCALL(b, "layernorm %d %d %d %d %d %d %d %g %d %d", slot(q), rows, n, slot(x), ldx,
		slot(gamma), slot(beta), eps, slot(y), ldy);
	return 112;
}
static int fk_embed(sl_backend *b, sl_queue *q, int rows, int n, const sl_half *table,
		    const int32_t *idx, float *y, bool accumulate)
{
	LOGCALL(b, "embed %d %d %d %d %d %d %d", slot(q), rows, n, slot(table), slot(idx), slot(y),
		accumulate);
	return 113;
}
static int fk_attn_prefill(sl_backend *b, sl_queue *q, const sl_attn_args *a)
{
	LOGCALL(b, "attn_prefill %d %d", slot(q), slot(a));
	return 114;
}
static int fk_attn_decode(sl_backend *b, sl_queue *q, const sl_attn_args *a)
{
	LOGCALL(b, "attn_decode %d %d", slot(q), slot(a));
	return 115;
}
static int fk_h2o_compact(sl_backend *b, sl_queue *q, const sl_h2o_args *a)
{
	LOGCALL(b, "h2o_compact %d %d", slot(q), slot(a));
	return 116;
}
static int fk_h2o_evict(sl_backend *b, sl_queue *q, const sl_h2o_args *a)
{
	LOGCALL(b, "h2o_evict %d %d", slot(q), slot(a));
	return 117;
}
static int fk_argmax(sl_backend *b, sl_queue *q, int rows, int n, const float *x, int ldx,
		     int32_t *out)
{
	LOGCALL(b, "argmax %d %d %d %d %d %d", slot(q), rows, n, slot(x), ldx, slot(out));
	return 118;
}

static int fk_rmsnorm(sl_backend *b, sl_queue *q, int rows, int n, const float *x, int ldx,
		      const sl_half *gamma, float eps, float *y, int ldy)
{
	LOGCALL(b, "rmsnorm %d %d %d %d %d %d %g %d %d", slot(q), rows, n, slot(x), ldx, slot(gamma),
		eps, slot(y), ldy);
	return 119;
}
static int fk_rope(sl_backend *b, sl_queue *q, const sl_rope_args *a)
{
	LOGCALL(b, "rope %d %d", slot(q), slot(a));
	return 120;
}
static int fk_swiglu(sl_backend *b, sl_queue *q, int rows, int n, const float *gate, int ldg,
		     const float *up, int ldu, float *out, int ldo)
{
	LOGCALL(b, "swiglu %d %d %d %d %d %d %d %d %d", slot(q), rows, n, slot(gate), ldg, slot(up),
		ldu, slot(out), ldo);
	return 121;
}

static const sl_backend_ops fake_ops = {
	.name = "fake",
	.queue_create = fk_queue_create,
	.queue_free = fk_queue_free,
	.queue_sync = fk_queue_sync,
	.event_create = fk_event_create,
	.event_free = fk_event_free,
	.event_record = fk_event_record,
	.queue_wait = fk_queue_wait,
	.event_sync = fk_event_sync,
	.copy_h2d = fk_copy_h2d,
	.copy_d2h = fk_copy_d2h,
	.copy_d2d = fk_copy_d2d,
	.memset_dev = fk_memset_dev,
	.gemm = fk_gemm,
	.layernorm = fk_layernorm,
	.embed = fk_embed,
	.attn_prefill = fk_attn_prefill,
	.attn_decode = fk_attn_decode,
	.h2o_compact = fk_h2o_compact,
	.h2o_evict = fk_h2o_evict,
	.argmax = fk_argmax,
	.rmsnorm = fk_rmsnorm,
	.rope = fk_rope,
	.swiglu = fk_swiglu,
};

/* the wrapper's result, and the call the fake backend logged */
#define EXPECT_CALL(b, rc, call, log)                                          \
	do {                                                                  \
		g_log[0] = '\0';                                              \
		g_logged_b = NULL;                                            \
		ck_assert_int_eq((call), (rc));                               \
		ck_assert_str_eq(g_log, (log));                               \
		ck_assert_ptr_eq(g_logged_b, (b));                            \
	} while (0)

START_TEST(test_wrappers_forward)
{
	sl_backend fb = { .ops = &fake_ops };
	sl_backend *b = &fb;
	sl_queue *q = mem(1);
	sl_event *e = mem(2);

	EXPECT_CALL(b, 101, sl_queue_create(b, (sl_queue **)mem(3)), "queue_create 3");
	EXPECT_CALL(b, 102, sl_queue_sync(b, q), "queue_sync 1");
	EXPECT_CALL(b, 102, sl_queue_sync(b, NULL), "queue_sync -1");
	EXPECT_CALL(b, 103, sl_event_create(b, (sl_event **)mem(4)), "event_create 4");
	EXPECT_CALL(b, 104, sl_event_record(b, e, q), "event_record 2 1");
	EXPECT_CALL(b, 105, sl_queue_wait(b, q, e), "queue_wait 1 2");
	EXPECT_CALL(b, 106, sl_event_sync(b, e), "event_sync 2");
	EXPECT_CALL(b, 107, sl_copy_h2d(b, q, mem(5), mem(6), 77), "copy_h2d 1 5 6 77");
	EXPECT_CALL(b, 108, sl_copy_d2h(b, q, mem(6), mem(5), 78), "copy_d2h 1 6 5 78");
	EXPECT_CALL(b, 109, sl_copy_d2d(b, q, mem(7), mem(8), 79), "copy_d2d 1 7 8 79");
	EXPECT_CALL(b, 110, sl_memset_dev(b, q, mem(9), 0x5a, 80), "memset_dev 1 9 90 80");
	EXPECT_CALL(b, 111, sl_gemm(b, q, mem(10)), "gemm 1 10");
	EXPECT_CALL(b, 112, sl_layernorm(b, q, 3, 4, mem(5), 6, mem(7), mem(8), 0.25f, mem(9), 10),
		    "layernorm 1 3 4 5 6 7 8 0.25 9 10");
	EXPECT_CALL(b, 113, sl_embed(b, q, 3, 4, mem(5), mem(6), mem(7), true),
		    "embed 1 3 4 5 6 7 1");
	EXPECT_CALL(b, 113, sl_embed(b, q, 3, 4, mem(5), mem(6), mem(7), false),
		    "embed 1 3 4 5 6 7 0");
	EXPECT_CALL(b, 114, sl_attn_prefill(b, q, mem(11)), "attn_prefill 1 11");
	EXPECT_CALL(b, 115, sl_attn_decode(b, q, mem(12)), "attn_decode 1 12");
	EXPECT_CALL(b, 116, sl_h2o_compact(b, q, mem(13)), "h2o_compact 1 13");
	EXPECT_CALL(b, 117, sl_h2o_evict(b, q, mem(14)), "h2o_evict 1 14");
	EXPECT_CALL(b, 118, sl_argmax(b, q, 3, 4, mem(5), 6, mem(7)), "argmax 1 3 4 5 6 7");
	EXPECT_CALL(b, 119, sl_rmsnorm(b, q, 3, 4, mem(5), 6, mem(7), 0.25f, mem(9), 10),
		    "rmsnorm 1 3 4 5 6 7 0.25 9 10");
	EXPECT_CALL(b, 120, sl_rope(b, q, mem(11)), "rope 1 11");
	EXPECT_CALL(b, 121, sl_swiglu(b, q, 3, 4, mem(5), 6, mem(7), 8, mem(9), 10),
		    "swiglu 1 3 4 5 6 7 8 9 10");

	g_log[0] = '\0';
	sl_queue_free(b, q);
	ck_assert_str_eq(g_log, "queue_free 1");
	sl_event_free(b, e);
	ck_assert_str_eq(g_log, "event_free 2");
}
END_TEST

/* A backend without a call: the int wrappers fail with a message naming the
 * backend and the call, the void ones do nothing. */
START_TEST(test_wrappers_missing)
{
	static const sl_backend_ops bare_ops = { .name = "bare" };
	sl_backend bb = { .ops = &bare_ops };
	sl_queue *q = mem(1);

	ck_assert_int_eq(sl_h2o_compact(&bb, q, mem(2)), SL_EUNSUPPORTED);
	ck_assert_str_eq(sl_errmsg(), "backend 'bare' has no h2o_compact");
	ck_assert_int_eq(sl_h2o_evict(&bb, q, mem(2)), SL_EUNSUPPORTED);
	ck_assert_str_eq(sl_errmsg(), "backend 'bare' has no h2o_evict");
	ck_assert_int_eq(sl_rope(&bb, q, mem(2)), SL_EUNSUPPORTED);
	ck_assert_str_eq(sl_errmsg(), "backend 'bare' has no rope");
	ck_assert_int_eq(sl_queue_create(&bb, (sl_queue **)mem(3)), SL_EUNSUPPORTED);
	ck_assert_str_eq(sl_errmsg(), "backend 'bare' has no queue_create");
	ck_assert_int_eq(sl_copy_h2d(&bb, q, mem(4), mem(5), 8), SL_EUNSUPPORTED);
	ck_assert_str_eq(sl_errmsg(), "backend 'bare' has no copy_h2d");
	sl_queue_free(&bb, q);
	sl_event_free(&bb, mem(2));
}
END_TEST

/* ---- sl_buf: a buffer that knows its size and tier ------------------------ */

/* Memory calls that hand out g_mem slots (5: device, 6: host) and log;
 * an allocation of 999 bytes fails as the hardware would. */
static int fk_dev_alloc(sl_backend *b, size_t bytes, void **out)
{
	LOGCALL(b, "dev_alloc %zu", bytes);
	if (bytes == 999)
		return sl_err(SL_ENOMEM, "fake: no device memory");
	*out = mem(5);
	return 0;
}
static void fk_dev_free(sl_backend *b, void *p)
{
	LOGCALL(b, "dev_free %d", slot(p));
}
static int fk_host_alloc(sl_backend *b, size_t bytes, void **out)
{
	LOGCALL(b, "host_alloc %zu", bytes);
	*out = mem(6);
	return 0;
}
static void fk_host_free(sl_backend *b, void *p)
{
	LOGCALL(b, "host_free %d", slot(p));
}

static const sl_backend_ops mem_ops = {
	.name = "fakemem",
	.dev_alloc = fk_dev_alloc,
	.dev_free = fk_dev_free,
	.host_alloc = fk_host_alloc,
	.host_free = fk_host_free,
};

static void check_zeroed(const sl_buf *x)
{
	ck_assert_ptr_null(x->p);
	ck_assert_uint_eq(x->bytes, 0);
	ck_assert_uint_eq(x->tier, 0);
}

/* Each tier's free gives back exactly the handle's bytes to that tier's
 * accounting (and the device's data share), and a freed handle is zero. */
START_TEST(test_buf_free_returns_its_bytes)
{
	sl_backend mb = { .ops = &mem_ops };
	sl_backend *b = &mb;
	/* a backend workspace the data share does not include */
	ck_assert_int_eq(sl_dev_account(b, 7, "workspace"), 0);

	sl_buf d, h;
	EXPECT_CALL(b, 0, sl_buf_alloc(b, SL_MEM_DEVICE, 100, "dev data", &d), "dev_alloc 100");
	ck_assert_ptr_eq(d.p, mem(5));
	ck_assert_uint_eq(d.bytes, 100);
	ck_assert_uint_eq(d.tier, SL_MEM_DEVICE);
	EXPECT_CALL(b, 0, sl_buf_alloc(b, SL_MEM_HOST, 40, "host data", &h), "host_alloc 40");
	ck_assert_ptr_eq(h.p, mem(6));
	ck_assert_uint_eq(h.bytes, 40);
	ck_assert_uint_eq(h.tier, SL_MEM_HOST);
	ck_assert_uint_eq(b->dev_used, 107);
	ck_assert_uint_eq(b->data_used, 100);
	ck_assert_uint_eq(b->host_used, 40);

	g_log[0] = '\0';
	sl_buf_free(b, &d);
	ck_assert_str_eq(g_log, "dev_free 5");
	check_zeroed(&d);
	ck_assert_uint_eq(b->dev_used, 7);
	ck_assert_uint_eq(b->data_used, 0);
	ck_assert_uint_eq(b->host_used, 40);

	g_log[0] = '\0';
	sl_buf_free(b, &h);
	ck_assert_str_eq(g_log, "host_free 6");
	check_zeroed(&h);
	ck_assert_uint_eq(b->host_used, 0);
	ck_assert_uint_eq(b->dev_used, 7);

	/* the peaks stay where the two buffers put them */
	ck_assert_uint_eq(b->dev_peak, 107);
	ck_assert_uint_eq(b->data_peak, 100);
	ck_assert_uint_eq(b->host_peak, 40);
}
END_TEST

/* Freeing a zeroed handle (freed already, never allocated, or left by a
 * failed allocation) calls nothing and changes no figure. */
START_TEST(test_buf_double_free_harmless)
{
	sl_backend mb = { .ops = &mem_ops };
	sl_backend *b = &mb;
	sl_buf d, h, never = { 0 };
	ck_assert_int_eq(sl_buf_alloc(b, SL_MEM_DEVICE, 64, "d", &d), 0);
	ck_assert_int_eq(sl_buf_alloc(b, SL_MEM_HOST, 32, "h", &h), 0);
	sl_buf_free(b, &d);
	sl_buf_free(b, &h);
	/* a second buffer of each tier, live while the freed handles are
	 * freed again: its bytes must stay counted */
	sl_buf d2, h2;
	ck_assert_int_eq(sl_buf_alloc(b, SL_MEM_DEVICE, 10, "d2", &d2), 0);
	ck_assert_int_eq(sl_buf_alloc(b, SL_MEM_HOST, 20, "h2", &h2), 0);
	g_log[0] = '\0';
	sl_buf_free(b, &d);
	sl_buf_free(b, &h);
	sl_buf_free(b, &never);
	ck_assert_str_eq(g_log, "");
	check_zeroed(&d);
	check_zeroed(&h);
	ck_assert_uint_eq(b->dev_used, 10);
	ck_assert_uint_eq(b->data_used, 10);
	ck_assert_uint_eq(b->host_used, 20);
	sl_buf_free(b, &d2);
	sl_buf_free(b, &h2);
	ck_assert_uint_eq(b->dev_used, 0);
	ck_assert_uint_eq(b->host_used, 0);
}
END_TEST

/* A refused or failed allocation leaves a zeroed handle and the figures as
 * they were, with the budgets' messages as sl_dev_alloc / sl_host_alloc
 * give them. */
START_TEST(test_buf_alloc_refused)
{
	sl_backend mb = { .ops = &mem_ops };
	sl_backend *b = &mb;
	sl_backend_set_dev_limit(b, 150);
	sl_backend_set_host_limit(b, 50);
	sl_buf x = { .p = mem(9), .bytes = 3, .tier = SL_MEM_HOST };
	ck_assert_int_eq(sl_buf_alloc(b, SL_MEM_DEVICE, 200, "the big one", &x), SL_EBUDGET);
	ck_assert_str_eq(sl_errmsg(), "device memory budget exceeded allocating the big one: 200 bytes "
				      "needed, 0 of 150 in use");
	ck_assert(!b->host_refused);
	check_zeroed(&x);
	ck_assert_int_eq(sl_buf_alloc(b, SL_MEM_HOST, 60, "pinned", &x), SL_EBUDGET);
	ck_assert_str_eq(sl_errmsg(), "host memory budget exceeded allocating pinned: 60 bytes needed, "
				      "0 of 50 in use");
	ck_assert(b->host_refused);
	check_zeroed(&x);
	sl_backend_set_dev_limit(b, 0); /* unlimited: the hardware refuses */
	ck_assert_int_eq(sl_buf_alloc(b, SL_MEM_DEVICE, 999, "odd", &x), SL_ENOMEM);
	ck_assert_str_eq(sl_errmsg(), "allocating 999 bytes for odd: fake: no device memory");
	check_zeroed(&x);
	ck_assert_int_eq(sl_buf_alloc(b, 7, 8, "tierless", &x), SL_EINVAL);
	check_zeroed(&x);
	ck_assert_uint_eq(b->dev_used, 0);
	ck_assert_uint_eq(b->data_used, 0);
	ck_assert_uint_eq(b->host_used, 0);
	g_log[0] = '\0';
	sl_buf_free(b, &x);
	ck_assert_str_eq(g_log, "");
}
END_TEST

int main(void)
{
	Suite *s = suite_create("backend_wrappers");
	TCase *tc = tcase_create("wrappers");
	tcase_add_test(tc, test_wrappers_forward);
	tcase_add_test(tc, test_wrappers_missing);
	tcase_add_test(tc, test_buf_free_returns_its_bytes);
	tcase_add_test(tc, test_buf_double_free_harmless);
	tcase_add_test(tc, test_buf_alloc_refused);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	const int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
