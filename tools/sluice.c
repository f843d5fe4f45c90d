/*
 * sluice.c - the command line: `sluice generate` runs a batch generation
 * job from JSON Lines, `sluice bench` measures throughput on synthetic
 * prompts.  Every failure prints one line naming what failed and exits
 * non-zero, by one rule (exit_status).
 */
#include "backend.h"
#include "cpu/cpu_backend.h"
#include "generate.h"
#include "job.h"
#include "jsonl.h"
#include "model.h"
#include "policy.h"
#include "profile.h"
#include "sl_config.h"
#include "sl_json.h"

#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <unistd.h>
#include <omp.h>
#include <string.h>

#define EXIT_USAGE 2
#define EXIT_INTERRUPTED 130

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
static bool computing;

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

static void die(int rc)
{
	fprintf(stderr, "sluice: %s\n", sl_errmsg());
	exit(exit_status(rc));
}

#define EXIT_HELP                                                                          \
	"Exit status: 0 done; 2 the command is wrong (an option, the input, policy or model\n" \
	"file, a budget too small), found before anything ran; 1 the job failed (it ran and\n" \
	"failed, a read or write error, out of memory, the device, an internal error);\n"     \
	"130 interrupted.\n"

static void usage_error(const char *cmd, const char *fmt, const char *arg)
{
	fprintf(stderr, "sluice %s: ", cmd);
	fprintf(stderr, fmt, arg);
	fprintf(stderr, " (see 'sluice %s --help')\n", cmd);
	exit(EXIT_USAGE);
}

/* An option getopt did not accept (c is '?' or ':'): one line and a hint. */
static void bad_option(const char *cmd, int c, char **argv)
{
	const char *arg = argv[optind - 1];
	char buf[3] = { '-', (char)optopt, 0 };
	if (optopt && strncmp(arg, "--", 2))
		arg = buf; /* a short option, perhaps one of a cluster */
	usage_error(cmd, c == ':' ? "option '%s' needs a value" : "unknown option '%s'", arg);
}

static int parse_int(const char *cmd, const char *opt, const char *s, int lo, int hi)
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

/* 1 to the cores this process may use: more only slows it down. */
static int parse_threads(const char *cmd, const char *s)
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
static size_t parse_budget(const char *cmd, const char *opt, const char *s)
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

/* Options every command shares. */
typedef struct common_opts {
	const char *model_dir, *dummy, *backend;
	const char *cpu_gemm; /* --cpu-gemm: sluice (default) or openblas */
	int threads;
	size_t gpu_mem, cpu_mem;
	bool kv_f32;
	int argc;
	char **argv;
	sl_policy policy;
	bool policy_given; /* a policy file or flag: its batch is the block size */
	const char *offload_dir;
} common_opts;

static void common_init(common_opts *o)
{
	memset(o, 0, sizeof *o);
	o->backend = "auto";
	o->cpu_gemm = "sluice";
	sl_policy_default(&o->policy);
}

enum { OPT_DUMMY = 1000, OPT_BACKEND, OPT_THREADS, OPT_GPU_MEM, OPT_OVERWRITE, OPT_JSON,
       OPT_PROMPT_LEN, OPT_GEN_LEN, OPT_QUIET, OPT_SEED, OPT_KV_DTYPE, OPT_POLICY, OPT_PERCENT,
       OPT_GBS, OPT_NGB, OPT_OFFLOAD_DIR, OPT_CPU_MEM, OPT_NO_OVERLAP, OPT_CPU_CACHE_COMPUTE,
       OPT_HH_RATIO, OPT_RECENT_RATIO, OPT_CPU_GEMM };

