/* alloc_pairs.c - wall time of cuMemAlloc_v2 + cuMemFree_v2 pairs through whatever driver the
 * process has: the real one on a GPU (gpu-check.sh section 4), the fake in make test. Run it
 * bare and with libvgpu.so preloaded: the difference is what the library adds, measured against
 * the driver's own cost, which bench.c's figures (over the fake) leave out.
 *   alloc-pairs PROCS PAIRS BYTES
 * PROCS processes each make a context on device 0, wait for all the others (a barrier, so that
 * they contend as they would in one container), then time PAIRS pairs of BYTES back to back.
 * Prints the median and the largest per-process figure, in ns per pair. */
#ifndef _GNU_SOURCE /* TEST_CFLAGS define it */
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int (*init_fn)(unsigned);
typedef int (*device_fn)(int *, int);
typedef int (*retain_fn)(void **, int);
typedef int (*set_fn)(void *);
typedef int (*alloc_fn)(uint64_t *, size_t);
typedef int (*free_fn)(uint64_t);

struct shared {
    int ready;     /* processes past their set-up */
    double ns[];   /* each process's ns per pair */
};

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* The driver's function as the process sees it: libvgpu's export when it is preloaded. */
static void *entry(const char *name)
{
    void *f = dlsym(RTLD_DEFAULT, name);
    if (f == NULL)
        fprintf(stderr, "alloc-pairs: no %s\n", name);
    return f;
}

static int timed(struct shared *s, int me, int procs, long pairs, size_t bytes)
{
    if (dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL) == NULL) {
        fprintf(stderr, "alloc-pairs: %s\n", dlerror());
        return -1;
    }
    init_fn init = (init_fn)entry("cuInit");
    device_fn device = (device_fn)entry("cuDeviceGet");
    retain_fn retain = (retain_fn)entry("cuDevicePrimaryCtxRetain");
    set_fn set = (set_fn)entry("cuCtxSetCurrent");
    alloc_fn alloc = (alloc_fn)entry("cuMemAlloc_v2");
    free_fn release = (free_fn)entry("cuMemFree_v2");
    int dev;
    void *ctx;
    if (!init || !device || !retain || !set || !alloc || !release || init(0) != 0 ||
        device(&dev, 0) != 0 || retain(&ctx, dev) != 0 || set(ctx) != 0) {
        fprintf(stderr, "alloc-pairs: no context on device 0\n");
        return -1;
    }
    uint64_t p;
    for (long i = 0; i < pairs / 10 + 1; i++) /* warm-up: the driver's first allocations */
        if (alloc(&p, bytes) != 0 || release(p) != 0) {
            fprintf(stderr, "alloc-pairs: a warm-up pair failed\n");
            return -1;
        }
    __atomic_add_fetch(&s->ready, 1, __ATOMIC_ACQ_REL);
    /* Sleeping, not spinning: 32 processes on 16 cores must leave the cores to those still
     * making their contexts. */
    const struct timespec tick = {.tv_sec = 0, .tv_nsec = 1000000};
    while (__atomic_load_n(&s->ready, __ATOMIC_ACQUIRE) < procs)
        nanosleep(&tick, NULL);
    double t0 = now_ns();
    for (long i = 0; i < pairs; i++)
        if (alloc(&p, bytes) != 0 || release(p) != 0) {
            fprintf(stderr, "alloc-pairs: pair %ld failed\n", i);
            return -1;
        }
    s->ns[me] = (now_ns() - t0) / (double)pairs;
    return 0;
}

/* Lets every process past the barrier: one failed or will never arrive, and the others must
 * end rather than wait for it. */
static void release_all(struct shared *s, int procs)
{
    __atomic_add_fetch(&s->ready, procs, __ATOMIC_ACQ_REL);
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (argc != 4 || atoi(argv[1]) < 1 || atol(argv[2]) < 1 || atol(argv[3]) < 1) {
        fprintf(stderr, "usage: alloc-pairs PROCS PAIRS BYTES\n");
        return 2;
    }
    int procs = atoi(argv[1]);
    long pairs = atol(argv[2]);
    size_t bytes = (size_t)atol(argv[3]);
    struct shared *s = mmap(NULL, sizeof *s + sizeof(double) * (size_t)procs,
                            PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED) {
        perror("alloc-pairs: mmap");
        return 1;
    }
    int bad = 0, status;
    for (int i = 0; i < procs && !bad; i++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("alloc-pairs: fork");
            bad = 1;
            release_all(s, procs);
        } else if (pid == 0) {
            _exit(timed(s, i, procs, pairs, bytes) != 0);
        }
    }
    /* A process that failed, or was killed, before the barrier must not hold the rest there. */
    while (wait(&status) > 0)
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            bad = 1;
            release_all(s, procs);
        }
    if (bad) {
        fprintf(stderr, "alloc-pairs: a process failed\n");
        return 1;
    }
    qsort(s->ns, (size_t)procs, sizeof s->ns[0], by_value);
    printf("%d processes, %zu bytes: %.0f ns per pair (median), %.0f (max)\n", procs, bytes,
           s->ns[procs / 2], s->ns[procs - 1]);
    return 0;
}
