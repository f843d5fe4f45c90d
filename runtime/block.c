/*
 * block.c - a block of sequences on a model: the part of generation and
 * scoring that is the same (block.h).
 */
#include "block.h"

#include <stdlib.h>

int sl_block_init(sl_block *b, sl_model *m, int max_seq, int max_len, int max_prompt)
{
	*b = (sl_block){ .m = m, .max_seq = max_seq, .max_len = max_len };
	if (max_len > m->cfg.max_pos)
		return sl_err(SL_ERANGE, "%d positions needed, the model has %d", max_len,
			      m->cfg.max_pos);
	SL_TRY(sl_model_check_length(&m->cfg, max_len));
	b->padded = malloc(sizeof(int32_t) * (size_t)max_seq * max_len);
	b->npad = malloc(sizeof(int) * (size_t)max_seq);
	int rc = 0;
	if (!b->padded || !b->npad)
		rc = sl_err(SL_ENOMEM, "out of memory");
	if (!rc)
		rc = sl_kv_make(&m->kv_env, max_seq, max_prompt, max_len, &b->kv);
	if (!rc)
		rc = sl_model_reserve(m, max_seq, max_seq * max_len);
	if (rc)
		sl_block_release(b);
	return rc;
}

void sl_block_release(sl_block *b)
{
	sl_kv_free(b->kv);
	free(b->padded);
	free(b->npad);
	*b = (sl_block){ 0 };
}

void sl_block_pad(sl_block *b, int s, int t, const int32_t *prompt, int len)
{
	const int npad = t - len;
	int32_t *row = b->padded + (size_t)s * t;
	b->npad[s] = npad;
	for (int j = 0; j < t; j++)
		row[j] = j < npad ? b->m->cfg.pad_id : prompt[j - npad];
}

int sl_block_prefill(sl_block *b, int nseq, int t)
{
	b->kv->nseq = nseq;
	return sl_model_prefill(b->m, b->kv, b->padded, b->npad, t, NULL);
}
