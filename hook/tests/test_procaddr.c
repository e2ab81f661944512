/* test_procaddr.c - how applications find driver functions under libvgpu: dlopen + dlsym,
 * cuGetProcAddress (v1 and v2) at several CUDA versions and with the per-thread-stream flag,
 * pass-through of what is not hooked, and dlsym(RTLD_NEXT) semantics. Run preloaded. */
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>

#include "check.h"
#include "fake_state.h"

#undef cuGetProcAddress

typedef CUresult (*gpa_v2_fn)(const char *, void **, int, cuuint64_t,
                              CUdriverProcAddressQueryResult *);
typedef CUresult (*gpa_v1_fn)(const char *, void **, int, cuuint64_t);

const char *probe(void);
const char *next_probe_from_a(void);
const char *next_probe_from_b(void);

static void *wrapper(const char *export) { return dlsym(RTLD_DEFAULT, export); }

/* Every hooked function: the name callers ask for, a version, the flags, and the export whose
 * ABI the driver would return (and whose wrapper we must get). */
static const struct query {
    const char *base;
    int version;
    int per_thread;
    const char *export;
} hooked[] = {
    {"cuInit", 2000, 0, "cuInit"},
    {"cuInit", 13000, 0, "cuInit"},
    {"cuGetProcAddress", 11030, 0, "cuGetProcAddress"},
    {"cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"},
    {"cuMemAlloc", 2000, 0, "cuMemAlloc"},
    {"cuMemFree", 2000, 0, "cuMemFree"},
    {"cuMemAllocPitch", 2000, 0, "cuMemAllocPitch"},
    {"cuMemGetInfo", 2000, 0, "cuMemGetInfo"},
    {"cuDeviceTotalMem", 2000, 0, "cuDeviceTotalMem"},
    {"cuArrayCreate", 2000, 0, "cuArrayCreate"},
    {"cuArray3DCreate", 2000, 0, "cuArray3DCreate"},
    {"cuMemAlloc", 3020, 0, "cuMemAlloc_v2"},
    {"cuMemAlloc", 12000, 0, "cuMemAlloc_v2"},
    {"cuMemAlloc", 13000, 1, "cuMemAlloc_v2"},
    {"cuMemFree", 3020, 0, "cuMemFree_v2"},
    {"cuMemAllocPitch", 3020, 0, "cuMemAllocPitch_v2"},
    {"cuMemAllocManaged", 6000, 0, "cuMemAllocManaged"},
    {"cuArrayCreate", 3020, 0, "cuArrayCreate_v2"},
    {"cuArray3DCreate", 3020, 0, "cuArray3DCreate_v2"},
    {"cuArrayDestroy", 2000, 0, "cuArrayDestroy"},
    {"cuMipmappedArrayCreate", 5000, 0, "cuMipmappedArrayCreate"},
    {"cuMipmappedArrayDestroy", 5000, 0, "cuMipmappedArrayDestroy"},
    {"cuMemCreate", 10020, 0, "cuMemCreate"},
    {"cuMemRelease", 10020, 0, "cuMemRelease"},
    {"cuMemMap", 10020, 0, "cuMemMap"},
    {"cuMemUnmap", 10020, 0, "cuMemUnmap"},
    {"cuMemRetainAllocationHandle", 11000, 0, "cuMemRetainAllocationHandle"},
    {"cuMemMapArrayAsync", 11010, 0, "cuMemMapArrayAsync"},
    {"cuMemMapArrayAsync", 11010, 1, "cuMemMapArrayAsync_ptsz"},
    {"cuMulticastBindMem", 12010, 0, "cuMulticastBindMem"},
    {"cuMulticastBindAddr", 12010, 0, "cuMulticastBindAddr"},
    {"cuMulticastBindMem", 13010, 0, "cuMulticastBindMem_v2"},
    {"cuMulticastBindAddr", 13010, 0, "cuMulticastBindAddr_v2"},
    {"cuMulticastUnbind", 12010, 0, "cuMulticastUnbind"},
    {"cuMemAllocAsync", 11020, 0, "cuMemAllocAsync"},
    {"cuMemAllocAsync", 11020, 1, "cuMemAllocAsync_ptsz"},
    {"cuMemAllocFromPoolAsync", 12000, 0, "cuMemAllocFromPoolAsync"},
    {"cuMemAllocFromPoolAsync", 12000, 1, "cuMemAllocFromPoolAsync_ptsz"},
    {"cuMemFreeAsync", 11020, 0, "cuMemFreeAsync"},
    {"cuMemFreeAsync", 13000, 1, "cuMemFreeAsync_ptsz"},
    {"cuMemGetInfo", 3020, 0, "cuMemGetInfo_v2"},
    {"cuDeviceTotalMem", 3020, 0, "cuDeviceTotalMem_v2"},
    {"cuLaunchKernel", 4000, 0, "cuLaunchKernel"},
    {"cuLaunchKernel", 4000, 1, "cuLaunchKernel"}, /* _ptsz exists from 7.0 only */
    {"cuLaunchKernel", 7000, 1, "cuLaunchKernel_ptsz"},
    {"cuLaunchKernel", 13000, 0, "cuLaunchKernel"},
    {"cuLaunchKernelEx", 11060, 0, "cuLaunchKernelEx"},
    {"cuLaunchKernelEx", 12000, 1, "cuLaunchKernelEx_ptsz"},
    {"cuLaunchCooperativeKernel", 9000, 0, "cuLaunchCooperativeKernel"},
    {"cuLaunchCooperativeKernel", 9000, 1, "cuLaunchCooperativeKernel_ptsz"},
    {"cuGraphLaunch", 10000, 0, "cuGraphLaunch"},
    {"cuGraphLaunch", 12000, 1, "cuGraphLaunch_ptsz"},
    {"cuGraphInstantiate", 10000, 0, "cuGraphInstantiate"},
    {"cuGraphInstantiate", 11000, 0, "cuGraphInstantiate_v2"},
    {"cuGraphInstantiate", 12000, 0, "cuGraphInstantiateWithFlags"},
    {"cuGraphInstantiateWithFlags", 11040, 0, "cuGraphInstantiateWithFlags"},
    {"cuGraphInstantiateWithParams", 12000, 0, "cuGraphInstantiateWithParams"},
    {"cuGraphExecUpdate", 10020, 0, "cuGraphExecUpdate"},
    {"cuGraphExecUpdate", 12000, 0, "cuGraphExecUpdate_v2"},
    {"cuGraphExecDestroy", 10000, 0, "cuGraphExecDestroy"},
    {"cuGraphExecKernelNodeSetParams", 10010, 0, "cuGraphExecKernelNodeSetParams"},
    {"cuGraphExecKernelNodeSetParams", 12000, 0, "cuGraphExecKernelNodeSetParams_v2"},
    {"cuGraphExecChildGraphNodeSetParams", 11010, 0, "cuGraphExecChildGraphNodeSetParams"},
    {"cuGraphExecNodeSetParams", 12020, 0, "cuGraphExecNodeSetParams"},
    {"cuGraphNodeSetEnabled", 11060, 0, "cuGraphNodeSetEnabled"},
    {"cuDevicePrimaryCtxRetain", 7000, 0, "cuDevicePrimaryCtxRetain"},
    {"cuDevicePrimaryCtxRelease", 11000, 0, "cuDevicePrimaryCtxRelease_v2"},
    {"cuCtxCreate", 3020, 0, "cuCtxCreate_v2"},
    {"cuCtxCreate", 11040, 0, "cuCtxCreate_v3"},
    {"cuCtxCreate", 12050, 0, "cuCtxCreate_v4"},
    {"cuCtxDestroy", 4000, 0, "cuCtxDestroy_v2"},
    {"cuCtxCreate", 2000, 0, "cuCtxCreate"},
    {"cuCtxDestroy", 2000, 0, "cuCtxDestroy"},
    {"cuGreenCtxCreate", 12040, 0, "cuGreenCtxCreate"},
    {"cuGreenCtxDestroy", 12040, 0, "cuGreenCtxDestroy"},
    {"cuCtxSynchronize", 2000, 0, "cuCtxSynchronize"},
    {"cuCtxSynchronize", 12000, 0, "cuCtxSynchronize"},
    {"cuCtxSynchronize", 13000, 0, "cuCtxSynchronize_v2"}, /* PFN_cuCtxSynchronize_v13000 */
    {"cuCtxSynchronize_v2", 13000, 0, "cuCtxSynchronize_v2"},
    {"cuCtxSetCurrent", 4000, 0, "cuCtxSetCurrent"},
    {"cuStreamCreate", 2000, 0, "cuStreamCreate"},
    {"cuStreamCreateWithPriority", 5050, 0, "cuStreamCreateWithPriority"},
    {"cuCtxPushCurrent", 4000, 0, "cuCtxPushCurrent_v2"},
    {"cuCtxPopCurrent", 4000, 0, "cuCtxPopCurrent_v2"},
    {"cuCtxPushCurrent", 2000, 0, "cuCtxPushCurrent"},
    {"cuCtxPopCurrent", 2000, 0, "cuCtxPopCurrent"},
    {"cuStreamSynchronize", 2000, 0, "cuStreamSynchronize"},
    {"cuStreamSynchronize", 7000, 1, "cuStreamSynchronize_ptsz"},
    {"cuStreamQuery", 2000, 0, "cuStreamQuery"},
    {"cuStreamQuery", 7000, 1, "cuStreamQuery_ptsz"},
    {"cuStreamDestroy", 2000, 0, "cuStreamDestroy"},
    {"cuStreamDestroy", 4000, 0, "cuStreamDestroy_v2"},
    {"cuEventCreate", 2000, 0, "cuEventCreate"},
    {"cuIpcOpenEventHandle", 4010, 0, "cuIpcOpenEventHandle"},
    {"cuEventRecord", 2000, 0, "cuEventRecord"},
    {"cuEventRecord", 7000, 1, "cuEventRecord_ptsz"},
    {"cuEventRecordWithFlags", 11010, 0, "cuEventRecordWithFlags"},
    {"cuEventRecordWithFlags", 11010, 1, "cuEventRecordWithFlags_ptsz"},
    {"cuEventSynchronize", 2000, 0, "cuEventSynchronize"},
    {"cuEventQuery", 2000, 0, "cuEventQuery"},
    {"cuEventDestroy", 2000, 0, "cuEventDestroy"},
    {"cuEventDestroy", 4000, 0, "cuEventDestroy_v2"},
    {"cuMemcpyDtoH", 2000, 0, "cuMemcpyDtoH"},
    {"cuMemcpyDtoH", 3020, 0, "cuMemcpyDtoH_v2"},
    {"cuMemcpyDtoH", 7000, 1, "cuMemcpyDtoH_v2_ptds"},
    {"cuMemcpy", 4000, 0, "cuMemcpy"},
    {"cuMemcpy", 7000, 1, "cuMemcpy_ptds"},
    {"cuDevicePrimaryCtxRelease", 7000, 0, "cuDevicePrimaryCtxRelease"},
    {"cuDevicePrimaryCtxReset", 7000, 0, "cuDevicePrimaryCtxReset"},
};

