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
    if (!vgpu_throttle_enabled)
        return real.cuCtxSynchronize();
    int dev = launch_device(); /* the current context's, as a launch's is charged */
    vgpu_throttle_sync_begin(dev);
    CUresult rc = real.cuCtxSynchronize();
    vgpu_throttle_sync_end(dev, rc == CUDA_SUCCESS ? 0 : -1);
    return rc;
}
