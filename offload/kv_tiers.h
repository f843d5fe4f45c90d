/*
 * kv_tiers.h - the KV cache's tiers: which sequences live on the device,
 * in pinned host memory and on disk, their host homes and disk scratch
 * store, the device staging areas that bring a step's host and disk parts
 * in, the copy queue, the disk reads and page write-backs, and what they
 * moved.  It knows byte blocks, not a model: each sequence's cache of one
 * layer is a unit of a K and a V block of seq_bytes each, then (H2O) a
 * scores and a positions block of state_bytes each.  The logical cache
 * (runtime/kvcache.c: which rows are in use, which a step changed) drives
 * it with rows and byte ranges.
 *
 * Placement.  Every micro-batch of g sequences splits the same way, by
 * whole sequences, in order: the first round(g x gpu%) live on the device,
 * the next ones (up to round(g x (gpu% + cpu%))) in pinned host memory, the
 * rest on disk (FlexGen's split).  A group of n sequences (a stage's host
 * or disk part, a disk segment, a layer's host homes) is laid out
 * [K x n][V x n][S x n][P x n].  Disk segments (one per layer and
 * micro-batch) are page aligned and written in whole pages.
 *
 * Staging.  Three device areas (one computing, one loading, one storing),
 * each [host part | page alignment | disk part]; each has events for its
 * loads (ready_ev), the compute's end with it (done_ev) and its write-back
 * reaching the host (wb_ev), and the tickets of the disk writes still
 * reading from it.
 */
#ifndef SL_KV_TIERS_H
#define SL_KV_TIERS_H

#include "backend.h"
#include "disk_store.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What the KV cache moved between tiers (all caches of a model). */
typedef struct sl_kv_stats {
	double stall_s; /* compute waiting for cache loads */
	uint64_t h2d_bytes, d2h_bytes;
	uint64_t disk_read_bytes, disk_write_bytes;
	size_t disk_bytes; /* the scratch store's size */
	double disk_busy_s; /* the scratch store's busy time */
} sl_kv_stats;

/* Sequences of a micro-batch on the device, host and disk. */
typedef struct sl_kvt_split {
	int dev, host, disk;
} sl_kvt_split;

sl_kvt_split sl_kvt_split_of(int g, double gpu_percent, double cpu_percent);

/* What a placement adds up to over nseq sequences in micro-batches of gs:
 * sequences per tier, micro-batches, and the largest host and disk part of
 * a micro-batch (what one staging area and one disk segment hold). */
typedef struct sl_kvt_counts {
	int dev, host, disk, nmb, maxhost, maxdisk;
} sl_kvt_counts;

sl_kvt_counts sl_kvt_counts_of(int nseq, int gs, double gpu_percent, double cpu_percent);

/* Bytes a placement puts in each tier for n_layer layers of nseq
 * sequences in micro-batches of gs (gs <= 0 or > nseq: one), each unit
 * seq_bytes (K, V) and state_bytes (S, P; 0: none): device homes plus
 * staging, host homes (plus the disk bounce buffers and the state
 * readback where the device is not host memory), disk. */
typedef struct sl_kv_sizes {
	size_t device, host, disk;
	size_t seq_bytes;   /* one sequence's K (or V) of one layer */
	size_t state_bytes; /* H2O: its scores (or positions) of one layer */
	int dev_seqs, host_seqs, disk_seqs; /* sequences in each tier */
} sl_kv_sizes;

void sl_kvt_sizes(int n_layer, int nseq, int gs, size_t seq_bytes, size_t state_bytes,
		  double gpu_percent, double cpu_percent, bool dev_is_host, sl_kv_sizes *out);

/* The blocks of a unit, and where a group of n units holds unit j's. */
enum { SL_KVT_K, SL_KVT_V, SL_KVT_S, SL_KVT_P };
size_t sl_kvt_grp_off(size_t n, size_t seq_bytes, size_t state_bytes, int part, size_t j);

/* What the tiers are made for. */
typedef struct sl_kvt_params {
	sl_backend *be;
	int n_layer;
	int nseq, gs;              /* sequences placed; per micro-batch */
	double gpu_percent, cpu_percent;
	size_t seq_bytes, state_bytes;
	int max_ranges;            /* the most ranges a step writes back per
				      sequence and block (one per head) */
	size_t work_bytes;         /* pinned buffers the cache's user computes in
				      (cpu_cache_compute's), named work_what */
	const char *work_what;
	const char *offload_dir;   /* the scratch store's folder (disk tier) */
	const char *store_name;    /* a stem for its file's name */
	bool bind_io;              /* its I/O threads on io_node */
	int io_node;
	sl_kv_stats *stats;        /* what moves is added here */
} sl_kvt_params;

enum { SL_KVT_NSTAGE = 3 };

/* The write-back a step leaves to finish: the logical cache reads which
 * rows changed from the positions (SL_KVT_PEND_POS: on their way to the
 * host); the pages are on their way to the bounce (SL_KVT_PEND_DISK). */
enum { SL_KVT_PEND_NONE, SL_KVT_PEND_POS, SL_KVT_PEND_DISK };

