/*
 * disk_read.c - a file read with O_DIRECT through io_uring, as sluice's disk
 * stores read (requests of CHUNK KiB, DEPTH in flight), into a buffer of
 * 4 KiB pages or of transparent huge pages: what bench/disk_pages.sh runs to
 * show that the buffer's pages set this disk's rate (sl_io_alloc in
 * common/sl_common.h says why).
 *
 * usage: disk_read FILE CHUNK_KIB DEPTH MIB (4k|huge)
 * prints one line: the pages, the request shape, GB read and GB/s.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <liburing.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
	if (argc != 6 || (strcmp(argv[5], "4k") && strcmp(argv[5], "huge"))) {
		fprintf(stderr, "usage: disk_read FILE CHUNK_KIB DEPTH MIB (4k|huge)\n");
		return 2;
	}
	const size_t chunk = strtoull(argv[2], NULL, 10) << 10;
	const int depth = atoi(argv[3]);
	const uint64_t want = strtoull(argv[4], NULL, 10) << 20;
	const bool huge = !strcmp(argv[5], "huge");
	if (!chunk || chunk % 4096 || depth < 1 || depth > 256 || !want) {
		fprintf(stderr, "disk_read: a chunk of whole pages, 1 to 256 in flight, some MiB\n");
		return 2;
	}
	const int fd = open(argv[1], O_RDONLY | O_DIRECT);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) < 0) {
		perror(argv[1]);
		return 1;
	}
	const uint64_t size = (uint64_t)st.st_size - (uint64_t)st.st_size % chunk;
	if (size < chunk) {
		fprintf(stderr, "%s: smaller than one chunk\n", argv[1]);
		return 1;
	}
	/* the buffer: one chunk a slot; 2 MiB aligned and advised as huge
	 * pages, or plain 4 KiB pages; touched before the reads, so that the
	 * pages exist (as a store's staging buffers do) */
	const size_t hp = (size_t)2 << 20, len = chunk * (size_t)depth;
	char *map = mmap(NULL, len + hp, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (map == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	char *buf = huge ? (char *)(((uintptr_t)map + hp - 1) & ~(uintptr_t)(hp - 1)) : map;
	if (huge && madvise(buf, len - len % hp, MADV_HUGEPAGE) < 0)
		perror("madvise (4 KiB pages, then)");
	memset(buf, 1, len);
	struct io_uring ring;
	int rc = io_uring_queue_init((unsigned)depth, &ring, 0);
	if (rc < 0) {
		fprintf(stderr, "io_uring_queue_init: %s\n", strerror(-rc));
		return 1;
	}
	uint64_t next = 0, got = 0, issued = 0;
	int out = 0;
	const double t0 = now();
	while (issued < want || out) {
		while (out < depth && issued < want) {
			struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
			const int slot = (int)((issued / chunk) % (uint64_t)depth);
			io_uring_prep_read(sqe, fd, buf + (size_t)slot * chunk, (unsigned)chunk, (off_t)next);
			next = next + chunk >= size ? 0 : next + chunk; /* wrap around the file */
			issued += chunk;
			out++;
		}
		io_uring_submit(&ring);
		struct io_uring_cqe *cqe;
		if ((rc = io_uring_wait_cqe(&ring, &cqe)) < 0 || cqe->res < 0) {
			fprintf(stderr, "read: %s\n", strerror(rc < 0 ? -rc : -cqe->res));
			return 1;
		}
		got += (uint64_t)cqe->res;
		io_uring_cqe_seen(&ring, cqe);
		out--;
	}
	const double dt = now() - t0;
	printf("%-4s pages, %5zu KiB x %3d in flight: %.2f GB in %.3f s, %.2f GB/s\n", argv[5], chunk >> 10,
	       depth, (double)got / 1e9, dt, (double)got / 1e9 / dt);
	io_uring_queue_exit(&ring);
	close(fd);
	return 0;
}
