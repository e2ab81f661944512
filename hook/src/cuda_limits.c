/* cuda_limits.c - context limits that make the driver reserve device memory (cuda.h, on
 * cuCtxSetLimit): a thread's stack is reserved for every thread the device can hold at once
 * (on an H100, 132 SMs x 2048 threads: 16 KiB stacks take 4.1 GiB), the malloc heap and the
 * printf FIFO for their size. What a raise may add is reserved under the cap before the driver
 * is asked (refused with CUDA_ERROR_OUT_OF_MEMORY, as the driver refuses what the device cannot
 * hold), and stays counted as the process's footprint until a measurement settles it. The
 * driver also raises the stack itself, at the launch of a kernel whose threads need more local
 * memory than it holds, and keeps it raised (cuda.h, CU_LIMIT_STACK_SIZE): that raise is
 * reserved before such a launch the same way, on the device the kernel runs on (its stream's:
 * a CUkernel runs in its stream's context whatever is current, cuda.h cuLaunchKernel). */
#define _GNU_SOURCE
#include <pthread.h>

#include "cuda_driver.h"
#include "footprint.h"
#include "log.h"
#include "memory.h"
#include "region.h"

enum { DEFAULT_STACK = 1024, FUNCTIONS = 4096 }; /* FUNCTIONS: a power of two */

/* The per-thread stack counted on each device (0: not asked yet, the driver's default), under
 * stack_lock; reads outside it are atomic. floor: no capped device's is below it, so a kernel
 * needing no more launches with no question asked (not even which device it runs on). */
static uint64_t stack_of[VGPU_REGION_MAX_DEVICES];
static uint64_t floor_stack = DEFAULT_STACK;
static pthread_mutex_t stack_lock = PTHREAD_MUTEX_INITIALIZER;
/* The stack each device was counted at before this thread's launch under way first raised it
 * (raising: those devices, a bit each): what it is again if the launch is refused
 * (forget_raises). */
static __thread uint64_t raised_from[VGPU_REGION_MAX_DEVICES];
static __thread int raising;

/* Kernels' local memory per thread, direct-mapped by handle: written under stack_lock, read
 * without it (the handle read before and after the size must be the one asked about). */
static struct known_function {
    CUfunction f;
    uint64_t local;
} functions[FUNCTIONS];

/* How many threads dev holds at once (0: the driver cannot say). */
static uint64_t resident_threads(int dev)
{
    int sms = 0, per_sm = 0;
    if (real.cuDeviceGetAttribute == NULL ||
        real.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) !=
            CUDA_SUCCESS ||
        real.cuDeviceGetAttribute(&per_sm, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR,
                                  dev) != CUDA_SUCCESS || sms <= 0 || per_sm <= 0)
        return 0;
    return (uint64_t)sms * (uint64_t)per_sm;
}

