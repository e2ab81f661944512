/* cuda_limits.c - context limits that make the driver reserve device memory (cuda.h, on
 * cuCtxSetLimit): a thread's stack is reserved for every thread the device can hold at once
 * (on an H100, 132 SMs x 2048 threads: 16 KiB stacks take 4.1 GiB), the malloc heap and the
 * printf FIFO for their size. What a raise may add is reserved under the cap before the driver
 * is asked (refused with CUDA_ERROR_OUT_OF_MEMORY, as the driver refuses what the device cannot
 * hold), and stays counted as the process's footprint until a measurement settles it. The
 * driver also raises the stack itself, at the launch of a kernel whose threads need more local
 * memory than it holds, and keeps it raised (cuda.h, CU_LIMIT_STACK_SIZE): that raise is
 * reserved before such a launch the same way, in the context the kernel runs in (its stream's:
 * a CUkernel runs in its stream's context whatever is current, cuda.h cuLaunchKernel). Limits
 * are each context's (cuda.h, cuCtxSetLimit: "the current context"): a second context on a
 * device starts at the driver's default, whatever the first holds. */
#define _GNU_SOURCE
#include <pthread.h>

#include "cuda_driver.h"
#include "footprint.h"
#include "locks.h"
#include "log.h"
#include "memory.h"
#include "region.h"
#include "util.h"

enum { DEFAULT_STACK = 1024, CONTEXTS = 64 };

/* The per-thread stack counted in each context, under stack_lock; ctx and stack read without
 * it are atomic. A context is entered as it is made (cuda_context.c), or when first met at a
 * launch or a cuCtxSetLimit. */
static struct counted_context {
    CUcontext ctx;       /* NULL: a free entry */
    const void *made;    /* the handle that ends it (a green context's CUgreenCtx, else ctx) */
    int dev;
    enum vgpu_context_kind kind;
    uint64_t stack;      /* 0: not asked yet */
    uint64_t at_least;   /* while not asked: the least it may be (the default, or less) */
    uint64_t generation; /* new at each entry and retain: a launch's raise belongs to one */
} contexts[CONTEXTS];
static uint64_t generations;
/* How many entries were given up for others (the table full, round robin), and the lowest
 * stack they held: their contexts may live on, unseen, so the floor stays under it. */
static unsigned given_up;
static uint64_t given_up_floor = UINT64_MAX;
/* No counted context on a capped device has a smaller stack: a kernel needing no more launches
 * with no question asked (not even which context it runs in; cuda_driver.h, vgpu_stack_fits). */
uint64_t vgpu_floor_stack = DEFAULT_STACK;
static pthread_mutex_t stack_lock = PTHREAD_MUTEX_INITIALIZER;

/* A fork while another thread held stack_lock (a raise waits on the driver and NVML holding it)
 * must not leave the child's first launch of an unknown kernel waiting for ever. */
static void after_fork_child(void) { pthread_mutex_init(&stack_lock, NULL); }

static void register_fork_handler(void) { pthread_atfork(NULL, NULL, after_fork_child); }

static void lock_stack(void)
{
    static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
    pthread_once(&fork_once, register_fork_handler);
    vgpu_lock(&stack_lock);
}

/* The context entry (and its generation), and its stack, each device's raise of this thread's
 * launch under way was counted from (raising: those devices, a bit each): what it is again if
 * the launch is refused (forget_raises), unless the entry is another context's by then. */
static __thread struct raised {
    struct counted_context *c;
    uint64_t generation;
    uint64_t stack;
} raised_from[VGPU_REGION_MAX_DEVICES];
static __thread int raising;
/* Inside a multi-device launch, whose kernels raise one after another (vgpu_stack_several). */
static __thread int several_kernels;

void vgpu_stack_several(int on) { several_kernels = on; }

/* A launch needing a raise is refused, said once: made inside the library (a signal handler's
 * launch on a thread in one of its locks, or in a launch of its own), its raise could not be
 * counted without waiting for the thread's own lock, or would be taken for the outer launch's. */
