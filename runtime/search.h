/*
 * search.h - the policy search: the policy with the most predicted tokens/s
 * (cost.h) among those whose run plan fits the budgets.
 *
 * A candidate is a policy; the search makes its run plan for the workload
 * (plan.h, the same arithmetic the command line admits jobs with), keeps it
 * when its peak bytes fit every budget (sl_cost_fits), and predicts it
 * (sl_cost_eval).  What it varies: gpu_batch_size, num_gpu_batches, the
 * weight, cache and activation placements, overlap, sep_layer and
 * cpu_cache_compute, and the H2O budget where the user allows one.  Fields
 * the user fixes (--fix) are set on every candidate.
 */
#ifndef SL_SEARCH_H
#define SL_SEARCH_H

#include "cost.h"
#include "policy.h"

#include <stdbool.h>

/* How the search may choose the H2O budget. */
enum {
	SL_H2O_DENSE, /* no H2O (the default) */
	SL_H2O_FIXED, /* hh_ratio = h2o_ratio, recent the same */
	SL_H2O_MIN    /* any budget of at least h2o_ratio of the prompt, half heavy, half recent */
};

#define SL_SEARCH_MAX_FIX 32

typedef struct sl_search_params {
	int prompt_len, gen_len; /* the workload */
	bool kv_f32;             /* the cache's precision */
	bool allow_compress;     /* the search may choose compress_cache (not with
				  * kv_f32) and compress_weight */
	sl_budgets budget;       /* 0: no cap (the device: the profile's GPU memory on CUDA) */
	bool disk;               /* an offload folder: weights and cache may go to the disk */
	int h2o;                 /* SL_H2O_* */
	double h2o_ratio;        /* FIXED: the heavy ratio; MIN: the least total budget */
	/* fields pinned by the user: "name=value", as sl_policy_set takes them */
	int nfix;
	const char *fix[SL_SEARCH_MAX_FIX];
	int max_batch;           /* the most sequences in a block (0: 4096) */
	double w_zstd;           /* the weights' disk share read from a zstd store
				  * (sluice convert --zstd) of this ratio, disk
				  * bytes over raw; 0: a plain store */
	int rows_per_seq;        /* rows of one forward per sequence, as the command
				  * that runs the policy reserves them: the prompt
				  * (bench; 0 means this) or prompt + gen (generate,
				  * score) */
	double margin;           /* in [0, 0.5]: candidates the fastest prediction
				  * leads by at most this share (fastest <= tok/s x
				  * (1 + margin)) rank first, the simplest first (the
				  * fewest bytes on the disk, then the fewest
				  * micro-batches, then the fewest parts: tiers of the
				  * weights and of the cache, activations off the
				  * device, switches off their defaults); 0: by
				  * predicted tok/s alone.  The commands use
				  * SL_SEARCH_MARGIN */
} sl_search_params;

/* The commands' margin: a lead of under 1% is well inside the model's
 * error (docs/cost-model.md, "The search"). */
#define SL_SEARCH_MARGIN 0.01

typedef struct sl_choice {
	sl_policy pol;
	sl_cost cost;
} sl_choice;

typedef struct sl_search_stats {
	long evaluated;    /* candidates predicted */
	sl_choice fastest; /* the fastest prediction (best[0] without a margin) */
} sl_search_stats;

/*
 * Search.  best[0..*nbest) receives the best min(nbest_cap, found)
 * candidates, the choice first (distinct policies; ranked as sp->margin
 * says); *st the number of candidates predicted and the fastest.  Errors:
 * SL_EINVAL for a --fix that names no field or a value out of bounds (the
 * policy's message), SL_EBUDGET when nothing fits, naming the smallest
 * device budget that would (with the other budgets as given), SL_ERANGE
 * for a workload beyond the model's positions or a margin out of range.
 */
int sl_search(const sl_model_config *c, const sl_profile *prof, const sl_search_params *sp,
	      sl_choice *best, int nbest_cap, int *nbest, sl_search_stats *st);

/*
 * Predict one policy for the workload without searching (its whole block:
 * gpu_batch_size x num_gpu_batches sequences): its cost, and in *fit 0 or
 * the sl_cost_fits verdict against sp's budgets (whose message says which
 * tier and by how much).  Errors as sl_plan_make.
 */
int sl_search_evaluate(const sl_model_config *c, const sl_profile *prof, const sl_search_params *sp,
		       const sl_policy *pol, sl_choice *out, int *fit);

/* The run plan parameters a policy gives for a workload of its block. */
sl_plan_params sl_search_plan_params(const sl_policy *pol, const sl_search_params *sp);

#endif
