/* throttle.c - token buckets, the watcher thread and the control law. */
#define _GNU_SOURCE
#include "throttle.h"

#include <pthread.h>
#include <time.h>

#include "account.h"
#include "control.h"
#include "locks.h"
#include "log.h"
#include "nvml.h"
#include "region.h"
#include "sampler.h"
#include "threads.h"
#include "util.h"

enum {
    TICK_NS = 10 * 1000 * 1000,      /* refill period */
    CONTROL_TICKS = 10,              /* control period = 100 ms */
    WAIT_NS = 500 * 1000,            /* sleep while the bucket is empty */
    WATCHER_RETRY_WAITS = 200,       /* a watcher that could not start: tried again each 0.1 s */
};
/* How long the watcher waits for NVML's reading at a control step (a slower one comes in at a
 * later step, the refills going on meanwhile), and for the first, at its start (NVML's start
 * may take long; launches held back wait for it). */
static const uint64_t reading_wait_ns = 5 * 1000 * 1000;
static const uint64_t first_reading_wait_ns = 2000ull * 1000 * 1000;
static const double burst_seconds = 0.02; /* bucket capacity, in seconds of rate */
static const double min_rate = 1.0;      /* tokens/s: progress is always possible */
static const double control_seconds = CONTROL_TICKS * (TICK_NS / 1e9);
/* The GPU-time account (account.h): at most credit_seconds at the limit banked; after two
 * sample periods, at least idle_seconds, without a charge (NVML has no process sample when no
 * process ran) the container counts as idle, or the whole GPU's utilisation stands for its
 * share; launches are held back past held_seconds at the limit over, and time is prepaid
 * (prepay), while a charge is at most told_seconds past that idle time old: without NVML
 * neither would ever be given back. */
static const double credit_seconds = 0.2;
static const double idle_seconds = 0.5;
static const double held_seconds = 1.0;
static const double told_seconds = 1.5;
/* A process keeps the account paid this far ahead of now for its time NVML has not measured
 * yet (prepay below): it may exit before the next tick. */
static const unsigned long long prepaid_ahead_us = 2 * (TICK_NS / 1000);
/* NVML's sample period is 1/6 s to 1 s, by GPU: a stamp that jitters cannot teach less. */
static const double shortest_period_s = 1.0 / 6, longest_period_s = 1.0;
/* Measurements after a forgiveness before the next: NVML's sample period (about 1/6 s) is
 * longer than the control period, so the first may not have seen the launch it let through. */
static const unsigned fresh_after_forgiving = 2;
/* While NVML tells nothing (blind_step), work not seen drained is taken to run this long after
 * its launch; a reading this late since the last, or NVML's "no new sample" this long after a
 * first launch still uncalibrated, counts as none. */
static const double blind_tail_seconds = 1.0;
static const unsigned long long blind_after_us = 2000000;
/* Weight of a new sample in the shares averaged for the balance between siblings: NVML may give
 * a sample period's whole share to one process (hook/README.md, "One bit a sample"), so one
 * sample tells little. */
static const double share_weight = 0.25;

/* The events a device keeps whose wait would drain it: a process may record several after its
 * last launch (one per stream it hands work to, say) and wait for any of them. */
enum { KEPT_EVENTS = 4 };

/* Launches only take tokens and only the watcher adds them, so what launches took is counted
 * by the watcher from the value it last wrote (one atomic per launch, not two). */
struct bucket {
    /* Every limited launch reads tokens and the four fields after it, the drain's
     * (vgpu_throttle_synced) and the kept events' mark (vgpu_throttle_event_recorded): one
     * cache line. */
    _Alignas(64) int64_t tokens; /* atomic; may go negative (debt) after a large launch */
    uintptr_t launcher;  /* atomic: the one thread that launched here (its thread_name),
                          * no_launcher: none yet, several_launchers: more than one */
    unsigned long long drained_us; /* atomic: CLOCK_REALTIME us when that thread's
                                    * synchronisation returned; 0 again at its next launch */
    uintptr_t stream;    /* atomic: the one stream launched on since the context's last drain
                          * (vgpu_stream_key), 0: none yet, several_streams: more than one, or
                          * one destroyed while named */
    int events_fresh;    /* atomic: events[] were recorded since the last launch (0 again at
                          * every launch) */
    int64_t written;    /* watcher: the value it last wrote to tokens */
    uint64_t taken;     /* watcher: tokens launches took before that write */
    double rate;        /* tokens/s; 0 = not calibrated yet (watcher only) */
    double carry;       /* fraction of a token not added yet (watcher only) */
    uint64_t consumed_at_control;
    uint64_t control_ns; /* CLOCK_MONOTONIC of the last measurement acted on (set when the
                          * watcher starts) */
    double period_s;     /* NVML's sample period: the least gap between two stamps seen
                          * (0: none yet, sample_period stands for it) */
    unsigned long long stamp_us; /* the newest sample stamp seen */
    unsigned fresh;      /* readings since the last forgiveness */
    double debt_gpu;     /* GPU seconds measured while in debt, since it began */
    int held;            /* the account is too far over the limit: no refill */
    uint32_t limit;
    /* Prepayment (watcher only, and start_watcher before the watcher exists): */
    unsigned long long launched_us; /* CLOCK_REALTIME of the first launch on the device (0: none) */
    unsigned long long unmeasured_us; /* ... of the launch from which own is not NVML's: the
                                       * first, or one its rate would take a period to repay */
    unsigned long long last_launch_us; /* ... of the latest tick a launch took tokens in */
    uint64_t consumed_at_tick;
    double own;          /* this process's share (percent) NVML last measured since then; the
                          * whole GPU until it has */
    double prepaid;      /* seconds of the whole GPU taken off the account ahead, not yet given
                          * back, for the time prepaid_from_us..prepaid_to_us */
    unsigned long long prepaid_from_us, prepaid_to_us;
    int prepaying;       /* the last tick prepaid: the next goes on from prepaid_to_us */
    int guessed;         /* own is the whole GPU assumed, not yet measured */
    int blind;           /* NVML could not tell at the last measurement: nothing is prepaid
                          * (no charge would give it back) */
    unsigned long long blind_launch_us; /* last_launch_us as of the last blind step */
    unsigned long long blind_from_us;   /* the time up to which blind_step has decided */
    int blind_held;                     /* held at that time */
    unsigned long long read_us;         /* CLOCK_REALTIME of NVML's latest reading, any */
    /* Between the processes of a container (vgpu_control_sibling_factor): */
    int waited;          /* atomic: a launch waited for tokens since the rate law's last step (set
                          * at every wait: one longer than a step counts in the step it ends
                          * in too) */
    double own_avg;      /* this process's share, percent, averaged over NVML's samples */
    double sibling_avg;  /* ... and the largest other process's of the container */
    unsigned long long paused_us;  /* watcher: the drain prepayment paused at (0: not paused) */
    /* Events whose wait drains (vgpu_throttle_event_recorded), while events_fresh: */
    uintptr_t events[KEPT_EVENTS]; /* atomic: the newest recorded, 0: none */
    unsigned next_event;           /* where the next goes (the launching thread's) */
    uintptr_t events_stream;       /* atomic: the stream all of them were recorded on */
};

