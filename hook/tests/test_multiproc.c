/* test_multiproc.c - the cap across processes, run preloaded over the fake driver.
 *   fork-kill  (cap 1 GiB): kill -9 of a holder, fork, exec, _exit, read the region as the
 *              node monitor does (header checks, fcntl liveness).
 *   hammer     (cap 256 MiB): 8 processes x 4 threads allocate and free near the cap for
 *              HAMMER_SECONDS, two are killed with SIGKILL half-way; the cap must hold at every
 *              instant, nobody may deadlock, and all memory must come back.
 *   exec-child: used by fork-kill after exec.
 * Holes of an adversarial review, each in its own region (cap 1 GiB):
 *   uids         a process of another uid shares the cap (root only; else skipped)
 *   deleted      the region file removed while a process holds memory: a new process refuses CUDA
 *   truncated    the region file truncated under live processes: they refuse allocations instead
 *                of dying of SIGBUS, and new processes refuse CUDA (also once it is zero-extended)
 *   truncated-unmappable  (with faults.so) where the handler cannot map its zeros, the SIGBUS kills
 *   kill-threads kill -9 of processes whose threads allocate and free: nothing leaks while
 *                another process lives
 *   together     (contexts of 20 MiB) a process that finds no region file while a peer creates one
 *                uses the peer's region (the window held open by late_open.so); then
 *                TOGETHER_ROUNDS rounds of 16 processes starting at once where there is no region
 *                file yet: every one gets CUDA, and all share one region
 *   lingering-exit  a process that returns from main without freeing, held alive by a library
 *                destructor that runs after libvgpu's (linger.so): its memory stays counted
 *   slots        (cap 4 GiB) 1024 live processes of 1 MiB each take every slot: the next one is
 *                refused memory with a log line saying why; once all but one are killed (kill -9),
 *                it gets its memory on asking again, and a new process takes a dead one's slot
 *                and gets back what they held
 *   dead-mid-reservation  a process killed with a reservation announced: the claimant of its
 *                slot gives back its ledger and its announcement
 *   stopped-sibling  a process stopped (SIGSTOP) wherever it was in its allocations: the others'
 *                go on; one stopped mid-reservation near the cap holds another's up a bounded time
 *   odd-generation  a slot's generation left odd by a process killed while changing it: the
 *                next owner leaves it even
 *   blocked-stderr  a process blocked writing its claim's log line to a stderr nobody reads:
 *                the others of the container go on
 *   replaced-descriptor  a child that put another file at the region descriptor's number is
 *                refused memory rather than claim (and reap) through that file
 *   older-layout  a region an older library made: refused while one of its processes lives, made
 *                afresh once none does
 *   refused-child, uids-child, together-child, linger-child: run after exec by the modes above. */
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "check.h"
#include "faults.h"
#include "fake_state.h"
#include "nvml_view.h"
#include "vgpu_region.h"

static const uint64_t MiB = UINT64_C(1) << 20;

/* ---- the node monitor's view: read-only mapping plus F_GETLK ---------------------------- */

static const struct vgpu_region *region;
static int region_fd = -1;

static int open_region(void)
{
    const char *path = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    region_fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (region_fd < 0 || fstat(region_fd, &st) != 0 || st.st_size < VGPU_REGION_FILE_SIZE)
        return 0;
    void *m = mmap(NULL, VGPU_REGION_FILE_SIZE, PROT_READ, MAP_SHARED, region_fd, 0);
    if (m == MAP_FAILED)
        return 0;
    region = m;
    const struct vgpu_region_header *h = &region->header;
    return h->magic == VGPU_REGION_MAGIC && h->version == VGPU_REGION_VERSION &&
           h->header_size == 128 && h->device_size == 128 && h->slot_size == 192 &&
           h->max_devices == 16 && h->max_slots == 1024 && h->file_size == 198784 &&
           h->devices_offset == 128 && h->slots_offset == 2176;
}

static uint64_t used(int dev)
{
    return vgpu_region_device_used(region, dev);
}

/* The pid holding slot i's byte (in our namespace), or 0 when nobody alive does. */
static pid_t slot_holder(uint32_t i)
{
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET,
                       .l_start = (off_t)vgpu_region_slot_lock_offset(i), .l_len = 1};
    if (fcntl(region_fd, F_GETLK, &fl) != 0 || fl.l_type == F_UNLCK)
        return 0;
    return fl.l_pid;
}

static int find_slot(pid_t pid)
{
    for (uint32_t i = 0; i < region->header.slot_high_water; i++)
        if (region->slots[i].pid == pid)
            return (int)i;
    return -1;
}

/* ---- helpers ------------------------------------------------------------------------------ */

static const char *self_path;