static int refuse_inside(void)
{
    static int told;
    if (!__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED))
        vgpu_log(VGPU_LOG_WARN, "refusing a launch needing a larger stack made while this thread "
                 "is inside libvgpu (from a signal handler, or from within a driver call): its "
                 "raise cannot be counted without waiting for a lock the thread holds, or apart "
                 "from the raise of the launch it interrupted");
    return -1;
}

/* VGPU_STACK_* (cuda_driver.h): set by vgpu_stack_check_launch. */
int vgpu_stack_checked;

/* How many threads dev holds at once (0: the driver cannot say). */
static uint64_t resident_threads(int dev)
{
    int sms = 0, per_sm = 0;
    if (real.cuDeviceGetAttribute == NULL ||
        real.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) !=
            CUDA_SUCCESS ||
        real.cuDeviceGetAttribute(&per_sm, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR,
                                  dev) != CUDA_SUCCESS || sms <= 0 || per_sm <= 0)
        return 0;
    return (uint64_t)sms * (uint64_t)per_sm;
}

/* The device memory a stack of `per_thread` bytes more takes on dev: every resident thread's
 * (2^20 threads, a device of this size's most, when the driver cannot say how many). */
static uint64_t stack_bytes(int dev, uint64_t per_thread)
{
    uint64_t threads = resident_threads(dev);
    return mul_saturated(per_thread, threads != 0 ? threads : UINT64_C(1) << 20);
}

/* What setting limit to value on dev may add to what the driver reserves there: the raise,
 * per resident thread for the stack; all of value when the current one cannot be asked (and
 * every thread a device of this size could hold, 2^20, when the driver cannot say how many).
 * 0 for limits that reserve nothing, or little (the device runtime's). */
static uint64_t may_add(CUlimit limit, size_t value, int dev)
{
    size_t now = 0;
    if (limit != CU_LIMIT_STACK_SIZE && limit != CU_LIMIT_MALLOC_HEAP_SIZE &&
        limit != CU_LIMIT_PRINTF_FIFO_SIZE)
        return 0;
    if (real.cuCtxGetLimit == NULL || real.cuCtxGetLimit(&now, limit) != CUDA_SUCCESS)
        now = 0;
    uint64_t raise = value > now ? value - now : 0;
    return limit != CU_LIMIT_STACK_SIZE ? raise : stack_bytes(dev, raise);
}

/* Reserves `more` on dev for a raise the driver makes in api's call; -1: it does not fit
 * (logged). The operation stays open (vgpu_mem_op_end) until the raise is counted after the
 * driver made it: until then, a measurement would not see it in NVML and settle it away. */
static int reserve_raise(int dev, uint64_t more, const char *api)
{
    vgpu_footprint_refresh(dev); /* what an allocation would see */
    if (vgpu_mem_reserve(dev, more, api) != 0)
        return -1;
    vgpu_mem_op_begin();
    return 0;
}

/* ---- the stack counted in each context --------------------------------------------------- */

/* c's stack as the floor takes it: one not asked yet is the least it may be. */
static uint64_t floor_of(const struct counted_context *c)
{
    return c->stack != 0 ? c->stack : c->at_least;
}

/* The floor, after a context's stack changed or an entry came or went: the lowest stack counted
 * on a capped device, the default while there is none (the first context starts there). Caller
 * holds stack_lock. */
static void refloor(void)
{
    uint64_t lowest = given_up_floor;
    int any = 0;
    for (int i = 0; i < CONTEXTS; i++) {
        const struct counted_context *c = &contexts[i];
        if (c->ctx == NULL || vgpu_region_limit(c->dev) == 0)
            continue;
        any = 1;
        lowest = floor_of(c) < lowest ? floor_of(c) : lowest;
    }
    if (!any && lowest > DEFAULT_STACK)
        lowest = DEFAULT_STACK;
    __atomic_store_n(&vgpu_floor_stack, lowest, __ATOMIC_RELEASE);
}

