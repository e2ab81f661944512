/* vgpu-demo-alloc - allocates device memory in fixed steps until the driver (or libvgpu's cap)
 * refuses, printing one line per step and what cuMemGetInfo reports. Used by `vgpuctl demo`:
 *   LD_PRELOAD=build/libvgpu.so LD_LIBRARY_PATH=build/fake CUDA_DEVICE_MEMORY_LIMIT_0=3000m \
 *   CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/demo.cache build/vgpu-demo-alloc
 * Options: --step-mib N (default 500), --max-steps N (default 64). Exit status 0 when a step
 * was refused with CUDA_ERROR_OUT_OF_MEMORY, 1 otherwise. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *result_name(CUresult rc)
{
    switch (rc) {
    case CUDA_SUCCESS: return "CUDA_SUCCESS";
    case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case CUDA_ERROR_NOT_PERMITTED: return "CUDA_ERROR_NOT_PERMITTED";
    default: return "CUDA_ERROR_OTHER";
    }
}

static void report_info(char *out, size_t size)
{
    size_t free_b = 0, total_b = 0;
    CUresult rc = cuMemGetInfo_v2(&free_b, &total_b);
    if (rc == CUDA_SUCCESS)
        snprintf(out, size, "cuMemGetInfo free %zu MiB / total %zu MiB", free_b >> 20, total_b >> 20);
    else
        snprintf(out, size, "cuMemGetInfo failed: %s", result_name(rc));
}

int main(int argc, char **argv)
{
    size_t step_mib = 500;
    int max_steps = 64;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--step-mib") == 0)
            step_mib = strtoul(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--max-steps") == 0)
            max_steps = atoi(argv[i + 1]);
    }
    if (step_mib == 0 || max_steps <= 0) {
        fprintf(stderr, "usage: vgpu-demo-alloc [--step-mib N] [--max-steps N]\n");
        return 2;
    }
    CUcontext ctx;
    CUresult rc = cuInit(0);
    if (rc == CUDA_SUCCESS)
        rc = cuDevicePrimaryCtxRetain(&ctx, 0);
    if (rc == CUDA_SUCCESS)
        rc = cuCtxSetCurrent(ctx);
    if (rc != CUDA_SUCCESS) {
        fprintf(stderr, "vgpu-demo-alloc: CUDA start failed: %s\n", result_name(rc));
        return 2;
    }
    char info[128];
    report_info(info, sizeof info);
    printf("start: device 0, %s\n", info);
    size_t held_mib = 0;
    for (int step = 1; step <= max_steps; step++) {
        CUdeviceptr p;
        rc = cuMemAlloc_v2(&p, step_mib << 20);
        if (rc == CUDA_SUCCESS)
            held_mib += step_mib;
        report_info(info, sizeof info);
        printf("step %d: cuMemAlloc %zu MiB -> %s, holding %zu MiB, %s\n", step, step_mib,
               result_name(rc), held_mib, info);
        fflush(stdout);
        if (rc != CUDA_SUCCESS) {
            printf("refused at step %d with %zu MiB held\n", step, held_mib);
            return rc == CUDA_ERROR_OUT_OF_MEMORY ? 0 : 1;
        }
    }
    printf("never refused: %zu MiB held after %d steps\n", held_mib, max_steps);
    return 1;
}