int vgpu_throttle_enabled;
static struct bucket buckets[VGPU_REGION_MAX_DEVICES];
static int watcher_running; /* atomic; reset in a forked child (threads do not survive fork) */
static int other_context[VGPU_REGION_MAX_DEVICES]; /* atomic: vgpu_throttle_context_made */
/* Not thread names: no_launcher is no thread's, even one not named yet (0), so that a launch
 * compares its thread_name as it stands and names it only where it differs (note_other). */
static const uintptr_t several_launchers = 1, no_launcher = UINTPTR_MAX;
/* A thread's name in bucket.launcher: a number of its own, taken when it first needs one (0:
 * none yet). Not its TLS address, which a thread made after another exited may reuse: a wait
 * for its own default stream would pass for the dead thread's, whose work may run on. */
static __thread __attribute__((tls_model("initial-exec"))) uintptr_t thread_name;
static uintptr_t last_thread_name = several_launchers; /* atomic */
/* Not a stream key: those are handles, or CU_STREAM_LEGACY and CU_STREAM_PER_THREAD (1, 2). */
static const uintptr_t several_streams = UINTPTR_MAX;
static unsigned watcher_failures; /* under watcher_lock: failed starts since the last one */
static pthread_mutex_t watcher_lock = PTHREAD_MUTEX_INITIALIZER;

static const int64_t uncalibrated_credit = INT64_C(1) << 60;

/* Tokens launches had taken when the bucket held `tokens` (the watcher's view). */
static uint64_t consumed_at(const struct bucket *b, int64_t tokens)
{
    return b->taken + (uint64_t)(b->written - tokens);
}

/* Tokens launches have taken so far (exact at the moment of the call). */
static uint64_t consumed(const struct bucket *b)
{
    return consumed_at(b, __atomic_load_n(&b->tokens, __ATOMIC_ACQUIRE));
}

/* The watcher writes tokens: `was` is what the write replaced. */
static void wrote(struct bucket *b, int64_t was, int64_t now)
{
    b->taken += (uint64_t)(b->written - was);
    b->written = now;
}

static void start_full(struct bucket *b)
{
    b->tokens = b->written = uncalibrated_credit;
    b->taken = 0;
    b->period_s = 0.0;
    b->stamp_us = 0;
    b->fresh = fresh_after_forgiving;
    b->held = 0;
    b->debt_gpu = 0.0;
    b->launched_us = b->unmeasured_us = b->last_launch_us = 0;
    b->consumed_at_tick = 0;
    b->own = 100.0;
    b->guessed = 0;
    b->prepaid = 0.0;
    b->prepaid_from_us = b->prepaid_to_us = 0;
    b->prepaying = 0;
    b->blind = 0;
    b->blind_launch_us = b->blind_from_us = b->read_us = 0;
    b->blind_held = 0;
    b->waited = 0;
    b->own_avg = b->sibling_avg = 0.0;
    b->launcher = no_launcher;
    b->stream = 0;
    b->drained_us = b->paused_us = 0;
    b->events_fresh = 0;
}

/* What the bucket holds at most: burst_seconds of its rate, at least one token. */
static double capacity(const struct bucket *b)
{
    double tokens = b->rate * burst_seconds;
    return tokens < 1.0 ? 1.0 : tokens;
}

/* Adds rate * seconds tokens, keeping the fraction for the next tick: at a low rate (a CUDA
 * graph is many blocks) rounding each tick would add nothing at all. */
static void refill(struct bucket *b, double seconds)
{
    double full = capacity(b);
    double due = b->rate * seconds + b->carry;
    int64_t add = (int64_t)due;
    b->carry = due - (double)add;
    int64_t now = __atomic_load_n(&b->tokens, __ATOMIC_ACQUIRE), next;
    do {
        next = now + add;
        if (next > (int64_t)full) {
            next = now > (int64_t)full ? now : (int64_t)full;
            b->carry = 0.0;
        }
    } while (!__atomic_compare_exchange_n(&b->tokens, &now, next, 1, __ATOMIC_ACQ_REL,
                                          __ATOMIC_ACQUIRE));
    wrote(b, now, next);
}

/* Logged once per process: the limit cannot tell this container from the others. */
static void warn_once(int *done, const char *why)
{
    if (!__atomic_exchange_n(done, 1, __ATOMIC_RELAXED))
        vgpu_log(VGPU_LOG_WARN, "SM limit: %s", why);
}

/* *own of a reading that is the whole GPU's: that shows a process's work after it exits, so
 * nothing is prepaid. */
static const double own_in_whole_gpu = -2.0;

/* What the limiter takes as this container's share from NVML's reading s, or -1 to keep the
 * current rate; *reading is what the GPU-time account is charged (its util -1 when nothing is
 * to be), *own this process's share in it (-1: none; 0 where NVML said no process ran;
 * own_in_whole_gpu), *sibling the largest share of another process of the container in a new
 * sample period whose processes NVML told apart (-1: none). */
static double measure(const struct vgpu_sample *s, double demand, struct vgpu_reading *reading,
                      double *own, double *sibling)
{
    static int whole_device_warned, unmatched_warned;
    *reading = (struct vgpu_reading){.util = -1, .stamp_us = s->read_us, .sampled = 0};
    *own = *sibling = -1;
    switch (s->what) {
    case VGPU_UTIL_OURS:
        *reading = (struct vgpu_reading){
            .util = s->util, .stamp_us = s->stamp_us, .since_us = s->since_us, .sampled = 1};
        /* Our host pid unknown: NVML may list us by another. */
        *own = s->self != 0 ? s->own : s->util;
        *sibling = s->self != 0 ? s->sibling : -1;
        return s->util;
    case VGPU_UTIL_OTHERS_ONLY:
        /* Our processes did not run in the period (the bucket held them back, or they were
         * idle): share 0, and the rate opens up. */
        if (demand == 0.0 || s->pids_known) {
            *reading = (struct vgpu_reading){
                .util = 0.0, .stamp_us = s->stamp_us, .since_us = s->since_us, .sampled = 1};
            *own = 0.0;
            *sibling = s->self != 0 ? 0.0 : -1;
            return 0.0;
        }
        /* We launched work, yet NVML shows only other processes, and some of our host pids
         * were never learnt: the whole device's rate is the only bound left; it counts other
         * tenants against us. */
        warn_once(&unmatched_warned, "NVML does not list this container's processes (host pids "
                  "unknown); limiting by the whole GPU's utilisation, other tenants included");
        if (s->device_what == VGPU_UTIL_WHOLE_DEVICE) {
            reading->util = s->device_util;
            *own = s->device_util; /* no sample of ours to tell it: all of it may be ours */
            return s->device_util;
        }
        return -1;
    case VGPU_UTIL_WHOLE_DEVICE:
        warn_once(&whole_device_warned, "this GPU has no per-process samples; limiting by the "
                  "whole GPU's utilisation, other tenants included");
        reading->util = s->util;
        *own = own_in_whole_gpu;
        return s->util;
    case VGPU_UTIL_NO_NEW_SAMPLE:
        reading->sampled = 1; /* NVML answered: no process ran in a period since the last */
        *own = 0.0;
        return -1;
    default:
        return -1; /* NVML cannot tell: keep the rate */
    }
}

/* A debt the account does not back is forgiven: the bucket is filled, and the rate set from
 * what the debt's work cost as measured (the feedback then steers it as usual). */
