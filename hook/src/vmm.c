/* vmm.c - the references, mappings and bindings of cuMemCreate allocations (vmm.h), in two
 * small hash tables and a list under one lock: virtual memory management calls are few next to
 * allocations, and each costs the driver far more than this. A handle with no record has the
 * one reference cuMemCreate gave it and no mapping. */
#ifndef _GNU_SOURCE /* the unit test defines it on the command line */
#define _GNU_SOURCE /* PTHREAD_MUTEX_RECURSIVE */
#endif
#include "vmm.h"

#include "locks.h"

#include <pthread.h>
#include <stdlib.h>

/* A mapping (key: its address; a: its size, b: its handle) or a handle (key: the handle;
 * a: its references, b: its mappings). */
struct node {
    uint64_t key, a, b;
    struct node *next;
};

struct table {
    struct node **buckets;
    size_t nbuckets, count;
};

enum { INITIAL_BUCKETS = 64 };

/* Recursive: vgpu_vmm_hold keeps it across a driver call and the bookkeeping after it. */
static pthread_mutex_t lock;
/* How deep the calling thread is in it: from the start of its first take to the end of its
 * last let-go, so that vgpu_vmm_mine tells a signal handler's call inside from the bookkeeping
 * (listed per take, a list full past VGPU_HELD_MAX would have left the lock unlisted while held).
 * Listed in the thread's held locks (locks.h) once, for the launch paths. Relaxed atomics with
 * signal fences: a handler on this thread is the only other reader. */
static __thread __attribute__((tls_model("initial-exec"))) unsigned depth;
static pthread_once_t lock_once = PTHREAD_ONCE_INIT;
static struct table mappings, handles;

/* Bindings (vmm.h): few next to allocations, looked up by holder and range, so a list. */
struct binding {
    struct vgpu_vmm_binding b;
    uint64_t id;
    int pending; /* recorded before the driver's call, not yet answered */
    struct binding *next;
};
static struct binding *bindings;
static uint64_t binding_ids;

static void make_lock(void)
{
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&lock, &attr);
    pthread_mutexattr_destroy(&attr);
}

static void forget_after_fork(void)
{
    /* The parent's mappings are not the child's: a CUDA context does not survive fork. The
     * tables are leaked on purpose: the child may not touch what another thread was changing. */
    make_lock();
    __atomic_store_n(&depth, 0, __ATOMIC_RELAXED); /* the forking thread's, the child's only */
    mappings = (struct table){0};
    handles = (struct table){0};
    bindings = NULL;
}

static void first_use(void)
{
    make_lock();
    pthread_atfork(NULL, NULL, forget_after_fork);
}

static void take_lock(void)
{
    pthread_once(&lock_once, first_use);
    unsigned d = __atomic_load_n(&depth, __ATOMIC_RELAXED);
    __atomic_store_n(&depth, d + 1, __ATOMIC_RELAXED);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    if (d == 0)
        vgpu_listed(&lock);
    pthread_mutex_lock(&lock);
}

static void let_go(void)
{
    unsigned d = __atomic_load_n(&depth, __ATOMIC_RELAXED);
    if (d == 1)
        vgpu_unlock(&lock);
    else
        pthread_mutex_unlock(&lock);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    __atomic_store_n(&depth, d - 1, __ATOMIC_RELAXED);
}

void vgpu_vmm_hold(void) { take_lock(); }

void vgpu_vmm_let_go(void) { let_go(); }

int vgpu_vmm_mine(void) { return __atomic_load_n(&depth, __ATOMIC_RELAXED) != 0; }

static size_t bucket_of(const struct table *t, uint64_t key)
{
    uint64_t h = key ^ (key >> 33);
    h *= UINT64_C(0xff51afd7ed558ccd);
    return (size_t)(h ^ (h >> 33)) & (t->nbuckets - 1);
}

static struct node *find(const struct table *t, uint64_t key)
{
    if (t->nbuckets == 0)
        return NULL;
    for (struct node *n = t->buckets[bucket_of(t, key)]; n != NULL; n = n->next)
        if (n->key == key)
            return n;
    return NULL;
}

/* Doubles the buckets once there are as many nodes; -1 when out of memory with none yet. */
static int grow(struct table *t)
{
    if (t->count < t->nbuckets)
        return 0;
    size_t n = t->nbuckets != 0 ? t->nbuckets * 2 : INITIAL_BUCKETS;
    struct node **b = calloc(n, sizeof *b);
    if (b == NULL)
        return t->nbuckets != 0 ? 0 : -1; /* longer chains, still correct */
    struct table bigger = {.buckets = b, .nbuckets = n, .count = t->count};
    for (size_t i = 0; i < t->nbuckets; i++) {
        for (struct node *e = t->buckets[i], *next; e != NULL; e = next) {
            next = e->next;
            size_t at = bucket_of(&bigger, e->key);
            e->next = b[at];
            b[at] = e;
        }
    }
    free(t->buckets);
    *t = bigger;
    return 0;
}

