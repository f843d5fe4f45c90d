/*
 * generate.h - greedy generation for a block of prompts: left-pad, prefill,
 * then decode until every sequence has hit EOS or its token limit.
 */
#ifndef SL_GENERATE_H
#define SL_GENERATE_H

#include "model.h"

typedef struct sl_seq {
	const int32_t *prompt; /* borrowed */
	int prompt_len;
	int max_new;           /* > 0 */
	int32_t *out;          /* caller-owned, room for max_new tokens */
	int n_out;             /* written by sl_generator_run */
	bool hit_eos;
} sl_seq;

typedef struct sl_gen_timing {
	double prefill_s; /* prefill and the first token */
	double decode_s;  /* every later token */
	long tokens;      /* new tokens produced */
	int steps;        /* decode steps run */
} sl_gen_timing;

typedef struct sl_generator sl_generator;

/* Room for blocks of up to max_seq sequences whose prompt plus new tokens
 * fit in max_len positions. */
int sl_generator_create(sl_model *m, int max_seq, int max_len, sl_generator **out);
void sl_generator_free(sl_generator *g);

/* Benchmarks: EOS does not end a sequence. */
void sl_generator_ignore_eos(sl_generator *g);

/* Generate for nseq <= max_seq sequences; accumulates into *timing. */
int sl_generator_run(sl_generator *g, sl_seq *seqs, int nseq, sl_gen_timing *timing);

#endif
