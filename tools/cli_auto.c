/*
 * cli_auto.c - the cost model on the command line: the profile a run
 * predicts with, and the prediction of a run (bench, and the --stats of
 * generate and score).
 */
#include "cli.h"
#include "cost.h"

#include <stdio.h>
#include <string.h>

int cli_profile(const common_opts *o, const char *backend, sl_profile *prof, bool *have)
{
	*have = false;
	if (o->profile_path) {
		if (strcmp(o->profile.backend, backend))
			return sl_err(SL_EINVAL,
				      "%s: a profile of the %s backend; this run is on %s (sluice profile --backend %s --json FILE measures one)",
				      o->profile_path, o->profile.backend, backend, backend);
		*prof = o->profile;
		*have = true;
	}
	return 0;
}

int predict_run(const sl_opt_config *cfg, const sl_plan_params *pp, bool dev_is_host,
		const sl_profile *prof, int prompt_len, int gen_len, sl_cost *out)
{
	sl_plan pl;
	SL_TRY(sl_plan_make(cfg, pp, dev_is_host, &pl));
	return sl_cost_eval(cfg, &pl, prof, prompt_len, gen_len, out);
}
