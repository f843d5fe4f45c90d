/*
 * encode.c - text to ids: added (special) tokens split out first
 * (leftmost, longest at a tie), each piece between them cut by the
 * pre-tokenizer (pretok.c), or for SentencePiece-style tokenizers given
 * its "▁" marks, and each word merged by BPE (bpe.c); and the same walk
 * recording only where the pieces end (sl_tokenizer_pretokenize).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem */
#endif
#include "text_internal.h"

#include <string.h>
#include <sys/types.h>

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

#define SL_TOK_MARK "\xe2\x96\x81" /* U+2581, SentencePiece's space */

/* What takes the text between added tokens of one pass. */
typedef int (*sl_tok_between_fn)(const sl_tokenizer *t, struct sl_tok_work *w,
				 const uint8_t *p, size_t pos, size_t end);

/*
 * Split p[pos, end) by the added tokens of one pass, leftmost match,
 * longest at a tie: HF's first pass takes the tokens not "normalized" on
 * the text as given, the second the normalized ones on each piece left
 * after the normalizer.  between() gets the text around them; a token
 * gives its id (or with w->pieces_only where it ends).  next[s] caches
 * where token s occurs next (end + 1: nowhere further).
 */
static int sl_tok_split(const sl_tokenizer *t, struct sl_tok_work *w, const uint8_t *p,
			size_t pos, size_t end, bool normalized, unsigned flags,
			sl_tok_between_fn between)
{
	size_t na = flags & SL_TOKENIZER_NO_SPECIAL ? 0 : t->n_added;
	if (t->n_added_norm == (normalized ? 0 : t->n_added)) /* none in this pass */
		na = 0;
	if (na == 0)
		return pos < end ? between(t, w, p, pos, end) : 0;
	size_t *next = malloc((na + 1) * sizeof *next);
	if (!next)
		return sl_err(SL_ENOMEM, "tokenizer: out of memory");
	for (size_t s = 0; s < na; s++) {
		const uint8_t *q = NULL;
		if (end > pos && t->added[s].normalized == normalized)
			q = memmem(p + pos, end - pos, t->added[s].text, t->added[s].len);
		next[s] = q ? (size_t)(q - p) : end + 1;
	}
	int rc = 0;
	while (rc == 0 && pos < end) {
		size_t best = end, best_len = 0;
		ssize_t best_s = -1;
		for (size_t s = 0; s < na; s++) {
			if (next[s] < pos) {
				const uint8_t *q = memmem(p + pos, end - pos, t->added[s].text,
							  t->added[s].len);
				next[s] = q ? (size_t)(q - p) : end + 1;
			}
			if (next[s] < best || (next[s] == best && best_s >= 0 &&
					       t->added[s].len > best_len)) {
				best = next[s];
				best_len = t->added[s].len;
				best_s = (ssize_t)s;
			}
		}
		if (pos < best)
			rc = between(t, w, p, pos, best);
		if (rc == 0 && best_s >= 0)
			rc = w->pieces_only ? sl_tok_push_end(w, best + best_len) :
				sl_tok_push_id(w, t->added[best_s].id);
		pos = best + best_len;
	}
	free(next);
	return rc;
}

/* p[pos, end) with spaces as "▁" and, with lead, one "▁" in front, into
 * w->mark; returns its length. */
static int sl_tok_mark(struct sl_tok_work *w, const uint8_t *p, size_t pos, size_t end,
		       bool lead, size_t *len)
{
	size_t o = 0;
	SL_TRY(sl_tok_grow((void **)&w->mark, &w->mark_cap, 3 * (end - pos) + 3, 1));
	if (lead) {
		memcpy(w->mark, SL_TOK_MARK, 3);
		o = 3;
	}
	for (size_t i = pos; i < end; i++) {
		if (p[i] == ' ') {
			memcpy(w->mark + o, SL_TOK_MARK, 3);
			o += 3;
		} else {
			w->mark[o++] = (char)p[i];
		}
	}
	*len = o;
	return 0;
}

/* A SentencePiece-style word: BPE on the whole of it. */
static int sl_tok_spm_word(const sl_tokenizer *t, struct sl_tok_work *w, const uint8_t *p,
			   size_t pos, size_t end)
{
	return sl_tok_bpe(t, w, p + pos, end - pos);
}

/* A piece under the Metaspace pre-tokenizer: spaces become "▁", one "▁"
 * goes in front unless there is one (prepend_scheme always, or first for
 * the piece at the start of the text), then BPE on the whole or on each
 * "▁"-led part (split). */
