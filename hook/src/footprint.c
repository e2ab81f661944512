/* footprint.c - what a process really holds on a capped device beyond its allocations: its CUDA
 * contexts, the modules the driver loads lazily, library workspaces. NVML lists each process's
 * device memory by host pid; the difference from the allocations this process counts is charged
 * to its ledger, so the cap bounds what the container holds, not only what it asked for (on an
 * H100 a context is about 0.5 GiB). Measured on the process's allocation paths and, once it has
 * a context on a capped device, by a thread of its own once a second: memory it comes to hold
 * without an allocation (lazily loaded modules, a module's globals, what the library only
 * measures) is counted even while it only launches or sleeps. Also where a process learns its
 * host pid, which the SM limiter needs to find its own samples. */
#define _GNU_SOURCE
#include "footprint.h"

#include <pthread.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "locks.h"
#include "log.h"
#include "memory.h"
#include "nvml.h"
#include "region.h"
#include "threads.h"
#include "throttle.h"
#include "util.h"

enum {
    REFRESH_NS = 1000 * 1000 * 1000,        /* re-measure at most once a second per device */
    REFUSAL_REFRESH_NS = 100 * 1000 * 1000, /* and before a refusal, at most every 100 ms */
    HYSTERESIS = 2 << 20,                   /* NVML counts in 2 MiB pages */
    DISCOVERY_PATIENCE_MS = 30 * 1000,      /* processes starting together take turns */
    MEASURE_TRIES = 5,                      /* an allocation of another thread under way */
    LEARN_MIN_BYTES = 4 << 20,              /* an allocation NVML's 2 MiB pages show */
    LEARN_SLACK = 4 << 20,                  /* rounding to pages, a pool's granularity */
    LEARN_CANDIDATES = 8,                   /* pids new at once, at most, to tell apart */
};
static const uint64_t LEARN_EVERY_NS = 1000 * 1000 * 1000;       /* the first wait between tries */
static const uint64_t LEARN_PATIENCE_NS = 64ull * 1000 * 1000 * 1000; /* the longest */

/* Per device: one measurement at a time. Never held by a thread that is inside the driver for
 * another device; a thread re-entering (a driver callback that makes a context) skips. */
static pthread_mutex_t locks[VGPU_REGION_MAX_DEVICES];
static uint64_t counted[VGPU_REGION_MAX_DEVICES];     /* atomic: context memory in our ledger */
static int measurable[VGPU_REGION_MAX_DEVICES]; /* atomic: a measurement of it succeeded */
/* The part of counted[] that stream-ordered frees left in pools, per pool (under locks[dev]),
 * each at most what its pool caches when last asked (pool_cache_of); pooled[] is their sum
 * (atomic, for a lock-free "none"). */
enum { KEPT_POOLS = 4 };
static struct kept {
    uintptr_t pool;
    uint64_t bytes;
} kept[VGPU_REGION_MAX_DEVICES][KEPT_POOLS];
static uint64_t pooled[VGPU_REGION_MAX_DEVICES];
static uint64_t (*pool_cache_of)(uintptr_t pool);
static int has_context[VGPU_REGION_MAX_DEVICES];      /* atomic: a context made on the device */
static int released[VGPU_REGION_MAX_DEVICES]; /* atomic: one released since the last one made */
/* Created contexts (cuCtxCreate) not destroyed yet, by device, and the handles of up to
 * CREATED_KEPT of them (a destroy names only its handle); under created_lock. One not kept
 * stays counted as alive: its destroy cannot be told from another context's. */
enum { CREATED_KEPT = 64 };
static pthread_mutex_t created_lock = PTHREAD_MUTEX_INITIALIZER;
static int created_alive[VGPU_REGION_MAX_DEVICES];
static struct created {
    const void *ctx; /* NULL: a free entry */
    int dev;
} created_kept[CREATED_KEPT];
static uint64_t unlisted_since[VGPU_REGION_MAX_DEVICES]; /* CLOCK_MONOTONIC ns: the first of the
                                                          * measurements in a row that did not
                                                          * list it (0: the last did); under
                                                          * locks[dev] */
static uint64_t measured_at[VGPU_REGION_MAX_DEVICES]; /* atomic: CLOCK_MONOTONIC ns */
static __thread int inside;
static int unmeasured_warned;
/* One try at a time to learn the host pid from an allocation (learn_busy, atomic); the rest is
 * the trying thread's while it holds that. */
