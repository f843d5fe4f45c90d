/*
 * score.c - teacher-forced log-probabilities over the generation path.
 */
#include "score.h"
#include "block.h"
#include "kvcache.h"

#include <math.h>
#include <string.h>

struct sl_scorer {
	sl_block b;
	int32_t *feed;
	float *logits;
};

int sl_scorer_create(sl_model *m, int max_seq, int max_len, int max_prompt, sl_scorer **out)
{
	*out = NULL;
	sl_scorer *sc = calloc(1, sizeof *sc);
	if (!sc)
		return sl_err(SL_ENOMEM, "out of memory");
	int rc = sl_block_init(&sc->b, m, max_seq, max_len, max_prompt);
	if (rc < 0) {
		free(sc);
		return rc;
	}
	sc->feed = malloc(sizeof(int32_t) * (size_t)max_seq);
	sc->logits = malloc(sizeof(float) * (size_t)max_seq * m->cfg.vocab);
	if (!sc->feed || !sc->logits) {
		sl_scorer_free(sc);
		return sl_err(SL_ENOMEM, "out of memory");
	}
	*out = sc;
	return 0;
}

void sl_scorer_free(sl_scorer *sc)
{
	if (!sc)
		return;
	sl_block_release(&sc->b);
	free(sc->feed);
	free(sc->logits);
	free(sc);
}

/* log softmax(x)[i] in double precision; NaN where x is not all finite */
static double log_prob(const float *x, int n, int32_t i)
{
	float mx = x[0];
	bool finite = true;
	for (int j = 0; j < n; j++) {
		finite &= isfinite(x[j]);
		mx = x[j] > mx ? x[j] : mx;
	}
	if (!finite)
		return NAN;
	double sum = 0;
	for (int j = 0; j < n; j++)
		sum += exp((double)x[j] - mx);
	return (double)x[i] - mx - log(sum);
}

int sl_scorer_run(sl_scorer *sc, sl_score_seq *seqs, int nseq, volatile sig_atomic_t *interrupt)
{
	sl_block *b = &sc->b;
	if (nseq <= 0 || nseq > b->max_seq)
		return sl_err(SL_EINVAL, "block of %d sequences (room for %d)", nseq, b->max_seq);
	sl_model *m = b->m;
	const int v = m->cfg.vocab;
	int t = 0, steps = 0;
	for (int s = 0; s < nseq; s++) {
		if (seqs[s].prompt_len <= 0 || seqs[s].cont_len <= 0 ||
		    seqs[s].prompt_len + seqs[s].cont_len > b->max_len)
			return sl_err(SL_EINVAL, "score: sequence %d does not fit", s);
		t = SL_MAX(t, seqs[s].prompt_len);
		steps = SL_MAX(steps, seqs[s].cont_len);
	}
	for (int s = 0; s < nseq; s++)
		sl_block_pad(b, s, t, seqs[s].prompt, seqs[s].prompt_len);
	SL_TRY(sl_block_prefill(b, nseq, t));
	for (int j = 0; j < steps; j++) {
		/* logits now predict continuation token j */
		SL_TRY(sl_model_logits(m, nseq, sc->logits));
		for (int s = 0; s < nseq; s++) {
			if (j >= seqs[s].cont_len)
				continue;
			seqs[s].logprobs[j] = log_prob(sc->logits + (size_t)s * v, v, seqs[s].cont[j]);
			if (isnan(seqs[s].logprobs[j]))
				return sl_model_nonfinite_err(seqs[s].line, seqs[s].id, s, j,
							      "continuation token");
		}
		if (j + 1 == steps)
			break;
		if (interrupt && *interrupt)
			return sl_err(SL_EINTERRUPTED, "interrupted");
		for (int s = 0; s < nseq; s++)
			sc->feed[s] = seqs[s].cont[SL_MIN(j, seqs[s].cont_len - 1)];
		SL_TRY(sl_model_decode(m, b->kv, sc->feed));
		for (int s = 0; s < nseq; s++)
			if (j + 1 >= seqs[s].cont_len) /* finished: frozen */
				SL_TRY(sl_kv_rollback(b->kv, s));
	}
	return 0;
}
