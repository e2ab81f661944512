/* test_graph_memory.c - what a CUDA graph's allocation nodes take is counted against the cap
 * (1 GiB; the fake gives the context FAKE_CUDA_CONTEXT_MIB=300). The fake driver maps a graph's
 * allocations from the device's graph memory pool at its first launch or upload, from what no
 * graph maps first, keeps them mapped for the graph until it is destroyed, and keeps the pool's
 * memory until cuDeviceGraphMemTrim, as cuda.h describes the driver; NVML shows the pool. What
 * the process holds must stay within the cap: before, a graph launch took any amount uncounted
 * until the next measurement, and a plain allocation could then take the same room again. */
#include <cuda.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "fake_state.h"
#include "region_view.h"
#include "vgpu_region.h"

static const uint64_t MiB = UINT64_C(1) << 20;
static const struct vgpu_region *region;

static int open_region(void) { return (region = region_view()) != NULL; }

static unsigned long long held_mib(void) { return fake_cuda_device_used(0) / MiB; }

static unsigned long long counted_mib(void)
{
    return vgpu_region_device_used(region, 0) / MiB;
}

/* Another thread's allocation node, added to `racing` while the driver instantiates it. */
static CUgraph racing;
static void add_allocation(void)
{
    CUgraphNode node;
    CUDA_MEM_ALLOC_NODE_PARAMS a = {.bytesize = 600 * MiB};
    a.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    a.poolProps.location = (CUmemLocation){.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0};
    cuGraphAddMemAllocNode(&node, racing, NULL, 0, &a);
}

/* Another thread's launch of `dying` while the driver destroys it. */
static CUgraphExec dying;
static CUstream dying_stream;
static CUresult dying_launched = CUDA_ERROR_UNKNOWN;
static void launch_dying(void) { dying_launched = cuGraphLaunch(dying, dying_stream); }

/* Another thread ends the capture (or ends it and begins another) while an allocation asks. */
static void end_capture(void) { fake_cuda_capturing = 0; }
static void next_capture(void) { fake_cuda_capture_id++; }
static void begin_capture(void)
{
    fake_cuda_capturing = 1;
    fake_cuda_capture_id++;
}
/* Ends the capture; once the driver has allocated, another begins. */
static void end_then_begin(void)
{
    fake_cuda_capturing = 0;
    fake_cuda_inside_fn = begin_capture;
    strcpy(fake_cuda_inside, "cuMemAllocAsync");
}

/* A graph that allocates `mib` on device 0, runs a kernel on it, and frees it: the common
 * shape of a graph's scratch memory. NULL when it cannot be built. */
static CUgraph allocating_graph(uint64_t mib)
{
    CUgraph g;
    CUgraphNode alloc, kernel, release;
    CUDA_MEM_ALLOC_NODE_PARAMS a = {.bytesize = mib * MiB};
    a.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    a.poolProps.location = (CUmemLocation){.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0};
    CUDA_KERNEL_NODE_PARAMS k = {.gridDimX = 8, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 32,
                                 .blockDimY = 1, .blockDimZ = 1};
    if (cuGraphCreate(&g, 0) != CUDA_SUCCESS ||
        cuGraphAddMemAllocNode(&alloc, g, NULL, 0, &a) != CUDA_SUCCESS ||
        cuGraphAddKernelNode(&kernel, g, &alloc, 1, &k) != CUDA_SUCCESS ||
        cuGraphAddMemFreeNode(&release, g, &kernel, 1, a.dptr) != CUDA_SUCCESS)
        return NULL;
    return g;
}

static CUgraphExec instantiated(uint64_t mib)
{
    CUgraph g = allocating_graph(mib);
    CUgraphExec e = NULL;
    if (g == NULL || cuGraphInstantiateWithFlags(&e, g, 0) != CUDA_SUCCESS)
        e = NULL;
    if (g != NULL)
        cuGraphDestroy(g);
    return e;
}

/* A child graph node set to a graph that allocates more (cuGraphExecChildGraphNodeSetParams):
 * the executable graph takes that much at its next launch. (The driver takes a child graph
 * with memory nodes only when its ownership moves to the parent, through cuGraphAddNode; the
 * fake does not check.) */