/* ctx's entry (NULL: none; entry_of(NULL) is a free one). Caller holds stack_lock. */
static struct counted_context *entry_of(CUcontext ctx)
{
    for (int i = 0; i < CONTEXTS; i++)
        if (contexts[i].ctx == ctx)
            return &contexts[i];
    return NULL;
}

/* c's raises counted before are no longer its to undo; a lock-free reader of c (holds) reads
 * it again. Caller holds stack_lock. */
static void new_generation(struct counted_context *c)
{
    __atomic_store_n(&c->generation, ++generations, __ATOMIC_RELEASE);
}

/* ctx's entry, made (its stack not asked yet: a new context's is the driver's default) when it
 * has none. With the table full the entry after the last one given up is given up for it: asked
 * anew if its context is met again, and kept under the floor meanwhile. Caller holds
 * stack_lock. */
static struct counted_context *enter(CUcontext ctx, const void *made, int dev,
                                     enum vgpu_context_kind kind)
{
    struct counted_context *c = entry_of(ctx);
    if (c != NULL)
        return c;
    c = entry_of(NULL);
    if (c == NULL) {
        c = &contexts[given_up++ % CONTEXTS];
        if (floor_of(c) < given_up_floor)
            given_up_floor = floor_of(c);
        if (given_up == 1)
            vgpu_log(VGPU_LOG_INFO, "more than %d contexts: the stack of those whose count was "
                     "given up is asked again when they launch a kernel needing more than %llu "
                     "bytes a thread", CONTEXTS, (unsigned long long)given_up_floor);
    }
    __atomic_store_n(&c->ctx, NULL, __ATOMIC_RELEASE);
    c->made = made;
    c->dev = dev;
    c->kind = kind;
    c->at_least = DEFAULT_STACK;
    new_generation(c);
    __atomic_store_n(&c->stack, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&c->ctx, ctx, __ATOMIC_RELEASE);
    return c;
}

/* Whether a context of this kind has its device's primary context's limits: the primary
 * context itself, and a green context (an H200's driver 580 read a green context's stack as the
 * primary context's 2 KiB, gpu_held.py (f)). */
static int primary_limits(int kind)
{
    return kind == VGPU_CONTEXT_PRIMARY || kind == VGPU_CONTEXT_GREEN;
}

/* Whether a and b share their limits. */
static int shared(const struct counted_context *a, const struct counted_context *b)
{
    return a == b || (a->dev == b->dev && primary_limits(a->kind) && primary_limits(b->kind));
}

/* c's context is counted at `stack` bytes a thread from now on, and so is every context that
 * shares its limits. Caller holds stack_lock. */
static void count_stack(struct counted_context *c, uint64_t stack)
{
    for (int i = 0; i < CONTEXTS; i++)
        if (contexts[i].ctx != NULL && shared(&contexts[i], c))
            __atomic_store_n(&contexts[i].stack, stack, __ATOMIC_RELEASE);
    refloor();
}

/* Whether ctx is counted at `local` bytes a thread or more, read without the lock: the entry's
 * generation and context, read before and after its stack, must not change (the context alone
 * could: given to another, raised, and entered again between the reads). */
static int holds(CUcontext ctx, uint64_t local)
{
    for (int i = 0; i < CONTEXTS; i++) {
        struct counted_context *c = &contexts[i];
        uint64_t generation = __atomic_load_n(&c->generation, __ATOMIC_ACQUIRE);
        if (__atomic_load_n(&c->ctx, __ATOMIC_ACQUIRE) != ctx)
            continue;
        uint64_t stack = __atomic_load_n(&c->stack, __ATOMIC_ACQUIRE);
        return __atomic_load_n(&c->ctx, __ATOMIC_ACQUIRE) == ctx &&
               __atomic_load_n(&c->generation, __ATOMIC_ACQUIRE) == generation && local <= stack;
    }
    return 0;
}

