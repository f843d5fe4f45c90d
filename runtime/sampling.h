/*
 * sampling.h - choosing the next token from logits: greedy, or temperature
 * sampling restricted by top-k and top-p (nucleus), as Hugging Face's
 * warpers define them.
 *
 * Reproducible whatever the batch composition: the random number for a
 * sequence's step comes from a counter-based generator keyed by (seed, the
 * sequence's key, the step), never from a stream shared by the batch.
 */
#ifndef SL_SAMPLING_H
#define SL_SAMPLING_H

#include <stdint.h>

typedef struct sl_sampling {
	float temperature; /* 0: greedy */
	int top_k;         /* 0: off */
	float top_p;       /* 1: off; (0, 1] */
	uint64_t seed;
} sl_sampling;

/* Scratch for one call over a vocabulary of n: n floats and n ints. */
typedef struct sl_sample_ws {
	float *p;
	int32_t *idx;
	int n;
} sl_sample_ws;

int sl_sample_ws_init(sl_sample_ws *ws, int n);
void sl_sample_ws_free(sl_sample_ws *ws);

/* The uniform number in [0, 1) that (seed, key, step) draws. */
double sl_sample_uniform(uint64_t seed, uint64_t key, uint64_t step);

/*
 * The next token for one sequence from its n logits.  Greedy takes the
 * smallest index of the maximum.  Otherwise: logits / temperature; top-k
 * keeps tokens whose value is at least the k-th largest (ties kept, as
 * HF); top-p keeps the smallest set of most probable tokens whose mass
 * reaches top_p (at least one); one draw from the kept set.  A
 * temperature so low that the scaled logits overflow draws the greedy
 * token (the limit).  Logits that are not all finite (NaN or an infinity)
 * give -1: they hold no distribution.  Reads logits[0..n) and, when
 * sampling, ws (room for n), nothing else, whatever their values.
 */
int32_t sl_sample(const float *logits, int n, const sl_sampling *sp, uint64_t key, uint64_t step,
		  sl_sample_ws *ws);

#endif
