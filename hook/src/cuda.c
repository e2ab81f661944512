/* cuda.c - the CUDA driver wrappers: memory accounting, reporting, launch gating, and the
 * cuGetProcAddress path (the runtime resolves everything through it since CUDA 11.3).
 * Every wrapper forwards to the real driver; only the accounting around it is ours. */
#define _GNU_SOURCE
#include <cuda.h>
#include <stdio.h>
#include <unistd.h>

#include "footprint.h"
#include "graphs.h"
#include "loader.h"
#include "log.h"
#include "memory.h"
#include "region.h"
#include "throttle.h"
#include "util.h"

#undef cuGetProcAddress /* cuda.h renames it to _v2; the v1 ABI is a separate export */
#include "cuda_v1.h" /* the legacy v1 exports (CUDA 2.x ABI), wrapped here too */

#define VGPU_EXPORT __attribute__((visibility("default")))

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void **, void **);
typedef CUresult (*launch_ex_fn)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*coop_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                            unsigned, unsigned, CUstream, void **);
typedef CUresult (*graph_launch_fn)(CUgraphExec, CUstream);
typedef CUresult (*gpa_v1_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*gpa_v2_fn)(const char *, void **, int, cuuint64_t,
                              CUdriverProcAddressQueryResult *);

static struct {
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
    CUresult (*cuMemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                            unsigned long long);
    CUresult (*cuMemRelease)(CUmemGenericAllocationHandle);
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
    graph_launch_fn cuGraphLaunch, cuGraphLaunch_ptsz;
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*cuDevicePrimaryCtxRelease_v2)(CUdevice);
    CUresult (*cuDevicePrimaryCtxReset_v2)(CUdevice);
    CUresult (*cuCtxCreate_v2)(CUcontext *, unsigned int, CUdevice);
    CUresult (*cuCtxCreate_v3)(CUcontext *, CUexecAffinityParam *, int, unsigned int, CUdevice);
    CUresult (*cuCtxCreate_v4)(CUcontext *, CUctxCreateParams *, unsigned int, CUdevice);
    CUresult (*cuCtxDestroy_v2)(CUcontext);
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
    /* called, not hooked */
    CUresult (*cuCtxGetDevice)(CUdevice *);
    CUresult (*cuStreamGetDevice)(CUstream, CUdevice *);
    CUresult (*cuStreamGetCtx)(CUstream, CUcontext *);
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
} real;

/* Exports that cuda.h does not declare in this configuration. */
VGPU_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
                                      cuuint64_t flags);
VGPU_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream stream);
VGPU_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes,
                                                  CUmemoryPool pool, CUstream stream);
VGPU_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream);
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
VGPU_EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *exec, CUgraph graph,
                                                       CUDA_GRAPH_INSTANTIATE_PARAMS *params);

static void after_load(void);

