/*
 * profile_measure.h - `sluice profile`'s measuring: the machine's topology
 * and the rates a cost model needs (policy/profile.h says what each is and
 * how it is measured), each in a fraction of a second to a few seconds.
 *
 * It lives here, not in policy/, because it drives a backend (kernels/)
 * and the disk store (offload/), which runtime/ is the first layer to see
 * both of; the profile it fills is policy/'s plain data, so the cost model
 * reads a profile without linking any of this.
 */
#ifndef SL_PROFILE_MEASURE_H
#define SL_PROFILE_MEASURE_H

#include "profile.h"
#include "sl_common.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef struct sl_profile_opts {
	const char *backend;     /* "cpu", "cuda" or "auto" (NULL: auto) */
	const char *offload_dir; /* NULL: the disk is not measured */
	int threads;             /* CPU threads; 0: all */
	const char *cpu_gemm;    /* the CPU backend's GEMM (--cpu-gemm): sluice,
				  * openblas, amx or bf16; NULL: sluice */
	bool quick;              /* small sizes, for tests */
	bool cache_only;         /* sl_profile_obtain: never measure (a prediction
				  * must not slow its run down) */
	FILE *log;               /* one line per result as it is measured; NULL: none */
	int nshapes;             /* GEMM shapes (n, k) to measure gemm_shapes at */
	int shapes[SL_PROFILE_SHAPES_MAX][2];
} sl_profile_opts;

/* Host memory read bandwidth in GB/s: threads sum a buffer of `bytes`
 * (larger than the caches), median of 3; 0 if it cannot be measured.  The
 * decode roofline on the CPU backend. */
double sl_profile_mem_read_gbps(size_t bytes, int threads);

/*
 * Measure.  Checks the offload directory first (missing, not a directory,
 * not writable: SL_ENOTFOUND / SL_EIO naming it, before anything runs).
 * Other errors: the backend's (SL_EUNSUPPORTED for cuda in a build without
 * it, SL_EDEVICE), SL_ENOMEM, the disk probe's.
 */
int sl_profile_run(const sl_profile_opts *o, sl_profile *out);

/* Add the GEMM shape n x k to o's (once): gemm_shapes then holds a curve
 * at it.  SL_EINVAL when o would hold more than SL_PROFILE_SHAPES_MAX.
 * (sl_cost_profile_shapes adds a model's.) */
static inline int sl_profile_add_shape(sl_profile_opts *o, int n, int k)
{
	for (int j = 0; j < o->nshapes; j++)
		if (o->shapes[j][0] == n && o->shapes[j][1] == k)
			return 0;
	if (o->nshapes == SL_PROFILE_SHAPES_MAX)
		return sl_err(SL_EINVAL, "more than %d GEMM shapes to profile", SL_PROFILE_SHAPES_MAX);
	o->shapes[o->nshapes][0] = n;
	o->shapes[o->nshapes][1] = k;
	o->nshapes++;
	return 0;
}

/* Before measuring: that dir is a folder sluice can write in. */
int sl_profile_check_offload_dir(const char *dir);

/* sl_profile_obtain's return when it measured but could not write the
 * cache: the profile is good, sl_errmsg() says why it was not kept. */
#define SL_PROFILE_NOT_CACHED 1

/*
 * A profile of this machine and build, measured once and cached: reads
 * cache_dir/sluice-profile-<backend>.json and reuses it where its machine
 * key (backend, threads, build, the CPU's model name and PU count, the
 * GPU's name), its offload directory and its quick flag match o's; else
 * measures (sl_profile_run, with o; o->quick only in tests) and saves it
 * there atomically.  A cached profile that lacks a curve at one of o's
 * shapes is measured again with its shapes and o's (unless cache_only:
 * then it is returned as it is, the cost model reading those shapes at
 * the gemm curve's rate).  cache_dir NULL: o->offload_dir if given, else
 * $XDG_CACHE_HOME/sluice (~/.cache/sluice); a cache folder other than the
 * offload directory is created if missing.
 * *measured (may be NULL) says which.  A cached file that cannot be read
 * or belongs to another machine or build is measured again, not an error;
 * with o->cache_only it is SL_ENOTFOUND instead, and nothing is measured
 * or created.
 * Returns 0, SL_PROFILE_NOT_CACHED (measured; the cache could not be
 * written: the caller may say so), or sl_profile_run's errors.
 */
int sl_profile_obtain(const sl_profile_opts *o, const char *cache_dir, sl_profile *out, bool *measured);

#endif
