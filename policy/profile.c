/*
 * profile.c - the hardware profile's JSON file: writing and reading
 * (profile.h).  Needs only common/ and jansson.
 */
#include "profile.h"
#include "sl_common.h"
#include "sl_config.h"
#include "sl_json.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SL_PROFILE_MAX_FILE_BYTES (1 << 20)

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

/* ---- writing ---------------------------------------------------------------------- */

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

/* Into o, n points as two arrays: "m" of the rows and yk of the values
 * (what names them in an error). */
static void set_points(json_t *o, const char *what, const int *m, const char *yk, const double *y, int n, sl_jerr *e)
{
	char mw[64], yw[64];
	snprintf(mw, sizeof mw, "%s.m", what);
	snprintf(yw, sizeof yw, "%s.%s", what, yk);
	json_t *ma = json_array(), *ya = json_array();
	for (int i = 0; i < n; i++) {
		sl_jappend(ma, json_integer(m[i]), mw, e);
		sl_jappend_real(ya, y[i], yw, e);
	}
	sl_jset(o, "m", ma, e);
	sl_jset(o, yk, ya, e);
}

/* The GEMM curve {n, k, m: [...], gflops: [...]}, or null (no points). */
static json_t *curve(const sl_profile_curve *c, sl_jerr *e)
{
	if (c->npoints <= 0)
		return json_null();
	json_t *o = json_object();
	sl_jset(o, "n", json_integer(c->n), e);
	sl_jset(o, "k", json_integer(c->k), e);
	set_points(o, "gemm", c->m, "gflops", c->gflops, SL_MIN(c->npoints, SL_PROFILE_CURVE_MAX), e);
	return o;
}

/* --fit's cache shares {m: [...], share: [...]}, or null (not fitted). */
static json_t *fit_hot_json(const sl_profile *p, sl_jerr *e)
{
	if (p->fit_hot_n <= 0)
		return json_null();
	json_t *o = json_object();
	set_points(o, "fit_hot", p->fit_hot_m, "share", p->fit_hot_share, SL_MIN(p->fit_hot_n, SL_PROFILE_FIT_HOT_MAX),
		   e);
	return o;
}

/* The disk's read curve {outstanding, bytes: [...], gbps: [...], spread:
 * [...]}, or null (no points). */
static json_t *disk_curve(const sl_profile_disk_curve *c, sl_jerr *e)
{
	if (c->npoints <= 0)
		return json_null();
	json_t *b = json_array(), *g = json_array(), *sp = json_array();
	for (int i = 0; i < SL_MIN(c->npoints, SL_PROFILE_DISK_MAX); i++) {
		sl_jappend(b, json_integer((json_int_t)c->bytes[i]), "disk_segment_read.bytes", e);
		sl_jappend_real(g, c->gbps[i], "disk_segment_read.gbps", e);
		sl_jappend_real(sp, c->spread[i], "disk_segment_read.spread", e);
	}
	json_t *o = json_object();
	sl_jset(o, "outstanding", json_integer(c->outstanding), e);
	sl_jset(o, "bytes", b, e);
	sl_jset(o, "gbps", g, e);
	sl_jset(o, "spread", sp, e);
	return o;
}

