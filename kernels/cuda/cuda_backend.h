/* cuda_backend.h - the CUDA backend (C interface; built only with nvcc). */
#ifndef SL_CUDA_BACKEND_H
#define SL_CUDA_BACKEND_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* True when a driver and at least one GPU are present. */
bool sl_cuda_usable(void);

/* Create the backend on device 0.  Fails with SL_EDEVICE and a message
 * naming the cause where there is no GPU or driver. */
int sl_cuda_backend_create(sl_backend **out);

#ifdef __cplusplus
}
#endif

#endif
