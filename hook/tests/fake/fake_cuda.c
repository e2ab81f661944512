/* fake_cuda.c - a host-only libcuda.so.1 for tests: a few devices with a physical memory
 * size, a per-thread current context, fake device addresses (no backing memory), launch
 * counters with synthetic GPU time, and cuGetProcAddress with the driver's version rules.
 * It resolves its own entry points through a static table, never through dlsym (libvgpu
 * overrides dlsym and would hand back its wrappers). */
#define _GNU_SOURCE
#include <cuda.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_v1.h"
#include "fake_state.h"

#undef cuGetProcAddress
#undef cuMemAdvise

#define EXPORT __attribute__((visibility("default")))

/* Exports cuda.h does not declare in this configuration. */
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *, size_t, CUstream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr, CUstream);
CUresult cuMemAdvise(CUdeviceptr, size_t, CUmem_advise, CUdevice);
CUresult cuLaunchKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, CUstream, void **, void **);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned,
                                        unsigned, unsigned, unsigned, CUstream, void **);
CUresult cuGraphLaunch_ptsz(CUgraphExec, CUstream);

enum { MAX_DEVICES = 8, TABLE_SIZE = 1 << 20 };

struct fake_device {
    uint64_t used;          /* atomic */
    uint64_t busy_until;    /* atomic, CLOCK_MONOTONIC ns */
    uint64_t scheduled;     /* atomic: GPU ns ever queued */
};

struct fake_ctx {
    int dev;
};

EXPORT struct fake_cuda_stats fake_cuda_stats;
EXPORT char fake_cuda_fail_next[64];

static struct fake_device devices[MAX_DEVICES];
static struct fake_ctx primary[MAX_DEVICES];
static __thread struct fake_ctx *current;
static int ndevices = 2;
static uint64_t device_bytes = UINT64_C(16) << 30;
static uint64_t ns_per_block = 1000;
static uint64_t pitch_align = 512;
static int private_answers; /* FAKE_CUDA_GPA_PRIVATE=1: cuGetProcAddress answers with internal
                             * entry points, not the dlsym exports, for a few functions */
static int initialised;

/* live allocations: open addressing, key = address or handle, value = size and device */
struct alloc {
    uint64_t key;
    uint64_t bytes;
    int dev;
};
static struct alloc *table;
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t next_address = UINT64_C(0x7f0000000000);
static uint64_t next_low_address = UINT64_C(0x10000000); /* the v1 exports' 32-bit pointers */
static const uint64_t tombstone = 1;

static uint64_t env_u64(const char *name, uint64_t fallback)
{
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' ? strtoull(v, NULL, 10) : fallback;
}

__attribute__((constructor)) static void fake_setup(void)
{
    ndevices = (int)env_u64("FAKE_CUDA_DEVICES", 2);
    if (ndevices < 1 || ndevices > MAX_DEVICES)
        ndevices = 2;
    device_bytes = env_u64("FAKE_CUDA_MEM_MIB", 16384) << 20;
    ns_per_block = env_u64("FAKE_CUDA_NS_PER_BLOCK", 1000);
    pitch_align = env_u64("FAKE_CUDA_PITCH_ALIGN", 512);
    private_answers = env_u64("FAKE_CUDA_GPA_PRIVATE", 0) != 0;
    if (pitch_align == 0 || (pitch_align & (pitch_align - 1)) != 0)
        pitch_align = 512;
    for (int i = 0; i < MAX_DEVICES; i++)
        primary[i].dev = i;
    table = calloc(TABLE_SIZE, sizeof *table);
}

