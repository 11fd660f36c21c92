/* The GEMM kernels: the scalar path on hand-computed cases (it defines the numbers), every SIMD path
 * this CPU runs against scalar on odd shapes, every epilogue, F32 and BF16 activations and padded
 * strides (within kernels.h's tolerance), and every path's output bitwise unchanged when the columns
 * are split between calls at KERNEL_GEMM_TILE multiples. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels.h"

/* ---- Fixtures ---------------------------------------------------------------------------------- */

static uint32_t random_state;

static float random_uniform(void) { /* [-1, 1), from a fixed-seed LCG */
    random_state = random_state * 1664525u + 1013904223u;
    return (float)(random_state >> 8) / 8388608.0f - 1.0f;
}

typedef enum residual_mode { RESIDUAL_NONE, RESIDUAL_SEPARATE, RESIDUAL_IN_Y } residual_mode_t;

typedef struct options {
    bool bias, gelu, x_bf16;
    residual_mode_t residual;
} options_t;

/* One problem with padded strides, its inputs random, the outputs of two paths side by side. */
typedef struct problem {
    size_t m, n, k, x_stride, y_stride, residual_stride;
    options_t options;
    float *x, *bias, *residual, *y, *y_reference;
    uint16_t *x_bf16, *w;
} problem_t;

static float const SENTINEL = -12345.0f; /* fills y's padding, which no path may write */

static void problem_make(problem_t *p, size_t m, size_t n, size_t k, options_t options) {
    *p = (problem_t){.m = m, .n = n, .k = k, .x_stride = k + 3, .y_stride = n + 5, .options = options};
    p->residual_stride = options.residual == RESIDUAL_IN_Y ? p->y_stride : n + 7;
    p->x = malloc(m * p->x_stride * sizeof(float));
    p->x_bf16 = malloc(m * p->x_stride * sizeof(uint16_t));
    p->w = malloc(n * k * sizeof(uint16_t));
    p->bias = malloc(n * sizeof(float));
    p->residual = malloc(m * p->residual_stride * sizeof(float));
    p->y = malloc(m * p->y_stride * sizeof(float));
    p->y_reference = malloc(m * p->y_stride * sizeof(float));
    assert_non_null(p->x);
    assert_non_null(p->x_bf16);
    assert_non_null(p->w);
    assert_non_null(p->bias);
    assert_non_null(p->residual);
    assert_non_null(p->y);
    assert_non_null(p->y_reference);
    float w_scale = 3.0f / sqrtf((float)k); /* sums of order 1, so that GELU sees both of its sides */
    for (size_t i = 0; i < m * p->x_stride; ++i) {
        p->x[i] = random_uniform();
        p->x_bf16[i] = f32_to_bf16(random_uniform());
    }
    for (size_t i = 0; i < n * k; ++i)
        p->w[i] = f32_to_bf16(w_scale * random_uniform());
    for (size_t i = 0; i < n; ++i)
        p->bias[i] = random_uniform();
    for (size_t i = 0; i < m * p->residual_stride; ++i)
        p->residual[i] = random_uniform();
}

static void problem_free(problem_t *p) {
    free(p->x);
    free(p->x_bf16);
    free(p->w);
    free(p->bias);
    free(p->residual);
    free(p->y);
    free(p->y_reference);
}

static void *pack(kernels_t const *path, uint16_t const *w, size_t n, size_t k) {
    size_t bytes = (path->gemm_packed_size(n, k) + 63) / 64 * 64;
    void *packed = aligned_alloc(64, bytes ? bytes : 64);
    assert_non_null(packed);
    path->gemm_pack(packed, w, n, k);
    return packed;
}

/* y: the sentinel in the padding, and the residual where y is its own residual. */
static void prepare_y(problem_t const *p, float *y) {
    for (size_t row = 0; row < p->m; ++row)
        for (size_t column = 0; column < p->y_stride; ++column)
            y[row * p->y_stride + column] = p->options.residual == RESIDUAL_IN_Y && column < p->n
                                                ? p->residual[row * p->y_stride + column]
                                                : SENTINEL;
}

static kernel_gemm_t gemm_of(problem_t const *p, void const *packed, float *y) {
    options_t const *o = &p->options;
    return (kernel_gemm_t){
        .m = p->m,
        .n = p->n,
        .k = p->k,
        .x = o->x_bf16 ? NULL : p->x,
        .x_bf16 = o->x_bf16 ? p->x_bf16 : NULL,
        .x_stride = p->x_stride,
        .w = packed,
        .bias = o->bias ? p->bias : NULL,
        .residual = o->residual == RESIDUAL_NONE   ? NULL
                    : o->residual == RESIDUAL_IN_Y ? y
                                                   : p->residual,
        .residual_stride = p->residual_stride,
        .y = y,
        .y_stride = p->y_stride,
        .epilogue = o->gelu ? KERNEL_EPILOGUE_GELU : KERNEL_EPILOGUE_NONE,
    };
}

