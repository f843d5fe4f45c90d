/*
 * emu_backend.cc - the CUDA backend's sources as one C++ unit for the CPU
 * emulation (cuda_emu.h): built with -DSL_CU_EMU by emu/meson.build or
 * run-emu-tests.sh, never by nvcc.
 */
#include "../cuda_backend.cu"
#include "../gemm.cu"
#include "../layernorm.cu"
#include "../rmsnorm.cu"
#include "../rope.cu"
#include "../swiglu.cu"
#include "../embed.cu"
#include "../argmax.cu"
#include "../attention.cu"
#include "../h2o.cu"
