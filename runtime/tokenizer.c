/*
 * tokenizer.c - GPT-2 byte-level BPE (vocab.json + merges.txt) as used by
 * Hugging Face OPT checkpoints: loading, encoding (special-token split,
 * GPT-2 pre-tokenizer regex written out by hand over UTF-8, byte mapping,
 * rank-ordered merges) and decoding.  See tokenizer.h for the behaviour
 * matched and the ownership rules.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem */
#endif
#include "tokenizer.h"
#include "unicode_tables.h"
#include "sl_hash.h"

#include <errno.h>
#include <jansson.h>
#include <string.h>

#define SL_TOK_MAX_ID (1 << 24)        /* ids in vocab.json stay below this */
#define SL_TOK_MAX_WORD (1u << 28)     /* longest pre-token BPE accepts */

enum { SL_TOK_PRESENT = 1, SL_TOK_SPECIAL = 2 };

/* What HF's OPT tokenizer splits out of text before pre-tokenizing. */
static const char *const sl_tok_special_text[] = { "</s>", "<pad>" };
#define SL_TOK_NSPECIAL 2

struct sl_tok_entry {
	uint32_t piece_off, piece_len; /* vocab.json spelling, in pool */
	uint32_t raw_off, raw_len;     /* decoded bytes, in pool */
};

struct sl_tok_merge {
	uint64_t key;   /* (left id << 32) | right id; UINT64_MAX = empty */
	int32_t rank;
	int32_t id;     /* id of the merged token */
};

struct sl_tokenizer {
	int32_t n_ids;                 /* max id + 1 */
	struct sl_tok_entry *ent;      /* [n_ids] */
	uint8_t *flags;                /* [n_ids] SL_TOK_PRESENT | SL_TOK_SPECIAL */
	char *pool;
	int32_t *piece_hash;           /* open addressing, -1 empty */
	size_t piece_mask;
	struct sl_tok_merge *merges;   /* open addressing */
	size_t merge_mask;
	int32_t byte_id[256];          /* id of each single byte, -1 if none */
	int32_t special_id[SL_TOK_NSPECIAL];
	size_t special_len[SL_TOK_NSPECIAL];
};

/* ---- files ----------------------------------------------------------------- */

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

/* ---- UTF-8 ----------------------------------------------------------------- */

/*
 * Look at the sequence starting at p[0] (n >= 1 bytes available).  Returns
 * its length (1..4) and sets *cp if it is well-formed UTF-8; otherwise
 * returns -k, k >= 1 being the maximal subpart (the bytes that one U+FFFD
 * replaces in HF / Rust from_utf8_lossy / Python errors="replace").  *need
 * gets the length the lead byte announces (0 for a byte that cannot lead).
 */
static int sl_utf8_scan(const uint8_t *p, size_t n, uint32_t *cp, int *need)
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

/*
 * Replace ill-formed UTF-8 in[0..n) by U+FFFD, one per maximal subpart
 * (HF's String::from_utf8_lossy, Python's errors="replace").  *out is a
 * malloc'd NUL-terminated copy, or NULL when in is already well-formed.
 */
static int sl_tok_lossy(const char *in, size_t n, char **out, size_t *olen)
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
	SL_TRY(sl_tok_lossy(in, n, out, olen));
	if (*out)
		return 0;
	if (!(*out = malloc(n + 1)))
		return sl_err(SL_ENOMEM, "out of memory");
	memcpy(*out, in, n);
	(*out)[n] = 0;
	return 0;
}

/* ---- code point classes ---------------------------------------------------- */

static const uint8_t sl_ascii_class[128] = {
	['\t'] = SL_UNI_SPACE, ['\n'] = SL_UNI_SPACE, ['\v'] = SL_UNI_SPACE,
	['\f'] = SL_UNI_SPACE, ['\r'] = SL_UNI_SPACE, [' '] = SL_UNI_SPACE,
	['0'] = SL_UNI_NUMBER, ['1'] = SL_UNI_NUMBER, ['2'] = SL_UNI_NUMBER,
	['3'] = SL_UNI_NUMBER, ['4'] = SL_UNI_NUMBER, ['5'] = SL_UNI_NUMBER,
	['6'] = SL_UNI_NUMBER, ['7'] = SL_UNI_NUMBER, ['8'] = SL_UNI_NUMBER,
	['9'] = SL_UNI_NUMBER,
	['A'] = 1, ['B'] = 1, ['C'] = 1, ['D'] = 1, ['E'] = 1, ['F'] = 1,
	['G'] = 1, ['H'] = 1, ['I'] = 1, ['J'] = 1, ['K'] = 1, ['L'] = 1,
	['M'] = 1, ['N'] = 1, ['O'] = 1, ['P'] = 1, ['Q'] = 1, ['R'] = 1,
	['S'] = 1, ['T'] = 1, ['U'] = 1, ['V'] = 1, ['W'] = 1, ['X'] = 1,
	['Y'] = 1, ['Z'] = 1,
	['a'] = 1, ['b'] = 1, ['c'] = 1, ['d'] = 1, ['e'] = 1, ['f'] = 1,
	['g'] = 1, ['h'] = 1, ['i'] = 1, ['j'] = 1, ['k'] = 1, ['l'] = 1,
	['m'] = 1, ['n'] = 1, ['o'] = 1, ['p'] = 1, ['q'] = 1, ['r'] = 1,
	['s'] = 1, ['t'] = 1, ['u'] = 1, ['v'] = 1, ['w'] = 1, ['x'] = 1,
	['y'] = 1, ['z'] = 1,
};