static int setters(void)
{
    CUgraph small_child = allocating_graph(100), big_child = allocating_graph(800), parent;
    CUgraphNode node;
    CUgraphExec e = NULL;
    CUresult rc = cuGraphCreate(&parent, 0) == CUDA_SUCCESS && small_child != NULL &&
                          big_child != NULL &&
                          cuGraphAddChildGraphNode(&node, parent, NULL, 0, small_child) == 0 &&
                          cuGraphInstantiateWithFlags(&e, parent, 0) == CUDA_SUCCESS
                      ? cuGraphLaunch(e, NULL) : CUDA_ERROR_UNKNOWN;
    if (!check(open_region(), "region readable"))
        return check_done("test_graph_memory setters");
    check(rc == CUDA_SUCCESS && held_mib() == 400 && counted_mib() == 400,
          "a graph whose child graph allocates 100 MiB: counted at its launch (held %llu MiB, "
          "counted %llu MiB)", held_mib(), counted_mib());
    rc = cuGraphExecChildGraphNodeSetParams(e, node, big_child);
    CUresult launched = rc == CUDA_SUCCESS ? cuGraphLaunch(e, NULL) : CUDA_ERROR_UNKNOWN;
    check(rc == CUDA_SUCCESS && launched == CUDA_ERROR_OUT_OF_MEMORY && held_mib() == 300 &&
              counted_mib() == 300,
          "its child set to one allocating 800 MiB: the next launch, which would map 800 MiB, "
          "is refused, the pool trimmed first of the 100 MiB it no longer maps (rc %d, held "
          "%llu MiB, counted %llu MiB)", launched, held_mib(), counted_mib());
    return check_done("test_graph_memory setters");
}

