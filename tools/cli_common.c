/*
 * cli_common.c - what every command shares: the exit status and the
 * one-line errors, option parsing, and opening the backend and the model
 * under the options' policy and budgets (refused before anything loads
 * when the job cannot fit).
 */
#include "cli.h"
#include "cpu/cpu_backend.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>

/*
 * The exit status, one rule for every command (README "Exit status" and
 * each command's --help say the same):
 *   2    the command is wrong and nothing ran: an option, or a file or
 *        folder it names (missing, malformed, out of range: the input, the
 *        policy, the model), or a budget too small for the job;
 *   1    the job failed: it ran and failed, or the system failed it (a read
 *        or write error, out of memory, the device), or an internal error;
 *   130  interrupted (SIGINT or SIGTERM).
 * Everything that can be checked is checked before compute starts, so the
 * first kind is found before anything runs; once compute has started
 * (`computing`), any failure is the job's.
 */
bool computing;

static int exit_status(int rc)
{
	if (rc == SL_EINTERRUPTED)
		return EXIT_INTERRUPTED;
	if (computing)
		return EXIT_FAILURE;
	switch (rc) {
	case SL_EINVAL:
	case SL_EFORMAT:
	case SL_ESHAPE:
	case SL_ENOTFOUND:
	case SL_EUNSUPPORTED:
	case SL_ERANGE:
	case SL_EBUDGET:
		return EXIT_USAGE;
	default:
		return EXIT_FAILURE;
	}
}

void die(int rc)
{
	fprintf(stderr, "sluice: %s\n", sl_errmsg());
	exit(exit_status(rc));
}

void usage_error(const char *cmd, const char *fmt, const char *arg)
{
	fprintf(stderr, "sluice %s: ", cmd);
	fprintf(stderr, fmt, arg);
	fprintf(stderr, " (see 'sluice %s --help')\n", cmd);
	exit(EXIT_USAGE);
}

/* An option getopt did not accept (c is '?' or ':'): one line and a hint. */
void bad_option(const char *cmd, int c, char **argv)
{
	const char *arg = argv[optind - 1];
	char buf[3] = { '-', (char)optopt, 0 };
	if (optopt && strncmp(arg, "--", 2))
		arg = buf; /* a short option, perhaps one of a cluster */
	usage_error(cmd, c == ':' ? "option '%s' needs a value" : "unknown option '%s'", arg);
}

int parse_int(const char *cmd, const char *opt, const char *s, int lo, int hi)
{
	char *end;
	long v = strtol(s, &end, 10);
	if (!*s || *end || v < lo || v > hi) {
		fprintf(stderr, "sluice %s: %s must be an integer in [%d, %d], got '%s'\n", cmd, opt, lo,
			hi, s);
		exit(EXIT_USAGE);
	}
	return (int)v;
}

double parse_real(const char *cmd, const char *opt, const char *s, double lo, bool lo_open, double hi)
{
	char *end;
	errno = 0;
	const double v = strtod(s, &end);
	if (!*s || *end || errno || !(lo_open ? v > lo : v >= lo) || !(v <= hi)) {
		if (lo_open)
			fprintf(stderr, "sluice %s: %s must be a number above %g and at most %g, got '%s'", cmd, opt,
				lo, hi, s);
		else
			fprintf(stderr, "sluice %s: %s must be a number in [%g, %g], got '%s'", cmd, opt, lo, hi, s);
		fprintf(stderr, " (see 'sluice %s --help')\n", cmd);
		exit(EXIT_USAGE);
	}
	return v;
}

/* 1 to the cores this process may use: more only slows it down. */
int parse_threads(const char *cmd, const char *s)
{
	char *end;
	long v = strtol(s, &end, 10);
	const int cores = omp_get_num_procs();
	if (!*s || *end || v < 1 || v > cores) {
		fprintf(stderr,
			"sluice %s: --threads must be an integer in [1, %d] (the cores this process may use), got '%s'\n",
			cmd, cores, s);
		exit(EXIT_USAGE);
	}
	return (int)v;
}

/* A memory cap: a size above 0 (no option: no cap). */
size_t parse_budget(const char *cmd, const char *opt, const char *s)
{
	size_t v = 0;
	char msg[512];
	if (sl_parse_size(s, &v) < 0)
		snprintf(msg, sizeof msg, "%s: %s", opt, sl_errmsg());
	else if (v == 0)
		snprintf(msg, sizeof msg, "%s must be more than 0 (leave it out for no cap)", opt);
	else
		return v;
	usage_error(cmd, "%s", msg);
	return 0;
}

