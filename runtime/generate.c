/*
 * generate.c - the generation loop over one block of sequences.
 *
 * A sequence that has finished (EOS, stop text or its own limit) stays in
 * the batch until the block ends, but is frozen: its cache length and
 * position are rolled back after every step (sl_kv_rollback), so it
 * neither grows nor runs past the model's positions, and its output is not
 * extended.
 * Greedy choice runs on the backend (argmax); sampling copies the logits
 * of the block to the host and draws there, per sequence.
 */
#include "generate.h"
#include "block.h"
#include "kvcache.h"

#include <string.h>

struct sl_generator {
	sl_block b;
	int32_t *next;
	bool *running, *was_running;
	/* the end tokens (Llama 3.1's config lists several; OPT has one), or
	 * none to run every sequence to its limit */
	int stop_ids[SL_LLAMA_MAX_EOS];
	int nstop;
	float *logits; /* host (max_seq, vocab), for sampling */
	sl_sample_ws ws;
};

int sl_generator_create(sl_model *m, int max_seq, int max_len, int max_prompt,
			sl_generator **out)
{
	*out = NULL;
	sl_generator *g = calloc(1, sizeof *g);
	if (!g)
		return sl_err(SL_ENOMEM, "out of memory");
	int rc = sl_block_init(&g->b, m, max_seq, max_len, max_prompt);
	if (rc < 0) {
		free(g);
		return rc;
	}
	if (m->cfg.family == SL_FAMILY_LLAMA) {
		g->nstop = m->cfg.llama.n_eos;
		memcpy(g->stop_ids, m->cfg.llama.eos_id, sizeof(int) * (size_t)g->nstop);
	} else if (m->cfg.eos_id >= 0) {
		g->nstop = 1;
		g->stop_ids[0] = m->cfg.eos_id;
	}
	g->next = malloc((size_t)max_seq * sizeof(int32_t));
	g->running = malloc((size_t)max_seq * sizeof(bool));
	g->was_running = malloc((size_t)max_seq * sizeof(bool));
	if (!g->next || !g->running || !g->was_running) {
		sl_generator_free(g);
		return sl_err(SL_ENOMEM, "out of memory");
	}
	*out = g;
	return 0;
}

void sl_generator_free(sl_generator *g)
{
	if (!g)
		return;
	sl_block_release(&g->b);
	free(g->next);
	free(g->running);
	free(g->was_running);
	free(g->logits);
	sl_sample_ws_free(&g->ws);
	free(g);
}

void sl_generator_ignore_eos(sl_generator *g)
{
	g->nstop = 0;
}

/* The next token of every running sequence, into g->next; logits that
 * are not finite (the argmax and the sampler give -1) fail the block. */
static int choose(sl_generator *g, sl_seq *seqs, int nseq, const sl_sampling *sp)
{
	sl_model *m = g->b.m;
	const int v = m->cfg.vocab;
	if (!sp || sp->temperature <= 0.0f) {
		SL_TRY(sl_model_argmax(m, nseq, g->next));
	} else {
		if (!g->logits) {
			g->logits = malloc(sizeof(float) * (size_t)g->b.max_seq * v);
			if (!g->logits)
				return sl_err(SL_ENOMEM, "out of memory");
			SL_TRY(sl_sample_ws_init(&g->ws, v));
		}
		SL_TRY(sl_model_logits(m, nseq, g->logits));
		for (int s = 0; s < nseq; s++)
			if (g->running[s])
				g->next[s] = sl_sample(g->logits + (size_t)s * v, v, sp, seqs[s].key,
						       (uint64_t)seqs[s].n_out, &g->ws);
	}
	for (int s = 0; s < nseq; s++)
		if (g->running[s] && (g->next[s] < 0 || g->next[s] >= v))
			return sl_model_nonfinite_err(seqs[s].line, seqs[s].id, s, seqs[s].n_out,
						      "new token");
	return 0;
}

/* Append each running sequence's next token; returns how many still run. */
static int take(sl_generator *g, sl_seq *seqs, int nseq, const sl_gen_opts *o, long *tokens)
{
	int left = 0;
	for (int s = 0; s < nseq; s++) {
		if (!g->running[s])
			continue;
		sl_seq *q = &seqs[s];
		q->out[q->n_out++] = g->next[s];
		(*tokens)++;
		for (int k = 0; k < g->nstop; k++)
			if (g->next[s] == g->stop_ids[k])
				q->hit_eos = true;
		if (!q->hit_eos && o && o->on_token && o->on_token(o->ctx, s, q))
			q->stopped = true;
		if (q->hit_eos || q->stopped || q->n_out >= q->max_new)
			g->running[s] = false;
		else
			left++;
	}
	return left;
}

int sl_generator_run(sl_generator *g, sl_seq *seqs, int nseq, const sl_gen_opts *opts,
		     sl_gen_timing *timing)
{
	sl_block *b = &g->b;
	if (nseq <= 0 || nseq > b->max_seq)
		return sl_err(SL_EINVAL, "block of %d sequences (room for %d)", nseq, b->max_seq);
	int t = 0;
	for (int s = 0; s < nseq; s++) {
		if (seqs[s].prompt_len <= 0 || seqs[s].max_new <= 0)
			return sl_err(SL_EINVAL, "sequence %d: empty prompt or no new tokens", s);
		if (seqs[s].prompt_len + seqs[s].max_new > b->max_len ||
		    (b->kv->h2o && seqs[s].prompt_len > b->kv->scratch_cap))
			return sl_err(SL_ERANGE, "sequence %d: %d prompt + %d new tokens exceed %d", s,
				      seqs[s].prompt_len, seqs[s].max_new, b->max_len);
		t = SL_MAX(t, seqs[s].prompt_len);
	}
	const sl_sampling *sp = opts ? opts->sampling : NULL;
	sl_model *m = b->m;
	sl_kv *kv = b->kv;
	bool *running = g->running, *was_running = g->was_running;
	for (int s = 0; s < nseq; s++) {
		sl_block_pad(b, s, t, seqs[s].prompt, seqs[s].prompt_len);
		seqs[s].n_out = 0;
		seqs[s].hit_eos = seqs[s].stopped = false;
		running[s] = true;
	}
	double t0 = sl_now();
	SL_TRY(sl_block_prefill(b, nseq, t));
	SL_TRY(choose(g, seqs, nseq, sp));
	int left = take(g, seqs, nseq, opts, &timing->tokens);
	double t1 = sl_now();
	timing->prefill_s += t1 - t0;
	if (opts && opts->on_step)
		opts->on_step(opts->ctx, timing->tokens);
	while (left > 0) {
		if (opts && opts->interrupt && *opts->interrupt) {
			timing->decode_s += sl_now() - t1;
			return sl_err(SL_EINTERRUPTED, "interrupted");
		}
		memcpy(was_running, running, (size_t)nseq * sizeof *running);
		SL_TRY(sl_model_decode(m, kv, g->next));
		for (int s = 0; s < nseq; s++)
			if (!was_running[s]) /* frozen: undo the step */
				SL_TRY(sl_kv_rollback(kv, s));
		SL_TRY(choose(g, seqs, nseq, sp));
		left = take(g, seqs, nseq, opts, &timing->tokens);
		timing->steps++;
		if (opts && opts->on_step)
			opts->on_step(opts->ctx, timing->tokens);
	}
	timing->decode_s += sl_now() - t1;
	return 0;
}
