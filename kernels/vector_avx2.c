/* The AVX2 (with FMA) path of the non-GEMM kernels, 8 F32 lanes per vector; F32 tails are handled with
 * masked loads and stores, 16-bit tails with the exact scalar helpers. Sums of squares and softmax
 * denominators are accumulated in double as on the scalar path.
 *
 * Attention takes a block of 8 queries at a time with one lane per query: the block's queries are
 * transposed once, so that the scores of a key against all 8 queries, the running max, the running sum
 * and the rescaling of the online softmax are plain lane-wise vector operations, and the weighted sum of
 * values is kept transposed too ([64 dims][8 queries]) until the block's rows are written out.
 *
 * The loops marked `#pragma GCC unroll` run over a fixed number of vectors: unrolled, their arrays of
 * vectors stay in registers (gcc -O2 would keep them in memory). */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "math_avx2.h"
#include "paths.h"

#define LANES          8
#define ATTENTION_TILE 64 /* keys per tile of the online softmax */
#define SCORE_GROUP    8  /* keys scored together: independent FMA chains hide the FMA latency */

/* All lanes below `left` set (all when left >= 8), for maskload and maskstore. */
static inline __m256i tail_mask(size_t left) {
    static int32_t const ones[2 * LANES] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    return _mm256_loadu_si256((__m256i const *)(ones + LANES - (left < LANES ? left : LANES)));
}

