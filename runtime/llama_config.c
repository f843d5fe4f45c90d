/*
 * llama_config.c - LLaMA-family shapes: the published models and
 * config.json parsing (llama_config.h states the rules).
 */
#include "llama_config.h"
#include "config_json.h"
#include "sl_common.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

/* The published configs' shapes (their config.json on the Hugging Face
 * hub: meta-llama/Llama-2-*-hf, meta-llama/Meta-Llama-3-*,
 * mistralai/Mistral-7B-v0.1, Qwen/Qwen2-7B). */
static const struct {
	const char *name, *type;
	int layers, heads, kv, hidden, ffn, vocab, max_pos;
	float eps;
	double theta;
	bool qkv_bias;
	int window, bos, eos;
} llama_family[] = {
	{ "llama-2-7b", "llama", 32, 32, 32, 4096, 11008, 32000, 4096, 1e-5f, 1e4, false, 0, 1, 2 },
	{ "llama-2-13b", "llama", 40, 40, 40, 5120, 13824, 32000, 4096, 1e-5f, 1e4, false, 0, 1, 2 },
	{ "llama-2-70b", "llama", 80, 64, 8, 8192, 28672, 32000, 4096, 1e-5f, 1e4, false, 0, 1, 2 },
	{ "llama-3-8b", "llama", 32, 32, 8, 4096, 14336, 128256, 8192, 1e-5f, 5e5, false, 0, 128000,
	  128001 },
	{ "llama-3-70b", "llama", 80, 64, 8, 8192, 28672, 128256, 8192, 1e-5f, 5e5, false, 0, 128000,
	  128001 },
	{ "mistral-7b", "mistral", 32, 32, 8, 4096, 14336, 32000, 32768, 1e-5f, 1e4, false, 4096, 1,
	  2 },
	{ "qwen2-7b", "qwen2", 28, 28, 4, 3584, 18944, 152064, 131072, 1e-6f, 1e6, true, 0, 151643,
	  151643 },
};

const char *sl_llama_names(void)
{
	return "llama-2-7b, llama-2-13b, llama-2-70b, llama-3-8b, llama-3-70b, mistral-7b, qwen2-7b";
}

int sl_llama_config_named(const char *name, sl_llama_config *out)
{
	for (size_t i = 0; i < SL_ARRAY_LEN(llama_family); i++) {
		if (strcmp(name, llama_family[i].name))
			continue;
		memset(out, 0, sizeof *out);
		snprintf(out->name, sizeof out->name, "%s", llama_family[i].name);
		snprintf(out->model_type, sizeof out->model_type, "%s", llama_family[i].type);
		out->n_layer = llama_family[i].layers;
		out->n_head = llama_family[i].heads;
		out->n_kv_head = llama_family[i].kv;
		out->hidden = llama_family[i].hidden;
		out->head_dim = out->hidden / out->n_head;
		out->ffn = llama_family[i].ffn;
		out->vocab = llama_family[i].vocab;
		out->max_pos = llama_family[i].max_pos;
		out->rms_eps = llama_family[i].eps;
		out->rope_theta = llama_family[i].theta;
		out->rope.type = SL_ROPE_DEFAULT;
		out->qkv_bias = llama_family[i].qkv_bias;
		out->sliding_window = llama_family[i].window;
		out->bos_id = llama_family[i].bos;
		out->n_eos = 1;
		out->eos_id[0] = llama_family[i].eos;
		out->pad_id = -1;
		return 0;
	}
	return sl_err(SL_ENOTFOUND, "unknown model name '%s' (known: %s)", name, sl_llama_names());
}

int sl_llama_config_validate(const sl_llama_config *c, const char *path)
{
	if (c->n_layer <= 0 || c->n_head <= 0 || c->n_kv_head <= 0 || c->hidden <= 0 ||
	    c->head_dim <= 0 || c->ffn <= 0 || c->vocab <= 0 || c->max_pos <= 0)
		return sl_err(SL_EFORMAT, "%s: model sizes must be positive", path);
	if (c->n_head % c->n_kv_head)
		return sl_err(SL_EFORMAT,
			      "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d",
			      path, c->n_head, c->n_kv_head);
	if (c->hidden > (1 << 17) || c->ffn > (1 << 19) || c->vocab > (1 << 24) ||
	    c->max_pos > (1 << 24) || c->n_layer > 4096 || c->n_head > 4096)
		return sl_err(SL_EFORMAT, "%s: model sizes are implausibly large", path);
	if (!(c->rms_eps > 0.0f) || !isfinite(c->rms_eps))
		return sl_err(SL_EFORMAT, "%s: rms_norm_eps %g is not a positive number", path,
			      (double)c->rms_eps);
	if (c->sliding_window < 0)
		return sl_err(SL_EFORMAT, "%s: sliding_window %d is negative", path, c->sliding_window);
	float inv[SL_ROPE_MAX_HD / 2];
	if (sl_rope_inv_freq(c->head_dim, c->rope_theta, &c->rope, inv) < 0) {
		char why[256]; /* the message buffer is sl_err's own */
		snprintf(why, sizeof why, "%s", sl_errmsg());
		return sl_err(SL_EFORMAT, "%s: %s", path, why);
	}
	const struct {
		const char *field;
		int id;
	} ids[] = { { "bos_token_id", c->bos_id }, { "pad_token_id", c->pad_id } };
	for (size_t i = 0; i < SL_ARRAY_LEN(ids); i++)
		if (ids[i].id < -1 || ids[i].id >= c->vocab)
			return sl_err(SL_EFORMAT, "%s: %s %d is outside the vocabulary (0..%d)", path,
				      ids[i].field, ids[i].id, c->vocab - 1);
	for (int i = 0; i < c->n_eos; i++)
		if (c->eos_id[i] < 0 || c->eos_id[i] >= c->vocab)
			return sl_err(SL_EFORMAT, "%s: eos_token_id %d is outside the vocabulary (0..%d)",
				      path, c->eos_id[i], c->vocab - 1);
	return 0;
}

