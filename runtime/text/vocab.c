/*
 * vocab.c - loading a tokenizer: vocab.json (each token's spelling and the
 * bytes it decodes to, through GPT-2's bytes_to_unicode map) and
 * merges.txt (the merge ranks), into the two hash tables encoding looks
 * tokens and merges up in; the special ids; the small queries on them.
 * The behaviour matched and the errors: tokenizer.h.
 */
#include "text_internal.h"
#include "sl_hash.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <string.h>
#include <unistd.h>

/* ---- files ------------------------------------------------------------- */

int sl_tok_read_file(const char *path, char **buf, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		int e = errno;
		return sl_err(e == ENOENT || e == ENOTDIR ? SL_ENOTFOUND : SL_EIO,
			      "%s: cannot open: %s", path, strerror(e));
	}
	size_t cap = 1 << 16, n = 0;
	char *b = malloc(cap + 1);
	if (!b) {
		fclose(f);
		return sl_err(SL_ENOMEM, "%s: out of memory", path);
	}
	for (;;) {
		if (n == cap) {
			char *nb = realloc(b, cap * 2 + 1);
			if (!nb) {
				free(b);
				fclose(f);
				return sl_err(SL_ENOMEM, "%s: out of memory", path);
			}
			b = nb;
			cap *= 2;
		}
		size_t got = fread(b + n, 1, cap - n, f);
		n += got;
		if (got == 0)
			break;
	}
	if (ferror(f)) {
		int e = errno;
		free(b);
		fclose(f);
		return sl_err(SL_EIO, "%s: read error: %s", path, strerror(e));
	}
	fclose(f);
	b[n] = 0;
	*buf = b;
	*len = n;
	return 0;
}

/* ---- GPT-2 bytes_to_unicode -------------------------------------------- */

/* The code point that stands for byte b in vocab.json spellings. */
static void sl_tok_byte_map(uint32_t cp_of[256])
{
	uint32_t extra = 0;
	for (uint32_t b = 0; b < 256; b++) {
		bool kept = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) ||
			    (b >= 0xAE && b <= 0xFF);
		cp_of[b] = kept ? b : 256 + extra++;
	}
}

/* ---- the spelling table ------------------------------------------------ */

int32_t sl_tok_lookup2(const sl_tokenizer *t, const char *a, size_t alen, const char *b,
		       size_t blen)
{
	uint64_t h = sl_fnv1a64(sl_fnv1a64(SL_FNV1A64_INIT, a, alen), b, blen);
	for (size_t i = sl_tok_mix(h) & t->piece_mask;; i = (i + 1) & t->piece_mask) {
		int32_t id = t->piece_hash[i];
		if (id < 0)
			return -1;
		const struct sl_tok_entry *e = &t->ent[id];
		if (e->piece_len == alen + blen &&
		    memcmp(t->pool + e->piece_off, a, alen) == 0 &&
		    memcmp(t->pool + e->piece_off + alen, b, blen) == 0)
			return id;
	}
}

static size_t sl_tok_pow2_at_least(size_t n)
{
	size_t c = 16;
	while (c < n)
		c *= 2;
	return c;
}

/* ---- loading ----------------------------------------------------------- */

/* The bytes spelling key decodes to, into out (room for klen): the
 * ByteLevel map back to bytes (HF's ByteLevel decoder: a spelling with a
 * char outside the map decodes to its own UTF-8), or for the
 * SentencePiece-style decoders "▁" -> " " and, with ByteFallback, "<0xNN>"
 * -> byte NN.  Returns the length; *is_byte for a fallback byte token. */
