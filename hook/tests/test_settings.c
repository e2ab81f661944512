/* test_settings.c - unit tests of settings.c: the device plugin's settings file is read strictly,
 * refused with a reason when it cannot be trusted, and replaces the environment entirely. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "settings.h"

static char dir[] = "/tmp/vgpu-settings.XXXXXX";
static char path[256];

/* Writes text to a fresh file at path with mode. */
static void write_file(const char *text, size_t len, mode_t mode)
{
    unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0 || write(fd, text, len) != (ssize_t)len) {
        perror("test file");
        exit(2);
    }
    fchmod(fd, mode);
    close(fd);
}

static int load_text(struct vgpu_settings *s, const char *text)
{
    write_file(text, strlen(text), 0644);
    return vgpu_settings_load(s, path);
}

static void reads_entries(void)
{
    static struct vgpu_settings s;
    int rc = load_text(&s, "# written by vgpu-device-plugin\n\nCUDA_DEVICE_MEMORY_LIMIT_0=1024m\n"
                           "CUDA_DEVICE_SM_LIMIT=30\nGPU_CORE_UTILIZATION_POLICY=\n"
                           "CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/vgpu/a=b.cache");
    check(rc == 0 && s.from_file == 1 && s.count == 4, "four entries read (rc %d, count %d: %s)",
          rc, s.count, s.why);
    check(strcmp(vgpu_settings_lookup(&s, "CUDA_DEVICE_MEMORY_LIMIT_0"), "1024m") == 0,
          "a value is the rest of the line");
    check(strcmp(vgpu_settings_lookup(&s, "CUDA_DEVICE_MEMORY_SHARED_CACHE"), "/tmp/vgpu/a=b.cache") == 0,
          "a value may hold '=' and needs no final newline");
    static struct vgpu_settings all;
    check(load_text(&all, "CUDA_DEVICE_MEMORY_LIMIT_0=1m\nCUDA_DEVICE_MEMORY_LIMIT_9=1m\n"
                          "CUDA_DEVICE_MEMORY_LIMIT_10=1m\nCUDA_DEVICE_SM_LIMIT_15=30\n"
                          "NVIDIA_VISIBLE_DEVICES=GPU-1\nCUDA_VISIBLE_DEVICES=0\n"
                          "CUDA_DEVICE_ORDER=PCI_BUS_ID\nCUDA_DEVICE_MAX_CONNECTIONS=8\n"
                          "CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/x\n") == 0 && all.count == 9,
          "devices 0 to 15 and names not of the library's kind are read (%s)", all.why);
    check(strcmp(vgpu_settings_lookup(&s, "GPU_CORE_UTILIZATION_POLICY"), "") == 0,
          "an empty value is a value");

    /* The file replaces the environment: what it does not set is unset, whatever the
     * environment says. */
    setenv("CUDA_DEVICE_MEMORY_LIMIT", "80g", 1);
    setenv("CUDA_DEVICE_MEMORY_LIMIT_0", "80g", 1);
    check(vgpu_settings_lookup(&s, "CUDA_DEVICE_MEMORY_LIMIT") == NULL,
          "a variable the file does not set is unset, though the environment sets it");
    check(strcmp(vgpu_settings_lookup(&s, "CUDA_DEVICE_MEMORY_LIMIT_0"), "1024m") == 0,
          "the file's value wins over the environment's");

    static struct vgpu_settings none;
    snprintf(path, sizeof path, "%s/absent/vgpu.env", dir);
    check(vgpu_settings_load(&none, path) == 1 && none.from_file == 0,
          "no file: the environment applies");
    check(strcmp(vgpu_settings_lookup(&none, "CUDA_DEVICE_MEMORY_LIMIT_0"), "80g") == 0,
          "without a file a lookup reads the environment");
    snprintf(path, sizeof path, "%s/vgpu.env", dir);
    unsetenv("CUDA_DEVICE_MEMORY_LIMIT");
    unsetenv("CUDA_DEVICE_MEMORY_LIMIT_0");
}

