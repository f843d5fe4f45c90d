/*
 * kvcache.h - the KV cache across the device, pinned host and disk tiers.
 * This is the logical cache (slots in use, positions, H2O's budgets and
 * which rows a step changed) and the device tier; the host and disk
 * homes, the staging areas and the movement between them are
 * offload/kv_tiers.h's, driven from here with rows and byte ranges.  It
 * knows the model only through its environment (sl_kv_env: the backend,
 * the compute queue, the model's shapes and run plan, the disk tier's
 * folder, the statistics to add to), which the model gives (its kv_env,
 * set at open); model.c drives it step by step.
 *
 * Placement.  Every micro-batch of g sequences splits the same way, by
 * whole sequences, in order: the first round(g x cache_gpu%) live on the
 * device, the next ones (up to round(g x (gpu% + cpu%))) in pinned host
 * memory, the rest on disk (FlexGen's split).  A sequence's K (and V) of one
 * layer is one block of (cap, n_kv_head, head_dim) in every tier (token-major:
 * a slot holds every head's row), so a home and its device copy share one
 * layout and a token's row is one contiguous range.
 *
 * Schedule.  For each step (layer l, micro-batch k) of a forward pass the
 * model calls sl_kv_step_begin, runs its attention over the parts the call
 * returns, then calls sl_kv_step_end.  The device part is used in place.
 * The host and disk parts are brought into one of three device staging
 * areas: only the rows in use, by copies on a copy queue and one
 * asynchronous read of the micro-batch's disk segment; with overlap, the
 * next step's loads are issued before this step computes.  After the step
 * only what it changed goes back: the new token's row (one range per
 * sequence; under H2O one piece per head, at the slot its positions say the
 * token took), or, after a prefill, the rows kept; on disk, the 4 KiB pages
 * holding them.  Order between the copy
 * queue, the compute queue and the disk is by events and tickets: what the
 * host must see before it can finish a write-back (H2O's positions, the
 * pages for the disk) is finished at the next step's end, when the device
 * has this step's work queued, never by waiting for the step's own
 * compute.
 *
 * cpu_cache_compute: decode attention of host-tier sequences runs over their
 * home, with the cache not copied; on a backend whose device memory is not
 * host memory, on a CPU backend beside it (sl_kv_host_attention: q, k, v
 * rows to the host, the output back).  Disk-tier sequences are read into
 * staging as usual.
 *
 * H2O's per-slot scores and positions (8 bytes per slot and head, 1/32 of
 * an fp16 cache at head_dim 64) live with their sequence's K and V: a
 * sequence's block of one layer is then K, V, scores, positions, in every
 * tier, and a step loads and writes back the scores and positions whole
 * (every kept token's score grows each step).  The prompt scratch (one
 * micro-batch) and the evicted sums stay on the device.
 */
#ifndef SL_KVCACHE_H
#define SL_KVCACHE_H

#include "backend.h"
#include "kv_tiers.h"
#include "model_config.h"
#include "plan.h"
#include "weights.h"

/* What a cache is made with and works in; all borrowed, living at least
 * as long as the caches made with it. */
typedef struct sl_kv_env {
	sl_backend *be;
	sl_queue *q;              /* the compute queue the model's steps run on */
	const sl_model_config *cfg; /* the model's shapes (n_layer, hidden, n_kv_head, name) */
	const sl_plan *plan;      /* placement, micro-batches, precision, H2O, overlap,
				     cpu_cache_compute, the workload */
	const char *offload_dir;  /* the disk tier's folder; NULL: none */
	bool bind_io;             /* the disk scratch store's I/O threads on io_node */
	int io_node;
	sl_kv_stats *stats;       /* what the caches move is added here */
} sl_kv_env;

typedef struct sl_kv_ccc sl_kv_ccc;