static int learn_busy;
static uint64_t learn_tried_at, learn_tried_before; /* CLOCK_MONOTONIC ns of this try, the last */
static uint64_t learn_every_ns;                     /* the wait before the next try */
static int learn_dev, learn_nbefore;
static struct vgpu_gpu_process learn_list[VGPU_NVML_MAX_PROCESSES]; /* NVML's, before */
/* The pids that were new when this process's context was made and could not be told apart:
 * ours is one of them, and only one of them may be learnt later. */
static int32_t candidates[LEARN_CANDIDATES];
static int ncandidates; /* atomic: written under the footprint lock, before it is read */
static int pid_is_hosts_answer = -1; /* atomic: pid_is_hosts(), once asked (-1: not yet) */
static int not_listed_warned;
static int watcher_started; /* atomic: the measuring thread was started (or its start failed) */
static void start_watcher(void);

static void reset(void)
{
    /* A CUDA context does not survive fork: the child starts with nothing counted (and a slot
     * of its own, whose host pid it learns when it makes its own context). */
    for (int d = 0; d < VGPU_REGION_MAX_DEVICES; d++) {
        pthread_mutex_init(&locks[d], NULL);
        counted[d] = measured_at[d] = pooled[d] = 0;
        has_context[d] = measurable[d] = released[d] = created_alive[d] = 0;
        unlisted_since[d] = 0;
        for (int k = 0; k < KEPT_POOLS; k++)
            kept[d][k] = (struct kept){0};
    }
    pthread_mutex_init(&created_lock, NULL);
    memset(created_kept, 0, sizeof created_kept);
    learn_busy = 0;
    learn_tried_at = 0;
    learn_every_ns = LEARN_EVERY_NS;
    ncandidates = 0;
    pid_is_hosts_answer = -1; /* the parent may have made a pid namespace for its children */
    watcher_started = 0;      /* fork copies no thread: the child starts its own, if it needs one */
}

void vgpu_footprint_init(uint64_t (*cache_of)(uintptr_t pool))
{
    pool_cache_of = cache_of;
    reset();
    pthread_atfork(NULL, NULL, reset);
}

static int capped(int dev)
{
    return dev >= 0 && dev < VGPU_REGION_MAX_DEVICES && vgpu_region_limit(dev) != 0;
}

static uint64_t counted_everywhere(void)
{
    uint64_t sum = 0;
    for (int d = 0; d < VGPU_REGION_MAX_DEVICES; d++)
        sum += load64(&counted[d]);
    return sum;
}

static const struct vgpu_gpu_process *find(const struct vgpu_gpu_process *list, int n,
                                           int32_t pid)
{
    for (int i = 0; i < n; i++)
        if (list[i].pid == pid)
            return &list[i];
    return NULL;
}

/* Whether getpid() is the pid NVML lists this process by: only in the host's pid namespace,
 * whose inode is fixed (the kernel's PROC_PID_INIT_INO). In a container's, our pid may be
 * another tenant's host pid, and taking it made that tenant's memory the one measured as ours:
 * when it exited, this process's context went uncounted. */
static int pid_is_hosts(void)
{
    int answer = __atomic_load_n(&pid_is_hosts_answer, __ATOMIC_RELAXED);
    if (answer >= 0)
        return answer;
    char link[64];
    ssize_t len = readlink("/proc/self/ns/pid", link, sizeof link - 1);
    if (len > 0)
        link[len] = '\0';
    answer = len > 0 && strcmp(link, "pid:[4026531836]") == 0;
    __atomic_store_n(&pid_is_hosts_answer, answer, __ATOMIC_RELAXED);
    return answer;
}

/* Whether pid may be ours: one of the pids that were new at a first context on another device,
 * or any, with none remembered (learn_host_pid). */
static int candidate(int32_t pid)
{
    int n = __atomic_load_n(&ncandidates, __ATOMIC_ACQUIRE);
    for (int i = 0; i < n; i++)
        if (candidates[i] == pid)
            return 1;
    return n == 0;
}

/* Our host pid from the lists NVML gave before and after this process made a context on dev:
 * the one pid new in the second that no other process of the container has claimed, or our
 * own pid among the new ones (in the host's pid namespace, pid_is_hosts). Two candidates
 * (another container made a context at the same moment): remembered, and told apart by an
 * allocation (below). This rests
 * on NVML listing every process "with a compute context" (nvml.h), ours as soon as it is made:
 * were ours left out, a neighbour's context made meanwhile would be the one new pid, and taken
 * for ours (its GPU time then charged to this container: tests/run.sh,
 * contention-30-60-slow-context, and gpu-check.sh's section 6 checks it on a GPU). */
