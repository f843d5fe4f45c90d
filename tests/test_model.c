/*
 * test_model.c - the whole OPT model against Hugging Face transformers.
 *
 * The fixtures (tools/make_fixtures.py) hold tiny random OPT checkpoints
 * (pre-LN; 350m-style post-LN with project_in/out; sharded bf16 without the
 * "model." prefix; a long prompt) with the logits transformers computed for
 * a left-padded batch and its greedy continuations.  Checked here: logits
 * within 1e-3 relative error, identical greedy tokens, a sequence in a
 * batch equal to the sequence alone, cached decode equal to recomputing the
 * whole prefix.  The --dummy weights are pinned.  argv[1] is the fixtures
 * folder.
 */
#include "backend.h"
#include "generate.h"
#include "kvcache.h"
#include "model.h"
#include "weights.h"

#include "testutil.h"

#include <check.h>
#include <jansson.h>
#include <math.h>
#include <string.h>

static const char *fixtures_dir = "tests/fixtures";
static const char *const fixture_names[] = { "opt-pre", "opt-post", "opt-wide", "opt-long" };
#define N_FIXTURES ((int)SL_ARRAY_LEN(fixture_names))

typedef struct golden {
	char dir[512];
	int nprompt, pad_to, vocab, new_tokens;
	int32_t *prompts[16];
	int plen[16];
	int32_t *greedy[16];
	int glen[16];
	float *logits; /* concatenated real rows */
} golden;

static void golden_load(const char *name, golden *g)
{
	memset(g, 0, sizeof *g);
	snprintf(g->dir, sizeof g->dir, "%s/%s", fixtures_dir, name);
	char path[600];
	snprintf(path, sizeof path, "%s/golden.json", g->dir);
	json_error_t e;
	json_t *root = json_load_file(path, 0, &e);
	ck_assert_msg(root, "%s: %s", path, e.text);
	json_t *pr = json_object_get(root, "prompts"), *gr = json_object_get(root, "greedy");
	g->nprompt = (int)json_array_size(pr);
	ck_assert_int_le(g->nprompt, 16);
	g->pad_to = (int)json_integer_value(json_object_get(root, "pad_left_to"));
	g->vocab = (int)json_integer_value(json_object_get(root, "vocab_size"));
	g->new_tokens = (int)json_integer_value(json_object_get(root, "greedy_new_tokens"));
	size_t rows = 0;
	for (int i = 0; i < g->nprompt; i++) {
		json_t *p = json_array_get(pr, (size_t)i), *q = json_array_get(gr, (size_t)i);
		g->plen[i] = (int)json_array_size(p);
		g->glen[i] = (int)json_array_size(q);
		g->prompts[i] = malloc(sizeof(int32_t) * (size_t)g->plen[i]);
		g->greedy[i] = malloc(sizeof(int32_t) * (size_t)g->glen[i] + 1);
		for (int j = 0; j < g->plen[i]; j++)
			g->prompts[i][j] = (int32_t)json_integer_value(json_array_get(p, (size_t)j));
		for (int j = 0; j < g->glen[i]; j++)
			g->greedy[i][j] = (int32_t)json_integer_value(json_array_get(q, (size_t)j));
		rows += (size_t)g->plen[i];
	}
	json_decref(root);
	snprintf(path, sizeof path, "%s/logits.bin", g->dir);
	FILE *f = fopen(path, "rb");
	ck_assert_msg(f, "cannot open %s", path);
	g->logits = malloc(rows * (size_t)g->vocab * sizeof(float));
	ck_assert_uint_eq(fread(g->logits, sizeof(float), rows * (size_t)g->vocab, f),
			  rows * (size_t)g->vocab);
	fclose(f);
}

static void golden_free(golden *g)
{
	for (int i = 0; i < g->nprompt; i++) {
		free(g->prompts[i]);
		free(g->greedy[i]);
	}
	free(g->logits);
}

static sl_backend *be;
static void setup(void)
{
	ck_assert_int_eq(sl_backend_create("cpu", 0, &be), 0);
}
static void teardown(void)
{
	sl_backend_free(be);
}