static void forgive(int dev, struct bucket *b, double credit)
{
    int64_t now = __atomic_load_n(&b->tokens, __ATOMIC_ACQUIRE);
    if (now >= 0 || !vgpu_control_forgives(-(double)now, b->rate, control_seconds, credit))
        return;
    double debt = -(double)now;
    int64_t full = (int64_t)capacity(b);
    while (now < full && !__atomic_compare_exchange_n(&b->tokens, &now, full, 1, __ATOMIC_ACQ_REL,
                                                      __ATOMIC_ACQUIRE))
        ;
    if (now >= full)
        return;
    wrote(b, now, full);
    b->carry = 0.0;
    b->rate = vgpu_control_forgiven_rate(b->rate, (double)b->limit, debt, b->debt_gpu);
    b->fresh = 0;
    vgpu_log(VGPU_LOG_DEBUG, "device %d: %.0f tokens of debt forgiven (%.3f s of GPU under the "
             "limit); rate %.0f tokens/s", dev, debt, credit, b->rate);
}

/* Takes what the bucket holds, so that no launch passes from here. */
static void empty(struct bucket *b)
{
    int64_t was = __atomic_load_n(&b->tokens, __ATOMIC_ACQUIRE);
    while (was > 0 && !__atomic_compare_exchange_n(&b->tokens, &was, 0, 1, __ATOMIC_ACQ_REL,
                                                    __ATOMIC_ACQUIRE))
        ;
    if (was > 0)
        wrote(b, was, 0);
    b->carry = 0.0;
}

/* A period seen, within what NVML's can be. */
static double within_nvml_periods(double seconds)
{
    return seconds < shortest_period_s  ? shortest_period_s
         : seconds > longest_period_s ? longest_period_s
                                      : seconds;
}

/* NVML's sample period on dev: as this process learnt it, else as the container's others did
 * (the region keeps the least any saw), else the longest NVML has. A new process that took its first
 * sample as covering a whole second charged the container that sample's share over the second
 * before it, which in a chain of short processes (tests/test_contention.c, chain) was time a
 * process gone had prepaid, or that nothing ran in: the chain got 13-16 % of the GPU under a
 * limit of 20. */
static double sample_period(int dev, const struct bucket *b)
{
    if (b->period_s > 0.0)
        return b->period_s;
    double learnt = vgpu_region_sample_period(dev);
    return learnt > 0.0 ? within_nvml_periods(learnt) : longest_period_s;
}

/* Seconds without a charge after which the container counts as idle: two sample periods, at
 * least idle_seconds. */
static double idle_after(int dev, const struct bucket *b)
{
    double period = sample_period(dev, b);
    return 2.0 * period > idle_seconds ? 2.0 * period : idle_seconds;
}

/* Whether the container's account is charged recently enough to act on: a hold, or a
 * prepayment, that only a reading can end would be for good without NVML. */
static int account_told(int dev, const struct bucket *b, unsigned long long now_us)
{
    double age = vgpu_account_age(dev, now_us);
    return age >= 0 && age < idle_after(dev, b) + told_seconds;
}

/* Whether the container's account holds launches back: over the line as of now, this
 * process's own prepayment left out while its share is assumed (a new process, whole GPU until
 * measured, would otherwise hold itself and its siblings back at its start). Once measured it
 * counts, as what other processes prepaid does: left out always, it favoured whichever sibling
 * had prepaid more at the moment, the one running rather than drained (throttle-siblings). */
static int container_held(int dev, const struct bucket *b, unsigned long long now_us)
{
    return account_told(dev, b, now_us) &&
           vgpu_control_holds(vgpu_account_balance(dev, b->limit, now_us) +
                                  (b->guessed ? b->prepaid : 0.0),
                              (double)b->limit, held_seconds);
}

/* Whether the process prepays: it launched, and a charge would give it back (NVML can tell,
 * and the account has been charged lately). */
static int prepays(int dev, const struct bucket *b, unsigned long long now_us)
{
    return b->launched_us != 0 && !b->blind && account_told(dev, b, now_us);
}

/* A synchronisation left no work of this process running from `drained` on: what was prepaid
 * past it is given back, and nothing more until a launch. */
static void pause_prepayment(int dev, struct bucket *b, unsigned long long drained, double cap)
{
    if (b->prepaying && b->prepaid_to_us > drained) {
        unsigned long long from = b->prepaid_from_us > drained ? b->prepaid_from_us : drained;
        double ahead = b->own / 100.0 * (double)(b->prepaid_to_us - from) / 1e6;
        if (ahead > b->prepaid)
            ahead = b->prepaid;
        vgpu_account_refund(dev, ahead, cap);
        b->prepaid -= ahead;
        b->prepaid_to_us = from;
    }
    b->prepaying = 0;
    b->paused_us = drained;
}

/* Where prepayment goes on after a drain: the launch that ended it was at most a tick ago. */
static unsigned long long resumed_from(const struct bucket *b, unsigned long long now_us)
{
    unsigned long long tick_ago = now_us - TICK_NS / 1000;
    return b->paused_us > tick_ago ? b->paused_us : tick_ago;
}

/* Prepays the time from..to (after what is prepaid already) at this process's share. */
static void pay_for(int dev, struct bucket *b, unsigned long long from, unsigned long long to)
{
    double seconds = b->own / 100.0 * (double)(to - from) / 1e6;
    if (b->prepaid == 0.0)
        b->prepaid_from_us = from;
    b->prepaid += seconds;
    b->prepaid_to_us = to;
    vgpu_account_prepay(dev, seconds);
}

/* Before a drain pauses it: the time up to the drain not paid yet, at its share. Work launched
 * and drained between two ticks ran too (the watcher saw its tokens taken, last_launch_us), as
 * did work past where the last tick's prepayment ended, should this tick be late. */
static void pay_until_drained(int dev, struct bucket *b, unsigned long long drained,
                              unsigned long long now_us)
{
    if (!prepays(dev, b, now_us))
        return;
    unsigned long long from = (unsigned long long)(vgpu_control_unpaid_from(
                                  b->prepaying, (double)b->prepaid_to_us,
                                  b->last_launch_us == now_us, (double)resumed_from(b, now_us),
                                  (double)drained));
    if (from < drained)
        pay_for(dev, b, from, drained);
}

/* Prepayment. A process's GPU time is charged when NVML's sample of it is read, up to a sample
 * period after it ran; a process that exits first is never charged (NVML lists live processes),
 * and a new process runs free until its first measurement: a chain of short-lived processes
 * took 88 % of the GPU under a limit of 20. So each process keeps the account paid ahead for
 * its time not yet charged, at its share as NVML last measured it (the whole GPU until then),
 * and takes back what a charge has since measured. What a process that exits had prepaid stays
 * paid. Called every tick. */
