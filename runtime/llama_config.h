/*
 * llama_config.h - the shape of a LLaMA-family model (Hugging Face
 * model_type "llama", "mistral", "qwen2"): a checkpoint's config.json, or
 * the published shapes by name for --dummy.
 *
 * The model reads it through sl_model_config (model_config.h), which
 * copies the shape every layer needs and keeps this struct beside it for
 * weights.c and model.c.  It is its own struct so that OPT's stays as it
 * is.
 *
 * The rules, as transformers reads these configs:
 *  - num_key_value_heads missing (or null) is the head count;
 *  - head_dim missing is hidden_size / num_attention_heads;
 *  - rope_theta missing is 10000; rope_scaling null, absent or of type
 *    "default" is none; "linear" (factor) and "llama3" (factor,
 *    low_freq_factor, high_freq_factor, original_max_position_embeddings)
 *    are read into an sl_rope_scaling (backend.h), whose key is
 *    "rope_type" or the older "type"; any other type is refused naming
 *    it.  transformers 5's "rope_parameters" (theta and scaling in one
 *    object) is read the same way;
 *  - tie_word_embeddings missing is false (the default of the three
 *    families' configs);
 *  - biases: Qwen2 has them on q, k and v, always; a Llama config with
 *    attention_bias or mlp_bias true is refused (no published Llama uses
 *    them);
 *  - hidden_act must be "silu";
 *  - eos_token_id may be a list (Llama 3.1): up to SL_LLAMA_MAX_EOS ids.
 *
 * Sliding window (Mistral, Qwen2): honoured by refusal of what it would
 * change.  sliding_window is kept (0: none; Qwen2's only where
 * use_sliding_window is true, as transformers does); within the window,
 * sliding-window attention is full attention, so the model is exact for
 * every sequence of at most sliding_window tokens, and
 * sl_llama_check_window refuses a longer one with a message (the run
 * plan, the block and the model call it through sl_model_check_length).
 * Applying the window (and as a cap on H2O's recent window) is later
 * work.
 */
#ifndef SL_LLAMA_CONFIG_H
#define SL_LLAMA_CONFIG_H

#include "backend.h" /* sl_rope_scaling */

#include <stdbool.h>
#include <stddef.h>

#define SL_LLAMA_MAX_EOS 4

typedef struct sl_llama_config {
	char name[64];
	char model_type[16]; /* "llama", "mistral", "qwen2" */
	int n_layer;
	int n_head;
	int n_kv_head;  /* num_key_value_heads; divides n_head */
	int head_dim;
	int hidden;     /* hidden_size */
	int ffn;        /* intermediate_size */
	int vocab;
	int max_pos;    /* max_position_embeddings */
	float rms_eps;  /* rms_norm_eps */
	double rope_theta;
	sl_rope_scaling rope;
	bool tied;      /* tie_word_embeddings */
	bool qkv_bias;  /* q/k/v projections have biases (Qwen2) */
	int sliding_window; /* 0: none */
	int bos_id;     /* -1: none */
	int n_eos;
	int eos_id[SL_LLAMA_MAX_EOS];
	int pad_id;     /* -1: none */
} sl_llama_config;

/* Read a Hugging Face config.json of model_type llama, mistral or qwen2;
 * anything else is refused in one line naming path and what is wrong. */
int sl_llama_config_load(const char *path, sl_llama_config *out);

/* The published shapes: llama-2-7b, llama-2-13b, llama-2-70b, llama-3-8b,
 * llama-3-70b, mistral-7b (Mistral-7B-v0.1), qwen2-7b. */
int sl_llama_config_named(const char *name, sl_llama_config *out);
const char *sl_llama_names(void);

/* Sizes positive and consistent, ids in the vocabulary, the rope scaling
 * valid for head_dim; path names the source in errors. */
int sl_llama_config_validate(const sl_llama_config *c, const char *path);

/* SL_EUNSUPPORTED where a sequence of n_tokens would pass the sliding
 * window (see above). */
int sl_llama_check_window(const sl_llama_config *c, int n_tokens);

/* Parameter counts: per decoder layer, and the whole model. */
size_t sl_llama_layer_params(const sl_llama_config *c);
size_t sl_llama_total_params(const sl_llama_config *c);

#endif
