/*
 * profile_measure.c - measuring the machine's topology and rates
 * (profile_measure.h) into a profile (policy/profile.h).
 */
#include "profile_measure.h"
#include "backend.h"
#include "disk_store.h"
#include "sl_common.h"
#include "topology.h"

#include <errno.h>
#include <omp.h>
#include <pthread.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)

static void say(const sl_profile_opts *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void say(const sl_profile_opts *o, const char *fmt, ...)
{
	if (!o->log)
		return;
	va_list ap;
	va_start(ap, fmt);
	vfprintf(o->log, fmt, ap);
	va_end(ap);
	fflush(o->log);
}

static double median3(double a[3])
{
	double lo = SL_MIN(a[0], SL_MIN(a[1], a[2])), hi = SL_MAX(a[0], SL_MAX(a[1], a[2]));
	return a[0] + a[1] + a[2] - lo - hi;
}

static double gib(uint64_t b)
{
	return (double)b / (double)(1ull << 30);
}

/* ---- inputs -------------------------------------------------------------------- */

int sl_profile_check_offload_dir(const char *dir)
{
	struct stat st;
	if (stat(dir, &st) != 0) {
		if (errno == ENOENT || errno == ENOTDIR)
			return sl_err(SL_ENOTFOUND, "offload directory %s does not exist; create it or use another --offload-dir",
				      dir);
		return sl_err(SL_EIO, "offload directory %s: %s", dir, strerror(errno));
	}
	if (!S_ISDIR(st.st_mode))
		return sl_err(SL_ENOTFOUND, "offload directory %s is not a directory; use another --offload-dir", dir);
	if (access(dir, W_OK | X_OK) != 0)
		return sl_err(SL_EIO, "offload directory %s is not writable (%s); use another --offload-dir", dir,
			      strerror(errno));
	return 0;
}

/* ---- host memory ---------------------------------------------------------------- */

/* Read bandwidth: every thread sums its share of a buffer larger than the
 * caches (64-bit integer adds vectorise and never limit the rate). */
double sl_profile_mem_read_gbps(size_t bytes, int threads)
{
	size_t n = bytes / sizeof(uint64_t);
	uint64_t *buf = sl_aligned_alloc(n * sizeof(uint64_t));
	if (!buf)
		return 0;
	/* first touch by the same threads that read it: pages near them */
#pragma omp parallel for num_threads(threads) schedule(static)
	for (size_t i = 0; i < n; i++)
		buf[i] = i;
	double r[3];
	uint64_t sink = 0;
	for (int rep = 0; rep < 3; rep++) {
		uint64_t s = 0;
		double t0 = sl_now();
#pragma omp parallel for simd num_threads(threads) schedule(static) reduction(+ : s)
		for (size_t i = 0; i < n; i++)
			s += buf[i];
		double dt = sl_now() - t0;
		sink += s;
		r[rep] = dt > 0 ? (double)(n * sizeof(uint64_t)) / dt / 1e9 : 0;
	}
	free(buf);
	/* n(n-1)/2 summed three times: the compiler cannot drop the loop */
	return sink == 3 * ((uint64_t)n * (n - 1) / 2) ? median3(r) : 0;
}

/* ---- backends: GEMM and copies -------------------------------------------------- */

/* FLOP/s of sl_gemm on b at (m, n, k): reps calls per sample, median of 3. */
static int measure_gemm(sl_backend *b, int m, int n, int k, int reps, double *rate)
{
	*rate = 0;
	size_t xb = (size_t)m * k * sizeof(float), wb = (size_t)n * k * sizeof(sl_half),
	       yb = (size_t)m * n * sizeof(float);
	float *hx = malloc(xb);
	sl_half *hw = malloc(wb);
	sl_buf x = { 0 }, w = { 0 }, y = { 0 };
	sl_queue *q = NULL;
	int rc = 0;
	if (!hx || !hw) {
		rc = sl_err(SL_ENOMEM, "profile: out of memory for a %dx%dx%d GEMM", m, n, k);
		goto out;
	}
	uint64_t st = 0x9e3779b97f4a7c15ull;
	for (size_t i = 0; i < (size_t)m * k; i++) {
		st = st * 6364136223846793005ull + 1442695040888963407ull;
		hx[i] = (float)((int)(st >> 40) % 2001 - 1000) / 1000.f;
	}
	for (size_t i = 0; i < (size_t)n * k; i++) {
		st = st * 6364136223846793005ull + 1442695040888963407ull;
		hw[i] = sl_float_to_half((float)((int)(st >> 40) % 2001 - 1000) / 32000.f);
	}
	if ((rc = sl_buf_alloc(b, SL_MEM_DEVICE, xb, "profile GEMM x", &x)) < 0 ||
	    (rc = sl_buf_alloc(b, SL_MEM_DEVICE, wb, "profile GEMM w", &w)) < 0 ||
	    (rc = sl_buf_alloc(b, SL_MEM_DEVICE, yb, "profile GEMM y", &y)) < 0 ||
	    (rc = sl_queue_create(b, &q)) < 0 || (rc = sl_copy_h2d(b, q, x.p, hx, xb)) < 0 ||
	    (rc = sl_copy_h2d(b, q, w.p, hw, wb)) < 0 || (rc = sl_queue_sync(b, q)) < 0)
		goto out;
	const sl_gemm_args a = { .m = m, .n = n, .k = k, .x = x.p, .ldx = k, .w = w.p, .y = y.p, .ldy = n };
	if ((rc = sl_gemm(b, q, &a)) < 0 || (rc = sl_queue_sync(b, q)) < 0) /* warm-up */
		goto out;
	double r[3];
	for (int s = 0; s < 3; s++) {
		double t0 = sl_now();
		for (int i = 0; i < reps && rc == 0; i++)
			rc = sl_gemm(b, q, &a);
		if (rc < 0 || (rc = sl_queue_sync(b, q)) < 0)
			goto out;
		double dt = sl_now() - t0;
		r[s] = dt > 0 ? 2.0 * m * n * k * reps / dt : 0;
	}
	*rate = median3(r);
out:
	if (q)
		sl_queue_free(b, q);
	sl_buf_free(b, &y);
	sl_buf_free(b, &w);
	sl_buf_free(b, &x);
	free(hw);
	free(hx);
	return rc;
}

/* Pinned host <-> device copies of bytes, median of 3 each way. */
static int measure_copies(sl_backend *b, size_t bytes, double *h2d, double *d2h)
{
	*h2d = *d2h = 0;
	sl_buf hb = { 0 }, db = { 0 };
	void *h = NULL, *d = NULL;
	sl_queue *q = NULL;
	int rc;
	if ((rc = sl_buf_alloc(b, SL_MEM_HOST, bytes, "profile copies", &hb)) < 0 ||
	    (rc = sl_buf_alloc(b, SL_MEM_DEVICE, bytes, "profile copies", &db)) < 0 ||
	    (rc = sl_queue_create(b, &q)) < 0)
		goto out;
	h = hb.p;
	d = db.p;
	memset(h, 0x5a, bytes);
	if ((rc = sl_copy_h2d(b, q, d, h, bytes)) < 0 || (rc = sl_copy_d2h(b, q, h, d, bytes)) < 0 ||
	    (rc = sl_queue_sync(b, q)) < 0) /* warm-up */
		goto out;
	double r[2][3];
	for (int dir = 0; dir < 2; dir++)
		for (int s = 0; s < 3; s++) {
			double t0 = sl_now();
			rc = dir == 0 ? sl_copy_h2d(b, q, d, h, bytes) : sl_copy_d2h(b, q, h, d, bytes);
			if (rc < 0 || (rc = sl_queue_sync(b, q)) < 0)
				goto out;
			double dt = sl_now() - t0;
			r[dir][s] = dt > 0 ? (double)bytes / dt / 1e9 : 0;
		}
	*h2d = median3(r[0]);
	*d2h = median3(r[1]);
out:
	if (q)
		sl_queue_free(b, q);
	sl_buf_free(b, &db);
	sl_buf_free(b, &hb);
	return rc;
}

/* ---- the disk --------------------------------------------------------------------- */

/* The probe runs on a thread bound to the I/O node: the engine's threads,
 * started from it, inherit its binding, as a store's bind themselves. */
typedef struct probe_job {
	const char *dir;
	uint64_t bytes;
	int node;
	double gbps;
	char mode[64];
	int rc;
	char err[600];
} probe_job;

static void *probe_thread(void *arg)
{
	probe_job *j = arg;
	sl_topo_bind_thread(j->node, "the disk probe's I/O threads");
	j->rc = sl_disk_probe_read(j->dir, j->bytes, &j->gbps, j->mode, sizeof j->mode);
	if (j->rc < 0)
		snprintf(j->err, sizeof j->err, "%s", sl_errmsg()); /* the message is per thread */
	return NULL;
}

static int measure_disk(probe_job *j)
{
	pthread_t th;
	int e = pthread_create(&th, NULL, probe_thread, j);
	if (e != 0) {
		probe_thread(j); /* on this thread, unbound */
	} else {
		pthread_join(th, NULL);
	}
	if (j->rc < 0)
		return sl_err(j->rc, "%s", j->err);
	return 0;
}

/* ---- the profile ------------------------------------------------------------------- */

static void print_topology(const sl_profile_opts *o, const sl_profile *p)
{
	const sl_profile_topo *t = &p->topo;
	say(o, "machine     %d package%s, %d cores, %d PUs, %d NUMA node%s%s\n", t->packages,
	    t->packages == 1 ? "" : "s", t->cores, t->pus, t->nnodes, t->nnodes == 1 ? "" : "s",
	    t->loaded ? "" : " (hwloc unavailable: a guess)");
	for (int i = 0; i < SL_MIN(t->nnodes, SL_PROFILE_MAX_NODES); i++) {
		const sl_profile_node *n = &t->node[i];
		say(o, "numa %-6d %.1f GiB, %d cores, %d PUs (cpus %s)\n", n->os_index, gib(n->memory_bytes),
		    n->cores, n->pus, n->cpus[0] ? n->cpus : "none");
	}
	if (t->binding_node >= 0)
		say(o, "binding     PUs %s (%d), within node %d\n", t->binding, t->binding_pus, t->binding_node);
	else
		say(o, "binding     PUs %s (%d), across nodes\n", t->binding, t->binding_pus);
	if (p->have_gpu) {
		char node[32] = "unknown";
		if (p->gpu.numa_node >= 0)
			snprintf(node, sizeof node, "%d", p->gpu.numa_node);
		say(o, "gpu         %s, PCI %s, %.1f GiB, NUMA node %s\n", p->gpu.name,
		    p->gpu.pci_bus_id[0] ? p->gpu.pci_bus_id : "?", gib(p->gpu.memory_bytes), node);
	} else {
		say(o, "gpu         none (backend %s%s)\n", p->backend,
		    sl_backend_cuda_built() ? "" : "; this build has no CUDA");
	}
	char pin[64], io[64];
	if (p->pinned_node >= 0)
		snprintf(pin, sizeof pin, "node %d%s", p->pinned_node,
			 p->have_gpu ? " (the GPU's)" : t->nnodes == 1 ? " (the only one)" : "");
	else
		snprintf(pin, sizeof pin, "first touch");
	if (p->io_node >= 0)
		snprintf(io, sizeof io, "node %d%s", p->io_node,
			 p->have_gpu && p->io_node == p->gpu.numa_node ? " (the GPU's)"
			 : t->nnodes == 1			       ? " (the only one)"
								       : " (the process's)");
	else
		snprintf(io, sizeof io, "unbound (no single node)");
	say(o, "placement   pinned memory: %s; I/O threads: %s\n", pin, io);
}

/* The profile records hwloc's view and the backend's device in plain data
 * of its own (policy/ sees neither topology.h nor backend.h): copied field
 * by field, the same sizes, nothing cut. */
_Static_assert(SL_PROFILE_MAX_NODES == SL_TOPO_MAX_NODES, "a profile lists the nodes topology lists");
_Static_assert(sizeof(((sl_profile_node *)0)->cpus) == sizeof(((sl_topo_node *)0)->cpus), "cpus");
_Static_assert(sizeof(((sl_profile_topo *)0)->binding) == sizeof(((sl_topo_info *)0)->binding), "binding");
_Static_assert(sizeof(((sl_profile_gpu *)0)->name) == sizeof(((sl_device_info *)0)->name), "name");
_Static_assert(sizeof(((sl_profile_gpu *)0)->pci_bus_id) == sizeof(((sl_device_info *)0)->pci_bus_id),
	       "pci_bus_id");

static void record_topology(const sl_topo_info *t, sl_profile_topo *d)
{
	d->loaded = t->loaded;
	d->packages = t->packages;
	d->cores = t->cores;
	d->pus = t->pus;
	d->nnodes = t->nnodes;
	for (int i = 0; i < SL_MIN(t->nnodes, SL_TOPO_MAX_NODES); i++) {
		d->node[i].os_index = t->node[i].os_index;
		d->node[i].memory_bytes = t->node[i].memory_bytes;
		d->node[i].cores = t->node[i].cores;
		d->node[i].pus = t->node[i].pus;
		memcpy(d->node[i].cpus, t->node[i].cpus, sizeof d->node[i].cpus);
	}
	memcpy(d->binding, t->binding, sizeof d->binding);
	d->binding_pus = t->binding_pus;
	d->binding_node = t->binding_node;
}

static void record_gpu(const sl_device_info *g, sl_profile_gpu *d)
{
	memcpy(d->name, g->name, sizeof d->name);
	memcpy(d->pci_bus_id, g->pci_bus_id, sizeof d->pci_bus_id);
	d->memory_bytes = g->memory_bytes;
	d->numa_node = g->numa_node;
}

int sl_profile_run(const sl_profile_opts *o, sl_profile *out)
{
	memset(out, 0, sizeof *out);
	const double t_start = sl_now();
	out->quick = o->quick;
	out->pinned_node = out->io_node = -1;
	if (o->offload_dir) {
		SL_TRY(sl_profile_check_offload_dir(o->offload_dir));
		if (strlen(o->offload_dir) >= sizeof out->offload_dir)
			return sl_err(SL_EINVAL, "offload directory %s: longer than %zu bytes", o->offload_dir,
				      sizeof out->offload_dir - 1);
		strcpy(out->offload_dir, o->offload_dir);
	}

	sl_topo_info topo;
	sl_topo_get(&topo); /* on failure: the fallback description */
	record_topology(&topo, &out->topo);
	sl_backend *be = NULL, *cpu = NULL;
	int rc = sl_backend_create(o->backend ? o->backend : "auto", o->threads, &be);
	if (rc < 0)
		return rc;
	snprintf(out->backend, sizeof out->backend, "%s", be->ops->name);
	out->have_gpu = strcmp(be->ops->name, "cpu") != 0;
	if (out->have_gpu) {
		sl_device_info gpu;
		sl_backend_device_info(be, &gpu);
		record_gpu(&gpu, &out->gpu);
	}
	if (!out->have_gpu)
		cpu = be;
	else if ((rc = sl_backend_create("cpu", o->threads, &cpu)) < 0)
		goto out;

	if (out->have_gpu)
		out->pinned_node = out->gpu.numa_node;
	else if (out->topo.nnodes == 1)
		out->pinned_node = out->topo.node[0].os_index;
	out->io_node = sl_topo_io_node(out->have_gpu ? out->gpu.pci_bus_id : NULL);
	out->threads = o->threads > 0 ? o->threads : omp_get_max_threads();
	print_topology(o, out);

	const size_t mem_bytes = (o->quick ? 16 : 512) * MIB;
	out->mem_bytes = mem_bytes;
	out->mem_read_gbps = sl_profile_mem_read_gbps(mem_bytes, out->threads);
	say(o, "mem read    %8.2f GB/s     (%d threads summing %zu MiB, median of 3)\n", out->mem_read_gbps,
	    out->threads, mem_bytes / MIB);

	out->cpu_gemm_m = o->quick ? 64 : 512;
	out->cpu_gemm_n = out->cpu_gemm_k = o->quick ? 256 : 2048;
	double r;
	if ((rc = measure_gemm(cpu, out->cpu_gemm_m, out->cpu_gemm_n, out->cpu_gemm_k, 1, &r)) < 0)
		goto out;
	out->cpu_gemm_gflops = r / 1e9;
	say(o, "cpu gemm    %8.1f GFLOP/s  (sl_gemm, fp32 x fp16 weights, m=%d n=%d k=%d, %d threads, median of 3)\n",
	    out->cpu_gemm_gflops, out->cpu_gemm_m, out->cpu_gemm_n, out->cpu_gemm_k, out->threads);

	if (o->offload_dir) {
		probe_job j = { .dir = o->offload_dir, .bytes = (o->quick ? 8 : 1024) * (uint64_t)MIB,
				.node = out->io_node };
		if ((rc = measure_disk(&j)) < 0)
			goto out;
		out->disk_read_gbps = j.gbps;
		out->disk_bytes = j.bytes;
		snprintf(out->disk_engine, sizeof out->disk_engine, "%s", j.mode);
		say(o, "disk read   %8.2f GB/s     (%s, %llu MiB sequential in %s)\n", out->disk_read_gbps,
		    out->disk_engine, (unsigned long long)(out->disk_bytes / MIB), o->offload_dir);
	} else {
		say(o, "disk read   not measured  (no --offload-dir)\n");
	}

	if (out->have_gpu) {
		const size_t copy_bytes = (o->quick ? 16 : 256) * MIB;
		out->copy_bytes = copy_bytes;
		if ((rc = measure_copies(be, copy_bytes, &out->h2d_gbps, &out->d2h_gbps)) < 0)
			goto out;
		say(o, "h2d         %8.2f GB/s     (pinned, %zu MiB, median of 3)\n", out->h2d_gbps,
		    copy_bytes / MIB);
		say(o, "d2h         %8.2f GB/s     (pinned, %zu MiB, median of 3)\n", out->d2h_gbps,
		    copy_bytes / MIB);
		out->gpu_gemm_m = o->quick ? 256 : 2048;
		out->gpu_gemm_n = out->gpu_gemm_k = o->quick ? 1024 : 8192;
		if ((rc = measure_gemm(be, out->gpu_gemm_m, out->gpu_gemm_n, out->gpu_gemm_k, o->quick ? 2 : 20,
				       &r)) < 0)
			goto out;
		out->gpu_gemm_tflops = r / 1e12;
		say(o, "gpu gemm    %8.1f TFLOP/s  (sl_gemm, fp16 tensor cores, m=%d n=%d k=%d, median of 3)\n",
		    out->gpu_gemm_tflops, out->gpu_gemm_m, out->gpu_gemm_n, out->gpu_gemm_k);
	}
	out->seconds = sl_now() - t_start;
out:
	if (cpu != be)
		sl_backend_free(cpu);
	sl_backend_free(be);
	return rc;
}
