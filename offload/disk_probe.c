/*
 * disk_probe.c - sl_disk_probe: the sequential O_DIRECT write and read
 * bandwidths of a folder, measured through a store's own engine on an
 * unlinked temporary file (sluice profile, sluice bench's probe_read_gbps).
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
#define PROBE_BUF ((size_t)PROBE_NBUF * PROBE_REQ)
#define PROBE_WREQ SL_DISK_DEFAULT_CHUNK /* the write pass's requests: the store's chunk */

/*
 * Move bytes through the store in requests of req bytes, as many
 * outstanding as the buffer holds (16 MiB requests: 4; 1 MiB: 64), so the
 * engine always has more than PROBE_QD chunks queued and keeps PROBE_QD
 * 1 MiB chunks in flight (waiting request by request at 1 MiB would let the
 * oldest straggler drain the queue).
 */
static int probe_pass(sl_disk_store *s, bool write, uint64_t bytes, size_t req, char *buf)
{
	enum { MAX_OUT = PROBE_BUF / (4096 * 16) };
	uint64_t tk[MAX_OUT] = { 0 };
	const int nout = (int)SL_MIN(PROBE_BUF / req, (size_t)MAX_OUT);
	int rc = 0;
	uint64_t i = 0;
	for (uint64_t off = 0; off < bytes && rc == 0; off += req, i++) {
		int j = (int)(i % (uint64_t)nout);
		if (tk[j] && (rc = sl_disk_wait(s, tk[j])) < 0)
			break;
		size_t n = (size_t)SL_MIN((uint64_t)req, bytes - off);
		char *p = buf + (size_t)j * req;
		rc = write ? sl_disk_write(s, off, p, n, &tk[j]) : sl_disk_read(s, off, p, n, &tk[j]);
	}
	int rc2 = sl_disk_wait_all(s);
	return rc < 0 ? rc : rc2;
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
	char eb[128];
	if (!dir || !read_gbps)
		return sl_err(SL_EINVAL, "sl_disk_probe: NULL argument");
	SL_TRY(disk_check_dir(dir));
	if (bytes < PROBE_CHUNK)
		bytes = PROBE_CHUNK;
	bytes = (bytes + PROBE_CHUNK - 1) / PROBE_CHUNK * PROBE_CHUNK;

	sl_disk_store *s = disk_store_new(dir, ".sluice-probe-XXXXXX", "probe", PROBE_QD, PROBE_CHUNK);
	if (!s)
		return sl_err(SL_ENOMEM, "%s: out of memory for the disk probe", dir);
	s->hdr_bytes = 0;
	s->capacity = bytes;
	char *buf = NULL;
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
	buf = disk_page_alloc(PROBE_BUF);
	if (!buf) {
		rc = sl_err(SL_ENOMEM, "%s: out of memory for the disk probe's buffers", dir);
		goto out;
	}
	for (size_t i = 0; i < PROBE_BUF; i += 64)
		buf[i] = (char)(i >> 12); /* not all zeros, in case the device compresses */
	/* the writes as the engine issues a store's (a chunk each, many
	 * outstanding), timed to their completion: the KV cache's writes are
	 * never synced */
	double t0 = sl_now();
	if ((rc = probe_pass(s, true, bytes, PROBE_WREQ, buf)) < 0)
		goto out;
	double dt = sl_now() - t0;
	if (write_gbps)
		*write_gbps = dt > 0 ? (double)bytes / dt / 1e9 : 0;
	if (fdatasync(s->fd) != 0) {
		rc = sl_err(SL_EIO, "%s: fdatasync of the probe file failed (%s)", dir, disk_errstr(errno, eb, sizeof eb));
		goto out;
	}
	posix_fadvise(s->fd, 0, 0, POSIX_FADV_DONTNEED);
	t0 = sl_now();
	if ((rc = probe_pass(s, false, bytes, PROBE_REQ, buf)) < 0)
		goto out;
	dt = sl_now() - t0;
	*read_gbps = dt > 0 ? (double)bytes / dt / 1e9 : 0;
	if (mode && mode_len)
		snprintf(mode, mode_len, "%s", s->mode);
out:
	if (rc < 0)
		sl_err_prefix(rc, "disk probe in %s", dir);
	sl_disk_close(s);
	free(buf);
	return rc;
}
