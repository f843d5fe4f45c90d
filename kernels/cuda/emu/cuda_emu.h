/*
 * cuda_emu.h - a CPU stand-in for the parts of CUDA, cuda_fp16 and cuBLAS
 * that the CUDA backend uses, so that the backend's own code (launchers and
 * kernels, unchanged) can be compiled by g++ with -DSL_CU_EMU and checked
 * against the CPU backend on machines without a GPU.
 *
 * It is a test tool, not a backend: one host thread runs every kernel to
 * completion at launch, block after block; the threads of a block are
 * cooperative fibers (a register switch on x86-64, ucontext elsewhere; kept
 * from launch to launch) that switch at __syncthreads and at warp
 * shuffles.  What it checks beyond the arithmetic:
 *   - a barrier or shuffle that not all threads (lanes) reach is reported
 *     as a deadlock, with the kernel and block, and aborts;
 *   - launch limits: block size, grid dims, 48 KiB of dynamic shared memory
 *     unless raised with cudaFuncSetAttribute, 4 KiB of parameters;
 *   - dynamic shared memory starts as 0xff or 0x7f bytes (NaN or 3.4e38),
 *     cudaMalloc memory as 0xff, so that reading what no one wrote shows;
 *   - threads run greedily in a priority order (one warp as far as it can
 *     go before the next), reversed on odd blocks, so that a missing
 *     barrier between a write and another thread's read shows;
 *   - cuBLAS argument rules (leading dimensions) as cublasGemmEx has them.
 *
 * Streams are adversarial but legal, so that a missing event between two
 * queues shows as wrong output instead of passing by luck: compute (kernel
 * launches and cuBLAS calls) is deferred, queued on its stream and run only
 * when something forces it (a cudaStreamSynchronize, a cudaEventSynchronize
 * of an event recorded after it, a stream whose copy waits on such an
 * event and is itself forced, cudaFree and cudaFreeHost, which synchronise
 * the device as CUDA's do); copies and memsets run eagerly, at enqueue
 * time, unless their stream still holds earlier work or waits for an event
 * not yet reached, in which case they run as soon as it is.  Only events
 * (cudaEventRecord, cudaStreamWaitEvent) order one stream after another;
 * a wait applies to the event's latest record at the time of the call.
 * So a copy queue that overwrites a buffer without waiting for the event
 * that says the compute stream is done with it overwrites it before the
 * compute reads it.  SL_EMU_STREAMS=sync runs everything at enqueue time
 * instead (to tell such a race from an arithmetic fault).  One host thread
 * only: a call from a second thread aborts.
 */
#ifndef SL_CUDA_EMU_H
#define SL_CUDA_EMU_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

extern "C" {
#include "sl_common.h"
}

/* ---- device-side language ------------------------------------------------- */

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static /* one block runs at a time */
#define SL_CU_DYN_SMEM(type, name) type *name = (type *)sl_emu_dyn_smem()

struct dim3 {
	unsigned x, y, z;
	constexpr dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
extern dim3 threadIdx, blockIdx, blockDim, gridDim;

struct __half {
	uint16_t x;
};
struct __half2 {
	__half x, y;
};
struct uint4 {
	unsigned x, y, z, w;
};
struct float2 {
	float x, y;
};
struct float4 {
	float x, y, z, w;
};

static inline float2 make_float2(float a, float b)
{
	float2 r = { a, b };
	return r;
}
static inline __half __float2half_rn(float f)
{
	__half h = { sl_float_to_half(f) };
	return h;
}
static inline float __half2float(__half h)
{
	return sl_half_to_float(h.x);
}
static inline float2 __half22float2(__half2 h)
{
	return make_float2(__half2float(h.x), __half2float(h.y));
}
/* the IEEE round-to-nearest intrinsics (nvcc never contracts them into an
 * FMA; host C++ at -O2 without -mfma does not either) */
static inline float __fadd_rn(float a, float b)
{
	return a + b;
}
static inline float __fsub_rn(float a, float b)
{
	return a - b;
}
static inline float __fmul_rn(float a, float b)
{
	return a * b;
}
static inline float __fdiv_rn(float a, float b)
{
	return a / b;
}
static inline unsigned short __half_as_ushort(__half h)
{
	return h.x;
}
static inline __half __ushort_as_half(unsigned short u)
{
	__half h = { u };
	return h;
}
static inline unsigned __float_as_uint(float f)
{
	unsigned u;
	memcpy(&u, &f, sizeof(u));
	return u;
}
static inline int min(int a, int b)
{
	return a < b ? a : b;
}
static inline int max(int a, int b)
{
	return a > b ? a : b;
}

void __syncthreads(void);
void *sl_emu_dyn_smem(void);
uint64_t sl_emu_shfl_bits(uint64_t bits, int src_lane);
int sl_emu_lane(void);

template <typename T>
static inline T sl_emu_shfl(T v, int src_lane)
{
	static_assert(sizeof(T) <= 8, "shuffle of at most 8 bytes");
	uint64_t bits = 0;
	memcpy(&bits, &v, sizeof(T));
	bits = sl_emu_shfl_bits(bits, src_lane & 31);
	T r;
	memcpy(&r, &bits, sizeof(T));
	return r;
}
template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask)
{
	(void)mask;
	return sl_emu_shfl(v, sl_emu_lane() ^ lane_mask);
}
template <typename T>
static inline T __shfl_sync(unsigned mask, T v, int src_lane)
{
	(void)mask;
	return sl_emu_shfl(v, src_lane);
}

