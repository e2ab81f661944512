/* cuda_graph_memory.c - the memory a graph's allocation nodes take. The driver does not map it
 * at instantiation (the stream is not known yet) but when the graph is launched or uploaded,
 * from the device's graph memory pool, which keeps it for the next launch until
 * cuDeviceGraphMemTrim. So before such a launch what it may add to the pool is reserved under
 * the cap (after a trim of what no running graph uses, or the launch is refused), and after
 * it what the pool really grew by stays counted as the process's footprint, which measurements
 * settle from then on (footprint.h). A stream-ordered allocation captured into a graph is such
 * a node too: it takes nothing until the graph runs, so cuda_memory.c does not count it. */
#define _GNU_SOURCE
#include <pthread.h>

#include "cuda_driver.h"
#include "footprint.h"
#include "graphs.h"
#include "locks.h"
#include "log.h"
#include "memory.h"
#include "region.h"

_Static_assert((int)VGPU_GRAPH_DEVICES == (int)VGPU_REGION_MAX_DEVICES,
               "graphs.h tells devices apart by the region's ordinals");

/* One launch's (or upload's) graph memory on each capped device it allocates on, from
 * mapping_begin to mapping_end. */
struct graph_mapped {
    int dev;
    int known;              /* the pool's reserve could be asked before the call */
    uint64_t reserved;      /* what was reserved for what the call may add to it */
    cuuint64_t pool_before; /* the pool's reserve before the call */
};
struct graph_mapping {
    CUgraphExec exec;
    uint64_t serial; /* exec's recording (graphs.h) */
    CUstream stream;
    int ndevs;
    struct graph_mapped devs[VGPU_GRAPH_DEVICES];
};

/* A graph whose mappings the driver keeps for its next launch on the same stream (cuda.h:
 * "physical mappings for a graph are retained between launches"), as of an epoch. */
struct kept_graph {
    CUgraphExec exec;
    uint64_t serial; /* 0: a free slot */
    CUstream stream;
    uint64_t epoch;
};
enum { KEPT_GRAPHS = 16 }; /* per device; past that the oldest must fit again */

/* Per device, under lock: one launch with graph memory at a time, so that what the pool grew
 * by across it is that launch's (a trim waits too). The epoch moves on when the pool shrank (a
 * trim): the driver maps every graph anew after one. */
struct device_graphs {
    pthread_mutex_t lock;
    uint64_t epoch;
    cuuint64_t pool; /* the pool's reserve after the last call */
    struct kept_graph kept[KEPT_GRAPHS];
    unsigned next; /* the slot taken next when none is free */
};
static struct device_graphs devices[VGPU_GRAPH_DEVICES];
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int overgrowth_warned;

static void reset(void)
{
    /* Graphs do not survive fork, and a lock held by a thread of the parent must not wedge. */
    for (int d = 0; d < VGPU_GRAPH_DEVICES; d++) {
        devices[d] = (struct device_graphs){.epoch = 1};
        pthread_mutex_init(&devices[d].lock, NULL);
    }
}

static void init(void)
{
    reset();
    pthread_atfork(NULL, NULL, reset);
}

/* What dev's graph memory pool holds from the device now; -1 when the driver cannot say. */
static int pool_reserve(int dev, cuuint64_t *reserved)
{
    CUresult (*ask)(CUdevice, CUgraphMem_attribute, void *) = real.cuDeviceGetGraphMemAttribute;
    return ask != NULL &&
           ask((CUdevice)dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, reserved) == CUDA_SUCCESS
               ? 0 : -1;
}

/* The slot of exec (that recording) on d; NULL when none. */
static struct kept_graph *kept_slot(struct device_graphs *d, CUgraphExec exec, uint64_t serial)
{
    for (int i = 0; i < KEPT_GRAPHS; i++)
        if (d->kept[i].serial == serial && d->kept[i].exec == exec)
            return &d->kept[i];
    return NULL;
}

