/*
 * disk_uring.c - the disk store's io_uring engine.
 *
 * The caller's thread prepares and submits SQEs under the store's mutex
 * (kick); one completion thread blocks in io_uring_wait_cqe (the CQ side is
 * only ever touched by it, the SQ side only under the mutex), retires
 * chunks, starts the next ones and wakes waiters.  A chunk in flight holds
 * one entry of a fixed table (user_data is its index + 1); a partial
 * transfer is resubmitted for the rest.  The store's file is registered with
 * the ring (a fixed file), its buffers are not (docs/DESIGN.md).
 */
#include "disk_internal.h"
#include "sl_common.h"

#include <errno.h>
#include <liburing.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

#define URING_WAKE UINT64_MAX /* user_data of the NOP that stops the reaper */

/* One chunk in flight; user_data is its index + 1. */
typedef struct disk_chunk {
	int slot;
	uint64_t off; /* data-area offset of the chunk */
	size_t len, done;
} disk_chunk;

typedef struct disk_uring {
	struct io_uring ring;
	bool ring_init, fixed_file;
	pthread_t reaper;
	bool reaper_started;
	disk_chunk *chunks; /* qd */
	int *chunk_free, nfree;
} disk_uring;

static void uring_submit(sl_disk_store *s)
{
	disk_uring *u = s->eng_state;
	for (int tries = 0; io_uring_sq_ready(&u->ring) > 0 && tries < 1000; tries++) {
		int rc = io_uring_submit(&u->ring);
		if (rc >= 0)
			continue;
		if (rc != -EINTR && rc != -EAGAIN && rc != -EBUSY)
			break; /* left in the SQ; the next submit retries */
		sched_yield();
	}
}

/* Prepare an SQE for the rest of chunk ci. */
static void uring_prep(sl_disk_store *s, int ci)
{
	disk_uring *u = s->eng_state;
	disk_chunk *c = &u->chunks[ci];
	disk_req *r = &s->req[c->slot];
	struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
	if (!sqe) { /* cannot happen with <= qd chunks out, but submit and retry */
		uring_submit(s);
		sqe = io_uring_get_sqe(&u->ring);
		SL_ASSERT(sqe);
	}
	char *p = r->buf + (c->off - r->off) + c->done;
	unsigned n = (unsigned)(c->len - c->done);
	uint64_t foff = s->hdr_bytes + c->off + c->done;
	int fd = u->fixed_file ? 0 : s->fd;
	if (r->write)
		io_uring_prep_write(sqe, fd, p, n, foff);
	else
		io_uring_prep_read(sqe, fd, p, n, foff);
	if (u->fixed_file)
		io_uring_sqe_set_flags(sqe, IOSQE_FIXED_FILE);
	io_uring_sqe_set_data64(sqe, (uint64_t)ci + 1);
}

/* Start chunks up to the queue depth and submit (mutex held). */
static void uring_fill(sl_disk_store *s)
{
	disk_uring *u = s->eng_state;
	int slot;
	uint64_t off;
	size_t len;
	while (disk_next_chunk(s, &slot, &off, &len)) { /* at most qd out */
		int ci = u->chunk_free[--u->nfree];
		u->chunks[ci] = (disk_chunk){ .slot = slot, .off = off, .len = len, .done = 0 };
		uring_prep(s, ci);
	}
	uring_submit(s);
}

/* One CQE for chunk ci (mutex held). */
static void uring_complete(sl_disk_store *s, int ci, int res)
{
	disk_uring *u = s->eng_state;
	disk_chunk *c = &u->chunks[ci];
	bool write = s->req[c->slot].write;
	int err = 0;
	bool is_short = false;
	if (res == -EINTR || res == -EAGAIN) {
		uring_prep(s, ci); /* retry as it was */
		return;
	}
	if (res < 0) {
		err = -res;
	} else {
		c->done += (size_t)res;
		if (c->done < c->len) {
			/* Partial: go on with the rest unless at the end of the file
			 * (0 bytes) or at an offset O_DIRECT cannot continue from. */
			bool can_go_on = res > 0 && (!s->direct || res % SL_DISK_ALIGN == 0);
			if (can_go_on) {
				uring_prep(s, ci);
				return;
			}
			if (write)
				err = EIO;
			else
				is_short = true;
		}
	}
	int slot = c->slot;
	uint64_t pos = c->off + c->done;
	size_t len = c->len, got = c->done;
	u->chunk_free[u->nfree++] = ci;
	disk_chunk_finish(s, slot, len, pos, got, err, is_short);
}

