/* test_ledger.c - the ledger (src/ledger.c) on a region in a temporary file: exact add / sub /
 * drain, refusals that change nothing, the usage summed over every slot, another slot's
 * announced reservation waited for while it changes and a bounded time once it does not (not
 * at all when it is for another device), and threads playing processes of the container (and
 * threads of one) that race for the last room: the cap holds at every instant and all comes
 * back. */
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "ledger.h"

static const uint64_t MiB = UINT64_C(1) << 20;
static struct vgpu_region *r;

static uint64_t device_used(int d) { return vgpu_region_device_used(r, d); }

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void exact(void)
{
    check(vgpu_ledger_add(r, 3, 0, 600 * MiB, 1024 * MiB) == 0 && device_used(0) == 600 * MiB &&
          r->slots[3].used_bytes[0] == 600 * MiB && r->devices[0].peak_bytes == 600 * MiB &&
          r->slots[3].pending == 0, "add: the ledger and the peak move, nothing left "
          "announced");
    check(vgpu_ledger_add(r, 3, 0, 600 * MiB, 1024 * MiB) == -1 && device_used(0) == 600 * MiB &&
          r->slots[3].pending == 0, "over the limit: refused, nothing changed");
    check(vgpu_ledger_add(r, 3, 0, 2048 * MiB, 1024 * MiB) == -1 && device_used(0) == 600 * MiB,
          "more than the limit itself: refused");
    check(vgpu_ledger_add(r, 3, 0, UINT64_MAX, 0) == -1 && device_used(0) == 600 * MiB,
          "an overflow is refused even without a limit");
    check(vgpu_ledger_add(r, 3, 1, 5 * MiB, 0) == 0 && device_used(1) == 5 * MiB &&
          device_used(0) == 600 * MiB, "no limit: added, on its own device only");
    vgpu_ledger_sub(r, 3, 0, 100 * MiB);
    check(device_used(0) == 500 * MiB && r->devices[0].peak_bytes == 600 * MiB,
          "sub: down, the peak kept");
    vgpu_ledger_sub(r, 3, 1, 50 * MiB);
    check(device_used(1) == 0, "a release of more than the ledger holds stops at 0");
    r->slots[3].used_bytes[2] = 7;
    r->slots[3].pending = 9;
    check(vgpu_ledger_drain(r, 3) == 500 * MiB + 7 && device_used(0) == 0 && device_used(2) == 0 &&
          r->slots[3].pending == 0, "drain: the whole ledger back, the announcement gone");
}

/* The usage is every claimed slot's ledger: another slot's memory leaves no room. */
static void other_slots(void)
{
    check(vgpu_ledger_add(r, 7, 0, 700 * MiB, 1024 * MiB) == 0 &&
          vgpu_ledger_add(r, 8, 0, 300 * MiB, 1024 * MiB) == 0, "slots 7 and 8 hold 700 and "
          "300 MiB of a 1 GiB cap");
    double t0 = now_s();
    check(vgpu_ledger_add(r, 3, 0, 100 * MiB, 1024 * MiB) == -1 && now_s() - t0 < 0.05,
          "slot 3's 100 MiB is refused at once (%.3f s)", now_s() - t0);
    check(vgpu_ledger_add(r, 3, 0, 24 * MiB, 1024 * MiB) == 0 && device_used(0) == 1024 * MiB &&
          r->devices[0].peak_bytes == 1024 * MiB, "24 MiB fit exactly; the peak is the sum");
    vgpu_ledger_drain(r, 3);
    vgpu_ledger_drain(r, 7);
    vgpu_ledger_drain(r, 8);
}

/* A reservation under way, as a process announces it in its slot before it checks the cap. */
static uint64_t announcement(uint64_t bytes, int dev)
{
    return bytes | (uint64_t)(dev + 1) << VGPU_PENDING_DEVICE_SHIFT;
}

/* Slot `slot`'s process announces a reservation (and counts it, as ledger.c does). */
static void announce_as(uint32_t slot, uint64_t word)
{
    __atomic_add_fetch(&r->slots[slot].announcements, 1, __ATOMIC_SEQ_CST);
    __atomic_store_n(&r->slots[slot].pending, word, __ATOMIC_SEQ_CST);
}

/* Slot 9's process, busy: announces 800 MiB on device 0 again every 10 ms, 30 times (each a
 * new reservation of the same size), then withdraws. */
static void *busy_slot_9(void *arg)
{
    (void)arg;
    struct timespec tick = {0, 10 * 1000 * 1000};
    for (int i = 0; i < 30; i++) {
        announce_as(9, announcement(800 * MiB, 0));
        nanosleep(&tick, NULL);
    }
    __atomic_store_n(&r->slots[9].pending, 0, __ATOMIC_SEQ_CST);
    return NULL;
}

static double timed_add(uint32_t slot, uint64_t bytes, int *rc)
{
    double t0 = now_s();
    *rc = vgpu_ledger_add(r, slot, 0, bytes, 1024 * MiB);
    return now_s() - t0;
}

/* Another process's reservation under way (announced, as one stopped between its announcement
 * and its check would leave it) may be withdrawn: a reservation it alone keeps out waits for it
 * while it changes, and gives up once it has not changed for 100 ms; one that the ledgers
 * themselves keep out is refused at once, and so is one that an announcement for another
 * device would have kept out. */
