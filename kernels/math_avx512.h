/* Vector math shared by the avx512 kernels: one exp and the GELUs built on it (and on erf), and the column
 * mask, so that attention, softmax and the GEMM epilogue round alike, and the F32 vector primitives
 * vector_driver.h is written with (the same names in math_avx2.h). Included by the avx512 kernel files only
 * (compiled with their flags). */
#pragma once

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "erf_fit.h"

/* exp(x) within 1e-7 relative for x <= 88, and exactly 0 below ln(FLT_MIN) (-inf included): Cody-Waite
 * reduction x = n ln2 + r with |r| <= ln2 / 2, then Cephes' polynomial for e^r, scaled by 2^n. */
static inline __m512 exp_ps(__m512 x) {
    __m512 const lowest = _mm512_set1_ps(-87.336544f);
    __mmask16 vanishing = _mm512_cmp_ps_mask(x, lowest, _CMP_LT_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, lowest), _mm512_set1_ps(88.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_add_ps(_mm512_fmadd_ps(y, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    __m512i exponent = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
    return _mm512_maskz_mul_ps(~vanishing, y, _mm512_castsi512_ps(_mm512_slli_epi32(exponent, 23)));
}

/* 0.5x(1 + tanh(u)) = x / (1 + exp(-2u)), u = sqrt(2/pi)(x + 0.044715x^3): no cancellation near 0. */
static inline __m512 gelu_ps(__m512 x) {
    __m512 x2 = _mm512_mul_ps(x, x);
    __m512 u =
        _mm512_mul_ps(x, _mm512_fmadd_ps(x2, _mm512_set1_ps(0.0356774081f), _mm512_set1_ps(0.797884561f)));
    __m512 e = exp_ps(_mm512_mul_ps(u, _mm512_set1_ps(-2.0f)));
    return _mm512_div_ps(x, _mm512_add_ps(e, _mm512_set1_ps(1.0f)));
}

/* erf(x) within 5e-7 absolute, NaN kept: erf_fit.h's x P(x^2) / Q(x^2), +-1 from ERF_FAR on. */
static inline __m512 erf_ps(__m512 x) {
    __m512 s = _mm512_mul_ps(x, x);
    __m512 p = _mm512_set1_ps(ERF_P4);
    p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(ERF_P3));
    p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(ERF_P2));
    p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(ERF_P1));
    p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(ERF_P0));
    __m512 q = _mm512_set1_ps(ERF_Q5);
    q = _mm512_fmadd_ps(q, s, _mm512_set1_ps(ERF_Q4));
    q = _mm512_fmadd_ps(q, s, _mm512_set1_ps(ERF_Q3));
    q = _mm512_fmadd_ps(q, s, _mm512_set1_ps(ERF_Q2));
    q = _mm512_fmadd_ps(q, s, _mm512_set1_ps(ERF_Q1));
    q = _mm512_fmadd_ps(q, s, _mm512_set1_ps(1.0f));
    __m512 ratio = _mm512_div_ps(_mm512_mul_ps(x, p), q);
    __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u));
    __m512 unit = _mm512_castsi512_ps(_mm512_or_si512(sign, _mm512_castps_si512(_mm512_set1_ps(1.0f))));
    __mmask16 far = _mm512_cmp_ps_mask(_mm512_abs_ps(x), _mm512_set1_ps(ERF_FAR), _CMP_GE_OQ); /* NaN: no */
    return _mm512_mask_blend_ps(far, ratio, unit);
}

/* The exact GELU, 0.5x(1 + erf(x / sqrt 2)). */
static inline __m512 gelu_erf_ps(__m512 x) {
    __m512 half = _mm512_mul_ps(x, _mm512_set1_ps(0.5f));
    return _mm512_fmadd_ps(half, erf_ps(_mm512_mul_ps(x, _mm512_set1_ps(0.707106781f))), half);
}

/* The quick GELU, x sigmoid(1.702x) = x / (1 + exp(-1.702x)); 0 below x = -50 (it is under 1e-35 there),
 * where exp_ps would clamp its argument and leave x / (1 + e) growing with |x|. NaN kept. */
static inline __m512 gelu_quick_ps(__m512 x) {
    __m512 e = exp_ps(_mm512_mul_ps(x, _mm512_set1_ps(-1.702f)));
    __mmask16 kept = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-50.0f), _CMP_NLT_UQ);
    return _mm512_maskz_div_ps(kept, x, _mm512_add_ps(e, _mm512_set1_ps(1.0f)));
}

/* Lanes of columns [column, min(column + 16, n)), for masked loads and stores of the last columns. */
static inline __mmask16 columns_mask(size_t column, size_t n) {
    return column >= n ? 0 : n - column >= 16 ? 0xffff : (__mmask16)((1u << (n - column)) - 1);
}

/* F32 vectors of 16 lanes, for vector_driver.h: each is the one instruction its name says. */
typedef __m512 vfloat;

static inline vfloat vf_zero(void) {
    return _mm512_setzero_ps();
}