static void prepay(int dev, struct bucket *b, unsigned long long now_us)
{
    double cap = b->limit / 100.0 * credit_seconds;
    if (b->prepaid_to_us > now_us + prepaid_ahead_us) {
        /* The clock stepped back: no charge can be told to cover this time; give it back, and
         * take the launches as made now. */
        vgpu_account_refund(dev, b->prepaid, cap);
        b->prepaid = 0.0;
        b->prepaid_from_us = b->prepaid_to_us = 0;
        b->prepaying = 0;
        b->launched_us = b->launched_us > now_us ? now_us : b->launched_us;
        b->unmeasured_us = b->unmeasured_us > now_us ? now_us : b->unmeasured_us;
        b->last_launch_us = b->last_launch_us > now_us ? now_us : b->last_launch_us;
    }
    unsigned long long charged = vgpu_account_charged_to(dev, now_us);
    double back = vgpu_control_settled(b->prepaid, (double)b->prepaid_from_us / 1e6,
                                       (double)b->prepaid_to_us / 1e6, (double)charged / 1e6,
                                       b->own / 100.0);
    if (back > 0.0) {
        vgpu_account_refund(dev, back, cap);
        b->prepaid = back < b->prepaid ? b->prepaid - back : 0.0;
        b->prepaid_from_us = charged;
    }
    unsigned long long drained = __atomic_load_n(&b->drained_us, __ATOMIC_ACQUIRE);
    if (drained != 0 && drained <= now_us) {
        pay_until_drained(dev, b, drained, now_us);
        pause_prepayment(dev, b, drained, cap);
        return; /* none of its work runs until its next launch */
    }
    /* Held or not: what it launched before a hold runs on, and it may exit before NVML's next
     * sample (a second later on some GPUs). */
    if (!prepays(dev, b, now_us)) {
        b->prepaying = 0;
        return; /* nothing launched, or nothing would give it back */
    }
    /* On from where the last tick's prepayment ended (a tick late, or an NVML call slow, must
     * not leave time unpaid), or from the first launch (the account may have been charged only
     * since); at most a sample period back, should the clock jump. */
    double period = sample_period(dev, b);
    unsigned long long back_to = now_us - (unsigned long long)(period * 1e6);
    unsigned long long from = b->prepaying ? b->prepaid_to_us
                            : b->paused_us != 0 ? resumed_from(b, now_us)
                            : b->prepaid_to_us == 0 ? b->launched_us
                                                   : now_us;
    b->paused_us = 0;
    from = from < back_to ? back_to : from;
    unsigned long long to = now_us + prepaid_ahead_us;
    b->prepaying = 1;
    if (to > from)
        pay_for(dev, b, from, to);
}

/* A device's first launch in this process (taken: the tokens launches took so far): from here
 * its time is prepaid until measured. */
static void first_launch(int dev, struct bucket *b, unsigned long long now_us, uint64_t taken)
{
    b->launched_us = b->unmeasured_us = b->last_launch_us = now_us;
    b->consumed_at_tick = taken;
    b->own = 100.0;
    b->guessed = 1;
    prepay(dev, b, now_us);
}

/* This process's own share from a reading (own: measure's), for its prepayment. A sample is
 * a share of its whole period: one that began before the launch it has not measured is taken
 * over the part after it, rounded up (a whole GPU's worth run in its last twentieth reads
 * 5 %). (Over the whole time a late reading spans, a burst's first reading after idle time
 * took the burst for most of the GPU, and its prepayment held it: 0.4 s bursts every 3.4 s
 * under 20 got 3.6-3.8 % in 9 runs of 23, test_throttle idle-bursts.) NVML's "no process
 * ran" counts once a whole period has passed since the last launch (a long kernel launched
 * last runs on, launching nothing, and no period has ended since). */
static void learn_own(struct bucket *b, const struct vgpu_reading *reading, double own,
                      double period)
{
    if (b->launched_us == 0 || own == -1.0)
        return;
    double period_us = period * 1e6;
    double after = ((double)reading->stamp_us - (double)b->unmeasured_us) / period_us;
    if (own == own_in_whole_gpu)
        b->own = 0.0;
    else if (reading->util < 0.0 &&
             (double)reading->stamp_us >= (double)b->last_launch_us + period_us)
        b->own = 0.0;
    else if (reading->util >= 0.0 && after >= 1.0)
        b->own = own;
    else if (reading->util >= 0.0 && after > 0.0)
        b->own = (own + 0.5) / after < 100.0 ? (own + 0.5) / after : 100.0;
    else
        return;
    b->guessed = 0;
}

/* Holds launches back while the container is over its limit by more than held_seconds at the
 * limit (any of its processes may have charged the account since). */
static void hold(int dev, struct bucket *b, unsigned long long now_us)
{
    int held = container_held(dev, b, now_us);
    if (held && !b->held) {
        empty(b);
        vgpu_log(VGPU_LOG_DEBUG, "device %d: %.3f s of GPU over the limit; launches held back",
                 dev, -vgpu_account_credit(dev));
    } else if (!held && b->held && b->rate == 0.0) {
        wrote(b, __atomic_exchange_n(&b->tokens, uncalibrated_credit, __ATOMIC_ACQ_REL),
              uncalibrated_credit);
    }
    b->held = held;
}

/* Charges a reading to the container's GPU-time account (account.h), forgives a debt the
 * account does not back, and holds launches back while the container is over its limit by more
 * than held_seconds at the limit. A share that is the whole GPU's counts other tenants, as the
 * rate does then (it cannot tell a neighbour's work from a long kernel of its own). Takes this
 * process's own share from a sample (own, -1: none) for its prepayment. A bucket held before
 * its first period (a process started in a held container) gets its uncalibrated start back
 * when the hold ends. */
static void account(int dev, struct bucket *b, struct vgpu_reading *reading, double own,
                    double demand, const struct vgpu_sample *s)
{
    double share = b->limit / 100.0;
    unsigned long long now_us = unix_ns() / 1000u;
    double age = vgpu_account_age(dev, now_us);
    int stale = age < 0 || age >= idle_after(dev, b);
    if (reading->util >= 0 && reading->sampled) {
        double gap = (double)(reading->stamp_us - b->stamp_us) / 1e6;
        if (b->stamp_us != 0 && reading->stamp_us > b->stamp_us &&
            (b->period_s == 0.0 || gap < b->period_s))
        {
            b->period_s = within_nvml_periods(gap);
            vgpu_region_learn_sample_period(dev, b->period_s);
        }
        b->stamp_us = reading->stamp_us;
    }
    double period = sample_period(dev, b);
    learn_own(b, reading, own, period);
    if (reading->util < 0 && stale) {
        /* No sample for two periods: idle if nothing was launched, else the whole GPU's. */
        int idle = reading->sampled && demand == 0.0;
        reading->sampled = 0;
        reading->util = idle                                      ? 0.0
                        : s->device_what == VGPU_UTIL_WHOLE_DEVICE ? s->device_util
                                                                   : -1;
    }
    if (reading->util >= 0)
        vgpu_account_charge(dev, b->limit, reading, period, share * credit_seconds, now_us);
    if (reading->util >= 0 && b->rate > 0.0) {
        double covered =
            reading->sampled ? vgpu_reading_span(reading, period) : control_seconds;
        b->debt_gpu = __atomic_load_n(&b->tokens, __ATOMIC_ACQUIRE) < 0
                          ? b->debt_gpu + reading->util / 100.0 * covered : 0.0;
        if (b->fresh < fresh_after_forgiving)
            b->fresh++;
        if (b->fresh >= fresh_after_forgiving)
            forgive(dev, b, vgpu_account_credit(dev) + b->prepaid); /* its own time, ahead */
    }
    hold(dev, b, now_us);
}

/* Takes NVML's reading s, charges the account (measure, account) and averages this process's
 * share and its largest sibling's (*averaged: whether a new sample did); returns what the rate
 * law takes. */
