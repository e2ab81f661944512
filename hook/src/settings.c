/* settings.c - the device plugin's read-only settings file, else the environment. */
#ifndef _GNU_SOURCE /* the unit tests define it on the command line */
#define _GNU_SOURCE
#endif
#include "settings.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "vgpu_region.h"

const char vgpu_settings_path[] = "/usr/local/vgpu/vgpu.env";

/* The variables the file governs (each also with _<device> where marked): with a file, these are
 * never taken from the environment. */
static const struct {
    const char *name;
    int per_device;
} governed_names[] = {
    {"CUDA_DEVICE_MEMORY_LIMIT", 1}, {"CUDA_DEVICE_SM_LIMIT", 1},
    {"CUDA_DEVICE_MEMORY_SHARED_CACHE", 0}, {"GPU_CORE_UTILIZATION_POLICY", 0},
};
static const char required_name[] = "CUDA_DEVICE_MEMORY_SHARED_CACHE";

__attribute__((format(printf, 2, 3))) static int fail(struct vgpu_settings *s, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    vsnprintf(s->why, sizeof s->why, fmt, args);
    va_end(args);
    return -1;
}

static int valid_name(const char *name, size_t len)
{
    if (len == 0 || (name[0] >= '0' && name[0] <= '9'))
        return 0;
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'))
            return 0;
    }
    return 1;
}

/* Matches name (len bytes) against the governed names: 0 none, 1 one of them, 2 NAME_<digits>
 * of a per-device one, with *device its index, or VGPU_REGION_MAX_DEVICES for one past the
 * region's devices or written otherwise than the plugin writes it (a leading zero). */
static int governed_as(const char *name, size_t len, int *device)
{
    for (size_t i = 0; i < sizeof governed_names / sizeof governed_names[0]; i++) {
        size_t n = strlen(governed_names[i].name);
        if (len < n || strncmp(name, governed_names[i].name, n) != 0)
            continue;
        if (len == n)
            return 1;
        if (!governed_names[i].per_device || name[n] != '_' || len == n + 1)
            continue;
        size_t d = n + 1;
        int index = name[d] == '0' && len > d + 1 ? VGPU_REGION_MAX_DEVICES : 0;
        for (; d < len && name[d] >= '0' && name[d] <= '9'; d++)
            if (index < VGPU_REGION_MAX_DEVICES)
                index = index * 10 + (name[d] - '0');
        if (d == len) {
            *device = index < VGPU_REGION_MAX_DEVICES ? index : VGPU_REGION_MAX_DEVICES;
            return 2;
        }
    }
    return 0;
}

/* Whether name is one the library reads from the file: a governed name, or NAME_<i> for a
 * per-device one and a device the region keeps (0..15, no leading zero, as the plugin writes
 * it). */
static int read_by_library(const char *name)
{
    int device = 0, kind = governed_as(name, strlen(name), &device);
    return kind == 1 || (kind == 2 && device < VGPU_REGION_MAX_DEVICES);
}

/* Whether name looks like one of the library's settings (the prefixes of its limits and
 * policy): one it does not read is a typo or a device past the region's 16, whose limit would be
 * left off. CUDA's own CUDA_DEVICE_ORDER and CUDA_DEVICE_MAX_CONNECTIONS are not of that kind. */
static int looks_like_setting(const char *name)
{
    return strncmp(name, "CUDA_DEVICE_MEMORY_", 19) == 0 ||
           strncmp(name, "CUDA_DEVICE_SM_", 15) == 0 ||
           strncmp(name, "GPU_CORE_UTILIZATION_POLICY", 27) == 0;
}

/* The file's value of name, or NULL. */
static const char *entry(const struct vgpu_settings *s, const char *name)
{
    for (int i = 0; i < s->count; i++)
        if (strcmp(s->names[i], name) == 0)
            return s->values[i];
    return NULL;
}

/* Splits s->text (NUL-terminated, modified in place) into entries. */
static int parse(struct vgpu_settings *s, size_t size)
{
    if (memchr(s->text, '\0', size) != NULL)
        return fail(s, "it contains a NUL byte (not a text file)");
    char *p = s->text;
    for (int line = 1; *p != '\0'; line++) {
        char *end = strchr(p, '\n');
        if (end != NULL)
            *end = '\0';
        if (p[0] != '\0' && p[0] != '#') {
            char *eq = strchr(p, '=');
            if (eq == NULL || !valid_name(p, (size_t)(eq - p)))
                return fail(s, "line %d is not NAME=VALUE (NAME of A-Z, 0-9 and _)", line);
            *eq = '\0';
            if (entry(s, p) != NULL)
                return fail(s, "%s given twice (line %d)", p, line);
            if (looks_like_setting(p) && !read_by_library(p))
                return fail(s, "line %d: no setting %.48s (it reads CUDA_DEVICE_MEMORY_LIMIT and "
                            "CUDA_DEVICE_SM_LIMIT, also with _0 to _%d, CUDA_DEVICE_MEMORY_SHARED_"
                            "CACHE, GPU_CORE_UTILIZATION_POLICY)", line, p,
                            VGPU_REGION_MAX_DEVICES - 1);
            if (s->count == VGPU_SETTINGS_MAX_ENTRIES)
                return fail(s, "more than %d entries (line %d)", VGPU_SETTINGS_MAX_ENTRIES, line);
            s->names[s->count] = p;
            s->values[s->count++] = eq + 1;
        }
        if (end == NULL)
            break;
        p = end + 1;
    }
    return 0;
}