/* The fixture's model under the default plan, the cache in fp32 or fp16. */
static sl_model *open_fixture(const golden *g, bool kv_f32)
{
	sl_model *m = NULL;
	sl_plan_params pp = sl_plan_defaults();
	pp.kv_f32 = kv_f32;
	const sl_model_params mp = { .dir = g->dir, .plan = &pp };
	int rc = sl_model_open_ex(be, &mp, &m);
	ck_assert_msg(rc == 0, "%s: %s", g->dir, sl_errmsg());
	ck_assert_int_eq(m->cfg.vocab, g->vocab);
	return m;
}

/*
 * Loop tests run each fixture twice: with the fp16 KV cache (the default)
 * and the fp32 one.  Every weight in the fixtures is exactly representable
 * in fp16, so with an fp32 cache the only differences from the fp32
 * reference are summation order (about 1e-6); the fp16 cache adds the
 * rounding of K and V (measured up to about 1e-3 on these random models).
 */
#define CASES (2 * N_FIXTURES)
#define FIXTURE(i) fixture_names[(i) / 2]
#define KV_F32(i) ((i) % 2 == 1)
static const double logits_tol[2] = { 2e-3, 1e-5 };

/* max |a - b| / max |b|: the relative error of a block of logits */
/* Largest difference over the largest reference magnitude; NaN where a
 * value is NaN.  (No fmax reduction: GCC 12.2 for AArch64 crashes
 * vectorising one at -O3.) */
static double rel_err(const float *a, const float *b, size_t n)
{
	double d = 0, mx = 0;
	for (size_t i = 0; i < n; i++) {
		const double di = fabs((double)a[i] - b[i]), bi = fabs((double)b[i]);
		if (di > d || di != di) /* a NaN stays */
			d = di;
		if (bi > mx)
			mx = bi;
	}
	return d / fmax(mx, 1e-30);
}

/* Prefill a set of prompts as one left-padded batch; all logits out. */
static float *prefill_batch(sl_model *m, int n, int32_t *const *prompts, const int *plen, int t,
			    sl_kv **kv_out, int cap)
{
	sl_kv *kv = NULL;
	ck_assert_int_eq(sl_kv_create(&m->kv_env, n, cap, &kv), 0);
	int32_t *ids = calloc((size_t)n * t, sizeof *ids);
	int *npad = calloc((size_t)n, sizeof *npad);
	for (int s = 0; s < n; s++) {
		npad[s] = t - plen[s];
		memcpy(ids + (size_t)s * t + npad[s], prompts[s], sizeof(int32_t) * (size_t)plen[s]);
	}
	float *logits = malloc(sizeof(float) * (size_t)n * t * m->cfg.vocab);
	int rc = sl_model_prefill(m, kv, ids, npad, t, logits);
	ck_assert_msg(rc == 0, "prefill: %s", sl_errmsg());
	free(ids);
	free(npad);
	if (kv_out)
		*kv_out = kv;
	else
		sl_kv_free(kv);
	return logits;
}

START_TEST(test_logits_match_hf)
{
	golden g;
	golden_load(FIXTURE(_i), &g);
	sl_model *m = open_fixture(&g, KV_F32(_i));
	const double tol = logits_tol[KV_F32(_i)];
	float *lg = prefill_batch(m, g.nprompt, g.prompts, g.plen, g.pad_to, NULL, g.pad_to);
	const float *ref = g.logits;
	for (int s = 0; s < g.nprompt; s++) {
		const size_t v = (size_t)g.vocab;
		const float *mine = lg + ((size_t)s * g.pad_to + (g.pad_to - g.plen[s])) * v;
		double e = rel_err(mine, ref, (size_t)g.plen[s] * v);
		fprintf(stderr, "%s (%s cache) prompt %d (%d tokens): logits relative error %.2e\n",
			FIXTURE(_i), KV_F32(_i) ? "fp32" : "fp16", s, g.plen[s], e);
		ck_assert_msg(e <= tol, "%s prompt %d: logits relative error %.3e > %.0e", FIXTURE(_i),
			      s, e, tol);
		ref += (size_t)g.plen[s] * v;
	}
	free(lg);
	sl_model_free(m);
	golden_free(&g);
}
END_TEST

