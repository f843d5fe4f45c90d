/*
 * model.c - the forward pass on any backend, for left-padded prefill and
 * one-token decode over the KV cache: OPT (pre-LN and 350m's post-LN with
 * project_in/project_out) and the LLaMA family (RMSNorm, RoPE on q and k,
 * grouped KV heads, the SwiGLU MLP; Qwen2's q/k/v biases).  The families
 * share the schedule (layers(): weights, cache steps, micro-batches,
 * activations on the host); they differ only inside a layer's two halves,
 * the embedding and the head.
 */
#include "model.h"
#include "kvcache.h"
#include "safetensors.h"
#include "topology.h"
#include "wstore.h"

#include <limits.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>

int sl_model_open(sl_backend *be, const char *dir, const char *dummy, sl_model **out)
{
	sl_model_params p = { .dir = dir, .dummy = dummy };
	return sl_model_open_ex(be, &p, out);
}

void sl_model_io_node(sl_backend *be, sl_disk_params *dp)
{
	sl_device_info di;
	sl_backend_device_info(be, &di);
	dp->bind_io = true;
	dp->io_node = sl_topo_io_node(di.pci_bus_id[0] ? di.pci_bus_id : NULL);
}

/* A current zstd store for the placement of pp in p's offload folder
 * (z->level 0: none, or no disk share). */
static int find_zstd(const sl_model_params *p, const sl_st_set *st, const sl_model_config *c,
		     const sl_plan_params *pp, bool quiet, char *name, size_t name_len, char *key, size_t key_len,
		     sl_wstore_zstd *z)
{
	*z = (sl_wstore_zstd){ 0 };
	if (!p->offload_dir || pp->w_gpu + pp->w_cpu >= 100.0)
		return 0;
	const int rc = sl_wstore_find_zstd(p->offload_dir, p->dir, st, c, pp->w_gpu, pp->w_cpu, pp->w_q4, quiet,
					   name, name_len, key, key_len, z);
	return rc < 0 ? rc : 0;
}

int sl_model_find_zstd(const sl_model_params *p, sl_wstore_zstd *z)
{
	*z = (sl_wstore_zstd){ 0 };
	const sl_plan_params defaults = sl_plan_defaults();
	const sl_plan_params *pp = p->plan ? p->plan : &defaults;
	if (!p->offload_dir || pp->w_gpu + pp->w_cpu >= 100.0)
		return 0;
	sl_model_config c;
	sl_st_set *st = NULL;
	int rc;
	if (p->dir) {
		char path[PATH_MAX];
		snprintf(path, sizeof path, "%s/config.json", p->dir);
		if ((rc = sl_model_config_load(path, &c)) < 0 || (rc = sl_st_open_dir(p->dir, &st)) < 0)
			return rc;
	} else if ((rc = sl_model_config_named(p->dummy, &c)) < 0) {
		return rc;
	}
	char *key = malloc(SL_DISK_MAX_KEY + 1), name[SL_WSTORE_NAME_MAX];
	rc = key ? find_zstd(p, st, &c, pp, true, name, sizeof name, key, SL_DISK_MAX_KEY + 1, z)
		 : sl_err(SL_ENOMEM, "out of memory");
	free(key);
	sl_st_close(st);
	return rc;
}

