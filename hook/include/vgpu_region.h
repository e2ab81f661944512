/*
 * vgpu_region.h - the shared region file of libvgpu.so, layout version 2.
 *
 * One file per container (path: $CUDA_DEVICE_MEMORY_SHARED_CACHE). Every process of the
 * container that uses CUDA or NVML maps it MAP_SHARED and keeps its memory ledger in it; the
 * node monitor maps it to read usage and limits. This header is the whole contract: readers in
 * other languages copy the offsets below (each one is pinned by a _Static_assert).
 *
 * All integers are little-endian, naturally aligned, and read or written with 64-bit (or 32-bit)
 * atomic loads/stores. Byte layout (file size 198784 bytes, as in version 1):
 *
 *   offset 0      struct vgpu_region_header            128 bytes
 *   offset 128    struct vgpu_region_device[16]        16 x 128 bytes
 *   offset 2176   struct vgpu_region_slot[1024]        1024 x 192 bytes
 *
 * A reader must check magic, version, header_size, device_size, slot_size, max_devices,
 * max_slots and file_size before trusting anything else, and reject the file otherwise.
 * See hook/README.md, "Shared region layout", for snapshots and liveness.
 */
#ifndef VGPU_REGION_H
#define VGPU_REGION_H

#include <stddef.h>
#include <stdint.h>

/* "VGPUREG1" read as a little-endian u64: HAMi-core's monitor (magic 19920718) rejects it. */
#define VGPU_REGION_MAGIC UINT64_C(0x3147455255504756)

enum {
    /* 2: a device's usage is the sum of the slots' ledgers (version 1 kept a device total
     * beside them, changed under a lock in the header; the words it used are reserved now),
     * and a slot's claim time moved from offset 16 to 160 for the reservations' announcements. */
    VGPU_REGION_VERSION = 2,
    VGPU_REGION_MAX_DEVICES = 16,
    VGPU_REGION_MAX_SLOTS = 1024,
    VGPU_REGION_UUID_BYTES = 64,
};

/* vgpu_region_slot.pending: the device field's shift, and its value when a process has
 * reservations under way on more than one device. */
enum { VGPU_PENDING_DEVICE_SHIFT = 59, VGPU_PENDING_SEVERAL = 31 };

/* Values of vgpu_region_device.uuid_state. */
enum { VGPU_UUID_UNSET = 0, VGPU_UUID_WRITING = 1, VGPU_UUID_SET = 2 };

struct vgpu_region_header {
    uint64_t magic;            /*   0 VGPU_REGION_MAGIC; stored last (release) by the creator */
    uint32_t version;          /*   8 VGPU_REGION_VERSION */
    uint32_t header_size;      /*  12 sizeof(struct vgpu_region_header) = 128 */
    uint32_t device_size;      /*  16 sizeof(struct vgpu_region_device) = 128 */
    uint32_t slot_size;        /*  20 sizeof(struct vgpu_region_slot) = 192 */
    uint32_t max_devices;      /*  24 16 */
    uint32_t max_slots;        /*  28 1024 */
    uint64_t file_size;        /*  32 198784 */
    uint64_t devices_offset;   /*  40 128 */
    uint64_t slots_offset;     /*  48 2176 */
    uint32_t slot_high_water;  /*  56 atomic: slots [0, slot_high_water) have ever been claimed */
    int32_t creator_pid;       /*  60 pid (creator's namespace) that initialised the file */
    uint64_t created_unix_ns;  /*  64 CLOCK_REALTIME at creation */
    uint64_t reaped_slots;     /*  72 atomic: dead processes whose memory was given back */
    uint64_t reserved_80;      /*  80 0 (version 1's ledger lock) */
    uint16_t sample_period_ms[VGPU_REGION_MAX_DEVICES]; /* 88 atomic: NVML's per-process sample
                                *     period on each device record, in ms, as the container's
                                *     processes learnt it from two sample stamps (the least
                                *     seen; 0 = not yet): a new process starts from it.
                                *     Readers ignore it */
    uint8_t reserved[8];       /* 120 zero */
};

