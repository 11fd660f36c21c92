/* Vector math shared by the avx2 kernels: one exp and the GELUs built on it (and on erf), so that attention,
 * softmax and the GEMM epilogue round alike, and the F32 vector primitives vector_driver.h is written with
 * (the same names in math_avx512.h). Included by the avx2 kernel files only (compiled with their flags). */
#pragma once

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "erf_fit.h"

/* Lanes [0, count) set, count = the columns of [column, column + 8) below n, for maskload and maskstore. */
static inline __m256i columns_mask(size_t column, size_t n) {
    int count = column >= n ? 0 : n - column >= 8 ? 8 : (int)(n - column);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* exp(x) within 1e-7 relative for x <= 88, and exactly 0 below ln(FLT_MIN) (-inf included): Cody-Waite
 * reduction x = n ln2 + r with |r| <= ln2 / 2, then Cephes' polynomial for e^r, scaled by 2^n. */
static inline __m256 exp_ps(__m256 x) {
    __m256 const lowest = _mm256_set1_ps(-87.336544f);
    __m256 kept = _mm256_cmp_ps(x, lowest, _CMP_GE_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lowest), _mm256_set1_ps(88.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_add_ps(_mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    __m256i exponent = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    __m256 power = _mm256_castsi256_ps(_mm256_slli_epi32(exponent, 23));
    return _mm256_and_ps(_mm256_mul_ps(y, power), kept);
}

/* 0.5x(1 + tanh(u)) = x / (1 + exp(-2u)), u = sqrt(2/pi)(x + 0.044715x^3): no cancellation near 0. */
static inline __m256 gelu_ps(__m256 x) {
    __m256 x2 = _mm256_mul_ps(x, x);
    __m256 u =
        _mm256_mul_ps(x, _mm256_fmadd_ps(x2, _mm256_set1_ps(0.0356774081f), _mm256_set1_ps(0.797884561f)));
    __m256 e = exp_ps(_mm256_mul_ps(u, _mm256_set1_ps(-2.0f)));
    return _mm256_div_ps(x, _mm256_add_ps(e, _mm256_set1_ps(1.0f)));
}

/* erf(x) within 5e-7 absolute, NaN kept: math_avx512.h's erf_ps, 8 lanes at a time. */
static inline __m256 erf_ps(__m256 x) {
    __m256 const sign_bit = _mm256_set1_ps(-0.0f);
    __m256 s = _mm256_mul_ps(x, x);
    __m256 p = _mm256_set1_ps(ERF_P4);
    p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(ERF_P3));
    p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(ERF_P2));
    p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(ERF_P1));
    p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(ERF_P0));
    __m256 q = _mm256_set1_ps(ERF_Q5);
    q = _mm256_fmadd_ps(q, s, _mm256_set1_ps(ERF_Q4));
    q = _mm256_fmadd_ps(q, s, _mm256_set1_ps(ERF_Q3));
    q = _mm256_fmadd_ps(q, s, _mm256_set1_ps(ERF_Q2));
    q = _mm256_fmadd_ps(q, s, _mm256_set1_ps(ERF_Q1));
    q = _mm256_fmadd_ps(q, s, _mm256_set1_ps(1.0f));
    __m256 ratio = _mm256_div_ps(_mm256_mul_ps(x, p), q);
    __m256 unit = _mm256_or_ps(_mm256_and_ps(x, sign_bit), _mm256_set1_ps(1.0f));
    __m256 far =
        _mm256_cmp_ps(_mm256_andnot_ps(sign_bit, x), _mm256_set1_ps(ERF_FAR), _CMP_GE_OQ); /* NaN: no */
    return _mm256_blendv_ps(ratio, unit, far);
}

/* The exact GELU, 0.5x(1 + erf(x / sqrt 2)). */
static inline __m256 gelu_erf_ps(__m256 x) {
    __m256 half = _mm256_mul_ps(x, _mm256_set1_ps(0.5f));
    return _mm256_fmadd_ps(half, erf_ps(_mm256_mul_ps(x, _mm256_set1_ps(0.707106781f))), half);
}

/* The quick GELU, x sigmoid(1.702x) = x / (1 + exp(-1.702x)); 0 below x = -50, NaN kept: math_avx512.h's. */
static inline __m256 gelu_quick_ps(__m256 x) {
    __m256 e = exp_ps(_mm256_mul_ps(x, _mm256_set1_ps(-1.702f)));
    __m256 kept = _mm256_cmp_ps(x, _mm256_set1_ps(-50.0f), _CMP_NLT_UQ);
    return _mm256_and_ps(_mm256_div_ps(x, _mm256_add_ps(e, _mm256_set1_ps(1.0f))), kept);
}

/* F32 vectors of 8 lanes, for vector_driver.h: each is the one instruction its name says. */
typedef __m256 vfloat;

static inline vfloat vf_zero(void) {
    return _mm256_setzero_ps();
}

