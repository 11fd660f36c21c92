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

#include "fixtures.h"
#include "gemm_problem.h"
#include "kernel_fixtures.h"
#include "kernels.h"

/* ---- Fixtures ---------------------------------------------------------------------------------- */

/* BF16 weights [n, k] packed by `path`, 64-byte aligned (free() them). */
static void *pack(kernels_t const *path, uint16_t const *w, size_t n, size_t k) {
    size_t bytes = (path->gemm_packed_size(n, k) + 63) / 64 * 64;
    void *packed = aligned_alloc(64, bytes ? bytes : 64);
    assert_non_null(packed);
    path->gemm_pack(packed, w, n, k);
    return packed;
}

static kernels_t const *simd[SIMD_PATHS];

/* Scalar once, then every SIMD path against it. */
static void compare_paths(size_t m, size_t n, size_t k, options_t options) {
    problem_compare(simd, simd_paths_present(simd), m, n, k, options);
}

/* ---- Scalar on hand-computed cases -------------------------------------------------------------- */

/* x [2, 4] . w [3, 4]^T + bias, every value exact in BF16 and every sum exact in F32:
 *   row 0: 1 - 3 + 8 = 6, 0.5 * 10 = 5, -2 + 2 + 1 = 1;   row 1: -1 - 0.25 + 4 = 2.75, 0.875, 2 + 0.5 + 0.5
 * = 3. */
static float const small_x[2][4] = {{1, 2, 3, 4}, {-1, 0.5f, 0.25f, 2}};
static float const small_w[3][4] = {{1, 0, -1, 2}, {0.5f, 0.5f, 0.5f, 0.5f}, {-2, 1, 0, 0.25f}};
static float const small_bias[3] = {0.5f, -1, 0};
static float const small_sums[2][3] = {{6, 5, 1}, {2.75f, 0.875f, 3}};

static void small_case(bool x_bf16, bool bias, kernel_epilogue_t epilogue, residual_mode_t residual) {
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
        .epilogue = epilogue,
    };
    scalar->gemm(&gemm, 0, 3);
    for (size_t row = 0; row < 2; ++row)
        for (size_t column = 0; column < 3; ++column) {
            double value =
                epilogue_double(epilogue, small_sums[row][column] + (bias ? small_bias[column] : 0.0f));
            if (residual != RESIDUAL_NONE) value += residual_values[row * 3 + column];
            double got = y[row * 3 + column];
            if (epilogue != KERNEL_EPILOGUE_NONE)
                assert_true(fabs(got - value) <= 1e-6 * fmax(1.0, fabs(value)));
            else
                assert_true(got == value); /* exact */
        }
    free(packed);
}

static void test_scalar_small_exact(void **state) {
    (void)state;
    for (size_t number = 0; number < OPTIONS_COUNT; ++number) {
        options_t o = options_numbered(false, number);
        small_case(o.x_bf16, o.bias, o.epilogue, o.residual);
    }
}

static kernel_epilogue_t const activations[] = {KERNEL_EPILOGUE_GELU, KERNEL_EPILOGUE_GELU_ERF,
                                                KERNEL_EPILOGUE_GELU_QUICK};
static char const *const activation_names[] = {"GELU", "exact GELU", "quick GELU"};

/* Each GELU at a few points (k = 1, w = 1: y = gelu(x)) against its formula in double. */
static void test_scalar_gelu_points(void **state) {
    (void)state;
    static float const points[] = {-6, -3, -1.5f, -1, -0.5f, -0.01f, 0, 0.01f, 0.5f, 1, 1.5f, 3, 6};
    size_t count = sizeof points / sizeof points[0];
    float y[sizeof points / sizeof points[0]];
    for (size_t a = 0; a < COUNT(activations); ++a) {
        gemm_activation(kernels_scalar(), activations[a], points, count, y);
        for (size_t i = 0; i < count; ++i)
            assert_true(fabs(y[i] - epilogue_double(activations[a], points[i])) <=
                        1e-6 * fmax(1, fabs(points[i])));
        assert_true(y[6] == 0.0f);
    }
}

/* Every GELU of every path (scalar included) against its formula in double within kernels.h's 1e-6 |x| +
 * 1e-7, on every BF16 value of magnitude up to 16 (BF16, so that the paths that round x to BF16 see x
 * itself); and the exact and quick GELUs far out, where they are x or 0, up to the largest BF16. */
