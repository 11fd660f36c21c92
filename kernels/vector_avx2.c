/* The AVX2 (with FMA) path of the non-GEMM kernels, 8 F32 lanes per vector; F32 tails are handled with
 * masked loads and stores, 16-bit tails with the exact scalar helpers. Sums of squares and softmax
 * denominators are accumulated in double as on the scalar path.
 *
 * Attention, forward and backward, is vector_driver.h's (a block of 8 queries at a time, one lane per
 * query); here are its 8 x 8 transpose and causal mask.
 *
 * The loops marked `#pragma GCC unroll` run over a fixed number of vectors: unrolled, their arrays of
 * vectors stay in registers (gcc -O2 would keep them in memory). */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "math_avx2.h"
#include "paths.h"

#define LANES 8

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

/* Causal attention (for vector_driver.h): query lane i of a block starting at row `first_query` sees key
 * `first_key + j` only when first_key + j <= first_query + i; the other scores become -inf. */
static void mask_future(float scores[][LANES], size_t count, size_t first_key, size_t first_query) {
    __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (size_t j = 0; j < count; ++j) {
        if (first_key + j <= first_query) continue;
        __m256i future = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(first_key + j - first_query)), lane);
        __m256 masked = _mm256_blendv_ps(_mm256_load_ps(scores[j]), _mm256_set1_ps(-INFINITY),
                                         _mm256_castsi256_ps(future));
        _mm256_store_ps(scores[j], masked);
    }
}

#include "vector_driver.h"

void kernel_attention_avx2(kernel_attention_t const *attention, size_t item_begin, size_t item_end) {
    attention_drive(attention, item_begin, item_end);
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

void kernel_attention_backward_avx2(kernel_attention_backward_t const *attention, size_t item_begin,
                                    size_t item_end) {
    attention_backward_drive(attention, item_begin, item_end);
}