static void announced(void)
{
    int rc;
    vgpu_ledger_add(r, 7, 0, 200 * MiB, 0);
    announce_as(5, announcement(800 * MiB, 1));
    double took = timed_add(3, 500 * MiB, &rc);
    check(rc == 0 && took < 0.05, "800 MiB announced by slot 5 for device 1: slot 3's 500 MiB "
          "on device 0 come at once (%.3f s)", took);
    vgpu_ledger_sub(r, 3, 0, 500 * MiB);
    announce_as(5, announcement(800 * MiB, 0)); /* and stopped there */
    took = timed_add(3, 500 * MiB, &rc);
    check(rc == -1 && took >= 0.1 && took < 0.5 && device_used(0) == 200 * MiB &&
          r->slots[3].pending == 0, "for device 0: slot 3's 500 MiB waits for it, then is "
          "refused (%.3f s), nothing left announced", took);
    took = timed_add(3, 500 * MiB, &rc);
    check(rc == -1 && took < 0.05, "asked again, with the same announcement in the way: refused "
          "at once (%.3f s)", took);
    took = timed_add(3, 900 * MiB, &rc);
    check(rc == -1 && took < 0.05, "900 MiB, which the 200 MiB held leave no room for: refused "
          "at once (%.3f s)", took);
    announce_as(5, (800 * MiB) | (uint64_t)VGPU_PENDING_SEVERAL << VGPU_PENDING_DEVICE_SHIFT);
    took = timed_add(4, 500 * MiB, &rc);
    check(rc == -1 && took >= 0.1, "announced for several devices, it is in device 0's way too "
          "(%.3f s)", took);
    r->slots[5].pending = 0;
    announce_as(9, announcement(800 * MiB, 0));
    pthread_t t;
    pthread_create(&t, NULL, busy_slot_9, NULL);
    took = timed_add(6, 500 * MiB, &rc);
    pthread_join(t, NULL);
    check(rc == 0 && took >= 0.25 && device_used(0) == 700 * MiB, "slot 9 announcing 800 MiB "
          "again every 10 ms for 0.3 s (the size given up on above, but a process making "
          "progress), then withdrawing: slot 6 waits for it and gets its 500 MiB (%.3f s)", took);
    vgpu_ledger_drain(r, 6);
    vgpu_ledger_drain(r, 7);
}

enum { RACERS = 8, RACE_ADDS = 200000 };
static const uint64_t race_limit = 64 * MiB;

struct race {
    int64_t granted;     /* what the racers were given, counted after the add, off before the sub */
    int64_t most;        /* the most granted at any instant */
    uint64_t refused;
};

static struct race race;

static void grant(int64_t bytes)
{
    int64_t now = __atomic_add_fetch(&race.granted, bytes, __ATOMIC_SEQ_CST);
    int64_t most = __atomic_load_n(&race.most, __ATOMIC_RELAXED);
    while (now > most && !__atomic_compare_exchange_n(&race.most, &most, now, 1, __ATOMIC_RELAXED,
                                                      __ATOMIC_RELAXED)) {
    }
}

/* Holds up to 4 reservations at once, taking one back or asking for another at random. */
static void *racer(void *arg)
{
    uint32_t slot = (uint32_t)(uintptr_t)arg;
    unsigned seed = slot * 7919u + 1;
    uint64_t held[4] = {0};
    for (int i = 0; i < RACE_ADDS; i++) {
        int k = rand_r(&seed) % 4;
        if (held[k] != 0) {
            __atomic_sub_fetch(&race.granted, (int64_t)held[k], __ATOMIC_SEQ_CST);
            vgpu_ledger_sub(r, slot, 0, held[k]);
            held[k] = 0;
            continue;
        }
        uint64_t bytes = (1 + (uint64_t)(rand_r(&seed) % 24)) * MiB;
        if (vgpu_ledger_add(r, slot, 0, bytes, race_limit) != 0) {
            __atomic_add_fetch(&race.refused, 1, __ATOMIC_RELAXED);
            continue;
        }
        grant((int64_t)bytes);
        held[k] = bytes;
    }
    for (int k = 0; k < 4; k++)
        if (held[k] != 0) {
            __atomic_sub_fetch(&race.granted, (int64_t)held[k], __ATOMIC_SEQ_CST);
            vgpu_ledger_sub(r, slot, 0, held[k]);
        }
    return NULL;
}

/* 8 threads add and take back 1-24 MiB under a 64 MiB cap, in `slots` slots (8: each a process
 * of the container, as far as the ledger can tell; 2: threads of two processes, sharing their
 * slots' words): at no instant were more than 64 MiB given out. */
static void racing(uint32_t slots)
{
    race = (struct race){0, 0, 0};
    pthread_t t[RACERS];
    for (uint32_t i = 0; i < RACERS; i++)
        pthread_create(&t[i], NULL, racer, (void *)(uintptr_t)(10 + i % slots));
    for (int i = 0; i < RACERS; i++)
        pthread_join(t[i], NULL);
    uint64_t pending = 0;
    for (int i = 0; i < VGPU_REGION_MAX_SLOTS; i++)
        pending += r->slots[i].pending;
    check(race.most <= (int64_t)race_limit && race.refused > 0,
          "%d threads in %u slots x %d adds under a 64 MiB cap: at most %lld MiB given out at "
          "once, %llu refused", RACERS, slots, RACE_ADDS, (long long)(race.most / (int64_t)MiB),
          (unsigned long long)race.refused);
    check(device_used(0) == 0 && pending == 0, "all of it came back, nothing left announced");
}

int main(void)
{
    char path[] = "/tmp/vgpu-ledger-XXXXXX";
    int fd = mkstemp(path);
    unlink(path);
    if (fd < 0 || ftruncate(fd, VGPU_REGION_FILE_SIZE) != 0)
        return 1;
    r = mmap(NULL, VGPU_REGION_FILE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (r == MAP_FAILED)
        return 1;
    r->header.slot_high_water = 32;
    exact();
    other_slots();
    announced();
    racing(8);
    racing(2);
    return check_done("test_ledger");
}
