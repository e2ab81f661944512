/* sampler.c - NVML's readings for the SM limiter, on a thread of their own (sampler.h). The
 * watcher asks, the sampler's thread reads every device asked for and says it is done; the
 * watcher takes the readings at its next call, or at this one if they come within its wait. */
#define _GNU_SOURCE
#include "sampler.h"

#include <errno.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "locks.h"
#include "log.h"
#include "region.h"
#include "threads.h"
#include "util.h"

/* Every slot's: a process of the container left out had its samples charged nowhere (256 of
 * the 1024 once, and the 257th process ran free, tests/test_throttle.c many-processes). */
enum { MAX_PIDS = VGPU_REGION_MAX_SLOTS };
_Static_assert(VGPU_REGION_MAX_DEVICES <= 32, "a device mask is an unsigned int");

enum state {
    IDLE,    /* nothing asked, or the last readings taken */
    ASKED,   /* the watcher asked for the devices of `asked` */
    READING, /* the sampler's thread is reading them */
    DONE,    /* readings[] hold them, for the watcher to take */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed; /* state changed: both sides wait on it (CLOCK_MONOTONIC: a wall
                                * clock stepped back would stretch the watcher's wait) */
static pthread_once_t made = PTHREAD_ONCE_INIT;
static enum state state;          /* under lock */
static unsigned asked;            /* under lock: the devices of the reading under way */
static int thread_running;        /* under lock */
static struct vgpu_sample readings[VGPU_REGION_MAX_DEVICES]; /* the thread's while READING */

/* The container's processes as the region has them, read once a reading of all devices. */
struct container {
    int32_t pids[MAX_PIDS];
    int npids;
    int32_t self; /* this process's host pid, 0: unknown */
    int pids_known;
};

/* Reads device dev for the container, and the whole GPU's utilisation where the container's
 * may not tell (no sample of its own, its host pids not all known). */
static void read_one(int dev, const struct container *c, struct vgpu_sample *s)
{
    *s = (struct vgpu_sample){.self = c->self, .pids_known = c->pids_known, .util = -1,
                              .device_what = VGPU_UTIL_UNKNOWN, .device_util = -1};
    s->what = vgpu_nvml_container_util(dev, c->pids, c->npids,
                                       c->self != 0 ? c->self : (int32_t)getpid(), &s->util,
                                       &s->own, &s->sibling, &s->stamp_us, &s->since_us);
    int needs_device = s->what == VGPU_UTIL_NO_NEW_SAMPLE || s->what == VGPU_UTIL_UNKNOWN ||
                       (s->what == VGPU_UTIL_OTHERS_ONLY && !s->pids_known);
    if (needs_device)
        s->device_what = vgpu_nvml_device_util(dev, &s->device_util);
    s->read_us = unix_ns() / 1000u;
}

static void read_all(unsigned devices)
{
    struct container c;
    c.npids = vgpu_region_pids(c.pids, MAX_PIDS);
    c.self = vgpu_region_host_pid();
    c.pids_known = vgpu_region_host_pids_known();
    for (int dev = 0; dev < VGPU_REGION_MAX_DEVICES; dev++)
        if (devices & (1u << dev))
            read_one(dev, &c, &readings[dev]);
}

/* The readings of `devices` to out; returns the mask. */
static unsigned copy_out(unsigned devices, struct vgpu_sample *out)
{
    for (int dev = 0; dev < VGPU_REGION_MAX_DEVICES; dev++)
        if (devices & (1u << dev))
            out[dev] = readings[dev];
    return devices;
}

static void *sample(void *unused)
{
    (void)unused;
    for (;;) {
        vgpu_lock(&lock);
        while (state != ASKED)
            pthread_cond_wait(&changed, &lock);
        state = READING;
        unsigned devices = asked;
        vgpu_unlock(&lock);
        read_all(devices); /* NVML, unlocked: the watcher goes on meanwhile */
        vgpu_lock(&lock);
        state = DONE;
        pthread_cond_broadcast(&changed);
        vgpu_unlock(&lock);
        /* Once the reading is out (a scan of the slots may take a few ms, /proc read for an
         * owner running without its lock): a sibling that exited keeps its slot until reaped,
         * and the next reading would go on naming its pid (another tenant's once the host hands
         * it out again) or, its host pid never learnt, leave the container's pids unknown. */
        vgpu_region_reap_lately();
    }
    return NULL;
}

/* Under lock. The thread is made at the first reading: a process that never launches under an
 * SM limit has none. */
static int start_thread(void)
{
    if (thread_running)
        return 1;
    int rc = vgpu_thread_start(sample);
    if (rc != 0) {
        static int told;
        if (!__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED))
            vgpu_log(VGPU_LOG_WARN, "cannot start the SM limiter's NVML thread (error %d); NVML "
                     "is read on the limiter's own thread until it starts", rc);
        return 0;
    }
    thread_running = 1;
    return 1;
}

/* Under lock: waits for DONE until CLOCK_MONOTONIC `until` (ns). */
static void wait_done(uint64_t until)
{
    struct timespec ts = {.tv_sec = (time_t)(until / 1000000000u),
                          .tv_nsec = (long)(until % 1000000000u)};
    while (state != DONE)
        if (pthread_cond_timedwait(&changed, &lock, &ts) == ETIMEDOUT)
            return;
}

static unsigned take(unsigned devices, struct vgpu_sample *out)
{
    state = IDLE;
    return copy_out(asked & devices, out);
}

static void make_changed(void)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&changed, &attr);
    pthread_condattr_destroy(&attr);
}

/* Under lock. */
static void ask(unsigned devices)
{
    asked = devices;
    state = ASKED;
    pthread_cond_broadcast(&changed);
}

unsigned vgpu_sampler_collect(unsigned devices, struct vgpu_sample *out, uint64_t wait_ns)
{
    pthread_once(&made, make_changed);
    vgpu_lock(&lock);
    unsigned got = 0;
    if (state == DONE) {
        /* One that took longer than its wait: taken now and the next asked at once, so that a
         * slow NVML still gives a reading a call (each one call old), not one every other. */
        got = take(devices, out);
        if (devices != 0)
            ask(devices);
    } else if (state == IDLE && devices != 0) {
        if (!start_thread()) {
            vgpu_unlock(&lock);
            read_all(devices); /* no other thread to read: state stays IDLE, readings ours */
            got = copy_out(devices, out);
            vgpu_region_reap_lately(); /* as the sampler's thread does after a reading */
            return got;
        }
        ask(devices);
        wait_done(monotonic_ns() + wait_ns);
        if (state == DONE)
            got = take(devices, out);
    } /* else under way since an earlier call, and not waited for again */
    vgpu_unlock(&lock);
    return got;
}

/* The parent's sampler thread may have been inside NVML, holding NVML's own locks, when the
 * process forked: a child's first NVML call may then never return. Its watcher goes on
 * refilling meanwhile (it only waits up to wait_ns a call), with no readings. */
void vgpu_sampler_after_fork(void)
{
    pthread_mutex_init(&lock, NULL);
    make_changed();
    state = IDLE;
    asked = 0;
    thread_running = 0;
}