static void run_greedy(sl_model *m, const golden *g, int first, int count, int32_t **outs, int *nout)
{
	int maxlen = 0;
	for (int s = first; s < first + count; s++)
		maxlen = SL_MAX(maxlen, g->plen[s] + g->new_tokens);
	sl_generator *gen = NULL;
	ck_assert_int_eq(sl_generator_create(m, count, maxlen, maxlen, &gen), 0);
	sl_seq seqs[16];
	for (int s = 0; s < count; s++) {
		outs[s] = malloc(sizeof(int32_t) * (size_t)g->new_tokens);
		seqs[s] = (sl_seq){ .prompt = g->prompts[first + s], .prompt_len = g->plen[first + s],
				    .max_new = g->new_tokens, .out = outs[s] };
	}
	sl_gen_timing tm = { 0 };
	int rc = sl_generator_run(gen, seqs, count, NULL, &tm);
	ck_assert_msg(rc == 0, "generate: %s", sl_errmsg());
	for (int s = 0; s < count; s++)
		nout[s] = seqs[s].n_out;
	sl_generator_free(gen);
}

START_TEST(test_greedy_matches_hf)
{
	golden g;
	golden_load(FIXTURE(_i), &g);
	sl_model *m = open_fixture(&g, KV_F32(_i));
	int32_t *outs[16];
	int nout[16];
	run_greedy(m, &g, 0, g.nprompt, outs, nout);
	for (int s = 0; s < g.nprompt; s++) {
		ck_assert_msg(g.glen[s] >= 16 || (g.glen[s] > 0 && g.greedy[s][g.glen[s] - 1] == 2),
			      "fixture continuation too short");
		ck_assert_msg(nout[s] == g.glen[s], "%s prompt %d: %d new tokens, Hugging Face gave %d",
			      FIXTURE(_i), s, nout[s], g.glen[s]);
		for (int j = 0; j < nout[s]; j++)
			ck_assert_msg(outs[s][j] == g.greedy[s][j],
				      "%s prompt %d token %d: %d, Hugging Face gave %d", FIXTURE(_i), s,
				      j, outs[s][j], g.greedy[s][j]);
		free(outs[s]);
	}
	sl_model_free(m);
	golden_free(&g);
}
END_TEST

START_TEST(test_batch_equals_alone)
{
	golden g;
	golden_load(FIXTURE(_i), &g);
	sl_model *m = open_fixture(&g, KV_F32(_i));
	int32_t *batch_out[16], *alone_out[1];
	int nb[16], na[1];
	run_greedy(m, &g, 0, g.nprompt, batch_out, nb);
	float *all = prefill_batch(m, g.nprompt, g.prompts, g.plen, g.pad_to, NULL, g.pad_to);
	for (int s = 0; s < g.nprompt; s++) {
		run_greedy(m, &g, s, 1, alone_out, na);
		ck_assert_int_eq(na[0], nb[s]);
		ck_assert_mem_eq(alone_out[0], batch_out[s], sizeof(int32_t) * (size_t)na[0]);
		free(alone_out[0]);
		free(batch_out[s]);
		/* logits alone vs in the batch */
		float *one = prefill_batch(m, 1, &g.prompts[s], &g.plen[s], g.plen[s], NULL, g.plen[s]);
		const float *inb = all + ((size_t)s * g.pad_to + (g.pad_to - g.plen[s])) * g.vocab;
		/* every GEMM sums a row in one order whatever the rows around it
		 * (kernels/cpu/cpu_gemm.c): the same bits */
		ck_assert_msg(memcmp(one, inb, sizeof(float) * (size_t)g.plen[s] * g.vocab) == 0,
			      "prompt %d: logits alone differ from the same prompt's in the batch "
			      "(largest relative difference %.3e)",
			      s, rel_err(one, inb, (size_t)g.plen[s] * g.vocab));
		free(one);
	}
	free(all);
	sl_model_free(m);
	golden_free(&g);
}
END_TEST

