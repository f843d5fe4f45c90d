/*
 * kv_tiers.c - the KV cache's tiers: placement, homes, scratch store,
 * staging and the movement between them (kv_tiers.h says how).
 */
#include "kv_tiers.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PAGE ((size_t)SL_DISK_ALIGN)

static size_t align_page(size_t n)
{
	return (n + PAGE - 1) & ~(PAGE - 1);
}

/* ---- placement and layout --------------------------------------------- */

sl_kvt_split sl_kvt_split_of(int g, double gpu, double cpu)
{
	sl_kvt_split s;
	s.dev = (int)floor(g * gpu / 100.0 + 0.5);
	int dh = (int)floor(g * (gpu + cpu) / 100.0 + 0.5);
	s.dev = SL_MIN(s.dev, g);
	dh = SL_MIN(SL_MAX(dh, s.dev), g);
	s.host = dh - s.dev;
	s.disk = g - dh;
	return s;
}

sl_kvt_counts sl_kvt_counts_of(int nseq, int gs, double gpu, double cpu)
{
	sl_kvt_counts n = { 0 };
	n.nmb = (nseq + gs - 1) / gs;
	for (int k = 0; k < n.nmb; k++) {
		sl_kvt_split p = sl_kvt_split_of(SL_MIN(gs, nseq - k * gs), gpu, cpu);
		n.dev += p.dev;
		n.host += p.host;
		n.disk += p.disk;
		n.maxhost = SL_MAX(n.maxhost, p.host);
		n.maxdisk = SL_MAX(n.maxdisk, p.disk);
	}
	return n;
}

/* One sequence's unit of one layer in any tier: K and V of sb bytes each,
 * then H2O's scores and positions of ss bytes each (ss 0: dense). */
static size_t unit_bytes(size_t sb, size_t ss)
{
	return 2 * (sb + ss);
}

size_t sl_kvt_grp_off(size_t n, size_t sb, size_t ss, int part, size_t j)
{
	switch (part) {
	case SL_KVT_K: return j * sb;
	case SL_KVT_V: return (n + j) * sb;
	case SL_KVT_S: return 2 * n * sb + j * ss;
	default: return 2 * n * sb + (n + j) * ss;
	}
}

void sl_kvt_sizes(int n_layer, int nseq, int gs, size_t sb, size_t ss, double gpu_percent,
		  double cpu_percent, bool dev_is_host, sl_kv_sizes *out)
{
	memset(out, 0, sizeof *out);
	if (gs <= 0 || gs > nseq)
		gs = nseq;
	const size_t ub = unit_bytes(sb, ss);
	out->seq_bytes = sb;
	out->state_bytes = ss;
	const sl_kvt_counts n = sl_kvt_counts_of(nseq, gs, gpu_percent, cpu_percent);
	const size_t L = (size_t)n_layer;
	const size_t seg = align_page((size_t)n.maxdisk * ub);
	out->dev_seqs = n.dev;
	out->host_seqs = n.host;
	out->disk_seqs = n.disk;
	out->device = L * n.dev * ub;
	if (n.dev < nseq) {
		/* staging of the largest micro-batch's off-device part */
		size_t stage = align_page((size_t)n.maxhost * ub) + seg;
		out->device += SL_KVT_NSTAGE * stage;
		if (!dev_is_host)
			out->host += SL_KVT_NSTAGE * seg + (size_t)gs * ss;
	}
	out->host += L * n.host * ub;
	out->disk = L * n.nmb * seg;
}

void sl_kvt_mb_split(const sl_kv_tiers *T, int mb, int g, sl_kvt_split *b, sl_kvt_split *p)
{
	*b = sl_kvt_split_of(SL_MIN(T->p.gs, T->p.nseq - mb * T->p.gs), T->p.gpu_percent,
			     T->p.cpu_percent);
	p->dev = SL_MIN(g, b->dev);
	p->host = SL_MIN(g - p->dev, b->host);
	p->disk = g - p->dev - p->host;
}

