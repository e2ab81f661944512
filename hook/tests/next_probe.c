/* next_probe.c - built twice (liba, libb) to test that dlsym(RTLD_NEXT) under libvgpu stays
 * relative to the library that calls it. */
#include <dlfcn.h>
#include <stddef.h>

#define PASTE2(a, b) a##b
#define PASTE(a, b) PASTE2(a, b)

const char *probe(void);
const char *PASTE(next_probe_from_, PROBE_ID)(void);

__attribute__((visibility("default"))) const char *probe(void) { return PROBE_NAME; }

/* What the next library after this one says its probe is. */
__attribute__((visibility("default"))) const char *PASTE(next_probe_from_, PROBE_ID)(void)
{
    const char *(*next)(void) = (const char *(*)(void))dlsym(RTLD_NEXT, "probe");
    return next != NULL ? next() : "none";
}
