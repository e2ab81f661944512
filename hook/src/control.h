/* control.h - the SM limiter's control law, a pure function (unit-tested on its own). */
#ifndef VGPU_CONTROL_H
#define VGPU_CONTROL_H

/* Next refill rate (tokens/s) from the current rate, the limit and the measured utilisation
 * (both percent) and the tokens/s the application actually took. The rate is scaled by
 * sqrt(limit / utilisation), clamped to [0.5, 2]: the step is relative to the current rate, so
 * it never depends on the GPU's SM count (HAMi-core's SMs^2 step does). Demand bounds it, so a
 * process that is not using its budget cannot bank a burst. Never below min_rate. */
double vgpu_control_next_rate(double rate, double limit, double util, double demand,
                              double min_rate);

#endif
