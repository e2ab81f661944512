/* cuda_sync.c - a synchronisation of the current context tells the SM limiter when none of the
 * process's work runs on its device any more (throttle.h): a process that exits before NVML has
 * measured it stays charged for what it prepaid, so a light one that waited on its kernels was
 * charged the whole GPU for its life. */
#define _GNU_SOURCE
#include "cuda_driver.h"
#include "throttle.h"

VGPU_EXPORT CUresult cuCtxSynchronize(void)
{
    if (!ready() || real.cuCtxSynchronize == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = real.cuCtxSynchronize();
    /* One device only: a launch is charged to the current context's device, yet a kernel
     * handle launched on another device's stream runs there, which this does not wait for. */
    if (vgpu_throttle_enabled && rc == CUDA_SUCCESS &&
        __atomic_load_n(&vgpu_one_device, __ATOMIC_RELAXED))
        vgpu_throttle_synced(0);
    return rc;
}