static int fail_now(const char *name)
{
    if (fake_cuda_fail_next[0] == '\0' || strcmp(fake_cuda_fail_next, name) != 0)
        return 0;
    fake_cuda_fail_next[0] = '\0';
    return 1;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static size_t slot_of(uint64_t key) { return (size_t)((key * UINT64_C(0x9e3779b97f4a7c15)) >> 44); }

/* Records a new allocation of bytes on dev at *next (then moved past it) unless the device is
 * full or the addresses would pass limit; returns its key or 0. */
static uint64_t fake_alloc_at(int dev, uint64_t bytes, uint64_t *next, uint64_t limit)
{
    uint64_t used = __atomic_add_fetch(&devices[dev].used, bytes, __ATOMIC_ACQ_REL);
    pthread_mutex_lock(&table_lock);
    uint64_t key = *next, step = ((bytes + 0xfff) & ~UINT64_C(0xfff)) + (bytes == 0 ? 0x1000 : 0);
    if (used > device_bytes || step > limit - key) {
        pthread_mutex_unlock(&table_lock);
        __atomic_sub_fetch(&devices[dev].used, bytes, __ATOMIC_ACQ_REL);
        return 0;
    }
    *next += step;
    size_t i = slot_of(key);
    while (table[i].key > tombstone)
        i = (i + 1) & (TABLE_SIZE - 1);
    table[i] = (struct alloc){.key = key, .bytes = bytes, .dev = dev};
    pthread_mutex_unlock(&table_lock);
    return key;
}

static uint64_t fake_alloc(int dev, uint64_t bytes)
{
    return fake_alloc_at(dev, bytes, &next_address, UINT64_MAX);
}

static CUresult fake_free(uint64_t key)
{
    __atomic_add_fetch(&fake_cuda_stats.free_calls, 1, __ATOMIC_RELAXED);
    if (key <= tombstone)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&table_lock);
    size_t i = slot_of(key);
    while (table[i].key != 0 && table[i].key != key)
        i = (i + 1) & (TABLE_SIZE - 1);
    if (table[i].key != key) {
        pthread_mutex_unlock(&table_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct alloc a = table[i];
    table[i].key = tombstone;
    pthread_mutex_unlock(&table_lock);
    __atomic_sub_fetch(&devices[a.dev].used, a.bytes, __ATOMIC_ACQ_REL);
    return CUDA_SUCCESS;
}

static CUresult need_ctx(void)
{
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    return current != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

/* ---- init, devices, contexts -------------------------------------------------------------- */

EXPORT CUresult cuInit(unsigned int flags)
{
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    initialised = 1;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int *version)
{
    *version = 13000;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetExportTable(const void **table_out, const CUuuid *id)
{
    (void)table_out;
    (void)id;
    return CUDA_ERROR_NOT_SUPPORTED;
}

EXPORT CUresult cuDeviceGetCount(int *count)
{
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    *count = ndevices;
    return CUDA_SUCCESS;
}

/* The driver's answer to a call that names device dev after cuInit. */
static CUresult need_device(int dev)
{
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    return dev >= 0 && dev < ndevices ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

EXPORT CUresult cuDeviceGet(CUdevice *dev, int ordinal)
{
    CUresult rc = need_device(ordinal);
    if (rc == CUDA_SUCCESS)
        *dev = ordinal;
    return rc;
}

EXPORT void fake_cuda_uuid(int dev, unsigned char out[16])
{
    for (int i = 0; i < 16; i++)
        out[i] = (unsigned char)(0x10 * (dev + 1) + i);
}

EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    if (dev < 0 || dev >= ndevices)
        return CUDA_ERROR_INVALID_DEVICE;
    fake_cuda_uuid(dev, (unsigned char *)uuid->bytes);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    if (dev < 0 || dev >= ndevices)
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = device_bytes;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev)
{
    CUresult rc = need_device(dev);
    if (rc == CUDA_SUCCESS)
        *ctx = (CUcontext)&primary[dev];
    return rc;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    current = (struct fake_ctx *)ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *ctx)
{
    *ctx = (CUcontext)current;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *dev)
{
    CUresult rc = need_ctx();
    if (rc == CUDA_SUCCESS)
        *dev = current->dev;
    return rc;
}

static CUresult wait_idle(void)
{
    CUresult rc = need_ctx();
    if (rc != CUDA_SUCCESS)
        return rc;
    uint64_t until = __atomic_load_n(&devices[current->dev].busy_until, __ATOMIC_ACQUIRE);
    uint64_t now = now_ns();
    if (until > now) {
        struct timespec ts = {.tv_sec = (time_t)((until - now) / 1000000000u),
                              .tv_nsec = (long)((until - now) % 1000000000u)};
        nanosleep(&ts, NULL);
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSynchronize(void) { return wait_idle(); }

EXPORT CUresult cuStreamSynchronize(CUstream stream)
{
    (void)stream;
    return wait_idle();
}

/* ---- memory ------------------------------------------------------------------------------- */

static CUresult alloc_on(int dev, CUdeviceptr *dptr, size_t bytes, const char *name)
{
    if (fail_now(name))
        return CUDA_ERROR_UNKNOWN;
    uint64_t key = fake_alloc(dev, bytes);
    if (key == 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *dptr = (CUdeviceptr)key;
    return CUDA_SUCCESS;
}

static CUresult alloc_current(CUdeviceptr *dptr, size_t bytes, const char *name)
{
    CUresult rc = need_ctx();
    return rc != CUDA_SUCCESS ? rc : alloc_on(current->dev, dptr, bytes, name);
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes)
{
    return alloc_current(dptr, bytes, "cuMemAlloc_v2");
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    if (fail_now("cuMemFree_v2")) {
        __atomic_add_fetch(&fake_cuda_stats.free_calls, 1, __ATOMIC_RELAXED);
        return CUDA_ERROR_UNKNOWN;
    }
    return fake_free(dptr);
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags)
{
    (void)flags;
    return alloc_current(dptr, bytes, "cuMemAllocManaged");
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                   unsigned int elem)
{
    if (elem != 4 && elem != 8 && elem != 16)
        return CUDA_ERROR_INVALID_VALUE;
    size_t p = (width + pitch_align - 1) & ~(size_t)(pitch_align - 1);
    CUresult rc = alloc_current(dptr, p * height, "cuMemAllocPitch_v2");
    if (rc == CUDA_SUCCESS)
        *pitch = p;
    return rc;
}

static uint64_t array_size(size_t w, size_t h, size_t d, unsigned ch, CUarray_format f)
{
    uint64_t elem = f == CU_AD_FORMAT_FLOAT ? 4 : f == CU_AD_FORMAT_HALF ? 2 : 1;
    return (uint64_t)w * (h ? h : 1) * (d ? d : 1) * ch * elem;
}

EXPORT CUresult cuArrayCreate_v2(CUarray *array, const CUDA_ARRAY_DESCRIPTOR *desc)
{
    CUdeviceptr key;
    CUresult rc = alloc_current(&key, array_size(desc->Width, desc->Height, 1, desc->NumChannels,
                                                 desc->Format), "cuArrayCreate_v2");
    if (rc == CUDA_SUCCESS)
        *array = (CUarray)(uintptr_t)key;
    return rc;
}

EXPORT CUresult cuArray3DCreate_v2(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
    CUdeviceptr key;
    CUresult rc = alloc_current(&key, array_size(desc->Width, desc->Height, desc->Depth,
                                                 desc->NumChannels, desc->Format),
                                "cuArray3DCreate_v2");
    if (rc == CUDA_SUCCESS)
        *array = (CUarray)(uintptr_t)key;
    return rc;
}

EXPORT CUresult cuArrayDestroy(CUarray array) { return fake_free((uint64_t)(uintptr_t)array); }

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t bytes,
                            const CUmemAllocationProp *prop, unsigned long long flags)
{
    (void)flags;
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (prop == NULL || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        prop->location.id < 0 || prop->location.id >= ndevices)
        return CUDA_ERROR_INVALID_DEVICE;
    CUdeviceptr key;
    CUresult rc = alloc_on(prop->location.id, &key, bytes, "cuMemCreate");
    if (rc == CUDA_SUCCESS)
        *handle = key;
    return rc;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) { return fake_free(handle); }

/* The fake never calls its own exports: under libvgpu those calls would reach the wrappers. */
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream stream)
{
    (void)stream;
    return alloc_current(dptr, bytes, "cuMemAllocAsync");
}

EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream stream)
{
    (void)stream;
    __atomic_add_fetch(&fake_cuda_stats.async_ptsz_calls, 1, __ATOMIC_RELAXED);
    return alloc_current(dptr, bytes, "cuMemAllocAsync");
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool,
                                        CUstream stream)
{
    (void)pool;
    (void)stream;
    return alloc_current(dptr, bytes, "cuMemAllocFromPoolAsync");
}

EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool,
                                             CUstream stream)
{
    (void)pool;
    (void)stream;
    __atomic_add_fetch(&fake_cuda_stats.async_ptsz_calls, 1, __ATOMIC_RELAXED);
    return alloc_current(dptr, bytes, "cuMemAllocFromPoolAsync");
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream)
{
    (void)stream;
    return fake_free(dptr);
}

EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream)
{
    (void)stream;
    __atomic_add_fetch(&fake_cuda_stats.async_ptsz_calls, 1, __ATOMIC_RELAXED);
    return fake_free(dptr);
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    CUresult rc = need_ctx();
    if (rc != CUDA_SUCCESS)
        return rc;
    uint64_t used = __atomic_load_n(&devices[current->dev].used, __ATOMIC_ACQUIRE);
    *free_bytes = (size_t)(device_bytes - used);
    *total_bytes = (size_t)device_bytes;
    return CUDA_SUCCESS;
}

/* ---- the legacy v1 exports ------------------------------------------------------------------ */

static unsigned int clamp32(uint64_t v) { return v > UINT32_MAX ? UINT32_MAX : (unsigned int)v; }

static CUresult alloc_v1(v1_ptr *dptr, uint64_t bytes, const char *name)
{
    CUresult rc = need_ctx();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (fail_now(name))
        return CUDA_ERROR_UNKNOWN;
    uint64_t key = fake_alloc_at(current->dev, bytes, &next_low_address, UINT32_MAX);
    if (key == 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *dptr = (v1_ptr)key;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAlloc(v1_ptr *dptr, unsigned int bytes)
{
    return alloc_v1(dptr, bytes, "cuMemAlloc");
}

EXPORT CUresult cuMemAllocPitch(v1_ptr *dptr, unsigned int *pitch, unsigned int width,
                                unsigned int height, unsigned int elem)
{
    if (elem != 4 && elem != 8 && elem != 16)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t p = (width + pitch_align - 1) & ~(uint64_t)(pitch_align - 1);
    CUresult rc = alloc_v1(dptr, p * height, "cuMemAllocPitch");
    if (rc == CUDA_SUCCESS)
        *pitch = (unsigned int)p;
    return rc;
}

EXPORT CUresult cuMemFree(v1_ptr dptr) { return fake_free(dptr); }

EXPORT CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total_bytes)
{
    size_t free_b, total_b;
    CUresult rc = cuMemGetInfo_v2(&free_b, &total_b);
    if (rc == CUDA_SUCCESS) {
        *free_bytes = clamp32(free_b);
        *total_bytes = clamp32(total_b);
    }
    return rc;
}

EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    size_t total;
    CUresult rc = cuDeviceTotalMem_v2(&total, dev);
    if (rc == CUDA_SUCCESS)
        *bytes = clamp32(total);
    return rc;
}

EXPORT CUresult cuArrayCreate(CUarray *array, const struct array_v1 *desc)
{
    v1_ptr key;
    CUresult rc = alloc_v1(&key, array_size(desc->Width, desc->Height, 1, desc->NumChannels,
                                            desc->Format), "cuArrayCreate");
    if (rc == CUDA_SUCCESS)
        *array = (CUarray)(uintptr_t)key;
    return rc;
}

EXPORT CUresult cuArray3DCreate(CUarray *array, const struct array3d_v1 *desc)
{
    v1_ptr key;
    CUresult rc = alloc_v1(&key, array_size(desc->Width, desc->Height, desc->Depth,
                                            desc->NumChannels, desc->Format), "cuArray3DCreate");
    if (rc == CUDA_SUCCESS)
        *array = (CUarray)(uintptr_t)key;
    return rc;
}

/* Two ABIs of one name, for the cuGetProcAddress version tests: v1 takes a device ordinal. */
EXPORT CUresult cuMemAdvise(CUdeviceptr ptr, size_t count, CUmem_advise advice, CUdevice dev)
{
    (void)ptr, (void)count, (void)advice;
    return dev >= 0 && dev < ndevices ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

EXPORT CUresult cuMemAdvise_v2(CUdeviceptr ptr, size_t count, CUmem_advise advice,
                               CUmemLocation location)
{
    (void)ptr, (void)count, (void)advice;
    return location.type == CU_MEM_LOCATION_TYPE_DEVICE ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- launches ----------------------------------------------------------------------------- */

static CUresult launch(enum fake_launch_variant variant, uint64_t blocks)
{
    CUresult rc = need_ctx();
    if (rc != CUDA_SUCCESS)
        return rc;
    __atomic_add_fetch(&fake_cuda_stats.launches[variant], 1, __ATOMIC_RELAXED);
    if (ns_per_block == 0)
        return CUDA_SUCCESS;
    struct fake_device *d = &devices[current->dev];
    uint64_t work = blocks * ns_per_block, now = now_ns();
    uint64_t until = __atomic_load_n(&d->busy_until, __ATOMIC_ACQUIRE), next;
    do {
        next = (until > now ? until : now) + work;
    } while (!__atomic_compare_exchange_n(&d->busy_until, &until, next, 1, __ATOMIC_ACQ_REL,
                                          __ATOMIC_ACQUIRE));
    __atomic_add_fetch(&d->scheduled, work, __ATOMIC_ACQ_REL);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned shmem, CUstream stream,
                               void **params, void **extra)
{
    (void)f, (void)bx, (void)by, (void)bz, (void)shmem, (void)stream, (void)params, (void)extra;
    return launch(FAKE_LAUNCH, (uint64_t)gx * gy * gz);
}

EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                    unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                                    CUstream stream, void **params, void **extra)
{
    (void)f, (void)bx, (void)by, (void)bz, (void)shmem, (void)stream, (void)params, (void)extra;
    return launch(FAKE_LAUNCH_PTSZ, (uint64_t)gx * gy * gz);
}

EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **p, void **e)
{
    (void)f, (void)p, (void)e;
    return launch(FAKE_LAUNCH_EX, (uint64_t)c->gridDimX * c->gridDimY * c->gridDimZ);
}

EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **p, void **e)
{
    (void)f, (void)p, (void)e;
    return launch(FAKE_LAUNCH_EX_PTSZ, (uint64_t)c->gridDimX * c->gridDimY * c->gridDimZ);
}

EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                          unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                                          CUstream stream, void **params)
{
    (void)f, (void)bx, (void)by, (void)bz, (void)shmem, (void)stream, (void)params;
    return launch(FAKE_LAUNCH_COOP, (uint64_t)gx * gy * gz);
}

EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy,
                                               unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                               unsigned shmem, CUstream stream, void **params)
{
    (void)f, (void)bx, (void)by, (void)bz, (void)shmem, (void)stream, (void)params;
    return launch(FAKE_LAUNCH_COOP_PTSZ, (uint64_t)gx * gy * gz);
}

EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream)
{
    (void)exec, (void)stream;
    return launch(FAKE_GRAPH, 100);
}

EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream)
{
    (void)exec, (void)stream;
    return launch(FAKE_GRAPH_PTSZ, 100);
}

/* ---- test-only accessors ------------------------------------------------------------------ */

EXPORT uint64_t fake_cuda_device_used(int dev)
{
    return __atomic_load_n(&devices[dev].used, __ATOMIC_ACQUIRE);
}

EXPORT uint64_t fake_cuda_device_total(int dev)
{
    (void)dev;
    return device_bytes;
}

EXPORT int fake_cuda_device_count(void) { return ndevices; }

EXPORT uint64_t fake_cuda_busy_ns(int dev)
{
    struct fake_device *d = &devices[dev];
    uint64_t scheduled = __atomic_load_n(&d->scheduled, __ATOMIC_ACQUIRE);
    uint64_t until = __atomic_load_n(&d->busy_until, __ATOMIC_ACQUIRE), now = now_ns();
    uint64_t pending = until > now ? until - now : 0;
    return scheduled > pending ? scheduled - pending : 0;
}

