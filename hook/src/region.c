/* region.c - the shared region of the container: attaching (fail-closed: no usable file, no
 * CUDA), slot ownership by fcntl byte locks (which the kernel drops when the owner dies),
 * reservations through the ledger (ledger.c: each process's own words, summed; no lock), and
 * reaping of dead slots. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "region.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/auxv.h>
#include <sys/stat.h>
#include <unistd.h>

#include "devices.h"
#include "ledger.h"
#include "locks.h"
#include "log.h"
#include "owner.h"
#include "region_file.h"
#include "settings.h"
#include "truncation.h"
#include "util.h"

static const char default_path[] = "/tmp/cudevshr.cache";

static struct vgpu_region *region;     /* set once (release) by attach; NULL: refused */
static struct vgpu_region_file file = {.fd = -1, .dir_fd = -1};
static uint64_t limit_bytes[VGPU_REGION_MAX_DEVICES];  /* chosen once at attach */
static uint32_t sm_percent[VGPU_REGION_MAX_DEVICES];
static int any_limit;    /* some device has a memory cap (chosen with limit_bytes) */
static int any_sm_limit; /* some device has an SM limit (chosen with sm_percent) */
static int my_slot = -1;               /* -1: none claimed yet in this process */
static int no_slot;                    /* the last claim found none, or could not be made */
static uint64_t no_slot_since_ms;      /* when: claims are retried once a second */
static int fork_reopen_failed;         /* a forked child could not get its own description */
static uint64_t my_start_ticks;        /* when this process started (owner.h; 0: unknown) */
/* The region as this process's mappings show it (owner.h), read when first needed: to judge an
 * owner whose lock is free, which most processes never do (a maps file of thousands of lines
 * is not read at every attach). */
static pthread_once_t mapped_once = PTHREAD_ONCE_INIT;
static uint64_t mapped_dev, mapped_ino;
/* A free-lock slot whose owner was found running, and until when that is taken as still so
 * (generation: the claim it was found for): the frequent questions (a usage query's or an SM
 * limiter reading's reaping, at most every 100 ms, and a usage query's sum of the live slots)
 * read /proc at most once a second per slot. A claim, and a reservation about to be refused,
 * ask afresh: an owner that died since must not cost an allocation. */
static struct {
    uint64_t generation, until_ns;
} running[VGPU_REGION_MAX_SLOTS];
static pthread_once_t attach_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t slot_lock = PTHREAD_MUTEX_INITIALIZER; /* claim and reap, in-process */

static uint64_t add64(uint64_t *p, uint64_t v) { return __atomic_add_fetch(p, v, __ATOMIC_ACQ_REL); }

/* Open file description locks (F_OFD_*): owned by this process's own description of the file,
 * so neither a close() of another descriptor to the file nor a thread drops them (a POSIX
 * record lock is dropped by any close() of the file in the process). l_pid must be 0. */
static int byte_lock(int cmd, short type, uint64_t offset)
{
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = (off_t)offset, .l_len = 1,
                       .l_pid = 0};
    return fcntl(file.fd, cmd, &fl);
}

/* Whether file.fd still names the region file (fstat: its device and inode at the open). A
 * program that closes every descriptor (a daemon after fork) may have put another file at its
 * number: a claim's locks there would find every slot free, a live process's among them, and
 * reap it. */
static int descriptor_intact(void)
{
    struct stat st;
    return file.fd >= 0 && fstat(file.fd, &st) == 0 && (uint64_t)st.st_dev == file.dev &&
           (uint64_t)st.st_ino == file.ino;
}

/* Whose limits apply where the region's header and this process's settings differ: the settings
 * file's (a header can be rewritten by any process of the container, the file by none), else the
 * region's (the environment of whichever process came first fixed them). */
static void choose_limits(const struct vgpu_region *r, struct vgpu_limits *limits, int from_file)
{
    for (int d = 0; d < VGPU_REGION_MAX_DEVICES; d++) {
        if (r->devices[d].limit_bytes != limits->memory_bytes[d] ||
            r->devices[d].sm_limit_percent != limits->sm_percent[d]) {
            vgpu_log(VGPU_LOG_WARN,
                     "device %d: this process's %s asks for memory %llu bytes / SM %u%%, "
                     "the shared region holds %llu bytes / %u%%; using the %s values",
                     d, from_file ? "settings file" : "environment",
                     (unsigned long long)limits->memory_bytes[d], limits->sm_percent[d],
                     (unsigned long long)r->devices[d].limit_bytes,
                     r->devices[d].sm_limit_percent, from_file ? "settings file's" : "region's");
            break;
        }
    }
    if (from_file)
        return;
    for (int d = 0; d < VGPU_REGION_MAX_DEVICES; d++) {
        limits->memory_bytes[d] = r->devices[d].limit_bytes;
        limits->sm_percent[d] = r->devices[d].sm_limit_percent;
    }
}

