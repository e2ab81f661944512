/* ledger.c - reservations against the cap with no lock.
 *
 * Layout version 1 kept a device total beside the ledgers and changed both under one lock in
 * the region, with an undo journal for a holder killed between the two words. Every reservation
 * of every process of the container then waited its turn for that lock (on the H200 host's 16
 * cores, 4.3-5.6 us per alloc+free pair at 8 processes and 15 us at 32: hook/README.md,
 * "Overhead"), and a holder that was stopped (SIGSTOP, a debugger) stopped every allocation of
 * the container.
 *
 * Here a process changes only words of its own slot, and a device's usage is the sum of the
 * slots' ledgers. To reserve, it first announces the bytes (its slot's pending word, which
 * also names the device), then reads every
 * slot's announcement and ledger: all these accesses are sequentially consistent, so of two
 * processes reserving at once, at least one sees the other's bytes (announced, or already in
 * its ledger: a passed check adds to the ledger before it withdraws the announcement, and a
 * reader reads a slot's announcement before its ledger, so it never misses both), and the
 * cap cannot be passed by two checks that each saw room. A process killed at any instruction
 * leaves only words of its slot, which whoever reaps the slot zeroes. */
#ifndef _GNU_SOURCE /* the unit test defines it on the command line */
#define _GNU_SOURCE
#endif
#include "ledger.h"

#include <time.h>

#include "util.h"

/* A reservation that only others' announcements keep out waits for them to end: they are
 * taken back or become ledger entries within a few instructions, unless their process is
 * descheduled or stopped (SIGSTOP, a debugger). It waits while the processes in its way make
 * progress (announce again, or withdraw), at most max_wait_ns, and gives up once none has for
 * stall_ns of the time it was itself running. */
static const uint64_t stall_ns = UINT64_C(100000000), max_wait_ns = UINT64_C(1000000000);
/* Between looks: sleeping, not spinning, so that a waiter leaves the CPU (and the container's
 * CPU quota) to the process it waits for; from 10 us, doubled up to 1 ms. */
static const long first_nap_ns = 10000, longest_nap_ns = 1000000;
static const uint64_t overslept_ns = UINT64_C(20000000);

/* After giving up on processes that made no progress, the thread's next reservations within a
 * second do not wait for the same announcements again (an allocation that is refused asks the
 * ledger up to three times: memory.c); a success forgets them. */
static _Thread_local uint64_t stuck_progress, stuck_until_ns;
static _Thread_local uint32_t jitter_state;

static const uint64_t pending_bytes_mask = (UINT64_C(1) << VGPU_PENDING_DEVICE_SHIFT) - 1;

static uint64_t pending_bytes(uint64_t word) { return word & pending_bytes_mask; }

static uint32_t pending_device(uint64_t word)
{
    return (uint32_t)(word >> VGPU_PENDING_DEVICE_SHIFT);
}

/* Whether a slot's announcements may be for device dev. */
static int pending_on(uint64_t word, int dev)
{
    uint32_t device = pending_device(word);
    return device == (uint32_t)dev + 1 || device == VGPU_PENDING_SEVERAL;
}

struct usage {
    uint64_t held;     /* the ledgers' sum: what the container's processes hold */
    uint64_t pending;  /* bytes announced for this device (or for several, this one maybe) */
    uint64_t progress; /* the announcing slots' announcement counts, each with its slot's own
                        * offset: moves when one of them announces again or withdraws, by 1
                        * when only the caller announced once more */
};

static uint64_t plus(uint64_t a, uint64_t b) { return a + b < a ? UINT64_MAX : a + b; }

/* Each slot's announcement is read before its ledger: a check that passes adds to the ledger
 * before it withdraws the announcement, so the reader cannot miss both. */
static struct usage usage_of(const struct vgpu_region *r, int dev)
{
    struct usage u = {0, 0, 0};
    uint32_t high = __atomic_load_n(&r->header.slot_high_water, __ATOMIC_SEQ_CST);
    for (uint32_t i = 0; i < high && i < VGPU_REGION_MAX_SLOTS; i++) {
        const struct vgpu_region_slot *s = &r->slots[i];
        uint64_t announced = __atomic_load_n(&s->pending, __ATOMIC_SEQ_CST);
        if (pending_on(announced, dev)) {
            u.pending = plus(u.pending, pending_bytes(announced));
            uint64_t count = __atomic_load_n(&s->announcements, __ATOMIC_RELAXED);
            u.progress += count + i * UINT64_C(0x9E3779B97F4A7C15);
        }
        u.held = plus(u.held, __atomic_load_n(&s->used_bytes[dev], __ATOMIC_SEQ_CST));
    }
    return u;
}

/* Adds bytes to *word unless it would overflow; 0, or -1. */
static int raise_word(uint64_t *word, uint64_t bytes)
{
    uint64_t seen = __atomic_load_n(word, __ATOMIC_RELAXED);
    do {
        if (bytes > UINT64_MAX - seen)
            return -1;
    } while (!__atomic_compare_exchange_n(word, &seen, seen + bytes, 1, __ATOMIC_SEQ_CST,
                                          __ATOMIC_RELAXED));
    return 0;
}

