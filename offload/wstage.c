/*
 * wstage.c - weight staging: two device slots, the copy queue that fills
 * them from the host tier, the disk reads (through pinned bounce buffers
 * where device memory is not host memory), and the events that order the
 * copies after the compute that reads a slot and before the compute that
 * reads it next.
 *
 * From a store of zstd frames (zseg.h) a unit's disk part is read frame by
 * frame, the compressed ones into a buffer of their own, and the engine's
 * decompression threads take the frames in the order they were issued:
 * each waits for its frame's read and decompresses it into place as soon
 * as it has landed, while the next frames read and the compute goes on.
 * Acquiring the unit waits only for what is still undone (usually the
 * last frames).  The threads are the engine's own (one per OpenMP thread,
 * each with a zstd context and a window of scratch), asleep while no
 * frame is pending.
 */
#include "wstage.h"

#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

/* A staging slot: one unit's streamed bytes on the device. */
typedef struct wslot {
	sl_buf buf;       /* device */
	sl_buf bounce;    /* pinned, disk part (backends whose device is not host) */
	int layer;        /* held, or -1 */
	int unit;         /* enum sl_unit held */
	bool disk_pending;
	uint64_t ticket;
	sl_event *free_ev, *ready_ev;
	/* zstd frames: one read per frame, the compressed frames into zbuf
	 * at their windows' offsets in the unit; each frame a job of the
	 * decompression threads */
	int njob;
	struct zjob *jobs;
	sl_buf zbuf;
	int zpending;     /* jobs not yet done (z_mu) */
	int zrc;          /* the first failure among them (z_mu) */
	char zmsg[512];   /* its message */
} wslot;

/* One frame of a unit's load: wait for its read, then (clen > 0)
 * decompress it from src into dst. */
typedef struct zjob {
	wslot *w;
	uint64_t ticket;
	const unsigned char *src;
	uint32_t clen;
	void *dst;
	size_t n;
	int layer, frame;
} zjob;

struct sl_wstage {
	sl_backend *b;
	int n_layer;
	bool halves, overlap;
	sl_wstage_unit unit[3];
	sl_wstage_home *home; /* n_layer */
	sl_disk_store *disk;
	sl_weight_stats *stats;
	sl_weight_stats own;  /* stats when the caller gave none */
	sl_queue *copy_q;
	wslot slot[2];        /* by halves, slot 0 holds attention halves and
				 slot 1 MLP halves, each sized for its half */
	const sl_zseg_table *zt; /* the store's frames, or NULL */
	int nthreads;            /* decompressing threads: a context and a
				    window of scratch each */
	ZSTD_DCtx **dctx;
	sl_buf zscratch;
	pthread_t *zthreads;
	int zstarted;            /* threads running */
	/* the jobs waiting for a thread, in issue order: a ring of
	 * pointers into the slots' job arrays */
	pthread_mutex_t z_mu;
	pthread_cond_t z_work, z_done;
	bool z_sync, z_stop;
	zjob **zq;
	int zq_cap, zq_head, zq_len;
};

typedef struct zarg {
	sl_wstage *s;
	int id;
} zarg;

static size_t page_up(size_t n)
{
	return (n + SL_DISK_ALIGN - 1) / SL_DISK_ALIGN * SL_DISK_ALIGN;
}

static bool page_aligned(size_t n)
{
	return n % SL_DISK_ALIGN == 0;
}

void sl_wstage_slot_bytes(const sl_wstage_unit unit[3], bool halves, int k, size_t *dev,
			  size_t *bounce)
{
	const int u = halves ? k : SL_UNIT_LAYER;
	*dev = unit[u].stage_disk + unit[u].disk_len;
	*bounce = unit[u].disk_len;
}

int sl_wstage_zstd_threads(void)
{
	return SL_MAX(1, omp_get_max_threads());
}

size_t sl_wstage_zstd_bytes(const sl_wstage_unit unit[3], bool halves, uint32_t window)
{
	size_t n = 0;
	for (int k = 0; k < 2; k++) {
		size_t dev, frames;
		sl_wstage_slot_bytes(unit, halves, k, &dev, &frames);
		n += frames;
	}
	return n ? n + (size_t)sl_wstage_zstd_threads() * window : 0;
}