/* What a launch of exec on stream on dev may add to its pool, for allocations of `bytes`:
 * nothing when the driver keeps exec's mappings (launched on this stream in this epoch, the
 * pool's figures known, and the container within its cap: past it, something grew beyond what
 * was reserved, and no launch is taken on trust); else all of them. (What the pool holds that
 * no graph maps could serve them, but the driver's figure for what graphs map does not say
 * which graphs may run at once: a refusal trims that memory first instead.) */
static uint64_t may_add(struct device_graphs *d, int dev, uint64_t bytes, CUgraphExec exec,
                        uint64_t serial, CUstream stream, int known)
{
    const struct kept_graph *k = kept_slot(d, exec, serial);
    if (known && k != NULL && k->stream == stream && k->epoch == d->epoch &&
        vgpu_region_used(dev) <= vgpu_region_limit(dev))
        return 0;
    return bytes;
}

/* After a launch of m's graph on d (launched: the driver took it): the driver keeps its
 * mappings for the next one on the same stream. (Another graph's allocation that outlives its
 * launch may take memory a kept graph mapped, which then maps anew: what the pool grows by
 * then is counted after that launch, past the cap if need be.) */
static void note_launch(struct device_graphs *d, const struct graph_mapping *m, int launched,
                        int known, cuuint64_t after)
{
    if (known && after < d->pool)
        d->epoch++; /* the pool shrank: a trim */
    if (known)
        d->pool = after;
    struct kept_graph *k = kept_slot(d, m->exec, m->serial);
    if (!known || !launched) {
        if (k != NULL)
            k->serial = 0;
        return;
    }
    if (k == NULL) {
        for (int i = 0; i < KEPT_GRAPHS && k == NULL; i++)
            if (d->kept[i].serial == 0)
                k = &d->kept[i];
        if (k == NULL)
            k = &d->kept[d->next++ % KEPT_GRAPHS];
    }
    *k = (struct kept_graph){.exec = m->exec, .serial = m->serial, .stream = m->stream,
                             .epoch = d->epoch};
}

/* Before a launch is refused on dev: the pool gives back what no running graph uses
 * (cuDeviceGraphMemTrim; graphs not running map anew at their next launch), and the footprint
 * is measured again, so that memory the pool held for graphs gone or idle is not held against
 * it. Caller holds d's lock; *pool_before is read anew. */
static void trim_unused(struct device_graphs *d, int dev, cuuint64_t *pool_before, int *known)
{
    if (real.cuDeviceGraphMemTrim == NULL || real.cuDeviceGraphMemTrim((CUdevice)dev) !=
        CUDA_SUCCESS)
        return;
    d->epoch++;
    vgpu_footprint_remeasure(dev);
    *known = pool_reserve(dev, pool_before) == 0;
}

/* Gives back what begin reserved on the first n devices of m, and their locks. */
static void undo(struct graph_mapping *m, int n)
{
    for (int i = 0; i < n; i++) {
        vgpu_mem_unreserve(m->devs[i].dev, m->devs[i].reserved);
        vgpu_unlock(&devices[m->devs[i].dev].lock);
    }
}

/* Before the driver launches or uploads exec, recording serial, on stream: reserves, on each
 * capped device its allocation nodes take memory on, what the call may add to its graph memory
 * pool, and holds the device until mapping_end. -1: it does not fit (logged as api's refusal);
 * the caller answers CUDA_ERROR_OUT_OF_MEMORY without calling the driver. */
