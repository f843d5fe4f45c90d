/*
 * test_zseg.c - zstd frames of a weight store's segments (offload/zseg.h).
 *
 * What a user of a zstd store relies on:
 *  - the frames tile each half's range of a segment exactly (no byte
 *    missed or read twice, none crossing the attention/MLP split), so a
 *    half's load reads only its own frames;
 *  - a window round-trips bit for bit (fp16 weights, incompressible noise
 *    stored raw, an odd last byte of the shuffle);
 *  - a frame changed on disk (one flipped byte, a truncated frame, another
 *    frame's bytes) is refused with a message naming the store, layer and
 *    frame, never decoded into other weights;
 *  - the table round-trips, and a changed one (a length, the layout, the
 *    magic) is refused naming the store.
 */
#include "sl_common.h"
#include "zseg.h"

#include "testutil.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

/* fp16 bit patterns of weights around 0 (sign, a few exponents, random
 * mantissas): compressible the way real weights are (the high bytes) */
static void fill_weights(unsigned char *p, size_t n, uint32_t seed)
{
	for (size_t i = 0; i + 1 < n; i += 2) {
		seed = seed * 1664525u + 1013904223u;
		const unsigned mant = (seed >> 8) & 0x3ff, exp = 9 + ((seed >> 20) & 3), sign = (seed >> 30) & 1;
		const unsigned h = sign << 15 | exp << 10 | mant;
		p[i] = (unsigned char)h;
		p[i + 1] = (unsigned char)(h >> 8);
	}
}

START_TEST(test_frames_tile_halves)
{
	const uint32_t window = 16384;
	const uint64_t cases[][2] = { { 40960, 12288 }, { 16384, 16384 }, { 65536, 0 }, { 4096, 4096 }, { 114688, 53248 } };
	for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
		const uint64_t seg = cases[c][0], split = cases[c][1];
		sl_zseg_table t;
		ck_assert_int_eq(sl_zseg_table_init(&t, seg, split, window, 2, 1), 0);
		uint64_t next = 0;
		for (int f = 0; f < t.nframes; f++) {
			uint64_t off;
			size_t len;
			sl_zseg_frame(seg, split, window, f, &off, &len);
			ck_assert_uint_eq(off, next); /* contiguous, in order */
			ck_assert(len > 0 && len <= window && len % 4096 == 0);
			ck_assert(off >= split || off + len <= split); /* never across the split */
			next = off + len;
		}
		ck_assert_uint_eq(next, seg);
		/* each half's frames, and the whole layer's, cover exactly its range */
		const uint64_t ranges[3][2] = { { 0, split }, { split, seg - split }, { 0, seg } };
		for (int r = 0; r < 3; r++) {
			int f0, f1;
			sl_zseg_frames_in(&t, ranges[r][0], ranges[r][1], &f0, &f1);
			uint64_t covered = 0;
			for (int f = f0; f < f1; f++) {
				uint64_t off;
				size_t len;
				sl_zseg_frame(seg, split, window, f, &off, &len);
				ck_assert(off >= ranges[r][0] && off + len <= ranges[r][0] + ranges[r][1]);
				covered += len;
			}
			ck_assert_uint_eq(covered, ranges[r][1]);
		}
		sl_zseg_table_free(&t);
	}
	sl_zseg_table t;
	ck_assert_int_eq(sl_zseg_table_init(&t, 40960, 12288, 5000, 2, 1), SL_EINVAL); /* window not in pages */
	ck_assert_int_eq(sl_zseg_table_init(&t, 40960, 45056, 16384, 2, 1), SL_EINVAL); /* split past the end */
}
END_TEST

START_TEST(test_round_trip)
{
	const size_t n = 65536;
	unsigned char *src = malloc(n), *back = malloc(n), *scr = malloc(n);
	const size_t cap = sl_zseg_bound(n);
	unsigned char *z = malloc(cap);
	size_t clen;
	/* weights: compressed, and smaller by at least a page */
	fill_weights(src, n, 7);
	ck_assert_int_eq(sl_zseg_compress(NULL, 1, src, n, scr, z, cap, &clen), 0);
	ck_assert(clen > 0 && clen + 4096 <= n);
	memset(back, 0xEE, n);
	ck_assert_int_eq(sl_zseg_decompress(NULL, z, clen, scr, back, n, "S", 0, 0), 0);
	ck_assert_mem_eq(back, src, n);
	/* noise: not worth a frame (stored raw) */
	for (size_t i = 0; i < n; i++)
		src[i] = (unsigned char)(rand() >> 7);
	ck_assert_int_eq(sl_zseg_compress(NULL, 1, src, n, scr, z, cap, &clen), 0);
	ck_assert_uint_eq(clen, 0);
	/* the shuffle's inverse, even and odd sizes */
	for (size_t m = 1; m < 10; m++) {
		unsigned char a[9] = { 1, 2, 3, 4, 5, 6, 7, 8, 9 }, s[9], u[9];
		sl_zseg_shuffle(a, s, m);
		sl_zseg_unshuffle(s, u, m);
		ck_assert_mem_eq(u, a, m);
		if (m >= 4)
			ck_assert(s[0] == 1 && s[1] == 3 && s[m / 2] == 2); /* the low bytes first */
	}
	ck_assert_int_eq(sl_zseg_compress(NULL, 1, src, 3, scr, z, cap, &clen), SL_EINVAL); /* odd window */
	free(src);
	free(back);
	free(scr);
	free(z);
}
END_TEST