/* ---- runtime API ---------------------------------------------------------- */

typedef enum cudaError {
	cudaSuccess = 0,
	cudaErrorInvalidValue = 1,
	cudaErrorMemoryAllocation = 2,
	cudaErrorInvalidConfiguration = 9,
	cudaErrorNoDevice = 100,
} cudaError_t;

typedef struct sl_emu_stream *cudaStream_t;
typedef struct sl_emu_event *cudaEvent_t;

enum cudaMemcpyKind {
	cudaMemcpyHostToHost = 0,
	cudaMemcpyHostToDevice = 1,
	cudaMemcpyDeviceToHost = 2,
	cudaMemcpyDeviceToDevice = 3,
	cudaMemcpyDefault = 4,
};
enum cudaDeviceAttr {
	cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};
enum cudaFuncAttribute {
	cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};
#define cudaStreamNonBlocking 0x01u
#define cudaEventDisableTiming 0x02u
#define cudaHostAllocDefault 0x00u

struct cudaDeviceProp {
	char name[256];
	int major, minor;
	int multiProcessorCount;
};

const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev);
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int dev);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind k,
			    cudaStream_t s);
cudaError_t cudaMemsetAsync(void *dst, int v, size_t n, cudaStream_t s);
cudaError_t cudaFuncSetAttribute(const void *kernel, cudaFuncAttribute a, int v);

/* ---- kernel launches ------------------------------------------------------ */

struct sl_emu_launch_info {
	const char *name;
	const void *kernel;
	dim3 grid, block;
	size_t smem;
	size_t param_bytes;
};
/* Checks the configuration (sets the last error and returns false where a
 * GPU would refuse it), then queues body on the stream: it runs once per
 * thread of every block when the stream is forced (see the top). */
bool sl_emu_launch_body(const sl_emu_launch_info &info, cudaStream_t st,
			std::function<void()> body);

template <typename... P>
static constexpr size_t sl_emu_param_bytes(void (*)(P...))
{
	return (0 + ... + ((sizeof(P) + 7) & ~(size_t)7));
}

template <typename... P, typename... A>
static inline void sl_emu_launch(const char *name, void (*k)(P...), dim3 grid, dim3 block,
				 size_t smem, cudaStream_t st, A &&...args)
{
	sl_emu_launch_info info = { name, (const void *)k, grid, block, smem,
				    sl_emu_param_bytes(k) };
	/* the parameters by value, converted at launch as a GPU's are: the
	 * kernel runs later */
	std::tuple<P...> params(std::forward<A>(args)...);
	sl_emu_launch_body(info, st, [k, params]() { std::apply(k, params); });
}

#define SL_CU_LAUNCH(k, grid, block, smem, stream, ...)                         \
	sl_emu_launch(#k, k, dim3(grid), dim3(block), (smem), (stream), __VA_ARGS__)

/* ---- cuBLAS ----------------------------------------------------------------- */

typedef struct sl_emu_blas *cublasHandle_t;
typedef enum {
	CUBLAS_STATUS_SUCCESS = 0,
	CUBLAS_STATUS_NOT_INITIALIZED = 1,
	CUBLAS_STATUS_INVALID_VALUE = 7,
	CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUDA_R_32F = 0, CUDA_R_16F = 2 } cudaDataType_t;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;
typedef enum { CUBLAS_POINTER_MODE_HOST = 0 } cublasPointerMode_t;
typedef enum { CUBLAS_DEFAULT_MATH = 0 } cublasMath_t;

const char *cublasGetStatusString(cublasStatus_t s);
cublasStatus_t cublasCreate(cublasHandle_t *h);
cublasStatus_t cublasDestroy(cublasHandle_t h);
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s);
cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t bytes);
cublasStatus_t cublasSetPointerMode(cublasHandle_t h, cublasPointerMode_t m);
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m);
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
			    int n, int k, const void *alpha, const void *A, cudaDataType_t at,
			    int lda, const void *B, cudaDataType_t bt, int ldb, const void *beta,
			    void *C, cudaDataType_t ct, int ldc, cublasComputeType_t comp,
			    cublasGemmAlgo_t algo);

#endif