static inline float reduce_max(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

static inline double reduce_add(__m256d v) {
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

/* Accumulates x^2 for 8 values into two double vectors. */
static inline void add_squares(__m256 x, __m256d *low, __m256d *high) {
    __m256d first = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    __m256d second = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    *low = _mm256_fmadd_pd(first, first, *low);
    *high = _mm256_fmadd_pd(second, second, *high);
}

static double sum_squares(float const *x, size_t n) {
    __m256d low = _mm256_setzero_pd(), high = _mm256_setzero_pd();
    for (size_t i = 0; i < n; i += LANES)
        add_squares(_mm256_maskload_ps(x + i, tail_mask(n - i)), &low, &high);
    return reduce_add(_mm256_add_pd(low, high));
}

/* x[0, n) *= factor */
static void scale_in_place(float *x, size_t n, float factor) {
    __m256 by = _mm256_set1_ps(factor);
    for (size_t i = 0; i < n; i += LANES) {
        __m256i mask = tail_mask(n - i);
        _mm256_maskstore_ps(x + i, mask, _mm256_mul_ps(_mm256_maskload_ps(x + i, mask), by));
    }
}

void kernel_rmsnorm_avx2(float *y, size_t y_stride, float const *x, size_t x_stride, float const *weight,
                         size_t rows, size_t n, float eps) {
    for (size_t r = 0; r < rows; ++r, y += y_stride, x += x_stride) {
        __m256 inverse = _mm256_set1_ps((float)(1.0 / sqrt(sum_squares(x, n) / (double)n + eps)));
        for (size_t i = 0; i < n; i += LANES) {
            __m256i mask = tail_mask(n - i);
            __m256 v = _mm256_mul_ps(_mm256_maskload_ps(x + i, mask), inverse);
            _mm256_maskstore_ps(y + i, mask, _mm256_mul_ps(v, _mm256_maskload_ps(weight + i, mask)));
        }
    }
}

/* ---- Attention ---------------------------------------------------------------------------------- */

/* In-register transpose of an 8 x 8 block held as 8 rows: interleave pairs of rows, then pairs of pairs
 * within 128-bit lanes, then exchange the 128-bit lanes. */
static inline void transpose(__m256 rows[LANES]) {
    __m256 t[LANES];
#pragma GCC unroll 8
    for (size_t k = 0; k < LANES; k += 2) {
        t[k] = _mm256_unpacklo_ps(rows[k], rows[k + 1]);
        t[k + 1] = _mm256_unpackhi_ps(rows[k], rows[k + 1]);
    }
#pragma GCC unroll 8
    for (size_t k = 0; k < LANES; k += 4) {
        rows[k] = _mm256_shuffle_ps(t[k], t[k + 2], 0x44);
        rows[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], 0xee);
        rows[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0x44);
        rows[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0xee);
    }
#pragma GCC unroll 8
    for (size_t c = 0; c < LANES / 2; ++c) {
        t[c] = _mm256_permute2f128_ps(rows[c], rows[c + 4], 0x20);
        t[c + 4] = _mm256_permute2f128_ps(rows[c], rows[c + 4], 0x31);
    }
#pragma GCC unroll 8
    for (size_t k = 0; k < LANES; ++k)
        rows[k] = t[k];
}

/* The queries of one block, transposed and scaled: [64 dims][8 queries], lanes past `rows` zero. */
static void load_queries(float queries[KERNEL_HEAD][LANES], float const *q, size_t stride, size_t rows,
                         float scale) {
    __m256 by = _mm256_set1_ps(scale);
    for (size_t chunk = 0; chunk < KERNEL_HEAD; chunk += LANES) {
        __m256 block[LANES];
#pragma GCC unroll 8
        for (size_t i = 0; i < LANES; ++i)
            block[i] =
                i < rows ? _mm256_mul_ps(_mm256_loadu_ps(q + i * stride + chunk), by) : _mm256_setzero_ps();
        transpose(block);
#pragma GCC unroll 8
        for (size_t d = 0; d < LANES; ++d)
            _mm256_store_ps(queries[chunk + d], block[d]);
    }
}

/* scores[j][i] = queries[.][i] . k[j] for the SCORE_GROUP keys j whose rows are `keys[j]`. */
static inline void score_group(float scores[SCORE_GROUP][LANES], float const queries[KERNEL_HEAD][LANES],
                               float const *const keys[SCORE_GROUP]) {
    __m256 sums[SCORE_GROUP];
#pragma GCC unroll 16
    for (size_t j = 0; j < SCORE_GROUP; ++j)
        sums[j] = _mm256_setzero_ps();
    for (size_t d = 0; d < KERNEL_HEAD; ++d) {
        __m256 query = _mm256_load_ps(queries[d]);
#pragma GCC unroll 16
        for (size_t j = 0; j < SCORE_GROUP; ++j)
            sums[j] = _mm256_fmadd_ps(_mm256_broadcast_ss(keys[j] + d), query, sums[j]);
    }
#pragma GCC unroll 16
    for (size_t j = 0; j < SCORE_GROUP; ++j)
        _mm256_store_ps(scores[j], sums[j]);
}

/* Scores of the tile's `count` keys (rows of k at `stride`) against the block's queries: [64 keys][8].
 * A last, partial group repeats the tile's last key; those extra scores are never read. */
static void tile_scores(float scores[ATTENTION_TILE][LANES], float const queries[KERNEL_HEAD][LANES],
                        float const *k, size_t stride, size_t count) {
    for (size_t j = 0; j < count; j += SCORE_GROUP) {
        float const *keys[SCORE_GROUP];
        for (size_t g = 0; g < SCORE_GROUP; ++g)
            keys[g] = k + (j + g < count ? j + g : count - 1) * stride;
        score_group(scores + j, queries, keys);
    }
}

/* Causal attention: query lane i of a block starting at row `first_query` sees key `first_key + j` only
 * when first_key + j <= first_query + i; the other scores become -inf. */
static void mask_future(float scores[ATTENTION_TILE][LANES], size_t count, size_t first_key,
                        size_t first_query) {
    __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (size_t j = 0; j < count; ++j) {
        if (first_key + j <= first_query) continue;
        __m256i future = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(first_key + j - first_query)), lane);
        __m256 masked = _mm256_blendv_ps(_mm256_load_ps(scores[j]), _mm256_set1_ps(-INFINITY),
                                         _mm256_castsi256_ps(future));
        _mm256_store_ps(scores[j], masked);
    }
}

