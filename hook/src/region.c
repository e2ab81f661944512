/* region.c - the shared region file: creation, validation, slot ownership by fcntl byte locks
 * (which the kernel drops when the owner dies), lock-free reservations, dead-slot reaping.
 *
 * Accounting order (why the device total can only be over, never under, the sum of ledgers):
 *   reserve: CAS device.used_bytes up (checked against the cap), then add to own ledger;
 *   release: subtract from own ledger, then from device.used_bytes;
 *   reap:    exchange the dead ledger to 0, then subtract what it held from device.used_bytes.
 * A process killed between two steps leaves the device total too high by one allocation, which
 * is corrected when the container has no live process left (see reset_if_idle). */
#define _GNU_SOURCE
#include "region.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

static const char default_path[] = "/tmp/cudevshr.cache";

static struct vgpu_region *region;     /* set once (release) by attach */
static int region_fd = -1;             /* -1 for the private fallback */
static int my_slot = -1;               /* -1: none claimed yet in this process */
static int slot_unavailable;           /* all slots taken: account on device totals only */
static int detached;                   /* exit: the ledger was handed back already */
static pthread_once_t attach_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t slot_lock = PTHREAD_MUTEX_INITIALIZER; /* claim and reap, in-process */

static uint64_t load64(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static void store64(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
static uint64_t add64(uint64_t *p, uint64_t v) { return __atomic_add_fetch(p, v, __ATOMIC_ACQ_REL); }
static uint64_t sub64(uint64_t *p, uint64_t v) { return __atomic_sub_fetch(p, v, __ATOMIC_ACQ_REL); }

static uint64_t unix_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int byte_lock(int cmd, short type, uint64_t offset)
{
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = (off_t)offset, .l_len = 1};
    return fcntl(region_fd, cmd, &fl);
}

/* Byte 0 serialises creation and slot claims; the kernel releases it if its holder dies. */
static void lock_creation(void)
{
    while (byte_lock(F_SETLKW, F_WRLCK, 0) != 0 && errno == EINTR) {
    }
}

static void unlock_creation(void) { byte_lock(F_SETLK, F_UNLCK, 0); }

static void write_layout(struct vgpu_region *r, const struct vgpu_limits *limits)
{
    memset(r, 0, sizeof *r);
    struct vgpu_region_header *h = &r->header;
    h->version = VGPU_REGION_VERSION;
    h->header_size = sizeof(struct vgpu_region_header);
    h->device_size = sizeof(struct vgpu_region_device);
    h->slot_size = sizeof(struct vgpu_region_slot);
    h->max_devices = VGPU_REGION_MAX_DEVICES;
    h->max_slots = VGPU_REGION_MAX_SLOTS;
    h->file_size = VGPU_REGION_FILE_SIZE;
    h->devices_offset = VGPU_REGION_DEVICES_OFFSET;
    h->slots_offset = VGPU_REGION_SLOTS_OFFSET;
    h->creator_pid = (int32_t)getpid();
    h->created_unix_ns = unix_ns();
    for (int d = 0; d < VGPU_REGION_MAX_DEVICES; d++) {
        r->devices[d].limit_bytes = limits->memory_bytes[d];
        r->devices[d].sm_limit_percent = limits->sm_percent[d];
    }
    store64(&h->magic, VGPU_REGION_MAGIC);
}

static void warn_if_limits_differ(const struct vgpu_region *r, const struct vgpu_limits *limits)
{
    for (int d = 0; d < VGPU_REGION_MAX_DEVICES; d++) {
        if (r->devices[d].limit_bytes != limits->memory_bytes[d] ||
            r->devices[d].sm_limit_percent != limits->sm_percent[d]) {
            vgpu_log(VGPU_LOG_WARN,
                     "device %d: this process's environment asks for memory %llu bytes / SM %u%%, "
                     "the shared region holds %llu bytes / %u%%; using the region's values",
                     d, (unsigned long long)limits->memory_bytes[d], limits->sm_percent[d],
                     (unsigned long long)r->devices[d].limit_bytes,
                     r->devices[d].sm_limit_percent);
            return;
        }
    }
}

/* Opens, sizes, maps and validates the file; returns NULL and says why on any failure. */
static struct vgpu_region *map_shared(const char *path, const struct vgpu_limits *limits,
                                      const char **failure)
{
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        *failure = strerror(errno);
        return NULL;
    }
    region_fd = fd;
    struct vgpu_region *r = NULL;
    const char *why = NULL;
    lock_creation();
    struct stat st;
    uint64_t magic = 0;
    if (fstat(fd, &st) != 0) {
        why = strerror(errno);
    } else if (st.st_size >= 8 && pread(fd, &magic, sizeof magic, 0) != (ssize_t)sizeof magic) {
        why = "cannot read the header";
    } else if (magic != 0 && st.st_size < (off_t)VGPU_REGION_FILE_SIZE) {
        why = "file too small for its header (another layout)";
    } else if (st.st_size < (off_t)VGPU_REGION_FILE_SIZE &&
               ftruncate(fd, VGPU_REGION_FILE_SIZE) != 0) {
        why = strerror(errno);
    } else {
        void *m = mmap(NULL, VGPU_REGION_FILE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) {
            why = strerror(errno);
        } else {
            r = m;
            if (load64(&r->header.magic) == 0)
                write_layout(r, limits); /* new file, or its creator died before the magic */
            else if ((why = vgpu_region_layout_problem(&r->header, VGPU_REGION_FILE_SIZE))) {
                munmap(m, VGPU_REGION_FILE_SIZE);
                r = NULL;
            } else
                warn_if_limits_differ(r, limits);
        }
    }
    unlock_creation();
    if (r == NULL) {
        *failure = why;
        close(fd);
        region_fd = -1;
    }
    return r;
}