static double observe(int dev, struct bucket *b, double demand, const struct vgpu_sample *s,
                      int *averaged)
{
    struct vgpu_reading reading;
    double own, sibling;
    double util = measure(s, demand, &reading, &own, &sibling);
    *averaged = own >= 0.0 && sibling >= 0.0;
    if (*averaged) {
        b->own_avg += share_weight * (own - b->own_avg);
        b->sibling_avg += share_weight * (sibling - b->sibling_avg);
    }
    account(dev, b, &reading, own, demand, s);
    /* NVML's "no new sample" for long while launching is no reading either (an NVML of the
     * process's choosing may answer nothing else). */
    b->blind = (reading.util < 0 && !reading.sampled) ||
               (s->what == VGPU_UTIL_NO_NEW_SAMPLE && b->rate == 0.0 && b->launched_us != 0 &&
                s->read_us > b->launched_us + blind_after_us);
    b->read_us = s->read_us;
    return util;
}

/* An uncalibrated bucket lets every launch through until NVML's first reading, which a process
 * without NVML (a library that cannot be loaded, or one failing, hung or answering nothing)
 * never gets: it ran free for good (an adversarial review, 2026-11-30: 94 % of the GPU under a
 * limit of 25; calibrated from its first second's blocks instead, a heavy load after a light
 * start got 0.5 %). So at each control step while no reading tells, the time since the last
 * step is charged to the account as the whole GPU's where the process's work may have run in
 * it (a launch since, or one not seen drained up to blind_tail_seconds before, not held back),
 * and the account's hold makes its duty cycle the limit. Held time is not charged: work
 * queued before a hold runs on uncounted. */
static void blind_step(int dev, struct bucket *b, unsigned long long now_us)
{
    static int warned;
    unsigned long long from = b->blind_from_us;
    int was_held = b->blind_held;
    b->blind_from_us = now_us;
    b->blind_held = b->held;
    unsigned long long heard = b->read_us > b->launched_us ? b->read_us : b->launched_us;
    int blind = b->rate == 0.0 && b->launched_us != 0 &&
                (b->blind || now_us > heard + blind_after_us);
    int launched = b->last_launch_us != b->blind_launch_us;
    b->blind_launch_us = b->last_launch_us;
    int running = !b->held && !was_held &&
                  __atomic_load_n(&b->drained_us, __ATOMIC_ACQUIRE) == 0 &&
                  (double)(now_us - b->last_launch_us) / 1e6 <= blind_tail_seconds;
    double cap = b->limit / 100.0 * credit_seconds;
    if (blind && b->prepaid > 0.0) {
        /* What was prepaid for a measurement that will not come: the charges below stand for
         * it, and while its share stays guessed a hold would leave it out. */
        vgpu_account_refund(dev, b->prepaid, cap);
        b->prepaid = 0.0;
        b->prepaying = 0;
        b->guessed = 0;
    }
    if (!blind || from == 0 || now_us <= from || !(launched || running))
        return;
    if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
        vgpu_log(VGPU_LOG_WARN, "SM limit: NVML gives no utilisation reading of device %d; until "
                 "it does, the time this process's work may run is charged as the whole GPU's",
                 dev);
    struct vgpu_reading busy = {.util = 100.0, .stamp_us = now_us, .since_us = from, .sampled = 1};
    vgpu_account_charge(dev, b->limit, &busy, control_seconds, cap, now_us);
}

/* Whether a launch waits for tokens and none has taken any since the rate law's last step, the
 * container's account holding it neither now nor before this reading (a hold's end empties the
 * bucket too). The rate law takes no step without demand, so a process whose launch costs more
 * than a control period's tokens stepped once a launch: in throttle-siblings the process started
 * second, held to a launch in 1.2 s, took 3 s to come up to its sibling. Such a period steps by
 * the balance between siblings alone (the rate law's step there made pairs of one process each
 * noisier under one-bit samples, hook/README.md). Only where NVML names all the container's
 * processes: otherwise its share is not told from its siblings'. */
static int starved(const struct bucket *b, int was_held)
{
    int64_t tokens = __atomic_load_n(&b->tokens, __ATOMIC_ACQUIRE); /* one reading for both */
    return tokens <= 0 && consumed_at(b, tokens) == b->consumed_at_control && b->rate > 0.0 &&
           !was_held && !b->held && __atomic_load_n(&b->waited, __ATOMIC_RELAXED) &&
           vgpu_region_host_pids_known();
}

/* A control step with NVML's new reading s, or none (NULL: one is under way, NVML being slow):
 * then the account, which other processes may have charged, still decides the hold. */
static void control(int dev, struct bucket *b, uint64_t now, const struct vgpu_sample *s)
{
    unsigned long long now_us = unix_ns() / 1000u;
    if (s == NULL) {
        hold(dev, b, now_us);
        blind_step(dev, b, now_us);
        return;
    }
    uint64_t taken = consumed(b);
    double seconds = (double)(now - b->control_ns) / 1e9;
    double demand = seconds > 0 ? (double)(taken - b->consumed_at_control) / seconds : 0.0;
    int was_held = b->held, averaged;
    double util = observe(dev, b, demand, s, &averaged);
    blind_step(dev, b, now_us);
    if (averaged && starved(b, was_held)) {
        double balance = vgpu_control_sibling_factor(b->own_avg, b->sibling_avg);
        if (balance > 1.0) {
            /* At most x2 a sample, no demand bounding it (none is seen while the launch waits):
             * repaying the debt lets the launch through, which ends these steps. */
            b->rate *= balance;
            vgpu_log(VGPU_LOG_DEBUG, "device %d: waiting for tokens (this process %.1f%%, its "
                     "largest sibling %.1f%%), rate %.0f tokens/s", dev, b->own_avg,
                     b->sibling_avg, b->rate);
        }
        return;
    }
    if (util < 0 || demand == 0.0)
        return; /* no measurement, or no launches to learn from: keep the current rate (or wait
                 * to calibrate it: a first period held back took nothing) */
    b->consumed_at_control = taken;
    b->control_ns = now;
    if (b->rate == 0.0) {
        /* First period ran free: start from what the application used, scaled to the limit. */
        double scale = util > 0.5 ? (double)b->limit / util : 1.0;
        b->rate = demand * (scale > 1.0 ? 1.0 : scale);
        if (b->rate < min_rate)
            b->rate = min_rate;
        wrote(b, __atomic_exchange_n(&b->tokens, 0, __ATOMIC_ACQ_REL), 0);
        return;
    }
    int throttled = __atomic_exchange_n(&b->waited, 0, __ATOMIC_RELAXED);
    b->rate = vgpu_control_next_rate(b->rate, (double)b->limit, util, demand, min_rate, throttled,
                                     vgpu_control_sibling_factor(b->own_avg, b->sibling_avg));
    vgpu_log(VGPU_LOG_DEBUG, "device %d: utilisation %.1f%% (limit %u%%; this process %.1f%%, "
             "its largest sibling %.1f%%), rate %.0f tokens/s%s", dev, util, b->limit, b->own_avg,
             b->sibling_avg, b->rate, throttled ? " (throttled)" : "");
}

static void sleep_ns(long ns)
{
    struct timespec ts = {.tv_sec = 0, .tv_nsec = ns};
    nanosleep(&ts, NULL);
}

/* The devices NVML is read on, a bit each: those with an SM limit this process launched on,
 * or whose launches wait for the container's hold to end. (Another device's account is
 * charged by the processes that run there; asking NVML of every device the limit names, all
 * 16 where it is set for all, took a slow NVML's time once for each device present.) */
