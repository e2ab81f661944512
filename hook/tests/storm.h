/* storm.h - signals landing anywhere in a loop, for tests of what a signal handler's call does
 * inside the library (hook/README.md, "A CUDA call from a signal handler"). Test-only; every
 * function is static. */
#ifndef VGPU_STORM_H
#define VGPU_STORM_H

#include <signal.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static const char *watchdog_line = "FAIL - a call waited for its own thread's lock\n";

static void watchdog_fired(int sig)
{
    (void)sig;
    size_t n = 0;
    while (watchdog_line[n] != '\0')
        n++;
    if (write(STDOUT_FILENO, watchdog_line, n) < 0)
        _exit(1);
    _exit(1);
}

/* After `seconds`, `line` (ending in a newline) is printed and the test exits failing: a call
 * that waits for ever fails the test instead of hanging it. watchdog(0, NULL) disarms it. */
__attribute__((unused)) static void watchdog(unsigned seconds, const char *line)
{
    if (line != NULL)
        watchdog_line = line;
    signal(SIGALRM, watchdog_fired);
    alarm(seconds);
}

/* Runs step(round) in a loop for `seconds` while SIGPROF runs handler every tick of the CPU
 * time the process uses (asked for every 50 us), under a 20 s watchdog saying `line`; returns
 * the rounds run. */
__attribute__((unused)) static unsigned long storm(double seconds, void (*handler)(int),
                                                   void (*step)(unsigned long), const char *line)
{
    struct sigaction sa = {.sa_handler = handler, .sa_flags = SA_RESTART};
    sigaction(SIGPROF, &sa, NULL);
    watchdog(20, line);
    struct itimerval every = {.it_interval = {0, 50}, .it_value = {0, 50}};
    setitimer(ITIMER_PROF, &every, NULL);
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    unsigned long rounds = 0;
    do {
        step(rounds++);
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((double)(now.tv_sec - start.tv_sec) + (double)(now.tv_nsec - start.tv_nsec) / 1e9 <
             seconds);
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_PROF, &off, NULL);
    alarm(0);
    signal(SIGPROF, SIG_DFL);
    return rounds;
}

#endif
