/*
 * profile.c - the machine's topology and measured rates (profile.h).
 */
#include "profile.h"
#include "disk_store.h"
#include "sl_common.h"
#include "sl_config.h"
#include "sl_json.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
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

static char *tmp_path(const char *path)
{
	size_t n = strlen(path);
	char *tmp = malloc(n + 5);
	if (tmp) {
		memcpy(tmp, path, n);
		memcpy(tmp + n, ".tmp", 5);
	}
	return tmp;
}

int sl_profile_check_json_path(const char *path)
{
	char *tmp = tmp_path(path);
	if (!tmp)
		return sl_err(SL_ENOMEM, "%s: out of memory", path);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	int err = errno;
	if (fd >= 0) {
		close(fd);
		unlink(tmp);
	}
	free(tmp);
	if (fd < 0)
		return sl_err(SL_EIO, "cannot write %s (%s)", path, strerror(err));
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
	void *x = NULL, *w = NULL, *y = NULL;
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
	if ((rc = sl_dev_alloc(b, xb, "profile GEMM x", &x)) < 0 ||
	    (rc = sl_dev_alloc(b, wb, "profile GEMM w", &w)) < 0 ||
	    (rc = sl_dev_alloc(b, yb, "profile GEMM y", &y)) < 0 || (rc = b->ops->queue_create(b, &q)) < 0 ||
	    (rc = b->ops->copy_h2d(b, q, x, hx, xb)) < 0 || (rc = b->ops->copy_h2d(b, q, w, hw, wb)) < 0 ||
	    (rc = b->ops->queue_sync(b, q)) < 0)
		goto out;
	const sl_gemm_args a = { .m = m, .n = n, .k = k, .x = x, .ldx = k, .w = w, .y = y, .ldy = n };
	if ((rc = sl_gemm(b, q, &a)) < 0 || (rc = b->ops->queue_sync(b, q)) < 0) /* warm-up */
		goto out;
	double r[3];
	for (int s = 0; s < 3; s++) {
		double t0 = sl_now();
		for (int i = 0; i < reps && rc == 0; i++)
			rc = sl_gemm(b, q, &a);
		if (rc < 0 || (rc = b->ops->queue_sync(b, q)) < 0)
			goto out;
		double dt = sl_now() - t0;
		r[s] = dt > 0 ? 2.0 * m * n * k * reps / dt : 0;
	}
	*rate = median3(r);
out:
	if (q)
		b->ops->queue_free(b, q);
	sl_dev_free(b, y, yb);
	sl_dev_free(b, w, wb);
	sl_dev_free(b, x, xb);
	free(hw);
	free(hx);
	return rc;
}

