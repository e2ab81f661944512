/* settings.h - where the library's settings (limits, region path) come from.
 *
 * The device plugin writes a container's settings into a file it mounts read-only at
 * vgpu_settings_path. Where that file exists it is the only source: a process can neither drop
 * it (env -i, su -, a scrubbed subprocess) nor change it (the pod's own env, export). Where it
 * does not (HAMi-core's plugin, a program run by hand) the environment is, as HAMi-core's
 * contract has it. LIBCUDA_LOG_LEVEL always comes from the environment (log.c). */
#ifndef VGPU_SETTINGS_H
#define VGPU_SETTINGS_H

enum {
    VGPU_SETTINGS_MAX_BYTES = 4096, /* the plugin writes a few hundred */
    VGPU_SETTINGS_MAX_ENTRIES = 64,
};

/* "/usr/local/vgpu/vgpu.env", beside libvgpu.so (deviceplugin/vgpu_deviceplugin/allocate.py). */
extern const char vgpu_settings_path[];

struct vgpu_settings {
    int from_file; /* 1: the file's entries and nothing else; 0: the environment */
    unsigned owner_uid; /* the file's owner (from_file only) */
    int count;
    const char *names[VGPU_SETTINGS_MAX_ENTRIES];
    const char *values[VGPU_SETTINGS_MAX_ENTRIES];
    char text[VGPU_SETTINGS_MAX_BYTES + 1]; /* the file; names and values point into it */
    char why[256];                          /* set when loading fails */
};

/* Loads path into s: 0 (s->from_file = 1), 1 when there is no such file (s->from_file = 0), or
 * -1 with s->why naming the problem: not a regular file or a symbolic link, writable by group or
 * others, over VGPU_SETTINGS_MAX_BYTES, unreadable, a line that is not NAME=VALUE (NAME
 * [A-Z_][A-Z0-9_]*, each at most once; blank lines and lines starting with # are skipped), or no
 * CUDA_DEVICE_MEMORY_SHARED_CACHE (the plugin always writes it: an empty or cut-short file). */
int vgpu_settings_load(struct vgpu_settings *s, const char *path);

/* The value of name: the file's entry (NULL when it has none) when loaded from a file, else
 * secure_getenv(name). */
const char *vgpu_settings_lookup(const struct vgpu_settings *s, const char *name);

/* The process's settings, loaded from vgpu_settings_path once (thread-safe). NULL when the file
 * exists but cannot be used (logged once): the process must refuse CUDA. With the file, one
 * warning per environment variable the file overrides. */
const struct vgpu_settings *vgpu_settings(void);

/* vgpu_settings_lookup on the process's settings; NULL when they cannot be used. */
const char *vgpu_setting(const char *name);

#endif
