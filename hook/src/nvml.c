/* nvml.c - NVML wrappers: nvmlDeviceGetMemoryInfo (v1, v2) report the cap and the container's
 * usage, so nvidia-smi inside the container shows the cap; plus the utilisation probe. */
#define _GNU_SOURCE
#define NVML_NO_UNVERSIONED_FUNC_DEFS /* nvmlInit, the first ABI, is wrapped beside nvmlInit_v2 */
#include "nvml.h"

#include <nvml.h>
#include <pthread.h>
#include <stdlib.h>

#include "devices.h"
#include "loader.h"
#include "log.h"
#include "region.h"
#include "util.h"

#define VGPU_EXPORT __attribute__((visibility("default")))

static struct {
    nvmlReturn_t (*GetMemoryInfo)(nvmlDevice_t, nvmlMemory_t *);
    nvmlReturn_t (*GetMemoryInfo_v2)(nvmlDevice_t, nvmlMemory_v2_t *);
    nvmlReturn_t (*Init_v2)(void);
    nvmlReturn_t (*Init)(void);
    nvmlReturn_t (*InitWithFlags)(unsigned int);
    nvmlReturn_t (*Shutdown)(void);
    nvmlReturn_t (*GetHandleByIndex_v2)(unsigned int, nvmlDevice_t *);
    nvmlReturn_t (*GetHandleByUUID)(const char *, nvmlDevice_t *);
    nvmlReturn_t (*GetUUID)(nvmlDevice_t, char *, unsigned int);
    nvmlReturn_t (*GetIndex)(nvmlDevice_t, unsigned int *);
    nvmlReturn_t (*GetProcessUtilization)(nvmlDevice_t, nvmlProcessUtilizationSample_t *,
                                          unsigned int *, unsigned long long);
    nvmlReturn_t (*GetUtilizationRates)(nvmlDevice_t, nvmlUtilization_t *);
    nvmlReturn_t (*GetComputeRunningProcesses_v3)(nvmlDevice_t, unsigned int *,
                                                  nvmlProcessInfo_t *);
    nvmlReturn_t (*GetComputeRunningProcesses_v2)(nvmlDevice_t, unsigned int *,
                                                  nvmlProcessInfo_t *);
} real;

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory);
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory);
VGPU_EXPORT nvmlReturn_t nvmlInit_v2(void);
VGPU_EXPORT nvmlReturn_t nvmlInit(void);
VGPU_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags);
VGPU_EXPORT nvmlReturn_t nvmlShutdown(void);

static const struct vgpu_hook hooks[] = {
    {.name = "nvmlDeviceGetMemoryInfo", .wrapper = (void *)nvmlDeviceGetMemoryInfo,
     .real = (void **)&real.GetMemoryInfo},
    {.name = "nvmlDeviceGetMemoryInfo_v2", .wrapper = (void *)nvmlDeviceGetMemoryInfo_v2,
     .real = (void **)&real.GetMemoryInfo_v2},
    {.name = "nvmlInit_v2", .wrapper = (void *)nvmlInit_v2, .real = (void **)&real.Init_v2},
    {.name = "nvmlInit", .wrapper = (void *)nvmlInit, .real = (void **)&real.Init},
    {.name = "nvmlInitWithFlags", .wrapper = (void *)nvmlInitWithFlags,
     .real = (void **)&real.InitWithFlags},
    {.name = "nvmlShutdown", .wrapper = (void *)nvmlShutdown, .real = (void **)&real.Shutdown},
    {.name = "nvmlDeviceGetHandleByIndex_v2", .real = (void **)&real.GetHandleByIndex_v2},
    {.name = "nvmlDeviceGetHandleByUUID", .real = (void **)&real.GetHandleByUUID},
    {.name = "nvmlDeviceGetUUID", .real = (void **)&real.GetUUID},
    {.name = "nvmlDeviceGetIndex", .real = (void **)&real.GetIndex},
    {.name = "nvmlDeviceGetProcessUtilization", .real = (void **)&real.GetProcessUtilization},
    {.name = "nvmlDeviceGetUtilizationRates", .real = (void **)&real.GetUtilizationRates},
    {.name = "nvmlDeviceGetComputeRunningProcesses_v3",
     .real = (void **)&real.GetComputeRunningProcesses_v3},
    {.name = "nvmlDeviceGetComputeRunningProcesses_v2",
     .real = (void **)&real.GetComputeRunningProcesses_v2},
};

