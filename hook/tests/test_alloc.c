/* test_alloc.c - single-process accounting and reporting, run with libvgpu.so preloaded over
 * the fake driver, CUDA_DEVICE_MEMORY_LIMIT=1g and CUDA_DEVICE_MEMORY_LIMIT_1=512m.
 * "uncapped" as argv[1]: the same program with no limit set (reporting must pass through). */
#include <cuda.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <nvml.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <stdint.h>
#include <time.h>

#include "check.h"
#include "cuda_13.h" /* CUDA 13.1's multicast bindings, called by name */
#include "faults.h"
#include "cuda_v1.h" /* the legacy v1 exports, called by name below */
#include "fake_state.h"

#undef cuMemAdvise

static const uint64_t MiB = UINT64_C(1) << 20;
static CUcontext ctx[2];

static uint64_t container_used(void)
{
    size_t free_b = 0, total_b = 0;
    cuMemGetInfo_v2(&free_b, &total_b);
    return total_b - free_b;
}

static void use_device(int dev) { cuCtxSetCurrent(ctx[dev]); }

static void basic_cap(void)
{
    CUdeviceptr a = 0, b = 0xabc;
    check(cuMemAlloc_v2(&a, 600 * MiB) == CUDA_SUCCESS && a != 0, "600 MiB under a 1 GiB cap");
    size_t free_b, total_b;
    cuMemGetInfo_v2(&free_b, &total_b);
    check(total_b == 1024 * MiB && free_b == 424 * MiB,
          "cuMemGetInfo reports the cap: free %zu MiB of %zu MiB", free_b / MiB, total_b / MiB);
    capture_begin();
    CUresult rc = cuMemAlloc_v2(&b, 600 * MiB);
    const char *log = capture_end();
    check(rc == CUDA_ERROR_OUT_OF_MEMORY, "a second 600 MiB is refused with OOM (rc %d)", rc);
    check(b == 0xabc, "the caller's pointer is untouched on refusal");
    check(fake_cuda_device_used(0) == 600 * MiB, "the driver was not asked for the refused bytes");
    check(strstr(log, "cuMemAlloc: device 0 out of memory") != NULL, "the refusal is logged: %s",
          log);
    check(cuMemFree_v2(a) == CUDA_SUCCESS && container_used() == 0, "free returns the memory");
    check(cuMemAlloc_v2(&a, 1024 * MiB) == CUDA_SUCCESS, "exactly the cap fits");
    check(cuMemAlloc_v2(&b, 1) == CUDA_ERROR_OUT_OF_MEMORY, "one byte more does not");
    cuMemFree_v2(a);
}

/* Refusals in a loop (the PyTorch allocator retries) log one line per second at most, and the
 * next line says how many were not shown. */
static void refusal_log_rate(void)
{
    CUdeviceptr all = 0, p = 0;
    check(cuMemAlloc_v2(&all, 1024 * MiB) == CUDA_SUCCESS, "the whole cap taken");
    capture_begin();
    for (int i = 0; i < 50; i++)
        cuMemAlloc_v2(&p, MiB);
    const char *log = capture_end();
    int lines = 0;
    for (const char *at = log; (at = strstr(at, "out of memory")) != NULL; at++)
        lines++;
    check(lines <= 2, "50 refusals within a second or two: %d log lines", lines);
    struct timespec next_second = {1, 100 * 1000 * 1000};
    nanosleep(&next_second, NULL);
    capture_begin();
    cuMemAlloc_v2(&p, MiB);
    log = capture_end();
    check(strstr(log, "more refusals since the last line)") != NULL,
          "a second later a refusal is logged again, with the count not shown: %s", log);
    cuMemFree_v2(all);
}

static void device_totals(void)
{
    size_t bytes = 0;
    check(cuDeviceTotalMem_v2(&bytes, 0) == CUDA_SUCCESS && bytes == 1024 * MiB,
          "cuDeviceTotalMem device 0 = 1024 MiB (%zu)", bytes / MiB);
    check(cuDeviceTotalMem_v2(&bytes, 1) == CUDA_SUCCESS && bytes == 512 * MiB,
          "cuDeviceTotalMem device 1 = 512 MiB (%zu)", bytes / MiB);
    size_t total_only = 0, free_only = 0;
    check(cuMemGetInfo_v2(NULL, &total_only) == CUDA_SUCCESS && total_only == 1024 * MiB,
          "cuMemGetInfo with a NULL free pointer");
    check(cuMemGetInfo_v2(&free_only, NULL) == CUDA_SUCCESS && free_only == 1024 * MiB,
          "cuMemGetInfo with a NULL total pointer");
}

static void families(void)
{
    CUdeviceptr p = 0;
    size_t pitch = 0;
    check(cuMemAllocPitch_v2(&p, &pitch, 1000, 1000, 4) == CUDA_SUCCESS && pitch == 1024,
          "pitch allocation (pitch %zu)", pitch);
    check(container_used() == 1024 * 1000, "pitch counted from the returned pitch (%llu)",
          (unsigned long long)container_used());
    cuMemFree_v2(p);
    check(container_used() == 0, "pitch allocation freed");

    check(cuMemAllocManaged(&p, 100 * MiB, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS &&
          container_used() == 100 * MiB, "managed allocation counted");
    check(cuMemAllocManaged(&p, 1000 * MiB, CU_MEM_ATTACH_GLOBAL) == CUDA_ERROR_OUT_OF_MEMORY,
          "managed allocation over the cap refused");
    cuMemFree_v2(p);

    CUarray arr = NULL;
    CUDA_ARRAY_DESCRIPTOR d2 = {.Width = 1024, .Height = 1024, .Format = CU_AD_FORMAT_FLOAT,
                                .NumChannels = 4};
    check(cuArrayCreate_v2(&arr, &d2) == CUDA_SUCCESS && container_used() == 16 * MiB,
          "2D array counted (16 MiB)");
    check(cuArrayDestroy(arr) == CUDA_SUCCESS && container_used() == 0, "array destroyed");
    CUDA_ARRAY3D_DESCRIPTOR d3 = {.Width = 1024, .Height = 1024, .Depth = 2048,
                                  .Format = CU_AD_FORMAT_UNSIGNED_INT8, .NumChannels = 1};
    check(cuArray3DCreate_v2(&arr, &d3) == CUDA_ERROR_OUT_OF_MEMORY, "2 GiB 3D array refused");
    d3.Depth = 256;
    check(cuArray3DCreate_v2(&arr, &d3) == CUDA_SUCCESS && container_used() == 256 * MiB,
          "3D array counted");
    cuArrayDestroy(arr);
    /* A mipmapped array: 512 MiB at level 0, then 64, 8 and 1 MiB. */
    CUmipmappedArray mip = NULL;
    CUDA_ARRAY3D_DESCRIPTOR dm = {.Width = 1024, .Height = 1024, .Depth = 512,
                                  .Format = CU_AD_FORMAT_UNSIGNED_INT8, .NumChannels = 1};
    uint64_t mip_used = cuMipmappedArrayCreate(&mip, &dm, 4) == CUDA_SUCCESS ? container_used()
                                                                             : 0;
    check(mip_used == 585 * MiB, "a mipmapped array counted by all its levels (%llu MiB)",
          (unsigned long long)(mip_used / MiB));
    CUmipmappedArray second = NULL;
    check(cuMipmappedArrayCreate(&second, &dm, 4) == CUDA_ERROR_OUT_OF_MEMORY && second == NULL,
          "a second one does not fit under the 1 GiB cap");
    check(cuMipmappedArrayDestroy(mip) == CUDA_SUCCESS && container_used() == 0,
          "mipmapped array destroyed");

    check(cuMemAllocAsync(&p, 64 * MiB, NULL) == CUDA_SUCCESS && container_used() == 64 * MiB,
          "stream-ordered allocation counted");
    uint64_t cached = cuMemFreeAsync(p, NULL) == CUDA_SUCCESS ? container_used() : 0;
    check(cached == 64 * MiB && cuCtxSynchronize() == CUDA_SUCCESS && container_used() == 0,
          "async free: the pool holds the memory until a synchronisation (%llu MiB counted), "
          "then gives it back (its release threshold 0)", (unsigned long long)(cached / MiB));
    CUmemoryPool pool = NULL;
    check(cuDeviceGetDefaultMemPool(&pool, 0) == CUDA_SUCCESS &&
              cuMemAllocFromPoolAsync(&p, 2048 * MiB, pool, NULL) == CUDA_ERROR_OUT_OF_MEMORY,
          "pool allocation over the cap refused");
    check(cuMemAllocFromPoolAsync(&p, 32 * MiB, pool, NULL) == CUDA_SUCCESS &&
          container_used() == 32 * MiB, "pool allocation counted");
    cached = cuMemFree_v2(p) == CUDA_SUCCESS ? container_used() : 0;
    check(cached == 32 * MiB && cuCtxSynchronize() == CUDA_SUCCESS && container_used() == 0,
          "a pool allocation freed synchronously goes back to its pool as an async free does: "
          "counted until a synchronisation (%llu MiB), then given back",
          (unsigned long long)(cached / MiB));

    typedef CUresult (*async_fn)(CUdeviceptr *, size_t, CUstream);
    typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);
    async_fn alloc_ptsz = (async_fn)dlsym(RTLD_DEFAULT, "cuMemAllocAsync_ptsz");
    free_async_fn free_ptsz = (free_async_fn)dlsym(RTLD_DEFAULT, "cuMemFreeAsync_ptsz");
    uint64_t before = fake_cuda_stats.async_ptsz_calls;
    check(alloc_ptsz != NULL && alloc_ptsz(&p, 8 * MiB, NULL) == CUDA_SUCCESS &&
          container_used() == 8 * MiB, "per-thread-stream async allocation counted");
    check(free_ptsz != NULL && free_ptsz(p, NULL) == CUDA_SUCCESS &&
              cuCtxSynchronize() == CUDA_SUCCESS && container_used() == 0,
          "per-thread-stream async free");
    check(fake_cuda_stats.async_ptsz_calls == before + 2,
          "the _ptsz wrappers call the driver's _ptsz entry points");
}