static unsigned devices_to_read(void)
{
    unsigned devices = 0;
    for (int dev = 0; dev < VGPU_REGION_MAX_DEVICES; dev++) {
        const struct bucket *b = &buckets[dev];
        if (b->limit != 0 && (b->launched_us != 0 || b->held))
            devices |= 1u << dev;
    }
    return devices;
}

static void *watch(void *unused)
{
    (void)unused;
    /* A reading first, here rather than on the launching thread (NVML's first call may take
     * long): a process that exits before its first control period would never read one, and
     * the account, charged, tells its processes whether to hold back and to prepay. */
    struct vgpu_sample samples[VGPU_REGION_MAX_DEVICES];
    unsigned got = vgpu_sampler_collect(devices_to_read(), samples, first_reading_wait_ns);
    int averaged;
    for (int dev = 0; dev < VGPU_REGION_MAX_DEVICES; dev++)
        if (got & (1u << dev)) /* nothing of ours ran in a period NVML has closed yet */
            observe(dev, &buckets[dev], 0.0, &samples[dev], &averaged);
    for (unsigned tick = 1;; tick++) {
        sleep_ns(TICK_NS);
        int step = tick % CONTROL_TICKS == 0; /* a control step at this tick */
        got = step ? vgpu_sampler_collect(devices_to_read(), samples, reading_wait_ns) : 0;
        for (int dev = 0; dev < VGPU_REGION_MAX_DEVICES; dev++) {
            struct bucket *b = &buckets[dev];
            if (b->limit == 0)
                continue;
            unsigned long long now_us = unix_ns() / 1000u;
            uint64_t taken = consumed(b);
            if (b->launched_us == 0 && taken != 0)
                first_launch(dev, b, now_us - TICK_NS / 1000, taken);
            if (taken != b->consumed_at_tick) {
                /* Launches its rate would take a sample period to repay (a large kernel after
                 * light work): what they cost is not what NVML last measured. */
                double period = sample_period(dev, b);
                if (b->rate > 0.0 && (double)(taken - b->consumed_at_tick) > b->rate * period) {
                    b->own = 100.0;
                    b->guessed = 1;
                    b->unmeasured_us = now_us;
                }
                b->consumed_at_tick = taken;
                b->last_launch_us = now_us;
            }
            if (step)
                control(dev, b, monotonic_ns(), got & (1u << dev) ? &samples[dev] : NULL);
            prepay(dev, b, now_us);
            if (b->rate > 0.0 && !b->held)
                refill(b, TICK_NS / 1e9);
        }
    }
    return NULL;
}

static void after_fork_child(void)
{
    pthread_mutex_init(&watcher_lock, NULL);
    watcher_running = 0;
    watcher_failures = 0;
    vgpu_sampler_after_fork();
    for (int dev = 0; dev < VGPU_REGION_MAX_DEVICES; dev++) {
        other_context[dev] = 0; /* the child makes its own contexts */
        buckets[dev].rate = 0.0;
        buckets[dev].carry = 0.0;
        start_full(&buckets[dev]);
    }
}

/* Before the watcher runs: launches on b wait until its first reading (account) lifts the
 * hold, or the container's account ends it. */
static void hold_back(struct bucket *b)
{
    empty(b);
    b->held = 1;
}

/* Starts the watcher at the first launch, which is on device dev. */
static void start_watcher(int dev)
{
    /* A signal handler's launch while this thread starts it (locks.h) leaves it to the start
     * under way. */
    if (vgpu_lock_unless_mine(&watcher_lock) != 0)
        return;
    if (!watcher_running) {
        /* The first control period starts now, not when the library loaded. */
        for (int d = 0; d < VGPU_REGION_MAX_DEVICES; d++) {
            struct bucket *b = &buckets[d];
            b->control_ns = monotonic_ns();
            b->consumed_at_control = consumed(b);
            /* A container held back holds a process that starts in it from its first launch
             * (its first period would otherwise run free). */
            if (b->limit != 0 && container_held(d, b, unix_ns() / 1000u))
                hold_back(b);
        }
        if (!buckets[dev].held && buckets[dev].launched_us == 0)
            first_launch(dev, &buckets[dev], unix_ns() / 1000u, consumed(&buckets[dev]));
        int rc = vgpu_thread_start(watch);
        if (rc == 0) {
            __atomic_store_n(&watcher_running, 1, __ATOMIC_RELEASE);
            if (watcher_failures != 0)
                vgpu_log(VGPU_LOG_WARN, "the SM limiter thread started after %u failed tries",
                         watcher_failures);
            watcher_failures = 0;
        } else {
            /* Only the watcher refills the buckets. Without it the uncalibrated start's tokens
             * let every launch through, and a process can make thread creation fail on purpose
             * (RLIMIT_AS, RLIMIT_NPROC): so launches wait, held, and a waiting launch tries
             * again; the watcher's first reading lifts the hold (account). */
            for (int d = 0; d < VGPU_REGION_MAX_DEVICES; d++)
                if (buckets[d].limit != 0)
                    hold_back(&buckets[d]);
            if (watcher_failures++ == 0)
                vgpu_log(VGPU_LOG_ERROR, "cannot start the SM limiter thread (error %d); launches "
                         "wait until it starts (tried again every 0.1 s)", rc);
        }
    }
    vgpu_unlock(&watcher_lock);
}

void vgpu_throttle_init(void)
{
    int any = 0;
    for (int dev = 0; dev < VGPU_REGION_MAX_DEVICES; dev++) {
        buckets[dev].limit = vgpu_region_sm_limit(dev);
        start_full(&buckets[dev]);
        any |= buckets[dev].limit != 0;
    }
    if (any) {
        pthread_atfork(NULL, NULL, after_fork_child);
        vgpu_log(VGPU_LOG_INFO, "SM limit active (device 0: %u%%)", buckets[0].limit);
    }
    vgpu_throttle_enabled = any;
}

static uintptr_t this_thread(void)
{
    if (__builtin_expect(thread_name == 0, 0))
        thread_name = __atomic_add_fetch(&last_thread_name, 1, __ATOMIC_RELAXED);
    return thread_name;
}

/* A launch's thread (bucket.launcher) or stream (bucket.stream), `seen`, differs from the one
 * *slot names: the first names it (*slot was `none`), another makes it `several`. Out of line:
 * taken at most twice between resets. */
static __attribute__((noinline)) void note_other(uintptr_t *slot, uintptr_t none, uintptr_t seen,
                                                 uintptr_t several)
{
    uintptr_t was = none;
    if (!__atomic_compare_exchange_n(slot, &was, seen, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST) &&
        was != seen)
        __atomic_store_n(slot, several, __ATOMIC_SEQ_CST);
}

/* A launch ends a drain once it has its tokens: its work may run from here. (Ended when a launch
 * begins to wait, the share NVML measured, an average over such waits, is paid for them too,
 * which brought contention-chain-20 from 19.1-22.4 % to 19.0-20.9 % under 20, but moved
 * throttle-siblings' split further from even: the first process 18.8 % on average in 10 runs
 * against 16.8, hook/README.md.) */
static inline void end_drain(struct bucket *b)
{
    if (__atomic_load_n(&b->drained_us, __ATOMIC_SEQ_CST) != 0)
        __atomic_store_n(&b->drained_us, 0, __ATOMIC_SEQ_CST);
    /* an event recorded before this launch does not wait for it */
    if (__atomic_load_n(&b->events_fresh, __ATOMIC_SEQ_CST) != 0)
        __atomic_store_n(&b->events_fresh, 0, __ATOMIC_SEQ_CST);
}

