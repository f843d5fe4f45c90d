/*
 * cuda_emu.cc - the CPU stand-ins declared in cuda_emu.h: a fiber
 * scheduler that runs a block's threads cooperatively, the runtime API on
 * host memory with deferred compute and eager copies (the stream model of
 * the header), and a reference cublasGemmEx.  Test tool only (see the
 * header); single host thread.
 */
#include "cuda_emu.h"
#include "cuda_emu_stats.h"

#include <cblas.h>
#include <pthread.h>
#include <ucontext.h>

#include <deque>
#include <map>
#include <memory>
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

/*
 * A fiber is one GPU thread.  Fibers are kept from launch to launch (a pool
 * as large as the largest block so far): each one runs the kernel body for
 * its thread of a block, marks itself done and yields; the scheduler resumes
 * it for the next block.  Switching is a few instructions on x86-64 (the
 * callee-saved registers and the stack pointer, sl_emu_switch below), and
 * swapcontext elsewhere, which costs two system calls (the signal mask) per
 * switch.
 */

enum { F_READY, F_WAITING, F_DONE };

struct barrier {
	unsigned n = 0, count = 0, gen = 0;
};

struct fiber {
#if defined(__x86_64__)
	void *sp = nullptr; /* saved stack pointer while switched out */
#else
	ucontext_t ctx;
#endif
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

fiber *g_cur = nullptr;
std::vector<fiber *> g_pool; /* fibers, in thread order; a launch uses the first ones */
unsigned g_nthreads = 0;     /* of the running launch */
unsigned g_releases = 0;     /* barriers released so far */
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

#if defined(__x86_64__)
/* sl_emu_switch(&save, to): push the callee-saved registers, save the stack
 * pointer in *save, load `to` and pop the registers saved there (System V
 * AMD64: rbx, rbp, r12-r15 are the callee-saved ones; the x87 and SSE
 * control words are not changed by the kernels). */
extern "C" void sl_emu_switch(void **save, void *to);
__asm__(".text\n"
	".globl sl_emu_switch\n"
	".hidden sl_emu_switch\n"
	".type sl_emu_switch, @function\n"
	"sl_emu_switch:\n"
	"\tpushq %rbp\n"
	"\tpushq %rbx\n"
	"\tpushq %r12\n"
	"\tpushq %r13\n"
	"\tpushq %r14\n"
	"\tpushq %r15\n"
	"\tmovq %rsp, (%rdi)\n"
	"\tmovq %rsi, %rsp\n"
	"\tpopq %r15\n"
	"\tpopq %r14\n"
	"\tpopq %r13\n"
	"\tpopq %r12\n"
	"\tpopq %rbx\n"
	"\tpopq %rbp\n"
	"\tret\n"
	".size sl_emu_switch, .-sl_emu_switch\n");
void *g_sched_sp = nullptr;
#else
ucontext_t g_sched;
#endif

void fiber_entry();

/* The pool lives as long as the process; freed at exit, so that leak
 * checkers see nothing left (destroyed before g_pool, declared above). */
struct pool_owner {
	~pool_owner()
	{
		for (fiber *f : g_pool) {
			free(f->stack);
			delete f;
		}
		g_pool.clear();
	}
} g_pool_owner;

fiber *fiber_new(unsigned tid)
{
	fiber *f = new fiber();
	f->tid = tid;
	f->stack = (char *)malloc(k_stack);
	if (!f->stack) {
		fprintf(stderr, "cuda_emu: out of memory for fiber stacks\n");
		abort();
	}
#if defined(__x86_64__)
	/* a frame sl_emu_switch can return into: six registers, then
	 * fiber_entry's address, then a null return address, with the stack
	 * aligned as at a function's entry (rsp + 8 a multiple of 16) */
	uintptr_t top = ((uintptr_t)f->stack + k_stack) & ~(uintptr_t)15;
	void **sp = (void **)top;
	*--sp = nullptr;
	*--sp = (void *)fiber_entry;
	for (int i = 0; i < 6; i++)
		*--sp = nullptr;
	f->sp = sp;
#else
	getcontext(&f->ctx);
	f->ctx.uc_stack.ss_sp = f->stack;
	f->ctx.uc_stack.ss_size = k_stack;
	f->ctx.uc_link = nullptr;
	makecontext(&f->ctx, fiber_entry, 0);
#endif
	return f;
}

void switch_to_fiber(fiber *f)
{
	g_cur = f;
	const unsigned bx = blockDim.x, by = blockDim.y;
	threadIdx = dim3(f->tid % bx, f->tid / bx % by, f->tid / (bx * by));
#ifdef SL_EMU_ASAN
	__sanitizer_start_switch_fiber(&g_sched_fake_stack, f->stack, k_stack);
#endif
#if defined(__x86_64__)
	sl_emu_switch(&g_sched_sp, f->sp);
#else
	swapcontext(&g_sched, &f->ctx);
#endif
#ifdef SL_EMU_ASAN
	__sanitizer_finish_switch_fiber(g_sched_fake_stack, nullptr, nullptr);
#endif
	g_cur = nullptr;
}

void switch_to_scheduler(void)
{
#ifdef SL_EMU_ASAN
	void *fake = nullptr;
	__sanitizer_start_switch_fiber(&fake, nullptr, 0);
#endif
#if defined(__x86_64__)
	sl_emu_switch(&g_cur->sp, g_sched_sp);
#else
	swapcontext(&g_cur->ctx, &g_sched);
#endif
#ifdef SL_EMU_ASAN
	__sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

/* A fiber's life: the body for its thread of each block it is given. */
void fiber_entry()
{
#ifdef SL_EMU_ASAN
	__sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
	for (;;) {
		g_body(g_body_ctx);
		g_cur->state = F_DONE;
		switch_to_scheduler();
	}
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
		g_releases++;
		return;
	}
	g_cur->state = F_WAITING;
	g_cur->wait = &b;
	g_cur->wait_gen = b.gen;
	switch_to_scheduler();
}

void report_deadlock(const sl_emu_launch_info &info)
{
	fprintf(stderr,
		"cuda_emu: DEADLOCK in %s block (%u,%u,%u): threads wait at a barrier or shuffle "
		"that others never reach\n",
		info.name, blockIdx.x, blockIdx.y, blockIdx.z);
	int shown = 0;
	for (unsigned i = 0; i < g_nthreads; i++) {
		const fiber &f = *g_pool[i];
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

namespace {

/* What a GPU would refuse at launch (sets the last error). */
bool launch_ok(const sl_emu_launch_info &info)
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
	return true;
}

/* Run a checked launch: body once per thread of every block. */
void run_kernel(const sl_emu_launch_info &info, void (*body)(void *), void *ctx)
{
	const unsigned nthreads = info.block.x * info.block.y * info.block.z;
	blockDim = info.block;
	gridDim = info.grid;
	g_body = body;
	g_body_ctx = ctx;
	while (g_pool.size() < nthreads)
		g_pool.push_back(fiber_new((unsigned)g_pool.size()));
	g_nthreads = nthreads;
	const unsigned nwarps = (nthreads + 31) / 32;
	g_warps.assign(nwarps, warp_state());
	for (unsigned w = 0; w < nwarps; w++)
		g_warps[w].bar.n = SL_MIN(32u, nthreads - 32u * w);
	g_smem.assign(info.smem ? info.smem : 1, 0xff);

	for (unsigned bz = 0; bz < info.grid.z; bz++)
		for (unsigned by = 0; by < info.grid.y; by++)
			for (unsigned bx = 0; bx < info.grid.x; bx++) {
				blockIdx = dim3(bx, by, bz);
				g_block_bar = barrier();
				g_block_bar.n = nthreads;
				for (warp_state &w : g_warps) {
					w.bar.count = 0;
					w.bar.gen = 0;
				}
				/* poison: NaN on half of the blocks, a huge finite
				 * value (3.4e38, which max() does not skip) on the rest */
				const unsigned bsum = bx + by + bz;
				memset(g_smem.data(), (bsum >> 1) & 1 ? 0x7f : 0xff, g_smem.size());
				for (unsigned i = 0; i < nthreads; i++) {
					fiber &f = *g_pool[i];
					f.state = F_READY;
					f.wait = nullptr;
					f.shfl_round = 0;
				}
				/* Greedy order: always resume the first runnable thread
				 * of a priority list, so one warp runs as far as it can
				 * (to its next __syncthreads) before the others start;
				 * the list is reversed on odd blocks.  A read of what
				 * another warp (or lane) writes without a barrier in
				 * between then sees the 0xff poison in one of the two
				 * orders instead of passing by luck.  The threads before
				 * the one that ran last are all waiting or done, unless
				 * it released a barrier since: the search starts after it
				 * or, after a release, from the start. */
				const bool rev = (bsum & 1) != 0;
				unsigned ndone = 0, from = 0, releases = g_releases;
				while (ndone < nthreads) {
					if (g_releases != releases) {
						releases = g_releases;
						from = 0;
					}
					fiber *next = nullptr;
					unsigned o = from;
					for (; o < nthreads; o++) {
						fiber &f = *g_pool[rev ? nthreads - 1 - o : o];
						if (f.state == F_DONE ||
						    (f.state == F_WAITING && f.wait->gen == f.wait_gen))
							continue;
						next = &f;
						break;
					}
					if (!next)
						report_deadlock(info);
					next->state = F_READY;
					switch_to_fiber(next);
					if (next->state == F_DONE)
						ndone++;
					from = o + 1;
				}
			}
}

} /* namespace */

/* ---- runtime API ------------------------------------------------------------ */

/* ---- streams: deferred compute, eager copies, ordered by events only ------ */

namespace {

/* One cudaEventRecord: done once its stream has run everything before it. */
struct record {
	sl_emu_stream *stream;
	bool done;
};
typedef std::shared_ptr<record> record_ptr;

enum op_kind {
	OP_COMPUTE, /* a kernel or a cuBLAS call: runs when the stream is forced */
	OP_COPY,    /* a copy or memset: runs as soon as the stream reaches it */
	OP_RECORD,  /* completes rec */
	OP_WAIT,    /* blocks the stream until rec is done */
};

struct op {
	op_kind kind;
	std::function<void()> fn; /* OP_COMPUTE, OP_COPY */
	record_ptr rec;           /* OP_RECORD, OP_WAIT */
};

} /* namespace */

struct sl_emu_stream {
	std::deque<op> ops; /* issued, not yet run, in issue order */
};
struct sl_emu_event {
	record_ptr last; /* the latest record; NULL: never recorded */
};
struct sl_emu_blas {
	cudaStream_t stream;
};

namespace {

std::vector<sl_emu_stream *> g_streams; /* every live stream */
unsigned long g_computed = 0;            /* compute ops run */
unsigned long g_dry_waits = 0;           /* sl_emu_dry_waits */
sl_emu_stream *g_null_stream = nullptr;  /* launches on stream 0 */
int g_sync_mode = -1;                    /* SL_EMU_STREAMS=sync: run at enqueue */
bool g_have_thread = false;
pthread_t g_thread;

void one_thread(void)
{
	if (!g_have_thread) {
		g_thread = pthread_self();
		g_have_thread = true;
	} else if (!pthread_equal(g_thread, pthread_self())) {
		fprintf(stderr, "cuda_emu: called from a second host thread (it serves one)\n");
		abort();
	}
}

bool sync_mode(void)
{
	if (g_sync_mode < 0) {
		const char *e = getenv("SL_EMU_STREAMS");
		g_sync_mode = e && !strcmp(e, "sync");
	}
	return g_sync_mode != 0;
}

void force_until(const record_ptr &r);

/* Run the first op of s where it may run now: copies and records always,
 * waits once their record is done, compute only when forced (a forced
 * wait first forces the stream it waits for).  Returns whether anything
 * ran (a forced wait counts: its record is done now). */
bool step(sl_emu_stream *s, bool force)
{
	if (s->ops.empty())
		return false;
	op &head = s->ops.front();
	if (head.kind == OP_WAIT && !head.rec->done) {
		if (!force)
			return false;
		force_until(head.rec);
		return true;
	}
	if (head.kind == OP_COMPUTE && !force && !sync_mode())
		return false;
	op o = std::move(head);
	s->ops.pop_front();
	if (o.kind == OP_RECORD)
		o.rec->done = true;
	else if (o.fn)
		o.fn();
	if (o.kind == OP_COMPUTE)
		g_computed++;
	return true;
}

/* Force r's stream up to r. */
void force_until(const record_ptr &r)
{
	while (!r->done)
		if (!step(r->stream, true)) {
			fprintf(stderr, "cuda_emu: an event record that never completes\n");
			abort();
		}
}

/* Let every stream run what it may without forcing, until nothing moves. */
void pump(void)
{
	for (bool moved = true; moved;) {
		moved = false;
		for (size_t i = 0; i < g_streams.size(); i++)
			while (step(g_streams[i], false))
				moved = true;
	}
}

/* After a host wait that began when g_computed was `before`: count it when
 * it ran compute and none is left queued. */
void host_waited(unsigned long before)
{
	if (g_computed == before)
		return;
	for (sl_emu_stream *s : g_streams)
		for (const op &o : s->ops)
			if (o.kind == OP_COMPUTE)
				return;
	g_dry_waits++;
}

void drain(sl_emu_stream *s)
{
	while (!s->ops.empty())
		step(s, true);
}

/* cudaDeviceSynchronize: what cudaFree and cudaFreeHost do first. */
void drain_all(void)
{
	for (size_t i = 0; i < g_streams.size(); i++)
		drain(g_streams[i]);
	pump();
}

void enqueue(sl_emu_stream *s, op_kind kind, std::function<void()> fn, record_ptr rec)
{
	one_thread();
	s->ops.push_back(op{ kind, std::move(fn), std::move(rec) });
	pump();
}

sl_emu_stream *stream_or_null(cudaStream_t s)
{
	if (s)
		return s;
	if (!g_null_stream) {
		g_null_stream = new sl_emu_stream();
		g_streams.push_back(g_null_stream);
	}
	return g_null_stream;
}

} /* namespace */

bool sl_emu_launch_body(const sl_emu_launch_info &info, cudaStream_t st,
			std::function<void()> body)
{
	if (!launch_ok(info))
		return false;
	enqueue(stream_or_null(st), OP_COMPUTE,
		[info, body]() {
			run_kernel(info, [](void *c) { (*static_cast<const std::function<void()> *>(c))(); },
				   (void *)&body);
		},
		nullptr);
	return true;
}

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
	if (p)
		drain_all(); /* as CUDA's: the device is synchronised first */
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
	if (p)
		drain_all();
	free(p);
	return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
	(void)flags;
	one_thread();
	*s = new sl_emu_stream();
	g_streams.push_back(*s);
	return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
	if (!s)
		return ret(cudaErrorInvalidValue);
	drain(s); /* CUDA finishes a destroyed stream's work */
	pump();
	for (size_t i = 0; i < g_streams.size(); i++)
		if (g_streams[i] == s) {
			g_streams.erase(g_streams.begin() + (long)i);
			break;
		}
	delete s;
	return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
	if (!s)
		return ret(cudaErrorInvalidValue);
	const unsigned long before = g_computed;
	drain(s);
	pump();
	host_waited(before);
	return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags)
{
	(void)flags;
	if (!s || !e)
		return ret(cudaErrorInvalidValue);
	/* never recorded, or reached already: nothing to wait for */
	if (e->last && !e->last->done)
		enqueue(s, OP_WAIT, nullptr, e->last);
	return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
	(void)flags;
	*e = new sl_emu_event();
	return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
	delete e; /* waits already issued keep its records */
	return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
	if (!s || !e)
		return ret(cudaErrorInvalidValue);
	e->last = std::make_shared<record>(record{ s, false });
	enqueue(s, OP_RECORD, nullptr, e->last);
	return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
	if (!e)
		return ret(cudaErrorInvalidValue);
	one_thread();
	const unsigned long before = g_computed;
	if (e->last)
		force_until(e->last);
	pump();
	host_waited(before);
	return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind k,
			    cudaStream_t s)
{
	(void)k;
	if (!s || (n && (!dst || !src)))
		return ret(cudaErrorInvalidValue);
	enqueue(s, OP_COPY, [dst, src, n]() { memmove(dst, src, n); }, nullptr);
	return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *dst, int v, size_t n, cudaStream_t s)
{
	if (!s || (n && !dst))
		return ret(cudaErrorInvalidValue);
	enqueue(s, OP_COPY, [dst, v, n]() { memset(dst, v, n); }, nullptr);
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

namespace {

/* op(X) of a stored column-major fp16 matrix (rows x cols, leading
 * dimension ld) as fp32, column-major with leading dimension rows. */
std::vector<float> widen(const uint16_t *x, int rows, int cols, int ld)
{
	std::vector<float> f((size_t)SL_MAX(rows, 1) * SL_MAX(cols, 1));
	for (int j = 0; j < cols; j++)
		for (int i = 0; i < rows; i++)
			f[i + (size_t)j * rows] = sl_half_to_float(x[i + (size_t)j * ld]);
	return f;
}

/* The product, as cuBLAS computes it with CUBLAS_COMPUTE_32F: fp32
 * accumulation (here OpenBLAS's sgemm on the widened operands); C is not
 * read where beta is 0. */
void gemm_run(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float al,
	      const uint16_t *a, int lda, const uint16_t *b, int ldb, float be, float *c, int ldc)
{
	if (m == 0 || n == 0)
		return;
	if (be == 0.f)
		for (int j = 0; j < n; j++)
			memset(c + (size_t)j * ldc, 0, (size_t)m * sizeof(float));
	if (k == 0) {
		for (int j = 0; j < n; j++)
			for (int i = 0; i < m; i++)
				c[i + (size_t)j * ldc] *= be;
		return;
	}
	const int arows = ta == CUBLAS_OP_N ? m : k, acols = ta == CUBLAS_OP_N ? k : m;
	const int brows = tb == CUBLAS_OP_N ? k : n, bcols = tb == CUBLAS_OP_N ? n : k;
	std::vector<float> af = widen(a, arows, acols, lda), bf = widen(b, brows, bcols, ldb);
	cblas_sgemm(CblasColMajor, ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
		    tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, m, n, k, al, af.data(), arows,
		    bf.data(), brows, be, c, ldc);
}

} /* namespace */

/* column-major C (m, n) = alpha op(A) op(B) + beta C; fp16 A, B; fp32 C;
 * queued on the handle's stream */
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
	/* the pointer mode is host: alpha and beta are read now */
	const float al = *(const float *)alpha, be = *(const float *)beta;
	const uint16_t *a = (const uint16_t *)A, *b = (const uint16_t *)B;
	float *c = (float *)C;
	enqueue(stream_or_null(h->stream), OP_COMPUTE,
		[=]() { gemm_run(ta, tb, m, n, k, al, a, lda, b, ldb, be, c, ldc); }, nullptr);
	return CUBLAS_STATUS_SUCCESS;
}

unsigned long sl_emu_dry_waits(void)
{
	return g_dry_waits;
}
