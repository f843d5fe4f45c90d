/*
 * policy.c - the policy field table and everything that walks it: defaults,
 * validation, the JSON file (load / atomic save), command-line setters,
 * printing and the Markdown reference (docs/policy.md).
 *
 * Adding a field: add the member to sl_policy and one line to fields[].
 * Rules across fields live in check_relations().
 */
#define _POSIX_C_SOURCE 200809L
#include "policy.h"
#include "sl_common.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- the table ----------------------------------------------------------- */

enum ftype { F_INT, F_NUM, F_BOOL };

typedef struct pfield {
	const char *name;
	enum ftype type;
	size_t off;
	double min, max, def; /* bools: 0, 1, default */
	const char *help;     /* one sentence for docs/policy.md; no '|' */
} pfield;

/* offsetof that fails to compile when the member is not of type T. */
#define TYPED_OFF(m, T) _Generic(((sl_policy *)0)->m, T: offsetof(sl_policy, m))
#define INT_F(m, lo, hi, d, h) { #m, F_INT, TYPED_OFF(m, int), lo, hi, d, h }
#define NUM_F(m, lo, hi, d, h) { #m, F_NUM, TYPED_OFF(m, double), lo, hi, d, h }
#define BOOL_F(m, d, h) { #m, F_BOOL, TYPED_OFF(m, bool), 0, 1, d, h }

static const pfield fields[] = {
	INT_F(gpu_batch_size, 1, 65536, 8,
	      "Sequences per micro-batch (FlexGen's gbs). The run takes gpu_batch_size x num_gpu_batches prompts."),
	INT_F(num_gpu_batches, 1, 4096, 1,
	      "Micro-batches per block (ngb): one layer's weights serve all of them before the next layer's are loaded."),
	NUM_F(w_gpu_percent, 0, 100, 100,
	      "Share of each layer's weight bytes on the GPU, held to within 16 rows of a matrix (a matrix a tier boundary falls in is split by rows)."),
	NUM_F(w_cpu_percent, 0, 100, 0,
	      "Share of each layer's weight bytes in CPU memory; disk holds 100 - w_gpu_percent - w_cpu_percent."),
	NUM_F(cache_gpu_percent, 0, 100, 100,
	      "Share of the KV cache on the GPU (whole sequences)."),
	NUM_F(cache_cpu_percent, 0, 100, 0,
	      "Share of the KV cache in CPU memory; disk holds the rest."),
	NUM_F(act_gpu_percent, 0, 100, 100,
	      "Activations (hidden states between layers) on the GPU. Activations live on one device: 100 here, 100 in act_cpu_percent, or 0 in both (disk); this version runs them on the GPU or in CPU memory and refuses disk."),
	NUM_F(act_cpu_percent, 0, 100, 0,
	      "Activations in CPU memory: 100 keeps the whole block's hidden states in pinned CPU memory, and each step brings its micro-batch's rows to the GPU and back."),
	BOOL_F(overlap, 1,
	       "Overlapped schedule: load the next layer's weights and cache while computing this one."),
	BOOL_F(sep_layer, 1,
	       "Attention and MLP are separate schedule steps: the attention of every micro-batch runs before the layer's MLPs, and streamed weights stage half a layer at a time (the MLP half loads while the attention runs)."),
	BOOL_F(pin_weight, 1,
	       "CPU-resident weights in page-locked memory: faster copies, more locked RAM (this version always pins them)."),
	BOOL_F(cpu_cache_compute, 0,
	       "Decode attention of the CPU-resident part of the cache runs on the CPU where it lives instead of copying that part to the GPU (the disk-resident part is still brought in)."),
	BOOL_F(compress_weight, 0,
	       "4-bit group-wise weight compression (groups of 64 along each row's input dimension, 4.5 bits a value): every decoder layer's linear matrices quantised once at load, kept and moved so in every tier (the disk store records it), dequantised inside the GEMM; biases, norms, embeddings and the head stay fp16; `--compress-weight`."),
	BOOL_F(compress_cache, 0,
	       "4-bit group-wise KV cache compression (groups of 64 along head_dim, 4.5 bits a value; K and V quantised as written, dequantised inside attention), in every tier, with H2O and cpu_cache_compute; `--compress-cache`."),
	NUM_F(hh_ratio, 0, 1, 0,
	      "H2O heavy-hitter budget as a share of the prompt length; with recent_ratio also 0 (or negative) the cache is dense."),
	NUM_F(recent_ratio, -1, 1, -1,
	      "H2O recent-window budget as a share of the prompt length; negative means the same as hh_ratio; with hh_ratio 0 a recent-only window."),
};

