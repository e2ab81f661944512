/* ledger.c - the ledger lock and its undo journal.
 *
 * A reservation changes two words: the device's used_bytes and the slot's used_bytes[d]. With
 * no lock, a process killed between the two leaves the device total above the sum of ledgers
 * for as long as any process of the container lives (an issue-11 finding: 14 MiB after 12
 * kill -9 rounds of threads allocating). Here both change under one lock, after the holder has
 * written both old values to its journal; whoever takes the lock from a dead holder writes them
 * back, and so does whoever takes it from a taker that died while writing them back. The lock word names the holder's slot, whose liveness is the slot's open-file-description
 * byte lock (F_OFD_*, which the kernel drops when the process dies or execs, and which no close()
 * of another descriptor to the file drops), and counts acquisitions (so that a
 * takeover compare-and-swap cannot succeed on a word that changed hands since it was read). */
#ifndef _GNU_SOURCE /* the unit test defines it on the command line */
#define _GNU_SOURCE
#endif
#include "ledger.h"

#include <fcntl.h>
#include <sched.h>
#include <time.h>

#include "log.h"
#include "util.h"

enum { HOLDER_BITS = 16, SPINS_BEFORE_YIELD = 128, YIELDS_PER_LIVENESS_CHECK = 32 };
static const uint64_t holder_mask = (UINT64_C(1) << HOLDER_BITS) - 1;

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

static uint64_t monotonic_ms(void) { return monotonic_ns() / 1000000u; }

/* The holder's slot byte is locked by a live process (a thread of ours holds it as l->self). */
static int holder_alive(const struct vgpu_ledger *l, uint32_t holder)
{
    if (holder == l->self)
        return 1;
    /* A descriptor that no longer names the region (a program closed it, perhaps with another
     * file at its number since) cannot tell: there every byte reads as unlocked. */
    if (!names_file(l->fd, l->file_dev, l->file_ino))
        return 1;
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET,
                       .l_start = (off_t)vgpu_region_slot_lock_offset(holder), .l_len = 1,
                       .l_pid = 0};
    if (fcntl(l->fd, F_OFD_GETLK, &fl) != 0)
        return 1; /* cannot tell: keep waiting rather than take a live holder's lock */
    return fl.l_type != F_UNLCK;
}

/* The slot whose change undo() reverted, logged by the unlock that follows (never a write(2)
 * while holding the lock); -1: none. */
static _Thread_local int64_t undone_slot = -1;

/* The change under way when the lock's holder died is undone. Caller now holds the lock, taken
 * from a dead holder. Only the holder changes anything, so an open journal is that change; it
 * may be another slot's than the dead holder's: a taker that died while undoing left the journal
 * it was applying open. Every open journal is applied and closed, so none is left to be applied
 * again later, over changes made since; applying one twice in a row writes the same values. */
static void undo(const struct vgpu_ledger *l)
{
    struct vgpu_region *r = l->r;
    for (uint32_t slot = 0; slot < VGPU_REGION_MAX_SLOTS; slot++) {
        struct vgpu_region_slot *j = &r->slots[slot];
        if (__atomic_load_n(&j->journal_state, __ATOMIC_ACQUIRE) != 1)
            continue;
        uint32_t dev = j->journal_device, target = j->journal_slot;
        if (dev < VGPU_REGION_MAX_DEVICES && target < VGPU_REGION_MAX_SLOTS) {
            store64(&r->devices[dev].used_bytes, j->journal_device_used);
            store64(&r->slots[target].used_bytes[dev], j->journal_ledger);
        }
        __atomic_store_n(&j->journal_state, 0, __ATOMIC_RELEASE);
        undone_slot = slot;
    }
}

static uint64_t taken_by(uint64_t seen, uint32_t self)
{
    return (((seen >> HOLDER_BITS) + 1) << HOLDER_BITS) | (self + 1);
}

