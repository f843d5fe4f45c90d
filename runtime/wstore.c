/*
 * wstore.c - naming, keying and checking the weights' disk stores.
 */
#include "wstore.h"
#include "sl_common.h"
#include "sl_hash.h"
#include "model.h"
#include "weights.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define KEY_FORMAT "sluice weights"
#define KEY_LAYOUT 3 /* the data area's layout (weights.c: place_layer; 3: matrices split by rows) */

static const char *base_name(const char *path)
{
	const char *s = strrchr(path, '/');
	return s ? s + 1 : path;
}

static int by_path(const void *a, const void *b)
{
	return strcmp((*(const sl_st_file *const *)a)->path, (*(const sl_st_file *const *)b)->path);
}

/* One digest of every weight file's identity, in name order. */
static int files_digest(const sl_st_set *st, uint64_t *digest)
{
	const size_t n = sl_st_nfiles(st);
	const sl_st_file **f = malloc((n ? n : 1) * sizeof *f);
	if (!f)
		return sl_err(SL_ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++)
		f[i] = sl_st_file_at(st, i);
	qsort(f, n, sizeof *f, by_path);
	uint64_t h = SL_FNV1A64_INIT;
	for (size_t i = 0; i < n; i++) {
		char rec[PATH_MAX + 160];
		int k = snprintf(rec, sizeof rec, "%s\n%llu\n%lld.%09lld\n%lld.%09lld\n%016llx\n",
				 base_name(f[i]->path), (unsigned long long)f[i]->size,
				 (long long)f[i]->mtime_s, (long long)f[i]->mtime_ns, (long long)f[i]->ctime_s,
				 (long long)f[i]->ctime_ns, (unsigned long long)f[i]->header_hash);
		h = sl_fnv1a64(h, rec, (size_t)SL_MIN(k, (int)sizeof rec - 1));
	}
	free(f);
	*digest = h;
	return 0;
}

/* Letters, digits and ._+- kept; anything else becomes '_'. */
static void clean_name(const char *in, char *out, size_t n)
{
	size_t j = 0;
	for (; *in && j + 1 < n && j < 64; in++) {
		char ch = *in;
		bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
			  ch == '.' || ch == '_' || ch == '+' || ch == '-';
		out[j++] = ok ? ch : '_';
	}
	out[j] = 0;
	if (!j || out[0] == '.')
		snprintf(out, n, "model");
}

