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
 */
#include "job.h"
#include "generate.h"
#include "score.h"

#include <jansson.h>
#include <math.h>
#include <string.h>
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
		fprintf(stderr, "sluice: %d/%d prompts, %ld tokens, %.1f tok/s, ETA %s\n", p->done, p->total,
			p->tokens, rate, eta);
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

static int n_blocks(const sl_prompts *ps, int batch)
{
	return (ps->n + batch - 1) / batch;
}

static bool mine(const sl_job_opts *o, int b)
{
	return o->shard_n <= 1 || b % o->shard_n == o->shard_k;
}

/* The first block still to do, after keeping the whole blocks already in
 * OUT.partial. */
static int resume_point(const sl_prompts *ps, sl_output *out, const sl_job_opts *o, int *lines)
{
	int n = 0;
	char **ids = NULL;
	off_t *ends = NULL;
	*lines = 0;
	SL_TRY(sl_output_lines(out, &n, &ids, &ends));
	int line = 0, start = 0;
	off_t keep = 0;
	for (int b = 0; b < n_blocks(ps, o->batch); b++) {
		if (!mine(o, b))
			continue;
		int first = b * o->batch, count = SL_MIN(o->batch, ps->n - first);
		if (line + count > n)
			break;
		for (int i = 0; i < count; i++)
			if (strcmp(ids[line + i], ps->p[first + i].id_json))
				return sl_err(SL_EINVAL,
					      "%s.partial: line %d has id %s where this input has %s: it is from another job (use --overwrite to start again)",
					      sl_output_path(out), line + i + 1, ids[line + i],
					      ps->p[first + i].id_json);
		line += count;
		keep = ends[line - 1];
		start = b + 1;
	}
	SL_TRY(sl_output_truncate(out, keep));
	*lines = line;
	return start;
}

