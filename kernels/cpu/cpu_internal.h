/*
 * cpu_internal.h - shared state of the CPU backend's files.
 */
#ifndef SL_CPU_INTERNAL_H
#define SL_CPU_INTERNAL_H

#include "backend.h"
#include "sl_q4.h"

#include <pthread.h>
#include <stdbool.h>

/*
 * The instruction sets the CPU kernels are written for, in order.  A
 * backend uses the best its CPU has (x86-64: AVX2 with FMA and F16C;
 * AVX-512 F and DQ on top), capped by SLUICE_CPU_KERNELS=generic|avx2|
 * avx512 (a test's way to run the other kernels on any machine).  The
 * generic kernels are plain C and build for any architecture.  All of them
 * compute every result bit for bit the same (cpu_gemm.c).
 */
typedef enum sl_cpu_isa { SL_CPU_GENERIC, SL_CPU_AVX2, SL_CPU_AVX512 } sl_cpu_isa;

typedef struct sl_cpu_ctx {
	int nthreads;
	sl_cpu_isa isa;
	int simd; /* isa >= SL_CPU_AVX2: x86 fp16 conversions usable */
	/* queues (cpu_backend.c): one lock guards every queue's state */
	pthread_mutex_t qlock;
	pthread_cond_t qdone;      /* broadcast when any queue finishes a task */
	struct sl_queue *queues;   /* the live queues, linked */
	struct sl_queue *defq;     /* the queue used for a NULL queue */
	uint64_t next_qid;         /* queue ids are never reused */
	bool sync_queues;          /* SLUICE_CPU_SYNC_QUEUES: run every call inline */
	size_t inline_max;         /* copies below this run inline on an idle queue */
	unsigned late_us;          /* SLUICE_CPU_LATE_COPIES: every copy on the worker, this late */
	struct cpu_task *spare;    /* finished queued tasks, reused by the next submit:
				    * queueing allocates only while the number in flight
				    * grows past its peak */
	/* workspace grown on demand, reused across calls (never freed in the
	 * per-token loop once large enough) */
	float *gemm_wf;  /* packed GEMM: a weight panel, widened to fp32 */
	size_t gemm_wf_cap;
	float *gemm_part; /* packed GEMM: partial lanes between k chunks */
	size_t gemm_part_cap;
	bool gemm_openblas; /* --cpu-gemm openblas: OpenBLAS's sgemm above the direct kernel */
	int gemm_bf16;      /* --cpu-gemm amx or bf16 (enum sl_cpu_gemm_bf16): the
			     * products in bf16 above it (cpu_amx.c) */
	float *gemm_c;   /* OpenBLAS path: sgemm's output before the epilogue;
			  * AMX path: the bf16 x copy and the threads' panels */
	size_t gemm_c_cap;
	float *attn_ws;  /* per-thread attention scratch */
	size_t attn_ws_per_thread;
} sl_cpu_ctx;

static inline sl_cpu_ctx *sl_cpu(sl_backend *b)
{
	return (sl_cpu_ctx *)b->ctx;
}

/* Grow *buf to hold at least n floats; keeps contents undefined. */
int sl_cpu_grow(float **buf, size_t *cap, size_t n);

/* The ops' kernels, sl_cpu_<op> for each op of backend_ops.def (cpu_gemm.c,
 * cpu_ops.c, cpu_h2o.c); cpu_backend.c runs them once the queue's earlier
 * work is done. */
#define SL_BACKEND_OP(fn, params, args) int sl_cpu_##fn params;
#include "backend_ops.def"

/* fp16 -> fp32 for a run of values (vectorised where the CPU allows). */
void sl_cpu_half_to_float(const sl_half *src, float *dst, size_t n, int simd);

/* A GEMM output's epilogue: bias, alpha, ReLU, accumulation onto old. */
static inline float sl_cpu_epilogue(const sl_gemm_args *a, float s, int n, float alpha, float old)
{
	if (a->bias)
		s += sl_half_to_float(a->bias[n]);
	s *= alpha;
	if ((a->flags & SL_GEMM_RELU) && !(s > 0.0f))
		s = 0.0f;
	return (a->flags & SL_GEMM_ACCUM) ? old + s : s;
}

/* The dequantised weight (n, kk) of a 4-bit matrix (a->wq, sl_q4.h). */
static inline float sl_cpu_q4_weight(const sl_gemm_args *a, int n, int kk)
{
	const size_t ng = sl_q4_groups((size_t)a->k);
	const size_t gi = (size_t)n * ng + (size_t)kk / SL_Q4_GROUP;
	const uint8_t *codes = (const uint8_t *)a->wq;
	const sl_half *meta = (const sl_half *)(codes + (size_t)a->n * ng * SL_Q4_CODE_BYTES);
	return sl_q4_value(sl_q4_code(codes + gi * SL_Q4_CODE_BYTES, kk % SL_Q4_GROUP), meta[2 * gi],
			   meta[2 * gi + 1]);
}

