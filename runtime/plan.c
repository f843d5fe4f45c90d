/*
 * plan.c - the run plan's arithmetic (plan.h): the workspace layout, and
 * the bytes of the weights (weights.h's placement), the KV cache
 * (kvcache.h's split) and the activations in each tier.
 */
#include "plan.h"
#include "kvcache.h"
#include "sl_common.h"
#include "weights.h"

#include <math.h>
#include <string.h>

sl_plan_params sl_plan_defaults(void)
{
	return (sl_plan_params){ .w_gpu = 100, .cache_gpu = 100, .fixed_heavy = -1,
				 .fixed_recent = -1 };
}

sl_plan_params sl_plan_of_policy(const sl_policy *pol, bool micro_given, bool kv_f32)
{
	sl_plan_params p = sl_plan_defaults();
	p.w_gpu = pol->w_gpu_percent;
	p.w_cpu = pol->w_cpu_percent;
	p.cache_gpu = pol->cache_gpu_percent;
	p.cache_cpu = pol->cache_cpu_percent;
	p.act_host = pol->act_cpu_percent >= 100;
	p.cpu_cache_compute = pol->cpu_cache_compute;
	p.overlap = pol->overlap;
	p.sep_layer = pol->sep_layer;
	p.kv_f32 = kv_f32;
	p.kv_q4 = pol->compress_cache;
	p.w_q4 = pol->compress_weight;
	p.micro = micro_given ? pol->gpu_batch_size : 0;
	p.hh = pol->hh_ratio;
	p.rr = pol->hh_ratio > 0 || pol->recent_ratio > 0 ? sl_policy_recent_ratio(pol) : 0;
	return p;
}

size_t sl_plan_kv_slot_bytes(const sl_model_config *c, const sl_plan_params *p)
{
	return sl_kv_slot_bytes(c->n_kv_head, sl_model_head_dim(c), p->kv_f32, p->kv_q4);
}

int sl_plan_group_rows(int micro, int max_seq, int max_rows)
{
	if (micro <= 0 || micro >= max_seq)
		return max_rows;
	return (int)(((long)max_rows * micro + max_seq - 1) / max_seq);
}

/* h (act_host: the step buffers: two, or one when a micro-batch is the
 * whole block and its rows stay put), x, qb, kb, vb, ab, fb, logits.
 * qb and ab hold query-width rows (q_dim: hidden for OPT), kb and vb the
 * key and value rows (kv_dim <= q_dim); the LLaMA family's fb holds the
 * SwiGLU's gate and up rows side by side (2 ffn). */
void sl_plan_ws_sizes(const sl_model_config *c, int max_seq, int max_rows, int micro, bool act_host,
		      size_t sizes[SL_WS_BUFFERS])
{
	const size_t r = (size_t)max_rows, h = (size_t)c->hidden;
	const size_t g = (size_t)sl_plan_group_rows(micro, max_seq, max_rows);
	const size_t gx = SL_MAX(g, (size_t)max_seq); /* also the head's rows */
	const size_t qd = (size_t)SL_MAX(c->hidden, sl_model_q_dim(c));
	const size_t wide = SL_MAX(qd, (size_t)c->embed_dim);
	const size_t ff = (size_t)c->ffn * (c->family == SL_FAMILY_LLAMA ? 2 : 1);
	const size_t nbuf = g >= r ? 1 : 2;
	const size_t v[SL_WS_BUFFERS] = { act_host ? nbuf * gx * h : r * h, gx * wide, gx * wide,
					  g * qd, g * qd, g * qd, g * ff,
					  (size_t)max_seq * c->vocab };
	memcpy(sizes, v, sizeof v);
}

size_t sl_plan_ws_bytes(const sl_model_config *c, int max_seq, int max_rows, int micro, bool act_host)
{
	size_t sizes[SL_WS_BUFFERS], total = 0;
	sl_plan_ws_sizes(c, max_seq, max_rows, micro, act_host, sizes);
	for (size_t i = 0; i < SL_WS_BUFFERS; i++)
		total += (sizes[i] * sizeof(float) + 255) & ~(size_t)255;
	return total;
}

