/* cuda_memory.c - every driver call that allocates device memory reserves it under the cap
 * first and keeps the reservation under the returned key; every call that frees gives it back. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_driver.h"
#include "devices.h"
#include "footprint.h"
#include "locks.h"
#include "log.h"
#include "memory.h"
#include "region.h"
#include "vmm.h"

/* cuStreamGetCtx refuses a green context's stream (cuda.h); CUDA 12.5's cuStreamGetCtx_v2
 * names the green context. */
CUcontext vgpu_stream_context(CUstream stream)
{
    CUcontext ctx = NULL;
    CUgreenCtx green = NULL;
    if (real.cuStreamGetCtx_v2 != NULL &&
        real.cuStreamGetCtx_v2(stream, &ctx, &green) == CUDA_SUCCESS) {
        if (green == NULL)
            return ctx;
        return real.cuCtxFromGreenCtx != NULL &&
                       real.cuCtxFromGreenCtx(&ctx, green) == CUDA_SUCCESS
                   ? ctx : NULL;
    }
    return real.cuStreamGetCtx != NULL && real.cuStreamGetCtx(stream, &ctx) == CUDA_SUCCESS
               ? ctx : NULL;
}

/* The device a stream-ordered allocation on stream draws on. A stream named explicitly may be
 * another context's, on another device, and needs no current context at all: its own device
 * (CUDA 12.8's cuStreamGetDevice, else its context's, made current for the question). A
 * default stream is the current context's. -1 as current_device(); VGPU_DEVICE_UNKNOWN: the
 * driver could not say (the caller refuses: the memory would go uncounted). */
int vgpu_stream_device(CUstream stream)
{
    if (vgpu_default_stream(stream))
        return current_device();
    CUdevice dev;
    if (real.cuStreamGetDevice != NULL && real.cuStreamGetDevice(stream, &dev) == CUDA_SUCCESS)
        return dev >= 0 && dev < VGPU_REGION_MAX_DEVICES ? (int)dev : -1;
    CUcontext ctx = vgpu_stream_context(stream), popped = NULL;
    if (ctx == NULL || real.cuCtxPushCurrent_v2 == NULL || real.cuCtxPopCurrent_v2 == NULL ||
        real.cuCtxPushCurrent_v2(ctx) != CUDA_SUCCESS)
        return VGPU_DEVICE_UNKNOWN;
    int found = current_device();
    if (real.cuCtxPopCurrent_v2(&popped) != CUDA_SUCCESS || popped != ctx)
        vgpu_log(VGPU_LOG_ERROR, "the context pushed to learn a stream's device did not pop "
                 "back; this thread's current context may have changed");
    return found;
}

int vgpu_launch_device(CUstream stream)
{
    int dev = vgpu_stream_device(stream);
    return dev >= 0 ? dev : current_device();
}

/* The device of the allocation at ptr (-1: the driver cannot say). */
static int pointer_device(CUdeviceptr ptr)
{
    int dev = -1;
    if (vgpu_pointer_attribute(&dev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr) != CUDA_SUCCESS)
        return -1;
    return dev >= 0 && dev < VGPU_REGION_MAX_DEVICES ? dev : -1;
}

/* Reserve on dev, or answer OOM. dev < 0 (no context): nothing to reserve, the driver decides. */
static int admit(int dev, uint64_t bytes, const char *api)
{
    if (dev < 0)
        return 1;
    vgpu_footprint_refresh(dev);
    if (vgpu_mem_reserve(dev, bytes, api) != 0)
        return 0;
    /* From the driver call until the table has it, NVML may show memory the table does not. */
    vgpu_mem_op_begin();
    return 1;
}

/* After the driver call: keep the reservation under key on success (owner: as
 * vgpu_mem_track), give it back otherwise. */
static CUresult settle(CUresult rc, enum vgpu_alloc_kind kind, uint64_t key, int dev,
                       uint64_t bytes, const void *owner)
{
    if (dev < 0)
        return rc;
    if (rc == CUDA_SUCCESS)
        vgpu_mem_track(kind, key, dev, bytes, owner);
    else
        vgpu_mem_unreserve(dev, bytes);
    vgpu_mem_op_end();
    return rc;
}

/* The driver calls that give memory back at once, all handled the same way (cuMemRelease, whose
 * memory may stay mapped, is below). */
enum free_api { FREE, FREE_V1, FREE_ASYNC, FREE_ASYNC_PTSZ, ARRAY_DESTROY, MIPMAP_DESTROY };

/* Per free_api: where its real function is (NULL: this driver lacks it) and what it frees. */
static const struct {
    void *const *real;
    enum vgpu_alloc_kind kind;
} free_apis[] = {
    [FREE] = {(void *const *)&real.cuMemFree_v2, VGPU_KIND_POINTER},
    [FREE_V1] = {(void *const *)&real.cuMemFree, VGPU_KIND_POINTER},
    [FREE_ASYNC] = {(void *const *)&real.cuMemFreeAsync, VGPU_KIND_POINTER},
    [FREE_ASYNC_PTSZ] = {(void *const *)&real.cuMemFreeAsync_ptsz, VGPU_KIND_POINTER},
    [ARRAY_DESTROY] = {(void *const *)&real.cuArrayDestroy, VGPU_KIND_ARRAY},
    [MIPMAP_DESTROY] = {(void *const *)&real.cuMipmappedArrayDestroy, VGPU_KIND_ARRAY},
};

static CUresult call_free(enum free_api api, uint64_t key, CUstream stream)
{
    switch (api) {
    case FREE: return real.cuMemFree_v2((CUdeviceptr)key);
    case FREE_V1: return real.cuMemFree((v1_ptr)key);
    case FREE_ASYNC: return real.cuMemFreeAsync((CUdeviceptr)key, stream);
    case FREE_ASYNC_PTSZ: return real.cuMemFreeAsync_ptsz((CUdeviceptr)key, stream);
    case ARRAY_DESTROY: return real.cuArrayDestroy((CUarray)(uintptr_t)key);
    default: return real.cuMipmappedArrayDestroy((CUmipmappedArray)(uintptr_t)key);
    }
}

/* The pool a stream-ordered allocation came from (NULL: none, or the driver cannot say). */
static CUmemoryPool pool_of(CUdeviceptr ptr)
{
    CUmemoryPool pool = NULL;
    if (vgpu_pointer_attribute(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, ptr) != CUDA_SUCCESS)
        return NULL;
    return pool;
}

/* Set once a stream-ordered allocation was counted: before, no pointer a synchronous free is
 * given can be a pool's, and the driver is not asked. */
static int ordered_counted;

/* Whether what api frees may go back to a stream-ordered pool, whose cache keeps it: counted
 * still. cuMemFree of a stream-ordered allocation gives it back to its pool as cuMemFreeAsync
 * does (cuda.h tells them apart by synchronisation only); counting it as freed let each such
 * free leave its pool holding memory uncounted (two rounds held 1624 MiB on a 1 GiB cap). */
static int may_be_pooled(enum free_api api)
{
    if (api == FREE_ASYNC || api == FREE_ASYNC_PTSZ)
        return 1;
    return (api == FREE || api == FREE_V1) && __atomic_load_n(&ordered_counted, __ATOMIC_RELAXED);
}

/* Takes key out of the table before freeing (so a racing allocation that reuses the address
 * cannot be confused with it), puts it back if the driver refuses the free. Keys this process
 * never counted are still freed by the driver, which gives its own answer. */
