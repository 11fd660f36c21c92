/* The scalar path of the non-GEMM kernels: plain loops that define the numbers every SIMD path is tested
 * against (kernels.h gives the tolerances). Sums of squares and softmax denominators are accumulated in
 * double here and on every SIMD path, so that only the order of the additions differs between paths. */
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "gelu.h"
#include "paths.h"

/* Keys per tile of the online softmax, as the SIMD paths tile them. */
#define ATTENTION_TILE 64

void kernel_rmsnorm_scalar(float *y, size_t y_stride, float const *x, size_t x_stride, float const *weight,
                           size_t rows, size_t n, float eps) {
    for (size_t r = 0; r < rows; ++r, y += y_stride, x += x_stride) {
        double squares = 0.0;
        for (size_t i = 0; i < n; ++i)
            squares += (double)x[i] * x[i];
        float inverse = (float)(1.0 / sqrt(squares / (double)n + eps));
        for (size_t i = 0; i < n; ++i)
            y[i] = x[i] * inverse * weight[i];
    }
}

/* Each row's mean in double, then its biased variance as the mean of (x - mean)^2, each deviation in double,
 * and 1/sqrt(var + eps) rounded to F32 once. The output subtracts the mean as (x - high) - low, high being
 * the mean rounded to F32 and low the rest of it: x - high is exact near the mean, so that the deviation
 * keeps F32's precision even where the mean is large against the spread (rounding the mean alone would cost
 * |mean| 2^-24 of every deviation). Then the scaling, the weight and the bias in F32. */
void kernel_layernorm_scalar(float *y, size_t y_stride, float const *x, size_t x_stride, float const *weight,
                             float const *bias, size_t rows, size_t n, float eps) {
    for (size_t r = 0; r < rows; ++r, y += y_stride, x += x_stride) {
        double sum = 0.0, squares = 0.0;
        for (size_t i = 0; i < n; ++i)
            sum += x[i];
        double mean = sum / (double)n;
        for (size_t i = 0; i < n; ++i)
            squares += ((double)x[i] - mean) * ((double)x[i] - mean);
        float inverse = (float)(1.0 / sqrt(squares / (double)n + eps));
        float high = (float)mean, low = (float)(mean - high);
        for (size_t i = 0; i < n; ++i) {
            float value = (x[i] - high - low) * inverse * weight[i];
            y[i] = bias ? value + bias[i] : value;
        }
    }
}

/* Rotary angles of one position: pair (i, i + 32) turns by p * 10000^(-2i/64), computed in double and
 * rounded to F32 once. */
static void rope_angles(float cosines[KERNEL_HEAD / 2], float sines[KERNEL_HEAD / 2], size_t position) {
    for (size_t i = 0; i < KERNEL_HEAD / 2; ++i) {
        double angle = (double)position * pow(10000.0, -2.0 * (double)i / KERNEL_HEAD);
        cosines[i] = (float)cos(angle);
        sines[i] = (float)sin(angle);
    }
}

/* The angles of positions below ROPE_TABLE_POSITIONS, made once per process on first use with rope_angles
 * (the same numbers): the text tower rotates every query and key of every block at positions that repeat
 * from item to item, and sin, cos and pow per pair and row cost as much as the rotation. */
enum { ROPE_TABLE_POSITIONS = 4096 };
static float *rope_table; /* [positions][2][32]: the cosines, then the sines; NULL when not made */
static pthread_once_t rope_table_once = PTHREAD_ONCE_INIT;

static void rope_table_make(void) {
    float *table = malloc(ROPE_TABLE_POSITIONS * KERNEL_HEAD * sizeof(float));
    for (size_t p = 0; table && p < ROPE_TABLE_POSITIONS; ++p)
        rope_angles(table + p * KERNEL_HEAD, table + p * KERNEL_HEAD + KERNEL_HEAD / 2, p);
    rope_table = table;
}

/* The cosines of `position` (the sines follow them): from the table, or computed into `angles` [64]. */
static float const *rope_lookup(size_t position, float angles[KERNEL_HEAD]) {
    pthread_once(&rope_table_once, rope_table_make);
    if (rope_table && position < ROPE_TABLE_POSITIONS) return rope_table + position * KERNEL_HEAD;
    rope_angles(angles, angles + KERNEL_HEAD / 2, position);
    return angles;
}

/* Turns each pair of `heads` head vectors [heads, 64] in place by the angles whose sines are given. The
 * halves are copied out first, so that the compiler sees no overlap and vectorizes the two loops. */