/* act_host: the pinned host bytes of the residual stream. */
static size_t act_host_bytes(const sl_model_config *c, int max_rows, bool act_host)
{
	return act_host ? (size_t)max_rows * c->hidden * sizeof(float) : 0;
}

static bool pct_ok(double a, double b)
{
	return a >= 0 && b >= 0 && a <= 100 && b <= 100 && a + b <= 100 + 1e-9;
}

static int check_params(const sl_model_config *c, const sl_plan_params *p)
{
	if (!pct_ok(p->w_gpu, p->w_cpu))
		return sl_err(SL_EINVAL, "run plan: weight placement %g%% device, %g%% host is not a split of 100%%",
			      p->w_gpu, p->w_cpu);
	if (!pct_ok(p->cache_gpu, p->cache_cpu))
		return sl_err(SL_EINVAL, "run plan: cache placement %g%% device, %g%% host is not a split of 100%%",
			      p->cache_gpu, p->cache_cpu);
	if (!(p->w_zstd >= 0 && p->w_zstd <= 1))
		return sl_err(SL_EINVAL, "run plan: a zstd store's ratio %g is not in (0, 1] (0: a plain store)",
			      p->w_zstd);
	if (p->w_zstd_window % 4096)
		return sl_err(SL_EINVAL, "run plan: a zstd store's window of %u bytes is not a page multiple",
			      p->w_zstd_window);
	if (p->micro < 0 || p->max_seq < 0 || p->max_prompt < 0 || p->max_len < 0 || p->max_rows < 0)
		return sl_err(SL_EINVAL, "run plan: a negative size (micro %d, sequences %d, prompt %d, length %d, rows %d)",
			      p->micro, p->max_seq, p->max_prompt, p->max_len, p->max_rows);
	if (!(p->hh >= 0 && p->rr >= 0 && p->hh + p->rr <= 1 + 1e-9))
		return sl_err(SL_EINVAL, "run plan: H2O ratios %g and %g are not shares of a prompt", p->hh,
			      p->rr);
	if (p->max_seq > 0) {
		if (p->max_len < 1 || p->max_prompt < 1 || p->max_prompt > p->max_len)
			return sl_err(SL_EINVAL, "run plan: a workload of prompts up to %d tokens in sequences of %d",
				      p->max_prompt, p->max_len);
		if (p->max_len > c->max_pos)
			return sl_err(SL_ERANGE, "%d positions needed, the model has %d", p->max_len,
				      c->max_pos);
		SL_TRY(sl_model_check_length(c, p->max_len));
	}
	return 0;
}

/* The cache slots of a sequence: max_len (dense), or H2O's budget of the
 * longest prompt plus one (never more than max_len). */
static int cache_slots(const sl_plan_params *p, bool h2o)
{
	if (!h2o)
		return p->max_len;
	const int heavy = p->fixed_heavy >= 0 ? p->fixed_heavy : (int)floor(p->hh * p->max_prompt);
	const int recent = p->fixed_recent >= 0 ? p->fixed_recent : (int)floor(p->rr * p->max_prompt);
	return SL_MIN(p->max_len, heavy + recent + 1);
}

/* The weights' bytes under the placement. */
static void weight_bytes(const sl_model_config *c, const sl_plan_params *p, bool dev_is_host,
			 sl_plan *pl)
{
	/* a zstd store: any level (the buffers do not depend on it) */
	const sl_weight_place wp = { .gpu_percent = p->w_gpu, .cpu_percent = p->w_cpu,
				     .halves = p->sep_layer, .q4 = p->w_q4, .zstd = p->w_zstd > 0,
				     .zstd_window = p->w_zstd_window, .host_in_place = dev_is_host };
	size_t resident, loading;
	sl_weights_host_bytes(c, &wp, dev_is_host, &resident, &loading);
	pl->weights.device = sl_weights_device_bytes(c, &wp);
	pl->weights.host = resident;
	pl->weights.disk = sl_weights_store_bytes(c, p->w_gpu, p->w_cpu, p->w_q4, sl_weight_place_window(c, &wp));
	pl->weights_loading = loading;
}

