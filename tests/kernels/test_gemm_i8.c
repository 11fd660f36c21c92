/* The I8 kernels (kernels.h): the scalar path on hand-computed cases (it defines the numbers), the weights'
 * and the activations' quantization, then every path this CPU runs against scalar: quantize_rows bitwise,
 * the I8 GEMM's integer sums bitwise (unit scales, no bias: y is the exact sum) on odd shapes, over depth
 * and column blocks, and at the depth bound with the largest sums, its epilogues within kernels.h's
 * tolerance, and its output bitwise unchanged when the columns are split between calls. Quantized
 * activations times quantized weights stay close to the F32 product they stand for. */
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
#include "kernels.h"

#define COUNT(array) (sizeof(array) / sizeof((array)[0]))

/* Every path this CPU and build run, scalar first, then every one with its own I8 GEMM or quantizer. */
static size_t paths_present(kernels_t const *paths[16]) {
    static char const *const names[] = {"scalar", "avx2",       "avxvnni",    "avxvnni_evex",
                                        "avx512", "avx512vnni", "avx512bf16", "amx",
                                        "neon",   "neondot",    "neoni8mm"};
    size_t count = 0;
    for (size_t i = 0; i < COUNT(names); ++i) {
        kernels_t const *path = kernels_named(names[i]);
        if (path) paths[count++] = path;
    }
    return count;
}

/* I8 weights [n, k] with their scales packed by `path`, 64-byte aligned (free() them). */
static void *pack(kernels_t const *path, int8_t const *w, float const *scales, size_t n, size_t k) {
    size_t bytes = (path->gemm_i8_packed_size(n, k) + 63) / 64 * 64;
    void *packed = aligned_alloc(64, bytes ? bytes : 64);
    assert_non_null(packed);
    path->gemm_i8_pack(packed, w, scales, n, k);
    return packed;
}

/* Scalar once, then every other path against it. */
static void compare_paths(size_t m, size_t n, size_t k, options_t options) {
    kernels_t const *paths[16];
    size_t count = paths_present(paths);
    problem_compare(paths + 1, count - 1, m, n, k, options);
}

static options_t const EXACT = {.i8 = true};

/* ---- Scalar on hand-computed cases -------------------------------------------------------------- */

/* x [2, 3] with zero points 100 and 0, w [2, 3]:
 *   row 0: x - 100 = (-100, 0, 155): w0 = (1, -2, 3) gives -100 + 465 = 365; w1 = (-128, 127, 0) 12800
 *   row 1: x = (1, 2, 255): w0 gives 1 - 4 + 765 = 762; w1 -128 + 254 = 126
 * then y = S x_scale w_scale + bias, the epilogue's activation, residual. */
static uint8_t const small_x[2][3] = {{0, 100, 255}, {1, 2, 255}};
static int32_t const small_zeros[2] = {100, 0};
static int8_t const small_w[2][3] = {{1, -2, 3}, {-128, 127, 0}};
static float const small_sums[2][2] = {{365, 12800}, {762, 126}};
static float const small_x_scales[2] = {0.5f, 0.25f}, small_w_scales[2] = {0.125f, 2.0f};
static float const small_bias[2] = {-1.0f, 0.5f};

static void small_case(options_t o) {
    kernels_t const *scalar = kernels_scalar();
    float y[4], residual[4], x_scales[2], w_scales[2];
    for (size_t i = 0; i < 2; ++i) {
        x_scales[i] = o.scaled ? small_x_scales[i] : 1.0f;
        w_scales[i] = o.scaled ? small_w_scales[i] : 1.0f;
    }
    for (size_t i = 0; i < 4; ++i)
        residual[i] = y[i] = 10.0f * (float)(i + 1);
    void *packed = pack(scalar, &small_w[0][0], w_scales, 2, 3);
    kernel_gemm_t gemm = {.m = 2,
                          .n = 2,
                          .k = 3,
                          .x_stride = 3,
                          .w = packed,
                          .bias = o.bias ? small_bias : NULL,
                          .residual = o.residual == RESIDUAL_NONE   ? NULL
                                      : o.residual == RESIDUAL_IN_Y ? y
                                                                    : residual,
                          .residual_stride = 2,
                          .y = y,
                          .y_stride = 2,
                          .epilogue = o.epilogue,
                          .x_u8 = &small_x[0][0],
                          .x_scales = x_scales,
                          .x_zeros = small_zeros};
    scalar->gemm_i8(&gemm, 0, 2);
    for (size_t row = 0; row < 2; ++row)
        for (size_t column = 0; column < 2; ++column) {
            double value = small_sums[row][column] * x_scales[row] * w_scales[column];
            if (o.bias) value += small_bias[column];
            value = epilogue_double(o.epilogue, value);
            if (o.residual != RESIDUAL_NONE) value += residual[row * 2 + column];
            double got = y[row * 2 + column];
            assert_true(fabs(got - value) <= 1e-6 * fmax(1.0, fabs(value)));
        }
    free(packed);
}

