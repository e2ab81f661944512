/* bench.c - per-call overhead of libvgpu against the fake driver, interposed vs direct, in the
 * same process and run (run it with libvgpu.so preloaded; bench/run.sh does).
 *   bench calls        launch, alloc+free pair, cuMemGetInfo, a stream-ordered alloc+free
 *                      pair, a graph launch, a copy to the host through cuMemcpy: direct vs
 *                      interposed; under an SM limit, a launch and a copy (a drain) in turn,
 *                      then the launch again after a second thread launched once
 *   bench contexts     the launch of a kernel needing 2 KiB of stack a thread beside a second
 *                      context at the driver's default (1 KiB): every launch asks which
 *                      context it runs in
 *   bench scale N      N processes sharing one region, each timing alloc+free pairs
 * Direct calls go to the fake's own functions (fake_cuda_entry); interposed ones to the
 * exported wrappers. Each figure is the median of several alternating rounds. */
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fake_state.h"

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void **, void **);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*info_fn)(size_t *, size_t *);
typedef CUresult (*async_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*async_free_fn)(CUdeviceptr, CUstream);
typedef CUresult (*graph_launch_fn)(CUgraphExec, CUstream);
typedef CUresult (*copy_fn)(CUdeviceptr, CUdeviceptr, size_t);

enum { ROUNDS = 7 };

struct api {
    launch_fn launch;
    alloc_fn alloc;
    free_fn release;
    info_fn info;
    async_fn alloc_async;
    async_free_fn free_async;
    graph_launch_fn graph_launch;
    copy_fn copy;
    CUresult (*set_current)(CUcontext);
    CUresult (*record)(CUevent, CUstream);
    CUresult (*query)(CUevent);
};

static struct api direct, hooked;
static CUstream stream;  /* an explicit stream, as frameworks use */
static CUgraphExec exec; /* one kernel node, no allocation node */
static CUdeviceptr copied; /* 64 bytes of device memory */
static CUcontext primary; /* device 0's, current */
static CUevent event;     /* recorded on stream */

static double cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static char kernel_code; /* a kernel handle the fake takes (it runs no code) */

