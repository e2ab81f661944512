/* cuda_launch.c - every kernel launch variant passes the SM limiter's gate (throttle.c), and a
 * kernel whose threads need a larger stack has it reserved first (cuda_limits.c). */
#define _GNU_SOURCE
#include "cuda_driver.h"
#include "graphs.h"
#include "region.h"
#include "throttle.h"

/* Every 1024th launch of a thread (and its first) stamps the slot's last_launch_unix_ns for
 * the node monitor: a clock read per launch would cost more than the rest of the wrapper. */
static __thread __attribute__((tls_model("initial-exec"))) unsigned launches_here;

/* A launch on stream (named through a _ptsz export: per_thread) under an SM limit passes the
 * gate; its tokens are taken once the driver took it (vgpu_answered). Out of line: an
 * unlimited launch, which every wrapper here inlines its gate for, carries none of this. */
static __attribute__((noinline)) void charge(uint64_t blocks, CUstream stream, int per_thread)
{
    vgpu_throttle_launch(launch_device_on(stream), blocks ? blocks : 1,
                         vgpu_stream_key(stream, per_thread));
}

/* The SM limiter's gate; with no limit this is one predictable branch. */
static inline void gate(uint64_t blocks, CUstream stream, int per_thread)
{
    if (__builtin_expect((launches_here++ & 1023) == 0, 0))
        vgpu_region_note_launch();
    if (__builtin_expect(vgpu_throttle_enabled, 0))
        charge(blocks, stream, per_thread);
}

/* After the driver launched (rc its answer) a kernel whose stack check gave `stack`: its
 * tokens are taken unless it was refused (vgpu_answered). */
static CUresult launched(int stack, CUresult rc)
{
    vgpu_stack_after_launch(stack, rc);
    return vgpu_answered(rc);
}

VGPU_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                    unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                                    CUstream stream, void **params, void **extra)
{
    if (!ready() || real.cuLaunchKernel == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate(grid(gx, gy, gz), stream, 0);
    int stack = vgpu_stack_before_launch(f, stream);
    return stack < 0 ? vgpu_answered(CUDA_ERROR_OUT_OF_MEMORY)
                     : launched(stack, real.cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, stream,
                                                           params, extra));
}

VGPU_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                         unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                                         CUstream stream, void **params, void **extra)
{
    if (!ready() || real.cuLaunchKernel_ptsz == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate(grid(gx, gy, gz), stream, 1);
    int stack = vgpu_stack_before_launch(f, stream);
    return stack < 0 ? vgpu_answered(CUDA_ERROR_OUT_OF_MEMORY)
                     : launched(stack, real.cuLaunchKernel_ptsz(f, gx, gy, gz, bx, by, bz, shmem,
                                                                stream, params, extra));
}

VGPU_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params,
                                      void **extra)
{
    if (!ready() || real.cuLaunchKernelEx == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    /* Gated with no config too: every gate has its answer (vgpu_answered). */
    gate(config != NULL ? grid(config->gridDimX, config->gridDimY, config->gridDimZ) : 1,
         config != NULL ? config->hStream : NULL, 0);
    int stack = vgpu_stack_before_launch(f, config != NULL ? config->hStream : NULL);
    return stack < 0 ? vgpu_answered(CUDA_ERROR_OUT_OF_MEMORY)
                     : launched(stack, real.cuLaunchKernelEx(config, f, params, extra));
}

VGPU_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
                                           void **params, void **extra)
{
    if (!ready() || real.cuLaunchKernelEx_ptsz == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate(config != NULL ? grid(config->gridDimX, config->gridDimY, config->gridDimZ) : 1,
         config != NULL ? config->hStream : NULL, 1);
    int stack = vgpu_stack_before_launch(f, config != NULL ? config->hStream : NULL);
    return stack < 0 ? vgpu_answered(CUDA_ERROR_OUT_OF_MEMORY)
                     : launched(stack, real.cuLaunchKernelEx_ptsz(config, f, params, extra));
}

VGPU_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy,
                                               unsigned gz, unsigned bx, unsigned by,
                                               unsigned bz, unsigned shmem, CUstream stream,
                                               void **params)
{
    if (!ready() || real.cuLaunchCooperativeKernel == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate(grid(gx, gy, gz), stream, 0);
    int stack = vgpu_stack_before_launch(f, stream);
    return stack < 0 ? vgpu_answered(CUDA_ERROR_OUT_OF_MEMORY)
                     : launched(stack, real.cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz,
                                                                      shmem, stream, params));
}

