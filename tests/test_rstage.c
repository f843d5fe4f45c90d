/*
 * test_rstage.c - row staging (offload/rstage.h) on the CPU backend: host
 * rows worked on by the device a group at a time through two buffers.
 *
 * What a user of the stage relies on:
 *  - a step sees its rows as the host holds them, whether they were loaded
 *    for it, prefetched by the step before, or kept from it;
 *  - what a step wrote reaches the host rows (the store-back) before the
 *    next pass reads them, and after a flush the host holds every row;
 *  - with overlap the next step's rows are loaded with this step's, once;
 *    rows the next step shares stay in their buffer, neither stored nor
 *    loaded again;
 *  - rows written through the scratch buffer reach the host, and a gather
 *    brings any rows back, strided or not;
 *  - the counters count every byte moved; the host rows are pinned memory
 *    under the host budget; rows outside the array or a buffer are refused.
 * Every test runs in three modes of the backend's queues: the default,
 * every copy started late (SLUICE_CPU_LATE_COPIES: a step that read a
 * buffer before its load, or a store that read it before the step's
 * writes, would see stale bytes) and the serial schedule.
 */
#include "backend.h"
#include "rstage.h"

#include "testutil.h"

#include <check.h>
#include <stdbool.h>
#include <string.h>

#define ok(expr, what)                                                        \
	do {                                                                  \
		int rc_ = (expr);                                             \
		ck_assert_msg(rc_ == 0, "%s failed: %d (%s)", what, rc_, sl_errmsg()); \
	} while (0)

enum { MODE_DEFAULT, MODE_LATE, MODE_SYNC, N_MODES };

enum { COLS = 48, ROW_BYTES = COLS * sizeof(float) };

static sl_backend *make_backend(int mode)
{
	unsetenv("SLUICE_CPU_SYNC_QUEUES");
	unsetenv("SLUICE_CPU_LATE_COPIES");
	if (mode == MODE_LATE)
		setenv("SLUICE_CPU_LATE_COPIES", "200", 1);
	if (mode == MODE_SYNC)
		setenv("SLUICE_CPU_SYNC_QUEUES", "1", 1);
	sl_backend *b = NULL;
	ok(sl_backend_create("cpu", 1, &b), "sl_backend_create");
	unsetenv("SLUICE_CPU_SYNC_QUEUES");
	unsetenv("SLUICE_CPU_LATE_COPIES");
	return b;
}

/* The value of column c of row r after pass p (pass 0: as filled). */
static float val(int p, long r, int c)
{
	return (float)(p * 100000 + r * 100 + c);
}

/* A stage of host_rows rows with buffers of buf_rows rows (one or two),
 * the buffers carved from one device allocation of exactly their size. */
typedef struct fixture {
	sl_backend *b;
	sl_queue *q;
	sl_rstage *rs;
	void *dev;
	size_t dev_bytes;
} fixture;

static void fixture_make(fixture *f, int mode, size_t host_rows, size_t buf_rows, bool one,
			 bool overlap)
{
	memset(f, 0, sizeof *f);
	f->b = make_backend(mode);
	ok(f->b->ops->queue_create(f->b, &f->q), "queue_create");
	ok(sl_rstage_create(f->b, ROW_BYTES, overlap, &f->rs), "sl_rstage_create");
	f->dev_bytes = sl_rstage_dev_bytes(ROW_BYTES, buf_rows, one);
	ck_assert_uint_eq(f->dev_bytes, (one ? 1 : 2) * buf_rows * ROW_BYTES);
	ok(sl_dev_alloc(f->b, f->dev_bytes, "step buffers", &f->dev), "sl_dev_alloc");
	ok(sl_rstage_reserve(f->rs, host_rows, buf_rows, one, f->dev, "test rows"), "reserve");
	float *h = sl_rstage_rows(f->rs);
	ck_assert_ptr_nonnull(h);
	for (size_t r = 0; r < host_rows; r++)
		for (int c = 0; c < COLS; c++)
			h[r * COLS + c] = val(0, (long)r, c);
}

static void fixture_free(fixture *f)
{
	sl_rstage_release(f->rs);
	sl_dev_free(f->b, f->dev, f->dev_bytes);
	sl_rstage_free(f->rs);
	f->b->ops->queue_free(f->b, f->q);
	ck_assert_uint_eq(f->b->host_used, 0);
	sl_backend_free(f->b);
}

