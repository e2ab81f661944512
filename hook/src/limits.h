/* limits.h - the HAMi-core environment contract, parsed strictly. */
#ifndef VGPU_LIMITS_H
#define VGPU_LIMITS_H

#include <stdint.h>

#include "vgpu_region.h"

struct vgpu_limits {
    uint64_t memory_bytes[VGPU_REGION_MAX_DEVICES]; /* 0 = no cap */
    uint32_t sm_percent[VGPU_REGION_MAX_DEVICES];   /* 0 = no cap (100 also means none) */
};

/* "3000m", "4g", "4Gi", "4GiB", "4GB", "1.5g", "1048576": binary units (k/m/g = 1024^n), decimal
 * digits only (a leading 0 is not octal). Returns 0 and sets *bytes, or -1 and sets *why. */
int vgpu_parse_memory(const char *text, uint64_t *bytes, const char **why);

/* An integer percentage 0..100. Returns 0 and sets *percent, or -1 and sets *why. */
int vgpu_parse_percent(const char *text, uint32_t *percent, const char **why);

/* Reads CUDA_DEVICE_MEMORY_LIMIT[_<i>], CUDA_DEVICE_SM_LIMIT[_<i>] and
 * GPU_CORE_UTILIZATION_POLICY through getenv_fn. A value that does not parse is logged (naming
 * the variable and the accepted forms) and left out; a per-device value overrides the global.
 * An empty value is unset, as HAMi-core reads the environment, unless from_file (a settings
 * file, in which the plugin writes none: unset there would be no limit; nor does it write a
 * memory limit of 0, no cap, which is rejected there too). Returns how many values were
 * rejected: the caller refuses CUDA then, since a value left out is a limit left off. */
int vgpu_limits_read(struct vgpu_limits *out, const char *(*getenv_fn)(const char *name),
                     int from_file);

#endif
