/*
 * utf8.c - UTF-8 for the text layer: scanning one sequence (well-formed, or
 * the maximal subpart that one U+FFFD replaces), writing a code point, the
 * one repair of ill-formed text (decode, and every text sluice writes as
 * JSON), and the streaming stable length.  Declarations: text_internal.h,
 * tokenizer.h.
 */
#include "text_internal.h"

#include <string.h>

int sl_utf8_scan(const uint8_t *p, size_t n, uint32_t *cp, int *need)
{
	uint8_t b = p[0];
	if (b < 0x80) {
		*cp = b;
		*need = 1;
		return 1;
	}
	int len;
	uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
	uint32_t c;
	if (b >= 0xC2 && b <= 0xDF) {
		len = 2;
		c = b & 0x1F;
	} else if (b >= 0xE0 && b <= 0xEF) {
		len = 3;
		c = b & 0x0F;
		if (b == 0xE0)
			lo = 0xA0;
		else if (b == 0xED)
			hi = 0x9F;
	} else if (b >= 0xF0 && b <= 0xF4) {
		len = 4;
		c = b & 0x07;
		if (b == 0xF0)
			lo = 0x90;
		else if (b == 0xF4)
			hi = 0x8F;
	} else {
		*need = 0;
		return -1;
	}
	*need = len;
	for (int k = 1; k < len; k++) {
		if ((size_t)k >= n)
			return -k;
		uint8_t x = p[k];
		if (k == 1 ? (x < lo || x > hi) : (x < 0x80 || x > 0xBF))
			return -k;
		c = (c << 6) | (x & 0x3F);
	}
	*cp = c;
	return len;
}

size_t sl_utf8_put(uint32_t cp, char *out)
{
	if (cp < 0x80) {
		out[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		out[0] = (char)(0xC0 | (cp >> 6));
		out[1] = (char)(0x80 | (cp & 0x3F));
		return 2;
	}
	if (cp < 0x10000) {
		out[0] = (char)(0xE0 | (cp >> 12));
		out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
		out[2] = (char)(0x80 | (cp & 0x3F));
		return 3;
	}
	out[0] = (char)(0xF0 | (cp >> 18));
	out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
	out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
	out[3] = (char)(0x80 | (cp & 0x3F));
	return 4;
}

int sl_utf8_lossy(const char *in, size_t n, char **out, size_t *olen)
{
	const uint8_t *u = (const uint8_t *)in;
	size_t bad = 0;
	*out = NULL;
	*olen = n;
	for (size_t i = 0; i < n;) {
		if (u[i] < 0x80) {
			i++;
			continue;
		}
		uint32_t cp;
		int need, l = sl_utf8_scan(u + i, n - i, &cp, &need);
		if (l < 0) {
			bad++;
			l = -l;
		}
		i += (size_t)l;
	}
	if (bad == 0)
		return 0;
	char *o = malloc(n + 2 * bad + 1); /* a subpart is >= 1 byte, U+FFFD 3 */
	if (!o)
		return sl_err(SL_ENOMEM, "tokenizer: out of memory");
	size_t k = 0;
	for (size_t i = 0; i < n;) {
		uint32_t cp;
		int need, l = sl_utf8_scan(u + i, n - i, &cp, &need);
		if (l < 0) {
			memcpy(o + k, "\xEF\xBF\xBD", 3);
			k += 3;
			i += (size_t)-l;
		} else {
			memcpy(o + k, in + i, (size_t)l);
			k += (size_t)l;
			i += (size_t)l;
		}
	}
	o[k] = 0;
	*out = o;
	*olen = k;
	return 0;
}

int sl_tokenizer_utf8_repair(const char *in, size_t n, char **out, size_t *olen)
{
	SL_TRY(sl_utf8_lossy(in, n, out, olen));
	if (*out)
		return 0;
	if (!(*out = malloc(n + 1)))
		return sl_err(SL_ENOMEM, "out of memory");
	memcpy(*out, in, n);
	(*out)[n] = 0;
	return 0;
}

size_t sl_tokenizer_utf8_stable_len(const char *buf, size_t len)
{
	const uint8_t *p = (const uint8_t *)buf;
	/* Only the last three bytes can start an unfinished sequence. */
	size_t from = len > 3 ? len - 3 : 0;
	for (size_t i = from; i < len; i++) {
		if ((p[i] & 0xC0) == 0x80)
			continue;
		uint32_t cp;
		int need, r = sl_utf8_scan(p + i, len - i, &cp, &need);
		if (r < 0 && (size_t)-r == len - i && need > -r)
			return i;
	}
	return len;
}
