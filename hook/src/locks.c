/* locks.c - which of the library's mutexes each thread holds (locks.h): the list itself, its
 * fork handler, and the line said when a call waits for its own thread's lock. */
#ifndef _GNU_SOURCE /* the unit tests define it on the command line */
#define _GNU_SOURCE
#endif
#include "locks.h"

#include <string.h>
#include <unistd.h>

__thread __attribute__((tls_model("initial-exec"))) struct vgpu_held_locks vgpu_held_locks;

/* A fork child holds none: each lock's own fork handler makes it anew there, even one the
 * forking thread held (a fork from a callback inside the library). */
static void after_fork_child(void)
{
    __atomic_store_n(&vgpu_held_locks.count, 0, __ATOMIC_RELAXED);
}

__attribute__((constructor)) static void register_fork_handler(void)
{
    pthread_atfork(NULL, NULL, after_fork_child);
}

/* Written at once with write(2), not through vgpu_log: the interrupted thread may be keeping
 * its lines for later (log.h), which would be never. */
void vgpu_say_waiting_on_own_lock(void)
{
    static const char line[] =
        "[vgpu ERROR] a CUDA or NVML call made inside a signal handler (or from within a driver "
        "call) waits for a lock of libvgpu that the thread it interrupted holds or is waiting "
        "for: if it holds it, the call never returns. Make CUDA calls outside signal handlers "
        "(the driver's are not async-signal-safe either)\n";
    if (write(STDERR_FILENO, line, sizeof line - 1) < 0)
        return;
}

/* As vgpu_say_waiting_on_own_lock, naming the call: built with strnlen and memcpy, which a
 * signal handler may call. */
void vgpu_say_refused_inside(const char *call)
{
    static const char head[] = "[vgpu ERROR] ";
    static const char tail[] =
        " made inside a signal handler (or from within a driver call) that interrupted libvgpu "
        "while it kept the books of virtual memory: refused (CUDA_ERROR_NOT_PERMITTED), since "
        "it would change them under the call it interrupted. Make CUDA calls outside signal "
        "handlers\n";
    char line[sizeof head + 64 + sizeof tail];
    size_t n = strnlen(call, 64);
    memcpy(line, head, sizeof head - 1);
    memcpy(line + sizeof head - 1, call, n);
    memcpy(line + sizeof head - 1 + n, tail, sizeof tail - 1);
    if (write(STDERR_FILENO, line, sizeof head - 1 + n + sizeof tail - 1) < 0)
        return;
}
