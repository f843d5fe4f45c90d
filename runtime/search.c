/*
 * search.c - the policy search (search.h; docs/policy.md says why a grid).
 *
 * For each block shape (gpu_batch_size x num_gpu_batches) and each choice
 * of the switches (activations on the host, overlap, sep_layer,
 * cpu_cache_compute), it walks the device shares of the weights and of
 * the cache on a grid; for each, the host takes as much of the rest as the
 * host budget holds (the largest share on the grid that fits) and the disk
 * the remainder.  Every candidate's run plan is made and its peak checked
 * against the budgets before it is predicted, so the search proposes only
 * what the command line admits.
 */
#include "search.h"
#include "sl_common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The grid: weight shares in steps of W_STEP percent (then refined to the
 * percent: finest), cache shares in steps of C_STEP. */
#define W_STEP 10
#define C_STEP 25

typedef struct search {
	const sl_model_config *c;
	const sl_profile *prof;
	const sl_search_params *sp;
	bool dev_is_host;
	sl_policy fixed;       /* the pinned fields set on a default policy */
	sl_choice *best;
	int cap, n;
	double floor;          /* > 0: candidates predicted at least this fast rank
				* first, the simplest first (ahead) */
	long evaluated;
	bool any_valid;        /* a candidate passed the policy's rules */
	size_t min_device;     /* the least device peak of a candidate that fits the rest */
} search;

sl_plan_params sl_search_plan_params(const sl_policy *pol, const sl_search_params *sp)
{
	sl_plan_params pp = sl_plan_of_policy(pol, true, sp->kv_f32);
	const int batch = (int)sl_policy_batch(pol);
	pp.max_seq = batch;
	pp.max_prompt = sp->prompt_len;
	pp.max_len = sp->prompt_len + sp->gen_len;
	pp.max_rows = batch * (sp->rows_per_seq > 0 ? sp->rows_per_seq : sp->prompt_len);
	pp.w_zstd = sp->w_zstd;
	return pp;
}

/* Apply the pinned fields ("name=value") to p. */
static int apply_fix(const sl_search_params *sp, sl_policy *p)
{
	for (int i = 0; i < sp->nfix; i++) {
		const char *f = sp->fix[i];
		const char *eq = strchr(f, '=');
		if (!eq || eq == f)
			return sl_err(SL_EINVAL, "--fix %s: give FIELD=VALUE", f);
		char name[64];
		const size_t n = (size_t)(eq - f);
		if (n >= sizeof name)
			return sl_err(SL_EINVAL, "--fix %s: unknown policy field", f);
		memcpy(name, f, n);
		name[n] = 0;
		SL_TRY(sl_policy_set(p, name, eq + 1));
	}
	return 0;
}

/* The tiers a placement's shares (device, host, the rest on disk) use. */
static int tiers(double gpu, double cpu)
{
	return (gpu > 0) + (cpu > 0) + (gpu + cpu < 100);
}

/*
 * A policy's parts: the tiers its weights and its cache each use, one for
 * activations off the device, and one for each switch away from the
 * default (sep_layer off, overlap off, cpu_cache_compute, a compressed
 * cache or weights): each a stream or a variant of the schedule the
 * model times, and can time wrongly.
 */
static int parts(const sl_policy *p)
{
	return tiers(p->w_gpu_percent, p->w_cpu_percent) +
	       tiers(p->cache_gpu_percent, p->cache_cpu_percent) + (p->act_gpu_percent < 100) +
	       !p->sep_layer + !p->overlap + p->cpu_cache_compute + p->compress_cache + p->compress_weight;
}

/*
 * Whether a ranks before b.  Without a floor: the faster.  With one (the
 * margin's second pass), those at or above it come first, and among them
 * the simplest: the fewest bytes on the disk (whose rate moves most),
 * then the fewest micro-batches, then the fewest parts, then the faster;
 * below it, the faster.
 */
static bool ahead(const search *S, const sl_choice *a, const sl_choice *b)
{
	if (S->floor > 0) {
		const bool in_a = a->cost.tok_s >= S->floor, in_b = b->cost.tok_s >= S->floor;
		if (in_a != in_b)
			return in_a;
		if (in_a && a->cost.peak.disk != b->cost.peak.disk)
			return a->cost.peak.disk < b->cost.peak.disk;
		if (in_a && a->pol.num_gpu_batches != b->pol.num_gpu_batches)
			return a->pol.num_gpu_batches < b->pol.num_gpu_batches;
		if (in_a && parts(&a->pol) != parts(&b->pol))
			return parts(&a->pol) < parts(&b->pol);
	}
	return a->cost.tok_s > b->cost.tok_s;
}

