/* The NEON path of the non-GEMM kernels (baseline ARMv8-A Advanced SIMD), 4 F32 lanes per vector; F32
 * tails go through a padded copy (NEON has no masked loads or stores), 16-bit tails through the exact
 * scalar helpers. Sums of values and of squares and softmax denominators are accumulated in double as on the
 * scalar path.
 *
 * Attention takes a block of 8 queries at a time, in two vectors with one lane per query: the block's
 * queries are transposed once, so that the scores of a key against all 8 queries, the running max, the
 * running sum and the rescaling of the online softmax are plain lane-wise vector operations, and the
 * weighted sum of values is kept transposed too ([head dims][8 queries]) until the block's rows are
 * written out. A relative-position bias (kernel_attention_t.bias) is added to a tile's scores before the
 * causal mask: for one key, the block's lanes take a contiguous run of the table. Heads of any width to
 * KERNEL_HEAD_MAX.
 *
 * The loops marked `#pragma GCC unroll` run over a fixed number of vectors: unrolled, their arrays of
 * vectors stay in registers. */
#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "math_neon.h"
#include "paths.h"

#define LANES          4
#define QUERIES        8  /* queries per attention block: two vectors */
#define ATTENTION_TILE 64 /* keys per tile of the online softmax */
#define SCORE_GROUP    8  /* keys scored together: 16 independent FMA chains hide the FMA latency */

/* x[0, left) in the first lanes (all 4 when left >= 4), `fill` in the others. */
static inline float32x4_t load_tail(float const *x, size_t left, float fill) {
    if (left >= LANES) return vld1q_f32(x);
    float padded[LANES] = {fill, fill, fill, fill};
    memcpy(padded, x, left * sizeof(float));
    return vld1q_f32(padded);
}

/* x[0, left) = the first lanes of v (all 4 when left >= 4). */
static inline void store_tail(float *x, size_t left, float32x4_t v) {
    if (left >= LANES) {
        vst1q_f32(x, v);
        return;
    }
    float padded[LANES];
    vst1q_f32(padded, v);
    memcpy(x, padded, left * sizeof(float));
}

/* Accumulates x^2 for 4 values into two double vectors. */
static inline void add_squares(float32x4_t x, float64x2_t *low, float64x2_t *high) {
    float64x2_t first = vcvt_f64_f32(vget_low_f32(x)), second = vcvt_high_f64_f32(x);
    *low = vfmaq_f64(*low, first, first);
    *high = vfmaq_f64(*high, second, second);
}

static double sum_squares(float const *x, size_t n) {
    float64x2_t low = vdupq_n_f64(0.0), high = vdupq_n_f64(0.0);
    for (size_t i = 0; i < n; i += LANES)
        add_squares(load_tail(x + i, n - i, 0.0f), &low, &high);
    return vaddvq_f64(vaddq_f64(low, high));
}

/* x[0, n) *= factor */
static void scale_in_place(float *x, size_t n, float factor) {
    for (size_t i = 0; i < n; i += LANES)
        store_tail(x + i, n - i, vmulq_n_f32(load_tail(x + i, n - i, 0.0f), factor));
}

void kernel_rmsnorm_neon(float *y, size_t y_stride, float const *x, size_t x_stride, float const *weight,
                         size_t rows, size_t n, float eps) {
    for (size_t r = 0; r < rows; ++r, y += y_stride, x += x_stride) {
        float inverse = (float)(1.0 / sqrt(sum_squares(x, n) / (double)n + eps));
        for (size_t i = 0; i < n; i += LANES) {
            float32x4_t v = vmulq_n_f32(load_tail(x + i, n - i, 0.0f), inverse);
            store_tail(y + i, n - i, vmulq_f32(v, load_tail(weight + i, n - i, 0.0f)));
        }
    }
}

