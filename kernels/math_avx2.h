/* Vector math shared by the avx2 kernels: one exp and the GELU built on it, so that attention, softmax
 * and the GEMM epilogue round alike. Included by the avx2 kernel files only (compiled with their flags). */
#pragma once

#include <immintrin.h>

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
