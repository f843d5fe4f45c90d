/*
 * test_q4.c - the 4-bit group-wise scheme of common/sl_q4.h (issue 14), on
 * cases worked by hand: codes, rounding of ties to even, the all-equal
 * group, the scale's saturation at 65504, the zero-padded last group (its
 * padding outside min and max), the sign of a zero minimum, the nibble
 * order and the matrix layout; and the error bound of any group, half a
 * step, (mx - mn) / 30.  Then the
 * matrix forms against tests/fixtures/q4-matrices.bin, which the numpy
 * implementation in tools/make_fixtures.py wrote from the text:
 * the same bytes (codes and metadata) and the same dequantised values, bit
 * for bit, on awkward shapes and forced edge cases.
 */
#include "sl_q4.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *fixture_path; /* argv[1]: tests/fixtures/q4-matrices.bin */

static sl_half h(float f)
{
	return sl_float_to_half(f);
}

static void quant(const float *v, int n, uint8_t codes[32], sl_half *mn, sl_half *sc)
{
	sl_half x[64];
	for (int i = 0; i < n; i++)
		x[i] = h(v[i]);
	sl_q4_quantize_group(x, n, codes, mn, sc);
}

START_TEST(codes_are_the_steps)
{
	/* 0..15: mn 0, scale 15 / 15 = 1, code = value, exact round trip */
	float v[16];
	for (int i = 0; i < 16; i++)
		v[i] = (float)(15 - i);
	uint8_t c[32];
	sl_half mn, sc;
	quant(v, 16, c, &mn, &sc);
	ck_assert_uint_eq(mn, h(0.0f));
	ck_assert_uint_eq(sc, h(1.0f));
	for (int i = 0; i < 16; i++) {
		ck_assert_uint_eq(sl_q4_code(c, i), (unsigned)(15 - i));
		ck_assert_float_eq(sl_q4_value(sl_q4_code(c, i), mn, sc), v[i]);
	}
	/* even element in the low nibble: elements 0, 1 = 15, 14 -> 0xef */
	ck_assert_uint_eq(c[0], 0xef);
	for (int i = 8; i < 32; i++) /* past n: zero */
		ck_assert_uint_eq(c[i], 0);
}
END_TEST

START_TEST(ties_round_to_even)
{
	/* mn 0, mx 30: scale 0.5.  1 -> 0.5 -> 0; 3 -> 1.5 -> 2; 5 -> 2.5 -> 2;
	 * 7 -> 3.5 -> 4; 9 -> 4.5 -> 4; 30 -> 15 */
	float v[] = { 0, 1, 3, 5, 7, 9, 30 };
	unsigned want[] = { 0, 0, 2, 2, 4, 4, 15 };
	uint8_t c[32];
	sl_half mn, sc;
	quant(v, 7, c, &mn, &sc);
	ck_assert_uint_eq(sc, h(0.5f));
	for (int i = 0; i < 7; i++)
		ck_assert_uint_eq(sl_q4_code(c, i), want[i]);
	/* dequantised: q / 0.5 + 0 */
	ck_assert_float_eq(sl_q4_value(2, mn, sc), 4.0f);
}
END_TEST

START_TEST(negative_offset)
{
	/* mn -1, mx 2: scale fp16(5) = 5; x = 0.5 -> 1.5 * 5 = 7.5 -> 8;
	 * x = -0.25 -> 0.75 * 5 = 3.75 -> 4; value of 8 = 8 / 5 - 1 = 0.6 */
	float v[] = { -1.0f, 2.0f, 0.5f, -0.25f };
	uint8_t c[32];
	sl_half mn, sc;
	quant(v, 4, c, &mn, &sc);
	ck_assert_uint_eq(mn, h(-1.0f));
	ck_assert_uint_eq(sc, h(5.0f));
	ck_assert_uint_eq(sl_q4_code(c, 0), 0);
	ck_assert_uint_eq(sl_q4_code(c, 1), 15);
	ck_assert_uint_eq(sl_q4_code(c, 2), 8);
	ck_assert_uint_eq(sl_q4_code(c, 3), 4);
	ck_assert_float_eq(sl_q4_value(8, mn, sc), 8.0f / 5.0f - 1.0f);
}
END_TEST

START_TEST(equal_values)
{
	float v[64];
	for (int i = 0; i < 64; i++)
		v[i] = -3.5f;
	uint8_t c[32];
	sl_half mn, sc;
	quant(v, 64, c, &mn, &sc);
	ck_assert_uint_eq(sc, 0);
	ck_assert_uint_eq(mn, h(-3.5f));
	for (int i = 0; i < 32; i++)
		ck_assert_uint_eq(c[i], 0);
	ck_assert_float_eq(sl_q4_value(0, mn, sc), -3.5f);
}
END_TEST