char *sl_kvt_home(const sl_kv_tiers *T, int l, size_t hi, int part)
{
	return (char *)T->host.p + (size_t)l * T->nhost * unit_bytes(T->sb, T->ss) +
	       sl_kvt_grp_off((size_t)T->nhost, T->sb, T->ss, part, hi);
}

char *sl_kvt_stage_host(const sl_kv_tiers *T, const sl_kvt_stage *st, int n, int part, size_t j)
{
	return (char *)st->buf.p + sl_kvt_grp_off((size_t)n, T->sb, T->ss, part, j);
}

char *sl_kvt_stage_disk(const sl_kv_tiers *T, const sl_kvt_stage *st, int n, int part, size_t j)
{
	return (char *)st->buf.p + T->stage_disk_off + sl_kvt_grp_off((size_t)n, T->sb, T->ss, part, j);
}

static uint64_t seg_off(const sl_kv_tiers *T, int l, int mb)
{
	return ((uint64_t)l * T->nmb + mb) * T->seg_bytes;
}

/* ---- allocation ------------------------------------------------------- */

void sl_kvt_free(sl_kv_tiers *T)
{
	if (!T)
		return;
	sl_backend *be = T->p.be;
	for (int i = 0; i < SL_KVT_NSTAGE; i++) {
		sl_kvt_stage *st = &T->st[i];
		if (T->disk) {
			for (int j = 0; j < st->nrd; j++)
				sl_disk_wait(T->disk, st->rtickets[j]);
			for (int j = 0; j < st->nw; j++)
				sl_disk_wait(T->disk, st->wticket[j]);
		}
		free(st->wticket);
		free(st->offs);
		free(st->roffs);
		free(st->rtickets);
		if (st->wb_ev)
			sl_event_free(be, st->wb_ev);
		if (st->done_ev)
			sl_event_free(be, st->done_ev);
		if (st->ready_ev)
			sl_event_free(be, st->ready_ev);
		sl_buf_free(be, &st->buf);
		sl_buf_free(be, &st->bounce);
	}
	if (T->cq) {
		sl_queue_sync(be, T->cq);
		sl_queue_free(be, T->cq);
	}
	sl_disk_close(T->disk);
	sl_buf_free(be, &T->work);
	sl_buf_free(be, &T->host);
	sl_buf_free(be, &T->readback);
	free(T);
}

/* The scratch store of the disk tier, unlinked at once: it vanishes with
 * the process. */
static int open_store(sl_kv_tiers *T)
{
	const sl_kvt_params *P = &T->p;
	if (!P->offload_dir)
		return sl_err(SL_EINVAL, "a KV cache placed on disk needs --offload-dir DIR");
	char name[160], key[256];
	snprintf(name, sizeof name, "%s.kv.%ld.sluice", P->store_name ? P->store_name : "cache",
		 (long)getpid());
	snprintf(key, sizeof key, "sluice kv scratch v1 pid %ld", (long)getpid());
	sl_disk_params dp = { .dir = P->offload_dir, .file_name = name, .key = key,
			      .data_bytes = (uint64_t)P->n_layer * T->nmb * T->seg_bytes,
			      .bind_io = P->bind_io, .io_node = P->io_node };
	bool fresh;
	SL_TRY(sl_disk_open(&dp, &T->disk, &fresh));
	unlink(sl_disk_path(T->disk));
	P->stats->disk_bytes = SL_MAX(P->stats->disk_bytes, (size_t)dp.data_bytes);
	return 0;
}