int sl_model_open_ex(sl_backend *be, const sl_model_params *p, sl_model **out)
{
	*out = NULL;
	sl_model *m = calloc(1, sizeof *m);
	if (!m)
		return sl_err(SL_ENOMEM, "out of memory");
	m->be = be;
	if (p->offload_dir && !(m->offload_dir = strdup(p->offload_dir))) {
		free(m);
		return sl_err(SL_ENOMEM, "out of memory");
	}
	sl_st_set *st = NULL;
	int rc = sl_queue_create(be, &m->q);
	if (rc < 0)
		goto fail;
	if (p->dir) {
		char path[PATH_MAX];
		snprintf(path, sizeof path, "%s/config.json", p->dir);
		if ((rc = sl_model_config_load(path, &m->cfg)) < 0)
			goto fail;
		if ((rc = sl_st_open_dir(p->dir, &st)) < 0)
			goto fail;
	} else if ((rc = sl_model_config_named(p->dummy, &m->cfg)) < 0) {
		goto fail;
	}
	if (m->cfg.family == SL_FAMILY_LLAMA) {
		const sl_llama_config *lc = &m->cfg.llama;
		if ((rc = sl_rope_inv_freq(lc->head_dim, lc->rope_theta, &lc->rope, m->inv_freq)) < 0)
			goto fail;
	}
	/* a current store of zstd frames (sluice convert --zstd) for the
	 * placement is read in place of the plain one: the plan counts its
	 * buffers and predicts its reads */
	const sl_plan_params defaults = sl_plan_defaults();
	sl_plan_params given = p->plan ? *p->plan : defaults;
	char key[SL_DISK_MAX_KEY + 1], name[SL_WSTORE_NAME_MAX];
	sl_wstore_zstd z;
	if ((rc = find_zstd(p, st, &m->cfg, &given, false, name, sizeof name, key, sizeof key, &z)) < 0)
		goto fail;
	given.w_zstd = z.level ? z.ratio : 0;
	given.w_zstd_window = z.window;
	if ((rc = sl_plan_make(&m->cfg, &given, be->ops->dev_is_host, &m->plan)) < 0)
		goto fail;
	const sl_plan_params *pp = &m->plan.p;
	m->kv_env = (sl_kv_env){ .be = be, .q = m->q, .cfg = &m->cfg, .plan = &m->plan,
				 .offload_dir = m->offload_dir, .stats = &m->kv_stats };
	if (pp->cache_gpu + pp->cache_cpu < 100.0) { /* the cache's disk scratch store */
		sl_disk_params dp = { 0 };
		sl_model_io_node(be, &dp);
		m->kv_env.bind_io = dp.bind_io;
		m->kv_env.io_node = dp.io_node;
	}
	sl_weight_place place = { .gpu_percent = pp->w_gpu, .cpu_percent = pp->w_cpu,
				  .overlap = pp->overlap, .halves = pp->sep_layer, .q4 = pp->w_q4,
				  .host_in_place = be->ops->dev_is_host, .interrupt = p->interrupt };
	if (pp->w_gpu + pp->w_cpu < 100.0) {
		if (!p->offload_dir) {
			rc = sl_err(SL_EINVAL, "weights placed on disk need --offload-dir DIR");
			goto fail;
		}
		/* one store per model and placement, keyed on what it is made
		 * from (the zstd one's name and key found above); the data
		 * area: every layer's disk segment (and the frames' table) */
		uint64_t data = (uint64_t)m->cfg.n_layer * sl_weights_disk_bytes(&m->cfg, pp->w_gpu, pp->w_cpu,
										 pp->w_q4);
		place.zstd = z.level;
		place.zstd_window = z.window;
		if (z.level)
			data = z.data_bytes;
		else if ((rc = sl_wstore_ident(p->dir, st, &m->cfg, pp->w_gpu, pp->w_cpu, pp->w_q4, 0, 0, name,
					       sizeof name, key, sizeof key)) < 0)
			goto fail;
		sl_disk_params dp = { .dir = p->offload_dir, .file_name = name, .key = key, .data_bytes = data };
		sl_model_io_node(be, &dp);
		bool fresh = true;
		if ((rc = sl_wstore_open(&dp, &m->disk, &fresh)) < 0)
			goto fail;
		place.disk = m->disk;
		place.disk_ready = !fresh;
	}
	rc = p->dir ? sl_weights_load(be, m->q, &m->cfg, st, p->dir, &place, &m->w)
		    : sl_weights_dummy(be, m->q, &m->cfg, 0, &place, &m->w);
	if (rc < 0)
		goto fail;
	sl_st_close(st);
	*out = m;
	return 0;
fail:
	sl_st_close(st);
	sl_model_free(m);
	return rc;
}

static void release_ws(sl_model *m)
{
	sl_rstage_release(m->act); /* its copies done before the buffers go */
	sl_buf_free(m->be, &m->ws);
	m->h = NULL;
	free(m->ids_host);
	free(m->pos_host);
	m->ids_host = m->pos_host = NULL;
	m->max_rows = m->max_seq = 0;
}

void sl_model_release(sl_model *m)
{
	release_ws(m);
}

void sl_model_free(sl_model *m)
{
	if (!m)
		return;
	release_ws(m);
	sl_rstage_free(m->act);
	sl_weights_free(m->be, &m->w);
	sl_disk_close(m->disk);
	free(m->offload_dir);
	if (m->q)
		sl_queue_free(m->be, m->q);
	free(m);
}

int sl_model_reserve(sl_model *m, int max_seq, int max_rows)
{
	const sl_plan *pl = &m->plan;
	if (pl->p.max_seq) { /* a planned workload: its workspace, once */
		if (max_seq > pl->p.max_seq || max_rows > pl->max_rows)
			return sl_err(SL_EINVAL, "a block of %d sequences and %d rows is larger than the run plan's %d and %d",
				      max_seq, max_rows, pl->p.max_seq, pl->max_rows);
		max_seq = pl->p.max_seq;
		max_rows = pl->max_rows;
	}
	/* a micro-batch's buffers hold micro sequences of the longest rows
	 * per sequence asked for so far: an open plan's later block of fewer,
	 * longer sequences needs more of them than an earlier wider one */
	const int t = (max_rows + max_seq - 1) / SL_MAX(max_seq, 1);
	const int t_had = m->max_seq ? (m->max_rows + m->max_seq - 1) / m->max_seq : 0;
	if (max_seq <= m->max_seq && max_rows <= m->max_rows && t <= t_had)
		return 0;
	max_seq = SL_MAX(max_seq, m->max_seq);
	max_rows = SL_MAX(SL_MAX(max_rows, m->max_rows), max_seq);
	if (!pl->p.max_seq && pl->p.micro > 0)
		max_rows = SL_MAX(max_rows, max_seq * SL_MAX(t, t_had));
	release_ws(m);
	const sl_model_config *c = &m->cfg;
	const int micro = pl->p.micro;
	const bool act_host = pl->p.act_host;
	const size_t r = (size_t)max_rows;
	size_t sizes[SL_WS_BUFFERS];
	sl_plan_ws_sizes(c, max_seq, max_rows, micro, act_host, sizes);
	float *hdev = NULL;
	float **ptrs[] = { &hdev, &m->x, &m->qb, &m->kb, &m->vb, &m->ab, &m->fb, &m->logits };
	size_t total = sl_plan_ws_bytes(c, max_seq, max_rows, micro, act_host);
	int rc = sl_buf_alloc(m->be, SL_MEM_DEVICE, total, "activation workspace", &m->ws);
	if (rc < 0)
		return rc;
	char *p = m->ws.p;
	for (size_t i = 0; i < SL_ARRAY_LEN(sizes); i++) {
		*ptrs[i] = (float *)p;
		p += (sizes[i] * sizeof(float) + 255) & ~(size_t)255;
	}
	if (!act_host) {
		m->h = hdev;
	} else {
		/* the rows on the host, staged through the workspace's first
		 * buffer: two step buffers, or one when the block is one
		 * micro-batch (every step then keeps its rows) */
		const size_t gx = SL_MAX((size_t)sl_plan_group_rows(micro, max_seq, max_rows),
					 (size_t)max_seq);
		const bool one = sizes[0] <= gx * c->hidden;
		if (!m->act)
			rc = sl_rstage_create(m->be, (size_t)c->hidden * sizeof(float), pl->p.overlap,
					      &m->act);
		if (rc == 0)
			rc = sl_rstage_reserve(m->act, r, gx, one, hdev, "activations (host)");
		if (rc < 0) {
			release_ws(m);
			return rc;
		}
	}
	m->ids_host = malloc(r * sizeof(int32_t));
	m->pos_host = malloc(r * sizeof(int32_t));
	if (!m->ids_host || !m->pos_host) {
		release_ws(m);
		return sl_err(SL_ENOMEM, "out of memory");
	}
	m->max_rows = max_rows;
	m->max_seq = max_seq;
	m->group_rows = sl_plan_group_rows(micro, max_seq, max_rows);
	return 0;
}