static size_t sl_tok_raw_of(const sl_tokenizer *t, const int16_t *byte_of, const char *key,
			    size_t klen, char *out, bool *is_byte)
{
	const uint8_t *k = (const uint8_t *)key;
	*is_byte = false;
	if (t->byte_level) {
		size_t i = 0, r = 0;
		while (i < klen) {
			uint32_t cp;
			int need, l = sl_utf8_scan(k + i, klen - i, &cp, &need);
			if (l < 0 || cp >= 324 || byte_of[cp] < 0) {
				memcpy(out, key, klen);
				return klen;
			}
			out[r++] = (char)byte_of[cp];
			i += (size_t)l;
		}
		return r;
	}
	if (t->dec_byte_fallback && klen == 6 && memcmp(key, "<0x", 3) == 0 && key[5] == '>' &&
	    isxdigit(k[3]) && isxdigit(k[4])) {
		char hex[3] = { key[3], key[4], 0 };
		out[0] = (char)strtol(hex, NULL, 16);
		*is_byte = true;
		return 1;
	}
	size_t r = 0;
	for (size_t i = 0; i < klen; i++) {
		if (i + 3 <= klen && memcmp(key + i, "\xe2\x96\x81", 3) == 0) {
			out[r++] = ' ';
			i += 2;
		} else {
			out[r++] = key[i];
		}
	}
	return r;
}

static int sl_tok_check_id(const char *path, const char *key, json_t *val, json_int_t *id)
{
	if (!json_is_integer(val))
		return sl_err(SL_EFORMAT, "%s: token \"%.60s\": id is not an integer", path, key);
	*id = json_integer_value(val);
	if (*id < 0 || *id >= SL_TOK_MAX_ID)
		return sl_err(SL_EFORMAT, "%s: token \"%.60s\": id %lld outside [0, %d)", path, key,
			      (long long)*id, SL_TOK_MAX_ID);
	return 0;
}

/* Store one spelling (pass 2 of sl_tok_build_vocab). */
static int sl_tok_store(sl_tokenizer *t, const char *path, const int16_t *byte_of,
			const char *key, size_t klen, int32_t id, size_t *off)
{
	if (t->flags[id] & SL_TOK_PRESENT) {
		const struct sl_tok_entry *o = &t->ent[id];
		return sl_err(SL_EFORMAT, "%s: id %d given to both \"%.*s\" and \"%.60s\"", path,
			      (int)id, (int)SL_MIN(o->piece_len, 60u), t->pool + o->piece_off, key);
	}
	if (sl_tok_lookup2(t, key, klen, "", 0) >= 0)
		return sl_err(SL_EFORMAT, "%s: token \"%.60s\" has two ids", path, key);
	struct sl_tok_entry *e = &t->ent[id];
	t->flags[id] = SL_TOK_PRESENT;
	e->piece_off = (uint32_t)*off;
	e->piece_len = (uint32_t)klen;
	memcpy(t->pool + *off, key, klen);
	*off += klen;
	bool is_byte;
	e->raw_off = (uint32_t)*off;
	e->raw_len = (uint32_t)sl_tok_raw_of(t, byte_of, key, klen, t->pool + *off, &is_byte);
	*off += e->raw_len;
	if (is_byte)
		t->flags[id] |= SL_TOK_BYTE;
	uint64_t h = sl_fnv1a64(SL_FNV1A64_INIT, key, klen);
	size_t s = sl_tok_mix(h) & t->piece_mask;
	while (t->piece_hash[s] >= 0)
		s = (s + 1) & t->piece_mask;
	t->piece_hash[s] = id;
	return 0;
}

