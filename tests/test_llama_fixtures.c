/*
 * test_llama_fixtures.c - the LLaMA-family fixtures (tests/fixtures/llama-*,
 * mistral, qwen2; tools/make_llama_fixtures.py) are what they claim to be,
 * read with sluice's own safetensors reader (runtime/safetensors.c).  No
 * model runs them yet; this holds them to their purpose until one does:
 *
 *  - each fixture has the property it was made for (grouped KV heads,
 *    Llama 3 rope scaling and bf16 storage, Mistral, Qwen2's q/k/v biases
 *    in a sharded checkpoint, a tied head), read from its config.json;
 *  - its tensors are exactly a Llama-family checkpoint's for that config
 *    (the table below is written here from the transformers layout, not
 *    read from the script): every name, shape and dtype, none missing and
 *    none extra, and golden.json's record of them agrees;
 *  - every weight is finite and exactly representable in fp16 (the script
 *    rounds them so, so that a runtime keeping fp16 weights sees the
 *    reference's weights: for the bf16 fixture, its conversion is exact);
 *  - golden.json's goldens are well formed (logits.bin's size, one
 *    log-probability <= 0 per greedy token, tokens inside the vocabulary).
 *
 * argv[1]: tests/fixtures.
 */
#include "safetensors.h"
#include "sl_common.h"

#include "testutil.h"

#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static const char *g_dir;

typedef struct fixture {
	const char *name, *model_type;
	int kv_heads;        /* as the script makes it */
	bool llama3_rope, bias, tied, sharded;
	enum sl_dtype dtype;
} fixture;

static const fixture fixtures[] = {
	{ "llama-gqa", "llama", 2, false, false, false, false, SL_DT_F16 },
	{ "llama3-rope", "llama", 1, true, false, false, false, SL_DT_BF16 },
	{ "mistral", "mistral", 2, false, false, false, false, SL_DT_F16 },
	{ "qwen2", "qwen2", 2, false, true, false, true, SL_DT_F16 },
	{ "llama-tied", "llama", 4, false, false, true, false, SL_DT_F16 },
};

static int cfg_int(json_t *cfg, const char *key)
{
	json_t *v = json_object_get(cfg, key);
	ck_assert_msg(json_is_integer(v), "config.json: %s is not an integer", key);
	return (int)json_integer_value(v);
}

/* One expected tensor: checked against the set, then counted. */
static void expect(const sl_st_set *st, json_t *rec, enum sl_dtype dt, const char *name, int64_t d0,
		   int64_t d1)
{
	const sl_st_tensor *t = sl_st_find(st, name);
	ck_assert_msg(t != NULL, "tensor %s missing", name);
	ck_assert_msg(t->dtype == dt, "%s: dtype %s", name, t->dtype_name);
	const int nd = d1 ? 2 : 1;
	ck_assert_msg(t->ndim == nd && t->shape[0] == d0 && (nd == 1 || t->shape[1] == d1),
		      "%s: shape [%lld, %lld] (ndim %d), want [%lld, %lld]", name,
		      (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : 0), t->ndim,
		      (long long)d0, (long long)d1);
	/* golden.json's record of the same tensor */
	json_t *r = json_object_get(rec, name);
	ck_assert_msg(r != NULL, "golden.json has no record of %s", name);
	ck_assert_str_eq(json_string_value(json_object_get(r, "dtype")), t->dtype_name);
	json_t *sh = json_object_get(r, "shape");
	ck_assert_int_eq((int)json_array_size(sh), nd);
	ck_assert_int_eq(json_integer_value(json_array_get(sh, 0)), d0);
	if (nd == 2)
		ck_assert_int_eq(json_integer_value(json_array_get(sh, 1)), d1);
	/* every value finite and exactly an fp16 value */
	const uint16_t *v = t->data;
	const size_t n = t->nbytes / 2;
	for (size_t i = 0; i < n; i++) {
		uint16_t raw;
		memcpy(&raw, v + i, 2);
		const float f = dt == SL_DT_BF16 ? sl_bf16_to_float(raw) : sl_half_to_float(raw);
		if (!isfinite(f) || sl_half_to_float(sl_float_to_half(f)) != f)
			ck_abort_msg("%s[%zu] = %.9g is not a finite fp16 value", name, i, (double)f);
	}
}

