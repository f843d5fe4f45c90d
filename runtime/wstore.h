/*
 * wstore.h - the weights' disk store: which file in the offload folder holds
 * the disk share of a model's weights under a placement, what it was made
 * from, and whether it still matches.
 *
 * A store is named per model, placement and dtype,
 *   <model>.<source>.w<G>-<C>[.q4][.zst].weights.sluice
 * (<model>: the checkpoint folder's name, or the --dummy name; <source>: 8
 * hex digits of the checkpoint folder's real path, or "dummy"; G and C the
 * weights' device and host percentages; .q4 for compress_weight's 4-bit
 * matrices; .zst for a store of zstd frames, offload/zseg.h, which only
 * sluice convert --zstd writes and every job then reads in place of the
 * plain store), so one folder serves several models, placements and both
 * dtypes.  Its key (the header's text, JSON) records the layout version,
 * the dtype ("f16", or "q4": the layers' matrices in common/sl_q4.h's
 * layout, biases and norms fp16), for a zstd store its level and frame
 * size ("zstd": {"level", "window"}), the placement, the shapes and the source:
 * for a checkpoint its real path, how many weight files it has and one
 * digest of every file's size, modification and change times (to the
 * nanosecond) and safetensors header; for --dummy the name and seed.  A
 * store whose key differs is out of date: sl_wstore_open replaces it.
 */
#ifndef SL_WSTORE_H
#define SL_WSTORE_H

#include "backend.h"
#include "disk_store.h"
#include "model_config.h"
#include "safetensors.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SL_WSTORE_SUFFIX ".weights.sluice"
#define SL_WSTORE_NAME_MAX 160

/*
 * The file name and key of the store for a checkpoint (dir, with its open
 * set st) or a dummy model (dir NULL, st NULL; c->name is the dummy's name)
 * under a weight placement; zstd > 0: the store of zstd frames of at most
 * window bytes written at that level.  SL_ERANGE when the key would not
 * fit a store header (a checkpoint path of thousands of bytes).
 */
int sl_wstore_ident(const char *dir, const sl_st_set *st, const sl_model_config *c, double gpu_percent,
		    double cpu_percent, bool q4, int zstd, uint32_t window, char *name, size_t name_len, char *key,
		    size_t key_len);

/* A zstd store found for a model and placement. */
typedef struct sl_wstore_zstd {
	int level;           /* its zstd level; 0: none found */
	uint32_t window;     /* its frames' largest raw bytes */
	double ratio;        /* its frames' bytes over the plain ones (sl_zseg_table_ratio) */
	uint64_t data_bytes; /* its data area */
} sl_wstore_zstd;

/*
 * The zstd store sluice convert --zstd wrote in offload_dir for this
 * model and placement, when it is complete and current: returns 1 with its
 * name, key and *z filled in (a job then opens it in place of the plain
 * store; its frame table is read for the ratio); 0 when there is none (or
 * it is incomplete, or out of date: then, unless quiet, one line on stderr
 * says so and why); SL_EFORMAT when its frame table is cut short or
 * corrupt.
 */
int sl_wstore_find_zstd(const char *offload_dir, const char *dir, const sl_st_set *st, const sl_model_config *c,
			double gpu_percent, double cpu_percent, bool q4, bool quiet, char *name, size_t name_len,
			char *key, size_t key_len, sl_wstore_zstd *z);

/*
 * sl_disk_open for a weight store (dp: its folder, name, key, size).  A
 * store of that name holding other weights (the checkpoint changed since it
 * was written, or another sluice version wrote it) is removed first, with
 * one line on stderr saying so, and a new one is made: *fresh is then true
 * and the caller writes it.  A process still reading the old store keeps
 * its copy until it closes it.
 */
int sl_wstore_open(const sl_disk_params *dp, sl_disk_store **out, bool *fresh);

enum sl_wstore_state {
	SL_WSTORE_CURRENT,    /* complete, and made from the weights as they are */
	SL_WSTORE_STALE,      /* made from weights that changed or are gone */
	SL_WSTORE_INCOMPLETE, /* writing was interrupted (or is going on now) */
	SL_WSTORE_FOREIGN,    /* a store this sluice does not read (another
				 version's, or not a store at all) */
};

typedef struct sl_wstore_entry {
	char name[256];        /* the file's name in the folder */
	uint64_t bytes;        /* the file's size */
	enum sl_wstore_state state;
	bool in_use;           /* a running job holds it open */
	bool ours;             /* a sluice store (of any version), or an empty
				  file left where one was being created */
	char what[640];        /* what it holds: "checkpoint PATH, weights G% device, C% host" */
	char why[512];         /* for a stale or foreign store: why */
} sl_wstore_entry;

/*
 * Every weight store (*.weights.sluice) in dir, sorted by name, each
 * checked against its source as it is now (a checkpoint's files are
 * opened and their identity recomputed).  *out is malloc'ed; free() it.
 */
int sl_wstore_list(const char *dir, sl_wstore_entry **out, int *n);

const char *sl_wstore_state_name(enum sl_wstore_state s);

/*
 * Write the store of a checkpoint (dir) or dummy model (dummy) under a
 * weight placement in offload_dir, ahead of a job: nothing else is loaded,
 * and the pinned memory used is the conversion's (sl_weights_convert_bytes,
 * within be's host budget).  zstd > 0: the store of zstd frames at that
 * level (the compressor's buffers, two frames and a window, outside the
 * budgets).  *written is false when a current store was there already;
 * path (its file) is filled either way.
 */
int sl_wstore_convert(sl_backend *be, const char *dir, const char *dummy, double gpu_percent,
		      double cpu_percent, bool q4, int zstd, const char *offload_dir, char *path, size_t path_len,
		      bool *written);

#endif
