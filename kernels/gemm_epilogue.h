/* The epilogue the x86 GEMM paths (gemm_avx2.c, gemm_avx512.c, gemm_avx512bf16.c) end a tile with: their
 * tiles are `rows` x 2 vectors of F32 outputs, and y = residual + epilogue(sum + bias) over them is the same
 * steps whatever made the sums, written once over the path's vector primitives (vfloat, vmask, vf_*,
 * columns_mask and gelu_ps of math_<path>.h). A path's file includes this header after its math header. */
#pragma once

#include <stdbool.h>

#include "gemm_driver.h"

/* y[row, row + rows)[column, column + 2 vectors) = residual + epilogue(sum + bias), masked to the n
 * columns. Always inlined with a constant `rows` so that `sum` stays in registers. */
static inline __attribute__((always_inline)) void
gemm_epilogue(size_t rows, vfloat sum[][2], kernel_gemm_t const *g, size_t row, size_t column) {
    size_t const lanes = sizeof(vfloat) / sizeof(float);
    gemm_epilogue_t e = gemm_epilogue_at(g, row, column);
    vmask masks[2];
    vfloat biases[2];
    for (size_t v = 0; v < 2; ++v) {
        masks[v] = columns_mask(column + lanes * v, g->n);
        biases[v] = e.bias ? vf_maskload(e.bias + column + lanes * v, masks[v]) : vf_zero();
    }
#pragma GCC unroll 14
    for (size_t r = 0; r < rows; ++r)
#pragma GCC unroll 2
        for (size_t v = 0; v < 2; ++v) {
            vfloat value = sum[r][v];
            if (e.bias) value = vf_add(value, biases[v]);
            if (e.gelu) value = gelu_ps(value);
            if (e.residual)
                value = vf_add(value, vf_maskload(e.residual + r * e.residual_stride + lanes * v, masks[v]));
            vf_maskstore(e.y + r * e.y_stride + lanes * v, masks[v], value);
        }
}
