/* cuda_report.c - what the container is told it has: cuMemGetInfo and cuDeviceTotalMem answer
 * with the cap and the container's usage. */
#define _GNU_SOURCE
#include "cuda_driver.h"
#include "devices.h"
#include "footprint.h"
#include "region.h"

/* The driver's figures, capped: total = min(cap, physical), free = min(total - container usage,
 * physical free). Without a usable region nothing is reported (CUDA_ERROR_NOT_PERMITTED); checked
 * after reading, so that a region truncated meanwhile is caught too. */
static CUresult cap_info(size_t *phys_free, size_t *phys_total)
{
    int dev = current_device();
    uint64_t cap = dev >= 0 ? vgpu_region_limit(dev) : 0;
    if (cap != 0) {
        vgpu_footprint_pools_check(dev); /* a pool may have given back what it kept */
        uint64_t total = cap < *phys_total ? cap : *phys_total;
        uint64_t used = vgpu_region_record_in_use(vgpu_device_record(dev));
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