/* ---- cuGetProcAddress --------------------------------------------------------------------- */

struct proc {
    const char *base;   /* the name callers ask for */
    const char *export; /* the exported symbol it resolves to */
    int since;          /* first CUDA version (1000*major + 10*minor) with this ABI */
    int per_thread;     /* 1 for the _ptsz/_ptds flavour */
    void *fn;
};

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags);
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                    cuuint64_t flags, CUdriverProcAddressQueryResult *status);

#define P(base, export, since, pt) {base, #export, since, pt, (void *)export}
static const struct proc procs[] = {
    P("cuInit", cuInit, 2000, 0),
    P("cuDriverGetVersion", cuDriverGetVersion, 2020, 0),
    P("cuGetExportTable", cuGetExportTable, 3000, 0),
    P("cuGetProcAddress", cuGetProcAddress, 11030, 0),
    P("cuGetProcAddress", cuGetProcAddress_v2, 12000, 0),
    P("cuDeviceGetCount", cuDeviceGetCount, 2000, 0),
    P("cuDeviceGet", cuDeviceGet, 2000, 0),
    P("cuDeviceGetUuid", cuDeviceGetUuid_v2, 11040, 0),
    P("cuDeviceTotalMem", cuDeviceTotalMem_v2, 3020, 0),
    P("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain, 7000, 0),
    P("cuCtxSetCurrent", cuCtxSetCurrent, 4000, 0),
    P("cuCtxGetCurrent", cuCtxGetCurrent, 4000, 0),
    P("cuCtxGetDevice", cuCtxGetDevice, 2000, 0),
    P("cuCtxSynchronize", cuCtxSynchronize, 2000, 0),
    P("cuStreamSynchronize", cuStreamSynchronize, 2000, 0),
    P("cuMemAlloc", cuMemAlloc, 2000, 0),
    P("cuMemFree", cuMemFree, 2000, 0),
    P("cuMemAllocPitch", cuMemAllocPitch, 2000, 0),
    P("cuMemGetInfo", cuMemGetInfo, 2000, 0),
    P("cuDeviceTotalMem", cuDeviceTotalMem, 2000, 0),
    P("cuArrayCreate", cuArrayCreate, 2000, 0),
    P("cuArray3DCreate", cuArray3DCreate, 2000, 0),
    P("cuMemAlloc", cuMemAlloc_v2, 3020, 0),
    P("cuMemFree", cuMemFree_v2, 3020, 0),
    P("cuMemAllocPitch", cuMemAllocPitch_v2, 3020, 0),
    P("cuMemAllocManaged", cuMemAllocManaged, 6000, 0),
    P("cuArrayCreate", cuArrayCreate_v2, 3020, 0),
    P("cuArray3DCreate", cuArray3DCreate_v2, 3020, 0),
    P("cuArrayDestroy", cuArrayDestroy, 2000, 0),
    P("cuMemCreate", cuMemCreate, 10020, 0),
    P("cuMemRelease", cuMemRelease, 10020, 0),
    P("cuMemAllocAsync", cuMemAllocAsync, 11020, 0),
    P("cuMemAllocAsync", cuMemAllocAsync_ptsz, 11020, 1),
    P("cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync, 11020, 0),
    P("cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync_ptsz, 11020, 1),
    P("cuMemFreeAsync", cuMemFreeAsync, 11020, 0),
    P("cuMemFreeAsync", cuMemFreeAsync_ptsz, 11020, 1),
    P("cuMemGetInfo", cuMemGetInfo_v2, 3020, 0),
    P("cuMemAdvise", cuMemAdvise, 8000, 0),
    P("cuMemAdvise", cuMemAdvise_v2, 12020, 0),
    P("cuLaunchKernel", cuLaunchKernel, 4000, 0),
    P("cuLaunchKernel", cuLaunchKernel_ptsz, 7000, 1),
    P("cuLaunchKernelEx", cuLaunchKernelEx, 11060, 0),
    P("cuLaunchKernelEx", cuLaunchKernelEx_ptsz, 11060, 1),
    P("cuLaunchCooperativeKernel", cuLaunchCooperativeKernel, 9000, 0),
    P("cuLaunchCooperativeKernel", cuLaunchCooperativeKernel_ptsz, 9000, 1),
    P("cuGraphLaunch", cuGraphLaunch, 10000, 0),
    P("cuGraphLaunch", cuGraphLaunch_ptsz, 10000, 1),
};
#undef P

/* Internal entry points with the same ABI as the exports (FAKE_CUDA_GPA_PRIVATE=1). */
static CUresult private_cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes)
{
    return alloc_current(dptr, bytes, "cuMemAlloc_v2");
}

static CUresult private_cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                            unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                                            CUstream stream, void **params, void **extra)
{
    (void)f, (void)bx, (void)by, (void)bz, (void)shmem, (void)stream, (void)params, (void)extra;
    return launch(FAKE_LAUNCH_PTSZ, (uint64_t)gx * gy * gz);
}

static CUresult get_proc(const char *symbol, void **pfn, int version, cuuint64_t flags,
                         CUdriverProcAddressQueryResult *status);

static CUresult private_cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                            cuuint64_t flags,
                                            CUdriverProcAddressQueryResult *status)
{
    return get_proc(symbol, pfn, version, flags, status);
}

