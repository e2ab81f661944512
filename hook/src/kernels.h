/* kernels.h - each kernel's local memory per thread, as the driver answered, by handle: asked
 * once a kernel, read at every launch without a lock (cuda_driver.h, vgpu_stack_fits). A table,
 * direct-mapped: a handle whose slot another took is asked again. Written one writer at a time
 * (kernels.c's lock), read at any time. */
#ifndef VGPU_KERNELS_H
#define VGPU_KERNELS_H

#include <cuda.h>
#include <stddef.h>
#include <stdint.h>

enum { VGPU_KERNELS = 4096 /* a power of two */ };

/* One slot. seq is odd while the slot is written: a reader that saw it odd, or saw it change
 * across its reads, may have read a mix of two handles' entries (the handle alone, read before
 * and after the size, cannot tell: another handle's write and then this one's again between
 * the reads bring the handle back with the other's size). 32 bits: a reader would have to
 * stall across 2^31 writes of its slot, each after a question to the driver. */
struct vgpu_kernel {
    CUfunction f;
    uint32_t seq;
    uint32_t local;
};
extern struct vgpu_kernel vgpu_kernels[VGPU_KERNELS];

static inline size_t vgpu_kernel_slot(CUfunction f)
{
    return (size_t)(((uintptr_t)f >> 4) * UINT64_C(0x9e3779b97f4a7c15) >> 32) &
           (VGPU_KERNELS - 1);
}

/* 1 with f's local memory in *local, as the table has it; 0 when it was never kept (or was
 * forgotten, another handle took its slot, or the slot is being written). f must not be NULL:
 * an empty slot holds NULL, and would answer 1 with 0 bytes. */
static inline int vgpu_kernel_known(CUfunction f, uint64_t *local)
{
    const struct vgpu_kernel *k = &vgpu_kernels[vgpu_kernel_slot(f)];
    uint32_t seq = __atomic_load_n(&k->seq, __ATOMIC_ACQUIRE);
    CUfunction kept = __atomic_load_n(&k->f, __ATOMIC_RELAXED);
    *local = __atomic_load_n(&k->local, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_ACQUIRE); /* the reads above before seq's second */
    return kept == f && (seq & 1) == 0 && __atomic_load_n(&k->seq, __ATOMIC_RELAXED) == seq;
}

/* How many times the table was forgotten: read before the driver is asked about a kernel, and
 * given to vgpu_kernel_keep with the answer. */
uint64_t vgpu_kernels_forgotten(void);
/* Keeps f's local memory, in place of whatever its slot held, unless the table was forgotten
 * since `forgotten` was read (the answer may be about the kernel the handle named before a
 * module unload: kept, it would be another kernel's size once the handle is reused), or unless
 * the calling thread is writing the table already (a signal handler's launch: locks.h).
 * Returns whether it was kept. */
int vgpu_kernel_keep(CUfunction f, uint32_t local, uint64_t forgotten);
/* Forgets every handle (its module going or gone, a handle may name another kernel next). */
void vgpu_kernels_forget(void);

#endif
