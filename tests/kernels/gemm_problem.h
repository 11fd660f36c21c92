/* What the GEMM suites share (test_gemm.c, test_gemm_i8.c): one problem with padded strides and random
 * inputs, BF16 (F32 or BF16 activations) or I8 (quantized activations with their zero points and scales),
 * run on a kernel path over column splits, and its outputs checked against the scalar path's. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

typedef enum residual_mode { RESIDUAL_NONE, RESIDUAL_SEPARATE, RESIDUAL_IN_Y } residual_mode_t;

typedef struct options {
    bool i8;     /* the I8 GEMM (else the BF16-weight one) */
    bool x_bf16; /* BF16 GEMM: BF16 activations */
    bool scaled; /* I8 GEMM: random scales (else 1: y is the exact integer sum) */
    bool bias;
    kernel_epilogue_t epilogue;
    residual_mode_t residual;
} options_t;

/* Combination `number` of OPTIONS_COUNT of a kind: bias (bit 0), the epilogue (bits 1-2: none, GELU, exact
 * GELU, quick GELU), BF16 activations (BF16) or random scales (I8) (bit 3), and the residual mode (number /
 * 16: none, separate, in y). */
#define OPTIONS_COUNT 48
options_t options_numbered(bool i8, size_t number);

/* The activation of kernels.h's epilogue `epilogue` at x, in double from its formula. */
double epilogue_double(kernel_epilogue_t epilogue, double x);

typedef struct problem {
    size_t m, n, k, x_stride, y_stride, residual_stride;
    options_t options;
    float *x, *bias, *residual, *y, *y_reference;
    uint16_t *x_bf16, *w;       /* BF16 */
    uint8_t *x_u8;              /* I8: activations in 0..255 */
    int8_t *w_i8;               /* I8: weights in -128..127 */
    int32_t *zeros;             /* I8: each row's zero point, in 0..255 */
    float *x_scales, *w_scales; /* I8 */
} problem_t;

/* `bytes` from malloc, asserted. */
void *problem_allocate(size_t bytes);

/* A problem of m x n outputs over k, inputs drawn from fixtures.h's generator; problem_free frees it. */
void problem_make(problem_t *p, size_t m, size_t n, size_t k, options_t options);
void problem_free(problem_t *p);

/* The weights packed for `path`, 64-byte aligned (free() them). */
void *problem_pack(kernels_t const *path, problem_t const *p);

/* y = the problem's GEMM over [0, n) on `path`, in calls over the column ranges that `splits` (tile
 * multiples, ascending, ending with n) delimit; the whole range in one call. */
void problem_run(kernels_t const *path, problem_t const *p, float *y, size_t const *splits, size_t count);
void problem_run_whole(kernels_t const *path, problem_t const *p, float *y);

/* p->y against p->y_reference, the scalar path's, within kernels.h's tolerance (the I8 GEMM's integer sums
 * bitwise where unscaled without an epilogue), the padding untouched; `name` names the path in a failure. */
void problem_check(problem_t const *p, char const *name);

/* The I8 problem of the largest sums (unit scales, no bias, no epilogue): at k = KERNEL_I8_DEPTH_MAX, x 255 over a
 * zero point 0 (row 1: 0 over 255) and weights -128 or 127 by column, |S| = 255 * 128 * 65536 just under 2^31;
 * problem_check_largest_sums asserts that y holds exactly (float)S. */
void problem_make_largest_sums(problem_t *p, size_t m, size_t n);
void problem_check_largest_sums(problem_t const *p);

/* Scalar once, then every path of `paths` [count] against it. */
void problem_compare(kernels_t const *const *paths, size_t count, size_t m, size_t n, size_t k,
                     options_t options);

/* On `path`: the output of one call, then of a call per tile and of two and three uneven calls, bitwise
 * the same. */
void problem_check_splits(kernels_t const *path, size_t m, size_t n, size_t k, options_t options);
