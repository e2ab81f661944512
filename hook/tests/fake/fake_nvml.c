/* fake_nvml.c - a host-only libnvidia-ml.so.1 over the fake libcuda (linked to it): the same
 * devices and UUIDs, memory and running processes from the fake GPU's per-process footprints,
 * and utilisation from its sample periods with NVML's semantics (fake_gpu.h): every process
 * sharing FAKE_GPU_SHARED sees every process. */
#define _GNU_SOURCE
#define NVML_NO_UNVERSIONED_FUNC_DEFS /* the fake exports both spellings */
#include <nvml.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "fake_state.h"

#define EXPORT __attribute__((visibility("default")))

enum { MAX_DEVICES = FAKE_MAX_GPUS, MAX_PROCS = 64 };
static const unsigned long long reserved_bytes = 5ull << 20;

struct nvmlDevice_st {
    int index;
};
static struct nvmlDevice_st devices[MAX_DEVICES]; /* index i at i (set by nvmlInit_v2) */
static int initialised; /* atomic: inits less shutdowns */

/* NVML names processes in the host's pid namespace; FAKE_NVML_PID_OFFSET plays a container's
 * (the pid NVML reports is the process's own pid plus the offset). */
static unsigned int host_pid(int pid)
{
    const char *offset = getenv("FAKE_NVML_PID_OFFSET");
    return (unsigned int)(pid + (offset != NULL ? atoi(offset) : 0));
}

/* NVML counts inits: a shutdown ends one, the last of them all (nvml.h, nvmlShutdown). */
EXPORT nvmlReturn_t nvmlInit_v2(void)
{
    for (int i = 0; i < MAX_DEVICES; i++)
        devices[i].index = i;
    __atomic_add_fetch(&initialised, 1, __ATOMIC_ACQ_REL);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }

/* pynvml's nvmlInit (gpu-check.sh's scripts run over the fake in make test). */
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return nvmlInit_v2();
}

EXPORT nvmlReturn_t nvmlShutdown(void)
{
    int was = __atomic_load_n(&initialised, __ATOMIC_ACQUIRE);
    do {
        if (was <= 0)
            return NVML_ERROR_UNINITIALIZED;
    } while (!__atomic_compare_exchange_n(&initialised, &was, was - 1, 0, __ATOMIC_ACQ_REL,
                                          __ATOMIC_ACQUIRE));
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
    memory->used = fake_cuda_device_physical_used(device->index) + reserved_bytes;
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
    memory->used = fake_cuda_device_physical_used(device->index) + reserved_bytes;
    memory->free = total - memory->used;
    return NVML_SUCCESS;
}

static int env_set(const char *name)
{
    const char *value = getenv(name);
    return value != NULL && value[0] != '\0' && strcmp(value, "0") != 0;
}

/* FAKE_NVML_UTIL_FAILS=1, read at every call: both utilisation queries answer
 * NVML_ERROR_UNKNOWN (a driver that stopped answering them mid-run). FAKE_NVML_UTIL_NOT_FOUND=1:
 * the per-process query finds no sample ever, and the whole GPU's fails (an NVML stub). */
static int util_fails(void) { return env_set("FAKE_NVML_UTIL_FAILS"); }

static int util_not_found(void) { return env_set("FAKE_NVML_UTIL_NOT_FOUND"); }

/* FAKE_NVML_SLOW_MS=N, read at every call: the per-process query takes N ms before it answers
 * (NVML's calls can be slow). */
static void answer_slowly(void)
{
    const char *slow = getenv("FAKE_NVML_SLOW_MS");
    long ms = slow != NULL ? strtol(slow, NULL, 10) : 0;
    if (ms > 0)
        nanosleep(&(struct timespec){.tv_sec = ms / 1000, .tv_nsec = ms % 1000 * 1000000L}, NULL);
}

/* One sample per process that got SM time in the sample periods ending after last_seen (0: all
 * the fake keeps), its share averaged over them and stamped with its latest one's end
 * (fake_state.h, fake_gpu_samples_since). FAKE_NVML_NO_PROCESS_UTIL=1: the query is not
 * supported, as on GPUs before Maxwell. */
EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                                    nvmlProcessUtilizationSample_t *samples,
                                                    unsigned int *count,
                                                    unsigned long long last_seen)
{
    const char *off = getenv("FAKE_NVML_NO_PROCESS_UTIL");
    if (off != NULL && off[0] != '\0' && strcmp(off, "0") != 0)
        return NVML_ERROR_NOT_SUPPORTED;
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (util_fails())
        return NVML_ERROR_UNKNOWN;
    if (util_not_found()) {
        *count = 0;
        return NVML_ERROR_NOT_FOUND;
    }
    answer_slowly();
    struct fake_gpu_sample got[MAX_PROCS];
    int n = fake_gpu_samples_since(device->index, last_seen, got, MAX_PROCS); /* <= MAX_PROCS */
    if (n == 0) {
        *count = 0;
        return NVML_ERROR_NOT_FOUND;
    }
    if (samples == NULL || *count < (unsigned int)n) {
        *count = (unsigned int)n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (int i = 0; i < n; i++)
        samples[i] = (nvmlProcessUtilizationSample_t){
            .pid = host_pid(got[i].pid), .timeStamp = got[i].end_us, .smUtil = got[i].sm_util};
    *count = (unsigned int)n;
    return NVML_SUCCESS;
}

/* gpu: percent of the latest completed sample period during which any work ran. */
EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *rates)
{
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || rates == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (util_fails() || util_not_found())
        return NVML_ERROR_UNKNOWN;
    uint64_t end_us;
    unsigned int pct;
    fake_gpu_period(device->index, &end_us, &pct);
    rates->gpu = pct > 100 ? 100 : pct;
    rates->memory = 0;
    return NVML_SUCCESS;
}

/* fake_nvml_inside_fn runs once inside the next call for the running processes (any version),
 * before its answer: a test's way to have a call land while one is inside NVML (a signal
 * handler's, found through dlsym: the library opens NVML itself). With fake_nvml_inside_tid
 * set, only inside a call of that thread: a handler never lands on the library's own threads,
 * which block signals (its footprint thread measures too). */
EXPORT void (*fake_nvml_inside_fn)(void);
EXPORT long fake_nvml_inside_tid;

/* Every live process with a context or memory on the device (fake_state.h), its footprint as
 * usedGpuMemory (no MIG). */
static nvmlReturn_t running_processes(nvmlDevice_t device, unsigned int *count,
                                      nvmlProcessInfo_t *infos)
{
    long tid = __atomic_load_n(&fake_nvml_inside_tid, __ATOMIC_ACQUIRE);
    void (*inside)(void) = tid != 0 && tid != (long)syscall(SYS_gettid)
                               ? NULL
                               : __atomic_exchange_n(&fake_nvml_inside_fn, NULL, __ATOMIC_ACQ_REL);
    if (inside != NULL)
        inside();
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* FAKE_NVML_PROCESSES_FAIL=1, read at every call: the list cannot be had. */
    const char *fails = getenv("FAKE_NVML_PROCESSES_FAIL");
    if (fails != NULL && strcmp(fails, "1") == 0)
        return NVML_ERROR_UNKNOWN;
    struct fake_gpu_process got[MAX_PROCS];
    int n = fake_gpu_processes(device->index, got, MAX_PROCS);
    if (n > MAX_PROCS)
        n = MAX_PROCS;
    if (*count < (unsigned int)n || (infos == NULL && n > 0)) {
        *count = (unsigned int)n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    /* FAKE_NVML_MEMORY_NA=1: a driver that lists processes but cannot say their memory. */
    const char *na = getenv("FAKE_NVML_MEMORY_NA");
    int unknown = na != NULL && strcmp(na, "1") == 0;
    for (int i = 0; i < n; i++)
        infos[i] = (nvmlProcessInfo_t){.pid = host_pid(got[i].pid),
                                       .usedGpuMemory = unknown ? (unsigned long long)NVML_VALUE_NOT_AVAILABLE
                                                                : got[i].bytes,
                                       .gpuInstanceId = 0xFFFFFFFFu,
                                       .computeInstanceId = 0xFFFFFFFFu};
    *count = (unsigned int)n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                            unsigned int *count,
                                                            nvmlProcessInfo_t *infos)
{
    return running_processes(device, count, infos);
}

/* The same struct as _v3 (nvmlProcessInfo_v2_t) in nvml.h. */
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device,
                                                            unsigned int *count,
                                                            nvmlProcessInfo_v2_t *infos)
{
    return running_processes(device, count, infos);
}