#define NFIELDS SL_ARRAY_LEN(fields)

static const pfield *find_field(const char *name)
{
	for (size_t i = 0; i < NFIELDS; i++)
		if (!strcmp(fields[i].name, name))
			return &fields[i];
	return NULL;
}

static double fget(const sl_policy *p, const pfield *f)
{
	const char *b = (const char *)p + f->off;
	switch (f->type) {
	case F_INT:
		return *(const int *)(const void *)b;
	case F_NUM:
		return *(const double *)(const void *)b;
	case F_BOOL:
		return *(const bool *)(const void *)b;
	}
	return 0;
}

static void fset(sl_policy *p, const pfield *f, double v)
{
	char *b = (char *)p + f->off;
	switch (f->type) {
	case F_INT:
		*(int *)(void *)b = (int)v;
		break;
	case F_NUM:
		*(double *)(void *)b = v;
		break;
	case F_BOOL:
		*(bool *)(void *)b = v != 0;
		break;
	}
}

/* ---- formatting ------------------------------------------------------------ */

/* Shortest "%.Ng" that reads back to the same double; '.' whatever the locale. */
static const char *fmt_double(char buf[40], double v)
{
	if (v == 0) {
		strcpy(buf, "0");
		return buf;
	}
	if (v == floor(v) && fabs(v) < 1e15) {
		snprintf(buf, 40, "%.0f", v);
		return buf;
	}
	for (int prec = 1; prec <= 17; prec++) {
		snprintf(buf, 40, "%.*g", prec, v);
		if (strtod(buf, NULL) == v)
			break;
	}
	for (char *c = buf; *c; c++)
		if (*c == ',')
			*c = '.';
	return buf;
}

static const char *fmt_value(char buf[40], const pfield *f, double v)
{
	switch (f->type) {
	case F_INT:
		snprintf(buf, 40, "%d", (int)v);
		return buf;
	case F_BOOL:
		return v != 0 ? "true" : "false";
	case F_NUM:
		break;
	}
	return fmt_double(buf, v);
}

static const char *fmt_bounds(char buf[96], const pfield *f)
{
	char lo[40], hi[40];
	snprintf(buf, 96, "[%s, %s]", fmt_double(lo, f->min), fmt_double(hi, f->max));
	return buf;
}

static const char *type_name(const pfield *f)
{
	switch (f->type) {
	case F_INT:
		return "an integer";
	case F_NUM:
		return "a number";
	case F_BOOL:
		return "true or false";
	}
	return "?";
}

/* A user string fit for a one-line message: at most 40 bytes, no controls. */
static const char *clean(char buf[48], const char *s)
{
	size_t n = 0;
	for (; s[n] && n < 40; n++)
		buf[n] = (unsigned char)s[n] < 0x20 || s[n] == 0x7f ? '?' : s[n];
	buf[n] = 0;
	if (s[n])
		strcpy(buf + n, "...");
	return buf;
}