static void *private_answer(void *fn)
{
    if (fn == (void *)cuMemAlloc_v2)
        return (void *)private_cuMemAlloc_v2;
    if (fn == (void *)cuLaunchKernel_ptsz)
        return (void *)private_cuLaunchKernel_ptsz;
    if (fn == (void *)cuGetProcAddress_v2)
        return (void *)private_cuGetProcAddress_v2;
    return fn;
}

static const struct proc *select_proc(const char *symbol, int version, int per_thread,
                                      int *known)
{
    const struct proc *best = NULL, *best_pt = NULL;
    *known = 0;
    for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++) {
        const struct proc *p = &procs[i];
        if (strcmp(p->base, symbol) != 0)
            continue;
        *known = 1;
        if (p->since > version)
            continue;
        const struct proc **slot = p->per_thread ? &best_pt : &best;
        if (*slot == NULL || (*slot)->since < p->since)
            *slot = p;
    }
    return per_thread && best_pt != NULL ? best_pt : best;
}

static CUresult get_proc(const char *symbol, void **pfn, int version, cuuint64_t flags,
                         CUdriverProcAddressQueryResult *status)
{
    if (symbol == NULL || pfn == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    int known;
    const struct proc *p = select_proc(symbol, version,
                                       (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0,
                                       &known);
    *pfn = p == NULL ? NULL : private_answers ? private_answer(p->fn) : p->fn;
    if (status != NULL)
        *status = p != NULL ? CU_GET_PROC_ADDRESS_SUCCESS
                : known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                        : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return p != NULL ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                    cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
    return get_proc(symbol, pfn, version, flags, status);
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
    return get_proc(symbol, pfn, version, flags, NULL);
}

EXPORT void *fake_cuda_entry(const char *name)
{
    for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++)
        if (strcmp(procs[i].export, name) == 0)
            return procs[i].fn;
    return NULL;
}
