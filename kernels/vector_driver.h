/* The non-GEMM kernels the AVX2 and AVX-512 paths share (RMSNorm, LayerNorm, softmax, normalize, GELU, their
 * backward passes, and attention forward and backward), written once over the vector primitives of
 * math_avx2.h / math_avx512.h (vfloat, vf_load, vf_fmadd, vdouble, ...): one sequence of vector operations
 * for both paths, which differ only in the lanes per vector and the order of the sums across lanes. F32 tails
 * are read and written through lane masks, never past `n`; sums of values and of squares and softmax
 * denominators are accumulated in double as on the scalar path.
 *
 * Attention takes a block of LANES queries at a time with one lane per query: the block's queries are
 * transposed once, so that the scores of a key against all the block's queries, the running max, the
 * running sum and the rescaling of the online softmax are plain lane-wise vector operations, and the
 * weighted sum of values is kept transposed too ([head dims][LANES queries]) until the block's rows are
 * written out. A relative-position bias (kernel_attention_t.bias) is added to a tile's scores before the
 * causal mask: for one key, the block's lanes take a contiguous run of the table. Heads of any width to
 * KERNEL_HEAD_MAX; the backward pass takes KERNEL_HEAD only, and no bias.
 *
 * A path's file (vector_<path>.c) includes this header after its math header and after defining what
 * depends on its instruction set:
 *   - LANES, the F32 lanes of a vfloat;
 *   - tail_mask(left), the vmask of the lanes below `left` (all of them when left >= LANES);
 *   - transpose(vfloat rows[LANES]), the in-register transpose of a LANES x LANES block;
 *   - mask_future(scores, count, first_key, first_query), the causal mask of a tile's scores;
 *   - PATH_KERNEL(name), the name of the path's function kernel_<name>_<path> (paths.h), under which the
 *     kernels here are defined.
 * All of it is compiled there with that file's target flags, so each path gets the same code as if it
 * spelled these functions out: the helpers keep the inline qualifiers they had there, and the compiler
 * the inlining it chose.
 *
 * The loops marked `#pragma GCC unroll` run over a fixed number of vectors: unrolled, their arrays of
 * vectors stay in registers (gcc -O2 would keep them in memory). */
#pragma once

#include <math.h>
#include <string.h>

#include "kernels.h"

#define ATTENTION_TILE 64 /* keys per tile of the online softmax */
#define SCORE_GROUP    8  /* keys scored together: independent FMA chains hide the FMA latency */
#define VECTOR_ALIGN   (LANES * sizeof(float)) /* the alignment of vf_load and vf_store */

static double sum_squares(float const *x, size_t n) {
    vdouble low = vd_zero(), high = vd_zero();
    for (size_t i = 0; i < n; i += LANES) {
        vfloat v = vf_maskload(x + i, tail_mask(n - i));
        vdouble first = vd_low(v), second = vd_high(v);
        low = vd_fmadd(first, first, low);
        high = vd_fmadd(second, second, high);
    }
    return vd_reduce_add(vd_add(low, high));
}

/* x[0, n) *= factor */
static void scale_in_place(float *x, size_t n, float factor) {
    vfloat by = vf_set1(factor);
    for (size_t i = 0; i < n; i += LANES) {
        vmask mask = tail_mask(n - i);
        vf_maskstore(x + i, mask, vf_mul(vf_maskload(x + i, mask), by));
    }
}

void PATH_KERNEL(rmsnorm)(float *y, size_t y_stride, float const *x, size_t x_stride, float const *weight,
                          size_t rows, size_t n, float eps) {
    for (size_t r = 0; r < rows; ++r, y += y_stride, x += x_stride) {
        vfloat inverse = vf_set1((float)(1.0 / sqrt(sum_squares(x, n) / (double)n + eps)));
        for (size_t i = 0; i < n; i += LANES) {
            vmask mask = tail_mask(n - i);
            vfloat v = vf_mul(vf_maskload(x + i, mask), inverse);
            vf_maskstore(y + i, mask, vf_mul(v, vf_maskload(weight + i, mask)));
        }
    }
}

