/*
 * sl_q4.h - 4-bit group-wise quantisation, the one exact definition
 *
 * Issue 14 fixes the scheme so that every kernel (CPU, CUDA) and the
 * independent numpy reference (tools/make_fixtures.py) can be held to the
 * same codes bit for bit.  This header is that definition, in scalar C; the
 * fast kernels live in kernels/ and are tested against it.
 *
 * A group is 64 consecutive elements (SL_Q4_GROUP).  Weights: along the
 * input dimension of Hugging Face's (out, in) layout, so one group is 64
 * consecutive columns of one row, the last group of a row zero-padded when
 * in % 64 != 0 (padding excluded from min and max, its codes 0).  KV cache:
 * along head_dim, per token and head.
 *
 * Per group, from the fp16 values as fp32:
 *   mn = min, mx = max
 *   mn16    = fp16(mn + 0.0f)                           (exact: mn is fp16)
 *             (a zero minimum is stored as +0: -0 and +0 compare equal, so
 *             which one a min reduction returns depends on the order it
 *             visits them; adding +0 makes the bits order-free, for SIMD
 *             and CUDA reductions and the numpy reference alike)
 *   scale16 = fp16(15 / (mx - mn)), the quotient in fp32, saturating at
 *             65504; when mx == mn, scale16 = 0 and every code is 0
 *   q       = clamp(rint((x - mn16) * scale16), 0, 15), fp32 arithmetic,
 *             round half to even; two codes per byte, the even element in
 *             the low nibble
 *   x'      = q / scale16 + mn16 in fp32 (mn16 when scale16 is 0)
 * Inputs are finite (a checkpoint with inf or NaN weights is refused where
 * it is read).
 *
 * The arithmetic is written as separate fp32 operations and must stay so:
 * a compiler that contracts (x - mn) * s or q / s + mn into an FMA changes
 * codes on ties.  C11 builds (-std=c11) do not contract; CUDA kernels must
 * use __fsub_rn / __fmul_rn (nvcc contracts by default).
 *
 * Storage of a (rows, cols) matrix, one buffer of sl_q4_bytes(rows, cols):
 *   codes  rows * G * 32 bytes, row-major, G = sl_q4_groups(cols) groups
 *          per row, group g of row r at (r * G + g) * 32
 *   meta   rows * G pairs {mn16, scale16} (sl_half[2]), right after the
 *          codes (4-byte aligned, since the codes are a multiple of 32)
 * 36 bytes per 64 elements: 4.5 bits per element.  Codes and metadata are
 * kept apart so that a kernel streams each contiguously.
 */
#ifndef SL_Q4_H
#define SL_Q4_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "sl_common.h"

#define SL_Q4_GROUP 64
#define SL_Q4_CODE_BYTES 32 /* per group */
#define SL_Q4_META_BYTES 4  /* per group: mn16, scale16 */
#define SL_Q4_HALF_MAX 0x7bffu /* 65504 */

static inline size_t sl_q4_groups(size_t cols)
{
	return (cols + SL_Q4_GROUP - 1) / SL_Q4_GROUP;
}

/* Bytes of a quantised (rows, cols) matrix: codes then metadata. */
static inline size_t sl_q4_bytes(size_t rows, size_t cols)
{
	return rows * sl_q4_groups(cols) * (SL_Q4_CODE_BYTES + SL_Q4_META_BYTES);
}

/* fp16 of a positive fp32, saturating at 65504 instead of going to inf. */
static inline sl_half sl_q4_half_sat(float f)
{
	if (!(f < 65520.0f)) /* also catches inf from a tiny mx - mn */
		return (sl_half)SL_Q4_HALF_MAX;
	return sl_float_to_half(f);
}

/* One group: n (1..64) fp16 values in, 32 code bytes (elements past n get
 * code 0) and the group's mn16 and scale16 out. */
static inline void sl_q4_quantize_group(const sl_half *x, int n, uint8_t codes[SL_Q4_CODE_BYTES],
					sl_half *mn16, sl_half *scale16)
{
	float mn = sl_half_to_float(x[0]), mx = mn;
	for (int i = 1; i < n; i++) {
		float v = sl_half_to_float(x[i]);
		mn = v < mn ? v : mn;
		mx = v > mx ? v : mx;
	}
	sl_half m16 = sl_float_to_half(mn + 0.0f); /* -0 -> +0 */
	sl_half s16 = 0;
	if (mx != mn) {
		float range = mx - mn;
		s16 = sl_q4_half_sat(15.0f / range);
	}
	*mn16 = m16;
	*scale16 = s16;
	float mf = sl_half_to_float(m16), sf = sl_half_to_float(s16);
	for (int i = 0; i < SL_Q4_CODE_BYTES; i++)
		codes[i] = 0;
	if (s16 == 0)
		return;
	for (int i = 0; i < n; i++) {
		float d = sl_half_to_float(x[i]) - mf;
		float t = d * sf;
		float q = rintf(t); /* the default rounding mode: half to even */
		q = q < 0.0f ? 0.0f : (q > 15.0f ? 15.0f : q);
		codes[i >> 1] |= (uint8_t)((unsigned)q << ((i & 1) * 4));
	}
}

/* Element i's code (0..15) of a group's code bytes. */
static inline unsigned sl_q4_code(const uint8_t *codes, int i)
{
	return (codes[i >> 1] >> ((i & 1) * 4)) & 0xfu;
}

/* The dequantised value of code q in a group with mn16, scale16. */
static inline float sl_q4_value(unsigned q, sl_half mn16, sl_half scale16)
{
	float mf = sl_half_to_float(mn16);
	if (scale16 == 0)
		return mf;
	float v = (float)q / sl_half_to_float(scale16);
	return v + mf;
}

/* The codes and the metadata of a quantised matrix's buffer. */
static inline uint8_t *sl_q4_codes(void *buf)
{
	return (uint8_t *)buf;
}
static inline sl_half *sl_q4_meta(void *buf, size_t rows, size_t cols)
{
	return (sl_half *)((uint8_t *)buf + rows * sl_q4_groups(cols) * SL_Q4_CODE_BYTES);
}

/* Quantises a row-major (rows, cols) fp16 matrix into dst (sl_q4_bytes). */
void sl_q4_quantize_matrix(const sl_half *w, size_t rows, size_t cols, void *dst);

/* The reference dequantisation of a whole matrix into fp32 (tests, and the
 * plain path that a fused kernel is held to). */
void sl_q4_dequantize_matrix(const void *src, size_t rows, size_t cols, float *out);

#endif
