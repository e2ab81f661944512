/* memory.h - allocation accounting: reserve against the cap, remember what the driver returned,
 * give it back on free. Keys are the pointer or handle the driver returned. */
#ifndef VGPU_MEMORY_H
#define VGPU_MEMORY_H

#include <stdint.h>

enum vgpu_alloc_kind {
    VGPU_KIND_POINTER = 1, /* cuMemAlloc, pitch, managed, async and pool allocations */
    VGPU_KIND_HANDLE = 2,  /* cuMemCreate physical handles */
    VGPU_KIND_ARRAY = 3,   /* cuArrayCreate / cuArray3DCreate */
};

/* Reserves bytes on dev; over the cap it reaps dead processes and tries once more, then logs
 * and returns -1 (the caller answers CUDA_ERROR_OUT_OF_MEMORY). */
int vgpu_mem_reserve(int dev, uint64_t bytes, const char *api);

/* Gives back a reservation that did not become an allocation. */
void vgpu_mem_unreserve(int dev, uint64_t bytes);

/* Records a successful allocation (its reservation becomes owned by key). */
void vgpu_mem_track(enum vgpu_alloc_kind kind, uint64_t key, int dev, uint64_t bytes);

/* Removes key and returns 1 with its device and size, or 0 if this process never counted it. */
int vgpu_mem_untrack(enum vgpu_alloc_kind kind, uint64_t key, int *dev, uint64_t *bytes);

/* After a context was destroyed (the driver frees what it held without a free call): the
 * entries of kind on dev (every device for dev < 0) still_held says the driver no longer has
 * are removed and their bytes given back. Returns the bytes given back. */
uint64_t vgpu_mem_forget_gone(enum vgpu_alloc_kind kind, int dev, int (*still_held)(uint64_t key));

/* Bytes of the allocations this process counts on dev (the table's, not the ledger's). */
uint64_t vgpu_mem_tracked(int dev);

/* Around every counted allocation and free (reserve .. driver call .. table), so that a
 * measurement of what the process holds can tell whether one was under way. */
void vgpu_mem_op_begin(void);
void vgpu_mem_op_end(void);

/* Non-zero when no allocation or free is under way; two equal non-zero answers around a
 * measurement mean none started or ended during it either. */
uint64_t vgpu_mem_quiet_epoch(void);

#endif
