/*
 * test_llama_text.c - text prompts through a LLaMA-family checkpoint's own
 * tokenizer, against the `tokenizers` library and transformers.
 *
 * The fixtures llama2-text, llama3-text and qwen2-text
 * (tools/make_llama_fixtures.py) are tiny random checkpoints that carry a
 * tokenizer trained with `tokenizers` to exactly the model's vocab_size:
 * the Llama 2 kind (SentencePiece-style BPE with byte fallback,
 * add_bos_token in tokenizer_config.json), the Llama 3 kind (byte-level
 * BPE with Llama 3's regex, <|begin_of_text|> from the post-processor, two
 * end tokens in config.json) and the Qwen2 kind (Qwen2's regex and NFC, no
 * BOS).  golden.json holds the texts, the ids `tokenizers` gives them with
 * add_special_tokens=True, transformers' greedy continuation of those ids
 * and `tokenizers`' decode of it with skip_special_tokens=True.  Checked
 * here, below the command line (tests/test_cli.sh runs `sluice generate`
 * on the same texts and checks its tokens and completions):
 *  - the prompt ids a job's reader (sl_prompts_read, what generate and
 *    score call) makes of each text equal tokenizers' ids, BOS included
 *    or not as the tokenizer's files say;
 *  - the tokenizer's vocabulary is the model's, its BOS the config's
 *    bos_token_id where it adds one, the config's end tokens the goldens';
 *  - decoding each greedy continuation without special tokens gives the
 *    golden completion (what generate writes as "completion").
 * argv[1] is the fixtures folder.
 */
#include "jsonl.h"
#include "model_config.h"
#include "tokenizer.h"

#include "testutil.h"

#include <check.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *fixtures_dir = "tests/fixtures";
static const char *const text_fixtures[] = { "llama2-text", "llama3-text", "qwen2-text" };

static json_t *load_golden(const char *name)
{
	char path[600];
	snprintf(path, sizeof path, "%s/%s/golden.json", fixtures_dir, name);
	json_error_t e;
	json_t *g = json_load_file(path, 0, &e);
	ck_assert_msg(g != NULL, "%s: %s", path, e.text);
	return g;
}

static void ids_of(json_t *arr, int32_t **ids, int *n)
{
	*n = (int)json_array_size(arr);
	*ids = malloc(sizeof **ids * (size_t)(*n > 0 ? *n : 1));
	ck_assert_ptr_nonnull(*ids);
	for (int i = 0; i < *n; i++)
		(*ids)[i] = (int32_t)json_integer_value(json_array_get(arr, (size_t)i));
}

