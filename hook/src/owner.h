/* owner.h - whether a slot's owner process still runs, asked of /proc: a slot's lock byte says
 * so only while the owner keeps the region's descriptor open (region.c). */
#ifndef VGPU_OWNER_H
#define VGPU_OWNER_H

#include <stdint.h>

/* When process pid (0: this one) started, in clock ticks after boot (/proc/PID/stat's 22nd
 * field, which an exec keeps); 0 when it cannot be read. */
uint64_t vgpu_owner_start_ticks(int32_t pid);

/* Whether process pid, which started at start_ticks, still runs. No: the start time is not
 * known (0: a slot of a region made before the start time was kept, or of a process that could
 * not read it; its pid may be another's, say after the container restarted in a new pid
 * namespace), /proc has no such process, it has exited (a zombie, which holds no device
 * memory), or the pid is another process's now (it started at another time). When /proc
 * cannot say (not mounted, or hiding other users' processes), kill(pid, 0) does: only "no such
 * process" is no. */
int vgpu_owner_runs(int32_t pid, uint64_t start_ticks);

/* The same two, reading `proc` in place of /proc (tests/test_owner.c). */
uint64_t vgpu_owner_start_ticks_in(const char *proc, int32_t pid);
int vgpu_owner_runs_in(const char *proc, int32_t pid, uint64_t start_ticks);

#endif