/* The lanes below `left` (all 4 when left >= 4) set. */
static inline uint32x4_t tail_lanes(size_t left) {
    static uint32_t const lane_of[LANES] = {0, 1, 2, 3};
    return vcltq_u32(vld1q_u32(lane_of), vdupq_n_u32((uint32_t)(left < LANES ? left : LANES)));
}

/* x[0, left) - mean as (x - high) - low (kernel_layernorm_scalar), 0 in the lanes past `left`. */
static inline float32x4_t deviations(float const *x, size_t left, float high, float low) {
    float32x4_t deviation =
        vsubq_f32(vsubq_f32(load_tail(x, left, 0.0f), vdupq_n_f32(high)), vdupq_n_f32(low));
    return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(deviation), tail_lanes(left)));
}

/* layernorm as kernel_layernorm_scalar: the mean and the sum of squared deviations in double (the deviations
 * themselves in F32, (x - high) - low), then the output in F32, 4 lanes at a time. */
void kernel_layernorm_neon(float *y, size_t y_stride, float const *x, size_t x_stride, float const *weight,
                           float const *bias, size_t rows, size_t n, float eps) {
    for (size_t r = 0; r < rows; ++r, y += y_stride, x += x_stride) {
        float64x2_t sum_low = vdupq_n_f64(0.0), sum_high = vdupq_n_f64(0.0);
        for (size_t i = 0; i < n; i += LANES) {
            float32x4_t v = load_tail(x + i, n - i, 0.0f);
            sum_low = vaddq_f64(sum_low, vcvt_f64_f32(vget_low_f32(v)));
            sum_high = vaddq_f64(sum_high, vcvt_high_f64_f32(v));
        }
        double mean = vaddvq_f64(vaddq_f64(sum_low, sum_high)) / (double)n;
        float high = (float)mean, low = (float)(mean - high);
        float64x2_t squares_low = vdupq_n_f64(0.0), squares_high = vdupq_n_f64(0.0);
        for (size_t i = 0; i < n; i += LANES)
            add_squares(deviations(x + i, n - i, high, low), &squares_low, &squares_high);
        double variance = vaddvq_f64(vaddq_f64(squares_low, squares_high)) / (double)n;
        float inverse = (float)(1.0 / sqrt(variance + eps));
        for (size_t i = 0; i < n; i += LANES) {
            float32x4_t value = vmulq_n_f32(deviations(x + i, n - i, high, low), inverse);
            value = vmulq_f32(value, load_tail(weight + i, n - i, 0.0f));
            if (bias) value = vaddq_f32(value, load_tail(bias + i, n - i, 0.0f));
            store_tail(y + i, n - i, value);
        }
    }
}

/* ---- Attention ---------------------------------------------------------------------------------- */

/* In-register transpose of a 4 x 4 block held as 4 rows: interleave pairs of rows by lanes, then the
 * pairs by 64-bit halves. */
static inline void transpose(float32x4_t rows[LANES]) {
    float32x4_t t0 = vtrn1q_f32(rows[0], rows[1]), t1 = vtrn2q_f32(rows[0], rows[1]);
    float32x4_t t2 = vtrn1q_f32(rows[2], rows[3]), t3 = vtrn2q_f32(rows[2], rows[3]);
    float64x2_t d0 = vreinterpretq_f64_f32(t0), d1 = vreinterpretq_f64_f32(t1);
    float64x2_t d2 = vreinterpretq_f64_f32(t2), d3 = vreinterpretq_f64_f32(t3);
    rows[0] = vreinterpretq_f32_f64(vtrn1q_f64(d0, d2));
    rows[1] = vreinterpretq_f32_f64(vtrn1q_f64(d1, d3));
    rows[2] = vreinterpretq_f32_f64(vtrn2q_f64(d0, d2));
    rows[3] = vreinterpretq_f32_f64(vtrn2q_f64(d1, d3));
}

