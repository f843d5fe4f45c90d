/*
 * test_h2o.c - the H2O heavy-hitter cache against an independent, plain
 * implementation of its specification written here (double precision,
 * one (sequence, head) at a time):
 *
 *   prefill: dense causal attention; each prompt token's score is the sum
 *   of the probabilities all prompt queries give it; if P > B = H + R, keep
 *   the last R tokens and the H highest-scoring others (ties: the newer
 *   stays).  Each decode step: attention over the kept tokens and the new
 *   one; every score grows by this step's probability; over budget, evict
 *   the lowest score among positions outside the R most recent (ties: the
 *   older goes).
 *
 * Checked through the backend's ops: the kept positions at every step, the
 * attention outputs, the cache size min(B, length), and that kept plus
 * evicted scores sum to the number of queries (times the query heads of a
 * KV head's group under grouped-query attention, where the cache, the
 * scores and the kept sets are per KV head and a token's score sums the
 * group's probabilities).  Then through the model: a
 * budget at least the length equals the dense cache; a sequence in a batch
 * behaves as alone; scoring (sl_scorer) equals the independent PyTorch
 * reference bench/h2o_ref.py (tests/fixtures/h2o-score.json, made by
 * tools/make_h2o_score_fixture.py) in every cache placement, budgets of 0
 * among longer ones in one block.  argv[1] is the fixtures folder.
 */
#include "backend.h"
#include "generate.h"
#include "kvcache.h"
#include "model.h"
#include "score.h"
#include "topology.h"

#include "testutil.h"

#include <check.h>
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

static const char *fixtures_dir = "tests/fixtures";
static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double urand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (double)(rng >> 11) / 9007199254740992.0;
}

/* ---- the plain implementation ----------------------------------------- */

typedef struct plain {
	int hd, n;          /* tokens held */
	int pos[4096];
	double score[4096];
	double evicted;
} plain;

static void attend(const float *q, const float *k, const float *v, const int *idx, int n, int hd,
		   double *p, double *out)
{
	double mx = -INFINITY, sum = 0;
	for (int j = 0; j < n; j++) {
		double d = 0;
		for (int e = 0; e < hd; e++)
			d += (double)q[e] * k[(size_t)idx[j] * hd + e];
		p[j] = d;
		mx = fmax(mx, d);
	}
	for (int j = 0; j < n; j++) {
		p[j] = exp(p[j] - mx);
		sum += p[j];
	}
	for (int e = 0; e < hd; e++)
		out[e] = 0;
	for (int j = 0; j < n; j++) {
		p[j] /= sum;
		for (int e = 0; e < hd; e++)
			out[e] += p[j] * v[(size_t)idx[j] * hd + e];
	}
}

/*
 * Prefill of P tokens (k, v: (P, hd)) of one cache head, attended by its
 * grp query heads (grouped-query attention; grp 1 without it): query head
 * r's q (P, hd) at q + r * qs, its output at out + r * P * hd.  A token's
 * score is the sum of the probabilities every query of every head of the
 * group gives it.  Then keep.
 */
static void plain_prefill(plain *s, const float *q, size_t qs, int grp, const float *k,
			  const float *v, int P, int H, int R, double *out)
{
	double p[4096];
	int idx[4096];
	for (int j = 0; j < P; j++) {
		idx[j] = j;
		s->score[j] = 0;
		s->pos[j] = j;
	}
	for (int r = 0; r < grp; r++)
		for (int i = 0; i < P; i++) {
			attend(q + r * qs + (size_t)i * s->hd, k, v, idx, i + 1, s->hd, p,
			       out + ((size_t)r * P + i) * s->hd);
			for (int j = 0; j <= i; j++)
				s->score[j] += p[j];
		}
	s->n = P;
	s->evicted = 0;
	if (P <= H + R)
		return;
	/* H best among [0, P - R): repeatedly take the best (newer on ties) */
	bool keep[4096] = { false };
	for (int j = P - R; j < P; j++)
		keep[j] = true;
	for (int h = 0; h < H; h++) {
		int best = -1;
		for (int j = 0; j < P - R; j++)
			if (!keep[j] && (best < 0 || s->score[j] > s->score[best] ||
					 (s->score[j] == s->score[best] && j > best)))
				best = j;
		keep[best] = true;
	}
	int n = 0;
	for (int j = 0; j < P; j++) {
		if (keep[j]) {
			s->pos[n] = j;
			s->score[n] = s->score[j];
			n++;
		} else {
			s->evicted += s->score[j];
		}
	}
	s->n = n;
}

