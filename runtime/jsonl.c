/*
 * jsonl.c - reading prompts and writing results as JSON Lines (jansson).
 */
#include "jsonl.h"
#include "sl_common.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void prompt_clear(sl_prompt *p)
{
	free(p->id_json);
	free(p->ids);
	free(p->cont);
	free(p->error);
	memset(p, 0, sizeof *p);
}

void sl_prompts_free(sl_prompts *ps)
{
	if (!ps || !ps->p)
		return;
	for (int i = 0; i < ps->n; i++)
		prompt_clear(&ps->p[i]);
	free(ps->p);
	memset(ps, 0, sizeof *ps);
}

/* Token ids from field `ids_key` (an array) or `text_key` (text). */
static int get_tokens(const char *path, int line, json_t *root, const char *ids_key,
		      const char *text_key, bool bos, const sl_read_opts *o, int32_t **out, int *n)
{
	json_t *ids = json_object_get(root, ids_key), *text = json_object_get(root, text_key);
	*out = NULL;
	*n = 0;
	if (!ids && !text)
		return sl_err(SL_EFORMAT, "%s:%d: missing \"%s\" (or \"%s\")", path, line, text_key,
			      ids_key);
	if (ids && text)
		return sl_err(SL_EFORMAT, "%s:%d: both \"%s\" and \"%s\": give one of them", path, line,
			      text_key, ids_key);
	if (text) {
		if (!json_is_string(text))
			return sl_err(SL_EFORMAT, "%s:%d: \"%s\" must be a string", path, line, text_key);
		if (!o->tok)
			return sl_err(SL_EUNSUPPORTED,
				      "%s:%d: \"%s\" is text but the model has no tokenizer (vocab.json and merges.txt); give \"%s\" instead",
				      path, line, text_key, ids_key);
		size_t cnt = 0;
		int rc = sl_tokenizer_encode_ex(o->tok, json_string_value(text), json_string_length(text),
						bos ? SL_TOKENIZER_ADD_BOS : 0, out, &cnt);
		if (rc < 0)
			return sl_err_prefix(rc, "%s:%d", path, line);
		if (cnt == 0 || cnt > INT_MAX / 2) {
			free(*out);
			*out = NULL;
			return sl_err(SL_EFORMAT, "%s:%d: \"%s\" is empty", path, line, text_key);
		}
		*n = (int)cnt;
		for (int i = 0; i < *n; i++)
			if ((*out)[i] >= o->vocab) {
				int32_t bad = (*out)[i];
				free(*out);
				*out = NULL;
				return sl_err(SL_ERANGE,
					      "%s:%d: the tokenizer gave id %d, outside the model's vocabulary (0..%d)",
					      path, line, bad, o->vocab - 1);
			}
		return 0;
	}
	if (!json_is_array(ids) || json_array_size(ids) == 0)
		return sl_err(SL_EFORMAT, "%s:%d: \"%s\" must be a non-empty array of token ids", path,
			      line, ids_key);
	size_t cnt = json_array_size(ids);
	if (cnt > INT_MAX / 2)
		return sl_err(SL_EFORMAT, "%s:%d: \"%s\" is too long", path, line, ids_key);
	*out = malloc(cnt * sizeof **out);
	if (!*out)
		return sl_err(SL_ENOMEM, "out of memory");
	for (size_t i = 0; i < cnt; i++) {
		json_t *v = json_array_get(ids, i);
		int rc = 0;
		if (!json_is_integer(v))
			rc = sl_err(SL_EFORMAT, "%s:%d: %s[%zu] is not an integer", path, line, ids_key, i);
		else if (json_integer_value(v) < 0 || json_integer_value(v) >= o->vocab)
			rc = sl_err(SL_ERANGE, "%s:%d: %s[%zu] = %lld is outside the vocabulary (0..%d)",
				    path, line, ids_key, i, (long long)json_integer_value(v), o->vocab - 1);
		if (rc) {
			free(*out);
			*out = NULL;
			return rc;
		}
		(*out)[i] = (int32_t)json_integer_value(v);
	}
	*n = (int)cnt;
	return 0;
}

static int parse_line(const char *path, int line, const char *text, size_t len,
		      const sl_read_opts *o, sl_prompt *p)
{
	memset(p, 0, sizeof *p);
	p->line = line;
	json_error_t jerr;
	json_t *root = json_loadb(text, len, 0, &jerr);
	int rc = 0;
	if (!root) {
		rc = sl_err(SL_EFORMAT, "%s:%d: not valid JSON: %s", path, line, jerr.text);
		goto done;
	}
	if (!json_is_object(root)) {
		rc = sl_err(SL_EFORMAT, "%s:%d: a line must be a JSON object", path, line);
		goto done;
	}
	json_t *id = json_object_get(root, "id");
	if (id && !(p->id_json = json_dumps(id, JSON_COMPACT | JSON_ENCODE_ANY))) {
		rc = sl_err(SL_ENOMEM, "out of memory"); /* never the line number instead */
		goto done;
	}
	if ((rc = get_tokens(path, line, root, "input_ids", "prompt", true, o, &p->ids, &p->n)) < 0)
		goto done;
	if (o->score &&
	    (rc = get_tokens(path, line, root, "continuation_ids", "continuation", false, o, &p->cont,
			     &p->ncont)) < 0)
		goto done;
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
done:
	json_decref(root);
	if (!p->id_json && asprintf(&p->id_json, "%d", line) < 0)
		p->id_json = NULL;
	if (!p->id_json && !rc)
		rc = sl_err(SL_ENOMEM, "out of memory");
	if (rc) {
		free(p->ids);
		free(p->cont);
		p->ids = p->cont = NULL;
		p->n = p->ncont = 0;
	}
	return rc;
}