/* y (+)= x w^T (+ bias): w fp16, or (q4) a layer matrix in sl_q4's layout
 * (compress_weight), dequantised inside the GEMM. */
static int linear_q(sl_model *m, bool q4, int rows, const float *x, int ldx, const sl_half *w,
		    const sl_half *bias, int n, int k, float *y, int ldy, float alpha, unsigned flags)
{
	sl_gemm_args g = { .m = rows, .n = n, .k = k, .x = x, .ldx = ldx, .w = q4 ? NULL : w,
			   .wq = q4 ? (const void *)w : NULL, .bias = bias, .y = y, .ldy = ldy,
			   .alpha = alpha, .flags = flags };
	return sl_gemm(m->be, m->q, &g);
}

/* y (+)= x wt^T (+ bias) for a matrix wt of layer view lw: one GEMM per
 * piece where the placement split it by rows (sl_wcut), each writing its
 * own columns of y with its own part of the bias. */
static int layer_linear(sl_model *m, const sl_layer_w *lw, int rows, const float *x, int ldx,
			const sl_half *wt, const sl_half *bias, int n, int k, float *y, int ldy, float alpha,
			unsigned flags)
{
	int r0 = 0;
	const sl_half *p = wt;
	while (p) {
		int r1 = n;
		const sl_half *next = NULL;
		for (int i = 0; i < lw->ncut; i++)
			if (lw->cut[i].first == wt && lw->cut[i].row > r0 && lw->cut[i].row < r1) {
				r1 = lw->cut[i].row;
				next = lw->cut[i].rest;
			}
		SL_TRY(linear_q(m, lw->q4, rows, x, ldx, p, bias ? bias + r0 : NULL, r1 - r0, k, y + r0, ldy,
				alpha, flags));
		r0 = r1;
		p = next;
	}
	return 0;
}

/* The embeddings' side (project_in, project_out, the head): always fp16. */
static int linear(sl_model *m, int rows, const float *x, int ldx, const sl_half *w,
		  const sl_half *bias, int n, int k, float *y, int ldy, float alpha, unsigned flags)
{
	return linear_q(m, false, rows, x, ldx, w, bias, n, k, y, ldy, alpha, flags);
}

/* Embeddings of rows [r0, r0 + rows) into out (device, rows x hidden),
 * whose token ids and positions are in m->ids_host / m->pos_host (OPT's
 * already offset by 2). */
static int embed_rows(sl_model *m, int r0, int rows, float *out)
{
	const sl_model_config *c = &m->cfg;
	if (c->family == SL_FAMILY_LLAMA) /* positions come with the rotation */
		return sl_embed(m->be, m->q, rows, c->hidden, m->w.embed_tokens, m->ids_host + r0, out,
				false);
	if (c->embed_dim == c->hidden) {
		SL_TRY(sl_embed(m->be, m->q, rows, c->hidden, m->w.embed_tokens, m->ids_host + r0, out,
				false));
	} else {
		/* project_in through x, a micro-batch's rows at a time */
		const int step = SL_MAX(1, SL_MIN(m->group_rows, m->max_rows));
		for (int i = 0; i < rows; i += step) {
			const int n = SL_MIN(step, rows - i);
			SL_TRY(sl_embed(m->be, m->q, n, c->embed_dim, m->w.embed_tokens,
					m->ids_host + r0 + i, m->x, false));
			SL_TRY(linear(m, n, m->x, c->embed_dim, m->w.project_in, NULL, c->hidden,
				      c->embed_dim, out + (size_t)i * c->hidden, c->hidden, 1.0f, 0));
		}
	}
	return sl_embed(m->be, m->q, rows, c->hidden, m->w.embed_pos, m->pos_host + r0, out, true);
}

