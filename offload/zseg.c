/*
 * zseg.c - zstd-compressed disk segments (zseg.h).
 */
#include "zseg.h"
#include "sl_common.h"
#include "sl_hash.h"
#include "sl_le.h"

#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#define TAB_MAGIC "SLZSTD01"
#define TAB_HEAD 40 /* magic, 4 x u32, 2 x u64 */
#define PAGE 4096u

static uint64_t pages(uint64_t n)
{
	return (n + PAGE - 1) / PAGE * PAGE;
}

static int range_frames(uint64_t len, uint32_t window)
{
	return (int)((len + window - 1) / window);
}

int sl_zseg_frames(uint64_t seg, uint64_t split, uint32_t window)
{
	return range_frames(split, window) + range_frames(seg - split, window);
}

void sl_zseg_frame(uint64_t seg, uint64_t split, uint32_t window, int f, uint64_t *off, size_t *len)
{
	const int na = range_frames(split, window);
	const uint64_t base = f < na ? 0 : split, end = f < na ? split : seg;
	const uint64_t o = base + (uint64_t)(f < na ? f : f - na) * window;
	*off = o;
	*len = (size_t)SL_MIN((uint64_t)window, end - o);
}

void sl_zseg_frames_in(const sl_zseg_table *t, uint64_t off, uint64_t len, int *f0, int *f1)
{
	*f0 = t->nframes;
	*f1 = 0;
	for (int f = 0; f < t->nframes; f++) {
		uint64_t o;
		size_t n;
		sl_zseg_frame(t->seg, t->split, t->window, f, &o, &n);
		if (o >= off && o + n <= off + len) {
			*f0 = SL_MIN(*f0, f);
			*f1 = f + 1;
		}
	}
	if (*f0 > *f1)
		*f0 = *f1;
}

size_t sl_zseg_table_bytes(int n_layer, int nframes)
{
	return (size_t)pages(TAB_HEAD + 4 * (uint64_t)n_layer * (uint64_t)nframes + 8);
}

double sl_zseg_table_ratio(const sl_zseg_table *t)
{
	if (!t->clen || !t->seg || !t->n_layer)
		return 0;
	double bytes = 0;
	for (int l = 0; l < t->n_layer; l++)
		for (int f = 0; f < t->nframes; f++) {
			uint64_t off;
			size_t n;
			sl_zseg_frame(t->seg, t->split, t->window, f, &off, &n);
			const uint32_t c = t->clen[(size_t)l * t->nframes + f];
			bytes += c ? (double)pages(c) : (double)n;
		}
	return SL_MIN(1.0, bytes / ((double)t->seg * t->n_layer));
}

int sl_zseg_table_init(sl_zseg_table *t, uint64_t seg, uint64_t split, uint32_t window, int n_layer,
		       int level)
{
	memset(t, 0, sizeof *t);
	if (!window || window % PAGE || split % PAGE || seg % PAGE || split > seg || n_layer < 1)
		return sl_err(SL_EINVAL, "zstd segments: window %u, segment %llu split at %llu, %d layers: "
			      "not a page-aligned layout", window, (unsigned long long)seg,
			      (unsigned long long)split, n_layer);
	t->window = window;
	t->nframes = sl_zseg_frames(seg, split, window);
	t->n_layer = n_layer;
	t->level = level;
	t->seg = seg;
	t->split = split;
	t->clen = calloc((size_t)n_layer * (size_t)(t->nframes ? t->nframes : 1), sizeof *t->clen);
	if (!t->clen)
		return sl_err(SL_ENOMEM, "out of memory for the zstd frame table");
	return 0;
}

void sl_zseg_table_free(sl_zseg_table *t)
{
	if (!t)
		return;
	free(t->clen);
	t->clen = NULL;
}

void sl_zseg_table_encode(const sl_zseg_table *t, void *buf)
{
	unsigned char *p = buf;
	memcpy(p, TAB_MAGIC, 8);
	sl_put_le32(p + 8, t->window);
	sl_put_le32(p + 12, (uint32_t)t->nframes);
	sl_put_le32(p + 16, (uint32_t)t->n_layer);
	sl_put_le32(p + 20, (uint32_t)t->level);
	sl_put_le64(p + 24, t->seg);
	sl_put_le64(p + 32, t->split);
	const size_t n = (size_t)t->n_layer * (size_t)t->nframes;
	for (size_t i = 0; i < n; i++)
		sl_put_le32(p + TAB_HEAD + 4 * i, t->clen[i]);
	sl_put_le64(p + TAB_HEAD + 4 * n, sl_fnv1a64(SL_FNV1A64_INIT, p, TAB_HEAD + 4 * n));
}