struct vgpu_hook_lib vgpu_nvml_lib = {
    .soname = "libnvidia-ml.so.1",
    .hooks = hooks,
    .count = sizeof hooks / sizeof hooks[0],
};

/* The region record of an NVML device: by its UUID (devices.h); a GPU the settings file does
 * not name has none (its figures are the driver's); else NVML's own index. */
static int record_of(nvmlDevice_t device)
{
    char uuid[96];
    if (real.GetUUID != NULL && real.GetUUID(device, uuid, sizeof uuid) == NVML_SUCCESS) {
        int record = vgpu_device_record_of_uuid(uuid);
        if (record != VGPU_DEVICE_NO_LIST)
            return record;
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
    int record = record_of(device);
    uint64_t cap = vgpu_region_record_limit(record);
    if (cap == 0)
        return 0;
    if (cap < *total)
        *total = cap;
    uint64_t container = vgpu_region_record_in_use(record);
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

/* NVML counts its inits, and the library holds one of its own (the limiter's and the
 * footprint's readings): an application's nvmlShutdown past its own inits would drop that one,
 * and every later reading would fail, the SM limit with them (an adversarial review, 2026-11-30:
 * 94 % of the GPU under a limit of 25). So the application's inits are counted, and a shutdown
 * past them answers as NVML does to a process that holds none. */
static int app_inits;        /* atomic */
static __thread int initing; /* inside one of the init wrappers: an NVML whose nvmlInit called
                              * its exported nvmlInit_v2 would be counted twice */

enum init_abi { INIT_V2, INIT_V1, INIT_WITH_FLAGS };

/* One of the application's inits, through NVML's of that ABI (flags: nvmlInitWithFlags'). */
static nvmlReturn_t counted_init(enum init_abi abi, unsigned int flags)
{
    vgpu_lib_ensure(&vgpu_nvml_lib);
    nvmlReturn_t (*init)(void) = abi == INIT_V2 ? real.Init_v2 : abi == INIT_V1 ? real.Init : NULL;
    if (init == NULL && (abi != INIT_WITH_FLAGS || real.InitWithFlags == NULL))
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    int outer = !initing;
    initing = 1;
    nvmlReturn_t rc = init != NULL ? init() : real.InitWithFlags(flags);
    if (outer) {
        initing = 0;
        if (rc == NVML_SUCCESS)
            __atomic_add_fetch(&app_inits, 1, __ATOMIC_ACQ_REL);
    }
    return rc;
}

VGPU_EXPORT nvmlReturn_t nvmlInit_v2(void) { return counted_init(INIT_V2, 0); }

VGPU_EXPORT nvmlReturn_t nvmlInit(void) { return counted_init(INIT_V1, 0); }

VGPU_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    return counted_init(INIT_WITH_FLAGS, flags);
}

VGPU_EXPORT nvmlReturn_t nvmlShutdown(void)
{
    vgpu_lib_ensure(&vgpu_nvml_lib);
    if (real.Shutdown == NULL)
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    int inits = __atomic_load_n(&app_inits, __ATOMIC_ACQUIRE);
    do {
        if (inits <= 0)
            return NVML_ERROR_UNINITIALIZED;
    } while (!__atomic_compare_exchange_n(&app_inits, &inits, inits - 1, 0, __ATOMIC_ACQ_REL,
                                          __ATOMIC_ACQUIRE));
    nvmlReturn_t rc = real.Shutdown();
    if (rc != NVML_SUCCESS)
        __atomic_add_fetch(&app_inits, 1, __ATOMIC_ACQ_REL);
    return rc;
}

static int nvml_ready;

/* The library's own reference: not the application's to count, nor to drop. */
static void init_nvml(void)
{
    initing = 1;
    nvml_ready = real.Init_v2 != NULL && real.Init_v2() == NVML_SUCCESS;
    initing = 0;
}

/* The NVML handle of CUDA device dev: by the UUID CUDA recorded, else by the same index.
 * Called from the limiter's watcher thread and from allocating threads. */
static int handle_for(int dev, nvmlDevice_t *device)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    vgpu_lib_ensure(&vgpu_nvml_lib);
    pthread_once(&once, init_nvml);
    if (!nvml_ready || dev < 0 || dev >= VGPU_REGION_MAX_DEVICES)
        return -1;
    char uuid[VGPU_REGION_UUID_BYTES];
    if (vgpu_region_uuid(dev, uuid, sizeof uuid) == 0 && real.GetHandleByUUID != NULL &&
        real.GetHandleByUUID(uuid, device) == NVML_SUCCESS)
        return 0;
    if (real.GetHandleByIndex_v2 != NULL &&
        real.GetHandleByIndex_v2((unsigned int)dev, device) == NVML_SUCCESS)
        return 0;
    return -1;
}