static void test_paths_activations_match_formula(void **state) {
    (void)state;
    kernels_t const *paths[SIMD_PATHS + 1] = {kernels_scalar()};
    size_t path_count = 1 + simd_paths_present(paths + 1), count = 0;
    float *x = test_malloc(2 * 0x8000 * sizeof(float)), *y = test_malloc(2 * 0x8000 * sizeof(float));
    for (uint32_t bits = 0; bits < 0x8000; ++bits) {
        float value = bf16_to_f32((uint16_t)bits);
        if (value > 16.0f) break;
        x[count++] = value;
        x[count++] = -value;
    }
    for (size_t p = 0; p < path_count; ++p)
        for (size_t a = 0; a < COUNT(activations); ++a) {
            gemm_activation(paths[p], activations[a], x, count, y);
            double worst = 0.0;
            for (size_t i = 0; i < count; ++i) {
                double exact = epilogue_double(activations[a], x[i]), error = fabs(y[i] - exact);
                check_near(y[i], exact, 1e-6 * fabs(x[i]) + 1e-7, paths[p]->name, i);
                worst = fmax(worst, error / (fabs(x[i]) + 0.1));
            }
            print_message("%s %s: worst error / (|x| + 0.1) = %.3g\n", paths[p]->name, activation_names[a],
                          worst);
            if (activations[a] == KERNEL_EPILOGUE_GELU) continue;
            float const largest = bf16_to_f32(0x7f7f), extremes[] = {largest, -largest, 100.0f, -100.0f};
            float out[4];
            gemm_activation(paths[p], activations[a], extremes, 4, out);
            assert_true(out[0] == largest && out[2] == 100.0f && fabsf(out[1]) <= 1e-30f &&
                        fabsf(out[3]) <= 1e-30f);
        }
    test_free(x), test_free(y);
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
    random_seed(7);
    uint16_t w[5 * 7];
    for (size_t i = 0; i < 35; ++i)
        w[i] = f32_to_bf16(random_uniform(-1.0f, 1.0f));
    assert_int_equal(kernels_scalar()->gemm_packed_size(5, 7), sizeof w);
    void *packed = pack(kernels_scalar(), w, 5, 7);
    assert_memory_equal(packed, w, sizeof w);
    free(packed);
}

/* ---- SIMD paths against scalar ------------------------------------------------------------------ */

static size_t const sizes_m[] = {1, 2, 3, 7, 13, 64, 100};
static size_t const sizes_n[] = {1, 15, 16, 17, 63, 64, 65, 130, 200};
static size_t const sizes_k[] = {1, 2, 3, 31, 64, 65, 127, 768};

/* Every (m, n, k) of the lists, each with the next of 47 of the combinations (47 is prime to the
 * lists' lengths, so every combination meets every size); the 48th is in the next test. */
static void test_paths_match_scalar_on_shapes(void **state) {
    (void)state;
    if (!simd_paths_present(simd)) skip();
    random_seed(1);
    size_t number = 0;
    for (size_t a = 0; a < COUNT(sizes_m); ++a)
        for (size_t b = 0; b < COUNT(sizes_n); ++b)
            for (size_t c = 0; c < COUNT(sizes_k); ++c)
                compare_paths(sizes_m[a], sizes_n[b], sizes_k[c], options_numbered(false, number++ % 47));
}

/* All the combinations on odd shapes, with k over several of every path's depth blocks, and n over
 * several column blocks. */
static void test_paths_match_scalar_on_every_epilogue(void **state) {
    (void)state;
    if (!simd_paths_present(simd)) skip();
    random_seed(2);
    static size_t const shapes[][3] = {{13, 65, 127}, {7, 130, 1601}, {25, 97, 3}, {5, 1100, 33}};
    for (size_t s = 0; s < COUNT(shapes); ++s)
        for (size_t number = 0; number < OPTIONS_COUNT; ++number)
            compare_paths(shapes[s][0], shapes[s][1], shapes[s][2], options_numbered(false, number));
}

/* ---- Determinism over column splits ------------------------------------------------------------- */

static void test_splits_are_bitwise_identical(void **state) {
    (void)state;
    random_seed(3);
    kernels_t const *paths[SIMD_PATHS + 1] = {kernels_scalar()};
    size_t count = 1 + simd_paths_present(paths + 1);
    /* m, n, k and the combination (options_numbered): bias and each GELU or none, with the residual in y,
     * separate, or none */
    static size_t const cases[][4] = {
        {13, 200, 127, 35}, {100, 330, 65, 21}, {7, 517, 1601, 47}, {3, 129, 768, 11}, {2, 1100, 65, 25}};
    for (size_t i = 0; i < count; ++i)
        for (size_t c = 0; c < COUNT(cases); ++c)
            problem_check_splits(paths[i], cases[c][0], cases[c][1], cases[c][2],
                                 options_numbered(false, cases[c][3]));
}

int main(void) {
    print_simd_paths();
    struct CMUnitTest const tests[] = {
        cmocka_unit_test(test_scalar_small_exact),
        cmocka_unit_test(test_scalar_gelu_points),
        cmocka_unit_test(test_paths_activations_match_formula),
        cmocka_unit_test(test_scalar_k_order),
        cmocka_unit_test(test_scalar_packing_is_copy),
        cmocka_unit_test(test_paths_match_scalar_on_shapes),
        cmocka_unit_test(test_paths_match_scalar_on_every_epilogue),
        cmocka_unit_test(test_splits_are_bitwise_identical),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
