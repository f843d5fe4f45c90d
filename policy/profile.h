/*
 * profile.h - the hardware profile: what `sluice profile` measured about a
 * machine, as plain data, and its JSON file.  The cost model reads a
 * profile from here without linking the runtime, the backends or the disk
 * store; the measuring itself is runtime/profile_measure.h.
 *
 *   mem_read_gbps     host memory read bandwidth: every thread sums its part
 *                     of a 512 MiB buffer (median of 3)
 *   cpu_gemm_gflops   the CPU backend's sl_gemm (fp32 activations, fp16
 *                     weights) at m=512, n=k=2048 (median of 3; on the CPU
 *                     backend the gemm curve's point at m=512)
 *   disk_read_gbps    sequential O_DIRECT reads in the offload directory
 *                     through the disk store's engine (sl_disk_probe,
 *                     1 GiB, its threads on the I/O node)
 *   h2d_gbps, d2h_gbps  host <-> device copies on a queue, median of 3:
 *                     CUDA: pinned memory, 256 MiB; CPU backend: its copy
 *                     queue's memcpy, 64 MiB
 *   gpu_gemm_tflops   sl_gemm on the CUDA backend at m=2048, n=k=8192
 *                     (fp16 tensor cores, fp32 accumulation; median of 3)
 *
 * Format 2 adds the rates the cost model reads, all on the profiled
 * backend (every sample long enough to time: as many calls as fill
 * about 20 ms, after a warm-up call; median of 3):
 *   gemm              sl_gemm as the model calls it (fp32 x, fp16 w) at
 *                     m = 1, 2, 4, ..., 1024 with n = k = 2048 on the CPU
 *                     backend, 8192 on CUDA (quick: m up to 64, n = k = 256);
 *                     each call reads the next of copies of the weights
 *                     that together fill 1 GiB (quick: one copy), so that
 *                     they come from memory, as a decode step's do, not
 *                     from a cache a single matrix stays in
 *   gemm_q4           the same with 4-bit weights (sl_gemm_args.wq, the
 *                     dequantising GEMM of compress_weight) at the same m, n
 *                     and k; optional (absent or null in files before it: the
 *                     cost model then uses the gemm curve for it, i.e. takes
 *                     the dequantisation as free)
 *   gemm_hot          the gemm curve's GEMM on one copy of its weights, so
 *                     that they stay in the last-level cache from call to
 *                     call, as a layer's micro-batches after its first find
 *                     them; optional (absent or null: every GEMM at the
 *                     cold curve's rate)
 *   llc_bytes         the last-level cache (sysconf's level 3, else level
 *                     2): a layer's weights that fit it are read hot by its
 *                     micro-batches after the first; optional (absent or
 *                     null: unknown)
 *   llc_hot_bytes     the part of it the GEMM keeps: the largest set of
 *                     the curve's weights that the GEMM at 1 row, reading
 *                     its copies in turn, still reads at the middle of the
 *                     cold and hot rates or faster (copies of 2 up to 32);
 *                     where given, it replaces llc_bytes in the cost model
 *                     (a VM's share of its host's cache is smaller than
 *                     what hwloc reports); optional (absent or null: not
 *                     measured)
 *   gemm_shapes       the same at a model's own GEMM shapes (n x k: its
 *                     decoder's matrices and its head; `sluice profile
 *                     --model DIR` or `--dummy NAME`, repeatable) at m = 1,
 *                     2, 4, 8, 16, 32, 64, 512 (quick: 1, 8; older
 *                     profiles: 1, 8, 64, 512), cold as above: a list of
 *                     curves, the cost model's rate at such a shape is the
 *                     gemm curve's scaled by their ratio at the nearest of
 *                     these m (interpolated between them); optional (absent,
 *                     null or empty: the gemm curve for every shape)
 *   copy_gbps         sl_copy_h2d of 64 MiB on a queue (CPU backend: its
 *                     copy queue's memcpy, = h2d_gbps; CUDA: = h2d_gbps)
 *   copy_latency_us   4 KiB sl_copy_h2d calls issued back to back on one
 *                     queue, then one sync: the time per copy
 *   op_latency_us     1-row sl_layernorm calls (n = 64) back to back on one
 *                     queue, then one sync: the time per op
 *   attn_decode_gbps  sl_attn_decode of 16 sequences x 12 heads x 64 head
 *                     dim over 1024 cached fp16 tokens: K and V bytes read
 *                     per second (quick: 4 sequences, 128 tokens); each
 *                     call over the next of copies of the caches that
 *                     together fill 1 GiB, as the GEMM's weights
 *   attn_prefill_gflops  sl_attn_prefill of 4 sequences x 12 heads x 64
 *                     over a 512-token prompt (quick: 64), counting
 *                     4 * nseq * nh * hd * t * (t + 1) / 2 FLOPs
 *   cpu_attn_gbps     on CUDA, the CPU backend's sl_attn_decode (the host
 *                     attention of cpu_cache_compute) on the same shape;
 *                     on the CPU backend, attn_decode_gbps
 *   disk_write_gbps   sequential O_DIRECT writes in the offload directory
 *                     through the disk store's engine in requests of its
 *                     chunk size (1 MiB), 32 in flight, to completion
 *                     (sl_disk_probe, the same file as disk_read_gbps)
 *   copy_overlap      the CPU backend only: the share of a copy stream that
 *                     hides under a GEMM stream when both run at once (its
 *                     copy queue's memcpy of 8 MiB blocks beside decode-sized
 *                     GEMMs, m = 16, n = k = 2048, the copies sized to take
 *                     as long): (gemm alone + copy alone - both together) /
 *                     the shorter alone, in [0, 1], median of 5.  The cores are shared, so the model can neither
 *                     add the two nor take their maximum; 0 on CUDA, where
 *                     copies have their own engine, and in files without it
 *                     (optional: older format 2 files load)
 *   disk_passes, disk_read_spread  disk_read_gbps is the median of this
 *                     many passes over the probe file in its pattern (16 MiB
 *                     requests, 4 outstanding), spread = (max - min) / median
 *                     of them; files without them: one pass (0)
 *   disk_segment_read the read rate against the request size as the weights
 *                     and the KV cache read a segment (a layer's or half
 *                     layer's disk part, a micro-batch's cache): requests of
 *                     256 KiB to 64 MiB, 2 outstanding (the next unit's read
 *                     is queued before the current one is waited for), each
 *                     size over its own part of the probe file in every
 *                     pass, the passes sustained back to back; the median
 *                     pass and the spread.  Absent: every read at
 *                     disk_read_gbps
 *   disk_page_write_gbps  4 KiB writes scattered over the probe file, 64
 *                     outstanding: the KV cache's decode writes (a changed
 *                     page of each sequence's K and V blocks).  Absent: those
 *                     writes at disk_write_gbps
 *   disk_overlap      the CPU backend only: the share of the disk's segment
 *                     reads that hides under a GEMM stream (measured as
 *                     copy_overlap is, the reads 16 MiB, 2 outstanding,
 *                     on a thread of their own beside the GEMMs);
 *                     absent (have_disk_overlap false): all of it, as before
 *   zstd_gbps, zstd_ratio  frames as sluice convert --zstd writes them
 *                     (zseg.h: 4 MiB of byte-shuffled fp16, level 1; quick:
 *                     1 MiB) of normal values (sd 0.02, a trained layer's
 *                     spread), 4 per thread, decompressed as the weight
 *                     streamer does (a frame per OpenMP thread at a time):
 *                     raw bytes out per second, median of 3; and the
 *                     frames' bytes on disk (each rounded up to a page)
 *                     over the raw ones, the ratio the cost model takes
 *                     where no store says.  Optional (absent: 0, not
 *                     measured)
 *   load_average      the machine's 1-minute load average as the profile
 *                     began (/proc/loadavg): a profile measured while other
 *                     work held the cores under-rates the machine; optional
 *                     (absent or null: unknown, -1)
 *   dev_reserve_bytes the backend's device bytes that are not the caller's
 *                     (dev_used - data_used) after the GEMMs and attention
 *                     ran: cuBLAS's workspace; 0 on the CPU backend
 *   fit_prefill, fit_decode  sluice profile --fit: measured over predicted
 *                     seconds per phase (below); optional
 *   fit_hot           sluice profile --fit on the CPU backend: {m: [...],
 *                     share: [...]}, the share of gemm_hot's gain over the
 *                     cold rate that a layer's micro-batches after its
 *                     first reach at m rows a micro-batch, fitted on short
 *                     runs; optional (absent or null: the whole gain)
 *   build             the sluice that measured: SL_VERSION+sl_build_id (the
 *                     commit, and a hash of the changes not committed)
 *   machine           what a cached profile must match to be reused
 *                     (sl_profile_obtain): backend, threads, build, the
 *                     CPU's model name and PU count, the GPU's name
 *
 * quick: measured with small sizes (tests: the numbers mean little).  Rates
 * are in 1e9 bytes/s and 1e9 / 1e12 FLOP/s, latencies in microseconds.  A
 * rate not measured is 0 (no offload directory; no GPU); the JSON writes it
 * as null.
 *
 * The topology and the GPU are recorded as the profile saw them (hwloc's
 * view, the backend's device info), in types of their own: a profile read
 * from a file describes a machine, not the one running.
 */
