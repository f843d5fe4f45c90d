/*
 * job.h - a batch job over JSON Lines: blocks of prompts formed in input
 * order, generation or scoring block by block, output flushed to disk after
 * each block, resume after the last whole block, sharding by block, a
 * progress display and a summary.
 */
#ifndef SL_JOB_H
#define SL_JOB_H

#include "jsonl.h"
#include "model.h"
#include "sampling.h"
#include "tokenizer.h"

#include <signal.h>

typedef struct sl_job_opts {
	int batch;               /* prompts per block */
	int shard_k, shard_n;    /* this job takes blocks b with b % n == k */
	int max_new;             /* default new tokens per prompt */
	sl_sampling sampling;
	char **stop;             /* stop texts (need a tokenizer) */
	int nstop;
	bool resume;
	int progress;            /* 0 none, 1 log lines, 2 a bar (terminal) */
	const char *stats_path;  /* (optional) summary as JSON */
	volatile sig_atomic_t *interrupt;
} sl_job_opts;

typedef struct sl_job_stats {
	int prompts, done, bad, skipped_blocks, resumed_lines;
	bool started; /* compute began: a failure now is the job's (exit 1) */
	long tokens;
	double wall_s, prefill_s, decode_s;
	sl_offload_stats off; /* of prefill + decode */
	/* the cost model's prediction of the blocks run, set by the caller
	 * (predicted false: none, written as null) */
	bool predicted;
	double pred_tok_s, pred_prefill_s, pred_decode_s;
} sl_job_stats;

/* Generation; ps lines in input order; out opened by the caller. */
int sl_job_generate(sl_model *m, const sl_tokenizer *tok, const sl_prompts *ps, sl_output *out,
		    const sl_job_opts *o, sl_job_stats *st);

/* Scoring: logprobs, sum_logprob and perplexity per line. */
int sl_job_score(sl_model *m, const sl_prompts *ps, sl_output *out, const sl_job_opts *o,
		 sl_job_stats *st);

/* Write the summary: to stderr (unless quiet) and to o->stats_path
 * (atomically).  command: "generate" or "score". */
int sl_job_report(const sl_job_stats *st, const sl_job_opts *o, const char *command, bool quiet,
		  const char *backend);

/* Before any compute: that the statistics can be written to path (not a
 * directory, in a folder that exists and is writable). */
int sl_job_check_stats_path(const char *path);

/* --resume against a complete output (opened by sl_output_open with
 * *complete set): 0 when its lines are this input's (this shard's), in
 * order, and no more; an error naming it otherwise. */
int sl_job_check_complete(const sl_prompts *ps, sl_output *out, const sl_job_opts *o);

#endif
