/* late_open.c - preloaded ahead of libvgpu by test_multiproc's together mode: the first openat of
 * the file named LATE_OPEN_NAME that finds nothing writes a byte to fd LATE_OPEN_FD and then
 * waits until that fd's peer says go (one byte back on LATE_OPEN_GO), so the test can make a peer
 * create and attach to the region inside the window between that open and the guard check. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

__attribute__((visibility("default"))) int openat(int dir_fd, const char *path, int flags, ...);

static int once;

static void late(const char *path)
{
    const char *name = getenv("LATE_OPEN_NAME");
    const char *said = getenv("LATE_OPEN_FD");
    const char *go = getenv("LATE_OPEN_GO");
    if (once || name == NULL || said == NULL || go == NULL || strcmp(path, name) != 0)
        return;
    once = 1;
    int err = errno;
    char byte = 'w';
    if (write(atoi(said), &byte, 1) == 1)
        (void)!read(atoi(go), &byte, 1);
    errno = err;
}

int openat(int dir_fd, const char *path, int flags, ...)
{
    static int (*real)(int, const char *, int, ...);
    if (real == NULL)
        real = (int (*)(int, const char *, int, ...))dlsym(RTLD_NEXT, "openat");
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list args;
        va_start(args, flags);
        mode = va_arg(args, mode_t);
        va_end(args);
    }
    int fd = real(dir_fd, path, flags, mode);
    if (fd < 0 && errno == ENOENT)
        late(path);
    return fd;
}
