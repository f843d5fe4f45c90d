/*
 * kvcache.c - the logical KV cache: allocation (dense or H2O), the device
 * tier's blocks, which rows are in use and which a step changed (H2O's new
 * slot per head from the positions), over the tiers of offload/kv_tiers.h
 * that hold and move the rest; the per-step loads and write-backs of the
 * zig-zag schedule (kvcache.h says how).  It knows the model only through
 * the cache's environment (sl_kv_env).
 */
#include "kvcache.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SL_KV_MAX_HEADS 256 /* OPT-175B has 96 */

/* One sequence's K (or V) of one layer (cap slots of slot_bytes: fp16,
 * fp32 or compressed), and (H2O) its scores (or positions): the tiers'
 * seq_bytes and state_bytes. */
static size_t seq_bytes(int cap, size_t slot_bytes)
{
	return (size_t)cap * slot_bytes;
}

static size_t state_bytes(const sl_model_config *c, int cap, bool h2o)
{
	return h2o ? (size_t)c->n_kv_head * cap * 4 : 0;
}

void sl_kv_tier_sizes(const sl_model_config *c, int nseq, int gs, int cap, size_t slot_bytes, bool h2o,
		      double gpu_percent, double cpu_percent, bool dev_is_host, sl_kv_sizes *out)
{
	sl_kvt_sizes(c->n_layer, nseq, gs, seq_bytes(cap, slot_bytes), state_bytes(c, cap, h2o),
		     gpu_percent, cpu_percent, dev_is_host, out);
}

size_t sl_kv_ccc_bytes(const sl_model_config *c, int gs)
{
	return 4 * (size_t)gs * sl_model_q_dim(c) * sizeof(float) + (size_t)gs * c->n_kv_head * 4;
}

/* ---- allocation ------------------------------------------------------- */

/* cpu_cache_compute where the device is not host memory: pinned q, k_new,
 * v_new, out rows of a micro-batch, and its H2O evicted sums (in the
 * tiers' work buffers), for attention on a CPU backend beside the device. */
struct sl_kv_ccc {
	float *hq, *hk, *hv, *ho, *hevicted;
	sl_backend *be;
	sl_queue *q;
};

static void tiers_free(sl_kv *kv)
{
	sl_kv_ccc *C = kv->ccc;
	if (C) {
		if (C->q)
			sl_queue_free(C->be, C->q);
		sl_backend_free(C->be);
		free(C);
		kv->ccc = NULL;
	}
	sl_kvt_free(kv->tiers);
	kv->tiers = NULL;
}

static int tiers_create(sl_kv *kv, int nhost)
{
	const sl_kv_env *E = &kv->env;
	const sl_model_config *c = E->cfg;
	const bool ccc = E->plan->p.cpu_cache_compute && !E->be->ops->dev_is_host && nhost > 0;
	const char *stem = strrchr(c->name, '/') ? strrchr(c->name, '/') + 1 : c->name;
	sl_kvt_params tp = { .be = E->be, .n_layer = c->n_layer, .nseq = kv->nseq, .gs = kv->gs,
			     .gpu_percent = E->plan->p.cache_gpu, .cpu_percent = E->plan->p.cache_cpu,
			     .seq_bytes = seq_bytes(kv->cap, kv->slot_bytes),
			     .state_bytes = state_bytes(c, kv->cap, kv->h2o),
			     /* a compressed head row is two ranges (new_ranges) */
			     .max_ranges = (kv->q4 ? 2 : 1) * c->n_kv_head,
			     .work_bytes = ccc ? sl_kv_ccc_bytes(c, kv->gs) : 0,
			     .work_what = "cpu_cache_compute buffers", .offload_dir = E->offload_dir,
			     .store_name = stem, .bind_io = E->bind_io, .io_node = E->io_node,
			     .stats = E->stats };
	SL_TRY(sl_kvt_create(&tp, &kv->tiers));
	if (!ccc)
		return 0;
	sl_kv_ccc *C = calloc(1, sizeof *C);
	if (!C)
		return sl_err(SL_ENOMEM, "out of memory");
	kv->ccc = C;
	const size_t rows = (size_t)kv->gs * sl_model_q_dim(c) * sizeof(float);
	char *q = kv->tiers->work.p;
	C->hq = (float *)q;
	C->hk = (float *)(q + rows);
	C->hv = (float *)(q + 2 * rows);
	C->ho = (float *)(q + 3 * rows);
	C->hevicted = (float *)(q + 4 * rows);
	/* with the device backend's threads (--threads) */
	SL_TRY(sl_backend_create("cpu", E->be->nthreads, &C->be));
	return sl_queue_create(C->be, &C->q);
}

