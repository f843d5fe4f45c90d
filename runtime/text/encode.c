/*
 * encode.c - text to ids: special tokens split out first (leftmost,
 * longest at a tie), each piece between them cut by the pre-tokenizer
 * (pretok.c) and each word merged by BPE (bpe.c); and the same walk
 * recording only where the pieces end (sl_tokenizer_pretokenize).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem */
#endif
#include "text_internal.h"

#include <string.h>

static int sl_tok_push_end(struct sl_tok_work *w, size_t end)
{
	if (w->nends == w->ends_cap) {
		size_t nc = w->ends_cap ? 2 * w->ends_cap : 64;
		size_t *ne = realloc(w->ends, nc * sizeof *ne);
		if (!ne)
			return sl_err(SL_ENOMEM, "tokenizer: out of memory");
		w->ends = ne;
		w->ends_cap = nc;
	}
	w->ends[w->nends++] = end;
	return 0;
}

/* Split out special tokens, pre-tokenize the rest, then BPE each word, or
 * with w->pieces_only record where each piece ends instead. */
static int sl_tok_process(const sl_tokenizer *t, const uint8_t *p, size_t len,
			  unsigned flags, struct sl_tok_work *w)
{
	/* Specials: leftmost match, longest at a tie.  next[s] caches where
	 * special s occurs next (len + 1: nowhere further). */
	size_t next[SL_TOK_NSPECIAL];
	bool split = !(flags & SL_TOKENIZER_NO_SPECIAL);
	for (int s = 0; s < SL_TOK_NSPECIAL; s++) {
		const uint8_t *q = NULL;
		if (split && t->special_id[s] >= 0 && len > 0)
			q = memmem(p, len, sl_tok_special_text[s], t->special_len[s]);
		next[s] = q ? (size_t)(q - p) : len + 1;
	}
	size_t pos = 0;
	while (pos < len) {
		size_t best = len, best_len = 0;
		int best_s = -1;
		for (int s = 0; s < SL_TOK_NSPECIAL; s++) {
			if (next[s] < pos) {
				const uint8_t *q = memmem(p + pos, len - pos, sl_tok_special_text[s],
							  t->special_len[s]);
				next[s] = q ? (size_t)(q - p) : len + 1;
			}
			if (next[s] < best || (next[s] == best && best_s >= 0 &&
					       t->special_len[s] > best_len)) {
				best = next[s];
				best_len = t->special_len[s];
				best_s = s;
			}
		}
		/* Each piece between specials is a whole text to the regex. */
		while (pos < best) {
			size_t j = pos + sl_tok_next_word(p + pos, 0, best - pos);
			if (w->pieces_only)
				SL_TRY(sl_tok_push_end(w, j));
			else
				SL_TRY(sl_tok_bpe(t, w, p + pos, j - pos));
			pos = j;
		}
		if (best_s >= 0) {
			if (w->pieces_only)
				SL_TRY(sl_tok_push_end(w, best + best_len));
			else
				SL_TRY(sl_tok_push_id(w, t->special_id[best_s]));
		}
		pos = best + best_len;
	}
	return 0;
}

int sl_tokenizer_encode_ex(const sl_tokenizer *t, const char *text, size_t len,
			   unsigned flags, int32_t **ids, size_t *n)
{
	if (!t || (!text && len) || !ids || !n)
		return sl_err(SL_EINVAL, "sl_tokenizer_encode: NULL argument");
	*ids = NULL;
	*n = 0;
	struct sl_tok_work w = { 0 };
	w.cap = len / 4 + 16; /* English runs about 0.25 ids a byte; grows */
	w.ids = malloc(w.cap * sizeof *w.ids);
	if (!w.ids)
		return sl_err(SL_ENOMEM, "tokenizer: out of memory");
	int rc = 0;
	char *fixed = NULL;
	if (flags & SL_TOKENIZER_REPLACE_INVALID) {
		rc = sl_utf8_lossy(text, len, &fixed, &len);
		if (fixed)
			text = fixed;
	}
	if (rc == 0 && (flags & SL_TOKENIZER_ADD_BOS) && sl_tokenizer_bos_id(t) >= 0)
		rc = sl_tok_push_id(&w, sl_tokenizer_bos_id(t));
	if (rc == 0)
		rc = sl_tok_process(t, (const uint8_t *)text, len, flags, &w);
	free(fixed);
	free(w.sym);
	free(w.heap);
	if (rc < 0) {
		free(w.ids);
		return rc;
	}
	*ids = w.ids;
	*n = w.n;
	return 0;
}

int sl_tokenizer_pretokenize(const sl_tokenizer *t, const char *text, size_t len,
			     unsigned flags, size_t **ends, size_t *n)
{
	if (!t || (!text && len) || !ends || !n)
		return sl_err(SL_EINVAL, "sl_tokenizer_pretokenize: NULL argument");
	*ends = NULL;
	*n = 0;
	struct sl_tok_work w = { .pieces_only = true, .ends_cap = 64 };
	w.ends = malloc(w.ends_cap * sizeof *w.ends);
	if (!w.ends)
		return sl_err(SL_ENOMEM, "tokenizer: out of memory");
	int rc = sl_tok_process(t, (const uint8_t *)text, len, flags, &w);
	if (rc < 0) {
		free(w.ends);
		return rc;
	}
	*ends = w.ends;
	*n = w.nends;
	return 0;
}

int sl_tokenizer_encode(const sl_tokenizer *t, const char *text, size_t len,
			int32_t **ids, size_t *n)
{
	return sl_tokenizer_encode_ex(t, text, len, 0, ids, n);
}
