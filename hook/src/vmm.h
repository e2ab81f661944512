/* vmm.h - what keeps a cuMemCreate allocation alive. cuda.h (cuMemRelease): the memory "will be
 * freed when all outstanding mappings to the memory are unmapped and when all outstanding
 * references to the handle are also released". cuMemCreate gives the handle one reference,
 * cuMemRetainAllocationHandle one more, cuMemRelease takes one; cuMemMap adds a mapping,
 * cuMemUnmap takes those of its range; a binding (a sparse array's tile, a multicast object's)
 * holds it as a mapping does. Releasing the handle right after mapping it is the usual idiom
 * (the memory stays mapped): its bytes stay counted until both are gone.
 * Called after the driver succeeded (a binding: before, see vgpu_vmm_bound); safe from any
 * thread. */
#ifndef VGPU_VMM_H
#define VGPU_VMM_H

#include <stddef.h>
#include <stdint.h>

/* handle is mapped at [va, va + size). 0, or -1 out of host memory (nothing recorded). */
int vgpu_vmm_mapped(uint64_t va, uint64_t size, uint64_t handle);

/* One more reference to handle. 0, or -1 out of host memory (nothing recorded). */
int vgpu_vmm_retained(uint64_t handle);

/* cuMemCreate made handle: a value the driver hands out again starts afresh (one reference, no
 * mapping), whatever the allocation that had it before left recorded (an export). */
void vgpu_vmm_created(uint64_t handle);

/* handle was exported: imports (in this process or another) take references this library
 * never sees, so its memory is never taken as freed (its bytes stay counted for the process's
 * life). 0, or -1 out of host memory (nothing recorded). */
int vgpu_vmm_exported(uint64_t handle);

/* A hold on a handle's memory that cuMemUnmap does not undo: a multicast object's binding of it
 * (holder: the object; at: the object's offset; dev: the device bound, -1 where not known), or
 * a sparse array's tile mapped onto it (holder: the array; tile: which one, word for word as
 * the call named it; at 0, dev -1). */
enum { VGPU_VMM_TILE = 5 };
struct vgpu_vmm_binding {
    uint64_t holder, at, handle;
    uint64_t tile[VGPU_VMM_TILE];
    int dev;
};

/* b is about to be made by the driver (a bind may wait for other threads: recorded first, so
 * that no release meanwhile takes the memory as freed): it holds the handle's memory as a
 * mapping does, pending until vgpu_vmm_bind_answered. Its id, or 0 out of host memory (nothing
 * recorded). */
uint64_t vgpu_vmm_bound(const struct vgpu_vmm_binding *b);

/* The driver answered binding id: made (kept, no longer pending), or not (forgotten). 1 when
 * forgetting it freed the memory (released meanwhile). */
int vgpu_vmm_bind_answered(uint64_t id, int made);

/* Which bindings an unbind undoes: holder's at [from, from + size), on dev (every device's for
 * dev < 0; one of no known device on any), whose tile covered says lies within tile (NULL:
 * any). */
struct vgpu_vmm_select {
    uint64_t holder, from, size;
    int dev;
    const uint64_t *tile;
    int (*covered)(const uint64_t *bound, const uint64_t *tile);
};

/* The ids of the made (not pending) bindings s selects and (of) their handles, as many as fit;
 * returns how many there are. */
size_t vgpu_vmm_bound_ids(const struct vgpu_vmm_select *s, uint64_t *ids, uint64_t *of,
                          size_t max);

/* The bindings of ids are undone (cuMulticastUnbind, an array's tile unmapped, the array
 * destroyed): forgotten, and the handles whose memory that freed go into freed, as many as
 * fit; returns how many. */
size_t vgpu_vmm_unbound(const uint64_t *ids, size_t n, uint64_t *freed, size_t max);

/* One reference fewer; 1 when that freed the memory (no reference and no mapping left). */
int vgpu_vmm_released(uint64_t handle);

/* The handles of the mappings cuMemUnmap(va, size) takes (those from va on, each starting where
 * the one before ended, up to va + size), as many as fit in out; returns how many there are. */
size_t vgpu_vmm_handles_in(uint64_t va, uint64_t size, uint64_t *out, size_t max);

/* The handles of every mapping that overlaps [va, va + size), wherever in it the range starts,
 * as many as fit in out; returns how many there are. */
size_t vgpu_vmm_handles_over(uint64_t va, uint64_t size, uint64_t *out, size_t max);

/* cuMemUnmap(va, size) succeeded: its mappings are forgotten, and the handles whose memory that
 * freed (no reference and no mapping left) go into freed, as many as fit; returns how many. */
size_t vgpu_vmm_unmapped(uint64_t va, uint64_t size, uint64_t *freed, size_t max);

/* Around a driver call that may free memory (cuMemRelease, cuMemUnmap) and the bookkeeping
 * after it: the driver may hand the freed handle's value out again at once, and another
 * thread's mapping of the new handle must not be counted against the old one. */
void vgpu_vmm_hold(void);
void vgpu_vmm_let_go(void);

/* Whether the calling thread holds the lock (or is taking or giving it back): a call it makes
 * now is a signal handler's that interrupted the tables' bookkeeping or a hold, and the
 * recursive lock would let it change the tables under the call it interrupted. */
int vgpu_vmm_mine(void);

#endif
