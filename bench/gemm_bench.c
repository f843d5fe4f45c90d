/*
 * gemm_bench.c - how fast the CUDA backend's gemm op runs against what the
 * GPU can do, measured in the same run:
 *   - the ceiling: cublasGemmEx on a big square fp16 x fp16 -> fp32 product
 *     (the configuration the op uses), in TFLOP/s;
 *   - the op (sl_gemm_args through the backend table) at OPT decode shapes
 *     (few rows: weight-bandwidth bound, reported in GB/s of weights too)
 *     and prefill shapes, timed by wall clock around a queue sync, as the
 *     engine sees it;
 *   - the op with 4-bit weights (sl_gemm_args.wq, common/sl_q4.h) at some
 *     of those shapes: the fused dequantising kernel at m <= 8, panels
 *     dequantised to fp16 and cuBLAS above (W GB/s counts the 4.5-bit
 *     weights' bytes);
 *   - pinned host <-> device copy bandwidth with plain cudaMemcpyAsync.
 *
 * Usage: gemm_bench [--json] [--quick]
 *   --json   print one JSON object on stdout (the table goes to stderr)
 *   --quick  fewer repetitions and smaller copies
 * Exits 77 where there is no usable GPU (or no CUDA in this build).
 */
#include "backend.h"
#include "sl_config.h"
#include "sl_json.h"
#include "sl_q4.h"
#if SL_HAVE_CUDA
#include "cuda/cuda_backend.h"
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#endif

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if SL_HAVE_CUDA

static FILE *g_txt; /* the human table: stdout, or stderr with --json */

#define CK(call)                                                                   \
	do {                                                                       \
		cudaError_t e_ = (call);                                           \
		if (e_ != cudaSuccess) {                                           \
			fprintf(stderr, "gemm_bench: %s failed: %s (%s:%d)\n", #call,  \
				cudaGetErrorString(e_), __FILE__, __LINE__);       \
			exit(1);                                                   \
		}                                                                  \
	} while (0)
#define CKB(call)                                                                  \
	do {                                                                       \
		cublasStatus_t s_ = (call);                                        \
		if (s_ != CUBLAS_STATUS_SUCCESS) {                                 \
			fprintf(stderr, "gemm_bench: %s failed: %s (%s:%d)\n", #call,  \
				cublasGetStatusString(s_), __FILE__, __LINE__);    \
			exit(1);                                                   \
		}                                                                  \
	} while (0)
#define CKS(call)                                                                  \
	do {                                                                       \
		int r_ = (call);                                                   \
		if (r_ < 0) {                                                      \
			fprintf(stderr, "gemm_bench: %s failed: %s\n", #call, sl_errmsg()); \
			exit(1);                                                   \
		}                                                                  \
	} while (0)

/* fill device memory with small fp16 values (0x3000 = 0.125, varied bits) */
static void fill_half(void *d, size_t n)
{
	uint16_t *h = malloc(n * 2);
	if (!h)
		exit(1);
	for (size_t i = 0; i < n; i++)
		h[i] = (uint16_t)(0x2c00 + (i * 2654435761u >> 20) % 0x800);
	CK(cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice));
	free(h);
}

/* the same fp16 pattern for an (n, k) matrix, quantised to 4 bits on the
 * host (sl_q4_quantize_matrix) */
static void fill_q4(void *d, size_t n, size_t k)
{
	uint16_t *h = malloc(n * k * 2);
	void *q = malloc(sl_q4_bytes(n, k));
	if (!h || !q)
		exit(1);
	for (size_t i = 0; i < n * k; i++)
		h[i] = (uint16_t)(0x2c00 + (i * 2654435761u >> 20) % 0x800);
	sl_q4_quantize_matrix(h, n, k, q);
	CK(cudaMemcpy(d, q, sl_q4_bytes(n, k), cudaMemcpyHostToDevice));
	free(q);
	free(h);
}

static void fill_float(void *d, size_t n)
{
	float *h = malloc(n * 4);
	if (!h)
		exit(1);
	for (size_t i = 0; i < n; i++)
		h[i] = (float)((i * 2654435761u >> 16) % 1000) / 1000.0f - 0.5f;
	CK(cudaMemcpy(d, h, n * 4, cudaMemcpyHostToDevice));
	free(h);
}