int sl_llama_check_window(const sl_llama_config *c, int n_tokens)
{
	if (c->sliding_window > 0 && n_tokens > c->sliding_window)
		return sl_err(SL_EUNSUPPORTED,
			      "%s: a sequence of %d tokens passes the sliding window of %d, which "
			      "sluice does not apply yet (keep prompt + new tokens within it)",
			      c->name, n_tokens, c->sliding_window);
	return 0;
}

/* ---- config.json --------------------------------------------------------- */

/* rope_scaling (or transformers 5's rope_parameters) into c->rope */
static int get_rope(json_t *rs, const char *field, const char *path, sl_llama_config *c)
{
	memset(&c->rope, 0, sizeof c->rope);
	if (!rs || json_is_null(rs))
		return 0;
	if (!json_is_object(rs))
		return sl_err(SL_EFORMAT, "%s: %s is not an object", path, field);
	json_t *t = json_object_get(rs, "rope_type");
	if (!t)
		t = json_object_get(rs, "type");
	const char *type = json_string_value(t);
	if (!type)
		return sl_err(SL_EFORMAT, "%s: %s has no rope_type", path, field);
	double d = 0;
	int rc;
	if (!strcmp(type, "default"))
		return 0;
	if (!strcmp(type, "linear")) {
		c->rope.type = SL_ROPE_LINEAR;
		SL_TRY(sl_config_get_num(rs, "factor", 0, true, path, &c->rope.factor));
		return 0;
	}
	if (!strcmp(type, "llama3")) {
		c->rope.type = SL_ROPE_LLAMA3;
		if ((rc = sl_config_get_num(rs, "factor", 0, true, path, &c->rope.factor)) ||
		    (rc = sl_config_get_num(rs, "low_freq_factor", 0, true, path, &c->rope.low_freq_factor)) ||
		    (rc = sl_config_get_num(rs, "high_freq_factor", 0, true, path, &c->rope.high_freq_factor)) ||
		    (rc = sl_config_get_num(rs, "original_max_position_embeddings", 0, true, path, &d)))
			return rc;
		if (d != floor(d) || d < 1 || d > (1 << 30))
			return sl_err(SL_EFORMAT,
				      "%s: %s original_max_position_embeddings %g is not a positive "
				      "integer",
				      path, field, d);
		c->rope.original_max_position_embeddings = (int)d;
		return 0;
	}
	return sl_err(SL_EUNSUPPORTED, "%s: %s type '%s' is not supported (default, linear, llama3)",
		      path, field, type);
}

static int get_eos(json_t *root, const char *path, sl_llama_config *c)
{
	json_t *v = json_object_get(root, "eos_token_id");
	c->n_eos = 0;
	if (!v || json_is_null(v))
		return 0;
	if (json_is_array(v)) {
		if (json_array_size(v) > SL_LLAMA_MAX_EOS)
			return sl_err(SL_EUNSUPPORTED, "%s: eos_token_id lists %zu ids (at most %d)",
				      path, json_array_size(v), SL_LLAMA_MAX_EOS);
		for (size_t i = 0; i < json_array_size(v); i++) {
			json_t *e = json_array_get(v, i);
			if (!json_is_integer(e) || json_integer_value(e) < 0 ||
			    json_integer_value(e) > (1 << 30))
				return sl_err(SL_EFORMAT, "%s: eos_token_id[%zu] is not a valid id",
					      path, i);
			c->eos_id[c->n_eos++] = (int)json_integer_value(e);
		}
		return 0;
	}
	int id;
	SL_TRY(sl_config_get_int(root, "eos_token_id", -1, false, path, &id));
	c->eos_id[c->n_eos++] = id;
	return 0;
}