/* Each malformed file is refused with a reason, and a refused load leaves no entries. */
static void refuses_bad_text(void)
{
    static const struct {
        const char *text;
        const char *why;
    } cases[] = {
        {"CUDA_DEVICE_SM_LIMIT=30\nno equals sign\n", "line 2 is not NAME=VALUE"},
        {"=30\n", "line 1 is not NAME=VALUE"},
        {"cuda_device_sm_limit=30\n", "line 1 is not NAME=VALUE"},
        {"1ABC=30\n", "line 1 is not NAME=VALUE"},
        {"CUDA DEVICE=30\n", "line 1 is not NAME=VALUE"},
        {"CUDA_DEVICE_SM_LIMIT=30\nCUDA_DEVICE_SM_LIMIT=90\n", "CUDA_DEVICE_SM_LIMIT given twice (line 2)"},
        /* Names of the library's kind that it does not read: their limits would be left off. */
        {"CUDA_DEVICE_SM_LIMT_0=30\n", "line 1: no setting CUDA_DEVICE_SM_LIMT_0 (it reads"},
        {"CUDA_DEVICE_MEMORY_LIMIT_16=1g\n", "line 1: no setting CUDA_DEVICE_MEMORY_LIMIT_16"},
        {"CUDA_DEVICE_MEMORY_LIMIT_00=1g\n", "line 1: no setting CUDA_DEVICE_MEMORY_LIMIT_00"},
        {"CUDA_DEVICE_SM_LIMIT_01=30\n", "line 1: no setting CUDA_DEVICE_SM_LIMIT_01"},
        {"CUDA_DEVICE_SM_LIMIT_99999999999999999999=30\n", "line 1: no setting"},
        {"CUDA_DEVICE_MEMORY_LIMIT_=1g\n", "line 1: no setting CUDA_DEVICE_MEMORY_LIMIT_ "},
        {"CUDA_DEVICE_MEMORY_SHARED_CACHE_0=/tmp/x\n", "no setting CUDA_DEVICE_MEMORY_SHARED_CACHE_0"},
        {"GPU_CORE_UTILIZATION_POLICY_0=disable\n", "no setting GPU_CORE_UTILIZATION_POLICY_0"},
        {"CUDA_DEVICE_MEMORY_SHARED_CACHE=\n", "CUDA_DEVICE_MEMORY_SHARED_CACHE is empty"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        static struct vgpu_settings s;
        int rc = load_text(&s, cases[i].text);
        check(rc == -1 && strstr(s.why, cases[i].why) != NULL && s.count == 0 && !s.from_file,
              "refused: %s", s.why);
    }
    static struct vgpu_settings s;
    write_file("A=1\0B=2\n", 8, 0644);
    check(vgpu_settings_load(&s, path) == -1 && strstr(s.why, "NUL byte") != NULL,
          "a NUL byte is refused: %s", s.why);

    static char many[VGPU_SETTINGS_MAX_BYTES];
    size_t used = 0;
    for (int i = 0; i <= VGPU_SETTINGS_MAX_ENTRIES; i++)
        used += (size_t)snprintf(many + used, sizeof many - used, "N%d=1\n", i);
    write_file(many, used, 0644);
    check(vgpu_settings_load(&s, path) == -1 && strstr(s.why, "more than 64 entries") != NULL,
          "65 entries are refused: %s", s.why);

    static char big[VGPU_SETTINGS_MAX_BYTES + 2];
    memset(big, '#', sizeof big);
    static const char entry[] = "CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/vgpu/r.cache\n";
    memcpy(big, entry, strlen(entry));
    write_file(big, sizeof big, 0644);
    check(vgpu_settings_load(&s, path) == -1 && strstr(s.why, "larger than 4096 bytes") != NULL,
          "a file over 4096 bytes is refused: %s", s.why);
    write_file(big, VGPU_SETTINGS_MAX_BYTES, 0644);
    check(vgpu_settings_load(&s, path) == 0 && s.count == 1, "4096 bytes are read (%s)", s.why);

    /* What a crash between create and write, or a cut-short copy, leaves. */
    static const char *const incomplete[] = {"", "# vgpu-device-plugin\n", "CUDA_DEVICE_SM_LIMIT=30\n"};
    for (size_t i = 0; i < sizeof incomplete / sizeof incomplete[0]; i++)
        check(load_text(&s, incomplete[i]) == -1 && !s.from_file &&
                  strstr(s.why, "does not set CUDA_DEVICE_MEMORY_SHARED_CACHE") != NULL,
              "an incomplete file ('%s') is refused: %s", incomplete[i], s.why);
}

/* A file someone other than its owner could have written, or that is not a file, is refused. */
static void refuses_untrusted_files(void)
{
    static struct vgpu_settings s;
    static const char complete[] = "CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/vgpu/r.cache\n";
    write_file(complete, strlen(complete), 0666);
    check(vgpu_settings_load(&s, path) == -1 && strstr(s.why, "writable by group or others") != NULL,
          "a world-writable file is refused: %s", s.why);
    write_file(complete, strlen(complete), 0664);
    check(vgpu_settings_load(&s, path) == -1 && strstr(s.why, "writable by group or others") != NULL,
          "a group-writable file is refused: %s", s.why);
    write_file(complete, strlen(complete), 0400);
    check(vgpu_settings_load(&s, path) == 0 && s.count == 1 && s.owner_uid == geteuid(),
          "a read-only file is read, and its owner noted (%u)", s.owner_uid);

    char link[300];
    snprintf(link, sizeof link, "%s/link.env", dir);
    check(symlink(path, link) == 0 && vgpu_settings_load(&s, link) == -1 &&
              strstr(s.why, "a symbolic link") != NULL,
          "a symbolic link is refused: %s", s.why);
    unlink(link);

    char fifo[300];
    snprintf(fifo, sizeof fifo, "%s/fifo.env", dir);
    check(mkfifo(fifo, 0644) == 0 && vgpu_settings_load(&s, fifo) == -1 &&
              strstr(s.why, "not a regular file") != NULL,
          "a FIFO is refused without blocking: %s", s.why);
    unlink(fifo);

    char folder[300];
    snprintf(folder, sizeof folder, "%s/folder.env", dir);
    check(mkdir(folder, 0755) == 0 && vgpu_settings_load(&s, folder) == -1 &&
              strstr(s.why, "not a regular file") != NULL,
          "a folder is refused: %s", s.why);
    rmdir(folder);
}

int main(void)
{
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 2;
    }
    snprintf(path, sizeof path, "%s/vgpu.env", dir);
    reads_entries();
    refuses_bad_text();
    refuses_untrusted_files();
    unlink(path);
    rmdir(dir);
    return check_done("test_settings");
}
