/*
 * disk_probe.c - measuring a folder's disk through a store's own engine on
 * an unlinked temporary file: sl_disk_probe (the sequential O_DIRECT write
 * and read bandwidths: sluice bench's probe_read_gbps) and the probe file
 * that sluice profile runs its request patterns on (sl_disk_probe_open,
 * sl_disk_probe_pass).
 */
#include "disk_internal.h"
#include "sl_common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define PROBE_QD 32
#define PROBE_CHUNK (1u << 20)
#define PROBE_REQ (16u << 20) /* request size: the engine splits it into chunks */
#define PROBE_NBUF 4          /* requests outstanding */
#define PROBE_WREQ SL_DISK_DEFAULT_CHUNK /* the write pass's requests: the store's chunk */
#define PROBE_WOUT 64         /* write requests outstanding */
#define PROBE_MAX_OUT 256     /* the most requests a pass keeps outstanding */

struct sl_disk_probe_file {
	sl_disk_store *s;
	uint64_t bytes;
	char *buf; /* the passes' buffers, 4 KiB aligned; not all zeros */
	size_t buf_bytes;
};

/* A buffer of at least n bytes (grown as a pass needs). */
static int probe_buf(sl_disk_probe_file *f, size_t n)
{
	if (f->buf_bytes >= n)
		return 0;
	char *b = disk_page_alloc(n);
	if (!b)
		return sl_err(SL_ENOMEM, "%s: out of memory for the disk probe's buffers (%zu MiB)", f->s->dir,
			      n >> 20);
	for (size_t i = 0; i < n; i += 64)
		b[i] = (char)(i >> 12); /* not all zeros, in case the device compresses */
	free(f->buf);
	f->buf = b;
	f->buf_bytes = n;
	return 0;
}

int sl_disk_probe_pass(sl_disk_probe_file *f, bool write, uint64_t off, uint64_t len, size_t req, int nout,
		       uint64_t stride, double *seconds)
{
	*seconds = 0;
	if (!req || req % SL_DISK_ALIGN || off % SL_DISK_ALIGN || len % SL_DISK_ALIGN || stride % SL_DISK_ALIGN || req > f->bytes ||
	    nout < 1 || nout > PROBE_MAX_OUT || (stride && stride < req))
		return sl_err(SL_EINVAL, "disk probe pass: bad request shape (request %zu, %d outstanding, stride %llu)",
			      req, nout, (unsigned long long)stride);
	SL_TRY(probe_buf(f, (size_t)nout * req));
	uint64_t tk[PROBE_MAX_OUT] = { 0 };
	int rc = 0;
	const double t0 = sl_now();
	uint64_t at = off % f->bytes, done = 0;
	for (uint64_t i = 0; done < len && rc == 0; i++) {
		const int j = (int)(i % (uint64_t)nout);
		if (tk[j] && (rc = sl_disk_wait(f->s, tk[j])) < 0)
			break;
		const size_t n = (size_t)SL_MIN((uint64_t)req, len - done);
		at %= f->bytes; /* the offsets wrap within the file */
		if (at + n > f->bytes)
			at = 0;
		char *p = f->buf + (size_t)j * req;
		rc = write ? sl_disk_write(f->s, at, p, n, &tk[j]) : sl_disk_read(f->s, at, p, n, &tk[j]);
		at += stride ? stride : n;
		done += n;
	}
	const int rc2 = sl_disk_wait_all(f->s);
	*seconds = sl_now() - t0;
	return rc < 0 ? rc : rc2;
}