/* One decode step for the token at position cur (its k, v appended to the
 * full-length arrays kall, vall at row cur), attended by the grp query
 * heads of the group (q of head r at q + r * qs, its output at out + r *
 * hd), whose probabilities all add to the scores. */
static void plain_step(plain *s, const float *q, size_t qs, int grp, const float *kall,
		       const float *vall, int cur, int H, int R, double *out)
{
	double p[4096];
	s->pos[s->n] = cur;
	s->score[s->n] = 0;
	s->n++;
	for (int r = 0; r < grp; r++) {
		attend(q + r * qs, kall, vall, s->pos, s->n, s->hd, p, out + (size_t)r * s->hd);
		for (int j = 0; j < s->n; j++)
			s->score[j] += p[j];
	}
	if (s->n <= H + R)
		return;
	int v = -1;
	for (int j = 0; j < s->n; j++) {
		if (s->pos[j] > cur - R)
			continue;
		if (v < 0 || s->score[j] < s->score[v] ||
		    (s->score[j] == s->score[v] && s->pos[j] < s->pos[v]))
			v = j;
	}
	s->evicted += s->score[v];
	s->pos[v] = s->pos[s->n - 1];
	s->score[v] = s->score[s->n - 1];
	s->n--;
}

/* ---- the backend's ops, driven like the model drives them --------------- */

static sl_backend *be;
static void setup(void)
{
	ck_assert_int_eq(sl_backend_create("cpu", 0, &be), 0);
}
static void teardown(void)
{
	sl_backend_free(be);
}

static int cmp_int(const void *a, const void *b)
{
	return *(const int *)a - *(const int *)b;
}

typedef struct budget_case {
	int P, G, H, R;
} budget_case;

static const budget_case cases[] = {
	{ 20, 12, 4, 4 },  /* heavy + recent */
	{ 20, 12, 0, 5 },  /* H = 0: a sliding window */
	{ 20, 12, 5, 0 },  /* R = 0: heavy only */
	{ 9, 6, 20, 10 },  /* budget beyond the length: nothing evicted */
	{ 33, 20, 3, 7 },
	{ 1, 10, 1, 1 },
	{ 16, 16, 7, 1 },
	{ 12, 6, 0, 0 },   /* budget 0: each step attends to its own token alone */
	{ 1, 5, 0, 0 },
};

/*
 * The ops driven like the model drives them, against the plain
 * implementation: nh query heads, nkv KV heads (0: nh).  Under
 * grouped-query attention the cache, the scores and H2O's kept sets are
 * per KV head (sl_h2o_args' nh is nkv), each token's score summed over the
 * nh / nkv query heads of its group.
 */
