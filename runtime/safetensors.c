/*
 * safetensors.c - mmap + header validation for safetensors files.
 *
 * Format: u64 little-endian header length N, N bytes of JSON mapping each
 * tensor name to {dtype, shape, data_offsets: [begin, end]} (offsets from
 * the end of the header), optional "__metadata__", then the data.
 */
#include "safetensors.h"
#include "sl_common.h"
#include "sl_hash.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct st_map {
	char *path;
	void *base;
	size_t size;
	sl_st_file info;
} st_map;

struct sl_st_set {
	st_map *maps;
	size_t nmaps;
	sl_st_tensor *t;
	size_t nt, cap;
};

static int dtype_parse(const char *s, enum sl_dtype *dt, size_t *esize)
{
	static const struct {
		const char *name;
		enum sl_dtype dt;
		size_t size;
	} tab[] = {
		{ "F32", SL_DT_F32, 4 },   { "F16", SL_DT_F16, 2 },   { "BF16", SL_DT_BF16, 2 },
		{ "F64", SL_DT_OTHER, 8 }, { "I64", SL_DT_OTHER, 8 }, { "I32", SL_DT_OTHER, 4 },
		{ "I16", SL_DT_OTHER, 2 }, { "I8", SL_DT_OTHER, 1 },  { "U8", SL_DT_OTHER, 1 },
		{ "BOOL", SL_DT_OTHER, 1 }, { "F8_E4M3", SL_DT_OTHER, 1 }, { "F8_E5M2", SL_DT_OTHER, 1 },
		{ "U16", SL_DT_OTHER, 2 }, { "U32", SL_DT_OTHER, 4 }, { "U64", SL_DT_OTHER, 8 },
	};
	for (size_t i = 0; i < SL_ARRAY_LEN(tab); i++)
		if (!strcmp(s, tab[i].name)) {
			*dt = tab[i].dt;
			*esize = tab[i].size;
			return 0;
		}
	return -1;
}

static int by_name(const void *a, const void *b)
{
	return strcmp(((const sl_st_tensor *)a)->name, ((const sl_st_tensor *)b)->name);
}

typedef struct span {
	size_t begin, end;
	const char *name;
} span;

