/*
 * cmd_policy.c - `sluice policy`: the policy with the most predicted
 * tokens/s for a workload under the budgets (runtime/search.h over the cost
 * model, runtime/cost.h), written as a policy file with its prediction; or,
 * with --evaluate, one given policy predicted without searching.
 *
 * The model is not opened: its shapes come from its config (model_config).
 * Only --calibration runs it, to score the user's texts at a ladder of H2O
 * budgets.  Everything the user gives is checked before the profile is
 * measured or the model runs.
 */
#include "cli.h"
#include "cost.h"
#include "jsonl.h"
#include "profile_measure.h"
#include "score.h"
#include "search.h"
#include "sl_json.h"
#include "weights.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char policy_help[] =
	"usage: sluice policy (--model DIR | --dummy NAME) (--prompt-len P --gen-len G | --prompts FILE)\n"
	"          [--gpu-mem B] [--cpu-mem B] [--disk-mem B] [--offload-dir DIR] [--backend B] [--threads N] [--kv-dtype T] [--cpu-gemm G] [--profile FILE]\n"
	"          [--hh-ratio H | --min-kv-budget F | --calibration FILE --max-ppl-increase X] [--fix FIELD=VALUE]... [--allow-compress] [--zstd-store] [--margin F] [--top N] [--json] (--out POLICY.json | --evaluate POLICY.json)\n"
"The policy with the most predicted tokens/s for a workload under the budgets:\n"
	"batching, placement of weights, KV cache and activations, overlap, sep_layer,\n"
	"cpu_cache_compute and (where allowed) the H2O budget.  Written to --out as a\n"
	"policy file with a \"predicted\" object (docs/policy.md); a summary on stderr.\n"
	"The model is not opened (its shapes only), except to score --calibration.\n"
	"  --model DIR, --dummy NAME  the model (its config.json, or a named shape)\n"
	"  --prompt-len P, --gen-len G  the workload: prompt and new tokens per sequence\n"
	"  --prompts FILE       the workload of a job's input (as generate reads it): P its\n"
	"                       longest prompt, G its largest max_new_tokens (lines without\n"
	"                       one: --gen-len, default 32)\n"
	"  --gpu-mem BYTES      device budget (default: the GPU's memory on CUDA, the\n"
	"                       machine's MemTotal on the CPU backend)\n"
	"  --cpu-mem BYTES      host budget (default: the machine's MemTotal)\n"
	"  --offload-dir DIR    the disk tier's folder; without it nothing goes to disk\n"
	"  --disk-mem BYTES     disk budget (default: the free space in --offload-dir)\n"
	"  --backend B          the backend to plan for: cpu, cuda or auto (default: cuda\n"
	"                       where a GPU is found); a --profile's backend must match\n"
	"  --threads N          CPU threads, 1 to the cores available (default: all cores)\n"
	"  --kv-dtype f16|f32   KV cache precision (default f16)\n"
	"  --cpu-gemm G         the CPU backend's GEMM the jobs will run (sluice, openblas,\n"
	"                       amx, bf16; default sluice): the profile's rates are of it\n"
	"  --profile FILE       the machine's rates (sluice profile --json FILE); default:\n"
	"                       measured once (half a minute on 2 CPU cores) and cached\n"
	"                       in --offload-dir or $XDG_CACHE_HOME/sluice while the\n"
	"                       machine and build match\n"
	"  --hh-ratio H         allow H2O at H heavy hitters and H recent (0 < H <= 0.5)\n"
	"  --min-kv-budget F    allow H2O at any cache budget of at least F of the prompt\n"
	"                       (half heavy, half recent; 0 < F <= 1)\n"
	"  --calibration FILE   score FILE's texts (JSON Lines as sluice score reads) dense and\n"
	"                       at H2O cache budgets of 50, 40, 30, 20, 10 and 5% of the prompt\n"
	"                       (half heavy, half recent), placed as the best dense policy for\n"
	"                       its texts under the budgets (none fits: all in the device\n"
	"                       tier, no caps); search with the smallest budget whose\n"
	"                       perplexity is at most dense x (1 + X); prints the ladder\n"
	"  --max-ppl-increase X  that bound X, 0 or more (e.g. 0.05: 5%); with --calibration\n"
	"                       (without any of these three: a dense KV cache)\n"
	"  --fix FIELD=VALUE    pin a policy field (repeatable); the search chooses the rest\n"
	"  --allow-compress     the search may also choose a 4-bit compressed KV cache\n"
	"                       (compress_cache; not with --kv-dtype f32) and 4-bit\n"
	"                       weights (compress_weight)\n"
	"  --zstd-store         predict the weights' disk share read from a zstd store\n"
	"                       (sluice convert --zstd) at the profile's measured frame\n"
	"                       ratio and decompression rate; without it a plain store,\n"
	"                       and where the choice puts weights on disk the summary\n"
	"                       says what a zstd store would predict\n"
	"  --margin F           among candidates predicted within F of the fastest, take\n"
	"                       the simplest: the fewest bytes on the disk, then the\n"
	"                       fewest micro-batches, then the fewest parts (tiers of\n"
	"                       the weights and of the cache, activations off the\n"
	"                       device, switches off their defaults) (0 to 0.5; default\n"
	"                       0.01; 0: the fastest prediction, however small its lead)\n"
	"  --top N              also print the first N candidates in the search's order\n"
	"                       (those within --margin first, the simplest first; then by\n"
	"                       tok/s) as a table (1 to 100)\n"
	"  --json               one JSON object on stdout (the choice, its prediction, the\n"
	"                       top list and the calibration ladder where asked)\n"
	"  --out POLICY.json    where to write the policy (required unless --evaluate;\n"
	"                       written whole or not at all, its folder checked first)\n"
	"  --evaluate POLICY.json  predict this policy instead of searching: tokens/s, each\n"
	"                       phase's time and resources' busy time, peak bytes per tier\n"
	"                       and whether it fits the budgets; not fitting is an answer\n"
	"                       (exit 0, \"fits\": false), not an error\n" EXIT_HELP;

enum { P_PROMPTS = 1200, P_DISK_MEM, P_PROFILE, P_HH, P_MIN_KV, P_CALIB, P_MAX_PPL, P_FIX, P_TOP,
       P_EVALUATE, P_ALLOW_COMPRESS, P_ZSTD_STORE };

/* The H2O budgets the calibration tries, as a share of the prompt (0: dense). */
static const double ladder_budget[] = { 0, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05 };
#define NLADDER ((int)SL_ARRAY_LEN(ladder_budget))