static inline vfloat vf_set1(float x) {
    return _mm512_set1_ps(x);
}

/* *x in every lane, loaded by the broadcast itself. */
static inline vfloat vf_broadcast(float const *x) {
    return _mm512_set1_ps(*x);
}

/* Aligned (vf_load, vf_store) and unaligned (vf_loadu, vf_storeu) whole vectors. */
static inline vfloat vf_load(float const *x) {
    return _mm512_load_ps(x);
}

static inline vfloat vf_loadu(float const *x) {
    return _mm512_loadu_ps(x);
}

static inline void vf_store(float *to, vfloat x) {
    _mm512_store_ps(to, x);
}

static inline void vf_storeu(float *to, vfloat x) {
    _mm512_storeu_ps(to, x);
}

static inline vfloat vf_add(vfloat a, vfloat b) {
    return _mm512_add_ps(a, b);
}

static inline vfloat vf_sub(vfloat a, vfloat b) {
    return _mm512_sub_ps(a, b);
}

static inline vfloat vf_mul(vfloat a, vfloat b) {
    return _mm512_mul_ps(a, b);
}

static inline vfloat vf_div(vfloat a, vfloat b) {
    return _mm512_div_ps(a, b);
}

static inline vfloat vf_max(vfloat a, vfloat b) {
    return _mm512_max_ps(a, b);
}

/* a b + c, rounded once. */
static inline vfloat vf_fmadd(vfloat a, vfloat b, vfloat c) {
    return _mm512_fmadd_ps(a, b, c);
}

/* int32 vectors, for the I8 GEMM's epilogue (gemm_epilogue.h) and the widening of BF16 weights (gemm_fma.c):
 * each is the one instruction its name says; vf_of_vi rounds to nearest even, as a C conversion of an int32
 * to float does. */
typedef __m512i vint;

static inline vint vi_zero(void) {
    return _mm512_setzero_si512();
}

static inline vint vi_set1(int32_t x) {
    return _mm512_set1_epi32(x);
}

/* Aligned. */
static inline vint vi_load(int32_t const *x) {
    return _mm512_load_si512(x);
}

static inline void vi_store(int32_t *to, vint x) {
    _mm512_store_si512(to, x);
}

static inline vint vi_sub(vint a, vint b) {
    return _mm512_sub_epi32(a, b);
}

static inline vint vi_mullo(vint a, vint b) {
    return _mm512_mullo_epi32(a, b);
}

static inline vfloat vf_of_vi(vint x) {
    return _mm512_cvtepi32_ps(x);
}

/* The F32 whose high half is the BF16 in the low (vf_of_low_halves) or the high half of each lane. */
static inline vfloat vf_of_low_halves(vint x) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
}

static inline vfloat vf_of_high_halves(vint x) {
    return _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32((int)0xffff0000u)));
}

/* The lanes a mask sets read or written, the others never touched: vf_maskload answers 0 in them,
 * vf_maskload_or `fill`. */
typedef __mmask16 vmask;

static inline vfloat vf_maskload(float const *x, vmask mask) {
    return _mm512_maskz_loadu_ps(mask, x);
}

static inline vfloat vf_maskload_or(vfloat fill, float const *x, vmask mask) {
    return _mm512_mask_loadu_ps(fill, mask, x);
}

static inline void vf_maskstore(float *to, vmask mask, vfloat x) {
    _mm512_mask_storeu_ps(to, mask, x);
}

/* x in the lanes a mask sets, 0 in the others. */
static inline vfloat vf_maskzero(vmask mask, vfloat x) {
    return _mm512_maskz_mov_ps(mask, x);
}

static inline float vf_reduce_max(vfloat v) {
    return _mm512_reduce_max_ps(v);
}

/* The sum of the lanes, in the compiler's own reduction order. */
static inline float vf_reduce_add(vfloat v) {
    return _mm512_reduce_add_ps(v);
}

/* F64 vectors of 8 lanes, for the sums vector_driver.h keeps in double: vd_low and vd_high widen the low
 * and the high half of a vfloat's lanes. */
typedef __m512d vdouble;

static inline vdouble vd_zero(void) {
    return _mm512_setzero_pd();
}

static inline vdouble vd_low(vfloat x) {
    return _mm512_cvtps_pd(_mm512_castps512_ps256(x));
}

static inline vdouble vd_high(vfloat x) {
    return _mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1));
}

static inline vdouble vd_add(vdouble a, vdouble b) {
    return _mm512_add_pd(a, b);
}

static inline vdouble vd_mul(vdouble a, vdouble b) {
    return _mm512_mul_pd(a, b);
}

static inline vdouble vd_fmadd(vdouble a, vdouble b, vdouble c) {
    return _mm512_fmadd_pd(a, b, c);
}

/* The sum of the lanes, in the compiler's own reduction order. */
static inline double vd_reduce_add(vdouble v) {
    return _mm512_reduce_add_pd(v);
}