/* A new node for key (a, b as given); NULL when out of memory. */
static struct node *add(struct table *t, uint64_t key, uint64_t a, uint64_t b)
{
    struct node *n = malloc(sizeof *n);
    if (n == NULL || grow(t) != 0) {
        free(n);
        return NULL;
    }
    size_t at = bucket_of(t, key);
    *n = (struct node){.key = key, .a = a, .b = b, .next = t->buckets[at]};
    t->buckets[at] = n;
    t->count++;
    return n;
}

static void drop(struct table *t, uint64_t key)
{
    if (t->nbuckets == 0)
        return;
    for (struct node **link = &t->buckets[bucket_of(t, key)]; *link != NULL;
         link = &(*link)->next) {
        if ((*link)->key == key) {
            struct node *n = *link;
            *link = n->next;
            t->count--;
            free(n);
            return;
        }
    }
}

/* The record of handle, made (one reference, no mapping) if it has none; NULL: out of memory. */
static struct node *handle_record(uint64_t handle)
{
    struct node *h = find(&handles, handle);
    return h != NULL ? h : add(&handles, handle, 1, 0);
}

/* Drops handle's record once it is back to what no record means; 1 when nothing holds it. */
static int settle(struct node *h)
{
    uint64_t refs = h->a, maps = h->b;
    if ((refs == 1 && maps == 0) || (refs == 0 && maps == 0))
        drop(&handles, h->key);
    return refs == 0 && maps == 0;
}

int vgpu_vmm_mapped(uint64_t va, uint64_t size, uint64_t handle)
{
    take_lock();
    struct node *h = handle_record(handle);
    int ok = h != NULL && add(&mappings, va, size, handle) != NULL;
    if (ok)
        h->b++;
    else if (h != NULL)
        settle(h); /* a record just made for this is dropped again */
    let_go();
    return ok ? 0 : -1;
}

/* The references of an exported handle: its imports hold references this library never sees
 * taken or released, so it is never taken as freed. */
static const uint64_t exported_refs = UINT64_MAX;

int vgpu_vmm_retained(uint64_t handle)
{
    take_lock();
    struct node *h = handle_record(handle);
    if (h != NULL && h->a != exported_refs)
        h->a++;
    let_go();
    return h != NULL ? 0 : -1;
}

/* A handle value made anew: the bindings made of the old memory under it are gone with it;
 * those pending (a bind under way, of a value released meanwhile) hold the new memory if the
 * driver makes them. Returns how many pending. Caller holds the lock. */
static uint64_t rebind(uint64_t handle)
{
    uint64_t pending = 0;
    for (struct binding **link = &bindings; *link != NULL;) {
        struct binding *n = *link;
        if (n->b.handle == handle && !n->pending) {
            *link = n->next;
            free(n);
            continue;
        }
        pending += n->b.handle == handle;
        link = &n->next;
    }
    return pending;
}

void vgpu_vmm_created(uint64_t handle)
{
    take_lock();
    drop(&handles, handle);
    uint64_t pending = rebind(handle);
    if (pending != 0)
        add(&handles, handle, 1, pending); /* out of memory: taken as unbound */
    let_go();
}

int vgpu_vmm_exported(uint64_t handle)
{
    take_lock();
    struct node *h = handle_record(handle);
    if (h != NULL)
        h->a = exported_refs;
    let_go();
    return h != NULL ? 0 : -1;
}

int vgpu_vmm_released(uint64_t handle)
{
    take_lock();
    struct node *h = find(&handles, handle);
    int freed = h == NULL; /* its one reference, no mapping */
    if (h != NULL) {
        h->a -= h->a != 0 && h->a != exported_refs;
        freed = settle(h);
    }
    let_go();
    return freed;
}

/* The mapping at *at, if *at is still within [va, va + size), and *at moved past it; NULL at
 * the end of the range or at a gap (a range is whole mappings, each starting where the one
 * before ended). Caller holds the lock. */
static const struct node *next_mapping(uint64_t va, uint64_t size, uint64_t *at)
{
    const struct node *m = *at - va < size ? find(&mappings, *at) : NULL;
    if (m == NULL || m->a == 0)
        return NULL;
    *at += m->a;
    return m;
}