/* y = gemm over [0, n) on `path`, in calls over the column ranges that `splits` (tile multiples,
 * ascending, ending with n) delimit. */
static void run(kernels_t const *path, problem_t const *p, float *y, size_t const *splits, size_t count) {
    void *packed = pack(path, p->w, p->n, p->k);
    prepare_y(p, y);
    kernel_gemm_t gemm = gemm_of(p, packed, y);
    for (size_t i = 0, begin = 0; i < count; begin = splits[i++])
        path->gemm(&gemm, begin, splits[i]);
    free(packed);
}

static void run_whole(kernels_t const *path, problem_t const *p, float *y) {
    run(path, p, y, &p->n, 1);
}

/* |y - y_scalar| <= 1e-2 (|bias| + sum_k |x w|) + 1e-6 per output (kernels.h); the padding untouched. */
static void check_against_scalar(problem_t const *p, char const *name) {
    options_t const *o = &p->options;
    for (size_t row = 0; row < p->m; ++row) {
        for (size_t column = 0; column < p->y_stride; ++column) {
            float got = p->y[row * p->y_stride + column], want = p->y_reference[row * p->y_stride + column];
            if (column >= p->n) {
                assert_true(got == SENTINEL);
                continue;
            }
            double magnitude = o->bias ? fabs(p->bias[column]) : 0.0;
            for (size_t i = 0; i < p->k; ++i) {
                float x =
                    o->x_bf16 ? bf16_to_f32(p->x_bf16[row * p->x_stride + i]) : p->x[row * p->x_stride + i];
                magnitude += fabs((double)x * bf16_to_f32(p->w[column * p->k + i]));
            }
            double error = fabs((double)got - want), allowed = 1e-2 * magnitude + 1e-6;
            if (!(error <= allowed)) {
                print_error(
                    "%s: m %zu n %zu k %zu bias %d gelu %d x_bf16 %d residual %d: y[%zu][%zu] = %.9g, "
                    "scalar %.9g, allowed %.3g\n",
                    name, p->m, p->n, p->k, o->bias, o->gelu, o->x_bf16, (int)o->residual, row, column,
                    (double)got, (double)want, allowed);
                fail();
            }
        }
    }
}

#define SIMD_PATHS 4 /* avx2, avx512, avx512bf16, neon */

static kernels_t const *simd_paths[SIMD_PATHS];

static size_t simd_paths_available(void) {
    kernels_t const *all[SIMD_PATHS] = {kernels_avx2(), kernels_avx512(), kernels_avx512bf16(),
                                        kernels_neon()};
    size_t count = 0;
    for (size_t i = 0; i < SIMD_PATHS; ++i)
        if (all[i]) simd_paths[count++] = all[i];
    return count;
}

/* Scalar once, then every SIMD path against it. */
static void compare_paths(size_t m, size_t n, size_t k, options_t options) {
    problem_t p;
    problem_make(&p, m, n, k, options);
    run_whole(kernels_scalar(), &p, p.y_reference);
    for (size_t i = 0; i < simd_paths_available(); ++i) {
        run_whole(simd_paths[i], &p, p.y);
        check_against_scalar(&p, simd_paths[i]->name);
    }
    problem_free(&p);
}

/* Combination `number` of 24: bias, GELU, BF16 activations, and the residual mode. */
static options_t options_numbered(size_t number) {
    return (options_t){.bias = number & 1,
                       .gelu = number >> 1 & 1,
                       .x_bf16 = number >> 2 & 1,
                       .residual = (residual_mode_t)(number >> 3)};
}

/* ---- Scalar on hand-computed cases -------------------------------------------------------------- */

/* x [2, 4] . w [3, 4]^T + bias, every value exact in BF16 and every sum exact in F32:
 *   row 0: 1 - 3 + 8 = 6, 0.5 * 10 = 5, -2 + 2 + 1 = 1;   row 1: -1 - 0.25 + 4 = 2.75, 0.875, 2 + 0.5 + 0.5
 * = 3. */
static float const small_x[2][4] = {{1, 2, 3, 4}, {-1, 0.5f, 0.25f, 2}};
static float const small_w[3][4] = {{1, 0, -1, 2}, {0.5f, 0.5f, 0.5f, 0.5f}, {-2, 1, 0, 0.25f}};
static float const small_bias[3] = {0.5f, -1, 0};
static float const small_sums[2][3] = {{6, 5, 1}, {2.75f, 0.875f, 3}};