static int by_begin(const void *a, const void *b)
{
	const span *x = a, *y = b;
	return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/*
 * A key given twice in the header (jansson would keep the last): a tensor
 * name at the top level, or a field of one tensor's entry.  jansson stops
 * right after the repeated key and quotes it in its message (near '"key"');
 * the depth of the object it belongs to is counted from the header's text.
 */
static int duplicate_key(const char *path, const char *hdr, const json_error_t *jerr)
{
	const char *q = strstr(jerr->text, "near '\"");
	size_t n = q ? strlen(q + 7) : 0;
	if (n < 2 || strcmp(q + 7 + n - 2, "\"'"))
		return sl_err(SL_EFORMAT, "%s: header: %s (at byte %d)", path, jerr->text,
			      jerr->position);
	int depth = 0;
	bool str = false;
	for (int i = 0; i < jerr->position; i++) {
		if (str) {
			if (hdr[i] == '\\')
				i++;
			else if (hdr[i] == '"')
				str = false;
		} else if (hdr[i] == '"') {
			str = true;
		} else if (hdr[i] == '{' || hdr[i] == '[') {
			depth++;
		} else if (hdr[i] == '}' || hdr[i] == ']') {
			depth--;
		}
	}
	if (depth == 1)
		return sl_err(SL_EFORMAT, "%s: tensor '%.*s' appears twice in the header", path,
			      (int)(n - 2), q + 7);
	return sl_err(SL_EFORMAT, "%s: header: field '%.*s' appears twice in one entry (at byte %d)",
		      path, (int)(n - 2), q + 7, jerr->position);
}

static int add_file(sl_st_set *s, const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return sl_err(SL_ENOTFOUND, "%s: cannot open: %s", path, strerror(errno));
	struct stat st;
	if (fstat(fd, &st) < 0) {
		close(fd);
		return sl_err(SL_EIO, "%s: cannot stat: %s", path, strerror(errno));
	}
	size_t size = (size_t)st.st_size;
	if (size < 8) {
		close(fd);
		return sl_err(SL_EFORMAT, "%s: truncated: %zu bytes, too short for a safetensors header",
			      path, size);
	}
	void *base = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (base == MAP_FAILED)
		return sl_err(SL_EIO, "%s: cannot map: %s", path, strerror(errno));
	st_map *maps = realloc(s->maps, (s->nmaps + 1) * sizeof *maps);
	if (!maps) {
		munmap(base, size);
		return sl_err(SL_ENOMEM, "%s: out of memory", path);
	}
	s->maps = maps;
	st_map *m = &s->maps[s->nmaps++];
	m->base = base;
	m->size = size;
	m->path = strdup(path);
	if (!m->path)
		return sl_err(SL_ENOMEM, "%s: out of memory", path);
	m->info = (sl_st_file){ .path = m->path, .size = size,
				.mtime_s = (int64_t)st.st_mtim.tv_sec, .mtime_ns = st.st_mtim.tv_nsec,
				.ctime_s = (int64_t)st.st_ctim.tv_sec, .ctime_ns = st.st_ctim.tv_nsec };

	const unsigned char *p = base;
	uint64_t hlen = 0;
	for (int i = 7; i >= 0; i--)
		hlen = (hlen << 8) | p[i];
	if (hlen > size - 8)
		return sl_err(SL_EFORMAT,
			      "%s: header length %llu runs past the end of the file (%zu bytes): truncated or not safetensors",
			      path, (unsigned long long)hlen, size);
	/* FNV-1a over the length and the header */
	m->info.header_hash = sl_fnv1a64(SL_FNV1A64_INIT, p, 8 + (size_t)hlen);
	json_error_t jerr;
	json_t *root = json_loadb((const char *)p + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
	if (!root && json_error_code(&jerr) == json_error_duplicate_key)
		return duplicate_key(path, (const char *)p + 8, &jerr);
	if (!root)
		return sl_err(SL_EFORMAT, "%s: header is not JSON (%s at byte %d)", path, jerr.text,
			      jerr.position);
	int rc = 0;
	span *spans = NULL;
	size_t nspan = 0;
	const size_t data_off = 8 + (size_t)hlen, data_size = size - data_off;
	if (!json_is_object(root)) {
		rc = sl_err(SL_EFORMAT, "%s: header is not a JSON object", path);
		goto done;
	}
	spans = calloc(json_object_size(root) + 1, sizeof *spans);
	if (!spans) {
		rc = sl_err(SL_ENOMEM, "%s: out of memory", path);
		goto done;
	}
	const char *key;
	json_t *val;
	json_object_foreach(root, key, val) {
		if (!strcmp(key, "__metadata__"))
			continue;
		if (s->nt == s->cap) {
			size_t nc = s->cap ? 2 * s->cap : 64;
			sl_st_tensor *nt = realloc(s->t, nc * sizeof *nt);
			if (!nt) {
				rc = sl_err(SL_ENOMEM, "%s: out of memory", path);
				goto done;
			}
			s->t = nt;
			s->cap = nc;
		}
		sl_st_tensor *t = &s->t[s->nt];
		memset(t, 0, sizeof *t);
		json_t *dt = json_object_get(val, "dtype");
		json_t *shape = json_object_get(val, "shape");
		json_t *offs = json_object_get(val, "data_offsets");
		size_t esize = 0;
		if (!json_is_object(val) || !json_is_string(dt) || !json_is_array(shape) ||
		    !json_is_array(offs) || json_array_size(offs) != 2) {
			rc = sl_err(SL_EFORMAT, "%s: tensor '%s': entry needs dtype, shape and data_offsets",
				    path, key);
			goto done;
		}
		if (dtype_parse(json_string_value(dt), &t->dtype, &esize) < 0) {
			rc = sl_err(SL_EFORMAT, "%s: tensor '%s': unknown dtype '%s'", path, key,
				    json_string_value(dt));
			goto done;
		}
		snprintf(t->dtype_name, sizeof t->dtype_name, "%s", json_string_value(dt));
		if (json_array_size(shape) > 8) {
			rc = sl_err(SL_EFORMAT, "%s: tensor '%s': more than 8 dimensions", path, key);
			goto done;
		}
		t->ndim = (int)json_array_size(shape);
		size_t count = 1;
		for (int d = 0; d < t->ndim; d++) {
			json_t *e = json_array_get(shape, (size_t)d);
			if (!json_is_integer(e) || json_integer_value(e) < 0 ||
			    json_integer_value(e) > (json_int_t)1 << 40) {
				rc = sl_err(SL_EFORMAT, "%s: tensor '%s': bad shape", path, key);
				goto done;
			}
			t->shape[d] = json_integer_value(e);
			if (t->shape[d] && count > SIZE_MAX / (size_t)t->shape[d] / esize) {
				rc = sl_err(SL_EFORMAT, "%s: tensor '%s': shape overflows", path, key);
				goto done;
			}
			count *= (size_t)t->shape[d];
		}
		json_t *b0 = json_array_get(offs, 0), *b1 = json_array_get(offs, 1);
		if (!json_is_integer(b0) || !json_is_integer(b1) || json_integer_value(b0) < 0 ||
		    json_integer_value(b1) < json_integer_value(b0)) {
			rc = sl_err(SL_EFORMAT, "%s: tensor '%s': bad data_offsets", path, key);
			goto done;
		}
		size_t begin = (size_t)json_integer_value(b0), end = (size_t)json_integer_value(b1);
		if (end > data_size) {
			rc = sl_err(SL_EFORMAT,
				    "%s: tensor '%s': data_offsets [%zu, %zu) run past the end of the data (%zu bytes): file truncated?",
				    path, key, begin, end, data_size);
			goto done;
		}
		if (end - begin != count * esize) {
			rc = sl_err(SL_EFORMAT, "%s: tensor '%s': %zu bytes of data for shape of %zu %s elements",
				    path, key, end - begin, count, t->dtype_name);
			goto done;
		}
		t->name = strdup(key);
		if (!t->name) {
			rc = sl_err(SL_ENOMEM, "%s: out of memory", path);
			goto done;
		}
		t->data = p + data_off + begin;
		t->nbytes = end - begin;
		t->file = m->path;
		spans[nspan++] = (span){ begin, end, t->name };
		s->nt++;
	}
	qsort(spans, nspan, sizeof *spans, by_begin);
	for (size_t i = 1; i < nspan; i++)
		if (spans[i].begin < spans[i - 1].end) {
			rc = sl_err(SL_EFORMAT, "%s: tensors '%s' and '%s' overlap", path,
				    spans[i - 1].name, spans[i].name);
			goto done;
		}
done:
	free(spans);
	json_decref(root);
	return rc;
}

static int finish(sl_st_set *s)
{
	qsort(s->t, s->nt, sizeof *s->t, by_name);
	for (size_t i = 1; i < s->nt; i++)
		if (!strcmp(s->t[i].name, s->t[i - 1].name))
			return sl_err(SL_EFORMAT, "%s: tensor '%s' appears twice (also in %s)",
				      s->t[i].file, s->t[i].name, s->t[i - 1].file);
	return 0;
}

int sl_st_open_file(const char *path, sl_st_set **out)
{
	*out = NULL;
	sl_st_set *s = calloc(1, sizeof *s);
	if (!s)
		return sl_err(SL_ENOMEM, "out of memory");
	int rc = add_file(s, path);
	if (!rc)
		rc = finish(s);
	if (rc) {
		sl_st_close(s);
		return rc;
	}
	*out = s;
	return 0;
}

int sl_st_open_dir(const char *dir, sl_st_set **out)
{
	*out = NULL;
	char path[PATH_MAX], idx[PATH_MAX];
	snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
	snprintf(path, sizeof path, "%s/model.safetensors", dir);
	if (access(idx, F_OK) != 0)
		return access(path, F_OK) == 0
			       ? sl_st_open_file(path, out)
			       : sl_err(SL_ENOTFOUND, "%s: no model.safetensors or model.safetensors.index.json",
					dir);
	json_error_t jerr;
	json_t *root = json_load_file(idx, 0, &jerr);
	if (!root)
		return sl_err(SL_EFORMAT, "%s:%d: not valid JSON: %s", idx, jerr.line, jerr.text);
	json_t *wm = json_object_get(root, "weight_map");
	int rc = 0;
	sl_st_set *s = calloc(1, sizeof *s);
	if (!s) {
		json_decref(root);
		return sl_err(SL_ENOMEM, "out of memory");
	}
	if (!json_is_object(wm)) {
		rc = sl_err(SL_EFORMAT, "%s: no weight_map object", idx);
		goto done;
	}
	const char *key;
	json_t *val;
	json_object_foreach(wm, key, val) {
		const char *file = json_string_value(val);
		if (!file || !*file || strchr(file, '/')) {
			rc = sl_err(SL_EFORMAT, "%s: weight_map entry for '%s' is not a file name", idx, key);
			goto done;
		}
		snprintf(path, sizeof path, "%s/%s", dir, file);
		bool seen = false;
		for (size_t i = 0; i < s->nmaps; i++)
			if (!strcmp(s->maps[i].path, path))
				seen = true;
		if (!seen && (rc = add_file(s, path)) < 0)
			goto done;
	}
	if ((rc = finish(s)) < 0)
		goto done;
	json_object_foreach(wm, key, val) {
		const sl_st_tensor *t = sl_st_find(s, key);
		if (!t) {
			rc = sl_err(SL_EFORMAT, "%s: tensor '%s' is listed in the index but missing from %s",
				    idx, key, json_string_value(val));
			goto done;
		}
	}
done:
	json_decref(root);
	if (rc) {
		sl_st_close(s);
		return rc;
	}
	*out = s;
	return 0;
}

void sl_st_release(const sl_st_tensor *t, size_t off, size_t len)
{
	if (off >= t->nbytes)
		return;
	len = SL_MIN(len, t->nbytes - off);
	const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), p = (uintptr_t)t->data + off;
	const uintptr_t a = (p + pg - 1) & ~(pg - 1), e = (p + len) & ~(pg - 1);
	if (e > a)
		(void)madvise((void *)a, e - a, MADV_DONTNEED); /* a hint: a failure changes nothing */
}

void sl_st_close(sl_st_set *s)
{
	if (!s)
		return;
	for (size_t i = 0; i < s->nt; i++)
		free((char *)s->t[i].name);
	for (size_t i = 0; i < s->nmaps; i++) {
		munmap(s->maps[i].base, s->maps[i].size);
		free(s->maps[i].path);
	}
	free(s->t);
	free(s->maps);
	free(s);
}

const sl_st_tensor *sl_st_find(const sl_st_set *s, const char *name)
{
	sl_st_tensor key = { .name = name };
	return bsearch(&key, s->t, s->nt, sizeof key, by_name);
}

size_t sl_st_count(const sl_st_set *s)
{
	return s->nt;
}

const sl_st_tensor *sl_st_at(const sl_st_set *s, size_t i)
{
	return i < s->nt ? &s->t[i] : NULL;
}

size_t sl_st_nfiles(const sl_st_set *s)
{
	return s->nmaps;
}

const sl_st_file *sl_st_file_at(const sl_st_set *s, size_t i)
{
	return i < s->nmaps ? &s->maps[i].info : NULL;
}