#ifndef SL_PROFILE_H
#define SL_PROFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SL_PROFILE_FORMAT_VERSION 2 /* reads 1 and 2 */
#define SL_PROFILE_MAX_NODES 64 /* nodes listed (more are counted) */

typedef struct sl_profile_node {
	int os_index;          /* the kernel's node number */
	uint64_t memory_bytes; /* memory local to the node */
	int cores, pus;        /* cores and hardware threads nearest it */
	char cpus[64];         /* its PUs as a list, e.g. "0-15,32-47" */
} sl_profile_node;

typedef struct sl_profile_topo {
	bool loaded;   /* false: hwloc failed; one node and sysconf's counts */
	int packages;  /* 0 where hwloc could not tell */
	int cores, pus;
	int nnodes;    /* NUMA nodes, at least 1 */
	sl_profile_node node[SL_PROFILE_MAX_NODES]; /* the first min(nnodes, 64) */
	char binding[128]; /* the process's CPU binding as a list, e.g. "0-15" */
	int binding_pus;   /* PUs in it */
	int binding_node;  /* the node whose cores hold all of it; -1: several */
} sl_profile_topo;

typedef struct sl_profile_gpu {
	char name[256];       /* e.g. "NVIDIA H100 80GB HBM3" */
	char pci_bus_id[32];  /* "0000:65:00.0"; empty where unknown */
	uint64_t memory_bytes;
	int numa_node;        /* -1: none */
} sl_profile_gpu;

