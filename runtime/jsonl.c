/*
 * jsonl.c - reading prompts and writing results as JSON Lines (jansson),
 * plain or zstd-compressed (a name ending in .zst).
 *
 * A compressed input is decompressed as a stream behind a stdio FILE
 * (fopencookie), so the line reader is the same for both and never holds
 * more than a line.  A compressed output is one zstd frame per block (per
 * sl_output_sync): a frame is written whole and then synced, so after a
 * crash the whole frames are the blocks that reached the disk and a torn
 * last frame is cut like a torn last line.  Resume speaks of offsets in
 * the decompressed stream (sl_output_lines' ends); sl_output_truncate maps
 * one to the frame holding it.
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
#include <zstd.h>
#include <zstd_errors.h>

static bool is_zst(const char *path)
{
	size_t n = strlen(path);
	return n >= 4 && !strcmp(path + n - 4, ".zst");
}

/* ---- a zstd stream read through stdio ---------------------------------- */

typedef struct zin {
	FILE *f;
	ZSTD_DCtx *dctx;
	char *ibuf;
	size_t icap;
	ZSTD_inBuffer in;
	long long base;  /* the file offset of ibuf[0] */
	long long frame; /* the file offset where the frame being read begins */
	size_t pending;  /* the last ZSTD_decompressStream result: 0 at a frame's end */
	bool eof, decoded; /* decoded: some frame began well */
	bool drain;        /* end the stream at the end of the frame being read */
	int code;        /* once a read failed: its error code ... */
	char err[256];   /* ... and what is wrong */
} zin;

static ssize_t zin_read(void *c, char *buf, size_t size)
{
	zin *z = c;
	ZSTD_outBuffer out = { buf, size, 0 };
	while (out.pos == 0 && size) {
		if (z->drain && z->decoded && !z->pending)
			return 0;
		if (z->in.pos == z->in.size) {
			if (z->eof) {
				if (!z->pending)
					return 0;
				z->code = SL_EFORMAT;
				snprintf(z->err, sizeof z->err,
					 "truncated: the file ends (at byte %lld) inside the zstd frame that begins at byte %lld",
					 z->base + (long long)z->in.size, z->frame);
				errno = EIO;
				return -1;
			}
			size_t n = fread(z->ibuf, 1, z->icap, z->f);
			if (n == 0) {
				if (ferror(z->f)) {
					z->code = SL_EIO;
					snprintf(z->err, sizeof z->err, "read error: %s", strerror(errno));
					errno = EIO;
					return -1;
				}
				z->eof = true;
			}
			z->base += (long long)z->in.size;
			z->in = (ZSTD_inBuffer){ z->ibuf, n, 0 };
			continue;
		}
		if (!z->pending)
			z->frame = z->base + (long long)z->in.pos;
		size_t r = ZSTD_decompressStream(z->dctx, &out, &z->in);
		if (ZSTD_isError(r)) {
			z->code = SL_EFORMAT;
			if (!z->decoded && ZSTD_getErrorCode(r) == ZSTD_error_prefix_unknown)
				snprintf(z->err, sizeof z->err,
					 "not zstd-compressed data (the name ends in .zst)");
			else
				snprintf(z->err, sizeof z->err,
					 "corrupt zstd data in the frame that begins at byte %lld: %s", z->frame,
					 ZSTD_getErrorName(r));
			errno = EIO;
			return -1;
		}
		z->pending = r;
		z->decoded = true;
	}
	return (ssize_t)out.pos;
}

static int zin_close(void *c)
{
	zin *z = c;
	int rc = fclose(z->f);
	ZSTD_freeDCtx(z->dctx);
	free(z->ibuf);
	free(z);
	return rc;
}

/* f (owned) decompressed as it is read; *zp: its state, for the message
 * of a failed read (valid until the stream is closed). */
