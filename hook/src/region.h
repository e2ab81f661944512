/* region.h - the per-container shared region (layout: include/vgpu_region.h). */
#ifndef VGPU_REGION_INTERNAL_H
#define VGPU_REGION_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "limits.h"
#include "vgpu_region.h"

/* Maps the region (creating it only when that is safe) once per process. NULL when the file
 * cannot be used: the process then gets no CUDA (never a private region with a cap of its own). */
struct vgpu_region *vgpu_region_get(void);

/* 1 when the region is attached and intact (not truncated or zeroed since): the condition for
 * CUDA to initialise and for anything to be allocated or reported. */
int vgpu_region_usable(void);

/* Adds bytes to this process's ledger for device dev unless the container's usage would pass
 * the cap. Returns 0 on success, -1 when over the cap, -2 when there is no usable region or no
 * slot for this process (nothing changed in either case). */
int vgpu_region_reserve(int dev, uint64_t bytes);

/* Adds bytes to this process's ledger for dev even past the cap: memory the process
 * already holds (context and driver memory measured after the fact). 0, or -2 as above. */
int vgpu_region_charge(int dev, uint64_t bytes);

/* Gives back bytes reserved earlier by this process. */
void vgpu_region_release(int dev, uint64_t bytes);

/* Returns dead processes' memory to the container; returns how many slots were reaped. */
int vgpu_region_reap_dead(void);
/* The same, unless this process did within 100 ms (an owner found running is believed alive
 * for a second): for those who read every slot often (what the container holds, its pids). A
 * process with no slot reaps nothing. */
void vgpu_region_reap_lately(void);

/* What the container holds on a record, as it is told (cuMemGetInfo, NVML): so that a process
 * that exited does not shrink what it has until an allocation happens to need the room, a
 * process with a slot reaps the dead first (at most every 100 ms); one without (nvidia-smi,
 * which must not take a slot: it would count as a process whose host pid is unknown) sums the
 * live slots' ledgers. */
uint64_t vgpu_region_record_in_use(int record);

/* The cap of a GPU not assigned to the container (devices.h): no allocation fits under it. */
#define VGPU_REGION_NOTHING_FITS UINT64_C(1)

/* The limits are the region's, read once at attach (0 when not attached). */
uint64_t vgpu_region_limit(int dev);
int vgpu_region_any_limit(void); /* any device has a memory cap */
int vgpu_region_limits_anything(void); /* any device has a memory cap or an SM limit */
uint64_t vgpu_region_used(int dev);
uint32_t vgpu_region_sm_limit(int dev);
/* The container's SM account on dev (sm_credit_ns, sm_charged_us), shared by its processes;
 * NULL without a region or a record for dev (the caller keeps one of its own). */
struct vgpu_region_device *vgpu_region_sm_account(int dev);

/* NVML's sample period on dev as the container's processes learnt it, seconds (0: not yet),
 * and the learning of one: the least seen stays. */
double vgpu_region_sample_period(int dev);
void vgpu_region_learn_sample_period(int dev, double seconds);

/* Where a process of the container refused an allocation for want of room on dev. */
void vgpu_region_count_refusal(int dev);

/* Every function above and below that takes a dev takes a CUDA ordinal of this process and
 * acts on its GPU's record (devices.h). These take the record itself: */
uint64_t vgpu_region_record_limit(int record);
uint64_t vgpu_region_record_used(int record);

/* Records uuid as record's GPU unless a process did first: 0, or -1 when the record names
 * another GPU. */
int vgpu_region_set_uuid(int record, const char *uuid);

/* The record that names uuid, or -1. */
int vgpu_region_find_uuid(const char *uuid);

/* The record that names uuid, else preferred when no GPU's yet, else the first that is no GPU's
 * (the region's first-come table); -1 when every record names another GPU. */
int vgpu_region_claim_record(const char *uuid, int preferred);

/* Copies the UUID recorded for CUDA device dev; returns 0, or -1 when none is recorded. */
int vgpu_region_uuid(int dev, char *out, size_t size);

/* Stamps this process's slot with the time, for a kernel launch (no-op before it has a slot). */
void vgpu_region_note_launch(void);

/* Fills pids with one pid per slot with an owner: its host pid once learnt, else its pid in the
 * container; returns the count. */
int vgpu_region_pids(int32_t *pids, int max);

/* This process's pid in the host's namespace (what NVML lists), 0 while unknown. */
int32_t vgpu_region_host_pid(void);
/* Sets it only while none is set (two threads may learn it at once); 1 when this call did. */
int vgpu_region_claim_host_pid(int32_t pid);
/* Unsets it where it is still pid (found not to be this process's). */
void vgpu_region_forget_host_pid(int32_t pid);

/* 1 when this process has a slot and every slot with an owner has its host pid learnt. */
int vgpu_region_host_pids_known(void);

/* 1 when another live slot of the container already names pid as its host pid. */
int vgpu_region_host_pid_taken(int32_t pid);

/* The context memory last measured on dev for a process of this container (0: none yet). */
uint64_t vgpu_region_context_estimate(int dev);

/* Publishes a measurement: measured (one context on dev; 0 keeps the previous estimate) and
 * this process's counted context memory over all devices. */
void vgpu_region_note_context(int dev, uint64_t measured, uint64_t all_devices);

/* Serialises host-pid discovery on dev among the container's processes (an OFD lock on header
 * byte 88 + dev, dropped if the holder dies); gives up after patience_ms. 0, or -1. */
int vgpu_region_lock_discovery(int dev, unsigned patience_ms);
void vgpu_region_unlock_discovery(int dev);

#endif