START_TEST(test_cached_decode_equals_recompute)
{
	golden g;
	golden_load(FIXTURE(_i), &g);
	sl_model *m = open_fixture(&g, KV_F32(_i));
	const int s = 0, steps = 6, V = g.vocab;
	const int p = g.plen[s];
	int32_t *seq = malloc(sizeof(int32_t) * (size_t)(p + steps));
	memcpy(seq, g.prompts[s], sizeof(int32_t) * (size_t)p);
	for (int i = 0; i < steps; i++)
		seq[p + i] = 3 + (i * 37) % (V - 3);
	sl_kv *kv = NULL;
	float *lg = prefill_batch(m, 1, &seq, &p, p, &kv, p + steps);
	free(lg);
	float *dec = malloc(sizeof(float) * (size_t)V);
	for (int i = 0; i < steps; i++) {
		ck_assert_int_eq(sl_model_decode(m, kv, &seq[p + i]), 0);
		ck_assert_int_eq(sl_model_logits(m, 1, dec), 0);
		int len = p + i + 1;
		float *full = prefill_batch(m, 1, &seq, &len, len, NULL, len);
		double e = rel_err(dec, full + (size_t)(len - 1) * V, (size_t)V);
		ck_assert_msg(e <= 1e-4, "step %d: cached decode differs from recomputation by %.3e", i, e);
		free(full);
	}
	free(dec);
	free(seq);
	sl_kv_free(kv);
	sl_model_free(m);
	golden_free(&g);
}
END_TEST

/* One decode step of a block of two sequences, fed a and b; the step's
 * logits (2, vocab) into lg. */
static void decode2(sl_model *m, sl_kv *kv, int32_t a, int32_t b, float *lg)
{
	const int32_t ids[2] = { a, b };
	ck_assert_msg(sl_model_decode(m, kv, ids) == 0, "decode: %s", sl_errmsg());
	ck_assert_int_eq(sl_model_logits(m, 2, lg), 0);
}

/* sl_kv_rollback on a dense cache undoes a decode step exactly: a block
 * where sequence 1's step with token x is undone and then fed y gives,
 * bit for bit, the logits of a block where it was fed y directly, and
 * sequence 0 beside it is not disturbed.  Misuse is refused: a rollback
 * before any decode step, twice after one step, out of the block, and a
 * frozen sequence running on without one. */
START_TEST(test_rollback_undoes_a_step)
{
	golden g;
	golden_load(FIXTURE(_i), &g);
	sl_model *m = open_fixture(&g, KV_F32(_i));
	/* two prompts (opt-long has one: it and a shorter cut of it) */
	int32_t *pr[2] = { g.prompts[0], g.prompts[g.nprompt > 1] };
	const int pl[2] = { g.plen[0], g.nprompt > 1 ? g.plen[1] : g.plen[0] - 3 };
	const int V = g.vocab, t = SL_MAX(pl[0], pl[1]);
	const int32_t x0 = 5, x1 = 7, y0 = 11, y1 = 13, z = 17;
	float *la = malloc(sizeof(float) * 2 * (size_t)V), *lb = malloc(sizeof(float) * 2 * (size_t)V),
	      *lc = malloc(sizeof(float) * 2 * (size_t)V);
	sl_kv *ka = NULL, *kb = NULL;
	free(prefill_batch(m, 2, pr, pl, t, &ka, t + 4));
	ck_assert_int_eq(sl_kv_rollback(ka, 1), SL_EINVAL); /* no step yet */
	decode2(m, ka, x0, x1, la);
	ck_assert_msg(sl_kv_rollback(ka, 1) == 0, "%s", sl_errmsg());
	ck_assert_int_eq(ka->len[1], pl[1]);
	ck_assert_int_eq(ka->pos[1], pl[1]);
	ck_assert_int_eq(ka->len[0], pl[0] + 1);
	ck_assert_int_eq(sl_kv_rollback(ka, 1), SL_EINVAL); /* twice after one step */
	ck_assert_int_eq(sl_kv_rollback(ka, 2), SL_EINVAL); /* not in the block */
	decode2(m, ka, y0, y1, la);
	/* the reference: sequence 1 fed y1 at once; sequence 0 x0 then y0 */
	free(prefill_batch(m, 2, pr, pl, t, &kb, t + 4));
	decode2(m, kb, x0, y1, lb);
	decode2(m, kb, y0, z, lc);
	ck_assert_msg(!memcmp(la + V, lb + V, sizeof(float) * (size_t)V),
		      "the undone step changed sequence 1's logits (largest relative difference %.3e)",
		      rel_err(la + V, lb + V, (size_t)V));
	ck_assert_msg(!memcmp(la, lc, sizeof(float) * (size_t)V),
		      "a rollback beside it changed sequence 0's logits (largest relative difference %.3e)",
		      rel_err(la, lc, (size_t)V));
	/* sequence 1 is frozen: a step without its rollback is refused */
	const int32_t ids[2] = { z, z };
	ck_assert_int_eq(sl_model_decode(m, ka, ids), SL_EINVAL);
	ck_assert_msg(strstr(sl_errmsg(), "sequence 1"), "%s", sl_errmsg());
	sl_kv_free(ka);
	sl_kv_free(kb);
	free(la);
	free(lb);
	free(lc);
	sl_model_free(m);
	golden_free(&g);
}
END_TEST

