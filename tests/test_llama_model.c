/*
 * test_llama_model.c - the LLaMA family's forward pass against Hugging
 * Face transformers.
 *
 * The fixtures (tools/make_llama_fixtures.py) are tiny random checkpoints
 * of each kind: Llama with grouped KV heads, Llama 3 rope scaling stored in
 * bf16, Mistral, Qwen2 with q/k/v biases in a sharded checkpoint, a tied
 * head.  golden.json holds transformers' logits of a left-padded batch
 * (logits.bin), its greedy continuations and each greedy token's
 * log-probability.  Checked here, with the fp32 KV cache (tight) and the
 * fp16 one (loose), the tolerances of OPT's golden tests (test_model.c):
 *  - the prefill's logits of every real row;
 *  - greedy tokens equal to transformers', each token's log-probability
 *    within what the logits' tolerance allows;
 *  - the same log-probabilities through the scorer (prompt plus the
 *    greedy tokens as a continuation);
 *  - the same tokens and log-probabilities whatever the placement (weights
 *    on the host and on disk, the cache on the host or disk,
 *    cpu_cache_compute, micro-batches, activations on the host, sep_layer
 *    halves) on the CPU backend;
 *  - H2O on the LLaMA family against a plain implementation written here
 *    (the whole model in double precision, token by token, with the
 *    specification of test_h2o.c applied per KV head, the scores of a
 *    group's query heads summed): the same greedy tokens and
 *    log-probabilities;
 *  - generation stops at any end token of a config's list;
 *  - the --dummy shapes' run plans hold their parameters.
 * argv[1] is the fixtures folder.
 */
#include "backend.h"
#include "generate.h"
#include "kvcache.h"
#include "model.h"
#include "safetensors.h"
#include "score.h"

#include "testutil.h"

#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *fixtures_dir = "tests/fixtures";
/* The fixtures with grouped KV heads (llama-gqa, llama3-rope, mistral,
 * qwen2) join these lists when the attention ops take nkv (the gqa
 * branch); until then the model refuses n_kv_head < n_head at open. */
static const char *const fixture_names[] = { "llama-gqa", "llama3-rope", "mistral", "qwen2", "llama-tied" };
#define N_FIXTURES ((int)SL_ARRAY_LEN(fixture_names))
#define MAXP 8
#define MAXNEW 64

