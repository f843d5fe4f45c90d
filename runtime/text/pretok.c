/*
 * pretok.c - the GPT-2 pre-tokenizer regex (tokenizer.h), written out by
 * hand over UTF-8 with the classes of uniclass.c; a byte outside
 * well-formed UTF-8 is a character of class "other".
 */
#include "text_internal.h"

/* Length of a contraction ('s 't 're 've 'm 'll 'd) at p[0] == '\'', or 0. */
static size_t sl_tok_contraction(const uint8_t *p, size_t n)
{
	if (n >= 2 && (p[1] == 's' || p[1] == 't' || p[1] == 'm' || p[1] == 'd'))
		return 2;
	if (n >= 3 && ((p[1] == 'r' && p[2] == 'e') || (p[1] == 'v' && p[2] == 'e') ||
		       (p[1] == 'l' && p[2] == 'l')))
		return 3;
	return 0;
}

/* End of the run of class cls starting at i. */
static size_t sl_tok_run(const uint8_t *p, size_t i, size_t e, int cls)
{
	while (i < e) {
		size_t l;
		if (sl_tok_class_at(p + i, e - i, &l) != cls)
			break;
		i += l;
	}
	return i;
}

/*
 * The GPT-2 pre-tokenizer: the end of the word that starts at p[i], i < e,
 * e being the end of the text or of the piece before a special token.
 * Alternatives in regex order, first match wins:
 *   's|'t|'re|'ve|'m|'ll|'d      contractions, lower case only
 *   ' ?\p{L}+' ' ?\p{N}+'        an optional ASCII space, then a run of
 *   ' ?[^\s\p{L}\p{N}]+'         one class (the class of the next char)
 *   \s+(?!\S)                    a space run, less its last char when a
 *                                non-space follows
 *   \s+                          (only reached for a 1-char run)
 */
size_t sl_tok_next_word(const uint8_t *p, size_t i, size_t e)
{
	size_t l, m;
	int cls = sl_tok_class_at(p + i, e - i, &l);
	if (p[i] == '\'' && (m = sl_tok_contraction(p + i, e - i)) > 0)
		return i + m;
	if (cls != SL_TOK_SPACE)
		return sl_tok_run(p, i + l, e, cls);
	if (p[i] == ' ' && i + 1 < e) {
		size_t l2;
		int c2 = sl_tok_class_at(p + i + 1, e - i - 1, &l2);
		if (c2 != SL_TOK_SPACE)
			return sl_tok_run(p, i + 1 + l2, e, c2);
	}
	size_t j = i, last = i, cnt = 0;
	while (j < e) {
		size_t lj;
		if (sl_tok_class_at(p + j, e - j, &lj) != SL_TOK_SPACE)
			break;
		last = j;
		j += lj;
		cnt++;
	}
	return j < e && cnt >= 2 ? last : j;
}
