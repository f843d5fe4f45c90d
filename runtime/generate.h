/*
 * generate.h - generation for a block of prompts: left-pad, prefill, then
 * decode until every sequence has met EOS, a stop condition or its limit.
 */
#ifndef SL_GENERATE_H
#define SL_GENERATE_H

#include "model.h"
#include "sampling.h"

#include <signal.h>

typedef struct sl_seq {
	const int32_t *prompt; /* borrowed */
	int prompt_len;
	int max_new;           /* > 0 */
	uint64_t key;          /* sampling key: the prompt's index in the job */
	int line;              /* (optional) its input line, for messages; 0: none */
	const char *id;        /* (optional, borrowed) its id as JSON, for messages */
	int32_t *out;          /* caller-owned, room for max_new tokens */
	int n_out;             /* written by sl_generator_run */
	bool hit_eos;          /* ended by EOS (kept as its last token) */
	bool stopped;          /* ended by the on_token callback (stop text) */
} sl_seq;

typedef struct sl_gen_timing {
	double prefill_s; /* prefill and the first token */
	double decode_s;  /* every later token */
	long tokens;      /* new tokens produced */
	int steps;        /* decode steps run */
} sl_gen_timing;

typedef struct sl_gen_opts {
	const sl_sampling *sampling; /* NULL or temperature 0: greedy */
	/* (optional) after a token joins a running sequence; true ends it */
	bool (*on_token)(void *ctx, int s, sl_seq *seq);
	/* (optional) after each step, with the tokens produced so far */
	void (*on_step)(void *ctx, long tokens);
	void *ctx;
	/* (optional) checked between steps: non-zero stops the block with
	 * SL_EINTERRUPTED (its sequences are incomplete) */
	volatile sig_atomic_t *interrupt;
} sl_gen_opts;

typedef struct sl_generator sl_generator;

/* Room for blocks of up to max_seq sequences whose prompts have at most
 * max_prompt tokens and whose prompt plus new tokens fit in max_len. */
int sl_generator_create(sl_model *m, int max_seq, int max_len, int max_prompt,
			sl_generator **out);
void sl_generator_free(sl_generator *g);

/* Benchmarks: EOS does not end a sequence. */
void sl_generator_ignore_eos(sl_generator *g);

/* Generate for nseq <= max_seq sequences; accumulates into *timing.
 * opts may be NULL (greedy, no callbacks).  Logits that are not finite
 * (NaN or an infinity, from an overflow) for a running sequence fail the
 * block with SL_ERANGE and a message naming the sequence (its line and id)
 * and the step. */
int sl_generator_run(sl_generator *g, sl_seq *seqs, int nseq, const sl_gen_opts *opts,
		     sl_gen_timing *timing);

#endif
