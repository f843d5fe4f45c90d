/*
 * cli.h - what the commands of the command line share (tools/cli_common.c:
 * the exit status, option parsing, opening the model under the budgets;
 * tools/cli_job.c: the options and the run of the two job commands,
 * generate and score).  One file per command: tools/cmd_<command>.c.
 */
#ifndef SL_CLI_H
#define SL_CLI_H

#include "backend.h"
#include "cost.h"
#include "job.h"
#include "model.h"
#include "policy.h"
#include "search.h"

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>

#define EXIT_USAGE 2
#define EXIT_INTERRUPTED 130

#define EXIT_HELP                                                                          \
	"Exit status: 0 done; 2 the command is wrong (an option, the input, policy or model\n" \
	"file, a budget too small), found before anything ran; 1 the job failed (it ran and\n" \
	"failed, a read or write error, out of memory, the device, an internal error);\n"     \
	"130 interrupted.\n"

/* Set once compute has started: from then on any failure is the job's
 * (cli_common.c: exit_status). */
extern bool computing;

/* One line on stderr and the exit status of the recorded error (sl_errmsg). */
void die(int rc);
/* "sluice CMD: <fmt with arg> (see 'sluice CMD --help')" and exit 2. */
void usage_error(const char *cmd, const char *fmt, const char *arg);
void bad_option(const char *cmd, int c, char **argv);
int parse_int(const char *cmd, const char *opt, const char *s, int lo, int hi);
/* A number in [lo, hi], or above lo and at most hi where lo_open; else one
 * line naming opt and exit 2. */
double parse_real(const char *cmd, const char *opt, const char *s, double lo, bool lo_open, double hi);
int parse_threads(const char *cmd, const char *s);
/* --cpu-gemm's value, one of sluice, openblas, amx, bf16 (else a usage
 * error); whether this CPU and build have it is the backend's to say. */
const char *parse_cpu_gemm(const char *cmd, const char *s);
size_t parse_budget(const char *cmd, const char *opt, const char *s);

/* Options every command shares. */
typedef struct common_opts {
	const char *model_dir, *dummy, *backend;
	const char *cpu_gemm; /* --cpu-gemm: sluice (default), openblas, amx or bf16 */
	int threads;
	size_t gpu_mem, cpu_mem;
	bool kv_f32;
	int argc;
	char **argv;
	sl_policy policy;
	bool policy_given; /* a policy file or flag: its batch is the block size */
	const char *offload_dir;
	/* --profile FILE: the hardware profile the predictions and --policy
	 * auto's search read (loaded as the option is parsed) */
	const char *profile_path;
	sl_profile profile;
	const char *profile_src; /* the run's: profile_path, "cached" or "measured" */
	/* --policy auto: the search chooses the policy for the job's shapes;
	 * the policy flags given pin their fields ("field=value") */
	bool policy_auto;
	int nfix;
	char fix[SL_SEARCH_MAX_FIX][48];
	bool hh_given; /* --hh-ratio: the search keeps it (SL_H2O_FIXED) */
	double margin;     /* --margin: the search's (sl_search_params) */
	bool margin_given;
	/* the zstd weight store the job reads (find_zstd_store): its ratio
	 * (0: plain) and window; job_plan passes them to the plan, which
	 * counts its buffers, and to the cost model */
	double w_zstd;
	uint32_t w_zstd_window;
	/* set by a signal handler (the job commands'): open_model's loading
	 * stops on it */
	const volatile sig_atomic_t *interrupt;
} common_opts;

enum { OPT_DUMMY = 1000, OPT_BACKEND, OPT_THREADS, OPT_GPU_MEM, OPT_OVERWRITE, OPT_JSON,
       OPT_PROMPT_LEN, OPT_GEN_LEN, OPT_QUIET, OPT_SEED, OPT_KV_DTYPE, OPT_POLICY, OPT_PERCENT,
       OPT_GBS, OPT_NGB, OPT_OFFLOAD_DIR, OPT_CPU_MEM, OPT_NO_OVERLAP, OPT_CPU_CACHE_COMPUTE,
       OPT_HH_RATIO, OPT_RECENT_RATIO, OPT_CPU_GEMM, OPT_PROFILE, OPT_COMPRESS_CACHE,
       OPT_COMPRESS_WEIGHT, OPT_MARGIN };

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
		{ "compress-cache", no_argument, 0, OPT_COMPRESS_CACHE },                      \
		{ "compress-weight", no_argument, 0, OPT_COMPRESS_WEIGHT },                    \
		{ "hh-ratio", required_argument, 0, OPT_HH_RATIO },                            \
		{ "recent-ratio", required_argument, 0, OPT_RECENT_RATIO },                    \
		{ "margin", required_argument, 0, OPT_MARGIN },                                \
		{ "profile", required_argument, 0, OPT_PROFILE }