/* A new open file description of the region file in place of file.fd; 0, or -1 (errno set). */
static int reopen_region_fd(void)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", file.fd);
    int fresh = open(path, O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fresh < 0)
        return -1;
    int rc = dup3(fresh, file.fd, O_CLOEXEC) < 0 ? -1 : 0;
    int err = errno;
    close(fresh);
    errno = err;
    return rc;
}

static void after_fork_child(void)
{
    /* The child shares the parent's open file description, and with it the parent's slot lock
     * (an OFD lock): it would neither see the parent's lock nor own one of its own, and while it
     * lived the parent's slot would look alive. It gets a description of its own (which drops
     * its reference to the parent's) and claims its own slot on its first reservation. If that
     * fails it refuses allocations. */
    pthread_mutex_init(&slot_lock, NULL);
    my_slot = -1;
    no_slot = 0;
    my_start_ticks = vgpu_owner_start_ticks(0); /* the child's own */
    if (file.fd >= 0 && reopen_region_fd() != 0) {
        close(file.fd);
        file.fd = -1;
        fork_reopen_failed = 1;
    }
}

static void reap_earlier_image(struct vgpu_region *r);

static void attach(void)
{
    const struct vgpu_settings *settings = vgpu_settings();
    if (settings == NULL)
        return; /* a settings file that cannot be used: logged by settings.c */
    if (getauxval(AT_SECURE) &&
        (!settings->from_file || (settings->owner_uid != 0 && settings->owner_uid != geteuid()))) {
        /* set-user-ID, set-group-ID or file capabilities: the environment that names the region
         * and the limits belongs to whoever started the program (secure_getenv ignores it). A
         * settings file root or the program's owner wrote does not, so it serves such a program. */
        vgpu_log(VGPU_LOG_ERROR, "secure-execution mode (a set-user-ID, set-group-ID or "
                 "file-capability program) without a %s owned by root: the shared region cannot "
                 "be located from untrusted input; CUDA is refused in this process",
                 vgpu_settings_path);
        return;
    }
    struct vgpu_limits limits;
    if (vgpu_limits_read(&limits, vgpu_setting, settings->from_file) != 0) {
        /* Ignoring a rejected value would leave that limit off: whoever wrote CUDA_DEVICE_MEMORY_
         * LIMIT=16Gb meant a cap. The plugin writes only values the library accepts, so in its
         * file a rejected one means the file is not what it wrote. */
        if (settings->from_file)
            vgpu_log(VGPU_LOG_ERROR, "settings file %s: a limit in it was rejected (above); CUDA "
                     "is refused in this process", vgpu_settings_path);
        else
            vgpu_log(VGPU_LOG_ERROR, "a limit in the environment was rejected (above): correct "
                     "it, or unset it for no limit; CUDA is refused in this process");
        return;
    }
    const char *path = vgpu_settings_lookup(settings, "CUDA_DEVICE_MEMORY_SHARED_CACHE");
    if (path == NULL || path[0] == '\0')
        path = default_path;
    const char *why = NULL;
    if (vgpu_region_file_open(path, &limits, &file, &why) != 0) {
        vgpu_log(VGPU_LOG_ERROR, "cannot use shared region %s: %s; CUDA is refused in this process",
                 path, why);
        return;
    }
    struct vgpu_region *r = file.map;
    choose_limits(r, &limits, settings->from_file);
    for (int d = 0; d < VGPU_REGION_MAX_DEVICES; d++) {
        limit_bytes[d] = limits.memory_bytes[d];
        sm_percent[d] = limits.sm_percent[d];
        any_limit |= limit_bytes[d] != 0;
        any_sm_limit |= sm_percent[d] != 0;
    }
    if (vgpu_truncation_guard(r, VGPU_REGION_FILE_SIZE) != 0)
        vgpu_log(VGPU_LOG_WARN, "cannot install the SIGBUS handler: a truncated region file will "
                 "kill this process");
    my_start_ticks = vgpu_owner_start_ticks(0); /* read here, not in a claim's odd window */
    reap_earlier_image(r);
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

/* Lost: the file was truncated (SIGBUS caught) or its header zeroed under us. */
static int intact(const struct vgpu_region *r)
{
    /* The magic first: reading a truncated file faults, and the handler sets the flag. */
    return __atomic_load_n(&r->header.magic, __ATOMIC_ACQUIRE) == VGPU_REGION_MAGIC &&
           !vgpu_truncation_seen();
}

int vgpu_region_usable(void)
{
    struct vgpu_region *r = vgpu_region_get();
    return r != NULL && intact(r);
}

/* Only the holder of the slot's byte writes it. The generation is made odd, not incremented:
 * a writer killed between the two stores left it odd, and an increment would then keep it odd
 * for good (a reader waiting for an even one would wait for ever). */
static void set_owner(struct vgpu_region_slot *s, int32_t pid)
{
    uint64_t changing = load64(&s->generation) | 1;
    __atomic_store_n(&s->generation, changing, __ATOMIC_RELAXED); /* odd: being changed */
    __atomic_thread_fence(__ATOMIC_RELEASE); /* before any of the stores below */
    __atomic_store_n(&s->pid, pid, __ATOMIC_RELAXED);
    __atomic_store_n(&s->host_pid, 0, __ATOMIC_RELAXED);
    store64(&s->claimed_unix_ns, pid != 0 ? unix_ns() : 0);
    store64(&s->start_ticks, pid != 0 ? my_start_ticks : 0);
    store64(&s->last_launch_unix_ns, 0);
    store64(&s->context_bytes, 0);
    store64(&s->generation, changing + 1);
}

static int slot_is_empty(const struct vgpu_region_slot *s)
{
    if (__atomic_load_n(&s->pid, __ATOMIC_ACQUIRE) != 0)
        return 0;
    for (int d = 0; d < VGPU_REGION_MAX_DEVICES; d++)
        if (load64(&s->used_bytes[d]) != 0)
            return 0;
    return load64(&s->pending) == 0;
}

/* The slot's owner died (we hold its byte): give its memory back and free it. */
static void reap_slot(struct vgpu_region *r, uint32_t index)
{
    struct vgpu_region_slot *s = &r->slots[index];
    int32_t pid = __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE);
    uint64_t returned = vgpu_ledger_drain(r, index);
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
    /* Sequentially consistent, as the ledger's announcements and reads are (ledger.c): a
     * reservation's walk of the slots must reach a slot claimed before another's check. */
    while (seen < count && !__atomic_compare_exchange_n(&r->header.slot_high_water, &seen, count,
                                                        0, __ATOMIC_SEQ_CST, __ATOMIC_ACQUIRE)) {
    }
}

