/*
 * cuda_backend.cu - the CUDA backend: device discovery, memory, queues
 * (non-blocking CUDA streams), events, copies, per-queue scratch and the
 * sl_backend_ops table.  The ops live in one file each (gemm.cu,
 * layernorm.cu, embed.cu, attention.cu, argmax.cu, h2o.cu).
 *
 * Every CUDA and cuBLAS call is checked; a failure is recorded with
 * sl_err() as "cuda: <call> failed: <reason> (file:line)" and returned as
 * SL_EDEVICE.  Nothing here exits.
 */
#include "cuda_internal.cuh"

#include <string.h>
#ifndef SL_CU_EMU
#include "topology.h"
#endif

/* ---- errors -------------------------------------------------------------- */

/* "cudaMemcpyAsync(dst, ...)" -> "cudaMemcpyAsync"; drop the "../" meson
 * puts before the source path. */
static void sl_cu_names(const char *call, const char *file, char *fn, size_t fn_size,
			const char **short_file)
{
	size_t n = strcspn(call, "(");
	if (n >= fn_size)
		n = fn_size - 1;
	memcpy(fn, call, n);
	fn[n] = '\0';
	while (!strncmp(file, "../", 3))
		file += 3;
	*short_file = file;
}

int sl_cu_fail(cudaError_t e, const char *call, const char *file, int line)
{
	char fn[96];
	const char *f;
	sl_cu_names(call, file, fn, sizeof(fn), &f);
	/* clear a non-sticky error so that the next launch check does not
	 * report it again (sticky ones stay, and every later call fails) */
	(void)cudaGetLastError();
	return sl_err(SL_EDEVICE, "cuda: %s failed: %s (%s:%d)", fn, cudaGetErrorString(e), f,
		      line);
}

int sl_cublas_fail(cublasStatus_t s, const char *call, const char *file, int line)
{
	char fn[96];
	const char *f;
	sl_cu_names(call, file, fn, sizeof(fn), &f);
	return sl_err(SL_EDEVICE, "cuda: %s failed: %s (%s:%d)", fn, cublasGetStatusString(s), f,
		      line);
}

/* ---- scratch -------------------------------------------------------------- */

static void sl_cu_scratch_release(sl_backend *b, sl_cu_scratch *s)
{
	if (s->p) {
		cudaFree(s->p);
		sl_dev_unaccount(b, s->bytes);
	}
	s->p = NULL;
	s->bytes = 0;
}

int sl_cu_scratch_reserve(sl_backend *b, sl_queue *q, sl_cu_scratch *s, size_t bytes,
			  const char *what)
{
	if (s->bytes >= bytes)
		return 0;
	if (s->p) {
		/* earlier work on q may still read the old buffer */
		SL_CU(cudaStreamSynchronize(q->stream));
		sl_cu_scratch_release(b, s);
	}
	/* round up to 1 MiB so that small growth steps don't realloc each call */
	const size_t mib = (size_t)1 << 20;
	size_t want = (bytes + mib - 1) / mib * mib;
	SL_TRY(sl_dev_account(b, want, what));
	cudaError_t e = cudaMalloc(&s->p, want);
	if (e != cudaSuccess) {
		s->p = NULL;
		sl_dev_unaccount(b, want);
		(void)cudaGetLastError();
		return sl_err(SL_EDEVICE, "cuda: cudaMalloc failed: %s (%zu bytes of scratch for %s)",
			      cudaGetErrorString(e), want, what);
	}
	s->bytes = want;
	return 0;
}

/* cuBLAS picks its kernels knowing the workspace; 32 MiB is what NVIDIA
 * recommends for Hopper, 4 MiB for the others. */
static size_t sl_cu_blas_ws_bytes(const sl_cuda_ctx *c)
{
	return (c->cc_major >= 9 ? (size_t)32 : (size_t)4) << 20;
}

