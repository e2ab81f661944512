/* nvml.h - NVML wrappers (memory reporting) and the utilisation probe the SM limiter uses. */
#ifndef VGPU_NVML_INTERNAL_H
#define VGPU_NVML_INTERNAL_H

#include <stdint.h>

/* Utilisation (percent) of CUDA device dev by the given pids since the previous call, from
 * NVML's per-process samples; the whole device's rate when those are unavailable; -1 if NVML
 * cannot tell. */
double vgpu_nvml_container_util(int dev, const int32_t *pids, int npids);

#endif