static json_t *profile_json(const sl_profile *p, sl_jerr *e)
{
	const sl_profile_topo *t = &p->topo;
	json_t *nodes = json_array();
	for (int i = 0; i < SL_MIN(t->nnodes, SL_PROFILE_MAX_NODES); i++) {
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
	sl_jset(j, "format_version", json_integer(SL_PROFILE_FORMAT_VERSION), e);
	sl_jset(j, "sluice_version", json_string(SL_VERSION), e);
	sl_jset(j, "quick", json_boolean(p->quick), e);
	sl_jset(j, "backend", json_string(p->backend), e);
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
	sl_jset(j, "offload_dir", p->offload_dir[0] ? json_string(p->offload_dir) : json_null(), e);
	set_rate(j, "h2d_gbps", p->h2d_gbps, e);
	set_rate(j, "d2h_gbps", p->d2h_gbps, e);
	sl_jset(j, "copy_bytes", p->copy_bytes ? json_integer((json_int_t)p->copy_bytes) : json_null(), e);
	set_rate(j, "gpu_gemm_tflops", p->gpu_gemm_tflops, e);
	sl_jset(j, "gpu_gemm_shape", shape(p->gpu_gemm_m, p->gpu_gemm_n, p->gpu_gemm_k, e), e);
	/* format 2 */
	sl_jset(j, "build", p->build[0] ? json_string(p->build) : json_null(), e);
	sl_jset(j, "machine", p->machine[0] ? json_string(p->machine) : json_null(), e);
	sl_jset(j, "gemm", curve(&p->gemm, e), e);
	sl_jset(j, "gemm_q4", curve(&p->gemm_q4, e), e);
	sl_jset(j, "gemm_hot", curve(&p->gemm_hot, e), e);
	sl_jset(j, "llc_bytes", p->llc_bytes ? json_integer((json_int_t)p->llc_bytes) : json_null(), e);
	sl_jset(j, "llc_hot_bytes", p->llc_hot_bytes ? json_integer((json_int_t)p->llc_hot_bytes) : json_null(),
		e);
	json_t *shapes = json_array();
	for (int i = 0; i < SL_MIN(p->n_gemm_shapes, SL_PROFILE_SHAPES_MAX); i++)
		sl_jappend(shapes, curve(&p->gemm_shapes[i], e), "gemm_shapes", e);
	sl_jset(j, "gemm_shapes", shapes, e);
	set_rate(j, "copy_gbps", p->copy_gbps, e);
	set_rate(j, "copy_latency_us", p->copy_latency_us, e);
	set_rate(j, "op_latency_us", p->op_latency_us, e);
	set_rate(j, "attn_decode_gbps", p->attn_decode_gbps, e);
	set_rate(j, "attn_prefill_gflops", p->attn_prefill_gflops, e);
	set_rate(j, "cpu_attn_gbps", p->cpu_attn_gbps, e);
	set_rate(j, "disk_write_gbps", p->disk_write_gbps, e);
	sl_jset_real(j, "copy_overlap", p->copy_overlap, e);
	sl_jset(j, "disk_passes", p->disk_passes > 0 ? json_integer(p->disk_passes) : json_null(), e);
	sl_jset(j, "disk_read_spread", p->disk_passes > 0 ? json_real(p->disk_read_spread) : json_null(), e);
	sl_jset(j, "disk_segment_read", disk_curve(&p->disk_seg, e), e);
	set_rate(j, "disk_page_write_gbps", p->disk_page_write_gbps, e);
	sl_jset(j, "disk_overlap", p->have_disk_overlap ? json_real(p->disk_overlap) : json_null(), e);
	sl_jset(j, "load_average", p->load_average >= 0 ? json_real(p->load_average) : json_null(), e);
	set_rate(j, "zstd_gbps", p->zstd_gbps, e);
	sl_jset(j, "zstd_ratio", p->zstd_ratio > 0 ? json_real(p->zstd_ratio) : json_null(), e);
	sl_jset(j, "dev_reserve_bytes", json_integer((json_int_t)p->dev_reserve_bytes), e);
	sl_jset(j, "cpu_gemm", p->cpu_gemm[0] ? json_string(p->cpu_gemm) : json_null(), e);
	set_rate(j, "fit_prefill", p->fit_prefill, e);
	set_rate(j, "fit_decode", p->fit_decode, e);
	sl_jset(j, "fit_hot", fit_hot_json(p, e), e);
	sl_jset(j, "fit_model", p->fit_model[0] ? json_string(p->fit_model) : json_null(), e);
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

/* ---- reading ---------------------------------------------------------------------- */

/*
 * A reader keeps the first error: every getter after it does nothing and
 * returns 0, so the fields read in a row and the error is checked once.
 * Fields are named by their place, "topology.numa_nodes[1].cores".
 */
typedef struct reader {
	const char *path;
	int rc;
} reader;

static const char *type_of(const json_t *v)
{
	switch (json_typeof(v)) {
	case JSON_OBJECT: return "an object";
	case JSON_ARRAY: return "an array";
	case JSON_STRING: return "a string";
	case JSON_INTEGER: return "an integer";
	case JSON_REAL: return "a number";
	case JSON_TRUE: return "true";
	case JSON_FALSE: return "false";
	default: return "null";
	}
}

/* obj[key], or NULL with the error "missing". */
static json_t *field(reader *r, const json_t *obj, const char *where, const char *key)
{
	if (r->rc < 0)
		return NULL;
	json_t *v = json_object_get(obj, key);
	if (!v)
		r->rc = sl_err(SL_EFORMAT, "%s: %s%s is missing", r->path, where, key);
	return v;
}

static void wrong_type(reader *r, const char *where, const char *key, const char *want, const json_t *v)
{
	r->rc = sl_err(SL_EFORMAT, "%s: %s%s must be %s, got %s", r->path, where, key, want, type_of(v));
}

static int64_t get_int(reader *r, const json_t *obj, const char *where, const char *key, int64_t lo,
		       int64_t hi)
{
	json_t *v = field(r, obj, where, key);
	if (!v)
		return 0;
	if (!json_is_integer(v)) {
		wrong_type(r, where, key, "an integer", v);
		return 0;
	}
	const int64_t x = json_integer_value(v);
	if (x < lo || x > hi) {
		r->rc = sl_err(SL_ERANGE, "%s: %s%s = %" PRId64 ", must be in [%" PRId64 ", %" PRId64 "]", r->path,
			       where, key, x, lo, hi);
		return 0;
	}
	return x;
}

/* An integer in [lo, hi], or null: none (0 for sizes, -1 for nodes). */
static int64_t get_int_or_null(reader *r, const json_t *obj, const char *where, const char *key, int64_t lo,
			       int64_t hi, int64_t none)
{
	json_t *v = field(r, obj, where, key);
	if (!v || json_is_null(v))
		return none;
	if (!json_is_integer(v)) {
		wrong_type(r, where, key, "an integer or null", v);
		return none;
	}
	return get_int(r, obj, where, key, lo, hi);
}

static bool get_bool(reader *r, const json_t *obj, const char *where, const char *key)
{
	json_t *v = field(r, obj, where, key);
	if (!v)
		return false;
	if (!json_is_boolean(v)) {
		wrong_type(r, where, key, "true or false", v);
		return false;
	}
	return json_is_true(v);
}

/* A rate: a positive finite number, or null (0: not measured). */
static double get_rate(reader *r, const json_t *obj, const char *key)
{
	json_t *v = field(r, obj, "", key);
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_number(v)) {
		wrong_type(r, "", key, "a positive number or null", v);
		return 0;
	}
	const double x = json_number_value(v);
	if (!(x > 0) || !isfinite(x)) {
		r->rc = sl_err(SL_ERANGE, "%s: %s = %g, must be a positive number or null", r->path, key, x);
		return 0;
	}
	return x;
}

/* An optional share in [0, 1]: absent or null is 0 (not measured). */
static double get_share(reader *r, const json_t *obj, const char *key)
{
	if (r->rc < 0)
		return 0;
	json_t *v = json_object_get(obj, key);
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_number(v)) {
		wrong_type(r, "", key, "a number in [0, 1] or null", v);
		return 0;
	}
	const double x = json_number_value(v);
	if (!(x >= 0 && x <= 1)) {
		r->rc = sl_err(SL_ERANGE, "%s: %s = %g, must be in [0, 1]", r->path, key, x);
		return 0;
	}
	return x;
}