/* The smallest stack counted on dev (the default, or a given-up entry's, when less): what a
 * launch in a context the driver cannot name is counted from. Caller holds stack_lock. */
static uint64_t lowest_on(int dev)
{
    uint64_t lowest = given_up_floor < DEFAULT_STACK ? given_up_floor : DEFAULT_STACK;
    for (int i = 0; i < CONTEXTS; i++)
        if (contexts[i].ctx != NULL && contexts[i].dev == dev &&
            floor_of(&contexts[i]) < lowest)
            lowest = floor_of(&contexts[i]);
    return lowest;
}

/* ctx's stack as the driver says (`otherwise` when it cannot), asked with ctx current: pushed
 * for the question when another is. */
static uint64_t ask_stack(CUcontext ctx, uint64_t otherwise)
{
    CUcontext current = NULL, popped = NULL;
    if (real.cuCtxGetLimit == NULL || real.cuCtxGetCurrent == NULL ||
        real.cuCtxGetCurrent(&current) != CUDA_SUCCESS)
        return otherwise;
    int push = current != ctx;
    if (push && (real.cuCtxPushCurrent_v2 == NULL || real.cuCtxPopCurrent_v2 == NULL ||
                 real.cuCtxPushCurrent_v2(ctx) != CUDA_SUCCESS))
        return otherwise;
    size_t now = 0;
    CUresult rc = real.cuCtxGetLimit(&now, CU_LIMIT_STACK_SIZE);
    if (push && (real.cuCtxPopCurrent_v2(&popped) != CUDA_SUCCESS || popped != ctx))
        vgpu_log(VGPU_LOG_ERROR, "the context pushed to ask its stack did not pop back; this "
                 "thread's current context may have changed");
    return rc == CUDA_SUCCESS && now != 0 ? now : otherwise;
}

void vgpu_stack_context_made(CUcontext ctx, const void *made, int dev,
                             enum vgpu_context_kind kind)
{
    if (ctx == NULL || dev < 0 || dev >= VGPU_REGION_MAX_DEVICES)
        return;
    lock_stack();
    struct counted_context *c = entry_of(ctx);
    /* A handle the driver gives out again for a new context is that context's. */
    if (c != NULL && kind != VGPU_CONTEXT_PRIMARY)
        __atomic_store_n(&c->ctx, NULL, __ATOMIC_RELEASE);
    /* A retain makes nothing while the primary context is held, but may have made it anew (the
     * last release raced it, or a green context's creation made it unseen): its stack is asked
     * at the next raise, the least it may be meanwhile what it was counted at, or the default.
     * A raise counted before is no longer its to undo. */
    if (c != NULL && kind == VGPU_CONTEXT_PRIMARY) {
        c->at_least = floor_of(c) < DEFAULT_STACK ? floor_of(c) : DEFAULT_STACK;
        new_generation(c);
        __atomic_store_n(&c->stack, 0, __ATOMIC_RELEASE);
    }
    c = enter(ctx, made, dev, kind);
    c->made = made;
    c->kind = kind;
    if (kind == VGPU_CONTEXT_GREEN) /* counted at its primary context's stack */
        for (int i = 0; i < CONTEXTS; i++)
            if (contexts[i].ctx != NULL && &contexts[i] != c && shared(&contexts[i], c)) {
                c->stack = contexts[i].stack;
                c->at_least = contexts[i].at_least;
            }
    refloor();
    vgpu_unlock(&stack_lock);
}

int vgpu_stack_context_gone(const void *made)
{
    int dev = -1;
    lock_stack();
    vgpu_kernels_forget(); /* its modules' kernel handles may name others next */
    for (int i = 0; i < CONTEXTS; i++)
        if (contexts[i].ctx != NULL && contexts[i].made == made) {
            dev = contexts[i].dev;
            __atomic_store_n(&contexts[i].ctx, NULL, __ATOMIC_RELEASE);
        }
    refloor();
    vgpu_unlock(&stack_lock);
    return dev;
}

