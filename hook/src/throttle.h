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

/* The driver answered the call the calling thread's last vgpu_throttle_launch gated (through
 * vgpu_answered, cuda_driver.h): where it refused the work (nothing was queued), its tokens
 * are given back. Taken for refused work, they were a debt no GPU time backs, forgiven at a
 * rate of the debt itself: a memset of 2^60 bytes the driver refused lifted a limit of 25 to
 * bursts of 78 % (a review found). */
void vgpu_throttle_answered(int refused);

/* Gives cost tokens of device dev back (work the driver refused). */
void vgpu_throttle_refund(int dev, uint64_t cost);

/* What a memset of `bytes` costs: the driver runs it as a kernel, counted as one of a block per
 * 4 KiB it sets (the rate is calibrated from NVML's readings whatever the unit), at least one. */
static inline uint64_t vgpu_memset_blocks(uint64_t bytes)
{
    return bytes != 0 ? bytes / 4096 + (bytes % 4096 != 0) : 1;
}

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

/* Before a record of an event: what vgpu_throttle_event_recorded, which must follow, is to be
 * given. */
unsigned long vgpu_throttle_event_recording(void);

/* This thread recorded event (a CUevent) on the stream whose key is `stream`, on device dev
 * (-1: where its wait cannot drain: the driver refused the record, it added a node to a stream
 * capture (CU_EVENT_RECORD_EXTERNAL), or it was made on a default stream without the device's
 * primary context current), `since`
 * what vgpu_throttle_event_recording said before. An event captures what its stream was given
 * before (cuda.h, cuEventRecord): where a synchronisation of that stream now would drain
 * (vgpu_throttle_may_drain), the event's wait drains too, until the next launch on dev. Not
 * once the process made or opened an interprocess event: another process may record it. */
void vgpu_throttle_event_recorded(int dev, uintptr_t stream, uintptr_t event,
                                  unsigned long since);

/* A wait for event returned success (its work is done): each device it was recorded for as
 * above drains (vgpu_throttle_synced, of its stream). */
void vgpu_throttle_event_done(uintptr_t event);

/* The event is being destroyed: a new one may get its handle, done before it is recorded. */
void vgpu_throttle_event_gone(uintptr_t event);

/* The process made an interprocess event, or opened one (cuda.h, cuIpcOpenEventHandle): another
 * process may record it, so from here on no event's wait drains. */
void vgpu_throttle_events_shared(void);

/* The process made a context on dev that is not its primary one (cuCtxCreate, a green
 * context), or left one current that the library did not see made (cuda_context.c): a
 * synchronisation of one context no longer covers its work there. */
void vgpu_throttle_context_made(int dev);

#endif
