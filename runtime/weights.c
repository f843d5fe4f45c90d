/*
 * weights.c - placing a model's tensors in device memory.
 *
 * One table per family describes every tensor (its Hugging Face name, its
 * shape as a function of the config, where its pointer goes), and both the
 * checkpoint loader and the dummy generator walk it, so the two cannot
 * disagree.  OPT's table and the LLaMA family's (Llama and Mistral; Qwen2's
 * adds the q/k/v biases) feed the same placement, units and staging.
 * Each decoder layer is one device allocation (the unit later offloading
 * moves); the embeddings, positions, projections and final norm are another.
 */
#include "weights.h"
#include "sl_hash.h"
#include "sl_q4.h"

#include <math.h>
#include <errno.h>
#include <fcntl.h>
#include <omp.h>
#include <zstd.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>

/* D_Q: the query and attention output width (n_head x head_dim); D_KV:
 * the key and value width (n_kv_head x head_dim) */
enum dim { D_NONE, D_H, D_F, D_E, D_V, D_P, D_Q, D_KV };

typedef struct tdesc {
	const char *name; /* after the family's prefix (global) or its "layers.N." */
	enum dim rows, cols; /* cols D_NONE: a vector of rows elements */
	size_t off;       /* offset of the sl_half * in its struct */
	int kind;         /* 0 matrix, 1 bias, 2 norm gain, 3 norm bias, 4 embedding */
} tdesc;

#define L(f) offsetof(sl_layer_w, f)
static const tdesc layer_tensors[] = {
	{ "self_attn.q_proj.weight", D_H, D_H, L(q_w), 0 },
	{ "self_attn.q_proj.bias", D_H, D_NONE, L(q_b), 1 },
	{ "self_attn.k_proj.weight", D_H, D_H, L(k_w), 0 },
	{ "self_attn.k_proj.bias", D_H, D_NONE, L(k_b), 1 },
	{ "self_attn.v_proj.weight", D_H, D_H, L(v_w), 0 },
	{ "self_attn.v_proj.bias", D_H, D_NONE, L(v_b), 1 },
	{ "self_attn.out_proj.weight", D_H, D_H, L(o_w), 0 },
	{ "self_attn.out_proj.bias", D_H, D_NONE, L(o_b), 1 },
	{ "self_attn_layer_norm.weight", D_H, D_NONE, L(ln1_g), 2 },
	{ "self_attn_layer_norm.bias", D_H, D_NONE, L(ln1_b), 3 },
	{ "fc1.weight", D_F, D_H, L(fc1_w), 0 },
	{ "fc1.bias", D_F, D_NONE, L(fc1_b), 1 },
	{ "fc2.weight", D_H, D_F, L(fc2_w), 0 },
	{ "fc2.bias", D_H, D_NONE, L(fc2_b), 1 },
	{ "final_layer_norm.weight", D_H, D_NONE, L(ln2_g), 2 },
	{ "final_layer_norm.bias", D_H, D_NONE, L(ln2_b), 3 },
};

/* Llama and Mistral: no biases, RMSNorm gains only, the SwiGLU MLP.
 * Qwen2's table is the same with q/k/v biases. */
static const tdesc llama_tensors[] = {
	{ "self_attn.q_proj.weight", D_Q, D_H, L(q_w), 0 },
	{ "self_attn.k_proj.weight", D_KV, D_H, L(k_w), 0 },
	{ "self_attn.v_proj.weight", D_KV, D_H, L(v_w), 0 },
	{ "self_attn.o_proj.weight", D_H, D_Q, L(o_w), 0 },
	{ "input_layernorm.weight", D_H, D_NONE, L(ln1_g), 2 },
	{ "mlp.gate_proj.weight", D_F, D_H, L(gate_w), 0 },
	{ "mlp.up_proj.weight", D_F, D_H, L(up_w), 0 },
	{ "mlp.down_proj.weight", D_H, D_F, L(down_w), 0 },
	{ "post_attention_layernorm.weight", D_H, D_NONE, L(ln2_g), 2 },
};
static const tdesc qwen2_tensors[] = {
	{ "self_attn.q_proj.weight", D_Q, D_H, L(q_w), 0 },
	{ "self_attn.q_proj.bias", D_Q, D_NONE, L(q_b), 1 },
	{ "self_attn.k_proj.weight", D_KV, D_H, L(k_w), 0 },
	{ "self_attn.k_proj.bias", D_KV, D_NONE, L(k_b), 1 },
	{ "self_attn.v_proj.weight", D_KV, D_H, L(v_w), 0 },
	{ "self_attn.v_proj.bias", D_KV, D_NONE, L(v_b), 1 },
	{ "self_attn.o_proj.weight", D_H, D_Q, L(o_w), 0 },
	{ "input_layernorm.weight", D_H, D_NONE, L(ln1_g), 2 },
	{ "mlp.gate_proj.weight", D_F, D_H, L(gate_w), 0 },
	{ "mlp.up_proj.weight", D_F, D_H, L(up_w), 0 },
	{ "mlp.down_proj.weight", D_H, D_F, L(down_w), 0 },
	{ "post_attention_layernorm.weight", D_H, D_NONE, L(ln2_g), 2 },
};
#undef L

/* A family's layer table: n tensors, the first attn of them the attention
 * half (everything before the MLP: fc1, or gate_proj). */
typedef struct table {
	const tdesc *t;
	int n, attn;
} table;

static table layer_table(const sl_model_config *c)
{
	if (c->family == SL_FAMILY_OPT)
		return (table){ layer_tensors, (int)SL_ARRAY_LEN(layer_tensors), 10 };
	if (c->llama.qkv_bias)
		return (table){ qwen2_tensors, (int)SL_ARRAY_LEN(qwen2_tensors), 8 };
	return (table){ llama_tensors, (int)SL_ARRAY_LEN(llama_tensors), 5 };
}

#define G(f) offsetof(sl_model_weights, f)
enum { G_PROJ = 1, G_FINAL = 2 }; /* conditions */
typedef struct gdesc {
	tdesc d;
	int cond;
} gdesc;
static const gdesc global_tensors[] = {
	{ { "embed_tokens.weight", D_V, D_E, G(embed_tokens), 4 }, 0 },
	{ { "embed_positions.weight", D_P, D_H, G(embed_pos), 4 }, 0 },
	{ { "project_in.weight", D_H, D_E, G(project_in), 0 }, G_PROJ },
	{ { "project_out.weight", D_E, D_H, G(project_out), 0 }, G_PROJ },
	{ { "final_layer_norm.weight", D_H, D_NONE, G(final_ln_g), 2 }, G_FINAL },
	{ { "final_layer_norm.bias", D_H, D_NONE, G(final_ln_b), 3 }, G_FINAL },
};
static const gdesc llama_globals[] = {
	{ { "embed_tokens.weight", D_V, D_H, G(embed_tokens), 4 }, 0 },
	{ { "norm.weight", D_H, D_NONE, G(final_ln_g), 2 }, 0 },
};
#undef G

static const gdesc *global_table(const sl_model_config *c, size_t *n)
{
	if (c->family == SL_FAMILY_OPT) {
		*n = SL_ARRAY_LEN(global_tensors);
		return global_tensors;
	}
	*n = SL_ARRAY_LEN(llama_globals);
	return llama_globals;
}

