/* throttle.c - token buckets, the watcher thread and the control law. */
#define _GNU_SOURCE
#include "throttle.h"

#include <pthread.h>
#include <time.h>

#include "control.h"
#include "log.h"
#include "nvml.h"
#include "region.h"

enum {
    TICK_NS = 10 * 1000 * 1000,      /* refill period */
    CONTROL_TICKS = 10,              /* control period = 100 ms */
    WAIT_NS = 500 * 1000,            /* sleep while the bucket is empty */
    MAX_PIDS = 256,
};
static const double burst_seconds = 0.02; /* bucket capacity, in seconds of rate */
static const double min_rate = 1.0;      /* tokens/s: progress is always possible */

struct bucket {
    int64_t tokens;     /* atomic; may go negative (debt) after a large launch */
    uint64_t consumed;  /* atomic: tokens taken so far */
    double rate;        /* tokens/s; 0 = not calibrated yet (watcher only) */
    uint64_t consumed_at_control;
    uint32_t limit;
};

int vgpu_throttle_enabled;
static struct bucket buckets[VGPU_REGION_MAX_DEVICES];
static int watcher_running; /* atomic; reset in a forked child (threads do not survive fork) */
static pthread_mutex_t watcher_lock = PTHREAD_MUTEX_INITIALIZER;

static const int64_t uncalibrated_credit = INT64_C(1) << 60;

static void refill(struct bucket *b, double seconds)
{
    double capacity = b->rate * burst_seconds;
    if (capacity < 1.0)
        capacity = 1.0;
    int64_t add = (int64_t)(b->rate * seconds + 0.5);
    int64_t now = __atomic_load_n(&b->tokens, __ATOMIC_ACQUIRE), next;
    do {
        next = now + add;
        if (next > (int64_t)capacity)
            next = now > (int64_t)capacity ? now : (int64_t)capacity;
    } while (!__atomic_compare_exchange_n(&b->tokens, &now, next, 1, __ATOMIC_ACQ_REL,
                                          __ATOMIC_ACQUIRE));
}

static void control(int dev, struct bucket *b, double seconds)
{
    int32_t pids[MAX_PIDS];
    int npids = vgpu_region_pids(pids, MAX_PIDS);
    double util = vgpu_nvml_container_util(dev, pids, npids);
    uint64_t consumed = __atomic_load_n(&b->consumed, __ATOMIC_ACQUIRE);
    double demand = (double)(consumed - b->consumed_at_control) / seconds;
    b->consumed_at_control = consumed;
    if (util < 0 || (demand == 0.0 && b->rate > 0.0))
        return; /* no measurement, or no launches to learn from: keep the current rate */
    if (b->rate == 0.0) {
        /* First period ran free: start from what the application used, scaled to the limit. */
        double scale = util > 0.5 ? (double)b->limit / util : 1.0;
        b->rate = demand * (scale > 1.0 ? 1.0 : scale);
        if (b->rate < min_rate)
            b->rate = min_rate;
        __atomic_store_n(&b->tokens, 0, __ATOMIC_RELEASE);
        return;
    }
    b->rate = vgpu_control_next_rate(b->rate, (double)b->limit, util, demand, min_rate);
    vgpu_log(VGPU_LOG_DEBUG, "device %d: utilisation %.1f%% (limit %u%%), rate %.0f tokens/s",
             dev, util, b->limit, b->rate);
}

static void sleep_ns(long ns)
{
    struct timespec ts = {.tv_sec = 0, .tv_nsec = ns};
    nanosleep(&ts, NULL);
}

static void *watch(void *unused)
{
    (void)unused;
    for (unsigned tick = 1;; tick++) {
        sleep_ns(TICK_NS);
        for (int dev = 0; dev < VGPU_REGION_MAX_DEVICES; dev++) {
            struct bucket *b = &buckets[dev];
            if (b->limit == 0)
                continue;
            if (tick % CONTROL_TICKS == 0)
                control(dev, b, CONTROL_TICKS * (TICK_NS / 1e9));
            if (b->rate > 0.0)
                refill(b, TICK_NS / 1e9);
        }
    }
    return NULL;
}

static void after_fork_child(void)
{
    pthread_mutex_init(&watcher_lock, NULL);
    watcher_running = 0;
    for (int dev = 0; dev < VGPU_REGION_MAX_DEVICES; dev++) {
        buckets[dev].rate = 0.0;
        buckets[dev].tokens = uncalibrated_credit;
    }
}

static void start_watcher(void)
{
    pthread_mutex_lock(&watcher_lock);
    if (!watcher_running) {
        pthread_t thread;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&thread, &attr, watch, NULL) == 0)
            __atomic_store_n(&watcher_running, 1, __ATOMIC_RELEASE);
        else
            vgpu_log(VGPU_LOG_ERROR, "cannot start the SM limiter thread; launches are not "
                     "throttled");
        pthread_attr_destroy(&attr);
    }
    pthread_mutex_unlock(&watcher_lock);
}

void vgpu_throttle_init(void)
{
    int any = 0;
    for (int dev = 0; dev < VGPU_REGION_MAX_DEVICES; dev++) {
        buckets[dev].limit = vgpu_region_sm_limit(dev);
        buckets[dev].tokens = uncalibrated_credit;
        any |= buckets[dev].limit != 0;
    }
    if (any) {
        pthread_atfork(NULL, NULL, after_fork_child);
        vgpu_log(VGPU_LOG_INFO, "SM limit active (device 0: %u%%)", buckets[0].limit);
    }
    vgpu_throttle_enabled = any;
}

void vgpu_throttle_launch(int dev, uint64_t cost)
{
    if (dev < 0 || dev >= VGPU_REGION_MAX_DEVICES)
        return;
    struct bucket *b = &buckets[dev];
    if (b->limit == 0)
        return;
    if (__builtin_expect(!__atomic_load_n(&watcher_running, __ATOMIC_ACQUIRE), 0))
        start_watcher();
    while (__atomic_load_n(&b->tokens, __ATOMIC_ACQUIRE) <= 0)
        sleep_ns(WAIT_NS);
    __atomic_sub_fetch(&b->tokens, (int64_t)cost, __ATOMIC_ACQ_REL);
    __atomic_add_fetch(&b->consumed, cost, __ATOMIC_RELAXED);
}