static void *uring_reaper(void *arg)
{
	sl_disk_store *s = arg;
	disk_uring *u = s->eng_state;
	disk_io_thread_place(s);
	for (;;) {
		struct io_uring_cqe *cqe;
		int rc = io_uring_wait_cqe(&u->ring, &cqe);
		if (rc == -EINTR || rc == -EAGAIN || rc == -ETIME)
			continue;
		pthread_mutex_lock(&s->mu);
		if (rc < 0) {
			disk_fail_all(s, -rc);
			pthread_mutex_unlock(&s->mu);
			return NULL;
		}
		bool quit = false;
		unsigned head, seen = 0;
		io_uring_for_each_cqe(&u->ring, head, cqe)
		{
			seen++;
			if (cqe->user_data == URING_WAKE)
				quit = true;
			else
				uring_complete(s, (int)(cqe->user_data - 1), cqe->res);
		}
		io_uring_cq_advance(&u->ring, seen);
		if (!quit)
			uring_fill(s);
		pthread_mutex_unlock(&s->mu);
		if (quit)
			return NULL;
	}
}

/* Stop the completion thread with a NOP it recognises (no chunks in flight). */
static void reaper_stop(sl_disk_store *s)
{
	disk_uring *u = s->eng_state;
	if (!u->reaper_started)
		return;
	pthread_mutex_lock(&s->mu);
	struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
	SL_ASSERT(sqe);
	io_uring_prep_nop(sqe);
	io_uring_sqe_set_data64(sqe, URING_WAKE);
	uring_submit(s);
	pthread_mutex_unlock(&s->mu);
	pthread_join(u->reaper, NULL);
	u->reaper_started = false;
}

static int reaper_start(sl_disk_store *s)
{
	disk_uring *u = s->eng_state;
	int rc = pthread_create(&u->reaper, NULL, uring_reaper, s);
	if (rc) {
		char eb[128];
		return sl_err(SL_ENOMEM, "%s: cannot start the io_uring completion thread (%s)", s->path,
			      disk_errstr(rc, eb, sizeof eb));
	}
	u->reaper_started = true;
	disk_io_threads_placed(s, 1);
	return 0;
}

static void uring_kick(sl_disk_store *s)
{
	uring_fill(s);
}

static void uring_release(sl_disk_store *s)
{
	disk_uring *u = s->eng_state;
	if (u->ring_init)
		io_uring_queue_exit(&u->ring); /* also drops the registered file */
	free(u->chunks);
	free(u->chunk_free);
	free(u);
	s->eng_state = NULL;
}

static const disk_engine uring_engine = { .kick = uring_kick, .stop = reaper_stop, .release = uring_release };

int disk_uring_start(sl_disk_store *s, char *why, size_t whyn)
{
	char eb[128];
	disk_uring *u = calloc(1, sizeof *u);
	if (!u)
		return sl_err(SL_ENOMEM, "%s: out of memory for the io_uring engine", s->path);
	int rc = io_uring_queue_init((unsigned)s->qd, &u->ring, 0);
	if (rc < 0) {
		snprintf(why, whyn, "io_uring is unavailable (io_uring_queue_init: %s)", disk_errstr(-rc, eb, sizeof eb));
		free(u);
		return 0;
	}
	struct io_uring_probe *pr = io_uring_get_probe_ring(&u->ring);
	bool ok = pr && io_uring_opcode_supported(pr, IORING_OP_READ) &&
		  io_uring_opcode_supported(pr, IORING_OP_WRITE) &&
		  io_uring_opcode_supported(pr, IORING_OP_NOP);
	if (pr)
		io_uring_free_probe(pr);
	if (!ok) {
		snprintf(why, whyn, "io_uring lacks the read/write opcodes (kernel older than 5.6)");
		io_uring_queue_exit(&u->ring);
		free(u);
		return 0;
	}
	u->ring_init = true;
	s->eng = &uring_engine; /* from here on close releases it */
	s->eng_state = u;
	/* A fixed file saves a file-table lookup per request; plain fds work too. */
	u->fixed_file = io_uring_register_files(&u->ring, &s->fd, 1) == 0;
	u->chunks = calloc((size_t)s->qd, sizeof *u->chunks);
	u->chunk_free = calloc((size_t)s->qd, sizeof *u->chunk_free);
	if (!u->chunks || !u->chunk_free)
		return sl_err(SL_ENOMEM, "%s: out of memory for %d io_uring requests", s->path, s->qd);
	for (int i = 0; i < s->qd; i++)
		u->chunk_free[i] = s->qd - 1 - i;
	u->nfree = s->qd;
	return reaper_start(s);
}