/* The sum of x[0, n), in double: two vectors at a time in four chains, the tail masked. */
static double sum_values(float const *x, size_t n) {
    vdouble sums[4] = {vd_zero(), vd_zero(), vd_zero(), vd_zero()};
    size_t i = 0;
    for (; i + 2 * LANES <= n; i += 2 * LANES) {
        vfloat v = vf_loadu(x + i), w = vf_loadu(x + i + LANES);
        sums[0] = vd_add(sums[0], vd_low(v));
        sums[1] = vd_add(sums[1], vd_high(v));
        sums[2] = vd_add(sums[2], vd_low(w));
        sums[3] = vd_add(sums[3], vd_high(w));
    }
    for (; i < n; i += LANES) {
        vfloat v = vf_maskload(x + i, tail_mask(n - i));
        sums[0] = vd_add(sums[0], vd_low(v));
        sums[1] = vd_add(sums[1], vd_high(v));
    }
    return vd_reduce_add(vd_add(vd_add(sums[0], sums[1]), vd_add(sums[2], sums[3])));
}

/* x[0, LANES) - mean, as (x - high) - low (kernel_layernorm_scalar). */
static inline vfloat deviations(float const *x, vfloat high, vfloat low) {
    return vf_sub(vf_sub(vf_loadu(x), high), low);
}

/* The same under `mask`: 0 in the lanes past it. */
static inline vfloat deviations_masked(float const *x, vmask mask, vfloat high, vfloat low) {
    return vf_maskzero(mask, vf_sub(vf_sub(vf_maskload(x, mask), high), low));
}

/* squares[c] += the squares of the deviation's halves, in double, into chains c and c + 1. */
static inline void add_squares(vdouble squares[], size_t c, vfloat deviation) {
    vdouble first = vd_low(deviation), second = vd_high(deviation);
    squares[c] = vd_fmadd(first, first, squares[c]);
    squares[c + 1] = vd_fmadd(second, second, squares[c + 1]);
}

/* layernorm as kernel_layernorm_scalar: the mean and the sum of squared deviations in double (the deviations
 * themselves in F32, (x - high) - low), two vectors at a time in four chains, then the output in F32, LANES
 * at a time; the tails masked. */
void PATH_KERNEL(layernorm)(float *y, size_t y_stride, float const *x, size_t x_stride, float const *weight,
                            float const *bias, size_t rows, size_t n, float eps) {
    size_t const whole = n - n % LANES;
    for (size_t r = 0; r < rows; ++r, y += y_stride, x += x_stride) {
        double mean = sum_values(x, n) / (double)n;
        float mean_high = (float)mean;
        vfloat high = vf_set1(mean_high), low = vf_set1((float)(mean - mean_high));
        vdouble squares[4] = {vd_zero(), vd_zero(), vd_zero(), vd_zero()};
        size_t i = 0;
        for (; i + 2 * LANES <= n; i += 2 * LANES) {
            add_squares(squares, 0, deviations(x + i, high, low));
            add_squares(squares, 2, deviations(x + i + LANES, high, low));
        }
        for (; i < n; i += LANES)
            add_squares(squares, 0, deviations_masked(x + i, tail_mask(n - i), high, low));
        double variance =
            vd_reduce_add(vd_add(vd_add(squares[0], squares[1]), vd_add(squares[2], squares[3]))) / (double)n;
        vfloat inverse = vf_set1((float)(1.0 / sqrt(variance + eps)));
        for (i = 0; i < whole; i += LANES) {
            vfloat value = vf_mul(vf_mul(deviations(x + i, high, low), inverse), vf_loadu(weight + i));
            if (bias) value = vf_add(value, vf_loadu(bias + i));
            vf_storeu(y + i, value);
        }
        if (whole < n) {
            vmask mask = tail_mask(n - whole);
            vfloat value = vf_mul(vf_mul(deviations_masked(x + whole, mask, high, low), inverse),
                                  vf_maskload(weight + whole, mask));
            if (bias) value = vf_add(value, vf_maskload(bias + whole, mask));
            vf_maskstore(y + whole, mask, value);
        }
    }
}

