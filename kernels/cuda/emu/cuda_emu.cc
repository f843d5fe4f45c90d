/*
 * cuda_emu.cc - the CPU stand-ins declared in cuda_emu.h: a fiber
 * scheduler that runs a block's threads cooperatively, the runtime API on
 * host memory, and a reference cublasGemmEx.  Test tool only (see the
 * header); single host thread.
 */
#include "cuda_emu.h"

#include <ucontext.h>

#include <map>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define SL_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SL_EMU_ASAN 1
#endif
#endif
#ifdef SL_EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace {

/* ---- fibers -------------------------------------------------------------- */

enum { F_READY, F_WAITING, F_DONE };

struct barrier {
	unsigned n = 0, count = 0, gen = 0;
};

struct fiber {
	ucontext_t ctx;
	char *stack = nullptr;
	int state = F_READY;
	barrier *wait = nullptr;
	unsigned wait_gen = 0;
	unsigned tid = 0;        /* linear thread index in the block */
	unsigned shfl_round = 0; /* which of the two shuffle buffers is next */
};

struct warp_state {
	barrier bar;
	uint64_t buf[2][32];
};

const size_t k_stack = 256 * 1024;

ucontext_t g_sched;
fiber *g_cur = nullptr;
std::vector<fiber> g_fibers;
barrier g_block_bar;
std::vector<warp_state> g_warps;
std::vector<unsigned char> g_smem;
void (*g_body)(void *) = nullptr;
void *g_body_ctx = nullptr;
cudaError_t g_last_error = cudaSuccess;
std::map<const void *, int> g_smem_attr;
#ifdef SL_EMU_ASAN
void *g_sched_fake_stack = nullptr;
#endif

void switch_to_fiber(fiber *f)
{
	g_cur = f;
	const unsigned bx = blockDim.x, by = blockDim.y;
	threadIdx = dim3(f->tid % bx, f->tid / bx % by, f->tid / (bx * by));
#ifdef SL_EMU_ASAN
	__sanitizer_start_switch_fiber(&g_sched_fake_stack, f->stack, k_stack);
#endif
	swapcontext(&g_sched, &f->ctx);
#ifdef SL_EMU_ASAN
	__sanitizer_finish_switch_fiber(g_sched_fake_stack, nullptr, nullptr);
#endif
	g_cur = nullptr;
}

void switch_to_scheduler(bool finished)
{
#ifdef SL_EMU_ASAN
	void *fake = nullptr;
	/* a finished fiber's stack is not coming back: pass NULL to free it */
	__sanitizer_start_switch_fiber(finished ? nullptr : &fake, nullptr, 0);
#else
	(void)finished;
#endif
	swapcontext(&g_cur->ctx, &g_sched);
#ifdef SL_EMU_ASAN
	__sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

void fiber_entry()
{
#ifdef SL_EMU_ASAN
	__sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
	g_body(g_body_ctx);
	g_cur->state = F_DONE;
	switch_to_scheduler(true);
}

void barrier_wait(barrier &b)
{
	if (!g_cur) {
		fprintf(stderr, "cuda_emu: barrier outside a kernel\n");
		abort();
	}
	if (++b.count == b.n) { /* the last to arrive releases the others */
		b.count = 0;
		b.gen++;
		return;
	}
	g_cur->state = F_WAITING;
	g_cur->wait = &b;
	g_cur->wait_gen = b.gen;
	switch_to_scheduler(false);
}

void report_deadlock(const sl_emu_launch_info &info)
{
	fprintf(stderr,
		"cuda_emu: DEADLOCK in %s block (%u,%u,%u): threads wait at a barrier or shuffle "
		"that others never reach\n",
		info.name, blockIdx.x, blockIdx.y, blockIdx.z);
	int shown = 0;
	for (const fiber &f : g_fibers) {
		if (shown >= 8)
			break;
		const char *what = f.state == F_DONE ? "exited"
				   : f.wait == &g_block_bar ? "at __syncthreads"
							     : "at a warp shuffle";
		fprintf(stderr, "  thread %u: %s\n", f.tid, what);
		shown++;
	}
	abort();
}

bool fail(cudaError_t e, const sl_emu_launch_info &info, const char *why)
{
	fprintf(stderr, "cuda_emu: launch of %s refused: %s\n", info.name, why);
	g_last_error = e;
	return false;
}

} /* namespace */

