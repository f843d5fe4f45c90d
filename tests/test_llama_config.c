/*
 * test_llama_config.c - runtime/llama_config.c: the LLaMA-family fixtures'
 * config.json read as the script wrote them; the rules of llama_config.h
 * on small configs written here (missing num_key_value_heads, rope_scaling
 * types and their two keys, transformers 5's rope_parameters, eos lists,
 * Qwen2's window switch, biases); bad input refused in one line naming the
 * file and the field; the --dummy shapes against the parameter counts the
 * published checkpoints report.
 *
 * argv[1]: tests/fixtures.
 */
#include "llama_config.h"
#include "sl_common.h"

#include "testutil.h"

#include <check.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const char *g_dir;

START_TEST(test_fixture_configs)
{
	char path[512];
	sl_llama_config c;
	snprintf(path, sizeof path, "%s/llama-gqa/config.json", g_dir);
	ck_assert_msg(sl_llama_config_load(path, &c) == 0, "%s", sl_errmsg());
	ck_assert_str_eq(c.model_type, "llama");
	ck_assert_int_eq(c.n_layer, 2);
	ck_assert_int_eq(c.n_head, 4);
	ck_assert_int_eq(c.n_kv_head, 2);
	ck_assert_int_eq(c.head_dim, 16);
	ck_assert_int_eq(c.ffn, 128);
	ck_assert_int_eq(c.vocab, 256);
	ck_assert_float_eq(c.rms_eps, 1e-6f);
	ck_assert_double_eq(c.rope_theta, 10000.0);
	ck_assert_int_eq(c.rope.type, SL_ROPE_DEFAULT);
	ck_assert(!c.tied && !c.qkv_bias);
	ck_assert_int_eq(c.sliding_window, 0);
	ck_assert_int_eq(c.bos_id, 1);
	ck_assert_int_eq(c.n_eos, 1);
	ck_assert_int_eq(c.eos_id[0], 2);

	snprintf(path, sizeof path, "%s/llama3-rope/config.json", g_dir);
	ck_assert_msg(sl_llama_config_load(path, &c) == 0, "%s", sl_errmsg());
	ck_assert_int_eq(c.n_kv_head, 1);
	ck_assert_int_eq(c.rope.type, SL_ROPE_LLAMA3);
	ck_assert_double_eq(c.rope.factor, 8.0);
	ck_assert_double_eq(c.rope.low_freq_factor, 1.0);
	ck_assert_double_eq(c.rope.high_freq_factor, 4.0);
	ck_assert_int_eq(c.rope.original_max_position_embeddings, 64);
	ck_assert_double_eq(c.rope_theta, 500000.0);

	snprintf(path, sizeof path, "%s/mistral/config.json", g_dir);
	ck_assert_msg(sl_llama_config_load(path, &c) == 0, "%s", sl_errmsg());
	ck_assert_str_eq(c.model_type, "mistral");
	ck_assert_int_eq(c.sliding_window, 0); /* null */
	ck_assert_double_eq(c.rope_theta, 1e6);

	snprintf(path, sizeof path, "%s/qwen2/config.json", g_dir);
	ck_assert_msg(sl_llama_config_load(path, &c) == 0, "%s", sl_errmsg());
	ck_assert_str_eq(c.model_type, "qwen2");
	ck_assert(c.qkv_bias);
	ck_assert_int_eq(c.sliding_window, 0);

	snprintf(path, sizeof path, "%s/llama-tied/config.json", g_dir);
	ck_assert_msg(sl_llama_config_load(path, &c) == 0, "%s", sl_errmsg());
	ck_assert(c.tied);
	ck_assert_int_eq(c.n_kv_head, 4);
	/* the fixture's own parameter count: 2 layers of 4 * 64*64 + 3 * 64*128
	 * + 2*64, one 256 x 64 table (tied), the final norm */
	ck_assert_uint_eq(sl_llama_total_params(&c), 2 * (4 * 4096 + 3 * 8192 + 128) + 16384 + 64);
}
END_TEST

/* a config.json written to a temporary file */
static char g_tmp[64];

static const char *write_cfg(const char *json)
{
	snprintf(g_tmp, sizeof g_tmp, "/tmp/sl_llama_cfg_XXXXXX");
	const int fd = mkstemp(g_tmp);
	ck_assert_int_ge(fd, 0);
	const size_t n = strlen(json);
	ck_assert_int_eq(write(fd, json, n), (ssize_t)n);
	close(fd);
	return g_tmp;
}

#define BASE_FIELDS                                                           \
	"\"num_hidden_layers\": 2, \"num_attention_heads\": 8, \"hidden_size\": 256, " \
	"\"intermediate_size\": 512, \"vocab_size\": 1000"

