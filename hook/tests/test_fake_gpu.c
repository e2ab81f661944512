/* test_fake_gpu.c - the fake driver's model of one GPU shared by several processes
 * (tests/fake/fake_gpu.h), so that the SM limiter's contention cases can be tested without a GPU.
 * run.sh runs it with FAKE_GPU_SHARED (one GPU for the parent and its children),
 * FAKE_CUDA_CONTEXT_MIB=300 and FAKE_CUDA_LAZY_MIB=100, and no libvgpu limits:
 *   a child alone keeps the GPU busy; two children running 2 ms kernels back to back get half
 *   each and together keep it busy; NVML's per-process samples show both at ~50% averaged over
 *   the periods since the time asked (since 0 every period kept, a gone process's none;
 *   NOT_FOUND when asked again since the latest one's stamp, NOT_SUPPORTED when switched off;
 *   under FAKE_NVML_SAMPLE_WINNER one of them a period, with the GPU's whole share, each some,
 *   and averaged over several periods each its share of them); context and lazy-module memory
 *   show in the running processes and cuMemGetInfo; a kill -9'd process's memory and queued
 *   work go away; a graph costs its kernel nodes' blocks; timing events span a kernel's cost
 *   alone and about twice it beside a busy process. */
#include <cuda.h>
#include <dlfcn.h>
#include <math.h>
#include <nvml.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

#include "check.h"
#include "cuda_v1.h" /* cuGraphExecUpdate: the CUDA 10.2 ABI, called by name */
#include "fake_state.h"

#define MiB (UINT64_C(1) << 20)
static const uint64_t footprint = 400 * MiB; /* context 300 MiB + lazy modules 100 MiB */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

static nvmlReturn_t (*nvml_init)(void);
static nvmlReturn_t (*nvml_handle)(unsigned int, nvmlDevice_t *);
static nvmlReturn_t (*nvml_proc_util)(nvmlDevice_t, nvmlProcessUtilizationSample_t *,
                                      unsigned int *, unsigned long long);
static nvmlReturn_t (*nvml_rates)(nvmlDevice_t, nvmlUtilization_t *);
static nvmlReturn_t (*nvml_running)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *);
static nvmlReturn_t (*nvml_memory)(nvmlDevice_t, nvmlMemory_t *);

static int load_nvml(void)
{
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (lib == NULL)
        return 0;
    nvml_init = (nvmlReturn_t (*)(void))dlsym(lib, "nvmlInit_v2");
    nvml_handle = (nvmlReturn_t (*)(unsigned int, nvmlDevice_t *))dlsym(
        lib, "nvmlDeviceGetHandleByIndex_v2");
    nvml_proc_util = (nvmlReturn_t (*)(nvmlDevice_t, nvmlProcessUtilizationSample_t *,
                                       unsigned int *, unsigned long long))dlsym(
        lib, "nvmlDeviceGetProcessUtilization");
    nvml_rates = (nvmlReturn_t (*)(nvmlDevice_t, nvmlUtilization_t *))dlsym(
        lib, "nvmlDeviceGetUtilizationRates");
    nvml_running = (nvmlReturn_t (*)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *))dlsym(
        lib, "nvmlDeviceGetComputeRunningProcesses_v3");
    nvml_memory = (nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t *))dlsym(
        lib, "nvmlDeviceGetMemoryInfo");
    return nvml_init && nvml_handle && nvml_proc_util && nvml_rates && nvml_running &&
           nvml_memory && nvml_init() == NVML_SUCCESS;
}

/* What a worker child reports through its pipe. */
struct report {
    uint64_t own_busy, device_busy, wall;
    uint64_t own_bytes;           /* fake_cuda_device_used after its first launch */
    size_t free_b, total_b;       /* cuMemGetInfo then */
    int fine;
};

static void cuda_start(void)
{
    CUcontext ctx;
    cuInit(0);
    cuDevicePrimaryCtxRetain(&ctx, 0);
    cuCtxSetCurrent(ctx);
}

/* 2 ms kernels back to back for `seconds` after the byte on go_fd, then one sync. No sync in
 * between: the fake's push buffer (FAKE_CUDA_QUEUE_NS, 200 ms) blocks a launch while it is
 * full, so the worker keeps 200 ms queued and a worker descheduled for less than that (a loaded
 * CI machine) still keeps its share of the GPU busy; with a sync every 4 kernels a stall of
 * a few ms left the GPU idle and the shares below their bounds. */
