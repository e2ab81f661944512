/* check.h - a tiny test reporter shared by the C tests: one line per check, a summary, and the
 * exit status. Test-only; every function is static. */
#ifndef VGPU_CHECK_H
#define VGPU_CHECK_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int check_failed, check_passed;

__attribute__((format(printf, 2, 3), unused)) static int check(int ok, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    fprintf(stdout, "%s - ", ok ? "ok" : "FAIL");
    vfprintf(stdout, fmt, args);
    fputc('\n', stdout);
    fflush(stdout);
    va_end(args);
    if (ok)
        check_passed++;
    else
        check_failed++;
    return ok;
}

__attribute__((unused)) static int check_done(const char *suite)
{
    printf("%s: %d passed, %d failed\n", suite, check_passed, check_failed);
    return check_failed == 0 ? 0 : 1;
}

__attribute__((unused)) static void sleep_s(double s)
{
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Captures what the code under test writes to stderr between begin and end. */
static int captured_fd = -1, saved_stderr = -1;
static char captured[8192];

__attribute__((unused)) static void capture_begin(void)
{
    char path[] = "/tmp/vgpu-capture-XXXXXX";
    captured_fd = mkstemp(path);
    unlink(path);
    fflush(stderr);
    saved_stderr = dup(STDERR_FILENO);
    dup2(captured_fd, STDERR_FILENO);
}

__attribute__((unused)) static const char *capture_end(void)
{
    fflush(stderr);
    dup2(saved_stderr, STDERR_FILENO);
    close(saved_stderr);
    ssize_t n = pread(captured_fd, captured, sizeof captured - 1, 0);
    captured[n > 0 ? n : 0] = '\0';
    close(captured_fd);
    return captured;
}

#endif
