/* nvml_view.h - a test's query of NVML's memory figures as an application makes it: libnvidia-ml
 * reached by dlopen + dlsym (which libvgpu answers with its wrappers). */
#ifndef VGPU_TEST_NVML_VIEW_H
#define VGPU_TEST_NVML_VIEW_H

#include <dlfcn.h>
#include <nvml.h>

/* NVML's figures for the GPU NVML numbers index into *m; 0, or -1 when NVML cannot say. */
static inline int nvml_memory_of(unsigned int index, nvmlMemory_t *m)
{
    typedef nvmlReturn_t (*init_fn)(void);
    typedef nvmlReturn_t (*handle_fn)(unsigned int, nvmlDevice_t *);
    typedef nvmlReturn_t (*memory_fn)(nvmlDevice_t, nvmlMemory_t *);
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    init_fn init = lib != NULL ? (init_fn)dlsym(lib, "nvmlInit_v2") : NULL;
    handle_fn by_index =
        lib != NULL ? (handle_fn)dlsym(lib, "nvmlDeviceGetHandleByIndex_v2") : NULL;
    memory_fn memory = lib != NULL ? (memory_fn)dlsym(lib, "nvmlDeviceGetMemoryInfo") : NULL;
    nvmlDevice_t device;
    if (init == NULL || by_index == NULL || memory == NULL || init() != NVML_SUCCESS ||
        by_index(index, &device) != NVML_SUCCESS || memory(device, m) != NVML_SUCCESS)
        return -1;
    return 0;
}

#endif
