/* ledger.h - the container's memory accounting in the region. Each process keeps its ledger in
 * its own slot, one word per device that only it changes; a device's usage is the sum of the
 * slots' words. No lock: a process killed at any instruction leaves its ledger one word that the
 * process reaping its slot gives back whole, and a stopped one holds nobody up. */
#ifndef VGPU_LEDGER_H
#define VGPU_LEDGER_H

#include <stdint.h>

#include "vgpu_region.h"

/* Adds bytes to slot self's ledger for device dev unless the container's usage would pass
 * limit (0 = none) or the ledger overflow; returns 0, or -1 with nothing changed. Of two
 * processes racing for the last room, at most one gets it. When only other processes'
 * reservations under way are in the way, it sleeps until they end: up to a second while they
 * make progress, 100 ms once they do not. */
int vgpu_ledger_add(struct vgpu_region *r, uint32_t self, int dev, uint64_t bytes,
                    uint64_t limit);

/* Takes bytes off slot self's ledger for device dev (never below 0). */
void vgpu_ledger_sub(struct vgpu_region *r, uint32_t self, int dev, uint64_t bytes);

/* Gives slot target's whole ledger back (its owner is dead, and the caller holds its byte);
 * returns the bytes. */
uint64_t vgpu_ledger_drain(struct vgpu_region *r, uint32_t target);

#endif
