/*
 * cmd_bench.c - `sluice bench`: throughput on synthetic prompts, after a
 * short warm-up, with the offload breakdown; a table or one JSON object.
 */
#include "cli.h"
#include "cost.h"
#include "cpu/cpu_backend.h"
#include "generate.h"
#include "profile_measure.h"
#include "sl_config.h"
#include "sl_json.h"
#include "topology.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
	"  --json               one JSON object on stdout instead of the table\n"
	"With a profile (--profile, the cached one) the cost model's prediction of\n"
	"the same run is printed beside the measurement.\n" EXIT_HELP;

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

/* bench's options. */
typedef struct bench_opts {
	common_opts co;
	int plen, glen, batch, seed;
	bool batch_max, json, batch_given;
	bool timing_only; /* profile --fit: the two phases' seconds, no memory probe */
} bench_opts;

/* The options; false when --help was asked for (and printed). */
static bool bench_parse(int argc, char **argv, bench_opts *o)
{
	common_opts *co = &o->co;
	common_init(co);
	co->argc = argc;
	co->argv = argv;
	o->plen = 128, o->glen = 32, o->batch = 8, o->seed = 1;
	bool batch_given = false;
	o->batch_max = false;
	o->json = false;
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
		if (common_opt("bench", c, co))
			continue;
		switch (c) {
		case OPT_PROMPT_LEN: o->plen = parse_int("bench", "--prompt-len", optarg, 1, 1 << 20); break;
		case OPT_GEN_LEN: o->glen = parse_int("bench", "--gen-len", optarg, 1, 1 << 20); break;
		case 'b':
			o->batch_max = !strcmp(optarg, "max");
			o->batch = o->batch_max ? 1 : parse_int("bench", "--batch", optarg, 1, 1 << 16);
			batch_given = true;
			break;
		case OPT_SEED: o->seed = parse_int("bench", "--seed", optarg, 0, 1 << 30); break;
		case OPT_JSON: o->json = true; break;
		case 'h': fputs(bench_help, stdout); return false;
		default: bad_option("bench", c, argv);
		}
	}
	if (optind < argc)
		usage_error("bench", "unexpected argument '%s'", argv[optind]);
	if (co->policy_given && !batch_given)
		o->batch = (int)sl_policy_batch(&co->policy);
	if (co->policy_auto && o->batch_max)
		usage_error("bench", "%s", "--policy auto chooses the batch: leave out --batch max (--batch N caps it)");
	o->batch_given = batch_given;
	check_model_opts("bench", co);
	return true;
}

/* The run plan's parameters of a batch of b. */
static sl_plan_params bench_plan(const bench_opts *o, int b)
{
	return job_plan(&o->co, b, b * o->plen, o->plen + o->glen, o->plen);
}

/* Whether the plan of a batch of b fits the budgets given (0: none). */
static bool batch_counts(const bench_opts *o, const sl_model_config *c, bool dev_is_host, size_t gpu_mem,
			 size_t cpu_mem, int b)
{
	const sl_plan_params pp = bench_plan(o, b);
	sl_plan pl;
	if (sl_plan_make(c, &pp, dev_is_host, &pl) < 0)
		return false;
	return (!gpu_mem || pl.total.device <= gpu_mem) && (!cpu_mem || pl.total.host <= cpu_mem);
}

/* --batch max: the largest batch (up to 65536) whose run plan the budgets
 * hold, by the plan's arithmetic (the bytes the model and the job
 * allocate); 0 when not even one does. */
static int max_batch(const bench_opts *o, const sl_model_config *c, bool dev_is_host)
{
	const common_opts *co = &o->co;
	enum { MAX_BATCH = 65536 };
	if (batch_counts(o, c, dev_is_host, co->gpu_mem, co->cpu_mem, MAX_BATCH + 1))
		die(sl_err(SL_EINVAL, "--batch max: under this placement nothing of the job grows in pinned host memory, so --cpu-mem does not bound the batch: give --gpu-mem (the device tier%s)",
			   dev_is_host ? "; on the cpu backend, ordinary memory" : ""));
	int lo = 0, hi = MAX_BATCH + 1; /* lo fits, hi does not */
	while (hi - lo > 1) {
		const int mid = lo + (hi - lo) / 2;
		*(batch_counts(o, c, dev_is_host, co->gpu_mem, co->cpu_mem, mid) ? &lo : &hi) = mid;
	}
	return lo;
}