START_TEST(test_prompt_ids)
{
	const char *name = text_fixtures[_i];
	json_t *g = load_golden(name);
	json_t *texts = json_object_get(g, "texts"), *prompts = json_object_get(g, "prompts");
	ck_assert_int_gt((int)json_array_size(texts), 0);
	ck_assert_int_eq((int)json_array_size(texts), (int)json_array_size(prompts));

	char dir[600], path[700];
	snprintf(dir, sizeof dir, "%s/%s", fixtures_dir, name);
	snprintf(path, sizeof path, "%s/config.json", dir);
	sl_model_config cfg;
	ck_assert_msg(sl_model_config_load(path, &cfg) == 0, "%s", sl_errmsg());
	sl_tokenizer *tok = NULL;
	ck_assert_msg(sl_tokenizer_load(dir, &tok) == 0, "%s", sl_errmsg());
	ck_assert_int_eq(sl_tokenizer_vocab_size(tok), cfg.vocab);

	/* BOS as the tokenizer's files say, and the config agrees */
	bool add_bos = json_is_true(json_object_get(g, "add_bos"));
	ck_assert_int_eq(sl_tokenizer_adds_bos(tok), add_bos);
	if (add_bos) {
		int bos = (int)json_integer_value(json_object_get(g, "bos_token_id"));
		ck_assert_int_eq(sl_tokenizer_bos_id(tok), bos);
		ck_assert_int_eq(cfg.llama.bos_id, bos);
	}
	/* the config's end tokens, at which generate stops */
	json_t *eos = json_object_get(g, "eos_token_ids");
	ck_assert_int_eq(cfg.llama.n_eos, (int)json_array_size(eos));
	for (int i = 0; i < cfg.llama.n_eos; i++)
		ck_assert_int_eq(cfg.llama.eos_id[i], (int)json_integer_value(json_array_get(eos, (size_t)i)));

	/* the texts as a job's input, read as generate reads them */
	char in[] = "/tmp/sl_llama_text_XXXXXX";
	int fd = mkstemp(in);
	ck_assert_int_ge(fd, 0);
	FILE *f = fdopen(fd, "w");
	ck_assert_ptr_nonnull(f);
	for (size_t i = 0; i < json_array_size(texts); i++) {
		json_t *line = json_pack("{s:O}", "prompt", json_array_get(texts, i));
		char *s = json_dumps(line, JSON_COMPACT);
		fprintf(f, "%s\n", s);
		free(s);
		json_decref(line);
	}
	ck_assert_int_eq(fclose(f), 0);
	sl_prompts ps;
	sl_read_opts ro = { .vocab = cfg.vocab, .tok = tok };
	ck_assert_msg(sl_prompts_read(in, &ro, &ps) == 0, "%s", sl_errmsg());
	unlink(in);
	ck_assert_int_eq(ps.n, (int)json_array_size(prompts));
	for (int i = 0; i < ps.n; i++) {
		int32_t *want;
		int n;
		ids_of(json_array_get(prompts, (size_t)i), &want, &n);
		ck_assert_msg(ps.p[i].n == n, "%s prompt %d: %d ids, tokenizers gives %d", name, i,
			      ps.p[i].n, n);
		for (int k = 0; k < n; k++)
			ck_assert_msg(ps.p[i].ids[k] == want[k], "%s prompt %d id %d: %d, tokenizers %d",
				      name, i, k, ps.p[i].ids[k], want[k]);
		ck_assert_int_eq(ps.p[i].ids[0] == sl_tokenizer_bos_id(tok), add_bos);
		free(want);
	}
	sl_prompts_free(&ps);
	sl_tokenizer_free(tok);
	json_decref(g);
}
END_TEST

START_TEST(test_completions)
{
	const char *name = text_fixtures[_i];
	json_t *g = load_golden(name);
	json_t *greedy = json_object_get(g, "greedy"), *comp = json_object_get(g, "completions");
	ck_assert_int_eq((int)json_array_size(greedy), (int)json_array_size(comp));
	char dir[600];
	snprintf(dir, sizeof dir, "%s/%s", fixtures_dir, name);
	sl_tokenizer *tok = NULL;
	ck_assert_msg(sl_tokenizer_load(dir, &tok) == 0, "%s", sl_errmsg());
	for (size_t i = 0; i < json_array_size(greedy); i++) {
		int32_t *ids;
		int n;
		ids_of(json_array_get(greedy, i), &ids, &n);
		char *text = NULL;
		size_t len = 0;
		ck_assert_msg(sl_tokenizer_decode_ex(tok, ids, (size_t)n, SL_TOKENIZER_SKIP_SPECIAL,
						     &text, &len) == 0, "%s", sl_errmsg());
		json_t *want = json_array_get(comp, i);
		ck_assert_msg(len == json_string_length(want) &&
			      memcmp(text, json_string_value(want), len) == 0,
			      "%s completion %zu: '%s', tokenizers '%s'", name, i, text,
			      json_string_value(want));
		free(text);
		free(ids);
	}
	sl_tokenizer_free(tok);
	json_decref(g);
}
END_TEST

int main(int argc, char **argv)
{
	if (argc > 1)
		fixtures_dir = argv[1];
	Suite *s = suite_create("llama_text");
	TCase *tc = tcase_create("text");
	int n = (int)SL_ARRAY_LEN(text_fixtures);
	tcase_add_loop_test(tc, test_prompt_ids, 0, n);
	tcase_add_loop_test(tc, test_completions, 0, n);
	suite_add_tcase(s, tc);
	return sl_test_run(s);
}
