/*
 * cmd_score.c - `sluice score`: log-probabilities of continuations (the
 * run: cli_job.c).
 */
#include "cli.h"

#include <stdio.h>

static const char score_help[] =
	"usage: sluice score (--model DIR | --dummy NAME) --input IN.jsonl --out OUT.jsonl\n"
	"                    [job options]\n"
	"Log-probabilities of continuations.  Each input line: a prompt (\"prompt\" text or\n"
	"\"input_ids\") and a continuation (\"continuation\" text or \"continuation_ids\").\n"
	"Each output line: {\"id\", \"logprobs\" (one per continuation token), \"sum_logprob\",\n"
	"\"perplexity\"}.  The continuation runs through the same decode path as generation.\n"
	COMMON_HELP "  --input FILE         input JSON Lines (- : standard input)\n" JOB_HELP;

int cmd_score(int argc, char **argv)
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