/* The prediction of the run (a profile at hand) or none. */
typedef struct bench_pred {
	bool have;
	sl_profile prof;
	sl_cost cost;
} bench_pred;

/* The backend and the model under the budgets, after the checks that need
 * no weights; --policy auto's search run, --batch max resolved to the
 * largest batch that fits, the run predicted where a profile is at hand.
 * bcfg and pp are what budget_hint needs later. */
static void bench_open(bench_opts *o, sl_model_config *bcfg, sl_plan_params *pp, sl_backend **be,
		       sl_model **m, bench_pred *pr)
{
	common_opts *co = &o->co;
	const int plen = o->plen, glen = o->glen;
	*be = NULL;
	*m = NULL;
	if (o->batch_max && !co->gpu_mem && !co->cpu_mem)
		usage_error("bench", "%s needs a budget to fill: --gpu-mem or --cpu-mem", "--batch max");
	int rc = model_config(co, bcfg);
	if (rc < 0)
		die(rc);
	if (plen + glen > bcfg->max_pos)
		die(sl_err(SL_ERANGE, "--prompt-len %d plus --gen-len %d exceeds the model's %d positions",
			   plen, glen, bcfg->max_pos));
	if ((rc = make_backend(co, be)) < 0)
		die(rc);
	pr->have = false;
	if (co->policy_auto) {
		if ((rc = policy_auto(co, bcfg, (*be)->ops->name, plen, glen,
				      o->batch_given ? o->batch : 0, false, &pr->prof)) < 0)
			die(rc);
		o->batch = (int)sl_policy_batch(&co->policy);
		pr->have = true;
	}
	/* a zstd store for the placement: its buffers and reads in every plan */
	if ((rc = find_zstd_store(co)) < 0)
		die(rc);
	if (o->batch_max) {
		o->batch = max_batch(o, bcfg, (*be)->ops->dev_is_host);
		if (o->batch == 0) {
			*pp = bench_plan(o, 1);
			/* the message first: budget_hint appends the smallest budget */
			sl_err(SL_EBUDGET, "--batch max: not even one sequence fits");
			budget_hint(SL_EBUDGET, co, bcfg, *be, pp);
			die(SL_EBUDGET);
		}
		if (!o->json) {
			printf("largest batch that fits: %d\n", o->batch);
			fflush(stdout);
		}
	}
	*pp = bench_plan(o, o->batch);
	if (!o->batch_max && (rc = check_budget(co, bcfg, pp, (*be)->ops->dev_is_host)) < 0)
		die(rc);
	/* the prediction first: it is arithmetic, and a profile that does not
	 * suit is found before anything loads */
	if (!pr->have && (rc = cli_profile(co, bcfg, (*be)->ops->name, false, &pr->prof, &pr->have)) < 0)
		die(rc);
	if (pr->have && (rc = predict_run(bcfg, pp, (*be)->ops->dev_is_host, &pr->prof, plen, glen,
					  &pr->cost)) < 0)
		die(rc);
	if ((rc = open_model(co, bcfg, pp, be, m)) < 0) {
		budget_hint(rc, co, bcfg, *be, pp);
		die(rc);
	}
}

/* The memory read probe's buffer, after the run: 8 times the last-level
 * cache, so that the caches do not serve it, from 256 MiB to 1 GiB.  It is
 * memory beyond the budgets (a run's peak RSS includes it), so no larger
 * than that needs. */
static size_t mem_probe_bytes(void)
{
	sl_topo_info topo;
	sl_topo_get(&topo);
	const uint64_t lo = (uint64_t)256 << 20, hi = (uint64_t)1 << 30;
	return (size_t)SL_MIN(hi, SL_MAX(lo, 8 * topo.llc_bytes));
}

