/*
 * attn_len_bench.c - the CPU backend's decode attention (sl_attn_decode)
 * against the cache's length: K and V bytes read per second at 8 and 16
 * sequences of 12 heads of 64 (opt-125m's layer) over 32 to 1024 cached
 * fp16 tokens.  The cost model reads every decode attention at the
 * profile's one rate (16 sequences, 1024 tokens); this shows whether the
 * rate moves with the length.
 *
 * Each point: calls back to back for 0.2 s, synchronised every 16, the
 * fastest of 5 such rounds.  Cold (the default, copies 64): each call
 * reads the next of 64 copies of the caches, so they come from memory as
 * a layer's cache does in a run; copies 1: the same cache every call (in
 * the CPU's cache where it fits).
 *
 * Not built by meson; after a build in build/:
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Icommon -Ikernels -Ibuild bench/attn_len_bench.c \
 *      build/libsl_kernels.a build/libsl_topology.a build/libsl_common.a \
 *      $(pkg-config --libs openblas hwloc) -fopenmp -lpthread -lm -ldl -o attn_len_bench
 *   ./attn_len_bench [copies]
 */
#include "backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CK(x)                                                                          \
	do {                                                                           \
		if ((x) < 0) {                                                         \
			fprintf(stderr, "attn_len_bench: %s: %s\n", #x, sl_errmsg()); \
			exit(1);                                                       \
		}                                                                      \
	} while (0)

/* The CUDA backend is not linked: the CPU backend alone. */
bool sl_cuda_usable(void)
{
	return false;
}

int sl_cuda_backend_create(sl_backend **out)
{
	*out = NULL;
	return sl_err(SL_EUNSUPPORTED, "attn_len_bench: the CPU backend only");
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
	const int copies = argc > 1 ? atoi(argv[1]) : 64;
	if (copies < 1) {
		fprintf(stderr, "usage: attn_len_bench [copies >= 1]\n");
		return 2;
	}
	sl_backend *b;
	CK(sl_backend_create("cpu", 0, &b));
	sl_queue *q;
	CK(sl_queue_create(b, &q));
	enum { NH = 12, HD = 64, HIDDEN = NH * HD, ROUNDS = 5 };
	static const int seqs[] = { 8, 16 }, lens[] = { 32, 64, 128, 256, 512, 1024 };
	printf("sl_attn_decode on cpu, %d heads of %d, fp16 cache, %s (%d copies)\n", NH, HD,
	       copies > 1 ? "cold" : "hot", copies);
	printf("%5s %6s %10s %8s\n", "seqs", "tokens", "us a call", "GB/s");
	for (size_t si = 0; si < SL_ARRAY_LEN(seqs); si++)
		for (size_t li = 0; li < SL_ARRAY_LEN(lens); li++) {
			const int nseq = seqs[si], len = lens[li];
			const size_t act = (size_t)nseq * HIDDEN;
			const size_t cache = (size_t)nseq * len * HIDDEN * sizeof(sl_half);
			float *qkv = malloc(4 * act * sizeof(float));
			char *kc = malloc(cache * (size_t)copies), *vc = malloc(cache * (size_t)copies);
			int *cur = malloc((size_t)nseq * sizeof(int));
			if (!qkv || !kc || !vc || !cur) {
				fprintf(stderr, "attn_len_bench: out of memory\n");
				return 1;
			}
			for (size_t i = 0; i < 4 * act; i++)
				qkv[i] = 0.1f;
			memset(kc, 0x3a, cache * (size_t)copies); /* fp16 about 0.78 */
			memset(vc, 0x3a, cache * (size_t)copies);
			for (int i = 0; i < nseq; i++)
				cur[i] = len - 1; /* the new token in the last slot */
			sl_attn_args a = { .nseq = nseq, .nh = NH, .hd = HD, .t = 1, .cap = len, .q = qkv,
					   .k_new = qkv + act, .v_new = qkv + 2 * act, .out = qkv + 3 * act,
					   .len = cur };
			double best = 1e30;
			for (int r = 0; r < ROUNDS; r++) {
				long n = 0;
				const double t0 = now();
				double t;
				do {
					a.k_cache = kc + (size_t)(n % copies) * cache;
					a.v_cache = vc + (size_t)(n % copies) * cache;
					CK(sl_attn_decode(b, q, &a));
					if (++n % 16 == 0)
						CK(sl_queue_sync(b, q));
					t = now() - t0;
				} while (t < 0.2 || n % 16);
				best = SL_MIN(best, t / (double)n);
			}
			printf("%5d %6d %10.1f %8.2f\n", nseq, len, best * 1e6, 2.0 * (double)cache / best / 1e9);
			free(qkv);
			free(kc);
			free(vc);
			free(cur);
		}
	sl_queue_free(b, q);
	sl_backend_free(b);
	return 0;
}
