/*
 * model_config.c - a model's family and shared shape (model_config.h), from
 * a config.json's model_type or a --dummy name.
 */
#include "model_config.h"
#include "config_json.h"
#include "sl_common.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

void sl_model_config_of_opt(const sl_opt_config *o, sl_model_config *out)
{
	memset(out, 0, sizeof *out);
	out->family = SL_FAMILY_OPT;
	snprintf(out->name, sizeof out->name, "%s", o->name);
	out->n_layer = o->n_layer;
	out->n_head = out->n_kv_head = o->n_head;
	out->head_dim = o->hidden / o->n_head;
	out->hidden = o->hidden;
	out->ffn = o->ffn;
	out->vocab = o->vocab;
	out->max_pos = o->max_pos;
	out->embed_dim = o->embed_dim;
	out->pad_id = o->pad_id;
	out->bos_id = o->bos_id;
	out->eos_id = o->eos_id;
	out->opt = *o;
}

void sl_model_config_of_llama(const sl_llama_config *l, sl_model_config *out)
{
	memset(out, 0, sizeof *out);
	out->family = SL_FAMILY_LLAMA;
	snprintf(out->name, sizeof out->name, "%s", l->name);
	out->n_layer = l->n_layer;
	out->n_head = l->n_head;
	out->n_kv_head = l->n_kv_head;
	out->head_dim = l->head_dim;
	out->hidden = l->hidden;
	out->ffn = l->ffn;
	out->vocab = l->vocab;
	out->max_pos = l->max_pos;
	out->embed_dim = l->hidden;
	/* padding rows are never cached nor attended: any id in the
	 * vocabulary does for them */
	out->pad_id = l->pad_id >= 0 ? l->pad_id : 0;
	out->bos_id = l->bos_id;
	out->eos_id = l->n_eos > 0 ? l->eos_id[0] : -1;
	out->llama = *l;
}

int sl_model_config_load(const char *path, sl_model_config *out)
{
	memset(out, 0, sizeof *out);
	/* the model_type first (the family loaders read the file again, each
	 * with its own checks and messages) */
	json_t *root;
	SL_TRY(sl_config_json_open(path, &root));
	const char *mt = json_string_value(json_object_get(root, "model_type"));
	char type[32];
	snprintf(type, sizeof type, "%s", mt ? mt : "");
	json_decref(root);
	if (!strcmp(type, "opt")) {
		sl_opt_config o;
		SL_TRY(sl_opt_config_load(path, &o));
		sl_model_config_of_opt(&o, out);
		return 0;
	}
	if (!strcmp(type, "llama") || !strcmp(type, "mistral") || !strcmp(type, "qwen2")) {
		sl_llama_config l;
		SL_TRY(sl_llama_config_load(path, &l));
		sl_model_config_of_llama(&l, out);
		return 0;
	}
	return sl_err(SL_EUNSUPPORTED,
		      "%s: model_type %s%s%s is not supported (sluice runs opt, llama, mistral and qwen2)",
		      path, mt ? "'" : "", mt ? type : "missing", mt ? "'" : "");
}

int sl_model_config_named(const char *name, sl_model_config *out)
{
	sl_opt_config o;
	if (sl_opt_config_named(name, &o) == 0) {
		sl_model_config_of_opt(&o, out);
		return 0;
	}
	sl_llama_config l;
	if (sl_llama_config_named(name, &l) == 0) {
		sl_model_config_of_llama(&l, out);
		return 0;
	}
	return sl_err(SL_ENOTFOUND, "unknown model name '%s' (known: %s)", name, sl_model_names());
}

const char *sl_model_names(void)
{
	static char names[512];
	if (!names[0])
		snprintf(names, sizeof names, "%s, %s", sl_opt_names(), sl_llama_names());
	return names;
}

size_t sl_model_layer_params(const sl_model_config *c)
{
	return c->family == SL_FAMILY_OPT ? sl_opt_layer_params(&c->opt)
					  : sl_llama_layer_params(&c->llama);
}

size_t sl_model_total_params(const sl_model_config *c)
{
	return c->family == SL_FAMILY_OPT ? sl_opt_total_params(&c->opt)
					  : sl_llama_total_params(&c->llama);
}

int sl_model_check_length(const sl_model_config *c, int n_tokens)
{
	return c->family == SL_FAMILY_LLAMA ? sl_llama_check_window(&c->llama, n_tokens) : 0;
}
