/* cuda_13.h - CUDA 13's exports that libvgpu.so wraps, declared where the cuda.h built
 * against is older (the nvidia-cuda-runtime-cu12 wheel's is 12.9). Shared by libvgpu.so, the
 * fake driver, which defines them, and the tests, which call them by name. Include after
 * cuda.h. */
#ifndef VGPU_CUDA_13_H
#define VGPU_CUDA_13_H

#include <cuda.h>

#if CUDA_VERSION < 13000
/* Blocks until the named context's work is done; NULL names the current context. From 13.0
 * cuGetProcAddress answers the name cuCtxSynchronize with it (CUDA 13's cudaTypedefs.h:
 * PFN_cuCtxSynchronize_v13000 takes the context), so a runtime built for 13.0 may call it for
 * cudaDeviceSynchronize. */
CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx);
/* The named context's device (NULL: the current one's); cuCtxGetDevice's ABI from 13.0 as above
 * (PFN_cuCtxGetDevice_v13000). Declared for the fake, which exports it; a query the library
 * does not wrap. */
CUresult CUDAAPI cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx);
#else
/* What CUDA 13's cuda.h declares only for the driver's own build (its
 * __CUDA_API_VERSION_INTERNAL list), where 12.x declared them: exports drivers keep for older
 * programs, which libvgpu.so still wraps. */
CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult CUDAAPI cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                                unsigned int flags, CUdevice dev);
#endif

#if CUDA_VERSION < 13010
/* CUDA 13.1's multicast bindings naming the device bound; cuGetProcAddress answers the names
 * cuMulticastBindMem and cuMulticastBindAddr with them from 13.1 (PFN_..._v13010). */
CUresult CUDAAPI cuMulticastBindMem_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev,
                                       size_t mcOffset, CUmemGenericAllocationHandle memHandle,
                                       size_t memOffset, size_t size, unsigned long long flags);
CUresult CUDAAPI cuMulticastBindAddr_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev,
                                        size_t mcOffset, CUdeviceptr memptr, size_t size,
                                        unsigned long long flags);
#endif

#endif
