/* The epilogue the x86 GEMM paths (gemm_fma.c, gemm_avx512bf16.c, gemm_i8_*.c) end a tile with: their tiles
 * are `rows` x 2 vectors of F32 outputs, and y = residual + epilogue(sum + bias) over them is the same steps
 * whatever made the sums, written once over the path's vector primitives (vfloat, vmask, vf_*, columns_mask
 * and the GELUs of math_<path>.h); the I8 tiles first turn their int32 sums into F32 ones (vint, vi_*). A
 * path's file includes this header after its math header. */
#pragma once

#include <stdbool.h>

#include "gemm_driver.h"

/* values[0, count) = the activation `kind` (kernels.h) of each, in place. Out of line, called once per tile:
 * one copy of each activation per path, where inlining them would copy them into every tile row of every
 * row count. */
static __attribute__((noinline)) void gemm_activate(kernel_epilogue_t kind, vfloat *values, size_t count) {
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

/* y[row, row + rows)[column, column + 2 vectors) = residual + epilogue(sum + bias), masked to the n
 * columns. Always inlined with a constant `rows` so that `sum` stays in registers. */
static inline __attribute__((always_inline)) void
gemm_epilogue(size_t rows, vfloat sum[][2], kernel_gemm_t const *g, size_t row, size_t column) {
    size_t const lanes = sizeof(vfloat) / sizeof(float);
    gemm_epilogue_t e = gemm_epilogue_at(g, row, column);
    vmask masks[2];
    vfloat biases[2], values[GEMM_ROWS_MAX][2];
    for (size_t v = 0; v < 2; ++v) {
        masks[v] = columns_mask(column + lanes * v, g->n);
        biases[v] = e.bias ? vf_maskload(e.bias + column + lanes * v, masks[v]) : vf_zero();
    }
#pragma GCC unroll 14
    for (size_t r = 0; r < rows; ++r)
#pragma GCC unroll 2
        for (size_t v = 0; v < 2; ++v)
            values[r][v] = e.bias ? vf_add(sum[r][v], biases[v]) : sum[r][v];
    if (e.kind != KERNEL_EPILOGUE_NONE) gemm_activate(e.kind, values[0], 2 * rows);
#pragma GCC unroll 14
    for (size_t r = 0; r < rows; ++r)
#pragma GCC unroll 2
        for (size_t v = 0; v < 2; ++v) {
            vfloat value = values[r][v];
            if (e.residual)
                value = vf_add(value, vf_maskload(e.residual + r * e.residual_stride + lanes * v, masks[v]));
            vf_maskstore(e.y + r * e.y_stride + lanes * v, masks[v], value);
        }
}

/* The end of an I8 tile: acc = sum_k x_u8 w over the tile's rows and 2 vectors of columns, then the exact
 * S = acc - x_zero * sum_k w, and S (x_scale w_scale) in F32 into gemm_epilogue (kernels.h). Always inlined
 * with a constant `rows`. */
static inline __attribute__((always_inline)) void gemm_epilogue_i8(gemm_path_t const *path, size_t rows,
                                                                   vint acc[][2], kernel_gemm_t const *g,
                                                                   size_t row, size_t column) {
    size_t const lanes = sizeof(vint) / sizeof(int32_t);
    gemm_i8_columns_t at = gemm_i8_columns_of(path, g->w, g->n, g->k);
    vint sums[2];
    vfloat scales[2], sum[GEMM_ROWS_MAX][2];
    for (size_t v = 0; v < 2; ++v) {
        sums[v] = vi_load(at.sums + column + lanes * v);
        scales[v] = vf_load(at.scales + column + lanes * v);
    }
#pragma GCC unroll 14
    for (size_t r = 0; r < rows; ++r) {
        vint zero = vi_set1(g->x_zeros[row + r]);
        vfloat x_scale = vf_set1(g->x_scales[row + r]);
#pragma GCC unroll 2
        for (size_t v = 0; v < 2; ++v)
            sum[r][v] =
                vf_mul(vf_of_vi(vi_sub(acc[r][v], vi_mullo(zero, sums[v]))), vf_mul(x_scale, scales[v]));
    }
    gemm_epilogue(rows, sum, g, row, column);
}