static int stage_create(sl_kv_tiers *T, sl_kvt_stage *st, int maxdisk, int max_ranges)
{
	sl_backend *be = T->p.be;
	const sl_backend_ops *o = be->ops;
	st->l = -1;
	int rc;
	if ((rc = sl_buf_alloc(be, SL_MEM_DEVICE, T->stage_disk_off + T->seg_bytes, "KV cache staging",
			       &st->buf)) < 0)
		return rc;
	if (T->seg_bytes && !o->dev_is_host &&
	    (rc = sl_buf_alloc(be, SL_MEM_HOST, T->seg_bytes, "KV disk bounce buffer", &st->bounce)) < 0)
		return rc;
	SL_TRY(sl_event_create(be, &st->done_ev));
	SL_TRY(sl_event_create(be, &st->ready_ev));
	SL_TRY(sl_event_create(be, &st->wb_ev));
	/* a decode step writes ranges per sequence and block (K and V), plus
	 * the state blocks: sized here, not per step */
	st->nrmax = 2 * maxdisk * max_ranges + 2;
	st->wcap = st->nrmax;
	st->offs = malloc(sizeof *st->offs * 2 * (size_t)st->nrmax);
	st->wticket = malloc(sizeof *st->wticket * (size_t)st->wcap);
	if (!st->offs || !st->wticket)
		return sl_err(SL_ENOMEM, "out of memory");
	st->lens = st->offs + st->nrmax;
	/* a load reads each unit's K and V and the state blocks */
	st->nrdmax = 2 * maxdisk + 1;
	st->roffs = malloc(sizeof *st->roffs * 2 * (size_t)st->nrdmax);
	st->rtickets = malloc(sizeof *st->rtickets * (size_t)st->nrdmax);
	if (!st->roffs || !st->rtickets)
		return sl_err(SL_ENOMEM, "out of memory");
	st->rlens = st->roffs + st->nrdmax;
	return 0;
}

int sl_kvt_create(const sl_kvt_params *p, sl_kv_tiers **out)
{
	*out = NULL;
	sl_kv_tiers *T = calloc(1, sizeof *T);
	if (!T)
		return sl_err(SL_ENOMEM, "out of memory");
	T->p = *p;
	sl_backend *be = p->be;
	const sl_backend_ops *o = be->ops;
	T->full = sl_kvt_split_of(p->gs, p->gpu_percent, p->cpu_percent);
	const sl_kvt_counts n = sl_kvt_counts_of(p->nseq, p->gs, p->gpu_percent, p->cpu_percent);
	T->nmb = n.nmb;
	T->sb = p->seq_bytes;
	T->ss = p->state_bytes;
	T->nhost = n.host;
	const size_t L = (size_t)p->n_layer, ub = unit_bytes(T->sb, T->ss);
	int rc = 0;
	if (T->nhost > 0) {
		if ((rc = sl_buf_alloc(be, SL_MEM_HOST, L * T->nhost * ub, "KV cache (host tier)", &T->host)) < 0)
			goto fail;
	}
	T->seg_bytes = align_page((size_t)n.maxdisk * ub);
	if (n.maxdisk > 0 && (rc = open_store(T)) < 0)
		goto fail;
	if ((rc = sl_queue_create(be, &T->cq)) < 0)
		goto fail;
	T->stage_disk_off = align_page((size_t)n.maxhost * ub);
	for (int i = 0; i < SL_KVT_NSTAGE; i++)
		if ((rc = stage_create(T, &T->st[i], n.maxdisk, p->max_ranges)) < 0)
			goto fail;
	if (p->work_bytes > 0 &&
	    (rc = sl_buf_alloc(be, SL_MEM_HOST, p->work_bytes, p->work_what, &T->work)) < 0)
		goto fail;
	if (!o->dev_is_host && T->ss) {
		/* the state blocks of a micro-batch, read back */
		if ((rc = sl_buf_alloc(be, SL_MEM_HOST, (size_t)p->gs * T->ss, "KV position readback",
				       &T->readback)) < 0)
			goto fail;
	}
	*out = T;
	return 0;
fail:
	sl_kvt_free(T);
	return rc;
}

/* ---- movement --------------------------------------------------------- */

