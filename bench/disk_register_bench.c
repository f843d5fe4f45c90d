/*
 * disk_register_bench.c - what io_uring registered (fixed) buffers buy the
 * disk store's reads, side by side in one run.
 *
 * Writes a store of FILE_MIB once, then ROUNDS rounds of two read passes over
 * it, one with the staging buffers registered (sl_disk_register) and one
 * without, the order alternating round by round.  Each pass reads the whole
 * file in requests of REQ_KIB with NBUF requests outstanding (the store splits
 * them into CHUNK_KIB chunks, QD in flight).  Per pass: GB/s (1e9 bytes/s of
 * wall time) and the process's CPU time (user + system, the completion thread
 * included) per GB read.  Prints the median of each, and the fixed-chunk count
 * to show which pass used the registered buffers.
 *
 * Not built by meson; after a build in build/:
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Icommon -Ioffload -Ibuild bench/disk_register_bench.c \
 *      build/libsl_offload.a build/libsl_topology.a build/libsl_common.a \
 *      $(pkg-config --libs liburing hwloc) -lpthread -lm -o disk_register_bench
 *   ./disk_register_bench DIR [FILE_MIB=512] [ROUNDS=7] [REQ_KIB=16384] [NBUF=4]
 *                             [CHUNK_KIB=1024] [QD=32]
 * The weights' pattern is the default; the KV cache's reads are smaller
 * (REQ_KIB=64 CHUNK_KIB=64).  DIR must be on the disk to measure (not tmpfs).
 */
#include "disk_store.h"
#include "sl_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static void die(const char *what)
{
	fprintf(stderr, "disk_register_bench: %s: %s\n", what, sl_errmsg());
	exit(1);
}

static double cpu_s(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
	       ru.ru_stime.tv_usec * 1e-6;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof *v, cmp_d);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* One pass over bytes in requests of req, nbuf outstanding. */
static void pass(sl_disk_store *s, bool write, uint64_t bytes, char *buf, size_t req, int nbuf)
{
	uint64_t tk[64] = { 0 };
	uint64_t i = 0;
	for (uint64_t off = 0; off < bytes; off += req, i++) {
		int j = (int)(i % (uint64_t)nbuf);
		if (tk[j] && sl_disk_wait(s, tk[j]) < 0)
			die("wait");
		size_t n = (size_t)SL_MIN((uint64_t)req, bytes - off);
		char *p = buf + (size_t)j * req;
		if ((write ? sl_disk_write(s, off, p, n, &tk[j]) : sl_disk_read(s, off, p, n, &tk[j])) < 0)
			die(write ? "write" : "read");
	}
	if (sl_disk_wait_all(s) < 0)
		die("wait_all");
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s DIR [FILE_MIB] [ROUNDS] [REQ_KIB] [NBUF] [CHUNK_KIB] [QD]\n", argv[0]);
		return 2;
	}
	const char *dir = argv[1];
	uint64_t bytes = (uint64_t)(argc > 2 ? atoi(argv[2]) : 512) << 20;
	int rounds = argc > 3 ? atoi(argv[3]) : 7;
	size_t req = (size_t)(argc > 4 ? atoi(argv[4]) : 16384) << 10;
	int nbuf = argc > 5 ? atoi(argv[5]) : 4;
	size_t chunk = (size_t)(argc > 6 ? atoi(argv[6]) : 1024) << 10;
	int qd = argc > 7 ? atoi(argv[7]) : 32;
	if (rounds < 1 || rounds > 100 || nbuf < 1 || nbuf > 64 || req == 0 || req % 4096 || bytes == 0) {
		fprintf(stderr, "disk_register_bench: bad arguments\n");
		return 2;
	}
	sl_disk_params dp = { .dir = dir, .file_name = "disk-register-bench.sluice", .key = "register bench",
			      .data_bytes = bytes, .queue_depth = qd, .chunk_bytes = chunk };
	sl_disk_store *s;
	bool fresh;
	if (sl_disk_open(&dp, &s, &fresh) < 0)
		die("open");
	size_t blen = (size_t)nbuf * req;
	char *buf = aligned_alloc(SL_DISK_ALIGN, blen);
	if (!buf)
		return 1;
	for (size_t i = 0; i < blen; i += 64)
		buf[i] = (char)(i >> 12);
	pass(s, true, bytes, buf, req, nbuf);
	if (sl_disk_mark_complete(s) < 0)
		die("mark_complete");

	double gb = (double)bytes / 1e9;
	double g[2][100], c[2][100];
	uint64_t fixed[2] = { 0, 0 };
	void *bp = buf;
	for (int r = 0; r < rounds; r++) {
		for (int k = 0; k < 2; k++) {
			int reg = (r + k) % 2; /* alternate which goes first */
			if (sl_disk_register(s, reg ? &bp : NULL, reg ? &blen : NULL, reg) < 0)
				die("register");
			sl_disk_stats a, b;
			sl_disk_get_stats(s, &a);
			double c0 = cpu_s(), t0 = sl_now();
			pass(s, false, bytes, buf, req, nbuf);
			double dt = sl_now() - t0, dc = cpu_s() - c0;
			sl_disk_get_stats(s, &b);
			g[reg][r] = gb / dt;
			c[reg][r] = dc / gb;
			fixed[reg] += b.fixed_chunks - a.fixed_chunks;
		}
	}
	printf("engine %s, %.0f MiB file in %s, %d rounds, requests %zu KiB x %d outstanding, chunks %zu KiB, qd %d\n",
	       sl_disk_mode(s), (double)bytes / (1 << 20), dir, rounds, req >> 10, nbuf, chunk >> 10, qd);
	for (int reg = 1; reg >= 0; reg--) {
		double gs[100], cs[100];
		memcpy(gs, g[reg], sizeof gs);
		memcpy(cs, c[reg], sizeof cs);
		double mg = median(gs, rounds), mc = median(cs, rounds); /* sorts gs, cs */
		printf("%-12s  median %.3f GB/s (min %.3f, max %.3f)  median CPU %.3f s per GB (min %.3f, max %.3f)"
		       "  fixed chunks %llu\n", reg ? "registered" : "unregistered", mg, gs[0], gs[rounds - 1], mc,
		       cs[0], cs[rounds - 1], (unsigned long long)fixed[reg]);
	}
	sl_disk_close(s);
	char path[4096];
	snprintf(path, sizeof path, "%s/%s", dir, dp.file_name);
	remove(path);
	free(buf);
	return 0;
}
