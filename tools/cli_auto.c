/*
 * cli_auto.c - the cost model on the command line: the profile a run
 * predicts with, the prediction of a run (bench, and the --stats of
 * generate and score), and --policy auto (the search before the run).
 */
#include "cli.h"
#include "cost.h"
#include "profile_measure.h"
#include "search.h"

#include <stdio.h>
#include <string.h>

int profile_gemm_matches(const char *path, const sl_profile *p, const char *backend, const char *cpu_gemm)
{
	const char *had = p->cpu_gemm[0] ? p->cpu_gemm : "sluice";
	if (strcmp(backend, "cpu") || !strcmp(had, cpu_gemm))
		return 0; /* a GPU's products are the GPU's */
	return sl_err(SL_EINVAL,
		      "%s: a profile of --cpu-gemm %s; this run uses --cpu-gemm %s (sluice profile --cpu-gemm %s --json FILE measures one)",
		      path, had, cpu_gemm, cpu_gemm);
}

int cli_profile(common_opts *o, const sl_model_config *cfg, const char *backend, bool measure,
		sl_profile *prof, bool *have)
{
	*have = false;
	o->profile_src = NULL;
	if (o->profile_path) {
		if (strcmp(o->profile.backend, backend))
			return sl_err(SL_EINVAL,
				      "%s: a profile of the %s backend; this run is on %s (sluice profile --backend %s --json FILE measures one)",
				      o->profile_path, o->profile.backend, backend, backend);
		SL_TRY(profile_gemm_matches(o->profile_path, &o->profile, backend, o->cpu_gemm));
		*prof = o->profile;
		*have = true;
		o->profile_src = o->profile_path;
		return 0;
	}
	/* this machine's, cached in the offload folder or $XDG_CACHE_HOME/sluice
	 * (sl_profile_obtain): only looked up for a prediction, measured and
	 * cached for a search */
	sl_profile_opts po = { .backend = backend, .offload_dir = o->offload_dir,
			       .threads = o->threads, .cpu_gemm = o->cpu_gemm, .cache_only = !measure };
	int rc = cfg ? sl_cost_profile_shapes(&po, cfg) : 0; /* the model's own GEMMs */
	if (rc < 0)
		return rc;
	bool measured = false;
	rc = sl_profile_obtain(&po, NULL, prof, &measured);
	if (rc < 0)
		return measure ? rc : 0; /* none cached: no prediction */
	*have = true;
	o->profile_src = measured ? "measured" : "cached";
	return rc;
}

int predict_run(const sl_model_config *cfg, const sl_plan_params *pp, bool dev_is_host,
		const sl_profile *prof, int prompt_len, int gen_len, sl_cost *out)
{
	sl_plan pl;
	SL_TRY(sl_plan_make(cfg, pp, dev_is_host, &pl));
	return sl_cost_eval(cfg, &pl, prof, prompt_len, gen_len, out);
}

/* The policy as the flags that give it, e.g. "--gpu-batch-size 8
 * --num-gpu-batches 2 --percent 0 100 100 0 100 0". */
static void policy_flags(const sl_policy *p, char *buf, size_t len)
{
	int n = snprintf(buf, len, "--gpu-batch-size %d --num-gpu-batches %d --percent %g %g %g %g %g %g",
			 p->gpu_batch_size, p->num_gpu_batches, p->w_gpu_percent, p->w_cpu_percent,
			 p->cache_gpu_percent, p->cache_cpu_percent, p->act_gpu_percent,
			 p->act_cpu_percent);
	if (n > 0 && (size_t)n < len && !p->overlap)
		n += snprintf(buf + n, len - (size_t)n, " --no-overlap");
	if (n > 0 && (size_t)n < len && p->cpu_cache_compute)
		n += snprintf(buf + n, len - (size_t)n, " --cpu-cache-compute");
	if (n > 0 && (size_t)n < len && p->compress_cache)
		n += snprintf(buf + n, len - (size_t)n, " --compress-cache");
	if (n > 0 && (size_t)n < len && p->compress_weight)
		n += snprintf(buf + n, len - (size_t)n, " --compress-weight");
	if (n > 0 && (size_t)n < len && p->hh_ratio > 0)
		n += snprintf(buf + n, len - (size_t)n, " --hh-ratio %g --recent-ratio %g", p->hh_ratio,
			      sl_policy_recent_ratio(p));
	if (n > 0 && (size_t)n < len && !p->sep_layer)
		snprintf(buf + n, len - (size_t)n, " (sep_layer false)");
}

