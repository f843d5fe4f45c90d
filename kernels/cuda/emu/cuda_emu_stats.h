/*
 * cuda_emu_stats.h - what the CUDA emulation (cuda_emu.h) counts about the
 * host's waits, for tests in C or C++ that run on it.
 */
#ifndef SL_CUDA_EMU_STATS_H
#define SL_CUDA_EMU_STATS_H

#ifdef __cplusplus
extern "C" {
#endif

/* Host waits (cudaStreamSynchronize, cudaEventSynchronize) that had to run
 * queued compute and left none queued anywhere: on a GPU the device runs
 * dry at each one until the host issues more.  A schedule that orders its
 * queues by events waits for earlier work while later work is queued, and
 * runs dry only where the host needs a result (the next token). */
unsigned long sl_emu_dry_waits(void);

#ifdef __cplusplus
}
#endif

#endif
