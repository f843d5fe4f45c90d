/*
 * jsonl.c - reading prompts and writing results as JSON Lines (jansson).
 */
#include "jsonl.h"
#include "sl_common.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>

void sl_prompts_free(sl_prompts *ps)
{
	if (!ps || !ps->p)
		return;
	for (int i = 0; i < ps->n; i++) {
		free(ps->p[i].id_json);
		free(ps->p[i].ids);
	}
	free(ps->p);
	ps->p = NULL;
	ps->n = 0;
}

static int parse_line(const char *path, int line, const char *text, size_t len, int vocab,
		      sl_prompt *p)
{
	json_error_t jerr;
	json_t *root = json_loadb(text, len, 0, &jerr);
	if (!root)
		return sl_err(SL_EFORMAT, "%s:%d: not valid JSON: %s", path, line, jerr.text);
	int rc = 0;
	memset(p, 0, sizeof *p);
	p->line = line;
	if (!json_is_object(root)) {
		rc = sl_err(SL_EFORMAT, "%s:%d: a line must be a JSON object", path, line);
		goto done;
	}
	json_t *ids = json_object_get(root, "input_ids");
	if (!ids) {
		rc = sl_err(SL_EFORMAT, "%s:%d: missing \"input_ids\"", path, line);
		goto done;
	}
	if (!json_is_array(ids) || json_array_size(ids) == 0) {
		rc = sl_err(SL_EFORMAT, "%s:%d: \"input_ids\" must be a non-empty array of token ids", path,
			    line);
		goto done;
	}
	size_t n = json_array_size(ids);
	if (n > INT_MAX / 2) {
		rc = sl_err(SL_EFORMAT, "%s:%d: prompt too long", path, line);
		goto done;
	}
	p->ids = malloc(n * sizeof *p->ids);
	if (!p->ids) {
		rc = sl_err(SL_ENOMEM, "out of memory");
		goto done;
	}
	for (size_t i = 0; i < n; i++) {
		json_t *v = json_array_get(ids, i);
		if (!json_is_integer(v)) {
			rc = sl_err(SL_EFORMAT, "%s:%d: input_ids[%zu] is not an integer", path, line, i);
			goto done;
		}
		json_int_t id = json_integer_value(v);
		if (id < 0 || id >= vocab) {
			rc = sl_err(SL_ERANGE, "%s:%d: input_ids[%zu] = %lld is outside the vocabulary (0..%d)",
				    path, line, i, (long long)id, vocab - 1);
			goto done;
		}
		p->ids[i] = (int32_t)id;
	}
	p->n = (int)n;
	json_t *mn = json_object_get(root, "max_new_tokens");
	if (mn) {
		if (!json_is_integer(mn) || json_integer_value(mn) <= 0 ||
		    json_integer_value(mn) > 1 << 20) {
			rc = sl_err(SL_EFORMAT, "%s:%d: \"max_new_tokens\" must be a positive integer", path,
				    line);
			goto done;
		}
		p->max_new = (int)json_integer_value(mn);
	}
	json_t *id = json_object_get(root, "id");
	if (id)
		p->id_json = json_dumps(id, JSON_COMPACT | JSON_ENCODE_ANY);
	else if (asprintf(&p->id_json, "%d", line) < 0)
		p->id_json = NULL;
	if (!p->id_json)
		rc = sl_err(SL_ENOMEM, "out of memory");
done:
	json_decref(root);
	if (rc) {
		free(p->ids);
		free(p->id_json);
		memset(p, 0, sizeof *p);
	}
	return rc;
}

int sl_prompts_read(const char *path, int vocab, sl_prompts *out)
{
	memset(out, 0, sizeof *out);
	FILE *f = fopen(path, "rb");
	if (!f)
		return sl_err(errno == ENOENT ? SL_ENOTFOUND : SL_EIO, "%s: cannot open: %s", path,
			      strerror(errno));
	char *buf = NULL;
	size_t bcap = 0;
	ssize_t len;
	int line = 0, cap = 0, rc = 0;
	while ((len = getline(&buf, &bcap, f)) >= 0) {
		line++;
		size_t l = (size_t)len;
		while (l && (buf[l - 1] == '\n' || buf[l - 1] == '\r'))
			l--;
		size_t sp = 0;
		while (sp < l && (buf[sp] == ' ' || buf[sp] == '\t'))
			sp++;
		if (sp == l)
			continue; /* blank lines are allowed */
		if (out->n == cap) {
			cap = cap ? 2 * cap : 64;
			sl_prompt *np = realloc(out->p, (size_t)cap * sizeof *np);
			if (!np) {
				rc = sl_err(SL_ENOMEM, "out of memory");
				break;
			}
			out->p = np;
		}
		if ((rc = parse_line(path, line, buf, l, vocab, &out->p[out->n])) < 0)
			break;
		out->n++;
	}
	if (!rc && ferror(f))
		rc = sl_err(SL_EIO, "%s: read error: %s", path, strerror(errno));
	if (!rc && out->n == 0)
		rc = sl_err(SL_EFORMAT, "%s: no prompts (the file is empty)", path);
	free(buf);
	fclose(f);
	if (rc)
		sl_prompts_free(out);
	return rc;
}

struct sl_output {
	char *path, *tmp;
	FILE *f;
	bool committed;
};

int sl_output_open(const char *path, bool overwrite, sl_output **out)
{
	*out = NULL;
	if (!overwrite && access(path, F_OK) == 0)
		return sl_err(SL_EINVAL, "%s: output file exists (use --overwrite to replace it)", path);
	sl_output *o = calloc(1, sizeof *o);
	if (!o)
		return sl_err(SL_ENOMEM, "out of memory");
	o->path = strdup(path);
	if (!o->path || asprintf(&o->tmp, "%s.partial", path) < 0) {
		o->tmp = NULL;
		sl_output_free(o);
		return sl_err(SL_ENOMEM, "out of memory");
	}
	o->f = fopen(o->tmp, "wb");
	if (!o->f) {
		int e = errno;
		sl_output_free(o);
		return sl_err(SL_EIO, "%s: cannot write output: %s", path, strerror(e));
	}
	*out = o;
	return 0;
}

int sl_output_write(sl_output *o, const sl_prompt *p, const int32_t *ids, int n)
{
	if (fprintf(o->f, "{\"id\":%s,\"output_ids\":[", p->id_json) < 0)
		goto fail;
	for (int i = 0; i < n; i++)
		if (fprintf(o->f, i ? ",%d" : "%d", ids[i]) < 0)
			goto fail;
	if (fputs("]}\n", o->f) < 0)
		goto fail;
	return 0;
fail:
	return sl_err(SL_EIO, "%s: write failed: %s", o->tmp, strerror(errno));
}

int sl_output_commit(sl_output *o)
{
	FILE *f = o->f;
	o->f = NULL;
	int e = 0;
	if (fflush(f) != 0 || fsync(fileno(f)) != 0)
		e = errno;
	if (fclose(f) != 0 && !e)
		e = errno;
	if (e)
		return sl_err(SL_EIO, "%s: write failed: %s", o->tmp, strerror(e));
	if (rename(o->tmp, o->path) != 0)
		return sl_err(SL_EIO, "%s: cannot move output into place: %s", o->path, strerror(errno));
	o->committed = true;
	return 0;
}

void sl_output_free(sl_output *o)
{
	if (!o)
		return;
	if (o->f)
		fclose(o->f);
	if (!o->committed && o->tmp)
		unlink(o->tmp);
	free(o->path);
	free(o->tmp);
	free(o);
}