static int worker(double seconds, int go_fd, int out_fd)
{
    struct report r = {.fine = 1};
    cuda_start();
    r.fine &= cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) == CUDA_SUCCESS;
    r.fine &= cuCtxSynchronize() == CUDA_SUCCESS;
    r.own_bytes = fake_cuda_device_used(0);
    r.fine &= cuMemGetInfo_v2(&r.free_b, &r.total_b) == CUDA_SUCCESS;
    char byte;
    if (go_fd >= 0 && read(go_fd, &byte, 1) != 1)
        return 2;
    uint64_t own0 = fake_cuda_busy_ns(0), dev0 = fake_cuda_device_busy_ns(0), t0 = now_ns();
    uint64_t until = t0 + (uint64_t)(seconds * 1e9);
    while (now_ns() < until)
        r.fine &= cuLaunchKernel(NULL, 2000, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL) == CUDA_SUCCESS;
    r.fine &= cuCtxSynchronize() == CUDA_SUCCESS;
    r.wall = now_ns() - t0;
    r.own_busy = fake_cuda_busy_ns(0) - own0;
    r.device_busy = fake_cuda_device_busy_ns(0) - dev0;
    return write(out_fd, &r, sizeof r) == (ssize_t)sizeof r ? 0 : 2;
}

static pid_t spawn_worker(double seconds, int go_fd, int out[2])
{
    if (pipe(out) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0)
        _exit(worker(seconds, go_fd, out[1]));
    close(out[1]);
    return pid;
}

static int collect(pid_t pid, int fd, struct report *r)
{
    int status;
    int got = read(fd, r, sizeof *r) == (ssize_t)sizeof *r;
    close(fd);
    return waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0 &&
           got && r->fine;
}

static double pct(uint64_t part, uint64_t whole) { return 100.0 * (double)part / (double)whole; }

static void alone(void)
{
    int out[2];
    pid_t pid = spawn_worker(0.6, -1, out);
    struct report r;
    if (!check(pid > 0 && collect(pid, out[0], &r), "a worker alone ran"))
        return;
    /* Not 100: the worker's first launch after the go and its last sync's wake-up. */
    check(pct(r.own_busy, r.wall) >= 90.0, "alone it gets %.1f%% of the GPU",
          pct(r.own_busy, r.wall));
    check(r.own_bytes == footprint, "its context and lazy modules hold %llu MiB",
          (unsigned long long)(r.own_bytes / MiB));
    check(r.total_b == fake_cuda_device_total(0) && r.total_b - r.free_b == footprint,
          "cuMemGetInfo: free = total - %llu MiB", (unsigned long long)((r.total_b - r.free_b) / MiB));
}

static unsigned long long realtime_us(void)
{
    struct timespec real;
    clock_gettime(CLOCK_REALTIME, &real);
    return (unsigned long long)real.tv_sec * 1000000u + (unsigned long long)real.tv_nsec / 1000;
}

/* The newest stamp among n samples. */
static unsigned long long newest_of(const nvmlProcessUtilizationSample_t *s, unsigned int n)
{
    unsigned long long newest = 0;
    for (unsigned int i = 0; i < n; i++)
        newest = s[i].timeStamp > newest ? s[i].timeStamp : newest;
    return newest;
}

/* FAKE_NVML_SAMPLE_WINNER=1 over 12 sample periods of the two workers, each read alone (asked
 * since the previous one's stamp, as libvgpu asks): one sample a period, one worker's, with the
 * GPU's whole share, the same when read again; each worker has some (both missing from 12
 * draws at even odds: 1 in 2048). Asked since before the first of them, NVML averages: each
 * worker's share of the 12 periods is the periods it won (an H200's per-process samples, read
 * over a second, were never 0 and followed the shares: hook/README.md, "Fourth run"). A read
 * late enough to take in two periods (a stalled test on a loaded machine) starts the count
 * again after it; the workers run 5 s for that. */