static void test_scalar_small_cases(void **state) {
    (void)state;
    for (size_t number = 0; number < OPTIONS_COUNT; ++number)
        small_case(options_numbered(true, number));
}

/* The scalar packing is w itself, then the scales at the next multiple of 64 bytes. */
static void test_scalar_packing(void **state) {
    (void)state;
    int8_t w[5 * 7];
    float scales[5] = {1, 2, 3, 4, 5};
    for (size_t i = 0; i < sizeof w; ++i)
        w[i] = (int8_t)(i * 7);
    assert_int_equal(kernels_scalar()->gemm_i8_packed_size(5, 7), 64 + sizeof scales);
    char *packed = pack(kernels_scalar(), w, scales, 5, 7);
    assert_memory_equal(packed, w, sizeof w);
    assert_memory_equal(packed + 64, scales, sizeof scales);
    free(packed);
}

/* ---- Quantization ------------------------------------------------------------------------------- */

/* max |w| = 1.5: scale 1.5 / 127, q = round(w / scale) half away from zero (0.75 -> 63.5 -> 64);
 * a zero row: scale 0; a NaN or an infinity: scale NaN, q all 0. */
static void test_quantize_weights(void **state) {
    (void)state;
    float const values[] = {1.5f, -1.5f, 0.75f, -0.75f, 0.0f, 0.005859375f};
    uint16_t w[COUNT(values)];
    for (size_t i = 0; i < COUNT(values); ++i)
        w[i] = f32_to_bf16(values[i]);
    int8_t q[COUNT(values)];
    float scale;
    kernel_quantize_weights(q, &scale, w, COUNT(values));
    assert_true(scale == 1.5f / 127.0f);
    int8_t const expected[] = {127, -127, 64, -64, 0, 0}; /* 0.0059 / 0.0118 = 0.496: 0 */
    assert_memory_equal(q, expected, sizeof expected);

    uint16_t zeros[4] = {0, 0x8000, 0, 0};
    kernel_quantize_weights(q, &scale, zeros, 4);
    assert_true(scale == 0.0f);
    assert_memory_equal(q, (int8_t[4]){0}, 4);

    /* Rows of every magnitude against roundf(w / scale), the definition, bitwise. */
    random_seed(13);
    for (size_t row = 0; row < 200; ++row) {
        uint16_t drawn[97];
        int8_t got[97];
        float top = ldexpf(1.0f, (int)random_below(60) - 30);
        for (size_t i = 0; i < COUNT(drawn); ++i)
            drawn[i] = f32_to_bf16(random_uniform(-top, top));
        kernel_quantize_weights(got, &scale, drawn, COUNT(drawn));
        for (size_t i = 0; i < COUNT(drawn); ++i)
            assert_int_equal(got[i], (int8_t)roundf(bf16_to_f32(drawn[i]) / scale));
    }

    uint16_t const not_finite[][3] = {{0x3f80, 0x7fc0, 0x3f80}, {0x3f80, 0x7f80, 0x3f80}, {0xff80, 0, 0}};
    for (size_t i = 0; i < COUNT(not_finite); ++i) {
        memset(q, 1, sizeof q);
        kernel_quantize_weights(q, &scale, not_finite[i], 3);
        assert_true(isnan(scale));
        assert_memory_equal(q, (int8_t[3]){0}, 3);
    }
}

/* Rows of every length to 100 and a few long ones, of every kind (mixed signs at magnitudes from 2^-30 to
 * 2^30, subnormals, signed zeros, one outlier, ties of the rounding, a NaN or an infinity anywhere, all
 * zero): every path's quantize_weights bitwise kernel_quantize_weights, its scale too. */