START_TEST(negative_zero_minimum)
{
	/* -0 first, then +0 and 1: min is zero and its stored sign +0 whatever
	 * order the zeros come in; codes 0, 0, 15 either way */
	float a[] = { -0.0f, 0.0f, 1.0f }, b[] = { 0.0f, -0.0f, 1.0f };
	float z[] = { -0.0f, -0.0f };
	uint8_t c[32];
	sl_half mn, sc;
	quant(a, 3, c, &mn, &sc);
	ck_assert_uint_eq(mn, 0x0000);
	ck_assert_uint_eq(c[0], 0x00);
	ck_assert_uint_eq(c[1], 0x0f);
	quant(b, 3, c, &mn, &sc);
	ck_assert_uint_eq(mn, 0x0000);
	ck_assert_uint_eq(sl_q4_code(c, 2), 15);
	quant(z, 2, c, &mn, &sc); /* an all -0 group: equal, stored as +0 */
	ck_assert_uint_eq(mn, 0x0000);
	ck_assert_uint_eq(sc, 0);
}
END_TEST

START_TEST(scale_saturates)
{
	/* mx - mn = 2^-14 (the smallest normal half): 15 * 2^14 = 245760, past
	 * fp16's 65504, so scale16 = 65504 and x = 2^-14 codes
	 * rint(2^-14 * 65504) = rint(3.998) = 4 */
	float tiny = ldexpf(1.0f, -14);
	float v[] = { 0.0f, tiny };
	uint8_t c[32];
	sl_half mn, sc;
	quant(v, 2, c, &mn, &sc);
	ck_assert_uint_eq(sc, 0x7bff);
	ck_assert_uint_eq(sl_q4_code(c, 1), 4);
	/* a quotient that is inf in fp32 saturates too */
	ck_assert_uint_eq(sl_q4_half_sat(INFINITY), 0x7bff);
	ck_assert_uint_eq(sl_q4_half_sat(65519.0f), h(65504.0f));
}
END_TEST

START_TEST(padded_last_group)
{
	/* a (2, 70) matrix of values in [10, 40]: the last group of each row
	 * has 6 elements; padding zeros would pull min to 0 if counted */
	enum { R = 2, C = 70 };
	sl_half w[R * C];
	for (int r = 0; r < R; r++)
		for (int c = 0; c < C; c++)
			w[r * C + c] = h(10.0f + (float)((c * 7 + r) % 31));
	ck_assert_uint_eq(sl_q4_groups(C), 2);
	ck_assert_uint_eq(sl_q4_bytes(R, C), R * 2 * 36);
	uint8_t buf[R * 2 * 36];
	memset(buf, 0xaa, sizeof buf);
	sl_q4_quantize_matrix(w, R, C, buf);
	sl_half *meta = sl_q4_meta(buf, R, C);
	ck_assert_ptr_eq(meta, (sl_half *)(buf + R * 2 * 32));
	for (int r = 0; r < R; r++) {
		/* group 1 of row r: columns 64..69 */
		float mn = INFINITY, mx = -INFINITY;
		for (int c = 64; c < C; c++) {
			float x = sl_half_to_float(w[r * C + c]);
			mn = fminf(mn, x);
			mx = fmaxf(mx, x);
		}
		size_t k = (size_t)r * 2 + 1;
		ck_assert_float_eq(sl_half_to_float(meta[2 * k]), mn);
		ck_assert_uint_eq(meta[2 * k + 1], sl_q4_half_sat(15.0f / (mx - mn)));
		const uint8_t *codes = buf + k * 32;
		for (int i = 6; i < 64; i++)
			ck_assert_uint_eq(sl_q4_code(codes, i), 0);
	}
	float out[R * C];
	sl_q4_dequantize_matrix(buf, R, C, out);
	for (int i = 0; i < R * C; i++)
		ck_assert(fabsf(out[i] - sl_half_to_float(w[i])) <= 30.0f / 30.0f + 1e-3f);
}
END_TEST

START_TEST(error_is_half_a_step)
{
	unsigned s = 12345;
	for (int t = 0; t < 2000; t++) {
		sl_half x[64];
		float mn = INFINITY, mx = -INFINITY;
		float spread = ldexpf(1.0f, (int)(t % 20) - 10);
		for (int i = 0; i < 64; i++) {
			s = s * 1103515245u + 12345u;
			x[i] = h(spread * ((float)(s >> 8) / 16777216.0f - 0.3f));
			float f = sl_half_to_float(x[i]);
			mn = fminf(mn, f);
			mx = fmaxf(mx, f);
		}
		uint8_t c[32];
		sl_half m16, s16;
		sl_q4_quantize_group(x, 64, c, &m16, &s16);
		float step = (mx - mn) / 15.0f;
		for (int i = 0; i < 64; i++) {
			float back = sl_q4_value(sl_q4_code(c, i), m16, s16);
			/* half a step, plus the fp16 rounding of the scale (2^-11
			 * relative, times 15 steps) */
			ck_assert(fabsf(back - sl_half_to_float(x[i])) <= step * (0.5f + 15.0f / 1024.0f) + 1e-7f);
		}
	}
}
END_TEST

