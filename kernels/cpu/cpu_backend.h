/* cpu_backend.h - the CPU backend: the reference and the no-GPU mode. */
#ifndef SL_CPU_BACKEND_H
#define SL_CPU_BACKEND_H

#include "backend.h"

/* nthreads: worker threads for ops (0 = all online cores). */
int sl_cpu_backend_create(int nthreads, sl_backend **out);

#endif