/* The LM head is a tensor of its own: OPT's checkpoints tie it (a stored
 * copy equal to the embeddings is taken as tied), the LLaMA family's
 * configs say (tie_word_embeddings). */
static bool head_stored(const sl_model_config *c)
{
	return c->family == SL_FAMILY_LLAMA && !c->llama.tied;
}

static int64_t dim_value(const sl_model_config *c, enum dim d)
{
	switch (d) {
	case D_H: return c->hidden;
	case D_F: return c->ffn;
	case D_E: return c->embed_dim;
	case D_V: return c->vocab;
	case D_P: return (int64_t)c->max_pos + SL_OPT_POS_OFFSET;
	case D_Q: return (int64_t)c->n_head * c->head_dim;
	case D_KV: return (int64_t)c->n_kv_head * c->head_dim;
	default: return 1;
	}
}

static size_t tensor_elems(const sl_model_config *c, const tdesc *d)
{
	return (size_t)dim_value(c, d->rows) * (size_t)dim_value(c, d->cols);
}

/* The bytes of rows of a layer matrix in its homes: fp16, or (q4:
 * compress_weight) sl_q4's layout of those rows; a vector (bias, norm) is
 * whole and fp16 (rows is ignored). */
static size_t piece_bytes(const sl_model_config *c, const tdesc *d, bool q4, size_t rows)
{
	if (d->kind != 0)
		return tensor_elems(c, d) * 2;
	const size_t k = (size_t)dim_value(c, d->cols);
	return q4 ? sl_q4_bytes(rows, k) : rows * k * 2;
}

/* The rows place_layer cuts a layer tensor by: a matrix's, 1 for a vector
 * (which goes whole). */
static int tensor_rows(const sl_model_config *c, const tdesc *d)
{
	return d->kind == 0 ? (int)dim_value(c, d->rows) : 1;
}

static size_t tensor_bytes(const sl_model_config *c, const tdesc *d, bool q4)
{
	return piece_bytes(c, d, q4, (size_t)dim_value(c, d->rows));
}

/* The bytes of piece p of layer tensor d in its home. */
static size_t wpiece_bytes(const sl_model_config *c, const tdesc *d, bool q4, const sl_wpiece *p)
{
	return piece_bytes(c, d, q4, (size_t)(p->row1 - p->row0));
}

static size_t align64(size_t n)
{
	return (n + 63) & ~(size_t)63;
}

static bool global_present(const sl_model_config *c, int cond)
{
	if (cond == G_PROJ)
		return c->embed_dim != c->hidden;
	if (cond == G_FINAL)
		return c->opt.final_ln;
	return true;
}

/* The source of one tensor's values: a checkpoint tensor or the generator. */
typedef struct source {
	const sl_st_set *st;
	const char *dir;
	uint64_t seed;
} source;

/* Dummy values: uniform with the spread a trained model roughly has, so
 * activations stay finite; norms are 1 and 0, like a fresh model.  Element
 * i of a tensor comes from its block of 4 (i / 4), so any range [first,
 * first + n) is filled with the values the whole tensor has there. */
static void fill_dummy(const sl_model_config *c, const tdesc *d, uint64_t id, size_t first, sl_half *dst,
		       size_t n)
{
	if (d->kind == 2 || d->kind == 3) {
		sl_half v = sl_float_to_half(d->kind == 2 ? 1.0f : 0.0f);
		for (size_t i = 0; i < n; i++)
			dst[i] = v;
		return;
	}
	float scale;
	if (d->kind == 0)
		scale = 0.5f / sqrtf((float)dim_value(c, d->cols));
	else if (d->kind == 4)
		scale = 0.05f;
	else
		scale = 0.01f;
	const size_t end = first + n;
#pragma omp parallel for schedule(static)
	for (size_t blk = first / 4; blk < (end + 3) / 4; blk++) {
		uint64_t r = sl_splitmix64(id * 0x100000001b3ull ^ blk);
		for (size_t j = 0; j < 4; j++) {
			size_t i = blk * 4 + j;
			if (i < first || i >= end)
				continue;
			float u = (float)((r >> (16 * j)) & 0xffff) / 65535.0f; /* [0, 1] */
			dst[i - first] = sl_float_to_half((2.0f * u - 1.0f) * scale);
		}
	}
}

/* The index of the first fp16 value of h[0..n) that is not a number (inf
 * or NaN: the exponent all ones), or n.  Blocks are tested with a loop
 * the compiler vectorises; only a block that holds one is searched. */
static size_t first_nonfinite(const sl_half *h, size_t n)
{
	size_t bad = n;
#pragma omp parallel for schedule(static) reduction(min : bad)
	for (size_t b = 0; b < n; b += 4096) {
		const size_t e = SL_MIN(n, b + 4096);
		unsigned any = 0;
		for (size_t i = b; i < e; i++)
			any |= (h[i] & 0x7c00u) == 0x7c00u;
		for (size_t i = b; any && i < e; i++)
			if ((h[i] & 0x7c00u) == 0x7c00u) {
				bad = SL_MIN(bad, i);
				break;
			}
	}
	return bad;
}

/* The tensor's values as fp16 into dst; returns the index of the first
 * value fp16 cannot hold (NaN or inf in the file, or beyond fp16's range,
 * which rounds to inf), or n where there is none. */
static size_t convert_to_half(const sl_st_tensor *t, sl_half *dst, size_t n)
{
	const unsigned char *src = t->data;
	switch (t->dtype) {
	case SL_DT_F16:
		memcpy(dst, src, n * 2);
		break;
	case SL_DT_F32:
#pragma omp parallel for schedule(static)
		for (size_t i = 0; i < n; i++) {
			float f;
			memcpy(&f, src + 4 * i, 4);
			dst[i] = sl_float_to_half(f);
		}
		break;
	case SL_DT_BF16:
#pragma omp parallel for schedule(static)
		for (size_t i = 0; i < n; i++) {
			uint16_t v;
			memcpy(&v, src + 2 * i, 2);
			dst[i] = sl_float_to_half(sl_bf16_to_float(v));
		}
		break;
	default:
		break;
	}
	return first_nonfinite(dst, n);
}

/* Refuse a tensor whose element i fp16 cannot hold, naming file, tensor,
 * element and value. */
static int unrepresentable(const sl_st_tensor *t, size_t i)
{
	float f = 0;
	if (t->dtype == SL_DT_F32) {
		memcpy(&f, (const unsigned char *)t->data + 4 * i, 4);
	} else {
		uint16_t v;
		memcpy(&v, (const unsigned char *)t->data + 2 * i, 2);
		f = t->dtype == SL_DT_F16 ? sl_half_to_float(v) : sl_bf16_to_float(v);
	}
	char at[64];
	if (t->ndim == 2)
		snprintf(at, sizeof at, "[%zu, %zu]", i / (size_t)t->shape[1], i % (size_t)t->shape[1]);
	else
		snprintf(at, sizeof at, "[%zu]", i);
	if (isfinite(f))
		return sl_err(SL_ERANGE,
			      "%s: tensor '%s' holds %g at %s, beyond the range of fp16 (largest 65504), in which sluice keeps weights",
			      t->file, t->name, (double)f, at);
	return sl_err(SL_ERANGE, "%s: tensor '%s' holds %s at %s: weights must be finite", t->file,
		      t->name, isnan(f) ? "NaN" : f > 0 ? "inf" : "-inf", at);
}

