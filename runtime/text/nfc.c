/*
 * nfc.c - Unicode NFC normalization, the NFC normalizer of Qwen2's
 * tokenizer.json: canonical decomposition (Hangul syllables by the
 * algorithm, the rest from nfc_tables.h, applied recursively), canonical
 * ordering of combining marks, then canonical composition (UAX #15), over
 * the Unicode 16.0 data HF's normalizer (Rust unicode-normalization) uses.
 */
#include "text_internal.h"
#include "nfc_tables.h"

#include <string.h>
#include <sys/types.h>

enum { SL_NFC_SBASE = 0xAC00, SL_NFC_LBASE = 0x1100, SL_NFC_VBASE = 0x1161,
       SL_NFC_TBASE = 0x11A7, SL_NFC_LCOUNT = 19, SL_NFC_VCOUNT = 21, SL_NFC_TCOUNT = 28,
       SL_NFC_NCOUNT = SL_NFC_VCOUNT * SL_NFC_TCOUNT,
       SL_NFC_SCOUNT = SL_NFC_LCOUNT * SL_NFC_NCOUNT };

static int sl_nfc_ccc_of(uint32_t cp)
{
	if (cp < 0x300)
		return 0;
	size_t lo = 0, hi = SL_ARRAY_LEN(sl_nfc_ccc);
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (cp < sl_nfc_ccc[mid].lo)
			hi = mid;
		else if (cp > sl_nfc_ccc[mid].hi)
			lo = mid + 1;
		else
			return sl_nfc_ccc[mid].ccc;
	}
	return 0;
}

/* The one-level canonical decomposition of cp, or -1. */
static ssize_t sl_nfc_decomp_at(uint32_t cp)
{
	size_t lo = 0, hi = SL_ARRAY_LEN(sl_nfc_decomp);
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (sl_nfc_decomp[mid].cp == cp)
			return (ssize_t)mid;
		if (sl_nfc_decomp[mid].cp < cp)
			lo = mid + 1;
		else
			hi = mid;
	}
	return -1;
}

/* The primary composite of a and b, or 0. */
static uint32_t sl_nfc_compose(uint32_t a, uint32_t b)
{
	if (a >= SL_NFC_LBASE && a < SL_NFC_LBASE + SL_NFC_LCOUNT && b >= SL_NFC_VBASE &&
	    b < SL_NFC_VBASE + SL_NFC_VCOUNT)
		return SL_NFC_SBASE + ((a - SL_NFC_LBASE) * SL_NFC_VCOUNT + (b - SL_NFC_VBASE)) *
			SL_NFC_TCOUNT;
	if (a >= SL_NFC_SBASE && a < SL_NFC_SBASE + SL_NFC_SCOUNT &&
	    (a - SL_NFC_SBASE) % SL_NFC_TCOUNT == 0 && b > SL_NFC_TBASE &&
	    b < SL_NFC_TBASE + SL_NFC_TCOUNT)
		return a + (b - SL_NFC_TBASE);
	size_t lo = 0, hi = SL_ARRAY_LEN(sl_nfc_comp);
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		uint32_t ma = sl_nfc_comp[mid].a, mb = sl_nfc_comp[mid].b;
		if (ma == a && mb == b)
			return sl_nfc_comp[mid].c;
		if (ma < a || (ma == a && mb < b))
			lo = mid + 1;
		else
			hi = mid;
	}
	return 0;
}

struct sl_nfc_buf {
	uint32_t *cp;
	size_t n, cap;
};

static int sl_nfc_push(struct sl_nfc_buf *b, uint32_t cp)
{
	if (b->n == b->cap)
		SL_TRY(sl_tok_grow((void **)&b->cp, &b->cap, b->cap * 2 + 64, sizeof *b->cp));
	b->cp[b->n++] = cp;
	return 0;
}