/* A head of `head` dims is walked in chunks: whole ones, then a last one of the remaining dims; loads and
 * stores go through load_tail and store_tail (plain vld1q and vst1q for whole chunks): no dim past the head
 * is read from q, k or v or written to out. The functions below take the head's width and are always inlined,
 * so that attention compiles twice: for KERNEL_HEAD, a constant that folds the last chunk away, and for any
 * other width. The block's arrays hold KERNEL_HEAD_MAX dims; those past the head, up to the next multiple of
 * 8, are zero. */

/* One chunk of `width` dims (width <= 4) of load_queries: queries [4 dims][8] from q at the chunk. */
static inline __attribute__((always_inline)) void load_queries_part(float queries[][QUERIES], float const *q,
                                                                    size_t stride, size_t rows, float scale,
                                                                    size_t width) {
    for (size_t half = 0; half < QUERIES; half += LANES) {
        float32x4_t block[LANES];
#pragma GCC unroll 4
        for (size_t i = 0; i < LANES; ++i)
            block[i] = half + i < rows ? vmulq_n_f32(load_tail(q + (half + i) * stride, width, 0.0f), scale)
                                       : vdupq_n_f32(0.0f);
        transpose(block);
#pragma GCC unroll 4
        for (size_t d = 0; d < LANES; ++d)
            vst1q_f32(queries[d] + half, block[d]);
    }
}

/* The queries of one block, transposed and scaled: [head dims][8 queries], lanes past `rows` zero, and the
 * dims past `head` to the next multiple of 4. */
static inline __attribute__((always_inline)) void
load_queries(float queries[][QUERIES], float const *q, size_t stride, size_t rows, float scale, size_t head) {
    size_t whole = head - head % LANES;
    for (size_t chunk = 0; chunk < whole; chunk += LANES)
        load_queries_part(queries + chunk, q + chunk, stride, rows, scale, LANES);
    if (head % LANES) load_queries_part(queries + whole, q + whole, stride, rows, scale, head % LANES);
}

/* scores[j][i] = queries[.][i] . k[j] over the head's dims, for the SCORE_GROUP keys from row k (rows at
 * `stride`), of which `count` are left in the tile: a last, partial group repeats the tile's last key, whose
 * extra scores are never read. */
static inline __attribute__((always_inline)) void score_group(float scores[SCORE_GROUP][QUERIES],
                                                              float const queries[][QUERIES], float const *k,
                                                              size_t stride, size_t count, size_t head) {
    float const *keys[SCORE_GROUP];
    for (size_t j = 0; j < SCORE_GROUP; ++j)
        keys[j] = k + (j < count ? j : count - 1) * stride;
    float32x4_t sums[SCORE_GROUP][2];
#pragma GCC unroll 8
    for (size_t j = 0; j < SCORE_GROUP; ++j)
        sums[j][0] = sums[j][1] = vdupq_n_f32(0.0f);
    for (size_t d = 0; d < head; ++d) {
        float32x4_t low = vld1q_f32(queries[d]), high = vld1q_f32(queries[d] + LANES);
#pragma GCC unroll 8
        for (size_t j = 0; j < SCORE_GROUP; ++j) {
            float key = keys[j][d];
            sums[j][0] = vfmaq_n_f32(sums[j][0], low, key);
            sums[j][1] = vfmaq_n_f32(sums[j][1], high, key);
        }
    }
#pragma GCC unroll 8
    for (size_t j = 0; j < SCORE_GROUP; ++j) {
        vst1q_f32(scores[j], sums[j][0]);
        vst1q_f32(scores[j] + LANES, sums[j][1]);
    }
}

/* Scores of the tile's `count` keys (rows of k at `stride`) against the block's queries: [64 keys][8]. */
static inline __attribute__((always_inline)) void tile_scores(float scores[ATTENTION_TILE][QUERIES],
                                                              float const queries[][QUERIES], float const *k,
                                                              size_t stride, size_t count, size_t head) {
    for (size_t j = 0; j < count; j += SCORE_GROUP)
        score_group(scores + j, queries, k + j * stride, stride, count - j, head);
}