/* Lanes past `n` read as -inf: their weight exp(-inf - max) is exactly 0 and adds nothing to the sum. */
void PATH_KERNEL(softmax)(float *x, size_t n) {
    vfloat const empty = vf_set1(-INFINITY);
    vfloat max = empty;
    for (size_t i = 0; i < n; i += LANES)
        max = vf_max(max, vf_maskload_or(empty, x + i, tail_mask(n - i)));
    max = vf_set1(vf_reduce_max(max));
    vdouble low = vd_zero(), high = vd_zero();
    for (size_t i = 0; i < n; i += LANES) {
        vmask mask = tail_mask(n - i);
        vfloat weight = exp_ps(vf_sub(vf_maskload_or(empty, x + i, mask), max));
        vf_maskstore(x + i, mask, weight);
        low = vd_add(low, vd_low(weight));
        high = vd_add(high, vd_high(weight));
    }
    scale_in_place(x, n, (float)(1.0 / vd_reduce_add(vd_add(low, high))));
}

void PATH_KERNEL(normalize)(float *x, size_t n) {
    double squares = sum_squares(x, n);
    if (squares == 0.0) return;
    scale_in_place(x, n, (float)(1.0 / sqrt(squares)));
}

/* rmsnorm_backward as kernel_rmsnorm_backward_scalar: 1/r and sum(weight dy x) in double, then
 * dx = weight dy / r - x sum(weight dy x) / (n r^3) and d_weight += dy x / r in F32, LANES at a time. */
void PATH_KERNEL(rmsnorm_backward)(float *dx, size_t dx_stride, float *d_weight, float const *dy,
                                   size_t dy_stride, float const *x, size_t x_stride, float const *weight,
                                   size_t rows, size_t n, float eps) {
    for (size_t r = 0; r < rows; ++r, dx += dx_stride, dy += dy_stride, x += x_stride) {
        vdouble squares[2] = {vd_zero(), vd_zero()};
        vdouble dots[2] = {vd_zero(), vd_zero()};
        for (size_t i = 0; i < n; i += LANES) {
            vmask mask = tail_mask(n - i);
            vfloat values = vf_maskload(x + i, mask), gradients = vf_maskload(dy + i, mask);
            vfloat weights = vf_maskload(weight + i, mask);
            vdouble halves_x[2] = {vd_low(values), vd_high(values)};
            vdouble halves_g[2] = {vd_low(gradients), vd_high(gradients)};
            vdouble halves_w[2] = {vd_low(weights), vd_high(weights)};
            for (size_t h = 0; h < 2; ++h) {
                vdouble product = vd_mul(halves_w[h], halves_g[h]);
                squares[h] = vd_fmadd(halves_x[h], halves_x[h], squares[h]);
                dots[h] = vd_fmadd(product, halves_x[h], dots[h]);
            }
        }
        double inverse = 1.0 / sqrt(vd_reduce_add(vd_add(squares[0], squares[1])) / (double)n + eps);
        double dot = vd_reduce_add(vd_add(dots[0], dots[1]));
        vfloat by = vf_set1((float)inverse);
        vfloat coefficient = vf_set1((float)(dot / (double)n * inverse * inverse * inverse));
        for (size_t i = 0; i < n; i += LANES) {
            vmask mask = tail_mask(n - i);
            vfloat values = vf_maskload(x + i, mask), gradients = vf_maskload(dy + i, mask);
            vfloat weights = vf_maskload(weight + i, mask);
            vfloat d_weights = vf_maskload(d_weight + i, mask);
            d_weights = vf_add(d_weights, vf_mul(vf_mul(gradients, values), by));
            vf_maskstore(d_weight + i, mask, d_weights);
            vfloat scaled = vf_mul(vf_mul(weights, gradients), by);
            vf_maskstore(dx + i, mask, vf_sub(scaled, vf_mul(values, coefficient)));
        }
    }
}

void PATH_KERNEL(gelu)(float *x, size_t n) {
    for (size_t i = 0; i < n; i += LANES) {
        vmask mask = tail_mask(n - i);
        vf_maskstore(x + i, mask, gelu_ps(vf_maskload(x + i, mask)));
    }
}

/* gelu'(x) = 0.5(1 + t) + 0.5x(1 - t^2) sqrt(2/pi)(1 + 3 0.044715x^2), t = tanh(u), rewritten with
 * s = 1 / (1 + e), e = exp(-2u): 0.5(1 + t) = s and 0.5(1 - t^2) = 2 e s^2, so
 * gelu'(x) = s (1 + 2x (e s) sqrt(2/pi)(1 + 0.134145x^2)), free of the cancellations of 1 + t and
 * 1 - t^2 (e s = 1 - s stays finite where e is clamped). */