int sl_llama_config_load(const char *path, sl_llama_config *out)
{
	memset(out, 0, sizeof *out);
	json_t *root;
	SL_TRY(sl_config_json_open(path, &root));
	int rc = 0;
	const char *mt = json_string_value(json_object_get(root, "model_type"));
	if (!mt || (strcmp(mt, "llama") && strcmp(mt, "mistral") && strcmp(mt, "qwen2"))) {
		rc = sl_err(SL_EUNSUPPORTED,
			    "%s: model_type %s%s%s is not supported (llama, mistral, qwen2)", path,
			    mt ? "'" : "", mt ? mt : "missing", mt ? "'" : "");
		goto done;
	}
	snprintf(out->model_type, sizeof out->model_type, "%s", mt);
	const bool qwen2 = !strcmp(mt, "qwen2");
	const char *act = json_string_value(json_object_get(root, "hidden_act"));
	if (act && strcmp(act, "silu")) {
		rc = sl_err(SL_EUNSUPPORTED, "%s: hidden_act '%s' is not supported (silu)", path, act);
		goto done;
	}
	bool attn_bias, mlp_bias, use_window = true;
	double eps;
	if ((rc = sl_config_get_int(root, "num_hidden_layers", 0, true, path, &out->n_layer)) ||
	    (rc = sl_config_get_int(root, "num_attention_heads", 0, true, path, &out->n_head)) ||
	    (rc = sl_config_get_int(root, "num_key_value_heads", out->n_head, false, path, &out->n_kv_head)) ||
	    (rc = sl_config_get_int(root, "hidden_size", 0, true, path, &out->hidden)) ||
	    (rc = sl_config_get_int(root, "intermediate_size", 0, true, path, &out->ffn)) ||
	    (rc = sl_config_get_int(root, "vocab_size", 0, true, path, &out->vocab)) ||
	    (rc = sl_config_get_int(root, "max_position_embeddings", 2048, false, path, &out->max_pos)) ||
	    (rc = sl_config_get_int(root, "bos_token_id", -1, false, path, &out->bos_id)) ||
	    (rc = sl_config_get_int(root, "pad_token_id", -1, false, path, &out->pad_id)) ||
	    (rc = sl_config_get_num(root, "rms_norm_eps", 1e-6, false, path, &eps)) ||
	    (rc = sl_config_get_bool(root, "tie_word_embeddings", false, path, &out->tied)) ||
	    (rc = sl_config_get_bool(root, "attention_bias", false, path, &attn_bias)) ||
	    (rc = sl_config_get_bool(root, "mlp_bias", false, path, &mlp_bias)) ||
	    (rc = get_eos(root, path, out)))
		goto done;
	if (out->n_head <= 0) {
		rc = sl_err(SL_EFORMAT, "%s: num_attention_heads must be positive", path);
		goto done;
	}
	if ((rc = sl_config_get_int(root, "head_dim", out->hidden / out->n_head, false, path,
			  &out->head_dim)))
		goto done;
	if (!qwen2 && (attn_bias || mlp_bias)) {
		rc = sl_err(SL_EUNSUPPORTED, "%s: %s true is not supported (no biases in Llama)", path,
			    attn_bias ? "attention_bias" : "mlp_bias");
		goto done;
	}
	out->qkv_bias = qwen2;
	out->rms_eps = (float)eps;

	/* theta and scaling: transformers 5's rope_parameters, else the
	 * published form (rope_theta, rope_scaling) */
	json_t *rp = json_object_get(root, "rope_parameters");
	if (rp && !json_is_null(rp)) {
		if ((rc = get_rope(rp, "rope_parameters", path, out)) ||
		    (rc = sl_config_get_num(rp, "rope_theta", 10000.0, false, path, &out->rope_theta)))
			goto done;
	} else if ((rc = get_rope(json_object_get(root, "rope_scaling"), "rope_scaling", path, out)) ||
		   (rc = sl_config_get_num(root, "rope_theta", 10000.0, false, path, &out->rope_theta))) {
		goto done;
	}

	if (qwen2 && (rc = sl_config_get_bool(root, "use_sliding_window", false, path, &use_window)))
		goto done;
	if ((rc = sl_config_get_int(root, "sliding_window", 0, false, path, &out->sliding_window)))
		goto done;
	if (!use_window)
		out->sliding_window = 0;

	const char *name = json_string_value(json_object_get(root, "_name_or_path"));
	snprintf(out->name, sizeof out->name, "%s", name && *name ? name : mt);
	rc = sl_llama_config_validate(out, path);
done:
	json_decref(root);
	return rc;
}

size_t sl_llama_layer_params(const sl_llama_config *c)
{
	const size_t h = (size_t)c->hidden, f = (size_t)c->ffn;
	const size_t q = (size_t)c->n_head * c->head_dim, kv = (size_t)c->n_kv_head * c->head_dim;
	size_t n = h * q + 2 * h * kv + q * h + 3 * h * f + 2 * h;
	if (c->qkv_bias)
		n += q + 2 * kv;
	return n;
}

size_t sl_llama_total_params(const sl_llama_config *c)
{
	const size_t h = (size_t)c->hidden, v = (size_t)c->vocab;
	return (size_t)c->n_layer * sl_llama_layer_params(c) + v * h * (c->tied ? 1 : 2) + h;
}