int vgpu_nvml_processes(int dev, struct vgpu_gpu_process *out, int max)
{
    nvmlDevice_t device;
    if (handle_for(dev, &device) != 0)
        return -1;
    nvmlReturn_t (*list)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *) =
        real.GetComputeRunningProcesses_v3 != NULL ? real.GetComputeRunningProcesses_v3
                                                   : real.GetComputeRunningProcesses_v2;
    if (list == NULL || max <= 0)
        return -1;
    nvmlProcessInfo_t infos[VGPU_NVML_MAX_PROCESSES];
    unsigned int count = (unsigned int)(max < VGPU_NVML_MAX_PROCESSES ? max
                                                                      : VGPU_NVML_MAX_PROCESSES);
    nvmlReturn_t rc = list(device, &count, infos);
    if (rc != NVML_SUCCESS)
        return -1; /* more processes than we can hold is as unknown as an error */
    for (unsigned int i = 0; i < count; i++)
        out[i] = (struct vgpu_gpu_process){
            .pid = (int32_t)infos[i].pid,
            /* NVML_VALUE_NOT_AVAILABLE (all ones) where the driver cannot say */
            .bytes = infos[i].usedGpuMemory == (unsigned long long)NVML_VALUE_NOT_AVAILABLE
                         ? VGPU_NVML_BYTES_UNKNOWN : infos[i].usedGpuMemory,
        };
    return (int)count;
}

/* GPUs without per-process samples: the whole device's rate, other tenants included. */
static enum vgpu_util whole_device(nvmlDevice_t device, double *util)
{
    nvmlUtilization_t rates;
    if (real.GetUtilizationRates == NULL ||
        real.GetUtilizationRates(device, &rates) != NVML_SUCCESS)
        return VGPU_UTIL_UNKNOWN;
    *util = rates.gpu;
    return VGPU_UTIL_WHOLE_DEVICE;
}

enum vgpu_util vgpu_nvml_device_util(int dev, double *util)
{
    nvmlDevice_t device;
    return handle_for(dev, &device) == 0 ? whole_device(device, util) : VGPU_UTIL_UNKNOWN;
}

/* NVML's shortest sample period (1/6 s; its longest is 1 s), in us: after a NOT_FOUND, a
 * sample published up to this late, or stamped by a clock up to this far behind ours, is
 * still read. (The time asked is then not a period's start: a reading's span, taken from it,
 * may leave out up to a period.) */
static const unsigned long long idle_margin_us = 166667;

