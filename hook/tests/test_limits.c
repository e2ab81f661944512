/* test_limits.c - the limit syntax, table-driven: valid forms, and invalid ones that must be
 * rejected (HAMi-core read "1Gi" as 1 byte and "010g" as octal 8 GiB). */
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "limits.h"

static const uint64_t MiB = UINT64_C(1) << 20, GiB = UINT64_C(1) << 30;

static void memory_forms(void)
{
    static const struct { const char *text; uint64_t bytes; } valid[] = {
        {"3000m", 3000 * (UINT64_C(1) << 20)}, {"4g", 4 * (UINT64_C(1) << 30)},
        {"4G", 4 * (UINT64_C(1) << 30)}, {"4Gi", 4 * (UINT64_C(1) << 30)},
        {"4GiB", 4 * (UINT64_C(1) << 30)}, {"4GB", 4 * (UINT64_C(1) << 30)},
        {"512M", 512 * (UINT64_C(1) << 20)}, {"512Mi", 512 * (UINT64_C(1) << 20)},
        {"1k", 1024}, {"1K", 1024}, {"1048576", 1048576}, {"0", 0},
        {"010g", 10 * (UINT64_C(1) << 30)}, {"08G", 8 * (UINT64_C(1) << 30)},
        {"1.5g", 3 * (UINT64_C(1) << 29)}, {"0.5m", 512 * 1024}, {"0.0g", 0}, {"0.001k", 1},
    };
    for (size_t i = 0; i < sizeof valid / sizeof valid[0]; i++) {
        uint64_t got = 0;
        const char *why = NULL;
        int rc = vgpu_parse_memory(valid[i].text, &got, &why);
        check(rc == 0 && got == valid[i].bytes, "memory '%s' = %llu bytes (got rc %d, %llu)",
              valid[i].text, (unsigned long long)valid[i].bytes, rc, (unsigned long long)got);
    }
    static const char *const invalid[] = {
        "", "g", "-1", "0x10G", "4T", "50%", " 4g", "4g ", "1.5", "1.g", ".5g", "4gg", "4Gib",
        "1e9", "99999999999999999999", "17179869184g", "3000 m", "+4g",
        /* Under a byte: 0, no cap, is not what was asked for. */
        "0.0001k", "0.0000000001g",
    };
    for (size_t i = 0; i < sizeof invalid / sizeof invalid[0]; i++) {
        uint64_t got = 12345;
        const char *why = NULL;
        int rc = vgpu_parse_memory(invalid[i], &got, &why);
        check(rc == -1 && got == 12345 && why != NULL, "memory '%s' rejected (%s)", invalid[i],
              why ? why : "no reason");
    }
    uint64_t got = 0;
    const char *why = "";
    check(vgpu_parse_memory("99999999999999999999", &got, &why) == -1 &&
              strcmp(why, "value too large") == 0,
          "20 digits are too large, and said so (%s)", why);
    check(vgpu_parse_memory("0.0001k", &got, &why) == -1 && strstr(why, "under one byte") != NULL,
          "a fraction under a byte says so (%s)", why);
}

static void percent_forms(void)
{
    static const struct { const char *text; uint32_t pct; } valid[] = {
        {"0", 0}, {"30", 30}, {"100", 100}, {"007", 7},
    };
    for (size_t i = 0; i < sizeof valid / sizeof valid[0]; i++) {
        uint32_t got = 999;
        const char *why = NULL;
        check(vgpu_parse_percent(valid[i].text, &got, &why) == 0 && got == valid[i].pct,
              "percent '%s' = %u", valid[i].text, valid[i].pct);
    }
    static const char *const invalid[] = {"", "101", "-1", "30%", "3.5", "50k", "1000000000000"};
    for (size_t i = 0; i < sizeof invalid / sizeof invalid[0]; i++) {
        uint32_t got = 999;
        const char *why = NULL;
        check(vgpu_parse_percent(invalid[i], &got, &why) == -1 && got == 999,
              "percent '%s' rejected (%s)", invalid[i], why ? why : "no reason");
    }
}

/* A fake environment for vgpu_limits_read. */
static const char *const *env_table;

static const char *table_getenv(const char *name)
{
    for (const char *const *e = env_table; *e != NULL; e += 2)
        if (strcmp(e[0], name) == 0)
            return e[1];
    return NULL;
}

