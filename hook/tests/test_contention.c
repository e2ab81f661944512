/* test_contention.c - SM limits of containers that share one GPU. Each tenant is a forked child
 * with a region (container) and an SM limit of its own, running kernels of 2000 blocks back to
 * back (a sync every 4 launches, as a training step does), measured over a window after a
 * settling time.
 *
 *   test_contention LIMIT_A LIMIT_B   two tenants at once; "none" = no limit. Over the fake
 *                                     driver's time-sliced model (FAKE_GPU_SHARED: one timeline
 *                                     for every process; NVML's per-process samples), each
 *                                     share of GPU time must be within 5 points of min(its
 *                                     limit, what the other leaves) and the GPU busy >= 95 %
 *                                     when both together ask for >= 100 %
 *   test_contention graph LIMIT [ABI] one tenant running plain kernels while it settles, then
 *                                     replaying a CUDA graph of 10 kernels: its kernels/s over
 *                                     the replay within 5 points of LIMIT % of an unlimited
 *                                     tenant's, run first (over the fake, its share of GPU time
 *                                     too). ABI: how the graph was made executable:
 *                                     "flags" (cuGraphInstantiateWithFlags, the default), "v1"
 *                                     (CUDA 10's cuGraphInstantiate), "v2-update" (CUDA 11's
 *                                     cuGraphInstantiate_v2 of ten one-block kernels, then CUDA
 *                                     10.2's cuGraphExecUpdate to ten full ones),
 *                                     "update-refused" (ten full kernels, then an update to one
 *                                     one-block kernel, which the driver refuses). Changed once
 *                                     executable: "set-params", "set-params-v1", "node-set" (ten
 *                                     one-block kernels set to full ones by
 *                                     cuGraphExecKernelNodeSetParams_v2, its CUDA 10.1 ABI,
 *                                     CUDA 12.2's cuGraphExecNodeSetParams), "child-set" (a
 *                                     child graph of ten one-block kernels replaced by ten full
 *                                     ones, cuGraphExecChildGraphNodeSetParams), "enable-half"
 *                                     (twenty kernels all disabled, then ten enabled again, by
 *                                     cuGraphNodeSetEnabled: the ten cost). "crowded": made
 *                                     after 5000 other executable graphs; "destroy-refused"
 *                                     (the fake only): a destroy the driver refused
 *
 * The graph cases run on a real GPU too (gpu-check.sh): without the fake's exports (weak here)
 * the kernel is real PTX and only the measured rates are compared.
 * What the other leaves: a tenant limited to L takes L; an unlimited one takes the rest; two
 * unlimited ones split the GPU. */
#include <cuda.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <sys/wait.h>
#include <time.h>

#include "check.h"
#include "cuda_v1.h" /* the CUDA 10/11 graph exports, called by name */
#include "fake_state.h"

/* The fake's own exports, absent from a real driver: NULL there. */
#pragma weak fake_cuda_busy_ns
#pragma weak fake_cuda_graph_exec_blocks
#pragma weak fake_cuda_fail_next

enum { BLOCKS = 2000, GRAPH_KERNELS = 10, CROWD = 5000 };
/* Seconds of settling and of measuring; CONTENTION_SETTLE_S and CONTENTION_MEASURE_S change
 * them (a real GPU's NVML samples are coarser than the fake's). */
static double settle_s = 3.0, measure_s = 3.0;

static int on_fake(void) { return fake_cuda_busy_ns != NULL; }

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The kernel every tenant runs: each block waits vgpu_spin_ns on the GPU's clock, so on a GPU
 * a grid of BLOCKS (one wave of 128-thread blocks on an H100) takes about a millisecond. The
 * fake finds the entry but runs no code: it times a kernel by its blocks (2 ms). */
static const char spin_ptx[] =
    ".version 7.0\n.target sm_70\n.address_size 64\n"
    ".visible .entry vgpu_spin(.param .u64 vgpu_spin_ns)\n{\n"
    "    .reg .pred %p;\n    .reg .b64 %rd<4>;\n"
    "    ld.param.u64 %rd0, [vgpu_spin_ns];\n"
    "    mov.u64 %rd1, %globaltimer;\n"
    "    add.u64 %rd2, %rd1, %rd0;\n"
    "WAIT:\n    mov.u64 %rd3, %globaltimer;\n"
    "    setp.lt.u64 %p, %rd3, %rd2;\n"
    "    @%p bra WAIT;\n    ret;\n}\n";
static uint64_t spin_ns = 1000 * 1000;
static void *spin_args[] = {&spin_ns};

/* A full kernel: BLOCKS blocks of vgpu_spin (func set by load_kernel). */
static CUDA_KERNEL_NODE_PARAMS full = {.gridDimX = BLOCKS, .gridDimY = 1, .gridDimZ = 1,
                                       .blockDimX = 128, .blockDimY = 1, .blockDimZ = 1,
                                       .kernelParams = spin_args};