int main(int argc, char **argv)
{
    CUcontext ctx;
    CUstream s1, s2;
    if (argc == 2 && strcmp(argv[1], "setters") == 0)
        return cuInit(0) == CUDA_SUCCESS && cuDevicePrimaryCtxRetain(&ctx, 0) == CUDA_SUCCESS &&
                       cuCtxSetCurrent(ctx) == CUDA_SUCCESS
                   ? setters() : 1;
    check(cuInit(0) == CUDA_SUCCESS && cuDevicePrimaryCtxRetain(&ctx, 0) == CUDA_SUCCESS &&
              cuCtxSetCurrent(ctx) == CUDA_SUCCESS && cuStreamCreate(&s1, 0) == CUDA_SUCCESS &&
              cuStreamCreate(&s2, 0) == CUDA_SUCCESS,
          "a 300 MiB context, two streams");
    if (!check(open_region(), "region readable"))
        return check_done("test_graph_memory");

    /* A graph's memory is taken at its first launch, and counted then. */
    CUgraphExec big = instantiated(600);
    unsigned long long before = held_mib();
    CUresult rc = big != NULL ? cuGraphLaunch(big, s1) : CUDA_ERROR_UNKNOWN;
    check(big != NULL && before == 300 && rc == CUDA_SUCCESS && held_mib() == 900 &&
              counted_mib() == 900,
          "a graph allocating 600 MiB: instantiated with nothing taken (%llu MiB held), then "
          "launched, its memory counted at once (held %llu MiB, counted %llu MiB)", before,
          held_mib(), counted_mib());
    CUdeviceptr plain = 0;
    rc = cuMemAlloc(&plain, 200 * MiB);
    check(rc == CUDA_ERROR_OUT_OF_MEMORY && held_mib() == 900,
          "a plain 200 MiB beside it is refused (rc %d; before, nothing was counted for the "
          "graph until a measurement, and the process held 1100 MiB on the 1 GiB cap)", rc);
    int relaunched = 1;
    for (int i = 0; i < 3; i++)
        relaunched = relaunched && cuGraphLaunch(big, s1) == CUDA_SUCCESS;
    check(relaunched && held_mib() == 900 && counted_mib() == 900,
          "relaunched three times on its stream: the driver keeps its mappings, nothing more is "
          "reserved or refused (held %llu MiB, counted %llu MiB)", held_mib(), counted_mib());

    /* Another graph needs memory of its own while the first keeps its mappings. */
    CUgraphExec small = instantiated(300);
    rc = small != NULL ? cuGraphLaunch(small, s1) : CUDA_ERROR_UNKNOWN;
    check(rc == CUDA_ERROR_OUT_OF_MEMORY && held_mib() == 900 && counted_mib() == 900,
          "a second graph allocating 300 MiB is refused at its launch (rc %d; before, it ran: "
          "1200 MiB held)", rc);
    rc = cuGraphExecDestroy(big);
    check(rc == CUDA_SUCCESS && held_mib() == 900 && counted_mib() == 900,
          "the first graph destroyed: the pool keeps its 600 MiB, counted (held %llu MiB, "
          "counted %llu MiB)", held_mib(), counted_mib());
    rc = cuDeviceGraphMemTrim(0);
    check(rc == CUDA_SUCCESS && held_mib() == 300 && counted_mib() == 300,
          "cuDeviceGraphMemTrim gives back what no graph maps, and the count follows at once "
          "(held %llu MiB, counted %llu MiB)", held_mib(), counted_mib());
    rc = cuGraphLaunch(small, s1);
    check(rc == CUDA_SUCCESS && held_mib() == 600 && counted_mib() == 600 &&
              cuMemAlloc(&plain, 400 * MiB) == CUDA_SUCCESS && held_mib() == 1000,
          "the second graph runs now (held 600 MiB), and a plain 400 MiB fits beside it");

    /* An upload maps what a launch would. */
    CUgraphExec third = instantiated(100);
    rc = third != NULL ? cuGraphUpload(third, s1) : CUDA_ERROR_UNKNOWN;
    check(rc == CUDA_ERROR_OUT_OF_MEMORY && held_mib() == 1000,
          "uploading a graph allocating 100 MiB beside 1000 MiB is refused (rc %d)", rc);
    rc = cuMemFree(plain) == CUDA_SUCCESS ? cuGraphUpload(third, s1) : CUDA_ERROR_UNKNOWN;
    CUresult launched = cuGraphLaunch(third, s1);
    check(rc == CUDA_SUCCESS && launched == CUDA_SUCCESS && held_mib() == 700 &&
              counted_mib() == 700,
          "after a free it is uploaded, counted, and its launch takes nothing more (held %llu "
          "MiB, counted %llu MiB)", held_mib(), counted_mib());

    /* The same, from the instantiation (CUDA 12: CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD). */
    CUgraph g = allocating_graph(400);
    CUDA_GRAPH_INSTANTIATE_PARAMS params = {.flags = CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD,
                                            .hUploadStream = s1};
    CUgraphExec uploaded = NULL, later = NULL;
    uint64_t execs = fake_cuda_stats.graph_execs;
    rc = g != NULL ? cuGraphInstantiateWithParams(&uploaded, g, &params) : CUDA_ERROR_UNKNOWN;
    check(rc == CUDA_ERROR_OUT_OF_MEMORY && uploaded == NULL &&
              fake_cuda_stats.graph_execs == execs && held_mib() == 700,
          "a graph allocating 400 MiB, instantiated with an upload beside 700 MiB: the upload "
          "refused, and the graph destroyed again (rc %d)", rc);
    rc = cuGraphInstantiateWithFlags(&later, g, 0);
    launched = rc == CUDA_SUCCESS ? cuGraphLaunch(later, s1) : CUDA_ERROR_UNKNOWN;
    check(rc == CUDA_SUCCESS && launched == CUDA_ERROR_OUT_OF_MEMORY && held_mib() == 700,
          "instantiated without one it is made, and refused at its launch (rc %d)", launched);

    /* A stream-ordered allocation captured into a graph is an allocation node: no memory. */
    fake_cuda_capturing = 1;
    CUdeviceptr node = 0;
    rc = cuMemAllocAsync(&node, 500 * MiB, s2);
    CUresult freed = cuMemFreeAsync(node, s2);
    fake_cuda_capturing = 0;
    check(rc == CUDA_SUCCESS && freed == CUDA_SUCCESS && held_mib() == 700 && counted_mib() == 700,
          "500 MiB allocated and freed on a stream being captured: graph nodes, not counted "
          "(the graph's launch counts them; counted at the capture too, memory a graph keeps "
          "after it ends would count twice): held %llu MiB, counted %llu MiB", held_mib(),
          counted_mib());

    /* With the pool's figures unanswered, a graph whose mappings are kept is not taken on
     * trust: its allocations are counted again until a measurement. */
    strcpy(fake_cuda_fail_next, "cuDeviceGetGraphMemAttribute");
    rc = cuGraphLaunch(third, s1);
    unsigned long long counted_then = counted_mib();
    sleep_s(1.1); /* the next allocation measures */
    CUdeviceptr small_plain = 0, near = 0;
    CUresult measured = cuMemAlloc(&small_plain, 4 * MiB);
    check(rc == CUDA_SUCCESS && counted_then == 800 && measured == CUDA_SUCCESS &&
              held_mib() == 704 && counted_mib() == 704,
          "with the pool's figures unanswered, the relaunch of a kept graph counts its 100 MiB "
          "again (%llu MiB counted), until a measurement (held %llu MiB, counted %llu MiB)",
          counted_then, held_mib(), counted_mib());

    /* The driver maps a kept graph anew (another graph's allocation took its memory): counted
     * as the pool grew, past the cap; past it, no launch is taken on trust. */
    rc = cuGraphLaunch(third, s1) == CUDA_SUCCESS ? cuMemAlloc(&near, 300 * MiB)
                                                  : CUDA_ERROR_UNKNOWN;
    fake_cuda_graph_remap = 1;
    launched = rc == CUDA_SUCCESS ? cuGraphLaunch(third, s1) : CUDA_ERROR_UNKNOWN;
    check(launched == CUDA_SUCCESS && held_mib() == 1104 && counted_mib() == 1104,
          "a kept graph the driver maps anew beside 1004 MiB: its 100 MiB counted as they "
          "came, past the cap (held %llu MiB, counted %llu MiB)", held_mib(), counted_mib());
    rc = cuGraphLaunch(third, s1);
    check(rc == CUDA_ERROR_OUT_OF_MEMORY && held_mib() == 1004 && counted_mib() == 1004,
          "its next launch must fit again: the pool trimmed of the 100 MiB left unmapped, and "
          "still refused (rc %d, held %llu MiB, counted %llu MiB)", rc, held_mib(),
          counted_mib());
    check(cuMemAlloc(&plain, 100 * MiB) == CUDA_ERROR_OUT_OF_MEMORY,
          "and 100 MiB more are refused");

    /* A graph whose allocations cannot be read is not instantiated. */
    execs = fake_cuda_stats.graph_execs;
    strcpy(fake_cuda_fail_next, "cuGraphMemAllocNodeGetParams");
    CUgraphExec unread = NULL;
    rc = cuGraphInstantiateWithFlags(&unread, g, 0);
    check(rc == CUDA_ERROR_OUT_OF_MEMORY && unread == NULL && fake_cuda_stats.graph_execs == execs,
          "an allocation node the driver does not describe: instantiation refused, the driver "
          "never asked (rc %d)", rc);

    /* A node added by another thread after the library read the graph, before the driver
     * instantiated it: read again once the graph is made. */
    cuMemFree(small_plain);
    cuMemFree(near);
    cuGraphExecDestroy(small);
    cuGraphExecDestroy(third);
    cuDeviceGraphMemTrim(0);
    CUgraphNode kernel;
    CUDA_KERNEL_NODE_PARAMS k = {.gridDimX = 1, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 1,
                                 .blockDimY = 1, .blockDimZ = 1};
    CUgraphExec raced = NULL;
    rc = cuGraphCreate(&racing, 0) == CUDA_SUCCESS &&
                 cuGraphAddKernelNode(&kernel, racing, NULL, 0, &k) == CUDA_SUCCESS
             ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN;
    fake_cuda_inside_fn = add_allocation;
    strcpy(fake_cuda_inside, "cuGraphInstantiate");
    rc = rc == CUDA_SUCCESS ? cuGraphInstantiateWithFlags(&raced, racing, 0) : rc;
    before = held_mib();
    launched = rc == CUDA_SUCCESS ? cuGraphLaunch(raced, s1) : CUDA_ERROR_UNKNOWN;
    check(before == 300 && launched == CUDA_SUCCESS && held_mib() == 900 && counted_mib() == 900,
          "a 600 MiB allocation node another thread added while the driver instantiated the "
          "graph is counted at its launch (held %llu MiB, counted %llu MiB)", held_mib(),
          counted_mib());
    check(cuMemAlloc(&plain, 200 * MiB) == CUDA_ERROR_OUT_OF_MEMORY,
          "and a plain 200 MiB beside it refused");

    /* Graphs launched in turn on one stream keep their mappings (cuda.h): none is charged
     * again. */
    cuGraphExecDestroy(raced);
    cuDeviceGraphMemTrim(0);
    CUgraphExec ga = instantiated(300), gb = instantiated(300);
    int ok = 0;
    for (int i = 0; i < 20; i++)
        ok += cuGraphLaunch(i % 2 ? gb : ga, s1) == CUDA_SUCCESS;
    check(ok == 20 && held_mib() == 900 && counted_mib() == 900,
          "two graphs of 300 MiB launched in turn on one stream, 20 times: all %d run (the "
          "library of c1342c8 remembered only the last graph and refused 9), held %llu MiB, "
          "counted %llu MiB", ok, held_mib(), counted_mib());
    rc = cuGraphLaunch(ga, s2);
    check(rc == CUDA_ERROR_OUT_OF_MEMORY && held_mib() == 900,
          "on another stream the driver may map anew: the first must fit again (rc %d)", rc);
    cuGraphExecDestroy(ga);
    cuGraphExecDestroy(gb);
    cuDeviceGraphMemTrim(0);

    /* A launch from another thread while the driver destroys the graph is still counted. */
    dying = instantiated(600);
    dying_stream = s1;
    fake_cuda_inside_fn = launch_dying;
    strcpy(fake_cuda_inside, "cuGraphExecDestroy");
    rc = dying != NULL ? cuGraphExecDestroy(dying) : CUDA_ERROR_UNKNOWN;
    check(rc == CUDA_SUCCESS && dying_launched == CUDA_SUCCESS && held_mib() == 900 &&
              counted_mib() == 900,
          "a graph of 600 MiB launched while it is destroyed: counted (held %llu MiB, counted "
          "%llu MiB; c1342c8 counted 300)", held_mib(), counted_mib());
    check(cuMemAlloc(&plain, 600 * MiB) == CUDA_ERROR_OUT_OF_MEMORY,
          "and a plain 600 MiB beside it refused");
    cuDeviceGraphMemTrim(0);

    /* A capture that ends while an allocation on its stream is under way. */
    CUdeviceptr raced_ptr = 0, more = 0;
    fake_cuda_capturing = 1;
    fake_cuda_inside_fn = end_capture;
    strcpy(fake_cuda_inside, "cuStreamGetCaptureInfo");
    rc = cuMemAllocAsync(&raced_ptr, 600 * MiB, s2);
    check(rc == CUDA_SUCCESS && held_mib() == 900 && counted_mib() == 900,
          "600 MiB asked on a captured stream whose capture ends meanwhile: the driver took "
          "them for real, and they are counted (held %llu MiB, counted %llu MiB; c1342c8 "
          "counted none of them)", held_mib(), counted_mib());
    fake_cuda_capturing = 1;
    fake_cuda_inside_fn = end_capture;
    strcpy(fake_cuda_inside, "cuStreamGetCaptureInfo");
    rc = cuMemAllocAsync(&more, 200 * MiB, s2);
    check(rc == CUDA_ERROR_OUT_OF_MEMORY && held_mib() == 900 && counted_mib() == 900,
          "200 MiB more the same way do not fit: given back and refused (rc %d, held %llu MiB)",
          rc, held_mib());
    fake_cuda_capturing = 1;
    fake_cuda_inside_fn = end_then_begin;
    strcpy(fake_cuda_inside, "cuStreamGetCaptureInfo");
    rc = cuMemAllocAsync(&more, 200 * MiB, s2);
    fake_cuda_capturing = 0;
    CUresult synced = cuCtxSynchronize();
    check(rc == CUDA_ERROR_OUT_OF_MEMORY && synced == CUDA_SUCCESS && held_mib() == 900 &&
              counted_mib() == 900,
          "200 MiB the same way, with another capture begun before the library looks again: "
          "refused, and freed outside the capture (a free on the stream would be a node the "
          "driver refuses): held %llu MiB once synchronised, counted %llu MiB", held_mib(),
          counted_mib());
    fake_cuda_capturing = 1;
    fake_cuda_inside_fn = next_capture;
    strcpy(fake_cuda_inside, "cuStreamGetCaptureInfo");
    rc = cuMemAllocAsync(&more, 100 * MiB, s2);
    counted_then = counted_mib();
    freed = cuMemFreeAsync(more, s2);
    fake_cuda_capturing = 0;
    check(rc == CUDA_SUCCESS && counted_then == 1000 && freed == CUDA_SUCCESS &&
              counted_mib() == 900 && held_mib() == 900,
          "100 MiB asked while one capture ends and another begins: a node, counted all the "
          "same until its free (the two captures cannot be told apart from a real allocation: "
          "%llu MiB counted, then %llu)", counted_then, counted_mib());
    cuMemFreeAsync(raced_ptr, s2);
    return check_done("test_graph_memory");
}
