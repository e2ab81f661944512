/* test_throttle.c - the SM limiter over the fake driver's synthetic utilisation: each launch
 * of 2000 blocks is 2 ms of "GPU time" (FAKE_CUDA_NS_PER_BLOCK=1000), and the loop keeps the
 * GPU busy when nothing holds it back. argv[1] is the limit the environment sets ("none" for
 * no limit); the measured busy share after a settling time must be within 5 points of it.
 * The loop rotates through every launch variant, so each one must be gated. First, a CUDA graph
 * whose cost cannot be read for want of host memory: refused under a limit (it would run at one
 * token a launch), left alone without one. With "while" after the limit: graphs with a
 * conditional WHILE node instead (while_graphs); with "burst": a light load, then large kernels
 * (burst_after_light_load); with "siblings": two processes of one container (siblings); with
 * "nothread": the limiter's thread cannot be made at first (without_a_thread); with
 * "nosampler": its NVML thread never can (without_a_sampler); with "idle-bursts": bursts of
 * kernels after idle time (bursts_after_idle), with "tail-bursts" and "small-tail-bursts" a lone
 * kernel after each (bursts_with_a_tail, bursts_with_a_small_tail); with
 * "second-gpu": two GPUs, a limit on the second alone (limit_on_second_gpu); with "drain CASE":
 * what a process prepays after a synchronisation (drained). */
#include <cuda.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <time.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nvml.h>

#include "check.h"
#include "cuda_13.h" /* cuCtxSynchronize_v2, called by name */
#include "fake_state.h"
#include "region_view.h"

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void **, void **);
typedef CUresult (*coop_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                            unsigned, unsigned, CUstream, void **);
typedef CUresult (*launch_ex_fn)(const CUlaunchConfig *, CUfunction, void **, void **);

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Device dev's primary context, current on this thread. */
static void use_device(int dev)
{
    CUcontext ctx;
    cuInit(0);
    cuDevicePrimaryCtxRetain(&ctx, dev);
    cuCtxSetCurrent(ctx);
}

/* calloc for the whole process, libvgpu's included, so that one of libvgpu's allocations can be
 * made to fail: the list of a graph's nodes (ODD_NODES of them) or the first table of executable
 * graphs (src/graphs.c: 64 entries of 48 bytes). Each check asserts that its failure fired.
 * malloc and memset keep each allocation with the allocator that frees it (the sanitizer's under
 * make asan). */
enum { ODD_NODES = 13, FIRST_TABLE = 64, TABLE_ENTRY = 48 };
static size_t fail_n, fail_size; /* the next calloc(fail_n, fail_size) fails; 0: none */

void *calloc(size_t n, size_t size)
{
    if (size != 0 && n > SIZE_MAX / size)
        return NULL;
    if (fail_n != 0 && n == fail_n && size == fail_size) {
        fail_n = 0;
        return NULL;
    }
    /* Through a volatile pointer: the compiler would turn malloc + memset into calloc. */
    static void *(*volatile allocate)(size_t) = malloc;
    void *p = allocate(n * size);
    return p != NULL ? memset(p, 0, n * size) : NULL;
}

static void arm(size_t n, size_t size) { fail_n = n, fail_size = size; }

static int fired(void)
{
    int yes = fail_n == 0;
    fail_n = 0;
    return yes;
}

/* Runs first: the table of executable graphs is made at the first graph remembered. */
static void graph_without_memory(int limited)
{
    CUgraph g;
    CUgraphNode node;
    CUDA_KERNEL_NODE_PARAMS k = {.gridDimX = 1, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 1,
                                 .blockDimY = 1, .blockDimZ = 1};
    int made = cuGraphCreate(&g, 0) == CUDA_SUCCESS;
    for (int n = 0; made && n < ODD_NODES; n++)
        made = cuGraphAddKernelNode(&node, g, NULL, 0, &k) == CUDA_SUCCESS;
    uint64_t live = fake_cuda_stats.graph_execs;
    CUgraphExec exec = NULL;
    arm(ODD_NODES, sizeof(CUgraphNode));
    CUresult rc = cuGraphInstantiateWithFlags(&exec, g, 0);
    int tried = fired();
    if (!limited) {
        check(made && rc == CUDA_SUCCESS && exec != NULL && !tried,
              "no limit: a graph's cost is not read, so nothing to fail");
        return;
    }
    check(made && rc == CUDA_ERROR_OUT_OF_MEMORY && tried && fake_cuda_stats.graph_execs == live,
          "no host memory to read a graph's kernels: not instantiated, the driver never asked");
    arm(FIRST_TABLE, TABLE_ENTRY);
    rc = cuGraphInstantiateWithFlags(&exec, g, 0);
    tried = fired();
    check(rc == CUDA_ERROR_OUT_OF_MEMORY && exec == NULL && tried &&
              fake_cuda_stats.graph_execs == live,
          "no host memory to keep its cost: the driver's executable graph destroyed again");
    rc = cuGraphInstantiateWithFlags(&exec, g, 0);
    CUgraphExecUpdateResultInfo info;
    arm(ODD_NODES, sizeof(CUgraphNode));
    CUresult update = cuGraphExecUpdate(exec, g, &info);
    tried = fired();
    check(rc == CUDA_SUCCESS && update == CUDA_ERROR_OUT_OF_MEMORY && tried &&
              fake_cuda_graph_exec_blocks(exec) == ODD_NODES &&
              fake_cuda_stats.graph_execs == live + 1 && cuGraphExecDestroy(exec) == CUDA_SUCCESS,
          "... and an update answers CUDA_ERROR_OUT_OF_MEMORY, the driver never asked");
}

static launch_fn launch_ptsz;
static coop_fn coop_ptsz;
static launch_ex_fn ex_ptsz;

static CUresult (*launch_grid)(CUfunction, int, int);
static CUresult (*launch_grid_async)(CUfunction, int, int, CUstream);
static CUresult (*launch_multi_device)(CUDA_LAUNCH_PARAMS *, unsigned int, unsigned int);
enum { VARIANTS = 9 };

/* A stream of this thread's current context: cuda.h allows no default stream in a multi-device
 * launch (the fake refuses one, as the driver does). */
static CUstream own_stream(void)
{
    static __thread CUstream stream;
    static __thread CUcontext made_in;
    CUcontext ctx = NULL;
    cuCtxGetCurrent(&ctx);
    if (stream == NULL || ctx != made_in) {
        cuStreamCreate(&stream, 0);
        made_in = ctx;
    }
    return stream;
}

/* One kernel of 2000 blocks through variant i % VARIANTS, then wait for the GPU like a training
 * step. */
static void step(unsigned i)
{
    CUlaunchConfig config = {.gridDimX = 2000, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 128,
                             .blockDimY = 1, .blockDimZ = 1};
    CUDA_LAUNCH_PARAMS multi = {.gridDimX = 1000, .gridDimY = 2, .gridDimZ = 1, .blockDimX = 128,
                                .blockDimY = 1, .blockDimZ = 1,
                                .hStream = i % VARIANTS == VARIANTS - 1 ? own_stream() : NULL};
    switch (i % VARIANTS) {
    case 0: cuLaunchKernel(NULL, 2000, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL); break;
    case 1: launch_ptsz(NULL, 2000, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL); break;
    case 2: cuLaunchKernelEx(&config, NULL, NULL, NULL); break;
    case 3: ex_ptsz(&config, NULL, NULL, NULL); break;
    case 4: cuLaunchCooperativeKernel(NULL, 200, 10, 1, 128, 1, 1, 0, NULL, NULL); break;
    case 5: coop_ptsz(NULL, 2000, 1, 1, 128, 1, 1, 0, NULL, NULL); break;
    case 6: launch_grid(NULL, 2000, 1); break;
    case 7: launch_grid_async(NULL, 1000, 2, NULL); break;
    default: launch_multi_device(&multi, 1, 0); break;
    }
    cuCtxSynchronize();
}

/* Busy share of device 0 over `seconds` of the loop, in percent. stride 1 rotates through the
 * variants; stride VARIANTS repeats the variant *i % VARIANTS. */
static double run_for(double seconds, unsigned *i, unsigned stride)
{
    uint64_t busy0 = fake_cuda_busy_ns(0);
    double t0 = now_s();
    for (; now_s() - t0 < seconds; *i += stride)
        step(*i);
    cuCtxSynchronize();
    return 100.0 * (double)(fake_cuda_busy_ns(0) - busy0) / ((now_s() - t0) * 1e9);
}

/* pthread_create for the whole process, libvgpu's included: EAGAIN until threads_fail_until
 * (now_s), or once threads_made reaches threads_allowed (0: no bound), as under an RLIMIT_AS
 * or RLIMIT_NPROC a process may set on itself; threads_tried counts the calls. Only
 * "nothread" and "nosampler" set them (this test makes no thread of its own). */
static double threads_fail_until;
static unsigned threads_tried, threads_made, threads_allowed;

int pthread_create(pthread_t *thread, const pthread_attr_t *attr, void *(*run)(void *),
                   void *arg)
{
    typedef int (*create_fn)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
    static create_fn real;
    __atomic_add_fetch(&threads_tried, 1, __ATOMIC_SEQ_CST);
    if (now_s() < threads_fail_until)
        return EAGAIN;
    /* Counted before it runs, never past the bound: the limiter's thread makes the NVML thread
     * at once, and counted after, that one was let through too when it came first (2 made in
     * one make test). */
    unsigned made = __atomic_load_n(&threads_made, __ATOMIC_SEQ_CST);
    do {
        if (threads_allowed != 0 && made >= threads_allowed)
            return EAGAIN;
    } while (!__atomic_compare_exchange_n(&threads_made, &made, made + 1, 0, __ATOMIC_SEQ_CST,
                                          __ATOMIC_SEQ_CST));
    create_fn create = __atomic_load_n(&real, __ATOMIC_ACQUIRE);
    if (create == NULL) {
        create = (create_fn)dlsym(RTLD_NEXT, "pthread_create");
        __atomic_store_n(&real, create, __ATOMIC_RELEASE);
    }
    int rc = create != NULL ? create(thread, attr, run, arg) : EAGAIN;
    if (rc != 0)
        __atomic_sub_fetch(&threads_made, 1, __ATOMIC_SEQ_CST);
    return rc;
}

/* The limiter's thread cannot be made for the first second. Before, every launch of that
 * second ran at once on the uncalibrated start's tokens, unthrottled (the first waited 0.00 s),
 * and would for as long as creation failed. Now they wait, the thread is tried again, and once
 * it runs the limit holds. */