static int load_kernel(void)
{
    CUmodule module;
    return cuModuleLoadData(&module, spin_ptx) == CUDA_SUCCESS &&
                   cuModuleGetFunction(&full.func, module, "vgpu_spin") == CUDA_SUCCESS
               ? 0 : -1;
}

/* A chain of `kernels` kernel nodes of `blocks` blocks each; nodes (if not NULL) gets them. */
static CUgraph graph_of(int kernels, unsigned blocks, CUgraphNode *nodes)
{
    CUgraph graph;
    if (cuGraphCreate(&graph, 0) != CUDA_SUCCESS)
        return NULL;
    CUDA_KERNEL_NODE_PARAMS params = full;
    params.gridDimX = blocks;
    CUgraphNode previous = NULL;
    for (int i = 0; i < kernels; i++) {
        CUgraphNode node;
        if (cuGraphAddKernelNode(&node, graph, previous ? &previous : NULL, previous ? 1 : 0,
                                 &params) != CUDA_SUCCESS)
            return NULL;
        previous = node;
        if (nodes != NULL)
            nodes[i] = node;
    }
    return graph;
}

/* Whether the driver did `what`; if not, says what it answered (a first run on a new driver
 * must show which call it refused). */
static int done(CUresult rc, const char *what)
{
    if (rc != CUDA_SUCCESS)
        fprintf(stderr, "test_contention: %s answered CUresult %d\n", what, (int)rc);
    return rc == CUDA_SUCCESS;
}

/* Ten one-block kernels made executable, then set to full ones, node by node, by `abi`. */
static int set_each(CUgraphExec *exec, const char *abi)
{
    CUgraphNode nodes[GRAPH_KERNELS];
    CUgraph graph = graph_of(GRAPH_KERNELS, 1, nodes);
    if (graph == NULL || !done(cuGraphInstantiateWithFlags(exec, graph, 0), "instantiate"))
        return -1;
    CUDA_KERNEL_NODE_PARAMS_v1 v1;
    memcpy(&v1, &full, sizeof v1); /* the CUDA 10 fields lead the CUDA 12 struct */
    CUgraphNodeParams any = {.type = CU_GRAPH_NODE_TYPE_KERNEL};
    memcpy(&any.kernel, &full, sizeof full);
    for (int i = 0; i < GRAPH_KERNELS; i++) {
        CUresult rc = strcmp(abi, "set-params") == 0
            ? cuGraphExecKernelNodeSetParams_v2(*exec, nodes[i], &full)
            : strcmp(abi, "set-params-v1") == 0
            ? cuGraphExecKernelNodeSetParams(*exec, nodes[i], &v1)
            : cuGraphExecNodeSetParams(*exec, nodes[i], &any);
        if (!done(rc, abi))
            return -1;
    }
    return 0;
}