/* Online softmax state of a block: per query lane the running max and sum of exp(score - max), and the
 * exp-weighted sum of values, transposed [64 dims][8 queries]. */
typedef struct online_block {
    __m256 max, sum;
    _Alignas(32) float values[KERNEL_HEAD][LANES];
} online_block_t;

/* Turns the tile's scores into weights exp(score - new max) in place, raising the running max; answers
 * the factor exp(old max - new max) that rescales what was accumulated before. */
static __m256 tile_weights(online_block_t *state, float scores[ATTENTION_TILE][LANES], size_t count) {
    __m256 max = state->max;
    for (size_t j = 0; j < count; ++j)
        max = _mm256_max_ps(max, _mm256_load_ps(scores[j]));
    __m256 correction = exp_ps(_mm256_sub_ps(state->max, max));
    __m256 sum = _mm256_mul_ps(state->sum, correction);
    for (size_t j = 0; j < count; ++j) {
        __m256 weight = exp_ps(_mm256_sub_ps(_mm256_load_ps(scores[j]), max));
        _mm256_store_ps(scores[j], weight);
        sum = _mm256_add_ps(sum, weight);
    }
    state->max = max;
    state->sum = sum;
    return correction;
}

/* values[d][i] = values[d][i] * correction[i] + sum_j weights[j][i] * v[j][d], 8 dims at a time. */
static void accumulate_values(online_block_t *state, __m256 correction,
                              float const weights[ATTENTION_TILE][LANES], float const *v, size_t stride,
                              size_t count) {
    for (size_t chunk = 0; chunk < KERNEL_HEAD; chunk += LANES) {
        __m256 sums[LANES];
#pragma GCC unroll 16
        for (size_t d = 0; d < LANES; ++d)
            sums[d] = _mm256_mul_ps(_mm256_load_ps(state->values[chunk + d]), correction);
        for (size_t j = 0; j < count; ++j) {
            __m256 weight = _mm256_load_ps(weights[j]);
            float const *value = v + j * stride + chunk;
#pragma GCC unroll 16
            for (size_t d = 0; d < LANES; ++d)
                sums[d] = _mm256_fmadd_ps(_mm256_broadcast_ss(value + d), weight, sums[d]);
        }
#pragma GCC unroll 16
        for (size_t d = 0; d < LANES; ++d)
            _mm256_store_ps(state->values[chunk + d], sums[d]);
    }
}

/* out rows [0, rows) = values / sum, transposed back. */
static void store_block(float *out, size_t out_stride, online_block_t const *state, size_t rows) {
    __m256 inverse = _mm256_div_ps(_mm256_set1_ps(1.0f), state->sum);
    for (size_t chunk = 0; chunk < KERNEL_HEAD; chunk += LANES) {
        __m256 block[LANES];
#pragma GCC unroll 8
        for (size_t d = 0; d < LANES; ++d)
            block[d] = _mm256_mul_ps(_mm256_load_ps(state->values[chunk + d]), inverse);
        transpose(block);
#pragma GCC unroll 8
        for (size_t i = 0; i < LANES; ++i)
            if (i < rows) _mm256_storeu_ps(out + i * out_stride + chunk, block[i]);
    }
}

/* Queries [first_query, first_query + rows) of the item whose keys are rows [first_key, end_key). */
static void attend_block(kernel_attention_t const *a, size_t first_query, size_t rows, size_t first_key,
                         size_t end_key) {
    _Alignas(32) float queries[KERNEL_HEAD][LANES];
    _Alignas(32) float scores[ATTENTION_TILE][LANES];
    online_block_t state = {.max = _mm256_set1_ps(-INFINITY), .sum = _mm256_setzero_ps()};
    memset(state.values, 0, sizeof state.values);
    load_queries(queries, a->q + first_query * a->stride, a->stride, rows, a->scale);
    for (size_t tile = first_key; tile < end_key; tile += ATTENTION_TILE) {
        size_t count = end_key - tile < ATTENTION_TILE ? end_key - tile : ATTENTION_TILE;
        tile_scores(scores, queries, a->k + tile * a->stride, a->stride, count);
        if (a->causal) mask_future(scores, count, tile, first_query);
        __m256 correction = tile_weights(&state, scores, count);
        accumulate_values(&state, correction, scores, a->v + tile * a->stride, a->stride, count);
    }
    store_block(a->out + first_query * a->out_stride, a->out_stride, &state, rows);
}

