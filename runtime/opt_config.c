/*
 * opt_config.c - OPT shapes: the published family and config.json parsing.
 */
#include "opt_config.h"
#include "config_json.h"
#include "sl_common.h"

#include <jansson.h>
#include <string.h>

static const struct {
	const char *name;
	int layers, heads, hidden;
} opt_family[] = {
	{ "opt-125m", 12, 12, 768 },   { "opt-350m", 24, 16, 1024 },
	{ "opt-1.3b", 24, 32, 2048 },  { "opt-2.7b", 32, 32, 2560 },
	{ "opt-6.7b", 32, 32, 4096 },  { "opt-13b", 40, 40, 5120 },
	{ "opt-30b", 48, 56, 7168 },   { "opt-66b", 64, 72, 9216 },
	{ "opt-175b", 96, 96, 12288 },
};

const char *sl_opt_names(void)
{
	return "opt-125m, opt-350m, opt-1.3b, opt-2.7b, opt-6.7b, opt-13b, opt-30b, opt-66b, opt-175b";
}

int sl_opt_config_named(const char *name, sl_opt_config *out)
{
	const char *n = name;
	if (!strncmp(n, "facebook/", 9))
		n += 9;
	for (size_t i = 0; i < SL_ARRAY_LEN(opt_family); i++) {
		if (strcmp(n, opt_family[i].name))
			continue;
		memset(out, 0, sizeof *out);
		snprintf(out->name, sizeof out->name, "%s", opt_family[i].name);
		out->n_layer = opt_family[i].layers;
		out->n_head = opt_family[i].heads;
		out->hidden = opt_family[i].hidden;
		out->ffn = 4 * out->hidden;
		out->vocab = 50272;
		out->max_pos = 2048;
		out->embed_dim = out->hidden;
		out->pre_ln = true;
		out->final_ln = true;
		out->ln_eps = 1e-5f;
		out->pad_id = 1;
		out->bos_id = 2;
		out->eos_id = 2;
		if (!strcmp(n, "opt-350m")) { /* post-LN, 512-wide embeddings */
			out->embed_dim = 512;
			out->pre_ln = false;
			out->final_ln = false;
		}
		return 0;
	}
	return sl_err(SL_ENOTFOUND, "unknown model name '%s' (known: %s)", name, sl_opt_names());
}

int sl_opt_config_validate(const sl_opt_config *c, const char *path)
{
	if (c->n_layer <= 0 || c->n_head <= 0 || c->hidden <= 0 || c->ffn <= 0 || c->vocab <= 0 ||
	    c->max_pos <= 0 || c->embed_dim <= 0)
		return sl_err(SL_EFORMAT, "%s: model sizes must be positive", path);
	if (c->hidden % c->n_head)
		return sl_err(SL_EFORMAT, "%s: hidden_size %d is not a multiple of num_attention_heads %d",
			      path, c->hidden, c->n_head);
	if (c->hidden > (1 << 17) || c->ffn > (1 << 19) || c->vocab > (1 << 24) ||
	    c->max_pos > (1 << 20) || c->n_layer > 4096 || c->embed_dim > (1 << 17))
		return sl_err(SL_EFORMAT, "%s: model sizes are implausibly large", path);
	const struct {
		const char *field;
		int id;
	} ids[] = { { "bos_token_id", c->bos_id }, { "eos_token_id", c->eos_id },
		    { "pad_token_id", c->pad_id } };
	for (size_t i = 0; i < SL_ARRAY_LEN(ids); i++)
		if (ids[i].id < 0 || ids[i].id >= c->vocab)
			return sl_err(SL_EFORMAT, "%s: %s %d is outside the vocabulary (0..%d)", path,
				      ids[i].field, ids[i].id, c->vocab - 1);
	return 0;
}

int sl_opt_config_load(const char *path, sl_opt_config *out)
{
	memset(out, 0, sizeof *out);
	json_t *root;
	SL_TRY(sl_config_json_open(path, &root));
	int rc = 0;
	const char *mt = json_string_value(json_object_get(root, "model_type"));
	if (!mt || strcmp(mt, "opt")) {
		rc = sl_err(SL_EUNSUPPORTED, "%s: not an OPT model (model_type is %s%s%s)", path,
			    mt ? "'" : "", mt ? mt : "missing", mt ? "'" : "");
		goto done;
	}
	const char *act = json_string_value(json_object_get(root, "activation_function"));
	if (act && strcmp(act, "relu")) {
		rc = sl_err(SL_EUNSUPPORTED, "%s: activation_function '%s' is not supported (OPT uses relu)",
			    path, act);
		goto done;
	}
	bool enable_bias, affine, remove_final;
	if ((rc = sl_config_get_int(root, "num_hidden_layers", 0, true, path, &out->n_layer)) ||
	    (rc = sl_config_get_int(root, "num_attention_heads", 0, true, path, &out->n_head)) ||
	    (rc = sl_config_get_int(root, "hidden_size", 0, true, path, &out->hidden)) ||
	    (rc = sl_config_get_int(root, "ffn_dim", 0, true, path, &out->ffn)) ||
	    (rc = sl_config_get_int(root, "vocab_size", 0, true, path, &out->vocab)) ||
	    (rc = sl_config_get_int(root, "max_position_embeddings", 2048, false, path, &out->max_pos)) ||
	    (rc = sl_config_get_int(root, "word_embed_proj_dim", out->hidden, false, path, &out->embed_dim)) ||
	    (rc = sl_config_get_int(root, "pad_token_id", 1, false, path, &out->pad_id)) ||
	    (rc = sl_config_get_int(root, "bos_token_id", 2, false, path, &out->bos_id)) ||
	    (rc = sl_config_get_int(root, "eos_token_id", 2, false, path, &out->eos_id)) ||
	    (rc = sl_config_get_bool(root, "do_layer_norm_before", true, path, &out->pre_ln)) ||
	    (rc = sl_config_get_bool(root, "enable_bias", true, path, &enable_bias)) ||
	    (rc = sl_config_get_bool(root, "layer_norm_elementwise_affine", true, path, &affine)) ||
	    (rc = sl_config_get_bool(root, "_remove_final_layer_norm", false, path, &remove_final)))
		goto done;
	if (!enable_bias || !affine) {
		rc = sl_err(SL_EUNSUPPORTED, "%s: OPT variants without biases or layer-norm weights are not supported",
			    path);
		goto done;
	}
	out->final_ln = out->pre_ln && !remove_final;
	out->ln_eps = 1e-5f;
	const char *name = json_string_value(json_object_get(root, "_name_or_path"));
	snprintf(out->name, sizeof out->name, "%s", name && *name ? name : "opt");
	rc = sl_opt_config_validate(out, path);
done:
	json_decref(root);
	return rc;
}

size_t sl_opt_layer_params(const sl_opt_config *c)
{
	size_t h = (size_t)c->hidden, f = (size_t)c->ffn;
	return 4 * (h * h + h) + 2 * h * f + f + h + 4 * h;
}

size_t sl_opt_total_params(const sl_opt_config *c)
{
	size_t h = (size_t)c->hidden, e = (size_t)c->embed_dim;
	size_t n = (size_t)c->n_layer * sl_opt_layer_params(c);
	n += (size_t)c->vocab * e + (size_t)(c->max_pos + SL_OPT_POS_OFFSET) * h;
	if (e != h)
		n += 2 * e * h;
	if (c->final_ln)
		n += 2 * h;
	return n;
}
