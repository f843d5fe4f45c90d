/*
 * kvcache.c - the KV cache: allocation (dense or H2O), its placement
 * across the device, pinned host and disk tiers, and the per-step loads
 * and write-backs of the zig-zag schedule (kvcache.h says how).  It knows
 * the model only through the cache's environment (sl_kv_env).
 */
#include "kvcache.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NSTAGE 3 /* staging areas: one computing, one loading, one storing */
#define PAGE ((size_t)SL_DISK_ALIGN)
#define SL_KV_MAX_HEADS 256 /* OPT-175B has 96 */

static size_t align_page(size_t n)
{
	return (n + PAGE - 1) & ~(PAGE - 1);
}

/* Sequences of a micro-batch of g on the device, host and disk. */
typedef struct split {
	int dev, host, disk;
} split;

static split split_of(int g, double gpu, double cpu)
{
	split s;
	s.dev = (int)floor(g * gpu / 100.0 + 0.5);
	int dh = (int)floor(g * (gpu + cpu) / 100.0 + 0.5);
	s.dev = SL_MIN(s.dev, g);
	dh = SL_MIN(SL_MAX(dh, s.dev), g);
	s.host = dh - s.dev;
	s.disk = g - dh;
	return s;
}

/* What a placement adds up to over nseq sequences in micro-batches of gs:
 * sequences per tier, and the largest host and disk part of a micro-batch
 * (what one staging area and one disk segment hold). */
typedef struct counts {
	int dev, host, disk, nmb, maxhost, maxdisk;
} counts;

static counts counts_of(int nseq, int gs, double gpu, double cpu)
{
	counts n = { 0 };
	n.nmb = (nseq + gs - 1) / gs;
	for (int k = 0; k < n.nmb; k++) {
		split p = split_of(SL_MIN(gs, nseq - k * gs), gpu, cpu);
		n.dev += p.dev;
		n.host += p.host;
		n.disk += p.disk;
		n.maxhost = SL_MAX(n.maxhost, p.host);
		n.maxdisk = SL_MAX(n.maxdisk, p.disk);
	}
	return n;
}

typedef struct kv_stage kv_stage;
struct sl_kv_tiers;

/* The split of micro-batch mb as placed (b: fixes every offset), and of
 * the first g of its sequences that this block runs (p: the counts).  A
 * sequence's tier depends on its index only, never on the block size. */
static void mb_split(const sl_kv *kv, int nseq0, int mb, int g, split *b, split *p)
{
	*b = split_of(SL_MIN(kv->gs, nseq0 - mb * kv->gs), kv->env.plan->p.cache_gpu,
		      kv->env.plan->p.cache_cpu);
	p->dev = SL_MIN(g, b->dev);
	p->host = SL_MIN(g - p->dev, b->host);
	p->disk = g - p->dev - p->host;
}

struct kv_stage {
	char *buf;       /* device: host part [K|V|S|P] | page | disk part [K|V|S|P] */
	void *bounce;    /* pinned disk segment (device not host memory) */
	int l, s0;       /* what it holds, or l = -1 */
	bool prefill;
	bool read_pending;
	uint64_t rticket;
	size_t read_bytes;
	uint64_t *wticket; /* disk writes still reading from buf / bounce */
	int nw, wcap;
	sl_event *done_ev;  /* compute finished with the stage */
	sl_event *ready_ev; /* loads landed */
	/* The write-back a step leaves to finish (kv_flush): with H2O, the
	 * positions say which rows changed (PEND_POS: they are on their way to
	 * the host); on disk, the pages are on their way to the bounce
	 * (PEND_DISK).  Finished at the next step's end, when the compute has
	 * moved on, or before the stage is reused, or at the pass's end: never
	 * by waiting for the step's own compute. */
	int pend;
	int pmb, pg;        /* the step's micro-batch and sequences */
	sl_event *wb_ev;    /* the positions or pages landed on the host */
	size_t *offs, *lens; /* PEND_DISK: page ranges of the disk part, room for nrmax */
	int nr, nrmax;
};

enum { PEND_NONE, PEND_POS, PEND_DISK };

struct sl_kv_tiers {
	split full;      /* split of a whole micro-batch */
	int nseq0;       /* sequences placed (a block may run fewer) */
	int nmb;         /* micro-batches */
	size_t sb;       /* one sequence's K (or V) of one layer */
	size_t ss;       /* H2O: its scores (or positions) of one layer; 0: dense */
	char *host;      /* pinned homes: [layer][K|V|S|P][host index] */
	size_t host_bytes;
	int nhost;       /* host-tier sequences in all */
	sl_disk_store *disk;
	size_t seg_bytes; /* one (layer, micro-batch) disk segment, page aligned */
	size_t stage_disk_off, stage_bytes;
	sl_queue *cq;
	kv_stage st[NSTAGE];
	int cur;          /* the stage of the step in progress */
	int32_t *pos_host; /* H2O positions of a micro-batch (device not host) */
	double busy_seen;  /* the store's busy time already counted */
	size_t pos_bytes;
	/* cpu_cache_compute where the device is not host memory: pinned q,
	 * k_new, v_new, out rows of a micro-batch, and its H2O evicted sums,
	 * for attention on the host */
	float *hq, *hk, *hv, *ho, *hevicted;
	void *ccc;
	size_t ccc_bytes;
	sl_backend *host_be; /* the CPU backend that runs it */
	sl_queue *host_q;
};

/* One sequence's block of one layer in any tier: K and V of sb bytes
 * each, then H2O's scores and positions of ss bytes each (ss 0: dense). */