static int check_params(const sl_wstage_params *p)
{
	if (p->n_layer < 1 || !p->home)
		return sl_err(SL_EINVAL, "weight staging: %d layers, homes %s", p->n_layer,
			      p->home ? "given" : "missing");
	for (int u = 0; u < 3; u++) {
		const sl_wstage_unit *x = &p->unit[u];
		if (x->disk_len && !p->disk)
			return sl_err(SL_EINVAL, "weight staging: unit %d has %zu bytes on disk but no store",
				      u, x->disk_len);
		if (!page_aligned(x->disk_off) || !page_aligned(x->disk_len) ||
		    !page_aligned(x->stage_disk) || x->stage_disk < x->host_len)
			return sl_err(SL_EINVAL,
				      "weight staging: unit %d's disk part (offset %zu, %zu bytes, at %zu in "
				      "a slot after %zu host bytes) is not page aligned after its host part",
				      u, x->disk_off, x->disk_len, x->stage_disk, x->host_len);
		for (int l = 0; l < p->n_layer && x->host_len; l++)
			if (!p->home[l].host)
				return sl_err(SL_EINVAL, "weight staging: layer %d has no host home", l);
		for (int l = 0; l < p->n_layer && x->disk_len; l++)
			if (!page_aligned(p->home[l].disk_off))
				return sl_err(SL_EINVAL, "weight staging: layer %d's disk segment at %llu is not "
					      "page aligned", l, (unsigned long long)p->home[l].disk_off);
	}
	return 0;
}

static int zpool_start(sl_wstage *s);

int sl_wstage_create(sl_backend *b, const sl_wstage_params *p, sl_wstage **out)
{
	*out = NULL;
	SL_TRY(check_params(p));
	sl_wstage *s = calloc(1, sizeof *s);
	if (!s)
		return sl_err(SL_ENOMEM, "out of memory");
	s->b = b;
	s->n_layer = p->n_layer;
	s->halves = p->halves;
	s->overlap = p->overlap;
	memcpy(s->unit, p->unit, sizeof s->unit);
	s->disk = p->disk;
	s->zt = p->zt;
	s->stats = p->stats ? p->stats : &s->own;
	for (int k = 0; k < 2; k++)
		s->slot[k].layer = s->slot[k].unit = -1;
	int rc = 0;
	s->home = malloc((size_t)p->n_layer * sizeof *s->home);
	if (!s->home)
		rc = sl_err(SL_ENOMEM, "out of memory");
	else
		memcpy(s->home, p->home, (size_t)p->n_layer * sizeof *s->home);
	for (int k = 0; k < 2 && !rc; k++) {
		wslot *w = &s->slot[k];
		size_t bytes, bounce_bytes;
		sl_wstage_slot_bytes(s->unit, s->halves, k, &bytes, &bounce_bytes);
		rc = sl_buf_alloc(b, SL_MEM_DEVICE, bytes, "weight staging", &w->buf);
		if (!rc && bounce_bytes && !b->ops->dev_is_host)
			rc = sl_buf_alloc(b, SL_MEM_HOST, bounce_bytes, "disk bounce buffer", &w->bounce);
		if (!rc && s->zt && bounce_bytes) {
			int f0, f1;
			const sl_wstage_unit *x = &s->unit[s->halves ? k : SL_UNIT_LAYER];
			sl_zseg_frames_in(s->zt, x->disk_off, x->disk_len, &f0, &f1);
			const int nf = f1 > f0 ? f1 - f0 : 1;
			w->jobs = calloc((size_t)nf, sizeof *w->jobs);
			s->zq_cap += nf;
			if (!w->jobs)
				rc = sl_err(SL_ENOMEM, "out of memory");
			else
				rc = sl_buf_alloc(b, SL_MEM_HOST, bounce_bytes, "zstd frames", &w->zbuf);
		}
		if (!rc)
			rc = sl_event_create(b, &w->free_ev);
		if (!rc)
			rc = sl_event_create(b, &w->ready_ev);
	}
	if (!rc)
		rc = sl_queue_create(b, &s->copy_q);
	if (!rc && s->zt)
		rc = zpool_start(s);
	if (rc) {
		sl_wstage_free(s);
		return rc;
	}
	*out = s;
	return 0;
}

/* A decompression thread: takes the jobs in issue order, waits for each
 * one's read and decompresses it into place; the first failure of a
 * slot's jobs is kept for its wait, and the slot's later jobs are only
 * waited for (their reads must land before the slot is reused). */