static void test_quantize_weights_paths(void **state) {
    (void)state;
    kernels_t const *paths[16];
    size_t count = paths_present(paths);
    random_seed(19);
    static size_t const long_rows[] = {255, 256, 257, 768, 3072, 3075};
    for (size_t length = 1; length < 100 + COUNT(long_rows); ++length) {
        size_t k = length < 100 ? length : long_rows[length - 100];
        uint16_t *w = problem_allocate(k * sizeof(uint16_t));
        int8_t *q = problem_allocate(k), *q_reference = problem_allocate(k);
        for (size_t kind = 0; kind < 9; ++kind) {
            float top = ldexpf(1.0f, (int)random_below(61) - 30);
            for (size_t i = 0; i < k; ++i)
                w[i] = kind == 1   ? (uint16_t)(random_below(0x80) | (random_below(2) << 15)) /* subnormal */
                       : kind == 2 ? (uint16_t)(random_below(2) << 15)                        /* +-0 */
                       : kind == 3 ? f32_to_bf16(i == k / 2 ? 1e4f : random_uniform(-1.0f, 1.0f))
                       : kind == 4
                           ? f32_to_bf16(i == 0 ? 127.0f / 128.0f /* scale 2^-7: ratios n + 0.5 */
                                                : ((float)((int)random_below(254) - 127) + 0.5f) / 128.0f)
                       : kind == 5 ? (i == random_below(k) ? 0x7fc0 : f32_to_bf16(random_uniform(-top, top)))
                       : kind == 6 ? (i == k - 1 ? 0xff80 : f32_to_bf16(random_uniform(-top, top)))
                       : kind == 7 ? (i == 0 ? 0x7f80 : f32_to_bf16(random_uniform(-top, top)))
                                   : f32_to_bf16(random_uniform(-top, top));
            float scale, scale_reference;
            kernel_quantize_weights(q_reference, &scale_reference, w, k);
            for (size_t p = 0; p < count; ++p) {
                memset(q, 0x55, k);
                paths[p]->quantize_weights(q, &scale, w, k);
                assert_memory_equal(q, q_reference, k);
                assert_memory_equal(&scale, &scale_reference, sizeof scale);
            }
        }
        free(w), free(q), free(q_reference);
    }
}

/* quantize_rows of one row of k values on `path`: q, the scale and the zero point. */
static void quantize_one(kernels_t const *path, float const *x, size_t k, uint8_t *q, float *scale,
                         int32_t *zero) {
    path->quantize_rows(q, k, scale, zero, x, k, 1, k);
}

/* [-1, 0, 3]: lo -1, hi 3, inv 63.75, zero rint(63.75) = 64, q = rint(x inv) + 64 = 0, 64, 255 (191.25 ->
 * 191); an all-positive row keeps 0 in its range (zero 0); zero rows and rows too small to divide by are
 * zeros of scale 0; a NaN or an infinity gives scale NaN. */
static void test_quantize_rows_scalar(void **state) {
    (void)state;
    kernels_t const *scalar = kernels_scalar();
    uint8_t q[4];
    float scale;
    int32_t zero;
    quantize_one(scalar, (float[]){-1.0f, 0.0f, 3.0f}, 3, q, &scale, &zero);
    assert_int_equal(zero, 64);
    assert_true(scale == 4.0f / 255.0f);
    assert_memory_equal(q, ((uint8_t[]){0, 64, 255}), 3);

    quantize_one(scalar, (float[]){2.0f, 1.0f, 0.5f, 1.5f}, 4, q, &scale, &zero);
    assert_int_equal(zero, 0);
    assert_true(scale == 2.0f / 255.0f);
    assert_memory_equal(q, ((uint8_t[]){255, 128, 64, 191}), 4); /* 127.5 -> 128, 63.75 -> 64 */

    quantize_one(scalar, (float[]){-2.0f, -1.0f}, 2, q, &scale, &zero);
    assert_int_equal(zero, 255);
    assert_memory_equal(q, ((uint8_t[]){0, 127}), 2); /* -127.5 -> -128 (to even), + 255 */

    float const *silent[] = {(float[]){0.0f, -0.0f, 0.0f}, (float[]){1e-40f, 0.0f, -1e-40f}};
    for (size_t i = 0; i < COUNT(silent); ++i) {
        memset(q, 7, sizeof q);
        quantize_one(scalar, silent[i], 3, q, &scale, &zero);
        assert_true(scale == 0.0f);
        assert_int_equal(zero, 0);
        assert_memory_equal(q, ((uint8_t[3]){0}), 3);
    }
    float const *broken[] = {(float[]){1.0f, NAN, 0.0f}, (float[]){INFINITY, 0.0f, 0.0f},
                             (float[]){0.0f, 0.0f, -INFINITY}};
    for (size_t i = 0; i < COUNT(broken); ++i) {
        quantize_one(scalar, broken[i], 3, q, &scale, &zero);
        assert_true(isnan(scale));
        assert_memory_equal(q, ((uint8_t[3]){0}), 3);
    }
}