/* A cache of cap slots (h2o: with scores and positions); extra more device
 * bytes at the end of its block (H2O's scratch), so that the device part
 * is one allocation: [layer][K|V] of the device-tier sequences, then under
 * H2O [layer][scores|positions] of them, then the extra. */
static int kv_create(const sl_kv_env *env, int nseq, int cap, bool h2o, size_t extra, sl_kv **out)
{
	*out = NULL;
	const sl_model_config *c = env->cfg;
	if (nseq <= 0 || cap <= 0)
		return sl_err(SL_EINVAL, "kv cache: %d sequences of %d slots", nseq, cap);
	sl_kv *kv = calloc(1, sizeof *kv);
	if (!kv)
		return sl_err(SL_ENOMEM, "out of memory");
	kv->env = *env;
	kv->nseq = nseq;
	kv->cap = cap;
	kv->n_layer = c->n_layer;
	kv->f32 = kv->env.plan->p.kv_f32;
	kv->q4 = kv->env.plan->p.kv_q4;
	kv->slot_bytes = sl_plan_kv_slot_bytes(c, &kv->env.plan->p);
	kv->h2o = h2o;
	kv->gs = sl_kv_group(kv->env.plan->p.micro, nseq);
	kv->k = calloc((size_t)c->n_layer, sizeof *kv->k);
	kv->v = calloc((size_t)c->n_layer, sizeof *kv->v);
	kv->score = calloc((size_t)c->n_layer, sizeof *kv->score);
	kv->pos_slot = calloc((size_t)c->n_layer, sizeof *kv->pos_slot);
	kv->len = calloc((size_t)nseq, sizeof *kv->len);
	kv->pos = calloc((size_t)nseq, sizeof *kv->pos);
	kv->undone = calloc((size_t)nseq, sizeof *kv->undone);
	kv->fill = calloc((size_t)nseq, sizeof *kv->fill);
	if (!kv->k || !kv->v || !kv->score || !kv->pos_slot || !kv->len || !kv->pos || !kv->undone ||
	    !kv->fill) {
		sl_kv_free(kv);
		return sl_err(SL_ENOMEM, "out of memory");
	}
	const sl_kvt_counts cnt = sl_kvt_counts_of(nseq, kv->gs, kv->env.plan->p.cache_gpu,
					     kv->env.plan->p.cache_cpu);
	const int ndev = cnt.dev;
	const size_t per = (size_t)ndev * cap * kv->slot_bytes;
	const size_t sper = h2o ? (size_t)ndev * c->n_kv_head * cap * 4 : 0;
	const size_t L = (size_t)c->n_layer;
	const size_t bytes = 2 * (per + sper) * L + extra;
	if (bytes) {
		int rc = sl_buf_alloc(kv->env.be, SL_MEM_DEVICE, bytes, h2o ? "KV cache (H2O)" : "KV cache",
				      &kv->block);
		if (rc < 0) {
			sl_kv_free(kv);
			return rc;
		}
	}
	char *b = kv->block.p;
	for (size_t l = 0; l < L; l++) {
		kv->k[l] = b + 2 * l * per;
		kv->v[l] = b + (2 * l + 1) * per;
		if (h2o) {
			kv->score[l] = (float *)(b + 2 * L * per + 2 * l * sper);
			kv->pos_slot[l] = (int32_t *)(b + 2 * L * per + (2 * l + 1) * sper);
		}
	}
	if (ndev < nseq) {
		int rc = tiers_create(kv, cnt.host);
		if (rc < 0) {
			sl_kv_free(kv);
			return rc;
		}
	}
	*out = kv;
	return 0;
}

int sl_kv_create(const sl_kv_env *env, int nseq, int cap, sl_kv **out)
{
	return kv_create(env, nseq, cap, false, 0, out);
}

/* Slots of an H2O cache for prompts of up to max_prompt tokens. */
int sl_kv_h2o_slots(double hh, double rr, int max_prompt, int max_len)
{
	return SL_MIN(max_len, (int)floor(hh * max_prompt) + (int)floor(rr * max_prompt) + 1);
}

size_t sl_kv_h2o_extra(const sl_model_config *c, int nseq, int gs, int max_prompt, size_t slot_bytes)
{
	const size_t sc = (size_t)gs * c->n_kv_head * max_prompt; /* one micro-batch */
	return 2 * (size_t)gs * max_prompt * slot_bytes + sc * 4 +
	       (size_t)c->n_layer * nseq * c->n_kv_head * 4 + 1024;
}

int sl_kv_h2o_budget(const sl_kv *kv, int prompt, int *heavy, int *recent)
{
	*heavy = kv->fixed_heavy >= 0 ? kv->fixed_heavy : (int)floor(kv->hh_ratio * prompt);
	*recent = kv->fixed_recent >= 0 ? kv->fixed_recent : (int)floor(kv->recent_ratio * prompt);
	return *heavy + *recent;
}