static size_t unit_bytes(size_t sb, size_t ss)
{
	return 2 * (sb + ss);
}

/* Where a group of n sequences laid out [K x n][V x n][S x n][P x n]
 * (a stage's host part, a disk segment) holds sequence j's part. */
enum { PART_K, PART_V, PART_S, PART_P };
static size_t grp_off(size_t n, size_t sb, size_t ss, int part, size_t j)
{
	switch (part) {
	case PART_K: return j * sb;
	case PART_V: return (n + j) * sb;
	case PART_S: return 2 * n * sb + j * ss;
	default: return 2 * n * sb + (n + j) * ss;
	}
}

void sl_kv_tier_sizes(const sl_opt_config *c, int nseq, int gs, int cap, size_t es, bool h2o,
		      double gpu_percent, double cpu_percent, bool dev_is_host, sl_kv_sizes *out)
{
	memset(out, 0, sizeof *out);
	if (gs <= 0 || gs > nseq)
		gs = nseq;
	const size_t sb = (size_t)c->hidden * cap * es;
	const size_t ss = h2o ? (size_t)c->n_head * cap * 4 : 0;
	const size_t ub = unit_bytes(sb, ss);
	out->seq_bytes = sb;
	out->state_bytes = ss;
	const counts n = counts_of(nseq, gs, gpu_percent, cpu_percent);
	const size_t L = (size_t)c->n_layer;
	const size_t seg = align_page((size_t)n.maxdisk * ub);
	out->dev_seqs = n.dev;
	out->host_seqs = n.host;
	out->disk_seqs = n.disk;
	out->device = L * n.dev * ub;
	if (n.dev < nseq) {
		/* staging of the largest micro-batch's off-device part */
		size_t stage = align_page((size_t)n.maxhost * ub) + seg;
		out->device += NSTAGE * stage;
		if (!dev_is_host)
			out->host += NSTAGE * seg + (h2o ? (size_t)gs * ss : 0);
	}
	out->host += L * n.host * ub;
	out->disk = L * n.nmb * seg;
}

size_t sl_kv_ccc_bytes(const sl_opt_config *c, int gs)
{
	return 4 * (size_t)gs * c->hidden * sizeof(float) + (size_t)gs * c->n_head * 4;
}

/* ---- allocation ------------------------------------------------------- */

static void tiers_free(sl_kv *kv)
{
	sl_kv_tiers *T = kv->tiers;
	if (!T)
		return;
	sl_backend *be = kv->env.be;
	for (int i = 0; i < NSTAGE; i++) {
		kv_stage *st = &T->st[i];
		if (T->disk) {
			if (st->read_pending)
				sl_disk_wait(T->disk, st->rticket);
			for (int j = 0; j < st->nw; j++)
				sl_disk_wait(T->disk, st->wticket[j]);
		}
		free(st->wticket);
		free(st->offs);
		if (st->wb_ev)
			be->ops->event_free(be, st->wb_ev);
		if (st->done_ev)
			be->ops->event_free(be, st->done_ev);
		if (st->ready_ev)
			be->ops->event_free(be, st->ready_ev);
		if (st->buf)
			sl_dev_free(be, st->buf, T->stage_bytes);
		if (st->bounce)
			sl_host_free(be, st->bounce, T->seg_bytes);
	}
	if (T->cq) {
		be->ops->queue_sync(be, T->cq);
		be->ops->queue_free(be, T->cq);
	}
	sl_disk_close(T->disk);
	sl_host_free(be, T->ccc, T->ccc_bytes);
	if (T->host_q)
		T->host_be->ops->queue_free(T->host_be, T->host_q);
	sl_backend_free(T->host_be);
	sl_host_free(be, T->host, T->host_bytes);
	sl_host_free(be, T->pos_host, T->pos_bytes);
	free(T);
	kv->tiers = NULL;
}