/* Insert ch into the best list (in ahead's order, distinct policies). */
static void keep(search *S, const sl_choice *ch)
{
	for (int i = 0; i < S->n; i++)
		if (sl_policy_equal(&S->best[i].pol, &ch->pol)) {
			if (!ahead(S, ch, &S->best[i]))
				return;
			memmove(&S->best[i], &S->best[i + 1], sizeof *ch * (size_t)(S->n - i - 1));
			S->n--;
			break;
		}
	int at = S->n;
	while (at > 0 && ahead(S, ch, &S->best[at - 1]))
		at--;
	if (at >= S->cap)
		return;
	if (S->n == S->cap)
		S->n--;
	memmove(&S->best[at + 1], &S->best[at], sizeof *ch * (size_t)(S->n - at));
	S->best[at] = *ch;
	S->n++;
}

/* The plan of policy p, and whether it fits: 1 fits, 0 does not (*dev_over:
 * only the device is over), < 0 an error of the plan. */
static int plan_fits(search *S, const sl_policy *p, sl_plan *pl, bool *dev_over)
{
	const sl_plan_params pp = sl_search_plan_params(p, S->sp);
	SL_TRY(sl_plan_make(S->c, &pp, S->dev_is_host, pl));
	sl_tier_bytes peak = pl->total;
	if (!S->dev_is_host)
		peak.device += S->prof->dev_reserve_bytes;
	int tier = -1;
	const int rc = sl_cost_fits(&peak, &S->sp->budget, &tier);
	if (rc == 0)
		return 1;
	sl_budgets rest = S->sp->budget;
	rest.device = 0;
	*dev_over = tier == 0 && sl_cost_fits(&peak, &rest, NULL) == 0;
	if (*dev_over && (S->min_device == 0 || peak.device < S->min_device))
		S->min_device = peak.device;
	return 0;
}

/* Predict candidate p (the pinned fields applied) and keep it when it
 * fits.  1: it fits; 0: not (or breaks the policy's rules). */
static int consider(search *S, sl_policy p, bool *dev_over)
{
	*dev_over = false;
	if (apply_fix(S->sp, &p) < 0 || sl_policy_validate(&p, "candidate") < 0)
		return 0;
	S->any_valid = true;
	sl_plan pl;
	int rc = plan_fits(S, &p, &pl, dev_over);
	if (rc <= 0)
		return rc;
	sl_choice ch = { .pol = p };
	SL_TRY(sl_cost_eval(S->c, &pl, S->prof, S->sp->prompt_len, S->sp->gen_len, &ch.cost));
	S->evaluated++;
	keep(S, &ch);
	return 1;
}

/* Whether p, the pinned fields applied, keeps the policy's rules and
 * fits: 1 every budget, 0 not, 2 all but the device's; < 0 an error. */
static int try_fit(search *S, sl_policy p)
{
	if (apply_fix(S->sp, &p) < 0 || sl_policy_validate(&p, "candidate") < 0)
		return 0;
	S->any_valid = true;
	if (!S->sp->disk && (p.w_gpu_percent + p.w_cpu_percent < 100 ||
			     p.cache_gpu_percent + p.cache_cpu_percent < 100))
		return 0;
	sl_plan pl;
	bool over = false;
	const int rc = plan_fits(S, &p, &pl, &over);
	return rc < 0 ? rc : rc == 1 ? 1 : over ? 2 : 0;
}

/* The H2O ratios the search may use. */
static void h2o_of(const sl_search_params *sp, sl_policy *p)
{
	switch (sp->h2o) {
	case SL_H2O_FIXED:
		p->hh_ratio = sp->h2o_ratio;
		p->recent_ratio = -1;
		break;
	case SL_H2O_MIN: /* the least budget: throughput falls as the cache grows */
		p->hh_ratio = sp->h2o_ratio / 2;
		p->recent_ratio = sp->h2o_ratio / 2;
		break;
	default: p->hh_ratio = 0; p->recent_ratio = -1; break;
	}
}

/* Weights' share v for step which: 0 the device's (the host takes the
 * rest where the disk is not allowed), 1 the host's. */
