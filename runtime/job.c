/*
 * job.c - batch jobs: blocks, resume, shards, progress, output lines.
 *
 * Blocks are formed from the input in order (block b holds lines
 * [b * batch, (b + 1) * batch)), whatever the shard or how often the job
 * was resumed, so a block always holds the same prompts and gives the same
 * output.  A shard takes every shard_n-th block.  After each block its
 * lines are appended to OUT.partial and flushed to the disk; resuming keeps
 * the whole blocks found there (checking their ids against the input) and
 * cuts anything after them.  Sampling draws are keyed by a prompt's index
 * in the input, so they do not depend on blocks either.
 *
 * Generation and scoring run through one block loop (job_run); what
 * differs between them (their sequences, the run, the output line) is a
 * job_kind, and each kind's state extends struct job.
 */
#include "job.h"
#include "generate.h"
#include "score.h"
#include "sl_json.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- progress ---------------------------------------------------------- */

typedef struct progress {
	int mode; /* 0 none, 1 log lines, 2 bar */
	double t0, last;
	int total, done, base; /* prompts: in this shard, finished, finished before this run */
	long tokens;
	bool drawn;
} progress;

static void fmt_eta(double s, char *buf, size_t n)
{
	if (!(s >= 0) || s > 1e8) {
		snprintf(buf, n, "--");
		return;
	}
	long t = (long)(s + 0.5);
	if (t >= 3600)
		snprintf(buf, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
	else
		snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
}

static void progress_show(progress *p, bool force)
{
	if (!p->mode)
		return;
	double now = sl_now();
	if (!force && now - p->last < (p->mode == 2 ? 0.2 : 5.0))
		return;
	p->last = now;
	double el = now - p->t0;
	double rate = el > 0 ? p->tokens / el : 0;
	int this_run = p->done - p->base;
	char eta[32];
	fmt_eta(this_run > 0 ? el / this_run * (p->total - p->done) : -1, eta, sizeof eta);
	if (p->mode == 2) {
		const int width = 30;
		int fill = p->total ? (int)((double)p->done / p->total * width) : width;
		char bar[64];
		for (int i = 0; i < width; i++)
			bar[i] = i < fill ? '#' : '.';
		bar[width] = 0;
		fprintf(stderr, "\r[%s] %d/%d prompts  %.1f tok/s  ETA %s \033[K", bar, p->done, p->total,
			rate, eta);
		p->drawn = true;
	} else {
		fprintf(stderr, "sluice: %d/%d prompts, %ld token%s, %.1f tok/s, ETA %s\n", p->done,
			p->total, p->tokens, p->tokens == 1 ? "" : "s", rate, eta);
	}
	fflush(stderr);
}

static void progress_end(progress *p)
{
	if (p->mode == 2 && p->drawn) {
		progress_show(p, true);
		fputc('\n', stderr);
	}
}

/* ---- blocks, shards, resume -------------------------------------------- */

/* Tests stretch a job to stop it between blocks: SLUICE_TEST_BLOCK_DELAY_MS
 * sleeps after each block has reached the disk. */
static void test_delay(void)
{
	static long ms = -1;
	if (ms < 0) {
		const char *e = getenv("SLUICE_TEST_BLOCK_DELAY_MS");
		ms = e ? atol(e) : 0;
	}
	if (ms > 0)
		usleep((useconds_t)(ms * 1000));
}

/* And SLUICE_TEST_FAIL_AFTER_BLOCKS=N fails the job with an internal error
 * once N blocks have reached the disk: the exit status of a job that ran
 * and failed, and what it leaves, are tested with it. */
static int test_fault(int blocks_done)
{
	static long n = -1;
	if (n < 0) {
		const char *e = getenv("SLUICE_TEST_FAIL_AFTER_BLOCKS");
		n = e ? atol(e) : 0;
	}
	if (n > 0 && blocks_done >= n)
		return sl_err(SL_EINVAL, "an internal error (injected by SLUICE_TEST_FAIL_AFTER_BLOCKS)");
	return 0;
}

static int n_blocks(const sl_prompts *ps, int batch)
{
	return (ps->n + batch - 1) / batch;
}

static bool mine(const sl_job_opts *o, int b)
{
	return o->shard_n <= 1 || b % o->shard_n == o->shard_k;
}

static int shard_prompts(const sl_prompts *ps, const sl_job_opts *o)
{
	int total = 0;
	for (int b = 0; b < n_blocks(ps, o->batch); b++)
		if (mine(o, b))
			total += SL_MIN(o->batch, ps->n - b * o->batch);
	return total;
}

/* The whole blocks at the start of an output (name: the file, for
 * messages) that match this input: *lines their lines, *keep the byte
 * offset after them, *next the first block still to do.  A line whose id
 * is not the input's is an error: the output is from another job. */
static int match_blocks(const sl_prompts *ps, sl_output *out, const char *name, const sl_job_opts *o,
			int *lines, off_t *keep, int *next, int *nout)
{
	int n = 0;
	char **ids = NULL;
	off_t *ends = NULL;
	*lines = 0;
	*keep = 0;
	*next = 0;
	SL_TRY(sl_output_lines(out, &n, &ids, &ends));
	*nout = n;
	int line = 0;
	for (int b = 0; b < n_blocks(ps, o->batch); b++) {
		if (!mine(o, b))
			continue;
		int first = b * o->batch, count = SL_MIN(o->batch, ps->n - first);
		for (int i = 0; i < count && line + i < n; i++)
			if (strcmp(ids[line + i], ps->p[first + i].id_json))
				return sl_err(SL_EINVAL,
					      "%s: line %d has id %s where this input has %s: it is from another job (use --overwrite to start again)",
					      name, line + i + 1, ids[line + i], ps->p[first + i].id_json);
		if (line + count > n)
			break;
		line += count;
		*keep = ends[line - 1];
		*next = b + 1;
	}
	*lines = line;
	return 0;
}

/* The first block still to do, after keeping the whole blocks already in
 * OUT.partial. */
static int resume_point(const sl_prompts *ps, sl_output *out, const sl_job_opts *o, int *lines)
{
	char name[4096];
	snprintf(name, sizeof name, "%s.partial", sl_output_path(out));
	off_t keep;
	int next, nout;
	SL_TRY(match_blocks(ps, out, name, o, lines, &keep, &next, &nout));
	SL_TRY(sl_output_truncate(out, keep));
	return next;
}

int sl_job_check_complete(const sl_prompts *ps, sl_output *out, const sl_job_opts *o)
{
	const char *name = sl_output_path(out);
	off_t keep;
	int lines, next, nout;
	SL_TRY(match_blocks(ps, out, name, o, &lines, &keep, &next, &nout));
	const int want = shard_prompts(ps, o);
	if (lines != want || nout != lines)
		return sl_err(SL_EINVAL,
			      "%s: holds %d line%s where this input%s has %d: it is from another job (use --overwrite to start again)",
			      name, nout, nout == 1 ? "" : "s", o->shard_n > 1 ? "'s shard" : "", want);
	return 0;
}

/* The progress display and, with --resume, the first block still to do. */
static int job_start(const sl_prompts *ps, sl_output *out, const sl_job_opts *o, sl_job_stats *st,
		     progress *prog)
{
	*prog = (progress){ .mode = o->progress, .t0 = sl_now(), .total = shard_prompts(ps, o) };
	st->prompts = prog->total;
	int start = 0;
	if (o->resume && (start = resume_point(ps, out, o, &st->resumed_lines)) < 0)
		return start;
	prog->done = prog->base = st->resumed_lines;
	return start;
}

/* ---- output lines ------------------------------------------------------ */

/* Write one output line; e holds the first setter that failed, if any:
 * a line is whole or the job fails, never a line with a field missing. */
static int emit(sl_output *out, json_t *obj, const sl_jerr *e, const sl_prompt *p)
{
	char where[64];
	snprintf(where, sizeof where, "the output of input line %d", p->line);
	int rc = sl_jcheck(e, where);
	char *s = rc < 0 ? NULL : json_dumps(obj, JSON_COMPACT);
	json_decref(obj);
	if (rc < 0)
		return sl_err_prefix(rc, "%s", sl_output_path(out));
	if (!s)
		return sl_err(SL_ENOMEM, "out of memory");
	rc = sl_output_write(out, s, strlen(s));
	free(s);
	return rc;
}

static json_t *line_start(const sl_prompt *p, sl_jerr *e)
{
	json_t *obj = json_object();
	sl_jset(obj, "id", json_loads(p->id_json, JSON_DECODE_ANY, NULL), e);
	return obj;
}

/* A JSON string of text that may not be UTF-8 (a message naming a file,
 * text cut at a stop): repaired as the tokenizer's decode repairs it. */
static json_t *json_text(const char *s, size_t n)
{
	char *t = NULL;
	size_t tl = 0;
	if (sl_tokenizer_utf8_repair(s, n, &t, &tl) < 0)
		return NULL;
	json_t *j = json_stringn(t, tl);
	free(t);
	return j;
}

static int emit_error(sl_output *out, const sl_prompt *p)
{
	sl_jerr e = { 0 };
	json_t *obj = line_start(p, &e);
	sl_jset(obj, "error", json_text(p->error, strlen(p->error)), &e);
	return emit(out, obj, &e, p);
}

/* ---- the block loop ---------------------------------------------------- */

typedef struct job job;

/* What a kind of job (generation, scoring) adds to the block loop. */
typedef struct job_kind {
	/* size for the input's lines and make the runner */
	int (*open)(job *j);
	/* the block's sequence k is input line p, the input's i-th */
	void (*add)(job *j, int k, const sl_prompt *p, int i);
	/* run the block's ns sequences; its tokens and times into j->st */
	int (*run)(job *j, int ns);
	/* the output line of the block's sequence k, input line p */
	int (*emit)(job *j, int k, const sl_prompt *p);
	void (*close)(job *j);
} job_kind;

struct job {
	sl_model *m;
	const sl_prompts *ps;
	sl_output *out;
	const sl_job_opts *o;
	sl_job_stats *st;
	progress prog;
};

/* Blocks in input order, this shard's, from the resume point: each one
 * run, its lines written in input order (a bad line's error among them)
 * and flushed to the disk; then the output committed. */
static int job_run(job *j, const job_kind *kind)
{
	const sl_prompts *ps = j->ps;
	const sl_job_opts *o = j->o;
	sl_job_stats *st = j->st;
	const int batch = o->batch;
	const int start = job_start(ps, j->out, o, st, &j->prog);
	if (start < 0)
		return start;
	int rc = kind->open(j);
	const double t0 = sl_now();
	sl_model_stats_reset(j->m);
	int blocks_done = 0;
	for (int b = start; !rc && b < n_blocks(ps, batch); b++) {
		if (!mine(o, b))
			continue;
		if (o->interrupt && *o->interrupt) {
			rc = sl_err(SL_EINTERRUPTED, "interrupted");
			break;
		}
		const int first = b * batch, count = SL_MIN(batch, ps->n - first);
		int ns = 0;
		for (int i = 0; i < count; i++)
			if (!ps->p[first + i].error)
				kind->add(j, ns++, &ps->p[first + i], first + i);
		st->started = true;
		if (ns && (rc = kind->run(j, ns)) < 0)
			break;
		for (int i = 0, k = 0; !rc && i < count; i++) {
			const sl_prompt *p = &ps->p[first + i];
			if (p->error) {
				rc = emit_error(j->out, p);
				st->bad++;
			} else {
				rc = kind->emit(j, k++, p);
			}
		}
		if (!rc)
			rc = sl_output_sync(j->out);
		j->prog.done += count;
		j->prog.tokens = st->tokens;
		st->done = j->prog.done;
		progress_show(&j->prog, false);
		test_delay();
		if (!rc)
			rc = test_fault(++blocks_done);
	}
	progress_end(&j->prog);
	st->wall_s = sl_now() - t0;
	sl_model_stats(j->m, st->prefill_s + st->decode_s, &st->off);
	if (!rc)
		rc = sl_output_commit(j->out);
	kind->close(j);
	return rc;
}

/* ---- generation -------------------------------------------------------- */

typedef struct gen_job {
	job j; /* first: the block loop's part */
	const sl_tokenizer *tok;
	sl_generator *g;
	sl_seq *seqs;
	int32_t *obuf;
	int max_out;
	sl_gen_opts go;
	sl_gen_timing tm;
	/* per sequence of the block: the text so far (stop texts only) */
	char **txt;
	size_t *len, *cap;
	long *stop_at;
} gen_job;

static bool on_token(void *vctx, int s, sl_seq *seq)
{
	gen_job *c = vctx;
	if (!c->j.o->nstop)
		return false;
	const char *b;
	size_t n;
	int32_t id = seq->out[seq->n_out - 1];
	if (sl_tokenizer_is_special(c->tok, id) || sl_tokenizer_token_bytes(c->tok, id, &b, &n) < 0)
		return false;
	if (c->len[s] + n + 1 > c->cap[s]) {
		size_t nc = SL_MAX(2 * c->cap[s], c->len[s] + n + 64);
		char *p = realloc(c->txt[s], nc);
		if (!p)
			return false; /* stop detection degrades; the job goes on */
		c->txt[s] = p;
		c->cap[s] = nc;
	}
	memcpy(c->txt[s] + c->len[s], b, n);
	c->len[s] += n;
	c->txt[s][c->len[s]] = 0;
	for (int k = 0; k < c->j.o->nstop; k++) {
		const char *stop = c->j.o->stop[k];
		size_t sl = strlen(stop);
		size_t from = c->len[s] >= n + sl ? c->len[s] - n - sl + 1 : 0;
		const char *hit = memmem(c->txt[s] + from, c->len[s] - from, stop, sl);
		if (hit) {
			c->stop_at[s] = hit - c->txt[s];
			return true;
		}
	}
	return false;
}

static void on_step(void *vctx, long tokens)
{
	gen_job *c = vctx;
	c->j.prog.tokens = tokens; /* the job's tokens so far, all blocks */
	progress_show(&c->j.prog, false);
}

static int gen_open(job *j)
{
	gen_job *c = (gen_job *)j;
	const sl_prompts *ps = j->ps;
	const sl_job_opts *o = j->o;
	int max_len = 1, max_prompt = 1;
	c->max_out = 1;
	for (int i = 0; i < ps->n; i++) {
		if (ps->p[i].error)
			continue;
		int want = ps->p[i].max_new ? ps->p[i].max_new : o->max_new;
		max_len = SL_MAX(max_len, ps->p[i].n + want);
		c->max_out = SL_MAX(c->max_out, want);
		max_prompt = SL_MAX(max_prompt, ps->p[i].n);
	}
	const size_t batch = (size_t)o->batch;
	c->seqs = calloc(batch, sizeof *c->seqs);
	c->obuf = malloc(sizeof(int32_t) * batch * c->max_out);
	c->txt = calloc(batch, sizeof *c->txt);
	c->len = calloc(batch, sizeof *c->len);
	c->cap = calloc(batch, sizeof *c->cap);
	c->stop_at = calloc(batch, sizeof *c->stop_at);
	c->go = (sl_gen_opts){ .sampling = &o->sampling, .on_token = on_token, .on_step = on_step,
			       .ctx = c, .interrupt = o->interrupt };
	if (!c->seqs || !c->obuf || !c->txt || !c->len || !c->cap || !c->stop_at)
		return sl_err(SL_ENOMEM, "out of memory");
	return sl_generator_create(j->m, SL_MIN(o->batch, ps->n), max_len, max_prompt, &c->g);
}

static void gen_add(job *j, int k, const sl_prompt *p, int i)
{
	gen_job *c = (gen_job *)j;
	c->len[k] = 0;
	c->stop_at[k] = -1;
	c->seqs[k] = (sl_seq){ .prompt = p->ids, .prompt_len = p->n,
			       .max_new = p->max_new ? p->max_new : j->o->max_new,
			       .key = (uint64_t)i, .line = p->line, .id = p->id_json,
			       .out = c->obuf + (size_t)k * c->max_out };
}

static int gen_run(job *j, int ns)
{
	gen_job *c = (gen_job *)j;
	int rc = sl_generator_run(c->g, c->seqs, ns, &c->go, &c->tm);
	j->st->tokens = c->tm.tokens;
	j->st->prefill_s = c->tm.prefill_s;
	j->st->decode_s = c->tm.decode_s;
	return rc;
}

static int gen_emit(job *j, int k, const sl_prompt *p)
{
	gen_job *c = (gen_job *)j;
	const sl_seq *q = &c->seqs[k];
	sl_jerr e = { 0 };
	json_t *obj = line_start(p, &e);
	if (c->tok) {
		json_t *text = NULL;
		if (c->stop_at[k] >= 0) {
			text = json_text(c->txt[k], (size_t)c->stop_at[k]);
		} else {
			char *t = NULL;
			size_t tl = 0;
			int rc = sl_tokenizer_decode_ex(c->tok, q->out, (size_t)q->n_out,
							SL_TOKENIZER_SKIP_SPECIAL, &t, &tl);
			if (rc < 0) {
				json_decref(obj);
				return rc;
			}
			text = json_stringn(t, tl);
			free(t);
		}
		sl_jset(obj, "completion", text, &e);
	}
	json_t *ids = json_array();
	for (int i = 0; i < q->n_out; i++)
		sl_jappend(ids, json_integer(q->out[i]), "output_ids", &e);
	sl_jset(obj, "output_ids", ids, &e);
	sl_jset(obj, "finish_reason", json_string(q->hit_eos || q->stopped ? "stop" : "length"), &e);
	return emit(j->out, obj, &e, p);
}

static void gen_close(job *j)
{
	gen_job *c = (gen_job *)j;
	for (int i = 0; c->txt && i < j->o->batch; i++)
		free(c->txt[i]);
	free(c->txt);
	free(c->len);
	free(c->cap);
	free(c->stop_at);
	free(c->seqs);
	free(c->obuf);
	sl_generator_free(c->g);
}

static const job_kind gen_kind = { gen_open, gen_add, gen_run, gen_emit, gen_close };

int sl_job_generate(sl_model *m, const sl_tokenizer *tok, const sl_prompts *ps, sl_output *out,
		    const sl_job_opts *o, sl_job_stats *st)
{
	memset(st, 0, sizeof *st);
	if (o->nstop && !tok)
		return sl_err(SL_EUNSUPPORTED,
			      "--stop needs the model's tokenizer (tokenizer.json, or vocab.json and merges.txt)");
	gen_job c = { .j = { .m = m, .ps = ps, .out = out, .o = o, .st = st }, .tok = tok };
	return job_run(&c.j, &gen_kind);
}

/* ---- scoring ----------------------------------------------------------- */

typedef struct score_job {
	job j; /* first: the block loop's part */
	sl_scorer *sc;
	sl_score_seq *seqs;
	double *lp;
	int max_cont;
} score_job;

static int score_open(job *j)
{
	score_job *c = (score_job *)j;
	const sl_prompts *ps = j->ps;
	int max_len = 1, max_prompt = 1;
	c->max_cont = 1;
	for (int i = 0; i < ps->n; i++) {
		if (ps->p[i].error)
			continue;
		max_len = SL_MAX(max_len, ps->p[i].n + ps->p[i].ncont);
		c->max_cont = SL_MAX(c->max_cont, ps->p[i].ncont);
		max_prompt = SL_MAX(max_prompt, ps->p[i].n);
	}
	const int batch = j->o->batch;
	c->seqs = calloc((size_t)batch, sizeof *c->seqs);
	c->lp = malloc(sizeof(double) * (size_t)batch * c->max_cont);
	if (!c->seqs || !c->lp)
		return sl_err(SL_ENOMEM, "out of memory");
	return sl_scorer_create(j->m, SL_MIN(batch, ps->n), max_len, max_prompt, &c->sc);
}

static void score_add(job *j, int k, const sl_prompt *p, int i)
{
	(void)i;
	score_job *c = (score_job *)j;
	c->seqs[k] = (sl_score_seq){ .prompt = p->ids, .prompt_len = p->n, .cont = p->cont,
				     .cont_len = p->ncont, .line = p->line, .id = p->id_json,
				     .logprobs = c->lp + (size_t)k * c->max_cont };
}

static int score_run(job *j, int ns)
{
	score_job *c = (score_job *)j;
	const double t0 = sl_now();
	SL_TRY(sl_scorer_run(c->sc, c->seqs, ns, j->o->interrupt));
	j->st->decode_s += sl_now() - t0;
	return 0;
}

static int score_emit(job *j, int k, const sl_prompt *p)
{
	score_job *c = (score_job *)j;
	const sl_score_seq *q = &c->seqs[k];
	sl_jerr e = { 0 };
	json_t *obj = line_start(p, &e), *arr = json_array();
	double sum = 0;
	for (int i = 0; i < q->cont_len; i++) {
		sl_jappend_real(arr, q->logprobs[i], "logprobs", &e);
		sum += q->logprobs[i];
	}
	sl_jset(obj, "logprobs", arr, &e);
	sl_jset_real(obj, "sum_logprob", sum, &e);
	/* beyond the largest double (mean log-probability below -709.78):
	 * null, as JSON has no infinity */
	const double ppl = exp(-sum / q->cont_len);
	sl_jset(obj, "perplexity", isfinite(ppl) ? json_real(ppl) : json_null(), &e);
	j->st->tokens += q->cont_len;
	return emit(j->out, obj, &e, p);
}

static void score_close(job *j)
{
	score_job *c = (score_job *)j;
	free(c->seqs);
	free(c->lp);
	sl_scorer_free(c->sc);
}

static const job_kind score_kind = { score_open, score_add, score_run, score_emit, score_close };

int sl_job_score(sl_model *m, const sl_prompts *ps, sl_output *out, const sl_job_opts *o,
		 sl_job_stats *st)
{
	memset(st, 0, sizeof *st);
	score_job c = { .j = { .m = m, .ps = ps, .out = out, .o = o, .st = st } };
	return job_run(&c.j, &score_kind);
}

static char *stats_tmp(const char *path)
{
	char *tmp = NULL;
	return asprintf(&tmp, "%s.tmp", path) < 0 ? NULL : tmp;
}

int sl_job_check_stats_path(const char *path)
{
	struct stat sb;
	if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
		return sl_err(SL_EINVAL, "%s: is a directory (--stats names the file to write)", path);
	char *tmp = stats_tmp(path);
	if (!tmp)
		return sl_err(SL_ENOMEM, "out of memory");
	int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644), e = errno;
	if (fd >= 0) {
		close(fd);
		unlink(tmp);
	}
	free(tmp);
	if (fd < 0 && e != EEXIST)
		return sl_err(e == ENOENT || e == ENOTDIR ? SL_ENOTFOUND : SL_EIO,
			      "%s: cannot write the statistics: %s", path, strerror(e));
	return 0;
}