static CUresult release_counted(enum free_api api, uint64_t key, CUstream stream)
{
    if (!ready() || *free_apis[api].real == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct vgpu_mem_record was;
    vgpu_mem_op_begin();
    int known = vgpu_mem_untrack(free_apis[api].kind, key, &was);
    CUmemoryPool pool = known && may_be_pooled(api) ? pool_of((CUdeviceptr)key) : NULL;
    CUresult rc = call_free(api, key, stream);
    if (known && rc == CUDA_SUCCESS &&
        !(pool != NULL && vgpu_footprint_pool_kept(was.dev, (uintptr_t)pool, was.bytes)))
        vgpu_mem_unreserve(was.dev, was.bytes);
    else if (known && rc != CUDA_SUCCESS)
        vgpu_mem_track_again(&was);
    vgpu_mem_op_end();
    return rc;
}

/* The driver calls that return a device pointer, all counted the same way. */
enum pointer_api { PLAIN, PLAIN_V1, MANAGED, ASYNC, ASYNC_PTSZ, POOL, POOL_PTSZ };

struct pointer_request {
    enum pointer_api api;
    size_t bytes;
    unsigned int flags;  /* MANAGED */
    CUmemoryPool pool;   /* POOL, POOL_PTSZ */
    CUstream stream;     /* ASYNC*, POOL* */
};

/* Per counted API: where its real function is (NULL: this driver lacks it), and its name for
 * the refusal log line. */
struct counted_api {
    void *const *real;
    const char *name;
};

static const struct counted_api pointer_apis[] = {
    [PLAIN] = {(void *const *)&real.cuMemAlloc_v2, "cuMemAlloc"},
    [PLAIN_V1] = {(void *const *)&real.cuMemAlloc, "cuMemAlloc (v1)"},
    [MANAGED] = {(void *const *)&real.cuMemAllocManaged, "cuMemAllocManaged"},
    [ASYNC] = {(void *const *)&real.cuMemAllocAsync, "cuMemAllocAsync"},
    [ASYNC_PTSZ] = {(void *const *)&real.cuMemAllocAsync_ptsz, "cuMemAllocAsync_ptsz"},
    [POOL] = {(void *const *)&real.cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync"},
    [POOL_PTSZ] = {(void *const *)&real.cuMemAllocFromPoolAsync_ptsz,
                   "cuMemAllocFromPoolAsync_ptsz"},
};

static CUresult call_driver(const struct pointer_request *r, CUdeviceptr *ptr)
{
    switch (r->api) {
    case PLAIN: return real.cuMemAlloc_v2(ptr, r->bytes);
    case PLAIN_V1: {
        v1_ptr p32 = 0;
        CUresult rc = real.cuMemAlloc(&p32, (unsigned int)r->bytes);
        *ptr = p32;
        return rc;
    }
    case MANAGED: return real.cuMemAllocManaged(ptr, r->bytes, r->flags);
    case ASYNC: return real.cuMemAllocAsync(ptr, r->bytes, r->stream);
    case ASYNC_PTSZ: return real.cuMemAllocAsync_ptsz(ptr, r->bytes, r->stream);
    case POOL: return real.cuMemAllocFromPoolAsync(ptr, r->bytes, r->pool, r->stream);
    default: return real.cuMemAllocFromPoolAsync_ptsz(ptr, r->bytes, r->pool, r->stream);
    }
}

/* What pool has reserved from the device, and what its allocations use of that; -1 when the
 * driver cannot say. */
static int pool_figures(CUmemoryPool pool, cuuint64_t *reserved, cuuint64_t *used)
{
    return real.cuMemPoolGetAttribute != NULL &&
           real.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, reserved) ==
               CUDA_SUCCESS &&
           real.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, used) ==
               CUDA_SUCCESS ? 0 : -1;
}

/* What pool holds beyond what its allocations use (0 when the driver cannot say). */
static uint64_t pool_cached(CUmemoryPool pool)
{
    cuuint64_t reserved = 0, used = 0;
    return pool_figures(pool, &reserved, &used) == 0 && reserved > used ? reserved - used : 0;
}

/* The pool r draws on: the one it names, else its device's current pool (NULL: the driver
 * cannot say). */
static CUmemoryPool drawn_pool(const struct pointer_request *r, int dev)
{
    CUmemoryPool pool = r->pool;
    if (pool == NULL && (real.cuDeviceGetMemPool == NULL ||
                         real.cuDeviceGetMemPool(&pool, (CUdevice)dev) != CUDA_SUCCESS))
        return NULL;
    return pool;
}

/* Whether r is of the per-thread default stream flavour (the _ptsz exports). */
static int per_thread(const struct pointer_request *r)
{
    return r->api == ASYNC_PTSZ || r->api == POOL_PTSZ;
}

/* The stream-ordered free of r's flavour (per-thread default stream or legacy). */
static CUresult (*ordered_free(const struct pointer_request *r))(CUdeviceptr, CUstream)
{
    return per_thread(r) ? real.cuMemFreeAsync_ptsz : real.cuMemFreeAsync;
}

/* Gives back what pool caches; returns 1 when that was something. */
static int trim_pool(CUmemoryPool pool)
{
    uint64_t cached = pool_cached(pool);
    return cached != 0 && real.cuMemPoolTrimTo != NULL && real.cuMemPoolTrimTo(pool, 0) ==
           CUDA_SUCCESS && pool_cached(pool) < cached;
}

/* What the driver says of the capture of r's stream; -1 when it cannot say. */
static int capture_status(const struct pointer_request *r, CUstreamCaptureStatus *status)
{
    CUresult (*ask)(CUstream, CUstreamCaptureStatus *) =
        per_thread(r) ? real.cuStreamIsCapturing_ptsz : real.cuStreamIsCapturing;
    *status = CU_STREAM_CAPTURE_STATUS_NONE;
    return ask != NULL && ask(r->stream, status) == CUDA_SUCCESS ? 0 : -1;
}