VGPU_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy,
                                                    unsigned gz, unsigned bx, unsigned by,
                                                    unsigned bz, unsigned shmem, CUstream stream,
                                                    void **params)
{
    if (!ready() || real.cuLaunchCooperativeKernel_ptsz == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate(grid(gx, gy, gz), stream, 1);
    int stack = vgpu_stack_before_launch(f, stream);
    return stack < 0 ? vgpu_answered(CUDA_ERROR_OUT_OF_MEMORY)
                     : launched(stack, real.cuLaunchCooperativeKernel_ptsz(f, gx, gy, gz, bx, by,
                                                                           bz, shmem, stream,
                                                                           params));
}

/* CUDA 2.0's launches, deprecated and still exported (cuda.h): the grid is the arguments' (one
 * block for cuLaunch), the block shape and parameters were set beforehand. */
static uint64_t legacy_grid(int width, int height)
{
    return width > 0 && height > 0 ? (uint64_t)width * (uint64_t)height : 1;
}

VGPU_EXPORT CUresult cuLaunch(CUfunction f)
{
    if (!ready() || real.cuLaunch == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate(1, NULL, 0);
    int stack = vgpu_stack_before_launch(f, NULL);
    return stack < 0 ? vgpu_answered(CUDA_ERROR_OUT_OF_MEMORY) : launched(stack, real.cuLaunch(f));
}

VGPU_EXPORT CUresult cuLaunchGrid(CUfunction f, int width, int height)
{
    if (!ready() || real.cuLaunchGrid == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate(legacy_grid(width, height), NULL, 0);
    int stack = vgpu_stack_before_launch(f, NULL);
    return stack < 0 ? vgpu_answered(CUDA_ERROR_OUT_OF_MEMORY)
                     : launched(stack, real.cuLaunchGrid(f, width, height));
}

VGPU_EXPORT CUresult cuLaunchGridAsync(CUfunction f, int width, int height, CUstream stream)
{
    if (!ready() || real.cuLaunchGridAsync == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate(legacy_grid(width, height), stream, 0);
    int stack = vgpu_stack_before_launch(f, stream);
    return stack < 0 ? vgpu_answered(CUDA_ERROR_OUT_OF_MEMORY)
                     : launched(stack, real.cuLaunchGridAsync(f, width, height, stream));
}

/* CUDA 9's launch of one kernel per device, deprecated (cuda.h): each kernel is charged to its
 * stream's device (one the driver cannot name: the current context's), and its stack is
 * reserved there. One that does not fit refuses the launch, as the driver refusing it would
 * (vgpu_stack_after_launch). */
VGPU_EXPORT CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *list,
                                                          unsigned int count, unsigned int flags)
{
    if (!ready() || real.cuLaunchCooperativeKernelMultiDevice == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    int stacks = 0;
    vgpu_region_note_launch();
    /* What each device's kernels take, once the driver took the launch. */
    uint64_t taken[VGPU_REGION_MAX_DEVICES] = {0};
    CUresult rc = CUDA_SUCCESS;
    vgpu_stack_several(1);
    for (unsigned int i = 0; list != NULL && i < count && rc == CUDA_SUCCESS; i++) {
        if (vgpu_throttle_enabled) {
            uint64_t blocks = grid(list[i].gridDimX, list[i].gridDimY, list[i].gridDimZ);
            int dev = launch_device_on(list[i].hStream);
            vgpu_throttle_wait(dev, vgpu_stream_key(list[i].hStream, 0));
            uint64_t add = blocks ? blocks : 1;
            if (dev >= 0 && dev < VGPU_REGION_MAX_DEVICES)
                taken[dev] = taken[dev] > UINT64_MAX - add ? UINT64_MAX : taken[dev] + add;
        }
        int stack = vgpu_stack_before_launch(list[i].function, list[i].hStream);
        if (stack < 0)
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        else
            stacks |= stack;
    }
    vgpu_stack_several(0);
    if (rc == CUDA_SUCCESS)
        rc = real.cuLaunchCooperativeKernelMultiDevice(list, count, flags);
    vgpu_stack_after_launch(stacks, rc);
    for (int dev = 0; rc == CUDA_SUCCESS && dev < VGPU_REGION_MAX_DEVICES; dev++)
        vgpu_throttle_take(dev, taken[dev]);
    return rc;
}

/* A graph costs the blocks of all its kernels (learnt when it was instantiated, cuda_graph.c),
 * and its allocation nodes take memory when it runs (cuda_graph_memory.c). */
VGPU_EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream)
{
    if (!ready() || real.cuGraphLaunch == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate(vgpu_throttle_enabled ? vgpu_graph_cost(exec) : 1, stream, 0);
    return vgpu_answered(vgpu_graph_launch(real.cuGraphLaunch, exec, stream, "cuGraphLaunch"));
}

VGPU_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream)
{
    if (!ready() || real.cuGraphLaunch_ptsz == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    gate(vgpu_throttle_enabled ? vgpu_graph_cost(exec) : 1, stream, 1);
    return vgpu_answered(
        vgpu_graph_launch(real.cuGraphLaunch_ptsz, exec, stream, "cuGraphLaunch"));
}