static void set_wshare(search *S, sl_policy *p, int which, int v)
{
	if (which == 0) {
		p->w_gpu_percent = v;
		p->w_cpu_percent = S->sp->disk ? 0 : 100 - v;
	} else {
		p->w_cpu_percent = v;
	}
}

/* The largest whole percent in [lo, hi] for step which that is admitted
 * (try_fit 1, or with not_device any but 2), lo admitted, into p: by
 * bisection, as a larger share only fills its own tier more (the
 * placement holds a percentage to within a few rows: weights.h). */
static int finest(search *S, sl_policy *p, int which, int lo, int hi, bool not_device)
{
	while (lo < hi) {
		const int mid = (lo + hi + 1) / 2;
		set_wshare(S, p, which, mid);
		const int rc = try_fit(S, *p);
		if (rc < 0)
			return rc;
		if (rc == 1 || (not_device && rc == 0))
			lo = mid;
		else
			hi = mid - 1;
	}
	set_wshare(S, p, which, lo);
	return 0;
}

/*
 * The placements of one block shape and set of switches.  For each split
 * of the cache (device, host, disk shares on the grid), the weights take
 * the largest device share that fits, then the largest host share: with
 * the cache fixed, more of the weights on a faster tier is never slower,
 * so one candidate per cache split.  Returns whether any fitted.
 */
static int placements(search *S, sl_policy base, bool *fitted)
{
	const bool disk = S->sp->disk;
	for (int cg = 100; cg >= 0; cg -= C_STEP) {
		for (int cc = 100 - cg; cc >= 0; cc -= C_STEP) {
			if (!disk && cc != 100 - cg)
				break;
			if (base.cpu_cache_compute && cc == 0)
				continue; /* the same as without: no host part */
			sl_policy p = base;
			p.cache_gpu_percent = cg;
			p.cache_cpu_percent = cc;
			int wg = 100, rc = 0;
			for (; wg >= 0; wg -= W_STEP) {
				set_wshare(S, &p, 0, wg);
				if ((rc = try_fit(S, p)) < 0)
					return rc;
				if (rc == 1 || (rc == 0 && disk))
					break; /* the device holds it (the host, perhaps not yet) */
			}
			if (wg < 0 || (rc != 1 && !disk))
				continue;
			if (wg < 100) {
				SL_TRY(finest(S, &p, 0, wg, wg + W_STEP - 1, disk));
				wg = (int)p.w_gpu_percent;
			}
			int wc = 100 - wg;
			for (; wc >= 0 && disk; wc -= W_STEP) {
				set_wshare(S, &p, 1, wc);
				if ((rc = try_fit(S, p)) < 0)
					return rc;
				if (rc == 1)
					break;
			}
			if (disk && wc >= 0 && wc < 100 - wg)
				SL_TRY(finest(S, &p, 1, wc, SL_MIN(wc + W_STEP - 1, 100 - wg), false));
			if (rc != 1)
				continue;
			bool dev_over = false;
			if ((rc = consider(S, p, &dev_over)) < 0)
				return rc;
			*fitted = *fitted || rc == 1;
		}
	}
	return 0;
}

static const int batch_sizes[] = { 1,   2,   3,   4,   6,    8,    12,   16,   24,  32,
				   48,  64,  96,  128, 192,  256,  384,  512,  768, 1024,
				   1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384 };
static const int micro_counts[] = { 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64 };

/* Every candidate of the grid into S's list. */
static int walk(search *S)
{
	const sl_search_params *sp = S->sp;
	const int max_batch = sp->max_batch > 0 ? sp->max_batch : 4096;
	for (size_t mi = 0; mi < SL_ARRAY_LEN(micro_counts); mi++) {
		for (size_t bi = 0; bi < SL_ARRAY_LEN(batch_sizes); bi++) {
			const int gbs = batch_sizes[bi], ngb = micro_counts[mi];
			if ((long)gbs * ngb > max_batch)
				break;
			bool fitted = false;
			/* the switches: activations on the host, sep_layer,
			 * cpu_cache_compute (on the CPU backend too: the host
			 * part is then read in place, not copied), and where
			 * allowed the compressed cache (not with an fp32 cache)
			 * and the compressed weights; overlap stays on (the model
			 * never finds it slower, and it costs no memory) unless
			 * fixed */
			const int nsw = sp->allow_compress ? 32 : 8;
			for (int sw = 0; sw < nsw; sw++) {
				if ((sw & 8) && sp->kv_f32)
					continue;
				sl_policy p;
				sl_policy_default(&p);
				p.gpu_batch_size = gbs;
				p.num_gpu_batches = ngb;
				const bool act_host = sw & 1, ccc = sw & 4;
				p.sep_layer = !(sw & 2);
				p.cpu_cache_compute = ccc;
				p.compress_cache = sw & 8; /* only where allowed */
				p.compress_weight = sw & 16;
				p.act_gpu_percent = act_host ? 0 : 100;
				p.act_cpu_percent = act_host ? 100 : 0;
				h2o_of(sp, &p);
				SL_TRY(placements(S, p, &fitted));
			}
			/* a larger block of as many micro-batches needs more */
			if (!fitted)
				break;
		}
	}
	return 0;
}