static double gelu_double(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
}

static void small_case(bool x_bf16, bool bias, bool gelu, residual_mode_t residual) {
    kernels_t const *scalar = kernels_scalar();
    uint16_t w[12], xb[8];
    float residual_values[6], y[6];
    for (size_t i = 0; i < 12; ++i)
        w[i] = f32_to_bf16(small_w[i / 4][i % 4]);
    for (size_t i = 0; i < 8; ++i)
        xb[i] = f32_to_bf16(small_x[i / 4][i % 4]);
    for (size_t i = 0; i < 6; ++i)
        residual_values[i] = y[i] = 10.0f * (float)(i + 1);
    void *packed = pack(scalar, w, 3, 4);
    kernel_gemm_t gemm = {
        .m = 2,
        .n = 3,
        .k = 4,
        .x = x_bf16 ? NULL : &small_x[0][0],
        .x_bf16 = x_bf16 ? xb : NULL,
        .x_stride = 4,
        .w = packed,
        .bias = bias ? small_bias : NULL,
        .residual = residual == RESIDUAL_NONE   ? NULL
                    : residual == RESIDUAL_IN_Y ? y
                                                : residual_values,
        .residual_stride = 3,
        .y = y,
        .y_stride = 3,
        .epilogue = gelu ? KERNEL_EPILOGUE_GELU : KERNEL_EPILOGUE_NONE,
    };
    scalar->gemm(&gemm, 0, 3);
    for (size_t row = 0; row < 2; ++row)
        for (size_t column = 0; column < 3; ++column) {
            double value = small_sums[row][column] + (bias ? small_bias[column] : 0.0f);
            if (gelu) value = gelu_double(value);
            if (residual != RESIDUAL_NONE) value += residual_values[row * 3 + column];
            double got = y[row * 3 + column];
            if (gelu)
                assert_true(fabs(got - value) <= 1e-6 * fmax(1.0, fabs(value)));
            else
                assert_true(got == value); /* exact */
        }
    free(packed);
}

static void test_scalar_small_exact(void **state) {
    (void)state;
    for (size_t number = 0; number < 24; ++number) {
        options_t o = options_numbered(number);
        small_case(o.x_bf16, o.bias, o.gelu, o.residual);
    }
}

/* GELU at a few points (k = 1, w = 1: y = gelu(x)) against the formula in double. */
static void test_scalar_gelu_points(void **state) {
    (void)state;
    static float const points[] = {-6, -3, -1.5f, -1, -0.5f, -0.01f, 0, 0.01f, 0.5f, 1, 1.5f, 3, 6};
    size_t count = sizeof points / sizeof points[0];
    kernels_t const *scalar = kernels_scalar();
    uint16_t one = f32_to_bf16(1.0f);
    void *packed = pack(scalar, &one, 1, 1);
    float y[sizeof points / sizeof points[0]];
    kernel_gemm_t gemm = {.m = count,
                          .n = 1,
                          .k = 1,
                          .x = points,
                          .x_stride = 1,
                          .w = packed,
                          .y = y,
                          .y_stride = 1,
                          .epilogue = KERNEL_EPILOGUE_GELU};
    scalar->gemm(&gemm, 0, 1);
    for (size_t i = 0; i < count; ++i)
        assert_true(fabs(y[i] - gelu_double(points[i])) <= 1e-6 * fmax(1, fabs(points[i])));
    assert_true(y[6] == 0.0f);
    free(packed);
}

/* The sum runs in k order in F32: (1e8 + 1) rounds to 1e8, then - 1e8 gives 0, where exact or pairwise
 * summation would give 1. */
static void test_scalar_k_order(void **state) {
    (void)state;
    kernels_t const *scalar = kernels_scalar();
    float const x[3] = {1e8f, 1.0f, -1e8f};
    uint16_t const w[3] = {f32_to_bf16(1.0f), f32_to_bf16(1.0f), f32_to_bf16(1.0f)};
    void *packed = pack(scalar, w, 1, 3);
    float y = -1.0f;
    kernel_gemm_t gemm = {.m = 1, .n = 1, .k = 3, .x = x, .x_stride = 3, .w = packed, .y = &y, .y_stride = 1};
    scalar->gemm(&gemm, 0, 1);
    assert_true(y == 0.0f);
    free(packed);
}

/* The scalar packing is w itself. */
static void test_scalar_packing_is_copy(void **state) {
    (void)state;
    random_state = 7;
    uint16_t w[5 * 7];
    for (size_t i = 0; i < 35; ++i)
        w[i] = f32_to_bf16(random_uniform());
    assert_int_equal(kernels_scalar()->gemm_packed_size(5, 7), sizeof w);
    void *packed = pack(kernels_scalar(), w, 5, 7);
    assert_memory_equal(packed, w, sizeof w);
    free(packed);
}