static struct vgpu_region *map_private(const struct vgpu_limits *limits)
{
    struct vgpu_region *r = calloc(1, sizeof *r);
    if (r == NULL)
        abort(); /* 200 KB at start-up: nothing sensible to do without it */
    write_layout(r, limits);
    return r;
}

static void after_fork_child(void)
{
    /* Locks are not inherited: the child claims its own slot on its first reservation. */
    pthread_mutex_init(&slot_lock, NULL);
    my_slot = -1;
    slot_unavailable = 0;
}

static void attach(void)
{
    struct vgpu_limits limits;
    vgpu_limits_from_env(&limits);
    const char *path = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    if (path == NULL || path[0] == '\0')
        path = default_path;
    const char *failure = NULL;
    struct vgpu_region *r = map_shared(path, &limits, &failure);
    if (r == NULL) {
        vgpu_log(VGPU_LOG_ERROR, "cannot use shared region %s: %s; the cap applies to this process "
                 "alone", path, failure);
        r = map_private(&limits);
    }
    pthread_atfork(NULL, NULL, after_fork_child);
    __atomic_store_n(&region, r, __ATOMIC_RELEASE);
}

struct vgpu_region *vgpu_region_get(void)
{
    struct vgpu_region *r = __atomic_load_n(&region, __ATOMIC_ACQUIRE);
    if (r == NULL) {
        pthread_once(&attach_once, attach);
        r = __atomic_load_n(&region, __ATOMIC_ACQUIRE);
    }
    return r;
}

/* Gives a slot's ledger back to the device totals. Caller owns the slot (holds its byte). */
static uint64_t drain_ledger(struct vgpu_region *r, struct vgpu_region_slot *s)
{
    uint64_t total = 0;
    for (int d = 0; d < VGPU_REGION_MAX_DEVICES; d++) {
        uint64_t held = __atomic_exchange_n(&s->used_bytes[d], 0, __ATOMIC_ACQ_REL);
        if (held != 0) {
            sub64(&r->devices[d].used_bytes, held);
            total += held;
        }
    }
    return total;
}

static void set_owner(struct vgpu_region_slot *s, int32_t pid)
{
    add64(&s->generation, 1); /* odd: being changed */
    __atomic_store_n(&s->pid, pid, __ATOMIC_RELAXED);
    __atomic_store_n(&s->host_pid, 0, __ATOMIC_RELAXED);
    store64(&s->claimed_unix_ns, pid != 0 ? unix_ns() : 0);
    store64(&s->last_launch_unix_ns, 0);
    add64(&s->generation, 1);
}

static int slot_is_empty(const struct vgpu_region_slot *s)
{
    if (__atomic_load_n(&s->pid, __ATOMIC_ACQUIRE) != 0)
        return 0;
    for (int d = 0; d < VGPU_REGION_MAX_DEVICES; d++)
        if (load64(&s->used_bytes[d]) != 0)
            return 0;
    return 1;
}

