/*
 * block.h - what generation and scoring share for a block of sequences on
 * a model: its KV cache, the model's workspace reserved for it, and its
 * prompts left-padded into one batch for the prefill (internal to the
 * runtime; generate.c and score.c embed it).
 */
#ifndef SL_BLOCK_H
#define SL_BLOCK_H

#include "model.h"

typedef struct sl_block {
	sl_model *m;    /* borrowed */
	sl_kv *kv;      /* owned: for max_seq sequences, prompts of max_prompt */
	int max_seq, max_len;
	int32_t *padded; /* (max_seq, max_len): the block's prompts, left-padded */
	int *npad;       /* (max_seq): the padding rows of each */
} sl_block;

/* Room for blocks of up to max_seq sequences whose prompts have at most
 * max_prompt tokens and whose prompt plus later tokens fit in max_len
 * (SL_ERANGE when the model has fewer positions).  On failure *b holds
 * nothing to release. */
int sl_block_init(sl_block *b, sl_model *m, int max_seq, int max_len, int max_prompt);
void sl_block_release(sl_block *b);

/* Sequence s's prompt (len tokens, len <= t) left-padded to t rows. */
void sl_block_pad(sl_block *b, int s, int t, const int32_t *prompt, int len);

/* Prefill the first nseq padded prompts of t rows into the cache. */
int sl_block_prefill(sl_block *b, int nseq, int t);

#endif
