/* nvml.c - NVML wrappers: nvmlDeviceGetMemoryInfo (v1, v2) report the cap and the container's
 * usage, so nvidia-smi inside the container shows the cap; plus the utilisation probe. */
#define _GNU_SOURCE
#include "nvml.h"

#include <nvml.h>
#include <stdlib.h>

#include "loader.h"
#include "region.h"

#define VGPU_EXPORT __attribute__((visibility("default")))

static struct {
    nvmlReturn_t (*GetMemoryInfo)(nvmlDevice_t, nvmlMemory_t *);
    nvmlReturn_t (*GetMemoryInfo_v2)(nvmlDevice_t, nvmlMemory_v2_t *);
    nvmlReturn_t (*Init_v2)(void);
    nvmlReturn_t (*GetHandleByIndex_v2)(unsigned int, nvmlDevice_t *);
    nvmlReturn_t (*GetHandleByUUID)(const char *, nvmlDevice_t *);
    nvmlReturn_t (*GetUUID)(nvmlDevice_t, char *, unsigned int);
    nvmlReturn_t (*GetIndex)(nvmlDevice_t, unsigned int *);
    nvmlReturn_t (*GetProcessUtilization)(nvmlDevice_t, nvmlProcessUtilizationSample_t *,
                                          unsigned int *, unsigned long long);
    nvmlReturn_t (*GetUtilizationRates)(nvmlDevice_t, nvmlUtilization_t *);
} real;

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory);
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory);

static const struct vgpu_hook hooks[] = {
    {.name = "nvmlDeviceGetMemoryInfo", .wrapper = (void *)nvmlDeviceGetMemoryInfo,
     .real = (void **)&real.GetMemoryInfo},
    {.name = "nvmlDeviceGetMemoryInfo_v2", .wrapper = (void *)nvmlDeviceGetMemoryInfo_v2,
     .real = (void **)&real.GetMemoryInfo_v2},
    {.name = "nvmlInit_v2", .real = (void **)&real.Init_v2},
    {.name = "nvmlDeviceGetHandleByIndex_v2", .real = (void **)&real.GetHandleByIndex_v2},
    {.name = "nvmlDeviceGetHandleByUUID", .real = (void **)&real.GetHandleByUUID},
    {.name = "nvmlDeviceGetUUID", .real = (void **)&real.GetUUID},
    {.name = "nvmlDeviceGetIndex", .real = (void **)&real.GetIndex},
    {.name = "nvmlDeviceGetProcessUtilization", .real = (void **)&real.GetProcessUtilization},
    {.name = "nvmlDeviceGetUtilizationRates", .real = (void **)&real.GetUtilizationRates},
};

struct vgpu_hook_lib vgpu_nvml_lib = {
    .soname = "libnvidia-ml.so.1",
    .hooks = hooks,
    .count = sizeof hooks / sizeof hooks[0],
};

/* The CUDA ordinal of an NVML device: by the UUID CUDA recorded, else NVML's own index. */
static int cuda_index(nvmlDevice_t device)
{
    char uuid[96];
    if (real.GetUUID != NULL && real.GetUUID(device, uuid, sizeof uuid) == NVML_SUCCESS) {
        int dev = vgpu_region_find_uuid(uuid);
        if (dev >= 0)
            return dev;
    }
    unsigned int index;
    if (real.GetIndex != NULL && real.GetIndex(device, &index) == NVML_SUCCESS &&
        index < VGPU_REGION_MAX_DEVICES)
        return (int)index;
    return -1;
}

/* Rewrites NVML's figures to the capped view: total = min(cap, physical), used = the
 * container's usage, free = the rest. Returns 0 (figures untouched) when the device has no cap,
 * -1 when there is no usable region (nothing may be reported then). */
