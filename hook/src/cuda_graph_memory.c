/* cuda_graph_memory.c - the memory a graph's allocation nodes take. The driver does not map it
 * at instantiation (the stream is not known yet) but when the graph is launched or uploaded,
 * from the device's graph memory pool, which keeps it for the next launch until
 * cuDeviceGraphMemTrim. So before such a launch, what it may add to the pool is reserved under
 * the cap (or the launch refused), and after it what the pool really grew by stays counted as
 * the process's footprint, which measurements settle from then on (footprint.h). A stream-ordered
 * allocation captured into a graph is such a node too: it takes nothing until the graph runs,
 * so cuda_memory.c does not count it. */
#define _GNU_SOURCE
#include <pthread.h>

#include "cuda_driver.h"
#include "footprint.h"
#include "log.h"
#include "memory.h"
#include "region.h"

_Static_assert((int)VGPU_GRAPH_DEVICES == (int)VGPU_REGION_MAX_DEVICES,
               "graphs.h tells devices apart by the region's ordinals");

/* Per device: one launch with graph memory at a time, so that what the pool grew by across it
 * is that launch's (a trim waits too); and the last such launch, whose mappings the driver
 * keeps for it. */
struct last_launch {
    CUgraphExec exec; /* atomic; NULL: none known */
    CUstream stream;
    cuuint64_t pool; /* the pool's reserve after it */
};
static pthread_mutex_t locks[VGPU_GRAPH_DEVICES];
static struct last_launch last[VGPU_GRAPH_DEVICES];
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int overgrowth_warned;

static void reset(void)
{
    /* Graphs do not survive fork, and a lock held by a thread of the parent must not wedge. */
    for (int d = 0; d < VGPU_GRAPH_DEVICES; d++) {
        pthread_mutex_init(&locks[d], NULL);
        last[d] = (struct last_launch){0};
    }
}

static void init(void)
{
    reset();
    pthread_atfork(NULL, NULL, reset);
}

int vgpu_graph_memory_counted(void)
{
    for (int d = 0; d < VGPU_REGION_MAX_DEVICES; d++)
        if (vgpu_region_limit(d) != 0)
            return 1;
    return 0;
}

/* What dev's graph memory pool holds from the device, and what graphs map of it now; -1 when
 * the driver cannot say. */
static int pool_figures(int dev, cuuint64_t *reserved, cuuint64_t *mapped)
{
    CUresult (*ask)(CUdevice, CUgraphMem_attribute, void *) = real.cuDeviceGetGraphMemAttribute;
    return ask != NULL &&
           ask((CUdevice)dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, reserved) == CUDA_SUCCESS &&
           ask((CUdevice)dev, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, mapped) == CUDA_SUCCESS ? 0 : -1;
}

/* What a launch of exec (NULL: one being instantiated) on stream may add to a pool holding
 * `reserved` bytes, `mapped` of them by graphs, for allocations of `bytes`: nothing when exec
 * was the last graph with allocations launched on the device, on the same stream, and the pool
 * has not shrunk since (the driver keeps a graph's mappings for its next launch; on another
 * stream, or after another graph, it may map anew); else the allocations less what the pool
 * holds that no graph maps, which the driver maps first. All of them when the pool cannot be
 * asked. */
static uint64_t may_add(uint64_t bytes, CUgraphExec exec, CUstream stream,
                        const struct last_launch *l, int known, cuuint64_t reserved,
                        cuuint64_t mapped)
{
    if (!known)
        return bytes;
    if (exec != NULL && l->exec == exec && l->stream == stream && reserved >= l->pool)
        return 0;
    uint64_t spare = reserved > mapped ? reserved - mapped : 0;
    return bytes > spare ? bytes - spare : 0;
}

/* Gives back what begin reserved on the first n devices of m, and their locks. */
static void undo(struct vgpu_graph_mapping *m, int n)
{
    for (int i = 0; i < n; i++) {
        vgpu_mem_unreserve(m->devs[i].dev, m->devs[i].reserved);
        pthread_mutex_unlock(&locks[m->devs[i].dev]);
    }
}

