/*
 * zstd_bench.c - what zstd-compressed disk segments (issue #14) would buy:
 * the compression ratio of a weight store's data, as is and byte-shuffled
 * (each fp16 value's low bytes, then its high bytes, so that the sign and
 * exponent bytes sit together), and the rate at which the CPU decompresses
 * it back (zstd, then the unshuffle), on 1 to N threads.
 *
 * The data is a store that `sluice convert` wrote (its header read with
 * sl_disk_peek, its data area measured): a layer's disk segment is cut into
 * windows of --window bytes (the conversion's 4 MiB piece by default), each
 * compressed as one frame, as the store would hold them, so that the I/O
 * threads could decompress windows in parallel.  --layers N: the model's
 * decoder layers, whose segments split the data area evenly (windows
 * never span two).
 *
 * Usage: zstd_bench STORE --layers N [--window BYTES] [--levels 1,3,9]
 *                   [--threads 1,2] [--reps R] [--probe DIR]
 * Prints one JSON object per level on stdout: ratios (uncompressed over
 * compressed bytes), the compression rate on one thread, and per thread
 * count the best of R decompression passes over the whole data (GB/s of
 * uncompressed bytes, 1e9, by the wall clock) and the rate per core by CPU
 * time (bytes over the pass's CPU seconds: what one unshared core does,
 * whatever else runs on a shared machine), with the unshuffle alone beside
 * them.  --probe DIR
 * adds the folder's O_DIRECT sequential read rate (sl_disk_probe_read, 1 GiB).
 */
#include "disk_store.h"
#include "sl_common.h"
#include "zseg.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zstd.h>

/* The process's CPU seconds: on a shared machine a pass's CPU time per byte
 * is the rate of a core that is not shared, whatever the load. */
static double cpu_now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

typedef struct frame {
	size_t off, len;   /* the window in the data */
	char *z;           /* its frame */
	size_t zlen;
} frame;

static int parse_list(const char *s, int *v, int max)
{
	int n = 0;
	for (char *end; *s && n < max; s = *end ? end + 1 : end) {
		v[n++] = (int)strtol(s, &end, 10);
		if (end == s)
			return -1;
	}
	return n;
}

static void die(const char *what)
{
	fprintf(stderr, "zstd_bench: %s\n", what);
	exit(1);
}

