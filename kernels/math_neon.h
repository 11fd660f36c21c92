/* Vector math shared by the neon kernels: one exp and the GELUs built on it (and on erf), so that attention,
 * softmax and the GEMM epilogue round alike, and the moves and FMAs of a GEMM tile's rows (gemm_neon.c and
 * sgemm_neon.c tile alike). Included by the neon kernel files only (compiled with their flags). */
#pragma once

#include <arm_neon.h>
#include <stddef.h>
#include <string.h>

#include "erf_fit.h"

/* exp(x) within 1e-7 relative for x <= 88, and exactly 0 below ln(FLT_MIN) (-inf and NaN included):
 * Cody-Waite reduction x = n ln2 + r with |r| <= ln2 / 2, then Cephes' polynomial for e^r, scaled by
 * 2^n. */
static inline float32x4_t exp_ps(float32x4_t x) {
    float32x4_t const lowest = vdupq_n_f32(-87.336544f);
    uint32x4_t kept = vcgeq_f32(x, lowest);
    x = vminq_f32(vmaxq_f32(x, lowest), vdupq_n_f32(88.0f));
    float32x4_t n = vrndnq_f32(vmulq_n_f32(x, 1.44269504f));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
    float32x4_t y = vdupq_n_f32(1.9875691500e-4f);
    y = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), y, r);
    y = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), y, r);
    y = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), y, r);
    y = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), y, r);
    y = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), y, r);
    y = vaddq_f32(vfmaq_f32(r, y, vmulq_f32(r, r)), vdupq_n_f32(1.0f));
    int32x4_t exponent = vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127));
    float32x4_t power = vreinterpretq_f32_s32(vshlq_n_s32(exponent, 23));
    return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(vmulq_f32(y, power)), kept));
}

/* 0.5x(1 + tanh(u)) = x / (1 + exp(-2u)), u = sqrt(2/pi)(x + 0.044715x^3): no cancellation near 0. */
static inline float32x4_t gelu_ps(float32x4_t x) {
    float32x4_t x2 = vmulq_f32(x, x);
    float32x4_t u = vmulq_f32(x, vfmaq_n_f32(vdupq_n_f32(0.797884561f), x2, 0.0356774081f));
    float32x4_t e = exp_ps(vmulq_n_f32(u, -2.0f));
    return vdivq_f32(x, vaddq_f32(e, vdupq_n_f32(1.0f)));
}

/* erf(x) within 5e-7 absolute, NaN kept (vcageq_f32 is false for it): math_avx512.h's erf_ps, 4 lanes at a
 * time. */
static inline float32x4_t erf_ps(float32x4_t x) {
    float32x4_t s = vmulq_f32(x, x);
    float32x4_t p = vdupq_n_f32(ERF_P4);
    p = vfmaq_f32(vdupq_n_f32(ERF_P3), p, s);
    p = vfmaq_f32(vdupq_n_f32(ERF_P2), p, s);
    p = vfmaq_f32(vdupq_n_f32(ERF_P1), p, s);
    p = vfmaq_f32(vdupq_n_f32(ERF_P0), p, s);
    float32x4_t q = vdupq_n_f32(ERF_Q5);
    q = vfmaq_f32(vdupq_n_f32(ERF_Q4), q, s);
    q = vfmaq_f32(vdupq_n_f32(ERF_Q3), q, s);
    q = vfmaq_f32(vdupq_n_f32(ERF_Q2), q, s);
    q = vfmaq_f32(vdupq_n_f32(ERF_Q1), q, s);
    q = vfmaq_f32(vdupq_n_f32(1.0f), q, s);
    float32x4_t ratio = vdivq_f32(vmulq_f32(x, p), q);
    uint32x4_t sign = vandq_u32(vreinterpretq_u32_f32(x), vdupq_n_u32(0x80000000u));
    float32x4_t unit = vreinterpretq_f32_u32(vorrq_u32(sign, vreinterpretq_u32_f32(vdupq_n_f32(1.0f))));
    return vbslq_f32(vcageq_f32(x, vdupq_n_f32(ERF_FAR)), unit, ratio);
}