static void learn_host_pid(const struct vgpu_gpu_process *before, int nbefore,
                           const struct vgpu_gpu_process *after, int nafter)
{
    int32_t fresh[LEARN_CANDIDATES];
    int n = 0;
    for (int i = 0; i < nafter; i++) {
        /* Candidates remembered from a first context on another device: ours is among them. */
        if (find(before, nbefore, after[i].pid) != NULL ||
            vgpu_region_host_pid_taken(after[i].pid) || !candidate(after[i].pid))
            continue;
        if (after[i].pid == (int32_t)getpid() && pid_is_hosts()) {
            n = 1;
            fresh[0] = after[i].pid;
            break;
        }
        if (n < LEARN_CANDIDATES)
            fresh[n] = after[i].pid;
        n++;
    }
    if (n == 1) {
        if (vgpu_region_claim_host_pid(fresh[0]))
            vgpu_log(VGPU_LOG_INFO, "host pid %d (NVML's name for this process)", (int)fresh[0]);
    } else if (n > 1 && n <= LEARN_CANDIDATES) {
        for (int i = 0; i < n; i++)
            candidates[i] = fresh[i];
        __atomic_store_n(&ncandidates, n, __ATOMIC_RELEASE);
    }
}

/* A host pid left unknown at the context is learnt from an allocation: the one candidate, not
 * claimed by another process of the container, that NVML shows grown by the allocation's size
 * across it. Tries back off from 1 s to a minute while nothing is learnt. Only among the pids
 * remembered at the context: with none (NVML's lists failed then, or the discovery lock was not
 * had), an allocation alone cannot tell our growth from another container's of the same size at
 * the same moment, and a pid learnt wrongly measures that process in place of this one. */
int vgpu_footprint_learn_before(int dev, uint64_t bytes)
{
    if (bytes < LEARN_MIN_BYTES || vgpu_region_host_pid() != 0 || dev < 0 ||
        dev >= VGPU_REGION_MAX_DEVICES || !__atomic_load_n(&has_context[dev], __ATOMIC_ACQUIRE) ||
        __atomic_load_n(&ncandidates, __ATOMIC_ACQUIRE) == 0)
        return 0;
    int idle = 0;
    if (!__atomic_compare_exchange_n(&learn_busy, &idle, 1, 0, __ATOMIC_ACQUIRE,
                                     __ATOMIC_RELAXED))
        return 0;
    uint64_t now = monotonic_ns();
    if (learn_tried_at != 0 && now - learn_tried_at < learn_every_ns) {
        __atomic_store_n(&learn_busy, 0, __ATOMIC_RELEASE);
        return 0;
    }
    learn_tried_before = learn_tried_at;
    learn_tried_at = now;
    learn_dev = dev;
    learn_nbefore = vgpu_nvml_processes(dev, learn_list, VGPU_NVML_MAX_PROCESSES);
    if (learn_nbefore < 0)
        __atomic_store_n(&learn_busy, 0, __ATOMIC_RELEASE);
    return learn_nbefore >= 0;
}

/* The one candidate that grew by bytes since learn_before's list, claimed; 0 when none or two. */
static int32_t grown_by(uint64_t bytes)
{
    static struct vgpu_gpu_process after[VGPU_NVML_MAX_PROCESSES]; /* under learn_busy */
    int nafter = vgpu_nvml_processes(learn_dev, after, VGPU_NVML_MAX_PROCESSES);
    int32_t found = 0;
    int alike = 0;
    for (int i = 0; i < nafter; i++) {
        const struct vgpu_gpu_process *was = find(learn_list, learn_nbefore, after[i].pid);
        if (was == NULL || was->bytes == VGPU_NVML_BYTES_UNKNOWN ||
            after[i].bytes == VGPU_NVML_BYTES_UNKNOWN || after[i].bytes < was->bytes + bytes ||
            after[i].bytes > was->bytes + bytes + LEARN_SLACK || !candidate(after[i].pid) ||
            vgpu_region_host_pid_taken(after[i].pid))
            continue;
        alike++;
        found = after[i].pid;
    }
    return alike == 1 && vgpu_region_claim_host_pid(found) ? found : 0;
}