/* The primary context starts at the default again. Its entry stays, not asked (a retain racing
 * the last release may have made it anew and entered it already: removed, the floor would rise
 * past it); one met only in use may have been it, and goes as one given up. Created and green
 * contexts keep theirs. */
void vgpu_stack_primary_gone(int dev)
{
    lock_stack();
    vgpu_kernels_forget(); /* its modules' kernel handles may name others next */
    for (int i = 0; i < CONTEXTS; i++) {
        struct counted_context *c = &contexts[i];
        if (c->ctx == NULL || c->dev != dev)
            continue;
        if (primary_limits(c->kind)) {
            c->at_least = DEFAULT_STACK;
            new_generation(c);
            __atomic_store_n(&c->stack, 0, __ATOMIC_RELEASE);
        } else if (c->kind == VGPU_CONTEXT_SEEN) {
            if (floor_of(c) < given_up_floor)
                given_up_floor = floor_of(c);
            __atomic_store_n(&c->ctx, NULL, __ATOMIC_RELEASE);
        }
    }
    refloor();
    vgpu_unlock(&stack_lock);
}

/* After the current context's stack on dev was set to value (0 counted as 1: 0 means "not
 * asked yet", the driver's default, which is more). Another thread's launch refused meanwhile
 * does not undo it (a new generation). */
static void stack_now(int dev, uint64_t value)
{
    CUcontext ctx = NULL;
    if (real.cuCtxGetCurrent == NULL || real.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == NULL)
        return;
    lock_stack();
    struct counted_context *c = enter(ctx, ctx, dev, VGPU_CONTEXT_SEEN);
    new_generation(c);
    count_stack(c, value != 0 ? value : 1);
    vgpu_unlock(&stack_lock);
}

/* ---- cuCtxSetLimit ----------------------------------------------------------------------- */