/* Causal attention: query lane i of a block starting at row `first_query` sees key `first_key + j` only
 * when first_key + j <= first_query + i; the other scores become -inf. */
static void mask_future(float scores[ATTENTION_TILE][QUERIES], size_t count, size_t first_key,
                        size_t first_query) {
    static uint32_t const lane_of[QUERIES] = {0, 1, 2, 3, 4, 5, 6, 7};
    float32x4_t const hidden = vdupq_n_f32(-INFINITY);
    for (size_t j = 0; j < count; ++j) {
        if (first_key + j <= first_query) continue;
        uint32x4_t ahead = vdupq_n_u32((uint32_t)(first_key + j - first_query));
        for (size_t half = 0; half < QUERIES; half += LANES) {
            uint32x4_t future = vcltq_u32(vld1q_u32(lane_of + half), ahead);
            vst1q_f32(scores[j] + half, vbslq_f32(future, hidden, vld1q_f32(scores[j] + half)));
        }
    }
}

/* scores[j][i] += bias[(first_query + i) - (first_key + j)] for the tile's `count` keys, rows of one item
 * (kernel_attention_t.bias): for key j the lanes' entries are the run of 8 from
 * bias[first_query - first_key - j]. Lanes past the block's queries read entries the contract lets them
 * read, and their scores are never stored. */
static void add_position_bias(float scores[ATTENTION_TILE][QUERIES], float const *bias, size_t count,
                              size_t first_key, size_t first_query) {
    float const *run = bias + ((ptrdiff_t)first_query - (ptrdiff_t)first_key);
    for (size_t j = 0; j < count; ++j)
        for (size_t half = 0; half < QUERIES; half += LANES)
            vst1q_f32(scores[j] + half, vaddq_f32(vld1q_f32(scores[j] + half), vld1q_f32(run - j + half)));
}

/* Online softmax state of a block: per query lane the running max and sum of exp(score - max), and the
 * exp-weighted sum of values, transposed [head dims][8 queries]. */
typedef struct online_block {
    float32x4_t max[2], sum[2];
    _Alignas(16) float values[KERNEL_HEAD_MAX][QUERIES];
} online_block_t;

/* Turns the tile's scores into weights exp(score - new max) in place, raising the running max; answers
 * in `correction` the factor exp(old max - new max) that rescales what was accumulated before. */
static void tile_weights(online_block_t *state, float scores[ATTENTION_TILE][QUERIES], size_t count,
                         float32x4_t correction[2]) {
    for (size_t h = 0; h < 2; ++h) {
        float32x4_t max = state->max[h];
        for (size_t j = 0; j < count; ++j)
            max = vmaxq_f32(max, vld1q_f32(scores[j] + LANES * h));
        correction[h] = exp_ps(vsubq_f32(state->max[h], max));
        float32x4_t sum = vmulq_f32(state->sum[h], correction[h]);
        for (size_t j = 0; j < count; ++j) {
            float32x4_t weight = exp_ps(vsubq_f32(vld1q_f32(scores[j] + LANES * h), max));
            vst1q_f32(scores[j] + LANES * h, weight);
            sum = vaddq_f32(sum, weight);
        }
        state->max[h] = max;
        state->sum[h] = sum;
    }
}

/* One chunk of `width` dims (width <= 8) of accumulate_values, values and v at the chunk: the dims past
 * `width` are neither read from v nor written to values. */
