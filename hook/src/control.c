/* control.c - the SM limiter's control law. */
#include "control.h"

#include <math.h>

double vgpu_control_next_rate(double rate, double limit, double util, double demand,
                              double min_rate)
{
    double next;
    if (util < 0.5) {
        next = rate * 2.0; /* idle or starved: open up, bounded by demand below */
    } else {
        double factor = sqrt(limit / util);
        next = rate * (factor < 0.5 ? 0.5 : factor > 2.0 ? 2.0 : factor);
    }
    double ceiling = 2.0 * demand + min_rate;
    if (next > ceiling)
        next = ceiling;
    return next < min_rate ? min_rate : next;
}
