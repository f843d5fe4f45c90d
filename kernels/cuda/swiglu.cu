/*
 * swiglu.cu - out[r, i] = silu(gate[r, i]) * up[r, i] (backend_ops.def).
 */
#include "cuda_internal.cuh"
#include "swiglu_kernels.cuh"

int sl_cu_swiglu(sl_backend *b, sl_queue *q, int rows, int n, const float *gate, int ldg,
		 const float *up, int ldu, float *out, int ldo)
{
	if (rows < 0 || n < 0 || ldg < n || ldu < n || ldo < n)
		return sl_err(SL_EINVAL, "cuda swiglu: bad shape rows=%d n=%d ldg=%d ldu=%d ldo=%d",
			      rows, n, ldg, ldu, ldo);
	if (rows == 0 || n == 0)
		return 0;
	q = sl_cu_queue(b, q);
	/* enough blocks to fill any GPU; the loop strides over the rest */
	const int blocks = (int)SL_MIN(sl_cu_div_up((long long)rows * n, SL_SWIGLU_THREADS), 8192);
	SL_CU_LAUNCH(sl_swiglu_kernel, blocks, SL_SWIGLU_THREADS, 0, q->stream, rows, n, gate, ldg,
		     up, ldu, out, ldo);
	SL_CU_LAUNCHED("sl_swiglu_kernel");
	return 0;
}
