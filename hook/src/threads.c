/* threads.c - the library's own threads (threads.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "threads.h"

#include <pthread.h>
#include <signal.h>

int vgpu_thread_start(void *(*fn)(void *))
{
    sigset_t blocked, caller;
    sigfillset(&blocked);
    const int faults[] = {SIGBUS, SIGSEGV, SIGFPE, SIGILL, SIGTRAP, SIGSYS};
    for (unsigned i = 0; i < sizeof faults / sizeof faults[0]; i++)
        sigdelset(&blocked, faults[i]);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    /* A new thread starts with its creator's mask: the caller's is set back at once after. */
    pthread_sigmask(SIG_SETMASK, &blocked, &caller);
    pthread_t thread;
    int rc = pthread_create(&thread, &attr, fn, NULL);
    pthread_sigmask(SIG_SETMASK, &caller, NULL);
    pthread_attr_destroy(&attr);
    return rc;
}
