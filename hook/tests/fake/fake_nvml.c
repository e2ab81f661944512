/* fake_nvml.c - a host-only libnvidia-ml.so.1 over the fake libcuda (linked to it): the same
 * devices and UUIDs, memory from the fake's physical counters, and utilisation synthesised
 * from the fake's GPU time. */
#define _GNU_SOURCE
#define NVML_NO_UNVERSIONED_FUNC_DEFS /* the fake exports both spellings */
#include <nvml.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fake_state.h"

#define EXPORT __attribute__((visibility("default")))

enum { MAX_DEVICES = 8 };
static const unsigned long long reserved_bytes = 5ull << 20;

struct nvmlDevice_st {
    int index;
    uint64_t busy_at_process_query, time_at_process_query;
    uint64_t busy_at_rate_query, time_at_rate_query;
};
static struct nvmlDevice_st devices[MAX_DEVICES] = {
    {.index = 0}, {.index = 1}, {.index = 2}, {.index = 3},
    {.index = 4}, {.index = 5}, {.index = 6}, {.index = 7},
};
static int initialised;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

EXPORT nvmlReturn_t nvmlInit_v2(void)
{
    initialised = 1;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }

EXPORT nvmlReturn_t nvmlShutdown(void)
{
    initialised = 0;
    return NVML_SUCCESS;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t rc) { return rc == NVML_SUCCESS ? "Success" : "Error"; }

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    *count = (unsigned int)fake_cuda_device_count();
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (index >= (unsigned int)fake_cuda_device_count())
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}

static void format_uuid(int dev, char *out, unsigned int size)
{
    unsigned char b[16];
    fake_cuda_uuid(dev, b);
    snprintf(out, size, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int size)
{
    if (size < 41)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    format_uuid(device->index, uuid, size);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    char text[96];
    for (int i = 0; i < fake_cuda_device_count(); i++) {
        format_uuid(i, text, sizeof text);
        if (strcmp(text, uuid) == 0) {
            *device = &devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    *index = (unsigned int)device->index;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    unsigned long long total = fake_cuda_device_total(device->index);
    memory->total = total;
    memory->used = fake_cuda_device_used(device->index) + reserved_bytes;
    memory->free = total - memory->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long total = fake_cuda_device_total(device->index);
    memory->total = total;
    memory->reserved = reserved_bytes;
    memory->used = fake_cuda_device_used(device->index) + reserved_bytes;
    memory->free = total - memory->used;
    return NVML_SUCCESS;
}

/* Percent of wall time the fake GPU was busy since the previous query of the same kind. */
static unsigned int busy_percent(int dev, uint64_t *busy_before, uint64_t *time_before)
{
    uint64_t busy = fake_cuda_busy_ns(dev), now = now_ns();
    unsigned int pct = 0;
    if (*time_before != 0 && now > *time_before) {
        double p = 100.0 * (double)(busy - *busy_before) / (double)(now - *time_before);
        pct = p > 100.0 ? 100 : (unsigned int)(p + 0.5);
    }
    *busy_before = busy;
    *time_before = now;
    return pct;
}

EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                                    nvmlProcessUtilizationSample_t *samples,
                                                    unsigned int *count,
                                                    unsigned long long last_seen)
{
    (void)last_seen;
    if (samples == NULL || *count < 1) {
        *count = 1;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = 1;
    samples[0] = (nvmlProcessUtilizationSample_t){
        .pid = (unsigned int)getpid(),
        .timeStamp = now_ns() / 1000,
        .smUtil = busy_percent(device->index, &device->busy_at_process_query,
                               &device->time_at_process_query),
    };
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *rates)
{
    rates->gpu = busy_percent(device->index, &device->busy_at_rate_query,
                              &device->time_at_rate_query);
    rates->memory = 0;
    return NVML_SUCCESS;
}