int sl_zseg_table_decode(const void *buf, size_t n, uint64_t seg, uint64_t split, int n_layer,
			 const char *what, sl_zseg_table *t)
{
	const unsigned char *p = buf;
	memset(t, 0, sizeof *t);
	if (n < TAB_HEAD + 8 || memcmp(p, TAB_MAGIC, 8))
		return sl_err(SL_EFORMAT, "%s: its zstd frame table is missing or corrupt (bad magic); "
			      "remove it so that it is rewritten", what);
	const uint32_t window = sl_get_le32(p + 8), nf = sl_get_le32(p + 12), nl = sl_get_le32(p + 16);
	const uint64_t s = sl_get_le64(p + 24), sp = sl_get_le64(p + 32);
	if (nl != (uint32_t)n_layer || s != seg || sp != split || !window || window % PAGE ||
	    nf != (uint32_t)sl_zseg_frames(seg, split, window))
		return sl_err(SL_EFORMAT, "%s: its zstd frame table describes another layout (%u layers of "
			      "%llu bytes split at %llu, %u frames of %u bytes; this model has %d of %llu split "
			      "at %llu); remove it so that it is rewritten", what, nl, (unsigned long long)s,
			      (unsigned long long)sp, nf, window, n_layer, (unsigned long long)seg,
			      (unsigned long long)split);
	const size_t cnt = (size_t)nl * nf;
	if (TAB_HEAD + 4 * cnt + 8 > n ||
	    sl_get_le64(p + TAB_HEAD + 4 * cnt) != sl_fnv1a64(SL_FNV1A64_INIT, p, TAB_HEAD + 4 * cnt))
		return sl_err(SL_EFORMAT, "%s: its zstd frame table is corrupt (checksum mismatch); remove it "
			      "so that it is rewritten", what);
	SL_TRY(sl_zseg_table_init(t, seg, split, window, n_layer, (int)sl_get_le32(p + 20)));
	for (size_t i = 0; i < cnt; i++) {
		t->clen[i] = sl_get_le32(p + TAB_HEAD + 4 * i);
		uint64_t o;
		size_t len;
		sl_zseg_frame(seg, split, window, (int)(i % nf), &o, &len);
		if (t->clen[i] > len) {
			sl_zseg_table_free(t);
			return sl_err(SL_EFORMAT, "%s: its zstd frame table is corrupt (layer %zu frame %zu of "
				      "%u bytes in a window of %zu)", what, i / nf, i % nf, sl_get_le32(p + TAB_HEAD + 4 * i),
				      len);
		}
	}
	return 0;
}

void sl_zseg_shuffle(const void *src, void *dst, size_t n)
{
	const unsigned char *in = src;
	unsigned char *out = dst;
	const size_t h = n / 2;
	for (size_t i = 0; i < h; i++) {
		out[i] = in[2 * i];
		out[h + i] = in[2 * i + 1];
	}
	if (n & 1)
		out[n - 1] = in[n - 1];
}

void sl_zseg_unshuffle(const void *src, void *dst, size_t n)
{
	const unsigned char *in = src;
	unsigned char *out = dst;
	const size_t h = n / 2;
	for (size_t i = 0; i < h; i++) {
		out[2 * i] = in[i];
		out[2 * i + 1] = in[h + i];
	}
	if (n & 1)
		out[n - 1] = in[n - 1];
}

size_t sl_zseg_bound(size_t window)
{
	return ZSTD_compressBound(window);
}

int sl_zseg_compress(void *ctx, int level, const void *src, size_t n, void *scratch, void *dst,
		     size_t dst_cap, size_t *clen)
{
	*clen = 0;
	if (n % 2)
		return sl_err(SL_EINVAL, "zstd segments: a window of %zu bytes (want an even size)", n);
	ZSTD_CCtx *c = ctx ? ctx : ZSTD_createCCtx();
	if (!c)
		return sl_err(SL_ENOMEM, "out of memory for a zstd context");
	sl_zseg_shuffle(src, scratch, n);
	size_t r = ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, level);
	if (!ZSTD_isError(r))
		r = ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 1);
	if (!ZSTD_isError(r))
		r = ZSTD_compress2(c, dst, dst_cap, scratch, n);
	if (!ctx)
		ZSTD_freeCCtx(c);
	if (ZSTD_isError(r))
		return sl_err(SL_EIO, "zstd compression of a %zu-byte window failed: %s", n, ZSTD_getErrorName(r));
	*clen = pages(r) < pages(n) ? r : 0;
	return 0;
}

int sl_zseg_decompress(void *ctx, const void *src, size_t clen, void *scratch, void *dst, size_t n,
		       const char *what, int layer, int frame)
{
	ZSTD_DCtx *d = ctx ? ctx : ZSTD_createDCtx();
	if (!d)
		return sl_err(SL_ENOMEM, "out of memory for a zstd context");
	const size_t r = ZSTD_decompressDCtx(d, scratch, n, src, clen);
	if (!ctx)
		ZSTD_freeDCtx(d);
	if (ZSTD_isError(r))
		return sl_err(SL_EFORMAT, "%s: layer %d, zstd frame %d is corrupt (%s); remove the store so that "
			      "it is rewritten", what, layer, frame, ZSTD_getErrorName(r));
	if (r != n)
		return sl_err(SL_EFORMAT, "%s: layer %d, zstd frame %d holds %zu bytes, want %zu; remove the store "
			      "so that it is rewritten", what, layer, frame, r, n);
	sl_zseg_unshuffle(scratch, dst, n);
	return 0;
}