typedef struct policy_cli {
	common_opts co;
	int prompt_len, gen_len; /* 0: not given */
	const char *prompts, *profile, *calib, *out, *evaluate;
	size_t disk_mem;
	double hh, min_kv, max_ppl; /* < 0: not given */
	int top;
	bool json;
	bool allow_compress;
	bool zstd_store;
	int nfix;
	const char *fix[SL_SEARCH_MAX_FIX];
} policy_cli;

/* What the calibration measured. */
typedef struct ladder {
	double ppl[NLADDER];
	int chosen; /* index into ladder_budget */
	long tokens;
	bool capped;    /* scored under the budgets, placed as pol */
	sl_policy pol;
} ladder;

static void parse_args(int argc, char **argv, policy_cli *o)
{
	static const struct option opts[] = {
		{ "model", required_argument, 0, 'm' },
		{ "dummy", required_argument, 0, OPT_DUMMY },
		{ "backend", required_argument, 0, OPT_BACKEND },
		{ "threads", required_argument, 0, OPT_THREADS },
		{ "gpu-mem", required_argument, 0, OPT_GPU_MEM },
		{ "cpu-mem", required_argument, 0, OPT_CPU_MEM },
		{ "kv-dtype", required_argument, 0, OPT_KV_DTYPE },
		{ "cpu-gemm", required_argument, 0, OPT_CPU_GEMM },
		{ "offload-dir", required_argument, 0, OPT_OFFLOAD_DIR },
		{ "prompt-len", required_argument, 0, OPT_PROMPT_LEN },
		{ "gen-len", required_argument, 0, OPT_GEN_LEN },
		{ "prompts", required_argument, 0, P_PROMPTS },
		{ "disk-mem", required_argument, 0, P_DISK_MEM },
		{ "profile", required_argument, 0, P_PROFILE },
		{ "hh-ratio", required_argument, 0, P_HH },
		{ "min-kv-budget", required_argument, 0, P_MIN_KV },
		{ "calibration", required_argument, 0, P_CALIB },
		{ "max-ppl-increase", required_argument, 0, P_MAX_PPL },
		{ "fix", required_argument, 0, P_FIX },
		{ "top", required_argument, 0, P_TOP },
		{ "json", no_argument, 0, OPT_JSON },
		{ "out", required_argument, 0, 'o' },
		{ "evaluate", required_argument, 0, P_EVALUATE },
		{ "allow-compress", no_argument, 0, P_ALLOW_COMPRESS },
		{ "zstd-store", no_argument, 0, P_ZSTD_STORE },
		{ "margin", required_argument, 0, OPT_MARGIN },
		{ "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	const char *cmd = "policy";
	int c;
	while ((c = getopt_long(argc, argv, ":m:o:h", opts, NULL)) != -1) {
		if (c != OPT_PROMPT_LEN && c != OPT_GEN_LEN && common_opt(cmd, c, &o->co))
			continue;
		switch (c) {
		case OPT_PROMPT_LEN: o->prompt_len = parse_int(cmd, "--prompt-len", optarg, 1, 1 << 20); break;
		case OPT_GEN_LEN: o->gen_len = parse_int(cmd, "--gen-len", optarg, 1, 1 << 20); break;
		case P_PROMPTS: o->prompts = optarg; break;
		case P_DISK_MEM: o->disk_mem = parse_budget(cmd, "--disk-mem", optarg); break;
		case P_PROFILE: o->profile = optarg; break;
		case P_HH: o->hh = parse_real(cmd, "--hh-ratio", optarg, 0, true, 0.5); break;
		case P_MIN_KV: o->min_kv = parse_real(cmd, "--min-kv-budget", optarg, 0, true, 1); break;
		case P_CALIB: o->calib = optarg; break;
		case P_MAX_PPL: o->max_ppl = parse_real(cmd, "--max-ppl-increase", optarg, 0, false, 1e6); break;
		case P_FIX: {
			if (o->nfix == SL_SEARCH_MAX_FIX)
				usage_error(cmd, "at most %s --fix options", "32");
			const char *eq = strchr(optarg, '=');
			if (!eq || eq == optarg)
				usage_error(cmd, "--fix takes FIELD=VALUE (a policy field, docs/policy.md), got '%s'",
					    optarg);
			/* the search checks it too; here it is refused before any work */
			char field[64];
			snprintf(field, sizeof field, "%.*s", (int)SL_MIN((size_t)(eq - optarg), sizeof field - 1),
				 optarg);
			sl_policy scratch;
			sl_policy_default(&scratch);
			if (sl_policy_set(&scratch, field, eq + 1) < 0) {
				char msg[600];
				snprintf(msg, sizeof msg, "--fix %s", sl_errmsg());
				usage_error(cmd, "%s", msg);
			}
			o->fix[o->nfix++] = optarg;
			break;
		}
		case P_TOP: o->top = parse_int(cmd, "--top", optarg, 1, 100); break;
		case OPT_JSON: o->json = true; break;
		case 'o': o->out = optarg; break;
		case P_EVALUATE: o->evaluate = optarg; break;
		case P_ALLOW_COMPRESS: o->allow_compress = true; break;
		case P_ZSTD_STORE: o->zstd_store = true; break;
		case 'h': fputs(policy_help, stdout); exit(0);
		default: bad_option(cmd, c, argv);
		}
	}
	if (optind < argc)
		usage_error(cmd, "unexpected argument '%s'", argv[optind]);
}

/* The command line on its own, before anything is read. */
static void check_args(const policy_cli *o)
{
	const char *cmd = "policy";
	if (!!o->co.model_dir == !!o->co.dummy)
		usage_error(cmd, "%sgive exactly one of --model DIR and --dummy NAME", "");
	if (o->prompts && o->prompt_len)
		usage_error(cmd, "%sgive --prompts FILE or --prompt-len P, not both (the file's longest prompt is P)", "");
	if (!o->prompts && (!o->prompt_len || !o->gen_len))
		usage_error(cmd, "%sthe workload: give --prompt-len P and --gen-len G, or --prompts FILE", "");
	int h2o = (o->hh > 0) + (o->min_kv > 0) + (o->calib || o->max_ppl >= 0);
	if (h2o > 1)
		usage_error(cmd, "%s--hh-ratio, --min-kv-budget and --calibration exclude each other", "");
	if (!!o->calib != (o->max_ppl >= 0))
		usage_error(cmd, "%s--calibration FILE and --max-ppl-increase X go together", "");
	if (o->disk_mem && !o->co.offload_dir)
		usage_error(cmd, "%s--disk-mem needs --offload-dir (without it nothing goes to disk)", "");
	if (o->zstd_store && !o->co.offload_dir)
		usage_error(cmd, "%s--zstd-store needs --offload-dir (without it no weights go to disk)", "");
	if (o->evaluate) {
		if (o->out)
			usage_error(cmd, "%s--evaluate predicts a policy and writes none: drop --out", "");
		if (h2o || o->nfix || o->top || o->co.margin_given)
			usage_error(cmd, "%s--evaluate takes the policy as it is: --hh-ratio, --min-kv-budget, --calibration, --fix, --margin and --top are for the search", "");
	} else if (!o->out) {
		usage_error(cmd, "%s--out POLICY.json is required (or --evaluate POLICY.json)", "");
	}
}

/* ---- the workload -------------------------------------------------------- */

/* P and G from a job's input: its longest prompt, its largest
 * max_new_tokens (default_new where a line has none). */
static int workload_of_file(const char *path, const sl_model_config *cfg, const sl_tokenizer *tok,
			    int default_new, int *plen, int *glen)
{
	sl_read_opts ro = { .vocab = cfg->vocab, .tok = tok };
	sl_prompts ps = { 0 };
	SL_TRY(sl_prompts_read(path, &ro, &ps));
	const char *name = strcmp(path, "-") ? path : "<stdin>";
	int rc = 0;
	if (ps.n == 0) {
		rc = sl_err(SL_EFORMAT, "%s: no prompts (one JSON object per line, as sluice generate reads)",
			    name);
		goto out;
	}
	*plen = *glen = 0;
	for (int i = 0; i < ps.n; i++) {
		const sl_prompt *p = &ps.p[i];
		const int g = p->max_new ? p->max_new : default_new;
		if (p->n + g > cfg->max_pos) {
			rc = sl_err(SL_ERANGE,
				    "%s:%d: prompt of %d tokens plus %d new tokens exceeds the model's %d positions",
				    name, p->line, p->n, g, cfg->max_pos);
			goto out;
		}
		*plen = SL_MAX(*plen, p->n);
		*glen = SL_MAX(*glen, g);
	}
	if (*plen + *glen > cfg->max_pos)
		rc = sl_err(SL_ERANGE,
			    "%s: its longest prompt (%d tokens) plus its most new tokens (%d) exceeds the model's %d positions",
			    name, *plen, *glen, cfg->max_pos);
out:
	sl_prompts_free(&ps);
	return rc;
}

static int load_tokenizer(const common_opts *co, sl_tokenizer **tok)
{
	*tok = NULL;
	if (!co->model_dir)
		return 0;
	return sl_tokenizer_present(co->model_dir) ? sl_tokenizer_load(co->model_dir, tok) : 0;
}

/* ---- the calibration ----------------------------------------------------- */

typedef struct profile_src {
	sl_profile p;
	const char *source; /* the file, "measured" or "cached" */
} profile_src;

typedef struct ctx {
	const policy_cli *o;
	sl_model_config cfg;
	profile_src prof;
	sl_search_params sp;
} ctx;

/* The calibration texts: read and checked before anything runs. */
static int read_calibration(const char *path, const sl_model_config *cfg, const sl_tokenizer *tok,
			    sl_prompts *ps)
{
	sl_read_opts ro = { .vocab = cfg->vocab, .tok = tok, .score = true };
	SL_TRY(sl_prompts_read(path, &ro, ps));
	if (ps->n == 0)
		return sl_err(SL_EFORMAT,
			      "%s: no lines to score (a calibration file holds JSON Lines of a prompt and a continuation, as sluice score reads)",
			      path);
	for (int i = 0; i < ps->n; i++) {
		const sl_prompt *p = &ps->p[i];
		if (p->n + p->ncont > cfg->max_pos)
			return sl_err(SL_ERANGE,
				      "%s:%d: prompt of %d tokens plus %d continuation tokens exceeds the model's %d positions",
				      path, p->line, p->n, p->ncont, cfg->max_pos);
	}
	return 0;
}

enum { CALIB_BLOCK = 8 }; /* sequences scored at once */

/* The calibration texts' shapes: sequences at once, the longest prompt,
 * the longest continuation, the most tokens of one text. */
static void calib_shape(const sl_prompts *ps, int *nb, int *max_prompt, int *max_cont, int *max_len)
{
	*max_prompt = *max_cont = *max_len = 1;
	for (int i = 0; i < ps->n; i++) {
		*max_prompt = SL_MAX(*max_prompt, ps->p[i].n);
		*max_cont = SL_MAX(*max_cont, ps->p[i].ncont);
		*max_len = SL_MAX(*max_len, ps->p[i].n + ps->p[i].ncont);
	}
	*nb = SL_MIN(CALIB_BLOCK, ps->n);
}

/* Perplexity of every continuation in ps together under an H2O budget of
 * `budget` of the prompt (0: dense): exp(-sum of log-probs / tokens). */
static int score_at(sl_backend *be, const policy_cli *o, const sl_plan_params *base,
		    const sl_prompts *ps, double budget, double *ppl, long *tokens)
{
	int nb, max_prompt, max_cont, max_len;
	calib_shape(ps, &nb, &max_prompt, &max_cont, &max_len);
	sl_plan_params pp = *base;
	pp.hh = pp.rr = budget / 2;
	const sl_model_params mp = { .dir = o->co.model_dir, .dummy = o->co.dummy,
				     .offload_dir = o->co.offload_dir, .plan = &pp };
	sl_model *m = NULL;
	sl_scorer *sc = NULL;
	sl_score_seq seqs[CALIB_BLOCK];
	double *lp = malloc(sizeof(double) * (size_t)nb * max_cont);
	int rc = lp ? 0 : sl_err(SL_ENOMEM, "out of memory");
	if (rc == 0)
		rc = sl_model_open_ex(be, &mp, &m);
	if (rc == 0)
		rc = sl_scorer_create(m, nb, max_len, max_prompt, &sc);
	double sum = 0;
	long n = 0;
	for (int b = 0; rc == 0 && b < ps->n; b += nb) {
		const int ns = SL_MIN(nb, ps->n - b);
		for (int k = 0; k < ns; k++) {
			const sl_prompt *p = &ps->p[b + k];
			seqs[k] = (sl_score_seq){ .prompt = p->ids, .prompt_len = p->n, .cont = p->cont,
						  .cont_len = p->ncont, .line = p->line, .id = p->id_json,
						  .logprobs = lp + (size_t)k * max_cont };
		}
		if ((rc = sl_scorer_run(sc, seqs, ns, NULL)) < 0)
			break;
		for (int k = 0; k < ns; k++) {
			for (int t = 0; t < seqs[k].cont_len; t++)
				sum += seqs[k].logprobs[t];
			n += seqs[k].cont_len;
		}
	}
	sl_scorer_free(sc);
	sl_model_free(m);
	free(lp);
	*ppl = exp(-sum / (double)(n ? n : 1));
	*tokens = n;
	return rc;
}

/*
 * Where the calibration runs the model: the best dense policy for the
 * texts' shapes (a block of them, prompt plus continuation) under the
 * budgets, which its H2O rungs fit too (their caches are smaller); where
 * none fits, everything in the device tier without caps.  *capped: the
 * budgets apply.
 */
static sl_plan_params calib_plan(const ctx *x, const sl_prompts *ps, bool *capped, sl_policy *pol)
{
	int nb, max_prompt, max_cont, max_len;
	calib_shape(ps, &nb, &max_prompt, &max_cont, &max_len);
	char gbs[32];
	snprintf(gbs, sizeof gbs, "gpu_batch_size=%d", nb);
	sl_search_params csp = x->sp;
	csp.prompt_len = max_prompt;
	csp.gen_len = max_len - max_prompt; /* at least 1: every text has a continuation */
	csp.rows_per_seq = max_len;
	csp.h2o = SL_H2O_DENSE;
	csp.nfix = 2;
	csp.fix[0] = gbs;
	csp.fix[1] = "num_gpu_batches=1";
	sl_choice ch;
	int n = 0;
	sl_search_stats st;
	*capped = sl_search(&x->cfg, &x->prof.p, &csp, &ch, 1, &n, &st) == 0 && n == 1;
	if (*capped) {
		*pol = ch.pol;
		return sl_search_plan_params(&ch.pol, &csp);
	}
	sl_err_clear();
	sl_plan_params pp = sl_plan_defaults();
	pp.kv_f32 = x->sp.kv_f32;
	pp.max_seq = nb;
	pp.max_prompt = max_prompt;
	pp.max_len = max_len;
	return pp;
}

/* Score the texts at every rung; keep the smallest budget whose
 * perplexity is within max_ppl of dense. */
static int calibrate(const ctx *x, const sl_prompts *ps, ladder *ld)
{
	const policy_cli *o = x->o;
	const sl_plan_params base = calib_plan(x, ps, &ld->capped, &ld->pol);
	common_opts co = o->co;
	if (!ld->capped)
		co.gpu_mem = co.cpu_mem = 0;
	sl_backend *be = NULL;
	int rc = make_backend(&co, &be);
	ld->chosen = 0;
	for (int i = 0; rc == 0 && i < NLADDER; i++) {
		rc = score_at(be, o, &base, ps, ladder_budget[i], &ld->ppl[i], &ld->tokens);
		if (rc == 0 && i > 0 && isfinite(ld->ppl[i]) && isfinite(ld->ppl[0]) &&
		    ld->ppl[i] <= ld->ppl[0] * (1 + o->max_ppl))
			ld->chosen = i; /* the ladder descends: the last within the bound */
	}
	sl_backend_free(be);
	if (rc < 0)
		sl_err_prefix(rc, "%s: scoring the calibration texts", o->calib);
	return rc;
}

static void policy_line(const sl_policy *p, FILE *f);

static void print_ladder(const policy_cli *o, const ladder *ld)
{
	fprintf(stderr, "calibration %s: %ld tokens scored, ", o->calib, ld->tokens);
	if (ld->capped) {
		fputs("placed as ", stderr);
		policy_line(&ld->pol, stderr); /* ends the line */
	} else {
		fputs("in the device tier without caps (no dense policy fits the budgets)\n", stderr);
	}
	fprintf(stderr, "  perplexity within %g%% of dense:\n", o->max_ppl * 100);
	fprintf(stderr, "  %-8s %12s %10s\n", "budget", "perplexity", "increase");
	for (int i = 0; i < NLADDER; i++) {
		char b[16];
		if (i == 0)
			snprintf(b, sizeof b, "dense");
		else
			snprintf(b, sizeof b, "%g%%", ladder_budget[i] * 100);
		fprintf(stderr, "  %-8s %12.4f %+9.2f%%%s\n", b, ld->ppl[i],
			(ld->ppl[i] / ld->ppl[0] - 1) * 100, i == ld->chosen ? "  <- chosen" : "");
	}
}

static json_t *policy_json(const sl_policy *p);

static json_t *ladder_json(const policy_cli *o, const ladder *ld, sl_jerr *e)
{
	json_t *j = json_object(), *arr = json_array();
	sl_jset(j, "file", json_string(o->calib), e);
	sl_jset_real(j, "max_ppl_increase", o->max_ppl, e);
	sl_jset(j, "tokens", json_integer(ld->tokens), e);
	for (int i = 0; i < NLADDER; i++) {
		json_t *r = json_object();
		sl_jset(r, "budget", i ? json_real(ladder_budget[i]) : json_null(), e);
		sl_jset(r, "perplexity", isfinite(ld->ppl[i]) ? json_real(ld->ppl[i]) : json_null(), e);
		const double inc = ld->ppl[i] / ld->ppl[0] - 1;
		sl_jset(r, "increase", isfinite(inc) ? json_real(inc) : json_null(), e);
		sl_jappend(arr, r, "ladder", e);
	}
	sl_jset(j, "ladder", arr, e);
	sl_jset(j, "chosen_budget", ld->chosen ? json_real(ladder_budget[ld->chosen]) : json_null(), e);
	sl_jset(j, "placement", ld->capped ? policy_json(&ld->pol) : json_null(), e);
	return j;
}

/* ---- budgets and the profile --------------------------------------------- */

static int get_profile(const policy_cli *o, const sl_model_config *cfg, profile_src *ps)
{
	if (o->profile) {
		SL_TRY(sl_profile_load(o->profile, &ps->p));
		ps->source = o->profile;
		if (strcmp(o->co.backend, "auto") && strcmp(o->co.backend, ps->p.backend))
			return sl_err(SL_EINVAL, "%s: measured the %s backend, and --backend asks for %s",
				      o->profile, ps->p.backend, o->co.backend);
		return profile_gemm_matches(o->profile, &ps->p, ps->p.backend, o->co.cpu_gemm);
	}
	sl_profile_opts po = { .backend = o->co.backend, .offload_dir = o->co.offload_dir,
			       .threads = o->co.threads, .cpu_gemm = o->co.cpu_gemm };
	SL_TRY(sl_cost_profile_shapes(&po, cfg)); /* the model's own GEMMs */
	if (o->co.threads > 0)
		omp_set_num_threads(o->co.threads);
	/* measured once per machine and build, cached in the offload folder
	 * (or $XDG_CACHE_HOME/sluice) */
	bool measured = false;
	computing = true; /* a failure now is the machine's */
	int rc = sl_profile_obtain(&po, NULL, &ps->p, &measured);
	computing = false;
	if (rc == SL_PROFILE_NOT_CACHED) {
		fprintf(stderr, "sluice policy: the profile was measured but not cached: %s\n", sl_errmsg());
		rc = 0;
	}
	ps->source = measured ? "measured" : "cached";
	return rc;
}

/* ---- printing ------------------------------------------------------------ */

static const char *tier_name[3] = { "device", "host", "disk" };

static size_t tier_of(const sl_tier_bytes *t, int i)
{
	return i == 0 ? t->device : i == 1 ? t->host : t->disk;
}

static const char *fmt_b(size_t n, char *buf, size_t len)
{
	if (n == 0)
		snprintf(buf, len, "0");
	else
		fmt_bytes(n, buf, len);
	return buf;
}

/* The policy on one line. */
static void policy_line(const sl_policy *p, FILE *f)
{
	fprintf(f, "%d x %d sequences; weights %g/%g/%g%%, cache %g/%g/%g%% (device/host/disk); "
		"activations %s; overlap %s, sep_layer %s, cpu_cache_compute %s; ",
		p->gpu_batch_size, p->num_gpu_batches, p->w_gpu_percent, p->w_cpu_percent,
		100 - p->w_gpu_percent - p->w_cpu_percent, p->cache_gpu_percent, p->cache_cpu_percent,
		100 - p->cache_gpu_percent - p->cache_cpu_percent,
		p->act_cpu_percent >= 100 ? "host" : "device", p->overlap ? "on" : "off",
		p->sep_layer ? "on" : "off", p->cpu_cache_compute ? "on" : "off");
	if (p->hh_ratio > 0 || p->recent_ratio > 0)
		fprintf(f, "H2O %g heavy + %g recent\n", p->hh_ratio, sl_policy_recent_ratio(p));
	else
		fputs("dense KV cache\n", f);
}

static void print_peaks(const sl_tier_bytes *peak, const sl_budgets *b, bool disk, FILE *f)
{
	char x[32], y[32];
	fputs("peak     ", f);
	for (int i = 0; i < 3; i++) {
		const size_t cap = i == 0 ? b->device : i == 1 ? b->host : b->disk;
		fprintf(f, "%s%s %s of ", i ? ", " : "", tier_name[i], fmt_b(tier_of(peak, i), x, sizeof x));
		if (i == 2 && !disk)
			fputs("none (no --offload-dir)", f);
		else if (cap)
			fputs(fmt_b(cap, y, sizeof y), f);
		else
			fputs("no cap", f);
	}
	fputc('\n', f);
}

/* A policy's fields for the --top table. */
typedef struct col {
	const char *head;
	size_t off;
	char type; /* 'i' int, 'd' double, 'b' bool */
} col;

#define COL(h, m, t) { h, offsetof(sl_policy, m), t }
static const col cols[] = {
	COL("gbs", gpu_batch_size, 'i'),       COL("ngb", num_gpu_batches, 'i'),
	COL("w_gpu", w_gpu_percent, 'd'),      COL("w_cpu", w_cpu_percent, 'd'),
	COL("c_gpu", cache_gpu_percent, 'd'),  COL("c_cpu", cache_cpu_percent, 'd'),
	COL("a_cpu", act_cpu_percent, 'd'),    COL("overlap", overlap, 'b'),
	COL("sep", sep_layer, 'b'),            COL("ccc", cpu_cache_compute, 'b'),
	COL("hh", hh_ratio, 'd'),              COL("recent", recent_ratio, 'd'),
};

static double col_value(const sl_policy *p, const col *c)
{
	const char *base = (const char *)p + c->off;
	return c->type == 'i' ? *(const int *)base : c->type == 'b' ? *(const bool *)base
								  : *(const double *)base;
}

static void print_top(const sl_choice *best, int n, FILE *f)
{
	bool varies[SL_ARRAY_LEN(cols)];
	fprintf(f, "%-3s", "#");
	for (size_t k = 0; k < SL_ARRAY_LEN(cols); k++) {
		varies[k] = false;
		for (int i = 1; i < n; i++)
			varies[k] |= col_value(&best[i].pol, &cols[k]) != col_value(&best[0].pol, &cols[k]);
		if (varies[k])
			fprintf(f, " %7s", cols[k].head);
	}
	fprintf(f, " %10s %9s %9s %9s\n", "tok/s", "device", "host", "disk");
	for (int i = 0; i < n; i++) {
		char a[32], b[32], c[32];
		fprintf(f, "%-3d", i + 1);
		for (size_t k = 0; k < SL_ARRAY_LEN(cols); k++)
			if (varies[k])
				fprintf(f, " %7g", col_value(&best[i].pol, &cols[k]));
		fprintf(f, " %10.2f %9s %9s %9s\n", best[i].cost.tok_s,
			fmt_b(best[i].cost.peak.device, a, sizeof a), fmt_b(best[i].cost.peak.host, b, sizeof b),
			fmt_b(best[i].cost.peak.disk, c, sizeof c));
	}
}

/* ---- JSON ---------------------------------------------------------------- */

static json_t *policy_json(const sl_policy *p)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (!f)
		return NULL;
	sl_policy_write_json(p, f);
	fclose(f);
	json_t *j = json_loads(buf, 0, NULL);
	free(buf);
	return j;
}

static json_t *tiers_json(const sl_tier_bytes *t, sl_jerr *e)
{
	json_t *j = json_object();
	sl_jset(j, "device", json_integer((json_int_t)t->device), e);
	sl_jset(j, "host", json_integer((json_int_t)t->host), e);
	sl_jset(j, "disk", json_integer((json_int_t)t->disk), e);
	return j;
}

/* A candidate of the search: its policy, predicted tokens/s and peaks. */
static json_t *choice_json(const sl_choice *c, sl_jerr *e)
{
	json_t *j = json_object();
	sl_jset(j, "policy", policy_json(&c->pol), e);
	sl_jset_real(j, "throughput_tok_s", c->cost.tok_s, e);
	sl_jset(j, "peak_bytes", tiers_json(&c->cost.peak, e), e);
	return j;
}

static json_t *budgets_json(const sl_budgets *b, bool disk, sl_jerr *e)
{
	json_t *j = json_object();
	sl_jset(j, "device", b->device ? json_integer((json_int_t)b->device) : json_null(), e);
	sl_jset(j, "host", b->host ? json_integer((json_int_t)b->host) : json_null(), e);
	sl_jset(j, "disk", disk && b->disk ? json_integer((json_int_t)b->disk) : disk ? json_null()
										    : json_integer(0), e);
	return j;
}

static json_t *profile_json(const profile_src *ps, sl_jerr *e)
{
	json_t *j = json_object();
	sl_jset(j, "source", json_string(ps->source), e);
	sl_jset(j, "backend", json_string(ps->p.backend), e);
	sl_jset(j, "build", ps->p.build[0] ? json_string(ps->p.build) : json_null(), e);
	sl_jset(j, "load_average", ps->p.load_average >= 0 ? json_real(ps->p.load_average) : json_null(), e);
	return j;
}

/* The "predicted" object of the policy file (docs/policy.md). */
static json_t *predicted_json(const sl_cost *c, const profile_src *ps, double w_zstd, sl_jerr *e)
{
	json_t *j = json_object();
	sl_jset_real(j, "throughput_tok_s", c->tok_s, e);
	sl_jset_real(j, "prefill_s", c->prefill.seconds, e);
	sl_jset_real(j, "decode_s", c->decode.seconds, e);
	sl_jset(j, "prefill_bottleneck", json_string(sl_res_name[c->prefill.bottleneck]), e);
	sl_jset(j, "decode_bottleneck", json_string(sl_res_name[c->decode.bottleneck]), e);
	sl_jset(j, "peak_bytes", tiers_json(&c->peak, e), e);
	sl_jset(j, "prompt_len", json_integer(c->prompt_len), e);
	sl_jset(j, "gen_len", json_integer(c->gen_len), e);
	sl_jset(j, "zstd_ratio", w_zstd > 0 ? json_real(w_zstd) : json_null(), e);
	sl_jset(j, "profile", profile_json(ps, e), e);
	return j;
}

static json_t *phase_json(const sl_cost_phase *ph, sl_jerr *e)
{
	json_t *j = json_object(), *busy = json_object();
	sl_jset_real(j, "seconds", ph->seconds, e);
	sl_jset(j, "bottleneck", json_string(sl_res_name[ph->bottleneck]), e);
	for (int r = 0; r < SL_NRES; r++)
		sl_jset_real(busy, sl_res_name[r], ph->busy[r], e);
	sl_jset(j, "busy_s", busy, e);
	return j;
}

static int print_json(json_t *j, sl_jerr *e)
{
	SL_TRY(sl_jcheck(e, "policy --json"));
	char *s = json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(10));
	if (!s)
		return sl_err(SL_ENOMEM, "policy --json: out of memory");
	puts(s);
	free(s);
	return fflush(stdout) ? sl_err(SL_EIO, "cannot write standard output: %s", strerror(errno)) : 0;
}