static bool common_opt(const char *cmd, int c, common_opts *o)
{
	switch (c) {
	case 'm': o->model_dir = optarg; return true;
	case OPT_DUMMY: o->dummy = optarg; return true;
	case OPT_BACKEND: o->backend = optarg; return true;
	case OPT_THREADS: o->threads = parse_threads(cmd, optarg); return true;
	case OPT_CPU_GEMM:
		if (strcmp(optarg, "sluice") && strcmp(optarg, "openblas"))
			usage_error(cmd, "--cpu-gemm must be sluice or openblas, got '%s'", optarg);
		o->cpu_gemm = optarg;
		return true;
	case OPT_GPU_MEM: o->gpu_mem = parse_budget(cmd, "--gpu-mem", optarg); return true;
	case OPT_CPU_MEM: o->cpu_mem = parse_budget(cmd, "--cpu-mem", optarg); return true;
	case OPT_POLICY: {
		int rc = sl_policy_load(optarg, &o->policy);
		if (rc < 0)
			die(rc);
		o->policy_given = true;
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
		return true;
	case OPT_NO_OVERLAP: o->policy.overlap = false; return true;
	case OPT_CPU_CACHE_COMPUTE: o->policy.cpu_cache_compute = true; return true;
	case OPT_OFFLOAD_DIR: o->offload_dir = optarg; return true;
	case OPT_KV_DTYPE:
		if (strcmp(optarg, "f16") && strcmp(optarg, "f32"))
			usage_error(cmd, "--kv-dtype must be f16 or f32, got '%s'", optarg);
		o->kv_f32 = !strcmp(optarg, "f32");
		return true;
	default: return false;
	}
}

/* The command line on its own: one model, a policy within its bounds. */
static void check_model_opts(const char *cmd, const common_opts *o)
{
	if (!!o->model_dir == !!o->dummy)
		usage_error(cmd, "%sgive exactly one of --model DIR and --dummy NAME", "");
	int rc = sl_policy_validate(&o->policy, "policy");
	if (rc < 0)
		die(rc);
}

/* Backend and model; on failure both are released and *be, *m are NULL. */
static sl_model_params model_params(const common_opts *o)
{
	const sl_policy *p = &o->policy;
	return (sl_model_params){ .dir = o->model_dir, .dummy = o->dummy,
				  .w_gpu_percent = p->w_gpu_percent, .w_cpu_percent = p->w_cpu_percent,
				  .offload_dir = o->offload_dir, .overlap = p->overlap,
				  .sep_layer = p->sep_layer };
}

/* A job of nseq sequences, rows rows per forward, cap cache slots (dense)
 * and prompts up to max_prompt, under the options' policy. */
static sl_job_shape job_shape(const common_opts *o, int nseq, int rows, int cap, int max_prompt)
{
	const sl_policy *p = &o->policy;
	return (sl_job_shape){ .max_seq = nseq, .max_rows = rows, .cap = cap, .max_prompt = max_prompt,
			       .kv_f32 = o->kv_f32, .micro = o->policy_given ? p->gpu_batch_size : 0,
			       .hh = p->hh_ratio,
			       .rr = p->hh_ratio > 0 || p->recent_ratio > 0 ? sl_policy_recent_ratio(p) : 0,
			       .cache_gpu_percent = p->cache_gpu_percent,
			       .cache_cpu_percent = p->cache_cpu_percent,
			       .act_host = p->act_cpu_percent >= 100,
			       .cpu_cache_compute = p->cpu_cache_compute };
}

static void fmt_bytes(size_t n, char *buf, size_t len);

/* A host budget the job does not fit under its placement is refused
 * before anything is loaded, with the smallest that does. */
static int check_host_budget(const common_opts *o, const sl_opt_config *cfg, const sl_backend *be,
			     const sl_job_shape *js)
{
	const sl_model_params mp = model_params(o);
	size_t need = sl_model_min_host_bytes(cfg, &mp, js, be->ops->dev_is_host);
	if (!o->cpu_mem || o->cpu_mem >= need)
		return 0;
	char have[32], want[32];
	fmt_bytes(o->cpu_mem, have, sizeof have);
	fmt_bytes(need, want, sizeof want);
	return sl_err(SL_EBUDGET,
		      "--cpu-mem %s is too small for this job under this placement: it needs at least --cpu-mem %s (the weights' host tier and their conversion, the KV cache and activations on the host), or a smaller --batch-size, or less on the host (--percent)",
		      have, want);
}

/* The backend under the options' budgets, the host budget checked against
 * the job js (NULL: none), and the model; on failure *m is NULL and *be,
 * when made, is the caller's to free (budget_hint reads it). */
static int open_model(const common_opts *o, const sl_opt_config *cfg, const sl_job_shape *js,
		      sl_backend **be, sl_model **m)
{
	*m = NULL;
	*be = NULL;
	int threads = o->threads;
	if (threads > 0)
		omp_set_num_threads(threads);
	const sl_policy *p = &o->policy;
	/* what this engine places today: weights and the KV cache in any
	 * tier; activations on the device or in pinned host memory */
	if (p->act_gpu_percent < 100 && p->act_cpu_percent < 100)
		return sl_err(SL_EUNSUPPORTED,
			      "activations on disk are not supported: set act_gpu_percent 100 (device) or act_cpu_percent 100 (pinned CPU memory)");
	if (p->compress_weight || p->compress_cache)
		return sl_err(SL_EUNSUPPORTED,
			      "this build does not compress: set compress_weight and compress_cache false");
	int rc = sl_backend_create(o->backend, threads, be);
	if (rc < 0)
		return rc;
	if ((rc = sl_cpu_backend_set_gemm(*be, o->cpu_gemm)) < 0)
		return rc;
	sl_backend_set_dev_limit(*be, o->gpu_mem);
	sl_backend_set_host_limit(*be, o->cpu_mem);
	if (js && (rc = check_host_budget(o, cfg, *be, js)) < 0) {
		(*be)->host_refused = true;
		return rc;
	}
	const sl_model_params mp = model_params(o);
	if ((rc = sl_model_open_ex(*be, &mp, m)) < 0)
		return rc;
	(*m)->kv_f32 = o->kv_f32;
	(*m)->cache_gpu_percent = p->cache_gpu_percent;
	(*m)->cache_cpu_percent = p->cache_cpu_percent;
	(*m)->cpu_cache_compute = p->cpu_cache_compute;
	(*m)->act_host = p->act_cpu_percent >= 100;
	(*m)->micro = o->policy_given ? p->gpu_batch_size : 0;
	(*m)->hh_ratio = p->hh_ratio;
	(*m)->recent_ratio = p->hh_ratio > 0 || p->recent_ratio > 0 ? sl_policy_recent_ratio(p) : 0;
	return 0;
}

#define COMMON_LONG_OPTS                                                                   \
	{ "model", required_argument, 0, 'm' }, { "dummy", required_argument, 0, OPT_DUMMY }, \
		{ "backend", required_argument, 0, OPT_BACKEND },                              \
		{ "threads", required_argument, 0, OPT_THREADS },                              \
		{ "cpu-gemm", required_argument, 0, OPT_CPU_GEMM },                            \
		{ "gpu-mem", required_argument, 0, OPT_GPU_MEM },                              \
		{ "kv-dtype", required_argument, 0, OPT_KV_DTYPE },                            \
		{ "cpu-mem", required_argument, 0, OPT_CPU_MEM },                              \
		{ "policy", required_argument, 0, OPT_POLICY },                                \
		{ "percent", required_argument, 0, OPT_PERCENT },                              \
		{ "gpu-batch-size", required_argument, 0, OPT_GBS },                           \
		{ "num-gpu-batches", required_argument, 0, OPT_NGB },                          \
		{ "offload-dir", required_argument, 0, OPT_OFFLOAD_DIR },                      \
		{ "no-overlap", no_argument, 0, OPT_NO_OVERLAP },                              \
		{ "cpu-cache-compute", no_argument, 0, OPT_CPU_CACHE_COMPUTE },                \
		{ "hh-ratio", required_argument, 0, OPT_HH_RATIO },                            \
		{ "recent-ratio", required_argument, 0, OPT_RECENT_RATIO }

#define COMMON_HELP                                                                          \
	"  --model DIR          Hugging Face OPT checkpoint (config.json + safetensors)\n"  \
	"  --dummy NAME         deterministic random weights of a named shape instead\n"    \
	"                       (opt-125m, -350m, -1.3b, -2.7b, -6.7b, -13b, -30b, -66b, -175b)\n" \
	"  --backend B          cpu, cuda or auto (default: cuda where a GPU is found)\n"   \
	"  --threads N          CPU threads, 1 to the cores available (default: all cores)\n" \
	"  --cpu-gemm sluice|openblas  the CPU backend's matrix products: sluice's own\n" \
	"                       (default: a sequence's tokens do not depend on the batch)\n" \
	"                       or OpenBLAS's sgemm (faster on some CPUs; not batch invariant)\n" \
	"  --gpu-mem BYTES      cap on device memory, above 0 (e.g. 16G; K, M, G, T)\n"      \
	"  --kv-dtype f16|f32   KV cache precision (default f16; f32 doubles its size)\n"  \
	"  --cpu-mem BYTES      cap on pinned host memory, above 0 (e.g. 64G)\n"            \
	"  --policy FILE        placement and batching policy (JSON; docs/policy.md);\n"   \
	"                       flags after it override its fields\n"                       \
	"  --percent WG WC CG CC AG AC  FlexGen's six placement percentages (weights,\n"  \
	"                       cache, activations on GPU and CPU; the rest on disk)\n"     \
	"  --gpu-batch-size N, --num-gpu-batches N  the policy's block: N x N prompts\n"   \
	"  --offload-dir DIR    the disk tier's folder (weights or KV cache on disk)\n"     \
	"  --no-overlap         load each layer's weights and each step's cache when\n"    \
	"                       needed instead of prefetching the next\n"                   \
	"  --cpu-cache-compute  decode attention over the host-tier KV cache where it\n"   \
	"                       lives, on the CPU, without copying the cache\n"            \
	"  --hh-ratio H         H2O: keep floor(H x prompt) heavy-hitter tokens (0: off)\n" \
	"  --recent-ratio R     H2O: and floor(R x prompt) recent ones (default: H)\n"

/* ---- generate and score ---------------------------------------------- */

static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
	(void)sig;
	interrupted = 1;
}

static void catch_signals(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
}

/* Options of the two job commands. */
typedef struct job_cli {
	common_opts co;
	const char *in, *out, *stats;
	bool overwrite, resume, quiet, skip_bad, truncate_left, batch_given;
	sl_job_opts jo;
	int nstop_cap;
} job_cli;

enum { OPT_RESUME = 1100, OPT_STATS, OPT_SHARD, OPT_SKIP_BAD, OPT_TRUNCATE, OPT_TEMPERATURE,
       OPT_TOP_K, OPT_TOP_P, OPT_STOP };