/* What a JSON value is, for "expected X, got Y". */
static const char *describe(char buf[64], const json_t *v)
{
	switch (json_typeof(v)) {
	case JSON_OBJECT:
		return "an object";
	case JSON_ARRAY:
		return "an array";
	case JSON_STRING: {
		char c[48];
		snprintf(buf, 64, "the string \"%s\"", clean(c, json_string_value(v)));
		return buf;
	}
	case JSON_INTEGER:
		snprintf(buf, 64, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
		return buf;
	case JSON_REAL:
		return fmt_double(buf, json_real_value(v));
	case JSON_TRUE:
		return "true";
	case JSON_FALSE:
		return "false";
	case JSON_NULL:
		return "null";
	}
	return "?";
}

/* ---- names: edit distance and suggestions ---------------------------------- */

static int norm_char(char c)
{
	return c == '-' ? '_' : tolower((unsigned char)c);
}

/* Optimal string alignment distance (Levenshtein plus adjacent swaps). */
static int edit_distance(const char *a, const char *b)
{
	size_t n = strlen(a), m = strlen(b);
	if (n > 63 || m > 63)
		return INT_MAX;
	int d[64][64];
	for (size_t i = 0; i <= n; i++)
		d[i][0] = (int)i;
	for (size_t j = 0; j <= m; j++)
		d[0][j] = (int)j;
	for (size_t i = 1; i <= n; i++) {
		for (size_t j = 1; j <= m; j++) {
			int cost = norm_char(a[i - 1]) != norm_char(b[j - 1]);
			int v = SL_MIN(d[i - 1][j] + 1, d[i][j - 1] + 1);
			v = SL_MIN(v, d[i - 1][j - 1] + cost);
			if (i > 1 && j > 1 && norm_char(a[i - 1]) == norm_char(b[j - 2]) &&
			    norm_char(a[i - 2]) == norm_char(b[j - 1]))
				v = SL_MIN(v, d[i - 2][j - 2] + 1);
			d[i][j] = v;
		}
	}
	return d[n][m];
}

/* The known name closest to s, if within distance 2; "version" counts in files. */
static const char *closest(const char *s, bool with_version)
{
	const char *best = NULL;
	int bd = 3;
	for (size_t i = 0; i <= NFIELDS; i++) {
		const char *name = i < NFIELDS ? fields[i].name : "version";
		if (i == NFIELDS && !with_version)
			break;
		int dist = edit_distance(s, name);
		if (dist < bd) {
			bd = dist;
			best = name;
		}
	}
	return best;
}

/* "gpu_batch_size" -> "--gpu-batch-size" */
static const char *flag_name(char buf[72], const char *name)
{
	snprintf(buf, 72, "--%s", name);
	for (char *c = buf + 2; *c; c++)
		if (*c == '_')
			*c = '-';
	return buf;
}

/* ---- validation ------------------------------------------------------------ */

static int check_field(const sl_policy *p, const pfield *f, const char *src)
{
	if (f->type == F_BOOL)
		return 0;
	double v = fget(p, f);
	if (v >= f->min && v <= f->max)
		return 0;
	char vb[40], bb[96];
	return sl_err(SL_ERANGE, "%s: %s = %s, must be in %s", src, f->name, fmt_value(vb, f, v),
		      fmt_bounds(bb, f));
}

static bool on_one_device(double gpu, double cpu)
{
	return gpu == 100 || cpu == 100 || (gpu == 0 && cpu == 0);
}

static const struct {
	const char *gpu, *cpu;
	size_t og, oc;
} placement[] = {
	{ "w_gpu_percent", "w_cpu_percent", offsetof(sl_policy, w_gpu_percent),
	  offsetof(sl_policy, w_cpu_percent) },
	{ "cache_gpu_percent", "cache_cpu_percent", offsetof(sl_policy, cache_gpu_percent),
	  offsetof(sl_policy, cache_cpu_percent) },
	{ "act_gpu_percent", "act_cpu_percent", offsetof(sl_policy, act_gpu_percent),
	  offsetof(sl_policy, act_cpu_percent) },
};

/* The rules across fields; placement_only: only those --percent can break. */
static int check_relations(const sl_policy *p, const char *src, bool placement_only)
{
	char a[40], b[40];
	for (size_t i = 0; i < SL_ARRAY_LEN(placement); i++) {
		double g = *(const double *)(const void *)((const char *)p + placement[i].og);
		double c = *(const double *)(const void *)((const char *)p + placement[i].oc);
		if (g + c > 100 + 1e-9)
			return sl_err(SL_ERANGE, "%s: %s + %s = %.10g, must be at most 100 (disk holds the rest)",
				      src, placement[i].gpu, placement[i].cpu, g + c);
	}
	if (!on_one_device(p->act_gpu_percent, p->act_cpu_percent))
		return sl_err(SL_EUNSUPPORTED,
			      "%s: act_gpu_percent = %s, act_cpu_percent = %s: activations must be 100%% on one device (gpu, cpu, or disk with both 0), as in FlexGen",
			      src, fmt_double(a, p->act_gpu_percent), fmt_double(b, p->act_cpu_percent));
	if (placement_only)
		return 0;
	double r = sl_policy_recent_ratio(p);
	if (p->hh_ratio + r > 1 + 1e-12)
		return sl_err(SL_ERANGE, "%s: hh_ratio + recent_ratio%s = %.10g, must be at most 1", src,
			      p->recent_ratio < 0 ? " (same as hh_ratio)" : "", p->hh_ratio + r);
	return 0;
}

int sl_policy_validate(const sl_policy *p, const char *source)
{
	SL_ASSERT(p);
	const char *src = source ? source : "policy";
	for (size_t i = 0; i < NFIELDS; i++)
		SL_TRY(check_field(p, &fields[i], src));
	return check_relations(p, src, false);
}

/* ---- small accessors ------------------------------------------------------- */

void sl_policy_default(sl_policy *p)
{
	SL_ASSERT(p);
	memset(p, 0, sizeof *p);
	for (size_t i = 0; i < NFIELDS; i++)
		fset(p, &fields[i], fields[i].def);
}

size_t sl_policy_batch(const sl_policy *p)
{
	return (size_t)SL_MAX(p->gpu_batch_size, 0) * (size_t)SL_MAX(p->num_gpu_batches, 0);
}

double sl_policy_recent_ratio(const sl_policy *p)
{
	return p->recent_ratio < 0 ? p->hh_ratio : p->recent_ratio;
}

bool sl_policy_equal(const sl_policy *a, const sl_policy *b)
{
	for (size_t i = 0; i < NFIELDS; i++)
		if (fget(a, &fields[i]) != fget(b, &fields[i]))
			return false;
	return true;
}

/* ---- the file -------------------------------------------------------------- */

/* One JSON member onto tmp; the file's name is src. */
static int load_member(sl_policy *tmp, const char *src, const char *key, json_t *v)
{
	char kb[48], vb[64], bb[96];
	if (!strcmp(key, "version")) {
		if (!json_is_integer(v))
			return sl_err(SL_EFORMAT, "%s: version must be an integer, got %s", src,
				      describe(vb, v));
		if (json_integer_value(v) != SL_POLICY_VERSION)
			return sl_err(SL_EUNSUPPORTED,
				      "%s: version = %" JSON_INTEGER_FORMAT ", this sluice reads policy version %d",
				      src, json_integer_value(v), SL_POLICY_VERSION);
		return 0;
	}
	/* what `sluice policy` predicted for the policy: read by people and
	 * tools, ignored here */
	if (!strcmp(key, "predicted")) {
		if (!json_is_object(v))
			return sl_err(SL_EFORMAT,
				      "%s: predicted must be an object (what sluice policy predicted), got %s",
				      src, describe(vb, v));
		return 0;
	}
	const pfield *f = find_field(key);
	if (!f) {
		const char *s = closest(key, true);
		if (s)
			return sl_err(SL_EFORMAT, "%s: unknown field '%s' (did you mean '%s'?)", src,
				      clean(kb, key), s);
		return sl_err(SL_EFORMAT, "%s: unknown field '%s' (see docs/policy.md for the fields)",
			      src, clean(kb, key));
	}
	double x;
	switch (f->type) {
	case F_INT:
		if (!json_is_integer(v))
			return sl_err(SL_EFORMAT, "%s: %s must be an integer, got %s", src, f->name,
				      describe(vb, v));
		json_int_t iv = json_integer_value(v);
		if (iv < (json_int_t)f->min || iv > (json_int_t)f->max)
			return sl_err(SL_ERANGE, "%s: %s = %" JSON_INTEGER_FORMAT ", must be in %s", src,
				      f->name, iv, fmt_bounds(bb, f));
		x = (double)iv;
		break;
	case F_NUM:
		if (!json_is_number(v))
			return sl_err(SL_EFORMAT, "%s: %s must be a number, got %s", src, f->name,
				      describe(vb, v));
		x = json_number_value(v);
		break;
	case F_BOOL:
		if (!json_is_boolean(v))
			return sl_err(SL_EFORMAT, "%s: %s must be true or false, got %s", src, f->name,
				      describe(vb, v));
		x = json_is_true(v);
		break;
	default:
		return sl_err(SL_EINVAL, "%s: %s: bad field type", src, f->name);
	}
	fset(tmp, f, x);
	return check_field(tmp, f, src);
}

#define SL_POLICY_MAX_BYTES (1 << 20)

int sl_policy_load(const char *path, sl_policy *p)
{
	SL_ASSERT(path && p);
	FILE *fp = fopen(path, "rb");
	if (!fp) {
		if (errno == ENOENT)
			return sl_err(SL_ENOTFOUND, "%s: no such policy file", path);
		return sl_err(SL_EIO, "%s: cannot open the policy file: %s", path, strerror(errno));
	}
	struct stat st;
	if (fstat(fileno(fp), &st) == 0) {
		if (S_ISDIR(st.st_mode)) {
			fclose(fp);
			return sl_err(SL_EIO, "%s: is a directory, not a policy file", path);
		}
		if (S_ISREG(st.st_mode) && st.st_size > SL_POLICY_MAX_BYTES) {
			fclose(fp);
			return sl_err(SL_EFORMAT, "%s: %lld bytes is too large for a policy file", path,
				      (long long)st.st_size);
		}
	}
	json_error_t jerr;
	json_t *root = json_loadf(fp, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &jerr);
	int read_failed = ferror(fp);
	fclose(fp);
	if (!root) {
		if (read_failed)
			return sl_err(SL_EIO, "%s: cannot read the policy file", path);
		for (char *c = jerr.text; *c; c++) /* jansson quotes the input: keep one line */
			if ((unsigned char)*c < 0x20 || *c == 0x7f)
				*c = '?';
		if (jerr.line > 0)
			return sl_err(SL_EFORMAT, "%s:%d: not valid JSON (line %d, column %d): %s", path,
				      jerr.line, jerr.line, jerr.column, jerr.text);
		return sl_err(SL_EFORMAT, "%s: not valid JSON: %s", path, jerr.text);
	}
	int rc = 0;
	if (!json_is_object(root)) {
		char vb[64];
		rc = sl_err(SL_EFORMAT, "%s: a policy file is a JSON object {\"field\": value, ...}, not %s",
			    path, describe(vb, root));
		goto done;
	}
	sl_policy tmp;
	sl_policy_default(&tmp);
	const char *key;
	json_t *v;
	json_object_foreach(root, key, v) {
		if ((rc = load_member(&tmp, path, key, v)))
			goto done;
	}
	if ((rc = sl_policy_validate(&tmp, path)))
		goto done;
	*p = tmp;
done:
	json_decref(root);
	return rc;
}

/* The file's text; predicted (NULL: none) the JSON text of its "predicted" object. */
static int write_json(const sl_policy *p, const char *predicted, FILE *f)
{
	char vb[40];
	fprintf(f, "{\n  \"version\": %d", SL_POLICY_VERSION);
	for (size_t i = 0; i < NFIELDS; i++)
		fprintf(f, ",\n  \"%s\": %s", fields[i].name,
			fmt_value(vb, &fields[i], fget(p, &fields[i])));
	if (predicted)
		fprintf(f, ",\n  \"predicted\": %s", predicted);
	fputs("\n}\n", f);
	return ferror(f) ? sl_err(SL_EIO, "cannot write the policy JSON") : 0;
}

int sl_policy_write_json(const sl_policy *p, FILE *f)
{
	SL_ASSERT(p && f);
	return write_json(p, NULL, f);
}

/* fsync the directory holding path, so the rename is durable (best effort). */
static void sync_parent(const char *path)
{
	const char *slash = strrchr(path, '/');
	char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
	if (!dir)
		return;
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0) {
		(void)fsync(fd);
		close(fd);
	}
	free(dir);
}

