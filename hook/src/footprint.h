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

/* Once, when the driver is loaded (also resets the state in a forked child). cache_of: what a
 * stream-ordered pool caches now (its reserved memory less its used memory; 0 when unknown). */
void vgpu_footprint_init(uint64_t (*cache_of)(uintptr_t pool));

/* Before the driver makes a context on dev, or retains the primary one. makes_one: NULL when
 * the driver always makes one (cuCtxCreate); else asked, when the process holds a context on
 * dev already, whether it makes one now (a retain of an active primary context does not),
 * before and again under the device's lock. reserve: the container's last measured context
 * size is reserved first (0: what the driver makes is far smaller, a green context beside an
 * active primary one; it is measured, and refused, after). -1: that size does not fit under
 * the cap (logged); the caller answers CUDA_ERROR_OUT_OF_MEMORY. */
int vgpu_footprint_before_context(int dev, int (*makes_one)(int dev), int reserve,
                                  struct vgpu_context_probe *p);

/* After it (created: whether the driver made it). -1: a context made now does not fit under
 * the cap (logged); the caller destroys it and answers CUDA_ERROR_OUT_OF_MEMORY. */
int vgpu_footprint_after_context(struct vgpu_context_probe *p, int created);

/* After a retain that vgpu_footprint_before_context let through as making nothing, when the
 * process has no context on dev after all (the last release ran meanwhile, and the retain made
 * the primary context anew): counted from now on, as measured. */
void vgpu_footprint_context_unseen(int dev);

/* After a context on dev (-1: a device not known) was released or destroyed: counts what is
 * left. */
void vgpu_footprint_context_gone(int dev);

/* A created context (cuCtxCreate) ctx was kept on dev, and one was destroyed (before
 * vgpu_footprint_context_gone): while one is alive, NVML's unlisting of the host pid is not
 * taken for no context left. */
void vgpu_footprint_context_created(int dev, const void *ctx);
void vgpu_footprint_context_destroyed(const void *ctx);

/* Whether dev's primary context is active, as the driver says (cuda_context.c; active where it
 * cannot say): a release that left it active left a context. */
int vgpu_primary_context_active(int dev);

/* On the allocation path: re-measures a device with a context at most once a second (modules
 * load lazily, libraries allocate through paths that are not counted). */
void vgpu_footprint_refresh(int dev);

/* Before refusing an allocation on dev: what pools cache is checked (vgpu_footprint_pools_check)
 * and dev re-measured (at most every 100 ms), so memory the process gave back to the driver
 * since is not held against it. */
void vgpu_footprint_before_refusal(int dev);

/* Re-measures dev now (after a pool gave its cached memory back). */
void vgpu_footprint_remeasure(int dev);

/* A pool keeps what stream-ordered frees give back (up to its release threshold, until a
 * synchronisation; PyTorch's cudaMallocAsync backend keeps all of it), and NVML shows it. At
 * such a free of bytes from pool on dev they stay in the ledger, as that pool's cache, until
 * the pool or a measurement says otherwise: 1. 0 (dev never measured, a measurement or a
 * context creation under way, or KEPT_POOLS other pools' caches counted): the caller gives
 * them back. */
int vgpu_footprint_pool_kept(int dev, uintptr_t pool, uint64_t bytes);

/* What stream-ordered frees left counted on dev, all pools (0: nothing to take or check). */
uint64_t vgpu_footprint_pooled(int dev);

/* Before a stream-ordered allocation of bytes on dev that pool can serve from its cache: moves
 * up to that much of what frees left counted for pool over to the allocation, and returns it
 * (the caller reserves only the rest). */
uint64_t vgpu_footprint_pool_take(int dev, uintptr_t pool, uint64_t bytes);

/* What vgpu_footprint_pool_take moved goes back (the driver refused the allocation, or served
 * it from new memory). */
void vgpu_footprint_pool_put_back(int dev, uintptr_t pool, uint64_t bytes);

/* What each pool's count on dev holds beyond what that pool caches now (a synchronisation
 * released it, or a trim) is given back. */
void vgpu_footprint_pools_check(int dev);

/* After a driver call on dev that makes the driver hold memory no allocation shows (a graph
 * launch mapping its allocations, a raised context limit), for which `reserved` bytes were
 * reserved: it grew what the process holds by `grew`. Those stay counted as the process's
 * footprint (measurements settle it from then on, a trim included); the rest of the
 * reservation goes back, and growth past it is charged past the cap (the memory is held
 * already; further allocations are refused). */
void vgpu_footprint_grew(int dev, uint64_t reserved, uint64_t grew);

#endif