/* ---- the two modes ------------------------------------------------------- */

static void print_header(const ctx *x, FILE *f)
{
	char load[96] = "";
	if (x->prof.p.load_average >= 0)
		snprintf(load, sizeof load, ", measured at load %.2f on %d CPUs%s", x->prof.p.load_average,
			 x->prof.p.topo.pus,
			 x->prof.p.load_average >= 0.5 * x->prof.p.topo.pus ? ": busy, its rates may be low" : "");
	fprintf(f, "model    %s, prompt %d, gen %d, kv %s; profile: %s (backend %s, build %s%s)\n",
		x->cfg.name, x->sp.prompt_len, x->sp.gen_len, x->sp.kv_f32 ? "f32" : "f16",
		x->prof.source, x->prof.p.backend, x->prof.p.build[0] ? x->prof.p.build : "unknown", load);
}

static void print_phases(const sl_cost *c, FILE *f)
{
	fprintf(f, "predicted %.2f tok/s: prefill %.3f s (bound by %s), decode %.3f s (bound by %s)\n",
		c->tok_s, c->prefill.seconds, sl_res_name[c->prefill.bottleneck], c->decode.seconds,
		sl_res_name[c->decode.bottleneck]);
}

/* A policy's prediction with its weights' disk share read from the other
 * kind of store: a zstd store where the search assumed a plain one, a
 * plain one where it assumed zstd (--zstd-store).  False where that makes
 * no difference: no decoder weights on disk, or a profile without the
 * zstd rates. */
