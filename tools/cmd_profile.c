/*
 * cmd_profile.c - `sluice profile`: the machine's topology and rates, for
 * the cost model.
 */
#include "cli.h"
#include "cost.h"
#include "profile_measure.h"

#include <omp.h>
#include <stdio.h>

static const char profile_help[] =
	"usage: sluice profile [--offload-dir DIR] [--backend B] [--threads N] [--json FILE] [--quick]\n"
	"                      [--model DIR | --dummy NAME]...\n"
	"The machine for the cost model: NUMA nodes, cores, the GPU and its node, where\n"
	"pinned memory and the disk's I/O threads go; then host memory read GB/s, the\n"
	"backend's GEMM GFLOP/s against the rows m, CPU GEMM GFLOP/s, decode attention\n"
	"GB/s and prefill attention GFLOP/s (and the CPU's decode attention beside a\n"
	"GPU), a small copy's and a tiny op's latency, the backend's own device memory,\n"
	"the disk in DIR as the stores use it (O_DIRECT writes; reads over three\n"
	"sustained passes, pipelined and by segment size; scattered page writes; on the\n"
	"CPU backend the share of its reads hidden under GEMMs), host <-> device copy\n"
	"GB/s and, with a GPU, GPU GEMM TFLOP/s.  About 15 s with --offload-dir on a\n"
	"2-core VM, half that without (--quick: a second or two).\n"
	"  --offload-dir DIR    measure the disk there (a 1.5 GiB file, removed after)\n"
	"  --backend B          cpu, cuda or auto (default: cuda where a GPU is found)\n"
	"  --threads N          CPU threads, 1 to the cores available (default: all cores)\n"
	"  --json FILE          also write the results as one JSON object (atomically)\n"
	"  --model DIR, --dummy NAME  also the GEMM at that model's own shapes (its\n"
	"                       decoder's matrices and head), for the cost model's\n"
	"                       predictions of it; repeatable (a few seconds each)\n"
	"  --quick              small sizes: a check that it runs, not a measurement\n" EXIT_HELP;


int cmd_profile(int argc, char **argv)
{
	sl_profile_opts po = { .backend = "auto", .log = stdout };
	const char *json_path = NULL;
	enum { P_OFFLOAD = 1, P_BACKEND, P_THREADS, P_JSON, P_QUICK, P_MODEL, P_DUMMY };
	static const struct option opts[] = {
		{ "offload-dir", required_argument, 0, P_OFFLOAD },
		{ "backend", required_argument, 0, P_BACKEND },
		{ "threads", required_argument, 0, P_THREADS },
		{ "json", required_argument, 0, P_JSON },
		{ "quick", no_argument, 0, P_QUICK },
		{ "model", required_argument, 0, P_MODEL },
		{ "dummy", required_argument, 0, P_DUMMY },
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
	computing = true;
	sl_profile p;
	if ((rc = sl_profile_run(&po, &p)) < 0 || (json_path && (rc = sl_profile_save_json(&p, json_path)) < 0))
		die(rc);
	return 0;
}