static void proc_address_v2(gpa_v2_fn gpa)
{
    for (size_t i = 0; i < sizeof hooked / sizeof hooked[0]; i++) {
        const struct query *q = &hooked[i];
        void *fn = NULL;
        CUdriverProcAddressQueryResult status = 99;
        CUresult rc = gpa(q->base, &fn, q->version, q->per_thread ? 2 : 0, &status);
        void *want = wrapper(q->export);
        check(rc == CUDA_SUCCESS && status == CU_GET_PROC_ADDRESS_SUCCESS && fn == want &&
              want != fake_cuda_entry(q->export),
              "cuGetProcAddress_v2(%s, %d, flags %d) = wrapper of %s", q->base, q->version,
              q->per_thread ? 2 : 0, q->export);
    }
}

static void proc_address_v1(gpa_v1_fn gpa)
{
    for (size_t i = 0; i < sizeof hooked / sizeof hooked[0]; i += 3) {
        const struct query *q = &hooked[i];
        void *fn = NULL;
        CUresult rc = gpa(q->base, &fn, q->version, q->per_thread ? 2 : 0);
        check(rc == CUDA_SUCCESS && fn == wrapper(q->export),
              "cuGetProcAddress (v1 ABI)(%s, %d) = wrapper of %s", q->base, q->version, q->export);
    }
}

