/* test_ledger.c - the ledger lock and its undo journal (src/ledger.c) on a region in a temporary
 * file: exact add / sub / drain, refusals that change nothing, a dead holder taken over with its
 * half-done change undone, a live holder waited for (and given up on, with patience), the
 * caller's own slot never taken over, nor a live holder through a descriptor that no longer
 * names the region, a stale lock word on a newly claimed slot, and an unlock that leaves a word
 * no longer ours alone. */
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "check.h"
#include "ledger.h"

static const uint64_t MiB = UINT64_C(1) << 20;
static struct vgpu_region *r;
static int fd;

/* The ledger of slot self, as a process of it holds it: fd and the file's identity. */
static struct vgpu_ledger ledger(uint32_t self)
{
    struct stat st;
    fstat(fd, &st);
    return (struct vgpu_ledger){.r = r, .fd = fd, .self = self, .file_dev = (uint64_t)st.st_dev,
                                .file_ino = (uint64_t)st.st_ino};
}

static uint64_t device_used(void) { return r->devices[0].used_bytes; }
static uint64_t holder(void) { return r->header.ledger_lock & 0xffff; }

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The lock word as a process of slot `slot` leaves it when it takes the lock. */
static void forge_holder(uint32_t slot)
{
    r->header.ledger_lock = ((r->header.ledger_lock >> 16) + 1) << 16 | (slot + 1);
}

/* Slot `slot` half-way through adding `bytes` to its ledger: journal written, device word
 * changed, ledger word not yet. */
static void forge_half_change(uint32_t slot, uint64_t bytes)
{
    struct vgpu_region_slot *j = &r->slots[slot];
    j->journal_device = 0;
    j->journal_slot = (uint16_t)slot;
    j->journal_device_used = device_used();
    j->journal_ledger = j->used_bytes[0];
    j->journal_state = 1;
    r->devices[0].used_bytes += bytes;
}

static void exact(struct vgpu_ledger *me)
{
    check(vgpu_ledger_lock(me, 0) == 0 && holder() == 4 && r->header.ledger_lock >> 16 == 1,
          "the lock word names slot 3 (+1) and counts the acquisition");
    check(vgpu_ledger_add(me, 3, 0, 600 * MiB, 1024 * MiB) == 0 && device_used() == 600 * MiB &&
          r->slots[3].used_bytes[0] == 600 * MiB && r->devices[0].peak_bytes == 600 * MiB,
          "add: device, ledger and peak move together");
    check(vgpu_ledger_add(me, 3, 0, 600 * MiB, 1024 * MiB) == -1 && device_used() == 600 * MiB &&
          r->slots[3].used_bytes[0] == 600 * MiB, "over the limit: refused, nothing changed");
    check(vgpu_ledger_add(me, 3, 0, UINT64_MAX, 0) == -1 && device_used() == 600 * MiB,
          "an overflow is refused even without a limit");
    vgpu_ledger_sub(me, 3, 0, 100 * MiB);
    check(device_used() == 500 * MiB && r->slots[3].used_bytes[0] == 500 * MiB &&
          r->devices[0].peak_bytes == 600 * MiB, "sub: both words down, the peak kept");
    r->slots[3].used_bytes[1] = 7;
    r->devices[1].used_bytes = 3; /* a device total below the ledger: drained to 0, not wrapped */
    check(vgpu_ledger_drain(me, 3) == 500 * MiB + 7 && device_used() == 0 &&
          r->devices[1].used_bytes == 0 && r->slots[3].used_bytes[0] == 0 &&
          r->slots[3].used_bytes[1] == 0, "drain: the whole ledger back, never below 0");
    vgpu_ledger_sub(me, 3, 0, MiB);
    check(device_used() == 0 && r->slots[3].used_bytes[0] == 0 && r->slots[3].journal_state == 0,
          "sub below 0 stops at 0; the journal is closed after every change");
    vgpu_ledger_unlock(me);
    check(holder() == 0 && r->header.ledger_lock >> 16 == 1, "unlock: free, the count kept");
}

