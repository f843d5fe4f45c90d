/*
 * rstage.c - row staging (rstage.h): a pinned host array of rows, two
 * borrowed device buffers, a copy queue and the events that order it
 * against the compute queue.
 *
 * Per buffer i: ready[i] is recorded on the copy queue after a load into
 * it (the compute queue waits for it before the step reads the rows);
 * done[i] is recorded on the compute queue after the work that used it
 * (the copy queue waits for it before a store reads it or a load
 * overwrites it).  tag[i] is the first row the buffer holds, -1 for none.
 */
#include "rstage.h"

#include <string.h>

struct sl_rstage {
	sl_backend *b; /* borrowed */
	size_t row_bytes;
	bool overlap;
	sl_queue *cq; /* the copy queue */
	sl_event *ready[2], *done[2];
	/* reserved rows */
	sl_buf host; /* pinned: the rows */
	char *buf[2];   /* borrowed; buf[0] == buf[1] with one buffer */
	size_t buf_rows;
	long tag[2];
	int cur; /* the buffer of the step in progress */
	sl_rstage_stats stats;
};

int sl_rstage_create(sl_backend *b, size_t row_bytes, bool overlap, sl_rstage **out)
{
	*out = NULL;
	if (row_bytes == 0)
		return sl_err(SL_EINVAL, "row staging: rows of 0 bytes");
	sl_rstage *rs = calloc(1, sizeof *rs);
	if (!rs)
		return sl_err(SL_ENOMEM, "out of memory");
	rs->b = b;
	rs->row_bytes = row_bytes;
	rs->overlap = overlap;
	rs->tag[0] = rs->tag[1] = -1;
	int rc = 0;
	for (int i = 0; i < 2 && rc == 0; i++) {
		rc = sl_event_create(b, &rs->ready[i]);
		if (rc == 0)
			rc = sl_event_create(b, &rs->done[i]);
	}
	if (rc == 0)
		rc = sl_queue_create(b, &rs->cq);
	if (rc < 0) {
		sl_rstage_free(rs);
		return rc;
	}
	*out = rs;
	return 0;
}

void sl_rstage_free(sl_rstage *rs)
{
	if (!rs)
		return;
	sl_rstage_release(rs);
	for (int i = 0; i < 2; i++) {
		if (rs->ready[i])
			sl_event_free(rs->b, rs->ready[i]);
		if (rs->done[i])
			sl_event_free(rs->b, rs->done[i]);
	}
	if (rs->cq)
		sl_queue_free(rs->b, rs->cq);
	free(rs);
}

size_t sl_rstage_dev_bytes(size_t row_bytes, size_t buf_rows, bool one_buffer)
{
	return (one_buffer ? 1 : 2) * buf_rows * row_bytes;
}

int sl_rstage_reserve(sl_rstage *rs, size_t host_rows, size_t buf_rows, bool one_buffer,
		      void *dev, const char *what)
{
	if (rs->host.p)
		return sl_err(SL_EINVAL, "row staging: %s reserved twice", what);
	if (!dev || buf_rows == 0 || host_rows == 0)
		return sl_err(SL_EINVAL, "row staging: %s without rows (host %zu, buffers %zu)", what,
			      host_rows, buf_rows);
	SL_TRY(sl_buf_alloc(rs->b, SL_MEM_HOST, host_rows * rs->row_bytes, what, &rs->host));
	rs->buf[0] = dev;
	rs->buf[1] = one_buffer ? rs->buf[0] : rs->buf[0] + buf_rows * rs->row_bytes;
	rs->buf_rows = buf_rows;
	rs->tag[0] = rs->tag[1] = -1;
	return 0;
}

void sl_rstage_release(sl_rstage *rs)
{
	if (!rs || !rs->host.p)
		return;
	/* no store still reading a buffer or writing the host rows */
	sl_queue_sync(rs->b, rs->cq);
	sl_buf_free(rs->b, &rs->host);
	rs->buf[0] = rs->buf[1] = NULL;
	rs->buf_rows = 0;
	rs->tag[0] = rs->tag[1] = -1;
}

void *sl_rstage_rows(const sl_rstage *rs)
{
	return rs->host.p;
}

static int check_rows(const sl_rstage *rs, long r0, size_t n)
{
	if (!rs->host.p)
		return sl_err(SL_EINVAL, "row staging: no rows reserved");
	if (r0 < 0 || n > rs->buf_rows || (size_t)r0 * rs->row_bytes + n * rs->row_bytes > rs->host.bytes)
		return sl_err(SL_EINVAL, "row staging: rows %ld to %ld outside the %zu host rows or over the %zu rows of a buffer",
			      r0, r0 + (long)n, rs->host.bytes / rs->row_bytes, rs->buf_rows);
	return 0;
}

/* Load rows [r0, r0 + n) into buffer i on the copy queue, once the compute
 * queue is done with the buffer; ready[i] marks the rows there.  The copy
 * queue's order puts it after the store of the buffer's last rows. */