int sl_kv_make(const sl_kv_env *env, int nseq, int max_prompt, int max_len, sl_kv **out)
{
	*out = NULL;
	SL_TRY(sl_plan_check_job(env->plan, nseq, max_prompt, max_len));
	if (!env->plan->h2o)
		return sl_kv_create(env, nseq, max_len, out);
	if (!env->be->ops->h2o_compact || !env->be->ops->h2o_evict)
		return sl_err(SL_EUNSUPPORTED, "the %s backend has no H2O cache operations",
			      env->be->ops->name);
	sl_kv probe = { .hh_ratio = env->plan->p.hh, .recent_ratio = env->plan->p.rr,
			.fixed_heavy = env->plan->p.fixed_heavy, .fixed_recent = env->plan->p.fixed_recent };
	int heavy, recent;
	/* a budget of 0 is allowed: each step then sees only its own token */
	int b = sl_kv_h2o_budget(&probe, max_prompt, &heavy, &recent);
	const int cap = SL_MIN(max_len, b + 1);
	const int gs = sl_kv_group(env->plan->p.micro, nseq);
	const sl_model_config *c = env->cfg;
	const size_t es = sl_plan_kv_slot_bytes(c, &env->plan->p); /* per token */
	const size_t extra = sl_kv_h2o_extra(c, nseq, gs, max_prompt, es);
	SL_TRY(kv_create(env, nseq, cap, true, extra, out));
	sl_kv *kv = *out;
	kv->hh_ratio = kv->env.plan->p.hh;
	kv->recent_ratio = kv->env.plan->p.rr;
	kv->fixed_heavy = kv->env.plan->p.fixed_heavy;
	kv->fixed_recent = kv->env.plan->p.fixed_recent;
	kv->scratch_cap = max_prompt;
	kv->heavy = calloc((size_t)nseq, sizeof *kv->heavy);
	kv->recent = calloc((size_t)nseq, sizeof *kv->recent);
	if (!kv->heavy || !kv->recent) {
		sl_kv_free(kv);
		*out = NULL;
		return sl_err(SL_ENOMEM, "out of memory");
	}
	/* after the tiers' part of the device block: the scratch */
	const size_t sc = (size_t)gs * c->n_kv_head * max_prompt;
	char *p = (char *)kv->block.p + (kv->block.bytes - extra);
	kv->scratch_k = p;
	p += (size_t)gs * max_prompt * es;
	kv->scratch_v = p;
	p += (size_t)gs * max_prompt * es;
	kv->scratch_score = (float *)p;
	p += sc * 4;
	kv->evicted = (float *)p;
	return sl_memset_dev(kv->env.be, kv->env.q, kv->evicted, 0,
			(size_t)c->n_layer * nseq * c->n_kv_head * 4);
}

void sl_kv_free(sl_kv *kv)
{
	if (!kv)
		return;
	tiers_free(kv);
	sl_buf_free(kv->env.be, &kv->block);
	free(kv->score);
	free(kv->pos_slot);
	free(kv->heavy);
	free(kv->recent);
	free(kv->k);
	free(kv->v);
	free(kv->len);
	free(kv->pos);
	free(kv->undone);
	free(kv->fill);
	free(kv);
}

/* ---- the counters ----------------------------------------------------- */

void sl_kv_prefill_begin(sl_kv *kv, const int *npad, int t)
{
	for (int s = 0; s < kv->nseq; s++) {
		kv->len[s] = kv->pos[s] = 0;
		kv->undone[s] = 0;
		if (kv->h2o) { /* the tokens to compact, and the budget they keep */
			kv->len[s] = t - npad[s];
			sl_kv_h2o_budget(kv, t - npad[s], &kv->heavy[s], &kv->recent[s]);
		}
	}
	kv->steps = 0;
}

void sl_kv_prefill_end(sl_kv *kv, const int *npad, int t)
{
	for (int s = 0; s < kv->nseq; s++) {
		kv->len[s] = kv->pos[s] = t - npad[s];
		if (kv->h2o)
			kv->len[s] = SL_MIN(kv->len[s], kv->heavy[s] + kv->recent[s]);
	}
}

int sl_kv_advance(sl_kv *kv)
{
	int late = -1;
	for (int s = 0; s < kv->nseq; s++) {
		kv->len[s]++;
		if (kv->h2o) /* one token was evicted when over budget */
			kv->len[s] = SL_MIN(kv->len[s], kv->heavy[s] + kv->recent[s]);
		kv->pos[s]++;
		if (late < 0 && kv->undone[s] && kv->undone[s] != kv->steps)
			late = s;
	}
	kv->steps++;
	if (late >= 0)
		return sl_err(SL_EINVAL,
			      "internal error: sequence %d of the block was rolled back after decode step %d and then ran step %d without a rollback (a frozen sequence stays frozen)",
			      late, kv->undone[late], kv->steps);
	return 0;
}