#define JOB_LONG_OPTS                                                                      \
	COMMON_LONG_OPTS, { "out", required_argument, 0, 'o' },                            \
		{ "batch-size", required_argument, 0, 'b' },                                \
		{ "overwrite", no_argument, 0, OPT_OVERWRITE },                             \
		{ "resume", no_argument, 0, OPT_RESUME },                                   \
		{ "quiet", no_argument, 0, OPT_QUIET },                                     \
		{ "stats", required_argument, 0, OPT_STATS },                               \
		{ "shard", required_argument, 0, OPT_SHARD },                               \
		{ "skip-bad-lines", no_argument, 0, OPT_SKIP_BAD },                         \
		{ "truncate", required_argument, 0, OPT_TRUNCATE },                         \
		{ "help", no_argument, 0, 'h' }

#define JOB_HELP                                                                             \
	"  --out FILE           output JSON Lines, in input order (FILE.partial until done;\n"  \
	"                       - : standard output, each block as it ends, no --resume)\n"    \
	"  --batch-size B       prompts per block (default 8)\n"                                \
	"  --overwrite          replace an existing output (or an interrupted run's)\n"         \
	"  --resume             continue an interrupted run after its last whole block\n"       \
	"  --shard K/N          take blocks K, K+N, K+2N, ... (0 <= K < N)\n"                   \
	"  --skip-bad-lines     write {\"id\", \"error\"} for a bad input line and go on\n"       \
	"  --truncate left      cut over-long prompts from the left instead of failing\n"       \
	"  --stats FILE         the summary as JSON\n"                                          \
	"  --quiet              no progress and no summary on stderr\n" EXIT_HELP

static bool job_opt(const char *cmd, int c, job_cli *j)
{
	if (common_opt(cmd, c, &j->co))
		return true;
	switch (c) {
	case 'o': j->out = optarg; return true;
	case 'b':
		j->jo.batch = parse_int(cmd, "--batch-size", optarg, 1, 1 << 16);
		j->batch_given = true;
		return true;
	case OPT_OVERWRITE: j->overwrite = true; return true;
	case OPT_RESUME: j->resume = true; return true;
	case OPT_QUIET: j->quiet = true; return true;
	case OPT_STATS: j->stats = optarg; return true;
	case OPT_SKIP_BAD: j->skip_bad = true; return true;
	case OPT_TRUNCATE:
		if (strcmp(optarg, "left"))
			usage_error(cmd, "--truncate takes 'left', got '%s'", optarg);
		j->truncate_left = true;
		return true;
	case OPT_SHARD: {
		int k = -1, n = -1, used = 0;
		if (sscanf(optarg, "%d/%d%n", &k, &n, &used) != 2 || optarg[used] || n < 1 || k < 0 ||
		    k >= n)
			usage_error(cmd, "--shard takes K/N with 0 <= K < N, got '%s'", optarg);
		j->jo.shard_k = k;
		j->jo.shard_n = n;
		return true;
	}
	default: return false;
	}
}

/* Check lengths against the model's positions (or cut prompts from the
 * left); extra is each line's tokens after the prompt. */
static int fit_prompts(sl_prompts *ps, const char *in, int max_pos, bool truncate_left,
		       int default_new, bool score)
{
	for (int i = 0; i < ps->n; i++) {
		sl_prompt *p = &ps->p[i];
		if (p->error)
			continue;
		int extra = score ? p->ncont : (p->max_new ? p->max_new : default_new);
		if (p->n + extra <= max_pos)
			continue;
		if (!truncate_left || extra >= max_pos)
			return sl_err(SL_ERANGE,
				      "%s:%d: prompt of %d tokens plus %d %s exceeds the model's %d positions%s",
				      in, p->line, p->n, extra, score ? "continuation tokens" : "new tokens",
				      max_pos, truncate_left ? "" : " (--truncate left cuts prompts)");
		int keep = max_pos - extra;
		memmove(p->ids, p->ids + (p->n - keep), sizeof(int32_t) * (size_t)keep);
		p->n = keep;
	}
	return 0;
}

/* The model's shapes without reading its weights. */
static int model_config(const common_opts *o, sl_opt_config *cfg)
{
	if (!o->model_dir)
		return sl_opt_config_named(o->dummy, cfg);
	char path[4096];
	snprintf(path, sizeof path, "%s/config.json", o->model_dir);
	return sl_opt_config_load(path, cfg);
}

/* A size in the units --gpu-mem takes, rounded up so that it still fits. */
static void fmt_bytes(size_t n, char *buf, size_t len)
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
static size_t min_bytes(const common_opts *o, const sl_opt_config *cfg, const sl_job_shape *js)
{
	return sl_model_min_device_bytes(cfg, js->max_seq, js->max_rows, js->cap, js->kv_f32, js->micro,
					 js->hh, js->rr, js->max_prompt, 0, js->act_host);
}

static int check_budget(const common_opts *o, const sl_opt_config *cfg, const sl_job_shape *js)
{
	size_t need = min_bytes(o, cfg, js);
	if (!o->gpu_mem || o->gpu_mem >= need)
		return 0;
	char have[32], want[32];
	fmt_bytes(o->gpu_mem, have, sizeof have);
	fmt_bytes(need, want, sizeof want);
	return sl_err(SL_EBUDGET,
		      "--gpu-mem %s is too small for any schedule of this job: it needs at least --gpu-mem %s (every layer's weights and the KV cache off the device, e.g. --percent 0 100 0 100 100 0), or a smaller --batch-size",
		      have, want);
}

/* After a budget error: the smallest device budget that would fit, unless
 * the host's refused (be: the backend, if it was made). */
static void budget_hint(int rc, const common_opts *o, const sl_opt_config *cfg, const sl_backend *be,
			const sl_job_shape *js)
{
	if (rc != SL_EBUDGET)
		return;
	if (be && be->host_refused)
		return; /* check_host_budget named the smallest --cpu-mem */
	char want[32], msg[1024];
	snprintf(msg, sizeof msg, "%s", sl_errmsg());
	fmt_bytes(min_bytes(o, cfg, js), want, sizeof want);
	sl_err(rc, "%s; the smallest device budget for this job is --gpu-mem %s with every layer's weights and the KV cache off the device (--percent 0 100 0 100 100 0, or on disk with --offload-dir)",
	       msg, want);
}