struct vmm_result {
    CUresult create, release;
    uint64_t dev1_used_after_create;
};

/* cuMemCreate from a thread with no context (NCCL and PyTorch's expandable segments do this):
 * the device comes from prop->location.id. */
static void *vmm_thread(void *arg)
{
    struct vmm_result *r = arg;
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 1}};
    CUmemGenericAllocationHandle h = 0;
    r->create = cuMemCreate(&h, 256 * MiB, &prop, 0);
    cuCtxSetCurrent(ctx[1]);
    r->dev1_used_after_create = container_used();
    cuCtxSetCurrent(NULL);
    r->release = cuMemRelease(h);
    return NULL;
}

static void vmm(void)
{
    struct vmm_result r = {0};
    pthread_t t;
    pthread_create(&t, NULL, vmm_thread, &r);
    pthread_join(t, NULL);
    check(r.create == CUDA_SUCCESS && r.dev1_used_after_create == 256 * MiB,
          "cuMemCreate without a context counts on prop->location.id (device 1: %llu MiB)",
          (unsigned long long)(r.dev1_used_after_create / MiB));
    check(r.release == CUDA_SUCCESS, "cuMemRelease");
    use_device(1);
    check(container_used() == 0, "device 1 back to 0 after release");
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 1}};
    CUmemGenericAllocationHandle h = 0;
    check(cuMemCreate(&h, 600 * MiB, &prop, 0) == CUDA_ERROR_OUT_OF_MEMORY,
          "600 MiB VMM handle refused by device 1's 512 MiB cap");
    prop.location.id = 850725928; /* garbage id (HAMi-core #169): forwarded, not counted */
    check(cuMemCreate(&h, MiB, &prop, 0) == CUDA_ERROR_INVALID_DEVICE,
          "an invalid location id is the driver's to refuse");
    use_device(0);
}

/* A cuMemCreate allocation lives while its handle is referenced or mapped (cuda.h, cuMemRelease):
 * its bytes stay counted until both are gone. Releasing the handle right after mapping it is
 * the usual idiom; the library before gave the bytes back at that release, so a loop of
 * create, map, release held any amount under the cap. */
static void vmm_mapped(void)
{
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    CUmemGenericAllocationHandle h = 0, h2 = 0, again = 0;
    CUdeviceptr va = 0, va2 = 0;
    use_device(0);
    int mapped = cuMemCreate(&h, 512 * MiB, &prop, 0) == CUDA_SUCCESS &&
                 cuMemAddressReserve(&va, 1024 * MiB, 0, 0, 0) == CUDA_SUCCESS &&
                 cuMemMap(va, 512 * MiB, 0, h, 0) == CUDA_SUCCESS &&
                 cuMemRelease(h) == CUDA_SUCCESS;
    uint64_t counted = container_used(), held = fake_cuda_device_used(0);
    check(mapped && counted == 512 * MiB && held == 512 * MiB, "512 MiB created, mapped and "
          "released: still mapped, still counted (%llu MiB; the driver holds %llu MiB)",
          (unsigned long long)(counted / MiB), (unsigned long long)(held / MiB));
    CUresult rc = cuMemCreate(&h2, 600 * MiB, &prop, 0);
    check(rc == CUDA_ERROR_OUT_OF_MEMORY, "600 MiB more is refused under the 1 GiB cap (rc %d)",
          rc);
    counted = cuMemUnmap(va, 512 * MiB) == CUDA_SUCCESS ? container_used() : 1;
    check(counted == 0 && fake_cuda_device_used(0) == 0,
          "unmapped: freed and given back (%llu MiB counted)", (unsigned long long)(counted / MiB));

    /* NCCL frees this way: retain the handle from the address, release it, unmap, release. */
    mapped = cuMemCreate(&h, 256 * MiB, &prop, 0) == CUDA_SUCCESS &&
             cuMemMap(va, 256 * MiB, 0, h, 0) == CUDA_SUCCESS &&
             cuMemRetainAllocationHandle(&again, (void *)(uintptr_t)(va + MiB)) == CUDA_SUCCESS &&
             again == h && cuMemRelease(again) == CUDA_SUCCESS;
    counted = container_used();
    int unmapped = cuMemUnmap(va, 256 * MiB) == CUDA_SUCCESS;
    uint64_t counted_unmapped = container_used();
    int released = cuMemRelease(h) == CUDA_SUCCESS;
    check(mapped && unmapped && released && counted == 256 * MiB &&
              counted_unmapped == 256 * MiB && container_used() == 0,
          "retained, released, unmapped: counted (%llu, %llu MiB) until the last reference goes "
          "(%llu MiB)", (unsigned long long)(counted / MiB),
          (unsigned long long)(counted_unmapped / MiB),
          (unsigned long long)(container_used() / MiB));

    /* One handle at two addresses, and one cuMemUnmap over two adjacent mappings. */
    mapped = cuMemCreate(&h, 128 * MiB, &prop, 0) == CUDA_SUCCESS &&
             cuMemCreate(&h2, 128 * MiB, &prop, 0) == CUDA_SUCCESS &&
             cuMemAddressReserve(&va2, 512 * MiB, 0, 0, 0) == CUDA_SUCCESS &&
             cuMemMap(va, 128 * MiB, 0, h, 0) == CUDA_SUCCESS &&
             cuMemMap(va + 128 * MiB, 128 * MiB, 0, h2, 0) == CUDA_SUCCESS &&
             cuMemMap(va2, 128 * MiB, 0, h, 0) == CUDA_SUCCESS &&
             cuMemRelease(h) == CUDA_SUCCESS && cuMemRelease(h2) == CUDA_SUCCESS;
    counted = cuMemUnmap(va, 256 * MiB) == CUDA_SUCCESS ? container_used() : 0;
    check(mapped && counted == 128 * MiB, "two handles released, one also mapped elsewhere: one "
          "unmap of both adjacent mappings gives back only the other (%llu MiB left)",
          (unsigned long long)(counted / MiB));
    counted = cuMemUnmap(va2, 128 * MiB) == CUDA_SUCCESS ? container_used() : 1;
    check(counted == 0 && fake_cuda_device_used(0) == 0, "its last mapping gone: 0 MiB");
    check(cuMemUnmap(va2, 128 * MiB) == CUDA_ERROR_INVALID_VALUE && container_used() == 0,
          "an unmap the driver refuses changes nothing");
    check(cuMemRelease(h) == CUDA_ERROR_INVALID_VALUE && container_used() == 0,
          "nor does a release of a handle already freed");
    cuMemAddressFree(va, 1024 * MiB);
    cuMemAddressFree(va2, 512 * MiB);
}

/* Releases the handle map_race maps from another thread, while the driver's cuMemMap is
 * under way; waits for that release 0.3 s at most (the library may hold it back). */
static CUmemGenericAllocationHandle racing_handle;
static int race_released;

static CUdeviceptr racing_va;

static void *release_racing(void *arg)
{
    (void)arg;
    cuMemRelease(racing_handle);
    if (racing_va != 0) /* and unmapped: only the racing retain's reference holds it */
        cuMemUnmap(racing_va, 600 * MiB);
    __atomic_store_n(&race_released, 1, __ATOMIC_RELEASE);
    return NULL;
}

static pthread_t racer;
static int racing;

static void release_meanwhile(void)
{
    racing = pthread_create(&racer, NULL, release_racing, NULL) == 0;
    for (int i = 0; i < 300 && !__atomic_load_n(&race_released, __ATOMIC_ACQUIRE); i++)
        usleep(1000);
}

/* After the call release_meanwhile was to run inside: the racing thread joined, or (the call
 * failed before it) the fake's hook disarmed. */
static void race_over(void)
{
    fake_cuda_inside[0] = '\0';
    if (racing)
        pthread_join(racer, NULL);
    racing = 0;
}

/* A handle released by another thread between the driver's mapping and the library's record of
 * it: the mapped memory stays counted. The library of 6069325 recorded the mapping after the
 * driver's call, outside its lock, and gave the 600 MiB back at that release: 1200 MiB held on
 * the 1 GiB cap once 600 MiB more were created. Then the same with a reference taken by
 * cuMemRetainAllocationHandle. */
static void vmm_map_race(void)
{
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle more = 0;
    int made = cuMemCreate(&racing_handle, 600 * MiB, &prop, 0) == CUDA_SUCCESS &&
               cuMemAddressReserve(&va, 600 * MiB, 0, 0, 0) == CUDA_SUCCESS;
    strcpy(fake_cuda_inside, "cuMemMap");
    fake_cuda_inside_fn = release_meanwhile;
    int mapped = made && cuMemMap(va, 600 * MiB, 0, racing_handle, 0) == CUDA_SUCCESS;
    race_over();
    uint64_t counted = container_used(), held = fake_cuda_device_used(0);
    check(mapped && counted == 600 * MiB && held == 600 * MiB, "600 MiB mapped, its handle "
          "released by another thread while the driver mapped it: still counted (%llu MiB; the "
          "driver holds %llu MiB)", (unsigned long long)(counted / MiB),
          (unsigned long long)(held / MiB));
    CUresult rc = cuMemCreate(&more, 600 * MiB, &prop, 0);
    check(rc == CUDA_ERROR_OUT_OF_MEMORY, "600 MiB more is refused (rc %d, the driver holds "
          "%llu MiB)", rc, (unsigned long long)(fake_cuda_device_used(0) / MiB));
    check(cuMemUnmap(va, 600 * MiB) == CUDA_SUCCESS && container_used() == 0 &&
              fake_cuda_device_used(0) == 0, "unmapped: freed and given back");

    /* The same race with a reference: retained from its address while another thread releases
     * the handle and unmaps it. */
    CUmemGenericAllocationHandle retained = 0;
    race_released = 0;
    made = cuMemCreate(&racing_handle, 600 * MiB, &prop, 0) == CUDA_SUCCESS &&
           cuMemMap(va, 600 * MiB, 0, racing_handle, 0) == CUDA_SUCCESS;
    racing_va = va;
    strcpy(fake_cuda_inside, "cuMemRetainAllocationHandle");
    fake_cuda_inside_fn = release_meanwhile;
    int kept = made && cuMemRetainAllocationHandle(&retained, (void *)(uintptr_t)va) == 0;
    race_over();
    counted = container_used();
    held = fake_cuda_device_used(0);
    check(kept && counted == 600 * MiB && held == 600 * MiB, "600 MiB retained from its address "
          "while another thread released and unmapped it: still counted (%llu MiB; the driver "
          "holds %llu MiB)", (unsigned long long)(counted / MiB), (unsigned long long)(held / MiB));
    check(cuMemRelease(retained) == CUDA_SUCCESS && container_used() == 0 &&
              fake_cuda_device_used(0) == 0, "its last reference released: given back");
    cuMemAddressFree(va, 600 * MiB);
}

