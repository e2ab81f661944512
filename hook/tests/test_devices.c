/* test_devices.c - each GPU keeps its own cap whatever CUDA ordinal a process gives it
 * (src/devices.c). Over the fake driver with two GPUs, A (ordinal 0 by default) and B:
 *
 *   swapped     limits from the environment: a process that swaps the GPUs with
 *               CUDA_VISIBLE_DEVICES=1,0 still finds A full and B under B's cap;
 *   listed      the settings file assigns B then A (NVIDIA_VISIBLE_DEVICES): the limits follow
 *               that order, not CUDA's;
 *   hinted      limits from the environment, a first process that sees B alone: B takes its
 *               place in the environment's NVIDIA_VISIBLE_DEVICES (A,B), not ordinal 0's record;
 *   claim-wait  a process meets the GPUs while another is halfway through writing a record:
 *               it waits, and each GPU keeps one record (a second would be a cap of its own);
 *   unassigned  the settings file assigns A only (of 17 GPUs): nothing is made or allocated on
 *               B, not even by a thread that asks while another thread's cuInit is still mapping
 *               the GPUs, nor on ordinal 16;
 *   past-records KIND  17 GPUs (FAKE_CUDA_DEVICES), one more than the region keeps records of:
 *               with a limit set (KIND limited: a memory cap, sm: an SM limit alone), nothing is
 *               made or allocated on ordinal 16, which no ledger would count; with none
 *               (uncapped), the library stays out of the way there.
 *
 * tests/run.sh runs swapped, hinted and claim-wait with CUDA_DEVICE_MEMORY_LIMIT_0=1g and _1=2g,
 * listed and unassigned under a settings file (listed: _0=2g for B, _1=1g for A; unassigned:
 * _0=1g), past-records limited with CUDA_DEVICE_MEMORY_LIMIT=1g, sm with CUDA_DEVICE_SM_LIMIT=30
 * and uncapped with neither. */
#include <cuda.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "fake_state.h"
#include "nvml_view.h"
#include "region_view.h"

static const uint64_t MiB = UINT64_C(1) << 20;
static const char gpu_a[] = "GPU-10111213-1415-1617-1819-1a1b1c1d1e1f"; /* the fake's GPU 0 */
static const char gpu_b[] = "GPU-20212223-2425-2627-2829-2a2b2c2d2e2f"; /* and GPU 1 */
static const char *self_path;

/* Makes ordinal dev's primary context current; its rc. */
static CUresult use_device(int dev)
{
    CUcontext ctx;
    CUresult rc = cuDevicePrimaryCtxRetain(&ctx, dev);
    return rc == CUDA_SUCCESS ? cuCtxSetCurrent(ctx) : rc;
}

/* The cap the current context's device shows (cuMemGetInfo's total), in MiB; 0 on error. */
static uint64_t total_mib(void)
{
    size_t free_b, total_b;
    return cuMemGetInfo_v2(&free_b, &total_b) == CUDA_SUCCESS ? total_b / MiB : 0;
}

/* NVML's total and used for the GPU NVML numbers index (the hook's view), in MiB. */
static int nvml_memory(unsigned int index, uint64_t *total, uint64_t *used)
{
    nvmlMemory_t m;
    if (nvml_memory_of(index, &m) != 0)
        return -1;
    *total = m.total / MiB;
    *used = m.used / MiB;
    return 0;
}

/* Runs this program as `mode` with CUDA_VISIBLE_DEVICES=visible; 1 when it exited 0. */
static int child_passes(const char *mode, const char *visible)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("CUDA_VISIBLE_DEVICES", visible, 1);
        execl(self_path, self_path, mode, (char *)NULL);
        _exit(4);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static int record_names(const struct vgpu_region *r, int record, const char *uuid)
{
    return r != NULL && r->devices[record].uuid_state == VGPU_UUID_SET &&
           strcmp(r->devices[record].uuid, uuid) == 0;
}

/* ---- swapped ------------------------------------------------------------------------------ */

/* CUDA_VISIBLE_DEVICES=1,0: ordinal 0 is B, ordinal 1 is A (which the parent filled). */
static int swapped_child(void)
{
    CUdeviceptr p;
    check(cuInit(0) == CUDA_SUCCESS && use_device(1) == CUDA_SUCCESS, "[1,0] CUDA on ordinal 1");
    uint64_t shown = total_mib();
    check(shown == 1024 && cuMemAlloc_v2(&p, 64 * MiB) == CUDA_ERROR_OUT_OF_MEMORY,
          "[1,0] ordinal 1 is GPU A: its 1 GiB cap (%llu MiB shown), full (the parent holds "
          "it), 64 MiB refused", (unsigned long long)shown);
    CUresult rc = use_device(0);
    shown = total_mib();
    check(rc == CUDA_SUCCESS && shown == 2048 && cuMemAlloc_v2(&p, 1536 * MiB) == CUDA_SUCCESS,
          "[1,0] ordinal 0 is GPU B: its 2 GiB cap (%llu MiB shown), 1.5 GiB allocated",
          (unsigned long long)shown);
    uint64_t total = 0, used = 0;
    int nvml_rc = nvml_memory(0, &total, &used);
    check(nvml_rc == 0 && total == 1024 && used == 1024,
          "[1,0] NVML's GPU 0 (A): 1 GiB cap, 1 GiB used (%llu / %llu MiB)",
          (unsigned long long)used, (unsigned long long)total);
    return check_done("test_devices swapped-child");
}