int sl_cu_blas(sl_backend *b, sl_queue *q, cublasHandle_t *out)
{
	if (q->blas) {
		*out = q->blas;
		return 0;
	}
	const size_t ws = sl_cu_blas_ws_bytes(sl_cu_ctx(b));
	if (!q->blas_ws) { /* kept from an earlier try whose handle failed */
		SL_TRY(sl_dev_account(b, ws, "cuBLAS workspace"));
		cudaError_t e = cudaMalloc(&q->blas_ws, ws);
		if (e != cudaSuccess) {
			q->blas_ws = NULL;
			sl_dev_unaccount(b, ws);
			return sl_cu_fail(e, "cudaMalloc", __FILE__, __LINE__);
		}
		q->blas_ws_bytes = ws;
	}
	cublasHandle_t h = NULL;
	cublasStatus_t s = cublasCreate(&h);
	if (s != CUBLAS_STATUS_SUCCESS)
		return sl_cublas_fail(s, "cublasCreate", __FILE__, __LINE__);
	/* cublasSetStream resets the workspace to the default pool: the
	 * stream first, then our own (accounted) workspace. */
	const char *call = "cublasSetStream";
	if ((s = cublasSetStream(h, q->stream)) == CUBLAS_STATUS_SUCCESS &&
	    (call = "cublasSetWorkspace",
	     s = cublasSetWorkspace(h, q->blas_ws, ws)) == CUBLAS_STATUS_SUCCESS &&
	    (call = "cublasSetPointerMode",
	     s = cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST)) == CUBLAS_STATUS_SUCCESS &&
	    (call = "cublasSetMathMode",
	     s = cublasSetMathMode(h, CUBLAS_DEFAULT_MATH)) == CUBLAS_STATUS_SUCCESS) {
		q->blas = h;
		*out = h;
		return 0;
	}
	cublasDestroy(h);
	return sl_cublas_fail(s, call, __FILE__, __LINE__);
}

int sl_cu_smem_limit(sl_backend *b, const void *kernel, size_t bytes, const char *what)
{
	if (bytes <= 48 * 1024)
		return 0;
	if (bytes > sl_cu_ctx(b)->smem_optin)
		return sl_err(SL_EUNSUPPORTED,
			      "cuda: %s needs %zu bytes of shared memory per block, the GPU gives at most %zu",
			      what, bytes, sl_cu_ctx(b)->smem_optin);
	SL_CU(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
				   (int)bytes));
	return 0;
}

/* ---- memory ---------------------------------------------------------------- */

static int cu_dev_alloc(sl_backend *b, size_t bytes, void **out)
{
	*out = NULL;
	cudaError_t e = cudaMalloc(out, bytes ? bytes : 1);
	if (e != cudaSuccess) {
		*out = NULL;
		(void)cudaGetLastError(); /* out of memory is not sticky */
		return sl_err(SL_EDEVICE, "cuda: cudaMalloc failed: %s (%zu bytes)",
			      cudaGetErrorString(e), bytes);
	}
	return 0;
}

static void cu_dev_free(sl_backend *b, void *p)
{
	if (p)
		cudaFree(p);
}

/* ---- pinned memory on the GPU's NUMA node -------------------------------------- */

/* Pinned buffers are allocated on the GPU's node (sl_cuda_ctx.numa_node,
 * found through the GPU's PCI address): the driver faults the pages in
 * while pinning them, under the calling thread's memory policy, which
 * cu_host_alloc binds to that node (topology.h; nothing with one node). */
static int cu_host_alloc(sl_backend *b, size_t bytes, void **out)
{
	*out = NULL;
#ifndef SL_CU_EMU
	sl_topo_membind mb;
	const bool bound = sl_topo_membind_begin(sl_cu_ctx(b)->numa_node, &mb);
#endif
	cudaError_t e = cudaHostAlloc(out, bytes ? bytes : 1, cudaHostAllocDefault);
#ifndef SL_CU_EMU
	if (bound)
		sl_topo_membind_end(&mb);
#endif
	if (e != cudaSuccess) {
		*out = NULL;
		(void)cudaGetLastError();
		return sl_err(SL_EDEVICE, "cuda: cudaHostAlloc failed: %s (%zu bytes of pinned memory)",
			      cudaGetErrorString(e), bytes);
	}
	return 0;
}

static void cu_host_free(sl_backend *b, void *p)
{
	if (p)
		cudaFreeHost(p);
}

/* ---- queues and events ------------------------------------------------------ */

static void cu_queue_destroy(sl_backend *b, sl_queue *q)
{
	if (!q)
		return;
	if (q->stream)
		cudaStreamSynchronize(q->stream); /* scratch may still be in use */
	if (q->blas)
		cublasDestroy(q->blas);
	if (q->blas_ws) {
		cudaFree(q->blas_ws);
		sl_dev_unaccount(b, q->blas_ws_bytes);
	}
	sl_cu_scratch_release(b, &q->gemm);
	sl_cu_scratch_release(b, &q->attn);
	sl_cu_scratch_release(b, &q->small);
	if (q->stream)
		cudaStreamDestroy(q->stream);
	free(q);
}