static void dead_holder(struct vgpu_ledger *me)
{
    vgpu_ledger_lock(me, 0);
    vgpu_ledger_add(me, 3, 0, 200 * MiB, 0);
    vgpu_ledger_unlock(me);
    forge_holder(7); /* slot 7's byte is locked by nobody: its process is dead */
    forge_half_change(7, 300 * MiB);
    capture_begin();
    int rc = vgpu_ledger_lock(me, 0);
    char held[512];
    snprintf(held, sizeof held, "%s", capture_end());
    check(rc == 0 && holder() == 4, "a dead holder's lock is taken over");
    check(device_used() == 200 * MiB && r->slots[7].used_bytes[0] == 0 &&
          r->slots[7].journal_state == 0, "its half-done change is undone (device %llu MiB)",
          (unsigned long long)(device_used() / MiB));
    check(held[0] == '\0', "nothing is written to the log while the lock is held: %s", held);
    vgpu_ledger_drain(me, 3);
    capture_begin();
    vgpu_ledger_unlock(me);
    const char *log = capture_end();
    check(strstr(log, "slot 7 died while changing the memory accounting") != NULL,
          "and logged once the lock is released: %s", log);
    forge_holder(5000); /* a damaged word names no slot: taken over, nothing to undo */
    check(vgpu_ledger_lock(me, 0) == 0 && holder() == 4, "a word naming no slot is taken over");
    vgpu_ledger_unlock(me);
}

/* A taker that died while undoing: slot 7 died half-way through adding 300 MiB; slot 9 took the
 * lock over, wrote the device total back and died before the ledger word and the journal. */
static void dead_taker(struct vgpu_ledger *me)
{
    vgpu_ledger_lock(me, 0);
    vgpu_ledger_add(me, 3, 0, 200 * MiB, 0);
    vgpu_ledger_unlock(me);
    forge_half_change(7, 300 * MiB);
    r->slots[7].used_bytes[0] += 300 * MiB; /* 7 also changed its ledger word */
    forge_holder(9);
    r->devices[0].used_bytes = r->slots[7].journal_device_used; /* 9's undo, half done */
    capture_begin();
    int rc = vgpu_ledger_lock(me, 0);
    check(rc == 0 && holder() == 4 && device_used() == 200 * MiB &&
              r->slots[7].used_bytes[0] == 0 && r->slots[7].journal_state == 0,
          "a taker that died while undoing: the next taker finishes the undo and closes slot 7's "
          "journal (device %llu MiB, slot 7 %llu MiB)", (unsigned long long)(device_used() / MiB),
          (unsigned long long)(r->slots[7].used_bytes[0] / MiB));
    vgpu_ledger_unlock(me);
    const char *log = capture_end();
    check(strstr(log, "slot 7 died while changing") != NULL, "logged as slot 7's change: %s", log);

    /* Later changes, then slot 7's next owner dies holding the lock before its first change:
     * a journal left open would now write 0 MiB over the 200 + 50 MiB counted. */
    vgpu_ledger_lock(me, 0);
    vgpu_ledger_add(me, 3, 0, 50 * MiB, 0);
    vgpu_ledger_unlock(me);
    forge_holder(7);
    capture_begin();
    vgpu_ledger_lock(me, 0);
    capture_end();
    check(device_used() == 250 * MiB && r->slots[3].used_bytes[0] == 250 * MiB,
          "a later takeover from slot 7 changes nothing: %llu MiB counted",
          (unsigned long long)(device_used() / MiB));
    vgpu_ledger_drain(me, 3);
    vgpu_ledger_unlock(me);
}