int sl_wstore_ident(const char *dir, const sl_st_set *st, const sl_model_config *c, double gpu_percent,
		    double cpu_percent, bool q4, int zstd, uint32_t window, char *name, size_t name_len, char *key,
		    size_t key_len)
{
	char real[PATH_MAX], model[72], src_tag[24];
	json_t *src;
	if (dir) {
		if (!realpath(dir, real))
			return sl_err(SL_ENOTFOUND, "%s: %s", dir, strerror(errno));
		uint64_t digest = 0;
		SL_TRY(files_digest(st, &digest));
		char hex[24];
		snprintf(hex, sizeof hex, "%016llx", (unsigned long long)digest);
		src = json_pack("{s:s, s:I, s:s}", "checkpoint", real, "files", (json_int_t)sl_st_nfiles(st),
				"identity", hex);
		clean_name(base_name(real), model, sizeof model);
		snprintf(src_tag, sizeof src_tag, "%08llx",
			 (unsigned long long)(sl_fnv1a64(SL_FNV1A64_INIT, real, strlen(real)) & 0xffffffffu));
	} else {
		src = json_pack("{s:s, s:i}", "dummy", c->name, "seed", 0);
		clean_name(c->name, model, sizeof model);
		snprintf(src_tag, sizeof src_tag, "dummy");
	}
	json_t *k = src ? json_pack("{s:s, s:i, s:s, s:{s:f, s:f}, s:{s:i, s:i, s:i, s:i, s:i, s:i, s:i}, s:o}",
				    "format", KEY_FORMAT, "layout", KEY_LAYOUT, "dtype", q4 ? "q4" : "f16", "placement",
				    "gpu_percent", gpu_percent, "cpu_percent", cpu_percent, "model", "layers",
				    c->n_layer, "heads", c->n_head, "hidden", c->hidden, "ffn", c->ffn, "vocab",
				    c->vocab, "embed", c->embed_dim, "positions", c->max_pos, "source", src)
			: NULL;
	/* the LLaMA family's tensors differ by more than these sizes: its
	 * type (Qwen2's biases), KV heads, head width and head; OPT's key stays
	 * as it was, so its stores stay valid */
	if (k && zstd > 0 && json_object_set_new(k, "zstd", json_pack("{s:i, s:I}", "level", zstd, "window",
									 (json_int_t)window))) {
		json_decref(k);
		k = NULL;
	}
	json_t *mo = k && c->family == SL_FAMILY_LLAMA ? json_object_get(k, "model") : NULL;
	if (mo && (json_object_set_new(mo, "type", json_string(c->llama.model_type)) ||
		   json_object_set_new(mo, "kv_heads", json_integer(c->n_kv_head)) ||
		   json_object_set_new(mo, "head_dim", json_integer(c->head_dim)) ||
		   json_object_set_new(mo, "qkv_bias", json_boolean(c->llama.qkv_bias)) ||
		   json_object_set_new(mo, "tied", json_boolean(c->llama.tied)))) {
		json_decref(k);
		k = NULL;
	}
	char *text = k ? json_dumps(k, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENSURE_ASCII) : NULL;
	json_decref(k);
	if (!text)
		return sl_err(SL_ENOMEM, "out of memory for the weight store's key");
	size_t tl = strlen(text);
	if (tl > SL_DISK_MAX_KEY || tl >= key_len) {
		free(text);
		return sl_err(SL_ERANGE, "%s: the checkpoint's path is too long for the weight store's key (%zu bytes, "
			      "at most %u)", dir ? dir : c->name, tl, SL_DISK_MAX_KEY);
	}
	memcpy(key, text, tl + 1);
	free(text);
	snprintf(name, name_len, "%s.%s.w%g-%g%s%s" SL_WSTORE_SUFFIX, model, src_tag, gpu_percent, cpu_percent,
		 q4 ? ".q4" : "", zstd > 0 ? ".zst" : "");
	return 0;
}

/* Why a store's key old is not the key now: one phrase. */
static void stale_reason(const char *old, const char *now, char *why, size_t n)
{
	json_t *a = json_loads(old, 0, NULL), *b = json_loads(now, 0, NULL);
	const char *fa = json_string_value(json_object_get(a, "format"));
	json_t *sa = json_object_get(a, "source"), *sb = json_object_get(b, "source");
	const char *ca = json_string_value(json_object_get(sa, "checkpoint"));
	const char *cb = json_string_value(json_object_get(sb, "checkpoint"));
	const char *da = json_string_value(json_object_get(a, "dtype"));
	const char *db = json_string_value(json_object_get(b, "dtype"));
	if (!fa || strcmp(fa, KEY_FORMAT))
		snprintf(why, n, "written by an earlier version of sluice");
	else if (json_integer_value(json_object_get(a, "layout")) != KEY_LAYOUT)
		snprintf(why, n, "written by another version of sluice (layout %lld, this one writes %d)",
			 (long long)json_integer_value(json_object_get(a, "layout")), KEY_LAYOUT);
	else if (da && db && strcmp(da, db))
		snprintf(why, n, "it holds %s weights, this run needs %s", da, db);
	else if ((json_object_get(a, "zstd") || json_object_get(b, "zstd")) &&
		 !json_equal(json_object_get(a, "zstd"), json_object_get(b, "zstd")))
		snprintf(why, n, "its zstd frames differ from what this sluice writes");
	else if (ca && cb && !strcmp(ca, cb) && !json_equal(sa, sb))
		snprintf(why, n, "the checkpoint's weight files changed since it was written");
	else if (!json_equal(json_object_get(a, "model"), json_object_get(b, "model")))
		snprintf(why, n, "the model's shapes changed since it was written");
	else
		snprintf(why, n, "it holds other weights or another placement");
	json_decref(a);
	json_decref(b);
}