static inline vfloat gelu_derivative_ps(vfloat x) {
    vfloat x2 = vf_mul(x, x);
    vfloat u = vf_mul(x, vf_fmadd(x2, vf_set1(0.0356774081f), vf_set1(0.797884561f)));
    vfloat e = exp_ps(vf_mul(u, vf_set1(-2.0f)));
    vfloat s = vf_div(vf_set1(1.0f), vf_add(e, vf_set1(1.0f)));
    vfloat slope = vf_fmadd(x2, vf_set1(0.107032224f), vf_set1(0.797884561f));
    vfloat r = vf_mul(vf_mul(vf_add(x, x), vf_mul(e, s)), slope);
    return vf_fmadd(s, r, s);
}

void PATH_KERNEL(gelu_backward)(float *dx, float const *dy, float const *x, size_t n) {
    for (size_t i = 0; i < n; i += LANES) {
        vmask mask = tail_mask(n - i);
        vfloat derivative = gelu_derivative_ps(vf_maskload(x + i, mask));
        vf_maskstore(dx + i, mask, vf_mul(vf_maskload(dy + i, mask), derivative));
    }
}

/* ---- Attention ---------------------------------------------------------------------------------- */

/* A head of `head` dims is walked in chunks of LANES dims: the whole ones, then a last one of head % LANES
 * dims, whose loads and stores are masked: no dim past the head is read from q, k or v or written to out.
 * The functions below take the head's width and are always inlined, so that attention compiles twice: for
 * KERNEL_HEAD, a constant that folds the last chunk away and leaves the loops of the text towers' heads,
 * and for any other width. The block's arrays hold KERNEL_HEAD_MAX dims; those past the head, up to the
 * next multiple of LANES, are zero. */

/* x[0, width) as a vector, zero past it (width <= LANES). */
static inline __attribute__((always_inline)) vfloat load_part(float const *x, size_t width) {
    return width == LANES ? vf_loadu(x) : vf_maskload(x, tail_mask(width));
}

/* to[0, width) = the first `width` lanes of x (width <= LANES). */
static inline __attribute__((always_inline)) void store_part(float *to, size_t width, vfloat x) {
    if (width == LANES)
        vf_storeu(to, x);
    else
        vf_maskstore(to, tail_mask(width), x);
}

/* One chunk of `width` dims of load_queries: queries [LANES dims][LANES] from q at the chunk. */
static inline __attribute__((always_inline)) void load_queries_part(float queries[][LANES], float const *q,
                                                                    size_t stride, size_t rows, vfloat by,
                                                                    size_t width) {
    vfloat block[LANES];
#pragma GCC unroll 16
    for (size_t i = 0; i < LANES; ++i)
        block[i] = i < rows ? vf_mul(load_part(q + i * stride, width), by) : vf_zero();
    transpose(block);
#pragma GCC unroll 16
    for (size_t d = 0; d < LANES; ++d)
        vf_store(queries[d], block[d]);
}

/* The queries of one block, transposed and scaled: [head dims][LANES queries], lanes past `rows` zero, and
 * the dims past `head` to the next multiple of LANES. */
static inline __attribute__((always_inline)) void
load_queries(float queries[][LANES], float const *q, size_t stride, size_t rows, float scale, size_t head) {
    vfloat by = vf_set1(scale);
    size_t whole = head - head % LANES;
    for (size_t chunk = 0; chunk < whole; chunk += LANES)
        load_queries_part(queries + chunk, q + chunk, stride, rows, by, LANES);
    if (head % LANES) load_queries_part(queries + whole, q + whole, stride, rows, by, head % LANES);
}

/* scores[j][i] = queries[.][i] . k[j] over the head's dims, for the SCORE_GROUP keys from row k (rows at
 * `stride`), of which `count` are left in the tile: a last, partial group repeats the tile's last key, whose
 * extra scores are never read. */