static int sl_uni_class(uint32_t cp)
{
	if (cp < 128)
		return sl_ascii_class[cp];
	size_t lo = 0, hi = SL_ARRAY_LEN(sl_uni_space);
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (sl_uni_space[mid] == cp)
			return SL_UNI_SPACE;
		if (sl_uni_space[mid] < cp)
			lo = mid + 1;
		else
			hi = mid;
	}
	lo = 0;
	hi = SL_ARRAY_LEN(sl_uni_ranges);
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (cp < sl_uni_ranges[mid].lo)
			hi = mid;
		else if (cp > sl_uni_ranges[mid].hi)
			lo = mid + 1;
		else
			return (int)sl_uni_ranges[mid].cls;
	}
	return SL_UNI_OTHER;
}

/* Class and length of the character at p[0]; a byte outside well-formed
 * UTF-8 is one character of class "other" (like U+FFFD). */
static inline int sl_tok_class_at(const uint8_t *p, size_t n, size_t *len)
{
	if (p[0] < 0x80) {
		*len = 1;
		return sl_ascii_class[p[0]];
	}
	uint32_t cp;
	int need, r = sl_utf8_scan(p, n, &cp, &need);
	if (r < 0) {
		*len = 1;
		return SL_UNI_OTHER;
	}
	*len = (size_t)r;
	return sl_uni_class(cp);
}

/* ---- GPT-2 bytes_to_unicode ------------------------------------------------ */

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

static size_t sl_utf8_put(uint32_t cp, char *out)
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

/* ---- hash tables ----------------------------------------------------------- */

static inline size_t sl_tok_mix(uint64_t x)
{
	x ^= x >> 31;
	x *= 0x9E3779B97F4A7C15ull;
	x ^= x >> 29;
	return (size_t)x;
}

/* Id of the token spelled a followed by b (b may be empty), or -1. */
static int32_t sl_tok_lookup2(const sl_tokenizer *t, const char *a, size_t alen,
			      const char *b, size_t blen)
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

static inline const struct sl_tok_merge *sl_tok_merge_find(const sl_tokenizer *t,
							    int32_t a, int32_t b)
{
	uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
	for (size_t i = sl_tok_mix(key) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
		const struct sl_tok_merge *m = &t->merges[i];
		if (m->key == key)
			return m;
		if (m->key == UINT64_MAX)
			return NULL;
	}
}

static size_t sl_tok_pow2_at_least(size_t n)
{
	size_t c = 16;
	while (c < n)
		c *= 2;
	return c;
}

/* ---- loading --------------------------------------------------------------- */

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
		uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
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

/* ---- encoding -------------------------------------------------------------- */

struct sl_tok_sym {
	int32_t id;   /* -1 once merged into its left neighbour */
	int32_t prev, next;
};

struct sl_tok_cand {
	int32_t rank, pos;
};

struct sl_tok_work {
	int32_t *ids;
	size_t n, cap;
	struct sl_tok_sym *sym;
	struct sl_tok_cand *heap;
	size_t word_cap; /* sym holds word_cap, heap 3 * word_cap */
	bool pieces_only; /* sl_tokenizer_pretokenize: record piece ends */
	size_t *ends;
	size_t nends, ends_cap;
};

static int sl_tok_push_id(struct sl_tok_work *w, int32_t id)
{
	if (w->n == w->cap) {
		size_t nc = w->cap * 2;
		int32_t *ni = realloc(w->ids, nc * sizeof *ni);
		if (!ni)
			return sl_err(SL_ENOMEM, "tokenizer: out of memory");
		w->ids = ni;
		w->cap = nc;
	}
	w->ids[w->n++] = id;
	return 0;
}