static void *zworker(void *arg)
{
	sl_wstage *s = ((zarg *)arg)->s;
	const int id = ((zarg *)arg)->id;
	free(arg);
	unsigned char *scratch = (unsigned char *)s->zscratch.p + (size_t)id * s->zt->window;
	pthread_mutex_lock(&s->z_mu);
	for (;;) {
		while (!s->zq_len && !s->z_stop)
			pthread_cond_wait(&s->z_work, &s->z_mu);
		if (!s->zq_len)
			break; /* stopping, nothing left */
		zjob *j = s->zq[s->zq_head];
		s->zq_head = (s->zq_head + 1) % s->zq_cap;
		s->zq_len--;
		const bool skip = j->w->zrc < 0;
		pthread_mutex_unlock(&s->z_mu);
		int r = sl_disk_wait(s->disk, j->ticket);
		if (r == 0 && j->clen && !skip)
			r = sl_zseg_decompress(s->dctx[id], j->src, j->clen, scratch, j->dst, j->n,
					       sl_disk_path(s->disk), j->layer, j->frame);
		char msg[512] = "";
		if (r < 0)
			snprintf(msg, sizeof msg, "%s", sl_errmsg()); /* the message is per thread */
		pthread_mutex_lock(&s->z_mu);
		wslot *w = j->w;
		if (r < 0 && w->zrc == 0) {
			w->zrc = r;
			memcpy(w->zmsg, msg, sizeof msg);
		}
		if (--w->zpending == 0)
			pthread_cond_broadcast(&s->z_done);
	}
	pthread_mutex_unlock(&s->z_mu);
	return NULL;
}

/* The decompression threads, their contexts and scratch, and the queue
 * (zq_cap: every slot's frames). */
static int zpool_start(sl_wstage *s)
{
	s->nthreads = sl_wstage_zstd_threads();
	SL_TRY(sl_buf_alloc(s->b, SL_MEM_HOST, (size_t)s->nthreads * s->zt->window, "zstd scratch",
			    &s->zscratch));
	s->dctx = calloc((size_t)s->nthreads, sizeof *s->dctx);
	s->zthreads = calloc((size_t)s->nthreads, sizeof *s->zthreads);
	s->zq = calloc((size_t)SL_MAX(1, s->zq_cap), sizeof *s->zq);
	for (int t = 0; t < s->nthreads && s->dctx; t++)
		if (!(s->dctx[t] = ZSTD_createDCtx()))
			break;
	if (!s->dctx || !s->zthreads || !s->zq || !s->dctx[s->nthreads - 1])
		return sl_err(SL_ENOMEM, "out of memory for %d zstd decompression contexts", s->nthreads);
	if (pthread_mutex_init(&s->z_mu, NULL) != 0)
		return sl_err(SL_ENOMEM, "weight staging: cannot create a mutex");
	if (pthread_cond_init(&s->z_work, NULL) != 0) {
		pthread_mutex_destroy(&s->z_mu);
		return sl_err(SL_ENOMEM, "weight staging: cannot create a condition variable");
	}
	if (pthread_cond_init(&s->z_done, NULL) != 0) {
		pthread_cond_destroy(&s->z_work);
		pthread_mutex_destroy(&s->z_mu);
		return sl_err(SL_ENOMEM, "weight staging: cannot create a condition variable");
	}
	s->z_sync = true;
	for (int t = 0; t < s->nthreads; t++) {
		zarg *a = malloc(sizeof *a);
		if (!a)
			return sl_err(SL_ENOMEM, "out of memory");
		*a = (zarg){ s, t };
		int e = pthread_create(&s->zthreads[t], NULL, zworker, a);
		if (e) {
			free(a);
			return sl_err(SL_ENOMEM, "weight staging: cannot start a zstd decompression thread "
				      "(%s)", strerror(e));
		}
		s->zstarted++;
	}
	return 0;
}

/* Stop the decompression threads once their queue is empty. */
static void zpool_stop(sl_wstage *s)
{
	if (!s->z_sync)
		return;
	pthread_mutex_lock(&s->z_mu);
	s->z_stop = true;
	pthread_cond_broadcast(&s->z_work);
	pthread_mutex_unlock(&s->z_mu);
	for (int t = 0; t < s->zstarted; t++)
		pthread_join(s->zthreads[t], NULL);
	pthread_cond_destroy(&s->z_done);
	pthread_cond_destroy(&s->z_work);
	pthread_mutex_destroy(&s->z_mu);
	s->z_sync = false;
}

/* Wait for slot w's disk reads and, from a zstd store, their frames'
 * decompression (the first failure is returned). */
static int wait_disk(sl_wstage *s, wslot *w)
{
	if (!w->disk_pending)
		return 0;
	w->disk_pending = false;
	if (!s->zt)
		return sl_disk_wait(s->disk, w->ticket);
	pthread_mutex_lock(&s->z_mu);
	while (w->zpending > 0)
		pthread_cond_wait(&s->z_done, &s->z_mu);
	const int rc = w->zrc;
	w->zrc = 0;
	pthread_mutex_unlock(&s->z_mu);
	w->njob = 0;
	return rc < 0 ? sl_err(rc, "%s", w->zmsg) : 0;
}

