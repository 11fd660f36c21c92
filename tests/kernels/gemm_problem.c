/* GEMM problems the GEMM suites share (gemm_problem.h). */
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

static float const SENTINEL = -12345.0f; /* fills y's padding, which no path may write */

options_t options_numbered(bool i8, size_t number) {
    return (options_t){.i8 = i8,
                       .bias = number & 1,
                       .epilogue = (kernel_epilogue_t)(number >> 1 & 3),
                       .x_bf16 = !i8 && (number >> 3 & 1),
                       .scaled = i8 && (number >> 3 & 1),
                       .residual = (residual_mode_t)(number >> 4)};
}

double epilogue_double(kernel_epilogue_t epilogue, double x) {
    switch (epilogue) {
    case KERNEL_EPILOGUE_GELU:
        return 0.5 * x * (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
    case KERNEL_EPILOGUE_GELU_ERF:
        return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    case KERNEL_EPILOGUE_GELU_QUICK:
        return x / (1.0 + exp(-1.702 * x));
    case KERNEL_EPILOGUE_NONE:
        break;
    }
    return x;
}

void *problem_allocate(size_t bytes) {
    void *memory = malloc(bytes ? bytes : 1);
    assert_non_null(memory);
    return memory;
}

/* The I8 inputs: values anywhere in their ranges, -128 weights included, zero points anywhere in 0..255,
 * and scales that bring sums of up to 2^15 k near 1 (so that the GELUs see both of their sides) or 1. */
static void make_i8(problem_t *p) {
    for (size_t i = 0; i < p->m * p->x_stride; ++i)
        p->x_u8[i] = (uint8_t)random_below(256);
    for (size_t i = 0; i < p->n * p->k; ++i)
        p->w_i8[i] = (int8_t)((int)random_below(256) - 128);
    for (size_t r = 0; r < p->m; ++r) {
        p->zeros[r] = (int32_t)random_below(256);
        p->x_scales[r] = p->options.scaled ? random_uniform(0.5f, 2.0f) / (float)p->k / 1024.0f : 1.0f;
    }
    for (size_t c = 0; c < p->n; ++c)
        p->w_scales[c] = p->options.scaled ? random_uniform(0.5f, 2.0f) : 1.0f;
}

void problem_make(problem_t *p, size_t m, size_t n, size_t k, options_t options) {
    *p = (problem_t){.m = m, .n = n, .k = k, .x_stride = k + 3, .y_stride = n + 5, .options = options};
    p->residual_stride = options.residual == RESIDUAL_IN_Y ? p->y_stride : n + 7;
    p->x = problem_allocate(m * p->x_stride * sizeof(float));
    p->x_bf16 = problem_allocate(m * p->x_stride * sizeof(uint16_t));
    p->w = problem_allocate(n * k * sizeof(uint16_t));
    p->bias = problem_allocate(n * sizeof(float));
    p->residual = problem_allocate(m * p->residual_stride * sizeof(float));
    p->y = problem_allocate(m * p->y_stride * sizeof(float));
    p->y_reference = problem_allocate(m * p->y_stride * sizeof(float));
    p->x_u8 = problem_allocate(m * p->x_stride);
    p->w_i8 = problem_allocate(n * k);
    p->zeros = problem_allocate(m * sizeof(int32_t));
    p->x_scales = problem_allocate(m * sizeof(float));
    p->w_scales = problem_allocate(n * sizeof(float));
    float w_scale = 3.0f / sqrtf((float)k); /* sums of order 1, so that the GELUs see both of their sides */
    for (size_t i = 0; i < m * p->x_stride; ++i) {
        p->x[i] = random_uniform(-1.0f, 1.0f);
        p->x_bf16[i] = f32_to_bf16(random_uniform(-1.0f, 1.0f));
    }
    for (size_t i = 0; i < n * k; ++i)
        p->w[i] = f32_to_bf16(w_scale * random_uniform(-1.0f, 1.0f));
    for (size_t i = 0; i < n; ++i)
        p->bias[i] = random_uniform(-1.0f, 1.0f);
    for (size_t i = 0; i < m * p->residual_stride; ++i)
        p->residual[i] = random_uniform(-1.0f, 1.0f);
    make_i8(p);
}

void problem_free(problem_t *p) {
    void *buffers[] = {p->x,           p->x_bf16, p->w,    p->bias,  p->residual, p->y,
                       p->y_reference, p->x_u8,   p->w_i8, p->zeros, p->x_scales, p->w_scales};
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; ++i)
        free(buffers[i]);
}

