/* util.h - small helpers shared by the library's modules: acquire/release loads and stores of
 * 64-bit words, a saturating product, and the wall and monotonic clocks in nanoseconds. */
#ifndef VGPU_UTIL_H
#define VGPU_UTIL_H

#include <stdint.h>
#include <time.h>

static inline uint64_t load64(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void store64(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

/* a x b, at most UINT64_MAX. */
static inline uint64_t mul_saturated(uint64_t a, uint64_t b)
{
    return b != 0 && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

static inline uint64_t unix_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline uint64_t monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#endif
