/*
 * cpu_backend.c - the CPU backend's table: memory, queues, events, copies.
 *
 * The "device" tier of the CPU backend is host memory under a byte budget
 * (the accounting lives in backend.c), so placement and budgets are real on
 * machines without a GPU.
 *
 * Queues behave like CUDA streams, so that copies overlap compute:
 *  - copies and memsets (copy_h2d, copy_d2h, copy_d2d, memset_dev) and
 *    waits on events (queue_wait) are tasks in the queue's FIFO, run in
 *    issue order by the queue's own worker thread (started on the queue's
 *    first task, joined by queue_free, which drains first).  A copy or
 *    memset under 64 KiB on a queue with nothing pending runs inline on the
 *    calling thread instead: the hand-off would cost more than the copy.
 *  - ops (gemm, layernorm, embed, attention, H2O, argmax, and the Llama
 *    family's rmsnorm, rope, swiglu in cpu_llama.c; OpenMP inside)
 *    run inline on the calling thread, after every earlier task of their
 *    queue is done, including the waits the queue was given: the order a
 *    stream gives.  The GEMM accounting (b->gemm_seconds) times the op only.
 * Each task has a sequence number in its queue.  event_record stores (queue,
 * number of the last task issued on it); the event is complete when that
 * task is done, at once if nothing was pending, and when never recorded or
 * when its queue is freed.  Re-recording replaces the record.  event_sync,
 * queue_sync block the caller; dev_free and host_free wait for every queue
 * first, as cudaFree does.  The first error of a task is reported by the
 * next queue_sync, event_sync or op on its queue.  A NULL queue is the
 * backend's own default queue.  Issue on one queue from one host thread at
 * a time (the ops share the backend's workspaces anyway).
 *
 * One mutex per backend guards the state of all its queues and events, with
 * condition variables for "a task was added" (per queue) and "a task was
 * done" (per backend); a copy runs outside the mutex.  Waits cannot form a
 * cycle: a wait names a task issued before it.
 * A queued task's record is allocated once: when done it goes on the
 * backend's spare list (under the mutex) for the next task of any queue,
 * so a schedule that repeats allocates nothing once the number of tasks in
 * flight has reached its peak; sl_backend_free releases the list.
 *
 * SLUICE_CPU_SYNC_QUEUES=1 restores the serial schedule (for debugging):
 * every call runs to completion before it returns, events are always
 * complete and no thread is started.  SLUICE_CPU_INLINE_BYTES=N sets the
 * size below which a copy on an idle queue runs inline (default 65536; 0
 * queues every copy).  SLUICE_CPU_LATE_COPIES=US is adversarial (for
 * tests): every copy and memset goes to the worker, which starts it US
 * microseconds late, so that a caller that reads a copy's destination, or
 * overwrites its source, without waiting for its event sees the race.
 */
#include "cpu_backend.h"
#include "cpu_internal.h"
#include "sl_config.h"

#if defined(SL_HAVE_OPENBLAS) && SL_HAVE_OPENBLAS
#include <cblas.h>
#endif

#include <omp.h>
#include <signal.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

enum { TASK_COPY, TASK_MEMSET, TASK_WAIT };

typedef struct cpu_task {
	struct cpu_task *next;
	uint64_t seq; /* its number in its queue */
	int kind;
	void *dst;
	const void *src;
	int value;
	size_t n;
	uint64_t wait_qid, wait_seq; /* TASK_WAIT: an event's record */
} cpu_task;

struct sl_queue {
	sl_backend *b;
	uint64_t id;
	sl_queue *next; /* the backend's live queues */
	cpu_task *head, *tail; /* the FIFO; the head is the task in progress */
	uint64_t issued; /* number of the last task issued */
	uint64_t done;   /* number of the last task done (tasks finish in order) */
	pthread_cond_t work; /* the worker's: a task was added, or stop */
	pthread_t thread;
	pid_t thread_pid; /* process that started the worker; 0: none yet */
	bool stop;
	bool sync; /* run every task inline (SLUICE_CPU_SYNC_QUEUES, or no thread) */
	int err;   /* first error of a task, not yet reported */
	char errmsg[256];
};

