/* region.h - the per-container shared region (layout: include/vgpu_region.h). */
#ifndef VGPU_REGION_INTERNAL_H
#define VGPU_REGION_INTERNAL_H

#include <stdint.h>

#include "limits.h"
#include "vgpu_region.h"

/* Maps the region (creating it if needed) once per process; never returns NULL: if the file
 * cannot be used, a private region enforces the same limits for this process alone. */
struct vgpu_region *vgpu_region_get(void);

/* Adds bytes to device dev's container total unless that would pass the cap, then to this
 * process's ledger. Returns 0 on success, -1 when over the cap (nothing changed). */
int vgpu_region_reserve(int dev, uint64_t bytes);

/* Gives back bytes reserved earlier by this process. */
void vgpu_region_release(int dev, uint64_t bytes);

/* Returns dead processes' memory to the container; returns how many slots were reaped. */
int vgpu_region_reap_dead(void);

uint64_t vgpu_region_limit(int dev);
uint64_t vgpu_region_used(int dev);
uint32_t vgpu_region_sm_limit(int dev);

/* Records the UUID of CUDA device dev (first writer wins). */
void vgpu_region_set_uuid(int dev, const char *uuid);

/* Returns the CUDA ordinal whose recorded UUID equals uuid, or -1. */
int vgpu_region_find_uuid(const char *uuid);

/* Stamps this process's slot with the time, for a kernel launch (no-op before it has a slot). */
void vgpu_region_note_launch(void);

/* Fills pids with the pids (container and host) of live slots; returns the count. */
int vgpu_region_pids(int32_t *pids, int max);

/* Gives this process's ledger back and frees its slot (normal exit). */
void vgpu_region_detach(void);

#endif
