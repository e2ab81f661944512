/* test_contention.c - SM limits of containers that share one GPU, over the fake driver's
 * time-sliced model (FAKE_GPU_SHARED: one timeline for every process; NVML's per-process
 * samples). Each tenant is a forked child with a region (container) and an SM limit of its own,
 * running 2 ms kernels back to back (a sync every 4 launches, as a training step does); its
 * share is the GPU time it got over a measuring window after a settling time.
 *
 *   test_contention LIMIT_A LIMIT_B   two tenants; "none" = no limit. Each share must be within
 *                                     5 points of min(its limit, what the other leaves) and the
 *                                     GPU busy >= 95 % when both together ask for >= 100 %
 *   test_contention graph LIMIT [ABI] one tenant running plain kernels while it settles, then
 *                                     replaying a CUDA graph of 10 kernels: within 5 points of
 *                                     its limit over the replay. ABI: how the graph was made executable:
 *                                     "flags" (cuGraphInstantiateWithFlags, the default), "v1"
 *                                     (CUDA 10's cuGraphInstantiate), "v2-update" (CUDA 11's
 *                                     cuGraphInstantiate_v2 of one kernel, then CUDA 10.2's
 *                                     cuGraphExecUpdate to the ten). Changed once executable:
 *                                     "set-params", "set-params-v1", "node-set" (ten one-block
 *                                     kernels set to full ones by cuGraphExecKernelNodeSetParams
 *                                     _v2, its CUDA 10.1 ABI, CUDA 12.2's cuGraphExecNodeSetParams),
 *                                     "child-set" (a child graph of one one-block kernel replaced
 *                                     by the ten, cuGraphExecChildGraphNodeSetParams),
 *                                     "enable-half" (twenty kernels all disabled, then ten
 *                                     enabled again, by cuGraphNodeSetEnabled: the ten cost).
 *                                     "crowded": made after 5000 other executable graphs;
 *                                     "destroy-refused": a destroy the driver refused
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

enum { BLOCKS = 2000, GRAPH_KERNELS = 10, CROWD = 5000 };
static const double settle_s = 3.0, measure_s = 3.0;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static const CUDA_KERNEL_NODE_PARAMS full = {.gridDimX = BLOCKS, .gridDimY = 1, .gridDimZ = 1,
                                             .blockDimX = 128, .blockDimY = 1, .blockDimZ = 1};

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

/* Ten one-block kernels made executable, then set to full ones, node by node, by `abi`. */
static int set_each(CUgraphExec *exec, const char *abi)
{
    CUgraphNode nodes[GRAPH_KERNELS];
    CUgraph graph = graph_of(GRAPH_KERNELS, 1, nodes);
    if (graph == NULL || cuGraphInstantiateWithFlags(exec, graph, 0) != CUDA_SUCCESS)
        return -1;
    CUDA_KERNEL_NODE_PARAMS_v1 v1 = {.gridDimX = BLOCKS, .gridDimY = 1, .gridDimZ = 1};
    CUgraphNodeParams any = {.type = CU_GRAPH_NODE_TYPE_KERNEL};
    any.kernel.gridDimX = BLOCKS, any.kernel.gridDimY = 1, any.kernel.gridDimZ = 1;
    for (int i = 0; i < GRAPH_KERNELS; i++) {
        CUresult rc = strcmp(abi, "set-params") == 0
            ? cuGraphExecKernelNodeSetParams_v2(*exec, nodes[i], &full)
            : strcmp(abi, "set-params-v1") == 0
            ? cuGraphExecKernelNodeSetParams(*exec, nodes[i], &v1)
            : cuGraphExecNodeSetParams(*exec, nodes[i], &any);
        if (rc != CUDA_SUCCESS)
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
        return cuGraphInstantiateWithFlags(exec, graph, 0) == CUDA_SUCCESS ? 0 : -1;
    if (strcmp(abi, "v1") == 0)
        return cuGraphInstantiate(exec, graph, &error_node, log, sizeof log) == CUDA_SUCCESS
                   ? 0 : -1;
    if (strcmp(abi, "v2-update") == 0) {
        CUgraph one = graph_of(1, BLOCKS, NULL);
        return one != NULL &&
               cuGraphInstantiate_v2(exec, one, &error_node, log, sizeof log) == CUDA_SUCCESS &&
               cuGraphExecUpdate(*exec, graph, &error_node, &result) == CUDA_SUCCESS ? 0 : -1;
    }
    if (strncmp(abi, "set-params", 10) == 0 || strcmp(abi, "node-set") == 0)
        return set_each(exec, abi);
    if (strcmp(abi, "child-set") == 0) {
        CUgraph outer, small = graph_of(1, 1, NULL);
        return small != NULL && cuGraphCreate(&outer, 0) == CUDA_SUCCESS &&
               cuGraphAddChildGraphNode(&node, outer, NULL, 0, small) == CUDA_SUCCESS &&
               cuGraphInstantiateWithFlags(exec, outer, 0) == CUDA_SUCCESS &&
               cuGraphExecChildGraphNodeSetParams(*exec, node, graph) == CUDA_SUCCESS ? 0 : -1;
    }
    if (strcmp(abi, "destroy-refused") == 0) {
        if (cuGraphInstantiateWithFlags(exec, graph, 0) != CUDA_SUCCESS)
            return -1;
        snprintf(fake_cuda_fail_next, sizeof fake_cuda_fail_next, "cuGraphExecDestroy");
        return cuGraphExecDestroy(*exec) == CUDA_ERROR_UNKNOWN ? 0 : -1;
    }
    if (strcmp(abi, "crowded") == 0) {
        CUgraph one = graph_of(1, 1, NULL);
        CUgraphExec other;
        for (int i = 0; i < CROWD; i++)
            if (one == NULL || cuGraphInstantiateWithFlags(&other, one, 0) != CUDA_SUCCESS)
                return -1;
        return cuGraphInstantiateWithFlags(exec, graph, 0) == CUDA_SUCCESS ? 0 : -1;
    }
    if (strcmp(abi, "enable-half") == 0) {
        CUgraph twice = graph_of(2 * GRAPH_KERNELS, BLOCKS, nodes);
        if (twice == NULL || cuGraphInstantiateWithFlags(exec, twice, 0) != CUDA_SUCCESS)
            return -1;
        for (int i = 0; i < 2 * GRAPH_KERNELS; i++)
            if (cuGraphNodeSetEnabled(*exec, nodes[i], 0) != CUDA_SUCCESS)
                return -1;
        for (int i = 0; i < GRAPH_KERNELS; i++)
            if (cuGraphNodeSetEnabled(*exec, nodes[2 * i], 1) != CUDA_SUCCESS)
                return -1;
        return 0;
    }
    return -1;
}

/* An executable graph that runs ten full kernels, made by `abi`; NULL if the driver did not
 * make exactly that (the fake's own count, so that a case cannot pass on a graph it never ran). */
static CUgraphExec make_graph(const char *abi)
{
    CUgraphExec exec = NULL;
    if (make(&exec, abi) != 0 ||
        fake_cuda_graph_exec_blocks(exec) != (uint64_t)GRAPH_KERNELS * BLOCKS)
        return NULL;
    return exec;
}

/* One tenant: its own region and limit, set before its first CUDA call (the library reads them
 * when it attaches). Writes its GPU share (percent) over the window to fd. */
static void tenant(int fd, const char *region, const char *limit, const char *graph)
{
    setenv("CUDA_DEVICE_MEMORY_SHARED_CACHE", region, 1);
    if (strcmp(limit, "none") != 0)
        setenv("CUDA_DEVICE_SM_LIMIT", limit, 1);
    CUcontext ctx;
    double share = -1;
    CUgraphExec exec = NULL;
    if (cuInit(0) == CUDA_SUCCESS && cuDevicePrimaryCtxRetain(&ctx, 0) == CUDA_SUCCESS &&
        cuCtxSetCurrent(ctx) == CUDA_SUCCESS && (!graph || (exec = make_graph(graph)) != NULL)) {
        double start = now_s(), window = 0;
        uint64_t busy0 = 0;
        for (unsigned i = 0;; i++) {
            /* A graph tenant warms up with plain kernels, as PyTorch does before it captures a
             * graph: the limiter's rate then suits kernels, and a graph that cost one token
             * would run almost unthrottled until the rate caught up. */
            int replaying = graph != NULL && window != 0;
            if (replaying)
                cuGraphLaunch(exec, NULL);
            else
                cuLaunchKernel(NULL, BLOCKS, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
            if (replaying || i % 4 == 3)
                cuCtxSynchronize();
            double t = now_s() - start;
            if (window == 0 && t >= settle_s) {
                cuCtxSynchronize();
                window = now_s();
                busy0 = fake_cuda_busy_ns(0);
            }
            if (t >= settle_s + measure_s)
                break;
        }
        cuCtxSynchronize();
        share = 100.0 * (double)(fake_cuda_busy_ns(0) - busy0) / ((now_s() - window) * 1e9);
    }
    if (write(fd, &share, sizeof share) != sizeof share)
        _exit(2);
    _exit(0);
}

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

static double result(pid_t pid, int fd)
{
    double share = -1;
    if (read(fd, &share, sizeof share) != sizeof share)
        share = -1;
    close(fd);
    int status;
    waitpid(pid, &status, 0);
    return share;
}

static double limit_of(const char *limit) { return strcmp(limit, "none") == 0 ? 100.0 : atof(limit); }

int main(int argc, char **argv)
{
    const char *dir = getenv("CONTENTION_DIR");
    if (!check((argc == 3 || (argc == 4 && strcmp(argv[1], "graph") == 0)) && dir != NULL &&
                   getenv("FAKE_GPU_SHARED") != NULL,
               "usage: CONTENTION_DIR=... FAKE_GPU_SHARED=... test_contention A B | graph L [ABI]"))
        return check_done("test_contention");
    if (strcmp(argv[1], "graph") == 0) {
        int fd;
        const char *abi = argc == 4 ? argv[3] : "flags";
        pid_t pid = start_tenant(&fd, dir, "graph", argv[2], abi);
        double share = result(pid, fd), limit = limit_of(argv[2]);
        check(fabs(share - limit) <= 5.0,
              "a CUDA graph of %d kernels (%s) under limit %.0f%%: %.1f%%", GRAPH_KERNELS, abi,
              limit, share);
        return check_done("test_contention");
    }
    int fa, fb;
    pid_t a = start_tenant(&fa, dir, "a", argv[1], NULL);
    pid_t b = start_tenant(&fb, dir, "b", argv[2], NULL);
    double sa = result(a, fa), sb = result(b, fb);
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