/* CUDA_VISIBLE_DEVICES=<B's UUID>: the process sees B alone, as ordinal 0. */
static int only_b_child(void)
{
    CUresult rc = cuInit(0) == CUDA_SUCCESS ? use_device(0) : CUDA_ERROR_NOT_INITIALIZED;
    uint64_t shown = total_mib();
    check(rc == CUDA_SUCCESS && shown == 2048, "[B] its only device shows B's 2 GiB cap (%llu MiB)",
          (unsigned long long)shown);
    return check_done("test_devices only-b-child");
}

static int swapped(void)
{
    CUdeviceptr p;
    check(cuInit(0) == CUDA_SUCCESS && use_device(0) == CUDA_SUCCESS &&
          cuMemAlloc_v2(&p, 1024 * MiB) == CUDA_SUCCESS,
          "default order: GPU A (ordinal 0) filled to its 1 GiB cap");
    check(child_passes("swapped-child", "1,0"), "a process that swaps the GPUs keeps both caps");
    check(child_passes("only-b-child", gpu_b), "a process that sees B alone has B's cap");
    const struct vgpu_region *r = region_view();
    check(record_names(r, 0, gpu_a) && record_names(r, 1, gpu_b),
          "the region's records name A then B, as the first process met them");
    check(r != NULL && vgpu_region_device_used(r, 0) == 1024 * MiB && vgpu_region_device_used(r, 1) == 0,
          "A's record holds the parent's 1 GiB, B's nothing once the children are gone");
    return check_done("test_devices swapped");
}

/* ---- listed ------------------------------------------------------------------------------- */

static int listed_child(void)
{
    CUresult rc = cuInit(0) == CUDA_SUCCESS ? use_device(0) : CUDA_ERROR_NOT_INITIALIZED;
    uint64_t shown = total_mib();
    check(rc == CUDA_SUCCESS && shown == 2048,
          "[1,0] ordinal 0 is B: the file's first cap, 2 GiB (%llu MiB)",
          (unsigned long long)shown);
    return check_done("test_devices listed-child");
}

static int listed(void)
{
    CUresult rc = cuInit(0) == CUDA_SUCCESS ? use_device(0) : CUDA_ERROR_NOT_INITIALIZED;
    uint64_t shown = total_mib();
    check(rc == CUDA_SUCCESS && shown == 1024,
          "ordinal 0 is A, the file's second GPU: its 1 GiB cap (%llu MiB)",
          (unsigned long long)shown);
    rc = use_device(1);
    shown = total_mib();
    check(rc == CUDA_SUCCESS && shown == 2048,
          "ordinal 1 is B, the file's first GPU: its 2 GiB cap (%llu MiB)",
          (unsigned long long)shown);
    uint64_t total = 0, used = 0;
    int nvml_rc = nvml_memory(0, &total, &used);
    check(nvml_rc == 0 && total == 1024,
          "NVML's GPU 0 (A) shows A's cap (%llu MiB)", (unsigned long long)total);
    check(child_passes("listed-child", "1,0"), "so does a process that swaps them");
    const struct vgpu_region *r = region_view();
    check(record_names(r, 0, gpu_b) && record_names(r, 1, gpu_a),
          "the region's records name B then A, the file's order");
    return check_done("test_devices listed");
}

/* ---- hinted ------------------------------------------------------------------------------- */

static int hinted_child(void)
{
    CUresult rc = cuInit(0) == CUDA_SUCCESS ? use_device(0) : CUDA_ERROR_NOT_INITIALIZED;
    uint64_t shown = total_mib();
    check(rc == CUDA_SUCCESS && shown == 2048,
          "[B first] B's cap, as its place in NVIDIA_VISIBLE_DEVICES says (%llu MiB)",
          (unsigned long long)shown);
    return check_done("test_devices hinted-child");
}

static int hinted(void)
{
    check(child_passes("hinted-child", gpu_b), "a first process that sees B alone");
    CUresult rc = cuInit(0) == CUDA_SUCCESS ? use_device(0) : CUDA_ERROR_NOT_INITIALIZED;
    uint64_t shown = total_mib();
    check(rc == CUDA_SUCCESS && shown == 1024, "then A, met second, still gets A's cap (%llu MiB)",
          (unsigned long long)shown);
    const struct vgpu_region *r = region_view();
    check(record_names(r, 0, gpu_a) && record_names(r, 1, gpu_b), "records: A then B");
    return check_done("test_devices hinted");
}