/* Rows of every length to 100 and a few long ones, of every kind (mixed signs, one sign, an outlier,
 * zeros, a NaN, infinities): every path bitwise the scalar one, scales and zero points too. */
static void test_quantize_rows_paths(void **state) {
    (void)state;
    kernels_t const *paths[16];
    size_t count = paths_present(paths);
    random_seed(11);
    static size_t const long_rows[] = {255, 256, 257, 768, 3072, 3075};
    for (size_t length = 1; length < 100 + COUNT(long_rows); ++length) {
        size_t k = length < 100 ? length : long_rows[length - 100], rows = 7;
        float *x = problem_allocate(rows * (k + 1) * sizeof(float));
        for (size_t r = 0; r < rows; ++r)
            for (size_t i = 0; i < k + 1; ++i) {
                float value = random_uniform(-3.0f, 3.0f);
                x[r * (k + 1) + i] = r == 1   ? fabsf(value)
                                     : r == 2 ? -fabsf(value)
                                     : r == 3 ? (i == k / 2 ? 1e4f : value)
                                     : r == 4 ? 0.0f
                                     : r == 5 ? (i == k - 1 ? NAN : value)
                                     : r == 6 ? (i == 0           ? -INFINITY
                                                 : i == k / 2 + 1 ? INFINITY
                                                                  : value)
                                              : value;
            }
        uint8_t *q = problem_allocate(rows * k), *q_reference = problem_allocate(rows * k);
        float scales[7], scales_reference[7];
        int32_t zeros[7], zeros_reference[7];
        paths[0]->quantize_rows(q_reference, k, scales_reference, zeros_reference, x, k + 1, rows, k);
        for (size_t p = 1; p < count; ++p) {
            paths[p]->quantize_rows(q, k, scales, zeros, x, k + 1, rows, k);
            assert_memory_equal(q, q_reference, rows * k);
            assert_memory_equal(scales, scales_reference, sizeof scales);
            assert_memory_equal(zeros, zeros_reference, sizeof zeros);
        }
        free(x);
        free(q);
        free(q_reference);
    }
}

/* Quantized activations and weights stand for the F32 product: over random rows of mixed, shifted and
 * post-GELU-like (mostly positive) values, each row of y_i8 against x w^T in double within 2% in L2 (8-bit
 * steps on both sides, summed over k = 768, make about 1%; a zero point of the wrong sign, far more). */
static void test_quantized_product_is_close(void **state) {
    (void)state;
    size_t const m = 6, n = 40, k = 768;
    problem_t p;
    problem_make(&p, m, n, k, (options_t){.i8 = true});
    random_seed(12);
    for (size_t r = 0; r < m; ++r)
        for (size_t i = 0; i < k; ++i) {
            float value = random_uniform(-1.0f, 1.0f);
            p.x[r * p.x_stride + i] = r % 3 == 0 ? value : r % 3 == 1 ? value + 2.0f : fmaxf(value, -0.17f);
        }
    for (size_t i = 0; i < n * k; ++i)
        p.w[i] = f32_to_bf16(random_uniform(-0.05f, 0.05f));
    for (size_t c = 0; c < n; ++c)
        kernel_quantize_weights(p.w_i8 + c * k, &p.w_scales[c], p.w + c * k, k);
    kernels_t const *paths[16];
    size_t count = paths_present(paths);
    for (size_t path = 0; path < count; ++path) {
        paths[path]->quantize_rows(p.x_u8, p.x_stride, p.x_scales, p.zeros, p.x, p.x_stride, m, k);
        problem_run_whole(paths[path], &p, p.y);
        for (size_t r = 0; r < m; ++r) {
            double error = 0.0, norm = 0.0;
            for (size_t c = 0; c < n; ++c) {
                double exact = 0.0;
                for (size_t i = 0; i < k; ++i)
                    exact += (double)p.x[r * p.x_stride + i] * bf16_to_f32(p.w[c * k + i]);
                double got = p.y[r * p.y_stride + c];
                error += (got - exact) * (got - exact);
                norm += exact * exact;
            }
            assert_true(sqrt(error) <= 0.02 * sqrt(norm));
        }
    }
    problem_free(&p);
}