static int shard_prompts(const sl_prompts *ps, const sl_job_opts *o)
{
	int total = 0;
	for (int b = 0; b < n_blocks(ps, o->batch); b++)
		if (mine(o, b))
			total += SL_MIN(o->batch, ps->n - b * o->batch);
	return total;
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

static int emit(sl_output *out, json_t *obj)
{
	char *s = json_dumps(obj, JSON_COMPACT);
	json_decref(obj);
	if (!s)
		return sl_err(SL_ENOMEM, "out of memory");
	int rc = sl_output_write(out, s, strlen(s));
	free(s);
	return rc;
}

static json_t *line_start(const sl_prompt *p)
{
	json_t *obj = json_object();
	json_object_set_new(obj, "id", json_loads(p->id_json, JSON_DECODE_ANY, NULL));
	return obj;
}

static int emit_error(sl_output *out, const sl_prompt *p)
{
	json_t *obj = line_start(p);
	json_object_set_new(obj, "error", json_string(p->error));
	return emit(out, obj);
}

/* Replace bytes that are not well-formed UTF-8 by U+FFFD (in place into
 * dst, which has room for 3 * n + 1 bytes). */
static size_t utf8_sanitize(const unsigned char *s, size_t n, char *dst)
{
	size_t o = 0;
	for (size_t i = 0; i < n;) {
		unsigned c = s[i];
		size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
		bool ok = len > 0 && i + len <= n;
		for (size_t k = 1; ok && k < len; k++)
			ok = (s[i + k] & 0xc0) == 0x80;
		if (ok && len > 1) {
			uint32_t cp = c & (0x7f >> len);
			for (size_t k = 1; k < len; k++)
				cp = (cp << 6) | (s[i + k] & 0x3f);
			ok = cp >= (len == 2 ? 0x80u : len == 3 ? 0x800u : 0x10000u) && cp <= 0x10ffff &&
			     !(cp >= 0xd800 && cp <= 0xdfff);
		}
		if (ok) {
			memcpy(dst + o, s + i, len);
			o += len;
			i += len;
		} else {
			memcpy(dst + o, "\xef\xbf\xbd", 3);
			o += 3;
			i++;
		}
	}
	dst[o] = 0;
	return o;
}

/* ---- generation -------------------------------------------------------- */

typedef struct gen_ctx {
	const sl_tokenizer *tok;
	const sl_job_opts *o;
	progress *prog;
	long tokens_before;
	/* per sequence of the block: the text so far (stop texts only) */
	char **txt;
	size_t *len, *cap;
	long *stop_at;
} gen_ctx;

static bool on_token(void *vctx, int s, sl_seq *seq)
{
	gen_ctx *c = vctx;
	if (!c->o->nstop)
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
	for (int k = 0; k < c->o->nstop; k++) {
		size_t sl = strlen(c->o->stop[k]);
		size_t from = c->len[s] >= n + sl ? c->len[s] - n - sl + 1 : 0;
		const char *hit = memmem(c->txt[s] + from, c->len[s] - from, c->o->stop[k], sl);
		if (hit) {
			c->stop_at[s] = hit - c->txt[s];
			return true;
		}
	}
	return false;
}

static void on_step(void *vctx, long tokens)
{
	gen_ctx *c = vctx;
	c->prog->tokens = c->tokens_before + tokens;
	progress_show(c->prog, false);
}

static int emit_generation(sl_output *out, const sl_tokenizer *tok, const sl_prompt *p,
			   const sl_seq *q, const gen_ctx *c, int s)
{
	json_t *obj = line_start(p);
	if (tok) {
		char *text = NULL;
		size_t tl = 0;
		if (c->stop_at[s] >= 0) {
			text = malloc(3 * (size_t)c->stop_at[s] + 1);
			if (text)
				tl = utf8_sanitize((const unsigned char *)c->txt[s], (size_t)c->stop_at[s], text);
		} else if (sl_tokenizer_decode_ex(tok, q->out, (size_t)q->n_out, SL_TOKENIZER_SKIP_SPECIAL,
						  &text, &tl) < 0) {
			text = NULL;
		}
		if (!text) {
			json_decref(obj);
			return sl_err(SL_ENOMEM, "out of memory");
		}
		json_object_set_new(obj, "completion", json_stringn(text, tl));
		free(text);
	}
	json_t *ids = json_array();
	for (int j = 0; j < q->n_out; j++)
		json_array_append_new(ids, json_integer(q->out[j]));
	json_object_set_new(obj, "output_ids", ids);
	json_object_set_new(obj, "finish_reason",
			    json_string(q->hit_eos || q->stopped ? "stop" : "length"));
	return emit(out, obj);
}

int sl_job_generate(sl_model *m, const sl_tokenizer *tok, const sl_prompts *ps, sl_output *out,
		    const sl_job_opts *o, sl_job_stats *st)
{
	memset(st, 0, sizeof *st);
	if (o->nstop && !tok)
		return sl_err(SL_EUNSUPPORTED,
			      "--stop needs the model's tokenizer (vocab.json and merges.txt)");
	int max_len = 1, max_out = 1, max_prompt = 1;
	for (int i = 0; i < ps->n; i++) {
		if (ps->p[i].error)
			continue;
		int want = ps->p[i].max_new ? ps->p[i].max_new : o->max_new;
		max_len = SL_MAX(max_len, ps->p[i].n + want);
		max_out = SL_MAX(max_out, want);
		max_prompt = SL_MAX(max_prompt, ps->p[i].n);
	}
	const int batch = o->batch;
	progress prog;
	const int start = job_start(ps, out, o, st, &prog);
	if (start < 0)
		return start;
	sl_generator *g = NULL;
	sl_seq *seqs = calloc((size_t)batch, sizeof *seqs);
	int32_t *obuf = malloc(sizeof(int32_t) * (size_t)batch * max_out);
	gen_ctx c = { .tok = tok, .o = o, .prog = &prog };
	c.txt = calloc((size_t)batch, sizeof *c.txt);
	c.len = calloc((size_t)batch, sizeof *c.len);
	c.cap = calloc((size_t)batch, sizeof *c.cap);
	c.stop_at = calloc((size_t)batch, sizeof *c.stop_at);
	int rc = 0;
	if (!seqs || !obuf || !c.txt || !c.len || !c.cap || !c.stop_at)
		rc = sl_err(SL_ENOMEM, "out of memory");
	if (!rc)
		rc = sl_generator_create(m, SL_MIN(batch, ps->n), max_len, max_prompt, &g);
	sl_gen_opts go = { .sampling = &o->sampling, .on_token = on_token, .on_step = on_step,
			   .ctx = &c, .interrupt = o->interrupt };
	sl_gen_timing tm = { 0 };
	const double t0 = sl_now();
	sl_model_stats_reset(m);
	for (int b = start; !rc && b < n_blocks(ps, batch); b++) {
		if (!mine(o, b))
			continue;
		if (o->interrupt && *o->interrupt) {
			rc = sl_err(SL_EINTERRUPTED, "interrupted");
			break;
		}
		const int first = b * batch, count = SL_MIN(batch, ps->n - first);
		int ns = 0;
		for (int i = 0; i < count; i++) {
			const sl_prompt *p = &ps->p[first + i];
			if (p->error)
				continue;
			c.len[ns] = 0;
			c.stop_at[ns] = -1;
			seqs[ns] = (sl_seq){ .prompt = p->ids, .prompt_len = p->n,
					     .max_new = p->max_new ? p->max_new : o->max_new,
					     .key = (uint64_t)(first + i),
					     .out = obuf + (size_t)ns * max_out };
			ns++;
		}
		c.tokens_before = tm.tokens;
		if (ns && (rc = sl_generator_run(g, seqs, ns, &go, &tm)) < 0)
			break;
		for (int i = 0, k = 0; !rc && i < count; i++) {
			const sl_prompt *p = &ps->p[first + i];
			if (p->error) {
				rc = emit_error(out, p);
				st->bad++;
			} else {
				rc = emit_generation(out, tok, p, &seqs[k], &c, k);
				k++;
			}
		}
		if (!rc)
			rc = sl_output_sync(out);
		prog.done += count;
		st->done = prog.done;
		progress_show(&prog, false);
		test_delay();
	}
	progress_end(&prog);
	st->tokens = tm.tokens;
	st->prefill_s = tm.prefill_s;
	st->decode_s = tm.decode_s;
	st->wall_s = sl_now() - t0;
	sl_model_stats(m, st->prefill_s + st->decode_s, &st->off);
	if (!rc)
		rc = sl_output_commit(out);
	for (int i = 0; c.txt && i < batch; i++)
		free(c.txt[i]);
	free(c.txt);
	free(c.len);
	free(c.cap);
	free(c.stop_at);
	free(seqs);
	free(obuf);
	sl_generator_free(g);
	return rc;
}

/* ---- scoring ----------------------------------------------------------- */

int sl_job_score(sl_model *m, const sl_prompts *ps, sl_output *out, const sl_job_opts *o,
		 sl_job_stats *st)
{
	memset(st, 0, sizeof *st);
	int max_len = 1, max_cont = 1, max_prompt = 1;
	for (int i = 0; i < ps->n; i++) {
		if (ps->p[i].error)
			continue;
		max_len = SL_MAX(max_len, ps->p[i].n + ps->p[i].ncont);
		max_cont = SL_MAX(max_cont, ps->p[i].ncont);
		max_prompt = SL_MAX(max_prompt, ps->p[i].n);
	}
	const int batch = o->batch;
	progress prog;
	const int start = job_start(ps, out, o, st, &prog);
	if (start < 0)
		return start;
	sl_scorer *sc = NULL;
	sl_score_seq *seqs = calloc((size_t)batch, sizeof *seqs);
	double *lp = malloc(sizeof(double) * (size_t)batch * max_cont);
	int rc = (!seqs || !lp) ? sl_err(SL_ENOMEM, "out of memory") : 0;
	if (!rc)
		rc = sl_scorer_create(m, SL_MIN(batch, ps->n), max_len, max_prompt, &sc);
	const double t0 = sl_now();
	sl_model_stats_reset(m);
	for (int b = start; !rc && b < n_blocks(ps, batch); b++) {
		if (!mine(o, b))
			continue;
		if (o->interrupt && *o->interrupt) {
			rc = sl_err(SL_EINTERRUPTED, "interrupted");
			break;
		}
		const int first = b * batch, count = SL_MIN(batch, ps->n - first);
		int ns = 0;
		for (int i = 0; i < count; i++) {
			const sl_prompt *p = &ps->p[first + i];
			if (p->error)
				continue;
			seqs[ns] = (sl_score_seq){ .prompt = p->ids, .prompt_len = p->n, .cont = p->cont,
						   .cont_len = p->ncont,
						   .logprobs = lp + (size_t)ns * max_cont };
			ns++;
		}
		double tb = sl_now();
		if (ns && (rc = sl_scorer_run(sc, seqs, ns, o->interrupt)) < 0)
			break;
		st->decode_s += sl_now() - tb;
		for (int i = 0, k = 0; !rc && i < count; i++) {
			const sl_prompt *p = &ps->p[first + i];
			if (p->error) {
				rc = emit_error(out, p);
				st->bad++;
				continue;
			}
			json_t *obj = line_start(p), *arr = json_array();
			double sum = 0;
			for (int j = 0; j < seqs[k].cont_len; j++) {
				json_array_append_new(arr, json_real(seqs[k].logprobs[j]));
				sum += seqs[k].logprobs[j];
			}
			json_object_set_new(obj, "logprobs", arr);
			json_object_set_new(obj, "sum_logprob", json_real(sum));
			json_object_set_new(obj, "perplexity", json_real(exp(-sum / seqs[k].cont_len)));
			st->tokens += seqs[k].cont_len;
			rc = emit(out, obj);
			k++;
		}
		if (!rc)
			rc = sl_output_sync(out);
		prog.done += count;
		prog.tokens = st->tokens;
		st->done = prog.done;
		progress_show(&prog, false);
		test_delay();
	}
	progress_end(&prog);
	st->wall_s = sl_now() - t0;
	sl_model_stats(m, st->prefill_s + st->decode_s, &st->off);
	if (!rc)
		rc = sl_output_commit(out);
	free(seqs);
	free(lp);
	sl_scorer_free(sc);
	return rc;
}

int sl_job_report(const sl_job_stats *st, const sl_job_opts *o, const char *what, bool quiet,
		  const char *backend)
{
	const double compute = st->prefill_s + st->decode_s;
	const double tput = compute > 0 ? st->tokens / compute : 0;
	if (!quiet)
		fprintf(stderr,
			"sluice: %s %d of %d prompts (%d resumed, %d bad lines), %ld tokens in %.2f s: %.1f tokens/s (prefill %.2f s, decode %.2f s) on %s\n",
			what, st->done, st->prompts, st->resumed_lines, st->bad, st->tokens, st->wall_s, tput,
			st->prefill_s, st->decode_s, backend);
	if (!o->stats_path)
		return 0;
	json_t *j = json_pack("{s:s, s:s, s:i, s:i, s:i, s:i, s:I, s:f, s:f, s:f, s:f}", "command", what,
			      "backend", backend, "prompts", st->prompts, "done", st->done,
			      "resumed_lines", st->resumed_lines, "bad_lines", st->bad, "tokens",
			      (json_int_t)st->tokens, "wall_s", st->wall_s, "prefill_s", st->prefill_s,
			      "decode_s", st->decode_s, "throughput_tok_s", tput);
	if (!j)
		return sl_err(SL_ENOMEM, "out of memory");
	const sl_offload_stats *f = &st->off;
	json_t *peak = json_pack("{s:I, s:I, s:I}", "device", (json_int_t)f->peak_device, "host",
				 (json_int_t)f->peak_host, "disk", (json_int_t)f->peak_disk);
	if (!peak || json_object_update_new(j, json_pack("{s:f, s:f, s:f, s:I, s:f, s:I, s:I, s:I, s:o}",
						 "compute_s", f->compute_s, "io_s", f->io_s, "stall_s",
						 f->stall_s, "disk_read_bytes",
						 (json_int_t)f->disk_read_bytes, "disk_read_gbps",
						 f->disk_read_gbps, "disk_write_bytes",
						 (json_int_t)f->disk_write_bytes, "h2d_bytes",
						 (json_int_t)f->h2d_bytes, "d2h_bytes",
						 (json_int_t)f->d2h_bytes, "peak_bytes", peak)) < 0) {
		json_decref(j);
		return sl_err(SL_ENOMEM, "out of memory");
	}
	int rc = json_dump_file(j, o->stats_path, JSON_INDENT(2)) == 0
			 ? 0
			 : sl_err(SL_EIO, "%s: cannot write the statistics", o->stats_path);
	json_decref(j);
	return rc;
}