static void rotate_heads(float *restrict x, size_t heads, float const cosines[restrict KERNEL_HEAD / 2],
                         float const sines[restrict KERNEL_HEAD / 2]) {
    for (size_t h = 0; h < heads; ++h, x += KERNEL_HEAD) {
        float first[KERNEL_HEAD / 2], second[KERNEL_HEAD / 2];
        memcpy(first, x, sizeof first);
        memcpy(second, x + KERNEL_HEAD / 2, sizeof second);
        for (size_t i = 0; i < KERNEL_HEAD / 2; ++i)
            x[i] = first[i] * cosines[i] - second[i] * sines[i];
        for (size_t i = 0; i < KERNEL_HEAD / 2; ++i)
            x[i + KERNEL_HEAD / 2] = second[i] * cosines[i] + first[i] * sines[i];
    }
}

/* Rotary embedding of `heads` head vectors [heads, 64] in place. */
void kernel_rope_scalar(float *x, size_t heads, size_t position) {
    float angles[KERNEL_HEAD];
    float const *cosines = rope_lookup(position, angles);
    rotate_heads(x, heads, cosines, cosines + KERNEL_HEAD / 2);
}

/* a . b over n values, summed in order. */
static float dot(float const *a, float const *b, size_t n) {
    float sum = 0.0f;
    for (size_t d = 0; d < n; ++d)
        sum += a[d] * b[d];
    return sum;
}

/* Running state of one query's online softmax: max of the scores so far, sum of exp(score - max), and
 * the exp-weighted sum of values [head]. */
typedef struct online_row {
    float max, sum;
    float values[KERNEL_HEAD_MAX];
} online_row_t;

/* Folds keys [0, keys) of one tile (rows of `k` and `v` at `stride`, `head` values each) into `row`: the
 * tile's scores raise the running max, and what was accumulated under the old max is rescaled by
 * exp(old - new). `bias`: NULL, or the relative-position bias of the query and the tile's first key, key j's
 * at bias[-j] (kernel_attention_t.bias). */
static void attend_tile(online_row_t *row, float const *query, float const *k, float const *v, size_t stride,
                        size_t keys, float scale, size_t head, float const *bias) {
    float scores[ATTENTION_TILE];
    float max = row->max;
    for (size_t j = 0; j < keys; ++j) {
        scores[j] = scale * dot(query, k + j * stride, head);
        if (bias) scores[j] += bias[-(ptrdiff_t)j];
        max = fmaxf(max, scores[j]);
    }
    float correction = expf(row->max - max);
    row->max = max;
    row->sum *= correction;
    for (size_t d = 0; d < head; ++d)
        row->values[d] *= correction;
    for (size_t j = 0; j < keys; ++j) {
        float weight = expf(scores[j] - max);
        row->sum += weight;
        for (size_t d = 0; d < head; ++d)
            row->values[d] += weight * v[j * stride + d];
    }
}

/* One query row of the item whose keys are rows [first, end) of k and v: bias[(row - first) - (key - first)],
 * that is bias[row - key], on the score of each key. */
static void attend_row(kernel_attention_t const *a, size_t row, size_t first, size_t end) {
    online_row_t state;
    state.max = -INFINITY;
    state.sum = 0.0f;
    memset(state.values, 0, a->head * sizeof state.values[0]);
    float const *query = a->q + row * a->stride;
    for (size_t tile = first; tile < end; tile += ATTENTION_TILE) {
        size_t keys = end - tile < ATTENTION_TILE ? end - tile : ATTENTION_TILE;
        float const *bias = a->bias ? a->bias + ((ptrdiff_t)row - (ptrdiff_t)tile) : NULL;
        attend_tile(&state, query, a->k + tile * a->stride, a->v + tile * a->stride, a->stride, keys,
                    a->scale, a->head, bias);
    }
    float *out = a->out + row * a->out_stride;
    for (size_t d = 0; d < a->head; ++d)
        out[d] = state.values[d] / state.sum;
}

void kernel_attention_scalar(kernel_attention_t const *attention, size_t item_begin, size_t item_end) {
    for (size_t item = item_begin; item < item_end; ++item) {
        size_t first = attention->offsets[item], end = attention->offsets[item + 1];
        for (size_t row = first; row < end; ++row)
            attend_row(attention, row, first, attention->causal ? row + 1 : end);
    }
}

void kernel_softmax_scalar(float *x, size_t n) {
    float max = -INFINITY;
    for (size_t i = 0; i < n; ++i)
        max = fmaxf(max, x[i]);
    double sum = 0.0;
    for (size_t i = 0; i < n; ++i) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    float inverse = (float)(1.0 / sum);
    for (size_t i = 0; i < n; ++i)
        x[i] *= inverse;
}