/* An exported handle's memory may live on in an import (here, or in another process of the
 * container) after every reference this process knows is released: it stays counted. The
 * library before gave it back at the release, and a loop of create, export, import, release,
 * map held any amount under the cap (3.2 GiB on 1 GiB, helper review). Its own run: an
 * exported handle's memory may stay counted for the process's life. */
static void vmm_exported(void)
{
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
                                .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR};
    CUmemGenericAllocationHandle h = 0, imported = 0, twice = 0, more = 0;
    CUdeviceptr va = 0;
    int fd = -1;
    int done = cuMemCreate(&h, 800 * MiB, &prop, 0) == CUDA_SUCCESS &&
               cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) ==
                   CUDA_SUCCESS &&
               cuMemImportFromShareableHandle(&imported, (void *)(intptr_t)fd,
                                              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ==
                   CUDA_SUCCESS &&
               cuMemImportFromShareableHandle(&twice, (void *)(intptr_t)fd,
                                              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ==
                   CUDA_SUCCESS &&
               cuMemRelease(h) == CUDA_SUCCESS && cuMemRelease(twice) == CUDA_SUCCESS &&
               cuMemAddressReserve(&va, 800 * MiB, 0, 0, 0) == CUDA_SUCCESS &&
               cuMemMap(va, 800 * MiB, 0, imported, 0) == CUDA_SUCCESS;
    uint64_t counted = container_used(), held = fake_cuda_device_used(0);
    check(done && counted == 800 * MiB && held == 800 * MiB,
          "800 MiB created, exported, imported twice, its handle and one import released, the "
          "other mapped: still counted (%llu MiB; the driver holds %llu MiB)",
          (unsigned long long)(counted / MiB),
          (unsigned long long)(held / MiB));
    CUresult rc = cuMemCreate(&more, 800 * MiB, &prop, 0);
    check(rc == CUDA_ERROR_OUT_OF_MEMORY, "800 MiB more is refused under the 1 GiB cap (rc %d)",
          rc);
    cuMemUnmap(va, 800 * MiB);
    cuMemRelease(imported);
    close(fd);
}

/* An entry that maps (or unmaps) the tile at x of a sparse array onto handle: 64 x 64, or (an
 * unmap of several) width wide. */
static CUarrayMapInfo tiles_entry(CUarray array, unsigned int x, unsigned int width,
                                  CUmemOperationType op, CUmemGenericAllocationHandle handle)
{
    return (CUarrayMapInfo){.resourceType = CU_RESOURCE_TYPE_ARRAY, .resource.array = array,
                            .subresourceType = CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_SPARSE_LEVEL,
                            .subresource.sparseLevel = {.offsetX = x, .extentWidth = width,
                                                        .extentHeight = 64, .extentDepth = 1},
                            .memOperationType = op,
                            .memHandleType = CU_MEM_HANDLE_TYPE_GENERIC,
                            .memHandle.memHandle = op == CU_MEM_OPERATION_TYPE_MAP ? handle : 0,
                            .deviceBitMask = 1};
}

static CUarrayMapInfo tile_entry(CUarray array, unsigned int x, CUmemOperationType op,
                                 CUmemGenericAllocationHandle handle)
{
    return tiles_entry(array, x, 64, op, handle);
}

/* That one entry, through map. */
static CUresult tile_op(CUresult (*map)(CUarrayMapInfo *, unsigned int, CUstream), CUarray array,
                        unsigned int x, CUmemOperationType op, CUmemGenericAllocationHandle handle)
{
    CUarrayMapInfo m = tile_entry(array, x, op, handle);
    return map(&m, 1, NULL);
}

/* cuMemCreate memory bound where cuMemUnmap does not reach holds it after its handle's release,
 * counted until the binding is undone: a sparse array's tile mapped onto it (cuMemMapArrayAsync
 * and its _ptsz; undone by the tile's unmap or the array's destruction), a multicast object's
 * binding (cuMulticastBindMem, cuMulticastBindAddr of an address inside a mapping, CUDA 13.1's
 * _v2 of each; undone by cuMulticastUnbind). A bind the driver refuses holds nothing. The
 * library of a21f151 gave each back at the release, and create, map a tile, release held any
 * amount under the cap (an adversarial review: 3000 MiB on 1 GiB). Sizes in whole MiB: the
 * sparse array itself is counted a few KiB. The fake takes any value as a multicast object. */
static void vmm_bound(void)
{
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    prop.allocFlags.usage = CU_MEM_CREATE_USAGE_TILE_POOL;
    const CUDA_ARRAY3D_DESCRIPTOR sparse = {.Width = 4096, .Height = 64,
                                            .Format = CU_AD_FORMAT_UNSIGNED_INT8,
                                            .NumChannels = 1, .Flags = CUDA_ARRAY3D_SPARSE};
    typedef CUresult (*map_fn)(CUarrayMapInfo *, unsigned int, CUstream);
    map_fn map_ptsz = (map_fn)dlsym(RTLD_DEFAULT, "cuMemMapArrayAsync_ptsz");
    CUmemGenericAllocationHandle h = 0, more = 0;
    CUarray array = NULL;
    int done = cuArray3DCreate_v2(&array, &sparse) == CUDA_SUCCESS &&
               cuMemCreate(&h, 300 * MiB, &prop, 0) == CUDA_SUCCESS &&
               tile_op(cuMemMapArrayAsync, array, 0, CU_MEM_OPERATION_TYPE_MAP, h) == 0 &&
               cuMemRelease(h) == CUDA_SUCCESS;
    uint64_t counted = container_used() / MiB, held = fake_cuda_device_used(0) / MiB;
    check(done && counted == 300 && held == 300, "300 MiB created, a sparse array's tile mapped "
          "onto it, released: still counted (%llu MiB; the driver holds %llu MiB)",
          (unsigned long long)counted, (unsigned long long)held);
    uint64_t calls = fake_cuda_stats.map_array_ptsz_calls;
    done = map_ptsz != NULL && cuMemCreate(&h, 200 * MiB, &prop, 0) == CUDA_SUCCESS &&
           tile_op(map_ptsz, array, 64, CU_MEM_OPERATION_TYPE_MAP, h) == CUDA_SUCCESS &&
           cuMemRelease(h) == CUDA_SUCCESS;
    counted = container_used() / MiB;
    check(done && counted == 500 && fake_cuda_stats.map_array_ptsz_calls == calls + 1,
          "200 MiB more onto a second tile through the per-thread-stream export (the driver's "
          "_ptsz called): counted (%llu MiB)", (unsigned long long)counted);
    done = tile_op(cuMemMapArrayAsync, array, 0, CU_MEM_OPERATION_TYPE_UNMAP, 0) == 0;
    counted = container_used() / MiB;
    held = fake_cuda_device_used(0) / MiB;
    check(done && counted == 200 && held == 200, "the first tile unmapped: its 300 MiB freed and "
          "given back (%llu MiB counted, %llu held)", (unsigned long long)counted,
          (unsigned long long)held);
    done = cuArrayDestroy(array) == CUDA_SUCCESS;
    check(done && container_used() == 0 && fake_cuda_device_used(0) == 0,
          "the array destroyed: the second tile's memory freed and given back (%llu bytes "
          "counted)", (unsigned long long)container_used());

    /* One list that unmaps a tile and maps it anew: the new memory stays counted. One the
     * driver refuses at its second entry, having applied the first: that one stays counted. */
    CUmemGenericAllocationHandle second = 0;
    done = cuArray3DCreate_v2(&array, &sparse) == CUDA_SUCCESS &&
           cuMemCreate(&h, 300 * MiB, &prop, 0) == CUDA_SUCCESS &&
           tile_op(cuMemMapArrayAsync, array, 0, CU_MEM_OPERATION_TYPE_MAP, h) == 0 &&
           cuMemRelease(h) == CUDA_SUCCESS &&
           cuMemCreate(&second, 300 * MiB, &prop, 0) == CUDA_SUCCESS;
    CUarrayMapInfo remap[2] = {tile_entry(array, 0, CU_MEM_OPERATION_TYPE_UNMAP, 0),
                               tile_entry(array, 0, CU_MEM_OPERATION_TYPE_MAP, second)};
    done = done && cuMemMapArrayAsync(remap, 2, NULL) == CUDA_SUCCESS &&
           cuMemRelease(second) == CUDA_SUCCESS;
    counted = container_used() / MiB;
    held = fake_cuda_device_used(0) / MiB;
    check(done && counted == 300 && held == 300, "one list unmaps a tile and maps it onto new "
          "memory, released: the old memory given back, the new counted (%llu MiB counted, %llu "
          "held)", (unsigned long long)counted, (unsigned long long)held);
    CUarrayMapInfo half[2] = {tile_entry(array, 64, CU_MEM_OPERATION_TYPE_MAP, 0),
                              tile_entry(array, 128, CU_MEM_OPERATION_TYPE_MAP, 0)};
    half[1].memHandleType = (CUmemHandleType)7;
    done = cuMemCreate(&h, 200 * MiB, &prop, 0) == CUDA_SUCCESS &&
           (half[0].memHandle.memHandle = h, half[1].memHandle.memHandle = h,
            cuMemMapArrayAsync(half, 2, NULL)) == CUDA_ERROR_INVALID_VALUE &&
           cuMemRelease(h) == CUDA_SUCCESS;
    counted = container_used() / MiB;
    held = fake_cuda_device_used(0) / MiB;
    check(done && counted == 500 && held == 500, "a list refused at its second entry, the first "
          "applied: its memory stays counted (%llu MiB counted, %llu held)",
          (unsigned long long)counted, (unsigned long long)held);
    CUarrayMapInfo whole = tiles_entry(array, 0, 192, CU_MEM_OPERATION_TYPE_UNMAP, 0);
    done = cuMemMapArrayAsync(&whole, 1, NULL) == CUDA_SUCCESS;
    check(done && container_used() == 256 * 1024 && fake_cuda_device_used(0) == 256 * 1024,
          "one unmap over the tiles mapped one by one: all given back, the array's 256 KiB "
          "left (%llu KiB counted)", (unsigned long long)(container_used() / 1024));
    check(cuArrayDestroy(array) == CUDA_SUCCESS && container_used() == 0 &&
              fake_cuda_device_used(0) == 0, "that array destroyed: nothing counted or held");

    const CUmemGenericAllocationHandle mc = 0xc000;
    CUdeviceptr va = 0;
    done = cuMemAddressReserve(&va, 400 * MiB, 0, 0, 0) == CUDA_SUCCESS &&
           cuMemCreate(&h, 200 * MiB, &prop, 0) == CUDA_SUCCESS &&
           cuMulticastBindMem(mc, 0, h, 0, 200 * MiB, 0) == CUDA_SUCCESS &&
           cuMemRelease(h) == CUDA_SUCCESS &&
           cuMemCreate(&h, 200 * MiB, &prop, 0) == CUDA_SUCCESS &&
           cuMulticastBindMem_v2(mc, 0, 200 * MiB, h, 0, 200 * MiB, 0) == CUDA_SUCCESS &&
           cuMemRelease(h) == CUDA_SUCCESS &&
           cuMemCreate(&h, 200 * MiB, &prop, 0) == CUDA_SUCCESS &&
           cuMemMap(va, 200 * MiB, 0, h, 0) == CUDA_SUCCESS &&
           cuMulticastBindAddr(mc, 400 * MiB, va + 2 * MiB, 2 * MiB, 0) == CUDA_SUCCESS &&
           cuMemUnmap(va, 200 * MiB) == CUDA_SUCCESS && cuMemRelease(h) == CUDA_SUCCESS &&
           cuMemCreate(&h, 200 * MiB, &prop, 0) == CUDA_SUCCESS &&
           cuMemMap(va + 200 * MiB, 200 * MiB, 0, h, 0) == CUDA_SUCCESS &&
           cuMulticastBindAddr_v2(mc, 0, 600 * MiB, va + 300 * MiB, 2 * MiB, 0) == 0 &&
           cuMemUnmap(va + 200 * MiB, 200 * MiB) == CUDA_SUCCESS && cuMemRelease(h) == 0;
    counted = container_used() / MiB;
    held = fake_cuda_device_used(0) / MiB;
    check(done && counted == 800 && held == 800, "4 x 200 MiB bound to a multicast object (by "
          "handle and by an address inside a mapping since unmapped, each also through 13.1's "
          "_v2), released: counted (%llu MiB; the driver holds %llu MiB)",
          (unsigned long long)counted, (unsigned long long)held);
    CUresult rc = cuMemCreate(&more, 300 * MiB, &prop, 0);
    held = fake_cuda_device_used(0) / MiB;
    check(rc == CUDA_ERROR_OUT_OF_MEMORY && held == 800,
          "300 MiB more is refused under the 1 GiB cap (rc %d, the driver holds %llu MiB)", rc,
          (unsigned long long)held);
    done = cuMemCreate(&h, 100 * MiB, &prop, 0) == CUDA_SUCCESS &&
           cuMulticastBindMem(mc, 800 * MiB, h, 0, 100 * MiB, 1) == CUDA_ERROR_INVALID_VALUE &&
           cuMemRelease(h) == CUDA_SUCCESS;
    counted = container_used() / MiB;
    check(done && counted == 800, "a bind the driver refuses (flags 1) holds nothing: its 100 "
          "MiB given back at the release (%llu MiB counted)", (unsigned long long)counted);
    done = cuMulticastUnbind(mc, 0, 0, 400 * MiB) == CUDA_SUCCESS;
    counted = container_used() / MiB;
    held = fake_cuda_device_used(0) / MiB;
    check(done && counted == 400 && held == 400, "the bindings at offsets under 400 MiB undone: "
          "their memory freed and given back (%llu MiB counted, %llu held)",
          (unsigned long long)counted, (unsigned long long)held);
    done = cuMulticastUnbind(mc, 0, 400 * MiB, 400 * MiB) == CUDA_SUCCESS;
    check(done && container_used() == 0 && fake_cuda_device_used(0) == 0,
          "the rest undone: nothing counted or held");
    cuMemAddressFree(va, 400 * MiB);
}

/* Stream-ordered allocations come from the stream's device, whatever context is current, and
 * on a stream named explicitly need no current context at all: each counted on the stream's
 * device (the library before counted them on the current context's device, or not at all). */
static void streams(void)
{
    CUstream s0 = NULL, s1 = NULL;
    CUmemoryPool pool1 = NULL;
    CUdeviceptr p = 0, q = 0;
    use_device(0);
    /* Synchronised first: the pools give back what earlier stream-ordered frees left cached. */
    int made = cuCtxSynchronize() == CUDA_SUCCESS && cuStreamCreate(&s0, 0) == CUDA_SUCCESS;
    use_device(1);
    made &= cuCtxSynchronize() == CUDA_SUCCESS && cuStreamCreate(&s1, 0) == CUDA_SUCCESS &&
            cuDeviceGetDefaultMemPool(&pool1, 1) == CUDA_SUCCESS;
    check(made, "a stream on each device, device 1's pool");
    cuCtxSetCurrent(NULL);
    CUcontext now = ctx[1];
    check(cuMemAllocAsync(&p, 2048 * MiB, s0) == CUDA_ERROR_OUT_OF_MEMORY &&
              fake_cuda_device_used(0) == 0,
          "no current context: 2 GiB on device 0's stream refused under its 1 GiB cap");
    check(cuMemAllocAsync(&p, 600 * MiB, s0) == CUDA_SUCCESS &&
              fake_cuda_device_used(0) == 600 * MiB && cuCtxGetCurrent(&now) == 0 && now == NULL,
          "... and 600 MiB allowed, on device 0; still no current context");
    use_device(0);
    check(container_used() == 600 * MiB, "counted on device 0 (%llu MiB)",
          (unsigned long long)(container_used() / MiB));
    check(cuMemAllocAsync(&q, 600 * MiB, s1) == CUDA_ERROR_OUT_OF_MEMORY &&
              fake_cuda_device_used(1) == 0,
          "device 0 current: 600 MiB on device 1's stream refused under device 1's 512 MiB cap");
    check(cuMemAllocFromPoolAsync(&q, 600 * MiB, pool1, s1) == CUDA_ERROR_OUT_OF_MEMORY,
          "... from device 1's pool too");
    check(cuMemAllocAsync(&q, 300 * MiB, s1) == CUDA_SUCCESS &&
              fake_cuda_device_used(1) == 300 * MiB && container_used() == 600 * MiB &&
              cuCtxGetCurrent(&now) == 0 && now == ctx[0],
          "300 MiB on device 1's stream fit, device 0's count unchanged, device 0 still current");
    CUdeviceptr r = 0;
    check(cuMemAllocFromPoolAsync(&r, 300 * MiB, pool1, s0) == CUDA_ERROR_OUT_OF_MEMORY &&
              container_used() == 600 * MiB,
          "device 1's pool on device 0's stream: counted on device 1, so 300 MiB more is "
          "refused there");
    check(fake_cuda_device_used(1) == 300 * MiB, "... and given back, not left in the pool's "
          "cache (%llu MiB held on device 1)",
          (unsigned long long)(fake_cuda_device_used(1) / MiB));
    check(cuMemAllocFromPoolAsync(&r, 200 * MiB, pool1, s0) == CUDA_SUCCESS &&
              fake_cuda_device_used(1) == 500 * MiB && container_used() == 600 * MiB,
          "... and 200 MiB fit, on device 1, device 0's count unchanged");
    check(cuMemFreeAsync(r, s0) == CUDA_SUCCESS, "freed");
    use_device(1);
    /* The pool keeps what the free gave back until a synchronisation, and it stays counted
     * (footprint.h, vgpu_footprint_pool_kept): device 1 measured at its context, as NVML lists
     * every process with one. (Before the fake listed a context of 0 bytes, device 1 was never
     * measured here and the free's bytes went back at once.) */
    check(container_used() == 500 * MiB && fake_cuda_device_used(1) == 500 * MiB,
          "counted on device 1 while its pool keeps the 200 MiB freed (%llu MiB)",
          (unsigned long long)(container_used() / MiB));
    int synced = cuCtxSynchronize() == CUDA_SUCCESS;
    uint64_t after = container_used();
    check(synced && after == 300 * MiB && fake_cuda_device_used(1) == 300 * MiB,
          "... and 300 MiB once device 1 is synchronised, its pool giving them back (%llu MiB)",
          (unsigned long long)(after / MiB));
    cuCtxSetCurrent(NULL);
    check(cuMemFreeAsync(p, s0) == CUDA_SUCCESS && cuMemFreeAsync(q, s1) == CUDA_SUCCESS &&
              cuStreamSynchronize(s0) == CUDA_SUCCESS && cuStreamSynchronize(s1) == CUDA_SUCCESS &&
              fake_cuda_device_used(0) == 0 && fake_cuda_device_used(1) == 0,
          "both freed and synchronised with no current context");
    static char not_a_stream[64];
    check(cuMemAllocAsync(&p, MiB, (CUstream)(void *)not_a_stream) == CUDA_ERROR_INVALID_CONTEXT,
          "a stream whose device cannot be told is refused, not left uncounted");
    use_device(1);
    check(container_used() == 0, "device 1 back to 0");
    use_device(0);
    check(container_used() == 0 && cuStreamDestroy_v2(s0) == CUDA_SUCCESS &&
              cuStreamDestroy_v2(s1) == CUDA_SUCCESS,
          "device 0 back to 0, streams destroyed");
}

static void *no_context_thread(void *arg)
{
    CUdeviceptr p = 0;
    *(CUresult *)arg = cuMemAlloc_v2(&p, MiB);
    return NULL;
}

static void errors(void)
{
    uint64_t frees = fake_cuda_stats.free_calls;
    check(cuMemFree_v2((CUdeviceptr)0xdead0000) == CUDA_ERROR_INVALID_VALUE,
          "freeing an unknown pointer returns the driver's answer");
    check(fake_cuda_stats.free_calls == frees + 1, "the unknown free reached the driver");
    check(cuMemFree_v2(0) == CUDA_ERROR_INVALID_VALUE && fake_cuda_stats.free_calls == frees + 2,
          "freeing NULL reaches the driver");

    CUdeviceptr p = 0;
    strcpy(fake_cuda_fail_next, "cuMemAlloc_v2");
    check(cuMemAlloc_v2(&p, 10 * MiB) == CUDA_ERROR_UNKNOWN && container_used() == 0,
          "a driver failure is returned and its reservation given back");
    check(cuMemAlloc_v2(&p, 10 * MiB) == CUDA_SUCCESS, "allocation after the failure");
    strcpy(fake_cuda_fail_next, "cuMemFree_v2");
    check(cuMemFree_v2(p) == CUDA_ERROR_UNKNOWN && container_used() == 10 * MiB,
          "a failed free keeps the memory counted");
    check(cuMemFree_v2(p) == CUDA_SUCCESS && container_used() == 0, "the retried free releases");

    CUresult rc = CUDA_SUCCESS;
    pthread_t t;
    pthread_create(&t, NULL, no_context_thread, &rc);
    pthread_join(t, NULL);
    check(rc == CUDA_ERROR_INVALID_CONTEXT && container_used() == 0,
          "no current context: the driver's error, nothing counted");
}

static void nvml(uint64_t dev0_total, uint64_t dev1_total)
{
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    typedef nvmlReturn_t (*init_fn)(void);
    typedef nvmlReturn_t (*handle_fn)(unsigned int, nvmlDevice_t *);
    typedef nvmlReturn_t (*mem_fn)(nvmlDevice_t, nvmlMemory_t *);
    typedef nvmlReturn_t (*mem2_fn)(nvmlDevice_t, nvmlMemory_v2_t *);
    init_fn init = (init_fn)dlsym(lib, "nvmlInit_v2");
    handle_fn by_index = (handle_fn)dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    mem_fn mem1 = (mem_fn)dlsym(lib, "nvmlDeviceGetMemoryInfo");
    mem2_fn mem2 = (mem2_fn)dlsym(lib, "nvmlDeviceGetMemoryInfo_v2");
    check(lib != NULL && init != NULL && by_index != NULL, "NVML loaded by dlopen");
    check((void *)mem2 == dlsym(RTLD_DEFAULT, "nvmlDeviceGetMemoryInfo_v2"),
          "dlsym(libnvidia-ml, nvmlDeviceGetMemoryInfo_v2) gives the wrapper");
    init();
    CUdeviceptr p;
    cuMemAlloc_v2(&p, 300 * MiB);
    nvmlDevice_t d0, d1;
    by_index(0, &d0);
    by_index(1, &d1);
    nvmlMemory_t m1;
    nvmlMemory_v2_t m2 = {.version = nvmlMemory_v2};
    check(mem1(d0, &m1) == NVML_SUCCESS && m1.total == dev0_total && m1.used == 300 * MiB &&
          m1.free == dev0_total - 300 * MiB,
          "NVML v1 device 0: used %llu MiB / total %llu MiB", m1.used / MiB, m1.total / MiB);
    check(mem2(d0, &m2) == NVML_SUCCESS && m2.total == dev0_total && m2.used == 300 * MiB &&
          m2.free + m2.used + m2.reserved == m2.total,
          "NVML v2 device 0: used %llu MiB / total %llu MiB, reserved %llu", m2.used / MiB,
          m2.total / MiB, m2.reserved / MiB);
    check(mem1(d1, &m1) == NVML_SUCCESS && m1.total == dev1_total,
          "NVML v1 device 1 total %llu MiB", m1.total / MiB);
    nvmlMemory_v2_t bad = {.version = 1};
    check(mem2(d0, &bad) == NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
          "NVML v2 errors are passed through");
    cuMemFree_v2(p);
}

static void uncapped(void)
{
    size_t bytes = 0, free_b, total_b;
    cuDeviceTotalMem_v2(&bytes, 0);
    check(bytes == fake_cuda_device_total(0), "no cap: cuDeviceTotalMem is the physical size");
    CUdeviceptr p;
    check(cuMemAlloc_v2(&p, 2048 * MiB) == CUDA_SUCCESS, "no cap: 2 GiB allocates");
    cuMemGetInfo_v2(&free_b, &total_b);
    check(total_b == fake_cuda_device_total(0) && free_b == total_b - 2048 * MiB,
          "no cap: cuMemGetInfo passes the driver's figures through");
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    nvmlReturn_t (*init)(void) = (nvmlReturn_t (*)(void))dlsym(lib, "nvmlInit_v2");
    nvmlReturn_t (*by_index)(unsigned, nvmlDevice_t *) =
        (nvmlReturn_t (*)(unsigned, nvmlDevice_t *))dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    nvmlReturn_t (*mem2)(nvmlDevice_t, nvmlMemory_v2_t *) =
        (nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_v2_t *))dlsym(lib, "nvmlDeviceGetMemoryInfo_v2");
    nvmlDevice_t d0;
    init();
    by_index(0, &d0);
    nvmlMemory_v2_t m2 = {.version = nvmlMemory_v2};
    mem2(d0, &m2);
    check(m2.total == fake_cuda_device_total(0) && m2.reserved == 5 * MiB,
          "no cap: NVML figures untouched");
    cuMemFree_v2(p);
}