struct sl_event {
	uint64_t qid; /* 0: never recorded */
	uint64_t seq;
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

/* ---- queue machinery (every function named *_locked holds c->qlock) ------ */

static sl_queue *queue_of(sl_cpu_ctx *c, sl_queue *q)
{
	return q ? q : c->defq;
}

/* Whether the task numbered seq of queue qid is done. */
static bool record_done_locked(sl_cpu_ctx *c, uint64_t qid, uint64_t seq)
{
	if (!qid)
		return true;
	for (sl_queue *q = c->queues; q; q = q->next)
		if (q->id == qid)
			return q->done >= seq;
	return true; /* freed: queue_free drained it */
}

/* Report (and clear) q's first task error on this thread. */
static int take_error_locked(sl_queue *q)
{
	if (!q->err)
		return 0;
	const int rc = q->err;
	q->err = 0;
	return sl_err(rc, "%s", q->errmsg);
}

static int run_task(const cpu_task *t)
{
	if (t->kind == TASK_COPY)
		memcpy(t->dst, t->src, t->n);
	else if (t->kind == TASK_MEMSET)
		memset(t->dst, t->value, t->n);
	return 0;
}

static void *worker_main(void *arg)
{
	sl_queue *q = arg;
	sl_cpu_ctx *c = sl_cpu(q->b);
	pthread_mutex_lock(&c->qlock);
	for (;;) {
		while (!q->head && !q->stop)
			pthread_cond_wait(&q->work, &c->qlock);
		cpu_task *t = q->head;
		if (!t)
			break; /* stopped, and nothing left */
		if (t->kind == TASK_WAIT) {
			while (!record_done_locked(c, t->wait_qid, t->wait_seq))
				pthread_cond_wait(&c->qdone, &c->qlock);
		} else {
			pthread_mutex_unlock(&c->qlock);
			if (c->late_us)
				usleep(c->late_us);
			const int rc = run_task(t);
			pthread_mutex_lock(&c->qlock);
			if (rc < 0 && !q->err) {
				q->err = rc;
				snprintf(q->errmsg, sizeof q->errmsg, "cpu backend queue: %s", sl_errmsg());
			}
		}
		q->head = t->next;
		if (!q->head)
			q->tail = NULL;
		q->done = t->seq;
		pthread_cond_broadcast(&c->qdone);
		t->next = c->spare; /* kept for the next submit: none in the per-token loop */
		c->spare = t;
	}
	pthread_mutex_unlock(&c->qlock);
	return NULL;
}

/* Start q's worker if this process has none (a worker started before a
 * fork() is not in the child).  Signals stay with the application's threads. */
static int start_worker_locked(sl_queue *q)
{
	const pid_t pid = getpid();
	if (q->thread_pid == pid)
		return 0;
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	const int rc = pthread_create(&q->thread, NULL, worker_main, q);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc != 0)
		return sl_err(SL_ENOMEM, "cpu backend: cannot start a queue thread (%s)", strerror(rc));
	char name[16];
	snprintf(name, sizeof name, "sl-cpu-q%llu", (unsigned long long)q->id);
	pthread_setname_np(q->thread, name);
	q->thread_pid = pid;
	return 0;
}

/* Wait until every task issued on q is done. */
static void wait_idle_locked(sl_cpu_ctx *c, sl_queue *q)
{
	if (q->done < q->issued && q->thread_pid != getpid() && start_worker_locked(q) < 0)
		SL_ASSERT(!"pending tasks and no thread to run them");
	while (q->done < q->issued)
		pthread_cond_wait(&c->qdone, &c->qlock);
}

/* Before an inline op on q: earlier tasks done; their first error. */
static int drain(sl_backend *b, sl_queue *q)
{
	sl_cpu_ctx *c = sl_cpu(b);
	pthread_mutex_lock(&c->qlock);
	q = queue_of(c, q);
	wait_idle_locked(c, q);
	const int rc = take_error_locked(q);
	pthread_mutex_unlock(&c->qlock);
	return rc;
}

/* Wait until no queue of the backend has work pending. */
static void drain_all(sl_cpu_ctx *c)
{
	pthread_mutex_lock(&c->qlock);
	for (;;) {
		sl_queue *busy = c->queues;
		while (busy && busy->done == busy->issued)
			busy = busy->next;
		if (!busy)
			break;
		if (busy->thread_pid != getpid() && start_worker_locked(busy) < 0)
			SL_ASSERT(!"pending tasks and no thread to run them");
		pthread_cond_wait(&c->qdone, &c->qlock);
		/* then look again from the start: the list may have changed */
	}
	pthread_mutex_unlock(&c->qlock);
}