/* HOOK(export, base name, a CUDA version with this export's ABI, per-thread flavour) */
#define HOOK(name, base, version, pt) {#name, (void *)name, (void **)&real.name, base, version, pt}
#define CALL_ONLY(name) {#name, NULL, (void **)&real.name, NULL, 0, 0}
static const struct vgpu_hook hooks[] = {
    HOOK(cuInit, "cuInit", 2000, 0),
    HOOK(cuGetProcAddress, "cuGetProcAddress", 11030, 0),
    HOOK(cuGetProcAddress_v2, "cuGetProcAddress", 12000, 0),
    HOOK(cuMemAlloc, "cuMemAlloc", 2000, 0),
    HOOK(cuMemAllocPitch, "cuMemAllocPitch", 2000, 0),
    HOOK(cuMemFree, "cuMemFree", 2000, 0),
    HOOK(cuMemGetInfo, "cuMemGetInfo", 2000, 0),
    HOOK(cuDeviceTotalMem, "cuDeviceTotalMem", 2000, 0),
    HOOK(cuArrayCreate, "cuArrayCreate", 2000, 0),
    HOOK(cuArray3DCreate, "cuArray3DCreate", 2000, 0),
    HOOK(cuMemAlloc_v2, "cuMemAlloc", 3020, 0),
    HOOK(cuMemFree_v2, "cuMemFree", 3020, 0),
    HOOK(cuMemAllocPitch_v2, "cuMemAllocPitch", 3020, 0),
    HOOK(cuMemAllocManaged, "cuMemAllocManaged", 6000, 0),
    HOOK(cuArrayCreate_v2, "cuArrayCreate", 3020, 0),
    HOOK(cuArray3DCreate_v2, "cuArray3DCreate", 3020, 0),
    HOOK(cuArrayDestroy, "cuArrayDestroy", 2000, 0),
    HOOK(cuMemCreate, "cuMemCreate", 10020, 0),
    HOOK(cuMemRelease, "cuMemRelease", 10020, 0),
    HOOK(cuMemAllocAsync, "cuMemAllocAsync", 11020, 0),
    HOOK(cuMemAllocAsync_ptsz, "cuMemAllocAsync", 11020, 1),
    HOOK(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 11020, 0),
    HOOK(cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync", 11020, 1),
    HOOK(cuMemFreeAsync, "cuMemFreeAsync", 11020, 0),
    HOOK(cuMemFreeAsync_ptsz, "cuMemFreeAsync", 11020, 1),
    HOOK(cuMemGetInfo_v2, "cuMemGetInfo", 3020, 0),
    HOOK(cuDeviceTotalMem_v2, "cuDeviceTotalMem", 3020, 0),
    HOOK(cuLaunchKernel, "cuLaunchKernel", 4000, 0),
    HOOK(cuLaunchKernel_ptsz, "cuLaunchKernel", 7000, 1),
    HOOK(cuLaunchKernelEx, "cuLaunchKernelEx", 11060, 0),
    HOOK(cuLaunchKernelEx_ptsz, "cuLaunchKernelEx", 11060, 1),
    HOOK(cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", 9000, 0),
    HOOK(cuLaunchCooperativeKernel_ptsz, "cuLaunchCooperativeKernel", 9000, 1),
    HOOK(cuGraphLaunch, "cuGraphLaunch", 10000, 0),
    HOOK(cuGraphLaunch_ptsz, "cuGraphLaunch", 10000, 1),
    HOOK(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000, 0),
    HOOK(cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 11000, 0),
    HOOK(cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset", 11000, 0),
    HOOK(cuCtxCreate_v2, "cuCtxCreate", 3020, 0),
    HOOK(cuCtxCreate_v3, "cuCtxCreate", 11040, 0),
    HOOK(cuCtxCreate_v4, "cuCtxCreate", 12050, 0),
    HOOK(cuCtxDestroy_v2, "cuCtxDestroy", 4000, 0),
    HOOK(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", 11040, 0),
    HOOK(cuGraphInstantiateWithParams, "cuGraphInstantiateWithParams", 12000, 0),
    HOOK(cuGraphInstantiateWithParams_ptsz, "cuGraphInstantiateWithParams", 12000, 1),
    HOOK(cuGraphExecUpdate_v2, "cuGraphExecUpdate", 12000, 0),
    HOOK(cuGraphInstantiate, "cuGraphInstantiate", 10000, 0),
    HOOK(cuGraphInstantiate_v2, "cuGraphInstantiate", 11000, 0),
    HOOK(cuGraphExecUpdate, "cuGraphExecUpdate", 10020, 0),
    HOOK(cuGraphExecDestroy, "cuGraphExecDestroy", 10000, 0),
    HOOK(cuGraphExecKernelNodeSetParams, "cuGraphExecKernelNodeSetParams", 10010, 0),
    HOOK(cuGraphExecKernelNodeSetParams_v2, "cuGraphExecKernelNodeSetParams", 12000, 0),
    HOOK(cuGraphExecChildGraphNodeSetParams, "cuGraphExecChildGraphNodeSetParams", 11010, 0),
    HOOK(cuGraphExecNodeSetParams, "cuGraphExecNodeSetParams", 12020, 0),
    HOOK(cuGraphNodeSetEnabled, "cuGraphNodeSetEnabled", 11060, 0),
    CALL_ONLY(cuCtxGetDevice), CALL_ONLY(cuDeviceGetCount), CALL_ONLY(cuDeviceGet),
    CALL_ONLY(cuDeviceGetUuid_v2), CALL_ONLY(cuGraphGetNodes), CALL_ONLY(cuGraphNodeGetType),
    CALL_ONLY(cuGraphKernelNodeGetParams_v2), CALL_ONLY(cuGraphKernelNodeGetParams),
    CALL_ONLY(cuGraphChildGraphNodeGetGraph), CALL_ONLY(cuStreamGetDevice),
    CALL_ONLY(cuStreamGetCtx), CALL_ONLY(cuCtxPushCurrent_v2), CALL_ONLY(cuCtxPopCurrent_v2),
    CALL_ONLY(cuPointerGetAttribute), CALL_ONLY(cuDeviceGetMemPool), CALL_ONLY(cuMemPoolTrimTo),
    CALL_ONLY(cuDevicePrimaryCtxGetState), CALL_ONLY(cuMemPoolGetAttribute),
    CALL_ONLY(cuStreamIsCapturing), CALL_ONLY(cuStreamIsCapturing_ptsz),
    CALL_ONLY(cuCtxGetCurrent), CALL_ONLY(cuCtxSetCurrent),
    CALL_ONLY(cuThreadExchangeStreamCaptureMode),
};
_Static_assert(sizeof hooks / sizeof hooks[0] <= VGPU_MAX_HOOKS, "raise VGPU_MAX_HOOKS");
#undef HOOK
#undef CALL_ONLY

struct vgpu_hook_lib vgpu_cuda_lib = {
    .soname = "libcuda.so.1",
    .hooks = hooks,
    .count = sizeof hooks / sizeof hooks[0],
    .after_load = after_load,
};

/* The wrapper swap in cuGetProcAddress matches the driver's answer against its dlsym exports.
 * In case a driver answers with other addresses (internal entry points of the same ABI), ask
 * it once, at load, what it answers for each hooked function, and accept that address too. */
static void learn_proc_addresses(void)
{
    for (size_t i = 0; i < sizeof hooks / sizeof hooks[0]; i++) {
        const struct vgpu_hook *h = &hooks[i];
        if (h->base == NULL || *h->real == NULL)
            continue;
        void *answer = NULL;
        cuuint64_t flags = h->per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                                         : CU_GET_PROC_ADDRESS_LEGACY_STREAM;
        CUdriverProcAddressQueryResult status;
        CUresult rc = real.cuGetProcAddress_v2 != NULL
            ? real.cuGetProcAddress_v2(h->base, &answer, h->version, flags, &status)
            : real.cuGetProcAddress != NULL
            ? real.cuGetProcAddress(h->base, &answer, h->version, flags)
            : CUDA_ERROR_NOT_SUPPORTED;
        if (rc == CUDA_SUCCESS && answer != NULL && answer != *h->real) {
            vgpu_cuda_lib.alias[i] = answer;
            vgpu_log(VGPU_LOG_DEBUG, "cuGetProcAddress(%s, %d) answers %p, not the export %p",
                     h->base, h->version, answer, *h->real);
        }
    }
}

static void after_load(void)
{
    learn_proc_addresses();
    vgpu_region_get();
    vgpu_throttle_init();
    vgpu_footprint_init();
}

/* Every wrapper starts with ready() || real.fn == NULL: the real driver is loaded first, and a
 * function it lacks is answered with an error, never called through NULL. */
static int ready(void)
{
    vgpu_lib_ensure(&vgpu_cuda_lib);
    return 1;
}

/* The device of the calling thread's current context, or -1 (no context, out of range). */
static int current_device(void)
{
    CUdevice dev;
    if (real.cuCtxGetDevice == NULL || real.cuCtxGetDevice(&dev) != CUDA_SUCCESS)
        return -1;
    return dev >= 0 && dev < VGPU_REGION_MAX_DEVICES ? (int)dev : -1;
}

/* NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD: the current context's default stream. */
static int default_stream(CUstream stream)
{
    return stream == NULL || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD;
}

enum { DEVICE_UNKNOWN = -2 };

/* The device a stream-ordered allocation on stream draws on. A stream named explicitly may be
 * another context's, on another device, and needs no current context at all: its own device
 * (CUDA 12.8's cuStreamGetDevice, else its context's, made current for the question). A
 * default stream is the current context's. -1 as current_device(); DEVICE_UNKNOWN: the
 * driver could not say (the caller refuses: the memory would go uncounted). */
static int stream_device(CUstream stream)
{
    if (default_stream(stream))
        return current_device();
    CUdevice dev;
    if (real.cuStreamGetDevice != NULL && real.cuStreamGetDevice(stream, &dev) == CUDA_SUCCESS)
        return dev >= 0 && dev < VGPU_REGION_MAX_DEVICES ? (int)dev : -1;
    CUcontext ctx, popped = NULL;
    if (real.cuStreamGetCtx == NULL || real.cuCtxPushCurrent_v2 == NULL ||
        real.cuCtxPopCurrent_v2 == NULL || real.cuStreamGetCtx(stream, &ctx) != CUDA_SUCCESS ||
        real.cuCtxPushCurrent_v2(ctx) != CUDA_SUCCESS)
        return DEVICE_UNKNOWN;
    int found = current_device();
    if (real.cuCtxPopCurrent_v2(&popped) != CUDA_SUCCESS || popped != ctx)
        vgpu_log(VGPU_LOG_ERROR, "the context pushed to learn a stream's device did not pop "
                 "back; this thread's current context may have changed");
    return found;
}

/* The device of the allocation at ptr (-1: the driver cannot say). */
static int pointer_device(CUdeviceptr ptr)
{
    int dev = -1;
    if (real.cuPointerGetAttribute == NULL ||
        real.cuPointerGetAttribute(&dev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr) != 0)
        return -1;
    return dev >= 0 && dev < VGPU_REGION_MAX_DEVICES ? dev : -1;
}

static void record_uuids(void)
{
    int count = 0;
    if (real.cuDeviceGetCount == NULL || real.cuDeviceGetUuid_v2 == NULL ||
        real.cuDeviceGetCount(&count) != CUDA_SUCCESS)
        return;
    for (int i = 0; i < count && i < VGPU_REGION_MAX_DEVICES; i++) {
        CUdevice dev;
        CUuuid id;
        if (real.cuDeviceGet(&dev, i) != CUDA_SUCCESS || real.cuDeviceGetUuid_v2(&id, dev) != 0)
            continue;
        const unsigned char *b = (const unsigned char *)id.bytes;
        char text[VGPU_REGION_UUID_BYTES];
        snprintf(text, sizeof text,
                 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                 b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12],
                 b[13], b[14], b[15]);
        vgpu_region_set_uuid(i, text);
    }
}

/* No usable region (logged when it was attached): the driver is not initialised at all. */
VGPU_EXPORT CUresult cuInit(unsigned int flags)
{
    if (!ready() || real.cuInit == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!vgpu_region_usable())
        return CUDA_ERROR_NOT_PERMITTED;
    CUresult rc = real.cuInit(flags);
    if (rc == CUDA_SUCCESS)
        record_uuids();
    return rc;
}

/* ---- cuGetProcAddress: ask the driver, then swap the answer for our wrapper -------------- */

static void swap_for_wrapper(CUresult rc, void **pfn)
{
    if (rc != CUDA_SUCCESS || pfn == NULL || *pfn == NULL)
        return;
    void *wrapper = vgpu_lib_wrapper_for(&vgpu_cuda_lib, *pfn);
    if (wrapper != NULL)
        *pfn = wrapper;
}

VGPU_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
                                      cuuint64_t flags)
{
    if (!ready() || real.cuGetProcAddress == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = real.cuGetProcAddress(symbol, pfn, version, flags);
    swap_for_wrapper(rc, pfn);
    return rc;
}

VGPU_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                         cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
    if (!ready() || real.cuGetProcAddress_v2 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = real.cuGetProcAddress_v2(symbol, pfn, version, flags, status);
    swap_for_wrapper(rc, pfn);
    return rc;
}

/* ---- allocation families ------------------------------------------------------------------ */

/* Reserve on dev, or answer OOM. dev < 0 (no context): nothing to reserve, the driver decides. */
static int admit(int dev, uint64_t bytes, const char *api)
{
    if (dev < 0)
        return 1;
    vgpu_footprint_refresh(dev);
    if (vgpu_mem_reserve(dev, bytes, api) != 0)
        return 0;
    /* From the driver call until the table has it, NVML may show memory the table does not. */
    vgpu_mem_op_begin();
    return 1;
}

/* After the driver call: keep the reservation under key on success, give it back otherwise. */
static CUresult settle(CUresult rc, enum vgpu_alloc_kind kind, uint64_t key, int dev,
                       uint64_t bytes)
{
    if (dev < 0)
        return rc;
    if (rc == CUDA_SUCCESS)
        vgpu_mem_track(kind, key, dev, bytes);
    else
        vgpu_mem_unreserve(dev, bytes);
    vgpu_mem_op_end();
    return rc;
}

/* The driver calls that give memory back, all handled the same way. */
enum free_api { FREE, FREE_V1, FREE_ASYNC, FREE_ASYNC_PTSZ, ARRAY_DESTROY, HANDLE_RELEASE };

/* Per free_api: where its real function is (NULL: this driver lacks it) and what it frees. */
static const struct {
    void *const *real;
    enum vgpu_alloc_kind kind;
} free_apis[] = {
    [FREE] = {(void *const *)&real.cuMemFree_v2, VGPU_KIND_POINTER},
    [FREE_V1] = {(void *const *)&real.cuMemFree, VGPU_KIND_POINTER},
    [FREE_ASYNC] = {(void *const *)&real.cuMemFreeAsync, VGPU_KIND_POINTER},
    [FREE_ASYNC_PTSZ] = {(void *const *)&real.cuMemFreeAsync_ptsz, VGPU_KIND_POINTER},
    [ARRAY_DESTROY] = {(void *const *)&real.cuArrayDestroy, VGPU_KIND_ARRAY},
    [HANDLE_RELEASE] = {(void *const *)&real.cuMemRelease, VGPU_KIND_HANDLE},
};

static CUresult call_free(enum free_api api, uint64_t key, CUstream stream)
{
    switch (api) {
    case FREE: return real.cuMemFree_v2((CUdeviceptr)key);
    case FREE_V1: return real.cuMemFree((v1_ptr)key);
    case FREE_ASYNC: return real.cuMemFreeAsync((CUdeviceptr)key, stream);
    case FREE_ASYNC_PTSZ: return real.cuMemFreeAsync_ptsz((CUdeviceptr)key, stream);
    case ARRAY_DESTROY: return real.cuArrayDestroy((CUarray)(uintptr_t)key);
    default: return real.cuMemRelease((CUmemGenericAllocationHandle)key);
    }
}

/* Takes key out of the table before freeing (so a racing allocation that reuses the address
 * cannot be confused with it), puts it back if the driver refuses the free. Keys this process
 * never counted are still freed by the driver, which gives its own answer. */
static CUresult release_counted(enum free_api api, uint64_t key, CUstream stream)
{
    if (!ready() || *free_apis[api].real == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    enum vgpu_alloc_kind kind = free_apis[api].kind;
    int dev;
    uint64_t bytes;
    vgpu_mem_op_begin();
    int known = vgpu_mem_untrack(kind, key, &dev, &bytes);
    CUresult rc = call_free(api, key, stream);
    if (known && rc == CUDA_SUCCESS)
        vgpu_mem_unreserve(dev, bytes);
    else if (known)
        vgpu_mem_track_again(kind, key, dev, bytes);
    vgpu_mem_op_end();
    return rc;
}

/* The driver calls that return a device pointer, all counted the same way. */
enum pointer_api { PLAIN, PLAIN_V1, MANAGED, ASYNC, ASYNC_PTSZ, POOL, POOL_PTSZ };

struct pointer_request {
    enum pointer_api api;
    size_t bytes;
    unsigned int flags;  /* MANAGED */
    CUmemoryPool pool;   /* POOL, POOL_PTSZ */
    CUstream stream;     /* ASYNC*, POOL* */
};

/* Per counted API: where its real function is (NULL: this driver lacks it), and its name for
 * the refusal log line. */
struct counted_api {
    void *const *real;
    const char *name;
};

static const struct counted_api pointer_apis[] = {
    [PLAIN] = {(void *const *)&real.cuMemAlloc_v2, "cuMemAlloc"},
    [PLAIN_V1] = {(void *const *)&real.cuMemAlloc, "cuMemAlloc (v1)"},
    [MANAGED] = {(void *const *)&real.cuMemAllocManaged, "cuMemAllocManaged"},
    [ASYNC] = {(void *const *)&real.cuMemAllocAsync, "cuMemAllocAsync"},
    [ASYNC_PTSZ] = {(void *const *)&real.cuMemAllocAsync_ptsz, "cuMemAllocAsync_ptsz"},
    [POOL] = {(void *const *)&real.cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync"},
    [POOL_PTSZ] = {(void *const *)&real.cuMemAllocFromPoolAsync_ptsz,
                   "cuMemAllocFromPoolAsync_ptsz"},
};

static CUresult call_driver(const struct pointer_request *r, CUdeviceptr *ptr)
{
    switch (r->api) {
    case PLAIN: return real.cuMemAlloc_v2(ptr, r->bytes);
    case PLAIN_V1: {
        v1_ptr p32 = 0;
        CUresult rc = real.cuMemAlloc(&p32, (unsigned int)r->bytes);
        *ptr = p32;
        return rc;
    }
    case MANAGED: return real.cuMemAllocManaged(ptr, r->bytes, r->flags);
    case ASYNC: return real.cuMemAllocAsync(ptr, r->bytes, r->stream);
    case ASYNC_PTSZ: return real.cuMemAllocAsync_ptsz(ptr, r->bytes, r->stream);
    case POOL: return real.cuMemAllocFromPoolAsync(ptr, r->bytes, r->pool, r->stream);
    default: return real.cuMemAllocFromPoolAsync_ptsz(ptr, r->bytes, r->pool, r->stream);
    }
}

/* What pool holds beyond what its allocations use (0 when the driver cannot say). */
static uint64_t pool_cached(CUmemoryPool pool)
{
    cuuint64_t reserved = 0, used = 0;
    if (real.cuMemPoolGetAttribute == NULL ||
        real.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) !=
            CUDA_SUCCESS ||
        real.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used) != CUDA_SUCCESS)
        return 0;
    return reserved > used ? reserved - used : 0;
}

/* Gives back what pool caches; returns 1 when that was something. */
static int trim_pool(CUmemoryPool pool)
{
    uint64_t cached = pool_cached(pool);
    return cached != 0 && real.cuMemPoolTrimTo != NULL && real.cuMemPoolTrimTo(pool, 0) ==
           CUDA_SUCCESS && pool_cached(pool) < cached;
}

/* Whether r's stream may be in a capture: a pool changed under a capture could invalidate it. */
static int maybe_capturing(const struct pointer_request *r)
{
    CUresult (*ask)(CUstream, CUstreamCaptureStatus *) =
        r->api == ASYNC_PTSZ || r->api == POOL_PTSZ ? real.cuStreamIsCapturing_ptsz
                                                    : real.cuStreamIsCapturing;
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    return ask == NULL || ask(r->stream, &status) != CUDA_SUCCESS ||
           status != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* A pool keeps the memory stream-ordered frees give back (PyTorch's cudaMallocAsync backend
 * sets its release threshold to the maximum, so it keeps all of it). NVML shows that memory, so
 * it is counted as the process's footprint, and an allocation the pool would serve from it
 * would be counted twice. Before a stream-ordered allocation on dev is refused, the pool it
 * comes from gives back what no allocation uses (no synchronisation, and not while its stream
 * is captured: either could break a capture) and the footprint is measured again. */
static void release_pool_cache(const struct pointer_request *r, int dev)
{
    uint64_t limit = vgpu_region_limit(dev);
    if (limit == 0)
        return;
    vgpu_footprint_refresh(dev); /* what admit() would see */
    if (vgpu_region_used(dev) + r->bytes <= limit || maybe_capturing(r))
        return;
    CUmemoryPool pool = r->pool;
    if (pool == NULL && (real.cuDeviceGetMemPool == NULL ||
                         real.cuDeviceGetMemPool(&pool, (CUdevice)dev) != CUDA_SUCCESS))
        return;
    if (trim_pool(pool))
        vgpu_footprint_remeasure(dev);
}

/* A pool may be another device's than the stream's, and its memory lives there: the
 * reservation made on the stream's device *dev moves to the pool's (the allocation is given
 * back, and OUT_OF_MEMORY answered, when it does not fit there). Only the stream's device was
 * measured before the call (a pool's device is known from a pointer only), so a cache the
 * pool keeps there is not given back first. */
static CUresult move_to_pool_device(const struct pointer_request *r, CUdeviceptr ptr, int *dev)
{
    CUresult (*give_back)(CUdeviceptr, CUstream) =
        r->api == POOL_PTSZ ? real.cuMemFreeAsync_ptsz : real.cuMemFreeAsync;
    int actual = pointer_device(ptr);
    if (actual < 0 || *dev < 0 || actual == *dev || give_back == NULL)
        return CUDA_SUCCESS;
    vgpu_footprint_refresh(actual);
    if (vgpu_mem_reserve(actual, r->bytes, pointer_apis[r->api].name) != 0) {
        /* Not kept in the pool's cache, where it would count against the next allocation. */
        give_back(ptr, r->stream);
        if (!maybe_capturing(r))
            trim_pool(r->pool);
        return CUDA_ERROR_OUT_OF_MEMORY; /* settle gives back the first reservation */
    }
    vgpu_mem_unreserve(*dev, r->bytes);
    *dev = actual;
    return CUDA_SUCCESS;
}

/* Reserve on the device the memory comes from, ask the driver, keep the reservation under the
 * returned pointer. Managed memory is counted too (conservative: it may live on the GPU);
 * stream-ordered allocations count from the alloc call to the free call, not the pool's
 * reserve, on the stream's device (a pool's, on the pool's). One on an explicit stream whose
 * device cannot be told is refused: the driver could serve it with no current context, and so
 * uncounted. */
static CUresult alloc_pointer(const struct pointer_request *r, CUdeviceptr *dptr)
{
    if (!ready() || *pointer_apis[r->api].real == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    int ordered = r->api != PLAIN && r->api != PLAIN_V1 && r->api != MANAGED;
    int dev = ordered ? stream_device(r->stream) : current_device();
    if (dev == DEVICE_UNKNOWN) {
        vgpu_log(VGPU_LOG_ERROR, "%s: the device of its stream cannot be told; refused",
                 pointer_apis[r->api].name);
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    if (ordered && dev >= 0)
        release_pool_cache(r, dev);
    if (!admit(dev, r->bytes, pointer_apis[r->api].name))
        return CUDA_ERROR_OUT_OF_MEMORY;
    /* The host pid is learnt from plain allocations only: managed pages and a pool's cache may
     * not grow what NVML shows, and another process growing alike must not be taken for us. */
    int learning = r->api == PLAIN && vgpu_footprint_learn_before(dev, r->bytes);
    CUdeviceptr ptr = 0;
    CUresult rc = call_driver(r, &ptr);
    if (learning)
        vgpu_footprint_learn_after(rc == CUDA_SUCCESS ? r->bytes : 0, 0);
    if (rc == CUDA_SUCCESS && (r->api == POOL || r->api == POOL_PTSZ))
        rc = move_to_pool_device(r, ptr, &dev);
    rc = settle(rc, VGPU_KIND_POINTER, ptr, dev, r->bytes);
    if (rc == CUDA_SUCCESS && dptr != NULL)
        *dptr = ptr;
    return rc;
}

VGPU_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes)
{
    return alloc_pointer(&(struct pointer_request){.api = PLAIN, .bytes = bytes}, dptr);
}

VGPU_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags)
{
    return alloc_pointer(&(struct pointer_request){.api = MANAGED, .bytes = bytes,
                                                   .flags = flags}, dptr);
}

VGPU_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream stream)
{
    return alloc_pointer(&(struct pointer_request){.api = ASYNC, .bytes = bytes,
                                                   .stream = stream}, dptr);
}

VGPU_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream stream)
{
    return alloc_pointer(&(struct pointer_request){.api = ASYNC_PTSZ, .bytes = bytes,
                                                   .stream = stream}, dptr);
}

VGPU_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool,
                                             CUstream stream)
{
    return alloc_pointer(&(struct pointer_request){.api = POOL, .bytes = bytes, .pool = pool,
                                                   .stream = stream}, dptr);
}

VGPU_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes,
                                                  CUmemoryPool pool, CUstream stream)
{
    return alloc_pointer(&(struct pointer_request){.api = POOL_PTSZ, .bytes = bytes,
                                                   .pool = pool, .stream = stream}, dptr);
}

