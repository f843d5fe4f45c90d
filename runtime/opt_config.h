/*
 * opt_config.h - the shape of an OPT model: the named family (FlexGen's
 * table) or any OPT-shaped checkpoint's config.json.
 */
#ifndef SL_OPT_CONFIG_H
#define SL_OPT_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

typedef struct sl_opt_config {
	char name[64];
	int n_layer;
	int n_head;
	int hidden;       /* hidden_size */
	int ffn;          /* ffn_dim */
	int vocab;        /* vocab_size */
	int max_pos;      /* max_position_embeddings (the table has 2 more rows) */
	int embed_dim;    /* word_embed_proj_dim; != hidden means project_in/out */
	bool pre_ln;      /* do_layer_norm_before (false for 350m) */
	bool final_ln;    /* the decoder's final layer norm exists */
	float ln_eps;
	int pad_id, bos_id, eos_id;
} sl_opt_config;

#define SL_OPT_POS_OFFSET 2 /* OPT's learned positions start at row 2 */

/* The named family: opt-125m, -350m, -1.3b, -2.7b, -6.7b, -13b, -30b, -66b, -175b. */
int sl_opt_config_named(const char *name, sl_opt_config *out);

/* Read a Hugging Face config.json; rejects models that are not OPT-shaped. */
int sl_opt_config_load(const char *path, sl_opt_config *out);

/* Check sizes are positive and consistent; path names the source in errors. */
int sl_opt_config_validate(const sl_opt_config *c, const char *path);

static inline int sl_opt_head_dim(const sl_opt_config *c)
{
	return c->hidden / c->n_head;
}

/* Parameter counts: per decoder layer, and everything else. */
size_t sl_opt_layer_params(const sl_opt_config *c);
size_t sl_opt_total_params(const sl_opt_config *c);

/* Comma-separated list of the named models, for messages. */
const char *sl_opt_names(void);

#endif
