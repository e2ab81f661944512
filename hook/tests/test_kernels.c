/* test_kernels.c - the table of kernels' local memory (src/kernels.c): a handle kept is known
 * with its size, a handle never kept or forgotten is not, a handle whose slot another took is
 * not, a size asked before the table was forgotten is not kept after; and a reader racing a
 * writer that keeps two handles of one slot in turn never takes the other handle's size for
 * its own (the handle read before and after the size could not tell: with the reader and
 * writer of 74334d0 the race below took the other handle's size 4, 22, 23 and 26 times in four
 * runs of 6 s on a 2-core host). It checks the sequence numbers, not the fences: x86 keeps
 * loads in order with loads and stores with stores. And a child forked while a thread writes
 * can write and read the table. */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <sys/wait.h>
#include <time.h>

#include "check.h"
#include "kernels.h"
#include "storm.h"

static CUfunction handle(uintptr_t n) { return (CUfunction)(n << 4); }

/* A handle past `f` whose slot is f's. */
static CUfunction same_slot(CUfunction f)
{
    for (uintptr_t n = ((uintptr_t)f >> 4) + 1;; n++)
        if (vgpu_kernel_slot(handle(n)) == vgpu_kernel_slot(f))
            return handle(n);
}

static void keep(CUfunction f, uint32_t local)
{
    vgpu_kernel_keep(f, local, vgpu_kernels_forgotten());
}

static void kept_and_forgotten(void)
{
    CUfunction f = handle(1000), g = same_slot(f), h = handle(1001);
    uint64_t local = 7;
    check(!vgpu_kernel_known(f, &local), "a handle never kept is not known");
    keep(f, 4096);
    keep(h, 0);
    int known = vgpu_kernel_known(f, &local);
    check(known && local == 4096, "kept: known, 4096 bytes (%llu)", (unsigned long long)local);
    check(vgpu_kernel_known(h, &local) && local == 0,
          "a kernel with no local memory is known as such (not asked again)");
    keep(g, 512);
    check(!vgpu_kernel_known(f, &local), "another handle took its slot: not known");
    check(vgpu_kernel_known(g, &local) && local == 512, "the other handle known, its own size");
    check(vgpu_kernel_known(h, &local) && local == 0, "a handle of another slot kept");
    vgpu_kernels_forget();
    check(!vgpu_kernel_known(g, &local) && !vgpu_kernel_known(h, &local),
          "forgotten: no handle known");
    keep(f, 8192);
    known = vgpu_kernel_known(f, &local);
    check(known && local == 8192, "kept again, its new size (%llu)", (unsigned long long)local);

    /* Asked, then the module unloaded (forgotten), then kept: the answer may be the old kernel's. */
    uint64_t before = vgpu_kernels_forgotten();
    vgpu_kernels_forget();
    check(!vgpu_kernel_keep(h, 65536, before) && !vgpu_kernel_known(h, &local),
          "a size asked before the table was forgotten is not kept");
    check(vgpu_kernel_keep(h, 64, vgpu_kernels_forgotten()) && vgpu_kernel_known(h, &local) &&
              local == 64,
          "asked again after: kept");
}

static CUfunction racing_f, racing_g;
static int stop;
static uint64_t writes;

static void *writer(void *arg)
{
    (void)arg;
    while (!__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
        keep(racing_g, 999);
        keep(racing_f, 1);
        __atomic_store_n(&writes, writes + 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void racing_writer(double seconds)
{
    racing_f = handle(5000);
    racing_g = same_slot(racing_f);
    keep(racing_f, 1);
    pthread_t t;
    if (!check(pthread_create(&t, NULL, writer, NULL) == 0, "the writer thread started"))
        return;
    uint64_t known = 0, wrong = 0, reads = 0;
    for (double end = now_s() + seconds; now_s() < end;)
        for (int i = 0; i < 1000000; i++, reads++) {
            uint64_t local;
            if (vgpu_kernel_known(racing_f, &local)) {
                known++;
                wrong += local != 1;
            }
        }
    __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
    pthread_join(t, NULL);
    check(wrong == 0, "racing writes of two handles of one slot: %llu of %llu reads known, %llu "
          "with the other handle's size", (unsigned long long)known, (unsigned long long)reads,
          (unsigned long long)wrong);
    check(writes > 0 && known > 0 && known < reads,
          "the reads met the writes: %llu pairs written, %llu reads not known",
          (unsigned long long)writes, (unsigned long long)(reads - known));
}

/* Forks while the writer thread keeps handles (holding the table's lock much of the time): each
 * child keeps and reads one itself within 5 s (without the fork handler, a child forked while
 * the lock was held waits for ever; a slot forked mid-write has an odd seq, made even again by
 * the child's next write of it). */
static void forks_while_writing(int children)
{
    racing_f = handle(7000);
    racing_g = same_slot(racing_f);
    __atomic_store_n(&stop, 0, __ATOMIC_RELAXED);
    pthread_t t;
    if (!check(pthread_create(&t, NULL, writer, NULL) == 0, "the writer thread started"))
        return;
    int ok = 0;
    for (int i = 0; i < children; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            alarm(5);
            uint64_t local = 0;
            keep(racing_f, 3);
            keep(racing_g, 5);
            _exit(vgpu_kernel_known(racing_g, &local) && local == 5 ? 0 : 1);
        }
        int status = 0;
        ok += pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
              WEXITSTATUS(status) == 0;
    }
    __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
    pthread_join(t, NULL);
    check(ok == children, "%d of %d children forked while a thread wrote kept and read a handle",
          ok, children);
}

/* A signal handler's launch of a kernel not in the table while its thread writes the table (a
 * storm of SIGPROF every tick for 2 s over a loop of keeps): not kept when it landed inside the
 * thread's own lock (a plain lock waited for ever there: the watchdog ends the test), kept
 * otherwise. */
static volatile sig_atomic_t storm_kept, storm_not_kept;

static void storm_keep(int sig)
{
    (void)sig;
    if (vgpu_kernel_keep(handle(999), 64, vgpu_kernels_forgotten()))
        storm_kept = storm_kept + 1;
    else
        storm_not_kept = storm_not_kept + 1;
}

static void keep_another(unsigned long round) { keep(handle(1000 + round % 64), 32); }

static void keep_from_handler(void)
{
    unsigned long rounds = storm(2.0, storm_keep, keep_another,
                                 "FAIL - a keep from a signal handler waited for its own "
                                 "thread's lock of the table\n");
    check(storm_not_kept > 0 && storm_kept > 0,
          "keeps from a signal handler over %lu keeps of its thread: %d inside the thread's "
          "lock not kept, %d kept; none waited for ever", rounds, (int)storm_not_kept,
          (int)storm_kept);
}

int main(int argc, char **argv)
{
    kept_and_forgotten();
    racing_writer(argc > 1 ? atof(argv[1]) : 6.0);
    forks_while_writing(200);
    keep_from_handler();
    return check_done("kernels");
}