VGPU_EXPORT CUresult cuMemAlloc(v1_ptr *dptr, unsigned int bytes)
{
    CUdeviceptr ptr = 0;
    CUresult rc = alloc_pointer(&(struct pointer_request){.api = PLAIN_V1, .bytes = bytes}, &ptr);
    if (rc == CUDA_SUCCESS && dptr != NULL)
        *dptr = (v1_ptr)ptr;
    return rc;
}

VGPU_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) { return release_counted(FREE, dptr, NULL); }

VGPU_EXPORT CUresult cuMemFree(v1_ptr dptr) { return release_counted(FREE_V1, dptr, NULL); }

/* The driver's pitch allocation, in either ABI; frees with the matching cuMemFree. */
static CUresult call_pitch(int v1, CUdeviceptr *ptr, size_t *pitch, size_t width, size_t height,
                           unsigned int elem)
{
    if (!v1)
        return real.cuMemAllocPitch_v2(ptr, pitch, width, height, elem);
    v1_ptr p32 = 0;
    unsigned int pitch32 = 0;
    CUresult rc = real.cuMemAllocPitch(&p32, &pitch32, (unsigned int)width, (unsigned int)height,
                                       elem);
    *ptr = p32;
    *pitch = pitch32;
    return rc;
}

static void free_pitch(int v1, CUdeviceptr ptr)
{
    if (v1)
        real.cuMemFree((v1_ptr)ptr);
    else
        real.cuMemFree_v2(ptr);
}

