/* cuda_driver.h - what the CUDA driver wrappers share: the real driver's functions (the
 * loader fills them in at the first call) and the questions every wrapper asks of it.
 * The wrappers, one file per concern: cuda.c (loading, cuInit, cuGetProcAddress),
 * cuda_memory.c (allocations and frees), cuda_report.c (what the container is told it has),
 * cuda_launch.c (the SM limiter's gate), cuda_graph.c (what a graph launch costs),
 * cuda_graph_memory.c (what a graph's allocation nodes take), cuda_context.c (contexts made and
 * destroyed), cuda_limits.c (context limits that reserve memory), cuda_sync.c (waits, for
 * events too, that tell the SM limiter the process's work is done). Each forwards to the real
 * driver; only the accounting around the call is ours. */
#ifndef VGPU_CUDA_DRIVER_H
#define VGPU_CUDA_DRIVER_H

#include <cuda.h>
#include <stdint.h>

#include "kernels.h"
#include "loader.h"
#include "throttle.h"
#include "vgpu_region.h"

#undef cuGetProcAddress /* cuda.h renames it to _v2; the v1 ABI is a separate export */
#include "cuda_v1.h" /* the legacy v1 exports (CUDA 2.x ABI), wrapped here too */
#include "cuda_13.h" /* CUDA 13.0's, where cuda.h is older */

#define VGPU_EXPORT __attribute__((visibility("default")))

/* The driver's answer to a call the SM limiter gated (throttle.h, vgpu_throttle_answered): a
 * call it took takes its tokens, a refused one none. With no limit, one predictable branch. */
static inline CUresult vgpu_answered(CUresult rc)
{
    if (__builtin_expect(vgpu_throttle_enabled, 0))
        vgpu_throttle_answered(rc != CUDA_SUCCESS);
    return rc;
}

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void **, void **);
typedef CUresult (*launch_ex_fn)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*coop_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                            unsigned, unsigned, CUstream, void **);
typedef CUresult (*graph_launch_fn)(CUgraphExec, CUstream);
typedef CUresult (*gpa_v1_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*gpa_v2_fn)(const char *, void **, int, cuuint64_t,
                              CUdriverProcAddressQueryResult *);