typedef struct zstd_cmp {
	bool on;                   /* the comparison applies */
	double ratio;              /* the zstd store's frame ratio */
	double zstd_tok_s, plain_tok_s;
} zstd_cmp;

static zstd_cmp zstd_compare(const ctx *x, const sl_policy *pol, const sl_cost *cost)
{
	zstd_cmp z = { .ratio = x->prof.p.zstd_ratio };
	if (!(x->prof.p.zstd_ratio > 0 && x->prof.p.zstd_gbps > 0))
		return z;
	const sl_plan_params pp = sl_search_plan_params(pol, &x->sp);
	size_t wd, wh, wk;
	sl_weights_layer_split(&x->cfg, pp.w_gpu, pp.w_cpu, pp.w_q4, &wd, &wh, &wk);
	if (wk == 0)
		return z;
	sl_search_params sp = x->sp;
	sp.w_zstd = x->sp.w_zstd > 0 ? 0 : x->prof.p.zstd_ratio;
	sl_choice other;
	int fit;
	if (sl_search_evaluate(&x->cfg, &x->prof.p, &sp, pol, &other, &fit) < 0)
		return z; /* the same plan as the one predicted: not reached */
	z.on = true;
	z.zstd_tok_s = x->sp.w_zstd > 0 ? cost->tok_s : other.cost.tok_s;
	z.plain_tok_s = x->sp.w_zstd > 0 ? other.cost.tok_s : cost->tok_s;
	return z;
}

