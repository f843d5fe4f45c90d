/*
 * test_sampling.c - token choice and scoring.
 *
 * Sampling: greedy is the argmax; draws never leave the top-k or top-p set
 * (checked against an independent sort of the probabilities); frequencies
 * follow the probabilities; a draw depends only on (seed, key, step), and
 * its value is pinned.
 * Scoring: log-probabilities of continuations through the decode path equal
 * log-softmax of Hugging Face's logits (the model fixtures) within 1e-3.
 * argv[1] is the fixtures folder.
 */
#include "backend.h"
#include "model.h"
#include "sampling.h"
#include "score.h"
#include "sl_hash.h"

#include "testutil.h"

#include <check.h>
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <string.h>

static const char *fixtures_dir = "tests/fixtures";

static uint64_t rng = 88172645463325252ull;
static double urand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (double)(rng >> 11) / 9007199254740992.0;
}

/* Reference: probabilities after temperature, sorted descending. */
typedef struct pi {
	double p;
	int i;
} pi;
static int by_p(const void *a, const void *b)
{
	const pi *x = a, *y = b;
	if (x->p != y->p)
		return x->p > y->p ? -1 : 1;
	return x->i - y->i;
}

/* Which tokens HF's TopK then TopP warpers keep. */
static void reference_kept(const float *logits, int n, const sl_sampling *sp, bool *kept)
{
	pi *v = malloc(sizeof *v * (size_t)n);
	for (int i = 0; i < n; i++)
		v[i] = (pi){ logits[i] / sp->temperature, i };
	qsort(v, (size_t)n, sizeof *v, by_p); /* by scaled logit */
	double kth = sp->top_k > 0 && sp->top_k < n ? v[sp->top_k - 1].p : -INFINITY;
	double mx = v[0].p, total = 0;
	for (int i = 0; i < n; i++) {
		v[i].p = v[i].p >= kth ? exp(v[i].p - mx) : 0;
		total += v[i].p;
	}
	for (int i = 0; i < n; i++)
		kept[i] = false;
	double cum = 0;
	for (int j = 0; j < n && v[j].p > 0; j++) {
		kept[v[j].i] = true;
		cum += v[j].p / total;
		if (sp->top_p < 1 && cum >= sp->top_p)
			break;
	}
	free(v);
}

START_TEST(test_greedy)
{
	float x[6] = { 0.5f, 2.0f, -1.0f, 2.0f, 1.9f, 0.0f };
	sl_sampling sp = { 0 };
	ck_assert_int_eq(sl_sample(x, 6, &sp, 1, 0, NULL), 1); /* first of the ties */
}
END_TEST

START_TEST(test_draws_stay_in_kept_set)
{
	static const sl_sampling cases[] = {
		{ 1.0f, 5, 1.0f, 1 },  { 0.7f, 0, 0.9f, 2 },  { 1.3f, 20, 0.5f, 3 },
		{ 1.0f, 1, 1.0f, 4 },  { 2.0f, 0, 0.05f, 5 }, { 1.0f, 3, 0.99f, 6 },
	};
	const int n = 300;
	float *logits = malloc(sizeof(float) * n);
	bool *kept = malloc(sizeof(bool) * n);
	sl_sample_ws ws;
	ck_assert_int_eq(sl_sample_ws_init(&ws, n), 0);
	for (size_t c = 0; c < SL_ARRAY_LEN(cases); c++) {
		for (int trial = 0; trial < 20; trial++) {
			for (int i = 0; i < n; i++)
				logits[i] = (float)(4.0 * urand() - 2.0);
			if (trial % 5 == 0) /* ties */
				for (int i = 0; i < n; i += 3)
					logits[i] = 1.5f;
			reference_kept(logits, n, &cases[c], kept);
			for (int d = 0; d < 200; d++) {
				int32_t t = sl_sample(logits, n, &cases[c], (uint64_t)trial, (uint64_t)d, &ws);
				ck_assert_msg(t >= 0 && t < n && kept[t],
					      "case %zu: drew token %d outside the kept set", c, t);
			}
		}
	}
	sl_sample_ws_free(&ws);
	free(kept);
	free(logits);
}
END_TEST

START_TEST(test_frequencies_follow_probabilities)
{
	const float logits[4] = { 0.0f, 1.0f, 2.0f, -1.0f };
	sl_sampling sp = { .temperature = 1.0f, .top_p = 1.0f, .seed = 11 };
	sl_sample_ws ws;
	ck_assert_int_eq(sl_sample_ws_init(&ws, 4), 0);
	int count[4] = { 0 };
	const int draws = 200000;
	for (int d = 0; d < draws; d++)
		count[sl_sample(logits, 4, &sp, 7, (uint64_t)d, &ws)]++;
	double z = 0;
	for (int i = 0; i < 4; i++)
		z += exp(logits[i]);
	for (int i = 0; i < 4; i++) {
		double want = exp(logits[i]) / z, got = (double)count[i] / draws;
		ck_assert_msg(fabs(got - want) < 0.005, "token %d: frequency %.4f, probability %.4f", i,
			      got, want);
	}
	sl_sample_ws_free(&ws);
}
END_TEST