void *problem_pack(kernels_t const *path, problem_t const *p) {
    size_t bytes = p->options.i8 ? path->gemm_i8_packed_size(p->n, p->k) : path->gemm_packed_size(p->n, p->k);
    void *packed = aligned_alloc(64, bytes ? (bytes + 63) / 64 * 64 : 64);
    assert_non_null(packed);
    if (p->options.i8)
        path->gemm_i8_pack(packed, p->w_i8, p->w_scales, p->n, p->k);
    else
        path->gemm_pack(packed, p->w, p->n, p->k);
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
    bool bf16_x = !o->i8 && o->x_bf16, f32_x = !o->i8 && !o->x_bf16;
    return (kernel_gemm_t){
        .m = p->m,
        .n = p->n,
        .k = p->k,
        .x = f32_x ? p->x : NULL,
        .x_bf16 = bf16_x ? p->x_bf16 : NULL,
        .x_stride = p->x_stride,
        .w = packed,
        .bias = o->bias ? p->bias : NULL,
        .residual = o->residual == RESIDUAL_NONE   ? NULL
                    : o->residual == RESIDUAL_IN_Y ? y
                                                   : p->residual,
        .residual_stride = p->residual_stride,
        .y = y,
        .y_stride = p->y_stride,
        .epilogue = o->epilogue,
        .x_u8 = o->i8 ? p->x_u8 : NULL,
        .x_scales = o->i8 ? p->x_scales : NULL,
        .x_zeros = o->i8 ? p->zeros : NULL,
    };
}

void problem_run(kernels_t const *path, problem_t const *p, float *y, size_t const *splits, size_t count) {
    void *packed = problem_pack(path, p);
    prepare_y(p, y);
    kernel_gemm_t gemm = gemm_of(p, packed, y);
    for (size_t i = 0, begin = 0; i < count; begin = splits[i++]) {
        if (p->options.i8)
            path->gemm_i8(&gemm, begin, splits[i]);
        else
            path->gemm(&gemm, begin, splits[i]);
    }
    free(packed);
}

void problem_run_whole(kernels_t const *path, problem_t const *p, float *y) {
    problem_run(path, p, y, &p->n, 1);
}

/* What an output may differ by from the scalar path's (kernels.h): BF16, 1e-2 (|bias| + sum_k |x w|) +
 * 1e-6; I8, nothing where unscaled without an epilogue, else 1e-5 (|S x_scale w_scale| + |bias|) + 1e-6. */
static double allowed(problem_t const *p, size_t row, size_t column) {
    options_t const *o = &p->options;
    if (o->i8 && !o->bias && o->epilogue == KERNEL_EPILOGUE_NONE && !o->scaled &&
        o->residual == RESIDUAL_NONE)
        return 0.0;
    double magnitude = o->bias ? fabs(p->bias[column]) : 0.0, sum = 0.0;
    for (size_t i = 0; i < p->k; ++i) {
        size_t at = row * p->x_stride + i;
        if (o->i8)
            sum += ((double)p->x_u8[at] - p->zeros[row]) * p->w_i8[column * p->k + i];
        else
            magnitude += fabs((double)(o->x_bf16 ? bf16_to_f32(p->x_bf16[at]) : p->x[at]) *
                              bf16_to_f32(p->w[column * p->k + i]));
    }
    if (!o->i8) return 1e-2 * magnitude + 1e-6;
    return 1e-5 * (fabs(sum * p->x_scales[row] * p->w_scales[column]) + magnitude) + 1e-6;
}

