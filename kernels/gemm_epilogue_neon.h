/* The epilogue the NEON GEMM paths (gemm_neon.c, gemm_i8_neon.c, gemm_i8_neoni8mm.c) end a tile with: their
 * tiles are `rows` x 16 F32 outputs in 4 q registers per row (math_neon.h's tile rows), and
 * y = residual + epilogue(sum + bias) over them is the same steps whatever made the sums; the I8 tiles
 * first turn their int32 sums into F32 ones. NEON has no masked loads: the last columns go through
 * load_columns and store_columns. */
#pragma once

#include <arm_neon.h>
#include <stdbool.h>

#include "gemm_driver.h"
#include "math_neon.h"

#define NEON_VECTORS (NEON_ROW_COLUMNS / 4)

/* values[0, count) = the activation `kind` (kernels.h) of each, in place. Out of line, called once per tile:
 * one copy of each activation per path, where inlining them would copy them into every tile row of every
 * row count. */
static __attribute__((noinline)) void gemm_activate_neon(kernel_epilogue_t kind, float32x4_t *values,
                                                         size_t count) {
    switch (kind) {
    case KERNEL_EPILOGUE_GELU:
        for (size_t i = 0; i < count; ++i)
            values[i] = gelu_ps(values[i]);
        break;
    case KERNEL_EPILOGUE_GELU_ERF:
        for (size_t i = 0; i < count; ++i)
            values[i] = gelu_erf_ps(values[i]);
        break;
    case KERNEL_EPILOGUE_GELU_QUICK:
        for (size_t i = 0; i < count; ++i)
            values[i] = gelu_quick_ps(values[i]);
        break;
    case KERNEL_EPILOGUE_NONE:
        break;
    }
}

/* y[row, row + rows)[column, column + 16) = residual + epilogue(sum + bias), to the n columns. Always
 * inlined with a constant `rows` so that `sum` stays in registers. */
static inline __attribute__((always_inline)) void gemm_epilogue_neon(size_t rows,
                                                                     float32x4_t sum[][NEON_VECTORS],
                                                                     kernel_gemm_t const *g, size_t row,
                                                                     size_t column) {
    gemm_epilogue_t e = gemm_epilogue_at(g, row, column);
    size_t count = g->n - column < NEON_ROW_COLUMNS ? g->n - column : NEON_ROW_COLUMNS;
    float32x4_t biases[NEON_VECTORS], values[NEON_TILE_ROWS][NEON_VECTORS];
    if (e.bias)
        load_columns(biases, e.bias + column, count);
    else
#pragma GCC unroll 4
        for (size_t v = 0; v < NEON_VECTORS; ++v)
            biases[v] = vdupq_n_f32(0.0f);
#pragma GCC unroll 6
    for (size_t r = 0; r < rows; ++r)
#pragma GCC unroll 4
        for (size_t v = 0; v < NEON_VECTORS; ++v)
            values[r][v] = e.bias ? vaddq_f32(sum[r][v], biases[v]) : sum[r][v];
    if (e.kind != KERNEL_EPILOGUE_NONE) gemm_activate_neon(e.kind, values[0], NEON_VECTORS * rows);
#pragma GCC unroll 6
    for (size_t r = 0; r < rows; ++r) {
        if (e.residual) {
            float32x4_t residuals[NEON_VECTORS];
            load_columns(residuals, e.residual + r * e.residual_stride, count);
#pragma GCC unroll 4
            for (size_t v = 0; v < NEON_VECTORS; ++v)
                values[r][v] = vaddq_f32(values[r][v], residuals[v]);
        }
        store_columns(e.y + r * e.y_stride, count, values[r]);
    }
}

/* The end of an I8 tile whose activations were multiplied as s8, x_u8 - 128: acc = sum_k (x_u8 - 128) w,
 * then the exact S = acc - (x_zero - 128) sum_k w, and S (x_scale w_scale) in F32 into gemm_epilogue_neon
 * (kernels.h). Always inlined with a constant `rows`. */
static inline __attribute__((always_inline)) void gemm_epilogue_neon_i8(gemm_path_t const *path, size_t rows,
                                                                        int32x4_t acc[][NEON_VECTORS],
                                                                        kernel_gemm_t const *g, size_t row,
                                                                        size_t column) {
    gemm_i8_columns_t at = gemm_i8_columns_of(path, g->w, g->n, g->k);
    int32x4_t sums[NEON_VECTORS];
    float32x4_t scales[NEON_VECTORS], sum[NEON_TILE_ROWS][NEON_VECTORS];
#pragma GCC unroll 4
    for (size_t v = 0; v < NEON_VECTORS; ++v) {
        sums[v] = vld1q_s32(at.sums + column + 4 * v);
        scales[v] = vld1q_f32(at.scales + column + 4 * v);
    }
#pragma GCC unroll 6
    for (size_t r = 0; r < rows; ++r) {
        int32x4_t zero = vdupq_n_s32(g->x_zeros[row + r] - 128);
        float x_scale = g->x_scales[row + r];
#pragma GCC unroll 4
        for (size_t v = 0; v < NEON_VECTORS; ++v)
            sum[r][v] = vmulq_f32(vcvtq_f32_s32(vmlsq_s32(acc[r][v], zero, sums[v])),
                                  vmulq_n_f32(scales[v], x_scale));
    }
    gemm_epilogue_neon(rows, sum, g, row, column);
}