/* A job of the workload: its cache and activations. */
static void job_bytes(const sl_model_config *c, const sl_plan_params *p, bool dev_is_host, sl_plan *pl)
{
	const size_t es = sl_plan_kv_slot_bytes(c, p);
	sl_kv_sizes kz;
	sl_kv_tier_sizes(c, p->max_seq, pl->gs, pl->cap, es, pl->h2o, p->cache_gpu, p->cache_cpu,
			 dev_is_host, &kz);
	pl->cache.device = kz.device +
			   (pl->h2o ? sl_kv_h2o_extra(c, p->max_seq, pl->gs, p->max_prompt, es) : 0);
	pl->cache.host = kz.host;
	pl->cache.disk = kz.disk;
	if (p->cpu_cache_compute && !dev_is_host && kz.host_seqs > 0)
		pl->cache.host += sl_kv_ccc_bytes(c, pl->gs);
	pl->act.device = sl_plan_ws_bytes(c, p->max_seq, pl->max_rows, p->micro, p->act_host);
	pl->act.host = act_host_bytes(c, pl->max_rows, p->act_host);
}

int sl_plan_make(const sl_model_config *c, const sl_plan_params *p, bool dev_is_host, sl_plan *out)
{
	memset(out, 0, sizeof *out);
	SL_TRY(check_params(c, p));
	out->p = *p;
	out->dev_is_host = dev_is_host;
	out->h2o = p->hh > 0 || p->rr > 0 || p->fixed_heavy >= 0 || p->fixed_recent >= 0;
	weight_bytes(c, p, dev_is_host, out);
	if (p->max_seq > 0) {
		out->gs = sl_kv_group(p->micro, p->max_seq);
		out->cap = cache_slots(p, out->h2o);
		out->max_rows = SL_MAX(p->max_rows ? p->max_rows : p->max_seq * p->max_len, p->max_seq);
		out->group_rows = sl_plan_group_rows(p->micro, p->max_seq, out->max_rows);
		job_bytes(c, p, dev_is_host, out);
	}
	out->total.device = out->weights.device + out->cache.device + out->act.device;
	out->total.host = SL_MAX(out->weights_loading,
				 out->weights.host + out->cache.host + out->act.host);
	out->total.disk = out->weights.disk + out->cache.disk;
	return 0;
}

size_t sl_plan_min_device_bytes(const sl_model_config *c, const sl_plan_params *p, bool dev_is_host)
{
	const size_t es = sl_plan_kv_slot_bytes(c, p);
	/* the globals and two staging slots (of half layers with sep_layer),
	 * every layer's weights streamed from the host or from the disk,
	 * whichever stages in less */
	sl_weight_place wp = { .gpu_percent = 0, .cpu_percent = 100, .halves = p->sep_layer,
			       .q4 = p->w_q4, .host_in_place = dev_is_host };
	const size_t from_host = sl_weights_device_bytes(c, &wp);
	wp.cpu_percent = 0;
	const size_t weights = SL_MIN(from_host, sl_weights_device_bytes(c, &wp));
	const bool h2o = p->hh > 0 || p->rr > 0;
	int cap = p->max_len;
	size_t extra = 0;
	const int rows = SL_MAX(p->max_rows ? p->max_rows : p->max_seq * p->max_len, p->max_seq);
	if (h2o) {
		cap = sl_kv_h2o_slots(p->hh, p->rr, p->max_prompt, cap);
		extra = sl_kv_h2o_extra(c, p->max_seq, sl_kv_group(p->micro, p->max_seq), p->max_prompt, es);
	}
	sl_kv_sizes kz;
	sl_kv_tier_sizes(c, p->max_seq, p->micro, cap, es, h2o, 0, 100, true, &kz);
	return weights + kz.device + extra +
	       sl_plan_ws_bytes(c, p->max_seq, rows, p->micro, p->act_host);
}

int sl_plan_check_job(const sl_plan *pl, int nseq, int max_prompt, int max_len)
{
	const sl_plan_params *p = &pl->p;
	if (!p->max_seq || (nseq <= p->max_seq && max_prompt <= p->max_prompt && max_len <= p->max_len))
		return 0;
	return sl_err(SL_EINVAL, "a job of %d sequences with prompts up to %d and %d tokens in all is larger than the run plan's %d, %d and %d",
		      nseq, max_prompt, max_len, p->max_seq, p->max_prompt, p->max_len);
}
