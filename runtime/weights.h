/*
 * weights.h - a model's weights (OPT, or the LLaMA family: Llama, Mistral,
 * Qwen2) in a backend's device memory (fp16): loaded from safetensors
 * (fp32/fp16/bf16, one file or sharded, with or without the "model."
 * prefix, tied or stored LM head) or made up deterministically (--dummy)
 * without reading a file.  fp32 and bf16 values are rounded to fp16 to
 * nearest, ties to even (sl_float_to_half); a bf16 value in fp16's normal
 * range (2^-14 to 65504 in magnitude) converts exactly, as bf16 has fewer
 * mantissa bits, so only values under 2^-14 lose bits (rounded to fp16's
 * subnormals) and a value beyond 65504 is refused naming the tensor.  Where each tensor
 * lives is decided here (FlexGen's rule); moving the streamed ones onto
 * the device is offload/wstage.h's.
 */
#ifndef SL_WEIGHTS_H
#define SL_WEIGHTS_H

#include "backend.h"
#include "disk_store.h"
#include "model_config.h"
#include "safetensors.h"
#include "wstage.h" /* the staging engine; enum sl_unit, sl_weight_stats */

#include <signal.h>

/* A matrix placed in two or three tiers (sl_weight_place) is split by
 * rows: its rows from row on are at rest, a matrix of their own (fp16, or
 * sl_q4's layout of those rows); the rows before are at first, the
 * matrix's pointer in the view (model.c: layer_linear). */
typedef struct sl_wcut {
	const sl_half *first;
	int row;
	const sl_half *rest;
} sl_wcut;

/* One decoder layer's tensors; those its family lacks are NULL. */
typedef struct sl_layer_w {
	/* q (q_dim, h), k and v (kv_dim, h), o (h, q_dim) (OPT: all (h, h));
	 * biases: OPT's all four, Qwen2's q, k, v, the others' none */
	sl_half *q_w, *q_b, *k_w, *k_b, *v_w, *v_b, *o_w, *o_b;
	sl_half *ln1_g, *ln1_b; /* self_attn_layer_norm; LLaMA: input_layernorm (gain only) */
	sl_half *fc1_w, *fc1_b; /* OPT: (f, h), (f) */
	sl_half *fc2_w, *fc2_b; /* OPT: (h, f), (h) */
	sl_half *gate_w, *up_w; /* LLaMA: (f, h) */
	sl_half *down_w;        /* LLaMA: (h, f) */
	sl_half *ln2_g, *ln2_b; /* the layer's final_layer_norm; LLaMA: post_attention_layernorm */
	/* compress_weight: the matrices above (q, k, v, o, fc1, fc2, gate, up,
	 * down) point at common/sl_q4.h's layout (sl_q4_bytes(rows, cols)),
	 * not fp16 (the GEMM's wq); biases and norms stay fp16 */
	bool q4;
	/* the split matrices' later pieces (a view's: valid where its
	 * matrices are) */
	sl_wcut cut[2];
	int ncut;
	/* (owned by sl_model_weights.layers; a view copies them, never frees) */
	sl_buf block;      /* device home: the tensors placed on the device */
	sl_buf host;       /* pinned home: the tensors placed on the host */
	uint64_t disk_off; /* disk home: offset of the layer's segment in the store */
} sl_layer_w;

enum sl_tier { SL_TIER_DEVICE, SL_TIER_HOST, SL_TIER_DISK };

/*
 * Where weights live.  Each decoder layer is placed the same way: its
 * tensors in table order, as bytes, are cut at disk% and disk% + cpu% of
 * the layer's bytes; [0, disk%) goes to the disk, [disk%, disk% + cpu%)
 * to pinned host memory, the rest to the device.  A matrix a cut falls in
 * is split by rows (at a multiple of SL_WSPLIT_ROWS rows, the nearest to
 * the cut), so each tier holds its share to within those rows rather than
 * to within a tensor (FlexGen moves whole tensors, by their byte
 * midpoints: an OPT layer's fc1 and fc2 are a third of it each).  A
 * vector goes whole where its byte midpoint falls.  The embeddings,
 * positions, projections and final norm stay on the device.
 */