void kernel_normalize_scalar(float *x, size_t n) {
    double squares = 0.0;
    for (size_t i = 0; i < n; ++i)
        squares += (double)x[i] * x[i];
    if (squares == 0.0) return;
    float inverse = (float)(1.0 / sqrt(squares));
    for (size_t i = 0; i < n; ++i)
        x[i] *= inverse;
}

void kernel_bf16_to_f32_scalar(float *out, uint16_t const *x, size_t n) {
    for (size_t i = 0; i < n; ++i)
        out[i] = bf16_to_f32(x[i]);
}

void kernel_f32_to_bf16_scalar(uint16_t *out, float const *x, size_t n) {
    for (size_t i = 0; i < n; ++i)
        out[i] = f32_to_bf16(x[i]);
}

/* F32 -> F16 rounding to nearest even, bit-exact with F16C's vcvtps2ph: subnormal halves are rounded like
 * normal ones, magnitudes from 65520 up become infinity, and a NaN keeps its sign and the top of its
 * payload with the quiet bit set. */
static uint16_t f32_to_f16(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
    if (magnitude >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* 65520: the tie above 65504 */
    if (magnitude >= 0x38800000u) {                                  /* 2^-14: normal halves */
        uint32_t rebiased = magnitude - 0x38000000u;                 /* exponent bias 127 -> 15 */
        rebiased += 0xfffu + ((rebiased >> 13) & 1u);
        return (uint16_t)(sign | (rebiased >> 13));
    }
    /* Subnormal halves count units of 2^-24: the 24-bit significand shifted right by 126 - exponent. */
    uint32_t exponent = magnitude >> 23;
    if (exponent < 102) return sign; /* below 2^-25: rounds to zero */
    uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u, shift = 126 - exponent;
    uint32_t units = significand >> shift, rest = significand & ((1u << shift) - 1u),
             half = 1u << (shift - 1);
    if (rest > half || (rest == half && (units & 1u))) ++units;
    return (uint16_t)(sign | units);
}

/* Per-row I8: scale = max|x| / 127, q = round(x / scale) half away from zero; a zero row gets scale 0.
 * `x` must be finite. */
static void convert_i8(int8_t *out, float const *x, size_t n, float *scale) {
    float max = 0.0f;
    for (size_t i = 0; i < n; ++i)
        max = fmaxf(max, fabsf(x[i]));
    *scale = max / 127.0f;
    for (size_t i = 0; i < n; ++i)
        out[i] = max == 0.0f ? 0 : (int8_t)roundf(x[i] / *scale);
}

static void convert_f16(uint16_t *out, float const *x, size_t n) {
    for (size_t i = 0; i < n; ++i)
        out[i] = f32_to_f16(x[i]);
}

static kernel_converters_t const converters = {kernel_f32_to_bf16_scalar, convert_f16, convert_i8};

void kernel_convert_scalar(void *out, float const *x, size_t n, uform_scalar_t scalar, float *scale) {
    kernel_convert_by(&converters, out, x, n, scalar, scale);
}

/* ---- I8 activations ------------------------------------------------------------------------------ */

/* lo = min(0, min x), hi = max(0, max x) over k values; false when one is not finite. */
static bool row_range(float const *x, size_t k, float *lo, float *hi) {
    bool finite = true;
    *lo = *hi = 0.0f;
    for (size_t i = 0; i < k; ++i) {
        finite = finite && isfinite(x[i]);
        *lo = fminf(*lo, x[i]);
        *hi = fmaxf(*hi, x[i]);
    }
    return finite;
}

void kernel_quantize_rows_scalar(uint8_t *q, size_t q_stride, float *scales, int32_t *zeros, float const *x,
                                 size_t x_stride, size_t rows, size_t k) {
    for (size_t r = 0; r < rows; ++r, q += q_stride, x += x_stride) {
        float lo, hi, inv;
        bool finite = row_range(x, k, &lo, &hi);
        if (!kernel_quantize_range(lo, hi, finite, &inv, &zeros[r], &scales[r])) {
            memset(q, 0, k);
            continue;
        }
        for (size_t i = 0; i < k; ++i)
            q[i] = kernel_quantize_value(x[i], inv, zeros[r]);
    }
}

/* ---- Training ------------------------------------------------------------------------------------ */

/* For each row of y = x / r * weight, r = sqrt(mean(x^2) + eps): 1/r and sum(weight dy x) in double,
 * then dx = weight dy / r - x sum(weight dy x) / (n r^3) and d_weight += dy x / r in F32. dy is read at
 * each index before dx is written there, so dx may be dy. */
void kernel_rmsnorm_backward_scalar(float *dx, size_t dx_stride, float *d_weight, float const *dy,
                                    size_t dy_stride, float const *x, size_t x_stride, float const *weight,
                                    size_t rows, size_t n, float eps) {
    for (size_t r = 0; r < rows; ++r, dx += dx_stride, dy += dy_stride, x += x_stride) {
        double squares = 0.0, dot = 0.0;
        for (size_t i = 0; i < n; ++i) {
            squares += (double)x[i] * x[i];
            dot += (double)weight[i] * dy[i] * x[i];
        }
        double inverse = 1.0 / sqrt(squares / (double)n + eps);
        float inverse_f32 = (float)inverse,
              coefficient = (float)(dot / (double)n * inverse * inverse * inverse);
        for (size_t i = 0; i < n; ++i) {
            float gradient = dy[i];
            d_weight[i] += gradient * x[i] * inverse_f32;
            dx[i] = weight[i] * gradient * inverse_f32 - x[i] * coefficient;
        }
    }
}

void kernel_gelu_scalar(float *x, size_t n) {
    for (size_t i = 0; i < n; ++i)
        x[i] = gelu_tanh(x[i]);
}

void kernel_gelu_backward_scalar(float *dx, float const *dy, float const *x, size_t n) {
    for (size_t i = 0; i < n; ++i)
        dx[i] = dy[i] * gelu_tanh_derivative(x[i]);
}

/* The rotation of kernel_rope_scalar by the opposite angles: its transpose. */
void kernel_rope_backward_scalar(float *x, size_t heads, size_t position) {
    float angles[KERNEL_HEAD], sines[KERNEL_HEAD / 2];
    float const *cosines = rope_lookup(position, angles);
    for (size_t i = 0; i < KERNEL_HEAD / 2; ++i)
        sines[i] = -cosines[KERNEL_HEAD / 2 + i];
    rotate_heads(x, heads, cosines, sines);
}

/* The softmax statistics of one query row against keys [first, end): the max of the scaled scores, and
 * the sum of exp(score - max) folded tile by tile as the forward pass folds it. */
static void row_statistics(kernel_attention_backward_t const *a, float const *query, size_t first, size_t end,
                           float *max, float *sum) {
    *max = -INFINITY;
    *sum = 0.0f;
    for (size_t tile = first; tile < end; tile += ATTENTION_TILE) {
        size_t keys = end - tile < ATTENTION_TILE ? end - tile : ATTENTION_TILE;
        float scores[ATTENTION_TILE], tile_max = *max;
        for (size_t j = 0; j < keys; ++j) {
            scores[j] = a->scale * dot(query, a->k + (tile + j) * a->stride, KERNEL_HEAD);
            tile_max = fmaxf(tile_max, scores[j]);
        }
        *sum *= expf(*max - tile_max);
        *max = tile_max;
        for (size_t j = 0; j < keys; ++j)
            *sum += expf(scores[j] - tile_max);
    }
}

/* One query row's share of the gradients, against keys [first, end): with p_j = softmax(scale q k_j),
 * dV_j += p_j dO, ds_j = p_j (dO . v_j - dO . O), dQ = scale sum_j ds_j k_j, dK_j += scale ds_j q. */
static void attention_backward_row(kernel_attention_backward_t const *a, size_t row, size_t first,
                                   size_t end) {
    float const *query = a->q + row * a->stride;
    float const *d_out = a->d_out + row * a->out_stride, *out = a->out + row * a->out_stride;
    float max, sum, d_query[KERNEL_HEAD] = {0};
    row_statistics(a, query, first, end, &max, &sum);
    float d_out_dot_out = dot(d_out, out, KERNEL_HEAD);
    for (size_t j = first; j < end; ++j) {
        float const *key = a->k + j * a->stride, *value = a->v + j * a->stride;
        float probability = expf(a->scale * dot(query, key, KERNEL_HEAD) - max) / sum;
        float d_score = a->scale * probability * (dot(d_out, value, KERNEL_HEAD) - d_out_dot_out);
        float *d_key = a->d_k + j * a->stride, *d_value = a->d_v + j * a->stride;
        for (size_t d = 0; d < KERNEL_HEAD; ++d) {
            d_value[d] += probability * d_out[d];
            d_key[d] += d_score * query[d];
            d_query[d] += d_score * key[d];
        }
    }
    memcpy(a->d_q + row * a->stride, d_query, sizeof d_query);
}

void kernel_attention_backward_scalar(kernel_attention_backward_t const *attention, size_t item_begin,
                                      size_t item_end) {
    for (size_t item = item_begin; item < item_end; ++item) {
        size_t first = attention->offsets[item], end = attention->offsets[item + 1];
        kernel_attention_backward_clear(attention, first, end);
        for (size_t row = first; row < end; ++row)
            attention_backward_row(attention, row, first, attention->causal ? row + 1 : end);
    }
}
