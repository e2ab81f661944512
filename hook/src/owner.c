/* owner.c - a process's state, start time and file mappings, read from /proc/PID/stat and
 * /proc/PID/maps (proc(5)). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "owner.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysmacros.h>
#include <unistd.h>

/* The fields of /proc/PID/stat this file needs. */
struct proc_stat {
    char state;     /* field 3: R, S, D, ... Z (zombie), X (dead) */
    uint64_t start; /* field 22: start time, clock ticks after boot */
};

/* proc/PID/NAME (PID "self" for pid 0) in path; 0, or -1 when it does not fit. */
static int proc_path(char *path, size_t size, const char *proc, int32_t pid, const char *name)
{
    int n = pid == 0 ? snprintf(path, size, "%s/self/%s", proc, name)
                     : snprintf(path, size, "%s/%d/%s", proc, (int)pid, name);
    return n >= 0 && (size_t)n < size ? 0 : -1;
}

/* A field of digits alone (the line's next space or its end after them). */
static int parse_number(const char *field, uint64_t *out)
{
    if (*field < '0' || *field > '9')
        return -1;
    char *stop;
    errno = 0;
    unsigned long long value = strtoull(field, &stop, 10);
    if (errno == ERANGE || (*stop != ' ' && *stop != '\n' && *stop != '\0'))
        return -1;
    *out = value;
    return 0;
}

/* Reads pid's stat line; 0, or -1 when there is none to read or it is not one. The command
 * name (field 2) is in parentheses and may hold spaces and parentheses itself: the fields after
 * it are counted from its last ')'. */
static int read_stat(const char *proc, int32_t pid, struct proc_stat *out)
{
    char path[4096], line[1024];
    if (proc_path(path, sizeof path, proc, pid, "stat") != 0)
        return -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, line, sizeof line - 1); /* procfs gives the line in one read */
    close(fd);
    if (n <= 0)
        return -1;
    line[n] = '\0';
    char *end = strrchr(line, ')');
    if (end == NULL || end[1] != ' ' || end[2] == '\0' || end[3] != ' ')
        return -1;
    out->state = end[2];
    const char *field = end + 3; /* the space before field 4 (the parent's pid) */
    for (int i = 4; i < 22 && field != NULL; i++)
        field = strchr(field + 1, ' ');
    if (field == NULL || parse_number(field + 1, &out->start) != 0 || out->start == 0)
        return -1;
    return 0;
}

/* A line of /proc/PID/maps: "start-end perms offset major:minor inode path". */
struct mapping {
    unsigned long long start, inode;
    unsigned int major_no, minor_no;
};

static int parse_mapping(const char *line, struct mapping *m)
{
    return sscanf(line, "%llx-%*x %*s %*x %x:%x %llu", &m->start, &m->major_no, &m->minor_no,
                  &m->inode) == 4
               ? 0
               : -1;
}

/* Calls visit for each of pid's mappings until it answers nonzero; returns that answer, 0 when
 * none did, or -1 when the mappings cannot be read (another user's process: reading them takes
 * the right to trace it). A line longer than the buffer (a long path) comes in pieces: only a
 * line's first is parsed, and the fields asked for are in its first hundred bytes. */
static int each_mapping(const char *proc, int32_t pid,
                        int (*visit)(const struct mapping *, void *), void *arg)
{
    char path[4096], line[256];
    if (proc_path(path, sizeof path, proc, pid, "maps") != 0)
        return -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    FILE *maps = fd >= 0 ? fdopen(fd, "r") : NULL;
    if (maps == NULL) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    int answer = 0, line_start = 1;
    struct mapping m;
    while (answer == 0 && fgets(line, sizeof line, maps) != NULL) {
        if (line_start && parse_mapping(line, &m) == 0)
            answer = visit(&m, arg);
        line_start = strchr(line, '\n') != NULL;
    }
    if (answer == 0 && ferror(maps))
        answer = -1;
    fclose(maps);
    return answer;
}

static int maps_file(const struct mapping *m, void *arg)
{
    const struct vgpu_owner *owner = arg;
    return m->inode == owner->ino && m->major_no == major((dev_t)owner->dev) &&
           m->minor_no == minor((dev_t)owner->dev);
}

struct identity {
    uintptr_t start;
    uint64_t dev, ino;
};

static int names_start(const struct mapping *m, void *arg)
{
    struct identity *id = arg;
    if (m->start != id->start)
        return 0;
    id->dev = (uint64_t)makedev(m->major_no, m->minor_no);
    id->ino = m->inode;
    return 1;
}

int vgpu_owner_mapping_of(const void *addr, uint64_t *dev, uint64_t *ino)
{
    struct identity id = {.start = (uintptr_t)addr};
    if (each_mapping("/proc", 0, names_start, &id) != 1)
        return -1;
    *dev = id.dev;
    *ino = id.ino;
    return 0;
}

uint64_t vgpu_owner_start_ticks_in(const char *proc, int32_t pid)
{
    struct proc_stat st;
    return read_stat(proc, pid, &st) == 0 ? st.start : 0;
}

int vgpu_owner_runs_in(const char *proc, const struct vgpu_owner *owner)
{
    if (owner->pid <= 0 || owner->start_ticks == 0)
        return 0;
    struct proc_stat st;
    if (read_stat(proc, owner->pid, &st) != 0) /* hidden (hidepid), unreadable, or gone */
        return !(kill(owner->pid, 0) != 0 && errno == ESRCH);
    if (st.state == 'Z' || st.state == 'X' || st.start != owner->start_ticks)
        return 0;
    return each_mapping(proc, owner->pid, maps_file, (void *)owner) != 0;
}

uint64_t vgpu_owner_start_ticks(int32_t pid) { return vgpu_owner_start_ticks_in("/proc", pid); }

int vgpu_owner_runs(const struct vgpu_owner *owner) { return vgpu_owner_runs_in("/proc", owner); }
