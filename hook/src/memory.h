/* memory.h - allocation accounting: reserve against the cap, remember what the driver returned,
 * give it back on free. Keys are the pointer or handle the driver returned. */
#ifndef VGPU_MEMORY_H
#define VGPU_MEMORY_H

#include <stddef.h>
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

/* Records a successful allocation (its reservation becomes owned by key). owner: the context
 * whose end frees it, where the driver cannot be asked about it afterwards (an array's: a
 * destroyed array may not be passed to the driver again); NULL for the others. */
void vgpu_mem_track(enum vgpu_alloc_kind kind, uint64_t key, int dev, uint64_t bytes,
                    const void *owner);

/* One recording of an allocation, as the table held it (serial: which recording of key, from
 * 1; a record vgpu_mem_find did not fill keeps the 0 it was initialised with). */
struct vgpu_mem_record {
    uint64_t key, bytes, serial;
    int dev, kind;
    const void *owner;
};

/* Removes key and returns 1 with its recording, or 0 if this process never counted it. */
int vgpu_mem_untrack(enum vgpu_alloc_kind kind, uint64_t key, struct vgpu_mem_record *out);

/* Puts a recording back after the driver refused its free. If the driver has meanwhile handed
 * its key out to another allocation, this one was freed already (with its context): its bytes
 * go back. */
void vgpu_mem_track_again(const struct vgpu_mem_record *was);

/* Copies key's recording into *out; 0 when this process does not count key. */
int vgpu_mem_find(enum vgpu_alloc_kind kind, uint64_t key, struct vgpu_mem_record *out);

/* Removes asked's key while it still is that recording, and returns 1 (the caller gives its
 * bytes back); 0 when it is gone or was recorded again since (the driver freed it and handed
 * the key out anew: insert gave the old bytes back then). */
int vgpu_mem_untrack_exact(const struct vgpu_mem_record *asked);

/* The driver's answer about a recorded key: still allocated, freed, or it cannot say. */
enum vgpu_held { VGPU_HELD_YES, VGPU_HELD_GONE, VGPU_HELD_UNKNOWN };

/* After a context was destroyed (the driver frees what it held without a free call): the
 * entries of kind on dev (every device for dev < 0) that ask says are gone are removed and
 * their bytes given back; returns those bytes, and in *unanswered how many ask could not tell. */
uint64_t vgpu_mem_forget_gone(enum vgpu_alloc_kind kind, int dev,
                              enum vgpu_held (*ask)(uint64_t key), size_t *unanswered);

/* The serial of the last recording so far (taken before a context's end: what was recorded
 * after it is not that context's, though another context may have been given its handle). */
uint64_t vgpu_mem_recorded(void);

/* After owner (a context) was destroyed: the entries of kind it owned, recorded up to serial
 * `before`, are removed and their bytes given back; returns those bytes. */
uint64_t vgpu_mem_forget_owned(enum vgpu_alloc_kind kind, const void *owner, uint64_t before);

/* The entries of kind owner owned, recorded up to `before`, are no context's from now on (its
 * end may not have freed them; its handle may name another context next). */
void vgpu_mem_disown(enum vgpu_alloc_kind kind, const void *owner, uint64_t before);

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