typedef struct sl_weight_place {
	double gpu_percent, cpu_percent; /* disk holds the rest */
	sl_disk_store *disk;             /* borrowed; needed when the disk share is not 0 */
	bool disk_ready;                 /* the store already holds these weights */
	bool overlap;                    /* load the next unit while this one computes */
	bool halves;                     /* stream by half layers (sep_layer) */
	bool q4;                         /* compress_weight: the layers' matrices in 4 bits */
	int zstd;                        /* the store holds zstd frames (sluice convert
					    --zstd) written at this level; 0: plain */
	uint32_t zstd_window;            /* their largest raw bytes (the store's);
					    0: sl_weights_zstd_window's */
	bool host_in_place;              /* the backend's device memory is host memory
					    (the CPU backend): the host tier's tensors
					    are read where they live, never copied into
					    a staging slot; only disk parts are staged */
	const volatile sig_atomic_t *interrupt; /* (optional) non-zero: loading stops
					    before the next layer, SL_EINTERRUPTED (a
					    store being written is left incomplete, and
					    written again by the next open) */
} sl_weight_place;

#define SL_LAYER_TENSORS 16
#define SL_WSPLIT_ROWS 16

/* One piece of a layer tensor: rows [row0, row1) of table tensor t (a
 * vector: the whole, rows 0 to 1) in one tier, at off in that tier's
 * layer home. */
typedef struct sl_wpiece {
	unsigned char t, tier;
	int row0, row1;
	size_t off;
} sl_wpiece;

typedef struct sl_model_weights {
	sl_half *embed_tokens;   /* (vocab, e) */
	sl_half *embed_pos;      /* (max_pos + 2, h) */
	sl_half *project_in;     /* (h, e) or NULL */
	sl_half *project_out;    /* (e, h) or NULL */
	sl_half *final_ln_g, *final_ln_b; /* (h) or NULL (LLaMA: norm, a gain) */
	sl_half *lm_head;        /* (vocab, e): embed_tokens when tied */
	sl_buf block;            /* device: the tensors above */
	sl_layer_w *layers;  /* n_layer */
	int n_layer;
	size_t bytes;            /* the weights' bytes, all tiers */

	/* the family's table of layer tensors (weights.c's): ntensors of
	 * them, the first nattn the attention half */
	const void *tensors;
	int ntensors, nattn;
	/* placement, the same for every layer: the tensors' pieces in table
	 * order (two cuts split at most two tensors, or one in three) */
	sl_wpiece piece[SL_LAYER_TENSORS + 2];
	int npiece;
	size_t dev_bytes, host_bytes, disk_bytes; /* per layer */
	/* per unit (enum sl_unit): its host tensors' range of the host home,
	 * its disk tensors' range of the disk segment, and where its disk
	 * part starts in a slot */
	sl_wstage_unit unit[3];

	bool q4;                /* the layers' matrices quantised (sl_layer_w.q4) */
	bool host_in_place;     /* host tensors read in their home (sl_weight_place) */
	bool streamed;          /* some tensors are staged (off the device; with
				   host_in_place, on the disk) */
	bool halves;            /* streamed by half layers */
	sl_disk_store *disk;
	sl_zseg_table zt;       /* the store's zstd frames (zt.clen NULL: a plain store) */
	sl_wstage *stage;       /* brings the streamed tensors in (when streamed) */
	sl_weight_stats stats;  /* the engine's loads and the store's writes */
} sl_model_weights;

/* The zstd store's ratio (sluice convert --zstd) these weights read their
 * disk share from: every frame's bytes as a read moves them (a page
 * multiple; a raw frame whole) over the plain segments'.  0: a plain store,
 * or nothing on disk. */
double sl_weights_zstd_ratio(const sl_model_weights *w);
/* The same ratio read from the frame table of the zstd store at path
 * (without opening it as a store), for a model and placement whose frames
 * are at most window bytes; SL_EFORMAT naming path when the table is cut
 * short or corrupt. */
int sl_weights_zstd_store_ratio(const char *path, const sl_model_config *c, double gpu_percent,
				double cpu_percent, bool q4, uint32_t window, double *ratio);

/* Load from an open checkpoint; dir names it in messages.  place may be
 * NULL: everything on the device. */
int sl_weights_load(sl_backend *b, sl_queue *q, const sl_model_config *c, const sl_st_set *st,
		    const char *dir, const sl_weight_place *place, sl_model_weights *w);

/* Deterministic pseudo-random weights of the right shapes (same seed, same
 * weights, whatever the thread count). */
int sl_weights_dummy(sl_backend *b, sl_queue *q, const sl_model_config *c, uint64_t seed,
		     const sl_weight_place *place, sl_model_weights *w);

/* Bytes of one decoder layer's weights (q4: its matrices quantised, as
 * compress_weight keeps them), for budgets and messages. */
size_t sl_weights_layer_bytes(const sl_model_config *c, bool q4);
/* The embeddings, positions, projections, final norm and (LLaMA family,
 * untied) the head: always on the device. */
