/* account.c - the container's GPU-time account in its region (account.h). */
#include "account.h"

#include "control.h"
#include "region.h"

/* A gap longer than this (a clock step, a container idle for long) counts as this much: the
 * credit is capped far below it anyway. */
static const double max_gap_s = 10.0;
/* What a reading that is not one sample period covers at most (the whole GPU's utilisation
 * describes its own latest period, about as long). */
static const double max_covered_s = 0.5;
/* How far past the clock a charge may be stamped (NVML's stamps and ours differ a little). */
static const unsigned long long clock_slack_us = 2000000;

/* Seconds as the account's ns, saturated (a cast of a double out of range is undefined). */
static int64_t to_ns(double seconds)
{
    double ns = seconds * 1e9;
    return ns >= 9e18 ? INT64_C(9000000000000000000) : ns <= -9e18 ? -INT64_C(9000000000000000000)
                                                                    : (int64_t)ns;
}

static int from_the_future(uint64_t stamp_us, unsigned long long now_us)
{
    return stamp_us > now_us + clock_slack_us;
}

int vgpu_account_charge(int dev, uint32_t limit, const struct vgpu_reading *reading,
                        double period_s, double cap_s, unsigned long long now_us)
{
    struct vgpu_region_device *d = vgpu_region_sm_account(dev);
    if (d == NULL || from_the_future(reading->stamp_us, now_us))
        return 0;
    uint64_t prev = __atomic_load_n(&d->sm_charged_us, __ATOMIC_ACQUIRE);
    /* A charge from the future would keep every reading out, the account frozen as it was. */
    int restart = from_the_future(prev, now_us);
    /* Every process of the container reads the same samples: the first to charge one takes it. */
    if ((reading->stamp_us <= prev && !restart) ||
        !__atomic_compare_exchange_n(&d->sm_charged_us, &prev, reading->stamp_us, 0,
                                     __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return 0;
    double gap = prev == 0 || restart ? period_s : (double)(reading->stamp_us - prev) / 1e6;
    if (gap > max_gap_s)
        gap = max_gap_s;
    /* What the reading describes and no charge has yet: a reading late by several periods
     * (NVML slow) is their average, and charged as one period it let a process at a limit
     * of 50 keep the GPU 91.2 % busy (test_throttle burst, FAKE_NVML_SLOW_MS=200). */
    double most = reading->sampled ? vgpu_reading_span(reading, period_s) : max_covered_s;
    double covered = gap < most ? gap : most;
    int64_t was = __atomic_load_n(&d->sm_credit_ns, __ATOMIC_ACQUIRE), next;
    do {
        next = to_ns(vgpu_control_credit((double)was / 1e9, (double)limit, reading->util, gap,
                                         covered, cap_s));
    } while (!__atomic_compare_exchange_n(&d->sm_credit_ns, &was, next, 1, __ATOMIC_ACQ_REL,
                                          __ATOMIC_ACQUIRE));
    return 1;
}

double vgpu_reading_span(const struct vgpu_reading *reading, double period_s)
{
    double span = reading->since_us != 0 && reading->stamp_us > reading->since_us
                      ? (double)(reading->stamp_us - reading->since_us) / 1e6
                      : 0.0;
    return span < period_s ? period_s : span > max_gap_s ? max_gap_s : span;
}

double vgpu_account_credit(int dev)
{
    struct vgpu_region_device *d = vgpu_region_sm_account(dev);
    return d != NULL ? (double)__atomic_load_n(&d->sm_credit_ns, __ATOMIC_ACQUIRE) / 1e9 : 0.0;
}

double vgpu_account_age(int dev, unsigned long long now_us)
{
    struct vgpu_region_device *d = vgpu_region_sm_account(dev);
    uint64_t charged = d != NULL ? __atomic_load_n(&d->sm_charged_us, __ATOMIC_ACQUIRE) : 0;
    if (charged == 0 || from_the_future(charged, now_us))
        return -1.0;
    return now_us > charged ? (double)(now_us - charged) / 1e6 : 0.0;
}

/* Adds seconds to the credit, never above cap_s (a refund) or without a cap (cap_s < 0). */
static void add_credit(struct vgpu_region_device *d, double seconds, double cap_s)
{
    int64_t was = __atomic_load_n(&d->sm_credit_ns, __ATOMIC_ACQUIRE), next;
    do {
        double credit = (double)was / 1e9 + seconds;
        next = to_ns(cap_s >= 0.0 && credit > cap_s ? cap_s : credit);
    } while (!__atomic_compare_exchange_n(&d->sm_credit_ns, &was, next, 1, __ATOMIC_ACQ_REL,
                                          __ATOMIC_ACQUIRE));
}

void vgpu_account_prepay(int dev, double seconds)
{
    struct vgpu_region_device *d = vgpu_region_sm_account(dev);
    if (d != NULL && seconds > 0.0)
        add_credit(d, -seconds, -1.0);
}

void vgpu_account_refund(int dev, double seconds, double cap_s)
{
    struct vgpu_region_device *d = vgpu_region_sm_account(dev);
    if (d != NULL && seconds > 0.0)
        add_credit(d, seconds, cap_s);
}

unsigned long long vgpu_account_charged_to(int dev, unsigned long long now_us)
{
    struct vgpu_region_device *d = vgpu_region_sm_account(dev);
    uint64_t charged = d != NULL ? __atomic_load_n(&d->sm_charged_us, __ATOMIC_ACQUIRE) : 0;
    return from_the_future(charged, now_us) ? 0 : charged;
}

double vgpu_account_balance(int dev, uint32_t limit, unsigned long long now_us)
{
    struct vgpu_region_device *d = vgpu_region_sm_account(dev);
    uint64_t charged = d != NULL ? __atomic_load_n(&d->sm_charged_us, __ATOMIC_ACQUIRE) : 0;
    double age = charged == 0                       ? 0.0
               : from_the_future(charged, now_us) ? max_gap_s
               : now_us > charged                 ? (double)(now_us - charged) / 1e6
                                                  : 0.0;
    return vgpu_control_balance(vgpu_account_credit(dev), (double)limit, age, max_gap_s);
}