/* Rows [n0, n0 + rows) of a 4-bit weight matrix dequantised to fp32, the
 * elements kk < kend of each: element kk of row j goes to
 *   dst[j * ld + (kk / 8) * cs + kk % 8]
 * (cs = 8, ld = k: plain rows; cs = 64, ld = 8: a packed GEMM group).  Per
 * group the 16 values q / scale16 + mn16 once, then a look-up per element
 * (cpu_gemm.c; the AVX2 twin in cpu_x86.c gives the same bits). */
void sl_cpu_q4_rows(const sl_gemm_args *a, int n0, int rows, float *dst, size_t ld, size_t cs,
		    int kend, int simd);

/* The last step of the direct kernels' output y[r][n] (cpu_gemm.c): s, the
 * sum over the first k & ~7 terms, plus the remaining terms one at a time,
 * then the epilogue. */
static inline void sl_cpu_gemm_finish(const sl_gemm_args *a, float alpha, int r, int n, float s)
{
	const float *x = a->x + (size_t)r * a->ldx;
	if (a->wq) {
		for (int kk = a->k & ~7; kk < a->k; kk++)
			s += sl_cpu_q4_weight(a, n, kk) * x[kk];
	} else {
		const sl_half *w = a->w + (size_t)n * a->k;
		for (int kk = a->k & ~7; kk < a->k; kk++)
			s += sl_half_to_float(w[kk]) * x[kk];
	}
	float *y = a->y + (size_t)r * a->ldy + n;
	*y = sl_cpu_epilogue(a, s, n, alpha, *y);
}

/*
 * The packed GEMM (cpu_gemm.c).  Weights are widened to fp32 in groups of
 * 8 columns (weight rows), k-step by k-step (a step is 8 consecutive k):
 * group g, step s holds 8 floats of each of its 8 columns, [s][col][lane],
 * 64 floats.  A tile kernel multiplies mr x rows (read where they are; rows
 * past m repeat the last one) with one group over the steps [s0, s1) of a k
 * chunk: its 8 lanes per output start at zero (s0 == 0) or from part,
 * [row][col][lane] (mr * 64 floats), and go back there (s1 < k / 8) or are
 * reduced and finished into y.
 */
#define SL_GEMM_MR_MAX 6
typedef struct sl_gemm_tile {
	const sl_gemm_args *a;
	float alpha;
	const float *x[SL_GEMM_MR_MAX]; /* the tile's x rows, at step s0 */
	const float *wp; /* the group at step s0 */
	float *part;
	int s0, s1, ks; /* steps of this chunk; ks = k / 8 */
	int r0, n0;     /* the tile's first row and column */
} sl_gemm_tile;

/* The 8 lanes of an output, reduced in the one order every kernel uses:
 * (l0 + l4, l1 + l5, l2 + l6, l3 + l7) = (t0, t1, t2, t3), then
 * (t0 + t2) + (t1 + t3). */
static inline float sl_cpu_lanes_sum(const float *l)
{
	const float t0 = l[0] + l[4], t1 = l[1] + l[5], t2 = l[2] + l[6], t3 = l[3] + l[7];
	return (t0 + t2) + (t1 + t3);
}

/* cpu_amx.c: the bf16 GEMMs of --cpu-gemm amx (AMX tiles) and bf16
 * (AVX512-BF16 dot products): whether each can run here (the CPU's and,
 * for AMX, the kernel's say; false with the reason in why), and the GEMM
 * in the mode c->gemm_bf16 says; SL_EUNSUPPORTED (no message) for a shape
 * it does not take (k not a multiple of 32, 4-bit weights): the caller's
 * packed kernel then runs. */
enum sl_cpu_gemm_bf16 { SL_CPU_GEMM_FP32 = 0, SL_CPU_GEMM_AMX, SL_CPU_GEMM_DPBF16 };
bool sl_cpu_amx_available(char *why, size_t n);
bool sl_cpu_bf16_available(char *why, size_t n);
int sl_cpu_bf16_gemm(sl_backend *b, const sl_gemm_args *a, float alpha);

#if defined(__x86_64__)
/* cpu_x86.c */
sl_cpu_isa sl_cpu_x86_isa(void);
void sl_cpu_half_to_float_avx2(const sl_half *src, float *dst, size_t n);
void sl_cpu_gemm_direct_avx2(const sl_gemm_args *a, float alpha, int n0, int n1);
/* fp16 weights only; the same bits as the AVX2 kernel */
void sl_cpu_gemm_direct_avx512(const sl_gemm_args *a, float alpha, int n0, int n1);
void sl_cpu_q4_rows_avx2(const sl_gemm_args *a, int n0, int rows, float *dst, size_t ld, size_t cs,
			 int kend);
void sl_cpu_pack_w_avx2(const sl_half *w, int k, int rows, int s0, int s1, float *dst);
#define SL_GEMM_MR_AVX2 3
void sl_cpu_gemm_tile_avx2(const sl_gemm_tile *t);
#define SL_GEMM_MR_AVX512 6
void sl_cpu_gemm_tile_avx512(const sl_gemm_tile *t);
#endif

#endif