static CUresult alloc_pitch(int v1, CUdeviceptr *dptr, size_t *pitch, size_t width,
                            size_t height, unsigned int elem)
{
    if (!ready() || (v1 ? real.cuMemAllocPitch == NULL || real.cuMemFree == NULL
                        : real.cuMemAllocPitch_v2 == NULL))
        return CUDA_ERROR_NOT_INITIALIZED;
    int dev = current_device();
    uint64_t estimate = (uint64_t)((width + 511) & ~(size_t)511) * height;
    if (!admit(dev, estimate, "cuMemAllocPitch"))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUdeviceptr ptr = 0;
    size_t got_pitch = 0;
    CUresult rc = call_pitch(v1, &ptr, &got_pitch, width, height, elem);
    uint64_t actual = (uint64_t)got_pitch * height;
    if (rc == CUDA_SUCCESS && dev >= 0 && actual != estimate) {
        /* Count what the driver really used (its pitch), not our estimate. */
        if (actual > estimate && vgpu_mem_reserve(dev, actual - estimate, "cuMemAllocPitch") != 0) {
            free_pitch(v1, ptr);
            vgpu_mem_unreserve(dev, estimate);
            vgpu_mem_op_end();
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        if (actual < estimate)
            vgpu_mem_unreserve(dev, estimate - actual);
        estimate = actual;
    }
    rc = settle(rc, VGPU_KIND_POINTER, ptr, dev, estimate);
    if (rc == CUDA_SUCCESS) {
        if (dptr != NULL)
            *dptr = ptr;
        if (pitch != NULL)
            *pitch = got_pitch;
    }
    return rc;
}

VGPU_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width,
                                        size_t height, unsigned int elem)
{
    return alloc_pitch(0, dptr, pitch, width, height, elem);
}

