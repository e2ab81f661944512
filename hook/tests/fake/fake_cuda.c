/* fake_cuda.c - a host-only libcuda.so.1 for tests: a few devices with a physical memory
 * size, a per-thread current context, fake device addresses (no backing memory), launch
 * counters with synthetic GPU time shared between processes (fake_gpu.h), CUDA graphs that
 * know their cost, and cuGetProcAddress with the driver's version rules.
 * It resolves its own entry points through a static table, never through dlsym (libvgpu
 * overrides dlsym and would hand back its wrappers). */
#define _GNU_SOURCE
#include <cuda.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_13.h"
#include "cuda_v1.h"
#include "fake_gpu.h"
#include "fake_state.h"

#undef cuGetProcAddress
#undef cuMemAdvise

#define EXPORT __attribute__((visibility("default")))

/* Exports cuda.h does not declare in this configuration. */
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *, size_t, CUstream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr, CUstream);
CUresult cuMemMapArrayAsync_ptsz(CUarrayMapInfo *, unsigned int, CUstream);
CUresult cuStreamIsCapturing_ptsz(CUstream, CUstreamCaptureStatus *);
CUresult cuStreamSynchronize_ptsz(CUstream);
CUresult cuStreamQuery_ptsz(CUstream);
CUresult cuEventRecord_ptsz(CUevent, CUstream);
CUresult cuEventRecordWithFlags_ptsz(CUevent, CUstream, unsigned int);
CUresult cuMemcpyDtoH_v2_ptds(void *, CUdeviceptr, size_t);
CUresult cuMemcpy_ptds(CUdeviceptr, CUdeviceptr, size_t);
CUresult cuMemsetD8_v2_ptds(CUdeviceptr, unsigned char, size_t);
CUresult cuMemsetD16_v2_ptds(CUdeviceptr, unsigned short, size_t);
CUresult cuMemsetD32_v2_ptds(CUdeviceptr, unsigned int, size_t);
CUresult cuMemsetD2D8_v2_ptds(CUdeviceptr, size_t, unsigned char, size_t, size_t);
CUresult cuMemsetD2D16_v2_ptds(CUdeviceptr, size_t, unsigned short, size_t, size_t);
CUresult cuMemsetD2D32_v2_ptds(CUdeviceptr, size_t, unsigned int, size_t, size_t);
CUresult cuMemsetD8Async_ptsz(CUdeviceptr, unsigned char, size_t, CUstream);
CUresult cuMemsetD16Async_ptsz(CUdeviceptr, unsigned short, size_t, CUstream);
CUresult cuMemsetD32Async_ptsz(CUdeviceptr, unsigned int, size_t, CUstream);
CUresult cuMemsetD2D8Async_ptsz(CUdeviceptr, size_t, unsigned char, size_t, size_t, CUstream);
CUresult cuMemsetD2D16Async_ptsz(CUdeviceptr, size_t, unsigned short, size_t, size_t, CUstream);
CUresult cuMemsetD2D32Async_ptsz(CUdeviceptr, size_t, unsigned int, size_t, size_t, CUstream);
CUresult cuMemAdvise(CUdeviceptr, size_t, CUmem_advise, CUdevice);
CUresult cuLaunchKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, CUstream, void **, void **);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned,
                                        unsigned, unsigned, unsigned, CUstream, void **);
CUresult cuGraphLaunch_ptsz(CUgraphExec, CUstream);
CUresult cuGraphUpload_ptsz(CUgraphExec, CUstream);
CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream, CUstreamCaptureStatus *, cuuint64_t *, CUgraph *,
                                        const CUgraphNode **, size_t *);

enum { MAX_DEVICES = GPU_MAX_DEVICES, TABLE_SIZE = 1 << 20 };

enum { CTX_MAGIC = 0x43545846 };

struct fake_ctx {
    int dev;
    int magic;              /* CTX_MAGIC for a cuCtxCreate context (0 for the primary ones) */
    int limits_set;         /* 0: the driver's defaults (a new context's); else limits[] */
    size_t limits[3];       /* stack, printf FIFO, malloc heap: each context has its own */
};

EXPORT struct fake_cuda_stats fake_cuda_stats;
EXPORT char fake_cuda_fail_next[64];

static struct fake_ctx primary[MAX_DEVICES];
static __thread struct fake_ctx *current;
static int ndevices = 2;  /* CUDA's devices: those CUDA_VISIBLE_DEVICES leaves visible */
static int nphysical = 2; /* the GPUs (NVML's): FAKE_CUDA_DEVICES, or one per FAKE_CUDA_UUIDS */
static unsigned char uuids[MAX_DEVICES][16]; /* of each GPU */
static uint64_t device_bytes = UINT64_C(16) << 30;
static uint64_t ns_per_block = 1000;
static uint64_t pitch_align = 512;
static int no_stream_device; /* FAKE_CUDA_NO_STREAM_DEVICE=1: see cuStreamGetDevice */
static int no_stream_ctx_v2; /* FAKE_CUDA_NO_STREAM_CTX_V2=1: see cuStreamGetCtx_v2 */
static int contexts_together; /* FAKE_CUDA_CONTEXTS_TOGETHER: see cuDevicePrimaryCtxRetain */
static int private_answers; /* FAKE_CUDA_GPA_PRIVATE=1: cuGetProcAddress answers with internal
                             * entry points, not the dlsym exports, for a few functions */
static uint64_t refuse_ns; /* FAKE_CUDA_REFUSE_US: a refused launch or memset takes that long,
                           * as a driver's checks take some (0 by default) */
static int v1_as_v2; /* FAKE_CUDA_GPA_V1_AS_V2=1: it answers a CUDA 2.0 ABI asked for with the
                      * export of CUDA 3.2's, as a driver without the old ABI might */
static int initialised;

/* live allocations: open addressing, key = address or handle, value = size, device and the
 * process whose memory it is (a fork child's copy of the table holds its parent's too) */
struct alloc {
    uint64_t key;
    uint64_t bytes;
    int dev;
    int32_t pid;
    int pooled; /* from a pool: its free goes back to the pool's cache */
    int alias;  /* which of fake_cuda_pool_aliases names its pool (0: the pool itself) */
    int managed; /* from cuMemAllocManaged */
    uint32_t refs, maps; /* a cuMemCreate handle's references and mappings (cuMemRelease) */
    const struct fake_ctx *owner; /* freed with this context (NULL: a cuMemCreate handle or a
                                   * stream-ordered allocation, no context's) */
};
static struct alloc *table;
/* Set by a test: a pool serves nothing from its cache, as if what it holds were in blocks too
 * small for any request. */
EXPORT int fake_cuda_pool_fragmented;
/* Set by a test (at most MAX_ALIASES): stream-ordered allocations name that many pools in turn
 * (CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE), all the device's one pool underneath: each answers
 * for the pool's cache as a whole. */
enum { MAX_ALIASES = 16 };
EXPORT int fake_cuda_pool_aliases;
static int pool_aliases[MAX_DEVICES][MAX_ALIASES];
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
/* Where the addresses of plain allocations, and of the v1 exports' 32-bit ones, begin. */
static const uint64_t first_address = UINT64_C(0x7f0000000000);
static const uint64_t first_low_address = UINT64_C(0x10000000);
static uint64_t next_address = UINT64_C(0x7f0000000000);  /* first_address */
static uint64_t next_low_address = UINT64_C(0x10000000); /* first_low_address */
static const uint64_t tombstone = 1;

/* Each device's default pool, this process's: what it holds and what it caches. A stream-
 * ordered free keeps the memory in the pool (NVML still shows it), a later allocation is served
 * from the cache without new device memory, and a synchronisation gives back what the cache
 * holds above the release threshold (0 by default: all of it); cuMemPoolTrimTo gives it back
 * at once. Under table_lock. */
struct pool {
    uint64_t used, cached, threshold;
};
static struct pool pools[MAX_DEVICES];

/* This process's references to each primary context, and whether it exists now (a reset
 * destroys it and keeps the references). Under primary_lock. */
static int primary_refs[MAX_DEVICES], primary_active[MAX_DEVICES];
/* Destroyed (reset, or released for the last time) and not retained since: a thread it is
 * still current to gets CUDA_ERROR_CONTEXT_IS_DESTROYED ("a primary context which has not yet
 * been initialized", cuda.h). */
static int primary_gone[MAX_DEVICES];
static pthread_mutex_t primary_lock = PTHREAD_MUTEX_INITIALIZER;

/* An address freed with its context, handed out again by the next allocation that fits in it,
 * as a driver reuses its address space (under table_lock). */
static uint64_t reuse_key, reuse_step;

/* A fork child holds none of its parent's pooled memory or contexts. */
static void forget_pools(void)
{
    memset(pools, 0, sizeof pools);
    memset(primary_refs, 0, sizeof primary_refs);
    memset(primary_active, 0, sizeof primary_active);
    memset(primary_gone, 0, sizeof primary_gone);
    pthread_mutex_init(&primary_lock, NULL);
    reuse_key = reuse_step = 0;
}

static void format_uuid(const unsigned char b[16], char out[48])
{
    snprintf(out, 48, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12],
             b[13], b[14], b[15]);
}

/* FAKE_CUDA_UUIDS=GPU-...,GPU-...: the GPUs' UUIDs (as a container runtime would expose the
 * ones NVIDIA_VISIBLE_DEVICES names); else FAKE_CUDA_DEVICES GPUs with made-up UUIDs. */
static void set_up_gpus(void)
{
    nphysical = (int)gpu_env("FAKE_CUDA_DEVICES", 2);
    if (nphysical < 1 || nphysical > MAX_DEVICES)
        nphysical = 2;
    for (int d = 0; d < MAX_DEVICES; d++) {
        for (int i = 0; i < 16; i++)
            uuids[d][i] = (unsigned char)(0x10 * (d + 1) + i);
        if (d >= 15) /* 0x10 * (d + 1) wrapped: a first byte no GPU before has */
            uuids[d][0] = (unsigned char)(d - 14);
    }
    const char *list = getenv("FAKE_CUDA_UUIDS");
    if (list == NULL || list[0] == '\0')
        return;
    int n = 0;
    for (const char *at = list; n < MAX_DEVICES && *at != '\0'; n++) {
        unsigned int b[16];
        if (sscanf(at, "GPU-%2x%2x%2x%2x-%2x%2x-%2x%2x-%2x%2x-%2x%2x%2x%2x%2x%2x", &b[0], &b[1],
                   &b[2], &b[3], &b[4], &b[5], &b[6], &b[7], &b[8], &b[9], &b[10], &b[11], &b[12],
                   &b[13], &b[14], &b[15]) != 16) {
            fprintf(stderr, "fake libcuda: FAKE_CUDA_UUIDS: not a GPU UUID at '%s'\n", at);
            abort();
        }
        for (int i = 0; i < 16; i++)
            uuids[n][i] = (unsigned char)b[i];
        const char *comma = strchr(at, ',');
        at = comma != NULL ? comma + 1 : at + strlen(at);
    }
    nphysical = n;
}

/* The GPU a CUDA_VISIBLE_DEVICES entry names (an index, or a GPU UUID or a prefix of one that
 * only one GPU has), or -1. */
static int named_gpu(const char *entry, size_t len)
{
    if (len > 4 && strncmp(entry, "GPU-", 4) == 0) {
        int found = -1;
        for (int d = 0; d < nphysical; d++) {
            char text[48];
            format_uuid(uuids[d], text);
            if (strncmp(text, entry, len) == 0) {
                if (found >= 0)
                    return -1;
                found = d;
            }
        }
        return found;
    }
    int index = 0;
    for (size_t i = 0; i < len; i++) {
        if (entry[i] < '0' || entry[i] > '9' || index > MAX_DEVICES)
            return -1;
        index = index * 10 + (entry[i] - '0');
    }
    return len > 0 && index < nphysical ? index : -1;
}

/* CUDA_VISIBLE_DEVICES as the driver reads it: the GPUs named, in that order, up to the first
 * entry that names none or one named already. Unset: every GPU in order. */
static void set_up_ordinals(void)
{
    const char *list = getenv("CUDA_VISIBLE_DEVICES");
    ndevices = 0;
    if (list == NULL) {
        for (; ndevices < nphysical; ndevices++)
            gpu_physical[ndevices] = ndevices;
        return;
    }
    for (const char *at = list; *at != '\0' && ndevices < nphysical;) {
        size_t len = strcspn(at, ",");
        int found = named_gpu(at, len);
        for (int i = 0; found >= 0 && i < ndevices; i++)
            if (gpu_physical[i] == found)
                found = -1;
        if (found < 0)
            break;
        gpu_physical[ndevices++] = found;
        at += len + (at[len] == ',');
    }
}

__attribute__((constructor)) static void fake_setup(void)
{
    set_up_gpus();
    set_up_ordinals();
    device_bytes = gpu_env("FAKE_CUDA_MEM_MIB", 16384) << 20;
    ns_per_block = gpu_env("FAKE_CUDA_NS_PER_BLOCK", 1000);
    pitch_align = gpu_env("FAKE_CUDA_PITCH_ALIGN", 512);
    private_answers = gpu_env("FAKE_CUDA_GPA_PRIVATE", 0) != 0;
    v1_as_v2 = gpu_env("FAKE_CUDA_GPA_V1_AS_V2", 0) != 0;
    refuse_ns = gpu_env("FAKE_CUDA_REFUSE_US", 0) * 1000;
    no_stream_device = gpu_env("FAKE_CUDA_NO_STREAM_DEVICE", 0) != 0;
    no_stream_ctx_v2 = gpu_env("FAKE_CUDA_NO_STREAM_CTX_V2", 0) != 0;
    contexts_together = (int)gpu_env("FAKE_CUDA_CONTEXTS_TOGETHER", 0);
    if (pitch_align == 0 || (pitch_align & (pitch_align - 1)) != 0)
        pitch_align = 512;
    gpu_total_bytes = device_bytes;
    for (int i = 0; i < MAX_DEVICES; i++)
        primary[i].dev = i;
    table = calloc(TABLE_SIZE, sizeof *table);
    pthread_atfork(NULL, NULL, forget_pools);
}

/* fake_cuda_inside_fn runs once inside the next call of the entry point fake_cuda_inside names:
 * a test's way to have another thread's call land while one is inside the driver. */
EXPORT char fake_cuda_inside[64];
EXPORT void (*fake_cuda_inside_fn)(void);

static void run_inside(const char *name)
{
    if (fake_cuda_inside[0] == '\0' || strcmp(fake_cuda_inside, name) != 0)
        return;
    fake_cuda_inside[0] = '\0';
    void (*fn)(void) = __atomic_exchange_n(&fake_cuda_inside_fn, NULL, __ATOMIC_ACQ_REL);
    if (fn != NULL)
        fn();
}

static int fail_now(const char *name)
{
    if (fake_cuda_fail_next[0] == '\0' || strcmp(fake_cuda_fail_next, name) != 0)
        return 0;
    fake_cuda_fail_next[0] = '\0';
    return 1;
}

static size_t slot_of(uint64_t key) { return (size_t)((key * UINT64_C(0x9e3779b97f4a7c15)) >> 44); }

/* The live allocation at exactly key, or NULL. Caller holds table_lock. A probe ends at an
 * empty slot, or after the whole table should none be left. */
static struct alloc *find_alloc(uint64_t key)
{
    if (key <= tombstone)
        return NULL;
    size_t i = slot_of(key);
    for (size_t n = 0; n < TABLE_SIZE && table[i].key != 0; n++, i = (i + 1) & (TABLE_SIZE - 1))
        if (table[i].key == key)
            return &table[i];
    return NULL;
}

/* An allocation's slot freed: a tombstone, so that probes go on past it, unless the next slot
 * is empty (then it and the tombstones before it are emptied: no probe needs them). Without
 * that, a process that had allocated and freed TABLE_SIZE distinct addresses (the bench's
 * pairs) left no empty slot, and a lookup of an address never handed out (a host pointer
 * given to cuPointerGetAttribute) probed the whole table every time. Caller holds
 * table_lock. */
static void free_slot(struct alloc *a)
{
    size_t i = (size_t)(a - table);
    table[i].key = tombstone;
    while (table[i].key == tombstone && table[(i + 1) & (TABLE_SIZE - 1)].key == 0) {
        table[i].key = 0;
        i = (i - 1) & (TABLE_SIZE - 1);
    }
}


/* Records a new allocation of bytes on dev at *next (then moved past it) unless the device is
 * full or the addresses would pass limit; returns its key or 0. A pooled one is served from its
 * pool's cache when that holds enough. */
static uint64_t fake_alloc_at(int dev, uint64_t bytes, uint64_t *next, uint64_t limit,
                              int pooled, const struct fake_ctx *owner)
{
    int32_t pid = (int32_t)getpid();
    pthread_mutex_lock(&table_lock);
    uint64_t key = *next, step = ((bytes + 0xfff) & ~UINT64_C(0xfff)) + (bytes == 0 ? 0x1000 : 0);
    int reused = next == &next_address && reuse_key != 0 && step <= reuse_step;
    if (reused)
        key = reuse_key;
    int cached = pooled && pools[dev].cached >= bytes && !fake_cuda_pool_fragmented;
    if ((!reused && step > limit - key) || (!cached && !gpu_alloc(dev, pid, bytes))) {
        pthread_mutex_unlock(&table_lock);
        return 0;
    }
    if (cached)
        pools[dev].cached -= bytes;
    if (pooled)
        pools[dev].used += bytes;
    if (reused)
        reuse_key = reuse_step = 0;
    else
        *next += step;
    size_t i = slot_of(key);
    while (table[i].key > tombstone)
        i = (i + 1) & (TABLE_SIZE - 1);
    static unsigned aliased;
    int alias = pooled && fake_cuda_pool_aliases > 1
                    ? (int)(aliased++ % (unsigned)fake_cuda_pool_aliases) : 0;
    table[i] = (struct alloc){.key = key, .bytes = bytes, .dev = dev, .pid = pid, .alias = alias,
                              .pooled = pooled, .owner = owner};
    pthread_mutex_unlock(&table_lock);
    return key;
}

/* Gives back what dev's pool caches beyond keep. Caller holds table_lock. */
static void pool_release(int dev, uint64_t keep)
{
    if (pools[dev].cached <= keep)
        return;
    gpu_free(dev, (int32_t)getpid(), pools[dev].cached - keep);
    pools[dev].cached = keep;
}

static uint64_t fake_alloc(int dev, uint64_t bytes, const struct fake_ctx *owner)
{
    return fake_alloc_at(dev, bytes, &next_address, UINT64_MAX, 0, owner);
}

/* A destroyed context takes this process's allocations in it along, with no free call; the
 * address of the largest is handed out again next. */
static void free_owned(const struct fake_ctx *owner)
{
    int32_t pid = (int32_t)getpid();
    uint64_t largest = 0;
    pthread_mutex_lock(&table_lock);
    for (size_t i = 0; i < TABLE_SIZE; i++) {
        struct alloc a = table[i];
        if (a.key <= tombstone || a.owner != owner || a.pid != pid)
            continue;
        free_slot(&table[i]);
        if (a.pooled)
            pools[a.dev].used -= a.bytes;
        gpu_free(a.dev, pid, a.bytes);
        if (a.key >= first_address && a.bytes >= largest) {
            largest = a.bytes;
            reuse_key = a.key;
            reuse_step = (a.bytes + 0xfff) & ~UINT64_C(0xfff);
        }
    }
    pthread_mutex_unlock(&table_lock);
}

