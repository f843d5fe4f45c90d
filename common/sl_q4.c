/*
 * sl_q4.c - the matrix forms of sl_q4.h's scalar definition
 */
#include "sl_q4.h"

#include <string.h>

void sl_q4_quantize_matrix(const sl_half *w, size_t rows, size_t cols, void *dst)
{
	size_t ng = sl_q4_groups(cols);
	uint8_t *codes = sl_q4_codes(dst);
	sl_half *meta = sl_q4_meta(dst, rows, cols);
	for (size_t r = 0; r < rows; r++) {
		for (size_t g = 0; g < ng; g++) {
			size_t c0 = g * SL_Q4_GROUP;
			int n = (int)(cols - c0 < SL_Q4_GROUP ? cols - c0 : SL_Q4_GROUP);
			size_t k = r * ng + g;
			sl_q4_quantize_group(w + r * cols + c0, n, codes + k * SL_Q4_CODE_BYTES,
					     &meta[2 * k], &meta[2 * k + 1]);
		}
	}
}

void sl_q4_dequantize_matrix(const void *src, size_t rows, size_t cols, float *out)
{
	size_t ng = sl_q4_groups(cols);
	const uint8_t *codes = (const uint8_t *)src;
	const sl_half *meta = (const sl_half *)(codes + rows * ng * SL_Q4_CODE_BYTES);
	for (size_t r = 0; r < rows; r++) {
		for (size_t c = 0; c < cols; c++) {
			size_t k = r * ng + c / SL_Q4_GROUP;
			unsigned q = sl_q4_code(codes + k * SL_Q4_CODE_BYTES, (int)(c % SL_Q4_GROUP));
			out[r * cols + c] = sl_q4_value(q, meta[2 * k], meta[2 * k + 1]);
		}
	}
}