static inline __attribute__((always_inline)) void score_group(float scores[SCORE_GROUP][LANES],
                                                              float const queries[][LANES], float const *k,
                                                              size_t stride, size_t count, size_t head) {
    float const *keys[SCORE_GROUP];
    for (size_t j = 0; j < SCORE_GROUP; ++j)
        keys[j] = k + (j < count ? j : count - 1) * stride;
    vfloat sums[SCORE_GROUP];
#pragma GCC unroll 16
    for (size_t j = 0; j < SCORE_GROUP; ++j)
        sums[j] = vf_zero();
    for (size_t d = 0; d < head; ++d) {
        vfloat query = vf_load(queries[d]);
#pragma GCC unroll 16
        for (size_t j = 0; j < SCORE_GROUP; ++j)
            sums[j] = vf_fmadd(vf_broadcast(keys[j] + d), query, sums[j]);
    }
#pragma GCC unroll 16
    for (size_t j = 0; j < SCORE_GROUP; ++j)
        vf_store(scores[j], sums[j]);
}

/* Scores of the tile's `count` keys (rows of k at `stride`) against the block's queries: [64 keys][LANES]. */
static inline __attribute__((always_inline)) void tile_scores(float scores[ATTENTION_TILE][LANES],
                                                              float const queries[][LANES], float const *k,
                                                              size_t stride, size_t count, size_t head) {
    for (size_t j = 0; j < count; j += SCORE_GROUP)
        score_group(scores + j, queries, k + j * stride, stride, count - j, head);
}

/* scores[j][i] += bias[(first_query + i) - (first_key + j)] for the tile's `count` keys, rows of one item
 * (kernel_attention_t.bias): for key j the lanes' entries are the run of LANES from
 * bias[first_query - first_key - j]. Lanes past the block's queries read entries the contract lets them
 * read, and their scores are never stored. */
static void add_position_bias(float scores[][LANES], float const *bias, size_t count, size_t first_key,
                              size_t first_query) {
    float const *run = bias + ((ptrdiff_t)first_query - (ptrdiff_t)first_key);
    for (size_t j = 0; j < count; ++j)
        vf_store(scores[j], vf_add(vf_load(scores[j]), vf_loadu(run - j)));
}

/* Online softmax state of a block: per query lane the running max and sum of exp(score - max), and the
 * exp-weighted sum of values, transposed [head dims][LANES queries]. */
typedef struct online_block {
    vfloat max, sum;
    _Alignas(VECTOR_ALIGN) float values[KERNEL_HEAD_MAX][LANES];
} online_block_t;

/* Turns the tile's scores into weights exp(score - new max) in place, raising the running max `*max` and
 * adding the weights to the running sum `*sum` (an online softmax's state); answers the factor
 * exp(old max - new max) that rescales what was accumulated before. */
static vfloat tile_weights(vfloat *max, vfloat *sum, float scores[ATTENTION_TILE][LANES], size_t count) {
    vfloat top = *max;
    for (size_t j = 0; j < count; ++j)
        top = vf_max(top, vf_load(scores[j]));
    vfloat correction = exp_ps(vf_sub(*max, top));
    vfloat total = vf_mul(*sum, correction);
    for (size_t j = 0; j < count; ++j) {
        vfloat weight = exp_ps(vf_sub(vf_load(scores[j]), top));
        vf_store(scores[j], weight);
        total = vf_add(total, weight);
    }
    *max = top;
    *sum = total;
    return correction;
}

/* One chunk of `width` dims of add_weighted_rows, sums_of and rows at the chunk: the dims past `width` are
 * neither read from the rows nor written to sums_of. */
static inline __attribute__((always_inline)) void
add_weighted_part(float sums_of[][LANES], vfloat const *correction,
                  float const weights[ATTENTION_TILE][LANES], float const *rows, size_t stride, size_t count,
                  size_t width) {
    vfloat sums[LANES];
#pragma GCC unroll 16
    for (size_t d = 0; d < LANES; ++d)
        sums[d] = d >= width   ? vf_zero()
                  : correction ? vf_mul(vf_load(sums_of[d]), *correction)
                               : vf_load(sums_of[d]);
    for (size_t j = 0; j < count; ++j) {
        vfloat weight = vf_load(weights[j]);
        float const *row = rows + j * stride;
#pragma GCC unroll 16
        for (size_t d = 0; d < LANES; ++d)
            if (d < width) sums[d] = vf_fmadd(vf_broadcast(row + d), weight, sums[d]);
    }
#pragma GCC unroll 16
    for (size_t d = 0; d < LANES; ++d)
        if (d < width) vf_store(sums_of[d], sums[d]);
}

/* sums[d][i] = sums[d][i] (* correction[i] unless correction is NULL) + sum_j weights[j][i] * rows[j][d],
 * LANES dims at a time over the head's dims, for the tile's `count` rows at `stride`: the online softmax's
 * values (rows of v, rescaled) and the query gradients (rows of k). Inlined: a NULL correction folds away. */