static int make(CUgraphExec *exec, const char *abi)
{
    CUgraph graph = graph_of(GRAPH_KERNELS, BLOCKS, NULL);
    CUgraphNode error_node, node, nodes[2 * GRAPH_KERNELS];
    CUgraphExecUpdateResult result;
    char log[64];
    if (graph == NULL)
        return -1;
    if (strcmp(abi, "flags") == 0)
        return done(cuGraphInstantiateWithFlags(exec, graph, 0), abi) ? 0 : -1;
    if (strcmp(abi, "v1") == 0)
        return done(cuGraphInstantiate(exec, graph, &error_node, log, sizeof log), abi) ? 0 : -1;
    if (strcmp(abi, "v2-update") == 0) {
        /* The driver updates only to a graph of the same topology: the same ten kernels. */
        CUgraph small = graph_of(GRAPH_KERNELS, 1, NULL);
        return small != NULL &&
               done(cuGraphInstantiate_v2(exec, small, &error_node, log, sizeof log),
                    "cuGraphInstantiate_v2") &&
               done(cuGraphExecUpdate(*exec, graph, &error_node, &result), "cuGraphExecUpdate")
                   ? 0 : -1;
    }
    if (strcmp(abi, "update-refused") == 0) {
        /* The driver refuses an update to another topology: the graph runs, and costs, ten. */
        CUgraph one = graph_of(1, 1, NULL);
        CUgraphExecUpdateResultInfo info;
        return one != NULL && done(cuGraphInstantiateWithFlags(exec, graph, 0), "instantiate") &&
               cuGraphExecUpdate_v2(*exec, one, &info) == CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE
                   ? 0 : -1;
    }
    if (strncmp(abi, "set-params", 10) == 0 || strcmp(abi, "node-set") == 0)
        return set_each(exec, abi);
    if (strcmp(abi, "child-set") == 0) {
        /* A child graph is replaced only by one of the same topology. */
        CUgraph outer, small = graph_of(GRAPH_KERNELS, 1, NULL);
        return small != NULL && cuGraphCreate(&outer, 0) == CUDA_SUCCESS &&
               cuGraphAddChildGraphNode(&node, outer, NULL, 0, small) == CUDA_SUCCESS &&
               done(cuGraphInstantiateWithFlags(exec, outer, 0), "instantiate") &&
               done(cuGraphExecChildGraphNodeSetParams(*exec, node, graph), abi) ? 0 : -1;
    }
    if (strcmp(abi, "destroy-refused") == 0) {
        if (fake_cuda_fail_next == NULL || cuGraphInstantiateWithFlags(exec, graph, 0) != 0)
            return -1;
        snprintf(fake_cuda_fail_next, sizeof fake_cuda_fail_next, "cuGraphExecDestroy");
        return cuGraphExecDestroy(*exec) == CUDA_ERROR_UNKNOWN ? 0 : -1;
    }
    if (strcmp(abi, "crowded") == 0) {
        CUgraph one = graph_of(1, 1, NULL);
        CUgraphExec other;
        for (int i = 0; i < CROWD; i++)
            if (one == NULL || !done(cuGraphInstantiateWithFlags(&other, one, 0), abi))
                return -1;
        return done(cuGraphInstantiateWithFlags(exec, graph, 0), abi) ? 0 : -1;
    }
    if (strcmp(abi, "enable-half") == 0) {
        CUgraph twice = graph_of(2 * GRAPH_KERNELS, BLOCKS, nodes);
        if (twice == NULL || !done(cuGraphInstantiateWithFlags(exec, twice, 0), "instantiate"))
            return -1;
        for (int i = 0; i < 2 * GRAPH_KERNELS; i++)
            if (!done(cuGraphNodeSetEnabled(*exec, nodes[i], 0), abi))
                return -1;
        for (int i = 0; i < GRAPH_KERNELS; i++)
            if (!done(cuGraphNodeSetEnabled(*exec, nodes[2 * i], 1), abi))
                return -1;
        return 0;
    }
    fprintf(stderr, "test_contention: no graph case \"%s\"\n", abi);
    return -1;
}

/* An executable graph that runs ten full kernels, made by `abi`; NULL if the driver did not
 * make exactly that (over the fake, its own count, so that a case cannot pass on a graph it
 * never ran). */
static CUgraphExec make_graph(const char *abi)
{
    CUgraphExec exec = NULL;
    if (make(&exec, abi) != 0)
        return NULL;
    uint64_t blocks = on_fake() ? fake_cuda_graph_exec_blocks(exec) : GRAPH_KERNELS * BLOCKS;
    if (blocks != (uint64_t)GRAPH_KERNELS * BLOCKS) {
        fprintf(stderr, "test_contention: the %s graph runs %llu blocks\n", abi,
                (unsigned long long)blocks);
        return NULL;
    }
    return exec;
}

/* What a tenant measured over its window: kernels finished per second, and (over the fake) the
 * percent of the window's GPU time it got. -1: not measured. */
struct measured {
    double rate;
    double share;
};

/* One tenant: its own region and limit, set before its first CUDA call (the library reads them
 * when it attaches). Writes what it measured over the window to fd. */
static void tenant(int fd, const char *region, const char *limit, const char *graph)
{
    setenv("CUDA_DEVICE_MEMORY_SHARED_CACHE", region, 1);
    if (strcmp(limit, "none") != 0)
        setenv("CUDA_DEVICE_SM_LIMIT", limit, 1);
    CUcontext ctx;
    struct measured m = {-1, -1};
    CUgraphExec exec = NULL;
    if (done(cuInit(0), "cuInit") && done(cuDevicePrimaryCtxRetain(&ctx, 0), "retain") &&
        cuCtxSetCurrent(ctx) == CUDA_SUCCESS && load_kernel() == 0 &&
        (!graph || (exec = make_graph(graph)) != NULL)) {
        double start = now_s(), window = 0;
        uint64_t busy0 = 0, kernels = 0;
        for (unsigned i = 0;; i++) {
            /* A graph tenant warms up with plain kernels, as PyTorch does before it captures a
             * graph: the limiter's rate then suits kernels, and a graph that cost one token
             * would run almost unthrottled until the rate caught up. */
            int replaying = graph != NULL && window != 0;
            if (replaying)
                cuGraphLaunch(exec, NULL);
            else
                cuLaunchKernel(full.func, BLOCKS, 1, 1, 128, 1, 1, 0, NULL, spin_args, NULL);
            if (window != 0)
                kernels += replaying ? GRAPH_KERNELS : 1;
            if (replaying || i % 4 == 3)
                cuCtxSynchronize();
            double t = now_s() - start;
            if (window == 0 && t >= settle_s) {
                cuCtxSynchronize();
                window = now_s();
                busy0 = on_fake() ? fake_cuda_busy_ns(0) : 0;
            }
            if (t >= settle_s + measure_s)
                break;
        }
        cuCtxSynchronize();
        double seconds = now_s() - window;
        m.rate = (double)kernels / seconds;
        if (on_fake())
            m.share = 100.0 * (double)(fake_cuda_busy_ns(0) - busy0) / (seconds * 1e9);
    }
    if (write(fd, &m, sizeof m) != sizeof m)
        _exit(2);
    _exit(0);
}

