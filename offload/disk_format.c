/*
 * disk_format.c - the disk store's on-disk header: its layout, writing it
 * (the "complete" flag with it), checking it at open, and sl_disk_peek.
 *
 * Layout (little-endian, SL_DISK_HEADER_BYTES in all): "SLUICEDS", the
 * format version, the header's size, the data area's size, the complete flag
 * ("COMP" or anything else), the key's length, the key at byte 64, and an
 * FNV-1a checksum of everything before it in the last 8 bytes.
 */
#include "disk_internal.h"
#include "sl_common.h"
#include "sl_hash.h"
#include "sl_le.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

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

void *disk_page_alloc(size_t n)
{
	_Static_assert(SL_DISK_ALIGN <= 4096, "sl_io_alloc aligns to 4 KiB");
	void *p = sl_io_alloc(n);
	if (p)
		memset(p, 0, n);
	return p;
}

/* Write the header and sync it; 0 or -errno (ENOSPC for a short write). */
int disk_header_pwrite(sl_disk_store *s, bool complete)
{
	unsigned char *h = disk_page_alloc(SL_DISK_HEADER_BYTES);
	if (!h)
		return -ENOMEM;
	size_t kl = strlen(s->key);
	memcpy(h, HDR_MAGIC, 8);
	sl_put_le32(h + HDR_OFF_VERSION, HDR_VERSION);
	sl_put_le32(h + HDR_OFF_HDRSIZE, SL_DISK_HEADER_BYTES);
	sl_put_le64(h + HDR_OFF_DATA, s->capacity);
	sl_put_le32(h + HDR_OFF_COMPLETE, complete ? HDR_COMPLETE : 0);
	sl_put_le32(h + HDR_OFF_KEYLEN, (uint32_t)kl);
	memcpy(h + HDR_OFF_KEY, s->key, kl);
	sl_put_le64(h + HDR_OFF_SUM, sl_fnv1a64(SL_FNV1A64_INIT, h, HDR_OFF_SUM));
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
int disk_header_error(sl_disk_store *s, int e)
{
	char eb[128];
	s->write_failed = true;
	if (e == ENOMEM)
		return sl_err(SL_ENOMEM, "%s: out of memory for the header", s->path);
	if (e == ENOSPC || e == EFBIG || e == EDQUOT)
		return sl_err(SL_EIO, "%s: disk full writing the header (%s)", s->path, disk_errstr(e, eb, sizeof eb));
	return sl_err(SL_EIO, "%s: cannot write the header (%s)", s->path, disk_errstr(e, eb, sizeof eb));
}

int disk_header_write(sl_disk_store *s, bool complete)
{
	int e = -disk_header_pwrite(s, complete);
	if (e)
		return disk_header_error(s, e);
	s->complete_on_disk = complete;
	return 0;
}

/*
 * Read and check the header of an existing file of size bytes.  *fresh is set
 * when the data must be (re)written.
 */
int disk_header_check(sl_disk_store *s, const unsigned char *h, uint64_t size, bool *fresh)
{
	if (memcmp(h, HDR_MAGIC, 8) != 0)
		return sl_err(SL_EFORMAT, "%s is not a sluice store (bad magic); remove it or use another --offload-dir",
			      s->path);
	if (sl_get_le64(h + HDR_OFF_SUM) != sl_fnv1a64(SL_FNV1A64_INIT, h, HDR_OFF_SUM))
		return sl_err(SL_EFORMAT, "%s: corrupt store header (checksum mismatch); remove it so that it is rewritten",
			      s->path);
	uint32_t ver = sl_get_le32(h + HDR_OFF_VERSION);
	if (ver != HDR_VERSION || sl_get_le32(h + HDR_OFF_HDRSIZE) != SL_DISK_HEADER_BYTES)
		return sl_err(SL_EFORMAT, "%s: store format version %u, this sluice reads version %u; remove it so that it is rewritten",
			      s->path, ver, HDR_VERSION);
	uint32_t kl = sl_get_le32(h + HDR_OFF_KEYLEN);
	if (kl > SL_DISK_MAX_KEY)
		return sl_err(SL_EFORMAT, "%s: corrupt store header (key of %u bytes)", s->path, kl);
	uint64_t data = sl_get_le64(h + HDR_OFF_DATA);
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
	bool complete = sl_get_le32(h + HDR_OFF_COMPLETE) == HDR_COMPLETE;
	if (complete && size < s->hdr_bytes + s->capacity)
		return sl_err(SL_EFORMAT, "%s is truncated: %llu bytes, but its header says %llu (header + data); "
			      "remove it so that it is rewritten",
			      s->path, (unsigned long long)size, (unsigned long long)(s->hdr_bytes + s->capacity));
	s->complete_on_disk = complete;
	*fresh = !complete;
	return 0;
}

int sl_disk_peek(const char *path, sl_disk_info *info)
{
	char eb[128];
	memset(info, 0, sizeof *info);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOENT)
			return sl_err(SL_ENOTFOUND, "%s: no such store", path);
		return sl_err(SL_EIO, "%s: cannot open (%s)", path, disk_errstr(errno, eb, sizeof eb));
	}
	struct stat st;
	unsigned char *h = disk_page_alloc(SL_DISK_HEADER_BYTES);
	int rc = 0;
	if (!h) {
		rc = sl_err(SL_ENOMEM, "%s: out of memory for the header", path);
		goto out;
	}
	if (fstat(fd, &st) != 0) {
		rc = sl_err(SL_EIO, "%s: fstat failed (%s)", path, disk_errstr(errno, eb, sizeof eb));
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
	if (sl_get_le64(h + HDR_OFF_SUM) != sl_fnv1a64(SL_FNV1A64_INIT, h, HDR_OFF_SUM)) {
		rc = sl_err(SL_EFORMAT, "%s: corrupt store header (checksum mismatch)", path);
		goto out;
	}
	uint32_t kl = sl_get_le32(h + HDR_OFF_KEYLEN);
	info->version = sl_get_le32(h + HDR_OFF_VERSION);
	if (kl > SL_DISK_MAX_KEY || sl_get_le32(h + HDR_OFF_HDRSIZE) != SL_DISK_HEADER_BYTES) {
		rc = sl_err(SL_EFORMAT, "%s: store format version %u, this sluice reads version %u", path,
			    info->version, HDR_VERSION);
		goto out;
	}
	memcpy(info->key, h + HDR_OFF_KEY, kl);
	info->key[kl] = 0;
	info->data_bytes = sl_get_le64(h + HDR_OFF_DATA);
	info->complete = sl_get_le32(h + HDR_OFF_COMPLETE) == HDR_COMPLETE &&
			 info->file_bytes >= SL_DISK_HEADER_BYTES + info->data_bytes;
out:
	free(h);
	close(fd);
	return rc;
}
