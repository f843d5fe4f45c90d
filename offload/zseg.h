/*
 * zseg.h - zstd-compressed disk segments (sluice convert --zstd): the
 * frames a weight store's layer segments are cut into, their table, and
 * compressing and decompressing one frame.
 *
 * A layer's disk segment holds two ranges, [0, split) for the attention
 * half's tensors and [split, seg) for the MLP half's (both ends page
 * aligned: weights.c's layout).  Each range is cut into windows of at most
 * `window` bytes (a multiple of 4 KiB), and each window is stored as one
 * frame: its fp16 data byte-shuffled (every element's low byte, then every
 * high byte, so that the sign and exponent bytes sit together) and
 * zstd-compressed with a content checksum.  A frame stays at its window's
 * offset in the segment, so offsets are those of a plain store and a
 * frame's compressed bytes, rounded up to a page, are all a read moves.
 * A window that does not compress is stored as it is (clen 0 in the table).
 * So a half's read touches only its own frames, and the frames decompress
 * independently.
 *
 * The table follows the layers' segments in the data area: "SLZSTD01",
 * then little-endian u32 window, frames per layer, layers, level, u64
 * seg, split, then one u32 compressed length per frame (layer-major), then
 * an FNV-1a 64 of everything before it.
 *
 * Errors follow sl_common.h: 0 or a negative SL_E* code with a message.
 */
#ifndef SL_ZSEG_H
#define SL_ZSEG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct sl_zseg_table {
	uint32_t window;   /* the largest frame's raw bytes */
	int nframes;       /* frames per layer */
	int n_layer;
	int level;         /* the zstd level it was written at */
	uint64_t seg;      /* a layer's segment bytes */
	uint64_t split;    /* where the MLP half's range starts */
	uint32_t *clen;    /* n_layer x nframes; 0: stored raw */
} sl_zseg_table;

/* Frames per layer of a segment of seg bytes split at split. */
int sl_zseg_frames(uint64_t seg, uint64_t split, uint32_t window);
/* Frame f's range of the segment: [*off, *off + *len). */
void sl_zseg_frame(uint64_t seg, uint64_t split, uint32_t window, int f, uint64_t *off, size_t *len);
/* The frames [*f0, *f1) inside the segment range [off, off + len) (a half,
 * or the whole segment). */
void sl_zseg_frames_in(const sl_zseg_table *t, uint64_t off, uint64_t len, int *f0, int *f1);

/* The table's bytes on disk, rounded up to a page. */
size_t sl_zseg_table_bytes(int n_layer, int nframes);
/* A table for n_layer layers (its lengths zero); sl_zseg_table_free frees it. */
int sl_zseg_table_init(sl_zseg_table *t, uint64_t seg, uint64_t split, uint32_t window, int n_layer,
		       int level);
void sl_zseg_table_free(sl_zseg_table *t);
/* Every frame's bytes as a read moves them (a compressed one rounded up
 * to a page, a raw one whole) over the plain segments': in (0, 1]; 0 for
 * an empty table. */
double sl_zseg_table_ratio(const sl_zseg_table *t);
/* Encode into buf (sl_zseg_table_bytes, zeroed by the caller). */
void sl_zseg_table_encode(const sl_zseg_table *t, void *buf);
/* Decode and check the table in buf (n bytes) against the layout the
 * reader expects; what names the store in messages.  SL_EFORMAT for a
 * corrupt or foreign table. */
int sl_zseg_table_decode(const void *buf, size_t n, uint64_t seg, uint64_t split, int n_layer,
			 const char *what, sl_zseg_table *t);

/* 2-byte elements: the low bytes of n bytes, then the high bytes (an odd
 * last byte stays last). */
void sl_zseg_shuffle(const void *src, void *dst, size_t n);
void sl_zseg_unshuffle(const void *src, void *dst, size_t n);

/* The most bytes a compressed frame of a window may take, before rounding. */
size_t sl_zseg_bound(size_t window);

/*
 * Compress n bytes of src (n even) at level into dst (dst_cap >=
 * sl_zseg_bound(n)), using scratch (n bytes) for the shuffle.  *clen is
 * the frame's bytes, or 0 when the frame would not be smaller by at least
 * a page (then src is stored raw).  ctx: a ZSTD_CCtx, or NULL for one made
 * and freed here.
 */
int sl_zseg_compress(void *ctx, int level, const void *src, size_t n, void *scratch, void *dst,
		     size_t dst_cap, size_t *clen);

/*
 * Decompress a frame of clen bytes into dst (exactly n bytes), through
 * scratch (n bytes).  A frame that fails its checksum, decodes to another
 * size or is not a zstd frame is SL_EFORMAT, the message naming what and
 * the frame.  ctx: a ZSTD_DCtx or NULL.
 */
int sl_zseg_decompress(void *ctx, const void *src, size_t clen, void *scratch, void *dst, size_t n,
		       const char *what, int layer, int frame);

#endif