int sl_policy_save(const char *path, const sl_policy *p)
{
	return sl_policy_save_predicted(path, p, NULL);
}

int sl_policy_save_predicted(const char *path, const sl_policy *p, const char *predicted)
{
	SL_ASSERT(path && p);
	SL_TRY(sl_policy_validate(p, path));
	if (predicted) {
		json_t *v = json_loads(predicted, JSON_REJECT_DUPLICATES, NULL);
		bool obj = json_is_object(v);
		json_decref(v);
		if (!obj)
			return sl_err(SL_EINVAL, "%s: the predicted object to write is not a JSON object",
				      path);
	}
	size_t n = strlen(path);
	char *tmp = malloc(n + 5);
	if (!tmp)
		return sl_err(SL_ENOMEM, "%s: out of memory", path);
	memcpy(tmp, path, n);
	memcpy(tmp + n, ".tmp", 5);
	int rc = 0;
	/* A stale .tmp from an interrupted save: replace it, never write through it. */
	if (unlink(tmp) && errno != ENOENT) {
		rc = sl_err(SL_EIO, "%s: cannot remove the stale %s: %s", path, tmp, strerror(errno));
		goto out;
	}
	int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0) {
		rc = sl_err(SL_EIO, "%s: cannot create %s: %s", path, tmp, strerror(errno));
		goto out;
	}
	FILE *f = fdopen(fd, "w");
	if (!f) {
		rc = sl_err(SL_EIO, "%s: cannot write %s: %s", path, tmp, strerror(errno));
		close(fd);
		goto fail;
	}
	write_json(p, predicted, f);
	bool bad = fflush(f) != 0 || ferror(f);
	int err = errno;
	if (!bad && fsync(fd)) {
		bad = true;
		err = errno;
	}
	if (fclose(f) && !bad) {
		bad = true;
		err = errno;
	}
	if (bad) {
		rc = sl_err(SL_EIO, "%s: cannot write %s: %s", path, tmp, strerror(err));
		goto fail;
	}
	if (rename(tmp, path)) {
		rc = sl_err(SL_EIO, "%s: cannot rename %s over it: %s", path, tmp, strerror(errno));
		goto fail;
	}
	sync_parent(path);
	goto out;
