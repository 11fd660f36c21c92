/* The AVX-512 (F, BW, DQ, VL) path of the non-GEMM kernels, 16 F32 lanes per vector; tails are handled
 * with lane masks, never by reading or writing past `n`. Sums of squares and softmax denominators are
 * accumulated in double as on the scalar path.
 *
 * Attention, forward and backward, is vector_driver.h's (a block of 16 queries at a time, one lane per
 * query); here are its 16 x 16 transpose and causal mask.
 *
 * The loops marked `#pragma GCC unroll` run over a fixed number of vectors: unrolled, their arrays of
 * vectors stay in registers (gcc -O2 would keep them in memory). */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "math_avx512.h"
#include "paths.h"

#define LANES 16

static inline __mmask16 tail_mask(size_t left) {
    return left >= LANES ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
}

static double sum_squares(float const *x, size_t n) {
    __m512d low = _mm512_setzero_pd(), high = _mm512_setzero_pd();
    for (size_t i = 0; i < n; i += LANES) {
        __m512 v = _mm512_maskz_loadu_ps(tail_mask(n - i), x + i);
        __m512d first = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
        __m512d second = _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1));
        low = _mm512_fmadd_pd(first, first, low);
        high = _mm512_fmadd_pd(second, second, high);
    }
    return _mm512_reduce_add_pd(_mm512_add_pd(low, high));
}

/* x[0, n) *= factor */
static void scale_in_place(float *x, size_t n, float factor) {
    __m512 by = _mm512_set1_ps(factor);
    for (size_t i = 0; i < n; i += LANES) {
        __mmask16 mask = tail_mask(n - i);
        _mm512_mask_storeu_ps(x + i, mask, _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, x + i), by));
    }
}

void kernel_rmsnorm_avx512(float *y, size_t y_stride, float const *x, size_t x_stride, float const *weight,
                           size_t rows, size_t n, float eps) {
    for (size_t r = 0; r < rows; ++r, y += y_stride, x += x_stride) {
        __m512 inverse = _mm512_set1_ps((float)(1.0 / sqrt(sum_squares(x, n) / (double)n + eps)));
        for (size_t i = 0; i < n; i += LANES) {
            __mmask16 mask = tail_mask(n - i);
            __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, x + i), inverse);
            _mm512_mask_storeu_ps(y + i, mask, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(mask, weight + i)));
        }
    }
}

/* ---- Attention ---------------------------------------------------------------------------------- */

/* In-register transpose of a 16 x 16 block held as 16 rows: interleave pairs of rows, then pairs of
 * pairs within 128-bit lanes, then exchange 128-bit lanes twice. */
static inline void transpose(__m512 rows[LANES]) {
    __m512 t[LANES];
#pragma GCC unroll 16
    for (size_t k = 0; k < LANES; k += 2) {
        t[k] = _mm512_unpacklo_ps(rows[k], rows[k + 1]);
        t[k + 1] = _mm512_unpackhi_ps(rows[k], rows[k + 1]);
    }
#pragma GCC unroll 16
    for (size_t k = 0; k < LANES; k += 4) {
        rows[k] = _mm512_shuffle_ps(t[k], t[k + 2], 0x44);
        rows[k + 1] = _mm512_shuffle_ps(t[k], t[k + 2], 0xee);
        rows[k + 2] = _mm512_shuffle_ps(t[k + 1], t[k + 3], 0x44);
        rows[k + 3] = _mm512_shuffle_ps(t[k + 1], t[k + 3], 0xee);
    }
#pragma GCC unroll 16
    for (size_t k = 0; k < LANES; k += 8) {
#pragma GCC unroll 16
        for (size_t c = 0; c < 4; ++c) {
            t[k + c] = _mm512_shuffle_f32x4(rows[k + c], rows[k + 4 + c], 0x88);
            t[k + 4 + c] = _mm512_shuffle_f32x4(rows[k + c], rows[k + 4 + c], 0xdd);
        }
    }
#pragma GCC unroll 16
    for (size_t c = 0; c < LANES / 2; ++c) {
        rows[c] = _mm512_shuffle_f32x4(t[c], t[c + 8], 0x88);
        rows[c + 8] = _mm512_shuffle_f32x4(t[c], t[c + 8], 0xdd);
    }
}

