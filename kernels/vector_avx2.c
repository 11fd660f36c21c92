/* The AVX2 (with FMA) path of the non-GEMM kernels, 8 F32 lanes per vector. RMSNorm, LayerNorm,
 * softmax, normalize, GELU, their backward passes and attention are vector_driver.h's; here are what it takes
 * from the instruction set (the tail mask, the 8 x 8 transpose and the causal mask of attention) and
 * the conversions, whose 16-bit tails use the exact scalar helpers.
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

/* ---- Attention: the parts vector_driver.h takes from the path ----------------------------------- */

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

/* kernel_rmsnorm_avx2, kernel_attention_avx2, ...: the kernels vector_driver.h defines. */
#define PATH_KERNEL(name) kernel_##name##_avx2
#include "vector_driver.h"

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

/* ---- I8 weights ---------------------------------------------------------------------------------- */

/* kernel_quantize_weights, bitwise: the largest BF16 bits without their sign 16 at a time, then per 8
 * weights the scalar's division, rounding half away from zero (|ratio| - trunc|ratio| is exact, as the
 * scalar's fraction) and clamp; the tail as the scalar does. */
void kernel_quantize_weights_avx2(int8_t *q, float *scale, uint16_t const *w, size_t k) {
    __m256i const magnitude = _mm256_set1_epi16(0x7fff);
    __m256i largest = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 2 * LANES <= k; i += 2 * LANES)
        largest = _mm256_max_epu16(largest,
                                   _mm256_and_si256(_mm256_loadu_si256((__m256i const *)(w + i)), magnitude));
    __m128i half = _mm_max_epu16(_mm256_castsi256_si128(largest), _mm256_extracti128_si256(largest, 1));
    /* the largest of 8 as 0xffff less the smallest of their complements (phminposuw) */
    uint16_t largest_bits =
        (uint16_t)(0xffffu -
                   (uint16_t)_mm_cvtsi128_si32(_mm_minpos_epu16(_mm_xor_si128(half, _mm_set1_epi16(-1)))));
    for (; i < k; ++i) {
        uint16_t bits = w[i] & 0x7fffu;
        largest_bits = bits > largest_bits ? bits : largest_bits;
    }
    if (!kernel_weights_scale(largest_bits, scale)) {
        memset(q, 0, k);
        return;
    }
    __m256 const divisor = _mm256_set1_ps(*scale), half_step = _mm256_set1_ps(0.5f),
                 one = _mm256_set1_ps(1.0f);
    __m256 const sign = _mm256_set1_ps(-0.0f);
    __m256i const low = _mm256_set1_epi32(-127), high = _mm256_set1_epi32(127);
    for (i = 0; i + LANES <= k; i += LANES) {
        __m256i bits = _mm256_cvtepu16_epi32(_mm_loadu_si128((__m128i const *)(w + i)));
        __m256 ratio = _mm256_div_ps(_mm256_castsi256_ps(_mm256_slli_epi32(bits, 16)), divisor);
        __m256 size = _mm256_andnot_ps(sign, ratio);
        __m256 whole = _mm256_round_ps(size, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        whole = _mm256_add_ps(
            whole, _mm256_and_ps(_mm256_cmp_ps(_mm256_sub_ps(size, whole), half_step, _CMP_GE_OQ), one));
        __m256i value = _mm256_cvttps_epi32(_mm256_or_ps(whole, _mm256_and_ps(ratio, sign)));
        value = _mm256_min_epi32(_mm256_max_epi32(value, low), high);
        __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(value), _mm256_extracti128_si256(value, 1));
        _mm_storel_epi64((__m128i *)(q + i), _mm_packs_epi16(words, words));
    }
    for (; i < k; ++i)
        q[i] = kernel_quantize_weight(w[i], *scale);
}

/* ---- I8 activations ------------------------------------------------------------------------------ */

/* A row's range for quantize_rows: min and max over its k values (and 0), exact in any order, in two chains
 * of two vectors each, the tail through a lane mask (masked lanes load 0, which holds in the range).
 * `finite` is whether no value is a NaN or an infinity: a sum of x * 0, which is NaN exactly then. */
static bool row_range(float const *x, size_t k, float *low, float *high) {
    __m256 const zero = _mm256_setzero_ps();
    __m256 lo[2] = {zero, zero}, hi[2] = {zero, zero}, odd[2] = {zero, zero};
    size_t i = 0;
    for (; i + 2 * LANES <= k; i += 2 * LANES) {
#pragma GCC unroll 2
        for (size_t j = 0; j < 2; ++j) {
            __m256 v = _mm256_loadu_ps(x + i + j * LANES);
            lo[j] = _mm256_min_ps(lo[j], v);
            hi[j] = _mm256_max_ps(hi[j], v);
            odd[j] = _mm256_fmadd_ps(v, zero, odd[j]);
        }
    }
    for (; i < k; i += LANES) {
        __m256 v = _mm256_maskload_ps(x + i, tail_mask(k - i));
        lo[0] = _mm256_min_ps(lo[0], v);
        hi[0] = _mm256_max_ps(hi[0], v);
        odd[0] = _mm256_fmadd_ps(v, zero, odd[0]);
    }
    float lows[LANES], highs[LANES];
    _mm256_storeu_ps(lows, _mm256_min_ps(lo[0], lo[1]));
    _mm256_storeu_ps(highs, _mm256_max_ps(hi[0], hi[1]));
    for (size_t j = 1; j < LANES; ++j) {
        lows[0] = fminf(lows[0], lows[j]);
        highs[0] = fmaxf(highs[0], highs[j]);
    }
    *low = lows[0], *high = highs[0];
    __m256 sum = _mm256_add_ps(odd[0], odd[1]);
    return !_mm256_movemask_ps(_mm256_cmp_ps(sum, sum, _CMP_UNORD_Q));
}

/* round(v by) + zero as int32, rounded to nearest even as rintf does. */
static inline __m256i quantized(__m256 v, __m256 by, __m256i zero) {
    return _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v, by)), zero);
}

/* quantize_rows as kernel_quantize_rows_scalar computes it: x inv is one rounding, and the conversion rounds
 * to nearest even. 32 values at a time narrow to bytes by two saturating packs (int32 to int16, then to
 * unsigned bytes: the clamp to [0, 255]), which interleave the four vectors' 128-bit lanes; a permute puts
 * their 32-bit groups back in order. The tail goes a value at a time. */
void kernel_quantize_rows_avx2(uint8_t *q, size_t q_stride, float *scales, int32_t *zeros, float const *x,
                               size_t x_stride, size_t rows, size_t k) {
    __m256i const order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (size_t r = 0; r < rows; ++r, q += q_stride, x += x_stride) {
        float lo, hi, inv;
        bool finite = row_range(x, k, &lo, &hi);
        if (!kernel_quantize_range(lo, hi, finite, &inv, &zeros[r], &scales[r])) {
            memset(q, 0, k);
            continue;
        }
        __m256 by = _mm256_set1_ps(inv);
        __m256i zero = _mm256_set1_epi32(zeros[r]);
        size_t i = 0;
        for (; i + 4 * LANES <= k; i += 4 * LANES) {
            __m256i v[4];
#pragma GCC unroll 4
            for (size_t j = 0; j < 4; ++j)
                v[j] = quantized(_mm256_loadu_ps(x + i + j * LANES), by, zero);
            __m256i bytes =
                _mm256_packus_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
            _mm256_storeu_si256((__m256i *)(q + i), _mm256_permutevar8x32_epi32(bytes, order));
        }
        for (; i < k; ++i)
            q[i] = kernel_quantize_value(x[i], inv, zeros[r]);
    }
}
