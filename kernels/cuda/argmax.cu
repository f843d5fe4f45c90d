/*
 * argmax.cu - out[r] = the smallest index of the maximum of row r, -1 for a
 * row that is not all finite (backend.h); out is a host array and the call
 * waits for it.
 */
#include "cuda_internal.cuh"
#include "argmax_kernels.cuh"

int sl_cu_argmax(sl_backend *b, sl_queue *q, int rows, int n, const float *x, int ldx,
		 int32_t *out)
{
	if (rows < 0 || n < 0 || ldx < n)
		return sl_err(SL_EINVAL, "cuda argmax: bad shape rows=%d n=%d ldx=%d", rows, n, ldx);
	if (rows == 0)
		return 0;
	q = sl_cu_queue(b, q);
	SL_TRY(sl_cu_scratch_reserve(b, q, &q->small, (size_t)rows * sizeof(int32_t),
				     "argmax scratch"));
	int *dout = (int *)q->small.p;
	SL_CU_LAUNCH(sl_argmax_kernel, rows, SL_ARGMAX_THREADS, 0, q->stream, n, x, ldx, dout);
	SL_CU_LAUNCHED("sl_argmax_kernel");
	SL_CU(cudaMemcpyAsync(out, dout, (size_t)rows * sizeof(int32_t), cudaMemcpyDeviceToHost,
			      q->stream));
	SL_CU(cudaStreamSynchronize(q->stream));
	return 0;
}
