/*
 * disk_requests.c - the disk store's request table, shared by both engines:
 * tickets, the order chunks start in, completion, failure bookkeeping, and
 * sl_disk_read/write/wait/wait_all and the statistics.
 *
 * Requests and tickets.  A request occupies slot (ticket % SL_DISK_MAX_REQUESTS)
 * of a fixed table from issue until it completes (success frees the slot at
 * once) or, if it failed, until its failure is reported by a wait.  Tickets
 * are issued in order, so the requests that still have chunks to start are
 * exactly the tickets from sub_ticket on: the engines take the next chunk
 * from there (disk_next_chunk) without any list.  Issuing ticket t waits
 * while ticket t - SL_DISK_MAX_REQUESTS is still running; if that one failed
 * and was never waited for, its failure moves to a second fixed table
 * (evicted) where a later wait still finds it, so a failure is never lost.
 * The engines report each chunk with disk_chunk_finish; sl_disk_wait is
 * engine-agnostic.  Nothing is allocated per request.
 */
#include "disk_internal.h"
#include "sl_common.h"

#include <errno.h>
#include <stdio.h>

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

/*
 * The next chunk to start, in ticket order; false when none is waiting, or
 * the queue depth or the window is full.  The window keeps the requests
 * finishing in the order they were issued: the device serves what is in
 * flight side by side, so a later request's chunks sent beside an earlier
 * one's would delay it (SL_DISK_DEFAULT_WINDOW).
 */
bool disk_next_chunk(sl_disk_store *s, int *slot, uint64_t *off, size_t *len)
{
	while (s->sub_ticket < s->next_ticket) {
		int i = (int)(s->sub_ticket % SL_DISK_MAX_REQUESTS);
		disk_req *r = &s->req[i];
		if (r->state == REQ_ACTIVE && r->ticket == s->sub_ticket && r->submitted < r->len) {
			size_t n = SL_MIN(s->chunk, r->len - r->submitted);
			if (s->in_flight >= s->qd || (s->in_flight > 0 && s->in_flight_bytes + n > s->window))
				return false;
			*slot = i;
			*off = r->off + r->submitted;
			*len = n;
			r->submitted += n;
			r->chunks_out++;
			s->in_flight++;
			s->in_flight_bytes += n;
			s->st.max_in_flight = SL_MAX(s->st.max_in_flight, s->in_flight);
			s->st.max_in_flight_bytes = SL_MAX(s->st.max_in_flight_bytes, s->in_flight_bytes);
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
void disk_chunk_finish(sl_disk_store *s, int slot, size_t len, uint64_t pos, size_t got, int err, bool is_short)
{
	disk_req *r = &s->req[slot];
	r->chunks_out--;
	s->in_flight--;
	s->in_flight_bytes -= len;
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
	const char *es = disk_errstr(f->err, eb, sizeof eb);
	if (f->write && (f->err == ENOSPC || f->err == EFBIG || f->err == EDQUOT))
		return sl_err(SL_EIO, "%s: disk full writing offset %llu (%s)%s", s->path,
			      (unsigned long long)f->pos, es, extra);
	return sl_err(SL_EIO, "%s: %s failed at offset %llu (%s)%s", s->path, f->write ? "write" : "read",
		      (unsigned long long)f->pos, es, extra);
}

/* The engine broke (cannot happen short of a kernel bug): fail everything. */
void disk_fail_all(sl_disk_store *s, int err)
{
	s->fatal = err;
	for (int i = 0; i < SL_DISK_MAX_REQUESTS; i++) {
		disk_req *r = &s->req[i];
		if (r->state != REQ_ACTIVE)
			continue;
		r->chunks_out = 1;
		r->submitted = r->len;
		disk_chunk_finish(s, i, 0, r->off, 0, err, false);
	}
	s->in_flight = 0;
	s->in_flight_bytes = 0;
}

/* ---- read, write, wait ---------------------------------------------------- */

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
		return sl_err(SL_EIO, "%s: the I/O engine failed earlier (%s)", s->path, disk_errstr(s->fatal, eb, sizeof eb));
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
		int e = -disk_header_pwrite(s, false);
		pthread_mutex_lock(&s->mu);
		s->hdr_busy = false;
		if (!e)
			s->complete_on_disk = false;
		pthread_cond_broadcast(&s->done_cv);
		if (e) {
			int rc = disk_header_error(s, e);
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
	s->eng->kick(s);
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