/* Causal attention (for vector_driver.h): query lane i of a block starting at row `first_query` sees key
 * `first_key + j` only when first_key + j <= first_query + i; the other scores become -inf. */
static void mask_future(float scores[][LANES], size_t count, size_t first_key, size_t first_query) {
    __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (size_t j = 0; j < count; ++j) {
        if (first_key + j <= first_query) continue;
        __mmask16 future =
            _mm512_cmplt_epi32_mask(lane, _mm512_set1_epi32((int)(first_key + j - first_query)));
        _mm512_store_ps(scores[j],
                        _mm512_mask_mov_ps(_mm512_load_ps(scores[j]), future, _mm512_set1_ps(-INFINITY)));
    }
}

#include "vector_driver.h"

void kernel_attention_avx512(kernel_attention_t const *attention, size_t item_begin, size_t item_end) {
    attention_drive(attention, item_begin, item_end);
}

/* ---- Softmax, normalize ------------------------------------------------------------------------- */

void kernel_softmax_avx512(float *x, size_t n) {
    __m512 const empty = _mm512_set1_ps(-INFINITY);
    __m512 max = empty;
    for (size_t i = 0; i < n; i += LANES)
        max = _mm512_max_ps(max, _mm512_mask_loadu_ps(empty, tail_mask(n - i), x + i));
    max = _mm512_set1_ps(_mm512_reduce_max_ps(max));
    __m512d low = _mm512_setzero_pd(), high = _mm512_setzero_pd();
    for (size_t i = 0; i < n; i += LANES) {
        __mmask16 mask = tail_mask(n - i);
        __m512 weight = exp_ps(_mm512_sub_ps(_mm512_mask_loadu_ps(empty, mask, x + i), max));
        _mm512_mask_storeu_ps(x + i, mask, weight);
        low = _mm512_add_pd(low, _mm512_cvtps_pd(_mm512_castps512_ps256(weight)));
        high = _mm512_add_pd(high, _mm512_cvtps_pd(_mm512_extractf32x8_ps(weight, 1)));
    }
    scale_in_place(x, n, (float)(1.0 / _mm512_reduce_add_pd(_mm512_add_pd(low, high))));
}

void kernel_normalize_avx512(float *x, size_t n) {
    double squares = sum_squares(x, n);
    if (squares == 0.0) return;
    scale_in_place(x, n, (float)(1.0 / sqrt(squares)));
}

/* ---- Conversions -------------------------------------------------------------------------------- */

void kernel_bf16_to_f32_avx512(float *out, uint16_t const *x, size_t n) {
    for (size_t i = 0; i < n; i += LANES) {
        __mmask16 mask = tail_mask(n - i);
        __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, x + i));
        _mm512_mask_storeu_ps(out + i, mask, _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16)));
    }
}

/* The bits of f32_to_bf16 (kernels.h) for 16 values: round to nearest even, a NaN kept quiet. */
static inline __m256i bf16_of(__m512 x) {
    __m512i bits = _mm512_castps_si512(x);
    __m512i high = _mm512_srli_epi32(bits, 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    __m512i bias = _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(high, _mm512_set1_epi32(1)));
    __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, bias), 16);
    __m512i quiet = _mm512_or_si512(high, _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, quiet));
}

void kernel_f32_to_bf16_avx512(uint16_t *out, float const *x, size_t n) {
    for (size_t i = 0; i < n; i += LANES) {
        __mmask16 mask = tail_mask(n - i);
        _mm256_mask_storeu_epi16(out + i, mask, bf16_of(_mm512_maskz_loadu_ps(mask, x + i)));
    }
}

/* F16C rounds to nearest even, subnormal halves included, exactly as the scalar converter. */
static void convert_f16(uint16_t *out, float const *x, size_t n) {
    for (size_t i = 0; i < n; i += LANES) {
        __mmask16 mask = tail_mask(n - i);
        __m256i half = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(mask, x + i),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_mask_storeu_epi16(out + i, mask, half);
    }
}

