/* test_owner.c - whether a slot's owner still runs (src/owner.c), over a made-up /proc in a
 * temporary folder (a stat line of each shape: a command name with spaces and parentheses, a
 * zombie, another start time, malformed fields, an empty file, a symbolic link, none at all;
 * mappings with and without the region, long lines, unreadable) and over the real one (this
 * process, which maps a file of its own, a child that exited, a zombie). Where the made-up /proc
 * cannot say whether a process exists, kill(pid, 0) decides: a real live pid (this process's)
 * runs, a real gone one does not. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "owner.h"

static char proc[] = "/tmp/vgpu-proc-XXXXXX";

/* The region's identity in the made-up mappings: device 0xfe:0x01, inode 4242. */
static const uint64_t region_ino = 4242;
static uint64_t region_dev(void) { return (uint64_t)makedev(0xfe, 0x01); }

/* Writes `text` as pid's file `name` under the made-up /proc (NULL: the folder alone). */
static void proc_file(int32_t pid, const char *name, const char *text)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%d", proc, (int)pid);
    mkdir(path, 0755);
    if (text == NULL)
        return;
    snprintf(path, sizeof path, "%s/%d/%s", proc, (int)pid, name);
    unlink(path);
    FILE *f = fopen(path, "w");
    if (f != NULL) {
        fputs(text, f);
        fclose(f);
    }
}

/* A stat line of a process in `state` that started at `start`, named `comm`. */
static const char *line_of(const char *comm, char state, unsigned long long start)
{
    static char line[512];
    snprintf(line, sizeof line, "%d (%s) %c 1 1 1 0 -1 4194560 100 0 0 0 5 2 0 0 20 0 1 0 %llu "
             "1000 100 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n",
             4242, comm, state, start);
    return line;
}

static const char maps_with_region[] =
    "55d4c0a00000-55d4c0a21000 r--p 00000000 08:01 131 /usr/bin/python3.11\n"
    "7f493b90c000-7f493b93d000 rw-s 00000000 fe:01 4242                    /tmp/vgpu/a.cache\n"
    "7ffd5e9e0000-7ffd5ea01000 rw-p 00000000 00:00 0                          [stack]\n";
static const char maps_without[] =
    "55d4c0a00000-55d4c0a21000 r--p 00000000 08:01 131 /usr/bin/sleep\n"
    "7f493b90c000-7f493b93d000 rw-s 00000000 fe:01 4243                    /tmp/vgpu/b.cache\n"
    "7f493b90c000-7f493b93d000 rw-s 00000000 fe:02 4242                    /tmp/vgpu/c.cache\n";

static struct vgpu_owner owner_of(int32_t pid, uint64_t start)
{
    return (struct vgpu_owner){.pid = pid, .start_ticks = start, .dev = region_dev(),
                               .ino = region_ino};
}

static int runs(int32_t pid, uint64_t start)
{
    struct vgpu_owner o = owner_of(pid, start);
    return vgpu_owner_runs_in(proc, &o);
}

/* A pid no process has: a child's, once it has exited and been waited for. */
static pid_t gone_pid(void)
{
    pid_t child = fork();
    if (child == 0)
        _exit(0);
    int status;
    waitpid(child, &status, 0);
    return child;
}

