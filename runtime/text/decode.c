/*
 * decode.c - ids to text: each token's bytes (made at load: its spelling
 * mapped back through bytes_to_unicode, or with "▁" as a space and
 * "<0xNN>" as byte NN), concatenated, the SentencePiece-style decoders'
 * rules applied (ByteFallback's per-byte U+FFFD, Strip, Metaspace's first
 * token), then repaired (utf8.c) unless raw bytes are asked for; and one
 * token's bytes for streaming.  The behaviour matched: tokenizer.h.
 */
#include "text_internal.h"

#include <string.h>

/* ByteFallback's rule for a run of byte tokens at out[gs..*r): kept when
 * it is valid UTF-8, else one U+FFFD per byte (out has room). */
static void sl_tok_flush_bytes(char *out, size_t gs, size_t *r)
{
	char *fixed;
	size_t flen, g = *r - gs;
	if (g == 0 || sl_utf8_lossy(out + gs, g, &fixed, &flen) < 0 || !fixed)
		return; /* well-formed (or no memory to tell: kept, repaired below) */
	free(fixed);
	for (size_t i = 0; i < g; i++)
		memcpy(out + gs + 3 * i, "\xef\xbf\xbd", 3);
	*r = gs + 3 * g;
}

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
	bool groups = t->dec_byte_fallback && !(flags & SL_TOKENIZER_RAW_BYTES);
	char *raw = malloc((groups ? 3 * total : total) + 1);
	if (!raw)
		return sl_err(SL_ENOMEM, "tokenizer: out of memory");
	size_t r = 0, gs = 0, emitted = 0;
	bool skip = flags & SL_TOKENIZER_SKIP_SPECIAL;
	for (size_t i = 0; i < n; i++) {
		if (!sl_tok_has_text(t, ids[i]) || (skip && (t->flags[ids[i]] & SL_TOK_SPECIAL)))
			continue;
		const struct sl_tok_entry *e = &t->ent[ids[i]];
		const char *b = t->pool + e->raw_off;
		if (groups && !(t->flags[ids[i]] & SL_TOK_BYTE)) {
			sl_tok_flush_bytes(raw, gs, &r);
		}
		if (t->dec_meta_first && emitted == 0) {
			/* Metaspace's decoder drops every "▁" of the first token */
			for (size_t k = 0; k < e->raw_len; k++)
				if (b[k] != ' ')
					raw[r++] = b[k];
		} else {
			memcpy(raw + r, b, e->raw_len);
			r += e->raw_len;
		}
		if (groups && !(t->flags[ids[i]] & SL_TOK_BYTE))
			gs = r;
		emitted++;
	}
	if (groups)
		sl_tok_flush_bytes(raw, gs, &r);
	/* Strip(" ", n, 0) after Fuse: the decoded text's leading spaces */
	size_t cut = 0;
	while (cut < t->dec_strip && cut < r && raw[cut] == ' ')
		cut++;
	memmove(raw, raw + cut, r - cut);
	r -= cut;
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