/* An optional rate: absent or null is 0 (not measured). */
static double get_opt_rate(reader *r, const json_t *obj, const char *key)
{
	if (r->rc < 0 || !json_object_get(obj, key))
		return 0;
	return get_rate(r, obj, key);
}

/* An optional number >= 0 (a load average, a spread): absent or null is -1
 * (unknown). */
static double get_nonneg(reader *r, const json_t *obj, const char *key)
{
	if (r->rc < 0)
		return -1;
	json_t *v = json_object_get(obj, key);
	if (!v || json_is_null(v))
		return -1;
	if (!json_is_number(v)) {
		wrong_type(r, "", key, "a number or null", v);
		return -1;
	}
	const double x = json_number_value(v);
	if (!(x >= 0) || !isfinite(x)) {
		r->rc = sl_err(SL_ERANGE, "%s: %s = %g, must be at least 0", r->path, key, x);
		return -1;
	}
	return x;
}

/* A string that fits buf (NUL included); null reads "" where nullable. */
static void get_str(reader *r, const json_t *obj, const char *where, const char *key, char *buf, size_t cap,
		    bool nullable)
{
	json_t *v = field(r, obj, where, key);
	buf[0] = 0;
	if (!v || (nullable && json_is_null(v)))
		return;
	if (!json_is_string(v)) {
		wrong_type(r, where, key, nullable ? "a string or null" : "a string", v);
		return;
	}
	/* (jansson refuses \u0000 unless asked: the string is its length) */
	if (json_string_length(v) >= cap) {
		r->rc = sl_err(SL_EFORMAT, "%s: %s%s is longer than %zu bytes", r->path, where, key, cap - 1);
		return;
	}
	memcpy(buf, json_string_value(v), json_string_length(v) + 1);
}

/* An object, or NULL for null where nullable. */
static json_t *get_obj(reader *r, const json_t *obj, const char *where, const char *key, bool nullable)
{
	json_t *v = field(r, obj, where, key);
	if (!v || (nullable && json_is_null(v)))
		return NULL;
	if (!json_is_object(v)) {
		wrong_type(r, where, key, nullable ? "an object or null" : "an object", v);
		return NULL;
	}
	return v;
}