static void disown(uint32_t i) { byte_lock(F_OFD_SETLK, F_UNLCK, vgpu_region_slot_lock_offset(i)); }

static void learn_mapping(void)
{
    if (vgpu_owner_mapping_of(file.map, &mapped_dev, &mapped_ino) != 0) {
        mapped_dev = file.dev;
        mapped_ino = file.ino;
    }
}

/* Whether the owner of slot i, whose lock byte nobody holds, is gone. Not while the process
 * that claimed it runs (owner.h): it closed the region's descriptor, and its lock with it, but
 * still holds its memory (reaped, that memory would be given out twice). A slot of this
 * process's pid and start time is its image before an exec (the callers skip its own slot).
 * fresh: /proc is asked even if the owner was found running within the second. */
static int owner_gone(const struct vgpu_region *r, uint32_t i, int fresh)
{
    const struct vgpu_region_slot *s = &r->slots[i];
    int32_t pid = __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE);
    uint64_t start_ticks = load64(&s->start_ticks);
    if (pid == 0 || (pid == (int32_t)getpid() && start_ticks == my_start_ticks))
        return 1;
    uint64_t generation = load64(&s->generation), now = monotonic_ns();
    if (!fresh && __atomic_load_n(&running[i].generation, __ATOMIC_RELAXED) == generation &&
        now < __atomic_load_n(&running[i].until_ns, __ATOMIC_RELAXED))
        return 0;
    pthread_once(&mapped_once, learn_mapping);
    struct vgpu_owner owner = {.pid = pid, .start_ticks = start_ticks, .dev = mapped_dev,
                               .ino = mapped_ino};
    if (!vgpu_owner_runs(&owner))
        return 1;
    __atomic_store_n(&running[i].generation, generation, __ATOMIC_RELAXED);
    __atomic_store_n(&running[i].until_ns, now + UINT64_C(1000000000), __ATOMIC_RELAXED);
    return 0;
}