static void one_bit(nvmlDevice_t dev, const pid_t kids[2])
{
    setenv("FAKE_NVML_SAMPLE_WINNER", "1", 1);
    const unsigned long long period_us = 166000, two_periods_us = 250000;
    unsigned long long last = realtime_us() - 100000, first = 0; /* under a period */
    int periods = 0, single = 1, same = 1, won[2] = {0, 0}, restarts = 0;
    nvmlProcessUtilizationSample_t all[8];
    unsigned int count = 0;
    nvmlReturn_t rc = NVML_ERROR_UNKNOWN;
    for (uint64_t until = now_ns() + 3500000000u; now_ns() < until;) {
        nvmlProcessUtilizationSample_t s[8], again[8];
        unsigned int got = 8, got2 = 8;
        if (nvml_proc_util(dev, s, &got, last) != NVML_SUCCESS) {
            sleep_ms(20);
            continue;
        }
        unsigned long long stamp = newest_of(s, got);
        if (stamp - last > two_periods_us) { /* two periods in one read: start again after */
            periods = won[0] = won[1] = 0;
            restarts++;
            last = stamp;
            continue;
        }
        if (periods == 0)
            first = stamp - period_us / 2; /* within this period: since before it */
        periods++;
        last = stamp;
        single &= got == 1 && s[0].smUtil >= 90; /* not 100: the workers' CPU side (ASan) */
        if (nvml_proc_util(dev, again, &got2, last - 1) == NVML_SUCCESS &&
            newest_of(again, got2) == last) /* not a period that ended in between */
            same &= got2 == 1 && again[0].pid == s[0].pid;
        for (int k = 0; k < 2; k++)
            won[k] += s[0].pid == (unsigned int)kids[k];
        if (periods < 12)
            continue;
        count = 8; /* all 12 at once, unless a period ended meanwhile: then one more */
        rc = nvml_proc_util(dev, all, &count, first);
        if (rc == NVML_SUCCESS && newest_of(all, count) == last)
            break;
    }
    unsetenv("FAKE_NVML_SAMPLE_WINNER");
    check(periods >= 12 && single && won[0] + won[1] == periods,
          "FAKE_NVML_SAMPLE_WINNER=1: %d periods, each one sample, a worker's, with the GPU's "
          "whole share (%d restarts)", periods, restarts);
    check(won[0] > 0 && won[1] > 0, "... the workers had %d and %d of them", won[0], won[1]);
    check(same, "... and a period read again names the same one");
    int averaged = rc == NVML_SUCCESS && newest_of(all, count) == last &&
                   count == (unsigned int)((won[0] > 0) + (won[1] > 0));
    int share[2] = {0, 0}; /* a worker without a sample: 0 */
    for (unsigned int i = 0; averaged && i < count; i++)
        for (int k = 0; k < 2; k++)
            if (all[i].pid == (unsigned int)kids[k])
                share[k] = (int)all[i].smUtil;
    for (int k = 0; k < 2; k++) {
        int expect = 100 * won[k] / periods;
        averaged &= share[k] <= expect + 1 && share[k] >= expect - 10;
    }
    check(averaged, "... asked since before them, each worker's share of the %d: %d and %d %% "
          "(won %d and %d)", periods, share[0], share[1], won[0], won[1]);
}

