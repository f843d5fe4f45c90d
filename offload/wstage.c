/*
 * wstage.c - weight staging: two device slots, the copy queue that fills
 * them from the host tier, the disk reads (through pinned bounce buffers
 * where device memory is not host memory), and the events that order the
 * copies after the compute that reads a slot and before the compute that
 * reads it next.
 */
#include "wstage.h"

#include <stdlib.h>
#include <string.h>

/* A staging slot: one unit's streamed bytes on the device. */
typedef struct wslot {
	sl_buf buf;       /* device */
	sl_buf bounce;    /* pinned, disk part (backends whose device is not host) */
	int layer;        /* held, or -1 */
	int unit;         /* enum sl_unit held */
	bool disk_pending;
	uint64_t ticket;
	sl_event *free_ev, *ready_ev;
} wslot;

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
};

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
		if (!rc)
			rc = sl_event_create(b, &w->free_ev);
		if (!rc)
			rc = sl_event_create(b, &w->ready_ev);
	}
	if (!rc)
		rc = sl_queue_create(b, &s->copy_q);
	if (rc) {
		sl_wstage_free(s);
		return rc;
	}
	*out = s;
	return 0;
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
		if (w->disk_pending) {
			/* a prefetch never acquired (units acquired out of
			 * schedule order) may still be reading there: it
			 * lands first (never the case in schedule order) */
			w->disk_pending = false;
			SL_TRY(sl_disk_wait(s->disk, w->ticket));
		}
		if (!b->ops->dev_is_host) {
			/* the bounce buffer's last copy to the device must be done */
			SL_TRY(sl_event_sync(b, w->ready_ev));
			dst = w->bounce.p;
		} else {
			/* the disk writes into device memory: compute must be done */
			SL_TRY(sl_event_sync(b, w->free_ev));
		}
		SL_TRY(sl_disk_read(s->disk, h->disk_off + x->disk_off, dst, x->disk_len, &w->ticket));
		w->disk_pending = true;
		s->stats->disk_read_bytes += x->disk_len;
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
		int rc = sl_disk_wait(s->disk, w->ticket);
		s->stats->stall_s += sl_now() - t0;
		w->disk_pending = false;
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
	for (int k = 0; k < 2; k++) {
		wslot *w = &s->slot[k];
		if (w->disk_pending)
			sl_disk_wait(s->disk, w->ticket);
		sl_buf_free(b, &w->buf);
		sl_buf_free(b, &w->bounce);
		if (w->free_ev)
			sl_event_free(b, w->free_ev);
		if (w->ready_ev)
			sl_event_free(b, w->ready_ev);
	}
	if (s->copy_q)
		sl_queue_free(b, s->copy_q);
	free(s->home);
	free(s);
}