static void ops_against_plain(const budget_case *bc, int ci, bool f32, int nh, int nkv)
{
	const int nseq = 2, hd = 8, hidden = nh * hd;
	const int kvh = nkv ? nkv : nh, grp = nh / kvh, kvw = kvh * hd;
	const int P[2] = { bc->P, SL_MAX(1, bc->P - 3) }; /* two prompt lengths */
	const int T = bc->P, L = bc->P + bc->G;
	const int H = bc->H, R = bc->R, B = H + R, cap = SL_MIN(B + 1, L);
	const size_t es = f32 ? 4 : 2;
	/* per sequence, per head: q (nh heads), k, v (kvh heads) for every position */
	float *qa = malloc(sizeof(float) * nseq * nh * L * hd), *ka = malloc(sizeof(float) * nseq * kvh * L * hd),
	      *va = malloc(sizeof(float) * nseq * kvh * L * hd);
	for (int i = 0; i < nseq * nh * L * hd; i++)
		qa[i] = (float)(2 * urand() - 1);
	for (int i = 0; i < nseq * kvh * L * hd; i++) {
		ka[i] = (float)(2 * urand() - 1);
		va[i] = (float)(2 * urand() - 1);
	}
	if (!f32) /* the plain implementation sees what the fp16 cache holds */
		for (int i = 0; i < nseq * kvh * L * hd; i++) {
			ka[i] = sl_half_to_float(sl_float_to_half(ka[i]));
			va[i] = sl_half_to_float(sl_float_to_half(va[i]));
		}
#define AT(a, s, h, t) ((a) + (((size_t)(s) * nh + (h)) * L + (t)) * hd)
#define ATK(a, s, g, t) ((a) + (((size_t)(s) * kvh + (g)) * L + (t)) * hd)
	/* prefill inputs: q (nseq, T, hidden), k and v (nseq, T, kvw), left-padded */
	float *q = calloc((size_t)nseq * T * hidden, 4), *k = calloc((size_t)nseq * T * kvw, 4),
	      *v = calloc((size_t)nseq * T * kvw, 4), *out = calloc((size_t)nseq * T * hidden, 4);
	int npad[2];
	for (int s = 0; s < nseq; s++) {
		npad[s] = T - P[s];
		for (int i = 0; i < P[s]; i++) {
			for (int h = 0; h < nh; h++)
				for (int e = 0; e < hd; e++)
					q[((size_t)s * T + npad[s] + i) * hidden + (size_t)h * hd + e] =
						AT(qa, s, h, i)[e];
			for (int g = 0; g < kvh; g++)
				for (int e = 0; e < hd; e++) {
					size_t row = ((size_t)s * T + npad[s] + i) * kvw + (size_t)g * hd + e;
					k[row] = ATK(ka, s, g, i)[e];
					v[row] = ATK(va, s, g, i)[e];
				}
		}
	}
	void *sk = calloc((size_t)nseq * kvh * T * hd, es), *sv = calloc((size_t)nseq * kvh * T * hd, es);
	float *ss = calloc((size_t)nseq * kvh * T, 4);
	void *kc = calloc((size_t)nseq * kvh * cap * hd, es), *vc = calloc((size_t)nseq * kvh * cap * hd, es);
	float *sc = calloc((size_t)nseq * kvh * cap, 4), *ev = calloc((size_t)nseq * kvh, 4);
	int32_t *pos = calloc((size_t)nseq * kvh * cap, 4);
	sl_attn_args pa = { .nseq = nseq, .nh = nh, .nkv = nkv, .hd = hd, .t = T, .cap = T, .q = q,
			    .k_new = k, .v_new = v, .out = out, .k_cache = sk, .v_cache = sv,
			    .kv_f32 = f32, .npad = npad, .score = ss };
	ck_assert_int_eq(be->ops->attn_prefill(be, NULL, &pa), 0);
	int n[2] = { P[0], P[1] }, heavy[2] = { H, H }, recent[2] = { R, R };
	/* the cache's heads: the KV heads */
	sl_h2o_args ha = { .nseq = nseq, .nh = kvh, .hd = hd, .kv_f32 = f32, .k_src = sk, .v_src = sv,
			   .score_src = ss, .cap_in = T, .k_cache = kc, .v_cache = vc, .score = sc,
			   .pos = pos, .cap = cap, .n = n, .heavy = heavy, .recent = recent,
			   .evicted = ev };
	ck_assert_int_eq(be->ops->h2o_compact(be, NULL, &ha), 0);
	plain pl[2][8];
	ck_assert_int_le(kvh, 8);
	double *ref = malloc(sizeof(double) * grp * L * hd);
	for (int s = 0; s < nseq; s++)
		for (int g = 0; g < kvh; g++) {
			pl[s][g].hd = hd;
			plain_prefill(&pl[s][g], AT(qa, s, g * grp, 0), (size_t)L * hd, grp,
				      ATK(ka, s, g, 0), ATK(va, s, g, 0), P[s], H, R, ref);
			for (int r = 0; r < grp; r++)
				for (int i = 0; i < P[s]; i++)
					for (int e = 0; e < hd; e++) {
						const int h = g * grp + r;
						double got = out[((size_t)s * T + npad[s] + i) * hidden +
								 (size_t)h * hd + e];
						ck_assert_msg(fabs(got - ref[((size_t)r * P[s] + i) * hd + e]) < 1e-5,
							      "prefill output differs (head %d)", h);
					}
		}
	int len[2], cur[2];
	for (int s = 0; s < nseq; s++)
		len[s] = SL_MIN(P[s], B);
	float *q1 = malloc(sizeof(float) * nseq * hidden), *k1 = malloc(sizeof(float) * nseq * kvw),
	      *v1 = malloc(sizeof(float) * nseq * kvw), *o1 = malloc(sizeof(float) * nseq * hidden);
	for (int step = 0; step <= bc->G; step++) {
		/* compare the kept sets, sizes and the checksum */
		for (int s = 0; s < nseq; s++) {
			const int toks = P[s] + step;
			ck_assert_int_eq(len[s], SL_MIN(B, toks));
			for (int g = 0; g < kvh; g++) {
				plain *r = &pl[s][g];
				ck_assert_int_eq(r->n, len[s]);
				int got[4096], want[4096];
				double sum = 0;
				for (int j = 0; j < len[s]; j++) {
					got[j] = pos[((size_t)s * kvh + g) * cap + j];
					want[j] = r->pos[j];
					sum += sc[((size_t)s * kvh + g) * cap + j];
				}
				qsort(got, (size_t)len[s], sizeof(int), cmp_int);
				qsort(want, (size_t)len[s], sizeof(int), cmp_int);
				for (int j = 0; j < len[s]; j++)
					ck_assert_msg(got[j] == want[j],
						      "case %d nh %d nkv %d seq %d head %d step %d: kept %d where the plain implementation keeps %d",
						      ci, nh, nkv, s, g, step, got[j], want[j]);
				/* every query of every head of the group gives 1 */
				sum += ev[s * kvh + g];
				ck_assert_msg(fabs(sum - grp * toks) < 1e-3 * grp * toks,
					      "kept + evicted scores %.6f, %d queries of %d heads", sum, toks,
					      grp);
				for (int j = len[s]; j < cap; j++)
					ck_assert(sc[((size_t)s * kvh + g) * cap + j] == 0.0f);
			}
		}
		if (step == bc->G)
			break;
		/* decode: the token at position P[s] + step */
		for (int s = 0; s < nseq; s++) {
			cur[s] = P[s] + step;
			for (int h = 0; h < nh; h++)
				for (int e = 0; e < hd; e++)
					q1[s * hidden + h * hd + e] = AT(qa, s, h, cur[s])[e];
			for (int g = 0; g < kvh; g++)
				for (int e = 0; e < hd; e++) {
					k1[s * kvw + g * hd + e] = ATK(ka, s, g, cur[s])[e];
					v1[s * kvw + g * hd + e] = ATK(va, s, g, cur[s])[e];
				}
		}
		sl_attn_args da = { .nseq = nseq, .nh = nh, .nkv = nkv, .hd = hd, .t = 1, .cap = cap,
				    .q = q1, .k_new = k1, .v_new = v1, .out = o1, .k_cache = kc,
				    .v_cache = vc, .kv_f32 = f32, .len = len, .score = sc };
		ck_assert_int_eq(be->ops->attn_decode(be, NULL, &da), 0);
		sl_h2o_args ea = ha;
		ea.len = len;
		ea.cur = cur;
		ck_assert_int_eq(be->ops->h2o_evict(be, NULL, &ea), 0);
		for (int s = 0; s < nseq; s++) {
			for (int g = 0; g < kvh; g++) {
				plain_step(&pl[s][g], AT(qa, s, g * grp, cur[s]), (size_t)L * hd, grp,
					   ATK(ka, s, g, 0), ATK(va, s, g, 0), cur[s], H, R, ref);
				for (int r = 0; r < grp; r++)
					for (int e = 0; e < hd; e++)
						ck_assert_msg(fabs(o1[s * hidden + (g * grp + r) * hd + e] -
								   ref[(size_t)r * hd + e]) < 1e-5,
							      "decode output differs at step %d", step);
			}
			len[s] = SL_MIN(len[s] + 1, B);
		}
	}
#undef AT
#undef ATK
	free(qa), free(ka), free(va), free(q), free(k), free(v), free(out), free(sk), free(sv), free(ss);
	free(kc), free(vc), free(sc), free(ev), free(pos), free(ref), free(q1), free(k1), free(v1), free(o1);
}

