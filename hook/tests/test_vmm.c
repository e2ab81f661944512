/* test_vmm.c - what keeps a cuMemCreate allocation alive (src/vmm.c), as unit tests: a handle
 * released while mapped is freed by its last unmap, a retained one by its last release, one
 * cuMemUnmap over adjacent mappings takes them all and stops at a gap, tables of thousands of
 * mappings, running out of host memory at each allocation (nothing recorded, the answer says
 * so), and a fork child that starts with nothing (malloc and calloc are wrapped: --wrap). */
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "vmm.h"

void *__real_malloc(size_t size);
void *__real_calloc(size_t n, size_t size);
void *__wrap_malloc(size_t size);
void *__wrap_calloc(size_t n, size_t size);
static int fail_in;      /* the fail_in-th allocation from now fails; 0: none does */
static int calloc_fails; /* every calloc fails (the tables' bucket arrays) */

static int fails(void) { return fail_in > 0 && --fail_in == 0; }

void *__wrap_malloc(size_t size) { return fails() ? NULL : __real_malloc(size); }

void *__wrap_calloc(size_t n, size_t size)
{
    return calloc_fails || fails() ? NULL : __real_calloc(n, size);
}

static const uint64_t MiB = UINT64_C(1) << 20;

static int same_tile(const uint64_t *bound, const uint64_t *tile)
{
    return memcmp(bound, tile, VGPU_VMM_TILE * sizeof *tile) == 0;
}