static void environment(void)
{
    static const char *const env[] = {
        "CUDA_DEVICE_MEMORY_LIMIT", "4g",
        "CUDA_DEVICE_MEMORY_LIMIT_1", "1000m",
        "CUDA_DEVICE_MEMORY_LIMIT_2", "1Gx",
        "CUDA_DEVICE_SM_LIMIT", "30",
        "CUDA_DEVICE_SM_LIMIT_1", "100",
        "CUDA_DEVICE_SM_LIMIT_2", "150",
        NULL,
    };
    env_table = env;
    struct vgpu_limits limits;
    capture_begin();
    int rejected = vgpu_limits_read(&limits, table_getenv, 0);
    const char *log = capture_end();
    check(rejected == 2, "two values rejected, and counted (%d)", rejected);
    check(limits.memory_bytes[0] == 4 * GiB, "global memory limit applies to device 0");
    check(limits.memory_bytes[1] == 1000 * MiB, "CUDA_DEVICE_MEMORY_LIMIT_1 overrides the global");
    check(limits.memory_bytes[2] == 4 * GiB, "an invalid per-device value falls back to global");
    check(limits.memory_bytes[15] == 4 * GiB, "global limit reaches device 15");
    check(strstr(log, "CUDA_DEVICE_MEMORY_LIMIT_2='1Gx' rejected") != NULL,
          "the rejection is logged with the variable name: %s", log);
    check(limits.sm_percent[0] == 30, "SM limit 30%% on device 0");
    check(limits.sm_percent[1] == 0, "SM limit 100%% means no limit");
    check(limits.sm_percent[2] == 30 && strstr(log, "CUDA_DEVICE_SM_LIMIT_2='150'") != NULL,
          "an SM limit above 100 is rejected and logged");

    static const char *const disabled[] = {
        "CUDA_DEVICE_SM_LIMIT", "30", "GPU_CORE_UTILIZATION_POLICY", "DISABLE", NULL,
    };
    env_table = disabled;
    check(vgpu_limits_read(&limits, table_getenv, 0) == 0, "nothing rejected");
    check(limits.sm_percent[0] == 0, "GPU_CORE_UTILIZATION_POLICY=DISABLE turns the SM limit off");
    check(limits.memory_bytes[0] == 0, "no memory variable means no cap");

    static const char *const empty[] = {"CUDA_DEVICE_MEMORY_LIMIT", "", NULL};
    env_table = empty;
    vgpu_limits_read(&limits, table_getenv, 0);
    check(limits.memory_bytes[0] == 0, "an empty value in the environment means no cap");
    /* The plugin's settings file never has one: there it would be a limit lost. */
    static const char *const empty_one[] = {"CUDA_DEVICE_MEMORY_LIMIT_0", "", NULL};
    env_table = empty_one;
    capture_begin();
    rejected = vgpu_limits_read(&limits, table_getenv, 1);
    log = capture_end();
    check(rejected == 1 && strstr(log, "CUDA_DEVICE_MEMORY_LIMIT_0='' rejected: empty") != NULL,
          "in a settings file it is rejected, and logged: %s", log);
    /* Nor a memory limit of 0 (no cap on that GPU): the plugin refuses a 0 MiB share. */
    static const char *const zero[] = {"CUDA_DEVICE_MEMORY_LIMIT", "4g",
                                       "CUDA_DEVICE_MEMORY_LIMIT_1", "0m",
                                       "CUDA_DEVICE_SM_LIMIT", "0", NULL};
    env_table = zero;
    capture_begin();
    rejected = vgpu_limits_read(&limits, table_getenv, 1);
    log = capture_end();
    check(rejected == 1 && strstr(log, "CUDA_DEVICE_MEMORY_LIMIT_1='0m' rejected: 0 means no cap") !=
              NULL, "in a settings file a memory limit of 0 is rejected, and logged: %s", log);
    check(limits.sm_percent[0] == 0, "an SM limit of 0 (none) is read from a settings file");
    capture_begin();
    rejected = vgpu_limits_read(&limits, table_getenv, 0);
    capture_end();
    check(rejected == 0 && limits.memory_bytes[1] == 0 && limits.memory_bytes[0] == 4 * GiB,
          "in the environment 0 is no cap, as HAMi-core reads it");
}

int main(void)
{
    memory_forms();
    percent_forms();
    environment();
    return check_done("test_limits");
}
