/* region_view.h - a test's read-only view of the shared region its libvgpu uses (the file
 * CUDA_DEVICE_MEMORY_SHARED_CACHE names, which tests/run.sh makes per test). */
#ifndef VGPU_TEST_REGION_VIEW_H
#define VGPU_TEST_REGION_VIEW_H

#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "vgpu_region.h"

/* The region, mapped read-only; NULL when it cannot be opened or is not a region. */
static inline const struct vgpu_region *region_view(void)
{
    const char *path = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    int fd = path != NULL ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    if (fd < 0)
        return NULL;
    void *m = mmap(NULL, VGPU_REGION_FILE_SIZE, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return NULL;
    const struct vgpu_region *r = m;
    return r->header.magic == VGPU_REGION_MAGIC ? r : NULL;
}

#endif
