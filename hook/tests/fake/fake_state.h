/* fake_state.h - test-only view into the fake libcuda.so.1 (read through dlopen(RTLD_NOLOAD)
 * or direct linking; names are not hooked, so dlsym passes them through). */
#ifndef FAKE_STATE_H
#define FAKE_STATE_H

#include <stdint.h>

enum fake_launch_variant {
    FAKE_LAUNCH = 0, FAKE_LAUNCH_PTSZ, FAKE_LAUNCH_EX, FAKE_LAUNCH_EX_PTSZ, FAKE_LAUNCH_COOP,
    FAKE_LAUNCH_COOP_PTSZ, FAKE_GRAPH, FAKE_GRAPH_PTSZ, FAKE_LAUNCH_VARIANTS
};

struct fake_cuda_stats {
    uint64_t launches[FAKE_LAUNCH_VARIANTS];
    uint64_t free_calls;    /* every free family, including refused ones */
    uint64_t async_ptsz_calls;
};

extern struct fake_cuda_stats fake_cuda_stats;
/* Name of the entry point whose next call fails with CUDA_ERROR_UNKNOWN ("" = none). */
extern char fake_cuda_fail_next[64];

uint64_t fake_cuda_device_used(int dev);        /* physical bytes held by this process */
uint64_t fake_cuda_device_total(int dev);
uint64_t fake_cuda_busy_ns(int dev);            /* GPU time consumed so far, up to now */
int fake_cuda_device_count(void);
void fake_cuda_uuid(int dev, unsigned char out[16]);
void *fake_cuda_entry(const char *name);        /* the fake's own function, never a wrapper */

#endif
