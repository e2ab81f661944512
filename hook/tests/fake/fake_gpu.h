/* fake_gpu.h - the fake driver's GPU model, included by fake_cuda.c only (static functions).
 *
 * What one GPU does when several processes share it: per device a table of process entries
 * (pid, queued work, GPU time received, memory footprint) and a virtual clock sim_ns. Every
 * call that touches a device advances the clock lazily to now under the device lock: over a
 * time-slice of 100 ms the GPU amounts to processor sharing, so the entries with pending work
 * each get an equal share. Steps end exactly where an entry's work runs out and at sample-period
 * boundaries, so the per-period figures NVML reports are exact.
 *
 * FAKE_GPU_SHARED=<path>: the state lives in that file, mapped MAP_SHARED by every process that
 * names it (containers sharing one GPU). Unset: the same code over a private anonymous mapping
 * (one process; a fork child keeps a copy, as with the old per-process globals). Times are
 * CLOCK_MONOTONIC ns, which every process on the host shares. */
#ifndef FAKE_GPU_H
#define FAKE_GPU_H

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fake_state.h"

/* GPU_HISTORY: the completed sample periods kept for NVML's averages since a time (nvml.h,
 * nvmlDeviceGetProcessUtilization: "utilization since the previous query", or over "all the
 * samples maintained by the driver's internal sample buffer"), 21 s at 166 ms; of each, the
 * GPU time of the first GPU_HISTORY_PROCS processes that ran in it. */
enum {
    GPU_MAX_DEVICES = FAKE_MAX_GPUS, GPU_MAX_PROCS = 64, GPU_HISTORY = 128, GPU_HISTORY_PROCS = 8,
    GPU_MARKS = 64, /* event records a process may have outstanding, each device */
};
#define GPU_MAGIC UINT64_C(0x354750474b414646) /* "FFAKGPG5": layout version 5 */
#define GPU_REAP_NS UINT64_C(10000000)         /* dead-pid sweep at most every 10 ms */

struct gpu_proc {
    int32_t pid;             /* 0: a free entry */
    uint32_t primary_refs;   /* cuDevicePrimaryCtxRetain minus releases */
    uint32_t created_ctxs;   /* live cuCtxCreate contexts */
    uint32_t lazy_loaded;    /* the first launch since the first context loaded the modules */
    uint64_t pending_ns;     /* queued work not yet run */
    uint64_t busy_ns;        /* GPU time received, ever */
    uint64_t period_busy_ns; /* ... in the current sample period */
    uint64_t last_busy_ns;   /* ... in the latest completed one */
    uint64_t ctx_bytes;      /* charged for its contexts (while it has one) */
    uint64_t lazy_bytes;     /* charged at its first launch (lazy module loading) */
    uint64_t alloc_bytes;    /* its allocations */
    /* Event records (fake_cuda.c): the GPU time received (busy_ns) at which each one's work is
     * done, and the simulated time it was reached, a ring by the record's number. Its work runs
     * in order, so records end in order: those before marks_done have ended. */
    uint64_t marks_next;     /* records made so far */
    uint64_t marks_done;     /* records ended so far */
    struct {
        uint64_t busy_ns;
        uint64_t done_ns;
    } marks[GPU_MARKS];
};

/* A completed sample period, as NVML's sample buffer keeps it. */
struct gpu_period {
    uint64_t end_ns;         /* 0: an unused entry */
    uint64_t busy_ns;        /* time any work ran in it */
    int32_t winner;          /* its one-bit sample's pid (FAKE_NVML_SAMPLE_WINNER; 0: none ran) */
    uint32_t nran;           /* entries of ran[] used */
    struct {
        int32_t pid;
        uint32_t unused;
        uint64_t busy_ns;
    } ran[GPU_HISTORY_PROCS];
};

struct gpu_device {
    pthread_mutex_t lock;    /* process-shared, robust: a holder may be kill -9'd */
    uint64_t sim_ns;         /* simulated up to here */
    uint64_t reaped_ns;      /* last dead-pid sweep */
    uint64_t busy_ns;        /* time any work ran, all processes */
    uint64_t period_busy_ns; /* ... in the current sample period */
    uint64_t last_busy_ns;   /* ... in the latest completed one */
    uint64_t last_end_ns;    /* end of the latest completed period (0: none yet) */
    uint64_t used;           /* sum of the entries' footprints */
    uint64_t arrivals;       /* cuDevicePrimaryCtxRetain calls begun, ever */
    int32_t last_winner;     /* the pid the latest completed period's one-bit sample goes to
                              * (FAKE_NVML_SAMPLE_WINNER; 0: none ran) */
    uint32_t history_next;   /* the entry of history[] the next completed period takes */
    struct gpu_proc procs[GPU_MAX_PROCS];
    struct gpu_period history[GPU_HISTORY];
};

