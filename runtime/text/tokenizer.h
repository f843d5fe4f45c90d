/*
 * tokenizer.h - a checkpoint's tokenizer, matching the `tokenizers`
 * library: OPT's GPT-2 byte-level BPE (vocab.json + merges.txt), or a
 * Hugging Face tokenizer.json of the LLaMA family (below).
 *
 * vocab.json + merges.txt.  Encoding is what HF's OPT/GPT-2 tokenizer
 * gives for `tok(text, add_special_tokens=False)`:
 *   1. Special tokens are split out first: the literal strings "</s>" and
 *      "<pad>" anywhere in the text become their ids (leftmost-longest
 *      match, no stripping of neighbouring spaces), exactly as HF does for
 *      OPT, whose special tokens are bos = eos = unk = "</s>" and
 *      pad = "<pad>".  "<s>" and "<unk>" are NOT special in HF's OPT
 *      tokenizer and are encoded as ordinary text.  SL_TOKENIZER_NO_SPECIAL
 *      turns the splitting off (HF's split_special_tokens=True).
 *   2. Each remaining piece is cut by the GPT-2 pre-tokenizer regex
 *        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *      over UTF-8, with HF's Unicode 16.0 letter/number classes and
 *      White_Space for \s (no prefix space is added).
 *   3. Each word's bytes are mapped through GPT-2's bytes_to_unicode table
 *      and merged by BPE rank (lowest rank first, leftmost on ties).
 * Invalid UTF-8: HF cannot receive it (its input is a Rust/Python string).
 * Here every byte that is not part of a well-formed UTF-8 sequence is kept
 * as its own byte and classified as "other" (neither letter, number nor
 * space) - the class of U+FFFD, so the word boundaries are the ones HF
 * gives for the text with each such byte replaced by U+FFFD, and BPE then
 * runs on the raw bytes.  Encoding never fails on any byte string, and
 * decoding with SL_TOKENIZER_RAW_BYTES gives those bytes back.  With
 * SL_TOKENIZER_REPLACE_INVALID each maximal ill-formed subsequence is
 * first replaced by U+FFFD, giving exactly HF's ids for
 * tok(raw.decode("utf-8", errors="replace")).
 * BOS: HF's OPT tokenizer prepends "</s>" (id 2) to every encoded text when
 * add_special_tokens=True (the default).  sl_tokenizer_encode never adds
 * it; pass SL_TOKENIZER_ADD_BOS to sl_tokenizer_encode_ex, or prepend
 * sl_tokenizer_bos_id() yourself.
 *
 * tokenizer.json, read instead of vocab.json + merges.txt when the folder
 * has it (transformers' fast tokenizers do the same).  Two kinds, each
 * recognised whole; any other normalizer, pre-tokenizer, model, decoder
 * or post-processor is refused (SL_EUNSUPPORTED, one line naming the file
 * and the part):
 *   - byte-level BPE: pre_tokenizer Sequence[Split(Llama 3's or Qwen2's
 *     regex, Isolated), ByteLevel(use_regex=false)] or ByteLevel(use_regex)
 *     (GPT-2's regex, above); normalizer none or NFC (Qwen2); decoder
 *     ByteLevel.  Llama 3's regex:
 *       (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *        ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *     Qwen2's is the same with \p{N} for \p{N}{1,3}.  The patterns are
 *     compared as strings and implemented by hand (pretok.c).
 *   - SentencePiece-style BPE (Llama 2, Mistral): normalizer
 *     Prepend("▁") + Replace(" ", "▁") with no pre-tokenizer (a piece
 *     between added tokens is one word, "▁" put in front), or the
 *     Metaspace pre-tokenizer (prepend_scheme always / first / never,
 *     split or not); BPE over characters, a character not in the
 *     vocabulary becoming its <0xNN> byte tokens (byte_fallback) or unk
 *     (fuse_unk fusing a run); decoder Replace("▁", " ") [+ ByteFallback]
 *     [+ Fuse [+ Strip(" ", n, 0)]], or Metaspace.
 *   The BPE model's ignore_merges (Llama 3: a word in the vocabulary is one
 *   token), unk_token, byte_fallback and fuse_unk are honoured; dropout,
 *   continuing_subword_prefix and end_of_word_suffix refused.  Merges may
 *   be "a b" strings or ["a", "b"] pairs.  Every added token (special or
 *   not) is split out of the text first, leftmost-longest, as for OPT; one
 *   marked "normalized" is split out of each piece after the normalizer,
 *   looked for as its own content normalized ("▁<s>" behind Prepend), and
 *   decodes as that (" <s>"), as in HF.  lstrip, rstrip and single_word
 *   are refused.  The special ones are sl_tokenizer_is_special and dropped
 *   by SL_TOKENIZER_SKIP_SPECIAL.
 *   SL_TOKENIZER_ADD_BOS adds what add_special_tokens=True adds: the
 *   post_processor's TemplateProcessing "[BOS] $A [EOS]" (either optional;
 *   other templates are refused), overridden by tokenizer_config.json's
 *   add_bos_token / add_eos_token, whose bos_token, eos_token and pad_token
 *   give the ids (as transformers' Llama tokenizer does).
 *   The input must be UTF-8, as HF's is: an ill-formed byte is refused
 *   (SL_EFORMAT naming the byte and its offset), unless
 *   SL_TOKENIZER_REPLACE_INVALID replaces it by U+FFFD first.
 *   Decoding follows the decoder: ByteLevel as for OPT; the
 *   SentencePiece-style ones give "▁" as a space, a run of byte tokens as
 *   its bytes when they are valid UTF-8 and else one U+FFFD per byte
 *   (ByteFallback), and strip the decoded text's leading spaces (Strip; for
 *   Metaspace, every "▁" of the first token).  sl_tokenizer_token_bytes
 *   gives a token's bytes without that strip.
 *
 * Decoding concatenates each token's bytes (the inverse byte mapping of its
 * vocab string; special tokens give their text, e.g. "</s>"; an id with no
 * entry in vocab.json, beyond it or a hole in it, gives nothing, as in HF,
 * whose decode drops such ids: a model's vocab_size may exceed its
 * tokenizer's, 50272 against 50265 for OPT) and, unless
 * SL_TOKENIZER_RAW_BYTES, replaces invalid UTF-8 in the result by U+FFFD
 * the way HF does (maximal subparts), which equals HF's
 * `tokenizers.Tokenizer.decode(ids, skip_special_tokens=False)`, i.e.
 * transformers' decode with clean_up_tokenization_spaces=False.
 * Special tokens are kept unless SL_TOKENIZER_SKIP_SPECIAL.
 *
 * Ownership and threads: sl_tokenizer_load returns a tokenizer the caller
 * frees with sl_tokenizer_free.  It is immutable after loading, so any
 * number of threads may encode/decode with it at once.  Arrays and strings
 * returned through ids / text are malloc'd and owned by the caller (free()).
 * Pointers returned by sl_tokenizer_token_bytes point into the tokenizer
 * and live until sl_tokenizer_free.
 *
 * Errors: 0 or a negative SL_E* code with a message (sl_errmsg()) naming
 * the file and, for merges.txt, the line (for tokenizer.json, the merge's
 * index or the part refused).
 *
 * The implementation is the text layer's parts in runtime/text/, one job
 * each (text_internal.h lists them).
 */