/* ---- Every path against scalar ------------------------------------------------------------------ */

static size_t const sizes_m[] = {1, 2, 3, 7, 13, 15, 64, 100};
static size_t const sizes_n[] = {1, 15, 16, 17, 33, 63, 64, 65, 130, 200};
static size_t const sizes_k[] = {1, 2, 3, 4, 5, 7, 8, 9, 31, 64, 65, 127, 768};

/* Every (m, n, k) of the lists, the integer sums exact: bitwise the scalar path's. */
static void test_paths_match_scalar_exactly(void **state) {
    (void)state;
    random_seed(1);
    for (size_t a = 0; a < COUNT(sizes_m); ++a)
        for (size_t b = 0; b < COUNT(sizes_n); ++b)
            for (size_t c = 0; c < COUNT(sizes_k); ++c)
                compare_paths(sizes_m[a], sizes_n[b], sizes_k[c], EXACT);
}

/* All the combinations on odd shapes, with k over several depth blocks of every path, and n over several
 * column blocks. */
static void test_paths_match_scalar_on_every_epilogue(void **state) {
    (void)state;
    random_seed(2);
    static size_t const shapes[][3] = {
        {13, 65, 127}, {7, 130, 2100}, {25, 97, 3}, {5, 1100, 33}, {17, 70, 1030}};
    for (size_t s = 0; s < COUNT(shapes); ++s)
        for (size_t number = 0; number < OPTIONS_COUNT; ++number)
            compare_paths(shapes[s][0], shapes[s][1], shapes[s][2], options_numbered(true, number));
}

/* At k = KERNEL_I8_DEPTH_MAX with every x 255 over a zero point 0 and every weight -128 (and the
 * opposite signs), |S| = 255 * 128 * 65536 is just under 2^31: every path writes exactly (float)S. */
static void test_largest_sums_are_exact(void **state) {
    (void)state;
    problem_t p;
    random_seed(4);
    problem_make_largest_sums(&p, 3, 64);
    kernels_t const *paths[16];
    size_t count = paths_present(paths);
    for (size_t i = 0; i < count; ++i) {
        problem_run_whole(paths[i], &p, p.y);
        problem_check_largest_sums(&p);
    }
    problem_free(&p);
}

/* ---- Determinism over column splits ------------------------------------------------------------- */

static void test_splits_are_bitwise_identical(void **state) {
    (void)state;
    random_seed(3);
    kernels_t const *paths[16];
    size_t count = paths_present(paths);
    /* m, n, k and the combination (options_numbered): bias, scales, an epilogue of each kind or none, and the
     * residual in y, separate, or none */
    static size_t const cases[][4] = {
        {13, 200, 127, 45}, {100, 330, 65, 25}, {7, 517, 1601, 15}, {2, 1100, 65, 43}};
    for (size_t i = 0; i < count; ++i)
        for (size_t c = 0; c < COUNT(cases); ++c)
            problem_check_splits(paths[i], cases[c][0], cases[c][1], cases[c][2],
                                 options_numbered(true, cases[c][3]));
}

int main(void) {
    kernels_t const *paths[16];
    size_t count = paths_present(paths);
    for (size_t i = 0; i < count; ++i)
        print_message("path %s: %s\n", paths[i]->name, i ? "compared with scalar" : "the reference");
    if (!kernels_named("amx")) print_message("path amx: skipped (%s)\n", kernels_amx_state());
    struct CMUnitTest const tests[] = {
        cmocka_unit_test(test_scalar_small_cases),
        cmocka_unit_test(test_scalar_packing),
        cmocka_unit_test(test_quantize_weights),
        cmocka_unit_test(test_quantize_weights_paths),
        cmocka_unit_test(test_quantize_rows_scalar),
        cmocka_unit_test(test_quantize_rows_paths),
        cmocka_unit_test(test_quantized_product_is_close),
        cmocka_unit_test(test_paths_match_scalar_exactly),
        cmocka_unit_test(test_paths_match_scalar_on_every_epilogue),
        cmocka_unit_test(test_largest_sums_are_exact),
        cmocka_unit_test(test_splits_are_bitwise_identical),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
