/* control.h - the SM limiter's control law, a pure function (unit-tested on its own). */
#ifndef VGPU_CONTROL_H
#define VGPU_CONTROL_H

/* Next refill rate (tokens/s) from the current rate, the limit and the measured utilisation
 * (both percent) and the tokens/s the application actually took. The rate is scaled by
 * sqrt(limit / utilisation), clamped to [0.5, 2]: the step is relative to the current rate, so
 * it never depends on the GPU's SM count (HAMi-core's SMs^2 step does). Demand bounds a raise
 * (twice what was taken), so a process that is not using its budget does not raise its rate
 * (what it banks is the bucket's, 20 ms of its rate, and the account's to bound); a throttled
 * process (its launches waited for tokens: it took what it was given, nothing in a held period)
 * keeps at least its rate, and only it has its step multiplied by balance
 * (vgpu_control_sibling_factor), before that bound, so a raise needs demand to back it. Another
 * keeps at least its rate under its limit, and half of it at its limit or over: demand is over
 * the whole period, idle time included, so it tells what the process asked for, not what its
 * rate allows; cut to twice it, the rate fell tenfold when a burst ended just after a step, and
 * the next burst after idle time got 1.8-19.4 % under a limit of 20 (tests/test_throttle.c,
 * bursts). Never below min_rate. (A period without demand takes no step; one in which a launch
 * waits for tokens and none were taken is stepped by the balance alone: throttle.c, starved.) */
double vgpu_control_next_rate(double rate, double limit, double util, double demand,
                              double min_rate, int throttled, double balance);

/* What a throttled process multiplies its rate by beside a sibling of its container (another
 * process in its region) that runs more than it, from both their shares (percent, averaged over
 * NVML's recent samples): sqrt(sibling / own), at most 2; 1 once own is within a fifth of the
 * sibling's, or the sibling runs less than a point. The rate law alone scales every process of
 * a container by the container's share, so they kept whatever ratio a hold left them at: one
 * sat at 1-2 % beside a sibling that kept the container at its limit. A raise takes the
 * container over its limit, and the rate law then takes it back from all of them in proportion,
 * most from the one that runs most. */
double vgpu_control_sibling_factor(double own, double sibling);

/* The limiter's GPU-time account: the credit, in seconds of the whole GPU, a container has
 * left under its limit. A reading adds the limit's share of the gap since the last one and
 * takes off what the container used: util for the `covered` seconds the reading describes
 * (NVML's sample period; no sample in the rest of the gap means none of the container's
 * processes ran). Never above cap, so an idle container cannot bank a burst. Tokens count
 * blocks, which predict a launch's cost before it runs; the account counts what the launches
 * cost as measured. */
double vgpu_control_credit(double credit, double limit, double util, double gap, double covered,
                           double cap);

/* Whether a debt of blocks is forgiven: it would take longer than one control period to repay
 * at the rate, while the account says the container used less than its limit. The rate follows
 * demand, so after a light load it is low, and one large kernel's debt held the next launch
 * back for minutes on an idle GPU (hook/README.md, SM limit). */
int vgpu_control_forgives(double debt, double rate, double period, double credit);

/* The rate after a forgiveness: what spends the limit on work like the debt's, whose blocks
 * cost gpu_seconds of the whole GPU as measured while it was outstanding (unmeasured: the debt
 * once a second); at least twice the rate. The feedback steers it from there. */
double vgpu_control_forgiven_rate(double rate, double limit, double debt, double gpu_seconds);

/* The credit as of now: the account's credit plus the limit's share of the age seconds since
 * its last charge (at most max_age, as a charge would count the gap), which the next charge
 * will add. */
double vgpu_control_balance(double credit, double limit, double age, double max_age);

/* What of `prepaid` seconds, paid ahead for the time from..to (any one clock's seconds), a
 * charge up to `charged` has measured and so gives back: all of it once charged reaches to,
 * else all but the time left at `rate` (the share it now prepays at, 0..1: what it paid for
 * that time may have been at another). */
double vgpu_control_settled(double prepaid, double from, double to, double charged, double rate);

/* Where the time a process has not prepaid before a drain (a synchronisation after which none
 * of its work runs, at `drained`) begins, as seen at a tick: where its prepayment ended
 * (paid_to) while it prepays; else, where a launch since the last tick (launched) may have
 * started, `resumed` (a tick back, or the previous drain if later); else nothing is unpaid
 * (the result is `drained`). Any one clock's seconds. */
double vgpu_control_unpaid_from(int prepaying, double paid_to, int launched, double resumed,
                                double drained);

/* Whether launches are held back: the container is over its limit by more than held_seconds of
 * its share, as measured. Blocks are only a prediction of a launch's cost (a graph's WHILE node
 * runs its body any number of times), so this bounds what a wrong one can take in the long run. */
int vgpu_control_holds(double credit, double limit, double held_seconds);

#endif
