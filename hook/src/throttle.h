/* throttle.h - the SM limiter: a per-device token bucket on kernel launches whose refill rate a
 * watcher thread steers from measured utilisation. */
#ifndef VGPU_THROTTLE_H
#define VGPU_THROTTLE_H

#include <stdint.h>

/* Non-zero once some device has an SM limit (read by every launch wrapper). */
extern int vgpu_throttle_enabled;

/* Reads the limits from the region; call once, when the driver is loaded. */
void vgpu_throttle_init(void);

/* Waits until device dev may start work costing cost tokens (grid blocks), then takes them. */
void vgpu_throttle_launch(int dev, uint64_t cost);

/* After a synchronisation of the current context on device dev returned success: where the
 * calling thread is the only one that launched there, and the process made no context on dev
 * but its primary one (vgpu_throttle_context_made), none of its work runs there any more, so
 * its time is not prepaid until its next launch. */
void vgpu_throttle_synced(int dev);

/* The process made a context on dev that is not its primary one (cuCtxCreate, a green
 * context): a synchronisation of one context no longer covers its work there. */
void vgpu_throttle_context_made(int dev);

#endif
