/*
 * vocab.c - loading a tokenizer: vocab.json (each token's spelling and the
 * bytes it decodes to, through GPT-2's bytes_to_unicode map) and
 * merges.txt (the merge ranks), into the two hash tables encoding looks
 * tokens and merges up in; the special ids; the small queries on them.
 * The behaviour matched and the errors: tokenizer.h.
 */
#include "text_internal.h"
#include "sl_hash.h"

#include <errno.h>
#include <jansson.h>
#include <string.h>

const char *const sl_tok_special_text[SL_TOK_NSPECIAL] = { "</s>", "<pad>" };

/* ---- files ------------------------------------------------------------- */

static int sl_tok_read_file(const char *path, char **buf, size_t *len)
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
	int rc = 0;
	if (!json_is_object(root)) {
		rc = sl_err(SL_EFORMAT, "%s: top level is not a JSON object", path);
		goto out;
	}
	if (json_object_size(root) == 0) {
		rc = sl_err(SL_EFORMAT, "%s: empty vocabulary", path);
		goto out;
	}

	/* Pass 1: check ids, size the tables. */
	const char *key;
	json_t *val;
	json_int_t max_id = -1;
	size_t pool_len = 0;
	json_object_foreach(root, key, val) {
		if (!json_is_integer(val)) {
			rc = sl_err(SL_EFORMAT, "%s: token \"%.60s\": id is not an integer",
				    path, key);
			goto out;
		}
		json_int_t id = json_integer_value(val);
		if (id < 0 || id >= SL_TOK_MAX_ID) {
			rc = sl_err(SL_EFORMAT, "%s: token \"%.60s\": id %lld outside [0, %d)",
				    path, key, (long long)id, SL_TOK_MAX_ID);
			goto out;
		}
		if (id > max_id)
			max_id = id;
		pool_len += 2 * strlen(key);
	}
	if (pool_len >= UINT32_MAX) {
		rc = sl_err(SL_EFORMAT, "%s: vocabulary too large", path);
		goto out;
	}

	t->n_ids = (int32_t)max_id + 1;
	t->ent = calloc((size_t)t->n_ids, sizeof *t->ent);
	t->flags = calloc((size_t)t->n_ids, 1);
	t->pool = malloc(pool_len + 1);
	size_t hcap = sl_tok_pow2_at_least(2 * json_object_size(root));
	t->piece_hash = malloc(hcap * sizeof *t->piece_hash);
	t->piece_mask = hcap - 1;
	if (!t->ent || !t->flags || !t->pool || !t->piece_hash) {
		rc = sl_err(SL_ENOMEM, "%s: out of memory", path);
		goto out;
	}
	memset(t->piece_hash, 0xff, hcap * sizeof *t->piece_hash);

	uint32_t cp_of[256];
	int16_t byte_of[324];
	sl_tok_byte_map(cp_of);
	memset(byte_of, 0xff, sizeof byte_of);
	for (int b = 0; b < 256; b++)
		byte_of[cp_of[b]] = (int16_t)b;

	/* Pass 2: store spellings and decoded bytes, index the spellings. */
	size_t off = 0;
	json_object_foreach(root, key, val) {
		int32_t id = (int32_t)json_integer_value(val);
		size_t klen = strlen(key);
		if (t->flags[id] & SL_TOK_PRESENT) {
			const struct sl_tok_entry *o = &t->ent[id];
			rc = sl_err(SL_EFORMAT, "%s: id %d given to both \"%.*s\" and \"%.60s\"",
				    path, (int)id, (int)SL_MIN(o->piece_len, 60u),
				    t->pool + o->piece_off, key);
			goto out;
		}
		struct sl_tok_entry *e = &t->ent[id];
		t->flags[id] = SL_TOK_PRESENT;
		e->piece_off = (uint32_t)off;
		e->piece_len = (uint32_t)klen;
		memcpy(t->pool + off, key, klen);
		off += klen;
		/* HF ByteLevel decoder: map every char back to its byte; a token
		 * with a char outside the table decodes to its own UTF-8. */
		e->raw_off = (uint32_t)off;
		const uint8_t *k = (const uint8_t *)key;
		size_t i = 0, r = 0;
		bool mapped = true;
		while (i < klen) {
			uint32_t cp;
			int need, l = sl_utf8_scan(k + i, klen - i, &cp, &need);
			if (l < 0 || cp >= 324 || byte_of[cp] < 0) {
				mapped = false;
				break;
			}
			t->pool[off + r++] = (char)byte_of[cp];
			i += (size_t)l;
		}
		if (!mapped) {
			memcpy(t->pool + off, key, klen);
			r = klen;
		}
		e->raw_len = (uint32_t)r;
		off += r;
		uint64_t h = sl_fnv1a64(SL_FNV1A64_INIT, key, klen);
		size_t s = sl_tok_mix(h) & t->piece_mask;
		while (t->piece_hash[s] >= 0)
			s = (s + 1) & t->piece_mask;
		t->piece_hash[s] = id;
	}

	for (int b = 0; b < 256; b++) {
		char u[4];
		size_t ul = sl_utf8_put(cp_of[b], u);
		t->byte_id[b] = sl_tok_lookup2(t, u, ul, "", 0);
	}
	for (int s = 0; s < SL_TOK_NSPECIAL; s++) {
		t->special_len[s] = strlen(sl_tok_special_text[s]);
		t->special_id[s] = sl_tok_lookup2(t, sl_tok_special_text[s],
						  t->special_len[s], "", 0);
		if (t->special_id[s] >= 0)
			t->flags[t->special_id[s]] |= SL_TOK_SPECIAL;
	}
