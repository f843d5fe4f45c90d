/*
 * profile.h - `sluice profile`: the machine's topology and the rates a cost
 * model needs, each measured in a fraction of a second to a few seconds:
 *
 *   mem_read_gbps     host memory read bandwidth: every thread sums its part
 *                     of a 512 MiB buffer (median of 3)
 *   cpu_gemm_gflops   the CPU backend's sl_gemm (fp32 activations, fp16
 *                     weights) at m=512, n=k=2048 (median of 3)
 *   disk_read_gbps    sequential O_DIRECT reads in the offload directory
 *                     through the disk store's engine (sl_disk_probe_read,
 *                     1 GiB, its threads on the I/O node)
 *   h2d_gbps, d2h_gbps  pinned host <-> device copies of 256 MiB (CUDA;
 *                     median of 3)
 *   gpu_gemm_tflops   sl_gemm on the CUDA backend at m=4096, n=k=8192
 *                     (fp16 tensor cores, fp32 accumulation; median of 3)
 *
 * quick uses small sizes (tests: the numbers mean little).  Rates are in
 * 1e9 bytes/s and 1e9 / 1e12 FLOP/s.  A rate not measured is 0 (no
 * offload directory; no GPU); the JSON writes it as null.
 */
#ifndef SL_PROFILE_H
#define SL_PROFILE_H

#include "backend.h"
#include "topology.h"

#include <stdbool.h>
#include <stdio.h>

typedef struct sl_profile_opts {
	const char *backend;     /* "cpu", "cuda" or "auto" (NULL: auto) */
	const char *offload_dir; /* NULL: the disk is not measured */
	int threads;             /* CPU threads; 0: all */
	bool quick;              /* small sizes, for tests */
	FILE *log;               /* one line per result as it is measured; NULL: none */
} sl_profile_opts;

typedef struct sl_profile {
	bool quick;
	sl_topo_info topo;
	const char *backend;   /* "cpu" or "cuda": the backend measured */
	bool have_gpu;
	sl_device_info gpu;    /* with have_gpu */
	int pinned_node;       /* node for pinned host memory; -1: none chosen */
	int io_node;           /* node for the disk's I/O threads; -1: none */
	int threads;

	double mem_read_gbps;
	size_t mem_bytes;

	double cpu_gemm_gflops;
	int cpu_gemm_m, cpu_gemm_n, cpu_gemm_k;

	double disk_read_gbps; /* 0: not measured */
	char disk_engine[64];
	unsigned long long disk_bytes;
	const char *offload_dir;

	double h2d_gbps, d2h_gbps; /* 0: no GPU */
	size_t copy_bytes;
	double gpu_gemm_tflops;
	int gpu_gemm_m, gpu_gemm_n, gpu_gemm_k;

	double seconds; /* the whole profile */
} sl_profile;

/*
 * Measure.  Checks the offload directory first (missing, not a directory,
 * not writable: SL_ENOTFOUND / SL_EIO naming it, before anything runs).
 * Other errors: the backend's (SL_EUNSUPPORTED for cuda in a build without
 * it, SL_EDEVICE), SL_ENOMEM, the disk probe's.
 */
/* Host memory read bandwidth in GB/s: threads sum a buffer of `bytes`
 * (larger than the caches), median of 3; 0 if it cannot be measured.  The
 * decode roofline on the CPU backend. */
double sl_profile_mem_read_gbps(size_t bytes, int threads);

int sl_profile_run(const sl_profile_opts *o, sl_profile *out);

/*
 * Check that a JSON file can be written at path (creates and removes
 * path.tmp): SL_EIO "cannot write PATH (...)" where it cannot.
 */
int sl_profile_check_json_path(const char *path);
/* Before measuring: that dir is a folder sluice can write in. */
int sl_profile_check_offload_dir(const char *dir);

/* Write the profile as one JSON object to path, atomically (path.tmp,
 * fsync, rename).  SL_EIO naming the path. */
int sl_profile_save_json(const sl_profile *p, const char *path);

#endif