/* The full canonical decomposition of cp, appended. */
static int sl_nfc_decompose(struct sl_nfc_buf *b, uint32_t cp)
{
	if (cp >= SL_NFC_SBASE && cp < SL_NFC_SBASE + SL_NFC_SCOUNT) {
		uint32_t s = cp - SL_NFC_SBASE;
		SL_TRY(sl_nfc_push(b, SL_NFC_LBASE + s / SL_NFC_NCOUNT));
		SL_TRY(sl_nfc_push(b, SL_NFC_VBASE + (s % SL_NFC_NCOUNT) / SL_NFC_TCOUNT));
		if (s % SL_NFC_TCOUNT)
			SL_TRY(sl_nfc_push(b, SL_NFC_TBASE + s % SL_NFC_TCOUNT));
		return 0;
	}
	ssize_t k = cp < 0xC0 ? -1 : sl_nfc_decomp_at(cp);
	if (k < 0)
		return sl_nfc_push(b, cp);
	SL_TRY(sl_nfc_decompose(b, sl_nfc_decomp[k].a));
	return sl_nfc_decomp[k].b ? sl_nfc_decompose(b, sl_nfc_decomp[k].b) : 0;
}

/*
 * NFC of the n bytes of well-formed UTF-8 at p.  *out is a malloc'd copy
 * (*olen bytes), or NULL when the text is NFC already as far as a cheap
 * look tells (every character below U+0300, which NFC never changes).
 */
int sl_tok_nfc(const uint8_t *p, size_t n, char **out, size_t *olen)
{
	*out = NULL;
	*olen = 0;
	size_t i = 0;
	while (i < n && p[i] < 0xCC) /* lead bytes of U+0300 and above */
		i++;
	if (i == n)
		return 0;
	struct sl_nfc_buf b = { 0 };
	int rc = 0;
	for (i = 0; rc == 0 && i < n;) {
		uint32_t cp;
		int need, l = sl_utf8_scan(p + i, n - i, &cp, &need);
		if (l < 0) /* not reached on checked text; kept as U+FFFD */
			cp = 0xFFFD, l = -l;
		rc = sl_nfc_decompose(&b, cp);
		i += (size_t)l;
	}
	/* canonical ordering: a stable insertion sort of each run of marks */
	for (size_t k = 1; rc == 0 && k < b.n; k++) {
		int c = sl_nfc_ccc_of(b.cp[k]);
		if (c == 0)
			continue;
		size_t j = k;
		uint32_t v = b.cp[k];
		while (j > 0 && sl_nfc_ccc_of(b.cp[j - 1]) > c) {
			b.cp[j] = b.cp[j - 1];
			j--;
		}
		b.cp[j] = v;
	}
	/* composition: each char with the last starter unless blocked (a
	 * char between them of class 0 or >= its own) */
	size_t m = 0, starter = SIZE_MAX;
	int last_cc = 0;
	for (size_t k = 0; rc == 0 && k < b.n; k++) {
		uint32_t c = b.cp[k];
		int cc = sl_nfc_ccc_of(c);
		if (starter != SIZE_MAX) {
			bool adjacent = m - 1 == starter;
			if (adjacent || (last_cc != 0 && last_cc < cc)) {
				uint32_t pc = sl_nfc_compose(b.cp[starter], c);
				if (pc) {
					b.cp[starter] = pc;
					continue;
				}
			}
		}
		if (cc == 0)
			starter = m;
		b.cp[m++] = c;
		last_cc = cc;
	}
	if (rc == 0) {
		char *o = malloc(4 * m + 1);
		if (!o) {
			rc = sl_err(SL_ENOMEM, "tokenizer: out of memory");
		} else {
			size_t ol = 0;
			for (size_t k = 0; k < m; k++)
				ol += sl_utf8_put(b.cp[k], o + ol);
			o[ol] = 0;
			*out = o;
			*olen = ol;
		}
	}
	free(b.cp);
	return rc;
}