void vgpu_footprint_learn_after(uint64_t allocated, int retry_soon)
{
    int32_t found = allocated != 0 ? grown_by(allocated) : 0;
    if (found != 0) {
        __atomic_store_n(&measured_at[learn_dev], 0, __ATOMIC_RELAXED); /* measure next call */
        vgpu_log(VGPU_LOG_INFO, "host pid %d (NVML's name for this process, learnt from an "
                 "allocation)", (int)found);
    } else if (allocated == 0 && retry_soon) {
        learn_tried_at = learn_tried_before; /* this one does not count as a try */
    } else if (allocated != 0) {
        learn_every_ns = learn_every_ns < LEARN_PATIENCE_NS ? learn_every_ns * 2 : learn_every_ns;
    }
    __atomic_store_n(&learn_busy, 0, __ATOMIC_RELEASE);
}

enum { HELD_UNKNOWN = -1, HELD_NOT_LISTED = -2 };

/* What NVML shows this process holding on dev beyond its counted allocations. HELD_NOT_LISTED:
 * our host pid is known and NVML lists no memory of ours (no context left). HELD_UNKNOWN: it
 * cannot be told now (no NVML answer, the pid unknown, an allocation or free under way). */
static int64_t measure_once(int dev)
{
    int32_t pid = vgpu_region_host_pid();
    if (pid == 0 && !pid_is_hosts())
        return HELD_UNKNOWN;
    struct vgpu_gpu_process list[VGPU_NVML_MAX_PROCESSES];
    uint64_t epoch = vgpu_mem_quiet_epoch();
    uint64_t allocated = vgpu_mem_tracked(dev);
    int n = epoch != 0 ? vgpu_nvml_processes(dev, list, VGPU_NVML_MAX_PROCESSES) : -1;
    if (n < 0 || vgpu_mem_quiet_epoch() != epoch || vgpu_mem_tracked(dev) != allocated)
        return HELD_UNKNOWN;
    const struct vgpu_gpu_process *mine = find(list, n, pid != 0 ? pid : (int32_t)getpid());
    if (mine == NULL)
        return pid != 0 ? HELD_NOT_LISTED : HELD_UNKNOWN;
    if (mine->bytes == VGPU_NVML_BYTES_UNKNOWN)
        return HELD_UNKNOWN;
    return mine->bytes > allocated ? (int64_t)(mine->bytes - allocated) : 0;
}

static int64_t measure(int dev, int tries)
{
    int64_t held = measure_once(dev);
    for (int i = 1; i < tries && held == HELD_UNKNOWN; i++) {
        usleep(1000);
        held = measure_once(dev);
    }
    if (held >= 0)
        __atomic_store_n(&measurable[dev], 1, __ATOMIC_RELAXED);
    return held;
}

/* Each pool's kept bytes down to what the pool caches now, and their sum to at most limit;
 * returns how much that took off. Caller holds locks[dev]. */
static uint64_t bound_kept(int dev, uint64_t limit)
{
    uint64_t dropped = 0, sum = 0;
    for (int k = 0; k < KEPT_POOLS; k++) {
        struct kept *e = &kept[dev][k];
        if (e->bytes == 0)
            continue;
        /* (With no room left, the pool is not asked: it may be one destroyed since.) */
        uint64_t cached = pool_cache_of != NULL && sum < limit ? pool_cache_of(e->pool) : 0;
        uint64_t keep = e->bytes < cached ? e->bytes : cached;
        keep = keep < limit - sum ? keep : limit - sum;
        dropped += e->bytes - keep;
        sum += keep;
        e->bytes = keep;
    }
    __atomic_sub_fetch(&pooled[dev], dropped, __ATOMIC_ACQ_REL);
    return dropped;
}

/* counted[dev] becomes a measurement, which shows what pools cache as it is now (a pool may have
 * given back, at a synchronisation, what frees left in it). Caller holds locks[dev]. */
static void set_measured(int dev, uint64_t bytes)
{
    __atomic_store_n(&counted[dev], bytes, __ATOMIC_RELEASE);
    if (load64(&pooled[dev]) != 0)
        bound_kept(dev, bytes);
}

/* Moves the ledger to a measurement; shrinking gives back. Growth is reserved, and -1 answered
 * with nothing changed when it does not fit, for a context made now (refusable); otherwise it
 * is charged even past the cap (the memory is held already; further allocations are refused).
 * Caller holds locks[dev]. */
static int move_to(int dev, uint64_t now_bytes, int refusable)
{
    uint64_t before = load64(&counted[dev]);
    if (now_bytes > before &&
        (refusable ? vgpu_mem_reserve(dev, now_bytes - before, "a new CUDA context")
                   : vgpu_region_charge(dev, now_bytes - before)) != 0)
        return -1;
    if (now_bytes < before)
        vgpu_region_release(dev, before - now_bytes);
    set_measured(dev, now_bytes);
    return 0;
}