#define COMMON_HELP                                                                          \
	"  --model DIR          Hugging Face OPT checkpoint (config.json + safetensors)\n"  \
	"  --dummy NAME         deterministic random weights of a named shape instead\n"    \
	"                       (opt-125m, -350m, -1.3b, -2.7b, -6.7b, -13b, -30b, -66b, -175b)\n" \
	"  --backend B          cpu, cuda or auto (default: cuda where a GPU is found)\n"   \
	"  --threads N          CPU threads, 1 to the cores available (default: all cores)\n" \
	"  --cpu-gemm sluice|openblas|amx|bf16  the CPU backend's matrix products:\n" \
	"                       sluice's own (default: a sequence's tokens do not depend\n" \
	"                       on the batch), OpenBLAS's sgemm (faster on some CPUs),\n" \
	"                       or the prefill in bf16 (bf16's precision) on Intel AMX\n" \
	"                       tiles (amx: several times faster) or with AVX512-BF16\n" \
	"                       dot products (bf16: AMD Zen 4, Intel Cooper Lake and\n" \
	"                       later; up to twice as fast); the last three are not\n" \
	"                       batch invariant\n" \
	"  --gpu-mem BYTES      cap on device memory, above 0 (e.g. 16G; K, M, G, T)\n"      \
	"  --kv-dtype f16|f32   KV cache precision (default f16; f32 doubles its size)\n"  \
	"  --cpu-mem BYTES      cap on pinned host memory, above 0 (e.g. 64G)\n"            \
	"  --policy FILE        placement and batching policy (JSON; docs/policy.md);\n"   \
	"                       flags after it override its fields\n"                       \
	"  --policy auto        the policy search chooses one for this job's shapes and\n"  \
	"                       budgets, says it on stderr and runs it; policy flags\n"      \
	"                       pin their fields\n"                                          \
	"  --margin F           --policy auto: among candidates predicted within F of\n"   \
	"                       the fastest, the simplest (sluice policy --help; default\n" \
	"                       0.01)\n"                                                     \
	"  --percent WG WC CG CC AG AC  FlexGen's six placement percentages (weights,\n"  \
	"                       cache, activations on GPU and CPU; the rest on disk)\n"     \
	"  --gpu-batch-size N, --num-gpu-batches N  the policy's block: N x N prompts\n"   \
	"  --offload-dir DIR    the disk tier's folder (weights or KV cache on disk)\n"     \
	"  --no-overlap         load each layer's weights and each step's cache when\n"    \
	"                       needed instead of prefetching the next\n"                   \
	"  --cpu-cache-compute  decode attention over the host-tier KV cache where it\n"   \
	"                       lives, on the CPU, without copying the cache\n"            \
	"  --compress-cache     4-bit group-wise KV cache (policy compress_cache): 4.5\n"  \
	"                       bits a value instead of 16, in every tier\n"              \
	"  --compress-weight    4-bit group-wise weights (policy compress_weight): each\n"  \
	"                       layer's matrices quantised once at load, 4.5 bits a\n"     \
	"                       value, moved and kept so in every tier\n"                  \
	"  --hh-ratio H         H2O: keep floor(H x prompt) heavy-hitter tokens (0: off)\n" \
	"  --recent-ratio R     H2O: and floor(R x prompt) recent ones (default: H)\n"      \
	"  --profile FILE       a hardware profile (sluice profile --json): the run's\n"    \
	"                       predicted times beside the measured ones, and --policy\n"   \
	"                       auto's search (default: this machine's cached profile;\n"   \
	"                       --policy auto measures and caches one where there is none)\n"