/* A GEMM shape {"m", "n", "k"}, or null (zeros). */
static void get_shape(reader *r, const json_t *obj, const char *key, int *m, int *n, int *k)
{
	*m = *n = *k = 0;
	json_t *s = get_obj(r, obj, "", key, true);
	if (!s)
		return;
	char where[64];
	snprintf(where, sizeof where, "%s.", key);
	*m = (int)get_int(r, s, where, "m", 1, INT32_MAX);
	*n = (int)get_int(r, s, where, "n", 1, INT32_MAX);
	*k = (int)get_int(r, s, where, "k", 1, INT32_MAX);
}

/* The GEMM curve {n, k, m: [...], gflops: [...]}, or null (no points):
 * 1 to SL_PROFILE_CURVE_MAX points, m increasing, every rate positive. */
static void get_curve_of(reader *r, const json_t *o, const char *w, sl_profile_curve *c);

static void get_curve(reader *r, const json_t *root, const char *key, sl_profile_curve *c)
{
	memset(c, 0, sizeof *c);
	json_t *o = get_obj(r, root, "", key, true);
	if (!o)
		return;
	char w[64];
	snprintf(w, sizeof w, "%s.", key);
	get_curve_of(r, o, w, c);
}

/* gemm_shapes: optional; absent, null or [] is none; each a curve. */
static void get_shape_curves(reader *r, const json_t *root, sl_profile *p)
{
	p->n_gemm_shapes = 0;
	const json_t *a = json_object_get(root, "gemm_shapes");
	if (!a || json_is_null(a))
		return;
	if (!json_is_array(a)) {
		wrong_type(r, "", "gemm_shapes", "an array", a);
		return;
	}
	if (json_array_size(a) > SL_PROFILE_SHAPES_MAX) {
		r->rc = sl_err(SL_EFORMAT, "%s: gemm_shapes lists %zu curves, at most %d", r->path,
			       json_array_size(a), SL_PROFILE_SHAPES_MAX);
		return;
	}
	for (size_t i = 0; i < json_array_size(a) && r->rc == 0; i++) {
		char w[64];
		snprintf(w, sizeof w, "gemm_shapes[%zu].", i);
		const json_t *o = json_array_get(a, i);
		if (!json_is_object(o)) {
			r->rc = sl_err(SL_EFORMAT, "%s: gemm_shapes[%zu] must be an object, got %s", r->path, i,
				       type_of(o));
			return;
		}
		memset(&p->gemm_shapes[i], 0, sizeof p->gemm_shapes[i]);
		get_curve_of(r, o, w, &p->gemm_shapes[i]);
		if (r->rc == 0)
			p->n_gemm_shapes = (int)i + 1;
	}
	if (r->rc < 0)
		p->n_gemm_shapes = 0;
}

/* A curve's parallel arrays in o (w: its name and a dot, for messages):
 * keys[0] the points, 1 to max of them, and each later key as many values.
 * Fills a[] and returns the count; 0 after an error. */
static size_t get_arrays(reader *r, const json_t *o, const char *w, const char *const *keys, int nkeys,
			 size_t max, json_t **a)
{
	for (int i = 0; i < nkeys; i++) {
		a[i] = field(r, o, w, keys[i]);
		if (a[i] && !json_is_array(a[i]))
			wrong_type(r, w, keys[i], "an array", a[i]);
		if (r->rc < 0)
			return 0;
	}
	const size_t np = json_array_size(a[0]);
	if (np < 1 || np > max) {
		r->rc = sl_err(SL_EFORMAT, "%s: %s%s lists %zu points, must list 1 to %zu", r->path, w, keys[0], np,
			       max);
		return 0;
	}
	for (int i = 1; i < nkeys; i++)
		if (json_array_size(a[i]) != np) {
			r->rc = sl_err(SL_EFORMAT, "%s: %s%s lists %zu points, %s%s %zu", r->path, w, keys[i],
				       json_array_size(a[i]), w, keys[0], np);
			return 0;
		}
	return np;
}