static void pass_through(gpa_v2_fn gpa)
{
    void *fn = NULL;
    CUdriverProcAddressQueryResult status = 99;
    check(gpa("cuMemAdvise", &fn, 8000, 0, &status) == CUDA_SUCCESS &&
          fn == fake_cuda_entry("cuMemAdvise"), "cuMemAdvise at 8.0: the driver's v1 ABI");
    check(gpa("cuMemAdvise", &fn, 12020, 0, &status) == CUDA_SUCCESS &&
          fn == fake_cuda_entry("cuMemAdvise_v2"), "cuMemAdvise at 12.2: the driver's v2 ABI");
    check(gpa("cuCtxGetDevice", &fn, 13000, 0, &status) == CUDA_SUCCESS &&
          fn == fake_cuda_entry("cuCtxGetDevice_v2"), "unhooked functions come from the driver");
    check(gpa("cuNoSuchFunction", &fn, 13000, 0, &status) == CUDA_ERROR_NOT_FOUND && fn == NULL &&
          status == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, "unknown names: the driver's answer");
    check(gpa("cuMemAllocManaged", &fn, 5000, 0, &status) == CUDA_ERROR_NOT_FOUND && fn == NULL &&
          status == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
          "too old a version: VERSION_NOT_SUFFICIENT from the driver");
}