size_t sl_weights_global_bytes(const sl_model_config *c);
/* The device bytes of the weights under a placement: the globals (the
 * head tied, as every OPT checkpoint has it), the device tier of every
 * layer, and the two staging slots when some tensors are streamed (with
 * p->host_in_place, sized for the disk parts alone). */
size_t sl_weights_device_bytes(const sl_model_config *c, const sl_weight_place *p);
/* The pinned host bytes of the weights under a placement: *resident the
 * host tier, the disk bounce buffers (a backend whose device is not the
 * host) and, from a zstd store (p->zstd), the frames' buffers
 * (sl_wstage_zstd_bytes), *loading the peak while they load (the host tier and the
 * conversion buffers, sl_weights_convert_bytes). */
void sl_weights_host_bytes(const sl_model_config *c, const sl_weight_place *p, bool dev_is_host,
			   size_t *resident, size_t *loading);
/* One decoder layer's weight bytes in each tier under a placement (the
 * homes as laid out: tensors 64-byte aligned, the disk segment page
 * aligned; q4: compress_weight's quantised matrices): what a forward
 * streams per layer from the host and the disk. */
void sl_weights_layer_split(const sl_model_config *c, double gpu_percent, double cpu_percent, bool q4,
			    size_t *dev, size_t *host, size_t *disk);
/* One decoder layer's pieces under a placement (what place_layer lays
 * out: SL_LAYER_TENSORS + 2 at most, in table order), and for each table
 * tensor its bytes (unaligned; q4: quantised) and rows (1 for a vector,
 * which is never split); returns the number of pieces, *ntensors the
 * table's length.  For tests and reports of where a cut fell. */
int sl_weights_layer_pieces(const sl_model_config *c, double gpu_percent, double cpu_percent, bool q4,
			    sl_wpiece *piece, size_t *bytes, int *rows, int *ntensors);
/* The disk segment of one layer (page aligned) under a placement. */
size_t sl_weights_disk_bytes(const sl_model_config *c, double gpu_percent, double cpu_percent, bool q4);
/* A store's data area: every layer's segment, and with zstd frames of at
 * most window bytes (zseg.h) their table after them. */
uint64_t sl_weights_store_bytes(const sl_model_config *c, double gpu_percent, double cpu_percent, bool q4,
				uint32_t window);
/* The frame size sluice convert --zstd writes a store with under a
 * placement (the conversion's piece: at most 4 MiB). */
uint32_t sl_weights_zstd_window(const sl_model_config *c, double gpu_percent, double cpu_percent, bool q4);
/* A placement's zstd frame size: 0 without a zstd store; else its
 * zstd_window, or where that is 0 sl_weights_zstd_window's. */
uint32_t sl_weight_place_window(const sl_model_config *c, const sl_weight_place *p);
/* The pinned host memory loading takes while it converts (two buffers of
 * at most 4 MiB each, whatever the model), freed when loading ends: it
 * counts against the host budget with everything else.  (With q4 the
 * quantiser also reads at most 1 MiB of fp16 rows at a time into
 * ordinary memory, outside the budgets.) */
size_t sl_weights_convert_bytes(const sl_model_config *c, double gpu_percent, double cpu_percent, bool q4);

/*
 * Write the disk share of a checkpoint's (st, dir) or, with st NULL, the
 * dummy weights' (seed) into place->disk and mark the store complete,
 * loading nothing else: ahead of a job (sluice convert).  Does nothing when
 * place->disk_ready.
 */
int sl_weights_write_store(sl_backend *b, const sl_model_config *c, const sl_st_set *st, const char *dir,
			   uint64_t seed, const sl_weight_place *place);

/*
 * The weights of unit u (enum sl_unit) of layer l in device memory, as
 * pointers in *view (the unit's tensors; the others' pointers are only
 * valid when they live on the device): the device-tier tensors at home,
 * the others in a staging slot loaded from the host tier and the disk by
 * the staging engine (offload/wstage.h, sl_wstage_acquire: the order of
 * its loads and its prefetch of the next unit).  Weights streamed by
 * halves are acquired by halves, the others whole.  compute is the queue
 * that will read them; release after the unit's work is issued there.
 */
int sl_weights_acquire(sl_backend *b, sl_queue *compute, sl_model_weights *w, int l, int u,
		       sl_layer_w *view);
int sl_weights_release(sl_backend *b, sl_queue *compute, sl_model_weights *w, int l, int u);

void sl_weights_free(sl_backend *b, sl_model_weights *w);

#endif
