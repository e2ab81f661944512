/* locks.h - the library's mutexes, taken through these so that each thread knows which it
 * holds. A signal handler of the application's that makes a CUDA call runs on the thread it
 * interrupted, maybe inside one of the library's locks (a stack raise holds one across driver
 * and NVML calls): waiting for that lock would be waiting for ever. The launch paths ask first
 * (vgpu_lock_unless_mine, vgpu_holds_a_lock) and refuse, or do without, instead
 * (hook/README.md, "A CUDA call from a signal handler"). Inline: an allocation and its free
 * take several of these locks. */
#ifndef VGPU_LOCKS_H
#define VGPU_LOCKS_H

#include <pthread.h>

/* The locks the calling thread holds or is taking or giving back, in no order. Past
 * VGPU_HELD_MAX at once a lock goes unlisted (the library nests at most 4, and a handler's call
 * as many again: a handler's lock unlisted could be taken for an entry below it).
 *
 * The list is the thread's own and a signal handler runs on the thread it interrupts, so the
 * only race is with a handler in the middle of a change: a listing grows the count before it
 * writes the entry, and a removal moves the last entry into the gap before the count shrinks.
 * A handler then sees every lock the thread holds, and maybe a stale entry or the lock being
 * given back, which only makes it refuse once where it could have waited; its own listings
 * sit above the count it interrupted and are gone again when it returns. */
enum { VGPU_HELD_MAX = 12 };
struct vgpu_held_locks {
    const pthread_mutex_t *locks[VGPU_HELD_MAX];
    unsigned count;
};
extern __thread __attribute__((tls_model("initial-exec"))) struct vgpu_held_locks vgpu_held_locks;

/* Whether the calling thread holds m (or is taking or giving it back). */
static inline int vgpu_holds(const pthread_mutex_t *m)
{
    unsigned n = __atomic_load_n(&vgpu_held_locks.count, __ATOMIC_RELAXED);
    for (unsigned i = 0; i < n; i++)
        if (__atomic_load_n(&vgpu_held_locks.locks[i], __ATOMIC_RELAXED) == m)
            return 1;
    return 0;
}

/* Whether the calling thread holds any of the library's locks: a call it makes now interrupted
 * the library (a signal handler's), or was made from within a driver call the library made. */
static inline int vgpu_holds_a_lock(void)
{
    return __atomic_load_n(&vgpu_held_locks.count, __ATOMIC_RELAXED) != 0;
}

/* Relaxed atomics, ordered by signal fences: a handler on this thread is the only other
 * reader (C11 leaves plain accesses from a handler undefined). */
static inline void vgpu_listed(const pthread_mutex_t *m)
{
    unsigned n = __atomic_load_n(&vgpu_held_locks.count, __ATOMIC_RELAXED);
    if (n >= VGPU_HELD_MAX)
        return;
    __atomic_store_n(&vgpu_held_locks.count, n + 1, __ATOMIC_RELAXED);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    __atomic_store_n(&vgpu_held_locks.locks[n], m, __ATOMIC_RELAXED);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
}

static inline void vgpu_unlisted(const pthread_mutex_t *m)
{
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    unsigned n = __atomic_load_n(&vgpu_held_locks.count, __ATOMIC_RELAXED);
    for (unsigned i = n; i-- > 0;)
        if (__atomic_load_n(&vgpu_held_locks.locks[i], __ATOMIC_RELAXED) == m) {
            const pthread_mutex_t *last =
                __atomic_load_n(&vgpu_held_locks.locks[n - 1], __ATOMIC_RELAXED);
            __atomic_store_n(&vgpu_held_locks.locks[i], last, __ATOMIC_RELAXED);
            __atomic_signal_fence(__ATOMIC_SEQ_CST);
            __atomic_store_n(&vgpu_held_locks.count, n - 1, __ATOMIC_RELAXED);
            __atomic_signal_fence(__ATOMIC_SEQ_CST);
            return;
        }
}

/* Says on stderr, at once, that a call waits for a lock its own thread holds (locks.c). */
void vgpu_say_waiting_on_own_lock(void);

/* Says on stderr, at once, that call was refused inside the virtual memory bookkeeping of its
 * own thread (vmm.h, vgpu_vmm_mine). */
void vgpu_say_refused_inside(const char *call);

/* Takes m. One the calling thread holds already can never be had: that is said on stderr at
 * once (the call then waits for ever, as it did before the library knew). */
static inline void vgpu_lock(pthread_mutex_t *m)
{
    if (vgpu_holds(m))
        vgpu_say_waiting_on_own_lock();
    vgpu_listed(m);
    pthread_mutex_lock(m);
}

/* Takes m and returns 0, or returns -1 when the calling thread holds it already (a signal
 * handler's call inside the library's own), having taken nothing. */
static inline int vgpu_lock_unless_mine(pthread_mutex_t *m)
{
    if (vgpu_holds(m))
        return -1;
    vgpu_listed(m);
    pthread_mutex_lock(m);
    return 0;
}

/* pthread_mutex_trylock through the list: 0 taken, else nothing taken. */
static inline int vgpu_trylock(pthread_mutex_t *m)
{
    vgpu_listed(m);
    int rc = pthread_mutex_trylock(m);
    if (rc != 0)
        vgpu_unlisted(m);
    return rc;
}

static inline void vgpu_unlock(pthread_mutex_t *m)
{
    pthread_mutex_unlock(m);
    vgpu_unlisted(m);
}

#endif