START_TEST(test_ops_against_plain)
{
	ops_against_plain(&cases[_i / 2], _i / 2, _i % 2, 3, 0);
}
END_TEST

/* Grouped-query attention: 4 query heads over 2 KV heads (pairs) and over
 * 1 (all four share it), fp16 and fp32 caches. */
START_TEST(test_gqa_against_plain)
{
	const int nkv = _i / 2 % 2 ? 1 : 2;
	ops_against_plain(&cases[_i / 4], _i / 4, _i % 2, 4, nkv);
}
END_TEST

/* A case whose evictions are known in advance: every query is (1, 0); the
 * first token's key is (4, 0), the others (0, 0), so token 0 draws most of
 * the attention and is the heavy hitter.  B = 1 + 1: after the 4-token
 * prefill the cache holds {0 (heavy), 3 (recent)}; each new token then
 * pushes out the previous recent one, never token 0. */
START_TEST(test_hand_built)
{
	enum { nh = 1, hd = 2, T = 4, cap = 3 };
	float q[T * 2], k[T * 2], v[T * 2], out[T * 2];
	for (int i = 0; i < T; i++) {
		q[2 * i] = 1, q[2 * i + 1] = 0;
		k[2 * i] = i == 0 ? 4.0f : 0.0f, k[2 * i + 1] = 0;
		v[2 * i] = (float)i, v[2 * i + 1] = 1;
	}
	float sk[T * 2 * 2], sv[T * 2 * 2], ss[T] = { 0 }, sc[cap], ev[1] = { 0 };
	float kc[cap * 2], vc[cap * 2];
	int32_t pos[cap];
	int npad = 0, n = T, heavy = 1, recent = 1;
	sl_attn_args pa = { .nseq = 1, .nh = nh, .hd = hd, .t = T, .cap = T, .q = q, .k_new = k,
			    .v_new = v, .out = out, .k_cache = sk, .v_cache = sv, .kv_f32 = true,
			    .npad = &npad, .score = ss };
	ck_assert_int_eq(be->ops->attn_prefill(be, NULL, &pa), 0);
	sl_h2o_args ha = { .nseq = 1, .nh = nh, .hd = hd, .kv_f32 = true, .k_src = sk, .v_src = sv,
			   .score_src = ss, .cap_in = T, .k_cache = kc, .v_cache = vc, .score = sc,
			   .pos = pos, .cap = cap, .n = &n, .heavy = &heavy, .recent = &recent,
			   .evicted = ev };
	ck_assert_int_eq(be->ops->h2o_compact(be, NULL, &ha), 0);
	ck_assert_int_eq(pos[0], 0);
	ck_assert_int_eq(pos[1], 3);
	int len = 2;
	for (int cur = 4; cur < 8; cur++) {
		float q1[2] = { 1, 0 }, k1[2] = { 0, 0 }, v1[2] = { (float)cur, 1 }, o1[2];
		sl_attn_args da = { .nseq = 1, .nh = nh, .hd = hd, .t = 1, .cap = cap, .q = q1,
				    .k_new = k1, .v_new = v1, .out = o1, .k_cache = kc, .v_cache = vc,
				    .kv_f32 = true, .len = &len, .score = sc };
		ck_assert_int_eq(be->ops->attn_decode(be, NULL, &da), 0);
		sl_h2o_args ea = ha;
		ea.len = &len;
		ea.cur = &cur;
		ck_assert_int_eq(be->ops->h2o_evict(be, NULL, &ea), 0);
		int a = SL_MIN(pos[0], pos[1]), b2 = SL_MAX(pos[0], pos[1]);
		ck_assert_msg(a == 0 && b2 == cur, "after token %d the cache holds {%d, %d}", cur, a, b2);
		ck_assert_int_eq(pos[2], -1);
	}
}
END_TEST

