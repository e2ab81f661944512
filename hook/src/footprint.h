/* footprint.h - context and driver memory counted against the cap, as NVML measures it. */
#ifndef VGPU_FOOTPRINT_H
#define VGPU_FOOTPRINT_H

#include <stdint.h>

#include "nvml.h"

/* State carried across one context creation (before: lists NVML's pids and reserves the
 * container's estimate; after: learns the host pid and charges what the context holds). */
struct vgpu_context_probe {
    int dev;
    int active;       /* the device's footprint lock is held between the two calls */
    int ledger;       /* dev is capped: what the context holds is charged */
    int first;        /* this process had no context on dev yet */
    int fresh;        /* the driver makes a context now (not a retain of one held) */
    int discovering;  /* host pid unknown: the discovery lock is held, before[] is filled */
    int nbefore;
    uint64_t estimate;
    struct vgpu_gpu_process before[VGPU_NVML_MAX_PROCESSES];
};

/* Around an allocation on dev while this process's host pid is unknown: learn_before answers 1
 * when this one is tried (one at a time, NVML listed; tries back off from once a second), and
 * learn_after then takes the bytes allocated, or 0 when the driver allocated nothing (with
 * retry_soon, that does not count as a try). */
int vgpu_footprint_learn_before(int dev, uint64_t bytes);
void vgpu_footprint_learn_after(uint64_t allocated, int retry_soon);

/* Once, when the driver is loaded (also resets the state in a forked child). */
void vgpu_footprint_init(void);

/* Before the driver makes a context on dev, or retains the primary one (fresh: whether the
 * driver makes one now; a retain of a primary context already active does not). -1: the
 * container's last measured context size does not fit under the cap (logged); the caller
 * answers CUDA_ERROR_OUT_OF_MEMORY. */
int vgpu_footprint_before_context(int dev, int fresh, struct vgpu_context_probe *p);

/* After it (created: whether the driver made it). -1: a context made now does not fit under
 * the cap (logged); the caller destroys it and answers CUDA_ERROR_OUT_OF_MEMORY. */
int vgpu_footprint_after_context(struct vgpu_context_probe *p, int created);

/* After a context on dev (-1: a device not known) was released or destroyed: counts what is
 * left. */
void vgpu_footprint_context_gone(int dev);

/* On the allocation path: re-measures a device with a context at most once a second (modules
 * load lazily, libraries allocate through paths that are not counted). */
void vgpu_footprint_refresh(int dev);

/* Before refusing an allocation on dev: re-measures (at most every 100 ms), so memory the
 * process gave back to the driver since is not held against it. */
void vgpu_footprint_before_refusal(int dev);

/* Re-measures dev now (after a pool gave its cached memory back). */
void vgpu_footprint_remeasure(int dev);

/* A pool keeps what stream-ordered frees give back (up to its release threshold, until a
 * synchronisation; PyTorch's cudaMallocAsync backend keeps all of it), and NVML shows it. At
 * such a free of bytes on dev they stay in the ledger, as memory the process holds beyond its
 * allocations, until a measurement says otherwise: 1. 0 (dev never measured, or a measurement
 * under way): the caller gives them back. */
int vgpu_footprint_pool_kept(int dev, uint64_t bytes);

/* What stream-ordered frees left counted on dev (0: nothing to take). */
uint64_t vgpu_footprint_pooled(int dev);

/* Before a stream-ordered allocation of bytes on dev that its pool may serve from the cached
 * bytes it holds: moves up to that much of what frees left counted over to the allocation and
 * returns it (the caller reserves only the rest). */
uint64_t vgpu_footprint_pool_take(int dev, uint64_t bytes, uint64_t cached);

/* What vgpu_footprint_pool_take moved goes back (the driver refused the allocation). */
void vgpu_footprint_pool_put_back(int dev, uint64_t bytes);

/* dev's pool caches no more than cached now (a synchronisation released what passed its
 * release threshold, or it was trimmed): what frees left counted beyond that is given back. */
void vgpu_footprint_pool_holds(int dev, uint64_t cached);

#endif