static double time_launch(const struct api *a, long n)
{
    CUfunction f = (CUfunction)(void *)&kernel_code;
    double t0 = cpu_ns();
    for (long i = 0; i < n; i++)
        a->launch(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
    return (cpu_ns() - t0) / (double)n;
}

static double time_pair(const struct api *a, long n)
{
    double t0 = cpu_ns();
    for (long i = 0; i < n; i++) {
        CUdeviceptr p;
        if (a->alloc(&p, 4096) == CUDA_SUCCESS)
            a->release(p);
    }
    return (cpu_ns() - t0) / (double)n;
}

static double time_async_pair(const struct api *a, long n)
{
    double t0 = cpu_ns();
    for (long i = 0; i < n; i++) {
        CUdeviceptr p;
        if (a->alloc_async(&p, 4096, stream) == CUDA_SUCCESS)
            a->free_async(p, stream);
    }
    return (cpu_ns() - t0) / (double)n;
}

static double time_graph_launch(const struct api *a, long n)
{
    double t0 = cpu_ns();
    for (long i = 0; i < n; i++)
        a->graph_launch(exec, stream);
    return (cpu_ns() - t0) / (double)n;
}

/* Under an SM limit the library asks the driver what both addresses are where the copy would
 * drain the default stream (cuda_sync.c): not here, after the graph launch's stream. */
static double time_copy(const struct api *a, long n)
{
    unsigned char host[64];
    double t0 = cpu_ns();
    for (long i = 0; i < n; i++)
        a->copy((CUdeviceptr)(uintptr_t)host, copied, sizeof host);
    return (cpu_ns() - t0) / (double)n;
}

/* cudaSetDevice's driver call: the primary context made current again. */
static double time_set_current(const struct api *a, long n)
{
    double t0 = cpu_ns();
    for (long i = 0; i < n; i++)
        a->set_current(primary);
    return (cpu_ns() - t0) / (double)n;
}

/* A light process's pattern: a kernel, then its result copied to the host, each copy a
 * drain under an SM limit (the library asks about both addresses every time). */
static double time_launch_copy(const struct api *a, long n)
{
    CUfunction f = (CUfunction)(void *)&kernel_code;
    unsigned char host[64];
    double t0 = cpu_ns();
    for (long i = 0; i < n; i++) {
        a->launch(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
        a->copy((CUdeviceptr)(uintptr_t)host, copied, sizeof host);
    }
    return (cpu_ns() - t0) / (double)n;
}

/* XLA's pattern: a kernel, an event recorded after it and asked about; under an SM limit
 * each record is counted and kept (with two GPUs it asks the driver for the stream's device),
 * and each query that finds it done is a drain (cuda_sync.c). */
static double time_launch_event(const struct api *a, long n)
{
    CUfunction f = (CUfunction)(void *)&kernel_code;
    double t0 = cpu_ns();
    for (long i = 0; i < n; i++) {
        a->launch(f, 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL);
        a->record(event, stream);
        a->query(event);
    }
    return (cpu_ns() - t0) / (double)n;
}

static double time_info(const struct api *a, long n)
{
    double t0 = cpu_ns();
    size_t f, t;
    for (long i = 0; i < n; i++)
        a->info(&f, &t);
    return (cpu_ns() - t0) / (double)n;
}

static int by_value(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

/* Median over ROUNDS alternating rounds of direct and interposed timings. */
static void compare(const char *what, double (*timer)(const struct api *, long), long n)
{
    double d[ROUNDS], h[ROUNDS];
    timer(&hooked, n / 10); /* warm up: first-call initialisation is not overhead */
    for (int r = 0; r < ROUNDS; r++) {
        d[r] = timer(&direct, n);
        h[r] = timer(&hooked, n);
    }
    qsort(d, ROUNDS, sizeof d[0], by_value);
    qsort(h, ROUNDS, sizeof h[0], by_value);
    printf("%-34s direct %8.1f ns  interposed %8.1f ns  added %7.1f ns\n", what, d[ROUNDS / 2],
           h[ROUNDS / 2], h[ROUNDS / 2] - d[ROUNDS / 2]);
}

static void setup(void)
{
    direct.launch = (launch_fn)fake_cuda_entry("cuLaunchKernel");
    direct.alloc = (alloc_fn)fake_cuda_entry("cuMemAlloc_v2");
    direct.release = (free_fn)fake_cuda_entry("cuMemFree_v2");
    direct.info = (info_fn)fake_cuda_entry("cuMemGetInfo_v2");
    hooked.launch = (launch_fn)dlsym(RTLD_DEFAULT, "cuLaunchKernel");
    hooked.alloc = (alloc_fn)dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
    hooked.release = (free_fn)dlsym(RTLD_DEFAULT, "cuMemFree_v2");
    hooked.info = (info_fn)dlsym(RTLD_DEFAULT, "cuMemGetInfo_v2");
    direct.alloc_async = (async_fn)fake_cuda_entry("cuMemAllocAsync");
    direct.free_async = (async_free_fn)fake_cuda_entry("cuMemFreeAsync");
    direct.graph_launch = (graph_launch_fn)fake_cuda_entry("cuGraphLaunch");
    hooked.alloc_async = (async_fn)dlsym(RTLD_DEFAULT, "cuMemAllocAsync");
    hooked.free_async = (async_free_fn)dlsym(RTLD_DEFAULT, "cuMemFreeAsync");
    hooked.graph_launch = (graph_launch_fn)dlsym(RTLD_DEFAULT, "cuGraphLaunch");
    direct.copy = (copy_fn)fake_cuda_entry("cuMemcpy");
    hooked.copy = (copy_fn)dlsym(RTLD_DEFAULT, "cuMemcpy");
    direct.set_current = (CUresult(*)(CUcontext))fake_cuda_entry("cuCtxSetCurrent");
    hooked.set_current = (CUresult(*)(CUcontext))dlsym(RTLD_DEFAULT, "cuCtxSetCurrent");
    direct.record = (CUresult(*)(CUevent, CUstream))fake_cuda_entry("cuEventRecord");
    hooked.record = (CUresult(*)(CUevent, CUstream))dlsym(RTLD_DEFAULT, "cuEventRecord");
    direct.query = (CUresult(*)(CUevent))fake_cuda_entry("cuEventQuery");
    hooked.query = (CUresult(*)(CUevent))dlsym(RTLD_DEFAULT, "cuEventQuery");
    if (hooked.launch == direct.launch) {
        fprintf(stderr, "bench: libvgpu.so is not preloaded\n");
        exit(2);
    }
    cuInit(0);
    cuDevicePrimaryCtxRetain(&primary, 0);
    cuCtxSetCurrent(primary);
    CUgraph graph;
    CUgraphNode node;
    CUDA_KERNEL_NODE_PARAMS k = {.gridDimX = 1, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 32,
                                 .blockDimY = 1, .blockDimZ = 1};
    if (cuStreamCreate(&stream, 0) != CUDA_SUCCESS || cuMemAlloc(&copied, 64) != CUDA_SUCCESS ||
        cuEventCreate(&event, 0) != CUDA_SUCCESS ||
        cuGraphCreate(&graph, 0) != CUDA_SUCCESS ||
        cuGraphAddKernelNode(&node, graph, NULL, 0, &k) != CUDA_SUCCESS ||
        cuGraphInstantiateWithFlags(&exec, graph, 0) != CUDA_SUCCESS) {
        fprintf(stderr, "bench: cannot make a stream, an allocation, an event and a graph\n");
        exit(2);
    }
}

static int scale(int procs, long n)
{
    double *added = mmap(NULL, sizeof(double) * (size_t)procs, PROT_READ | PROT_WRITE,
                         MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    for (int i = 0; i < procs; i++) {
        if (fork() == 0) {
            setup();
            time_pair(&hooked, n / 10);
            double h = 0, d = 0;
            for (int r = 0; r < 3; r++) {
                d += time_pair(&direct, n);
                h += time_pair(&hooked, n);
            }
            added[i] = (h - d) / 3;
            exit(0);
        }
    }
    for (int i = 0; i < procs; i++)
        wait(NULL);
    qsort(added, (size_t)procs, sizeof added[0], by_value);
    printf("alloc+free pair, %2d processes:     added per pair: median %7.1f ns, max %7.1f ns\n",
           procs, added[procs / 2], added[procs - 1]);
    return 0;
}

/* The primary context's stack raised to 2 KiB by the kernel (its first launch), a created
 * context beside it at the default: the launches above the floor (1 KiB), of a kernel the
 * context already holds. */
static int contexts(void)
{
    CUcontext primary, second;
    fake_cuda_local_bytes = 2048;
    if (cuCtxGetCurrent(&primary) != CUDA_SUCCESS ||
        cuCtxCreate(&second, 0, 0) != CUDA_SUCCESS || cuCtxSetCurrent(primary) != CUDA_SUCCESS ||
        cuLaunchKernel((CUfunction)(void *)&kernel_code, 1, 1, 1, 32, 1, 1, 0, NULL, NULL,
                       NULL) != CUDA_SUCCESS) {
        fprintf(stderr, "bench: cannot make a second context and raise the first's stack\n");
        return 2;
    }
    compare("cuLaunchKernel (2 KiB stack, 2 contexts)", time_launch, 2000000);
    return 0;
}

static void *launch_once(void *ctx)
{
    cuCtxSetCurrent(ctx);
    hooked.launch((CUfunction)(void *)&kernel_code, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
    return NULL;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "calls";
    if (strcmp(mode, "scale") == 0)
        return scale(argc > 2 ? atoi(argv[2]) : 1, argc > 3 ? atol(argv[3]) : 200000);
    setup();
    if (strcmp(mode, "contexts") == 0)
        return contexts();
    const char *limit = getenv("CUDA_DEVICE_SM_LIMIT");
    const char *gpus = getenv("FAKE_CUDA_DEVICES"); /* the fake's default: 2 */
    char label[64];
    snprintf(label, sizeof label, "cuLaunchKernel (SM limit %s, GPUs %s)", limit ? limit : "none",
             gpus ? gpus : "2");
    if (limit != NULL) /* let the limiter calibrate before timing */
        for (double end = now_s() + 1.2; now_s() < end;)
            time_launch(&hooked, 10000);
    compare(label, time_launch, 2000000);
    if (limit == NULL) {
        compare("cuMemAlloc_v2 + cuMemFree_v2 (4 KiB)", time_pair, 300000);
        compare("cuMemGetInfo_v2", time_info, 1000000);
        compare("cuMemAllocAsync + cuMemFreeAsync", time_async_pair, 300000);
        /* Later: once a stream-ordered allocation was counted, each free asks which pool, if
         * any, the pointer came from (cuda_memory.c, may_be_pooled). */
        compare("cuMemAlloc_v2 + cuMemFree_v2, later", time_pair, 300000);
    }
    compare("cuGraphLaunch (1 kernel node)", time_graph_launch, 1000000);
    compare("cuMemcpy to the host (64 B)", time_copy, 300000);
    compare("cuCtxSetCurrent (the primary context)", time_set_current, 2000000);
    /* The graph's stream above stopped drains of a stream: a context's synchronisation starts
     * them again. */
    if (limit != NULL && cuCtxSynchronize() == CUDA_SUCCESS)
        compare("cuLaunchKernel + copy to the host", time_launch_copy, 300000);
    /* ... and again for the launches on `stream` after those on the default one. */
    if (limit == NULL || cuCtxSynchronize() == CUDA_SUCCESS)
        compare("cuLaunchKernel + event record, query", time_launch_event, 300000);
    /* A second thread's launch makes the limiter's launcher "several" for good (a PyTorch
     * process launches from its autograd thread too): every launch after it is timed so. */
    CUcontext ctx;
    pthread_t thread;
    if (limit != NULL && cuCtxGetCurrent(&ctx) == CUDA_SUCCESS &&
        pthread_create(&thread, NULL, launch_once, ctx) == 0 && pthread_join(thread, NULL) == 0) {
        snprintf(label, sizeof label, "cuLaunchKernel (SM limit %s, 2 threads)", limit);
        compare(label, time_launch, 2000000);
    }
    return 0;
}
