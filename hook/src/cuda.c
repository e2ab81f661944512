/* cuda.c - the CUDA driver library as the application sees it: the table of hooked and called
 * functions, cuInit, and the cuGetProcAddress path (the runtime resolves everything through it
 * since CUDA 11.3). The wrappers themselves are in cuda_*.c (cuda_driver.h lists them). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>

#include "cuda_driver.h"
#include "devices.h"
#include "footprint.h"
#include "log.h"
#include "region.h"
#include "throttle.h"

/* Filled in by vgpu_lib_load from the table below. */
struct vgpu_cuda_real real;
int vgpu_one_device;

static void after_load(void);

/* HOOK(export, base name, a CUDA version with this export's ABI, per-thread flavour) */
#define HOOK(name, base, version, pt) {#name, (void *)name, (void **)&real.name, base, version, pt}
#define CALL_ONLY(name) {#name, NULL, (void **)&real.name, NULL, 0, 0}
/* cuLaunch, cuLaunchGrid, cuLaunchGridAsync and cuLaunchCooperativeKernelMultiDevice are
 * deprecated in cuda.h and still exported by the driver: launches the limiter must see. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
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
    HOOK(cuMipmappedArrayCreate, "cuMipmappedArrayCreate", 5000, 0),
    HOOK(cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy", 5000, 0),
    HOOK(cuMemCreate, "cuMemCreate", 10020, 0),
    HOOK(cuMemRelease, "cuMemRelease", 10020, 0),
    HOOK(cuMemMap, "cuMemMap", 10020, 0),
    HOOK(cuMemUnmap, "cuMemUnmap", 10020, 0),
    HOOK(cuMemRetainAllocationHandle, "cuMemRetainAllocationHandle", 11000, 0),
    HOOK(cuMemExportToShareableHandle, "cuMemExportToShareableHandle", 10020, 0),
    HOOK(cuMemMapArrayAsync, "cuMemMapArrayAsync", 11010, 0),
    HOOK(cuMemMapArrayAsync_ptsz, "cuMemMapArrayAsync", 11010, 1),
    HOOK(cuMulticastBindMem, "cuMulticastBindMem", 12010, 0),
    HOOK(cuMulticastBindAddr, "cuMulticastBindAddr", 12010, 0),
    HOOK(cuMulticastBindMem_v2, "cuMulticastBindMem", 13010, 0),
    HOOK(cuMulticastBindAddr_v2, "cuMulticastBindAddr", 13010, 0),
    HOOK(cuMulticastUnbind, "cuMulticastUnbind", 12010, 0),
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
    HOOK(cuLaunch, "cuLaunch", 2000, 0),
    HOOK(cuLaunchGrid, "cuLaunchGrid", 2000, 0),
    HOOK(cuLaunchGridAsync, "cuLaunchGridAsync", 2000, 0),
    HOOK(cuLaunchCooperativeKernelMultiDevice, "cuLaunchCooperativeKernelMultiDevice", 9000, 0),
    HOOK(cuGraphLaunch, "cuGraphLaunch", 10000, 0),
    HOOK(cuGraphLaunch_ptsz, "cuGraphLaunch", 10000, 1),
    HOOK(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000, 0),
    HOOK(cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 11000, 0),
    HOOK(cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset", 11000, 0),
    HOOK(cuCtxCreate_v2, "cuCtxCreate", 3020, 0),
    HOOK(cuCtxCreate_v3, "cuCtxCreate", 11040, 0),
    HOOK(cuCtxCreate_v4, "cuCtxCreate", 12050, 0),
    HOOK(cuCtxDestroy_v2, "cuCtxDestroy", 4000, 0),
    HOOK(cuCtxCreate, "cuCtxCreate", 2000, 0),
    HOOK(cuGreenCtxCreate, "cuGreenCtxCreate", 12040, 0),
    HOOK(cuGreenCtxDestroy, "cuGreenCtxDestroy", 12040, 0),
    HOOK(cuCtxSynchronize, "cuCtxSynchronize", 2000, 0),
    HOOK(cuCtxSynchronize_v2, "cuCtxSynchronize", 13000, 0),
    HOOK(cuCtxSetCurrent, "cuCtxSetCurrent", 4000, 0),
    HOOK(cuCtxPushCurrent_v2, "cuCtxPushCurrent", 4000, 0),
    HOOK(cuCtxPopCurrent_v2, "cuCtxPopCurrent", 4000, 0),
    HOOK(cuCtxPushCurrent, "cuCtxPushCurrent", 2000, 0),
    HOOK(cuCtxPopCurrent, "cuCtxPopCurrent", 2000, 0),
    HOOK(cuStreamSynchronize, "cuStreamSynchronize", 2000, 0),
    HOOK(cuStreamSynchronize_ptsz, "cuStreamSynchronize", 7000, 1),
    HOOK(cuStreamQuery, "cuStreamQuery", 2000, 0),
    HOOK(cuStreamQuery_ptsz, "cuStreamQuery", 7000, 1),
    HOOK(cuStreamDestroy, "cuStreamDestroy", 2000, 0),
    HOOK(cuStreamCreate, "cuStreamCreate", 2000, 0),
    HOOK(cuStreamCreateWithPriority, "cuStreamCreateWithPriority", 5050, 0),
    HOOK(cuStreamDestroy_v2, "cuStreamDestroy", 4000, 0),
    HOOK(cuEventCreate, "cuEventCreate", 2000, 0),
    HOOK(cuIpcOpenEventHandle, "cuIpcOpenEventHandle", 4010, 0),
    HOOK(cuEventRecord, "cuEventRecord", 2000, 0),
    HOOK(cuEventRecord_ptsz, "cuEventRecord", 7000, 1),
    HOOK(cuEventRecordWithFlags, "cuEventRecordWithFlags", 11010, 0),
    HOOK(cuEventRecordWithFlags_ptsz, "cuEventRecordWithFlags", 11010, 1),
    HOOK(cuEventSynchronize, "cuEventSynchronize", 2000, 0),
    HOOK(cuEventQuery, "cuEventQuery", 2000, 0),
    HOOK(cuEventDestroy, "cuEventDestroy", 2000, 0),
    HOOK(cuEventDestroy_v2, "cuEventDestroy", 4000, 0),
    HOOK(cuMemcpyDtoH, "cuMemcpyDtoH", 2000, 0),
    HOOK(cuMemcpyDtoH_v2, "cuMemcpyDtoH", 3020, 0),
    HOOK(cuMemcpyDtoH_v2_ptds, "cuMemcpyDtoH", 7000, 1),
    HOOK(cuMemcpy, "cuMemcpy", 4000, 0),
    HOOK(cuMemcpy_ptds, "cuMemcpy", 7000, 1),
    HOOK(cuMemsetD8, "cuMemsetD8", 2000, 0),
    HOOK(cuMemsetD8_v2, "cuMemsetD8", 3020, 0),
    HOOK(cuMemsetD8_v2_ptds, "cuMemsetD8", 7000, 1),
    HOOK(cuMemsetD8Async, "cuMemsetD8Async", 3020, 0),
    HOOK(cuMemsetD8Async_ptsz, "cuMemsetD8Async", 7000, 1),
    HOOK(cuMemsetD2D8, "cuMemsetD2D8", 2000, 0),
    HOOK(cuMemsetD2D8_v2, "cuMemsetD2D8", 3020, 0),
    HOOK(cuMemsetD2D8_v2_ptds, "cuMemsetD2D8", 7000, 1),
    HOOK(cuMemsetD2D8Async, "cuMemsetD2D8Async", 3020, 0),
    HOOK(cuMemsetD2D8Async_ptsz, "cuMemsetD2D8Async", 7000, 1),
    HOOK(cuMemsetD16, "cuMemsetD16", 2000, 0),
    HOOK(cuMemsetD16_v2, "cuMemsetD16", 3020, 0),
    HOOK(cuMemsetD16_v2_ptds, "cuMemsetD16", 7000, 1),
    HOOK(cuMemsetD16Async, "cuMemsetD16Async", 3020, 0),
    HOOK(cuMemsetD16Async_ptsz, "cuMemsetD16Async", 7000, 1),
    HOOK(cuMemsetD2D16, "cuMemsetD2D16", 2000, 0),
    HOOK(cuMemsetD2D16_v2, "cuMemsetD2D16", 3020, 0),
    HOOK(cuMemsetD2D16_v2_ptds, "cuMemsetD2D16", 7000, 1),
    HOOK(cuMemsetD2D16Async, "cuMemsetD2D16Async", 3020, 0),
    HOOK(cuMemsetD2D16Async_ptsz, "cuMemsetD2D16Async", 7000, 1),
    HOOK(cuMemsetD32, "cuMemsetD32", 2000, 0),
    HOOK(cuMemsetD32_v2, "cuMemsetD32", 3020, 0),
    HOOK(cuMemsetD32_v2_ptds, "cuMemsetD32", 7000, 1),
    HOOK(cuMemsetD32Async, "cuMemsetD32Async", 3020, 0),
    HOOK(cuMemsetD32Async_ptsz, "cuMemsetD32Async", 7000, 1),
    HOOK(cuMemsetD2D32, "cuMemsetD2D32", 2000, 0),
    HOOK(cuMemsetD2D32_v2, "cuMemsetD2D32", 3020, 0),
    HOOK(cuMemsetD2D32_v2_ptds, "cuMemsetD2D32", 7000, 1),
    HOOK(cuMemsetD2D32Async, "cuMemsetD2D32Async", 3020, 0),
    HOOK(cuMemsetD2D32Async_ptsz, "cuMemsetD2D32Async", 7000, 1),
    HOOK(cuCtxDestroy, "cuCtxDestroy", 2000, 0),
    HOOK(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", 7000, 0),
    HOOK(cuDevicePrimaryCtxReset, "cuDevicePrimaryCtxReset", 7000, 0),
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
    HOOK(cuGraphExecMemsetNodeSetParams, "cuGraphExecMemsetNodeSetParams", 10020, 0),
    HOOK(cuGraphExecNodeSetParams, "cuGraphExecNodeSetParams", 12020, 0),
    HOOK(cuGraphNodeSetEnabled, "cuGraphNodeSetEnabled", 11060, 0),
    HOOK(cuGraphUpload, "cuGraphUpload", 11010, 0),
    HOOK(cuGraphUpload_ptsz, "cuGraphUpload", 11010, 1),
    HOOK(cuDeviceGraphMemTrim, "cuDeviceGraphMemTrim", 11040, 0),
    HOOK(cuCtxSetLimit, "cuCtxSetLimit", 3010, 0),
    HOOK(cuModuleUnload, "cuModuleUnload", 2000, 0),
    HOOK(cuLibraryUnload, "cuLibraryUnload", 12000, 0),
    CALL_ONLY(cuCtxGetDevice), CALL_ONLY(cuDeviceGetCount), CALL_ONLY(cuDeviceGet),
    CALL_ONLY(cuDeviceGetUuid_v2), CALL_ONLY(cuGraphGetNodes), CALL_ONLY(cuGraphNodeGetType),
    CALL_ONLY(cuGraphKernelNodeGetParams_v2), CALL_ONLY(cuGraphKernelNodeGetParams),
    CALL_ONLY(cuGraphChildGraphNodeGetGraph), CALL_ONLY(cuStreamGetDevice),
    CALL_ONLY(cuStreamGetCtx), CALL_ONLY(cuStreamGetCtx_v2),
    CALL_ONLY(cuPointerGetAttribute), CALL_ONLY(cuDeviceGetMemPool), CALL_ONLY(cuMemPoolTrimTo),
    CALL_ONLY(cuDevicePrimaryCtxGetState), CALL_ONLY(cuMemPoolGetAttribute),
    CALL_ONLY(cuStreamIsCapturing), CALL_ONLY(cuStreamIsCapturing_ptsz),
    CALL_ONLY(cuCtxGetCurrent),
    CALL_ONLY(cuThreadExchangeStreamCaptureMode), CALL_ONLY(cuGraphMemAllocNodeGetParams),
    CALL_ONLY(cuGraphMemsetNodeGetParams),
    CALL_ONLY(cuDeviceGetGraphMemAttribute), CALL_ONLY(cuCtxGetLimit),
    CALL_ONLY(cuDeviceGetAttribute), CALL_ONLY(cuFuncGetAttribute), CALL_ONLY(cuKernelGetAttribute),
    CALL_ONLY(cuStreamGetCaptureInfo_v2), CALL_ONLY(cuStreamGetCaptureInfo_v2_ptsz),
    CALL_ONLY(cuCtxFromGreenCtx),
};
#pragma GCC diagnostic pop
_Static_assert(sizeof hooks / sizeof hooks[0] <= VGPU_MAX_HOOKS, "raise VGPU_MAX_HOOKS");
#undef HOOK
#undef CALL_ONLY

struct vgpu_hook_lib vgpu_cuda_lib = {
    .soname = "libcuda.so.1",
    .hooks = hooks,
    .count = sizeof hooks / sizeof hooks[0],
    .after_load = after_load,
};

/* Whether answer is the export of some hooked function. */
static int is_hooked_export(const void *answer)
{
    for (size_t i = 0; i < sizeof hooks / sizeof hooks[0]; i++)
        if (*hooks[i].real == answer)
            return 1;
    return 0;
}