const char *parse_cpu_gemm(const char *cmd, const char *s)
{
	if (!sl_cpu_gemm_known(s))
		usage_error(cmd, "--cpu-gemm must be " SL_CPU_GEMM_NAMES ", got '%s'", s);
	return s;
}

void common_init(common_opts *o)
{
	memset(o, 0, sizeof *o);
	o->backend = "auto";
	o->cpu_gemm = "sluice";
	o->margin = SL_SEARCH_MARGIN;
	sl_policy_default(&o->policy);
}

/* A policy flag pins its field for --policy auto's search. */
static void add_fix(const char *cmd, common_opts *o, const char *field, const char *value)
{
	if (o->nfix == SL_SEARCH_MAX_FIX)
		usage_error(cmd, "more than %s policy flags", "32");
	snprintf(o->fix[o->nfix++], sizeof o->fix[0], "%s=%.24s", field, value);
}

bool common_opt(const char *cmd, int c, common_opts *o)
{
	switch (c) {
	case 'm': o->model_dir = optarg; return true;
	case OPT_DUMMY: o->dummy = optarg; return true;
	case OPT_BACKEND: o->backend = optarg; return true;
	case OPT_THREADS: o->threads = parse_threads(cmd, optarg); return true;
	case OPT_CPU_GEMM: o->cpu_gemm = parse_cpu_gemm(cmd, optarg); return true;
	case OPT_GPU_MEM: o->gpu_mem = parse_budget(cmd, "--gpu-mem", optarg); return true;
	case OPT_CPU_MEM: o->cpu_mem = parse_budget(cmd, "--cpu-mem", optarg); return true;
	case OPT_POLICY: {
		if (!strcmp(optarg, "auto")) {
			o->policy_auto = true;
			return true;
		}
		int rc = sl_policy_load(optarg, &o->policy);
		if (rc < 0)
			die(rc);
		o->policy_given = true;
		o->policy_auto = false;
		o->nfix = 0;
		return true;
	}
	case OPT_PROFILE: {
		int rc = sl_profile_load(optarg, &o->profile);
		if (rc < 0)
			die(rc);
		o->profile_path = optarg;
		return true;
	}
	case OPT_PERCENT: {
		/* six numbers: this argument and the five after it */
		const char *v[6] = { optarg };
		for (int i = 1; i < 6; i++) {
			if (optind >= o->argc)
				usage_error(cmd, "%s", "--percent takes six numbers: WG WC CG CC AG AC");
			v[i] = o->argv[optind++];
		}
		if (sl_policy_set_percent(&o->policy, v) < 0)
			usage_error(cmd, "%s", sl_errmsg());
		o->policy_given = true;
		static const char *const name[6] = { "w_gpu_percent",     "w_cpu_percent",
						     "cache_gpu_percent", "cache_cpu_percent",
						     "act_gpu_percent",   "act_cpu_percent" };
		for (int i = 0; i < 6; i++)
			add_fix(cmd, o, name[i], v[i]);
		return true;
	}
	case OPT_GBS:
	case OPT_NGB:
	case OPT_HH_RATIO:
	case OPT_RECENT_RATIO:
		if (sl_policy_set(&o->policy, c == OPT_GBS ? "--gpu-batch-size"
					      : c == OPT_NGB ? "--num-gpu-batches"
					      : c == OPT_HH_RATIO ? "--hh-ratio" : "--recent-ratio",
				  optarg) < 0)
			usage_error(cmd, "%s", sl_errmsg());
		o->policy_given = true;
		if (c == OPT_HH_RATIO)
			o->hh_given = true;
		else
			add_fix(cmd, o, c == OPT_GBS ? "gpu_batch_size"
				       : c == OPT_NGB ? "num_gpu_batches" : "recent_ratio", optarg);
		return true;
	case OPT_NO_OVERLAP:
		o->policy.overlap = false;
		add_fix(cmd, o, "overlap", "false");
		return true;
	case OPT_CPU_CACHE_COMPUTE:
		o->policy.cpu_cache_compute = true;
		add_fix(cmd, o, "cpu_cache_compute", "true");
		return true;
	case OPT_COMPRESS_CACHE:
		o->policy.compress_cache = true;
		add_fix(cmd, o, "compress_cache", "true");
		return true;
	case OPT_COMPRESS_WEIGHT:
		o->policy.compress_weight = true;
		add_fix(cmd, o, "compress_weight", "true");
		return true;
	case OPT_OFFLOAD_DIR: o->offload_dir = optarg; return true;
	case OPT_MARGIN:
		o->margin = parse_real(cmd, "--margin", optarg, 0, false, 0.5);
		o->margin_given = true;
		return true;
	case OPT_KV_DTYPE:
		if (strcmp(optarg, "f16") && strcmp(optarg, "f32"))
			usage_error(cmd, "--kv-dtype must be f16 or f32, got '%s'", optarg);
		o->kv_f32 = !strcmp(optarg, "f32");
		return true;
	default: return false;
	}
}