/* Up to size bytes of fd from its start; the count, or -1 (errno set). */
static ssize_t read_all(int fd, char *buf, size_t size)
{
    size_t done = 0;
    while (done < size) {
        ssize_t n = pread(fd, buf + done, size - done, (off_t)done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        if (n == 0)
            break;
        done += (size_t)n;
    }
    return (ssize_t)done;
}

int vgpu_settings_load(struct vgpu_settings *s, const char *path)
{
    s->from_file = 0;
    s->count = 0;
    s->why[0] = '\0';
    /* O_NOFOLLOW: the plugin mounts a regular file; a link is someone else's. O_NONBLOCK: a
     * FIFO must not hang the process. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
        if (errno == ENOENT || errno == ENOTDIR)
            return 1;
        return fail(s, "cannot open it: %s", errno == ELOOP ? "a symbolic link" : strerror(errno));
    }
    struct stat st;
    int rc = -1;
    if (fstat(fd, &st) != 0)
        fail(s, "cannot stat it: %s", strerror(errno));
    else if (!S_ISREG(st.st_mode))
        fail(s, "not a regular file");
    else if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0)
        fail(s, "writable by group or others (the device plugin writes it 0644)");
    else {
        ssize_t size = read_all(fd, s->text, VGPU_SETTINGS_MAX_BYTES + 1);
        if (size < 0)
            fail(s, "cannot read it: %s", strerror(errno));
        else if (size > VGPU_SETTINGS_MAX_BYTES)
            fail(s, "larger than %d bytes", VGPU_SETTINGS_MAX_BYTES);
        else {
            s->text[size] = '\0';
            rc = parse(s, (size_t)size);
        }
    }
    close(fd);
    const char *required = rc == 0 ? entry(s, required_name) : NULL;
    if (rc == 0 && required == NULL)
        rc = fail(s, "it does not set %s (the device plugin always writes it: the file is empty or "
                  "cut short)", required_name);
    else if (rc == 0 && required[0] == '\0')
        rc = fail(s, "%s is empty (the device plugin always names the container's region)",
                  required_name);
    if (rc != 0) {
        s->count = 0;
        return -1;
    }
    s->from_file = 1;
    s->owner_uid = (unsigned)st.st_uid;
    return 0;
}

const char *vgpu_settings_lookup(const struct vgpu_settings *s, const char *name)
{
    return s->from_file ? entry(s, name) : secure_getenv(name);
}

/* name (len bytes) is a governed variable: one of the names, or NAME_<digits> where marked. */
static int governed(const char *name, size_t len)
{
    int device;
    return governed_as(name, len, &device) != 0;
}

/* Says which of the environment's limits the file overrides: a user who set one sees why it
 * has no effect. */
static void warn_overridden(const struct vgpu_settings *s)
{
    for (char **e = environ; e != NULL && *e != NULL; e++) {
        const char *eq = strchr(*e, '=');
        if (eq == NULL || !governed(*e, (size_t)(eq - *e)))
            continue;
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)(eq - *e), *e);
        const char *value = vgpu_settings_lookup(s, name);
        if (value == NULL)
            vgpu_log(VGPU_LOG_WARN, "%s ignored: the device plugin's settings file %s governs this "
                     "container and does not set %s", *e, vgpu_settings_path, name);
        else if (strcmp(value, eq + 1) != 0)
            vgpu_log(VGPU_LOG_WARN, "%s ignored: the device plugin's settings file %s governs this "
                     "container and says %s=%s", *e, vgpu_settings_path, name, value);
    }
}

static struct vgpu_settings process_settings;
static int process_settings_usable;
static pthread_once_t load_once = PTHREAD_ONCE_INIT;

static void load_process_settings(void)
{
    if (vgpu_settings_load(&process_settings, vgpu_settings_path) < 0) {
        vgpu_log(VGPU_LOG_ERROR, "settings file %s: %s; CUDA is refused in this process",
                 vgpu_settings_path, process_settings.why);
        return;
    }
    if (process_settings.from_file)
        warn_overridden(&process_settings);
    process_settings_usable = 1;
}

const struct vgpu_settings *vgpu_settings(void)
{
    pthread_once(&load_once, load_process_settings);
    return process_settings_usable ? &process_settings : NULL;
}

const char *vgpu_setting(const char *name)
{
    const struct vgpu_settings *s = vgpu_settings();
    return s != NULL ? vgpu_settings_lookup(s, name) : NULL;
}