/* NVML while two workers share the GPU (called mid-run). */
static void nvml_views(nvmlDevice_t dev, const pid_t kids[2])
{
    nvmlProcessUtilizationSample_t s[8];
    unsigned int count = 0;
    /* Since 0: averaged over every period NVML keeps, alone()'s before the workers started
     * (0.7 s ago) too; the lone worker, gone, has no sample ("per process running"). */
    nvmlReturn_t rc = nvml_proc_util(dev, NULL, &count, 0);
    check(rc == NVML_ERROR_INSUFFICIENT_SIZE && count == 2,
          "process utilisation since 0: NULL buffer -> INSUFFICIENT_SIZE, %u samples needed "
          "(the workers', not the gone lone worker's)", count);
    count = 8;
    rc = nvml_proc_util(dev, s, &count, 0);
    check(rc == NVML_SUCCESS && count == 2 && s[0].smUtil > 10 && s[0].smUtil < 40 &&
              s[1].smUtil > 10 && s[1].smUtil < 40,
          "... each worker's share of every period kept, the earlier ones included: %u and %u %%",
          count > 0 ? s[0].smUtil : 0, count > 1 ? s[1].smUtil : 0);
    /* Since half a second ago: the two workers' periods alone (they started 0.7 s ago). */
    unsigned long long since = realtime_us() - 500000;
    count = 1;
    check(nvml_proc_util(dev, s, &count, since) == NVML_ERROR_INSUFFICIENT_SIZE && count == 2,
          "since 0.5 s ago, a buffer of 1 -> INSUFFICIENT_SIZE with the count, 2");
    nvmlReturn_t again = NVML_SUCCESS;
    unsigned long long stamp = 0, asked_us = 0;
    for (int attempt = 0; attempt < 3 && again != NVML_ERROR_NOT_FOUND; attempt++) {
        count = 8;
        asked_us = realtime_us();
        if (nvml_proc_util(dev, s, &count, since) != NVML_SUCCESS)
            break;
        stamp = s[0].timeStamp;
        unsigned int count2 = 8;
        nvmlProcessUtilizationSample_t s2[8];
        again = nvml_proc_util(dev, s2, &count2, stamp); /* a period may end in between: retry */
    }
    int seen = 0;
    for (unsigned int i = 0; i < count && i < 8; i++)
        for (int k = 0; k < 2; k++)
            if (s[i].pid == (unsigned int)kids[k] && s[i].smUtil >= 40 && s[i].smUtil <= 60 &&
                s[i].timeStamp == stamp)
                seen |= 1 << k;
    check(count == 2 && seen == 3, "one sample per worker, smUtil %u and %u (near 50) over the "
          "periods since", s[0].smUtil, count > 1 ? s[1].smUtil : 0);
    /* Within a period (166 ms) before the call: timed from the call, not from after it, so
     * that a stall of this process in between does not count. */
    unsigned long long real_us = realtime_us();
    check(stamp <= real_us && asked_us < stamp + 200000,
          "stamped with the latest period's end in CLOCK_REALTIME us (%lld us before the call)",
          (long long)asked_us - (long long)stamp);
    check(again == NVML_ERROR_NOT_FOUND, "asked again with that timestamp: NOT_FOUND");
    setenv("FAKE_NVML_NO_PROCESS_UTIL", "1", 1);
    count = 8;
    check(nvml_proc_util(dev, s, &count, 0) == NVML_ERROR_NOT_SUPPORTED,
          "FAKE_NVML_NO_PROCESS_UTIL=1: NOT_SUPPORTED");
    unsetenv("FAKE_NVML_NO_PROCESS_UTIL");
    nvmlUtilization_t rates = {0};
    rc = nvml_rates(dev, &rates);
    check(rc == NVML_SUCCESS && rates.gpu >= 95,
          "device utilisation %u%%", rates.gpu);

    nvmlProcessInfo_t infos[8];
    count = 1;
    check(nvml_running(dev, &count, infos) == NVML_ERROR_INSUFFICIENT_SIZE && count == 2,
          "running processes: a buffer of 1 -> INSUFFICIENT_SIZE, 2");
    count = 8;
    seen = 0;
    if (nvml_running(dev, &count, infos) == NVML_SUCCESS)
        for (unsigned int i = 0; i < count; i++)
            for (int k = 0; k < 2; k++)
                if (infos[i].pid == (unsigned int)kids[k] && infos[i].usedGpuMemory == footprint)
                    seen |= 1 << k;
    check(count == 2 && seen == 3, "both workers listed with their 400 MiB of context + modules");
    nvmlMemory_t mem = {0};
    rc = nvml_memory(dev, &mem);
    check(rc == NVML_SUCCESS && mem.used == 2 * footprint + 5 * MiB,
          "nvmlDeviceGetMemoryInfo used = both footprints + 5 MiB reserved (%llu MiB)",
          mem.used / MiB);
    one_bit(dev, kids);
}

static void shared(nvmlDevice_t dev)
{
    int go[2], out[2][2];
    pid_t kids[2];
    if (!check(pipe(go) == 0, "pipe"))
        return;
    for (int k = 0; k < 2; k++)
        kids[k] = spawn_worker(5.0, go[0], out[k]);
    close(go[0]);
    sleep_ms(50); /* both have their context */
    if (write(go[1], "gg", 2) != 2)
        check(0, "start the workers");
    close(go[1]);
    sleep_ms(700);
    nvml_views(dev, kids);
    struct report r[2];
    for (int k = 0; k < 2; k++) {
        if (!check(kids[k] > 0 && collect(kids[k], out[k][0], &r[k]), "worker %d ran", k))
            return;
        check(fabs(pct(r[k].own_busy, r[k].wall) - 50.0) <= 5.0, "worker %d got %.1f%% of the GPU",
              k, pct(r[k].own_busy, r[k].wall));
        check(pct(r[k].device_busy, r[k].wall) >= 95.0, "the GPU was %.1f%% busy meanwhile",
              pct(r[k].device_busy, r[k].wall));
    }
}

/* What the timing child (timer) measured with its events. */
struct spans {
    int fine;
    CUresult early, no_timing, unrecorded; /* elapsed time asked too early, of an event made
                                            * with CU_EVENT_DISABLE_TIMING, of one never
                                            * recorded */
    int query_before_later;  /* the event's kernel done, a later one queued: the query */
    float alone_ms;          /* a 20 ms kernel's span alone */
    float shared_min_ms, shared_max_ms; /* ... beside a process keeping the GPU busy */
};