/* Tries to own slot i; returns 1 when its byte is ours and its owner, if any, is gone (fresh:
 * as owner_gone). */
static int try_own(const struct vgpu_region *r, uint32_t i, int fresh)
{
    if (byte_lock(F_OFD_SETLK, F_WRLCK, vgpu_region_slot_lock_offset(i)) != 0)
        return 0;
    if (slot_is_empty(&r->slots[i]) || owner_gone(r, i, fresh))
        return 1;
    disown(i);
    return 0;
}

/* At attach: a slot of this process's pid is its image before an exec, whose CUDA context went
 * with it. Reaped now, whatever this image does next: to others it looks alive while this
 * image maps the region (owner.h), and one that claims no slot (it only asks NVML) would never
 * reap it. */
static void reap_earlier_image(struct vgpu_region *r)
{
    uint32_t high = __atomic_load_n(&r->header.slot_high_water, __ATOMIC_ACQUIRE);
    vgpu_log_defer_begin(); /* not while holding the slot's byte (log.h) */
    for (uint32_t i = 0; i < high && i < VGPU_REGION_MAX_SLOTS; i++) {
        if (__atomic_load_n(&r->slots[i].pid, __ATOMIC_ACQUIRE) != (int32_t)getpid() ||
            !try_own(r, i, 1))
            continue;
        reap_slot(r, i);
        disown(i);
    }
    vgpu_log_defer_end();
}

/* Reaps every dead slot below the high-water mark (fresh: as owner_gone); returns how many.
 * Caller holds slot_lock and owns slot self. */
static int reap_scan(struct vgpu_region *r, uint32_t self, int fresh)
{
    int reaped = 0;
    uint32_t high = __atomic_load_n(&r->header.slot_high_water, __ATOMIC_ACQUIRE);
    for (uint32_t i = 0; i < high && i < VGPU_REGION_MAX_SLOTS; i++) {
        if (i == self || slot_is_empty(&r->slots[i]) || !try_own(r, i, fresh))
            continue;
        reap_slot(r, i);
        reaped++;
        disown(i);
    }
    return reaped;
}

/* Claims the first slot nobody alive holds, then reaps the dead ones. A dead owner's slot is
 * reaped before it is taken: were only empty slots claimed, a region whose every slot a dead
 * process held would keep all new processes out, since only a claimant reaps. Returns why
 * no claim could be made (NULL: one was, my_slot tells whether it found a slot). Caller holds
 * slot_lock. */
static const char *claim_slot(struct vgpu_region *r)
{
    if (vgpu_region_file_lock_byte(file.fd, 0, VGPU_CREATION_LOCK_WAIT_S * 1000) != 0)
        return errno == ETIMEDOUT ? vgpu_creation_lock_held
                                  : "the shared region's creation lock cannot be taken";
    for (uint32_t i = 0; i < VGPU_REGION_MAX_SLOTS; i++) {
        if (!try_own(r, i, 1))
            continue;
        if (!slot_is_empty(&r->slots[i]))
            reap_slot(r, i);
        set_owner(&r->slots[i], (int32_t)getpid());
        raise_high_water(r, i + 1);
        reap_scan(r, i, 1);
        __atomic_store_n(&my_slot, (int)i, __ATOMIC_RELEASE);
        break;
    }
    vgpu_region_file_unlock_byte(file.fd, 0);
    return NULL;
}

/* With every slot taken, a claim is tried again at most once a second: a long-lived process
 * that once met a full container gets a slot when one comes free (a claim scans them all). */
enum { SLOT_RETRY_MS = 1000 };

/* Claims a slot where this process can; logs the first refusal, and the end of one. Caller
 * holds slot_lock. */