/* The real driver's functions: those hooked, and those only called. */
struct vgpu_cuda_real {
    CUresult (*cuInit)(unsigned int);
    gpa_v1_fn cuGetProcAddress;
    gpa_v2_fn cuGetProcAddress_v2;
    CUresult (*cuMemAlloc_v2)(CUdeviceptr *, size_t);
    CUresult (*cuMemFree_v2)(CUdeviceptr);
    CUresult (*cuMemAllocPitch_v2)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
    CUresult (*cuMemAllocManaged)(CUdeviceptr *, size_t, unsigned int);
    CUresult (*cuArrayCreate_v2)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
    CUresult (*cuArray3DCreate_v2)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
    CUresult (*cuArrayDestroy)(CUarray);
    CUresult (*cuMipmappedArrayCreate)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *,
                                       unsigned int);
    CUresult (*cuMipmappedArrayDestroy)(CUmipmappedArray);
    CUresult (*cuMemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                            unsigned long long);
    CUresult (*cuMemRelease)(CUmemGenericAllocationHandle);
    CUresult (*cuMemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                         unsigned long long);
    CUresult (*cuMemUnmap)(CUdeviceptr, size_t);
    CUresult (*cuMemRetainAllocationHandle)(CUmemGenericAllocationHandle *, void *);
    CUresult (*cuMemExportToShareableHandle)(void *, CUmemGenericAllocationHandle,
                                             CUmemAllocationHandleType, unsigned long long);
    CUresult (*cuMemMapArrayAsync)(CUarrayMapInfo *, unsigned int, CUstream);
    CUresult (*cuMemMapArrayAsync_ptsz)(CUarrayMapInfo *, unsigned int, CUstream);
    CUresult (*cuMulticastBindMem)(CUmemGenericAllocationHandle, size_t,
                                   CUmemGenericAllocationHandle, size_t, size_t,
                                   unsigned long long);
    CUresult (*cuMulticastBindAddr)(CUmemGenericAllocationHandle, size_t, CUdeviceptr, size_t,
                                    unsigned long long);
    CUresult (*cuMulticastBindMem_v2)(CUmemGenericAllocationHandle, CUdevice, size_t,
                                      CUmemGenericAllocationHandle, size_t, size_t,
                                      unsigned long long);
    CUresult (*cuMulticastBindAddr_v2)(CUmemGenericAllocationHandle, CUdevice, size_t,
                                       CUdeviceptr, size_t, unsigned long long);
    CUresult (*cuMulticastUnbind)(CUmemGenericAllocationHandle, CUdevice, size_t, size_t);
    CUresult (*cuMemAllocAsync)(CUdeviceptr *, size_t, CUstream);
    CUresult (*cuMemAllocAsync_ptsz)(CUdeviceptr *, size_t, CUstream);
    CUresult (*cuMemAllocFromPoolAsync)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*cuMemAllocFromPoolAsync_ptsz)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*cuMemFreeAsync)(CUdeviceptr, CUstream);
    CUresult (*cuMemFreeAsync_ptsz)(CUdeviceptr, CUstream);
    CUresult (*cuMemGetInfo_v2)(size_t *, size_t *);
    CUresult (*cuDeviceTotalMem_v2)(size_t *, CUdevice);
    CUresult (*cuMemAlloc)(v1_ptr *, unsigned int);
    CUresult (*cuMemAllocPitch)(v1_ptr *, unsigned int *, unsigned int, unsigned int, unsigned int);
    CUresult (*cuMemFree)(v1_ptr);
    CUresult (*cuMemGetInfo)(unsigned int *, unsigned int *);
    CUresult (*cuDeviceTotalMem)(unsigned int *, CUdevice);
    CUresult (*cuArrayCreate)(CUarray *, const struct array_v1 *);
    CUresult (*cuArray3DCreate)(CUarray *, const struct array3d_v1 *);
    launch_fn cuLaunchKernel, cuLaunchKernel_ptsz;
    launch_ex_fn cuLaunchKernelEx, cuLaunchKernelEx_ptsz;
    coop_fn cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_ptsz;
    CUresult (*cuLaunch)(CUfunction);
    CUresult (*cuLaunchGrid)(CUfunction, int, int);
    CUresult (*cuLaunchGridAsync)(CUfunction, int, int, CUstream);
    CUresult (*cuLaunchCooperativeKernelMultiDevice)(CUDA_LAUNCH_PARAMS *, unsigned int,
                                                     unsigned int);
    graph_launch_fn cuGraphLaunch, cuGraphLaunch_ptsz;
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*cuDevicePrimaryCtxRelease_v2)(CUdevice);
    CUresult (*cuDevicePrimaryCtxReset_v2)(CUdevice);
    CUresult (*cuCtxCreate_v2)(CUcontext *, unsigned int, CUdevice);
    CUresult (*cuCtxCreate_v3)(CUcontext *, CUexecAffinityParam *, int, unsigned int, CUdevice);
    CUresult (*cuCtxCreate_v4)(CUcontext *, CUctxCreateParams *, unsigned int, CUdevice);
    CUresult (*cuCtxDestroy_v2)(CUcontext);
    CUresult (*cuGreenCtxCreate)(CUgreenCtx *, CUdevResourceDesc, CUdevice, unsigned int);
    CUresult (*cuGreenCtxDestroy)(CUgreenCtx);
    CUresult (*cuCtxFromGreenCtx)(CUcontext *, CUgreenCtx);
    CUresult (*cuCtxSynchronize)(void);
    CUresult (*cuCtxSynchronize_v2)(CUcontext);
    CUresult (*cuStreamSynchronize)(CUstream);
    CUresult (*cuStreamSynchronize_ptsz)(CUstream);
    CUresult (*cuStreamQuery)(CUstream);
    CUresult (*cuStreamQuery_ptsz)(CUstream);
    CUresult (*cuStreamCreate)(CUstream *, unsigned int);
    CUresult (*cuStreamCreateWithPriority)(CUstream *, unsigned int, int);
    CUresult (*cuStreamDestroy)(CUstream);
    CUresult (*cuStreamDestroy_v2)(CUstream);
    CUresult (*cuCtxPushCurrent)(CUcontext); /* CUDA 2.0's, cuda_v1.h */
    CUresult (*cuCtxPopCurrent)(CUcontext *);
    CUresult (*cuEventCreate)(CUevent *, unsigned int);
    CUresult (*cuIpcOpenEventHandle)(CUevent *, CUipcEventHandle);
    CUresult (*cuEventRecord)(CUevent, CUstream);
    CUresult (*cuEventRecord_ptsz)(CUevent, CUstream);
    CUresult (*cuEventRecordWithFlags)(CUevent, CUstream, unsigned int);
    CUresult (*cuEventRecordWithFlags_ptsz)(CUevent, CUstream, unsigned int);
    CUresult (*cuEventSynchronize)(CUevent);
    CUresult (*cuEventQuery)(CUevent);
    CUresult (*cuEventDestroy)(CUevent);
    CUresult (*cuEventDestroy_v2)(CUevent);
    CUresult (*cuMemcpyDtoH)(void *, v1_ptr, unsigned int);
    CUresult (*cuMemcpyDtoH_v2)(void *, CUdeviceptr, size_t);
    CUresult (*cuMemcpyDtoH_v2_ptds)(void *, CUdeviceptr, size_t);
    CUresult (*cuMemcpy)(CUdeviceptr, CUdeviceptr, size_t);
    CUresult (*cuMemcpy_ptds)(CUdeviceptr, CUdeviceptr, size_t);
    CUresult (*cuMemsetD8)(v1_ptr, unsigned char, unsigned int);
    CUresult (*cuMemsetD8_v2)(CUdeviceptr, unsigned char, size_t);
    CUresult (*cuMemsetD8_v2_ptds)(CUdeviceptr, unsigned char, size_t);
    CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
    CUresult (*cuMemsetD8Async_ptsz)(CUdeviceptr, unsigned char, size_t, CUstream);
    CUresult (*cuMemsetD2D8)(v1_ptr, unsigned int, unsigned char, unsigned int, unsigned int);
    CUresult (*cuMemsetD2D8_v2)(CUdeviceptr, size_t, unsigned char, size_t, size_t);
    CUresult (*cuMemsetD2D8_v2_ptds)(CUdeviceptr, size_t, unsigned char, size_t, size_t);
    CUresult (*cuMemsetD2D8Async)(CUdeviceptr, size_t, unsigned char, size_t, size_t, CUstream);
    CUresult (*cuMemsetD2D8Async_ptsz)(CUdeviceptr, size_t, unsigned char, size_t, size_t,
                                       CUstream);
    CUresult (*cuMemsetD16)(v1_ptr, unsigned short, unsigned int);
    CUresult (*cuMemsetD16_v2)(CUdeviceptr, unsigned short, size_t);
    CUresult (*cuMemsetD16_v2_ptds)(CUdeviceptr, unsigned short, size_t);
    CUresult (*cuMemsetD16Async)(CUdeviceptr, unsigned short, size_t, CUstream);
    CUresult (*cuMemsetD16Async_ptsz)(CUdeviceptr, unsigned short, size_t, CUstream);
    CUresult (*cuMemsetD2D16)(v1_ptr, unsigned int, unsigned short, unsigned int, unsigned int);
    CUresult (*cuMemsetD2D16_v2)(CUdeviceptr, size_t, unsigned short, size_t, size_t);
    CUresult (*cuMemsetD2D16_v2_ptds)(CUdeviceptr, size_t, unsigned short, size_t, size_t);
    CUresult (*cuMemsetD2D16Async)(CUdeviceptr, size_t, unsigned short, size_t, size_t, CUstream);
    CUresult (*cuMemsetD2D16Async_ptsz)(CUdeviceptr, size_t, unsigned short, size_t, size_t,
                                        CUstream);
    CUresult (*cuMemsetD32)(v1_ptr, unsigned int, unsigned int);
    CUresult (*cuMemsetD32_v2)(CUdeviceptr, unsigned int, size_t);
    CUresult (*cuMemsetD32_v2_ptds)(CUdeviceptr, unsigned int, size_t);
    CUresult (*cuMemsetD32Async)(CUdeviceptr, unsigned int, size_t, CUstream);
    CUresult (*cuMemsetD32Async_ptsz)(CUdeviceptr, unsigned int, size_t, CUstream);
    CUresult (*cuMemsetD2D32)(v1_ptr, unsigned int, unsigned int, unsigned int, unsigned int);
    CUresult (*cuMemsetD2D32_v2)(CUdeviceptr, size_t, unsigned int, size_t, size_t);
    CUresult (*cuMemsetD2D32_v2_ptds)(CUdeviceptr, size_t, unsigned int, size_t, size_t);
    CUresult (*cuMemsetD2D32Async)(CUdeviceptr, size_t, unsigned int, size_t, size_t, CUstream);
    CUresult (*cuMemsetD2D32Async_ptsz)(CUdeviceptr, size_t, unsigned int, size_t, size_t,
                                        CUstream);
    CUresult (*cuCtxCreate)(CUcontext *, unsigned int, CUdevice);
    CUresult (*cuCtxDestroy)(CUcontext);
    CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
    CUresult (*cuDevicePrimaryCtxReset)(CUdevice);
    CUresult (*cuGraphInstantiateWithFlags)(CUgraphExec *, CUgraph, unsigned long long);
    CUresult (*cuGraphInstantiateWithParams)(CUgraphExec *, CUgraph,
                                             CUDA_GRAPH_INSTANTIATE_PARAMS *);
    CUresult (*cuGraphInstantiateWithParams_ptsz)(CUgraphExec *, CUgraph,
                                                  CUDA_GRAPH_INSTANTIATE_PARAMS *);
    CUresult (*cuGraphExecUpdate_v2)(CUgraphExec, CUgraph, CUgraphExecUpdateResultInfo *);
    CUresult (*cuGraphInstantiate)(CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t);
    CUresult (*cuGraphInstantiate_v2)(CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t);
    CUresult (*cuGraphExecUpdate)(CUgraphExec, CUgraph, CUgraphNode *, CUgraphExecUpdateResult *);
    CUresult (*cuGraphExecDestroy)(CUgraphExec);
    CUresult (*cuGraphExecKernelNodeSetParams)(CUgraphExec, CUgraphNode,
                                               const CUDA_KERNEL_NODE_PARAMS_v1 *);
    CUresult (*cuGraphExecKernelNodeSetParams_v2)(CUgraphExec, CUgraphNode,
                                                  const CUDA_KERNEL_NODE_PARAMS *);
    CUresult (*cuGraphExecChildGraphNodeSetParams)(CUgraphExec, CUgraphNode, CUgraph);
    CUresult (*cuGraphExecNodeSetParams)(CUgraphExec, CUgraphNode, CUgraphNodeParams *);
    CUresult (*cuGraphNodeSetEnabled)(CUgraphExec, CUgraphNode, unsigned int);
    graph_launch_fn cuGraphUpload, cuGraphUpload_ptsz;
    CUresult (*cuCtxSetLimit)(CUlimit, size_t);
    CUresult (*cuModuleUnload)(CUmodule);
    CUresult (*cuLibraryUnload)(CUlibrary);
    CUresult (*cuDeviceGraphMemTrim)(CUdevice);
    /* called, not hooked */
    CUresult (*cuCtxGetDevice)(CUdevice *);
    CUresult (*cuStreamGetDevice)(CUstream, CUdevice *);
    CUresult (*cuStreamGetCtx)(CUstream, CUcontext *);
    CUresult (*cuStreamGetCtx_v2)(CUstream, CUcontext *, CUgreenCtx *);
    CUresult (*cuCtxPushCurrent_v2)(CUcontext);
    CUresult (*cuCtxPopCurrent_v2)(CUcontext *);
    CUresult (*cuPointerGetAttribute)(void *, CUpointer_attribute, CUdeviceptr);
    CUresult (*cuDeviceGetMemPool)(CUmemoryPool *, CUdevice);
    CUresult (*cuMemPoolTrimTo)(CUmemoryPool, size_t);
    CUresult (*cuDevicePrimaryCtxGetState)(CUdevice, unsigned int *, int *);
    CUresult (*cuMemPoolGetAttribute)(CUmemoryPool, CUmemPool_attribute, void *);
    CUresult (*cuStreamIsCapturing)(CUstream, CUstreamCaptureStatus *);
    CUresult (*cuStreamIsCapturing_ptsz)(CUstream, CUstreamCaptureStatus *);
    CUresult (*cuCtxGetCurrent)(CUcontext *);
    CUresult (*cuThreadExchangeStreamCaptureMode)(CUstreamCaptureMode *);
    CUresult (*cuCtxSetCurrent)(CUcontext);
    CUresult (*cuDeviceGetCount)(int *);
    CUresult (*cuDeviceGet)(CUdevice *, int);
    CUresult (*cuDeviceGetUuid_v2)(CUuuid *, CUdevice);
    CUresult (*cuGraphGetNodes)(CUgraph, CUgraphNode *, size_t *);
    CUresult (*cuGraphNodeGetType)(CUgraphNode, CUgraphNodeType *);
    CUresult (*cuGraphKernelNodeGetParams_v2)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS *);
    CUresult (*cuGraphKernelNodeGetParams)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS_v1 *);
    CUresult (*cuGraphChildGraphNodeGetGraph)(CUgraphNode, CUgraph *);
    CUresult (*cuGraphMemAllocNodeGetParams)(CUgraphNode, CUDA_MEM_ALLOC_NODE_PARAMS *);
    CUresult (*cuGraphMemsetNodeGetParams)(CUgraphNode, CUDA_MEMSET_NODE_PARAMS *);
    CUresult (*cuGraphExecMemsetNodeSetParams)(CUgraphExec, CUgraphNode,
                                               const CUDA_MEMSET_NODE_PARAMS *, CUcontext);
    CUresult (*cuStreamGetCaptureInfo_v2)(CUstream, CUstreamCaptureStatus *, cuuint64_t *,
                                          CUgraph *, const CUgraphNode **, size_t *);
    CUresult (*cuStreamGetCaptureInfo_v2_ptsz)(CUstream, CUstreamCaptureStatus *, cuuint64_t *,
                                               CUgraph *, const CUgraphNode **, size_t *);
    CUresult (*cuDeviceGetGraphMemAttribute)(CUdevice, CUgraphMem_attribute, void *);
    CUresult (*cuCtxGetLimit)(size_t *, CUlimit);
    CUresult (*cuDeviceGetAttribute)(int *, CUdevice_attribute, CUdevice);
    CUresult (*cuFuncGetAttribute)(int *, CUfunction_attribute, CUfunction);
    CUresult (*cuKernelGetAttribute)(int *, CUfunction_attribute, CUkernel, CUdevice);
};