struct vgpu_region_device {
    uint64_t limit_bytes;      /*   0 memory cap; 0 = no cap. Fixed at creation */
    uint64_t reserved_8;       /*   8 0 (version 1's device total: the usage is now the sum
                                *     of the slots' used_bytes[d], vgpu_region_device_used) */
    uint64_t peak_bytes;       /*  16 atomic: the highest usage a reservation saw */
    uint32_t sm_limit_percent; /*  24 SM cap in percent; 0 = no cap. Fixed at creation */
    uint32_t uuid_state;       /*  28 VGPU_UUID_*: uuid is valid only when SET (acquire) */
    char uuid[VGPU_REGION_UUID_BYTES]; /* 32 "GPU-xxxxxxxx-...", NUL-terminated: the GPU these
                                        *    limits are for (the settings file's
                                        *    NVIDIA_VISIBLE_DEVICES at this position, else
                                        *    the first process to meet it took the record) */
    uint64_t oom_refusals;     /*  96 atomic: allocations refused because of the cap */
    uint64_t context_bytes;    /* 104 atomic: the context and driver memory NVML last showed for
                                *     one process of the container on this device beyond its
                                *     allocations (reserved before the next context is made) */
    int64_t sm_credit_ns;      /* 112 atomic: the SM limiter's GPU-time account, the container's
                                *     (hook/src/throttle.c): ns of the whole GPU it has left under
                                *     its SM limit, negative when over; 0 in a new region */
    uint64_t sm_charged_us;    /* 120 atomic: CLOCK_REALTIME us (NVML's sample stamps) up to
                                *     which sm_credit_ns is charged; 0 = never. sm_credit_ns
                                *     also holds what live processes prepaid past it */
};

struct vgpu_region_slot {
    int32_t pid;               /*   0 owner's pid in the container; 0 = free */
    int32_t host_pid;          /*   4 written by the node monitor (0 = unknown); see README */
    uint64_t generation;       /*   8 atomic: odd while the slot is being claimed or released */
    /* In the cache line of the first 4 devices' ledgers: a reservation there announces, adds
     * and withdraws in one line of its own, and reads one line of each other slot. */
    uint64_t pending;          /*  16 atomic: the reservations this process has under way,
                                *     announced while it checks the cap (a check that passes
                                *     moves them to used_bytes[d], one that fails takes them
                                *     back): bits 0-58 their bytes, bits 59-63 their device + 1
                                *     (VGPU_PENDING_SEVERAL: more than one; 0: none). Readers
                                *     ignore it (version 1 had claimed_unix_ns here) */
    uint64_t last_launch_unix_ns; /* 24 atomic: a recent kernel launch (every 1024th per thread) */
    uint64_t used_bytes[VGPU_REGION_MAX_DEVICES]; /* 32 atomic: this process's ledger per
                                *     device, changed by its owner alone (and, once the owner
                                *     is dead, by the process that reaps the slot) */
    uint64_t claimed_unix_ns;  /* 160 CLOCK_REALTIME when the owner claimed the slot */
    uint64_t announcements;    /* 168 atomic: how many reservations the owner has announced:
                                *     another's waits for it while it changes (ledger.c).
                                *     Readers ignore it */
    uint64_t start_ticks;      /* 176 the owner's start time, clock ticks after boot
                                *     (/proc/PID/stat's 22nd field; 0 = not known): a slot
                                *     whose lock is free is still its owner's while a process
                                *     that started then has that pid (README, "Live or dead").
                                *     Version 1's undo journal, with 160-175 */
    uint64_t context_bytes;    /* 184 atomic: of this slot's used_bytes, the context and driver
                                *     memory (all devices), as NVML measured it; the rest are
                                *     allocations. Written by the owner; readers may see it lag */
};

_Static_assert(sizeof(struct vgpu_region_header) == 128, "header is 128 bytes");
_Static_assert(sizeof(struct vgpu_region_device) == 128, "device record is 128 bytes");
_Static_assert(sizeof(struct vgpu_region_slot) == 192, "slot is 192 bytes");
_Static_assert(offsetof(struct vgpu_region_header, slot_high_water) == 56, "header offsets");
_Static_assert(offsetof(struct vgpu_region_header, reaped_slots) == 72, "header offsets");
_Static_assert(offsetof(struct vgpu_region_header, reserved_80) == 80, "header offsets");
_Static_assert(offsetof(struct vgpu_region_header, sample_period_ms) == 88, "header offsets");
_Static_assert(offsetof(struct vgpu_region_device, uuid) == 32, "device offsets");
_Static_assert(offsetof(struct vgpu_region_device, oom_refusals) == 96, "device offsets");
_Static_assert(offsetof(struct vgpu_region_device, context_bytes) == 104, "device offsets");
_Static_assert(offsetof(struct vgpu_region_device, sm_credit_ns) == 112, "device offsets");
_Static_assert(offsetof(struct vgpu_region_device, sm_charged_us) == 120, "device offsets");
_Static_assert(offsetof(struct vgpu_region_slot, used_bytes) == 32, "slot offsets");
_Static_assert(offsetof(struct vgpu_region_slot, pending) == 16, "slot offsets");
_Static_assert(offsetof(struct vgpu_region_slot, claimed_unix_ns) == 160, "slot offsets");
_Static_assert(offsetof(struct vgpu_region_slot, announcements) == 168, "slot offsets");
_Static_assert(offsetof(struct vgpu_region_slot, start_ticks) == 176, "slot offsets");
_Static_assert(offsetof(struct vgpu_region_slot, context_bytes) == 184, "slot offsets");