static void try_claim(struct vgpu_region *r)
{
    const char *why = fork_reopen_failed ? "cannot reopen the shared region after fork"
                      : !descriptor_intact()
                          ? "the program closed the shared region's descriptor, or put another "
                            "file at its number"
                          : NULL;
    if (why == NULL)
        why = claim_slot(r);
    if (why == NULL) {
        _Static_assert(VGPU_REGION_MAX_SLOTS == 1024, "the line below names the slots' count");
        if (my_slot < 0)
            why = "all 1024 process slots of the shared region are in use";
    }
    if (why != NULL && !no_slot)
        vgpu_log(VGPU_LOG_ERROR, "%s; this process cannot allocate device memory", why);
    else if (why == NULL && no_slot)
        vgpu_log(VGPU_LOG_WARN, "this process has a slot of the shared region again, and can "
                 "allocate device memory");
    no_slot = why != NULL;
    no_slot_since_ms = monotonic_ns() / 1000000u; /* after the claim, which may have waited */
}

static int ensure_slot(struct vgpu_region *r)
{
    int slot = __atomic_load_n(&my_slot, __ATOMIC_ACQUIRE);
    if (slot >= 0)
        return slot;
    vgpu_log_defer_begin(); /* the claim's lines wait until its locks are released (log.h) */
    vgpu_lock(&slot_lock);
    uint64_t now_ms = monotonic_ns() / 1000000u;
    if (my_slot < 0 && (!no_slot || now_ms - no_slot_since_ms >= SLOT_RETRY_MS))
        try_claim(r);
    slot = my_slot;
    vgpu_unlock(&slot_lock);
    vgpu_log_defer_end();
    return slot;
}

/* Adds bytes to this process's ledger for dev unless the container's usage would pass limit
 * (0: none). */
static int add_to_ledger(int dev, uint64_t bytes, uint64_t limit)
{
    struct vgpu_region *r = vgpu_region_get();
    if (r == NULL || !intact(r))
        return -2;
    int slot = ensure_slot(r);
    if (slot < 0)
        return -2;
    int rc = vgpu_ledger_add(r, (uint32_t)slot, dev, bytes, limit);
    if (rc == 0 && !intact(r))
        rc = -2; /* truncated during the change: it went to the private zeros, refuse */
    return rc;
}

/* The functions below that take a dev take a CUDA ordinal of this process, and count it in its
 * GPU's record (devices.c); a GPU not assigned to the container has none: nothing fits there. */

int vgpu_region_reserve(int dev, uint64_t bytes)
{
    int record = vgpu_device_record(dev);
    return record < 0 ? -1 : add_to_ledger(record, bytes, limit_bytes[record]);
}

int vgpu_region_charge(int dev, uint64_t bytes)
{
    int record = vgpu_device_record(dev);
    return record < 0 ? -2 : add_to_ledger(record, bytes, 0);
}

void vgpu_region_release(int dev, uint64_t bytes)
{
    struct vgpu_region *r = vgpu_region_get();
    int slot = __atomic_load_n(&my_slot, __ATOMIC_ACQUIRE);
    dev = vgpu_device_record(dev);
    if (r == NULL || slot < 0 || dev < 0)
        return;
    vgpu_ledger_sub(r, (uint32_t)slot, dev, bytes);
}

static int reap_dead(int fresh)
{
    struct vgpu_region *r = vgpu_region_get();
    int slot = __atomic_load_n(&my_slot, __ATOMIC_ACQUIRE);
    if (r == NULL || slot < 0 || !intact(r) || !descriptor_intact())
        return 0;
    vgpu_log_defer_begin(); /* not while holding the dead slots' bytes (log.h) */
    vgpu_lock(&slot_lock);
    int reaped = reap_scan(r, (uint32_t)slot, fresh);
    vgpu_unlock(&slot_lock);
    vgpu_log_defer_end();
    return reaped;
}

int vgpu_region_reap_dead(void) { return reap_dead(1); }