static inline bool sl_tok_cand_less(struct sl_tok_cand a, struct sl_tok_cand b)
{
	return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void sl_tok_heap_push(struct sl_tok_cand *h, size_t *n, struct sl_tok_cand c)
{
	size_t i = (*n)++;
	while (i > 0) {
		size_t up = (i - 1) / 2;
		if (!sl_tok_cand_less(c, h[up]))
			break;
		h[i] = h[up];
		i = up;
	}
	h[i] = c;
}

static struct sl_tok_cand sl_tok_heap_pop(struct sl_tok_cand *h, size_t *n)
{
	struct sl_tok_cand top = h[0], last = h[--(*n)];
	size_t i = 0, cnt = *n;
	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= cnt)
			break;
		if (c + 1 < cnt && sl_tok_cand_less(h[c + 1], h[c]))
			c++;
		if (!sl_tok_cand_less(h[c], last))
			break;
		h[i] = h[c];
		i = c;
	}
	if (cnt > 0)
		h[i] = last;
	return top;
}

/*
 * BPE of a short word: repeatedly merge the adjacent pair of lowest rank,
 * the leftmost on a tie, over a compact array.  That is the order HF's
 * heap (below) merges in, at O(m^2) cost that beats a heap for small m.
 */
#define SL_TOK_SMALL_WORD 24

static int sl_tok_bpe_small(const sl_tokenizer *t, struct sl_tok_work *w,
			    const uint8_t *p, size_t m)
{
	int32_t id[SL_TOK_SMALL_WORD], rank[SL_TOK_SMALL_WORD], to[SL_TOK_SMALL_WORD];
	int k = 0;
	for (size_t i = 0; i < m; i++) {
		int32_t b = t->byte_id[p[i]];
		if (b >= 0) /* no token for this byte and no unk: dropped */
			id[k++] = b;
	}
	/* rank[i], to[i]: the merge of id[i] and id[i + 1], INT32_MAX if none */
	for (int i = 0; i + 1 < k; i++) {
		const struct sl_tok_merge *mg = sl_tok_merge_find(t, id[i], id[i + 1]);
		rank[i] = mg ? mg->rank : INT32_MAX;
		to[i] = mg ? mg->id : -1;
	}
	while (k > 1) {
		int best = 0;
		for (int i = 1; i + 1 < k; i++)
			if (rank[i] < rank[best])
				best = i;
		if (rank[best] == INT32_MAX)
			break;
		id[best] = to[best];
		for (int i = best + 1; i + 1 < k; i++) {
			id[i] = id[i + 1];
			rank[i] = rank[i + 1];
			to[i] = to[i + 1];
		}
		k--;
		for (int i = best - 1; i <= best; i++) {
			if (i < 0 || i + 1 >= k)
				continue;
			const struct sl_tok_merge *mg = sl_tok_merge_find(t, id[i], id[i + 1]);
			rank[i] = mg ? mg->rank : INT32_MAX;
			to[i] = mg ? mg->id : -1;
		}
	}
	for (int i = 0; i < k; i++)
		SL_TRY(sl_tok_push_id(w, id[i]));
	return 0;
}

/*
 * BPE one pre-token, the way HF's Word::merge_all does: a min-heap of
 * candidate pairs ordered by (rank, left position); a popped candidate is
 * stale unless the pair now at its position still has that rank.
 */
