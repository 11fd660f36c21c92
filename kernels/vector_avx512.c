/* The AVX-512 (F, BW, DQ, VL) path of the non-GEMM kernels, 16 F32 lanes per vector. RMSNorm,
 * LayerNorm, softmax, normalize, GELU, their backward passes and attention are vector_driver.h's; here are
 * what it takes from the instruction set (the tail mask, the 16 x 16 transpose and the causal mask of
 * attention) and the conversions, whose tails are handled with lane masks too.
 *
 * The loops marked `#pragma GCC unroll` run over a fixed number of vectors: unrolled, their arrays of
 * vectors stay in registers (gcc -O2 would keep them in memory). */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "math_avx512.h"
#include "paths.h"

#define LANES 16

/* All lanes below `left` set (all when left >= 16), for masked loads and stores. */
static inline __mmask16 tail_mask(size_t left) {
    return left >= LANES ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
}

/* ---- Attention: the parts vector_driver.h takes from the path ----------------------------------- */

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

/* kernel_rmsnorm_avx512, kernel_attention_avx512, ...: the kernels vector_driver.h defines. */
#define PATH_KERNEL(name) kernel_##name##_avx512
#include "vector_driver.h"

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

/* ---- I8 activations ------------------------------------------------------------------------------ */

/* A row's range for quantize_rows: min and max over its k values (and 0), exact in any order, in two chains
 * of two vectors each, with the tail masked (masked lanes load 0, which holds in the range). `finite` is
 * whether no value is a NaN or an infinity: a sum of x * 0, which is NaN exactly then. */
static bool row_range(float const *x, size_t k, float *low, float *high) {
    __m512 const zero = _mm512_setzero_ps();
    __m512 lo[2] = {zero, zero}, hi[2] = {zero, zero}, odd[2] = {zero, zero};
    size_t i = 0;
    for (; i + 2 * LANES <= k; i += 2 * LANES) {
#pragma GCC unroll 2
        for (size_t j = 0; j < 2; ++j) {
            __m512 v = _mm512_loadu_ps(x + i + j * LANES);
            lo[j] = _mm512_min_ps(lo[j], v);
            hi[j] = _mm512_max_ps(hi[j], v);
            odd[j] = _mm512_fmadd_ps(v, zero, odd[j]);
        }
    }
    for (; i < k; i += LANES) {
        __m512 v = _mm512_maskz_loadu_ps(tail_mask(k - i), x + i);
        lo[0] = _mm512_min_ps(lo[0], v);
        hi[0] = _mm512_max_ps(hi[0], v);
        odd[0] = _mm512_fmadd_ps(v, zero, odd[0]);
    }
    *low = _mm512_reduce_min_ps(_mm512_min_ps(lo[0], lo[1]));
    *high = _mm512_reduce_max_ps(_mm512_max_ps(hi[0], hi[1]));
    __m512 sum = _mm512_add_ps(odd[0], odd[1]);
    return !_mm512_cmp_ps_mask(sum, sum, _CMP_UNORD_Q);
}

/* round(v by) + zero as int32, rounded to nearest even as rintf does. */
static inline __m512i quantized(__m512 v, __m512 by, __m512i zero) {
    return _mm512_add_epi32(
        _mm512_cvt_roundps_epi32(_mm512_mul_ps(v, by), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), zero);
}

/* quantize_rows as kernel_quantize_rows_scalar computes it: x inv is one rounding, and the conversion rounds
 * to nearest even. 64 values at a time narrow to bytes by two saturating packs (int32 to int16, then to
 * unsigned bytes: the clamp to [0, 255]), which interleave the four vectors' 128-bit lanes; a permute puts
 * their 32-bit groups back in order. The tail clamps and narrows 16 values at a time. */
void kernel_quantize_rows_avx512(uint8_t *q, size_t q_stride, float *scales, int32_t *zeros, float const *x,
                                 size_t x_stride, size_t rows, size_t k) {
    __m512i const order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    for (size_t r = 0; r < rows; ++r, q += q_stride, x += x_stride) {
        float lo, hi, inv;
        bool finite = row_range(x, k, &lo, &hi);
        if (!kernel_quantize_range(lo, hi, finite, &inv, &zeros[r], &scales[r])) {
            memset(q, 0, k);
            continue;
        }
        __m512 by = _mm512_set1_ps(inv);
        __m512i zero = _mm512_set1_epi32(zeros[r]);
        size_t i = 0;
        for (; i + 4 * LANES <= k; i += 4 * LANES) {
            __m512i v[4];
#pragma GCC unroll 4
            for (size_t j = 0; j < 4; ++j)
                v[j] = quantized(_mm512_loadu_ps(x + i + j * LANES), by, zero);
            __m512i bytes =
                _mm512_packus_epi16(_mm512_packs_epi32(v[0], v[1]), _mm512_packs_epi32(v[2], v[3]));
            _mm512_storeu_si512(q + i, _mm512_permutexvar_epi32(order, bytes));
        }
        __m512i const top = _mm512_set1_epi32(255);
        for (; i < k; i += LANES) {
            __mmask16 mask = tail_mask(k - i);
            __m512i value = quantized(_mm512_maskz_loadu_ps(mask, x + i), by, zero);
            value = _mm512_min_epi32(_mm512_max_epi32(value, _mm512_setzero_si512()), top);
            _mm_mask_storeu_epi8(q + i, mask, _mm512_cvtepi32_epi8(value));
        }
    }
}

static kernel_converters_t const converters = {kernel_f32_to_bf16_avx512, convert_f16, convert_i8};

void kernel_convert_avx512(void *out, float const *x, size_t n, uform_scalar_t scalar, float *scale) {
    kernel_convert_by(&converters, out, x, n, scalar, scale);
}