/* A curve's fields in o (w: its name and a dot, for messages). */
static void get_curve_of(reader *r, const json_t *o, const char *w, sl_profile_curve *c)
{
	c->n = (int)get_int(r, o, w, "n", 1, INT32_MAX);
	c->k = (int)get_int(r, o, w, "k", 1, INT32_MAX);
	static const char *const keys[] = { "m", "gflops" };
	json_t *a[2];
	const size_t np = get_arrays(r, o, w, keys, 2, SL_PROFILE_CURVE_MAX, a);
	if (!np)
		return;
	json_t *m = a[0], *g = a[1];
	for (size_t i = 0; i < np; i++) {
		const json_t *mi = json_array_get(m, i), *gi = json_array_get(g, i);
		if (!json_is_integer(mi)) {
			r->rc = sl_err(SL_EFORMAT, "%s: %sm[%zu] must be an integer, got %s", r->path, w, i,
				       type_of(mi));
			return;
		}
		const int64_t x = json_integer_value(mi), prev = i ? c->m[i - 1] : 0;
		if (x <= prev || x > INT32_MAX) {
			r->rc = sl_err(SL_ERANGE, "%s: %sm[%zu] = %" PRId64 ", must be more than %" PRId64
				       " (increasing, from 1)", r->path, w, i, x, prev);
			return;
		}
		if (!json_is_number(gi)) {
			r->rc = sl_err(SL_EFORMAT, "%s: %sgflops[%zu] must be a positive number, got %s", r->path, w,
				       i, type_of(gi));
			return;
		}
		const double y = json_number_value(gi);
		if (!(y > 0) || !isfinite(y)) {
			r->rc = sl_err(SL_ERANGE, "%s: %sgflops[%zu] = %g, must be a positive number", r->path, w, i,
				       y);
			return;
		}
		c->m[i] = (int)x;
		c->gflops[i] = y;
	}
	c->npoints = (int)np;
}

/* A finite number >= 0 from an array (where: its name and index). */
static bool array_num(reader *r, const json_t *a, size_t i, const char *w, const char *key, bool positive,
		      double *out)
{
	const json_t *v = json_array_get(a, i);
	if (!json_is_number(v)) {
		r->rc = sl_err(SL_EFORMAT, "%s: %s%s[%zu] must be a number, got %s", r->path, w, key, i,
			       type_of(v));
		return false;
	}
	const double x = json_number_value(v);
	if (!isfinite(x) || (positive ? !(x > 0) : !(x >= 0))) {
		r->rc = sl_err(SL_ERANGE, "%s: %s%s[%zu] = %g, must be %s", r->path, w, key, i, x,
			       positive ? "a positive number" : "at least 0");
		return false;
	}
	*out = x;
	return true;
}

/* The disk's read curve, optional: absent or null is none. */
static void get_disk_curve(reader *r, const json_t *root, const char *key, sl_profile_disk_curve *c)
{
	memset(c, 0, sizeof *c);
	if (r->rc < 0 || !json_object_get(root, key))
		return;
	json_t *o = get_obj(r, root, "", key, true);
	if (!o)
		return;
	char w[64];
	snprintf(w, sizeof w, "%s.", key);
	c->outstanding = (int)get_int(r, o, w, "outstanding", 1, 4096);
	static const char *const keys[] = { "bytes", "gbps", "spread" };
	json_t *a[3];
	const size_t np = get_arrays(r, o, w, keys, 3, SL_PROFILE_DISK_MAX, a);
	if (!np)
		return;
	json_t *b = a[0], *g = a[1], *sp = a[2];
	for (size_t i = 0; i < np; i++) {
		const json_t *bi = json_array_get(b, i);
		if (!json_is_integer(bi)) {
			r->rc = sl_err(SL_EFORMAT, "%s: %sbytes[%zu] must be an integer, got %s", r->path, w, i,
				       type_of(bi));
			return;
		}
		const int64_t x = json_integer_value(bi), prev = i ? (int64_t)c->bytes[i - 1] : 0;
		if (x <= prev || x % 4096) {
			r->rc = sl_err(SL_ERANGE, "%s: %sbytes[%zu] = %" PRId64 ", must be a multiple of 4096 above %" PRId64
				       " (increasing)", r->path, w, i, x, prev);
			return;
		}
		c->bytes[i] = (uint64_t)x;
		if (!array_num(r, g, i, w, "gbps", true, &c->gbps[i]) ||
		    !array_num(r, sp, i, w, "spread", false, &c->spread[i]))
			return;
	}
	c->npoints = (int)np;
}