int sl_tok_build_vocab(sl_tokenizer *t, const char *path, json_t *root, json_t *added)
{
	if (!json_is_object(root))
		return sl_err(SL_EFORMAT, "%s: the vocabulary is not a JSON object", path);
	if (json_object_size(root) == 0)
		return sl_err(SL_EFORMAT, "%s: empty vocabulary", path);
	size_t n_added = added ? json_array_size(added) : 0;

	/* Pass 1: check ids, size the tables. */
	const char *key;
	json_t *val;
	json_int_t max_id = -1, id = 0;
	size_t pool_len = 0;
	json_object_foreach(root, key, val) {
		SL_TRY(sl_tok_check_id(path, key, val, &id));
		max_id = SL_MAX(max_id, id);
		pool_len += 2 * strlen(key);
	}
	for (size_t i = 0; i < n_added; i++) {
		json_t *a = json_array_get(added, i);
		const char *c = json_string_value(json_object_get(a, "content"));
		SL_TRY(sl_tok_check_id(path, c, json_object_get(a, "id"), &id));
		max_id = SL_MAX(max_id, id);
		/* and room for the bytes of its normalized form (sl_tok_set_raw) */
		pool_len += 2 * strlen(c) + 4 * strlen(c) + 8;
	}
	if (pool_len >= UINT32_MAX)
		return sl_err(SL_EFORMAT, "%s: vocabulary too large", path);

	t->n_ids = (int32_t)max_id + 1;
	t->ent = calloc((size_t)t->n_ids, sizeof *t->ent);
	t->flags = calloc((size_t)t->n_ids, 1);
	t->pool = malloc(pool_len + 1);
	size_t hcap = sl_tok_pow2_at_least(2 * (json_object_size(root) + n_added));
	t->piece_hash = malloc(hcap * sizeof *t->piece_hash);
	t->piece_mask = hcap - 1;
	if (!t->ent || !t->flags || !t->pool || !t->piece_hash)
		return sl_err(SL_ENOMEM, "%s: out of memory", path);
	memset(t->piece_hash, 0xff, hcap * sizeof *t->piece_hash);

	uint32_t cp_of[256];
	int16_t byte_of[324];
	sl_tok_byte_map(cp_of);
	memset(byte_of, 0xff, sizeof byte_of);
	for (int b = 0; b < 256; b++)
		byte_of[cp_of[b]] = (int16_t)b;

	/* Pass 2: store spellings and decoded bytes, index the spellings. */
	size_t off = 0;
	json_object_foreach(root, key, val)
		SL_TRY(sl_tok_store(t, path, byte_of, key, strlen(key),
				    (int32_t)json_integer_value(val), &off));
	/* An added token already in the vocabulary must keep its id there. */
	for (size_t i = 0; i < n_added; i++) {
		json_t *a = json_array_get(added, i);
		const char *c = json_string_value(json_object_get(a, "content"));
		size_t cl = strlen(c);
		int32_t aid = (int32_t)json_integer_value(json_object_get(a, "id"));
		int32_t have = sl_tok_lookup2(t, c, cl, "", 0);
		if (have == aid)
			continue;
		if (have >= 0)
			return sl_err(SL_EFORMAT, "%s: added token \"%.60s\" has id %d but the "
				      "vocabulary gives it %d", path, c, (int)aid, (int)have);
		SL_TRY(sl_tok_store(t, path, byte_of, c, cl, aid, &off));
	}

	t->pool_used = off;
	t->pool_cap = pool_len;
	for (int b = 0; b < 256; b++) {
		t->byte_utf8_len[b] = (uint8_t)sl_utf8_put(cp_of[b], t->byte_utf8[b]);
		t->byte_id[b] = t->byte_level ?
			sl_tok_lookup2(t, t->byte_utf8[b], t->byte_utf8_len[b], "", 0) : -1;
		char fb[8];
		snprintf(fb, sizeof fb, "<0x%02X>", b);
		t->fallback_id[b] = sl_tok_lookup2(t, fb, 6, "", 0);
	}
	return 0;
}

int sl_tok_set_raw(sl_tokenizer *t, int32_t id, const char *spelling, size_t len)
{
	if (t->pool_used + len > t->pool_cap) /* the room sl_tok_build_vocab keeps */
		return sl_err(SL_ENOMEM, "tokenizer: no room for the decoded bytes of id %d",
			      (int)id);
	uint32_t cp_of[256];
	int16_t byte_of[324];
	sl_tok_byte_map(cp_of);
	memset(byte_of, 0xff, sizeof byte_of);
	for (int b = 0; b < 256; b++)
		byte_of[cp_of[b]] = (int16_t)b;
	bool is_byte;
	struct sl_tok_entry *e = &t->ent[id];
	e->raw_off = (uint32_t)t->pool_used;
	e->raw_len = (uint32_t)sl_tok_raw_of(t, byte_of, spelling, len, t->pool + t->pool_used,
					     &is_byte);
	t->pool_used += e->raw_len;
	return 0;
}

int sl_tok_added_push(sl_tokenizer *t, const char *text, size_t len, int32_t id,
		      bool normalized)
{
	struct sl_tok_added *na = realloc(t->added, (t->n_added + 1) * sizeof *na);
	char *c = malloc(len + 1);
	if (na)
		t->added = na;
	if (!na || !c) {
		free(c);
		return sl_err(SL_ENOMEM, "tokenizer: out of memory");
	}
	memcpy(c, text, len);
	c[len] = 0;
	t->added[t->n_added++] = (struct sl_tok_added){ c, len, id, normalized };
	t->n_added_norm += normalized;
	return 0;
}

