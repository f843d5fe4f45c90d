/*
 * cost.h - the cost model: how long a job of a workload takes under a run
 * plan on a machine described by a hardware profile, and what it moves.
 *
 * It models sluice's own schedule (runtime/model.c's layers()): per layer
 * and phase, the bytes each link moves (the weights' host and disk parts,
 * by half layers with sep_layer; the KV cache's rows in use loaded and its
 * new rows written back, H2O's scores and positions, the disk segments;
 * the activation rows on the host) and the work each compute resource does
 * (GEMMs at the micro-batch's rows, attention over the cached tokens, the
 * head), combined as the schedule overlaps them: with overlap, each
 * layer takes its busiest chain's time (on the CPU backend compute, copies
 * and the disk less the profile's measured shares that hide); without,
 * their sum.  The disk's transfers at the profile's rates for their
 * pattern (segment reads by request size, page writes).  Pure: the
 * config, the plan and the profile in, numbers out (no backend).
 *
 * Resources: compute (the backend's device: the GPU, or the CPU cores on
 * the CPU backend), cpu_attention (cpu_cache_compute's attention on the
 * host, CUDA only), h2d and d2h (PCIe copies; memory copies by the CPU
 * backend's copy queues, which share the cores with compute), disk_read
 * and disk_write (the store).
 */
#ifndef SL_COST_H
#define SL_COST_H

#include "model_config.h"
#include "plan.h"
#include "profile.h"

enum {
	SL_RES_COMPUTE,
	SL_RES_CPU_ATTN,
	SL_RES_H2D,
	SL_RES_D2H,
	SL_RES_DISK_READ,
	SL_RES_DISK_WRITE,
	SL_RES_ZSTD, /* the host's threads decompressing a zstd weight store's frames */
	SL_NRES
};

/* "compute", "cpu_attention", "h2d", "d2h", "disk_read", "disk_write", "zstd" */
extern const char *const sl_res_name[SL_NRES];

/* One phase: the prefill, or every decode step together. */
typedef struct sl_cost_phase {
	double seconds;       /* predicted wall time */
	double busy[SL_NRES]; /* each resource's busy seconds */
	double work[SL_NRES]; /* compute: FLOPs; cpu_attention: cache bytes read; links: bytes;
			       * zstd: raw bytes out */
	int bottleneck;       /* the resource with the most busy time */
} sl_cost_phase;

typedef struct sl_cost {
	int batch;            /* sequences in a block */
	int prompt_len, gen_len;
	sl_cost_phase prefill, decode; /* decode: the gen_len - 1 steps after the prefill */
	double seconds;       /* prefill + decode */
	double tok_s;         /* batch x gen_len / seconds (FlexGen's metric) */
	sl_tier_bytes peak;   /* the plan's total; device plus the backend's own workspace */
} sl_cost;

/*
 * Predict a job of pl's workload: pl->p.max_seq sequences with prompts of
 * prompt_len tokens (at most pl->p.max_prompt) and gen_len new tokens each
 * (prompt_len + gen_len at most pl->p.max_len), on the machine prof
 * describes (the backend it measured: prof->backend).  SL_EINVAL when the
 * plan is open or the workload larger than it.
 */
int sl_cost_eval(const sl_model_config *c, const sl_plan *pl, const sl_profile *prof, int prompt_len,
		 int gen_len, sl_cost *out);

/*
 * The distinct GEMM shapes (n x k: output by input features) a forward of
 * model c runs, decoder layers and head, into shapes[i][0], shapes[i][1]
 * (at most max); returns how many.  sluice profile --model measures the
 * profile's gemm_shapes at them, and the cost model reads a curve there
 * for a GEMM of that shape.
 */
int sl_cost_gemm_shapes(const sl_model_config *c, int shapes[][2], int max);

/* Add model c's GEMM shapes to a profile's options (sl_profile_add_shape). */
struct sl_profile_opts;
int sl_cost_profile_shapes(struct sl_profile_opts *o, const sl_model_config *c);

/* Budgets in bytes; 0: no cap. */
typedef struct sl_budgets {
	size_t device, host, disk;
} sl_budgets;

/*
 * Whether peak fits b: 0 when it does, else SL_EBUDGET with a message
 * naming the first tier that does not ("device: needs 5.2G, the budget is
 * 4.0G (1.2G over)") and *tier (0 device, 1 host, 2 disk; may be NULL).
 */
int sl_cost_fits(const sl_tier_bytes *peak, const sl_budgets *b, int *tier);

#endif
