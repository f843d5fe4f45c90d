/*
 * model_config.h - the shape of any model sluice runs: its family (OPT or
 * the LLaMA family), the dimensions every layer of the engine reads (the
 * run plan, the KV cache, the cost model, the weight store's key), and
 * beside them the family's own config, which only the weights' table and
 * the forward pass read.
 *
 * The shared dimensions are the family config's, copied once when it is
 * read (sl_model_config_of_opt, _of_llama), so code that sizes buffers
 * never asks which family it serves:
 *  - q_dim = n_head * head_dim is the width of the query and attention
 *    output rows; kv_dim = n_kv_head * head_dim of the key and value rows,
 *    and a KV cache slot holds n_kv_head heads (grouped-query attention:
 *    n_kv_head divides n_head; OPT has n_kv_head == n_head);
 *  - embed_dim is the embeddings' width (OPT's word_embed_proj_dim, which
 *    differs from hidden where project_in/out exist; hidden otherwise);
 *  - ffn is the MLP's inner width (fc1's rows; SwiGLU's gate and up);
 *  - pad_id is the id written into padding rows, which are never cached
 *    nor attended: the config's pad token, or 0 where it names none (every
 *    Llama 2/3 config); eos_id the first of the config's end tokens.
 */
#ifndef SL_MODEL_CONFIG_H
#define SL_MODEL_CONFIG_H

#include "llama_config.h"
#include "opt_config.h"

#include <stdbool.h>
#include <stddef.h>

enum sl_family { SL_FAMILY_OPT, SL_FAMILY_LLAMA };

typedef struct sl_model_config {
	enum sl_family family;
	char name[64];
	int n_layer;
	int n_head;
	int n_kv_head;
	int head_dim;
	int hidden;
	int ffn;
	int vocab;
	int max_pos;
	int embed_dim;
	int pad_id, bos_id, eos_id;
	sl_opt_config opt;     /* family OPT */
	sl_llama_config llama; /* family LLaMA */
} sl_model_config;

void sl_model_config_of_opt(const sl_opt_config *o, sl_model_config *out);
void sl_model_config_of_llama(const sl_llama_config *l, sl_model_config *out);

/* Read a Hugging Face config.json, the family by its model_type ("opt";
 * "llama", "mistral", "qwen2"); any other (or none) is refused in one
 * line naming path, the model_type and the ones supported. */
int sl_model_config_load(const char *path, sl_model_config *out);

/* A named shape (--dummy): OPT's family or the LLaMA family's. */
int sl_model_config_named(const char *name, sl_model_config *out);
/* Every name sl_model_config_named knows, comma-separated, for messages. */
const char *sl_model_names(void);

static inline int sl_model_head_dim(const sl_model_config *c)
{
	return c->head_dim;
}
static inline int sl_model_q_dim(const sl_model_config *c)
{
	return c->n_head * c->head_dim;
}
static inline int sl_model_kv_dim(const sl_model_config *c)
{
	return c->n_kv_head * c->head_dim;
}

/* Parameter counts: per decoder layer, and the whole model. */
size_t sl_model_layer_params(const sl_model_config *c);
size_t sl_model_total_params(const sl_model_config *c);

/* SL_EUNSUPPORTED, naming the model, where a sequence of n_tokens would
 * need what sluice does not do for it (a LLaMA-family sliding window
 * shorter than the sequence: llama_config.h); 0 otherwise. */
int sl_model_check_length(const sl_model_config *c, int n_tokens);

#endif