/* Blocks start at the item's first row, so a causal block's tiles (multiples of 64 rows from there) all
 * begin at or before its first query: every lane sees at least one key in every tile. */
void kernel_attention_avx2(kernel_attention_t const *attention, size_t item_begin, size_t item_end) {
    for (size_t item = item_begin; item < item_end; ++item) {
        size_t first = attention->offsets[item], end = attention->offsets[item + 1];
        for (size_t block = first; block < end; block += LANES) {
            size_t rows = end - block < LANES ? end - block : LANES;
            attend_block(attention, block, rows, first, attention->causal ? block + rows : end);
        }
    }
}

/* ---- Softmax, normalize ------------------------------------------------------------------------- */

void kernel_softmax_avx2(float *x, size_t n) {
    __m256 const empty = _mm256_set1_ps(-INFINITY);
    __m256 max = empty;
    for (size_t i = 0; i < n; i += LANES) {
        __m256i mask = tail_mask(n - i);
        __m256 v = _mm256_blendv_ps(empty, _mm256_maskload_ps(x + i, mask), _mm256_castsi256_ps(mask));
        max = _mm256_max_ps(max, v);
    }
    max = _mm256_set1_ps(reduce_max(max));
    __m256d low = _mm256_setzero_pd(), high = _mm256_setzero_pd();
    for (size_t i = 0; i < n; i += LANES) {
        __m256i mask = tail_mask(n - i);
        __m256 weight = exp_ps(_mm256_sub_ps(_mm256_maskload_ps(x + i, mask), max));
        weight = _mm256_and_ps(weight, _mm256_castsi256_ps(mask));
        _mm256_maskstore_ps(x + i, mask, weight);
        low = _mm256_add_pd(low, _mm256_cvtps_pd(_mm256_castps256_ps128(weight)));
        high = _mm256_add_pd(high, _mm256_cvtps_pd(_mm256_extractf128_ps(weight, 1)));
    }
    scale_in_place(x, n, (float)(1.0 / reduce_add(_mm256_add_pd(low, high))));
}

void kernel_normalize_avx2(float *x, size_t n) {
    double squares = sum_squares(x, n);
    if (squares == 0.0) return;
    scale_in_place(x, n, (float)(1.0 / sqrt(squares)));
}

/* ---- Conversions -------------------------------------------------------------------------------- */

void kernel_bf16_to_f32_avx2(float *out, uint16_t const *x, size_t n) {
    size_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((__m128i const *)(x + i)));
        _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16)));
    }
    for (; i < n; ++i)
        out[i] = bf16_to_f32(x[i]);
}

/* The bits of f32_to_bf16 (kernels.h) for 8 values: round to nearest even, a NaN kept quiet. */
static inline __m128i bf16_of(__m256 x) {
    __m256i bits = _mm256_castps_si256(x);
    __m256i high = _mm256_srli_epi32(bits, 16);
    /* magnitude > 0x7f800000 as signed int32: the magnitude's top bit is clear */
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff)),
                                     _mm256_set1_epi32(0x7f800000));
    __m256i bias = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(high, _mm256_set1_epi32(1)));
    __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, bias), 16);
    __m256i quiet = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
    __m256i halves = _mm256_blendv_epi8(rounded, quiet, nan);
    return _mm_packus_epi32(_mm256_castsi256_si128(halves), _mm256_extracti128_si256(halves, 1));
}

