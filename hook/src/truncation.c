/* truncation.c - a region file truncated while mapped: every access past the new end raises
 * SIGBUS, which would kill every CUDA process of the container (an issue-11 finding). The
 * handler below maps private zeros over the region and sets a flag; the region code then treats
 * the region as lost (allocations refused, nothing reported) and the faulting access goes on.
 * Faults anywhere else go to the previous handler, or to the default action. Residual: a
 * handler the application installs after ours replaces it. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "truncation.h"

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static uintptr_t guard_start;
static size_t guard_len;
static int seen;
static struct sigaction previous;

/* The log line, built with async-signal-safe code only. */
static void say_truncated(void)
{
    char line[192] = "[vgpu ERROR pid ";
    size_t n = strlen(line);
    char digits[16];
    int k = 0;
    for (unsigned long pid = (unsigned long)getpid(); k == 0 || pid != 0; pid /= 10)
        digits[k++] = (char)('0' + pid % 10);
    while (k > 0)
        line[n++] = digits[--k];
    static const char rest[] = "] the shared region file was truncated while in use; this "
                               "process refuses CUDA allocations from now on\n";
    memcpy(line + n, rest, sizeof rest - 1);
    ssize_t ignored = write(STDERR_FILENO, line, n + sizeof rest - 1);
    (void)ignored;
}

/* Not ours: to the previous handler; with none (SIG_DFL, or SIG_IGN, which the kernel overrides
 * for a fault), the default action is restored and the signal raised again, so that a sent
 * SIGBUS (raise, kill) kills as it would have, and a faulting access kills when it repeats. */
static void pass_on(int sig, siginfo_t *info, void *context)
{
    if (previous.sa_flags & SA_SIGINFO) {
        previous.sa_sigaction(sig, info, context);
    } else if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
        previous.sa_handler(sig);
    } else {
        struct sigaction fallback;
        memset(&fallback, 0, sizeof fallback);
        fallback.sa_handler = SIG_DFL;
        sigemptyset(&fallback.sa_mask);
        sigaction(SIGBUS, &fallback, NULL);
        sigset_t bus;
        sigemptyset(&bus);
        sigaddset(&bus, SIGBUS);
        pthread_sigmask(SIG_UNBLOCK, &bus, NULL);
        raise(SIGBUS);
    }
}

/* A truncation is an address error (BUS_ADRERR) at an address of the region's mapping; a
 * hardware memory error (BUS_MCEERR_*), an alignment fault or a sent SIGBUS is not. */
static int is_truncation(const siginfo_t *info)
{
    uintptr_t at = (uintptr_t)info->si_addr;
    return info->si_code == BUS_ADRERR && guard_len != 0 && at >= guard_start &&
           at - guard_start < guard_len;
}

static void on_sigbus(int sig, siginfo_t *info, void *context)
{
    if (!is_truncation(info)) {
        pass_on(sig, info, context);
        return;
    }
    int first = !__atomic_exchange_n(&seen, 1, __ATOMIC_SEQ_CST);
    void *m = mmap((void *)guard_start, guard_len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (m == MAP_FAILED) {
        pass_on(sig, info, context);
        return;
    }
    if (first)
        say_truncated();
}

int vgpu_truncation_guard(void *start, size_t len)
{
    guard_start = (uintptr_t)start;
    guard_len = len;
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_sigbus;
    action.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    return sigaction(SIGBUS, &action, &previous) == 0 ? 0 : -1;
}

int vgpu_truncation_seen(void) { return __atomic_load_n(&seen, __ATOMIC_ACQUIRE); }
