/*
 * embed.cu - y[r, :] (+)= table[idx[r], :] (backend.h).  idx is a host
 * array: it travels inside the kernel parameters, SL_CU_PARAM_INTS rows per
 * launch, so the call neither stages nor waits.
 */
#include "cuda_internal.cuh"
#include "embed_kernels.cuh"

int sl_cu_embed(sl_backend *b, sl_queue *q, int rows, int n, const sl_half *table,
		const int32_t *idx, float *y, bool accumulate)
{
	if (rows < 0 || n < 0)
		return sl_err(SL_EINVAL, "cuda embed: bad shape rows=%d n=%d", rows, n);
	if (rows == 0 || n == 0)
		return 0;
	q = sl_cu_queue(b, q);
	sl_cu_ints chunk;
	for (int r0 = 0; r0 < rows; r0 += SL_CU_PARAM_INTS) {
		const int rc = SL_MIN(rows - r0, SL_CU_PARAM_INTS);
		for (int i = 0; i < rc; i++)
			chunk.v[i] = idx[r0 + i];
		dim3 grid((unsigned)sl_cu_div_up(n, SL_EMBED_THREADS), (unsigned)rc);
		SL_CU_LAUNCH(sl_embed_kernel, grid, SL_EMBED_THREADS, 0, q->stream,
			n, (const __half *)table, chunk, y + (size_t)r0 * n, accumulate ? 1 : 0);
		SL_CU_LAUNCHED("sl_embed_kernel");
	}
	return 0;
}