/* TFLOP/s of cublasGemmEx on an s x s x s fp16 product with fp32 output */
static double cublas_peak(int s, int reps)
{
	cublasHandle_t h;
	CKB(cublasCreate(&h));
	void *a, *b, *c;
	CK(cudaMalloc(&a, (size_t)s * s * 2));
	CK(cudaMalloc(&b, (size_t)s * s * 2));
	CK(cudaMalloc(&c, (size_t)s * s * 4));
	fill_half(a, (size_t)s * s);
	fill_half(b, (size_t)s * s);
	const float alpha = 1.0f, beta = 0.0f;
	cudaEvent_t e0, e1;
	CK(cudaEventCreate(&e0));
	CK(cudaEventCreate(&e1));
	for (int i = 0; i < 3; i++) /* warm-up */
		CKB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s, s, s, &alpha, a, CUDA_R_16F, s, b,
				 CUDA_R_16F, s, &beta, c, CUDA_R_32F, s, CUBLAS_COMPUTE_32F,
				 CUBLAS_GEMM_DEFAULT));
	CK(cudaEventRecord(e0, 0));
	for (int i = 0; i < reps; i++)
		CKB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s, s, s, &alpha, a, CUDA_R_16F, s, b,
				 CUDA_R_16F, s, &beta, c, CUDA_R_32F, s, CUBLAS_COMPUTE_32F,
				 CUBLAS_GEMM_DEFAULT));
	CK(cudaEventRecord(e1, 0));
	CK(cudaEventSynchronize(e1));
	float ms = 0;
	CK(cudaEventElapsedTime(&ms, e0, e1));
	CK(cudaEventDestroy(e0));
	CK(cudaEventDestroy(e1));
	CK(cudaFree(a));
	CK(cudaFree(b));
	CK(cudaFree(c));
	CKB(cublasDestroy(h));
	return 2.0 * s * (double)s * s * reps / (ms * 1e-3) / 1e12;
}

typedef struct shape {
	const char *what;
	int m, n, k;
	unsigned flags;
	bool bias;
	bool q4; /* 4-bit weights */
} shape;

/* OPT-6.7b (hidden 4096, ffn 16384) at decode batch sizes and a prefill of
 * 8 x 512 tokens; OPT-175b's fc2 shape for the chunked path */
static const shape shapes[] = {
	{ "decode qkv m=1", 1, 3 * 4096, 4096, 0, true, false },
	{ "decode fc1 m=8", 8, 16384, 4096, SL_GEMM_RELU, true, false },
	{ "decode fc2 m=32", 32, 4096, 16384, SL_GEMM_ACCUM, true, false },
	{ "decode out m=64", 64, 4096, 4096, SL_GEMM_ACCUM, true, false },
	{ "decode lm_head m=32", 32, 50272, 4096, 0, false, false },
	{ "prefill qkv m=4096", 4096, 3 * 4096, 4096, 0, true, false },
	{ "prefill fc1 m=4096", 4096, 16384, 4096, SL_GEMM_RELU, true, false },
	{ "prefill fc2 m=4096", 4096, 4096, 16384, SL_GEMM_ACCUM, true, false },
	{ "prefill 175b-fc2 m=2048", 2048, 12288, 49152, SL_GEMM_ACCUM, true, false },
	{ "q4 decode qkv m=1", 1, 3 * 4096, 4096, 0, true, true },
	{ "q4 decode fc1 m=8", 8, 16384, 4096, SL_GEMM_RELU, true, true },
	{ "q4 decode fc2 m=32", 32, 4096, 16384, SL_GEMM_ACCUM, true, true },
	{ "q4 prefill fc1 m=4096", 4096, 16384, 4096, SL_GEMM_RELU, true, true },
};

typedef struct op_result {
	double ms, tflops, weight_gbs;
} op_result;