/* Until the bucket of dev holds tokens. Out of line: a launch that finds them (most) then
 * needs no stack frame of its own. */
static __attribute__((noinline)) void wait_for_tokens(int dev, struct bucket *b)
{
    for (unsigned waits = 1; __atomic_load_n(&b->tokens, __ATOMIC_ACQUIRE) <= 0; waits++) {
        /* A signal handler's launch on a thread inside the library's locks (locks.h): the
         * watcher may be the one to wait for them (starting, or reaping without its sampler),
         * and nothing would refill the bucket before the handler returns. It runs, its tokens
         * taken (a debt the next periods pay). */
        if (vgpu_holds_a_lock())
            return;
        __atomic_store_n(&b->waited, 1, __ATOMIC_RELAXED);
        sleep_ns(WAIT_NS);
        if (waits % WATCHER_RETRY_WAITS == 0 &&
            !__atomic_load_n(&watcher_running, __ATOMIC_ACQUIRE))
            start_watcher(dev); /* it could not start: nothing else refills */
    }
}

/* What a launch takes: at most 2^56 tokens (months of any GPU's blocks). Larger, or wrapped past
 * 2^63 (a grid the driver refuses: 3 * 2^62 blocks), a cost taken as a negative number gave
 * tokens instead (a review found), and threads taking at once could wrap the bucket. */
static inline int64_t bounded(uint64_t cost)
{
    const uint64_t max_cost = UINT64_C(1) << 56;
    return (int64_t)(cost < max_cost ? cost : max_cost);
}

void vgpu_throttle_take(int dev, uint64_t cost)
{
    if (dev >= 0 && dev < VGPU_REGION_MAX_DEVICES && buckets[dev].limit != 0 && cost != 0)
        __atomic_sub_fetch(&buckets[dev].tokens, bounded(cost), __ATOMIC_ACQ_REL);
}

/* The gate's rare cases, in the order they matter: the watcher not started yet, no tokens
 * (wait), another thread or stream than the one named. Out of line, so that a launch that
 * meets none of them saves no registers (its calls are here). */
static __attribute__((noinline)) void gate_rare(int dev, struct bucket *b, uintptr_t stream)
{
    if (!__atomic_load_n(&watcher_running, __ATOMIC_ACQUIRE))
        start_watcher(dev);
    if (__atomic_load_n(&b->tokens, __ATOMIC_ACQUIRE) <= 0)
        wait_for_tokens(dev, b);
    /* Several launching threads, for good: a synchronisation on one may return before
     * another's launch, made while it ran, is done. */
    uintptr_t launcher = __atomic_load_n(&b->launcher, __ATOMIC_RELAXED);
    if (launcher != thread_name && launcher != several_launchers)
        note_other(&b->launcher, no_launcher, this_thread(), several_launchers);
    /* Several streams, until a drain of the whole context: a stream's synchronisation does
     * not wait for another's work. */
    uintptr_t named = __atomic_load_n(&b->stream, __ATOMIC_RELAXED);
    if (named != stream && named != several_streams)
        note_other(&b->stream, 0, stream, several_streams);
}

/* The bucket of dev, NULL where dev has no limit. */
static inline struct bucket *limited(int dev)
{
    return dev >= 0 && dev < VGPU_REGION_MAX_DEVICES && buckets[dev].limit != 0 ? &buckets[dev]
                                                                               : NULL;
}

/* Whether a launch on b's device, on the stream whose key is `stream`, meets none of
 * gate_rare's cases: most do. */
static inline int gate_open(const struct bucket *b, uintptr_t stream)
{
    uintptr_t launcher = __atomic_load_n(&b->launcher, __ATOMIC_RELAXED);
    uintptr_t named = __atomic_load_n(&b->stream, __ATOMIC_RELAXED);
    return __atomic_load_n(&watcher_running, __ATOMIC_ACQUIRE) &&
           __atomic_load_n(&b->tokens, __ATOMIC_ACQUIRE) > 0 &&
           (launcher == thread_name || launcher == several_launchers) &&
           (named == stream || named == several_streams);
}

void vgpu_throttle_wait(int dev, uintptr_t stream)
{
    struct bucket *b = limited(dev);
    if (b == NULL)
        return;
    if (!gate_open(b, stream))
        gate_rare(dev, b, stream);
    end_drain(b);
}

__thread __attribute__((tls_model("initial-exec"))) struct vgpu_unanswered vgpu_unanswered;

/* The calling thread's next unanswered call, on b (NULL: a device with no limit). */
static inline void remember(struct bucket *b, uint64_t cost)
{
    int64_t capped = bounded(cost);
    unsigned depth = vgpu_unanswered.depth;
    vgpu_unanswered.depth = depth + 1;
    if (__builtin_expect(depth >= VGPU_UNANSWERED, 0)) {
        if (b != NULL) /* no room to wait for the answer: taken at the gate */
            __atomic_sub_fetch(&b->tokens, capped, __ATOMIC_ACQ_REL);
        return;
    }
    /* The entry is taken before it is written: a signal handler's call in between uses the
     * next. */
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    vgpu_unanswered.calls[depth].tokens = b != NULL ? &b->tokens : NULL;
    vgpu_unanswered.calls[depth].cost = capped;
}

/* vgpu_throttle_launch on dev's bucket b through gate_rare. Out of line and called last: the
 * common path then makes no call and saves no registers. */
static __attribute__((noinline)) void launch_rare(int dev, struct bucket *b, uint64_t cost,
                                                  uintptr_t stream)
{
    gate_rare(dev, b, stream);
    end_drain(b);
    remember(b, cost);
}

void vgpu_throttle_launch(int dev, uint64_t cost, uintptr_t stream)
{
    struct bucket *b = limited(dev);
    if (b != NULL) {
        if (__builtin_expect(!gate_open(b, stream), 0)) {
            launch_rare(dev, b, cost, stream);
            return;
        }
        end_drain(b);
    }
    remember(b, cost);
}

/* Whether thread me's synchronisation on dev of stream (VGPU_ALL_STREAMS: the context's) may
 * cover all the process's work there (throttle.h). */
static int may_drain(int dev, uintptr_t stream, uintptr_t me)
{
    if (dev < 0 || dev >= VGPU_REGION_MAX_DEVICES || buckets[dev].limit == 0 ||
        __atomic_load_n(&other_context[dev], __ATOMIC_ACQUIRE))
        return 0; /* no limit here, or a context the synchronisation of this one does not cover */
    const struct bucket *b = &buckets[dev];
    if (__atomic_load_n(&b->launcher, __ATOMIC_SEQ_CST) != me)
        return 0; /* another thread launched here (or none did) */
    /* a stream's: only where every launch since the context's last drain went to it */
    return stream == VGPU_ALL_STREAMS || __atomic_load_n(&b->stream, __ATOMIC_SEQ_CST) == stream;
}

int vgpu_throttle_may_drain(int dev, uintptr_t stream)
{
    return may_drain(dev, stream, this_thread());
}