static int run_job(const char *cmd, job_cli *j, bool score)
{
	if (!j->in || !j->out)
		usage_error(cmd, "%s", score ? "--input and --out are required"
					     : "--prompts and --out are required");
	check_model_opts(cmd, &j->co);
	if (j->overwrite && j->resume)
		usage_error(cmd, "%s", "--overwrite and --resume exclude each other");
	const bool out_std = !strcmp(j->out, "-");
	if (out_std && j->resume)
		usage_error(cmd, "%s", "--resume needs --out FILE (standard output has no .partial to continue)");
	if (j->co.policy_given && !j->batch_given)
		j->jo.batch = (int)sl_policy_batch(&j->co.policy);
	j->jo.stats_path = j->stats;
	j->jo.resume = j->resume;
	j->jo.progress = j->quiet ? 0 : isatty(STDERR_FILENO) ? 2 : 1;
	j->jo.interrupt = &interrupted;
	catch_signals();

	/* everything that can be checked before compute is checked first:
	 * every output path, then the model's shapes, the tokenizer and the
	 * input, all before any weight is read */
	bool complete = false;
	sl_output *out = NULL;
	int rc = sl_output_open(j->out, j->resume ? SL_OUT_RESUME
				: j->overwrite ? SL_OUT_OVERWRITE : SL_OUT_NEW, &out, &complete);
	if (rc < 0)
		die(rc);
	sl_backend *be = NULL;
	sl_model *m = NULL;
	sl_tokenizer *tok = NULL;
	sl_prompts ps = { 0 };
	sl_job_stats st = { 0 };
	if (j->stats && (rc = sl_job_check_stats_path(j->stats)) < 0)
		goto fail;
	sl_opt_config cfg;
	if ((rc = model_config(&j->co, &cfg)) < 0)
		goto fail;
	if (j->co.model_dir) {
		char vpath[4096];
		snprintf(vpath, sizeof vpath, "%s/vocab.json", j->co.model_dir);
		if (access(vpath, F_OK) == 0 && (rc = sl_tokenizer_load(j->co.model_dir, &tok)) < 0)
			goto fail;
	}
	sl_read_opts ro = { .vocab = cfg.vocab, .tok = tok, .score = score,
			    .skip_bad_lines = j->skip_bad };
	if ((rc = sl_prompts_read(j->in, &ro, &ps)) < 0)
		goto fail;
	const char *in_name = strcmp(j->in, "-") ? j->in : "<stdin>";
	if ((rc = fit_prompts(&ps, in_name, cfg.max_pos, j->truncate_left, j->jo.max_new, score)) < 0)
		goto fail;
	if (complete) {
		/* a finished output: nothing to resume if it is this input's */
		if ((rc = sl_job_check_complete(&ps, out, &j->jo)) < 0)
			goto fail;
		if (!j->quiet)
			fprintf(stderr, "sluice: %s is complete already; nothing to resume\n", j->out);
		sl_output_close(out, false);
		sl_prompts_free(&ps);
		sl_tokenizer_free(tok);
		return 0;
	}
	int max_len = 1, max_prompt = 1;
	for (int i = 0; i < ps.n; i++) {
		const sl_prompt *p = &ps.p[i];
		if (p->error)
			continue;
		int extra = score ? p->ncont : (p->max_new ? p->max_new : j->jo.max_new);
		max_len = SL_MAX(max_len, p->n + extra);
		max_prompt = SL_MAX(max_prompt, p->n);
	}
	const int nseq = SL_MIN(j->jo.batch, ps.n);
	const sl_job_shape js = job_shape(&j->co, nseq, nseq * max_len, max_len, max_prompt);
	if ((rc = check_budget(&j->co, &cfg, &js)) < 0)
		goto fail;
	if ((rc = open_model(&j->co, &cfg, &js, &be, &m)) < 0) {
		budget_hint(rc, &j->co, &cfg, be, &js);
		goto fail;
	}
	rc = score ? sl_job_score(m, &ps, out, &j->jo, &st)
		   : sl_job_generate(m, tok, &ps, out, &j->jo, &st);
	computing = st.started;
	if (rc < 0) {
		budget_hint(rc, &j->co, &cfg, be, &js);
		goto fail;
	}
	sl_output_close(out, false);
	out = NULL;
	rc = sl_job_report(&st, &j->jo, cmd, j->quiet, be->ops->name);
	sl_prompts_free(&ps);
	sl_tokenizer_free(tok);
	sl_model_free(m);
	sl_backend_free(be);
	if (rc < 0)
		die(rc);
	return 0;
fail:
	if (rc == SL_EINTERRUPTED) {
		if (out_std)
			fprintf(stderr, "sluice: interrupted: %d of %d prompts were written to standard output\n",
				st.done, st.prompts);
		else
			fprintf(stderr,
				"sluice: interrupted: %d of %d prompts are in %s.partial; run the same command with --resume to continue\n",
				st.done, st.prompts, j->out);
		sl_output_close(out, false);
		exit(EXIT_INTERRUPTED);
	}
	/* keep whole blocks already written for --resume; otherwise leave nothing */
	bool keep = !complete && (st.done > st.resumed_lines || j->resume);
	if (keep && out_std)
		sl_err_prefix(rc, "%d of %d prompts were written to standard output", st.done, st.prompts);
	else if (keep)
		sl_err_prefix(rc, "%d of %d prompts are in %s.partial (--resume continues)", st.done,
			      st.prompts, j->out);
	sl_output_close(out, !keep);
	sl_prompts_free(&ps);
	sl_tokenizer_free(tok);
	sl_model_free(m);
	sl_backend_free(be);
	die(rc);
	return 1;
}

static const char generate_help[] =
	"usage: sluice generate (--model DIR | --dummy NAME) --prompts IN.jsonl --out OUT.jsonl\n"
	"                       [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P]\n"
	"                       [--seed S] [--stop TEXT]... [job options]\n"
	"Batch generation.  Each input line: {\"prompt\": text} or {\"input_ids\": [...]}, with\n"
	"optional \"id\" and \"max_new_tokens\".  Each output line, in input order:\n"
	"{\"id\", \"completion\" (with a tokenizer), \"output_ids\", \"finish_reason\"}.\n"
	"A sequence ends at EOS (kept as its last token), a --stop text, or N new tokens.\n"
	COMMON_HELP
	"  --prompts FILE       input JSON Lines (- : standard input)\n"
	"  --max-new-tokens N   new tokens per prompt (default 32; a line's\n"
	"                       \"max_new_tokens\" overrides it)\n"
	"  --temperature T      0 (default) is greedy; above 0 samples\n"
	"  --top-k K            sample among the K most likely tokens (0: all)\n"
	"  --top-p P            sample from the smallest set holding mass P (1: all)\n"
	"  --seed S             sampling seed (default 0); a prompt's tokens depend only\n"
	"                       on the seed and its line, not on the batch\n"
	"  --stop TEXT          end a sequence when its text contains TEXT (repeatable;\n"
	"                       the completion stops before it)\n" JOB_HELP;

static float parse_float(const char *cmd, const char *opt, const char *s, float lo, float hi)
{
	char *end;
	float v = strtof(s, &end);
	if (!*s || *end || !(v >= lo && v <= hi)) {
		fprintf(stderr, "sluice %s: %s must be a number in [%g, %g], got '%s'\n", cmd, opt, lo,
			hi, s);
		exit(EXIT_USAGE);
	}
	return v;
}

static int cmd_generate(int argc, char **argv)
{
	job_cli j = { 0 };
	common_init(&j.co);
	j.co.argc = argc;
	j.co.argv = argv;
	j.jo.batch = 8;
	j.jo.max_new = 32;
	j.jo.sampling.top_p = 1.0f;
	j.jo.stop = calloc((size_t)argc, sizeof(char *));
	static const struct option opts[] = {
		JOB_LONG_OPTS,
		{ "prompts", required_argument, 0, 'p' },
		{ "max-new-tokens", required_argument, 0, 'n' },
		{ "temperature", required_argument, 0, OPT_TEMPERATURE },
		{ "top-k", required_argument, 0, OPT_TOP_K },
		{ "top-p", required_argument, 0, OPT_TOP_P },
		{ "seed", required_argument, 0, OPT_SEED },
		{ "stop", required_argument, 0, OPT_STOP },
		{ 0, 0, 0, 0 },
	};
	int c;
	while ((c = getopt_long(argc, argv, ":m:p:o:n:b:h", opts, NULL)) != -1) {
		if (job_opt("generate", c, &j))
			continue;
		switch (c) {
		case 'p': j.in = optarg; break;
		case 'n': j.jo.max_new = parse_int("generate", "--max-new-tokens", optarg, 1, 1 << 20); break;
		case OPT_TEMPERATURE:
			j.jo.sampling.temperature = parse_float("generate", "--temperature", optarg, 0, 100);
			break;
		case OPT_TOP_K: j.jo.sampling.top_k = parse_int("generate", "--top-k", optarg, 0, 1 << 30); break;
		case OPT_TOP_P: j.jo.sampling.top_p = parse_float("generate", "--top-p", optarg, 1e-6f, 1); break;
		case OPT_SEED: j.jo.sampling.seed = (uint64_t)parse_int("generate", "--seed", optarg, 0, INT_MAX); break;
		case OPT_STOP:
			if (!*optarg)
				usage_error("generate", "%s", "--stop takes a non-empty text");
			j.jo.stop[j.jo.nstop++] = optarg;
			break;
		case 'h':
			fputs(generate_help, stdout);
			free(j.jo.stop);
			return 0;
		default: bad_option("generate", c, argv);
		}
	}
	if (optind < argc)
		usage_error("generate", "unexpected argument '%s'", argv[optind]);
	int rc = run_job("generate", &j, false);
	free(j.jo.stop);
	return rc;
}