fail:
	unlink(tmp);
out:
	free(tmp);
	return rc;
}

/* ---- strings from the command line ----------------------------------------- */

/* Parse s as the field's type; on failure record "<src>: '<s>' is not ..." */
static int parse_value(const pfield *f, const char *s, const char *src, double *out)
{
	char sb[48], bb[96];
	errno = 0;
	char *end = NULL;
	switch (f->type) {
	case F_INT: {
		long long v = strtoll(s, &end, 10);
		if (end == s || *end)
			return sl_err(SL_EINVAL, "%s: '%s' is not an integer", src, clean(sb, s));
		if (errno == ERANGE || v < (long long)f->min || v > (long long)f->max)
			return sl_err(SL_ERANGE, "%s: %s = %s, must be in %s", src, f->name, clean(sb, s),
				      fmt_bounds(bb, f));
		*out = (double)v;
		return 0;
	}
	case F_NUM: {
		double v = strtod(s, &end);
		if (end == s || *end)
			return sl_err(SL_EINVAL, "%s: '%s' is not a number", src, clean(sb, s));
		if (!isfinite(v))
			return sl_err(SL_ERANGE, "%s: %s = %s, must be in %s", src, f->name, clean(sb, s),
				      fmt_bounds(bb, f));
		*out = v;
		return 0;
	}
	case F_BOOL: {
		static const char *const yes[] = { "true", "1", "yes", "on" };
		static const char *const no[] = { "false", "0", "no", "off" };
		for (size_t i = 0; i < SL_ARRAY_LEN(yes); i++) {
			if (!strcasecmp(s, yes[i])) {
				*out = 1;
				return 0;
			}
			if (!strcasecmp(s, no[i])) {
				*out = 0;
				return 0;
			}
		}
		return sl_err(SL_EINVAL, "%s: '%s' is not true or false (also 1/0, yes/no, on/off)", src,
			      clean(sb, s));
	}
	}
	return sl_err(SL_EINVAL, "%s: bad field type", src);
}

