/*
 * wstage.h - weight staging: the units of a model's layers that live off
 * the device (in pinned host memory, on disk) brought into two device
 * slots, one unit at a time, the next one loading while this one computes.
 *
 * The engine knows no model.  Its user (runtime/weights.c for OPT) decides
 * where each tensor lives and gives the engine plain ranges: per kind of
 * unit, which bytes of a layer's host home and of its disk segment it
 * streams, and where its disk part starts in a slot; per layer, its host
 * home and the offset of its disk segment in the store.  Every layer has
 * the same layout.  The engine owns the slots, the disk bounce buffers,
 * the slots' events and the copy queue; it borrows the backend, the disk
 * store and the counters it adds to.
 *
 * Errors follow sl_common.h: 0 or a negative SL_E* code with a message.
 */
#ifndef SL_WSTAGE_H
#define SL_WSTAGE_H

#include "backend.h"
#include "disk_store.h"
#include "zseg.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What one acquire brings: a layer's attention half, its MLP half, or the
 * whole layer.  Weights streamed by halves stage one half at a time, so a
 * staging slot holds the larger half's streamed bytes instead of the
 * layer's, and the MLP half loads while the attention half computes. */
enum sl_unit { SL_UNIT_ATTN, SL_UNIT_MLP, SL_UNIT_LAYER };
/* The units alternate attention, MLP, attention, ..., so a slot per kind
 * still double-buffers: the MLP half loads while the attention computes
 * and the next attention half while the MLP computes, and the two slots
 * together hold one layer's streamed bytes instead of two. */

/* The streamed part of one kind of unit, the same in every layer. */
typedef struct sl_wstage_unit {
	size_t host_off, host_len; /* its range of a layer's host home */
	size_t disk_off, disk_len; /* its range of a layer's disk segment (page aligned) */
	size_t stage_disk;         /* where its disk part starts in a slot: after its
				      host part, page aligned (for O_DIRECT) */
} sl_wstage_unit;

/* Where one layer's streamed bytes live. */
typedef struct sl_wstage_home {
	const void *host;  /* pinned host home (units' host ranges), or NULL */
	uint64_t disk_off; /* offset of the layer's segment in the store */
} sl_wstage_home;

/* Movement counters: the engine adds its loads to them; the caller resets
 * them (a run's) and adds what writing the store took. */
typedef struct sl_weight_stats {
	double stall_s;        /* compute waiting for weights */
	uint64_t h2d_bytes;    /* host tier to device */
	uint64_t disk_read_bytes, disk_write_bytes;
	int loads;             /* unit loads */
} sl_weight_stats;

typedef struct sl_wstage_params {
	int n_layer;
	bool halves;           /* units are halves (ATTN, MLP), else whole layers (LAYER) */
	bool overlap;          /* load the next unit while this one computes */
	sl_wstage_unit unit[3];      /* by enum sl_unit */
	const sl_wstage_home *home;  /* n_layer of them; copied */
	sl_disk_store *disk;         /* borrowed; needed when a unit has a disk part */
	const sl_zseg_table *zt;     /* borrowed: the store holds zstd frames of
					these units' disk parts (sluice convert
					--zstd); NULL: plain bytes */
	sl_weight_stats *stats;      /* borrowed; NULL: the engine's own */
} sl_wstage_params;

typedef struct sl_wstage sl_wstage;

/* The sizes of slot k (0 or 1) under a layout: device bytes, and the
 * pinned bounce buffer's (its unit's disk part) for a backend whose device
 * memory is not host memory.  By halves slot 0 holds attention halves and
 * slot 1 MLP halves, each sized for its half; else both hold whole layers. */
void sl_wstage_slot_bytes(const sl_wstage_unit unit[3], bool halves, int k, size_t *dev,
			  size_t *bounce);

/* From a store of zstd frames of at most window raw bytes: the host bytes
 * the engine takes for them (counted in the host budget): each slot's
 * compressed frames (its unit's disk part) and a window of scratch per
 * decompression thread (sl_wstage_zstd_threads). */
size_t sl_wstage_zstd_bytes(const sl_wstage_unit unit[3], bool halves, uint32_t window);
/* The engine's decompression threads: one per OpenMP thread. */
int sl_wstage_zstd_threads(void);

/* Allocate the slots (device), the bounce buffers (pinned host, where the
 * device is not the host), from a zstd store the frames' buffers
 * (sl_wstage_zstd_bytes, host), their events and the copy queue.  SL_EINVAL for
 * a layout the engine cannot stream (a disk part without a store, or not
 * page aligned; a host part without a home). */
int sl_wstage_create(sl_backend *b, const sl_wstage_params *p, sl_wstage **out);

/*
 * The device buffer holding unit u (enum sl_unit) of layer l in *slot: its
 * host part at [0, host_len), its disk part at [stage_disk, stage_disk +
 * disk_len).  Units are acquired by halves when the engine streams halves,
 * whole otherwise (SL_EINVAL).  With overlap, acquiring a unit starts
 * loading the next one (the MLP half after the attention half, then the
 * next layer, wrapping to layer 0) into the other slot.  compute is the
 * queue that will read the slot; release after the unit's work is issued
 * there.
 */
int sl_wstage_acquire(sl_wstage *s, sl_queue *compute, int l, int u, void **slot);
int sl_wstage_release(sl_wstage *s, sl_queue *compute, int l, int u);

/* Wait for loads in flight and free everything the engine owns.  NULL ok. */
void sl_wstage_free(sl_wstage *s);

#endif