/* The slot's owner died (we now hold its byte): give its memory back and free it. */
static void reap_slot(struct vgpu_region *r, uint32_t index)
{
    struct vgpu_region_slot *s = &r->slots[index];
    int32_t pid = __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE);
    uint64_t returned = drain_ledger(r, s);
    if (pid != 0 || returned != 0) {
        add64(&r->header.reaped_slots, 1);
        vgpu_log(VGPU_LOG_WARN, "process %d (slot %u) is gone; returned %llu bytes to the "
                 "container", (int)pid, index, (unsigned long long)returned);
    }
    set_owner(s, 0);
}

static void raise_high_water(struct vgpu_region *r, uint32_t count)
{
    uint32_t seen = __atomic_load_n(&r->header.slot_high_water, __ATOMIC_ACQUIRE);
    while (seen < count && !__atomic_compare_exchange_n(&r->header.slot_high_water, &seen, count,
                                                        0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    }
}

/* Nobody else holds a slot: the device totals must equal the (zero) ledgers. Repairs the
 * over-count a kill between two accounting steps can leave. Runs only while this process claims
 * its slot, holding byte 0: no thread of ours has reserved yet and no other claim can finish. */
static void reset_if_idle(struct vgpu_region *r)
{
    for (int d = 0; d < VGPU_REGION_MAX_DEVICES; d++) {
        uint64_t total = load64(&r->devices[d].used_bytes);
        if (total != 0) {
            vgpu_log(VGPU_LOG_WARN, "device %d: no other live process; usage corrected from %llu "
                     "to 0 bytes", d, (unsigned long long)total);
            store64(&r->devices[d].used_bytes, 0);
        }
    }
}

/* Tries to own slot i; returns 1 when its byte is ours (the previous owner, if any, is dead). */
static int try_own(uint32_t i)
{
    return byte_lock(F_SETLK, F_WRLCK, vgpu_region_slot_lock_offset(i)) == 0;
}

static void disown(uint32_t i) { byte_lock(F_SETLK, F_UNLCK, vgpu_region_slot_lock_offset(i)); }

/* Reaps every dead slot below the high-water mark; returns how many live ones it saw.
 * Caller holds slot_lock. */
static uint32_t reap_scan(struct vgpu_region *r, int *reaped)
{
    uint32_t live = 0;
    uint32_t high = __atomic_load_n(&r->header.slot_high_water, __ATOMIC_ACQUIRE);
    for (uint32_t i = 0; i < high && i < VGPU_REGION_MAX_SLOTS; i++) {
        if ((int)i == my_slot || slot_is_empty(&r->slots[i]))
            continue;
        if (!try_own(i)) {
            live++;
            continue;
        }
        reap_slot(r, i);
        (*reaped)++;
        disown(i);
    }
    return live;
}

/* Claims the first slot nobody alive holds. Caller holds slot_lock. */
static void claim_slot(struct vgpu_region *r)
{
    lock_creation();
    int reaped = 0;
    uint32_t live = reap_scan(r, &reaped);
    if (live == 0)
        reset_if_idle(r);
    for (uint32_t i = 0; i < VGPU_REGION_MAX_SLOTS; i++) {
        if (!slot_is_empty(&r->slots[i]) || !try_own(i))
            continue;
        set_owner(&r->slots[i], (int32_t)getpid());
        my_slot = (int)i;
        raise_high_water(r, i + 1);
        break;
    }
    unlock_creation();
}

static int ensure_slot(struct vgpu_region *r)
{
    if (__atomic_load_n(&my_slot, __ATOMIC_ACQUIRE) >= 0)
        return my_slot;
    if (region_fd < 0) { /* private region: the single slot is ours */
        my_slot = 0;
        return 0;
    }
    pthread_mutex_lock(&slot_lock);
    if (my_slot < 0 && !slot_unavailable) {
        claim_slot(r);
        if (my_slot < 0) {
            slot_unavailable = 1;
            vgpu_log(VGPU_LOG_ERROR, "all %d process slots of the shared region are in use; this "
                     "process's memory is counted but not reclaimed if it is killed",
                     VGPU_REGION_MAX_SLOTS);
        }
    }
    pthread_mutex_unlock(&slot_lock);
    return my_slot;
}

int vgpu_region_reserve(int dev, uint64_t bytes)
{
    struct vgpu_region *r = vgpu_region_get();
    int slot = ensure_slot(r);
    struct vgpu_region_device *d = &r->devices[dev];
    uint64_t limit = d->limit_bytes;
    uint64_t used = load64(&d->used_bytes), next;
    do {
        next = used + bytes;
        if (next < used || (limit != 0 && next > limit))
            return -1;
    } while (!__atomic_compare_exchange_n(&d->used_bytes, &used, next, 1, __ATOMIC_ACQ_REL,
                                          __ATOMIC_ACQUIRE));
    if (slot >= 0)
        add64(&r->slots[slot].used_bytes[dev], bytes);
    uint64_t peak = load64(&d->peak_bytes);
    while (peak < next && !__atomic_compare_exchange_n(&d->peak_bytes, &peak, next, 1,
                                                       __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return 0;
}

void vgpu_region_release(int dev, uint64_t bytes)
{
    struct vgpu_region *r = vgpu_region_get();
    if (__atomic_load_n(&detached, __ATOMIC_ACQUIRE))
        return; /* a late free during exit: detach already returned everything */
    if (my_slot >= 0)
        sub64(&r->slots[my_slot].used_bytes[dev], bytes);
    sub64(&r->devices[dev].used_bytes, bytes);
}

int vgpu_region_reap_dead(void)
{
    struct vgpu_region *r = vgpu_region_get();
    if (region_fd < 0)
        return 0;
    int reaped = 0;
    pthread_mutex_lock(&slot_lock);
    reap_scan(r, &reaped);
    pthread_mutex_unlock(&slot_lock);
    return reaped;
}

uint64_t vgpu_region_limit(int dev) { return vgpu_region_get()->devices[dev].limit_bytes; }

uint64_t vgpu_region_used(int dev) { return load64(&vgpu_region_get()->devices[dev].used_bytes); }

uint32_t vgpu_region_sm_limit(int dev) { return vgpu_region_get()->devices[dev].sm_limit_percent; }

void vgpu_region_set_uuid(int dev, const char *uuid)
{
    struct vgpu_region_device *d = &vgpu_region_get()->devices[dev];
    uint32_t expected = VGPU_UUID_UNSET;
    if (!__atomic_compare_exchange_n(&d->uuid_state, &expected, VGPU_UUID_WRITING, 0,
                                     __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return;
    strncpy(d->uuid, uuid, sizeof d->uuid - 1);
    d->uuid[sizeof d->uuid - 1] = '\0';
    __atomic_store_n(&d->uuid_state, VGPU_UUID_SET, __ATOMIC_RELEASE);
}

int vgpu_region_find_uuid(const char *uuid)
{
    struct vgpu_region *r = vgpu_region_get();
    for (int d = 0; d < VGPU_REGION_MAX_DEVICES; d++)
        if (__atomic_load_n(&r->devices[d].uuid_state, __ATOMIC_ACQUIRE) == VGPU_UUID_SET &&
            strncmp(r->devices[d].uuid, uuid, sizeof r->devices[d].uuid) == 0)
            return d;
    return -1;
}

void vgpu_region_note_launch(void)
{
    int slot = __atomic_load_n(&my_slot, __ATOMIC_ACQUIRE);
    if (slot >= 0)
        __atomic_store_n(&region->slots[slot].last_launch_unix_ns, unix_ns(), __ATOMIC_RELAXED);
}

int vgpu_region_pids(int32_t *pids, int max)
{
    struct vgpu_region *r = vgpu_region_get();
    int n = 0;
    uint32_t high = __atomic_load_n(&r->header.slot_high_water, __ATOMIC_ACQUIRE);
    for (uint32_t i = 0; i < high && i < VGPU_REGION_MAX_SLOTS; i++) {
        int32_t pid = __atomic_load_n(&r->slots[i].pid, __ATOMIC_ACQUIRE);
        int32_t host = __atomic_load_n(&r->slots[i].host_pid, __ATOMIC_ACQUIRE);
        if (pid != 0 && n < max)
            pids[n++] = pid;
        if (host != 0 && host != pid && n < max)
            pids[n++] = host;
    }
    if (n == 0 && max > 0)
        pids[n++] = (int32_t)getpid();
    return n;
}

void vgpu_region_detach(void)
{
    struct vgpu_region *r = __atomic_load_n(&region, __ATOMIC_ACQUIRE);
    if (r == NULL || region_fd < 0 || my_slot < 0)
        return;
    /* At exit another thread may be inside a claim or a reap (even blocked on another process's
     * lock): never wait for it here. Skipping is safe, the slot is reaped once we are gone. */
    if (pthread_mutex_trylock(&slot_lock) != 0)
        return;
    struct vgpu_region_slot *s = &r->slots[my_slot];
    drain_ledger(r, s);
    set_owner(s, 0);
    disown((uint32_t)my_slot);
    my_slot = -1;
    __atomic_store_n(&detached, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&slot_lock);
}