/* round(x) half away from zero, for |x| < 2^23: the fraction |x| - trunc|x| is exact. */
static inline __m512 round_half_away(__m512 x) {
    __m512 magnitude = _mm512_abs_ps(x);
    __m512 whole = _mm512_roundscale_ps(magnitude, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __mmask16 up = _mm512_cmp_ps_mask(_mm512_sub_ps(magnitude, whole), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    whole = _mm512_mask_add_ps(whole, up, whole, _mm512_set1_ps(1.0f));
    __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u));
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(whole), sign));
}

/* Per-row I8 as kernel_convert_scalar: scale = max|x| / 127, q = round(x / scale), a zero row all 0. */
static void convert_i8(int8_t *out, float const *x, size_t n, float *scale) {
    __m512 max = _mm512_setzero_ps();
    for (size_t i = 0; i < n; i += LANES)
        max = _mm512_max_ps(max, _mm512_abs_ps(_mm512_maskz_loadu_ps(tail_mask(n - i), x + i)));
    float largest = _mm512_reduce_max_ps(max);
    *scale = largest / 127.0f;
    if (largest == 0.0f) {
        memset(out, 0, n);
        return;
    }
    __m512 by = _mm512_set1_ps(*scale);
    for (size_t i = 0; i < n; i += LANES) {
        __mmask16 mask = tail_mask(n - i);
        __m512 q = round_half_away(_mm512_div_ps(_mm512_maskz_loadu_ps(mask, x + i), by));
        _mm_mask_storeu_epi8(out + i, mask, _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(q)));
    }
}

/* `scale` is written for I8 only. */
void kernel_convert_avx512(void *out, float const *x, size_t n, uform_scalar_t scalar, float *scale) {
    switch (scalar) {
    case UFORM_F32:
        memcpy(out, x, n * sizeof(float));
        break;
    case UFORM_BF16:
        kernel_f32_to_bf16_avx512(out, x, n);
        break;
    case UFORM_F16:
        convert_f16(out, x, n);
        break;
    case UFORM_I8:
        convert_i8(out, x, n, scale);
        break;
    }
}

/* ---- Training ------------------------------------------------------------------------------------ */

/* rmsnorm_backward as kernel_rmsnorm_backward_scalar: 1/r and sum(weight dy x) in double, then
 * dx = weight dy / r - x sum(weight dy x) / (n r^3) and d_weight += dy x / r in F32, 16 lanes at a time. */