/* A measurement of memory already held. A context that could not be measured when it was made
 * (its host pid learnt later) sets the estimate the container's next first context reserves. */
static void settle_to(int dev, uint64_t now_bytes)
{
    if (move_to(dev, now_bytes, 0) != 0)
        return;
    uint64_t estimate = vgpu_region_context_estimate(dev) == 0 ? now_bytes : 0;
    vgpu_region_note_context(dev, estimate, counted_everywhere());
}

static void warn_unmeasured(int dev)
{
    if (!__atomic_exchange_n(&unmeasured_warned, 1, __ATOMIC_RELAXED))
        vgpu_log(VGPU_LOG_WARN, "device %d: the memory of this process's CUDA context could not "
                 "be measured through NVML yet (its host pid unknown, or NVML cannot say); %llu "
                 "bytes are counted for it until it can", dev,
                 (unsigned long long)load64(&counted[dev]));
}

/* A primary context retained again while we hold one: the driver hands out the same one. */
static int makes_nothing(int dev, int (*makes_one)(int dev))
{
    return makes_one != NULL && __atomic_load_n(&has_context[dev], __ATOMIC_ACQUIRE) &&
           !makes_one(dev);
}

int vgpu_footprint_before_context(int dev, int (*makes_one)(int dev), int reserve,
                                  struct vgpu_context_probe *p)
{
    p->dev = dev;
    p->active = 0;
    int discover = vgpu_region_host_pid() == 0 && dev >= 0 && dev < VGPU_REGION_MAX_DEVICES &&
                   vgpu_throttle_enabled;
    if ((!capped(dev) && !discover) || inside || makes_nothing(dev, makes_one))
        return 0;
    inside = 1;
    vgpu_lock(&locks[dev]);
    /* Asked again: another thread's retain may have made it while this one waited. */
    if (makes_nothing(dev, makes_one)) {
        vgpu_unlock(&locks[dev]);
        inside = 0;
        return 0;
    }
    p->active = 1;
    p->ledger = capped(dev);
    p->first = !__atomic_load_n(&has_context[dev], __ATOMIC_ACQUIRE);
    p->estimate = 0;
    p->discovering = 0;
    /* Only a first context on dev can tell: with one already, this process is in the list
     * before, and a pid new after it is another process's (one starting meanwhile). */
    if (vgpu_region_host_pid() == 0 && p->first) {
        if (vgpu_region_lock_discovery(dev, DISCOVERY_PATIENCE_MS) == 0) {
            vgpu_log_defer_begin(); /* until the lock is released (log.h) */
            p->discovering = 1;
            p->nbefore = vgpu_nvml_processes(dev, p->before, VGPU_NVML_MAX_PROCESSES);
        } else {
            vgpu_log(VGPU_LOG_WARN, "device %d: gave up waiting %d s for another process of the "
                     "container to learn its host pid", dev, DISCOVERY_PATIENCE_MS / 1000);
        }
    }
    /* A context the driver makes now: reserve what the container's first context took last
     * time, so that one which cannot fit is refused before the driver makes it, and one that
     * cannot be measured once made stays counted (before, a context after the first was
     * neither: another thread's allocations under way leave a measurement unanswered). */
    if (p->ledger && reserve) {
        uint64_t estimate = vgpu_region_context_estimate(dev);
        /* Refused like an allocation: reaped dead processes first, logged, counted. */
        if (estimate != 0 && vgpu_mem_reserve(dev, estimate, "a new CUDA context") != 0) {
            vgpu_footprint_after_context(p, 0);
            return -1;
        }
        p->estimate = estimate;
        __atomic_add_fetch(&counted[dev], estimate, __ATOMIC_ACQ_REL);
    }
    return 0;
}

/* Charges what the context holds once it is made; -1 when a new context does not fit. */
static int charge_context(struct vgpu_context_probe *p)
{
    int dev = p->dev;
    int64_t held = measure(dev, MEASURE_TRIES);
    if (held < 0) {
        warn_unmeasured(dev);
        return 0; /* the estimate stays counted; refresh() tries again */
    }
    __atomic_store_n(&measured_at[dev], monotonic_ns(), __ATOMIC_RELAXED);
    /* Every context measured here is one the driver made now, the process's first on dev or
     * another: refused when it does not fit (before, every context after the first was charged
     * past the cap). */
    if (move_to(dev, (uint64_t)held, 1) != 0)
        return -1;
    /* The container's first context on dev sets the estimate its next ones reserve. */
    vgpu_region_note_context(dev, p->first ? (uint64_t)held : 0, counted_everywhere());
    return 0;
}

