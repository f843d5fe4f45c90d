/*
 * weights.h - an OPT model's weights in a backend's device memory (fp16):
 * loaded from safetensors (fp32/fp16/bf16, one file or sharded, with or
 * without the "model." prefix, tied or stored LM head) or made up
 * deterministically (--dummy) without reading a file.
 */
#ifndef SL_WEIGHTS_H
#define SL_WEIGHTS_H

#include "backend.h"
#include "opt_config.h"
#include "safetensors.h"

typedef struct sl_opt_layer_w {
	sl_half *q_w, *q_b, *k_w, *k_b, *v_w, *v_b, *o_w, *o_b; /* (h, h), (h) */
	sl_half *ln1_g, *ln1_b;                                 /* self_attn_layer_norm */
	sl_half *fc1_w, *fc1_b;                                 /* (f, h), (f) */
	sl_half *fc2_w, *fc2_b;                                 /* (h, f), (h) */
	sl_half *ln2_g, *ln2_b;                                 /* the layer's final_layer_norm */
	void *block;                                            /* one allocation */
	size_t block_bytes;
} sl_opt_layer_w;

typedef struct sl_opt_weights {
	sl_half *embed_tokens;   /* (vocab, e) */
	sl_half *embed_pos;      /* (max_pos + 2, h) */
	sl_half *project_in;     /* (h, e) or NULL */
	sl_half *project_out;    /* (e, h) or NULL */
	sl_half *final_ln_g, *final_ln_b; /* (h) or NULL */
	sl_half *lm_head;        /* (vocab, e): embed_tokens when tied */
	void *block;
	size_t block_bytes;
	sl_opt_layer_w *layers;  /* n_layer */
	int n_layer;
	size_t bytes;            /* all device bytes */
} sl_opt_weights;

/* Load from an open checkpoint; dir names it in messages. */
int sl_weights_load(sl_backend *b, sl_queue *q, const sl_opt_config *c, const sl_st_set *st,
		    const char *dir, sl_opt_weights *w);

/* Deterministic pseudo-random weights of the right shapes (same seed, same
 * weights, whatever the thread count). */
int sl_weights_dummy(sl_backend *b, sl_queue *q, const sl_opt_config *c, uint64_t seed,
		     sl_opt_weights *w);

void sl_weights_free(sl_backend *b, sl_opt_weights *w);

#endif