/* Logits that are not all finite hold no distribution: -1, greedy or
 * sampled, whatever the warpers; a temperature so low that the scaled
 * logits overflow draws the greedy token; nothing is read outside the
 * logits and the workspace (sized exactly, so AddressSanitizer sees it). */
START_TEST(test_nonfinite_logits)
{
	static const sl_sampling sps[] = {
		{ 0.0f, 0, 1.0f, 1 },   { 1.0f, 0, 1.0f, 2 },    { 0.7f, 5, 0.9f, 3 },
		{ 1.0f, 1, 0.5f, 4 },   { 50.0f, 0, 0.95f, 5 },  { 1e-30f, 0, 1.0f, 6 },
		{ 1e-45f, 3, 0.9f, 7 },
	};
	enum { n = 64 };
	float *x = malloc(sizeof(float) * n);
	sl_sample_ws ws;
	ck_assert_int_eq(sl_sample_ws_init(&ws, n), 0);
	const float bad[] = { NAN, INFINITY, -INFINITY };
	for (size_t c = 0; c < SL_ARRAY_LEN(sps); c++)
		for (size_t b = 0; b < SL_ARRAY_LEN(bad); b++)
			for (int at = 0; at < n; at += 21) {
				for (int i = 0; i < n; i++)
					x[i] = (float)(4.0 * urand() - 2.0);
				x[at] = bad[b];
				ck_assert_msg(sl_sample(x, n, &sps[c], 1, (uint64_t)at, &ws) == -1,
					      "case %zu: %g at %d was not refused", c, (double)bad[b], at);
				for (int i = 0; i < n; i++) /* all of them */
					x[i] = bad[b];
				ck_assert_int_eq(sl_sample(x, n, &sps[c], 1, 0, &ws), -1);
			}
	/* finite logits whose scaled values overflow to +-inf (all of them
	 * at the lowest temperatures) or whose differences do: one token
	 * holds all the mass, at every temperature here */
	for (size_t c = 0; c < SL_ARRAY_LEN(sps); c++) {
		for (int i = 0; i < n; i++)
			x[i] = (float)(1e6 * urand() - 2e6);
		x[17] = -1e3f;
		ck_assert_int_eq(sl_sample(x, n, &sps[c], 9, 0, &ws), 17);
		for (int i = 0; i < n; i++)
			x[i] = i == 40 ? -FLT_MAX / 2 : -FLT_MAX;
		ck_assert_int_eq(sl_sample(x, n, &sps[c], 9, 1, &ws), 40);
		x[40] = FLT_MAX;
		ck_assert_int_eq(sl_sample(x, n, &sps[c], 9, 2, &ws), 40);
	}
	sl_sample_ws_free(&ws);
	free(x);
}
END_TEST

START_TEST(test_draw_depends_only_on_seed_key_step)
{
	ck_assert(sl_sample_uniform(1, 2, 3) == sl_sample_uniform(1, 2, 3));
	ck_assert(sl_sample_uniform(1, 2, 3) != sl_sample_uniform(1, 2, 4));
	ck_assert(sl_sample_uniform(1, 2, 3) != sl_sample_uniform(1, 3, 3));
	ck_assert(sl_sample_uniform(1, 2, 3) != sl_sample_uniform(2, 2, 3));
	double u = sl_sample_uniform(5, 6, 7);
	ck_assert(u >= 0 && u < 1);
}
END_TEST

/* The draws themselves are part of what --seed promises (the same seed,
 * the same completions across versions): pinned.  The values are those of
 * splitmix64 (Vigna's finaliser) applied as mix(mix(mix(seed) ^ key) ^ step),
 * top 53 bits over 2^53, as a Python transcription of splitmix64 gives. */
/* The one splitmix64 (common/sl_hash.h) against the generator's published
 * outputs for seed 1234567 (Vigna's splitmix64.c). */
START_TEST(test_splitmix64_reference)
{
	static const uint64_t want[3] = { 6457827717110365317ull, 3203168211198807973ull,
					  9817491932198370423ull };
	uint64_t state = 1234567;
	for (int i = 0; i < 3; i++, state += 0x9e3779b97f4a7c15ull)
		ck_assert_uint_eq(sl_splitmix64(state), want[i]);
}
END_TEST

