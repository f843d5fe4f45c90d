/*
 * cmd_profile.c - `sluice profile`: the machine's topology and rates, for
 * the cost model.
 */
#include "cli.h"
#include "cost.h"
#include "profile_measure.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char profile_help[] =
	"usage: sluice profile [--offload-dir DIR] [--backend B] [--threads N] [--cpu-gemm G] [--json FILE] [--quick]\n"
	"                      [--model DIR | --dummy NAME]... [--fit]\n"
	"The machine for the cost model: NUMA nodes, cores, the GPU and its node, where\n"
	"pinned memory and the disk's I/O threads go; then host memory read GB/s, the\n"
	"backend's GEMM GFLOP/s against the rows m, CPU GEMM GFLOP/s, decode attention\n"
	"GB/s and prefill attention GFLOP/s (and the CPU's decode attention beside a\n"
	"GPU), a small copy's and a tiny op's latency, the backend's own device memory,\n"
	"the disk in DIR as the stores use it (O_DIRECT writes; reads over three\n"
	"sustained passes, pipelined and by segment size; scattered page writes; on the\n"
	"CPU backend the share of its reads hidden under GEMMs), host <-> device copy\n"
	"GB/s and, with a GPU, GPU GEMM TFLOP/s.  About 15 s with --offload-dir on a\n"
	"2-core VM, 10 s without, 15 s more per --model (--quick: a second or two).\n"
	"  --offload-dir DIR    measure the disk there (a 1.5 GiB file, removed after)\n"
	"  --backend B          cpu, cuda or auto (default: cuda where a GPU is found)\n"
	"  --threads N          CPU threads, 1 to the cores available (default: all cores)\n"
	"  --cpu-gemm G         the CPU backend's GEMM to measure (sluice, openblas, amx,\n"
	"                       bf16; default sluice): that of the runs the profile is for\n"
	"  --json FILE          also write the results as one JSON object (atomically)\n"
	"  --model DIR, --dummy NAME  also the GEMM at that model's own shapes (its\n"
	"                       decoder's matrices and head), for the cost model's\n"
	"                       predictions of it; repeatable (15 s or so each on 2 cores)\n"
	"  --fit                then run short jobs of a dummy model with everything on\n"
	"                       the device (opt-350m on the CPU, opt-1.3b on a GPU; two\n"
	"                       workloads, 3 runs each, about 30 s on a 2-core VM) and\n"
	"                       keep what their prefill and decode took over what the\n"
	"                       cost model predicts from these rates (fit_prefill,\n"
	"                       fit_decode, the medians): its predictions are then\n"
	"                       scaled by them; on the CPU also the second workload\n"
	"                       in micro-batches of 1, 2 and 4 (3 runs each, about\n"
	"                       30 s more): the share of the cache's gain a layer's\n"
	"                       micro-batches after its first reach (fit_hot)\n"
	"  --quick              small sizes: a check that it runs, not a measurement\n" EXIT_HELP;

/* --fit's jobs: a dummy model on the device, two workloads (a long prompt
 * at a small batch, a short one at a larger batch), each FIT_REPEAT times,
 * interleaved; on the CPU backend then the second in micro-batches of 1, 2
 * and 4 sequences (the cache's share, fit_hot).  None is a run
 * bench/policy_validate.sh measures. */
enum { FIT_WORKLOADS = 2, FIT_REPEAT = 3 };
static const int fit_hot_micro[] = { 1, 2, 4 };
_Static_assert(SL_ARRAY_LEN(fit_hot_micro) <= SL_PROFILE_FIT_HOT_MAX, "the profile holds every point");

/* The model --fit runs on backend: small enough to load in a second or
 * two, large enough that its GEMMs are a real job's. */
static const char *fit_model(const char *backend, bool quick)
{
	return quick ? "opt-125m" : !strcmp(backend, "cpu") ? "opt-350m" : "opt-1.3b";
}

/*
 * The CPU backend's micro-batches: job in micro-batches of each of
 * fit_hot_micro sequences, repeat times, interleaved; each run's decode
 * seconds placed between the model's predictions with the hot curve's
 * whole gain (p, fitted so far) and with none (the cache left out): the
 * share of the gain the run reached, clamped to [0, 1], the median per
 * micro-batch size into p->fit_hot.  Where the two predictions are within
 * 2% (too close to tell), the point is left out.
 */
