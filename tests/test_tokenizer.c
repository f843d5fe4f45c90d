/*
 * test_tokenizer.c - checks the text layer (runtime/text/) against the
 * Hugging Face outputs in tests/fixtures/tokenizer (made by
 * tools/make_tokenizer_fixture.py): encode ids and decoded bytes for every
 * string, round trips, special tokens, streaming helpers, the UTF-8
 * repair, and the errors for missing and malformed files.
 *
 * Usage: test_tokenizer [DIR]; else $SL_FIXTURES as DIR; else
 * tests/fixtures/tokenizer relative to the working directory.  DIR is the
 * tokenizer fixture dir or the fixtures root that holds tokenizer/.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "tokenizer.h"

#include <check.h>
#include <jansson.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SL_TEST_DIR_MAX 4096                 /* directories */
#define SL_TEST_PATH_MAX (SL_TEST_DIR_MAX + 64) /* a file in one */

static char fixture_dir[SL_TEST_DIR_MAX] = "tests/fixtures/tokenizer";

/* ---- helpers --------------------------------------------------------------- */

static int b64_val(int c)
{
	if (c >= 'A' && c <= 'Z')
		return c - 'A';
	if (c >= 'a' && c <= 'z')
		return c - 'a' + 26;
	if (c >= '0' && c <= '9')
		return c - '0' + 52;
	if (c == '+')
		return 62;
	if (c == '/')
		return 63;
	return -1;
}

/* Decode base64 into a malloc'd buffer (NUL-terminated); NULL if bad. */
static char *b64_decode(const char *s, size_t *out_len)
{
	size_t n = strlen(s);
	char *out = malloc(n / 4 * 3 + 4);
	size_t o = 0;
	uint32_t acc = 0;
	int bits = 0;
	if (!out)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		if (s[i] == '=')
			break;
		int v = b64_val((unsigned char)s[i]);
		if (v < 0) {
			free(out);
			return NULL;
		}
		acc = (acc << 6) | (uint32_t)v;
		bits += 6;
		if (bits >= 8) {
			bits -= 8;
			out[o++] = (char)((acc >> bits) & 0xFF);
		}
	}
	out[o] = 0;
	*out_len = o;
	return out;
}

static char *read_all(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	ck_assert_msg(f != NULL, "cannot open %s", path);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *b = malloc((size_t)n + 1);
	ck_assert_ptr_nonnull(b);
	ck_assert_uint_eq(fread(b, 1, (size_t)n, f), (size_t)n);
	b[n] = 0;
	fclose(f);
	*len = (size_t)n;
	return b;
}

static void write_file(const char *path, const char *data, size_t len)
{
	FILE *f = fopen(path, "wb");
	ck_assert_msg(f != NULL, "cannot create %s", path);
	ck_assert_uint_eq(fwrite(data, 1, len, f), len);
	fclose(f);
}

static sl_tokenizer *load_fixture(void)
{
	sl_tokenizer *t = NULL;
	int rc = sl_tokenizer_load(fixture_dir, &t);
	ck_assert_msg(rc == 0, "load %s: %s", fixture_dir, sl_errmsg());
	return t;
}

/* A scratch dir with the fixture's vocab.json and the given merges.txt
 * (NULL: none) and vocab.json (NULL: the fixture's). */
static void make_dir(char *dir, size_t cap, const char *vocab, size_t vocab_len,
		     const char *merges)
{
	const char *tmp = getenv("TMPDIR");
	snprintf(dir, cap, "%s/sl_tok_XXXXXX", tmp && *tmp ? tmp : "/tmp");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	char path[SL_TEST_PATH_MAX];
	snprintf(path, sizeof path, "%s/vocab.json", dir);
	if (vocab) {
		write_file(path, vocab, vocab_len);
	} else {
		char src[SL_TEST_PATH_MAX];
		size_t n;
		snprintf(src, sizeof src, "%s/vocab.json", fixture_dir);
		char *v = read_all(src, &n);
		write_file(path, v, n);
		free(v);
	}
	if (merges) {
		snprintf(path, sizeof path, "%s/merges.txt", dir);
		write_file(path, merges, strlen(merges));
	}
}

static void remove_dir(const char *dir)
{
	char path[SL_TEST_PATH_MAX];
	snprintf(path, sizeof path, "%s/vocab.json", dir);
	unlink(path);
	snprintf(path, sizeof path, "%s/merges.txt", dir);
	unlink(path);
	rmdir(dir);
}

/* Load from a scratch dir and expect failure code with msg containing
 * every one of the given fragments. */
static void expect_load_error(const char *dir, int code, const char *frag1,
			      const char *frag2)
{
	sl_tokenizer *t = NULL;
	sl_err_clear();
	int rc = sl_tokenizer_load(dir, &t);
	ck_assert_msg(rc == code, "expected %d (%s), got %d: %s", code,
		      sl_strerror(code), rc, sl_errmsg());
	ck_assert_ptr_null(t);
	ck_assert_msg(strstr(sl_errmsg(), frag1), "message \"%s\" lacks \"%s\"",
		      sl_errmsg(), frag1);
	if (frag2)
		ck_assert_msg(strstr(sl_errmsg(), frag2), "message \"%s\" lacks \"%s\"",
			      sl_errmsg(), frag2);
}

static void print_ids(const char *what, const int32_t *ids, size_t n)
{
	fprintf(stderr, "  %s (%zu):", what, n);
	for (size_t i = 0; i < n && i < 40; i++)
		fprintf(stderr, " %d", (int)ids[i]);
	fprintf(stderr, n > 40 ? " ...\n" : "\n");
}

/* ---- the Hugging Face comparison ------------------------------------------- */

