/* cuda_limits.c - context limits that make the driver reserve device memory (cuda.h, on
 * cuCtxSetLimit): a thread's stack is reserved for every thread the device can hold at once
 * (on an H100, 132 SMs x 2048 threads: 16 KiB stacks take 4.1 GiB), the malloc heap and the
 * printf FIFO for their size. What a raise may add is reserved under the cap before the driver
 * is asked (refused with CUDA_ERROR_OUT_OF_MEMORY, as the driver refuses what the device cannot
 * hold), and stays counted as the process's footprint until a measurement settles it. */
#define _GNU_SOURCE
#include "cuda_driver.h"
#include "footprint.h"
#include "memory.h"
#include "region.h"

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
    if (limit != CU_LIMIT_STACK_SIZE)
        return raise;
    uint64_t threads = resident_threads(dev);
    return times(raise, threads != 0 ? threads : UINT64_C(1) << 20);
}

VGPU_EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value)
{
    if (!ready() || real.cuCtxSetLimit == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    int dev = current_device();
    uint64_t more = dev >= 0 && vgpu_region_limit(dev) != 0 ? may_add(limit, value, dev) : 0;
    if (more == 0)
        return real.cuCtxSetLimit(limit, value);
    vgpu_footprint_refresh(dev); /* what an allocation would see */
    if (vgpu_mem_reserve(dev, more, "cuCtxSetLimit") != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    vgpu_mem_op_begin(); /* until counted, NVML may show memory the ledger does not */
    CUresult rc = real.cuCtxSetLimit(limit, value);
    vgpu_footprint_grew(dev, more, rc == CUDA_SUCCESS ? more : 0);
    vgpu_mem_op_end();
    return rc;
}