/* ---- device-side hooks ------------------------------------------------------ */

void __syncthreads(void)
{
	barrier_wait(g_block_bar);
}

void *sl_emu_dyn_smem(void)
{
	return g_smem.data();
}

int sl_emu_lane(void)
{
	return (int)(g_cur->tid & 31);
}

uint64_t sl_emu_shfl_bits(uint64_t bits, int src_lane)
{
	fiber *f = g_cur;
	warp_state &w = g_warps[f->tid / 32];
	/* two buffers: a lane cannot start round r + 2 before every lane has
	 * passed the barrier of round r + 1, so round r's values stay put */
	const unsigned r = f->shfl_round++ & 1;
	w.buf[r][f->tid & 31] = bits;
	barrier_wait(w.bar);
	if ((unsigned)src_lane >= w.bar.n) {
		fprintf(stderr, "cuda_emu: shuffle from lane %d of a %u-lane warp\n", src_lane,
			w.bar.n);
		abort();
	}
	return w.buf[r][src_lane];
}

bool sl_emu_run(const sl_emu_launch_info &info, void (*body)(void *), void *ctx)
{
	const unsigned long long nthreads =
		(unsigned long long)info.block.x * info.block.y * info.block.z;
	if (nthreads == 0 || nthreads > 1024 || info.block.z > 64)
		return fail(cudaErrorInvalidConfiguration, info, "block size");
	if (info.grid.x == 0 || info.grid.y == 0 || info.grid.z == 0 ||
	    info.grid.x > 0x7fffffffu || info.grid.y > 65535 || info.grid.z > 65535)
		return fail(cudaErrorInvalidConfiguration, info, "grid size");
	size_t smem_max = 48 * 1024;
	auto it = g_smem_attr.find(info.kernel);
	if (it != g_smem_attr.end() && (size_t)it->second > smem_max)
		smem_max = (size_t)it->second;
	if (info.smem > smem_max)
		return fail(cudaErrorInvalidValue, info,
			    "dynamic shared memory over the limit (cudaFuncSetAttribute?)");
	if (info.param_bytes > 4096)
		return fail(cudaErrorInvalidValue, info, "parameters over 4 KiB");

	blockDim = info.block;
	gridDim = info.grid;
	g_body = body;
	g_body_ctx = ctx;
	g_fibers.assign(nthreads, fiber());
	for (unsigned i = 0; i < nthreads; i++) {
		g_fibers[i].tid = i;
		g_fibers[i].stack = (char *)malloc(k_stack);
		if (!g_fibers[i].stack) {
			fprintf(stderr, "cuda_emu: out of memory for fiber stacks\n");
			abort();
		}
	}
	const unsigned nwarps = (unsigned)((nthreads + 31) / 32);
	g_warps.assign(nwarps, warp_state());
	for (unsigned w = 0; w < nwarps; w++)
		g_warps[w].bar.n = (unsigned)SL_MIN(32ull, nthreads - 32ull * w);
	g_smem.assign(info.smem ? info.smem : 1, 0xff);

	for (unsigned bz = 0; bz < info.grid.z; bz++)
		for (unsigned by = 0; by < info.grid.y; by++)
			for (unsigned bx = 0; bx < info.grid.x; bx++) {
				blockIdx = dim3(bx, by, bz);
				g_block_bar = barrier();
				g_block_bar.n = (unsigned)nthreads;
				for (warp_state &w : g_warps) {
					w.bar.count = 0;
					w.bar.gen = 0;
				}
				/* poison: NaN on half of the blocks, a huge finite
				 * value (3.4e38, which max() does not skip) on the rest */
				const unsigned bsum = bx + by + bz;
				memset(g_smem.data(), (bsum >> 1) & 1 ? 0x7f : 0xff, g_smem.size());
				for (fiber &f : g_fibers) {
					f.state = F_READY;
					f.wait = nullptr;
					f.shfl_round = 0;
					getcontext(&f.ctx);
					f.ctx.uc_stack.ss_sp = f.stack;
					f.ctx.uc_stack.ss_size = k_stack;
					f.ctx.uc_link = nullptr;
					makecontext(&f.ctx, fiber_entry, 0);
				}
				/* Greedy order: always resume the first runnable thread
				 * of a priority list, so one warp runs as far as it can
				 * (to its next __syncthreads) before the others start;
				 * the list is reversed on odd blocks.  A read of what
				 * another warp (or lane) writes without a barrier in
				 * between then sees the 0xff poison in one of the two
				 * orders instead of passing by luck. */
				const bool rev = (bsum & 1) != 0;
				for (;;) {
					fiber *next = nullptr;
					bool all_done = true;
					for (size_t o = 0; o < g_fibers.size(); o++) {
						fiber &f = g_fibers[rev ? g_fibers.size() - 1 - o : o];
						if (f.state == F_DONE)
							continue;
						all_done = false;
						if (f.state == F_WAITING && f.wait->gen == f.wait_gen)
							continue;
						next = &f;
						break;
					}
					if (all_done)
						break;
					if (!next)
						report_deadlock(info);
					next->state = F_READY;
					switch_to_fiber(next);
				}
			}
	for (fiber &f : g_fibers)
		free(f.stack);
	g_fibers.clear();
	return true;
}