int sl_policy_set(sl_policy *p, const char *field, const char *value)
{
	SL_ASSERT(p && field);
	char name[64], fb[48];
	const char *s = field;
	bool dashed = strchr(field, '-') != NULL;
	while (*s == '-')
		s++;
	size_t n = strlen(s);
	if (n == 0 || n >= sizeof name)
		return sl_err(SL_EINVAL, "%s: unknown policy field", clean(fb, field));
	for (size_t i = 0; i <= n; i++)
		name[i] = s[i] == '-' ? '_' : s[i];
	const pfield *f = find_field(name);
	if (!f) {
		const char *c = closest(name, false);
		char flag[72];
		if (c)
			return sl_err(SL_EINVAL, "%s: unknown policy field (did you mean '%s'?)",
				      clean(fb, field), dashed ? flag_name(flag, c) : c);
		return sl_err(SL_EINVAL, "%s: unknown policy field", clean(fb, field));
	}
	if (!value)
		return sl_err(SL_EINVAL, "%s: needs a value (%s)", clean(fb, field), type_name(f));
	double v = 0;
	SL_TRY(parse_value(f, value, clean(fb, field), &v));
	sl_policy tmp = *p;
	fset(&tmp, f, v);
	SL_TRY(check_field(&tmp, f, clean(fb, field)));
	*p = tmp;
	return 0;
}

int sl_policy_set_percent(sl_policy *p, const char *const v[6])
{
	SL_ASSERT(p && v);
	static const char *const names[6] = { "w_gpu_percent",     "w_cpu_percent",
					      "cache_gpu_percent", "cache_cpu_percent",
					      "act_gpu_percent",   "act_cpu_percent" };
	static const char *const ord[6] = { "1st", "2nd", "3rd", "4th", "5th", "6th" };
	sl_policy tmp = *p;
	for (int i = 0; i < 6; i++) {
		const pfield *f = find_field(names[i]);
		SL_ASSERT(f);
		if (!v[i])
			return sl_err(SL_EINVAL,
				      "--percent: needs 6 values (WG WC CG CC AG AC), the %s (%s) is missing",
				      ord[i], names[i]);
		char sb[48];
		char *end = NULL;
		double x = strtod(v[i], &end);
		if (end == v[i] || *end)
			return sl_err(SL_EINVAL, "--percent: the %s value (%s) '%s' is not a number",
				      ord[i], names[i], clean(sb, v[i]));
		if (!isfinite(x))
			return sl_err(SL_ERANGE, "--percent: %s = %s, must be in [0, 100]", names[i],
				      clean(sb, v[i]));
		fset(&tmp, f, x);
		SL_TRY(check_field(&tmp, f, "--percent"));
	}
	SL_TRY(check_relations(&tmp, "--percent", true));
	*p = tmp;
	return 0;
}

