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

#endif