/* One 20 ms kernel (20000 blocks of FAKE_CUDA_NS_PER_BLOCK's 1000 ns) between two records. */
static float span_of_one(CUevent a, CUevent b, int *fine)
{
    float ms = -1;
    *fine &= cuEventRecord(a, NULL) == CUDA_SUCCESS &&
             cuLaunchKernel(NULL, 20000, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) == CUDA_SUCCESS &&
             cuEventRecord(b, NULL) == CUDA_SUCCESS && cuEventSynchronize(b) == CUDA_SUCCESS &&
             cuEventElapsedTime(&ms, a, b) == CUDA_SUCCESS;
    return ms;
}

/* Times kernels alone, reports, then (after the byte on go_fd) beside a busy worker. */
static int timer(int go_fd, int out_fd)
{
    struct spans r = {.fine = 1};
    cuda_start();
    CUevent a, b, plain, untimed;
    r.fine &= cuEventCreate(&a, 0) == 0 && cuEventCreate(&b, 0) == 0 &&
              cuEventCreate(&plain, 0) == 0 &&
              cuEventCreate(&untimed, CU_EVENT_DISABLE_TIMING) == 0;
    float ms;
    r.fine &= cuEventRecord(a, NULL) == 0 &&
              cuLaunchKernel(NULL, 20000, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) == 0 &&
              cuEventRecord(b, NULL) == 0;
    r.early = cuEventElapsedTime(&ms, a, b);
    r.fine &= cuCtxSynchronize() == 0 && cuEventRecord(untimed, NULL) == 0;
    r.no_timing = cuEventElapsedTime(&ms, a, untimed);
    r.unrecorded = cuEventElapsedTime(&ms, plain, b);
    r.fine &= cuEventRecord(a, NULL) == 0 &&
              cuLaunchKernel(NULL, 20000, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) == 0 &&
              cuEventRecord(b, NULL) == 0 &&
              cuLaunchKernel(NULL, 150000, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) == 0;
    sleep_ms(60);
    r.query_before_later = cuEventQuery(b) == CUDA_SUCCESS &&
                           fake_cuda_pending_ns(0, (int)getpid()) > 0;
    r.fine &= cuCtxSynchronize() == 0;
    r.alone_ms = span_of_one(a, b, &r.fine);
    if (write(out_fd, &r, sizeof r) != (ssize_t)sizeof r)
        return 2;
    char byte;
    if (read(go_fd, &byte, 1) != 1)
        return 2;
    r.shared_min_ms = 1e9f;
    r.shared_max_ms = 0;
    for (int i = 0; i < 5; i++) {
        ms = span_of_one(a, b, &r.fine);
        r.shared_min_ms = ms < r.shared_min_ms ? ms : r.shared_min_ms;
        r.shared_max_ms = ms > r.shared_max_ms ? ms : r.shared_max_ms;
    }
    return write(out_fd, &r, sizeof r) == (ssize_t)sizeof r ? 0 : 2;
}

/* Timing events over the model (fake_gpu.h): a kernel's span is its cost alone, and about
 * twice it beside a second process that always has work, as an H200 showed (hook/README.md,
 * "Fifth run"); a query answers for the work before the record only. */
static void event_spans(void)
{
    int go[2], out[2], go_worker[2], worker_out[2];
    if (!check(pipe(go) == 0 && pipe(out) == 0 && pipe(go_worker) == 0, "pipes"))
        return;
    pid_t child = fork();
    if (child == 0) {
        close(go[1]); /* a parent that skips its write ends the child's wait */
        _exit(timer(go[0], out[1]));
    }
    close(out[1]);
    struct spans r;
    if (!check(read(out[0], &r, sizeof r) == (ssize_t)sizeof r, "the timing process ran alone"))
        return;
    check(r.early == CUDA_ERROR_NOT_READY && r.no_timing == CUDA_ERROR_INVALID_HANDLE &&
          r.unrecorded == CUDA_ERROR_INVALID_HANDLE, "elapsed time: NOT_READY before the end's "
          "work ran (%d), INVALID_HANDLE for an event without timing (%d) and one never "
          "recorded (%d), as cuda.h says", (int)r.early, (int)r.no_timing, (int)r.unrecorded);
    check(r.query_before_later, "an event whose work ran is done while later work is queued");
    check(fabsf(r.alone_ms - 20.0f) <= 0.5f, "a 20 ms kernel alone spans %.2f ms", r.alone_ms);
    pid_t worker_pid = spawn_worker(1.0, go_worker[0], worker_out);
    close(go_worker[0]);
    sleep_ms(50); /* its context made */
    int started = write(go_worker[1], "g", 1) == 1;
    sleep_ms(100);
    started &= write(go[1], "g", 1) == 1;
    close(go[1]);
    close(go_worker[1]);
    int got = started && read(out[0], &r, sizeof r) == (ssize_t)sizeof r;
    close(out[0]);
    int status = -1;
    waitpid(child, &status, 0);
    struct report w;
    check(got && status == 0 && r.fine && worker_pid > 0 &&
          collect(worker_pid, worker_out[0], &w), "both processes ran (status 0x%x)", status);
    /* The worker always has work queued: the kernel gets half the GPU throughout. */
    check(r.shared_min_ms >= 38.0f && r.shared_max_ms <= 41.0f, "beside a busy process the "
          "20 ms kernel spans %.2f-%.2f ms (the H200: 46.8 ms for a 21.6 ms kernel)",
          r.shared_min_ms, r.shared_max_ms);
}