#ifndef SL_TOKENIZER_H
#define SL_TOKENIZER_H

#include "sl_common.h"

#include <stdbool.h>

typedef struct sl_tokenizer sl_tokenizer;

/* Flags for sl_tokenizer_encode_ex. */
enum {
	SL_TOKENIZER_ADD_BOS = 1u << 0,    /* add_special_tokens: OPT's "</s>" */
	SL_TOKENIZER_NO_SPECIAL = 1u << 1, /* added tokens in text are plain text */
	SL_TOKENIZER_REPLACE_INVALID = 1u << 2, /* invalid UTF-8 -> U+FFFD first */
};

/* Flags for sl_tokenizer_decode_ex. */
enum {
	SL_TOKENIZER_SKIP_SPECIAL = 1u << 0, /* drop "</s>" and "<pad>" ids */
	SL_TOKENIZER_RAW_BYTES = 1u << 1,    /* no U+FFFD replacement */
};

/*
 * Read DIR/tokenizer.json (with DIR/tokenizer_config.json if present), or
 * else DIR/vocab.json and DIR/merges.txt.  A missing file gives
 * SL_ENOTFOUND, an unreadable one SL_EIO, bad contents SL_EFORMAT (bad
 * JSON, a non-integer or negative or duplicate id, ids >= 2^24, a merges
 * line that is not "A B", a merge token not in vocab.json).  As in HF,
 * lines of merges.txt starting with "#version" are skipped, an empty line
 * is an error, "\r\n" line ends are accepted, ranks follow the order of
 * the merge lines and a repeated pair takes its later rank.
 */
int sl_tokenizer_load(const char *dir, sl_tokenizer **out);
void sl_tokenizer_free(sl_tokenizer *t); /* NULL ok */