/* A tensor by its name after the family's prefix: OPT's with or without
 * "model." and "decoder."; the LLaMA family's under "model." (the head
 * outside it). */
static const sl_st_tensor *lookup(const sl_model_config *c, const sl_st_set *st, const char *name,
				  char *tried, size_t tn)
{
	static const char *const opt_prefixes[] = { "model.decoder.", "decoder.", "model.", "" };
	static const char *const llama_prefixes[] = { "model.", "" };
	const bool opt = c->family == SL_FAMILY_OPT;
	const char *const *prefixes = opt ? opt_prefixes : llama_prefixes;
	const size_t np = opt ? SL_ARRAY_LEN(opt_prefixes) : SL_ARRAY_LEN(llama_prefixes);
	char full[256];
	tried[0] = 0;
	for (size_t i = 0; i < np; i++) {
		snprintf(full, sizeof full, "%s%s", prefixes[i], name);
		const sl_st_tensor *t = sl_st_find(st, full);
		if (t)
			return t;
		if (i < 2) {
			size_t used = strlen(tried);
			snprintf(tried + used, tn - used, "%s'%s'", i ? " or " : "", full);
		}
	}
	return NULL;
}

/* Fill elements [first, first + n) of one tensor's fp16 values into host
 * memory. */
static int fill_tensor(const sl_model_config *c, const source *src, const tdesc *d,
		       const char *name, uint64_t id, size_t first, size_t n, sl_half *dst)
{
	if (!src->st) {
		fill_dummy(c, d, src->seed * 1315423911ull + id, first, dst, n);
		return 0;
	}
	char tried[600];
	const sl_st_tensor *t = lookup(c, src->st, name, tried, sizeof tried);
	if (!t)
		return sl_err(SL_ENOTFOUND, "%s: tensor %s is missing", src->dir, tried);
	const int64_t r = dim_value(c, d->rows), k = dim_value(c, d->cols);
	bool ok = d->cols == D_NONE ? (t->ndim == 1 && t->shape[0] == r)
				    : (t->ndim == 2 && t->shape[0] == r && t->shape[1] == k);
	if (!ok) {
		char got[128] = "[";
		for (int i = 0; i < t->ndim; i++) {
			size_t u = strlen(got);
			snprintf(got + u, sizeof got - u, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
		}
		strcat(got, "]");
		if (d->cols == D_NONE)
			return sl_err(SL_ESHAPE, "%s: tensor '%s' has shape %s, expected [%lld]", t->file,
				      t->name, got, (long long)r);
		return sl_err(SL_ESHAPE, "%s: tensor '%s' has shape %s, expected [%lld, %lld]", t->file,
			      t->name, got, (long long)r, (long long)k);
	}
	if (t->dtype == SL_DT_OTHER)
		return sl_err(SL_ESHAPE, "%s: tensor '%s' has dtype %s, expected F32, F16 or BF16",
			      t->file, t->name, t->dtype_name);
	const size_t es = t->dtype == SL_DT_F32 ? 4 : 2;
	sl_st_tensor part = *t; /* the range: its bytes start first elements in */
	part.data = (const unsigned char *)t->data + first * es;
	const size_t bad = convert_to_half(&part, dst, n);
	if (bad < n)
		return unrepresentable(t, first + bad);
	/* the checkpoint's copy of the range is done with: not resident beside
	 * the converted one (the loading's peak RSS) */
	sl_st_release(t, first * es, n * es);
	return 0;
}

/* Rows [0, n) of a (n, k) fp16 matrix into sl_q4's layout at dst (its
 * codes, then its metadata), the rows in parallel (each row's groups are
 * its own, so the codes do not depend on the thread count). */
static void quantize_rows(const sl_half *h, size_t n, size_t k, uint8_t *dst)
{
	const size_t ng = sl_q4_groups(k);
	uint8_t *codes = dst;
	sl_half *meta = (sl_half *)(dst + n * ng * SL_Q4_CODE_BYTES);
#pragma omp parallel for schedule(static)
	for (size_t r = 0; r < n; r++)
		for (size_t g = 0; g < ng; g++) {
			const size_t c0 = g * SL_Q4_GROUP, e = r * ng + g;
			const int len = (int)SL_MIN((size_t)SL_Q4_GROUP, k - c0);
			sl_q4_quantize_group(h + r * k + c0, len, codes + e * SL_Q4_CODE_BYTES, &meta[2 * e],
					     &meta[2 * e + 1]);
		}
}

/* The fp16 rows one pass of q4_fill quantises: at most this many bytes of
 * them (one row at least), in ordinary (unpinned) memory. */
#define Q4_SCRATCH ((size_t)1 << 20)

/*
 * Bytes [lo, hi) of the quantised form (sl_q4: the codes of every row,
 * then every row's metadata) of rows [row0, row0 + rows) of a matrix into
 * dst.  The rows whose codes or
 * metadata fall in the range are read as fp16 (fill_tensor) a bounded
 * chunk at a time and quantised, so no fp16 copy of the matrix (or of a
 * layer) is ever made, and a range may start and end anywhere: in a row's
 * codes, in the metadata, or across the two (a disk window, a device
 * piece).
 */
static int q4_fill(const sl_model_config *c, const source *src, const tdesc *d, const char *name,
		   uint64_t id, size_t row0, size_t rows, size_t lo, size_t hi, uint8_t *dst)
{
	const size_t k = (size_t)dim_value(c, d->cols);
	const size_t ng = sl_q4_groups(k), rc = ng * SL_Q4_CODE_BYTES, rm = ng * SL_Q4_META_BYTES;
	const size_t cb = rows * rc; /* the codes' bytes; the metadata follow */
	/* the rows whose codes, and whose metadata, the range touches */
	size_t a0 = rows, a1 = 0, b0 = rows, b1 = 0;
	if (lo < cb) {
		a0 = lo / rc;
		a1 = (SL_MIN(hi, cb) + rc - 1) / rc;
	}
	if (hi > cb) {
		b0 = (SL_MAX(lo, cb) - cb) / rm;
		b1 = (hi - cb + rm - 1) / rm;
	}
	size_t span[2][2] = { { a0, a1 }, { b0, b1 } };
	int nspan = 0;
	if (a0 < a1 && b0 < b1 && a0 <= b1 && b0 <= a1) { /* overlapping: one pass */
		span[0][0] = SL_MIN(a0, b0);
		span[0][1] = SL_MAX(a1, b1);
		nspan = 1;
	} else {
		if (a0 < a1)
			span[nspan][0] = a0, span[nspan][1] = a1, nspan++;
		if (b0 < b1)
			span[nspan][0] = b0, span[nspan][1] = b1, nspan++;
	}
	const size_t per = SL_MAX((size_t)1, Q4_SCRATCH / (k * 2));
	sl_half *h = malloc(per * k * 2);
	uint8_t *q = malloc(per * (rc + rm));
	int err = (h && q) ? 0 : sl_err(SL_ENOMEM, "out of memory quantising %s", name);
	for (int s = 0; s < nspan && !err; s++)
		for (size_t r0 = span[s][0]; r0 < span[s][1] && !err; r0 += per) {
			const size_t n = SL_MIN(per, span[s][1] - r0);
			if ((err = fill_tensor(c, src, d, name, id, (row0 + r0) * k, n * k, h)) < 0)
				break;
			quantize_rows(h, n, k, q);
			/* this chunk's codes and metadata, where they meet [lo, hi) */
			const size_t part[2][3] = { { r0 * rc, n * rc, 0 }, { cb + r0 * rm, n * rm, n * rc } };
			for (int j = 0; j < 2; j++) {
				const size_t x0 = SL_MAX(lo, part[j][0]), x1 = SL_MIN(hi, part[j][0] + part[j][1]);
				if (x0 < x1)
					memcpy(dst + (x0 - lo), q + part[j][2] + (x0 - part[j][0]), x1 - x0);
			}
		}
	free(h);
	free(q);
	return err;
}

/* Bytes [lo, hi) of a layer tensor's piece (rows [p->row0, p->row1)) as
 * its home holds it (piece_bytes): fp16 values (lo and hi even), or a
 * quantised matrix of those rows. */
static int fill_bytes(const sl_model_config *c, const source *src, const tdesc *d, const char *name,
		      uint64_t id, bool q4, const sl_wpiece *p, size_t lo, size_t hi, void *dst)
{
	if (q4 && d->kind == 0)
		return q4_fill(c, src, d, name, id, (size_t)p->row0, (size_t)(p->row1 - p->row0), lo, hi, dst);
	const size_t first = d->kind == 0 ? (size_t)p->row0 * (size_t)dim_value(c, d->cols) : 0;
	return fill_tensor(c, src, d, name, id, first + lo / 2, (hi - lo) / 2, dst);
}

static size_t align4k(size_t n)
{
	return (n + 4095) & ~(size_t)4095;
}

size_t sl_weights_layer_bytes(const sl_model_config *c, bool q4)
{
	const table tb = layer_table(c);
	size_t n = 0;
	for (int i = 0; i < tb.n; i++)
		n += align64(tensor_bytes(c, &tb.t[i], q4));
	return n;
}

/* The row a tier boundary at byte cut of a layer falls on in a tensor
 * that starts at byte start and has rows rows of row bytes each: a
 * multiple of SL_WSPLIT_ROWS (a vector: one row, so it goes whole where
 * its midpoint falls), clamped to [0, rows]. */
static int cut_row(double cut, double start, size_t row, int rows, int step)
{
	const double r = (cut - start) / (double)row / step;
	if (r <= 0)
		return 0;
	return (int)SL_MIN((double)rows, floor(r + 0.5) * step);
}

/* The tiers, ordered [disk, cpu, device] over the layer's bytes (weights.h:
 * sl_weight_place), in pieces.  Within each tier the pieces keep their
 * order, so each half's pieces are one range of its tier's home; the MLP
 * half's disk pieces start on a page, so either half is one O_DIRECT read
 * (the layout does not depend on how the weights are streamed).  With
 * compress_weight (p->q4) the bytes are the homes' own: the matrices
 * quantised, so a percentage is of the compressed layer. */
static void place_layer(const sl_model_config *c, const sl_weight_place *p, sl_model_weights *w)
{
	memset(w->unit, 0, sizeof w->unit);
	double gpu = p ? p->gpu_percent : 100.0, cpu = p ? p->cpu_percent : 0.0;
	double disk = 100.0 - gpu - cpu;
	const table tb = layer_table(c);
	w->tensors = tb.t;
	w->ntensors = tb.n;
	w->nattn = tb.attn;
	w->q4 = p && p->q4;
	size_t total = 0;
	for (int i = 0; i < tb.n; i++)
		total += tensor_bytes(c, &tb.t[i], w->q4);
	const double cut[2] = { disk / 100.0 * (double)total, (disk + cpu) / 100.0 * (double)total };
	size_t cum = 0;
	w->dev_bytes = w->host_bytes = w->disk_bytes = 0;
	w->npiece = 0;
	/* the tiers in the layer's byte order, and each one's running size */
	static const unsigned char by_bytes[3] = { SL_TIER_DISK, SL_TIER_HOST, SL_TIER_DEVICE };
	size_t *home[3];
	home[SL_TIER_DEVICE] = &w->dev_bytes;
	home[SL_TIER_HOST] = &w->host_bytes;
	home[SL_TIER_DISK] = &w->disk_bytes;
	for (int i = 0; i < tb.n; i++) {
		const tdesc *d = &tb.t[i];
		const int rows = tensor_rows(c, d);
		const size_t nb = tensor_bytes(c, d, w->q4);
		const int step = d->kind == 0 ? SL_WSPLIT_ROWS : 1;
		/* the rows in each tier: [0, r[0]) disk, [r[0], r[1]) host, the rest device */
		int r[3] = { cut_row(cut[0], (double)cum, nb / (size_t)rows, rows, step), 0, rows };
		r[1] = SL_MAX(r[0], cut_row(cut[1], (double)cum, nb / (size_t)rows, rows, step));
		cum += nb;
		if (i == tb.attn) { /* the MLP half begins */
			w->unit[SL_UNIT_MLP].host_off = w->host_bytes;
			w->disk_bytes = align4k(w->disk_bytes);
			w->unit[SL_UNIT_MLP].disk_off = w->disk_bytes;
		}
		for (int t = 0, row0 = 0; t < 3; row0 = r[t], t++) {
			if (r[t] == row0)
				continue;
			sl_wpiece *pc = &w->piece[w->npiece++];
			*pc = (sl_wpiece){ .t = (unsigned char)i, .tier = by_bytes[t], .row0 = row0, .row1 = r[t],
					   .off = *home[by_bytes[t]] };
			*home[pc->tier] += align64(wpiece_bytes(c, d, w->q4, pc));
		}
	}
	sl_wstage_unit *un = w->unit;
	const size_t attn_disk = un[SL_UNIT_MLP].disk_off; /* page aligned */
	w->disk_bytes = align4k(w->disk_bytes);
	un[SL_UNIT_ATTN].host_off = un[SL_UNIT_ATTN].disk_off = 0;
	un[SL_UNIT_LAYER].host_off = un[SL_UNIT_LAYER].disk_off = 0;
	/* host_in_place: the host tensors are read in their home, so a unit
	 * stages its disk part alone */
	w->host_in_place = p && p->host_in_place;
	if (!w->host_in_place) {
		un[SL_UNIT_ATTN].host_len = un[SL_UNIT_MLP].host_off;
		un[SL_UNIT_MLP].host_len = w->host_bytes - un[SL_UNIT_MLP].host_off;
		un[SL_UNIT_LAYER].host_len = w->host_bytes;
	} else {
		un[SL_UNIT_MLP].host_off = 0;
	}
	un[SL_UNIT_ATTN].disk_len = attn_disk;
	un[SL_UNIT_MLP].disk_len = w->disk_bytes - attn_disk;
	un[SL_UNIT_LAYER].disk_len = w->disk_bytes;
	/* a slot holds the unit's host tensors, then (page aligned, for
	 * O_DIRECT) its disk tensors, each at its offset within the unit */
	w->halves = p && p->halves;
	for (int u = 0; u < 3; u++)
		un[u].stage_disk = align4k(un[u].host_len);
	w->streamed = (w->host_in_place ? 0 : w->host_bytes) + w->disk_bytes > 0;
}

size_t sl_weights_global_bytes(const sl_model_config *c)
{
	size_t ng, n = 0;
	const gdesc *g = global_table(c, &ng);
	for (size_t i = 0; i < ng; i++)
		if (global_present(c, g[i].cond))
			n += align64(tensor_elems(c, &g[i].d) * 2);
	if (head_stored(c))
		n += align64((size_t)c->vocab * c->embed_dim * 2);
	return n;
}

size_t sl_weights_device_bytes(const sl_model_config *c, const sl_weight_place *p)
{
	sl_model_weights tmp;
	place_layer(c, p, &tmp);
	size_t n = sl_weights_global_bytes(c) + (size_t)c->n_layer * tmp.dev_bytes;
	for (int k = 0; k < 2 && tmp.streamed; k++) {
		size_t dev, bounce;
		sl_wstage_slot_bytes(tmp.unit, tmp.halves, k, &dev, &bounce);
		n += dev;
	}
	return n;
}

void sl_weights_layer_split(const sl_model_config *c, double gpu_percent, double cpu_percent, bool q4,
			    size_t *dev, size_t *host, size_t *disk)
{
	sl_model_weights tmp;
	sl_weight_place p = { .gpu_percent = gpu_percent, .cpu_percent = cpu_percent, .q4 = q4 };
	place_layer(c, &p, &tmp);
	*dev = tmp.dev_bytes;
	*host = tmp.host_bytes;
	*disk = tmp.disk_bytes;
}

int sl_weights_layer_pieces(const sl_model_config *c, double gpu_percent, double cpu_percent, bool q4,
			    sl_wpiece *piece, size_t *bytes, int *rows, int *ntensors)
{
	sl_model_weights tmp;
	sl_weight_place p = { .gpu_percent = gpu_percent, .cpu_percent = cpu_percent, .q4 = q4 };
	place_layer(c, &p, &tmp);
	const tdesc *d = tmp.tensors;
	for (int i = 0; i < tmp.ntensors; i++) {
		bytes[i] = tensor_bytes(c, &d[i], q4);
		rows[i] = tensor_rows(c, &d[i]);
	}
	memcpy(piece, tmp.piece, (size_t)tmp.npiece * sizeof *piece);
	*ntensors = tmp.ntensors;
	return tmp.npiece;
}

size_t sl_weights_disk_bytes(const sl_model_config *c, double gpu_percent, double cpu_percent, bool q4)
{
	sl_model_weights tmp;
	sl_weight_place p = { .gpu_percent = gpu_percent, .cpu_percent = cpu_percent, .q4 = q4 };
	place_layer(c, &p, &tmp);
	return tmp.disk_bytes;
}

/* Pointers of layer l's tensors: home for device ones (and host ones read
 * in place), the slot holding unit u for the unit's other ones (NULL:
 * none), NULL for the rest; a split matrix's later pieces in cut[]. */
static void layer_view(const sl_model_weights *w, const sl_layer_w *lw, void *slot, int u,
		       sl_layer_w *view)
{
	*view = *lw;
	const tdesc *tt = w->tensors;
	/* the unit's tensors: [first, end) of the table */
	const int first = u == SL_UNIT_MLP ? w->nattn : 0;
	const int end = u == SL_UNIT_ATTN ? w->nattn : w->ntensors;
	view->ncut = 0;
	for (int j = 0; j < w->npiece; j++) {
		const sl_wpiece *p = &w->piece[j];
		const bool in = slot && p->t >= first && p->t < end;
		const sl_wstage_unit *x = &w->unit[u];
		char *base = p->tier == SL_TIER_DEVICE ? (char *)lw->block.p + p->off
			     : p->tier == SL_TIER_HOST && w->host_in_place ? (char *)lw->host.p + p->off
			     : !in ? NULL
			     : p->tier == SL_TIER_HOST ? (char *)slot + (p->off - x->host_off)
			     : (char *)slot + x->stage_disk + (p->off - x->disk_off);
		sl_half **field = (sl_half **)((char *)view + tt[p->t].off);
		if (p->row0 == 0) /* a tensor's first piece (pieces are in row order) */
			*field = (sl_half *)base;
		else if (*field && base && view->ncut < (int)SL_ARRAY_LEN(view->cut))
			view->cut[view->ncut++] = (sl_wcut){ *field, p->row0, (sl_half *)base };
	}
}

/*
 * Conversion goes through two pinned buffers of one piece each: at most
 * CONV_PIECE, less for a model whose largest tensor and disk segment are
 * smaller.  A device tensor is converted piece by piece and copied (one
 * buffer's copy runs while the other fills; where device memory is host
 * memory it is converted in place); a host tensor is converted in place;
 * a layer's disk segment is assembled a window of one piece at a time,
 * each window written while the other fills.  So loading needs
 * 2 x CONV_PIECE of pinned memory whatever the model
 * (SLUICE_CONVERT_PIECE=BYTES sets the piece, for tests).
 */
#define CONV_PIECE ((size_t)4 << 20)

static size_t conv_piece(const sl_model_config *c, size_t disk_bytes, bool q4)
{
	size_t need = disk_bytes, ng;
	const table tb = layer_table(c);
	for (int i = 0; i < tb.n; i++)
		need = SL_MAX(need, tensor_bytes(c, &tb.t[i], q4));
	const gdesc *g = global_table(c, &ng);
	for (size_t i = 0; i < ng; i++)
		if (global_present(c, g[i].cond))
			need = SL_MAX(need, tensor_elems(c, &g[i].d) * 2);
	need = SL_MAX(need, (size_t)c->vocab * c->embed_dim * 2); /* a stored head */
	size_t piece = CONV_PIECE;
	const char *e = getenv("SLUICE_CONVERT_PIECE");
	if (e && atol(e) > 0)
		piece = (size_t)atol(e);
	return align4k(SL_MIN(piece, need));
}

uint32_t sl_weights_zstd_window(const sl_model_config *c, double gpu_percent, double cpu_percent, bool q4)
{
	return (uint32_t)conv_piece(c, sl_weights_disk_bytes(c, gpu_percent, cpu_percent, q4), q4);
}

uint32_t sl_weight_place_window(const sl_model_config *c, const sl_weight_place *p)
{
	if (!p->zstd)
		return 0;
	return p->zstd_window ? p->zstd_window : sl_weights_zstd_window(c, p->gpu_percent, p->cpu_percent, p->q4);
}

uint64_t sl_weights_store_bytes(const sl_model_config *c, double gpu_percent, double cpu_percent, bool q4,
				uint32_t window)
{
	sl_model_weights tmp;
	sl_weight_place p = { .gpu_percent = gpu_percent, .cpu_percent = cpu_percent, .q4 = q4 };
	place_layer(c, &p, &tmp);
	uint64_t n = (uint64_t)c->n_layer * tmp.disk_bytes;
	if (window && tmp.disk_bytes)
		n += sl_zseg_table_bytes(c->n_layer, sl_zseg_frames(tmp.disk_bytes, tmp.unit[SL_UNIT_MLP].disk_off,
								     window));
	return n;
}

size_t sl_weights_convert_bytes(const sl_model_config *c, double gpu_percent, double cpu_percent, bool q4)
{
	return 2 * conv_piece(c, sl_weights_disk_bytes(c, gpu_percent, cpu_percent, q4), q4);
}

void sl_weights_host_bytes(const sl_model_config *c, const sl_weight_place *p, bool dev_is_host,
			   size_t *resident, size_t *loading)
{
	sl_model_weights tmp;
	place_layer(c, p, &tmp);
	const size_t homes = (size_t)c->n_layer * tmp.host_bytes;
	size_t bounce = 0;
	for (int k = 0; k < 2 && tmp.streamed && !dev_is_host; k++) {
		size_t dev, b;
		sl_wstage_slot_bytes(tmp.unit, tmp.halves, k, &dev, &b);
		bounce += b;
	}
	if (p->zstd && tmp.streamed)
		bounce += sl_wstage_zstd_bytes(tmp.unit, tmp.halves, sl_weight_place_window(c, p));
	*resident = homes + bounce;
	*loading = homes + 2 * conv_piece(c, tmp.disk_bytes, tmp.q4);
}

typedef struct conv {
	sl_backend *b;
	sl_queue *q;
	const sl_model_config *c;
	const source *src;
	bool q4; /* the layers' matrices quantised (compress_weight) */
	unsigned char *buf[2];
	size_t piece;
	int next;           /* the buffer to fill next */
	sl_disk_store *disk;
	uint64_t ticket[2]; /* a window's write from buf[k], when pending[k] */
	bool pending[2];
	sl_event *copied[2]; /* a piece's copy from buf[k], when copying[k] */
	bool copying[2];
	/* zstd frames (place->zstd): each window compressed from buf[k] into
	 * zbuf[k] (written from there) through zscratch, its length into zt */
	int zlevel;
	ZSTD_CCtx *cctx;
	unsigned char *zbuf[2], *zscratch;
	size_t zcap;
	sl_zseg_table *zt;
} conv;

/* Buffer k once what reads it (a window's write, a piece's copy) is done. */
static int conv_wait(conv *v, int k)
{
	int rc = 0;
	if (v->pending[k]) {
		v->pending[k] = false;
		rc = sl_disk_wait(v->disk, v->ticket[k]);
	}
	if (v->copying[k]) {
		v->copying[k] = false;
		int r = sl_event_sync(v->b, v->copied[k]);
		rc = rc < 0 ? rc : r;
	}
	return rc;
}

/* The next buffer, free. */
static int conv_take(conv *v, unsigned char **buf)
{
	const int k = v->next;
	v->next ^= 1;
	SL_TRY(conv_wait(v, k));
	*buf = v->buf[k];
	return 0;
}

static int conv_drain(conv *v)
{
	int rc = 0;
	for (int k = 0; k < 2; k++) {
		int r = conv_wait(v, k);
		rc = rc < 0 ? rc : r;
	}
	return rc;
}

/* A tensor's rows p (NULL: the whole) to device memory at dst, a
 * conversion piece at a time (q4: a layer matrix, quantised). */
static int conv_device(conv *v, const tdesc *d, const char *name, uint64_t id, bool q4, const sl_wpiece *p,
		       void *dst)
{
	const sl_wpiece whole = { .row0 = 0, .row1 = (int)dim_value(v->c, d->rows) };
	p = p ? p : &whole;
	const size_t n = wpiece_bytes(v->c, d, q4, p), per = v->piece;
	if (v->b->ops->dev_is_host) /* nothing to copy: straight into place */
		return fill_bytes(v->c, v->src, d, name, id, q4, p, 0, n, dst);
	for (size_t first = 0; first < n; first += per) {
		const size_t k = SL_MIN(per, n - first);
		unsigned char *buf;
		SL_TRY(conv_take(v, &buf));
		const int b = v->next ^ 1; /* the buffer conv_take handed out */
		SL_TRY(fill_bytes(v->c, v->src, d, name, id, q4, p, first, first + k, buf));
		SL_TRY(sl_copy_h2d(v->b, v->q, (char *)dst + first, buf, k));
		SL_TRY(sl_event_record(v->b, v->copied[b], v->q));
		v->copying[b] = true;
	}
	return 0;
}

/* Bytes [off, off + len) of layer l's disk segment into buf: its disk
 * pieces where they fall in the window, zeros between them. */
static int fill_window(conv *v, const sl_model_weights *w, int l, size_t off, size_t len, unsigned char *buf)
{
	memset(buf, 0, len);
	for (int j = 0; j < w->npiece; j++) {
		const sl_wpiece *p = &w->piece[j];
		if (p->tier != SL_TIER_DISK)
			continue;
		const tdesc *d = &((const tdesc *)w->tensors)[p->t];
		const size_t a = p->off, e = a + wpiece_bytes(v->c, d, v->q4, p);
		const size_t lo = SL_MAX(a, off), hi = SL_MIN(e, off + len);
		if (lo >= hi)
			continue;
		char name[160];
		snprintf(name, sizeof name, "layers.%d.%s", l, d->name);
		SL_TRY(fill_bytes(v->c, v->src, d, name, (uint64_t)l * 64 + p->t, v->q4, p, lo - a, hi - a,
				  buf + (lo - off)));
	}
	return 0;
}

/* The layer tensors of layer l that live on disk, at their offsets in the
 * layer's segment of bytes, written a window of one piece at a time. */
static int conv_disk_segment(conv *v, const sl_model_weights *w, int l, uint64_t seg_off)
{
	for (size_t off = 0; off < w->disk_bytes; off += v->piece) {
		const size_t len = SL_MIN(v->piece, w->disk_bytes - off);
		unsigned char *buf;
		SL_TRY(conv_take(v, &buf));
		SL_TRY(fill_window(v, w, l, off, len, buf));
		const int k = v->next ^ 1; /* the buffer conv_take handed out */
		SL_TRY(sl_disk_write(v->disk, seg_off + off, buf, len, &v->ticket[k]));
		v->pending[k] = true;
	}
	return 0;
}

/* The layer's disk segment as zstd frames (zseg.h): each window filled
 * as conv_disk_segment fills it, compressed, and written at its offset
 * (its compressed bytes rounded up to a page, or as it is when it does
 * not compress). */
static int conv_disk_frames(conv *v, const sl_model_weights *w, int l, uint64_t seg_off)
{
	const sl_zseg_table *t = v->zt;
	for (int f = 0; f < t->nframes; f++) {
		uint64_t off;
		size_t len;
		sl_zseg_frame(t->seg, t->split, t->window, f, &off, &len);
		unsigned char *buf;
		SL_TRY(conv_take(v, &buf));
		const int k = v->next ^ 1; /* the buffer conv_take handed out */
		SL_TRY(fill_window(v, w, l, (size_t)off, len, buf));
		size_t clen;
		SL_TRY(sl_zseg_compress(v->cctx, v->zlevel, buf, len, v->zscratch, v->zbuf[k], v->zcap, &clen));
		v->zt->clen[(size_t)l * (size_t)t->nframes + (size_t)f] = (uint32_t)clen;
		const size_t wlen = clen ? align4k(clen) : len;
		if (clen) /* the frame's last page zero-padded */
			memset(v->zbuf[k] + clen, 0, wlen - clen);
		SL_TRY(sl_disk_write(v->disk, seg_off + off, clen ? v->zbuf[k] : buf, wlen, &v->ticket[k]));
		v->pending[k] = true;
	}
	return 0;
}

/* The zstd frame table after the layers' segments: written (write) or
 * read back and checked. */
static int zstd_table_io(sl_model_weights *w, bool write)
{
	const uint64_t at = (uint64_t)w->n_layer * w->disk_bytes;
	const uint64_t cap = sl_disk_capacity(w->disk);
	const char *path = sl_disk_path(w->disk);
	if (cap <= at || cap - at > ((uint64_t)1 << 30))
		return sl_err(SL_EFORMAT, "%s: no room for its zstd frame table (data area %llu bytes, the "
			      "layers take %llu); remove it so that it is rewritten", path,
			      (unsigned long long)cap, (unsigned long long)at);
	const size_t n = (size_t)(cap - at);
	void *buf = sl_io_alloc(n);
	if (!buf)
		return sl_err(SL_ENOMEM, "out of memory for the zstd frame table (%zu bytes)", n);
	memset(buf, 0, n);
	uint64_t ticket;
	int rc;
	if (write) {
		sl_zseg_table_encode(&w->zt, buf);
		rc = sl_disk_write(w->disk, at, buf, n, &ticket);
	} else {
		rc = sl_disk_read(w->disk, at, buf, n, &ticket);
	}
	if (rc == 0)
		rc = sl_disk_wait(w->disk, ticket);
	if (rc == 0 && !write)
		rc = sl_zseg_table_decode(buf, n, w->disk_bytes, w->unit[SL_UNIT_MLP].disk_off, w->n_layer, path,
					  &w->zt);
	free(buf);
	return rc;
}

/* Whether a stored lm_head holds the embeddings' values (then it is tied),
 * compared a piece at a time. */
static int conv_head_tied(conv *v, const tdesc *emb, const tdesc *hd, bool *tied)
{
	const size_t n = tensor_elems(v->c, hd), per = v->piece / 2;
	*tied = true;
	for (size_t first = 0; first < n && *tied; first += per) {
		const size_t k = SL_MIN(per, n - first);
		SL_TRY(fill_tensor(v->c, v->src, emb, emb->name, 1000000, first, k, (sl_half *)v->buf[0]));
		SL_TRY(fill_tensor(v->c, v->src, hd, "lm_head.weight", 0, first, k, (sl_half *)v->buf[1]));
		*tied = !memcmp(v->buf[0], v->buf[1], k * 2);
	}
	return 0;
}

/* The embeddings, positions, projections, final norm and (untied) head:
 * one device block. */
static int load_globals(conv *v, const sl_st_tensor *head, sl_model_weights *w)
{
	const sl_model_config *c = v->c;
	size_t off = 0, ng;
	const gdesc *g = global_table(c, &ng);
	for (size_t i = 0; i < ng; i++)
		if (global_present(c, g[i].cond))
			off += align64(tensor_elems(c, &g[i].d) * 2);
	const tdesc hd = { "lm_head.weight", D_V, D_E, 0, 0 };
	bool tied = true;
	if (c->family == SL_FAMILY_LLAMA)
		tied = c->llama.tied; /* a stored head of a tied config is not read, as in transformers */
	else if (head)
		SL_TRY(conv_head_tied(v, &g[0].d, &hd, &tied));
	SL_TRY(sl_buf_alloc(v->b, SL_MEM_DEVICE, off + (tied ? 0 : align64(tensor_elems(c, &hd) * 2)),
			    "embeddings and final layers", &w->block));
	off = 0;
	for (size_t i = 0; i < ng; i++) {
		const tdesc *d = &g[i].d;
		if (!global_present(c, g[i].cond))
			continue;
		sl_half **slot = (sl_half **)((char *)w + d->off);
		*slot = (sl_half *)((char *)w->block.p + off);
		SL_TRY(conv_device(v, d, d->name, 1000000 + i, false, NULL, *slot));
		off += align64(tensor_elems(c, d) * 2);
	}
	w->lm_head = w->embed_tokens;
	if (!tied) {
		w->lm_head = (sl_half *)((char *)w->block.p + off);
		SL_TRY(conv_device(v, &hd, "lm_head.weight", 0, false, NULL, w->lm_head));
	}
	return 0;
}

/* The staging engine for the streamed tensors: the units' ranges and the
 * layers' homes. */
static int create_stage(sl_backend *b, const sl_weight_place *place, sl_model_weights *w)
{
	sl_wstage_home *home = malloc((size_t)w->n_layer * sizeof *home);
	if (!home)
		return sl_err(SL_ENOMEM, "out of memory");
	for (int l = 0; l < w->n_layer; l++)
		home[l] = (sl_wstage_home){ .host = w->layers[l].host.p, .disk_off = w->layers[l].disk_off };
	sl_wstage_params sp = { .n_layer = w->n_layer, .halves = w->halves, .overlap = place && place->overlap,
				.home = home, .disk = w->disk, .stats = &w->stats };
	memcpy(sp.unit, w->unit, sizeof sp.unit);
	sp.zt = w->zt.clen ? &w->zt : NULL;
	int rc = sl_wstage_create(b, &sp, &w->stage);
	free(home);
	return rc;
}

/* store_only: write the disk share into the store and nothing else (no
 * device or host memory but the conversion buffers). */
static int load_all(sl_backend *b, sl_queue *q, const sl_model_config *c, const source *src,
		    const sl_weight_place *place, bool store_only, sl_model_weights *w)
{
	memset(w, 0, sizeof *w);
	w->layers = calloc((size_t)c->n_layer, sizeof *w->layers);
	if (!w->layers)
		return sl_err(SL_ENOMEM, "out of memory");
	w->n_layer = c->n_layer;
	place_layer(c, place, w);
	w->disk = place ? place->disk : NULL;
	if (w->disk_bytes && !w->disk)
		return sl_err(SL_EINVAL, "weights placed on disk need an offload directory");
	const bool write_disk = w->disk_bytes && !place->disk_ready;
	if (store_only && !write_disk)
		return 0;
	const bool zstd = w->disk_bytes && place->zstd > 0;
	if (zstd && !write_disk) { /* a zstd store: its frames' table */
		int rc = zstd_table_io(w, false);
		if (rc < 0) {
			sl_weights_free(b, w);
			return rc;
		}
	}

	const size_t lbytes = sl_weights_layer_bytes(c, w->q4);
	const sl_st_tensor *head = NULL;
	if (src->st) {
		head = sl_st_find(src->st, "lm_head.weight");
		if (!head)
			head = sl_st_find(src->st, "model.lm_head.weight");
	}
	conv v = { .b = b, .q = q, .c = c, .src = src, .q4 = w->q4, .disk = w->disk,
		   .piece = conv_piece(c, w->disk_bytes, w->q4) };
	sl_buf stage;
	int rc = sl_buf_alloc(b, SL_MEM_HOST, 2 * v.piece, "weight conversion", &stage);
	if (rc < 0)
		return rc;
	v.buf[0] = stage.p;
	v.buf[1] = (unsigned char *)stage.p + v.piece;
	for (int k = 0; k < 2 && !rc && q; k++)
		rc = sl_event_create(b, &v.copied[k]);
	if (!rc && zstd && write_disk) {
		v.zlevel = place->zstd;
		v.zt = &w->zt;
		v.zcap = align4k(sl_zseg_bound(v.piece));
		rc = sl_zseg_table_init(&w->zt, w->disk_bytes, w->unit[SL_UNIT_MLP].disk_off, (uint32_t)v.piece,
					c->n_layer, place->zstd);
		v.cctx = rc ? NULL : ZSTD_createCCtx();
		v.zscratch = malloc(v.piece);
		for (int k = 0; k < 2; k++)
			v.zbuf[k] = sl_io_alloc(v.zcap);
		if (!rc && (!v.cctx || !v.zscratch || !v.zbuf[0] || !v.zbuf[1]))
			rc = sl_err(SL_ENOMEM, "out of memory for zstd compression");
	}

	if (!rc && !store_only)
		rc = load_globals(&v, head, w);

	/* decoder layers: each tensor converted once, straight to its tier */
	for (int l = 0; l < c->n_layer && !rc; l++) {
		if (place && place->interrupt && *place->interrupt) {
			rc = sl_err(SL_EINTERRUPTED, "interrupted while loading the weights (at layer %d of %d)", l,
				    c->n_layer);
			break;
		}
		sl_layer_w *lw = &w->layers[l];
		lw->disk_off = (uint64_t)l * w->disk_bytes;
		lw->q4 = w->q4;
		char what[64];
		snprintf(what, sizeof what, "weights of layer %d", l);
		if (!store_only && w->dev_bytes &&
		    (rc = sl_buf_alloc(b, SL_MEM_DEVICE, w->dev_bytes, what, &lw->block)) < 0)
			break;
		if (!store_only && w->host_bytes &&
		    (rc = sl_buf_alloc(b, SL_MEM_HOST, w->host_bytes, what, &lw->host)) < 0)
			break;
		for (int j = 0; j < w->npiece && !rc && !store_only; j++) {
			const sl_wpiece *p = &w->piece[j];
			const tdesc *d = &((const tdesc *)w->tensors)[p->t];
			const uint64_t id = (uint64_t)l * 64 + p->t;
			char name[160];
			snprintf(name, sizeof name, "layers.%d.%s", l, d->name);
			if (p->tier == SL_TIER_HOST)
				rc = fill_bytes(c, src, d, name, id, w->q4, p, 0, wpiece_bytes(c, d, w->q4, p),
						(char *)lw->host.p + p->off);
			else if (p->tier == SL_TIER_DEVICE)
				rc = conv_device(&v, d, name, id, w->q4, p, (char *)lw->block.p + p->off);
		}
		if (!rc && write_disk) {
			rc = v.zt ? conv_disk_frames(&v, w, l, lw->disk_off) : conv_disk_segment(&v, w, l, lw->disk_off);
			w->stats.disk_write_bytes += w->disk_bytes;
		}
		if (!store_only)
			layer_view(w, lw, NULL, SL_UNIT_LAYER, lw); /* device pointers; others set per acquire */
	}
	int rc2 = conv_drain(&v);
	rc = rc < 0 ? rc : rc2;
	if (!rc && write_disk && v.zt)
		rc = zstd_table_io(w, true);
	if (!rc && write_disk)
		rc = sl_disk_mark_complete(w->disk);
	ZSTD_freeCCtx(v.cctx);
	free(v.zscratch);
	free(v.zbuf[0]);
	free(v.zbuf[1]);
	for (int k = 0; k < 2; k++)
		if (v.copied[k])
			sl_event_free(b, v.copied[k]);
	sl_buf_free(b, &stage);

	if (!rc && w->streamed && !store_only)
		rc = create_stage(b, place, w);
	if (rc) {
		sl_weights_free(b, w);
		return rc;
	}
	w->bytes = w->block.bytes + (size_t)c->n_layer * lbytes;
	return 0;
}

double sl_weights_zstd_ratio(const sl_model_weights *w)
{
	return sl_zseg_table_ratio(&w->zt);
}

int sl_weights_zstd_store_ratio(const char *path, const sl_model_config *c, double gpu_percent,
				double cpu_percent, bool q4, uint32_t window, double *ratio)
{
	*ratio = 0;
	sl_model_weights tmp;
	const sl_weight_place p = { .gpu_percent = gpu_percent, .cpu_percent = cpu_percent, .q4 = q4 };
	place_layer(c, &p, &tmp);
	const uint64_t split = tmp.unit[SL_UNIT_MLP].disk_off;
	const size_t n = sl_zseg_table_bytes(c->n_layer, sl_zseg_frames(tmp.disk_bytes, split, window));
	const uint64_t at = SL_DISK_HEADER_BYTES + (uint64_t)c->n_layer * tmp.disk_bytes;
	unsigned char *buf = malloc(n);
	if (!buf)
		return sl_err(SL_ENOMEM, "out of memory for the zstd frame table (%zu bytes)", n);
	int rc;
	const int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		rc = sl_err(SL_EIO, "%s: cannot open: %s", path, strerror(errno));
	} else {
		const ssize_t k = pread(fd, buf, n, (off_t)at);
		const int e = errno;
		close(fd);
		sl_zseg_table t;
		if (k < 0) {
			rc = sl_err(SL_EIO, "%s: reading its zstd frame table: %s", path, strerror(e));
		} else if (k != (ssize_t)n) {
			rc = sl_err(SL_EFORMAT, "%s: its zstd frame table is cut short", path);
		} else if ((rc = sl_zseg_table_decode(buf, n, tmp.disk_bytes, split, c->n_layer, path, &t)) == 0) {
			if (t.window != window)
				rc = sl_err(SL_EFORMAT, "%s: its zstd frame table is corrupt (frames of %u bytes, "
					    "its key says %u)", path, t.window, window);
			*ratio = rc ? 0 : sl_zseg_table_ratio(&t);
			sl_zseg_table_free(&t);
		}
	}
	free(buf);
	return rc;
}