static int load(const char *json, sl_llama_config *c)
{
	const char *p = write_cfg(json);
	const int rc = sl_llama_config_load(p, c);
	unlink(p);
	return rc;
}

/* an error in one line that names the file and says what */
static void refused(const char *json, int code, const char *what)
{
	sl_llama_config c;
	ck_assert_int_eq(load(json, &c), code);
	const char *m = sl_errmsg();
	ck_assert_msg(strstr(m, g_tmp) != NULL, "message does not name the file: %s", m);
	ck_assert_msg(strstr(m, what) != NULL, "message '%s' lacks '%s'", m, what);
	ck_assert_msg(strchr(m, '\n') == NULL, "message on more than one line: %s", m);
}

START_TEST(test_rules)
{
	sl_llama_config c;
	/* no num_key_value_heads: the head count, as transformers does */
	ck_assert_int_eq(load("{\"model_type\": \"llama\", " BASE_FIELDS "}", &c), 0);
	ck_assert_int_eq(c.n_kv_head, 8);
	ck_assert_int_eq(c.head_dim, 32);
	ck_assert_double_eq(c.rope_theta, 10000.0);
	ck_assert(!c.tied);
	ck_assert_int_eq(c.n_eos, 0);
	ck_assert_int_eq(c.bos_id, -1);
	/* null is missing too */
	ck_assert_int_eq(load("{\"model_type\": \"llama\", \"num_key_value_heads\": null, " BASE_FIELDS
			      "}", &c), 0);
	ck_assert_int_eq(c.n_kv_head, 8);
	/* the older "type" key; linear */
	ck_assert_int_eq(load("{\"model_type\": \"llama\", \"rope_scaling\": {\"type\": \"linear\", "
			      "\"factor\": 2.0}, " BASE_FIELDS "}", &c), 0);
	ck_assert_int_eq(c.rope.type, SL_ROPE_LINEAR);
	ck_assert_double_eq(c.rope.factor, 2.0);
	/* type default is none */
	ck_assert_int_eq(load("{\"model_type\": \"mistral\", \"rope_scaling\": {\"rope_type\": "
			      "\"default\"}, " BASE_FIELDS "}", &c), 0);
	ck_assert_int_eq(c.rope.type, SL_ROPE_DEFAULT);
	/* transformers 5's rope_parameters */
	ck_assert_int_eq(load("{\"model_type\": \"llama\", \"rope_parameters\": {\"rope_type\": "
			      "\"llama3\", \"rope_theta\": 500000.0, \"factor\": 32.0, "
			      "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
			      "\"original_max_position_embeddings\": 8192}, " BASE_FIELDS "}", &c), 0);
	ck_assert_int_eq(c.rope.type, SL_ROPE_LLAMA3);
	ck_assert_double_eq(c.rope_theta, 500000.0);
	ck_assert_double_eq(c.rope.factor, 32.0);
	ck_assert_int_eq(c.rope.original_max_position_embeddings, 8192);
	/* Llama 3.1's list of EOS ids; an explicit head_dim */
	ck_assert_int_eq(load("{\"model_type\": \"llama\", \"eos_token_id\": [7, 8, 9], "
			      "\"head_dim\": 64, " BASE_FIELDS "}", &c), 0);
	ck_assert_int_eq(c.n_eos, 3);
	ck_assert_int_eq(c.eos_id[2], 9);
	ck_assert_int_eq(c.head_dim, 64);
	/* Qwen2's window counts only with use_sliding_window; Mistral's always */
	ck_assert_int_eq(load("{\"model_type\": \"qwen2\", \"sliding_window\": 4096, "
			      "\"use_sliding_window\": false, " BASE_FIELDS "}", &c), 0);
	ck_assert_int_eq(c.sliding_window, 0);
	ck_assert(c.qkv_bias);
	ck_assert_int_eq(load("{\"model_type\": \"qwen2\", \"sliding_window\": 4096, "
			      "\"use_sliding_window\": true, " BASE_FIELDS "}", &c), 0);
	ck_assert_int_eq(c.sliding_window, 4096);
	ck_assert_int_eq(load("{\"model_type\": \"mistral\", \"sliding_window\": 16, " BASE_FIELDS "}",
			      &c), 0);
	ck_assert_int_eq(c.sliding_window, 16);
	/* the window: sequences within it run (full attention is the window's
	 * attention there), longer ones are refused */
	ck_assert_int_eq(sl_llama_check_window(&c, 16), 0);
	ck_assert_int_eq(sl_llama_check_window(&c, 17), SL_EUNSUPPORTED);
	ck_assert_ptr_nonnull(strstr(sl_errmsg(), "sliding window of 16"));
}
END_TEST