static const char score_help[] =
	"usage: sluice score (--model DIR | --dummy NAME) --input IN.jsonl --out OUT.jsonl\n"
	"                    [job options]\n"
	"Log-probabilities of continuations.  Each input line: a prompt (\"prompt\" text or\n"
	"\"input_ids\") and a continuation (\"continuation\" text or \"continuation_ids\").\n"
	"Each output line: {\"id\", \"logprobs\" (one per continuation token), \"sum_logprob\",\n"
	"\"perplexity\"}.  The continuation runs through the same decode path as generation.\n"
	COMMON_HELP "  --input FILE         input JSON Lines (- : standard input)\n" JOB_HELP;

static int cmd_score(int argc, char **argv)
{
	job_cli j = { 0 };
	common_init(&j.co);
	j.co.argc = argc;
	j.co.argv = argv;
	j.jo.batch = 8;
	static const struct option opts[] = {
		JOB_LONG_OPTS,
		{ "input", required_argument, 0, 'i' },
		{ 0, 0, 0, 0 },
	};
	int c;
	while ((c = getopt_long(argc, argv, ":m:i:o:b:h", opts, NULL)) != -1) {
		if (job_opt("score", c, &j))
			continue;
		switch (c) {
		case 'i': j.in = optarg; break;
		case 'h': fputs(score_help, stdout); return 0;
		default: bad_option("score", c, argv);
		}
	}
	if (optind < argc)
		usage_error("score", "unexpected argument '%s'", argv[optind]);
	return run_job("score", &j, true);
}

/* ---- bench ------------------------------------------------------------ */

static const char bench_help[] =
	"usage: sluice bench (--dummy NAME | --model DIR) [--prompt-len P] [--gen-len G]\n"
	"                    [--batch B|max] [--seed S] [--json]\n"
	"Throughput on B synthetic prompts of P tokens, G new tokens each (EOS ignored),\n"
	"after a short warm-up.  tokens/s = B*G / (prefill + decode), FlexGen's metric.\n" COMMON_HELP
	"  --prompt-len P       default 128\n"
	"  --gen-len G          default 32\n"
	"  --batch B            default 8; 'max': the largest batch the budgets hold\n"
	"                       (--gpu-mem, --cpu-mem), found by allocating, then run\n"
	"  --seed S             prompt ids (default 1)\n"
	"  --json               one JSON object on stdout instead of the table\n" EXIT_HELP;

/* A JSON string of any bytes (a path, a truncated name): ill-formed
 * UTF-8 repaired, never a NULL that drops the field. */
static json_t *json_text(const char *s)
{
	char *t = NULL;
	size_t n = 0;
	if (sl_tokenizer_utf8_repair(s, strlen(s), &t, &n) < 0)
		return NULL;
	json_t *j = json_stringn(t, n);
	free(t);
	return j;
}

/* 1 when a batch of b sequences fits the budgets (the workspace and the
 * cache allocate), 0 when it does not, or an error. */
static int batch_fits(sl_model *m, int b, int plen, int glen)
{
	sl_kv *kv = NULL;
	int rc = sl_model_reserve(m, b, b * plen);
	if (!rc)
		rc = sl_kv_make(m, b, plen, plen + glen, &kv);
	sl_kv_free(m, kv);
	sl_model_release(m);
	if (rc == SL_EBUDGET || rc == SL_ENOMEM)
		return 0;
	return rc < 0 ? rc : 1;
}

/* Whether the budgets hold a batch of b by the model's own arithmetic
 * (sl_model_job_bytes): no allocation, so a search costs nothing. */
static bool batch_counts(sl_model *m, int b, int plen, int glen)
{
	size_t dev, host;
	sl_model_job_bytes(m, b, plen, plen + glen, &dev, &host);
	const sl_backend *be = m->be;
	return (!be->dev_limit || be->dev_used + dev <= be->dev_limit) &&
	       (!be->host_limit || be->host_used + host <= be->host_limit);
}

/* The largest batch (up to 65536) whose workspace and KV cache fit the
 * budgets: bisection by arithmetic, then checked by allocating (stepping
 * down while it does not fit); 0 when not even one does. */
static int max_batch(sl_model *m, int plen, int glen, int *out)
{
	int lo = 0, hi = 65537; /* lo fits, hi does not */
	while (hi - lo > 1) {
		int mid = lo + (hi - lo) / 2;
		*(batch_counts(m, mid, plen, glen) ? &lo : &hi) = mid;
	}
	int rc = 0;
	while (lo > 0 && (rc = batch_fits(m, lo, plen, glen)) == 0)
		lo--;
	if (rc < 0)
		return rc;
	*out = lo;
	return 0;
}

/* bench's greedy next tokens; logits that are not finite (argmax -1)
 * stop it with the line generate gives. */
static int bench_next(sl_model *m, int nseq, int32_t *next, int step)
{
	SL_TRY(sl_model_argmax(m, nseq, next));
	for (int s = 0; s < nseq; s++)
		if (next[s] < 0)
			return sl_model_nonfinite_err(0, NULL, s, step, "new token");
	return 0;
}