static op_result bench_op(sl_backend *b, sl_queue *q, const shape *s, int reps)
{
	void *x, *w, *bias, *y;
	const size_t xb = (size_t)s->m * s->k * 4;
	const size_t wb = s->q4 ? sl_q4_bytes((size_t)s->n, (size_t)s->k) : (size_t)s->n * s->k * 2;
	const size_t yb = (size_t)s->m * s->n * 4;
	CKS(sl_dev_alloc(b, xb, "x", &x));
	CKS(sl_dev_alloc(b, wb, "w", &w));
	CKS(sl_dev_alloc(b, (size_t)s->n * 2, "bias", &bias));
	CKS(sl_dev_alloc(b, yb, "y", &y));
	fill_float(x, (size_t)s->m * s->k);
	if (s->q4)
		fill_q4(w, (size_t)s->n, (size_t)s->k);
	else
		fill_half(w, (size_t)s->n * s->k);
	fill_half(bias, (size_t)s->n);
	CK(cudaMemset(y, 0, yb));
	sl_gemm_args a = { .m = s->m, .n = s->n, .k = s->k, .x = x, .ldx = s->k,
			   .w = s->q4 ? NULL : w, .wq = s->q4 ? w : NULL,
			   .bias = s->bias ? bias : NULL, .y = y, .ldy = s->n, .flags = s->flags };
	for (int i = 0; i < 2; i++)
		CKS(b->ops->gemm(b, q, &a));
	CKS(b->ops->queue_sync(b, q));
	const double t0 = sl_now();
	for (int i = 0; i < reps; i++)
		CKS(b->ops->gemm(b, q, &a));
	CKS(b->ops->queue_sync(b, q));
	const double sec = (sl_now() - t0) / reps;
	sl_dev_free(b, x, xb);
	sl_dev_free(b, w, wb);
	sl_dev_free(b, bias, (size_t)s->n * 2);
	sl_dev_free(b, y, yb);
	op_result r = { sec * 1e3, 2.0 * s->m * (double)s->n * s->k / sec / 1e12, wb / sec / 1e9 };
	return r;
}

/* GB/s of cudaMemcpyAsync between pinned host memory and the device */
static void copy_bw(size_t bytes, int reps, double *h2d, double *d2h)
{
	void *hbuf, *dbuf;
	CK(cudaHostAlloc(&hbuf, bytes, cudaHostAllocDefault));
	CK(cudaMalloc(&dbuf, bytes));
	memset(hbuf, 1, bytes);
	cudaStream_t st;
	CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
	cudaEvent_t e0, e1;
	CK(cudaEventCreate(&e0));
	CK(cudaEventCreate(&e1));
	for (int dir = 0; dir < 2; dir++) {
		for (int i = 0; i < reps + 1; i++) {
			if (i == 1)
				CK(cudaEventRecord(e0, st));
			if (dir == 0)
				CK(cudaMemcpyAsync(dbuf, hbuf, bytes, cudaMemcpyHostToDevice, st));
			else
				CK(cudaMemcpyAsync(hbuf, dbuf, bytes, cudaMemcpyDeviceToHost, st));
		}
		CK(cudaEventRecord(e1, st));
		CK(cudaEventSynchronize(e1));
		float ms = 0;
		CK(cudaEventElapsedTime(&ms, e0, e1));
		const double gbs = (double)bytes * reps / (ms * 1e-3) / 1e9;
		*(dir == 0 ? h2d : d2h) = gbs;
	}
	CK(cudaEventDestroy(e0));
	CK(cudaEventDestroy(e1));
	CK(cudaStreamDestroy(st));
	CK(cudaFree(dbuf));
	CK(cudaFreeHost(hbuf));
}