/* Pinned host <-> device copies of bytes, median of 3 each way. */
static int measure_copies(sl_backend *b, size_t bytes, double *h2d, double *d2h)
{
	*h2d = *d2h = 0;
	void *h = NULL, *d = NULL;
	sl_queue *q = NULL;
	int rc;
	if ((rc = sl_host_alloc(b, bytes, "profile copies", &h)) < 0 ||
	    (rc = sl_dev_alloc(b, bytes, "profile copies", &d)) < 0 || (rc = b->ops->queue_create(b, &q)) < 0)
		goto out;
	memset(h, 0x5a, bytes);
	if ((rc = b->ops->copy_h2d(b, q, d, h, bytes)) < 0 || (rc = b->ops->copy_d2h(b, q, h, d, bytes)) < 0 ||
	    (rc = b->ops->queue_sync(b, q)) < 0) /* warm-up */
		goto out;
	double r[2][3];
	for (int dir = 0; dir < 2; dir++)
		for (int s = 0; s < 3; s++) {
			double t0 = sl_now();
			rc = dir == 0 ? b->ops->copy_h2d(b, q, d, h, bytes) : b->ops->copy_d2h(b, q, h, d, bytes);
			if (rc < 0 || (rc = b->ops->queue_sync(b, q)) < 0)
				goto out;
			double dt = sl_now() - t0;
			r[dir][s] = dt > 0 ? (double)bytes / dt / 1e9 : 0;
		}
	*h2d = median3(r[0]);
	*d2h = median3(r[1]);
out:
	if (q)
		b->ops->queue_free(b, q);
	sl_dev_free(b, d, bytes);
	sl_host_free(b, h, bytes);
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
	const sl_topo_info *t = &p->topo;
	say(o, "machine     %d package%s, %d cores, %d PUs, %d NUMA node%s%s\n", t->packages,
	    t->packages == 1 ? "" : "s", t->cores, t->pus, t->nnodes, t->nnodes == 1 ? "" : "s",
	    t->loaded ? "" : " (hwloc unavailable: a guess)");
	for (int i = 0; i < SL_MIN(t->nnodes, SL_TOPO_MAX_NODES); i++) {
		const sl_topo_node *n = &t->node[i];
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

int sl_profile_run(const sl_profile_opts *o, sl_profile *out)
{
	memset(out, 0, sizeof *out);
	const double t_start = sl_now();
	out->quick = o->quick;
	out->offload_dir = o->offload_dir;
	out->pinned_node = out->io_node = -1;
	if (o->offload_dir)
		SL_TRY(sl_profile_check_offload_dir(o->offload_dir));

	sl_topo_get(&out->topo); /* on failure: the fallback description */
	sl_backend *be = NULL, *cpu = NULL;
	int rc = sl_backend_create(o->backend ? o->backend : "auto", o->threads, &be);
	if (rc < 0)
		return rc;
	out->backend = be->ops->name;
	out->have_gpu = strcmp(be->ops->name, "cpu") != 0;
	if (out->have_gpu)
		sl_backend_device_info(be, &out->gpu);
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

	out->mem_bytes = (o->quick ? 16 : 512) * MIB;
	out->mem_read_gbps = sl_profile_mem_read_gbps(out->mem_bytes, out->threads);
	say(o, "mem read    %8.2f GB/s     (%d threads summing %zu MiB, median of 3)\n", out->mem_read_gbps,
	    out->threads, out->mem_bytes / MIB);

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
		    out->disk_engine, out->disk_bytes / MIB, o->offload_dir);
	} else {
		say(o, "disk read   not measured  (no --offload-dir)\n");
	}

	if (out->have_gpu) {
		out->copy_bytes = (o->quick ? 16 : 256) * MIB;
		if ((rc = measure_copies(be, out->copy_bytes, &out->h2d_gbps, &out->d2h_gbps)) < 0)
			goto out;
		say(o, "h2d         %8.2f GB/s     (pinned, %zu MiB, median of 3)\n", out->h2d_gbps,
		    out->copy_bytes / MIB);
		say(o, "d2h         %8.2f GB/s     (pinned, %zu MiB, median of 3)\n", out->d2h_gbps,
		    out->copy_bytes / MIB);
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

/* ---- JSON ---------------------------------------------------------------------------- */

/* A measured rate, or null where it was not measured. */
static void set_rate(json_t *j, const char *key, double v, sl_jerr *e)
{
	if (v > 0)
		sl_jset_real(j, key, v, e);
	else
		sl_jset(j, key, json_null(), e);
}

static json_t *node_or_null(int n)
{
	return n >= 0 ? json_integer(n) : json_null();
}

static json_t *shape(int m, int n, int k, sl_jerr *e)
{
	if (m <= 0)
		return json_null();
	json_t *s = json_object();
	sl_jset(s, "m", json_integer(m), e);
	sl_jset(s, "n", json_integer(n), e);
	sl_jset(s, "k", json_integer(k), e);
	return s;
}

static json_t *profile_json(const sl_profile *p, sl_jerr *e)
{
	const sl_topo_info *t = &p->topo;
	json_t *nodes = json_array();
	for (int i = 0; i < SL_MIN(t->nnodes, SL_TOPO_MAX_NODES); i++) {
		json_t *n = json_object();
		sl_jset(n, "node", json_integer(t->node[i].os_index), e);
		sl_jset(n, "memory_bytes", json_integer((json_int_t)t->node[i].memory_bytes), e);
		sl_jset(n, "cores", json_integer(t->node[i].cores), e);
		sl_jset(n, "pus", json_integer(t->node[i].pus), e);
		sl_jset(n, "cpus", json_string(t->node[i].cpus), e);
		sl_jappend(nodes, n, "numa_nodes", e);
	}
	json_t *topo = json_object();
	sl_jset(topo, "hwloc", json_boolean(t->loaded), e);
	sl_jset(topo, "packages", json_integer(t->packages), e);
	sl_jset(topo, "cores", json_integer(t->cores), e);
	sl_jset(topo, "pus", json_integer(t->pus), e);
	sl_jset(topo, "numa_node_count", json_integer(t->nnodes), e);
	sl_jset(topo, "numa_nodes", nodes, e);
	sl_jset(topo, "binding", json_string(t->binding), e);
	sl_jset(topo, "binding_pus", json_integer(t->binding_pus), e);
	sl_jset(topo, "binding_node", node_or_null(t->binding_node), e);
	json_t *gpu = json_null();
	if (p->have_gpu) {
		gpu = json_object();
		sl_jset(gpu, "name", json_string(p->gpu.name), e);
		sl_jset(gpu, "pci_bus_id", json_string(p->gpu.pci_bus_id), e);
		sl_jset(gpu, "memory_bytes", json_integer((json_int_t)p->gpu.memory_bytes), e);
		sl_jset(gpu, "numa_node", node_or_null(p->gpu.numa_node), e);
	}
	json_t *j = json_object();
	sl_jset(j, "format", json_string("sluice-profile"), e);
	sl_jset(j, "format_version", json_integer(1), e);
	sl_jset(j, "sluice_version", json_string(SL_VERSION), e);
	sl_jset(j, "quick", json_boolean(p->quick), e);
	sl_jset(j, "backend", json_string(p->backend ? p->backend : ""), e);
	sl_jset(j, "topology", topo, e);
	sl_jset(j, "gpu", gpu, e);
	sl_jset(j, "pinned_numa_node", node_or_null(p->pinned_node), e);
	sl_jset(j, "io_numa_node", node_or_null(p->io_node), e);
	sl_jset(j, "threads", json_integer(p->threads), e);
	set_rate(j, "mem_read_gbps", p->mem_read_gbps, e);
	sl_jset(j, "mem_read_bytes", json_integer((json_int_t)p->mem_bytes), e);
	set_rate(j, "cpu_gemm_gflops", p->cpu_gemm_gflops, e);
	sl_jset(j, "cpu_gemm_shape", shape(p->cpu_gemm_m, p->cpu_gemm_n, p->cpu_gemm_k, e), e);
	set_rate(j, "disk_read_gbps", p->disk_read_gbps, e);
	sl_jset(j, "disk_engine", p->disk_engine[0] ? json_string(p->disk_engine) : json_null(), e);
	sl_jset(j, "disk_probe_bytes", p->disk_bytes ? json_integer((json_int_t)p->disk_bytes) : json_null(),
		e);
	sl_jset(j, "offload_dir", p->offload_dir ? json_string(p->offload_dir) : json_null(), e);
	set_rate(j, "h2d_gbps", p->h2d_gbps, e);
	set_rate(j, "d2h_gbps", p->d2h_gbps, e);
	sl_jset(j, "copy_bytes", p->copy_bytes ? json_integer((json_int_t)p->copy_bytes) : json_null(), e);
	set_rate(j, "gpu_gemm_tflops", p->gpu_gemm_tflops, e);
	sl_jset(j, "gpu_gemm_shape", shape(p->gpu_gemm_m, p->gpu_gemm_n, p->gpu_gemm_k, e), e);
	sl_jset_real(j, "seconds", p->seconds, e);
	return j;
}

int sl_profile_save_json(const sl_profile *p, const char *path)
{
	char *tmp = tmp_path(path);
	sl_jerr e = { 0 };
	json_t *j = profile_json(p, &e);
	int rc = sl_jcheck(&e, path);
	if (rc < 0)
		goto out;
	if (!tmp) {
		rc = sl_err(SL_ENOMEM, "%s: out of memory", path);
		goto out;
	}
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		rc = sl_err(SL_EIO, "cannot write %s (%s)", path, strerror(errno));
		goto out;
	}
	int bad = json_dumpfd(j, fd, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	int err = errno;
	if (!bad && write(fd, "\n", 1) != 1) {
		bad = -1;
		err = errno;
	}
	if (!bad && fsync(fd) != 0) {
		bad = -1;
		err = errno;
	}
	if (close(fd) != 0 && !bad) {
		bad = -1;
		err = errno;
	}
	if (!bad && rename(tmp, path) != 0) {
		bad = -1;
		err = errno;
	}
	if (bad) {
		unlink(tmp);
		rc = sl_err(SL_EIO, "cannot write %s (%s)", path, strerror(err));
	}
out:
	json_decref(j);
	free(tmp);
	return rc;
}
