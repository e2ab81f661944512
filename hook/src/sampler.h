/* sampler.h - what NVML says of a GPU's processes, read for the SM limiter on a thread of its
 * own. An NVML call may take long (hundreds of ms at times); made on the watcher's thread, it
 * stopped the refills, and every launch of a limited process waited through it: a tenant at 30
 * beside an unlimited one got 4.2-4.4 % of the fake GPU with each query taking 400 ms
 * (tests/run.sh, contention-30-none-slow-nvml). */
#ifndef VGPU_SAMPLER_H
#define VGPU_SAMPLER_H

#include <stdint.h>

#include "nvml.h"

/* One reading of a device (vgpu_nvml_container_util's, for the container's pids). */
struct vgpu_sample {
    enum vgpu_util what;         /* the container's answer */
    double util, own, sibling;   /* its figures (own: of self's pid, else of getpid()'s) */
    unsigned long long stamp_us; /* the newest sample's stamp */
    unsigned long long since_us; /* the time the shares are averaged from */
    unsigned long long read_us;  /* when NVML answered (CLOCK_REALTIME us) */
    int32_t self;                /* this process's host pid, 0: unknown */
    int pids_known;              /* the host pids of all the container's processes known then */
    enum vgpu_util device_what;  /* the whole GPU's utilisation, read where the container's may
                                  * not tell (VGPU_UTIL_UNKNOWN when not read) */
    double device_util;
};

/* Readings of the devices of `devices` (bit d: device d, d < 32), written to out[d]: the mask
 * of those that came in. A reading is asked for when none is under way; it is waited for up to
 * wait_ns, and one that takes longer comes in at a later call. Called by one thread (the
 * watcher). Where the sampler's thread cannot be made, the reading is made here. */
unsigned vgpu_sampler_collect(unsigned devices, struct vgpu_sample *out, uint64_t wait_ns);

/* In a forked child: no sampler thread, nothing under way. */
void vgpu_sampler_after_fork(void);

#endif