/* A process holding memory and queued work is kill -9'd: both go away. */
static void killed(nvmlDevice_t dev)
{
    int ready[2];
    if (!check(pipe(ready) == 0, "pipe"))
        return;
    pid_t victim = fork();
    if (victim == 0) {
        cuda_start();
        CUdeviceptr p;
        int fine = cuMemAlloc_v2(&p, 1024 * MiB) == CUDA_SUCCESS;
        for (int i = 0; i < 50; i++) /* 100 ms of work: it cannot have run by the kill */
            fine &= cuLaunchKernel(NULL, 2000, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL) == 0;
        if (write(ready[1], fine ? "y" : "n", 1) != 1)
            _exit(2);
        pause();
        _exit(0);
    }
    close(ready[1]);
    char byte = 'n';
    check(read(ready[0], &byte, 1) == 1 && byte == 'y', "the victim holds 1 GiB and 100 ms of work");
    close(ready[0]);
    nvmlProcessInfo_t infos[8];
    unsigned int count = 8;
    check(nvml_running(dev, &count, infos) == NVML_SUCCESS && count == 1 &&
          infos[0].pid == (unsigned int)victim && infos[0].usedGpuMemory == 1024 * MiB + footprint,
          "NVML lists it with 1424 MiB");
    check(fake_cuda_pending_ns(0, victim) > 0, "its work is queued");
    kill(victim, SIGKILL);
    waitpid(victim, NULL, 0);
    sleep_ms(20); /* the sweep for dead processes runs at most every 10 ms */
    uint64_t busy0 = fake_cuda_device_busy_ns(0);
    count = 8;
    check(nvml_running(dev, &count, infos) == NVML_SUCCESS && count == 0 &&
          fake_cuda_device_physical_used(0) == 0, "after kill -9 its memory is gone");
    sleep_ms(30);
    check(fake_cuda_pending_ns(0, victim) == 0 && fake_cuda_device_busy_ns(0) == busy0,
          "and so is its work: the GPU is idle");
}

