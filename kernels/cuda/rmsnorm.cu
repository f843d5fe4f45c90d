/*
 * rmsnorm.cu - y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * gamma
 * (backend_ops.def).  One block per row; see rmsnorm_kernels.cuh.
 */
#include "cuda_internal.cuh"
#include "rmsnorm_kernels.cuh"

int sl_cu_rmsnorm(sl_backend *b, sl_queue *q, int rows, int n, const float *x, int ldx,
		  const sl_half *gamma, float eps, float *y, int ldy)
{
	if (rows < 0 || n < 0 || ldx < n || ldy < n)
		return sl_err(SL_EINVAL, "cuda rmsnorm: bad shape rows=%d n=%d ldx=%d ldy=%d", rows, n,
			      ldx, ldy);
	if (rows == 0 || n == 0)
		return 0;
	q = sl_cu_queue(b, q);
	/* enough threads to keep a row's loads in flight, few idle ones */
	const int threads = n >= 4096 ? 512 : n >= 1024 ? 256 : 128;
	SL_CU_LAUNCH(sl_rmsnorm_kernel, rows, threads, 0, q->stream, n, x, ldx,
		     (const __half *)gamma, eps, y, ldy);
	SL_CU_LAUNCHED("sl_rmsnorm_kernel");
	return 0;
}
