/* faults.c - preloaded after libvgpu by the tests of error paths a healthy system never takes;
 * libvgpu's calls of the functions below come here first (no library before it defines them).
 *   FAULTS=ofd                fcntl's open-file-description locks (F_OFD_*) fail with EINVAL,
 *                             as on a kernel before Linux 3.15
 *   FAULTS=sigaction          sigaction for SIGBUS fails with EINVAL
 *   faults_set("map-fixed")   an anonymous mmap at a fixed address fails with ENOMEM (the
 *                             SIGBUS handler's zeros over a truncated region)
 *   faults_set("host-memory") malloc, calloc and realloc called from libvgpu.so return NULL
 * faults_set(what, on) is found with dlsym(RTLD_DEFAULT, "faults_set") by the test programs.
 * Not usable under the sanitizers: their interceptors come first in the preload list. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

void *__libc_malloc(size_t size);
void *__libc_calloc(size_t count, size_t size);
void *__libc_realloc(void *old, size_t size);
int __sigaction(int sig, const struct sigaction *action, struct sigaction *old);

static int ofd_fails, sigbus_action_fails, map_fixed_fails, host_memory_fails;
static uintptr_t libvgpu_start, libvgpu_end; /* libvgpu.so's loaded segments */

__attribute__((constructor)) static void read_faults(void)
{
    const char *faults = getenv("FAULTS");
    ofd_fails = faults != NULL && strstr(faults, "ofd") != NULL;
    sigbus_action_fails = faults != NULL && strstr(faults, "sigaction") != NULL;
}

static int find_libvgpu(struct dl_phdr_info *info, size_t size, void *unused)
{
    (void)size;
    (void)unused;
    if (info->dlpi_name == NULL || strstr(info->dlpi_name, "libvgpu") == NULL)
        return 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD)
            continue;
        uintptr_t start = info->dlpi_addr + ph->p_vaddr, end = start + ph->p_memsz;
        if (libvgpu_start == 0 || start < libvgpu_start)
            libvgpu_start = start;
        if (end > libvgpu_end)
            libvgpu_end = end;
    }
    return 1;
}

/* Turns a fault on (1) or off (0); returns -1 for an unknown name or no libvgpu loaded. */
__attribute__((visibility("default"))) int faults_set(const char *what, int on)
{
    if (strcmp(what, "map-fixed") == 0) {
        map_fixed_fails = on;
        return 0;
    }
    if (strcmp(what, "host-memory") == 0) {
        if (libvgpu_end == 0)
            dl_iterate_phdr(find_libvgpu, NULL);
        host_memory_fails = on && libvgpu_end != 0;
        return libvgpu_end != 0 ? 0 : -1;
    }
    return -1;
}

static int from_libvgpu(const void *caller)
{
    uintptr_t at = (uintptr_t)caller;
    return host_memory_fails && at >= libvgpu_start && at < libvgpu_end;
}

__attribute__((visibility("default"))) void *malloc(size_t size)
{
    if (from_libvgpu(__builtin_return_address(0))) {
        errno = ENOMEM;
        return NULL;
    }
    return __libc_malloc(size);
}

__attribute__((visibility("default"))) void *calloc(size_t count, size_t size)
{
    if (from_libvgpu(__builtin_return_address(0))) {
        errno = ENOMEM;
        return NULL;
    }
    return __libc_calloc(count, size);
}

__attribute__((visibility("default"))) void *realloc(void *old, size_t size)
{
    if (from_libvgpu(__builtin_return_address(0))) {
        errno = ENOMEM;
        return NULL;
    }
    return __libc_realloc(old, size);
}

/* Every command takes a pointer or an int; the system call reads whichever it needs. */
__attribute__((visibility("default"))) int fcntl(int fd, int cmd, ...)
{
    va_list args;
    va_start(args, cmd);
    void *arg = va_arg(args, void *);
    va_end(args);
    if (ofd_fails && (cmd == F_OFD_GETLK || cmd == F_OFD_SETLK || cmd == F_OFD_SETLKW)) {
        errno = EINVAL;
        return -1;
    }
    return (int)syscall(SYS_fcntl, fd, cmd, arg);
}

__attribute__((visibility("default"))) void *mmap(void *at, size_t length, int prot, int flags,
                                                  int fd, off_t offset)
{
    if (map_fixed_fails && (flags & MAP_FIXED) && (flags & MAP_ANONYMOUS)) {
        errno = ENOMEM;
        return MAP_FAILED;
    }
    return (void *)syscall(SYS_mmap, at, length, prot, flags, fd, offset);
}

__attribute__((visibility("default"))) int sigaction(int sig, const struct sigaction *action,
                                                     struct sigaction *old)
{
    if (sigbus_action_fails && sig == SIGBUS) {
        errno = EINVAL;
        return -1;
    }
    /* libc's own by its other name: the kernel's struct sigaction differs (and wants a
     * restorer), and a dlsym would go through libvgpu's. */
    return __sigaction(sig, action, old);
}