int sl_prompts_read(const char *path, const sl_read_opts *o, sl_prompts *out)
{
	memset(out, 0, sizeof *out);
	const bool std_in = !strcmp(path, "-");
	FILE *f = std_in ? stdin : fopen(path, "rb");
	if (!f)
		return sl_err(errno == ENOENT ? SL_ENOTFOUND : SL_EIO, "%s: cannot open: %s", path,
			      strerror(errno));
	if (std_in)
		path = "<stdin>";
	char *buf = NULL;
	size_t bcap = 0;
	ssize_t len;
	int line = 0, cap = 0, rc = 0;
	while ((len = getline(&buf, &bcap, f)) >= 0) {
		line++;
		size_t l = (size_t)len;
		while (l && (buf[l - 1] == '\n' || buf[l - 1] == '\r'))
			l--;
		char *text = buf;
		if (line == 1 && l >= 3 && !memcmp(buf, "\xef\xbb\xbf", 3)) {
			text += 3; /* a UTF-8 byte-order mark: not part of the first line */
			l -= 3;
		}
		size_t sp = 0;
		while (sp < l && (text[sp] == ' ' || text[sp] == '\t'))
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
		sl_prompt *p = &out->p[out->n];
		rc = parse_line(path, line, text, l, o, p);
		if (rc < 0 && o->skip_bad_lines && rc != SL_ENOMEM && p->id_json) {
			p->error = strdup(sl_errmsg());
			if (!p->error) {
				prompt_clear(p);
				rc = sl_err(SL_ENOMEM, "out of memory");
				break;
			}
			out->bad++;
			rc = 0;
		}
		if (rc < 0) {
			prompt_clear(p);
			break;
		}
		out->n++;
	}
	if (!rc && ferror(f))
		rc = sl_err(SL_EIO, "%s: read error: %s", path, strerror(errno));
	if (!rc && out->n == 0)
		rc = sl_err(SL_EFORMAT, "%s: no prompts (the file is empty)", path);
	free(buf);
	if (!std_in)
		fclose(f);
	if (rc)
		sl_prompts_free(out);
	return rc;
}

struct sl_output {
	char *path, *tmp; /* tmp: OUT.partial; NULL for standard output */
	FILE *f;
	bool std_out;
	char **ids;
	off_t *ends;
	int nlines;
};

const char *sl_output_path(const sl_output *o)
{
	return o->path;
}

int sl_output_open(const char *path, enum sl_output_mode mode, sl_output **out, bool *complete)
{
	*out = NULL;
	if (complete)
		*complete = false;
	sl_output *o = calloc(1, sizeof *o);
	if (!o)
		return sl_err(SL_ENOMEM, "out of memory");
	if (!strcmp(path, "-")) {
		/* standard output: lines as each block ends, no .partial */
		o->std_out = true;
		o->f = stdout;
		if (!(o->path = strdup("<stdout>"))) {
			sl_output_close(o, false);
			return sl_err(SL_ENOMEM, "out of memory");
		}
		if (mode == SL_OUT_RESUME) {
			sl_output_close(o, false);
			return sl_err(SL_EINVAL, "standard output cannot be resumed (--resume needs --out FILE)");
		}
		*out = o;
		return 0;
	}
	o->path = strdup(path);
	if (!o->path || asprintf(&o->tmp, "%s.partial", path) < 0) {
		o->tmp = NULL;
		sl_output_close(o, false);
		return sl_err(SL_ENOMEM, "out of memory");
	}
	struct stat sb;
	bool have_out = stat(path, &sb) == 0, have_partial = access(o->tmp, F_OK) == 0;
	const char *how = "wb";
	int rc = 0;
	if (have_out && !S_ISREG(sb.st_mode)) {
		rc = sl_err(SL_EINVAL, "%s: %s (--out names the file to write, - for standard output)", path,
			    S_ISDIR(sb.st_mode) ? "is a directory" : "is not a regular file");
	} else if (mode == SL_OUT_RESUME) {
		if (have_out && !have_partial) {
			/* complete: read it, for its ids to be checked against the input */
			if (!(o->f = fopen(path, "rb"))) {
				int e = errno;
				sl_output_close(o, false);
				return sl_err(SL_EIO, "%s: cannot read: %s", path, strerror(e));
			}
			if (complete)
				*complete = true;
			*out = o;
			return 0;
		}
		how = have_partial ? "r+b" : "wb";
	} else if (mode == SL_OUT_NEW && have_out) {
		rc = sl_err(SL_EINVAL, "%s: output file exists (use --overwrite to replace it)", path);
	} else if (mode == SL_OUT_NEW && have_partial) {
		rc = sl_err(SL_EINVAL,
			    "%s: an interrupted run left %s (use --resume to continue it or --overwrite to start again)",
			    path, o->tmp);
	}
	if (rc) {
		sl_output_close(o, false);
		return rc;
	}
	o->f = fopen(o->tmp, how);
	if (!o->f) {
		int e = errno;
		sl_output_close(o, false);
		return sl_err(e == ENOENT || e == ENOTDIR ? SL_ENOTFOUND : SL_EIO,
			      "%s: cannot write output: %s", path, strerror(e));
	}
	if (fseeko(o->f, 0, SEEK_END) != 0) {
		int e = errno;
		sl_output_close(o, false);
		return sl_err(SL_EIO, "%s: %s", path, strerror(e));
	}
	*out = o;
	return 0;
}