static inline __attribute__((always_inline)) void
accumulate_part(float values[][QUERIES], float32x4_t const correction[2],
                float const weights[ATTENTION_TILE][QUERIES], float const *v, size_t stride, size_t count,
                size_t width) {
    float32x4_t sums[8][2];
#pragma GCC unroll 8
    for (size_t d = 0; d < 8; ++d)
#pragma GCC unroll 2
        for (size_t h = 0; h < 2; ++h)
            sums[d][h] =
                d < width ? vmulq_f32(vld1q_f32(values[d] + LANES * h), correction[h]) : vdupq_n_f32(0.0f);
    for (size_t j = 0; j < count; ++j) {
        float32x4_t low = vld1q_f32(weights[j]), high = vld1q_f32(weights[j] + LANES);
        float const *value = v + j * stride;
#pragma GCC unroll 8
        for (size_t d = 0; d < 8; ++d)
            if (d < width) {
                sums[d][0] = vfmaq_n_f32(sums[d][0], low, value[d]);
                sums[d][1] = vfmaq_n_f32(sums[d][1], high, value[d]);
            }
    }
#pragma GCC unroll 8
    for (size_t d = 0; d < 8; ++d)
#pragma GCC unroll 2
        for (size_t h = 0; h < 2; ++h)
            if (d < width) vst1q_f32(values[d] + LANES * h, sums[d][h]);
}

/* values[d][i] = values[d][i] * correction[i] + sum_j weights[j][i] * v[j][d] over the head's dims, 8 at a
 * time. */
static inline __attribute__((always_inline)) void
accumulate_values(online_block_t *state, float32x4_t const correction[2],
                  float const weights[ATTENTION_TILE][QUERIES], float const *v, size_t stride, size_t count,
                  size_t head) {
    size_t whole = head - head % 8;
    for (size_t chunk = 0; chunk < whole; chunk += 8)
        accumulate_part(state->values + chunk, correction, weights, v + chunk, stride, count, 8);
    if (head % 8)
        accumulate_part(state->values + whole, correction, weights, v + whole, stride, count, head % 8);
}

/* One chunk of `width` dims (width <= 4) of store_block, out and values at the chunk. */
static inline __attribute__((always_inline)) void store_block_part(float *out, size_t out_stride,
                                                                   float const values[][QUERIES],
                                                                   float32x4_t const inverse[2], size_t rows,
                                                                   size_t width) {
    for (size_t half = 0; half < QUERIES && half < rows; half += LANES) {
        float32x4_t block[LANES];
#pragma GCC unroll 4
        for (size_t d = 0; d < LANES; ++d)
            block[d] = vmulq_f32(vld1q_f32(values[d] + half), inverse[half / LANES]);
        transpose(block);
#pragma GCC unroll 4
        for (size_t i = 0; i < LANES; ++i)
            if (half + i < rows) store_tail(out + (half + i) * out_stride, width, block[i]);
    }
}

/* out rows [0, rows) = values / sum over the head's dims, transposed back. */
static inline __attribute__((always_inline)) void
store_block(float *out, size_t out_stride, online_block_t const *state, size_t rows, size_t head) {
    float32x4_t inverse[2];
    for (size_t h = 0; h < 2; ++h)
        inverse[h] = vdivq_f32(vdupq_n_f32(1.0f), state->sum[h]);
    size_t whole = head - head % LANES;
    for (size_t chunk = 0; chunk < whole; chunk += LANES)
        store_block_part(out + chunk, out_stride, state->values + chunk, inverse, rows, LANES);
    if (head % LANES)
        store_block_part(out + whole, out_stride, state->values + whole, inverse, rows, head % LANES);
}