/* Reads the whole file at path (following a link, as a victim's reader would); 0 bytes for
 * anything but a regular file (a FIFO must not block the test). */
static size_t slurp(const char *path, char *buf, size_t size)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    size_t n = 0;
    if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
        ssize_t got = pread(fd, buf, size, 0);
        n = got > 0 ? (size_t)got : 0;
    }
    if (fd >= 0)
        close(fd);
    return n;
}

/* The region file cannot be used (argv[2] says how it must be reported): CUDA is refused, nothing
 * is allocated or reported, NVML memory figures are refused too, and the file is left as it was
 * (a HAMi-core cache, a region of another version, a link's target, a file that merely starts
 * with zero bytes). Never a private region with a cap of its own. */
static void refused(const char *expected_log)
{
    const char *path = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    static char before[300000], after[300000];
    size_t n_before = slurp(path, before, sizeof before);
    capture_begin(); /* the region is attached when the driver is first used */
    CUresult init = cuInit(0);
    const char *log = capture_end();
    check(init == CUDA_ERROR_NOT_PERMITTED, "cuInit is refused (%d)", init);
    check(strstr(log, expected_log) != NULL && strstr(log, "CUDA is refused") != NULL,
          "the unusable region is reported: %s", log);
    CUresult (*real_init)(unsigned) = (CUresult(*)(unsigned))fake_cuda_entry("cuInit");
    real_init(0); /* the driver initialised behind libvgpu's back: still nothing */
    cuDevicePrimaryCtxRetain(&ctx[0], 0);
    use_device(0);
    CUdeviceptr a = 0;
    size_t free_b, total_b;
    check(cuMemAlloc_v2(&a, 600 * MiB) == CUDA_ERROR_OUT_OF_MEMORY && fake_cuda_device_used(0) == 0,
          "allocations are refused");
    check(cuMemGetInfo_v2(&free_b, &total_b) == CUDA_ERROR_NOT_PERMITTED &&
          cuDeviceTotalMem_v2(&total_b, 0) == CUDA_ERROR_NOT_PERMITTED, "and nothing is reported");
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    nvmlReturn_t (*init_nvml)(void) = (nvmlReturn_t (*)(void))dlsym(lib, "nvmlInit_v2");
    nvmlReturn_t (*by_index)(unsigned, nvmlDevice_t *) =
        (nvmlReturn_t (*)(unsigned, nvmlDevice_t *))dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    nvmlReturn_t (*mem1)(nvmlDevice_t, nvmlMemory_t *) =
        (nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t *))dlsym(lib, "nvmlDeviceGetMemoryInfo");
    nvmlDevice_t d0;
    nvmlMemory_t m1;
    init_nvml();
    by_index(0, &d0);
    check(mem1(d0, &m1) == NVML_ERROR_NO_PERMISSION, "NVML memory figures are refused too");
    size_t n_after = slurp(path, after, sizeof after);
    check(n_after == n_before && memcmp(before, after, n_before) == 0,
          "the file is left as it was (%zu bytes before, %zu after)", n_before, n_after);
}

