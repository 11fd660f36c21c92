/* The seeded generator of the `uform` command: xoshiro256**, its state filled by splitmix64 from (seed,
 * stream, index). Integer arithmetic and exact scalings only, so that every machine draws alike. */
#include "uform_random.h"

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15u);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    return z ^ (z >> 31);
}

void random_stream_seed(random_stream_t *random, uint64_t seed, uint64_t stream, uint64_t index) {
    uint64_t x = seed;
    x = splitmix64(&x) ^ stream * 0xD1B54A32D192ED03u;
    x = splitmix64(&x) ^ index;
    for (size_t i = 0; i < 4; ++i)
        random->state[i] = splitmix64(&x);
}

static uint64_t rotate_left(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

uint64_t random_stream_next(random_stream_t *random) {
    uint64_t *s = random->state;
    uint64_t result = rotate_left(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotate_left(s[3], 45);
    return result;
}

double random_stream_unit(random_stream_t *random) {
    return (double)(random_stream_next(random) >> 11) * 0x1.0p-53;
}

double random_stream_between(random_stream_t *random, double low, double high) {
    return low + (high - low) * random_stream_unit(random);
}

size_t random_stream_below(random_stream_t *random, size_t count) {
    return (size_t)(((unsigned __int128)random_stream_next(random) * count) >> 64);
}