/* Embeddings of the block's `rows` rows into the residual stream: in place
 * on the device, or (act_host) through a step buffer to the host rows. */
static int embed(sl_model *m, int rows)
{
	if (!m->act)
		return embed_rows(m, 0, rows, m->h);
	const int step = SL_MAX(m->group_rows, m->max_seq); /* a step buffer's rows */
	for (int r0 = 0; r0 < rows; r0 += step) {
		const int n = SL_MIN(step, rows - r0);
		SL_TRY(embed_rows(m, r0, n, sl_rstage_scratch(m->act)));
		SL_TRY(sl_rstage_put(m->act, m->q, r0, (size_t)n));
	}
	/* the first steps' loads read these rows, into buffers the embedding used */
	return sl_rstage_restart(m->act, m->q);
}

/*
 * The residual rows of the g sequences from s0 (t rows each) on the device
 * for a step, in place or (act_host) staged: prefetching, with overlap,
 * the rows of the next step's sequences from next_s0 (>= 0, when they
 * differ).
 */
static int act_begin(sl_model *m, int s0, int g, int t, int next_s0, int next_g, float **hg)
{
	if (!m->act) {
		*hg = m->h + (size_t)s0 * t * m->cfg.hidden;
		return 0;
	}
	void *dev;
	SL_TRY(sl_rstage_begin(m->act, m->q, (long)s0 * t, (size_t)g * t,
			       next_s0 < 0 ? -1 : (long)next_s0 * t, (size_t)next_g * t, &dev));
	*hg = dev;
	return 0;
}

/* act_host: after the step's work is issued, store its rows back to the
 * host unless the next step works on the same rows (next_s0 == s0). */
static int act_end(sl_model *m, int s0, int g, int t, int next_s0)
{
	if (!m->act)
		return 0;
	return sl_rstage_end(m->act, m->q, (long)s0 * t, (size_t)g * t,
			     next_s0 < 0 ? -1 : (long)next_s0 * t);
}

/*
 * Attention of layer l with the H2O cache, for the g sequences from s0.
 * Prefill: dense attention over the whole prompt in the scratch cache,
 * with each token's column-sum score, then keep the heavy hitters and the
 * recent window.  Decode: attention over the kept tokens and the new one,
 * every score grown by this step's probability, then one eviction when
 * over budget.
 */
static int h2o_attention(sl_model *m, sl_kv *kv, int l, const sl_kv_part *p, sl_attn_args *a,
			 bool prefill, int t)
{
	const sl_model_config *c = &m->cfg;
	/* eviction is per KV head: the scores of a group's query heads summed
	 * (the attention ops'), so H2O sees n_kv_head heads */
	const int nh = c->n_kv_head, hd = sl_model_head_dim(c);
	const int s0 = p->seq, g = p->count;
	sl_h2o_args h = { .nseq = g, .nh = nh, .hd = hd, .kv_f32 = kv->f32, .kv_q4 = kv->q4,
			  .k_cache = a->k_cache, .v_cache = a->v_cache,
			  .score = p->score, .pos = p->pos,
			  .cap = kv->cap, .heavy = kv->heavy + s0, .recent = kv->recent + s0,
			  .evicted = kv->evicted + ((size_t)l * kv->nseq + s0) * nh };
	if (prefill) {
		if (t > kv->scratch_cap)
			return sl_err(SL_EBUDGET, "prompt of %d tokens is longer than the H2O scratch (%d)",
				      t, kv->scratch_cap);
		/* one micro-batch's scratch: this part's place within it */
		const size_t ss = (size_t)(s0 % kv->gs) * nh * kv->scratch_cap;
		float *score = kv->scratch_score + ss;
		SL_TRY(sl_memset_dev(m->be, m->q, score, 0, sizeof(float) * (size_t)g * nh * kv->scratch_cap));
		sl_attn_args pa = *a;
		/* ss / nh slots of slot_bytes (every head) into the scratch */
		pa.k_cache = (char *)kv->scratch_k + ss / nh * kv->slot_bytes;
		pa.v_cache = (char *)kv->scratch_v + ss / nh * kv->slot_bytes;
		pa.cap = kv->scratch_cap;
		pa.score = score;
		SL_TRY(sl_attn_prefill(m->be, m->q, &pa));
		h.k_src = pa.k_cache;
		h.v_src = pa.v_cache;
		h.score_src = score;
		h.cap_in = kv->scratch_cap;
		h.n = kv->len + s0;
		return sl_h2o_compact(m->be, m->q, &h);
	}
	a->score = h.score;
	SL_TRY(sl_attn_decode(m->be, m->q, a));
	h.len = kv->len + s0;
	h.cur = kv->pos + s0;
	return sl_h2o_evict(m->be, m->q, &h);
}

/* Attention over one part of a micro-batch: p->count sequences from
 * p->seq, whose rows in the micro-batch's q/k/v/out buffers start at
 * (p->seq - s0) * t; their cache is at p->k, p->v. */