VGPU_EXPORT CUresult cuMemAllocPitch(v1_ptr *dptr, unsigned int *pitch, unsigned int width,
                                     unsigned int height, unsigned int elem)
{
    CUdeviceptr ptr = 0;
    size_t got_pitch = 0;
    CUresult rc = alloc_pitch(1, &ptr, &got_pitch, width, height, elem);
    if (rc == CUDA_SUCCESS) {
        if (dptr != NULL)
            *dptr = (v1_ptr)ptr;
        if (pitch != NULL)
            *pitch = (unsigned int)got_pitch;
    }
    return rc;
}

static uint64_t format_bytes(CUarray_format format)
{
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF:
        return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32: case CU_AD_FORMAT_SIGNED_INT32: case CU_AD_FORMAT_FLOAT:
        return 4;
    default: return 16; /* block-compressed and wide formats: an upper bound */
    }
}

static uint64_t array_bytes(size_t w, size_t h, size_t d, unsigned channels, CUarray_format fmt)
{
    return (uint64_t)w * (h ? h : 1) * (d ? d : 1) * (channels ? channels : 1) * format_bytes(fmt);
}

/* 2D and 3D arrays, in either ABI: counted by an estimate from the descriptor (its sizes
 * passed here), keyed by the array handle. */
enum array_api { ARRAY_2D, ARRAY_3D, ARRAY_2D_V1, ARRAY_3D_V1 };

static const struct counted_api array_apis[] = {
    [ARRAY_2D] = {(void *const *)&real.cuArrayCreate_v2, "cuArrayCreate"},
    [ARRAY_3D] = {(void *const *)&real.cuArray3DCreate_v2, "cuArray3DCreate"},
    [ARRAY_2D_V1] = {(void *const *)&real.cuArrayCreate, "cuArrayCreate (v1)"},
    [ARRAY_3D_V1] = {(void *const *)&real.cuArray3DCreate, "cuArray3DCreate (v1)"},
};

static CUresult call_array(enum array_api api, CUarray *array, const void *desc)
{
    switch (api) {
    case ARRAY_2D: return real.cuArrayCreate_v2(array, desc);
    case ARRAY_3D: return real.cuArray3DCreate_v2(array, desc);
    case ARRAY_2D_V1: return real.cuArrayCreate(array, desc);
    default: return real.cuArray3DCreate(array, desc);
    }
}

/* desc NULL: the driver answers; bytes is the estimate (0 without a descriptor). */
static CUresult create_array(enum array_api api, CUarray *handle, const void *desc,
                             uint64_t bytes)
{
    if (!ready() || *array_apis[api].real == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    int dev = desc != NULL ? current_device() : -1;
    if (!admit(dev, bytes, array_apis[api].name))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUarray array = NULL;
    CUresult rc = call_array(api, &array, desc);
    rc = settle(rc, VGPU_KIND_ARRAY, (uint64_t)(uintptr_t)array, dev, bytes);
    if (rc == CUDA_SUCCESS && handle != NULL)
        *handle = array;
    return rc;
}

VGPU_EXPORT CUresult cuArrayCreate_v2(CUarray *handle, const CUDA_ARRAY_DESCRIPTOR *desc)
{
    return create_array(ARRAY_2D, handle, desc, desc == NULL ? 0
                        : array_bytes(desc->Width, desc->Height, 1, desc->NumChannels,
                                      desc->Format));
}

VGPU_EXPORT CUresult cuArray3DCreate_v2(CUarray *handle, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
    return create_array(ARRAY_3D, handle, desc, desc == NULL ? 0
                        : array_bytes(desc->Width, desc->Height, desc->Depth, desc->NumChannels,
                                      desc->Format));
}

VGPU_EXPORT CUresult cuArrayCreate(CUarray *handle, const struct array_v1 *desc)
{
    return create_array(ARRAY_2D_V1, handle, desc, desc == NULL ? 0
                        : array_bytes(desc->Width, desc->Height, 1, desc->NumChannels,
                                      desc->Format));
}

VGPU_EXPORT CUresult cuArray3DCreate(CUarray *handle, const struct array3d_v1 *desc)
{
    return create_array(ARRAY_3D_V1, handle, desc, desc == NULL ? 0
                        : array_bytes(desc->Width, desc->Height, desc->Depth, desc->NumChannels,
                                      desc->Format));
}

VGPU_EXPORT CUresult cuArrayDestroy(CUarray array)
{
    return release_counted(ARRAY_DESTROY, (uint64_t)(uintptr_t)array, NULL);
}

VGPU_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t bytes,
                                 const CUmemAllocationProp *prop, unsigned long long flags)
{
    if (!ready() || real.cuMemCreate == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    /* The device is the one the properties name, never the current context's (threads that
     * create VMM memory often have none). Host and invalid locations are not counted. */
    int dev = -1;
    if (prop != NULL && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
        prop->location.id >= 0 && prop->location.id < VGPU_REGION_MAX_DEVICES)
        dev = prop->location.id;
    if (!admit(dev, bytes, "cuMemCreate"))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUmemGenericAllocationHandle h = 0;
    /* PyTorch's expandable segments allocate this way: the host pid is learnt here too. */
    int learning = vgpu_footprint_learn_before(dev, bytes);
    CUresult rc = real.cuMemCreate(&h, bytes, prop, flags);
    if (learning)
        vgpu_footprint_learn_after(rc == CUDA_SUCCESS ? bytes : 0, 0);
    rc = settle(rc, VGPU_KIND_HANDLE, h, dev, bytes);
    if (rc == CUDA_SUCCESS && handle != NULL)
        *handle = h;
    return rc;
}

VGPU_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    return release_counted(HANDLE_RELEASE, handle, NULL);
}

VGPU_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream)
{
    return release_counted(FREE_ASYNC, dptr, stream);
}

VGPU_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream)
{
    return release_counted(FREE_ASYNC_PTSZ, dptr, stream);
}

/* ---- reporting ---------------------------------------------------------------------------- */

/* The driver's figures, capped: total = min(cap, physical), free = min(total - container usage,
 * physical free). Without a usable region nothing is reported (CUDA_ERROR_NOT_PERMITTED); checked
 * after reading, so that a region truncated meanwhile is caught too. */
static CUresult cap_info(size_t *phys_free, size_t *phys_total)
{
    int dev = current_device();
    uint64_t cap = dev >= 0 ? vgpu_region_limit(dev) : 0;
    if (cap != 0) {
        uint64_t total = cap < *phys_total ? cap : *phys_total;
        uint64_t used = vgpu_region_used(dev);
        uint64_t left = used < total ? total - used : 0;
        *phys_total = (size_t)total;
        *phys_free = left < *phys_free ? (size_t)left : *phys_free;
    }
    return vgpu_region_usable() ? CUDA_SUCCESS : CUDA_ERROR_NOT_PERMITTED;
}