/* Queries [first_query, first_query + rows) of the item whose keys are rows [first_key, end_key). */
static inline __attribute__((always_inline)) void attend_block(kernel_attention_t const *a,
                                                               size_t first_query, size_t rows,
                                                               size_t first_key, size_t end_key,
                                                               size_t head) {
    _Alignas(16) float queries[KERNEL_HEAD_MAX][QUERIES];
    _Alignas(16) float scores[ATTENTION_TILE][QUERIES];
    float32x4_t const none = vdupq_n_f32(-INFINITY), zero = vdupq_n_f32(0.0f);
    online_block_t state;
    state.max[0] = state.max[1] = none;
    state.sum[0] = state.sum[1] = zero;
    size_t padded = (head + 7) / 8 * 8;
    memset(state.values, 0, padded * sizeof state.values[0]);
    load_queries(queries, a->q + first_query * a->stride, a->stride, rows, a->scale, head);
    for (size_t tile = first_key; tile < end_key; tile += ATTENTION_TILE) {
        size_t count = end_key - tile < ATTENTION_TILE ? end_key - tile : ATTENTION_TILE;
        tile_scores(scores, queries, a->k + tile * a->stride, a->stride, count, head);
        if (a->bias) add_position_bias(scores, a->bias, count, tile, first_query);
        if (a->causal) mask_future(scores, count, tile, first_query);
        float32x4_t correction[2];
        tile_weights(&state, scores, count, correction);
        accumulate_values(&state, correction, scores, a->v + tile * a->stride, a->stride, count, head);
    }
    store_block(a->out + first_query * a->out_stride, a->out_stride, &state, rows, head);
}

/* The blocks of one item. Blocks start at the item's first row, so a causal block's tiles (multiples of 64
 * rows from there) all begin at or before its first query: every lane sees at least one key in every tile. */
static inline __attribute__((always_inline)) void attend_item(kernel_attention_t const *a, size_t item,
                                                              size_t head) {
    size_t first = a->offsets[item], end = a->offsets[item + 1];
    for (size_t block = first; block < end; block += QUERIES) {
        size_t rows = end - block < QUERIES ? end - block : QUERIES;
        attend_block(a, block, rows, first, a->causal ? block + rows : end, head);
    }
}

void kernel_attention_neon(kernel_attention_t const *attention, size_t item_begin, size_t item_end) {
    for (size_t item = item_begin; item < item_end; ++item) {
        if (attention->head == KERNEL_HEAD)
            attend_item(attention, item, KERNEL_HEAD);
        else
            attend_item(attention, item, attention->head);
    }
}

/* ---- Softmax, normalize ------------------------------------------------------------------------- */

/* The max ignores NaN like the scalar path's fmaxf; lanes past n are -inf, whose weight is exactly 0. */
void kernel_softmax_neon(float *x, size_t n) {
    float32x4_t max = vdupq_n_f32(-INFINITY);
    for (size_t i = 0; i < n; i += LANES)
        max = vmaxnmq_f32(max, load_tail(x + i, n - i, -INFINITY));
    float32x4_t largest = vdupq_n_f32(vmaxnmvq_f32(max));
    float64x2_t low = vdupq_n_f64(0.0), high = vdupq_n_f64(0.0);
    for (size_t i = 0; i < n; i += LANES) {
        float32x4_t weight = exp_ps(vsubq_f32(load_tail(x + i, n - i, -INFINITY), largest));
        store_tail(x + i, n - i, weight);
        low = vaddq_f64(low, vcvt_f64_f32(vget_low_f32(weight)));
        high = vaddq_f64(high, vcvt_high_f64_f32(weight));
    }
    scale_in_place(x, n, (float)(1.0 / vaddvq_f64(vaddq_f64(low, high))));
}

void kernel_normalize_neon(float *x, size_t n) {
    double squares = sum_squares(x, n);
    if (squares == 0.0) return;
    scale_in_place(x, n, (float)(1.0 / sqrt(squares)));
}

/* ---- Conversions -------------------------------------------------------------------------------- */

/* ---- I8 activations ------------------------------------------------------------------------------ */

/* quantize_rows as kernel_quantize_rows_scalar computes it: min and max are exact in any order, x inv is one
 * rounding, and FCVTNS rounds to nearest even as rintf does. A tail loads 0, which neither widens the
 * range (it holds 0) nor is flagged. */
