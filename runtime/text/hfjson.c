/*
 * hfjson.c - loading a Hugging Face tokenizer.json (the `tokenizers`
 * library's format) into the tables of vocab.c, and the BOS/EOS/pad
 * choices of tokenizer_config.json beside it.
 *
 * Only the pipelines of the LLaMA family (and GPT-2's) are accepted, each
 * recognised whole; anything else is refused in one line naming the file
 * and the part (tokenizer.h lists them):
 *   byte-level BPE: pre_tokenizer ByteLevel(use_regex) (the GPT-2 regex)
 *     or Sequence[Split(Llama 3's or Qwen2's regex), ByteLevel(no regex)];
 *     decoder ByteLevel; normalizer none or NFC (Qwen2's).
 *   SentencePiece-style BPE: normalizer Prepend("▁") + Replace(" ", "▁")
 *     and no pre_tokenizer, or Metaspace; decoder Replace("▁", " "),
 *     ByteFallback, Fuse, Strip(" ", n, 0) in that order, or Metaspace.
 * The regexes are compared as strings: they are implemented by hand in
 * pretok.c, not by a regex engine.
 */
#include "text_internal.h"

#include <string.h>

/* The Split patterns pretok.c implements. */
static const char sl_tok_re_llama3[] =
	"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char sl_tok_re_qwen2[] =
	"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

#define SL_TOK_MARK "\xe2\x96\x81" /* U+2581, SentencePiece's space */

static const char *sl_tok_type(json_t *o)
{
	const char *s = json_string_value(json_object_get(o, "type"));
	return s ? s : "";
}

static bool sl_tok_is(json_t *o, const char *type)
{
	return json_is_object(o) && strcmp(sl_tok_type(o), type) == 0;
}

static bool sl_tok_true(json_t *o, const char *key)
{
	return json_is_true(json_object_get(o, key));
}

/* A string field, NULL when absent or null, "" when not a string. */
static const char *sl_tok_str(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);
	if (!v || json_is_null(v))
		return NULL;
	return json_is_string(v) ? json_string_value(v) : "";
}

/* A Replace's {"String": s} pattern equal to from, content equal to to. */
static bool sl_tok_replace_is(json_t *o, const char *from, const char *to)
{
	const char *c = sl_tok_str(o, "content");
	const char *f = sl_tok_str(json_object_get(o, "pattern"), "String");
	return sl_tok_is(o, "Replace") && f && c && !strcmp(f, from) && !strcmp(c, to);
}

