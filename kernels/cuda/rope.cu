/*
 * rope.cu - rotary position embedding of q and k rows in place
 * (backend.h's sl_rope_args).  The positions and inverse frequencies are
 * host arrays: they travel in the kernel parameters, SL_ROPE_PARAM_ROWS
 * rows per launch, so the call neither stages nor waits.
 */
#include "cuda_internal.cuh"
#include "rope_kernels.cuh"

int sl_cu_rope(sl_backend *b, sl_queue *q, const sl_rope_args *a)
{
	SL_TRY(sl_rope_check("cuda rope", a));
	const int nh_k = a->k ? a->nh_k : 0;
	if (a->rows == 0 || a->nh_q + nh_k == 0)
		return 0;
	q = sl_cu_queue(b, q);
	sl_rope_params prm;
	for (int i = 0; i < a->hd / 2; i++)
		prm.inv_freq[i] = a->inv_freq[i];
	for (int r0 = 0; r0 < a->rows; r0 += SL_ROPE_PARAM_ROWS) {
		const int rc = SL_MIN(a->rows - r0, SL_ROPE_PARAM_ROWS);
		for (int i = 0; i < rc; i++)
			prm.pos[i] = a->pos[r0 + i];
		SL_CU_LAUNCH(sl_rope_kernel, rc, SL_ROPE_THREADS, 0, q->stream, a->hd, a->nh_q, nh_k,
			     a->nh_q ? a->q + (size_t)r0 * a->ldq : a->q, a->ldq,
			     nh_k ? a->k + (size_t)r0 * a->ldk : a->k, a->ldk, prm);
		SL_CU_LAUNCHED("sl_rope_kernel");
	}
	return 0;
}