typedef struct sl_kv {
	sl_kv_env env;      /* a copy of what it was made with */
	int nseq, cap, n_layer;
	int gs;             /* sequences per micro-batch of the placement */
	sl_kv_tiers *tiers; /* host and disk homes, staging (kv_tiers.h); NULL: all
			       on the device */
	sl_kv_ccc *ccc;     /* cpu_cache_compute on a CPU backend beside the device */
	bool f32;         /* fp32 cache (accuracy mode); fp16 otherwise */
	bool q4;          /* 4-bit compressed slots (backend.h, kv_q4) */
	size_t slot_bytes; /* one token's K (or V) of one layer, every head */
	void **k, **v;    /* per layer, device (ndev, n_kv_head, cap, head_dim): the
			     device-tier sequences (all of them by default) */
	sl_buf block;     /* device: the above, then the H2O scratch */
	int *len; /* host: slots in use per sequence */
	int *pos; /* host: tokens seen per sequence (real tokens) */
	size_t *fill; /* (kvcache.c) a disk load's bytes in use per sequence */
	/* (written by kvcache.c alone) decode steps since the prefill; per
	 * sequence, the step after which it was last rolled back (0: never) */
	int steps;
	int *undone;
	/* H2O (h2o true): per-slot scores and positions, the budgets of each
	 * sequence, and one layer of full-prompt scratch for the prefill */
	bool h2o;
	double hh_ratio, recent_ratio;
	int fixed_heavy, fixed_recent; /* >= 0: counts instead of ratios */
	int *heavy, *recent;           /* host (nseq), set by the prefill */
	float **score;                 /* per layer, device (ndev, n_kv_head, cap): the
					  device-tier sequences (the rest live with
					  their K and V) */
	int32_t **pos_slot;            /* per layer, device (ndev, n_kv_head, cap) */
	void *scratch_k, *scratch_v;   /* device, one micro-batch (gs, n_kv_head, scratch_cap, head_dim) */
	float *scratch_score;          /* device (gs, n_kv_head, scratch_cap) */
	int scratch_cap;
	float *evicted;                /* (optional) device (n_layer, nseq, n_kv_head) */
} sl_kv;

/* A KV cache of cap slots for nseq sequences (dense). */
int sl_kv_create(const sl_kv_env *env, int nseq, int cap, sl_kv **out);

/* The cache a job needs: dense with max_len slots, or, with H2O on, the
 * budget B + 1 of the longest prompt (never more than max_len) plus one
 * layer of prompt scratch.  Refuses a job larger than the plan's
 * workload (sl_plan_check_job). */
int sl_kv_make(const sl_kv_env *env, int nseq, int max_prompt, int max_len, sl_kv **out);
void sl_kv_free(sl_kv *kv);

/* A run of sequences of one micro-batch in one tier, as the attention of
 * a step sees them: K and V blocks of count sequences from seq. */
typedef struct sl_kv_part {
	int seq, count;
	void *k, *v;
	float *score;  /* H2O: (count, n_kv_head, cap); NULL for a dense cache */
	int32_t *pos;  /* H2O: (count, n_kv_head, cap) */
	int tier; /* enum sl_tier */
} sl_kv_part;

/* Make the cache of micro-batch [s0, s0 + g) of layer l ready on the
 * device for the compute queue; parts[0..*nparts) say where.  next_l,
 * next_s0, next_g name the step after this one (next_l < 0: none), whose
 * loads start now when overlap is on. */
int sl_kv_step_begin(sl_kv *kv, int l, int s0, int g, bool prefill, int next_l,
		     int next_s0, int next_g, sl_kv_part *parts, int *nparts);

/* After the step's work is issued on the compute queue: write back what it
 * changed.  t: the prefill's padded rows (unused for decode). */
int sl_kv_step_end(sl_kv *kv, int l, int s0, int g, bool prefill, const int *npad,
		   int t);

/* cpu_cache_compute where the device is not host memory: the decode
 * attention a describes, for host-tier part p, on a CPU backend over the
 * part's home copy (H2O's scores and positions included): q, k_new and
 * v_new (and under H2O the evicted sums) to pinned host buffers, the
 * output (and the sums) back on the compute queue. */
int sl_kv_host_attention(sl_kv *kv, int l, const sl_kv_part *p,
			 const sl_attn_args *a);

/* The CPU backend that runs sl_kv_host_attention (created with the
 * model's backend's nthreads, --threads); NULL where the cache has none. */
const sl_backend *sl_kv_host_backend(const sl_kv *kv);

/* After a forward pass: every write-back of it complete. */
int sl_kv_pass_end(sl_kv *kv);