int sl_wstore_open(const sl_disk_params *dp, sl_disk_store **out, bool *fresh)
{
	char path[PATH_MAX + 256];
	snprintf(path, sizeof path, "%s/%s", dp->dir, dp->file_name);
	sl_disk_info *info = malloc(sizeof *info);
	if (!info)
		return sl_err(SL_ENOMEM, "out of memory");
	const uint64_t cap = (dp->data_bytes + SL_DISK_ALIGN - 1) / SL_DISK_ALIGN * SL_DISK_ALIGN;
	int rc = sl_disk_peek(path, info);
	if (rc == 0 && (strcmp(info->key, dp->key) || info->data_bytes != cap)) {
		char why[256];
		stale_reason(info->key, dp->key, why, sizeof why);
		if (unlink(path) != 0) {
			rc = sl_err(SL_EIO, "%s is out of date (%s) and cannot be removed (%s); remove it or use "
				    "another --offload-dir", path, why, strerror(errno));
			free(info);
			return rc;
		}
		fprintf(stderr, "sluice: %s is out of date (%s); writing it again\n", path, why);
	}
	free(info);
	sl_err_clear();
	return sl_disk_open(dp, out, fresh); /* refuses what is not a sluice store */
}

const char *sl_wstore_state_name(enum sl_wstore_state s)
{
	switch (s) {
	case SL_WSTORE_CURRENT: return "current";
	case SL_WSTORE_STALE: return "stale";
	case SL_WSTORE_INCOMPLETE: return "incomplete";
	default: return "foreign";
	}
}

/* The key this sluice would write now for the store described by key k
 * (its source as it is now); an error when the source cannot be read. */
static int key_now(json_t *k, char *key, size_t key_len, uint64_t *data_bytes)
{
	json_t *src = json_object_get(k, "source"), *pl = json_object_get(k, "placement");
	const char *ckpt = json_string_value(json_object_get(src, "checkpoint"));
	const char *dummy = json_string_value(json_object_get(src, "dummy"));
	const double gpu = json_number_value(json_object_get(pl, "gpu_percent"));
	const double cpu = json_number_value(json_object_get(pl, "cpu_percent"));
	const char *dt = json_string_value(json_object_get(k, "dtype"));
	const bool q4 = dt && !strcmp(dt, "q4");
	json_t *z = json_object_get(k, "zstd");
	const int zl = (int)json_integer_value(json_object_get(z, "level"));
	const uint32_t zw = (uint32_t)json_integer_value(json_object_get(z, "window"));
	sl_model_config c;
	sl_st_set *st = NULL;
	char name[SL_WSTORE_NAME_MAX];
	int rc;
	if (ckpt) {
		char cfg[PATH_MAX + 16];
		snprintf(cfg, sizeof cfg, "%s/config.json", ckpt);
		if ((rc = sl_model_config_load(cfg, &c)) < 0 || (rc = sl_st_open_dir(ckpt, &st)) < 0)
			return rc;
	} else if (dummy) {
		SL_TRY(sl_model_config_named(dummy, &c));
	} else {
		return sl_err(SL_EFORMAT, "no source in the key");
	}
	rc = sl_wstore_ident(ckpt, st, &c, gpu, cpu, q4, zl, zw, name, sizeof name, key, key_len);
	sl_st_close(st);
	*data_bytes = sl_weights_store_bytes(&c, gpu, cpu, q4, zl > 0 ? zw : 0);
	return rc;
}