int vgpu_footprint_after_context(struct vgpu_context_probe *p, int created)
{
    if (!p->active)
        return 0;
    int dev = p->dev, rc = 0;
    if (p->discovering) {
        if (created && p->nbefore >= 0) {
            struct vgpu_gpu_process after[VGPU_NVML_MAX_PROCESSES];
            int nafter = vgpu_nvml_processes(dev, after, VGPU_NVML_MAX_PROCESSES);
            if (nafter >= 0)
                learn_host_pid(p->before, p->nbefore, after, nafter);
        }
        vgpu_region_unlock_discovery(dev);
        vgpu_log_defer_end();
    }
    if (created) {
        __atomic_store_n(&released[dev], 0, __ATOMIC_RELEASE);
        __atomic_store_n(&has_context[dev], 1, __ATOMIC_RELEASE);
        if (capped(dev))
            start_watcher();
    }
    if (created && p->ledger)
        rc = charge_context(p);
    if ((!created || rc != 0) && p->estimate != 0) {
        vgpu_region_release(dev, p->estimate);
        __atomic_sub_fetch(&counted[dev], p->estimate, __ATOMIC_ACQ_REL);
    }
    vgpu_unlock(&locks[dev]);
    inside = 0;
    return rc;
}

/* Whether a context the library saw made may be alive on dev: the primary context is active,
 * or a created one was not destroyed. */
static int contexts_alive(int dev)
{
    return __atomic_load_n(&created_alive[dev], __ATOMIC_ACQUIRE) > 0 ||
           vgpu_primary_context_active(dev);
}

/* NVML does not list our host pid on dev. After a release there that left no context alive,
 * none is left (one measured at the release itself may have found NVML busy or slow; memory
 * that outlives a context, a VMM handle, may have kept the process listed since). With none
 * released since the last made, or a context still alive (a release that left the primary
 * context, or a created one: before, that release stood for any later unlisting, and what was
 * left went uncounted, 1309 MiB on a 1 GiB cap), the pid was another process's, which has
 * exited: taken for no context left, this one's memory went uncounted. Its count stays, and
 * once that has held for a second (a release under way in another thread is marked only after
 * the driver's call), the pid is forgotten, so that the limiter no longer reads that process's
 * samples for this one's (whole-GPU readings stand in). Caller holds locks[dev]. */
static void not_listed(int dev)
{
    if (__atomic_load_n(&released[dev], __ATOMIC_ACQUIRE) && !contexts_alive(dev)) {
        settle_to(dev, 0);
        __atomic_store_n(&has_context[dev], 0, __ATOMIC_RELEASE);
        unlisted_since[dev] = 0;
        return;
    }
    uint64_t now = monotonic_ns();
    if (unlisted_since[dev] == 0)
        unlisted_since[dev] = now;
    if (now - unlisted_since[dev] < REFRESH_NS)
        return;
    int32_t pid = vgpu_region_host_pid();
    vgpu_region_forget_host_pid(pid);
    if (!__atomic_exchange_n(&not_listed_warned, 1, __ATOMIC_RELAXED))
        vgpu_log(VGPU_LOG_WARN, "device %d: NVML no longer lists host pid %d, which this process "
                 "took for its own, while it holds a context: the pid is forgotten, and the %llu "
                 "bytes counted for the context stay counted", dev, (int)pid,
                 (unsigned long long)load64(&counted[dev]));
}

/* Re-measures dev when the last measurement is older than period_ns. */
static void refresh(int dev, uint64_t period_ns)
{
    if (!__atomic_load_n(&has_context[dev], __ATOMIC_ACQUIRE) || !capped(dev) || inside)
        return;
    uint64_t now = monotonic_ns();
    if (now - __atomic_load_n(&measured_at[dev], __ATOMIC_RELAXED) < period_ns ||
        vgpu_trylock(&locks[dev]) != 0)
        return;
    __atomic_store_n(&measured_at[dev], now, __ATOMIC_RELAXED);
    int64_t held = measure(dev, 1);
    int64_t was = (int64_t)load64(&counted[dev]);
    if (held >= 0)
        unlisted_since[dev] = 0;
    if (held == HELD_NOT_LISTED)
        not_listed(dev);
    else if (held >= 0 && (held > was + HYSTERESIS || held + HYSTERESIS < was))
        settle_to(dev, (uint64_t)held);
    vgpu_unlock(&locks[dev]);
}