START_TEST(test_matches_hf)
{
	sl_tokenizer *t = load_fixture();
	char path[SL_TEST_PATH_MAX];
	snprintf(path, sizeof path, "%s/expected.jsonl", fixture_dir);
	size_t flen;
	char *file = read_all(path, &flen);
	size_t strings = 0, bad_ids = 0, bad_dec = 0, bad_skip = 0, bad_rt = 0;
	size_t bad_raw = 0, bad_pieces = 0, bad_replaced = 0, invalid = 0, total_ids = 0;
	char *line = file;
	while (line < file + flen) {
		char *nl = strchr(line, '\n');
		if (nl)
			*nl = 0;
		if (!*line) {
			line = nl ? nl + 1 : file + flen;
			continue;
		}
		json_error_t jerr;
		json_t *rec = json_loads(line, 0, &jerr);
		ck_assert_msg(rec != NULL, "expected.jsonl: %s", jerr.text);
		size_t tlen, dlen, slen;
		char *text = b64_decode(json_string_value(json_object_get(rec, "text_b64")), &tlen);
		char *dec = b64_decode(json_string_value(json_object_get(rec, "decoded_b64")), &dlen);
		char *skip = b64_decode(json_string_value(json_object_get(rec,
								 "decoded_skip_b64")), &slen);
		ck_assert(text && dec && skip);
		bool valid = json_is_true(json_object_get(rec, "valid_utf8"));
		json_t *jids = json_object_get(rec, "ids");
		size_t nexp = json_array_size(jids);
		int32_t *exp = malloc((nexp + 1) * sizeof *exp);
		for (size_t i = 0; i < nexp; i++)
			exp[i] = (int32_t)json_integer_value(json_array_get(jids, i));
		strings++;
		invalid += !valid;
		total_ids += nexp;

		int32_t *ids, *ids2;
		size_t n, n2;
		bool same;
		int rc = sl_tokenizer_encode(t, text, tlen, &ids, &n);
		ck_assert_msg(rc == 0, "encode: %s", sl_errmsg());
		if (n != nexp || memcmp(ids, exp, n * sizeof *ids) != 0) {
			if (bad_ids++ < 5) {
				fprintf(stderr, "encode mismatch on %s \"%.80s\"\n",
					json_string_value(json_object_get(rec, "kind")), text);
				print_ids("sluice", ids, n);
				print_ids("HF", exp, nexp);
			}
		}
		/* Invalid UTF-8 as U+FFFD, like HF on errors="replace" text. */
		json_t *jr = json_object_get(rec, valid ? "ids" : "ids_replaced");
		ck_assert_ptr_nonnull(jr);
		rc = sl_tokenizer_encode_ex(t, text, tlen, SL_TOKENIZER_REPLACE_INVALID, &ids2, &n2);
		ck_assert_int_eq(rc, 0);
		same = n2 == json_array_size(jr);
		for (size_t i = 0; same && i < n2; i++)
			same = ids2[i] == (int32_t)json_integer_value(json_array_get(jr, i));
		if (!same && bad_replaced++ < 5)
			fprintf(stderr, "replace-invalid mismatch on \"%.80s\"\n", text);
		free(ids2);

		/* Pre-tokenizer pieces. */
		json_t *jl = json_object_get(rec, "piece_lens");
		size_t *ends, ne;
		rc = sl_tokenizer_pretokenize(t, text, tlen, 0, &ends, &ne);
		ck_assert_msg(rc == 0, "pretokenize: %s", sl_errmsg());
		same = ne == json_array_size(jl);
		for (size_t i = 0, at = 0; same && i < ne; i++) {
			at += (size_t)json_integer_value(json_array_get(jl, i));
			same = ends[i] == at;
		}
		if (!same && bad_pieces++ < 5)
			fprintf(stderr, "piece mismatch on \"%.80s\"\n", text);
		free(ends);

		char *out;
		size_t olen;
		/* HF decode of HF's ids */
		rc = sl_tokenizer_decode(t, exp, nexp, &out, &olen);
		ck_assert_msg(rc == 0, "decode: %s", sl_errmsg());
		if (olen != dlen || memcmp(out, dec, dlen) != 0) {
			if (bad_dec++ < 5)
				fprintf(stderr, "decode mismatch: \"%s\" vs HF \"%s\"\n", out, dec);
		}
		ck_assert_int_eq(out[olen], 0);
		free(out);
		rc = sl_tokenizer_decode_ex(t, exp, nexp, SL_TOKENIZER_SKIP_SPECIAL, &out, &olen);
		ck_assert_int_eq(rc, 0);
		if (olen != slen || memcmp(out, skip, slen) != 0) {
			if (bad_skip++ < 5)
				fprintf(stderr, "skip-special decode mismatch: \"%s\" vs HF \"%s\"\n",
					out, skip);
		}
		free(out);
		/* Round trip of our own ids. */
		rc = sl_tokenizer_decode(t, ids, n, &out, &olen);
		ck_assert_int_eq(rc, 0);
		if (valid && (olen != tlen || memcmp(out, text, tlen) != 0))
			bad_rt++;
		if (olen != dlen || memcmp(out, dec, dlen) != 0)
			bad_rt++;
		free(out);
		/* Raw bytes give back every input exactly, invalid UTF-8 too. */
		rc = sl_tokenizer_decode_ex(t, ids, n, SL_TOKENIZER_RAW_BYTES, &out, &olen);
		ck_assert_int_eq(rc, 0);
		if (olen != tlen || memcmp(out, text, tlen) != 0)
			bad_raw++;
		free(out);

		free(ids);
		free(exp);
		free(text);
		free(dec);
		free(skip);
		json_decref(rec);
		line = nl ? nl + 1 : file + flen;
	}
	fprintf(stderr, "tokenizer: %zu strings (%zu with invalid UTF-8, %zu ids): "
		"%zu encode, %zu decode, %zu skip-special decode, %zu round-trip, "
		"%zu raw, %zu piece, %zu replace-invalid mismatches\n", strings, invalid,
		total_ids, bad_ids, bad_dec, bad_skip, bad_rt, bad_raw, bad_pieces,
		bad_replaced);
	ck_assert_uint_ge(strings, 500);
	ck_assert_uint_ge(invalid, 10);
	ck_assert_uint_eq(bad_ids, 0);
	ck_assert_uint_eq(bad_dec, 0);
	ck_assert_uint_eq(bad_skip, 0);
	ck_assert_uint_eq(bad_rt, 0);
	ck_assert_uint_eq(bad_raw, 0);
	ck_assert_uint_eq(bad_pieces, 0);
	ck_assert_uint_eq(bad_replaced, 0);
	free(file);
	sl_tokenizer_free(t);
}
END_TEST

/* Class of code point cp as the pre-tokenizer sees it, found the way the
 * fixture script probes HF: which prefix it joins in one piece. */
