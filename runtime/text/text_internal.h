/*
 * text_internal.h - what the parts of the text layer share, and nothing
 * outside runtime/text/ includes.  The public interface is tokenizer.h.
 *
 * The parts, each with one job (docs/DESIGN.md, "The text layer"):
 *   utf8.c      UTF-8: scanning, encoding a code point, the one repair
 *               (U+FFFD per maximal subpart), the streaming stable length
 *   uniclass.c  the Unicode classes the pre-tokenizer needs (letter,
 *               number, space, other) over unicode_tables.h
 *   vocab.c     the tokenizer's tables: the byte map, the spelling and
 *               merge hash tables, the added (special) tokens, and the
 *               small queries on them; loading vocab.json + merges.txt
 *   hfjson.c    loading a Hugging Face tokenizer.json (and
 *               tokenizer_config.json) into the same tables: the
 *               pipelines it recognises, the rest refused
 *   nfc.c       NFC normalization (Qwen2's normalizer) over nfc_tables.h
 *   pretok.c    the pre-tokenizer regexes (GPT-2, Llama 3, Qwen2),
 *               written out by hand
 *   bpe.c       byte-pair merging of one pre-token (two variants: a
 *               compact array for short words, a heap for long ones)
 *   encode.c    the added-token split, the SentencePiece-style space
 *               marking, and encode/pretokenize driving pretok.c and bpe.c
 *   decode.c    ids back to bytes, repaired unless raw bytes are asked for
 */
#ifndef SL_TEXT_INTERNAL_H
#define SL_TEXT_INTERNAL_H

#include "tokenizer.h"

#include <stdbool.h>
#include <jansson.h>
#include <stdint.h>

/* ---- the tokenizer (built by vocab.c, read by the rest) ---------------- */

#define SL_TOK_MAX_ID (1 << 24)    /* ids in vocab.json stay below this */
#define SL_TOK_MAX_WORD (1u << 28) /* longest pre-token BPE accepts */

/* SL_TOK_BYTE: a "<0xNN>" token the ByteFallback decoder turns into byte
 * NN (its raw bytes are that one byte). */
enum { SL_TOK_PRESENT = 1, SL_TOK_SPECIAL = 2, SL_TOK_BYTE = 4 };

/* How a piece of text between added tokens is cut into words. */
enum sl_tok_pretok {
	SL_TOK_PRE_GPT2,   /* the GPT-2 regex (vocab.json, ByteLevel use_regex) */
	SL_TOK_PRE_LLAMA3, /* Llama 3's Split regex (digit runs of 1..3) */
	SL_TOK_PRE_QWEN2,  /* Qwen2's Split regex (single digits) */
	SL_TOK_PRE_NONE,   /* no pre-tokenizer: the piece is one word */
};

/* The SentencePiece-style space marking of a piece (U+2581 "▁"). */
enum sl_tok_spm {
	SL_TOK_SPM_OFF,           /* byte-level: no marking */
	SL_TOK_SPM_PREPEND,       /* normalizer Prepend("▁") + Replace(" ", "▁") */
	SL_TOK_SPM_META_ALWAYS,   /* Metaspace, prepend_scheme "always" */
	SL_TOK_SPM_META_FIRST,    /* Metaspace, "first": only at offset 0 */
	SL_TOK_SPM_META_NEVER,    /* Metaspace, "never": replace only */
};

/* A token split out of the text before pre-tokenizing (HF's added
 * tokens; for vocab.json, OPT's "</s>" and "<pad>"). */