int main(int argc, char **argv)
{
	const char *store = NULL, *probe = NULL;
	size_t layers = 0, window = (size_t)4 << 20;
	int levels[16] = { 1, 3, 9 }, nlev = 3, threads[16] = { 1, 2 }, nthr = 2, reps = 3;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--layers") && v)
			layers = strtoull(argv[++i], NULL, 10);
		else if (!strcmp(a, "--window") && v)
			window = strtoull(argv[++i], NULL, 10);
		else if (!strcmp(a, "--levels") && v)
			nlev = parse_list(argv[++i], levels, 16);
		else if (!strcmp(a, "--threads") && v)
			nthr = parse_list(argv[++i], threads, 16);
		else if (!strcmp(a, "--reps") && v)
			reps = atoi(argv[++i]);
		else if (!strcmp(a, "--probe") && v)
			probe = argv[++i];
		else if (a[0] != '-' && !store)
			store = a;
		else
			die("usage: zstd_bench STORE --layers N [--window BYTES] [--levels 1,3,9] [--threads 1,2] [--reps R] [--probe DIR]");
	}
	if (!store || !layers || window < 2 || nlev < 1 || nthr < 1 || reps < 1)
		die("give STORE and --layers N (and sane --window, --levels, --threads, --reps)");
	sl_disk_info info;
	if (sl_disk_peek(store, &info) < 0)
		die(sl_errmsg());
	if (!info.complete)
		die("the store is incomplete");
	const size_t n = (size_t)info.data_bytes, segment = n / layers;
	if (!segment || segment * layers != n)
		die("the data area does not split into --layers equal segments");
	unsigned char *data = malloc(n), *sh = malloc(n), *back = malloc(n);
	FILE *f = fopen(store, "rb");
	if (!data || !sh || !back || !f || fseek(f, SL_DISK_HEADER_BYTES, SEEK_SET) != 0 ||
	    fread(data, 1, n, f) != n)
		die("cannot read the store's data area");
	fclose(f);
	size_t nf = 0;
	for (size_t s = 0; s < n; s += segment)
		nf += (segment + window - 1) / window;
	frame *fr = calloc(nf, sizeof *fr);
	nf = 0;
	for (size_t s = 0; s < n; s += segment)
		for (size_t o = 0; o < segment; o += window)
			fr[nf++] = (frame){ .off = s + o, .len = SL_MIN(window, segment - o) };
	for (size_t k = 0; k < nf; k++)
		sl_zseg_shuffle(data + fr[k].off, sh + fr[k].off, fr[k].len);
	double probe_gbps = 0;
	char mode[64] = "";
	if (probe && sl_disk_probe_read(probe, (uint64_t)1 << 30, &probe_gbps, mode, sizeof mode) < 0)
		die(sl_errmsg());
	const int maxthr = omp_get_max_threads();
	for (int li = 0; li < nlev; li++) {
		const int lev = levels[li];
		/* as is, then shuffled: ratio; the shuffled frames kept */
		size_t zraw = 0, zsh = 0;
		double tc = 0;
		for (int pass = 0; pass < 2; pass++) {
			const unsigned char *src = pass ? sh : data;
			const double t0 = sl_now();
			for (size_t k = 0; k < nf; k++) {
				const size_t cap = ZSTD_compressBound(fr[k].len);
				char *z = malloc(cap);
				size_t r = ZSTD_compress(z, cap, src + fr[k].off, fr[k].len, lev);
				if (!z || ZSTD_isError(r))
					die("compression failed");
				if (pass) {
					free(fr[k].z);
					fr[k].z = z;
					fr[k].zlen = r;
					zsh += r;
				} else {
					free(z);
					zraw += r;
				}
			}
			if (pass)
				tc = sl_now() - t0;
		}
		printf("{\"store\": \"%s\", \"data_bytes\": %zu, \"segment\": %zu, \"window\": %zu, \"level\": %d, "
		       "\"ratio_plain\": %.4f, \"ratio_shuffled\": %.4f, \"compress_gbps_1t\": %.4f",
		       store, n, segment, window, lev, (double)n / zraw, (double)n / zsh, n / tc / 1e9);
		if (probe)
			printf(", \"disk_read_gbps\": %.4f, \"disk_mode\": \"%s\"", probe_gbps, mode);
		printf(", \"cores\": %d, \"decompress\": [", maxthr);
		for (int ti = 0; ti < nthr; ti++) {
			const int t = SL_MIN(threads[ti], maxthr);
			double best = 1e30, best_u = 1e30, best_cpu = 1e30;
			for (int r = 0; r < reps; r++) {
				int bad = 0;
				const double c0 = cpu_now(), t0 = sl_now();
#pragma omp parallel num_threads(t)
				{
					ZSTD_DCtx *d = ZSTD_createDCtx();
					unsigned char *tmp = malloc(window);
#pragma omp for schedule(dynamic, 1) reduction(| : bad)
					for (size_t k = 0; k < nf; k++) {
						size_t got = ZSTD_decompressDCtx(d, tmp, window, fr[k].z, fr[k].zlen);
						bad |= ZSTD_isError(got) || got != fr[k].len;
						sl_zseg_unshuffle(tmp, back + fr[k].off, fr[k].len);
					}
					free(tmp);
					ZSTD_freeDCtx(d);
				}
				best = SL_MIN(best, sl_now() - t0);
				best_cpu = SL_MIN(best_cpu, cpu_now() - c0);
				if (bad || memcmp(back, data, n))
					die("decompressed data differs from the store's");
				const double t1 = sl_now();
#pragma omp parallel for num_threads(t) schedule(dynamic, 1)
				for (size_t k = 0; k < nf; k++)
					sl_zseg_unshuffle(sh + fr[k].off, back + fr[k].off, fr[k].len);
				best_u = SL_MIN(best_u, sl_now() - t1);
			}
			printf("%s{\"threads\": %d, \"gbps\": %.4f, \"gbps_per_cpu_s\": %.4f, \"unshuffle_gbps\": %.4f}",
			       ti ? ", " : "", t, n / best / 1e9, n / best_cpu / 1e9, n / best_u / 1e9);
		}
		printf("]}\n");
		fflush(stdout);
	}
	for (size_t k = 0; k < nf; k++)
		free(fr[k].z);
	free(fr);
	free(data);
	free(sh);
	free(back);
	return 0;
}
