/* kernels.c - the writers of the table of kernels' local memory (kernels.h), one at a time
 * under a lock of the table's own: a forget never waits behind a stack raise's driver and
 * NVML calls (cuda_limits.c holds stack_lock across them). */
#include <pthread.h>

#include "kernels.h"
#include "locks.h"

struct vgpu_kernel vgpu_kernels[VGPU_KERNELS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
/* Written under lock, read without it (before the driver is asked). */
static uint64_t forgets;

/* A fork while another thread wrote leaves the lock held in the child, and maybe a slot's seq
 * odd (write_slot makes it even again at its next write). */
static void after_fork_child(void) { pthread_mutex_init(&lock, NULL); }

static void register_fork_handler(void) { pthread_atfork(NULL, NULL, after_fork_child); }

static void register_once(void)
{
    static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
    pthread_once(&fork_once, register_fork_handler);
}

static void write_slot(struct vgpu_kernel *k, CUfunction f, uint32_t local)
{
    uint32_t odd = __atomic_load_n(&k->seq, __ATOMIC_RELAXED) | 1;
    __atomic_store_n(&k->seq, odd, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE); /* seq odd before the slot changes */
    __atomic_store_n(&k->f, f, __ATOMIC_RELAXED);
    __atomic_store_n(&k->local, local, __ATOMIC_RELAXED);
    __atomic_store_n(&k->seq, odd + 1, __ATOMIC_RELEASE);
}

uint64_t vgpu_kernels_forgotten(void)
{
    return __atomic_load_n(&forgets, __ATOMIC_ACQUIRE);
}

int vgpu_kernel_keep(CUfunction f, uint32_t local, uint64_t forgotten)
{
    register_once();
    /* A launch of a signal handler's that interrupted this thread's own write: not kept. */
    if (vgpu_lock_unless_mine(&lock) != 0)
        return 0;
    int keep = __atomic_load_n(&forgets, __ATOMIC_RELAXED) == forgotten;
    if (keep)
        write_slot(&vgpu_kernels[vgpu_kernel_slot(f)], f, local);
    vgpu_unlock(&lock);
    return keep;
}

void vgpu_kernels_forget(void)
{
    register_once();
    vgpu_lock(&lock);
    __atomic_store_n(&forgets, __atomic_load_n(&forgets, __ATOMIC_RELAXED) + 1, __ATOMIC_RELEASE);
    for (size_t i = 0; i < VGPU_KERNELS; i++)
        if (__atomic_load_n(&vgpu_kernels[i].f, __ATOMIC_RELAXED) != NULL)
            write_slot(&vgpu_kernels[i], NULL, 0);
    vgpu_unlock(&lock);
}