int sl_weights_acquire(sl_backend *b, sl_queue *compute, sl_model_weights *w, int l, int u,
		       sl_layer_w *view)
{
	if (!w->streamed) {
		*view = w->layers[l];
		return 0;
	}
	void *slot;
	SL_TRY(sl_wstage_acquire(w->stage, compute, l, u, &slot));
	layer_view(w, &w->layers[l], slot, u, view);
	return 0;
}

int sl_weights_release(sl_backend *b, sl_queue *compute, sl_model_weights *w, int l, int u)
{
	if (!w->streamed)
		return 0;
	return sl_wstage_release(w->stage, compute, l, u);
}

int sl_weights_load(sl_backend *b, sl_queue *q, const sl_model_config *c, const sl_st_set *st,
		    const char *dir, const sl_weight_place *place, sl_model_weights *w)
{
	source src = { .st = st, .dir = dir };
	return load_all(b, q, c, &src, place, false, w);
}

int sl_weights_dummy(sl_backend *b, sl_queue *q, const sl_model_config *c, uint64_t seed,
		     const sl_weight_place *place, sl_model_weights *w)
{
	source src = { .seed = seed + 1 };
	return load_all(b, q, c, &src, place, false, w);
}

int sl_weights_write_store(sl_backend *b, const sl_model_config *c, const sl_st_set *st, const char *dir,
			   uint64_t seed, const sl_weight_place *place)
{
	source src = { .st = st, .dir = dir, .seed = st ? 0 : seed + 1 };
	sl_model_weights w;
	int rc = load_all(b, NULL, c, &src, place, true, &w);
	if (rc == 0)
		sl_weights_free(b, &w);
	return rc;
}

void sl_weights_free(sl_backend *b, sl_model_weights *w)
{
	if (!w)
		return;
	sl_wstage_free(w->stage);
	if (w->layers)
		for (int l = 0; l < w->n_layer; l++) {
			sl_buf_free(b, &w->layers[l].block);
			sl_buf_free(b, &w->layers[l].host);
		}
	sl_buf_free(b, &w->block);
	free(w->layers);
	sl_zseg_table_free(&w->zt);
	memset(w, 0, sizeof *w);
}