/* ---- through the model -------------------------------------------------- */

static int np, plen[16];
static int32_t prompts[16][64];

static void load_prompts(const char *name)
{
	sl_test_prompts(fixtures_dir, name, &np, plen, prompts);
}

/* Greedy tokens for prompts [first, first + count) with the cache set up as
 * heavy/recent (counts; -1 and -1: dense) or ratios. */
static int micro_batch; /* sequences per micro-batch for greedy(); 0 = all */

static void greedy(const char *name, int first, int count, int heavy, int recent, double hh,
		   double rr, int32_t out[][24], int *nout)
{
	char dir[600];
	snprintf(dir, sizeof dir, "%s/%s", fixtures_dir, name);
	sl_model *m = NULL;
	sl_plan_params pp = sl_plan_defaults();
	pp.fixed_heavy = heavy;
	pp.fixed_recent = recent;
	pp.hh = hh;
	pp.rr = rr;
	pp.micro = micro_batch;
	const sl_model_params mp = { .dir = dir, .plan = &pp };
	ck_assert_msg(sl_model_open_ex(be, &mp, &m) == 0, "%s", sl_errmsg());
	int maxp = 0;
	for (int s = first; s < first + count; s++)
		maxp = SL_MAX(maxp, plen[s]);
	sl_generator *g = NULL;
	ck_assert_int_eq(sl_generator_create(m, count, maxp + 24, maxp, &g), 0);
	sl_seq seqs[16];
	for (int s = 0; s < count; s++)
		seqs[s] = (sl_seq){ .prompt = prompts[first + s], .prompt_len = plen[first + s],
				    .max_new = 24, .out = out[s] };
	sl_gen_timing tm = { 0 };
	int rc = sl_generator_run(g, seqs, count, NULL, &tm);
	ck_assert_msg(rc == 0, "%s", sl_errmsg());
	for (int s = 0; s < count; s++)
		nout[s] = seqs[s].n_out;
	sl_generator_free(g);
	sl_model_free(m);
}