static inline __attribute__((always_inline)) void
add_weighted_rows(float sums_of[][LANES], vfloat const *correction,
                  float const weights[ATTENTION_TILE][LANES], float const *rows, size_t stride, size_t count,
                  size_t head) {
    size_t whole = head - head % LANES;
    for (size_t chunk = 0; chunk < whole; chunk += LANES)
        add_weighted_part(sums_of + chunk, correction, weights, rows + chunk, stride, count, LANES);
    if (head % LANES)
        add_weighted_part(sums_of + whole, correction, weights, rows + whole, stride, count, head % LANES);
}

/* One chunk of `width` dims of store_block, out and values at the chunk. */
static inline __attribute__((always_inline)) void store_block_part(float *out, size_t out_stride,
                                                                   float const values[][LANES],
                                                                   vfloat inverse, size_t rows,
                                                                   size_t width) {
    vfloat block[LANES];
#pragma GCC unroll 16
    for (size_t d = 0; d < LANES; ++d)
        block[d] = vf_mul(vf_load(values[d]), inverse);
    transpose(block);
#pragma GCC unroll 16
    for (size_t i = 0; i < LANES; ++i)
        if (i < rows) store_part(out + i * out_stride, width, block[i]);
}

/* out rows [0, rows) = values / sum over the head's dims, transposed back. */
static inline __attribute__((always_inline)) void store_block(float *out, size_t out_stride,
                                                              float const values[][LANES], vfloat sum,
                                                              size_t rows, size_t head) {
    vfloat inverse = vf_div(vf_set1(1.0f), sum);
    size_t whole = head - head % LANES;
    for (size_t chunk = 0; chunk < whole; chunk += LANES)
        store_block_part(out + chunk, out_stride, values + chunk, inverse, rows, LANES);
    if (head % LANES) store_block_part(out + whole, out_stride, values + whole, inverse, rows, head % LANES);
}

/* Queries [first_query, first_query + rows) of the item whose keys are rows [first_key, end_key). */
static inline __attribute__((always_inline)) void attend_block(kernel_attention_t const *a,
                                                               size_t first_query, size_t rows,
                                                               size_t first_key, size_t end_key,
                                                               size_t head) {
    _Alignas(VECTOR_ALIGN) float queries[KERNEL_HEAD_MAX][LANES];
    _Alignas(VECTOR_ALIGN) float scores[ATTENTION_TILE][LANES];
    online_block_t state;
    state.max = vf_set1(-INFINITY);
    state.sum = vf_zero();
    size_t padded = (head + LANES - 1) / LANES * LANES;
    memset(state.values, 0, padded * sizeof state.values[0]);
    load_queries(queries, a->q + first_query * a->stride, a->stride, rows, a->scale, head);
    for (size_t tile = first_key; tile < end_key; tile += ATTENTION_TILE) {
        size_t count = end_key - tile < ATTENTION_TILE ? end_key - tile : ATTENTION_TILE;
        tile_scores(scores, queries, a->k + tile * a->stride, a->stride, count, head);
        if (a->bias) add_position_bias(scores, a->bias, count, tile, first_query);
        if (a->causal) mask_future(scores, count, tile, first_query);
        vfloat correction = tile_weights(&state.max, &state.sum, scores, count);
        add_weighted_rows(state.values, &correction, scores, a->v + tile * a->stride, a->stride, count, head);
    }
    store_block(a->out + first_query * a->out_stride, a->out_stride, state.values, state.sum, rows, head);
}

/* The blocks of one item. Blocks start at the item's first row, so a causal block's tiles (multiples of 64
 * rows from there) all begin at or before its first query: every lane sees at least one key in every tile. */
static inline __attribute__((always_inline)) void attend_item(kernel_attention_t const *a, size_t item,
                                                              size_t head) {
    size_t first = a->offsets[item], end = a->offsets[item + 1];
    for (size_t block = first; block < end; block += LANES) {
        size_t rows = end - block < LANES ? end - block : LANES;
        attend_block(a, block, rows, first, a->causal ? block + rows : end, head);
    }
}

