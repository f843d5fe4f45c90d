/*
 * rstage.h - row staging: an array of fixed-size rows that lives in pinned
 * host memory and is worked on by the device a group of rows at a time
 * (FlexGen's activations on the CPU: the model's residual stream).
 *
 * Each step names its rows [r0, r0 + n).  sl_rstage_begin brings them into
 * one of two device buffers on the stage's own copy queue and makes the
 * compute queue wait for them; where the step before left the same rows in
 * its buffer, or prefetched them, nothing is copied.  With overlap it also
 * starts loading the next step's rows into the other buffer, so that copy
 * runs beside the step's compute.  sl_rstage_end, once the step's work is
 * issued, stores the rows back to the host, unless the next step works on
 * the same rows (then they stay in the buffer).  A buffer is loaded only
 * after the compute queue is done with it, and stored only after the step
 * that wrote it: events on both queues order every copy, so nothing here
 * blocks the host.
 *
 * One buffer instead of two (one_buffer) where every step works on the same
 * rows (a block that is one micro-batch): they are loaded once and stay.
 *
 * Ownership.  The stage owns its copy queue, its events and the pinned host
 * array (an sl_buf, under the host budget).  The device buffers are
 * borrowed: the caller carves sl_rstage_dev_bytes() from its own device
 * memory (the model's activation workspace, whose layout the run plan
 * states) and keeps it alive until sl_rstage_release.  The stage knows rows
 * and bytes only, nothing of the model.
 *
 * Lifetime: create once (row size and overlap are fixed for life), reserve
 * the rows (again after a release, for another size), release, free.  The
 * counters live across reserves.
 */
#ifndef SL_RSTAGE_H
#define SL_RSTAGE_H

#include "backend.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct sl_rstage sl_rstage;

/* What the stage moved (both directions, every kind of copy). */
typedef struct sl_rstage_stats {
	uint64_t h2d_bytes, d2h_bytes;
} sl_rstage_stats;

/* A stage of rows of row_bytes each; overlap: prefetch the next step's
 * rows.  Makes the copy queue and the events; no rows yet. */
int sl_rstage_create(sl_backend *b, size_t row_bytes, bool overlap, sl_rstage **out);
/* Waits for the stage's copies and frees everything it owns; NULL: no-op. */
void sl_rstage_free(sl_rstage *rs);

/* The device bytes the stage borrows: two buffers of buf_rows rows, or one. */
size_t sl_rstage_dev_bytes(size_t row_bytes, size_t buf_rows, bool one_buffer);

/*
 * Rows for a run: host_rows rows of pinned host memory (what names them in
 * a budget refusal), and the device buffers of buf_rows rows each at dev
 * (sl_rstage_dev_bytes of them, borrowed).  Both buffers start empty.
 * SL_EINVAL if the stage holds rows already (release first).
 */
int sl_rstage_reserve(sl_rstage *rs, size_t host_rows, size_t buf_rows, bool one_buffer,
		      void *dev, const char *what);
/* Wait for the stage's copies, free the host rows, forget the device
 * buffers (the caller may free them after); NULL or nothing reserved: no-op. */
void sl_rstage_release(sl_rstage *rs);

/* The host rows (NULL before reserve): row r at r * row_bytes.  Valid to
 * read or write on the host only when no copy is pending (after a
 * sl_rstage_flush and a sync of that queue). */
void *sl_rstage_rows(const sl_rstage *rs);

/*
 * A step over rows [r0, r0 + n) (n at most buf_rows): *dev receives the
 * device buffer that holds them once compute queue q reaches its next
 * work.  next_r0, next_n: the rows of the step after this one (next_r0 -1:
 * none); with overlap and rows other than these, they are prefetched into
 * the other buffer unless it holds them already.
 */
int sl_rstage_begin(sl_rstage *rs, sl_queue *q, long r0, size_t n, long next_r0, size_t next_n,
		    void **dev);
/* After the step's work is issued on q: store its rows back to the host
 * unless the next step starts at the same row (next_r0 == r0). */
int sl_rstage_end(sl_rstage *rs, sl_queue *q, long r0, size_t n, long next_r0);

/*
 * Work outside the steps (before the first, or after a sl_rstage_flush),
 * on compute queue q, through the first buffer.
 * sl_rstage_scratch: the first buffer, to fill on q (its rows are dropped);
 * sl_rstage_put: store its first n rows to host rows [r0, r0 + n) on q;
 * sl_rstage_restart: after puts, both buffers empty, and the next steps'
 * loads wait for q's work issued so far.
 */
void *sl_rstage_scratch(sl_rstage *rs);
int sl_rstage_put(sl_rstage *rs, sl_queue *q, long r0, size_t n);
int sl_rstage_restart(sl_rstage *rs, sl_queue *q);

/* Gather count host rows first, first + stride, ... into the first buffer
 * on q (one copy when stride is 1), as sl_rstage_scratch (after a flush);
 * *dev receives it. */
int sl_rstage_gather(sl_rstage *rs, sl_queue *q, long first, size_t count, size_t stride,
		     void **dev);

/* q waits for every store issued so far (the host rows are whole for what
 * q does next). */
int sl_rstage_flush(sl_rstage *rs, sl_queue *q);

/* The counters (zero for NULL), and zeroing them. */
sl_rstage_stats sl_rstage_get_stats(const sl_rstage *rs);
void sl_rstage_reset_stats(sl_rstage *rs);

#endif