static int tiers_create(sl_kv *kv)
{
	sl_backend *be = kv->env.be;
	const sl_backend_ops *o = be->ops;
	const sl_opt_config *c = kv->env.cfg;
	sl_kv_tiers *T = calloc(1, sizeof *T);
	if (!T)
		return sl_err(SL_ENOMEM, "out of memory");
	kv->tiers = T;
	const int gs = kv->gs, nseq = kv->nseq;
	const size_t es = kv->f32 ? 4 : 2;
	T->full = split_of(gs, kv->env.plan->p.cache_gpu, kv->env.plan->p.cache_cpu);
	T->nseq0 = nseq;
	const counts n = counts_of(nseq, gs, kv->env.plan->p.cache_gpu, kv->env.plan->p.cache_cpu);
	T->nmb = n.nmb;
	T->sb = (size_t)c->hidden * kv->cap * es;
	T->ss = kv->h2o ? (size_t)c->n_head * kv->cap * 4 : 0;
	T->nhost = n.host;
	const int maxdisk = n.maxdisk, maxhost = n.maxhost;
	const size_t L = (size_t)c->n_layer, ub = unit_bytes(T->sb, T->ss);
	int rc = 0;
	if (T->nhost > 0) {
		T->host_bytes = L * T->nhost * ub;
		if ((rc = sl_host_alloc(be, T->host_bytes, "KV cache (host tier)", (void **)&T->host)) < 0) {
			T->host_bytes = 0;
			goto fail;
		}
	}
	T->seg_bytes = align_page((size_t)maxdisk * ub);
	if (maxdisk > 0) {
		if (!kv->env.offload_dir) {
			rc = sl_err(SL_EINVAL, "a KV cache placed on disk needs --offload-dir DIR");
			goto fail;
		}
		/* a scratch store, unlinked at once: it vanishes with the process */
		char name[160], key[256];
		snprintf(name, sizeof name, "%s.kv.%ld.sluice",
			 strrchr(c->name, '/') ? strrchr(c->name, '/') + 1 : c->name, (long)getpid());
		snprintf(key, sizeof key, "sluice kv scratch v1 pid %ld", (long)getpid());
		sl_disk_params dp = { .dir = kv->env.offload_dir, .file_name = name, .key = key,
				      .data_bytes = L * T->nmb * T->seg_bytes };
		dp.bind_io = kv->env.bind_io;
		dp.io_node = kv->env.io_node;
		bool fresh;
		if ((rc = sl_disk_open(&dp, &T->disk, &fresh)) < 0)
			goto fail;
		unlink(sl_disk_path(T->disk));
		kv->env.stats->disk_bytes = SL_MAX(kv->env.stats->disk_bytes, (size_t)dp.data_bytes);
	}
	if ((rc = o->queue_create(be, &T->cq)) < 0)
		goto fail;
	T->stage_disk_off = align_page((size_t)maxhost * ub);
	T->stage_bytes = T->stage_disk_off + T->seg_bytes;
	for (int i = 0; i < NSTAGE; i++) {
		kv_stage *st = &T->st[i];
		st->l = -1;
		if ((rc = sl_dev_alloc(be, T->stage_bytes, "KV cache staging", (void **)&st->buf)) < 0) {
			st->buf = NULL;
			goto fail;
		}
		if (T->seg_bytes && !o->dev_is_host &&
		    (rc = sl_host_alloc(be, T->seg_bytes, "KV disk bounce buffer", &st->bounce)) < 0) {
			st->bounce = NULL;
			goto fail;
		}
		if ((rc = o->event_create(be, &st->done_ev)) < 0 ||
		    (rc = o->event_create(be, &st->ready_ev)) < 0 ||
		    (rc = o->event_create(be, &st->wb_ev)) < 0)
			goto fail;
		/* a decode step writes a row per sequence and head (K and V),
		 * plus the scores and positions: sized here, not per step */
		st->nrmax = 2 * maxdisk * c->n_head + 2;
		st->wcap = st->nrmax;
		st->offs = malloc(sizeof *st->offs * 2 * (size_t)st->nrmax);
		st->wticket = malloc(sizeof *st->wticket * (size_t)st->wcap);
		if (!st->offs || !st->wticket) {
			rc = sl_err(SL_ENOMEM, "out of memory");
			goto fail;
		}
		st->lens = st->offs + st->nrmax;
	}
	if (kv->env.plan->p.cpu_cache_compute && !o->dev_is_host && T->nhost > 0) {
		/* attention over the host tier runs on a CPU backend beside the device */
		const size_t rows = (size_t)gs * c->hidden * sizeof(float);
		T->ccc_bytes = sl_kv_ccc_bytes(c, gs);
		if ((rc = sl_host_alloc(be, T->ccc_bytes, "cpu_cache_compute buffers", &T->ccc)) < 0) {
			T->ccc_bytes = 0;
			goto fail;
		}
		char *q = T->ccc;
		T->hq = (float *)q;
		T->hk = (float *)(q + rows);
		T->hv = (float *)(q + 2 * rows);
		T->ho = (float *)(q + 3 * rows);
		T->hevicted = (float *)(q + 4 * rows);
		if ((rc = sl_backend_create("cpu", 0, &T->host_be)) < 0 ||
		    (rc = T->host_be->ops->queue_create(T->host_be, &T->host_q)) < 0)
			goto fail;
	}
	if (!o->dev_is_host && kv->h2o) {
		/* the new row's slot per head is read from the positions */
		T->pos_bytes = (size_t)gs * T->ss;
		if ((rc = sl_host_alloc(be, T->pos_bytes, "KV position readback", (void **)&T->pos_host)) < 0) {
			T->pos_bytes = 0;
			goto fail;
		}
	}
	return 0;
fail:
	tiers_free(kv);
	return rc;
}

/* A cache of cap slots (h2o: with scores and positions); extra more device
 * bytes at the end of its block (H2O's scratch), so that the device part
 * is one allocation: [layer][K|V] of the device-tier sequences, then under
 * H2O [layer][scores|positions] of them, then the extra. */