static void check_entry(const char *dir, sl_wstore_entry *e)
{
	char path[PATH_MAX + 256];
	snprintf(path, sizeof path, "%s/%s", dir, e->name);
	sl_disk_info *info = malloc(sizeof *info);
	char *now = malloc(SL_DISK_MAX_KEY + 1);
	json_t *k = NULL;
	e->state = SL_WSTORE_FOREIGN;
	if (!info || !now) {
		snprintf(e->why, sizeof e->why, "out of memory");
		goto out;
	}
	int prc = sl_disk_peek(path, info);
	e->in_use = info->in_use;
	e->bytes = info->file_bytes;
	e->ours = info->is_store;
	if (prc < 0) {
		snprintf(e->why, sizeof e->why, "%s", sl_errmsg());
		goto out;
	}
	k = json_loads(info->key, 0, NULL);
	const char *fmt = json_string_value(json_object_get(k, "format"));
	if (!fmt || strcmp(fmt, KEY_FORMAT) || json_integer_value(json_object_get(k, "layout")) != KEY_LAYOUT) {
		snprintf(e->why, sizeof e->why, "written by %s version of sluice", fmt ? "another" : "an earlier");
		goto out;
	}
	json_t *src = json_object_get(k, "source"), *pl = json_object_get(k, "placement");
	const char *ckpt = json_string_value(json_object_get(src, "checkpoint"));
	const char *dummy = json_string_value(json_object_get(src, "dummy"));
	const double gpu = json_number_value(json_object_get(pl, "gpu_percent"));
	const double cpu = json_number_value(json_object_get(pl, "cpu_percent"));
	const char *dt = json_string_value(json_object_get(k, "dtype"));
	const json_int_t zl = json_integer_value(json_object_get(json_object_get(k, "zstd"), "level"));
	char zs[48] = "";
	if (zl > 0)
		snprintf(zs, sizeof zs, ", zstd level %lld", (long long)zl);
	snprintf(e->what, sizeof e->what, "%s %s, weights %g%% device, %g%% host, %g%% disk%s%s",
		 ckpt ? "checkpoint" : "dummy", ckpt ? ckpt : dummy ? dummy : "?", gpu, cpu, 100 - gpu - cpu,
		 dt && !strcmp(dt, "q4") ? ", 4-bit" : "", zs);
	if (!info->complete) {
		e->state = SL_WSTORE_INCOMPLETE;
		snprintf(e->why, sizeof e->why, "%s", e->in_use ? "being written now" : "its writing was interrupted");
		goto out;
	}
	uint64_t bytes = 0;
	if (key_now(k, now, SL_DISK_MAX_KEY + 1, &bytes) < 0) {
		e->state = SL_WSTORE_STALE;
		snprintf(e->why, sizeof e->why, "its %s cannot be read now: %s",
			 ckpt ? "checkpoint" : "model", sl_errmsg());
	} else if (strcmp(now, info->key) || bytes != info->data_bytes) {
		e->state = SL_WSTORE_STALE;
		stale_reason(info->key, now, e->why, sizeof e->why);
	} else {
		e->state = SL_WSTORE_CURRENT;
	}
out:
	json_decref(k);
	free(now);
	free(info);
}

static int by_name(const void *a, const void *b)
{
	return strcmp(((const sl_wstore_entry *)a)->name, ((const sl_wstore_entry *)b)->name);
}

int sl_wstore_list(const char *dir, sl_wstore_entry **out, int *n)
{
	*out = NULL;
	*n = 0;
	DIR *d = opendir(dir);
	if (!d && (errno == ENOENT || errno == ENOTDIR))
		return sl_err(SL_ENOTFOUND, "offload directory %s does not exist or is not a directory", dir);
	if (!d)
		return sl_err(SL_EIO, "offload directory %s: %s", dir, strerror(errno));
	sl_wstore_entry *v = NULL;
	int cnt = 0, cap = 0, rc = 0;
	const size_t sl = strlen(SL_WSTORE_SUFFIX);
	for (struct dirent *de; (de = readdir(d));) {
		size_t nl = strlen(de->d_name);
		if (nl <= sl || strcmp(de->d_name + nl - sl, SL_WSTORE_SUFFIX) || nl >= sizeof v->name)
			continue;
		if (cnt == cap) {
			cap = cap ? 2 * cap : 16;
			sl_wstore_entry *nv = realloc(v, (size_t)cap * sizeof *v);
			if (!nv) {
				rc = sl_err(SL_ENOMEM, "out of memory");
				break;
			}
			v = nv;
		}
		memset(&v[cnt], 0, sizeof v[cnt]);
		memcpy(v[cnt].name, de->d_name, nl + 1);
		cnt++;
	}
	closedir(d);
	if (rc < 0) {
		free(v);
		return rc;
	}
	if (cnt)
		qsort(v, (size_t)cnt, sizeof *v, by_name);
	for (int i = 0; i < cnt; i++)
		check_entry(dir, &v[i]);
	sl_err_clear();
	*out = v;
	*n = cnt;
	return 0;
}