static void print_zstd(const ctx *x, const zstd_cmp *z, FILE *f)
{
	if (!z->on)
		return;
	const double gain = z->zstd_tok_s / z->plain_tok_s;
	if (x->sp.w_zstd > 0)
		fprintf(f, "zstd     predicted with the weights' disk share in a zstd store (frames at %.3f of the plain bytes, decompressed at %.2f GB/s): write it with sluice convert --zstd and this placement before the job; a plain store would give %.2f tok/s (zstd %.2fx)\n",
			z->ratio, x->prof.p.zstd_gbps, z->plain_tok_s, gain);
	else
		fprintf(f, "zstd     a zstd store of the weights on disk (sluice convert --zstd; frames at %.3f of the plain bytes, decompressed at %.2f GB/s) would give %.2f tok/s, %.2fx: %s\n",
			z->ratio, x->prof.p.zstd_gbps, z->zstd_tok_s, gain,
			gain > 1 ? "it pays (--zstd-store searches with it)" : "it does not pay here");
}

static json_t *zstd_json(const ctx *x, const zstd_cmp *z, sl_jerr *e)
{
	if (!z->on)
		return json_null();
	json_t *j = json_object();
	sl_jset(j, "assumed", json_boolean(x->sp.w_zstd > 0), e);
	sl_jset_real(j, "ratio", z->ratio, e);
	sl_jset_real(j, "zstd_gbps", x->prof.p.zstd_gbps, e);
	sl_jset_real(j, "zstd_throughput_tok_s", z->zstd_tok_s, e);
	sl_jset_real(j, "plain_throughput_tok_s", z->plain_tok_s, e);
	return j;
}