/* Whether r's stream may be in a capture: a pool changed under a capture could invalidate it. */
static int maybe_capturing(const struct pointer_request *r)
{
    CUstreamCaptureStatus status;
    return capture_status(r, &status) != 0 || status != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* An allocation given back into its pool stays in the pool's cache, where it would count
 * against the next one: the pool is trimmed (not while the stream is captured: that could
 * break the capture) and what is counted of its cache checked. */
static void trim_given_back(const struct pointer_request *r, CUmemoryPool pool, int dev)
{
    if (!maybe_capturing(r) && trim_pool(pool))
        vgpu_footprint_pools_check(dev);
}

/* The capture r's stream is in (its id), or 0: none, or the driver cannot say. */
static cuuint64_t capture_of(const struct pointer_request *r)
{
    CUresult (*ask)(CUstream, CUstreamCaptureStatus *, cuuint64_t *, CUgraph *,
                    const CUgraphNode **, size_t *) =
        per_thread(r) ? real.cuStreamGetCaptureInfo_v2_ptsz : real.cuStreamGetCaptureInfo_v2;
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    cuuint64_t id = 0;
    if (ask == NULL || ask(r->stream, &status, &id, NULL, NULL, NULL) != CUDA_SUCCESS ||
        status != CU_STREAM_CAPTURE_STATUS_ACTIVE)
        return 0;
    return id != 0 ? id : 1;
}

/* Frees ptr, allocated on r's stream outside a capture and refused: synchronously, in relaxed
 * capture mode for this thread (a free on the stream could become a node of a capture begun
 * there meanwhile, which the driver refuses for memory no graph allocated), else on the
 * stream. Should both fail, the memory is held: charged to dev (past the cap) under ptr. */
static void give_back_uncaptured(const struct pointer_request *r, CUdeviceptr ptr, int dev)
{
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    int relaxed = real.cuThreadExchangeStreamCaptureMode != NULL &&
                  real.cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS;
    CUresult rc = real.cuMemFree_v2 != NULL ? real.cuMemFree_v2(ptr) : CUDA_ERROR_NOT_SUPPORTED;
    if (relaxed)
        real.cuThreadExchangeStreamCaptureMode(&mode);
    if (rc == CUDA_SUCCESS || ordered_free(r)(ptr, r->stream) == CUDA_SUCCESS || dev < 0)
        return;
    vgpu_log(VGPU_LOG_ERROR, "%zu bytes allocated outside a capture and refused could not be "
             "given back: counted past the cap", r->bytes);
    vgpu_region_charge(dev, r->bytes);
    vgpu_mem_track(VGPU_KIND_POINTER, ptr, dev, r->bytes, NULL);
}

/* On a stream being captured, r becomes a graph's allocation node, which takes no memory until
 * the graph runs and is counted then (cuda_graph_memory.c); counted here too, an allocation
 * the graph keeps after it ends would count twice. Unless the same capture was under way before
 * and after the call (another thread may end it, or end it and begin another, in between),
 * the driver may have allocated for real: counted then, or given back and refused. */
static CUresult alloc_captured(const struct pointer_request *r, cuuint64_t capture,
                               CUdeviceptr *dptr)
{
    CUdeviceptr ptr = 0;
    CUresult rc = call_driver(r, &ptr);
    if (rc == CUDA_SUCCESS && capture_of(r) != capture) {
        int dev = vgpu_stream_device(r->stream);
        if (dev == VGPU_DEVICE_UNKNOWN || !admit(dev, r->bytes, pointer_apis[r->api].name)) {
            give_back_uncaptured(r, ptr, dev);
            if (dev >= 0) /* not left in the pool's cache, uncounted */
                trim_given_back(r, drawn_pool(r, dev), dev);
            return dev == VGPU_DEVICE_UNKNOWN ? CUDA_ERROR_INVALID_CONTEXT
                                              : CUDA_ERROR_OUT_OF_MEMORY;
        }
        rc = settle(rc, VGPU_KIND_POINTER, ptr, dev, r->bytes, NULL);
    }
    if (rc == CUDA_SUCCESS && dptr != NULL)
        *dptr = ptr;
    return rc;
}

/* A pool keeps the memory stream-ordered frees give back (PyTorch's cudaMallocAsync backend
 * sets its release threshold to the maximum, so it keeps all of it). NVML shows that memory, so
 * it is counted as the process's footprint, and an allocation the pool would serve from it
 * would be counted twice. Before a stream-ordered allocation on dev is refused, the pool it
 * comes from gives back what no allocation uses (no synchronisation, and not while its stream
 * is captured: either could break a capture) and the footprint is measured again. */
static void release_pool_cache(const struct pointer_request *r, int dev)
{
    uint64_t limit = vgpu_region_limit(dev);
    if (limit == 0)
        return;
    vgpu_footprint_refresh(dev); /* what admit() would see */
    if (vgpu_region_used(dev) + r->bytes <= limit || maybe_capturing(r))
        return;
    CUmemoryPool pool = drawn_pool(r, dev);
    if (pool != NULL && trim_pool(pool)) {
        vgpu_footprint_pools_check(dev);
        vgpu_footprint_remeasure(dev);
    }
}

/* A stream-ordered allocation from a pool that caches at least its size: what it took over
 * from what earlier frees left counted for that pool (vgpu_footprint_pool_kept), and the
 * pool's reserve before the driver call. */
struct cache_take {
    CUmemoryPool pool;
    uint64_t taken;
    cuuint64_t reserved_before;
    int trim; /* the allocation was given back: trim the pool once the cache's count is back */
};

/* Such an allocation may be served from the cache rather than new memory, so it takes over
 * the bytes frees left counted for its pool (up to its size; frees are counted on the pool's
 * device, so a pool of another device has none here) rather than being counted a second time:
 * only the rest is reserved. Nothing taken (.taken 0): none counted, a cache smaller than the
 * request, or the rest did not fit (they went back). */
static struct cache_take admit_from_cache(const struct pointer_request *r, int dev)
{
    struct cache_take t = {0};
    cuuint64_t used = 0;
    if (vgpu_footprint_pooled(dev) == 0 || (t.pool = drawn_pool(r, dev)) == NULL ||
        pool_figures(t.pool, &t.reserved_before, &used) != 0 ||
        t.reserved_before < used || t.reserved_before - used < r->bytes)
        return (struct cache_take){0};
    vgpu_footprint_refresh(dev); /* before the take, so that it measures none taken over */
    /* From the take until the table has the allocation, a measurement could count it twice. */
    vgpu_mem_op_begin();
    t.taken = vgpu_footprint_pool_take(dev, (uintptr_t)t.pool, r->bytes);
    int admitted = t.taken != 0 && admit(dev, r->bytes - t.taken, pointer_apis[r->api].name);
    if (t.taken != 0 && !admitted) {
        vgpu_footprint_pool_put_back(dev, (uintptr_t)t.pool, t.taken);
        t.taken = 0;
    }
    vgpu_mem_op_end(); /* admit's own begin lasts until settle */
    return t;
}

/* After the driver served such an allocation: what the pool's reserve grew by is new memory,
 * not the cache's (fragmented, the cache may not hold a block that size). Beyond what was
 * reserved for it, that is reserved now, the bytes taken over going back to the cache's count;
 * or, past the cap, the allocation is given back and refused (t->trim: so that its memory is
 * not left cached uncounted). */
static CUresult cover_growth(const struct pointer_request *r, CUdeviceptr ptr, int dev,
                             struct cache_take *t)
{
    CUresult (*give_back)(CUdeviceptr, CUstream) = ordered_free(r);
    cuuint64_t after = 0;
    uint64_t grown = real.cuMemPoolGetAttribute(t->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                                                &after) != CUDA_SUCCESS ? r->bytes
                     : after > t->reserved_before ? after - t->reserved_before : 0;
    uint64_t fresh = r->bytes - t->taken;
    if (grown <= fresh)
        return CUDA_SUCCESS;
    uint64_t missing = grown - fresh < t->taken ? grown - fresh : t->taken;
    if (vgpu_mem_reserve(dev, missing, pointer_apis[r->api].name) == 0) {
        vgpu_footprint_pool_put_back(dev, (uintptr_t)t->pool, missing);
        t->taken -= missing;
        return CUDA_SUCCESS;
    }
    if (give_back != NULL)
        give_back(ptr, r->stream);
    t->trim = 1;
    return CUDA_ERROR_OUT_OF_MEMORY;
}

/* A pool may be another device's than the stream's, and its memory lives there: the
 * reservation made on the stream's device *dev moves to the pool's (the allocation is given
 * back, and OUT_OF_MEMORY answered, when it does not fit there). Only the stream's device was
 * measured before the call (a pool's device is known from a pointer only), so a cache the
 * pool keeps there is not given back first. */
static CUresult move_to_pool_device(const struct pointer_request *r, CUdeviceptr ptr, int *dev)
{
    CUresult (*give_back)(CUdeviceptr, CUstream) = ordered_free(r);
    int actual = pointer_device(ptr);
    if (actual < 0 || *dev < 0 || actual == *dev || give_back == NULL)
        return CUDA_SUCCESS;
    vgpu_footprint_refresh(actual);
    if (vgpu_mem_reserve(actual, r->bytes, pointer_apis[r->api].name) != 0) {
        give_back(ptr, r->stream);
        trim_given_back(r, r->pool, actual);
        return CUDA_ERROR_OUT_OF_MEMORY; /* settle gives back the first reservation */
    }
    vgpu_mem_unreserve(*dev, r->bytes);
    *dev = actual;
    return CUDA_SUCCESS;
}

/* Reserve on the device the memory comes from, ask the driver, keep the reservation under the
 * returned pointer. Managed memory is counted too (conservative: it may live on the GPU);
 * stream-ordered allocations count from the alloc call to the free call, not the pool's
 * reserve, on the stream's device (a pool's, on the pool's). One on an explicit stream whose
 * device cannot be told is refused: the driver could serve it with no current context, and so
 * uncounted. */
static CUresult alloc_counted(const struct pointer_request *r, int ordered, CUdeviceptr *dptr)
{
    int dev = ordered ? vgpu_stream_device(r->stream) : current_device();
    if (dev == VGPU_DEVICE_UNKNOWN) {
        vgpu_log(VGPU_LOG_ERROR, "%s: the device of its stream cannot be told; refused",
                 pointer_apis[r->api].name);
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    struct cache_take cache = ordered && dev >= 0 ? admit_from_cache(r, dev)
                                                  : (struct cache_take){0};
    if (cache.taken == 0 && ordered && dev >= 0)
        release_pool_cache(r, dev);
    if (cache.taken == 0 && !admit(dev, r->bytes, pointer_apis[r->api].name))
        return CUDA_ERROR_OUT_OF_MEMORY;
    /* The host pid is learnt from plain allocations only: managed pages and a pool's cache may
     * not grow what NVML shows, and another process growing alike must not be taken for us. */
    int learning = r->api == PLAIN && vgpu_footprint_learn_before(dev, r->bytes);
    CUdeviceptr ptr = 0;
    CUresult rc = call_driver(r, &ptr);
    if (learning)
        vgpu_footprint_learn_after(rc == CUDA_SUCCESS ? r->bytes : 0, 0);
    if (rc == CUDA_SUCCESS && cache.taken != 0)
        rc = cover_growth(r, ptr, dev, &cache);
    else if (rc == CUDA_SUCCESS && (r->api == POOL || r->api == POOL_PTSZ))
        rc = move_to_pool_device(r, ptr, &dev);
    if (rc != CUDA_SUCCESS && cache.taken != 0) /* still in the pool's cache */
        vgpu_footprint_pool_put_back(dev, (uintptr_t)cache.pool, cache.taken);
    if (cache.trim)
        trim_given_back(r, cache.pool, dev);
    uint64_t reserved = rc == CUDA_SUCCESS ? r->bytes : r->bytes - cache.taken;
    if (ordered && rc == CUDA_SUCCESS && !__atomic_load_n(&ordered_counted, __ATOMIC_RELAXED))
        __atomic_store_n(&ordered_counted, 1, __ATOMIC_RELAXED);
    rc = settle(rc, VGPU_KIND_POINTER, ptr, dev, reserved, NULL);
    if (rc == CUDA_SUCCESS && dptr != NULL)
        *dptr = ptr;
    return rc;
}

static CUresult alloc_pointer(const struct pointer_request *r, CUdeviceptr *dptr)
{
    if (!ready() || *pointer_apis[r->api].real == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    int ordered = r->api != PLAIN && r->api != PLAIN_V1 && r->api != MANAGED;
    cuuint64_t capture = ordered ? capture_of(r) : 0;
    return capture != 0 ? alloc_captured(r, capture, dptr) : alloc_counted(r, ordered, dptr);
}

VGPU_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes)
{
    return alloc_pointer(&(struct pointer_request){.api = PLAIN, .bytes = bytes}, dptr);
}

VGPU_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags)
{
    return alloc_pointer(&(struct pointer_request){.api = MANAGED, .bytes = bytes,
                                                   .flags = flags}, dptr);
}

VGPU_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream stream)
{
    return alloc_pointer(&(struct pointer_request){.api = ASYNC, .bytes = bytes,
                                                   .stream = stream}, dptr);
}