/* ---- claim-wait --------------------------------------------------------------------------- */

static int claim_child(void) { return cuInit(0) == CUDA_SUCCESS ? 0 : 1; }

/* Another process stopped halfway through writing record 0 (records lock held, the record
 * WRITING): a process meeting the GPUs waits for it, then finds A there. Without the wait it took
 * another record for A, and the half-written one became A's too: A with two caps. */
static int claim_wait(void)
{
    cuMemGetInfo_v2(NULL, NULL); /* creates the region, as every process does */
    int fd = open(getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE"), O_RDWR | O_CLOEXEC);
    struct vgpu_region *r = fd >= 0 ? mmap(NULL, VGPU_REGION_FILE_SIZE, PROT_READ | PROT_WRITE,
                                           MAP_SHARED, fd, 0) : MAP_FAILED;
    struct flock lock = {.l_type = F_WRLCK, .l_whence = SEEK_SET,
                         .l_start = VGPU_REGION_RECORDS_LOCK_OFFSET, .l_len = 1};
    if (r == MAP_FAILED || fcntl(fd, F_OFD_SETLK, &lock) != 0)
        return check(0, "region mapped and its records lock taken"), check_done("claim-wait");
    __atomic_store_n(&r->devices[0].uuid_state, VGPU_UUID_WRITING, __ATOMIC_RELEASE);
    fflush(stdout);
    pid_t kid = fork();
    if (kid == 0) {
        execl(self_path, self_path, "claim-child", (char *)NULL);
        _exit(4);
    }
    sleep_s(0.3);
    strcpy(r->devices[0].uuid, gpu_a);
    __atomic_store_n(&r->devices[0].uuid_state, VGPU_UUID_SET, __ATOMIC_RELEASE);
    lock.l_type = F_UNLCK;
    fcntl(fd, F_OFD_SETLK, &lock);
    int status = 0;
    while (waitpid(kid, &status, 0) < 0 && errno == EINTR) {
    }
    int records = 0;
    for (int d = 0; d < VGPU_REGION_MAX_DEVICES; d++)
        records += r->devices[d].uuid_state == VGPU_UUID_SET;
    check(WIFEXITED(status) && WEXITSTATUS(status) == 0 && records == 2 &&
          record_names(r, 0, gpu_a) && record_names(r, 1, gpu_b),
          "a process meeting the GPUs while another wrote record 0 waited for it: A's record 0, "
          "B's 1, no other (%d records)", records);
    return check_done("test_devices claim-wait");
}

/* ---- unassigned --------------------------------------------------------------------------- */

static CUresult early_rc = CUDA_SUCCESS;
static int early_done;

/* Another thread, once the driver is up and before cuInit has mapped the GPUs. */
static void *early_thread(void *arg)
{
    (void)arg;
    CUcontext ctx;
    __atomic_store_n(&early_rc, cuDevicePrimaryCtxRetain(&ctx, 1), __ATOMIC_RELEASE);
    __atomic_store_n(&early_done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static pthread_t early;

/* Inside cuInit: gives the thread up to 300 ms to finish before cuInit goes on. */
static void start_early_thread(void)
{
    pthread_create(&early, NULL, early_thread, NULL);
    for (int i = 0; i < 30 && !__atomic_load_n(&early_done, __ATOMIC_ACQUIRE); i++)
        sleep_s(0.01);
}

static int unassigned(void)
{
    CUcontext ctx;
    CUdeviceptr p;
    strcpy(fake_cuda_inside, "cuInit");
    fake_cuda_inside_fn = start_early_thread;
    check(cuInit(0) == CUDA_SUCCESS, "cuInit");
    pthread_join(early, NULL);
    check(early_rc == CUDA_ERROR_NOT_PERMITTED,
          "a thread asking for a context on B while cuInit was still mapping the GPUs waited, "
          "and was refused (rc %d)", early_rc);
    CUgreenCtx green;
    check(cuDevicePrimaryCtxRetain(&ctx, 1) == CUDA_ERROR_NOT_PERMITTED &&
          cuCtxCreate_v2(&ctx, 0, 1) == CUDA_ERROR_NOT_PERMITTED &&
          cuGreenCtxCreate(&green, NULL, 1, CU_GREEN_CTX_DEFAULT_STREAM) ==
              CUDA_ERROR_NOT_PERMITTED,
          "GPU B, which the file does not assign: no context on it, primary, created or green");
    CUresult rc = use_device(0);
    uint64_t shown = total_mib();
    check(rc == CUDA_SUCCESS && shown == 1024 && cuMemAlloc_v2(&p, 512 * MiB) == CUDA_SUCCESS,
          "GPU A, assigned: its 1 GiB cap (%llu MiB), 512 MiB allocated",
          (unsigned long long)shown);
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 1}};
    CUmemGenericAllocationHandle handle;
    check(cuMemCreate(&handle, 2 * MiB, &prop, 0) == CUDA_ERROR_OUT_OF_MEMORY,
          "cuMemCreate on B from A's context: refused");
    prop.location.id = 16;
    check(cuMemCreate(&handle, 2 * MiB, &prop, 0) == CUDA_ERROR_OUT_OF_MEMORY,
          "cuMemCreate on ordinal 16 (of 17 GPUs), past the region's records: refused");
    uint64_t total = 0, used = 0;
    int nvml_rc = nvml_memory(1, &total, &used);
    check(nvml_rc == 0 && total == fake_cuda_device_total(1) / MiB,
          "NVML's GPU 1 (B, not assigned): the driver's figures, not A's cap (%llu MiB)",
          (unsigned long long)total);
    return check_done("test_devices unassigned");
}

static int past_records(const char *kind)
{
    int limited = strcmp(kind, "uncapped") != 0;
    const char *what = limited ? "refused" : "allowed";
    CUresult want = limited ? CUDA_ERROR_NOT_PERMITTED : CUDA_SUCCESS;
    int count = 0;
    CUresult init_rc = cuInit(0) == CUDA_SUCCESS ? cuDeviceGetCount(&count) : CUDA_ERROR_UNKNOWN;
    check(init_rc == CUDA_SUCCESS && count == 17, "the fake shows 17 GPUs (%d)", count);
    CUcontext primary, created;
    CUgreenCtx green;
    CUresult primary_rc = cuDevicePrimaryCtxRetain(&primary, 16);
    CUresult created_rc = cuCtxCreate_v2(&created, 0, 16);
    CUresult green_rc = cuGreenCtxCreate(&green, NULL, 16, CU_GREEN_CTX_DEFAULT_STREAM);
    check(primary_rc == want && created_rc == want && green_rc == want,
          "%s: a context on ordinal 16, past the region's 16 records: primary, created and green "
          "%s (rc %d, %d, %d)", kind, what, primary_rc, created_rc, green_rc);
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 16}};
    CUmemGenericAllocationHandle handle;
    CUresult create_rc = use_device(0) == CUDA_SUCCESS ? cuMemCreate(&handle, 2048 * MiB, &prop, 0)
                                                       : CUDA_ERROR_UNKNOWN;
    check(create_rc == (limited ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS),
          "%s: 2 GiB of cuMemCreate on ordinal 16 from ordinal 0's context %s (rc %d)", kind, what,
          create_rc);
    CUdeviceptr p;
    CUresult last_rc = use_device(15);
    uint64_t shown = total_mib();
    uint64_t want_shown = strcmp(kind, "limited") == 0 ? 1024 : fake_cuda_device_total(15) / MiB;
    check(last_rc == CUDA_SUCCESS && shown == want_shown && cuMemAlloc_v2(&p, 512 * MiB) == 0,
          "%s: ordinal 15, the region's last record, is usable: %llu MiB shown, 512 MiB allocated",
          kind, (unsigned long long)shown);
    if (limited)
        return check_done("test_devices past-records");
    CUresult big_rc = use_device(16) == CUDA_SUCCESS ? cuMemAlloc_v2(&p, 2048 * MiB)
                                                     : CUDA_ERROR_UNKNOWN;
    check(big_rc == CUDA_SUCCESS, "uncapped: 2 GiB allocated on ordinal 16 (rc %d)", big_rc);
    return check_done("test_devices past-records");
}

int main(int argc, char **argv)
{
    self_path = argv[0];
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "swapped") == 0)
        return swapped();
    if (strcmp(mode, "swapped-child") == 0)
        return swapped_child();
    if (strcmp(mode, "only-b-child") == 0)
        return only_b_child();
    if (strcmp(mode, "listed") == 0)
        return listed();
    if (strcmp(mode, "listed-child") == 0)
        return listed_child();
    if (strcmp(mode, "unassigned") == 0)
        return unassigned();
    if (strcmp(mode, "hinted") == 0)
        return hinted();
    if (strcmp(mode, "hinted-child") == 0)
        return hinted_child();
    if (strcmp(mode, "claim-wait") == 0)
        return claim_wait();
    if (strcmp(mode, "claim-child") == 0)
        return claim_child();
    if (strcmp(mode, "past-records") == 0 && argc > 2)
        return past_records(argv[2]);
    fprintf(stderr, "usage: %s swapped|listed|hinted|claim-wait|unassigned|past-records KIND\n",
            argv[0]);
    return 2;
}