START_TEST(test_refused)
{
	refused("{\"model_type\": \"gemma\", " BASE_FIELDS "}", SL_EUNSUPPORTED,
		"model_type 'gemma' is not supported");
	refused("{" BASE_FIELDS "}", SL_EUNSUPPORTED, "model_type missing");
	refused("{\"model_type\": \"llama\", \"rope_scaling\": {\"rope_type\": \"yarn\", "
		"\"factor\": 4.0}, " BASE_FIELDS "}",
		SL_EUNSUPPORTED, "rope_scaling type 'yarn' is not supported");
	refused("{\"model_type\": \"llama\", \"rope_scaling\": {\"type\": \"dynamic\", "
		"\"factor\": 4.0}, " BASE_FIELDS "}",
		SL_EUNSUPPORTED, "type 'dynamic'");
	refused("{\"model_type\": \"llama\", \"rope_scaling\": {\"rope_type\": \"llama3\", "
		"\"factor\": 8.0, \"low_freq_factor\": 1.0}, " BASE_FIELDS "}",
		SL_EFORMAT, "missing field 'high_freq_factor'");
	refused("{\"model_type\": \"llama\", \"rope_scaling\": {\"rope_type\": \"linear\", "
		"\"factor\": 0}, " BASE_FIELDS "}",
		SL_EFORMAT, "factor 0");
	refused("{\"model_type\": \"llama\", \"num_key_value_heads\": 3, " BASE_FIELDS "}",
		SL_EFORMAT, "not a multiple of num_key_value_heads 3");
	refused("{\"model_type\": \"llama\", \"num_attention_heads\": 8, \"hidden_size\": 256, "
		"\"intermediate_size\": 512, \"vocab_size\": 1000}",
		SL_EFORMAT, "missing field 'num_hidden_layers'");
	refused("{\"model_type\": \"llama\", \"hidden_act\": \"gelu\", " BASE_FIELDS "}",
		SL_EUNSUPPORTED, "hidden_act 'gelu'");
	refused("{\"model_type\": \"llama\", \"attention_bias\": true, " BASE_FIELDS "}",
		SL_EUNSUPPORTED, "attention_bias");
	refused("{\"model_type\": \"llama\", \"eos_token_id\": 1000, " BASE_FIELDS "}", SL_EFORMAT,
		"eos_token_id 1000 is outside the vocabulary");
	refused("{\"model_type\": \"llama\", \"head_dim\": 31, " BASE_FIELDS "}", SL_EFORMAT,
		"head_dim 31");
	refused("{\"model_type\": \"llama\", " BASE_FIELDS, SL_EFORMAT, "not valid JSON");
	ck_assert_int_eq(sl_llama_config_load("/nonexistent/config.json", &(sl_llama_config){ 0 }),
			 SL_ENOTFOUND);
}
END_TEST

/* The --dummy shapes: the parameter counts the published checkpoints
 * report (their model cards and safetensors index totals / 2 bytes). */
START_TEST(test_named)
{
	static const struct {
		const char *name;
		size_t params;
		int kv;
	} want[] = {
		{ "llama-2-7b", 6738415616ull, 32 },  { "llama-2-13b", 13015864320ull, 40 },
		{ "llama-2-70b", 68976648192ull, 8 }, { "llama-3-8b", 8030261248ull, 8 },
		{ "llama-3-70b", 70553706496ull, 8 }, { "mistral-7b", 7241732096ull, 8 },
		{ "qwen2-7b", 7615616512ull, 4 },
	};
	for (size_t i = 0; i < SL_ARRAY_LEN(want); i++) {
		sl_llama_config c;
		ck_assert_int_eq(sl_llama_config_named(want[i].name, &c), 0);
		ck_assert_int_eq(sl_llama_config_validate(&c, want[i].name), 0);
		ck_assert_int_eq(c.n_kv_head, want[i].kv);
		ck_assert_int_eq(c.head_dim, 128);
		ck_assert_msg(sl_llama_total_params(&c) == want[i].params, "%s: %zu parameters, want %zu",
			      want[i].name, sl_llama_total_params(&c), want[i].params);
		ck_assert_ptr_nonnull(strstr(sl_llama_names(), want[i].name));
	}
	sl_llama_config c;
	ck_assert_int_eq(sl_llama_config_named("llama-4-9000b", &c), SL_ENOTFOUND);
	ck_assert_ptr_nonnull(strstr(sl_errmsg(), "llama-2-7b"));
}
END_TEST

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: test_llama_config FIXTURES_DIR\n");
		return 2;
	}
	g_dir = argv[1];
	Suite *s = suite_create("llama_config");
	TCase *tc = tcase_create("config");
	tcase_add_test(tc, test_fixture_configs);
	tcase_add_test(tc, test_rules);
	tcase_add_test(tc, test_refused);
	tcase_add_test(tc, test_named);
	suite_add_tcase(s, tc);
	return sl_test_run(s);
}