size_t vgpu_vmm_handles_in(uint64_t va, uint64_t size, uint64_t *out, size_t max)
{
    size_t n = 0;
    take_lock();
    uint64_t at = va;
    for (const struct node *m; (m = next_mapping(va, size, &at)) != NULL; n++)
        if (n < max)
            out[n] = m->b;
    let_go();
    return n;
}

uint64_t vgpu_vmm_bound(const struct vgpu_vmm_binding *b)
{
    take_lock();
    struct node *h = handle_record(b->handle);
    struct binding *n = h != NULL ? malloc(sizeof *n) : NULL;
    uint64_t id = 0;
    if (n != NULL) {
        id = ++binding_ids;
        *n = (struct binding){.b = *b, .id = id, .pending = 1, .next = bindings};
        bindings = n;
        h->b++;
    } else if (h != NULL) {
        settle(h); /* a record just made for this is dropped again */
    }
    let_go();
    return id;
}

/* One mapping or binding of handle fewer; 1 when that freed its memory. Caller holds the lock. */
static int unhold(uint64_t handle)
{
    struct node *h = find(&handles, handle);
    if (h == NULL)
        return 0;
    h->b -= h->b != 0;
    return settle(h);
}

/* Unlinks binding id, its handle in *handle; 0 when there is none. Caller holds the lock. */
static int unlink_binding(uint64_t id, uint64_t *handle)
{
    for (struct binding **link = &bindings; *link != NULL; link = &(*link)->next) {
        struct binding *n = *link;
        if (n->id == id) {
            *link = n->next;
            *handle = n->b.handle;
            free(n);
            return 1;
        }
    }
    return 0;
}

int vgpu_vmm_bind_answered(uint64_t id, int made)
{
    int freed = 0;
    uint64_t handle;
    take_lock();
    for (struct binding *n = bindings; made && n != NULL; n = n->next) {
        if (n->id != id)
            continue;
        n->pending = 0;
        /* Made anew while pending, with no memory for its record then (rebind): this
         * binding's hold is its record's only mapping (out of memory again, none is kept). */
        if (find(&handles, n->b.handle) == NULL)
            add(&handles, n->b.handle, 1, 1);
        break; /* ids are unique */
    }
    if (!made && unlink_binding(id, &handle))
        freed = unhold(handle);
    let_go();
    return freed;
}

static int selected(const struct binding *n, const struct vgpu_vmm_select *s)
{
    const struct vgpu_vmm_binding *b = &n->b;
    return !n->pending && b->holder == s->holder && b->at - s->from < s->size &&
           (s->dev < 0 || b->dev < 0 || b->dev == s->dev) &&
           (s->tile == NULL || s->covered(b->tile, s->tile));
}

size_t vgpu_vmm_bound_ids(const struct vgpu_vmm_select *s, uint64_t *ids, uint64_t *of,
                          size_t max)
{
    size_t n = 0;
    take_lock();
    for (const struct binding *e = bindings; e != NULL; e = e->next)
        if (selected(e, s) && n++ < max) {
            ids[n - 1] = e->id;
            of[n - 1] = e->b.handle;
        }
    let_go();
    return n;
}

size_t vgpu_vmm_unbound(const uint64_t *ids, size_t n, uint64_t *freed, size_t max)
{
    size_t nfreed = 0;
    uint64_t handle;
    take_lock();
    for (size_t i = 0; i < n; i++)
        if (unlink_binding(ids[i], &handle) && unhold(handle) && nfreed < max)
            freed[nfreed++] = handle;
    let_go();
    return nfreed;
}

size_t vgpu_vmm_handles_over(uint64_t va, uint64_t size, uint64_t *out, size_t max)
{
    size_t n = 0;
    take_lock();
    for (size_t b = 0; b < mappings.nbuckets; b++)
        for (const struct node *m = mappings.buckets[b]; m != NULL; m = m->next)
            if ((m->key - va < size || va - m->key < m->a) && n++ < max)
                out[n - 1] = m->b;
    let_go();
    return n;
}

size_t vgpu_vmm_unmapped(uint64_t va, uint64_t size, uint64_t *freed, size_t max)
{
    size_t n = 0;
    take_lock();
    uint64_t at = va;
    for (const struct node *m; (m = next_mapping(va, size, &at)) != NULL;) {
        uint64_t handle = m->b;
        drop(&mappings, m->key);
        if (unhold(handle) && n < max)
            freed[n++] = handle;
    }
    let_go();
    return n;
}
