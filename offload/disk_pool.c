/*
 * disk_pool.c - the disk store's thread-pool engine, for where io_uring or
 * O_DIRECT is unavailable: a few workers take chunks under the store's mutex
 * (disk_next_chunk) and run pread/pwrite outside it.  Without O_DIRECT
 * (buffered) each chunk's pages are written back and dropped from the page
 * cache behind it, so the page cache neither flatters the measurement nor
 * takes memory outside the budgets.
 */
#include "disk_internal.h"
#include "sl_common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define POOL_THREADS 4

typedef struct disk_pool {
	pthread_cond_t work_cv; /* with s->mu: chunks are waiting, or closing */
	pthread_t workers[POOL_THREADS];
	int nworkers;
} disk_pool;

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
	disk_pool *P = s->eng_state;
	disk_io_thread_place(s);
	pthread_mutex_lock(&s->mu);
	for (;;) {
		int slot;
		uint64_t off;
		size_t len;
		if (!disk_next_chunk(s, &slot, &off, &len)) {
			if (s->closing)
				break;
			pthread_cond_wait(&P->work_cv, &s->mu);
			continue;
		}
		disk_req *r = &s->req[slot];
		char *p = r->buf + (off - r->off);
		bool write = r->write;
		pthread_mutex_unlock(&s->mu);

		size_t done;
		int err;
		bool is_short;
		pool_io(s, write, p, len, s->hdr_bytes + off, &done, &err, &is_short);

		pthread_mutex_lock(&s->mu);
		disk_chunk_finish(s, slot, len, off + done, done, err, is_short);
		/* the window may have room for another worker's chunk too */
		pthread_cond_signal(&P->work_cv);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

static void pool_kick(sl_disk_store *s)
{
	disk_pool *P = s->eng_state;
	pthread_cond_broadcast(&P->work_cv);
}

/* s->closing is set: the workers leave once no chunk is waiting. */
static void pool_stop(sl_disk_store *s)
{
	disk_pool *P = s->eng_state;
	pthread_mutex_lock(&s->mu);
	pthread_cond_broadcast(&P->work_cv);
	pthread_mutex_unlock(&s->mu);
	for (int i = 0; i < P->nworkers; i++)
		pthread_join(P->workers[i], NULL);
	P->nworkers = 0;
}

static void pool_release(sl_disk_store *s)
{
	disk_pool *P = s->eng_state;
	pthread_cond_destroy(&P->work_cv);
	free(P);
	s->eng_state = NULL;
}

static const disk_engine pool_engine = { .kick = pool_kick, .stop = pool_stop, .release = pool_release };

int disk_pool_start(sl_disk_store *s)
{
	disk_pool *P = calloc(1, sizeof *P);
	if (!P || pthread_cond_init(&P->work_cv, NULL) != 0) {
		free(P);
		return sl_err(SL_ENOMEM, "%s: out of memory for the I/O threads", s->path);
	}
	s->eng = &pool_engine; /* from here on close stops and releases it */
	s->eng_state = P;
	int n = SL_MIN(s->qd, POOL_THREADS);
	for (int i = 0; i < n; i++) {
		int rc = pthread_create(&P->workers[i], NULL, pool_worker, s);
		if (rc) {
			char eb[128];
			return sl_err(SL_ENOMEM, "%s: cannot start I/O threads (%s)", s->path, disk_errstr(rc, eb, sizeof eb));
		}
		P->nworkers++;
	}
	disk_io_threads_placed(s, P->nworkers);
	return 0;
}
