/*
 * disk_store.c - the disk tier: a header + data-area file read and written
 * with O_DIRECT through io_uring, or through a pread/pwrite thread pool where
 * io_uring or O_DIRECT is unavailable.
 *
 * Requests and tickets.  A request occupies slot (ticket % SL_DISK_MAX_REQUESTS)
 * of a fixed table from issue until it completes (success frees the slot at
 * once) or, if it failed, until its failure is reported by a wait.  Tickets
 * are issued in order, so the requests that still have chunks to start are
 * exactly the tickets from sub_ticket on: the engines take the next chunk
 * from there (next_chunk) without any list.  Issuing ticket t waits while
 * ticket t - SL_DISK_MAX_REQUESTS is still running; if that one failed and
 * was never waited for, its failure moves to a second fixed table (evicted)
 * where a later wait still finds it, so a failure is never lost.
 *
 * Engines.  io_uring: the caller's thread prepares and submits SQEs under the
 * store's mutex; one completion thread blocks in io_uring_wait_cqe (the CQ
 * side is only ever touched by it, the SQ side only under the mutex), retires
 * chunks, starts the next ones and wakes waiters.  Threads: a few workers
 * take chunks under the mutex and run pread/pwrite outside it.  Both share
 * the slot table, the accounting and the error reporting, so sl_disk_wait is
 * engine-agnostic.  Nothing is allocated per request.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "disk_store.h"
#include "sl_common.h"
#include "topology.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* ---- header ------------------------------------------------------------- */

#define HDR_MAGIC "SLUICEDS"
#define HDR_VERSION 1u
#define HDR_OFF_VERSION 8
#define HDR_OFF_HDRSIZE 12
#define HDR_OFF_DATA 16
#define HDR_OFF_COMPLETE 24
#define HDR_OFF_KEYLEN 28
#define HDR_OFF_KEY 64
#define HDR_OFF_SUM (SL_DISK_HEADER_BYTES - 8)
#define HDR_COMPLETE 0x434f4d50u /* "COMP": anything else means incomplete */

_Static_assert(HDR_OFF_KEY + SL_DISK_MAX_KEY <= HDR_OFF_SUM, "key does not fit the header");

#define URING_WAKE UINT64_MAX /* user_data of the NOP that stops the reaper */
#define POOL_THREADS 4

