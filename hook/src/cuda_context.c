/* cuda_context.c - contexts made and destroyed: a new context's memory is counted (footprint.c),
 * a destroyed one's allocations are given back. */
#define _GNU_SOURCE
#include <unistd.h>

#include "cuda_driver.h"
#include "devices.h"
#include "footprint.h"
#include "log.h"
#include "memory.h"
#include "region.h"
#include "throttle.h"
#include "util.h"

/* A destroyed context's memory is freed by the driver without a free call (cudaDeviceReset,
 * the last release of a primary context, cuCtxDestroy): the pointers the driver no longer knows
 * are given back, or the cap would shrink by them for the rest of the process (stream-ordered
 * and cuMemCreate memory is no context's, cuda.h says: it stays, and the driver says so). Only
 * pointers are asked about: the driver answers for any address, while a destroyed array or
 * handle may not be passed to it again (arrays go by their context, arrays_gone below; handles
 * stay counted until their value comes back). */
static enum vgpu_held pointer_held(uint64_t key)
{
    unsigned int type;
    CUresult rc = vgpu_pointer_attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)key);
    /* cuda.h: INVALID_VALUE when ptr was not allocated by (or registered with) a context. */
    if (rc == CUDA_SUCCESS)
        return VGPU_HELD_YES;
    return rc == CUDA_ERROR_INVALID_VALUE ? VGPU_HELD_GONE : VGPU_HELD_UNKNOWN;
}

/* After cudaDeviceReset the calling thread's current context is a primary context not made
 * again yet, and calls that need one answer CUDA_ERROR_CONTEXT_IS_DESTROYED (cuda.h): the
 * pointers are asked about with no current context (a UVA pointer needs none), and the
 * thread's context is put back after. */
static void context_gone(int dev)
{
    CUdevice any;
    CUcontext destroyed = NULL;
    int swapped = real.cuCtxGetDevice != NULL && real.cuCtxGetCurrent != NULL &&
                  real.cuCtxSetCurrent != NULL &&
                  real.cuCtxGetDevice(&any) == CUDA_ERROR_CONTEXT_IS_DESTROYED &&
                  real.cuCtxGetCurrent(&destroyed) == CUDA_SUCCESS &&
                  real.cuCtxSetCurrent(NULL) == CUDA_SUCCESS;
    size_t unanswered;
    uint64_t bytes = vgpu_mem_forget_gone(VGPU_KIND_POINTER, dev, pointer_held, &unanswered);
    if (swapped && real.cuCtxSetCurrent(destroyed) != CUDA_SUCCESS)
        vgpu_log(VGPU_LOG_ERROR, "could not make the destroyed context current again after "
                 "checking allocations; this thread now has no current context");
    if (bytes != 0)
        vgpu_log(VGPU_LOG_INFO, "a destroyed context freed %llu bytes of counted allocations",
                 (unsigned long long)bytes);
    if (unanswered != 0)
        vgpu_log(VGPU_LOG_WARN, "after a context was destroyed the driver could not say whether "
                 "%zu counted allocations still exist: they stay counted", unanswered);
    vgpu_footprint_context_gone(dev);
}

/* Each device's primary context, as its retains answer (the handle its arrays are owned by).
 * Never cleared at the last release: a retain racing it may answer the same handle, and most
 * programs retain once. */
static CUcontext primary_of[VGPU_REGION_MAX_DEVICES];

int vgpu_primary_context_current(int dev)
{
    CUcontext current = NULL;
    return dev >= 0 && dev < VGPU_REGION_MAX_DEVICES && real.cuCtxGetCurrent != NULL &&
           real.cuCtxGetCurrent(&current) == CUDA_SUCCESS && current != NULL &&
           current == __atomic_load_n(&primary_of[dev], __ATOMIC_ACQUIRE);
}

int vgpu_primary_device_of(CUcontext ctx)
{
    for (int dev = 0; ctx != NULL && dev < VGPU_REGION_MAX_DEVICES; dev++)
        if (ctx == __atomic_load_n(&primary_of[dev], __ATOMIC_ACQUIRE))
            return dev;
    return -1;
}

/* Before the calling thread's current context changes (cuCtxSetCurrent, a push or a pop), and
 * when a stream is made (cuda_sync.c): a context other than a primary one the library knows
 * may have had work launched in it (or on its stream, by any thread, later), which the limiter
 * charged to its device as if to the primary one there (launch_device_on); with the primary
 * current its synchronisation would not cover that work. So its device drains no more
 * (vgpu_throttle_context_made), as where the library saw such a context made: this catches
 * one made through an export the library does not know. (A context made current the same
 * unknown way, and left by a call the library does not see, with no stream made in it
 * meanwhile, is not caught.) */