static void without_a_thread(double limit)
{
    use_device(0);
    double t0 = now_s();
    threads_fail_until = t0 + 1.0;
    cuLaunchKernel(NULL, 2000, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
    double waited = now_s() - t0;
    check(waited >= 0.9 && threads_tried >= 3, "no thread for the SM limiter for 1 s: the first "
          "launch waited %.2f s, the thread was tried %u times", waited, threads_tried);
    unsigned i = 0; /* variant 0, cuLaunchKernel: the others are looked up in main */
    run_for(2.0, &i, VARIANTS); /* settle */
    double util = run_for(2.0, &i, VARIANTS);
    check(fabs(util - limit) <= 5.0, "limit %.0f%%: once the thread ran, %.1f%% after 2 s",
          limit, util);
}

/* Bursts after idle time (an inference server between batches of requests): idle_s without a
 * launch, then 0.4 s of back-to-back 2 ms kernels, six times; with tail_blocks, one more kernel
 * of that many blocks 0.3 s after each burst (a lone launch after the batch). The first three
 * bursts, in which the rate is calibrated, are not measured (the first ran at 38-61 %, the
 * second at 17-47 %, the third at 20-29 %). Each of the others asks for the whole GPU, so none
 * may get 5 points under the limit or 10 over it, and their mean must be within 5 points over
 * it (a step lags a sample period or two). The rate was cut to twice the demand of a period
 * that ended in idle time, a tenth of the burst's (src/control.h): under 20, from the third
 * burst on, 1.8-19.4 % with a tail of 2000 blocks and 3.2-13.8 % with one of 100 (a tail makes
 * such a period follow every burst), and without one, in 2 runs of 33 (a burst that ended just
 * after a step), a burst got 3.7 and 4.1 %. */
static void bursts(double limit, double idle_s, unsigned tail_blocks)
{
    enum { BURSTS = 6, MEASURED_FROM = 3 };
    use_device(0);
    double least = 100, most = 0, sum = 0;
    for (int burst = 0; burst < BURSTS; burst++) {
        sleep_s(burst == 0 ? 0.0 : idle_s);
        uint64_t busy0 = fake_cuda_busy_ns(0);
        double t0 = now_s();
        while (now_s() - t0 < 0.4) {
            cuLaunchKernel(NULL, 2000, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
            cuCtxSynchronize();
        }
        double share = 100.0 * (double)(fake_cuda_busy_ns(0) - busy0) / ((now_s() - t0) * 1e9);
        printf("# burst %d: %.1f%% of the GPU\n", burst, share);
        if (burst >= MEASURED_FROM) {
            sum += share;
            least = share < least ? share : least;
            most = share > most ? share : most;
        }
        if (tail_blocks != 0) {
            sleep_s(0.3);
            cuLaunchKernel(NULL, tail_blocks, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
            cuCtxSynchronize();
        }
    }
    char tail[64] = "";
    if (tail_blocks != 0)
        snprintf(tail, sizeof tail, " (and a kernel of %u blocks 0.3 s after each)", tail_blocks);
    double mean = sum / (BURSTS - MEASURED_FROM);
    check(least >= limit - 5.0 && mean <= limit + 5.0 && most <= limit + 10.0,
          "limit %.0f%%: 0.4 s bursts after %.0f s idle%s, from the fourth on %.1f-%.1f%%, %.1f%% "
          "on average", limit, idle_s, tail, least, most, mean);
}

static void bursts_after_idle(double limit)
{
    bursts(limit, 3.0, 0);
}

static void bursts_with_a_tail(double limit)
{
    bursts(limit, 1.0, 2000);
}

/* ... a tail of 100 blocks, a twentieth of what a tick refills under 20. */
static void bursts_with_a_small_tail(double limit)
{
    bursts(limit, 1.0, 100);
}

/* Only the limiter's own thread can be made, never its NVML thread (src/sampler.c): NVML is
 * read on the limiter's thread, which tries to make the other at every reading, and the limit
 * holds. */
static void without_a_sampler(double limit)
{
    use_device(0);
    threads_allowed = 1;
    unsigned i = 0;
    run_for(2.0, &i, VARIANTS); /* settle */
    double util = run_for(2.0, &i, VARIANTS);
    unsigned made = __atomic_load_n(&threads_made, __ATOMIC_SEQ_CST);
    unsigned tried = __atomic_load_n(&threads_tried, __ATOMIC_SEQ_CST);
    check(made == 1 && tried >= 20, "no thread for NVML: %u made, %u tried in 4 s (the "
          "limiter's, then the NVML thread's at every reading)", made, tried);
    check(fabs(util - limit) <= 5.0, "limit %.0f%%: NVML read on the limiter's thread, %.1f%% "
          "after 2 s", limit, util);
}

/* An application that ends more NVML inits than it made (pynvml's nvmlShutdown called twice,
 * or a process that means to blind the limiter), after its context made the library take its
 * own: the library's stays, and the limit holds (before, every reading failed from then on and
 * the uncalibrated start's tokens let everything through: 94 % under a limit of 25). */
static void nvml_shutdown(double limit)
{
    typedef nvmlReturn_t (*nvml_fn)(void);
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    nvml_fn init = lib != NULL ? (nvml_fn)dlsym(lib, "nvmlInit_v2") : NULL;
    nvml_fn init_v1 = lib != NULL ? (nvml_fn)dlsym(lib, "nvmlInit") : NULL;
    nvmlReturn_t (*init_flags)(unsigned int) =
        lib != NULL ? (nvmlReturn_t(*)(unsigned int))dlsym(lib, "nvmlInitWithFlags") : NULL;
    nvml_fn shutdown = lib != NULL ? (nvml_fn)dlsym(lib, "nvmlShutdown") : NULL;
    if (!check(init != NULL && init_v1 != NULL && init_flags != NULL && shutdown != NULL,
               "NVML's inits and shutdown found"))
        return;
    use_device(0); /* the library reads NVML's process list around the context */
    nvmlReturn_t first = init(), second = shutdown(), third = shutdown();
    check(first == NVML_SUCCESS && second == NVML_SUCCESS && third == NVML_ERROR_UNINITIALIZED,
          "one init, two shutdowns: the second answers NVML_ERROR_UNINITIALIZED (%d, %d, %d)",
          first, second, third);
    nvmlReturn_t inits[2] = {init_v1(), init_flags(0)};
    nvmlReturn_t downs[3] = {shutdown(), shutdown(), shutdown()};
    check(inits[0] == NVML_SUCCESS && inits[1] == NVML_SUCCESS && downs[0] == NVML_SUCCESS &&
              downs[1] == NVML_SUCCESS && downs[2] == NVML_ERROR_UNINITIALIZED,
          "nvmlInit (NVML's first ABI) and nvmlInitWithFlags count too: a third shutdown after "
          "them answers NVML_ERROR_UNINITIALIZED (%d %d; %d %d %d)", inits[0], inits[1], downs[0],
          downs[1], downs[2]);
    unsigned i = 0;
    run_for(2.0, &i, VARIANTS); /* settle */
    double util = run_for(2.0, &i, VARIANTS);
    check(fabs(util - limit) <= 5.0, "limit %.0f%%: %.1f%% of the GPU over 2 s", limit, util);
    third = shutdown(); /* and once the limiter runs */
    util = run_for(2.0, &i, VARIANTS);
    check(third == NVML_ERROR_UNINITIALIZED && fabs(util - limit) <= 5.0, "another shutdown once "
          "launching (%d): %.1f%% over the next 2 s", third, util);
}

/* NVML never answers a utilisation query (FAKE_NVML_UTIL_FAILS, set by tests/run.sh): each
 * period the process's work may run in is charged as the whole GPU's, and the account's hold
 * keeps it to the limit (before: free for good, 94 % under a limit of 25), after a light start
 * too (calibrated by that start's blocks, a first version held the load after it at 0.5 %). */
static void nvml_blind(double limit)
{
    use_device(0);
    unsigned i = 0;
    run_for(2.0, &i, VARIANTS); /* settle */
    double util = run_for(4.0, &i, VARIANTS);
    check(fabs(util - limit) <= 5.0, "limit %.0f%%, no NVML reading at all: %.1f%% of the GPU "
          "over 4 s", limit, util);
}

/* Each memset export (30: CUDA 2.0's, _v2, _v2_ptds, Async and Async_ptsz of D8, D16, D32 and
 * their 2D forms), named through dlsym (cuGetProcAddress is checked to answer the same), sets
 * `bytes` at p: 0 when the driver took it. */
struct memset_way {
    const char *name, *base; /* the export, and the name cuGetProcAddress is asked */
    int version, per_thread; /* the CUDA version its ABI is answered from */
    int width, v1, d2, async;
};

static CUresult set_memory(const struct memset_way *w, void *f, CUdeviceptr p, size_t bytes)
{
    size_t n = bytes / (size_t)w->width, rows = 16, pitch = bytes / rows, cols = n / rows;
    unsigned v1p = (unsigned)p;
    if (w->v1 && !w->d2) {
        return w->width == 1 ? ((CUresult(*)(unsigned, unsigned char, unsigned))f)(v1p, 0, n)
             : w->width == 2 ? ((CUresult(*)(unsigned, unsigned short, unsigned))f)(v1p, 0, n)
                             : ((CUresult(*)(unsigned, unsigned, unsigned))f)(v1p, 0, n);
    }
    if (w->v1) {
        return w->width == 1
                   ? ((CUresult(*)(unsigned, unsigned, unsigned char, unsigned, unsigned))f)(
                         v1p, pitch, 0, cols, rows)
               : w->width == 2
                   ? ((CUresult(*)(unsigned, unsigned, unsigned short, unsigned, unsigned))f)(
                         v1p, pitch, 0, cols, rows)
                   : ((CUresult(*)(unsigned, unsigned, unsigned, unsigned, unsigned))f)(
                         v1p, pitch, 0, cols, rows);
    }
    if (!w->d2 && !w->async) {
        return w->width == 1 ? ((CUresult(*)(CUdeviceptr, unsigned char, size_t))f)(p, 0, n)
             : w->width == 2 ? ((CUresult(*)(CUdeviceptr, unsigned short, size_t))f)(p, 0, n)
                             : ((CUresult(*)(CUdeviceptr, unsigned, size_t))f)(p, 0, n);
    }
    if (!w->d2) {
        return w->width == 1
                   ? ((CUresult(*)(CUdeviceptr, unsigned char, size_t, CUstream))f)(p, 0, n, NULL)
               : w->width == 2
                   ? ((CUresult(*)(CUdeviceptr, unsigned short, size_t, CUstream))f)(p, 0, n, NULL)
                   : ((CUresult(*)(CUdeviceptr, unsigned, size_t, CUstream))f)(p, 0, n, NULL);
    }
    if (!w->async) {
        return w->width == 1
                   ? ((CUresult(*)(CUdeviceptr, size_t, unsigned char, size_t, size_t))f)(
                         p, pitch, 0, cols, rows)
               : w->width == 2
                   ? ((CUresult(*)(CUdeviceptr, size_t, unsigned short, size_t, size_t))f)(
                         p, pitch, 0, cols, rows)
                   : ((CUresult(*)(CUdeviceptr, size_t, unsigned, size_t, size_t))f)(
                         p, pitch, 0, cols, rows);
    }
    return w->width == 1
               ? ((CUresult(*)(CUdeviceptr, size_t, unsigned char, size_t, size_t, CUstream))f)(
                     p, pitch, 0, cols, rows, NULL)
           : w->width == 2
               ? ((CUresult(*)(CUdeviceptr, size_t, unsigned short, size_t, size_t, CUstream))f)(
                     p, pitch, 0, cols, rows, NULL)
               : ((CUresult(*)(CUdeviceptr, size_t, unsigned, size_t, size_t, CUstream))f)(
                     p, pitch, 0, cols, rows, NULL);
}

/* A memset is a kernel the driver writes: under a limit each export passes the gate. Before,
 * a container that only set memory ran free (the library of edbb684: up to 95.7 % of the GPU
 * under 25). 8 MiB a memset, 2048 of the fake's 4 KiB blocks (2 ms), each
 * waited for; every export for 0.8 s in turn after 2 s of the first. */
static void memsets(double limit)
{
    static const struct memset_way ways[] = {
        {"cuMemsetD8", "cuMemsetD8", 2000, 0, 1, 1, 0, 0},
        {"cuMemsetD8_v2", "cuMemsetD8", 3020, 0, 1, 0, 0, 0},
        {"cuMemsetD8_v2_ptds", "cuMemsetD8", 7000, 1, 1, 0, 0, 0},
        {"cuMemsetD8Async", "cuMemsetD8Async", 3020, 0, 1, 0, 0, 1},
        {"cuMemsetD8Async_ptsz", "cuMemsetD8Async", 7000, 1, 1, 0, 0, 1},
        {"cuMemsetD2D8", "cuMemsetD2D8", 2000, 0, 1, 1, 1, 0},
        {"cuMemsetD2D8_v2", "cuMemsetD2D8", 3020, 0, 1, 0, 1, 0},
        {"cuMemsetD2D8_v2_ptds", "cuMemsetD2D8", 7000, 1, 1, 0, 1, 0},
        {"cuMemsetD2D8Async", "cuMemsetD2D8Async", 3020, 0, 1, 0, 1, 1},
        {"cuMemsetD2D8Async_ptsz", "cuMemsetD2D8Async", 7000, 1, 1, 0, 1, 1},
        {"cuMemsetD16", "cuMemsetD16", 2000, 0, 2, 1, 0, 0},
        {"cuMemsetD16_v2", "cuMemsetD16", 3020, 0, 2, 0, 0, 0},
        {"cuMemsetD16_v2_ptds", "cuMemsetD16", 7000, 1, 2, 0, 0, 0},
        {"cuMemsetD16Async", "cuMemsetD16Async", 3020, 0, 2, 0, 0, 1},
        {"cuMemsetD16Async_ptsz", "cuMemsetD16Async", 7000, 1, 2, 0, 0, 1},
        {"cuMemsetD2D16", "cuMemsetD2D16", 2000, 0, 2, 1, 1, 0},
        {"cuMemsetD2D16_v2", "cuMemsetD2D16", 3020, 0, 2, 0, 1, 0},
        {"cuMemsetD2D16_v2_ptds", "cuMemsetD2D16", 7000, 1, 2, 0, 1, 0},
        {"cuMemsetD2D16Async", "cuMemsetD2D16Async", 3020, 0, 2, 0, 1, 1},
        {"cuMemsetD2D16Async_ptsz", "cuMemsetD2D16Async", 7000, 1, 2, 0, 1, 1},
        {"cuMemsetD32", "cuMemsetD32", 2000, 0, 4, 1, 0, 0},
        {"cuMemsetD32_v2", "cuMemsetD32", 3020, 0, 4, 0, 0, 0},
        {"cuMemsetD32_v2_ptds", "cuMemsetD32", 7000, 1, 4, 0, 0, 0},
        {"cuMemsetD32Async", "cuMemsetD32Async", 3020, 0, 4, 0, 0, 1},
        {"cuMemsetD32Async_ptsz", "cuMemsetD32Async", 7000, 1, 4, 0, 0, 1},
        {"cuMemsetD2D32", "cuMemsetD2D32", 2000, 0, 4, 1, 1, 0},
        {"cuMemsetD2D32_v2", "cuMemsetD2D32", 3020, 0, 4, 0, 1, 0},
        {"cuMemsetD2D32_v2_ptds", "cuMemsetD2D32", 7000, 1, 4, 0, 1, 0},
        {"cuMemsetD2D32Async", "cuMemsetD2D32Async", 3020, 0, 4, 0, 1, 1},
        {"cuMemsetD2D32Async_ptsz", "cuMemsetD2D32Async", 7000, 1, 4, 0, 1, 1},
    };
    enum { WAYS = sizeof ways / sizeof ways[0] };
    use_device(0);
    CUdeviceptr p = 0;
    size_t bytes = 8u << 20;
    if (!check(cuMemAlloc(&p, bytes) == CUDA_SUCCESS, "8 MiB to set"))
        return;
    void *f[WAYS];
    int found = 0;
    for (int k = 0; k < WAYS; k++)
        found += (f[k] = dlsym(RTLD_DEFAULT, ways[k].name)) != NULL;
    if (!check(found == WAYS, "all %d memset exports found (%d)", WAYS, found))
        return;
    /* As a runtime resolves them: cuGetProcAddress answers each ABI with the library's export. */
    int answered = 0;
    for (int k = 0; k < WAYS; k++) {
        void *fn = NULL;
        CUdriverProcAddressQueryResult status;
        cuuint64_t flags = ways[k].per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                                              : CU_GET_PROC_ADDRESS_LEGACY_STREAM;
        if (cuGetProcAddress(ways[k].base, &fn, ways[k].version, flags, &status) ==
                CUDA_SUCCESS && fn == f[k])
            answered++;
        else
            fprintf(stderr, "cuGetProcAddress(%s, %d) did not answer %s\n", ways[k].base,
                    ways[k].version, ways[k].name);
    }
    check(answered == WAYS, "cuGetProcAddress answers each of the %d with the library's "
          "export (%d)", WAYS, answered);
    uint64_t before = fake_cuda_stats.memsets;
    for (double t0 = now_s(); now_s() - t0 < 2.0;) {
        set_memory(&ways[0], f[0], p, bytes);
        cuCtxSynchronize();
    }
    /* A process that only sets memory is not idle to the node monitor (nothing launched yet). */
    const struct vgpu_region *region = region_view();
    uint64_t stamped = 0;
    for (uint32_t s = 0; region != NULL && s < region->header.slot_high_water; s++)
        if (region->slots[s].pid == getpid())
            stamped = __atomic_load_n(&region->slots[s].last_launch_unix_ns, __ATOMIC_ACQUIRE);
    check(stamped != 0, "its memsets stamped the slot's last_launch_unix_ns (%llu)",
          (unsigned long long)stamped);
    double worst = 0;
    const char *worst_name = "";
    int refused = 0;
    for (int k = 0; k < WAYS; k++) {
        uint64_t busy0 = fake_cuda_busy_ns(0);
        double t0 = now_s();
        while (now_s() - t0 < 0.8) {
            refused += set_memory(&ways[k], f[k], p, bytes) != CUDA_SUCCESS;
            cuCtxSynchronize();
        }
        double util = 100.0 * (double)(fake_cuda_busy_ns(0) - busy0) / ((now_s() - t0) * 1e9);
        if (util > worst) {
            worst = util;
            worst_name = ways[k].name;
        }
    }
    check(refused == 0 && fake_cuda_stats.memsets > before, "the driver took every memset "
          "(%llu, %d refused)", (unsigned long long)(fake_cuda_stats.memsets - before), refused);
    check(worst <= limit + 10.0, "limit %.0f%%, memsets only: each export kept to at most "
          "%.1f%% of the GPU over its 0.8 s (%s)", limit, worst, worst_name);
}

/* Two calls the driver refuses: a memset of 2^60 bytes and a launch of a grid 2^31 - 1 across
 * and 65536 down; returns how many it refused. */
static int refused_calls(CUdeviceptr p)
{
    return (cuMemsetD8_v2(p, 0, (size_t)1 << 60) == CUDA_ERROR_INVALID_VALUE) +
           (cuLaunchKernel(NULL, INT32_MAX, 65536, 1, 128, 1, 1, 0, NULL, NULL, NULL) ==
            CUDA_ERROR_INVALID_VALUE);
}

/* One unit of work_windows' load: an 8 MiB memset at p (2 ms), waited for. */
static void set_8_mib(CUdeviceptr p)
{
    cuMemsetD8_v2(p, 0, 8u << 20);
    cuCtxSynchronize();
}

/* The fake GPU's share over eight 0.5 s windows of unit(p) back to back, after 2 s of them;
 * with `every` > 0, refused_calls every that many seconds (*tries calls, *refusals refused).
 * Checks each window within 7 points of the limit, their mean within 5. */
static void work_windows(double limit, void (*unit)(CUdeviceptr), CUdeviceptr p, double every,
                         int *tries, int *refusals, const char *beside)
{
    for (double t0 = now_s(); now_s() - t0 < 2.0;)
        unit(p);
    double worst = 0, least = 100, sum = 0;
    int windows = 0;
    for (; windows < 8; windows++) {
        uint64_t busy0 = fake_cuda_busy_ns(0);
        double t0 = now_s(), next = t0;
        while (now_s() - t0 < 0.5) {
            if (every > 0 && now_s() >= next) {
                next += every;
                *tries += 2;
                *refusals += refused_calls(p);
            }
            unit(p);
        }
        double util = 100.0 * (double)(fake_cuda_busy_ns(0) - busy0) / ((now_s() - t0) * 1e9);
        worst = util > worst ? util : worst;
        least = util < least ? util : least;
        sum += util;
    }
    check(worst <= limit + 7.0 && least >= limit - 7.0 && fabs(sum / windows - limit) <= 5.0,
          "limit %.0f%%, %s: the GPU %.1f%% busy on average over 4 s, %.1f-%.1f%% over each "
          "0.5 s", limit, beside, sum / windows, least, worst);
}

/* Calls the driver refuses queue nothing, and take no tokens: before, a memset of 2^60 bytes
 * or a launch of a grid past the GPU's bounds took them, a debt no GPU time backed, forgiven
 * at a rate of the debt itself, and the limit was lifted to bursts (a review of 7c94ef6 found
 * it): the rate swung, bursts the account's hold cut, then holds (the library of 33bd322, 3
 * runs: 0.5 s windows of 0.1-40.1, 0.1-63.8 and 0.1-52.4 %). Refused calls every 0.25 s. */
static void refused(double limit)
{
    use_device(0);
    CUdeviceptr p = 0;
    if (!check(cuMemAlloc(&p, 8u << 20) == CUDA_SUCCESS, "8 MiB to set"))
        return;
    int tries = 0, refusals = 0;
    work_windows(limit, set_8_mib, p, 0.25, &tries, &refusals, "refused calls every 0.25 s");
    check(refusals == tries, "the driver refused each of %d memsets of 2^60 bytes and "
          "launches of a grid past its bounds (%d)", tries, refusals);
}

static int spinning; /* refused_spinning's thread runs while set */

/* Refused calls back to back: one nearly always under way in the driver (under d914621, its
 * tokens taken and not yet given back). */
static void *refuse_in_a_loop(void *unused)
{
    (void)unused;
    use_device(0);
    while (__atomic_load_n(&spinning, __ATOMIC_ACQUIRE))
        refused_calls(0);
    return NULL;
}

/* As refused, but a second thread makes refused calls in a loop from the start, so that a
 * control step nearly always finds one under way: a debt seen then, forgiven or taken for the
 * first period's demand, set the rate from tokens no GPU time backed (a review of the first
 * refund, d914621, found: 94.5 % under 25). */
static void refused_spinning(double limit)
{
    use_device(0);
    CUdeviceptr p = 0;
    pthread_t thread;
    __atomic_store_n(&spinning, 1, __ATOMIC_RELEASE);
    if (!check(cuMemAlloc(&p, 8u << 20) == CUDA_SUCCESS &&
                   pthread_create(&thread, NULL, refuse_in_a_loop, NULL) == 0,
               "8 MiB to set, and a thread making refused calls"))
        return;
    int tries = 0, refusals = 0;
    work_windows(limit, set_8_mib, p, 0, &tries, &refusals, "refused calls in a loop beside");
    __atomic_store_n(&spinning, 0, __ATOMIC_RELEASE);
    pthread_join(thread, NULL);
}

/* nested: launches made while the driver answers another (inside the fake's answer, as a
 * signal handler's launch would be), each of 2000 blocks, NESTED below the first; every 0.25 s
 * a unit makes refused calls beside them. The library keeps a launch's tokens until the
 * driver's answer on a per-thread stack of 4 unanswered calls, and past it a call takes them at
 * its gate (src/throttle.h): refused calls are made only where the stack has room, since past
 * it they are charged, as documented. */
enum { NESTED = 6, UNANSWERED = 4 /* VGPU_UNANSWERED, src/throttle.h */ };
static int nested_depth, nested_tries, nested_refusals;
static int nested_refusing;      /* this unit makes refused calls: one every 0.25 s does */
static double nested_refuse_at; /* now_s() from which the next unit does */

static void launch_nested(void)
{
    int depth = ++nested_depth; /* the launches under way, this one's answer included */
    if (nested_refusing && depth < UNANSWERED) {
        nested_tries += 2;
        nested_refusals += refused_calls(0);
    }
    if (depth < NESTED) {
        strcpy(fake_cuda_inside, "cuLaunchKernel");
        fake_cuda_inside_fn = launch_nested;
    }
    cuLaunchKernel(NULL, 2000, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
}

/* One unit of `nested`: 1 + NESTED launches, one inside the other's answer, waited for. */
static void nested_launches(CUdeviceptr unused)
{
    (void)unused;
    double now = now_s();
    nested_refusing = now >= nested_refuse_at;
    if (nested_refusing)
        nested_refuse_at = now + 0.25;
    nested_depth = 0;
    strcpy(fake_cuda_inside, "cuLaunchKernel");
    fake_cuda_inside_fn = launch_nested;
    cuLaunchKernel(NULL, 2000, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
    cuCtxSynchronize();
}

/* No refused call is charged, however deep within the stack: with a stack of one, the nested
 * refusals took their cost at the gate (2^48 blocks for a memset of 2^60 bytes), a debt no
 * GPU time backed, and 0.5 s windows under 25 swung over 4.8-49.4, 6.3-44.4 and 4.7-46.8 %
 * (3 runs). A launch left uncharged (those past the stack, say) does not show here: the
 * rate's feedback from NVML makes up for any steady part of the cost missed. */
static void nested(double limit)
{
    use_device(0);
    int unused = 0;
    uint64_t before = fake_cuda_stats.launches[FAKE_LAUNCH];
    work_windows(limit, nested_launches, 0, 0, &unused, &unused,
                 "launches 7 deep inside the driver's answers");
    uint64_t launches = fake_cuda_stats.launches[FAKE_LAUNCH] - before;
    check(nested_depth == NESTED && launches % (NESTED + 1) == 0 && launches > 0 &&
              nested_refusals == nested_tries && nested_tries > 0,
          "each unit %d launches deep (%llu in all); the driver refused all %d of the calls "
          "beside them (%d)", NESTED + 1, (unsigned long long)launches, nested_tries,
          nested_refusals);
}

/* A graph's memset nodes are work as its kernels are: costed by what they set, as the memset
 * exports are (made with nodes of 2 MiB; made with nodes of 4 bytes and set to 2 MiB in the
 * executable graph by cuGraphExecMemsetNodeSetParams; by CUDA 12.2's cuGraphExecNodeSetParams).
 * Four nodes a graph, 2048 of the fake's blocks a launch, each waited for. The library of
 * edbb684, which left memset nodes out of a graph's cost (one token a launch), held these to
 * the limit as well, by the account's holds and the rate's feedback; the costs themselves are
 * test_graphs' (memset_nodes). */
static void graph_memsets(double limit)
{
    static const char *const ways[] = {"made", "memset-set", "node-set"};
    use_device(0);
    CUdeviceptr p = 0;
    if (!check(cuMemAlloc(&p, 2u << 20) == CUDA_SUCCESS, "2 MiB to set"))
        return;
    for (size_t w = 0; w < sizeof ways / sizeof ways[0]; w++) {
        int made_big = w == 0;
        CUDA_MEMSET_NODE_PARAMS small = {.dst = p, .value = 0, .elementSize = 4, .width = 1,
                                         .height = 1};
        CUDA_MEMSET_NODE_PARAMS big = small;
        big.width = (2u << 20) / 4;
        CUgraph graph;
        CUgraphNode nodes[4];
        CUgraphExec exec;
        int ok = cuGraphCreate(&graph, 0) == CUDA_SUCCESS;
        for (int k = 0; ok && k < 4; k++)
            ok = cuGraphAddMemsetNode(&nodes[k], graph, k ? &nodes[k - 1] : NULL, k ? 1 : 0,
                                      made_big ? &big : &small, NULL) == CUDA_SUCCESS;
        ok = ok && cuGraphInstantiateWithFlags(&exec, graph, 0) == CUDA_SUCCESS;
        CUgraphNodeParams any = {.type = CU_GRAPH_NODE_TYPE_MEMSET};
        memcpy(&any.memset, &big, sizeof big);
        for (int k = 0; ok && !made_big && k < 4; k++)
            ok = (w == 1 ? cuGraphExecMemsetNodeSetParams(exec, nodes[k], &big, NULL)
                         : cuGraphExecNodeSetParams(exec, nodes[k], &any)) == CUDA_SUCCESS;
        if (!check(ok, "%s: a graph of four 2 MiB memsets", ways[w]))
            continue;
        double util = 0, t0 = now_s();
        uint64_t busy0 = 0;
        for (int half = 0; half < 2; half++) {
            if (half == 1) {
                busy0 = fake_cuda_busy_ns(0);
                t0 = now_s();
            }
            for (double start = now_s(); now_s() - start < (half ? 4.0 : 2.0);) {
                cuGraphLaunch(exec, NULL);
                cuCtxSynchronize();
            }
        }
        util = 100.0 * (double)(fake_cuda_busy_ns(0) - busy0) / ((now_s() - t0) * 1e9);
        check(util <= limit + 5.0, "limit %.0f%%, %s: the graph's memsets kept the GPU %.1f%% "
              "busy over 4 s", limit, ways[w], util);
        cuGraphExecDestroy(exec);
        cuGraphDestroy(graph);
    }
}

/* A container of more processes than the limiter once read (256 of the region's 1024 slots):
 * a process in a slot past them was never matched to its NVML samples, so its time went
 * uncharged, and beside 256 idle processes it ran free (94.8 % of the GPU under a limit of
 * 25, the library of edbb684). The idle ones claim their slots first (1 MiB each), then hold
 * them until the measurement is done. */
static void many_processes(double limit)
{
    enum { IDLE = 256 };
    int ready[2], hold[2];
    if (!check(pipe(ready) == 0 && pipe(hold) == 0, "pipes to the idle processes"))
        return;
    int started = 0;
    for (; started < IDLE; started++) {
        pid_t kid = fork();
        if (kid < 0)
            break;
        if (kid == 0) {
            close(ready[0]);
            close(hold[1]);
            CUdeviceptr p = 0;
            use_device(0);
            char c = cuMemAlloc(&p, 1 << 20) == CUDA_SUCCESS ? 'r' : 'f';
            if (write(ready[1], &c, 1) != 1 || read(hold[0], &c, 1) < 0)
                _exit(3);
            _exit(0);
        }
    }
    close(ready[1]);
    close(hold[0]);
    int claimed = 0;
    char c;
    for (int k = 0; k < started && read(ready[0], &c, 1) == 1; k++)
        claimed += c == 'r';
    if (check(started == IDLE && claimed == IDLE, "%d idle processes of the container each hold a "
              "slot (%d started)", claimed, started)) {
        use_device(0);
        unsigned i = 0;
        run_for(2.0, &i, VARIANTS); /* settle */
        double util = run_for(4.0, &i, VARIANTS);
        check(util <= limit + 5.0, "limit %.0f%%, this process in slot %d: %.1f%% of the GPU over "
              "4 s", limit, IDLE, util);
    }
    close(hold[1]); /* the idle processes exit */
    int status = 0, clean = 1;
    for (int k = 0; k < started; k++)
        clean = clean && wait(&status) > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    check(clean, "the idle processes exited cleanly");
}

/* The same with a second thread launching too (never drained: a synchronisation of one may
 * return before the other's work is done): a first version charged the time after its last
 * launch while the hold held it back, and such a process got 2-3 % by reckoning. */
static volatile int second_thread_stops;

static void *second_launcher(void *unused)
{
    (void)unused;
    use_device(0);
    while (!second_thread_stops)
        step(0);
    return NULL;
}

static void nvml_blind_threads(double limit)
{
    use_device(0);
    pthread_t t;
    if (!check(pthread_create(&t, NULL, second_launcher, NULL) == 0, "a second launching thread"))
        return;
    unsigned i = 0;
    run_for(2.0, &i, VARIANTS);
    double util = run_for(4.0, &i, VARIANTS);
    second_thread_stops = 1;
    pthread_join(t, NULL);
    check(fabs(util - limit) <= 5.0, "limit %.0f%%, no NVML reading, two launching threads: %.1f%% "
          "of the GPU over 4 s", limit, util);
}

static void nvml_blind_light_start(double limit)
{
    use_device(0);
    for (double t0 = now_s(); now_s() - t0 < 1.5;) {
        cuLaunchKernel(NULL, 2000, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL); /* 2 ms */
        cuCtxSynchronize();
        sleep_s(0.1);
    }
    /* Settled for 3 s: an NVML that answers "no new sample" is taken for no reading only 2 s
     * after the first launch (blind_after_us, src/throttle.c), and the load runs free until
     * then and on the account's credit a little longer. The account's first hold, 0.33 s of
     * GPU over the limit, then lasts 1.3 s and ends about 2.4 s after the light start
     * (LIBCUDA_LOG_LEVEL=4). Settled for 1 s, the window read held the hold whole (21.1-21.4 %,
     * once 19.5 %); for 2 s, its end (20.4-23.1 %). 0.5 s windows after it read 22.6-24.0 %
     * (in one run of 12, four swung 21.2-27.5 %). */
    unsigned i = 0;
    run_for(3.0, &i, VARIANTS);
    double util = run_for(4.0, &i, VARIANTS);
    check(fabs(util - limit) <= 5.0, "limit %.0f%%, no NVML reading, a light first 1.5 s: %.1f%% "
          "of the GPU over 4 s of load after it", limit, util);
}

/* SIGALRM: a launch held back past the test's bound fails the test instead of hanging it. */
static void held_too_long(int sig)
{
    (void)sig;
    static const char msg[] = "FAIL: a launch was held back past the test's bound\n";
    if (write(2, msg, sizeof msg - 1) < 0)
        _exit(2);
    _exit(1);
}

/* An executable graph whose conditional node (type) runs a kernel of `blocks` blocks (1 us each
 * on the fake GPU), `loops` times a launch for a WHILE; NULL when it cannot be made. */
static CUgraphExec conditional_exec(CUgraphConditionalNodeType type, unsigned blocks,
                                    unsigned loops)
{
    CUgraph graph;
    CUgraphNode node, kernel;
    CUgraphExec exec;
    CUgraphNodeParams params = {.type = CU_GRAPH_NODE_TYPE_CONDITIONAL};
    CUDA_KERNEL_NODE_PARAMS k = {.gridDimX = blocks, .gridDimY = 1, .gridDimZ = 1,
                                 .blockDimX = 128, .blockDimY = 1, .blockDimZ = 1};
    params.conditional.type = type;
    params.conditional.size = 1;
    fake_cuda_while_loops = loops; /* the fake reads it when the graph is instantiated */
    int built =
        cuGraphCreate(&graph, 0) == CUDA_SUCCESS &&
        cuGraphConditionalHandleCreate(&params.conditional.handle, graph, NULL, 1, 0) ==
            CUDA_SUCCESS &&
        cuGraphAddNode(&node, graph, NULL, 0, &params) == CUDA_SUCCESS &&
        cuGraphAddKernelNode(&kernel, params.conditional.phGraph_out[0], NULL, 0, &k) ==
            CUDA_SUCCESS &&
        cuGraphInstantiateWithFlags(&exec, graph, 0) == CUDA_SUCCESS;
    return built ? exec : NULL;
}

/* Busy share of device 0, in percent, over the last `measure` of `seconds` s of launching exec
 * and waiting for it. */
static double while_share(CUgraphExec exec, double seconds, double measure)
{
    uint64_t busy0 = fake_cuda_busy_ns(0);
    double t0 = now_s(), from = 0;
    while (now_s() - t0 < seconds) {
        cuGraphLaunch(exec, NULL);
        cuCtxSynchronize();
        if (from == 0 && now_s() - t0 >= seconds - measure) {
            busy0 = fake_cuda_busy_ns(0);
            from = now_s();
        }
    }
    return 100.0 * (double)(fake_cuda_busy_ns(0) - busy0) / ((now_s() - from) * 1e9);
}

/* Graphs with a conditional node, whose body cuda.h gives no way to read. Charged one block a
 * launch, a WHILE graph that runs 0.5 s a launch ran at least once a second: 50% busy under a
 * limit of 20. A short one (20 ms a launch) must get its share, a long one stay near it (the
 * share is coarse at half a second a launch). */
static void while_graphs(double limit)
{
    signal(SIGALRM, held_too_long);
    alarm(120);
    /* First a process that has launched little (its rate low), then a trivial IF graph: charged
     * as 2^20 blocks, its next kernel waited 46 s (helper review). */
    CUgraphExec trivial = conditional_exec(CU_GRAPH_COND_TYPE_IF, 1, 1);
    double t0 = now_s();
    while (now_s() - t0 < 1.5) {
        cuLaunchKernel(NULL, 64, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
        cuCtxSynchronize();
        sleep_s(0.01);
    }
    double waited = -1;
    if (trivial != NULL && cuGraphLaunch(trivial, NULL) == CUDA_SUCCESS) {
        cuCtxSynchronize();
        t0 = now_s();
        cuLaunchKernel(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
        cuCtxSynchronize();
        waited = now_s() - t0;
    }
    check(waited >= 0 && waited < 0.5, "after a light load, a trivial IF graph holds the next "
          "kernel back %.3f s", waited);
    CUgraphExec shorter = conditional_exec(CU_GRAPH_COND_TYPE_WHILE, 2000, 10),
                longer = conditional_exec(CU_GRAPH_COND_TYPE_WHILE, 2000, 250);
    if (!check(shorter != NULL && longer != NULL, "graphs with a WHILE node instantiated"))
        return;
    double util = while_share(shorter, 6.0, 3.0);
    check(fabs(util - limit) <= 5.0, "limit %.0f%%: a WHILE graph of 20 ms a launch keeps the GPU "
          "%.1f%% busy", limit, util);
    /* Trivial graphs (1 us a launch, charged like the long one) first: nothing to measure, so
     * the rate climbs with demand, and the bucket holds 20 ms of that rate. Spent on the long
     * graph, those tokens kept the GPU 100 % busy under a limit of 20 for as long as this ran,
     * the feedback lowering the rate but never what the bucket held. */
    for (t0 = now_s(); now_s() - t0 < 2.0;) {
        cuGraphLaunch(trivial, NULL);
        cuCtxSynchronize();
    }
    util = while_share(longer, 6.0, 6.0);
    check(fabs(util - limit) <= 8.0, "limit %.0f%%: after 2 s of trivial graphs, one of 0.5 s a "
          "launch keeps the GPU %.1f%% busy over 6 s", limit, util);
    util = while_share(longer, 8.0, 8.0);
    check(fabs(util - limit) <= 8.0, "limit %.0f%%: ... and %.1f%% over the next 8 s (one "
          "launch is 6 points of them)", limit, util);
    /* Over the limit by 0.8 s of GPU (two long launches on tokens banked again), launches are
     * held back until the account is within a second at the limit, which only a measurement
     * can tell: NVML then stops answering, and the hold must end, the blocks alone limiting. */
    for (t0 = now_s(); now_s() - t0 < 2.0;) {
        cuGraphLaunch(trivial, NULL);
        cuCtxSynchronize();
    }
    cuGraphLaunch(longer, NULL);
    cuGraphLaunch(longer, NULL);
    cuCtxSynchronize();
    /* NVML's samples come a period (up to 1 s) after the work they count. */
    const struct vgpu_region *region = region_view();
    double credit = 0;
    for (t0 = now_s(); region != NULL && now_s() - t0 < 3.0 && credit >= -limit / 100.0;) {
        sleep_s(0.02);
        credit = __atomic_load_n(&region->devices[0].sm_credit_ns, __ATOMIC_ACQUIRE) / 1e9;
    }
    sleep_s(0.05); /* the watcher that charged it holds the bucket next */
    setenv("FAKE_NVML_UTIL_FAILS", "1", 1);
    check(credit < -limit / 100.0, "two launches of 0.5 s on banked tokens: the container's "
          "account (its region) goes to %.3f s of GPU, past the hold's %.2f", credit,
          -limit / 100.0);
    t0 = now_s();
    cuLaunchKernel(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
    cuCtxSynchronize();
    double held = now_s() - t0;
    /* Held at all, then not for good. The account also climbs back at the limit's rate, so a
     * debt just past the line ends the hold by itself before the lost NVML does: two launches
     * left it at -0.375 s once, and the kernel waited 0.85 s (-0.379 to -0.743 s, 1.06 to
     * 3.32 s, in 4 more runs; 2026-11-28): about (0.375 - 0.20) / 0.20 s less the stamp's lag. */
    check(held > 0.5 && held < 8.0, "held back over the limit, then NVML lost: the next kernel "
          "waits %.2f s (the hold ends seconds past the last charge, not for good)", held);
    unsetenv("FAKE_NVML_UTIL_FAILS");
    /* The clock steps back 10 minutes (or a process writes a stamp from the future), the
     * account in credit: every reading was older than the last charge, the account frozen in
     * credit, and the long graph ran at 100 %. */
    struct vgpu_region *edit = region_edit();
    if (edit != NULL) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t future = ((uint64_t)ts.tv_sec + 600) * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
        __atomic_store_n(&edit->devices[0].sm_credit_ns, (int64_t)(limit / 100.0 * 0.2 * 1e9),
                         __ATOMIC_RELEASE);
        __atomic_store_n(&edit->devices[0].sm_charged_us, future, __ATOMIC_RELEASE);
    }
    util = while_share(longer, 6.0, 6.0);
    check(edit != NULL && fabs(util - limit) <= 8.0, "limit %.0f%%: the account charged 10 "
          "minutes ahead, one of 0.5 s a launch keeps the GPU %.1f%% busy over 6 s", limit, util);
}

/* Seconds the next 1-block kernel waits after `blocks` blocks were launched (and finished). */
static double wait_after(unsigned blocks)
{
    cuLaunchKernel(NULL, blocks, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
    cuCtxSynchronize();
    double t0 = now_s();
    cuLaunchKernel(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
    cuCtxSynchronize();
    return now_s() - t0;
}

/* Busy share of device dev (its context current), in percent, over the last
 * `seconds - settle` of `seconds` of back-to-back kernels of `blocks` blocks. */
static double back_to_back(int dev, unsigned blocks, double seconds, double settle)
{
    uint64_t busy0 = 0;
    double t0 = now_s(), from = 0;
    while (now_s() - t0 < seconds) {
        if (from == 0 && now_s() - t0 >= settle) {
            busy0 = fake_cuda_busy_ns(dev);
            from = now_s();
        }
        cuLaunchKernel(NULL, blocks, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
        cuCtxSynchronize();
    }
    return 100.0 * (double)(fake_cuda_busy_ns(dev) - busy0) / ((now_s() - from) * 1e9);
}

/* A process that launched little for a while (an inference server between requests), then a
 * large kernel: the limiter's rate follows demand, so it was low, and the large kernel's debt
 * in blocks held the next launch back more than 97 s under a limit of 50, the GPU idle. What
 * the process used of the GPU is under its share: the debt must not hold it back longer than
 * the kernel's own GPU time, at the limit, says (20 ms here) plus the measurement's lag. Then
 * back-to-back large kernels must reach the limit within a few seconds. */
static void burst_after_light_load(double limit)
{
    signal(SIGALRM, held_too_long);
    alarm(60);
    double t0 = now_s();
    while (now_s() - t0 < 3.0) {
        cuLaunchKernel(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
        cuCtxSynchronize();
        sleep_s(0.1);
    }
    double waited = wait_after(20000);
    check(waited < 1.0, "limit %.0f%%: after a light load, a 20 ms kernel holds the next one "
          "back %.3f s", limit, waited);
    double util = back_to_back(0, 20000, 8.0, 3.0);
    check(fabs(util - limit) <= 5.0, "limit %.0f%%: back-to-back 20 ms kernels keep the GPU "
          "%.1f%% busy from 3 s on", limit, util);
    /* Kernels of 200 ms: each one's debt outlasts a control period, so it is forgiven only
     * while the account says the container is under its limit. With the whole GPU's share
     * taken as under the limit when it was over, it always was: 98.6 % under a limit of 20.
     * The share swings between forgiveness and hold over about 2 s (2 s windows read 30.6 to
     * 73.4 % at 50, 2026-11-28), and the first 2 s run over (57.9-73.6 %) until the account
     * holds; so it is measured over the 10 s after those: 46.1-54.0 % in 12 runs, where the
     * 6 s from 4 s on read 39.8-57.2 % (a quarter of the runs out of this band). Within 8
     * points: one kernel is 2 points of 10 s. */
    util = back_to_back(0, 200000, 12.0, 2.0);
    check(fabs(util - limit) <= 8.0, "limit %.0f%%: back-to-back 200 ms kernels keep the GPU "
          "%.1f%% busy from 2 s to 12 s", limit, util);
    alarm(0);
}

/* Two processes of one container (one region; FAKE_GPU_SHARED makes them one GPU's tenants,
 * FAKE_CUDA_CONTEXT_MIB gives their contexts memory, as on a GPU; each learns its host pid). The
 * first runs plain kernels and, 1 s in, a WHILE graph of 2 s a launch (1.4 s of GPU over a limit of
 * 30); the second starts 3.5 s in with plain kernels. With an account per process, each charged the
 * container's share, the first stayed held for as long as its sibling kept the container at the
 * limit (22.5 s), while the second, new, was not held at all. With the container's account they are
 * held and let go together: from 8 s on, both run. */
static void siblings(double limit)
{
    signal(SIGALRM, held_too_long);
    alarm(90);
    pid_t sibling = fork();
    if (sibling == 0) {
        sleep_s(3.5);
        use_device(0);
        back_to_back(0, 20000, 12.0, 12.0);
        _exit(0);
    }
    use_device(0);
    CUgraphExec longer = conditional_exec(CU_GRAPH_COND_TYPE_WHILE, 1000, 2000);
    if (!check(longer != NULL, "a graph with a WHILE node instantiated"))
        return;
    uint64_t own0 = 0, all0 = 0;
    double t0 = now_s(), from = 0;
    int launched = 0;
    while (now_s() - t0 < 15.0) {
        if (!launched && now_s() - t0 >= 1.0) {
            launched = cuGraphLaunch(longer, NULL) == CUDA_SUCCESS;
            cuCtxSynchronize();
        }
        if (from == 0 && now_s() - t0 >= 8.0) { /* both run from here */
            own0 = fake_cuda_busy_ns(0);
            all0 = fake_cuda_device_busy_ns(0);
            from = now_s();
        }
        cuLaunchKernel(NULL, 20000, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
        cuCtxSynchronize();
    }
    double seconds = (now_s() - from) * 1e9;
    double own = 100.0 * (double)(fake_cuda_busy_ns(0) - own0) / seconds,
           together = 100.0 * (double)(fake_cuda_device_busy_ns(0) - all0) / seconds;
    int status = 0;
    waitpid(sibling, &status, 0);
    /* Both run (held for good, one reads 0.0-0.1 %), and they split the limit evenly. Their
     * rates follow the container's share by the same factor, so they kept the ratio a hold left
     * them at, and a process whose rate a held period's demand collapsed stayed low: 6.7-15.7 %
     * for the one that went over in 8 runs by hand, 2026-11-28, 3 of them more than 6 points
     * from an even split (1.2-18.8 % in 16 runs where their host pids were never learnt, so
     * neither can tell its share from its sibling's). Now a throttled process keeps its rate
     * through a held period and raises it while a sibling runs more (control.h): 15.1-19.5 %
     * in 12 runs (worst 19.1/10.9), the first above its sibling in all 12 (not in a 13th, with
     * debug logging on: 12.5/14.7), not explained;
     * 14.1-19.9 % in 14 runs before a wait that outlasts a rate step counted as throttled.
     * With a synchronisation's drain pausing prepayment, and a process's own prepayment left
     * out of its hold test always, 24.9/5.4 and 21.6/9.2 in 2 of 6 runs; with it counted once
     * measured, 15.9-19.1 % in 10, and 16.1-20.7 % in 6 with the drain as it is (2026-11-29).
     * The process started second, its rate a launch in 1.2 s, stepped it once a launch and
     * took 3 s to come up: with a period it waits through stepping its rate by the balance
     * (throttle.c, starved), the first 14.3-16.7 % in 12 runs, worst 16.7/13.2 (14.7-17.7 % in
     * 22 with a first version), against 17.2-22.2 % in 8 alternating, worst 22.2/9.0 (5 of
     * the day's 24 runs of the library before more than 4 points off). */
    double other = together - own;
    check(launched && own > 0.5 && other > 0.5 && fabs(own - other) <= 8.0,
          "limit %.0f%%: from 8 s on, both run, within 4 points of an even split: the process "
          "that went over gets %.1f%% of the GPU, its sibling %.1f%%", limit, own, other);
    check(together <= limit + 5.0, "limit %.0f%%: the two together keep the GPU %.1f%% busy",
          limit, together);
    alarm(0);
}

static CUresult launched_later = CUDA_ERROR_NOT_READY;

/* A thread that launches a 10 ms kernel 20 ms after it starts (drained, case "during"): before
 * the limiter's first control period (0.1 s) sets the rate, so that it is not held back. */
static void *launch_later(void *ctx)
{
    cuCtxSetCurrent(ctx);
    sleep_s(0.02);
    launched_later = cuLaunchKernel(NULL, 10000, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
    return NULL;
}

/* The streams a stream case of drained names: 0 is the null handle. */
enum { NULL_STREAM, LEGACY, PER_THREAD, STREAM_A, STREAM_B, NO_STREAM };

/* How a stream case waits for its stream: cuStreamSynchronize; cuStreamQuery polled until done, or
 * asked once while the kernel runs; a synchronisation by a thread that launched nothing; the
 * stream destroyed while its kernel runs (cuda.h's cuStreamDestroy, the _v2, or the CUDA 2.0
 * export) and a new one with its handle (the fake hands it out again) synchronised;
 * cuCtxSynchronize first, then a kernel on the stream and its wait; cuCtxSynchronize alone, or
 * with the other GPU's context current, or after the kernel was launched on the stream with the
 * other GPU's context current (cases of two GPUs); a context made through the fake's own export
 * (libvgpu does not see it made) current, then cuCtxSynchronize, the legacy default stream's wait
 * or a copy to the host from the primary context's memory; the kernel launched in such a context,
 * pushed over the primary one the same unseen way, then the primary one made current again
 * (cuCtxSetCurrent, cuCtxPushCurrent or cuCtxPopCurrent, each of those two through CUDA 4.0's
 * export or 2.0's) and synchronised, or the primary one synchronised by name (CUDA 13.0's
 * cuCtxSynchronize_v2) with the unseen one still current; CUDA 13.0's cuCtxSynchronize_v2 of
 * the case's (primary) context named, of the current one (NULL), of the case's named with the
 * other GPU's primary context current or with none current, of the current one through the
 * pointer cuGetProcAddress gives for cuCtxSynchronize at 13.0, of the other GPU's named, or of a
 * context libvgpu did not see made, named, the case's current again; the kernel launched on a
 * stream made (cuStreamCreate, cuStreamCreateWithPriority) in a context libvgpu did not see
 * made, the case's context current again unseen, then cuCtxSynchronize; the kernel launched by
 * a thread that then exits, the wait made by a thread made after it (glibc may give it the dead
 * thread's stack and TLS); a synchronous copy (each of 64 bytes, through the _ptds export where
 * wait_ptsz): to the host with cuMemcpyDtoH_v2, CUDA 2.0's cuMemcpyDtoH or the unified space's
 * cuMemcpy (to page-locked memory too), within the device, from the host or within it with
 * cuMemcpy; and copies to the host that need not have waited: one the driver refuses (from an
 * allocation of 32 bytes), of no bytes, from managed memory, from another device's memory, or one
 * whose source the driver cannot name (its cuPointerGetAttribute fails). Every copy runs on the
 * default stream. An event case records an event on `wait` (through cuEventRecord_ptsz where
 * wait_ptsz), then waits for it: cuEventSynchronize; cuEventQuery polled until done, or asked
 * once while the kernel runs; through cuEventRecordWithFlags (its _ptsz); the first of four
 * events recorded after the same kernels waited for; a short kernel on the stream after the
 * record; the event recorded on `launch`, then again on `wait`; recorded again, inside the
 * driver's record on `launch`, on `wait` (as another thread might meanwhile); recorded on
 * `launch`, then on `wait` with the wait for it made inside the driver's record (as another
 * thread's might come before the record's end); recorded on
 * `launch`, then refused a record on a stream of another context; a record while the stream
 * is captured (a plain one: its wait fails with CUDA_ERROR_CAPTURED_EVENT; one with
 * CU_EVENT_RECORD_EXTERNAL: the event stays unrecorded, done at once); the event destroyed
 * (cuEventDestroy_v2 or CUDA 2.0's export) and a new one with its handle (the fake hands it
 * out again) waited for; waited for by a thread that launched nothing; made and recorded in a
 * context libvgpu did not see made, current; made an interprocess event; a plain event after
 * the process opened an interprocess event's handle. */
enum wait_how {
    SYNC,
    COPY,
    COPY_V1,
    COPY_UNIFIED,
    COPY_PINNED,
    COPY_WITHIN_DEVICE,
    COPY_FROM_HOST,
    COPY_WITHIN_HOST,
    COPY_REFUSED,
    COPY_EMPTY,
    COPY_MANAGED,
    COPY_PEER,
    COPY_UNNAMED,
    QUERY,
    QUERY_ONCE,
    OTHER_THREAD,
    NEW_STREAM,
    NEW_STREAM_V1,
    AFTER_CONTEXT_SYNC,
    CONTEXT_SYNC,
    CONTEXT_SYNC_ELSEWHERE,
    LAUNCHED_ELSEWHERE,
    UNSEEN_CONTEXT,
    UNSEEN_CONTEXT_STREAM,
    UNSEEN_CONTEXT_COPY,
    UNSEEN_LEFT, /* ... to UNSEEN_SYNC_V2: the kernel in a context pushed over (unseen_on_top) */
    UNSEEN_PUSHED_OVER,
    UNSEEN_POPPED,
    UNSEEN_PUSHED_OVER_V1,
    UNSEEN_POPPED_V1,
    UNSEEN_SYNC_V2,
    DEAD_THREAD,
    CONTEXT_SYNC_V2,
    CONTEXT_SYNC_V2_CURRENT,
    CONTEXT_SYNC_V2_NAMED,
    CONTEXT_SYNC_V2_ELSEWHERE,
    CONTEXT_SYNC_V2_NO_CURRENT,
    CONTEXT_SYNC_V2_PROC,
    CONTEXT_SYNC_V2_UNSEEN_NAMED,
    UNSEEN_STREAM_MADE,
    UNSEEN_STREAM_MADE_PRIORITY,
    EVENT_SYNC, /* the event cases (event_case), from here to the end */
    EVENT_QUERY,
    EVENT_QUERY_ONCE,
    EVENT_WITH_FLAGS,
    EVENT_EARLIER,
    EVENT_THEN_LAUNCH,
    EVENT_RERECORDED,
    EVENT_RERECORDED_MEANWHILE,
    EVENT_WAITED_MEANWHILE,
    EVENT_REFUSED,
    EVENT_CAPTURED,
    EVENT_CAPTURED_EXTERNAL,
    EVENT_INTERPROCESS,
    EVENT_IPC_OPENED,
    EVENT_DESTROYED,
    EVENT_DESTROYED_V1,
    EVENT_OTHER_THREAD,
    EVENT_UNSEEN_CONTEXT
};

/* A stream case of drained: on device `device`, a 0.3 s kernel on `launch` (through
 * cuLaunchKernel_ptsz where launch_ptsz), a short one on `also` (NO_STREAM: none), then `wait`
 * waited for as `how` says (through the _ptsz exports where wait_ptsz). The null handle is the
 * legacy default stream in the plain exports, the thread's own in the _ptsz ones (cuda.h); the
 * case drains where the stream waited for is the one every kernel since the last drain ran on,
 * and the thread that waited is the one that launched. */
static const struct stream_case {
    const char *name;
    int device, launch, launch_ptsz, also, wait, wait_ptsz;
    enum wait_how how;
    int drains;
} stream_cases[] = {
    {"stream", 0, STREAM_A, 0, NO_STREAM, STREAM_A, 0, SYNC, 1},
    {"legacy", 0, NULL_STREAM, 0, NO_STREAM, LEGACY, 0, SYNC, 1},
    {"legacy-ptsz", 0, NULL_STREAM, 0, NO_STREAM, LEGACY, 1, SYNC, 1},
    {"per-thread", 0, NULL_STREAM, 1, NO_STREAM, PER_THREAD, 0, SYNC, 1},
    {"per-thread-ptsz", 0, PER_THREAD, 0, NO_STREAM, NULL_STREAM, 1, SYNC, 1},
    {"query", 0, STREAM_A, 0, NO_STREAM, STREAM_A, 0, QUERY, 1},
    {"query-ptsz", 0, NULL_STREAM, 1, NO_STREAM, NULL_STREAM, 1, QUERY, 1},
    {"second-device", 1, STREAM_A, 0, NO_STREAM, STREAM_A, 0, SYNC, 1},
    {"context-sync-first", 0, STREAM_A, 0, STREAM_B, STREAM_A, 0, AFTER_CONTEXT_SYNC, 1},
    {"two-streams", 0, STREAM_A, 0, STREAM_B, STREAM_A, 0, SYNC, 0},
    {"other-stream", 0, STREAM_A, 0, NO_STREAM, NULL_STREAM, 0, SYNC, 0},
    {"default-streams", 0, NULL_STREAM, 0, NO_STREAM, NULL_STREAM, 1, SYNC, 0},
    {"query-busy", 0, STREAM_A, 0, NO_STREAM, STREAM_A, 0, QUERY_ONCE, 0},
    {"other-thread", 0, STREAM_A, 0, NO_STREAM, STREAM_A, 0, OTHER_THREAD, 0},
    {"destroyed", 0, STREAM_A, 0, NO_STREAM, STREAM_A, 0, NEW_STREAM, 0},
    {"destroyed-v1", 0, STREAM_A, 0, NO_STREAM, STREAM_A, 0, NEW_STREAM_V1, 0},
    {"dead-thread", 0, PER_THREAD, 0, NO_STREAM, PER_THREAD, 0, DEAD_THREAD, 0},
    {"context-sync-second-device", 1, STREAM_A, 0, NULL_STREAM, NULL_STREAM, 0, CONTEXT_SYNC, 1},
    {"launched-elsewhere-second-device", 1, STREAM_A, 0, NO_STREAM, NULL_STREAM, 0,
     LAUNCHED_ELSEWHERE, 1},
    {"unseen-context", 0, NULL_STREAM, 0, NO_STREAM, NULL_STREAM, 0, UNSEEN_CONTEXT, 0},
    {"unseen-context-stream", 0, NULL_STREAM, 0, NO_STREAM, NULL_STREAM, 0,
     UNSEEN_CONTEXT_STREAM, 0},
    {"unseen-context-copy", 0, NULL_STREAM, 0, NO_STREAM, NULL_STREAM, 0, UNSEEN_CONTEXT_COPY,
     0},
    {"unseen-context-left", 0, NULL_STREAM, 0, NO_STREAM, NULL_STREAM, 0, UNSEEN_LEFT, 0},
    {"unseen-context-pushed-over", 0, NULL_STREAM, 0, NO_STREAM, NULL_STREAM, 0,
     UNSEEN_PUSHED_OVER, 0},
    {"unseen-context-popped", 0, NULL_STREAM, 0, NO_STREAM, NULL_STREAM, 0, UNSEEN_POPPED, 0},
    {"unseen-context-pushed-over-v1", 0, NULL_STREAM, 0, NO_STREAM, NULL_STREAM, 0,
     UNSEEN_PUSHED_OVER_V1, 0},
    {"unseen-context-popped-v1", 0, NULL_STREAM, 0, NO_STREAM, NULL_STREAM, 0, UNSEEN_POPPED_V1,
     0},
    {"unseen-context-sync-v2", 0, NULL_STREAM, 0, NO_STREAM, NULL_STREAM, 0, UNSEEN_SYNC_V2, 0},
    {"context-sync-v2", 0, STREAM_A, 0, NO_STREAM, NULL_STREAM, 0, CONTEXT_SYNC_V2, 1},
    {"context-sync-v2-current", 0, STREAM_A, 0, NO_STREAM, NULL_STREAM, 0,
     CONTEXT_SYNC_V2_CURRENT, 1},
    {"context-sync-v2-named-second-device", 1, STREAM_A, 0, NO_STREAM, NULL_STREAM, 0,
     CONTEXT_SYNC_V2_NAMED, 1},
    {"context-sync-v2-elsewhere-second-device", 1, STREAM_A, 0, NO_STREAM, NULL_STREAM, 0,
     CONTEXT_SYNC_V2_ELSEWHERE, 0},
    {"context-sync-v2-no-current", 0, STREAM_A, 0, NO_STREAM, NULL_STREAM, 0,
     CONTEXT_SYNC_V2_NO_CURRENT, 1},
    {"context-sync-v2-proc-address", 0, STREAM_A, 0, NO_STREAM, NULL_STREAM, 0,
     CONTEXT_SYNC_V2_PROC, 1},
    {"context-sync-v2-unseen-named", 0, STREAM_A, 0, NO_STREAM, NULL_STREAM, 0,
     CONTEXT_SYNC_V2_UNSEEN_NAMED, 0},
    {"unseen-context-stream-made", 0, STREAM_A, 0, NO_STREAM, NULL_STREAM, 0, UNSEEN_STREAM_MADE,
     0},
    {"unseen-context-stream-made-priority", 0, STREAM_A, 0, NO_STREAM, NULL_STREAM, 0,
     UNSEEN_STREAM_MADE_PRIORITY, 0},
    {"context-elsewhere-second-device", 1, STREAM_A, 0, NO_STREAM, NULL_STREAM, 0,
     CONTEXT_SYNC_ELSEWHERE, 0},
    {"context-sync-first-second-device", 1, STREAM_A, 0, STREAM_B, STREAM_A, 0,
     AFTER_CONTEXT_SYNC, 1},
    {"copy", 0, NULL_STREAM, 0, NO_STREAM, NULL_STREAM, 0, COPY, 1},
    {"copy-v1", 0, NULL_STREAM, 0, NO_STREAM, NULL_STREAM, 0, COPY_V1, 1},
    {"copy-ptds", 0, NULL_STREAM, 1, NO_STREAM, NULL_STREAM, 1, COPY, 1},
    {"copy-second-device", 1, LEGACY, 0, NO_STREAM, NULL_STREAM, 0, COPY, 1},
    {"copy-other-stream", 0, STREAM_A, 0, NO_STREAM, NULL_STREAM, 0, COPY, 0},
    {"copy-default-streams", 0, NULL_STREAM, 0, NO_STREAM, NULL_STREAM, 1, COPY, 0},
    {"copy-refused", 0, NULL_STREAM, 0, NO_STREAM, NULL_STREAM, 0, COPY_REFUSED, 0},
    {"copy-unified", 0, NULL_STREAM, 0, NO_STREAM, NULL_STREAM, 0, COPY_UNIFIED, 1},
    {"copy-unified-ptds", 0, NULL_STREAM, 1, NO_STREAM, NULL_STREAM, 1, COPY_UNIFIED, 1},
    {"copy-pinned", 0, NULL_STREAM, 0, NO_STREAM, NULL_STREAM, 0, COPY_PINNED, 1},
    {"copy-within-device", 0, NULL_STREAM, 0, NO_STREAM, NULL_STREAM, 0, COPY_WITHIN_DEVICE, 0},
    {"copy-from-host", 0, NULL_STREAM, 0, NO_STREAM, NULL_STREAM, 0, COPY_FROM_HOST, 0},
    {"copy-within-host", 0, NULL_STREAM, 0, NO_STREAM, NULL_STREAM, 0, COPY_WITHIN_HOST, 0},
    {"copy-empty", 0, NULL_STREAM, 0, NO_STREAM, NULL_STREAM, 0, COPY_EMPTY, 0},
    {"copy-managed", 0, NULL_STREAM, 0, NO_STREAM, NULL_STREAM, 0, COPY_MANAGED, 0},
    {"copy-from-second-device", 0, NULL_STREAM, 0, NO_STREAM, NULL_STREAM, 0, COPY_PEER, 0},
    {"copy-unnamed", 0, NULL_STREAM, 0, NO_STREAM, NULL_STREAM, 0, COPY_UNNAMED, 0},
    {"event", 0, STREAM_A, 0, NO_STREAM, STREAM_A, 0, EVENT_SYNC, 1},
    {"event-query", 0, STREAM_A, 0, NO_STREAM, STREAM_A, 0, EVENT_QUERY, 1},
    {"event-legacy", 0, NULL_STREAM, 0, NO_STREAM, NULL_STREAM, 0, EVENT_SYNC, 1},
    {"event-per-thread", 0, NULL_STREAM, 1, NO_STREAM, NULL_STREAM, 1, EVENT_SYNC, 1},
    {"event-with-flags", 0, STREAM_A, 0, NO_STREAM, STREAM_A, 0, EVENT_WITH_FLAGS, 1},
    {"event-with-flags-ptsz", 0, PER_THREAD, 0, NO_STREAM, NULL_STREAM, 1, EVENT_WITH_FLAGS, 1},
    {"event-earlier", 0, STREAM_A, 0, NO_STREAM, STREAM_A, 0, EVENT_EARLIER, 1},
    {"event-second-device", 1, STREAM_A, 0, NO_STREAM, STREAM_A, 0, EVENT_SYNC, 1},
    {"event-query-busy", 0, STREAM_A, 0, NO_STREAM, STREAM_A, 0, EVENT_QUERY_ONCE, 0},
    {"event-then-launch", 0, STREAM_A, 0, NO_STREAM, STREAM_A, 0, EVENT_THEN_LAUNCH, 0},
    {"event-two-streams", 0, STREAM_A, 0, STREAM_B, STREAM_A, 0, EVENT_SYNC, 0},
    {"event-other-stream", 0, STREAM_A, 0, NO_STREAM, STREAM_B, 0, EVENT_SYNC, 0},
    {"event-default-streams", 0, NULL_STREAM, 0, NO_STREAM, NULL_STREAM, 1, EVENT_SYNC, 0},
    {"event-rerecorded", 0, STREAM_A, 0, NO_STREAM, STREAM_B, 0, EVENT_RERECORDED, 0},
    {"event-rerecorded-meanwhile", 0, STREAM_A, 0, NO_STREAM, STREAM_B, 0,
     EVENT_RERECORDED_MEANWHILE, 0},
    {"event-waited-meanwhile", 0, STREAM_A, 0, NO_STREAM, STREAM_B, 0, EVENT_WAITED_MEANWHILE,
     0},
    {"event-record-refused", 0, STREAM_A, 0, NO_STREAM, STREAM_A, 0, EVENT_REFUSED, 0},
    {"event-captured", 0, STREAM_A, 0, NO_STREAM, STREAM_A, 0, EVENT_CAPTURED, 0},
    {"event-captured-external", 0, STREAM_A, 0, NO_STREAM, STREAM_A, 0, EVENT_CAPTURED_EXTERNAL,
     0},
    {"event-interprocess", 0, STREAM_A, 0, NO_STREAM, STREAM_A, 0, EVENT_INTERPROCESS, 0},
    {"event-ipc-opened", 0, STREAM_A, 0, NO_STREAM, STREAM_A, 0, EVENT_IPC_OPENED, 0},
    {"event-destroyed", 0, STREAM_A, 0, NO_STREAM, STREAM_A, 0, EVENT_DESTROYED, 0},
    {"event-destroyed-v1", 0, STREAM_A, 0, NO_STREAM, STREAM_A, 0, EVENT_DESTROYED_V1, 0},
    {"event-other-thread", 0, STREAM_A, 0, NO_STREAM, STREAM_A, 0, EVENT_OTHER_THREAD, 0},
    {"event-unseen-context", 0, NULL_STREAM, 0, NO_STREAM, NULL_STREAM, 0,
     EVENT_UNSEEN_CONTEXT, 0},
};

static CUresult (*sync_ptsz)(CUstream), (*query_ptsz)(CUstream), (*destroy_v1)(CUstream);
static CUresult (*copy_ptds)(void *, CUdeviceptr, size_t);
static CUresult (*unified_ptds)(CUdeviceptr, CUdeviceptr, size_t);
static CUresult (*copy_v1)(void *, unsigned, unsigned), (*alloc_v1)(unsigned *, unsigned);
static CUresult (*record_ptsz)(CUevent, CUstream), (*event_destroy_v1)(CUevent);
static CUresult (*push_v1)(CUcontext), (*pop_v1)(CUcontext *);
static CUresult (*record_flags_ptsz)(CUevent, CUstream, unsigned);
static CUcontext case_context; /* made current by the threads a case makes */

static CUresult wait_for(CUstream stream, int ptsz)
{
    return ptsz ? sync_ptsz(stream) : cuStreamSynchronize(stream);
}

/* The 0.3 s kernel of a case (0.6 s where it is asked about while it runs). */
static CUresult case_kernel(const struct stream_case *c, CUstream stream)
{
    launch_fn launch = c->launch_ptsz ? launch_ptsz : cuLaunchKernel;
    unsigned blocks = c->how == QUERY_ONCE ? 600000 : 300000;
    return launch(NULL, blocks, 1, 1, 128, 1, 1, 0, stream, NULL, NULL);
}

static void *sync_elsewhere(void *stream)
{
    cuCtxSetCurrent(case_context);
    return (void *)(uintptr_t)cuStreamSynchronize(stream);
}

static void *launch_and_exit(void *c)
{
    cuCtxSetCurrent(case_context);
    return (void *)(uintptr_t)case_kernel(c, CU_STREAM_PER_THREAD);
}

/* LAUNCHED_ELSEWHERE's 0.3 s kernel: a CUkernel, which runs in its stream's context whatever
 * is current (cuda.h, cuLaunchKernel), on the case's stream with the other GPU's context
 * current; 1 if launched. */
static int launch_elsewhere(const struct stream_case *c, CUstream stream)
{
    CUlibrary library;
    CUkernel kernel;
    int made = cuLibraryLoadData(&library, ".visible .entry k()\n{\n ret;\n}\n", NULL, NULL, 0,
                                 NULL, NULL, 0) == CUDA_SUCCESS &&
               cuLibraryGetKernel(&kernel, library, "k") == CUDA_SUCCESS;
    use_device(1 - c->device);
    int launched = made && cuLaunchKernel((CUfunction)kernel, 300000, 1, 1, 128, 1, 1, 0, stream,
                                          NULL, NULL) == CUDA_SUCCESS;
    use_device(c->device);
    return launched;
}

/* Runs fn(arg) on a thread of its own; 1 if it ran and returned 0 (CUDA_SUCCESS). */
static int on_a_thread(void *(*fn)(void *), void *arg)
{
    pthread_t thread;
    void *got = (void *)1;
    return pthread_create(&thread, NULL, fn, arg) == 0 && pthread_join(thread, &got) == 0 &&
           got == NULL;
}

/* A copy case's copy (wait_how); 0 if a call failed. */
static int copy_case(const struct stream_case *c)
{
    unsigned char host[64] = {0};
    const size_t n = sizeof host;
    unsigned from_v1 = 0;
    CUdeviceptr from = 0, to = 0, on_host = (CUdeviceptr)(uintptr_t)host;
    if (c->how == COPY_V1)
        return check(alloc_v1(&from_v1, n) == 0 && copy_v1(host, from_v1, n) == CUDA_SUCCESS,
                     "64 bytes copied to the host (CUDA 2.0's export)");
    if (!check(cuMemAlloc(&from, c->how == COPY_REFUSED ? n / 2 : n) == 0 &&
                   cuMemAlloc(&to, n) == 0,
               "device memory to copy from and to"))
        return 0;
    CUcontext here = NULL;
    if (c->how == COPY_MANAGED &&
        !check(cuMemAllocManaged(&from, n, CU_MEM_ATTACH_GLOBAL) == 0, "managed memory"))
        return 0;
    if (c->how == COPY_PEER) { /* the other GPU's memory, its context current while made */
        if (!check(cuCtxGetCurrent(&here) == 0, "the current context"))
            return 0;
        use_device(1 - c->device);
        int made = cuMemAlloc(&from, n) == 0;
        if (!check(cuCtxSetCurrent(here) == 0 && made, "memory of the other GPU"))
            return 0;
    }
    CUresult (*unified)(CUdeviceptr, CUdeviceptr, size_t) = c->wait_ptsz ? unified_ptds : cuMemcpy;
    switch (c->how) {
    case COPY_UNIFIED:
        return check(unified(on_host, from, n) == CUDA_SUCCESS,
                     "64 bytes copied to the host (cuMemcpy)");
    case COPY_PINNED: {
        void *pinned = NULL;
        return check(cuMemAllocHost(&pinned, n) == CUDA_SUCCESS &&
                         unified((CUdeviceptr)(uintptr_t)pinned, from, n) == CUDA_SUCCESS,
                     "64 bytes copied to page-locked host memory (cuMemcpy)");
    }
    case COPY_WITHIN_DEVICE:
        return check(unified(to, from, n) == CUDA_SUCCESS, "64 bytes copied within the device");
    case COPY_FROM_HOST:
        return check(unified(to, on_host, n) == CUDA_SUCCESS, "64 bytes copied from the host");
    case COPY_WITHIN_HOST: {
        unsigned char other[64] = {0};
        return check(unified((CUdeviceptr)(uintptr_t)other, on_host, n) == CUDA_SUCCESS,
                     "64 bytes copied within the host");
    }
    case COPY_REFUSED: /* at once: a tenth of a second on, as QUERY_ONCE, or it reads near its
                        * bound */
        sleep_s(0.1);
        return check(cuMemcpyDtoH(host, from, n) == CUDA_ERROR_INVALID_VALUE,
                     "a copy of 64 bytes from 32 refused");
    case COPY_EMPTY: /* the fake returns at once, as a driver may */
        sleep_s(0.1);
        return check(cuMemcpyDtoH(host, from, 0) == CUDA_SUCCESS, "no bytes copied to the host");
    case COPY_UNNAMED:
        strcpy(fake_cuda_fail_next, "cuPointerGetAttribute");
        return check(cuMemcpyDtoH(host, from, n) == CUDA_SUCCESS &&
                         fake_cuda_fail_next[0] == '\0',
                     "64 bytes copied to the host, the driver unable to name their source");
    default:
        return check((c->wait_ptsz ? copy_ptds(host, from, n) : cuMemcpyDtoH(host, from, n)) ==
                         CUDA_SUCCESS,
                     "64 bytes copied to the host");
    }
}

/* A context on c's device made current through the fake's own export, as through one libvgpu
 * does not know (it does not see it made); 1 if made. */
static int make_unseen(const struct stream_case *c, CUcontext *unseen)
{
    CUresult (*create)(CUcontext *, unsigned int, CUdevice) =
        (CUresult(*)(CUcontext *, unsigned int, CUdevice))fake_cuda_entry("cuCtxCreate_v2");
    return create != NULL && create(unseen, 0, (CUdevice)c->device) == CUDA_SUCCESS;
}

static void *sync_event_elsewhere(void *event)
{
    return (void *)(uintptr_t)cuEventSynchronize(event);
}

/* Event case c's record of event on stream (wait_how). */
static CUresult record(const struct stream_case *c, CUevent event, CUstream stream)
{
    if (c->how == EVENT_CAPTURED_EXTERNAL)
        return cuEventRecordWithFlags(event, stream, CU_EVENT_RECORD_EXTERNAL);
    if (c->how == EVENT_WITH_FLAGS)
        return c->wait_ptsz ? record_flags_ptsz(event, stream, 0)
                            : cuEventRecordWithFlags(event, stream, 0);
    return c->wait_ptsz ? record_ptsz(event, stream) : cuEventRecord(event, stream);
}

/* EVENT_RERECORDED_MEANWHILE's second record, made inside the driver's first. */
static CUevent meanwhile_event;
static CUstream meanwhile_stream;
static CUresult meanwhile_rc = CUDA_ERROR_NOT_READY;

static void record_meanwhile(void)
{
    meanwhile_rc = cuEventRecord(meanwhile_event, meanwhile_stream);
}

/* EVENT_WAITED_MEANWHILE's wait, made inside the driver's second record. */
static void wait_meanwhile(void)
{
    meanwhile_rc = cuEventSynchronize(meanwhile_event);
}

/* How unseen_stream makes its stream: through the fake's own export (libvgpu does not see it
 * made either), cuStreamCreate or cuStreamCreateWithPriority. */
enum stream_maker { FAKE_STREAM, STREAM_CREATE, STREAM_CREATE_PRIORITY };

/* A stream of a context libvgpu does not see made, made as `maker` says, the case's context
 * current again through the fake's own export (libvgpu sees no context left either); 1 if
 * made. */
static int unseen_stream(const struct stream_case *c, CUstream *stream, enum stream_maker maker)
{
    CUresult (*set)(CUcontext) = (CUresult(*)(CUcontext))fake_cuda_entry("cuCtxSetCurrent");
    CUresult (*create)(CUstream *, unsigned) =
        (CUresult(*)(CUstream *, unsigned))fake_cuda_entry("cuStreamCreate");
    CUcontext unseen = NULL;
    int found = set != NULL && create != NULL;
    CUresult made = !found || !make_unseen(c, &unseen) ? CUDA_ERROR_UNKNOWN
                    : maker == FAKE_STREAM             ? create(stream, 0)
                    : maker == STREAM_CREATE           ? cuStreamCreate(stream, 0)
                                                       : cuStreamCreateWithPriority(stream, 0, -1);
    return made == CUDA_SUCCESS && set(case_context) == CUDA_SUCCESS;
}

/* An interprocess event's handle, the event made through the fake's own exports (libvgpu sees
 * neither), opened through libvgpu's cuIpcOpenEventHandle; 1 if opened. */
static int open_ipc_event(void)
{
    CUresult (*create)(CUevent *, unsigned) =
        (CUresult(*)(CUevent *, unsigned))fake_cuda_entry("cuEventCreate");
    CUresult (*get)(CUipcEventHandle *, CUevent) =
        (CUresult(*)(CUipcEventHandle *, CUevent))fake_cuda_entry("cuIpcGetEventHandle");
    CUevent shared = NULL, opened = NULL;
    CUipcEventHandle handle;
    return create != NULL && get != NULL &&
           create(&shared, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS &&
           get(&handle, shared) == CUDA_SUCCESS &&
           cuIpcOpenEventHandle(&opened, handle) == CUDA_SUCCESS && opened != NULL;
}

/* Event case c, its kernels launched: its record and wait (wait_how); 0 if a call failed. */
static int event_case(const struct stream_case *c, CUstream streams[])
{
    CUstream on = streams[c->wait], elsewhere = NULL;
    CUevent event = NULL, earlier[3] = {NULL}, again = NULL;
    CUcontext unseen = NULL;
    unsigned flags = c->how == EVENT_INTERPROCESS ? CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING
                                                  : 0;
    if (c->how == EVENT_UNSEEN_CONTEXT &&
        !check(make_unseen(c, &unseen), "a context made current that libvgpu did not see made"))
        return 0;
    if (c->how == EVENT_REFUSED &&
        !check(unseen_stream(c, &elsewhere, FAKE_STREAM), "a stream of another context"))
        return 0;
    if (c->how == EVENT_IPC_OPENED &&
        !check(open_ipc_event(), "an interprocess event's handle opened"))
        return 0;
    int fine = cuEventCreate(&event, flags) == 0;
    for (int i = 0; i < 3; i++)
        fine &= cuEventCreate(&earlier[i], 0) == 0;
    if (!check(fine, "four events made"))
        return 0;
    for (int i = 0; c->how == EVENT_EARLIER && i < 3; i++)
        fine &= record(c, earlier[i], on) == 0;
    if (c->how == EVENT_RERECORDED || c->how == EVENT_REFUSED || c->how == EVENT_WAITED_MEANWHILE)
        fine &= record(c, event, streams[c->launch]) == 0;
    if (c->how == EVENT_RERECORDED_MEANWHILE || c->how == EVENT_WAITED_MEANWHILE) {
        meanwhile_event = event;
        meanwhile_stream = on;
        strcpy(fake_cuda_inside, "cuEventRecord");
        fake_cuda_inside_fn =
            c->how == EVENT_WAITED_MEANWHILE ? wait_meanwhile : record_meanwhile;
        CUstream first = c->how == EVENT_WAITED_MEANWHILE ? on : streams[c->launch];
        fine &= record(c, event, first) == 0 && meanwhile_rc == CUDA_SUCCESS;
    } else if (c->how == EVENT_REFUSED) {
        fine &= record(c, event, elsewhere) == CUDA_ERROR_INVALID_HANDLE;
    } else {
        fake_cuda_capturing = c->how == EVENT_CAPTURED || c->how == EVENT_CAPTURED_EXTERNAL;
        fine &= record(c, event, on) == 0;
        fake_cuda_capturing = 0;
    }
    if (c->how == EVENT_THEN_LAUNCH)
        fine &= cuLaunchKernel(NULL, 2000, 1, 1, 128, 1, 1, 0, on, NULL, NULL) == 0;
    if (c->how == EVENT_DESTROYED || c->how == EVENT_DESTROYED_V1) {
        fine &= (c->how == EVENT_DESTROYED ? cuEventDestroy(event) : event_destroy_v1(event)) ==
                    0 &&
                cuEventCreate(&again, 0) == 0 && again == event;
    }
    if (!check(fine, "the event recorded (%s)", c->name))
        return 0;
    CUresult rc;
    switch (c->how) {
    case EVENT_QUERY:
        while ((rc = cuEventQuery(event)) == CUDA_ERROR_NOT_READY)
            sleep_s(0.001);
        return check(rc == CUDA_SUCCESS, "the event queried until done");
    case EVENT_QUERY_ONCE: /* a tenth of a second on, as QUERY_ONCE */
        sleep_s(0.1);
        return check(cuEventQuery(event) == CUDA_ERROR_NOT_READY, "the event queried: busy");
    case EVENT_CAPTURED: /* the wait fails at once: a tenth of a second on, as QUERY_ONCE */
        sleep_s(0.1);
        return check(cuEventSynchronize(event) == CUDA_ERROR_CAPTURED_EVENT,
                     "the event recorded in a capture: its wait refused");
    case EVENT_CAPTURED_EXTERNAL:
    case EVENT_DESTROYED:
    case EVENT_DESTROYED_V1: /* unrecorded: the wait returns at once, as QUERY_ONCE */
        sleep_s(0.1);
        return check(cuEventSynchronize(event) == 0, "the unrecorded event waited for");
    case EVENT_WAITED_MEANWHILE: /* that wait was the case's */
        return 1;
    case EVENT_OTHER_THREAD:
        return check(on_a_thread(sync_event_elsewhere, event),
                     "the event waited for on a thread that launched nothing");
    default:
        return check(cuEventSynchronize(c->how == EVENT_EARLIER ? earlier[0] : event) == 0,
                     "the event waited for");
    }
}

/* Runs stream case c, its kernels launched, up to its wait's return; 0 if a call failed. */
static int wait_on_stream(const struct stream_case *c, CUstream streams[])
{
    CUstream wait = streams[c->wait], again = NULL;
    CUresult rc;
    switch (c->how) {
    case SYNC:
        return check(wait_for(wait, c->wait_ptsz) == 0, "the stream synchronised");
    case COPY:
    case COPY_V1:
    case COPY_UNIFIED:
    case COPY_PINNED:
    case COPY_WITHIN_DEVICE:
    case COPY_FROM_HOST:
    case COPY_WITHIN_HOST:
    case COPY_REFUSED:
    case COPY_EMPTY:
    case COPY_MANAGED:
    case COPY_PEER:
    case COPY_UNNAMED:
        return copy_case(c);
    case QUERY:
        while ((rc = c->wait_ptsz ? query_ptsz(wait) : cuStreamQuery(wait)) ==
               CUDA_ERROR_NOT_READY)
            sleep_s(0.001);
        return check(rc == CUDA_SUCCESS, "the stream queried until done");
    case QUERY_ONCE: /* a tenth of a second on: queried at once, the case read 0.416 s paid of
                      * 0.5, near its bound (prepaying begins a tick or so after the launch) */
        sleep_s(0.1);
        return check(cuStreamQuery(wait) == CUDA_ERROR_NOT_READY, "the stream queried: busy");
    default: /* EVENT_SYNC and every way after it */
        return event_case(c, streams);
    case OTHER_THREAD:
    case DEAD_THREAD: /* the kernel's thread (stream_case) has exited */
        return check(on_a_thread(sync_elsewhere, wait),
                     "the stream synchronised on a thread that launched nothing");
    case NEW_STREAM:
    case NEW_STREAM_V1:
        return check((c->how == NEW_STREAM ? cuStreamDestroy(wait) : destroy_v1(wait)) == 0 &&
                         cuStreamCreate(&again, 0) == 0 && again == wait &&
                         cuStreamSynchronize(again) == 0,
                     "the stream destroyed while its kernel ran, a new one with its handle "
                     "synchronised");
    case AFTER_CONTEXT_SYNC:
        return check(cuCtxSynchronize() == 0 && case_kernel(c, streams[c->launch]) == 0 &&
                         wait_for(wait, c->wait_ptsz) == 0,
                     "the context synchronised, a kernel on the first stream synchronised");
    case CONTEXT_SYNC:
    case LAUNCHED_ELSEWHERE:
    case UNSEEN_STREAM_MADE:
    case UNSEEN_STREAM_MADE_PRIORITY:
        return check(cuCtxSynchronize() == 0, "the context synchronised");
    case UNSEEN_CONTEXT:
    case UNSEEN_CONTEXT_STREAM:
    case UNSEEN_CONTEXT_COPY: {
        CUcontext unseen = NULL;
        CUdeviceptr from = 0;
        unsigned char host[64];
        if (!check(cuMemAlloc(&from, sizeof host) == 0 && make_unseen(c, &unseen),
                   "a context made current that libvgpu did not see made"))
            return 0;
        sleep_s(0.1); /* each wait returns at once: as QUERY_ONCE */
        CUresult rc = c->how == UNSEEN_CONTEXT        ? cuCtxSynchronize()
                      : c->how == UNSEEN_CONTEXT_STREAM ? cuStreamSynchronize(NULL)
                                                        : cuMemcpyDtoH(host, from, sizeof host);
        return check(rc == CUDA_SUCCESS, "the unseen context's synchronisation, its default "
                     "stream's or a copy with it current");
    }
    case UNSEEN_LEFT:
    case UNSEEN_PUSHED_OVER:
    case UNSEEN_POPPED:
    case UNSEEN_PUSHED_OVER_V1:
    case UNSEEN_POPPED_V1: {
        CUcontext popped = NULL, now = NULL;
        CUresult rc = c->how == UNSEEN_LEFT             ? cuCtxSetCurrent(case_context)
                      : c->how == UNSEEN_PUSHED_OVER    ? cuCtxPushCurrent(case_context)
                      : c->how == UNSEEN_POPPED         ? cuCtxPopCurrent(&popped)
                      : c->how == UNSEEN_PUSHED_OVER_V1 ? push_v1(case_context)
                                                        : pop_v1(&popped);
        return check(rc == CUDA_SUCCESS && cuCtxGetCurrent(&now) == CUDA_SUCCESS &&
                         now == case_context && cuCtxSynchronize() == CUDA_SUCCESS,
                     "the primary context current again, synchronised");
    }
    case CONTEXT_SYNC_ELSEWHERE: /* returns at once: as QUERY_ONCE */
        sleep_s(0.1);
        use_device(1 - c->device);
        return check(cuCtxSynchronize() == 0, "the other GPU's context synchronised");
    case UNSEEN_SYNC_V2:
        return check(cuCtxSynchronize_v2(case_context) == 0,
                     "the primary context synchronised by name, the unseen one current");
    case CONTEXT_SYNC_V2:
    case CONTEXT_SYNC_V2_CURRENT:
        return check(cuCtxSynchronize_v2(c->how == CONTEXT_SYNC_V2 ? case_context : NULL) == 0,
                     "the context synchronised (cuCtxSynchronize_v2)");
    case CONTEXT_SYNC_V2_NAMED:
        use_device(1 - c->device);
        return check(cuCtxSynchronize_v2(case_context) == 0,
                     "the case's context synchronised by name, the other GPU's current");
    case CONTEXT_SYNC_V2_ELSEWHERE: { /* returns at once: as QUERY_ONCE */
        CUcontext other = NULL;
        sleep_s(0.1);
        return check(cuDevicePrimaryCtxRetain(&other, 1 - c->device) == 0 &&
                         cuCtxSynchronize_v2(other) == 0,
                     "the other GPU's primary context synchronised by name");
    }
    case CONTEXT_SYNC_V2_PROC: { /* as a runtime built for CUDA 13.0 finds it */
        CUresult (*sync)(CUcontext) = NULL;
        CUdriverProcAddressQueryResult status;
        return check(cuGetProcAddress("cuCtxSynchronize", (void **)&sync, 13000, 0, &status) ==
                             0 &&
                         sync != NULL && sync(NULL) == 0,
                     "the current context synchronised through cuCtxSynchronize at 13.0");
    }
    case CONTEXT_SYNC_V2_NO_CURRENT:
        return check(cuCtxSetCurrent(NULL) == 0 && cuCtxSynchronize_v2(case_context) == 0,
                     "the case's context synchronised by name, none current");
    case CONTEXT_SYNC_V2_UNSEEN_NAMED: { /* the fake waits for the whole device's work */
        CUresult (*set)(CUcontext) = (CUresult(*)(CUcontext))fake_cuda_entry("cuCtxSetCurrent");
        CUcontext unseen = NULL;
        return check(set != NULL && make_unseen(c, &unseen) && set(case_context) == 0 &&
                         cuCtxSynchronize_v2(unseen) == 0,
                     "a context libvgpu did not see made synchronised by name");
    }
    }
    return 0;
}

/* A context libvgpu does not see made pushed over the primary one, current: a case's kernel
 * then runs in it. 0 if a call failed. */
static int unseen_on_top(const struct stream_case *c)
{
    CUresult (*set)(CUcontext) = (CUresult(*)(CUcontext))fake_cuda_entry("cuCtxSetCurrent");
    CUresult (*push)(CUcontext) = (CUresult(*)(CUcontext))fake_cuda_entry("cuCtxPushCurrent_v2");
    CUcontext unseen = NULL;
    return check(set != NULL && push != NULL && make_unseen(c, &unseen) &&
                     set(case_context) == CUDA_SUCCESS && push(unseen) == CUDA_SUCCESS,
                 "a context libvgpu did not see made pushed over the primary one");
}

/* Stream case c on its device, current: its kernels, then its wait; 0 if a call failed. */
static int stream_case(const struct stream_case *c)
{
    launch_ptsz = (launch_fn)dlsym(RTLD_DEFAULT, "cuLaunchKernel_ptsz");
    sync_ptsz = (CUresult(*)(CUstream))dlsym(RTLD_DEFAULT, "cuStreamSynchronize_ptsz");
    query_ptsz = (CUresult(*)(CUstream))dlsym(RTLD_DEFAULT, "cuStreamQuery_ptsz");
    destroy_v1 = (CUresult(*)(CUstream))dlsym(RTLD_DEFAULT, "cuStreamDestroy");
    copy_ptds = (CUresult(*)(void *, CUdeviceptr, size_t))dlsym(RTLD_DEFAULT,
                                                                "cuMemcpyDtoH_v2_ptds");
    copy_v1 = (CUresult(*)(void *, unsigned, unsigned))dlsym(RTLD_DEFAULT, "cuMemcpyDtoH");
    unified_ptds = (CUresult(*)(CUdeviceptr, CUdeviceptr, size_t))dlsym(RTLD_DEFAULT,
                                                                         "cuMemcpy_ptds");
    alloc_v1 = (CUresult(*)(unsigned *, unsigned))dlsym(RTLD_DEFAULT, "cuMemAlloc");
    record_ptsz = (CUresult(*)(CUevent, CUstream))dlsym(RTLD_DEFAULT, "cuEventRecord_ptsz");
    record_flags_ptsz = (CUresult(*)(CUevent, CUstream, unsigned))dlsym(
        RTLD_DEFAULT, "cuEventRecordWithFlags_ptsz");
    event_destroy_v1 = (CUresult(*)(CUevent))dlsym(RTLD_DEFAULT, "cuEventDestroy");
    push_v1 = (CUresult(*)(CUcontext))dlsym(RTLD_DEFAULT, "cuCtxPushCurrent");
    pop_v1 = (CUresult(*)(CUcontext *))dlsym(RTLD_DEFAULT, "cuCtxPopCurrent");
    cuCtxGetCurrent(&case_context);
    CUstream streams[NO_STREAM] = {NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD, NULL, NULL};
    if (!check(launch_ptsz && sync_ptsz && query_ptsz && destroy_v1 && copy_ptds && copy_v1 &&
                   alloc_v1 && unified_ptds && record_ptsz && record_flags_ptsz &&
                   event_destroy_v1 && push_v1 && pop_v1 &&
                   cuStreamCreate(&streams[STREAM_A], 0) == 0 &&
                   cuStreamCreate(&streams[STREAM_B], 0) == 0,
               "two streams made, the _ptsz and CUDA 2.0 exports found"))
        return 0;
    if (c->how >= UNSEEN_LEFT && c->how <= UNSEEN_SYNC_V2 && !unseen_on_top(c))
        return 0;
    if ((c->how == UNSEEN_STREAM_MADE || c->how == UNSEEN_STREAM_MADE_PRIORITY) &&
        !check(unseen_stream(c, &streams[STREAM_A],
                             c->how == UNSEEN_STREAM_MADE ? STREAM_CREATE
                                                          : STREAM_CREATE_PRIORITY),
               "the kernel's stream made in a context libvgpu did not see made, left unseen"))
        return 0;
    int fine = c->how == DEAD_THREAD          ? on_a_thread(launch_and_exit, (void *)c)
               : c->how == LAUNCHED_ELSEWHERE ? launch_elsewhere(c, streams[c->launch])
                                              : case_kernel(c, streams[c->launch]) == 0;
    if (c->also != NO_STREAM)
        fine &= cuLaunchKernel(NULL, 2000, 1, 1, 128, 1, 1, 0, streams[c->also], NULL, NULL) == 0;
    return check(fine, "launched") && wait_on_stream(c, streams);
}

/* What the process prepays after a kernel and a synchronisation, NVML silent (the environment
 * sets FAKE_NVML_SAMPLE_MS far past the test: its share stays the whole GPU's, unmeasured).
 * Alone on its primary context, nothing of it runs after a cuCtxSynchronize: it pays nothing
 * until its next launch (a light process that exits before NVML measures it was charged the
 * whole GPU for its life: `contention-chain-20`'s light links waited 0.32-0.72 s for it, 0.15 s
 * unlimited). It pays the whole GPU's time where the synchronisation does not cover all its
 * work: another context made on the device ("context": cuCtxCreate; "green": a green context),
 * or a launch by another thread ("during": while it ran). A stream's synchronisation, or a
 * query that found it done, covers its work where every kernel ran on that stream
 * (stream_cases: a light PyTorch process waits so, copying a result to the host). And work
 * launched and drained between two of the limiter's ticks ran all the same: a 2 ms kernel and
 * a synchronisation every 15 ms ("bursts") must be paid for at least half the GPU time they
 * took (the environment gives the process one GPU; with two, a context's synchronisation
 * drains its own device alone: "context-sync-second-device", "context-elsewhere-second-device").
 * "CASE-second-device", for a case not in stream_cases, is CASE on the second of two GPUs. */
static void drained(double limit, const char *how)
{
    signal(SIGALRM, held_too_long);
    alarm(30);
    const struct stream_case *on_stream = NULL;
    for (size_t i = 0; i < sizeof stream_cases / sizeof stream_cases[0]; i++)
        on_stream = strcmp(how, stream_cases[i].name) == 0 ? &stream_cases[i] : on_stream;
    /* CASE-second-device: CASE (alone, context, green or during) on the second of two GPUs. */
    const char *suffix = "-second-device";
    size_t len = strlen(how), tail = strlen(suffix);
    int second = on_stream == NULL && len > tail && strcmp(how + len - tail, suffix) == 0;
    char base[64];
    snprintf(base, sizeof base, "%.*s", (int)(second ? len - tail : len), how);
    how = base;
    if (second && !check(strcmp(how, "alone") == 0 || strcmp(how, "context") == 0 ||
                             strcmp(how, "green") == 0 || strcmp(how, "during") == 0,
                         "%s: a case the second GPU can run", how))
        return;
    int dev = on_stream != NULL ? on_stream->device : second;
    use_device(dev);
    CUcontext other = NULL, primary = NULL;
    cuCtxGetCurrent(&primary);
    if (strcmp(how, "context") == 0) {
        check(cuCtxCreate(&other, 0, (CUdevice)dev) == CUDA_SUCCESS,
              "a second context on the device");
        cuCtxSetCurrent(primary);
    } else if (strcmp(how, "green") == 0) {
        CUgreenCtx green;
        CUdevResourceDesc desc = NULL;
        check(cuGreenCtxCreate(&green, desc, (CUdevice)dev, CU_GREEN_CTX_DEFAULT_STREAM) ==
                  CUDA_SUCCESS,
              "a green context on the device");
    }
    if (strcmp(how, "bursts") == 0) {
        const struct vgpu_region *region = region_view();
        if (!check(region != NULL, "the region mapped"))
            return;
        cuLaunchKernel(NULL, 2000, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
        cuCtxSynchronize();
        uint64_t busy0 = fake_cuda_busy_ns(0);
        double before = __atomic_load_n(&region->devices[0].sm_credit_ns, __ATOMIC_ACQUIRE) / 1e9;
        for (double t0 = now_s(); now_s() - t0 < 0.5;) {
            cuLaunchKernel(NULL, 2000, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
            cuCtxSynchronize();
            sleep_s(0.013);
        }
        sleep_s(0.03); /* the last burst's tick */
        double ran = (double)(fake_cuda_busy_ns(0) - busy0) / 1e9;
        double paid = before - __atomic_load_n(&region->devices[0].sm_credit_ns,
                                               __ATOMIC_ACQUIRE) / 1e9;
        check(ran > 0.02 && paid >= 0.5 * ran, "limit %.0f%%: 2 ms kernels each drained before "
              "the next tick, 15 ms apart: %.3f s of GPU over 0.5 s, %.3f s prepaid", limit,
              ran, paid);
        alarm(0);
        return;
    }
    pthread_t thread;
    int threaded = 0;
    const struct vgpu_region *region = region_view();
    if (!check(region != NULL, "the region mapped"))
        return;
    double at_launch =
        __atomic_load_n(&region->devices[dev].sm_credit_ns, __ATOMIC_ACQUIRE) / 1e9;
    /* The library's debug line for a drain (what gpu-check.sh section 14 counts under a
     * framework): there exactly where the process drains. */
    const char *level = getenv("LIBCUDA_LOG_LEVEL");
    if (!check(level != NULL && strcmp(level, "4") == 0, "LIBCUDA_LOG_LEVEL=4 (its lines read)"))
        return;
    int fine = 1;
    capture_begin();
    if (on_stream != NULL) {
        fine = stream_case(on_stream);
    } else {
        cuLaunchKernel(NULL, 300000, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL); /* 0.3 s */
        threaded = strcmp(how, "during") == 0 &&
                   pthread_create(&thread, NULL, launch_later, primary) == 0;
        cuCtxSynchronize();
    }
    const char *said = capture_end();
    fputs(said, stderr);
    int said_drained = strstr(said, "drained by a wait") != NULL;
    if (!fine)
        return;
    double before = __atomic_load_n(&region->devices[dev].sm_credit_ns, __ATOMIC_ACQUIRE) / 1e9;
    sleep_s(0.5);
    double paid = before - __atomic_load_n(&region->devices[dev].sm_credit_ns,
                                           __ATOMIC_ACQUIRE) / 1e9;
    if (threaded)
        pthread_join(thread, NULL);
    if (strcmp(how, "during") == 0)
        check(threaded && launched_later == CUDA_SUCCESS, "the other thread launched");
    int drains = on_stream != NULL ? on_stream->drains : strcmp(how, "alone") == 0;
    check(said_drained == drains, "the library %s it drained (%s)",
          said_drained ? "logged" : "did not log", how);
    if (on_stream != NULL && on_stream->drains) {
        /* Having prepaid while its kernel ran, or a drain would prove nothing (its launches
         * charged to another device than the one read, say). */
        check(at_launch - before > 0.1 && paid < 0.05, "limit %.0f%%: drained by a wait for the "
              "stream its kernels ran on (%s), the process prepays %.3f s of GPU over the next "
              "0.5 s (%.3f s while its kernel ran)", limit, how, paid, at_launch - before);
    } else if (on_stream != NULL)
        check(paid > 0.4, "limit %.0f%%: after a wait that need not cover all its work (%s), "
              "the process prepays %.3f s of GPU over the next 0.5 s", limit, how, paid);
    else if (strcmp(how, "alone") == 0)
        check(paid < 0.05, "limit %.0f%%: drained by cuCtxSynchronize, the process prepays "
              "%.3f s of GPU over the next 0.5 s (nothing of it runs)", limit, paid);
    else
        check(paid > 0.4, "limit %.0f%%: after cuCtxSynchronize with %s, the process prepays "
              "%.3f s of GPU over the next 0.5 s (its work may run on)", limit,
              strcmp(how, "during") == 0 ? "a launch by another thread while it waited"
                                         : "another context on the device", paid);
    alarm(0);
}

/* Busy share of device 1 over the last `seconds - settle` of `seconds` of back-to-back launches
 * of a CUkernel on stream, a stream of device 1, whatever context is current. */
static double kernel_on_stream(CUkernel kernel, CUstream stream, double seconds, double settle)
{
    uint64_t busy0 = 0;
    double t0 = now_s(), from = 0;
    while (now_s() - t0 < seconds) {
        if (from == 0 && now_s() - t0 >= settle) {
            busy0 = fake_cuda_busy_ns(1);
            from = now_s();
        }
        cuLaunchKernel((CUfunction)kernel, 2000, 1, 1, 128, 1, 1, 0, stream, NULL, NULL);
        cuStreamSynchronize(stream);
    }
    return 100.0 * (double)(fake_cuda_busy_ns(1) - busy0) / ((now_s() - from) * 1e9);
}

/* Two GPUs, an SM limit on the second only: each launch is charged to its device, which a
 * process with more than one must ask the driver for (cuda_driver.h, launch_device_on). */
static void limit_on_second_gpu(double limit)
{
    use_device(1);
    double second = back_to_back(1, 2000, 4.0, 2.0);
    check(fabs(second - limit) <= 5.0, "device 1 (limit %.0f%%): measured %.1f%% after 2 s", limit,
          second);
    /* A CUkernel runs in its stream's context, not the current one (cuda.h, cuLaunchKernel):
     * charged to the current context's device, it escaped device 1's limit (94.7 % with device
     * 0 current, 94.3 % with none, the library before). */
    CUstream stream;
    CUlibrary library;
    CUkernel kernel;
    int made = cuStreamCreate(&stream, 0) == CUDA_SUCCESS &&
               cuLibraryLoadData(&library, ".visible .entry k()\n{\n ret;\n}\n", NULL, NULL, 0,
                                 NULL, NULL, 0) == CUDA_SUCCESS &&
               cuLibraryGetKernel(&kernel, library, "k") == CUDA_SUCCESS;
    use_device(0);
    double other = made ? kernel_on_stream(kernel, stream, 4.0, 2.0) : -1;
    check(made && fabs(other - limit) <= 5.0, "a CUkernel on a stream of device 1, device 0's "
          "context current: device 1 %.1f%% busy", other);
    cuCtxSetCurrent(NULL);
    double none = made ? kernel_on_stream(kernel, stream, 4.0, 2.0) : -1;
    check(made && fabs(none - limit) <= 5.0, "and with no context current: %.1f%%", none);
    use_device(0);
    double first = back_to_back(0, 2000, 1.0, 0.0);
    check(first > 80.0, "device 0 (no limit): the loop keeps it %.1f%% busy", first);
}

static volatile sig_atomic_t handled_on; /* the thread id SIGUSR1's handler ran on */

static void on_usr1(int sig)
{
    (void)sig;
    handled_on = (sig_atomic_t)syscall(SYS_gettid);
}

/* The process's threads (/proc/self/task), -1 when it cannot say. */
static int threads_now(void)
{
    DIR *d = opendir("/proc/self/task");
    if (d == NULL)
        return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* The library's threads take none of the application's signals. The watcher starts at the
 * first limited launch, from the application's thread with SIGUSR1 open, and the watcher
 * starts the NVML sampler; that thread then blocks it and the process is sent one: it stays
 * pending until the thread opens it again, and the handler runs there (the library before ran
 * it at once on a thread of its own, one that holds the library's locks at times: a handler's
 * CUDA call could wait on them for ever). */
static void signals(double limit)
{
    (void)limit;
    struct sigaction sa = {.sa_handler = on_usr1};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    int threads = threads_now();
    for (double t0 = now_s(); threads >= 0 && threads < 3 && now_s() - t0 < 5.0;) {
        back_to_back(0, 2000, 0.1, 0.0);
        threads = threads_now();
    }
    check(threads == 3, "the limiter's watcher and sampler run beside the test's thread (%d "
          "threads)", threads);
    sigset_t usr1, open;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &usr1, &open);
    kill(getpid(), SIGUSR1);
    sleep_s(0.3);
    check(handled_on == 0, "SIGUSR1 to the process, blocked in the application's thread: "
          "pending, not handled on a thread of the library's (handled on thread %d)",
          (int)handled_on);
    pthread_sigmask(SIG_SETMASK, &open, NULL);
    check(handled_on == (sig_atomic_t)syscall(SYS_gettid),
          "handled on the application's thread once it opens it (thread %d)", (int)handled_on);
}

int main(int argc, char **argv)
{
    const char *limit_arg = argc > 1 ? argv[1] : "none";
    /* The modes that take the limit alone; `device`: device 0's context made current first. */
    static const struct {
        const char *name;
        void (*run)(double limit);
        int device;
    } modes[] = {
        {"second-gpu", limit_on_second_gpu, 0},
        {"while", while_graphs, 1},
        {"siblings", siblings, 0},
        {"nothread", without_a_thread, 0},
        {"idle-bursts", bursts_after_idle, 0},
        {"tail-bursts", bursts_with_a_tail, 0},
        {"small-tail-bursts", bursts_with_a_small_tail, 0},
        {"nosampler", without_a_sampler, 0},
        {"nvml-shutdown", nvml_shutdown, 0},
        {"nvml-blind", nvml_blind, 0},
        {"nvml-blind-light-start", nvml_blind_light_start, 0},
        {"nvml-blind-threads", nvml_blind_threads, 0},
        {"many-processes", many_processes, 0},
        {"memsets", memsets, 0},
        {"graph-memsets", graph_memsets, 0},
        {"refused", refused, 0},
        {"refused-spinning", refused_spinning, 0},
        {"nested", nested, 0},
        {"burst", burst_after_light_load, 1},
        {"signals", signals, 1},
    };
    for (size_t m = 0; argc > 2 && m < sizeof modes / sizeof modes[0]; m++)
        if (strcmp(argv[2], modes[m].name) == 0) {
            if (modes[m].device)
                use_device(0);
            modes[m].run(atof(limit_arg));
            char suite[64];
            snprintf(suite, sizeof suite, "test_throttle %s", modes[m].name);
            return check_done(suite);
        }
    if (argc > 3 && strcmp(argv[2], "drain") == 0) {
        drained(atof(limit_arg), argv[3]);
        return check_done("test_throttle drain");
    }
    launch_ptsz = (launch_fn)dlsym(RTLD_DEFAULT, "cuLaunchKernel_ptsz");
    coop_ptsz = (coop_fn)dlsym(RTLD_DEFAULT, "cuLaunchCooperativeKernel_ptsz");
    ex_ptsz = (launch_ex_fn)dlsym(RTLD_DEFAULT, "cuLaunchKernelEx_ptsz");
    /* CUDA 2's and 9's launches, deprecated in cuda.h: named through dlsym as old code would. */
    launch_grid = (CUresult(*)(CUfunction, int, int))dlsym(RTLD_DEFAULT, "cuLaunchGrid");
    launch_grid_async =
        (CUresult(*)(CUfunction, int, int, CUstream))dlsym(RTLD_DEFAULT, "cuLaunchGridAsync");
    launch_multi_device = (CUresult(*)(CUDA_LAUNCH_PARAMS *, unsigned int, unsigned int))dlsym(
        RTLD_DEFAULT, "cuLaunchCooperativeKernelMultiDevice");
    if (!check(launch_ptsz && coop_ptsz && ex_ptsz && launch_grid && launch_grid_async &&
                   launch_multi_device,
               "per-thread and deprecated launch entry points found"))
        return check_done("test_throttle");
    use_device(0);
    graph_without_memory(strcmp(limit_arg, "none") != 0);
    unsigned i = 0, launched = 0;
    run_for(2.0, &i, 1); /* settle */
    double util = run_for(2.0, &i, 1);
    launched = i;
    if (strcmp(limit_arg, "none") == 0) {
        check(util > 80.0, "no limit: the loop keeps the GPU %.1f%% busy", util);
    } else {
        double limit = atof(limit_arg);
        check(fabs(util - limit) <= 5.0, "limit %.0f%%: measured %.1f%% after 2 s", limit, util);
        /* Alone, an ungated variant would run at the unlimited ~90%. */
        static const char *const names[VARIANTS] = {
            "cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz",
            "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz", "cuLaunchGrid",
            "cuLaunchGridAsync", "cuLaunchCooperativeKernelMultiDevice"};
        for (unsigned v = 0; v < VARIANTS; v++) {
            unsigned j = v, before = j;
            double alone = run_for(0.4, &j, VARIANTS);
            launched += (j - before) / VARIANTS;
            check(alone <= limit + 10.0, "%s alone is gated: %.1f%%", names[v], alone);
        }
    }
    uint64_t launches = 0;
    for (int v = 0; v < FAKE_LAUNCH_VARIANTS; v++)
        launches += fake_cuda_stats.launches[v];
    check(launches == launched, "every launch reached the driver (%llu of %u)",
          (unsigned long long)launches, launched);
    return check_done("test_throttle");
}
