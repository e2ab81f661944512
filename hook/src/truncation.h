/* truncation.h - surviving a region file truncated under the process. */
#ifndef VGPU_TRUNCATION_H
#define VGPU_TRUNCATION_H

#include <stddef.h>

/* From now on a SIGBUS on [start, start + len) (the mapped file was truncated) no longer kills
 * the process: the range becomes private zeros and vgpu_truncation_seen() turns 1. Other SIGBUS
 * go to the handler that was installed before. Returns 0, or -1 if sigaction failed. */
int vgpu_truncation_guard(void *start, size_t len);

/* 1 once the guarded range has faulted. */
int vgpu_truncation_seen(void);

#endif