/*
 * A sequence's counters: len (slots in use) and pos (real tokens seen,
 * the next token's position less OPT's offset).  They are written here
 * only: the forward passes (model.c) mark a prefill's start and end and
 * each decode step's end, and a caller that freezes a sequence undoes its
 * steps with sl_kv_rollback.
 *
 * sl_kv_prefill_begin: before the prefill of the block's kv->nseq prompts
 * of t rows (npad[s] of them padding): nothing cached; under H2O each
 * sequence's budget from its prompt, and len = the prompt's tokens (what
 * the prefill compacts).  sl_kv_prefill_end: after it, the prompts cached
 * (under H2O the tokens kept).  sl_kv_advance: after a decode step's pass,
 * every sequence one token further (under H2O within its budget: the step
 * evicted one token when over it); fails, naming the sequence, if a
 * sequence rolled back before the last step ran it without a rollback.
 */
void sl_kv_prefill_begin(sl_kv *kv, const int *npad, int t);
void sl_kv_prefill_end(sl_kv *kv, const int *npad, int t);
int sl_kv_advance(sl_kv *kv);

/*
 * Undo the last decode step for sequence s, which the caller has frozen
 * (finished: its logits are not used again until the next prefill), so
 * that it neither grows nor runs past the model's positions while the rest
 * of its block runs on; the step's token was a filler.
 *
 * Dense: exact.  pos and len go back by one; the step wrote its token into
 * slot len (on the device, and its row to the host or disk home), which
 * is beyond len again: the next step overwrites it and no attention reads
 * it.  The cache is as it was before the step.
 *
 * H2O: the position only.  pos goes back by one, so the next step's token
 * takes the same position; len stays (within the budget by itself: over
 * it, the step evicted one token, perhaps its own).  What the step did to
 * the cache is not undone: every kept token's score grew, one token may
 * have been evicted (its slot reused), the evicted sums grew, and the
 * filler token keeps a slot under the position the next one takes again,
 * so the host and disk write-back may copy the older of two rows with
 * that position.  That is harmless only because the sequence stays
 * frozen: nothing reads its logits, and no other sequence reads its slots.
 *
 * Preconditions, each checked (SL_EINVAL, an internal error, otherwise):
 * a decode step ran since the prefill; its pass has ended (its write-back
 * reads len and pos: sl_model_decode has returned); s was not rolled back
 * after this step already; and once rolled back a sequence is rolled back
 * after every later step of the block (frozen until the next prefill).
 */
int sl_kv_rollback(sl_kv *kv, int s);

/* Bytes the split places in each tier for nseq sequences in micro-batches
 * of gs with cap slots of slot_bytes each (sl_plan_kv_slot_bytes: fp16,
 * fp32 or compressed) (h2o: with scores and positions): device homes
 * plus staging, host homes (plus bounce buffers where the device is not
 * host memory), disk (sl_kvt_sizes).  H2O's scratch and evicted sums are
 * sl_kv_h2o_extra's. */
void sl_kv_tier_sizes(const sl_model_config *c, int nseq, int gs, int cap, size_t slot_bytes, bool h2o,
		      double gpu_percent, double cpu_percent, bool dev_is_host, sl_kv_sizes *out);

/* cpu_cache_compute on a device that is not host memory: the pinned
 * buffers of one micro-batch of gs (q, k, v rows, the output, H2O's
 * evicted sums) that carry its attention to the CPU and back. */
size_t sl_kv_ccc_bytes(const sl_model_config *c, int gs);

/* Sequences per micro-batch: the policy's micro (gpu_batch_size) when it
 * splits a block of nseq, else the whole block. */
static inline int sl_kv_group(int micro, int nseq)
{
	return micro > 0 && micro < nseq ? micro : nseq;
}

/* H2O sizing: the slots of a cache for prompts of up to max_prompt tokens,
 * the device bytes beyond the tiers' (the prompt scratch of one
 * micro-batch of gs, and the evicted sums), and one sequence's budget for
 * a prompt. */
int sl_kv_h2o_slots(double hh, double rr, int max_prompt, int max_len);
size_t sl_kv_h2o_extra(const sl_model_config *c, int nseq, int gs, int max_prompt, size_t slot_bytes);
int sl_kv_h2o_budget(const sl_kv *kv, int prompt, int *heavy, int *recent);

#endif