/* What build/vgpu-region (the reference reader) prints for the region. */
static const char *region_json(void)
{
    static char out[16384];
    char command[1024];
    snprintf(command, sizeof command, "\"$(dirname '%s')/../vgpu-region\" '%s'", self_path,
             getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE"));
    FILE *pipe_in = popen(command, "r");
    size_t n = pipe_in ? fread(out, 1, sizeof out - 1, pipe_in) : 0;
    out[n] = '\0';
    if (pipe_in)
        pclose(pipe_in);
    return out;
}

static void cuda_start(void)
{
    CUcontext ctx;
    cuInit(0);
    cuDevicePrimaryCtxRetain(&ctx, 0);
    cuCtxSetCurrent(ctx);
}

static uint64_t seen_used(void)
{
    size_t free_b, total_b;
    cuMemGetInfo_v2(&free_b, &total_b);
    return total_b - free_b;
}

static int wait_status(pid_t pid)
{
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return status;
}

static int exited_ok(pid_t pid)
{
    int status = wait_status(pid);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* A process of the container that allocates and frees 2 MiB: its slot claim reaps the dead
 * (the only way a process's memory comes back once it is gone). */
static void reap_by_a_new_process(void)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        cuda_start();
        CUdeviceptr p;
        int fine = cuMemAlloc_v2(&p, 2 * MiB) == CUDA_SUCCESS && cuMemFree_v2(p) == CUDA_SUCCESS;
        _exit(fine ? 0 : 1);
    }
    wait_status(pid);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Whether pid exits with status 0 within `seconds`; killed (and reaped) if it has not. */
static int exited_ok_within(pid_t pid, double seconds)
{
    int status = -1;
    pid_t got = 0;
    for (double t0 = now_s(); got == 0 && now_s() - t0 < seconds;) {
        got = waitpid(pid, &status, WNOHANG);
        if (got == 0)
            sleep_s(0.05);
    }
    if (got == 0) {
        kill(pid, SIGKILL);
        wait_status(pid);
        return 0;
    }
    return got == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* Forks a child that runs take() and then waits to be killed. Once the child has said whether
 * take() succeeded (checked, as `what`), returns its pid (-1 if it could not be started). */
static pid_t fork_holder(int (*take)(void), const char *what)
{
    int ready[2];
    if (pipe(ready) != 0) {
        check(0, "%s (pipe: %s)", what, strerror(errno));
        return -1;
    }
    pid_t pid = fork();
    if (pid == 0) {
        char ok = take() ? 'y' : 'n';
        if (write(ready[1], &ok, 1) != 1)
            _exit(2);
        pause();
        _exit(0);
    }
    close(ready[1]); /* so that the read below ends if the child is gone */
    char ok = 0;
    check(pid > 0 && read(ready[0], &ok, 1) == 1 && ok == 'y', "%s", what);
    close(ready[0]);
    return pid;
}

/* A new process of the container that allocates `mib` MiB and exits, 0 if it got them (not
 * waited for). */
static pid_t allocating_process(uint64_t mib)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        cuda_start();
        CUdeviceptr p;
        _exit(cuMemAlloc_v2(&p, mib * MiB) == CUDA_SUCCESS ? 0 : 1);
    }
    return pid;
}

/* Whether a new process of the container gets `mib` MiB (its slot claim reaps the gone). */
static int new_process_gets(uint64_t mib) { return exited_ok(allocating_process(mib)); }

/* ---- fork-kill ---------------------------------------------------------------------------- */

/* A holder of 800 MiB that then opens and closes the region file (as any reader may): the close
 * must not drop its slot lock (a POSIX record lock would go, and it would be reaped alive). */
static int take_800_mib_then_close(void)
{
    cuda_start();
    CUdeviceptr p;
    if (cuMemAlloc_v2(&p, 800 * MiB) != CUDA_SUCCESS)
        return 0;
    int other = open(getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE"), O_RDONLY | O_CLOEXEC);
    return other >= 0 && close(other) == 0;
}

static void close_keeps_locks(void)
{
    pid_t holder = fork_holder(take_800_mib_then_close, "holder allocated 800 MiB, then opened "
                               "and closed the region file");
    if (holder < 0)
        return;
    int slot = find_slot(holder);
    check(slot >= 0 && slot_holder((uint32_t)slot) != 0,
          "after the close its slot byte is still locked");
    pid_t next = fork();
    if (next == 0) {
        cuda_start();
        CUdeviceptr p;
        exit(cuMemAlloc_v2(&p, 800 * MiB) == CUDA_ERROR_OUT_OF_MEMORY ? 0 : 1);
    }
    check(exited_ok(next), "another process is refused 800 MiB (the live holder is not reaped)");
    check(used(0) == 800 * MiB, "the region still shows the holder's 800 MiB (%llu MiB)",
          (unsigned long long)(used(0) / MiB));
    kill(holder, SIGKILL);
    wait_status(holder);
}

static int take_800_mib(void)
{
    cuda_start();
    CUdeviceptr p;
    return cuMemAlloc_v2(&p, 800 * MiB) == CUDA_SUCCESS;
}

static void kill_holder(void)
{
    pid_t holder = fork_holder(take_800_mib, "holder allocated 800 MiB");
    if (holder < 0)
        return;
    check(used(0) == 800 * MiB, "the region shows 800 MiB in use");
    int slot = find_slot(holder);
    /* An open-file-description lock: F_GETLK reports it with l_pid -1. */
    check(slot >= 0 && slot_holder((uint32_t)slot) != 0,
          "the holder's slot byte is locked (F_GETLK)");
    char expect[256];
    snprintf(expect, sizeof expect, "\"pid\": %d, \"live\": true", holder);
    const char *json = region_json();
    check(strstr(json, expect) != NULL && strstr(json, "\"used_bytes\": {\"0\": 838860800}") != NULL
          && strstr(json, "\"limit_bytes\": 1073741824, \"used_bytes\": 838860800") != NULL,
          "vgpu-region shows the live holder and its 800 MiB:\n%s", json);
    kill(holder, SIGKILL);
    wait_status(holder);
    check(slot >= 0 && slot_holder((uint32_t)slot) == 0, "after kill -9 nobody holds the byte");
    snprintf(expect, sizeof expect, "\"pid\": %d, \"live\": false", holder);
    check(strstr(region_json(), expect) != NULL, "vgpu-region shows it dead");
    check(used(0) == 800 * MiB, "the dead holder's memory is still counted until reaped");

    pid_t next = fork();
    if (next == 0) {
        cuda_start();
        CUdeviceptr p;
        int fine = cuMemAlloc_v2(&p, 900 * MiB) == CUDA_SUCCESS && seen_used() == 900 * MiB;
        exit(fine ? 0 : 1); /* a normal exit, without freeing */
    }
    check(exited_ok(next), "a new process gets 900 MiB: the killed process's 800 MiB came back");
    check(region->header.reaped_slots >= 1, "reaped_slots counts it (%llu)",
          (unsigned long long)region->header.reaped_slots);
    int next_slot = find_slot(next);
    check(used(0) == 900 * MiB && next_slot >= 0 && slot_holder((uint32_t)next_slot) == 0,
          "after a normal exit its 900 MiB stay counted, its slot dead, until reaped (%llu MiB)",
          (unsigned long long)(used(0) / MiB));
    reap_by_a_new_process();
    check(used(0) == 0, "a new process's first allocation reaps it: the region is back to 0 (%llu)",
          (unsigned long long)used(0));
}

/* A process that dies holding the creation lock (byte 0) must not wedge the others (HAMi #2500:
 * a semaphore held by a dead process did). */
static int take_creation_lock(void)
{
    int fd = open(getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE"), O_RDWR | O_CLOEXEC);
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    return fd >= 0 && fcntl(fd, F_SETLK, &fl) == 0;
}

static void creation_lock_owner_dies(void)
{
    pid_t locker = fork_holder(take_creation_lock, "a process holds the creation lock");
    if (locker < 0)
        return;
    pid_t claimer = fork();
    if (claimer == 0) {
        cuda_start();
        CUdeviceptr p;
        exit(cuMemAlloc_v2(&p, 10 * MiB) == CUDA_SUCCESS ? 0 : 1);
    }
    struct timespec wait_a_bit = {0, 300 * 1000 * 1000};
    nanosleep(&wait_a_bit, NULL);
    check(waitpid(claimer, NULL, WNOHANG) == 0, "a new process waits while the lock is held");
    double killed_at = now_s();
    kill(locker, SIGKILL);
    wait_status(locker);
    int fine = exited_ok(claimer);
    double waited = now_s() - killed_at;
    check(fine && waited < 2.0, "kill -9 of the holder frees it: the new process went on %.3f s "
          "later", waited);
}

static void fork_and_exec(const char *self)
{
    cuda_start();
    CUdeviceptr mine;
    check(cuMemAlloc_v2(&mine, 300 * MiB) == CUDA_SUCCESS && used(0) == 300 * MiB,
          "parent holds 300 MiB");
    int slot = find_slot(getpid());
    check(slot >= 0, "parent has a slot");
    cuLaunchKernel(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    uint64_t launched = slot >= 0 ? region->slots[slot].last_launch_unix_ns : 0;
    uint64_t now_ns = (uint64_t)wall.tv_sec * 1000000000u + (uint64_t)wall.tv_nsec;
    check(launched != 0 && launched <= now_ns && now_ns - launched < UINT64_C(10000000000),
          "a kernel launch stamps the slot's last_launch_unix_ns");

    pid_t child = fork();
    if (child == 0) {
        CUdeviceptr p;
        /* The child has a description of its own: it sees the parent's lock. */
        int fine = slot >= 0 && slot_holder((uint32_t)slot) != 0;
        fine &= seen_used() == 300 * MiB;
        fine &= cuMemAlloc_v2(&p, 200 * MiB) == CUDA_SUCCESS && seen_used() == 500 * MiB;
        cuMemFree_v2(mine); /* the parent's pointer is not the child's to give back */
        fine &= seen_used() == 500 * MiB;
        fine &= find_slot(getpid()) >= 0 && find_slot(getpid()) != find_slot(getppid());
        exit(fine ? 0 : 1);
    }
    check(exited_ok(child), "fork: the child sees the parent's slot live and its 300 MiB, adds "
          "200 in its own slot, and cannot release the parent's");
    reap_by_a_new_process();
    check(used(0) == 300 * MiB, "once the child is gone and reaped: 300 MiB (%llu MiB)",
          (unsigned long long)(used(0) / MiB));

    child = fork();
    if (child == 0) {
        setenv("CUDA_DEVICE_MEMORY_LIMIT", "2g", 1); /* disagrees with the region: ignored */
        execl(self, self, "exec-child", (char *)NULL);
        _exit(3);
    }
    check(exited_ok(child), "exec: a new image allocates 100 MiB against the same region (400)");
    reap_by_a_new_process();
    check(used(0) == 300 * MiB, "once it is gone and reaped: 300 MiB");

    child = fork();
    if (child == 0) {
        CUdeviceptr p;
        cuMemAlloc_v2(&p, 200 * MiB);
        _exit(0); /* no destructors: as with exit, only reaping gives this back */
    }
    wait_status(child);
    check(used(0) == 500 * MiB, "_exit without cleanup leaves 200 MiB counted for now");
    CUdeviceptr big;
    check(cuMemAlloc_v2(&big, 700 * MiB) == CUDA_SUCCESS,
          "700 MiB fits once the dead child's 200 MiB is reaped");
    check(used(0) == 1000 * MiB, "region: 1000 MiB");
    cuMemFree_v2(big);
    cuMemFree_v2(mine);
    check(used(0) == 0, "everything freed");
}

static int exec_child(void)
{
    cuda_start();
    size_t free_b, total_b;
    cuMemGetInfo_v2(&free_b, &total_b);
    CUdeviceptr p;
    int fine = total_b == 1024 * MiB; /* the region's cap, not this env's 2g */
    fine &= cuMemAlloc_v2(&p, 100 * MiB) == CUDA_SUCCESS && seen_used() == 400 * MiB;
    return fine ? 0 : 1;
}

/* ---- holes ------------------------------------------------------------------------------- */

static const char *region_path(void) { return getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE"); }

/* Runs this program again as `mode` in a fresh image (a fork would share our mapping). */
static pid_t spawn_self(const char *mode, int other_uid)
{
    pid_t pid = fork();
    if (pid == 0) {
        if (other_uid && (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0))
            _exit(3);
        execl(self_path, self_path, mode, (char *)NULL);
        _exit(4);
    }
    return pid;
}

static int uids_child(void)
{
    cuda_start();
    CUdeviceptr p, q;
    int refused = cuMemAlloc_v2(&p, 800 * MiB) == CUDA_ERROR_OUT_OF_MEMORY;
    int fits = cuMemAlloc_v2(&q, 200 * MiB) == CUDA_SUCCESS;
    printf("uid %d: 800 MiB %s, 200 MiB %s, container usage %llu MiB\n", (int)getuid(),
           refused ? "refused" : "allocated", fits ? "allocated" : "refused",
           (unsigned long long)(seen_used() / MiB));
    return refused && fits && seen_used() == 1000 * MiB ? 0 : 1;
}

static void other_uid(void)
{
    if (geteuid() != 0) {
        check(1, "SKIP: a second uid needs root");
        return;
    }
    cuda_start();
    CUdeviceptr p;
    check(cuMemAlloc_v2(&p, 800 * MiB) == CUDA_SUCCESS, "uid 0 holds 800 MiB of the 1 GiB cap");
    struct stat st;
    check(stat(region_path(), &st) == 0 && (st.st_mode & 0666) == 0666,
          "the region file is read-write for every uid (mode %o)", (unsigned)(st.st_mode & 07777));
    check(exited_ok(spawn_self("uids-child", 1)), "a process of uid 65534 shares the cap: "
          "800 MiB refused, 200 MiB fits");
    cuMemFree_v2(p);
}

/* A process that must not get CUDA: cuInit is refused with a log line naming why, and even
 * with the driver initialised behind libvgpu's back nothing is allocated or reported. */
static int refused_child(void)
{
    const char *why = getenv("EXPECT_REFUSAL");
    capture_begin();
    CUresult init = cuInit(0);
    const char *log = capture_end();
    printf("cuInit: %d; log: %s", init, log);
    int fine = init == CUDA_ERROR_NOT_PERMITTED && strstr(log, why) != NULL &&
               strstr(log, "CUDA is refused") != NULL;
    CUresult (*real_init)(unsigned) = (CUresult(*)(unsigned))fake_cuda_entry("cuInit");
    CUcontext ctx;
    real_init(0);
    cuDevicePrimaryCtxRetain(&ctx, 0);
    cuCtxSetCurrent(ctx);
    CUdeviceptr p;
    size_t free_b, total_b;
    fine &= cuMemAlloc_v2(&p, 100 * MiB) != CUDA_SUCCESS && fake_cuda_device_used(0) == 0;
    fine &= cuMemGetInfo_v2(&free_b, &total_b) == CUDA_ERROR_NOT_PERMITTED;
    return fine ? 0 : 1;
}

static int refused_with(const char *why)
{
    setenv("EXPECT_REFUSAL", why, 1);
    int fine = exited_ok(spawn_self("refused-child", 0));
    unsetenv("EXPECT_REFUSAL");
    return fine;
}

static void deleted(void)
{
    cuda_start();
    CUdeviceptr p;
    check(cuMemAlloc_v2(&p, 800 * MiB) == CUDA_SUCCESS, "a process holds 800 MiB of 1 GiB");
    check(unlink(region_path()) == 0, "the region file is removed");
    check(refused_with("processes of this container still use"),
          "a new process refuses CUDA rather than start a fresh region (a second cap)");
    check(access(region_path(), F_OK) != 0, "and made no new region file");
    check(cuMemAlloc_v2(&p, 800 * MiB) == CUDA_ERROR_OUT_OF_MEMORY,
          "the live process still enforces the cap");
}

/* Holds 300 MiB, then (after the truncation) must refuse and report nothing, yet free; stays
 * attached to the old region until told to exit. */
static int truncated_victim(int ready_fd, int go_fd)
{
    cuda_start();
    CUdeviceptr held, more;
    char byte = cuMemAlloc_v2(&held, 300 * MiB) == CUDA_SUCCESS ? 'y' : 'n';
    if (write(ready_fd, &byte, 1) != 1 || read(go_fd, &byte, 1) != 1)
        return 2;
    size_t free_b, total_b;
    int fine = cuMemAlloc_v2(&more, 100 * MiB) == CUDA_ERROR_OUT_OF_MEMORY;
    fine &= cuMemGetInfo_v2(&free_b, &total_b) == CUDA_ERROR_NOT_PERMITTED;
    fine &= cuMemFree_v2(held) == CUDA_SUCCESS && fake_cuda_device_used(0) == 0;
    byte = fine ? 'y' : 'n';
    if (write(ready_fd, &byte, 1) != 1 || read(go_fd, &byte, 1) != 1)
        return 2;
    return 0;
}

/* A SIGBUS elsewhere (the application's own mapping of a truncated file) is not libvgpu's to
 * swallow: with no handler the process dies of it; a handler installed before is called. */
static void own_sigbus(int sig, siginfo_t *info, void *context)
{
    (void)sig, (void)info, (void)context;
    _exit(42);
}

/* A SIGBUS sent (not a fault in the region) kills a process with no handler of its own. */
static int raise_sigbus(void)
{
    cuda_start(); /* attaches the region: libvgpu's SIGBUS handler goes in */
    raise(SIGBUS);
    return 0; /* survived */
}

static int fault_elsewhere(int with_handler)
{
    if (with_handler) {
        struct sigaction action;
        memset(&action, 0, sizeof action);
        action.sa_sigaction = own_sigbus;
        action.sa_flags = SA_SIGINFO;
        sigaction(SIGBUS, &action, NULL);
    }
    cuda_start(); /* attaches the region: libvgpu's SIGBUS handler goes in */
    CUdeviceptr p;
    if (cuMemAlloc_v2(&p, MiB) != CUDA_SUCCESS)
        return 1;
    char path[] = "/tmp/vgpu-bus-XXXXXX";
    int fd = mkstemp(path);
    unlink(path);
    if (fd < 0 || ftruncate(fd, 4096) != 0)
        return 1;
    volatile const char *m = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED || ftruncate(fd, 0) != 0)
        return 1;
    return m[0]; /* SIGBUS */
}

/* Like truncated_victim, but the handler cannot map its zeros (faults.so): then the process
 * dies of the SIGBUS, as it would with no handler, rather than fault again at once. */
static int unmappable_victim(int ready_fd, int go_fd, faults_set_fn faults_set)
{
    cuda_start();
    CUdeviceptr held, more;
    struct sigaction bus;
    char byte = cuMemAlloc_v2(&held, 300 * MiB) == CUDA_SUCCESS &&
                sigaction(SIGBUS, NULL, &bus) == 0 && (bus.sa_flags & SA_SIGINFO) &&
                faults_set("map-fixed", 1) == 0 ? 'y' : 'n';
    if (write(ready_fd, &byte, 1) != 1 || read(go_fd, &byte, 1) != 1)
        return 2;
    cuMemAlloc_v2(&more, 100 * MiB); /* reads the region: SIGBUS */
    return 0;
}

/* Run with faults.so preloaded (the rest of truncated without it). */
static void truncated_unmappable(void)
{
    faults_set_fn faults_set = faults_control();
    if (faults_set == NULL)
        return;
    int ready[2], go[2];
    if (pipe(ready) != 0 || pipe(go) != 0)
        return;
    fflush(stdout);
    pid_t victim = fork();
    if (victim == 0)
        _exit(unmappable_victim(ready[1], go[0], faults_set));
    close(ready[1]);
    close(go[0]);
    char byte = 0;
    check(read(ready[0], &byte, 1) == 1 && byte == 'y', "a process holds 300 MiB, libvgpu's "
          "SIGBUS handler in place; anonymous mappings at fixed addresses fail in it from now on");
    check(truncate(region_path(), 0) == 0, "the region file is truncated to 0 bytes");
    double told_at = now_s();
    int told = write(go[1], "g", 1) == 1;
    int status = wait_status(victim);
    check(told && WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS, "with no zeros to map over "
          "the region, its handler lets the SIGBUS kill it (status %#x, %.2f s after)", status,
          now_s() - told_at);
    close(ready[0]);
    close(go[1]);
}

/* Runs in processes other than this one: it never maps the region (its reads would fault). */
static void truncated(void)
{
    pid_t plain = fork();
    if (plain == 0)
        _exit(fault_elsewhere(0));
    int status = wait_status(plain);
    /* Under the sanitizers their own SIGBUS handler was first: it reports and exits 1. */
    const char *sanitized = getenv("VGPU_SANITIZED");
    int died = sanitized != NULL && strcmp(sanitized, "1") == 0
             ? !(WIFEXITED(status) && WEXITSTATUS(status) == 0)
             : WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS;
    check(died, "a SIGBUS outside the region still kills a process without a handler of its "
          "own (status %#x)", status);
    pid_t sent = fork();
    if (sent == 0)
        _exit(raise_sigbus());
    status = wait_status(sent);
    died = sanitized != NULL && strcmp(sanitized, "1") == 0
         ? !(WIFEXITED(status) && WEXITSTATUS(status) == 0)
         : WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS;
    check(died, "a sent SIGBUS (raise) kills a process without a handler of its own (status "
          "%#x)", status);
    pid_t handled = fork();
    if (handled == 0)
        _exit(fault_elsewhere(1));
    status = wait_status(handled);
    check(WIFEXITED(status) && WEXITSTATUS(status) == 42,
          "and reaches the handler the application installed first (status %#x)", status);

    int ready[2], go[2];
    if (pipe(ready) != 0 || pipe(go) != 0)
        return;
    pid_t victim = fork();
    if (victim == 0)
        _exit(truncated_victim(ready[1], go[0]));
    close(ready[1]); /* so that a read ends if the victim dies */
    close(go[0]);
    char byte = 0;
    check(read(ready[0], &byte, 1) == 1 && byte == 'y', "a process holds 300 MiB");
    check(truncate(region_path(), 0) == 0, "the region file is truncated to 0 bytes");
    byte = 0;
    int told = write(go[1], "g", 1) == 1;
    check(told && read(ready[0], &byte, 1) == 1 && byte == 'y', "the process survives: further "
          "allocations are refused, nothing is reported, its memory can still be freed");
    check(refused_with("too small"), "a new process refuses the truncated file");
    /* Zero-extended to the region's size it looks like a fresh file: refused while a process of
     * the old region lives. */
    check(truncate(region_path(), VGPU_REGION_FILE_SIZE) == 0, "the file is zero-extended");
    check(refused_with("processes of this container still use"),
          "a new process refuses it while a process of the old region lives");
    told = write(go[1], "g", 1) == 1;
    status = wait_status(victim);
    check(told && WIFEXITED(status) && WEXITSTATUS(status) == 0, "the process exits normally "
          "(status %#x%s)", status,
          WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS ? ": killed by SIGBUS" : "");
}

static int take_100_mib(void)
{
    cuda_start();
    CUdeviceptr p;
    return cuMemAlloc_v2(&p, 100 * MiB) == CUDA_SUCCESS;
}

static int take_10_mib(void)
{
    cuda_start();
    CUdeviceptr p;
    return cuMemAlloc_v2(&p, 10 * MiB) == CUDA_SUCCESS;
}

static void *churn_thread(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    CUcontext ctx;
    cuDevicePrimaryCtxRetain(&ctx, 0);
    cuCtxSetCurrent(ctx);
    CUdeviceptr ptr[4] = {0};
    for (;;) {
        int k = rand_r(&seed) % 4;
        if (ptr[k] != 0) {
            cuMemFree_v2(ptr[k]);
            ptr[k] = 0;
        } else if (cuMemAlloc_v2(&ptr[k], (1 + (size_t)(rand_r(&seed) % 8)) * MiB) != 0) {
            ptr[k] = 0;
        }
    }
    return NULL;
}

static void kill_threads(void)
{
    pid_t bystander = fork_holder(take_100_mib, "a bystander holds 100 MiB for the whole test");
    enum { ROUNDS = 32, CHURNERS = 16 };
    unsigned seed = (unsigned)getpid();
    for (int round = 0; round < ROUNDS; round++) {
        pid_t victim = fork();
        if (victim == 0) {
            cuda_start();
            pthread_t t[CHURNERS];
            for (int i = 0; i < CHURNERS; i++)
                pthread_create(&t[i], NULL, churn_thread, (void *)(uintptr_t)(round * 16 + i + 1));
            pause();
            _exit(0);
        }
        struct timespec nap = {0, (30 + rand_r(&seed) % 40) * 1000 * 1000};
        nanosleep(&nap, NULL);
        kill(victim, SIGKILL);
        wait_status(victim);
    }
    pid_t reaper = fork();
    if (reaper == 0) { /* its first allocation reaps the dead; the bystander keeps it from idle */
        cuda_start();
        CUdeviceptr p;
        int fine = cuMemAlloc_v2(&p, MiB) == CUDA_SUCCESS && cuMemFree_v2(p) == CUDA_SUCCESS;
        exit(fine ? 0 : 1);
    }
    check(exited_ok(reaper), "a new process allocates (and reaps the killed ones)");
    check(used(0) == 100 * MiB, "after %d kill -9 rounds of %d churning threads only the "
          "bystander's 100 MiB are counted: %.3f MiB (%llu bytes leaked)", ROUNDS, CHURNERS,
          (double)used(0) / (double)MiB, (unsigned long long)(used(0) - 100 * MiB));
    kill(bystander, SIGKILL);
    wait_status(bystander);
}

/* ---- slots ------------------------------------------------------------------------------- */

/* A holder of 1 MiB, told apart from one refused for want of a slot (its log captured). */
static char take_1_mib_or_say_why(void)
{
    capture_begin(); /* a context counts its memory: the slot may be claimed there */
    cuda_start();
    CUdeviceptr p;
    CUresult rc = cuMemAlloc_v2(&p, MiB);
    const char *log = capture_end();
    if (rc == CUDA_SUCCESS)
        return 'y';
    return strstr(log, "all 1024 process slots of the shared region are in use") != NULL ? 's'
                                                                                           : 'n';
}

/* After the retry pipe says so: tries for a slot every 0.1 s for 5 s; says 'y' once it has
 * 1 MiB, else 'n'. */
static int retry_1_mib(int said_fd)
{
    CUdeviceptr p;
    char said = 'n';
    for (double t0 = now_s(); now_s() - t0 < 5.0 && said == 'n'; sleep_s(0.1))
        if (cuMemAlloc_v2(&p, MiB) == CUDA_SUCCESS)
            said = 'y';
    return write(said_fd, &said, 1) == 1 ? 0 : 2;
}

/* Each slot is a process; a container with more processes at once than slots must refuse the
 * extra ones memory (not share a slot's ledger), and once they are gone, every slot being dead
 * must not keep the next process out: before, only empty slots were claimed, and the dead were
 * reaped only by a process that had claimed one. */
static void all_slots(void)
{
    enum { SLOTS = VGPU_REGION_MAX_SLOTS };
    static pid_t holder[SLOTS + 1]; /* [SLOTS]: the process refused for want of a slot */
    int admitted = 0, retry[2], retry_said = -1;
    char last = 0;
    if (pipe(retry) != 0)
        return;
    double started = now_s();
    fflush(stdout);
    for (int i = 0; i <= SLOTS; i++) {
        int ready[2];
        if (pipe(ready) != 0)
            break;
        pid_t pid = fork();
        if (pid == 0) {
            char said = take_1_mib_or_say_why();
            if (write(ready[1], &said, 1) != 1)
                _exit(2);
            if (said == 's' && read(retry[0], &said, 1) == 1)
                _exit(retry_1_mib(ready[1]));
            pause();
            _exit(0);
        }
        close(ready[1]);
        last = 0;
        if (pid < 0 || read(ready[0], &last, 1) != 1)
            last = 0;
        if (last != 'y') {
            holder[SLOTS] = pid;
            retry_said = ready[0]; /* it answers the retry there */
            break;
        }
        close(ready[0]);
        holder[i] = pid;
        admitted++;
    }
    close(retry[0]);
    double filled = now_s() - started;
    check(admitted == SLOTS && last == 's',
          "1024 processes of 1 MiB each took every slot (%d admitted in %.1f s); the next is "
          "refused memory, its log saying all 1024 slots are in use (%s)", admitted, filled,
          last == 's' ? "so it was" : last == 'y' ? "it was given memory" : "other refusal");
    check(used(0) == (uint64_t)admitted * MiB, "the region counts the %d holders' %d MiB "
          "(%llu MiB), nothing for the refused process", admitted, admitted,
          (unsigned long long)(used(0) / MiB));
    /* All but the first: what the live one holds stays counted beside the reaped. */
    for (int i = 1; i < admitted; i++)
        kill(holder[i], SIGKILL);
    for (int i = 1; i < admitted; i++)
        wait_status(holder[i]);
    /* The refused process, alive all along, asks again: no restart needed. */
    char said = 0;
    started = now_s();
    int asked = holder[SLOTS] > 0 && retry_said >= 0 && write(retry[1], "r", 1) == 1 &&
                read(retry_said, &said, 1) == 1;
    close(retry[1]);
    if (retry_said >= 0)
        close(retry_said);
    check(asked && said == 'y', "the refused process, still running, gets its 1 MiB %.1f s after "
          "they are gone (a claim is retried once a second)", now_s() - started);
    if (holder[SLOTS] > 0) {
        kill(holder[SLOTS], SIGKILL);
        wait_status(holder[SLOTS]);
    }
    started = now_s();
    pid_t next = fork();
    if (next == 0) {
        cuda_start();
        CUdeviceptr p;
        int fine = cuMemAlloc_v2(&p, 4095 * MiB) == CUDA_SUCCESS &&
                   seen_used() == 4096 * MiB && cuMemFree_v2(p) == CUDA_SUCCESS;
        _exit(fine ? 0 : 1);
    }
    int fine = exited_ok(next);
    check(fine, "after kill -9 of all of them but one, every other slot dead, a new process gets "
          "the 4095 MiB of the 4 GiB cap the live one leaves (the dead's 1023 MiB came back) in "
          "%.2f s", now_s() - started);
    check(used(0) == MiB && region->header.reaped_slots >= (uint64_t)admitted - 1,
          "the region counts the live holder's 1 MiB alone (%llu bytes), %llu slots reaped",
          (unsigned long long)used(0), (unsigned long long)region->header.reaped_slots);
    if (holder[0] > 0) {
        kill(holder[0], SIGKILL);
        wait_status(holder[0]);
    }
}

/* What the kernel says process pid waits in ("" when it cannot say). */
static const char *waits_in(pid_t pid)
{
    static char where[64];
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/wchan", (int)pid);
    FILE *f = fopen(path, "r");
    size_t n = f != NULL ? fread(where, 1, sizeof where - 1, f) : 0;
    where[n] = '\0';
    if (f != NULL)
        fclose(f);
    return where;
}

/* A process whose stderr nobody reads (a full pipe) blocks in its first write(2) there. Its
 * claim reaps a dead process and says so: written while it held the creation lock, that line
 * kept every process of the container that started after it waiting for as long as nobody
 * read the pipe. The lines of a claim are written once its locks are released. */
static void blocked_stderr(void)
{
    pid_t dead = fork_holder(take_10_mib, "a process holds 10 MiB, then is killed");
    if (dead < 0)
        return;
    kill(dead, SIGKILL);
    wait_status(dead);
    int full[2];
    char junk[4096] = {0};
    if (pipe(full) != 0 || fcntl(full[1], F_SETFL, O_NONBLOCK) != 0)
        return;
    while (write(full[1], junk, sizeof junk) > 0) {
    }
    fcntl(full[1], F_SETFL, 0);
    fflush(stdout);
    pid_t mute = fork();
    if (mute == 0) {
        dup2(full[1], STDERR_FILENO);
        _exit(take_10_mib() ? 0 : 1);
    }
    double t0 = now_s();
    while (now_s() - t0 < 5 && strstr(waits_in(mute), "pipe") == NULL)
        sleep_s(0.05);
    /* wchan reads "0" (or nothing) where the kernel hides its symbols. */
    const char *where = waits_in(mute);
    int hidden = where[0] == '\0' || strcmp(where, "0\n") == 0 || strcmp(where, "0") == 0;
    check(strstr(where, "pipe") != NULL || hidden, "a process with a full pipe for stderr blocks "
          "writing to it (waits in %s)", hidden ? "a place the kernel does not name" : where);
    pid_t next = fork();
    if (next == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, STDERR_FILENO);
        _exit(take_10_mib() ? 0 : 1);
    }
    int waited = !exited_ok_within(next, 10.0);
    check(!waited, "another process of the container starts and allocates meanwhile (%s)",
          waited ? "it waited 10 s, or failed" : "at once");
    fcntl(full[0], F_SETFL, O_NONBLOCK);
    while (read(full[0], junk, sizeof junk) > 0) {
    }
    check(exited_ok(mute), "once its stderr is read, the blocked process goes on and exits");
    close(full[0]);
    close(full[1]);
}

/* The number of this process's descriptor of the region file (-1: none). */
static int region_descriptor(void)
{
    struct stat want, st;
    if (stat(region_path(), &want) != 0)
        return -1;
    for (int fd = 3; fd < 1024; fd++)
        if (fd != region_fd && fstat(fd, &st) == 0 && st.st_dev == want.st_dev &&
            st.st_ino == want.st_ino && (fcntl(fd, F_GETFL) & O_ACCMODE) == O_RDWR)
            return fd;
    return -1;
}

/* A child that, like a daemon, closes every descriptor and then opens a file of its own at the
 * region's number: its claim must not lock bytes of that file, where every slot looks free
 * (the parent's live one too, which it then reaped: 1200 MiB held under a 1 GiB cap). */
static void replaced_descriptor(void)
{
    cuda_start();
    CUdeviceptr p;
    check(cuMemAlloc_v2(&p, 600 * MiB) == CUDA_SUCCESS, "a process holds 600 MiB of 1 GiB");
    int slot = find_slot(getpid());
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        int number = region_descriptor();
        char other[] = "/tmp/vgpu-other-XXXXXX";
        int fd = mkstemp(other);
        if (number < 0 || fd < 0 || ftruncate(fd, VGPU_REGION_FILE_SIZE) != 0 ||
            dup2(fd, number) != number)
            _exit(3);
        unlink(other);
        close(fd);
        capture_begin();
        CUdeviceptr q;
        CUresult rc = cuMemAlloc_v2(&q, 600 * MiB);
        const char *log = capture_end();
        printf("child: 600 MiB -> %d; log: %s", rc, log);
        fflush(stdout);
        _exit(rc == CUDA_ERROR_OUT_OF_MEMORY &&
              strstr(log, "closed the shared region's descriptor") != NULL ? 0 : 1);
    }
    check(exited_ok(child), "its child, its region descriptor replaced by another file, is "
          "refused 600 MiB and says why");
    check(used(0) == 600 * MiB && slot >= 0 && region->slots[slot].pid == getpid(),
          "the parent's slot and 600 MiB are still counted (%llu MiB)",
          (unsigned long long)(used(0) / MiB));
    cuMemFree_v2(p);
}

/* The region file mapped for writing (MAP_FAILED if it cannot be), to put in it by hand what a
 * process would have left there; munmap it when done. */
static void *map_for_writing(void)
{
    int fd = open(region_path(), O_RDWR | O_CLOEXEC);
    void *m = fd >= 0 ? mmap(NULL, VGPU_REGION_FILE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                      : MAP_FAILED;
    if (fd >= 0)
        close(fd);
    return m;
}

/* A holder (take, checked as `what`) killed with -9, and the region mapped for writing, to leave
 * in it what the process would have left had it been killed at some instruction: *slot is the
 * dead one's. NULL (checked) when a step failed; else munmap it when done. */
static struct vgpu_region *killed_holder(int (*take)(void), const char *what, int *slot)
{
    pid_t dead = fork_holder(take, what);
    if (dead < 0)
        return NULL;
    *slot = find_slot(dead);
    kill(dead, SIGKILL);
    wait_status(dead);
    void *m = map_for_writing();
    if (!check(*slot >= 0 && m != MAP_FAILED, "killed with -9: its slot (%d), the region mapped "
               "for writing", *slot))
        return NULL;
    return m;
}

/* A process killed between the two stores of a slot's generation leaves it odd ("being
 * changed"): a monitor following the README's snapshot rule waits for an even one. The next
 * owner's claim must leave it even, not odd for good. */
static void odd_generation(void)
{
    int slot;
    struct vgpu_region *w = killed_holder(take_10_mib, "a process holds 10 MiB", &slot);
    if (w == NULL)
        return;
    w->slots[slot].generation |= 1;
    munmap(w, VGPU_REGION_FILE_SIZE);
    pid_t next = allocating_process(1);
    check(exited_ok(next) && find_slot(next) == slot, "a new process takes that slot");
    uint64_t generation = __atomic_load_n(&region->slots[slot].generation, __ATOMIC_ACQUIRE);
    check(generation % 2 == 0, "and leaves its generation even (%llu)",
          (unsigned long long)generation);
}

/* Runs in a child: allocates and frees `bytes` on each byte read from `go`, and answers 'y' (it
 * got them) or 'n' on `done`, until `go` closes. Its context is made at once, or (lazy) at the
 * first byte read. */
static void asker(int go, int done, uint64_t bytes, int lazy)
{
    if (!lazy)
        cuda_start();
    char c;
    while (read(go, &c, 1) == 1) {
        if (lazy)
            cuda_start();
        lazy = 0;
        CUdeviceptr p;
        char got = cuMemAlloc_v2(&p, bytes) == CUDA_SUCCESS ? 'y' : 'n';
        if (got == 'y')
            cuMemFree_v2(p);
        if (write(done, &got, 1) != 1)
            break;
    }
    _exit(0);
}

struct asking {
    pid_t pid;
    int go, done;
};

static struct asking start_asker_lazily(uint64_t bytes, int lazy)
{
    int go[2], done[2];
    if (pipe(go) != 0 || pipe(done) != 0)
        return (struct asking){-1, -1, -1};
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(go[1]);
        close(done[0]);
        asker(go[0], done[1], bytes, lazy);
    }
    close(go[0]);
    close(done[1]);
    return (struct asking){pid, go[1], done[0]};
}

static struct asking start_asker(uint64_t bytes) { return start_asker_lazily(bytes, 0); }

/* Asks once; the answer ('y', 'n'), or 0 when none came within `seconds` (*took: how long). */
static char ask(const struct asking *a, double seconds, double *took)
{
    double t0 = now_s();
    char c = 'a', got = 0;
    if (write(a->go, &c, 1) != 1)
        return 0;
    struct pollfd pfd = {.fd = a->done, .events = POLLIN};
    if (poll(&pfd, 1, (int)(seconds * 1000)) == 1 && read(a->done, &got, 1) != 1)
        got = 0;
    *took = now_s() - t0;
    return got;
}

static void stop_asking(struct asking *a)
{
    close(a->go);
    close(a->done);
    if (!exited_ok_within(a->pid, 5.0))
        check(0, "the asking process ends when told");
}

/* A reservation under way, as a process announces it in its slot before it checks the cap. */
static uint64_t announcement(uint64_t bytes, int dev)
{
    return bytes | (uint64_t)(dev + 1) << VGPU_PENDING_DEVICE_SHIFT;
}

/* A process killed in the middle of a reservation of 50 MiB more than its 100 MiB: announced,
 * not yet in its ledger. The next claimant takes its slot and gives both back: the 1 GiB cap
 * then has room for 1014 MiB beside a live process's 10 MiB. Then the same death under a
 * process that has a slot already: refused, it reaps the dead one and gets the room. */
static void dead_mid_reservation(void)
{
    pid_t alive = fork_holder(take_10_mib, "a process holds 10 MiB, and lives on");
    int slot;
    struct vgpu_region *w = killed_holder(take_100_mib, "another holds 100 MiB", &slot);
    if (alive < 0 || w == NULL)
        return;
    __atomic_store_n(&w->slots[slot].pending, announcement(50 * MiB, 0), __ATOMIC_SEQ_CST);
    check(used(0) == 110 * MiB, "the region shows 110 MiB held, and the dead one's 50 MiB "
          "announced");
    fflush(stdout);
    pid_t next = fork();
    if (next == 0) {
        cuda_start();
        CUdeviceptr p;
        int fine = cuMemAlloc_v2(&p, 1014 * MiB) == CUDA_SUCCESS && seen_used() == 1024 * MiB;
        _exit(fine ? 0 : 1);
    }
    int fine = exited_ok_within(next, 10.0);
    check(fine && find_slot(next) == slot, "a new process takes its slot and gets the 1014 MiB "
          "the live one leaves of the 1 GiB cap: the 100 MiB and the announced 50 MiB back (%s)",
          fine ? "in time" : "it hung, or failed");
    check(used(0) == 1024 * MiB && region->slots[slot].pending == 0,
          "the region counts the live process's 10 MiB and the new one's 1014 MiB, nothing "
          "announced (%llu MiB)", (unsigned long long)(used(0) / MiB));

    struct asking a = start_asker(1014 * MiB);
    double took = 0;
    char answer = ask(&a, 10.0, &took);
    check(answer == 'y', "a process asking 1014 MiB gets them (the exited one reaped) and gives "
          "them back (%c)", answer ? answer : '-');
    int second;
    struct vgpu_region *w2 = killed_holder(take_100_mib, "a third holds 100 MiB", &second);
    if (w2 != NULL) {
        __atomic_store_n(&w2->slots[second].pending, announcement(50 * MiB, 0),
                         __ATOMIC_SEQ_CST);
        munmap(w2, VGPU_REGION_FILE_SIZE);
        answer = ask(&a, 10.0, &took);
        check(answer == 'y' && took < 1.0 && region->slots[second].pending == 0,
              "killed with 50 MiB announced: the asking process, refused, reaps it and gets its "
              "1014 MiB (%c in %.3f s)", answer ? answer : '-', took);
    }
    stop_asking(&a);
    munmap(w, VGPU_REGION_FILE_SIZE);
    kill(alive, SIGKILL);
    wait_status(alive);
}

static void *alloc_free_loop(void *arg)
{
    (void)arg;
    CUcontext ctx;
    cuDevicePrimaryCtxRetain(&ctx, 0);
    cuCtxSetCurrent(ctx);
    for (;;) {
        CUdeviceptr p;
        if (cuMemAlloc_v2(&p, MiB) == CUDA_SUCCESS)
            cuMemFree_v2(p);
    }
    return NULL;
}

/* A process of the container stopped (SIGSTOP, a debugger) at whatever instruction it had
 * reached in its allocations: the others' allocations go on. Under layout version 1's ledger
 * lock, a stop inside the lock held every allocation of the container until SIGCONT. Then one
 * stopped in the middle of a reservation that leaves no room (its announcement made by hand):
 * another's reservation waits for it a bounded time and is refused, rather than for ever. */
static void stopped_sibling(void)
{
    enum { ROUNDS = 100 };
    fflush(stdout);
    pid_t busy = fork();
    if (busy == 0) {
        cuda_start();
        pthread_t t[2];
        for (int i = 0; i < 2; i++)
            pthread_create(&t[i], NULL, alloc_free_loop, NULL);
        pause();
        _exit(0);
    }
    struct asking a = start_asker(100 * MiB);
    double took = 0, slowest = 0;
    char answer = ask(&a, 10.0, &took); /* its first: the fake driver's start-up */
    int got = 0, round = 0;
    sleep_s(0.2);
    for (; answer == 'y' && round < ROUNDS; round++) {
        kill(busy, SIGSTOP);
        int status;
        waitpid(busy, &status, WUNTRACED);
        answer = ask(&a, 2.0, &took);
        slowest = took > slowest ? took : slowest;
        got += answer == 'y';
        kill(busy, SIGCONT);
        sleep_s(0.002 * (round % 5));
    }
    check(got == ROUNDS, "a process allocating in two threads, stopped %d times wherever it was: "
          "another's 100 MiB came each time (%d of %d; the slowest in %.3f s)", round, got,
          ROUNDS, slowest);
    kill(busy, SIGKILL);
    wait_status(busy);
    stop_asking(&a);

    pid_t held = fork_holder(take_10_mib, "a process holds 10 MiB and is stopped");
    int slot = held > 0 ? find_slot(held) : -1;
    struct vgpu_region *w = map_for_writing();
    if (!check(slot >= 0 && w != MAP_FAILED, "its slot (%d), the region mapped for writing", slot))
        return;
    kill(held, SIGSTOP);
    __atomic_store_n(&w->slots[slot].pending, announcement(900 * MiB, 0), __ATOMIC_SEQ_CST);
    a = start_asker(500 * MiB);
    answer = ask(&a, 10.0, &took);
    check(answer == 'n' && took >= 0.1 && took < 2.0, "with 900 MiB announced by the stopped "
          "one, another's 500 MiB of the 1 GiB cap waits for it, then is refused (%c in %.2f s)",
          answer ? answer : '-', took);
    __atomic_store_n(&w->slots[slot].pending, 0, __ATOMIC_SEQ_CST);
    answer = ask(&a, 10.0, &took);
    check(answer == 'y', "once the announcement is gone, the 500 MiB come (%c in %.2f s)",
          answer ? answer : '-', took);
    stop_asking(&a);
    munmap(w, VGPU_REGION_FILE_SIZE);
    kill(held, SIGKILL);
    wait_status(held);
}

/* An open-file-description read lock on byte 0 of the region file, which serialises its
 * creation and the slot claims: what any process of the container that can open the file (0666)
 * may take, and what one stopped in a claim holds. The descriptor, or -1. */
static int hold_creation_byte(void)
{
    int fd = open(region_path(), O_RDONLY | O_CLOEXEC);
    struct flock fl = {.l_type = F_RDLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    if (fd >= 0 && fcntl(fd, F_OFD_SETLK, &fl) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Byte 0 held for good: a process's first allocation (its slot claim) and a new process's
 * attach each wait for it 10 s, then are refused, saying why; once it is let go, the next
 * allocation a second later is served. The library before waited with no bound (F_OFD_SETLKW):
 * both hung, in a new process inside its first CUDA call, for as long as the lock was held. */
static void held_lock(void)
{
    struct asking a = start_asker_lazily(100 * MiB, 1); /* no CUDA call yet: no slot */
    int fd = hold_creation_byte();
    if (!check(fd >= 0 && a.pid > 0 && find_slot(a.pid) < 0,
               "a process with no slot yet (%d); byte 0 held by another description (%d)",
               find_slot(a.pid), fd))
        return;
    double took = 0;
    char answer = ask(&a, 30.0, &took);
    check(answer == 'n' && took >= 9.5 && took < 15.0, "its first allocation waits for the lock "
          "10 s, then is refused (%c in %.1f s)", answer ? answer : '-', took);
    setenv("EXPECT_REFUSAL", "has held the region's creation lock for 10 s", 1);
    double t0 = now_s();
    int refused = exited_ok_within(spawn_self("refused-child", 0), 30.0);
    took = now_s() - t0;
    unsetenv("EXPECT_REFUSAL");
    check(refused && took >= 9.5 && took < 15.0, "a new process's cuInit waits 10 s for the "
          "lock, then refuses CUDA, saying why (%s in %.1f s)", refused ? "refused" : "not so",
          took);
    close(fd);
    sleep_s(1.1); /* a slot claim is tried again once a second */
    answer = ask(&a, 10.0, &took);
    check(answer == 'y' && find_slot(a.pid) >= 0, "the lock let go, the next allocation gets "
          "its 100 MiB and a slot (%c in %.2f s)", answer ? answer : '-', took);
    stop_asking(&a);
}

/* A region an older library made (layout version 1: set by hand here over a live process's
 * region), as a container restarted after the plugin installed this library finds it in its
 * pod's folder. While a process of it lives, a new one refuses CUDA, saying why (it would count
 * outside the old one's cap); once none lives, the next one makes it afresh, with the whole cap.
 * Runs in processes other than this one, which never attaches. */
static void older_layout(void)
{
    pid_t old = fork_holder(take_100_mib, "a process holds 100 MiB");
    struct vgpu_region *w = map_for_writing();
    if (!check(old > 0 && w != MAP_FAILED, "its region mapped for writing"))
        return;
    w->header.version = 1;
    w->devices[0].reserved_8 = 400 * MiB; /* version 1's device total */
    /* A dead process of version 1 in slot 5, above the high-water mark the new header starts
     * from: its ledger, and at offset 16 its claim time, which version 2 would read as an
     * announcement. */
    w->slots[5].pid = 99999;
    w->slots[5].used_bytes[0] = 300 * MiB;
    w->slots[5].pending = 1764000000000000000; /* version 1's claimed_unix_ns */
    check(refused_with("an older libvgpu's processes of this container still use it"),
          "marked as made by an older library, a new process refuses it while that one lives");
    kill(old, SIGKILL);
    wait_status(old);
    check(new_process_gets(1024), "once it is gone, a new process gets the whole 1 GiB cap");
    check(w->header.version == VGPU_REGION_VERSION && w->devices[0].reserved_8 == 0 &&
          w->devices[0].limit_bytes == 1024 * MiB && w->slots[5].pid == 0 &&
          w->slots[5].used_bytes[0] == 0 && w->slots[5].pending == 0, "in the region made "
          "afresh (layout version %u), nothing of the old one's slots is left", w->header.version);
    munmap(w, VGPU_REGION_FILE_SIZE);
}

/* ---- hammer ------------------------------------------------------------------------------- */

enum { PROCS = 8, THREADS = 4, HOLD = 4, VICTIMS = 2 };

/* The test's own count of what the survivors hold: added after an allocation succeeds and
 * taken off before the free, so it can never be above what libvgpu has reserved. The victims
 * (children 0 and 1, killed half-way) are not counted: their memory stays reserved until it is
 * reaped, which only makes the check stricter. One atomic word: an exact snapshot. */
struct shared {
    int64_t held;
    int64_t max_held;
    uint64_t allocs, refusals, frees;
};

static struct shared *shared;
static uint64_t cap_bytes;
static double deadline;
static int me;

static void hold(int64_t bytes)
{
    if (me < VICTIMS)
        return;
    int64_t now = __atomic_add_fetch(&shared->held, bytes, __ATOMIC_ACQ_REL);
    int64_t max = __atomic_load_n(&shared->max_held, __ATOMIC_RELAXED);
    while (now > max && !__atomic_compare_exchange_n(&shared->max_held, &max, now, 1,
                                                     __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}

static void *hammer_thread(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg * 7919u + (unsigned)getpid();
    CUcontext ctx;
    cuDevicePrimaryCtxRetain(&ctx, 0);
    cuCtxSetCurrent(ctx);
    CUdeviceptr ptr[HOLD] = {0};
    uint64_t size[HOLD] = {0};
    while (now_s() < deadline) {
        int k = rand_r(&seed) % HOLD;
        if (ptr[k] != 0) {
            hold(-(int64_t)size[k]);
            cuMemFree_v2(ptr[k]);
            __atomic_add_fetch(&shared->frees, 1, __ATOMIC_RELAXED);
            ptr[k] = 0;
            continue;
        }
        size[k] = (1 + (uint64_t)(rand_r(&seed) % 24)) * MiB;
        if (cuMemAlloc_v2(&ptr[k], size[k]) == CUDA_SUCCESS) {
            hold((int64_t)size[k]);
            __atomic_add_fetch(&shared->allocs, 1, __ATOMIC_RELAXED);
        } else {
            ptr[k] = 0;
            __atomic_add_fetch(&shared->refusals, 1, __ATOMIC_RELAXED);
        }
    }
    for (int k = 0; k < HOLD; k++)
        if (ptr[k] != 0) {
            hold(-(int64_t)size[k]);
            cuMemFree_v2(ptr[k]);
        }
    return NULL;
}

static void hammer_child(int index)
{
    me = index;
    cuInit(0);
    pthread_t threads[THREADS];
    for (int t = 0; t < THREADS; t++)
        pthread_create(&threads[t], NULL, hammer_thread, (void *)(uintptr_t)(index * THREADS + t));
    for (int t = 0; t < THREADS; t++)
        pthread_join(threads[t], NULL);
    exit(0);
}

static void hammer(void)
{
    double seconds = getenv("HAMMER_SECONDS") ? atof(getenv("HAMMER_SECONDS")) : 10.0;
    cap_bytes = 256 * MiB;
    shared = mmap(NULL, sizeof *shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    deadline = now_s() + seconds;
    pid_t kids[PROCS];
    for (int i = 0; i < PROCS; i++) {
        kids[i] = fork();
        if (kids[i] == 0)
            hammer_child(i);
    }
    struct timespec half = {.tv_sec = (time_t)(seconds / 2),
                            .tv_nsec = (long)((seconds / 2 - (time_t)(seconds / 2)) * 1e9)};
    nanosleep(&half, NULL);
    for (int v = 0; v < VICTIMS; v++)
        kill(kids[v], SIGKILL);
    /* Everyone must be done shortly after the deadline: a wedged lock would show here. */
    double give_up = deadline + 20.0;
    int finished = 0, clean = 0;
    while (finished < PROCS && now_s() < give_up) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid > 0) {
            finished++;
            clean += WIFEXITED(status) && WEXITSTATUS(status) == 0;
        } else {
            struct timespec nap = {0, 20 * 1000 * 1000};
            nanosleep(&nap, NULL);
        }
    }
    check(finished == PROCS, "all %d processes finished (no deadlock): %d", PROCS, finished);
    if (finished < PROCS)
        for (int i = 0; i < PROCS; i++)
            kill(kids[i], SIGKILL);
    check(clean == PROCS - VICTIMS, "the %d survivors exited cleanly (%d)", PROCS - VICTIMS, clean);
    check(shared->max_held <= (int64_t)cap_bytes && shared->max_held > 0,
          "held memory never exceeded the cap: peak %.1f MiB of %llu MiB",
          (double)shared->max_held / (double)MiB, (unsigned long long)(cap_bytes / MiB));
    check(shared->allocs > 1000 && shared->refusals > 100,
          "it ran near the cap: %llu allocations, %llu refusals, %llu frees",
          (unsigned long long)shared->allocs, (unsigned long long)shared->refusals,
          (unsigned long long)shared->frees);
    check(region->devices[0].peak_bytes <= cap_bytes, "the region's peak is within the cap");

    pid_t last = fork();
    if (last == 0) {
        cuda_start();
        CUdeviceptr p;
        exit(cuMemAlloc_v2(&p, cap_bytes) == CUDA_SUCCESS ? 0 : 1);
    }
    check(exited_ok(last), "afterwards a new process gets the whole cap (killed ones reaped)");
    reap_by_a_new_process();
    check(used(0) == 0, "and the region is back to 0 once that one is reaped (%llu)",
          (unsigned long long)used(0));
}

/* ---- together ------------------------------------------------------------------------------ */

enum { TOGETHER = 16 };

/* Says it is ready on fd 3, starts CUDA when fd 4 closes, allocates 10 MiB, says how that went on
 * fd 3, and holds the memory until fd 5 closes. */
static int together_child(void)
{
    char byte = 'r';
    if (write(3, &byte, 1) != 1 || read(4, &byte, 1) != 0)
        return 2;
    capture_begin();
    CUresult init = cuInit(0);
    const char *log = capture_end();
    CUdeviceptr p = 0;
    if (init == CUDA_SUCCESS) {
        cuda_start();
        init = cuMemAlloc_v2(&p, 10 * MiB);
    }
    byte = init == CUDA_SUCCESS ? 'y' : 'n';
    if (init != CUDA_SUCCESS)
        fprintf(stderr, "pid %d: CUDA %d: %s", (int)getpid(), init, log);
    if (write(3, &byte, 1) != 1)
        return 2;
    read(5, &byte, 1);
    return 0;
}

/* In a forked child: runs together_child with its three pipe ends as fds 3, 4 and 5. */
static void exec_together_child(int ready, int go, int release)
{
    if (dup2(ready, 3) != 3 || dup2(go, 4) != 4 || dup2(release, 5) != 5)
        _exit(3);
    execl(self_path, self_path, "together-child", (char *)NULL);
    _exit(4);
}

/* One round at path: returns how many of the processes got CUDA and 10 MiB, and sets *shared_mib
 * to what the region at path counts while they hold it. */
static int together_round(const char *path, uint64_t *shared_mib)
{
    int ready[2], go[2], release[2];
    if (pipe(ready) != 0 || pipe(go) != 0 || pipe(release) != 0)
        return -1;
    setenv("CUDA_DEVICE_MEMORY_SHARED_CACHE", path, 1);
    pid_t kids[TOGETHER];
    for (int i = 0; i < TOGETHER; i++) {
        kids[i] = fork();
        if (kids[i] == 0) {
            close(go[1]);
            close(release[1]);
            exec_together_child(ready[1], go[0], release[0]);
        }
    }
    close(ready[1]);
    close(go[0]);
    close(release[0]);
    char byte;
    int fine = 0;
    for (int i = 0; i < TOGETHER && read(ready[0], &byte, 1) == 1; i++) {
    }
    close(go[1]); /* all at once */
    for (int i = 0; i < TOGETHER && read(ready[0], &byte, 1) == 1; i++)
        fine += byte == 'y';
    *shared_mib = open_region() ? used(0) / MiB : 0;
    if (region != NULL)
        munmap((void *)region, VGPU_REGION_FILE_SIZE);
    close(region_fd);
    region = NULL;
    close(release[1]);
    for (int i = 0; i < TOGETHER; i++) {
        int status = wait_status(kids[i]);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            fprintf(stderr, "child %d: status %d\n", (int)kids[i], status);
    }
    close(ready[0]);
    return fine;
}

/* LD_PRELOAD as it is, then the library `name` beside this program (the build's tests folder). */
static void preload_after(char *out, size_t size, const char *name)
{
    const char *slash = strrchr(self_path, '/');
    const char *before = getenv("LD_PRELOAD");
    snprintf(out, size, "%s %.*s%s", before != NULL ? before : "",
             slash != NULL ? (int)(slash + 1 - self_path) : 0, self_path, name);
}

/* The window itself, held open: a process finds no region file, and before it checks the guard
 * a peer creates the region and attaches (this process, here). It must then use that region. */
static void peer_created(void)
{
    char path[4200], preload[8600];
    snprintf(path, sizeof path, "%s.peer", region_path());
    preload_after(preload, sizeof preload, "late_open.so");
    int said[2], go[2], ready[2], start[2], release[2];
    if (pipe(said) != 0 || pipe(go) != 0 || pipe(ready) != 0 || pipe(start) != 0 ||
        pipe(release) != 0) {
        check(0, "pipes: %s", strerror(errno));
        return;
    }
    pid_t kid = fork();
    if (kid == 0) {
        /* fds 3-5 are together-child's; the window's two go above them */
        if (dup2(said[1], 20) != 20 || dup2(go[0], 21) != 21)
            _exit(3);
        const char *fd_text = "20", *go_text = "21";
        const char *slash_name = strrchr(path, '/');
        setenv("LATE_OPEN_NAME", slash_name != NULL ? slash_name + 1 : path, 1);
        setenv("LATE_OPEN_FD", fd_text, 1);
        setenv("LATE_OPEN_GO", go_text, 1);
        setenv("LD_PRELOAD", preload, 1);
        setenv("CUDA_DEVICE_MEMORY_SHARED_CACHE", path, 1);
        close(go[1]); /* each pipe's far end is the parent's alone, or its close says nothing */
        close(start[1]);
        close(release[1]);
        exec_together_child(ready[1], start[0], release[0]);
    }
    close(said[1]);
    close(go[0]);
    close(ready[1]);
    close(start[0]);
    close(release[0]);
    char byte = 0;
    int in_window = read(ready[0], &byte, 1) == 1 && (close(start[1]), 1) &&
                    read(said[0], &byte, 1) == 1;
    check(in_window, "a process found no region file at %s and waits before its guard check", path);
    setenv("CUDA_DEVICE_MEMORY_SHARED_CACHE", path, 1);
    cuda_start(); /* creates the region and takes its guard */
    check(open_region() && used(0) > 0, "meanwhile a peer created the region and attached");
    close(go[1]);
    check(read(ready[0], &byte, 1) == 1 && byte == 'y',
          "the process then uses the peer's region: CUDA and 10 MiB (not 'still in use')");
    uint64_t mine = used(0);
    close(release[1]);
    check(exited_ok(kid), "it exits cleanly");
    check(mine == 50 * MiB, "one region counts both: %llu MiB (two 20 MiB contexts and 10 MiB)",
          (unsigned long long)(mine / MiB));
    munmap((void *)region, VGPU_REGION_FILE_SIZE);
    close(region_fd);
    region = NULL;
    unlink(path);
}

static void together(void)
{
    peer_created();
    int rounds = getenv("TOGETHER_ROUNDS") ? atoi(getenv("TOGETHER_ROUNDS")) : 20;
    char base[4096], path[4200];
    snprintf(base, sizeof base, "%s", region_path());
    int r = 0, fine = TOGETHER;
    uint64_t mib = 30 * TOGETHER;
    for (; r < rounds && fine == TOGETHER && mib == 30 * TOGETHER; r++) {
        snprintf(path, sizeof path, "%s.together.%d", base, r);
        fine = together_round(path, &mib);
        unlink(path);
    }
    check(fine == TOGETHER && mib == 30 * TOGETHER,
          "%d of %d rounds of %d processes starting together without a region file: in the last, "
          "%d got CUDA and 10 MiB, and the region counted %llu MiB (30 expected each, 20 MiB contexts)",
          r, rounds, TOGETHER, fine, (unsigned long long)mib);
}

/* ---- closed-descriptor: a slot's owner alive without its lock ----------------------------- */

/* pid's start time (/proc/PID/stat's 22nd field, after the command's last ')'); 0 if unread. */
static uint64_t start_ticks_of(pid_t pid)
{
    char path[64], line[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    size_t n = f != NULL ? fread(line, 1, sizeof line - 1, f) : 0;
    if (f != NULL)
        fclose(f);
    line[n] = '\0';
    char *field = strrchr(line, ')');
    for (int i = 2; i < 22 && field != NULL; i++) /* the space before field i + 1 */
        field = strchr(field + 1, ' ');
    return field != NULL ? strtoull(field, NULL, 10) : 0;
}

/* Takes 600 MiB, then closes the region's descriptor, as a program that closes every
 * descriptor it does not know of does (the slot's lock goes with it). */
static int take_600_mib_then_close_region(void)
{
    cuda_start();
    CUdeviceptr p;
    int fd = -1;
    return cuMemAlloc_v2(&p, 600 * MiB) == CUDA_SUCCESS && (fd = region_descriptor()) >= 0 &&
           close(fd) == 0;
}


/* Takes 300 MiB, then runs `mode` of this program in its place (same pid, same start time). */
static int take_300_mib_then_exec(const char *mode, int ready_fd)
{
    cuda_start();
    CUdeviceptr p;
    if (cuMemAlloc_v2(&p, 300 * MiB) != CUDA_SUCCESS)
        return 3;
    char fd_text[16];
    snprintf(fd_text, sizeof fd_text, "%d", ready_fd);
    execl(self_path, self_path, mode, fd_text, (char *)NULL);
    return 4;
}

/* The image after take_300_mib_then_exec's exec: 800 MiB fit only with its old image's 300 MiB
 * given back. */
static int reexec_child(void)
{
    cuda_start();
    CUdeviceptr p;
    return cuMemAlloc_v2(&p, 800 * MiB) == CUDA_SUCCESS ? 0 : 1;
}

/* An image after an exec that never uses CUDA (`nvml`: only asks NVML, as nvidia-smi does):
 * says 'y' on ready_fd, then waits to be killed. */
static int idle_child(const char *ready_fd, int nvml)
{
    nvmlMemory_t m;
    if (nvml && nvml_memory_of(0, &m) != 0)
        return 2;
    int fd = atoi(ready_fd);
    if (write(fd, "y", 1) != 1)
        return 3;
    pause();
    return 0;
}

/* A process takes 300 MiB and execs into `mode`, which says when it runs and then idles:
 * whether another process then gets 800 MiB (its old image's 300 given back). */
static int exec_then_idle_frees(const char *mode)
{
    int ready[2];
    if (pipe(ready) != 0)
        return 0;
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        close(ready[0]);
        _exit(take_300_mib_then_exec(mode, ready[1]));
    }
    close(ready[1]);
    char ok = 0;
    int idles = read(ready[0], &ok, 1) == 1 && ok == 'y';
    close(ready[0]);
    int freed = idles && new_process_gets(800);
    kill(child, SIGKILL);
    wait_status(child);
    return freed;
}

/* Its pid another process's since (which started at another time). */
static void another_start(struct vgpu_region_slot *s) { s->start_ticks += 1; }

/* A holder that closed its region descriptor, its slot then rewritten: whether another process
 * gets 600 MiB (the slot reaped). */
static int rewritten_holder_reaped(void (*rewrite)(struct vgpu_region_slot *))
{
    pid_t holder = fork_holder(take_600_mib_then_close_region,
                               "another process takes 600 MiB, then closes its descriptor");
    int slot = holder > 0 ? find_slot(holder) : -1;
    struct vgpu_region *w = slot >= 0 ? map_for_writing() : MAP_FAILED;
    int reaped = 0;
    if (w != MAP_FAILED) {
        rewrite(&w->slots[slot]);
        munmap(w, VGPU_REGION_FILE_SIZE);
        reaped = new_process_gets(600);
    }
    if (holder > 0) {
        kill(holder, SIGKILL);
        wait_status(holder);
    }
    reap_by_a_new_process();
    return reaped;
}

/* A slot is its owner's for as long as the owner runs, lock or no lock: a process that closed
 * the region's descriptor kept its 600 MiB while the next claimant reaped its slot (1200 MiB
 * under a 1 GiB cap). Gone are: a process /proc does not have, one that exited and was not
 * waited for (a zombie), one whose pid another process now has (another start time), and one
 * that no longer maps the region (it exec'd). */
static void closed_descriptor(void)
{
    pid_t holder = fork_holder(take_600_mib_then_close_region,
                               "a process takes 600 MiB of 1 GiB, then closes its region "
                               "descriptor");
    int slot = holder > 0 ? find_slot(holder) : -1;
    if (!check(slot >= 0 && slot_holder((uint32_t)slot) == 0,
               "its slot's lock went with the descriptor (slot %d)", slot))
        return;
    uint64_t start = start_ticks_of(holder);
    check(start != 0 && region->slots[slot].start_ticks == start,
          "the slot has its start time, /proc/PID/stat's 22nd field (%llu)",
          (unsigned long long)start);
    check(!new_process_gets(600), "another process is refused 600 MiB: the holder still runs");
    check(used(0) == 600 * MiB && region->slots[slot].pid == holder,
          "its slot and 600 MiB are still counted (%llu MiB)", (unsigned long long)(used(0) / MiB));
    nvmlMemory_t m = {0};
    int asked = nvml_memory_of(0, &m) == 0;
    check(asked && m.used == 600 * MiB && find_slot(getpid()) < 0,
          "a process that only asks NVML (this one, no slot) sees them in use (%llu MiB)",
          (unsigned long long)(m.used / MiB));
    kill(holder, SIGKILL);
    wait_status(holder);
    check(new_process_gets(600), "once it is killed, another process gets 600 MiB");

    check(rewritten_holder_reaped(another_start),
          "with another start time in its slot (its pid another process's since), the slot of "
          "one that closed its descriptor is reaped");

    pid_t zombie = allocating_process(600);
    siginfo_t info = {0};
    while (waitid(P_PID, (id_t)zombie, &info, WEXITED | WNOWAIT) != 0 && errno == EINTR) {
    }
    check(info.si_pid == zombie && info.si_code == CLD_EXITED && info.si_status == 0,
          "a process takes 600 MiB and exits, not waited for");
    check(new_process_gets(600), "while it is a zombie, another process gets 600 MiB");
    wait_status(zombie);

    fflush(stdout);
    pid_t execs = fork();
    if (execs == 0)
        _exit(take_300_mib_then_exec("reexec-child", -1));
    check(exited_ok(execs), "a process takes 300 MiB and execs: the new image (same pid, same "
          "start time) reaps its old image's slot and gets 800 MiB");
    check(exec_then_idle_frees("idle-child"), "one that execs into a program that never uses "
          "CUDA: another process gets 800 MiB (the old image's slot no longer mapped)");
    check(exec_then_idle_frees("nvml-idle-child"), "one that execs into a program that only asks "
          "NVML (it maps the region, claims no slot): its start reaps the old image's slot, and "
          "another process gets 800 MiB");
}

/* ---- lingering exit ------------------------------------------------------------------------ */

/* A process that only asks NVML (nvidia-smi in the container): 0 when NVML shows GPU 0 with
 * nothing in use and the process took no slot. */
static int nvml_child(void)
{
    nvmlMemory_t m = {0};
    int fine = nvml_memory_of(0, &m) == 0;
    /* It takes no slot: one with no host pid would make the limiter of every process of the
     * container fall back to the whole GPU's utilisation. */
    int slotless = open_region() && find_slot(getpid()) < 0;
    printf("NVML-only process: %llu MiB used of %llu, %s slot\n", m.used / MiB, m.total / MiB,
           slotless ? "no" : "a");
    return fine && slotless && m.used == 0 && m.total == 1024 * MiB ? 0 : 1;
}

/* Allocates 800 MiB and returns from main without freeing (linger.so keeps it alive after). */
static int linger_child(void)
{
    cuda_start();
    CUdeviceptr p;
    return cuMemAlloc_v2(&p, 800 * MiB) == CUDA_SUCCESS ? 0 : 1;
}

/* Memory handed back at exit, before the process let go of it, was another process's to take
 * while a later destructor kept it alive (or the driver took its time): a cap of 1 GiB held
 * 3.2 GiB with four such processes. It stays counted until the process is gone. */
static void lingering_exit(void)
{
    char preload[8600];
    preload_after(preload, sizeof preload, "linger.so");
    int said[2], go[2];
    if (pipe(said) != 0 || pipe(go) != 0) {
        check(0, "pipes: %s", strerror(errno));
        return;
    }
    fflush(stdout);
    pid_t kid = fork();
    if (kid == 0) {
        if (dup2(said[1], 20) != 20 || dup2(go[0], 21) != 21)
            _exit(3);
        setenv("LINGER_FD", "20", 1);
        setenv("LINGER_GO", "21", 1);
        setenv("LD_PRELOAD", preload, 1);
        close(said[0]);
        close(go[1]);
        execl(self_path, self_path, "linger-child", (char *)NULL);
        _exit(4);
    }
    close(said[1]);
    close(go[0]);
    char byte = 0;
    check(read(said[0], &byte, 1) == 1 && byte == 'l',
          "a process allocated 800 MiB, returned from main, and lingers in a later destructor");
    check(used(0) == 800 * MiB, "its 800 MiB are still counted (%llu MiB)",
          (unsigned long long)(used(0) / MiB));
    cuda_start();
    CUdeviceptr p;
    check(cuMemAlloc_v2(&p, 800 * MiB) == CUDA_ERROR_OUT_OF_MEMORY,
          "so another process is refused 800 MiB under the 1 GiB cap");
    close(go[1]);
    check(exited_ok(kid), "the lingering process then exits");
    fflush(stdout);
    pid_t asker = fork();
    if (asker == 0) {
        execl(self_path, self_path, "nvml-child", (char *)NULL);
        _exit(4);
    }
    check(exited_ok(asker), "a process that only asks NVML sees nothing in use (the dead slot's "
          "ledger left out), and takes no slot");
    sleep_s(0.15);
    size_t free_b = 0, total_b = 0;
    cuMemGetInfo_v2(&free_b, &total_b);
    check(free_b == 1024 * MiB, "once it is gone, cuMemGetInfo reaps it: all 1024 MiB free "
          "(%zu MiB), before any allocation needs the room", free_b / MiB);
    check(cuMemAlloc_v2(&p, 800 * MiB) == CUDA_SUCCESS, "and the other process gets them");
    close(said[0]);
}

/* The modes that map the region themselves (the test never reads it: a truncated file faults),
 * and those that read it as the monitor would once the test has made it. */
struct mode {
    const char *name;
    void (*run)(void);
};

static const struct mode unmapped_modes[] = {
    {"together", together}, /* each round makes its own region */
    {"truncated", truncated},
    {"truncated-unmappable", truncated_unmappable},
    {"older-layout", older_layout},
};

static const struct mode mapped_modes[] = {
    {"hammer", hammer},
    {"uids", other_uid},
    {"deleted", deleted},
    {"lingering-exit", lingering_exit},
    {"slots", all_slots},
    {"dead-mid-reservation", dead_mid_reservation},
    {"stopped-sibling", stopped_sibling},
    {"held-lock", held_lock},
    {"odd-generation", odd_generation},
    {"blocked-stderr", blocked_stderr},
    {"replaced-descriptor", replaced_descriptor},
    {"closed-descriptor", closed_descriptor},
    {"kill-threads", kill_threads},
};

static int run_mode(const struct mode *modes, size_t count, const char *name)
{
    for (size_t i = 0; i < count; i++) {
        if (strcmp(modes[i].name, name) == 0) {
            modes[i].run();
            char suite[64];
            snprintf(suite, sizeof suite, "test_multiproc %s", name);
            return check_done(suite);
        }
    }
    return -1;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    self_path = argv[0];
    if (strcmp(mode, "exec-child") == 0)
        return exec_child();
    if (strcmp(mode, "uids-child") == 0)
        return uids_child();
    if (strcmp(mode, "refused-child") == 0)
        return refused_child();
    if (strcmp(mode, "together-child") == 0)
        return together_child();
    if (strcmp(mode, "linger-child") == 0)
        return linger_child();
    if (strcmp(mode, "nvml-child") == 0)
        return nvml_child();
    if (strcmp(mode, "reexec-child") == 0)
        return reexec_child();
    if (strcmp(mode, "idle-child") == 0 && argc > 2)
        return idle_child(argv[2], 0);
    if (strcmp(mode, "nvml-idle-child") == 0 && argc > 2)
        return idle_child(argv[2], 1);
    int rc = run_mode(unmapped_modes, sizeof unmapped_modes / sizeof *unmapped_modes, mode);
    if (rc >= 0)
        return rc;
    /* Create the region the way every process does, then read it as the monitor would. */
    cuMemGetInfo_v2(NULL, NULL);
    check(open_region(), "the region file has the documented header (magic, version, sizes)");
    if (region == NULL)
        return check_done("test_multiproc");
    rc = run_mode(mapped_modes, sizeof mapped_modes / sizeof *mapped_modes, mode);
    if (rc >= 0)
        return rc;
    kill_holder();
    close_keeps_locks();
    creation_lock_owner_dies();
    fork_and_exec(argv[0]);
    return check_done("test_multiproc fork-kill");
}
