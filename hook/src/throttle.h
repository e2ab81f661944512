/* throttle.h - the SM limiter: a per-device token bucket on kernel launches whose refill rate a
 * watcher thread steers from measured utilisation. */
#ifndef VGPU_THROTTLE_H
#define VGPU_THROTTLE_H

#include <stdint.h>

/* Non-zero once some device has an SM limit (read by every launch wrapper). */
extern int vgpu_throttle_enabled;

/* Reads the limits from the region; call once, when the driver is loaded. */
void vgpu_throttle_init(void);

/* Waits until device dev may start work costing cost tokens (grid blocks) on the stream whose
 * key (vgpu_stream_key, cuda_driver.h) is `stream`, then takes them. */
void vgpu_throttle_launch(int dev, uint64_t cost, uintptr_t stream);

/* What vgpu_throttle_synced is told a synchronisation of the current context waited for. */
enum { VGPU_ALL_STREAMS = 0 };

/* After a synchronisation on device dev returned success, of the current context
 * (VGPU_ALL_STREAMS) or of the stream whose key is `stream` (its work is done): where the
 * calling thread is the only one that launched there, every launch there since the context's
 * last such drain went to that stream (a stream's), and the process made no context on dev but
 * its primary one (vgpu_throttle_context_made), none of its work runs there any more, so its
 * time is not prepaid until its next launch. */
void vgpu_throttle_synced(int dev, uintptr_t stream);

/* Whether vgpu_throttle_synced(dev, stream) on this thread now would drain: asked before a
 * synchronisation whose reach costs driver calls to learn (a copy's addresses). */
int vgpu_throttle_may_drain(int dev, uintptr_t stream);

/* The stream whose key is `stream` is being destroyed: its work runs on (cuda.h,
 * cuStreamDestroy), and a new stream may get its handle, whose synchronisation would not wait
 * for it. */
void vgpu_throttle_stream_gone(int dev, uintptr_t stream);

/* The process made a context on dev that is not its primary one (cuCtxCreate, a green
 * context), or left one current that the library did not see made (cuda_context.c): a
 * synchronisation of one context no longer covers its work there. */
void vgpu_throttle_context_made(int dev);

#endif