START_TEST(test_fixture)
{
	const fixture *fx = &fixtures[_i];
	char path[512];
	snprintf(path, sizeof path, "%s/%s/config.json", g_dir, fx->name);
	json_error_t err;
	json_t *cfg = json_load_file(path, 0, &err);
	ck_assert_msg(cfg != NULL, "%s: %s", path, err.text);
	snprintf(path, sizeof path, "%s/%s/golden.json", g_dir, fx->name);
	json_t *gold = json_load_file(path, 0, &err);
	ck_assert_msg(gold != NULL, "%s: %s", path, err.text);

	/* the property the fixture exists for */
	ck_assert_str_eq(json_string_value(json_object_get(cfg, "model_type")), fx->model_type);
	ck_assert_str_eq(json_string_value(json_object_get(gold, "model_type")), fx->model_type);
	const int H = cfg_int(cfg, "hidden_size"), nh = cfg_int(cfg, "num_attention_heads");
	const int nkv = cfg_int(cfg, "num_key_value_heads"), L = cfg_int(cfg, "num_hidden_layers");
	const int I = cfg_int(cfg, "intermediate_size"), V = cfg_int(cfg, "vocab_size");
	ck_assert_int_eq(nkv, fx->kv_heads);
	ck_assert_int_eq(nh % nkv, 0);
	ck_assert_int_eq(H % nh, 0);
	const int hd = H / nh;
	ck_assert(json_is_boolean(json_object_get(cfg, "tie_word_embeddings")));
	ck_assert_int_eq(json_is_true(json_object_get(cfg, "tie_word_embeddings")), fx->tied);
	json_t *rs = json_object_get(cfg, "rope_scaling");
	if (fx->llama3_rope) {
		ck_assert_str_eq(json_string_value(json_object_get(rs, "rope_type")), "llama3");
		ck_assert(json_number_value(json_object_get(rs, "factor")) > 1.0);
	} else {
		ck_assert_msg(rs == NULL || json_is_null(rs), "%s: rope_scaling set", fx->name);
	}
	ck_assert(json_number_value(json_object_get(cfg, "rope_theta")) > 0.0);
	ck_assert_str_eq(json_string_value(json_object_get(cfg, "torch_dtype")),
			 fx->dtype == SL_DT_BF16 ? "bfloat16" : "float16");
	ck_assert_str_eq(json_string_value(json_object_get(gold, "weights_dtype")),
			 fx->dtype == SL_DT_BF16 ? "bf16" : "fp16");

	/* the tensors: one file, or shards with an index */
	snprintf(path, sizeof path, "%s/%s/model.safetensors.index.json", g_dir, fx->name);
	struct stat sb;
	ck_assert_int_eq(stat(path, &sb) == 0, fx->sharded);
	snprintf(path, sizeof path, "%s/%s", g_dir, fx->name);
	sl_st_set *st = NULL;
	ck_assert_msg(sl_st_open_dir(path, &st) == 0, "%s: %s", path, sl_errmsg());
	ck_assert_int_eq(sl_st_nfiles(st), fx->sharded ? 2 : 1);
	json_t *rec = json_object_get(gold, "tensors");
	const enum sl_dtype dt = fx->dtype;
	size_t want = 0;
	expect(st, rec, dt, "model.embed_tokens.weight", V, H), want++;
	expect(st, rec, dt, "model.norm.weight", H, 0), want++;
	if (!fx->tied)
		expect(st, rec, dt, "lm_head.weight", V, H), want++;
	else
		ck_assert_ptr_null(sl_st_find(st, "lm_head.weight"));
	for (int l = 0; l < L; l++) {
		char n[128];
#define LAYER(suffix, d0, d1)                                                 \
	do {                                                                  \
		snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix);       \
		expect(st, rec, dt, n, d0, d1);                               \
		want++;                                                       \
	} while (0)
		LAYER("input_layernorm.weight", H, 0);
		LAYER("post_attention_layernorm.weight", H, 0);
		LAYER("self_attn.q_proj.weight", nh * hd, H);
		LAYER("self_attn.k_proj.weight", nkv * hd, H);
		LAYER("self_attn.v_proj.weight", nkv * hd, H);
		LAYER("self_attn.o_proj.weight", H, nh * hd);
		if (fx->bias) {
			LAYER("self_attn.q_proj.bias", nh * hd, 0);
			LAYER("self_attn.k_proj.bias", nkv * hd, 0);
			LAYER("self_attn.v_proj.bias", nkv * hd, 0);
		}
		LAYER("mlp.gate_proj.weight", I, H);
		LAYER("mlp.up_proj.weight", I, H);
		LAYER("mlp.down_proj.weight", H, I);
#undef LAYER
	}
	ck_assert_msg(sl_st_count(st) == want, "%s: %zu tensors, want %zu", fx->name,
		      sl_st_count(st), want);
	ck_assert_uint_eq(json_object_size(rec), want);
	sl_st_close(st);

	/* the goldens are well formed */
	json_t *prompts = json_object_get(gold, "prompts"), *greedy = json_object_get(gold, "greedy");
	json_t *lps = json_object_get(gold, "greedy_logprobs"), *rows = json_object_get(gold, "logits_rows");
	const size_t np = json_array_size(prompts);
	ck_assert_uint_ge(np, 1);
	ck_assert_uint_eq(json_array_size(greedy), np);
	ck_assert_uint_eq(json_array_size(lps), np);
	ck_assert_uint_eq(json_array_size(rows), np);
	ck_assert_int_eq(cfg_int(gold, "vocab_size"), V);
	const int nnew = cfg_int(gold, "greedy_new_tokens");
	long long nrows = 0;
	for (size_t i = 0; i < np; i++) {
		json_t *p = json_array_get(prompts, i), *g = json_array_get(greedy, i);
		json_t *lp = json_array_get(lps, i);
		ck_assert_int_eq(json_integer_value(json_array_get(rows, i)), (long long)json_array_size(p));
		nrows += (long long)json_array_size(p);
		ck_assert_uint_ge(json_array_size(g), 1);
		ck_assert_int_le((int)json_array_size(g), nnew);
		ck_assert_uint_eq(json_array_size(lp), json_array_size(g));
		for (size_t j = 0; j < json_array_size(g); j++) {
			const long long t = json_integer_value(json_array_get(g, j));
			ck_assert(t >= 0 && t < V);
			const double l = json_number_value(json_array_get(lp, j));
			ck_assert_msg(l <= 0.0 && isfinite(l), "%s: log-prob %g", fx->name, l);
		}
	}
	snprintf(path, sizeof path, "%s/%s/logits.bin", g_dir, fx->name);
	ck_assert_int_eq(stat(path, &sb), 0);
	ck_assert_int_eq((long long)sb.st_size, nrows * V * 4);
	json_decref(cfg);
	json_decref(gold);
}
END_TEST

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: test_llama_fixtures FIXTURES_DIR\n");
		return 2;
	}
	g_dir = argv[1];
	Suite *s = suite_create("llama_fixtures");
	TCase *tc = tcase_create("fixtures");
	tcase_add_loop_test(tc, test_fixture, 0, (int)SL_ARRAY_LEN(fixtures));
	suite_add_tcase(s, tc);
	return sl_test_run(s);
}