/* Graph allocations get addresses of their own, fixed at the node's creation (no memory). */
static const uint64_t graph_va_base = UINT64_C(0x500000000000), graph_va_end = UINT64_C(0x600000000000);
static uint64_t next_graph_va = UINT64_C(0x500000000000);

static int graph_address(uint64_t key) { return key >= graph_va_base && key < graph_va_end; }

static uint64_t new_graph_address(uint64_t bytes)
{
    return __atomic_fetch_add(&next_graph_va, (bytes + 0x1fffff) & ~UINT64_C(0x1fffff),
                              __ATOMIC_RELAXED);
}

static CUresult fake_free(uint64_t key)
{
    __atomic_add_fetch(&fake_cuda_stats.free_calls, 1, __ATOMIC_RELAXED);
    if (key <= tombstone)
        return CUDA_ERROR_INVALID_VALUE;
    if (graph_address(key)) /* a graph allocation's memory stays in the graph memory pool */
        return CUDA_SUCCESS;
    pthread_mutex_lock(&table_lock);
    struct alloc *found = find_alloc(key);
    /* On a shared GPU a fork child's copy of its parent's pointer is not the child's to free
     * (a real context does not survive fork); one private timeline keeps the old behaviour. */
    if (found == NULL || (gpu_is_shared && found->pid != (int32_t)getpid())) {
        pthread_mutex_unlock(&table_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct alloc a = *found;
    free_slot(found);
    if (a.pooled) {
        pools[a.dev].used -= a.bytes;
        pools[a.dev].cached += a.bytes;
    }
    pthread_mutex_unlock(&table_lock);
    if (!a.pooled)
        gpu_free(a.dev, a.pid, a.bytes);
    return CUDA_SUCCESS;
}

static CUresult need_ctx(void);
static int pool_handles[MAX_DEVICES];

/* CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: the pool of a stream-ordered allocation (the fake's are
 * all its device's default pool), NULL for any other. */
static CUresult pool_of_pointer(void *data, CUdeviceptr ptr)
{
    pthread_mutex_lock(&table_lock);
    const struct alloc *at = find_alloc(ptr);
    int found = at != NULL;
    struct alloc a = found ? *at : (struct alloc){0};
    pthread_mutex_unlock(&table_lock);
    if (data == NULL || !found)
        return CUDA_ERROR_INVALID_VALUE;
    *(CUmemoryPool *)data = !a.pooled ? NULL
                            : a.alias != 0 ? (CUmemoryPool)(void *)&pool_aliases[a.dev][a.alias]
                                           : (CUmemoryPool)(void *)&pool_handles[a.dev];
    return CUDA_SUCCESS;
}

/* Page-locked host memory (cuMemAllocHost): real host memory the driver knows, on the
 * device current when it was made. Under table_lock. */
enum { MAX_PINNED = 16 };
static struct pinned {
    uint64_t start, bytes;
    int dev;
} pinned[MAX_PINNED];

/* The device of the page-locked memory holding ptr; -1: none holds it. */
static int pinned_device(uint64_t ptr)
{
    int dev = -1;
    pthread_mutex_lock(&table_lock);
    for (int i = 0; i < MAX_PINNED; i++)
        if (pinned[i].bytes != 0 && ptr - pinned[i].start < pinned[i].bytes)
            dev = pinned[i].dev;
    pthread_mutex_unlock(&table_lock);
    return dev;
}

EXPORT CUresult cuMemAllocHost_v2(void **host, size_t bytes)
{
    CUresult rc = need_ctx();
    if (rc != CUDA_SUCCESS || host == NULL || bytes == 0)
        return rc != CUDA_SUCCESS ? rc : CUDA_ERROR_INVALID_VALUE;
    void *p = malloc(bytes);
    int slot = -1;
    pthread_mutex_lock(&table_lock);
    for (int i = 0; p != NULL && slot < 0 && i < MAX_PINNED; i++)
        if (pinned[i].bytes == 0) {
            pinned[i] = (struct pinned){(uint64_t)(uintptr_t)p, bytes, current->dev};
            slot = i;
        }
    pthread_mutex_unlock(&table_lock);
    if (slot < 0) {
        free(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *host = p;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFreeHost(void *host)
{
    int found = 0;
    pthread_mutex_lock(&table_lock);
    for (int i = 0; !found && i < MAX_PINNED; i++)
        if (pinned[i].bytes != 0 && pinned[i].start == (uint64_t)(uintptr_t)host) {
            pinned[i] = (struct pinned){0};
            found = 1;
        }
    pthread_mutex_unlock(&table_lock);
    if (!found)
        return CUDA_ERROR_INVALID_VALUE;
    free(host);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
    if (fail_now("cuPointerGetAttribute"))
        return CUDA_ERROR_UNKNOWN;
    if (attribute == CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE)
        return pool_of_pointer(data, ptr);
    if (attribute != CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL &&
        attribute != CU_POINTER_ATTRIBUTE_MEMORY_TYPE &&
        attribute != CU_POINTER_ATTRIBUTE_IS_MANAGED)
        return CUDA_ERROR_NOT_SUPPORTED; /* the fake knows these only */
    /* A current context is not needed (UVA), but a destroyed one is refused. */
    if (current != NULL && need_ctx() == CUDA_ERROR_CONTEXT_IS_DESTROYED)
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    pthread_mutex_lock(&table_lock);
    const struct alloc *at = find_alloc(ptr);
    struct alloc a = at != NULL ? *at : (struct alloc){.dev = -1};
    pthread_mutex_unlock(&table_lock);
    int host = a.dev < 0 && (a.dev = pinned_device(ptr)) >= 0;
    run_inside("cuPointerGetAttribute"); /* after the answer is known */
    if (data == NULL || a.dev < 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (attribute == CU_POINTER_ATTRIBUTE_MEMORY_TYPE) /* managed memory is device memory */
        *(unsigned int *)data = host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
    else if (attribute == CU_POINTER_ATTRIBUTE_IS_MANAGED)
        *(unsigned int *)data = (unsigned int)a.managed;
    else
        *(int *)data = a.dev;
    return CUDA_SUCCESS;
}

static CUresult need_ctx(void)
{
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (current == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    int gone = current >= primary && current < primary + MAX_DEVICES &&
               __atomic_load_n(&primary_gone[current - primary], __ATOMIC_ACQUIRE);
    return gone ? CUDA_ERROR_CONTEXT_IS_DESTROYED : CUDA_SUCCESS;
}

/* ---- init, devices, contexts -------------------------------------------------------------- */

EXPORT CUresult cuInit(unsigned int flags)
{
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (ndevices == 0)
        return CUDA_ERROR_NO_DEVICE;
    initialised = 1;
    run_inside("cuInit");
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

EXPORT void fake_cuda_uuid(int nvml_index, unsigned char out[16]) { memcpy(out, uuids[nvml_index], 16); }

EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    if (dev < 0 || dev >= ndevices)
        return CUDA_ERROR_INVALID_DEVICE;
    fake_cuda_uuid(gpu_physical[dev], (unsigned char *)uuid->bytes);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    if (dev < 0 || dev >= ndevices)
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = device_bytes;
    return CUDA_SUCCESS;
}

/* The first context of a process on a device costs FAKE_CUDA_CONTEXT_MIB (0 by default). The
 * primary context is made by the first retain after none was active, and charged once. */
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev)
{
    CUresult rc = need_device(dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    run_inside("cuDevicePrimaryCtxRetain"); /* before it looks at the context */
    /* FAKE_CUDA_CONTEXTS_TOGETHER=N (containers starting at the same moment): the first
     * retains of N processes all begin before any makes its context, and return once all have
     * (10 s at most each way). */
    if (contexts_together > 0 && !primary_active[dev]) {
        gpu_arrive(dev, 1);
        for (int waited = 0; waited < 1000 && gpu_arrive(dev, 0) < (uint64_t)contexts_together;
             waited++)
            gpu_sleep_ns(10 * 1000 * 1000);
    }
    /* FAKE_CUDA_CONTEXT_MS=N, read at the call (a forked tenant sets it for itself): making
     * the primary context takes N ms before it exists (a GPU takes hundreds). */
    uint64_t making_ms = primary_active[dev] ? 0 : gpu_env("FAKE_CUDA_CONTEXT_MS", 0);
    if (making_ms != 0)
        gpu_sleep_ns(making_ms * 1000 * 1000);
    pthread_mutex_lock(&primary_lock);
    int ok = primary_active[dev] || gpu_ctx_ref(dev, 1);
    if (ok) {
        primary_active[dev] = 1;
        primary_gone[dev] = 0;
        primary_refs[dev]++;
    }
    pthread_mutex_unlock(&primary_lock);
    if (!ok)
        return CUDA_ERROR_OUT_OF_MEMORY;
    for (int waited = 0; contexts_together > 0 && waited < 1000 &&
                         gpu_contexts(dev) < contexts_together; waited++)
        gpu_sleep_ns(10 * 1000 * 1000);
    *ctx = (CUcontext)&primary[dev];
    return CUDA_SUCCESS;
}

/* The primary context and what it holds are gone (stream-ordered allocations are no
 * context's, as cuda.h says, and stay). Caller holds primary_lock. */
static void limits_release(struct fake_ctx *c);

static void primary_destroy(CUdevice dev)
{
    if (!primary_active[dev])
        return;
    free_owned(&primary[dev]);
    limits_release(&primary[dev]); /* the next one starts at the driver's defaults */
    gpu_ctx_unref(dev, 1);
    primary_active[dev] = 0;
    primary_gone[dev] = 1;
}

/* The last release resets the primary context (cuda.h). */
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    CUresult rc = need_device(dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&primary_lock);
    rc = primary_refs[dev] > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
    if (rc == CUDA_SUCCESS && --primary_refs[dev] == 0)
        primary_destroy(dev);
    pthread_mutex_unlock(&primary_lock);
    return rc;
}

/* cudaDeviceReset: the context is destroyed but not released (cuda.h): the references stay,
 * and the next retain makes it again. */
EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    CUresult rc = need_device(dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&primary_lock);
    primary_destroy(dev);
    pthread_mutex_unlock(&primary_lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    CUresult rc = need_device(dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (flags == NULL || active == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&primary_lock);
    *flags = 0;
    *active = primary_active[dev];
    pthread_mutex_unlock(&primary_lock);
    run_inside("cuDevicePrimaryCtxGetState"); /* the answer given, and already old */
    return CUDA_SUCCESS;
}

/* A created context is a new one, made current on the calling thread as the driver does. */
static CUresult ctx_create(CUcontext *pctx, CUdevice dev)
{
    CUresult rc = need_device(dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (pctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_ctx *ctx = malloc(sizeof *ctx);
    if (ctx == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (!gpu_ctx_ref(dev, 0)) {
        free(ctx);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *ctx = (struct fake_ctx){.dev = dev, .magic = CTX_MAGIC};
    current = ctx;
    run_inside("cuCtxCreate"); /* the context made, not yet returned */
    *pctx = (CUcontext)ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    (void)flags;
    return ctx_create(pctx, dev);
}

EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int nparams,
                               unsigned int flags, CUdevice dev)
{
    (void)params, (void)nparams, (void)flags;
    return ctx_create(pctx, dev);
}

EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
                               CUdevice dev)
{
    (void)params, (void)flags;
    return ctx_create(pctx, dev);
}

/* A green context (cuda.h): it retains dev's primary context, which the driver makes when it
 * is inactive, and holds FAKE_CUDA_CREATED_CONTEXT_MIB of its own, as a created context does
 * (what a real one holds is gpu-check.sh's to measure); it is not made current on creation
 * (cuCtxFromGreenCtx gives the CUcontext to make current). */
enum { GREEN_MAGIC = 0x4e455247 };

EXPORT CUresult cuGreenCtxCreate(CUgreenCtx *phctx, CUdevResourceDesc desc, CUdevice dev,
                                 unsigned int flags)
{
    (void)desc, (void)flags;
    if (phctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext held;
    CUresult rc = cuDevicePrimaryCtxRetain(&held, dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct fake_ctx *green = malloc(sizeof *green);
    if (green == NULL || !gpu_ctx_ref(dev, 0)) {
        free(green);
        cuDevicePrimaryCtxRelease_v2(dev);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *green = (struct fake_ctx){.dev = dev, .magic = GREEN_MAGIC};
    *phctx = (CUgreenCtx)green;
    return CUDA_SUCCESS;
}

/* The device's SMs as one resource, and a descriptor of it: only what cuGreenCtxCreate takes. */
EXPORT CUresult cuDeviceGetDevResource(CUdevice dev, CUdevResource *resource,
                                       CUdevResourceType type)
{
    CUresult rc = need_device(dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (resource == NULL || type != CU_DEV_RESOURCE_TYPE_SM)
        return CUDA_ERROR_INVALID_VALUE;
    memset(resource, 0, sizeof *resource);
    resource->type = type;
    resource->sm.smCount = 132;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevResourceGenerateDesc(CUdevResourceDesc *desc, CUdevResource *resources,
                                          unsigned int count)
{
    static char described;
    if (desc == NULL || resources == NULL || count == 0)
        return CUDA_ERROR_INVALID_VALUE;
    *desc = (CUdevResourceDesc)&described;
    return CUDA_SUCCESS;
}

/* The green context as a CUcontext, to be made current (cuda.h). */
EXPORT CUresult cuCtxFromGreenCtx(CUcontext *ctx, CUgreenCtx hctx)
{
    struct fake_ctx *green = (struct fake_ctx *)hctx;
    if (ctx == NULL || green == NULL || green->magic != GREEN_MAGIC)
        return CUDA_ERROR_INVALID_VALUE;
    *ctx = (CUcontext)green;
    return CUDA_SUCCESS;
}

/* Releases the primary context the green one retained (its last release resets it). */
EXPORT CUresult cuGreenCtxDestroy(CUgreenCtx hctx)
{
    struct fake_ctx *green = (struct fake_ctx *)hctx;
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (green == NULL || green->magic != GREEN_MAGIC)
        return CUDA_ERROR_INVALID_CONTEXT;
    free_owned(green);
    gpu_ctx_unref(green->dev, 0); /* its limits are the primary context's (limits_of) */
    cuDevicePrimaryCtxRelease_v2(green->dev);
    if (current == green)
        current = NULL;
    green->magic = 0;
    free(green);
    return CUDA_SUCCESS;
}

/* The CUDA 2.0 and 7.0 exports (cuda_v1.h): the same as their _v2. */
EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    return cuCtxCreate_v2(pctx, flags, dev);
}

EXPORT CUresult cuCtxDestroy(CUcontext ctx) { return cuCtxDestroy_v2(ctx); }

EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { return cuDevicePrimaryCtxRelease_v2(dev); }

EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) { return cuDevicePrimaryCtxReset_v2(dev); }

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    struct fake_ctx *c = (struct fake_ctx *)ctx;
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    /* Primary contexts are released, not destroyed. */
    if (c == NULL || (c >= primary && c < primary + MAX_DEVICES) || c->magic != CTX_MAGIC)
        return CUDA_ERROR_INVALID_CONTEXT;
    free_owned(c);
    limits_release(c);
    gpu_ctx_unref(c->dev, 0); /* a fork child's copy was never charged to the child */
    if (current == c)
        current = NULL;
    c->magic = 0;
    free(c);
    return CUDA_SUCCESS;
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

/* Context limits, each context's own (cuda.h, cuCtxSetLimit: "the current context"): the
 * stack is reserved for every thread the device holds at once (an H100's 132 SMs x 2048
 * threads), the printf FIFO and the malloc heap for their size; a raise is charged to the
 * process's context memory on the context's device at once, a cut given back, and what a
 * context held beyond the defaults goes with it. The device runtime's and the L2's limits
 * reserve nothing here. */
enum { FAKE_SMS = 132, FAKE_THREADS_PER_SM = 2048 };
static const size_t default_limits[3] = {[CU_LIMIT_STACK_SIZE] = 1024,
                                         [CU_LIMIT_PRINTF_FIFO_SIZE] = 1 << 20,
                                         [CU_LIMIT_MALLOC_HEAP_SIZE] = 8 << 20};

static size_t *limits_of(struct fake_ctx *c)
{
    /* A green context's are its primary context's, as an H200's driver 580 answered
     * (gpu_held.py (f): the primary's stack set to 2 KiB, the green context's read 2048). */
    if (c->magic == GREEN_MAGIC)
        c = &primary[c->dev];
    if (!c->limits_set) {
        memcpy(c->limits, default_limits, sizeof c->limits);
        c->limits_set = 1;
    }
    return c->limits;
}

static uint64_t limit_bytes(CUlimit limit, size_t value)
{
    return limit == CU_LIMIT_STACK_SIZE ? (uint64_t)value * FAKE_SMS * FAKE_THREADS_PER_SM
                                        : value;
}

/* Sets c's limit that reserves memory (stack, printf FIFO, heap): charged or given back at once. */
static CUresult set_limit(struct fake_ctx *c, CUlimit limit, size_t value)
{
    size_t *now = limits_of(c);
    if (!gpu_ctx_resize(c->dev, limit_bytes(limit, now[limit]), limit_bytes(limit, value)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    now[limit] = value;
    return CUDA_SUCCESS;
}

static void limits_release(struct fake_ctx *c)
{
    for (int limit = 0; c->limits_set && limit < 3; limit++)
        gpu_ctx_resize(c->dev, limit_bytes((CUlimit)limit, c->limits[limit]),
                       limit_bytes((CUlimit)limit, default_limits[limit]));
    c->limits_set = 0;
}

EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value)
{
    CUresult rc = need_ctx();
    if (rc != CUDA_SUCCESS || (unsigned)limit > CU_LIMIT_PERSISTING_L2_CACHE_SIZE)
        return rc != CUDA_SUCCESS ? rc : CUDA_ERROR_INVALID_VALUE;
    if ((unsigned)limit > CU_LIMIT_MALLOC_HEAP_SIZE)
        return CUDA_SUCCESS;
    return set_limit(current, limit, value);
}

EXPORT CUresult cuCtxGetLimit(size_t *value, CUlimit limit)
{
    CUresult rc = need_ctx();
    if (rc != CUDA_SUCCESS || value == NULL || (unsigned)limit > CU_LIMIT_PERSISTING_L2_CACHE_SIZE)
        return rc != CUDA_SUCCESS ? rc : CUDA_ERROR_INVALID_VALUE;
    *value = (unsigned)limit <= CU_LIMIT_MALLOC_HEAP_SIZE ? limits_of(current)[limit] : 0;
    run_inside("cuCtxGetLimit"); /* after its answer */
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetAttribute(int *value, CUdevice_attribute attr, CUdevice dev)
{
    if (value == NULL || dev < 0 || dev >= ndevices)
        return CUDA_ERROR_INVALID_VALUE;
    if (attr == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        *value = FAKE_SMS;
    else if (attr == CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)
        *value = FAKE_THREADS_PER_SM;
    else
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* Until the caller's own work has run (other processes' work shares the GPU meanwhile); then
 * the device's pool gives back what it caches above its release threshold. */
static void sync_device(int dev)
{
    gpu_wait_pending(dev, 0);
    pthread_mutex_lock(&table_lock);
    pool_release(dev, pools[dev].threshold);
    pthread_mutex_unlock(&table_lock);
}

EXPORT CUresult cuCtxSynchronize(void) { return cuCtxSynchronize_v2(NULL); }

/* CUDA 13.0's exports naming a context (cuda_13.h): ctx, or the current one where NULL, in *c. */
static CUresult named_context(CUcontext ctx, struct fake_ctx **c)
{
    *c = ctx != NULL ? (struct fake_ctx *)ctx : current;
    if (ctx == NULL)
        return need_ctx();
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    int is_primary = *c >= primary && *c < primary + MAX_DEVICES;
    if (!is_primary && (*c)->magic != CTX_MAGIC && (*c)->magic != GREEN_MAGIC)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (is_primary && __atomic_load_n(&primary_gone[*c - primary], __ATOMIC_ACQUIRE))
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    return CUDA_SUCCESS;
}

/* The named context's device, as above. */
EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
    struct fake_ctx *c;
    CUresult rc = named_context(ctx, &c);
    if (rc == CUDA_SUCCESS)
        sync_device(c->dev);
    return rc;
}

EXPORT CUresult cuCtxGetDevice_v2(CUdevice *dev, CUcontext ctx)
{
    struct fake_ctx *c;
    CUresult rc = named_context(ctx, &c);
    if (rc == CUDA_SUCCESS)
        *dev = c->dev;
    return rc;
}

static CUresult stream_ctx(CUstream stream, struct fake_ctx **ctx);

/* Waits for all the caller's work on the stream's device, not the stream's alone: a library
 * that took a stream's synchronisation for more than that stream's is caught by what it did
 * next, not by this. */
EXPORT CUresult cuStreamSynchronize(CUstream stream)
{
    struct fake_ctx *ctx;
    CUresult rc = stream_ctx(stream, &ctx);
    if (rc == CUDA_SUCCESS)
        sync_device(ctx->dev);
    return rc;
}

EXPORT CUresult cuStreamSynchronize_ptsz(CUstream stream) { return cuStreamSynchronize(stream); }

/* CUDA_SUCCESS once none of the caller's work on the stream's device is left. */
EXPORT CUresult cuStreamQuery(CUstream stream)
{
    struct fake_ctx *ctx;
    CUresult rc = stream_ctx(stream, &ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    return fake_cuda_pending_ns(ctx->dev, (int)getpid()) == 0 ? CUDA_SUCCESS
                                                              : CUDA_ERROR_NOT_READY;
}

EXPORT CUresult cuStreamQuery_ptsz(CUstream stream) { return cuStreamQuery(stream); }

/* Whether a stream is being captured: fake_cuda_capturing (set by a test) says every stream
 * is. */
EXPORT int fake_cuda_capturing;

static CUresult is_capturing(CUstream stream, CUstreamCaptureStatus *status)
{
    struct fake_ctx *ctx;
    CUresult rc = status != NULL ? stream_ctx(stream, &ctx) : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS)
        *status = fake_cuda_capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE
                                      : CU_STREAM_CAPTURE_STATUS_NONE;
    run_inside("cuStreamGetCaptureInfo"); /* after its answer (cuStreamIsCapturing's too) */
    return rc;
}

EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
    static __thread CUstreamCaptureMode now = CU_STREAM_CAPTURE_MODE_GLOBAL;
    if (mode == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUstreamCaptureMode was = now;
    now = *mode;
    *mode = was;
    return CUDA_SUCCESS;
}

/* Which capture the streams are in while fake_cuda_capturing (a test moves it on to say that a
 * capture ended and another began). */
EXPORT uint64_t fake_cuda_capture_id = 1;

static CUresult capture_info(CUstream stream, CUstreamCaptureStatus *status, cuuint64_t *id,
                             CUgraph *graph, const CUgraphNode **deps, size_t *ndeps)
{
    uint64_t capture = fake_cuda_capture_id;
    CUresult rc = is_capturing(stream, status);
    if (rc == CUDA_SUCCESS && id != NULL && *status == CU_STREAM_CAPTURE_STATUS_ACTIVE)
        *id = capture;
    if (graph != NULL)
        *graph = NULL;
    if (deps != NULL)
        *deps = NULL;
    if (ndeps != NULL)
        *ndeps = 0;
    return rc;
}

EXPORT CUresult cuStreamGetCaptureInfo_v2(CUstream stream, CUstreamCaptureStatus *status,
                                          cuuint64_t *id, CUgraph *graph,
                                          const CUgraphNode **deps, size_t *ndeps)
{
    return capture_info(stream, status, id, graph, deps, ndeps);
}

EXPORT CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream stream, CUstreamCaptureStatus *status,
                                               cuuint64_t *id, CUgraph *graph,
                                               const CUgraphNode **deps, size_t *ndeps)
{
    return capture_info(stream, status, id, graph, deps, ndeps);
}

EXPORT CUresult cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus *status)
{
    return is_capturing(stream, status);
}

EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream stream, CUstreamCaptureStatus *status)
{
    return is_capturing(stream, status);
}

/* The context stack of cuCtxPushCurrent/cuCtxPopCurrent (CUDA 4.0's _v2 and 2.0's exports, alike
 * here): `current` is its top. */
enum { CTX_STACK = 16 };
static __thread struct fake_ctx *ctx_stack[CTX_STACK];
static __thread int ctx_depth;

EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    if (ctx == NULL || ctx_depth == CTX_STACK)
        return CUDA_ERROR_INVALID_VALUE;
    ctx_stack[ctx_depth++] = current;
    current = (struct fake_ctx *)ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPushCurrent(CUcontext ctx) { return cuCtxPushCurrent_v2(ctx); }

EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *ctx)
{
    if (current == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx != NULL)
        *ctx = (CUcontext)current;
    current = ctx_depth > 0 ? ctx_stack[--ctx_depth] : NULL;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPopCurrent(CUcontext *ctx) { return cuCtxPopCurrent_v2(ctx); }

/* A stream belongs to the context current where it was made, and so to its device: work and
 * stream-ordered allocations on it go there whatever context is current when they are issued
 * (none at all, for a stream named explicitly). NULL, CU_STREAM_LEGACY and
 * CU_STREAM_PER_THREAD stand for the current context's default stream. */
enum { STREAM_MAGIC = 0x5354524d };
struct fake_stream {
    int magic;
    struct fake_ctx *ctx; /* and so its device */
};

static int default_stream(CUstream stream)
{
    return stream == NULL || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD;
}

/* The stream destroyed last, handed out again by the next cuStreamCreate: a driver may give a
 * new stream a destroyed one's handle (libvgpu must not take the new one's synchronisation
 * for the old one's work), and the allocator under ASan, which quarantines freed memory,
 * would not. Under table_lock. */
static void *recycled_stream;

/* What *kept holds (the handle destroyed last), or a new one of `size` bytes (NULL: none). */
static void *handle_again(void **kept, size_t size)
{
    pthread_mutex_lock(&table_lock);
    void *handle = *kept;
    *kept = NULL;
    pthread_mutex_unlock(&table_lock);
    return handle != NULL ? handle : malloc(size);
}

/* handle destroyed: kept in *kept for the next one made, the one kept before let go. */
static void keep_handle(void **kept, void *handle)
{
    pthread_mutex_lock(&table_lock);
    void *older = *kept;
    *kept = handle;
    pthread_mutex_unlock(&table_lock);
    free(older);
}

EXPORT CUresult cuStreamCreate(CUstream *stream, unsigned int flags)
{
    (void)flags;
    CUresult rc = need_ctx();
    if (rc != CUDA_SUCCESS || stream == NULL)
        return rc != CUDA_SUCCESS ? rc : CUDA_ERROR_INVALID_VALUE;
    struct fake_stream *st = handle_again(&recycled_stream, sizeof *st);
    if (st == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *st = (struct fake_stream){.magic = STREAM_MAGIC, .ctx = current};
    *stream = (CUstream)(void *)st;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamCreateWithPriority(CUstream *stream, unsigned int flags, int priority)
{
    (void)priority;
    return cuStreamCreate(stream, flags);
}

EXPORT CUresult cuStreamDestroy_v2(CUstream stream)
{
    struct fake_stream *st = (struct fake_stream *)(void *)stream;
    if (default_stream(stream) || st->magic != STREAM_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    st->magic = 0;
    keep_handle(&recycled_stream, st);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamDestroy(CUstream stream) { return cuStreamDestroy_v2(stream); }

/* The stream's context; a default stream's is the current one (none: INVALID_CONTEXT). */
static CUresult stream_ctx(CUstream stream, struct fake_ctx **ctx)
{
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (default_stream(stream)) {
        *ctx = current;
        return current != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
    }
    const struct fake_stream *st = (const struct fake_stream *)(const void *)stream;
    if (st->magic != STREAM_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    *ctx = st->ctx;
    return CUDA_SUCCESS;
}

/* Events (cuda.h, cuEventRecord): a record captures the work given to its stream's device so
 * far; a wait for it waits for all the caller's work on that device, as cuStreamSynchronize
 * does here (more than the event's: a library that took the wait for more than that is caught
 * by what it did next). Before its first record an event is done. A record while
 * fake_cuda_capturing makes it a captured event, whose wait and query fail
 * (CUDA_ERROR_CAPTURED_EVENT) until it is recorded outside a capture, unless it was made with
 * CU_EVENT_RECORD_EXTERNAL (refused outside a capture): a node of the graph, the event keeps
 * what it had. An event belongs to the context current where it was made, and is recorded
 * only on that context's streams. A destroyed event's handle is the next one made's, as a
 * stream's is. An interprocess event (made with CU_EVENT_DISABLE_TIMING) gives a handle that
 * cuIpcOpenEventHandle opens as a new event of the current context (here, one process). */
enum { EVENT_MAGIC = 0x45564e54 };
struct fake_event {
    int magic;
    int recorded;
    int captured;
    unsigned int flags;
    struct fake_ctx *ctx;
    uint64_t mark;   /* the GPU model's number of its last record (gpu_mark) */
    int marked;      /* ... taken (not while the model is off: FAKE_CUDA_NS_PER_BLOCK=0) */
};

static void *recycled_event; /* as recycled_stream */

EXPORT CUresult cuEventCreate(CUevent *event, unsigned int flags)
{
    CUresult rc = need_ctx();
    if (rc != CUDA_SUCCESS || event == NULL)
        return rc != CUDA_SUCCESS ? rc : CUDA_ERROR_INVALID_VALUE;
    if ((flags & CU_EVENT_INTERPROCESS) != 0 && (flags & CU_EVENT_DISABLE_TIMING) == 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_event *ev = handle_again(&recycled_event, sizeof *ev);
    if (ev == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *ev = (struct fake_event){.magic = EVENT_MAGIC, .flags = flags, .ctx = current};
    *event = (CUevent)(void *)ev;
    return CUDA_SUCCESS;
}

static struct fake_event *event_of(CUevent event)
{
    struct fake_event *ev = (struct fake_event *)(void *)event;
    return ev != NULL && ev->magic == EVENT_MAGIC ? ev : NULL;
}

static CUresult record_event(CUevent event, CUstream stream, unsigned int flags)
{
    struct fake_event *ev = event_of(event);
    struct fake_ctx *ctx;
    CUresult rc = ev != NULL ? stream_ctx(stream, &ctx) : CUDA_ERROR_INVALID_HANDLE;
    if (rc != CUDA_SUCCESS)
        return rc;
    if (ctx != ev->ctx)
        return CUDA_ERROR_INVALID_HANDLE;
    if ((flags & ~(unsigned)CU_EVENT_RECORD_EXTERNAL) != 0 ||
        ((flags & CU_EVENT_RECORD_EXTERNAL) != 0 && !fake_cuda_capturing))
        return CUDA_ERROR_INVALID_VALUE; /* EXTERNAL is for a capture only */
    if (!fake_cuda_capturing) {
        ev->recorded = 1;
        ev->captured = 0;
        ev->marked = ns_per_block != 0;
        if (ev->marked)
            ev->mark = gpu_mark(ctx->dev);
    } else if ((flags & CU_EVENT_RECORD_EXTERNAL) == 0)
        ev->captured = 1;
    run_inside("cuEventRecord"); /* after the record (each record export's) */
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventRecord(CUevent event, CUstream stream)
{
    return record_event(event, stream, 0);
}

EXPORT CUresult cuEventRecord_ptsz(CUevent event, CUstream stream)
{
    return record_event(event, stream, 0);
}

EXPORT CUresult cuEventRecordWithFlags(CUevent event, CUstream stream, unsigned int flags)
{
    return record_event(event, stream, flags);
}

EXPORT CUresult cuEventRecordWithFlags_ptsz(CUevent event, CUstream stream, unsigned int flags)
{
    return record_event(event, stream, flags);
}

/* The event a wait or query may ask about (*ev), or why not. */
static CUresult waitable(CUevent event, struct fake_event **ev)
{
    *ev = event_of(event);
    if (*ev == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    return (*ev)->captured ? CUDA_ERROR_CAPTURED_EVENT : CUDA_SUCCESS;
}

EXPORT CUresult cuEventSynchronize(CUevent event)
{
    struct fake_event *ev;
    CUresult rc = waitable(event, &ev);
    if (rc == CUDA_SUCCESS && ev->recorded)
        sync_device(ev->ctx->dev);
    return rc;
}

/* When a recorded event's work ended: 1 (*done_ns, CLOCK_MONOTONIC ns), 0 not yet, -1 not
 * known (its record was overwritten in the model's ring before it ended). */
static int event_done(const struct fake_event *ev, uint64_t *done_ns)
{
    if (!ev->marked) {
        *done_ns = 0;
        return 1;
    }
    return gpu_mark_done(ev->ctx->dev, ev->mark, done_ns);
}

/* Done once the work queued before its record has run (not the work queued after). */
EXPORT CUresult cuEventQuery(CUevent event)
{
    struct fake_event *ev;
    CUresult rc = waitable(event, &ev);
    if (rc != CUDA_SUCCESS || !ev->recorded)
        return rc;
    uint64_t done_ns;
    return event_done(ev, &done_ns) != 0 ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

/* As cuda.h says: never recorded, or made with CU_EVENT_DISABLE_TIMING: INVALID_HANDLE; either
 * not done: NOT_READY. The span is the model's: a kernel's cost, plus what other processes ran
 * while it waited its turn (fake_gpu.h, gpu_end_marks). */
static CUresult elapsed(float *ms, CUevent start, CUevent end)
{
    struct fake_event *from, *to;
    CUresult rc = waitable(start, &from);
    if (rc == CUDA_SUCCESS)
        rc = waitable(end, &to);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (ms == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!from->recorded || !to->recorded || ((from->flags | to->flags) & CU_EVENT_DISABLE_TIMING))
        return CUDA_ERROR_INVALID_HANDLE;
    uint64_t a, b;
    int done_a = event_done(from, &a), done_b = event_done(to, &b);
    if (done_a < 0 || done_b < 0)
        return CUDA_ERROR_INVALID_HANDLE;
    if (done_a == 0 || done_b == 0)
        return CUDA_ERROR_NOT_READY;
    *ms = (float)(((double)b - (double)a) / 1e6);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end)
{
    return elapsed(ms, start, end);
}

/* CUDA 12.8's, the same here (cuda.h: it supplants the first in 13.0). */
EXPORT CUresult cuEventElapsedTime_v2(float *ms, CUevent start, CUevent end)
{
    return elapsed(ms, start, end);
}

EXPORT CUresult cuEventDestroy_v2(CUevent event)
{
    struct fake_event *ev = event_of(event);
    if (ev == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    ev->magic = 0;
    keep_handle(&recycled_event, ev);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventDestroy(CUevent event) { return cuEventDestroy_v2(event); }

EXPORT CUresult cuIpcGetEventHandle(CUipcEventHandle *handle, CUevent event)
{
    struct fake_event *ev = event_of(event);
    if (ev == NULL || handle == NULL)
        return ev == NULL ? CUDA_ERROR_INVALID_HANDLE : CUDA_ERROR_INVALID_VALUE;
    if ((ev->flags & CU_EVENT_INTERPROCESS) == 0)
        return CUDA_ERROR_INVALID_VALUE;
    memset(handle, 0, sizeof *handle);
    memcpy(handle->reserved, &ev, sizeof ev);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuIpcOpenEventHandle(CUevent *event, CUipcEventHandle handle)
{
    struct fake_event *from = NULL;
    memcpy(&from, handle.reserved, sizeof from);
    if (event == NULL || event_of((CUevent)(void *)from) == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return cuEventCreate(event, from->flags);
}

/* A green context's stream is refused (cuda.h: cuStreamGetCtx_v2 names it). */
EXPORT CUresult cuStreamGetCtx(CUstream stream, CUcontext *ctx)
{
    struct fake_ctx *c = NULL;
    CUresult rc = ctx != NULL ? stream_ctx(stream, &c) : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS && c->magic == GREEN_MAGIC && !default_stream(stream))
        return CUDA_ERROR_NOT_SUPPORTED;
    if (rc == CUDA_SUCCESS)
        *ctx = (CUcontext)c;
    return rc;
}

/* CUDA 12.5's: a green context's stream (or a default one with it current) gives the green
 * context and its device's primary context, any other its context and NULL.
 * FAKE_CUDA_NO_STREAM_CTX_V2=1: CUDA_ERROR_NOT_SUPPORTED, as from a driver before it. */
EXPORT CUresult cuStreamGetCtx_v2(CUstream stream, CUcontext *ctx, CUgreenCtx *green)
{
    if (no_stream_ctx_v2)
        return CUDA_ERROR_NOT_SUPPORTED;
    struct fake_ctx *c = NULL;
    CUresult rc = ctx != NULL && green != NULL ? stream_ctx(stream, &c) : CUDA_ERROR_INVALID_VALUE;
    if (rc != CUDA_SUCCESS)
        return rc;
    int is_green = c->magic == GREEN_MAGIC;
    *ctx = is_green ? (CUcontext)&primary[c->dev] : (CUcontext)c;
    *green = is_green ? (CUgreenCtx)c : NULL;
    return CUDA_SUCCESS;
}

/* A stream of a green context (CUDA 12.4): its work runs there whatever is current. */
EXPORT CUresult cuGreenCtxStreamCreate(CUstream *stream, CUgreenCtx green, unsigned int flags,
                                       int priority)
{
    (void)flags;
    (void)priority;
    struct fake_ctx *g = (struct fake_ctx *)green;
    if (stream == NULL || g == NULL || g->magic != GREEN_MAGIC)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_stream *st = malloc(sizeof *st);
    if (st == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *st = (struct fake_stream){.magic = STREAM_MAGIC, .ctx = g};
    *stream = (CUstream)(void *)st;
    return CUDA_SUCCESS;
}

/* CUDA 12.8's. FAKE_CUDA_NO_STREAM_DEVICE=1: it answers CUDA_ERROR_NOT_SUPPORTED, so that the
 * library finds the device as on an older driver, through the stream's context. */
EXPORT CUresult cuStreamGetDevice(CUstream stream, CUdevice *dev)
{
    if (no_stream_device)
        return CUDA_ERROR_NOT_SUPPORTED;
    struct fake_ctx *c = NULL;
    CUresult rc = dev != NULL ? stream_ctx(stream, &c) : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS)
        *dev = c->dev;
    return rc;
}

/* ---- memory ------------------------------------------------------------------------------- */

static CUresult alloc_on(int dev, CUdeviceptr *dptr, size_t bytes, const char *name,
                         const struct fake_ctx *owner)
{
    if (fail_now(name))
        return CUDA_ERROR_UNKNOWN;
    uint64_t key = fake_alloc(dev, bytes, owner);
    if (key == 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *dptr = (CUdeviceptr)key;
    return CUDA_SUCCESS;
}

static CUresult alloc_current(CUdeviceptr *dptr, size_t bytes, const char *name)
{
    CUresult rc = need_ctx();
    rc = rc != CUDA_SUCCESS ? rc : alloc_on(current->dev, dptr, bytes, name, current);
    if (rc == CUDA_SUCCESS)
        run_inside(name); /* after the memory is taken */
    return rc;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes)
{
    return alloc_current(dptr, bytes, "cuMemAlloc_v2");
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    run_inside("cuMemFree_v2");
    if (fail_now("cuMemFree_v2")) {
        __atomic_add_fetch(&fake_cuda_stats.free_calls, 1, __ATOMIC_RELAXED);
        return CUDA_ERROR_UNKNOWN;
    }
    return fake_free(dptr);
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags)
{
    (void)flags;
    CUresult rc = alloc_current(dptr, bytes, "cuMemAllocManaged");
    if (rc == CUDA_SUCCESS) {
        pthread_mutex_lock(&table_lock);
        find_alloc(*dptr)->managed = 1;
        pthread_mutex_unlock(&table_lock);
    }
    return rc;
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

/* A destroyed sparse array's tiles let go of the memory they were mapped onto (below). */
static void array_gone(uint64_t array);

static CUresult destroy_array(uint64_t array)
{
    CUresult rc = fake_free(array);
    if (rc == CUDA_SUCCESS)
        array_gone(array);
    return rc;
}

EXPORT CUresult cuArrayDestroy(CUarray array) { return destroy_array((uint64_t)(uintptr_t)array); }

/* Every level, each half the one before in every dimension (at least 1). */
EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *handle,
                                       const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned int levels)
{
    if (handle == NULL || desc == NULL || levels == 0)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t bytes = 0;
    for (unsigned int l = 0; l < levels; l++) {
        size_t w = desc->Width >> l, h = desc->Height >> l, d = desc->Depth >> l;
        bytes += array_size(w ? w : 1, h ? h : (desc->Height != 0), d ? d : (desc->Depth != 0),
                            desc->NumChannels, desc->Format);
    }
    CUdeviceptr key;
    CUresult rc = alloc_current(&key, bytes, "cuMipmappedArrayCreate");
    if (rc == CUDA_SUCCESS)
        *handle = (CUmipmappedArray)(uintptr_t)key;
    return rc;
}

EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray array)
{
    return destroy_array((uint64_t)(uintptr_t)array);
}

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
    CUresult rc = alloc_on(prop->location.id, &key, bytes, "cuMemCreate", NULL);
    if (rc == CUDA_SUCCESS) {
        pthread_mutex_lock(&table_lock);
        find_alloc(key)->refs = 1;
        pthread_mutex_unlock(&table_lock);
        *handle = key;
    }
    return rc;
}

/* Virtual memory management as cuda.h says (cuMemRelease): a cuMemCreate allocation "will be
 * freed when all outstanding mappings to the memory are unmapped and when all outstanding
 * references to the handle are also released". Addresses are reserved from a range of their
 * own; a mapping covers one handle from its start (offset 0, as cuMemMap requires). */
enum { MAX_MAPPINGS = 256 };
static struct mapping {
    uint64_t va, size, handle;
} mappings[MAX_MAPPINGS];
static const uint64_t first_reserved = UINT64_C(0x600000000000);
static uint64_t next_reserved = UINT64_C(0x600000000000); /* first_reserved */

/* The mapping that holds address at (mappings never overlap), or NULL. Caller holds
 * table_lock. */
static const struct mapping *mapping_over(uint64_t at)
{
    for (int i = 0; i < MAX_MAPPINGS; i++)
        if (mappings[i].size != 0 && at - mappings[i].va < mappings[i].size)
            return &mappings[i];
    return NULL;
}

/* Frees a handle nothing holds any more. Caller holds table_lock. */
static void free_if_unheld(struct alloc *a)
{
    if (a->refs != 0 || a->maps != 0)
        return;
    struct alloc gone = *a;
    free_slot(a);
    gpu_free(gone.dev, gone.pid, gone.bytes);
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    __atomic_add_fetch(&fake_cuda_stats.free_calls, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&table_lock);
    struct alloc *a = find_alloc(handle);
    CUresult rc = a == NULL || a->refs == 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
    if (rc == CUDA_SUCCESS) {
        a->refs--;
        free_if_unheld(a);
    }
    pthread_mutex_unlock(&table_lock);
    return rc;
}

/* Shareable handles (POSIX file descriptors only): an import is one more reference to the same
 * allocation (cuda.h: the memory lives until every reference is released), under the same
 * handle value here, as cuMemRetainAllocationHandle gives. */
enum { MAX_EXPORTS = 64 };
static struct {
    int fd;
    uint64_t handle;
} exports[MAX_EXPORTS];

EXPORT CUresult cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle handle,
                                             CUmemAllocationHandleType type,
                                             unsigned long long flags)
{
    (void)flags;
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || shareable == NULL)
        return CUDA_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&table_lock);
    struct alloc *a = find_alloc(handle);
    int slot = -1;
    for (int i = 0; a != NULL && a->refs != 0 && i < MAX_EXPORTS && slot < 0; i++)
        if (exports[i].handle == 0)
            slot = i;
    int fd = slot >= 0 ? open("/dev/null", O_RDONLY | O_CLOEXEC) : -1;
    if (fd >= 0)
        exports[slot].fd = fd, exports[slot].handle = handle;
    pthread_mutex_unlock(&table_lock);
    if (fd < 0)
        return CUDA_ERROR_INVALID_VALUE;
    *(int *)shareable = fd;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
                                               void *shareable, CUmemAllocationHandleType type)
{
    int fd = (int)(intptr_t)shareable;
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || handle == NULL)
        return CUDA_ERROR_NOT_SUPPORTED;
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&table_lock);
    for (int i = 0; i < MAX_EXPORTS && rc != CUDA_SUCCESS; i++) {
        struct alloc *a = exports[i].handle != 0 && exports[i].fd == fd
                              ? find_alloc(exports[i].handle) : NULL;
        if (a != NULL) {
            a->refs++;
            *handle = a->key;
            rc = CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&table_lock);
    return rc;
}

/* Bindings that hold cuMemCreate memory as a mapping does, undone other than by cuMemUnmap: a
 * sparse array's tile mapped onto it (cuMemMapArrayAsync; undone by the tile's unmap or the
 * array's destruction), a multicast object's (cuMulticastBindMem, cuMulticastBindAddr;
 * cuMulticastUnbind). Keyed by what undoes them: the array and its tile, or the multicast
 * object and its offset. Any value serves as a multicast object here; sizes are not checked. */
enum { MAX_BINDINGS = 64 };
static struct binding {
    uint64_t holder, offset, handle;
} bindings[MAX_BINDINGS];

/* Binds handle's memory to holder at offset. Caller holds table_lock. */
static CUresult bind(uint64_t holder, uint64_t offset, uint64_t handle)
{
    struct alloc *a = find_alloc(handle);
    if (a == NULL || a->refs == 0)
        return CUDA_ERROR_INVALID_HANDLE;
    for (int i = 0; i < MAX_BINDINGS; i++)
        if (bindings[i].handle == 0) {
            bindings[i] = (struct binding){holder, offset, handle};
            a->maps++;
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_OUT_OF_MEMORY;
}

/* Undoes holder's bindings at offsets in [from, from + size). Caller holds table_lock. */
static void unbind(uint64_t holder, uint64_t from, uint64_t size)
{
    for (int i = 0; i < MAX_BINDINGS; i++) {
        if (bindings[i].handle == 0 || bindings[i].holder != holder ||
            bindings[i].offset - from >= size)
            continue;
        struct alloc *a = find_alloc(bindings[i].handle);
        bindings[i] = (struct binding){0};
        if (a != NULL) {
            a->maps--;
            free_if_unheld(a);
        }
    }
}

static void array_gone(uint64_t array)
{
    pthread_mutex_lock(&table_lock);
    unbind(array, 0, UINT64_MAX);
    pthread_mutex_unlock(&table_lock);
}

/* Each entry maps a tile of its array onto a handle's memory, or unmaps the tiles within it; a
 * tile is named by its level's x offset here (a mip tail's by its offset), an unmap covers
 * those from its x offset over its width (its offset over its size). */
EXPORT CUresult cuMemMapArrayAsync(CUarrayMapInfo *list, unsigned int count, CUstream stream)
{
    (void)stream;
    if (list == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&table_lock);
    for (unsigned int i = 0; i < count && rc == CUDA_SUCCESS; i++) {
        uint64_t array = (uint64_t)(uintptr_t)list[i].resource.array;
        int level = list[i].subresourceType == CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_SPARSE_LEVEL;
        uint64_t tile = level ? list[i].subresource.sparseLevel.offsetX
                              : list[i].subresource.miptail.offset;
        uint64_t extent = level ? list[i].subresource.sparseLevel.extentWidth
                                : list[i].subresource.miptail.size;
        if (list[i].memOperationType == CU_MEM_OPERATION_TYPE_UNMAP)
            unbind(array, tile, extent);
        else if (list[i].memOperationType != CU_MEM_OPERATION_TYPE_MAP ||
                 list[i].memHandleType != CU_MEM_HANDLE_TYPE_GENERIC)
            rc = CUDA_ERROR_INVALID_VALUE;
        else
            rc = bind(array, tile, list[i].memHandle.memHandle);
    }
    pthread_mutex_unlock(&table_lock);
    return rc;
}

EXPORT CUresult cuMemMapArrayAsync_ptsz(CUarrayMapInfo *list, unsigned int count,
                                        CUstream stream)
{
    __atomic_add_fetch(&fake_cuda_stats.map_array_ptsz_calls, 1, __ATOMIC_RELAXED);
    return cuMemMapArrayAsync(list, count, stream);
}

EXPORT CUresult cuMulticastBindMem(CUmemGenericAllocationHandle mc, size_t mc_offset,
                                   CUmemGenericAllocationHandle handle, size_t offset,
                                   size_t size, unsigned long long flags)
{
    (void)offset, (void)size;
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&table_lock);
    CUresult rc = bind(mc, mc_offset, handle);
    pthread_mutex_unlock(&table_lock);
    return rc;
}

/* CUDA 13.1's, naming the device bound (ignored here). */
EXPORT CUresult cuMulticastBindMem_v2(CUmemGenericAllocationHandle mc, CUdevice dev,
                                      size_t mc_offset, CUmemGenericAllocationHandle handle,
                                      size_t offset, size_t size, unsigned long long flags)
{
    (void)dev;
    return cuMulticastBindMem(mc, mc_offset, handle, offset, size, flags);
}

/* Binds the memory mapped at ptr (anywhere in a mapping; the first one's alone here). */
EXPORT CUresult cuMulticastBindAddr(CUmemGenericAllocationHandle mc, size_t mc_offset,
                                    CUdeviceptr ptr, size_t size, unsigned long long flags)
{
    (void)size;
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&table_lock);
    const struct mapping *m = mapping_over(ptr);
    CUresult rc = m != NULL ? bind(mc, mc_offset, m->handle) : CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&table_lock);
    return rc;
}

EXPORT CUresult cuMulticastBindAddr_v2(CUmemGenericAllocationHandle mc, CUdevice dev,
                                       size_t mc_offset, CUdeviceptr ptr, size_t size,
                                       unsigned long long flags)
{
    (void)dev;
    return cuMulticastBindAddr(mc, mc_offset, ptr, size, flags);
}

EXPORT CUresult cuMulticastUnbind(CUmemGenericAllocationHandle mc, CUdevice dev,
                                  size_t mc_offset, size_t size)
{
    (void)dev;
    pthread_mutex_lock(&table_lock);
    unbind(mc, mc_offset, size);
    pthread_mutex_unlock(&table_lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                    CUdeviceptr addr, unsigned long long flags)
{
    (void)alignment, (void)addr, (void)flags;
    if (ptr == NULL || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&table_lock);
    *ptr = next_reserved;
    next_reserved += (size + 0x1fffff) & ~UINT64_C(0x1fffff);
    pthread_mutex_unlock(&table_lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    (void)ptr, (void)size;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                         CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    (void)flags;
    pthread_mutex_lock(&table_lock);
    struct alloc *a = find_alloc(handle);
    struct mapping *slot = NULL;
    int overlaps = 0;
    for (int i = 0; i < MAX_MAPPINGS; i++) {
        if (mappings[i].size == 0 && slot == NULL)
            slot = &mappings[i];
        overlaps |= mappings[i].size != 0 && ptr < mappings[i].va + mappings[i].size &&
                    mappings[i].va < ptr + size;
    }
    CUresult rc = a == NULL || a->refs == 0 || offset != 0 || size == 0 || size > a->bytes ||
                  overlaps ? CUDA_ERROR_INVALID_VALUE
                  : slot == NULL ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
    if (rc == CUDA_SUCCESS) {
        *slot = (struct mapping){.va = ptr, .size = size, .handle = handle};
        a->maps++;
    }
    pthread_mutex_unlock(&table_lock);
    if (rc == CUDA_SUCCESS)
        run_inside("cuMemMap");
    return rc;
}

/* Unmaps the mappings from ptr on, each starting where the one before ended, up to ptr + size
 * (the range must be whole mappings). */
EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&table_lock);
    for (uint64_t at = ptr; at - ptr < size;) {
        struct mapping *m = NULL;
        for (int i = 0; i < MAX_MAPPINGS && m == NULL; i++)
            if (mappings[i].size != 0 && mappings[i].va == at)
                m = &mappings[i];
        if (m == NULL)
            break;
        at += m->size;
        struct alloc *a = find_alloc(m->handle);
        *m = (struct mapping){0};
        if (a != NULL) {
            a->maps--;
            free_if_unheld(a);
        }
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&table_lock);
    return rc;
}

EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&table_lock);
    const struct mapping *m = mapping_over((uint64_t)(uintptr_t)addr);
    struct alloc *a = m != NULL ? find_alloc(m->handle) : NULL;
    if (a != NULL && handle != NULL) {
        a->refs++;
        *handle = a->key;
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&table_lock);
    if (rc == CUDA_SUCCESS)
        run_inside("cuMemRetainAllocationHandle");
    return rc;
}

/* Each device's default pool, which is also its current one (the fake has no others): a handle
 * names its device. */

EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev)
{
    CUresult rc = need_device(dev);
    if (rc == CUDA_SUCCESS && pool == NULL)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS)
        *pool = (CUmemoryPool)(void *)&pool_handles[dev];
    return rc;
}

/* Set by a test: cuDeviceGetMemPool answers another pool than the default one (an empty pool
 * the fake knows nothing of, as after cuDeviceSetMemPool), while allocations still come from
 * the default pool (cuMemAllocFromPoolAsync with it). */
EXPORT int fake_cuda_current_pool_other;
static int other_pool;

EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    CUresult rc = cuDeviceGetDefaultMemPool(pool, dev);
    if (rc == CUDA_SUCCESS && fake_cuda_current_pool_other)
        *pool = (CUmemoryPool)(void *)&other_pool;
    return rc;
}

/* The device of a pool handle; -1: not one. */
static int pool_device(CUmemoryPool pool)
{
    int *p = (int *)(void *)pool;
    if (p >= &pool_aliases[0][0] && p < &pool_aliases[0][0] + ndevices * MAX_ALIASES)
        return (int)(p - &pool_aliases[0][0]) / MAX_ALIASES;
    return p >= pool_handles && p < pool_handles + ndevices ? (int)(p - pool_handles) : -1;
}

/* CU_MEMPOOL_ATTR_RELEASE_THRESHOLD only. */
EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    int dev = pool_device(pool);
    if (dev < 0 || value == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (attr != CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
        return CUDA_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&table_lock);
    pools[dev].threshold = *(const cuuint64_t *)value;
    pthread_mutex_unlock(&table_lock);
    return CUDA_SUCCESS;
}

/* What the pool holds (in use and cached), what is in use, and its release threshold. */
EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    int dev = pool_device(pool);
    if (dev < 0 || value == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (fail_now("cuMemPoolGetAttribute"))
        return CUDA_ERROR_UNKNOWN;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&table_lock);
    struct pool p = pools[dev];
    pthread_mutex_unlock(&table_lock);
    switch (attr) {
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: *(cuuint64_t *)value = p.used + p.cached; break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *(cuuint64_t *)value = p.used; break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *(cuuint64_t *)value = p.threshold; break;
    default: rc = CUDA_ERROR_NOT_SUPPORTED;
    }
    return rc;
}

/* Gives back cached memory until the pool holds (in use and cached) at most keep bytes. */
EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
    int dev = pool_device(pool);
    if (dev < 0)
        return CUDA_ERROR_INVALID_VALUE;
    __atomic_add_fetch(&fake_cuda_stats.pool_trims, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&table_lock);
    pool_release(dev, keep > pools[dev].used ? keep - pools[dev].used : 0);
    pthread_mutex_unlock(&table_lock);
    return CUDA_SUCCESS;
}

/* From the stream's device's pool (pool NULL), or from pool, on its own device, as the driver
 * does; the stream must be valid (a default one needs a current context). The fake never calls
 * its own exports: under libvgpu those calls would reach the wrappers. */
static CUresult alloc_async(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream stream,
                            const char *name)
{
    struct fake_ctx *ctx;
    CUresult rc = stream_ctx(stream, &ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    int dev = pool != NULL ? pool_device(pool) : ctx->dev;
    if (dev < 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (fail_now(name))
        return CUDA_ERROR_UNKNOWN;
    if (fake_cuda_capturing) { /* an allocation node of the graph captured: no memory yet */
        *dptr = (CUdeviceptr)new_graph_address(bytes);
        return CUDA_SUCCESS;
    }
    uint64_t key = fake_alloc_at(dev, bytes, &next_address, UINT64_MAX, 1, NULL);
    if (key == 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *dptr = (CUdeviceptr)key;
    run_inside("cuMemAllocAsync"); /* any flavour, after the memory is taken */
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream stream)
{
    return alloc_async(dptr, bytes, NULL, stream, "cuMemAllocAsync");
}

EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream stream)
{
    __atomic_add_fetch(&fake_cuda_stats.async_ptsz_calls, 1, __ATOMIC_RELAXED);
    return alloc_async(dptr, bytes, NULL, stream, "cuMemAllocAsync");
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool,
                                        CUstream stream)
{
    return pool != NULL ? alloc_async(dptr, bytes, pool, stream, "cuMemAllocFromPoolAsync")
                        : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool,
                                             CUstream stream)
{
    __atomic_add_fetch(&fake_cuda_stats.async_ptsz_calls, 1, __ATOMIC_RELAXED);
    return pool != NULL ? alloc_async(dptr, bytes, pool, stream, "cuMemAllocFromPoolAsync")
                        : CUDA_ERROR_INVALID_VALUE;
}

/* During a capture the free becomes a graph's free node, which must name a graph allocation
 * (cuda.h, cuMemFreeAsync). */
EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream)
{
    (void)stream;
    return fake_cuda_capturing && !graph_address(dptr) ? CUDA_ERROR_INVALID_VALUE
                                                        : fake_free(dptr);
}

EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream)
{
    __atomic_add_fetch(&fake_cuda_stats.async_ptsz_calls, 1, __ATOMIC_RELAXED);
    return cuMemFreeAsync(dptr, stream);
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    CUresult rc = need_ctx();
    if (rc != CUDA_SUCCESS)
        return rc;
    uint64_t used = fake_cuda_device_physical_used(current->dev);
    *free_bytes = (size_t)(used < device_bytes ? device_bytes - used : 0);
    *total_bytes = (size_t)device_bytes;
    return CUDA_SUCCESS;
}

/* Whether ptr lies among the addresses the fake hands out (allocations, v1 ones, graph
 * allocations, reserved ranges). Caller holds table_lock. */
static int fake_address(uint64_t ptr)
{
    return (ptr >= first_address && ptr < next_address) ||
           (ptr >= first_low_address && ptr < next_low_address) ||
           (ptr >= graph_va_base && ptr < __atomic_load_n(&next_graph_va, __ATOMIC_RELAXED)) ||
           (ptr >= first_reserved && ptr < next_reserved);
}

/* What a copy's address is: 1 the start of one of the process's live allocations holding
 * bytes, 0 the host's, -1 neither (an allocation too small or another process's, or an
 * address of the fake's inside one or freed: it knows allocations by their start). */
static int copy_side(uint64_t ptr, uint64_t bytes)
{
    pthread_mutex_lock(&table_lock);
    const struct alloc *a = find_alloc(ptr);
    int side = a != NULL ? (a->pid == (int32_t)getpid() && bytes <= a->bytes ? 1 : -1)
                         : (ptr == 0 || fake_address(ptr) ? -1 : 0);
    pthread_mutex_unlock(&table_lock);
    return side;
}

/* A synchronous copy: it waits for all the caller's work on the current device first, as the
 * fake's stream synchronisation does, whichever way it copies (libvgpu must tell which copies
 * it may take for a drain), but returns at once where there is nothing to copy. The fake's
 * device memory has no backing and reads as zeros. */
static CUresult copy_now(uint64_t dst, uint64_t src, uint64_t bytes)
{
    CUresult rc = need_ctx();
    if (rc != CUDA_SUCCESS)
        return rc;
    int to = copy_side(dst, bytes), from = copy_side(src, bytes);
    if (to < 0 || from < 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (bytes == 0)
        return CUDA_SUCCESS;
    gpu_wait_pending(current->dev, 0);
    if (to == 0 && from == 0)
        memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, bytes);
    else if (to == 0)
        memset((void *)(uintptr_t)dst, 0, bytes);
    return CUDA_SUCCESS;
}

static CUresult copy_to_host(void *dst, uint64_t src, uint64_t bytes)
{
    return copy_side(src, bytes) == 1 ? copy_now((uintptr_t)dst, src, bytes)
                                      : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t bytes)
{
    return copy_now(dst, src, bytes);
}

EXPORT CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t bytes)
{
    return copy_now(dst, src, bytes);
}

EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes)
{
    return copy_to_host(dst, src, bytes);
}

EXPORT CUresult cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t bytes)
{
    return copy_to_host(dst, src, bytes);
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
    uint64_t key = fake_alloc_at(current->dev, bytes, &next_low_address, UINT32_MAX, 0, current);
    if (key == 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *dptr = (v1_ptr)key;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyDtoH(void *dst, v1_ptr src, unsigned int bytes)
{
    return copy_to_host(dst, src, bytes);
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

/* ---- modules: a kernel is found by name in a PTX image; the fake never runs its code ---- */

static int function_token; /* what every function handle points at */

/* A loaded image (module or library) is a copy of its PTX (the caller may free its own, as with
 * the driver); NULL with *rc set when it is not PTX with an entry. */
static char *load_image(const void *image, CUresult *rc)
{
    if (image == NULL || strstr(image, ".entry") == NULL) {
        *rc = CUDA_ERROR_INVALID_IMAGE;
        return NULL;
    }
    char *copy = strdup(image);
    *rc = copy != NULL ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    return copy;
}

/* A kernel's name must be an entry of the loaded PTX, as the driver requires. */
static CUresult find_entry(const void *loaded, const char *name)
{
    if (loaded == NULL || name == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    char entry[256];
    snprintf(entry, sizeof entry, ".entry %s(", name);
    return strstr(loaded, entry) != NULL ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

static CUresult unload_image(void *loaded)
{
    if (loaded == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    free(loaded);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    CUresult rc = need_ctx();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (module == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *module = (CUmodule)(void *)load_image(image, &rc);
    return rc;
}

EXPORT CUresult cuModuleGetFunction(CUfunction *function, CUmodule module, const char *name)
{
    CUresult rc = function != NULL ? find_entry(module, name) : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS)
        *function = (CUfunction)(void *)&function_token;
    return rc;
}

EXPORT CUresult cuModuleUnload(CUmodule module)
{
    return unload_image(module);
}

/* ---- libraries (CUDA 12): context-less kernels, launched by casting a CUkernel to CUfunction.
 * cuFuncGetAttribute is documented for CUfunction alone, so the fake refuses a CUkernel there;
 * cuKernelGetAttribute answers for it (per device). ---------------------------------------- */

static int kernel_token; /* what every kernel handle points at */

EXPORT CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jit_options,
                                  void **jit_values, unsigned jit_count,
                                  CUlibraryOption *options, void **values, unsigned count)
{
    (void)jit_options, (void)jit_values, (void)jit_count, (void)options, (void)values, (void)count;
    if (library == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc;
    *library = (CUlibrary)(void *)load_image(code, &rc);
    return rc;
}

EXPORT CUresult cuLibraryGetKernel(CUkernel *kernel, CUlibrary library, const char *name)
{
    CUresult rc = kernel != NULL ? find_entry(library, name) : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS)
        *kernel = (CUkernel)(void *)&kernel_token;
    return rc;
}

EXPORT CUresult cuLibraryUnload(CUlibrary library)
{
    return unload_image(library);
}

/* The local memory each thread of any kernel needs (cuFuncGetAttribute), set by a test. */
EXPORT uint64_t fake_cuda_local_bytes;

EXPORT CUresult cuKernelGetAttribute(int *value, CUfunction_attribute attr, CUkernel kernel,
                                     CUdevice dev)
{
    if (value == NULL || kernel != (CUkernel)(void *)&kernel_token || dev < 0 ||
        dev >= ndevices || attr != CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)
        return CUDA_ERROR_INVALID_VALUE;
    *value = (int)fake_cuda_local_bytes;
    return CUDA_SUCCESS;
}

/* ---- launches ----------------------------------------------------------------------------- */

EXPORT CUresult cuFuncGetAttribute(int *value, CUfunction_attribute attr, CUfunction f)
{
    if (f == (CUfunction)(void *)&kernel_token)
        return CUDA_ERROR_INVALID_HANDLE;
    if (value == NULL || f == NULL || attr != CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)
        return CUDA_ERROR_INVALID_VALUE;
    *value = (int)fake_cuda_local_bytes;
    return CUDA_SUCCESS;
}

/* A launch of f (NULL: the old tests' stand-in, or a graph) of `blocks` blocks on stream. A
 * CUkernel runs in its stream's context, whatever is current (cuda.h, cuLaunchKernel); anything
 * else in the current one. The driver raises that context's stack for a kernel whose threads
 * need more than it holds, and keeps it (cuda.h). */
static CUresult launch_on(enum fake_launch_variant variant, CUfunction f, CUstream stream,
                          uint64_t blocks)
{
    struct fake_ctx *ctx = current;
    CUresult rc = f == (CUfunction)(void *)&kernel_token && !default_stream(stream)
                      ? stream_ctx(stream, &ctx) : need_ctx();
    if (rc != CUDA_SUCCESS)
        return rc;
    run_inside("cuLaunchKernel"); /* any launch, before the driver raises the stack */
    if (f != NULL && fake_cuda_local_bytes > limits_of(ctx)[CU_LIMIT_STACK_SIZE] &&
        set_limit(ctx, CU_LIMIT_STACK_SIZE, fake_cuda_local_bytes) != CUDA_SUCCESS)
        return CUDA_ERROR_OUT_OF_MEMORY;
    __atomic_add_fetch(&fake_cuda_stats.launches[variant], 1, __ATOMIC_RELAXED);
    gpu_get();
    if (ns_per_block == 0 && gpu_lazy_bytes == 0) /* the benchmark: no model, no lock */
        return CUDA_SUCCESS;
    return gpu_submit(ctx->dev, blocks * ns_per_block) == 0 ? CUDA_SUCCESS
                                                           : CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult launch(enum fake_launch_variant variant, CUfunction f, uint64_t blocks)
{
    return launch_on(variant, f, NULL, blocks);
}

/* A launch or memset refused for its arguments, after FAKE_CUDA_REFUSE_US. */
static CUresult refused(void)
{
    if (refuse_ns != 0)
        gpu_sleep_ns(refuse_ns);
    return CUDA_ERROR_INVALID_VALUE;
}

/* A grid past what a GPU takes (2^31 - 1 blocks across, 65535 down and deep; none empty) is
 * refused, as the driver refuses it: CUDA_ERROR_INVALID_VALUE, nothing queued. */
static CUresult launch_grid(enum fake_launch_variant variant, CUfunction f, CUstream stream,
                            unsigned gx, unsigned gy, unsigned gz)
{
    if (gx == 0 || gy == 0 || gz == 0 || gx > INT32_MAX || gy > 65535 || gz > 65535)
        return refused();
    return launch_on(variant, f, stream, (uint64_t)gx * gy * gz);
}

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned shmem, CUstream stream,
                               void **params, void **extra)
{
    (void)bx, (void)by, (void)bz, (void)shmem, (void)params, (void)extra;
    return launch_grid(FAKE_LAUNCH, f, stream, gx, gy, gz);
}

EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                    unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                                    CUstream stream, void **params, void **extra)
{
    (void)bx, (void)by, (void)bz, (void)shmem, (void)params, (void)extra;
    return launch_grid(FAKE_LAUNCH_PTSZ, f, stream, gx, gy, gz);
}

EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **p, void **e)
{
    (void)p, (void)e;
    return launch_grid(FAKE_LAUNCH_EX, f, c->hStream, c->gridDimX, c->gridDimY, c->gridDimZ);
}

EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **p, void **e)
{
    (void)p, (void)e;
    return launch_grid(FAKE_LAUNCH_EX_PTSZ, f, c->hStream, c->gridDimX, c->gridDimY,
                       c->gridDimZ);
}

EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                          unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                                          CUstream stream, void **params)
{
    (void)bx, (void)by, (void)bz, (void)shmem, (void)params;
    return launch_grid(FAKE_LAUNCH_COOP, f, stream, gx, gy, gz);
}

EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy,
                                               unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                               unsigned shmem, CUstream stream, void **params)
{
    (void)bx, (void)by, (void)bz, (void)shmem, (void)params;
    return launch_grid(FAKE_LAUNCH_COOP_PTSZ, f, stream, gx, gy, gz);
}

/* The deprecated launches (cuda.h): the block shape and parameters were set beforehand. */
EXPORT CUresult cuLaunch(CUfunction f) { return launch(FAKE_LAUNCH_V1, f, 1); }

EXPORT CUresult cuLaunchGrid(CUfunction f, int width, int height)
{
    if (width <= 0 || height <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    return launch(FAKE_LAUNCH_GRID, f, (uint64_t)width * (uint64_t)height);
}

EXPORT CUresult cuLaunchGridAsync(CUfunction f, int width, int height, CUstream stream)
{
    (void)stream;
    if (width <= 0 || height <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    return launch(FAKE_LAUNCH_GRID_ASYNC, f, (uint64_t)width * (uint64_t)height);
}

/* One launch for the whole list, on the current context's device (the fake's simplification). */
EXPORT CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *list, unsigned int count,
                                                     unsigned int flags)
{
    (void)flags;
    if (list == NULL || count == 0)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t blocks = 0;
    unsigned devices = 0;
    /* cuda.h allows neither a default stream nor two kernels on one device: checked before
     * anything is launched. */
    for (unsigned int i = 0; i < count; i++) {
        struct fake_ctx *ctx;
        CUresult rc = default_stream(list[i].hStream) ? CUDA_ERROR_INVALID_HANDLE
                                                      : stream_ctx(list[i].hStream, &ctx);
        if (rc != CUDA_SUCCESS)
            return rc;
        if (devices & (1u << ctx->dev))
            return CUDA_ERROR_INVALID_VALUE;
        devices |= 1u << ctx->dev;
    }
    for (unsigned int i = 0; i < count; i++) {
        /* Each kernel runs in its stream's context, which raises its own stack for it. */
        struct fake_ctx *ctx = NULL;
        if (stream_ctx(list[i].hStream, &ctx) != CUDA_SUCCESS) /* answered in the loop above */
            return CUDA_ERROR_INVALID_HANDLE;
        if (list[i].function != NULL &&
            fake_cuda_local_bytes > limits_of(ctx)[CU_LIMIT_STACK_SIZE] &&
            set_limit(ctx, CU_LIMIT_STACK_SIZE, fake_cuda_local_bytes) != CUDA_SUCCESS)
            return CUDA_ERROR_OUT_OF_MEMORY;
        blocks += (uint64_t)list[i].gridDimX * list[i].gridDimY * list[i].gridDimZ;
    }
    return launch(FAKE_LAUNCH_MULTI_DEVICE, NULL, blocks); /* the stacks raised above */
}

/* ---- memsets ------------------------------------------------------------------------------ */

/* The driver's memset is a kernel: here one of a block per 4 KiB set, at least one. */
static uint64_t memset_blocks(uint64_t bytes)
{
    return bytes != 0 ? (bytes + 4095) / 4096 : 1;
}

/* A memset of `bytes` on stream, run as memset_blocks (the fake's addresses hold nothing to
 * set). Counted in fake_cuda_stats.memsets. */
static CUresult memset_on(CUstream stream, uint64_t bytes)
{
    struct fake_ctx *ctx = current;
    CUresult rc = default_stream(stream) ? need_ctx() : stream_ctx(stream, &ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (bytes > device_bytes)
        return refused(); /* no allocation is that large: as a driver refuses a range outside
                           * its allocations */
    __atomic_add_fetch(&fake_cuda_stats.memsets, 1, __ATOMIC_RELAXED);
    gpu_get();
    if (ns_per_block == 0)
        return CUDA_SUCCESS;
    return gpu_submit(ctx->dev, memset_blocks(bytes) * ns_per_block) == 0
               ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}


EXPORT CUresult cuMemsetD8(v1_ptr dst, unsigned char value, unsigned int n)
{
    (void)dst, (void)value;
    return memset_on(NULL, (uint64_t)n);
}

EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n)
{
    (void)dst, (void)value;
    return memset_on(NULL, (uint64_t)n);
}

EXPORT CUresult cuMemsetD8_v2_ptds(CUdeviceptr dst, unsigned char value, size_t n)
{
    (void)dst, (void)value;
    return memset_on(NULL, (uint64_t)n);
}

EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, CUstream stream)
{
    (void)dst, (void)value;
    return memset_on(stream, (uint64_t)n);
}

EXPORT CUresult cuMemsetD8Async_ptsz(CUdeviceptr dst, unsigned char value, size_t n,
                                     CUstream stream)
{
    (void)dst, (void)value;
    return memset_on(stream, (uint64_t)n);
}

EXPORT CUresult cuMemsetD2D8(v1_ptr dst, unsigned int pitch, unsigned char value,
                             unsigned int width, unsigned int height)
{
    (void)dst, (void)pitch, (void)value;
    return memset_on(NULL, (uint64_t)width * height);
}

EXPORT CUresult cuMemsetD2D8_v2(CUdeviceptr dst, size_t pitch, unsigned char value, size_t width,
                                size_t height)
{
    (void)dst, (void)pitch, (void)value;
    return memset_on(NULL, (uint64_t)width * height);
}

EXPORT CUresult cuMemsetD2D8_v2_ptds(CUdeviceptr dst, size_t pitch, unsigned char value,
                                     size_t width, size_t height)
{
    (void)dst, (void)pitch, (void)value;
    return memset_on(NULL, (uint64_t)width * height);
}

EXPORT CUresult cuMemsetD2D8Async(CUdeviceptr dst, size_t pitch, unsigned char value, size_t width,
                                  size_t height, CUstream stream)
{
    (void)dst, (void)pitch, (void)value;
    return memset_on(stream, (uint64_t)width * height);
}

EXPORT CUresult cuMemsetD2D8Async_ptsz(CUdeviceptr dst, size_t pitch, unsigned char value,
                                       size_t width, size_t height, CUstream stream)
{
    (void)dst, (void)pitch, (void)value;
    return memset_on(stream, (uint64_t)width * height);
}

EXPORT CUresult cuMemsetD16(v1_ptr dst, unsigned short value, unsigned int n)
{
    (void)dst, (void)value;
    return memset_on(NULL, (uint64_t)n * 2);
}

EXPORT CUresult cuMemsetD16_v2(CUdeviceptr dst, unsigned short value, size_t n)
{
    (void)dst, (void)value;
    return memset_on(NULL, (uint64_t)n * 2);
}

EXPORT CUresult cuMemsetD16_v2_ptds(CUdeviceptr dst, unsigned short value, size_t n)
{
    (void)dst, (void)value;
    return memset_on(NULL, (uint64_t)n * 2);
}

EXPORT CUresult cuMemsetD16Async(CUdeviceptr dst, unsigned short value, size_t n, CUstream stream)
{
    (void)dst, (void)value;
    return memset_on(stream, (uint64_t)n * 2);
}

EXPORT CUresult cuMemsetD16Async_ptsz(CUdeviceptr dst, unsigned short value, size_t n,
                                      CUstream stream)
{
    (void)dst, (void)value;
    return memset_on(stream, (uint64_t)n * 2);
}

EXPORT CUresult cuMemsetD2D16(v1_ptr dst, unsigned int pitch, unsigned short value,
                              unsigned int width, unsigned int height)
{
    (void)dst, (void)pitch, (void)value;
    return memset_on(NULL, (uint64_t)width * height * 2);
}

EXPORT CUresult cuMemsetD2D16_v2(CUdeviceptr dst, size_t pitch, unsigned short value, size_t width,
                                 size_t height)
{
    (void)dst, (void)pitch, (void)value;
    return memset_on(NULL, (uint64_t)width * height * 2);
}

EXPORT CUresult cuMemsetD2D16_v2_ptds(CUdeviceptr dst, size_t pitch, unsigned short value,
                                      size_t width, size_t height)
{
    (void)dst, (void)pitch, (void)value;
    return memset_on(NULL, (uint64_t)width * height * 2);
}

EXPORT CUresult cuMemsetD2D16Async(CUdeviceptr dst, size_t pitch, unsigned short value,
                                   size_t width, size_t height, CUstream stream)
{
    (void)dst, (void)pitch, (void)value;
    return memset_on(stream, (uint64_t)width * height * 2);
}

EXPORT CUresult cuMemsetD2D16Async_ptsz(CUdeviceptr dst, size_t pitch, unsigned short value,
                                        size_t width, size_t height, CUstream stream)
{
    (void)dst, (void)pitch, (void)value;
    return memset_on(stream, (uint64_t)width * height * 2);
}

EXPORT CUresult cuMemsetD32(v1_ptr dst, unsigned int value, unsigned int n)
{
    (void)dst, (void)value;
    return memset_on(NULL, (uint64_t)n * 4);
}

EXPORT CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned int value, size_t n)
{
    (void)dst, (void)value;
    return memset_on(NULL, (uint64_t)n * 4);
}

EXPORT CUresult cuMemsetD32_v2_ptds(CUdeviceptr dst, unsigned int value, size_t n)
{
    (void)dst, (void)value;
    return memset_on(NULL, (uint64_t)n * 4);
}

EXPORT CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t n, CUstream stream)
{
    (void)dst, (void)value;
    return memset_on(stream, (uint64_t)n * 4);
}

EXPORT CUresult cuMemsetD32Async_ptsz(CUdeviceptr dst, unsigned int value, size_t n,
                                      CUstream stream)
{
    (void)dst, (void)value;
    return memset_on(stream, (uint64_t)n * 4);
}

EXPORT CUresult cuMemsetD2D32(v1_ptr dst, unsigned int pitch, unsigned int value,
                              unsigned int width, unsigned int height)
{
    (void)dst, (void)pitch, (void)value;
    return memset_on(NULL, (uint64_t)width * height * 4);
}

EXPORT CUresult cuMemsetD2D32_v2(CUdeviceptr dst, size_t pitch, unsigned int value, size_t width,
                                 size_t height)
{
    (void)dst, (void)pitch, (void)value;
    return memset_on(NULL, (uint64_t)width * height * 4);
}

EXPORT CUresult cuMemsetD2D32_v2_ptds(CUdeviceptr dst, size_t pitch, unsigned int value,
                                      size_t width, size_t height)
{
    (void)dst, (void)pitch, (void)value;
    return memset_on(NULL, (uint64_t)width * height * 4);
}

EXPORT CUresult cuMemsetD2D32Async(CUdeviceptr dst, size_t pitch, unsigned int value, size_t width,
                                   size_t height, CUstream stream)
{
    (void)dst, (void)pitch, (void)value;
    return memset_on(stream, (uint64_t)width * height * 4);
}

EXPORT CUresult cuMemsetD2D32Async_ptsz(CUdeviceptr dst, size_t pitch, unsigned int value,
                                        size_t width, size_t height, CUstream stream)
{
    (void)dst, (void)pitch, (void)value;
    return memset_on(stream, (uint64_t)width * height * 4);
}

/* ---- graphs ------------------------------------------------------------------------------- */

/* Graphs, nodes and executable graphs are this process's objects. A node keeps its kernel's
 * parameters (gridDim) or a copy of its child graph, as the driver does; an executable graph
 * keeps a copy of the graph it runs, whose nodes the exec-level setters change (naming them by
 * the nodes of the graph it was made from, as the driver does), and the total blocks of its
 * enabled kernel nodes, child graphs included, which is its cost. Graphs and execs are listed
 * so that an unknown handle is refused rather than read. */
struct fake_graph;

struct fake_node {
    CUgraphNodeType type;
    CUDA_KERNEL_NODE_PARAMS params;  /* CU_GRAPH_NODE_TYPE_KERNEL */
    struct fake_graph *child;        /* CU_GRAPH_NODE_TYPE_GRAPH: owned by the node */
    CUDA_MEM_ALLOC_NODE_PARAMS alloc; /* CU_GRAPH_NODE_TYPE_MEM_ALLOC (dptr: its address) */
    CUDA_MEMSET_NODE_PARAMS memset;  /* CU_GRAPH_NODE_TYPE_MEMSET */
    int disabled;                    /* in an executable graph's copy: cuGraphNodeSetEnabled */
    CUgraphConditionalNodeType cond; /* CU_GRAPH_NODE_TYPE_CONDITIONAL: its body is child */
    CUgraph bodies[1];               /* what cuGraphAddNode's phGraph_out points to */
};

struct fake_graph {
    struct fake_graph *next_graph;   /* every live graph, child copies included */
    struct fake_node **nodes;
    size_t count;
};

struct fake_exec {
    struct fake_exec *next_exec;
    const struct fake_graph *source; /* the graph it was instantiated from (names its nodes) */
    struct fake_graph *copy;         /* what it runs */
    uint64_t blocks;
    uint64_t alloc[GPU_MAX_DEVICES]; /* what its allocation nodes take on each device */
    int mapped;                      /* that memory is mapped for it (launched or uploaded) */
};

/* Each device's graph memory pool (this process's): what it holds from the device, and what
 * executable graphs map of it. A graph's allocations are mapped at its first launch or upload,
 * from what no graph maps first, and kept mapped for it until it is destroyed; what the pool
 * holds stays held until cuDeviceGraphMemTrim. Under graph_lock. */
static struct {
    uint64_t reserved, mapped;
} graph_pools[GPU_MAX_DEVICES];
EXPORT int fake_cuda_graph_remap;

static struct fake_graph *graphs;
static struct fake_exec *execs;
static pthread_mutex_t graph_lock = PTHREAD_MUTEX_INITIALIZER;

static int graph_known(const struct fake_graph *g)
{
    for (const struct fake_graph *x = graphs; x != NULL; x = x->next_graph)
        if (x == g)
            return 1;
    return 0;
}

static int node_known(const struct fake_node *n)
{
    for (const struct fake_graph *g = graphs; g != NULL; g = g->next_graph)
        for (size_t i = 0; i < g->count; i++)
            if (g->nodes[i] == n)
                return 1;
    return 0;
}

static struct fake_exec **exec_link(const struct fake_exec *e)
{
    for (struct fake_exec **x = &execs; *x != NULL; x = &(*x)->next_exec)
        if (*x == e)
            return x;
    return NULL;
}

static struct fake_graph *graph_new(void)
{
    struct fake_graph *g = calloc(1, sizeof *g);
    if (g != NULL) {
        g->next_graph = graphs;
        graphs = g;
    }
    return g;
}

static void graph_free(struct fake_graph *g)
{
    for (struct fake_graph **x = &graphs; *x != NULL; x = &(*x)->next_graph)
        if (*x == g) {
            *x = g->next_graph;
            break;
        }
    for (size_t i = 0; i < g->count; i++) {
        if (g->nodes[i]->child != NULL)
            graph_free(g->nodes[i]->child);
        free(g->nodes[i]);
    }
    free(g->nodes);
    free(g);
}

static struct fake_node *graph_add(struct fake_graph *g, CUgraphNodeType type)
{
    struct fake_node **grown = realloc(g->nodes, (g->count + 1) * sizeof *grown);
    struct fake_node *n = calloc(1, sizeof *n);
    if (grown == NULL || n == NULL) {
        free(n);
        if (grown != NULL)
            g->nodes = grown;
        return NULL;
    }
    g->nodes = grown;
    g->nodes[g->count++] = n;
    n->type = type;
    return n;
}

/* A deep copy: a child graph node embeds a clone of the graph it was given. */
/* How often a WHILE node's body runs at each launch of its graph (a test sets it). */
EXPORT unsigned fake_cuda_while_loops = 1;

static struct fake_graph *graph_clone(const struct fake_graph *src)
{
    struct fake_graph *g = graph_new();
    for (size_t i = 0; g != NULL && i < src->count; i++) {
        struct fake_node *n = graph_add(g, src->nodes[i]->type);
        if (n != NULL) {
            n->params = src->nodes[i]->params;
            n->alloc = src->nodes[i]->alloc;
            n->memset = src->nodes[i]->memset;
            n->cond = src->nodes[i]->cond;
            if (src->nodes[i]->child != NULL)
                n->child = graph_clone(src->nodes[i]->child);
        }
        if (n == NULL || (src->nodes[i]->child != NULL && n->child == NULL)) {
            graph_free(g);
            g = NULL;
        }
    }
    return g;
}

/* A memset node runs as the memset exports do (memset_blocks). */
static uint64_t memset_node_blocks(const CUDA_MEMSET_NODE_PARAMS *m)
{
    return memset_blocks((uint64_t)m->elementSize * m->width * m->height);
}

static uint64_t graph_blocks(const struct fake_graph *g)
{
    uint64_t blocks = 0;
    for (size_t i = 0; i < g->count; i++) {
        const struct fake_node *n = g->nodes[i];
        if (n->disabled)
            continue;
        if (n->type == CU_GRAPH_NODE_TYPE_KERNEL)
            blocks += (uint64_t)n->params.gridDimX * n->params.gridDimY * n->params.gridDimZ;
        else if (n->type == CU_GRAPH_NODE_TYPE_MEMSET)
            blocks += memset_node_blocks(&n->memset);
        else if (n->type == CU_GRAPH_NODE_TYPE_CONDITIONAL && n->cond == CU_GRAPH_COND_TYPE_WHILE)
            blocks += graph_blocks(n->child) * fake_cuda_while_loops;
        else if (n->child != NULL)
            blocks += graph_blocks(n->child); /* a child graph; an IF's body (its condition set) */
    }
    return blocks;
}

/* Adds what g's allocation nodes take, child graphs included, to alloc[]. */
static void graph_allocations(const struct fake_graph *g, uint64_t *alloc)
{
    for (size_t i = 0; i < g->count; i++) {
        const struct fake_node *n = g->nodes[i];
        if (n->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC)
            alloc[n->alloc.poolProps.location.id] += n->alloc.bytesize;
        else if (n->child != NULL)
            graph_allocations(n->child, alloc);
    }
}

EXPORT CUresult cuGraphCreate(CUgraph *graph, unsigned int flags)
{
    if (graph == NULL || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&graph_lock);
    struct fake_graph *g = graph_new();
    pthread_mutex_unlock(&graph_lock);
    *graph = (CUgraph)g;
    return g != NULL ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

EXPORT CUresult cuGraphDestroy(CUgraph graph)
{
    pthread_mutex_lock(&graph_lock);
    int known = graph_known((struct fake_graph *)graph);
    if (known)
        graph_free((struct fake_graph *)graph);
    pthread_mutex_unlock(&graph_lock);
    return known ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* Adds a node of `type` to graph (dependencies do not change the cost, so are not kept). */
static CUresult add_node(CUgraphNode *out, CUgraph graph, CUgraphNodeType type,
                         const CUDA_KERNEL_NODE_PARAMS *params, CUgraph child)
{
    if (out == NULL || (type == CU_GRAPH_NODE_TYPE_KERNEL && params == NULL))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&graph_lock);
    struct fake_graph *g = (struct fake_graph *)graph;
    if (graph_known(g) && (child == NULL || graph_known((struct fake_graph *)child))) {
        struct fake_graph *copy = child != NULL ? graph_clone((struct fake_graph *)child) : NULL;
        struct fake_node *n = child == NULL || copy != NULL ? graph_add(g, type) : NULL;
        if (n != NULL) {
            if (params != NULL)
                n->params = *params;
            n->child = copy;
            *out = (CUgraphNode)n;
            rc = CUDA_SUCCESS;
        } else {
            if (copy != NULL)
                graph_free(copy);
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    pthread_mutex_unlock(&graph_lock);
    return rc;
}

EXPORT CUresult cuGraphAddKernelNode_v2(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                        size_t ndeps, const CUDA_KERNEL_NODE_PARAMS *params)
{
    (void)deps, (void)ndeps;
    return add_node(node, graph, CU_GRAPH_NODE_TYPE_KERNEL, params, NULL);
}

EXPORT CUresult cuGraphAddChildGraphNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                         size_t ndeps, CUgraph child)
{
    (void)deps, (void)ndeps;
    if (child == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return add_node(node, graph, CU_GRAPH_NODE_TYPE_GRAPH, NULL, child);
}

static unsigned long long conditional_handles;

EXPORT CUresult cuGraphConditionalHandleCreate(CUgraphConditionalHandle *handle, CUgraph graph,
                                               CUcontext ctx, unsigned int value,
                                               unsigned int flags)
{
    (void)ctx, (void)value, (void)flags;
    pthread_mutex_lock(&graph_lock);
    int known = graph_known((struct fake_graph *)graph);
    pthread_mutex_unlock(&graph_lock);
    if (handle == NULL || !known)
        return CUDA_ERROR_INVALID_VALUE;
    *handle = __atomic_add_fetch(&conditional_handles, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

/* CUDA 12's generic node creation; the fake makes conditional nodes of one body only (an IF's
 * body runs once a launch, a WHILE's fake_cuda_while_loops times). The body graph is the
 * driver's (phGraph_out), filled by the caller afterwards. */
EXPORT CUresult cuGraphAddNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                               size_t ndeps, CUgraphNodeParams *params)
{
    (void)deps, (void)ndeps;
    if (node == NULL || params == NULL || params->type != CU_GRAPH_NODE_TYPE_CONDITIONAL)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (params->conditional.size != 1 || params->conditional.handle == 0 ||
        (params->conditional.type != CU_GRAPH_COND_TYPE_IF &&
         params->conditional.type != CU_GRAPH_COND_TYPE_WHILE))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = add_node(node, graph, CU_GRAPH_NODE_TYPE_CONDITIONAL, NULL, NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&graph_lock);
    struct fake_node *n = (struct fake_node *)*node;
    n->cond = params->conditional.type;
    n->child = graph_new();
    n->bodies[0] = (CUgraph)n->child;
    params->conditional.phGraph_out = n->bodies;
    pthread_mutex_unlock(&graph_lock);
    return n->child != NULL ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* A memset node (cuda.h: elementSize 1, 2 or 4), in the current context (ctx is not read). */
EXPORT CUresult cuGraphAddMemsetNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                     size_t ndeps, const CUDA_MEMSET_NODE_PARAMS *params,
                                     CUcontext ctx)
{
    (void)deps, (void)ndeps, (void)ctx;
    if (params == NULL || (params->elementSize != 1 && params->elementSize != 2 &&
                           params->elementSize != 4))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = add_node(node, graph, CU_GRAPH_NODE_TYPE_MEMSET, NULL, NULL);
    if (rc == CUDA_SUCCESS) {
        pthread_mutex_lock(&graph_lock);
        ((struct fake_node *)*node)->memset = *params;
        pthread_mutex_unlock(&graph_lock);
    }
    return rc;
}

EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                       size_t ndeps, CUDA_MEM_ALLOC_NODE_PARAMS *params)
{
    (void)deps, (void)ndeps;
    if (params == NULL || params->bytesize == 0 ||
        params->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        params->poolProps.location.id < 0 || params->poolProps.location.id >= ndevices)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = add_node(node, graph, CU_GRAPH_NODE_TYPE_MEM_ALLOC, NULL, NULL);
    if (rc == CUDA_SUCCESS) {
        params->dptr = (CUdeviceptr)new_graph_address(params->bytesize);
        pthread_mutex_lock(&graph_lock);
        ((struct fake_node *)*node)->alloc = *params;
        pthread_mutex_unlock(&graph_lock);
    }
    return rc;
}

/* A free node ends a graph allocation's life within the graph (its memory stays mapped for the
 * graph, so the fake keeps nothing for it). */
EXPORT CUresult cuGraphAddMemFreeNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                      size_t ndeps, CUdeviceptr dptr)
{
    (void)deps, (void)ndeps;
    if (!graph_address(dptr))
        return CUDA_ERROR_INVALID_VALUE;
    return add_node(node, graph, CU_GRAPH_NODE_TYPE_MEM_FREE, NULL, NULL);
}

/* nodes NULL: *count = how many; else up to *count handles (NULLs past the end), *count = how
 * many were written. */
EXPORT CUresult cuGraphGetNodes(CUgraph graph, CUgraphNode *nodes, size_t *count)
{
    if (count == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&graph_lock);
    struct fake_graph *g = (struct fake_graph *)graph;
    int known = graph_known(g);
    if (known && nodes == NULL) {
        *count = g->count;
    } else if (known) {
        for (size_t i = 0; i < *count; i++)
            nodes[i] = i < g->count ? (CUgraphNode)g->nodes[i] : NULL;
        *count = *count < g->count ? *count : g->count;
    }
    pthread_mutex_unlock(&graph_lock);
    return known ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* A copy of node if it is one of ours and of the given type (any type: -1); 0, or -1. */
static int read_node(CUgraphNode node, int type, struct fake_node *out)
{
    pthread_mutex_lock(&graph_lock);
    const struct fake_node *n = (const struct fake_node *)node;
    int known = node_known(n) && (type < 0 || (int)n->type == type);
    if (known)
        *out = *n;
    pthread_mutex_unlock(&graph_lock);
    return known ? 0 : -1;
}

EXPORT CUresult cuGraphNodeGetType(CUgraphNode node, CUgraphNodeType *type)
{
    struct fake_node n;
    if (type == NULL || read_node(node, -1, &n) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    *type = n.type;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphKernelNodeGetParams_v2(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS *params)
{
    struct fake_node n;
    if (params == NULL || read_node(node, CU_GRAPH_NODE_TYPE_KERNEL, &n) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    *params = n.params;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphMemsetNodeGetParams(CUgraphNode node, CUDA_MEMSET_NODE_PARAMS *params)
{
    struct fake_node n;
    if (params == NULL || read_node(node, CU_GRAPH_NODE_TYPE_MEMSET, &n) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    *params = n.memset;
    return CUDA_SUCCESS;
}

/* The CUDA 10 ABI, which a CUDA 11 driver has alone: the fields before the CUDA 12 ones. */
EXPORT CUresult cuGraphKernelNodeGetParams(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS_v1 *params)
{
    CUDA_KERNEL_NODE_PARAMS full;
    CUresult rc = params != NULL ? cuGraphKernelNodeGetParams_v2(node, &full)
                                 : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS)
        memcpy(params, &full, sizeof *params);
    return rc;
}

EXPORT CUresult cuGraphMemAllocNodeGetParams(CUgraphNode node, CUDA_MEM_ALLOC_NODE_PARAMS *params)
{
    struct fake_node n;
    if (params == NULL || read_node(node, CU_GRAPH_NODE_TYPE_MEM_ALLOC, &n) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (fail_now("cuGraphMemAllocNodeGetParams"))
        return CUDA_ERROR_UNKNOWN;
    *params = n.alloc;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode node, CUgraph *graph)
{
    struct fake_node n;
    if (graph == NULL || read_node(node, CU_GRAPH_NODE_TYPE_GRAPH, &n) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    *graph = (CUgraph)n.child;
    return CUDA_SUCCESS;
}

static void unmap_exec(struct fake_exec *e);

/* Maps e's allocations unless they are: from what the pool holds unmapped first, the rest taken
 * from the device; with fake_cuda_graph_remap, a mapped graph's anew, all of it from the device
 * (its old mapping left unmapped in the pool). Caller holds graph_lock. */
static CUresult map_exec(struct fake_exec *e)
{
    if (e->mapped && !fake_cuda_graph_remap)
        return CUDA_SUCCESS;
    int anew = e->mapped;
    if (anew) {
        unmap_exec(e);
        fake_cuda_graph_remap = 0;
    }
    uint64_t grown[GPU_MAX_DEVICES] = {0};
    for (int d = 0; d < GPU_MAX_DEVICES; d++) {
        uint64_t spare = graph_pools[d].reserved - graph_pools[d].mapped;
        uint64_t grow = anew ? e->alloc[d] : e->alloc[d] > spare ? e->alloc[d] - spare : 0;
        if (grow != 0 && !gpu_alloc(d, (int32_t)getpid(), grow)) {
            for (int u = 0; u < d; u++) {
                gpu_free(u, (int32_t)getpid(), grown[u]);
                graph_pools[u].reserved -= grown[u];
                graph_pools[u].mapped -= e->alloc[u];
            }
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        grown[d] = grow;
        graph_pools[d].reserved += grow;
        graph_pools[d].mapped += e->alloc[d];
    }
    e->mapped = 1;
    return CUDA_SUCCESS;
}

static void unmap_exec(struct fake_exec *e)
{
    for (int d = 0; e->mapped && d < GPU_MAX_DEVICES; d++)
        graph_pools[d].mapped -= e->alloc[d];
    e->mapped = 0;
}

static CUresult instantiate(CUgraphExec *out, CUgraph graph)
{
    run_inside("cuGraphInstantiate"); /* any version, before it reads the graph */
    if (out == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&graph_lock);
    if (graph_known((struct fake_graph *)graph)) {
        struct fake_exec *e = calloc(1, sizeof *e);
        struct fake_graph *copy = e != NULL ? graph_clone((struct fake_graph *)graph) : NULL;
        rc = copy != NULL ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
        if (copy == NULL) {
            free(e);
        } else {
            e->source = (struct fake_graph *)graph;
            e->copy = copy;
            e->blocks = graph_blocks(copy);
            graph_allocations(copy, e->alloc);
            fake_cuda_stats.graph_execs++;
            e->next_exec = execs;
            execs = e;
            *out = (CUgraphExec)e;
        }
    }
    pthread_mutex_unlock(&graph_lock);
    return rc;
}

EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph,
                                            unsigned long long flags)
{
    (void)flags;
    return instantiate(exec, graph);
}

EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *exec, CUgraph graph,
                                             CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    CUresult rc = instantiate(exec, graph);
    if (rc == CUDA_SUCCESS && params != NULL &&
        (params->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) != 0) {
        pthread_mutex_lock(&graph_lock);
        rc = map_exec((struct fake_exec *)*exec);
        pthread_mutex_unlock(&graph_lock);
    }
    if (params != NULL) {
        params->hErrNode_out = NULL;
        params->result_out = rc == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS
                                                : CUDA_GRAPH_INSTANTIATE_ERROR;
    }
    return rc;
}

EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec)
{
    run_inside("cuGraphExecDestroy"); /* before it destroys */
    if (fail_now("cuGraphExecDestroy"))
        return CUDA_ERROR_UNKNOWN;
    pthread_mutex_lock(&graph_lock);
    struct fake_exec **link = exec_link((struct fake_exec *)exec);
    if (link != NULL) {
        *link = ((struct fake_exec *)exec)->next_exec;
        unmap_exec((struct fake_exec *)exec);
        graph_free(((struct fake_exec *)exec)->copy);
        fake_cuda_stats.graph_execs--;
    }
    pthread_mutex_unlock(&graph_lock);
    if (link != NULL)
        free(exec);
    return link != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* The CUDA 10.0 and 11.0 ABI: an error node and a log buffer, both left empty on success. */
static CUresult instantiate_v1(CUgraphExec *exec, CUgraph graph, CUgraphNode *error_node,
                               char *log, size_t log_size)
{
    if (error_node != NULL)
        *error_node = NULL;
    if (log != NULL && log_size > 0)
        log[0] = '\0';
    return instantiate(exec, graph);
}

EXPORT CUresult cuGraphInstantiate(CUgraphExec *exec, CUgraph graph, CUgraphNode *error_node,
                                   char *log, size_t log_size)
{
    return instantiate_v1(exec, graph, error_node, log, log_size);
}

EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *exec, CUgraph graph, CUgraphNode *error_node,
                                      char *log, size_t log_size)
{
    return instantiate_v1(exec, graph, error_node, log, log_size);
}

/* Whether b can stand in for a in an executable graph: as the driver requires of an update or
 * a child graph's replacement, the same number of nodes, of the same types, in the same order,
 * child graphs alike (the fake keeps no edges, so a changed edge goes unnoticed). */
static CUgraphExecUpdateResult topology_change(const struct fake_graph *a,
                                               const struct fake_graph *b)
{
    if (a->count != b->count)
        return CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
    for (size_t i = 0; i < a->count; i++) {
        if (a->nodes[i]->type != b->nodes[i]->type)
            return CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED;
        CUgraphExecUpdateResult child = a->nodes[i]->child != NULL
            ? topology_change(a->nodes[i]->child, b->nodes[i]->child)
            : CU_GRAPH_EXEC_UPDATE_SUCCESS;
        if (child != CU_GRAPH_EXEC_UPDATE_SUCCESS)
            return child;
    }
    return CU_GRAPH_EXEC_UPDATE_SUCCESS;
}

/* The executable graph takes the work of a graph of the same topology (any other is refused,
 * as the driver refuses it). Its nodes are still named by the graph it was instantiated from,
 * as the setters' "hNode" is, paired by place (the driver pairs by topology; the same for
 * graphs built in the same order). Nodes disabled before come back enabled: an assumption,
 * cuda.h does not say. */
static CUgraphExecUpdateResult update(CUgraphExec exec, CUgraph graph)
{
    pthread_mutex_lock(&graph_lock);
    struct fake_exec *e = (struct fake_exec *)exec;
    struct fake_graph *g = (struct fake_graph *)graph;
    CUgraphExecUpdateResult result = exec_link(e) != NULL && graph_known(g)
        ? topology_change(e->copy, g) : CU_GRAPH_EXEC_UPDATE_ERROR;
    struct fake_graph *copy = result == CU_GRAPH_EXEC_UPDATE_SUCCESS ? graph_clone(g) : NULL;
    if (copy != NULL) {
        graph_free(e->copy);
        e->copy = copy;
        e->blocks = graph_blocks(copy);
    } else if (result == CU_GRAPH_EXEC_UPDATE_SUCCESS) {
        result = CU_GRAPH_EXEC_UPDATE_ERROR; /* out of host memory */
    }
    pthread_mutex_unlock(&graph_lock);
    return result;
}

/* CU_GRAPH_EXEC_UPDATE_ERROR: an unknown handle (or no host memory), which the driver answers
 * as an invalid value; the rest are the update's own failures. */
static CUresult update_answer(CUgraphExecUpdateResult result)
{
    return result == CU_GRAPH_EXEC_UPDATE_SUCCESS ? CUDA_SUCCESS
           : result == CU_GRAPH_EXEC_UPDATE_ERROR ? CUDA_ERROR_INVALID_VALUE
                                                  : CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
}

EXPORT CUresult cuGraphExecUpdate_v2(CUgraphExec exec, CUgraph graph,
                                     CUgraphExecUpdateResultInfo *info)
{
    CUgraphExecUpdateResult result = update(exec, graph);
    if (info != NULL) {
        memset(info, 0, sizeof *info);
        info->result = result;
    }
    return update_answer(result);
}

/* The CUDA 10.2 ABI. */
EXPORT CUresult cuGraphExecUpdate(CUgraphExec exec, CUgraph graph, CUgraphNode *error_node,
                                  CUgraphExecUpdateResult *result_out)
{
    CUgraphExecUpdateResult result = update(exec, graph);
    if (error_node != NULL)
        *error_node = NULL;
    if (result_out != NULL)
        *result_out = result;
    return update_answer(result);
}

/* ---- executable graphs changed in place ---- */

/* The node of e's copy that stands for `node` of the graph e was made from; NULL: none (also
 * when that graph is gone, or the node was added to it after). Caller holds graph_lock. */
static struct fake_node *exec_node(struct fake_exec *e, CUgraphNode node)
{
    if (exec_link(e) == NULL || !graph_known(e->source))
        return NULL;
    for (size_t i = 0; i < e->source->count && i < e->copy->count; i++)
        if ((CUgraphNode)e->source->nodes[i] == node)
            return e->copy->nodes[i];
    return NULL;
}

/* Sets a kernel node's grid (child NULL) or a child graph node's graph in exec: one of the
 * same topology, as the driver requires. */
static CUresult exec_set(CUgraphExec exec, CUgraphNode node, const unsigned *grid,
                         CUgraph child, const CUDA_MEMSET_NODE_PARAMS *memset_params)
{
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&graph_lock);
    struct fake_exec *e = (struct fake_exec *)exec;
    struct fake_node *n = exec_node(e, node);
    if (n != NULL && memset_params != NULL && n->type == CU_GRAPH_NODE_TYPE_MEMSET) {
        n->memset = *memset_params;
        rc = CUDA_SUCCESS;
    } else if (n != NULL && grid != NULL && n->type == CU_GRAPH_NODE_TYPE_KERNEL) {
        n->params.gridDimX = grid[0];
        n->params.gridDimY = grid[1];
        n->params.gridDimZ = grid[2];
        rc = CUDA_SUCCESS;
    } else if (n != NULL && child != NULL && n->type == CU_GRAPH_NODE_TYPE_GRAPH &&
               graph_known((struct fake_graph *)child) &&
               topology_change(n->child, (struct fake_graph *)child) ==
                   CU_GRAPH_EXEC_UPDATE_SUCCESS) {
        struct fake_graph *copy = graph_clone((struct fake_graph *)child);
        rc = copy != NULL ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
        if (copy != NULL) {
            graph_free(n->child);
            n->child = copy;
            /* Its allocations may differ: mapped anew at the next launch. */
            unmap_exec(e);
            memset(e->alloc, 0, sizeof e->alloc);
            graph_allocations(e->copy, e->alloc);
        }
    }
    if (rc == CUDA_SUCCESS)
        e->blocks = graph_blocks(e->copy);
    pthread_mutex_unlock(&graph_lock);
    return rc;
}

static CUresult set_grid(CUgraphExec exec, CUgraphNode node, unsigned gx, unsigned gy,
                         unsigned gz)
{
    const unsigned grid[3] = {gx, gy, gz};
    return exec_set(exec, node, grid, NULL, NULL);
}

EXPORT CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec exec, CUgraphNode node,
                                                  const CUDA_KERNEL_NODE_PARAMS *params)
{
    return params != NULL ? set_grid(exec, node, params->gridDimX, params->gridDimY,
                                     params->gridDimZ)
                          : CUDA_ERROR_INVALID_VALUE;
}

/* The CUDA 10.1 ABI. */
EXPORT CUresult cuGraphExecKernelNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                               const CUDA_KERNEL_NODE_PARAMS_v1 *params)
{
    return params != NULL ? set_grid(exec, node, params->gridDimX, params->gridDimY,
                                     params->gridDimZ)
                          : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuGraphExecChildGraphNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                                   CUgraph child)
{
    return exec_set(exec, node, NULL, child, NULL);
}

/* Changes a memset node's size in an executable graph (ctx is not read). */
EXPORT CUresult cuGraphExecMemsetNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                               const CUDA_MEMSET_NODE_PARAMS *params,
                                               CUcontext ctx)
{
    (void)ctx;
    return params != NULL ? exec_set(exec, node, NULL, NULL, params) : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuGraphExecNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                         CUgraphNodeParams *params)
{
    if (params == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (params->type == CU_GRAPH_NODE_TYPE_KERNEL)
        return set_grid(exec, node, params->kernel.gridDimX, params->kernel.gridDimY,
                        params->kernel.gridDimZ);
    if (params->type == CU_GRAPH_NODE_TYPE_GRAPH)
        return exec_set(exec, node, NULL, params->graph.graph, NULL);
    if (params->type == CU_GRAPH_NODE_TYPE_MEMSET) {
        /* CUDA_MEMSET_NODE_PARAMS_v2 leads with the v1 fields, then its context. */
        CUDA_MEMSET_NODE_PARAMS m;
        memcpy(&m, &params->memset, sizeof m);
        return exec_set(exec, node, NULL, NULL, &m);
    }
    return CUDA_ERROR_INVALID_VALUE; /* the fake's graphs hold kernels, memsets, child graphs */
}

/* Kernel and memset nodes: the driver also takes memcpy nodes, which the fake's graphs do not
 * hold, and refuses the rest (child graphs among them). */
EXPORT CUresult cuGraphNodeSetEnabled(CUgraphExec exec, CUgraphNode node, unsigned int enabled)
{
    pthread_mutex_lock(&graph_lock);
    struct fake_exec *e = (struct fake_exec *)exec;
    struct fake_node *n = exec_node(e, node);
    if (n != NULL && n->type != CU_GRAPH_NODE_TYPE_KERNEL && n->type != CU_GRAPH_NODE_TYPE_MEMSET)
        n = NULL;
    if (n != NULL) {
        n->disabled = !enabled;
        e->blocks = graph_blocks(e->copy);
    }
    pthread_mutex_unlock(&graph_lock);
    return n != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* Blocks of an executable graph; a NULL one is the old tests' stand-in for "some graph" and
 * costs 100 blocks; an unknown one gives UINT64_MAX. */
static uint64_t exec_blocks(CUgraphExec exec)
{
    if (exec == NULL)
        return 100;
    pthread_mutex_lock(&graph_lock);
    struct fake_exec *e = (struct fake_exec *)exec;
    uint64_t blocks = exec_link(e) != NULL ? e->blocks : UINT64_MAX;
    pthread_mutex_unlock(&graph_lock);
    return blocks;
}

/* Maps exec's allocations (NULL: the old tests' stand-in, which has none). */
static CUresult graph_map(CUgraphExec exec)
{
    if (exec == NULL)
        return CUDA_SUCCESS;
    pthread_mutex_lock(&graph_lock);
    struct fake_exec *e = (struct fake_exec *)exec;
    CUresult rc = exec_link(e) != NULL ? map_exec(e) : CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&graph_lock);
    return rc;
}

static CUresult graph_launch(enum fake_launch_variant variant, CUgraphExec exec)
{
    uint64_t blocks = exec_blocks(exec);
    if (blocks == UINT64_MAX)
        return initialised ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = graph_map(exec);
    /* Its kernels (any with blocks) raise the stack as a kernel launched alone would. */
    static char some_kernel;
    CUfunction kernels = exec != NULL && blocks > 0 ? (CUfunction)(void *)&some_kernel : NULL;
    return rc == CUDA_SUCCESS ? launch(variant, kernels, blocks) : rc;
}

EXPORT CUresult cuGraphUpload(CUgraphExec exec, CUstream stream)
{
    (void)stream;
    return exec != NULL ? graph_map(exec) : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuGraphUpload_ptsz(CUgraphExec exec, CUstream stream)
{
    return cuGraphUpload(exec, stream);
}

/* Gives back what the pool holds that no graph maps. */
EXPORT CUresult cuDeviceGraphMemTrim(CUdevice dev)
{
    if (dev < 0 || dev >= ndevices)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&graph_lock);
    gpu_free(dev, (int32_t)getpid(), graph_pools[dev].reserved - graph_pools[dev].mapped);
    graph_pools[dev].reserved = graph_pools[dev].mapped;
    pthread_mutex_unlock(&graph_lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetGraphMemAttribute(CUdevice dev, CUgraphMem_attribute attr, void *value)
{
    if (dev < 0 || dev >= ndevices || value == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (fail_now("cuDeviceGetGraphMemAttribute"))
        return CUDA_ERROR_UNKNOWN;
    pthread_mutex_lock(&graph_lock);
    CUresult rc = CUDA_SUCCESS;
    switch (attr) {
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: *(cuuint64_t *)value = graph_pools[dev].reserved; break;
    case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT: *(cuuint64_t *)value = graph_pools[dev].mapped; break;
    default: rc = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&graph_lock);
    return rc;
}

EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream)
{
    (void)stream;
    return graph_launch(FAKE_GRAPH, exec);
}

EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream)
{
    (void)stream;
    return graph_launch(FAKE_GRAPH_PTSZ, exec);
}

/* ---- test-only accessors ------------------------------------------------------------------ */

EXPORT uint64_t fake_cuda_device_used(int dev)
{
    struct gpu_device *d = gpu_enter(dev);
    struct gpu_proc *p = gpu_find(d, (int32_t)getpid());
    uint64_t used = p != NULL ? gpu_footprint(p) : 0;
    gpu_unlock(d);
    return used;
}

EXPORT uint64_t fake_cuda_device_physical_used(int nvml_index)
{
    struct gpu_device *d = gpu_enter_physical(nvml_index);
    uint64_t used = d->used;
    gpu_unlock(d);
    return used;
}

EXPORT uint64_t fake_cuda_device_total(int dev)
{
    (void)dev;
    return device_bytes;
}

EXPORT int fake_cuda_device_count(void) { return nphysical; }

EXPORT uint64_t fake_cuda_busy_ns(int dev)
{
    struct gpu_device *d = gpu_enter(dev);
    struct gpu_proc *p = gpu_find(d, (int32_t)getpid());
    uint64_t busy = p != NULL ? p->busy_ns : 0;
    gpu_unlock(d);
    return busy;
}

EXPORT uint64_t fake_cuda_device_busy_ns(int dev)
{
    struct gpu_device *d = gpu_enter(dev);
    uint64_t busy = d->busy_ns;
    gpu_unlock(d);
    return busy;
}

EXPORT uint64_t fake_cuda_pending_ns(int dev, int pid)
{
    struct gpu_device *d = gpu_enter(dev);
    struct gpu_proc *p = gpu_find(d, pid);
    uint64_t pending = p != NULL ? p->pending_ns : 0;
    gpu_unlock(d);
    return pending;
}

EXPORT uint64_t fake_cuda_graph_exec_blocks(void *exec)
{
    return exec_blocks((CUgraphExec)exec);
}

/* FAKE_NVML_SAMPLE_WINNER=1, read at every call: a period's whole utilisation goes to one of
 * the processes that ran in it (gpu_roll draws it), the others get no sample. On an H200 each
 * sample period (200 ms) had one process's sample, each process's count of them following its
 * share (hook/README.md, "Fourth run on the H200"), and the library's own readings, one period
 * at a time, were 0 or about the whole GPU's use (third run): one bit a sample, whatever the
 * GPU's time-slicing did within the period. */
static int sample_winner(void)
{
    const char *w = getenv("FAKE_NVML_SAMPLE_WINNER");
    return w != NULL && w[0] != '\0' && strcmp(w, "0") != 0;
}

/* A period's end as NVML stamps it: CLOCK_REALTIME us. */
static uint64_t stamp_us(uint64_t end_ns)
{
    return (uint64_t)((int64_t)end_ns + gpu->realtime_offset) / 1000u;
}

EXPORT void fake_gpu_period(int nvml_index, uint64_t *end_us, unsigned int *device_pct)
{
    struct gpu_device *d = gpu_enter_physical(nvml_index);
    *end_us = d->last_end_ns == 0 ? 0 : stamp_us(d->last_end_ns);
    *device_pct = (unsigned int)(100.0 * (double)d->last_busy_ns / (double)gpu->period_ns + 0.5);
    gpu_unlock(d);
}

/* GPU time pid got in period h as NVML attributes it: under FAKE_NVML_SAMPLE_WINNER the
 * period's whole busy time to its winner alone. */
static uint64_t attributed(const struct gpu_period *h, int32_t pid, int one_bit)
{
    if (one_bit)
        return h->winner == pid ? h->busy_ns : 0;
    for (uint32_t k = 0; k < h->nran; k++)
        if (h->ran[k].pid == pid)
            return h->ran[k].busy_ns;
    return 0;
}

/* pid's entry in out (n used so far): its index, n for a new one (written when n < max), or -1
 * when out is full. */
static int sample_of(struct fake_gpu_sample *out, int n, int max, int32_t pid)
{
    for (int i = 0; i < n; i++)
        if (out[i].pid == pid)
            return i;
    if (n >= max)
        return -1;
    out[n] = (struct fake_gpu_sample){.pid = pid};
    return n;
}

EXPORT int fake_gpu_samples_since(int nvml_index, uint64_t since_us, struct fake_gpu_sample *out,
                                  int max)
{
    struct gpu_device *d = gpu_enter_physical(nvml_index);
    const uint64_t period = gpu->period_ns;
    int one_bit = sample_winner();
    uint64_t kept = 0, oldest = 0, newest = 0;
    int n = 0;
    for (int e = 0; e < GPU_HISTORY; e++) {
        const struct gpu_period *h = &d->history[e];
        if (h->end_ns == 0)
            continue;
        kept = kept == 0 || h->end_ns < kept ? h->end_ns : kept;
        if (stamp_us(h->end_ns) <= since_us)
            continue;
        oldest = oldest == 0 || h->end_ns < oldest ? h->end_ns : oldest;
        newest = h->end_ns > newest ? h->end_ns : newest;
        for (uint32_t k = 0; k < h->nran; k++) {
            if (gpu_find(d, h->ran[k].pid) == NULL)
                continue; /* "per process running" (nvml.h): one gone has none */
            uint64_t busy = attributed(h, h->ran[k].pid, one_bit);
            if (busy == 0)
                continue;
            int i = sample_of(out, n, max, h->ran[k].pid);
            if (i < 0)
                continue;
            n += i == n;
            out[i].busy_ns += busy;
            out[i].end_us = h->end_ns > out[i].end_us ? h->end_ns : out[i].end_us;
        }
    }
    /* The window: from the start of the oldest period in it, or the time asked when that is
     * earlier (an idle stretch the clock jumped over, recorded as one period), but not before
     * what is kept, to the end of the newest. */
    int64_t asked = (int64_t)(since_us * 1000u) - gpu->realtime_offset;
    int64_t first_kept = (int64_t)kept - (int64_t)period;
    int64_t start = (int64_t)oldest - (int64_t)period;
    if (since_us != 0 && asked < start)
        start = asked > first_kept ? asked : first_kept;
    double window = oldest == 0 ? (double)period : (double)((int64_t)newest - start);
    for (int i = 0; i < n; i++) {
        out[i].sm_util = (unsigned int)(100.0 * (double)out[i].busy_ns / window + 0.5);
        out[i].end_us = stamp_us(out[i].end_us);
    }
    gpu_unlock(d);
    return n;
}

EXPORT int fake_gpu_processes(int nvml_index, struct fake_gpu_process *out, int max)
{
    struct gpu_device *d = gpu_enter_physical(nvml_index);
    int n = 0;
    for (int i = 0; i < GPU_MAX_PROCS; i++) {
        const struct gpu_proc *p = &d->procs[i];
        /* NVML lists the processes "with a compute context" (nvml.h), whatever they hold: one
         * left out while its context held 0 bytes (FAKE_CUDA_CONTEXT_MIB's default) made the
         * library take a neighbour's pid, new beside it, for its own (tests/run.sh,
         * contention-30-60-slow-context). Memory without a context (stream-ordered) is listed
         * too. */
        if (p->pid == 0 || (p->primary_refs + p->created_ctxs == 0 && gpu_footprint(p) == 0))
            continue;
        if (n < max)
            out[n] = (struct fake_gpu_process){.pid = p->pid, .bytes = gpu_footprint(p)};
        n++;
    }
    gpu_unlock(d);
    return n;
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
/* The CUDA 2/9 launches are deprecated in cuda.h; the driver still answers for them. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
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
    P("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease_v2, 11000, 0),
    P("cuDevicePrimaryCtxReset", cuDevicePrimaryCtxReset_v2, 11000, 0),
    P("cuDevicePrimaryCtxGetState", cuDevicePrimaryCtxGetState, 7000, 0),
    P("cuCtxCreate", cuCtxCreate, 2000, 0),
    P("cuCtxDestroy", cuCtxDestroy, 2000, 0),
    P("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease, 7000, 0),
    P("cuDevicePrimaryCtxReset", cuDevicePrimaryCtxReset, 7000, 0),
    P("cuCtxCreate", cuCtxCreate_v2, 3020, 0),
    P("cuCtxCreate", cuCtxCreate_v3, 11040, 0),
    P("cuCtxCreate", cuCtxCreate_v4, 12050, 0),
    P("cuGreenCtxCreate", cuGreenCtxCreate, 12040, 0),
    P("cuGreenCtxDestroy", cuGreenCtxDestroy, 12040, 0),
    P("cuCtxFromGreenCtx", cuCtxFromGreenCtx, 12040, 0),
    P("cuDeviceGetDevResource", cuDeviceGetDevResource, 12040, 0),
    P("cuDevResourceGenerateDesc", cuDevResourceGenerateDesc, 12040, 0),
    P("cuCtxDestroy", cuCtxDestroy_v2, 4000, 0),
    P("cuCtxSetCurrent", cuCtxSetCurrent, 4000, 0),
    P("cuCtxGetCurrent", cuCtxGetCurrent, 4000, 0),
    P("cuCtxGetDevice", cuCtxGetDevice, 2000, 0),
    P("cuCtxSynchronize", cuCtxSynchronize, 2000, 0),
    /* CUDA 13's cudaTypedefs.h names the _v2 ABIs PFN_cuCtxSynchronize_v13000 and
     * PFN_cuCtxGetDevice_v13000: the base names answer them from 13.0; cuda-python also asks
     * for "cuCtxSynchronize_v2" by that name (a real driver's answer to it not seen). */
    P("cuCtxSynchronize", cuCtxSynchronize_v2, 13000, 0),
    P("cuCtxSynchronize_v2", cuCtxSynchronize_v2, 13000, 0),
    P("cuCtxGetDevice", cuCtxGetDevice_v2, 13000, 0),
    P("cuStreamSynchronize", cuStreamSynchronize, 2000, 0),
    P("cuStreamSynchronize", cuStreamSynchronize_ptsz, 7000, 1),
    P("cuStreamQuery", cuStreamQuery, 2000, 0),
    P("cuStreamQuery", cuStreamQuery_ptsz, 7000, 1),
    P("cuMemcpyDtoH", cuMemcpyDtoH, 2000, 0),
    P("cuMemcpyDtoH", cuMemcpyDtoH_v2, 3020, 0),
    P("cuMemcpyDtoH", cuMemcpyDtoH_v2_ptds, 7000, 1),
    P("cuMemAllocHost", cuMemAllocHost_v2, 3020, 0),
    P("cuMemFreeHost", cuMemFreeHost, 2000, 0),
    P("cuMemcpy", cuMemcpy, 4000, 0),
    P("cuMemcpy", cuMemcpy_ptds, 7000, 1),
    P("cuMemsetD8", cuMemsetD8, 2000, 0),
    P("cuMemsetD8", cuMemsetD8_v2, 3020, 0),
    P("cuMemsetD8", cuMemsetD8_v2_ptds, 7000, 1),
    P("cuMemsetD8Async", cuMemsetD8Async, 3020, 0),
    P("cuMemsetD8Async", cuMemsetD8Async_ptsz, 7000, 1),
    P("cuMemsetD2D8", cuMemsetD2D8, 2000, 0),
    P("cuMemsetD2D8", cuMemsetD2D8_v2, 3020, 0),
    P("cuMemsetD2D8", cuMemsetD2D8_v2_ptds, 7000, 1),
    P("cuMemsetD2D8Async", cuMemsetD2D8Async, 3020, 0),
    P("cuMemsetD2D8Async", cuMemsetD2D8Async_ptsz, 7000, 1),
    P("cuMemsetD16", cuMemsetD16, 2000, 0),
    P("cuMemsetD16", cuMemsetD16_v2, 3020, 0),
    P("cuMemsetD16", cuMemsetD16_v2_ptds, 7000, 1),
    P("cuMemsetD16Async", cuMemsetD16Async, 3020, 0),
    P("cuMemsetD16Async", cuMemsetD16Async_ptsz, 7000, 1),
    P("cuMemsetD2D16", cuMemsetD2D16, 2000, 0),
    P("cuMemsetD2D16", cuMemsetD2D16_v2, 3020, 0),
    P("cuMemsetD2D16", cuMemsetD2D16_v2_ptds, 7000, 1),
    P("cuMemsetD2D16Async", cuMemsetD2D16Async, 3020, 0),
    P("cuMemsetD2D16Async", cuMemsetD2D16Async_ptsz, 7000, 1),
    P("cuMemsetD32", cuMemsetD32, 2000, 0),
    P("cuMemsetD32", cuMemsetD32_v2, 3020, 0),
    P("cuMemsetD32", cuMemsetD32_v2_ptds, 7000, 1),
    P("cuMemsetD32Async", cuMemsetD32Async, 3020, 0),
    P("cuMemsetD32Async", cuMemsetD32Async_ptsz, 7000, 1),
    P("cuMemsetD2D32", cuMemsetD2D32, 2000, 0),
    P("cuMemsetD2D32", cuMemsetD2D32_v2, 3020, 0),
    P("cuMemsetD2D32", cuMemsetD2D32_v2_ptds, 7000, 1),
    P("cuMemsetD2D32Async", cuMemsetD2D32Async, 3020, 0),
    P("cuMemsetD2D32Async", cuMemsetD2D32Async_ptsz, 7000, 1),
    P("cuCtxPushCurrent", cuCtxPushCurrent_v2, 4000, 0),
    P("cuCtxPopCurrent", cuCtxPopCurrent_v2, 4000, 0),
    P("cuCtxPushCurrent", cuCtxPushCurrent, 2000, 0),
    P("cuCtxPopCurrent", cuCtxPopCurrent, 2000, 0),
    P("cuStreamCreate", cuStreamCreate, 2000, 0),
    P("cuStreamCreateWithPriority", cuStreamCreateWithPriority, 5050, 0),
    P("cuEventCreate", cuEventCreate, 2000, 0),
    P("cuEventRecord", cuEventRecord, 2000, 0),
    P("cuEventRecord", cuEventRecord_ptsz, 7000, 1),
    P("cuEventRecordWithFlags", cuEventRecordWithFlags, 11010, 0),
    P("cuEventRecordWithFlags", cuEventRecordWithFlags_ptsz, 11010, 1),
    P("cuEventQuery", cuEventQuery, 2000, 0),
    P("cuEventSynchronize", cuEventSynchronize, 2000, 0),
    P("cuEventElapsedTime", cuEventElapsedTime, 2000, 0),
    P("cuEventElapsedTime", cuEventElapsedTime_v2, 12080, 0),
    P("cuEventDestroy", cuEventDestroy_v2, 4000, 0),
    P("cuEventDestroy", cuEventDestroy, 2000, 0),
    P("cuIpcGetEventHandle", cuIpcGetEventHandle, 4010, 0),
    P("cuIpcOpenEventHandle", cuIpcOpenEventHandle, 4010, 0),
    P("cuStreamDestroy", cuStreamDestroy_v2, 4000, 0),
    P("cuStreamDestroy", cuStreamDestroy, 2000, 0),
    P("cuStreamGetCtx", cuStreamGetCtx, 9020, 0),
    P("cuStreamGetCtx_v2", cuStreamGetCtx_v2, 12050, 0),
    P("cuGreenCtxStreamCreate", cuGreenCtxStreamCreate, 12040, 0),
    P("cuStreamGetDevice", cuStreamGetDevice, 12080, 0),
    P("cuDeviceGetDefaultMemPool", cuDeviceGetDefaultMemPool, 11020, 0),
    P("cuDeviceGetMemPool", cuDeviceGetMemPool, 11020, 0),
    P("cuMemPoolSetAttribute", cuMemPoolSetAttribute, 11020, 0),
    P("cuMemPoolTrimTo", cuMemPoolTrimTo, 11020, 0),
    P("cuMemPoolGetAttribute", cuMemPoolGetAttribute, 11020, 0),
    P("cuStreamIsCapturing", cuStreamIsCapturing, 10000, 0),
    P("cuCtxSetLimit", cuCtxSetLimit, 3010, 0),
    P("cuCtxGetLimit", cuCtxGetLimit, 3010, 0),
    P("cuDeviceGetAttribute", cuDeviceGetAttribute, 2000, 0),
    P("cuFuncGetAttribute", cuFuncGetAttribute, 2020, 0),
    P("cuKernelGetAttribute", cuKernelGetAttribute, 12000, 0),
    P("cuLibraryLoadData", cuLibraryLoadData, 12000, 0),
    P("cuLibraryGetKernel", cuLibraryGetKernel, 12000, 0),
    P("cuLibraryUnload", cuLibraryUnload, 12000, 0),
    P("cuStreamGetCaptureInfo", cuStreamGetCaptureInfo_v2, 11030, 0),
    P("cuStreamGetCaptureInfo", cuStreamGetCaptureInfo_v2_ptsz, 11030, 1),
    P("cuGraphUpload", cuGraphUpload, 11010, 0),
    P("cuGraphUpload", cuGraphUpload_ptsz, 11010, 1),
    P("cuDeviceGraphMemTrim", cuDeviceGraphMemTrim, 11040, 0),
    P("cuDeviceGetGraphMemAttribute", cuDeviceGetGraphMemAttribute, 11040, 0),
    P("cuGraphAddMemAllocNode", cuGraphAddMemAllocNode, 11040, 0),
    P("cuGraphMemAllocNodeGetParams", cuGraphMemAllocNodeGetParams, 11040, 0),
    P("cuThreadExchangeStreamCaptureMode", cuThreadExchangeStreamCaptureMode, 10010, 0),
    P("cuStreamIsCapturing", cuStreamIsCapturing_ptsz, 10000, 1),
    P("cuPointerGetAttribute", cuPointerGetAttribute, 4000, 0),
    P("cuModuleLoadData", cuModuleLoadData, 2000, 0),
    P("cuModuleGetFunction", cuModuleGetFunction, 2000, 0),
    P("cuModuleUnload", cuModuleUnload, 2000, 0),
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
    P("cuMipmappedArrayCreate", cuMipmappedArrayCreate, 5000, 0),
    P("cuMipmappedArrayDestroy", cuMipmappedArrayDestroy, 5000, 0),
    P("cuMemCreate", cuMemCreate, 10020, 0),
    P("cuMemRelease", cuMemRelease, 10020, 0),
    P("cuMemMap", cuMemMap, 10020, 0),
    P("cuMemUnmap", cuMemUnmap, 10020, 0),
    P("cuMemAddressReserve", cuMemAddressReserve, 10020, 0),
    P("cuMemAddressFree", cuMemAddressFree, 10020, 0),
    P("cuMemRetainAllocationHandle", cuMemRetainAllocationHandle, 11000, 0),
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
    P("cuMemExportToShareableHandle", cuMemExportToShareableHandle, 10020, 0),
    P("cuMemMapArrayAsync", cuMemMapArrayAsync, 11010, 0),
    P("cuMemMapArrayAsync", cuMemMapArrayAsync_ptsz, 11010, 1),
    P("cuMulticastBindMem", cuMulticastBindMem, 12010, 0),
    P("cuMulticastBindAddr", cuMulticastBindAddr, 12010, 0),
    P("cuMulticastUnbind", cuMulticastUnbind, 12010, 0),
    P("cuMulticastBindMem", cuMulticastBindMem_v2, 13010, 0),
    P("cuMulticastBindAddr", cuMulticastBindAddr_v2, 13010, 0),
    P("cuMemImportFromShareableHandle", cuMemImportFromShareableHandle, 10020, 0),
    P("cuLaunch", cuLaunch, 2000, 0),
    P("cuLaunchGrid", cuLaunchGrid, 2000, 0),
    P("cuLaunchGridAsync", cuLaunchGridAsync, 2000, 0),
    P("cuLaunchCooperativeKernelMultiDevice", cuLaunchCooperativeKernelMultiDevice, 9000, 0),
    P("cuGraphLaunch", cuGraphLaunch, 10000, 0),
    P("cuGraphLaunch", cuGraphLaunch_ptsz, 10000, 1),
    P("cuGraphCreate", cuGraphCreate, 10000, 0),
    P("cuGraphDestroy", cuGraphDestroy, 10000, 0),
    P("cuGraphAddKernelNode", cuGraphAddKernelNode_v2, 12000, 0),
    P("cuGraphAddChildGraphNode", cuGraphAddChildGraphNode, 10000, 0),
    P("cuGraphGetNodes", cuGraphGetNodes, 10000, 0),
    P("cuGraphNodeGetType", cuGraphNodeGetType, 10000, 0),
    P("cuGraphKernelNodeGetParams", cuGraphKernelNodeGetParams, 10000, 0),
    P("cuGraphAddMemsetNode", cuGraphAddMemsetNode, 10000, 0),
    P("cuGraphMemsetNodeGetParams", cuGraphMemsetNodeGetParams, 10000, 0),
    P("cuGraphExecMemsetNodeSetParams", cuGraphExecMemsetNodeSetParams, 10020, 0),
    P("cuGraphKernelNodeGetParams", cuGraphKernelNodeGetParams_v2, 12000, 0),
    P("cuGraphChildGraphNodeGetGraph", cuGraphChildGraphNodeGetGraph, 10000, 0),
    P("cuGraphInstantiate", cuGraphInstantiate, 10000, 0),
    P("cuGraphInstantiate", cuGraphInstantiate_v2, 11000, 0),
    P("cuGraphInstantiate", cuGraphInstantiateWithFlags, 12000, 0),
    P("cuGraphInstantiateWithFlags", cuGraphInstantiateWithFlags, 11040, 0),
    P("cuGraphInstantiateWithParams", cuGraphInstantiateWithParams, 12000, 0),
    P("cuGraphExecDestroy", cuGraphExecDestroy, 10000, 0),
    P("cuGraphExecUpdate", cuGraphExecUpdate, 10020, 0),
    P("cuGraphExecUpdate", cuGraphExecUpdate_v2, 12000, 0),
    P("cuGraphExecKernelNodeSetParams", cuGraphExecKernelNodeSetParams, 10010, 0),
    P("cuGraphExecKernelNodeSetParams", cuGraphExecKernelNodeSetParams_v2, 12000, 0),
    P("cuGraphExecChildGraphNodeSetParams", cuGraphExecChildGraphNodeSetParams, 11010, 0),
    P("cuGraphExecNodeSetParams", cuGraphExecNodeSetParams, 12020, 0),
    P("cuGraphNodeSetEnabled", cuGraphNodeSetEnabled, 11060, 0),
};
#pragma GCC diagnostic pop
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
    (void)bx, (void)by, (void)bz, (void)shmem, (void)params, (void)extra;
    return launch_grid(FAKE_LAUNCH_PTSZ, f, stream, gx, gy, gz);
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
    int known, per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    const struct proc *p = select_proc(symbol, version, per_thread, &known);
    if (v1_as_v2 && p != NULL && p->since < 3020) {
        const struct proc *newer = select_proc(symbol, 3020, per_thread, &known);
        p = newer != NULL ? newer : p;
    }
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