static void lifetimes(void)
{
    check(vgpu_vmm_released(0x10) == 1, "a handle never mapped nor retained: its release frees it");
    check(vgpu_vmm_mapped(0x1000 * MiB, 2 * MiB, 0x20) == 0 && vgpu_vmm_released(0x20) == 0,
          "released while mapped: not freed");
    uint64_t freed[4] = {0};
    size_t n = vgpu_vmm_unmapped(0x1000 * MiB, 2 * MiB, freed, 4);
    check(n == 1 && freed[0] == 0x20, "its unmap frees it (%zu freed)", n);
    check(vgpu_vmm_released(0x20) == 1, "and its record is gone (a new handle of that value "
          "starts afresh)");

    check(vgpu_vmm_retained(0x30) == 0 && vgpu_vmm_released(0x30) == 0 &&
              vgpu_vmm_released(0x30) == 1,
          "retained once: the second release frees it");
    check(vgpu_vmm_mapped(0x2000 * MiB, 2 * MiB, 0x40) == 0 &&
              vgpu_vmm_unmapped(0x2000 * MiB, 2 * MiB, freed, 4) == 0 &&
              vgpu_vmm_released(0x40) == 1,
          "unmapped while referenced: freed at the release");

    uint64_t over[4] = {0};
    int two = vgpu_vmm_mapped(0x3000 * MiB, 2 * MiB, 0x48) == 0 &&
              vgpu_vmm_mapped(0x3002 * MiB, 2 * MiB, 0x50) == 0;
    size_t across = vgpu_vmm_handles_over(0x3001 * MiB, 2 * MiB, over, 4);
    int both = across == 2 && ((over[0] == 0x48 && over[1] == 0x50) ||
                               (over[0] == 0x50 && over[1] == 0x48));
    check(two && both && vgpu_vmm_handles_over(0x3001 * MiB, MiB / 2, over, 4) == 1 &&
              over[0] == 0x48 && vgpu_vmm_handles_over(0x3004 * MiB, MiB, over, 4) == 0 &&
              vgpu_vmm_handles_over(0x3000 * MiB, 4 * MiB, over, 1) == 2,
          "the handles over a range starting inside a mapping: both of two it crosses, the one "
          "it lies in, none past them, and the count where fewer fit (%zu)", across);
    vgpu_vmm_unmapped(0x3000 * MiB, 4 * MiB, freed, 4);

    /* Bindings: a multicast object's (holder 0x900) on devices 0 and 1, an array's tile (its
     * words compared whole here). */
    const struct vgpu_vmm_binding on0 = {.holder = 0x900, .handle = 0x60, .dev = 0},
                                  on1 = {.holder = 0x900, .handle = 0x68, .dev = 1},
                                  tile = {.holder = 0xa00, .handle = 0x70, .tile = {7}, .dev = -1};
    const uint64_t seventh[VGPU_VMM_TILE] = {7}, eighth[VGPU_VMM_TILE] = {8};
    uint64_t ids[4] = {0}, got[4] = {0};
    uint64_t id0 = vgpu_vmm_bound(&on0), id1 = vgpu_vmm_bound(&on1), idt = vgpu_vmm_bound(&tile);
    const struct vgpu_vmm_select mc_dev1 = {0x900, 0, 1, 1, NULL, NULL}, mc_any = {0x900, 0, 1, -1, NULL, NULL},
                                 mc_past = {0x900, 1, 8, -1, NULL, NULL};
    check(id0 != 0 && id1 != 0 && idt != 0 && vgpu_vmm_bound_ids(&mc_any, ids, got, 4) == 0,
          "bindings pending the driver's answer: none chosen for an unbind");
    vgpu_vmm_bind_answered(id0, 1);
    vgpu_vmm_bind_answered(id1, 1);
    int held = vgpu_vmm_released(0x60) == 0 && vgpu_vmm_released(0x68) == 0 &&
               vgpu_vmm_released(0x70) == 0;
    check(held && vgpu_vmm_bound_ids(&mc_dev1, ids, got, 4) == 1 && got[0] == 0x68 &&
              ids[0] == id1 && vgpu_vmm_bound_ids(&mc_any, ids, got, 4) == 2 &&
              vgpu_vmm_bound_ids(&mc_past, ids, got, 4) == 0,
          "made and released: held; the bindings at an offset on one device, on any, none past");
    size_t n1 = vgpu_vmm_unbound(&id1, 1, freed, 4);
    check(n1 == 1 && freed[0] == 0x68 && vgpu_vmm_bound_ids(&mc_any, ids, got, 4) == 1,
          "device 1's unbound: its memory freed (%zu), device 0's still bound", n1);
    check(vgpu_vmm_bind_answered(idt, 0) == 1 && vgpu_vmm_bind_answered(idt, 0) == 0,
          "a refused bind forgotten: the memory it alone held freed, once");
    check(vgpu_vmm_unbound(&id0, 1, freed, 4) == 1 && freed[0] == 0x60 &&
              vgpu_vmm_unbound(&id0, 1, freed, 4) == 0,
          "the other undone: freed; undone again, nothing");
    idt = vgpu_vmm_bound(&tile);
    vgpu_vmm_bind_answered(idt, 1);
    check(vgpu_vmm_bound_ids(&(struct vgpu_vmm_select){0xa00, 0, 1, -1, seventh, same_tile}, ids, got, 4) ==
                  1 &&
              vgpu_vmm_bound_ids(&(struct vgpu_vmm_select){0xa00, 0, 1, -1, eighth, same_tile}, ids, got,
                                 4) == 0,
          "a tile chosen only by its own words");
    uint64_t pending = vgpu_vmm_bound(&tile);
    vgpu_vmm_created(0x70);
    check(vgpu_vmm_bound_ids(&(struct vgpu_vmm_select){0xa00, 0, 1, -1, NULL, NULL}, ids, got, 4) == 0 &&
              vgpu_vmm_released(0x70) == 0 && vgpu_vmm_bind_answered(pending, 0) == 1,
          "a handle made anew: the old memory's binding gone, the pending one holds the new "
          "memory until the driver refuses it");

    int kept = vgpu_vmm_mapped(0x3800 * MiB, 2 * MiB, 0x58) == 0 &&
               vgpu_vmm_exported(0x58) == 0 && vgpu_vmm_retained(0x58) == 0;
    for (int i = 0; i < 4; i++)
        kept &= vgpu_vmm_released(0x58) == 0;
    check(kept && vgpu_vmm_unmapped(0x3800 * MiB, 2 * MiB, freed, 4) == 0,
          "exported: no number of releases nor its unmap frees it (imports hold it unseen)");
    vgpu_vmm_created(0x58);
    check(vgpu_vmm_released(0x58) == 1, "a new allocation the driver gives that value starts "
          "afresh: its release frees it (the export's mark stuck to the value before)");
}

