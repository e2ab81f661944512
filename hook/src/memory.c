/* memory.c - the in-process allocation table (sharded, one mutex per shard) and the
 * reserve/OOM policy on top of the shared region. */
#define _GNU_SOURCE
#include "memory.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "footprint.h"
#include "locks.h"
#include "log.h"
#include "region.h"

enum { SHARDS = 64, INITIAL_BUCKETS = 64 };

struct entry {
    uint64_t key;
    uint64_t bytes;
    uint64_t serial; /* which recording of key this is (a key comes back once freed) */
    struct entry *next;
    const void *owner; /* vgpu_mem_track */
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

/* The last recording's serial, across shards: a key's recordings tell each other apart by it,
 * and a context's end tells the recordings made before it from those made since. */
static uint64_t serials;

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

/* The link that points at the entry for key (*link NULL: none); NULL when the shard has no
 * table yet. Caller holds s->lock. */
static struct entry **link_to(struct shard *s, uint64_t h, enum vgpu_alloc_kind kind,
                              uint64_t key)
{
    if (s->nbuckets == 0)
        return NULL;
    struct entry **link = &s->buckets[(size_t)(h >> 6) & (s->nbuckets - 1)];
    while (*link != NULL && ((*link)->key != key || (*link)->kind != (int)kind))
        link = &(*link)->next;
    return link;
}

/* Unlinks the entry for key from its bucket; NULL when there is none. Caller holds s->lock. */
static struct entry *unlink_entry(struct shard *s, uint64_t h, enum vgpu_alloc_kind kind,
                                  uint64_t key)
{
    struct entry **link = link_to(s, h, kind, key), *e = link != NULL ? *link : NULL;
    if (e != NULL) {
        *link = e->next;
        s->count--;
    }
    return e;
}

/* Puts e at the head of its bucket. Caller holds s->lock. */
static void link_entry(struct shard *s, uint64_t h, struct entry *e)
{
    size_t at = (size_t)(h >> 6) & (s->nbuckets - 1);
    e->next = s->buckets[at];
    s->buckets[at] = e;
    s->count++;
}

/* Keeps an unlinked entry for reuse. Caller holds s->lock. */
static void recycle(struct shard *s, struct entry *e)
{
    e->next = s->spare;
    s->spare = e;
}

static void untracked(int dev, uint64_t bytes)
{
    if (dev >= 0 && dev < VGPU_REGION_MAX_DEVICES)
        __atomic_sub_fetch(&tracked[dev], bytes, __ATOMIC_ACQ_REL);
}

/* An entry's bytes that no allocation holds any more go back to the ledger (the caller has
 * taken them out of the table's sum). */
static void give_back(const struct entry *stale, enum vgpu_alloc_kind kind, const char *why)
{
    vgpu_region_release(stale->dev, stale->bytes);
    vgpu_log(VGPU_LOG_INFO, "0x%llx (kind %d): its %llu bytes on device %d given back (%s)",
             (unsigned long long)stale->key, (int)kind, (unsigned long long)stale->bytes,
             stale->dev, why);
}

/* The driver never hands out a live pointer or handle twice: when key is in the table already,
 * one of the two entries is an allocation the driver freed without a free call (with its
 * context). A new allocation replaces the old entry; an entry put back after a failed free
 * (keep_existing) is the stale one when another thread has since been given its key. */
static void insert(enum vgpu_alloc_kind kind, uint64_t key, int dev, uint64_t bytes,
                   const void *owner, int keep_existing)
{
    pthread_once(&table_once, table_init);
    uint64_t h = mix(key, (int)kind);
    struct shard *s = &shards[h & (SHARDS - 1)];
    struct entry mine = {.key = key, .bytes = bytes, .owner = owner, .dev = dev,
                         .kind = (int)kind};
    vgpu_lock(&s->lock);
    struct entry *stale = unlink_entry(s, h, kind, key), old;
    if (stale != NULL && keep_existing) {
        link_entry(s, h, stale);
        vgpu_unlock(&s->lock);
        give_back(&mine, kind, "its free failed and the driver has handed the address out "
                  "again: freed with its context");
        return;
    }
    if (stale != NULL) {
        old = *stale;
        recycle(s, stale);
    }
    struct entry *e = s->spare;
    if (e != NULL)
        s->spare = e->next;
    else
        e = malloc(sizeof *e);
    /* (With a stale entry there is a spare and a table: this cannot fail.) */
    if (e == NULL || (s->count >= s->nbuckets && grow(s) != 0 && s->nbuckets == 0)) {
        vgpu_unlock(&s->lock);
        free(e);
        vgpu_log(VGPU_LOG_ERROR, "out of host memory while recording an allocation; its %llu "
                 "bytes stay counted until the process exits", (unsigned long long)bytes);
        return;
    }
    *e = mine;
    e->serial = __atomic_add_fetch(&serials, 1, __ATOMIC_ACQ_REL);
    link_entry(s, h, e);
    vgpu_unlock(&s->lock);
    if (dev >= 0 && dev < VGPU_REGION_MAX_DEVICES)
        __atomic_add_fetch(&tracked[dev], bytes, __ATOMIC_ACQ_REL);
    if (stale != NULL) {
        untracked(old.dev, old.bytes);
        give_back(&old, kind, "handed out again while still counted: freed with its context");
    }
}

void vgpu_mem_track(enum vgpu_alloc_kind kind, uint64_t key, int dev, uint64_t bytes,
                    const void *owner)
{
    insert(kind, key, dev, bytes, owner, 0);
}

void vgpu_mem_track_again(const struct vgpu_mem_record *was)
{
    insert((enum vgpu_alloc_kind)was->kind, was->key, was->dev, was->bytes, was->owner, 1);
}

static struct vgpu_mem_record record_of(const struct entry *e)
{
    return (struct vgpu_mem_record){.key = e->key, .bytes = e->bytes, .serial = e->serial,
                                    .dev = e->dev, .kind = e->kind, .owner = e->owner};
}

int vgpu_mem_untrack(enum vgpu_alloc_kind kind, uint64_t key, struct vgpu_mem_record *out)
{
    pthread_once(&table_once, table_init);
    uint64_t h = mix(key, (int)kind);
    struct shard *s = &shards[h & (SHARDS - 1)];
    vgpu_lock(&s->lock);
    struct entry *e = unlink_entry(s, h, kind, key);
    if (e != NULL) {
        *out = record_of(e);
        recycle(s, e);
    }
    vgpu_unlock(&s->lock);
    if (e != NULL)
        untracked(out->dev, out->bytes);
    return e != NULL;
}

int vgpu_mem_find(enum vgpu_alloc_kind kind, uint64_t key, struct vgpu_mem_record *out)
{
    pthread_once(&table_once, table_init);
    uint64_t h = mix(key, (int)kind);
    struct shard *s = &shards[h & (SHARDS - 1)];
    vgpu_lock(&s->lock);
    struct entry **link = link_to(s, h, kind, key);
    const struct entry *e = link != NULL ? *link : NULL;
    if (e != NULL)
        *out = record_of(e);
    vgpu_unlock(&s->lock);
    return e != NULL;
}

/* Removes key only while it is still the recording the question was asked about: an
 * allocation that took the same key since (the driver reuses addresses) stays. */
int vgpu_mem_untrack_exact(const struct vgpu_mem_record *asked)
{
    pthread_once(&table_once, table_init);
    uint64_t h = mix(asked->key, asked->kind);
    struct shard *s = &shards[h & (SHARDS - 1)];
    vgpu_lock(&s->lock);
    struct entry *e = unlink_entry(s, h, (enum vgpu_alloc_kind)asked->kind, asked->key);
    if (e != NULL && e->serial != asked->serial) {
        link_entry(s, h, e);
        e = NULL;
    } else if (e != NULL) {
        recycle(s, e);
    }
    vgpu_unlock(&s->lock);
    if (e != NULL)
        untracked(asked->dev, asked->bytes);
    return e != NULL;
}

/* The recordings of kind on dev (every device for dev < 0) and, owner not NULL, of owner,
 * copied out so that the driver can be asked with no shard lock held: *n of them (those that
 * host memory had room for: logged). */
static struct vgpu_mem_record *collect(enum vgpu_alloc_kind kind, int dev, const void *owner,
                                       size_t *n)
{
    pthread_once(&table_once, table_init);
    struct vgpu_mem_record *list = NULL;
    size_t cap = 0;
    int short_of_memory = 0;
    *n = 0;
    for (int i = 0; i < SHARDS; i++) {
        struct shard *s = &shards[i];
        vgpu_lock(&s->lock);
        for (size_t b = 0; b < s->nbuckets && !short_of_memory; b++) {
            for (const struct entry *e = s->buckets[b]; e != NULL; e = e->next) {
                if (e->kind != (int)kind || (dev >= 0 && e->dev != dev) ||
                    (owner != NULL && e->owner != owner))
                    continue;
                if (*n == cap) {
                    size_t more = cap != 0 ? cap * 2 : 64;
                    struct vgpu_mem_record *grown = realloc(list, more * sizeof *list);
                    if (grown == NULL) {
                        short_of_memory = 1;
                        break;
                    }
                    list = grown;
                    cap = more;
                }
                list[(*n)++] = record_of(e);
            }
        }
        vgpu_unlock(&s->lock);
    }
    if (short_of_memory)
        vgpu_log(VGPU_LOG_ERROR, "out of host memory while checking allocations after a context "
                 "was destroyed: some it held stay counted");
    return list;
}

/* Removes r while it is still that recording and gives its bytes back: how many (0: gone or
 * recorded again since). */
static uint64_t drop(const struct vgpu_mem_record *r)
{
    if (!vgpu_mem_untrack_exact(r))
        return 0;
    vgpu_region_release(r->dev, r->bytes);
    return r->bytes;
}

uint64_t vgpu_mem_forget_gone(enum vgpu_alloc_kind kind, int dev,
                              enum vgpu_held (*ask)(uint64_t key), size_t *unanswered)
{
    size_t n;
    struct vgpu_mem_record *list = collect(kind, dev, NULL, &n);
    uint64_t dropped = 0;
    *unanswered = 0;
    vgpu_mem_op_begin();
    for (size_t i = 0; i < n; i++) {
        enum vgpu_held answer = ask(list[i].key);
        if (answer == VGPU_HELD_UNKNOWN)
            ++*unanswered;
        if (answer == VGPU_HELD_GONE)
            dropped += drop(&list[i]);
    }
    vgpu_mem_op_end();
    free(list);
    return dropped;
}

uint64_t vgpu_mem_recorded(void) { return __atomic_load_n(&serials, __ATOMIC_ACQUIRE); }

uint64_t vgpu_mem_forget_owned(enum vgpu_alloc_kind kind, const void *owner, uint64_t before)
{
    if (owner == NULL)
        return 0;
    size_t n;
    struct vgpu_mem_record *list = collect(kind, -1, owner, &n);
    uint64_t dropped = 0;
    vgpu_mem_op_begin();
    for (size_t i = 0; i < n; i++)
        dropped += list[i].serial <= before ? drop(&list[i]) : 0;
    vgpu_mem_op_end();
    free(list);
    return dropped;
}

void vgpu_mem_disown(enum vgpu_alloc_kind kind, const void *owner, uint64_t before)
{
    pthread_once(&table_once, table_init);
    for (int i = 0; i < SHARDS && owner != NULL; i++) {
        struct shard *s = &shards[i];
        vgpu_lock(&s->lock);
        for (size_t b = 0; b < s->nbuckets; b++)
            for (struct entry *e = s->buckets[b]; e != NULL; e = e->next)
                if (e->kind == (int)kind && e->owner == owner && e->serial <= before)
                    e->owner = NULL;
        vgpu_unlock(&s->lock);
    }
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
    if (rc == -1)
        vgpu_region_count_refusal(dev);
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
