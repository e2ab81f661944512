/* cuda_13.h - CUDA 13.0's exports that libvgpu.so wraps, declared where the cuda.h built
 * against is older (the nvidia-cuda-runtime-cu12 wheel's is 12.9). Shared by libvgpu.so, the
 * fake driver, which defines them, and the tests, which call them by name. Include after
 * cuda.h. */
#ifndef VGPU_CUDA_13_H
#define VGPU_CUDA_13_H

#include <cuda.h>

#if CUDA_VERSION < 13000
/* Blocks until the named context's work is done; NULL names the current context. A symbol of
 * its own (cuda-python asks cuGetProcAddress for it by this name; the fake answers
 * cuCtxSynchronize at 13.0 with CUDA 2.0's export, a real driver not seen). */
CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx);
#endif

#endif