/* Defined in cuda.c; filled in by the loader at the first call (loader.c). */
extern struct vgpu_cuda_real real;

/* cuPointerGetAttribute of the real driver; CUDA_ERROR_NOT_SUPPORTED where it has none. */
static inline CUresult vgpu_pointer_attribute(void *data, CUpointer_attribute attribute,
                                              CUdeviceptr ptr)
{
    return real.cuPointerGetAttribute == NULL ? CUDA_ERROR_NOT_SUPPORTED
                                              : real.cuPointerGetAttribute(data, attribute, ptr);
}

/* Exports that cuda.h does not declare in this configuration. */
VGPU_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
                                      cuuint64_t flags);
VGPU_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream stream);
VGPU_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes,
                                                  CUmemoryPool pool, CUstream stream);
VGPU_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream);
VGPU_EXPORT CUresult cuMemMapArrayAsync_ptsz(CUarrayMapInfo *list, unsigned int count,
                                             CUstream stream);
VGPU_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                         unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                                         CUstream stream, void **params, void **extra);
VGPU_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
                                           void **params, void **extra);
VGPU_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy,
                                                    unsigned gz, unsigned bx, unsigned by,
                                                    unsigned bz, unsigned shmem, CUstream stream,
                                                    void **params);
VGPU_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream);
VGPU_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream stream);
VGPU_EXPORT CUresult cuStreamQuery_ptsz(CUstream stream);
VGPU_EXPORT CUresult cuEventRecord_ptsz(CUevent event, CUstream stream);
VGPU_EXPORT CUresult cuEventRecordWithFlags_ptsz(CUevent event, CUstream stream,
                                                 unsigned int flags);
