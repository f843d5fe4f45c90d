/*
 * disk_store.c - the disk tier's lifecycle: open (the offload folder's
 * checks, the file, its lock, O_DIRECT or not, the header read or written,
 * the engine chosen), mark complete, close, and removing unused stores.
 *
 * The other parts (disk_internal.h lists them): the header's format in
 * disk_format.c, the request table and read/write/wait in disk_requests.c,
 * the engines in disk_uring.c and disk_pool.c behind struct disk_engine, the
 * bandwidth probe in disk_probe.c.
 */
#include "disk_internal.h"
#include "sl_common.h"
#include "topology.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* ---- the I/O threads' placement (bind_io) ---------------------------------- */

/* First thing an I/O thread does: bind itself to the store's node and
 * report the node its binding lies in (open waits for every thread). */
void disk_io_thread_place(sl_disk_store *s)
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
void disk_io_threads_placed(sl_disk_store *s, int n)
{
	if (s->bind_node < 0)
		return;
	pthread_mutex_lock(&s->mu);
	while (s->threads_bound < n)
		pthread_cond_wait(&s->done_cv, &s->mu);
	pthread_mutex_unlock(&s->mu);
}

/* ---- engine, file checks ---------------------------------------------------- */

int disk_engine_start(sl_disk_store *s, bool force_fallback, const char *why_direct, bool quiet)
{
	char why_uring[200] = "";
	if (s->direct) {
		if (force_fallback)
			snprintf(why_uring, sizeof why_uring, "io_uring disabled (force_fallback)");
		else
			SL_TRY(disk_uring_start(s, why_uring, sizeof why_uring));
	}
	if (s->eng) { /* io_uring started */
		s->mode = "io_uring+O_DIRECT";
		return 0;
	}
	s->mode = s->direct ? "threads+pread+O_DIRECT" : "threads+pread+buffered";
	if (!quiet)
		fprintf(stderr, "sluice: warning: %s: %s%s%s; using %s%s\n", s->dir, why_direct ? why_direct : "",
			why_direct && why_uring[0] ? " and " : "", why_uring, s->mode,
			s->direct ? "" : " (page cache dropped behind each chunk)");
	return disk_pool_start(s);
}

/* The file system refused O_DIRECT I/O on an fd it let us open: go buffered. */
static int drop_direct(sl_disk_store *s, char *why, size_t whyn, int e)
{
	char eb[128];
	int fd = open(s->path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return sl_err(SL_EIO, "%s: cannot reopen without O_DIRECT (%s)", s->path, disk_errstr(errno, eb, sizeof eb));
	close(s->fd);
	s->fd = fd;
	s->direct = false;
	snprintf(why, whyn, "the file system refuses O_DIRECT (%s)", disk_errstr(e, eb, sizeof eb));
	return 0;
}

int disk_space_check(sl_disk_store *s, uint64_t need, uint64_t allocated)
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

int disk_check_dir(const char *dir)
{
	struct stat st;
	char eb[128];
	if (stat(dir, &st) != 0) {
		if (errno == ENOENT || errno == ENOTDIR)
			return sl_err(SL_ENOTFOUND, "offload directory %s does not exist; create it or use another --offload-dir",
				      dir);
		return sl_err(SL_EIO, "offload directory %s: %s", dir, disk_errstr(errno, eb, sizeof eb));
	}
	if (!S_ISDIR(st.st_mode))
		return sl_err(SL_ENOTFOUND, "offload directory %s is not a directory; use another --offload-dir", dir);
	return 0;
}

int disk_open_error(const sl_disk_store *s, int e)
{
	char eb[128];
	const char *es = disk_errstr(e, eb, sizeof eb);
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

sl_disk_store *disk_store_new(const char *dir, const char *name, const char *key, int qd, size_t chunk,
			      size_t window)
{
	sl_disk_store *s = calloc(1, sizeof *s);
	if (!s)
		return NULL;
	s->fd = -1;
	s->bind_node = s->io_node = -1;
	s->qd = qd > 0 ? qd : SL_DISK_DEFAULT_QD;
	s->chunk = chunk ? chunk : SL_DISK_DEFAULT_CHUNK;
	s->window = window ? window : SL_DISK_DEFAULT_WINDOW;
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
	SL_TRY(disk_check_dir(p->dir));

	sl_disk_store *s = disk_store_new(p->dir, p->file_name, p->key, p->queue_depth, p->chunk_bytes,
					  p->window_bytes);
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
				 disk_errstr(EINVAL, eb, sizeof eb));
			s->direct = false;
			s->fd = open(s->path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
		}
		if (s->fd < 0) {
			rc = disk_open_error(s, errno);
			goto fail;
		}
		/* Held while open: sl_disk_remove_unused leaves a held store
		 * alone (file systems without flock: no protection, no error). */
		while (flock(s->fd, LOCK_SH) != 0 && errno == EINTR)
			;
		if (fstat(s->fd, &st) != 0) {
			rc = sl_err(SL_EIO, "%s: fstat failed (%s)", s->path, disk_errstr(errno, eb, sizeof eb));
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
		h = disk_page_alloc(SL_DISK_HEADER_BYTES);
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
				    k < 0 ? disk_errstr(errno, eb, sizeof eb) : "short read");
			goto fail;
		}
		if ((rc = disk_header_check(s, h, (uint64_t)st.st_size, &is_fresh)) < 0)
			goto fail;
	}
	if (is_fresh) {
		uint64_t allocated = (uint64_t)st.st_blocks * 512u;
		if ((rc = disk_space_check(s, s->hdr_bytes + s->capacity, allocated)) < 0)
			goto fail;
		int e = -disk_header_pwrite(s, false);
		if (e == EINVAL && s->direct) {
			/* Some file systems accept O_DIRECT at open and refuse the I/O. */
			if ((rc = drop_direct(s, why_direct, sizeof why_direct, EINVAL)) < 0)
				goto fail;
			e = -disk_header_pwrite(s, false);
		}
		if (e) {
			rc = disk_header_error(s, e);
			goto fail;
		}
		s->complete_on_disk = false;
		s->write_failed = false;
	}
	if ((rc = disk_engine_start(s, p->force_fallback, why_direct[0] ? why_direct : NULL, false)) < 0)
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

