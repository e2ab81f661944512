/* region_file.h - finding, checking and (only when that is safe) creating the region file. */
#ifndef VGPU_REGION_FILE_H
#define VGPU_REGION_FILE_H

#include "limits.h"
#include "vgpu_region.h"

struct vgpu_region_file {
    struct vgpu_region *map; /* MAP_SHARED, VGPU_REGION_FILE_SIZE bytes */
    int fd;                  /* O_RDWR | O_CLOEXEC: the creation and slot byte locks are on it */
    int dir_fd;              /* its folder: holds this process's guard lock (see region_file.c) */
    uint64_t dev, ino;       /* the file's identity (fstat at the open), which fd must keep */
};

/* Opens the region at path, initialising the device plugin's all-zero file or creating a new
 * one from limits when no process of an earlier region at that path lives; maps it. Returns 0,
 * or -1 and sets *why (static text) when the file must not be used. */
int vgpu_region_file_open(const char *path, const struct vgpu_limits *limits,
                          struct vgpu_region_file *out, const char **why);

/* Byte 0 of the region file serialises its creation and the slot claims, a few milliseconds
 * each. Its holder may be stopped (SIGSTOP, a debugger), and any process of the container can
 * open the file and lock that byte: a wait for it ends after VGPU_CREATION_LOCK_WAIT_S seconds,
 * and who waited in vain is refused, saying why, rather than hang in its first CUDA call. */
enum { VGPU_CREATION_LOCK_WAIT_S = 10 };

/* Takes the write lock of byte `at` of fd (an open file description's), waiting for it
 * wait_ms at most: 0, or -1 with errno (ETIMEDOUT: still held by another). */
int vgpu_region_file_lock_byte(int fd, uint64_t at, unsigned wait_ms);
void vgpu_region_file_unlock_byte(int fd, uint64_t at);

/* Why a process that waited so long in vain is refused. */
extern const char vgpu_creation_lock_held[];

#endif