/* A write-back of the last pass not finished (it reads len and pos). */
static bool pass_pending(const sl_kv *kv)
{
	const sl_kv_tiers *T = kv->tiers;
	for (int i = 0; T && i < SL_KVT_NSTAGE; i++)
		if (T->st[i].pend != SL_KVT_PEND_NONE)
			return true;
	return false;
}

int sl_kv_rollback(sl_kv *kv, int s)
{
	if (s < 0 || s >= kv->nseq)
		return sl_err(SL_EINVAL, "internal error: rollback of sequence %d in a block of %d", s,
			      kv->nseq);
	if (kv->steps == 0)
		return sl_err(SL_EINVAL, "internal error: rollback of sequence %d with no decode step since the prefill",
			      s);
	if (pass_pending(kv))
		return sl_err(SL_EINVAL, "internal error: rollback of sequence %d while a pass's write-back is pending",
			      s);
	if (kv->undone[s] == kv->steps)
		return sl_err(SL_EINVAL, "internal error: sequence %d rolled back twice after decode step %d",
			      s, kv->steps);
	if (kv->undone[s] && kv->undone[s] != kv->steps - 1)
		return sl_err(SL_EINVAL,
			      "internal error: sequence %d, rolled back after decode step %d, ran on without a rollback",
			      s, kv->undone[s]);
	if (!kv->h2o)
		kv->len[s]--;
	kv->pos[s]--;
	kv->undone[s] = kv->steps;
	return 0;
}

/* ---- the schedule ----------------------------------------------------- */

/* Rows in use by sequence s before this step's token (decode), or kept by
 * the prefill. */
static int rows_of(const sl_kv *kv, int s, bool prefill, const int *npad, int t)
{
	if (!prefill)
		return kv->len[s];
	if (!kv->h2o)
		return t - npad[s];
	return SL_MIN(kv->len[s], kv->heavy[s] + kv->recent[s]);
}

/* Where stage st holds its host (disk) part of n sequences, the group
 * [K x n][V x n][S x n][P x n]. */
static void part_in_stage(sl_kv_part *q, const sl_kv_tiers *T, const sl_kvt_stage *st, int n,
			  bool disk)
{
	char *(*at)(const sl_kv_tiers *, const sl_kvt_stage *, int, int, size_t) =
		disk ? sl_kvt_stage_disk : sl_kvt_stage_host;
	q->k = at(T, st, n, SL_KVT_K, 0);
	q->v = at(T, st, n, SL_KVT_V, 0);
	q->score = T->ss ? (float *)at(T, st, n, SL_KVT_S, 0) : NULL;
	q->pos = T->ss ? (int32_t *)at(T, st, n, SL_KVT_P, 0) : NULL;
}

/* The parts of micro-batch [s0, s0 + g) and where each one's K and V (and
 * H2O state) are for this step (stage: the staging area, may be NULL when
 * everything is on the device). */
static int parts_of(sl_kv *kv, int l, int s0, int g, bool prefill,
		    const sl_kvt_stage *stage, sl_kv_part *parts)
{
	const sl_kv_tiers *T = kv->tiers;
	const size_t sb = (size_t)kv->cap * kv->slot_bytes;
	const size_t sn = (size_t)kv->env.cfg->n_kv_head * kv->cap; /* state entries per sequence */
	/* the device-tier sequences from device index di */
	size_t di = (size_t)s0;
	int ndev = g;
	sl_kvt_split b = { 0 }, p = { .dev = g };
	const int mb = s0 / kv->gs;
	if (T) {
		sl_kvt_mb_split(T, mb, g, &b, &p);
		di = (size_t)mb * T->full.dev;
		ndev = p.dev;
	}
	int n = 0;
	if (ndev) {
		parts[n++] = (sl_kv_part){ .seq = s0, .count = ndev, .k = (char *)kv->k[l] + di * sb,
					   .v = (char *)kv->v[l] + di * sb,
					   .score = kv->h2o ? kv->score[l] + di * sn : NULL,
					   .pos = kv->h2o ? kv->pos_slot[l] + di * sn : NULL,
					   .tier = SL_TIER_DEVICE };
	}
	if (p.host) {
		sl_kv_part *q = &parts[n++];
		q->seq = s0 + p.dev;
		q->count = p.host;
		q->tier = SL_TIER_HOST;
		if (kv->env.plan->p.cpu_cache_compute && !prefill) { /* in place, at home */
			const size_t hi = (size_t)mb * T->full.host;
			q->k = sl_kvt_home(T, l, hi, SL_KVT_K);
			q->v = sl_kvt_home(T, l, hi, SL_KVT_V);
			q->score = T->ss ? (float *)sl_kvt_home(T, l, hi, SL_KVT_S) : NULL;
			q->pos = T->ss ? (int32_t *)sl_kvt_home(T, l, hi, SL_KVT_P) : NULL;
		} else {
			part_in_stage(q, T, stage, b.host, false);
		}
	}
	if (p.disk) {
		sl_kv_part *q = &parts[n++];
		q->seq = s0 + p.dev + p.host;
		q->count = p.disk;
		q->tier = SL_TIER_DISK;
		part_in_stage(q, T, stage, b.disk, true);
	}
	return n;
}