void problem_check(problem_t const *p, char const *name) {
    options_t const *o = &p->options;
    for (size_t row = 0; row < p->m; ++row)
        for (size_t column = 0; column < p->y_stride; ++column) {
            float got = p->y[row * p->y_stride + column], want = p->y_reference[row * p->y_stride + column];
            if (column >= p->n) {
                assert_true(got == SENTINEL);
                continue;
            }
            double limit = allowed(p, row, column);
            if (fabs((double)got - want) <= limit) continue;
            print_error("%s: m %zu n %zu k %zu i8 %d bias %d epilogue %d x_bf16 %d scaled %d residual %d: "
                        "y[%zu][%zu] = %.9g, scalar %.9g, allowed %.3g\n",
                        name, p->m, p->n, p->k, o->i8, o->bias, (int)o->epilogue, o->x_bf16, o->scaled,
                        (int)o->residual, row, column, (double)got, (double)want, limit);
            fail();
        }
}

void problem_compare(kernels_t const *const *paths, size_t count, size_t m, size_t n, size_t k,
                     options_t options) {
    problem_t p;
    problem_make(&p, m, n, k, options);
    problem_run_whole(kernels_scalar(), &p, p.y_reference);
    for (size_t i = 0; i < count; ++i) {
        problem_run_whole(paths[i], &p, p.y);
        problem_check(&p, paths[i]->name);
    }
    problem_free(&p);
}

void problem_check_splits(kernels_t const *path, size_t m, size_t n, size_t k, options_t options) {
    problem_t p;
    problem_make(&p, m, n, k, options);
    problem_run_whole(path, &p, p.y_reference);
    size_t tiles = (n + KERNEL_GEMM_TILE - 1) / KERNEL_GEMM_TILE, splits[64] = {0};
    assert_true(tiles <= 64);
    /* one call per tile */
    for (size_t t = 0; t < tiles; ++t)
        splits[t] = t + 1 < tiles ? (t + 1) * KERNEL_GEMM_TILE : n;
    problem_run(path, &p, p.y, splits, tiles);
    assert_memory_equal(p.y, p.y_reference, m * p.y_stride * sizeof(float));
    /* two and three uneven calls */
    for (size_t first = 1; first < tiles; ++first) {
        size_t two[2] = {first * KERNEL_GEMM_TILE, n},
               three[3] = {KERNEL_GEMM_TILE, first * KERNEL_GEMM_TILE, n};
        problem_run(path, &p, p.y, two, 2);
        assert_memory_equal(p.y, p.y_reference, m * p.y_stride * sizeof(float));
        if (first < 2) continue;
        problem_run(path, &p, p.y, three, 3);
        assert_memory_equal(p.y, p.y_reference, m * p.y_stride * sizeof(float));
    }
    problem_free(&p);
}

void problem_make_largest_sums(problem_t *p, size_t m, size_t n) {
    size_t const k = KERNEL_I8_DEPTH_MAX;
    problem_make(p, m, n, k, (options_t){.i8 = true});
    for (size_t r = 0; r < m; ++r) {
        p->zeros[r] = r == 1 ? 255 : 0;
        memset(p->x_u8 + r * p->x_stride, r == 1 ? 0 : 255, k);
    }
    for (size_t c = 0; c < n; ++c)
        memset(p->w_i8 + c * k, c % 2 ? 127 : 0x80, k);
}

void problem_check_largest_sums(problem_t const *p) {
    for (size_t r = 0; r < p->m; ++r)
        for (size_t c = 0; c < p->n; ++c) {
            int64_t sum = (int64_t)(r == 1 ? -255 : 255) * (c % 2 ? 127 : -128) * (int64_t)KERNEL_I8_DEPTH_MAX;
            assert_true(p->y[r * p->y_stride + c] == (float)sum);
        }
}