void kernel_quantize_rows_neon(uint8_t *q, size_t q_stride, float *scales, int32_t *zeros, float const *x,
                               size_t x_stride, size_t rows, size_t k) {
    for (size_t r = 0; r < rows; ++r, q += q_stride, x += x_stride) {
        float32x4_t lo = vdupq_n_f32(0.0f), hi = lo;
        uint32x4_t finite = vdupq_n_u32(~0u);
        for (size_t i = 0; i < k; i += LANES) {
            float32x4_t v = load_tail(x + i, k - i, 0.0f);
            lo = vminq_f32(lo, v);
            hi = vmaxq_f32(hi, v);
            finite = vandq_u32(finite, vceqq_f32(vsubq_f32(v, v), vdupq_n_f32(0.0f)));
        }
        float inv;
        if (!kernel_quantize_range(vminvq_f32(lo), vmaxvq_f32(hi), vminvq_u32(finite) != 0, &inv, &zeros[r],
                                   &scales[r])) {
            memset(q, 0, k);
            continue;
        }
        int32x4_t zero = vdupq_n_s32(zeros[r]);
        size_t i = 0;
        for (; i + 2 * LANES <= k; i += 2 * LANES) {
            int32x4_t low = vaddq_s32(vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + i), inv)), zero);
            int32x4_t high = vaddq_s32(vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + i + LANES), inv)), zero);
            vst1_u8(q + i, vqmovn_u16(vcombine_u16(vqmovun_s32(low), vqmovun_s32(high))));
        }
        for (; i < k; ++i)
            q[i] = kernel_quantize_value(x[i], inv, zeros[r]);
    }
}

void kernel_bf16_to_f32_neon(float *out, uint16_t const *x, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint16x8_t halves = vld1q_u16(x + i);
        vst1q_f32(out + i, vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(halves), 16)));
        vst1q_f32(out + i + 4, vreinterpretq_f32_u32(vshll_high_n_u16(halves, 16)));
    }
    for (; i < n; ++i)
        out[i] = bf16_to_f32(x[i]);
}

/* The bits of f32_to_bf16 (kernels.h) for 4 values: round to nearest even, a NaN kept quiet. */
static inline uint16x4_t bf16_of(float32x4_t x) {
    uint32x4_t bits = vreinterpretq_u32_f32(x);
    uint32x4_t nan = vcgtq_u32(vandq_u32(bits, vdupq_n_u32(0x7fffffffu)), vdupq_n_u32(0x7f800000u));
    uint32x4_t bias = vaddq_u32(vdupq_n_u32(0x7fffu), vandq_u32(vshrq_n_u32(bits, 16), vdupq_n_u32(1u)));
    uint16x4_t rounded = vshrn_n_u32(vaddq_u32(bits, bias), 16); /* no carry out of a non-NaN */
    uint16x4_t quiet = vorr_u16(vshrn_n_u32(bits, 16), vdup_n_u16(0x40u));
    return vbsl_u16(vmovn_u32(nan), quiet, rounded);
}

void kernel_f32_to_bf16_neon(uint16_t *out, float const *x, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        vst1q_u16(out + i, vcombine_u16(bf16_of(vld1q_f32(x + i)), bf16_of(vld1q_f32(x + i + 4))));
    for (; i < n; ++i)
        out[i] = f32_to_bf16(x[i]);
}

/* ---- Training ------------------------------------------------------------------------------------ */

/* rmsnorm_backward as kernel_rmsnorm_backward_scalar: 1/r and sum(weight dy x) in double, then
 * dx = weight dy / r - x sum(weight dy x) / (n r^3) and d_weight += dy x / r in F32, 4 lanes at a time. */