/* Calling through the returned pointers reaches the matching driver variant. */
static void signatures(gpa_v2_fn gpa)
{
    CUcontext ctx;
    cuInit(0);
    cuDevicePrimaryCtxRetain(&ctx, 0);
    cuCtxSetCurrent(ctx);
    CUdriverProcAddressQueryResult status;
    typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  unsigned, unsigned, CUstream, void **, void **);
    launch_fn legacy = NULL, per_thread = NULL;
    gpa("cuLaunchKernel", (void **)&legacy, 12000, 0, &status);
    gpa("cuLaunchKernel", (void **)&per_thread, 12000, 2, &status);
    struct fake_cuda_stats before = fake_cuda_stats;
    per_thread(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
    check(fake_cuda_stats.launches[FAKE_LAUNCH_PTSZ] == before.launches[FAKE_LAUNCH_PTSZ] + 1 &&
          fake_cuda_stats.launches[FAKE_LAUNCH] == before.launches[FAKE_LAUNCH],
          "the per-thread launch wrapper calls cuLaunchKernel_ptsz");
    legacy(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
    check(fake_cuda_stats.launches[FAKE_LAUNCH] == before.launches[FAKE_LAUNCH] + 1,
          "the legacy launch wrapper calls cuLaunchKernel");
    typedef CUresult (*launch_ex_fn)(const CUlaunchConfig *, CUfunction, void **, void **);
    launch_ex_fn ex = NULL;
    gpa("cuLaunchKernelEx", (void **)&ex, 12000, 2, &status);
    CUlaunchConfig config = {.gridDimX = 4, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 32,
                             .blockDimY = 1, .blockDimZ = 1};
    ex(&config, NULL, NULL, NULL);
    check(fake_cuda_stats.launches[FAKE_LAUNCH_EX_PTSZ] == before.launches[FAKE_LAUNCH_EX_PTSZ] + 1,
          "cuLaunchKernelEx per-thread wrapper reaches cuLaunchKernelEx_ptsz");
    typedef CUresult (*graph_fn)(CUgraphExec, CUstream);
    graph_fn graph = NULL;
    gpa("cuGraphLaunch", (void **)&graph, 12000, 2, &status);
    graph(NULL, NULL);
    check(fake_cuda_stats.launches[FAKE_GRAPH_PTSZ] == before.launches[FAKE_GRAPH_PTSZ] + 1,
          "cuGraphLaunch per-thread wrapper reaches cuGraphLaunch_ptsz");

    typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
    typedef CUresult (*info_fn)(size_t *, size_t *);
    alloc_fn alloc = NULL;
    info_fn info = NULL;
    gpa("cuMemAlloc", (void **)&alloc, 12000, 0, &status);
    gpa("cuMemGetInfo", (void **)&info, 12000, 0, &status);
    CUdeviceptr p;
    size_t free_b, total_b;
    check(alloc(&p, 2048u << 20) == CUDA_ERROR_OUT_OF_MEMORY,
          "cuMemAlloc found through cuGetProcAddress enforces the cap");
    check(info(&free_b, &total_b) == CUDA_SUCCESS && total_b == (size_t)1 << 30,
          "cuMemGetInfo found through cuGetProcAddress reports the cap");
}

static void *rtld_next_worker(void *arg)
{
    void *first = dlsym(RTLD_NEXT, "malloc");
    int *same = arg;
    *same = first != NULL;
    for (int i = 0; i < 2000; i++)
        if (dlsym(RTLD_NEXT, "malloc") != first)
            *same = 0;
    return NULL;
}

static void rtld_next(void)
{
    pthread_t threads[8];
    int same[8];
    for (int i = 0; i < 8; i++)
        pthread_create(&threads[i], NULL, rtld_next_worker, &same[i]);
    int all = 1;
    for (int i = 0; i < 8; i++) {
        pthread_join(threads[i], NULL);
        all &= same[i];
    }
    check(all, "dlsym(RTLD_NEXT, malloc) repeated 2000 times in 8 threads: same non-NULL result");
    check(strcmp(probe(), "a") == 0, "the first probe in link order is liba's");
    check(strcmp(next_probe_from_a(), "b") == 0,
          "dlsym(RTLD_NEXT) called from liba finds libb's (relative to the caller, not libvgpu)");
    check(strcmp(next_probe_from_b(), "none") == 0, "and from libb finds none after it");
}

/* FAKE_CUDA_GPA_PRIVATE=1: the driver's cuGetProcAddress answers with internal entry points
 * that are not its dlsym exports; libvgpu must still hand out its wrappers. */
static int private_answers(void)
{
    CUdriverProcAddressQueryResult status;
    gpa_v2_fn driver_gpa = (gpa_v2_fn)fake_cuda_entry("cuGetProcAddress_v2");
    void *answer = NULL;
    driver_gpa("cuMemAlloc", &answer, 12000, 0, &status);
    check(answer != NULL && answer != fake_cuda_entry("cuMemAlloc_v2"),
          "premise: the driver answers cuMemAlloc with a non-exported address");

    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    gpa_v2_fn gpa = (gpa_v2_fn)dlsym(cuda, "cuGetProcAddress_v2");
    void *fn = NULL;
    check(gpa("cuMemAlloc", &fn, 12000, 0, &status) == CUDA_SUCCESS &&
          fn == wrapper("cuMemAlloc_v2"), "cuMemAlloc: still the wrapper");
    check(gpa("cuLaunchKernel", &fn, 12000, 2, &status) == CUDA_SUCCESS &&
          fn == wrapper("cuLaunchKernel_ptsz"), "cuLaunchKernel per-thread: still the wrapper");
    check(gpa("cuGetProcAddress", &fn, 12000, 0, &status) == CUDA_SUCCESS &&
          fn == wrapper("cuGetProcAddress_v2"), "cuGetProcAddress: still the wrapper");
    CUcontext ctx;
    cuInit(0);
    cuDevicePrimaryCtxRetain(&ctx, 0);
    cuCtxSetCurrent(ctx);
    CUdeviceptr p;
    gpa("cuMemAlloc", &fn, 12000, 0, &status);
    check(((CUresult(*)(CUdeviceptr *, size_t))fn)(&p, 2048u << 20) == CUDA_ERROR_OUT_OF_MEMORY,
          "and it enforces the cap");
    return check_done("test_procaddr private");
}

/* FAKE_CUDA_GPA_V1_AS_V2=1: the driver answers a CUDA 2.0 name asked at 2.0 with its _v2
 * export. Learnt as the v1 function's other address, a _v2 caller got the 32-bit ABI's wrapper
 * (the library of 33bd322, a review found). */
static int v1_as_v2(void)
{
    CUdriverProcAddressQueryResult status;
    gpa_v2_fn driver_gpa = (gpa_v2_fn)fake_cuda_entry("cuGetProcAddress_v2");
    void *answer = NULL;
    driver_gpa("cuMemsetD8", &answer, 2000, 0, &status);
    check(answer == fake_cuda_entry("cuMemsetD8_v2"), "premise: the driver answers cuMemsetD8 "
          "at 2.0 with cuMemsetD8_v2's export");
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    gpa_v2_fn gpa = (gpa_v2_fn)dlsym(cuda, "cuGetProcAddress_v2");
    static const char *const names[][2] = {
        {"cuMemsetD8", "cuMemsetD8_v2"}, {"cuMemAlloc", "cuMemAlloc_v2"},
        {"cuMemsetD2D32", "cuMemsetD2D32_v2"}, {"cuCtxCreate", "cuCtxCreate_v2"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *fn = NULL;
        check(gpa(names[i][0], &fn, 3020, 0, &status) == CUDA_SUCCESS &&
                  fn == wrapper(names[i][1]) && dlsym(cuda, names[i][1]) == wrapper(names[i][1]),
              "%s at 3.2, and dlsym of %s: the _v2 wrapper", names[i][0], names[i][1]);
    }
    return check_done("test_procaddr v1-as-v2");
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "private") == 0)
        return private_answers();
    if (argc > 1 && strcmp(argv[1], "v1-as-v2") == 0)
        return v1_as_v2();
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    check(cuda != NULL, "dlopen(libcuda.so.1)");
    gpa_v2_fn gpa2 = (gpa_v2_fn)dlsym(cuda, "cuGetProcAddress_v2");
    check((void *)gpa2 == wrapper("cuGetProcAddress_v2") &&
          (void *)gpa2 != fake_cuda_entry("cuGetProcAddress_v2"),
          "dlsym(libcuda handle, cuGetProcAddress_v2) gives the wrapper");
    check(dlsym(cuda, "cuMemAlloc_v2") == wrapper("cuMemAlloc_v2"),
          "dlsym(libcuda handle, cuMemAlloc_v2) gives the wrapper");
    check(dlsym(cuda, "cuCtxGetDevice") == fake_cuda_entry("cuCtxGetDevice"),
          "dlsym(libcuda handle) of an unhooked name gives the driver's function");
    check(dlsym(cuda, "cuMemAlloc_v3") == NULL, "a name the driver does not export stays NULL");
    void *next_a = dlopen("libnext_a.so", RTLD_NOW | RTLD_NOLOAD);
    check(next_a != NULL && dlsym(next_a, "cuMemAlloc_v2") == NULL,
          "a hooked name looked up in an unrelated library stays NULL");

    proc_address_v2(gpa2);
    gpa_v1_fn gpa1 = NULL;
    CUdriverProcAddressQueryResult status;
    gpa2("cuGetProcAddress", (void **)&gpa1, 11030, 0, &status);
    check(gpa1 != NULL && (void *)gpa1 == wrapper("cuGetProcAddress"),
          "cuGetProcAddress at 11.3 gives the v1-ABI wrapper");
    proc_address_v1(gpa1);
    pass_through(gpa2);
    signatures(gpa2);
    rtld_next();
    return check_done("test_procaddr");
}
