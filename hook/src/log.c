/* log.c - stderr logging. The level is read once; a bad value falls back to the default. */
#ifndef _GNU_SOURCE /* the unit tests define it on the command line */
#define _GNU_SOURCE
#endif
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int configured_level(void)
{
    static int level; /* 0 = not read yet; a benign race: every reader computes the same value */
    if (level == 0) {
        const char *text = secure_getenv("LIBCUDA_LOG_LEVEL");
        int parsed = VGPU_LOG_WARN;
        if (text != NULL && text[0] >= '0' && text[0] <= '4' && text[1] == '\0')
            parsed = text[0] == '0' ? VGPU_LOG_ERROR : text[0] - '0';
        level = parsed;
    }
    return level;
}

/* This thread's deferral (log.h): its depth, and the lines kept meanwhile. */
static _Thread_local int deferring;
enum { COUNT_LINE_BYTES = 96 }; /* the "(N more lines not shown)" line */
static _Thread_local char kept[VGPU_LOG_DEFERRED_BYTES + COUNT_LINE_BYTES];
static _Thread_local size_t kept_len;
static _Thread_local unsigned left_out;

static void keep(const char *line, size_t len)
{
    if (kept_len + len <= VGPU_LOG_DEFERRED_BYTES) {
        memcpy(kept + kept_len, line, len);
        kept_len += len;
    } else {
        left_out++;
    }
}

static const char *level_name(enum vgpu_log_level level)
{
    switch (level) {
    case VGPU_LOG_ERROR: return "ERROR";
    case VGPU_LOG_WARN: return "WARN";
    case VGPU_LOG_INFO: return "INFO";
    default: return "DEBUG";
    }
}

void vgpu_log(enum vgpu_log_level level, const char *fmt, ...)
{
    if ((int)level > configured_level())
        return;
    char line[512];
    int head = snprintf(line, sizeof line, "[vgpu %s pid %d] ", level_name(level), (int)getpid());
    va_list args;
    va_start(args, fmt);
    int body = vsnprintf(line + head, sizeof line - (size_t)head - 1, fmt, args);
    va_end(args);
    size_t len = (size_t)head + (body < 0 ? 0 : (size_t)body);
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    line[len++] = '\n';
    if (deferring > 0) {
        keep(line, len);
        return;
    }
    ssize_t ignored = write(STDERR_FILENO, line, len); /* nothing useful to do on failure */
    (void)ignored;
}

void vgpu_log_defer_begin(void) { deferring++; }

void vgpu_log_defer_end(void)
{
    if (--deferring > 0 || (kept_len == 0 && left_out == 0))
        return;
    if (left_out > 0) {
        char more[COUNT_LINE_BYTES];
        int n = snprintf(more, sizeof more, "[vgpu WARN pid %d] (%u more lines not shown)\n",
                         (int)getpid(), left_out);
        if (n > 0 && kept_len + (size_t)n <= sizeof kept) {
            memcpy(kept + kept_len, more, (size_t)n);
            kept_len += (size_t)n;
        }
    }
    ssize_t ignored = write(STDERR_FILENO, kept, kept_len);
    (void)ignored;
    kept_len = 0;
    left_out = 0;
}