void vgpu_other_context_current(void)
{
    CUdevice dev;
    if (vgpu_throttle_enabled && vgpu_unknown_context_current() == 1 &&
        real.cuCtxGetDevice != NULL && real.cuCtxGetDevice(&dev) == CUDA_SUCCESS)
        vgpu_throttle_context_made((int)dev);
}

int vgpu_unknown_context_current(void)
{
    CUcontext current = NULL;
    if (real.cuCtxGetCurrent == NULL || real.cuCtxGetCurrent(&current) != CUDA_SUCCESS)
        return -1;
    return current != NULL && vgpu_primary_device_of(current) < 0;
}

VGPU_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    if (!ready() || real.cuCtxSetCurrent == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    vgpu_other_context_current();
    return real.cuCtxSetCurrent(ctx);
}

/* A push through *push (CUDA 4.0's export or 2.0's, cuda_v1.h). */
static CUresult push(CUresult (*const *push)(CUcontext), CUcontext ctx)
{
    if (!ready() || *push == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    vgpu_other_context_current();
    return (*push)(ctx);
}

/* A pop through *pop, as push. */
static CUresult pop(CUresult (*const *pop)(CUcontext *), CUcontext *ctx)
{
    if (!ready() || *pop == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    vgpu_other_context_current();
    return (*pop)(ctx);
}

VGPU_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    return push(&real.cuCtxPushCurrent_v2, ctx);
}

VGPU_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *ctx)
{
    return pop(&real.cuCtxPopCurrent_v2, ctx);
}

VGPU_EXPORT CUresult cuCtxPushCurrent(CUcontext ctx)
{
    return push(&real.cuCtxPushCurrent, ctx);
}

VGPU_EXPORT CUresult cuCtxPopCurrent(CUcontext *ctx)
{
    return pop(&real.cuCtxPopCurrent, ctx);
}

/* A context's arrays are freed with it (cuda.h, cuCtxDestroy: its CUarray and CUmipmappedArray
 * among "all resources associated with the context") and may not be passed to the driver again:
 * they are forgotten by the context they were made in, those recorded up to `before`, taken
 * before the driver's call (another thread may make the context anew, or get its handle for
 * another, and make arrays in it meanwhile). A green context's are not: whether its end frees
 * them is not known (they stay counted, no context's). */
static void arrays_gone(const void *owner, uint64_t before)
{
    uint64_t bytes = vgpu_mem_forget_owned(VGPU_KIND_ARRAY, owner, before);
    if (bytes != 0)
        vgpu_log(VGPU_LOG_INFO, "a destroyed context's arrays gave %llu bytes back",
                 (unsigned long long)bytes);
}

/* dev's primary context ended (a reset, or its last release), before: as arrays_gone. What it
 * held is given back, then measured again (context_gone) where the caller has not yet. */
static void primary_ended(int dev, uint64_t before)
{
    vgpu_stack_primary_gone(dev);
    if (dev >= 0 && dev < VGPU_REGION_MAX_DEVICES)
        arrays_gone(__atomic_load_n(&primary_of[dev], __ATOMIC_ACQUIRE), before);
}

static void primary_gone(int dev, uint64_t before)
{
    primary_ended(dev, before);
    context_gone(dev);
}

/* A context made at the same moment as another container's leaves the host pid unknown (two
 * new pids in NVML's list). It is then asked at once with an allocation of the library's own,
 * made and freed in the new context (no work in it yet), of a size two processes rarely pick
 * at the same moment (4-60 MiB in 2 MiB steps, from the clock and the pid), in relaxed capture
 * mode so that another thread's stream capture is not broken; the application's plain and
 * cuMemCreate allocations are tried too (alloc_pointer, cuMemCreate). */