void vgpu_footprint_refresh(int dev) { refresh(dev, REFRESH_NS); }

/* The measuring thread: each capped device with a context, once a second (it wakes twice a
 * second; refresh() skips a device measured less than a second ago, or being measured), so
 * what a process comes to hold is counted within 1.5 s. */
static void *watch(void *unused)
{
    (void)unused;
    for (;;) {
        struct timespec half = {.tv_sec = 0, .tv_nsec = REFRESH_NS / 2};
        nanosleep(&half, NULL);
        for (int dev = 0; dev < VGPU_REGION_MAX_DEVICES; dev++)
            refresh(dev, REFRESH_NS);
    }
    return NULL;
}

/* Once a process (or a fork child) has a context on a capped device. Without the thread the
 * allocation paths still measure; a failed start is said once and not tried again. */
static void start_watcher(void)
{
    if (__atomic_exchange_n(&watcher_started, 1, __ATOMIC_ACQ_REL))
        return;
    int rc = vgpu_thread_start(watch);
    if (rc != 0)
        vgpu_log(VGPU_LOG_WARN, "cannot start the footprint thread (error %d): memory this process "
                 "holds outside its allocations is counted at its next allocation only", rc);
}

/* A pool may have given back what frees left counted in it, and memory NVML showed may be gone. */
void vgpu_footprint_before_refusal(int dev)
{
    vgpu_footprint_pools_check(dev);
    refresh(dev, REFUSAL_REFRESH_NS);
}

void vgpu_footprint_remeasure(int dev) { refresh(dev, 0); }

void vgpu_footprint_context_created(int dev, const void *ctx)
{
    if (dev < 0 || dev >= VGPU_REGION_MAX_DEVICES || ctx == NULL)
        return;
    vgpu_lock(&created_lock);
    __atomic_add_fetch(&created_alive[dev], 1, __ATOMIC_ACQ_REL);
    for (int i = 0; i < CREATED_KEPT; i++)
        if (created_kept[i].ctx == NULL) {
            created_kept[i] = (struct created){.ctx = ctx, .dev = dev};
            break;
        }
    vgpu_unlock(&created_lock);
}

void vgpu_footprint_context_destroyed(const void *ctx)
{
    vgpu_lock(&created_lock);
    for (int i = 0; ctx != NULL && i < CREATED_KEPT; i++)
        if (created_kept[i].ctx == ctx) {
            __atomic_sub_fetch(&created_alive[created_kept[i].dev], 1, __ATOMIC_ACQ_REL);
            created_kept[i].ctx = NULL;
            break;
        }
    vgpu_unlock(&created_lock);
}

void vgpu_footprint_context_gone(int dev)
{
    for (int d = 0; d < VGPU_REGION_MAX_DEVICES; d++)
        if (d == dev || dev < 0)
            __atomic_store_n(&released[d], 1, __ATOMIC_RELEASE);
    if (inside)
        return;
    for (int d = 0; d < VGPU_REGION_MAX_DEVICES; d++) {
        if ((d != dev && dev >= 0) || !capped(d) || !__atomic_load_n(&has_context[d],
                                                                     __ATOMIC_ACQUIRE))
            continue;
        vgpu_lock(&locks[d]);
        int64_t held = measure(d, MEASURE_TRIES);
        /* Not listed: no context left, unless one is alive still (not_listed: the pid was then
         * another's; settled to 0 here, a review found, the primary context left went
         * uncounted, 1309 MiB on a 1 GiB cap). */
        if (held == HELD_NOT_LISTED) {
            not_listed(d);
        } else if (held >= 0) {
            unlisted_since[d] = 0;
            settle_to(d, (uint64_t)held);
        }
        vgpu_unlock(&locks[d]);
    }
}

/* ---- what stream-ordered frees leave in a pool (footprint.h) ------------------------------ */

/* pool's entry on dev, made if make (NULL: none, or all KEPT_POOLS taken). Caller holds
 * locks[dev]. */
static struct kept *kept_entry(int dev, uintptr_t pool, int make)
{
    struct kept *spare = NULL;
    for (int k = 0; k < KEPT_POOLS; k++) {
        if (kept[dev][k].bytes != 0 && kept[dev][k].pool == pool)
            return &kept[dev][k];
        if (kept[dev][k].bytes == 0 && spare == NULL)
            spare = &kept[dev][k];
    }
    if (!make || spare == NULL)
        return NULL;
    spare->pool = pool;
    return spare;
}