static int cu_queue_create(sl_backend *b, sl_queue **out)
{
	*out = NULL;
	sl_queue *q = (sl_queue *)calloc(1, sizeof(*q));
	if (!q)
		return sl_err(SL_ENOMEM, "cuda: out of host memory for a queue");
	cudaError_t e = cudaStreamCreateWithFlags(&q->stream, cudaStreamNonBlocking);
	if (e != cudaSuccess) {
		free(q);
		return sl_cu_fail(e, "cudaStreamCreateWithFlags", __FILE__, __LINE__);
	}
	*out = q;
	return 0;
}

static void cu_queue_free(sl_backend *b, sl_queue *q)
{
	cu_queue_destroy(b, q);
}

static int cu_queue_sync(sl_backend *b, sl_queue *q)
{
	q = sl_cu_queue(b, q);
	SL_CU(cudaStreamSynchronize(q->stream));
	return 0;
}

static int cu_event_create(sl_backend *b, sl_event **out)
{
	*out = NULL;
	sl_event *ev = (sl_event *)calloc(1, sizeof(*ev));
	if (!ev)
		return sl_err(SL_ENOMEM, "cuda: out of host memory for an event");
	cudaError_t e = cudaEventCreateWithFlags(&ev->ev, cudaEventDisableTiming);
	if (e != cudaSuccess) {
		free(ev);
		return sl_cu_fail(e, "cudaEventCreateWithFlags", __FILE__, __LINE__);
	}
	*out = ev;
	return 0;
}

static void cu_event_free(sl_backend *b, sl_event *e)
{
	if (!e)
		return;
	cudaEventDestroy(e->ev);
	free(e);
}

static int cu_event_record(sl_backend *b, sl_event *e, sl_queue *q)
{
	q = sl_cu_queue(b, q);
	SL_CU(cudaEventRecord(e->ev, q->stream));
	return 0;
}

static int cu_queue_wait(sl_backend *b, sl_queue *q, sl_event *e)
{
	q = sl_cu_queue(b, q);
	SL_CU(cudaStreamWaitEvent(q->stream, e->ev, 0));
	return 0;
}

static int cu_event_sync(sl_backend *b, sl_event *e)
{
	SL_CU(cudaEventSynchronize(e->ev));
	return 0;
}

/* ---- copies ----------------------------------------------------------------- */

static int cu_copy(sl_backend *b, sl_queue *q, void *dst, const void *src, size_t n,
		   cudaMemcpyKind kind)
{
	if (n == 0)
		return 0;
	q = sl_cu_queue(b, q);
	SL_CU(cudaMemcpyAsync(dst, src, n, kind, q->stream));
	return 0;
}

static int cu_copy_h2d(sl_backend *b, sl_queue *q, void *dst, const void *src, size_t n)
{
	return cu_copy(b, q, dst, src, n, cudaMemcpyHostToDevice);
}

static int cu_copy_d2h(sl_backend *b, sl_queue *q, void *dst, const void *src, size_t n)
{
	return cu_copy(b, q, dst, src, n, cudaMemcpyDeviceToHost);
}

static int cu_copy_d2d(sl_backend *b, sl_queue *q, void *dst, const void *src, size_t n)
{
	return cu_copy(b, q, dst, src, n, cudaMemcpyDeviceToDevice);
}

static int cu_memset_dev(sl_backend *b, sl_queue *q, void *dst, int value, size_t n)
{
	if (n == 0)
		return 0;
	q = sl_cu_queue(b, q);
	SL_CU(cudaMemsetAsync(dst, value, n, q->stream));
	return 0;
}

/* ---- the table ---------------------------------------------------------------- */

static void cu_backend_free(sl_backend *b);

static int cu_device_info(sl_backend *b, sl_device_info *out)
{
	const sl_cuda_ctx *c = sl_cu_ctx(b);
	snprintf(out->name, sizeof(out->name), "%s", c->name);
	snprintf(out->pci_bus_id, sizeof(out->pci_bus_id), "%s", c->pci_bus_id);
	out->memory_bytes = c->mem_bytes;
	out->numa_node = c->numa_node;
	return 0;
}

/* Filled by member name, so that fields added to the table later start as
 * zero / NULL here instead of shifting every initialiser. */