/* The exact GELU, 0.5x(1 + erf(x / sqrt 2)). */
static inline float32x4_t gelu_erf_ps(float32x4_t x) {
    float32x4_t half = vmulq_n_f32(x, 0.5f);
    return vfmaq_f32(half, half, erf_ps(vmulq_n_f32(x, 0.707106781f)));
}

/* The quick GELU, x sigmoid(1.702x) = x / (1 + exp(-1.702x)); 0 below x = -50 (it is under 1e-35 there),
 * where exp_ps would clamp its argument and leave x / (1 + e) growing with |x|. NaN kept. */
static inline float32x4_t gelu_quick_ps(float32x4_t x) {
    float32x4_t e = exp_ps(vmulq_n_f32(x, -1.702f));
    uint32x4_t vanishing = vcltq_f32(x, vdupq_n_f32(-50.0f));
    float32x4_t value = vdivq_f32(x, vaddq_f32(e, vdupq_n_f32(1.0f)));
    return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(value), vanishing));
}

/* A tile row of the GEMMs: 16 F32 columns in 4 q registers; a tile has at most 6 rows, the values of one k
 * for them in two q registers (rows 0-3, rows 4-5). */
#define NEON_ROW_COLUMNS 16
#define NEON_TILE_ROWS   6

/* v = from[0, count) as vectors of F32, zero past count (count <= NEON_ROW_COLUMNS), or all zero when `from`
 * is NULL (a tile row's sums before its first k): NEON has no masked loads. */
static inline void load_columns(float32x4_t v[NEON_ROW_COLUMNS / 4], float const *from, size_t count) {
    if (!from) {
#pragma GCC unroll 4
        for (size_t i = 0; i < NEON_ROW_COLUMNS / 4; ++i)
            v[i] = vdupq_n_f32(0.0f);
        return;
    }
    float padded[NEON_ROW_COLUMNS];
    if (count < NEON_ROW_COLUMNS) {
        memset(padded, 0, sizeof padded);
        memcpy(padded, from, count * sizeof(float));
        from = padded;
    }
#pragma GCC unroll 4
    for (size_t i = 0; i < NEON_ROW_COLUMNS / 4; ++i)
        v[i] = vld1q_f32(from + 4 * i);
}

/* to[0, count) = the first count lanes of v (count <= NEON_ROW_COLUMNS). */
static inline void store_columns(float *to, size_t count, float32x4_t const v[NEON_ROW_COLUMNS / 4]) {
    float padded[NEON_ROW_COLUMNS];
    float *into = count < NEON_ROW_COLUMNS ? padded : to;
#pragma GCC unroll 4
    for (size_t i = 0; i < NEON_ROW_COLUMNS / 4; ++i)
        vst1q_f32(into + 4 * i, v[i]);
    if (count < NEON_ROW_COLUMNS) memcpy(to, padded, count * sizeof(float));
}

/* sum[r][v] += w * x[r] for a GEMM tile's `rows` rows, x[r] being lane r of x_low, then lane r - 4 of x_high
 * (lane numbers are immediates: one line per row). Always inlined with a constant `rows`. */
static inline __attribute__((always_inline)) void
fma_rows(size_t rows, float32x4_t sum[NEON_TILE_ROWS][NEON_ROW_COLUMNS / 4], size_t v, float32x4_t w,
         float32x4_t x_low, float32x4_t x_high) {
    sum[0][v] = vfmaq_laneq_f32(sum[0][v], w, x_low, 0);
    if (rows > 1) sum[1][v] = vfmaq_laneq_f32(sum[1][v], w, x_low, 1);
    if (rows > 2) sum[2][v] = vfmaq_laneq_f32(sum[2][v], w, x_low, 2);
    if (rows > 3) sum[3][v] = vfmaq_laneq_f32(sum[3][v], w, x_low, 3);
    if (rows > 4) sum[4][v] = vfmaq_laneq_f32(sum[4][v], w, x_high, 0);
    if (rows > 5) sum[5][v] = vfmaq_laneq_f32(sum[5][v], w, x_high, 1);
}
