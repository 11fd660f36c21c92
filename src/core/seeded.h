/* Seeded numbers that every machine draws alike (integer arithmetic and exact scalings only, no libm):
 * the tiny checkpoint's weights and the trainer's seeded start. */
#pragma once

#include <stdint.h>

static inline uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Irwin-Hall: four uniforms in [0, 1) sum to mean 2, variance 1/3; recentred and scaled by sqrt(3). */
static inline double standard_normal(uint64_t *state) {
    double sum = 0;
    for (int i = 0; i < 4; i++)
        sum += (double)(splitmix64(state) >> 11) * 0x1p-53;
    return (sum - 2.0) * 1.7320508075688772;
}