int vgpu_graph_mapping_begin(const struct vgpu_graph_memory *memory, CUgraphExec exec,
                             CUstream stream, const char *api, struct vgpu_graph_mapping *m)
{
    pthread_once(&once, init);
    *m = (struct vgpu_graph_mapping){.exec = exec, .stream = stream};
    /* Devices in ascending order: two launches never wait on each other's locks. */
    for (int d = 0; d < VGPU_GRAPH_DEVICES; d++) {
        if (memory->bytes[d] == 0 || vgpu_region_limit(d) == 0)
            continue;
        struct vgpu_graph_mapped *md = &m->devs[m->ndevs];
        cuuint64_t mapped = 0;
        pthread_mutex_lock(&locks[d]);
        md->dev = d;
        md->known = pool_figures(d, &md->pool_before, &mapped) == 0;
        uint64_t need = may_add(memory->bytes[d], exec, stream, &last[d], md->known,
                                md->pool_before, mapped);
        vgpu_footprint_refresh(d); /* what an allocation would see */
        if (need != 0 && vgpu_mem_reserve(d, need, api) != 0) {
            pthread_mutex_unlock(&locks[d]);
            undo(m, m->ndevs);
            m->ndevs = 0;
            return -1;
        }
        md->reserved = need;
        m->ndevs++;
    }
    if (m->ndevs != 0)
        vgpu_mem_op_begin(); /* until counted, NVML may show memory the ledger does not */
    return 0;
}

void vgpu_graph_mapping_end(struct vgpu_graph_mapping *m, CUgraphExec exec)
{
    for (int i = 0; i < m->ndevs; i++) {
        struct vgpu_graph_mapped *md = &m->devs[i];
        cuuint64_t after = 0, mapped = 0;
        int known = md->known && pool_figures(md->dev, &after, &mapped) == 0;
        uint64_t grew = !known ? md->reserved : after > md->pool_before ? after - md->pool_before
                                                                         : 0;
        if (grew > md->reserved && !__atomic_exchange_n(&overgrowth_warned, 1, __ATOMIC_RELAXED))
            vgpu_log(VGPU_LOG_WARN, "device %d: a graph launch grew the graph memory pool by "
                     "%llu bytes, %llu more than was reserved for it; counted (further "
                     "allocations are refused while past the cap)", md->dev,
                     (unsigned long long)grew, (unsigned long long)(grew - md->reserved));
        vgpu_footprint_graph_grew(md->dev, md->reserved, grew);
        last[md->dev].stream = m->stream;
        last[md->dev].pool = after;
        __atomic_store_n(&last[md->dev].exec, exec != NULL && known ? exec : NULL,
                         __ATOMIC_RELEASE);
        pthread_mutex_unlock(&locks[md->dev]);
    }
    if (m->ndevs != 0)
        vgpu_mem_op_end();
}

void vgpu_graph_mapping_forget(CUgraphExec exec)
{
    pthread_once(&once, init);
    for (int d = 0; d < VGPU_GRAPH_DEVICES; d++) {
        if (exec == NULL || __atomic_load_n(&last[d].exec, __ATOMIC_ACQUIRE) != exec)
            continue;
        /* Its address may be a new graph's soon: that one's memory is not mapped. */
        pthread_mutex_lock(&locks[d]);
        if (last[d].exec == exec)
            __atomic_store_n(&last[d].exec, NULL, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&locks[d]);
    }
}

CUresult vgpu_graph_launch(graph_launch_fn launch, CUgraphExec exec, CUstream stream,
                           const char *api)
{
    struct vgpu_graph_memory memory;
    struct vgpu_graph_mapping m;
    if (!vgpu_graph_memory_of(exec, &memory))
        return launch(exec, stream);
    if (vgpu_graph_mapping_begin(&memory, exec, stream, api, &m) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = launch(exec, stream);
    vgpu_graph_mapping_end(&m, rc == CUDA_SUCCESS ? exec : NULL);
    return rc;
}

/* An upload maps what a launch would (the driver's answer to launch latency). */
VGPU_EXPORT CUresult cuGraphUpload(CUgraphExec exec, CUstream stream)
{
    if (!ready() || real.cuGraphUpload == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    return vgpu_graph_launch(real.cuGraphUpload, exec, stream, "cuGraphUpload");
}

VGPU_EXPORT CUresult cuGraphUpload_ptsz(CUgraphExec exec, CUstream stream)
{
    if (!ready() || real.cuGraphUpload_ptsz == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    return vgpu_graph_launch(real.cuGraphUpload_ptsz, exec, stream, "cuGraphUpload");
}

/* A trim gives back what no graph maps: measured again at once, so that the room is usable. */
VGPU_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice device)
{
    if (!ready() || real.cuDeviceGraphMemTrim == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    int dev = device >= 0 && device < VGPU_GRAPH_DEVICES ? (int)device : -1;
    pthread_once(&once, init);
    if (dev >= 0)
        pthread_mutex_lock(&locks[dev]);
    CUresult rc = real.cuDeviceGraphMemTrim(device);
    if (dev >= 0)
        pthread_mutex_unlock(&locks[dev]);
    if (rc == CUDA_SUCCESS && dev >= 0)
        vgpu_footprint_remeasure(dev);
    return rc;
}
