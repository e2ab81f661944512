/* memory.c - the in-process allocation table (sharded, one mutex per shard) and the
 * reserve/OOM policy on top of the shared region. */
#define _GNU_SOURCE
#include "memory.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "footprint.h"
#include "log.h"
#include "region.h"

enum { SHARDS = 64, INITIAL_BUCKETS = 64 };

struct entry {
    uint64_t key;
    uint64_t bytes;
    struct entry *next;
    int dev;
    int kind;
};

struct shard {
    pthread_mutex_t lock;
    struct entry **buckets;
    struct entry *spare; /* freed entries, reused before malloc */
    size_t nbuckets;
    size_t count;
};

static struct shard shards[SHARDS];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;
static uint64_t tracked[VGPU_REGION_MAX_DEVICES]; /* atomic: bytes of the table, per device */
static uint64_t ops_started, ops_done;            /* atomic: allocations and frees under way */

static uint64_t mix(uint64_t key, int kind)
{
    uint64_t h = key ^ ((uint64_t)kind << 61);
    h ^= h >> 33;
    h *= UINT64_C(0xff51afd7ed558ccd);
    h ^= h >> 33;
    return h;
}

static void forget_all_after_fork(void)
{
    /* The parent's allocations are not the child's: a CUDA context does not survive fork. */
    for (int i = 0; i < SHARDS; i++) {
        pthread_mutex_init(&shards[i].lock, NULL);
        shards[i].buckets = NULL; /* leaked on purpose: the child may not touch parent memory */
        shards[i].spare = NULL;
        shards[i].nbuckets = 0;
        shards[i].count = 0;
    }
    for (int d = 0; d < VGPU_REGION_MAX_DEVICES; d++)
        tracked[d] = 0;
    ops_started = ops_done = 0;
}

static void table_init(void)
{
    for (int i = 0; i < SHARDS; i++)
        pthread_mutex_init(&shards[i].lock, NULL);
    pthread_atfork(NULL, NULL, forget_all_after_fork);
}

static int grow(struct shard *s)
{
    size_t n = s->nbuckets ? s->nbuckets * 2 : INITIAL_BUCKETS;
    struct entry **b = calloc(n, sizeof *b);
    if (b == NULL)
        return -1;
    for (size_t i = 0; i < s->nbuckets; i++) {
        for (struct entry *e = s->buckets[i], *next; e != NULL; e = next) {
            next = e->next;
            size_t at = (size_t)(mix(e->key, e->kind) >> 6) & (n - 1);
            e->next = b[at];
            b[at] = e;
        }
    }
    free(s->buckets);
    s->buckets = b;
    s->nbuckets = n;
    return 0;
}

void vgpu_mem_track(enum vgpu_alloc_kind kind, uint64_t key, int dev, uint64_t bytes)
{
    pthread_once(&table_once, table_init);
    uint64_t h = mix(key, (int)kind);
    struct shard *s = &shards[h & (SHARDS - 1)];
    pthread_mutex_lock(&s->lock);
    struct entry *e = s->spare;
    if (e != NULL)
        s->spare = e->next;
    else
        e = malloc(sizeof *e);
    if (e == NULL || (s->count >= s->nbuckets && grow(s) != 0 && s->nbuckets == 0)) {
        pthread_mutex_unlock(&s->lock);
        free(e);
        vgpu_log(VGPU_LOG_ERROR, "out of host memory while recording an allocation; its %llu "
                 "bytes stay counted until the process exits", (unsigned long long)bytes);
        return;
    }
    *e = (struct entry){.key = key, .bytes = bytes, .dev = dev, .kind = (int)kind};
    size_t at = (size_t)(h >> 6) & (s->nbuckets - 1);
    e->next = s->buckets[at];
    s->buckets[at] = e;
    s->count++;
    pthread_mutex_unlock(&s->lock);
    if (dev >= 0 && dev < VGPU_REGION_MAX_DEVICES)
        __atomic_add_fetch(&tracked[dev], bytes, __ATOMIC_ACQ_REL);
}