struct gpu_shared {
    uint64_t magic;          /* written last by the creator: the file is linked in after */
    uint64_t size;
    uint64_t period_ns;      /* NVML sample period, the creator's FAKE_NVML_SAMPLE_MS */
    int64_t realtime_offset; /* CLOCK_REALTIME - CLOCK_MONOTONIC at creation, so that every
                              * process converts a period's end to the same timestamp */
    struct gpu_device dev[GPU_MAX_DEVICES];
};

static struct gpu_shared *gpu;
static int gpu_is_shared;
static uint64_t gpu_queue_ns;            /* FAKE_CUDA_QUEUE_NS: the push buffer */
static uint64_t gpu_ctx_bytes;           /* FAKE_CUDA_CONTEXT_MIB */
static uint64_t gpu_created_ctx_bytes;   /* FAKE_CUDA_CREATED_CONTEXT_MIB */
static uint64_t gpu_lazy_bytes;          /* FAKE_CUDA_LAZY_MIB */
static uint64_t gpu_total_bytes;         /* set by fake_cuda.c (FAKE_CUDA_MEM_MIB) */
static pthread_once_t gpu_once = PTHREAD_ONCE_INIT;

static uint64_t gpu_clock(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t gpu_now(void) { return gpu_clock(CLOCK_MONOTONIC); }

static uint64_t gpu_env(const char *name, uint64_t fallback)
{
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' ? strtoull(v, NULL, 10) : fallback;
}

/* A fake that cannot set up its GPU cannot answer anything truthfully: stop the test. */
static void gpu_die(const char *what, const char *path)
{
    fprintf(stderr, "fake GPU: %s %s: %s\n", what, path, strerror(errno));
    abort();
}

static void gpu_init_mutex(pthread_mutex_t *m)
{
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(m, &attr);
    pthread_mutexattr_destroy(&attr);
}

static void gpu_format(struct gpu_shared *g)
{
    uint64_t now = gpu_now();
    g->size = sizeof *g;
    g->period_ns = gpu_env("FAKE_NVML_SAMPLE_MS", 166) * 1000000u;
    if (g->period_ns == 0)
        g->period_ns = 166000000u;
    g->realtime_offset = (int64_t)(gpu_clock(CLOCK_REALTIME) - now);
    for (int i = 0; i < GPU_MAX_DEVICES; i++) {
        gpu_init_mutex(&g->dev[i].lock);
        g->dev[i].sim_ns = now;
        g->dev[i].reaped_ns = now;
    }
    __atomic_store_n(&g->magic, GPU_MAGIC, __ATOMIC_RELEASE);
}

static struct gpu_shared *gpu_map(int fd)
{
    void *p = mmap(NULL, sizeof(struct gpu_shared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* Opens the shared file, or creates it: formatted under a temporary name and linked into place,
 * so no process ever sees a half-made file and exactly one creator wins. */
static struct gpu_shared *gpu_open_shared(const char *path)
{
    for (int attempt = 0; attempt < 100; attempt++) {
        int fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd >= 0) {
            struct stat st;
            if (fstat(fd, &st) != 0)
                gpu_die("cannot stat", path);
            if ((uint64_t)st.st_size != sizeof(struct gpu_shared)) {
                errno = EINVAL;
                gpu_die("wrong size (another layout?)", path);
            }
            struct gpu_shared *g = gpu_map(fd);
            close(fd);
            if (g == NULL)
                gpu_die("cannot map", path);
            if (__atomic_load_n(&g->magic, __ATOMIC_ACQUIRE) != GPU_MAGIC) {
                errno = EINVAL;
                gpu_die("not a fake GPU file", path);
            }
            return g;
        }
        if (errno != ENOENT)
            gpu_die("cannot open", path);
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
        fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
        if (fd < 0)
            gpu_die("cannot create", tmp);
        fchmod(fd, 0666); /* other uids share the GPU too */
        if (ftruncate(fd, sizeof(struct gpu_shared)) != 0)
            gpu_die("cannot size", tmp);
        struct gpu_shared *g = gpu_map(fd);
        close(fd);
        if (g == NULL)
            gpu_die("cannot map", tmp);
        gpu_format(g);
        int linked = link(tmp, path) == 0, why = errno;
        unlink(tmp);
        if (linked)
            return g;
        munmap(g, sizeof *g);
        errno = why;
        if (why != EEXIST)
            gpu_die("cannot link", path);
        /* another process won the race: open its file */
    }
    errno = EAGAIN;
    gpu_die("gave up opening", path);
    return NULL;
}

/* Private mode: a fork child's copy of a lock another thread held would never be released. */
static void gpu_after_fork_child(void)
{
    for (int i = 0; i < GPU_MAX_DEVICES; i++)
        gpu_init_mutex(&gpu->dev[i].lock);
}

static void gpu_setup(void)
{
    const char *path = getenv("FAKE_GPU_SHARED");
    gpu_queue_ns = gpu_env("FAKE_CUDA_QUEUE_NS", 200000000u);
    gpu_ctx_bytes = gpu_env("FAKE_CUDA_CONTEXT_MIB", 0) << 20;
    gpu_created_ctx_bytes = gpu_env("FAKE_CUDA_CREATED_CONTEXT_MIB", 0) << 20;
    gpu_lazy_bytes = gpu_env("FAKE_CUDA_LAZY_MIB", 0) << 20;
    if (path != NULL && path[0] != '\0') {
        gpu = gpu_open_shared(path);
        gpu_is_shared = 1;
        return;
    }
    void *p = mmap(NULL, sizeof(struct gpu_shared), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        gpu_die("cannot map", "an anonymous mapping");
    gpu = p;
    gpu_format(gpu);
    pthread_atfork(NULL, NULL, gpu_after_fork_child);
}

/* The model is set up on first use, not at load: a test may set FAKE_GPU_SHARED after start. */
static struct gpu_shared *gpu_get(void)
{
    pthread_once(&gpu_once, gpu_setup);
    return gpu;
}

/* CUDA_VISIBLE_DEVICES: the GPU (its NVML index, the shared state's device) behind each CUDA
 * ordinal of this process; set by fake_cuda.c before any call. */
static int gpu_physical[GPU_MAX_DEVICES];

/* The locked GPU `physical`. */
static struct gpu_device *gpu_lock(int physical)
{
    struct gpu_device *d = &gpu_get()->dev[physical];
    if (pthread_mutex_lock(&d->lock) == EOWNERDEAD)
        pthread_mutex_consistent(&d->lock); /* the holder died: its half-step is tolerable */
    return d;
}

static void gpu_unlock(struct gpu_device *d) { pthread_mutex_unlock(&d->lock); }

static uint64_t gpu_footprint(const struct gpu_proc *p)
{
    return p->ctx_bytes + p->lazy_bytes + p->alloc_bytes;
}

/* Drops the entries of dead processes with their queued work and their memory. */
static void gpu_reap(struct gpu_device *d)
{
    for (int i = 0; i < GPU_MAX_PROCS; i++) {
        struct gpu_proc *p = &d->procs[i];
        if (p->pid != 0 && kill(p->pid, 0) != 0 && errno == ESRCH) {
            d->used -= gpu_footprint(p);
            memset(p, 0, sizeof *p);
        }
    }
}

/* The pid a completed period's one-bit sample goes to: drawn with the odds of each entry's GPU
 * time in it, by a hash of the period's end; 0 when none ran. */
static int32_t gpu_draw_winner(const struct gpu_device *d)
{
    uint64_t x = d->last_end_ns * UINT64_C(0x9E3779B97F4A7C15);
    x ^= x >> 29;
    x *= UINT64_C(0xBF58476D1CE4E5B9);
    x ^= x >> 32;
    uint64_t total = 0;
    for (int i = 0; i < GPU_MAX_PROCS; i++)
        total += d->procs[i].pid != 0 ? d->procs[i].last_busy_ns : 0;
    if (total == 0)
        return 0;
    uint64_t pick = x % total, before = 0;
    for (int i = 0; i < GPU_MAX_PROCS; i++) {
        uint64_t busy = d->procs[i].pid != 0 ? d->procs[i].last_busy_ns : 0;
        if (pick < before + busy)
            return d->procs[i].pid;
        before += busy;
    }
    return 0;
}

/* Closes the sample period that ends at `end`; its one-bit winner is drawn here, once, so that
 * every process reading the period sees the same one. */
static void gpu_roll(struct gpu_device *d, uint64_t end)
{
    d->last_busy_ns = d->period_busy_ns;
    d->period_busy_ns = 0;
    d->last_end_ns = end;
    for (int i = 0; i < GPU_MAX_PROCS; i++) {
        d->procs[i].last_busy_ns = d->procs[i].period_busy_ns;
        d->procs[i].period_busy_ns = 0;
    }
    d->last_winner = gpu_draw_winner(d);
    struct gpu_period *h = &d->history[d->history_next];
    d->history_next = (d->history_next + 1) % GPU_HISTORY;
    *h = (struct gpu_period){.end_ns = end, .busy_ns = d->last_busy_ns, .winner = d->last_winner};
    /* The winner first: past GPU_HISTORY_PROCS processes in one period the others are left
     * out, never the one-bit sample's. */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < GPU_MAX_PROCS && h->nran < GPU_HISTORY_PROCS; i++) {
            const struct gpu_proc *p = &d->procs[i];
            if (p->pid != 0 && p->last_busy_ns > 0 && (p->pid == h->winner) == (pass == 0)) {
                h->ran[h->nran].pid = p->pid;
                h->ran[h->nran].busy_ns = p->last_busy_ns;
                h->nran++;
            }
        }
}

/* Ends p's records whose work is done in a step from sim where p, one of `active` entries with
 * work, gets `share` ns of GPU time: p gets 1/active of the GPU, so a record whose work needs
 * x ns more ends x * active after sim. (An event's span over its kernel is so the kernel's
 * cost plus what the others ran meanwhile, as timing events showed on an H200: 46.8 ms for a
 * 21.6 ms kernel beside a second busy process, hook/README.md.) */
static void gpu_end_marks(struct gpu_proc *p, uint64_t sim, unsigned active, uint64_t share)
{
    for (; p->marks_done < p->marks_next; p->marks_done++) {
        uint64_t need = p->marks[p->marks_done % GPU_MARKS].busy_ns;
        if (need > p->busy_ns + share)
            return;
        uint64_t ran = need > p->busy_ns ? need - p->busy_ns : 0;
        p->marks[p->marks_done % GPU_MARKS].done_ns = sim + ran * active;
    }
}

/* Runs the device from sim_ns to now: processor sharing among the entries with pending work. */
static void gpu_advance(struct gpu_device *d, uint64_t now)
{
    if (now - d->reaped_ns >= GPU_REAP_NS) {
        d->reaped_ns = now;
        gpu_reap(d);
    }
    const uint64_t period = gpu->period_ns;
    while (d->sim_ns < now) {
        uint64_t sim = d->sim_ns, boundary = (sim / period + 1) * period;
        uint64_t end = now < boundary ? now : boundary, least = UINT64_MAX;
        unsigned active = 0;
        for (int i = 0; i < GPU_MAX_PROCS; i++) {
            uint64_t pending = d->procs[i].pending_ns;
            if (d->procs[i].pid != 0 && pending > 0) {
                active++;
                least = pending < least ? pending : least;
            }
        }
        if (active == 0) { /* idle: jump, closing the periods passed over */
            if (now < boundary) {
                d->sim_ns = now;
                break;
            }
            gpu_roll(d, boundary);
            uint64_t last = now / period * period;
            if (last > boundary)
                gpu_roll(d, last); /* an idle period: zeros */
            d->sim_ns = last;
            continue;
        }
        uint64_t span = end - sim, share = span / active;
        if (least <= share) { /* someone's work runs out first: stop exactly there */
            share = least;
            span = least * active;
        }
        for (int i = 0; i < GPU_MAX_PROCS; i++) {
            struct gpu_proc *p = &d->procs[i];
            if (p->pid != 0 && p->pending_ns > 0) {
                gpu_end_marks(p, sim, active, share);
                p->pending_ns -= share;
                p->busy_ns += share;
                p->period_busy_ns += share;
            }
        }
        d->busy_ns += span;
        d->period_busy_ns += span;
        d->sim_ns = sim + span;
        if (d->sim_ns == boundary)
            gpu_roll(d, boundary);
    }
}

/* The locked GPU `physical`, advanced to now. */
static struct gpu_device *gpu_enter_physical(int physical)
{
    struct gpu_device *d = gpu_lock(physical);
    gpu_advance(d, gpu_now());
    return d;
}

/* The same for the GPU behind CUDA ordinal dev. */
static struct gpu_device *gpu_enter(int dev) { return gpu_enter_physical(gpu_physical[dev]); }

static struct gpu_proc *gpu_find(struct gpu_device *d, int32_t pid)
{
    for (int i = 0; i < GPU_MAX_PROCS; i++)
        if (d->procs[i].pid == pid)
            return &d->procs[i];
    return NULL;
}

/* The caller's entry, made if needed (NULL: the table is full of live processes). */
static struct gpu_proc *gpu_entry(struct gpu_device *d, int32_t pid)
{
    struct gpu_proc *p = gpu_find(d, pid);
    if (p != NULL)
        return p;
    gpu_reap(d);
    p = gpu_find(d, 0);
    if (p != NULL) {
        memset(p, 0, sizeof *p);
        p->pid = pid;
    }
    return p;
}

/* GPU time until the caller has had `want` ns more, if nothing new arrives: under processor
 * sharing every other entry gets as much as the caller until its own work runs out. */
static uint64_t gpu_time_for(const struct gpu_device *d, uint64_t want)
{
    uint64_t t = 0;
    for (int i = 0; i < GPU_MAX_PROCS; i++) {
        uint64_t pending = d->procs[i].pid != 0 ? d->procs[i].pending_ns : 0;
        t += pending < want ? pending : want;
    }
    return t;
}

static void gpu_sleep_ns(uint64_t ns)
{
    if (ns < 20000)
        ns = 20000;
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000u), .tv_nsec = (long)(ns % 1000000000u)};
    nanosleep(&ts, NULL);
}

/* Waits (device unlocked) until the caller's pending work is at most `target`. */
static void gpu_wait_pending(int dev, uint64_t target)
{
    int32_t pid = (int32_t)getpid();
    for (;;) {
        struct gpu_device *d = gpu_enter(dev);
        struct gpu_proc *p = gpu_find(d, pid);
        uint64_t t = p != NULL && p->pending_ns > target ? gpu_time_for(d, p->pending_ns - target)
                                                         : 0;
        gpu_unlock(d);
        if (t == 0)
            return;
        gpu_sleep_ns(t);
    }
}

/* Charges `bytes` to an entry's *field unless the device is full. */
static int gpu_charge(struct gpu_device *d, uint64_t *field, uint64_t bytes)
{
    if (bytes > gpu_total_bytes || d->used > gpu_total_bytes - bytes)
        return 0;
    *field += bytes;
    d->used += bytes;
    return 1;
}

static void gpu_uncharge(struct gpu_device *d, uint64_t *field, uint64_t bytes)
{
    bytes = bytes < *field ? bytes : *field;
    *field -= bytes;
    d->used -= bytes;
}

/* A launch of `work` ns by the caller: lazy module loading on its first, then the push buffer
 * (a full one blocks the launch until the GPU drains it below FAKE_CUDA_QUEUE_NS). Returns 0,
 * or -1 when the memory for the modules or an entry is missing. */
static int gpu_submit(int dev, uint64_t work)
{
    int32_t pid = (int32_t)getpid();
    struct gpu_device *d = gpu_enter(dev);
    struct gpu_proc *p = gpu_entry(d, pid);
    if (p == NULL || (!p->lazy_loaded && !gpu_charge(d, &p->lazy_bytes, gpu_lazy_bytes))) {
        gpu_unlock(d);
        return -1;
    }
    p->lazy_loaded = 1;
    uint64_t pending = p->pending_ns;
    gpu_unlock(d);
    if (pending > gpu_queue_ns)
        gpu_wait_pending(dev, gpu_queue_ns);
    d = gpu_enter(dev);
    p = gpu_entry(d, pid);
    if (p != NULL)
        p->pending_ns += work;
    gpu_unlock(d);
    return p != NULL ? 0 : -1;
}

/* An event record by the caller on dev: its number (for gpu_mark_done), the work it waits for
 * being all the caller's work queued there so far. */
static uint64_t gpu_mark(int dev)
{
    struct gpu_device *d = gpu_enter(dev);
    struct gpu_proc *p = gpu_entry(d, (int32_t)getpid());
    uint64_t n = 0;
    if (p != NULL) {
        n = p->marks_next++;
        p->marks[n % GPU_MARKS].busy_ns = p->busy_ns + p->pending_ns;
        p->marks[n % GPU_MARKS].done_ns = d->sim_ns;
        if (p->pending_ns == 0)
            p->marks_done = p->marks_next; /* nothing to wait for: ended now */
        else if (p->marks_next - p->marks_done > GPU_MARKS)
            p->marks_done = p->marks_next - GPU_MARKS; /* the oldest overwritten: lost */
    }
    gpu_unlock(d);
    return n;
}

/* Whether the caller's record n on dev has ended (1, *done_ns when), not yet (0), or is not
 * known: overwritten by GPU_MARKS later ones before it ended, or the entry is gone (-1). */
static int gpu_mark_done(int dev, uint64_t n, uint64_t *done_ns)
{
    struct gpu_device *d = gpu_enter(dev);
    const struct gpu_proc *p = gpu_find(d, (int32_t)getpid());
    int done = p == NULL || n >= p->marks_next || p->marks_next - n > GPU_MARKS ? -1
             : n < p->marks_done                                                ? 1
                                                                                : 0;
    if (done == 1)
        *done_ns = p->marks[n % GPU_MARKS].done_ns;
    gpu_unlock(d);
    return done;
}

/* One more context of the caller on dev (primary or created); its first is charged, and each
 * created one holds memory of its own too. */
static int gpu_ctx_ref(int dev, int primary)
{
    struct gpu_device *d = gpu_enter(dev);
    struct gpu_proc *p = gpu_entry(d, (int32_t)getpid());
    int first = p != NULL && p->primary_refs + p->created_ctxs == 0;
    int ok = p != NULL && (!first || gpu_charge(d, &p->ctx_bytes, gpu_ctx_bytes));
    if (ok && !primary && !gpu_charge(d, &p->ctx_bytes, gpu_created_ctx_bytes)) {
        if (first)
            gpu_uncharge(d, &p->ctx_bytes, gpu_ctx_bytes);
        ok = 0;
    }
    if (ok)
        *(primary ? &p->primary_refs : &p->created_ctxs) += 1;
    gpu_unlock(d);
    return ok;
}

/* One more retain begun on dev; returns how many have begun. */
static uint64_t gpu_arrive(int dev, int count)
{
    struct gpu_device *d = gpu_enter(dev);
    uint64_t n = d->arrivals += (uint64_t)count;
    gpu_unlock(d);
    return n;
}

/* How many processes hold a context on dev. */
static int gpu_contexts(int dev)
{
    struct gpu_device *d = gpu_enter(dev);
    int n = 0;
    for (int i = 0; i < GPU_MAX_PROCS; i++)
        n += d->procs[i].pid != 0 && d->procs[i].primary_refs + d->procs[i].created_ctxs > 0;
    gpu_unlock(d);
    return n;
}

/* One context fewer; the last one takes the context and module memory with it. Returns 0 when
 * the caller had no such context. */
static int gpu_ctx_unref(int dev, int primary)
{
    struct gpu_device *d = gpu_enter(dev);
    struct gpu_proc *p = gpu_find(d, (int32_t)getpid());
    uint32_t *count = p == NULL ? NULL : primary ? &p->primary_refs : &p->created_ctxs;
    int ok = count != NULL && *count > 0;
    if (ok && !primary)
        gpu_uncharge(d, &p->ctx_bytes, gpu_created_ctx_bytes);
    if (ok && --*count == 0 && p->primary_refs + p->created_ctxs == 0) {
        gpu_uncharge(d, &p->ctx_bytes, p->ctx_bytes);
        gpu_uncharge(d, &p->lazy_bytes, p->lazy_bytes);
        p->lazy_loaded = 0;
    }
    gpu_unlock(d);
    return ok;
}

/* The caller's context memory on dev goes from holding `was` to `now` bytes more (a context
 * limit changed); 0 when the device cannot hold it. */
static int gpu_ctx_resize(int dev, uint64_t was, uint64_t now)
{
    struct gpu_device *d = gpu_enter(dev);
    struct gpu_proc *p = gpu_entry(d, (int32_t)getpid());
    int ok = p != NULL && (now > was ? gpu_charge(d, &p->ctx_bytes, now - was) : 1);
    if (p != NULL && now < was)
        gpu_uncharge(d, &p->ctx_bytes, was - now);
    gpu_unlock(d);
    return ok;
}

static int gpu_alloc(int dev, int32_t pid, uint64_t bytes)
{
    struct gpu_device *d = gpu_enter(dev);
    struct gpu_proc *p = gpu_entry(d, pid);
    int ok = p != NULL && gpu_charge(d, &p->alloc_bytes, bytes);
    gpu_unlock(d);
    return ok;
}

static void gpu_free(int dev, int32_t pid, uint64_t bytes)
{
    struct gpu_device *d = gpu_enter(dev);
    struct gpu_proc *p = gpu_find(d, pid);
    if (p != NULL)
        gpu_uncharge(d, &p->alloc_bytes, bytes);
    gpu_unlock(d);
}

#endif
