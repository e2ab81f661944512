/* ledger.h - the container's memory accounting in the region: every change of a device's
 * used_bytes and a slot's used_bytes[d] is made under one lock, with an undo journal, so that a
 * process killed at any instruction leaves both words as they were before its change. */
#ifndef VGPU_LEDGER_H
#define VGPU_LEDGER_H

#include <stdint.h>

#include "vgpu_region.h"

struct vgpu_ledger {
    struct vgpu_region *r;
    int fd;        /* the region file: whether a holder lives is its slot byte lock (F_GETLK) */
    uint32_t self; /* this process's slot: its name in the lock word, and where its journal is */
    uint64_t file_dev, file_ino; /* the region file's identity (fstat), which fd must still have */
};

/* Takes the ledger lock. A holder that died (its slot byte unlocked) is taken over and its
 * journal undone. patience_ms 0: wait as long as it takes; else give up after that long and
 * return -1. Never held across anything that blocks. */
int vgpu_ledger_lock(const struct vgpu_ledger *l, unsigned patience_ms);

void vgpu_ledger_unlock(const struct vgpu_ledger *l);

/* Before a newly claimed slot is used as l->self: if the lock word names it (its previous owner
 * died holding the lock), take the lock over, undo, and release it. */
void vgpu_ledger_forget_stale(const struct vgpu_ledger *l);

/* Under the lock: adds bytes to device dev and to slot target's ledger unless that passes limit
 * (0 = none) or overflows; returns 0, or -1 with nothing changed. */
int vgpu_ledger_add(const struct vgpu_ledger *l, uint32_t target, int dev, uint64_t bytes,
                    uint64_t limit);

/* Under the lock: takes bytes off device dev and slot target's ledger (never below 0). */
void vgpu_ledger_sub(const struct vgpu_ledger *l, uint32_t target, int dev, uint64_t bytes);

/* Under the lock: gives slot target's whole ledger back to the devices; returns the bytes. */
uint64_t vgpu_ledger_drain(const struct vgpu_ledger *l, uint32_t target);

#endif
