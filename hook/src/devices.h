/* devices.h - which of the container's GPUs each CUDA device of this process is.
 *
 * The region keeps one record per GPU of the container (its cap, its usage), in the order of the
 * limits CUDA_DEVICE_MEMORY_LIMIT_<i>. A process's CUDA ordinals need not follow that order:
 * CUDA_VISIBLE_DEVICES picks and reorders GPUs, and CUDA puts the fastest first. Counted by
 * ordinal, a process that swaps two GPUs would get each GPU's cap again on the other. So each
 * ordinal is mapped to its GPU's record by the GPU's UUID. */
#ifndef VGPU_DEVICES_H
#define VGPU_DEVICES_H

#include "vgpu_region.h"

enum {
    VGPU_DEVICE_NOT_ASSIGNED = -1, /* a GPU the device plugin did not give the container */
    VGPU_DEVICE_NO_LIST = -2,      /* the settings do not name the assigned GPUs by UUID */
};

/* The position of uuid in `assigned` (the device plugin's NVIDIA_VISIBLE_DEVICES: GPU UUIDs,
 * comma-separated, in the order of the limits), VGPU_DEVICE_NOT_ASSIGNED when it is not there,
 * or VGPU_DEVICE_NO_LIST when assigned is NULL or not such a list ("all", "none", indexes, an
 * empty entry, more than VGPU_REGION_MAX_DEVICES entries). UUIDs compare without regard to case. */
int vgpu_assigned_position(const char *assigned, const char *uuid);

/* cuInit's driver call and the learning of the map run under this lock: the driver is up for
 * the process's other threads before the map is, and they wait for it (vgpu_device_record). */
void vgpu_devices_lock(void);
void vgpu_devices_unlock(void);

/* With the lock held, once per process (cuInit, after its first success), maps this process's
 * count CUDA devices (-1: the driver could not say; uuids[i]: ordinal i's UUID, "" when
 * unreadable) to records:
 * - where the settings file names the assigned GPUs (vgpu_assigned_position), a GPU's record
 *   is its position there, and a GPU not listed gets none: nothing may be made or allocated on
 *   it (logged). The environment's list is not used: any process may change it;
 * - otherwise the record a process of the container first took for that UUID, else a free one
 *   (its place in the environment's NVIDIA_VISIBLE_DEVICES, else ordinal i's, when free): the
 *   region's first-come table.
 * An ordinal whose UUID is unreadable keeps its own number as record. */
void vgpu_devices_learn(int count, const char uuids[][VGPU_REGION_UUID_BYTES]);

/* The record of CUDA device dev: as learnt, VGPU_DEVICE_NOT_ASSIGNED for a GPU not assigned or
 * a dev out of range; dev itself while no cuInit has succeeded (the driver is not up). */
int vgpu_device_record(int dev);

/* Whether anything may be made on CUDA device dev: not on a GPU not assigned, nor on an ordinal
 * past the region's records where the settings file names the GPUs or any limit is set. */
int vgpu_device_usable(int dev);

/* The record of the GPU with this UUID (an NVML device, which may have no CUDA ordinal in this
 * process): its position in the settings file's list (VGPU_DEVICE_NOT_ASSIGNED when not
 * there), else the region's table (VGPU_DEVICE_NO_LIST when no process recorded it). */
int vgpu_device_record_of_uuid(const char *uuid);

#endif