int sl_kvt_copy(sl_kv_tiers *T, bool h2d, void *dst, const void *src, size_t n)
{
	sl_backend *be = T->p.be;
	if (h2d) {
		T->p.stats->h2d_bytes += n;
		return sl_copy_h2d(be, T->cq, dst, src, n);
	}
	T->p.stats->d2h_bytes += n;
	return sl_copy_d2h(be, T->cq, dst, src, n);
}

int sl_kvt_copy_rows(sl_kv_tiers *T, bool h2d, void *dst, const void *src, size_t slot_bytes,
		     int rows)
{
	if (rows <= 0)
		return 0;
	return sl_kvt_copy(T, h2d, dst, src, (size_t)rows * slot_bytes);
}

sl_kvt_stage *sl_kvt_holding(sl_kv_tiers *T, int l, int s0)
{
	for (int i = 0; i < SL_KVT_NSTAGE; i++)
		if (T->st[i].l == l && T->st[i].s0 == s0)
			return &T->st[i];
	return NULL;
}

int sl_kvt_wait_writes(sl_kv_tiers *T, sl_kvt_stage *st)
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

static int add_wticket(sl_kvt_stage *st, uint64_t t)
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

/* Range [off, off + n) of a disk part in whole pages, onto the last of the
 * *nr ranges offs/lens (cap at most) where they touch, else a range of its
 * own: ranges given in order of offset come out as the fewest reads or
 * writes of whole pages. */
static void add_pages(size_t *offs, size_t *lens, int *nr, int cap, size_t off, size_t n)
{
	if (n == 0)
		return;
	const size_t lo = off / PAGE * PAGE, hi = align_page(off + n);
	if (*nr > 0 && lo <= offs[*nr - 1] + lens[*nr - 1]) {
		const size_t end = offs[*nr - 1] + lens[*nr - 1];
		lens[*nr - 1] += SL_MAX(hi, end) - end;
		return;
	}
	SL_ASSERT(*nr < cap);
	offs[*nr] = lo;
	lens[(*nr)++] = hi - lo;
}

int sl_kvt_load_disk(sl_kv_tiers *T, sl_kvt_stage *st, int l, int mb, int ndisk, const size_t *fill)
{
	sl_backend *be = T->p.be;
	const sl_backend_ops *o = be->ops;
	void *dst = (char *)st->buf.p + T->stage_disk_off;
	if (o->dev_is_host) { /* the disk writes into device memory */
		SL_TRY(sl_event_sync(be, st->done_ev));
	} else { /* the bounce's last copy to the device done (its writes are) */
		SL_TRY(sl_event_sync(be, st->ready_ev));
		dst = st->bounce.p;
	}
	/* the micro-batch's part of the segment (what its prefill wrote): the
	 * rows in use, as FlexGen reads its cache only up to the tokens so far
	 * (the pages past them are never read, and a page the step writes
	 * beyond them holds no row in use) */
	const size_t n = (size_t)ndisk, sb = T->sb;
	st->nrd = 0;
	for (int v = SL_KVT_K; v <= SL_KVT_V; v++)
		for (size_t j = 0; j < n; j++)
			add_pages(st->roffs, st->rlens, &st->nrd, st->nrdmax, sl_kvt_grp_off(n, sb, T->ss, v, j),
				  fill ? SL_MIN(fill[j], sb) : sb);
	add_pages(st->roffs, st->rlens, &st->nrd, st->nrdmax, sl_kvt_grp_off(n, sb, T->ss, SL_KVT_S, 0),
		  2 * n * T->ss);
	const uint64_t base = seg_off(T, l, mb);
	const int nr = st->nrd;
	st->nrd = 0; /* counts the reads issued: those a wait may name */
	for (int r = 0; r < nr; r++) {
		SL_TRY(sl_disk_read(T->disk, base + st->roffs[r], (char *)dst + st->roffs[r], st->rlens[r],
				    &st->rtickets[r]));
		st->nrd = r + 1;
		T->p.stats->disk_read_bytes += st->rlens[r];
	}
	return 0;
}