static sl_backend_ops cu_make_ops(void)
{
	sl_backend_ops o;
	memset(&o, 0, sizeof(o));
	o.name = "cuda";
	o.dev_is_host = false;
	o.free = cu_backend_free;
	o.dev_alloc = cu_dev_alloc;
	o.dev_free = cu_dev_free;
	o.host_alloc = cu_host_alloc;
	o.host_free = cu_host_free;
	o.queue_create = cu_queue_create;
	o.queue_free = cu_queue_free;
	o.queue_sync = cu_queue_sync;
	o.event_create = cu_event_create;
	o.event_free = cu_event_free;
	o.event_record = cu_event_record;
	o.queue_wait = cu_queue_wait;
	o.event_sync = cu_event_sync;
	o.copy_h2d = cu_copy_h2d;
	o.copy_d2h = cu_copy_d2h;
	o.copy_d2d = cu_copy_d2d;
	o.memset_dev = cu_memset_dev;
#define SL_BACKEND_OP(fn, params, args) o.fn = sl_cu_##fn;
#include "backend_ops.def"
	o.device_info = cu_device_info;
	return o;
}

static const sl_backend_ops *cu_ops(void)
{
	static const sl_backend_ops ops = cu_make_ops(); /* thread-safe init */
	return &ops;
}

static void cu_backend_free(sl_backend *b)
{
	if (!b)
		return;
	sl_cuda_ctx *c = sl_cu_ctx(b);
	if (c) {
		cu_queue_destroy(b, c->defq);
		free(c);
	}
	free(b);
}

/* ---- discovery ------------------------------------------------------------------ */

extern "C" bool sl_cuda_usable(void)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess) {
		(void)cudaGetLastError();
		return false;
	}
	return n > 0;
}

extern "C" int sl_cuda_backend_create(sl_backend **out)
{
	*out = NULL;
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess) {
		(void)cudaGetLastError();
		return sl_err(SL_EDEVICE, "no CUDA GPU found: %s (cudaGetDeviceCount)",
			      cudaGetErrorString(e));
	}
	if (n <= 0)
		return sl_err(SL_EDEVICE, "no CUDA GPU found: the driver reports no devices");

	sl_cuda_ctx *c = (sl_cuda_ctx *)calloc(1, sizeof(*c));
	sl_backend *b = (sl_backend *)calloc(1, sizeof(*b));
	if (!c || !b) {
		free(c);
		free(b);
		return sl_err(SL_ENOMEM, "cuda: out of host memory creating the backend");
	}
	b->ops = cu_ops();
	b->ctx = c;
	c->device = 0;
	c->numa_node = -1;
	c->scratch_max = (size_t)64 << 20;
	const char *env = getenv("SLUICE_CUDA_SCRATCH_MAX");
	if (env && *env) {
		size_t v = 0;
		if (sl_parse_size(env, &v) < 0 || v < 4096) {
			free(c);
			free(b);
			return sl_err(SL_EINVAL, "SLUICE_CUDA_SCRATCH_MAX='%s': want a size of 4K or more",
				      env);
		}
		c->scratch_max = v;
	}

	int rc = 0;
	int smem_optin = 0;
	cudaDeviceProp prop;
	if ((e = cudaSetDevice(c->device)) != cudaSuccess ||
	    (e = cudaGetDeviceProperties(&prop, c->device)) != cudaSuccess ||
	    (e = cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
					c->device)) != cudaSuccess) {
		(void)cudaGetLastError();
		rc = sl_err(SL_EDEVICE, "no usable CUDA GPU: %s (device %d)", cudaGetErrorString(e),
			    c->device);
		goto fail;
	}
	snprintf(c->name, sizeof(c->name), "%s", prop.name);
#ifndef SL_CU_EMU /* the emulation has no PCI address */
	snprintf(c->pci_bus_id, sizeof(c->pci_bus_id), "%04x:%02x:%02x.0", prop.pciDomainID,
		 prop.pciBusID, prop.pciDeviceID);
	c->mem_bytes = prop.totalGlobalMem;
	c->numa_node = sl_topo_pci_node(c->pci_bus_id);
#endif
	c->cc_major = prop.major;
	c->cc_minor = prop.minor;
	c->sm_count = prop.multiProcessorCount;
	c->smem_optin = (size_t)smem_optin;
	if (c->cc_major < 8) {
		rc = sl_err(SL_EUNSUPPORTED,
			    "GPU %s has compute capability %d.%d; the CUDA backend needs 8.0 or newer",
			    c->name, c->cc_major, c->cc_minor);
		goto fail;
	}
	rc = cu_queue_create(b, &c->defq);
	if (rc < 0)
		goto fail;
	*out = b;
	return 0;
fail:
	cu_backend_free(b);
	return rc;
}
