/* fake_state.h - test-only view into the fake libcuda.so.1 (read through dlopen(RTLD_NOLOAD)
 * or direct linking; names are not hooked, so dlsym passes them through). */
#ifndef FAKE_STATE_H
#define FAKE_STATE_H

#include <stdint.h>

/* The fake's most GPUs (FAKE_CUDA_DEVICES, FAKE_CUDA_UUIDS): more than the region's 16 device
 * records, so that a GPU past them can be tested. */
enum { FAKE_MAX_GPUS = 20 };

enum fake_launch_variant {
    FAKE_LAUNCH = 0, FAKE_LAUNCH_PTSZ, FAKE_LAUNCH_EX, FAKE_LAUNCH_EX_PTSZ, FAKE_LAUNCH_COOP,
    FAKE_LAUNCH_COOP_PTSZ, FAKE_GRAPH, FAKE_GRAPH_PTSZ,
    FAKE_LAUNCH_V1, FAKE_LAUNCH_GRID, FAKE_LAUNCH_GRID_ASYNC, FAKE_LAUNCH_MULTI_DEVICE, /* CUDA 2/9 */
    FAKE_LAUNCH_VARIANTS
};

struct fake_cuda_stats {
    uint64_t launches[FAKE_LAUNCH_VARIANTS];
    uint64_t free_calls;    /* every free family, including refused ones */
    uint64_t async_ptsz_calls;
    uint64_t graph_execs;   /* executable graphs alive */
    uint64_t pool_trims;    /* cuMemPoolTrimTo calls */
    uint64_t map_array_ptsz_calls; /* cuMemMapArrayAsync_ptsz calls */
    uint64_t memsets;       /* memsets of any export, refused ones included */
};

extern struct fake_cuda_stats fake_cuda_stats;
/* Name of the entry point whose next call fails with CUDA_ERROR_UNKNOWN ("" = none). */
extern char fake_cuda_fail_next[64];
/* Non-zero: cuStreamIsCapturing says every stream is being captured, and stream-ordered
 * allocations become graph allocations (an address, no memory; their frees free nothing; a
 * stream-ordered free of other memory is refused). */
extern int fake_cuda_capturing;
/* Set by a test: a pool serves nothing from its cache (as if fragmented); it grows instead. */
extern int fake_cuda_pool_fragmented;
/* Set by a test: cuDeviceGetMemPool answers another (empty, unknown) pool than the default one
 * that stream-ordered allocations on the default stream still come from. */
extern int fake_cuda_current_pool_other;
/* Set by a test (2-16): stream-ordered allocations name that many pools in turn, all the
 * device's one pool underneath (each answers for its whole cache). */
extern int fake_cuda_pool_aliases;
/* The local memory per thread cuFuncGetAttribute gives for any kernel (0 at first): a launch
 * of one that needs more than the stack holds raises the stack for every resident thread. */
extern uint64_t fake_cuda_local_bytes;
/* How often a conditional WHILE node's body runs at each launch of its graph (1 at first). */
extern unsigned fake_cuda_while_loops;
/* The capture id cuStreamGetCaptureInfo gives while fake_cuda_capturing (1 at first). */
extern uint64_t fake_cuda_capture_id;
/* Set by a test: the next launch of a graph whose allocations are mapped maps them anew, from
 * new memory (as the driver does when another graph's live allocation took them); cleared by
 * that launch. */
extern int fake_cuda_graph_remap;
/* fake_cuda_inside_fn runs once inside the next call of the entry point fake_cuda_inside names
 * (cuMemFree_v2: before it frees; cuPointerGetAttribute: after its answer is known;
 * cuMemAlloc_v2 and the other current-context allocations: after the memory is taken;
 * "cuCtxCreate", any version: once the context is made; cuDevicePrimaryCtxRetain: before it
 * looks at the primary context; "cuGraphInstantiate", any version: before it reads the
 * graph; "cuStreamGetCaptureInfo": after its answer, or cuStreamIsCapturing's;
 * cuGraphExecDestroy: before it destroys; "cuMemAllocAsync", any flavour: after the memory is
 * taken; "cuLaunchKernel", any launch: before the driver raises the stack; cuInit: once the
 * driver is up, before it returns; cuMemMap: once the mapping is made;
 * cuMemRetainAllocationHandle: once the reference is taken; cuCtxGetLimit: after its answer). */
extern char fake_cuda_inside[64];
extern void (*fake_cuda_inside_fn)(void);

/* A dev is a CUDA ordinal of the calling process; an nvml_index is a GPU's NVML index
 * (CUDA_VISIBLE_DEVICES picks and orders the GPUs behind the ordinals; FAKE_CUDA_UUIDS names
 * them).
 * Physical bytes held by the calling process on dev: its allocations + its context and lazy
 * module bytes (FAKE_CUDA_CONTEXT_MIB for its first context, FAKE_CUDA_CREATED_CONTEXT_MIB more
 * for each cuCtxCreate context, FAKE_CUDA_LAZY_MIB; all 0 by default). */
uint64_t fake_cuda_device_used(int dev);
uint64_t fake_cuda_device_physical_used(int nvml_index); /* on that GPU, every live process together */
uint64_t fake_cuda_device_total(int dev);
uint64_t fake_cuda_busy_ns(int dev);            /* GPU ns the calling process got so far */
uint64_t fake_cuda_device_busy_ns(int dev);     /* GPU ns during which any work ran, so far */
uint64_t fake_cuda_pending_ns(int dev, int pid); /* work pid has queued and not yet run */
/* Blocks an executable graph costs per launch (NULL: 100; unknown: UINT64_MAX). */
uint64_t fake_cuda_graph_exec_blocks(void *exec);
int fake_cuda_device_count(void);              /* GPUs, whatever CUDA_VISIBLE_DEVICES says */

/* The latest completed NVML sample period of GPU nvml_index (FAKE_NVML_SAMPLE_MS, default
 * 166 ms): its end as CLOCK_REALTIME microseconds (0: none yet) and the percent of it during
 * which any work ran. */
void fake_gpu_period(int nvml_index, uint64_t *end_us, unsigned int *device_pct);
/* NVML's per-process samples since since_us (CLOCK_REALTIME us; 0: all it keeps, the last
 * GPU_HISTORY periods), as nvml.h says nvmlDeviceGetProcessUtilization reads them: one a
 * running process that was attributed GPU time in a period ending after since_us, its share
 * averaged over the time from then (or the oldest such period's start, if later) to the newest
 * period's end, idle time included, stamped with the end of its latest. Returns how many it
 * wrote, max at most. */
struct fake_gpu_sample {
    int pid;
    unsigned int sm_util;   /* round(100 * busy_ns / the window) */
    uint64_t busy_ns;       /* its GPU time in the window, as NVML attributes it */
    uint64_t end_us;        /* the end of its latest period in the window */
};
int fake_gpu_samples_since(int nvml_index, uint64_t since_us, struct fake_gpu_sample *out,
                           int max);
/* The live processes with a context or memory on GPU nvml_index (up to max written; returns
 * how many there are). */
struct fake_gpu_process {
    int pid;
    uint64_t bytes;         /* context + lazy module + allocation bytes */
};
int fake_gpu_processes(int nvml_index, struct fake_gpu_process *out, int max);
void fake_cuda_uuid(int nvml_index, unsigned char out[16]);
void *fake_cuda_entry(const char *name);        /* the fake's own function, never a wrapper */

#endif