/* The legacy exports (CUDA 2.x ABI: 32-bit sizes and pointers), called directly and found by
 * cuGetProcAddress at an old version, are capped like the _v2 ones. */
static void legacy_v1(void)
{
    v1_ptr a = 0, b = 7, c = 0;
    unsigned int free_b = 0, total_b = 0, pitch = 0, total = 0;
    check(cuMemAlloc(&a, 600 * MiB) == CUDA_SUCCESS && a != 0 && container_used() == 600 * MiB,
          "cuMemAlloc (v1) is counted");
    check(cuMemAlloc(&b, 600 * MiB) == CUDA_ERROR_OUT_OF_MEMORY && b == 7,
          "cuMemAlloc (v1) over the cap is refused");
    check(cuMemGetInfo(&free_b, &total_b) == CUDA_SUCCESS && total_b == 1024 * MiB &&
          free_b == 424 * MiB, "cuMemGetInfo (v1) reports the cap: free %u MiB of %u MiB",
          free_b / (unsigned)MiB, total_b / (unsigned)MiB);
    check(cuDeviceTotalMem(&total, 0) == CUDA_SUCCESS && total == 1024 * MiB,
          "cuDeviceTotalMem (v1) reports the cap (%u MiB)", total / (unsigned)MiB);
    check(cuMemAllocPitch(&c, &pitch, 1000, 1000, 4) == CUDA_SUCCESS && pitch == 1024 &&
          container_used() == 600 * MiB + 1024 * 1000, "cuMemAllocPitch (v1) is counted");
    check(cuMemFree(c) == CUDA_SUCCESS && cuMemFree(a) == CUDA_SUCCESS && container_used() == 0,
          "cuMemFree (v1) gives it back");
    CUarray arr = NULL;
    struct array_v1 d2 = {.Width = 1024, .Height = 1024, .Format = CU_AD_FORMAT_FLOAT,
                          .NumChannels = 4};
    check(cuArrayCreate(&arr, &d2) == CUDA_SUCCESS && container_used() == 16 * MiB,
          "cuArrayCreate (v1) is counted (16 MiB)");
    check(cuArrayDestroy(arr) == CUDA_SUCCESS && container_used() == 0, "and destroyed");
    struct array3d_v1 d3 = {.Width = 1024, .Height = 1024, .Depth = 2048,
                            .Format = CU_AD_FORMAT_UNSIGNED_INT8, .NumChannels = 1};
    check(cuArray3DCreate(&arr, &d3) == CUDA_ERROR_OUT_OF_MEMORY,
          "cuArray3DCreate (v1) of 2 GiB is refused");
    typedef CUresult (*alloc_v1_fn)(v1_ptr *, unsigned int);
    alloc_v1_fn via_gpa = NULL;
    CUdriverProcAddressQueryResult status;
    check(cuGetProcAddress_v2("cuMemAlloc", (void **)&via_gpa, 2000, 0, &status) == CUDA_SUCCESS &&
          via_gpa != NULL && via_gpa(&a, 2000 * MiB) == CUDA_ERROR_OUT_OF_MEMORY,
          "cuGetProcAddress(cuMemAlloc, 2.0) gives the capped v1 wrapper");
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    alloc_v1_fn via_dlsym = (alloc_v1_fn)dlsym(driver, "cuMemAlloc");
    check(via_dlsym != NULL && via_dlsym(&a, 2000 * MiB) == CUDA_ERROR_OUT_OF_MEMORY,
          "dlsym(libcuda, cuMemAlloc) gives the capped v1 wrapper");
}