/* Whether hook i, whose answer is `answer`, keeps it: where an earlier hook learnt the same
 * address (a driver answering both ABIs of a name with one entry point), the newer ABI keeps
 * it, the entry point being the newer's (the first match handed a _v2 caller the 32-bit ABI's
 * wrapper), and of two of one version the first. */
static int newest_alias(size_t i, const void *answer)
{
    for (size_t j = 0; j < i; j++)
        if (vgpu_cuda_lib.alias[j] == answer) {
            if (hooks[j].version >= hooks[i].version)
                return 0; /* the newer's, or on a tie the first's (the legacy stream's) */
            vgpu_cuda_lib.alias[j] = NULL;
        }
    return 1;
}

/* The wrapper swap in cuGetProcAddress matches the driver's answer against its dlsym exports.
 * In case a driver answers with other addresses (internal entry points of the same ABI), ask
 * it once, at load, what it answers for each hooked function, and accept that address too;
 * not one that is another hooked function's export (a driver answering a CUDA 2.0 name with
 * its _v2 export): taken for the first's, a _v2 caller got the 32-bit ABI's wrapper (a review
 * found). */
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
        if (rc == CUDA_SUCCESS && answer != NULL && answer != *h->real &&
            !is_hooked_export(answer) && newest_alias(i, answer)) {
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
    vgpu_footprint_init(vgpu_cuda_pool_cache);
}