/* The command line on its own: one model, a policy within its bounds. */
void check_model_opts(const char *cmd, const common_opts *o)
{
	if (!!o->model_dir == !!o->dummy)
		usage_error(cmd, "%sgive exactly one of --model DIR and --dummy NAME", "");
	if (o->margin_given && !o->policy_auto)
		usage_error(cmd, "%s--margin is for the search: give it with --policy auto", "");
	int rc = sl_policy_validate(&o->policy, "policy");
	if (rc < 0)
		die(rc);
}

/* The run plan's parameters for a job of nseq sequences, rows rows per
 * forward, max_len tokens a sequence and prompts up to max_prompt, under
 * the options' policy (micro-batches only when a policy was given). */
sl_plan_params job_plan(const common_opts *o, int nseq, int rows, int max_len, int max_prompt)
{
	sl_plan_params pp = sl_plan_of_policy(&o->policy, o->policy_given, o->kv_f32);
	pp.max_seq = nseq;
	pp.max_rows = rows;
	pp.max_len = max_len;
	pp.max_prompt = max_prompt;
	pp.w_zstd = o->w_zstd;
	pp.w_zstd_window = o->w_zstd_window;
	return pp;
}

/* The zstd store a job under the options' policy will read (what the
 * model finds as it opens: sl_model_find_zstd), into o->w_zstd and
 * o->w_zstd_window, so that the budgets and predictions made before the
 * model opens count it. */
int find_zstd_store(common_opts *o)
{
	const sl_plan_params pp = sl_plan_of_policy(&o->policy, false, o->kv_f32);
	const sl_model_params mp = { .dir = o->model_dir, .dummy = o->dummy, .offload_dir = o->offload_dir,
				     .plan = &pp };
	sl_wstore_zstd z;
	SL_TRY(sl_model_find_zstd(&mp, &z));
	o->w_zstd = z.level ? z.ratio : 0;
	o->w_zstd_window = z.window;
	return 0;
}

/* 0 when budget (0: no cap) covers need, else SL_EBUDGET: "OPT BUDGET
 * WHAT: it needs at least OPT NEED (WHY" (WHY closes the parenthesis). */
static int budget_short(const char *opt, size_t budget, size_t need, const char *what,
			const char *why)
{
	if (!budget || budget >= need)
		return 0;
	char have[32], want[32];
	fmt_bytes(budget, have, sizeof have);
	fmt_bytes(need, want, sizeof want);
	return sl_err(SL_EBUDGET, "%s %s %s: it needs at least %s %s (%s", opt, have, what, opt, want,
		      why);
}

/* A host budget the job does not fit under its placement is refused
 * before anything is loaded, with the smallest that does. */
static int check_host_budget(const common_opts *o, const sl_model_config *cfg, const sl_backend *be,
			     const sl_plan_params *pp)
{
	sl_plan pl;
	SL_TRY(sl_plan_make(cfg, pp, be->ops->dev_is_host, &pl));
	return budget_short("--cpu-mem", o->cpu_mem, pl.total.host,
			    "is too small for this job under this placement",
			    "the weights' host tier and their conversion, the KV cache and activations on the host), or a smaller --batch-size, or less on the host (--percent)");
}

/* The backend the options ask for, under their budgets. */
int make_backend(const common_opts *o, sl_backend **be)
{
	*be = NULL;
	if (o->threads > 0)
		omp_set_num_threads(o->threads);
	int rc = sl_backend_create(o->backend, o->threads, be);
	if (rc < 0)
		return rc;
	if ((rc = sl_cpu_backend_set_gemm(*be, o->cpu_gemm)) < 0)
		return rc;
	sl_backend_set_dev_limit(*be, o->gpu_mem);
	sl_backend_set_host_limit(*be, o->cpu_mem);
	return 0;
}