typedef struct golden {
	char dir[512];
	int nprompt, pad_to, vocab, new_tokens;
	int32_t prompts[MAXP][64];
	int plen[MAXP];
	int32_t greedy[MAXP][MAXNEW];
	double lp[MAXP][MAXNEW];
	int glen[MAXP];
	float *logits; /* the real rows, concatenated */
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
	json_t *lr = json_object_get(root, "greedy_logprobs");
	g->nprompt = (int)json_array_size(pr);
	ck_assert_int_le(g->nprompt, MAXP);
	g->pad_to = (int)json_integer_value(json_object_get(root, "pad_left_to"));
	g->vocab = (int)json_integer_value(json_object_get(root, "vocab_size"));
	g->new_tokens = (int)json_integer_value(json_object_get(root, "greedy_new_tokens"));
	ck_assert_int_le(g->new_tokens, MAXNEW);
	size_t rows = 0;
	for (int i = 0; i < g->nprompt; i++) {
		json_t *p = json_array_get(pr, (size_t)i), *q = json_array_get(gr, (size_t)i);
		json_t *l = json_array_get(lr, (size_t)i);
		g->plen[i] = (int)json_array_size(p);
		g->glen[i] = (int)json_array_size(q);
		ck_assert_int_le(g->plen[i], 64);
		ck_assert_int_eq((int)json_array_size(l), g->glen[i]);
		for (int j = 0; j < g->plen[i]; j++)
			g->prompts[i][j] = (int32_t)json_integer_value(json_array_get(p, (size_t)j));
		for (int j = 0; j < g->glen[i]; j++) {
			g->greedy[i][j] = (int32_t)json_integer_value(json_array_get(q, (size_t)j));
			g->lp[i][j] = json_number_value(json_array_get(l, (size_t)j));
		}
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

/*
 * Tolerances, as test_model.c's for OPT: the logits' relative error (the
 * largest difference over the largest reference magnitude) 2e-3 with the
 * fp16 cache (the rounding of K and V), 1e-5 with the fp32 one (summation
 * order).  A log-probability is a logit minus the log-sum-exp of its row,
 * so it moves by at most twice the row's largest logit difference: its
 * bound is 2 x tol x the row's largest magnitude, plus the 5e-7 of
 * golden.json's six decimals.
 */
static const double logits_tol[2] = { 2e-3, 1e-5 };

static double lp_bound(bool kv_f32, double maxabs)
{
	return 2 * logits_tol[kv_f32] * maxabs + 5e-7;
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

static double rel_err(const float *a, const float *b, size_t n)
{
	double d = 0, mx = 0;
	for (size_t i = 0; i < n; i++) {
		const double di = fabs((double)a[i] - b[i]), bi = fabs((double)b[i]);
		if (di > d || di != di)
			d = di;
		if (bi > mx)
			mx = bi;
	}
	return d / fmax(mx, 1e-30);
}

/* The first largest logit (torch.argmax's choice), its log-probability and
 * the row's largest magnitude. */
static int32_t argmax_lp(const float *row, int v, double *lp, double *maxabs)
{
	int best = 0;
	double mx = 0;
	for (int i = 0; i < v; i++) {
		if (row[i] > row[best])
			best = i;
		mx = fmax(mx, fabs((double)row[i]));
	}
	double sum = 0;
	for (int i = 0; i < v; i++)
		sum += exp((double)row[i] - row[best]);
	*lp = -log(sum);
	*maxabs = mx;
	return best;
}

typedef struct greedy_out {
	int32_t tok[MAXP][MAXNEW];
	double lp[MAXP][MAXNEW], maxabs[MAXP][MAXNEW];
} greedy_out;

/* A model of the fixture under a plan sized for its batch. */
static sl_model *open_fixture(const golden *g, sl_plan_params *pp, const char *offload_dir)
{
	pp->max_seq = g->nprompt;
	pp->max_prompt = g->pad_to;
	pp->max_len = g->pad_to + g->new_tokens;
	sl_model *m = NULL;
	const sl_model_params mp = { .dir = g->dir, .plan = pp, .offload_dir = offload_dir };
	int rc = sl_model_open_ex(be, &mp, &m);
	ck_assert_msg(rc == 0, "%s: %s", g->dir, sl_errmsg());
	ck_assert_int_eq(m->cfg.vocab, g->vocab);
	ck_assert_int_eq(m->cfg.family, SL_FAMILY_LLAMA);
	return m;
}

/* Greedy decoding of the fixture's batch (left-padded to pad_to), every
 * sequence for new_tokens steps; optionally the prefill's logits. */
static void run_greedy(sl_model *m, const golden *g, greedy_out *o, float *prefill_logits)
{
	const int n = g->nprompt, t = g->pad_to, v = g->vocab;
	sl_kv *kv = NULL;
	int rc = sl_kv_make(&m->kv_env, n, t, t + g->new_tokens, &kv);
	ck_assert_msg(rc == 0, "kv: %s", sl_errmsg());
	int32_t ids[MAXP * 64] = { 0 }, next[MAXP];
	int npad[MAXP];
	for (int s = 0; s < n; s++) {
		npad[s] = t - g->plen[s];
		memcpy(ids + (size_t)s * t + npad[s], g->prompts[s], sizeof(int32_t) * (size_t)g->plen[s]);
	}
	rc = sl_model_prefill(m, kv, ids, npad, t, prefill_logits);
	ck_assert_msg(rc == 0, "prefill: %s", sl_errmsg());
	float *lg = malloc(sizeof(float) * (size_t)n * v);
	for (int j = 0; j < g->new_tokens; j++) {
		if (j) {
			rc = sl_model_decode(m, kv, next);
			ck_assert_msg(rc == 0, "decode step %d: %s", j, sl_errmsg());
		}
		ck_assert_int_eq(sl_model_logits(m, n, lg), 0);
		for (int s = 0; s < n; s++)
			next[s] = o->tok[s][j] = argmax_lp(lg + (size_t)s * v, v, &o->lp[s][j],
							   &o->maxabs[s][j]);
	}
	free(lg);
	sl_kv_free(kv);
}

#define FIXTURE(i) fixture_names[(i) / 2]
#define KV_F32(i) ((i) % 2 == 1)

START_TEST(test_logits_match_hf)
{
	golden g;
	golden_load(FIXTURE(_i), &g);
	sl_plan_params pp = sl_plan_defaults();
	pp.kv_f32 = KV_F32(_i);
	sl_model *m = open_fixture(&g, &pp, NULL);
	const size_t v = (size_t)g.vocab;
	float *lg = malloc(sizeof(float) * (size_t)g.nprompt * g.pad_to * v);
	greedy_out *o = calloc(1, sizeof *o);
	run_greedy(m, &g, o, lg);
	const float *ref = g.logits;
	for (int s = 0; s < g.nprompt; s++) {
		const float *mine = lg + ((size_t)s * g.pad_to + (g.pad_to - g.plen[s])) * v;
		const double e = rel_err(mine, ref, (size_t)g.plen[s] * v);
		fprintf(stderr, "%s (%s cache) prompt %d (%d tokens): logits relative error %.2e\n",
			FIXTURE(_i), KV_F32(_i) ? "fp32" : "fp16", s, g.plen[s], e);
		ck_assert_msg(e <= logits_tol[KV_F32(_i)], "%s prompt %d: logits relative error %.3e > %.0e",
			      FIXTURE(_i), s, e, logits_tol[KV_F32(_i)]);
		ref += (size_t)g.plen[s] * v;
	}
	free(o);
	free(lg);
	sl_model_free(m);
	free(g.logits);
}
END_TEST

START_TEST(test_greedy_matches_hf)
{
	golden g;
	golden_load(FIXTURE(_i), &g);
	sl_plan_params pp = sl_plan_defaults();
	pp.kv_f32 = KV_F32(_i);
	sl_model *m = open_fixture(&g, &pp, NULL);
	greedy_out *o = calloc(1, sizeof *o);
	run_greedy(m, &g, o, NULL);
	double worst = 0;
	for (int s = 0; s < g.nprompt; s++)
		for (int j = 0; j < g.glen[s]; j++) {
			ck_assert_msg(o->tok[s][j] == g.greedy[s][j],
				      "%s prompt %d: token %d is %d, transformers chose %d", FIXTURE(_i), s,
				      j, o->tok[s][j], g.greedy[s][j]);
			const double d = fabs(o->lp[s][j] - g.lp[s][j]);
			worst = fmax(worst, d);
			ck_assert_msg(d <= lp_bound(KV_F32(_i), o->maxabs[s][j]),
				      "%s prompt %d token %d: log-probability %.6f, transformers %.6f",
				      FIXTURE(_i), s, j, o->lp[s][j], g.lp[s][j]);
		}
	fprintf(stderr, "%s (%s cache): greedy tokens equal, log-probabilities within %.2e\n",
		FIXTURE(_i), KV_F32(_i) ? "fp32" : "fp16", worst);
	free(o);
	sl_model_free(m);
	free(g.logits);
}
END_TEST

/* The scorer (prefill, then the continuation through decode) gives the
 * greedy tokens the log-probabilities transformers gave them. */
START_TEST(test_score_matches_hf)
{
	golden g;
	golden_load(FIXTURE(_i), &g);
	sl_plan_params pp = sl_plan_defaults();
	pp.kv_f32 = KV_F32(_i);
	sl_model *m = open_fixture(&g, &pp, NULL);
	/* the greedy run's row magnitudes bound each log-probability */
	greedy_out *o = calloc(1, sizeof *o);
	run_greedy(m, &g, o, NULL);
	sl_scorer *sc = NULL;
	ck_assert_int_eq(sl_scorer_create(m, g.nprompt, g.pad_to + g.new_tokens, g.pad_to, &sc), 0);
	sl_score_seq seqs[MAXP];
	double lps[MAXP][MAXNEW];
	for (int s = 0; s < g.nprompt; s++)
		seqs[s] = (sl_score_seq){ .prompt = g.prompts[s], .prompt_len = g.plen[s],
					  .cont = g.greedy[s], .cont_len = g.glen[s],
					  .logprobs = lps[s] };
	int rc = sl_scorer_run(sc, seqs, g.nprompt, NULL);
	ck_assert_msg(rc == 0, "score: %s", sl_errmsg());
	for (int s = 0; s < g.nprompt; s++)
		for (int j = 0; j < g.glen[s]; j++)
			ck_assert_msg(fabs(lps[s][j] - g.lp[s][j]) <= lp_bound(KV_F32(_i), o->maxabs[s][j]),
				      "%s prompt %d token %d: scored %.6f, transformers %.6f", FIXTURE(_i),
				      s, j, lps[s][j], g.lp[s][j]);
	sl_scorer_free(sc);
	free(o);
	sl_model_free(m);
	free(g.logits);
}
END_TEST

/* Placements: each is the all-device run's tokens and log-probabilities. */
typedef struct placement {
	const char *what;
	double w_gpu, w_cpu, c_gpu, c_cpu;
	bool ccc, act_host, sep, overlap;
	int micro;
} placement;

static const placement placements[] = {
	{ "weights on the host", 0, 100, 100, 0, false, false, false, true, 0 },
	{ "weights on disk", 0, 0, 100, 0, false, false, false, true, 0 },
	{ "weights split three ways, sep_layer", 30, 30, 100, 0, false, false, true, true, 0 },
	{ "cache on the host", 100, 0, 0, 100, false, false, false, true, 0 },
	{ "cache on the host, cpu_cache_compute", 100, 0, 0, 100, true, false, false, true, 0 },
	{ "cache on disk", 100, 0, 0, 0, false, false, false, true, 0 },
	{ "cache split, micro-batches of 2", 100, 0, 50, 25, false, false, false, true, 2 },
	{ "activations on the host, micro-batches of 2", 100, 0, 100, 0, false, true, false, false, 2 },
	{ "everything off the device", 0, 50, 0, 50, true, true, true, true, 2 },
};

static const char *const invariance_fixtures[] = { "llama-gqa", "llama-tied" };

START_TEST(test_placement_invariance)
{
	golden g;
	golden_load(invariance_fixtures[_i], &g);
	sl_plan_params pp = sl_plan_defaults();
	sl_model *m = open_fixture(&g, &pp, NULL);
	greedy_out *ref = calloc(1, sizeof *ref), *o = calloc(1, sizeof *o);
	run_greedy(m, &g, ref, NULL);
	sl_model_free(m);
	char dir[] = "/tmp/sluice-llama-XXXXXX";
	ck_assert_ptr_nonnull(mkdtemp(dir));
	for (size_t k = 0; k < SL_ARRAY_LEN(placements); k++) {
		const placement *p = &placements[k];
		pp = sl_plan_defaults();
		pp.w_gpu = p->w_gpu;
		pp.w_cpu = p->w_cpu;
		pp.cache_gpu = p->c_gpu;
		pp.cache_cpu = p->c_cpu;
		pp.cpu_cache_compute = p->ccc;
		pp.act_host = p->act_host;
		pp.sep_layer = p->sep;
		pp.overlap = p->overlap;
		pp.micro = p->micro;
		m = open_fixture(&g, &pp, dir);
		memset(o, 0, sizeof *o);
		run_greedy(m, &g, o, NULL);
		for (int s = 0; s < g.nprompt; s++)
			for (int j = 0; j < g.new_tokens; j++) {
				ck_assert_msg(o->tok[s][j] == ref->tok[s][j],
					      "%s, %s: prompt %d token %d is %d, on the device %d",
					      invariance_fixtures[_i], p->what, s, j, o->tok[s][j],
					      ref->tok[s][j]);
				ck_assert_msg(o->lp[s][j] == ref->lp[s][j],
					      "%s, %s: prompt %d token %d log-probability %.9f, on the device %.9f",
					      invariance_fixtures[_i], p->what, s, j, o->lp[s][j],
					      ref->lp[s][j]);
			}
		sl_model_free(m);
		ck_assert_int_eq(be->dev_used, 0);
		ck_assert_int_eq(be->host_used, 0);
	}
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	ck_assert_int_eq(system(cmd), 0);
	free(ref);
	free(o);
	free(g.logits);
}
END_TEST

/* ---- a plain LLaMA with H2O ------------------------------------------- */

#define PL_MAXT 64 /* positions */

typedef struct plain_llama {
	int L, H, nh, nkv, hd, F, V;
	double eps, theta;
	bool bias;
	double *embed, *head, *norm;
	struct {
		double *wq, *wk, *wv, *wo, *bq, *bk, *bv, *g1, *g2, *wg, *wu, *wd;
	} *l;
	/* per layer: K and V of every position (rotated K), and per KV head
	 * the kept positions and their scores */
	double *Kc, *Vc; /* (L, PL_MAXT, nkv * hd) */
	int *n;        /* (L, nkv) */
	int *pos;      /* (L, nkv, PL_MAXT) */
	double *score; /* (L, nkv, PL_MAXT) */
} plain_llama;

static double *tensor_d(const sl_st_set *st, const char *name, size_t want)
{
	const sl_st_tensor *t = sl_st_find(st, name);
	ck_assert_msg(t != NULL, "%s missing", name);
	size_t n = 1;
	for (int i = 0; i < t->ndim; i++)
		n *= (size_t)t->shape[i];
	ck_assert_uint_eq(n, want);
	double *d = malloc(n * sizeof *d);
	for (size_t i = 0; i < n; i++) {
		uint16_t u;
		if (t->dtype == SL_DT_F32) {
			float f;
			memcpy(&f, (const char *)t->data + 4 * i, 4);
			d[i] = f;
			continue;
		}
		memcpy(&u, (const char *)t->data + 2 * i, 2);
		d[i] = t->dtype == SL_DT_F16 ? sl_half_to_float(u) : sl_bf16_to_float(u);
	}
	return d;
}

static void plain_open(plain_llama *P, const char *dir)
{
	char path[700];
	snprintf(path, sizeof path, "%s/config.json", dir);
	json_error_t e;
	json_t *c = json_load_file(path, 0, &e);
	ck_assert_msg(c, "%s", e.text);
	memset(P, 0, sizeof *P);
	P->L = (int)json_integer_value(json_object_get(c, "num_hidden_layers"));
	P->H = (int)json_integer_value(json_object_get(c, "hidden_size"));
	P->nh = (int)json_integer_value(json_object_get(c, "num_attention_heads"));
	P->nkv = (int)json_integer_value(json_object_get(c, "num_key_value_heads"));
	P->F = (int)json_integer_value(json_object_get(c, "intermediate_size"));
	P->V = (int)json_integer_value(json_object_get(c, "vocab_size"));
	P->eps = json_number_value(json_object_get(c, "rms_norm_eps"));
	P->theta = json_number_value(json_object_get(c, "rope_theta"));
	/* the plain model knows the default rotation only */
	ck_assert(!json_is_object(json_object_get(c, "rope_scaling")));
	P->bias = !strcmp(json_string_value(json_object_get(c, "model_type")), "qwen2");
	const bool tied = json_is_true(json_object_get(c, "tie_word_embeddings"));
	json_decref(c);
	P->hd = P->H / P->nh;
	const size_t H = (size_t)P->H, F = (size_t)P->F, qd = (size_t)P->nh * P->hd,
		     kd = (size_t)P->nkv * P->hd;
	sl_st_set *st = NULL;
	ck_assert_int_eq(sl_st_open_dir(dir, &st), 0);
	P->embed = tensor_d(st, "model.embed_tokens.weight", (size_t)P->V * H);
	P->head = tied ? P->embed : tensor_d(st, "lm_head.weight", (size_t)P->V * H);
	P->norm = tensor_d(st, "model.norm.weight", H);
	P->l = calloc((size_t)P->L, sizeof *P->l);
	for (int l = 0; l < P->L; l++) {
		char nm[128];
#define T(f, name, n)                                                          \
	do {                                                                   \
		snprintf(nm, sizeof nm, "model.layers.%d.%s", l, name);        \
		P->l[l].f = tensor_d(st, nm, n);                               \
	} while (0)
		T(wq, "self_attn.q_proj.weight", qd * H);
		T(wk, "self_attn.k_proj.weight", kd * H);
		T(wv, "self_attn.v_proj.weight", kd * H);
		T(wo, "self_attn.o_proj.weight", H * qd);
		if (P->bias) {
			T(bq, "self_attn.q_proj.bias", qd);
			T(bk, "self_attn.k_proj.bias", kd);
			T(bv, "self_attn.v_proj.bias", kd);
		}
		T(g1, "input_layernorm.weight", H);
		T(g2, "post_attention_layernorm.weight", H);
		T(wg, "mlp.gate_proj.weight", F * H);
		T(wu, "mlp.up_proj.weight", F * H);
		T(wd, "mlp.down_proj.weight", H * F);
#undef T
	}
	sl_st_close(st);
	P->Kc = calloc((size_t)P->L * PL_MAXT * kd, sizeof(double));
	P->Vc = calloc((size_t)P->L * PL_MAXT * kd, sizeof(double));
	P->n = calloc((size_t)P->L * P->nkv, sizeof(int));
	P->pos = calloc((size_t)P->L * P->nkv * PL_MAXT, sizeof(int));
	P->score = calloc((size_t)P->L * P->nkv * PL_MAXT, sizeof(double));
}

static void plain_free(plain_llama *P)
{
	if (P->head != P->embed)
		free(P->head);
	free(P->embed);
	free(P->norm);
	for (int l = 0; l < P->L; l++) {
		free(P->l[l].wq), free(P->l[l].wk), free(P->l[l].wv), free(P->l[l].wo);
		free(P->l[l].bq), free(P->l[l].bk), free(P->l[l].bv);
		free(P->l[l].g1), free(P->l[l].g2);
		free(P->l[l].wg), free(P->l[l].wu), free(P->l[l].wd);
	}
	free(P->l);
	free(P->Kc), free(P->Vc), free(P->n), free(P->pos), free(P->score);
}

/* y (n) = W (n, k) x (+ b) */
static void matvec(const double *w, const double *b, const double *x, int n, int k, double *y)
{
	for (int i = 0; i < n; i++) {
		double a = b ? b[i] : 0;
		for (int j = 0; j < k; j++)
			a += w[(size_t)i * k + j] * x[j];
		y[i] = a;
	}
}

static void rmsnorm_d(const double *x, const double *g, int n, double eps, double *y)
{
	double ss = 0;
	for (int i = 0; i < n; i++)
		ss += x[i] * x[i];
	const double r = 1 / sqrt(ss / n + eps);
	for (int i = 0; i < n; i++)
		y[i] = x[i] * r * g[i];
}

/* rotate_half RoPE of one head's row at position p */
static void rope_d(double *x, int hd, int p, double theta)
{
	for (int i = 0; i < hd / 2; i++) {
		const double a = p * pow(theta, -2.0 * i / hd), c = cos(a), s = sin(a);
		const double x1 = x[i], x2 = x[i + hd / 2];
		x[i] = x1 * c - x2 * s;
		x[i + hd / 2] = x2 * c + x1 * s;
	}
}

/*
 * The token at position p through every layer, its residual row x (H) in
 * and out.  dense: attend over positions 0..p (the prefill; scores grow
 * for every one of them); else over each KV head's kept positions and p,
 * then the decode step's eviction of the specification (budgets hv, rv).
 */
static void plain_token(plain_llama *P, double *x, int p, bool dense, int hv, int rv)
{
	const int H = P->H, hd = P->hd, nh = P->nh, nkv = P->nkv, F = P->F;
	const int qd = nh * hd, kd = nkv * hd, grp = nh / nkv;
	double xn[1024], q[1024], att[1024], o[1024], pr[PL_MAXT], ga[4096], up[4096];
	ck_assert(H <= 1024 && qd <= 1024 && F <= 4096 && p < PL_MAXT);
	for (int l = 0; l < P->L; l++) {
		double *K = P->Kc + (size_t)l * PL_MAXT * kd, *V = P->Vc + (size_t)l * PL_MAXT * kd;
		rmsnorm_d(x, P->l[l].g1, H, P->eps, xn);
		matvec(P->l[l].wq, P->l[l].bq, xn, qd, H, q);
		matvec(P->l[l].wk, P->l[l].bk, xn, kd, H, K + (size_t)p * kd);
		matvec(P->l[l].wv, P->l[l].bv, xn, kd, H, V + (size_t)p * kd);
		for (int h = 0; h < nh; h++)
			rope_d(q + h * hd, hd, p, P->theta);
		for (int g = 0; g < nkv; g++)
			rope_d(K + (size_t)p * kd + g * hd, hd, p, P->theta);
		for (int g = 0; g < nkv; g++) {
			int *pos = P->pos + ((size_t)l * nkv + g) * PL_MAXT;
			double *sc = P->score + ((size_t)l * nkv + g) * PL_MAXT;
			int *n = P->n + (size_t)l * nkv + g;
			if (dense) { /* the prompt so far, in order */
				pos[p] = p;
				sc[p] = 0;
				*n = p + 1;
			} else {
				pos[*n] = p;
				sc[*n] = 0;
				(*n)++;
			}
			for (int h = g * grp; h < (g + 1) * grp; h++) {
				double mx = -INFINITY, sum = 0;
				for (int j = 0; j < *n; j++) {
					double d = 0;
					for (int e = 0; e < hd; e++)
						d += q[h * hd + e] * K[(size_t)pos[j] * kd + g * hd + e];
					pr[j] = d / sqrt((double)hd);
					mx = fmax(mx, pr[j]);
				}
				for (int j = 0; j < *n; j++)
					sum += (pr[j] = exp(pr[j] - mx));
				for (int e = 0; e < hd; e++)
					att[h * hd + e] = 0;
				for (int j = 0; j < *n; j++) {
					pr[j] /= sum;
					sc[j] += pr[j];
					for (int e = 0; e < hd; e++)
						att[h * hd + e] += pr[j] * V[(size_t)pos[j] * kd + g * hd + e];
				}
			}
			if (dense || *n <= hv + rv)
				continue;
			/* evict the lowest score outside the recent window (the
			 * older on ties), the new token moving into its slot */
			int v = -1;
			for (int j = 0; j < *n; j++) {
				if (pos[j] > p - rv)
					continue;
				if (v < 0 || sc[j] < sc[v] || (sc[j] == sc[v] && pos[j] < pos[v]))
					v = j;
			}
			pos[v] = pos[*n - 1];
			sc[v] = sc[*n - 1];
			(*n)--;
		}
		matvec(P->l[l].wo, NULL, att, H, qd, o);
		for (int i = 0; i < H; i++)
			x[i] += o[i];
		rmsnorm_d(x, P->l[l].g2, H, P->eps, xn);
		matvec(P->l[l].wg, NULL, xn, F, H, ga);
		matvec(P->l[l].wu, NULL, xn, F, H, up);
		for (int i = 0; i < F; i++)
			ga[i] = ga[i] / (1 + exp(-ga[i])) * up[i];
		matvec(P->l[l].wd, NULL, ga, H, F, o);
		for (int i = 0; i < H; i++)
			x[i] += o[i];
	}
}

/* After the prompt (n tokens): keep the last rv and the hv best of the
 * others (the newer on ties), in position order. */
static void plain_compact(plain_llama *P, int n, int hv, int rv)
{
	if (n <= hv + rv)
		return;
	for (int l = 0; l < P->L; l++)
		for (int g = 0; g < P->nkv; g++) {
			int *pos = P->pos + ((size_t)l * P->nkv + g) * PL_MAXT;
			double *sc = P->score + ((size_t)l * P->nkv + g) * PL_MAXT;
			bool keep[PL_MAXT] = { false };
			for (int j = n - rv; j < n; j++)
				keep[j] = true;
			for (int h = 0; h < hv; h++) {
				int best = -1;
				for (int j = 0; j < n - rv; j++)
					if (!keep[j] && (best < 0 || sc[j] > sc[best] ||
							 (sc[j] == sc[best] && j > best)))
						best = j;
				keep[best] = true;
			}
			int k = 0;
			for (int j = 0; j < n; j++)
				if (keep[j]) {
					pos[k] = pos[j];
					sc[k++] = sc[j];
				}
			P->n[(size_t)l * P->nkv + g] = k;
		}
}

/* Greedy tokens and log-probabilities of one prompt with H2O budgets. */
static void plain_greedy(plain_llama *P, const int32_t *prompt, int plen, int steps, int hv, int rv,
			 int32_t *tok, double *lp)
{
	double x[1024], xn[1024];
	double *logits = malloc(sizeof(double) * (size_t)P->V);
	int32_t cur = prompt[0];
	for (int p = 0; p < plen + steps - 1; p++) {
		const bool in_prompt = p < plen;
		cur = in_prompt ? prompt[p] : cur;
		for (int i = 0; i < P->H; i++)
			x[i] = P->embed[(size_t)cur * P->H + i];
		plain_token(P, x, p, in_prompt, hv, rv);
		if (p == plen - 1)
			plain_compact(P, plen, hv, rv);
		if (p < plen - 1)
			continue;
		rmsnorm_d(x, P->norm, P->H, P->eps, xn);
		matvec(P->head, NULL, xn, P->V, P->H, logits);
		int best = 0;
		for (int i = 1; i < P->V; i++)
			if (logits[i] > logits[best])
				best = i;
		double sum = 0;
		for (int i = 0; i < P->V; i++)
			sum += exp(logits[i] - logits[best]);
		const int j = p - (plen - 1);
		tok[j] = best;
		lp[j] = -log(sum);
		cur = best;
	}
	free(logits);
}

static const char *const h2o_fixtures[] = { "llama-gqa", "llama-tied" };

START_TEST(test_h2o_against_plain)
{
	golden g;
	golden_load(h2o_fixtures[_i], &g);
	const int hv = 3, rv = 2, steps = 16;
	g.new_tokens = steps;
	sl_plan_params pp = sl_plan_defaults();
	pp.kv_f32 = true;
	pp.fixed_heavy = hv;
	pp.fixed_recent = rv;
	sl_model *m = open_fixture(&g, &pp, NULL);
	greedy_out *o = calloc(1, sizeof *o);
	run_greedy(m, &g, o, NULL);
	sl_model_free(m);
	plain_llama P;
	plain_open(&P, g.dir);
	for (int s = 0; s < g.nprompt; s++) {
		int32_t tok[MAXNEW];
		double lp[MAXNEW];
		plain_greedy(&P, g.prompts[s], g.plen[s], steps, hv, rv, tok, lp);
		for (int j = 0; j < steps; j++) {
			ck_assert_msg(o->tok[s][j] == tok[j], "%s prompt %d: token %d is %d, the plain H2O's %d",
				      h2o_fixtures[_i], s, j, o->tok[s][j], tok[j]);
			ck_assert_msg(fabs(o->lp[s][j] - lp[j]) <= lp_bound(true, o->maxabs[s][j]),
				      "%s prompt %d token %d: log-probability %.6f, the plain H2O's %.6f",
				      h2o_fixtures[_i], s, j, o->lp[s][j], lp[j]);
		}
	}
	plain_free(&P);
	free(o);
	free(g.logits);
}
END_TEST

/* A config listing several end tokens (Llama 3.1's eos_token_id list):
 * generation stops at whichever comes first.  The llama-tied fixture with
 * its config's eos_token_id made [t, 2], t the fourth greedy token of a
 * prompt whose run does not end by EOS before it. */
START_TEST(test_stops_at_any_eos)
{
	golden g;
	golden_load("llama-tied", &g);
	int s = -1;
	for (int i = 0; i < g.nprompt && s < 0; i++) {
		bool early = false;
		for (int j = 0; j < 4 && j < g.glen[i]; j++)
			early |= g.greedy[i][j] == 2 || (j < 3 && g.greedy[i][j] == g.greedy[i][3]);
		if (g.glen[i] > 4 && !early)
			s = i;
	}
	ck_assert_int_ge(s, 0);
	const int32_t t = g.greedy[s][3];
	char dir[] = "/tmp/sluice-eos-XXXXXX", cmd[1600];
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(cmd, sizeof cmd,
		 "ln -s \"$(realpath '%s/model.safetensors')\" '%s/model.safetensors' && "
		 "python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); c[\"eos_token_id\"]=[%d, 2]; "
		 "json.dump(c, open(sys.argv[2], \"w\"))' '%s/config.json' '%s/config.json'",
		 g.dir, dir, (int)t, g.dir, dir);
	ck_assert_int_eq(system(cmd), 0);
	sl_model *m = NULL;
	ck_assert_msg(sl_model_open(be, dir, NULL, &m) == 0, "%s", sl_errmsg());
	sl_generator *gen = NULL;
	ck_assert_int_eq(sl_generator_create(m, 1, g.plen[s] + g.new_tokens, g.plen[s], &gen), 0);
	int32_t out[MAXNEW];
	sl_seq q = { .prompt = g.prompts[s], .prompt_len = g.plen[s], .max_new = g.new_tokens,
		     .out = out };
	sl_gen_timing tm = { 0 };
	ck_assert_msg(sl_generator_run(gen, &q, 1, NULL, &tm) == 0, "%s", sl_errmsg());
	ck_assert(q.hit_eos);
	ck_assert_int_eq(q.n_out, 4);
	ck_assert_int_eq(out[3], t);
	sl_generator_free(gen);
	sl_model_free(m);
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	ck_assert_int_eq(system(cmd), 0);
	free(g.logits);
}
END_TEST

/* Every --dummy shape of the family opens (its config, its tensor table)
 * and, at a size this machine runs, generates finite logits. */
START_TEST(test_dummy_shapes)
{
	static const char *const names[] = { "llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b",
					     "llama-3-70b", "mistral-7b", "qwen2-7b" };
	for (size_t i = 0; i < SL_ARRAY_LEN(names); i++) {
		sl_model_config c;
		ck_assert_int_eq(sl_model_config_named(names[i], &c), 0);
		ck_assert_int_eq(c.family, SL_FAMILY_LLAMA);
		/* the run plan's weights are the family's parameters, in fp16 */
		sl_plan pl;
		sl_plan_params pp = sl_plan_defaults();
		ck_assert_int_eq(sl_plan_make(&c, &pp, true, &pl), 0);
		const double params = (double)sl_model_total_params(&c);
		ck_assert_msg(fabs((double)pl.weights.device - 2 * params) < 0.001 * 2 * params,
			      "%s: %zu weight bytes for %.0f parameters", names[i], pl.weights.device,
			      params);
	}
}
END_TEST

int main(int argc, char **argv)
{
	if (argc > 1)
		fixtures_dir = argv[1];
	Suite *s = suite_create("llama_model");
	TCase *tc = tcase_create("hf");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 300);
	tcase_add_loop_test(tc, test_logits_match_hf, 0, 2 * N_FIXTURES);
	tcase_add_loop_test(tc, test_greedy_matches_hf, 0, 2 * N_FIXTURES);
	tcase_add_loop_test(tc, test_score_matches_hf, 0, 2 * N_FIXTURES);
	tcase_add_loop_test(tc, test_placement_invariance, 0, (int)SL_ARRAY_LEN(invariance_fixtures));
	tcase_add_loop_test(tc, test_h2o_against_plain, 0, (int)SL_ARRAY_LEN(h2o_fixtures));
	tcase_add_test(tc, test_stops_at_any_eos);
	tcase_add_test(tc, test_dummy_shapes);
	suite_add_tcase(s, tc);
	return sl_test_run(s);
}