static void probe_host_pid(CUcontext ctx, int dev)
{
    if (ctx == NULL || vgpu_region_host_pid() != 0 || real.cuCtxPushCurrent_v2 == NULL ||
        real.cuCtxPopCurrent_v2 == NULL || real.cuMemAlloc_v2 == NULL ||
        real.cuMemFree_v2 == NULL || real.cuThreadExchangeStreamCaptureMode == NULL)
        return;
    uint64_t spread = (monotonic_ns() >> 10) ^ ((uint64_t)getpid() * UINT64_C(2654435761));
    uint64_t bytes = (2 + spread % 29) << 21;
    if (!vgpu_footprint_learn_before(dev, bytes))
        return;
    CUresult rc = CUDA_ERROR_OUT_OF_MEMORY;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    CUcontext popped;
    CUdeviceptr ptr = 0;
    /* Counted while it lives, like any allocation; no room under the cap: not tried. */
    if (vgpu_region_reserve(dev, bytes) == 0) {
        vgpu_mem_op_begin();
        if (real.cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS) {
            if (real.cuCtxPushCurrent_v2(ctx) == CUDA_SUCCESS) {
                rc = real.cuMemAlloc_v2(&ptr, bytes);
                if (rc == CUDA_SUCCESS) {
                    vgpu_footprint_learn_after(bytes, 0);
                    if (real.cuMemFree_v2(ptr) != CUDA_SUCCESS)
                        vgpu_log(VGPU_LOG_ERROR, "could not free the %llu bytes allocated to "
                                 "learn the host pid", (unsigned long long)bytes);
                }
                real.cuCtxPopCurrent_v2(&popped);
            }
            real.cuThreadExchangeStreamCaptureMode(&mode);
        }
        vgpu_mem_op_end();
        vgpu_region_release(dev, bytes);
    }
    if (rc != CUDA_SUCCESS) /* the application's next allocation may try at once */
        vgpu_footprint_learn_after(0, 1);
}

/* Whether dev's primary context is active: a retain then makes nothing, and a release that
 * leaves it active frees nothing (the last one resets it, cuda.h). Active when the driver
 * cannot say. */
static int primary_active(CUdevice dev)
{
    unsigned int flags;
    int active = 0;
    return real.cuDevicePrimaryCtxGetState == NULL ||
           real.cuDevicePrimaryCtxGetState(dev, &flags, &active) != CUDA_SUCCESS || active;
}

/* A retain makes the primary context only while it is inactive. */
static int primary_inactive(int dev) { return !primary_active((CUdevice)dev); }

int vgpu_primary_context_active(int dev) { return primary_active((CUdevice)dev); }

/* Undoes a context that does not fit: destroyed, or the retain released. */
static void undo_context(enum vgpu_context_kind how, void *ctx, CUdevice dev)
{
    if (how == VGPU_CONTEXT_PRIMARY && real.cuDevicePrimaryCtxRelease_v2 != NULL)
        real.cuDevicePrimaryCtxRelease_v2(dev);
    else if (how == VGPU_CONTEXT_CREATED && real.cuCtxDestroy_v2 != NULL)
        real.cuCtxDestroy_v2((CUcontext)ctx);
    else if (how == VGPU_CONTEXT_GREEN && real.cuGreenCtxDestroy != NULL)
        real.cuGreenCtxDestroy((CUgreenCtx)ctx);
}

/* What the host-pid probe pushes and the stack's count knows a context by: a green context is
 * made current as the CUcontext cuCtxFromGreenCtx gives for it (NULL: none). */
static CUcontext as_context(enum vgpu_context_kind how, void *ctx)
{
    if (how != VGPU_CONTEXT_GREEN)
        return (CUcontext)ctx;
    CUcontext as = NULL;
    if (real.cuCtxFromGreenCtx == NULL ||
        real.cuCtxFromGreenCtx(&as, (CUgreenCtx)ctx) != CUDA_SUCCESS)
        return NULL;
    return as;
}

/* After the driver made (or failed to make) a context on dev, or retained the primary one
 * (ctx: what it made, a CUcontext, or a CUgreenCtx for VGPU_CONTEXT_GREEN): a context that
 * does not fit is undone and the caller gets CUDA_ERROR_OUT_OF_MEMORY. */