/* The backend (*be, made here when NULL), the host budget checked against
 * the plan pp, and the model opened under it; on failure *m is NULL and
 * *be, when made, is the caller's to free (budget_hint reads it). */
int open_model(const common_opts *o, const sl_model_config *cfg, const sl_plan_params *pp,
	       sl_backend **be, sl_model **m)
{
	*m = NULL;
	const sl_policy *p = &o->policy;
	/* what this engine places today: weights and the KV cache in any
	 * tier; activations on the device or in pinned host memory */
	if (p->act_gpu_percent < 100 && p->act_cpu_percent < 100)
		return sl_err(SL_EUNSUPPORTED,
			      "activations on disk are not supported: set act_gpu_percent 100 (device) or act_cpu_percent 100 (pinned CPU memory)");
	if (p->compress_cache && o->kv_f32)
		return sl_err(SL_EINVAL,
			      "--kv-dtype f32 and a compressed KV cache (compress_cache) exclude each other");
	int rc;
	if (!*be && (rc = make_backend(o, be)) < 0)
		return rc;
	if ((rc = check_host_budget(o, cfg, *be, pp)) < 0) {
		(*be)->host_refused = true;
		return rc;
	}
	const sl_model_params mp = { .dir = o->model_dir, .dummy = o->dummy,
				     .offload_dir = o->offload_dir, .plan = pp, .interrupt = o->interrupt };
	return sl_model_open_ex(*be, &mp, m);
}

/* The model's shapes without reading its weights. */
int model_config(const common_opts *o, sl_model_config *cfg)
{
	if (!o->model_dir)
		return sl_model_config_named(o->dummy, cfg);
	char path[4096];
	snprintf(path, sizeof path, "%s/config.json", o->model_dir);
	return sl_model_config_load(path, cfg);
}

/* A size in the units --gpu-mem takes, rounded up so that it still fits. */
void fmt_bytes(size_t n, char *buf, size_t len)
{
	if (n >= (size_t)1 << 30)
		snprintf(buf, len, "%.2fG", ceil(n / 1073741824.0 * 100) / 100);
	else if (n >= (size_t)1 << 20)
		snprintf(buf, len, "%.1fM", ceil(n / 1048576.0 * 10) / 10);
	else
		snprintf(buf, len, "%.0fK", ceil(n / 1024.0));
}

/* A device budget no schedule fits is refused before anything is loaded,
 * with the smallest budget that would work. */
int check_budget(const common_opts *o, const sl_model_config *cfg, const sl_plan_params *pp, bool dev_is_host)
{
	return budget_short("--gpu-mem", o->gpu_mem, sl_plan_min_device_bytes(cfg, pp, dev_is_host),
			    "is too small for any schedule of this job",
			    "every layer's weights and the KV cache off the device, e.g. --percent 0 100 0 100 100 0), or a smaller --batch-size");
}

/* After a budget error: the smallest device budget that would fit, unless
 * the host's refused (be: the backend, if it was made). */
void budget_hint(int rc, const common_opts *o, const sl_model_config *cfg, const sl_backend *be,
		 const sl_plan_params *pp)
{
	if (rc != SL_EBUDGET)
		return;
	if (be && be->host_refused)
		return; /* check_host_budget named the smallest --cpu-mem */
	char want[32], msg[1024];
	snprintf(msg, sizeof msg, "%s", sl_errmsg());
	fmt_bytes(sl_plan_min_device_bytes(cfg, pp, be && be->ops->dev_is_host), want, sizeof want);
	sl_err(rc, "%s; the smallest device budget for this job is --gpu-mem %s with every layer's weights and the KV cache off the device (--percent 0 100 0 100 100 0, or on disk with --offload-dir)",
	       msg, want);
}

size_t default_mem_budget(void)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char line[256];
	unsigned long long kib = 0;
	while (f && fgets(line, sizeof line, f))
		if (sscanf(line, "MemTotal: %llu kB", &kib) == 1)
			break;
	if (f)
		fclose(f);
	return (size_t)kib * 1024;
}

int dir_free_bytes(const char *dir, size_t *out)
{
	struct statvfs sv;
	*out = 0;
	if (statvfs(dir, &sv) != 0)
		return sl_err(SL_EIO, "%s: cannot read its free space: %s", dir, strerror(errno));
	*out = (size_t)sv.f_bavail * (size_t)sv.f_frsize;
	return 0;
}