static int fit_hot(const sl_profile_opts *po, sl_profile *p, const char *model, const bench_fit_job *job, int repeat)
{
	enum { NM = SL_ARRAY_LEN(fit_hot_micro) };
	sl_profile *cold = malloc(sizeof *cold);
	if (!cold)
		return sl_err(SL_ENOMEM, "out of memory");
	*cold = *p;
	memset(&cold->gemm_hot, 0, sizeof cold->gemm_hot); /* no cache: every GEMM cold */
	p->fit_hot_n = 0; /* the predictions with the cache: its whole gain */
	double share[NM][FIT_REPEAT];
	int ns[NM] = { 0 }, rc = 0;
	for (int rep = 0; rep < repeat && rc == 0; rep++)
		for (int i = 0; i < NM && rc == 0 && fit_hot_micro[i] < job->batch; i++) {
			bench_fit_job j = *job;
			j.micro = fit_hot_micro[i];
			double meas[2], hot[2], none[2];
			if ((rc = bench_fit_run(p->backend, po->threads, model, &j, p, cold, meas, hot, none)) < 0)
				break;
			const bool apart = none[1] > 1.02 * hot[1];
			fprintf(po->log, "fit run     %s batch %d in micro-batches of %d, prompt %d gen %d: decode %.3f s (predicted %.3f with the cache, %.3f without)\n",
				model, j.batch, j.micro, j.plen, j.glen, meas[1], hot[1], none[1]);
			if (apart)
				share[i][ns[i]++] = SL_MAX(0.0, SL_MIN(1.0, (none[1] - meas[1]) / (none[1] - hot[1])));
		}
	free(cold);
	if (rc < 0)
		return rc;
	char line[256] = "";
	for (int i = 0; i < NM; i++) {
		if (ns[i] == 0)
			continue;
		const int k = p->fit_hot_n++;
		p->fit_hot_m[k] = fit_hot_micro[i];
		p->fit_hot_share[k] = sl_median(share[i], ns[i]);
		const size_t len = strlen(line);
		snprintf(line + len, sizeof line - len, "%s%d rows %.2f", k ? ", " : "", p->fit_hot_m[k],
			 p->fit_hot_share[k]);
	}
	fprintf(po->log, "fit hot     %s  (the share of the cache's gain a layer's micro-batches after its first reached, the median of %d runs of %s)\n",
		p->fit_hot_n ? line : "none: with and without the cache the predictions were within 2%", repeat, model);
	return 0;
}

/* Run --fit's jobs on p's backend and rates; p->fit_* become the medians of
 * measured over predicted seconds, per phase. */
static int profile_fit(const sl_profile_opts *po, sl_profile *p)
{
	const bool cpu = !strcmp(p->backend, "cpu");
	const bench_fit_job cpu_jobs[FIT_WORKLOADS] = { { 2, 0, 128, 16 }, { 8, 0, 32, 16 } },
			    gpu_jobs[FIT_WORKLOADS] = { { 8, 0, 256, 16 }, { 32, 0, 64, 16 } },
			    quick_jobs[FIT_WORKLOADS] = { { 1, 0, 16, 4 }, { 2, 0, 8, 4 } };
	const bench_fit_job *jobs = po->quick ? quick_jobs : cpu ? cpu_jobs : gpu_jobs;
	const int repeat = po->quick ? 1 : FIT_REPEAT;
	const char *model = fit_model(p->backend, po->quick);
	/* the rates alone: what a profile without a fit predicts */
	sl_profile *plain = malloc(sizeof *plain);
	if (!plain)
		return sl_err(SL_ENOMEM, "out of memory");
	*plain = *p;
	plain->fit_prefill = plain->fit_decode = 0;
	plain->fit_hot_n = 0;
	double pf[FIT_WORKLOADS * FIT_REPEAT], dc[FIT_WORKLOADS * FIT_REPEAT];
	const double t0 = sl_now();
	int n = 0, rc = 0;
	for (int rep = 0; rep < repeat && rc == 0; rep++)
		for (int i = 0; i < FIT_WORKLOADS && rc == 0; i++) {
			const bench_fit_job *j = &jobs[i];
			double meas[2], pred[2];
			if ((rc = bench_fit_run(p->backend, po->threads, model, j, plain, NULL, meas, pred, NULL)) < 0)
				break;
			pf[n] = meas[0] / pred[0];
			dc[n] = meas[1] / pred[1];
			fprintf(po->log, "fit run     %s batch %d prompt %d gen %d: prefill %.3f s (predicted %.3f), decode %.3f s (%.3f)\n",
				model, j->batch, j->plen, j->glen, meas[0], pred[0], meas[1], pred[1]);
			n++;
		}
	if (rc == 0) {
		p->fit_prefill = sl_median(pf, n);
		p->fit_decode = sl_median(dc, n);
		fprintf(po->log, "fit         prefill %.3f, decode %.3f  (measured over predicted, the median of %d runs of %s on the device)\n",
			p->fit_prefill, p->fit_decode, n, model);
		if (cpu && p->gemm_hot.npoints > 0)
			rc = fit_hot(po, p, model, &jobs[FIT_WORKLOADS - 1], repeat);
	}
	free(plain);
	if (rc < 0)
		return rc;
	snprintf(p->fit_model, sizeof p->fit_model, "%s", model);
	p->seconds += sl_now() - t0;
	return 0;
}