enum {
    VGPU_REGION_DEVICES_OFFSET = 128,
    VGPU_REGION_SLOTS_OFFSET = 128 + 16 * 128,
    VGPU_REGION_FILE_SIZE = 128 + 16 * 128 + 1024 * 192,
};

/* The whole file, as mapped. */
struct vgpu_region {
    struct vgpu_region_header header;
    struct vgpu_region_device devices[VGPU_REGION_MAX_DEVICES];
    struct vgpu_region_slot slots[VGPU_REGION_MAX_SLOTS];
};

_Static_assert(offsetof(struct vgpu_region, devices) == VGPU_REGION_DEVICES_OFFSET, "devices");
_Static_assert(offsetof(struct vgpu_region, slots) == VGPU_REGION_SLOTS_OFFSET, "slots");
_Static_assert(sizeof(struct vgpu_region) == VGPU_REGION_FILE_SIZE, "file size");

/* NULL when the header describes exactly this layout, else why not (for a log line). Check it
 * before reading anything else; file_size is the size of the file as found on disk. */
static inline const char *vgpu_region_layout_problem(const struct vgpu_region_header *h,
                                                     uint64_t file_size)
{
    if (h->magic == 0)
        return "not initialised yet (magic 0)";
    if (h->magic != VGPU_REGION_MAGIC)
        return "bad magic (not a libvgpu region, or a HAMi-core cache file)";
    if (h->version != VGPU_REGION_VERSION)
        return "unknown layout version";
    if (h->header_size != sizeof(struct vgpu_region_header) ||
        h->device_size != sizeof(struct vgpu_region_device) ||
        h->slot_size != sizeof(struct vgpu_region_slot) ||
        h->max_devices != VGPU_REGION_MAX_DEVICES || h->max_slots != VGPU_REGION_MAX_SLOTS ||
        h->file_size != VGPU_REGION_FILE_SIZE || file_size < VGPU_REGION_FILE_SIZE)
        return "record sizes differ from this library's";
    return NULL;
}

/* The byte whose OFD write lock serialises host-pid discovery on device 0 (88 + d for device
 * d: header bytes; locking them does not change them). Byte 0 is the creation lock. */
enum { VGPU_REGION_DISCOVERY_LOCK_OFFSET = 88 };
/* The byte (a header byte after the 16 discovery bytes; locking it does not change it) whose
 * OFD write lock serialises the writing of device records' UUIDs (libvgpu's src/devices.c).
 * Bytes 88-119 hold sample_period_ms: the locks and the values do not meet. */
enum { VGPU_REGION_RECORDS_LOCK_OFFSET = 104 };

/* A device's usage: the sum of the ledgers of every slot ever claimed (slot_high_water), the
 * dead ones' included until a process of the container reaps them. Each word is read once: a
 * reader sees every ledger as it was at some instant of the walk. */
static inline uint64_t vgpu_region_device_used(const struct vgpu_region *r, int d)
{
    uint32_t high = __atomic_load_n(&r->header.slot_high_water, __ATOMIC_SEQ_CST);
    uint64_t sum = 0;
    for (uint32_t i = 0; i < high && i < VGPU_REGION_MAX_SLOTS; i++) {
        uint64_t held = __atomic_load_n(&r->slots[i].used_bytes[d], __ATOMIC_SEQ_CST);
        sum = sum + held < sum ? UINT64_MAX : sum + held;
    }
    return sum;
}

/* Liveness: the owner of slot i holds an fcntl() write lock on the single byte at this file
 * offset for as long as it lives; the kernel drops it when the process dies or execs. */
static inline uint64_t vgpu_region_slot_lock_offset(uint32_t slot)
{
    return (uint64_t)VGPU_REGION_SLOTS_OFFSET + (uint64_t)slot * sizeof(struct vgpu_region_slot);
}

#endif /* VGPU_REGION_H */