/* counted[dev] up by plus and down by minus, shown in the region. Caller holds locks[dev]. */
static void recount(int dev, uint64_t plus, uint64_t minus)
{
    __atomic_add_fetch(&counted[dev], plus - minus, __ATOMIC_ACQ_REL); /* modulo 2^64 */
    vgpu_region_note_context(dev, 0, counted_everywhere());
}

/* bytes counted as pool's cache on dev, moved from the ledger's allocations (no ledger
 * change); past KEPT_POOLS pools, as other memory until a measurement says otherwise. Caller
 * holds locks[dev]. */
static void keep(int dev, uintptr_t pool, uint64_t bytes)
{
    struct kept *e = kept_entry(dev, pool, 1);
    if (e != NULL) {
        e->bytes += bytes;
        __atomic_add_fetch(&pooled[dev], bytes, __ATOMIC_ACQ_REL);
    }
    recount(dev, bytes, 0);
}

int vgpu_footprint_pool_kept(int dev, uintptr_t pool, uint64_t bytes)
{
    /* Never waits: the lock may be held across a context creation (seconds). */
    if (!capped(dev) || !__atomic_load_n(&measurable[dev], __ATOMIC_RELAXED) || inside ||
        vgpu_trylock(&locks[dev]) != 0)
        return 0;
    keep(dev, pool, bytes);
    vgpu_unlock(&locks[dev]);
    return 1;
}

uint64_t vgpu_footprint_pooled(int dev) { return load64(&pooled[dev]); }

uint64_t vgpu_footprint_pool_take(int dev, uintptr_t pool, uint64_t bytes)
{
    if (inside || vgpu_trylock(&locks[dev]) != 0)
        return 0;
    struct kept *e = kept_entry(dev, pool, 0);
    uint64_t take = e == NULL ? 0 : e->bytes < bytes ? e->bytes : bytes;
    if (take != 0) {
        e->bytes -= take;
        __atomic_sub_fetch(&pooled[dev], take, __ATOMIC_ACQ_REL);
        recount(dev, 0, take);
    }
    vgpu_unlock(&locks[dev]);
    return take;
}

void vgpu_footprint_pool_put_back(int dev, uintptr_t pool, uint64_t bytes)
{
    if (bytes == 0)
        return;
    vgpu_lock(&locks[dev]);
    keep(dev, pool, bytes);
    vgpu_unlock(&locks[dev]);
}

void vgpu_footprint_pools_check(int dev)
{
    if (inside || load64(&pooled[dev]) == 0 || vgpu_trylock(&locks[dev]) != 0)
        return;
    uint64_t dropped = bound_kept(dev, UINT64_MAX);
    if (dropped != 0) {
        vgpu_region_release(dev, dropped);
        recount(dev, 0, dropped);
    }
    vgpu_unlock(&locks[dev]);
}

void vgpu_footprint_context_unseen(int dev)
{
    if (!capped(dev) || inside || __atomic_load_n(&has_context[dev], __ATOMIC_ACQUIRE))
        return;
    vgpu_lock(&locks[dev]);
    if (!__atomic_load_n(&has_context[dev], __ATOMIC_ACQUIRE)) {
        __atomic_store_n(&has_context[dev], 1, __ATOMIC_RELEASE);
        /* As for any context made: the container's context size, until it is measured (past
         * the cap: the context exists already; further allocations are refused). */
        uint64_t estimate = vgpu_region_context_estimate(dev);
        if (estimate != 0 && vgpu_region_charge(dev, estimate) == 0)
            recount(dev, estimate, 0);
        int64_t held = measure(dev, MEASURE_TRIES);
        if (held >= 0) {
            __atomic_store_n(&measured_at[dev], monotonic_ns(), __ATOMIC_RELAXED);
            settle_to(dev, (uint64_t)held);
        }
    }
    vgpu_unlock(&locks[dev]);
}

/* ---- what other driver calls make the driver hold (footprint.h) -------------------------- */

void vgpu_footprint_grew(int dev, uint64_t reserved, uint64_t grew)
{
    vgpu_lock(&locks[dev]);
    if (grew > reserved)
        vgpu_region_charge(dev, grew - reserved);
    else
        vgpu_region_release(dev, reserved - grew);
    if (grew != 0)
        recount(dev, grew, 0);
    vgpu_unlock(&locks[dev]);
}