out:
	json_decref(root);
	return rc;
}

static int sl_tok_load_merges(sl_tokenizer *t, const char *path)
{
	char *buf;
	size_t len;
	SL_TRY(sl_tok_read_file(path, &buf, &len));
	size_t lines = 1;
	for (size_t i = 0; i < len; i++)
		lines += buf[i] == '\n';
	size_t cap = sl_tok_pow2_at_least(2 * lines);
	t->merges = malloc(cap * sizeof *t->merges);
	if (!t->merges) {
		free(buf);
		return sl_err(SL_ENOMEM, "%s: out of memory", path);
	}
	t->merge_mask = cap - 1;
	for (size_t i = 0; i < cap; i++)
		t->merges[i].key = UINT64_MAX;

	int rc = 0;
	int32_t rank = 0;
	size_t lineno = 0;
	char *p = buf, *end = buf + len;
	while (p < end) {
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
			goto out;
		}
		size_t al = (size_t)(sp - p), bl = (size_t)(le - sp - 1);
		int32_t a = sl_tok_lookup2(t, p, al, "", 0);
		int32_t b = sl_tok_lookup2(t, sp + 1, bl, "", 0);
		int32_t ab = sl_tok_lookup2(t, p, al, sp + 1, bl);
		if (a < 0 || b < 0 || ab < 0) {
			const char *what = a < 0 ? p : b < 0 ? sp + 1 : p;
			size_t wl = a < 0 ? al : b < 0 ? bl : ll;
			rc = sl_err(SL_EFORMAT, "%s:%zu: %s\"%.*s\" is not in vocab.json",
				    path, lineno, a >= 0 && b >= 0 ? "merged token of " : "token ",
				    (int)SL_MIN(wl, (size_t)60), what);
			goto out;
		}
		uint64_t key = sl_tok_merge_key(a, b);
		size_t s = sl_tok_mix(key) & t->merge_mask;
		while (t->merges[s].key != UINT64_MAX && t->merges[s].key != key)
			s = (s + 1) & t->merge_mask;
		/* A repeated pair takes its later rank, as in HF. */
		t->merges[s].key = key;
		t->merges[s].rank = rank++;
		t->merges[s].id = ab;
		p = next;
	}
out:
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
	snprintf(path, dl + 32, "%s/vocab.json", dir);
	int rc = sl_tok_load_vocab(t, path);
	if (rc == 0) {
		snprintf(path, dl + 32, "%s/merges.txt", dir);
		rc = sl_tok_load_merges(t, path);
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
	return t->special_id[0];
}

int32_t sl_tokenizer_eos_id(const sl_tokenizer *t)
{
	return t->special_id[0];
}

int32_t sl_tokenizer_pad_id(const sl_tokenizer *t)
{
	return t->special_id[1];
}

bool sl_tokenizer_is_special(const sl_tokenizer *t, int32_t id)
{
	return id >= 0 && id < t->n_ids && (t->flags[id] & SL_TOK_SPECIAL);
}
