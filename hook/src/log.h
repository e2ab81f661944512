/* log.h - one-line diagnostics on stderr, filtered by LIBCUDA_LOG_LEVEL (HAMi-core's levels). */
#ifndef VGPU_LOG_H
#define VGPU_LOG_H

enum vgpu_log_level {
    VGPU_LOG_ERROR = 1, /* LIBCUDA_LOG_LEVEL 0 or 1 */
    VGPU_LOG_WARN = 2,  /* the default */
    VGPU_LOG_INFO = 3,
    VGPU_LOG_DEBUG = 4,
};

/* Writes "[vgpu <LEVEL> pid N] message\n" with a single write(2) when level is enabled, or
 * keeps it for later inside a deferral. */
void vgpu_log(enum vgpu_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Between these two (they nest), this thread's lines are kept, not written: a write(2) to a
 * stderr nobody reads blocks, and must not while a lock other processes wait for is held. The
 * outermost end writes them (past VGPU_LOG_DEFERRED_BYTES, a count of those left out). */
enum { VGPU_LOG_DEFERRED_BYTES = 2048 };
void vgpu_log_defer_begin(void);
void vgpu_log_defer_end(void);

#endif