int vgpu_mem_untrack(enum vgpu_alloc_kind kind, uint64_t key, int *dev, uint64_t *bytes)
{
    pthread_once(&table_once, table_init);
    uint64_t h = mix(key, (int)kind);
    struct shard *s = &shards[h & (SHARDS - 1)];
    int found = 0;
    pthread_mutex_lock(&s->lock);
    if (s->nbuckets != 0) {
        struct entry **link = &s->buckets[(size_t)(h >> 6) & (s->nbuckets - 1)];
        for (struct entry *e = *link; e != NULL; link = &e->next, e = e->next) {
            if (e->key == key && e->kind == (int)kind) {
                *link = e->next;
                *dev = e->dev;
                *bytes = e->bytes;
                e->next = s->spare;
                s->spare = e;
                s->count--;
                found = 1;
                break;
            }
        }
    }
    pthread_mutex_unlock(&s->lock);
    if (found && *dev >= 0 && *dev < VGPU_REGION_MAX_DEVICES)
        __atomic_sub_fetch(&tracked[*dev], *bytes, __ATOMIC_ACQ_REL);
    return found;
}

uint64_t vgpu_mem_tracked(int dev) { return __atomic_load_n(&tracked[dev], __ATOMIC_ACQUIRE); }

void vgpu_mem_op_begin(void) { __atomic_add_fetch(&ops_started, 1, __ATOMIC_ACQ_REL); }

void vgpu_mem_op_end(void) { __atomic_add_fetch(&ops_done, 1, __ATOMIC_ACQ_REL); }

uint64_t vgpu_mem_quiet_epoch(void)
{
    uint64_t done = __atomic_load_n(&ops_done, __ATOMIC_ACQUIRE);
    return __atomic_load_n(&ops_started, __ATOMIC_ACQUIRE) == done ? done + 1 : 0;
}

/* At most one refusal line per second per process: an application retrying in a loop (the
 * PyTorch allocator does) must not flood its log. The line says how many were not shown. */
static int refusal_log_due(uint64_t *suppressed)
{
    static uint64_t last_s, quiet;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t now = (uint64_t)ts.tv_sec, last = __atomic_load_n(&last_s, __ATOMIC_RELAXED);
    /* Logged already this second, or another thread just took this second's line. */
    if ((last != 0 && now == last) ||
        !__atomic_compare_exchange_n(&last_s, &last, now, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
        __atomic_add_fetch(&quiet, 1, __ATOMIC_RELAXED);
        return 0;
    }
    *suppressed = __atomic_exchange_n(&quiet, 0, __ATOMIC_RELAXED);
    return 1;
}

int vgpu_mem_reserve(int dev, uint64_t bytes, const char *api)
{
    int rc = vgpu_region_reserve(dev, bytes);
    if (rc == -1 && vgpu_region_reap_dead() > 0)
        rc = vgpu_region_reserve(dev, bytes);
    if (rc == -1) {
        /* The context memory counted may be stale (a pool gave memory back): measure again. */
        vgpu_footprint_before_refusal(dev);
        rc = vgpu_region_reserve(dev, bytes);
    }
    if (rc == 0)
        return 0;
    struct vgpu_region *r = vgpu_region_get();
    if (rc == -1 && r != NULL)
        __atomic_add_fetch(&r->devices[dev].oom_refusals, 1, __ATOMIC_RELAXED);
    uint64_t suppressed = 0;
    if (refusal_log_due(&suppressed)) {
        char more[64] = "";
        if (suppressed != 0)
            snprintf(more, sizeof more, " (%llu more refusals since the last line)",
                     (unsigned long long)suppressed);
        if (rc == -1)
            vgpu_log(VGPU_LOG_ERROR, "%s: device %d out of memory: %llu bytes requested, %llu of "
                     "%llu in use by the container%s", api, dev, (unsigned long long)bytes,
                     (unsigned long long)vgpu_region_used(dev),
                     (unsigned long long)vgpu_region_limit(dev), more);
        else
            vgpu_log(VGPU_LOG_ERROR, "%s: device %d: %llu bytes refused: no usable shared region "
                     "for this process (see the first error)%s", api, dev,
                     (unsigned long long)bytes, more);
    }
    return -1;
}

void vgpu_mem_unreserve(int dev, uint64_t bytes) { vgpu_region_release(dev, bytes); }
