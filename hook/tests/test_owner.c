/* test_owner.c - whether a slot's owner still runs (src/owner.c), over a made-up /proc in a
 * temporary folder (a stat line of each shape: a command name with spaces and parentheses, a
 * zombie, another start time, too few fields, an empty file, a symbolic link, none at all) and
 * over the real one (this process, a child that exited, a pid nobody has). Where the made-up
 * /proc cannot say, kill(pid, 0) decides: a real live pid (this process's) runs, a real gone
 * one does not. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "owner.h"

static char proc[] = "/tmp/vgpu-proc-XXXXXX";

/* Writes `line` as pid's stat under the made-up /proc (NULL: the folder, without the file). */
static void stat_line(int32_t pid, const char *line)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%d", proc, (int)pid);
    mkdir(path, 0755);
    if (line == NULL)
        return;
    snprintf(path, sizeof path, "%s/%d/stat", proc, (int)pid);
    FILE *f = fopen(path, "w");
    if (f != NULL) {
        fputs(line, f);
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

int main(void)
{
    if (mkdtemp(proc) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    pid_t me = getpid(), gone = gone_pid();

    stat_line(me, line_of("python3", 'S', 777));
    check(vgpu_owner_start_ticks_in(proc, me) == 777, "the start time is the 22nd field");
    check(vgpu_owner_runs_in(proc, me, 777), "a sleeping process that started then runs");
    check(!vgpu_owner_runs_in(proc, me, 778), "one that started at another time is another "
          "process: the owner is gone");
    check(!vgpu_owner_runs_in(proc, me, 0), "with no start time known, no process can be shown "
          "to be the owner (a pid of a namespace since gone may be another's)");
    check(!vgpu_owner_runs_in(proc, 0, 777) && !vgpu_owner_runs_in(proc, -5, 777),
          "pid 0 or negative: no owner");

    stat_line(me, line_of("a) S 1 (b c", 'R', 777));
    check(vgpu_owner_start_ticks_in(proc, me) == 777 && vgpu_owner_runs_in(proc, me, 777),
          "a command name with spaces and parentheses: the fields are counted from its last ')'");

    stat_line(me, line_of("worker", 'Z', 777));
    check(!vgpu_owner_runs_in(proc, me, 777), "a zombie (exited, not waited for) is gone");
    stat_line(me, line_of("worker", 'X', 777));
    check(!vgpu_owner_runs_in(proc, me, 777), "so is a dead one (X)");

    /* Lines the parser refuses: kill(pid, 0) decides, for a live pid and a gone one. */
    const char *bad[] = {"4242 (worker) S 1 1 1\n", "", "4242 (worker)\n", "4242 (worker) S",
                         "4242 worker S 1 1 1 0 -1 4194560 100 0 0 0 5 2 0 0 20 0 1 0 777 1\n",
                         "4242 (worker) S 1 1 1 0 -1 4194560 100 0 0 0 5 2 0 0 20 0 1 0 x 1\n"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        stat_line(me, bad[i]);
        stat_line(gone, bad[i]);
        check(vgpu_owner_start_ticks_in(proc, me) == 0 && vgpu_owner_runs_in(proc, me, 777) &&
              !vgpu_owner_runs_in(proc, gone, 777), "unreadable line %zu: no start time; "
              "kill(pid, 0) says this process runs and a gone one does not", i);
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
    check(symlink(target, path) == 0 && vgpu_owner_runs_in(proc, me, 777),
          "a symbolic link in place of stat is not followed (its zombie line is not read; kill "
          "decides)");
    unlink(path);
    rmdir(path); /* no file at all: the folder alone (hidepid hides the folder too) */
    check(vgpu_owner_runs_in(proc, me, 777) && !vgpu_owner_runs_in(proc, gone, 777),
          "no stat file: kill decides");
    check(vgpu_owner_runs_in("/nonexistent-proc", me, 777) &&
          !vgpu_owner_runs_in("/nonexistent-proc", gone, 777), "no /proc at all: kill decides");
    char longer[5000];
    snprintf(longer, sizeof longer, "/%04090d", 0);
    check(vgpu_owner_start_ticks_in(longer, me) == 0 && vgpu_owner_runs_in(longer, me, 777),
          "a /proc path too long for the buffer: refused, kill decides");

    /* The real /proc. */
    uint64_t mine = vgpu_owner_start_ticks(0);
    check(mine != 0 && vgpu_owner_start_ticks(me) == mine,
          "this process's start time, from /proc/self and /proc/PID alike (%llu)",
          (unsigned long long)mine);
    check(vgpu_owner_runs(me, mine) && !vgpu_owner_runs(me, mine + 1),
          "this process runs; with another start time it would be another");
    check(!vgpu_owner_runs(gone, mine), "a child that exited and was waited for is gone");
    pid_t zombie = fork();
    if (zombie == 0)
        _exit(0);
    siginfo_t info;
    waitid(P_PID, (id_t)zombie, &info, WEXITED | WNOWAIT);
    uint64_t zombie_start = vgpu_owner_start_ticks(zombie);
    check(zombie_start != 0 && !vgpu_owner_runs(zombie, zombie_start),
          "a child that exited and is not yet waited for (a zombie: /proc still has its start "
          "time) is gone");
    int status;
    waitpid(zombie, &status, 0);

    char command[300];
    snprintf(command, sizeof command, "rm -rf '%s'", proc);
    if (system(command) != 0)
        perror("rm");
    return check_done("test_owner");
}
