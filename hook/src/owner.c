/* owner.c - a process's state and start time, read from /proc/PID/stat (proc(5)). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "owner.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The fields of /proc/PID/stat this file needs. */
struct proc_stat {
    char state;          /* field 3: R, S, D, ... Z (zombie), X (dead) */
    uint64_t start;      /* field 22: start time, clock ticks after boot */
};

/* Reads pid's stat line; 0, or -1 with errno set (ENOENT: no such process here). The command
 * name (field 2) is in parentheses and may hold spaces and parentheses itself: the fields after
 * it are counted from its last ')'. */
static int read_stat(const char *proc, int32_t pid, struct proc_stat *out)
{
    char path[4096], line[1024];
    int n_path = pid == 0 ? snprintf(path, sizeof path, "%s/self/stat", proc)
                          : snprintf(path, sizeof path, "%s/%d/stat", proc, (int)pid);
    if (n_path < 0 || (size_t)n_path >= sizeof path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return -1;
    ssize_t n;
    while ((n = read(fd, line, sizeof line - 1)) < 0 && errno == EINTR) {
    }
    int saved = errno;
    close(fd);
    if (n <= 0) {
        errno = n < 0 ? saved : EIO;
        return -1;
    }
    line[n] = '\0';
    char *end = strrchr(line, ')');
    if (end == NULL || end[1] != ' ' || end[2] == '\0' || end[3] != ' ') {
        errno = EIO;
        return -1;
    }
    out->state = end[2];
    char *field = end + 3; /* the space before field 4 (the parent's pid) */
    for (int i = 4; i < 22 && field != NULL; i++)
        field = strchr(field + 1, ' ');
    char *stop = NULL;
    out->start = field != NULL ? strtoull(field, &stop, 10) : 0;
    if (stop == field || out->start == 0) {
        errno = EIO;
        return -1;
    }
    return 0;
}

uint64_t vgpu_owner_start_ticks_in(const char *proc, int32_t pid)
{
    struct proc_stat st;
    return read_stat(proc, pid, &st) == 0 ? st.start : 0;
}

int vgpu_owner_runs_in(const char *proc, int32_t pid, uint64_t start_ticks)
{
    if (pid <= 0 || start_ticks == 0)
        return 0;
    struct proc_stat st;
    if (read_stat(proc, pid, &st) == 0)
        return st.state != 'Z' && st.state != 'X' && st.start == start_ticks;
    /* Hidden (hidepid) or unreadable: it exists unless kill says there is no such process. */
    return !(kill(pid, 0) != 0 && errno == ESRCH);
}

uint64_t vgpu_owner_start_ticks(int32_t pid) { return vgpu_owner_start_ticks_in("/proc", pid); }

int vgpu_owner_runs(int32_t pid, uint64_t start_ticks)
{
    return vgpu_owner_runs_in("/proc", pid, start_ticks);
}
