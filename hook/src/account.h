/* account.h - the SM limiter's GPU-time account: what a container used of a GPU, as measured,
 * against its SM limit. It is the container's, kept in its region's device record
 * (sm_credit_ns, sm_charged_us) and charged by whichever of its processes reads a sample first,
 * so that every process of the container sees the same account: a process that starts later,
 * or whose sibling keeps the container busy, is neither let past it nor held back alone. */
#ifndef VGPU_ACCOUNT_H
#define VGPU_ACCOUNT_H

#include <stdint.h>

/* One reading of the container's share of a GPU. */
struct vgpu_reading {
    double util;                 /* percent of the GPU */
    unsigned long long stamp_us; /* CLOCK_REALTIME us of the end of the time it describes */
    unsigned long long since_us; /* ... of its start as asked of NVML (0: one sample period) */
    int sampled;                 /* NVML's samples (else the time since the last charge) */
};

/* Seconds of the GPU's time a sampled reading describes: NVML averages a process's samples
 * since the time asked (nvml.h, "utilization since"), a period that began before it whole, so
 * at least one sample period (period_s). This takes one sample per process for all that time,
 * as the fake does and the H200's readings suggest (nvml.c keeps the latest, should a driver
 * give several: then one period's figure would be charged for all of them). */
double vgpu_reading_span(const struct vgpu_reading *reading, double period_s);

/* Charges a reading to the account of CUDA device dev (limit: its SM limit, percent), unless
 * a reading as new was charged already; period_s is NVML's sample period, now_us the clock.
 * The credit is capped at cap_s. A charge stamped past now_us + the clock slack is taken for a
 * clock stepped back (or a bad write) and replaced. Returns 1 when this call charged it. */
int vgpu_account_charge(int dev, uint32_t limit, const struct vgpu_reading *reading,
                        double period_s, double cap_s, unsigned long long now_us);

/* The account's credit, seconds of the whole GPU (negative: over the limit); 0 with none. */
double vgpu_account_credit(int dev);

/* Seconds from the account's last charge to now_us; -1 when it was never charged, there is
 * no account, or the charge is stamped past now_us + the clock slack (see above). */
double vgpu_account_age(int dev, unsigned long long now_us);

/* Takes seconds of the whole GPU off the account ahead of the charge that will measure them
 * (throttle.c's prepayment). */
void vgpu_account_prepay(int dev, double seconds);

/* Gives back seconds prepaid, the credit capped at cap_s. */
void vgpu_account_refund(int dev, double seconds, double cap_s);

/* The time (CLOCK_REALTIME us) up to which the account is charged: 0 when never, or when the
 * charge is stamped past now_us + the clock slack. */
unsigned long long vgpu_account_charged_to(int dev, unsigned long long now_us);

/* The credit as of now_us (control.h, vgpu_control_balance); a charge stamped past the clock
 * tells nothing: the credit then counts as a long gap's (no hold). */
double vgpu_account_balance(int dev, uint32_t limit, unsigned long long now_us);

#endif