void kernel_f32_to_bf16_avx2(uint16_t *out, float const *x, size_t n) {
    size_t i = 0;
    for (; i + LANES <= n; i += LANES)
        _mm_storeu_si128((__m128i *)(out + i), bf16_of(_mm256_loadu_ps(x + i)));
    for (; i < n; ++i)
        out[i] = f32_to_bf16(x[i]);
}

/* ---- Training ------------------------------------------------------------------------------------ */

static inline float reduce_add_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* rmsnorm_backward as kernel_rmsnorm_backward_scalar: 1/r and sum(weight dy x) in double, then
 * dx = weight dy / r - x sum(weight dy x) / (n r^3) and d_weight += dy x / r in F32, 8 lanes at a time. */
void kernel_rmsnorm_backward_avx2(float *dx, size_t dx_stride, float *d_weight, float const *dy,
                                  size_t dy_stride, float const *x, size_t x_stride, float const *weight,
                                  size_t rows, size_t n, float eps) {
    for (size_t r = 0; r < rows; ++r, dx += dx_stride, dy += dy_stride, x += x_stride) {
        __m256d squares[2] = {_mm256_setzero_pd(), _mm256_setzero_pd()};
        __m256d dots[2] = {_mm256_setzero_pd(), _mm256_setzero_pd()};
        for (size_t i = 0; i < n; i += LANES) {
            __m256i mask = tail_mask(n - i);
            __m256 values = _mm256_maskload_ps(x + i, mask), gradients = _mm256_maskload_ps(dy + i, mask);
            __m256 weights = _mm256_maskload_ps(weight + i, mask);
            __m128 halves_x[2] = {_mm256_castps256_ps128(values), _mm256_extractf128_ps(values, 1)};
            __m128 halves_g[2] = {_mm256_castps256_ps128(gradients), _mm256_extractf128_ps(gradients, 1)};
            __m128 halves_w[2] = {_mm256_castps256_ps128(weights), _mm256_extractf128_ps(weights, 1)};
            for (size_t h = 0; h < 2; ++h) {
                __m256d value = _mm256_cvtps_pd(halves_x[h]);
                __m256d product = _mm256_mul_pd(_mm256_cvtps_pd(halves_w[h]), _mm256_cvtps_pd(halves_g[h]));
                squares[h] = _mm256_fmadd_pd(value, value, squares[h]);
                dots[h] = _mm256_fmadd_pd(product, value, dots[h]);
            }
        }
        double inverse = 1.0 / sqrt(reduce_add(_mm256_add_pd(squares[0], squares[1])) / (double)n + eps);
        double dot = reduce_add(_mm256_add_pd(dots[0], dots[1]));
        __m256 by = _mm256_set1_ps((float)inverse);
        __m256 coefficient = _mm256_set1_ps((float)(dot / (double)n * inverse * inverse * inverse));
        for (size_t i = 0; i < n; i += LANES) {
            __m256i mask = tail_mask(n - i);
            __m256 values = _mm256_maskload_ps(x + i, mask), gradients = _mm256_maskload_ps(dy + i, mask);
            __m256 weights = _mm256_maskload_ps(weight + i, mask);
            __m256 d_weights = _mm256_maskload_ps(d_weight + i, mask);
            d_weights = _mm256_add_ps(d_weights, _mm256_mul_ps(_mm256_mul_ps(gradients, values), by));
            _mm256_maskstore_ps(d_weight + i, mask, d_weights);
            __m256 scaled = _mm256_mul_ps(_mm256_mul_ps(weights, gradients), by);
            _mm256_maskstore_ps(dx + i, mask, _mm256_sub_ps(scaled, _mm256_mul_ps(values, coefficient)));
        }
    }
}

void kernel_gelu_avx2(float *x, size_t n) {
    for (size_t i = 0; i < n; i += LANES) {
        __m256i mask = tail_mask(n - i);
        _mm256_maskstore_ps(x + i, mask, gelu_ps(_mm256_maskload_ps(x + i, mask)));
    }
}

