/*
 * queue_bench.c - what the CPU backend's asynchronous queues buy.
 *
 *  overlap: each round copies COPY_MIB on a copy queue and runs a GEMM
 *           inline on the compute queue, then synchronises both; wall time
 *           per round (the fastest of 21), against the copy alone and the
 *           GEMM alone.
 *  small:   many small copies on an idle queue, each followed by an op on
 *           the same queue (as the model's activation copies are): the cost
 *           of handing a copy to the worker instead of running it inline.
 *
 * Not built by meson; after a build in build/:
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Icommon -Ikernels -Ibuild bench/queue_bench.c \
 *      build/libsl_kernels.a build/libsl_topology.a build/libsl_common.a \
 *      $(pkg-config --libs openblas hwloc) -fopenmp -lpthread -lm -o queue_bench
 * Run it twice to compare with the serial schedule:
 *   OMP_WAIT_POLICY=passive ./queue_bench
 *   OMP_WAIT_POLICY=passive SLUICE_CPU_SYNC_QUEUES=1 ./queue_bench
 * and with SLUICE_CPU_INLINE_BYTES=0 to queue even the smallest copies.
 * Arguments (all optional): threads, copy MiB, GEMM rows m, n = k.
 */
#include "backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(x)                                                                      \
	do {                                                                       \
		if ((x) < 0) {                                                     \
			fprintf(stderr, "queue_bench: %s: %s\n", #x, sl_errmsg()); \
			exit(1);                                                   \
		}                                                                  \
	} while (0)

static int cmp_double(const void *a, const void *b)
{
	const double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* the fastest round: the least disturbed by other work on the machine */
static double fastest(double *v, int n)
{
	qsort(v, (size_t)n, sizeof *v, cmp_double);
	return v[0];
}

int main(int argc, char **argv)
{
	const int threads = argc > 1 ? atoi(argv[1]) : 0;
	const size_t copy = (size_t)(argc > 2 ? atoi(argv[2]) : 64) << 20;
	const int m = argc > 3 ? atoi(argv[3]) : 8;
	const int nk = argc > 4 ? atoi(argv[4]) : 4096;
	enum { rounds = 21 };

	sl_backend *b;
	CK(sl_backend_create("cpu", threads, &b));
	sl_queue *cq, *xq;
	CK(b->ops->queue_create(b, &cq));
	CK(b->ops->queue_create(b, &xq));
	void *hsrc, *ddst, *x, *w, *y;
	CK(sl_host_alloc(b, copy, "copy source", &hsrc));
	CK(sl_dev_alloc(b, copy, "copy destination", &ddst));
	CK(sl_dev_alloc(b, (size_t)m * nk * 4, "x", &x));
	CK(sl_dev_alloc(b, (size_t)nk * nk * 2, "w", &w));
	CK(sl_dev_alloc(b, (size_t)m * nk * 4, "y", &y));
	memset(hsrc, 1, copy);
	memset(ddst, 0, copy);
	for (size_t i = 0; i < (size_t)m * nk; i++)
		((float *)x)[i] = (float)(i % 7) * 0.125f;
	for (size_t i = 0; i < (size_t)nk * nk; i++)
		((sl_half *)w)[i] = sl_float_to_half((float)(i % 5) * 0.01f);
	sl_gemm_args a = { .m = m, .n = nk, .k = nk, .x = x, .ldx = nk, .w = w, .y = y, .ldy = nk };

	double t_copy[rounds], t_gemm[rounds], t_both[rounds];
	for (int r = -1; r < rounds; r++) { /* round -1 warms up */
		double t0 = sl_now();
		CK(b->ops->copy_h2d(b, xq, ddst, hsrc, copy));
		CK(b->ops->queue_sync(b, xq));
		double t1 = sl_now();
		CK(b->ops->gemm(b, cq, &a));
		CK(b->ops->queue_sync(b, cq));
		double t2 = sl_now();
		CK(b->ops->copy_h2d(b, xq, ddst, hsrc, copy));
		CK(b->ops->gemm(b, cq, &a));
		CK(b->ops->queue_sync(b, cq));
		CK(b->ops->queue_sync(b, xq));
		double t3 = sl_now();
		if (r >= 0) {
			t_copy[r] = t1 - t0;
			t_gemm[r] = t2 - t1;
			t_both[r] = t3 - t2;
		}
	}
	const double c = fastest(t_copy, rounds), g = fastest(t_gemm, rounds), bo = fastest(t_both, rounds);
	const char *mode = getenv("SLUICE_CPU_SYNC_QUEUES");
	printf("overlap (%s queues, %d threads): copy %zu MiB %.2f ms, gemm m=%d n=k=%d %.2f ms, "
	       "both %.2f ms (%.0f%% of copy + gemm)\n",
	       mode && strcmp(mode, "0") ? "sync" : "async", threads, copy >> 20, c * 1e3, m, nk,
	       g * 1e3, bo * 1e3, 100.0 * bo / (c + g));

	/* small copies followed by an op on the same queue */
	const size_t sizes[] = { 256, 4096, 16384, 65536, 262144 };
	for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
		const size_t n = sizes[si];
		const int reps = (int)SL_MIN((size_t)20000, ((size_t)256 << 20) / n);
		sl_gemm_args t = { .m = 1, .n = 8, .k = 8, .x = x, .ldx = 8, .w = w, .y = y, .ldy = 8 };
		double t0 = sl_now();
		for (int i = 0; i < reps; i++) {
			CK(b->ops->copy_d2d(b, cq, ddst, (char *)ddst + (copy >> 1), n));
			CK(b->ops->gemm(b, cq, &t));
		}
		CK(b->ops->queue_sync(b, cq));
		double dt = sl_now() - t0;
		printf("small: %6zu-byte copy + tiny op on one queue: %.2f us per pair\n", n,
		       dt / reps * 1e6);
	}

	sl_host_free(b, hsrc, copy);
	sl_dev_free(b, ddst, copy);
	sl_dev_free(b, x, (size_t)m * nk * 4);
	sl_dev_free(b, w, (size_t)nk * nk * 2);
	sl_dev_free(b, y, (size_t)m * nk * 4);
	b->ops->queue_free(b, cq);
	b->ops->queue_free(b, xq);
	sl_backend_free(b);
	return 0;
}