VGPU_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    if (!ready() || real.cuMemGetInfo_v2 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    size_t phys_free = 0, phys_total = 0;
    CUresult rc = real.cuMemGetInfo_v2(&phys_free, &phys_total);
    if (rc == CUDA_SUCCESS)
        rc = cap_info(&phys_free, &phys_total);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (free_bytes != NULL)
        *free_bytes = phys_free;
    if (total_bytes != NULL)
        *total_bytes = phys_total;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total_bytes)
{
    if (!ready() || real.cuMemGetInfo == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    unsigned int free32 = 0, total32 = 0;
    CUresult rc = real.cuMemGetInfo(&free32, &total32);
    size_t phys_free = free32, phys_total = total32;
    if (rc == CUDA_SUCCESS)
        rc = cap_info(&phys_free, &phys_total); /* never above the driver's 32-bit figures */
    if (rc != CUDA_SUCCESS)
        return rc;
    if (free_bytes != NULL)
        *free_bytes = (unsigned int)phys_free;
    if (total_bytes != NULL)
        *total_bytes = (unsigned int)phys_total;
    return CUDA_SUCCESS;
}

/* min(cap, physical) (physical when uncapped); nothing without a usable region. */
static CUresult cap_total(size_t *bytes, CUdevice dev)
{
    if (dev >= 0 && dev < VGPU_REGION_MAX_DEVICES) {
        uint64_t cap = vgpu_region_limit(dev);
        if (cap != 0 && cap < *bytes)
            *bytes = (size_t)cap;
    }
    return vgpu_region_usable() ? CUDA_SUCCESS : CUDA_ERROR_NOT_PERMITTED;
}

VGPU_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    if (!ready() || real.cuDeviceTotalMem_v2 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    size_t total = 0;
    CUresult rc = real.cuDeviceTotalMem_v2(bytes != NULL ? &total : NULL, dev);
    if (rc == CUDA_SUCCESS && bytes != NULL && (rc = cap_total(&total, dev)) == CUDA_SUCCESS)
        *bytes = total;
    return rc;
}

VGPU_EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    if (!ready() || real.cuDeviceTotalMem == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    unsigned int total32 = 0;
    CUresult rc = real.cuDeviceTotalMem(bytes != NULL ? &total32 : NULL, dev);
    size_t total = total32;
    if (rc == CUDA_SUCCESS && bytes != NULL && (rc = cap_total(&total, dev)) == CUDA_SUCCESS)
        *bytes = (unsigned int)total;
    return rc;
}

/* ---- launches ----------------------------------------------------------------------------- */

/* Every 1024th launch of a thread (and its first) stamps the slot's last_launch_unix_ns for
 * the node monitor: a clock read per launch would cost more than the rest of the wrapper. */
static __thread __attribute__((tls_model("initial-exec"))) unsigned launches_here;

/* The SM limiter's gate; with no limit this is one predictable branch. */
static void gate(uint64_t blocks)
{
    if (__builtin_expect((launches_here++ & 1023) == 0, 0))
        vgpu_region_note_launch();
    if (__builtin_expect(vgpu_throttle_enabled, 0))
        vgpu_throttle_launch(current_device(), blocks ? blocks : 1);
}

static uint64_t grid(unsigned gx, unsigned gy, unsigned gz)
{
    return (uint64_t)gx * gy * gz;
}

VGPU_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                    unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                                    CUstream stream, void **params, void **extra)
{
    if (!ready() || real.cuLaunchKernel == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate(grid(gx, gy, gz));
    return real.cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra);
}

VGPU_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                         unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                                         CUstream stream, void **params, void **extra)
{
    if (!ready() || real.cuLaunchKernel_ptsz == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate(grid(gx, gy, gz));
    return real.cuLaunchKernel_ptsz(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra);
}

VGPU_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params,
                                      void **extra)
{
    if (!ready() || real.cuLaunchKernelEx == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (config != NULL)
        gate(grid(config->gridDimX, config->gridDimY, config->gridDimZ));
    return real.cuLaunchKernelEx(config, f, params, extra);
}

VGPU_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
                                           void **params, void **extra)
{
    if (!ready() || real.cuLaunchKernelEx_ptsz == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (config != NULL)
        gate(grid(config->gridDimX, config->gridDimY, config->gridDimZ));
    return real.cuLaunchKernelEx_ptsz(config, f, params, extra);
}

VGPU_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy,
                                               unsigned gz, unsigned bx, unsigned by,
                                               unsigned bz, unsigned shmem, CUstream stream,
                                               void **params)
{
    if (!ready() || real.cuLaunchCooperativeKernel == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate(grid(gx, gy, gz));
    return real.cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, params);
}