/*
 * Encode len bytes of text (need not be NUL-terminated; any bytes).  On
 * success *ids is a malloc'd array of *n ids (non-NULL even when *n == 0).
 * No BOS is added.  SL_EINVAL for NULL arguments, SL_ENOMEM, SL_EFORMAT for
 * ill-formed UTF-8 given to a tokenizer.json tokenizer.
 */
int sl_tokenizer_encode(const sl_tokenizer *t, const char *text, size_t len,
			int32_t **ids, size_t *n);
int sl_tokenizer_encode_ex(const sl_tokenizer *t, const char *text, size_t len,
			   unsigned flags, int32_t **ids, size_t *n);

/*
 * Debugging and tests: where the pieces of encode end (before BPE).  On
 * success *ends is a malloc'd array of *n byte offsets, increasing, the
 * last one len; piece k spans [k ? ends[k-1] : 0, ends[k]).  A split-out
 * special token is a piece of its own.  flags as for encode_ex, but
 * ADD_BOS and REPLACE_INVALID are ignored.
 */
int sl_tokenizer_pretokenize(const sl_tokenizer *t, const char *text, size_t len,
			     unsigned flags, size_t **ends, size_t *n);

/*
 * Decode n ids into a malloc'd, NUL-terminated string *text of *len bytes
 * (the NUL not counted).  sl_tokenizer_decode keeps special tokens and
 * replaces invalid UTF-8 by U+FFFD (= HF decode).  An id without an entry
 * in vocab.json (>= sl_tokenizer_vocab_size, or a hole) adds nothing; a
 * negative id gives SL_ERANGE.
 */
int sl_tokenizer_decode(const sl_tokenizer *t, const int32_t *ids, size_t n,
			char **text, size_t *len);
int sl_tokenizer_decode_ex(const sl_tokenizer *t, const int32_t *ids, size_t n,
			   unsigned flags, char **text, size_t *len);

/*
 * Streaming: the raw bytes one token contributes to a decode (no U+FFFD
 * replacement; a token may hold part of a UTF-8 character; none for an id
 * without an entry in vocab.json).  O(1).  SL_ERANGE for a negative id.
 */
int sl_tokenizer_token_bytes(const sl_tokenizer *t, int32_t id,
			     const char **bytes, size_t *len);

/*
 * Streaming: how many leading bytes of buf are final, i.e. will decode the
 * same whatever bytes are appended: len minus a trailing incomplete (but so
 * far well-formed) UTF-8 sequence.  Print that prefix, keep the rest.
 */
size_t sl_tokenizer_utf8_stable_len(const char *buf, size_t len);

/*
 * A malloc'd, NUL-terminated copy *out (*olen bytes) of in[0..n) with
 * ill-formed UTF-8 replaced by U+FFFD, one per maximal subpart, as
 * sl_tokenizer_decode does (HF's decode, Python's errors="replace"): the
 * one repair for any text sluice writes as JSON.
 */
int sl_tokenizer_utf8_repair(const char *in, size_t n, char **out, size_t *olen);

/* One more than the largest id in vocab.json (tokenizer.json: in the
 * vocabulary or the added tokens). */
int32_t sl_tokenizer_vocab_size(const sl_tokenizer *t);

/* Id of a token spelled as in vocab.json (e.g. "Ġthe", "</s>"), or -1. */
int32_t sl_tokenizer_token_id(const sl_tokenizer *t, const char *piece, size_t len);

/* OPT's special ids: bos = eos = "</s>" (2), pad = "<pad>" (1); -1 if the
 * vocabulary lacks the token.  tokenizer.json: as its template and
 * tokenizer_config.json say; -1 where they name none. */
int32_t sl_tokenizer_bos_id(const sl_tokenizer *t);
int32_t sl_tokenizer_eos_id(const sl_tokenizer *t);
int32_t sl_tokenizer_pad_id(const sl_tokenizer *t);

/* Whether id is one of the special tokens ("</s>", "<pad>"; for
 * tokenizer.json the added tokens marked special). */
bool sl_tokenizer_is_special(const sl_tokenizer *t, int32_t id);

/* Whether SL_TOKENIZER_ADD_BOS prepends sl_tokenizer_bos_id(). */
bool sl_tokenizer_adds_bos(const sl_tokenizer *t);

/* Whether DIR holds a tokenizer sl_tokenizer_load reads (tokenizer.json,
 * or vocab.json); without one a model runs on input_ids only. */
bool sl_tokenizer_present(const char *dir);

#endif
