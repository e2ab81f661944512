/* owner.h - whether a slot's owner process still runs, asked of /proc: a slot's lock byte says
 * so only while the owner keeps the region's descriptor open (region.c). */
#ifndef VGPU_OWNER_H
#define VGPU_OWNER_H

#include <stdint.h>

/* Who owns a slot, and what the library asks of that process. */
struct vgpu_owner {
    int32_t pid;          /* in the container's pid namespace */
    uint64_t start_ticks; /* when it started: /proc/PID/stat's 22nd field, which an exec keeps */
    uint64_t dev, ino;    /* the region file as mappings show it (vgpu_owner_mapping_of), which
                           * the owner's image maps while it lives */
};

/* The device and inode /proc/self/maps shows for this process's mapping that starts at addr:
 * on overlayfs, older kernels show the layer's file there, not the one fstat gives. 0, or -1 when there is
 * no such mapping or the mappings cannot be read. */
int vgpu_owner_mapping_of(const void *addr, uint64_t *dev, uint64_t *ino);

/* When process pid (0: this one) started, in clock ticks after boot; 0 when it cannot be read. */
uint64_t vgpu_owner_start_ticks(int32_t pid);

/* Whether the owner still runs. No: its start time is not known (0: a slot of a process that
 * could not read it; its pid may be another's, say after the container restarted in a new pid
 * namespace), /proc has no such process, it has exited (a zombie holds no device memory), the
 * pid is another process's now (it started at another time), or that process no longer maps
 * the region (it exec'd: the new image has no CUDA context of the old). Where /proc cannot say
 * whether the process exists (not mounted, or hiding other users' processes), kill(pid, 0)
 * does; where it cannot show the mappings (another user's process), the process runs. */
int vgpu_owner_runs(const struct vgpu_owner *owner);

/* The same two, reading `proc` in place of /proc (tests/test_owner.c). */
uint64_t vgpu_owner_start_ticks_in(const char *proc, int32_t pid);
int vgpu_owner_runs_in(const char *proc, const struct vgpu_owner *owner);

#endif