void kernel_rmsnorm_backward_avx512(float *dx, size_t dx_stride, float *d_weight, float const *dy,
                                    size_t dy_stride, float const *x, size_t x_stride, float const *weight,
                                    size_t rows, size_t n, float eps) {
    for (size_t r = 0; r < rows; ++r, dx += dx_stride, dy += dy_stride, x += x_stride) {
        __m512d squares[2] = {_mm512_setzero_pd(), _mm512_setzero_pd()};
        __m512d dots[2] = {_mm512_setzero_pd(), _mm512_setzero_pd()};
        for (size_t i = 0; i < n; i += LANES) {
            __mmask16 mask = tail_mask(n - i);
            __m512 values = _mm512_maskz_loadu_ps(mask, x + i),
                   gradients = _mm512_maskz_loadu_ps(mask, dy + i);
            __m512 weights = _mm512_maskz_loadu_ps(mask, weight + i);
            __m256 halves_x[2] = {_mm512_castps512_ps256(values), _mm512_extractf32x8_ps(values, 1)};
            __m256 halves_g[2] = {_mm512_castps512_ps256(gradients), _mm512_extractf32x8_ps(gradients, 1)};
            __m256 halves_w[2] = {_mm512_castps512_ps256(weights), _mm512_extractf32x8_ps(weights, 1)};
            for (size_t h = 0; h < 2; ++h) {
                __m512d value = _mm512_cvtps_pd(halves_x[h]);
                __m512d product = _mm512_mul_pd(_mm512_cvtps_pd(halves_w[h]), _mm512_cvtps_pd(halves_g[h]));
                squares[h] = _mm512_fmadd_pd(value, value, squares[h]);
                dots[h] = _mm512_fmadd_pd(product, value, dots[h]);
            }
        }
        double inverse =
            1.0 / sqrt(_mm512_reduce_add_pd(_mm512_add_pd(squares[0], squares[1])) / (double)n + eps);
        double dot = _mm512_reduce_add_pd(_mm512_add_pd(dots[0], dots[1]));
        __m512 by = _mm512_set1_ps((float)inverse);
        __m512 coefficient = _mm512_set1_ps((float)(dot / (double)n * inverse * inverse * inverse));
        for (size_t i = 0; i < n; i += LANES) {
            __mmask16 mask = tail_mask(n - i);
            __m512 values = _mm512_maskz_loadu_ps(mask, x + i),
                   gradients = _mm512_maskz_loadu_ps(mask, dy + i);
            __m512 weights = _mm512_maskz_loadu_ps(mask, weight + i);
            __m512 d_weights = _mm512_maskz_loadu_ps(mask, d_weight + i);
            d_weights = _mm512_add_ps(d_weights, _mm512_mul_ps(_mm512_mul_ps(gradients, values), by));
            _mm512_mask_storeu_ps(d_weight + i, mask, d_weights);
            __m512 scaled = _mm512_mul_ps(_mm512_mul_ps(weights, gradients), by);
            _mm512_mask_storeu_ps(dx + i, mask, _mm512_sub_ps(scaled, _mm512_mul_ps(values, coefficient)));
        }
    }
}

void kernel_gelu_avx512(float *x, size_t n) {
    for (size_t i = 0; i < n; i += LANES) {
        __mmask16 mask = tail_mask(n - i);
        _mm512_mask_storeu_ps(x + i, mask, gelu_ps(_mm512_maskz_loadu_ps(mask, x + i)));
    }
}

/* gelu'(x) = 0.5(1 + t) + 0.5x(1 - t^2) sqrt(2/pi)(1 + 3 0.044715x^2), t = tanh(u), rewritten with
 * s = 1 / (1 + e), e = exp(-2u): 0.5(1 + t) = s and 0.5(1 - t^2) = 2 e s^2, so
 * gelu'(x) = s (1 + 2x (e s) sqrt(2/pi)(1 + 0.134145x^2)), free of the cancellations of 1 + t and
 * 1 - t^2 (e s = 1 - s stays finite where e is clamped). */
static inline __m512 gelu_derivative_ps(__m512 x) {
    __m512 x2 = _mm512_mul_ps(x, x);
    __m512 u =
        _mm512_mul_ps(x, _mm512_fmadd_ps(x2, _mm512_set1_ps(0.0356774081f), _mm512_set1_ps(0.797884561f)));
    __m512 e = exp_ps(_mm512_mul_ps(u, _mm512_set1_ps(-2.0f)));
    __m512 s = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(e, _mm512_set1_ps(1.0f)));
    __m512 slope = _mm512_fmadd_ps(x2, _mm512_set1_ps(0.107032224f), _mm512_set1_ps(0.797884561f));
    __m512 r = _mm512_mul_ps(_mm512_mul_ps(_mm512_add_ps(x, x), _mm512_mul_ps(e, s)), slope);
    return _mm512_fmadd_ps(s, r, s);
}

void kernel_gelu_backward_avx512(float *dx, float const *dy, float const *x, size_t n) {
    for (size_t i = 0; i < n; i += LANES) {
        __mmask16 mask = tail_mask(n - i);
        __m512 derivative = gelu_derivative_ps(_mm512_maskz_loadu_ps(mask, x + i));
        _mm512_mask_storeu_ps(dx + i, mask, _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, dy + i), derivative));
    }
}

void kernel_attention_backward_avx512(kernel_attention_backward_t const *attention, size_t item_begin,
                                      size_t item_end) {
    attention_backward_drive(attention, item_begin, item_end);
}
