/*
 * plan.h - the run plan: one value, made before a model opens and fixed
 * for its life, that says how jobs run under a policy: the micro-batch
 * size, where every weight tensor, KV cache group and activation lives,
 * the staging and workspace sizes, and the bytes each tier holds.
 *
 * It is made from the model's shapes, the policy (placement, micro-batches,
 * H2O, overlap, sep_layer, cpu_cache_compute), the cache's precision, the
 * workload (the most sequences in a block, the longest prompt, the most
 * tokens a sequence reaches, the rows of one forward) and one fact of the
 * backend (whether its device memory is host memory).  sl_model_open_ex
 * takes its parameters and keeps the plan in m->plan; nothing changes it
 * after.  Its byte arithmetic is the one the command line admits jobs
 * with (the budget checks, `bench --batch max`) and the one a cost model
 * predicts with: the device bytes it states are what the model and a job
 * of its workload allocate (tests/test_plan.c holds the two equal).
 *
 * A plan with no workload (max_seq 0) is open: each job sizes the
 * workspace and the cache itself (sl_model_open, tests, one-off use).  A
 * plan with a workload refuses a job larger than it.
 */
#ifndef SL_PLAN_H
#define SL_PLAN_H

#include "model_config.h"
#include "policy.h"

#include <stdbool.h>
#include <stddef.h>

/* What a plan is made from (sl_plan_defaults: everything on the device). */
typedef struct sl_plan_params {
	/* placement in percent; the disk holds the rest */
	double w_gpu, w_cpu;        /* decoder layers' weights (FlexGen's rule, weights.h) */
	double cache_gpu, cache_cpu; /* each micro-batch's sequences (kvcache.h) */
	bool act_host;              /* the residual stream in pinned host memory */
	bool cpu_cache_compute;     /* decode attention over host-tier caches in place */
	bool overlap;               /* prefetch the next step's weights, cache and rows */
	bool sep_layer;             /* every micro-batch's attention, then every MLP */
	bool kv_f32;                /* fp32 cache (accuracy mode); fp16 otherwise */
	bool kv_q4;                 /* 4-bit compressed cache (compress_cache, backend.h) */
	bool w_q4;                  /* 4-bit decoder-layer matrices (compress_weight, weights.h) */
	double w_zstd;              /* the weights' disk share read from a zstd store
				       (sluice convert --zstd): its frames' bytes over the
				       plain ones, in (0, 1]; 0: a plain store.  The cost
				       model reads less from the disk and decompresses; the
				       host tier holds the streamer's frame buffers
				       (sl_wstage_zstd_bytes: the two slots' disk parts and
				       a window per decompression thread, one per OpenMP
				       thread when the plan is made).  sl_model_open_ex
				       sets it (and the window) from the store it finds */
	uint32_t w_zstd_window;     /* that store's frames' largest raw bytes (a page
				       multiple); 0: what sluice convert --zstd writes
				       (sl_weights_zstd_window) */
	int micro;                  /* sequences per micro-batch; 0: the whole block */
	double hh, rr;              /* H2O: heavy-hitter and recent ratios; 0, 0: dense */
	int fixed_heavy, fixed_recent; /* >= 0: H2O with these counts (tests); -1: the ratios */
	/* the workload; max_seq 0: open (sized by each job) */
	int max_seq;    /* sequences in a block */
	int max_prompt; /* tokens of the longest prompt */
	int max_len;    /* tokens a sequence reaches (prompt and new ones) */
	int max_rows;   /* rows of one forward; 0: max_seq x max_len */
} sl_plan_params;

/* Bytes in each tier. */
typedef struct sl_tier_bytes {
	size_t device, host, disk;
} sl_tier_bytes;

typedef struct sl_plan {
	sl_plan_params p;
	bool dev_is_host; /* made for a backend whose device memory is host memory */
	bool h2o;       /* the cache keeps heavy hitters (ratios or counts set) */
	/* for the workload (0 when the plan is open) */
	int gs;         /* sequences per micro-batch */
	int cap;        /* cache slots per sequence (H2O: its budget plus one) */
	int max_rows;   /* rows of one forward (at least max_seq) */
	int group_rows; /* rows of one micro-batch's buffers */
	/* the model: device: globals, the device tier's homes, two staging
	 * slots; host: the host tier, the disk bounce buffers and a zstd
	 * store's frame buffers; disk: the weights' store.  weights_loading: the host peak while they load
	 * (the host tier and the conversion buffers). */
	sl_tier_bytes weights;
	size_t weights_loading;
	/* a job of the workload: the KV cache (device: homes, staging, H2O's
	 * prompt scratch and evicted sums; host: homes, bounce buffers,
	 * cpu_cache_compute's buffers, H2O's position readback; disk: its
	 * scratch store) and the activations (device: the workspace; host:
	 * the act_host rows) */
	sl_tier_bytes cache, act;
	/* the whole run: device and disk summed; host the larger of the
	 * loading peak and the resident weights with the job */
	sl_tier_bytes total;
} sl_plan;

sl_plan_params sl_plan_defaults(void);

/* The plan parameters a policy gives (percentages, micro-batches when
 * micro_given, H2O ratios with the recent share sl_policy_recent_ratio
 * takes), with the workload left open. */
/* Bytes of one token's K (or V) of one layer in the cache the plan
 * describes: fp16, fp32 or 4-bit (sl_kv_slot_bytes). */
size_t sl_plan_kv_slot_bytes(const sl_model_config *c, const sl_plan_params *p);

sl_plan_params sl_plan_of_policy(const sl_policy *pol, bool micro_given, bool kv_f32);

/* Make a plan; SL_EINVAL naming what is out of bounds (a percentage, a
 * negative size, a workload beyond the model's positions). */
int sl_plan_make(const sl_model_config *c, const sl_plan_params *p, bool dev_is_host, sl_plan *out);

/* 0 when a job of nseq sequences, prompts up to max_prompt tokens and
 * max_len tokens in all fits the plan's workload (or the plan is open),
 * else SL_EINVAL saying how it is larger. */
int sl_plan_check_job(const sl_plan *pl, int nseq, int max_prompt, int max_len);

/* The least device memory the workload of p runs in under any placement
 * of weights and cache: every decoder layer's weights off the device (two
 * staging slots of a whole layer, of half a layer with sep_layer, from the
 * host or the disk, whichever is less; dev_is_host: the host tier read in
 * place, so no slot), the cache off it (its staging), the activations
 * where p puts them.  For saying what budget would work. */
size_t sl_plan_min_device_bytes(const sl_model_config *c, const sl_plan_params *p, bool dev_is_host);

/* Workspace layout: the floats of each of its eight device buffers (h, x,
 * q, k, v, attention output, fc1 output, logits) for blocks of max_seq
 * sequences, max_rows rows, micro-batches of micro, activations on the
 * host or not; each buffer starts on 256 bytes. */
enum { SL_WS_BUFFERS = 8 };
void sl_plan_ws_sizes(const sl_model_config *c, int max_seq, int max_rows, int micro, bool act_host,
		      size_t sizes[SL_WS_BUFFERS]);
size_t sl_plan_ws_bytes(const sl_model_config *c, int max_seq, int max_rows, int micro, bool act_host);
/* Rows of one micro-batch's buffers. */
int sl_plan_group_rows(int micro, int max_seq, int max_rows);

#endif