int vgpu_ledger_lock(const struct vgpu_ledger *l, unsigned patience_ms)
{
    uint64_t *word = &l->r->header.ledger_lock;
    uint64_t started = patience_ms != 0 ? monotonic_ms() : 0;
    for (unsigned spins = 0;; spins++) {
        uint64_t seen = load64(word);
        uint32_t holder = (uint32_t)(seen & holder_mask);
        if (holder == 0) {
            if (__atomic_compare_exchange_n(word, &seen, taken_by(seen, l->self), 0,
                                            __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
                return 0;
            continue;
        }
        if (spins < SPINS_BEFORE_YIELD) {
            cpu_relax();
            continue;
        }
        if (spins % YIELDS_PER_LIVENESS_CHECK == 0 && !holder_alive(l, holder - 1) &&
            __atomic_compare_exchange_n(word, &seen, taken_by(seen, l->self), 0,
                                        __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            undo(l);
            return 0;
        }
        if (patience_ms != 0 && monotonic_ms() - started >= patience_ms)
            return -1;
        sched_yield();
    }
}

void vgpu_ledger_unlock(const struct vgpu_ledger *l)
{
    uint64_t *word = &l->r->header.ledger_lock;
    uint64_t seen = load64(word);
    /* A compare-and-swap: should the word no longer be ours (the region was truncated and
     * replaced by zeros), it is left alone. */
    if ((seen & holder_mask) == l->self + 1)
        __atomic_compare_exchange_n(word, &seen, seen & ~holder_mask, 0, __ATOMIC_RELEASE,
                                    __ATOMIC_RELAXED);
    if (undone_slot >= 0) {
        vgpu_log(VGPU_LOG_WARN, "the process of slot %u died while changing the memory "
                 "accounting; its change was undone", (unsigned)undone_slot);
        undone_slot = -1;
    }
}

void vgpu_ledger_forget_stale(const struct vgpu_ledger *l)
{
    uint64_t *word = &l->r->header.ledger_lock;
    uint64_t seen = load64(word);
    if ((seen & holder_mask) != l->self + 1)
        return;
    if (__atomic_compare_exchange_n(word, &seen, taken_by(seen, l->self), 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
        undo(l);
        vgpu_ledger_unlock(l);
    }
}

/* Journal, change both words, close the journal. Caller holds the lock. */
static void change(const struct vgpu_ledger *l, uint32_t target, int dev, uint64_t device_used,
                   uint64_t ledger)
{
    struct vgpu_region *r = l->r;
    struct vgpu_region_slot *j = &r->slots[l->self];
    uint64_t *device_word = &r->devices[dev].used_bytes;
    uint64_t *ledger_word = &r->slots[target].used_bytes[dev];
    j->journal_device = (uint16_t)dev;
    j->journal_slot = (uint16_t)target;
    store64(&j->journal_device_used, load64(device_word));
    store64(&j->journal_ledger, load64(ledger_word));
    __atomic_store_n(&j->journal_state, 1, __ATOMIC_RELEASE);
    store64(device_word, device_used);
    store64(ledger_word, ledger);
    __atomic_store_n(&j->journal_state, 0, __ATOMIC_RELEASE);
}

int vgpu_ledger_add(const struct vgpu_ledger *l, uint32_t target, int dev, uint64_t bytes,
                    uint64_t limit)
{
    struct vgpu_region_device *d = &l->r->devices[dev];
    uint64_t used = load64(&d->used_bytes), next = used + bytes;
    if (next < used || (limit != 0 && next > limit))
        return -1;
    change(l, target, dev, next, load64(&l->r->slots[target].used_bytes[dev]) + bytes);
    if (next > load64(&d->peak_bytes))
        store64(&d->peak_bytes, next);
    return 0;
}

static uint64_t minus(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

/* Takes the same amount off both words: what the slot's ledger holds, at most (a release of
 * more than the slot holds must not take another slot's bytes off the device total). */
void vgpu_ledger_sub(const struct vgpu_ledger *l, uint32_t target, int dev, uint64_t bytes)
{
    uint64_t held = load64(&l->r->slots[target].used_bytes[dev]);
    uint64_t taken = bytes < held ? bytes : held;
    change(l, target, dev, minus(load64(&l->r->devices[dev].used_bytes), taken), held - taken);
}

uint64_t vgpu_ledger_drain(const struct vgpu_ledger *l, uint32_t target)
{
    uint64_t total = 0;
    for (int d = 0; d < VGPU_REGION_MAX_DEVICES; d++) {
        uint64_t held = load64(&l->r->slots[target].used_bytes[d]);
        if (held == 0)
            continue;
        change(l, target, d, minus(load64(&l->r->devices[d].used_bytes), held), 0);
        total += held;
    }
    return total;
}