int main(int argc, char **argv)
{
	bool json = false, quick = false;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--json"))
			json = true;
		else if (!strcmp(argv[i], "--quick"))
			quick = true;
		else {
			fprintf(stderr, "usage: %s [--json] [--quick]\n", argv[0]);
			return 2;
		}
	}
	g_txt = json ? stderr : stdout;
	if (!sl_cuda_usable()) {
		sl_backend *b = NULL;
		int rc = sl_backend_create("cuda", 0, &b);
		fprintf(stderr, "gemm_bench: skipped: %s\n", rc < 0 ? sl_errmsg() : "no usable GPU");
		sl_backend_free(b);
		return 77;
	}
	sl_backend *b = NULL;
	CKS(sl_backend_create("cuda", 0, &b));
	sl_queue *q = NULL;
	CKS(b->ops->queue_create(b, &q));
	struct cudaDeviceProp prop;
	CK(cudaGetDeviceProperties(&prop, 0));

	const int peak_n = 8192, peak_reps = quick ? 5 : 20;
	const double peak = cublas_peak(peak_n, peak_reps);
	fprintf(g_txt, "GPU: %s (%d SMs)\n", prop.name, prop.multiProcessorCount);
	fprintf(g_txt, "cuBLAS fp16 x fp16 -> fp32, %d^3: %.1f TFLOP/s (the ceiling below)\n\n", peak_n,
		peak);
	fprintf(g_txt, "%-26s %6s %6s %6s %9s %9s %7s %9s\n", "sluice gemm op", "m", "n", "k", "ms",
		"TFLOP/s", "%peak", "W GB/s");

	op_result res[SL_ARRAY_LEN(shapes)];
	for (size_t i = 0; i < SL_ARRAY_LEN(shapes); i++) {
		const shape *s = &shapes[i];
		const double flop = 2.0 * s->m * (double)s->n * s->k;
		int reps = flop > 1e12 ? 5 : flop > 1e10 ? 20 : 100;
		if (quick)
			reps = reps / 5 + 1;
		res[i] = bench_op(b, q, s, reps);
		fprintf(g_txt, "%-26s %6d %6d %6d %9.3f %9.1f %6.1f%% %9.0f\n", s->what, s->m, s->n, s->k,
			res[i].ms, res[i].tflops, 100.0 * res[i].tflops / peak, res[i].weight_gbs);
	}

	const size_t cb = quick ? (size_t)64 << 20 : (size_t)512 << 20;
	double h2d = 0, d2h = 0;
	copy_bw(cb, quick ? 3 : 10, &h2d, &d2h);
	fprintf(g_txt, "\npinned copies of %zu MiB: host->device %.1f GB/s, device->host %.1f GB/s\n",
		cb >> 20, h2d, d2h);

	if (json) {
		sl_jerr e = { 0 };
		json_t *j = json_object(), *ops = json_array();
		sl_jset(j, "gpu", json_string(prop.name), &e);
		sl_jset(j, "sm_count", json_integer(prop.multiProcessorCount), &e);
		sl_jset_real(j, "cublas_peak_tflops", peak, &e);
		sl_jset_real(j, "h2d_gbs", h2d, &e);
		sl_jset_real(j, "d2h_gbs", d2h, &e);
		sl_jset(j, "copy_bytes", json_integer((json_int_t)cb), &e);
		for (size_t i = 0; i < SL_ARRAY_LEN(shapes); i++) {
			json_t *op = json_object();
			sl_jset(op, "what", json_string(shapes[i].what), &e);
			sl_jset(op, "m", json_integer(shapes[i].m), &e);
			sl_jset(op, "n", json_integer(shapes[i].n), &e);
			sl_jset(op, "k", json_integer(shapes[i].k), &e);
			sl_jset(op, "weights", json_string(shapes[i].q4 ? "q4" : "fp16"), &e);
			sl_jset_real(op, "ms", res[i].ms, &e);
			sl_jset_real(op, "tflops", res[i].tflops, &e);
			sl_jset_real(op, "weight_gbs", res[i].weight_gbs, &e);
			sl_jappend(ops, op, "ops", &e);
		}
		sl_jset(j, "ops", ops, &e);
		int rc = sl_jcheck(&e, "gemm_bench --json");
		if (!rc)
			rc = sl_jwrite_line(j, stdout, "gemm_bench --json: standard output");
		json_decref(j);
		if (rc < 0) {
			fprintf(stderr, "gemm_bench: %s\n", sl_errmsg());
			return 1;
		}
	}
	b->ops->queue_free(b, q);
	sl_backend_free(b);
	return 0;
}

#else /* !SL_HAVE_CUDA */

int main(void)
{
	fprintf(stderr, "gemm_bench: skipped: this build has no CUDA backend\n");
	return 77;
}

#endif