static int sl_tok_meta_piece(const sl_tokenizer *t, struct sl_tok_work *w, const uint8_t *p,
			     size_t pos, size_t end)
{
	bool has = p[pos] == ' ' || (end - pos >= 3 && memcmp(p + pos, SL_TOK_MARK, 3) == 0);
	bool lead = !has && (t->spm == SL_TOK_SPM_META_ALWAYS ||
			     (t->spm == SL_TOK_SPM_META_FIRST && pos == 0));
	size_t o;
	SL_TRY(sl_tok_mark(w, p, pos, end, lead, &o));
	const uint8_t *q = (const uint8_t *)w->mark;
	if (!t->meta_split)
		return sl_tok_bpe(t, w, q, o);
	size_t s = 0;
	for (size_t i = 3; i + 3 <= o; i++)
		if (memcmp(q + i, SL_TOK_MARK, 3) == 0) {
			SL_TRY(sl_tok_bpe(t, w, q + s, i - s));
			s = i;
			i += 2;
		}
	return sl_tok_bpe(t, w, q + s, o - s);
}

/* The end of the word at p[i] (i < e) by the tokenizer's regex. */
static size_t sl_tok_word_end(const sl_tokenizer *t, const uint8_t *p, size_t i, size_t e)
{
	if (t->pretok == SL_TOK_PRE_GPT2)
		return sl_tok_next_word(p, i, e);
	return sl_tok_next_word_llama3(p, i, e, t->pretok == SL_TOK_PRE_QWEN2);
}

/* Byte-level text after the normalizer: the regex's words, each BPE'd,
 * or with w->pieces_only where each ends. */
static int sl_tok_words(const sl_tokenizer *t, struct sl_tok_work *w, const uint8_t *p,
			size_t pos, size_t end)
{
	while (pos < end) {
		size_t j = sl_tok_word_end(t, p, pos, end);
		SL_TRY(w->pieces_only ? sl_tok_push_end(w, j) : sl_tok_bpe(t, w, p + pos, j - pos));
		pos = j;
	}
	return 0;
}

/*
 * One piece of text between the first pass's added tokens: normalized
 * (NFC; SentencePiece's "▁" marks), split by the normalized added tokens,
 * then pre-tokenized and BPE'd.  With w->pieces_only: the pre-tokenizer's
 * words in the text as given (no normalizer, as HF's pre_tokenize_str),
 * one for the whole piece when it is SentencePiece-style.
 */
static int sl_tok_piece(const sl_tokenizer *t, struct sl_tok_work *w, const uint8_t *p,
			size_t pos, size_t end)
{
	unsigned flags = w->flags;
	if (t->pretok == SL_TOK_PRE_NONE && w->pieces_only)
		return sl_tok_push_end(w, end);
	if (t->spm == SL_TOK_SPM_PREPEND) {
		size_t o;
		SL_TRY(sl_tok_mark(w, p, pos, end, true, &o));
		/* the second pass walks w->mark; BPE does not touch it */
		return sl_tok_split(t, w, (const uint8_t *)w->mark, 0, o, true, flags,
				    sl_tok_spm_word);
	}
	if (t->pretok == SL_TOK_PRE_NONE)
		return sl_tok_split(t, w, p, pos, end, true, flags, sl_tok_meta_piece);
	char *norm = NULL;
	size_t nl;
	if (t->nfc && !w->pieces_only)
		SL_TRY(sl_tok_nfc(p + pos, end - pos, &norm, &nl));
	if (norm) {
		p = (const uint8_t *)norm;
		pos = 0;
		end = nl;
	}
	int rc = sl_tok_split(t, w, p, pos, end, true, flags, sl_tok_words);
	free(norm);
	return rc;
}

/* Split out the added tokens, normalize and pre-tokenize the rest, then
 * BPE each word, or with w->pieces_only record where each piece ends. */
static int sl_tok_process(const sl_tokenizer *t, const uint8_t *p, size_t len,
			  unsigned flags, struct sl_tok_work *w)
{
	w->flags = flags;
	return sl_tok_split(t, w, p, 0, len, false, flags, sl_tok_piece);
}

/* tokenizer.json tokenizers take text, i.e. UTF-8: HF cannot be given
 * anything else, so there are no ids to match for it. */
static int sl_tok_check_utf8(const char *text, size_t len)
{
	const uint8_t *p = (const uint8_t *)text;
	for (size_t i = 0; i < len;) {
		uint32_t cp;
		int need, l = sl_utf8_scan(p + i, len - i, &cp, &need);
		if (l < 0)
			return sl_err(SL_EFORMAT, "the text is not valid UTF-8 (byte 0x%02X at "
				      "offset %zu); this tokenizer (tokenizer.json) takes UTF-8 only",
				      p[i], i);
		i += (size_t)l;
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
	} else if (t->from_json) {
		rc = sl_tok_check_utf8(text, len);
	}
	bool special = flags & SL_TOKENIZER_ADD_BOS;
	if (rc == 0 && special && t->add_bos && t->bos_id >= 0)
		rc = sl_tok_push_id(&w, t->bos_id);
	if (rc == 0)
		rc = sl_tok_process(t, (const uint8_t *)text, len, flags, &w);
	if (rc == 0 && special && t->add_eos && t->eos_id >= 0)
		rc = sl_tok_push_id(&w, t->eos_id);
	free(fixed);
	free(w.sym);
	free(w.heap);
	free(w.init);
	free(w.buf);
	free(w.mark);
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
	free(w.init);
	free(w.buf);
	free(w.mark);
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
