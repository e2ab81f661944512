/* throttle.h - the SM limiter: a per-device token bucket on kernel launches whose refill rate a
 * watcher thread steers from measured utilisation. */
#ifndef VGPU_THROTTLE_H
#define VGPU_THROTTLE_H

#include <stddef.h>
#include <stdint.h>

/* Non-zero once some device has an SM limit (read by every launch wrapper). */
extern int vgpu_throttle_enabled;

/* Reads the limits from the region; call once, when the driver is loaded. */
void vgpu_throttle_init(void);

/* The SM limiter's gate of a call that starts work costing cost tokens (grid blocks) on device
 * dev, on the stream whose key (vgpu_stream_key, cuda_driver.h) is `stream`: waits until the
 * device's bucket holds tokens; they are taken once the driver has answered that it took the
 * work (vgpu_throttle_answered, which must follow on the same thread). Taken at the gate, a
 * call the driver refused (a grid past the GPU's bounds, a memset outside any allocation) left
 * a debt no GPU time backed, forgiven at a rate of the debt itself: such calls now and then
 * lifted a limit of 25 to bursts of 40-64 % (a review found; given back after the answer, a
 * control step could still find them under way). */
void vgpu_throttle_launch(int dev, uint64_t cost, uintptr_t stream);

/* The calling thread's gated calls the driver has not answered yet, innermost last: a signal
 * handler's launch may come between a launch's gate and its answer. Past VGPU_UNANSWERED of
 * them a call takes its tokens at its gate (depth counts those too, entries only the first). */
enum { VGPU_UNANSWERED = 4 };
struct vgpu_unanswered {
    struct {
        int64_t *tokens; /* its device's bucket; NULL: no limit there */
        int64_t cost;
    } calls[VGPU_UNANSWERED];
    unsigned depth;
};
extern __thread __attribute__((tls_model("initial-exec"))) struct vgpu_unanswered vgpu_unanswered;

/* The driver answered the calling thread's innermost gated call (through vgpu_answered,
 * cuda_driver.h): taken (refused 0), its tokens are taken now; refused, nothing was queued.
 * Inline: out of line, a limited launch ran 5 instructions more and took some 5 ns longer
 * (hook/README.md, "Overhead"). */
static inline void vgpu_throttle_answered(int refused)
{
    unsigned depth = vgpu_unanswered.depth;
    if (depth == 0)
        return;
    if (depth > VGPU_UNANSWERED) {
        vgpu_unanswered.depth = depth - 1;
        return;
    }
    int64_t *tokens = vgpu_unanswered.calls[depth - 1].tokens;
    int64_t cost = vgpu_unanswered.calls[depth - 1].cost;
    /* Read before the entry is given up: a signal handler's call in between takes it. */
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    vgpu_unanswered.depth = depth - 1;
    if (!refused && tokens != NULL)
        __atomic_sub_fetch(tokens, cost, __ATOMIC_ACQ_REL);
}

/* The gate and the take apart, for a launch of several kernels in one call
 * (cuLaunchCooperativeKernelMultiDevice): the wait of vgpu_throttle_launch, and the taking of
 * cost tokens on dev. */
void vgpu_throttle_wait(int dev, uintptr_t stream);
void vgpu_throttle_take(int dev, uint64_t cost);

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
