/* faults.h - the test programs' handle on faults.so (tests/faults.c), which fails calls of
 * libvgpu's on demand when it is preloaded. Test-only; every function is static. */
#ifndef VGPU_FAULTS_H
#define VGPU_FAULTS_H

#include <dlfcn.h>

#include "check.h"

typedef int (*faults_set_fn)(const char *what, int on);

/* faults.so's faults_set, or NULL where it is not preloaded: skipped under the sanitizers
 * (their interceptors come first), a failure otherwise. */
__attribute__((unused)) static faults_set_fn faults_control(void)
{
    faults_set_fn set = (faults_set_fn)dlsym(RTLD_DEFAULT, "faults_set");
    const char *sanitized = getenv("VGPU_SANITIZED");
    if (set == NULL && sanitized != NULL && strcmp(sanitized, "1") == 0)
        check(1, "SKIP: faults.so is not preloaded (the sanitizers' interceptors come first)");
    else if (set == NULL)
        check(0, "faults.so is preloaded (tests/run.sh preloads it after libvgpu)");
    return set;
}

#endif