/*
 * Passes over host_rows rows in groups of g, as the model's layers run
 * (the next step of the last group is the next pass's first, none after
 * the last pass).  Each step copies the rows it sees to `seen` and
 * overwrites them on the device with pass p + 1's values, both on the
 * compute queue; the host sources of the writes live until the end.
 */
static void run_passes(fixture *f, int passes, long rows, long g, float *seen, float *src)
{
	const sl_backend_ops *o = f->b->ops;
	const long ngroups = (rows + g - 1) / g;
	for (int p = 0; p < passes; p++)
		for (long k = 0; k < ngroups; k++) {
			const long r0 = k * g, n = SL_MIN(g, rows - r0);
			long nx = r0 + g, nn;
			if (nx >= rows)
				nx = p + 1 < passes ? 0 : -1;
			nn = nx < 0 ? 0 : SL_MIN(g, rows - nx);
			void *dev;
			ok(sl_rstage_begin(f->rs, f->q, r0, (size_t)n, nx, (size_t)nn, &dev), "begin");
			const size_t at = ((size_t)p * rows + (size_t)r0) * COLS;
			ok(o->copy_d2h(f->b, f->q, seen + at, dev, (size_t)n * ROW_BYTES), "copy_d2h");
			for (long r = 0; r < n; r++)
				for (int c = 0; c < COLS; c++)
					src[at + (size_t)r * COLS + c] = val(p + 1, r0 + r, c);
			ok(o->copy_h2d(f->b, f->q, dev, src + at, (size_t)n * ROW_BYTES), "copy_h2d");
			ok(sl_rstage_end(f->rs, f->q, r0, (size_t)n, nx), "end");
		}
	ok(sl_rstage_flush(f->rs, f->q), "flush");
	ok(o->queue_sync(f->b, f->q), "queue_sync");
}

/* Each pass saw the rows the pass before wrote, and the host holds the
 * last pass's. */
static void check_passes(fixture *f, int passes, long rows, const float *seen)
{
	for (int p = 0; p < passes; p++)
		for (long r = 0; r < rows; r++)
			for (int c = 0; c < COLS; c++) {
				const float v = seen[((size_t)p * rows + (size_t)r) * COLS + c];
				ck_assert_msg(v == val(p, r, c),
					      "pass %d saw row %ld column %d as %g, expected %g", p, r, c,
					      v, val(p, r, c));
			}
	const float *h = sl_rstage_rows(f->rs);
	for (long r = 0; r < rows; r++)
		for (int c = 0; c < COLS; c++)
			ck_assert_msg(h[r * COLS + c] == val(passes, r, c),
				      "host row %ld column %d is %g after %d passes, expected %g", r, c,
				      h[r * COLS + c], passes, val(passes, r, c));
}

static void passes_case(int mode, bool overlap)
{
	enum { ROWS = 10, G = 4, PASSES = 3 }; /* groups of 4, 4 and 2 rows */
	fixture f;
	fixture_make(&f, mode, ROWS, G, false, overlap);
	static float seen[PASSES * ROWS * COLS], src[PASSES * ROWS * COLS];
	run_passes(&f, PASSES, ROWS, G, seen, src);
	check_passes(&f, PASSES, ROWS, seen);
	/* every row in and out once per pass: each load is one step's, prefetched or not */
	const sl_rstage_stats s = sl_rstage_get_stats(f.rs);
	ck_assert_uint_eq(s.h2d_bytes, (uint64_t)PASSES * ROWS * ROW_BYTES);
	ck_assert_uint_eq(s.d2h_bytes, (uint64_t)PASSES * ROWS * ROW_BYTES);
	fixture_free(&f);
}

START_TEST(test_passes_overlap)
{
	passes_case(_i, true);
}
END_TEST

START_TEST(test_passes_no_overlap)
{
	passes_case(_i, false);
}
END_TEST

/* With overlap the first step loads its rows and the next step's; the
 * next step then loads nothing and works in the other buffer.  Without
 * overlap each step loads its own. */