/*
 * Issue task t (a prototype; copied when queued) on q: inline when q runs
 * synchronously or t is a small copy on an idle queue, else to q's worker.
 */
static int submit(sl_backend *b, sl_queue *q, const cpu_task *t)
{
	sl_cpu_ctx *c = sl_cpu(b);
	cpu_task *qt = NULL;
	pthread_mutex_lock(&c->qlock);
	q = queue_of(c, q);
	if (t->kind == TASK_WAIT && record_done_locked(c, t->wait_qid, t->wait_seq)) {
		pthread_mutex_unlock(&c->qlock);
		return 0; /* nothing to wait for */
	}
	bool run_inline = q->sync ||
			  (t->kind != TASK_WAIT && t->n < c->inline_max && q->done == q->issued);
	if (!run_inline) {
		if (c->spare) {
			qt = c->spare;
			c->spare = qt->next;
		} else {
			qt = malloc(sizeof *qt);
		}
		if (!qt || start_worker_locked(q) < 0) {
			/* degrade to the serial schedule rather than fail */
			if (qt) {
				qt->next = c->spare;
				c->spare = qt;
			}
			qt = NULL;
			run_inline = true;
		}
	}
	if (run_inline) {
		wait_idle_locked(c, q);
		if (t->kind == TASK_WAIT) {
			while (!record_done_locked(c, t->wait_qid, t->wait_seq))
				pthread_cond_wait(&c->qdone, &c->qlock);
			pthread_mutex_unlock(&c->qlock);
			return 0;
		}
		pthread_mutex_unlock(&c->qlock);
		return run_task(t);
	}
	*qt = *t;
	qt->next = NULL;
	qt->seq = ++q->issued;
	if (q->tail)
		q->tail->next = qt;
	else
		q->head = qt;
	q->tail = qt;
	pthread_cond_signal(&q->work);
	pthread_mutex_unlock(&c->qlock);
	return 0;
}

static int queue_new(sl_backend *b, sl_queue **out)
{
	sl_cpu_ctx *c = sl_cpu(b);
	*out = NULL;
	sl_queue *q = calloc(1, sizeof *q);
	if (!q)
		return sl_err(SL_ENOMEM, "cpu backend: out of memory");
	if (pthread_cond_init(&q->work, NULL) != 0) {
		free(q);
		return sl_err(SL_ENOMEM, "cpu backend: cannot create a queue");
	}
	q->b = b;
	q->sync = c->sync_queues;
	pthread_mutex_lock(&c->qlock);
	q->id = ++c->next_qid;
	q->next = c->queues;
	c->queues = q;
	pthread_mutex_unlock(&c->qlock);
	*out = q;
	return 0;
}

/* Drain q, stop and join its worker, forget it. */
static void queue_destroy(sl_backend *b, sl_queue *q)
{
	sl_cpu_ctx *c = sl_cpu(b);
	pthread_mutex_lock(&c->qlock);
	wait_idle_locked(c, q);
	q->stop = true;
	pthread_cond_signal(&q->work);
	const bool join = q->thread_pid == getpid();
	for (sl_queue **p = &c->queues; *p; p = &(*p)->next)
		if (*p == q) {
			*p = q->next;
			break;
		}
	pthread_cond_broadcast(&c->qdone); /* its events are complete now */
	pthread_mutex_unlock(&c->qlock);
	if (join)
		pthread_join(q->thread, NULL);
	pthread_cond_destroy(&q->work);
	free(q);
}

/* ---- the table's functions ------------------------------------------------ */

static void cpu_free(sl_backend *b)
{
	sl_cpu_ctx *c = sl_cpu(b);
	/* the default queue, and any the caller left */
	while (c->queues)
		queue_destroy(b, c->queues);
	while (c->spare) {
		cpu_task *t = c->spare;
		c->spare = t->next;
		free(t);
	}
	pthread_cond_destroy(&c->qdone);
	pthread_mutex_destroy(&c->qlock);
	free(c->gemm_wf);
	free(c->gemm_part);
	free(c->gemm_c);
	free(c->attn_ws);
	free(c);
	free(b);
}

static int cpu_dev_alloc(sl_backend *b, size_t bytes, void **out)
{
	/* the disk tier reads into device memory with O_DIRECT */
	*out = sl_io_alloc(bytes);
	if (!*out)
		return sl_err(SL_ENOMEM, "cpu backend: out of memory allocating %zu bytes", bytes);
	return 0;
}