void common_init(common_opts *o);
bool common_opt(const char *cmd, int c, common_opts *o);
void check_model_opts(const char *cmd, const common_opts *o);
sl_plan_params job_plan(const common_opts *o, int nseq, int rows, int max_len, int max_prompt);
int find_zstd_store(common_opts *o);
int model_config(const common_opts *o, sl_model_config *cfg);
int make_backend(const common_opts *o, sl_backend **be);
int open_model(const common_opts *o, const sl_model_config *cfg, const sl_plan_params *pp,
	       sl_backend **be, sl_model **m);
int check_budget(const common_opts *o, const sl_model_config *cfg, const sl_plan_params *pp, bool dev_is_host);
void budget_hint(int rc, const common_opts *o, const sl_model_config *cfg, const sl_backend *be,
		 const sl_plan_params *pp);
void fmt_bytes(size_t n, char *buf, size_t len);
/* The machine's memory (/proc/meminfo MemTotal; 0 when unknown): the
 * budget a search assumes where none is given. */
size_t default_mem_budget(void);
/* Free bytes in the file system holding dir (statvfs's f_bavail), or
 * SL_EIO naming dir where it cannot be read. */
int dir_free_bytes(const char *dir, size_t *out);

/* ---- predictions and --policy auto (cli_auto.c) ------------------------ */

/* The profile for this run on the backend named backend: --profile's
 * (checked to be that backend's); else this machine's cached one
 * (sl_profile_obtain), measured and cached where there is none only when
 * measure (*have false when none); o->profile_src says which.  cfg (may
 * be NULL): the model, whose own GEMM shapes a profile measured here
 * includes (one cached without them is measured again when measure).
 * Returns SL_PROFILE_NOT_CACHED when it measured one it could not cache. */
int cli_profile(common_opts *o, const sl_model_config *cfg, const char *backend, bool measure,
		sl_profile *prof, bool *have);
/* 0 when the profile p (read from path) measured the CPU products with
 * the GEMM cpu_gemm names (--cpu-gemm; a file before the field: sluice's)
 * or the backend is not the CPU's; else SL_EINVAL saying which. */
int profile_gemm_matches(const char *path, const sl_profile *p, const char *backend, const char *cpu_gemm);
/* --policy auto: search with the job's shapes (its longest prompt and
 * gen_len new tokens, at most max_batch sequences a block) and the
 * options' budgets, under the profile cli_profile gives (measured when
 * none), left in *prof; o->policy becomes the choice (policy_given), the
 * choice is said on stderr unless quiet. */
int policy_auto(common_opts *o, const sl_model_config *cfg, const char *backend, int prompt_len,
		int gen_len, int max_batch, bool quiet, sl_profile *prof);
/* The prediction of a job of pp's workload (pp->max_seq sequences,
 * prompt_len, gen_len) under prof. */
int predict_run(const sl_model_config *cfg, const sl_plan_params *pp, bool dev_is_host,
		const sl_profile *prof, int prompt_len, int gen_len, sl_cost *out);

/* ---- generate and score (cli_job.c) ----------------------------------- */

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

bool job_opt(const char *cmd, int c, job_cli *j);
/* Check, open, run and report a generate (score false) or score job. */
int run_job(const char *cmd, job_cli *j, bool score);

/* ---- the commands (cmd_<command>.c) ----------------------------------- */

/* sluice profile --fit: one run of sluice bench (its warm-up, then the
 * timed prefill and decode) of the dummy model name with everything on the
 * backend's device, batch prompts of plen tokens, glen new tokens each, in
 * micro-batches of micro sequences (0: one block); the measured prefill and
 * decode seconds, and the cost model's under prof and (alt not NULL) alt
 * (cmd_bench.c). */
typedef struct bench_fit_job {
	int batch, micro, plen, glen;
} bench_fit_job;
int bench_fit_run(const char *backend, int threads, const char *name, const bench_fit_job *job,
		  const sl_profile *prof, const sl_profile *alt, double measured[2], double predicted[2],
		  double alt_predicted[2]);

int cmd_generate(int argc, char **argv);
int cmd_score(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_profile(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_policy(int argc, char **argv);

#endif