START_TEST(test_corrupt_frame_refused)
{
	const size_t n = 65536;
	unsigned char *src = malloc(n), *back = malloc(n), *scr = malloc(n);
	const size_t cap = sl_zseg_bound(n);
	unsigned char *z = malloc(cap), *z2 = malloc(cap);
	size_t clen, clen2;
	fill_weights(src, n, 11);
	ck_assert_int_eq(sl_zseg_compress(NULL, 1, src, n, scr, z, cap, &clen), 0);
	ck_assert(clen > 0);
	/* one byte flipped anywhere in the frame */
	for (size_t at = 0; at < clen; at += clen / 7 + 1) {
		z[at] ^= 0x10;
		ck_assert_int_eq(sl_zseg_decompress(NULL, z, clen, scr, back, n, "/d/S", 3, 5), SL_EFORMAT);
		ck_assert_msg(strstr(sl_errmsg(), "/d/S: layer 3, zstd frame 5 ") != NULL, "%s", sl_errmsg());
		z[at] ^= 0x10;
	}
	/* truncated */
	ck_assert_int_eq(sl_zseg_decompress(NULL, z, clen - 9, scr, back, n, "S", 0, 1), SL_EFORMAT);
	/* another window's frame, of another size */
	memset(src, 0, n / 2);
	ck_assert_int_eq(sl_zseg_compress(NULL, 1, src, n / 2, scr, z2, cap, &clen2), 0);
	ck_assert(clen2 > 0);
	ck_assert_int_eq(sl_zseg_decompress(NULL, z2, clen2, scr, back, n, "S", 0, 2), SL_EFORMAT);
	ck_assert_msg(strstr(sl_errmsg(), "holds 32768 bytes, want 65536") != NULL, "%s", sl_errmsg());
	/* the intact frame still decodes */
	ck_assert_int_eq(sl_zseg_decompress(NULL, z, clen, scr, back, n, "S", 0, 0), 0);
	free(src);
	free(back);
	free(scr);
	free(z);
	free(z2);
}
END_TEST

START_TEST(test_table_round_trip_and_corruption)
{
	sl_zseg_table t, u;
	ck_assert_int_eq(sl_zseg_table_init(&t, 40960, 12288, 16384, 3, 2), 0);
	ck_assert_int_eq(t.nframes, 3); /* 12288 | 16384 + 12288 */
	for (int i = 0; i < 9; i++)
		t.clen[i] = i % 3 == 0 ? 0 : (uint32_t)(1000 + 37 * i);
	const size_t nb = sl_zseg_table_bytes(3, 3);
	ck_assert(nb % 4096 == 0 && nb >= 40 + 36 + 8);
	unsigned char *buf = calloc(1, nb);
	sl_zseg_table_encode(&t, buf);
	ck_assert_int_eq(sl_zseg_table_decode(buf, nb, 40960, 12288, 3, "S", &u), 0);
	ck_assert_int_eq(u.window, 16384);
	ck_assert_int_eq(u.level, 2);
	ck_assert_mem_eq(u.clen, t.clen, 9 * sizeof *t.clen);
	sl_zseg_table_free(&u);
	/* another layout than the reader's model */
	ck_assert_int_eq(sl_zseg_table_decode(buf, nb, 40960, 8192, 3, "/d/S", &u), SL_EFORMAT);
	ck_assert_msg(strstr(sl_errmsg(), "/d/S: its zstd frame table describes another layout") != NULL, "%s",
		      sl_errmsg());
	ck_assert_int_eq(sl_zseg_table_decode(buf, nb, 40960, 12288, 4, "S", &u), SL_EFORMAT);
	/* a length changed: the checksum */
	buf[44] ^= 1;
	ck_assert_int_eq(sl_zseg_table_decode(buf, nb, 40960, 12288, 3, "/d/S", &u), SL_EFORMAT);
	ck_assert_msg(strstr(sl_errmsg(), "/d/S: its zstd frame table is corrupt (checksum mismatch)") != NULL,
		      "%s", sl_errmsg());
	buf[44] ^= 1;
	buf[0] = 'X';
	ck_assert_int_eq(sl_zseg_table_decode(buf, nb, 40960, 12288, 3, "S", &u), SL_EFORMAT);
	ck_assert_msg(strstr(sl_errmsg(), "missing or corrupt (bad magic)") != NULL, "%s", sl_errmsg());
	ck_assert_int_eq(sl_zseg_table_decode(buf, 16, 40960, 12288, 3, "S", &u), SL_EFORMAT); /* short */
	free(buf);
	sl_zseg_table_free(&t);
}
END_TEST

static Suite *zseg_suite(void)
{
	Suite *s = suite_create("zseg");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, test_frames_tile_halves);
	tcase_add_test(tc, test_round_trip);
	tcase_add_test(tc, test_corrupt_frame_refused);
	tcase_add_test(tc, test_table_round_trip_and_corruption);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return sl_test_run(zseg_suite());
}
