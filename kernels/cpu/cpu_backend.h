/* cpu_backend.h - the CPU backend: the reference and the no-GPU mode. */
#ifndef SL_CPU_BACKEND_H
#define SL_CPU_BACKEND_H

#include "backend.h"

/* nthreads: worker threads for ops (0 = all online cores). */
int sl_cpu_backend_create(int nthreads, sl_backend **out);

/* The instruction set b's kernels use ("generic", "avx2", "avx512"), or
 * NULL when b is not a CPU backend. */
const char *sl_cpu_backend_kernels(const sl_backend *b);

/*
 * The CPU GEMM b runs (--cpu-gemm): "sluice" (the default) is sluice's own,
 * which computes every output in one order whatever the number of rows, so
 * a sequence's results do not depend on what is batched with it (batch
 * invariance, kernels/cpu/cpu_gemm.c); "openblas" gives the products above
 * the direct kernel's rows to OpenBLAS's sgemm, whose kernel and blocking
 * depend on the row count: faster where OpenBLAS has kernels tuned for the
 * CPU, not batch invariant.  Refused (SL_EUNSUPPORTED) in a build without
 * OpenBLAS; no effect on a backend that is not the CPU's.  "amx" runs them
 * on Intel AMX tiles with both operands rounded to bf16 (kernels/cpu/
 * cpu_amx.c): not batch invariant either, at bf16's precision; refused
 * (SL_EUNSUPPORTED, saying why) where the CPU or the kernel has no AMX.
 * "bf16" rounds both operands to bf16 and runs AVX512-BF16's dot products
 * (cpu_amx.c), refused likewise where the CPU has none.
 */
int sl_cpu_backend_set_gemm(sl_backend *b, const char *name);

/* The names sl_cpu_backend_set_gemm knows, for usage messages. */
#define SL_CPU_GEMM_NAMES "sluice, openblas, amx or bf16"

/* Whether name is one of SL_CPU_GEMM_NAMES (whether or not this build and
 * CPU can run it: sl_cpu_backend_set_gemm says that). */
bool sl_cpu_gemm_known(const char *name);

/* "sluice", "openblas", "amx" or "bf16", or NULL when b is not a CPU
 * backend. */
const char *sl_cpu_backend_gemm(const sl_backend *b);

/* OpenBLAS's build and the core it chose (OPENBLAS_CORETYPE overrides it);
 * false, both NULL, in a build without OpenBLAS. */
bool sl_cpu_backend_blas_info(const char **config, const char **core);

#endif
