/* The seeded generator of the `uform` command (uform_random.c): what `dataset synth` draws, the order
 * `train` takes batches in, and the neighbours it samples. The engine keeps its own seeded numbers
 * (the tiny checkpoint's weights), which are not part of its public header. */
#ifndef UFORM_RANDOM_H
#define UFORM_RANDOM_H

#include <stddef.h>
#include <stdint.h>

/* xoshiro256**, its state filled by splitmix64. Each use has a stream of its own, so that what one
 * sample or one batch draws depends only on the seed, its stream and its index. */
typedef struct random_stream {
    uint64_t state[4];
} random_stream_t;

/* The generator of (seed, stream, index): streams name what is drawn (a modality, the held-out choice,
 * the batch order). */
void random_stream_seed(random_stream_t *random, uint64_t seed, uint64_t stream, uint64_t index);
uint64_t random_stream_next(random_stream_t *random);
/* Uniform in [0, 1), 53 bits. */
double random_stream_unit(random_stream_t *random);
/* Uniform in [low, high). */
double random_stream_between(random_stream_t *random, double low, double high);
/* Uniform in [0, count), count > 0 (multiply-shift: a bias below 2^-40 for the counts used here). */
size_t random_stream_below(random_stream_t *random, size_t count);

#endif /* UFORM_RANDOM_H */
