/*
 * disk_probe.c - sl_disk_probe_read: the sequential O_DIRECT read bandwidth
 * of a folder, measured through a store's own engine on an unlinked
 * temporary file (sluice profile, sluice bench's probe_read_gbps).
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
	buf = disk_page_alloc((size_t)PROBE_NBUF * PROBE_REQ);
	if (!buf) {
		rc = sl_err(SL_ENOMEM, "%s: out of memory for the disk probe's buffers", dir);
		goto out;
	}
	for (size_t i = 0; i < (size_t)PROBE_NBUF * PROBE_REQ; i += 64)
		buf[i] = (char)(i >> 12); /* not all zeros, in case the device compresses */
	if ((rc = probe_pass(s, true, bytes, buf)) < 0)
		goto out;
	if (fdatasync(s->fd) != 0) {
		rc = sl_err(SL_EIO, "%s: fdatasync of the probe file failed (%s)", dir, disk_errstr(errno, eb, sizeof eb));
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