START_TEST(test_draws_pinned)
{
	ck_assert(sl_sample_uniform(1, 2, 3) == 0x1.a0e68ea1fbc6cp-1);
	ck_assert(sl_sample_uniform(5, 6, 7) == 0x1.d181cec2bd48ap-1);
	ck_assert(sl_sample_uniform(0, 0, 0) == 0x1.1c13ade1c7e5cp-3);
	ck_assert(sl_sample_uniform(123456789, 42, 1000) == 0x1.8c237b08fb145p-1);
}
END_TEST

/* Scoring against Hugging Face: split each fixture prompt into a prompt
 * and a continuation; the expected log-probabilities are log-softmax of
 * the reference logits at the preceding positions. */
START_TEST(test_score_matches_hf)
{
	static const char *const names[] = { "opt-pre", "opt-post", "opt-wide", "opt-long" };
	char dir[600], path[700];
	snprintf(dir, sizeof dir, "%s/%s", fixtures_dir, names[_i]);
	snprintf(path, sizeof path, "%s/golden.json", dir);
	json_t *g = json_load_file(path, 0, NULL);
	ck_assert_ptr_nonnull(g);
	json_t *prompts = json_object_get(g, "prompts");
	const int V = (int)json_integer_value(json_object_get(g, "vocab_size"));
	const int np = (int)json_array_size(prompts);
	snprintf(path, sizeof path, "%s/logits.bin", dir);
	FILE *f = fopen(path, "rb");
	ck_assert_ptr_nonnull(f);
	sl_backend *be = NULL;
	ck_assert_int_eq(sl_backend_create("cpu", 0, &be), 0);
	sl_model *m = NULL;
	ck_assert_int_eq(sl_model_open(be, dir, NULL, &m), 0);
	sl_scorer *sc = NULL;
	ck_assert_int_eq(sl_scorer_create(m, np, m->cfg.max_pos, m->cfg.max_pos, &sc), 0);
	sl_score_seq seqs[16];
	int32_t *ids[16];
	float *ref[16];
	int ns = 0;
	for (int s = 0; s < np; s++) {
		json_t *p = json_array_get(prompts, (size_t)s);
		int len = (int)json_array_size(p);
		float *lg = malloc(sizeof(float) * (size_t)len * V);
		ck_assert_uint_eq(fread(lg, sizeof(float), (size_t)len * V, f), (size_t)len * V);
		if (len < 2) {
			free(lg);
			continue;
		}
		ids[ns] = malloc(sizeof(int32_t) * (size_t)len);
		for (int j = 0; j < len; j++)
			ids[ns][j] = (int32_t)json_integer_value(json_array_get(p, (size_t)j));
		int k = (len + 1) / 3 > 0 ? (len + 1) / 3 : 1; /* prompt length */
		seqs[ns] = (sl_score_seq){ .prompt = ids[ns], .prompt_len = k, .cont = ids[ns] + k,
					   .cont_len = len - k,
					   .logprobs = malloc(sizeof(double) * (size_t)(len - k)) };
		ref[ns] = lg;
		ns++;
	}
	fclose(f);
	ck_assert_int_eq(sl_scorer_run(sc, seqs, ns, NULL), 0);
	for (int s = 0; s < ns; s++) {
		for (int j = 0; j < seqs[s].cont_len; j++) {
			const float *row = ref[s] + (size_t)(seqs[s].prompt_len + j - 1) * V;
			double mx = row[0], sum = 0;
			for (int i = 1; i < V; i++) /* not fmax: GCC 12.2 AArch64 -O3 */
				if (row[i] > mx)
					mx = row[i];
			for (int i = 0; i < V; i++)
				sum += exp(row[i] - mx);
			double want = row[seqs[s].cont[j]] - mx - log(sum);
			ck_assert_msg(fabs(seqs[s].logprobs[j] - want) <= 1e-3 * fmax(1.0, fabs(want)),
				      "%s seq %d token %d: logprob %.6f, Hugging Face %.6f", names[_i], s, j,
				      seqs[s].logprobs[j], want);
		}
		free(seqs[s].logprobs);
		free(ids[s]);
		free(ref[s]);
	}
	sl_scorer_free(sc);
	sl_model_free(m);
	sl_backend_free(be);
	json_decref(g);
}
END_TEST

int main(int argc, char **argv)
{
	if (argc > 1)
		fixtures_dir = argv[1];
	Suite *s = suite_create("sampling");
	TCase *tc = tcase_create("sampling");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_greedy);
	tcase_add_test(tc, test_draws_stay_in_kept_set);
	tcase_add_test(tc, test_frequencies_follow_probabilities);
	tcase_add_test(tc, test_nonfinite_logits);
	tcase_add_test(tc, test_draw_depends_only_on_seed_key_step);
	tcase_add_test(tc, test_splitmix64_reference);
	tcase_add_test(tc, test_draws_pinned);
	tcase_add_loop_test(tc, test_score_matches_hf, 0, 4);
	suite_add_tcase(s, tc);
	return sl_test_run(s);
}