int sl_search(const sl_model_config *c, const sl_profile *prof, const sl_search_params *sp,
	      sl_choice *best, int nbest_cap, int *nbest, sl_search_stats *st)
{
	*nbest = 0;
	memset(st, 0, sizeof *st);
	if (sp->prompt_len <= 0 || sp->gen_len <= 0)
		return sl_err(SL_EINVAL, "the workload needs a prompt and new tokens (got %d and %d)",
			      sp->prompt_len, sp->gen_len);
	if (sp->prompt_len + sp->gen_len > c->max_pos)
		return sl_err(SL_ERANGE, "a prompt of %d tokens and %d new ones need %d positions; %s has %d",
			      sp->prompt_len, sp->gen_len, sp->prompt_len + sp->gen_len, c->name,
			      c->max_pos);
	if (!(sp->margin >= 0 && sp->margin <= 0.5))
		return sl_err(SL_ERANGE, "the search's margin is %g; it must be in [0, 0.5]", sp->margin);
	search S = { .c = c, .prof = prof, .sp = sp };
	S.dev_is_host = !strcmp(prof->backend, "cpu");
	sl_policy_default(&S.fixed);
	SL_TRY(apply_fix(sp, &S.fixed)); /* an unknown field or a value out of bounds */
	/* the fastest first; with a margin, the grid again, those the fastest
	 * leads by at most the margin ranked first, the simplest first
	 * (ahead): the model's error is larger than such leads */
	const bool twice = sp->margin > 0;
	S.best = twice ? &st->fastest : best;
	S.cap = twice ? 1 : nbest_cap;
	SL_TRY(walk(&S));
	st->evaluated = S.evaluated;
	if (S.n > 0 && twice) {
		S.best = best;
		S.cap = nbest_cap;
		S.n = 0;
		S.floor = st->fastest.cost.tok_s / (1 + sp->margin);
		SL_TRY(walk(&S));
	} else if (S.n > 0) {
		st->fastest = best[0];
	}
	*nbest = S.n;
	if (S.n > 0)
		return 0;
	if (!S.any_valid)
		return sl_err(SL_EINVAL, "no policy satisfies the fixed fields together (--fix)");
	if (S.min_device) {
		char want[32];
		const double g = (double)S.min_device;
		if (g >= 1073741824.0)
			snprintf(want, sizeof want, "%.2fG", ceil(g / 1073741824.0 * 100) / 100);
		else
			snprintf(want, sizeof want, "%.1fM", ceil(g / 1048576.0 * 10) / 10);
		return sl_err(SL_EBUDGET, "no policy fits the budgets: the smallest device budget that fits this workload (with the other budgets as given) is --gpu-mem %s",
			      want);
	}
	return sl_err(SL_EBUDGET, "no policy fits the budgets: the host%s budget is too small for this workload whatever the device holds",
		      sp->disk ? " or disk" : " (and no --offload-dir for the disk)");
}

int sl_search_evaluate(const sl_model_config *c, const sl_profile *prof, const sl_search_params *sp,
		       const sl_policy *pol, sl_choice *out, int *fit)
{
	memset(out, 0, sizeof *out);
	*fit = 0;
	out->pol = *pol;
	SL_TRY(sl_policy_validate(pol, "policy"));
	const sl_plan_params pp = sl_search_plan_params(pol, sp);
	sl_plan pl;
	SL_TRY(sl_plan_make(c, &pp, !strcmp(prof->backend, "cpu"), &pl));
	SL_TRY(sl_cost_eval(c, &pl, prof, sp->prompt_len, sp->gen_len, &out->cost));
	*fit = sl_cost_fits(&out->cost.peak, &sp->budget, NULL);
	return 0;
}