/* gelu'(x) = 0.5(1 + t) + 0.5x(1 - t^2) sqrt(2/pi)(1 + 3 0.044715x^2), t = tanh(u), rewritten with
 * s = 1 / (1 + e), e = exp(-2u): 0.5(1 + t) = s and 0.5(1 - t^2) = 2 e s^2, so
 * gelu'(x) = s (1 + 2x (e s) sqrt(2/pi)(1 + 0.134145x^2)), free of the cancellations of 1 + t and
 * 1 - t^2 (e s = 1 - s stays finite where e is clamped). */
static inline __m256 gelu_derivative_ps(__m256 x) {
    __m256 x2 = _mm256_mul_ps(x, x);
    __m256 u =
        _mm256_mul_ps(x, _mm256_fmadd_ps(x2, _mm256_set1_ps(0.0356774081f), _mm256_set1_ps(0.797884561f)));
    __m256 e = exp_ps(_mm256_mul_ps(u, _mm256_set1_ps(-2.0f)));
    __m256 s = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(e, _mm256_set1_ps(1.0f)));
    __m256 slope = _mm256_fmadd_ps(x2, _mm256_set1_ps(0.107032224f), _mm256_set1_ps(0.797884561f));
    __m256 r = _mm256_mul_ps(_mm256_mul_ps(_mm256_add_ps(x, x), _mm256_mul_ps(e, s)), slope);
    return _mm256_fmadd_ps(s, r, s);
}

void kernel_gelu_backward_avx2(float *dx, float const *dy, float const *x, size_t n) {
    for (size_t i = 0; i < n; i += LANES) {
        __m256i mask = tail_mask(n - i);
        __m256 derivative = gelu_derivative_ps(_mm256_maskload_ps(x + i, mask));
        _mm256_maskstore_ps(dx + i, mask, _mm256_mul_ps(_mm256_maskload_ps(dy + i, mask), derivative));
    }
}

/* The attention backward pass takes a block of 8 queries at a time, one lane per query, as the forward
 * pass does: a first sweep over the keys recomputes each lane's softmax max and sum, a second recomputes
 * the probabilities P [keys][8] and dP = dO v^T [keys][8] (dO transposed like the queries), forms
 * dS = scale P (dP - rowsum(dO O)), and accumulates dQ += dS k transposed [64 dims][8], and per key
 * dV += P^T dO and dK += dS^T q over the block's rows, in ascending order. */

/* Each lane's max of the scores and sum of exp(score - max) over keys [first_key, end_key), folded tile
 * by tile (every lane sees a key in every tile: see kernel_attention_avx2). */
static void block_statistics(kernel_attention_backward_t const *a, float const queries[KERNEL_HEAD][LANES],
                             size_t first_query, size_t first_key, size_t end_key, __m256 *max, __m256 *sum) {
    _Alignas(32) float scores[ATTENTION_TILE][LANES];
    __m256 running_max = _mm256_set1_ps(-INFINITY), running_sum = _mm256_setzero_ps();
    for (size_t tile = first_key; tile < end_key; tile += ATTENTION_TILE) {
        size_t count = end_key - tile < ATTENTION_TILE ? end_key - tile : ATTENTION_TILE;
        tile_scores(scores, queries, a->k + tile * a->stride, a->stride, count);
        if (a->causal) mask_future(scores, count, tile, first_query);
        __m256 tile_max = running_max;
        for (size_t j = 0; j < count; ++j)
            tile_max = _mm256_max_ps(tile_max, _mm256_load_ps(scores[j]));
        running_sum = _mm256_mul_ps(running_sum, exp_ps(_mm256_sub_ps(running_max, tile_max)));
        for (size_t j = 0; j < count; ++j)
            running_sum =
                _mm256_add_ps(running_sum, exp_ps(_mm256_sub_ps(_mm256_load_ps(scores[j]), tile_max)));
        running_max = tile_max;
    }
    *max = running_max;
    *sum = running_sum;
}

