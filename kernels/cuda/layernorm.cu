/*
 * layernorm.cu - y[r, :] = layernorm(x[r, :]) * gamma + beta (backend.h).
 * One block per row; see layernorm_kernels.cuh.
 */
#include "cuda_internal.cuh"
#include "layernorm_kernels.cuh"

int sl_cu_layernorm(sl_backend *b, sl_queue *q, int rows, int n, const float *x, int ldx,
		    const sl_half *gamma, const sl_half *beta, float eps, float *y, int ldy)
{
	if (rows < 0 || n < 0 || ldx < n || ldy < n)
		return sl_err(SL_EINVAL, "cuda layernorm: bad shape rows=%d n=%d ldx=%d ldy=%d", rows,
			      n, ldx, ldy);
	if (rows == 0 || n == 0)
		return 0;
	q = sl_cu_queue(b, q);
	/* enough threads to keep a row's loads in flight, few idle ones */
	const int threads = n >= 4096 ? 512 : n >= 1024 ? 256 : 128;
	SL_CU_LAUNCH(sl_layernorm_kernel, rows, threads, 0, q->stream, n, x, ldx,
		     (const __half *)gamma, (const __half *)beta, eps, y, ldy);
	SL_CU_LAUNCHED("sl_layernorm_kernel");
	return 0;
}