static void stat_lines(pid_t me, pid_t gone)
{
    proc_file(me, "maps", maps_with_region);
    proc_file(me, "stat", line_of("python3", 'S', 777));
    check(vgpu_owner_start_ticks_in(proc, me) == 777, "the start time is the 22nd field");
    check(runs(me, 777), "a sleeping process that started then, mapping the region, runs");
    check(!runs(me, 778), "one that started at another time is another process: gone");
    check(!runs(me, 0), "with no start time known, no process can be shown to be the owner (a "
          "pid of a namespace since gone may be another's)");
    check(!runs(0, 777) && !runs(-5, 777), "pid 0 or negative: no owner");

    proc_file(me, "stat", line_of("a) S 1 (b c", 'R', 777));
    check(vgpu_owner_start_ticks_in(proc, me) == 777 && runs(me, 777),
          "a command name with spaces and parentheses: the fields are counted from its last ')'");
    proc_file(me, "stat", line_of("worker", 'Z', 777));
    check(!runs(me, 777), "a zombie (exited, not waited for) is gone");
    proc_file(me, "stat", line_of("worker", 'X', 777));
    check(!runs(me, 777), "so is a dead one (X)");

    /* Lines the parser refuses: kill(pid, 0) decides, for a live pid and a gone one. */
    const char *bad[] = {
        "4242 (worker) S 1 1 1\n", "", "4242 (worker)\n", "4242 (worker) S",
        "4242 worker S 1 1 1 0 -1 4194560 100 0 0 0 5 2 0 0 20 0 1 0 777 1\n",
        "4242 (worker) S 1 1 1 0 -1 4194560 100 0 0 0 5 2 0 0 20 0 1 0 x 1\n",
        "4242 (worker) S 1 1 1 0 -1 4194560 100 0 0 0 5 2 0 0 20 0 1 0 -777 1\n",
        "4242 (worker) S 1 1 1 0 -1 4194560 100 0 0 0 5 2 0 0 20 0 1 0 777x 1\n",
        "4242 (worker) S 1 1 1 0 -1 4194560 100 0 0 0 5 2 0 0 20 0 1 0 0 1\n",
        "4242 (worker) S 1 1 1 0 -1 4194560 100 0 0 0 5 2 0 0 20 0 1 0 99999999999999999999 1\n"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        proc_file(me, "stat", bad[i]);
        proc_file(gone, "stat", bad[i]);
        check(vgpu_owner_start_ticks_in(proc, me) == 0 && runs(me, 777) && !runs(gone, 777),
              "unreadable line %zu: no start time; kill(pid, 0) says this process runs and a "
              "gone one does not", i);
    }

    char path[256], target[256];
    snprintf(path, sizeof path, "%s/%d/stat", proc, (int)me);
    snprintf(target, sizeof target, "%s/elsewhere", proc);
    FILE *f = fopen(target, "w");
    if (f != NULL) {
        fputs(line_of("worker", 'Z', 777), f);
        fclose(f);
    }
    unlink(path);
    check(symlink(target, path) == 0 && runs(me, 777),
          "a symbolic link in place of stat is not followed (its zombie line is not read; kill "
          "decides)");
    unlink(path);
    check(runs(me, 777) && !runs(gone, 777), "no stat file: kill decides");
    struct vgpu_owner mine = owner_of(me, 777), theirs = owner_of(gone, 777);
    check(vgpu_owner_runs_in("/nonexistent-proc", &mine) &&
              !vgpu_owner_runs_in("/nonexistent-proc", &theirs),
          "no /proc at all: kill decides");
    static char longer[5000];
    snprintf(longer, sizeof longer, "/%04090d", 0);
    check(vgpu_owner_start_ticks_in(longer, me) == 0 && vgpu_owner_runs_in(longer, &mine),
          "a /proc path too long for the buffer: refused, kill decides");
}

