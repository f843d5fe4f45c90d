/*
 * gemm.cu - y[m, n] (+)= act(alpha * (x[m, k] w[n, k]^T + bias[n])) on the
 * GPU (backend.h, sl_gemm_args).
 *
 * cuBLAS has no fp32 x fp16 product, so x is first narrowed to fp16 in a
 * per-queue scratch buffer; cublasGemmEx then runs fp16 x fp16 with fp32
 * accumulation (CUBLAS_COMPUTE_32F, tensor cores) and fp32 output.  Seen
 * column-major, row-major y (m, n) with stride ldy is y^T (n, m) with
 * leading dimension ldy, so
 *     y^T = alpha * w * x16^T   ->  gemm(T, N, n, m, k, w (ld k), x16 (ld k))
 * The output goes straight into y where it can:
 *   no ReLU:       cuBLAS writes y with beta = accum, the epilogue adds
 *                  alpha * bias (skipped without bias);
 *   ReLU, no accum: cuBLAS writes y, the epilogue adds the bias and clamps;
 *   ReLU + accum:  cuBLAS writes a scratch product, the epilogue adds
 *                  relu(product + alpha * bias) into y.
 * The scratch is capped (sl_cuda_ctx.scratch_max, 64 MiB): a large m runs as chunks of
 * rows through the same buffer, in order on the queue.
 *
 * 4-bit weights (a->wq, common/sl_q4.h): up to SL_GEMM_Q4_FUSED_M rows of x
 * (decode) run one fused kernel that dequantises in registers and reads
 * the 4.5-bit weights once (gemm_kernels.cuh); more rows dequantise panels
 * of weight rows to fp16 in the scratch (half of it at most) and run the
 * cuBLAS path above on each panel, so the fp16 weights never exist whole.
 */
#include "cuda_internal.cuh"
#include "gemm_kernels.cuh"

static int sl_cu_epilogue(cudaStream_t st, int m, int n, const float *src, long long lds,
			  const sl_half *bias, float alpha, int relu, int accum, float *y,
			  long long ldy)
{
	dim3 grid((unsigned)sl_cu_div_up(n, SL_GEMM_EW_THREADS), (unsigned)SL_MIN(m, 65535));
	SL_CU_LAUNCH(sl_gemm_epilogue_kernel, grid, SL_GEMM_EW_THREADS, 0, st,
		m, n, src, lds, (const __half *)bias, alpha, relu, accum, y, ldy);
	SL_CU_LAUNCHED("sl_gemm_epilogue_kernel");
	return 0;
}

/* 4-bit weights: the fused kernel for decode-sized m, else panels of
 * weight rows dequantised to fp16 and cuBLAS (see the top). */
static int sl_cu_gemm_q4(sl_backend *b, sl_queue *q, const sl_gemm_args *a, float alpha, int relu,
			 int accum)
{
	const int m = a->m, n = a->n, k = a->k;
	cudaStream_t st = q->stream;
	const unsigned char *wq = (const unsigned char *)a->wq;
	if (m <= SL_GEMM_Q4_FUSED_M) {
		const int warps = SL_GEMM_Q4_THREADS / 32;
		SL_CU_LAUNCH(sl_gemm_q4_fused_kernel, sl_cu_div_up(n, warps), SL_GEMM_Q4_THREADS, 0,
			     st, m, n, k, a->x, (long long)a->ldx, wq, (const __half *)a->bias, alpha,
			     relu, accum, a->y, (long long)a->ldy);
		SL_CU_LAUNCHED("sl_gemm_q4_fused_kernel");
		return 0;
	}
	const size_t smax = sl_cu_ctx(b)->scratch_max;
	const size_t w_row = (size_t)k * sizeof(__half);
	/* a panel of weight rows in half the scratch (a multiple of 64 rows
	 * where it can), the x chunk and product rows in the other half */
	size_t nb = (smax / 2) / w_row;
	if (nb >= (size_t)n)
		nb = (size_t)n;
	else if (nb > 64)
		nb &= ~(size_t)63;
	if (nb < 1)
		nb = 1;
	const int use_tmp = relu && accum;
	const size_t x_row = (size_t)k * sizeof(__half);
	const size_t p_row = use_tmp ? nb * sizeof(float) : 0;
	size_t chunk = (smax / 2) / (x_row + p_row + 256);
	if (chunk < 1)
		chunk = 1;
	if (chunk >= (size_t)m)
		chunk = (size_t)m;
	else if (chunk > 64)
		chunk &= ~(size_t)63;
	const size_t w_bytes = (nb * w_row + 255) & ~(size_t)255;
	const size_t x_bytes = (chunk * x_row + 255) & ~(size_t)255;
	SL_TRY(sl_cu_scratch_reserve(b, q, &q->gemm, w_bytes + x_bytes + chunk * p_row,
				     "gemm scratch"));
	__half *w16 = (__half *)q->gemm.p;
	__half *x16 = (__half *)((char *)q->gemm.p + w_bytes);
	float *tmp = use_tmp ? (float *)((char *)q->gemm.p + w_bytes + x_bytes) : NULL;
	cublasHandle_t h;
	SL_TRY(sl_cu_blas(b, q, &h));
	for (int r0 = 0; r0 < m; r0 += (int)chunk) {
		const int rc = SL_MIN((int)chunk, m - r0);
		const float *x = a->x + (size_t)r0 * a->ldx;
		float *y = a->y + (size_t)r0 * a->ldy;
		dim3 cgrid((unsigned)sl_cu_div_up(k, SL_GEMM_EW_THREADS), (unsigned)SL_MIN(rc, 65535));
		SL_CU_LAUNCH(sl_f32_to_f16_rows_kernel, cgrid, SL_GEMM_EW_THREADS, 0, st, rc, k, x,
			     a->ldx, x16);
		SL_CU_LAUNCHED("sl_f32_to_f16_rows_kernel");
		for (int n0 = 0; n0 < n; n0 += (int)nb) {
			const int cur = SL_MIN((int)nb, n - n0);
			dim3 wgrid((unsigned)sl_cu_div_up(k, SL_GEMM_EW_THREADS),
				   (unsigned)SL_MIN(cur, 65535));
			SL_CU_LAUNCH(sl_q4_to_f16_rows_kernel, wgrid, SL_GEMM_EW_THREADS, 0, st, n0,
				     cur, n, k, wq, w16);
			SL_CU_LAUNCHED("sl_q4_to_f16_rows_kernel");
			float *c = use_tmp ? tmp : y + n0;
			const int ldc = use_tmp ? cur : a->ldy;
			const float beta = (!use_tmp && accum) ? 1.f : 0.f;
			SL_CUBLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, cur, rc, k, &alpha, w16,
					       CUDA_R_16F, k, x16, CUDA_R_16F, k, &beta, c, CUDA_R_32F,
					       ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
			const sl_half *bias = a->bias ? a->bias + n0 : NULL;
			if (use_tmp)
				SL_TRY(sl_cu_epilogue(st, rc, cur, tmp, cur, bias, alpha, 1, 1, y + n0,
						      a->ldy));
			else if (relu || bias)
				SL_TRY(sl_cu_epilogue(st, rc, cur, y + n0, a->ldy, bias, alpha, relu, 0,
						      y + n0, a->ldy));
		}
	}
	return 0;
}