typedef struct sl_kvt_stage {
	sl_buf buf;      /* device: host part | page | disk part */
	sl_buf bounce;   /* pinned disk segment (device not host memory) */
	int l, s0;       /* what it holds, or l = -1 */
	bool prefill;
	int nrd;            /* disk reads pending into it (sl_kvt_load_disk) */
	size_t *roffs, *rlens; /* their ranges in the disk part, room for nrdmax */
	uint64_t *rtickets;
	int nrdmax;
	uint64_t *wticket; /* disk writes still reading from buf / bounce */
	int nw, wcap;
	sl_event *done_ev;  /* compute finished with the stage */
	sl_event *ready_ev; /* loads landed */
	int pend;           /* SL_KVT_PEND_* */
	int pmb, pg;        /* the pending step's micro-batch and sequences */
	sl_event *wb_ev;    /* the positions or pages landed on the host */
	size_t *offs, *lens; /* disk part byte ranges, room for nrmax */
	int nr, nrmax;
} sl_kvt_stage;

typedef struct sl_kv_tiers {
	sl_kvt_params p;
	sl_kvt_split full; /* split of a whole micro-batch */
	int nmb;           /* micro-batches */
	size_t sb, ss;     /* seq_bytes, state_bytes */
	sl_buf host;       /* pinned homes: [layer][K|V|S|P][host index] */
	int nhost;         /* host-tier sequences in all */
	sl_disk_store *disk;
	size_t seg_bytes;  /* one (layer, micro-batch) disk segment, page aligned */
	size_t stage_disk_off; /* a stage's disk part, after its host part */
	sl_queue *cq;      /* the copy queue */
	sl_kvt_stage st[SL_KVT_NSTAGE];
	int cur;           /* the stage of the step in progress */
	sl_buf work;       /* pinned, p.work_bytes */
	sl_buf readback;   /* a micro-batch's state blocks on the host (device
			      not host memory, state_bytes > 0) */
	double busy_seen;  /* the store's busy time already counted */
} sl_kv_tiers;

/* Make the homes, the scratch store (unlinked at once), the copy queue
 * and the staging areas; SL_EINVAL when a disk part has no offload_dir. */
int sl_kvt_create(const sl_kvt_params *p, sl_kv_tiers **out);
void sl_kvt_free(sl_kv_tiers *T);

/* The split of micro-batch mb as placed (b: fixes every offset), and of
 * the first g of its sequences that a block runs (p: the counts).  A
 * sequence's tier depends on its index only, never on the block size. */
void sl_kvt_mb_split(const sl_kv_tiers *T, int mb, int g, sl_kvt_split *b, sl_kvt_split *p);

/* Host home of block part of host-tier sequence hi in layer l. */
char *sl_kvt_home(const sl_kv_tiers *T, int l, size_t hi, int part);
/* Where in stage st's host (disk) part of n sequences unit j's part is. */
char *sl_kvt_stage_host(const sl_kv_tiers *T, const sl_kvt_stage *st, int n, int part, size_t j);
char *sl_kvt_stage_disk(const sl_kv_tiers *T, const sl_kvt_stage *st, int n, int part, size_t j);

/* Copy n bytes between a home or readback and the device on the copy
 * queue, counted; rows x slot_bytes for copy_rows (nothing for rows <= 0). */
int sl_kvt_copy(sl_kv_tiers *T, bool h2d, void *dst, const void *src, size_t n);
int sl_kvt_copy_rows(sl_kv_tiers *T, bool h2d, void *dst, const void *src, size_t slot_bytes,
		     int rows);

/* The stage that holds step (l, s0), or NULL. */
sl_kvt_stage *sl_kvt_holding(sl_kv_tiers *T, int l, int s0);

/* Wait for the disk writes still reading from st. */
int sl_kvt_wait_writes(sl_kv_tiers *T, sl_kvt_stage *st);

/* Start reading the first ndisk units of micro-batch mb's disk segment of
 * layer l into st (through its bounce where the device is not host memory:
 * after its last copy to the device): of unit j's K and V blocks the first
 * fill[j] bytes (the rows in use; fill NULL: the blocks whole), the state
 * blocks whole, in whole pages, adjacent ones read together. */
int sl_kvt_load_disk(sl_kv_tiers *T, sl_kvt_stage *st, int l, int mb, int ndisk, const size_t *fill);

/* st's loads complete and visible to queue q. */
int sl_kvt_ready(sl_kv_tiers *T, sl_kvt_stage *st, sl_queue *q);

/* The pages holding byte ranges st->offs[i], st->lens[i] (i < cnt) of st's
 * disk part, sorted and coalesced in place; where the device is not host
 * memory they are copied to the bounce after the compute (done_ev), wb_ev
 * following them.  Leaves st pending (SL_KVT_PEND_DISK) for
 * sl_kvt_flush_disk. */
int sl_kvt_disk_pages(sl_kv_tiers *T, sl_kvt_stage *st, int cnt);
/* Once the pages are on the host, write them to step (st->l, st->pmb)'s
 * segment. */
int sl_kvt_flush_disk(sl_kv_tiers *T, sl_kvt_stage *st);

/* After a pass (every stage flushed): its disk writes done, the copy
 * queue drained, the store's busy time counted.  The next pass loads
 * afresh. */
int sl_kvt_pass_end(sl_kv_tiers *T);

#endif