static void cpu_dev_free(sl_backend *b, void *p)
{
	if (!p)
		return;
	drain_all(sl_cpu(b)); /* a queued copy may still use it (cudaFree waits too) */
	free(p);
}

static int cpu_queue_create(sl_backend *b, sl_queue **out)
{
	return queue_new(b, out);
}

static void cpu_queue_free(sl_backend *b, sl_queue *q)
{
	if (q && q != sl_cpu(b)->defq)
		queue_destroy(b, q);
}

static int cpu_queue_sync(sl_backend *b, sl_queue *q)
{
	return drain(b, q);
}

static int cpu_event_create(sl_backend *b, sl_event **out)
{
	*out = calloc(1, sizeof(sl_event));
	return *out ? 0 : sl_err(SL_ENOMEM, "cpu backend: out of memory");
}

static void cpu_event_free(sl_backend *b, sl_event *e)
{
	free(e); /* queued waits hold a copy of its record */
}

static int cpu_event_record(sl_backend *b, sl_event *e, sl_queue *q)
{
	sl_cpu_ctx *c = sl_cpu(b);
	pthread_mutex_lock(&c->qlock);
	q = queue_of(c, q);
	e->qid = q->id;
	e->seq = q->issued;
	pthread_mutex_unlock(&c->qlock);
	return 0;
}

static int cpu_queue_wait(sl_backend *b, sl_queue *q, sl_event *e)
{
	sl_cpu_ctx *c = sl_cpu(b);
	cpu_task t = { .kind = TASK_WAIT };
	pthread_mutex_lock(&c->qlock);
	t.wait_qid = e->qid;
	t.wait_seq = e->seq;
	pthread_mutex_unlock(&c->qlock);
	return submit(b, q, &t);
}

static int cpu_event_sync(sl_backend *b, sl_event *e)
{
	sl_cpu_ctx *c = sl_cpu(b);
	int rc = 0;
	pthread_mutex_lock(&c->qlock);
	while (!record_done_locked(c, e->qid, e->seq))
		pthread_cond_wait(&c->qdone, &c->qlock);
	for (sl_queue *q = c->queues; q; q = q->next)
		if (q->id == e->qid)
			rc = take_error_locked(q);
	pthread_mutex_unlock(&c->qlock);
	return rc;
}

static int cpu_copy(sl_backend *b, sl_queue *q, void *dst, const void *src, size_t n)
{
	if (!n)
		return 0;
	if (!dst || !src)
		return sl_err(SL_EINVAL, "cpu backend: copy of %zu bytes with a NULL pointer", n);
	const cpu_task t = { .kind = TASK_COPY, .dst = dst, .src = src, .n = n };
	return submit(b, q, &t);
}

static int cpu_memset(sl_backend *b, sl_queue *q, void *dst, int value, size_t n)
{
	if (!n)
		return 0;
	if (!dst)
		return sl_err(SL_EINVAL, "cpu backend: memset of %zu bytes of NULL", n);
	const cpu_task t = { .kind = TASK_MEMSET, .dst = dst, .value = value, .n = n };
	return submit(b, q, &t);
}

/* ---- ops: inline, after the queue's earlier tasks ---------------------- */

/* op_<op>(b, q, ...): drain(b, q), then sl_cpu_<op>(b, q, ...), for each op
 * of backend_ops.def */
#define SL_BACKEND_OP(fn, params, args)                                       \
	static int op_##fn params                                             \
	{                                                                     \
		SL_TRY(drain(b, q));                                          \
		return sl_cpu_##fn args;                                      \
	}
#include "backend_ops.def"

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
#define SL_BACKEND_OP(fn, params, args) .fn = op_##fn,
#include "backend_ops.def"
};

static bool env_flag(const char *name)
{
	const char *v = getenv(name);
	return v && *v && strcmp(v, "0") != 0;
}

static const char *const isa_names[] = { [SL_CPU_GENERIC] = "generic", [SL_CPU_AVX2] = "avx2",
					 [SL_CPU_AVX512] = "avx512" };

