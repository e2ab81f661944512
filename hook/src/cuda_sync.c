/* cuda_sync.c - a synchronisation tells the SM limiter when none of the process's work runs on
 * its device any more (throttle.h): a process that exits before NVML has measured it stays
 * charged for what it prepaid, so a light one that waited on its kernels was charged the whole
 * GPU for its life. A context's synchronisation covers every stream; a stream's, or a query
 * that found its work done, covers that stream (PyTorch's copies to the host wait so), and a
 * stream destroyed may leave work running that no later wait of its handle covers. */
#define _GNU_SOURCE
#include "cuda_driver.h"
#include "throttle.h"

VGPU_EXPORT CUresult cuCtxSynchronize(void)
{
    if (!ready() || real.cuCtxSynchronize == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = real.cuCtxSynchronize();
    /* One device only: with several, a device's launches may have gone to another device's
     * context than the current one (a kernel handle runs in its stream's, whatever is
     * current), which this does not wait for. */
    if (vgpu_throttle_enabled && rc == CUDA_SUCCESS &&
        __atomic_load_n(&vgpu_one_device, __ATOMIC_RELAXED))
        vgpu_throttle_synced(0, VGPU_ALL_STREAMS);
    return rc;
}

/* A wait for stream (named through a _ptsz export: per_thread) through the driver's *wait:
 * once it answers CUDA_SUCCESS, the stream has no work left (cuda.h, cuStreamQuery: otherwise
 * CUDA_ERROR_NOT_READY). Its device is asked as a launch on it asks, so that the stream's
 * launches were charged there. */
static CUresult wait_stream(CUresult (*const *wait)(CUstream), CUstream stream, int per_thread)
{
    if (!ready() || *wait == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = (*wait)(stream);
    if (vgpu_throttle_enabled && rc == CUDA_SUCCESS)
        vgpu_throttle_synced(launch_device_on(stream), vgpu_stream_key(stream, per_thread));
    return rc;
}

VGPU_EXPORT CUresult cuStreamSynchronize(CUstream stream)
{
    return wait_stream(&real.cuStreamSynchronize, stream, 0);
}

VGPU_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream stream)
{
    return wait_stream(&real.cuStreamSynchronize_ptsz, stream, 1);
}

VGPU_EXPORT CUresult cuStreamQuery(CUstream stream)
{
    return wait_stream(&real.cuStreamQuery, stream, 0);
}

VGPU_EXPORT CUresult cuStreamQuery_ptsz(CUstream stream)
{
    return wait_stream(&real.cuStreamQuery_ptsz, stream, 1);
}

/* The limiter is told before the driver lets the handle go (after it, its device cannot be
 * asked). */
static CUresult destroy_stream(CUresult (*const *destroy)(CUstream), CUstream stream)
{
    if (!ready() || *destroy == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (vgpu_throttle_enabled && !vgpu_default_stream(stream))
        vgpu_throttle_stream_gone(launch_device_on(stream), vgpu_stream_key(stream, 0));
    return (*destroy)(stream);
}

VGPU_EXPORT CUresult cuStreamDestroy(CUstream stream)
{
    return destroy_stream(&real.cuStreamDestroy, stream);
}

VGPU_EXPORT CUresult cuStreamDestroy_v2(CUstream stream)
{
    return destroy_stream(&real.cuStreamDestroy_v2, stream);
}
