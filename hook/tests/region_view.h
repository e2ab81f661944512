/* region_view.h - a test's read-only view of the shared region its libvgpu uses (the file
 * CUDA_DEVICE_MEMORY_SHARED_CACHE names, which tests/run.sh makes per test). */
#ifndef VGPU_TEST_REGION_VIEW_H
#define VGPU_TEST_REGION_VIEW_H

#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "vgpu_region.h"

/* The region file at path, mapped with prot; NULL when it cannot be opened or is not a region
 * (unmapped with munmap(r, VGPU_REGION_FILE_SIZE)). */
static inline struct vgpu_region *region_map_at(const char *path, int prot)
{
    int fd = path != NULL ? open(path, (prot & PROT_WRITE ? O_RDWR : O_RDONLY) | O_CLOEXEC) : -1;
    if (fd < 0)
        return NULL;
    void *m = mmap(NULL, VGPU_REGION_FILE_SIZE, prot, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return NULL;
    struct vgpu_region *r = m;
    return r->header.magic == VGPU_REGION_MAGIC ? r : NULL;
}

/* This process's region, mapped with prot. */
static inline struct vgpu_region *region_map(int prot)
{
    return region_map_at(getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE"), prot);
}

/* The region, mapped read-only. */
static inline const struct vgpu_region *region_view(void) { return region_map(PROT_READ); }

/* The region, writable: a test playing a clock stepped back, or a process writing it. */
static inline struct vgpu_region *region_edit(void) { return region_map(PROT_READ | PROT_WRITE); }

#endif