int sl_wstore_find_zstd(const char *offload_dir, const char *dir, const sl_st_set *st, const sl_model_config *c,
			double gpu_percent, double cpu_percent, bool q4, bool quiet, char *name, size_t name_len,
			char *key, size_t key_len, sl_wstore_zstd *z)
{
	*z = (sl_wstore_zstd){ 0 };
	/* the name does not depend on the level or the window */
	SL_TRY(sl_wstore_ident(dir, st, c, gpu_percent, cpu_percent, q4, 1, 4096, name, name_len, key, key_len));
	char path[PATH_MAX + 256];
	snprintf(path, sizeof path, "%s/%s", offload_dir, name);
	sl_disk_info *info = malloc(sizeof *info);
	if (!info)
		return sl_err(SL_ENOMEM, "out of memory");
	int rc = sl_disk_peek(path, info), found = 0;
	if (rc == SL_ENOTFOUND) {
		rc = 0;
	} else if (rc == 0 && info->complete) {
		json_t *k = json_loads(info->key, 0, NULL), *jz = json_object_get(k, "zstd");
		const int zl = (int)json_integer_value(json_object_get(jz, "level"));
		const uint32_t zw = (uint32_t)json_integer_value(json_object_get(jz, "window"));
		json_decref(k);
		if (zl > 0 && zw > 0 && zw % 4096 == 0 &&
		    (rc = sl_wstore_ident(dir, st, c, gpu_percent, cpu_percent, q4, zl, zw, name, name_len, key,
					  key_len)) == 0) {
			const uint64_t bytes = sl_weights_store_bytes(c, gpu_percent, cpu_percent, q4, zw);
			if (!strcmp(key, info->key) && bytes == info->data_bytes) {
				double ratio = 0;
				rc = sl_weights_zstd_store_ratio(path, c, gpu_percent, cpu_percent, q4, zw, &ratio);
				if (rc == 0)
					*z = (sl_wstore_zstd){ .level = zl, .window = zw, .ratio = ratio,
							       .data_bytes = bytes };
				found = rc == 0;
			} else if (!quiet) {
				char why[256];
				stale_reason(info->key, key, why, sizeof why);
				fprintf(stderr, "sluice: %s is out of date (%s); not reading it (sluice convert "
					"--zstd writes it again)\n", path, why);
			}
		}
	} else {
		rc = 0; /* incomplete, or not a store: the plain store is used */
	}
	free(info);
	if (rc < 0)
		return rc;
	sl_err_clear();
	return found;
}

int sl_wstore_convert(sl_backend *be, const char *dir, const char *dummy, double gpu_percent,
		      double cpu_percent, bool q4, int zstd, const char *offload_dir, char *path, size_t path_len,
		      bool *written)
{
	*written = false;
	sl_model_config c;
	sl_st_set *st = NULL;
	sl_disk_store *ds = NULL;
	int rc;
	if (dir) {
		char cfg[PATH_MAX + 16];
		snprintf(cfg, sizeof cfg, "%s/config.json", dir);
		if ((rc = sl_model_config_load(cfg, &c)) < 0 || (rc = sl_st_open_dir(dir, &st)) < 0)
			goto out;
	} else if ((rc = sl_model_config_named(dummy, &c)) < 0) {
		return rc;
	}
	const uint32_t window = zstd > 0 ? sl_weights_zstd_window(&c, gpu_percent, cpu_percent, q4) : 0;
	const uint64_t bytes = sl_weights_store_bytes(&c, gpu_percent, cpu_percent, q4, window);
	if (bytes == 0) {
		rc = sl_err(SL_EINVAL, "nothing to convert: the placement (weights %g%% device, %g%% host) puts no "
			    "tensor on disk", gpu_percent, cpu_percent);
		goto out;
	}
	char name[SL_WSTORE_NAME_MAX], *key = malloc(SL_DISK_MAX_KEY + 1);
	if (!key) {
		rc = sl_err(SL_ENOMEM, "out of memory");
		goto out;
	}
	rc = sl_wstore_ident(dir, st, &c, gpu_percent, cpu_percent, q4, zstd, window, name, sizeof name, key,
			     SL_DISK_MAX_KEY + 1);
	if (rc == 0) {
		snprintf(path, path_len, "%s/%s", offload_dir, name);
		sl_disk_params dp = { .dir = offload_dir, .file_name = name, .key = key, .data_bytes = bytes };
		sl_model_io_node(be, &dp);
		bool fresh = true;
		rc = sl_wstore_open(&dp, &ds, &fresh);
		if (rc == 0 && fresh) {
			sl_weight_place place = { .gpu_percent = gpu_percent, .cpu_percent = cpu_percent, .disk = ds,
						  .q4 = q4, .zstd = zstd };
			rc = sl_weights_write_store(be, &c, st, dir, 0, &place);
			*written = rc == 0;
		}
	}
	free(key);
out:
	sl_disk_close(ds);
	sl_st_close(st);
	return rc;
}