/* The best kernels this CPU runs, capped by SLUICE_CPU_KERNELS. */
static int cpu_isa(sl_cpu_isa *out)
{
	sl_cpu_isa best = SL_CPU_GENERIC;
#if defined(__x86_64__)
	best = sl_cpu_x86_isa();
#endif
	const char *e = getenv("SLUICE_CPU_KERNELS");
	if (e && *e) {
		int cap = -1;
		for (int i = 0; i < (int)SL_ARRAY_LEN(isa_names); i++)
			if (!strcmp(e, isa_names[i]))
				cap = i;
		if (cap < 0)
			return sl_err(SL_EINVAL, "SLUICE_CPU_KERNELS=%s: expected generic, avx2 or avx512", e);
		best = SL_MIN(best, (sl_cpu_isa)cap);
	}
	*out = best;
	return 0;
}

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
	int rc = cpu_isa(&c->isa);
	if (rc < 0) {
		free(b);
		free(c);
		return rc;
	}
	c->simd = c->isa >= SL_CPU_AVX2;
	c->sync_queues = env_flag("SLUICE_CPU_SYNC_QUEUES");
	c->inline_max = (size_t)64 << 10;
	const char *im = getenv("SLUICE_CPU_INLINE_BYTES");
	if (im && *im)
		c->inline_max = (size_t)strtoull(im, NULL, 10);
	const char *late = getenv("SLUICE_CPU_LATE_COPIES");
	if (late && *late) {
		c->late_us = (unsigned)strtoul(late, NULL, 10);
		if (c->late_us)
			c->inline_max = 0;
	}
	pthread_mutex_init(&c->qlock, NULL);
	pthread_cond_init(&c->qdone, NULL);
	b->ops = &cpu_ops;
	b->ctx = c;
	b->nthreads = c->nthreads;
	rc = queue_new(b, &c->defq);
	if (rc < 0) {
		cpu_free(b);
		return rc;
	}
	*out = b;
	return 0;
}

const char *sl_cpu_backend_kernels(const sl_backend *b)
{
	return b && b->ops == &cpu_ops ? isa_names[((const sl_cpu_ctx *)b->ctx)->isa] : NULL;
}

bool sl_cpu_gemm_known(const char *name)
{
	static const char *const names[] = { "sluice", "openblas", "amx", "bf16" };
	for (size_t i = 0; i < SL_ARRAY_LEN(names); i++)
		if (!strcmp(name, names[i]))
			return true;
	return false;
}

int sl_cpu_backend_set_gemm(sl_backend *b, const char *name)
{
	if (!sl_cpu_gemm_known(name))
		return sl_err(SL_EINVAL, "--cpu-gemm must be " SL_CPU_GEMM_NAMES ", got '%s'", name);
	if (!b || b->ops != &cpu_ops)
		return 0; /* the GEMMs run elsewhere */
	sl_cpu_ctx *c = sl_cpu(b);
	if (!strcmp(name, "sluice")) {
		c->gemm_openblas = false;
		c->gemm_bf16 = SL_CPU_GEMM_FP32;
		return 0;
	}
	const bool amx = !strcmp(name, "amx");
	if (amx || !strcmp(name, "bf16")) {
		char why[160];
		if (!(amx ? sl_cpu_amx_available(why, sizeof why) : sl_cpu_bf16_available(why, sizeof why)))
			return sl_err(SL_EUNSUPPORTED, "--cpu-gemm %s: %s", name, why);
		c->gemm_openblas = false;
		c->gemm_bf16 = amx ? SL_CPU_GEMM_AMX : SL_CPU_GEMM_DPBF16;
		return 0;
	}
	c->gemm_bf16 = SL_CPU_GEMM_FP32;
#if defined(SL_HAVE_OPENBLAS) && SL_HAVE_OPENBLAS
	openblas_set_num_threads(c->nthreads);
	c->gemm_openblas = true;
	return 0;
#else
	return sl_err(SL_EUNSUPPORTED,
		      "--cpu-gemm openblas: this build has no OpenBLAS (install it and rebuild; meson -Dopenblas=enabled)");
#endif
}

const char *sl_cpu_backend_gemm(const sl_backend *b)
{
	if (!b || b->ops != &cpu_ops)
		return NULL;
	const sl_cpu_ctx *c = b->ctx;
	return c->gemm_bf16 == SL_CPU_GEMM_AMX	  ? "amx"
	       : c->gemm_bf16 == SL_CPU_GEMM_DPBF16 ? "bf16"
	       : c->gemm_openblas		  ? "openblas"
						  : "sluice";
}

bool sl_cpu_backend_blas_info(const char **config, const char **core)
{
#if defined(SL_HAVE_OPENBLAS) && SL_HAVE_OPENBLAS
	*config = openblas_get_config();
	*core = openblas_get_corename();
	return true;
#else
	*config = *core = NULL;
	return false;
#endif
}
