/* cuda_v1.h - the legacy exports, which drivers still export and cuda.h declares only for the
 * driver's own build: the CUDA 2.x ABI (32-bit device pointers and sizes, contexts) and the CUDA 10/11
 * graph ABI (instantiate with an error node and a log buffer, update with an error node, a
 * kernel node's parameters without the CUDA 12 fields).
 * Shared by libvgpu.so, which wraps them, the fake driver, which defines them, and the tests,
 * which call them by name. Include after cuda.h. */
#ifndef VGPU_CUDA_V1_H
#define VGPU_CUDA_V1_H

#include <cuda.h>

/* cuda.h maps these names to _v2. */
#undef cuMemAlloc
#undef cuMemAllocPitch
#undef cuMemFree
#undef cuMemGetInfo
#undef cuDeviceTotalMem
#undef cuArrayCreate
#undef cuArray3DCreate
#undef cuGraphInstantiate
#undef cuGraphExecUpdate
#undef cuGraphExecKernelNodeSetParams
#undef cuGraphKernelNodeGetParams
#undef cuCtxCreate
#undef cuCtxDestroy
#undef cuDevicePrimaryCtxRelease
#undef cuDevicePrimaryCtxReset
#undef cuStreamDestroy
#undef cuEventDestroy
#undef cuCtxPushCurrent
#undef cuCtxPopCurrent
#undef cuMemcpyDtoH
#undef cuMemsetD8
#undef cuMemsetD16
#undef cuMemsetD32
#undef cuMemsetD2D8
#undef cuMemsetD2D16
#undef cuMemsetD2D32

typedef unsigned int v1_ptr;
struct array_v1 { /* CUDA_ARRAY_DESCRIPTOR_v1 */
    unsigned int Width, Height;
    CUarray_format Format;
    unsigned int NumChannels;
};
struct array3d_v1 { /* CUDA_ARRAY3D_DESCRIPTOR_v1 */
    unsigned int Width, Height, Depth;
    CUarray_format Format;
    unsigned int NumChannels, Flags;
};
CUresult cuMemAlloc(v1_ptr *dptr, unsigned int bytes);
CUresult cuMemAllocPitch(v1_ptr *dptr, unsigned int *pitch, unsigned int width,
                         unsigned int height, unsigned int elem);
CUresult cuMemFree(v1_ptr dptr);
CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total_bytes);
CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev);
CUresult cuArrayCreate(CUarray *array, const struct array_v1 *desc);
CUresult cuArray3DCreate(CUarray *array, const struct array3d_v1 *desc);
/* Contexts: CUDA 2.0 (create, destroy) and 7.0 (the primary context's release and reset),
 * the same arguments as their _v2. */
CUresult cuCtxCreate(CUcontext *ctx, unsigned int flags, CUdevice dev);
CUresult cuCtxDestroy(CUcontext ctx);
CUresult cuDevicePrimaryCtxRelease(CUdevice dev);
CUresult cuDevicePrimaryCtxReset(CUdevice dev);
/* CUDA 2.0's context stack, the same arguments as its _v2 (CUDA 4.0). */
CUresult cuCtxPushCurrent(CUcontext ctx);
CUresult cuCtxPopCurrent(CUcontext *ctx);
/* Streams: CUDA 2.0's destroy, the same arguments as its _v2. */
CUresult cuStreamDestroy(CUstream stream);
/* Events: CUDA 2.0's destroy, the same arguments as its _v2. */
CUresult cuEventDestroy(CUevent event);
/* Copies: CUDA 2.0's copy to the host, a 32-bit source and size. */
CUresult cuMemcpyDtoH(void *dst, v1_ptr src, unsigned int bytes);
/* Memsets: CUDA 2.0's, a 32-bit pointer, count, pitch and width. */
CUresult cuMemsetD8(v1_ptr dst, unsigned char value, unsigned int n);
CUresult cuMemsetD16(v1_ptr dst, unsigned short value, unsigned int n);
CUresult cuMemsetD32(v1_ptr dst, unsigned int value, unsigned int n);
CUresult cuMemsetD2D8(v1_ptr dst, unsigned int pitch, unsigned char value, unsigned int width,
                      unsigned int height);
CUresult cuMemsetD2D16(v1_ptr dst, unsigned int pitch, unsigned short value, unsigned int width,
                       unsigned int height);
CUresult cuMemsetD2D32(v1_ptr dst, unsigned int pitch, unsigned int value, unsigned int width,
                       unsigned int height);
/* CUDA 10.0 and 11.0 (same arguments), and CUDA 10.2. */
CUresult cuGraphInstantiate(CUgraphExec *exec, CUgraph graph, CUgraphNode *error_node,
                            char *log, size_t log_size);
CUresult cuGraphInstantiate_v2(CUgraphExec *exec, CUgraph graph, CUgraphNode *error_node,
                               char *log, size_t log_size);
CUresult cuGraphExecUpdate(CUgraphExec exec, CUgraph graph, CUgraphNode *error_node,
                           CUgraphExecUpdateResult *result);
/* CUDA 10.0 and 10.1: kernel node parameters without the CUDA 12 fields. */
CUresult cuGraphKernelNodeGetParams(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS_v1 *params);
CUresult cuGraphExecKernelNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                        const CUDA_KERNEL_NODE_PARAMS_v1 *params);

#endif