/* The driver's pitch (FAKE_CUDA_PITCH_ALIGN=2048) is wider than libvgpu's 512-byte estimate:
 * the allocation is counted at the real size, and refused if the real size does not fit. */
static void wide_pitch(void)
{
    CUdeviceptr p = 0, big = 0;
    size_t pitch = 0;
    check(cuMemAllocPitch_v2(&p, &pitch, 1000, 1000, 4) == CUDA_SUCCESS && pitch == 2048 &&
          container_used() == 2048 * 1000, "counted at the driver's pitch (%zu): %llu bytes", pitch,
          (unsigned long long)container_used());
    cuMemFree_v2(p);
    check(cuMemAlloc_v2(&big, 1023 * MiB) == CUDA_SUCCESS, "1023 MiB of the 1 GiB cap taken");
    uint64_t frees = fake_cuda_stats.free_calls;
    pitch = 77;
    p = 0x1234;
    /* estimate 1024 x 1000 fits in the last MiB, the real 2048 x 1000 does not */
    check(cuMemAllocPitch_v2(&p, &pitch, 1000, 1000, 4) == CUDA_ERROR_OUT_OF_MEMORY,
          "refused when the real pitch does not fit");
    check(fake_cuda_stats.free_calls == frees + 1 && fake_cuda_device_used(0) == 1023 * MiB,
          "the driver's allocation was given back");
    check(p == 0x1234 && pitch == 77 && container_used() == 1023 * MiB,
          "outputs untouched, nothing left counted");
    cuMemFree_v2(big);
}

/* The VMM calls of an application's signal handler, raised on the thread whose own cuMemMap
 * is inside the driver (under the library's vmm lock): the release of the handle being mapped,
 * the unmap of its range, and a creation. */
/* volatile: shared between the handler and the code it interrupts. */
static volatile CUmemGenericAllocationHandle handler_handle;
static volatile CUdeviceptr handler_va;
static volatile CUresult handler_release_rc, handler_create_rc, handler_unmap_rc;

static void vmm_calls_on_signal(int sig)
{
    (void)sig;
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    CUmemGenericAllocationHandle h = 0;
    handler_release_rc = cuMemRelease(handler_handle);
    handler_unmap_rc = handler_va != 0 ? cuMemUnmap(handler_va, 600 * MiB) : CUDA_SUCCESS;
    handler_create_rc = cuMemCreate(&h, 2 * MiB, &prop, 0);
    if (handler_create_rc == CUDA_SUCCESS)
        cuMemRelease(h);
}

static void raise_inside(void) { raise(SIGUSR1); }

/* A signal handler's VMM calls inside its thread's own mapping are refused (each said on
 * stderr), and the mapped memory stays counted. The vmm lock is recursive: the library of
 * 85a3949 let the handler's release in while the driver mapped, found no mapping recorded yet
 * and gave the 600 MiB back, and 600 MiB more were then created on the 1 GiB cap. Outside the
 * library the same handler's calls work. */