/* ---- SIMD paths against scalar ------------------------------------------------------------------ */

static size_t const sizes_m[] = {1, 2, 3, 7, 13, 64, 100};
static size_t const sizes_n[] = {1, 15, 16, 17, 63, 64, 65, 130, 200};
static size_t const sizes_k[] = {1, 2, 3, 31, 64, 65, 127, 768};
#define COUNT(array) (sizeof(array) / sizeof((array)[0]))

/* Every (m, n, k) of the lists, each with the next of 23 of the combinations (23 is prime to the
 * lists' lengths, so every combination meets every size); the 24th is in the next test. */
static void test_paths_match_scalar_on_shapes(void **state) {
    (void)state;
    if (!simd_paths_available()) skip();
    random_state = 1;
    size_t number = 0;
    for (size_t a = 0; a < COUNT(sizes_m); ++a)
        for (size_t b = 0; b < COUNT(sizes_n); ++b)
            for (size_t c = 0; c < COUNT(sizes_k); ++c)
                compare_paths(sizes_m[a], sizes_n[b], sizes_k[c], options_numbered(number++ % 23));
}

/* All 24 combinations on odd shapes, with k over several of every path's depth blocks, and n over
 * several column blocks. */
static void test_paths_match_scalar_on_every_epilogue(void **state) {
    (void)state;
    if (!simd_paths_available()) skip();
    random_state = 2;
    static size_t const shapes[][3] = {{13, 65, 127}, {7, 130, 1601}, {25, 97, 3}, {5, 1100, 33}};
    for (size_t s = 0; s < COUNT(shapes); ++s)
        for (size_t number = 0; number < 24; ++number)
            compare_paths(shapes[s][0], shapes[s][1], shapes[s][2], options_numbered(number));
}

/* ---- Determinism over column splits ------------------------------------------------------------- */

static void check_splits(kernels_t const *path, size_t m, size_t n, size_t k, options_t options) {
    problem_t p;
    problem_make(&p, m, n, k, options);
    run_whole(path, &p, p.y_reference);
    size_t tiles = (n + KERNEL_GEMM_TILE - 1) / KERNEL_GEMM_TILE, splits[64] = {0};
    assert_true(tiles <= 64);
    /* one call per tile */
    for (size_t t = 0; t < tiles; ++t)
        splits[t] = t + 1 < tiles ? (t + 1) * KERNEL_GEMM_TILE : n;
    run(path, &p, p.y, splits, tiles);
    assert_memory_equal(p.y, p.y_reference, m * p.y_stride * sizeof(float));
    /* two and three uneven calls */
    for (size_t first = 1; first < tiles; ++first) {
        size_t two[2] = {first * KERNEL_GEMM_TILE, n},
               three[3] = {KERNEL_GEMM_TILE, first * KERNEL_GEMM_TILE, n};
        run(path, &p, p.y, two, 2);
        assert_memory_equal(p.y, p.y_reference, m * p.y_stride * sizeof(float));
        if (first < 2) continue;
        run(path, &p, p.y, three, 3);
        assert_memory_equal(p.y, p.y_reference, m * p.y_stride * sizeof(float));
    }
    problem_free(&p);
}

static void test_splits_are_bitwise_identical(void **state) {
    (void)state;
    random_state = 3;
    kernels_t const *paths[] = {kernels_scalar(), kernels_avx2(), kernels_avx512(), kernels_avx512bf16(),
                                kernels_neon()};
    /* m, n, k and the combination: bias and GELU with the residual in y, separate, or none */
    static size_t const cases[][4] = {
        {13, 200, 127, 19}, {100, 330, 65, 11}, {7, 517, 1601, 23}, {3, 129, 768, 7}, {2, 1100, 65, 13}};
    for (size_t i = 0; i < COUNT(paths); ++i) {
        if (!paths[i]) continue;
        for (size_t c = 0; c < COUNT(cases); ++c)
            check_splits(paths[i], cases[c][0], cases[c][1], cases[c][2], options_numbered(cases[c][3]));
    }
}

int main(void) {
    struct CMUnitTest const tests[] = {
        cmocka_unit_test(test_scalar_small_exact),
        cmocka_unit_test(test_scalar_gelu_points),
        cmocka_unit_test(test_scalar_k_order),
        cmocka_unit_test(test_scalar_packing_is_copy),
        cmocka_unit_test(test_paths_match_scalar_on_shapes),
        cmocka_unit_test(test_paths_match_scalar_on_every_epilogue),
        cmocka_unit_test(test_splits_are_bitwise_identical),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
