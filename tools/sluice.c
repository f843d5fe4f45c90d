/*
 * sluice.c - the command line's entry: `sluice <command>` runs one command,
 * each in its own file (tools/cmd_<command>.c; what they share in
 * tools/cli_common.c and tools/cli_job.c, declared in tools/cli.h).  Every
 * failure prints one line naming what failed and exits non-zero, by one
 * rule (cli_common.c: exit_status).
 */
#include "backend.h"
#include "cli.h"
#include "sl_config.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char main_help[] =
	"usage: sluice <command> [options]\n"
	"  generate   batch generation from a JSON Lines file of prompts\n"
	"  score      log-probabilities of continuations\n"
	"  bench      throughput on synthetic prompts\n"
	"  profile    the machine's topology and rates, for the cost model\n"
	"  policy     the policy with the most predicted tokens/s under the budgets\n"
	"  convert    write, list or remove the weights' disk stores of an offload folder\n"
	"  version    print the version and the backends built in\n"
	"'sluice <command> --help' describes each command.\n" EXIT_HELP;

/*
 * OpenMP's idle workers wait as libgomp does by default (OMP_WAIT_POLICY
 * unset: they spin a while, then sleep; hardly at all where threads
 * outnumber the CPUs).  A decode step is hundreds of short parallel
 * regions, and waking a sleeping worker for each made opt-125m 1.07x to
 * 1.23x slower in six of seven placements on a 2-vCPU VM
 * (bench/results/ab-20261206-001648.md).  sluice used to force
 * OMP_WAIT_POLICY=passive, when its copy thread copied the host tier's
 * weights every step beside spinning workers; the user's OMP_WAIT_POLICY
 * and GOMP_SPINCOUNT apply as to any OpenMP program.
 */

int main(int argc, char **argv)
{
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
	if (!strcmp(cmd, "policy"))
		return cmd_policy(argc, argv); /* tools/cmd_policy.c */
	if (!strcmp(cmd, "convert"))
		return cmd_convert(argc, argv); /* tools/cmd_convert.c */
	if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
		printf("sluice %s (%s; backends: cpu%s)\n", SL_VERSION, sl_build_id,
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