void kernel_rmsnorm_backward_neon(float *dx, size_t dx_stride, float *d_weight, float const *dy,
                                  size_t dy_stride, float const *x, size_t x_stride, float const *weight,
                                  size_t rows, size_t n, float eps) {
    for (size_t r = 0; r < rows; ++r, dx += dx_stride, dy += dy_stride, x += x_stride) {
        float64x2_t squares_low = vdupq_n_f64(0.0), squares_high = vdupq_n_f64(0.0);
        float64x2_t dots_low = vdupq_n_f64(0.0), dots_high = vdupq_n_f64(0.0);
        for (size_t i = 0; i < n; i += LANES) {
            float32x4_t values = load_tail(x + i, n - i, 0.0f), gradients = load_tail(dy + i, n - i, 0.0f);
            float32x4_t weights = load_tail(weight + i, n - i, 0.0f);
            add_squares(values, &squares_low, &squares_high);
            float64x2_t low =
                vmulq_f64(vcvt_f64_f32(vget_low_f32(weights)), vcvt_f64_f32(vget_low_f32(gradients)));
            float64x2_t high = vmulq_f64(vcvt_high_f64_f32(weights), vcvt_high_f64_f32(gradients));
            dots_low = vfmaq_f64(dots_low, low, vcvt_f64_f32(vget_low_f32(values)));
            dots_high = vfmaq_f64(dots_high, high, vcvt_high_f64_f32(values));
        }
        double inverse = 1.0 / sqrt(vaddvq_f64(vaddq_f64(squares_low, squares_high)) / (double)n + eps);
        double dot = vaddvq_f64(vaddq_f64(dots_low, dots_high));
        float by = (float)inverse, coefficient = (float)(dot / (double)n * inverse * inverse * inverse);
        for (size_t i = 0; i < n; i += LANES) {
            float32x4_t values = load_tail(x + i, n - i, 0.0f), gradients = load_tail(dy + i, n - i, 0.0f);
            float32x4_t weights = load_tail(weight + i, n - i, 0.0f);
            float32x4_t d_weights = load_tail(d_weight + i, n - i, 0.0f);
            d_weights = vaddq_f32(d_weights, vmulq_n_f32(vmulq_f32(gradients, values), by));
            store_tail(d_weight + i, n - i, d_weights);
            float32x4_t scaled = vmulq_n_f32(vmulq_f32(weights, gradients), by);
            store_tail(dx + i, n - i, vsubq_f32(scaled, vmulq_n_f32(values, coefficient)));
        }
    }
}

void kernel_gelu_neon(float *x, size_t n) {
    for (size_t i = 0; i < n; i += LANES)
        store_tail(x + i, n - i, gelu_ps(load_tail(x + i, n - i, 0.0f)));
}

/* gelu'(x) = 0.5(1 + t) + 0.5x(1 - t^2) sqrt(2/pi)(1 + 3 0.044715x^2), t = tanh(u), rewritten with
 * s = 1 / (1 + e), e = exp(-2u): 0.5(1 + t) = s and 0.5(1 - t^2) = 2 e s^2, so
 * gelu'(x) = s (1 + 2x (e s) sqrt(2/pi)(1 + 0.134145x^2)), free of the cancellations of 1 + t and
 * 1 - t^2 (e s = 1 - s stays finite where e is clamped). */
static inline float32x4_t gelu_derivative_ps(float32x4_t x) {
    float32x4_t x2 = vmulq_f32(x, x);
    float32x4_t u = vmulq_f32(x, vfmaq_n_f32(vdupq_n_f32(0.797884561f), x2, 0.0356774081f));
    float32x4_t e = exp_ps(vmulq_n_f32(u, -2.0f));
    float32x4_t s = vdivq_f32(vdupq_n_f32(1.0f), vaddq_f32(e, vdupq_n_f32(1.0f)));
    float32x4_t slope = vfmaq_n_f32(vdupq_n_f32(0.797884561f), x2, 0.107032224f);
    float32x4_t r = vmulq_f32(vmulq_f32(vaddq_f32(x, x), vmulq_f32(e, s)), slope);
    return vfmaq_f32(s, s, r);
}

void kernel_gelu_backward_neon(float *dx, float const *dy, float const *x, size_t n) {
    for (size_t i = 0; i < n; i += LANES) {
        float32x4_t derivative = gelu_derivative_ps(load_tail(x + i, n - i, 0.0f));
        store_tail(dx + i, n - i, vmulq_f32(load_tail(dy + i, n - i, 0.0f), derivative));
    }
}