static int sl_tok_load_vocab(sl_tokenizer *t, const char *path)
{
	char *buf;
	size_t len;
	SL_TRY(sl_tok_read_file(path, &buf, &len));
	json_error_t jerr;
	json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
	free(buf);
	if (!root)
		return sl_err(SL_EFORMAT, "%s:%d:%d: bad JSON: %s", path, jerr.line,
			      jerr.column, jerr.text);
	int rc = json_is_object(root) ? sl_tok_build_vocab(t, path, root, NULL) :
		sl_err(SL_EFORMAT, "%s: top level is not a JSON object", path);
	json_decref(root);
	if (rc < 0)
		return rc;
	/* OPT's special tokens, as HF's OPT tokenizer has them: bos = eos =
	 * "</s>", pad = "<pad>", split out of text; "</s>" prepended. */
	t->bos_id = t->eos_id = sl_tok_lookup2(t, "</s>", 4, "", 0);
	t->pad_id = sl_tok_lookup2(t, "<pad>", 5, "", 0);
	t->add_bos = true;
	if (t->bos_id >= 0)
		SL_TRY(sl_tok_added_push(t, "</s>", 4, t->bos_id, false));
	if (t->pad_id >= 0)
		SL_TRY(sl_tok_added_push(t, "<pad>", 5, t->pad_id, false));
	for (size_t i = 0; i < t->n_added; i++)
		t->flags[t->added[i].id] |= SL_TOK_SPECIAL;
	return 0;
}

int sl_tok_merges_init(sl_tokenizer *t, const char *path, size_t n)
{
	size_t cap = sl_tok_pow2_at_least(2 * n + 1);
	t->merges = malloc(cap * sizeof *t->merges);
	if (!t->merges)
		return sl_err(SL_ENOMEM, "%s: out of memory", path);
	t->merge_mask = cap - 1;
	for (size_t i = 0; i < cap; i++)
		t->merges[i].key = UINT64_MAX;
	return 0;
}

int sl_tok_merge_add(sl_tokenizer *t, const char *path, const char *where, const char *p,
		     size_t al, const char *q, size_t bl, int32_t rank)
{
	int32_t a = sl_tok_lookup2(t, p, al, "", 0);
	int32_t b = sl_tok_lookup2(t, q, bl, "", 0);
	int32_t ab = sl_tok_lookup2(t, p, al, q, bl);
	if (a < 0 || b < 0)
		return sl_err(SL_EFORMAT, "%s%s: token \"%.*s\" is not in the vocabulary", path,
			      where, (int)SL_MIN(a < 0 ? al : bl, (size_t)60), a < 0 ? p : q);
	if (ab < 0)
		return sl_err(SL_EFORMAT, "%s%s: merged token of \"%.*s %.*s\" is not in the "
			      "vocabulary", path, where, (int)SL_MIN(al, (size_t)60), p,
			      (int)SL_MIN(bl, (size_t)60), q);
	uint64_t key = sl_tok_merge_key(a, b);
	size_t s = sl_tok_mix(key) & t->merge_mask;
	while (t->merges[s].key != UINT64_MAX && t->merges[s].key != key)
		s = (s + 1) & t->merge_mask;
	/* A repeated pair takes its later rank, as in HF. */
	t->merges[s].key = key;
	t->merges[s].rank = rank;
	t->merges[s].id = ab;
	return 0;
}