void PATH_KERNEL(attention)(kernel_attention_t const *attention, size_t item_begin, size_t item_end) {
    for (size_t item = item_begin; item < item_end; ++item) {
        if (attention->head == KERNEL_HEAD)
            attend_item(attention, item, KERNEL_HEAD);
        else
            attend_item(attention, item, attention->head);
    }
}

/* ---- Attention backward ------------------------------------------------------------------------- */

/* The attention backward pass takes a block of LANES queries at a time, one lane per query, as the
 * forward pass does: a first sweep over the keys recomputes each lane's softmax max and sum, a second
 * recomputes the probabilities P [keys][LANES] and dP = dO v^T [keys][LANES] (dO transposed like the
 * queries), forms dS = scale P (dP - rowsum(dO O)), and accumulates dQ += dS k transposed
 * [64 dims][LANES], and per key dV += P^T dO and dK += dS^T q over the block's rows, in ascending order. */

/* Each lane's max of the scores and sum of exp(score - max) over keys [first_key, end_key), folded tile
 * by tile (every lane sees a key in every tile: see PATH_KERNEL(attention)). */
static void block_statistics(kernel_attention_backward_t const *a, float const queries[KERNEL_HEAD][LANES],
                             size_t first_query, size_t first_key, size_t end_key, vfloat *max, vfloat *sum) {
    _Alignas(VECTOR_ALIGN) float scores[ATTENTION_TILE][LANES];
    vfloat running_max = vf_set1(-INFINITY), running_sum = vf_zero();
    for (size_t tile = first_key; tile < end_key; tile += ATTENTION_TILE) {
        size_t count = end_key - tile < ATTENTION_TILE ? end_key - tile : ATTENTION_TILE;
        tile_scores(scores, queries, a->k + tile * a->stride, a->stride, count, KERNEL_HEAD);
        if (a->causal) mask_future(scores, count, tile, first_query);
        vfloat tile_max = running_max;
        for (size_t j = 0; j < count; ++j)
            tile_max = vf_max(tile_max, vf_load(scores[j]));
        running_sum = vf_mul(running_sum, exp_ps(vf_sub(running_max, tile_max)));
        for (size_t j = 0; j < count; ++j)
            running_sum = vf_add(running_sum, exp_ps(vf_sub(vf_load(scores[j]), tile_max)));
        running_max = tile_max;
    }
    *max = running_max;
    *sum = running_sum;
}

/* rowsum(dO O) of the block's rows [0, rows) as lanes, zero past `rows`. */
static vfloat block_output_dots(kernel_attention_backward_t const *a, size_t first_query, size_t rows) {
    _Alignas(VECTOR_ALIGN) float dots[LANES] = {0};
    for (size_t i = 0; i < rows; ++i) {
        float const *d_out = a->d_out + (first_query + i) * a->out_stride;
        float const *out = a->out + (first_query + i) * a->out_stride;
        vfloat sum = vf_mul(vf_loadu(d_out), vf_loadu(out));
        for (size_t d = LANES; d < KERNEL_HEAD; d += LANES)
            sum = vf_fmadd(vf_loadu(d_out + d), vf_loadu(out + d), sum);
        dots[i] = vf_reduce_add(sum);
    }
    return vf_load(dots);
}

/* d_v[j] += sum_i p[j][i] dO[i] and d_k[j] += sum_i ds[j][i] q[i] over the block's rows i < rows, for the
 * tile's `count` keys, SPAN dims at a time: 8 accumulator chains (the whole head with 16 lanes, half of it
 * with 8). */
static void key_gradients(kernel_attention_backward_t const *a, float const p[ATTENTION_TILE][LANES],
                          float const ds[ATTENTION_TILE][LANES], size_t first_query, size_t rows, size_t tile,
                          size_t count) {
    enum { VECTORS = 4, SPAN = VECTORS * LANES };
    for (size_t j = 0; j < count; ++j) {
        for (size_t part = 0; part < KERNEL_HEAD; part += SPAN) {
            float *d_value = a->d_v + (tile + j) * a->stride + part;
            float *d_key = a->d_k + (tile + j) * a->stride + part;
            vfloat values[VECTORS], keys[VECTORS];
#pragma GCC unroll 4
            for (size_t c = 0; c < VECTORS; ++c) {
                values[c] = vf_loadu(d_value + c * LANES);
                keys[c] = vf_loadu(d_key + c * LANES);
            }
            for (size_t i = 0; i < rows; ++i) {
                float const *d_out = a->d_out + (first_query + i) * a->out_stride + part;
                float const *query = a->q + (first_query + i) * a->stride + part;
                vfloat probability = vf_set1(p[j][i]), d_score = vf_set1(ds[j][i]);
#pragma GCC unroll 4
                for (size_t c = 0; c < VECTORS; ++c) {
                    values[c] = vf_fmadd(probability, vf_loadu(d_out + c * LANES), values[c]);
                    keys[c] = vf_fmadd(d_score, vf_loadu(query + c * LANES), keys[c]);
                }
            }
#pragma GCC unroll 4
            for (size_t c = 0; c < VECTORS; ++c) {
                vf_storeu(d_value + c * LANES, values[c]);
                vf_storeu(d_key + c * LANES, keys[c]);
            }
        }
    }
}

