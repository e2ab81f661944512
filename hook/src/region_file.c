/* region_file.c - the region file, opened fail-closed.
 *
 * What this refuses (each one an issue-11 finding, each refusal a log line and no CUDA):
 *   - a symbolic link (O_NOFOLLOW) or anything but a regular file;
 *   - a file shorter than a region (not a region, or truncated), or of another layout (one an
 *     older libvgpu made is initialised afresh when none of its processes lives, below);
 *   - a file whose magic is 0 but which holds data past the header: only the device plugin's
 *     all-zero file (or one whose creator died while writing the header) is initialised;
 *   - a missing or all-zero file while a process of an earlier region at that path still
 *     lives: removing (or emptying) the file must not start a second cap next to the first.
 * The last check is the guard: every process attached to a region holds an open-file-description
 * read lock on one byte of the region's folder, at an offset derived from the file name (not on
 * the file, which may be gone). Creating or initialising a region first checks that nobody holds
 * that byte. The folder itself being removed and made again defeats it (residual; in a pod the
 * file is a bind mount and can be neither removed nor renamed).
 *
 * A new file is created whole and then linked into place (link(2) fails if the name exists), so
 * the path never shows a half-written region; it is made read-write for every uid (fchmod 0666,
 * whatever the umask): the processes of one container may run as different uids and must share
 * one cap. A process that cannot open the file read-write refuses CUDA. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "region_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

static char why_text[320]; /* attach runs once per process */

static const char *because(const char *what, int err)
{
    snprintf(why_text, sizeof why_text, "%s: %s", what, strerror(err));
    return why_text;
}

static const char in_use[] = "processes of this container still use the region this file "
                             "replaced (it was removed, emptied or replaced while in use)";

/* Splits path into its folder (copied to dir) and its last component; NULL if it has none. */
static const char *split(const char *path, char *dir, size_t size)
{
    const char *slash = strrchr(path, '/');
    const char *name = slash != NULL ? slash + 1 : path;
    size_t len = slash == NULL ? 0 : slash == path ? 1 : (size_t)(slash - path);
    if (name[0] == '\0' || len >= size)
        return NULL;
    if (len == 0)
        snprintf(dir, size, ".");
    else
        snprintf(dir, size, "%.*s", (int)len, path);
    return name;
}

/* The guard byte of a file name: FNV-1a, in [2^40, 2^41) (far from anything else locked). */
static off_t guard_offset(const char *name)
{
    uint64_t h = UINT64_C(14695981039346656037);
    for (const unsigned char *c = (const unsigned char *)name; *c != '\0'; c++)
        h = (h ^ *c) * UINT64_C(1099511628211);
    return (off_t)((UINT64_C(1) << 40) + (h & ((UINT64_C(1) << 40) - 1)));
}

/* 1 if a process holds the guard byte at, 0 if none, -1 (errno set) if it cannot be told. */
static int guard_in_use(int dir_fd, off_t at)
{
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = at, .l_len = 1};
    if (fcntl(dir_fd, F_OFD_GETLK, &fl) != 0)
        return -1;
    return fl.l_type != F_UNLCK;
}

static int take_guard(int dir_fd, off_t at)
{
    struct flock fl = {.l_type = F_RDLCK, .l_whence = SEEK_SET, .l_start = at, .l_len = 1};
    return fcntl(dir_fd, F_OFD_SETLK, &fl);
}

_Static_assert(VGPU_CREATION_LOCK_WAIT_S == 10, "the line below names the wait");
const char vgpu_creation_lock_held[] =
    "another process has held the region's creation lock for 10 s (stopped while it attached "
    "or claimed a slot, or holding it on purpose)";

int vgpu_region_file_lock_byte(int fd, uint64_t at, unsigned wait_ms)
{
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = (off_t)at, .l_len = 1};
    uint64_t start = monotonic_ns();
    for (;;) {
        if (fcntl(fd, F_OFD_SETLK, &fl) == 0)
            return 0;
        if (errno != EAGAIN && errno != EACCES && errno != EINTR)
            return -1;
        if (monotonic_ns() - start >= (uint64_t)wait_ms * 1000000u) {
            errno = ETIMEDOUT;
            return -1;
        }
        usleep(1000);
    }
}

void vgpu_region_file_unlock_byte(int fd, uint64_t at)
{
    struct flock fl = {.l_type = F_UNLCK, .l_whence = SEEK_SET, .l_start = (off_t)at, .l_len = 1};
    fcntl(fd, F_OFD_SETLK, &fl);
}

