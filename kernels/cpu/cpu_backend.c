/*
 * cpu_backend.c - the CPU backend's table: memory, queues, events, copies.
 *
 * The "device" tier of the CPU backend is host memory under a byte budget
 * (the accounting lives in backend.c), so placement and budgets are real on
 * machines without a GPU.  Queues run every call to completion before it
 * returns: a valid, serial schedule; events are therefore always complete.
 */
#include "cpu_backend.h"
#include "cpu_internal.h"

#include <cblas.h>
#include <omp.h>
#include <string.h>
#include <unistd.h>

struct sl_queue {
	int id;
};
struct sl_event {
	int recorded;
};

int sl_cpu_grow(float **buf, size_t *cap, size_t n)
{
	if (n <= *cap)
		return 0;
	float *p = sl_aligned_alloc(n * sizeof(float));
	if (!p)
		return sl_err(SL_ENOMEM, "cpu backend: cannot allocate %zu bytes of workspace",
			      n * sizeof(float));
	free(*buf);
	*buf = p;
	*cap = n;
	return 0;
}

static void cpu_free(sl_backend *b)
{
	sl_cpu_ctx *c = sl_cpu(b);
	free(c->gemm_wf);
	free(c->gemm_c);
	free(c->attn_ws);
	free(c);
	free(b);
}

static int cpu_dev_alloc(sl_backend *b, size_t bytes, void **out)
{
	/* page aligned: the disk tier reads into device memory with O_DIRECT */
	*out = NULL;
	if (posix_memalign(out, 4096, bytes ? (bytes + 4095) & ~(size_t)4095 : 4096) != 0)
		*out = NULL;
	if (!*out)
		return sl_err(SL_ENOMEM, "cpu backend: out of memory allocating %zu bytes", bytes);
	return 0;
}

static void cpu_dev_free(sl_backend *b, void *p)
{
	free(p);
}

static int cpu_queue_create(sl_backend *b, sl_queue **out)
{
	*out = calloc(1, sizeof(sl_queue));
	return *out ? 0 : sl_err(SL_ENOMEM, "cpu backend: out of memory");
}

static void cpu_queue_free(sl_backend *b, sl_queue *q)
{
	free(q);
}

static int cpu_queue_sync(sl_backend *b, sl_queue *q)
{
	return 0;
}

static int cpu_event_create(sl_backend *b, sl_event **out)
{
	*out = calloc(1, sizeof(sl_event));
	return *out ? 0 : sl_err(SL_ENOMEM, "cpu backend: out of memory");
}

static void cpu_event_free(sl_backend *b, sl_event *e)
{
	free(e);
}

static int cpu_event_record(sl_backend *b, sl_event *e, sl_queue *q)
{
	e->recorded = 1;
	return 0;
}

static int cpu_queue_wait(sl_backend *b, sl_queue *q, sl_event *e)
{
	return 0;
}

static int cpu_event_sync(sl_backend *b, sl_event *e)
{
	return 0;
}

static int cpu_copy(sl_backend *b, sl_queue *q, void *dst, const void *src, size_t n)
{
	if (n)
		memcpy(dst, src, n);
	return 0;
}

static int cpu_memset(sl_backend *b, sl_queue *q, void *dst, int value, size_t n)
{
	memset(dst, value, n);
	return 0;
}

static const sl_backend_ops cpu_ops = {
	.name = "cpu",
	.dev_is_host = true,
	.free = cpu_free,
	.dev_alloc = cpu_dev_alloc,
	.dev_free = cpu_dev_free,
	.host_alloc = cpu_dev_alloc,
	.host_free = cpu_dev_free,
	.queue_create = cpu_queue_create,
	.queue_free = cpu_queue_free,
	.queue_sync = cpu_queue_sync,
	.event_create = cpu_event_create,
	.event_free = cpu_event_free,
	.event_record = cpu_event_record,
	.queue_wait = cpu_queue_wait,
	.event_sync = cpu_event_sync,
	.copy_h2d = cpu_copy,
	.copy_d2h = cpu_copy,
	.copy_d2d = cpu_copy,
	.memset_dev = cpu_memset,
	.gemm = sl_cpu_gemm,
	.layernorm = sl_cpu_layernorm,
	.embed = sl_cpu_embed,
	.attn_prefill = sl_cpu_attn_prefill,
	.attn_decode = sl_cpu_attn_decode,
	.argmax = sl_cpu_argmax,
	.h2o_compact = sl_cpu_h2o_compact,
	.h2o_evict = sl_cpu_h2o_evict,
};

int sl_cpu_backend_create(int nthreads, sl_backend **out)
{
	*out = NULL;
	sl_backend *b = calloc(1, sizeof *b);
	sl_cpu_ctx *c = calloc(1, sizeof *c);
	if (!b || !c) {
		free(b);
		free(c);
		return sl_err(SL_ENOMEM, "cpu backend: out of memory");
	}
	if (nthreads <= 0) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);
		nthreads = n > 0 ? (int)n : 1;
	}
	c->nthreads = nthreads;
	__builtin_cpu_init();
	c->simd = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
		  __builtin_cpu_supports("f16c");
	if (getenv("SLUICE_NO_SIMD"))
		c->simd = 0;
	openblas_set_num_threads(nthreads);
	b->ops = &cpu_ops;
	b->ctx = c;
	*out = b;
	return 0;
}