VGPU_EXPORT CUresult cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t bytes);
VGPU_EXPORT CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t bytes);
VGPU_EXPORT CUresult cuMemsetD8_v2_ptds(CUdeviceptr dst, unsigned char value, size_t n);
VGPU_EXPORT CUresult cuMemsetD8Async_ptsz(CUdeviceptr dst, unsigned char value, size_t n,
                                          CUstream stream);
VGPU_EXPORT CUresult cuMemsetD2D8_v2_ptds(CUdeviceptr dst, size_t pitch, unsigned char value,
                                          size_t width, size_t height);
VGPU_EXPORT CUresult cuMemsetD2D8Async_ptsz(CUdeviceptr dst, size_t pitch, unsigned char value,
                                            size_t width, size_t height, CUstream stream);
VGPU_EXPORT CUresult cuMemsetD16_v2_ptds(CUdeviceptr dst, unsigned short value, size_t n);
VGPU_EXPORT CUresult cuMemsetD16Async_ptsz(CUdeviceptr dst, unsigned short value, size_t n,
                                           CUstream stream);
VGPU_EXPORT CUresult cuMemsetD2D16_v2_ptds(CUdeviceptr dst, size_t pitch, unsigned short value,
                                           size_t width, size_t height);
VGPU_EXPORT CUresult cuMemsetD2D16Async_ptsz(CUdeviceptr dst, size_t pitch, unsigned short value,
                                             size_t width, size_t height, CUstream stream);