static int load(sl_rstage *rs, int i, long r0, size_t n)
{
	const size_t bytes = n * rs->row_bytes;
	SL_TRY(sl_queue_wait(rs->b, rs->cq, rs->done[i]));
	SL_TRY(sl_copy_h2d(rs->b, rs->cq, rs->buf[i], (char *)rs->host.p + (size_t)r0 * rs->row_bytes,
			   bytes));
	rs->tag[i] = r0;
	rs->stats.h2d_bytes += bytes;
	return sl_event_record(rs->b, rs->ready[i], rs->cq);
}

int sl_rstage_begin(sl_rstage *rs, sl_queue *q, long r0, size_t n, long next_r0, size_t next_n,
		    void **dev)
{
	SL_TRY(check_rows(rs, r0, n));
	const int c = rs->cur;
	int i = rs->tag[c] == r0 ? c : rs->tag[c ^ 1] == r0 ? c ^ 1 : -1;
	if (i < 0) {
		i = c ^ 1;
		SL_TRY(load(rs, i, r0, n));
	}
	rs->cur = i;
	if (rs->overlap && next_r0 >= 0 && next_r0 != r0 && rs->tag[i ^ 1] != next_r0) {
		SL_TRY(check_rows(rs, next_r0, next_n));
		SL_TRY(load(rs, i ^ 1, next_r0, next_n));
	}
	SL_TRY(sl_queue_wait(rs->b, q, rs->ready[i]));
	*dev = rs->buf[i];
	return 0;
}

int sl_rstage_end(sl_rstage *rs, sl_queue *q, long r0, size_t n, long next_r0)
{
	SL_TRY(check_rows(rs, r0, n));
	const int i = rs->cur;
	SL_TRY(sl_event_record(rs->b, rs->done[i], q));
	if (next_r0 == r0)
		return 0;
	const size_t bytes = n * rs->row_bytes;
	SL_TRY(sl_queue_wait(rs->b, rs->cq, rs->done[i]));
	SL_TRY(sl_copy_d2h(rs->b, rs->cq, (char *)rs->host.p + (size_t)r0 * rs->row_bytes, rs->buf[i],
			   bytes));
	rs->stats.d2h_bytes += bytes;
	rs->tag[i] = -1;
	return 0;
}

/* The first buffer's rows are about to change: it (and buffer 1 where the
 * two are one) holds none of the host rows any more. */
static void drop_first(sl_rstage *rs)
{
	rs->tag[0] = -1;
	if (rs->buf[1] == rs->buf[0])
		rs->tag[1] = -1;
}

void *sl_rstage_scratch(sl_rstage *rs)
{
	drop_first(rs);
	return rs->buf[0];
}

int sl_rstage_put(sl_rstage *rs, sl_queue *q, long r0, size_t n)
{
	SL_TRY(check_rows(rs, r0, n));
	const size_t bytes = n * rs->row_bytes;
	SL_TRY(sl_copy_d2h(rs->b, q, (char *)rs->host.p + (size_t)r0 * rs->row_bytes, rs->buf[0],
			   bytes));
	rs->stats.d2h_bytes += bytes;
	return 0;
}

int sl_rstage_restart(sl_rstage *rs, sl_queue *q)
{
	if (!rs->host.p)
		return sl_err(SL_EINVAL, "row staging: no rows reserved");
	rs->tag[0] = rs->tag[1] = -1;
	/* the first loads (on the copy queue, after done) read rows q wrote,
	 * into buffers q used */
	for (int i = 0; i < 2; i++)
		SL_TRY(sl_event_record(rs->b, rs->done[i], q));
	return 0;
}

int sl_rstage_gather(sl_rstage *rs, sl_queue *q, long first, size_t count, size_t stride,
		     void **dev)
{
	const size_t rb = rs->row_bytes;
	if (count == 0)
		return sl_err(SL_EINVAL, "row staging: a gather of no rows");
	SL_TRY(check_rows(rs, first, 1));
	SL_TRY(check_rows(rs, first + (long)((count - 1) * stride), 1));
	if (count > rs->buf_rows)
		return sl_err(SL_EINVAL, "row staging: a gather of %zu rows into a buffer of %zu", count,
			      rs->buf_rows);
	const char *src = (char *)rs->host.p + (size_t)first * rb;
	if (stride == 1) {
		SL_TRY(sl_copy_h2d(rs->b, q, rs->buf[0], src, count * rb));
	} else {
		for (size_t i = 0; i < count; i++)
			SL_TRY(sl_copy_h2d(rs->b, q, rs->buf[0] + i * rb, src + i * stride * rb, rb));
	}
	rs->stats.h2d_bytes += count * rb;
	drop_first(rs);
	*dev = rs->buf[0];
	return 0;
}

int sl_rstage_flush(sl_rstage *rs, sl_queue *q)
{
	/* ready[0], recorded now, marks everything the copy queue was given
	 * (the stores, and any load, which is harmless to wait for); a later
	 * load re-records it after itself */
	SL_TRY(sl_event_record(rs->b, rs->ready[0], rs->cq));
	return sl_queue_wait(rs->b, q, rs->ready[0]);
}

sl_rstage_stats sl_rstage_get_stats(const sl_rstage *rs)
{
	return rs ? rs->stats : (sl_rstage_stats){ 0 };
}

void sl_rstage_reset_stats(sl_rstage *rs)
{
	if (rs)
		memset(&rs->stats, 0, sizeof rs->stats);
}