void vgpu_throttle_synced(int dev, uintptr_t stream)
{
    uintptr_t me = this_thread();
    if (!may_drain(dev, stream, me))
        return;
    struct bucket *b = &buckets[dev];
    __atomic_store_n(&b->drained_us, unix_ns() / 1000u, __ATOMIC_SEQ_CST);
    /* A second thread whose first launch came after the check above either sees the drain
     * (and its launch ends it) or is seen here: its launch may run on. */
    if (__atomic_load_n(&b->launcher, __ATOMIC_SEQ_CST) != me) {
        __atomic_store_n(&b->drained_us, 0, __ATOMIC_SEQ_CST);
        return;
    }
    /* The lines gpu-check.sh section 14 counts: which of a framework's waits drain. */
    if (stream == VGPU_ALL_STREAMS) {
        __atomic_store_n(&b->stream, 0, __ATOMIC_SEQ_CST); /* no stream has work left */
        vgpu_log(VGPU_LOG_DEBUG, "device %d: drained by a wait for the context: nothing is "
                 "prepaid until the next launch", dev);
    } else {
        vgpu_log(VGPU_LOG_DEBUG, "device %d: drained by a wait for stream %#lx: nothing is "
                 "prepaid until the next launch", dev, (unsigned long)stream);
    }
}

void vgpu_throttle_stream_gone(int dev, uintptr_t stream)
{
    if (dev >= 0 && dev < VGPU_REGION_MAX_DEVICES && buckets[dev].limit != 0)
        __atomic_compare_exchange_n(&buckets[dev].stream, &stream, several_streams, 0,
                                    __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

void vgpu_throttle_context_made(int dev)
{
    if (dev >= 0 && dev < VGPU_REGION_MAX_DEVICES)
        __atomic_store_n(&other_context[dev], 1, __ATOMIC_RELEASE);
}

/* Records and destroys of events, by any thread: a count the record that keeps an event
 * compares (vgpu_throttle_event_recorded). */
static unsigned long event_changes;
/* Records begun and not yet ended (vgpu_throttle_event_recording .. _recorded), by any thread:
 * one may have reached the driver and not yet forgotten the event it records again. */
static unsigned long records_under_way;
/* Set once the process made or opened an interprocess event (vgpu_throttle_events_shared). */
static int events_shared;
/* Bit dev: device dev's bucket has kept an event (keep_event), so that forgetting one reads
 * those lists alone. Scanning every limited device's (all 16 where the limit is set for all),
 * a record ran 1057 instructions of the library's, now 330 (hook/README.md, "Overhead").
 * Never cleared, nor after fork (a bit set for nothing costs a scan). */
static unsigned events_kept_on;
_Static_assert(VGPU_REGION_MAX_DEVICES <= 32, "events_kept_on has a bit a device");

void vgpu_throttle_events_shared(void)
{
    __atomic_store_n(&events_shared, 1, __ATOMIC_SEQ_CST);
}

/* No device keeps event any more. A bucket that keeps an event for the first time sets its
 * device's bit before keeping it, and then looks at event_changes: a forgetting that read the
 * bits before that counted itself there first (event_changed), so the keeper forgets the event
 * again, or does not keep it (a change since its record began). */
static void forget_event(uintptr_t event)
{
    unsigned on = __atomic_load_n(&events_kept_on, __ATOMIC_SEQ_CST);
    for (int dev = 0; event != 0 && dev < VGPU_REGION_MAX_DEVICES && (on >> dev) != 0; dev++)
        for (int i = 0; (on >> dev & 1) != 0 && i < KEPT_EVENTS; i++) {
            uintptr_t was = event; /* read first: a locked exchange costs every record ~20 ns */
            if (__atomic_load_n(&buckets[dev].events[i], __ATOMIC_SEQ_CST) == event)
                __atomic_compare_exchange_n(&buckets[dev].events[i], &was, 0, 0,
                                            __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
        }
}

/* A record of event has returned, or its destroy is about to be made: counted, then forgotten
 * everywhere. */
static unsigned long event_changed(uintptr_t event)
{
    unsigned long now = __atomic_add_fetch(&event_changes, 1, __ATOMIC_SEQ_CST);
    forget_event(event);
    return now;
}

void vgpu_throttle_event_gone(uintptr_t event)
{
    event_changed(event);
}

unsigned long vgpu_throttle_event_recording(void)
{
    __atomic_add_fetch(&records_under_way, 1, __ATOMIC_SEQ_CST);
    return __atomic_load_n(&event_changes, __ATOMIC_SEQ_CST);
}

/* Keeps event on dev's bucket, this thread's (may_drain). Only this thread launches here, and
 * only a launch ends freshness: the list is this thread's to start again. A launch by another
 * from here on makes it one of several, and no wait drains. */
static void keep_event(int dev, uintptr_t stream, uintptr_t event)
{
    struct bucket *b = &buckets[dev];
    if (!(__atomic_load_n(&events_kept_on, __ATOMIC_SEQ_CST) >> dev & 1))
        __atomic_fetch_or(&events_kept_on, 1u << dev, __ATOMIC_SEQ_CST);
    if (!__atomic_load_n(&b->events_fresh, __ATOMIC_ACQUIRE)) {
        for (int i = 0; i < KEPT_EVENTS; i++)
            __atomic_store_n(&b->events[i], 0, __ATOMIC_RELAXED);
        b->next_event = 0;
        __atomic_store_n(&b->events_stream, stream, __ATOMIC_RELAXED);
        __atomic_store_n(&b->events_fresh, 1, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&b->events[b->next_event++ % KEPT_EVENTS], event, __ATOMIC_SEQ_CST);
}

/* Another thread may record the same event meanwhile, and the driver take its record after
 * this one. Every record counts itself once its call returned and forgets the event, so this
 * one keeps it only where no other record or destroy (of any event) returned since this one
 * began (`since`: then another's call of this event ended before this one began, and this
 * one's capture stands), and forgets it again where one returned while it was being kept
 * (whose own forgetting may have come first). */
void vgpu_throttle_event_recorded(int dev, uintptr_t stream, uintptr_t event,
                                  unsigned long since)
{
    unsigned long mine = event_changed(event);
    if (event != 0 && mine == since + 1 && !__atomic_load_n(&events_shared, __ATOMIC_SEQ_CST) &&
        may_drain(dev, stream, this_thread())) {
        keep_event(dev, stream, event);
        if (__atomic_load_n(&event_changes, __ATOMIC_SEQ_CST) != mine)
            forget_event(event);
    }
    __atomic_sub_fetch(&records_under_way, 1, __ATOMIC_SEQ_CST);
}

/* Not while another record is under way: its driver call may have made the event wait for
 * other work (done at once, say) before it forgets the event. */
void vgpu_throttle_event_done(uintptr_t event)
{
    if (__atomic_load_n(&records_under_way, __ATOMIC_SEQ_CST) != 0)
        return;
    unsigned on = __atomic_load_n(&events_kept_on, __ATOMIC_ACQUIRE);
    for (int dev = 0; event != 0 && dev < VGPU_REGION_MAX_DEVICES && (on >> dev) != 0; dev++) {
        struct bucket *b = &buckets[dev];
        if (!(on >> dev & 1) || !__atomic_load_n(&b->events_fresh, __ATOMIC_ACQUIRE))
            continue;
        for (int i = 0; i < KEPT_EVENTS; i++)
            if (__atomic_load_n(&b->events[i], __ATOMIC_ACQUIRE) == event) {
                vgpu_throttle_synced(dev, __atomic_load_n(&b->events_stream, __ATOMIC_RELAXED));
                break;
            }
    }
}
