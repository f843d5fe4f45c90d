/*
 * cmd_generate.c - `sluice generate`: batch generation from a JSON Lines
 * file of prompts (the run: cli_job.c).
 */
#include "cli.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

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

int cmd_generate(int argc, char **argv)
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
			j.jo.sampling.temperature = (float)parse_real("generate", "--temperature", optarg, 0, false, 100);
			break;
		case OPT_TOP_K: j.jo.sampling.top_k = parse_int("generate", "--top-k", optarg, 0, 1 << 30); break;
		case OPT_TOP_P: j.jo.sampling.top_p = (float)parse_real("generate", "--top-p", optarg, 1e-6, false, 1);
			break;
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