static int kv_flush(sl_kv *kv, sl_kvt_stage *st);

/* Issue the loads of step (l, s0) into stage st. */
static int stage_load(sl_kv *kv, sl_kvt_stage *st, int l, int s0, int g, bool prefill)
{
	sl_backend *be = kv->env.be;
	sl_kv_tiers *T = kv->tiers;
	/* the stage's last user: its write-back finished, its disk writes
	 * (which read from it) done */
	SL_TRY(kv_flush(kv, st));
	SL_TRY(sl_kvt_wait_writes(T, st));
	st->l = l;
	st->s0 = s0;
	st->prefill = prefill;
	if (prefill) /* an empty cache: nothing to load */
		return 0;
	const int mb = s0 / kv->gs;
	sl_kvt_split b, p;
	sl_kvt_mb_split(T, mb, g, &b, &p);
	const size_t slot_bytes = T->sb / kv->cap; /* every head's row of a token */
	SL_TRY(sl_queue_wait(be, T->cq, st->done_ev));
	if (p.host && !kv->env.plan->p.cpu_cache_compute) {
		const size_t hi0 = (size_t)mb * T->full.host;
		for (int j = 0; j < p.host; j++) {
			const int s = s0 + p.dev + j;
			for (int v = SL_KVT_K; v <= SL_KVT_V; v++)
				SL_TRY(sl_kvt_copy_rows(T, true, sl_kvt_stage_host(T, st, b.host, v, j),
							sl_kvt_home(T, l, hi0 + j, v), slot_bytes,
							kv->len[s]));
		}
		/* H2O: the scores and positions whole, one range each */
		for (int x = SL_KVT_S; T->ss && x <= SL_KVT_P; x++)
			SL_TRY(sl_kvt_copy_rows(T, true, sl_kvt_stage_host(T, st, b.host, x, 0),
						sl_kvt_home(T, l, hi0, x), T->ss, p.host));
	}
	if (p.disk) { /* each sequence's rows in use (as the host part's copies) */
		size_t *fill = kv->fill;
		for (int j = 0; j < b.disk; j++)
			fill[j] = j < p.disk ? (size_t)kv->len[s0 + p.dev + p.host + j] * slot_bytes : T->sb;
		SL_TRY(sl_kvt_load_disk(T, st, l, mb, b.disk, fill));
	}
	return 0;
}

int sl_kv_step_begin(sl_kv *kv, int l, int s0, int g, bool prefill, int next_l,
		     int next_s0, int next_g, sl_kv_part *parts, int *nparts)
{
	sl_kv_tiers *T = kv->tiers;
	if (!T) {
		*nparts = parts_of(kv, l, s0, g, prefill, NULL, parts);
		return 0;
	}
	if (l == 0 && s0 == 0) /* a new pass: nothing is prefetched yet */
		for (int i = 0; i < SL_KVT_NSTAGE; i++)
			T->st[i].l = -1;
	sl_kvt_stage *st = sl_kvt_holding(T, l, s0);
	if (!st) { /* not prefetched: load now */
		T->cur = (T->cur + 1) % SL_KVT_NSTAGE;
		st = &T->st[T->cur];
		double t0 = sl_now();
		SL_TRY(stage_load(kv, st, l, s0, g, prefill));
		kv->env.stats->stall_s += sl_now() - t0;
	} else {
		T->cur = (int)(st - T->st);
	}
	if (kv->env.plan->p.overlap && next_l >= 0 && !sl_kvt_holding(T, next_l, next_s0))
		SL_TRY(stage_load(kv, &T->st[(T->cur + 1) % SL_KVT_NSTAGE], next_l, next_s0, next_g,
				  prefill));
	SL_TRY(sl_kvt_ready(T, st, kv->env.q));
	*nparts = parts_of(kv, l, s0, g, prefill, st, parts);
	return 0;
}

/* The slot each head of sequence s put this step's token in: slot len[s],
 * unless H2O (pos: the sequence's positions, (n_kv_head, cap)) moved it into
 * an evicted token's slot (or evicted it). */