/* Starts a tenant named `name` (its region file in dir). */
static pid_t start_tenant(int *fd, const char *dir, const char *name, const char *limit,
                          const char *graph)
{
    int p[2];
    if (pipe(p) != 0)
        return -1;
    char region[512];
    snprintf(region, sizeof region, "%s/%s.cache", dir, name);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        tenant(p[1], region, limit, graph);
    }
    close(p[1]);
    *fd = p[0];
    return pid;
}

static struct measured result(pid_t pid, int fd)
{
    struct measured m = {-1, -1};
    if (read(fd, &m, sizeof m) != sizeof m)
        m.rate = m.share = -1;
    close(fd);
    int status;
    waitpid(pid, &status, 0);
    return m;
}

static double limit_of(const char *limit) { return strcmp(limit, "none") == 0 ? 100.0 : atof(limit); }

/* The graph case: an unlimited tenant's rate first, then the limited one's. */
static int graph_case(const char *dir, const char *limit_arg, const char *abi)
{
    int fd;
    pid_t pid = start_tenant(&fd, dir, "bare", "none", abi);
    struct measured bare = result(pid, fd);
    pid = start_tenant(&fd, dir, "graph", limit_arg, abi);
    struct measured got = result(pid, fd);
    double limit = limit_of(limit_arg);
    double share = bare.rate > 0 && got.rate >= 0 ? 100.0 * got.rate / bare.rate : -1;
    check(fabs(share - limit) <= 5.0,
          "a CUDA graph of %d kernels (%s) under limit %.0f%%: %.1f%% of the unlimited rate "
          "(%.1f of %.1f kernels/s)", GRAPH_KERNELS, abi, limit, share, got.rate, bare.rate);
    if (on_fake())
        check(fabs(got.share - limit) <= 5.0, "... and %.1f%% of the fake GPU's time",
              got.share);
    return check_done("test_contention");
}

int main(int argc, char **argv)
{
    const char *dir = getenv("CONTENTION_DIR");
    const char *settle = getenv("CONTENTION_SETTLE_S"), *measure = getenv("CONTENTION_MEASURE_S");
    settle_s = settle != NULL ? atof(settle) : settle_s;
    measure_s = measure != NULL ? atof(measure) : measure_s;
    int graph = argc >= 3 && strcmp(argv[1], "graph") == 0;
    if (!check((argc == 3 || (argc == 4 && graph)) && dir != NULL &&
                   (getenv("FAKE_GPU_SHARED") != NULL || (graph && !on_fake())),
               "usage: CONTENTION_DIR=... [FAKE_GPU_SHARED=...] test_contention A B | graph L "
               "[ABI] (A B: over the fake only)"))
        return check_done("test_contention");
    if (graph)
        return graph_case(dir, argv[2], argc == 4 ? argv[3] : "flags");
    int fa, fb;
    pid_t a = start_tenant(&fa, dir, "a", argv[1], NULL);
    pid_t b = start_tenant(&fb, dir, "b", argv[2], NULL);
    double sa = result(a, fa).share, sb = result(b, fb).share;
    double la = limit_of(argv[1]), lb = limit_of(argv[2]);
    /* Unlimited tenants share what the limited ones leave. */
    int unlimited = (la == 100.0) + (lb == 100.0);
    double left = 100.0 - (la < 100.0 ? la : 0) - (lb < 100.0 ? lb : 0);
    double want_a = la < 100.0 ? la : left / unlimited;
    double want_b = lb < 100.0 ? lb : left / unlimited;
    check(fabs(sa - want_a) <= 5.0, "tenant A (limit %s): %.1f%% of the GPU, expected %.0f%%",
          argv[1], sa, want_a);
    check(fabs(sb - want_b) <= 5.0, "tenant B (limit %s): %.1f%% of the GPU, expected %.0f%%",
          argv[2], sb, want_b);
    if (want_a + want_b >= 100.0)
        check(sa + sb >= 95.0, "the GPU stays busy: %.1f%% together", sa + sb);
    return check_done("test_contention");
}