VGPU_EXPORT CUresult cuMemsetD32_v2_ptds(CUdeviceptr dst, unsigned int value, size_t n);
VGPU_EXPORT CUresult cuMemsetD32Async_ptsz(CUdeviceptr dst, unsigned int value, size_t n,
                                           CUstream stream);
VGPU_EXPORT CUresult cuMemsetD2D32_v2_ptds(CUdeviceptr dst, size_t pitch, unsigned int value,
                                           size_t width, size_t height);
VGPU_EXPORT CUresult cuMemsetD2D32Async_ptsz(CUdeviceptr dst, size_t pitch, unsigned int value,
                                             size_t width, size_t height, CUstream stream);
VGPU_EXPORT CUresult cuGraphUpload_ptsz(CUgraphExec exec, CUstream stream);
VGPU_EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *exec, CUgraph graph,
                                                       CUDA_GRAPH_INSTANTIATE_PARAMS *params);

/* Whether the calling thread's current context is dev's primary one, as its retains through
 * the library answered (cuda_context.c). */
int vgpu_primary_context_current(int dev);
/* The device whose primary context ctx is, as above; -1 for any other context and for NULL. */
int vgpu_primary_device_of(CUcontext ctx);
/* Where the calling thread's current context is none of the primary ones known, its device
 * drains no more (cuda_context.c). */