/* What one run measured, and what ran it. */
typedef struct bench_result {
	int threads;
	double prefill_s, decode_s, wall, tput;
	double wbytes;			   /* weight bytes streamed per decode step */
	double pf_gflops;		   /* the prefill's GEMMs */
	double dc_gbps, dc_gemm_gbps;	   /* decode's weight rate: wall, GEMMs alone */
	double mem_gbps;		   /* host memory read (CPU backend), else 0 */
	sl_offload_stats fp, fd, f;	   /* prefill, decode, the whole run */
	double bound_s;			   /* sum over the phases of max(compute, io) */
	bool disk_used;
	double probe_gbps;		   /* the disk's O_DIRECT read rate, when used */
	char probe_mode[64];
	const char *kernels, *kernels_env, *gemm, *blas_config, *blas_core, *coretype, *l2_size;
} bench_result;

/* A warm-up, then a timed prefill and decode of o->batch synthetic
 * prompts, and the rates and breakdowns of the run. */
static void bench_measure(const bench_opts *o, sl_backend *be, sl_model *m,
			  const sl_model_config *bcfg, const sl_plan_params *pp, bench_result *r)
{
	const common_opts *co = &o->co;
	const int plen = o->plen, glen = o->glen, batch = o->batch, seed = o->seed;
	const sl_model_config *cfg = &m->cfg;
	int rc;
	sl_kv *kv = NULL;
	int32_t *ids = malloc((size_t)batch * plen * sizeof(int32_t));
	int32_t *next = malloc((size_t)batch * sizeof(int32_t));
	int *npad = calloc((size_t)batch, sizeof(int));
	if (!ids || !next || !npad)
		die(sl_err(SL_ENOMEM, "out of memory"));
	uint64_t x = 0x2545f4914f6cdd1dull * (uint64_t)(seed + 1);
	for (size_t i = 0; i < (size_t)batch * plen; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		ids[i] = 3 + (int32_t)(x % (uint64_t)(cfg->vocab - 3));
	}
	if ((rc = sl_kv_make(&m->kv_env, batch, plen, plen + glen, &kv)) < 0 ||
	    (rc = sl_model_reserve(m, batch, batch * plen)) < 0) {
		budget_hint(rc, co, bcfg, be, pp);
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
	r->prefill_s = prefill_s;
	r->decode_s = decode_s;
	r->tput = (double)batch * glen / (prefill_s + decode_s);
	/* bytes of weights streamed per decode step: every layer and the head
	 * (not OPT's position table, nor an untied head's embedding table,
	 * of which a step reads a row) */
	const double table = cfg->family == SL_FAMILY_OPT ? 2.0 * (cfg->max_pos + 2) * cfg->hidden
				: cfg->llama.tied ? 0 : 2.0 * cfg->vocab * cfg->hidden;
	const double wbytes = (double)m->w.bytes - table;
	r->wbytes = wbytes;
	const double pf_flop = pf_gemm_flop > 0 ? pf_gemm_flop : 0;
	r->pf_gflops = pf_gemm_s > 0 ? pf_flop / pf_gemm_s / 1e9 : 0;
	/* the rate decode streams the weights: their bytes over its wall
	 * time (stalls included: weights on disk arrive at the disk's rate);
	 * and within the GEMMs alone, for the roofline of the kernels */
	r->dc_gbps = glen > 1 && decode_s > 0 ? wbytes * (glen - 1) / decode_s / 1e9 : 0;
	r->dc_gemm_gbps = glen > 1 && dc_gemm_s > 0 ? wbytes * (glen - 1) / dc_gemm_s / 1e9 : 0;
	r->threads = co->threads > 0 ? co->threads : omp_get_max_threads();
	r->mem_gbps = strcmp(be->ops->name, "cpu") || o->timing_only
			      ? 0
			      : sl_profile_mem_read_gbps(mem_probe_bytes(), r->threads);
	/* the offload breakdown (model.h: sl_offload_stats) */
	const double wall = prefill_s + decode_s;
	r->wall = wall;
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
	r->fp = fp;
	r->fd = fd;
	r->f = f;
	r->bound_s = SL_MAX(fp.compute_s, fp.io_s) + SL_MAX(fd.compute_s, fd.io_s);
	r->disk_used = m->disk || f.peak_disk > 0;
	r->probe_gbps = 0;
	r->probe_mode[0] = 0;
	if (r->disk_used && sl_disk_probe_read(co->offload_dir, (uint64_t)1 << 30, &r->probe_gbps,
					       r->probe_mode, sizeof r->probe_mode) < 0)
		r->probe_gbps = 0;
	/* the CPU kernels that ran: their instruction set, the GEMM (sluice's
	 * own, or OpenBLAS's with the core it chose); NULL on CUDA */
	r->kernels = sl_cpu_backend_kernels(be);
	r->kernels_env = getenv("SLUICE_CPU_KERNELS");
	if (r->kernels_env && !*r->kernels_env)
		r->kernels_env = NULL; /* empty: unset, as the backend reads it */
	r->gemm = sl_cpu_backend_gemm(be);
	r->blas_config = NULL;
	r->blas_core = NULL;
	if (r->gemm && !strcmp(r->gemm, "openblas"))
		sl_cpu_backend_blas_info(&r->blas_config, &r->blas_core);
	r->coretype = getenv("OPENBLAS_CORETYPE");
	r->l2_size = getenv("OPENBLAS_L2_SIZE");
	sl_kv_free(kv);
	free(ids);
	free(next);
	free(npad);
}

/* A predicted number, or null (no profile; a rate the profile lacks). */
static json_t *json_pred(const sl_cost *pc, double v)
{
	return pc && isfinite(v) ? json_real(v) : json_null();
}

/* The run as one JSON object on stdout. */
static void bench_print_json(const bench_opts *o, const sl_backend *be, const sl_model *m,
			     const bench_result *r, const bench_pred *pr)
{
	const common_opts *co = &o->co;
	const sl_model_config *cfg = &m->cfg;
	const sl_offload_stats *f = &r->f;
	int rc;
	sl_jerr e = { 0 };
	json_t *j = json_object(), *peak = json_object(), *benv = json_object();
	sl_jset(j, "system", json_string("sluice"), &e);
	sl_jset(j, "version", json_string(SL_VERSION), &e);
	sl_jset(j, "build", json_string(sl_build_id), &e);
	sl_jset(j, "model", json_text(co->model_dir ? co->model_dir : cfg->name), &e);
	sl_jset(j, "model_name", json_text(cfg->name), &e);
	sl_jset(j, "backend", json_string(be->ops->name), &e);
	sl_jset(j, "threads", json_integer(r->threads), &e);
	sl_jset(j, "prompt_len", json_integer(o->plen), &e);
	sl_jset(j, "gen_len", json_integer(o->glen), &e);
	sl_jset(j, "batch", json_integer(o->batch), &e);
	/* the micro-batches the run plan made of the batch */
	const int gs = m->plan.gs > 0 ? m->plan.gs : o->batch;
	sl_jset(j, "gpu_batch_size", json_integer(gs), &e);
	sl_jset(j, "num_gpu_batches", json_integer((o->batch + gs - 1) / gs), &e);
	const sl_policy *pp = &co->policy;
	sl_jset_real(j, "w_gpu_percent", pp->w_gpu_percent, &e);
	sl_jset_real(j, "w_cpu_percent", pp->w_cpu_percent, &e);
	sl_jset_real(j, "cache_gpu_percent", pp->cache_gpu_percent, &e);
	sl_jset_real(j, "cache_cpu_percent", pp->cache_cpu_percent, &e);
	sl_jset_real(j, "act_gpu_percent", pp->act_gpu_percent, &e);
	sl_jset_real(j, "act_cpu_percent", pp->act_cpu_percent, &e);
	sl_jset(j, "cpu_cache_compute", json_boolean(pp->cpu_cache_compute), &e);
	sl_jset(j, "compress_cache", json_boolean(pp->compress_cache), &e);
	sl_jset(j, "compress_weight", json_boolean(pp->compress_weight), &e);
	sl_jset(j, "overlap", json_boolean(pp->overlap), &e);
	sl_jset(j, "sep_layer", json_boolean(pp->sep_layer), &e);
	sl_jset_real(j, "hh_ratio", pp->hh_ratio, &e);
	sl_jset_real(j, "recent_ratio", m->plan.p.rr, &e);
	sl_jset_real(j, "prefill_s", r->prefill_s, &e);
	sl_jset_real(j, "decode_s", r->decode_s, &e);
	sl_jset_real(j, "wall_s", r->wall, &e);
	sl_jset_real(j, "throughput_tok_s", r->tput, &e);
	const sl_cost *pc = pr->have ? &pr->cost : NULL;
	sl_jset(j, "predicted_throughput_tok_s", json_pred(pc, pc ? pc->tok_s : 0), &e);
	sl_jset(j, "predicted_prefill_s", json_pred(pc, pc ? pc->prefill.seconds : 0), &e);
	sl_jset(j, "predicted_decode_s", json_pred(pc, pc ? pc->decode.seconds : 0), &e);
	sl_jset(j, "predicted_prefill_bottleneck",
		pc ? json_string(sl_res_name[pc->prefill.bottleneck]) : json_null(), &e);
	sl_jset(j, "predicted_decode_bottleneck",
		pc ? json_string(sl_res_name[pc->decode.bottleneck]) : json_null(), &e);
	sl_jset(j, "profile", pc ? json_text(co->profile_src) : json_null(), &e);
	sl_jset_real(j, "compute_s", f->compute_s, &e);
	sl_jset_real(j, "io_s", f->io_s, &e);
	sl_jset_real(j, "stall_s", f->stall_s, &e);
	sl_jset_real(j, "prefill_compute_s", r->fp.compute_s, &e);
	sl_jset_real(j, "prefill_io_s", r->fp.io_s, &e);
	sl_jset_real(j, "decode_compute_s", r->fd.compute_s, &e);
	sl_jset_real(j, "decode_io_s", r->fd.io_s, &e);
	sl_jset_real(j, "phase_bound_s", r->bound_s, &e);
	sl_jset(j, "h2d_bytes", json_integer((json_int_t)f->h2d_bytes), &e);
	sl_jset(j, "d2h_bytes", json_integer((json_int_t)f->d2h_bytes), &e);
	sl_jset(j, "disk_read_bytes", json_integer((json_int_t)f->disk_read_bytes), &e);
	sl_jset_real(j, "disk_read_gbps", f->disk_read_gbps, &e);
	sl_jset_real(j, "probe_read_gbps", r->probe_gbps, &e);
	sl_jset(j, "disk_write_bytes", json_integer((json_int_t)f->disk_write_bytes), &e);
	sl_jset_real(j, "gemm_gflops", r->pf_gflops, &e);
	sl_jset_real(j, "decode_weight_gbps", r->dc_gbps, &e);
	sl_jset_real(j, "decode_gemm_weight_gbps", r->dc_gemm_gbps, &e);
	sl_jset_real(j, "mem_read_gbps", r->mem_gbps, &e);
	sl_jset(j, "weight_bytes", json_integer((json_int_t)r->wbytes), &e);
	sl_jset(peak, "device", json_integer((json_int_t)f->peak_device), &e);
	sl_jset(peak, "host", json_integer((json_int_t)f->peak_host), &e);
	sl_jset(peak, "disk", json_integer((json_int_t)f->peak_disk), &e);
	sl_jset(j, "peak_bytes", peak, &e);
	sl_jset(j, "peak_device_bytes", json_integer((json_int_t)f->peak_device), &e);
	sl_jset(j, "cpu_kernels", r->kernels ? json_string(r->kernels) : json_null(), &e);
	sl_jset(j, "cpu_kernels_env", r->kernels_env ? json_text(r->kernels_env) : json_null(), &e);
	sl_jset(j, "cpu_gemm", r->gemm ? json_string(r->gemm) : json_null(), &e);
	sl_jset(j, "blas_core", r->blas_core ? json_text(r->blas_core) : json_null(), &e);
	sl_jset(j, "blas_config", r->blas_config ? json_text(r->blas_config) : json_null(), &e);
	sl_jset(benv, "OPENBLAS_CORETYPE", r->coretype ? json_text(r->coretype) : json_null(), &e);
	sl_jset(benv, "OPENBLAS_L2_SIZE", r->l2_size ? json_text(r->l2_size) : json_null(), &e);
	sl_jset(j, "blas_env", benv, &e);
	if ((rc = sl_jcheck(&e, "bench --json")) == 0)
		rc = sl_jwrite_line(j, stdout, "bench --json: standard output");
	json_decref(j);
	if (rc < 0)
		die(rc);
}

/* The run as a table on stdout; the offload breakdown when anything is
 * off the device. */
static void bench_print_table(const bench_opts *o, const sl_backend *be, const sl_model *m,
			      const bench_result *r, const bench_pred *pr)
{
	const common_opts *co = &o->co;
	const sl_model_config *cfg = &m->cfg;
	const sl_offload_stats *f = &r->f;
	const int threads = r->threads, glen = o->glen;
	const char *kernels = r->kernels, *kernels_env = r->kernels_env, *coretype = r->coretype;
	const double compute_s = f->compute_s, io_s = f->io_s, stall_s = f->stall_s;
	const double disk_bytes = (double)f->disk_read_bytes, disk_gbps = f->disk_read_gbps;
	const double probe_gbps = r->probe_gbps, wall = r->wall;
	printf("model %s on %s (%d thread%s): prompt %d, gen %d, batch %d\n",
	       co->model_dir ? co->model_dir : cfg->name, be->ops->name, threads,
	       threads == 1 ? "" : "s", o->plen, glen, o->batch);
	if (kernels) {
		/* the GEMM that ran: OpenBLAS's (the core it chose), bf16's, or ours */
		char gemm[512];
		if (r->blas_core)
			snprintf(gemm, sizeof gemm, "%s, %s core%s%s%s (not batch invariant)", r->blas_config,
				 r->blas_core, coretype ? " (OPENBLAS_CORETYPE=" : "", coretype ? coretype : "",
				 coretype ? ")" : "");
		else if (r->gemm && (!strcmp(r->gemm, "amx") || !strcmp(r->gemm, "bf16")))
			snprintf(gemm, sizeof gemm, "the prefill's in bf16 on %s (not batch invariant)",
				 !strcmp(r->gemm, "amx") ? "AMX tiles" : "AVX512-BF16 dot products");
		else
			snprintf(gemm, sizeof gemm, "sluice's own (batch invariant)");
		printf("  CPU kernels     %s%s%s; GEMM: %s\n", kernels, kernels_env ? ", SLUICE_CPU_KERNELS=" : "",
		       kernels_env ? kernels_env : "", gemm);
	}
	printf("  throughput      %10.2f tokens/s\n", r->tput);
	if (pr->have) {
		const sl_cost *pc = &pr->cost;
		printf("  predicted       %10.2f tokens/s  (measured / predicted %.2f; prefill %.3f s, bound by %s; decode %.3f s, bound by %s; profile %s)\n",
		       pc->tok_s, pc->tok_s > 0 ? r->tput / pc->tok_s : 0, pc->prefill.seconds,
		       sl_res_name[pc->prefill.bottleneck], pc->decode.seconds,
		       sl_res_name[pc->decode.bottleneck], co->profile_src);
	}
	printf("  prefill         %10.3f s   (GEMM %.1f GFLOP/s)\n", r->prefill_s, r->pf_gflops);
	printf("  decode          %10.3f s   (%d step%s; weights streamed at %.2f GB/s, %.2f GB/s within the GEMMs)\n",
	       r->decode_s, glen - 1, glen - 1 == 1 ? "" : "s", r->dc_gbps, r->dc_gemm_gbps);
	if (r->mem_gbps > 0)
		printf("  memory read     %10.1f GB/s  (decode roofline: %.0f%% reached)\n", r->mem_gbps,
		       100.0 * r->dc_gbps / r->mem_gbps);
	printf("  device peak     %10.1f MiB;  host peak %.1f MiB\n", be->dev_peak / 1048576.0,
	       be->host_peak / 1048576.0);
	const sl_policy *pp = &co->policy;
	if (m->w.streamed || pp->cache_gpu_percent < 100 || m->plan.p.act_host) {
		printf("  weights         %g%% device, %g%% host, the rest on disk; overlap %s\n",
		       pp->w_gpu_percent, pp->w_cpu_percent, pp->overlap ? "on" : "off");
		printf("  KV cache        %g%% device, %g%% host, the rest on disk%s\n",
		       pp->cache_gpu_percent, pp->cache_cpu_percent,
		       pp->cpu_cache_compute ? "; attention over the host tier in place" : "");
		printf("  activations     on the %s\n", m->plan.p.act_host ? "host" : "device");
		printf("  compute         %10.3f s\n  stall           %10.3f s  (waiting for weights or cache)\n",
		       compute_s, stall_s);
		if (f->h2d_bytes || f->d2h_bytes)
			printf("  host <-> device %10.2f GB in, %.2f GB out\n", f->h2d_bytes / 1e9,
			       f->d2h_bytes / 1e9);
		if (r->disk_used)
			printf("  disk            %10.3f s busy, %.2f GB read at %.2f GB/s (O_DIRECT probe %.2f GB/s, %s: %.0f%%), %.2f GB written\n"
			       "  overlap         %10.2f  (max(compute, io) / wall; per phase, sum of max / wall: %.2f)\n",
			       io_s, disk_bytes / 1e9, disk_gbps, probe_gbps, r->probe_mode,
			       probe_gbps > 0 ? 100 * disk_gbps / probe_gbps : 0,
			       f->disk_write_bytes / 1e9, SL_MAX(compute_s, io_s) / wall, r->bound_s / wall);
	}
}

int bench_fit_run(const char *backend, int threads, const char *name, const bench_fit_job *job,
		  const sl_profile *prof, const sl_profile *alt, double measured[2], double predicted[2],
		  double alt_predicted[2])
{
	bench_opts o;
	memset(&o, 0, sizeof o);
	common_init(&o.co);
	o.co.dummy = name;
	o.co.backend = backend;
	o.co.threads = threads;
	if (prof->cpu_gemm[0])
		o.co.cpu_gemm = prof->cpu_gemm; /* the GEMM the rates are of */
	const int batch = job->batch, plen = job->plen, glen = job->glen;
	o.plen = plen, o.glen = glen, o.batch = batch, o.seed = 1;
	o.timing_only = true;
	if (job->micro > 0) { /* the default policy in micro-batches */
		o.co.policy.gpu_batch_size = job->micro;
		o.co.policy.num_gpu_batches = (batch + job->micro - 1) / job->micro;
		o.co.policy_given = true;
	}
	sl_model_config cfg;
	sl_backend *be = NULL;
	sl_model *m = NULL;
	sl_cost cost, alt_cost;
	int rc = model_config(&o.co, &cfg);
	if (rc < 0)
		return rc;
	const sl_plan_params pp = bench_plan(&o, batch);
	if ((rc = make_backend(&o.co, &be)) == 0 &&
	    (rc = predict_run(&cfg, &pp, be->ops->dev_is_host, prof, plen, glen, &cost)) == 0 &&
	    (!alt || (rc = predict_run(&cfg, &pp, be->ops->dev_is_host, alt, plen, glen, &alt_cost)) == 0) &&
	    (rc = open_model(&o.co, &cfg, &pp, &be, &m)) == 0) {
		bench_result r;
		bench_measure(&o, be, m, &cfg, &pp, &r);
		measured[0] = r.prefill_s;
		measured[1] = r.decode_s;
		predicted[0] = cost.prefill.seconds;
		predicted[1] = cost.decode.seconds;
		if (alt) {
			alt_predicted[0] = alt_cost.prefill.seconds;
			alt_predicted[1] = alt_cost.decode.seconds;
		}
	}
	sl_model_free(m);
	sl_backend_free(be);
	return rc;
}

int cmd_bench(int argc, char **argv)
{
	bench_opts o;
	if (!bench_parse(argc, argv, &o))
		return 0;
	sl_model_config bcfg;
	sl_plan_params pp;
	sl_backend *be = NULL;
	sl_model *m = NULL;
	bench_pred pr;
	bench_open(&o, &bcfg, &pp, &be, &m, &pr);
	bench_result r;
	bench_measure(&o, be, m, &bcfg, &pp, &r);
	if (o.json)
		bench_print_json(&o, be, m, &r, &pr);
	else
		bench_print_table(&o, be, m, &r, &pr);
	sl_model_free(m);
	sl_backend_free(be);
	return 0;
}
