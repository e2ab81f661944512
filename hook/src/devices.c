/* devices.c - which of the container's GPUs each CUDA device of this process is (devices.h). */
#define _GNU_SOURCE
#include "devices.h"

#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "locks.h"
#include "log.h"
#include "region.h"
#include "settings.h"

static int records[VGPU_REGION_MAX_DEVICES]; /* of each CUDA ordinal, once learnt */
static int learnt;                           /* atomic: records is set (release) */
static int listed;                           /* the settings file names the GPUs (once learnt) */
static int device_count;                     /* the process's CUDA devices (once learnt) */
static pthread_mutex_t learn_lock = PTHREAD_MUTEX_INITIALIZER;
/* This thread holds learn_lock: set once it is taken (vgpu_holds is true while a thread waits
 * for it too, and a thread waiting for another's learning must go on waiting). */
static __thread int learning;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* A fork child of a process whose other thread was learning: the lock is not its to wait for. */
static void after_fork_child(void) { pthread_mutex_init(&learn_lock, NULL); }

static void install_atfork(void) { pthread_atfork(NULL, NULL, after_fork_child); }

void vgpu_devices_lock(void)
{
    pthread_once(&atfork_once, install_atfork);
    vgpu_lock(&learn_lock);
    learning = 1;
}

void vgpu_devices_unlock(void)
{
    learning = 0;
    vgpu_unlock(&learn_lock);
}

static int is_gpu_uuid(const char *text, size_t len)
{
    return len > 4 && len < VGPU_REGION_UUID_BYTES && strncmp(text, "GPU-", 4) == 0;
}

int vgpu_assigned_position(const char *assigned, const char *uuid)
{
    if (assigned == NULL || assigned[0] == '\0')
        return VGPU_DEVICE_NO_LIST;
    int position = VGPU_DEVICE_NOT_ASSIGNED, index = 0;
    size_t uuid_len = strlen(uuid);
    for (const char *at = assigned;; index++) {
        size_t len = strcspn(at, ",");
        if (!is_gpu_uuid(at, len) || index == VGPU_REGION_MAX_DEVICES)
            return VGPU_DEVICE_NO_LIST;
        if (position < 0 && len == uuid_len && strncasecmp(at, uuid, len) == 0)
            position = index;
        if (at[len] == '\0')
            return position;
        at += len + 1;
    }
}

/* The settings file's list of the assigned GPUs; NULL where the settings are the environment's
 * (HAMi-core's contract), which any process of the container may change. */
static const char *assigned_list(void)
{
    const struct vgpu_settings *s = vgpu_settings();
    return s != NULL && s->from_file ? vgpu_settings_lookup(s, "NVIDIA_VISIBLE_DEVICES") : NULL;
}

/* Whether assigned names the GPUs by UUID (no UUID is empty, so none is found). */
static int names_gpus(const char *assigned)
{
    return vgpu_assigned_position(assigned, "") != VGPU_DEVICE_NO_LIST;
}

static int record_from_list(const char *assigned, int dev, const char *uuid)
{
    int position = vgpu_assigned_position(assigned, uuid);
    if (position == VGPU_DEVICE_NOT_ASSIGNED)
        vgpu_log(VGPU_LOG_ERROR, "CUDA device %d is %s, which the device plugin did not assign to "
                 "this container (%s names %s): nothing may be made or allocated on it. Give the "
                 "pod no NVIDIA_VISIBLE_DEVICES of its own and run it unprivileged",
                 dev, uuid, vgpu_settings_path, assigned);
    else if (vgpu_region_set_uuid(position, uuid) != 0)
        vgpu_log(VGPU_LOG_WARN, "the shared region names another GPU than %s for device record "
                 "%d; the settings file's list is kept", uuid, position);
    return position;
}

/* The first-come table. The record a GPU takes first is its place in the environment's
 * NVIDIA_VISIBLE_DEVICES (HAMi-core's plugin orders the limits so) where that names it, else its
 * ordinal's: only a hint, since whichever process comes first fixes each GPU's record for all. */