static uint32_t rd_u32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

START_TEST(matches_numpy_reference)
{
	FILE *f = fopen(fixture_path, "rb");
	ck_assert_msg(f != NULL, "cannot open %s", fixture_path);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	ck_assert_int_gt(n, 12);
	uint8_t *buf = malloc((size_t)n);
	ck_assert_uint_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	ck_assert_msg(memcmp(buf, "SLQ4FIX1", 8) == 0, "%s: not a q4 fixture", fixture_path);
	uint32_t ncases = rd_u32(buf + 8);
	ck_assert_uint_ge(ncases, 5);
	size_t off = 12;
	unsigned ties_seen = 0, equal_seen = 0, saturated_seen = 0, padded_seen = 0;
	for (uint32_t c = 0; c < ncases; c++) {
		ck_assert_uint_le(off + 24, (size_t)n);
		char name[17];
		memcpy(name, buf + off, 16);
		name[16] = 0;
		size_t rows = rd_u32(buf + off + 16), cols = rd_u32(buf + off + 20);
		off += 24;
		size_t nq = sl_q4_bytes(rows, cols);
		ck_assert_uint_le(off + rows * cols * 6 + nq, (size_t)n);
		/* the fixture is little-endian; so are the machines sluice builds for */
		sl_half *w = malloc(rows * cols * sizeof *w);
		memcpy(w, buf + off, rows * cols * 2);
		const uint8_t *want_q = buf + off + rows * cols * 2;
		float *want_v = malloc(rows * cols * sizeof *want_v);
		memcpy(want_v, want_q + nq, rows * cols * 4);
		off += rows * cols * 6 + nq;

		uint8_t *q = malloc(nq);
		memset(q, 0x5a, nq);
		sl_q4_quantize_matrix(w, rows, cols, q);
		for (size_t i = 0; i < nq; i++)
			ck_assert_msg(q[i] == want_q[i], "%s (%zux%zu): byte %zu of %zu: C %02x, numpy %02x",
				      name, rows, cols, i, nq, q[i], want_q[i]);
		/* dequantise numpy's buffer: the same values, bit for bit */
		float *v = malloc(rows * cols * sizeof *v);
		sl_q4_dequantize_matrix(want_q, rows, cols, v);
		for (size_t i = 0; i < rows * cols; i++) {
			uint32_t a, b;
			memcpy(&a, &v[i], 4);
			memcpy(&b, &want_v[i], 4);
			ck_assert_msg(a == b, "%s: element (%zu, %zu): C %a, numpy %a", name,
				      i / cols, i % cols, (double)v[i], (double)want_v[i]);
		}
		/* what the fixture covers, so that a regenerated one that lost
		 * its edge cases fails here */
		size_t ng = sl_q4_groups(cols);
		const sl_half *meta = sl_q4_meta(q, rows, cols);
		for (size_t k = 0; k < rows * ng; k++) {
			equal_seen += meta[2 * k + 1] == 0;
			saturated_seen += meta[2 * k + 1] == SL_Q4_HALF_MAX;
			float mf = sl_half_to_float(meta[2 * k]), sf = sl_half_to_float(meta[2 * k + 1]);
			size_t r = k / ng, c0 = (k % ng) * SL_Q4_GROUP;
			for (size_t j = c0; j < cols && j < c0 + SL_Q4_GROUP; j++) {
				float t = (sl_half_to_float(w[r * cols + j]) - mf) * sf;
				ties_seen += fabsf(t - truncf(t)) == 0.5f;
			}
		}
		padded_seen += cols % SL_Q4_GROUP != 0;
		free(v);
		free(q);
		free(want_v);
		free(w);
	}
	ck_assert_uint_eq(off, (size_t)n);
	ck_assert_uint_ge(ties_seen, 50);
	ck_assert_uint_ge(equal_seen, 5);
	ck_assert_uint_ge(saturated_seen, 3);
	ck_assert_uint_ge(padded_seen, 3);
	free(buf);
}
END_TEST

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s tests/fixtures/q4-matrices.bin\n", argv[0]);
		return 2;
	}
	fixture_path = argv[1];
	Suite *s = suite_create("q4");
	TCase *tc = tcase_create("scheme");
	tcase_add_test(tc, codes_are_the_steps);
	tcase_add_test(tc, ties_round_to_even);
	tcase_add_test(tc, negative_offset);
	tcase_add_test(tc, equal_values);
	tcase_add_test(tc, negative_zero_minimum);
	tcase_add_test(tc, scale_saturates);
	tcase_add_test(tc, padded_last_group);
	tcase_add_test(tc, error_is_half_a_step);
	tcase_add_test(tc, matches_numpy_reference);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