VGPU_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream stream)
{
    return alloc_pointer(&(struct pointer_request){.api = ASYNC_PTSZ, .bytes = bytes,
                                                   .stream = stream}, dptr);
}

VGPU_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool,
                                             CUstream stream)
{
    return alloc_pointer(&(struct pointer_request){.api = POOL, .bytes = bytes, .pool = pool,
                                                   .stream = stream}, dptr);
}

VGPU_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes,
                                                  CUmemoryPool pool, CUstream stream)
{
    return alloc_pointer(&(struct pointer_request){.api = POOL_PTSZ, .bytes = bytes,
                                                   .pool = pool, .stream = stream}, dptr);
}

VGPU_EXPORT CUresult cuMemAlloc(v1_ptr *dptr, unsigned int bytes)
{
    CUdeviceptr ptr = 0;
    CUresult rc = alloc_pointer(&(struct pointer_request){.api = PLAIN_V1, .bytes = bytes}, &ptr);
    if (rc == CUDA_SUCCESS && dptr != NULL)
        *dptr = (v1_ptr)ptr;
    return rc;
}

VGPU_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) { return release_counted(FREE, dptr, NULL); }

VGPU_EXPORT CUresult cuMemFree(v1_ptr dptr) { return release_counted(FREE_V1, dptr, NULL); }

/* The driver's pitch allocation, in either ABI; frees with the matching cuMemFree. */
static CUresult call_pitch(int v1, CUdeviceptr *ptr, size_t *pitch, size_t width, size_t height,
                           unsigned int elem)
{
    if (!v1)
        return real.cuMemAllocPitch_v2(ptr, pitch, width, height, elem);
    v1_ptr p32 = 0;
    unsigned int pitch32 = 0;
    CUresult rc = real.cuMemAllocPitch(&p32, &pitch32, (unsigned int)width, (unsigned int)height,
                                       elem);
    *ptr = p32;
    *pitch = pitch32;
    return rc;
}

static void free_pitch(int v1, CUdeviceptr ptr)
{
    if (v1)
        real.cuMemFree((v1_ptr)ptr);
    else
        real.cuMemFree_v2(ptr);
}

static CUresult alloc_pitch(int v1, CUdeviceptr *dptr, size_t *pitch, size_t width,
                            size_t height, unsigned int elem)
{
    if (!ready() || (v1 ? real.cuMemAllocPitch == NULL || real.cuMemFree == NULL
                        : real.cuMemAllocPitch_v2 == NULL))
        return CUDA_ERROR_NOT_INITIALIZED;
    int dev = current_device();
    uint64_t estimate = (uint64_t)((width + 511) & ~(size_t)511) * height;
    if (!admit(dev, estimate, "cuMemAllocPitch"))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUdeviceptr ptr = 0;
    size_t got_pitch = 0;
    CUresult rc = call_pitch(v1, &ptr, &got_pitch, width, height, elem);
    uint64_t actual = (uint64_t)got_pitch * height;
    if (rc == CUDA_SUCCESS && dev >= 0 && actual != estimate) {
        /* Count what the driver really used (its pitch), not our estimate. */
        if (actual > estimate && vgpu_mem_reserve(dev, actual - estimate, "cuMemAllocPitch") != 0) {
            free_pitch(v1, ptr);
            vgpu_mem_unreserve(dev, estimate);
            vgpu_mem_op_end();
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        if (actual < estimate)
            vgpu_mem_unreserve(dev, estimate - actual);
        estimate = actual;
    }
    rc = settle(rc, VGPU_KIND_POINTER, ptr, dev, estimate, NULL);
    if (rc == CUDA_SUCCESS) {
        if (dptr != NULL)
            *dptr = ptr;
        if (pitch != NULL)
            *pitch = got_pitch;
    }
    return rc;
}

VGPU_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width,
                                        size_t height, unsigned int elem)
{
    return alloc_pitch(0, dptr, pitch, width, height, elem);
}

VGPU_EXPORT CUresult cuMemAllocPitch(v1_ptr *dptr, unsigned int *pitch, unsigned int width,
                                     unsigned int height, unsigned int elem)
{
    CUdeviceptr ptr = 0;
    size_t got_pitch = 0;
    CUresult rc = alloc_pitch(1, &ptr, &got_pitch, width, height, elem);
    if (rc == CUDA_SUCCESS) {
        if (dptr != NULL)
            *dptr = (v1_ptr)ptr;
        if (pitch != NULL)
            *pitch = (unsigned int)got_pitch;
    }
    return rc;
}

static uint64_t format_bytes(CUarray_format format)
{
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF:
        return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32: case CU_AD_FORMAT_SIGNED_INT32: case CU_AD_FORMAT_FLOAT:
        return 4;
    default: return 16; /* block-compressed and wide formats: an upper bound */
    }
}

static uint64_t array_bytes(size_t w, size_t h, size_t d, unsigned channels, CUarray_format fmt)
{
    return (uint64_t)w * (h ? h : 1) * (d ? d : 1) * (channels ? channels : 1) * format_bytes(fmt);
}

/* 2D and 3D arrays, in either ABI: counted by an estimate from the descriptor (its sizes
 * passed here), keyed by the array handle. */
