/* loader.h - finding the real driver libraries and mapping their functions to our wrappers. */
#ifndef VGPU_LOADER_H
#define VGPU_LOADER_H

#include <stddef.h>

/* One function of a real library: its exported name, our wrapper with the same signature (NULL
 * for functions we only call), and where to store the real address. For CUDA, also how
 * cuGetProcAddress names it: the base name, a version whose ABI is this export's, and whether
 * it is the per-thread-default-stream flavour. */
struct vgpu_hook {
    const char *name;
    void *wrapper;
    void **real;
    const char *base;
    int version;
    int per_thread;
};

enum { VGPU_MAX_HOOKS = 192 };

struct vgpu_hook_lib {
    const char *soname;            /* "libcuda.so.1" */
    const struct vgpu_hook *hooks;
    size_t count;
    void (*after_load)(void);      /* runs once, after every real address is known */
    int loaded;                    /* atomic: 1 once loading finished (even if it failed) */
    /* A second address per hook that also means "this function" (what the driver's
     * cuGetProcAddress answers, if that differs from its dlsym export); NULL if none. */
    void *alias[VGPU_MAX_HOOKS];
};

/* Loads lib once (dlopen + real dlsym of every hook); safe from any thread. */
void vgpu_lib_load(struct vgpu_hook_lib *lib);

static inline void vgpu_lib_ensure(struct vgpu_hook_lib *lib)
{
    if (__builtin_expect(!__atomic_load_n(&lib->loaded, __ATOMIC_ACQUIRE), 0))
        vgpu_lib_load(lib);
}

/* Our wrapper for a real function address of lib, or NULL if we do not hook it. */
void *vgpu_lib_wrapper_for(struct vgpu_hook_lib *lib, const void *real);

/* Defined by cuda.c and nvml.c. */
extern struct vgpu_hook_lib vgpu_cuda_lib;
extern struct vgpu_hook_lib vgpu_nvml_lib;

#endif