/* a x b, at most UINT64_MAX. */
static uint64_t times(uint64_t a, uint64_t b)
{
    return b != 0 && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

/* The device memory a stack of `per_thread` bytes more takes on dev: every resident thread's
 * (2^20 threads, a device of this size's most, when the driver cannot say how many). */
static uint64_t stack_bytes(int dev, uint64_t per_thread)
{
    uint64_t threads = resident_threads(dev);
    return times(per_thread, threads != 0 ? threads : UINT64_C(1) << 20);
}

/* What setting limit to value on dev may add to what the driver reserves there: the raise,
 * per resident thread for the stack; all of value when the current one cannot be asked (and
 * every thread a device of this size could hold, 2^20, when the driver cannot say how many).
 * 0 for limits that reserve nothing, or little (the device runtime's). */
static uint64_t may_add(CUlimit limit, size_t value, int dev)
{
    size_t now = 0;
    if (limit != CU_LIMIT_STACK_SIZE && limit != CU_LIMIT_MALLOC_HEAP_SIZE &&
        limit != CU_LIMIT_PRINTF_FIFO_SIZE)
        return 0;
    if (real.cuCtxGetLimit == NULL || real.cuCtxGetLimit(&now, limit) != CUDA_SUCCESS)
        now = 0;
    uint64_t raise = value > now ? value - now : 0;
    return limit != CU_LIMIT_STACK_SIZE ? raise : stack_bytes(dev, raise);
}

/* Reserves `more` on dev for a raise the driver makes in api's call; -1: it does not fit
 * (logged). The operation stays open (vgpu_mem_op_end) until the raise is counted after the
 * driver made it: until then, a measurement would not see it in NVML and settle it away. */
static int reserve_raise(int dev, uint64_t more, const char *api)
{
    vgpu_footprint_refresh(dev); /* what an allocation would see */
    if (vgpu_mem_reserve(dev, more, api) != 0)
        return -1;
    vgpu_mem_op_begin();
    return 0;
}

/* The floor, after a device's stack changed: over the process's devices (an ordinal past them
 * would keep it at the default for good), all of them while their count is not known. Caller
 * holds stack_lock. */
static void refloor(void)
{
    uint64_t lowest = UINT64_MAX;
    int devices = __atomic_load_n(&vgpu_device_count, __ATOMIC_RELAXED);
    devices = devices > 0 && devices < VGPU_REGION_MAX_DEVICES ? devices : VGPU_REGION_MAX_DEVICES;
    for (int d = 0; d < devices; d++) {
        uint64_t stack = stack_of[d] != 0 ? stack_of[d] : DEFAULT_STACK;
        if (vgpu_region_limit(d) != 0 && stack < lowest)
            lowest = stack;
    }
    __atomic_store_n(&floor_stack, lowest, __ATOMIC_RELEASE);
}

/* The stack on dev is counted at value (0: asked anew) from now on. Caller holds stack_lock. */
static void count_stack(int dev, uint64_t value)
{
    __atomic_store_n(&stack_of[dev], value, __ATOMIC_RELEASE);
    refloor();
}

/* After the stack on dev was set to value (0 counted as 1: 0 means "not asked yet", the
 * driver's default, which is more). */
static void stack_now(int dev, uint64_t value)
{
    pthread_mutex_lock(&stack_lock);
    count_stack(dev, value != 0 ? value : 1);
    pthread_mutex_unlock(&stack_lock);
}

VGPU_EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value)
{
    if (!ready() || real.cuCtxSetLimit == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    int dev = current_device();
    uint64_t more = dev >= 0 && vgpu_region_limit(dev) != 0 ? may_add(limit, value, dev) : 0;
    if (more != 0 && reserve_raise(dev, more, "cuCtxSetLimit") != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real.cuCtxSetLimit(limit, value);
    if (more != 0) {
        vgpu_footprint_grew(dev, more, rc == CUDA_SUCCESS ? more : 0);
        vgpu_mem_op_end();
    }
    if (rc == CUDA_SUCCESS && limit == CU_LIMIT_STACK_SIZE && dev >= 0)
        stack_now(dev, value);
    return rc;
}

/* ---- the stack a kernel needs, which the driver raises at its launch ---------------------- */

static size_t slot(CUfunction f)
{
    return (size_t)(((uintptr_t)f >> 4) * UINT64_C(0x9e3779b97f4a7c15) >> 32) & (FUNCTIONS - 1);
}

/* What the driver says f's threads need, asked as a CUfunction and else as a CUkernel (cast to
 * CUfunction, as cuLaunchKernel allows; cuda.h documents cuFuncGetAttribute for CUfunction
 * alone) on the current device, or device 0 when no context is current (a CUkernel launched on
 * a stream needs none); 0 when neither answers. */
static int ask_local_bytes(CUfunction f)
{
    int bytes = 0;
    if (real.cuFuncGetAttribute != NULL &&
        real.cuFuncGetAttribute(&bytes, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, f) == CUDA_SUCCESS)
        return bytes > 0 ? bytes : 0;
    int dev = current_device();
    dev = dev >= 0 ? dev : 0;
    bytes = 0;
    if (real.cuKernelGetAttribute != NULL &&
        real.cuKernelGetAttribute(&bytes, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, (CUkernel)(void *)f,
                                  (CUdevice)dev) == CUDA_SUCCESS)
        return bytes > 0 ? bytes : 0;
    return 0;
}

/* A kernel not in the table (k its entry): asked, and kept. Out of line, as is the raise
 * below: what every launch runs then needs no stack frame of its own (hook/README.md,
 * "Overhead"). */
static __attribute__((noinline)) uint64_t learn_local_bytes(CUfunction f,
                                                            struct known_function *k)
{
    int bytes = ask_local_bytes(f);
    pthread_mutex_lock(&stack_lock);
    __atomic_store_n(&k->f, NULL, __ATOMIC_RELEASE);
    __atomic_store_n(&k->local, (uint64_t)bytes, __ATOMIC_RELEASE);
    __atomic_store_n(&k->f, f, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&stack_lock);
    return (uint64_t)bytes;
}

/* f's local memory per thread (0, kept as such, when the driver cannot say: it is asked once
 * a kernel, not at every launch). A table by handle (above). */
uint64_t vgpu_kernel_local_bytes(CUfunction f)
{
    if (f == NULL)
        return 0;
    struct known_function *k = &functions[slot(f)];
    CUfunction before = __atomic_load_n(&k->f, __ATOMIC_ACQUIRE);
    uint64_t known = __atomic_load_n(&k->local, __ATOMIC_ACQUIRE);
    if (before == f && __atomic_load_n(&k->f, __ATOMIC_ACQUIRE) == f)
        return known;
    return learn_local_bytes(f, k);
}

/* A kernel needing more than the smallest stack of any device, launched on stream: the raise on
 * the device it runs on (the stream's; a default stream's is the current context's, none when
 * no context is current: the driver then refuses the launch). A stack not counted there yet is
 * the current context's when that is on dev, else the driver's default (a raise through
 * cuCtxSetLimit was counted when it was made). Returns 1 << dev when a raise was counted, 0
 * when none is needed, -1 when it does not fit. */
static __attribute__((noinline)) int raise_before(uint64_t local, CUstream stream)
{
    int dev = vgpu_stream_device(stream);
    dev = dev != VGPU_DEVICE_UNKNOWN ? dev : current_device();
    if (dev < 0 || vgpu_region_limit(dev) == 0 ||
        local <= __atomic_load_n(&stack_of[dev], __ATOMIC_ACQUIRE))
        return 0;
    pthread_mutex_lock(&stack_lock);
    size_t now;
    uint64_t counted = stack_of[dev];
    if (counted == 0 && current_device() == dev && real.cuCtxGetLimit != NULL &&
        real.cuCtxGetLimit(&now, CU_LIMIT_STACK_SIZE) == CUDA_SUCCESS)
        counted = now;
    counted = counted != 0 ? counted : DEFAULT_STACK;
    int rc = 0;
    if (local > counted) {
        uint64_t more = stack_bytes(dev, local - counted);
        rc = reserve_raise(dev, more, "a kernel launch (its stack)") == 0 ? 1 << dev : -1;
        if (rc > 0) { /* counted now: the operation stays open until the launch is made */
            vgpu_footprint_grew(dev, more, more);
            if (raising & rc) /* raised again in this launch (two kernels on one device, which
                               * the driver refuses): one operation a device, the first's */
                vgpu_mem_op_end();
            else
                raised_from[dev] = counted;
            raising |= rc;
        }
    }
    if (rc >= 0)
        count_stack(dev, local > counted ? local : counted);
    pthread_mutex_unlock(&stack_lock);
    return rc;
}

int vgpu_stack_before_needs(uint64_t local, CUstream stream)
{
    if (local <= __atomic_load_n(&floor_stack, __ATOMIC_ACQUIRE))
        return 0;
    return raise_before(local, stream);
}

int vgpu_stack_before_launch(CUfunction f, CUstream stream)
{
    return vgpu_stack_before_needs(
        f != NULL && vgpu_region_any_limit() ? vgpu_kernel_local_bytes(f) : 0, stream);
}

/* After a launch the driver refused (or the library did, a later kernel's raise not fitting),
 * for which raises were counted on the devices of `raised`: the driver may not have made them.
 * Their stacks are counted as they were before, so that the next launch reserves again:
 * counted twice until a measurement settles it, rather than a raise made later counted never.
 * (Not "asked anew": that is the driver's default, and a stack cut below it would be lost.) */
static __attribute__((noinline)) void forget_raises(int raised)
{
    pthread_mutex_lock(&stack_lock);
    for (int d = 0; d < VGPU_REGION_MAX_DEVICES; d++)
        if (raised & (1 << d))
            count_stack(d, raised_from[d]);
    pthread_mutex_unlock(&stack_lock);
}

void vgpu_stack_after_launch(int raised, CUresult rc)
{
    if (raised <= 0)
        return;
    if (rc != CUDA_SUCCESS)
        forget_raises(raised);
    raising &= ~raised;
    for (int d = 0; d < VGPU_REGION_MAX_DEVICES; d++)
        if (raised & (1 << d))
            vgpu_mem_op_end();
}

/* Every kernel's local memory is asked anew (a handle may name another kernel next). Caller
 * holds stack_lock. */
static void clear_functions(void)
{
    for (size_t i = 0; i < FUNCTIONS; i++)
        __atomic_store_n(&functions[i].f, NULL, __ATOMIC_RELEASE);
}

void vgpu_stack_context_gone(int dev)
{
    pthread_mutex_lock(&stack_lock);
    clear_functions();
    for (int d = 0; d < VGPU_REGION_MAX_DEVICES; d++)
        if (d == dev || dev < 0)
            __atomic_store_n(&stack_of[d], 0, __ATOMIC_RELEASE); /* asked anew */
    refloor();
    pthread_mutex_unlock(&stack_lock);
}

/* After a module or library was unloaded (rc the driver's answer): its kernels' handles may
 * be another kernel's next. */
static CUresult forget_functions(CUresult rc)
{
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&stack_lock);
    clear_functions();
    pthread_mutex_unlock(&stack_lock);
    return rc;
}

VGPU_EXPORT CUresult cuModuleUnload(CUmodule module)
{
    if (!ready() || real.cuModuleUnload == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    return forget_functions(real.cuModuleUnload(module));
}

VGPU_EXPORT CUresult cuLibraryUnload(CUlibrary library)
{
    if (!ready() || real.cuLibraryUnload == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    return forget_functions(real.cuLibraryUnload(library));
}
