/* Helpers the kernel suites share (test_kernels.c, test_kernels_backward.c, test_gemm.c): cmocka-allocated
 * float buffers, element checks, the SIMD paths this CPU runs, the GEMM's activations on their own, and a
 * packed batch of items for attention. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "kernels.h"

#define COUNT(array) (sizeof(array) / sizeof((array)[0]))
#define SENTINEL     12345.0f /* written around outputs: a kernel must leave it alone */
#define SIMD_PATHS   5        /* avx2, avx512, avx512bf16, amx, neon */

/* n floats from test_malloc: uniform in [low, high), or all `value`. */
float *floats_uniform(size_t n, float low, float high);
float *floats_filled(size_t n, float value);

/* Fails the test when |actual - expected| > tolerance, naming what[index]. */
void check_near(double actual, double expected, double tolerance, char const *what, size_t index);

/* The SIMD paths this CPU and build run, into `paths`: answers how many (none: 0). */
size_t simd_paths_present(kernels_t const *paths[SIMD_PATHS]);

/* The same, skipping the test when there is none. */
size_t simd_paths(kernels_t const *paths[SIMD_PATHS]);

/* Says, for each SIMD path, whether it is compared with scalar or not run on this CPU. */
void print_simd_paths(void);

/* y [m] = the activation `epilogue` of `path`'s GEMM on x [m]: a GEMM of k = 1 against a weight of 1 feeds
 * each value to the epilogue unchanged (BF16 values of x, which the paths that round x to BF16 keep). */
void gemm_activation(kernels_t const *path, kernel_epilogue_t epilogue, float const *x, size_t m, float *y);

/* A batch of items of these lengths packed end to end in qkv rows [tokens, 3 * HIDDEN], as the towers
 * lay them out: q, then k, then v, head h at columns h * 64 of each. */
#define HEADS  3
#define HIDDEN (HEADS * KERNEL_HEAD)
#define ITEMS  7 /* of lengths 0, 1, 2, 17, 64, 65, 130 */

typedef struct qkv_batch {
    size_t offsets[ITEMS + 1];
    size_t tokens;
    float *qkv; /* test_free it */
} qkv_batch_t;

/* Values in [-1, 1]; queries and keys in [-amplitude, amplitude] (large ones make peaked softmaxes whose
 * max moves from tile to tile). */
qkv_batch_t qkv_batch_make(float amplitude);

/* One head of attention over the batch, scale 1/8: q, k and v of head `head`, its rows written to out
 * [tokens, HIDDEN] at the same columns. */
kernel_attention_t qkv_batch_head(qkv_batch_t const *batch, size_t head, bool causal, float *out);

/* One head of attention over keys [first, end) for the query row `row`, in double: out [64]. Rows are
 * KERNEL_HEAD apart in q, k, v (a packed [tokens, 64] per tensor). `bias`: NULL, or kernel_attention_t.bias
 * of an item whose first row is `first`, bias[row - key] added to each scaled score. */
void attention_row_double(double const *q, double const *k, double const *v, size_t row, size_t first,
                          size_t end, double scale, float const *bias, double out[KERNEL_HEAD]);