/* The reads of unit x's frames of layer l (home h): the raw ones straight
 * into dst, the compressed ones into the slot's zbuf, each at its
 * window's offset in the unit; each frame then goes to the decompression
 * threads (a raw one only to be waited for). */
static int read_frames(sl_wstage *s, wslot *w, const sl_wstage_unit *x, const sl_wstage_home *h, int l,
		       void *dst)
{
	const sl_zseg_table *t = s->zt;
	const uint32_t *cl = t->clen + (size_t)l * (size_t)t->nframes;
	int f0, f1;
	sl_zseg_frames_in(t, x->disk_off, x->disk_len, &f0, &f1);
	w->disk_pending = true;
	w->njob = 0;
	int rc = 0;
	for (int f = f0; f < f1 && !rc; f++) {
		uint64_t off;
		size_t n;
		sl_zseg_frame(t->seg, t->split, t->window, f, &off, &n);
		const size_t pos = (size_t)(off - x->disk_off);
		zjob *j = &w->jobs[w->njob];
		*j = (zjob){ .w = w, .src = (unsigned char *)w->zbuf.p + pos, .clen = cl[f], .dst = (char *)dst + pos, .n = n,
			     .layer = l, .frame = f };
		void *into = cl[f] ? (void *)((unsigned char *)w->zbuf.p + pos) : j->dst;
		const size_t len = cl[f] ? page_up(cl[f]) : n;
		rc = sl_disk_read(s->disk, h->disk_off + off, into, len, &j->ticket);
		if (rc)
			break;
		w->njob++;
		s->stats->disk_read_bytes += len;
		pthread_mutex_lock(&s->z_mu);
		w->zpending++;
		s->zq[(s->zq_head + s->zq_len++) % s->zq_cap] = j;
		pthread_cond_signal(&s->z_work);
		pthread_mutex_unlock(&s->z_mu);
	}
	return rc;
}

/* Issue the loads of unit u of layer l into slot k: the host part by copy
 * (LOAD_HOST), the disk part by an asynchronous read (LOAD_DISK). */
enum { LOAD_HOST = 1, LOAD_DISK = 2 };
static int start_load(sl_wstage *s, int k, int l, int u, int parts)
{
	sl_backend *b = s->b;
	wslot *w = &s->slot[k];
	const sl_wstage_unit *x = &s->unit[u];
	const sl_wstage_home *h = &s->home[l];
	w->layer = l;
	w->unit = u;
	if ((parts & LOAD_HOST) && x->host_len) {
		/* not before the compute queue is done with what the slot holds */
		SL_TRY(sl_queue_wait(b, s->copy_q, w->free_ev));
		SL_TRY(sl_copy_h2d(b, s->copy_q, w->buf.p, (const char *)h->host + x->host_off,
				   x->host_len));
		s->stats->h2d_bytes += x->host_len;
	}
	if ((parts & LOAD_DISK) && x->disk_len) {
		void *dst = (char *)w->buf.p + x->stage_disk;
		/* a prefetch never acquired (units acquired out of schedule
		 * order) may still be reading there: it lands first (never
		 * the case in schedule order) */
		SL_TRY(wait_disk(s, w));
		if (!b->ops->dev_is_host) {
			/* the bounce buffer's last copy to the device must be done */
			SL_TRY(sl_event_sync(b, w->ready_ev));
			dst = w->bounce.p;
		} else {
			/* the disk writes into device memory: compute must be done */
			SL_TRY(sl_event_sync(b, w->free_ev));
		}
		if (s->zt) {
			SL_TRY(read_frames(s, w, x, h, l, dst));
		} else {
			SL_TRY(sl_disk_read(s->disk, h->disk_off + x->disk_off, dst, x->disk_len, &w->ticket));
			w->disk_pending = true;
			s->stats->disk_read_bytes += x->disk_len;
		}
	}
	return 0;
}