START_TEST(test_prefetch)
{
	for (int ov = 0; ov < 2; ov++) {
		fixture f;
		fixture_make(&f, _i, 8, 4, false, ov);
		void *d0, *d1;
		ok(sl_rstage_begin(f.rs, f.q, 0, 4, 4, 4, &d0), "begin 0");
		ck_assert_uint_eq(sl_rstage_get_stats(f.rs).h2d_bytes, (ov ? 8 : 4) * ROW_BYTES);
		ok(sl_rstage_end(f.rs, f.q, 0, 4, 4), "end 0");
		ok(sl_rstage_begin(f.rs, f.q, 4, 4, -1, 0, &d1), "begin 1");
		ck_assert_uint_eq(sl_rstage_get_stats(f.rs).h2d_bytes, 8 * ROW_BYTES);
		ck_assert_ptr_ne(d0, d1);
		ok(f.b->ops->queue_sync(f.b, f.q), "queue_sync");
		const float *r = d1; /* device memory is host memory on the CPU backend */
		for (int c = 0; c < COLS; c++)
			ck_assert_msg(r[c] == val(0, 4, c), "%s: prefetched row 4 column %d is %g",
				      ov ? "overlap" : "no overlap", c, r[c]);
		ok(sl_rstage_end(f.rs, f.q, 4, 4, -1), "end 1");
		ck_assert_uint_eq(sl_rstage_get_stats(f.rs).d2h_bytes, 8 * ROW_BYTES);
		fixture_free(&f);
	}
}
END_TEST

/* Rows the next step shares stay in their buffer: no store, no load. */
START_TEST(test_same_rows_stay)
{
	fixture f;
	fixture_make(&f, _i, 4, 4, true, true); /* one group, one buffer */
	enum { PASSES = 3 };
	static float seen[PASSES * 4 * COLS], src[PASSES * 4 * COLS];
	run_passes(&f, PASSES, 4, 4, seen, src);
	check_passes(&f, PASSES, 4, seen);
	const sl_rstage_stats s = sl_rstage_get_stats(f.rs);
	ck_assert_uint_eq(s.h2d_bytes, 4 * ROW_BYTES); /* loaded once */
	ck_assert_uint_eq(s.d2h_bytes, 4 * ROW_BYTES); /* stored once, after the last pass */
	fixture_free(&f);
}
END_TEST

/* Rows written through the scratch buffer reach the host; the steps after
 * a restart load them; a gather brings rows back, strided or not. */
START_TEST(test_put_restart_gather)
{
	const sl_backend_ops *o;
	fixture f;
	fixture_make(&f, _i, 12, 4, false, true);
	o = f.b->ops;
	static float src[12 * COLS], got[12 * COLS];
	for (int r = 0; r < 12; r++)
		for (int c = 0; c < COLS; c++)
			src[r * COLS + c] = val(7, r, c);
	for (long r0 = 0; r0 < 12; r0 += 4) {
		ok(o->copy_h2d(f.b, f.q, sl_rstage_scratch(f.rs), src + r0 * COLS, 4 * ROW_BYTES), "fill");
		ok(sl_rstage_put(f.rs, f.q, r0, 4), "put");
	}
	ok(sl_rstage_restart(f.rs, f.q), "restart");
	void *dev;
	ok(sl_rstage_begin(f.rs, f.q, 8, 4, 0, 4, &dev), "begin");
	ok(o->copy_d2h(f.b, f.q, got, dev, 4 * ROW_BYTES), "copy_d2h");
	ok(sl_rstage_end(f.rs, f.q, 8, 4, 8), "end"); /* kept: no store */
	ok(o->queue_sync(f.b, f.q), "queue_sync");
	for (int r = 0; r < 4; r++)
		for (int c = 0; c < COLS; c++)
			ck_assert_msg(got[r * COLS + c] == val(7, 8 + r, c),
				      "row %d after put and restart: %g", 8 + r, got[r * COLS + c]);
	ok(sl_rstage_flush(f.rs, f.q), "flush");
	ok(sl_rstage_gather(f.rs, f.q, 1, 4, 3, &dev), "gather strided"); /* rows 1, 4, 7, 10 */
	ok(o->copy_d2h(f.b, f.q, got, dev, 4 * ROW_BYTES), "copy_d2h");
	ok(sl_rstage_gather(f.rs, f.q, 5, 3, 1, &dev), "gather"); /* rows 5, 6, 7 */
	ok(o->copy_d2h(f.b, f.q, got + 4 * COLS, dev, 3 * ROW_BYTES), "copy_d2h");
	ok(o->queue_sync(f.b, f.q), "queue_sync");
	const int want[7] = { 1, 4, 7, 10, 5, 6, 7 };
	for (int i = 0; i < 7; i++)
		for (int c = 0; c < COLS; c++)
			ck_assert_msg(got[i * COLS + c] == val(7, want[i], c),
				      "gathered row %d (host row %d) column %d: %g", i, want[i], c,
				      got[i * COLS + c]);
	const sl_rstage_stats s = sl_rstage_get_stats(f.rs);
	ck_assert_uint_eq(s.d2h_bytes, 12 * ROW_BYTES);
	ck_assert_uint_eq(s.h2d_bytes, (8 + 4 + 3) * ROW_BYTES);
	sl_rstage_reset_stats(f.rs);
	ck_assert_uint_eq(sl_rstage_get_stats(f.rs).h2d_bytes, 0);
	fixture_free(&f);
}
END_TEST

