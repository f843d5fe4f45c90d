/*
 * score.h - log-probabilities of continuations.  The prompt is prefilled at
 * once and the continuation fed one token at a time through the same decode
 * path as generation, so KV-cache compression acts as it does there.
 */
#ifndef SL_SCORE_H
#define SL_SCORE_H

#include "model.h"

#include <signal.h>

typedef struct sl_score_seq {
	const int32_t *prompt, *cont; /* borrowed */
	int prompt_len, cont_len;     /* both > 0 */
	int line;                     /* (optional) its input line, for messages; 0: none */
	const char *id;               /* (optional, borrowed) its id as JSON, for messages */
	double *logprobs;             /* caller-owned, cont_len values */
} sl_score_seq;

typedef struct sl_scorer sl_scorer;

/* Room for blocks of up to max_seq sequences of up to max_len tokens
 * (prompt plus continuation). */
int sl_scorer_create(sl_model *m, int max_seq, int max_len, int max_prompt, sl_scorer **out);
void sl_scorer_free(sl_scorer *sc);

/* Score one block.  interrupt as for generation (may be NULL).  Logits
 * that are not finite (NaN or an infinity, from an overflow) where a
 * sequence is scored fail the block with SL_ERANGE and a message naming
 * the sequence (its line and id) and the step. */
int sl_scorer_run(sl_scorer *sc, sl_score_seq *seqs, int nseq, volatile sig_atomic_t *interrupt);

#endif