/* The statistics file, whole or not at all: written beside it, then
 * renamed over it. */
static int write_stats(const json_t *j, const char *path)
{
	char *tmp = stats_tmp(path);
	if (!tmp)
		return sl_err(SL_ENOMEM, "out of memory");
	FILE *f = fopen(tmp, "w");
	int e = errno;
	bool ok = f && json_dumpf(j, f, JSON_INDENT(2)) == 0 && fputc('\n', f) != EOF &&
		  fflush(f) == 0 && fsync(fileno(f)) == 0;
	if (f && !ok)
		e = errno;
	if (f && fclose(f) != 0 && ok) {
		ok = false;
		e = errno;
	}
	if (ok && rename(tmp, path) != 0) {
		ok = false;
		e = errno;
	}
	if (!ok && f)
		unlink(tmp);
	free(tmp);
	return ok ? 0 : sl_err(SL_EIO, "%s: cannot write the statistics: %s", path, strerror(e));
}

/* A prediction, or null where there is none. */
static json_t *pred_real(const sl_job_stats *st, double v)
{
	return st->predicted && isfinite(v) ? json_real(v) : json_null();
}

int sl_job_report(const sl_job_stats *st, const sl_job_opts *o, const char *command, bool quiet,
		  const char *backend)
{
	const double compute = st->prefill_s + st->decode_s;
	const double tput = compute > 0 ? st->tokens / compute : 0;
	if (!quiet)
		fprintf(stderr,
			"sluice: %s %d of %d prompt%s (%d resumed, %d bad line%s), %ld token%s in %.2f s: %.1f tokens/s (prefill %.2f s, decode %.2f s) on %s\n",
			strcmp(command, "score") ? "generated" : "scored", st->done, st->prompts,
			st->prompts == 1 ? "" : "s", st->resumed_lines, st->bad, st->bad == 1 ? "" : "s",
			st->tokens, st->tokens == 1 ? "" : "s", st->wall_s, tput, st->prefill_s,
			st->decode_s, backend);
	if (!o->stats_path)
		return 0;
	const sl_offload_stats *f = &st->off;
	sl_jerr e = { 0 };
	json_t *j = json_object(), *peak = json_object();
	sl_jset(j, "command", json_string(command), &e);
	sl_jset(j, "backend", json_string(backend), &e);
	sl_jset(j, "prompts", json_integer(st->prompts), &e);
	sl_jset(j, "done", json_integer(st->done), &e);
	sl_jset(j, "resumed_lines", json_integer(st->resumed_lines), &e);
	sl_jset(j, "bad_lines", json_integer(st->bad), &e);
	sl_jset(j, "tokens", json_integer((json_int_t)st->tokens), &e);
	sl_jset_real(j, "wall_s", st->wall_s, &e);
	sl_jset_real(j, "prefill_s", st->prefill_s, &e);
	sl_jset_real(j, "decode_s", st->decode_s, &e);
	sl_jset_real(j, "throughput_tok_s", tput, &e);
	sl_jset(j, "predicted_throughput_tok_s", pred_real(st, st->pred_tok_s), &e);
	sl_jset(j, "predicted_prefill_s", pred_real(st, st->pred_prefill_s), &e);
	sl_jset(j, "predicted_decode_s", pred_real(st, st->pred_decode_s), &e);
	sl_jset_real(j, "compute_s", f->compute_s, &e);
	sl_jset_real(j, "io_s", f->io_s, &e);
	sl_jset_real(j, "stall_s", f->stall_s, &e);
	sl_jset(j, "disk_read_bytes", json_integer((json_int_t)f->disk_read_bytes), &e);
	sl_jset_real(j, "disk_read_gbps", f->disk_read_gbps, &e);
	sl_jset(j, "disk_write_bytes", json_integer((json_int_t)f->disk_write_bytes), &e);
	sl_jset(j, "h2d_bytes", json_integer((json_int_t)f->h2d_bytes), &e);
	sl_jset(j, "d2h_bytes", json_integer((json_int_t)f->d2h_bytes), &e);
	sl_jset(peak, "device", json_integer((json_int_t)f->peak_device), &e);
	sl_jset(peak, "host", json_integer((json_int_t)f->peak_host), &e);
	sl_jset(peak, "disk", json_integer((json_int_t)f->peak_disk), &e);
	sl_jset(j, "peak_bytes", peak, &e);
	int rc = sl_jcheck(&e, o->stats_path);
	if (!rc)
		rc = write_stats(j, o->stats_path);
	json_decref(j);
	return rc;
}