/* The host rows are pinned memory under the host budget; rows outside the
 * array or over a buffer are refused, saying so. */
START_TEST(test_bounds_and_budget)
{
	sl_backend *b = make_backend(_i);
	sl_rstage *rs = NULL;
	ck_assert_int_eq(sl_rstage_create(b, 0, true, &rs), SL_EINVAL);
	ok(sl_rstage_create(b, ROW_BYTES, true, &rs), "create");
	ck_assert_ptr_null(sl_rstage_rows(rs));
	void *dev = NULL;
	ok(sl_dev_alloc(b, 2 * 4 * ROW_BYTES, "step buffers", &dev), "sl_dev_alloc");
	sl_backend_set_host_limit(b, 10 * ROW_BYTES - 1);
	ck_assert_int_eq(sl_rstage_reserve(rs, 10, 4, false, dev, "the rows under test"), SL_EBUDGET);
	ck_assert_msg(strstr(sl_errmsg(), "the rows under test"), "message: %s", sl_errmsg());
	sl_backend_set_host_limit(b, 10 * ROW_BYTES);
	ok(sl_rstage_reserve(rs, 10, 4, false, dev, "rows"), "reserve");
	ck_assert_uint_eq(b->host_used, 10 * ROW_BYTES);
	ck_assert_int_eq(sl_rstage_reserve(rs, 10, 4, false, dev, "rows"), SL_EINVAL);
	void *d;
	ck_assert_int_eq(sl_rstage_begin(rs, NULL, 8, 4, -1, 0, &d), SL_EINVAL); /* past row 10 */
	ck_assert_msg(strstr(sl_errmsg(), "rows 8 to 12"), "message: %s", sl_errmsg());
	ck_assert_int_eq(sl_rstage_begin(rs, NULL, 0, 5, -1, 0, &d), SL_EINVAL); /* over a buffer */
	ck_assert_int_eq(sl_rstage_gather(rs, NULL, 1, 4, 3, &d), SL_EINVAL); /* rows 1, 4, 7, 10 */
	ck_assert_int_eq(sl_rstage_gather(rs, NULL, 0, 5, 1, &d), SL_EINVAL); /* over a buffer */
	sl_rstage_release(rs);
	ck_assert_uint_eq(b->host_used, 0);
	ck_assert_int_eq(sl_rstage_begin(rs, NULL, 0, 4, -1, 0, &d), SL_EINVAL); /* nothing reserved */
	sl_rstage_free(rs);
	sl_dev_free(b, dev, 2 * 4 * ROW_BYTES);
	sl_backend_free(b);
}
END_TEST

static Suite *rstage_suite(void)
{
	Suite *s = suite_create("rstage");
	TCase *tc = tcase_create("core");
	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, test_passes_overlap, 0, N_MODES);
	tcase_add_loop_test(tc, test_passes_no_overlap, 0, N_MODES);
	tcase_add_loop_test(tc, test_prefetch, 0, N_MODES);
	tcase_add_loop_test(tc, test_same_rows_stay, 0, N_MODES);
	tcase_add_loop_test(tc, test_put_restart_gather, 0, N_MODES);
	tcase_add_loop_test(tc, test_bounds_and_budget, 0, N_MODES);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return sl_test_run(rstage_suite());
}