static CUresult keep_context(struct vgpu_context_probe *probe, CUresult rc, void *ctx,
                             CUdevice dev, enum vgpu_context_kind how)
{
    if (vgpu_footprint_after_context(probe, rc == CUDA_SUCCESS) != 0) {
        uint64_t before = vgpu_mem_recorded();
        undo_context(how, ctx, dev);
        /* Releasing the retain may have been the primary context's last release (another
         * thread released its own meanwhile), which frees that context's allocations. */
        if (how != VGPU_CONTEXT_CREATED && !primary_active(dev))
            primary_gone((int)dev, before);
        else
            vgpu_footprint_context_gone((int)dev);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (rc != CUDA_SUCCESS)
        return rc;
    CUcontext context = as_context(how, ctx);
    if (context != NULL)
        vgpu_stack_context_made(context, ctx, (int)dev, how);
    if (how == VGPU_CONTEXT_PRIMARY && dev >= 0 && dev < VGPU_REGION_MAX_DEVICES)
        __atomic_store_n(&primary_of[dev], context, __ATOMIC_RELEASE);
    if (how != VGPU_CONTEXT_PRIMARY)
        vgpu_throttle_context_made((int)dev);
    if (how == VGPU_CONTEXT_CREATED)
        vgpu_footprint_context_created((int)dev, ctx);
    if (probe->active && probe->first)
        probe_host_pid(context, (int)dev);
    else if (how == VGPU_CONTEXT_PRIMARY && !probe->active)
        vgpu_footprint_context_unseen((int)dev); /* raced the last release? */
    return rc;
}

/* Before the driver makes a context on dev (or may, for a retain: makes_one): none on a GPU not
 * assigned to the container (devices.h), and none that does not fit (footprint.c). reserves:
 * whether the container's context size is reserved first (NULL: always). */
static CUresult begin_context(CUdevice dev, int (*makes_one)(int dev), int (*reserves)(int dev),
                              struct vgpu_context_probe *probe)
{
    if (!vgpu_device_usable((int)dev))
        return CUDA_ERROR_NOT_PERMITTED;
    int reserve = reserves == NULL || reserves((int)dev);
    return vgpu_footprint_before_context((int)dev, makes_one, reserve, probe) == 0
               ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* The driver retains the primary context by reference: a retain while this process holds it
 * makes nothing new (footprint.c neither measures nor refuses then). */
VGPU_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev)
{
    if (!ready() || real.cuDevicePrimaryCtxRetain == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct vgpu_context_probe probe;
    CUresult begun = begin_context(dev, primary_inactive, NULL, &probe);
    if (begun != CUDA_SUCCESS)
        return begun;
    CUresult rc = real.cuDevicePrimaryCtxRetain(ctx, dev);
    return keep_context(&probe, rc, rc == CUDA_SUCCESS ? *ctx : NULL, dev, VGPU_CONTEXT_PRIMARY);
}

/* The primary context ends with a reset (cudaDeviceReset) and with its last release (cuda.h);
 * an earlier release frees nothing, but what the process holds there is measured again. */
static CUresult end_primary(CUresult (*const *call)(CUdevice), CUdevice dev, int reset)
{
    if (!ready() || *call == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    uint64_t before = vgpu_mem_recorded();
    vgpu_kernels_forget(); /* before its modules' handles are free: kernels.h */
    CUresult rc = (*call)(dev);
    if (rc == CUDA_SUCCESS && (reset || !primary_active(dev)))
        primary_gone((int)dev, before);
    else if (rc == CUDA_SUCCESS)
        vgpu_footprint_context_gone((int)dev);
    return rc;
}

VGPU_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    return end_primary(&real.cuDevicePrimaryCtxReset_v2, dev, 1);
}

/* CUDA 7.0's exports (cuda_v1.h), the same arguments. */
VGPU_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    return end_primary(&real.cuDevicePrimaryCtxReset, dev, 1);
}

VGPU_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    return end_primary(&real.cuDevicePrimaryCtxRelease_v2, dev, 0);
}

VGPU_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    return end_primary(&real.cuDevicePrimaryCtxRelease, dev, 0);
}

static CUresult create_context(CUresult (*const *create)(CUcontext *, unsigned int, CUdevice),
                               CUcontext *ctx, unsigned int flags, CUdevice dev)
{
    if (!ready() || *create == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct vgpu_context_probe probe;
    CUresult begun = begin_context(dev, NULL, NULL, &probe);
    if (begun != CUDA_SUCCESS)
        return begun;
    CUresult rc = (*create)(ctx, flags, dev);
    return keep_context(&probe, rc, rc == CUDA_SUCCESS ? *ctx : NULL, dev, VGPU_CONTEXT_CREATED);
}

VGPU_EXPORT CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice dev)
{
    return create_context(&real.cuCtxCreate_v2, ctx, flags, dev);
}

/* CUDA 2.0's export (cuda_v1.h), the same arguments. */
VGPU_EXPORT CUresult cuCtxCreate(CUcontext *ctx, unsigned int flags, CUdevice dev)
{
    return create_context(&real.cuCtxCreate, ctx, flags, dev);
}