static int sl_tok_bpe(const sl_tokenizer *t, struct sl_tok_work *w,
		      const uint8_t *p, size_t m)
{
	if (m == 1) {
		int32_t id = t->byte_id[p[0]];
		return id >= 0 ? sl_tok_push_id(w, id) : 0;
	}
	if (m <= SL_TOK_SMALL_WORD)
		return sl_tok_bpe_small(t, w, p, m);
	if (m > SL_TOK_MAX_WORD)
		return sl_err(SL_EINVAL, "tokenizer: a word of %zu bytes is too long", m);
	if (m > w->word_cap) {
		size_t nc = SL_MAX(m, 2 * w->word_cap);
		struct sl_tok_sym *ns = realloc(w->sym, nc * sizeof *ns);
		if (ns)
			w->sym = ns;
		struct sl_tok_cand *nh = realloc(w->heap, 3 * nc * sizeof *nh);
		if (nh)
			w->heap = nh;
		if (!ns || !nh)
			return sl_err(SL_ENOMEM, "tokenizer: out of memory");
		w->word_cap = nc;
	}
	struct sl_tok_sym *s = w->sym;
	struct sl_tok_cand *h = w->heap;
	int32_t k = 0;
	for (size_t i = 0; i < m; i++) {
		int32_t id = t->byte_id[p[i]];
		if (id < 0)
			continue; /* no token for this byte and no unk: dropped */
		s[k].id = id;
		s[k].prev = k - 1;
		s[k].next = k + 1;
		k++;
	}
	if (k == 0)
		return 0;
	s[k - 1].next = -1;
	size_t hn = 0;
	for (int32_t i = 0; i + 1 < k; i++) {
		const struct sl_tok_merge *mg = sl_tok_merge_find(t, s[i].id, s[i + 1].id);
		if (mg)
			sl_tok_heap_push(h, &hn, (struct sl_tok_cand){ mg->rank, i });
	}
	while (hn > 0) {
		struct sl_tok_cand c = sl_tok_heap_pop(h, &hn);
		struct sl_tok_sym *a = &s[c.pos];
		if (a->id < 0 || a->next < 0)
			continue;
		int32_t nx = a->next;
		const struct sl_tok_merge *mg = sl_tok_merge_find(t, a->id, s[nx].id);
		if (!mg || mg->rank != c.rank)
			continue;
		a->id = mg->id;
		a->next = s[nx].next;
		if (a->next >= 0)
			s[a->next].prev = c.pos;
		s[nx].id = -1;
		if (a->prev >= 0) {
			mg = sl_tok_merge_find(t, s[a->prev].id, a->id);
			if (mg)
				sl_tok_heap_push(h, &hn, (struct sl_tok_cand){ mg->rank, a->prev });
		}
		if (a->next >= 0) {
			mg = sl_tok_merge_find(t, a->id, s[a->next].id);
			if (mg)
				sl_tok_heap_push(h, &hn, (struct sl_tok_cand){ mg->rank, c.pos });
		}
	}
	for (int32_t i = 0; i >= 0; i = s[i].next)
		SL_TRY(sl_tok_push_id(w, s[i].id));
	return 0;
}

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
static size_t sl_tok_next_word(const uint8_t *p, size_t i, size_t e)
{
	size_t l, m;
	int cls = sl_tok_class_at(p + i, e - i, &l);
	if (p[i] == '\'' && (m = sl_tok_contraction(p + i, e - i)) > 0)
		return i + m;
	if (cls != SL_UNI_SPACE)
		return sl_tok_run(p, i + l, e, cls);
	if (p[i] == ' ' && i + 1 < e) {
		size_t l2;
		int c2 = sl_tok_class_at(p + i + 1, e - i - 1, &l2);
		if (c2 != SL_UNI_SPACE)
			return sl_tok_run(p, i + 1 + l2, e, c2);
	}
	size_t j = i, last = i, cnt = 0;
	while (j < e) {
		size_t lj;
		if (sl_tok_class_at(p + j, e - j, &lj) != SL_UNI_SPACE)
			break;
		last = j;
		j += lj;
		cnt++;
	}
	return j < e && cnt >= 2 ? last : j;
}

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
		rc = sl_tok_lossy(text, len, &fixed, &len);
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

/* ---- decoding -------------------------------------------------------------- */

/* Whether id (>= 0) has an entry in vocab.json; one without (beyond it, or a
 * hole in it) decodes to nothing, as in HF. */
static bool has_text(const sl_tokenizer *t, int32_t id)
{
	return id < t->n_ids && (t->flags[id] & SL_TOK_PRESENT);
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
		if (has_text(t, id))
			total += t->ent[id].raw_len;
	}
	char *raw = malloc(total + 1);
	if (!raw)
		return sl_err(SL_ENOMEM, "tokenizer: out of memory");
	size_t r = 0;
	bool skip = flags & SL_TOKENIZER_SKIP_SPECIAL;
	for (size_t i = 0; i < n; i++) {
		if (!has_text(t, ids[i]) || (skip && (t->flags[ids[i]] & SL_TOK_SPECIAL)))
			continue;
		const struct sl_tok_entry *e = &t->ent[ids[i]];
		memcpy(raw + r, t->pool + e->raw_off, e->raw_len);
		r += e->raw_len;
	}
	raw[r] = 0;

	if (!(flags & SL_TOKENIZER_RAW_BYTES)) {
		char *fixed;
		size_t flen;
		if (sl_tok_lossy(raw, r, &fixed, &flen) < 0) {
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

/* ---- small queries --------------------------------------------------------- */

int sl_tokenizer_token_bytes(const sl_tokenizer *t, int32_t id, const char **bytes,
			     size_t *len)
{
	if (!t || id < 0)
		return sl_err(SL_ERANGE, "tokenizer: id %d is negative", (int)id);
	if (!has_text(t, id)) {
		*bytes = "";
		*len = 0;
		return 0;
	}
	*bytes = t->pool + t->ent[id].raw_off;
	*len = t->ent[id].raw_len;
	return 0;
}

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