static int evaluate(ctx *x)
{
	const policy_cli *o = x->o;
	sl_policy pol;
	SL_TRY(sl_policy_load(o->evaluate, &pol));
	sl_choice ch;
	int fit = 0;
	SL_TRY(sl_search_evaluate(&x->cfg, &x->prof.p, &x->sp, &pol, &ch, &fit));
	int tier = -1;
	char why[512] = "";
	if (fit < 0) {
		snprintf(why, sizeof why, "%s", sl_errmsg());
		if (sl_cost_fits(&ch.cost.peak, &x->sp.budget, &tier) == 0)
			tier = -1;
	} else if (!x->sp.disk && ch.cost.peak.disk > 0) {
		char b[32];
		tier = 2;
		fit = SL_EBUDGET;
		snprintf(why, sizeof why, "disk: the policy puts %s on disk, and no --offload-dir was given",
			 fmt_b(ch.cost.peak.disk, b, sizeof b));
	}
	const sl_budgets *bud = &x->sp.budget;
	const size_t cap = tier == 0 ? bud->device : tier == 1 ? bud->host : tier == 2 ? bud->disk : 0;
	const size_t need = tier >= 0 ? tier_of(&ch.cost.peak, tier) : 0;
	const zstd_cmp z = zstd_compare(x, &pol, &ch.cost);
	if (o->json) {
		sl_jerr e = { 0 };
		json_t *j = json_object();
		sl_jset(j, "model", json_string(x->cfg.name), &e);
		sl_jset(j, "policy_file", json_string(o->evaluate), &e);
		sl_jset(j, "policy", policy_json(&pol), &e);
		sl_jset(j, "prompt_len", json_integer(x->sp.prompt_len), &e);
		sl_jset(j, "gen_len", json_integer(x->sp.gen_len), &e);
		sl_jset(j, "sequences", json_integer(ch.cost.batch), &e);
		sl_jset_real(j, "throughput_tok_s", ch.cost.tok_s, &e);
		sl_jset_real(j, "prefill_s", ch.cost.prefill.seconds, &e);
		sl_jset_real(j, "decode_s", ch.cost.decode.seconds, &e);
		json_t *ph = json_object();
		sl_jset(ph, "prefill", phase_json(&ch.cost.prefill, &e), &e);
		sl_jset(ph, "decode", phase_json(&ch.cost.decode, &e), &e);
		sl_jset(j, "phases", ph, &e);
		sl_jset(j, "peak_bytes", tiers_json(&ch.cost.peak, &e), &e);
		sl_jset(j, "budget_bytes", budgets_json(bud, x->sp.disk, &e), &e);
		sl_jset(j, "fits", json_boolean(fit == 0), &e);
		if (fit == 0) {
			sl_jset(j, "over", json_null(), &e);
		} else {
			json_t *ov = json_object();
			sl_jset(ov, "tier", tier >= 0 ? json_string(tier_name[tier]) : json_null(), &e);
			sl_jset(ov, "bytes", tier >= 0 ? json_integer((json_int_t)(need - cap)) : json_null(), &e);
			sl_jset(ov, "message", json_string(why), &e);
			sl_jset(j, "over", ov, &e);
		}
		sl_jset(j, "zstd_store", zstd_json(x, &z, &e), &e);
		sl_jset(j, "profile", profile_json(&x->prof, &e), &e);
		int rc = print_json(j, &e);
		json_decref(j);
		return rc;
	}
	FILE *f = stdout;
	print_header(x, f);
	fprintf(f, "policy   %s: ", o->evaluate);
	policy_line(&pol, f);
	print_phases(&ch.cost, f);
	fprintf(f, "%-14s %12s %12s\n", "busy seconds", "prefill", "decode");
	for (int r = 0; r < SL_NRES; r++)
		fprintf(f, "  %-12s %12.4f %12.4f\n", sl_res_name[r], ch.cost.prefill.busy[r],
			ch.cost.decode.busy[r]);
	print_peaks(&ch.cost.peak, bud, x->sp.disk, f);
	print_zstd(x, &z, f);
	if (fit == 0)
		fputs("fits     yes: every tier within its budget\n", f);
	else
		fprintf(f, "fits     NO: %s\n", why);
	return fflush(f) ? sl_err(SL_EIO, "cannot write standard output: %s", strerror(errno)) : 0;
}