static void ranges(void)
{
    uint64_t base = 0x3000 * MiB, handles[8] = {0}, freed[8] = {0};
    int mapped = vgpu_vmm_mapped(base, 2 * MiB, 0x50) == 0 &&
                 vgpu_vmm_mapped(base + 2 * MiB, 4 * MiB, 0x60) == 0 &&
                 vgpu_vmm_mapped(base + 8 * MiB, 2 * MiB, 0x70) == 0; /* after a gap */
    size_t n = vgpu_vmm_handles_in(base, 10 * MiB, handles, 8);
    check(mapped && n == 2 && handles[0] == 0x50 && handles[1] == 0x60,
          "the handles of a range: adjacent mappings, up to the first gap (%zu)", n);
    check(vgpu_vmm_handles_in(base, 10 * MiB, handles, 1) == 2,
          "how many there are, whatever room the caller gave");
    check(vgpu_vmm_handles_in(base + MiB, 2 * MiB, handles, 8) == 0,
          "none from an address inside a mapping");
    vgpu_vmm_released(0x50);
    vgpu_vmm_released(0x60);
    n = vgpu_vmm_unmapped(base, 6 * MiB, freed, 8);
    check(n == 2 && freed[0] == 0x50 && freed[1] == 0x60, "one unmap of both frees both (%zu)",
          n);
    check(vgpu_vmm_handles_in(base + 8 * MiB, 2 * MiB, handles, 8) == 1 &&
              vgpu_vmm_released(0x70) == 0,
          "the mapping past the gap is still there");
    check(vgpu_vmm_unmapped(base + 8 * MiB, UINT64_MAX, freed, 0) == 0,
          "an unmap with no room to name what it freed does not overrun (and wraps no address)");

    enum { MANY = 5000 };
    uint64_t many = 0x100000 * MiB;
    int all = 1;
    for (uint64_t i = 0; i < MANY; i++)
        all &= vgpu_vmm_mapped(many + i * 2 * MiB, 2 * MiB, 0x1000 + i) == 0 &&
               vgpu_vmm_released(0x1000 + i) == 0;
    size_t total = 0;
    for (uint64_t i = 0; i < MANY; i += 1000)
        total += vgpu_vmm_unmapped(many + i * 2 * MiB, 1000 * 2 * MiB, NULL, 0) == 0 ? 1000 : 0;
    check(all && total == MANY && vgpu_vmm_handles_in(many, MANY * 2 * MiB, NULL, 0) == 0,
          "%d mappings recorded and unmapped a thousand at a time", MANY);
}

static void out_of_memory(void)
{
    fail_in = 1; /* the handle's record */
    check(vgpu_vmm_mapped(0x4000 * MiB, 2 * MiB, 0x80) == -1 &&
              vgpu_vmm_handles_in(0x4000 * MiB, 2 * MiB, NULL, 0) == 0 &&
              vgpu_vmm_released(0x80) == 1,
          "no memory for a handle's record: the mapping is refused, nothing recorded");
    fail_in = 2; /* the mapping's node, after the handle's */
    check(vgpu_vmm_mapped(0x4000 * MiB, 2 * MiB, 0x90) == -1 &&
              vgpu_vmm_handles_in(0x4000 * MiB, 2 * MiB, NULL, 0) == 0 &&
              vgpu_vmm_released(0x90) == 1,
          "no memory for the mapping's: refused, and the handle's record dropped again");
    fail_in = 1;
    check(vgpu_vmm_retained(0xa0) == -1 && vgpu_vmm_released(0xa0) == 1,
          "no memory to record a reference: refused, nothing recorded");
    fail_in = 1;
    check(vgpu_vmm_exported(0xb0) == -1 && vgpu_vmm_released(0xb0) == 1,
          "no memory to record an export: refused, nothing recorded");
    /* Growing the buckets (every 64 nodes from 64 on) may fail: the chains grow longer. */
    int all = 1;
    calloc_fails = 1;
    for (uint64_t i = 0; i < 200; i++)
        all &= vgpu_vmm_mapped(0x200000 * MiB + i * 2 * MiB, 2 * MiB, 0x5000 + i) == 0;
    calloc_fails = 0;
    check(all && vgpu_vmm_handles_in(0x200000 * MiB, 400 * MiB, NULL, 0) == 200,
          "no memory to grow the buckets: recorded all the same (200 mappings)");
}

/* cuMemRelease and cuMemUnmap run under the lock with the bookkeeping after them (the
 * handle's value may be handed out again the moment the driver frees it). */
static void held(void)
{
    vgpu_vmm_hold();
    int ok = vgpu_vmm_mapped(0x6000 * MiB, 2 * MiB, 0xc0) == 0 && vgpu_vmm_released(0xc0) == 0;
    uint64_t freed[1] = {0};
    ok = ok && vgpu_vmm_unmapped(0x6000 * MiB, 2 * MiB, freed, 1) == 1 && freed[0] == 0xc0;
    vgpu_vmm_let_go();
    check(ok, "the lock held across a call: the bookkeeping inside takes it again");
}

static void fork_child(void)
{
    check(vgpu_vmm_mapped(0x5000 * MiB, 2 * MiB, 0xb0) == 0, "mapped before a fork");
    pid_t pid = fork();
    if (pid == 0)
        _exit(vgpu_vmm_handles_in(0x5000 * MiB, 2 * MiB, NULL, 0) == 0 &&
              vgpu_vmm_released(0xb0) == 1 ? 0 : 1);
    int status = -1;
    waitpid(pid, &status, 0);
    check(status == 0, "a fork child starts with no mapping (status 0x%x)", status);
    check(vgpu_vmm_handles_in(0x5000 * MiB, 2 * MiB, NULL, 0) == 1,
          "the parent keeps its own");
}

int main(void)
{
    lifetimes();
    ranges();
    out_of_memory();
    held();
    fork_child();
    return check_done("test_vmm");
}
