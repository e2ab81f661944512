/* test_control.c - the SM limiter's control law against a simulated GPU whose utilisation is
 * proportional to the refill rate, at two scales 1000x apart (the SM-count independence). */
#include <math.h>

#include "check.h"
#include "control.h"

/* util = min(100, gain * rate): gain is "percent per token/s", unknown to the controller. */
static double settle(double limit, double gain, int steps, double *max_step)
{
    double rate = 1.0, util = 0;
    *max_step = 0;
    for (int i = 0; i < steps; i++) {
        util = fmin(100.0, gain * rate);
        double next = vgpu_control_next_rate(rate, limit, util, rate, 1.0, 1, 1.0);
        double step = next / rate;
        if (step > *max_step)
            *max_step = step;
        rate = next;
    }
    return fmin(100.0, gain * rate);
}

int main(void)
{
    const double limits[] = {30, 60};
    const double gains[] = {1e-2, 1e-5}; /* a small GPU and one 1000x larger */
    for (int l = 0; l < 2; l++) {
        for (int g = 0; g < 2; g++) {
            double max_step;
            double util = settle(limits[l], gains[g], 60, &max_step);
            check(fabs(util - limits[l]) < 1.0, "limit %.0f%%, gain %g: settles at %.2f%%",
                  limits[l], gains[g], util);
            check(max_step <= 2.0, "limit %.0f%%, gain %g: no step above 2x (%.2f)", limits[l],
                  gains[g], max_step);
        }
    }
    double r = vgpu_control_next_rate(1000.0, 30, 90, 1000.0, 1.0, 0, 1.0);
    check(r >= 500.0 && r < 1000.0, "over the limit the rate falls, at most by half (%.1f)", r);
    r = vgpu_control_next_rate(1000.0, 30, 0, 1.0, 1.0, 0, 1.0);
    check(r == 1000.0, "a process that took 1 token/s of its 1000, the GPU idle, is not raised: "
          "no demand backs it (%.1f)", r);
    r = vgpu_control_next_rate(1000.0, 30, 10, 5000.0, 1.0, 0, 1.0);
    check(r > 1000.0 && r <= 2000.0, "under the limit with demand the rate rises (%.1f)", r);
    r = vgpu_control_next_rate(1000.0, 30, 9, 600.0, 1.0, 0, 1.0);
    check(r == 1201.0, "... to twice its demand at most (%.1f)", r);
    int steps = 0;
    for (r = 1000.0; r > 101.0 && steps < 10; steps++)
        r = vgpu_control_next_rate(r, 30, 30, 50.0, 1.0, 0, 1.0);
    check(r == 101.0 && steps == 4, "at the limit, a process that took 50 tokens/s of its 1000 "
          "falls to twice that, by half a step (%.1f after %d steps)", r, steps);
    r = vgpu_control_next_rate(1000.0, 30, 30, 50.0, 1.0, 1, 1.0);
    check(r == 1000.0, "... not a throttled one (its launches waited: a hold gave it nothing), "
          "which keeps its rate (%.1f)", r);
    r = vgpu_control_next_rate(1000.0, 30, 9, 100.0, 1.0, 0, 1.0);
    check(r == 1000.0, "under its limit, one not throttled that took 100 tokens/s (a burst that "
          "ended early in the period, or a lone small kernel) keeps its rate, which its next "
          "burst needs, and does not rise (%.1f)", r);
    r = vgpu_control_next_rate(1000.0, 30, 60, 100.0, 1.0, 0, 1.0);
    check(r == 500.0, "over it, falls by half (%.1f)", r);
    r = vgpu_control_next_rate(1000.0, 30, 30, 1000.0, 1.0, 1, 1.5);
    check(r == 1500.0, "at the limit, taking all it is given, balanced by 1.5: 1.5x (%.1f)", r);
    r = vgpu_control_next_rate(1000.0, 30, 60, 1000.0, 1.0, 1, 2.0);
    check(fabs(r - 2000.0 * sqrt(0.5)) < 1e-6, "... over the limit the container's step applies "
          "as well (%.1f)", r);
    r = vgpu_control_next_rate(1000.0, 30, 30, 10.0, 1.0, 1, 2.0);
    check(r == 1000.0, "... and in a mostly held period (10 tokens/s taken) it keeps its rate: a "
          "raise needs demand to back it (%.1f)", r);
    /* Between processes of one container. */
    check(vgpu_control_sibling_factor(2.0, 28.0) == 2.0,
          "a process at 2 %% beside a sibling at 28: doubles (the most a step may)");
    double f = vgpu_control_sibling_factor(10.0, 20.0);
    check(fabs(f - sqrt(2.0)) < 1e-9, "at 10 beside 20: x%.3f", f);
    check(vgpu_control_sibling_factor(17.0, 20.0) == 1.0 &&
              vgpu_control_sibling_factor(20.0, 10.0) == 1.0,
          "within a fifth of the sibling's share, or above it: unchanged");
    check(vgpu_control_sibling_factor(0.0, 0.9) == 1.0,
          "beside a sibling under a point: unchanged");
    f = vgpu_control_sibling_factor(0.0, 1.5);
    check(fabs(f - sqrt(3.0)) < 1e-9, "no share of its own counts as half a point: x%.3f", f);
    /* The GPU-time account: seconds of the whole GPU under the limit. */
    double c = vgpu_control_credit(0.0, 30, 10, 0.5, 0.5, 1.0);
    check(fabs(c - 0.1) < 1e-9, "20 points under a limit of 30 for 0.5 s: 0.1 s of GPU banked "
          "(%.3f)", c);
    c = vgpu_control_credit(0.0, 30, 0, 100.0, 100.0, 0.06);
    check(c == 0.06, "an idle process banks no more than the cap (%.3f)", c);
    c = vgpu_control_credit(0.06, 30, 90, 1.0, 1.0, 0.06);
    check(fabs(c + 0.54) < 1e-9, "60 points over for 1 s: the account goes negative (%.3f)", c);
    c = vgpu_control_credit(0.0, 20, 60, 0.55, 1.0 / 6, 1.0);
    check(fabs(c - 0.01) < 1e-9, "a sample of 60 %% after 0.55 s: only its period is charged, the "
          "rest of the gap ran nothing (%.3f)", c);
    check(vgpu_control_forgives(20000, 21, 0.1, 0.05),
          "a debt of 950 s at the rate, the account under the limit: forgiven");
    check(!vgpu_control_forgives(20000, 21, 0.1, -0.01),
          "... not while the account is over the limit");
    check(!vgpu_control_forgives(1.5, 21, 0.1, 0.05),
          "... nor a debt the rate repays within a control period");
    r = vgpu_control_forgiven_rate(21, 50, 20000, 0.02);
    check(fabs(r - 5e5) < 1e-3, "20000 blocks measured at 0.02 s of GPU, limit 50: the rate that "
          "spends half the GPU on such work (%.0f)", r);
    r = vgpu_control_forgiven_rate(21, 50, 20000, 0.0);
    check(r == 20000, "not measured: the debt once a second (%.0f)", r);
    r = vgpu_control_forgiven_rate(1000, 50, 100, 0.5);
    check(r == 2000, "never below twice the rate it had (%.0f)", r);
    check(!vgpu_control_holds(-0.19, 20, 1.0) && vgpu_control_holds(-0.21, 20, 1.0),
          "launches are held once the account is a second at the limit over (0.2 s at 20%%)");
    double b = vgpu_control_balance(-0.3, 20, 0.4, 10.0);
    check(fabs(b - -0.22) < 1e-9, "0.4 s after its last charge, an account at -0.3 s stands at "
          "-0.22 s under a limit of 20 (%.3f)", b);
    b = vgpu_control_balance(-0.3, 20, 600.0, 10.0);
    check(fabs(b - 1.7) < 1e-9 && vgpu_control_balance(-0.3, 20, -1.0, 10.0) == -0.3,
          "a gap counts at most as a charge counts it (%.3f), a negative age as none", b);
    double back = vgpu_control_settled(0.3, 0.1, 0.4, 0.2, 1.0);
    check(fabs(back - 0.1) < 1e-9, "0.3 s prepaid for 0.1..0.4 s, charged up to 0.2 s, the whole "
          "GPU prepaid now: the 0.2 s left kept, 0.1 s given back (%.3f)", back);
    /* A share that rose late: 5 % for 0.9 s, then the whole GPU to 1.12 s (0.265 s prepaid),
     * charged up to 1.0: the 0.12 s left stay paid at the whole GPU. */
    back = vgpu_control_settled(0.265, 0.0, 1.12, 1.0, 1.0);
    check(fabs(back - 0.145) < 1e-9, "a share that rose late: of 0.265 s prepaid, 0.145 s given "
          "back, not the 0.237 s an even split gives (%.3f)", back);
    check(vgpu_control_settled(0.3, 0.1, 0.4, 0.4, 1.0) == 0.3 &&
              vgpu_control_settled(0.3, 0.1, 0.4, 0.09, 1.0) == 0.0 &&
              vgpu_control_settled(0.0, 0.1, 0.4, 0.5, 1.0) == 0.0 &&
              vgpu_control_settled(0.3, 0.1, 0.4, 0.2, 0.0) == 0.3,
          "all of it once charged to its end, or when nothing is prepaid now; nothing charged "
          "before its start, or none prepaid");
    /* A drain seen at a tick (at 10.0 s, drained at 9.995): a kernel launched and drained since
     * the last tick ran, though no tick prepaid it. */
    check(vgpu_control_unpaid_from(0, 9.98, 1, 9.99, 9.995) == 9.99,
          "launched and drained between two ticks: unpaid from a tick back");
    check(vgpu_control_unpaid_from(0, 9.98, 0, 9.99, 9.995) == 9.995,
          "no launch since the last tick (paused): nothing unpaid");
    check(vgpu_control_unpaid_from(1, 9.97, 1, 9.99, 9.995) == 9.97 &&
              vgpu_control_unpaid_from(1, 10.02, 1, 9.99, 9.995) == 9.995,
          "prepaying: unpaid from where the last prepayment ended (a late tick), nothing when it "
          "was paid past the drain");
    return check_done("test_control");
}