enum array_api { ARRAY_2D, ARRAY_3D, ARRAY_2D_V1, ARRAY_3D_V1 };

static const struct counted_api array_apis[] = {
    [ARRAY_2D] = {(void *const *)&real.cuArrayCreate_v2, "cuArrayCreate"},
    [ARRAY_3D] = {(void *const *)&real.cuArray3DCreate_v2, "cuArray3DCreate"},
    [ARRAY_2D_V1] = {(void *const *)&real.cuArrayCreate, "cuArrayCreate (v1)"},
    [ARRAY_3D_V1] = {(void *const *)&real.cuArray3DCreate, "cuArray3DCreate (v1)"},
};

static CUresult call_array(enum array_api api, CUarray *array, const void *desc)
{
    switch (api) {
    case ARRAY_2D: return real.cuArrayCreate_v2(array, desc);
    case ARRAY_3D: return real.cuArray3DCreate_v2(array, desc);
    case ARRAY_2D_V1: return real.cuArrayCreate(array, desc);
    default: return real.cuArray3DCreate(array, desc);
    }
}

/* The context an array is made in (the current one), whose end frees it: a destroyed array may
 * not be passed to the driver again, so its end is the only news of it (cuda_context.c). */
static const void *array_owner(void)
{
    CUcontext ctx = NULL;
    return real.cuCtxGetCurrent != NULL && real.cuCtxGetCurrent(&ctx) == CUDA_SUCCESS ? ctx : NULL;
}

/* desc NULL: the driver answers; bytes is the estimate (0 without a descriptor). */
static CUresult create_array(enum array_api api, CUarray *handle, const void *desc,
                             uint64_t bytes)
{
    if (!ready() || *array_apis[api].real == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    int dev = desc != NULL ? current_device() : -1;
    if (!admit(dev, bytes, array_apis[api].name))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUarray array = NULL;
    CUresult rc = call_array(api, &array, desc);
    rc = settle(rc, VGPU_KIND_ARRAY, (uint64_t)(uintptr_t)array, dev, bytes, array_owner());
    if (rc == CUDA_SUCCESS && handle != NULL)
        *handle = array;
    return rc;
}

VGPU_EXPORT CUresult cuArrayCreate_v2(CUarray *handle, const CUDA_ARRAY_DESCRIPTOR *desc)
{
    return create_array(ARRAY_2D, handle, desc, desc == NULL ? 0
                        : array_bytes(desc->Width, desc->Height, 1, desc->NumChannels,
                                      desc->Format));
}

VGPU_EXPORT CUresult cuArray3DCreate_v2(CUarray *handle, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
    return create_array(ARRAY_3D, handle, desc, desc == NULL ? 0
                        : array_bytes(desc->Width, desc->Height, desc->Depth, desc->NumChannels,
                                      desc->Format));
}

VGPU_EXPORT CUresult cuArrayCreate(CUarray *handle, const struct array_v1 *desc)
{
    return create_array(ARRAY_2D_V1, handle, desc, desc == NULL ? 0
                        : array_bytes(desc->Width, desc->Height, 1, desc->NumChannels,
                                      desc->Format));
}

VGPU_EXPORT CUresult cuArray3DCreate(CUarray *handle, const struct array3d_v1 *desc)
{
    return create_array(ARRAY_3D_V1, handle, desc, desc == NULL ? 0
                        : array_bytes(desc->Width, desc->Height, desc->Depth, desc->NumChannels,
                                      desc->Format));
}

/* An array's destruction, which undoes its tiles' bindings too (below). */
static CUresult destroy_array(enum free_api api, uint64_t array);

VGPU_EXPORT CUresult cuArrayDestroy(CUarray array)
{
    return destroy_array(ARRAY_DESTROY, (uint64_t)(uintptr_t)array);
}

/* Every level of a mipmapped array, each half the one before in every dimension (at least 1). */
static uint64_t mipmap_bytes(const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels)
{
    uint64_t sum = 0;
    for (unsigned int l = 0; l < levels && l < 64; l++) {
        size_t w = d->Width >> l, h = d->Height >> l, z = d->Depth >> l;
        sum += array_bytes(w ? w : 1, h ? h : (d->Height != 0), z ? z : (d->Depth != 0),
                           d->NumChannels, d->Format);
    }
    return sum;
}

/* Counted like arrays, by the sum of its levels, keyed by its handle. */
VGPU_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *handle,
                                            const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                            unsigned int levels)
{
    if (!ready() || real.cuMipmappedArrayCreate == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    uint64_t bytes = desc != NULL ? mipmap_bytes(desc, levels) : 0;
    int dev = desc != NULL ? current_device() : -1;
    if (!admit(dev, bytes, "cuMipmappedArrayCreate"))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUmipmappedArray made = NULL;
    CUresult rc = real.cuMipmappedArrayCreate(&made, desc, levels);
    rc = settle(rc, VGPU_KIND_ARRAY, (uint64_t)(uintptr_t)made, dev, bytes, array_owner());
    if (rc == CUDA_SUCCESS && handle != NULL)
        *handle = made;
    return rc;
}

VGPU_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray array)
{
    return destroy_array(MIPMAP_DESTROY, (uint64_t)(uintptr_t)array);
}

/* A call that keeps the books of virtual memory (vmm.h), made while its own thread is inside
 * them (a signal handler's, the bookkeeping or a driver call under vgpu_vmm_hold interrupted):
 * said on stderr, to be refused with CUDA_ERROR_NOT_PERMITTED before anything is read or
 * changed. The vmm lock is recursive and would let it in: a release landing inside a mapping's
 * driver call found no mapping and gave the mapped memory back (test_alloc handler-inside).
 * `api`: the exported call's name (`__func__` in each). */
static int vmm_inside(const char *api)
{
    if (!vgpu_vmm_mine())
        return 0;
    vgpu_say_refused_inside(api);
    return 1;
}

