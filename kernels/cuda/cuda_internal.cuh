/*
 * cuda_internal.cuh - what the CUDA backend's files share: the context,
 * queue and event structs, per-queue scratch, error macros, and the
 * launchers of each op (one .cu per op, kernels in <op>_kernels.cuh).
 *
 * Nothing here is seen outside kernels/cuda/: the engine talks to the
 * backend through the sl_backend_ops table only (backend.h).
 *
 * Threading: a queue (a CUDA stream) and its scratch belong to whoever
 * issues work on it; two host threads may issue on two different queues at
 * once.  The device-tier accounting (sl_dev_account) is not atomic, so
 * scratch growth on two queues from two threads at the same moment would
 * race on the counters: size scratch at setup (a first call of each op)
 * or issue from one thread.
 */
#ifndef SL_CUDA_INTERNAL_CUH
#define SL_CUDA_INTERNAL_CUH

/* The C headers first, so that their guards hold inside extern "C" below. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

extern "C" {
#include "backend.h"
}
#include "cuda/cuda_backend.h"

#ifdef SL_CU_EMU /* the CPU emulation (emu/): runtime, cuBLAS and device stand-ins */
#include "emu/cuda_emu.h"
#else
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif

#include "cuda_device.cuh"

/* ---- per-queue scratch -------------------------------------------------- */

/* A device buffer that only grows; accounted with sl_dev_account. */
typedef struct sl_cu_scratch {
	void *p;
	size_t bytes;
} sl_cu_scratch;

struct sl_queue {
	cudaStream_t stream;
	cublasHandle_t blas; /* created on the first gemm on this queue */
	void *blas_ws;       /* cuBLAS workspace (accounted) */
	size_t blas_ws_bytes;
	sl_cu_scratch gemm; /* fp16 copy of x, fp32 product for relu+accum */
	sl_cu_scratch attn; /* prefill row max / row sum for the score pass; the
			     * h2o_compact sort where shared memory is too small */
	sl_cu_scratch small; /* argmax results */
};

struct sl_event {
	cudaEvent_t ev;
};

typedef struct sl_cuda_ctx {
	int device;
	int cc_major, cc_minor;
	int sm_count;
	size_t smem_optin; /* max dynamic shared memory per block with opt-in */
	/* cap of each per-queue scratch buffer (gemm, attn); bigger problems
	 * run in chunks.  SLUICE_CUDA_SCRATCH_MAX (a size) overrides the
	 * default, which lets tests reach the chunked paths. */
	size_t scratch_max;
	char name[256];
	sl_queue *defq; /* used where the caller passes a NULL queue */
	char pci_bus_id[32]; /* "0000:65:00.0" */
	size_t mem_bytes;    /* device memory */
	int numa_node;       /* the GPU's NUMA node, for pinned memory; -1: unknown */
} sl_cuda_ctx;

static inline sl_cuda_ctx *sl_cu_ctx(sl_backend *b)
{
	return (sl_cuda_ctx *)b->ctx;
}

/* The queue to issue on: q, or the backend's default queue for NULL. */
static inline sl_queue *sl_cu_queue(sl_backend *b, sl_queue *q)
{
	return q ? q : sl_cu_ctx(b)->defq;
}

/*
 * Make s hold at least bytes.  Growing synchronises q first (earlier work
 * on q may still read the old buffer), then frees and allocates; the new
 * size is accounted on b's device tier (SL_EBUDGET over the limit).
 */
int sl_cu_scratch_reserve(sl_backend *b, sl_queue *q, sl_cu_scratch *s, size_t bytes,
			  const char *what);

/* The cuBLAS handle of q (bound to q's stream, with an accounted workspace). */
int sl_cu_blas(sl_backend *b, sl_queue *q, cublasHandle_t *out);

/* Raise a kernel's dynamic shared memory limit where bytes > 48 KiB;
 * SL_EUNSUPPORTED where the device cannot give that much. */
int sl_cu_smem_limit(sl_backend *b, const void *kernel, size_t bytes, const char *what);

/* ---- errors -------------------------------------------------------------- */

/* Record "cuda: <call> failed: <reason> (file:line)", return SL_EDEVICE. */
int sl_cu_fail(cudaError_t e, const char *call, const char *file, int line);
int sl_cublas_fail(cublasStatus_t s, const char *call, const char *file, int line);

#define SL_CU(call)                                                           \
	do {                                                                  \
		cudaError_t sl_cu_e_ = (call);                                \
		if (sl_cu_e_ != cudaSuccess)                                  \
			return sl_cu_fail(sl_cu_e_, #call, __FILE__, __LINE__); \
	} while (0)

#define SL_CUBLAS(call)                                                       \
	do {                                                                  \
		cublasStatus_t sl_cb_s_ = (call);                             \
		if (sl_cb_s_ != CUBLAS_STATUS_SUCCESS)                        \
			return sl_cublas_fail(sl_cb_s_, #call, __FILE__, __LINE__); \
	} while (0)

/* k<<<grid, block, smem, stream>>>(args...), spelled so that the emulation
 * (emu/) can run the same launcher code on the CPU. */
#ifndef SL_CU_EMU
#define SL_CU_LAUNCH(k, grid, block, smem, stream, ...)                         \
	k<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
#endif

/* After a launch: a bad configuration shows up here. */
#define SL_CU_LAUNCHED(kernel_name)                                           \
	do {                                                                  \
		cudaError_t sl_cu_e_ = cudaGetLastError();                    \
		if (sl_cu_e_ != cudaSuccess)                                  \
			return sl_cu_fail(sl_cu_e_, kernel_name "<<<>>>", __FILE__, __LINE__); \
	} while (0)

/* ---- small helpers -------------------------------------------------------- */

/* ceil(a / b) for positive ints */
static inline int sl_cu_div_up(long long a, long long b)
{
	return (int)((a + b - 1) / b);
}

/* ---- op launchers (one per op file) --------------------------------------- */

/* sl_cu_<op> for each op of backend_ops.def */
#define SL_BACKEND_OP(fn, params, args) int sl_cu_##fn params;
#include "backend_ops.def"

#endif
