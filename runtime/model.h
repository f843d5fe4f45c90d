/*
 * model.h - a model on a backend (OPT, or the LLaMA family: Llama,
 * Mistral, Qwen2; model_config.h): weights, the activation workspace, and
 * the forward passes for prefill and decode over a KV cache (kvcache.h).
 *
 * Batches are left-padded: sequence b's first npad[b] rows are padding.
 * Positions follow Hugging Face: real token j of a sequence sits at
 * position j + 2 for OPT (its learned positions' offset; padding at 1), at
 * position j for the LLaMA family (its rotary embedding; K is cached after
 * rotation, so a cached token keeps the position it was rotated at,
 * whatever H2O evicts around it).  Padding is never cached and never
 * attended to, so a sequence's result does not depend on the batch around
 * it.
 */
#ifndef SL_MODEL_H
#define SL_MODEL_H

#include "backend.h"
#include "kvcache.h"
#include "model_config.h"
#include "plan.h"
#include "rstage.h"
#include "weights.h"
#include "wstore.h"

/*
 * The offload breakdown of a run (generate, score and bench report it):
 * compute_s is the wall time not spent waiting for weights or cache
 * (ops run in issue order on one compute queue, and on the CPU backend
 * synchronously, so that is the time it was busy); io_s the time the disk
 * was busy (the weights' and the cache's stores, summed, at most the wall
 * time; on the CPU backend the disk is the only link that runs beside the
 * compute); stall_s the compute waiting for weights or cache.
 */
typedef struct sl_offload_stats {
	double wall_s, compute_s, io_s, stall_s;
	uint64_t disk_read_bytes, disk_write_bytes;
	double disk_read_gbps; /* disk_read_bytes / io_s */
	uint64_t h2d_bytes, d2h_bytes;
	size_t peak_device, peak_host, peak_disk;
} sl_offload_stats;

typedef struct sl_model {
	sl_backend *be; /* borrowed */
	sl_queue *q;
	sl_model_config cfg;
	sl_model_weights w;
	float inv_freq[SL_ROPE_MAX_HD / 2]; /* LLaMA family: RoPE's, made once at open */
	/* activation workspace (device), for up to max_rows rows */
	/* how it runs, fixed at open (plan.h): read it, never write it */
	sl_plan plan;
	int max_rows, max_seq; /* the workspace's (at most the plan's workload) */
	int group_rows; /* rows the per-micro-batch buffers hold */
	float *h, *x, *qb, *kb, *vb, *ab, *fb;
	/* act_host (FlexGen's act_cpu_percent 100): the residual stream of the
	 * whole block lives in pinned host memory, and each step brings its
	 * micro-batch's rows through one of two device buffers (each of the
	 * larger of a micro-batch's rows and max_seq rows, carved from the
	 * workspace where h would be): offload/rstage.h.  NULL otherwise, and
	 * h is then the residual stream on the device. */
	sl_rstage *act;
	float *logits; /* (max_seq, vocab) */
	sl_buf ws; /* device: the buffers above */
	int32_t *ids_host, *pos_host; /* (max_rows) */
	sl_disk_store *disk; /* owned; weights on disk */
	char *offload_dir;   /* the disk tier's folder (weights, KV cache) */
	sl_kv_stats kv_stats;
	sl_kv_env kv_env; /* what the model's KV caches are made with (set at open) */
	struct {
		double disk_busy_s;
		uint64_t disk_read, disk_written;
	} base; /* the weights store's counters at sl_model_stats_reset */
} sl_model;

/* Open a model: from a checkpoint directory (config.json + safetensors),
 * or with dummy weights for a named shape (dir NULL, dummy "opt-1.3b"),
 * under the default plan (everything on the device, the workload open). */
int sl_model_open(sl_backend *be, const char *dir, const char *dummy, sl_model **out);

typedef struct sl_model_params {
	const char *dir, *dummy;       /* one of them */
	const char *offload_dir;       /* the disk tier's folder */
	const sl_plan_params *plan;    /* NULL: sl_plan_defaults() */
	const volatile sig_atomic_t *interrupt; /* (optional) loading stops when it
					  becomes non-zero: SL_EINTERRUPTED */
} sl_model_params;

/* Open under a plan made from p->plan and the model's shapes (m->plan);
 * the weights placed across device, pinned host and disk as it says.  A
 * current zstd store for the placement (sluice convert --zstd) is read in
 * place of the plain one, and the plan's w_zstd and w_zstd_window are its
 * (whatever p->plan says). */
int sl_model_open_ex(sl_backend *be, const sl_model_params *p, sl_model **out);
/* The zstd store sl_model_open_ex would read for p (z->level 0: none),
 * found without a word on stderr, so that a caller can check its budgets
 * with the plan the model will make. */
int sl_model_find_zstd(const sl_model_params *p, sl_wstore_zstd *z);
void sl_model_free(sl_model *m);

/* Bind a disk store's I/O threads near the device (the GPU's NUMA node,
 * else the process's): sets dp->bind_io and dp->io_node. */
void sl_model_io_node(sl_backend *be, sl_disk_params *dp);

/* Size the workspace for batches of up to max_seq sequences and max_rows
 * rows in one forward (prefill: sequences x padded length).  With micro
 * set, each layer runs micro-batch by micro-batch (the zig-zag order: one
 * layer's weights serve every micro-batch) and only the residual stream is
 * kept for the whole block; the other buffers hold one micro-batch. */
int sl_model_reserve(sl_model *m, int max_seq, int max_rows);
/* Under a plan with a workload, reserve makes the plan's workspace (the
 * whole of it, once) and refuses a block larger than the plan. */
/* Free the workspace (the next forward or reserve makes it again). */
void sl_model_release(sl_model *m);

/*
 * Prefill an empty cache with nseq = kv->nseq left-padded prompts of t rows
 * (ids host, (nseq, t); values at padding rows are ignored).  Leaves each
 * sequence's last-position logits in the model's logits buffer.  When
 * all_logits is not NULL, also writes the logits of every row, (nseq, t,
 * vocab) on the host (padding rows are unspecified).
 */
int sl_model_prefill(sl_model *m, sl_kv *kv, const int32_t *ids, const int *npad, int t,
		     float *all_logits);

/* One decode step: ids host (nseq), one new token per sequence. */
int sl_model_decode(sl_model *m, sl_kv *kv, const int32_t *ids);

/* Start counting a run's offload statistics here; then read them with
 * wall_s, the run's compute wall time (prefill + decode). */
void sl_model_stats_reset(sl_model *m);
void sl_model_stats(sl_model *m, double wall_s, sl_offload_stats *out);

/* After prefill/decode: greedy next tokens (host, nseq; -1 for a sequence
 * whose logits are not all finite), or logits to host. */
int sl_model_argmax(sl_model *m, int nseq, int32_t *out);
int sl_model_logits(sl_model *m, int nseq, float *out);

/* SL_ERANGE with the message that the logits of a sequence at step (0:
 * after the prefill) are not finite, naming the sequence by its input line
 * and id (line > 0), else by its index s in the block; what names the
 * token the logits were for ("new token", "continuation token"). */
int sl_model_nonfinite_err(int line, const char *id, int s, int step, const char *what);

#endif