static inline vfloat vf_set1(float x) {
    return _mm256_set1_ps(x);
}

/* *x in every lane, loaded by the broadcast itself. */
static inline vfloat vf_broadcast(float const *x) {
    return _mm256_broadcast_ss(x);
}

/* Aligned (vf_load, vf_store) and unaligned (vf_loadu, vf_storeu) whole vectors. */
static inline vfloat vf_load(float const *x) {
    return _mm256_load_ps(x);
}

static inline vfloat vf_loadu(float const *x) {
    return _mm256_loadu_ps(x);
}

static inline void vf_store(float *to, vfloat x) {
    _mm256_store_ps(to, x);
}

static inline void vf_storeu(float *to, vfloat x) {
    _mm256_storeu_ps(to, x);
}

static inline vfloat vf_add(vfloat a, vfloat b) {
    return _mm256_add_ps(a, b);
}

static inline vfloat vf_sub(vfloat a, vfloat b) {
    return _mm256_sub_ps(a, b);
}

static inline vfloat vf_mul(vfloat a, vfloat b) {
    return _mm256_mul_ps(a, b);
}

static inline vfloat vf_div(vfloat a, vfloat b) {
    return _mm256_div_ps(a, b);
}

static inline vfloat vf_max(vfloat a, vfloat b) {
    return _mm256_max_ps(a, b);
}

/* a b + c, rounded once. */
static inline vfloat vf_fmadd(vfloat a, vfloat b, vfloat c) {
    return _mm256_fmadd_ps(a, b, c);
}

/* int32 vectors, for the I8 GEMM's epilogue (gemm_epilogue.h) and the widening of BF16 weights (gemm_fma.c):
 * each is the one instruction its name says; vf_of_vi rounds to nearest even, as a C conversion of an int32
 * to float does. */
typedef __m256i vint;

static inline vint vi_zero(void) {
    return _mm256_setzero_si256();
}

static inline vint vi_set1(int32_t x) {
    return _mm256_set1_epi32(x);
}

/* Aligned. */
static inline vint vi_load(int32_t const *x) {
    return _mm256_load_si256((__m256i const *)x);
}

static inline void vi_store(int32_t *to, vint x) {
    _mm256_store_si256((__m256i *)to, x);
}

static inline vint vi_sub(vint a, vint b) {
    return _mm256_sub_epi32(a, b);
}

static inline vint vi_mullo(vint a, vint b) {
    return _mm256_mullo_epi32(a, b);
}

static inline vfloat vf_of_vi(vint x) {
    return _mm256_cvtepi32_ps(x);
}

/* The F32 whose high half is the BF16 in the low (vf_of_low_halves) or the high half of each lane. */
static inline vfloat vf_of_low_halves(vint x) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
}

static inline vfloat vf_of_high_halves(vint x) {
    return _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32((int)0xffff0000u)));
}

/* The lanes a mask sets (vmask: all bits of a lane set or clear) read or written, the others never
 * touched: vf_maskload answers 0 in them, vf_maskload_or `fill`. */
typedef __m256i vmask;

static inline vfloat vf_maskload(float const *x, vmask mask) {
    return _mm256_maskload_ps(x, mask);
}

static inline vfloat vf_maskload_or(vfloat fill, float const *x, vmask mask) {
    return _mm256_blendv_ps(fill, _mm256_maskload_ps(x, mask), _mm256_castsi256_ps(mask));
}

static inline void vf_maskstore(float *to, vmask mask, vfloat x) {
    _mm256_maskstore_ps(to, mask, x);
}

/* x in the lanes a mask sets, 0 in the others. */
static inline vfloat vf_maskzero(vmask mask, vfloat x) {
    return _mm256_and_ps(x, _mm256_castsi256_ps(mask));
}

/* The largest lane: halves, then pairs, then the last two. */
static inline float vf_reduce_max(vfloat v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

/* The sum of the lanes: halves, then pairs, then the last two. */
static inline float vf_reduce_add(vfloat v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* F64 vectors of 4 lanes, for the sums vector_driver.h keeps in double: vd_low and vd_high widen the low
 * and the high half of a vfloat's lanes. */
typedef __m256d vdouble;

static inline vdouble vd_zero(void) {
    return _mm256_setzero_pd();
}

static inline vdouble vd_low(vfloat x) {
    return _mm256_cvtps_pd(_mm256_castps256_ps128(x));
}

static inline vdouble vd_high(vfloat x) {
    return _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
}

static inline vdouble vd_add(vdouble a, vdouble b) {
    return _mm256_add_pd(a, b);
}

static inline vdouble vd_mul(vdouble a, vdouble b) {
    return _mm256_mul_pd(a, b);
}

static inline vdouble vd_fmadd(vdouble a, vdouble b, vdouble c) {
    return _mm256_fmadd_pd(a, b, c);
}

/* The sum of the lanes: halves, then the last two. */
static inline double vd_reduce_add(vdouble v) {
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}