START_TEST(test_budget_beyond_length_is_dense)
{
	static const char *const names[] = { "opt-pre", "opt-wide", "opt-long" };
	load_prompts(names[_i]);
	int32_t dense[16][24], h2o[16][24];
	int nd[16], nh2[16];
	greedy(names[_i], 0, np, -1, -1, 0, 0, dense, nd);
	/* heavy slots for every token: nothing is ever evicted */
	greedy(names[_i], 0, np, 200, 0, 0, 0, h2o, nh2);
	for (int s = 0; s < np; s++) {
		ck_assert_int_eq(nd[s], nh2[s]);
		ck_assert_mem_eq(dense[s], h2o[s], sizeof(int32_t) * (size_t)nd[s]);
	}
}
END_TEST

START_TEST(test_batch_equals_alone)
{
	load_prompts("opt-wide");
	int32_t batch[16][24], one[1][24];
	int nb[16], n1[1];
	greedy("opt-wide", 0, np, -1, -1, 0.2, 0.1, batch, nb);
	for (int s = 0; s < np; s++) {
		greedy("opt-wide", s, 1, -1, -1, 0.2, 0.1, one, n1);
		ck_assert_int_eq(n1[0], nb[s]);
		ck_assert_mem_eq(one[0], batch[s], sizeof(int32_t) * (size_t)nb[s]);
	}
}
END_TEST

/* Micro-batches address each sequence's slots, scores and scratch by its
 * offset: the tokens do not depend on the micro-batch size. */
START_TEST(test_micro_batches)
{
	load_prompts("opt-wide");
	int32_t all[16][24], part[16][24];
	int na[16], npart[16];
	micro_batch = 0;
	greedy("opt-wide", 0, np, -1, -1, 0.2, 0.2, all, na);
	micro_batch = 2;
	greedy("opt-wide", 0, np, -1, -1, 0.2, 0.2, part, npart);
	micro_batch = 0;
	for (int s = 0; s < np; s++) {
		ck_assert_int_eq(na[s], npart[s]);
		ck_assert_mem_eq(all[s], part[s], sizeof(int32_t) * (size_t)na[s]);
	}
}
END_TEST

/* ---- scoring against the independent reference -------------------------- */

typedef struct score_place {
	double cg, cc; /* the cache on the device, in host memory (the rest on disk) */
	bool ccc;      /* cpu_cache_compute */
	int micro;
	const char *what;
} score_place;

static const score_place score_places[] = {
	{ 100, 0, false, 0, "cache on the device" },
	{ 0, 100, false, 0, "cache in host memory" },
	{ 0, 100, true, 0, "cache in host memory, cpu_cache_compute" },
	{ 0, 0, false, 0, "cache on disk" },
	{ 34, 33, true, 3, "cache across the tiers, micro-batches of 3, cpu_cache_compute" },
};

/*
 * sluice score's path (sl_scorer) over every line of the fixture in one
 * block, under each case's budgets (both ratios 0: the counts 0 and 0, a
 * budget of 0 for every line), with the fp32 cache: the log-probabilities
 * of bench/h2o_ref.py within 1e-4.  Lines of 1 to 16 prompt tokens, so
 * short prompts whose budget is 0 finish while longer ones go on.
 */
