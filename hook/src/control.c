/* control.c - the SM limiter's control law. */
#include "control.h"

#include <math.h>

double vgpu_control_next_rate(double rate, double limit, double util, double demand,
                              double min_rate, int throttled, double balance)
{
    double next;
    if (util < 0.5) {
        next = rate * 2.0; /* idle or starved: open up, bounded by demand below */
    } else {
        double factor = sqrt(limit / util);
        next = rate * (factor < 0.5 ? 0.5 : factor > 2.0 ? 2.0 : factor);
    }
    if (throttled)
        next *= balance;
    double least = (throttled || util < limit) ? rate : 0.5 * rate;
    double ceiling = fmax(2.0 * demand + min_rate, least);
    if (next > ceiling)
        next = ceiling;
    return next < min_rate ? min_rate : next;
}

double vgpu_control_sibling_factor(double own, double sibling)
{
    if (sibling < 1.0 || own >= 0.8 * sibling)
        return 1.0;
    double factor = sqrt(sibling / (own > 0.5 ? own : 0.5));
    return factor > 2.0 ? 2.0 : factor;
}

double vgpu_control_credit(double credit, double limit, double util, double gap, double covered,
                           double cap)
{
    double next = credit + limit / 100.0 * gap - util / 100.0 * covered;
    return next > cap ? cap : next;
}

int vgpu_control_forgives(double debt, double rate, double period, double credit)
{
    return credit > 0.0 && debt > rate * period;
}

double vgpu_control_forgiven_rate(double rate, double limit, double debt, double gpu_seconds)
{
    double measured = gpu_seconds > 0.0 ? limit / 100.0 * debt / gpu_seconds : debt;
    return measured > 2.0 * rate ? measured : 2.0 * rate;
}

int vgpu_control_holds(double credit, double limit, double held_seconds)
{
    return credit < -limit / 100.0 * held_seconds;
}

double vgpu_control_balance(double credit, double limit, double age, double max_age)
{
    double since = age < 0.0 ? 0.0 : age > max_age ? max_age : age;
    return credit + limit / 100.0 * since;
}

double vgpu_control_unpaid_from(int prepaying, double paid_to, int launched, double resumed,
                                double drained)
{
    double from = prepaying ? paid_to : launched ? resumed : drained;
    return from < drained ? from : drained;
}

double vgpu_control_settled(double prepaid, double from, double to, double charged, double rate)
{
    if (prepaid <= 0.0 || charged <= from)
        return 0.0;
    if (charged >= to || to <= from)
        return prepaid;
    double left = rate * (to - charged);
    return left < prepaid ? prepaid - left : 0.0;
}