int policy_auto(common_opts *o, const sl_model_config *cfg, const char *backend, int prompt_len,
		int gen_len, int max_batch, bool quiet, sl_profile *prof)
{
	bool have;
	int rc = cli_profile(o, cfg, backend, true, prof, &have);
	if (rc < 0)
		return rc;
	if (rc == SL_PROFILE_NOT_CACHED && !quiet)
		fprintf(stderr, "sluice: the profile was measured but not cached: %s\n", sl_errmsg());
	const bool cpu = !strcmp(backend, "cpu");
	const size_t mem = default_mem_budget();
	sl_search_params sp = { .prompt_len = prompt_len, .gen_len = gen_len, .kv_f32 = o->kv_f32,
				.max_batch = max_batch, .margin = o->margin };
	/* budgets: those given; else on the CPU backend the machine's memory
	 * for its device tier, on CUDA the GPU's (the search's default); the
	 * host the machine's memory; the disk the offload folder's free space */
	sp.budget.device = o->gpu_mem ? o->gpu_mem : cpu ? mem : 0;
	sp.budget.host = o->cpu_mem ? o->cpu_mem : mem;
	sp.disk = o->offload_dir != NULL;
	if (sp.disk && (rc = dir_free_bytes(o->offload_dir, &sp.budget.disk)) < 0)
		return rc;
	if (sp.disk && !sp.budget.disk)
		return sl_err(SL_EINVAL, "--offload-dir %s: no free space (or not a folder)", o->offload_dir);
	if (o->hh_given) {
		sp.h2o = SL_H2O_FIXED;
		sp.h2o_ratio = o->policy.hh_ratio;
	}
	sp.nfix = o->nfix;
	for (int i = 0; i < o->nfix; i++)
		sp.fix[i] = o->fix[i];
	sl_choice best;
	int nbest = 0;
	sl_search_stats st;
	SL_TRY(sl_search(cfg, prof, &sp, &best, 1, &nbest, &st));
	if (nbest < 1)
		return sl_err(SL_EBUDGET, "--policy auto: no policy fits the budgets");
	o->policy = best.pol;
	o->policy_given = true;
	/* a zstd store for the chosen placement is read in place of the plain
	 * one, with frame buffers of its own in the host tier: search again
	 * counting them (and its reads), so that the job admits the choice */
	SL_TRY(find_zstd_store(o));
	if (o->w_zstd > 0) {
		sp.w_zstd = o->w_zstd;
		SL_TRY(sl_search(cfg, prof, &sp, &best, 1, &nbest, &st));
		if (nbest < 1)
			return sl_err(SL_EBUDGET, "--policy auto: no policy fits the budgets with the zstd store's buffers");
		o->policy = best.pol;
	}
	if (!quiet) {
		char flags[256];
		policy_flags(&best.pol, flags, sizeof flags);
		fprintf(stderr, "sluice: policy auto: %s: predicted %.3g tok/s (prompt %d, gen %d; %ld candidates; profile %s)\n",
			flags, best.cost.tok_s, prompt_len, gen_len, st.evaluated, o->profile_src);
		if (!sl_policy_equal(&st.fastest.pol, &best.pol)) {
			policy_flags(&st.fastest.pol, flags, sizeof flags);
			fprintf(stderr, "sluice: policy auto: the fastest prediction, %s, %.3g tok/s, leads by %.2f%%: within --margin %g, the simpler policy above runs\n",
				flags, st.fastest.cost.tok_s, (st.fastest.cost.tok_s / best.cost.tok_s - 1) * 100,
				sp.margin);
		}
	}
	return 0;
}
