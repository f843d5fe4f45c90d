/*
 * pretok.c - the pre-tokenizer regexes (GPT-2's, Llama 3's and Qwen2's,
 * tokenizer.h), written out by hand over UTF-8 with the classes of
 * uniclass.c; a byte outside well-formed UTF-8 is a character of class
 * "other".
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

static int sl_tok_lower(uint8_t c)
{
	return c >= 'A' && c <= 'Z' ? c + 32 : c;
}

/* Length of a contraction at p[0] == '\'' in any case ((?i:...)), or 0.
 * Case-insensitive is Unicode case folding: U+017F (long s) folds to 's',
 * the one non-ASCII character that folds to one of these letters. */
static size_t sl_tok_contraction_ci(const uint8_t *p, size_t n)
{
	if (n >= 3 && p[1] == 0xC5 && p[2] == 0xBF)
		return 3;
	int c1 = n >= 2 ? sl_tok_lower(p[1]) : 0, c2 = n >= 3 ? sl_tok_lower(p[2]) : 0;
	if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l'))
		return 3;
	return c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd' ? 2 : 0;
}

static bool sl_tok_crlf(uint8_t c)
{
	return c == '\r' || c == '\n';
}

/*
 * Llama 3's Split regex (Qwen2's with digits1: \p{N} instead of
 * \p{N}{1,3}), alternatives in order, first match wins:
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)   contractions, any case
 *   [^\r\n\p{L}\p{N}]?\p{L}+       letters, after at most one char that is
 *                                  neither CR/LF, letter nor number
 *   \p{N}{1,3}                     up to three digits (numbers)
 *    ?[^\s\p{L}\p{N}]+[\r\n]*      an optional space, a run of others,
 *                                  then any CR/LF run
 *   \s*[\r\n]+                     a space run up to its last CR/LF
 *   \s+(?!\S)                      a space run, less its last char when a
 *                                  non-space follows
 *   \s+                            (only reached for a 1-char run)
 */
size_t sl_tok_next_word_llama3(const uint8_t *p, size_t i, size_t e, bool digits1)
{
	size_t l, l2, m;
	int cls = sl_tok_class_at(p + i, e - i, &l);
	if (p[i] == '\'' && (m = sl_tok_contraction_ci(p + i, e - i)) > 0)
		return i + m;
	if (cls == SL_TOK_LETTER)
		return sl_tok_run(p, i + l, e, SL_TOK_LETTER);
	if (cls != SL_TOK_NUMBER && !sl_tok_crlf(p[i]) && i + l < e &&
	    sl_tok_class_at(p + i + l, e - i - l, &l2) == SL_TOK_LETTER)
		return sl_tok_run(p, i + l + l2, e, SL_TOK_LETTER);
	if (cls == SL_TOK_NUMBER) {
		size_t j = i + l;
		for (int k = 1; k < (digits1 ? 1 : 3) && j < e; k++) {
			if (sl_tok_class_at(p + j, e - j, &l2) != SL_TOK_NUMBER)
				break;
			j += l2;
		}
		return j;
	}
	size_t s = i, ls = l;
	int cs = cls;
	if (p[i] == ' ' && i + 1 < e &&
	    sl_tok_class_at(p + i + 1, e - i - 1, &l2) == SL_TOK_OTHER) {
		s = i + 1;
		ls = l2;
		cs = SL_TOK_OTHER;
	}
	if (cs == SL_TOK_OTHER) {
		size_t j = sl_tok_run(p, s + ls, e, SL_TOK_OTHER);
		while (j < e && sl_tok_crlf(p[j]))
			j++;
		return j;
	}
	/* a space run from i: up to its last CR/LF if it has one */
	size_t j = i, last = i, cnt = 0, crlf_end = 0;
	while (j < e) {
		size_t lj;
		if (sl_tok_class_at(p + j, e - j, &lj) != SL_TOK_SPACE)
			break;
		if (sl_tok_crlf(p[j]))
			crlf_end = j + 1;
		last = j;
		j += lj;
		cnt++;
	}
	if (crlf_end)
		return crlf_end;
	return j < e && cnt >= 2 ? last : j;
}
