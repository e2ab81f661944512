/* loader.c - dlopen of the real libraries, the real-address -> wrapper tables, and the dlsym
 * override. Lookups by handle (dlopen + dlsym, as libcudart, PyTorch and pynvml do) bypass a
 * preloaded library, so dlsym asks glibc first and swaps in our wrapper only when the answer
 * is the real driver's address of a function we hook: exact names, never prefixes. */
#define _GNU_SOURCE
#include "loader.h"

#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "locks.h"
#include "log.h"

#define VGPU_EXPORT __attribute__((visibility("default")))

typedef void *(*dlsym_fn)(void *, const char *);

/* The sanitizer runtimes call dlsym while they start, before their shadow memory exists: the
 * dlsym path must not be instrumented in the sanitizer build (no effect on the normal one). */
#define NOT_INSTRUMENTED __attribute__((no_sanitize("address", "undefined")))

static dlsym_fn real_dlsym_fn;
static __thread __attribute__((tls_model("initial-exec"))) int loading; /* set while this thread runs dlopen: nested lookups pass through */
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;

NOT_INSTRUMENTED static dlsym_fn find_real_dlsym(void)
{
    /* dlvsym is not overridden, so it reaches glibc; dlsym moved to libc in glibc 2.34. */
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0"};
    for (size_t i = 0; i < sizeof versions / sizeof versions[0]; i++) {
        void *fn = dlvsym(RTLD_NEXT, "dlsym", versions[i]);
        if (fn == NULL)
            fn = dlvsym(RTLD_DEFAULT, "dlsym", versions[i]);
        if (fn != NULL)
            return (dlsym_fn)fn;
    }
    return NULL;
}

NOT_INSTRUMENTED static dlsym_fn get_real_dlsym(void)
{
    dlsym_fn fn = __atomic_load_n(&real_dlsym_fn, __ATOMIC_ACQUIRE);
    if (fn == NULL) {
        fn = find_real_dlsym();
        __atomic_store_n(&real_dlsym_fn, fn, __ATOMIC_RELEASE);
    }
    return fn;
}

/* glibc's dlsym (ours overrides the public name). */
NOT_INSTRUMENTED static void *real_dlsym(void *handle, const char *name)
{
    dlsym_fn fn = get_real_dlsym();
    return fn != NULL ? fn(handle, name) : NULL;
}

static void after_fork_child(void) { pthread_mutex_init(&load_lock, NULL); }

static void register_fork_handler(void) { pthread_atfork(NULL, NULL, after_fork_child); }

void vgpu_lib_load(struct vgpu_hook_lib *lib)
{
    static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
    if (loading)
        return; /* a constructor of the real library called back into us */
    pthread_once(&fork_once, register_fork_handler); /* a fork mid-load must not wedge the child */
    vgpu_lock(&load_lock);
    if (!__atomic_load_n(&lib->loaded, __ATOMIC_ACQUIRE)) {
        /* Until this returns, lookups from this thread (the real library's constructors, its
         * cuGetProcAddress) pass through untouched instead of re-entering the load. */
        loading = 1;
        void *handle = dlopen(lib->soname, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
        if (handle == NULL)
            vgpu_log(VGPU_LOG_ERROR, "cannot load the real %s: %s", lib->soname, dlerror());
        for (size_t i = 0; handle != NULL && i < lib->count; i++)
            *lib->hooks[i].real = real_dlsym(handle, lib->hooks[i].name);
        if (lib->after_load != NULL)
            lib->after_load();
        loading = 0;
        __atomic_store_n(&lib->loaded, 1, __ATOMIC_RELEASE);
    }
    vgpu_unlock(&load_lock);
}

void *vgpu_lib_wrapper_for(struct vgpu_hook_lib *lib, const void *real)
{
    vgpu_lib_ensure(lib);
    if (real == NULL)
        return NULL;
    for (size_t i = 0; i < lib->count; i++)
        if (lib->hooks[i].wrapper != NULL &&
            (*lib->hooks[i].real == real || lib->alias[i] == real))
            return lib->hooks[i].wrapper;
    return NULL;
}

/* 1 if name is one of lib's hooked exports. */
NOT_INSTRUMENTED static int hooks_name(const struct vgpu_hook_lib *lib, const char *name)
{
    for (size_t i = 0; i < lib->count; i++)
        if (lib->hooks[i].wrapper != NULL && strcmp(lib->hooks[i].name, name) == 0)
            return 1;
    return 0;
}

NOT_INSTRUMENTED static struct vgpu_hook_lib *lib_for_name(const char *name)
{
    if (name[0] == 'c' && name[1] == 'u' && hooks_name(&vgpu_cuda_lib, name))
        return &vgpu_cuda_lib;
    if (strncmp(name, "nvml", 4) == 0 && hooks_name(&vgpu_nvml_lib, name))
        return &vgpu_nvml_lib;
    return NULL;
}

NOT_INSTRUMENTED VGPU_EXPORT void *dlsym(void *handle, const char *name)
{
    if (handle == RTLD_NEXT || loading) {
        /* A sibling call (a jump at -O2): glibc sees our caller's return address, so RTLD_NEXT
         * stays relative to the object that asked. */
        dlsym_fn next = get_real_dlsym();
        return next != NULL ? next(handle, name) : NULL;
    }
    void *found = real_dlsym(handle, name);
    struct vgpu_hook_lib *lib = found != NULL ? lib_for_name(name) : NULL;
    if (lib == NULL)
        return found;
    void *wrapper = vgpu_lib_wrapper_for(lib, found);
    return wrapper != NULL ? wrapper : found;
}