void vgpu_other_context_current(void);
/* 1 where the calling thread's current context is none of the primary ones known, 0 where it
 * is one of them or there is none, -1 where the driver cannot say. */
int vgpu_unknown_context_current(void);

/* What a stream-ordered pool caches now (cuda_memory.c; vgpu_footprint_init's cache_of). */
uint64_t vgpu_cuda_pool_cache(uintptr_t pool);

/* ---- what a graph's allocation nodes take (cuda_graph_memory.c) ---- */

/* exec (that recording) was destroyed: its mappings are gone. */
void vgpu_graph_mapping_forget(CUgraphExec exec, uint64_t serial);

/* launch(exec, stream), a launch or an upload, with exec's graph memory counted. */
CUresult vgpu_graph_launch(graph_launch_fn launch, CUgraphExec exec, CUstream stream,
                           const char *api);

/* vgpu_stack_before_launch where vgpu_stack_fits cannot tell (cuda_limits.c). */
int vgpu_stack_check_launch(CUfunction f, CUstream stream);
/* The same for a launch on stream whose kernels need `local` bytes a thread at most (a
 * graph's). */
int vgpu_stack_before_needs(uint64_t local, CUstream stream);
/* vgpu_stack_after_launch for a launch that counted raises (raised > 0). */
void vgpu_stack_launched(int raised, CUresult rc);
/* Around the kernels of a multi-device launch, which raise one after another before the one
 * launch: outside it a launch while this thread's raise is under way is refused. */
