/* limits.c - parsing of the limit variables. Strict on purpose: HAMi-core's strtoul(base 0)
 * read "1Gi" as 1 byte and "010g" as octal; here anything unexpected is an error. */
#ifndef _GNU_SOURCE /* the unit tests define it on the command line */
#define _GNU_SOURCE
#endif
#include "limits.h"

#include <stdio.h>
#include <stdlib.h>

#include "log.h"

static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* Parses "<digits>" into *value; returns the number of characters used, 0 when there are none,
 * -1 on overflow. */
static int parse_digits(const char *text, uint64_t *value, uint64_t *scale)
{
    uint64_t v = 0, s = 1;
    int n = 0;
    while (is_digit(text[n])) {
        if (v > (UINT64_MAX - 9) / 10 || s > UINT64_MAX / 10)
            return -1;
        v = v * 10 + (uint64_t)(text[n] - '0');
        s *= 10;
        n++;
    }
    *value = v;
    *scale = s;
    return n;
}

/* k/m/g with optional "i", "iB" or "B" after it; returns the shift (10/20/30) or -1. */
static int parse_unit(const char *unit)
{
    int shift;
    switch (unit[0]) {
    case '\0': return 0;
    case 'k': case 'K': shift = 10; break;
    case 'm': case 'M': shift = 20; break;
    case 'g': case 'G': shift = 30; break;
    default: return -1;
    }
    const char *rest = unit + 1;
    if (rest[0] == 'i')
        rest++;
    if (rest[0] == 'B')
        rest++;
    return rest[0] == '\0' ? shift : -1;
}

int vgpu_parse_memory(const char *text, uint64_t *bytes, const char **why)
{
    static const char forms[] = "expected digits with an optional k/m/g unit, e.g. 3000m, 4g, 4Gi";
    uint64_t whole = 0, frac = 0, frac_scale = 1, ignored;
    int n = parse_digits(text, &whole, &ignored);
    if (n <= 0) {
        *why = n < 0 ? "value too large" : text[0] == '\0' ? "empty value" : forms;
        return -1;
    }
    const char *rest = text + n;
    if (rest[0] == '.') {
        int m = parse_digits(rest + 1, &frac, &frac_scale);
        if (m <= 0) {
            *why = m < 0 ? "too many decimals" : forms;
            return -1;
        }
        rest += 1 + m;
    }
    int shift = parse_unit(rest);
    if (shift < 0) {
        *why = forms;
        return -1;
    }
    if (frac_scale > 1 && shift == 0) {
        *why = "a fraction needs a unit (1.5g, not 1.5)";
        return -1;
    }
    if (shift > 0 && whole > (UINT64_MAX >> 1) >> shift) {
        *why = "value too large";
        return -1;
    }
    uint64_t result = whole << shift;
    if (frac_scale > 1)
        result += (uint64_t)(((unsigned __int128)frac << shift) / frac_scale);
    if (result == 0 && (whole != 0 || frac != 0)) {
        /* 0.0001k: 0 bytes would be read as no cap at all. */
        *why = "under one byte (0 would mean no cap)";
        return -1;
    }
    *bytes = result;
    return 0;
}

int vgpu_parse_percent(const char *text, uint32_t *percent, const char **why)
{
    uint64_t value, ignored;
    int n = parse_digits(text, &value, &ignored);
    if (n <= 0 || text[n] != '\0') {
        *why = "expected a whole percentage 0..100, e.g. 30";
        return -1;
    }
    if (value > 100) {
        *why = "a percentage cannot exceed 100";
        return -1;
    }
    *percent = (uint32_t)value;
    return 0;
}

/* Parses variable name into *bytes (a memory limit) or else *percent. Unset or empty (unless
 * from_file) leaves the output as it was; a bad value is logged and leaves it too (the parsers
 * write on success). */
static int read_limit(const char *name, const char *(*getenv_fn)(const char *), uint64_t *bytes,
                      uint32_t *percent, int from_file)
{
    const char *text = getenv_fn(name), *why = "empty";
    if (text == NULL || (text[0] == '\0' && !from_file))
        return 0;
    uint64_t parsed = 0;
    int rc = text[0] == '\0' ? -1
             : bytes != NULL ? vgpu_parse_memory(text, &parsed, &why)
                             : vgpu_parse_percent(text, percent, &why);
    if (rc == 0 && bytes != NULL && parsed == 0 && from_file) {
        /* The plugin refuses a share of 0 MiB (deviceplugin allocate.py): here it is not what it
         * wrote, and would leave the GPU uncapped. */
        why = "0 means no cap, which the device plugin never writes";
        rc = -1;
    }
    if (rc == 0 && bytes != NULL)
        *bytes = parsed;
    if (rc != 0)
        vgpu_log(VGPU_LOG_ERROR, "%s='%s' rejected: %s", name, text, why);
    return rc != 0;
}

static int policy_disables_sm_limit(const char *(*getenv_fn)(const char *))
{
    const char *policy = getenv_fn("GPU_CORE_UTILIZATION_POLICY");
    if (policy == NULL)
        return 0;
    for (const char *p = policy, *d = "disable";; p++, d++) {
        char c = (*p >= 'A' && *p <= 'Z') ? (char)(*p - 'A' + 'a') : *p;
        if (c != *d)
            return 0;
        if (c == '\0')
            return 1;
    }
}

int vgpu_limits_read(struct vgpu_limits *out, const char *(*getenv_fn)(const char *name),
                     int from_file)
{
    uint64_t memory_all = 0;
    uint32_t sm_all = 0;
    int rejected = read_limit("CUDA_DEVICE_MEMORY_LIMIT", getenv_fn, &memory_all, NULL, from_file);
    rejected += read_limit("CUDA_DEVICE_SM_LIMIT", getenv_fn, NULL, &sm_all, from_file);
    int sm_disabled = policy_disables_sm_limit(getenv_fn);
    for (int i = 0; i < VGPU_REGION_MAX_DEVICES; i++) {
        char name[64];
        out->memory_bytes[i] = memory_all;
        snprintf(name, sizeof name, "CUDA_DEVICE_MEMORY_LIMIT_%d", i);
        rejected += read_limit(name, getenv_fn, &out->memory_bytes[i], NULL, from_file);
        out->sm_percent[i] = sm_all;
        snprintf(name, sizeof name, "CUDA_DEVICE_SM_LIMIT_%d", i);
        rejected += read_limit(name, getenv_fn, NULL, &out->sm_percent[i], from_file);
        if (out->sm_percent[i] >= 100 || sm_disabled)
            out->sm_percent[i] = 0;
    }
    return rejected;
}