/* Queries [first_query, first_query + rows) of the item whose keys are rows [first_key, end_key). */
static void attention_backward_block(kernel_attention_backward_t const *a, size_t first_query, size_t rows,
                                     size_t first_key, size_t end_key) {
    _Alignas(VECTOR_ALIGN) float queries[KERNEL_HEAD][LANES], d_outs[KERNEL_HEAD][LANES];
    _Alignas(VECTOR_ALIGN) float p[ATTENTION_TILE][LANES], ds[ATTENTION_TILE][LANES];
    _Alignas(VECTOR_ALIGN) float d_query[KERNEL_HEAD][LANES];
    memset(d_query, 0, sizeof d_query);
    load_queries(queries, a->q + first_query * a->stride, a->stride, rows, a->scale, KERNEL_HEAD);
    load_queries(d_outs, a->d_out + first_query * a->out_stride, a->out_stride, rows, 1.0f, KERNEL_HEAD);
    vfloat max, sum;
    block_statistics(a, queries, first_query, first_key, end_key, &max, &sum);
    vfloat inverse = vf_div(vf_set1(1.0f), sum);
    vfloat output_dots = block_output_dots(a, first_query, rows), scale = vf_set1(a->scale);
    for (size_t tile = first_key; tile < end_key; tile += ATTENTION_TILE) {
        size_t count = end_key - tile < ATTENTION_TILE ? end_key - tile : ATTENTION_TILE;
        tile_scores(p, queries, a->k + tile * a->stride, a->stride, count, KERNEL_HEAD);
        if (a->causal) mask_future(p, count, tile, first_query);
        tile_scores(ds, d_outs, a->v + tile * a->stride, a->stride, count, KERNEL_HEAD);
        for (size_t j = 0; j < count; ++j) {
            vfloat probability = vf_mul(exp_ps(vf_sub(vf_load(p[j]), max)), inverse);
            vfloat d_probability = vf_sub(vf_load(ds[j]), output_dots);
            vf_store(p[j], probability);
            vf_store(ds[j], vf_mul(vf_mul(scale, probability), d_probability));
        }
        add_weighted_rows(d_query, NULL, ds, a->k + tile * a->stride, a->stride, count,
                          KERNEL_HEAD); /* d_query += ds k */
        key_gradients(a, p, ds, first_query, rows, tile, count);
    }
    for (size_t chunk = 0; chunk < KERNEL_HEAD; chunk += LANES) {
        vfloat block[LANES];
#pragma GCC unroll 16
        for (size_t d = 0; d < LANES; ++d)
            block[d] = vf_load(d_query[chunk + d]);
        transpose(block);
#pragma GCC unroll 16
        for (size_t i = 0; i < LANES; ++i)
            if (i < rows) vf_storeu(a->d_q + (first_query + i) * a->stride + chunk, block[i]);
    }
}

/* d_k and d_v of the items' rows are zeroed, then accumulated block by block. */
void PATH_KERNEL(attention_backward)(kernel_attention_backward_t const *attention, size_t item_begin,
                                     size_t item_end) {
    for (size_t item = item_begin; item < item_end; ++item) {
        size_t first = attention->offsets[item], end = attention->offsets[item + 1];
        kernel_attention_backward_clear(attention, first, end);
        for (size_t block = first; block < end; block += LANES) {
            size_t rows = end - block < LANES ? end - block : LANES;
            attention_backward_block(attention, block, rows, first, attention->causal ? block + rows : end);
        }
    }
}