void vgpu_stack_several(int on);
/* A kernel's local memory a thread (0: none, or the driver cannot say). */
uint64_t vgpu_kernel_local_bytes(CUfunction f);

/* What cuda_limits.c keeps for every launch to read inline (vgpu_stack_fits): each kernel's
 * local memory as asked (kernels.h; learn_local_bytes), the floor (no counted context on a
 * capped device has a smaller stack; refloor), and whether a launch is checked at all (not
 * known until the first launch that calls out, vgpu_stack_check_launch; never where no device
 * is capped or the region could not be attached). */
extern uint64_t vgpu_floor_stack;
enum { VGPU_STACK_NOT_KNOWN = 0, VGPU_STACK_BY_TABLE, VGPU_STACK_NEVER };
extern int vgpu_stack_checked;

/* 1 when vgpu_stack_check_launch(f, any stream) would surely answer 0 without asking the
 * driver anything: no device capped, f NULL, or f's local memory known and within the floor.
 * 0: it must be called. */
static inline int vgpu_stack_fits(CUfunction f)
{
    int checked = __atomic_load_n(&vgpu_stack_checked, __ATOMIC_ACQUIRE);
    if (checked != VGPU_STACK_BY_TABLE)
        return checked == VGPU_STACK_NEVER;
    uint64_t local;
    return f == NULL || (vgpu_kernel_known(f, &local) &&
                         local <= __atomic_load_n(&vgpu_floor_stack, __ATOMIC_ACQUIRE));
}

/* Before a launch of f on stream (cuda_limits.c): the stack the driver will raise for it on the
 * device it runs on, if its threads need more local memory than that device's stack holds,
 * reserved and counted; -1: it does not fit (logged; the caller answers
 * CUDA_ERROR_OUT_OF_MEMORY without launching); else the devices it was counted on, a bit each
 * (0: nothing to do), which vgpu_stack_after_launch takes with the launch's result. Inline up
 * to what the table answers: every launch asks (hook/README.md, "Overhead"). */
static inline int vgpu_stack_before_launch(CUfunction f, CUstream stream)
{
    return vgpu_stack_fits(f) ? 0 : vgpu_stack_check_launch(f, stream);
}

static inline void vgpu_stack_after_launch(int raised, CUresult rc)
{
    if (raised > 0)
        vgpu_stack_launched(raised, rc);
}

/* How a context came to be: what undoes or ends it, what it is to the limiter, and whether a
 * reset of the device's primary context resets its limits (cuda_limits.c). SEEN: one the
 * library met first in use, not as it was made. */
enum vgpu_context_kind {
    VGPU_CONTEXT_SEEN,
    VGPU_CONTEXT_PRIMARY,
    VGPU_CONTEXT_CREATED,
    VGPU_CONTEXT_GREEN
};