/* --fit's cache shares, optional: absent or null is not fitted. */
static void get_fit_hot(reader *r, const json_t *root, sl_profile *p)
{
	p->fit_hot_n = 0;
	const json_t *v = json_object_get(root, "fit_hot");
	if (r->rc < 0 || !v || json_is_null(v))
		return;
	json_t *o = get_obj(r, root, "", "fit_hot", true);
	if (!o)
		return;
	const char *w = "fit_hot.";
	static const char *const keys[] = { "m", "share" };
	json_t *a[2];
	const size_t np = get_arrays(r, o, w, keys, 2, SL_PROFILE_FIT_HOT_MAX, a);
	if (!np)
		return;
	json_t *m = a[0], *s = a[1];
	for (size_t i = 0; i < np; i++) {
		const json_t *mi = json_array_get(m, i);
		const int prev = i ? p->fit_hot_m[i - 1] : 0;
		if (!json_is_integer(mi) || json_integer_value(mi) <= prev || json_integer_value(mi) > 65536) {
			r->rc = sl_err(SL_EFORMAT, "%s: fit_hot.m[%zu] must be an integer above %d (increasing) and at most 65536",
				       r->path, i, prev);
			return;
		}
		p->fit_hot_m[i] = (int)json_integer_value(mi);
		double x;
		if (!array_num(r, s, i, w, "share", false, &x))
			return;
		if (x > 1) {
			r->rc = sl_err(SL_ERANGE, "%s: fit_hot.share[%zu] = %g, must be in [0, 1]", r->path, i, x);
			return;
		}
		p->fit_hot_share[i] = x;
	}
	p->fit_hot_n = (int)np;
}

static void get_topology(reader *r, const json_t *root, sl_profile_topo *t)
{
	const char *w = "topology.";
	json_t *o = get_obj(r, root, "", "topology", false);
	if (!o)
		return;
	t->loaded = get_bool(r, o, w, "hwloc");
	t->packages = (int)get_int(r, o, w, "packages", 0, INT32_MAX);
	t->cores = (int)get_int(r, o, w, "cores", 0, INT32_MAX);
	t->pus = (int)get_int(r, o, w, "pus", 0, INT32_MAX);
	t->nnodes = (int)get_int(r, o, w, "numa_node_count", 1, INT32_MAX);
	json_t *a = field(r, o, w, "numa_nodes");
	if (a && !json_is_array(a))
		wrong_type(r, w, "numa_nodes", "an array", a);
	if (r->rc < 0)
		return;
	const size_t want = (size_t)SL_MIN(t->nnodes, SL_PROFILE_MAX_NODES);
	if (json_array_size(a) != want) {
		r->rc = sl_err(SL_EFORMAT, "%s: topology.numa_nodes lists %zu nodes, numa_node_count %d needs %zu",
			       r->path, json_array_size(a), t->nnodes, want);
		return;
	}
	for (size_t i = 0; i < want && r->rc == 0; i++) {
		char wn[64];
		snprintf(wn, sizeof wn, "topology.numa_nodes[%zu]", i);
		json_t *n = json_array_get(a, i);
		if (!json_is_object(n)) {
			r->rc = sl_err(SL_EFORMAT, "%s: %s must be an object, got %s", r->path, wn, type_of(n));
			return;
		}
		strcat(wn, ".");
		sl_profile_node *d = &t->node[i];
		d->os_index = (int)get_int(r, n, wn, "node", 0, INT32_MAX);
		d->memory_bytes = (uint64_t)get_int(r, n, wn, "memory_bytes", 0, INT64_MAX);
		d->cores = (int)get_int(r, n, wn, "cores", 0, INT32_MAX);
		d->pus = (int)get_int(r, n, wn, "pus", 0, INT32_MAX);
		get_str(r, n, wn, "cpus", d->cpus, sizeof d->cpus, false);
	}
	get_str(r, o, w, "binding", t->binding, sizeof t->binding, false);
	t->binding_pus = (int)get_int(r, o, w, "binding_pus", 0, INT32_MAX);
	t->binding_node = (int)get_int_or_null(r, o, w, "binding_node", 0, INT32_MAX, -1);
}