static int search(ctx *x, const ladder *ld)
{
	const policy_cli *o = x->o;
	const int cap = SL_MAX(o->top, 1);
	sl_choice *best = calloc((size_t)cap, sizeof *best);
	if (!best)
		return sl_err(SL_ENOMEM, "out of memory");
	int nbest = 0;
	sl_search_stats st;
	const double t0 = sl_now();
	int rc = sl_search(&x->cfg, &x->prof.p, &x->sp, best, cap, &nbest, &st);
	const long evaluated = st.evaluated;
	/* the fastest prediction where the margin took a simpler policy */
	const bool simpler = rc == 0 && nbest > 0 && !sl_policy_equal(&st.fastest.pol, &best[0].pol);
	const double secs = sl_now() - t0;
	if (rc == 0 && nbest < 1)
		rc = sl_err(SL_EBUDGET, "no policy fits the budgets");
	sl_jerr e = { 0 };
	json_t *pred = rc == 0 ? predicted_json(&best[0].cost, &x->prof, x->sp.w_zstd, &e) : NULL;
	char *pred_text = NULL;
	if (rc == 0 && (rc = sl_jcheck(&e, "the prediction")) == 0) {
		pred_text = json_dumps(pred, JSON_REAL_PRECISION(10));
		if (!pred_text)
			rc = sl_err(SL_ENOMEM, "out of memory");
	}
	if (rc == 0)
		rc = sl_policy_save_predicted(o->out, &best[0].pol, pred_text);
	free(pred_text);
	if (rc < 0)
		goto out;

	FILE *f = stderr;
	print_header(x, f);
	fputs("policy   ", f);
	policy_line(&best[0].pol, f);
	print_phases(&best[0].cost, f);
	if (simpler) {
		fprintf(f, "fastest  %.2f tok/s (%.2f%% more, within --margin %g: the policy above is simpler), ",
			st.fastest.cost.tok_s, (st.fastest.cost.tok_s / best[0].cost.tok_s - 1) * 100,
			x->sp.margin);
		policy_line(&st.fastest.pol, f);
	}
	print_peaks(&best[0].cost.peak, &x->sp.budget, x->sp.disk, f);
	const zstd_cmp z = zstd_compare(x, &best[0].pol, &best[0].cost);
	print_zstd(x, &z, f);
	if (o->top) {
		fprintf(f, "the %d best of %ld candidates%s:\n", nbest, evaluated,
			x->sp.margin > 0 ? " (those within --margin of the fastest first, the simplest first)" : "");
		print_top(best, nbest, f);
	}
	fprintf(f, "wrote %s (%ld candidates predicted in %.2f s)\n", o->out, evaluated, secs);
	if (o->json) {
		json_t *j = json_object();
		sl_jset(j, "model", json_string(x->cfg.name), &e);
		sl_jset(j, "policy", policy_json(&best[0].pol), &e);
		sl_jset(j, "predicted", json_incref(pred), &e);
		sl_jset(j, "budget_bytes", budgets_json(&x->sp.budget, x->sp.disk, &e), &e);
		sl_jset(j, "zstd_store", zstd_json(x, &z, &e), &e);
		sl_jset(j, "evaluated", json_integer(evaluated), &e);
		sl_jset_real(j, "margin", x->sp.margin, &e);
		sl_jset(j, "fastest", simpler ? choice_json(&st.fastest, &e) : json_null(), &e);
		sl_jset_real(j, "search_s", secs, &e);
		sl_jset(j, "out", json_string(o->out), &e);
		if (o->top) {
			json_t *arr = json_array();
			for (int i = 0; i < nbest; i++)
				sl_jappend(arr, choice_json(&best[i], &e), "top", &e);
			sl_jset(j, "top", arr, &e);
		}
		if (o->calib)
			sl_jset(j, "calibration", ladder_json(o, ld, &e), &e);
		rc = print_json(j, &e);
		json_decref(j);
	}
out:
	json_decref(pred);
	free(best);
	return rc;
}

