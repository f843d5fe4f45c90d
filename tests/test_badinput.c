/*
 * test_badinput.c - every kind of bad input gets a clear error naming the
 * file (and tensor or line) and the problem, never a crash.
 *
 * Broken checkpoints are made here from the opt-pre fixture: truncated,
 * corrupt headers, overlapping or out-of-range offsets, a missing tensor, a
 * wrong shape or dtype (and a LLaMA checkpoint, from llama-tied, missing a
 * tensor or with a wrong shape), a config of an unsupported model_type.  argv[1] is the fixtures
 * folder.
 */
#include "backend.h"
#include "jsonl.h"
#include "model.h"
#include "safetensors.h"
#include "sl_json.h"

#include "testutil.h"

#include <check.h>
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

static const char *fixtures_dir = "tests/fixtures";
static char tmpdir[256];

static void make_tmpdir(void)
{
	snprintf(tmpdir, sizeof tmpdir, "/tmp/sluice-test-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void rm_tmpdir(void)
{
	char cmd[400];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
	ck_assert_int_eq(system(cmd), 0);
}

static void write_file(const char *path, const void *data, size_t n)
{
	FILE *f = fopen(path, "wb");
	ck_assert_ptr_nonnull(f);
	ck_assert_uint_eq(fwrite(data, 1, n, f), n);
	fclose(f);
}

/* A safetensors file from a header text and a data blob. */
static void write_st(const char *path, const char *header, const void *data, size_t n)
{
	size_t hl = strlen(header);
	unsigned char len[8];
	for (int i = 0; i < 8; i++)
		len[i] = (unsigned char)((uint64_t)hl >> (8 * i));
	FILE *f = fopen(path, "wb");
	ck_assert_ptr_nonnull(f);
	fwrite(len, 1, 8, f);
	fwrite(header, 1, hl, f);
	if (n)
		fwrite(data, 1, n, f);
	fclose(f);
}

static void expect_open_fails(const char *path, int code, const char *needle)
{
	sl_st_set *s = NULL;
	int rc = sl_st_open_file(path, &s);
	ck_assert_ptr_null(s);
	ck_assert_msg(rc == code, "expected %s, got %s: %s", sl_strerror(code), sl_strerror(rc),
		      sl_errmsg());
	ck_assert_msg(strstr(sl_errmsg(), path), "message does not name the file: %s", sl_errmsg());
	ck_assert_msg(strstr(sl_errmsg(), needle), "message lacks '%s': %s", needle, sl_errmsg());
	ck_assert_msg(!strchr(sl_errmsg(), '\n'), "message is not one line");
}

static const struct {
	const char *header;
	size_t data;
	const char *needle;
} bad_headers[] = {
	{ "not json at all", 16, "not JSON" },
	{ "[1, 2]", 16, "not a JSON object" },
	{ "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
	  " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
	  16, "overlap" },
	{ "{\"a\": {\"dtype\": \"F32\", \"shape\": [8], \"data_offsets\": [0, 32]}}", 16,
	  "run past the end" },
	{ "{\"a\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 8]}}", 16,
	  "bytes of data for shape" },
	{ "{\"a\": {\"dtype\": \"Q9\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 16,
	  "unknown dtype" },
	{ "{\"a\": {\"dtype\": \"F32\", \"shape\": [-2], \"data_offsets\": [0, 8]}}", 16, "bad shape" },
	{ "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 0]}}", 16,
	  "bad data_offsets" },
	{ "{\"a\": {\"shape\": [2], \"data_offsets\": [0, 8]}}", 16, "needs dtype" },
	/* a tensor named twice: JSON parsers keep one of them, silently */
	{ "{\"model.decoder.x\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
	  " \"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 12]},"
	  " \"model.decoder.x\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [12, 16]}}",
	  16, "tensor 'model.decoder.x' appears twice in the header" },
	{ "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"dtype\": \"F16\", \"data_offsets\": [0, 8]}}",
	  16, "field 'dtype' appears twice" },
	{ "{\"__metadata__\": {\"format\": \"pt\"}, \"a[{\\\"\": {\"dtype\": \"F32\", \"shape\": [2],"
	  " \"data_offsets\": [0, 8]}, \"a[{\\\"\": {}}",
	  16, "tensor 'a[{\\\"' appears twice" },
};

START_TEST(test_corrupt_headers)
{
	make_tmpdir();
	char path[400];
	snprintf(path, sizeof path, "%s/model.safetensors", tmpdir);
	unsigned char data[64] = { 0 };
	write_st(path, bad_headers[_i].header, data, bad_headers[_i].data);
	expect_open_fails(path, SL_EFORMAT, bad_headers[_i].needle);
	rm_tmpdir();
}
END_TEST

START_TEST(test_truncated_files)
{
	make_tmpdir();
	char path[400];
	snprintf(path, sizeof path, "%s/model.safetensors", tmpdir);
	write_file(path, "abc", 3);
	expect_open_fails(path, SL_EFORMAT, "truncated");
	/* header length pointing past the end */
	unsigned char buf[16] = { 0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}' };
	write_file(path, buf, 10);
	expect_open_fails(path, SL_EFORMAT, "past the end of the file");
	/* a real checkpoint cut in half */
	char src[600];
	snprintf(src, sizeof src, "%s/opt-pre/model.safetensors", fixtures_dir);
	FILE *f = fopen(src, "rb");
	ck_assert_ptr_nonnull(f);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	rewind(f);
	char *all = malloc((size_t)n);
	ck_assert_uint_eq(fread(all, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	write_file(path, all, (size_t)n / 2);
	free(all);
	expect_open_fails(path, SL_EFORMAT, "file truncated");
	sl_st_set *s = NULL;
	snprintf(path, sizeof path, "%s/missing.safetensors", tmpdir);
	ck_assert_int_eq(sl_st_open_file(path, &s), SL_ENOTFOUND);
	rm_tmpdir();
}
END_TEST

/*
 * Rewrite the opt-pre checkpoint into tmpdir with one change: drop a
 * tensor, give it another shape, or store it as another dtype.
 */
enum edit { EDIT_DROP, EDIT_SHAPE, EDIT_DTYPE, EDIT_VALUE };
static size_t edit_at;   /* EDIT_VALUE: this element (the fixture is F32) */
static float edit_value; /* becomes this */
static bool edit_bf16;   /* and the tensor is stored as BF16 (truncated) */
static const char *edit_fixture = "opt-pre"; /* the checkpoint rewritten */

static void rewrite_checkpoint(const char *victim, enum edit e)
{
	char src[600], dst[600];
	snprintf(src, sizeof src, "%s/%s/model.safetensors", fixtures_dir, edit_fixture);
	sl_st_set *s = NULL;
	ck_assert_int_eq(sl_st_open_file(src, &s), 0);
	json_t *hdr = json_object();
	size_t off = 0, total = 0;
	for (size_t i = 0; i < sl_st_count(s); i++)
		total += sl_st_at(s, i)->nbytes;
	char *blob = malloc(total + 16);
	for (size_t i = 0; i < sl_st_count(s); i++) {
		const sl_st_tensor *t = sl_st_at(s, i);
		bool hit = !strcmp(t->name, victim);
		if (hit && e == EDIT_DROP)
			continue;
		json_t *shape = json_array();
		for (int d = 0; d < t->ndim; d++)
			json_array_append_new(shape, json_integer(t->shape[d] + (hit && e == EDIT_SHAPE && d == 0)));
		size_t nb = t->nbytes;
		const char *dt = t->dtype_name;
		if (hit && e == EDIT_SHAPE)
			nb = t->nbytes / (size_t)t->shape[0] * (size_t)(t->shape[0] + 1);
		if (hit && e == EDIT_DTYPE) {
			dt = "I32"; /* same element size as F32 */
		}
		if (nb > t->nbytes)
			blob = realloc(blob, total + nb);
		memset(blob + off, 0, nb);
		memcpy(blob + off, t->data, SL_MIN(nb, t->nbytes));
		if (hit && e == EDIT_VALUE) {
			ck_assert(!strcmp(dt, "F32") && (edit_at + 1) * 4 <= nb);
			memcpy(blob + off + edit_at * 4, &edit_value, 4);
			if (edit_bf16) { /* each value's top 16 bits, in place */
				for (size_t k = 0; k < nb / 4; k++) {
					uint32_t u;
					memcpy(&u, blob + off + 4 * k, 4);
					const uint16_t h = (uint16_t)(u >> 16);
					memcpy(blob + off + 2 * k, &h, 2);
				}
				nb /= 2;
				dt = "BF16";
			}
		}
		json_object_set_new(hdr, t->name,
				    json_pack("{s:s, s:o, s:[I, I]}", "dtype", dt, "shape", shape,
					      "data_offsets", (json_int_t)off, (json_int_t)(off + nb)));
		off += nb;
	}
	char *text = json_dumps(hdr, JSON_COMPACT);
	snprintf(dst, sizeof dst, "%s/model.safetensors", tmpdir);
	write_st(dst, text, blob, off);
	free(text);
	free(blob);
	json_decref(hdr);
	sl_st_close(s);
	/* the config as it is */
	char cfg[600];
	snprintf(cfg, sizeof cfg, "cp '%s/%s/config.json' '%s/config.json'", fixtures_dir, edit_fixture,
		 tmpdir);
	ck_assert_int_eq(system(cfg), 0);
}

static void expect_model_fails(int code, const char *needle)
{
	sl_backend *be = NULL;
	ck_assert_int_eq(sl_backend_create("cpu", 1, &be), 0);
	sl_model *m = NULL;
	int rc = sl_model_open(be, tmpdir, NULL, &m);
	ck_assert_ptr_null(m);
	ck_assert_msg(rc == code, "expected %s, got %s: %s", sl_strerror(code), sl_strerror(rc),
		      sl_errmsg());
	ck_assert_msg(strstr(sl_errmsg(), needle), "message lacks '%s': %s", needle, sl_errmsg());
	ck_assert_msg(strstr(sl_errmsg(), tmpdir), "message does not name the file: %s", sl_errmsg());
	ck_assert_int_eq(be->dev_used, 0); /* nothing leaked on the device tier */
	sl_backend_free(be);
}

START_TEST(test_missing_tensor)
{
	make_tmpdir();
	rewrite_checkpoint("model.decoder.layers.1.fc2.weight", EDIT_DROP);
	expect_model_fails(SL_ENOTFOUND, "decoder.layers.1.fc2.weight");
	rm_tmpdir();
}
END_TEST

/* The LLaMA family's tensors are named (and checked) the same way, under
 * its own names. */
START_TEST(test_llama_missing_tensor)
{
	edit_fixture = "llama-tied";
	make_tmpdir();
	rewrite_checkpoint("model.layers.1.mlp.down_proj.weight", EDIT_DROP);
	expect_model_fails(SL_ENOTFOUND, "tensor 'model.layers.1.mlp.down_proj.weight' or 'layers.1.mlp.down_proj.weight' is missing");
	rm_tmpdir();
	make_tmpdir();
	rewrite_checkpoint("model.norm.weight", EDIT_DROP);
	expect_model_fails(SL_ENOTFOUND, "tensor 'model.norm.weight' or 'norm.weight' is missing");
	rm_tmpdir();
	edit_fixture = "opt-pre";
}
END_TEST

START_TEST(test_llama_wrong_shape)
{
	edit_fixture = "llama-tied";
	make_tmpdir();
	rewrite_checkpoint("model.layers.0.self_attn.k_proj.weight", EDIT_SHAPE);
	expect_model_fails(SL_ESHAPE, "tensor 'model.layers.0.self_attn.k_proj.weight' has shape [65, 64], expected [64, 64]");
	rm_tmpdir();
	make_tmpdir();
	rewrite_checkpoint("model.layers.1.mlp.gate_proj.weight", EDIT_SHAPE);
	expect_model_fails(SL_ESHAPE, "tensor 'model.layers.1.mlp.gate_proj.weight' has shape [129, 64], expected [128, 64]");
	rm_tmpdir();
	edit_fixture = "opt-pre";
}
END_TEST

START_TEST(test_wrong_shape)
{
	make_tmpdir();
	rewrite_checkpoint("model.decoder.layers.0.self_attn.k_proj.weight", EDIT_SHAPE);
	expect_model_fails(SL_ESHAPE, "has shape [65, 64], expected [64, 64]");
	rm_tmpdir();
}
END_TEST

START_TEST(test_wrong_dtype)
{
	make_tmpdir();
	rewrite_checkpoint("model.decoder.embed_positions.weight", EDIT_DTYPE);
	expect_model_fails(SL_ESHAPE, "dtype I32");
	rm_tmpdir();
}
END_TEST

/* Weights are kept in fp16: a value it cannot hold (NaN or inf in the
 * file, or beyond 65504 in magnitude, which would round to inf) is refused
 * at load, naming the file, the tensor and the element; 65519 rounds to
 * 65504 and loads. */
START_TEST(test_unrepresentable_weights)
{
	static const struct {
		const char *tensor;
		size_t at;
		float value;
		const char *needle;
	} cases[] = {
		{ "model.decoder.final_layer_norm.bias", 3, NAN,
		  "tensor 'model.decoder.final_layer_norm.bias' holds NaN at [3]: weights must be finite" },
		{ "model.decoder.layers.1.fc1.weight", 2 * 64 + 5, INFINITY,
		  "tensor 'model.decoder.layers.1.fc1.weight' holds inf at [2, 5]" },
		{ "model.decoder.layers.0.self_attn.k_proj.weight", 64 * 64 - 1, -1e5f,
		  "tensor 'model.decoder.layers.0.self_attn.k_proj.weight' holds -100000 at [63, 63], beyond the range of fp16 (largest 65504)" },
		{ "model.decoder.embed_tokens.weight", 7, 65520.0f,
		  "tensor 'model.decoder.embed_tokens.weight' holds 65520 at [0, 7], beyond the range of fp16" },
	};
	for (size_t i = 0; i < SL_ARRAY_LEN(cases); i++) {
		make_tmpdir();
		edit_at = cases[i].at;
		edit_value = cases[i].value;
		rewrite_checkpoint(cases[i].tensor, EDIT_VALUE);
		expect_model_fails(SL_ERANGE, cases[i].needle);
		rm_tmpdir();
	}
	/* BF16 reaches far beyond fp16: 1e5 (99840 in BF16) */
	make_tmpdir();
	edit_at = 3;
	edit_value = 1e5f;
	edit_bf16 = true;
	rewrite_checkpoint("model.decoder.layers.0.fc2.bias", EDIT_VALUE);
	edit_bf16 = false;
	expect_model_fails(SL_ERANGE, "tensor 'model.decoder.layers.0.fc2.bias' holds 99840 at [3], beyond the range of fp16");
	rm_tmpdir();
	make_tmpdir();
	edit_at = 0;
	edit_value = -65519.0f;
	rewrite_checkpoint("model.decoder.layers.1.fc2.bias", EDIT_VALUE);
	sl_backend *be = NULL;
	ck_assert_int_eq(sl_backend_create("cpu", 1, &be), 0);
	sl_model *m = NULL;
	ck_assert_msg(sl_model_open(be, tmpdir, NULL, &m) == 0, "%s", sl_errmsg());
	ck_assert_float_eq(sl_half_to_float(m->w.layers[1].fc2_b[0]), -65504.0f);
	sl_model_free(m);
	sl_backend_free(be);
	rm_tmpdir();
}
END_TEST

START_TEST(test_bad_configs)
{
	static const struct {
		const char *text;
		int code;
		const char *needle;
	} cases[] = {
		{ "{\"model_type\": \"bert\", \"hidden_size\": 64}", SL_EUNSUPPORTED,
		  "config.json: model_type 'bert' is not supported (sluice runs opt, llama, mistral and qwen2)" },
		{ "{\"hidden_size\": 64}", SL_EUNSUPPORTED, "config.json: model_type missing is not supported" },
		/* the LLaMA family's config reader, through the model */
		{ "{\"model_type\": \"llama\", \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
		  " \"hidden_size\": 64, \"intermediate_size\": 128, \"vocab_size\": 256,"
		  " \"max_position_embeddings\": 128, \"rms_norm_eps\": 1e-6,"
		  " \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 2.0}}",
		  SL_EUNSUPPORTED, "yarn" },
		{ "{\"model_type\": \"opt\", \"hidden_size\": 64", SL_EFORMAT, "not valid JSON" },
		{ "{\"model_type\": \"opt\", \"num_hidden_layers\": 2, \"num_attention_heads\": 5,"
		  " \"hidden_size\": 64, \"ffn_dim\": 256, \"vocab_size\": 512}",
		  SL_EFORMAT, "not a multiple" },
		{ "{\"model_type\": \"opt\", \"num_attention_heads\": 4, \"hidden_size\": 64,"
		  " \"ffn_dim\": 256, \"vocab_size\": 512}",
		  SL_EFORMAT, "missing field 'num_hidden_layers'" },
		{ "{\"model_type\": \"opt\", \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
		  " \"hidden_size\": 64, \"ffn_dim\": 256, \"vocab_size\": 512,"
		  " \"activation_function\": \"gelu\"}",
		  SL_EUNSUPPORTED, "activation_function 'gelu'" },
		/* token ids must name tokens of the model's vocabulary */
		{ "{\"model_type\": \"opt\", \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
		  " \"hidden_size\": 64, \"ffn_dim\": 256, \"vocab_size\": 512, \"bos_token_id\": 512}",
		  SL_EFORMAT, "config.json: bos_token_id 512 is outside the vocabulary (0..511)" },
		{ "{\"model_type\": \"opt\", \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
		  " \"hidden_size\": 64, \"ffn_dim\": 256, \"vocab_size\": 512, \"bos_token_id\": -1}",
		  SL_EFORMAT, "config.json: bos_token_id -1 is outside the vocabulary" },
		{ "{\"model_type\": \"opt\", \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
		  " \"hidden_size\": 64, \"ffn_dim\": 256, \"vocab_size\": 512, \"eos_token_id\": 600}",
		  SL_EFORMAT, "config.json: eos_token_id 600 is outside the vocabulary (0..511)" },
		{ "{\"model_type\": \"opt\", \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
		  " \"hidden_size\": 64, \"ffn_dim\": 256, \"vocab_size\": 512, \"pad_token_id\": 9999}",
		  SL_EFORMAT, "config.json: pad_token_id 9999 is outside the vocabulary (0..511)" },
	};
	make_tmpdir();
	rewrite_checkpoint("none", EDIT_DROP);
	char path[400];
	snprintf(path, sizeof path, "%s/config.json", tmpdir);
	for (size_t i = 0; i < SL_ARRAY_LEN(cases); i++) {
		write_file(path, cases[i].text, strlen(cases[i].text));
		expect_model_fails(cases[i].code, cases[i].needle);
	}
	unlink(path);
	expect_model_fails(SL_ENOTFOUND, "config.json");
	rm_tmpdir();
}
END_TEST

static const struct {
	const char *text;
	int code;
	const char *needle;
} bad_jsonl[] = {
	{ "{\"input_ids\": [5, 6]}\n{\"input_ids\": [5,\n", SL_EFORMAT, ":2: not valid JSON" },
	{ "{\"input_ids\": [5, 6]}\n\n{\"prompt_ids\": [1]}\n", SL_EFORMAT,
	  ":3: missing \"prompt\" (or \"input_ids\")" },
	{ "{\"prompt\": \"hello\"}\n", SL_EUNSUPPORTED, ":1: \"prompt\" is text but the model has no tokenizer" },
	{ "{\"input_ids\": [5, 600]}\n", SL_ERANGE, ":1: input_ids[1] = 600 is outside the vocabulary" },
	{ "{\"input_ids\": [-1]}\n", SL_ERANGE, "outside the vocabulary" },
	{ "{\"input_ids\": []}\n", SL_EFORMAT, "non-empty array" },
	{ "{\"input_ids\": [1.5]}\n", SL_EFORMAT, "input_ids[0] is not an integer" },
	{ "[1, 2]\n", SL_EFORMAT, "must be a JSON object" },
	{ "{\"input_ids\": [4], \"max_new_tokens\": 0}\n", SL_EFORMAT, "max_new_tokens" },
	{ "", SL_EFORMAT, "no prompts" },
	{ "\n  \n", SL_EFORMAT, "no prompts" },
};

START_TEST(test_bad_jsonl)
{
	make_tmpdir();
	char path[400];
	snprintf(path, sizeof path, "%s/in.jsonl", tmpdir);
	write_file(path, bad_jsonl[_i].text, strlen(bad_jsonl[_i].text));
	sl_prompts ps;
	sl_read_opts ro = { .vocab = 512 };
	int rc = sl_prompts_read(path, &ro, &ps);
	ck_assert_msg(rc == bad_jsonl[_i].code, "case %d: got %s: %s", _i, sl_strerror(rc), sl_errmsg());
	ck_assert_msg(strstr(sl_errmsg(), path), "message does not name the file: %s", sl_errmsg());
	ck_assert_msg(strstr(sl_errmsg(), bad_jsonl[_i].needle), "message lacks '%s': %s",
		      bad_jsonl[_i].needle, sl_errmsg());
	ck_assert_ptr_null(ps.p);
	rm_tmpdir();
}
END_TEST

START_TEST(test_good_jsonl)
{
	make_tmpdir();
	char path[400];
	snprintf(path, sizeof path, "%s/in.jsonl", tmpdir);
	const char *text = "{\"input_ids\": [5, 6], \"id\": \"a\", \"extra\": 1}\n"
			   "\r\n{\"input_ids\": [7], \"max_new_tokens\": 3}\n";
	write_file(path, text, strlen(text));
	sl_prompts ps;
	sl_read_opts ro = { .vocab = 512 };
	ck_assert_int_eq(sl_prompts_read(path, &ro, &ps), 0);
	ck_assert_int_eq(ps.n, 2);
	ck_assert_str_eq(ps.p[0].id_json, "\"a\"");
	ck_assert_str_eq(ps.p[1].id_json, "3"); /* the line number where no id is given */
	ck_assert_int_eq(ps.p[1].max_new, 3);
	ck_assert_int_eq(ps.p[0].n, 2);
	sl_prompts_free(&ps);
	/* --skip-bad-lines keeps a bad line as an error with its id */
	const char *mixed = "{\"input_ids\": [5]}\n{\"id\": 9, \"input_ids\": [999]}\nnot json\n";
	write_file(path, mixed, strlen(mixed));
	ro.skip_bad_lines = true;
	ck_assert_int_eq(sl_prompts_read(path, &ro, &ps), 0);
	ck_assert_int_eq(ps.n, 3);
	ck_assert_int_eq(ps.bad, 2);
	ck_assert_ptr_null(ps.p[0].error);
	ck_assert_str_eq(ps.p[1].id_json, "9");
	ck_assert_msg(strstr(ps.p[1].error, "outside the vocabulary"), "%s", ps.p[1].error);
	ck_assert_str_eq(ps.p[2].id_json, "3");
	ck_assert_msg(strstr(ps.p[2].error, ":3: not valid JSON"), "%s", ps.p[2].error);
	sl_prompts_free(&ps);

	/* output: refuses to clobber; a fresh output that is discarded leaves nothing */
	char outp[400], partial[420];
	snprintf(outp, sizeof outp, "%s/out.jsonl", tmpdir);
	snprintf(partial, sizeof partial, "%s.partial", outp);
	sl_output *o = NULL;
	bool complete = false;
	ck_assert_int_eq(sl_output_open(path, SL_OUT_NEW, &o, &complete), SL_EINVAL);
	ck_assert_msg(strstr(sl_errmsg(), "--overwrite"), "%s", sl_errmsg());
	ck_assert_int_eq(sl_output_open(outp, SL_OUT_NEW, &o, &complete), 0);
	ck_assert_int_eq(sl_output_write(o, "{\"id\":7}", 8), 0);
	sl_output_close(o, true);
	ck_assert_int_ne(access(outp, F_OK), 0);
	ck_assert_int_ne(access(partial, F_OK), 0);
	/* an interrupted run's partial output: refused without --resume, resumed with it */
	ck_assert_int_eq(sl_output_open(outp, SL_OUT_NEW, &o, &complete), 0);
	ck_assert_int_eq(sl_output_write(o, "{\"id\":7}", 8), 0);
	ck_assert_int_eq(sl_output_sync(o), 0);
	sl_output_close(o, false);
	ck_assert_int_eq(sl_output_open(outp, SL_OUT_NEW, &o, &complete), SL_EINVAL);
	ck_assert_msg(strstr(sl_errmsg(), "--resume"), "%s", sl_errmsg());
	ck_assert_int_eq(sl_output_open(outp, SL_OUT_RESUME, &o, &complete), 0);
	int n = 0;
	char **ids;
	off_t *ends;
	ck_assert_int_eq(sl_output_lines(o, &n, &ids, &ends), 0);
	ck_assert_int_eq(n, 1);
	ck_assert_str_eq(ids[0], "7");
	ck_assert_int_eq(sl_output_commit(o), 0);
	sl_output_close(o, false);
	ck_assert_int_eq(access(outp, F_OK), 0);
	/* a complete output is opened for reading, its ids to be checked */
	ck_assert_int_eq(sl_output_open(outp, SL_OUT_RESUME, &o, &complete), 0);
	ck_assert(complete);
	ck_assert_int_eq(sl_output_lines(o, &n, &ids, &ends), 0);
	ck_assert_int_eq(n, 1);
	ck_assert_str_eq(ids[0], "7");
	sl_output_close(o, false);
	ck_assert_int_eq(access(outp, F_OK), 0);
	snprintf(outp, sizeof outp, "%s/no/such/dir/out.jsonl", tmpdir);
	ck_assert_int_eq(sl_output_open(outp, SL_OUT_NEW, &o, &complete), SL_ENOTFOUND);
	ck_assert_msg(strstr(sl_errmsg(), outp), "%s", sl_errmsg());
	rm_tmpdir();
}
END_TEST

/* Data compressed as zstd frames with checksums (as the zstd tool writes
 * them), frame k holding src[cuts[k], cuts[k+1]) (cuts need not fall
 * between lines); returns the bytes, *n their count. */
static char *zst_frames(const char *src, const size_t *cuts, int nframes, size_t *n)
{
	size_t cap = ZSTD_compressBound(cuts[nframes]) + 64 * (size_t)nframes;
	char *out = malloc(cap);
	ck_assert_ptr_nonnull(out);
	ZSTD_CCtx *cc = ZSTD_createCCtx();
	ck_assert(!ZSTD_isError(ZSTD_CCtx_setParameter(cc, ZSTD_c_checksumFlag, 1)));
	*n = 0;
	for (int k = 0; k < nframes; k++) {
		size_t r = ZSTD_compress2(cc, out + *n, cap - *n, src + cuts[k], cuts[k + 1] - cuts[k]);
		ck_assert_msg(!ZSTD_isError(r), "%s", ZSTD_getErrorName(r));
		*n += r;
	}
	ZSTD_freeCCtx(cc);
	return out;
}

/* The whole decompressed content of a file of zstd frames. */
static char *zst_read_all(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	ck_assert_ptr_nonnull(f);
	fseek(f, 0, SEEK_END);
	size_t cn = (size_t)ftell(f);
	rewind(f);
	char *c = malloc(cn + 1);
	ck_assert_uint_eq(fread(c, 1, cn, f), cn);
	fclose(f);
	size_t cap = 1 << 20;
	char *u = malloc(cap);
	ZSTD_DCtx *d = ZSTD_createDCtx();
	ZSTD_inBuffer in = { c, cn, 0 };
	ZSTD_outBuffer out = { u, cap, 0 };
	size_t r = 0;
	while (in.pos < in.size) {
		r = ZSTD_decompressStream(d, &out, &in);
		ck_assert_msg(!ZSTD_isError(r), "%s: %s", path, ZSTD_getErrorName(r));
	}
	ck_assert_uint_eq(r, 0);
	ZSTD_freeDCtx(d);
	free(c);
	*n = out.pos;
	return u;
}

/* .jsonl.zst input: read as a stream, over frames that split lines and
 * over more data than one read of the stream; truncated, corrupt or
 * uncompressed data refused with the file and the byte named. */
START_TEST(test_zst_jsonl)
{
	make_tmpdir();
	const int lines = 3000;
	size_t cap = (size_t)lines * 64, len = 0;
	char *text = malloc(cap);
	for (int i = 0; i < lines; i++)
		len += (size_t)snprintf(text + len, cap - len, "{\"id\": \"q%d\", \"input_ids\": [%d, %d]}\n", i,
					i % 500, (i * 7) % 500);
	const size_t cuts[] = { 0, 1000, len / 2 + 3, len };
	size_t zn;
	char *z = zst_frames(text, cuts, 3, &zn);
	char path[400];
	snprintf(path, sizeof path, "%s/in.jsonl.zst", tmpdir);
	write_file(path, z, zn);
	sl_prompts ps;
	sl_read_opts ro = { .vocab = 512 };
	ck_assert_int_eq(sl_prompts_read(path, &ro, &ps), 0);
	ck_assert_int_eq(ps.n, lines);
	for (int i = 0; i < lines; i += 997) {
		char id[32];
		snprintf(id, sizeof id, "\"q%d\"", i);
		ck_assert_str_eq(ps.p[i].id_json, id);
		ck_assert_int_eq(ps.p[i].n, 2);
		ck_assert_int_eq(ps.p[i].ids[1], (i * 7) % 500);
	}
	sl_prompts_free(&ps);

	/* truncated inside the last frame: named with the byte where it ends */
	write_file(path, z, zn - 5);
	ck_assert_int_eq(sl_prompts_read(path, &ro, &ps), SL_EFORMAT);
	ck_assert_msg(strstr(sl_errmsg(), path) && strstr(sl_errmsg(), "truncated"), "%s", sl_errmsg());
	char at[64];
	snprintf(at, sizeof at, "at byte %zu", zn - 5);
	ck_assert_msg(strstr(sl_errmsg(), at), "%s", sl_errmsg());
	ck_assert_ptr_null(ps.p);
	/* a flipped byte in the middle: the frame's checksum or its coding fails */
	z[zn / 2] ^= 0x5a;
	write_file(path, z, zn);
	ck_assert_int_eq(sl_prompts_read(path, &ro, &ps), SL_EFORMAT);
	ck_assert_msg(strstr(sl_errmsg(), path) && strstr(sl_errmsg(), "corrupt zstd data in the frame"),
		      "%s", sl_errmsg());
	ck_assert_ptr_null(ps.p);
	/* an uncompressed file named .zst */
	write_file(path, text, len);
	ck_assert_int_eq(sl_prompts_read(path, &ro, &ps), SL_EFORMAT);
	ck_assert_msg(strstr(sl_errmsg(), "not zstd-compressed"), "%s", sl_errmsg());
	/* an empty one: no prompts, as for plain JSONL */
	write_file(path, "", 0);
	ck_assert_int_eq(sl_prompts_read(path, &ro, &ps), SL_EFORMAT);
	ck_assert_msg(strstr(sl_errmsg(), "no prompts"), "%s", sl_errmsg());
	/* a bad line inside compressed data: its line number, as for plain */
	const char *bad = "{\"input_ids\": [5]}\n{\"input_ids\": [5,\n";
	const size_t bcuts[] = { 0, strlen(bad) };
	free(z);
	z = zst_frames(bad, bcuts, 1, &zn);
	write_file(path, z, zn);
	ck_assert_int_eq(sl_prompts_read(path, &ro, &ps), SL_EFORMAT);
	ck_assert_msg(strstr(sl_errmsg(), "in.jsonl.zst:2: not valid JSON"), "%s", sl_errmsg());
	free(z);
	free(text);
	rm_tmpdir();
}
END_TEST

/* .jsonl.zst output: one frame per sync; resume keeps the whole frames'
 * lines, cuts a torn frame, and a cut inside a frame keeps the lines
 * before it. */
START_TEST(test_zst_output)
{
	make_tmpdir();
	char outp[400], partial[420];
	snprintf(outp, sizeof outp, "%s/out.jsonl.zst", tmpdir);
	snprintf(partial, sizeof partial, "%s.partial", outp);
	const char *ls[] = { "{\"id\":0}", "{\"id\":1,\"x\":\"aaaa\"}", "{\"id\":2}", "{\"id\":3}",
			     "{\"id\":4}" };
	sl_output *o = NULL;
	bool complete = false;
	ck_assert_int_eq(sl_output_open(outp, SL_OUT_NEW, &o, &complete), 0);
	for (int i = 0; i < 5; i++) {
		ck_assert_int_eq(sl_output_write(o, ls[i], strlen(ls[i])), 0);
		if (i == 2 || i == 4)
			ck_assert_int_eq(sl_output_sync(o), 0); /* two blocks: 0-2, 3-4 */
	}
	sl_output_close(o, false);
	/* two frames, the first the first block's lines */
	FILE *f = fopen(partial, "rb");
	ck_assert_ptr_nonnull(f);
	char c[4096];
	size_t cn = fread(c, 1, sizeof c, f);
	fclose(f);
	size_t f0 = ZSTD_findFrameCompressedSize(c, cn);
	ck_assert(!ZSTD_isError(f0) && f0 < cn);
	ck_assert_uint_eq(ZSTD_findFrameCompressedSize(c + f0, cn - f0), cn - f0);
	char u[256];
	size_t un = ZSTD_decompress(u, sizeof u, c, f0);
	ck_assert_uint_eq(un, strlen(ls[0]) + strlen(ls[1]) + strlen(ls[2]) + 3);
	ck_assert(!memcmp(u, "{\"id\":0}\n{\"id\":1,", 17));

	/* a torn third frame (a crash while it was written) is not a line */
	f = fopen(partial, "ab");
	fwrite(c, 1, f0 / 2, f);
	fclose(f);
	ck_assert_int_eq(sl_output_open(outp, SL_OUT_RESUME, &o, &complete), 0);
	ck_assert(!complete);
	int n = 0;
	char **ids;
	off_t *ends;
	ck_assert_int_eq(sl_output_lines(o, &n, &ids, &ends), 0);
	ck_assert_int_eq(n, 5);
	ck_assert_str_eq(ids[4], "4");
	ck_assert_int_eq(ends[2], (off_t)un);
	/* cut inside the second frame, after line 3 (another --batch-size) */
	ck_assert_int_eq(sl_output_truncate(o, ends[3]), 0);
	ck_assert_int_eq(sl_output_write(o, "{\"id\":9}", 8), 0);
	ck_assert_int_eq(sl_output_commit(o), 0);
	sl_output_close(o, false);
	ck_assert_int_ne(access(partial, F_OK), 0);
	size_t an;
	char *all = zst_read_all(outp, &an);
	const char *want = "{\"id\":0}\n{\"id\":1,\"x\":\"aaaa\"}\n{\"id\":2}\n{\"id\":3}\n{\"id\":9}\n";
	ck_assert_uint_eq(an, strlen(want));
	ck_assert(!memcmp(all, want, an));
	free(all);
	/* a complete output is read back for the check against the input */
	ck_assert_int_eq(sl_output_open(outp, SL_OUT_RESUME, &o, &complete), 0);
	ck_assert(complete);
	ck_assert_int_eq(sl_output_lines(o, &n, &ids, &ends), 0);
	ck_assert_int_eq(n, 5);
	ck_assert_str_eq(ids[4], "9");
	sl_output_close(o, false);

	/* a corrupt frame ends the whole lines before it: resume cuts it */
	ck_assert_int_eq(rename(outp, partial), 0);
	f = fopen(partial, "r+b");
	ck_assert_ptr_nonnull(f);
	fseek(f, (long)f0 + 6, SEEK_SET);
	int ch = fgetc(f);
	fseek(f, (long)f0 + 6, SEEK_SET);
	fputc(ch ^ 0xff, f);
	fclose(f);
	ck_assert_int_eq(sl_output_open(outp, SL_OUT_RESUME, &o, &complete), 0);
	ck_assert_int_eq(sl_output_lines(o, &n, &ids, &ends), 0);
	ck_assert_int_eq(n, 3);
	ck_assert_int_eq(sl_output_truncate(o, ends[2]), 0);
	ck_assert_int_eq(sl_output_commit(o), 0);
	sl_output_close(o, false);
	all = zst_read_all(outp, &an);
	ck_assert_uint_eq(an, un);
	free(all);
	rm_tmpdir();
}
END_TEST

START_TEST(test_prompt_too_long)
{
	char dir[600];
	snprintf(dir, sizeof dir, "%s/opt-long", fixtures_dir);
	sl_backend *be = NULL;
	ck_assert_int_eq(sl_backend_create("cpu", 1, &be), 0);
	sl_model *m = NULL;
	ck_assert_int_eq(sl_model_open(be, dir, NULL, &m), 0);
	const int t = m->cfg.max_pos + 1;
	sl_kv *kv = NULL;
	ck_assert_int_eq(sl_kv_create(&m->kv_env, 1, t, &kv), 0);
	int32_t *ids = calloc((size_t)t, sizeof *ids);
	int npad = 0;
	for (int i = 0; i < t; i++)
		ids[i] = 5;
	ck_assert_int_eq(sl_model_prefill(m, kv, ids, &npad, t, NULL), SL_ERANGE);
	ck_assert_msg(strstr(sl_errmsg(), "longer than the model's"), "%s", sl_errmsg());
	ids[0] = m->cfg.vocab; /* outside the vocabulary */
	ck_assert_int_eq(sl_model_prefill(m, kv, ids, &npad, 4, NULL), SL_ERANGE);
	free(ids);
	sl_kv_free(kv);
	sl_model_free(m);
	sl_backend_free(be);
}
END_TEST

START_TEST(test_budget_too_small)
{
	char dir[600];
	snprintf(dir, sizeof dir, "%s/opt-pre", fixtures_dir);
	sl_backend *be = NULL;
	ck_assert_int_eq(sl_backend_create("cpu", 1, &be), 0);
	sl_backend_set_dev_limit(be, 100000);
	sl_model *m = NULL;
	int rc = sl_model_open(be, dir, NULL, &m);
	ck_assert_int_eq(rc, SL_EBUDGET);
	ck_assert_msg(strstr(sl_errmsg(), "device memory budget exceeded"), "%s", sl_errmsg());
	ck_assert_int_eq(be->dev_used, 0);
	sl_backend_free(be);
	ck_assert_int_eq(sl_backend_create("tpu", 1, &be), SL_EINVAL);
	/* "auto" resolves, without a backend, to the one it would create */
	ck_assert_int_eq(sl_backend_create("auto", 1, &be), 0);
	ck_assert_str_eq(sl_backend_resolve("auto"), be->ops->name);
	ck_assert_str_eq(sl_backend_resolve(NULL), be->ops->name);
	ck_assert_str_eq(sl_backend_resolve("cpu"), "cpu");
	sl_backend_free(be);
}
END_TEST

/* JSON written with every setter checked: a value JSON cannot hold (NaN,
 * infinity, text that is not UTF-8) or a failed set is an error naming the
 * field, never a field silently missing. */
START_TEST(test_json_setters)
{
	sl_jerr e = { 0 };
	json_t *j = json_object(), *a = json_array();
	sl_jset(j, "id", json_integer(3), &e);
	sl_jset_real(j, "wall_s", 1.5, &e);
	sl_jappend_real(a, -0.25, "logprobs", &e);
	ck_assert_int_eq(sl_jcheck(&e, "out"), 0);
	sl_jappend_real(a, NAN, "logprobs", &e);
	sl_jset_real(j, "perplexity", INFINITY, &e); /* the first failure is the one named */
	sl_jset(j, "logprobs", a, &e);
	ck_assert_int_eq(json_array_size(a), 1);
	ck_assert_int_eq(sl_jcheck(&e, "out"), SL_ERANGE);
	ck_assert_msg(strstr(sl_errmsg(), "out: \"logprobs\" is nan"), "%s", sl_errmsg());
	sl_jerr e2 = { 0 };
	sl_jset(j, "text", json_string("bad \xff byte"), &e2); /* jansson: NULL */
	sl_jset(j, "more", json_integer(1), &e2);
	ck_assert_int_eq(sl_jcheck(&e2, "out"), SL_ENOMEM);
	ck_assert_msg(strstr(sl_errmsg(), "\"text\""), "%s", sl_errmsg());
	sl_jerr e3 = { 0 };
	sl_jset(NULL, "x", json_integer(1), &e3); /* a failed json_object() */
	ck_assert_int_eq(sl_jcheck(&e3, "out"), SL_ENOMEM);
	json_decref(j);
}
END_TEST

int main(int argc, char **argv)
{
	if (argc > 1)
		fixtures_dir = argv[1];
	Suite *s = suite_create("badinput");
	TCase *tc = tcase_create("errors");
	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, test_corrupt_headers, 0, (int)SL_ARRAY_LEN(bad_headers));
	tcase_add_test(tc, test_truncated_files);
	tcase_add_test(tc, test_missing_tensor);
	tcase_add_test(tc, test_wrong_shape);
	tcase_add_test(tc, test_llama_missing_tensor);
	tcase_add_test(tc, test_llama_wrong_shape);
	tcase_add_test(tc, test_wrong_dtype);
	tcase_add_test(tc, test_unrepresentable_weights);
	tcase_add_test(tc, test_bad_configs);
	tcase_add_loop_test(tc, test_bad_jsonl, 0, (int)SL_ARRAY_LEN(bad_jsonl));
	tcase_add_test(tc, test_good_jsonl);
	tcase_add_test(tc, test_zst_jsonl);
	tcase_add_test(tc, test_zst_output);
	tcase_add_test(tc, test_prompt_too_long);
	tcase_add_test(tc, test_budget_too_small);
	tcase_add_test(tc, test_json_setters);
	suite_add_tcase(s, tc);
	return sl_test_run(s);
}