struct sl_tok_added {
	char *text;
	size_t len;
	int32_t id;
	bool normalized; /* matched in the normalized text (HF's second pass) */
};

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
	size_t pool_used, pool_cap;
	int32_t *piece_hash;           /* open addressing, -1 empty */
	size_t piece_mask;
	struct sl_tok_merge *merges;   /* open addressing */
	size_t merge_mask;
	int32_t byte_id[256];          /* byte-level: id of each single byte, -1 if none */
	char byte_utf8[256][2];        /* byte-level: each byte's stand-in char */
	uint8_t byte_utf8_len[256];
	int32_t fallback_id[256];      /* byte fallback: id of "<0xNN>", -1 if none */
	struct sl_tok_added *added;    /* split out first, leftmost-longest */
	size_t n_added;
	size_t n_added_norm;           /* how many of them are "normalized" */
	int32_t bos_id, eos_id, pad_id; /* -1: none */
	bool add_bos, add_eos;         /* what SL_TOKENIZER_ADD_BOS adds */
	bool from_json;                /* tokenizer.json (strict UTF-8 input) */
	bool byte_level;               /* words are bytes (else chars, SPM) */
	bool ignore_merges;            /* a word in the vocab is one token */
	bool byte_fallback;            /* unknown char -> its <0xNN> tokens */
	bool fuse_unk;
	int32_t unk_id;
	enum sl_tok_pretok pretok;
	enum sl_tok_spm spm;
	bool meta_split;               /* Metaspace split: a word per "▁" */
	bool nfc;                      /* normalizer NFC (Qwen2) */
	bool dec_byte_fallback;        /* decoder: ByteFallback groups */
	uint8_t dec_strip;             /* decoder Strip(" ", n, 0) after Fuse */
	bool dec_meta_first;           /* Metaspace decoder: no "▁" in token 0 */
};

/* Whether id (>= 0) has an entry in vocab.json; one without (beyond it, or
 * a hole in it) decodes to nothing, as in HF. */
static inline bool sl_tok_has_text(const sl_tokenizer *t, int32_t id)
{
	return id < t->n_ids && (t->flags[id] & SL_TOK_PRESENT);
}

/* ---- the two hash tables (vocab.c fills them) -------------------------- */

/* Slot of a hash: both tables use open addressing with linear probing.
 * Spellings are hashed with FNV-1a (common/sl_hash.h), merges by key. */
static inline size_t sl_tok_mix(uint64_t x)
{
	x ^= x >> 31;
	x *= 0x9E3779B97F4A7C15ull;
	x ^= x >> 29;
	return (size_t)x;
}

static inline uint64_t sl_tok_merge_key(int32_t a, int32_t b)
{
	return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
}

/* The merge of the pair (a, b), or NULL.  Inline: BPE's inner loop. */
static inline const struct sl_tok_merge *sl_tok_merge_find(const sl_tokenizer *t, int32_t a,
							    int32_t b)
{
	uint64_t key = sl_tok_merge_key(a, b);
	for (size_t i = sl_tok_mix(key) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
		const struct sl_tok_merge *m = &t->merges[i];
		if (m->key == key)
			return m;
		if (m->key == UINT64_MAX)
			return NULL;
	}
}

/* Id of the token spelled a followed by b (b may be empty), or -1. */
int32_t sl_tok_lookup2(const sl_tokenizer *t, const char *a, size_t alen, const char *b,
		       size_t blen);

/* ---- building the tables (vocab.c, used by hfjson.c) ------------------- */

int sl_tok_read_file(const char *path, char **buf, size_t *len);

/*
 * Fill the spelling table from a vocab object {"spelling": id, ...} and
 * the added tokens (content and id, NULL ok) not in it.  t->byte_level,
 * t->dec_byte_fallback say how each spelling decodes (ByteLevel map, or
 * "▁" -> " " and "<0xNN>" -> byte).  Errors name path.
 */
int sl_tok_build_vocab(sl_tokenizer *t, const char *path, json_t *vocab, json_t *added);

/* Size the merge table for n merges. */
int sl_tok_merges_init(sl_tokenizer *t, const char *path, size_t n);

/* Add merge (a, b) with rank rank; where names it in errors. */
int sl_tok_merge_add(sl_tokenizer *t, const char *path, const char *where, const char *a,
		     size_t al, const char *b, size_t bl, int32_t rank);

/* Make id decode as the given spelling would (a normalized added token
 * decodes as its normalized form, as in HF), in room the vocabulary keeps
 * for each added token. */
int sl_tok_set_raw(sl_tokenizer *t, int32_t id, const char *spelling, size_t len);