/* --dummy weights are a pure function of the model's shapes and the seed
 * (benchmarks and stores made with --dummy rely on it): a few fp16 values
 * of the shapes of the opt-pre fixture, pinned from the generator as it
 * was first written (splitmix64 of each block of 4 values). */
START_TEST(test_dummy_weights_pinned)
{
	char path[600];
	snprintf(path, sizeof path, "%s/opt-pre/config.json", fixtures_dir);
	sl_model_config c;
	ck_assert_msg(sl_model_config_load(path, &c) == 0, "%s", sl_errmsg());
	sl_queue *q = NULL;
	ck_assert_int_eq(be->ops->queue_create(be, &q), 0);
	sl_model_weights w;
	memset(&w, 0, sizeof w);
	ck_assert_msg(sl_weights_dummy(be, q, &c, 0, NULL, &w) == 0, "%s", sl_errmsg());
	ck_assert_int_eq(be->ops->queue_sync(be, q), 0);
	static const sl_half embed[6] = { 0x286c, 0x2856, 0x9bee, 0xa876, 0x0fea, 0xa94d };
	for (int i = 0; i < 6; i++)
		ck_assert_uint_eq(w.embed_tokens[i], embed[i]);
	ck_assert_uint_eq(w.embed_tokens[511 * 64 + 63], 0xa69a);
	static const sl_half pos[3] = { 0x289b, 0xa81d, 0xa532 };
	for (int i = 0; i < 3; i++)
		ck_assert_uint_eq(w.embed_pos[i], pos[i]);
	static const sl_half q_w[4] = { 0x27a4, 0x07d0, 0x95d7, 0xab37 };
	for (int i = 0; i < 4; i++)
		ck_assert_uint_eq(w.layers[1].q_w[100 + i], q_w[i]);
	static const sl_half fc1_b[3] = { 0x203e, 0x99f0, 0x9c58 };
	for (int i = 0; i < 3; i++)
		ck_assert_uint_eq(w.layers[0].fc1_b[i], fc1_b[i]);
	ck_assert_uint_eq(w.layers[0].fc2_w[64 * 256 - 1], 0xa028);
	sl_weights_free(be, &w);
	be->ops->queue_free(be, q);
}
END_TEST

int main(int argc, char **argv)
{
	if (argc > 1)
		fixtures_dir = argv[1];
	Suite *s = suite_create("model");
	TCase *tc = tcase_create("hf");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, test_logits_match_hf, 0, CASES);
	tcase_add_loop_test(tc, test_greedy_matches_hf, 0, CASES);
	tcase_add_loop_test(tc, test_batch_equals_alone, 0, CASES);
	tcase_add_loop_test(tc, test_cached_decode_equals_recompute, 0, CASES);
	tcase_add_loop_test(tc, test_rollback_undoes_a_step, 0, CASES);
	tcase_add_test(tc, test_dummy_weights_pinned);
	suite_add_tcase(s, tc);
	return sl_test_run(s);
}
