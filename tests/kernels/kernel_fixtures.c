/* Helpers the kernel suites share (kernel_fixtures.h). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fixtures.h"
#include "kernel_fixtures.h"

float *floats_uniform(size_t n, float low, float high) {
    float *x = test_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; ++i)
        x[i] = random_uniform(low, high);
    return x;
}

float *floats_filled(size_t n, float value) {
    float *x = test_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; ++i)
        x[i] = value;
    return x;
}

void check_near(double actual, double expected, double tolerance, char const *what, size_t index) {
    if (fabs(actual - expected) <= tolerance) return;
    fail_msg("%s[%zu] = %.9g, expected %.9g within %.3g", what, index, actual, expected, tolerance);
}

/* The SIMD paths the suites compare with scalar, by kernels_named's names. */
static char const *const simd_names[SIMD_PATHS] = {"avx2", "avx512", "avx512bf16", "amx", "neon"};

size_t simd_paths_present(kernels_t const *paths[SIMD_PATHS]) {
    size_t count = 0;
    for (size_t i = 0; i < SIMD_PATHS; ++i) {
        kernels_t const *path = kernels_named(simd_names[i]);
        if (path) paths[count++] = path;
    }
    return count;
}

size_t simd_paths(kernels_t const *paths[SIMD_PATHS]) {
    size_t count = simd_paths_present(paths);
    if (!count) {
        print_message("[  SKIP    ] no SIMD path runs on this CPU\n");
        skip();
    }
    return count;
}

void print_simd_paths(void) {
    for (size_t i = 0; i < SIMD_PATHS; ++i)
        if (!strcmp(simd_names[i], "amx") && !kernels_named("amx"))
            print_message("path amx: skipped (%s)\n", kernels_amx_state());
        else
            print_message("path %s: %s\n", simd_names[i],
                          kernels_named(simd_names[i]) ? "compared with scalar" : "not run on this CPU");
}

void gemm_activation(kernels_t const *path, kernel_epilogue_t epilogue, float const *x, size_t m, float *y) {
    uint16_t one = f32_to_bf16(1.0f);
    void *packed = aligned_alloc(64, (path->gemm_packed_size(1, 1) + 63) / 64 * 64);
    assert_non_null(packed);
    path->gemm_pack(packed, &one, 1, 1);
    kernel_gemm_t gemm = {.m = m,
                          .n = 1,
                          .k = 1,
                          .x = x,
                          .x_stride = 1,
                          .w = packed,
                          .y = y,
                          .y_stride = 1,
                          .epilogue = epilogue};
    path->gemm(&gemm, 0, 1);
    free(packed);
}

qkv_batch_t qkv_batch_make(float amplitude) {
    static size_t const item_lengths[ITEMS] = {0, 1, 2, 17, 64, 65, 130};
    qkv_batch_t batch = {.offsets = {0}};
    for (size_t i = 0; i < ITEMS; ++i)
        batch.offsets[i + 1] = batch.offsets[i] + item_lengths[i];
    batch.tokens = batch.offsets[ITEMS];
    batch.qkv = floats_uniform(batch.tokens * 3 * HIDDEN, -1.0f, 1.0f);
    for (size_t row = 0; row < batch.tokens; ++row)
        for (size_t i = 0; i < 2 * HIDDEN; ++i)
            batch.qkv[row * 3 * HIDDEN + i] *= amplitude;
    return batch;
}

kernel_attention_t qkv_batch_head(qkv_batch_t const *batch, size_t head, bool causal, float *out) {
    float const *qkv = batch->qkv + head * KERNEL_HEAD;
    return (kernel_attention_t){
        .q = qkv,
        .k = qkv + HIDDEN,
        .v = qkv + 2 * HIDDEN,
        .stride = 3 * HIDDEN,
        .out = out + head * KERNEL_HEAD,
        .out_stride = HIDDEN,
        .head = KERNEL_HEAD,
        .offsets = batch->offsets,
        .items = ITEMS,
        .causal = causal,
        .scale = 0.125f,
    };
}

void attention_row_double(double const *q, double const *k, double const *v, size_t row, size_t first,
                          size_t end, double scale, float const *bias, double out[KERNEL_HEAD]) {
    double scores[256], max = -INFINITY, sum = 0.0;
    for (size_t j = first; j < end; ++j) {
        double dot = 0.0;
        for (size_t d = 0; d < KERNEL_HEAD; ++d)
            dot += q[row * KERNEL_HEAD + d] * k[j * KERNEL_HEAD + d];
        scores[j - first] = dot * scale + (bias ? bias[(ptrdiff_t)row - (ptrdiff_t)j] : 0.0);
        max = fmax(max, scores[j - first]);
    }
    for (size_t d = 0; d < KERNEL_HEAD; ++d)
        out[d] = 0.0;
    for (size_t j = first; j < end; ++j) {
        double weight = exp(scores[j - first] - max);
        sum += weight;
        for (size_t d = 0; d < KERNEL_HEAD; ++d)
            out[d] += weight * v[j * KERNEL_HEAD + d];
    }
    for (size_t d = 0; d < KERNEL_HEAD; ++d)
        out[d] /= sum;
}
