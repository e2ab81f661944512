/* threads.h - the library's own threads (the SM limiter's watcher and its NVML sampler). */
#ifndef VGPU_THREADS_H
#define VGPU_THREADS_H

/* Starts fn, detached, with every signal blocked but those a fault raises in the thread itself
 * (SIGBUS: the region truncated, SIGSEGV, SIGFPE, SIGILL, SIGTRAP, SIGSYS; one blocked when its
 * own thread faults kills the process, past the truncation guard): a handler of the
 * application's must not run on a thread that holds the library's locks at times (a CUDA call
 * of the handler's would wait on them for ever), and the application's own threads are the
 * ones it expects its process-directed signals on. Returns pthread_create's answer. */
int vgpu_thread_start(void *(*fn)(void *));

#endif