int sl_disk_probe_open(const char *dir, uint64_t bytes, double *write_gbps, sl_disk_probe_file **out)
{
	char eb[128];
	*out = NULL;
	if (write_gbps)
		*write_gbps = 0;
	if (!dir)
		return sl_err(SL_EINVAL, "sl_disk_probe_open: NULL argument");
	SL_TRY(disk_check_dir(dir));
	if (bytes < PROBE_CHUNK)
		bytes = PROBE_CHUNK;
	bytes = (bytes + PROBE_CHUNK - 1) / PROBE_CHUNK * PROBE_CHUNK;
	sl_disk_probe_file *f = calloc(1, sizeof *f);
	/* the stores' window: the probe reads what their requests can */
	sl_disk_store *s = f ? disk_store_new(dir, ".sluice-probe-XXXXXX", "probe", PROBE_QD, PROBE_CHUNK, 0) : NULL;
	if (!s) {
		free(f);
		return sl_err(SL_ENOMEM, "%s: out of memory for the disk probe", dir);
	}
	f->s = s;
	f->bytes = bytes;
	s->hdr_bytes = 0;
	s->capacity = bytes;
	int rc = 0;
	s->fd = mkostemp(s->path, O_CLOEXEC);
	if (s->fd < 0) {
		rc = disk_open_error(s, errno);
		goto out;
	}
	unlink(s->path); /* nothing is left behind, whatever happens */
	s->direct = fcntl(s->fd, F_SETFL, fcntl(s->fd, F_GETFL) | O_DIRECT) == 0;
	if ((rc = disk_space_check(s, bytes, 0)) < 0)
		goto out;
	if ((rc = disk_engine_start(s, false, NULL, true)) < 0)
		goto out;
	/* the writes as the engine issues a store's (a chunk each, many
	 * outstanding), timed to their completion: the KV cache's writes are
	 * never synced */
	double dt;
	if ((rc = sl_disk_probe_pass(f, true, 0, bytes, PROBE_WREQ, PROBE_WOUT, 0, &dt)) < 0)
		goto out;
	if (write_gbps)
		*write_gbps = dt > 0 ? (double)bytes / dt / 1e9 : 0;
	if (fdatasync(s->fd) != 0) {
		rc = sl_err(SL_EIO, "%s: fdatasync of the probe file failed (%s)", dir, disk_errstr(errno, eb, sizeof eb));
		goto out;
	}
	posix_fadvise(s->fd, 0, 0, POSIX_FADV_DONTNEED);
out:
	if (rc < 0) {
		sl_err_prefix(rc, "disk probe in %s", dir);
		sl_disk_probe_close(f);
		return rc;
	}
	*out = f;
	return 0;
}

const char *sl_disk_probe_engine(const sl_disk_probe_file *f)
{
	return f->s->mode;
}

uint64_t sl_disk_probe_bytes(const sl_disk_probe_file *f)
{
	return f->bytes;
}

void sl_disk_probe_close(sl_disk_probe_file *f)
{
	if (!f)
		return;
	sl_disk_close(f->s);
	free(f->buf);
	free(f);
}

int sl_disk_probe_read(const char *dir, uint64_t bytes, double *gbps, char *mode, size_t mode_len)
{
	if (!gbps)
		return sl_err(SL_EINVAL, "sl_disk_probe_read: NULL argument");
	return sl_disk_probe(dir, bytes, gbps, NULL, mode, mode_len);
}

int sl_disk_probe(const char *dir, uint64_t bytes, double *read_gbps, double *write_gbps, char *mode,
		  size_t mode_len)
{
	if (!dir || !read_gbps)
		return sl_err(SL_EINVAL, "sl_disk_probe: NULL argument");
	sl_disk_probe_file *f;
	SL_TRY(sl_disk_probe_open(dir, bytes, write_gbps, &f));
	/* 16 MiB requests, 4 outstanding: the engine always has chunks queued
	 * and keeps its window full (waiting request by request at 1 MiB
	 * would let the oldest straggler drain the queue) */
	double dt;
	const uint64_t n = sl_disk_probe_bytes(f);
	int rc = sl_disk_probe_pass(f, false, 0, n, (size_t)SL_MIN((uint64_t)PROBE_REQ, n), PROBE_NBUF, 0, &dt);
	if (rc < 0)
		sl_err_prefix(rc, "disk probe in %s", dir);
	else
		*read_gbps = dt > 0 ? (double)n / dt / 1e9 : 0;
	if (rc == 0 && mode && mode_len)
		snprintf(mode, mode_len, "%s", sl_disk_probe_engine(f));
	sl_disk_probe_close(f);
	return rc;
}