/* Once the driver is up (the devices lock held): which GPU each ordinal is (devices.h), then
 * the SM limits of those. */
static void learn_devices(void)
{
    static char uuids[VGPU_REGION_MAX_DEVICES][VGPU_REGION_UUID_BYTES];
    int count = 0;
    if (real.cuDeviceGetCount == NULL || real.cuDeviceGetCount(&count) != CUDA_SUCCESS)
        count = -1;
    for (int i = 0; i < count && i < VGPU_REGION_MAX_DEVICES; i++) {
        CUdevice dev;
        CUuuid id;
        if (real.cuDeviceGetUuid_v2 == NULL || real.cuDeviceGet(&dev, i) != CUDA_SUCCESS ||
            real.cuDeviceGetUuid_v2(&id, dev) != CUDA_SUCCESS)
            continue;
        const unsigned char *b = (const unsigned char *)id.bytes;
        snprintf(uuids[i], sizeof uuids[i],
                 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                 b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12],
                 b[13], b[14], b[15]);
    }
    vgpu_devices_learn(count, (const char(*)[VGPU_REGION_UUID_BYTES])uuids);
    __atomic_store_n(&vgpu_one_device, count == 1, __ATOMIC_RELAXED);
    vgpu_throttle_init();
}

/* No usable region (logged when it was attached): the driver is not initialised at all. */
VGPU_EXPORT CUresult cuInit(unsigned int flags)
{
    if (!ready() || real.cuInit == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!vgpu_region_usable())
        return CUDA_ERROR_NOT_PERMITTED;
    static int learnt; /* under the devices lock */
    vgpu_devices_lock();
    CUresult rc = real.cuInit(flags);
    if (rc == CUDA_SUCCESS && !learnt) {
        learn_devices();
        learnt = 1;
    }
    vgpu_devices_unlock();
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