static int new_slot(const sl_kv *kv, const int32_t *pos, int s, int h)
{
	if (!kv->h2o)
		return kv->len[s];
	const int32_t *p = pos + (size_t)h * kv->cap;
	for (int j = 0; j < kv->cap; j++)
		if (p[j] == kv->pos[s])
			return j;
	return -1;
}

/* The byte ranges of sequence s's block (K or V) that a decode step wrote:
 * the new token's row, one piece per head where H2O put it in different
 * slots, adjacent pieces merged (dense: one range).  A head's row is hrow
 * bytes at (slot * nh + h) * hrow; in a compressed cache (q4) it is two
 * pieces, its codes and its {mn16, scale16} pairs (backend.h), the codes
 * of every head first so that a dense step's pieces merge into the one
 * slot.  At most nh (2 nh compressed). */
static int new_ranges(const sl_kv *kv, const int32_t *pos, int s, int nh, size_t hrow,
		      size_t *off, size_t *len)
{
	const int hd = sl_model_head_dim(kv->env.cfg);
	const size_t ng = sl_q4_groups((size_t)hd), cb = ng * SL_Q4_CODE_BYTES,
		     mb = ng * SL_Q4_META_BYTES;
	int n = 0;
	for (int part = 0; part < (kv->q4 ? 2 : 1); part++)
		for (int h = 0; h < nh; h++) {
			const int slot = new_slot(kv, pos, s, h);
			if (slot < 0)
				continue;
			size_t o = ((size_t)slot * nh + h) * hrow, l = hrow;
			if (kv->q4) {
				o = (size_t)slot * kv->slot_bytes +
				    (part ? (size_t)nh * cb + (size_t)h * mb : (size_t)h * cb);
				l = part ? mb : cb;
			}
			if (n && off[n - 1] + len[n - 1] == o) {
				len[n - 1] += l;
			} else {
				off[n] = o;
				len[n++] = l;
			}
		}
	return n;
}

/* The host part's rows a decode step changed, back to their home: the
 * new token's row of each sequence (dense: slot len; H2O: where hpos, the
 * part's positions on the host, say each head put it). */
static int host_rows_back(sl_kv *kv, sl_kvt_stage *st, const sl_kvt_split *b,
			  const sl_kvt_split *p, const int32_t *hpos)
{
	sl_backend *be = kv->env.be;
	sl_kv_tiers *T = kv->tiers;
	const int nh = kv->env.cfg->n_kv_head, l = st->l, s0 = st->s0;
	const size_t hrow = T->sb / kv->cap / nh, sn = (size_t)nh * kv->cap;
	const size_t hi0 = (size_t)st->pmb * T->full.host;
	size_t roff[2 * SL_KV_MAX_HEADS], rlen[2 * SL_KV_MAX_HEADS];
	SL_TRY(sl_queue_wait(be, T->cq, st->done_ev));
	for (int j = 0; j < p->host; j++) {
		const int s = s0 + p->dev + j;
		const int n = new_ranges(kv, hpos ? hpos + j * sn : NULL, s, nh, hrow, roff, rlen);
		for (int v = SL_KVT_K; v <= SL_KVT_V; v++) {
			char *home = sl_kvt_home(T, l, hi0 + j, v);
			char *dev = sl_kvt_stage_host(T, st, b->host, v, j);
			for (int r = 0; r < n; r++)
				SL_TRY(sl_kvt_copy(T, false, home + roff[r], dev + roff[r], rlen[r]));
		}
	}
	/* H2O: every kept score changed; the scores and positions whole */
	for (int x = SL_KVT_S; T->ss && x <= SL_KVT_P; x++)
		SL_TRY(sl_kvt_copy_rows(T, false, sl_kvt_home(T, l, hi0, x),
					sl_kvt_stage_host(T, st, b->host, x, 0), T->ss, p->host));
	return 0;
}

/* The disk part's pages a decode step changed (dpos: the part's H2O
 * positions on the host, or NULL), to disk_pages. */
static int disk_rows_back(sl_kv *kv, sl_kvt_stage *st, const sl_kvt_split *b,
			  const sl_kvt_split *p, const int32_t *dpos)
{
	sl_kv_tiers *T = kv->tiers;
	const int nh = kv->env.cfg->n_kv_head, s0 = st->s0;
	const size_t hrow = T->sb / kv->cap / nh, sn = (size_t)nh * kv->cap;
	size_t roff[2 * SL_KV_MAX_HEADS], rlen[2 * SL_KV_MAX_HEADS];
	int cnt = 0;
	for (int j = 0; j < p->disk; j++) {
		const int s = s0 + p->dev + p->host + j;
		const int n = new_ranges(kv, dpos ? dpos + j * sn : NULL, s, nh, hrow, roff, rlen);
		for (int v = SL_KVT_K; v <= SL_KVT_V; v++)
			for (int r = 0; r < n; r++) {
				st->offs[cnt] =
					sl_kvt_grp_off((size_t)b->disk, T->sb, T->ss, v, (size_t)j) + roff[r];
				st->lens[cnt++] = rlen[r];
			}
	}
	for (int x = SL_KVT_S; T->ss && x <= SL_KVT_P; x++) {
		st->offs[cnt] = sl_kvt_grp_off((size_t)b->disk, T->sb, T->ss, x, 0);
		st->lens[cnt++] = (size_t)p->disk * T->ss;
	}
	return sl_kvt_disk_pages(T, st, cnt);
}