/* Append an added token (text copied). */
int sl_tok_added_push(sl_tokenizer *t, const char *text, size_t len, int32_t id,
		      bool normalized);

/* Load DIR/tokenizer.json (hfjson.c) into t, freshly calloc'd. */
int sl_tok_load_hf(sl_tokenizer *t, const char *dir);

/* ---- UTF-8 (utf8.c) ------------------------------------------------------ */

/*
 * Look at the sequence starting at p[0] (n >= 1 bytes available).  Returns
 * its length (1..4) and sets *cp if it is well-formed UTF-8; otherwise
 * returns -k, k >= 1 being the maximal subpart (the bytes that one U+FFFD
 * replaces in HF / Rust from_utf8_lossy / Python errors="replace").  *need
 * gets the length the lead byte announces (0 for a byte that cannot lead).
 */
int sl_utf8_scan(const uint8_t *p, size_t n, uint32_t *cp, int *need);

/* Write code point cp (< 0x110000) as UTF-8 into out (4 bytes room);
 * returns its length. */
size_t sl_utf8_put(uint32_t cp, char *out);

/*
 * Replace ill-formed UTF-8 in[0..n) by U+FFFD, one per maximal subpart
 * (HF's String::from_utf8_lossy, Python's errors="replace").  *out is a
 * malloc'd NUL-terminated copy, or NULL when in is already well-formed.
 */
int sl_utf8_lossy(const char *in, size_t n, char **out, size_t *olen);

/* ---- Unicode classes (uniclass.c) --------------------------------------- */

/* The classes: the values of unicode_tables.h's SL_UNI_* (checked in
 * uniclass.c), which only uniclass.c includes, as it holds the tables. */
enum { SL_TOK_OTHER = 0, SL_TOK_LETTER = 1, SL_TOK_NUMBER = 2, SL_TOK_SPACE = 3 };

extern const uint8_t sl_tok_ascii_class[128];

/* Class and length of a character that does not start with an ASCII byte. */
int sl_tok_class_at_nonascii(const uint8_t *p, size_t n, size_t *len);

/* Class and length of the character at p[0] (n >= 1 bytes); a byte outside
 * well-formed UTF-8 is one character of class "other" (like U+FFFD). */
static inline int sl_tok_class_at(const uint8_t *p, size_t n, size_t *len)
{
	if (p[0] < 0x80) {
		*len = 1;
		return sl_tok_ascii_class[p[0]];
	}
	return sl_tok_class_at_nonascii(p, n, len);
}

/* ---- encoding (encode.c, pretok.c, bpe.c) ------------------------------- */

/* The scratch of one encode call. */
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
	int32_t *init;    /* a word's symbols before merging */
	size_t init_cap;
	char *buf;        /* a word's spelling (ignore_merges) */
	size_t buf_cap;
	char *mark;       /* a SentencePiece-style piece with its "▁" marks */
	size_t mark_cap;
	unsigned flags;   /* the encode's SL_TOKENIZER_* flags */
};

/* Append id to w->ids. */
int sl_tok_push_id(struct sl_tok_work *w, int32_t id);

/* BPE the m bytes of one pre-token at p, appending its ids to w. */
int sl_tok_bpe(const sl_tokenizer *t, struct sl_tok_work *w, const uint8_t *p, size_t m);

/* The end of the pre-token (GPT-2 regex) that starts at p[i], i < e. */
size_t sl_tok_next_word(const uint8_t *p, size_t i, size_t e);

/* The same for Llama 3's regex (digits at most 3 to a word) or, with
 * digits1, Qwen2's (one digit a word). */
size_t sl_tok_next_word_llama3(const uint8_t *p, size_t i, size_t e, bool digits1);

/* NFC of n bytes of UTF-8 (nfc.c): *out a malloc'd copy, or NULL when
 * the text is unchanged. */
int sl_tok_nfc(const uint8_t *p, size_t n, char **out, size_t *olen);

/* Grow a scratch array to hold n items of size sz. */
int sl_tok_grow(void **a, size_t *cap, size_t n, size_t sz);

#endif