static int record_from_region(int dev, const char *uuid)
{
    int hint = vgpu_assigned_position(secure_getenv("NVIDIA_VISIBLE_DEVICES"), uuid);
    int record = vgpu_region_claim_record(uuid, hint >= 0 ? hint : dev);
    if (record < 0)
        vgpu_log(VGPU_LOG_ERROR, "CUDA device %d (%s): every device record of the shared region "
                 "names another GPU; nothing may be made or allocated on it", dev, uuid);
    return record < 0 ? VGPU_DEVICE_NOT_ASSIGNED : record;
}

void vgpu_devices_learn(int count, const char uuids[][VGPU_REGION_UUID_BYTES])
{
    const char *assigned = assigned_list();
    listed = names_gpus(assigned);
    device_count = count < 0 ? INT_MAX : count;
    if (assigned != NULL && !listed)
        vgpu_log(VGPU_LOG_WARN, "%s: NVIDIA_VISIBLE_DEVICES=%s does not name the GPUs by UUID; "
                 "devices are matched to limits in the order processes meet them",
                 vgpu_settings_path, assigned);
    for (int dev = 0; dev < VGPU_REGION_MAX_DEVICES; dev++) {
        const char *uuid = dev < count ? uuids[dev] : "";
        if (uuid[0] == '\0')
            records[dev] = dev; /* unreadable (or no such device): as before any map */
        else
            records[dev] = listed ? record_from_list(assigned, dev, uuid)
                                  : record_from_region(dev, uuid);
    }
    __atomic_store_n(&learnt, 1, __ATOMIC_RELEASE);
}

/* Whether the map is learnt; while another thread's cuInit is learning it (the driver is up for
 * this thread already), waits for that to end. */
static int map_learnt(void)
{
    if (!__atomic_load_n(&learnt, __ATOMIC_ACQUIRE) && !learning) {
        vgpu_lock(&learn_lock);
        vgpu_unlock(&learn_lock);
    }
    return __atomic_load_n(&learnt, __ATOMIC_ACQUIRE);
}

int vgpu_device_record(int dev)
{
    if (dev < 0 || dev >= VGPU_REGION_MAX_DEVICES)
        return VGPU_DEVICE_NOT_ASSIGNED;
    return map_learnt() ? records[dev] : dev;
}

/* An ordinal past the region's records has no ledger and no SM account: where a limit is set,
 * anything made there would escape it, and where the settings file names the GPUs it is none of
 * theirs that has a record (a pod that sees more GPUs than it was given). */
static int past_records_usable(int dev)
{
    static int told; /* atomic: logged once a process */
    if (dev >= device_count)
        return 1; /* no such device: the driver's to refuse */
    if (!listed && !vgpu_region_limits_anything())
        return 1;
    if (!__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED))
        vgpu_log(VGPU_LOG_ERROR, "CUDA device %d: the shared region keeps the limits of %d GPUs "
                 "and this one is past them, so nothing may be made or allocated on it. Give the "
                 "container at most %d GPUs (CUDA_VISIBLE_DEVICES)",
                 dev, VGPU_REGION_MAX_DEVICES, VGPU_REGION_MAX_DEVICES);
    return 0;
}

int vgpu_device_usable(int dev)
{
    if (dev < 0 || !map_learnt())
        return 1; /* the driver answers for it */
    if (dev >= VGPU_REGION_MAX_DEVICES)
        return past_records_usable(dev);
    return records[dev] != VGPU_DEVICE_NOT_ASSIGNED;
}

int vgpu_device_record_of_uuid(const char *uuid)
{
    int position = vgpu_assigned_position(assigned_list(), uuid);
    if (position != VGPU_DEVICE_NO_LIST)
        return position;
    int record = vgpu_region_find_uuid(uuid);
    return record >= 0 ? record : VGPU_DEVICE_NO_LIST;
}