VGPU_EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value)
{
    if (!ready() || real.cuCtxSetLimit == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    int dev = current_device();
    uint64_t more = dev >= 0 && vgpu_region_limit(dev) != 0 ? may_add(limit, value, dev) : 0;
    if (more != 0 && reserve_raise(dev, more, "cuCtxSetLimit") != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real.cuCtxSetLimit(limit, value);
    if (more != 0) {
        vgpu_footprint_grew(dev, more, rc == CUDA_SUCCESS ? more : 0);
        vgpu_mem_op_end();
    }
    if (rc == CUDA_SUCCESS && limit == CU_LIMIT_STACK_SIZE && dev >= 0)
        stack_now(dev, value);
    return rc;
}

/* ---- the stack a kernel needs, which the driver raises at its launch ---------------------- */

/* What the driver says f's threads need, asked as a CUfunction and else as a CUkernel (cast to
 * CUfunction, as cuLaunchKernel allows; cuda.h documents cuFuncGetAttribute for CUfunction
 * alone) on the current device, or device 0 when no context is current (a CUkernel launched on
 * a stream needs none); 0 when neither answers. */
static int ask_local_bytes(CUfunction f)
{
    int bytes = 0;
    if (real.cuFuncGetAttribute != NULL &&
        real.cuFuncGetAttribute(&bytes, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, f) == CUDA_SUCCESS)
        return bytes > 0 ? bytes : 0;
    int dev = current_device();
    dev = dev >= 0 ? dev : 0;
    bytes = 0;
    if (real.cuKernelGetAttribute != NULL &&
        real.cuKernelGetAttribute(&bytes, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, (CUkernel)(void *)f,
                                  (CUdevice)dev) == CUDA_SUCCESS)
        return bytes > 0 ? bytes : 0;
    return 0;
}

/* A kernel not in the table: asked, and kept (unless a module went meanwhile: kernels.h). Out
 * of line, as is the raise below: what every launch runs then needs no stack frame of its own
 * (hook/README.md, "Overhead"). */
static __attribute__((noinline)) uint64_t learn_local_bytes(CUfunction f)
{
    uint64_t forgotten = vgpu_kernels_forgotten();
    int bytes = ask_local_bytes(f);
    vgpu_kernel_keep(f, (uint32_t)bytes, forgotten);
    return (uint64_t)bytes;
}

/* f's local memory per thread (0, kept as such, when the driver cannot say: it is asked once
 * a kernel, not at every launch). */
uint64_t vgpu_kernel_local_bytes(CUfunction f)
{
    if (f == NULL)
        return 0;
    uint64_t known;
    if (vgpu_kernel_known(f, &known))
        return known;
    return learn_local_bytes(f);
}

/* The context a launch on stream runs in: a default stream's is the current one; a named
 * stream's its own (a CUkernel runs there whatever is current, and a CUfunction's stream must
 * be the current context's: cuda.h, cuLaunchKernel). NULL: none is current, or the driver
 * cannot name the stream's (a green context's stream before CUDA 12.5). */
static CUcontext launch_context(CUstream stream)
{
    CUcontext ctx = NULL;
    if (!vgpu_default_stream(stream))
        return vgpu_stream_context(stream);
    return real.cuCtxGetCurrent != NULL && real.cuCtxGetCurrent(&ctx) == CUDA_SUCCESS ? ctx : NULL;
}

/* A kernel needing more than the floor, launched on stream: the raise in the context it runs in,
 * on that context's device (none when no context is current for a default stream: the driver
 * then refuses the launch). A context not counted yet is asked; one the driver cannot name is
 * counted from the smallest stack on its device, and nothing is kept for it (each such launch
 * reserves again, until a measurement settles it); one whose device it cannot name either is
 * refused. Returns 1 << dev when a raise was counted, 0 when none is needed, -1 when it does not
 * fit or cannot be placed. */
static __attribute__((noinline)) int raise_before(uint64_t local, CUstream stream)
{
    CUcontext ctx = launch_context(stream);
    if (ctx != NULL && holds(ctx, local)) /* asked before its device: the common case */
        return 0;
    int dev = !vgpu_default_stream(stream) ? vgpu_stream_device(stream)
              : ctx != NULL                ? current_device()
                                           : -1;
    if (dev == VGPU_DEVICE_UNKNOWN && vgpu_region_any_limit()) {
        static int told;
        if (!__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED))
            vgpu_log(VGPU_LOG_WARN, "refusing launches needing more stack a thread than %llu "
                     "bytes on a stream whose device the driver cannot name (a green context's "
                     "before CUDA 12.5): their raise would go uncounted",
                     (unsigned long long)__atomic_load_n(&vgpu_floor_stack, __ATOMIC_RELAXED));
        return -1;
    }
    if (dev < 0 || vgpu_region_limit(dev) == 0)
        return 0;
    /* Counting a raise takes stack_lock, a device's footprint lock and others: on a thread
     * that holds one already (a signal handler's launch inside the library, locks.h) it
     * would wait for ever. And while this thread's own raise is under way (counted, its launch
     * not answered yet) a launch is a handler's inside that launch: its raise would be taken
     * for the outer launch's second, and the outer's memory operation ended twice (no
     * measurement would settle anything again). */
    if (vgpu_holds_a_lock() || (raising != 0 && !several_kernels))
        return refuse_inside();
    lock_stack();
    struct counted_context *c = ctx != NULL ? enter(ctx, ctx, dev, VGPU_CONTEXT_SEEN) : NULL;
    uint64_t counted = c == NULL           ? lowest_on(dev)
                       : c->stack != 0 ? c->stack
                                       : ask_stack(ctx, c->at_least);
    int rc = 0, again = 0;
    if (local > counted) {
        uint64_t more = stack_bytes(dev, local - counted);
        rc = reserve_raise(dev, more, "a kernel launch (its stack)") == 0 ? 1 << dev : -1;
        if (rc > 0) { /* counted now: the operation stays open until the launch is made */
            vgpu_footprint_grew(dev, more, more);
            /* Raised again in this launch (two kernels on one device, which the driver
             * refuses): one operation a device, the first's, and this context's stack counted
             * as it was, there being no second raise to undo. */
            again = (raising & rc) != 0;
            if (again)
                vgpu_mem_op_end();
            else
                raised_from[dev] = (struct raised){c, c != NULL ? c->generation : 0, counted};
            raising |= rc;
        }
    }
    if (c != NULL)
        count_stack(c, rc > 0 && !again ? local : counted);
    vgpu_unlock(&stack_lock);
    return rc;
}

int vgpu_stack_before_needs(uint64_t local, CUstream stream)
{
    if (local <= __atomic_load_n(&vgpu_floor_stack, __ATOMIC_ACQUIRE))
        return 0;
    return raise_before(local, stream);
}

int vgpu_stack_check_launch(CUfunction f, CUstream stream)
{
    /* The region is attached at most once a process (its caps with it): the answer is kept
     * for the launches' fast path (vgpu_stack_fits). */
    int capped = vgpu_region_any_limit();
    int checked = capped ? VGPU_STACK_BY_TABLE : VGPU_STACK_NEVER;
    if (__atomic_load_n(&vgpu_stack_checked, __ATOMIC_RELAXED) != checked) /* a line not dirtied */
        __atomic_store_n(&vgpu_stack_checked, checked, __ATOMIC_RELEASE);
    return vgpu_stack_before_needs(f != NULL && capped ? vgpu_kernel_local_bytes(f) : 0, stream);
}

/* After a launch the driver refused (or the library did, a later kernel's raise not fitting),
 * for which raises were counted on the devices of `raised`: the driver may not have made them.
 * Their stacks are counted as they were before, so that the next launch reserves again:
 * counted twice until a measurement settles it, rather than a raise made later counted never.
 * (Not "asked anew": that is the driver's default, and a stack cut below it would be lost.) */
static __attribute__((noinline)) void forget_raises(int raised)
{
    lock_stack();
    for (int d = 0; d < VGPU_REGION_MAX_DEVICES; d++) {
        struct counted_context *c = raised & (1 << d) ? raised_from[d].c : NULL;
        if (c != NULL && c->ctx != NULL && c->generation == raised_from[d].generation)
            count_stack(c, raised_from[d].stack);
        else if (c != NULL && raised_from[d].stack < given_up_floor) {
            /* The entry was given up, its context made anew or its stack set since the raise was
             * counted: a context given up, if it lives on, holds the stack from before. */
            given_up_floor = raised_from[d].stack;
            refloor();
        }
    }
    vgpu_unlock(&stack_lock);
}

void vgpu_stack_launched(int raised, CUresult rc)
{
    if (rc != CUDA_SUCCESS)
        forget_raises(raised);
    raising &= ~raised;
    for (int d = 0; d < VGPU_REGION_MAX_DEVICES; d++)
        if (raised & (1 << d))
            vgpu_mem_op_end();
}

/* A module or library is unloaded: its kernels' handles may be another kernel's next.
 * Forgotten before the driver frees them too, so a kernel another thread loads and launches
 * once they are free is asked about, never taken for the one unloaded; and after, for an
 * answer about the unloaded one asked meanwhile (kernels.h, vgpu_kernel_keep). */
static CUresult forget_functions(CUresult rc)
{
    if (rc == CUDA_SUCCESS)
        vgpu_kernels_forget();
    return rc;
}

VGPU_EXPORT CUresult cuModuleUnload(CUmodule module)
{
    if (!ready() || real.cuModuleUnload == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    vgpu_kernels_forget();
    return forget_functions(real.cuModuleUnload(module));
}

VGPU_EXPORT CUresult cuLibraryUnload(CUlibrary library)
{
    if (!ready() || real.cuLibraryUnload == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    vgpu_kernels_forget();
    return forget_functions(real.cuLibraryUnload(library));
}