/* rowsum(dO O) of the block's rows [0, rows) as lanes, zero past `rows`. */
static __m256 block_output_dots(kernel_attention_backward_t const *a, size_t first_query, size_t rows) {
    _Alignas(32) float dots[LANES] = {0};
    for (size_t i = 0; i < rows; ++i) {
        float const *d_out = a->d_out + (first_query + i) * a->out_stride;
        float const *out = a->out + (first_query + i) * a->out_stride;
        __m256 sum = _mm256_mul_ps(_mm256_loadu_ps(d_out), _mm256_loadu_ps(out));
        for (size_t d = LANES; d < KERNEL_HEAD; d += LANES)
            sum = _mm256_fmadd_ps(_mm256_loadu_ps(d_out + d), _mm256_loadu_ps(out + d), sum);
        dots[i] = reduce_add_ps(sum);
    }
    return _mm256_load_ps(dots);
}

/* d_v[j] += sum_i p[j][i] dO[i] and d_k[j] += sum_i ds[j][i] q[i] over the block's rows i < rows, for the
 * tile's `count` keys, 32 dims at a time: 8 accumulator chains. */
static void key_gradients(kernel_attention_backward_t const *a, float const p[ATTENTION_TILE][LANES],
                          float const ds[ATTENTION_TILE][LANES], size_t first_query, size_t rows, size_t tile,
                          size_t count) {
    enum { HALF = KERNEL_HEAD / 2, VECTORS = HALF / LANES };
    for (size_t j = 0; j < count; ++j) {
        for (size_t half = 0; half < KERNEL_HEAD; half += HALF) {
            float *d_value = a->d_v + (tile + j) * a->stride + half;
            float *d_key = a->d_k + (tile + j) * a->stride + half;
            __m256 values[VECTORS], keys[VECTORS];
#pragma GCC unroll 4
            for (size_t c = 0; c < VECTORS; ++c) {
                values[c] = _mm256_loadu_ps(d_value + c * LANES);
                keys[c] = _mm256_loadu_ps(d_key + c * LANES);
            }
            for (size_t i = 0; i < rows; ++i) {
                float const *d_out = a->d_out + (first_query + i) * a->out_stride + half;
                float const *query = a->q + (first_query + i) * a->stride + half;
                __m256 probability = _mm256_set1_ps(p[j][i]), d_score = _mm256_set1_ps(ds[j][i]);
#pragma GCC unroll 4
                for (size_t c = 0; c < VECTORS; ++c) {
                    values[c] = _mm256_fmadd_ps(probability, _mm256_loadu_ps(d_out + c * LANES), values[c]);
                    keys[c] = _mm256_fmadd_ps(d_score, _mm256_loadu_ps(query + c * LANES), keys[c]);
                }
            }
#pragma GCC unroll 4
            for (size_t c = 0; c < VECTORS; ++c) {
                _mm256_storeu_ps(d_value + c * LANES, values[c]);
                _mm256_storeu_ps(d_key + c * LANES, keys[c]);
            }
        }
    }
}

/* d_query[d][i] += sum_j ds[j][i] k[j][d], 8 dims at a time. */
static void query_gradients(float d_query[KERNEL_HEAD][LANES], float const ds[ATTENTION_TILE][LANES],
                            float const *k, size_t stride, size_t count) {
    for (size_t chunk = 0; chunk < KERNEL_HEAD; chunk += LANES) {
        __m256 sums[LANES];
#pragma GCC unroll 8
        for (size_t d = 0; d < LANES; ++d)
            sums[d] = _mm256_load_ps(d_query[chunk + d]);
        for (size_t j = 0; j < count; ++j) {
            __m256 d_score = _mm256_load_ps(ds[j]);
            float const *key = k + j * stride + chunk;
#pragma GCC unroll 8
            for (size_t d = 0; d < LANES; ++d)
                sums[d] = _mm256_fmadd_ps(_mm256_broadcast_ss(key + d), d_score, sums[d]);
        }
#pragma GCC unroll 8
        for (size_t d = 0; d < LANES; ++d)
            _mm256_store_ps(d_query[chunk + d], sums[d]);
    }
}