static int attend(sl_model *m, sl_kv *kv, int l, int s0, const sl_kv_part *p, int t,
		  const int *npad, bool prefill)
{
	const sl_model_config *c = &m->cfg;
	const sl_backend_ops *o = m->be->ops;
	/* the part's rows: query-width in q and out, key-width in k and v */
	const size_t rq = (size_t)(p->seq - s0) * t * sl_model_q_dim(c);
	const size_t rk = (size_t)(p->seq - s0) * t * sl_model_kv_dim(c);
	sl_attn_args a = { .nseq = p->count, .nh = c->n_head, .nkv = c->n_kv_head, .hd = sl_model_head_dim(c), .t = t,
			   .cap = kv->cap, .q = m->qb + rq, .k_new = m->kb + rk, .v_new = m->vb + rk,
			   .out = m->ab + rq, .k_cache = p->k, .v_cache = p->v, .kv_f32 = kv->f32,
			   .kv_q4 = kv->q4,
			   .npad = npad ? npad + p->seq : NULL, .len = kv->len + p->seq };
	if (!prefill && p->tier == SL_TIER_HOST && m->plan.p.cpu_cache_compute && !o->dev_is_host)
		return sl_kv_host_attention(kv, l, p, &a);
	if (kv->h2o)
		return h2o_attention(m, kv, l, p, &a, prefill, t);
	return prefill ? sl_attn_prefill(m->be, m->q, &a) : sl_attn_decode(m->be, m->q, &a);
}

/* The LLaMA family's attention half: RMSNorm, q/k/v (+ Qwen2's biases), q
 * scaled by 1/sqrt(head_dim) in its GEMM (the rotation is linear, so the
 * order does not matter but for rounding), RoPE on q and k at each row's
 * position, attention over the cache (K stored rotated), o_proj into the
 * residual. */
static int llama_attn_block(sl_model *m, sl_kv *kv, int l, const sl_layer_w *w, float *hg,
			    int s0, int g, int t, const int *npad, bool prefill,
			    const sl_kv_part *parts, int nparts)
{
	const sl_model_config *c = &m->cfg;
	const int h = c->hidden, hd = c->head_dim, qd = sl_model_q_dim(c), kd = sl_model_kv_dim(c);
	const int rows = g * t;
	const float scale = 1.0f / sqrtf((float)hd);
	SL_TRY(sl_rmsnorm(m->be, m->q, rows, h, hg, h, w->ln1_g, c->llama.rms_eps, m->x, h));
	SL_TRY(layer_linear(m, w, rows, m->x, h, w->q_w, w->q_b, qd, h, m->qb, qd, scale, 0));
	SL_TRY(layer_linear(m, w, rows, m->x, h, w->k_w, w->k_b, kd, h, m->kb, kd, 1.0f, 0));
	SL_TRY(layer_linear(m, w, rows, m->x, h, w->v_w, w->v_b, kd, h, m->vb, kd, 1.0f, 0));
	/* the block's rows s0 * t.. have their positions in pos_host */
	const sl_rope_args ra = { .rows = rows, .hd = hd, .nh_q = c->n_head, .nh_k = c->n_kv_head,
				  .q = m->qb, .ldq = qd, .k = m->kb, .ldk = kd,
				  .pos = m->pos_host + (size_t)s0 * t, .inv_freq = m->inv_freq };
	SL_TRY(sl_rope(m->be, m->q, &ra));
	for (int i = 0; i < nparts; i++)
		SL_TRY(attend(m, kv, l, s0, &parts[i], t, npad, prefill));
	return layer_linear(m, w, rows, m->ab, qd, w->o_w, NULL, h, qd, hg, h, 1.0f, SL_GEMM_ACCUM);
}

/* The LLaMA family's MLP half: RMSNorm, gate and up side by side in fb,
 * SwiGLU into the gate's columns, down into the residual. */
static int llama_mlp_block(sl_model *m, const sl_layer_w *w, float *hg, int g, int t)
{
	const sl_model_config *c = &m->cfg;
	const int h = c->hidden, f = c->ffn;
	const int rows = g * t;
	float *gate = m->fb, *up = m->fb + f;
	SL_TRY(sl_rmsnorm(m->be, m->q, rows, h, hg, h, w->ln2_g, c->llama.rms_eps, m->x, h));
	SL_TRY(layer_linear(m, w, rows, m->x, h, w->gate_w, NULL, f, h, gate, 2 * f, 1.0f, 0));
	SL_TRY(layer_linear(m, w, rows, m->x, h, w->up_w, NULL, f, h, up, 2 * f, 1.0f, 0));
	SL_TRY(sl_swiglu(m->be, m->q, rows, f, gate, 2 * f, up, 2 * f, gate, 2 * f));
	return layer_linear(m, w, rows, gate, 2 * f, w->down_w, NULL, h, f, hg, h, 1.0f, SL_GEMM_ACCUM);
}

/* The attention half of decoder layer l for the g sequences from s0,
 * whose residual rows are hg, over the cache parts of this step. */