VGPU_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy,
                                                    unsigned gz, unsigned bx, unsigned by,
                                                    unsigned bz, unsigned shmem, CUstream stream,
                                                    void **params)
{
    if (!ready() || real.cuLaunchCooperativeKernel_ptsz == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate(grid(gx, gy, gz));
    return real.cuLaunchCooperativeKernel_ptsz(f, gx, gy, gz, bx, by, bz, shmem, stream, params);
}

/* A graph costs the blocks of all its kernels (learnt when it was instantiated, below). */
VGPU_EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream)
{
    if (!ready() || real.cuGraphLaunch == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate(vgpu_throttle_enabled ? vgpu_graph_cost(exec) : 1);
    return real.cuGraphLaunch(exec, stream);
}

VGPU_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream)
{
    if (!ready() || real.cuGraphLaunch_ptsz == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate(vgpu_throttle_enabled ? vgpu_graph_cost(exec) : 1);
    return real.cuGraphLaunch_ptsz(exec, stream);
}

/* ---- graphs: what a launch costs is learnt when the graph is instantiated ------------------ */

static struct vgpu_graph_api graph_api(void)
{
    return (struct vgpu_graph_api){
        .get_nodes = real.cuGraphGetNodes,
        .node_type = real.cuGraphNodeGetType,
        .kernel_params = real.cuGraphKernelNodeGetParams_v2,
        .kernel_params_v1 = real.cuGraphKernelNodeGetParams,
        .child_graph = real.cuGraphChildGraphNodeGetGraph,
    };
}

/* What launching graph will cost, read before the driver is asked to use it: out of host memory
 * (-1), the caller answers CUDA_ERROR_OUT_OF_MEMORY with nothing changed. */
static int read_costs(CUgraph graph, struct vgpu_graph_costs *costs)
{
    const struct vgpu_graph_api api = graph_api();
    *costs = (struct vgpu_graph_costs){0};
    if (!vgpu_throttle_enabled || vgpu_graph_costs(&api, graph, costs) == 0)
        return 0;
    vgpu_log(VGPU_LOG_ERROR, "out of host memory reading a CUDA graph's kernels: refused");
    return -1;
}

/* After the driver updated exec (rc its answer): exec now costs costs, under the names of the
 * nodes it was instantiated from. */
static CUresult updated(CUresult rc, CUgraphExec exec, struct vgpu_graph_costs *costs)
{
    if (rc != CUDA_SUCCESS || !vgpu_throttle_enabled)
        free(costs->nodes);
    else if (vgpu_graph_update(exec, costs) != 0) /* only for an exec not made through us */
        vgpu_log(VGPU_LOG_ERROR, "out of host memory: an updated CUDA graph costs one token");
    return rc;
}

/* After the driver made *exec (rc its answer). An executable graph whose cost cannot be kept
 * (no host memory for the table) would run at one token a launch, so it is destroyed again. */
static CUresult instantiated(CUresult rc, CUgraphExec *exec, struct vgpu_graph_costs *costs)
{
    if (rc != CUDA_SUCCESS || exec == NULL || !vgpu_throttle_enabled) {
        free(costs->nodes);
        return rc;
    }
    if (vgpu_graph_remember(*exec, costs) == 0)
        return rc;
    if (real.cuGraphExecDestroy != NULL)
        real.cuGraphExecDestroy(*exec);
    *exec = NULL;
    vgpu_log(VGPU_LOG_ERROR, "out of host memory: a CUDA graph was not instantiated");
    return CUDA_ERROR_OUT_OF_MEMORY;
}

VGPU_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph,
                                                 unsigned long long flags)
{
    struct vgpu_graph_costs costs;
    if (!ready() || real.cuGraphInstantiateWithFlags == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (read_costs(graph, &costs) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return instantiated(real.cuGraphInstantiateWithFlags(exec, graph, flags), exec, &costs);
}

VGPU_EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *exec, CUgraph graph,
                                                  CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    struct vgpu_graph_costs costs;
    if (!ready() || real.cuGraphInstantiateWithParams == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (read_costs(graph, &costs) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return instantiated(real.cuGraphInstantiateWithParams(exec, graph, params), exec, &costs);
}

VGPU_EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *exec, CUgraph graph,
                                                       CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    struct vgpu_graph_costs costs;
    if (!ready() || real.cuGraphInstantiateWithParams_ptsz == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (read_costs(graph, &costs) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return instantiated(real.cuGraphInstantiateWithParams_ptsz(exec, graph, params), exec,
                        &costs);
}

VGPU_EXPORT CUresult cuGraphExecUpdate_v2(CUgraphExec exec, CUgraph graph,
                                          CUgraphExecUpdateResultInfo *info)
{
    struct vgpu_graph_costs costs;
    if (!ready() || real.cuGraphExecUpdate_v2 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (read_costs(graph, &costs) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return updated(real.cuGraphExecUpdate_v2(exec, graph, info), exec, &costs);
}

/* The CUDA 10/11 ABI (cuda_v1.h), which CUDA 11 builds still call. */
VGPU_EXPORT CUresult cuGraphInstantiate(CUgraphExec *exec, CUgraph graph, CUgraphNode *error_node,
                                        char *log, size_t log_size)
{
    struct vgpu_graph_costs costs;
    if (!ready() || real.cuGraphInstantiate == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (read_costs(graph, &costs) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return instantiated(real.cuGraphInstantiate(exec, graph, error_node, log, log_size), exec,
                        &costs);
}

VGPU_EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *exec, CUgraph graph,
                                           CUgraphNode *error_node, char *log, size_t log_size)
{
    struct vgpu_graph_costs costs;
    if (!ready() || real.cuGraphInstantiate_v2 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (read_costs(graph, &costs) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return instantiated(real.cuGraphInstantiate_v2(exec, graph, error_node, log, log_size), exec,
                        &costs);
}

VGPU_EXPORT CUresult cuGraphExecUpdate(CUgraphExec exec, CUgraph graph, CUgraphNode *error_node,
                                       CUgraphExecUpdateResult *result)
{
    struct vgpu_graph_costs costs;
    if (!ready() || real.cuGraphExecUpdate == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (read_costs(graph, &costs) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return updated(real.cuGraphExecUpdate(exec, graph, error_node, result), exec, &costs);
}

/* The entry is taken before the driver destroys exec: once destroyed, its address may be another
 * thread's new graph, whose entry a late removal would take. */
VGPU_EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec)
{
    if (!ready() || real.cuGraphExecDestroy == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct vgpu_graph_costs taken;
    int known = vgpu_graph_take(exec, &taken) == 0;
    CUresult rc = real.cuGraphExecDestroy(exec);
    if (rc != CUDA_SUCCESS && known)
        vgpu_graph_remember(exec, &taken);
    else
        free(taken.nodes);
    return rc;
}

/* ---- graphs changed after instantiation: each setter changes the cost of its node ---------- */

static CUresult node_set(CUresult rc, CUgraphExec exec, CUgraphNode node, uint64_t blocks)
{
    if (rc == CUDA_SUCCESS && vgpu_throttle_enabled)
        vgpu_graph_set_node(exec, node, blocks);
    return rc;
}

/* What a child graph node running child will cost, read before the driver is asked: -1 when out
 * of host memory (the caller answers CUDA_ERROR_OUT_OF_MEMORY with nothing changed). */
static int child_cost(CUgraph child, uint64_t *blocks)
{
    const struct vgpu_graph_api api = graph_api();
    *blocks = 0;
    if (!vgpu_throttle_enabled || vgpu_graph_child_blocks(&api, child, blocks) == 0)
        return 0;
    vgpu_log(VGPU_LOG_ERROR, "out of host memory reading a CUDA child graph's kernels: refused");
    return -1;
}

VGPU_EXPORT CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec exec, CUgraphNode node,
                                                       const CUDA_KERNEL_NODE_PARAMS *params)
{
    if (!ready() || real.cuGraphExecKernelNodeSetParams_v2 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = real.cuGraphExecKernelNodeSetParams_v2(exec, node, params);
    return params != NULL
        ? node_set(rc, exec, node, grid(params->gridDimX, params->gridDimY, params->gridDimZ))
        : rc;
}

/* The CUDA 10.1 ABI (cuda_v1.h). */
VGPU_EXPORT CUresult cuGraphExecKernelNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                                    const CUDA_KERNEL_NODE_PARAMS_v1 *params)
{
    if (!ready() || real.cuGraphExecKernelNodeSetParams == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = real.cuGraphExecKernelNodeSetParams(exec, node, params);
    return params != NULL
        ? node_set(rc, exec, node, grid(params->gridDimX, params->gridDimY, params->gridDimZ))
        : rc;
}

VGPU_EXPORT CUresult cuGraphExecChildGraphNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                                        CUgraph child)
{
    uint64_t blocks;
    if (!ready() || real.cuGraphExecChildGraphNodeSetParams == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (child_cost(child, &blocks) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return node_set(real.cuGraphExecChildGraphNodeSetParams(exec, node, child), exec, node,
                    blocks);
}

/* CUDA 12.2's setter of any node: kernels and child graphs change the cost. */
VGPU_EXPORT CUresult cuGraphExecNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                              CUgraphNodeParams *params)
{
    uint64_t blocks;
    if (!ready() || real.cuGraphExecNodeSetParams == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (params != NULL && params->type == CU_GRAPH_NODE_TYPE_GRAPH &&
        child_cost(params->graph.graph, &blocks) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real.cuGraphExecNodeSetParams(exec, node, params);
    if (params != NULL && params->type == CU_GRAPH_NODE_TYPE_KERNEL)
        return node_set(rc, exec, node, grid(params->kernel.gridDimX, params->kernel.gridDimY,
                                             params->kernel.gridDimZ));
    if (params != NULL && params->type == CU_GRAPH_NODE_TYPE_GRAPH)
        return node_set(rc, exec, node, blocks);
    return rc;
}

/* A disabled node does not run: it costs nothing until it is enabled again. */
VGPU_EXPORT CUresult cuGraphNodeSetEnabled(CUgraphExec exec, CUgraphNode node,
                                           unsigned int enabled)
{
    if (!ready() || real.cuGraphNodeSetEnabled == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = real.cuGraphNodeSetEnabled(exec, node, enabled);
    if (rc == CUDA_SUCCESS && vgpu_throttle_enabled)
        vgpu_graph_enable_node(exec, node, enabled != 0);
    return rc;
}

/* ---- contexts: what a context holds on a capped device is counted (footprint.c) ---------- */

/* A destroyed context's memory is freed by the driver without a free call (cudaDeviceReset,
 * the last release of a primary context, cuCtxDestroy): the pointers the driver no longer knows
 * are given back, or the cap would shrink by them for the rest of the process (stream-ordered
 * and cuMemCreate memory is no context's, cuda.h says: it stays, and the driver says so). Only
 * pointers are asked about: the driver answers for any address, while a destroyed array or
 * handle may not be passed to it again (those stay counted until their value comes back). */
static enum vgpu_held pointer_held(uint64_t key)
{
    unsigned int type;
    CUresult rc = real.cuPointerGetAttribute == NULL
                      ? CUDA_ERROR_NOT_SUPPORTED
                      : real.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                                   (CUdeviceptr)key);
    /* cuda.h: INVALID_VALUE when ptr was not allocated by (or registered with) a context. */
    if (rc == CUDA_SUCCESS)
        return VGPU_HELD_YES;
    return rc == CUDA_ERROR_INVALID_VALUE ? VGPU_HELD_GONE : VGPU_HELD_UNKNOWN;
}

/* After cudaDeviceReset the calling thread's current context is a primary context not made
 * again yet, and calls that need one answer CUDA_ERROR_CONTEXT_IS_DESTROYED (cuda.h): the
 * pointers are asked about with no current context (a UVA pointer needs none), and the
 * thread's context is put back after. */
static void context_gone(int dev)
{
    CUdevice any;
    CUcontext destroyed = NULL;
    int swapped = real.cuCtxGetDevice != NULL && real.cuCtxGetCurrent != NULL &&
                  real.cuCtxSetCurrent != NULL &&
                  real.cuCtxGetDevice(&any) == CUDA_ERROR_CONTEXT_IS_DESTROYED &&
                  real.cuCtxGetCurrent(&destroyed) == CUDA_SUCCESS &&
                  real.cuCtxSetCurrent(NULL) == CUDA_SUCCESS;
    size_t unanswered;
    uint64_t bytes = vgpu_mem_forget_gone(VGPU_KIND_POINTER, dev, pointer_held, &unanswered);
    if (swapped && real.cuCtxSetCurrent(destroyed) != CUDA_SUCCESS)
        vgpu_log(VGPU_LOG_ERROR, "could not make the destroyed context current again after "
                 "checking allocations; this thread now has no current context");
    if (bytes != 0)
        vgpu_log(VGPU_LOG_INFO, "a destroyed context freed %llu bytes of counted allocations",
                 (unsigned long long)bytes);
    if (unanswered != 0)
        vgpu_log(VGPU_LOG_WARN, "after a context was destroyed the driver could not say whether "
                 "%zu counted allocations still exist: they stay counted", unanswered);
    vgpu_footprint_context_gone(dev);
}

/* A context made at the same moment as another container's leaves the host pid unknown (two
 * new pids in NVML's list). It is then asked at once with an allocation of the library's own,
 * made and freed in the new context (no work in it yet), of a size two processes rarely pick
 * at the same moment (4-60 MiB in 2 MiB steps, from the clock and the pid), in relaxed capture
 * mode so that another thread's stream capture is not broken; the application's plain and
 * cuMemCreate allocations are tried too (alloc_pointer, cuMemCreate). */
static void probe_host_pid(CUcontext ctx, int dev)
{
    if (vgpu_region_host_pid() != 0 || real.cuCtxPushCurrent_v2 == NULL ||
        real.cuCtxPopCurrent_v2 == NULL || real.cuMemAlloc_v2 == NULL ||
        real.cuMemFree_v2 == NULL || real.cuThreadExchangeStreamCaptureMode == NULL)
        return;
    uint64_t spread = (monotonic_ns() >> 10) ^ ((uint64_t)getpid() * UINT64_C(2654435761));
    uint64_t bytes = (2 + spread % 29) << 21;
    if (!vgpu_footprint_learn_before(dev, bytes))
        return;
    CUresult rc = CUDA_ERROR_OUT_OF_MEMORY;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    CUcontext popped;
    CUdeviceptr ptr = 0;
    /* Counted while it lives, like any allocation; no room under the cap: not tried. */
    if (vgpu_region_reserve(dev, bytes) == 0) {
        vgpu_mem_op_begin();
        if (real.cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS) {
            if (real.cuCtxPushCurrent_v2(ctx) == CUDA_SUCCESS) {
                rc = real.cuMemAlloc_v2(&ptr, bytes);
                if (rc == CUDA_SUCCESS) {
                    vgpu_footprint_learn_after(bytes, 0);
                    if (real.cuMemFree_v2(ptr) != CUDA_SUCCESS)
                        vgpu_log(VGPU_LOG_ERROR, "could not free the %llu bytes allocated to "
                                 "learn the host pid", (unsigned long long)bytes);
                }
                real.cuCtxPopCurrent_v2(&popped);
            }
            real.cuThreadExchangeStreamCaptureMode(&mode);
        }
        vgpu_mem_op_end();
        vgpu_region_release(dev, bytes);
    }
    if (rc != CUDA_SUCCESS) /* the application's next allocation may try at once */
        vgpu_footprint_learn_after(0, 1);
}

/* The driver retains the primary context by reference: a retain while this process holds it
 * makes nothing new (footprint.c neither measures nor refuses then). */
VGPU_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev)
{
    if (!ready() || real.cuDevicePrimaryCtxRetain == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct vgpu_context_probe probe;
    if (vgpu_footprint_before_context((int)dev, 1, &probe) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real.cuDevicePrimaryCtxRetain(ctx, dev);
    if (vgpu_footprint_after_context(&probe, rc == CUDA_SUCCESS) != 0) {
        if (real.cuDevicePrimaryCtxRelease_v2 != NULL)
            real.cuDevicePrimaryCtxRelease_v2(dev);
        vgpu_footprint_context_gone((int)dev);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (rc == CUDA_SUCCESS && probe.active && probe.first)
        probe_host_pid(*ctx, (int)dev);
    return rc;
}

/* cudaDeviceReset: the primary context and everything in it are gone. */
VGPU_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    if (!ready() || real.cuDevicePrimaryCtxReset_v2 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = real.cuDevicePrimaryCtxReset_v2(dev);
    if (rc == CUDA_SUCCESS)
        context_gone((int)dev);
    return rc;
}

/* The last release resets the primary context (cuda.h); an earlier one frees nothing. */
static int primary_active(CUdevice dev)
{
    unsigned int flags;
    int active = 0;
    return real.cuDevicePrimaryCtxGetState == NULL ||
           real.cuDevicePrimaryCtxGetState(dev, &flags, &active) != CUDA_SUCCESS || active;
}

VGPU_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    if (!ready() || real.cuDevicePrimaryCtxRelease_v2 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = real.cuDevicePrimaryCtxRelease_v2(dev);
    if (rc == CUDA_SUCCESS && !primary_active(dev))
        context_gone((int)dev);
    else if (rc == CUDA_SUCCESS)
        vgpu_footprint_context_gone((int)dev);
    return rc;
}

/* After the driver made (or failed to make) a context on dev: a context that does not fit is
 * destroyed again and the caller gets CUDA_ERROR_OUT_OF_MEMORY. */
static CUresult keep_context(struct vgpu_context_probe *probe, CUresult rc, CUcontext *ctx,
                             CUdevice dev)
{
    if (vgpu_footprint_after_context(probe, rc == CUDA_SUCCESS) == 0) {
        if (rc == CUDA_SUCCESS && probe->active && probe->first)
            probe_host_pid(*ctx, (int)dev);
        return rc;
    }
    if (real.cuCtxDestroy_v2 != NULL)
        real.cuCtxDestroy_v2(*ctx);
    vgpu_footprint_context_gone((int)dev);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

VGPU_EXPORT CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice dev)
{
    if (!ready() || real.cuCtxCreate_v2 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct vgpu_context_probe probe;
    if (vgpu_footprint_before_context((int)dev, 0, &probe) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return keep_context(&probe, real.cuCtxCreate_v2(ctx, flags, dev), ctx, dev);
}

VGPU_EXPORT CUresult cuCtxCreate_v3(CUcontext *ctx, CUexecAffinityParam *params, int count,
                                    unsigned int flags, CUdevice dev)
{
    if (!ready() || real.cuCtxCreate_v3 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct vgpu_context_probe probe;
    if (vgpu_footprint_before_context((int)dev, 0, &probe) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return keep_context(&probe, real.cuCtxCreate_v3(ctx, params, count, flags, dev), ctx, dev);
}

VGPU_EXPORT CUresult cuCtxCreate_v4(CUcontext *ctx, CUctxCreateParams *params, unsigned int flags,
                                    CUdevice dev)
{
    if (!ready() || real.cuCtxCreate_v4 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct vgpu_context_probe probe;
    if (vgpu_footprint_before_context((int)dev, 0, &probe) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return keep_context(&probe, real.cuCtxCreate_v4(ctx, params, flags, dev), ctx, dev);
}

/* The destroyed context's device is not known here: every capped device is measured again. */
VGPU_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    if (!ready() || real.cuCtxDestroy_v2 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = real.cuCtxDestroy_v2(ctx);
    if (rc == CUDA_SUCCESS)
        context_gone(-1);
    return rc;
}

/* Normal exit: give this process's memory back now rather than at the next reap. */
__attribute__((destructor)) static void on_exit_release(void) { vgpu_region_detach(); }