START_TEST(test_score_against_reference)
{
	const score_place *pl = &score_places[_i];
	char path[600];
	snprintf(path, sizeof path, "%s/h2o-score.json", fixtures_dir);
	json_error_t jerr;
	json_t *fx = json_load_file(path, 0, &jerr);
	ck_assert_msg(fx, "%s: %s", path, jerr.text);
	json_t *lines = json_object_get(fx, "lines"), *fcases = json_object_get(fx, "cases");
	const int n = (int)json_array_size(lines);
	ck_assert(n > 0 && n <= 16 && json_array_size(fcases) > 0);
	int32_t ids[16][64], cont[16][64];
	sl_score_seq seqs[16];
	double lp[16][64];
	int max_len = 0, max_prompt = 0;
	for (int i = 0; i < n; i++) {
		json_t *ln = json_array_get(lines, (size_t)i);
		json_t *a = json_object_get(ln, "input_ids"), *b = json_object_get(ln, "continuation_ids");
		seqs[i] = (sl_score_seq){ .prompt = ids[i], .cont = cont[i], .logprobs = lp[i],
					  .prompt_len = (int)json_array_size(a),
					  .cont_len = (int)json_array_size(b) };
		for (int j = 0; j < seqs[i].prompt_len; j++)
			ids[i][j] = (int32_t)json_integer_value(json_array_get(a, (size_t)j));
		for (int j = 0; j < seqs[i].cont_len; j++)
			cont[i][j] = (int32_t)json_integer_value(json_array_get(b, (size_t)j));
		max_len = SL_MAX(max_len, seqs[i].prompt_len + seqs[i].cont_len);
		max_prompt = SL_MAX(max_prompt, seqs[i].prompt_len);
	}
	char dir[600], off[64];
	snprintf(dir, sizeof dir, "%s/opt-pre", fixtures_dir);
	snprintf(off, sizeof off, "/tmp/sluice-h2o-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(off));
	for (size_t c = 0; c < json_array_size(fcases); c++) {
		json_t *cs = json_array_get(fcases, c);
		const double hh = json_real_value(json_object_get(cs, "hh_ratio")),
			     rr = json_real_value(json_object_get(cs, "recent_ratio"));
		sl_plan_params pp = sl_plan_defaults();
		pp.overlap = true;
		pp.kv_f32 = true;
		pp.hh = hh;
		pp.rr = rr;
		if (hh == 0 && rr == 0) /* ratios 0 and 0 mean dense: the counts instead */
			pp.fixed_heavy = pp.fixed_recent = 0;
		pp.cache_gpu = pl->cg;
		pp.cache_cpu = pl->cc;
		pp.cpu_cache_compute = pl->ccc;
		pp.micro = pl->micro;
		/* the workload the scorer runs */
		pp.max_seq = n;
		pp.max_prompt = max_prompt;
		pp.max_len = max_len;
		sl_model_params mp = { .dir = dir, .offload_dir = off, .plan = &pp };
		sl_model *m = NULL;
		ck_assert_msg(sl_model_open_ex(be, &mp, &m) == 0, "%s", sl_errmsg());
		sl_scorer *sc = NULL;
		ck_assert_msg(sl_scorer_create(m, n, max_len, max_prompt, &sc) == 0, "%s", sl_errmsg());
		int rc = sl_scorer_run(sc, seqs, n, NULL);
		ck_assert_msg(rc == 0, "H2O %g/%g, %s: %s", hh, rr, pl->what, sl_errmsg());
		json_t *want = json_object_get(cs, "logprobs");
		for (int i = 0; i < n; i++)
			for (int j = 0; j < seqs[i].cont_len; j++) {
				const double w = json_real_value(
					json_array_get(json_array_get(want, (size_t)i), (size_t)j));
				ck_assert_msg(fabs(lp[i][j] - w) <= 1e-4 * fmax(1.0, fabs(w)),
					      "H2O %g/%g, %s: line %d (prompt of %d) token %d: %.6f, the reference %.6f",
					      hh, rr, pl->what, i, seqs[i].prompt_len, j, lp[i][j], w);
			}
		sl_scorer_free(sc);
		sl_model_free(m);
	}
	rmdir(off);
	json_decref(fx);
}
END_TEST

/* Prefill prompts (n of them) as one left-padded block into kv. */
static void prefill_block(sl_model *m, sl_kv *kv, int n, const int *which)
{
	int t = 0, npad[16];
	int32_t ids[16 * 64];
	for (int i = 0; i < n; i++)
		t = SL_MAX(t, plen[which[i]]);
	for (int i = 0; i < n; i++) {
		npad[i] = t - plen[which[i]];
		for (int j = 0; j < t; j++)
			ids[i * t + j] = j < npad[i] ? 1 : prompts[which[i]][j - npad[i]];
	}
	kv->nseq = n;
	ck_assert_msg(sl_model_prefill(m, kv, ids, npad, t, NULL) == 0, "%s", sl_errmsg());
}

/* sl_kv_rollback under H2O undoes a step's position, not its cache: a
 * frozen sequence keeps its position and stays within its budget step
 * after step (its filler token kept or evicting another), and the
 * sequence beside it gives, bit for bit, the logits it gives alone. */
START_TEST(test_rollback_keeps_position)
{
	load_prompts("opt-wide");
	char dir[600];
	snprintf(dir, sizeof dir, "%s/opt-wide", fixtures_dir);
	sl_model *m = NULL;
	sl_plan_params pp = sl_plan_defaults();
	pp.hh = 0.2;
	pp.rr = 0.1;
	const sl_model_params mp = { .dir = dir, .plan = &pp };
	ck_assert_msg(sl_model_open_ex(be, &mp, &m) == 0, "%s", sl_errmsg());
	const int steps = 12, V = m->cfg.vocab, pair[2] = { 0, 1 };
	const int maxp = SL_MAX(plen[0], plen[1]);
	sl_kv *two = NULL, *one = NULL;
	ck_assert_int_eq(sl_kv_make(&m->kv_env, 2, maxp, maxp + steps + 1, &two), 0);
	ck_assert_int_eq(sl_kv_make(&m->kv_env, 1, maxp, maxp + steps + 1, &one), 0);
	float *lg2 = malloc(sizeof(float) * 2 * (size_t)V), *lg1 = malloc(sizeof(float) * (size_t)V);
	prefill_block(m, two, 2, pair);
	prefill_block(m, one, 1, pair);
	const int budget = two->heavy[1] + two->recent[1];
	ck_assert_int_lt(budget, plen[1]); /* it evicts */
	for (int i = 0; i < steps; i++) {
		const int32_t ids[2] = { 3 + (i * 37) % (V - 3), 3 + (i * 53) % (V - 3) };
		const int len_before = two->len[1];
		ck_assert_msg(sl_model_decode(m, two, ids) == 0, "%s", sl_errmsg());
		ck_assert_msg(sl_kv_rollback(two, 1) == 0, "%s", sl_errmsg());
		ck_assert_int_eq(two->pos[1], plen[1]);
		ck_assert_int_eq(two->len[1], SL_MIN(len_before + 1, budget));
		ck_assert_int_eq(two->pos[0], plen[0] + i + 1);
		ck_assert_int_eq(sl_model_logits(m, 2, lg2), 0);
		ck_assert_msg(sl_model_decode(m, one, ids) == 0, "%s", sl_errmsg());
		ck_assert_int_eq(sl_model_logits(m, 1, lg1), 0);
		ck_assert_msg(!memcmp(lg1, lg2, sizeof(float) * (size_t)V),
			      "step %d: a frozen sequence beside it changed sequence 0's logits", i);
	}
	free(lg1);
	free(lg2);
	sl_kv_free(two);
	sl_kv_free(one);
	sl_model_free(m);
}
END_TEST

int main(int argc, char **argv)
{
	if (argc > 1)
		fixtures_dir = argv[1];
	/* The cache's disk tier binds its I/O threads through hwloc, whose
	 * first load dlopens plugins; load it here, before Check forks a test,
	 * as LeakSanitizer cannot walk the thread-local storage of libraries
	 * loaded after the fork (it crashes at the child's exit). */
	sl_topo_info ti;
	sl_topo_get(&ti);
	Suite *s = suite_create("h2o");
	TCase *tc = tcase_create("h2o");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, test_ops_against_plain, 0, 2 * (int)SL_ARRAY_LEN(cases));
	tcase_add_loop_test(tc, test_gqa_against_plain, 0, 4 * (int)SL_ARRAY_LEN(cases));
	tcase_add_test(tc, test_hand_built);
	tcase_add_loop_test(tc, test_budget_beyond_length_is_dense, 0, 3);
	tcase_add_test(tc, test_batch_equals_alone);
	tcase_add_test(tc, test_micro_batches);
	tcase_add_test(tc, test_rollback_keeps_position);
	tcase_add_loop_test(tc, test_score_against_reference, 0, (int)SL_ARRAY_LEN(score_places));
	suite_add_tcase(s, tc);
	return sl_test_run(s);
}
