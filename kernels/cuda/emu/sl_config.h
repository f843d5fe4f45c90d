/* sl_config.h for the CUDA emulation build (emu/meson.build): found before
 * the generated one by the targets in this folder, so that the registry
 * (kernels/backend.c) and the tests see a CUDA backend: the emulated one. */
#ifndef SL_CONFIG_EMU_H
#define SL_CONFIG_EMU_H
#define SL_HAVE_CUDA 1
#define SL_VERSION "emu"
#endif