static int attn_block(sl_model *m, sl_kv *kv, int l, const sl_layer_w *w, float *hg, int s0,
		      int g, int t, const int *npad, bool prefill, const sl_kv_part *parts,
		      int nparts)
{
	const sl_model_config *c = &m->cfg;
	if (c->family == SL_FAMILY_LLAMA)
		return llama_attn_block(m, kv, l, w, hg, s0, g, t, npad, prefill, parts, nparts);
	const sl_opt_config *oc = &c->opt;
	const int h = c->hidden;
	const int rows = g * t;
	const float scale = 1.0f / sqrtf((float)sl_model_head_dim(c));
	const float *xin = hg;
	if (oc->pre_ln) {
		SL_TRY(sl_layernorm(m->be, m->q, rows, h, hg, h, w->ln1_g, w->ln1_b, oc->ln_eps, m->x, h));
		xin = m->x;
	}
	SL_TRY(layer_linear(m, w, rows, xin, h, w->q_w, w->q_b, h, h, m->qb, h, scale, 0));
	SL_TRY(layer_linear(m, w, rows, xin, h, w->k_w, w->k_b, h, h, m->kb, h, 1.0f, 0));
	SL_TRY(layer_linear(m, w, rows, xin, h, w->v_w, w->v_b, h, h, m->vb, h, 1.0f, 0));
	for (int i = 0; i < nparts; i++)
		SL_TRY(attend(m, kv, l, s0, &parts[i], t, npad, prefill));
	SL_TRY(layer_linear(m, w, rows, m->ab, h, w->o_w, w->o_b, h, h, hg, h, 1.0f, SL_GEMM_ACCUM));
	if (!oc->pre_ln)
		SL_TRY(sl_layernorm(m->be, m->q, rows, h, hg, h, w->ln1_g, w->ln1_b, oc->ln_eps, hg, h));
	return 0;
}

/* The MLP half of decoder layer l for g sequences whose residual rows are
 * hg. */
static int mlp_block(sl_model *m, const sl_layer_w *w, float *hg, int g, int t)
{
	const sl_model_config *c = &m->cfg;
	if (c->family == SL_FAMILY_LLAMA)
		return llama_mlp_block(m, w, hg, g, t);
	const sl_opt_config *oc = &c->opt;
	const int h = c->hidden, f = c->ffn;
	const int rows = g * t;
	const float *xin = hg;
	if (oc->pre_ln) {
		SL_TRY(sl_layernorm(m->be, m->q, rows, h, hg, h, w->ln2_g, w->ln2_b, oc->ln_eps, m->x, h));
		xin = m->x;
	}
	SL_TRY(layer_linear(m, w, rows, xin, h, w->fc1_w, w->fc1_b, f, h, m->fb, f, 1.0f, SL_GEMM_RELU));
	SL_TRY(layer_linear(m, w, rows, m->fb, f, w->fc2_w, w->fc2_b, h, f, hg, h, 1.0f, SL_GEMM_ACCUM));
	if (!oc->pre_ln)
		SL_TRY(sl_layernorm(m->be, m->q, rows, h, hg, h, w->ln2_g, w->ln2_b, oc->ln_eps, hg, h));
	return 0;
}

/*
 * The decoder stack over m->h, in the zig-zag order: each layer's weights
 * are acquired once and serve every micro-batch before the next layer; each
 * step (layer, micro-batch) brings its cache in, prefetching the next
 * step's, and writes back what it changed.  With sep_layer, the attention
 * of every micro-batch runs before the first MLP of the layer (FlexGen's
 * separate attention and MLP layers; the weights still stage a layer at a
 * time).
 */
static int layers(sl_model *m, sl_kv *kv, int t, const int *npad, bool prefill)
{
	const sl_model_config *c = &m->cfg;
	const int nseq = kv->nseq;
	const int gs = kv->gs; /* the placement's micro-batches (a block may be smaller) */
	if (m->plan.p.micro > 0 && m->plan.p.micro < gs)
		return sl_err(SL_EINVAL, "the KV cache was placed for micro-batches of %d, not %d",
			      kv->gs, m->plan.p.micro);
	/* weights streamed by halves run the separate-layer schedule */
	const bool halves = m->w.halves, sep = m->plan.p.sep_layer || halves;
	for (int l = 0; l < c->n_layer; l++) {
		sl_layer_w wv;
		SL_TRY(sl_weights_acquire(m->be, m->q, &m->w, l, halves ? SL_UNIT_ATTN : SL_UNIT_LAYER,
					  &wv));
		for (int s0 = 0; s0 < nseq; s0 += gs) {
			const int g = SL_MIN(gs, nseq - s0);
			int nl = l, ns = s0 + gs;
			if (ns >= nseq) {
				nl = l + 1 < c->n_layer ? l + 1 : -1;
				ns = 0;
			}
			sl_kv_part parts[3];
			int nparts;
			SL_TRY(sl_kv_step_begin(kv, l, s0, g, prefill, nl, ns, SL_MIN(gs, nseq - ns),
						parts, &nparts));
			/* the rows of the step after this one: with sep_layer the
			 * MLPs follow the last attention */
			const int as = sep && ns == 0 ? 0 : nl < 0 ? -1 : ns;
			float *hg;
			SL_TRY(act_begin(m, s0, g, t, as, SL_MIN(gs, nseq - SL_MAX(as, 0)), &hg));
			SL_TRY(attn_block(m, kv, l, &wv, hg, s0, g, t, npad, prefill, parts, nparts));
			SL_TRY(sl_kv_step_end(kv, l, s0, g, prefill, npad, t));
			if (!sep)
				SL_TRY(mlp_block(m, &wv, hg, g, t));
			SL_TRY(act_end(m, s0, g, t, as));
		}
		if (halves) { /* the MLP half loaded while the attention ran */
			SL_TRY(sl_weights_release(m->be, m->q, &m->w, l, SL_UNIT_ATTN));
			SL_TRY(sl_weights_acquire(m->be, m->q, &m->w, l, SL_UNIT_MLP, &wv));
		}
		if (sep)
			for (int s0 = 0; s0 < nseq; s0 += gs) {
				const int g = SL_MIN(gs, nseq - s0);
				int as = s0 + gs < nseq ? s0 + gs : l + 1 < c->n_layer ? 0 : -1;
				float *hg;
				SL_TRY(act_begin(m, s0, g, t, as, SL_MIN(gs, nseq - SL_MAX(as, 0)), &hg));
				SL_TRY(mlp_block(m, &wv, hg, g, t));
				SL_TRY(act_end(m, s0, g, t, as));
			}
		SL_TRY(sl_weights_release(m->be, m->q, &m->w, l, halves ? SL_UNIT_MLP : SL_UNIT_LAYER));
	}
	if (m->act) /* every row back on the host before the head reads them */
		SL_TRY(sl_rstage_flush(m->act, m->q));
	return sl_kv_pass_end(kv);
}