static FILE *zin_open(FILE *f, zin **zp)
{
	zin *z = calloc(1, sizeof *z);
	if (z) {
		z->f = f;
		z->icap = ZSTD_DStreamInSize();
		z->ibuf = malloc(z->icap);
		z->dctx = ZSTD_createDCtx();
	}
	FILE *s = NULL;
	if (z && z->ibuf && z->dctx)
		s = fopencookie(z, "rb", (cookie_io_functions_t){ .read = zin_read, .close = zin_close });
	if (!s) {
		if (z) {
			ZSTD_freeDCtx(z->dctx);
			free(z->ibuf);
			free(z);
		}
		fclose(f);
		return NULL;
	}
	*zp = z;
	return s;
}

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
				      "%s:%d: \"%s\" is text but the model has no tokenizer (tokenizer.json, or vocab.json and merges.txt); give \"%s\" instead",
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
	zin *z = NULL;
	if (!std_in && is_zst(path) && !(f = zin_open(f, &z)))
		return sl_err(SL_ENOMEM, "out of memory");
	if (std_in)
		path = "<stdin>";
	char *buf = NULL;
	size_t bcap = 0;
	ssize_t len;
	int line = 0, cap = 0, rc = 0;
	/* a line cut short by a failed read is not parsed: the failure is
	 * what is wrong */
	while ((len = getline(&buf, &bcap, f)) >= 0 && !ferror(f)) {
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
	if (rc < 0 && rc != SL_ENOMEM && z && !ferror(f)) {
		/* a bad line may be corrupt data that its frame's checksum,
		 * further on, would have caught: read on to the frame's end */
		z->drain = true;
		while (getline(&buf, &bcap, f) >= 0 && !ferror(f))
			;
		if (ferror(f)) {
			sl_prompts_free(out);
			rc = 0;
		}
	}
	if (!rc && ferror(f))
		rc = z && z->code ? sl_err(z->code, "%s: %s", path, z->err)
				    : sl_err(SL_EIO, "%s: read error: %s", path, strerror(errno));
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
	/* zstd (OUT ends in .zst): the block's lines, compressed into one
	 * frame by sl_output_sync */
	bool zst;
	ZSTD_CCtx *cctx;
	char *blk, *zbuf;
	size_t blen, bcap, zcap;
	/* resume: the whole frames found, frame k at compressed offset fc[k]
	 * and decompressed offset fu[k]; [nframes] is where the last ends */
	off_t *fc, *fu;
	int nframes;
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
	if ((o->zst = is_zst(path))) {
		if (!(o->cctx = ZSTD_createCCtx()) ||
		    ZSTD_isError(ZSTD_CCtx_setParameter(o->cctx, ZSTD_c_checksumFlag, 1))) {
			sl_output_close(o, false);
			return sl_err(SL_ENOMEM, "out of memory");
		}
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

/* One whole line of an output found on resume (len with its newline),
 * ending at decompressed offset end: 1 when it is not one of ours (stop
 * there). */
static int found_line(sl_output *o, const char *buf, size_t len, off_t end, int *cap)
{
	json_t *root = json_loadb(buf, len - 1, 0, NULL);
	json_t *id = root ? json_object_get(root, "id") : NULL;
	char *s = id ? json_dumps(id, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
	json_decref(root);
	if (id && !s)
		return sl_err(SL_ENOMEM, "out of memory");
	if (!s)
		return 1; /* not one of ours: stop here */
	if (o->nlines == *cap) {
		*cap = *cap ? 2 * *cap : 256;
		char **ni = realloc(o->ids, (size_t)*cap * sizeof *ni);
		off_t *ne = ni ? realloc(o->ends, (size_t)*cap * sizeof *ne) : NULL;
		if (ni)
			o->ids = ni;
		if (!ni || !ne) {
			free(s);
			return sl_err(SL_ENOMEM, "out of memory");
		}
		o->ends = ne;
	}
	o->ids[o->nlines] = s;
	o->ends[o->nlines++] = end;
	return 0;
}

/* Frame boundary k: compressed offset c, decompressed offset u. */
static int note_frame(sl_output *o, int k, off_t c, off_t u, int *fcap)
{
	if (k >= *fcap) {
		*fcap = *fcap ? 2 * *fcap : 64;
		off_t *nc = realloc(o->fc, (size_t)*fcap * sizeof *nc);
		off_t *nu = nc ? realloc(o->fu, (size_t)*fcap * sizeof *nu) : NULL;
		if (nc)
			o->fc = nc;
		if (!nc || !nu)
			return sl_err(SL_ENOMEM, "out of memory");
		o->fu = nu;
	}
	o->fc[k] = c;
	o->fu[k] = u;
	return 0;
}

/* The lines of a compressed output, frame by frame: a frame's lines count
 * once the whole frame has been read (its checksum too); a torn or corrupt
 * frame ends the output there, as a torn line ends a plain one.  Only the
 * frame being read is held in memory (and a line it began, if one runs
 * into the next frame). */
static int zst_lines(sl_output *o, int *cap)
{
	ZSTD_DCtx *d = ZSTD_createDCtx();
	size_t icap = ZSTD_DStreamInSize();
	char *ibuf = malloc(icap), *fb = NULL;
	size_t flen = 0, fcap = 0; /* fb: decompressed, from line start ls */
	off_t base = 0, ls = 0; /* ibuf's file offset; fb[0]'s decompressed offset */
	int ffcap = 0, rc = 0;
	bool stop = false;
	o->nframes = 0;
	if (!d || !ibuf || note_frame(o, 0, 0, 0, &ffcap) < 0) {
		rc = sl_err(SL_ENOMEM, "out of memory");
		goto done;
	}
	size_t n;
	while (!stop && (n = fread(ibuf, 1, icap, o->f)) > 0) {
		ZSTD_inBuffer in = { ibuf, n, 0 };
		while (!stop && in.pos < in.size) {
			if (fcap - flen < (size_t)1 << 16) {
				size_t nc = SL_MAX(2 * fcap, flen + (1 << 17));
				char *nb = realloc(fb, nc);
				if (!nb) {
					rc = sl_err(SL_ENOMEM, "out of memory");
					goto done;
				}
				fb = nb;
				fcap = nc;
			}
			ZSTD_outBuffer out = { fb, fcap, flen };
			size_t r = ZSTD_decompressStream(d, &out, &in);
			flen = out.pos;
			if (ZSTD_isError(r)) {
				stop = true; /* a corrupt frame: the output ends before it */
				break;
			}
			if (r)
				continue;
			/* a whole frame, ending here: then its whole lines */
			if ((rc = note_frame(o, o->nframes + 1, base + (off_t)in.pos, ls + (off_t)flen,
					     &ffcap)) < 0)
				goto done;
			o->nframes++;
			size_t from = 0;
			for (size_t i = 0; i < flen; i++) {
				if (fb[i] != '\n')
					continue;
				int k = found_line(o, fb + from, i + 1 - from, ls + (off_t)(i + 1), cap);
				if (k < 0) {
					rc = k;
					goto done;
				}
				if (k) {
					stop = true;
					break;
				}
				from = i + 1;
			}
			if (stop)
				break;
			memmove(fb, fb + from, flen - from);
			ls += (off_t)from;
			flen -= from;
		}
		base += (off_t)n;
	}
	if (!rc && ferror(o->f))
		rc = sl_err(SL_EIO, "%s: read error: %s", o->tmp ? o->tmp : o->path, strerror(errno));
done:
	ZSTD_freeDCtx(d);
	free(ibuf);
	free(fb);
	return rc;
}

int sl_output_lines(sl_output *o, int *n, char ***ids, off_t **ends)
{
	if (fseeko(o->f, 0, SEEK_SET) != 0)
		return sl_err(SL_EIO, "%s: %s", o->tmp, strerror(errno));
	int cap = 0, rc = 0;
	if (o->zst) {
		rc = zst_lines(o, &cap);
	} else {
		char *buf = NULL;
		size_t bcap = 0;
		ssize_t len;
		off_t pos = 0;
		while ((len = getline(&buf, &bcap, o->f)) > 0) {
			if (buf[len - 1] != '\n')
				break; /* a line cut short by a crash: not whole */
			pos += len;
			int k = found_line(o, buf, (size_t)len, pos, &cap);
			if (k) {
				rc = k < 0 ? k : 0;
				break;
			}
		}
		free(buf);
	}
	clearerr(o->f);
	*n = o->nlines;
	*ids = o->ids;
	*ends = o->ends;
	return rc;
}

/* Compress the block's lines into one frame at the end of the file. */
static int write_frame(sl_output *o, const char *src, size_t len)
{
	size_t need = ZSTD_compressBound(len);
	if (need > o->zcap) {
		char *nb = realloc(o->zbuf, need);
		if (!nb)
			return sl_err(SL_ENOMEM, "out of memory");
		o->zbuf = nb;
		o->zcap = need;
	}
	size_t r = ZSTD_compress2(o->cctx, o->zbuf, o->zcap, src, len);
	if (ZSTD_isError(r))
		return sl_err(SL_EIO, "%s: zstd compression failed: %s", o->tmp, ZSTD_getErrorName(r));
	if (fwrite(o->zbuf, 1, r, o->f) != r)
		return sl_err(SL_EIO, "%s: write failed: %s", o->tmp, strerror(errno));
	return 0;
}

/* A compressed output cut at decompressed offset off: after the frame
 * that ends there, or, inside a frame (a resume with another
 * --batch-size), before that frame with its lines up to off written again
 * as a frame of their own. */
static int zst_truncate(sl_output *o, off_t off)
{
	if (!o->fc) /* no lines were read: nothing is kept */
		return off ? sl_err(SL_EINVAL, "%s: cut past its known frames", o->tmp)
			   : (ftruncate(fileno(o->f), 0) == 0 && fseeko(o->f, 0, SEEK_SET) == 0)
				     ? 0
				     : sl_err(SL_EIO, "%s: cannot truncate: %s", o->tmp, strerror(errno));
	int k = 0;
	while (k < o->nframes && o->fu[k + 1] <= off)
		k++;
	const off_t cut = o->fc[k];
	if (off == o->fu[k] || k == o->nframes) {
		if (ftruncate(fileno(o->f), cut) != 0 || fseeko(o->f, cut, SEEK_SET) != 0)
			return sl_err(SL_EIO, "%s: cannot truncate: %s", o->tmp, strerror(errno));
		return 0;
	}
	/* frame k holds off: read it again up to off */
	const size_t want = (size_t)(off - o->fu[k]), clen = (size_t)(o->fc[k + 1] - cut);
	char *cb = malloc(clen), *ub = malloc(want);
	ZSTD_DCtx *d = ZSTD_createDCtx();
	int rc = 0;
	if (!cb || !ub || !d) {
		rc = sl_err(SL_ENOMEM, "out of memory");
		goto done;
	}
	if (fseeko(o->f, cut, SEEK_SET) != 0 || fread(cb, 1, clen, o->f) != clen) {
		rc = sl_err(SL_EIO, "%s: read error: %s", o->tmp, strerror(errno));
		goto done;
	}
	ZSTD_inBuffer in = { cb, clen, 0 };
	ZSTD_outBuffer out = { ub, want, 0 };
	while (out.pos < want) {
		size_t r = ZSTD_decompressStream(d, &out, &in);
		if (ZSTD_isError(r) || (out.pos < want && in.pos == in.size)) {
			rc = sl_err(SL_EFORMAT, "%s: changed while it was resumed", o->tmp);
			goto done;
		}
	}
	if (ftruncate(fileno(o->f), cut) != 0 || fseeko(o->f, cut, SEEK_SET) != 0) {
		rc = sl_err(SL_EIO, "%s: cannot truncate: %s", o->tmp, strerror(errno));
		goto done;
	}
	rc = write_frame(o, ub, want);
done:
	ZSTD_freeDCtx(d);
	free(cb);
	free(ub);
	return rc;
}

int sl_output_truncate(sl_output *o, off_t off)
{
	if (fflush(o->f) != 0)
		return sl_err(SL_EIO, "%s: cannot truncate: %s", o->tmp, strerror(errno));
	if (o->zst)
		return zst_truncate(o, off);
	if (ftruncate(fileno(o->f), off) != 0 || fseeko(o->f, off, SEEK_SET) != 0)
		return sl_err(SL_EIO, "%s: cannot truncate: %s", o->tmp, strerror(errno));
	return 0;
}

int sl_output_write(sl_output *o, const char *line, size_t len)
{
	if (o->zst) {
		if (o->blen + len + 1 > o->bcap) {
			size_t nc = SL_MAX(2 * o->bcap, o->blen + len + 4096);
			char *nb = realloc(o->blk, nc);
			if (!nb)
				return sl_err(SL_ENOMEM, "out of memory");
			o->blk = nb;
			o->bcap = nc;
		}
		memcpy(o->blk + o->blen, line, len);
		o->blk[o->blen + len] = '\n';
		o->blen += len + 1;
		return 0;
	}
	if (fwrite(line, 1, len, o->f) != len || fputc('\n', o->f) == EOF)
		return sl_err(SL_EIO, "%s: write failed: %s", o->tmp ? o->tmp : o->path, strerror(errno));
	return 0;
}

int sl_output_sync(sl_output *o)
{
	if (o->std_out) /* a pipe or a terminal: passed on, not synced */
		return fflush(o->f) == 0 ? 0
					 : sl_err(SL_EIO, "%s: write failed: %s", o->path, strerror(errno));
	if (o->zst && o->blen) {
		SL_TRY(write_frame(o, o->blk, o->blen));
		o->blen = 0;
	}
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
	free(o->fc);
	free(o->fu);
	free(o->blk);
	free(o->zbuf);
	ZSTD_freeCCtx(o->cctx);
	free(o->path);
	free(o->tmp);
	free(o);
}