/* Writes the header and device records, the magic last (a reader that sees it sees the rest). */
static int write_layout(int fd, const struct vgpu_limits *limits)
{
    struct {
        struct vgpu_region_header h;
        struct vgpu_region_device devices[VGPU_REGION_MAX_DEVICES];
    } init;
    _Static_assert(sizeof init == VGPU_REGION_SLOTS_OFFSET, "header and devices, no padding");
    memset(&init, 0, sizeof init);
    struct vgpu_region_header *h = &init.h;
    h->version = VGPU_REGION_VERSION;
    h->header_size = sizeof(struct vgpu_region_header);
    h->device_size = sizeof(struct vgpu_region_device);
    h->slot_size = sizeof(struct vgpu_region_slot);
    h->max_devices = VGPU_REGION_MAX_DEVICES;
    h->max_slots = VGPU_REGION_MAX_SLOTS;
    h->file_size = VGPU_REGION_FILE_SIZE;
    h->devices_offset = VGPU_REGION_DEVICES_OFFSET;
    h->slots_offset = VGPU_REGION_SLOTS_OFFSET;
    h->creator_pid = (int32_t)getpid();
    h->created_unix_ns = unix_ns();
    for (int d = 0; d < VGPU_REGION_MAX_DEVICES; d++) {
        init.devices[d].limit_bytes = limits->memory_bytes[d];
        init.devices[d].sm_limit_percent = limits->sm_percent[d];
    }
    uint64_t magic = VGPU_REGION_MAGIC;
    if (pwrite(fd, &init, sizeof init, 0) != (ssize_t)sizeof init ||
        pwrite(fd, &magic, sizeof magic, 0) != (ssize_t)sizeof magic)
        return -1;
    return 0;
}

/* 1 if every byte from the slots on is zero (a file nobody but a dying creator wrote). */
static int slots_are_zero(int fd)
{
    static const char zeros[4096];
    char buf[4096];
    for (off_t at = VGPU_REGION_SLOTS_OFFSET; at < VGPU_REGION_FILE_SIZE;) {
        ssize_t n = pread(fd, buf, sizeof buf, at);
        if (n <= 0)
            return 0;
        if (memcmp(buf, zeros, (size_t)n) != 0)
            return 0;
        at += n;
    }
    return 1;
}

/* Creates name in dir_fd as a whole region; 0 also when another process linked one first. */
static int create_region(int dir_fd, const char *name, const struct vgpu_limits *limits)
{
    char temp[64];
    int fd = -1;
    for (unsigned i = 0; fd < 0 && i < 100; i++) {
        snprintf(temp, sizeof temp, ".vgpu-region.%d.%u.%u", (int)getpid(), i,
                 (unsigned)(unix_ns() & 0xffff));
        fd = openat(dir_fd, temp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0 && errno != EEXIST)
            return -1;
    }
    if (fd < 0)
        return -1;
    int rc = fchmod(fd, 0666) == 0 && ftruncate(fd, VGPU_REGION_FILE_SIZE) == 0 &&
             write_layout(fd, limits) == 0 &&
             (linkat(dir_fd, temp, dir_fd, name, 0) == 0 || errno == EEXIST) ? 0 : -1;
    int err = errno;
    unlinkat(dir_fd, temp, 0);
    close(fd);
    errno = err;
    return rc;
}

/* With the guard taken: the name still leads to the file we opened. Removed (or replaced) between
 * our open and our guard, another process may have created a second region at the name whose
 * creation could not see our guard: attaching to the old file would start a second cap. */
static const char *still_linked(int fd, int dir_fd, const char *name)
{
    struct stat mine, named;
    if (fstat(fd, &mine) != 0)
        return because("cannot stat it", errno);
    if (mine.st_nlink == 0)
        return "it was removed while being opened";
    if (fstatat(dir_fd, name, &named, AT_SYMLINK_NOFOLLOW) != 0)
        return because("it was removed while being opened", errno);
    if (named.st_dev != mine.st_dev || named.st_ino != mine.st_ino)
        return "it was replaced by another file while being opened";
    return NULL;
}

/* Opens name (creating it when that is safe); returns the descriptor or -1 with *why.
 * A guard held while the name is missing is either a removed region still in use or, when
 * processes start together, a peer's new one: it was linked before anyone could attach to it
 * and take the guard, so one more open tells the two apart. */