static char probe_class(const sl_tokenizer *t, uint32_t cp)
{
	static const char prefix[] = "a1!\t", cls[] = "LNOS";
	char s[8];
	size_t cl;
	if (cp < 0x80) {
		s[1] = (char)cp;
		cl = 1;
	} else if (cp < 0x800) {
		s[1] = (char)(0xC0 | (cp >> 6));
		s[2] = (char)(0x80 | (cp & 0x3F));
		cl = 2;
	} else if (cp < 0x10000) {
		s[1] = (char)(0xE0 | (cp >> 12));
		s[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
		s[3] = (char)(0x80 | (cp & 0x3F));
		cl = 3;
	} else {
		s[1] = (char)(0xF0 | (cp >> 18));
		s[2] = (char)(0x80 | ((cp >> 12) & 0x3F));
		s[3] = (char)(0x80 | ((cp >> 6) & 0x3F));
		s[4] = (char)(0x80 | (cp & 0x3F));
		cl = 4;
	}
	for (int k = 0; k < 4; k++) {
		s[0] = prefix[k];
		size_t *ends, n;
		ck_assert_int_eq(sl_tokenizer_pretokenize(t, s, 1 + cl, 0, &ends, &n), 0);
		free(ends);
		if (n == 1)
			return cls[k];
	}
	return '?';
}

START_TEST(test_unicode_classes)
{
	sl_tokenizer *t = load_fixture();
	char path[SL_TEST_PATH_MAX];
	snprintf(path, sizeof path, "%s/classes.txt", fixture_dir);
	size_t flen;
	char *file = read_all(path, &flen);
	size_t runs = 0, checked = 0, bad = 0;
	uint32_t expect_lo = 0;
	for (char *line = strtok(file, "\n"); line; line = strtok(NULL, "\n")) {
		if (line[0] == '#')
			continue;
		unsigned lo, hi;
		char k;
		ck_assert_int_eq(sscanf(line, "%x %x %c", &lo, &hi, &k), 3);
		ck_assert_uint_eq(lo, expect_lo);
		expect_lo = hi + 1;
		runs++;
		uint32_t probe[] = { lo, hi, lo + (hi - lo) / 2, lo + 1, hi - 1 };
		for (size_t i = 0; i < SL_ARRAY_LEN(probe); i++) {
			uint32_t cp = probe[i];
			if (cp < lo || cp > hi || (cp >= 0xD800 && cp <= 0xDFFF))
				continue;
			char got = probe_class(t, cp);
			checked++;
			if (got != k && bad++ < 10)
				fprintf(stderr, "U+%04X: class %c, HF %c\n", (unsigned)cp, got, k);
		}
	}
	ck_assert_uint_eq(expect_lo, 0x110000);
	fprintf(stderr, "tokenizer: %zu class runs, %zu code points probed, %zu differ\n",
		runs, checked, bad);
	ck_assert_uint_eq(bad, 0);
	free(file);
	sl_tokenizer_free(t);
}
END_TEST

/* ---- API behaviour --------------------------------------------------------- */

static void encode_str(const sl_tokenizer *t, const char *s, unsigned flags,
		       int32_t **ids, size_t *n)
{
	int rc = sl_tokenizer_encode_ex(t, s, strlen(s), flags, ids, n);
	ck_assert_msg(rc == 0, "encode: %s", sl_errmsg());
}

START_TEST(test_special_ids)
{
	sl_tokenizer *t = load_fixture();
	ck_assert_int_eq(sl_tokenizer_vocab_size(t), 2000);
	ck_assert_int_eq(sl_tokenizer_bos_id(t), 2);
	ck_assert_int_eq(sl_tokenizer_eos_id(t), 2);
	ck_assert_int_eq(sl_tokenizer_pad_id(t), 1);
	ck_assert(sl_tokenizer_is_special(t, 1));
	ck_assert(sl_tokenizer_is_special(t, 2));
	ck_assert(!sl_tokenizer_is_special(t, 0)); /* "<s>" is plain in HF OPT */
	ck_assert(!sl_tokenizer_is_special(t, 3)); /* "<unk>" too */
	ck_assert(!sl_tokenizer_is_special(t, 4));
	ck_assert(!sl_tokenizer_is_special(t, -1));
	ck_assert(!sl_tokenizer_is_special(t, 1 << 20));
	ck_assert_int_eq(sl_tokenizer_token_id(t, "</s>", 4), 2);
	ck_assert_int_eq(sl_tokenizer_token_id(t, "<s>", 3), 0);
	/* "Ġ" spells the space byte; its token decodes to " ". */
	int32_t sp_id = sl_tokenizer_token_id(t, "\xc4\xa0", 2);
	ck_assert_int_ge(sp_id, 4);
	const char *sp_bytes;
	size_t sp_len;
	ck_assert_int_eq(sl_tokenizer_token_bytes(t, sp_id, &sp_bytes, &sp_len), 0);
	ck_assert_uint_eq(sp_len, 1);
	ck_assert_int_eq(sp_bytes[0], ' ');
	ck_assert_int_eq(sl_tokenizer_token_id(t, "no such token here", 18), -1);

	/* BOS like HF OPT's add_special_tokens=True. */
	int32_t *a, *b;
	size_t na, nb;
	encode_str(t, "Hello world", 0, &a, &na);
	encode_str(t, "Hello world", SL_TOKENIZER_ADD_BOS, &b, &nb);
	ck_assert_uint_eq(nb, na + 1);
	ck_assert_int_eq(b[0], 2);
	ck_assert_mem_eq(b + 1, a, na * sizeof *a);
	free(a);
	free(b);
	encode_str(t, "", SL_TOKENIZER_ADD_BOS, &b, &nb);
	ck_assert_uint_eq(nb, 1);
	ck_assert_int_eq(b[0], 2);
	free(b);
	int rc = sl_tokenizer_encode(t, NULL, 0, &b, &nb);
	ck_assert_int_eq(rc, 0);
	ck_assert_ptr_nonnull(b);
	ck_assert_uint_eq(nb, 0);
	free(b);

	/* "</s>" in text is split out unless NO_SPECIAL. */
	encode_str(t, "a</s>b<pad>", 0, &a, &na);
	ck_assert_uint_eq(na, 4);
	ck_assert_int_eq(a[1], 2);
	ck_assert_int_eq(a[3], 1);
	free(a);
	encode_str(t, "a</s>b<pad>", SL_TOKENIZER_NO_SPECIAL, &a, &na);
	ck_assert_uint_gt(na, 4);
	for (size_t i = 0; i < na; i++)
		ck_assert(!sl_tokenizer_is_special(t, a[i]));
	char *s;
	size_t sl;
	ck_assert_int_eq(sl_tokenizer_decode(t, a, na, &s, &sl), 0);
	ck_assert_str_eq(s, "a</s>b<pad>");
	free(s);
	free(a);

	int32_t sp[] = { 2, 1, 0, 3, 2 };
	ck_assert_int_eq(sl_tokenizer_decode(t, sp, 5, &s, &sl), 0);
	ck_assert_str_eq(s, "</s><pad><s><unk></s>");
	free(s);
	ck_assert_int_eq(sl_tokenizer_decode_ex(t, sp, 5, SL_TOKENIZER_SKIP_SPECIAL, &s, &sl), 0);
	ck_assert_str_eq(s, "<s><unk>");
	ck_assert_uint_eq(sl, 8);
	free(s);
	ck_assert_int_eq(sl_tokenizer_decode(t, NULL, 0, &s, &sl), 0);
	ck_assert_str_eq(s, "");
	ck_assert_uint_eq(sl, 0);
	free(s);
	sl_tokenizer_free(t);
	sl_tokenizer_free(NULL);
}
END_TEST

START_TEST(test_decode_range)
{
	sl_tokenizer *t = load_fixture();
	int32_t bad[][3] = { { 5, -1, 6 }, { 5, INT32_MIN, 6 } };
	for (size_t k = 0; k < SL_ARRAY_LEN(bad); k++) {
		char *s = (char *)1;
		size_t sl = 7;
		sl_err_clear();
		int rc = sl_tokenizer_decode(t, bad[k], 3, &s, &sl);
		ck_assert_int_eq(rc, SL_ERANGE);
		ck_assert_ptr_null(s);
		ck_assert_ptr_nonnull(strstr(sl_errmsg(), "position 1"));
	}
	const char *b;
	size_t bl;
	ck_assert_int_eq(sl_tokenizer_token_bytes(t, -3, &b, &bl), SL_ERANGE);
	sl_tokenizer_free(t);
}
END_TEST

/* An id with no entry in vocab.json (beyond it: a model's vocab_size may
 * exceed its tokenizer's, 50272 against 50265 for OPT; or a hole in it)
 * decodes to nothing, as transformers' OPT/GPT-2 tokenizer decodes it
 * (checked with transformers 5.24: decode([262, 4096, 262]) on the bundled
 * model's 4096-entry tokenizer gives ' the the'); special tokens and
 * streaming agree. */
START_TEST(test_decode_without_text)
{
	sl_tokenizer *t = load_fixture();
	const int32_t nv = sl_tokenizer_vocab_size(t);
	int32_t plain[] = { 5, 6 }, beyond[] = { nv, 5, nv + 6, 6, 1 << 30, INT32_MAX };
	char *want, *got;
	size_t wl, gl;
	ck_assert_int_eq(sl_tokenizer_decode(t, plain, 2, &want, &wl), 0);
	int rc = sl_tokenizer_decode(t, beyond, SL_ARRAY_LEN(beyond), &got, &gl);
	ck_assert_msg(rc == 0, "%s", sl_errmsg());
	ck_assert_uint_eq(gl, wl);
	ck_assert_str_eq(got, want);
	free(got);
	ck_assert_int_eq(sl_tokenizer_decode(t, beyond, 1, &got, &gl), 0);
	ck_assert_uint_eq(gl, 0);
	ck_assert_str_eq(got, "");
	free(got);
	int32_t sp[] = { 2, nv, 5, 1, 6 };
	ck_assert_int_eq(sl_tokenizer_decode_ex(t, sp, 5, SL_TOKENIZER_SKIP_SPECIAL, &got, &gl), 0);
	ck_assert_str_eq(got, want);
	free(got);
	free(want);
	const char *b = NULL;
	size_t bl = 9;
	ck_assert_int_eq(sl_tokenizer_token_bytes(t, nv, &b, &bl), 0);
	ck_assert_uint_eq(bl, 0);
	ck_assert_ptr_nonnull(b);
	sl_tokenizer_free(t);
	/* a hole: ids 0..2 and 4, not 3 */
	char dir[SL_TEST_DIR_MAX];
	const char *vocab = "{\"a\": 0, \"b\": 1, \"</s>\": 2, \"c\": 4}";
	make_dir(dir, sizeof dir, vocab, strlen(vocab), "#version: 0.2\n");
	ck_assert_int_eq(sl_tokenizer_load(dir, &t), 0);
	int32_t hole[] = { 0, 3, 4 };
	ck_assert_int_eq(sl_tokenizer_decode(t, hole, 3, &got, &gl), 0);
	ck_assert_str_eq(got, "ac");
	free(got);
	ck_assert_int_eq(sl_tokenizer_token_bytes(t, 3, &b, &bl), 0);
	ck_assert_uint_eq(bl, 0);
	sl_tokenizer_free(t);
	remove_dir(dir);
}
END_TEST

START_TEST(test_streaming)
{
	sl_tokenizer *t = load_fixture();
	/* token_bytes of every token, concatenated, is the raw decode. */
	const char *text = "Emoji 👨‍👩‍👧‍👦 and café, 中文 ok \xff</s>";
	int32_t *ids;
	size_t n;
	encode_str(t, text, 0, &ids, &n);
	char buf[512];
	size_t used = 0, printed = 0;
	char shown[512];
	size_t shown_len = 0;
	for (size_t i = 0; i < n; i++) {
		const char *b;
		size_t bl;
		ck_assert_int_eq(sl_tokenizer_token_bytes(t, ids[i], &b, &bl), 0);
		ck_assert_uint_le(used + bl, sizeof buf);
		memcpy(buf + used, b, bl);
		used += bl;
		/* A streaming printer emits only the stable prefix. */
		size_t stable = sl_tokenizer_utf8_stable_len(buf, used);
		ck_assert_uint_ge(stable, printed);
		memcpy(shown + shown_len, buf + printed, stable - printed);
		shown_len += stable - printed;
		printed = stable;
	}
	ck_assert_uint_eq(used, strlen(text));
	ck_assert_mem_eq(buf, text, used);
	ck_assert_uint_eq(printed, used);
	ck_assert_mem_eq(shown, text, used);
	free(ids);

	/* Stable length: an unfinished tail is held back, an invalid one is not. */
	ck_assert_uint_eq(sl_tokenizer_utf8_stable_len("", 0), 0);
	ck_assert_uint_eq(sl_tokenizer_utf8_stable_len("abc", 3), 3);
	ck_assert_uint_eq(sl_tokenizer_utf8_stable_len("ab\xe2\x82", 4), 2);
	ck_assert_uint_eq(sl_tokenizer_utf8_stable_len("ab\xe2", 3), 2);
	ck_assert_uint_eq(sl_tokenizer_utf8_stable_len("ab\xe2\x82\xac", 5), 5);
	ck_assert_uint_eq(sl_tokenizer_utf8_stable_len("\xf0\x9f\x98", 3), 0);
	ck_assert_uint_eq(sl_tokenizer_utf8_stable_len("\xf0\x9f\x98\x80", 4), 4);
	ck_assert_uint_eq(sl_tokenizer_utf8_stable_len("a\xff", 2), 2);
	ck_assert_uint_eq(sl_tokenizer_utf8_stable_len("a\x80", 2), 2);
	ck_assert_uint_eq(sl_tokenizer_utf8_stable_len("a\xed\xa0", 3), 3); /* surrogate */
	ck_assert_uint_eq(sl_tokenizer_utf8_stable_len("a\xc0", 2), 2);     /* never valid */
	sl_tokenizer_free(t);
}
END_TEST

/* The one UTF-8 repair (decode's, and every text sluice writes as JSON):
 * one U+FFFD per maximal ill-formed subpart, as Python's
 * bytes.decode("utf-8", errors="replace") gives (the expected bytes are
 * Python's, encoded back to UTF-8). */
START_TEST(test_utf8_repair)
{
#define R "\xef\xbf\xbd"
#define S(x) x, sizeof(x) - 1
	static const struct {
		const char *in;
		size_t n;
		const char *want;
		size_t wn;
	} c[] = {
		{ S("ok"), S("ok") },
		{ S(""), S("") },
		{ S("\xe2\x82" "a"), S(R "a") },            /* a truncated sequence: one */
		{ S("x\xe2\x82"), S("x" R) },
		{ S("a\xf0\x9f\x98"), S("a" R) },
		{ S("\xff\xfe"), S(R R) },                /* bytes that never lead */
		{ S("\xed\xa0\x80z"), S(R R R "z") },      /* a surrogate */
		{ S("\xe0\x80\xaf"), S(R R R) },           /* overlong */
		{ S("\xc0\xaf"), S(R R) },
		{ S("\xf4\x90\x80\x80"), S(R R R R) },    /* beyond U+10FFFF */
		{ S("\xe2\x82\xac\x80"), S("\xe2\x82\xac" R) },
		{ S("\xf0\x9f\x98\x80"), S("\xf0\x9f\x98\x80") },
		{ S("a\0b"), S("a\0b") },
	};
#undef S
#undef R
	for (size_t i = 0; i < SL_ARRAY_LEN(c); i++) {
		char *out = NULL;
		size_t n = 0;
		ck_assert_int_eq(sl_tokenizer_utf8_repair(c[i].in, c[i].n, &out, &n), 0);
		ck_assert_msg(n == c[i].wn && memcmp(out, c[i].want, n) == 0 && out[n] == 0,
			      "case %zu: %zu bytes, want %zu", i, n, c[i].wn);
		free(out);
	}
}
END_TEST

START_TEST(test_long_inputs)
{
	sl_tokenizer *t = load_fixture();
	/* A long single word and long runs: no quadratic blow-up or overflow. */
	size_t len = 1 << 20;
	char *s = malloc(len);
	for (size_t i = 0; i < len; i++)
		s[i] = "ab"[i % 2];
	int32_t *ids;
	size_t n;
	ck_assert_int_eq(sl_tokenizer_encode(t, s, len, &ids, &n), 0);
	char *out;
	size_t ol;
	ck_assert_int_eq(sl_tokenizer_decode(t, ids, n, &out, &ol), 0);
	ck_assert_uint_eq(ol, len);
	ck_assert_mem_eq(out, s, len);
	free(out);
	free(ids);
	memset(s, ' ', len);
	ck_assert_int_eq(sl_tokenizer_encode(t, s, len, &ids, &n), 0);
	ck_assert_int_eq(sl_tokenizer_decode(t, ids, n, &out, &ol), 0);
	ck_assert_uint_eq(ol, len);
	free(out);
	free(ids);
	/* every byte value */
	for (size_t i = 0; i < len; i++)
		s[i] = (char)(i * 7919 % 251);
	ck_assert_int_eq(sl_tokenizer_encode(t, s, len, &ids, &n), 0);
	ck_assert_int_eq(sl_tokenizer_decode_ex(t, ids, n, SL_TOKENIZER_RAW_BYTES, &out, &ol), 0);
	ck_assert_uint_eq(ol, len);
	ck_assert_mem_eq(out, s, len);
	free(out);
	free(ids);
	free(s);
	sl_tokenizer_free(t);
}
END_TEST

/* ---- load errors ----------------------------------------------------------- */

START_TEST(test_missing_files)
{
	char dir[SL_TEST_DIR_MAX];
	expect_load_error("/nonexistent/sluice/tokenizer", SL_ENOTFOUND,
			  "/nonexistent/sluice/tokenizer/vocab.json", NULL);
	make_dir(dir, sizeof dir, NULL, 0, NULL);
	expect_load_error(dir, SL_ENOTFOUND, "merges.txt", dir);
	remove_dir(dir);

	sl_tokenizer *t = (sl_tokenizer *)1;
	ck_assert_int_eq(sl_tokenizer_load(NULL, &t), SL_EINVAL);
}
END_TEST

START_TEST(test_bad_merges)
{
	char dir[SL_TEST_DIR_MAX];
	make_dir(dir, sizeof dir, NULL, 0, "#version: 0.2\n\xc4\xa0 t\na b c\n");
	expect_load_error(dir, SL_EFORMAT, "merges.txt:3", "two tokens");
	remove_dir(dir);
	make_dir(dir, sizeof dir, NULL, 0, "#version: 0.2\n\xc4\xa0 t\n\nh e\n");
	expect_load_error(dir, SL_EFORMAT, "merges.txt:3", NULL);
	remove_dir(dir);
	make_dir(dir, sizeof dir, NULL, 0, "#version: 0.2\nnosuchtoken t\n");
	expect_load_error(dir, SL_EFORMAT, "merges.txt:2", "nosuchtoken");
	remove_dir(dir);
	make_dir(dir, sizeof dir, NULL, 0, "onlyone\n");
	expect_load_error(dir, SL_EFORMAT, "merges.txt:1", NULL);
	remove_dir(dir);
	/* CRLF line ends, no #version line and no final newline are fine. */
	make_dir(dir, sizeof dir, NULL, 0, "\xc4\xa0 t\r\nh e");
	sl_tokenizer *t = NULL;
	ck_assert_msg(sl_tokenizer_load(dir, &t) == 0, "%s", sl_errmsg());
	sl_tokenizer_free(t);
	remove_dir(dir);
}
END_TEST

START_TEST(test_bad_vocab)
{
	char dir[SL_TEST_DIR_MAX], src[SL_TEST_PATH_MAX];
	size_t n;
	snprintf(src, sizeof src, "%s/vocab.json", fixture_dir);
	char *v = read_all(src, &n);
	const char *merges = "#version: 0.2\n";

	make_dir(dir, sizeof dir, v, n / 2, merges); /* truncated */
	expect_load_error(dir, SL_EFORMAT, "vocab.json", NULL);
	remove_dir(dir);

	const char *cases[][2] = {
		{ "[1, 2, 3]", "not a JSON object" },
		{ "{\"a\": 0, \"b\": \"1\"}", "not an integer" },
		{ "{\"a\": 0, \"b\": -1}", "outside" },
		{ "{\"a\": 0, \"b\": 99999999999}", "outside" },
		{ "{\"a\": 0, \"b\": 0}", "both" },
		{ "{\"a\": 0, \"a\": 1}", "vocab.json" },
		{ "{}", "empty" },
		{ "", "vocab.json" },
	};
	for (size_t k = 0; k < SL_ARRAY_LEN(cases); k++) {
		make_dir(dir, sizeof dir, cases[k][0], strlen(cases[k][0]), merges);
		expect_load_error(dir, SL_EFORMAT, "vocab.json", cases[k][1]);
		remove_dir(dir);
	}
	free(v);
}
END_TEST

/* ---- tokenizer.json (tests/fixtures/tokenizer/hf) ------------------------- */

/* The four kinds tools/make_hf_tokenizer_fixture.py trains. */
static const char *const hf_kinds[] = { "llama3", "qwen2", "llama2", "metaspace" };

static void hf_dir(char *dir, size_t cap, const char *kind)
{
	ck_assert(snprintf(dir, cap, "%s/hf/%s", fixture_dir, kind) < (int)cap);
}

static sl_tokenizer *load_hf(const char *kind)
{
	char dir[SL_TEST_PATH_MAX];
	hf_dir(dir, sizeof dir, kind);
	sl_tokenizer *t = NULL;
	int rc = sl_tokenizer_load(dir, &t);
	ck_assert_msg(rc == 0, "load %s: %s", dir, sl_errmsg());
	return t;
}

static size_t json_ids(json_t *arr, int32_t **out)
{
	size_t n = json_array_size(arr);
	*out = malloc((n + 1) * sizeof **out);
	ck_assert_ptr_nonnull(*out);
	for (size_t i = 0; i < n; i++)
		(*out)[i] = (int32_t)json_integer_value(json_array_get(arr, i));
	return n;
}

static void expect_ids(const char *kind, int line, const char *what, const int32_t *got,
		       size_t ng, const int32_t *want, size_t nw)
{
	if (ng == nw && (nw == 0 || memcmp(got, want, nw * sizeof *want) == 0))
		return;
	fprintf(stderr, "%s line %d: %s differ\n", kind, line, what);
	print_ids("sluice", got, ng);
	print_ids("hf", want, nw);
	ck_abort_msg("%s line %d: %s differ from HF", kind, line, what);
}

static void expect_text(const char *kind, int line, const char *what, const int32_t *ids,
			size_t n, unsigned flags, const char *want, size_t wl,
			const sl_tokenizer *t)
{
	char *s;
	size_t sl;
	ck_assert_msg(sl_tokenizer_decode_ex(t, ids, n, flags, &s, &sl) == 0, "%s", sl_errmsg());
	ck_assert_msg(sl == wl && memcmp(s, want, wl) == 0, "%s line %d: %s \"%.80s\", HF \"%.80s\"",
		      kind, line, what, s, want);
	free(s);
}

/* Every string: ids with and without the special tokens, both decodes and
 * the round trip, as the `tokenizers` library gives them. */
START_TEST(test_hf_json_matches)
{
	const char *kind = hf_kinds[_i];
	sl_tokenizer *t = load_hf(kind);
	char path[SL_TEST_PATH_MAX];
	hf_dir(path, sizeof path, kind);
	strcat(path, "/expected.jsonl");
	FILE *f = fopen(path, "r");
	ck_assert_msg(f != NULL, "cannot open %s", path);
	char *line = NULL;
	size_t cap = 0;
	int lineno = 0, cases = 0, trips = 0, pieces = 0;
	while (getline(&line, &cap, f) > 0) {
		lineno++;
		json_error_t jerr;
		json_t *r = json_loads(line, 0, &jerr);
		ck_assert_msg(r != NULL, "%s:%d: %s", path, lineno, jerr.text);
		if (!json_object_get(r, "text_b64")) { /* the version line */
			json_decref(r);
			continue;
		}
		size_t tl, dl, kl;
		char *text = b64_decode(json_string_value(json_object_get(r, "text_b64")), &tl);
		char *dec = b64_decode(json_string_value(json_object_get(r, "decoded_b64")), &dl);
		char *skip = b64_decode(json_string_value(json_object_get(r, "decoded_skip_b64")), &kl);
		ck_assert(text && dec && skip);
		int32_t *want, *want_sp, *got;
		size_t nw = json_ids(json_object_get(r, "ids"), &want);
		size_t nws = json_ids(json_object_get(r, "ids_special"), &want_sp);
		size_t ng;
		ck_assert_msg(sl_tokenizer_encode(t, text, tl, &got, &ng) == 0, "%s", sl_errmsg());
		expect_ids(kind, lineno, "ids", got, ng, want, nw);
		free(got);
		ck_assert_msg(sl_tokenizer_encode_ex(t, text, tl, SL_TOKENIZER_ADD_BOS, &got, &ng) == 0,
			      "%s", sl_errmsg());
		expect_ids(kind, lineno, "ids with special tokens", got, ng, want_sp, nws);
		free(got);
		expect_text(kind, lineno, "decode", want_sp, nws, 0, dec, dl, t);
		expect_text(kind, lineno, "decode skipping special", want_sp, nws,
			    SL_TOKENIZER_SKIP_SPECIAL, skip, kl, t);
		json_t *pe = json_object_get(r, "piece_ends");
		if (pe) { /* the pre-tokenizer alone: where its pieces end */
			size_t *ends, ne;
			ck_assert_int_eq(sl_tokenizer_pretokenize(t, text, tl, SL_TOKENIZER_NO_SPECIAL,
								  &ends, &ne), 0);
			bool same = ne == json_array_size(pe);
			for (size_t k = 0; same && k < ne; k++)
				same = ends[k] == (size_t)json_integer_value(json_array_get(pe, k));
			ck_assert_msg(same, "%s line %d: pre-tokenizer pieces differ from HF (%zu "
				      "pieces, HF %zu)", kind, lineno, ne, json_array_size(pe));
			free(ends);
			pieces++;
		}
		if (json_is_true(json_object_get(r, "roundtrip"))) {
			expect_text(kind, lineno, "round trip", want, nw, 0, text, tl, t);
			trips++;
		}
		cases++;
		free(want);
		free(want_sp);
		free(text);
		free(dec);
		free(skip);
		json_decref(r);
	}
	free(line);
	fclose(f);
	ck_assert_int_ge(cases, 100);
	/* the byte-level and Llama 2 kinds give back nearly every string */
	if (strcmp(kind, "metaspace"))
		ck_assert_int_ge(trips, cases - 6);
	if (strcmp(kind, "llama2")) /* it has a normalizer, no pre-tokenizer */
		ck_assert_int_eq(pieces, cases);
	sl_tokenizer_free(t);
}
END_TEST

/* HF takes text only: invalid UTF-8 is refused (naming the byte and where),
 * or with REPLACE_INVALID encoded as the text with U+FFFD in its place. */
START_TEST(test_hf_json_invalid_utf8)
{
	sl_tokenizer *t = load_hf(hf_kinds[_i]);
	static const char *const bad[] = { "abc\xff", "caf\xc3", "\xed\xa0\x80 surrogate",
					   "over\xc0\xaflong", "\x80" };
	for (size_t k = 0; k < SL_ARRAY_LEN(bad); k++) {
		int32_t *ids = (int32_t *)1;
		size_t n = 7;
		sl_err_clear();
		ck_assert_int_eq(sl_tokenizer_encode(t, bad[k], strlen(bad[k]), &ids, &n), SL_EFORMAT);
		ck_assert_ptr_null(ids);
		ck_assert_msg(strstr(sl_errmsg(), "not valid UTF-8"), "%s", sl_errmsg());
	}
	sl_err_clear();
	int32_t *ids, *want;
	size_t n, nw;
	ck_assert_int_eq(sl_tokenizer_encode(t, "abc\xff", 4, &ids, &n), SL_EFORMAT);
	ck_assert_msg(strstr(sl_errmsg(), "0xFF at offset 3"), "%s", sl_errmsg());
	ck_assert_int_eq(sl_tokenizer_encode_ex(t, "abc\xff", 4, SL_TOKENIZER_REPLACE_INVALID, &ids,
						&n), 0);
	ck_assert_int_eq(sl_tokenizer_encode(t, "abc\xef\xbf\xbd", 6, &want, &nw), 0);
	expect_ids(hf_kinds[_i], 0, "replaced ids", ids, n, want, nw);
	free(ids);
	free(want);
	sl_tokenizer_free(t);
}
END_TEST

/* BOS, EOS and special tokens as the files say. */
START_TEST(test_hf_json_specials)
{
	sl_tokenizer *t = load_hf("llama3");
	ck_assert(sl_tokenizer_adds_bos(t));
	ck_assert_int_eq(sl_tokenizer_bos_id(t), sl_tokenizer_token_id(t, "<|begin_of_text|>", 17));
	ck_assert_int_eq(sl_tokenizer_bos_id(t), 2500); /* added after the 2500 of the model */
	ck_assert_int_eq(sl_tokenizer_vocab_size(t), 2503);
	ck_assert(sl_tokenizer_is_special(t, 2502));
	ck_assert(!sl_tokenizer_is_special(t, 100));
	sl_tokenizer_free(t);

	t = load_hf("qwen2");
	ck_assert(!sl_tokenizer_adds_bos(t));
	ck_assert_int_eq(sl_tokenizer_bos_id(t), -1);
	int32_t *ids, *plain;
	size_t n, np;
	ck_assert_int_eq(sl_tokenizer_encode_ex(t, "hi", 2, SL_TOKENIZER_ADD_BOS, &ids, &n), 0);
	ck_assert_int_eq(sl_tokenizer_encode(t, "hi", 2, &plain, &np), 0);
	expect_ids("qwen2", 0, "ids with ADD_BOS", ids, n, plain, np); /* nothing added */
	free(ids);
	free(plain);
	/* NO_SPECIAL: the added tokens' text is plain text */
	ck_assert_int_eq(sl_tokenizer_encode_ex(t, "<|im_end|>", 10, SL_TOKENIZER_NO_SPECIAL, &ids,
						&n), 0);
	ck_assert_uint_gt(n, 1);
	free(ids);
	sl_tokenizer_free(t);

	t = load_hf("llama2"); /* tokenizer_config.json: add_bos_token, bos, eos */
	ck_assert(sl_tokenizer_adds_bos(t));
	ck_assert_int_eq(sl_tokenizer_bos_id(t), 1);
	ck_assert_int_eq(sl_tokenizer_eos_id(t), 2);
	ck_assert(sl_tokenizer_is_special(t, 0) && sl_tokenizer_is_special(t, 2));
	ck_assert(!sl_tokenizer_is_special(t, 3 + 'A')); /* <0x41>: a vocab token */
	/* byte fallback: a token's bytes for streaming are the byte itself */
	const char *b;
	size_t bl;
	ck_assert_int_eq(sl_tokenizer_token_bytes(t, 3 + 0xE4, &b, &bl), 0);
	ck_assert_uint_eq(bl, 1);
	ck_assert_int_eq((unsigned char)b[0], 0xE4);
	/* an incomplete byte run decodes to one U+FFFD per byte (ByteFallback) */
	int32_t part[] = { 3 + 0xE4, 3 + 0xB8 };
	char *s;
	size_t sl;
	ck_assert_int_eq(sl_tokenizer_decode(t, part, 2, &s, &sl), 0);
	ck_assert_str_eq(s, "\xef\xbf\xbd\xef\xbf\xbd");
	free(s);
	ck_assert_int_eq(sl_tokenizer_decode_ex(t, part, 2, SL_TOKENIZER_RAW_BYTES, &s, &sl), 0);
	ck_assert_str_eq(s, "\xe4\xb8");
	free(s);
	sl_tokenizer_free(t);
}
END_TEST

/* A scratch model folder holding the given files (name, contents). */
static void make_model_dir(char *dir, size_t cap, const char *const files[][2], size_t nf)
{
	const char *tmp = getenv("TMPDIR");
	snprintf(dir, cap, "%s/sl_tokj_XXXXXX", tmp && *tmp ? tmp : "/tmp");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	for (size_t i = 0; i < nf; i++) {
		char path[SL_TEST_PATH_MAX];
		snprintf(path, sizeof path, "%s/%s", dir, files[i][0]);
		write_file(path, files[i][1], strlen(files[i][1]));
	}
}

static void remove_model_dir(const char *dir)
{
	static const char *const names[] = { "tokenizer.json", "tokenizer_config.json",
					     "vocab.json", "merges.txt" };
	for (size_t i = 0; i < SL_ARRAY_LEN(names); i++) {
		char path[SL_TEST_PATH_MAX];
		snprintf(path, sizeof path, "%s/%s", dir, names[i]);
		unlink(path);
	}
	rmdir(dir);
}

/* tokenizer.json is read before vocab.json + merges.txt, as transformers'
 * fast tokenizers do; a folder with neither has no tokenizer. */
START_TEST(test_hf_json_precedence)
{
	char src[SL_TEST_PATH_MAX], dir[SL_TEST_DIR_MAX];
	size_t n;
	hf_dir(src, sizeof src, "qwen2");
	strcat(src, "/tokenizer.json");
	char *tj = read_all(src, &n);
	snprintf(src, sizeof src, "%s/vocab.json", fixture_dir);
	char *vj = read_all(src, &n);
	const char *files[][2] = { { "tokenizer.json", tj }, { "vocab.json", vj },
				   { "merges.txt", "#version: 0.2\n" } };
	make_model_dir(dir, sizeof dir, files, 3);
	ck_assert(sl_tokenizer_present(dir));
	sl_tokenizer *t = NULL;
	ck_assert_msg(sl_tokenizer_load(dir, &t) == 0, "%s", sl_errmsg());
	ck_assert_int_eq(sl_tokenizer_token_id(t, "<|im_end|>", 10), 2502);
	ck_assert(!sl_tokenizer_adds_bos(t));
	sl_tokenizer_free(t);
	remove_model_dir(dir);

	make_model_dir(dir, sizeof dir, files, 0);
	ck_assert(!sl_tokenizer_present(dir));
	remove_model_dir(dir);
	free(tj);
	free(vj);
}
END_TEST

/* Write the qwen2 (or llama2) fixture with one part replaced by the JSON
 * repl, and expect loading to fail with code and the fragments. */
static void expect_json_error(const char *kind, const char *key, const char *repl, int code,
			      const char *frag1, const char *frag2)
{
	char src[SL_TEST_PATH_MAX], dir[SL_TEST_DIR_MAX];
	hf_dir(src, sizeof src, kind);
	strcat(src, "/tokenizer.json");
	json_error_t jerr;
	json_t *root = json_load_file(src, 0, &jerr);
	ck_assert_ptr_nonnull(root);
	json_t *val = json_loads(repl, JSON_DECODE_ANY, &jerr);
	ck_assert_msg(val != NULL, "%s: %s", repl, jerr.text);
	if (!strncmp(key, "model.", 6))
		json_object_set_new(json_object_get(root, "model"), key + 6, val);
	else
		json_object_set_new(root, key, val);
	char *text = json_dumps(root, JSON_COMPACT);
	json_decref(root);
	const char *files[][2] = { { "tokenizer.json", text } };
	make_model_dir(dir, sizeof dir, files, 1);
	expect_load_error(dir, code, frag1, frag2);
	char path[SL_TEST_PATH_MAX];
	snprintf(path, sizeof path, "%s/tokenizer.json", dir);
	ck_assert_msg(strstr(sl_errmsg(), path), "message \"%s\" lacks the file", sl_errmsg());
	remove_model_dir(dir);
	free(text);
}

/* variants.jsonl: model options the trained files leave untried
 * (ignore_merges with no merges, unk with and without fuse_unk, GPT-2's
 * regex through ByteLevel(use_regex), normalized added tokens), and
 * decodes of id runs no encode gives (partial UTF-8 in byte tokens). */
START_TEST(test_hf_json_variants)
{
	char path[SL_TEST_PATH_MAX];
	ck_assert(snprintf(path, sizeof path, "%s/hf/variants.jsonl", fixture_dir) <
		  (int)sizeof path);
	FILE *f = fopen(path, "r");
	ck_assert_msg(f != NULL, "cannot open %s", path);
	char *line = NULL;
	size_t cap = 0;
	int lineno = 0, encodes = 0, decodes = 0;
	while (getline(&line, &cap, f) > 0) {
		lineno++;
		json_error_t jerr;
		json_t *r = json_loads(line, 0, &jerr);
		ck_assert_msg(r != NULL, "%s:%d: %s", path, lineno, jerr.text);
		const char *kind = json_string_value(json_object_get(r, "kind"));
		if (!kind) {
			json_decref(r);
			continue;
		}
		char src[SL_TEST_PATH_MAX], dir[SL_TEST_DIR_MAX];
		hf_dir(src, sizeof src, kind);
		json_t *patch = json_object_get(r, "patch");
		if (patch) { /* the kind's tokenizer.json with model fields replaced */
			strcat(src, "/tokenizer.json");
			json_t *root = json_load_file(src, 0, &jerr);
			ck_assert_ptr_nonnull(root);
			json_object_update(json_object_get(root, "model"), patch);
			json_t *rp = json_object_get(r, "root_patch");
			if (rp)
				json_object_update(root, rp);
			char *text = json_dumps(root, JSON_COMPACT);
			json_decref(root);
			const char *files[][2] = { { "tokenizer.json", text } };
			make_model_dir(dir, sizeof dir, files, 1);
			free(text);
		}
		sl_tokenizer *t = NULL;
		ck_assert_msg(sl_tokenizer_load(patch ? dir : src, &t) == 0, "%s", sl_errmsg());
		int32_t *want, *got;
		size_t nw = json_ids(json_object_get(r, "ids"), &want), ng, dl;
		char *dec = b64_decode(json_string_value(json_object_get(r, "decoded_b64")), &dl);
		json_t *tb = json_object_get(r, "text_b64");
		if (tb) {
			size_t tl;
			char *text = b64_decode(json_string_value(tb), &tl);
			ck_assert_msg(sl_tokenizer_encode(t, text, tl, &got, &ng) == 0, "%s",
				      sl_errmsg());
			expect_ids(kind, lineno, "variant ids", got, ng, want, nw);
			free(got);
			free(text);
			encodes++;
		}
		expect_text(kind, lineno, "variant decode", want, nw, 0, dec, dl, t);
		decodes++;
		sl_tokenizer_free(t);
		if (patch)
			remove_model_dir(dir);
		free(want);
		free(dec);
		json_decref(r);
	}
	free(line);
	fclose(f);
	ck_assert_int_ge(encodes, 40);
	ck_assert_int_ge(decodes, 14);
}
END_TEST

/* What sluice does not implement is refused in one line naming the file. */
START_TEST(test_hf_json_refused)
{
	expect_json_error("qwen2", "pre_tokenizer",
			  "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
			  "\"pattern\": {\"Regex\": \"\\\\w+|\\\\s+\"}, \"behavior\": \"Isolated\", "
			  "\"invert\": false}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
			  "\"trim_offsets\": true, \"use_regex\": false}]}",
			  SL_EUNSUPPORTED, "Split pattern \\w+|\\s+", "Llama 3");
	expect_json_error("qwen2", "pre_tokenizer", "{\"type\": \"Whitespace\"}", SL_EUNSUPPORTED,
			  "pre_tokenizer", "Whitespace");
	expect_json_error("qwen2", "normalizer", "{\"type\": \"NFKC\"}", SL_EUNSUPPORTED,
			  "normalizer", "NFKC");
	expect_json_error("qwen2", "model.type", "\"WordPiece\"", SL_EUNSUPPORTED, "model type",
			  "WordPiece");
	expect_json_error("qwen2", "model.dropout", "0.1", SL_EUNSUPPORTED, "dropout", NULL);
	expect_json_error("qwen2", "decoder", "{\"type\": \"WordPiece\"}", SL_EUNSUPPORTED,
			  "decoder", NULL);
	expect_json_error("qwen2", "post_processor", "{\"type\": \"BertProcessing\"}",
			  SL_EUNSUPPORTED, "post_processor", NULL);
	expect_json_error("qwen2", "added_tokens",
			  "[{\"id\": 5, \"content\": \"<x>\", \"lstrip\": true, \"special\": true}]",
			  SL_EUNSUPPORTED, "<x>", "lstrip");
	expect_json_error("qwen2", "added_tokens", "[{\"id\": 5, \"content\": \"\"}]",
			  SL_EFORMAT, "added_tokens[0]", NULL);
	expect_json_error("qwen2", "added_tokens", "[{\"id\": 5, \"content\": \"<new>\"}]",
			  SL_EFORMAT, "id 5 given to both", NULL);
	expect_json_error("qwen2", "model.merges", "[[\"q\", \"nosuch\"]]", SL_EFORMAT,
			  "merges[0]", "nosuch");
	expect_json_error("qwen2", "model.merges", "[\"q\"]", SL_EFORMAT, "merges[0]", NULL);
	expect_json_error("qwen2", "model.vocab", "[1]", SL_EFORMAT, "not a JSON object", NULL);
	/* the SentencePiece kind: its pieces must fit together */
	expect_json_error("llama2", "decoder", "{\"type\": \"ByteLevel\"}", SL_EUNSUPPORTED,
			  "ByteLevel", NULL);
	expect_json_error("llama2", "normalizer", "null", SL_EUNSUPPORTED, "SentencePiece", NULL);
	expect_json_error("llama2", "model.unk_token", "\"<nosuch>\"", SL_EFORMAT, "<nosuch>",
			  NULL);

	/* bad JSON names the file and the place */
	char dir[SL_TEST_DIR_MAX];
	const char *files[][2] = { { "tokenizer.json", "{\"model\": " } };
	make_model_dir(dir, sizeof dir, files, 1);
	expect_load_error(dir, SL_EFORMAT, "tokenizer.json:1:", "JSON");
	remove_model_dir(dir);
}
END_TEST

static Suite *tokenizer_suite(void)
{
	Suite *s = suite_create("tokenizer");
	TCase *tc = tcase_create("hf");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_matches_hf);
	tcase_add_test(tc, test_unicode_classes);
	tcase_add_test(tc, test_special_ids);
	tcase_add_test(tc, test_decode_range);
	tcase_add_test(tc, test_decode_without_text);
	tcase_add_test(tc, test_streaming);
	tcase_add_test(tc, test_utf8_repair);
	tcase_add_test(tc, test_long_inputs);
	suite_add_tcase(s, tc);
	TCase *te = tcase_create("errors");
	tcase_add_test(te, test_missing_files);
	tcase_add_test(te, test_bad_merges);
	tcase_add_test(te, test_bad_vocab);
	suite_add_tcase(s, te);
	TCase *tj = tcase_create("tokenizer.json");
	tcase_set_timeout(tj, 120);
	tcase_add_loop_test(tj, test_hf_json_matches, 0, (int)SL_ARRAY_LEN(hf_kinds));
	tcase_add_loop_test(tj, test_hf_json_invalid_utf8, 0, (int)SL_ARRAY_LEN(hf_kinds));
	tcase_add_test(tj, test_hf_json_specials);
	tcase_add_test(tj, test_hf_json_precedence);
	tcase_add_test(tj, test_hf_json_variants);
	tcase_add_test(tj, test_hf_json_refused);
	suite_add_tcase(s, tj);
	return s;
}

/* dir itself when it holds vocab.json, else dir/tokenizer (a fixtures root). */
static void set_fixture_dir(const char *dir)
{
	struct stat st;
	char probe[SL_TEST_PATH_MAX];
	snprintf(probe, sizeof probe, "%s/vocab.json", dir);
	if (stat(probe, &st) == 0)
		snprintf(fixture_dir, sizeof fixture_dir, "%s", dir);
	else
		snprintf(fixture_dir, sizeof fixture_dir, "%s/tokenizer", dir);
}

int main(int argc, char **argv)
{
	const char *env = getenv("SL_FIXTURES");
	if (argc > 1)
		set_fixture_dir(argv[1]);
	else if (env && *env)
		set_fixture_dir(env);
	SRunner *sr = srunner_create(tokenizer_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