static int sl_tok_load_merges(sl_tokenizer *t, const char *path)
{
	char *buf;
	size_t len;
	SL_TRY(sl_tok_read_file(path, &buf, &len));
	size_t lines = 1;
	for (size_t i = 0; i < len; i++)
		lines += buf[i] == '\n';
	int rc = sl_tok_merges_init(t, path, lines);
	int32_t rank = 0;
	size_t lineno = 0;
	char *p = buf, *end = buf + len;
	while (rc == 0 && p < end) {
		char *nl = memchr(p, '\n', (size_t)(end - p));
		char *le = nl ? nl : end;
		char *next = nl ? nl + 1 : end;
		lineno++;
		if (le > p && le[-1] == '\r')
			le--;
		size_t ll = (size_t)(le - p);
		if (ll >= 8 && memcmp(p, "#version", 8) == 0) {
			p = next;
			continue;
		}
		char *sp = memchr(p, ' ', ll);
		if (!sp || memchr(sp + 1, ' ', (size_t)(le - sp - 1))) {
			rc = sl_err(SL_EFORMAT, "%s:%zu: expected two tokens separated by "
				    "one space, got \"%.*s\"", path, lineno,
				    (int)SL_MIN(ll, (size_t)60), p);
			break;
		}
		char where[32];
		snprintf(where, sizeof where, ":%zu", lineno);
		rc = sl_tok_merge_add(t, path, where, p, (size_t)(sp - p), sp + 1,
				      (size_t)(le - sp - 1), rank++);
		p = next;
	}
	free(buf);
	return rc;
}

int sl_tokenizer_load(const char *dir, sl_tokenizer **out)
{
	if (!dir || !out)
		return sl_err(SL_EINVAL, "sl_tokenizer_load: NULL argument");
	*out = NULL;
	size_t dl = strlen(dir);
	char *path = malloc(dl + 32);
	sl_tokenizer *t = calloc(1, sizeof *t);
	if (!path || !t) {
		free(path);
		free(t);
		return sl_err(SL_ENOMEM, "%s: out of memory", dir);
	}
	t->bos_id = t->eos_id = t->pad_id = t->unk_id = -1;
	int rc;
	snprintf(path, dl + 32, "%s/tokenizer.json", dir);
	if (access(path, F_OK) == 0) {
		/* transformers' fast tokenizers take tokenizer.json before
		 * vocab.json + merges.txt; so does sluice. */
		rc = sl_tok_load_hf(t, dir);
	} else {
		t->byte_level = true;
		t->pretok = SL_TOK_PRE_GPT2;
		snprintf(path, dl + 32, "%s/vocab.json", dir);
		rc = sl_tok_load_vocab(t, path);
		if (rc == 0) {
			snprintf(path, dl + 32, "%s/merges.txt", dir);
			rc = sl_tok_load_merges(t, path);
		}
	}
	free(path);
	if (rc < 0) {
		sl_tokenizer_free(t);
		return rc;
	}
	*out = t;
	return 0;
}

void sl_tokenizer_free(sl_tokenizer *t)
{
	if (!t)
		return;
	free(t->ent);
	free(t->flags);
	free(t->pool);
	free(t->piece_hash);
	free(t->merges);
	for (size_t i = 0; i < t->n_added; i++)
		free(t->added[i].text);
	free(t->added);
	free(t);
}

/* ---- small queries ----------------------------------------------------- */

int32_t sl_tokenizer_vocab_size(const sl_tokenizer *t)
{
	return t->n_ids;
}

int32_t sl_tokenizer_token_id(const sl_tokenizer *t, const char *piece, size_t len)
{
	if (!piece && len)
		return -1;
	return sl_tok_lookup2(t, piece ? piece : "", len, "", 0);
}

int32_t sl_tokenizer_bos_id(const sl_tokenizer *t)
{
	return t->bos_id;
}

int32_t sl_tokenizer_eos_id(const sl_tokenizer *t)
{
	return t->eos_id;
}

int32_t sl_tokenizer_pad_id(const sl_tokenizer *t)
{
	return t->pad_id;
}

bool sl_tokenizer_adds_bos(const sl_tokenizer *t)
{
	return t->add_bos && t->bos_id >= 0;
}

bool sl_tokenizer_present(const char *dir)
{
	char path[4096];
	if (snprintf(path, sizeof path, "%s/tokenizer.json", dir) >= (int)sizeof path)
		return false;
	if (access(path, F_OK) == 0)
		return true;
	snprintf(path, sizeof path, "%s/vocab.json", dir);
	return access(path, F_OK) == 0;
}

bool sl_tokenizer_is_special(const sl_tokenizer *t, int32_t id)
{
	return id >= 0 && id < t->n_ids && (t->flags[id] & SL_TOK_SPECIAL);
}
