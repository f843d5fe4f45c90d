/*
 * cpu_internal.h - shared state of the CPU backend's files.
 */
#ifndef SL_CPU_INTERNAL_H
#define SL_CPU_INTERNAL_H

#include "backend.h"

#include <pthread.h>
#include <stdbool.h>

typedef struct sl_cpu_ctx {
	int nthreads;
	int simd; /* 1: AVX2 + FMA + F16C kernels usable */
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

#endif