/* ---- runtime API ------------------------------------------------------------ */

struct sl_emu_stream {
	int unused;
};
struct sl_emu_event {
	int unused;
};
struct sl_emu_blas {
	cudaStream_t stream;
};

const char *cudaGetErrorString(cudaError_t e)
{
	switch (e) {
	case cudaSuccess: return "no error";
	case cudaErrorInvalidValue: return "invalid argument";
	case cudaErrorMemoryAllocation: return "out of memory";
	case cudaErrorInvalidConfiguration: return "invalid configuration argument";
	case cudaErrorNoDevice: return "no CUDA-capable device is detected";
	}
	return "unknown error";
}

cudaError_t cudaGetLastError(void)
{
	cudaError_t e = g_last_error;
	g_last_error = cudaSuccess;
	return e;
}

static cudaError_t ret(cudaError_t e)
{
	if (e != cudaSuccess)
		g_last_error = e;
	return e;
}

cudaError_t cudaGetDeviceCount(int *n)
{
	if (getenv("SL_EMU_NO_DEVICE")) { /* to test the no-GPU paths */
		*n = 0;
		return ret(cudaErrorNoDevice);
	}
	*n = 1;
	return cudaSuccess;
}

cudaError_t cudaSetDevice(int dev)
{
	return ret(dev == 0 ? cudaSuccess : cudaErrorInvalidValue);
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev)
{
	memset(p, 0, sizeof(*p));
	snprintf(p->name, sizeof(p->name), "emulated GPU (cuda_emu)");
	p->major = 9;
	p->minor = 0;
	p->multiProcessorCount = 132;
	return ret(dev == 0 ? cudaSuccess : cudaErrorInvalidValue);
}

cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int dev)
{
	if (a != cudaDevAttrMaxSharedMemoryPerBlockOptin || dev != 0)
		return ret(cudaErrorInvalidValue);
	*v = 227 * 1024;
	return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t bytes)
{
	*p = nullptr;
	if (bytes == 0)
		return ret(cudaErrorInvalidValue);
	void *m = nullptr;
	if (posix_memalign(&m, 256, bytes) != 0)
		return ret(cudaErrorMemoryAllocation);
	memset(m, 0xff, bytes); /* uninitialised device memory reads as NaN */
	*p = m;
	return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
	free(p);
	return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags)
{
	(void)flags;
	*p = nullptr;
	if (bytes == 0)
		return ret(cudaErrorInvalidValue);
	/* page aligned, as the driver's pinned allocations are (the disk tier
	 * reads and writes them with O_DIRECT) */
	void *m = nullptr;
	if (posix_memalign(&m, 4096, bytes) != 0)
		return ret(cudaErrorMemoryAllocation);
	*p = m;
	return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p)
{
	free(p);
	return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
	(void)flags;
	*s = new sl_emu_stream();
	return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
	delete s;
	return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
	return ret(s ? cudaSuccess : cudaErrorInvalidValue);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags)
{
	(void)flags;
	return ret(s && e ? cudaSuccess : cudaErrorInvalidValue);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
	(void)flags;
	*e = new sl_emu_event();
	return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
	delete e;
	return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
	return ret(s && e ? cudaSuccess : cudaErrorInvalidValue);
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
	return ret(e ? cudaSuccess : cudaErrorInvalidValue);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind k,
			    cudaStream_t s)
{
	(void)k;
	if (!s || (n && (!dst || !src)))
		return ret(cudaErrorInvalidValue);
	memmove(dst, src, n);
	return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *dst, int v, size_t n, cudaStream_t s)
{
	if (!s || (n && !dst))
		return ret(cudaErrorInvalidValue);
	memset(dst, v, n);
	return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *kernel, cudaFuncAttribute a, int v)
{
	if (a != cudaFuncAttributeMaxDynamicSharedMemorySize || v < 0 || v > 227 * 1024)
		return ret(cudaErrorInvalidValue);
	g_smem_attr[kernel] = v;
	return cudaSuccess;
}

/* ---- cuBLAS ------------------------------------------------------------------- */

const char *cublasGetStatusString(cublasStatus_t s)
{
	switch (s) {
	case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
	case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
	case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
	case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
	}
	return "CUBLAS_STATUS_UNKNOWN";
}

cublasStatus_t cublasCreate(cublasHandle_t *h)
{
	*h = new sl_emu_blas();
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t h)
{
	delete h;
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s)
{
	if (!h)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	h->stream = s;
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t bytes)
{
	(void)ws;
	(void)bytes;
	return h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasSetPointerMode(cublasHandle_t h, cublasPointerMode_t m)
{
	(void)m;
	return h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m)
{
	(void)m;
	return h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

/* column-major C (m, n) = alpha op(A) op(B) + beta C; fp16 A, B; fp32 C */
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
			    int n, int k, const void *alpha, const void *A, cudaDataType_t at,
			    int lda, const void *B, cudaDataType_t bt, int ldb, const void *beta,
			    void *C, cudaDataType_t ct, int ldc, cublasComputeType_t comp,
			    cublasGemmAlgo_t algo)
{
	(void)algo;
	if (!h)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (at != CUDA_R_16F || bt != CUDA_R_16F || ct != CUDA_R_32F || comp != CUBLAS_COMPUTE_32F)
		return CUBLAS_STATUS_NOT_SUPPORTED;
	const int arows = ta == CUBLAS_OP_N ? m : k;
	const int brows = tb == CUBLAS_OP_N ? k : n;
	if (m < 0 || n < 0 || k < 0 || lda < SL_MAX(1, arows) || ldb < SL_MAX(1, brows) ||
	    ldc < SL_MAX(1, m))
		return CUBLAS_STATUS_INVALID_VALUE;
	const float al = *(const float *)alpha, be = *(const float *)beta;
	const uint16_t *a = (const uint16_t *)A, *b = (const uint16_t *)B;
	float *c = (float *)C;
	for (int j = 0; j < n; j++)
		for (int i = 0; i < m; i++) {
			double s = 0.0;
			for (int p = 0; p < k; p++) {
				const uint16_t av = ta == CUBLAS_OP_N ? a[i + (size_t)p * lda]
								      : a[p + (size_t)i * lda];
				const uint16_t bv = tb == CUBLAS_OP_N ? b[p + (size_t)j * ldb]
								      : b[j + (size_t)p * ldb];
				s += (double)sl_half_to_float(av) * sl_half_to_float(bv);
			}
			float *cp = c + i + (size_t)j * ldc;
			*cp = be == 0.f ? al * (float)s : al * (float)s + be * *cp;
		}
	return CUBLAS_STATUS_SUCCESS;
}
