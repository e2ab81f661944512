/* nvml.h - NVML wrappers (memory reporting), and what the limiter and the footprint ask NVML:
 * per-process SM samples and per-process device memory. */
#ifndef VGPU_NVML_INTERNAL_H
#define VGPU_NVML_INTERNAL_H

#include <stdint.h>

enum {
    VGPU_NVML_MAX_PROCESSES = 256, /* the process lists asked (memory: the footprint) */
    VGPU_NVML_MAX_SAMPLES = 1024,  /* utilisation samples asked: a container may have as many
                                    * processes as the region has slots */
};

enum vgpu_util {
    VGPU_UTIL_OURS,          /* a new sample period in which our pids ran: *util is our share */
    VGPU_UTIL_OTHERS_ONLY,   /* a new period in which only other pids ran (*util = 0) */
    VGPU_UTIL_NO_NEW_SAMPLE, /* no period with work has ended since the previous call */
    VGPU_UTIL_WHOLE_DEVICE,  /* no per-process samples on this GPU: *util is the device's rate */
    VGPU_UTIL_UNKNOWN,       /* NVML cannot tell */
};

/* The SM share (percent) of CUDA device dev taken by the given pids in the sample period(s)
 * ended since the newest sample the previous calls saw (or a short period before the last
 * call that found none), and (OURS, OTHERS_ONLY) the share of pid self among them
 * (*own), the largest share of one of the other pids (*sibling), the end of the newest
 * period as NVML stamps it and the time the shares are averaged from (*since_us: the time
 * asked; both CLOCK_REALTIME us). Called by one thread at a time (the limiter's sampler,
 * sampler.h). */
enum vgpu_util vgpu_nvml_container_util(int dev, const int32_t *pids, int npids, int32_t self,
                                        double *util, double *own, double *sibling,
                                        unsigned long long *stamp_us,
                                        unsigned long long *since_us);

/* The whole device's utilisation (percent) over NVML's latest sample period, every tenant's
 * work included: VGPU_UTIL_WHOLE_DEVICE, or VGPU_UTIL_UNKNOWN. */
enum vgpu_util vgpu_nvml_device_util(int dev, double *util);

struct vgpu_gpu_process {
    int32_t pid;    /* as NVML sees it: the host's pid namespace */
    uint64_t bytes; /* device memory it holds: contexts, modules, allocations; or: */
};
static const uint64_t VGPU_NVML_BYTES_UNKNOWN = UINT64_MAX; /* the driver cannot say */

/* The compute processes NVML lists on CUDA device dev (at most max, up to
 * VGPU_NVML_MAX_PROCESSES); their count, or -1 when NVML cannot say. */
int vgpu_nvml_processes(int dev, struct vgpu_gpu_process *out, int max);

#endif
