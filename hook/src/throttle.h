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

#endif