static int apply_cap(nvmlDevice_t device, unsigned long long *total, unsigned long long *used,
                     unsigned long long *free_bytes)
{
    if (!vgpu_region_usable())
        return -1;
    int dev = cuda_index(device);
    uint64_t cap = dev >= 0 ? vgpu_region_limit(dev) : 0;
    if (cap == 0)
        return 0;
    if (cap < *total)
        *total = cap;
    uint64_t container = vgpu_region_used(dev);
    *used = container < *total ? container : *total;
    *free_bytes = *total - *used;
    return 1;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    vgpu_lib_ensure(&vgpu_nvml_lib);
    if (real.GetMemoryInfo == NULL)
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t rc = real.GetMemoryInfo(device, memory);
    if (rc == NVML_SUCCESS && apply_cap(device, &memory->total, &memory->used, &memory->free) < 0)
        return NVML_ERROR_NO_PERMISSION;
    return rc;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    vgpu_lib_ensure(&vgpu_nvml_lib);
    if (real.GetMemoryInfo_v2 == NULL)
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t rc = real.GetMemoryInfo_v2(device, memory);
    /* used + reserved + free = total; the driver's reservation is outside the container's cap,
     * so it is not shown against it. */
    int capped = rc == NVML_SUCCESS ? apply_cap(device, &memory->total, &memory->used,
                                                &memory->free) : 0;
    if (capped < 0)
        return NVML_ERROR_NO_PERMISSION;
    if (capped > 0)
        memory->reserved = 0;
    return rc;
}

static int handle_for(int dev, nvmlDevice_t *device)
{
    static int initialised; /* only the watcher thread calls this */
    if (!initialised) {
        if (real.Init_v2 == NULL || real.Init_v2() != NVML_SUCCESS)
            return -1;
        initialised = 1;
    }
    char uuid[VGPU_REGION_UUID_BYTES];
    if (vgpu_region_uuid(dev, uuid, sizeof uuid) == 0 && real.GetHandleByUUID != NULL &&
        real.GetHandleByUUID(uuid, device) == NVML_SUCCESS)
        return 0;
    if (real.GetHandleByIndex_v2 != NULL &&
        real.GetHandleByIndex_v2((unsigned int)dev, device) == NVML_SUCCESS)
        return 0;
    return -1;
}

/* Sum over our pids of each pid's mean smUtil in the samples newer than *last_seen. */
static double process_util(nvmlDevice_t device, unsigned long long *last_seen,
                           const int32_t *pids, int npids, int *matched)
{
    unsigned int count = 0;
    nvmlReturn_t rc = real.GetProcessUtilization(device, NULL, &count, *last_seen);
    if (rc != NVML_ERROR_INSUFFICIENT_SIZE && rc != NVML_SUCCESS)
        return -1;
    if (count == 0)
        return 0;
    nvmlProcessUtilizationSample_t *samples = calloc(count, sizeof *samples);
    if (samples == NULL)
        return -1;
    double total = 0;
    rc = real.GetProcessUtilization(device, samples, &count, *last_seen);
    if (rc != NVML_SUCCESS) {
        free(samples);
        return -1;
    }
    for (int p = 0; p < npids; p++) {
        double sum = 0;
        int n = 0;
        for (unsigned int i = 0; i < count; i++) {
            if (samples[i].timeStamp > *last_seen)
                *last_seen = samples[i].timeStamp;
            if (samples[i].pid == (unsigned int)pids[p]) {
                sum += samples[i].smUtil;
                n++;
            }
        }
        if (n > 0) {
            total += sum / n;
            (*matched)++;
        }
    }
    free(samples);
    return total;
}

double vgpu_nvml_container_util(int dev, const int32_t *pids, int npids)
{
    static unsigned long long last_seen[VGPU_REGION_MAX_DEVICES];
    vgpu_lib_ensure(&vgpu_nvml_lib);
    nvmlDevice_t device;
    if (dev < 0 || dev >= VGPU_REGION_MAX_DEVICES || handle_for(dev, &device) != 0)
        return -1;
    int matched = 0;
    double util = -1;
    if (real.GetProcessUtilization != NULL)
        util = process_util(device, &last_seen[dev], pids, npids, &matched);
    if (util >= 0 && matched > 0)
        return util;
    nvmlUtilization_t rates;
    if (real.GetUtilizationRates != NULL && real.GetUtilizationRates(device, &rates) == NVML_SUCCESS)
        return rates.gpu; /* conservative: other tenants' work counts against us */
    return util;
}
