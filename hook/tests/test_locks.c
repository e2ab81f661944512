/* test_locks.c - which of the library's locks a thread holds (src/locks.h): listed while taken,
 * gone once given back, another thread's not its own; a signal handler that interrupts the
 * holder is refused the lock instead of waiting for ever, and takes it once it is free; a
 * trylock that fails lists nothing; past VGPU_HELD_MAX a lock is taken unlisted. Then a storm
 * of signals (SIGPROF every tick, asked for every 50 us, for 2 s) on a thread that takes and
 * gives back two locks in a loop, each handler asking for both: none waits for ever (the storm
 * lands inside the listing's changes as well), and the thread's list is empty at the end. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>

#include "check.h"
#include "locks.h"
#include "storm.h"

static pthread_mutex_t a = PTHREAD_MUTEX_INITIALIZER, b = PTHREAD_MUTEX_INITIALIZER;

static volatile sig_atomic_t handler_rc_a = 99, handler_rc_b = 99;

static void ask_both(int sig)
{
    (void)sig;
    handler_rc_a = vgpu_lock_unless_mine(&a);
    if (handler_rc_a == 0)
        vgpu_unlock(&a);
    handler_rc_b = vgpu_lock_unless_mine(&b);
    if (handler_rc_b == 0)
        vgpu_unlock(&b);
}

static void *hold_a(void *arg)
{
    (void)arg;
    vgpu_lock(&a);
    int mine = vgpu_holds(&a);
    sleep_s(0.2);
    vgpu_unlock(&a);
    return (void *)(intptr_t)mine;
}

static void listing(void)
{
    check(!vgpu_holds_a_lock() && !vgpu_holds(&a), "a new thread holds none");
    vgpu_lock(&a);
    vgpu_lock(&b);
    check(vgpu_holds(&a) && vgpu_holds(&b), "two locks taken: both listed");
    check(vgpu_lock_unless_mine(&a) == -1 && vgpu_holds(&a),
          "asked again, one held is refused, and stays held");
    vgpu_unlock(&a);
    check(!vgpu_holds(&a) && vgpu_holds(&b) && vgpu_holds_a_lock(),
          "given back out of order: the other stays listed");
    vgpu_unlock(&b);
    check(!vgpu_holds_a_lock(), "both given back: none listed");

    pthread_t t;
    void *theirs = NULL;
    pthread_create(&t, NULL, hold_a, NULL);
    sleep_s(0.05);
    int listed_here = vgpu_holds(&a);
    int busy = vgpu_trylock(&a);
    int waited = vgpu_lock_unless_mine(&a); /* another thread's: waits for it */
    int now_mine = vgpu_holds(&a);
    vgpu_unlock(&a);
    pthread_join(t, &theirs);
    check(theirs != NULL && !listed_here && busy == EBUSY && waited == 0 && now_mine &&
              !vgpu_holds_a_lock(),
          "another thread's lock: not listed here, a trylock fails listing nothing, a wait "
          "takes it once given back");
}

static void handler_inside(void)
{
    struct sigaction sa = {.sa_handler = ask_both};
    sigaction(SIGUSR1, &sa, NULL);
    vgpu_lock(&a);
    raise(SIGUSR1);
    int inside_a = handler_rc_a, inside_b = handler_rc_b;
    vgpu_unlock(&a);
    raise(SIGUSR1);
    check(inside_a == -1 && inside_b == 0 && handler_rc_a == 0 && handler_rc_b == 0 &&
              !vgpu_holds_a_lock(),
          "a signal handler on the thread holding a: refused a (rc %d) and given b (rc %d); "
          "after a is given back, given both", inside_a, inside_b);
}

static void overflow(void)
{
    static pthread_mutex_t many[VGPU_HELD_MAX + 1];
    for (int i = 0; i <= VGPU_HELD_MAX; i++) {
        pthread_mutex_init(&many[i], NULL);
        vgpu_lock(&many[i]);
    }
    int first = vgpu_holds(&many[0]), last = vgpu_holds(&many[VGPU_HELD_MAX]);
    int busy = pthread_mutex_trylock(&many[VGPU_HELD_MAX]);
    for (int i = VGPU_HELD_MAX; i >= 0; i--)
        vgpu_unlock(&many[i]);
    check(first && !last && busy == EBUSY && !vgpu_holds_a_lock(),
          "%d locks at once: the last taken but unlisted; all given back, none listed",
          VGPU_HELD_MAX + 1);
}

static volatile sig_atomic_t storm_refused, storm_taken;

static void storm_handler(int sig)
{
    (void)sig;
    pthread_mutex_t *both[2] = {&a, &b};
    for (int i = 0; i < 2; i++) {
        if (vgpu_lock_unless_mine(both[i]) == 0) {
            vgpu_unlock(both[i]);
            storm_taken = storm_taken + 1;
        } else {
            storm_refused = storm_refused + 1;
        }
    }
}

static void two_locks(unsigned long round)
{
    (void)round;
    vgpu_lock(&a);
    vgpu_lock(&b);
    vgpu_unlock(&a);
    vgpu_unlock(&b);
}

static void signal_storm(void)
{
    unsigned long rounds = storm(2.0, storm_handler, two_locks,
                                 "FAIL - the storm's handler waited for its own thread's lock\n");
    check(storm_refused > 0 && storm_taken > 0 && !vgpu_holds_a_lock(),
          "a storm of signals over %lu rounds of two locks: %d asks refused, %d taken, none "
          "waited for ever; none listed after", rounds, (int)storm_refused, (int)storm_taken);
}

int main(void)
{
    listing();
    handler_inside();
    overflow();
    signal_storm();
    return check_done("test_locks");
}
