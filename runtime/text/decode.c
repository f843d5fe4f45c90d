/*
 * decode.c - ids to text: each token's bytes (its vocab.json spelling
 * mapped back through bytes_to_unicode, made at load), concatenated, then
 * repaired (utf8.c) unless raw bytes are asked for; and one token's bytes
 * for streaming.  The behaviour matched: tokenizer.h.
 */
#include "text_internal.h"

#include <string.h>

int sl_tokenizer_decode_ex(const sl_tokenizer *t, const int32_t *ids, size_t n,
			   unsigned flags, char **text, size_t *len)
{
	if (!t || (!ids && n) || !text || !len)
		return sl_err(SL_EINVAL, "sl_tokenizer_decode: NULL argument");
	*text = NULL;
	*len = 0;
	size_t total = 0;
	for (size_t i = 0; i < n; i++) {
		int32_t id = ids[i];
		if (id < 0)
			return sl_err(SL_ERANGE, "tokenizer: id %d at position %zu is negative", (int)id,
				      i);
		if (sl_tok_has_text(t, id))
			total += t->ent[id].raw_len;
	}
	char *raw = malloc(total + 1);
	if (!raw)
		return sl_err(SL_ENOMEM, "tokenizer: out of memory");
	size_t r = 0;
	bool skip = flags & SL_TOKENIZER_SKIP_SPECIAL;
	for (size_t i = 0; i < n; i++) {
		if (!sl_tok_has_text(t, ids[i]) || (skip && (t->flags[ids[i]] & SL_TOK_SPECIAL)))
			continue;
		const struct sl_tok_entry *e = &t->ent[ids[i]];
		memcpy(raw + r, t->pool + e->raw_off, e->raw_len);
		r += e->raw_len;
	}
	raw[r] = 0;

	if (!(flags & SL_TOKENIZER_RAW_BYTES)) {
		char *fixed;
		size_t flen;
		if (sl_utf8_lossy(raw, r, &fixed, &flen) < 0) {
			free(raw);
			return SL_ENOMEM;
		}
		if (fixed) {
			free(raw);
			raw = fixed;
			r = flen;
		}
	}
	*text = raw;
	*len = r;
	return 0;
}

int sl_tokenizer_decode(const sl_tokenizer *t, const int32_t *ids, size_t n,
			char **text, size_t *len)
{
	return sl_tokenizer_decode_ex(t, ids, n, 0, text, len);
}

int sl_tokenizer_token_bytes(const sl_tokenizer *t, int32_t id, const char **bytes,
			     size_t *len)
{
	if (!t || id < 0)
		return sl_err(SL_ERANGE, "tokenizer: id %d is negative", (int)id);
	if (!sl_tok_has_text(t, id)) {
		*bytes = "";
		*len = 0;
		return 0;
	}
	*bytes = t->pool + t->ent[id].raw_off;
	*len = t->ent[id].raw_len;
	return 0;
}