/* NVML answers one sample per process: its SM share averaged over the sample periods (about
 * 1/6 s each) since last_seen, stamped with its latest one's end (nvml.h: "utilization since
 * the previous query"; since 0, every period the driver keeps). Asked since the newest stamp
 * seen, every control period, that is the latest period; NVML_ERROR_NOT_FOUND until one with
 * work ends. Never since 0: the first query asks since the moment it is called (the watcher's
 * first reading, at the process's first launch; NVML's start, in this call or earlier, comes
 * after); after a NOT_FOUND, the next asks since a short period before that call (below), not
 * since the last sample, which may be long before. A process's share over every
 * period the driver keeps is not its share now: short-lived processes one after another, each
 * reading its first share averaged over the fake's 21 s of periods, ran 31.6-52.9 % of the
 * fake GPU's time under a limit of 20 in 4 runs (tests/test_contention.c, chain). The sum over
 * our pids is the container's share; pids of other tenants never count against it (the GPU
 * time-slices their contexts). */
enum vgpu_util vgpu_nvml_container_util(int dev, const int32_t *pids, int npids, int32_t self,
                                        double *util, double *own, double *sibling,
                                        unsigned long long *stamp_us,
                                        unsigned long long *since_us)
{
    static unsigned long long last_seen[VGPU_REGION_MAX_DEVICES];
    unsigned long long called_us = unix_ns() / 1000u; /* before NVML's start, which may be slow */
    nvmlDevice_t device;
    if (handle_for(dev, &device) != 0)
        return VGPU_UTIL_UNKNOWN;
    if (real.GetProcessUtilization == NULL)
        return whole_device(device, util);
    if (last_seen[dev] == 0)
        last_seen[dev] = called_us;
    /* 32 KiB, not on a stack that may be an application thread's; one caller at a time, as
     * for last_seen (the sampler's thread, or the limiter's without one). */
    static nvmlProcessUtilizationSample_t samples[VGPU_NVML_MAX_SAMPLES];
    unsigned int count = VGPU_NVML_MAX_SAMPLES;
    nvmlReturn_t rc = real.GetProcessUtilization(device, samples, &count, last_seen[dev]);
    if (rc == NVML_ERROR_NOT_FOUND) {
        /* No period with work has ended since last_seen: the next query asks since a period
         * before this one (a period stamped a little before its sample is out is not missed),
         * not since the last busy one. Else the first reading of a burst after idle time was
         * averaged over all of that time. */
        if (called_us > last_seen[dev] + idle_margin_us)
            last_seen[dev] = called_us - idle_margin_us;
        return VGPU_UTIL_NO_NEW_SAMPLE;
    }
    if (rc == NVML_ERROR_NOT_SUPPORTED || rc == NVML_ERROR_FUNCTION_NOT_FOUND)
        return whole_device(device, util);
    if (rc != NVML_SUCCESS)
        return VGPU_UTIL_UNKNOWN;
    unsigned long long seen = last_seen[dev];
    double total = 0, mine = 0, largest = 0;
    int ours = 0;
    for (unsigned int i = 0; i < count; i++) {
        if (samples[i].timeStamp > last_seen[dev])
            last_seen[dev] = samples[i].timeStamp;
    }
    /* One sample per pid (the latest), should a driver return several. */
    for (int p = 0; p < npids; p++) {
        const nvmlProcessUtilizationSample_t *latest = NULL;
        for (unsigned int i = 0; i < count; i++)
            if (samples[i].pid == (unsigned int)pids[p] && samples[i].timeStamp > seen &&
                (latest == NULL || samples[i].timeStamp > latest->timeStamp))
                latest = &samples[i];
        if (latest != NULL) {
            total += latest->smUtil;
            if (pids[p] == self)
                mine += latest->smUtil;
            else if (latest->smUtil > largest)
                largest = latest->smUtil;
            ours = 1;
        }
    }
    *util = total;
    *own = mine;
    *sibling = largest;
    *stamp_us = last_seen[dev];
    *since_us = seen;
    return ours ? VGPU_UTIL_OURS : VGPU_UTIL_OTHERS_ONLY;
}