static void vmm_handler_inside(void)
{
    struct sigaction sa = {.sa_handler = vmm_calls_on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle more = 0;
    CUmemGenericAllocationHandle made_handle = 0;
    int made = cuMemCreate(&made_handle, 600 * MiB, &prop, 0) == CUDA_SUCCESS &&
               cuMemAddressReserve(&va, 600 * MiB, 0, 0, 0) == CUDA_SUCCESS;
    handler_release_rc = handler_create_rc = handler_unmap_rc = CUDA_ERROR_UNKNOWN;
    handler_handle = made_handle;
    handler_va = va;
    strcpy(fake_cuda_inside, "cuMemMap");
    fake_cuda_inside_fn = raise_inside;
    capture_begin();
    int mapped = made && cuMemMap(va, 600 * MiB, 0, made_handle, 0) == CUDA_SUCCESS;
    const char *said = capture_end();
    fake_cuda_inside[0] = '\0';
    check(mapped && handler_release_rc == CUDA_ERROR_NOT_PERMITTED &&
              handler_unmap_rc == CUDA_ERROR_NOT_PERMITTED &&
              handler_create_rc == CUDA_ERROR_NOT_PERMITTED,
          "a signal handler's release, unmap and creation inside the thread's cuMemMap: refused "
          "(rc %d, %d, %d)", handler_release_rc, handler_unmap_rc, handler_create_rc);
    check(strstr(said, "cuMemRelease made inside a signal handler") != NULL &&
              strstr(said, "cuMemUnmap made inside a signal handler") != NULL &&
              strstr(said, "cuMemCreate made inside a signal handler") != NULL,
          "each refusal said on stderr: %s", said);
    uint64_t counted = container_used(), held = fake_cuda_device_used(0);
    check(counted == 600 * MiB && held == 600 * MiB, "the 600 MiB mapped stay counted (%llu MiB; "
          "the driver holds %llu MiB)", (unsigned long long)(counted / MiB),
          (unsigned long long)(held / MiB));
    CUresult rc = cuMemCreate(&more, 600 * MiB, &prop, 0);
    check(rc == CUDA_ERROR_OUT_OF_MEMORY, "600 MiB more is refused (rc %d, the driver holds "
          "%llu MiB)", rc, (unsigned long long)(fake_cuda_device_used(0) / MiB));
    check(cuMemRelease(made_handle) == CUDA_SUCCESS && cuMemUnmap(va, 600 * MiB) == CUDA_SUCCESS &&
              container_used() == 0 && fake_cuda_device_used(0) == 0,
          "released and unmapped by the thread itself: freed and given back");
    handler_handle = 0;
    handler_va = 0;
    handler_release_rc = handler_create_rc = CUDA_ERROR_UNKNOWN;
    raise(SIGUSR1);
    check(handler_create_rc == CUDA_SUCCESS && container_used() == 0,
          "the handler's creation outside the library: made (rc %d), then released",
          handler_create_rc);
    cuMemAddressFree(va, 600 * MiB);
}

static CUdeviceptr meanwhile;
static size_t meanwhile_bytes;

/* Another thread's allocation, landing while a call is inside the driver. */
static void allocate_meanwhile(void)
{
    CUcontext was = NULL;
    cuCtxGetCurrent(&was);
    cuCtxSetCurrent(ctx[0]); /* that thread's context */
    cuMemAlloc_v2(&meanwhile, meanwhile_bytes);
    cuCtxSetCurrent(was);
}

static void inside_next(const char *name, size_t bytes)
{
    meanwhile_bytes = bytes;
    strcpy(fake_cuda_inside, name);
    fake_cuda_inside_fn = allocate_meanwhile;
}

/* A 256 MiB array, a quarter of the 1 GiB cap (the arrays cases). */
static const CUDA_ARRAY_DESCRIPTOR quarter = {.Width = 8192, .Height = 8192,
                                              .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};

/* A context's arrays are freed with it, and a destroyed array may not be passed to the driver
 * again (so nothing can be asked about it): a created context's destroy, a reset and the last
 * release of the primary context give their arrays' bytes back, each its own context's only.
 * Run alone, device 0's 1 GiB cap. */
static void arrays_teardown(void)
{
    CUcontext created = NULL;
    CUarray mine = NULL, theirs = NULL;
    CUmipmappedArray levels = NULL;
    CUdeviceptr p = 0;
    CUDA_ARRAY3D_DESCRIPTOR half = {.Width = 8192, .Height = 8192, .Depth = 0,
                                    .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 2};
    use_device(0);
    int made = cuArrayCreate_v2(&mine, &quarter) == CUDA_SUCCESS &&
               cuCtxCreate_v2(&created, 0, 0) == CUDA_SUCCESS &&
               cuArrayCreate_v2(&theirs, &quarter) == CUDA_SUCCESS;
    check(made && container_used() == 512 * MiB, "a 256 MiB array in the primary context and "
          "one in a created context (%llu MiB counted)",
          (unsigned long long)(container_used() / MiB));
    CUresult rc = cuCtxDestroy_v2(created);
    use_device(0);
    check(rc == CUDA_SUCCESS && container_used() == 256 * MiB,
          "the created context destroyed: its array's 256 MiB given back, the primary "
          "context's kept (%llu MiB counted; the library of 96524f5 kept both)",
          (unsigned long long)(container_used() / MiB));
    made = cuMipmappedArrayCreate(&levels, &half, 1) == CUDA_SUCCESS;
    check(made && container_used() == 768 * MiB, "a 512 MiB mipmapped array beside it (%llu MiB)",
          (unsigned long long)(container_used() / MiB));
    rc = cuDevicePrimaryCtxReset_v2(0) == CUDA_SUCCESS
             ? cuDevicePrimaryCtxRetain(&ctx[0], 0) : CUDA_ERROR_UNKNOWN;
    use_device(0);
    check(rc == CUDA_SUCCESS && container_used() == 0,
          "cudaDeviceReset: both arrays given back (%llu MiB counted)",
          (unsigned long long)(container_used() / MiB));
    rc = cuMemAlloc_v2(&p, 1000 * MiB);
    check(rc == CUDA_SUCCESS, "1000 MiB fit under the 1 GiB cap after it (rc %d; the library "
          "of 96524f5 refused them)", rc);
    cuMemFree_v2(p);
    made = cuArrayCreate_v2(&mine, &quarter) == CUDA_SUCCESS && container_used() == 256 * MiB;
    unsigned int flags = 0;
    int active = 1, releases = 0;
    while (active && releases++ < 4 && cuDevicePrimaryCtxRelease_v2(0) == CUDA_SUCCESS)
        cuDevicePrimaryCtxGetState(0, &flags, &active);
    rc = cuDevicePrimaryCtxRetain(&ctx[0], 0); /* a context to ask cuMemGetInfo in */
    use_device(0);
    check(made && !active && rc == CUDA_SUCCESS && container_used() == 0,
          "an array, then the primary context's last release (%d releases): given back (%llu "
          "MiB counted)", releases, (unsigned long long)(container_used() / MiB));
}

/* Inside the last release's question whether the primary context is still active (the answer
 * given, "no", and already old): another thread retains it anew and makes a 256 MiB array in
 * it, under the same handle. */
static CUarray made_meanwhile;
static CUresult meanwhile_rc = CUDA_ERROR_UNKNOWN;
static void retain_and_make_array(void)
{
    CUcontext again = NULL, was = NULL;
    meanwhile_rc = cuDevicePrimaryCtxRetain(&again, 0) == CUDA_SUCCESS &&
                           cuCtxGetCurrent(&was) == CUDA_SUCCESS &&
                           cuCtxSetCurrent(again) == CUDA_SUCCESS
                       ? cuArrayCreate_v2(&made_meanwhile, &quarter) : CUDA_ERROR_UNKNOWN;
    cuCtxSetCurrent(was);
}

/* An array made in a context made anew (or given the handle) while the old one's end is under
 * way is the new context's: it stays counted. FAKE_NVML_MEMORY_NA=1, so that no measurement of
 * the process's context memory covers what the table lost. Run alone, a 1 GiB cap. */
static void arrays_race(void)
{
    strcpy(fake_cuda_inside, "cuDevicePrimaryCtxGetState");
    fake_cuda_inside_fn = retain_and_make_array;
    CUresult rc = cuDevicePrimaryCtxRelease_v2(0); /* main's retain was the only one */
    use_device(0);
    check(rc == CUDA_SUCCESS && meanwhile_rc == CUDA_SUCCESS && container_used() == 256 * MiB,
          "the last release, a retain and a 256 MiB array made while it asks whether the "
          "context is active: the array stays counted (%llu MiB; forgotten with the old "
          "context, 0)", (unsigned long long)(container_used() / MiB));
    CUdeviceptr p = 0;
    rc = cuMemAlloc_v2(&p, 1000 * MiB);
    check(rc == CUDA_ERROR_OUT_OF_MEMORY && fake_cuda_device_used(0) == 256 * MiB,
          "1000 MiB beside it are refused (rc %d; the driver holds %llu MiB; forgotten, 1256 "
          "MiB were held on the 1 GiB cap)", rc,
          (unsigned long long)(fake_cuda_device_used(0) / MiB));
}

/* The primary context's last release made by a green context's end (the green context retained
 * it): the primary context's arrays are given back; the green context's own stay counted, no
 * context's (whether a green context's end frees them is not known; the fake frees them). */
static void arrays_green(void)
{
    CUarray mine = NULL, its = NULL;
    CUgreenCtx green = NULL;
    CUcontext as = NULL;
    use_device(0);
    int made = cuArrayCreate_v2(&mine, &quarter) == CUDA_SUCCESS &&
               cuGreenCtxCreate(&green, NULL, 0, CU_GREEN_CTX_DEFAULT_STREAM) == CUDA_SUCCESS &&
               cuCtxFromGreenCtx(&as, green) == CUDA_SUCCESS &&
               cuCtxSetCurrent(as) == CUDA_SUCCESS &&
               cuArrayCreate_v2(&its, &quarter) == CUDA_SUCCESS;
    use_device(0);
    check(made && container_used() == 512 * MiB, "a 256 MiB array in the primary context and "
          "one in a green context (%llu MiB counted)",
          (unsigned long long)(container_used() / MiB));
    CUresult rc = cuDevicePrimaryCtxRelease_v2(0) == CUDA_SUCCESS ? cuGreenCtxDestroy(green)
                                                                 : CUDA_ERROR_UNKNOWN;
    CUcontext primary = NULL, created = NULL;
    int again = cuDevicePrimaryCtxRetain(&primary, 0) == CUDA_SUCCESS &&
                cuCtxSetCurrent(primary) == CUDA_SUCCESS;
    check(rc == CUDA_SUCCESS && again && container_used() == 256 * MiB,
          "the primary context released, the green context destroyed (its last release): the "
          "primary context's array given back, the green context's kept (%llu MiB counted; "
          "512 when the green context's end forgot the primary context's arrays)",
          (unsigned long long)(container_used() / MiB));
    rc = cuCtxCreate_v2(&created, 0, 0) == CUDA_SUCCESS ? cuCtxDestroy_v2(created)
                                                        : CUDA_ERROR_UNKNOWN;
    use_device(0);
    ctx[0] = primary;
    use_device(0);
    check(rc == CUDA_SUCCESS && container_used() == 256 * MiB,
          "a context created and destroyed after it, under the green context's old handle (the "
          "fake's malloc gives it out again): nothing of the green context's given back (%llu "
          "MiB counted; 0 while the handle still owned its array)",
          (unsigned long long)(container_used() / MiB));
}

/* A destroyed context's memory is freed by the driver with no free call (cudaDeviceReset, the
 * last release of a primary context, cuCtxDestroy): the cap must get it back, and only it.
 * Run alone ("teardown"), so the table holds only what is allocated here. */
static void teardown(void)
{
    CUdeviceptr a = 0, m = 0, p = 0, kept = 0, again = 0, mine = 0, x = 0, y = 0;
    CUcontext created;
    use_device(0);
    int made = cuMemAlloc_v2(&a, 600 * MiB) == CUDA_SUCCESS &&
               cuMemAllocManaged(&m, 100 * MiB, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS &&
               cuMemAllocAsync(&p, 100 * MiB, NULL) == CUDA_SUCCESS;
    use_device(1);
    made = made && cuMemAlloc_v2(&kept, 300 * MiB) == CUDA_SUCCESS;
    use_device(0);
    check(made && container_used() == 800 * MiB, "800 MiB on device 0 (plain, managed, "
          "stream-ordered), 300 MiB on device 1");
    CUresult rc = cuDevicePrimaryCtxReset_v2(0);
    CUcontext now = NULL;
    CUdevice d;
    CUresult gone = cuCtxGetDevice(&d);
    check(rc == CUDA_SUCCESS && gone == CUDA_ERROR_CONTEXT_IS_DESTROYED &&
              cuCtxGetCurrent(&now) == CUDA_SUCCESS && now == ctx[0],
          "after the reset the thread's context is the destroyed primary one, as before (rc %d)",
          gone);
    rc = cuDevicePrimaryCtxRetain(&ctx[0], 0);
    use_device(0);
    uint64_t dev0 = container_used();
    check(rc == CUDA_SUCCESS && dev0 == 100 * MiB, "cudaDeviceReset gave the primary context's "
          "700 MiB back (asked with no current context); the stream-ordered 100 MiB, no "
          "context's (cuda.h), stays counted (%llu MiB)", (unsigned long long)(dev0 / MiB));
    use_device(1);
    uint64_t dev1 = container_used();
    check(dev1 == 300 * MiB, "device 1's allocation stays counted (%llu MiB)",
          (unsigned long long)(dev1 / MiB));
    use_device(0);
    check(cuMemFreeAsync(p, NULL) == CUDA_SUCCESS &&
              cuCtxSynchronize() == CUDA_SUCCESS &&
              cuMemAlloc_v2(&again, 1000 * MiB) == CUDA_SUCCESS,
          "the stream-ordered one freed, 1000 MiB fit under the 1 GiB cap");
    rc = cuMemFree_v2(a);
    dev0 = container_used();
    check(rc != CUDA_SUCCESS && dev0 == 1000 * MiB, "freeing a pointer the reset freed changes "
          "nothing (rc %d, %llu MiB counted)", rc, (unsigned long long)(dev0 / MiB));
    cuMemFree_v2(again);

    made = cuMemAlloc_v2(&mine, 200 * MiB) == CUDA_SUCCESS &&
           cuCtxCreate_v2(&created, 0, 0) == CUDA_SUCCESS &&
           cuMemAlloc_v2(&x, 500 * MiB) == CUDA_SUCCESS &&
           cuMemAllocAsync(&p, 100 * MiB, NULL) == CUDA_SUCCESS;
    rc = cuCtxDestroy_v2(created);
    use_device(0);
    dev0 = container_used();
    check(made && rc == CUDA_SUCCESS && dev0 == 300 * MiB, "a destroyed context's 500 MiB given "
          "back; its stream-ordered 100 MiB and the primary context's 200 MiB kept (%llu MiB)",
          (unsigned long long)(dev0 / MiB));
    cuMemFreeAsync(p, NULL);
    cuCtxSynchronize(); /* the pool gives it back (else NVML shows it, as context memory) */

    CUcontext again1;
    use_device(1);
    made = cuDevicePrimaryCtxRetain(&again1, 1) == CUDA_SUCCESS &&
           cuDevicePrimaryCtxRelease_v2(1) == CUDA_SUCCESS;
    dev1 = container_used();
    check(made && dev1 == 300 * MiB, "a release that leaves the primary context retained frees "
          "nothing (%llu MiB)", (unsigned long long)(dev1 / MiB));
    rc = cuDevicePrimaryCtxRelease_v2(1);
    cuDevicePrimaryCtxRetain(&ctx[1], 1);
    dev1 = container_used();
    check(rc == CUDA_SUCCESS && dev1 == 0, "the last release gave device 1's 300 MiB back (%llu "
          "MiB)", (unsigned long long)(dev1 / MiB));

    /* The driver cannot say whether the pointer is still there (the only one counted, so the
     * one question fails): it stays counted, until the driver hands its address out again. */
    use_device(0);
    cuMemFree_v2(mine);
    made = cuCtxCreate_v2(&created, 0, 0) == CUDA_SUCCESS &&
           cuMemAlloc_v2(&x, 400 * MiB) == CUDA_SUCCESS;
    strcpy(fake_cuda_fail_next, "cuPointerGetAttribute");
    capture_begin();
    rc = cuCtxDestroy_v2(created);
    const char *log = capture_end();
    use_device(0);
    dev0 = container_used();
    check(made && rc == CUDA_SUCCESS && dev0 == 400 * MiB, "a pointer the driver does not answer "
          "for stays counted (%llu MiB)", (unsigned long long)(dev0 / MiB));
    check(strstr(log, "could not say whether 1 counted allocations still exist") != NULL,
          "and that is logged: %s", log);
    capture_begin();
    made = cuMemAlloc_v2(&y, 400 * MiB) == CUDA_SUCCESS;
    log = capture_end();
    dev0 = container_used();
    check(made && y == x && dev0 == 400 * MiB, "its address handed out again: the stale entry "
          "given back (%llu MiB counted)", (unsigned long long)(dev0 / MiB));
    check(strstr(log, "handed out again while still counted") != NULL, "and logged: %s", log);
    rc = cuMemFree_v2(y);
    dev0 = container_used();
    check(rc == CUDA_SUCCESS && dev0 == 0, "its free gives back the new allocation only (%llu "
          "MiB)", (unsigned long long)(dev0 / MiB));

    /* A free refused while another thread is given the same address: the entry put back is
     * the stale one (its context took it), the new allocation's stays. */
    made = cuCtxCreate_v2(&created, 0, 0) == CUDA_SUCCESS &&
           cuMemAlloc_v2(&x, 400 * MiB) == CUDA_SUCCESS;
    strcpy(fake_cuda_fail_next, "cuPointerGetAttribute");
    rc = cuCtxDestroy_v2(created);
    use_device(0);
    inside_next("cuMemFree_v2", 300 * MiB);
    strcpy(fake_cuda_fail_next, "cuMemFree_v2");
    capture_begin();
    CUresult freed = cuMemFree_v2(x);
    log = capture_end();
    dev0 = container_used();
    check(made && rc == CUDA_SUCCESS && freed != CUDA_SUCCESS && meanwhile == x &&
              dev0 == 300 * MiB, "a refused free of a stale pointer whose address went to "
          "another allocation meanwhile: the other's 300 MiB counted (%llu MiB)",
          (unsigned long long)(dev0 / MiB));
    check(strstr(log, "its free failed and the driver has handed the address out again") != NULL,
          "and logged: %s", log);
    rc = cuMemFree_v2(meanwhile);
    dev0 = container_used();
    check(rc == CUDA_SUCCESS && dev0 == 0, "that one's free gives back its own (%llu MiB)",
          (unsigned long long)(dev0 / MiB));

    /* An allocation given the address after the driver said it was gone, before the entry is
     * taken out: the new allocation's entry stays. */
    made = cuCtxCreate_v2(&created, 0, 0) == CUDA_SUCCESS &&
           cuMemAlloc_v2(&x, 400 * MiB) == CUDA_SUCCESS;
    inside_next("cuPointerGetAttribute", 350 * MiB);
    rc = cuCtxDestroy_v2(created);
    use_device(0);
    dev0 = container_used();
    check(made && rc == CUDA_SUCCESS && meanwhile == x && dev0 == 350 * MiB, "an allocation "
          "given the address while the driver was asked about it stays counted (%llu MiB)",
          (unsigned long long)(dev0 / MiB));
    rc = cuMemFree_v2(meanwhile);
    dev0 = container_used();
    check(rc == CUDA_SUCCESS && dev0 == 0, "and its free gives it back (%llu MiB)",
          (unsigned long long)(dev0 / MiB));
    (void)m;
}

/* Host memory runs out while an allocation is recorded (faults.so fails libvgpu's mallocs):
 * the device memory is counted all the same, and what cannot be looked up at its free stays
 * counted (more than the container holds, never less) until the process is gone. */
static void host_memory(void)
{
    faults_set_fn faults_set = faults_control();
    if (faults_set == NULL)
        return;
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        CUdeviceptr p = 0, q = 0;
        check(faults_set("host-memory", 1) == 0, "libvgpu's mallocs fail from now on");
        capture_begin();
        CUresult rc = cuMemAlloc_v2(&p, 300 * MiB);
        const char *log = capture_end();
        check(rc == CUDA_SUCCESS && container_used() == 300 * MiB,
              "300 MiB allocated and counted (%llu MiB) though it could not be recorded",
              (unsigned long long)(container_used() / MiB));
        check(strstr(log, "out of host memory while recording an allocation; its 314572800 "
                      "bytes stay counted until the process exits") != NULL, "logged: %s", log);
        rc = cuMemFree_v2(p);
        check(rc == CUDA_SUCCESS && container_used() == 300 * MiB && fake_cuda_device_used(0) == 0,
              "its free reaches the driver, and the 300 MiB stay counted (%llu MiB)",
              (unsigned long long)(container_used() / MiB));
        faults_set("host-memory", 0);
        check(cuMemAlloc_v2(&q, 800 * MiB) == CUDA_ERROR_OUT_OF_MEMORY &&
                  cuMemAlloc_v2(&q, 700 * MiB) == CUDA_SUCCESS,
              "with host memory back, the 1 GiB cap still counts them: 800 MiB refused, 700 fit");
        check_done("test_alloc host-memory (child)");
        fflush(stdout);
        _exit(check_failed == 0 ? 0 : 1);
    }
    int status = 0;
    waitpid(child, &status, 0);
    check(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the process's checks passed (above)");
    CUdeviceptr p = 0;
    check(cuMemAlloc_v2(&p, 1000 * MiB) == CUDA_SUCCESS && cuMemFree_v2(p) == CUDA_SUCCESS,
          "once it is gone, another process gets 1000 MiB of the 1 GiB cap: nothing was lost");
}

int main(int argc, char **argv)
{
    if (argc > 2 && strcmp(argv[1], "refused") == 0) {
        refused(argv[2]);
        return check_done("test_alloc refused");
    }
    check(cuInit(0) == CUDA_SUCCESS, "cuInit");
    cuDevicePrimaryCtxRetain(&ctx[0], 0);
    cuDevicePrimaryCtxRetain(&ctx[1], 1);
    use_device(0);
    /* The cases run alone (run.sh names them), each after the contexts above. */
    static const struct {
        const char *name;
        void (*run)(void);
    } alone[] = {
        {"wide-pitch", wide_pitch},     {"teardown", teardown},
        {"arrays-teardown", arrays_teardown}, {"arrays-race", arrays_race},
        {"arrays-green", arrays_green}, {"exported", vmm_exported},
        {"bound", vmm_bound},           {"map-race", vmm_map_race},
        {"handler-inside", vmm_handler_inside},
        {"host-memory", host_memory},   {"uncapped", uncapped},
    };
    for (size_t i = 0; argc > 1 && i < sizeof alone / sizeof alone[0]; i++)
        if (strcmp(argv[1], alone[i].name) == 0) {
            alone[i].run();
            char label[64];
            snprintf(label, sizeof label, "test_alloc %s", alone[i].name);
            return check_done(label);
        }
    basic_cap();
    refusal_log_rate();
    device_totals();
    families();
    streams();
    vmm();
    vmm_mapped();
    errors();
    nvml(1024 * MiB, 512 * MiB);
    legacy_v1();
    return check_done("test_alloc");
}