static void mappings(pid_t me)
{
    proc_file(me, "stat", line_of("python3", 'S', 777));
    proc_file(me, "maps", maps_without);
    check(!runs(me, 777), "the process that started then no longer maps the region (another "
          "inode, another device): it exec'd, and is gone");
    proc_file(me, "maps", "");
    check(!runs(me, 777), "no mappings at all (a kernel thread, or an image that exited): gone");
    static char long_lines[8192];
    snprintf(long_lines, sizeof long_lines,
             "55d4c0a00000-55d4c0a21000 r--p 00000000 08:01 131 /%0600d\n%s", 0, maps_with_region);
    proc_file(me, "maps", long_lines);
    check(runs(me, 777), "a line longer than the buffer, then the region's: runs");
    snprintf(long_lines, sizeof long_lines,
             "55d4c0a00000-55d4c0a21000 r--p 00000000 08:01 131 /%0300d "
             "7f493b90c000-7f493b93d000 rw-s 00000000 fe:01 4242 /tmp/a.cache\n", 0);
    proc_file(me, "maps", long_lines);
    check(!runs(me, 777), "the region's fields inside a long line's path are not taken for a "
          "mapping");
    char path[256];
    snprintf(path, sizeof path, "%s/%d/maps", proc, (int)me);
    unlink(path);
    check(runs(me, 777), "mappings that cannot be read (another user's process): it runs");
    check(mkdir(path, 0755) == 0 && runs(me, 777), "nor can a folder's: it runs");
    rmdir(path);
}

/* Over the real /proc: this process maps a file of its own. */
static void real_proc(pid_t gone)
{
    char file[] = "/tmp/vgpu-owner-map-XXXXXX";
    int fd = mkstemp(file);
    struct stat st;
    void *m = fd >= 0 && ftruncate(fd, 4096) == 0 && fstat(fd, &st) == 0
                  ? mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0)
                  : MAP_FAILED;
    uint64_t start = vgpu_owner_start_ticks(0);
    struct vgpu_owner me = {.pid = getpid(), .start_ticks = start, .dev = st.st_dev,
                            .ino = st.st_ino};
    check(m != MAP_FAILED && start != 0 && vgpu_owner_start_ticks(getpid()) == start,
          "this process's start time, from /proc/self and /proc/PID alike (%llu)",
          (unsigned long long)start);
    uint64_t shown_dev = 0, shown_ino = 0;
    check(vgpu_owner_mapping_of(m, &shown_dev, &shown_ino) == 0 && shown_dev == st.st_dev &&
              shown_ino == st.st_ino,
          "its mapping, found by its address in /proc/self/maps, names the file fstat names");
    char *inside = m != MAP_FAILED ? (char *)m + 16 : NULL;
    check(vgpu_owner_mapping_of(inside, &shown_dev, &shown_ino) == -1,
          "an address inside it but not its start names none");
    check(vgpu_owner_runs(&me), "this process, mapping the file, runs");
    me.start_ticks = start + 1;
    check(!vgpu_owner_runs(&me), "with another start time it would be another");
    me.start_ticks = start;
    me.ino = st.st_ino + 1;
    check(!vgpu_owner_runs(&me), "with another file, it maps no region");
    if (m != MAP_FAILED)
        munmap(m, 4096);
    me.ino = st.st_ino;
    check(!vgpu_owner_runs(&me), "once it unmaps the file, gone");
    if (fd >= 0)
        close(fd);
    unlink(file);

    struct vgpu_owner waited = {.pid = gone, .start_ticks = start};
    check(!vgpu_owner_runs(&waited), "a child that exited and was waited for is gone");
    pid_t zombie = fork();
    if (zombie == 0)
        _exit(0);
    siginfo_t info;
    waitid(P_PID, (id_t)zombie, &info, WEXITED | WNOWAIT);
    struct vgpu_owner z = {.pid = zombie, .start_ticks = vgpu_owner_start_ticks(zombie)};
    check(z.start_ticks != 0 && !vgpu_owner_runs(&z), "a child that exited and is not yet "
          "waited for (a zombie: /proc still has its start time) is gone");
    int status;
    waitpid(zombie, &status, 0);
}

int main(void)
{
    if (mkdtemp(proc) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    pid_t me = getpid(), gone = gone_pid();
    stat_lines(me, gone);
    mappings(me);
    real_proc(gone);
    char command[300];
    snprintf(command, sizeof command, "rm -rf '%s'", proc);
    if (system(command) != 0)
        perror("rm");
    return check_done("test_owner");
}