static int sl_tok_refuse(const char *path, const char *what, json_t *o)
{
	char *s = o ? json_dumps(o, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
	int rc = sl_err(SL_EUNSUPPORTED, "%s: %s %.200s is not supported (sluice reads the "
			"byte-level BPE of GPT-2, Llama 3 and Qwen2 and the SentencePiece-style "
			"BPE of Llama 2 and Mistral)", path, what, s ? s : "null");
	free(s);
	return rc;
}

/* Metaspace's options into t->spm and t->meta_split. */
static int sl_tok_metaspace(sl_tokenizer *t, const char *path, json_t *o)
{
	const char *r = sl_tok_str(o, "replacement");
	if (!r || strcmp(r, SL_TOK_MARK))
		return sl_tok_refuse(path, "Metaspace replacement", json_object_get(o, "replacement"));
	const char *sch = sl_tok_str(o, "prepend_scheme");
	if (!sch) /* older files: add_prefix_space */
		sch = sl_tok_true(o, "add_prefix_space") ? "always" : "never";
	if (!strcmp(sch, "always"))
		t->spm = SL_TOK_SPM_META_ALWAYS;
	else if (!strcmp(sch, "first"))
		t->spm = SL_TOK_SPM_META_FIRST;
	else if (!strcmp(sch, "never"))
		t->spm = SL_TOK_SPM_META_NEVER;
	else
		return sl_tok_refuse(path, "Metaspace prepend_scheme", json_object_get(o, "prepend_scheme"));
	json_t *split = json_object_get(o, "split");
	t->meta_split = !split || json_is_true(split);
	return 0;
}

static int sl_tok_parse_pretok(sl_tokenizer *t, const char *path, json_t *pt)
{
	t->pretok = SL_TOK_PRE_NONE;
	if (!pt || json_is_null(pt))
		return 0;
	if (sl_tok_is(pt, "ByteLevel")) {
		json_t *re = json_object_get(pt, "use_regex");
		if (sl_tok_true(pt, "add_prefix_space") || (re && !json_is_true(re)))
			return sl_tok_refuse(path, "pre_tokenizer", pt);
		t->byte_level = true;
		t->pretok = SL_TOK_PRE_GPT2;
		return 0;
	}
	if (sl_tok_is(pt, "Metaspace"))
		return sl_tok_metaspace(t, path, pt);
	json_t *seq = json_object_get(pt, "pretokenizers");
	if (!sl_tok_is(pt, "Sequence") || json_array_size(seq) != 2)
		return sl_tok_refuse(path, "pre_tokenizer", pt);
	json_t *sp = json_array_get(seq, 0), *bl = json_array_get(seq, 1);
	if (!sl_tok_is(sp, "Split") || !sl_tok_is(bl, "ByteLevel") ||
	    sl_tok_true(bl, "add_prefix_space") || sl_tok_true(bl, "use_regex"))
		return sl_tok_refuse(path, "pre_tokenizer", pt);
	const char *beh = sl_tok_str(sp, "behavior");
	if (!beh || strcmp(beh, "Isolated") || sl_tok_true(sp, "invert"))
		return sl_tok_refuse(path, "pre_tokenizer Split (behavior Isolated, not inverted, "
				     "is the one read):", sp);
	const char *re = sl_tok_str(json_object_get(sp, "pattern"), "Regex");
	if (re && !strcmp(re, sl_tok_re_llama3))
		t->pretok = SL_TOK_PRE_LLAMA3;
	else if (re && !strcmp(re, sl_tok_re_qwen2))
		t->pretok = SL_TOK_PRE_QWEN2;
	else
		return sl_err(SL_EUNSUPPORTED, "%s: pre_tokenizer Split pattern %.300s is not one "
			      "sluice implements (Llama 3's or Qwen2's regex)", path,
			      re ? re : "(not a Regex)");
	t->byte_level = true;
	return 0;
}

static int sl_tok_parse_normalizer(sl_tokenizer *t, const char *path, json_t *n)
{
	if (!n || json_is_null(n))
		return 0;
	if (t->spm != SL_TOK_SPM_OFF)
		return sl_tok_refuse(path, "normalizer (beside a Metaspace pre_tokenizer)", n);
	if (sl_tok_is(n, "NFC")) {
		t->nfc = true;
		return 0;
	}
	json_t *seq = json_object_get(n, "normalizers");
	if (sl_tok_is(n, "Sequence") && json_array_size(seq) == 2) {
		json_t *a = json_array_get(seq, 0), *b = json_array_get(seq, 1);
		if (sl_tok_is(b, "Prepend")) {
			json_t *x = a;
			a = b;
			b = x;
		}
		const char *pre = sl_tok_str(a, "prepend");
		if (sl_tok_is(a, "Prepend") && pre && !strcmp(pre, SL_TOK_MARK) &&
		    sl_tok_replace_is(b, " ", SL_TOK_MARK)) {
			t->spm = SL_TOK_SPM_PREPEND;
			return 0;
		}
	}
	return sl_tok_refuse(path, "normalizer", n);
}

static int sl_tok_parse_decoder(sl_tokenizer *t, const char *path, json_t *d, bool *byte_level)
{
	*byte_level = false;
	if (sl_tok_is(d, "ByteLevel")) {
		*byte_level = true;
		return 0;
	}
	if (sl_tok_is(d, "Metaspace")) {
		const char *r = sl_tok_str(d, "replacement");
		const char *sch = sl_tok_str(d, "prepend_scheme");
		if (!r || strcmp(r, SL_TOK_MARK))
			return sl_tok_refuse(path, "decoder", d);
		t->dec_meta_first = sch ? strcmp(sch, "never") != 0 : sl_tok_true(d, "add_prefix_space");
		return 0;
	}
	/* Replace("▁", " "), ByteFallback, Fuse, Strip(" ", n, 0): each
	 * optional but in this order, Fuse before Strip. */
	json_t *seq = json_object_get(d, "decoders");
	if (!sl_tok_is(d, "Sequence") || !json_is_array(seq))
		return sl_tok_refuse(path, "decoder", d);
	size_t i = 0, n = json_array_size(seq);
	bool replace = false, fuse = false;
	json_t *x = json_array_get(seq, i);
	if (i < n && sl_tok_replace_is(x, SL_TOK_MARK, " ")) {
		replace = true;
		x = json_array_get(seq, ++i);
	}
	if (i < n && sl_tok_is(x, "ByteFallback")) {
		t->dec_byte_fallback = true;
		x = json_array_get(seq, ++i);
	}
	if (i < n && sl_tok_is(x, "Fuse")) {
		fuse = true;
		x = json_array_get(seq, ++i);
	}
	if (i < n && fuse && sl_tok_is(x, "Strip")) {
		const char *c = sl_tok_str(x, "content");
		json_t *st = json_object_get(x, "start"), *sp = json_object_get(x, "stop");
		if (!c || strcmp(c, " ") || !json_is_integer(st) || json_integer_value(st) < 0 ||
		    json_integer_value(st) > 8 || !json_is_integer(sp) || json_integer_value(sp) != 0)
			return sl_tok_refuse(path, "decoder Strip", x);
		t->dec_strip = (uint8_t)json_integer_value(st);
		i++;
	}
	if (i != n || !replace)
		return sl_tok_refuse(path, "decoder", d);
	return 0;
}

/* The model: BPE with its options, then its vocab (with the added tokens)
 * and merges. */
static int sl_tok_parse_model(sl_tokenizer *t, const char *path, json_t *m, json_t *added)
{
	if (!sl_tok_is(m, "BPE"))
		return sl_tok_refuse(path, "model type", json_object_get(m, "type"));
	json_t *dr = json_object_get(m, "dropout");
	const char *csp = sl_tok_str(m, "continuing_subword_prefix");
	const char *ews = sl_tok_str(m, "end_of_word_suffix");
	if ((dr && !json_is_null(dr)) || (csp && *csp) || (ews && *ews))
		return sl_err(SL_EUNSUPPORTED, "%s: BPE dropout, continuing_subword_prefix and "
			      "end_of_word_suffix are not supported", path);
	t->byte_fallback = sl_tok_true(m, "byte_fallback");
	t->ignore_merges = sl_tok_true(m, "ignore_merges");
	t->fuse_unk = sl_tok_true(m, "fuse_unk");
	SL_TRY(sl_tok_build_vocab(t, path, json_object_get(m, "vocab"), added));
	const char *unk = sl_tok_str(m, "unk_token");
	if (unk) {
		t->unk_id = sl_tok_lookup2(t, unk, strlen(unk), "", 0);
		if (t->unk_id < 0)
			return sl_err(SL_EFORMAT, "%s: unk_token \"%.60s\" is not in the vocabulary",
				      path, unk);
	}

	json_t *merges = json_object_get(m, "merges");
	if (!json_is_array(merges))
		return sl_err(SL_EFORMAT, "%s: model.merges is not an array", path);
	SL_TRY(sl_tok_merges_init(t, path, json_array_size(merges)));
	size_t i;
	json_t *mg;
	json_array_foreach(merges, i, mg) {
		char where[48];
		snprintf(where, sizeof where, ": merges[%zu]", i);
		const char *a = NULL, *b = NULL;
		size_t al = 0, bl = 0;
		if (json_is_string(mg)) { /* "a b", the older form */
			a = json_string_value(mg);
			const char *sp = strchr(a, ' ');
			if (sp && !strchr(sp + 1, ' ')) {
				al = (size_t)(sp - a);
				b = sp + 1;
				bl = strlen(b);
			}
		} else if (json_is_array(mg) && json_array_size(mg) == 2 &&
			   json_is_string(json_array_get(mg, 0)) &&
			   json_is_string(json_array_get(mg, 1))) {
			a = json_string_value(json_array_get(mg, 0));
			al = json_string_length(json_array_get(mg, 0));
			b = json_string_value(json_array_get(mg, 1));
			bl = json_string_length(json_array_get(mg, 1));
		}
		if (!b)
			return sl_err(SL_EFORMAT, "%s%s: a merge is \"A B\" or [\"A\", \"B\"]", path,
				      where);
		SL_TRY(sl_tok_merge_add(t, path, where, a, al, b, bl, (int32_t)i));
	}
	return 0;
}

/* The added tokens: checked, then split out of text (all of them, special
 * or not, as HF does: the "normalized" ones from the normalized text); the
 * special ones are skipped by SKIP_SPECIAL. */
static int sl_tok_check_added(sl_tokenizer *t, const char *path, json_t *added)
{
	if (!added)
		return 0;
	if (!json_is_array(added))
		return sl_err(SL_EFORMAT, "%s: added_tokens is not an array", path);
	size_t i;
	json_t *a;
	json_array_foreach(added, i, a) {
		json_t *c = json_object_get(a, "content");
		if (!json_is_string(c) || json_string_length(c) == 0 ||
		    strlen(json_string_value(c)) != json_string_length(c) ||
		    !json_is_integer(json_object_get(a, "id")))
			return sl_err(SL_EFORMAT, "%s: added_tokens[%zu] needs a non-empty "
				      "\"content\" and an integer \"id\"", path, i);
		if (sl_tok_true(a, "single_word") || sl_tok_true(a, "lstrip") ||
		    sl_tok_true(a, "rstrip"))
			return sl_err(SL_EUNSUPPORTED, "%s: added token \"%.60s\": single_word, "
				      "lstrip and rstrip are not supported", path,
				      json_string_value(c));
	}
	return 0;
}

/* A special token of the template (its "id" is the token's spelling). */
static int sl_tok_template_id(sl_tokenizer *t, const char *path, json_t *item, int32_t *id)
{
	const char *s = sl_tok_str(json_object_get(item, "SpecialToken"), "id");
	*id = s ? sl_tok_lookup2(t, s, strlen(s), "", 0) : -1;
	if (*id < 0)
		return sl_err(SL_EFORMAT, "%s: post_processor's special token \"%.60s\" is not in "
			      "the vocabulary", path, s ? s : "");
	return 0;
}

/* What add_special_tokens=True adds to one text: the post_processor's
 * single template [bos?] $A [eos?], or nothing. */
static int sl_tok_parse_post(sl_tokenizer *t, const char *path, json_t *pp)
{
	if (!pp || json_is_null(pp) || sl_tok_is(pp, "ByteLevel"))
		return 0;
	if (sl_tok_is(pp, "Sequence")) {
		size_t i;
		json_t *p;
		json_array_foreach(json_object_get(pp, "processors"), i, p)
			SL_TRY(sl_tok_parse_post(t, path, p));
		return 0;
	}
	json_t *single = json_object_get(pp, "single");
	size_t n = json_array_size(single), a = n;
	if (!sl_tok_is(pp, "TemplateProcessing") || n == 0 || n > 3)
		return sl_tok_refuse(path, "post_processor", pp);
	for (size_t i = 0; i < n; i++)
		if (json_object_get(json_array_get(single, i), "Sequence"))
			a = i;
	if (a == n || a > 1 || n - a > 2)
		return sl_tok_refuse(path, "post_processor", pp);
	if (a == 1) {
		SL_TRY(sl_tok_template_id(t, path, json_array_get(single, 0), &t->bos_id));
		t->add_bos = true;
	}
	if (n - a == 2) {
		SL_TRY(sl_tok_template_id(t, path, json_array_get(single, a + 1), &t->eos_id));
		t->add_eos = true;
	}
	return 0;
}

/* tokenizer_config.json: bos/eos/pad tokens and add_bos_token /
 * add_eos_token, which transformers' Llama tokenizer applies over the
 * post_processor.  Optional. */
static int sl_tok_parse_config(sl_tokenizer *t, const char *dir)
{
	char path[4200];
	snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
	json_error_t jerr;
	json_t *root = json_load_file(path, 0, &jerr);
	if (!root) {
		FILE *f = fopen(path, "rb");
		if (!f)
			return 0;
		fclose(f);
		return sl_err(SL_EFORMAT, "%s:%d:%d: bad JSON: %s", path, jerr.line, jerr.column,
			      jerr.text);
	}
	int rc = 0;
	static const char *const keys[] = { "bos_token", "eos_token", "pad_token" };
	int32_t *ids[] = { &t->bos_id, &t->eos_id, &t->pad_id };
	for (int k = 0; k < 3 && rc == 0; k++) {
		json_t *v = json_object_get(root, keys[k]);
		if (json_is_object(v))
			v = json_object_get(v, "content");
		if (!json_is_string(v))
			continue;
		int32_t id = sl_tok_lookup2(t, json_string_value(v), json_string_length(v), "", 0);
		if (id < 0)
			rc = sl_err(SL_EFORMAT, "%s: %s \"%.60s\" is not in tokenizer.json", path,
				    keys[k], json_string_value(v));
		*ids[k] = id;
	}
	json_t *ab = json_object_get(root, "add_bos_token");
	json_t *ae = json_object_get(root, "add_eos_token");
	if (json_is_boolean(ab))
		t->add_bos = json_is_true(ab);
	if (json_is_boolean(ae))
		t->add_eos = json_is_true(ae);
	if (rc == 0 && ((t->add_bos && t->bos_id < 0) || (t->add_eos && t->eos_id < 0)))
		rc = sl_err(SL_EFORMAT, "%s: add_%s_token is true but there is no %s_token", path,
			    t->add_bos && t->bos_id < 0 ? "bos" : "eos",
			    t->add_bos && t->bos_id < 0 ? "bos" : "eos");
	json_decref(root);
	return rc;
}

/* Add an added token.  A "normalized" one is matched in the normalized
 * text by its own content normalized (HF normalizes it with the same
 * normalizer): "<s>" is looked for as "▁<s>" behind Prepend("▁"), and
 * decodes as that, " <s>". */
static int sl_tok_push_added(sl_tokenizer *t, const char *c, size_t cl, int32_t id,
			     bool normalized)
{
	if (!normalized || (t->spm != SL_TOK_SPM_PREPEND && !t->nfc))
		return sl_tok_added_push(t, c, cl, id, normalized);
	char *m = NULL;
	size_t ml = 0;
	if (t->nfc) {
		SL_TRY(sl_tok_nfc((const uint8_t *)c, cl, &m, &ml));
		if (!m)
			return sl_tok_added_push(t, c, cl, id, true);
	} else {
		m = malloc(3 * cl + 4);
		if (!m)
			return sl_err(SL_ENOMEM, "tokenizer: out of memory");
		memcpy(m, SL_TOK_MARK, 3);
		ml = 3;
		for (size_t i = 0; i < cl; i++) {
			if (c[i] == ' ') {
				memcpy(m + ml, SL_TOK_MARK, 3);
				ml += 3;
			} else {
				m[ml++] = c[i];
			}
		}
	}
	/* and it decodes as its normalized form: "<s>" as " <s>" */
	int rc = sl_tok_added_push(t, m, ml, id, true);
	if (rc == 0)
		rc = sl_tok_set_raw(t, id, m, ml);
	free(m);
	return rc;
}

int sl_tok_load_hf(sl_tokenizer *t, const char *dir)
{
	char path[4200];
	snprintf(path, sizeof path, "%s/tokenizer.json", dir);
	char *buf;
	size_t len;
	SL_TRY(sl_tok_read_file(path, &buf, &len));
	json_error_t jerr;
	json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
	free(buf);
	if (!root)
		return sl_err(SL_EFORMAT, "%s:%d:%d: bad JSON: %s", path, jerr.line, jerr.column,
			      jerr.text);
	t->from_json = true;
	json_t *added = json_object_get(root, "added_tokens");
	bool dec_bl = false;
	int rc = json_is_object(root) ? 0 : sl_err(SL_EFORMAT, "%s: not a JSON object", path);
	if (rc == 0)
		rc = sl_tok_parse_pretok(t, path, json_object_get(root, "pre_tokenizer"));
	if (rc == 0)
		rc = sl_tok_parse_normalizer(t, path, json_object_get(root, "normalizer"));
	if (rc == 0)
		rc = sl_tok_parse_decoder(t, path, json_object_get(root, "decoder"), &dec_bl);
	if (rc == 0 && t->byte_level && (t->spm != SL_TOK_SPM_OFF || !dec_bl))
		rc = sl_err(SL_EUNSUPPORTED, "%s: a ByteLevel pre_tokenizer needs the ByteLevel "
			    "decoder and no normalizer but NFC", path);
	if (rc == 0 && !t->byte_level && t->nfc)
		rc = sl_tok_refuse(path, "normalizer NFC without a ByteLevel pre_tokenizer", NULL);
	if (rc == 0 && !t->byte_level && (t->spm == SL_TOK_SPM_OFF || dec_bl))
		rc = sl_err(SL_EUNSUPPORTED, "%s: without a ByteLevel pre_tokenizer sluice reads "
			    "only the SentencePiece-style pipeline (Prepend + Replace normalizer or "
			    "Metaspace, and its decoder)", path);
	if (rc == 0)
		rc = sl_tok_check_added(t, path, added);
	if (rc == 0)
		rc = sl_tok_parse_model(t, path, json_object_get(root, "model"), added);
	for (size_t i = 0; rc == 0 && i < json_array_size(added); i++) {
		json_t *a = json_array_get(added, i);
		json_t *c = json_object_get(a, "content");
		int32_t id = (int32_t)json_integer_value(json_object_get(a, "id"));
		rc = sl_tok_push_added(t, json_string_value(c), json_string_length(c), id,
				       sl_tok_true(a, "normalized"));
		if (sl_tok_true(a, "special"))
			t->flags[id] |= SL_TOK_SPECIAL;
	}
	if (rc == 0)
		rc = sl_tok_parse_post(t, path, json_object_get(root, "post_processor"));
	json_decref(root);
	if (rc == 0)
		rc = sl_tok_parse_config(t, dir);
	return rc;
}
