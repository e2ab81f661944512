/* vmm.h - what keeps a cuMemCreate allocation alive. cuda.h (cuMemRelease): the memory "will be
 * freed when all outstanding mappings to the memory are unmapped and when all outstanding
 * references to the handle are also released". cuMemCreate gives the handle one reference,
 * cuMemRetainAllocationHandle one more, cuMemRelease takes one; cuMemMap adds a mapping,
 * cuMemUnmap takes those of its range. Releasing the handle right after mapping it is the usual
 * idiom (the memory stays mapped): its bytes stay counted until both are gone.
 * Called after the driver succeeded; safe from any thread. */
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

/* One reference fewer; 1 when that freed the memory (no reference and no mapping left). */
int vgpu_vmm_released(uint64_t handle);

/* The handles of the mappings cuMemUnmap(va, size) takes (those from va on, each starting where
 * the one before ended, up to va + size), as many as fit in out; returns how many there are. */
size_t vgpu_vmm_handles_in(uint64_t va, uint64_t size, uint64_t *out, size_t max);

/* cuMemUnmap(va, size) succeeded: its mappings are forgotten, and the handles whose memory that
 * freed (no reference and no mapping left) go into freed, as many as fit; returns how many. */
size_t vgpu_vmm_unmapped(uint64_t va, uint64_t size, uint64_t *freed, size_t max);

/* Around a driver call that may free memory (cuMemRelease, cuMemUnmap) and the bookkeeping
 * after it: the driver may hand the freed handle's value out again at once, and another
 * thread's mapping of the new handle must not be counted against the old one. */
void vgpu_vmm_hold(void);
void vgpu_vmm_let_go(void);

#endif