int sl_cu_gemm(sl_backend *b, sl_queue *q, const sl_gemm_args *a)
{
	const int m = a->m, n = a->n, k = a->k;
	if (m < 0 || n < 0 || k < 0 || a->ldx < k || a->ldy < n)
		return sl_err(SL_EINVAL, "cuda gemm: bad shape m=%d n=%d k=%d ldx=%d ldy=%d", m, n,
			      k, a->ldx, a->ldy);
	if (m == 0 || n == 0)
		return 0;
	if (a->w && a->wq)
		return sl_err(SL_EINVAL, "cuda gemm: both fp16 (w) and 4-bit (wq) weights given");
	if (!a->y || (k > 0 && (!a->x || (!a->w && !a->wq))))
		return sl_err(SL_EINVAL, "cuda gemm: NULL operand");
	q = sl_cu_queue(b, q);
	cudaStream_t st = q->stream;
	const float alpha = a->alpha == 0.f ? 1.f : a->alpha;
	const int relu = (a->flags & SL_GEMM_RELU) != 0;
	const int accum = (a->flags & SL_GEMM_ACCUM) != 0;

	if (k == 0) /* an empty sum: y (+)= act(alpha * bias) */
		return sl_cu_epilogue(st, m, n, NULL, 0, a->bias, alpha, relu, accum, a->y, a->ldy);
	if (a->wq)
		return sl_cu_gemm_q4(b, q, a, alpha, relu, accum);

	const int use_tmp = relu && accum;
	/* bytes per row of scratch: the fp16 row of x, the fp32 product row */
	const size_t x_row = (size_t)k * sizeof(__half);
	const size_t p_row = use_tmp ? (size_t)n * sizeof(float) : 0;
	size_t chunk = sl_cu_ctx(b)->scratch_max / (x_row + p_row + 256);
	if (chunk < 1)
		chunk = 1;
	if (chunk >= (size_t)m)
		chunk = (size_t)m;
	else if (chunk > 64)
		chunk &= ~(size_t)63; /* whole tiles for cuBLAS */
	const size_t x_bytes = (chunk * x_row + 255) & ~(size_t)255;
	SL_TRY(sl_cu_scratch_reserve(b, q, &q->gemm, x_bytes + chunk * p_row, "gemm scratch"));
	__half *x16 = (__half *)q->gemm.p;
	float *tmp = use_tmp ? (float *)((char *)q->gemm.p + x_bytes) : NULL;

	cublasHandle_t h;
	SL_TRY(sl_cu_blas(b, q, &h));

	for (int r0 = 0; r0 < m; r0 += (int)chunk) {
		const int rc = SL_MIN((int)chunk, m - r0);
		const float *x = a->x + (size_t)r0 * a->ldx;
		float *y = a->y + (size_t)r0 * a->ldy;

		dim3 cgrid((unsigned)sl_cu_div_up(k, SL_GEMM_EW_THREADS), (unsigned)SL_MIN(rc, 65535));
		SL_CU_LAUNCH(sl_f32_to_f16_rows_kernel, cgrid, SL_GEMM_EW_THREADS, 0, st, rc, k, x,
			     a->ldx, x16);
		SL_CU_LAUNCHED("sl_f32_to_f16_rows_kernel");

		float *c = use_tmp ? tmp : y;
		const int ldc = use_tmp ? n : a->ldy;
		const float beta = (!use_tmp && accum) ? 1.f : 0.f;
		SL_CUBLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, rc, k, &alpha, a->w, CUDA_R_16F,
				       k, x16, CUDA_R_16F, k, &beta, c, CUDA_R_32F, ldc,
				       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));

		if (use_tmp)
			SL_TRY(sl_cu_epilogue(st, rc, n, tmp, n, a->bias, alpha, 1, 1, y, a->ldy));
		else if (relu || a->bias)
			SL_TRY(sl_cu_epilogue(st, rc, n, y, a->ldy, a->bias, alpha, relu, 0, y,
					      a->ldy));
	}
	return 0;
}