/* Takes bytes off *word, never below 0. */
static void lower_word(uint64_t *word, uint64_t bytes)
{
    uint64_t seen = __atomic_load_n(word, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(word, &seen, seen > bytes ? seen - bytes : 0, 1,
                                        __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {
    }
}

/* Announces bytes for device dev in the slot (threads of one process may announce at once). */
static void announce(struct vgpu_region_slot *me, int dev, uint64_t bytes)
{
    __atomic_add_fetch(&me->announcements, 1, __ATOMIC_RELAXED);
    uint64_t seen = __atomic_load_n(&me->pending, __ATOMIC_RELAXED), next;
    do {
        uint64_t total = pending_bytes(seen) + bytes; /* both below 2^59: no overflow */
        uint32_t device = pending_bytes(seen) == 0 || pending_device(seen) == (uint32_t)dev + 1
                              ? (uint32_t)dev + 1 : VGPU_PENDING_SEVERAL;
        next = (total > pending_bytes_mask ? pending_bytes_mask : total) |
               (uint64_t)device << VGPU_PENDING_DEVICE_SHIFT;
    } while (!__atomic_compare_exchange_n(&me->pending, &seen, next, 1, __ATOMIC_SEQ_CST,
                                          __ATOMIC_RELAXED));
}

static void withdraw(struct vgpu_region_slot *me, uint64_t bytes)
{
    uint64_t seen = __atomic_load_n(&me->pending, __ATOMIC_RELAXED), next;
    do {
        uint64_t left = pending_bytes(seen) > bytes ? pending_bytes(seen) - bytes : 0;
        next = left == 0 ? 0 : left | (seen & ~pending_bytes_mask);
    } while (!__atomic_compare_exchange_n(&me->pending, &seen, next, 1, __ATOMIC_SEQ_CST,
                                          __ATOMIC_RELAXED));
}

static void raise_peak(struct vgpu_region_device *d, uint64_t used)
{
    uint64_t seen = load64(&d->peak_bytes);
    while (used > seen && !__atomic_compare_exchange_n(&d->peak_bytes, &seen, used, 1,
                                                       __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}

/* Sleeps *nap_ns and a random part of it again (two waiters that keep meeting each other's
 * announcements part), then doubles *nap_ns up to the longest. Returns 1 when it slept far
 * longer than that (the waiter was not running: its container frozen, or out of CPU quota). */
static int nap(long *nap_ns)
{
    uint64_t before = monotonic_ns();
    if (jitter_state == 0)
        jitter_state = (uint32_t)monotonic_ns() | 1;
    jitter_state ^= jitter_state << 13; /* xorshift32 */
    jitter_state ^= jitter_state >> 17;
    jitter_state ^= jitter_state << 5;
    struct timespec ts = {0, *nap_ns + (long)(jitter_state % (uint32_t)*nap_ns)};
    nanosleep(&ts, NULL);
    *nap_ns = *nap_ns * 2 > longest_nap_ns ? longest_nap_ns : *nap_ns * 2;
    return monotonic_ns() - before > overslept_ns;
}

int vgpu_ledger_add(struct vgpu_region *r, uint32_t self, int dev, uint64_t bytes,
                    uint64_t limit)
{
    struct vgpu_region_slot *me = &r->slots[self];
    uint64_t *mine = &me->used_bytes[dev];
    if (limit == 0) { /* no cap to check: nothing to announce */
        if (raise_word(mine, bytes) != 0)
            return -1;
        raise_peak(&r->devices[dev], vgpu_region_device_used(r, dev));
        return 0;
    }
    if (bytes > limit || bytes > pending_bytes_mask || bytes > UINT64_MAX - load64(mine))
        return -1;
    uint64_t started_ns = 0, changed_ns = 0, last_progress = 0;
    long nap_ns = first_nap_ns;
    for (;;) {
        announce(me, dev, bytes);
        struct usage u = usage_of(r, dev); /* ours among the announced */
        if (plus(u.held, u.pending) <= limit) {
            raise_word(mine, bytes); /* cannot overflow: checked above, and ours alone */
            withdraw(me, bytes);
            raise_peak(&r->devices[dev], plus(u.held, bytes));
            stuck_until_ns = 0;
            return 0;
        }
        withdraw(me, bytes);
        if (u.held > limit - bytes)
            return -1; /* what the processes hold leaves no room */
        /* Only reservations under way are in the way: once they end, there may be room. Our
         * own slot's count is in the progress: it moved by one, as it does at every look. */
        uint64_t progress = u.progress, now = monotonic_ns();
        if (started_ns == 0) {
            if (now < stuck_until_ns && progress == stuck_progress + 1)
                return -1;
            started_ns = changed_ns = now;
        } else if (progress != last_progress + 1) {
            changed_ns = now;
        }
        last_progress = progress;
        if (now - changed_ns >= stall_ns || now - started_ns >= max_wait_ns) {
            stuck_progress = progress;
            stuck_until_ns = now + UINT64_C(1000000000);
            return -1;
        }
        if (nap(&nap_ns))
            changed_ns = monotonic_ns();
    }
}

void vgpu_ledger_sub(struct vgpu_region *r, uint32_t self, int dev, uint64_t bytes)
{
    lower_word(&r->slots[self].used_bytes[dev], bytes);
}

uint64_t vgpu_ledger_drain(struct vgpu_region *r, uint32_t target)
{
    struct vgpu_region_slot *s = &r->slots[target];
    uint64_t total = 0;
    for (int d = 0; d < VGPU_REGION_MAX_DEVICES; d++)
        total = plus(total, __atomic_exchange_n(&s->used_bytes[d], 0, __ATOMIC_SEQ_CST));
    __atomic_store_n(&s->pending, 0, __ATOMIC_SEQ_CST);
    return total;
}