static int cmd_bench(int argc, char **argv)
{
	common_opts co;
	common_init(&co);
	co.argc = argc;
	co.argv = argv;
	int plen = 128, glen = 32, batch = 8, seed = 1;
	bool batch_given = false, batch_max = false;
	bool json = false;
	static const struct option opts[] = {
		COMMON_LONG_OPTS,
		{ "prompt-len", required_argument, 0, OPT_PROMPT_LEN },
		{ "gen-len", required_argument, 0, OPT_GEN_LEN },
		{ "batch", required_argument, 0, 'b' },
		{ "seed", required_argument, 0, OPT_SEED },
		{ "json", no_argument, 0, OPT_JSON },
		{ "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	int c;
	while ((c = getopt_long(argc, argv, ":m:b:h", opts, NULL)) != -1) {
		if (common_opt("bench", c, &co))
			continue;
		switch (c) {
		case OPT_PROMPT_LEN: plen = parse_int("bench", "--prompt-len", optarg, 1, 1 << 20); break;
		case OPT_GEN_LEN: glen = parse_int("bench", "--gen-len", optarg, 1, 1 << 20); break;
		case 'b':
			batch_max = !strcmp(optarg, "max");
			batch = batch_max ? 1 : parse_int("bench", "--batch", optarg, 1, 1 << 16);
			batch_given = true;
			break;
		case OPT_SEED: seed = parse_int("bench", "--seed", optarg, 0, 1 << 30); break;
		case OPT_JSON: json = true; break;
		case 'h': fputs(bench_help, stdout); return 0;
		default: bad_option("bench", c, argv);
		}
	}
	if (optind < argc)
		usage_error("bench", "unexpected argument '%s'", argv[optind]);
	if (co.policy_given && !batch_given)
		batch = (int)sl_policy_batch(&co.policy);
	check_model_opts("bench", &co);
	sl_backend *be = NULL;
	sl_model *m = NULL;
	sl_opt_config bcfg;
	if (batch_max && !co.gpu_mem && !co.cpu_mem)
		usage_error("bench", "%s needs a budget to fill: --gpu-mem or --cpu-mem", "--batch max");
	int rc = model_config(&co, &bcfg);
	if (rc < 0)
		die(rc);
	if (plen + glen > bcfg.max_pos)
		die(sl_err(SL_ERANGE, "--prompt-len %d plus --gen-len %d exceeds the model's %d positions",
			   plen, glen, bcfg.max_pos));
	/* --batch max: the budgets must hold one sequence at least */
	sl_job_shape js = job_shape(&co, batch_max ? 1 : batch, (batch_max ? 1 : batch) * plen,
				    plen + glen, plen);
	if (!batch_max && (rc = check_budget(&co, &bcfg, &js)) < 0)
		die(rc);
	if ((rc = open_model(&co, &bcfg, &js, &be, &m)) < 0) {
		budget_hint(rc, &co, &bcfg, be, &js);
		die(rc);
	}
	const sl_opt_config *cfg = &m->cfg;
	if (batch_max) {
		if ((rc = max_batch(m, plen, glen, &batch)) < 0)
			die(rc);
		if (batch == 0) {
			budget_hint(SL_EBUDGET, &co, &bcfg, be, &js);
			die(sl_err_prefix(SL_EBUDGET, "--batch max: not even one sequence fits"));
		}
		js = job_shape(&co, batch, batch * plen, plen + glen, plen);
		if (!json) {
			printf("largest batch that fits: %d\n", batch);
			fflush(stdout);
		}
	}
	sl_kv *kv = NULL;
	int32_t *ids = malloc((size_t)batch * plen * sizeof(int32_t));
	int32_t *next = malloc((size_t)batch * sizeof(int32_t));
	int *npad = calloc((size_t)batch, sizeof(int));
	if (!ids || !next || !npad)
		die(sl_err(SL_ENOMEM, "out of memory"));
	uint64_t r = 0x2545f4914f6cdd1dull * (uint64_t)(seed + 1);
	for (size_t i = 0; i < (size_t)batch * plen; i++) {
		r ^= r << 13, r ^= r >> 7, r ^= r << 17;
		ids[i] = 3 + (int32_t)(r % (uint64_t)(cfg->vocab - 3));
	}
	if ((rc = sl_kv_make(m, batch, plen, plen + glen, &kv)) < 0 ||
	    (rc = sl_model_reserve(m, batch, batch * plen)) < 0) {
		budget_hint(rc, &co, &bcfg, be, &js);
		die(rc);
	}
	/* warm-up: a short prompt, one token (FlexGen's warm-up) */
	computing = true;
	{
		int wl = SL_MIN(8, plen);
		kv->nseq = 1;
		if ((rc = sl_model_prefill(m, kv, ids, npad, wl, NULL)) < 0 ||
		    (rc = bench_next(m, 1, next, 0)) < 0 || (rc = sl_model_decode(m, kv, next)) < 0 ||
		    (rc = bench_next(m, 1, next, 1)) < 0)
			die(rc);
		kv->nseq = batch;
	}
	be->gemm_seconds = be->gemm_flop = 0;
	sl_model_stats_reset(m);
	double t0 = sl_now();
	if ((rc = sl_model_prefill(m, kv, ids, npad, plen, NULL)) < 0 ||
	    (rc = bench_next(m, batch, next, 0)) < 0)
		die(rc);
	double t1 = sl_now();
	/* each phase's breakdown: the prefill and the decode have different
	 * bottlenecks, so the best wall time is the sum of their maxima */
	sl_offload_stats fp;
	sl_model_stats(m, t1 - t0, &fp);
	sl_model_stats_reset(m);
	double pf_gemm_s = be->gemm_seconds, pf_gemm_flop = be->gemm_flop;
	for (int step = 1; step < glen; step++)
		if ((rc = sl_model_decode(m, kv, next)) < 0 || (rc = bench_next(m, batch, next, step)) < 0)
			die(rc);
	double t2 = sl_now();
	double dc_gemm_s = be->gemm_seconds - pf_gemm_s;
	const double prefill_s = t1 - t0, decode_s = t2 - t1;
	const double tput = (double)batch * glen / (prefill_s + decode_s);
	/* bytes of weights streamed per decode step: every layer and the head */
	const double wbytes = (double)m->w.bytes - 2.0 * (cfg->max_pos + 2) * cfg->hidden;
	const double pf_flop = pf_gemm_flop > 0 ? pf_gemm_flop : 0;
	const double pf_gflops = pf_gemm_s > 0 ? pf_flop / pf_gemm_s / 1e9 : 0;
	/* the rate decode streams the weights: their bytes over its wall
	 * time (stalls included: weights on disk arrive at the disk's rate);
	 * and within the GEMMs alone, for the roofline of the kernels */
	const double dc_gbps = glen > 1 && decode_s > 0 ? wbytes * (glen - 1) / decode_s / 1e9 : 0;
	const double dc_gemm_gbps = glen > 1 && dc_gemm_s > 0 ? wbytes * (glen - 1) / dc_gemm_s / 1e9 : 0;
	const int threads = co.threads > 0 ? co.threads : omp_get_max_threads();
	const double mem_gbps = strcmp(be->ops->name, "cpu") ? 0 : sl_profile_mem_read_gbps((size_t)1 << 30, threads);
	/* the offload breakdown (model.h: sl_offload_stats) */
	const double wall = prefill_s + decode_s;
	sl_offload_stats f, fd;
	sl_model_stats(m, decode_s, &fd);
	f = fd; /* the run: both phases */
	f.wall_s = wall;
	f.compute_s += fp.compute_s;
	f.io_s += fp.io_s;
	f.stall_s += fp.stall_s;
	f.disk_read_bytes += fp.disk_read_bytes;
	f.disk_write_bytes += fp.disk_write_bytes;
	f.h2d_bytes += fp.h2d_bytes;
	f.d2h_bytes += fp.d2h_bytes;
	f.disk_read_gbps = f.io_s > 0 ? f.disk_read_bytes / f.io_s / 1e9 : 0;
	const double bound_s = SL_MAX(fp.compute_s, fp.io_s) + SL_MAX(fd.compute_s, fd.io_s);
	const double compute_s = f.compute_s, io_s = f.io_s, stall_s = f.stall_s;
	const double disk_bytes = (double)f.disk_read_bytes, disk_gbps = f.disk_read_gbps;
	const bool disk_used = m->disk || f.peak_disk > 0;
	double probe_gbps = 0;
	char probe_mode[64] = "";
	if (disk_used && sl_disk_probe_read(co.offload_dir, (uint64_t)1 << 30, &probe_gbps, probe_mode,
					  sizeof probe_mode) < 0)
		probe_gbps = 0;
	/* the CPU kernels that ran: their instruction set, the GEMM (sluice's
	 * own, or OpenBLAS's with the core it chose); NULL on CUDA */
	const char *kernels = sl_cpu_backend_kernels(be), *kernels_env = getenv("SLUICE_CPU_KERNELS");
	if (kernels_env && !*kernels_env)
		kernels_env = NULL; /* empty: unset, as the backend reads it */
	const char *gemm = sl_cpu_backend_gemm(be), *blas_config = NULL, *blas_core = NULL;
	if (gemm && !strcmp(gemm, "openblas"))
		sl_cpu_backend_blas_info(&blas_config, &blas_core);
	const char *coretype = getenv("OPENBLAS_CORETYPE"), *l2_size = getenv("OPENBLAS_L2_SIZE");
	if (json) {
		sl_jerr e = { 0 };
		json_t *j = json_object(), *peak = json_object(), *benv = json_object();
		sl_jset(j, "system", json_string("sluice"), &e);
		sl_jset(j, "version", json_string(SL_VERSION), &e);
		sl_jset(j, "model", json_text(co.model_dir ? co.model_dir : cfg->name), &e);
		sl_jset(j, "model_name", json_text(cfg->name), &e);
		sl_jset(j, "backend", json_string(be->ops->name), &e);
		sl_jset(j, "threads", json_integer(threads), &e);
		sl_jset(j, "prompt_len", json_integer(plen), &e);
		sl_jset(j, "gen_len", json_integer(glen), &e);
		sl_jset(j, "batch", json_integer(batch), &e);
		const sl_policy *pp = &co.policy;
		sl_jset_real(j, "w_gpu_percent", pp->w_gpu_percent, &e);
		sl_jset_real(j, "w_cpu_percent", pp->w_cpu_percent, &e);
		sl_jset_real(j, "cache_gpu_percent", pp->cache_gpu_percent, &e);
		sl_jset_real(j, "cache_cpu_percent", pp->cache_cpu_percent, &e);
		sl_jset_real(j, "act_gpu_percent", pp->act_gpu_percent, &e);
		sl_jset_real(j, "act_cpu_percent", pp->act_cpu_percent, &e);
		sl_jset(j, "cpu_cache_compute", json_boolean(pp->cpu_cache_compute), &e);
		sl_jset(j, "overlap", json_boolean(pp->overlap), &e);
		sl_jset(j, "sep_layer", json_boolean(pp->sep_layer), &e);
		sl_jset_real(j, "hh_ratio", pp->hh_ratio, &e);
		sl_jset_real(j, "recent_ratio", m->recent_ratio, &e);
		sl_jset_real(j, "prefill_s", prefill_s, &e);
		sl_jset_real(j, "decode_s", decode_s, &e);
		sl_jset_real(j, "wall_s", wall, &e);
		sl_jset_real(j, "throughput_tok_s", tput, &e);
		sl_jset_real(j, "compute_s", compute_s, &e);
		sl_jset_real(j, "io_s", io_s, &e);
		sl_jset_real(j, "stall_s", stall_s, &e);
		sl_jset_real(j, "prefill_compute_s", fp.compute_s, &e);
		sl_jset_real(j, "prefill_io_s", fp.io_s, &e);
		sl_jset_real(j, "decode_compute_s", fd.compute_s, &e);
		sl_jset_real(j, "decode_io_s", fd.io_s, &e);
		sl_jset_real(j, "phase_bound_s", bound_s, &e);
		sl_jset(j, "h2d_bytes", json_integer((json_int_t)f.h2d_bytes), &e);
		sl_jset(j, "d2h_bytes", json_integer((json_int_t)f.d2h_bytes), &e);
		sl_jset(j, "disk_read_bytes", json_integer((json_int_t)f.disk_read_bytes), &e);
		sl_jset_real(j, "disk_read_gbps", disk_gbps, &e);
		sl_jset_real(j, "probe_read_gbps", probe_gbps, &e);
		sl_jset(j, "disk_write_bytes", json_integer((json_int_t)f.disk_write_bytes), &e);
		sl_jset_real(j, "gemm_gflops", pf_gflops, &e);
		sl_jset_real(j, "decode_weight_gbps", dc_gbps, &e);
		sl_jset_real(j, "decode_gemm_weight_gbps", dc_gemm_gbps, &e);
		sl_jset_real(j, "mem_read_gbps", mem_gbps, &e);
		sl_jset(j, "weight_bytes", json_integer((json_int_t)wbytes), &e);
		sl_jset(peak, "device", json_integer((json_int_t)f.peak_device), &e);
		sl_jset(peak, "host", json_integer((json_int_t)f.peak_host), &e);
		sl_jset(peak, "disk", json_integer((json_int_t)f.peak_disk), &e);
		sl_jset(j, "peak_bytes", peak, &e);
		sl_jset(j, "peak_device_bytes", json_integer((json_int_t)f.peak_device), &e);
		sl_jset(j, "cpu_kernels", kernels ? json_string(kernels) : json_null(), &e);
		sl_jset(j, "cpu_kernels_env", kernels_env ? json_text(kernels_env) : json_null(), &e);
		sl_jset(j, "cpu_gemm", gemm ? json_string(gemm) : json_null(), &e);
		sl_jset(j, "blas_core", blas_core ? json_text(blas_core) : json_null(), &e);
		sl_jset(j, "blas_config", blas_config ? json_text(blas_config) : json_null(), &e);
		sl_jset(benv, "OPENBLAS_CORETYPE", coretype ? json_text(coretype) : json_null(), &e);
		sl_jset(benv, "OPENBLAS_L2_SIZE", l2_size ? json_text(l2_size) : json_null(), &e);
		sl_jset(j, "blas_env", benv, &e);
		if ((rc = sl_jcheck(&e, "bench --json")) == 0)
			rc = sl_jwrite_line(j, stdout, "bench --json: standard output");
		json_decref(j);
		if (rc < 0)
			die(rc);
	} else {
		printf("model %s on %s (%d thread%s): prompt %d, gen %d, batch %d\n",
		       co.model_dir ? co.model_dir : cfg->name, be->ops->name, threads,
		       threads == 1 ? "" : "s", plen, glen, batch);
		if (kernels && blas_core)
			printf("  CPU kernels     %s%s%s; GEMM: %s, %s core%s%s%s (not batch invariant)\n",
			       kernels, kernels_env ? ", SLUICE_CPU_KERNELS=" : "", kernels_env ? kernels_env : "",
			       blas_config, blas_core, coretype ? " (OPENBLAS_CORETYPE=" : "",
			       coretype ? coretype : "", coretype ? ")" : "");
		else if (kernels)
			printf("  CPU kernels     %s%s%s; GEMM: sluice's own (batch invariant)\n", kernels,
			       kernels_env ? ", SLUICE_CPU_KERNELS=" : "", kernels_env ? kernels_env : "");
		printf("  throughput      %10.2f tokens/s\n", tput);
		printf("  prefill         %10.3f s   (GEMM %.1f GFLOP/s)\n", prefill_s, pf_gflops);
		printf("  decode          %10.3f s   (%d step%s; weights streamed at %.2f GB/s, %.2f GB/s within the GEMMs)\n",
		       decode_s, glen - 1, glen - 1 == 1 ? "" : "s", dc_gbps, dc_gemm_gbps);
		if (mem_gbps > 0)
			printf("  memory read     %10.1f GB/s  (decode roofline: %.0f%% reached)\n", mem_gbps,
			       100.0 * dc_gbps / mem_gbps);
		printf("  device peak     %10.1f MiB;  host peak %.1f MiB\n", be->dev_peak / 1048576.0,
		       be->host_peak / 1048576.0);
		const sl_policy *pp = &co.policy;
		if (m->w.streamed || pp->cache_gpu_percent < 100 || m->act_host) {
			printf("  weights         %g%% device, %g%% host, the rest on disk; overlap %s\n",
			       pp->w_gpu_percent, pp->w_cpu_percent, pp->overlap ? "on" : "off");
			printf("  KV cache        %g%% device, %g%% host, the rest on disk%s\n",
			       pp->cache_gpu_percent, pp->cache_cpu_percent,
			       pp->cpu_cache_compute ? "; attention over the host tier in place" : "");
			printf("  activations     on the %s\n", m->act_host ? "host" : "device");
			printf("  compute         %10.3f s\n  stall           %10.3f s  (waiting for weights or cache)\n",
			       compute_s, stall_s);
			if (f.h2d_bytes || f.d2h_bytes)
				printf("  host <-> device %10.2f GB in, %.2f GB out\n", f.h2d_bytes / 1e9,
				       f.d2h_bytes / 1e9);
			if (disk_used)
				printf("  disk            %10.3f s busy, %.2f GB read at %.2f GB/s (O_DIRECT probe %.2f GB/s, %s: %.0f%%), %.2f GB written\n"
				       "  overlap         %10.2f  (max(compute, io) / wall; per phase, sum of max / wall: %.2f)\n",
				       io_s, disk_bytes / 1e9, disk_gbps, probe_gbps, probe_mode,
				       probe_gbps > 0 ? 100 * disk_gbps / probe_gbps : 0,
				       f.disk_write_bytes / 1e9, SL_MAX(compute_s, io_s) / wall, bound_s / wall);
		}
	}
	sl_kv_free(m, kv);
	free(ids);
	free(next);
	free(npad);
	sl_model_free(m);
	sl_backend_free(be);
	return 0;
}

/* ---- profile ------------------------------------------------------------ */

static const char profile_help[] =
	"usage: sluice profile [--offload-dir DIR] [--backend B] [--threads N] [--json FILE] [--quick]\n"
	"The machine for the cost model: NUMA nodes, cores, the GPU and its node, where\n"
	"pinned memory and the disk's I/O threads go; then host memory read GB/s, CPU\n"
	"GEMM GFLOP/s, the disk's O_DIRECT read GB/s in DIR and, with a GPU, pinned\n"
	"copy GB/s and GPU GEMM TFLOP/s.  A few seconds (--quick: well under one).\n"
	"  --offload-dir DIR    measure sequential reads there (1 GiB, removed after)\n"
	"  --backend B          cpu, cuda or auto (default: cuda where a GPU is found)\n"
	"  --threads N          CPU threads, 1 to the cores available (default: all cores)\n"
	"  --json FILE          also write the results as one JSON object (atomically)\n"
	"  --quick              small sizes: a check that it runs, not a measurement\n" EXIT_HELP;

static int cmd_profile(int argc, char **argv)
{
	sl_profile_opts po = { .backend = "auto", .log = stdout };
	const char *json_path = NULL;
	enum { P_OFFLOAD = 1, P_BACKEND, P_THREADS, P_JSON, P_QUICK };
	static const struct option opts[] = {
		{ "offload-dir", required_argument, 0, P_OFFLOAD },
		{ "backend", required_argument, 0, P_BACKEND },
		{ "threads", required_argument, 0, P_THREADS },
		{ "json", required_argument, 0, P_JSON },
		{ "quick", no_argument, 0, P_QUICK },
		{ "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	int c;
	while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
		switch (c) {
		case P_OFFLOAD: po.offload_dir = optarg; break;
		case P_BACKEND: po.backend = optarg; break;
		case P_THREADS: po.threads = parse_threads("profile", optarg); break;
		case P_JSON: json_path = optarg; break;
		case P_QUICK: po.quick = true; break;
		case 'h': fputs(profile_help, stdout); return 0;
		default: bad_option("profile", c, argv);
		}
	}
	if (optind < argc)
		usage_error("profile", "unexpected argument '%s'", argv[optind]);
	if (po.threads > 0)
		omp_set_num_threads(po.threads);
	int rc;
	if (json_path && (rc = sl_profile_check_json_path(json_path)) < 0)
		die(rc);
	if (po.offload_dir && (rc = sl_profile_check_offload_dir(po.offload_dir)) < 0)
		die(rc);
	computing = true;
	sl_profile p;
	if ((rc = sl_profile_run(&po, &p)) < 0 || (json_path && (rc = sl_profile_save_json(&p, json_path)) < 0))
		die(rc);
	return 0;
}

static const char main_help[] =
	"usage: sluice <command> [options]\n"
	"  generate   batch generation from a JSON Lines file of prompts\n"
	"  score      log-probabilities of continuations\n"
	"  bench      throughput on synthetic prompts\n"
	"  profile    the machine's topology and rates, for the cost model\n"
	"  convert    write, list or remove the weights' disk stores of an offload folder\n"
	"  version    print the version and the backends built in\n"
	"'sluice <command> --help' describes each command.\n" EXIT_HELP;

/*
 * libgomp reads OMP_WAIT_POLICY once, when it loads.  Its default spinning
 * workers slow the thread doing serial work wherever cores are shared (SMT
 * siblings, VMs): measured on a 2-vCPU VM, opt-125m ran 50 tokens/s with
 * passive waiting and 12 with spinning.  So when the user has not chosen a
 * policy, sluice chooses passive and re-executes itself once.
 */
static void prefer_passive_wait(char **argv)
{
	if (getenv("OMP_WAIT_POLICY"))
		return;
	setenv("OMP_WAIT_POLICY", "passive", 1);
	execv("/proc/self/exe", argv);
	/* if that fails, run on with the default policy */
}

int cmd_convert(int argc, char **argv);

int main(int argc, char **argv)
{
	prefer_passive_wait(argv);
	/* past a file-size limit a write fails with EFBIG and a message that
	 * names the file, rather than killing the process mid-write */
	signal(SIGXFSZ, SIG_IGN);
	if (argc < 2) {
		fputs(main_help, stderr);
		return EXIT_USAGE;
	}
	const char *cmd = argv[1];
	argv[1] = argv[0];
	argc--;
	argv++;
	if (!strcmp(cmd, "generate"))
		return cmd_generate(argc, argv);
	if (!strcmp(cmd, "bench"))
		return cmd_bench(argc, argv);
	if (!strcmp(cmd, "score"))
		return cmd_score(argc, argv);
	if (!strcmp(cmd, "profile"))
		return cmd_profile(argc, argv);
	if (!strcmp(cmd, "convert"))
		return cmd_convert(argc, argv); /* tools/cmd_convert.c */
	if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
		printf("sluice %s (backends: cpu%s)\n", SL_VERSION,
		       sl_backend_cuda_built() ? ", cuda" : "");
		return 0;
	}
	if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
		fputs(main_help, stdout);
		return 0;
	}
	fprintf(stderr, "sluice: unknown command '%s' (see 'sluice --help')\n", cmd);
	return EXIT_USAGE;
}