/* A rate against the rows M of a GEMM (n x k fixed): points in increasing
 * M, GFLOP/s at each. */
#define SL_PROFILE_CURVE_MAX 16
#define SL_PROFILE_SHAPES_MAX 24 /* gemm_shapes: a few models' distinct n x k */
typedef struct sl_profile_curve {
	int npoints; /* 0: not measured */
	int n, k;
	int m[SL_PROFILE_CURVE_MAX];
	double gflops[SL_PROFILE_CURVE_MAX];
} sl_profile_curve;

/* The disk's read rate against the request size: points in increasing
 * size, the median pass's GB/s and the passes' spread at each. */
#define SL_PROFILE_DISK_MAX 8
typedef struct sl_profile_disk_curve {
	int npoints;     /* 0: not measured */
	int outstanding; /* requests outstanding */
	uint64_t bytes[SL_PROFILE_DISK_MAX];
	double gbps[SL_PROFILE_DISK_MAX];
	double spread[SL_PROFILE_DISK_MAX]; /* (max - min) / median of the passes */
} sl_profile_disk_curve;

#define SL_PROFILE_FIT_HOT_MAX 4

typedef struct sl_profile {
	bool quick;
	sl_profile_topo topo;
	char backend[16];      /* "cpu" or "cuda": the backend measured */
	bool have_gpu;
	sl_profile_gpu gpu;    /* with have_gpu */
	int pinned_node;       /* node for pinned host memory; -1: none chosen */
	int io_node;           /* node for the disk's I/O threads; -1: none */
	int threads;
	char cpu_gemm[16];     /* the CPU backend's GEMM every CPU product was
				* measured with (--cpu-gemm: sluice, openblas, amx,
				* bf16); "": a file before it (sluice's) */

	double mem_read_gbps;
	uint64_t mem_bytes;

	double cpu_gemm_gflops;
	int cpu_gemm_m, cpu_gemm_n, cpu_gemm_k;

	double disk_read_gbps; /* 0: not measured */
	char disk_engine[64];  /* "": not measured */
	uint64_t disk_bytes;
	char offload_dir[4096]; /* "": none given */

	double h2d_gbps, d2h_gbps; /* 0: no GPU */
	uint64_t copy_bytes;
	double gpu_gemm_tflops;
	int gpu_gemm_m, gpu_gemm_n, gpu_gemm_k; /* 0: not measured */

	/* format 2: the rates the cost model (runtime/cost.h) reads; 0 where
	 * not measured (a format 1 file), and the model then falls back on
	 * the rates above */
	sl_profile_curve gemm;      /* the profiled backend's sl_gemm against M */
	sl_profile_curve gemm_q4;   /* the same with 4-bit weights (wq); npoints 0:
				     * not measured (optional in a file) */
	sl_profile_curve gemm_hot;  /* the gemm curve with its weights in the cache;
				     * npoints 0: not measured (optional in a file) */
	uint64_t llc_bytes;         /* the last-level cache; 0: unknown */
	uint64_t llc_hot_bytes;     /* the weights the GEMM keeps hot in it, as
				     * measured; 0: not measured (llc_bytes) */
	int n_gemm_shapes;          /* curves in gemm_shapes; 0: none measured */
	sl_profile_curve gemm_shapes[SL_PROFILE_SHAPES_MAX]; /* at a model's own
				     * n x k (optional in a file) */
	double copy_gbps;           /* the backend's h2d copy on a queue (CPU
				     * backend: a memory copy of 64 MiB; CUDA:
				     * h2d_gbps) */
	double copy_latency_us;     /* one small copy (4 KiB) on a queue, issue to
				     * done, in a stream of them */
	double op_latency_us;       /* one tiny op (a 1-row layernorm) in a stream */
	double attn_decode_gbps;    /* sl_attn_decode: KV cache bytes read per second */
	double attn_prefill_gflops; /* sl_attn_prefill at a 512-token prompt */
	double cpu_attn_gbps;       /* the host's decode attention (cpu_cache_compute) */
	double disk_write_gbps;     /* O_DIRECT writes at the store's request size */
	int disk_passes;            /* passes disk_read_gbps is the median of; 0: one */
	double disk_read_spread;    /* (max - min) / median of those passes (with
				     * disk_passes) */
	sl_profile_disk_curve disk_seg; /* reads against the request size */
	double disk_page_write_gbps; /* scattered 4 KiB writes; 0: not measured */
	bool have_disk_overlap;     /* disk_overlap measured; false: the model
				     * hides the disk wholly, as before */
	double disk_overlap;        /* CPU backend: the share of disk reads hidden
				     * under GEMMs, [0, 1] */
	double load_average;        /* 1-minute load average as it began; -1: unknown */
	double copy_overlap;        /* CPU backend: the share of copies hidden
				     * under GEMMs on the shared cores, [0, 1] */
	double zstd_gbps;           /* a zstd store's frames decompressed, raw
				     * bytes out; 0: not measured */
	double zstd_ratio;          /* such frames' disk bytes over the raw ones,
				     * (0, 1]; 0: not measured */
	uint64_t dev_reserve_bytes; /* the backend's own device workspace (cuBLAS's,
				     * its scratch), outside the run plan */
	/* sluice profile --fit: what a whole job's compute takes over what the
	 * model's rates predict, per phase (measured / predicted seconds of
	 * short runs with everything on the device, the median); the cost model
	 * multiplies its compute by them.  0: not fitted (taken as 1) */
	double fit_prefill, fit_decode;
	/* and on the CPU backend the share of the cache's gain (gemm_hot over
	 * the cold rate) that a layer's micro-batches after its first reach, at
	 * fit_hot_m rows a micro-batch (increasing), each in [0, 1]: the
	 * micro-benchmark keeps its weights in the cache between calls, a run's
	 * other work between micro-batches need not.  0 points: not fitted (the
	 * whole gain) */
	int fit_hot_n;
	int fit_hot_m[SL_PROFILE_FIT_HOT_MAX];
	double fit_hot_share[SL_PROFILE_FIT_HOT_MAX];
	char fit_model[64];         /* the dummy model the fit ran ("": none) */
	char build[64];             /* the sluice that measured (SL_VERSION+sl_build_id) */
	char machine[768];          /* the cache's key (sl_profile_obtain); "": none */

	double seconds; /* the whole profile */
} sl_profile;

/*
 * Check that a JSON file can be written at path (creates and removes
 * path.tmp): SL_EIO "cannot write PATH (...)" where it cannot.
 */
int sl_profile_check_json_path(const char *path);

/* Write the profile as one JSON object to path, atomically (path.tmp,
 * fsync, rename); doubles in the shortest form that reads back to the same
 * bits.  SL_EIO naming the path. */
int sl_profile_save_json(const sl_profile *p, const char *path);

/*
 * Read a profile that sl_profile_save_json wrote.  Every field it writes
 * must be there with its type (a rate: a positive number, or null where not
 * measured); fields it does not write are ignored.  On error *p is
 * unchanged and the one-line message names the file and the field
 * ("topology.numa_nodes[1].cores"):
 *   SL_ENOTFOUND     no such file
 *   SL_EIO           cannot open or read it
 *   SL_EFORMAT       not JSON (with the line), not a sluice profile, a field
 *                    missing or of the wrong type, a string too long
 *   SL_ERANGE        a value out of its range (a negative rate or count)
 *   SL_EUNSUPPORTED  a format_version this sluice does not read
 * A format 1 file reads with the format 2 fields 0 (an empty curve, "").
 */
int sl_profile_load(const char *path, sl_profile *p);

#endif