/*
 * Final norm and projection of rows `first, first + stride, ...` (count of
 * them) of m->h into logits rows of m->logits.  The final norm runs in
 * place over the chosen rows only.
 */
static int head(sl_model *m, int count, const float *hrows, int ld_rows)
{
	const sl_model_config *c = &m->cfg;
	const int h = c->hidden, e = c->embed_dim;
	/* gather the rows into x (contiguous), normalise, project */
	float *x = m->x;
	if (c->family == SL_FAMILY_LLAMA)
		SL_TRY(sl_rmsnorm(m->be, m->q, count, h, hrows, ld_rows, m->w.final_ln_g,
				  c->llama.rms_eps, x, h));
	else if (c->opt.final_ln)
		SL_TRY(sl_layernorm(m->be, m->q, count, h, hrows, ld_rows, m->w.final_ln_g,
				    m->w.final_ln_b, c->opt.ln_eps, x, h));
	else
		for (int i = 0; i < count; i++)
			SL_TRY(sl_copy_d2d(m->be, m->q, x + (size_t)i * h, hrows + (size_t)i * ld_rows,
					   (size_t)h * sizeof(float)));
	const float *xe = x;
	if (m->w.project_out) {
		/* qb is free here and holds (count, e) */
		SL_TRY(linear(m, count, x, h, m->w.project_out, NULL, e, h, m->qb, e, 1.0f, 0));
		xe = m->qb;
	}
	return linear(m, count, xe, e, m->w.lm_head, NULL, c->vocab, e, m->logits, c->vocab, 1.0f, 0);
}

/* The head over count residual rows first, first + stride, ... of the
 * block (act_host: gathered from the host into a step buffer first). */
static int head_rows(sl_model *m, int count, size_t first, size_t stride)
{
	const size_t h = (size_t)m->cfg.hidden;
	if (!m->act)
		return head(m, count, m->h + first * h, (int)(stride * h));
	void *rows;
	SL_TRY(sl_rstage_gather(m->act, m->q, (long)first, (size_t)count, stride, &rows));
	return head(m, count, rows, (int)h);
}

int sl_model_prefill(sl_model *m, sl_kv *kv, const int32_t *ids, const int *npad, int t,
		     float *all_logits)
{
	const sl_model_config *c = &m->cfg;
	const int nseq = kv->nseq, rows = nseq * t;
	if (t <= 0)
		return sl_err(SL_EINVAL, "prefill: empty prompts");
	if (t > c->max_pos)
		return sl_err(SL_ERANGE, "prompt of %d tokens is longer than the model's %d positions", t,
			      c->max_pos);
	if (t > (kv->h2o ? kv->scratch_cap : kv->cap))
		return sl_err(SL_EBUDGET, "prompt of %d tokens does not fit the KV cache of %d slots", t,
			      kv->h2o ? kv->scratch_cap : kv->cap);
	SL_TRY(sl_model_check_length(c, t));
	SL_TRY(sl_model_reserve(m, nseq, rows));
	/* OPT's learned positions start at row 2 (padding at 1); the rotary
	 * positions of the LLaMA family at 0 (padding's is never used) */
	const bool opt = c->family == SL_FAMILY_OPT;
	const int pos0 = opt ? SL_OPT_POS_OFFSET : 0;
	for (int s = 0; s < nseq; s++) {
		if (npad[s] < 0 || npad[s] >= t)
			return sl_err(SL_EINVAL, "prefill: sequence %d has no tokens", s);
		for (int j = 0; j < t; j++) {
			const size_t r = (size_t)s * t + j;
			if (j < npad[s]) {
				m->ids_host[r] = c->pad_id;
				m->pos_host[r] = opt ? 1 : 0;
				continue;
			}
			if (ids[r] < 0 || ids[r] >= c->vocab)
				return sl_err(SL_ERANGE, "token id %d is outside the vocabulary (0..%d)",
					      ids[r], c->vocab - 1);
			m->ids_host[r] = ids[r];
			m->pos_host[r] = j - npad[s] + pos0;
		}
	}
	sl_kv_prefill_begin(kv, npad, t);
	if (kv->h2o)
		SL_TRY(sl_memset_dev(m->be, m->q, kv->evicted, 0,
				     sizeof(float) * (size_t)c->n_layer * nseq * c->n_kv_head));
	SL_TRY(embed(m, rows));
	SL_TRY(layers(m, kv, t, npad, true));
	sl_kv_prefill_end(kv, npad, t);
	if (all_logits) {
		const size_t v = (size_t)c->vocab;
		for (int r0 = 0; r0 < rows; r0 += m->max_seq) {
			const int cnt = SL_MIN(m->max_seq, rows - r0);
			SL_TRY(head_rows(m, cnt, (size_t)r0, 1));
			SL_TRY(sl_copy_d2h(m->be, m->q, all_logits + (size_t)r0 * v, m->logits,
					   (size_t)cnt * v * sizeof(float)));
		}
		SL_TRY(sl_queue_sync(m->be, m->q));
	}
	/* the last row of each sequence is real (left padding) */
	return head_rows(m, nseq, (size_t)(t - 1), (size_t)t);
}