static void live_holder(struct vgpu_ledger *me)
{
    int ready[2];
    if (!check(pipe(ready) == 0, "live holder: pipe"))
        return;
    pid_t child = fork();
    if (!check(child >= 0, "live holder: fork"))
        return;
    if (child == 0) { /* holds slot 5's byte, and the ledger lock in slot 5's name */
        struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET,
                           .l_start = (off_t)vgpu_region_slot_lock_offset(5), .l_len = 1};
        char ok = fcntl(fd, F_SETLK, &fl) == 0 ? 'y' : 'n';
        forge_holder(5);
        if (write(ready[1], &ok, 1) != 1)
            _exit(1);
        pause();
        _exit(0);
    }
    char ok = 0;
    check(read(ready[0], &ok, 1) == 1 && ok == 'y', "a live process holds the lock");
    double start = now_s();
    int rc = vgpu_ledger_lock(me, 100);
    double waited = now_s() - start;
    check(rc == -1 && waited >= 0.09 && waited < 2.0 && holder() == 6,
          "it is waited for, given up on after the patience (%.3f s), its lock left alone", waited);
    /* A process whose descriptor now names another file (where every byte reads as unlocked)
     * must not take it for dead. */
    struct vgpu_ledger blind = *me;
    char other[] = "/tmp/vgpu-ledger-other-XXXXXX";
    blind.fd = mkstemp(other);
    unlink(other);
    rc = vgpu_ledger_lock(&blind, 100);
    check(blind.fd >= 0 && rc == -1 && holder() == 6, "nor is it taken over through a descriptor "
          "that no longer names the region file");
    if (rc == 0) { /* taken: given back to the live holder, so that the rest can go on */
        vgpu_ledger_unlock(&blind);
        forge_holder(5);
    }
    close(blind.fd);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    check(vgpu_ledger_lock(me, 0) == 0 && holder() == 4, "once it is killed, it is taken over");
    vgpu_ledger_unlock(me);

    forge_holder(3); /* another thread of this process (same slot) */
    start = now_s();
    rc = vgpu_ledger_lock(me, 50);
    check(rc == -1 && holder() == 4, "a holder of the caller's own slot (its own thread) is never "
          "taken over, although F_GETLK cannot see the caller's own locks");
    r->header.ledger_lock &= ~UINT64_C(0xffff);
}

/* A release of more than the slot's ledger holds takes only what the slot holds off the device
 * total: the rest is other slots' memory. */
static void release_more_than_held(void)
{
    struct vgpu_ledger other = ledger(7);
    r->header.ledger_lock = 0;
    check(vgpu_ledger_lock(&other, 0) == 0 && vgpu_ledger_add(&other, 7, 0, 10 * MiB, 0) == 0 &&
          vgpu_ledger_add(&other, 8, 0, 90 * MiB, 0) == 0, "slots 7 and 8 hold 10 and 90 MiB");
    uint64_t before = device_used();
    vgpu_ledger_sub(&other, 7, 0, 50 * MiB);
    check(device_used() == before - 10 * MiB && r->slots[7].used_bytes[0] == 0,
          "releasing 50 MiB from slot 7 (10 held) takes 10 MiB off the device total (%llu MiB "
          "left of %llu)", (unsigned long long)(device_used() / MiB),
          (unsigned long long)(before / MiB));
    vgpu_ledger_drain(&other, 8);
    vgpu_ledger_unlock(&other);
}

static void stale_word(void)
{
    struct vgpu_ledger fresh = ledger(10);
    forge_holder(10); /* slot 10's previous owner died holding the lock, mid-change */
    forge_half_change(10, 64 * MiB);
    capture_begin();
    vgpu_ledger_forget_stale(&fresh);
    capture_end();
    check(holder() == 0 && device_used() == 0 && r->slots[10].journal_state == 0,
          "a new owner of slot 10 clears the stale lock in its name and undoes the change");
    forge_holder(11);
    vgpu_ledger_forget_stale(&fresh);
    check(holder() == 12, "a lock in another slot's name is left alone");
    r->header.ledger_lock = 0; /* a truncated region reads as zeros */
    vgpu_ledger_unlock(&fresh);
    check(r->header.ledger_lock == 0, "unlock leaves a word that is no longer ours alone");
}

int main(void)
{
    char path[] = "/tmp/vgpu-ledger-XXXXXX";
    fd = mkstemp(path);
    unlink(path);
    if (fd < 0 || ftruncate(fd, VGPU_REGION_FILE_SIZE) != 0)
        return 1;
    r = mmap(NULL, VGPU_REGION_FILE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (r == MAP_FAILED)
        return 1;
    struct vgpu_ledger me = ledger(3);
    exact(&me);
    dead_holder(&me);
    dead_taker(&me);
    live_holder(&me);
    release_more_than_held();
    stale_word();
    return check_done("test_ledger");
}