VGPU_EXPORT CUresult cuCtxCreate_v3(CUcontext *ctx, CUexecAffinityParam *params, int count,
                                    unsigned int flags, CUdevice dev)
{
    if (!ready() || real.cuCtxCreate_v3 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct vgpu_context_probe probe;
    CUresult begun = begin_context(dev, NULL, NULL, &probe);
    if (begun != CUDA_SUCCESS)
        return begun;
    CUresult rc = real.cuCtxCreate_v3(ctx, params, count, flags, dev);
    return keep_context(&probe, rc, rc == CUDA_SUCCESS ? *ctx : NULL, dev, VGPU_CONTEXT_CREATED);
}

VGPU_EXPORT CUresult cuCtxCreate_v4(CUcontext *ctx, CUctxCreateParams *params, unsigned int flags,
                                    CUdevice dev)
{
    if (!ready() || real.cuCtxCreate_v4 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct vgpu_context_probe probe;
    CUresult begun = begin_context(dev, NULL, NULL, &probe);
    if (begun != CUDA_SUCCESS)
        return begun;
    CUresult rc = real.cuCtxCreate_v4(ctx, params, flags, dev);
    return keep_context(&probe, rc, rc == CUDA_SUCCESS ? *ctx : NULL, dev, VGPU_CONTEXT_CREATED);
}

/* A green context (CUDA 12.4) retains dev's primary context, which the driver makes when it is
 * inactive (cuda.h), and holds resources of its own: measured as a created context is, and
 * refused when it does not fit; the container's context size is reserved first only while the
 * primary context is inactive (beside an active one it would refuse green contexts that fit).
 * Made current through cuCtxFromGreenCtx, it is a context whose synchronisation does not wait
 * for the primary context's work (throttle.h). */
VGPU_EXPORT CUresult cuGreenCtxCreate(CUgreenCtx *ctx, CUdevResourceDesc desc, CUdevice dev,
                                      unsigned int flags)
{
    /* Without its destroy one that does not fit could not be undone. */
    if (!ready() || real.cuGreenCtxCreate == NULL || real.cuGreenCtxDestroy == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct vgpu_context_probe probe;
    CUresult begun = begin_context(dev, NULL, primary_inactive, &probe);
    if (begun != CUDA_SUCCESS)
        return begun;
    CUresult rc = real.cuGreenCtxCreate(ctx, desc, dev, flags);
    return keep_context(&probe, rc, rc == CUDA_SUCCESS ? *ctx : NULL, dev, VGPU_CONTEXT_GREEN);
}

/* The destroyed context's device is not known here: every capped device is measured again. */
static CUresult destroy_context(CUresult (*const *destroy)(CUcontext), CUcontext ctx)
{
    if (!ready() || *destroy == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    uint64_t before = vgpu_mem_recorded();
    vgpu_kernels_forget(); /* before its modules' handles are free: kernels.h */
    CUresult rc = (*destroy)(ctx);
    if (rc == CUDA_SUCCESS) {
        vgpu_footprint_context_destroyed(ctx);
        vgpu_stack_context_gone(ctx);
        arrays_gone(ctx, before);
        context_gone(-1);
    }
    return rc;
}

VGPU_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    return destroy_context(&real.cuCtxDestroy_v2, ctx);
}

VGPU_EXPORT CUresult cuCtxDestroy(CUcontext ctx)
{
    return destroy_context(&real.cuCtxDestroy, ctx);
}

/* It releases the primary context it retained, whose last release frees that context's memory
 * and resets its limits (cuda.h); the device is not known here either, except to the stack's
 * count when it still counts the green context (else every device's primary is looked at). */
VGPU_EXPORT CUresult cuGreenCtxDestroy(CUgreenCtx ctx)
{
    if (!ready() || real.cuGreenCtxDestroy == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUcontext as = as_context(VGPU_CONTEXT_GREEN, ctx);
    uint64_t before = vgpu_mem_recorded();
    vgpu_kernels_forget(); /* before its modules' handles are free: kernels.h */
    CUresult rc = real.cuGreenCtxDestroy(ctx);
    if (rc == CUDA_SUCCESS) {
        /* Its arrays are no context's now: its CUcontext may name another context next. */
        vgpu_mem_disown(VGPU_KIND_ARRAY, as, before);
        int dev = vgpu_stack_context_gone(ctx);
        for (int d = 0; d < VGPU_REGION_MAX_DEVICES; d++)
            if ((dev < 0 || d == dev) && !primary_active((CUdevice)d))
                primary_ended(d, before);
        context_gone(-1);
    }
    return rc;
}