/* Finish what stage st's step left (see sl_kvt_stage.pend): wait for its
 * positions or pages to reach the host, then issue the rest. */
static int kv_flush(sl_kv *kv, sl_kvt_stage *st)
{
	sl_backend *be = kv->env.be;
	const sl_backend_ops *o = be->ops;
	sl_kv_tiers *T = kv->tiers;
	if (st->pend == SL_KVT_PEND_POS) {
		st->pend = SL_KVT_PEND_NONE;
		sl_kvt_split b, p;
		sl_kvt_mb_split(T, st->pmb, st->pg, &b, &p);
		const bool host_part = p.host && !kv->env.plan->p.cpu_cache_compute;
		const size_t sn = (size_t)kv->env.cfg->n_kv_head * kv->cap;
		const int32_t *hpos, *dpos;
		SL_TRY(sl_event_sync(be, o->dev_is_host ? st->done_ev : st->wb_ev));
		if (o->dev_is_host) { /* in the stage */
			hpos = (const int32_t *)sl_kvt_stage_host(T, st, b.host, SL_KVT_P, 0);
			dpos = (const int32_t *)sl_kvt_stage_disk(T, st, b.disk, SL_KVT_P, 0);
		} else { /* read back by step_end */
			hpos = T->readback.p;
			dpos = (int32_t *)T->readback.p + (host_part ? (size_t)p.host * sn : 0);
		}
		if (host_part)
			SL_TRY(host_rows_back(kv, st, &b, &p, hpos));
		if (p.disk)
			SL_TRY(disk_rows_back(kv, st, &b, &p, dpos));
	}
	if (st->pend == SL_KVT_PEND_DISK)
		SL_TRY(sl_kvt_flush_disk(T, st));
	return 0;
}

int sl_kv_step_end(sl_kv *kv, int l, int s0, int g, bool prefill, const int *npad,
		   int t)
{
	sl_kv_tiers *T = kv->tiers;
	if (!T)
		return 0;
	sl_backend *be = kv->env.be;
	const sl_backend_ops *o = be->ops;
	sl_kvt_stage *st = &T->st[T->cur];
	SL_TRY(sl_event_record(be, st->done_ev, kv->env.q));
	/* the steps before: their compute is done or nearly, while this
	 * step's is queued behind it */
	for (int i = 0; i < SL_KVT_NSTAGE; i++)
		if (&T->st[i] != st)
			SL_TRY(kv_flush(kv, &T->st[i]));
	const int mb = s0 / kv->gs, nh = kv->env.cfg->n_kv_head;
	sl_kvt_split b, p;
	sl_kvt_mb_split(T, mb, g, &b, &p);
	if (nh > SL_KV_MAX_HEADS)
		return sl_err(SL_EUNSUPPORTED, "%d attention heads (at most %d)", nh, SL_KV_MAX_HEADS);
	const bool host_part = p.host && !(kv->env.plan->p.cpu_cache_compute && !prefill);
	if (!host_part && !p.disk)
		return 0;
	st->pmb = mb;
	st->pg = g;
	if (kv->h2o && !prefill) {
		/* which rows changed is in the positions: on their way to the
		 * host (the device's copy), or read in place after done_ev */
		st->pend = SL_KVT_PEND_POS;
		if (o->dev_is_host)
			return 0;
		const size_t sn = (size_t)nh * kv->cap;
		int32_t *ph = T->readback.p, *pd = ph + (host_part ? (size_t)p.host * sn : 0);
		SL_TRY(sl_queue_wait(be, T->cq, st->done_ev));
		if (host_part)
			SL_TRY(sl_kvt_copy_rows(T, false, ph, sl_kvt_stage_host(T, st, b.host, SL_KVT_P, 0),
						T->ss, p.host));
		if (p.disk)
			SL_TRY(sl_kvt_copy_rows(T, false, pd, sl_kvt_stage_disk(T, st, b.disk, SL_KVT_P, 0),
						T->ss, p.disk));
		return sl_event_record(be, st->wb_ev, T->cq);
	}
	if (host_part && !prefill)
		SL_TRY(host_rows_back(kv, st, &b, &p, NULL));
	if (host_part && prefill) { /* the rows kept */
		const size_t slot_bytes = T->sb / kv->cap, hi0 = (size_t)mb * T->full.host;
		SL_TRY(sl_queue_wait(be, T->cq, st->done_ev));
		for (int j = 0; j < p.host; j++) {
			const int s = s0 + p.dev + j;
			for (int v = SL_KVT_K; v <= SL_KVT_V; v++)
				SL_TRY(sl_kvt_copy_rows(T, false, sl_kvt_home(T, l, hi0 + j, v),
							sl_kvt_stage_host(T, st, b.host, v, j), slot_bytes,
							rows_of(kv, s, true, npad, t)));
		}
		for (int x = SL_KVT_S; T->ss && x <= SL_KVT_P; x++)
			SL_TRY(sl_kvt_copy_rows(T, false, sl_kvt_home(T, l, hi0, x),
						sl_kvt_stage_host(T, st, b.host, x, 0), T->ss, p.host));
	}
	if (p.disk && prefill) {
		st->offs[0] = 0;
		st->lens[0] = (size_t)b.disk * 2 * (T->sb + T->ss); /* the part's units whole */
		SL_TRY(sl_kvt_disk_pages(T, st, 1));
	} else if (p.disk) {
		SL_TRY(disk_rows_back(kv, st, &b, &p, NULL));
	}
	return 0;
}