/* Make slot k's loads complete and visible to the compute queue. */
static int finish_load(sl_wstage *s, sl_queue *compute, int k)
{
	sl_backend *b = s->b;
	wslot *w = &s->slot[k];
	if (w->disk_pending) {
		double t0 = sl_now();
		int rc = wait_disk(s, w);
		s->stats->stall_s += sl_now() - t0;
		SL_TRY(rc);
		if (!b->ops->dev_is_host) {
			/* into the slot: not before the compute queue is done
			 * with what it holds (a unit without a host part issued
			 * no such wait in start_load) */
			const sl_wstage_unit *x = &s->unit[w->unit];
			SL_TRY(sl_queue_wait(b, s->copy_q, w->free_ev));
			SL_TRY(sl_copy_h2d(b, s->copy_q, (char *)w->buf.p + x->stage_disk, w->bounce.p,
					   x->disk_len));
			s->stats->h2d_bytes += x->disk_len;
		}
	}
	SL_TRY(sl_event_record(b, w->ready_ev, s->copy_q));
	return sl_queue_wait(b, compute, w->ready_ev);
}

static int slot_holding(const sl_wstage *s, int l, int u)
{
	for (int k = 0; k < 2; k++)
		if (s->slot[k].layer == l && s->slot[k].unit == u)
			return k;
	return -1;
}

static int check_unit(const sl_wstage *s, int l, int u)
{
	if (l < 0 || l >= s->n_layer || u < SL_UNIT_ATTN || u > SL_UNIT_LAYER)
		return sl_err(SL_EINVAL, "weights of layer %d, unit %d: no such unit (%d layers)", l, u,
			      s->n_layer);
	if ((u == SL_UNIT_LAYER) == s->halves)
		return sl_err(SL_EINVAL, "weights streamed %s cannot be acquired %s",
			      s->halves ? "by halves" : "whole", s->halves ? "whole" : "by halves");
	return 0;
}

int sl_wstage_acquire(sl_wstage *s, sl_queue *compute, int l, int u, void **slot)
{
	SL_TRY(check_unit(s, l, u));
	/* the units in schedule order: index 2l + u by halves, else l */
	const int idx = s->halves ? 2 * l + u : l;
	int k = slot_holding(s, l, u);
	if (k < 0) { /* not prefetched (first unit, or no overlap) */
		k = idx % 2;
		double t0 = sl_now();
		SL_TRY(start_load(s, k, l, u, LOAD_HOST | LOAD_DISK));
		s->stats->loads++;
		s->stats->stall_s += sl_now() - t0;
	}
	/* the next unit into the other slot (free: its unit was released
	 * before this acquire).  Its disk read is queued before waiting for
	 * this unit's, so the disk never drains between units; its host
	 * copies follow this unit's ready event on the copy queue. */
	const int units = s->halves ? 2 * s->n_layer : s->n_layer;
	const int next = (idx + 1) % units;
	const int nl = s->halves ? next / 2 : next, nu = s->halves ? next % 2 : SL_UNIT_LAYER;
	const bool pre = s->overlap && units > 1 && slot_holding(s, nl, nu) < 0;
	if (pre) {
		SL_TRY(start_load(s, !k, nl, nu, LOAD_DISK));
		s->stats->loads++;
	}
	SL_TRY(finish_load(s, compute, k));
	if (pre)
		SL_TRY(start_load(s, !k, nl, nu, LOAD_HOST));
	*slot = s->slot[k].buf.p;
	return 0;
}

int sl_wstage_release(sl_wstage *s, sl_queue *compute, int l, int u)
{
	int k = slot_holding(s, l, u);
	if (k < 0)
		return sl_err(SL_EINVAL, "weights of layer %d released but not acquired", l);
	SL_TRY(sl_event_record(s->b, s->slot[k].free_ev, compute));
	if (!s->overlap)
		s->slot[k].layer = -1; /* load again next time: nothing kept ahead */
	return 0;
}

void sl_wstage_free(sl_wstage *s)
{
	if (!s)
		return;
	sl_backend *b = s->b;
	if (s->copy_q)
		sl_queue_sync(b, s->copy_q);
	for (int k = 0; k < 2; k++)
		wait_disk(s, &s->slot[k]);
	zpool_stop(s);
	for (int k = 0; k < 2; k++) {
		wslot *w = &s->slot[k];
		free(w->jobs);
		sl_buf_free(b, &w->zbuf);
		sl_buf_free(b, &w->buf);
		sl_buf_free(b, &w->bounce);
		if (w->free_ev)
			sl_event_free(b, w->free_ev);
		if (w->ready_ev)
			sl_event_free(b, w->ready_ev);
	}
	if (s->copy_q)
		sl_queue_free(b, s->copy_q);
	for (int t = 0; t < s->nthreads && s->dctx; t++)
		ZSTD_freeDCtx(s->dctx[t]);
	free(s->dctx);
	sl_buf_free(b, &s->zscratch);
	free(s->zthreads);
	free(s->zq);
	free(s->home);
	free(s);
}