VGPU_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t bytes,
                                 const CUmemAllocationProp *prop, unsigned long long flags)
{
    if (!ready() || real.cuMemCreate == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (vmm_inside(__func__))
        return CUDA_ERROR_NOT_PERMITTED;
    /* The device is the one the properties name, never the current context's (threads that
     * create VMM memory often have none). Host and invalid locations are not counted. */
    int dev = -1;
    if (prop != NULL && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
        prop->location.id >= 0 && prop->location.id < VGPU_REGION_MAX_DEVICES)
        dev = prop->location.id;
    /* An ordinal past the region's records is never one of the settings file's GPUs. */
    int beyond = prop != NULL && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
                 prop->location.id >= VGPU_REGION_MAX_DEVICES;
    if ((beyond && !vgpu_device_usable(prop->location.id)) || !admit(dev, bytes, "cuMemCreate"))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUmemGenericAllocationHandle h = 0;
    /* PyTorch's expandable segments allocate this way: the host pid is learnt here too. */
    int learning = vgpu_footprint_learn_before(dev, bytes);
    /* A bind of a released handle value may be under way in another thread (recorded before
     * its driver call, vmm.h): were it made on the new memory before vgpu_vmm_created, it
     * would be taken for the old memory's and dropped. */
    vgpu_vmm_hold();
    CUresult rc = real.cuMemCreate(&h, bytes, prop, flags);
    if (rc == CUDA_SUCCESS)
        vgpu_vmm_created(h);
    vgpu_vmm_let_go();
    if (learning)
        vgpu_footprint_learn_after(rc == CUDA_SUCCESS ? bytes : 0, 0);
    rc = settle(rc, VGPU_KIND_HANDLE, h, dev, bytes, NULL);
    if (rc == CUDA_SUCCESS && handle != NULL)
        *handle = h;
    return rc;
}

/* ---- a cuMemCreate allocation lives while referenced or mapped (vmm.h) ------------------- */

/* The memory of a handle was freed by the driver call just made: its recording, copied before
 * that call (serial 0: not counted), is removed and its bytes given back, unless the driver
 * has handed the handle out anew meanwhile (then insert() gave them back already). */
static void give_back_handle(const struct vgpu_mem_record *before)
{
    if (before->serial != 0 && vgpu_mem_untrack_exact(before))
        vgpu_mem_unreserve(before->dev, before->bytes);
}

/* The freed handles' memory was freed by the driver call just made: each is given back once
 * through the first of its recordings among the n copied before that call (handles[i],
 * before[i]; a handle mapped or bound twice is listed twice). */
static void give_back_freed(const uint64_t *freed, size_t nfreed, const uint64_t *handles,
                            struct vgpu_mem_record *before, size_t n)
{
    for (size_t f = 0; f < nfreed; f++)
        for (size_t i = 0; i < n; i++)
            if (handles[i] == freed[f] && before[i].serial != 0) {
                give_back_handle(&before[i]);
                before[i].serial = 0;
                break;
            }
}

VGPU_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    if (!ready() || real.cuMemRelease == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (vmm_inside(__func__))
        return CUDA_ERROR_NOT_PERMITTED;
    struct vgpu_mem_record before = {0};
    vgpu_mem_find(VGPU_KIND_HANDLE, handle, &before);
    vgpu_mem_op_begin();
    vgpu_vmm_hold();
    CUresult rc = real.cuMemRelease(handle);
    if (rc == CUDA_SUCCESS && vgpu_vmm_released(handle))
        give_back_handle(&before);
    vgpu_vmm_let_go();
    vgpu_mem_op_end();
    return rc;
}

/* A mapping that cannot be recorded is undone and refused: unrecorded, it would not keep the
 * memory counted once the handle is released. The driver call and the record are under the
 * vmm lock, as cuMemRelease's are: a release between them would find no mapping and give the
 * mapped memory back (a race a program can win at will). */
VGPU_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                              CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    if (!ready() || real.cuMemMap == NULL || real.cuMemUnmap == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (vmm_inside(__func__))
        return CUDA_ERROR_NOT_PERMITTED;
    vgpu_vmm_hold();
    CUresult rc = real.cuMemMap(ptr, size, offset, handle, flags);
    int recorded = rc != CUDA_SUCCESS || vgpu_vmm_mapped(ptr, size, handle) == 0;
    if (!recorded)
        real.cuMemUnmap(ptr, size);
    vgpu_vmm_let_go();
    if (recorded)
        return rc;
    vgpu_log(VGPU_LOG_ERROR, "out of host memory recording a memory mapping: refused");
    return CUDA_ERROR_OUT_OF_MEMORY;
}

VGPU_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle,
                                                 void *addr)
{
    if (!ready() || real.cuMemRetainAllocationHandle == NULL || real.cuMemRelease == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (vmm_inside(__func__))
        return CUDA_ERROR_NOT_PERMITTED;
    vgpu_vmm_hold(); /* as cuMemMap's: a release meanwhile would not see this reference */
    CUresult rc = real.cuMemRetainAllocationHandle(handle, addr);
    int recorded = rc != CUDA_SUCCESS || handle == NULL || vgpu_vmm_retained(*handle) == 0;
    if (!recorded)
        real.cuMemRelease(*handle);
    vgpu_vmm_let_go();
    if (recorded)
        return rc;
    vgpu_log(VGPU_LOG_ERROR, "out of host memory recording a handle's reference: refused");
    return CUDA_ERROR_OUT_OF_MEMORY;
}

/* An exported handle may be imported, by this process or another of the container, any number
 * of times, and cuda.h keeps the memory until every reference is released, the imports' too,
 * which this process never sees: its memory is never taken as freed (vmm.h), and the bytes stay
 * counted for the process's life. Before, create, export, import, release the handle and map
 * the import held any amount under the cap (helper review: 3.2 GiB on a 1 GiB cap; a single
 * extra reference for the export still let two imports through). */
VGPU_EXPORT CUresult cuMemExportToShareableHandle(void *shareable,
                                                  CUmemGenericAllocationHandle handle,
                                                  CUmemAllocationHandleType type,
                                                  unsigned long long flags)
{
    if (!ready() || real.cuMemExportToShareableHandle == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (vmm_inside(__func__))
        return CUDA_ERROR_NOT_PERMITTED;
    CUresult rc = real.cuMemExportToShareableHandle(shareable, handle, type, flags);
    if (rc != CUDA_SUCCESS || vgpu_vmm_exported(handle) == 0)
        return rc;
    if (type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR && shareable != NULL)
        close(*(int *)shareable); /* the export undone, as far as it can be */
    vgpu_log(VGPU_LOG_ERROR, "out of host memory recording an exported handle: refused");
    return CUDA_ERROR_OUT_OF_MEMORY;
}

/* ---- memory bound where cuMemUnmap does not reach --------------------------------------- */

/* A sparse array's tiles mapped onto cuMemCreate memory (cuMemMapArrayAsync: undone by an unmap
 * over them or the array's destruction) and a multicast object's bindings
 * (cuMulticastBindMem, cuMulticastBindAddr, their CUDA 13.1 _v2 naming the device: undone by
 * cuMulticastUnbind) hold the memory as a mapping does (cuda.h, cuMemRelease): each is a
 * binding (vmm.h), and the memory stays counted while one holds it. A binding is recorded
 * before the driver's call, so that a release racing it does not give the bytes back while
 * bound (a bind may block until every device joined the object: no lock is held across it),
 * and forgotten again if the driver refuses. Before, create, map a tile or bind, release held
 * any amount under the cap (an adversarial review: 3000 MiB on a 1 GiB cap). */
struct binds {
    uint64_t *ids;
    struct vgpu_mem_record *before; /* each handle's recording, for a refusal */
    size_t n;
};

/* api refused: no host memory to record what it binds. Returns -1. */
static int no_room_to_bind(const char *api)
{
    vgpu_log(VGPU_LOG_ERROR, "%s: out of host memory recording what it binds: refused", api);
    return -1;
}

/* Room for max bindings: 0, or -1 (logged as api's) out of host memory. */
static int binds_begin(struct binds *p, size_t max, const char *api)
{
    *p = (struct binds){.ids = calloc(max ? max : 1, sizeof *p->ids),
                        .before = calloc(max ? max : 1, sizeof *p->before)};
    return p->ids != NULL && p->before != NULL ? 0 : no_room_to_bind(api);
}

/* Records b before the driver's call; 0, or -1 (logged) out of host memory. */
static int binds_add(struct binds *p, const struct vgpu_vmm_binding *b, const char *api)
{
    vgpu_mem_find(VGPU_KIND_HANDLE, b->handle, &p->before[p->n]);
    uint64_t id = vgpu_vmm_bound(b);
    if (id == 0)
        return no_room_to_bind(api);
    p->ids[p->n++] = id;
    return 0;
}

/* After the driver answered rc (or nothing was called: rc not CUDA_SUCCESS): made, the
 * recorded bindings are kept; refused, forgotten, and memory only they held given back,
 * unless the driver may have made some of them (partly: a list it may have applied in part,
 * kept whole: counted until unbound). Returns rc. */
static CUresult binds_end(struct binds *p, CUresult rc, int partly)
{
    for (size_t i = 0; i < p->n; i++)
        if (vgpu_vmm_bind_answered(p->ids[i], rc == CUDA_SUCCESS || partly))
            give_back_handle(&p->before[i]);
    free(p->ids);
    free(p->before);
    return rc;
}

/* Bindings a driver call undoes: chosen, with their handles' recordings, before it, and after
 * it (done: it succeeded) forgotten and the memory that freed given back. Bindings made after
 * the choice are not touched (one the call undid stays counted until the process exits). */
struct unbinds {
    uint64_t *ids, *handles; /* n of each, and n freed after the handles */
    struct vgpu_mem_record *before;
    size_t n;
};

/* Out of host memory the bindings stay counted (nothing can say which to give back). */
static struct unbinds unbinds_begin(const struct vgpu_vmm_select *s)
{
    struct unbinds u = {0};
    size_t n = vgpu_vmm_bound_ids(s, NULL, NULL, 0);
    if (n == 0)
        return u;
    u.ids = calloc(n, sizeof *u.ids);
    u.handles = calloc(2 * n, sizeof *u.handles);
    u.before = calloc(n, sizeof *u.before);
    if (u.ids != NULL && u.handles != NULL && u.before != NULL) {
        size_t again = vgpu_vmm_bound_ids(s, u.ids, u.handles, n);
        u.n = again < n ? again : n; /* made meanwhile: left bound */
    } else {
        vgpu_log(VGPU_LOG_ERROR, "out of host memory before an unbind: what it frees stays "
                 "counted until the process exits");
    }
    for (size_t i = 0; i < u.n; i++)
        vgpu_mem_find(VGPU_KIND_HANDLE, u.handles[i], &u.before[i]);
    return u;
}

static void unbinds_end(struct unbinds *u, int done)
{
    uint64_t *freed = u->handles + u->n;
    size_t nfreed = done && u->n != 0 ? vgpu_vmm_unbound(u->ids, u->n, freed, u->n) : 0;
    give_back_freed(freed, nfreed, u->handles, u->before, u->n);
    free(u->ids);
    free(u->handles);
    free(u->before);
}

/* Which tile of its array a map entry names: its subresource's fields and its device mask (a
 * union's other bytes may be anything), as tile_covered reads them. */
static void tile_of(const CUarrayMapInfo *m, uint64_t tile[VGPU_VMM_TILE])
{
    tile[0] = (uint64_t)m->subresourceType | (uint64_t)m->deviceBitMask << 32;
    if (m->subresourceType == CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_SPARSE_LEVEL) {
        tile[1] = m->subresource.sparseLevel.level |
                  (uint64_t)m->subresource.sparseLevel.layer << 32;
        tile[2] = m->subresource.sparseLevel.offsetX |
                  (uint64_t)m->subresource.sparseLevel.offsetY << 32;
        tile[3] = m->subresource.sparseLevel.offsetZ |
                  (uint64_t)m->subresource.sparseLevel.extentWidth << 32;
        tile[4] = m->subresource.sparseLevel.extentHeight |
                  (uint64_t)m->subresource.sparseLevel.extentDepth << 32;
    } else {
        tile[1] = m->subresource.miptail.layer;
        tile[2] = m->subresource.miptail.offset;
        tile[3] = m->subresource.miptail.size;
        tile[4] = 0;
    }
}

/* Whether [at, at + length) lies within [from, from + size). */
static int within(uint64_t at, uint64_t length, uint64_t from, uint64_t size)
{
    return at >= from && at - from <= size && length <= size - (at - from);
}

/* Whether a bound tile (tile_of's words) lies within the tiles an unmap names: the same kind of
 * subresource on the same devices, the same level and layer, its box inside the unmap's (a
 * level mapped tile by tile may be unmapped whole), or its mip tail range inside. */
static int tile_covered(const uint64_t *bound, const uint64_t *unmap)
{
    if (bound[0] != unmap[0] || bound[1] != unmap[1])
        return 0;
    if ((bound[0] & UINT32_MAX) != CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_SPARSE_LEVEL)
        return within(bound[2], bound[3], unmap[2], unmap[3]);
    /* words 2-4: x | y << 32, z | width << 32, height | depth << 32 */
    return within(bound[2] & UINT32_MAX, bound[3] >> 32, unmap[2] & UINT32_MAX, unmap[3] >> 32) &&
           within(bound[2] >> 32, bound[4] & UINT32_MAX, unmap[2] >> 32, unmap[4] & UINT32_MAX) &&
           within(bound[3] & UINT32_MAX, bound[4] >> 32, unmap[3] & UINT32_MAX, unmap[4] >> 32);
}

/* The array or mipmapped array an entry maps into (one union: either is the same pointer). */
static uint64_t array_of(const CUarrayMapInfo *m)
{
    return m->resourceType == CU_RESOURCE_TYPE_MIPMAPPED_ARRAY
               ? (uint64_t)(uintptr_t)m->resource.mipmap
               : (uint64_t)(uintptr_t)m->resource.array;
}

/* cuMemMapArrayAsync through *map, on a copy of the list: the bindings recorded are those the
 * driver is given, whatever another thread writes into the caller's list meanwhile. An unmap
 * undoes the bindings made before the call of the tiles within it (one that covers part of a
 * mapped tile undoes none: counted until the array is destroyed). A list of several entries
 * the driver refuses keeps its maps counted: it may have applied some. */
static CUresult map_array(const char *api,
                          CUresult (*const *map)(CUarrayMapInfo *, unsigned int, CUstream),
                          CUarrayMapInfo *list, unsigned int count, CUstream stream)
{
    if (!ready() || *map == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (vmm_inside(api))
        return CUDA_ERROR_NOT_PERMITTED;
    if (list == NULL || count == 0)
        return (*map)(list, count, stream);
    struct binds p;
    CUarrayMapInfo *copy = malloc((size_t)count * sizeof *copy);
    struct unbinds *unmaps = calloc(count, sizeof *unmaps);
    CUresult rc = CUDA_ERROR_OUT_OF_MEMORY;
    if (binds_begin(&p, count, api) != 0 || copy == NULL || unmaps == NULL) {
        if (copy == NULL || unmaps == NULL)
            no_room_to_bind(api);
        free(copy);
        free(unmaps);
        return binds_end(&p, rc, 0);
    }
    memcpy(copy, list, (size_t)count * sizeof *copy);
    int recorded = 1;
    for (unsigned int i = 0; i < count && recorded; i++) {
        struct vgpu_vmm_binding b = {.holder = array_of(&copy[i]),
                                     .handle = copy[i].memHandle.memHandle, .dev = -1};
        tile_of(&copy[i], b.tile);
        if (copy[i].memOperationType == CU_MEM_OPERATION_TYPE_UNMAP)
            unmaps[i] = unbinds_begin(
                &(struct vgpu_vmm_select){b.holder, 0, 1, -1, b.tile, tile_covered});
        else if (copy[i].memOperationType == CU_MEM_OPERATION_TYPE_MAP &&
                 copy[i].memHandleType == CU_MEM_HANDLE_TYPE_GENERIC)
            recorded = binds_add(&p, &b, "cuMemMapArrayAsync") == 0;
    }
    vgpu_mem_op_begin(); /* unmaps may free memory NVML stops showing before it is given back */
    if (recorded)
        rc = (*map)(copy, count, stream);
    for (unsigned int i = 0; i < count; i++) /* those not begun are all zero: nothing done */
        if (copy[i].memOperationType == CU_MEM_OPERATION_TYPE_UNMAP)
            unbinds_end(&unmaps[i], rc == CUDA_SUCCESS);
    vgpu_mem_op_end();
    free(copy);
    free(unmaps);
    return binds_end(&p, rc, recorded && count > 1);
}

VGPU_EXPORT CUresult cuMemMapArrayAsync(CUarrayMapInfo *list, unsigned int count,
                                        CUstream stream)
{
    return map_array("cuMemMapArrayAsync", &real.cuMemMapArrayAsync, list, count, stream);
}

VGPU_EXPORT CUresult cuMemMapArrayAsync_ptsz(CUarrayMapInfo *list, unsigned int count,
                                             CUstream stream)
{
    return map_array("cuMemMapArrayAsync_ptsz", &real.cuMemMapArrayAsync_ptsz, list, count,
                     stream);
}

static CUresult destroy_array(enum free_api api, uint64_t array)
{
    if (vmm_inside(api == ARRAY_DESTROY ? "cuArrayDestroy" : "cuMipmappedArrayDestroy"))
        return CUDA_ERROR_NOT_PERMITTED;
    struct unbinds u = unbinds_begin(&(struct vgpu_vmm_select){array, 0, UINT64_MAX, -1, NULL, NULL});
    vgpu_mem_op_begin();
    CUresult rc = release_counted(api, array, NULL);
    unbinds_end(&u, rc == CUDA_SUCCESS);
    vgpu_mem_op_end();
    return rc;
}

/* The device a binding of handle is on: dev, or (dev < 0: CUDA 12.1's calls name none) the
 * one its recording names, -1 where it is not counted. */
static int bound_device(uint64_t handle, int dev)
{
    struct vgpu_mem_record rec = {0};
    return dev >= 0 || !vgpu_mem_find(VGPU_KIND_HANDLE, handle, &rec) ? dev : rec.dev;
}

/* Records handle bound to mc at mc_offset (dev as bound_device): 0, or -1 (logged). */
static int bind_handle(struct binds *p, uint64_t mc, int dev, size_t mc_offset,
                       uint64_t handle, const char *api)
{
    if (binds_begin(p, 1, api) != 0)
        return -1;
    struct vgpu_vmm_binding b = {.holder = mc, .at = mc_offset, .handle = handle,
                                 .dev = bound_device(handle, dev)};
    return binds_add(p, &b, api);
}

/* Records every handle mapped over [ptr, ptr + size), wherever in a mapping the range starts,
 * bound to mc at mc_offset: 0, or -1 (logged). */
static int bind_range(struct binds *p, uint64_t mc, int dev, size_t mc_offset, CUdeviceptr ptr,
                      size_t size, const char *api)
{
    *p = (struct binds){0};
    vgpu_vmm_hold(); /* the range's mappings stay as read until they are recorded */
    size_t n = vgpu_vmm_handles_over(ptr, size, NULL, 0);
    uint64_t *handles = calloc(n ? n : 1, sizeof *handles);
    int rc = handles != NULL ? binds_begin(p, n, api) : no_room_to_bind(api);
    n = rc == 0 ? vgpu_vmm_handles_over(ptr, size, handles, n) : 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        struct vgpu_vmm_binding b = {.holder = mc, .at = mc_offset, .handle = handles[i],
                                     .dev = bound_device(handles[i], dev)};
        rc = binds_add(p, &b, api);
    }
    vgpu_vmm_let_go();
    free(handles);
    return rc;
}

VGPU_EXPORT CUresult cuMulticastBindMem(CUmemGenericAllocationHandle mc, size_t mc_offset,
                                        CUmemGenericAllocationHandle handle, size_t offset,
                                        size_t size, unsigned long long flags)
{
    if (!ready() || real.cuMulticastBindMem == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (vmm_inside(__func__))
        return CUDA_ERROR_NOT_PERMITTED;
    struct binds p;
    if (bind_handle(&p, mc, -1, mc_offset, handle, "cuMulticastBindMem") != 0)
        return binds_end(&p, CUDA_ERROR_OUT_OF_MEMORY, 0);
    return binds_end(&p, real.cuMulticastBindMem(mc, mc_offset, handle, offset, size, flags),
                     0);
}

VGPU_EXPORT CUresult cuMulticastBindMem_v2(CUmemGenericAllocationHandle mc, CUdevice dev,
                                           size_t mc_offset, CUmemGenericAllocationHandle handle,
                                           size_t offset, size_t size, unsigned long long flags)
{
    if (!ready() || real.cuMulticastBindMem_v2 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (vmm_inside(__func__))
        return CUDA_ERROR_NOT_PERMITTED;
    struct binds p;
    if (bind_handle(&p, mc, dev, mc_offset, handle, "cuMulticastBindMem") != 0)
        return binds_end(&p, CUDA_ERROR_OUT_OF_MEMORY, 0);
    return binds_end(&p, real.cuMulticastBindMem_v2(mc, dev, mc_offset, handle, offset, size,
                                                    flags), 0);
}

VGPU_EXPORT CUresult cuMulticastBindAddr(CUmemGenericAllocationHandle mc, size_t mc_offset,
                                         CUdeviceptr ptr, size_t size, unsigned long long flags)
{
    if (!ready() || real.cuMulticastBindAddr == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (vmm_inside(__func__))
        return CUDA_ERROR_NOT_PERMITTED;
    struct binds p;
    if (bind_range(&p, mc, -1, mc_offset, ptr, size, "cuMulticastBindAddr") != 0)
        return binds_end(&p, CUDA_ERROR_OUT_OF_MEMORY, 0);
    return binds_end(&p, real.cuMulticastBindAddr(mc, mc_offset, ptr, size, flags), 0);
}

VGPU_EXPORT CUresult cuMulticastBindAddr_v2(CUmemGenericAllocationHandle mc, CUdevice dev,
                                            size_t mc_offset, CUdeviceptr ptr, size_t size,
                                            unsigned long long flags)
{
    if (!ready() || real.cuMulticastBindAddr_v2 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (vmm_inside(__func__))
        return CUDA_ERROR_NOT_PERMITTED;
    struct binds p;
    if (bind_range(&p, mc, dev, mc_offset, ptr, size, "cuMulticastBindAddr") != 0)
        return binds_end(&p, CUDA_ERROR_OUT_OF_MEMORY, 0);
    return binds_end(&p, real.cuMulticastBindAddr_v2(mc, dev, mc_offset, ptr, size, flags), 0);
}

/* The bindings at [mc_offset, mc_offset + size) on dev are undone: their memory may be free. */
VGPU_EXPORT CUresult cuMulticastUnbind(CUmemGenericAllocationHandle mc, CUdevice dev,
                                       size_t mc_offset, size_t size)
{
    if (!ready() || real.cuMulticastUnbind == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (vmm_inside(__func__))
        return CUDA_ERROR_NOT_PERMITTED;
    struct unbinds u = unbinds_begin(&(struct vgpu_vmm_select){mc, mc_offset, size, dev, NULL, NULL});
    vgpu_mem_op_begin();
    CUresult rc = real.cuMulticastUnbind(mc, dev, mc_offset, size);
    unbinds_end(&u, rc == CUDA_SUCCESS);
    vgpu_mem_op_end();
    return rc;
}

/* The mappings cuMemUnmap takes may be the last hold on their memory: the handles' recordings
 * are copied before the call, and those vmm says the unmap freed are given back after it. */
VGPU_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    if (!ready() || real.cuMemUnmap == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (vmm_inside(__func__))
        return CUDA_ERROR_NOT_PERMITTED;
    vgpu_mem_op_begin();
    vgpu_vmm_hold(); /* the range's mappings stay as read here until the bookkeeping after */
    size_t n = vgpu_vmm_handles_in(ptr, size, NULL, 0);
    uint64_t *handles = n != 0 ? calloc(2 * n, sizeof *handles) : NULL; /* and those freed */
    struct vgpu_mem_record *before = n != 0 ? calloc(n, sizeof *before) : NULL;
    CUresult rc = CUDA_ERROR_OUT_OF_MEMORY;
    if (n != 0 && (handles == NULL || before == NULL)) {
        vgpu_log(VGPU_LOG_ERROR, "out of host memory before unmapping memory: refused");
        n = 0;
    } else {
        vgpu_vmm_handles_in(ptr, size, handles, n);
        for (size_t i = 0; i < n; i++)
            vgpu_mem_find(VGPU_KIND_HANDLE, handles[i], &before[i]);
        rc = real.cuMemUnmap(ptr, size);
    }
    if (rc == CUDA_SUCCESS && n != 0) {
        uint64_t *freed = handles + n;
        give_back_freed(freed, vgpu_vmm_unmapped(ptr, size, freed, n), handles, before, n);
    }
    vgpu_vmm_let_go();
    vgpu_mem_op_end();
    free(handles);
    free(before);
    return rc;
}

VGPU_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream)
{
    return release_counted(FREE_ASYNC, dptr, stream);
}

VGPU_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream)
{
    return release_counted(FREE_ASYNC_PTSZ, dptr, stream);
}

uint64_t vgpu_cuda_pool_cache(uintptr_t pool) { return pool_cached((CUmemoryPool)pool); }