int sl_kv_host_attention(sl_kv *kv, int l, const sl_kv_part *p,
			 const sl_attn_args *a)
{
	sl_kv_ccc *C = kv->ccc;
	sl_backend *be = kv->env.be, *hb = C->be;
	/* query heads in q and out, KV heads (grouped-query attention) in k,
	 * v and H2O's state */
	const int nkv = kv->env.cfg->n_kv_head, n = p->count;
	const size_t rows = (size_t)n * a->nh * a->hd * sizeof(float);
	const size_t krows = (size_t)n * nkv * a->hd * sizeof(float);
	float *ev = kv->h2o && kv->evicted ? kv->evicted + ((size_t)l * kv->nseq + p->seq) * nkv : NULL;
	/* the step's q, k, v rows (and H2O's evicted sums) to the host; the
	 * scores and positions are at home with the cache */
	SL_TRY(sl_copy_d2h(be, kv->env.q, C->hq, a->q, rows));
	SL_TRY(sl_copy_d2h(be, kv->env.q, C->hk, a->k_new, krows));
	SL_TRY(sl_copy_d2h(be, kv->env.q, C->hv, a->v_new, krows));
	if (ev)
		SL_TRY(sl_copy_d2h(be, kv->env.q, C->hevicted, ev, (size_t)n * nkv * 4));
	double t0 = sl_now();
	SL_TRY(sl_queue_sync(be, kv->env.q));
	kv->env.stats->stall_s += sl_now() - t0;
	kv->env.stats->d2h_bytes += rows + 2 * krows;
	sl_attn_args h = *a;
	h.q = C->hq;
	h.k_new = C->hk;
	h.v_new = C->hv;
	h.out = C->ho;
	h.score = p->score;
	SL_TRY(sl_attn_decode(hb, C->q, &h));
	if (kv->h2o) {
		sl_h2o_args e = { .nseq = n, .nh = nkv, .hd = a->hd, .kv_f32 = kv->f32, .kv_q4 = kv->q4,
				  .k_cache = p->k, .v_cache = p->v, .score = p->score,
				  .pos = p->pos, .cap = kv->cap, .len = kv->len + p->seq,
				  .cur = kv->pos + p->seq, .heavy = kv->heavy + p->seq,
				  .recent = kv->recent + p->seq, .evicted = ev ? C->hevicted : NULL };
		SL_TRY(sl_h2o_evict(hb, C->q, &e));
	}
	SL_TRY(sl_queue_sync(hb, C->q));
	/* the output (and H2O state) back, ahead of the layer's next op */
	SL_TRY(sl_copy_h2d(be, kv->env.q, a->out, C->ho, rows));
	kv->env.stats->h2d_bytes += rows;
	if (ev)
		SL_TRY(sl_copy_h2d(be, kv->env.q, ev, C->hevicted, (size_t)n * nkv * 4));
	return 0;
}

const sl_backend *sl_kv_host_backend(const sl_kv *kv)
{
	return kv->ccc ? kv->ccc->be : NULL;
}

int sl_kv_pass_end(sl_kv *kv)
{
	sl_kv_tiers *T = kv->tiers;
	if (!T)
		return 0;
	int rc = 0;
	for (int i = 0; i < SL_KVT_NSTAGE; i++) {
		int r = kv_flush(kv, &T->st[i]);
		if (rc == 0)
			rc = r;
	}
	int r = sl_kvt_pass_end(T);
	return rc < 0 ? rc : r;
}
