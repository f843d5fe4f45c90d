/*
 * sluice.c - the command line: `sluice generate` runs a batch generation
 * job from JSON Lines, `sluice bench` measures throughput on synthetic
 * prompts.  Every failure prints one line naming what failed and exits
 * non-zero (1 for a failed job, 2 for a usage error).
 */
#include "backend.h"
#include "generate.h"
#include "jsonl.h"
#include "model.h"
#include "sl_config.h"

#include <getopt.h>
#include <immintrin.h>
#include <unistd.h>
#include <omp.h>
#include <string.h>

#define EXIT_USAGE 2

static void die(int rc)
{
	fprintf(stderr, "sluice: %s\n", sl_errmsg());
	exit(rc == SL_EINVAL ? EXIT_USAGE : EXIT_FAILURE);
}

static void usage_error(const char *cmd, const char *fmt, const char *arg)
{
	fprintf(stderr, "sluice %s: ", cmd);
	fprintf(stderr, fmt, arg);
	fprintf(stderr, " (see 'sluice %s --help')\n", cmd);
	exit(EXIT_USAGE);
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

/* Options every command shares. */
typedef struct common_opts {
	const char *model_dir, *dummy, *backend;
	int threads;
	size_t gpu_mem;
	bool kv_f32;
} common_opts;

enum { OPT_DUMMY = 1000, OPT_BACKEND, OPT_THREADS, OPT_GPU_MEM, OPT_OVERWRITE, OPT_JSON,
       OPT_PROMPT_LEN, OPT_GEN_LEN, OPT_QUIET, OPT_SEED, OPT_KV_DTYPE };

static bool common_opt(const char *cmd, int c, common_opts *o)
{
	switch (c) {
	case 'm': o->model_dir = optarg; return true;
	case OPT_DUMMY: o->dummy = optarg; return true;
	case OPT_BACKEND: o->backend = optarg; return true;
	case OPT_THREADS: o->threads = parse_int(cmd, "--threads", optarg, 0, 4096); return true;
	case OPT_GPU_MEM:
		if (sl_parse_size(optarg, &o->gpu_mem) < 0)
			usage_error(cmd, "--gpu-mem: %s", sl_errmsg());
		return true;
	case OPT_KV_DTYPE:
		if (strcmp(optarg, "f16") && strcmp(optarg, "f32"))
			usage_error(cmd, "--kv-dtype must be f16 or f32, got '%s'", optarg);
		o->kv_f32 = !strcmp(optarg, "f32");
		return true;
	default: return false;
	}
}

static void check_model_opts(const char *cmd, const common_opts *o)
{
	if (!!o->model_dir == !!o->dummy)
		usage_error(cmd, "%sgive exactly one of --model DIR and --dummy NAME", "");
}

/* Backend and model; on failure both are released and *be, *m are NULL. */
static int open_model(const common_opts *o, sl_backend **be, sl_model **m)
{
	*m = NULL;
	int threads = o->threads;
	if (threads > 0)
		omp_set_num_threads(threads);
	int rc = sl_backend_create(o->backend, threads, be);
	if (rc < 0)
		return rc;
	sl_backend_set_dev_limit(*be, o->gpu_mem);
	rc = sl_model_open(*be, o->model_dir, o->dummy, m);
	if (rc < 0) {
		sl_backend_free(*be);
		*be = NULL;
		return rc;
	}
	(*m)->kv_f32 = o->kv_f32;
	return 0;
}

#define COMMON_LONG_OPTS                                                                   \
	{ "model", required_argument, 0, 'm' }, { "dummy", required_argument, 0, OPT_DUMMY }, \
		{ "backend", required_argument, 0, OPT_BACKEND },                              \
		{ "threads", required_argument, 0, OPT_THREADS },                              \
		{ "gpu-mem", required_argument, 0, OPT_GPU_MEM },                              \
		{ "kv-dtype", required_argument, 0, OPT_KV_DTYPE }

#define COMMON_HELP                                                                          \
	"  --model DIR          Hugging Face OPT checkpoint (config.json + safetensors)\n"  \
	"  --dummy NAME         deterministic random weights of a named shape instead\n"    \
	"                       (opt-125m, -350m, -1.3b, -2.7b, -6.7b, -13b, -30b, -66b, -175b)\n" \
	"  --backend B          cpu, cuda or auto (default: cuda where a GPU is found)\n"   \
	"  --threads N          CPU threads (default: all cores)\n"                        \
	"  --gpu-mem BYTES      cap on device memory (e.g. 16G)\n"                          \
	"  --kv-dtype f16|f32   KV cache precision (default f16; f32 doubles its size)\n"

/* ---- generate ----------------------------------------------------------- */

static const char generate_help[] =
	"usage: sluice generate (--model DIR | --dummy NAME) --prompts IN.jsonl --out OUT.jsonl\n"
	"                       [--max-new-tokens N] [--batch-size B] [--overwrite] [--quiet]\n"
	"Greedy batch generation.  Each input line is {\"input_ids\": [...], \"id\": ...};\n"
	"each output line, in input order, is {\"id\": ..., \"output_ids\": [new tokens]}.\n"
	"A sequence ends at EOS (kept as its last token) or after N new tokens.\n" COMMON_HELP
	"  --prompts FILE       input JSON Lines\n"
	"  --out FILE           output JSON Lines (written whole or not at all)\n"
	"  --max-new-tokens N   new tokens per prompt (default 32; a line's\n"
	"                       \"max_new_tokens\" overrides it)\n"
	"  --batch-size B       prompts per block (default 8)\n"
	"  --overwrite          replace an existing output file\n"
	"  --quiet              no summary on stderr\n";

static int cmd_generate(int argc, char **argv)
{
	common_opts co = { .backend = "auto" };
	const char *in = NULL, *outp = NULL;
	int max_new = 32, batch = 8;
	bool overwrite = false, quiet = false;
	static const struct option opts[] = {
		COMMON_LONG_OPTS,
		{ "prompts", required_argument, 0, 'p' },
		{ "out", required_argument, 0, 'o' },
		{ "max-new-tokens", required_argument, 0, 'n' },
		{ "batch-size", required_argument, 0, 'b' },
		{ "overwrite", no_argument, 0, OPT_OVERWRITE },
		{ "quiet", no_argument, 0, OPT_QUIET },
		{ "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	int c;
	while ((c = getopt_long(argc, argv, "m:p:o:n:b:h", opts, NULL)) != -1) {
		if (common_opt("generate", c, &co))
			continue;
		switch (c) {
		case 'p': in = optarg; break;
		case 'o': outp = optarg; break;
		case 'n': max_new = parse_int("generate", "--max-new-tokens", optarg, 1, 1 << 20); break;
		case 'b': batch = parse_int("generate", "--batch-size", optarg, 1, 1 << 16); break;
		case OPT_OVERWRITE: overwrite = true; break;
		case OPT_QUIET: quiet = true; break;
		case 'h': fputs(generate_help, stdout); return 0;
		default: fputs(generate_help, stderr); return EXIT_USAGE;
		}
	}
	if (optind < argc)
		usage_error("generate", "unexpected argument '%s'", argv[optind]);
	if (!in || !outp)
		usage_error("generate", "%s", "--prompts and --out are required");
	check_model_opts("generate", &co);

	/* everything that can be checked before compute is checked first */
	sl_output *out = NULL;
	int rc = sl_output_open(outp, overwrite, &out);
	if (rc < 0)
		die(rc);
	sl_backend *be = NULL;
	sl_model *m = NULL;
	sl_prompts ps;
	if ((rc = open_model(&co, &be, &m)) < 0)
		goto fail;
	if ((rc = sl_prompts_read(in, m->cfg.vocab, &ps)) < 0)
		goto fail;
	int max_len = 0, max_out = 0;
	for (int i = 0; i < ps.n; i++) {
		int want = ps.p[i].max_new ? ps.p[i].max_new : max_new;
		if (ps.p[i].n + want > m->cfg.max_pos) {
			rc = sl_err(SL_ERANGE,
				    "%s:%d: prompt of %d tokens plus %d new tokens exceeds the model's %d positions",
				    in, ps.p[i].line, ps.p[i].n, want, m->cfg.max_pos);
			goto fail_ps;
		}
		max_len = SL_MAX(max_len, ps.p[i].n + want);
		max_out = SL_MAX(max_out, want);
	}
	batch = SL_MIN(batch, ps.n);
	sl_generator *g = NULL;
	if ((rc = sl_generator_create(m, batch, max_len, &g)) < 0)
		goto fail_ps;
	sl_seq *seqs = calloc((size_t)batch, sizeof *seqs);
	int32_t *obuf = malloc((size_t)batch * max_out * sizeof(int32_t));
	if (!seqs || !obuf) {
		rc = sl_err(SL_ENOMEM, "out of memory");
		goto fail_gen;
	}
	sl_gen_timing tm = { 0 };
	double t0 = sl_now();
	for (int b0 = 0; b0 < ps.n; b0 += batch) {
		int nb = SL_MIN(batch, ps.n - b0);
		for (int s = 0; s < nb; s++) {
			const sl_prompt *p = &ps.p[b0 + s];
			seqs[s] = (sl_seq){ .prompt = p->ids, .prompt_len = p->n,
					    .max_new = p->max_new ? p->max_new : max_new,
					    .out = obuf + (size_t)s * max_out };
		}
		if ((rc = sl_generator_run(g, seqs, nb, &tm)) < 0)
			goto fail_gen;
		for (int s = 0; s < nb; s++)
			if ((rc = sl_output_write(out, &ps.p[b0 + s], seqs[s].out, seqs[s].n_out)) < 0)
				goto fail_gen;
	}
	if ((rc = sl_output_commit(out)) < 0)
		goto fail_gen;
	double wall = sl_now() - t0;
	if (!quiet)
		fprintf(stderr,
			"sluice: %d prompts, %ld new tokens in %.2f s (%.1f tokens/s; prefill %.2f s, decode %.2f s) on %s\n",
			ps.n, tm.tokens, wall, tm.tokens / (tm.prefill_s + tm.decode_s), tm.prefill_s,
			tm.decode_s, be->ops->name);
	free(seqs);
	free(obuf);
	sl_generator_free(g);
	sl_prompts_free(&ps);
	sl_output_free(out);
	sl_model_free(m);
	sl_backend_free(be);
	return 0;
fail_gen:
	free(seqs);
	free(obuf);
	sl_generator_free(g);
fail_ps:
	sl_prompts_free(&ps);
fail:
	sl_output_free(out); /* removes the partial file */
	sl_model_free(m);
	sl_backend_free(be);
	die(rc);
	return 1;
}

/* ---- bench ------------------------------------------------------------ */

static const char bench_help[] =
	"usage: sluice bench (--dummy NAME | --model DIR) [--prompt-len P] [--gen-len G]\n"
	"                    [--batch B] [--json]\n"
	"Throughput on B synthetic prompts of P tokens, G new tokens each (EOS ignored),\n"
	"after a short warm-up.  tokens/s = B*G / (prefill + decode), FlexGen's metric.\n" COMMON_HELP
	"  --prompt-len P       default 128\n"
	"  --gen-len G          default 32\n"
	"  --batch B            default 8\n"
	"  --seed S             prompt ids (default 1)\n"
	"  --json               one JSON object on stdout instead of the table\n";

/* Read bandwidth of this machine's memory, measured by summing a buffer
 * larger than the caches with every thread: the decode roofline. */
__attribute__((target("avx2")))
static double sum_block(const float *p, size_t n)
{
	__m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
	for (size_t i = 0; i + 32 <= n; i += 32) {
		a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
		a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
		a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
		a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
	}
	float l[8];
	_mm256_storeu_ps(l, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
	return (double)l[0] + l[1] + l[2] + l[3] + l[4] + l[5] + l[6] + l[7];
}

static double measure_read_gbps(int threads)
{
	if (!__builtin_cpu_supports("avx2"))
		return 0;
	const size_t n = (size_t)256 << 20, blk = (size_t)1 << 16; /* 1 GiB of floats */
	float *buf = sl_aligned_alloc(n * sizeof(float));
	if (!buf)
		return 0;
#pragma omp parallel for num_threads(threads) schedule(static)
	for (size_t i = 0; i < n; i++)
		buf[i] = (float)(i & 7);
	double best = 0, sink = 0;
	for (int rep = 0; rep < 3; rep++) {
		double t0 = sl_now(), s = 0;
#pragma omp parallel for num_threads(threads) schedule(static) reduction(+ : s)
		for (size_t b = 0; b < n / blk; b++)
			s += sum_block(buf + b * blk, blk);
		double dt = sl_now() - t0;
		sink += s;
		best = SL_MAX(best, n * sizeof(float) / dt / 1e9);
	}
	free(buf);
	return sink > 0 ? best : 0;
}

static int cmd_bench(int argc, char **argv)
{
	common_opts co = { .backend = "auto" };
	int plen = 128, glen = 32, batch = 8, seed = 1;
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
	while ((c = getopt_long(argc, argv, "m:b:h", opts, NULL)) != -1) {
		if (common_opt("bench", c, &co))
			continue;
		switch (c) {
		case OPT_PROMPT_LEN: plen = parse_int("bench", "--prompt-len", optarg, 1, 1 << 20); break;
		case OPT_GEN_LEN: glen = parse_int("bench", "--gen-len", optarg, 1, 1 << 20); break;
		case 'b': batch = parse_int("bench", "--batch", optarg, 1, 1 << 16); break;
		case OPT_SEED: seed = parse_int("bench", "--seed", optarg, 0, 1 << 30); break;
		case OPT_JSON: json = true; break;
		case 'h': fputs(bench_help, stdout); return 0;
		default: fputs(bench_help, stderr); return EXIT_USAGE;
		}
	}
	if (optind < argc)
		usage_error("bench", "unexpected argument '%s'", argv[optind]);
	check_model_opts("bench", &co);
	sl_backend *be = NULL;
	sl_model *m = NULL;
	int rc0 = open_model(&co, &be, &m);
	if (rc0 < 0)
		die(rc0);
	const sl_opt_config *cfg = &m->cfg;
	int rc = 0;
	if (plen + glen > cfg->max_pos) {
		rc = sl_err(SL_ERANGE, "prompt %d + gen %d exceeds the model's %d positions", plen, glen,
			    cfg->max_pos);
		die(rc);
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
	if ((rc = sl_kv_create(m, batch, plen + glen, &kv)) < 0 ||
	    (rc = sl_model_reserve(m, batch, batch * plen)) < 0)
		die(rc);
	/* warm-up: a short prompt, one token (FlexGen's warm-up) */
	{
		int wl = SL_MIN(8, plen);
		kv->nseq = 1;
		if ((rc = sl_model_prefill(m, kv, ids, npad, wl, NULL)) < 0 ||
		    (rc = sl_model_argmax(m, 1, next)) < 0 || (rc = sl_model_decode(m, kv, next)) < 0 ||
		    (rc = sl_model_argmax(m, 1, next)) < 0)
			die(rc);
		kv->nseq = batch;
	}
	be->gemm_seconds = be->gemm_flop = 0;
	double t0 = sl_now();
	if ((rc = sl_model_prefill(m, kv, ids, npad, plen, NULL)) < 0 ||
	    (rc = sl_model_argmax(m, batch, next)) < 0)
		die(rc);
	double t1 = sl_now();
	double pf_gemm_s = be->gemm_seconds, pf_gemm_flop = be->gemm_flop;
	for (int step = 1; step < glen; step++)
		if ((rc = sl_model_decode(m, kv, next)) < 0 || (rc = sl_model_argmax(m, batch, next)) < 0)
			die(rc);
	double t2 = sl_now();
	double dc_gemm_s = be->gemm_seconds - pf_gemm_s;
	const double prefill_s = t1 - t0, decode_s = t2 - t1;
	const double tput = (double)batch * glen / (prefill_s + decode_s);
	/* bytes of weights streamed per decode step: every layer and the head */
	const double wbytes = (double)m->w.bytes - 2.0 * (cfg->max_pos + 2) * cfg->hidden;
	const double pf_flop = pf_gemm_flop > 0 ? pf_gemm_flop : 0;
	const double pf_gflops = pf_gemm_s > 0 ? pf_flop / pf_gemm_s / 1e9 : 0;
	const double dc_gbps = glen > 1 ? wbytes * (glen - 1) / (dc_gemm_s > 0 ? dc_gemm_s : decode_s) / 1e9 : 0;
	const int threads = co.threads > 0 ? co.threads : omp_get_max_threads();
	const double mem_gbps = strcmp(be->ops->name, "cpu") ? 0 : measure_read_gbps(threads);
	if (json) {
		printf("{\"system\":\"sluice\",\"version\":\"%s\",\"model\":\"%s\",\"backend\":\"%s\","
		       "\"threads\":%d,\"prompt_len\":%d,\"gen_len\":%d,\"batch\":%d,"
		       "\"prefill_s\":%.6f,\"decode_s\":%.6f,\"wall_s\":%.6f,\"throughput_tok_s\":%.4f,"
		       "\"gemm_gflops\":%.2f,\"decode_weight_gbps\":%.2f,\"mem_read_gbps\":%.2f,"
		       "\"weight_bytes\":%.0f,\"peak_device_bytes\":%zu}\n",
		       SL_VERSION, cfg->name, be->ops->name, threads, plen, glen, batch, prefill_s,
		       decode_s, prefill_s + decode_s, tput, pf_gflops, dc_gbps, mem_gbps, wbytes,
		       be->dev_peak);
	} else {
		printf("model %s on %s (%d threads): prompt %d, gen %d, batch %d\n", cfg->name,
		       be->ops->name, threads, plen, glen, batch);
		printf("  throughput      %10.2f tokens/s\n", tput);
		printf("  prefill         %10.3f s   (GEMM %.1f GFLOP/s)\n", prefill_s, pf_gflops);
		printf("  decode          %10.3f s   (%d steps; weights streamed at %.1f GB/s)\n",
		       decode_s, glen - 1, dc_gbps);
		if (mem_gbps > 0)
			printf("  memory read     %10.1f GB/s  (decode roofline: %.0f%% reached)\n", mem_gbps,
			       100.0 * dc_gbps / mem_gbps);
		printf("  device peak     %10.1f MiB\n", be->dev_peak / 1048576.0);
	}
	sl_kv_free(m, kv);
	free(ids);
	free(next);
	free(npad);
	sl_model_free(m);
	sl_backend_free(be);
	return 0;
}

static const char main_help[] =
	"usage: sluice <command> [options]\n"
	"  generate   batch generation from a JSON Lines file of prompts\n"
	"  bench      throughput on synthetic prompts\n"
	"  version    print the version and the backends built in\n"
	"'sluice <command> --help' describes each command.\n";

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

int main(int argc, char **argv)
{
	prefer_passive_wait(argv);
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
	if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
		printf("sluice %s (backends: cpu%s)\n", SL_VERSION,
		       sl_backend_cuda_built() ? ", cuda" : "");
		return 0;
	}
	if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
		fputs(main_help, stdout);
		return 0;
	}
	fprintf(stderr, "sluice: unknown command '%s'\n%s", cmd, main_help);
	return EXIT_USAGE;
}