int sl_model_decode(sl_model *m, sl_kv *kv, const int32_t *ids)
{
	const sl_model_config *c = &m->cfg;
	const int nseq = kv->nseq;
	SL_TRY(sl_model_reserve(m, nseq, nseq));
	for (int s = 0; s < nseq; s++) {
		if (ids[s] < 0 || ids[s] >= c->vocab)
			return sl_err(SL_ERANGE, "token id %d is outside the vocabulary (0..%d)", ids[s],
				      c->vocab - 1);
		if (kv->pos[s] >= c->max_pos)
			return sl_err(SL_ERANGE, "sequence %d reached the model's %d positions", s,
				      c->max_pos);
		if (kv->len[s] >= kv->cap)
			return sl_err(SL_EBUDGET, "sequence %d filled its %d KV cache slots", s, kv->cap);
		SL_TRY(sl_model_check_length(c, kv->pos[s] + 1));
		m->ids_host[s] = ids[s];
		m->pos_host[s] = kv->pos[s] + (c->family == SL_FAMILY_OPT ? SL_OPT_POS_OFFSET : 0);
	}
	SL_TRY(embed(m, nseq));
	SL_TRY(layers(m, kv, 1, NULL, false));
	SL_TRY(sl_kv_advance(kv));
	return head_rows(m, nseq, 0, 1);
}

void sl_model_stats_reset(sl_model *m)
{
	memset(&m->w.stats, 0, sizeof m->w.stats);
	const size_t kv_disk = m->kv_stats.disk_bytes;
	memset(&m->kv_stats, 0, sizeof m->kv_stats);
	sl_rstage_reset_stats(m->act);
	m->kv_stats.disk_bytes = kv_disk;
	memset(&m->base, 0, sizeof m->base);
	if (m->disk) {
		sl_disk_stats d;
		sl_disk_get_stats(m->disk, &d);
		m->base.disk_busy_s = d.busy_s;
		m->base.disk_read = d.bytes_read;
		m->base.disk_written = d.bytes_written;
	}
}

void sl_model_stats(sl_model *m, double wall_s, sl_offload_stats *out)
{
	memset(out, 0, sizeof *out);
	const sl_kv_stats *k = &m->kv_stats;
	double busy = k->disk_busy_s;
	out->disk_read_bytes = k->disk_read_bytes;
	out->disk_write_bytes = k->disk_write_bytes;
	if (m->disk) {
		sl_disk_stats d;
		sl_disk_get_stats(m->disk, &d);
		busy += d.busy_s - m->base.disk_busy_s;
		out->disk_read_bytes += d.bytes_read - m->base.disk_read;
		out->disk_write_bytes += d.bytes_written - m->base.disk_written;
		out->peak_disk += sl_disk_capacity(m->disk);
	}
	out->peak_disk += k->disk_bytes;
	out->wall_s = wall_s;
	out->stall_s = SL_MIN(wall_s, m->w.stats.stall_s + k->stall_s);
	out->compute_s = wall_s - out->stall_s;
	out->io_s = SL_MIN(wall_s, busy);
	out->disk_read_gbps = out->io_s > 0 ? out->disk_read_bytes / out->io_s / 1e9 : 0;
	const sl_rstage_stats a = sl_rstage_get_stats(m->act);
	out->h2d_bytes = m->w.stats.h2d_bytes + k->h2d_bytes + a.h2d_bytes;
	out->d2h_bytes = k->d2h_bytes + a.d2h_bytes;
	out->peak_device = m->be->dev_peak;
	out->peak_host = m->be->host_peak;
}

int sl_model_argmax(sl_model *m, int nseq, int32_t *out)
{
	return sl_argmax(m->be, m->q, nseq, m->cfg.vocab, m->logits, m->cfg.vocab, out);
}

int sl_model_nonfinite_err(int line, const char *id, int s, int step, const char *what)
{
	char who[160];
	if (line > 0)
		snprintf(who, sizeof who, "input line %d (id %.100s)", line, id ? id : "?");
	else
		snprintf(who, sizeof who, "sequence %d of the block", s);
	return sl_err(SL_ERANGE,
		      "%s: the logits at step %d (%s %d) are not finite (NaN or infinity): the model's arithmetic overflowed",
		      who, step, what, step + 1);
}

int sl_model_logits(sl_model *m, int nseq, float *out)
{
	SL_TRY(sl_copy_d2h(m->be, m->q, out, m->logits,
			   (size_t)nseq * m->cfg.vocab * sizeof(float)));
	return sl_queue_sync(m->be, m->q);
}