static void put_u32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p)
{
	uint32_t v = 0;
	for (int i = 3; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

static uint64_t get_u64(const unsigned char *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

static uint64_t fnv1a(const unsigned char *p, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (size_t i = 0; i < n; i++) {
		h ^= p[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

/* ---- state -------------------------------------------------------------- */

enum { REQ_FREE = 0, REQ_ACTIVE, REQ_FAILED };
enum engine { ENG_NONE, ENG_URING, ENG_THREADS };

/* What went wrong with a request, kept until a wait reports it. */
typedef struct disk_fail {
	uint64_t ticket;
	bool write;
	bool is_short;  /* a read that hit the end of the file */
	int err;        /* positive errno (0 for a short read) */
	uint64_t pos;   /* data-area offset where the failing chunk stopped */
	uint64_t off;   /* the request */
	size_t len, got;
} disk_fail;

typedef struct disk_req {
	uint64_t ticket;
	int state;
	bool write;
	char *buf;
	uint64_t off;
	size_t len;
	size_t submitted; /* bytes handed to the engine (all of them once failed) */
	size_t done;      /* bytes transferred */
	int chunks_out;   /* chunks in the engine */
	bool failed;
	disk_fail fail;
} disk_req;

/* One chunk in flight on the io_uring engine; user_data is its index + 1. */
typedef struct disk_chunk {
	int slot;
	uint64_t off; /* data-area offset of the chunk */
	size_t len, done;
} disk_chunk;

struct sl_disk_store {
	char *dir, *path, *key;
	uint64_t capacity;  /* data area */
	uint64_t hdr_bytes; /* SL_DISK_HEADER_BYTES; 0 for the probe file */
	int fd;
	bool direct;
	enum engine engine;
	const char *mode;
	int qd;
	size_t chunk;
	bool complete_on_disk; /* the header's flag as last written or read */
	bool write_failed;     /* since open: mark_complete refuses */
	int header_delay_ms;   /* sl_disk_params.test_header_delay_ms */

	pthread_mutex_t mu;
	pthread_cond_t done_cv, work_cv;
	bool sync_init;
	disk_req *req; /* SL_DISK_MAX_REQUESTS */
	uint64_t next_ticket, sub_ticket;
	int active_reqs; /* issued, not finished */
	int in_flight;   /* chunks in the engine */
	bool closing;
	int fatal;       /* positive errno once the engine broke */
	disk_fail *evicted; /* failures whose slot was reused before a wait
			       reported them: SL_DISK_MAX_REQUESTS, unordered */
	int n_evicted;
	bool hdr_busy;   /* a thread is writing the header (mutex released) */
	sl_disk_stats st;
	double busy_t0;

	/* io_uring */
	struct io_uring ring;
	bool ring_init, fixed_file;
	pthread_t reaper;
	bool reaper_started;
	disk_chunk *chunks;
	int *chunk_free, nfree;

	/* thread pool */
	pthread_t workers[POOL_THREADS];
	int nworkers;

	/* placement of the I/O threads (bind_io) */
	int bind_node;     /* -1: leave them unbound */
	int threads_bound; /* threads that have bound themselves */
	int io_node;       /* the node they read back; -1: several, or none */
};

static const char *errstr(int e, char *buf, size_t n)
{
	return strerror_r(e, buf, n); /* GNU: returns the text */
}

/* "key" with non-printable bytes replaced and long keys shortened, for messages. */
static void key_show(const char *k, size_t n, char *out, size_t outn)
{
	size_t j = 0, lim = outn - 4;
	for (size_t i = 0; i < n && j < lim; i++)
		out[j++] = (k[i] >= 32 && k[i] < 127) ? k[i] : '?';
	if (n > lim && outn >= 4) {
		memcpy(out + j, "...", 3);
		j += 3;
	}
	out[j] = 0;
}

/* ---- accounting (mutex held) ---------------------------------------------- */

static void busy_inc(sl_disk_store *s)
{
	if (s->active_reqs++ == 0)
		s->busy_t0 = sl_now();
}

static void busy_dec(sl_disk_store *s)
{
	if (--s->active_reqs == 0)
		s->st.busy_s += sl_now() - s->busy_t0;
}

/* The next chunk to start, in ticket order; false when none is waiting. */
static bool next_chunk(sl_disk_store *s, int *slot, uint64_t *off, size_t *len)
{
	while (s->sub_ticket < s->next_ticket) {
		int i = (int)(s->sub_ticket % SL_DISK_MAX_REQUESTS);
		disk_req *r = &s->req[i];
		if (r->state == REQ_ACTIVE && r->ticket == s->sub_ticket && r->submitted < r->len) {
			size_t n = SL_MIN(s->chunk, r->len - r->submitted);
			*slot = i;
			*off = r->off + r->submitted;
			*len = n;
			r->submitted += n;
			r->chunks_out++;
			return true;
		}
		s->sub_ticket++;
	}
	return false;
}

/*
 * A chunk left the engine having moved got bytes; pos is the data offset
 * where it stopped.  The first failure of a request stops its remaining
 * chunks from starting; the request completes when none is out.
 */
static void chunk_finish(sl_disk_store *s, int slot, uint64_t pos, size_t got, int err, bool is_short)
{
	disk_req *r = &s->req[slot];
	r->chunks_out--;
	r->done += got;
	if (r->write)
		s->st.bytes_written += got;
	else
		s->st.bytes_read += got;
	if ((err || is_short) && !r->failed) {
		r->failed = true;
		r->fail = (disk_fail){ .ticket = r->ticket, .write = r->write, .is_short = is_short,
				       .err = err, .pos = pos, .off = r->off, .len = r->len };
		r->submitted = r->len;
	}
	if (r->chunks_out == 0 && r->submitted == r->len) {
		if (r->write)
			s->st.writes++;
		else
			s->st.reads++;
		if (r->failed) {
			r->fail.got = r->done;
			r->state = REQ_FAILED;
			if (r->write)
				s->write_failed = true;
		} else {
			r->state = REQ_FREE;
		}
		busy_dec(s);
		pthread_cond_broadcast(&s->done_cv);
	}
}

/* The message for a failed request; returns SL_EIO. */
static int fail_report(const sl_disk_store *s, const disk_fail *f, uint64_t more)
{
	char eb[128], extra[64] = "";
	if (more)
		snprintf(extra, sizeof extra, " (and %llu more failed requests)", (unsigned long long)more);
	if (f->is_short)
		return sl_err(SL_EIO, "short read at offset %llu of %s (got %zu of %zu bytes): truncated store?%s",
			      (unsigned long long)f->off, s->path, f->got, f->len, extra);
	const char *es = errstr(f->err, eb, sizeof eb);
	if (f->write && (f->err == ENOSPC || f->err == EFBIG || f->err == EDQUOT))
		return sl_err(SL_EIO, "%s: disk full writing offset %llu (%s)%s", s->path,
			      (unsigned long long)f->pos, es, extra);
	return sl_err(SL_EIO, "%s: %s failed at offset %llu (%s)%s", s->path, f->write ? "write" : "read",
		      (unsigned long long)f->pos, es, extra);
}

/* ---- io_uring engine ------------------------------------------------------ */

static void uring_submit(sl_disk_store *s)
{
	for (int tries = 0; io_uring_sq_ready(&s->ring) > 0 && tries < 1000; tries++) {
		int rc = io_uring_submit(&s->ring);
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
	disk_chunk *c = &s->chunks[ci];
	disk_req *r = &s->req[c->slot];
	struct io_uring_sqe *sqe = io_uring_get_sqe(&s->ring);
	if (!sqe) { /* cannot happen with <= qd chunks out, but submit and retry */
		uring_submit(s);
		sqe = io_uring_get_sqe(&s->ring);
		SL_ASSERT(sqe);
	}
	char *p = r->buf + (c->off - r->off) + c->done;
	unsigned n = (unsigned)(c->len - c->done);
	uint64_t foff = s->hdr_bytes + c->off + c->done;
	int fd = s->fixed_file ? 0 : s->fd;
	if (r->write)
		io_uring_prep_write(sqe, fd, p, n, foff);
	else
		io_uring_prep_read(sqe, fd, p, n, foff);
	if (s->fixed_file)
		io_uring_sqe_set_flags(sqe, IOSQE_FIXED_FILE);
	io_uring_sqe_set_data64(sqe, (uint64_t)ci + 1);
}

/* Start chunks up to the queue depth and submit (mutex held). */
static void uring_fill(sl_disk_store *s)
{
	int slot;
	uint64_t off;
	size_t len;
	while (s->in_flight < s->qd && next_chunk(s, &slot, &off, &len)) {
		int ci = s->chunk_free[--s->nfree];
		s->chunks[ci] = (disk_chunk){ .slot = slot, .off = off, .len = len, .done = 0 };
		s->in_flight++;
		uring_prep(s, ci);
	}
	if (s->in_flight > s->st.max_in_flight)
		s->st.max_in_flight = s->in_flight;
	uring_submit(s);
}

/* One CQE for chunk ci (mutex held). */
static void uring_complete(sl_disk_store *s, int ci, int res)
{
	disk_chunk *c = &s->chunks[ci];
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
	size_t got = c->done;
	s->chunk_free[s->nfree++] = ci;
	s->in_flight--;
	chunk_finish(s, slot, pos, got, err, is_short);
}

/* The engine broke (cannot happen short of a kernel bug): fail everything. */
static void fail_all(sl_disk_store *s, int err)
{
	s->fatal = err;
	for (int i = 0; i < SL_DISK_MAX_REQUESTS; i++) {
		disk_req *r = &s->req[i];
		if (r->state != REQ_ACTIVE)
			continue;
		r->chunks_out = 1;
		r->submitted = r->len;
		chunk_finish(s, i, r->off, 0, err, false);
	}
	s->in_flight = 0;
}

/* First thing an I/O thread does: bind itself to the store's node and
 * report the node its binding lies in (open waits for every thread). */
static void io_thread_place(sl_disk_store *s)
{
	if (s->bind_node < 0)
		return;
	sl_topo_bind_thread(s->bind_node, "the disk store's I/O threads"); /* warns once */
	int node = sl_topo_thread_node();
	pthread_mutex_lock(&s->mu);
	if (s->threads_bound++ == 0)
		s->io_node = node;
	else if (s->io_node != node)
		s->io_node = -1;
	pthread_cond_broadcast(&s->done_cv);
	pthread_mutex_unlock(&s->mu);
}

/* Wait until the n threads started have placed themselves. */
static void io_threads_placed(sl_disk_store *s, int n)
{
	if (s->bind_node < 0)
		return;
	pthread_mutex_lock(&s->mu);
	while (s->threads_bound < n)
		pthread_cond_wait(&s->done_cv, &s->mu);
	pthread_mutex_unlock(&s->mu);
}

static void *uring_reaper(void *arg)
{
	sl_disk_store *s = arg;
	io_thread_place(s);
	for (;;) {
		struct io_uring_cqe *cqe;
		int rc = io_uring_wait_cqe(&s->ring, &cqe);
		if (rc == -EINTR || rc == -EAGAIN || rc == -ETIME)
			continue;
		pthread_mutex_lock(&s->mu);
		if (rc < 0) {
			fail_all(s, -rc);
			pthread_mutex_unlock(&s->mu);
			return NULL;
		}
		bool quit = false;
		unsigned head, seen = 0;
		io_uring_for_each_cqe(&s->ring, head, cqe)
		{
			seen++;
			if (cqe->user_data == URING_WAKE)
				quit = true;
			else
				uring_complete(s, (int)(cqe->user_data - 1), cqe->res);
		}
		io_uring_cq_advance(&s->ring, seen);
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
	if (!s->reaper_started)
		return;
	pthread_mutex_lock(&s->mu);
	struct io_uring_sqe *sqe = io_uring_get_sqe(&s->ring);
	SL_ASSERT(sqe);
	io_uring_prep_nop(sqe);
	io_uring_sqe_set_data64(sqe, URING_WAKE);
	uring_submit(s);
	pthread_mutex_unlock(&s->mu);
	pthread_join(s->reaper, NULL);
	s->reaper_started = false;
}

static int reaper_start(sl_disk_store *s)
{
	int rc = pthread_create(&s->reaper, NULL, uring_reaper, s);
	if (rc) {
		char eb[128];
		return sl_err(SL_ENOMEM, "%s: cannot start the io_uring completion thread (%s)", s->path,
			      errstr(rc, eb, sizeof eb));
	}
	s->reaper_started = true;
	io_threads_placed(s, 1);
	return 0;
}

/* Set up the ring; on failure leaves why (and no ring). */
static int uring_start(sl_disk_store *s, char *why, size_t whyn)
{
	char eb[128];
	int rc = io_uring_queue_init((unsigned)s->qd, &s->ring, 0);
	if (rc < 0) {
		snprintf(why, whyn, "io_uring is unavailable (io_uring_queue_init: %s)", errstr(-rc, eb, sizeof eb));
		return 0;
	}
	s->ring_init = true;
	struct io_uring_probe *pr = io_uring_get_probe_ring(&s->ring);
	bool ok = pr && io_uring_opcode_supported(pr, IORING_OP_READ) &&
		  io_uring_opcode_supported(pr, IORING_OP_WRITE) &&
		  io_uring_opcode_supported(pr, IORING_OP_NOP);
	if (pr)
		io_uring_free_probe(pr);
	if (!ok) {
		snprintf(why, whyn, "io_uring lacks the read/write opcodes (kernel older than 5.6)");
		io_uring_queue_exit(&s->ring);
		s->ring_init = false;
		return 0;
	}
	/* A fixed file saves a file-table lookup per request; plain fds work too. */
	s->fixed_file = io_uring_register_files(&s->ring, &s->fd, 1) == 0;
	s->chunks = calloc((size_t)s->qd, sizeof *s->chunks);
	s->chunk_free = calloc((size_t)s->qd, sizeof *s->chunk_free);
	if (!s->chunks || !s->chunk_free)
		return sl_err(SL_ENOMEM, "%s: out of memory for %d io_uring requests", s->path, s->qd);
	for (int i = 0; i < s->qd; i++)
		s->chunk_free[i] = s->qd - 1 - i;
	s->nfree = s->qd;
	SL_TRY(reaper_start(s));
	s->engine = ENG_URING;
	return 0;
}

/* ---- thread-pool engine --------------------------------------------------- */

static void pool_io(sl_disk_store *s, bool write, char *p, size_t len, uint64_t foff, size_t *done_out,
		    int *err_out, bool *short_out)
{
	size_t done = 0;
	int err = 0;
	bool is_short = false;
	while (done < len) {
		ssize_t k = write ? pwrite(s->fd, p + done, len - done, (off_t)(foff + done))
				  : pread(s->fd, p + done, len - done, (off_t)(foff + done));
		if (k < 0) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			err = errno;
			break;
		}
		if (k == 0) {
			if (write)
				err = EIO;
			else
				is_short = true;
			break;
		}
		done += (size_t)k;
		if (done < len && s->direct && k % SL_DISK_ALIGN) {
			if (write)
				err = EIO;
			else
				is_short = true;
			break;
		}
	}
	if (!s->direct && done > 0) {
		/* Keep the page cache out of the measurement and the memory
		 * budget: written pages must reach the disk before they can go. */
		if (write && sync_file_range(s->fd, (off_t)foff, (off_t)done,
					     SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
						     SYNC_FILE_RANGE_WAIT_AFTER) != 0 && !err)
			err = errno;
		posix_fadvise(s->fd, (off_t)foff, (off_t)done, POSIX_FADV_DONTNEED);
	}
	*done_out = done;
	*err_out = err;
	*short_out = is_short;
}

static void *pool_worker(void *arg)
{
	sl_disk_store *s = arg;
	io_thread_place(s);
	pthread_mutex_lock(&s->mu);
	for (;;) {
		int slot;
		uint64_t off;
		size_t len;
		if (!next_chunk(s, &slot, &off, &len)) {
			if (s->closing)
				break;
			pthread_cond_wait(&s->work_cv, &s->mu);
			continue;
		}
		s->in_flight++;
		if (s->in_flight > s->st.max_in_flight)
			s->st.max_in_flight = s->in_flight;
		disk_req *r = &s->req[slot];
		char *p = r->buf + (off - r->off);
		bool write = r->write;
		pthread_mutex_unlock(&s->mu);

		size_t done;
		int err;
		bool is_short;
		pool_io(s, write, p, len, s->hdr_bytes + off, &done, &err, &is_short);

		pthread_mutex_lock(&s->mu);
		s->in_flight--;
		chunk_finish(s, slot, off + done, done, err, is_short);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

static int pool_start(sl_disk_store *s)
{
	int n = SL_MIN(s->qd, POOL_THREADS);
	for (int i = 0; i < n; i++) {
		int rc = pthread_create(&s->workers[i], NULL, pool_worker, s);
		if (rc) {
			char eb[128];
			return sl_err(SL_ENOMEM, "%s: cannot start I/O threads (%s)", s->path, errstr(rc, eb, sizeof eb));
		}
		s->nworkers++;
	}
	io_threads_placed(s, s->nworkers);
	s->engine = ENG_THREADS;
	return 0;
}

/*
 * Choose and start the engine.  why_direct is set when O_DIRECT was refused.
 * Unless quiet, a fallback prints one warning line.
 */
static int engine_start(sl_disk_store *s, bool force_fallback, const char *why_direct, bool quiet)
{
	char why_uring[200] = "";
	if (s->direct) {
		if (force_fallback)
			snprintf(why_uring, sizeof why_uring, "io_uring disabled (force_fallback)");
		else
			SL_TRY(uring_start(s, why_uring, sizeof why_uring));
	}
	if (s->engine == ENG_URING) {
		s->mode = "io_uring+O_DIRECT";
		return 0;
	}
	s->mode = s->direct ? "threads+pread+O_DIRECT" : "threads+pread+buffered";
	if (!quiet)
		fprintf(stderr, "sluice: warning: %s: %s%s%s; using %s%s\n", s->dir, why_direct ? why_direct : "",
			why_direct && why_uring[0] ? " and " : "", why_uring, s->mode,
			s->direct ? "" : " (page cache dropped behind each chunk)");
	return pool_start(s);
}

/* ---- header and file ------------------------------------------------------- */

static void *page_alloc(size_t n)
{
	void *p = NULL;
	if (posix_memalign(&p, SL_DISK_ALIGN, n) != 0)
		return NULL;
	memset(p, 0, n);
	return p;
}

/* The file system refused O_DIRECT I/O on an fd it let us open: go buffered. */
static int drop_direct(sl_disk_store *s, char *why, size_t whyn, int e)
{
	char eb[128];
	int fd = open(s->path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return sl_err(SL_EIO, "%s: cannot reopen without O_DIRECT (%s)", s->path, errstr(errno, eb, sizeof eb));
	close(s->fd);
	s->fd = fd;
	s->direct = false;
	snprintf(why, whyn, "the file system refuses O_DIRECT (%s)", errstr(e, eb, sizeof eb));
	return 0;
}

/* Write the header and sync it; 0 or -errno (ENOSPC for a short write). */
static int header_pwrite(sl_disk_store *s, bool complete)
{
	unsigned char *h = page_alloc(SL_DISK_HEADER_BYTES);
	if (!h)
		return -ENOMEM;
	size_t kl = strlen(s->key);
	memcpy(h, HDR_MAGIC, 8);
	put_u32(h + HDR_OFF_VERSION, HDR_VERSION);
	put_u32(h + HDR_OFF_HDRSIZE, SL_DISK_HEADER_BYTES);
	put_u64(h + HDR_OFF_DATA, s->capacity);
	put_u32(h + HDR_OFF_COMPLETE, complete ? HDR_COMPLETE : 0);
	put_u32(h + HDR_OFF_KEYLEN, (uint32_t)kl);
	memcpy(h + HDR_OFF_KEY, s->key, kl);
	put_u64(h + HDR_OFF_SUM, fnv1a(h, HDR_OFF_SUM));
	ssize_t k;
	do
		k = pwrite(s->fd, h, SL_DISK_HEADER_BYTES, 0);
	while (k < 0 && errno == EINTR);
	int e = k < 0 ? errno : ENOSPC;
	free(h);
	if (k != (ssize_t)SL_DISK_HEADER_BYTES)
		return -e;
	if (fdatasync(s->fd) != 0)
		return -errno;
	if (s->header_delay_ms)
		usleep((useconds_t)s->header_delay_ms * 1000);
	return 0;
}

/* The message for a failed header write of errno e. */
static int header_error(sl_disk_store *s, int e)
{
	char eb[128];
	s->write_failed = true;
	if (e == ENOMEM)
		return sl_err(SL_ENOMEM, "%s: out of memory for the header", s->path);
	if (e == ENOSPC || e == EFBIG || e == EDQUOT)
		return sl_err(SL_EIO, "%s: disk full writing the header (%s)", s->path, errstr(e, eb, sizeof eb));
	return sl_err(SL_EIO, "%s: cannot write the header (%s)", s->path, errstr(e, eb, sizeof eb));
}

static int header_write(sl_disk_store *s, bool complete)
{
	int e = -header_pwrite(s, complete);
	if (e)
		return header_error(s, e);
	s->complete_on_disk = complete;
	return 0;
}

/*
 * Read and check the header of an existing file of size bytes.  *fresh is set
 * when the data must be (re)written.
 */
static int header_check(sl_disk_store *s, const unsigned char *h, uint64_t size, bool *fresh)
{
	if (memcmp(h, HDR_MAGIC, 8) != 0)
		return sl_err(SL_EFORMAT, "%s is not a sluice store (bad magic); remove it or use another --offload-dir",
			      s->path);
	if (get_u64(h + HDR_OFF_SUM) != fnv1a(h, HDR_OFF_SUM))
		return sl_err(SL_EFORMAT, "%s: corrupt store header (checksum mismatch); remove it so that it is rewritten",
			      s->path);
	uint32_t ver = get_u32(h + HDR_OFF_VERSION);
	if (ver != HDR_VERSION || get_u32(h + HDR_OFF_HDRSIZE) != SL_DISK_HEADER_BYTES)
		return sl_err(SL_EFORMAT, "%s: store format version %u, this sluice reads version %u; remove it so that it is rewritten",
			      s->path, ver, HDR_VERSION);
	uint32_t kl = get_u32(h + HDR_OFF_KEYLEN);
	if (kl > SL_DISK_MAX_KEY)
		return sl_err(SL_EFORMAT, "%s: corrupt store header (key of %u bytes)", s->path, kl);
	uint64_t data = get_u64(h + HDR_OFF_DATA);
	const char *k = (const char *)h + HDR_OFF_KEY;
	if (kl != strlen(s->key) || memcmp(k, s->key, kl) != 0 || data != s->capacity) {
		char have[320], want[320];
		key_show(k, kl, have, sizeof have);
		key_show(s->key, strlen(s->key), want, sizeof want);
		return sl_err(SL_EINVAL,
			      "%s holds another model or layout: stored key \"%s\" (%llu data bytes), expected \"%s\" "
			      "(%llu data bytes); remove it or use another --offload-dir",
			      s->path, have, (unsigned long long)data, want, (unsigned long long)s->capacity);
	}
	bool complete = get_u32(h + HDR_OFF_COMPLETE) == HDR_COMPLETE;
	if (complete && size < s->hdr_bytes + s->capacity)
		return sl_err(SL_EFORMAT, "%s is truncated: %llu bytes, but its header says %llu (header + data); "
			      "remove it so that it is rewritten",
			      s->path, (unsigned long long)size, (unsigned long long)(s->hdr_bytes + s->capacity));
	s->complete_on_disk = complete;
	*fresh = !complete;
	return 0;
}

static int space_check(sl_disk_store *s, uint64_t need, uint64_t allocated)
{
	struct statvfs v;
	if (fstatvfs(s->fd, &v) != 0 || v.f_frsize == 0 || v.f_blocks == 0)
		return 0; /* unknown (ramfs reports no size): the writes will tell */
	uint64_t avail = (uint64_t)v.f_bavail * v.f_frsize;
	uint64_t more = need > allocated ? need - allocated : 0;
	if (more > avail)
		return sl_err(SL_EIO, "%s: not enough free space for %s (needs %.1f MiB more, %.1f MiB free); "
			      "free some space or use another --offload-dir",
			      s->dir, s->path, (double)more / (1 << 20), (double)avail / (1 << 20));
	return 0;
}

static int check_dir(const char *dir)
{
	struct stat st;
	char eb[128];
	if (stat(dir, &st) != 0) {
		if (errno == ENOENT || errno == ENOTDIR)
			return sl_err(SL_ENOTFOUND, "offload directory %s does not exist; create it or use another --offload-dir",
				      dir);
		return sl_err(SL_EIO, "offload directory %s: %s", dir, errstr(errno, eb, sizeof eb));
	}
	if (!S_ISDIR(st.st_mode))
		return sl_err(SL_ENOTFOUND, "offload directory %s is not a directory; use another --offload-dir", dir);
	return 0;
}

static int open_error(const sl_disk_store *s, int e)
{
	char eb[128];
	const char *es = errstr(e, eb, sizeof eb);
	if (e == EACCES || e == EPERM || e == EROFS) {
		if (access(s->path, F_OK) == 0)
			return sl_err(SL_EIO, "%s: cannot open the store for writing (%s); fix its permissions, remove it "
				      "or use another --offload-dir", s->path, es);
		return sl_err(SL_EIO, "offload directory %s is not writable (%s): cannot create %s; use another --offload-dir",
			      s->dir, es, s->path);
	}
	if (e == ENOSPC || e == EDQUOT)
		return sl_err(SL_EIO, "%s: disk full creating %s (%s)", s->dir, s->path, es);
	return sl_err(SL_EIO, "%s: cannot open (%s)", s->path, es);
}

/* ---- lifecycle ----------------------------------------------------------- */

static sl_disk_store *store_new(const char *dir, const char *name, const char *key, int qd, size_t chunk)
{
	sl_disk_store *s = calloc(1, sizeof *s);
	if (!s)
		return NULL;
	s->fd = -1;
	s->bind_node = s->io_node = -1;
	s->qd = qd > 0 ? qd : SL_DISK_DEFAULT_QD;
	s->chunk = chunk ? chunk : SL_DISK_DEFAULT_CHUNK;
	s->next_ticket = s->sub_ticket = 1;
	s->dir = strdup(dir);
	s->key = strdup(key);
	size_t pl = strlen(dir) + strlen(name) + 2;
	s->path = malloc(pl);
	s->req = calloc(SL_DISK_MAX_REQUESTS, sizeof *s->req);
	s->evicted = calloc(SL_DISK_MAX_REQUESTS, sizeof *s->evicted);
	if (!s->dir || !s->key || !s->path || !s->req || !s->evicted) {
		sl_disk_close(s);
		return NULL;
	}
	snprintf(s->path, pl, "%s/%s", dir, name);
	if (pthread_mutex_init(&s->mu, NULL) == 0) {
		pthread_cond_init(&s->done_cv, NULL);
		pthread_cond_init(&s->work_cv, NULL);
		s->sync_init = true;
	}
	if (!s->sync_init) {
		sl_disk_close(s);
		return NULL;
	}
	return s;
}

int sl_disk_open(const sl_disk_params *p, sl_disk_store **out, bool *fresh)
{
	char eb[128], why_direct[200] = "";
	if (!p || !out)
		return sl_err(SL_EINVAL, "sl_disk_open: NULL argument");
	*out = NULL;
	if (!p->dir || !p->dir[0])
		return sl_err(SL_EINVAL, "disk store: no offload directory given");
	if (!p->file_name || !p->file_name[0] || strchr(p->file_name, '/'))
		return sl_err(SL_EINVAL, "disk store: bad file name \"%s\" (must be a plain name)",
			      p->file_name ? p->file_name : "(null)");
	if (!p->key || strlen(p->key) > SL_DISK_MAX_KEY)
		return sl_err(SL_EINVAL, "disk store %s/%s: the key must be given and at most %u bytes", p->dir,
			      p->file_name, SL_DISK_MAX_KEY);
	if (p->data_bytes == 0 || p->data_bytes > (UINT64_MAX >> 2))
		return sl_err(SL_EINVAL, "disk store %s/%s: bad data size %llu", p->dir, p->file_name,
			      (unsigned long long)p->data_bytes);
	if (p->queue_depth < 0 || p->queue_depth > 4096)
		return sl_err(SL_EINVAL, "disk store %s/%s: queue depth %d outside 1..4096", p->dir, p->file_name,
			      p->queue_depth);
	if (p->chunk_bytes % SL_DISK_ALIGN || p->chunk_bytes > (64u << 20))
		return sl_err(SL_EINVAL, "disk store %s/%s: chunk size %zu is not a multiple of 4096 up to 64 MiB",
			      p->dir, p->file_name, p->chunk_bytes);
	SL_TRY(check_dir(p->dir));

	sl_disk_store *s = store_new(p->dir, p->file_name, p->key, p->queue_depth, p->chunk_bytes);
	if (!s)
		return sl_err(SL_ENOMEM, "disk store %s/%s: out of memory", p->dir, p->file_name);
	s->hdr_bytes = SL_DISK_HEADER_BYTES;
	s->bind_node = p->bind_io && p->io_node >= 0 ? p->io_node : -1;
	s->header_delay_ms = p->test_header_delay_ms > 0 ? p->test_header_delay_ms : 0;
	s->capacity = (p->data_bytes + SL_DISK_ALIGN - 1) / SL_DISK_ALIGN * SL_DISK_ALIGN;

	int rc = 0;
	unsigned char *h = NULL;
	struct stat st;
	bool existed = stat(s->path, &st) == 0; /* a file this open creates goes if it fails */
	s->direct = true;
	if (p->force_no_direct) {
		s->direct = false;
		snprintf(why_direct, sizeof why_direct, "O_DIRECT disabled (force_no_direct)");
	}
	for (int tries = 0;; tries++) {
		s->fd = open(s->path, O_RDWR | O_CREAT | O_CLOEXEC | (s->direct ? O_DIRECT : 0), 0644);
		if (s->fd < 0 && errno == EINVAL && s->direct) {
			snprintf(why_direct, sizeof why_direct, "the file system refuses O_DIRECT (%s)",
				 errstr(EINVAL, eb, sizeof eb));
			s->direct = false;
			s->fd = open(s->path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
		}
		if (s->fd < 0) {
			rc = open_error(s, errno);
			goto fail;
		}
		/* Held while open: sl_disk_remove_unused leaves a held store
		 * alone (file systems without flock: no protection, no error). */
		while (flock(s->fd, LOCK_SH) != 0 && errno == EINTR)
			;
		if (fstat(s->fd, &st) != 0) {
			rc = sl_err(SL_EIO, "%s: fstat failed (%s)", s->path, errstr(errno, eb, sizeof eb));
			goto fail;
		}
		if (st.st_nlink > 0 || tries == 3)
			break;
		close(s->fd); /* removed between the open and the lock: a new file */
		s->fd = -1;
	}
	bool is_fresh = true;
	if (st.st_size > 0 && st.st_size < (off_t)SL_DISK_HEADER_BYTES) {
		rc = sl_err(SL_EFORMAT, "%s: %lld bytes, too short to be a sluice store; remove it or use another --offload-dir",
			    s->path, (long long)st.st_size);
		goto fail;
	}
	if (st.st_size > 0) {
		h = page_alloc(SL_DISK_HEADER_BYTES);
		if (!h) {
			rc = sl_err(SL_ENOMEM, "%s: out of memory for the header", s->path);
			goto fail;
		}
		ssize_t k;
		for (int attempt = 0; attempt < 2; attempt++) {
			do
				k = pread(s->fd, h, SL_DISK_HEADER_BYTES, 0);
			while (k < 0 && errno == EINTR);
			if (!(k < 0 && errno == EINVAL && s->direct))
				break;
			if ((rc = drop_direct(s, why_direct, sizeof why_direct, EINVAL)) < 0)
				goto fail;
		}
		if (k != (ssize_t)SL_DISK_HEADER_BYTES) {
			rc = sl_err(SL_EIO, "%s: cannot read the header (%s)", s->path,
				    k < 0 ? errstr(errno, eb, sizeof eb) : "short read");
			goto fail;
		}
		if ((rc = header_check(s, h, (uint64_t)st.st_size, &is_fresh)) < 0)
			goto fail;
	}
	if (is_fresh) {
		uint64_t allocated = (uint64_t)st.st_blocks * 512u;
		if ((rc = space_check(s, s->hdr_bytes + s->capacity, allocated)) < 0)
			goto fail;
		int e = -header_pwrite(s, false);
		if (e == EINVAL && s->direct) {
			/* Some file systems accept O_DIRECT at open and refuse the I/O. */
			if ((rc = drop_direct(s, why_direct, sizeof why_direct, EINVAL)) < 0)
				goto fail;
			e = -header_pwrite(s, false);
		}
		if (e) {
			rc = header_error(s, e);
			goto fail;
		}
		s->complete_on_disk = false;
		s->write_failed = false;
	}
	if ((rc = engine_start(s, p->force_fallback, why_direct[0] ? why_direct : NULL, false)) < 0)
		goto fail;
	free(h);
	*out = s;
	if (fresh)
		*fresh = is_fresh;
	return 0;
fail:
	free(h);
	if (!existed && s->fd >= 0)
		unlink(s->path);
	sl_disk_close(s);
	return rc;
}

int sl_disk_peek(const char *path, sl_disk_info *info)
{
	char eb[128];
	memset(info, 0, sizeof *info);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOENT)
			return sl_err(SL_ENOTFOUND, "%s: no such store", path);
		return sl_err(SL_EIO, "%s: cannot open (%s)", path, errstr(errno, eb, sizeof eb));
	}
	struct stat st;
	unsigned char *h = page_alloc(SL_DISK_HEADER_BYTES);
	int rc = 0;
	if (!h) {
		rc = sl_err(SL_ENOMEM, "%s: out of memory for the header", path);
		goto out;
	}
	if (fstat(fd, &st) != 0) {
		rc = sl_err(SL_EIO, "%s: fstat failed (%s)", path, errstr(errno, eb, sizeof eb));
		goto out;
	}
	info->file_bytes = (uint64_t)st.st_size;
	if (flock(fd, LOCK_EX | LOCK_NB) != 0)
		info->in_use = errno == EWOULDBLOCK;
	else
		flock(fd, LOCK_UN);
	ssize_t k = pread(fd, h, SL_DISK_HEADER_BYTES, 0);
	info->is_store = (k >= 8 && memcmp(h, HDR_MAGIC, 8) == 0) || info->file_bytes == 0;
	if (k != (ssize_t)SL_DISK_HEADER_BYTES || memcmp(h, HDR_MAGIC, 8) != 0) {
		rc = sl_err(SL_EFORMAT, "%s is not a sluice store (%s)", path,
			    k != (ssize_t)SL_DISK_HEADER_BYTES ? "shorter than a header" : "bad magic");
		goto out;
	}
	if (get_u64(h + HDR_OFF_SUM) != fnv1a(h, HDR_OFF_SUM)) {
		rc = sl_err(SL_EFORMAT, "%s: corrupt store header (checksum mismatch)", path);
		goto out;
	}
	uint32_t kl = get_u32(h + HDR_OFF_KEYLEN);
	info->version = get_u32(h + HDR_OFF_VERSION);
	if (kl > SL_DISK_MAX_KEY || get_u32(h + HDR_OFF_HDRSIZE) != SL_DISK_HEADER_BYTES) {
		rc = sl_err(SL_EFORMAT, "%s: store format version %u, this sluice reads version %u", path,
			    info->version, HDR_VERSION);
		goto out;
	}
	memcpy(info->key, h + HDR_OFF_KEY, kl);
	info->key[kl] = 0;
	info->data_bytes = get_u64(h + HDR_OFF_DATA);
	info->complete = get_u32(h + HDR_OFF_COMPLETE) == HDR_COMPLETE &&
			 info->file_bytes >= SL_DISK_HEADER_BYTES + info->data_bytes;
out:
	free(h);
	close(fd);
	return rc;
}

int sl_disk_remove_unused(const char *path, bool *removed)
{
	char eb[128];
	*removed = false;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOENT)
			return 0;
		return sl_err(SL_EIO, "%s: cannot open (%s)", path, errstr(errno, eb, sizeof eb));
	}
	int rc = 0;
	struct stat a, b;
	if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
		if (errno != EWOULDBLOCK)
			rc = sl_err(SL_EIO, "%s: cannot lock (%s)", path, errstr(errno, eb, sizeof eb));
	} else if (fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
		/* still the file locked (not replaced meanwhile), held by no one */
		if (unlink(path) == 0)
			*removed = true;
		else
			rc = sl_err(SL_EIO, "%s: cannot remove (%s)", path, errstr(errno, eb, sizeof eb));
	}
	close(fd);
	return rc;
}

void sl_disk_close(sl_disk_store *s)
{
	if (!s)
		return;
	if (s->sync_init) {
		pthread_mutex_lock(&s->mu);
		while (s->active_reqs > 0 && s->engine != ENG_NONE && !s->fatal)
			pthread_cond_wait(&s->done_cv, &s->mu);
		s->closing = true;
		pthread_cond_broadcast(&s->work_cv);
		pthread_mutex_unlock(&s->mu);
		reaper_stop(s);
		for (int i = 0; i < s->nworkers; i++)
			pthread_join(s->workers[i], NULL);
		pthread_cond_destroy(&s->done_cv);
		pthread_cond_destroy(&s->work_cv);
		pthread_mutex_destroy(&s->mu);
	}
	if (s->fd >= 0) /* now: the ring's reference to the file may outlive the close */
		flock(s->fd, LOCK_UN);
	if (s->ring_init)
		io_uring_queue_exit(&s->ring); /* also drops the registered file */
	if (s->fd >= 0)
		close(s->fd);
	free(s->chunks);
	free(s->chunk_free);
	free(s->req);
	free(s->evicted);
	free(s->dir);
	free(s->path);
	free(s->key);
	free(s);
}

/* ---- I/O ----------------------------------------------------------------- */

static int disk_issue(sl_disk_store *s, bool write, uint64_t off, void *buf, size_t n, uint64_t *ticket)
{
	const char *what = write ? "write" : "read";
	if (!s || !ticket || !buf)
		return sl_err(SL_EINVAL, "sl_disk_%s: NULL argument", what);
	if (n == 0 || off % SL_DISK_ALIGN || n % SL_DISK_ALIGN || (uintptr_t)buf % SL_DISK_ALIGN)
		return sl_err(SL_EINVAL, "%s: %s of %zu bytes at offset %llu into %p: offset, size and buffer must be "
			      "non-zero multiples of 4096", s->path, what, n, (unsigned long long)off, buf);
	if (off > s->capacity || n > s->capacity - off)
		return sl_err(SL_ERANGE, "%s: %s of %zu bytes at offset %llu runs past the data area (%llu bytes)",
			      s->path, what, n, (unsigned long long)off, (unsigned long long)s->capacity);
	pthread_mutex_lock(&s->mu);
	if (s->fatal) {
		char eb[128];
		pthread_mutex_unlock(&s->mu);
		return sl_err(SL_EIO, "%s: the I/O engine failed earlier (%s)", s->path, errstr(s->fatal, eb, sizeof eb));
	}
	while (write && s->complete_on_disk) {
		/* Rewriting a complete store: clear the flag on disk first so an
		 * interruption from here on leaves it incomplete.  The write and
		 * its sync run without the mutex, so completions and other
		 * requests go on meanwhile; other writers wait for it. */
		if (s->hdr_busy) {
			pthread_cond_wait(&s->done_cv, &s->mu);
			continue;
		}
		s->hdr_busy = true;
		pthread_mutex_unlock(&s->mu);
		int e = -header_pwrite(s, false);
		pthread_mutex_lock(&s->mu);
		s->hdr_busy = false;
		if (!e)
			s->complete_on_disk = false;
		pthread_cond_broadcast(&s->done_cv);
		if (e) {
			int rc = header_error(s, e);
			pthread_mutex_unlock(&s->mu);
			return rc;
		}
	}
	uint64_t t;
	disk_req *r;
	bool waited = false;
	for (;;) {
		t = s->next_ticket;
		r = &s->req[t % SL_DISK_MAX_REQUESTS];
		if (r->state != REQ_ACTIVE)
			break;
		waited = true;
		pthread_cond_wait(&s->done_cv, &s->mu);
	}
	if (waited)
		s->st.requeued++;
	if (r->state == REQ_FAILED) { /* never waited for: keep it for a later wait */
		if (s->n_evicted == SL_DISK_MAX_REQUESTS) {
			pthread_mutex_unlock(&s->mu);
			return sl_err(SL_EIO, "%s: over %d failed requests were never waited for; wait for them "
				      "(sl_disk_wait_all) before issuing more", s->path, SL_DISK_MAX_REQUESTS);
		}
		s->evicted[s->n_evicted++] = r->fail;
	}
	*r = (disk_req){ .ticket = t, .state = REQ_ACTIVE, .write = write, .buf = buf, .off = off, .len = n };
	s->next_ticket++;
	busy_inc(s);
	if (s->engine == ENG_URING)
		uring_fill(s);
	else
		pthread_cond_broadcast(&s->work_cv);
	pthread_mutex_unlock(&s->mu);
	*ticket = t;
	return 0;
}

int sl_disk_read(sl_disk_store *s, uint64_t off, void *buf, size_t n, uint64_t *ticket)
{
	return disk_issue(s, false, off, buf, n, ticket);
}

int sl_disk_write(sl_disk_store *s, uint64_t off, const void *buf, size_t n, uint64_t *ticket)
{
	return disk_issue(s, true, off, (void *)buf, n, ticket);
}

int sl_disk_wait(sl_disk_store *s, uint64_t ticket)
{
	if (!s)
		return sl_err(SL_EINVAL, "sl_disk_wait: NULL store");
	pthread_mutex_lock(&s->mu);
	if (ticket == 0 || ticket >= s->next_ticket) {
		pthread_mutex_unlock(&s->mu);
		return sl_err(SL_EINVAL, "%s: wait for ticket %llu, which was never issued", s->path,
			      (unsigned long long)ticket);
	}
	disk_req *r = &s->req[ticket % SL_DISK_MAX_REQUESTS];
	while (r->ticket == ticket && r->state == REQ_ACTIVE)
		pthread_cond_wait(&s->done_cv, &s->mu);
	disk_fail f;
	bool failed = false;
	if (r->ticket == ticket && r->state == REQ_FAILED) {
		f = r->fail;
		r->state = REQ_FREE;
		failed = true;
	} else if (r->ticket != ticket) { /* the slot was reused: an evicted failure? */
		for (int i = 0; i < s->n_evicted; i++)
			if (s->evicted[i].ticket == ticket) {
				f = s->evicted[i];
				s->evicted[i] = s->evicted[--s->n_evicted];
				failed = true;
				break;
			}
	}
	pthread_mutex_unlock(&s->mu);
	return failed ? fail_report(s, &f, 0) : 0;
}

int sl_disk_wait_all(sl_disk_store *s)
{
	if (!s)
		return sl_err(SL_EINVAL, "sl_disk_wait_all: NULL store");
	pthread_mutex_lock(&s->mu);
	while (s->active_reqs > 0)
		pthread_cond_wait(&s->done_cv, &s->mu);
	disk_fail first = { 0 };
	uint64_t nfail = (uint64_t)s->n_evicted;
	for (int i = 0; i < s->n_evicted; i++)
		if (!first.ticket || s->evicted[i].ticket < first.ticket)
			first = s->evicted[i];
	s->n_evicted = 0;
	for (int i = 0; i < SL_DISK_MAX_REQUESTS; i++) {
		disk_req *r = &s->req[i];
		if (r->state != REQ_FAILED)
			continue;
		if (!first.ticket || r->fail.ticket < first.ticket)
			first = r->fail;
		r->state = REQ_FREE;
		nfail++;
	}
	pthread_mutex_unlock(&s->mu);
	if (!nfail)
		return 0;
	return fail_report(s, &first, nfail - 1);
}

int sl_disk_mark_complete(sl_disk_store *s)
{
	char eb[128];
	if (!s)
		return sl_err(SL_EINVAL, "sl_disk_mark_complete: NULL store");
	SL_TRY(sl_disk_wait_all(s));
	if (s->write_failed)
		return sl_err(SL_EIO, "%s: not marked complete: a write failed earlier (it will be rewritten when reopened)",
			      s->path);
	struct stat st;
	if (fstat(s->fd, &st) != 0)
		return sl_err(SL_EIO, "%s: fstat failed (%s)", s->path, errstr(errno, eb, sizeof eb));
	if ((uint64_t)st.st_size < s->hdr_bytes + s->capacity)
		return sl_err(SL_EINVAL, "%s: not marked complete: the file holds %lld bytes but header + data are %llu; "
			      "write the whole data area first", s->path, (long long)st.st_size,
			      (unsigned long long)(s->hdr_bytes + s->capacity));
	if (fdatasync(s->fd) != 0) {
		int e = errno;
		s->write_failed = true;
		if (e == ENOSPC || e == EDQUOT)
			return sl_err(SL_EIO, "%s: disk full flushing the store (%s)", s->path, errstr(e, eb, sizeof eb));
		return sl_err(SL_EIO, "%s: fdatasync failed (%s)", s->path, errstr(e, eb, sizeof eb));
	}
	if (!s->direct)
		posix_fadvise(s->fd, 0, 0, POSIX_FADV_DONTNEED);
	return header_write(s, true);
}

const char *sl_disk_mode(const sl_disk_store *s)
{
	return s && s->mode ? s->mode : "none";
}

int sl_disk_io_node(const sl_disk_store *s)
{
	return s && s->bind_node >= 0 ? s->io_node : -1;
}

const char *sl_disk_path(const sl_disk_store *s)
{
	return s ? s->path : "";
}

uint64_t sl_disk_capacity(const sl_disk_store *s)
{
	return s ? s->capacity : 0;
}

void sl_disk_get_stats(sl_disk_store *s, sl_disk_stats *out)
{
	if (!s || !out)
		return;
	pthread_mutex_lock(&s->mu);
	*out = s->st;
	if (s->active_reqs > 0)
		out->busy_s += sl_now() - s->busy_t0;
	pthread_mutex_unlock(&s->mu);
}

/* ---- bandwidth probe ----------------------------------------------------- */

#define PROBE_QD 32
#define PROBE_CHUNK (1u << 20)
#define PROBE_REQ (16u << 20) /* request size: the engine splits it into chunks */
#define PROBE_NBUF 4          /* requests outstanding */

/*
 * Move bytes through the store in 16 MiB requests, 4 outstanding, so the
 * engine always has more than PROBE_QD chunks queued and keeps PROBE_QD
 * 1 MiB chunks in flight (waiting request by request at 1 MiB would let the
 * oldest straggler drain the queue).
 */
static int probe_pass(sl_disk_store *s, bool write, uint64_t bytes, char *buf)
{
	uint64_t tk[PROBE_NBUF] = { 0 };
	int rc = 0;
	uint64_t i = 0;
	for (uint64_t off = 0; off < bytes && rc == 0; off += PROBE_REQ, i++) {
		int j = (int)(i % PROBE_NBUF);
		if (tk[j] && (rc = sl_disk_wait(s, tk[j])) < 0)
			break;
		size_t n = (size_t)SL_MIN((uint64_t)PROBE_REQ, bytes - off);
		char *p = buf + (size_t)j * PROBE_REQ;
		rc = write ? sl_disk_write(s, off, p, n, &tk[j]) : sl_disk_read(s, off, p, n, &tk[j]);
	}
	int rc2 = sl_disk_wait_all(s);
	return rc < 0 ? rc : rc2;
}

int sl_disk_probe_read(const char *dir, uint64_t bytes, double *gbps, char *mode, size_t mode_len)
{
	char eb[128];
	if (!dir || !gbps)
		return sl_err(SL_EINVAL, "sl_disk_probe_read: NULL argument");
	SL_TRY(check_dir(dir));
	if (bytes < PROBE_CHUNK)
		bytes = PROBE_CHUNK;
	bytes = (bytes + PROBE_CHUNK - 1) / PROBE_CHUNK * PROBE_CHUNK;

	sl_disk_store *s = store_new(dir, ".sluice-probe-XXXXXX", "probe", PROBE_QD, PROBE_CHUNK);
	if (!s)
		return sl_err(SL_ENOMEM, "%s: out of memory for the disk probe", dir);
	s->hdr_bytes = 0;
	s->capacity = bytes;
	char *buf = NULL;
	int rc = 0;
	s->fd = mkostemp(s->path, O_CLOEXEC);
	if (s->fd < 0) {
		rc = open_error(s, errno);
		goto out;
	}
	unlink(s->path); /* nothing is left behind, whatever happens */
	s->direct = fcntl(s->fd, F_SETFL, fcntl(s->fd, F_GETFL) | O_DIRECT) == 0;
	if ((rc = space_check(s, bytes, 0)) < 0)
		goto out;
	if ((rc = engine_start(s, false, NULL, true)) < 0)
		goto out;
	buf = page_alloc((size_t)PROBE_NBUF * PROBE_REQ);
	if (!buf) {
		rc = sl_err(SL_ENOMEM, "%s: out of memory for the disk probe's buffers", dir);
		goto out;
	}
	for (size_t i = 0; i < (size_t)PROBE_NBUF * PROBE_REQ; i += 64)
		buf[i] = (char)(i >> 12); /* not all zeros, in case the device compresses */
	if ((rc = probe_pass(s, true, bytes, buf)) < 0)
		goto out;
	if (fdatasync(s->fd) != 0) {
		rc = sl_err(SL_EIO, "%s: fdatasync of the probe file failed (%s)", dir, errstr(errno, eb, sizeof eb));
		goto out;
	}
	posix_fadvise(s->fd, 0, 0, POSIX_FADV_DONTNEED);
	double t0 = sl_now();
	if ((rc = probe_pass(s, false, bytes, buf)) < 0)
		goto out;
	double dt = sl_now() - t0;
	*gbps = dt > 0 ? (double)bytes / dt / 1e9 : 0;
	if (mode && mode_len)
		snprintf(mode, mode_len, "%s", s->mode);
out:
	if (rc < 0)
		sl_err_prefix(rc, "disk probe in %s", dir);
	sl_disk_close(s);
	free(buf);
	return rc;
}