static void get_profile(reader *r, const json_t *root, int64_t version, sl_profile *p)
{
	p->quick = get_bool(r, root, "", "quick");
	get_str(r, root, "", "backend", p->backend, sizeof p->backend, false);
	get_topology(r, root, &p->topo);
	json_t *g = get_obj(r, root, "", "gpu", true);
	p->have_gpu = g != NULL;
	p->gpu.numa_node = -1;
	if (g) {
		get_str(r, g, "gpu.", "name", p->gpu.name, sizeof p->gpu.name, false);
		get_str(r, g, "gpu.", "pci_bus_id", p->gpu.pci_bus_id, sizeof p->gpu.pci_bus_id, false);
		p->gpu.memory_bytes = (uint64_t)get_int(r, g, "gpu.", "memory_bytes", 0, INT64_MAX);
		p->gpu.numa_node = (int)get_int_or_null(r, g, "gpu.", "numa_node", 0, INT32_MAX, -1);
	}
	p->pinned_node = (int)get_int_or_null(r, root, "", "pinned_numa_node", 0, INT32_MAX, -1);
	p->io_node = (int)get_int_or_null(r, root, "", "io_numa_node", 0, INT32_MAX, -1);
	p->threads = (int)get_int(r, root, "", "threads", 1, INT32_MAX);
	p->mem_read_gbps = get_rate(r, root, "mem_read_gbps");
	p->mem_bytes = (uint64_t)get_int(r, root, "", "mem_read_bytes", 0, INT64_MAX);
	p->cpu_gemm_gflops = get_rate(r, root, "cpu_gemm_gflops");
	get_shape(r, root, "cpu_gemm_shape", &p->cpu_gemm_m, &p->cpu_gemm_n, &p->cpu_gemm_k);
	p->disk_read_gbps = get_rate(r, root, "disk_read_gbps");
	get_str(r, root, "", "disk_engine", p->disk_engine, sizeof p->disk_engine, true);
	p->disk_bytes = (uint64_t)get_int_or_null(r, root, "", "disk_probe_bytes", 1, INT64_MAX, 0);
	get_str(r, root, "", "offload_dir", p->offload_dir, sizeof p->offload_dir, true);
	p->h2d_gbps = get_rate(r, root, "h2d_gbps");
	p->d2h_gbps = get_rate(r, root, "d2h_gbps");
	p->copy_bytes = (uint64_t)get_int_or_null(r, root, "", "copy_bytes", 1, INT64_MAX, 0);
	p->gpu_gemm_tflops = get_rate(r, root, "gpu_gemm_tflops");
	get_shape(r, root, "gpu_gemm_shape", &p->gpu_gemm_m, &p->gpu_gemm_n, &p->gpu_gemm_k);
	memset(&p->gemm_q4, 0, sizeof p->gemm_q4);
	memset(&p->gemm_hot, 0, sizeof p->gemm_hot);
	p->llc_bytes = 0;
	p->llc_hot_bytes = 0;
	p->n_gemm_shapes = 0;
	if (version >= 2) {
		get_str(r, root, "", "build", p->build, sizeof p->build, true);
		get_str(r, root, "", "machine", p->machine, sizeof p->machine, true);
		get_curve(r, root, "gemm", &p->gemm);
		/* optional (files before it lack it): absent or null, not measured */
		if (r->rc == 0 && json_object_get(root, "gemm_q4"))
			get_curve(r, root, "gemm_q4", &p->gemm_q4);
		if (r->rc == 0)
			get_shape_curves(r, root, p);
		/* the cache's curve and size, later still: absent or null, none */
		if (r->rc == 0 && json_object_get(root, "gemm_hot"))
			get_curve(r, root, "gemm_hot", &p->gemm_hot);
		if (r->rc == 0 && json_object_get(root, "llc_bytes"))
			p->llc_bytes = (uint64_t)get_int_or_null(r, root, "", "llc_bytes", 1, INT64_MAX, 0);
		if (r->rc == 0 && json_object_get(root, "llc_hot_bytes"))
			p->llc_hot_bytes = (uint64_t)get_int_or_null(r, root, "", "llc_hot_bytes", 1, INT64_MAX, 0);
		p->copy_gbps = get_rate(r, root, "copy_gbps");
		p->copy_latency_us = get_rate(r, root, "copy_latency_us");
		p->op_latency_us = get_rate(r, root, "op_latency_us");
		p->attn_decode_gbps = get_rate(r, root, "attn_decode_gbps");
		p->attn_prefill_gflops = get_rate(r, root, "attn_prefill_gflops");
		p->cpu_attn_gbps = get_rate(r, root, "cpu_attn_gbps");
		p->disk_write_gbps = get_rate(r, root, "disk_write_gbps");
		p->copy_overlap = get_share(r, root, "copy_overlap");
		/* the disk's patterns, later still: absent is the old model */
		p->disk_passes = (int)(json_object_get(root, "disk_passes")
					       ? get_int_or_null(r, root, "", "disk_passes", 1, 1000, 0)
					       : 0);
		p->disk_read_spread = SL_MAX(0.0, get_nonneg(r, root, "disk_read_spread"));
		get_disk_curve(r, root, "disk_segment_read", &p->disk_seg);
		p->disk_page_write_gbps = get_opt_rate(r, root, "disk_page_write_gbps");
		const json_t *dov = json_object_get(root, "disk_overlap");
		p->have_disk_overlap = dov && !json_is_null(dov);
		p->disk_overlap = get_share(r, root, "disk_overlap");
		p->load_average = get_nonneg(r, root, "load_average");
		/* zstd frames, later: absent is not measured */
		p->zstd_gbps = get_opt_rate(r, root, "zstd_gbps");
		p->zstd_ratio = get_share(r, root, "zstd_ratio");
		p->dev_reserve_bytes = (uint64_t)get_int(r, root, "", "dev_reserve_bytes", 0, INT64_MAX);
		/* sluice profile --fit, later: absent or null, not fitted */
		p->fit_prefill = get_opt_rate(r, root, "fit_prefill");
		p->fit_decode = get_opt_rate(r, root, "fit_decode");
		get_fit_hot(r, root, p);
		p->fit_model[0] = p->cpu_gemm[0] = 0;
		if (r->rc == 0 && json_object_get(root, "cpu_gemm"))
			get_str(r, root, "", "cpu_gemm", p->cpu_gemm, sizeof p->cpu_gemm, true);
		if (r->rc == 0 && json_object_get(root, "fit_model"))
			get_str(r, root, "", "fit_model", p->fit_model, sizeof p->fit_model, true);
	}
	json_t *s = field(r, root, "", "seconds");
	if (s && !json_is_number(s))
		wrong_type(r, "", "seconds", "a number", s);
	else if (s && !(json_number_value(s) >= 0))
		r->rc = sl_err(SL_ERANGE, "%s: seconds = %g, must be at least 0", r->path, json_number_value(s));
	else if (s)
		p->seconds = json_number_value(s);
}