/* That the policy can be written at path: its folder exists and takes a
 * file (made and removed), and path is not a folder. */
static int check_out(const char *path)
{
	struct stat st;
	if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
		return sl_err(SL_EINVAL, "%s: is a folder, not a policy file to write", path);
	const char *slash = strrchr(path, '/');
	if (slash && slash != path) {
		char dir[4096];
		snprintf(dir, sizeof dir, "%.*s", (int)SL_MIN((size_t)(slash - path), sizeof dir - 1), path);
		if (stat(dir, &st) || !S_ISDIR(st.st_mode))
			return sl_err(SL_ENOTFOUND, "%s: its folder %s does not exist", path, dir);
	}
	if (sl_profile_check_json_path(path) < 0) {
		char msg[1024];
		snprintf(msg, sizeof msg, "%s", sl_errmsg());
		return sl_err(SL_EINVAL, "%s", msg); /* nothing ran: the command is wrong */
	}
	return 0;
}

int cmd_policy(int argc, char **argv)
{
	policy_cli o = { .hh = -1, .min_kv = -1, .max_ppl = -1 };
	common_init(&o.co);
	o.co.argc = argc;
	o.co.argv = argv;
	parse_args(argc, argv, &o);
	check_args(&o);

	/* everything the user gave, checked before any work: the output's
	 * folder, the offload folder, the model's shapes, the workload, the
	 * calibration texts and the policy to evaluate */
	int rc;
	if (o.out && (rc = check_out(o.out)) < 0)
		die(rc);
	if (o.co.offload_dir && (rc = sl_profile_check_offload_dir(o.co.offload_dir)) < 0)
		die(rc);
	ctx x = { .o = &o };
	if ((rc = model_config(&o.co, &x.cfg)) < 0)
		die(rc);
	sl_tokenizer *tok = NULL;
	if ((o.prompts || o.calib) && (rc = load_tokenizer(&o.co, &tok)) < 0)
		die(rc);
	int plen = o.prompt_len, glen = o.gen_len;
	if (o.prompts) {
		if ((rc = workload_of_file(o.prompts, &x.cfg, tok, o.gen_len ? o.gen_len : 32, &plen,
					   &glen)) < 0)
			die(rc);
	} else if (plen + glen > x.cfg.max_pos) {
		die(sl_err(SL_ERANGE,
			   "--prompt-len %d plus --gen-len %d exceeds the model's %d positions (%s)", plen,
			   glen, x.cfg.max_pos, x.cfg.name));
	}
	sl_prompts calib = { 0 };
	if (o.calib && (rc = read_calibration(o.calib, &x.cfg, tok, &calib)) < 0)
		die(rc);
	sl_tokenizer_free(tok);
	if (o.evaluate) {
		sl_policy pol;
		if ((rc = sl_policy_load(o.evaluate, &pol)) < 0)
			die(rc);
	}

	if ((rc = get_profile(&o, &x.cfg, &x.prof)) < 0)
		die(rc);

	/* budgets: the options, else the machine's (say so in --help) */
	sl_search_params *sp = &x.sp;
	sp->prompt_len = plen;
	sp->gen_len = glen;
	/* the rows generate and score reserve (bench needs fewer): a policy
	 * that fits here runs in all three */
	sp->rows_per_seq = plen + glen;
	sp->kv_f32 = o.co.kv_f32;
	sp->allow_compress = o.allow_compress;
	sp->margin = o.co.margin;
	if (o.zstd_store) {
		if (!(x.prof.p.zstd_ratio > 0 && x.prof.p.zstd_gbps > 0))
			die(sl_err(SL_EINVAL,
				   "--zstd-store: the profile (%s) has no zstd rates (zstd_gbps, zstd_ratio): measure one with this build's sluice profile",
				   x.prof.source));
		sp->w_zstd = x.prof.p.zstd_ratio;
	}
	const bool cuda = !strcmp(x.prof.p.backend, "cuda");
	sp->budget.device = o.co.gpu_mem ? o.co.gpu_mem
			    : cuda ? (size_t)x.prof.p.gpu.memory_bytes : default_mem_budget();
	sp->budget.host = o.co.cpu_mem ? o.co.cpu_mem : default_mem_budget();
	sp->disk = o.co.offload_dir != NULL;
	if (sp->disk) {
		sp->budget.disk = o.disk_mem;
		if (!sp->budget.disk && (rc = dir_free_bytes(o.co.offload_dir, &sp->budget.disk)) < 0)
			die(rc);
	}
	sp->nfix = o.nfix;
	for (int i = 0; i < o.nfix; i++)
		sp->fix[i] = o.fix[i];

	ladder ld = { 0 };
	if (o.hh > 0) {
		sp->h2o = SL_H2O_FIXED;
		sp->h2o_ratio = o.hh;
	} else if (o.min_kv > 0) {
		sp->h2o = SL_H2O_MIN;
		sp->h2o_ratio = o.min_kv;
	} else if (o.calib) {
		computing = true; /* the model runs: a failure now is the job's */
		rc = calibrate(&x, &calib, &ld);
		computing = false;
		if (rc < 0)
			die(rc);
		print_ladder(&o, &ld);
		if (ld.chosen > 0) {
			sp->h2o = SL_H2O_FIXED;
			sp->h2o_ratio = ladder_budget[ld.chosen] / 2;
		}
	}
	sl_prompts_free(&calib);

	rc = o.evaluate ? evaluate(&x) : search(&x, &ld);
	if (rc < 0)
		die(rc);
	return 0;
}
