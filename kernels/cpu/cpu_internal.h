/*
 * cpu_internal.h - shared state of the CPU backend's files.
 */
#ifndef SL_CPU_INTERNAL_H
#define SL_CPU_INTERNAL_H

#include "backend.h"

#include <pthread.h>
#include <stdbool.h>

/*
 * The instruction sets the CPU kernels are written for, in order.  A
 * backend uses the best its CPU has (x86-64: AVX2 with FMA and F16C),
 * capped by SLUICE_CPU_KERNELS=generic|avx2 (a test's way to run the
 * portable kernels on any machine).  The generic kernels are plain C and
 * build for any architecture.
 */
typedef enum sl_cpu_isa { SL_CPU_GENERIC, SL_CPU_AVX2 } sl_cpu_isa;

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
	/* workspace grown on demand, reused across calls (never freed in the
	 * per-token loop once large enough) */
	float *gemm_wf;  /* fp32 copy of a weight panel */
	size_t gemm_wf_cap;
	float *gemm_c;   /* fp32 result tile */
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

int sl_cpu_gemm(sl_backend *b, sl_queue *q, const sl_gemm_args *a);
int sl_cpu_layernorm(sl_backend *b, sl_queue *q, int rows, int n, const float *x, int ldx,
		     const sl_half *gamma, const sl_half *beta, float eps, float *y, int ldy);
int sl_cpu_embed(sl_backend *b, sl_queue *q, int rows, int n, const sl_half *table,
		 const int32_t *idx, float *y, bool accumulate);
int sl_cpu_attn_prefill(sl_backend *b, sl_queue *q, const sl_attn_args *a);
int sl_cpu_attn_decode(sl_backend *b, sl_queue *q, const sl_attn_args *a);
int sl_cpu_h2o_compact(sl_backend *b, sl_queue *q, const sl_h2o_args *a);
int sl_cpu_h2o_evict(sl_backend *b, sl_queue *q, const sl_h2o_args *a);
int sl_cpu_argmax(sl_backend *b, sl_queue *q, int rows, int n, const float *x, int ldx,
		  int32_t *out);

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

/* The last step of the direct kernels' output y[r][n] (cpu_gemm.c): s, the
 * sum over the first k & ~7 terms, plus the remaining terms one at a time,
 * then the epilogue. */
static inline void sl_cpu_gemm_finish(const sl_gemm_args *a, float alpha, int r, int n, float s)
{
	const sl_half *w = a->w + (size_t)n * a->k;
	const float *x = a->x + (size_t)r * a->ldx;
	for (int kk = a->k & ~7; kk < a->k; kk++)
		s += sl_half_to_float(w[kk]) * x[kk];
	float *y = a->y + (size_t)r * a->ldy + n;
	*y = sl_cpu_epilogue(a, s, n, alpha, *y);
}

#if defined(__x86_64__)
/* cpu_x86.c */
sl_cpu_isa sl_cpu_x86_isa(void);
void sl_cpu_half_to_float_avx2(const sl_half *src, float *dst, size_t n);
void sl_cpu_gemm_direct_avx2(const sl_gemm_args *a, float alpha, int n0, int n1);
#endif

#endif