int sl_output_lines(sl_output *o, int *n, char ***ids, off_t **ends)
{
	if (fseeko(o->f, 0, SEEK_SET) != 0)
		return sl_err(SL_EIO, "%s: %s", o->tmp, strerror(errno));
	char *buf = NULL;
	size_t bcap = 0;
	ssize_t len;
	off_t pos = 0;
	int cap = 0, rc = 0;
	while ((len = getline(&buf, &bcap, o->f)) > 0) {
		if (buf[len - 1] != '\n')
			break; /* a line cut short by a crash: not whole */
		json_t *root = json_loadb(buf, (size_t)len - 1, 0, NULL);
		json_t *id = root ? json_object_get(root, "id") : NULL;
		char *s = id ? json_dumps(id, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
		json_decref(root);
		if (id && !s) {
			rc = sl_err(SL_ENOMEM, "out of memory");
			break;
		}
		if (!s)
			break; /* not one of ours: stop here */
		if (o->nlines == cap) {
			cap = cap ? 2 * cap : 256;
			char **ni = realloc(o->ids, (size_t)cap * sizeof *ni);
			off_t *ne = ni ? realloc(o->ends, (size_t)cap * sizeof *ne) : NULL;
			if (ni)
				o->ids = ni;
			if (!ni || !ne) {
				free(s);
				rc = sl_err(SL_ENOMEM, "out of memory");
				break;
			}
			o->ends = ne;
		}
		pos += len;
		o->ids[o->nlines] = s;
		o->ends[o->nlines++] = pos;
	}
	free(buf);
	clearerr(o->f);
	*n = o->nlines;
	*ids = o->ids;
	*ends = o->ends;
	return rc;
}

int sl_output_truncate(sl_output *o, off_t off)
{
	if (fflush(o->f) != 0 || ftruncate(fileno(o->f), off) != 0 || fseeko(o->f, off, SEEK_SET) != 0)
		return sl_err(SL_EIO, "%s: cannot truncate: %s", o->tmp, strerror(errno));
	return 0;
}

int sl_output_write(sl_output *o, const char *line, size_t len)
{
	if (fwrite(line, 1, len, o->f) != len || fputc('\n', o->f) == EOF)
		return sl_err(SL_EIO, "%s: write failed: %s", o->tmp ? o->tmp : o->path, strerror(errno));
	return 0;
}

int sl_output_sync(sl_output *o)
{
	if (o->std_out) /* a pipe or a terminal: passed on, not synced */
		return fflush(o->f) == 0 ? 0
					 : sl_err(SL_EIO, "%s: write failed: %s", o->path, strerror(errno));
	if (fflush(o->f) != 0 || fdatasync(fileno(o->f)) != 0)
		return sl_err(SL_EIO, "%s: write failed: %s", o->tmp, strerror(errno));
	return 0;
}

int sl_output_commit(sl_output *o)
{
	SL_TRY(sl_output_sync(o));
	if (o->std_out)
		return 0;
	FILE *f = o->f;
	o->f = NULL;
	if (fclose(f) != 0)
		return sl_err(SL_EIO, "%s: write failed: %s", o->tmp, strerror(errno));
	if (rename(o->tmp, o->path) != 0)
		return sl_err(SL_EIO, "%s: cannot move output into place: %s", o->path, strerror(errno));
	return 0;
}

void sl_output_close(sl_output *o, bool discard)
{
	if (!o)
		return;
	if (o->std_out)
		fflush(o->f);
	else if (o->f)
		fclose(o->f);
	if (discard && o->f && o->tmp)
		unlink(o->tmp);
	for (int i = 0; i < o->nlines; i++)
		free(o->ids[i]);
	free(o->ids);
	free(o->ends);
	free(o->path);
	free(o->tmp);
	free(o);
}