/* Queries [first_query, first_query + rows) of the item whose keys are rows [first_key, end_key). */
static void attention_backward_block(kernel_attention_backward_t const *a, size_t first_query, size_t rows,
                                     size_t first_key, size_t end_key) {
    _Alignas(32) float queries[KERNEL_HEAD][LANES], d_outs[KERNEL_HEAD][LANES];
    _Alignas(32) float p[ATTENTION_TILE][LANES], ds[ATTENTION_TILE][LANES];
    _Alignas(32) float d_query[KERNEL_HEAD][LANES];
    memset(d_query, 0, sizeof d_query);
    load_queries(queries, a->q + first_query * a->stride, a->stride, rows, a->scale);
    load_queries(d_outs, a->d_out + first_query * a->out_stride, a->out_stride, rows, 1.0f);
    __m256 max, sum;
    block_statistics(a, queries, first_query, first_key, end_key, &max, &sum);
    __m256 inverse = _mm256_div_ps(_mm256_set1_ps(1.0f), sum);
    __m256 output_dots = block_output_dots(a, first_query, rows), scale = _mm256_set1_ps(a->scale);
    for (size_t tile = first_key; tile < end_key; tile += ATTENTION_TILE) {
        size_t count = end_key - tile < ATTENTION_TILE ? end_key - tile : ATTENTION_TILE;
        tile_scores(p, queries, a->k + tile * a->stride, a->stride, count);
        if (a->causal) mask_future(p, count, tile, first_query);
        tile_scores(ds, d_outs, a->v + tile * a->stride, a->stride, count);
        for (size_t j = 0; j < count; ++j) {
            __m256 probability = _mm256_mul_ps(exp_ps(_mm256_sub_ps(_mm256_load_ps(p[j]), max)), inverse);
            __m256 d_probability = _mm256_sub_ps(_mm256_load_ps(ds[j]), output_dots);
            _mm256_store_ps(p[j], probability);
            _mm256_store_ps(ds[j], _mm256_mul_ps(_mm256_mul_ps(scale, probability), d_probability));
        }
        query_gradients(d_query, ds, a->k + tile * a->stride, a->stride, count);
        key_gradients(a, p, ds, first_query, rows, tile, count);
    }
    for (size_t chunk = 0; chunk < KERNEL_HEAD; chunk += LANES) {
        __m256 block[LANES];
#pragma GCC unroll 8
        for (size_t d = 0; d < LANES; ++d)
            block[d] = _mm256_load_ps(d_query[chunk + d]);
        transpose(block);
#pragma GCC unroll 8
        for (size_t i = 0; i < LANES; ++i)
            if (i < rows) _mm256_storeu_ps(a->d_q + (first_query + i) * a->stride + chunk, block[i]);
    }
}

void kernel_attention_backward_avx2(kernel_attention_backward_t const *attention, size_t item_begin,
                                    size_t item_end) {
    for (size_t item = item_begin; item < item_end; ++item) {
        size_t first = attention->offsets[item], end = attention->offsets[item + 1];
        for (size_t row = first; row < end; ++row) {
            memset(attention->d_k + row * attention->stride, 0, KERNEL_HEAD * sizeof(float));
            memset(attention->d_v + row * attention->stride, 0, KERNEL_HEAD * sizeof(float));
        }
        for (size_t block = first; block < end; block += LANES) {
            size_t rows = end - block < LANES ? end - block : LANES;
            attention_backward_block(attention, block, rows, first, attention->causal ? block + rows : end);
        }
    }
}