/* The file as JSON, or NULL with the error. */
static json_t *load_file(const char *path, int *rc)
{
	FILE *fp = fopen(path, "rb");
	if (!fp) {
		*rc = errno == ENOENT ? sl_err(SL_ENOTFOUND, "%s: no such profile file", path)
				      : sl_err(SL_EIO, "%s: cannot open the profile file: %s", path, strerror(errno));
		return NULL;
	}
	struct stat st;
	if (fstat(fileno(fp), &st) == 0) {
		if (S_ISDIR(st.st_mode)) {
			fclose(fp);
			*rc = sl_err(SL_EIO, "%s: is a directory, not a profile file", path);
			return NULL;
		}
		if (S_ISREG(st.st_mode) && st.st_size > SL_PROFILE_MAX_FILE_BYTES) {
			fclose(fp);
			*rc = sl_err(SL_EFORMAT, "%s: %lld bytes is too large for a profile file", path,
				     (long long)st.st_size);
			return NULL;
		}
	}
	json_error_t jerr;
	json_t *root = json_loadf(fp, JSON_REJECT_DUPLICATES, &jerr);
	const int read_failed = ferror(fp);
	fclose(fp);
	if (root)
		return root;
	if (read_failed) {
		*rc = sl_err(SL_EIO, "%s: cannot read the profile file", path);
		return NULL;
	}
	for (char *c = jerr.text; *c; c++) /* jansson quotes the input: keep one line */
		if ((unsigned char)*c < 0x20 || *c == 0x7f)
			*c = '?';
	*rc = jerr.line > 0 ? sl_err(SL_EFORMAT, "%s:%d: not valid JSON (line %d, column %d): %s", path, jerr.line,
				     jerr.line, jerr.column, jerr.text)
			    : sl_err(SL_EFORMAT, "%s: not valid JSON: %s", path, jerr.text);
	return NULL;
}

int sl_profile_load(const char *path, sl_profile *p)
{
	SL_ASSERT(path && p);
	int rc = 0;
	json_t *root = load_file(path, &rc);
	if (!root)
		return rc;
	sl_profile *tmp = calloc(1, sizeof *tmp);
	reader r = { .path = path };
	if (!tmp) {
		rc = sl_err(SL_ENOMEM, "%s: out of memory", path);
		goto out;
	}
	const char *fmt = json_string_value(json_object_get(root, "format"));
	if (!json_is_object(root) || !fmt || strcmp(fmt, "sluice-profile")) {
		rc = sl_err(SL_EFORMAT, "%s: not a sluice profile (no \"format\": \"sluice-profile\")", path);
		goto out;
	}
	const int64_t version = get_int(&r, root, "", "format_version", 1, INT64_MAX);
	if (r.rc == 0 && version > SL_PROFILE_FORMAT_VERSION) {
		rc = sl_err(SL_EUNSUPPORTED, "%s: format_version %" PRId64 ", this sluice reads versions 1 to %d",
			    path, version, SL_PROFILE_FORMAT_VERSION);
		goto out;
	}
	tmp->load_average = -1; /* unknown unless the file says */
	get_profile(&r, root, version, tmp);
	if ((rc = r.rc) == 0)
		*p = *tmp;
out:
	free(tmp);
	json_decref(root);
	return rc;
}