/* Contexts and graphs in this process. */
static void graphs_and_contexts(void)
{
    cuda_start();
    check(fake_cuda_device_used(0) == 300 * MiB, "a primary context costs 300 MiB");
    CUcontext created, cur;
    check(cuCtxCreate_v2(&created, 0, 0) == CUDA_SUCCESS && cuCtxGetCurrent(&cur) == 0 &&
          cur == created && fake_cuda_device_used(0) == 300 * MiB,
          "cuCtxCreate makes its context current; the process's context memory is charged once");
    check(cuCtxDestroy_v2(created) == CUDA_SUCCESS && cuCtxGetCurrent(&cur) == 0 && cur == NULL,
          "cuCtxDestroy");
    cuda_start(); /* retained twice now */

    CUgraph g, child;
    CUgraphNode n1, n2, n3, nc;
    CUDA_KERNEL_NODE_PARAMS k1 = {.gridDimX = 1000, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 1,
                                  .blockDimY = 1, .blockDimZ = 1};
    CUDA_KERNEL_NODE_PARAMS k2 = k1, k3 = k1;
    k2.gridDimX = 2, k2.gridDimY = 3, k2.gridDimZ = 100; /* 600 */
    k3.gridDimX = 400;
    int fine = cuGraphCreate(&g, 0) == 0 && cuGraphCreate(&child, 0) == 0;
    fine &= cuGraphAddKernelNode_v2(&n1, g, NULL, 0, &k1) == 0;
    fine &= cuGraphAddKernelNode_v2(&n2, g, &n1, 1, &k2) == 0;
    fine &= cuGraphAddKernelNode_v2(&n3, child, NULL, 0, &k3) == 0;
    fine &= cuGraphAddChildGraphNode(&nc, g, &n2, 1, child) == 0;
    check(fine, "a graph of two kernel nodes and a child graph of one");
    CUgraphNode nodes[4];
    size_t count = 0;
    CUgraphNodeType type;
    CUgraph embedded = NULL;
    CUDA_KERNEL_NODE_PARAMS got;
    check(cuGraphGetNodes(g, NULL, &count) == 0 && count == 3, "cuGraphGetNodes counts 3");
    count = 4;
    check(cuGraphGetNodes(g, nodes, &count) == 0 && count == 3 && nodes[3] == NULL &&
          cuGraphNodeGetType(nodes[2], &type) == 0 && type == CU_GRAPH_NODE_TYPE_GRAPH &&
          cuGraphChildGraphNodeGetGraph(nodes[2], &embedded) == 0 && embedded != child,
          "the child graph node holds a copy of the child graph");
    count = 1;
    check(cuGraphGetNodes(embedded, nodes, &count) == 0 && count == 1 &&
          cuGraphNodeGetType(nodes[0], &type) == 0 && type == CU_GRAPH_NODE_TYPE_KERNEL &&
          cuGraphKernelNodeGetParams_v2(nodes[0], &got) == 0 && got.gridDimX == 400,
          "its kernel node keeps gridDim");
    CUgraphExec exec;
    check(cuGraphInstantiateWithFlags(&exec, g, 0) == 0 &&
          fake_cuda_graph_exec_blocks(exec) == 2000, "the executable graph costs 2000 blocks");
    uint64_t before = fake_cuda_busy_ns(0), lazy0 = fake_cuda_device_used(0);
    uint64_t launches = fake_cuda_stats.launches[FAKE_GRAPH];
    fine = cuGraphLaunch(exec, NULL) == 0 && cuCtxSynchronize() == 0;
    uint64_t ran = fake_cuda_busy_ns(0) - before;
    check(fine && ran == 2000 * 1000 && fake_cuda_stats.launches[FAKE_GRAPH] == launches + 1,
          "cuGraphLaunch runs 2 ms of work (%llu ns)", (unsigned long long)ran);
    check(lazy0 == 300 * MiB && fake_cuda_device_used(0) == footprint,
          "the first launch loads the modules lazily: +100 MiB");
    check(cuGraphLaunch((CUgraphExec)&count, NULL) == CUDA_ERROR_INVALID_VALUE,
          "an unknown executable graph is refused");
    check(fake_cuda_graph_exec_blocks(NULL) == 100, "a NULL one still costs 100 blocks");
    CUgraph small;
    CUgraphNode ns;
    CUgraphExecUpdateResultInfo info;
    CUDA_GRAPH_INSTANTIATE_PARAMS ip = {0};
    CUgraphExec exec2;
    check(cuGraphCreate(&small, 0) == 0 && cuGraphAddKernelNode_v2(&ns, small, NULL, 0, &k3) == 0 &&
          cuGraphExecUpdate_v2(exec, small, &info) == CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE &&
          info.result == CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED &&
          fake_cuda_graph_exec_blocks(exec) == 2000,
          "cuGraphExecUpdate refuses a graph of another node count, as the driver does");
    /* g's topology (kernel, kernel, child graph of one kernel) with 400-block kernels; and one
     * whose third node is a kernel. */
    CUgraph alike, retyped;
    CUgraphNode na;
    CUgraphExecUpdateResult result;
    fine = cuGraphCreate(&alike, 0) == 0 && cuGraphCreate(&retyped, 0) == 0;
    for (int i = 0; i < 2; i++)
        fine &= cuGraphAddKernelNode_v2(&na, alike, NULL, 0, &k3) == 0 &&
                cuGraphAddKernelNode_v2(&na, retyped, NULL, 0, &k3) == 0;
    fine &= cuGraphAddChildGraphNode(&na, alike, NULL, 0, small) == 0 &&
            cuGraphAddKernelNode_v2(&na, retyped, NULL, 0, &k3) == 0;
    check(fine && cuGraphExecUpdate(exec, retyped, &na, &result) ==
                      CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE &&
          result == CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED &&
          fake_cuda_graph_exec_blocks(exec) == 2000,
          "cuGraphExecUpdate (CUDA 10.2 ABI) refuses a node of another type");
    check(cuGraphExecUpdate_v2(exec, alike, &info) == 0 &&
          info.result == CU_GRAPH_EXEC_UPDATE_SUCCESS && fake_cuda_graph_exec_blocks(exec) == 1200,
          "cuGraphExecUpdate: the executable takes a graph of the same topology, 1200 blocks");
    CUgraphNode alike_nodes[3];
    size_t alike_count = 3;
    check(cuGraphExecKernelNodeSetParams_v2(exec, n1, &k1) == 0 &&
              fake_cuda_graph_exec_blocks(exec) == 1800 &&
              cuGraphGetNodes(alike, alike_nodes, &alike_count) == 0 &&
              cuGraphExecKernelNodeSetParams_v2(exec, alike_nodes[0], &k1) ==
                  CUDA_ERROR_INVALID_VALUE,
          "after the update its nodes are still named by the graph it was instantiated from "
          "(a setter of n1: 1800 blocks), not by the update's");
    check(cuGraphInstantiateWithParams(&exec2, g, &ip) == 0 &&
          ip.result_out == CUDA_GRAPH_INSTANTIATE_SUCCESS &&
          fake_cuda_graph_exec_blocks(exec2) == 2000, "cuGraphInstantiateWithParams");
    /* exec2 runs g (n1 1000, n2 600, the child 400), whose nodes name its nodes. */
    CUgraphNodeParams any = {.type = CU_GRAPH_NODE_TYPE_KERNEL};
    any.kernel = (CUDA_KERNEL_NODE_PARAMS_v3){.gridDimX = 10, .gridDimY = 1, .gridDimZ = 1};
    check(cuGraphExecKernelNodeSetParams_v2(exec2, n1, &k3) == 0 &&
          fake_cuda_graph_exec_blocks(exec2) == 1400 &&
          cuGraphExecNodeSetParams(exec2, n2, &any) == 0 &&
          fake_cuda_graph_exec_blocks(exec2) == 810 &&
          cuGraphKernelNodeGetParams_v2(n1, &got) == 0 && got.gridDimX == 1000,
          "exec-level kernel setters change the executable's blocks, not the graph's");
    check(cuGraphExecChildGraphNodeSetParams(exec2, nc, small) == 0 &&
          fake_cuda_graph_exec_blocks(exec2) == 810 && cuGraphNodeSetEnabled(exec2, n1, 0) == 0 &&
          fake_cuda_graph_exec_blocks(exec2) == 410 && cuGraphNodeSetEnabled(exec2, n1, 1) == 0 &&
          fake_cuda_graph_exec_blocks(exec2) == 810,
          "a child graph replaced, a node disabled and enabled");
    check(cuGraphExecKernelNodeSetParams_v2(exec2, nc, &k1) == CUDA_ERROR_INVALID_VALUE &&
          cuGraphExecChildGraphNodeSetParams(exec2, n1, small) == CUDA_ERROR_INVALID_VALUE &&
          cuGraphExecKernelNodeSetParams_v2(exec2, ns, &k1) == CUDA_ERROR_INVALID_VALUE &&
          cuGraphNodeSetEnabled(exec2, ns, 0) == CUDA_ERROR_INVALID_VALUE &&
          cuGraphExecChildGraphNodeSetParams(exec2, nc, alike) == CUDA_ERROR_INVALID_VALUE &&
          cuGraphNodeSetEnabled(exec2, nc, 0) == CUDA_ERROR_INVALID_VALUE &&
          fake_cuda_graph_exec_blocks(exec2) == 810,
          "refused: a setter of the wrong node type, a node of another graph, a child graph of "
          "another topology, a child graph node disabled (kernels, memsets and copies only)");
    check(cuGraphExecDestroy(exec) == 0 && cuGraphExecDestroy(exec2) == 0 &&
          cuGraphDestroy(g) == 0 && cuGraphDestroy(child) == 0 && cuGraphDestroy(small) == 0 &&
          cuGraphDestroy(alike) == 0 && cuGraphDestroy(retyped) == 0 &&
          cuGraphExecDestroy(exec) == CUDA_ERROR_INVALID_VALUE, "graphs destroyed");
    check(cuDevicePrimaryCtxRelease_v2(0) == 0 && fake_cuda_device_used(0) == footprint &&
          cuDevicePrimaryCtxRelease_v2(0) == 0 && fake_cuda_device_used(0) == 0 &&
          cuDevicePrimaryCtxRelease_v2(0) == CUDA_ERROR_INVALID_CONTEXT,
          "releasing the last context frees its context and module memory");
}

int main(void)
{
    const char *shared_path = getenv("FAKE_GPU_SHARED");
    if (!check(shared_path != NULL && load_nvml(), "FAKE_GPU_SHARED is set and NVML loads"))
        return check_done("test_fake_gpu");
    nvmlDevice_t dev;
    check(nvml_handle(0, &dev) == NVML_SUCCESS, "NVML device 0");
    alone();
    shared(dev);
    event_spans();
    killed(dev);
    graphs_and_contexts();
    return check_done("test_fake_gpu");
}