static int open_file(int dir_fd, const char *name, off_t guard, const struct vgpu_limits *limits,
                     const char **why)
{
    for (int created = 0, guarded = 0;;) {
        int fd = openat(dir_fd, name, O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        if (fd >= 0)
            return fd;
        if (errno == ELOOP) {
            *why = "it is a symbolic link (a region file is never followed)";
            return -1;
        }
        if (errno != ENOENT || created) {
            *why = because("cannot open it read-write", errno);
            return -1;
        }
        int busy = guard_in_use(dir_fd, guard);
        if (busy < 0) {
            *why = because("cannot check its folder's guard lock", errno);
            return -1;
        }
        if (busy > 0 && guarded) {
            *why = in_use;
            return -1;
        }
        guarded = busy;
        if (busy > 0)
            continue;
        if (create_region(dir_fd, name, limits) != 0) {
            *why = because("cannot create it", errno);
            return -1;
        }
        created = 1;
    }
}

/* Zeroes the file from the slots on. */
static int zero_slots(int fd)
{
    static const char zeros[4096];
    for (off_t at = VGPU_REGION_SLOTS_OFFSET; at < VGPU_REGION_FILE_SIZE;) {
        size_t n = VGPU_REGION_FILE_SIZE - at < (off_t)sizeof zeros
                       ? (size_t)(VGPU_REGION_FILE_SIZE - at) : sizeof zeros;
        ssize_t done = pwrite(fd, zeros, n, at);
        if (done <= 0)
            return -1;
        at += done;
    }
    return 0;
}

/* A region an older libvgpu made: its layout and size are this one's, with another way of
 * counting (vgpu_region.h). A pod's folder outlives its container, so a container restarted
 * after the plugin installed this library finds its old region there. */
static int older_layout(const struct vgpu_region_header *h, off_t size)
{
    return h->magic == VGPU_REGION_MAGIC && h->version >= 1 &&
           h->version < VGPU_REGION_VERSION && h->file_size == VGPU_REGION_FILE_SIZE &&
           size == VGPU_REGION_FILE_SIZE;
}

/* With the creation lock held: the file is a region of this layout, initialised here if it is
 * the plugin's all-zero file, or an older library's, and no process of an earlier region lives
 * (one would go on counting the old way, outside the new region's cap). */
static const char *check_or_initialise(int fd, int dir_fd, off_t guard, off_t size,
                                       const struct vgpu_limits *limits)
{
    struct vgpu_region_header h;
    if (pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h)
        return because("cannot read its header", errno);
    int older = older_layout(&h, size);
    if (h.magic == 0 || older) {
        if (!older && (size != VGPU_REGION_FILE_SIZE || !slots_are_zero(fd)))
            return "not a region (its first bytes are zero but it holds other data)";
        int busy = guard_in_use(dir_fd, guard);
        if (busy != 0)
            return busy < 0 ? because("cannot check its folder's guard lock", errno)
                   : older ? "an older libvgpu's processes of this container still use it "
                             "(another layout version): restart the container"
                           : in_use;
        if ((older && zero_slots(fd) != 0) || write_layout(fd, limits) != 0 ||
            pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h)
            return because("cannot write its header", errno);
    }
    return vgpu_region_layout_problem(&h, (uint64_t)size);
}

int vgpu_region_file_open(const char *path, const struct vgpu_limits *limits,
                          struct vgpu_region_file *out, const char **why)
{
    char dir[4096];
    const char *name = split(path, dir, sizeof dir);
    if (name == NULL) {
        *why = "not a file path";
        return -1;
    }
    int dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd < 0) {
        *why = because("cannot open its folder", errno);
        return -1;
    }
    off_t guard = guard_offset(name);
    int fd = open_file(dir_fd, name, guard, limits, why);
    if (fd < 0) {
        close(dir_fd);
        return -1;
    }
    struct stat st;
    const char *problem = NULL;
    void *map = MAP_FAILED;
    if (fstat(fd, &st) != 0)
        problem = because("cannot stat it", errno);
    else if (!S_ISREG(st.st_mode))
        problem = "not a regular file";
    else if (st.st_size < (off_t)VGPU_REGION_FILE_SIZE)
        problem = "too small for a region (not a region, or truncated)";
    else if (vgpu_region_file_lock_byte(fd, 0, VGPU_CREATION_LOCK_WAIT_S * 1000) != 0)
        problem = errno == ETIMEDOUT ? vgpu_creation_lock_held : because("cannot lock it", errno);
    else {
        problem = check_or_initialise(fd, dir_fd, guard, st.st_size, limits);
        if (problem == NULL) {
            map = mmap(NULL, VGPU_REGION_FILE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (map == MAP_FAILED)
                problem = because("cannot map it", errno);
            else if (take_guard(dir_fd, guard) != 0)
                problem = because("cannot take its folder's guard lock", errno);
            else
                problem = still_linked(fd, dir_fd, name);
        }
        vgpu_region_file_unlock_byte(fd, 0);
    }
    if (problem != NULL) {
        if (map != MAP_FAILED)
            munmap(map, VGPU_REGION_FILE_SIZE);
        close(fd); /* drops the creation lock too */
        close(dir_fd);
        *why = problem;
        return -1;
    }
    *out = (struct vgpu_region_file){.map = map, .fd = fd, .dir_fd = dir_fd,
                                     .dev = (uint64_t)st.st_dev, .ino = (uint64_t)st.st_ino};
    return 0;
}