static int kv_create(const sl_kv_env *env, int nseq, int cap, bool h2o, size_t extra, sl_kv **out)
{
	*out = NULL;
	const sl_opt_config *c = env->cfg;
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
	kv->h2o = h2o;
	kv->gs = sl_kv_group(kv->env.plan->p.micro, nseq);
	kv->k = calloc((size_t)c->n_layer, sizeof *kv->k);
	kv->v = calloc((size_t)c->n_layer, sizeof *kv->v);
	kv->score = calloc((size_t)c->n_layer, sizeof *kv->score);
	kv->pos_slot = calloc((size_t)c->n_layer, sizeof *kv->pos_slot);
	kv->len = calloc((size_t)nseq, sizeof *kv->len);
	kv->pos = calloc((size_t)nseq, sizeof *kv->pos);
	if (!kv->k || !kv->v || !kv->score || !kv->pos_slot || !kv->len || !kv->pos) {
		sl_kv_free(kv);
		return sl_err(SL_ENOMEM, "out of memory");
	}
	const int ndev = counts_of(nseq, kv->gs, kv->env.plan->p.cache_gpu, kv->env.plan->p.cache_cpu).dev;
	const size_t per = (size_t)ndev * c->hidden * cap * (kv->f32 ? sizeof(float) : sizeof(sl_half));
	const size_t sper = h2o ? (size_t)ndev * c->n_head * cap * 4 : 0;
	const size_t L = (size_t)c->n_layer;
	kv->bytes = 2 * (per + sper) * L + extra;
	if (kv->bytes) {
		int rc = sl_dev_alloc(kv->env.be, kv->bytes, h2o ? "KV cache (H2O)" : "KV cache", &kv->block);
		if (rc < 0) {
			kv->bytes = 0;
			sl_kv_free(kv);
			return rc;
		}
	}
	char *b = kv->block;
	for (size_t l = 0; l < L; l++) {
		kv->k[l] = b + 2 * l * per;
		kv->v[l] = b + (2 * l + 1) * per;
		if (h2o) {
			kv->score[l] = (float *)(b + 2 * L * per + 2 * l * sper);
			kv->pos_slot[l] = (int32_t *)(b + 2 * L * per + (2 * l + 1) * sper);
		}
	}
	if (ndev < nseq) {
		int rc = tiers_create(kv);
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

size_t sl_kv_h2o_extra(const sl_opt_config *c, int nseq, int gs, int max_prompt, size_t es)
{
	const size_t sc = (size_t)gs * c->n_head * max_prompt; /* one micro-batch */
	return 2 * sc * (c->hidden / c->n_head) * es + sc * 4 +
	       (size_t)c->n_layer * nseq * c->n_head * 4 + 1024;
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
	const size_t es = env->plan->p.kv_f32 ? 4 : 2;
	const sl_opt_config *c = env->cfg;
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
	const size_t sc = (size_t)gs * c->n_head * max_prompt;
	char *p = (char *)kv->block + (kv->bytes - extra);
	kv->scratch_k = p;
	p += sc * c->hidden / c->n_head * es;
	kv->scratch_v = p;
	p += sc * c->hidden / c->n_head * es;
	kv->scratch_score = (float *)p;
	p += sc * 4;
	kv->evicted = (float *)p;
	return kv->env.be->ops->memset_dev(kv->env.be, kv->env.q, kv->evicted, 0,
				      (size_t)c->n_layer * nseq * c->n_head * 4);
}

void sl_kv_free(sl_kv *kv)
{
	if (!kv)
		return;
	tiers_free(kv);
	sl_dev_free(kv->env.be, kv->block, kv->bytes);
	free(kv->score);
	free(kv->pos_slot);
	free(kv->heavy);
	free(kv->recent);
	free(kv->k);
	free(kv->v);
	free(kv->len);
	free(kv->pos);
	free(kv);
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

/* Host home of part (PART_K..PART_P) of sequence index hi (within the
 * host tier) in layer l: layer by layer, [K|V|S|P] of every host-tier
 * sequence. */
static char *host_home(const sl_kv_tiers *T, int l, size_t hi, int part)
{
	return T->host + (size_t)l * T->nhost * unit_bytes(T->sb, T->ss) +
	       grp_off((size_t)T->nhost, T->sb, T->ss, part, hi);
}

/* A part of n sequences whose group [K x n][V x n][S x n][P x n] starts at
 * base (a stage's host or disk part). */
static void part_in_group(sl_kv_part *q, const sl_kv_tiers *T, char *base, int n)
{
	q->k = base;
	q->v = base + grp_off((size_t)n, T->sb, T->ss, PART_V, 0);
	q->score = T->ss ? (float *)(base + grp_off((size_t)n, T->sb, T->ss, PART_S, 0)) : NULL;
	q->pos = T->ss ? (int32_t *)(base + grp_off((size_t)n, T->sb, T->ss, PART_P, 0)) : NULL;
}

/* The parts of micro-batch [s0, s0 + g) and where each one's K and V (and
 * H2O state) are for this step (stage: the staging area, may be NULL when
 * everything is on the device). */
static int parts_of(sl_kv *kv, int l, int s0, int g, bool prefill,
		    const kv_stage *stage, sl_kv_part *parts)
{
	const sl_kv_tiers *T = kv->tiers;
	const size_t sb = (size_t)kv->env.cfg->hidden * kv->cap * (kv->f32 ? 4 : 2);
	const size_t sn = (size_t)kv->env.cfg->n_head * kv->cap; /* state entries per sequence */
	/* the device-tier sequences from device index di */
	size_t di = (size_t)s0;
	int ndev = g;
	split b = { 0 }, p = { .dev = g };
	const int mb = s0 / kv->gs;
	if (T) {
		mb_split(kv, T->nseq0, mb, g, &b, &p);
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
			q->k = host_home(T, l, hi, PART_K);
			q->v = host_home(T, l, hi, PART_V);
			q->score = T->ss ? (float *)host_home(T, l, hi, PART_S) : NULL;
			q->pos = T->ss ? (int32_t *)host_home(T, l, hi, PART_P) : NULL;
		} else {
			part_in_group(q, T, stage->buf, b.host);
		}
	}
	if (p.disk) {
		sl_kv_part *q = &parts[n++];
		q->seq = s0 + p.dev + p.host;
		q->count = p.disk;
		q->tier = SL_TIER_DISK;
		part_in_group(q, T, stage->buf + T->stage_disk_off, b.disk);
	}
	return n;
}

static uint64_t seg_off(const sl_kv_tiers *T, int l, int mb)
{
	return ((uint64_t)l * T->nmb + mb) * T->seg_bytes;
}

/* Copy slots [0, rows) of one sequence's block (K or V): one range, since
 * a slot holds every head's row (token-major). */
static int copy_rows(sl_backend *be, sl_queue *q, bool h2d, char *dst, const char *src,
		     size_t slot_bytes, int rows, uint64_t *bytes)
{
	if (rows <= 0)
		return 0;
	const size_t n = (size_t)rows * slot_bytes;
	*bytes += n;
	return h2d ? be->ops->copy_h2d(be, q, dst, src, n) : be->ops->copy_d2h(be, q, dst, src, n);
}

static int wait_writes(sl_kv_tiers *T, kv_stage *st)
{
	int rc = 0;
	for (int j = 0; j < st->nw; j++) {
		int r = sl_disk_wait(T->disk, st->wticket[j]);
		if (r < 0 && rc == 0)
			rc = r;
	}
	st->nw = 0;
	return rc;
}

static int add_wticket(kv_stage *st, uint64_t t)
{
	if (st->nw == st->wcap) {
		int cap = st->wcap ? 2 * st->wcap : 16;
		uint64_t *p = realloc(st->wticket, sizeof *p * (size_t)cap);
		if (!p)
			return sl_err(SL_ENOMEM, "out of memory");
		st->wticket = p;
		st->wcap = cap;
	}
	st->wticket[st->nw++] = t;
	return 0;
}

static int kv_flush(sl_kv *kv, kv_stage *st);

/* Issue the loads of step (l, s0) into stage st. */
static int stage_load(sl_kv *kv, kv_stage *st, int l, int s0, int g, bool prefill)
{
	sl_backend *be = kv->env.be;
	const sl_backend_ops *o = be->ops;
	sl_kv_tiers *T = kv->tiers;
	/* the stage's last user: its write-back finished, its disk writes
	 * (which read from it) done */
	SL_TRY(kv_flush(kv, st));
	SL_TRY(wait_writes(T, st));
	st->l = l;
	st->s0 = s0;
	st->prefill = prefill;
	if (prefill) /* an empty cache: nothing to load */
		return 0;
	const int mb = s0 / kv->gs;
	split b, p;
	mb_split(kv, T->nseq0, mb, g, &b, &p);
	const size_t slot_bytes = T->sb / kv->cap; /* every head's row of a token */
	SL_TRY(o->queue_wait(be, T->cq, st->done_ev));
	if (p.host && !kv->env.plan->p.cpu_cache_compute) {
		const size_t hi0 = (size_t)mb * T->full.host;
		for (int j = 0; j < p.host; j++) {
			const int s = s0 + p.dev + j;
			for (int v = PART_K; v <= PART_V; v++)
				SL_TRY(copy_rows(be, T->cq, true,
						 st->buf + grp_off((size_t)b.host, T->sb, T->ss, v, (size_t)j),
						 host_home(T, l, hi0 + j, v), slot_bytes, kv->len[s],
						 &kv->env.stats->h2d_bytes));
		}
		/* H2O: the scores and positions whole, one range each */
		for (int x = PART_S; T->ss && x <= PART_P; x++)
			SL_TRY(copy_rows(be, T->cq, true,
					 st->buf + grp_off((size_t)b.host, T->sb, T->ss, x, 0),
					 host_home(T, l, hi0, x), T->ss, p.host, &kv->env.stats->h2d_bytes));
	}
	if (p.disk) {
		void *dst = st->buf + T->stage_disk_off;
		if (o->dev_is_host) { /* the disk writes into device memory */
			SL_TRY(o->event_sync(be, st->done_ev));
		} else { /* the bounce's last copy to the device done (its writes are) */
			SL_TRY(o->event_sync(be, st->ready_ev));
			dst = st->bounce;
		}
		/* the micro-batch's part of the segment (what its prefill wrote) */
		const size_t n = align_page((size_t)b.disk * unit_bytes(T->sb, T->ss));
		SL_TRY(sl_disk_read(T->disk, seg_off(T, l, mb), dst, n, &st->rticket));
		st->read_pending = true;
		st->read_bytes = n;
		kv->env.stats->disk_read_bytes += n;
	}
	return 0;
}

/* The stage's loads complete and visible to the compute queue. */
static int stage_ready(sl_kv *kv, kv_stage *st)
{
	sl_backend *be = kv->env.be;
	const sl_backend_ops *o = be->ops;
	sl_kv_tiers *T = kv->tiers;
	if (st->read_pending) {
		double t0 = sl_now();
		int rc = sl_disk_wait(T->disk, st->rticket);
		kv->env.stats->stall_s += sl_now() - t0;
		st->read_pending = false;
		SL_TRY(rc);
		if (!o->dev_is_host) {
			SL_TRY(o->copy_h2d(be, T->cq, st->buf + T->stage_disk_off, st->bounce,
					   st->read_bytes));
			kv->env.stats->h2d_bytes += st->read_bytes;
		}
	}
	SL_TRY(o->event_record(be, st->ready_ev, T->cq));
	return o->queue_wait(be, kv->env.q, st->ready_ev);
}

static kv_stage *stage_holding(sl_kv_tiers *T, int l, int s0)
{
	for (int i = 0; i < NSTAGE; i++)
		if (T->st[i].l == l && T->st[i].s0 == s0)
			return &T->st[i];
	return NULL;
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
		for (int i = 0; i < NSTAGE; i++)
			T->st[i].l = -1;
	kv_stage *st = stage_holding(T, l, s0);
	if (!st) { /* not prefetched: load now */
		T->cur = (T->cur + 1) % NSTAGE;
		st = &T->st[T->cur];
		double t0 = sl_now();
		SL_TRY(stage_load(kv, st, l, s0, g, prefill));
		kv->env.stats->stall_s += sl_now() - t0;
	} else {
		T->cur = (int)(st - T->st);
	}
	if (kv->env.plan->p.overlap && next_l >= 0 && !stage_holding(T, next_l, next_s0))
		SL_TRY(stage_load(kv, &T->st[(T->cur + 1) % NSTAGE], next_l, next_s0, next_g,
				  prefill));
	SL_TRY(stage_ready(kv, st));
	*nparts = parts_of(kv, l, s0, g, prefill, st, parts);
	return 0;
}

/* The pages holding the byte ranges [offs[i], offs[i] + lens[i]), i < cnt,
 * of the disk part of stage st (st->offs, st->lens), sorted and coalesced
 * in place; where the device is not host memory they are copied to the
 * stage's bounce after the step's compute, and wb_ev follows them.  The
 * disk writes wait for kv_flush. */
static int disk_pages(sl_kv *kv, kv_stage *st, int cnt)
{
	sl_backend *be = kv->env.be;
	const sl_backend_ops *o = be->ops;
	sl_kv_tiers *T = kv->tiers;
	size_t *offs = st->offs, *lens = st->lens;
	st->nr = 0;
	if (cnt == 0)
		return 0;
	/* sort by offset (they come nearly sorted: insertion sort) */
	for (int i = 1; i < cnt; i++) {
		const size_t x = offs[i], y = lens[i];
		int j = i - 1;
		for (; j >= 0 && offs[j] > x; j--) {
			offs[j + 1] = offs[j];
			lens[j + 1] = lens[j];
		}
		offs[j + 1] = x;
		lens[j + 1] = y;
	}
	/* coalesce into pages, in place (range nr is written after range i >= nr
	 * was read) */
	int nr = 0;
	size_t lo = offs[0] / PAGE * PAGE, hi = align_page(offs[0] + lens[0]);
	for (int i = 1; i <= cnt; i++) {
		if (i < cnt && offs[i] / PAGE * PAGE <= hi) {
			hi = SL_MAX(hi, align_page(offs[i] + lens[i]));
			continue;
		}
		const size_t nlo = i < cnt ? offs[i] / PAGE * PAGE : 0;
		const size_t nhi = i < cnt ? align_page(offs[i] + lens[i]) : 0;
		offs[nr] = lo;
		lens[nr++] = hi - lo;
		lo = nlo;
		hi = nhi;
	}
	st->nr = nr;
	st->pend = PEND_DISK;
	if (o->dev_is_host) /* the disk writes read the stage after done_ev */
		return 0;
	const char *base = st->buf + T->stage_disk_off;
	SL_TRY(o->queue_wait(be, T->cq, st->done_ev));
	for (int r = 0; r < nr; r++) {
		SL_TRY(o->copy_d2h(be, T->cq, (char *)st->bounce + st->offs[r], base + st->offs[r],
				   st->lens[r]));
		kv->env.stats->d2h_bytes += st->lens[r];
	}
	return o->event_record(be, st->wb_ev, T->cq);
}

/* PEND_DISK: once the pages are on the host, write them. */
static int flush_disk(sl_kv *kv, kv_stage *st)
{
	sl_backend *be = kv->env.be;
	const sl_backend_ops *o = be->ops;
	sl_kv_tiers *T = kv->tiers;
	st->pend = PEND_NONE;
	SL_TRY(o->event_sync(be, o->dev_is_host ? st->done_ev : st->wb_ev));
	const char *src = o->dev_is_host ? st->buf + T->stage_disk_off : (const char *)st->bounce;
	for (int r = 0; r < st->nr; r++) {
		uint64_t tk;
		SL_TRY(sl_disk_write(T->disk, seg_off(T, st->l, st->pmb) + st->offs[r], src + st->offs[r],
				     st->lens[r], &tk));
		SL_TRY(add_wticket(st, tk));
		kv->env.stats->disk_write_bytes += st->lens[r];
	}
	st->nr = 0;
	return 0;
}

/* The slot each head of sequence s put this step's token in: slot len[s],
 * unless H2O (pos: the sequence's positions, (n_head, cap)) moved it into
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
 * the new token's row, one piece per head (hrow bytes) where H2O put it in
 * different slots, adjacent pieces merged (dense: one range).  At most nh. */
static int new_ranges(const sl_kv *kv, const int32_t *pos, int s, int nh, size_t hrow,
		      size_t *off, size_t *len)
{
	int n = 0;
	for (int h = 0; h < nh; h++) {
		const int slot = new_slot(kv, pos, s, h);
		if (slot < 0)
			continue;
		const size_t o = ((size_t)slot * nh + h) * hrow;
		if (n && off[n - 1] + len[n - 1] == o) {
			len[n - 1] += hrow;
		} else {
			off[n] = o;
			len[n++] = hrow;
		}
	}
	return n;
}

/* The host part's rows a decode step changed, back to their home: the
 * new token's row of each sequence (dense: slot len; H2O: where hpos, the
 * part's positions on the host, say each head put it). */
static int host_rows_back(sl_kv *kv, kv_stage *st, const split *b, const split *p,
			  const int32_t *hpos)
{
	sl_backend *be = kv->env.be;
	sl_kv_tiers *T = kv->tiers;
	const int nh = kv->env.cfg->n_head, l = st->l, s0 = st->s0;
	const size_t hrow = T->sb / kv->cap / nh, sn = (size_t)nh * kv->cap;
	const size_t hi0 = (size_t)st->pmb * T->full.host;
	size_t roff[SL_KV_MAX_HEADS], rlen[SL_KV_MAX_HEADS];
	SL_TRY(be->ops->queue_wait(be, T->cq, st->done_ev));
	for (int j = 0; j < p->host; j++) {
		const int s = s0 + p->dev + j;
		const int n = new_ranges(kv, hpos ? hpos + j * sn : NULL, s, nh, hrow, roff, rlen);
		for (int v = PART_K; v <= PART_V; v++) {
			char *home = host_home(T, l, hi0 + j, v);
			char *dev = st->buf + grp_off((size_t)b->host, T->sb, T->ss, v, (size_t)j);
			for (int r = 0; r < n; r++) {
				SL_TRY(be->ops->copy_d2h(be, T->cq, home + roff[r], dev + roff[r], rlen[r]));
				kv->env.stats->d2h_bytes += rlen[r];
			}
		}
	}
	/* H2O: every kept score changed; the scores and positions whole */
	for (int x = PART_S; T->ss && x <= PART_P; x++)
		SL_TRY(copy_rows(be, T->cq, false, host_home(T, l, hi0, x),
				 st->buf + grp_off((size_t)b->host, T->sb, T->ss, x, 0), T->ss, p->host,
				 &kv->env.stats->d2h_bytes));
	return 0;
}

/* The disk part's pages a decode step changed (dpos: the part's H2O
 * positions on the host, or NULL), to disk_pages. */
static int disk_rows_back(sl_kv *kv, kv_stage *st, const split *b, const split *p,
			  const int32_t *dpos)
{
	sl_kv_tiers *T = kv->tiers;
	const int nh = kv->env.cfg->n_head, s0 = st->s0;
	const size_t hrow = T->sb / kv->cap / nh, sn = (size_t)nh * kv->cap;
	size_t roff[SL_KV_MAX_HEADS], rlen[SL_KV_MAX_HEADS];
	int cnt = 0;
	for (int j = 0; j < p->disk; j++) {
		const int s = s0 + p->dev + p->host + j;
		const int n = new_ranges(kv, dpos ? dpos + j * sn : NULL, s, nh, hrow, roff, rlen);
		for (int v = PART_K; v <= PART_V; v++)
			for (int r = 0; r < n; r++) {
				st->offs[cnt] = grp_off((size_t)b->disk, T->sb, T->ss, v, (size_t)j) + roff[r];
				st->lens[cnt++] = rlen[r];
			}
	}
	for (int x = PART_S; T->ss && x <= PART_P; x++) {
		st->offs[cnt] = grp_off((size_t)b->disk, T->sb, T->ss, x, 0);
		st->lens[cnt++] = (size_t)p->disk * T->ss;
	}
	return disk_pages(kv, st, cnt);
}

/* Finish what stage st's step left (see kv_stage.pend): wait for its
 * positions or pages to reach the host, then issue the rest. */
static int kv_flush(sl_kv *kv, kv_stage *st)
{
	sl_backend *be = kv->env.be;
	const sl_backend_ops *o = be->ops;
	sl_kv_tiers *T = kv->tiers;
	if (st->pend == PEND_POS) {
		st->pend = PEND_NONE;
		split b, p;
		mb_split(kv, T->nseq0, st->pmb, st->pg, &b, &p);
		const bool host_part = p.host && !kv->env.plan->p.cpu_cache_compute;
		const size_t sn = (size_t)kv->env.cfg->n_head * kv->cap;
		const int32_t *hpos, *dpos;
		SL_TRY(o->event_sync(be, o->dev_is_host ? st->done_ev : st->wb_ev));
		if (o->dev_is_host) { /* in the stage */
			hpos = (const int32_t *)(st->buf + grp_off((size_t)b.host, T->sb, T->ss, PART_P, 0));
			dpos = (const int32_t *)(st->buf + T->stage_disk_off +
						 grp_off((size_t)b.disk, T->sb, T->ss, PART_P, 0));
		} else { /* read back by step_end */
			hpos = T->pos_host;
			dpos = T->pos_host + (host_part ? (size_t)p.host * sn : 0);
		}
		if (host_part)
			SL_TRY(host_rows_back(kv, st, &b, &p, hpos));
		if (p.disk)
			SL_TRY(disk_rows_back(kv, st, &b, &p, dpos));
	}
	if (st->pend == PEND_DISK)
		SL_TRY(flush_disk(kv, st));
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
	kv_stage *st = &T->st[T->cur];
	SL_TRY(o->event_record(be, st->done_ev, kv->env.q));
	/* the steps before: their compute is done or nearly, while this
	 * step's is queued behind it */
	for (int i = 0; i < NSTAGE; i++)
		if (&T->st[i] != st)
			SL_TRY(kv_flush(kv, &T->st[i]));
	const int mb = s0 / kv->gs, nh = kv->env.cfg->n_head;
	split b, p;
	mb_split(kv, T->nseq0, mb, g, &b, &p);
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
		st->pend = PEND_POS;
		if (o->dev_is_host)
			return 0;
		const size_t sn = (size_t)nh * kv->cap;
		const char *hbase = st->buf, *dbase = st->buf + T->stage_disk_off;
		int32_t *ph = T->pos_host, *pd = T->pos_host + (host_part ? (size_t)p.host * sn : 0);
		SL_TRY(o->queue_wait(be, T->cq, st->done_ev));
		if (host_part)
			SL_TRY(copy_rows(be, T->cq, false, (char *)ph,
					 hbase + grp_off((size_t)b.host, T->sb, T->ss, PART_P, 0), T->ss,
					 p.host, &kv->env.stats->d2h_bytes));
		if (p.disk)
			SL_TRY(copy_rows(be, T->cq, false, (char *)pd,
					 dbase + grp_off((size_t)b.disk, T->sb, T->ss, PART_P, 0), T->ss,
					 p.disk, &kv->env.stats->d2h_bytes));
		return o->event_record(be, st->wb_ev, T->cq);
	}
	if (host_part && !prefill)
		SL_TRY(host_rows_back(kv, st, &b, &p, NULL));
	if (host_part && prefill) { /* the rows kept */
		const size_t slot_bytes = T->sb / kv->cap, hi0 = (size_t)mb * T->full.host;
		SL_TRY(o->queue_wait(be, T->cq, st->done_ev));
		for (int j = 0; j < p.host; j++) {
			const int s = s0 + p.dev + j;
			for (int v = PART_K; v <= PART_V; v++)
				SL_TRY(copy_rows(be, T->cq, false, host_home(T, l, hi0 + j, v),
						 st->buf + grp_off((size_t)b.host, T->sb, T->ss, v, (size_t)j),
						 slot_bytes, rows_of(kv, s, true, npad, t),
						 &kv->env.stats->d2h_bytes));
		}
		for (int x = PART_S; T->ss && x <= PART_P; x++)
			SL_TRY(copy_rows(be, T->cq, false, host_home(T, l, hi0, x),
					 st->buf + grp_off((size_t)b.host, T->sb, T->ss, x, 0), T->ss, p.host,
					 &kv->env.stats->d2h_bytes));
	}
	if (p.disk && prefill) {
		st->offs[0] = 0;
		st->lens[0] = (size_t)b.disk * unit_bytes(T->sb, T->ss);
		SL_TRY(disk_pages(kv, st, 1));
	} else if (p.disk) {
		SL_TRY(disk_rows_back(kv, st, &b, &p, NULL));
	}
	return 0;
}

int sl_kv_host_attention(sl_kv *kv, int l, const sl_kv_part *p,
			 const sl_attn_args *a)
{
	sl_kv_tiers *T = kv->tiers;
	sl_backend *be = kv->env.be, *hb = T->host_be;
	const sl_backend_ops *o = be->ops;
	const int nh = a->nh, n = p->count;
	const size_t rows = (size_t)n * nh * a->hd * sizeof(float);
	float *ev = kv->h2o && kv->evicted ? kv->evicted + ((size_t)l * kv->nseq + p->seq) * nh : NULL;
	/* the step's q, k, v rows (and H2O's evicted sums) to the host; the
	 * scores and positions are at home with the cache */
	SL_TRY(o->copy_d2h(be, kv->env.q, T->hq, a->q, rows));
	SL_TRY(o->copy_d2h(be, kv->env.q, T->hk, a->k_new, rows));
	SL_TRY(o->copy_d2h(be, kv->env.q, T->hv, a->v_new, rows));
	if (ev)
		SL_TRY(o->copy_d2h(be, kv->env.q, T->hevicted, ev, (size_t)n * nh * 4));
	double t0 = sl_now();
	SL_TRY(o->queue_sync(be, kv->env.q));
	kv->env.stats->stall_s += sl_now() - t0;
	kv->env.stats->d2h_bytes += 3 * rows;
	sl_attn_args h = *a;
	h.q = T->hq;
	h.k_new = T->hk;
	h.v_new = T->hv;
	h.out = T->ho;
	h.score = p->score;
	SL_TRY(hb->ops->attn_decode(hb, T->host_q, &h));
	if (kv->h2o) {
		sl_h2o_args e = { .nseq = n, .nh = nh, .hd = a->hd, .kv_f32 = kv->f32,
				  .k_cache = p->k, .v_cache = p->v, .score = p->score,
				  .pos = p->pos, .cap = kv->cap, .len = kv->len + p->seq,
				  .cur = kv->pos + p->seq, .heavy = kv->heavy + p->seq,
				  .recent = kv->recent + p->seq, .evicted = ev ? T->hevicted : NULL };
		SL_TRY(hb->ops->h2o_evict(hb, T->host_q, &e));
	}
	SL_TRY(hb->ops->queue_sync(hb, T->host_q));
	/* the output (and H2O state) back, ahead of the layer's next op */
	SL_TRY(o->copy_h2d(be, kv->env.q, a->out, T->ho, rows));
	kv->env.stats->h2d_bytes += rows;
	if (ev)
		SL_TRY(o->copy_h2d(be, kv->env.q, ev, T->hevicted, (size_t)n * nh * 4));
	return 0;
}

int sl_kv_pass_end(sl_kv *kv)
{
	sl_kv_tiers *T = kv->tiers;
	if (!T)
		return 0;
	int rc = 0;
	for (int i = 0; i < NSTAGE; i++) {
		int r = kv_flush(kv, &T->st[i]);
		int w = T->disk ? wait_writes(T, &T->st[i]) : 0;
		if (rc == 0)
			rc = r < 0 ? r : w;
		T->st[i].l = -1; /* the next pass loads afresh */
	}
	int r = kv->env.be->ops->queue_sync(kv->env.be, T->cq);
	if (T->disk) {
		sl_disk_stats d;
		sl_disk_get_stats(T->disk, &d);
		kv->env.stats->disk_busy_s += d.busy_s - T->busy_seen;
		T->busy_seen = d.busy_s;
	}
	return rc < 0 ? rc : r;
}