int sl_kvt_ready(sl_kv_tiers *T, sl_kvt_stage *st, sl_queue *q)
{
	sl_backend *be = T->p.be;
	const sl_backend_ops *o = be->ops;
	if (st->nrd > 0) {
		double t0 = sl_now();
		int rc = 0;
		for (int r = 0; r < st->nrd; r++) {
			const int e = sl_disk_wait(T->disk, st->rtickets[r]);
			if (e < 0 && rc == 0)
				rc = e;
		}
		T->p.stats->stall_s += sl_now() - t0;
		const int nrd = st->nrd;
		st->nrd = 0;
		SL_TRY(rc);
		for (int r = 0; r < nrd && !o->dev_is_host; r++) {
			const size_t off = T->stage_disk_off + st->roffs[r];
			SL_TRY(sl_copy_h2d(be, T->cq, (char *)st->buf.p + off, (char *)st->bounce.p + st->roffs[r],
					   st->rlens[r]));
			T->p.stats->h2d_bytes += st->rlens[r];
		}
	}
	SL_TRY(sl_event_record(be, st->ready_ev, T->cq));
	return sl_queue_wait(be, q, st->ready_ev);
}

int sl_kvt_disk_pages(sl_kv_tiers *T, sl_kvt_stage *st, int cnt)
{
	sl_backend *be = T->p.be;
	const sl_backend_ops *o = be->ops;
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
	/* coalesce into pages, in place (range nr <= i is written after range i
	 * was read) */
	int nr = 0;
	for (int i = 0; i < cnt; i++) {
		const size_t off = offs[i], len = lens[i];
		add_pages(offs, lens, &nr, cnt, off, len);
	}
	st->nr = nr;
	st->pend = SL_KVT_PEND_DISK;
	if (o->dev_is_host) /* the disk writes read the stage after done_ev */
		return 0;
	const char *base = (const char *)st->buf.p + T->stage_disk_off;
	SL_TRY(sl_queue_wait(be, T->cq, st->done_ev));
	for (int r = 0; r < nr; r++) {
		SL_TRY(sl_copy_d2h(be, T->cq, (char *)st->bounce.p + st->offs[r], base + st->offs[r],
				   st->lens[r]));
		T->p.stats->d2h_bytes += st->lens[r];
	}
	return sl_event_record(be, st->wb_ev, T->cq);
}

int sl_kvt_flush_disk(sl_kv_tiers *T, sl_kvt_stage *st)
{
	sl_backend *be = T->p.be;
	const sl_backend_ops *o = be->ops;
	st->pend = SL_KVT_PEND_NONE;
	SL_TRY(sl_event_sync(be, o->dev_is_host ? st->done_ev : st->wb_ev));
	const char *src = o->dev_is_host ? (const char *)st->buf.p + T->stage_disk_off
					  : (const char *)st->bounce.p;
	for (int r = 0; r < st->nr; r++) {
		uint64_t tk;
		SL_TRY(sl_disk_write(T->disk, seg_off(T, st->l, st->pmb) + st->offs[r], src + st->offs[r],
				     st->lens[r], &tk));
		SL_TRY(add_wticket(st, tk));
		T->p.stats->disk_write_bytes += st->lens[r];
	}
	st->nr = 0;
	return 0;
}

int sl_kvt_pass_end(sl_kv_tiers *T)
{
	int rc = 0;
	for (int i = 0; i < SL_KVT_NSTAGE; i++) {
		int w = T->disk ? sl_kvt_wait_writes(T, &T->st[i]) : 0;
		if (rc == 0)
			rc = w;
		T->st[i].l = -1; /* the next pass loads afresh */
	}
	int r = sl_queue_sync(T->p.be, T->cq);
	if (T->disk) {
		sl_disk_stats d;
		sl_disk_get_stats(T->disk, &d);
		T->p.stats->disk_busy_s += d.busy_s - T->busy_seen;
		T->busy_seen = d.busy_s;
	}
	return rc < 0 ? rc : r;
}