/* ---- printing and documentation -------------------------------------------- */

void sl_policy_print(const sl_policy *p, FILE *f)
{
	char vb[40], a[40], b[40], c[40];
	fputs("policy:\n", f);
	for (size_t i = 0; i < NFIELDS; i++)
		fprintf(f, "  %-18s %s\n", fields[i].name, fmt_value(vb, &fields[i], fget(p, &fields[i])));
	fprintf(f, "  %-18s %zu sequences (%d x %d)\n", "batch", sl_policy_batch(p), p->gpu_batch_size,
		p->num_gpu_batches);
	fprintf(f, "  %-18s weights %s%%, cache %s%%, activations %s%%\n", "on disk",
		fmt_double(a, 100 - p->w_gpu_percent - p->w_cpu_percent),
		fmt_double(b, 100 - p->cache_gpu_percent - p->cache_cpu_percent),
		fmt_double(c, 100 - p->act_gpu_percent - p->act_cpu_percent));
	if (p->hh_ratio > 0)
		fprintf(f, "  %-18s heavy %s + recent %s of the prompt length\n", "h2o",
			fmt_double(a, p->hh_ratio), fmt_double(b, sl_policy_recent_ratio(p)));
	else
		fprintf(f, "  %-18s off (dense KV cache)\n", "h2o");
}

static const char *arg_name(const pfield *f)
{
	switch (f->type) {
	case F_INT:
		return "N";
	case F_NUM:
		return "X";
	case F_BOOL:
		return "BOOL";
	}
	return "?";
}

void sl_policy_usage(FILE *f)
{
	char flag[72], opt[96], vb[40], bb[96];
	for (size_t i = 0; i < NFIELDS; i++) {
		const pfield *d = &fields[i];
		snprintf(opt, sizeof opt, "%s %s", flag_name(flag, d->name), arg_name(d));
		fprintf(f, "  %-28s default %s", opt, fmt_value(vb, d, d->def));
		if (d->type != F_BOOL)
			fprintf(f, ", %s", fmt_bounds(bb, d));
		fputc('\n', f);
	}
	fprintf(f, "  %-28s %s\n", "--percent WG WC CG CC AG AC",
		"placement shares as FlexGen's --percent (weights, cache, activations: gpu cpu)");
}

