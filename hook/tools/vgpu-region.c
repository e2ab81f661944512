/* vgpu-region FILE - prints a libvgpu shared region as JSON, reading it the way README.md's
 * "Taking a consistent snapshot" says a node monitor should: header checks, per-slot
 * generation retries, liveness by F_GETLK only (it never takes a lock, so it cannot disturb the
 * processes it looks at). Exit status 0, or 1 with a message when the file is not a region. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vgpu_region.h"

static uint64_t load64(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }

/* The pid holding slot i's byte, as seen from here; 0 when the owner is dead or the slot free,
 * -1 when alive but not visible in this pid namespace. */
static int holder(int fd, uint32_t i)
{
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET,
                       .l_start = (off_t)vgpu_region_slot_lock_offset(i), .l_len = 1};
    if (fcntl(fd, F_GETLK, &fl) != 0 || fl.l_type == F_UNLCK)
        return 0;
    return fl.l_pid > 0 ? fl.l_pid : -1;
}

/* A consistent copy of a slot: retried while its owner is changing it. */
static void snapshot(const struct vgpu_region_slot *live, struct vgpu_region_slot *copy)
{
    for (int tries = 0; tries < 1000; tries++) {
        uint64_t g1 = load64(&live->generation);
        memcpy(copy, (const void *)live, sizeof *copy);
        if ((g1 & 1) == 0 && load64(&live->generation) == g1)
            return;
    }
}

static void print_devices(const struct vgpu_region *r)
{
    printf("  \"devices\": [");
    const char *sep = "";
    for (int d = 0; d < VGPU_REGION_MAX_DEVICES; d++) {
        const struct vgpu_region_device *dev = &r->devices[d];
        int uuid_set = __atomic_load_n(&dev->uuid_state, __ATOMIC_ACQUIRE) == VGPU_UUID_SET;
        uint64_t used = vgpu_region_device_used(r, d);
        if (dev->limit_bytes == 0 && used == 0 && !uuid_set && dev->sm_limit_percent == 0)
            continue;
        printf("%s\n    {\"index\": %d, \"uuid\": \"%.*s\", \"limit_bytes\": %llu, "
               "\"used_bytes\": %llu, \"peak_bytes\": %llu, \"sm_limit_percent\": %u, "
               "\"oom_refusals\": %llu, \"context_bytes\": %llu, \"sm_credit_ns\": %lld}", sep, d,
               uuid_set ? VGPU_REGION_UUID_BYTES - 1 : 0, dev->uuid,
               (unsigned long long)dev->limit_bytes, (unsigned long long)used,
               (unsigned long long)load64(&dev->peak_bytes), dev->sm_limit_percent,
               (unsigned long long)load64(&dev->oom_refusals),
               (unsigned long long)load64(&dev->context_bytes),
               (long long)__atomic_load_n(&dev->sm_credit_ns, __ATOMIC_ACQUIRE));
        sep = ",";
    }
    printf("\n  ],\n");
}

static void print_slots(const struct vgpu_region *r, int fd)
{
    printf("  \"processes\": [");
    const char *sep = "";
    uint32_t high = __atomic_load_n(&r->header.slot_high_water, __ATOMIC_ACQUIRE);
    for (uint32_t i = 0; i < high && i < VGPU_REGION_MAX_SLOTS; i++) {
        struct vgpu_region_slot s;
        snapshot(&r->slots[i], &s);
        if (s.pid == 0)
            continue;
        int owner = holder(fd, i);
        printf("%s\n    {\"slot\": %u, \"pid\": %d, \"live\": %s, \"holder_pid\": %d, "
               "\"host_pid\": %d, \"claimed_unix_ns\": %llu, \"start_ticks\": %llu, "
               "\"last_launch_unix_ns\": %llu, \"context_bytes\": %llu, \"used_bytes\": {",
               sep, i, s.pid, owner != 0 ? "true" : "false", owner > 0 ? owner : 0, s.host_pid,
               (unsigned long long)s.claimed_unix_ns, (unsigned long long)s.start_ticks,
               (unsigned long long)s.last_launch_unix_ns, (unsigned long long)s.context_bytes);
        const char *inner = "";
        for (int d = 0; d < VGPU_REGION_MAX_DEVICES; d++) {
            if (s.used_bytes[d] != 0) {
                printf("%s\"%d\": %llu", inner, d, (unsigned long long)s.used_bytes[d]);
                inner = ", ";
            }
        }
        printf("}}");
        sep = ",";
    }
    printf("\n  ]\n");
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: vgpu-region FILE\n");
        return 2;
    }
    int fd = open(argv[1], O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        fprintf(stderr, "vgpu-region: %s: %s\n", argv[1], strerror(errno));
        return 1;
    }
    if (st.st_size < (off_t)sizeof(struct vgpu_region_header)) {
        fprintf(stderr, "vgpu-region: %s: too small for a region header\n", argv[1]);
        return 1;
    }
    const struct vgpu_region *r = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (r == MAP_FAILED) {
        fprintf(stderr, "vgpu-region: %s: %s\n", argv[1], strerror(errno));
        return 1;
    }
    const char *problem = vgpu_region_layout_problem(&r->header, (uint64_t)st.st_size);
    if (problem != NULL) {
        fprintf(stderr, "vgpu-region: %s: %s\n", argv[1], problem);
        return 1;
    }
    printf("{\n  \"version\": %u,\n  \"creator_pid\": %d,\n  \"reaped_slots\": %llu,\n",
           r->header.version, r->header.creator_pid,
           (unsigned long long)load64(&r->header.reaped_slots));
    print_devices(r);
    print_slots(r, fd);
    printf("}\n");
    return 0;
}
