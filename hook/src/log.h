/* log.h - one-line diagnostics on stderr, filtered by LIBCUDA_LOG_LEVEL (HAMi-core's levels). */
#ifndef VGPU_LOG_H
#define VGPU_LOG_H

enum vgpu_log_level {
    VGPU_LOG_ERROR = 1, /* LIBCUDA_LOG_LEVEL 0 or 1 */
    VGPU_LOG_WARN = 2,  /* the default */
    VGPU_LOG_INFO = 3,
    VGPU_LOG_DEBUG = 4,
};

/* Writes "[vgpu <LEVEL> pid N] message\n" with a single write(2) when level is enabled. */
void vgpu_log(enum vgpu_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