int cmd_profile(int argc, char **argv)
{
	sl_profile_opts po = { .backend = "auto", .log = stdout };
	const char *json_path = NULL;
	bool fit = false;
	enum { P_OFFLOAD = 1, P_BACKEND, P_THREADS, P_JSON, P_QUICK, P_MODEL, P_DUMMY, P_FIT, P_GEMM };
	static const struct option opts[] = {
		{ "offload-dir", required_argument, 0, P_OFFLOAD },
		{ "backend", required_argument, 0, P_BACKEND },
		{ "threads", required_argument, 0, P_THREADS },
		{ "json", required_argument, 0, P_JSON },
		{ "quick", no_argument, 0, P_QUICK },
		{ "model", required_argument, 0, P_MODEL },
		{ "dummy", required_argument, 0, P_DUMMY },
		{ "fit", no_argument, 0, P_FIT },
		{ "cpu-gemm", required_argument, 0, P_GEMM },
		{ "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	int c, rc;
	sl_model_config cfg;
	char path[4096];
	while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
		switch (c) {
		case P_OFFLOAD: po.offload_dir = optarg; break;
		case P_BACKEND: po.backend = optarg; break;
		case P_THREADS: po.threads = parse_threads("profile", optarg); break;
		case P_JSON: json_path = optarg; break;
		case P_QUICK: po.quick = true; break;
		case P_MODEL:
			snprintf(path, sizeof path, "%s/config.json", optarg);
			if ((rc = sl_model_config_load(path, &cfg)) < 0 ||
			    (rc = sl_cost_profile_shapes(&po, &cfg)) < 0)
				die(rc);
			break;
		case P_DUMMY:
			if ((rc = sl_model_config_named(optarg, &cfg)) < 0 ||
			    (rc = sl_cost_profile_shapes(&po, &cfg)) < 0)
				die(rc);
			break;
		case P_FIT: fit = true; break;
		case P_GEMM: po.cpu_gemm = parse_cpu_gemm("profile", optarg); break;
		case 'h': fputs(profile_help, stdout); return 0;
		default: bad_option("profile", c, argv);
		}
	}
	if (optind < argc)
		usage_error("profile", "unexpected argument '%s'", argv[optind]);
	if (po.threads > 0)
		omp_set_num_threads(po.threads);
	if (json_path && (rc = sl_profile_check_json_path(json_path)) < 0)
		die(rc);
	if (po.offload_dir && (rc = sl_profile_check_offload_dir(po.offload_dir)) < 0)
		die(rc);
	/* --fit's model: its GEMM shapes measured like any other's, so that the
	 * fit corrects what the shapes leave, not the shapes themselves */
	if (fit) {
		const char *model = fit_model(sl_backend_resolve(po.backend), po.quick);
		if ((rc = sl_model_config_named(model, &cfg)) < 0 || (rc = sl_cost_profile_shapes(&po, &cfg)) < 0)
			die(rc);
	}
	computing = true;
	sl_profile p;
	if ((rc = sl_profile_run(&po, &p)) < 0 || (fit && (rc = profile_fit(&po, &p)) < 0) ||
	    (json_path && (rc = sl_profile_save_json(&p, json_path)) < 0))
		die(rc);
	return 0;
}
