/* The vector erf's fit, shared by every SIMD path (math_avx512.h, math_avx2.h, math_neon.h) so that a refit
 * moves them all: erf(x) = x P(x^2) / Q(x^2) below |x| = ERF_FAR and +-1 from there on (erf rounds to +-1
 * in F32 beyond 3.86; infinities included, where the ratio would be NaN), within 5e-7 absolute. P and Q, of
 * degrees 4 and 5, are a near-minimax fit of erf's absolute error over [0, 3.92] (least squares reweighted
 * by the error until it levels), rounded to F32: 16 vector operations and one division, where the two
 * branches it replaced (a polynomial, and 1 - exp(-x^2) times a polynomial) took about 40 and cost the exact
 * GELU's GEMM 15% at hidden 384. Horner's order: P4 first, Q's constant term is 1. */
#pragma once

#define ERF_P4  3.458294668e-04f
#define ERF_P3  9.675272740e-03f
#define ERF_P2  7.085441053e-02f
#define ERF_P1  3.380581737e-01f
#define ERF_P0  1.128376961e+00f /* 2 / sqrt(pi) */
#define ERF_Q5  1.996726132e-05f
#define ERF_Q4  2.458628267e-03f
#define ERF_Q3  2.690031379e-02f
#define ERF_Q2  1.738491803e-01f
#define ERF_Q1  6.329051852e-01f
#define ERF_FAR 3.92f