/* ctx was made on dev, or the primary context retained (made: the handle that ends it, a green
 * context's CUgreenCtx, else ctx): a new context's stack is the driver's default, whatever
 * another context on dev holds (a limit is its context's: cuda.h, cuCtxSetLimit). */
void vgpu_stack_context_made(CUcontext ctx, const void *made, int dev,
                             enum vgpu_context_kind kind);
/* The context ended through `made` (cuCtxDestroy's CUcontext, cuGreenCtxDestroy's CUgreenCtx)
 * is gone, and its modules with it (kernel handles may name other kernels next). Returns its
 * device (-1: not known). */
int vgpu_stack_context_gone(const void *made);
/* dev's primary context was reset, or released for the last time: the next one starts at the
 * driver's default stack. */
void vgpu_stack_primary_gone(int dev);

/* Every wrapper starts with ready() || real.fn == NULL: the real driver is loaded first, and a
 * function it lacks is answered with an error, never called through NULL. */
static inline int ready(void)
{
    vgpu_lib_ensure(&vgpu_cuda_lib);
    return 1;
}

/* The device of the calling thread's current context, or -1 (no context, out of range). */
static inline int current_device(void)
{
    CUdevice dev;
    if (real.cuCtxGetDevice == NULL || real.cuCtxGetDevice(&dev) != CUDA_SUCCESS)
        return -1;
    return dev >= 0 && dev < VGPU_REGION_MAX_DEVICES ? (int)dev : -1;
}

/* 1 once cuInit found that this process has exactly one CUDA device (cuda.c): every context
 * is then on ordinal 0. */
extern int vgpu_one_device;

enum { VGPU_DEVICE_UNKNOWN = -2 };

/* NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD: the current context's default stream. */
static inline int vgpu_default_stream(CUstream stream)
{
    return stream == NULL || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD;
}

/* One value per stream for the SM limiter (throttle.h), never 0: the null handle names the
 * legacy default stream in the plain exports and the calling thread's own in the _ptsz ones
 * (cuda.h, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD), which name them themselves. */
static inline uintptr_t vgpu_stream_key(CUstream stream, int per_thread)
{
    if (stream != NULL)
        return (uintptr_t)stream;
    return (uintptr_t)(per_thread ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY);
}

/* The device work on stream runs on (cuda_memory.c): a default stream's is the current
 * context's (-1 as current_device()); VGPU_DEVICE_UNKNOWN when the driver cannot say. */
int vgpu_stream_device(CUstream stream);
/* The context work on a named stream runs in, a green context's as the CUcontext
 * cuCtxFromGreenCtx gives for it (NULL: the driver cannot say). */
CUcontext vgpu_stream_context(CUstream stream);

/* The device a kernel launched on stream runs on, with more than one device: the stream's,
 * since a CUkernel runs in its stream's context whatever is current (cuda.h, cuLaunchKernel),
 * and the current context's where the driver cannot name the stream's. Out of line: its
 * questions to the driver need a stack frame (and canary) the one-device path should not pay
 * for. */
int vgpu_launch_device(CUstream stream);

/* The device a kernel launched on stream runs on. With one device (most vGPU containers), 0
 * without asking the driver: the SM gate's costliest step on the fake (hook/README.md,
 * "Overhead"); a launch without a current context is gated on it too, and the driver then
 * refuses it (vgpu_answered). */
static inline int launch_device_on(CUstream stream)
{
    if (__atomic_load_n(&vgpu_one_device, __ATOMIC_RELAXED))
        return 0;
    return vgpu_launch_device(stream);
}

/* The blocks a launch of this grid runs: what the SM limiter charges for it. */
static inline uint64_t grid(unsigned gx, unsigned gy, unsigned gz)
{
    /* Three 32-bit factors may pass 2^64 (a grid the driver refuses): saturated, not wrapped
     * (vgpu_throttle_launch and vgpu_throttle_take bound what one launch takes). */
    uint64_t across = (uint64_t)gx * gy;
    return gz != 0 && across > UINT64_MAX / gz ? UINT64_MAX : across * gz;
}

#endif