int sl_disk_remove_unused(const char *path, bool *removed)
{
	char eb[128];
	*removed = false;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOENT)
			return 0;
		return sl_err(SL_EIO, "%s: cannot open (%s)", path, disk_errstr(errno, eb, sizeof eb));
	}
	int rc = 0;
	struct stat a, b;
	if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
		if (errno != EWOULDBLOCK)
			rc = sl_err(SL_EIO, "%s: cannot lock (%s)", path, disk_errstr(errno, eb, sizeof eb));
	} else if (fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
		/* still the file locked (not replaced meanwhile), held by no one */
		if (unlink(path) == 0)
			*removed = true;
		else
			rc = sl_err(SL_EIO, "%s: cannot remove (%s)", path, disk_errstr(errno, eb, sizeof eb));
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
		while (s->active_reqs > 0 && s->eng && !s->fatal)
			pthread_cond_wait(&s->done_cv, &s->mu);
		s->closing = true;
		pthread_mutex_unlock(&s->mu);
		if (s->eng)
			s->eng->stop(s);
		pthread_cond_destroy(&s->done_cv);
		pthread_mutex_destroy(&s->mu);
	}
	if (s->fd >= 0) /* now: the ring's reference to the file may outlive the close */
		flock(s->fd, LOCK_UN);
	if (s->eng)
		s->eng->release(s);
	if (s->fd >= 0)
		close(s->fd);
	free(s->req);
	free(s->evicted);
	free(s->dir);
	free(s->path);
	free(s->key);
	free(s);
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
		return sl_err(SL_EIO, "%s: fstat failed (%s)", s->path, disk_errstr(errno, eb, sizeof eb));
	if ((uint64_t)st.st_size < s->hdr_bytes + s->capacity)
		return sl_err(SL_EINVAL, "%s: not marked complete: the file holds %lld bytes but header + data are %llu; "
			      "write the whole data area first", s->path, (long long)st.st_size,
			      (unsigned long long)(s->hdr_bytes + s->capacity));
	if (fdatasync(s->fd) != 0) {
		int e = errno;
		s->write_failed = true;
		if (e == ENOSPC || e == EDQUOT)
			return sl_err(SL_EIO, "%s: disk full flushing the store (%s)", s->path, disk_errstr(e, eb, sizeof eb));
		return sl_err(SL_EIO, "%s: fdatasync failed (%s)", s->path, disk_errstr(e, eb, sizeof eb));
	}
	if (!s->direct)
		posix_fadvise(s->fd, 0, 0, POSIX_FADV_DONTNEED);
	return disk_header_write(s, true);
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