void sl_policy_doc_markdown(FILE *f)
{
	char vb[40], bb[96];
	sl_policy def;
	sl_policy_default(&def);
	fputs("# The policy file format\n\n"
	      "<!-- Generated by tools/policy_doc from the field table in policy/policy.c; do not edit. -->\n\n"
	      "A policy says how many sequences run at once and where each layer's weights, the KV\n"
	      "cache and the activations live: on the GPU, in (pinned) CPU memory, or on disk. It\n"
	      "holds FlexGen's `Policy` fields and H2O's cache budget. `sluice policy` writes one;\n"
	      "`sluice generate --policy FILE` reads one.\n\n"
	      "The file is one JSON object. Every field is optional and takes its default when\n"
	      "absent; `\"version\": 1` is optional too. A field not in this table is an error (the\n"
	      "message suggests the closest name), as is a value of the wrong type or outside its\n"
	      "bounds, or a field given twice.\n\n"
	      "| field | default | bounds | meaning |\n"
	      "|---|---|---|---|\n",
	      f);
	for (size_t i = 0; i < NFIELDS; i++) {
		const pfield *d = &fields[i];
		fprintf(f, "| `%s` | `%s` | ", d->name, fmt_value(vb, d, d->def));
		if (d->type == F_BOOL)
			fputs("`true` or `false`", f);
		else
			fprintf(f, "%s in %s", d->type == F_INT ? "integer" : "number", fmt_bounds(bb, d));
		fprintf(f, " | %s |\n", d->help);
	}
	fputs("\nRules across fields (checked on load, on save and before a run):\n\n"
	      "- For weights, cache and activations, `*_gpu_percent + *_cpu_percent` is at most\n"
	      "  100; disk holds the rest.\n"
	      "- Activations live on one device: `act_gpu_percent` is 100, or `act_cpu_percent` is\n"
	      "  100, or both are 0 (disk). FlexGen has the same restriction.\n"
	      "- `compress_cache` may split the cache over the tiers like an uncompressed one:\n"
	      "  sluice splits by whole sequences, each slot a self-contained range of compressed\n"
	      "  bytes (FlexGen, which splits each sequence's cache across devices, refuses it).\n"
	      "- `compress_weight` works with any weight placement: a layer's 4-bit matrices are\n"
	      "  tensors like the others (placed by their compressed bytes), and its disk store is\n"
	      "  one of its own. `sluice policy` chooses `compress_weight` and `compress_cache`\n"
	      "  only with `--allow-compress` (or pinned by `--fix`): both cost accuracy.\n"
	      "- `hh_ratio + recent_ratio` is at most 1, with a negative `recent_ratio` counting as\n"
	      "  `hh_ratio`. A positive `recent_ratio` with `hh_ratio` 0 keeps a recent window only.\n"
	      "- Blocks of `gpu_batch_size x num_gpu_batches` prompts, unless `--batch-size` says otherwise.\n\n"
	      "FlexGen's `--percent WG WC CG CC AG AC` maps in that order onto `w_gpu_percent`,\n"
	      "`w_cpu_percent`, `cache_gpu_percent`, `cache_cpu_percent`, `act_gpu_percent`,\n"
	      "`act_cpu_percent`.\n\n"
	      "The defaults, as `sluice` writes them (a save writes every field, to `FILE.tmp` first,\n"
	      "then renames it over `FILE`):\n\n"
	      "```json\n",
	      f);
	sl_policy_write_json(&def, f);
	fputs("```\n\n"
	      "H2O's setting for OPT-30B on a 16 GB T4 with 512-token prompts and 512 new tokens:\n"
	      "weights, cache and activations in CPU memory, 52 x 8 sequences, and a cache of 20% of\n"
	      "the prompt as heavy hitters plus 20% as the recent window:\n\n"
	      "```json\n",
	      f);
	sl_policy ex = def;
	ex.gpu_batch_size = 52;
	ex.num_gpu_batches = 8;
	ex.w_gpu_percent = 0;
	ex.w_cpu_percent = 100;
	ex.cache_gpu_percent = 0;
	ex.cache_cpu_percent = 100;
	ex.act_gpu_percent = 0;
	ex.act_cpu_percent = 100;
	ex.hh_ratio = 0.2;
	SL_ASSERT(sl_policy_validate(&ex, "example") == 0);
	sl_policy_write_json(&ex, f);
	fputs("```\n\n"
	      "## The prediction\n\n"
	      "A file `sluice policy` writes also holds a `\"predicted\"` object after the fields: what\n"
	      "the cost model predicts for this policy on the workload and machine it was chosen\n"
	      "for. Loading a policy accepts it (it must be an object) and ignores it; edit the\n"
	      "fields and the prediction no longer describes the file.\n\n"
	      "| member | meaning |\n"
	      "|---|---|\n"
	      "| `throughput_tok_s` | predicted tokens per second: sequences x `gen_len` over the whole run (FlexGen's metric) |\n"
	      "| `prefill_s`, `decode_s` | predicted seconds of the prefill and of every decode step together |\n"
	      "| `prefill_bottleneck`, `decode_bottleneck` | the resource busiest in each phase: `compute`, `cpu_attention`, `h2d`, `d2h`, `disk_read` or `disk_write` |\n"
	      "| `peak_bytes` | `{\"device\", \"host\", \"disk\"}`: the run plan's peak bytes in each tier (the device's with the backend's own workspace) |\n"
	      "| `prompt_len`, `gen_len` | the workload it was predicted for: tokens of the longest prompt, new tokens per sequence |\n"
	      "| `zstd_ratio` | null: the weights' disk share predicted as read from a plain store; a number (with `--zstd-store`): read from a zstd store (`sluice convert --zstd`) whose frames hold this share of the plain bytes, the profile's `zstd_ratio` |\n"
	      "| `profile` | `{\"source\", \"backend\", \"build\", \"load_average\"}`: the hardware profile's file (`\"measured\"`: measured for this run; `\"cached\"`: the cached one), the backend it measured, the sluice build that measured it, the machine's 1-minute load average as it was measured (null: unknown; at half the CPUs or more the machine was busy and its rates may be low) |\n\n"
	      "How the prediction is made (the cost model's formulas with their terms), how the\n"
	      "search chooses, and how close the predictions come to measured runs:\n"
	      "[cost-model.md](cost-model.md).\n",
	      f);
}