void vgpu_region_reap_lately(void)
{
    static uint64_t last_ns;
    uint64_t now = monotonic_ns(), last = __atomic_load_n(&last_ns, __ATOMIC_RELAXED);
    if (now - last >= UINT64_C(100000000) &&
        __atomic_compare_exchange_n(&last_ns, &last, now, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        reap_dead(0);
}

/* Whether slot i's owner is alive: its byte is locked, asked as the node monitor asks
 * (F_OFD_GETLK: no lock taken, so the question cannot make a dead slot look alive to anyone
 * else), or it runs without its lock (owner_gone). */
static int owner_alive(const struct vgpu_region *r, uint32_t i)
{
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET,
                       .l_start = (off_t)vgpu_region_slot_lock_offset(i), .l_len = 1};
    return fcntl(file.fd, F_OFD_GETLK, &fl) != 0 || fl.l_type != F_UNLCK ||
           !owner_gone(r, i, 0);
}

uint64_t vgpu_region_record_in_use(int record)
{
    struct vgpu_region *r = vgpu_region_get();
    if (r == NULL || record < 0 || record >= VGPU_REGION_MAX_DEVICES)
        return 0;
    int slot = __atomic_load_n(&my_slot, __ATOMIC_ACQUIRE);
    if (slot >= 0) { /* a process of the container (it has a slot) */
        vgpu_region_reap_lately();
        return vgpu_region_device_used(r, record);
    }
    /* One that only asks (nvidia-smi, an NVML monitor): the live slots' ledgers, read only. */
    uint64_t used = 0;
    uint32_t high = __atomic_load_n(&r->header.slot_high_water, __ATOMIC_ACQUIRE);
    for (uint32_t i = 0; i < high && i < VGPU_REGION_MAX_SLOTS; i++)
        if (!slot_is_empty(&r->slots[i]) && owner_alive(r, i))
            used += load64(&r->slots[i].used_bytes[record]);
    return used;
}

uint64_t vgpu_region_record_limit(int record)
{
    return vgpu_region_get() != NULL && record >= 0 ? limit_bytes[record] : 0;
}

uint64_t vgpu_region_record_used(int record)
{
    struct vgpu_region *r = vgpu_region_get();
    return r != NULL && record >= 0 ? vgpu_region_device_used(r, record) : 0;
}

uint64_t vgpu_region_limit(int dev)
{
    int record = vgpu_device_record(dev);
    return record < 0 ? VGPU_REGION_NOTHING_FITS : vgpu_region_record_limit(record);
}

int vgpu_region_any_limit(void) { return vgpu_region_get() != NULL && any_limit; }

int vgpu_region_limits_anything(void)
{
    return vgpu_region_get() != NULL && (any_limit || any_sm_limit);
}

uint64_t vgpu_region_used(int dev) { return vgpu_region_record_used(vgpu_device_record(dev)); }

uint32_t vgpu_region_sm_limit(int dev)
{
    int record = vgpu_device_record(dev);
    return vgpu_region_get() != NULL && record >= 0 ? sm_percent[record] : 0;
}

struct vgpu_region_device *vgpu_region_sm_account(int dev)
{
    struct vgpu_region *r = vgpu_region_get();
    int record = vgpu_device_record(dev);
    return r != NULL && record >= 0 ? &r->devices[record] : NULL;
}

double vgpu_region_sample_period(int dev)
{
    struct vgpu_region *r = vgpu_region_get();
    int record = vgpu_device_record(dev);
    if (r == NULL || record < 0)
        return 0.0;
    return __atomic_load_n(&r->header.sample_period_ms[record], __ATOMIC_RELAXED) / 1000.0;
}

void vgpu_region_learn_sample_period(int dev, double seconds)
{
    struct vgpu_region *r = vgpu_region_get();
    int record = vgpu_device_record(dev);
    if (r == NULL || record < 0 || !(seconds > 0.0 && seconds < 60.0))
        return;
    uint16_t ms = (uint16_t)(seconds * 1000.0 + 0.5), seen;
    uint16_t *word = &r->header.sample_period_ms[record];
    seen = __atomic_load_n(word, __ATOMIC_RELAXED);
    while (ms != 0 && (seen == 0 || ms < seen) &&
           !__atomic_compare_exchange_n(word, &seen, ms, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

void vgpu_region_count_refusal(int dev)
{
    struct vgpu_region *r = vgpu_region_get();
    int record = vgpu_device_record(dev);
    if (r != NULL && record >= 0)
        __atomic_add_fetch(&r->devices[record].oom_refusals, 1, __ATOMIC_RELAXED);
}

/* Records are written only under the records lock (header byte 104), held for a few stores: a
 * reader that meets one being written waits a moment. A record still WRITING when the lock is
 * ours was left by a writer that died in between: it is no GPU's and may be taken. */
static int lock_records(void)
{
    /* 2 s at most: a holder stopped (SIGSTOP), or the lock unusable */
    return vgpu_region_file_lock_byte(file.fd, VGPU_REGION_RECORDS_LOCK_OFFSET, 2000);
}

static void unlock_records(void)
{
    vgpu_region_file_unlock_byte(file.fd, VGPU_REGION_RECORDS_LOCK_OFFSET);
}

static uint32_t uuid_state(struct vgpu_region_device *d)
{
    uint32_t state = __atomic_load_n(&d->uuid_state, __ATOMIC_ACQUIRE);
    for (int spins = 0; state == VGPU_UUID_WRITING && spins < 1000; spins++) {
        sched_yield();
        state = __atomic_load_n(&d->uuid_state, __ATOMIC_ACQUIRE);
    }
    return state;
}

static int names(struct vgpu_region_device *d, const char *uuid)
{
    return uuid_state(d) == VGPU_UUID_SET && strncasecmp(d->uuid, uuid, sizeof d->uuid) == 0;
}

/* Writes uuid into d; the records lock is held, so no other writer is live. */
static void write_record(struct vgpu_region_device *d, const char *uuid)
{
    __atomic_store_n(&d->uuid_state, VGPU_UUID_WRITING, __ATOMIC_RELEASE);
    strncpy(d->uuid, uuid, sizeof d->uuid - 1);
    d->uuid[sizeof d->uuid - 1] = '\0';
    __atomic_store_n(&d->uuid_state, VGPU_UUID_SET, __ATOMIC_RELEASE);
}

static int free_record(const struct vgpu_region_device *d)
{
    return __atomic_load_n(&d->uuid_state, __ATOMIC_ACQUIRE) != VGPU_UUID_SET;
}

int vgpu_region_set_uuid(int record, const char *uuid)
{
    struct vgpu_region *r = vgpu_region_get();
    if (r == NULL || record < 0 || record >= VGPU_REGION_MAX_DEVICES || lock_records() != 0)
        return 0;
    struct vgpu_region_device *d = &r->devices[record];
    int rc = 0;
    if (free_record(d))
        write_record(d, uuid);
    else if (!names(d, uuid))
        rc = -1;
    unlock_records();
    return rc;
}

int vgpu_region_find_uuid(const char *uuid)
{
    struct vgpu_region *r = vgpu_region_get();
    for (int d = 0; r != NULL && d < VGPU_REGION_MAX_DEVICES; d++)
        if (names(&r->devices[d], uuid))
            return d;
    return -1;
}

int vgpu_region_claim_record(const char *uuid, int preferred)
{
    struct vgpu_region *r = vgpu_region_get();
    if (r == NULL || lock_records() != 0)
        return -1;
    int record = vgpu_region_find_uuid(uuid);
    if (record < 0 && preferred >= 0 && preferred < VGPU_REGION_MAX_DEVICES &&
        free_record(&r->devices[preferred]))
        record = preferred;
    for (int d = 0; record < 0 && d < VGPU_REGION_MAX_DEVICES; d++)
        if (free_record(&r->devices[d]))
            record = d;
    if (record >= 0 && free_record(&r->devices[record]))
        write_record(&r->devices[record], uuid);
    unlock_records();
    return record;
}

int vgpu_region_uuid(int dev, char *out, size_t size)
{
    struct vgpu_region *r = vgpu_region_get();
    dev = vgpu_device_record(dev);
    if (r == NULL || size == 0 || dev < 0 ||
        __atomic_load_n(&r->devices[dev].uuid_state, __ATOMIC_ACQUIRE) != VGPU_UUID_SET)
        return -1;
    strncpy(out, r->devices[dev].uuid, size - 1);
    out[size - 1] = '\0';
    return 0;
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
    uint32_t high = r != NULL ? __atomic_load_n(&r->header.slot_high_water, __ATOMIC_ACQUIRE) : 0;
    for (uint32_t i = 0; i < high && i < VGPU_REGION_MAX_SLOTS && n < max; i++) {
        int32_t pid = __atomic_load_n(&r->slots[i].pid, __ATOMIC_ACQUIRE);
        int32_t host = __atomic_load_n(&r->slots[i].host_pid, __ATOMIC_ACQUIRE);
        /* The host pid once learnt: a container pid may be another tenant's host pid. */
        if (pid != 0)
            pids[n++] = host != 0 ? host : pid;
    }
    if (n == 0 && max > 0)
        pids[n++] = (int32_t)getpid();
    return n;
}

int32_t vgpu_region_host_pid(void)
{
    int slot = __atomic_load_n(&my_slot, __ATOMIC_ACQUIRE);
    return slot >= 0 ? __atomic_load_n(&region->slots[slot].host_pid, __ATOMIC_ACQUIRE) : 0;
}

int vgpu_region_claim_host_pid(int32_t pid)
{
    struct vgpu_region *r = vgpu_region_get();
    int slot = r != NULL && intact(r) ? ensure_slot(r) : -1;
    int32_t none = 0;
    return slot >= 0 && pid != 0 &&
           __atomic_compare_exchange_n(&r->slots[slot].host_pid, &none, pid, 0, __ATOMIC_ACQ_REL,
                                       __ATOMIC_ACQUIRE);
}

void vgpu_region_forget_host_pid(int32_t pid)
{
    int slot = __atomic_load_n(&my_slot, __ATOMIC_ACQUIRE);
    if (region != NULL && slot >= 0 && pid != 0)
        __atomic_compare_exchange_n(&region->slots[slot].host_pid, &pid, 0, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE);
}

int vgpu_region_host_pids_known(void)
{
    struct vgpu_region *r = vgpu_region_get();
    uint32_t high = r != NULL ? __atomic_load_n(&r->header.slot_high_water, __ATOMIC_ACQUIRE) : 0;
    int owners = 0;
    for (uint32_t i = 0; i < high && i < VGPU_REGION_MAX_SLOTS; i++) {
        if (__atomic_load_n(&r->slots[i].pid, __ATOMIC_ACQUIRE) == 0)
            continue;
        if (__atomic_load_n(&r->slots[i].host_pid, __ATOMIC_ACQUIRE) == 0)
            return 0;
        owners++;
    }
    return owners > 0 && __atomic_load_n(&my_slot, __ATOMIC_ACQUIRE) >= 0;
}

int vgpu_region_host_pid_taken(int32_t pid)
{
    struct vgpu_region *r = vgpu_region_get();
    int self = __atomic_load_n(&my_slot, __ATOMIC_ACQUIRE);
    uint32_t high = r != NULL ? __atomic_load_n(&r->header.slot_high_water, __ATOMIC_ACQUIRE) : 0;
    for (uint32_t i = 0; i < high && i < VGPU_REGION_MAX_SLOTS; i++)
        if ((int)i != self && __atomic_load_n(&r->slots[i].pid, __ATOMIC_ACQUIRE) != 0 &&
            __atomic_load_n(&r->slots[i].host_pid, __ATOMIC_ACQUIRE) == pid)
            return 1;
    return 0;
}

uint64_t vgpu_region_context_estimate(int dev)
{
    struct vgpu_region *r = vgpu_region_get();
    dev = vgpu_device_record(dev);
    return r != NULL && dev >= 0 && intact(r) ? load64(&r->devices[dev].context_bytes) : 0;
}

void vgpu_region_note_context(int dev, uint64_t measured, uint64_t all_devices)
{
    struct vgpu_region *r = vgpu_region_get();
    int slot = __atomic_load_n(&my_slot, __ATOMIC_ACQUIRE);
    dev = vgpu_device_record(dev);
    if (r == NULL || !intact(r))
        return;
    if (measured != 0 && dev >= 0)
        store64(&r->devices[dev].context_bytes, measured);
    if (slot >= 0)
        store64(&r->slots[slot].context_bytes, all_devices);
}

int vgpu_region_lock_discovery(int dev, unsigned patience_ms)
{
    dev = vgpu_device_record(dev);
    if (vgpu_region_get() == NULL || dev < 0)
        return -1;
    return vgpu_region_file_lock_byte(file.fd, VGPU_REGION_DISCOVERY_LOCK_OFFSET + (uint64_t)dev,
                                      patience_ms);
}

void vgpu_region_unlock_discovery(int dev)
{
    dev = vgpu_device_record(dev);
    if (dev >= 0)
        vgpu_region_file_unlock_byte(file.fd, VGPU_REGION_DISCOVERY_LOCK_OFFSET + (uint64_t)dev);
}