static int mapping_begin(const struct vgpu_graph_memory *memory, CUgraphExec exec,
                         uint64_t serial, CUstream stream, const char *api,
                         struct graph_mapping *m)
{
    pthread_once(&once, init);
    *m = (struct graph_mapping){.exec = exec, .serial = serial, .stream = stream};
    /* Devices in ascending order: two launches never wait on each other's locks. */
    for (int dev = 0; dev < VGPU_GRAPH_DEVICES; dev++) {
        if (memory->bytes[dev] == 0 || vgpu_region_limit(dev) == 0)
            continue;
        struct device_graphs *d = &devices[dev];
        struct graph_mapped *md = &m->devs[m->ndevs];
        vgpu_lock(&d->lock);
        md->dev = dev;
        md->known = pool_reserve(dev, &md->pool_before) == 0;
        if (md->known && md->pool_before < d->pool)
            d->epoch++; /* the pool shrank since: a trim */
        vgpu_footprint_refresh(dev); /* what an allocation would see */
        uint64_t need = may_add(d, dev, memory->bytes[dev], exec, serial, stream, md->known);
        if (need != 0 && vgpu_region_reserve(dev, need) != 0 &&
            (trim_unused(d, dev, &md->pool_before, &md->known),
             vgpu_mem_reserve(dev, need, api) != 0)) {
            vgpu_unlock(&d->lock);
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

/* After the call (launched: the driver took it): what each pool grew by stays counted, the
 * rest of the reservation goes back. */
static void mapping_end(struct graph_mapping *m, int launched)
{
    for (int i = 0; i < m->ndevs; i++) {
        struct graph_mapped *md = &m->devs[i];
        struct device_graphs *d = &devices[md->dev];
        cuuint64_t after = 0;
        int known = md->known && pool_reserve(md->dev, &after) == 0;
        uint64_t grew = !known ? md->reserved : after > md->pool_before ? after - md->pool_before
                                                                         : 0;
        if (grew > md->reserved && !__atomic_exchange_n(&overgrowth_warned, 1, __ATOMIC_RELAXED))
            vgpu_log(VGPU_LOG_WARN, "device %d: a graph launch grew the graph memory pool by "
                     "%llu bytes, %llu more than was reserved for it; counted (further "
                     "allocations are refused while past the cap)", md->dev,
                     (unsigned long long)grew, (unsigned long long)(grew - md->reserved));
        vgpu_footprint_grew(md->dev, md->reserved, grew);
        note_launch(d, m, launched, known, after);
        vgpu_unlock(&d->lock);
    }
    if (m->ndevs != 0)
        vgpu_mem_op_end();
}

void vgpu_graph_mapping_forget(CUgraphExec exec, uint64_t serial)
{
    pthread_once(&once, init);
    for (int dev = 0; dev < VGPU_GRAPH_DEVICES; dev++) {
        struct device_graphs *d = &devices[dev];
        vgpu_lock(&d->lock);
        struct kept_graph *k = kept_slot(d, exec, serial);
        if (k != NULL)
            k->serial = 0;
        vgpu_unlock(&d->lock);
    }
}

CUresult vgpu_graph_launch(graph_launch_fn launch, CUgraphExec exec, CUstream stream,
                           const char *api)
{
    struct vgpu_graph_memory memory;
    struct graph_mapping m;
    uint64_t serial = vgpu_graph_memory_of(exec, &memory);
    if (serial == 0)
        return launch(exec, stream);
    /* Mapping takes this file's device locks and the footprint's: on a thread holding one of
     * the library's (a signal handler's launch inside it, locks.h) it would wait for ever. */
    if (serial == VGPU_GRAPH_UNKNOWN_SERIAL || vgpu_holds_a_lock()) {
        static int told;
        if (!__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED))
            vgpu_log(VGPU_LOG_WARN, "%s: refused a graph launched while this thread is inside "
                     "libvgpu (from a signal handler, or from within a driver call): what it "
                     "allocates cannot be counted without waiting for a lock the thread holds",
                     api);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    /* Its kernels may need a larger stack, which the driver raises at the launch. */
    int stack = vgpu_stack_before_needs(memory.stack, stream);
    if (stack < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = CUDA_ERROR_OUT_OF_MEMORY;
    if (mapping_begin(&memory, exec, serial, stream, api, &m) == 0) {
        rc = launch(exec, stream);
        mapping_end(&m, rc == CUDA_SUCCESS);
    }
    vgpu_stack_after_launch(stack, rc);
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
        vgpu_lock(&devices[dev].lock);
    CUresult rc = real.cuDeviceGraphMemTrim(device);
    if (dev >= 0) {
        devices[dev].epoch++; /* graphs map anew after a trim (cuda.h) */
        vgpu_unlock(&devices[dev].lock);
    }
    if (rc == CUDA_SUCCESS && dev >= 0)
        vgpu_footprint_remeasure(dev);
    return rc;
}
