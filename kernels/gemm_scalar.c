/* The reference GEMM: plain loops that define the numbers every SIMD path is tested against.
 * y[m, n] = residual + epilogue(x[m, k] . w[n, k]^T + bias), each output summed in F32 in k order. */
#include <math.h>
#include <string.h>

#include "paths.h"

/* Packing is a plain copy of w [n, k]. */
size_t kernel_gemm_packed_size_scalar(size_t n, size_t k) {
    return n * k * sizeof(uint16_t);
}

void kernel_gemm_pack_scalar(void *packed, uint16_t const *w, size_t n, size_t k) {
    memcpy(packed, w, n * k * sizeof(uint16_t));
}

/* 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))), as kernels.h pins it. */
static float gelu(float x) {
    return 0.5f * x * (1.0f + tanhf(0.797884561f * (x + 0.044715f * x * x * x)));
}

void kernel_gemm_scalar(kernel_gemm_t const *g, size_t n_begin, size_t n_end) {
    uint16_t const *w = g->w;
    for (size_t row = 0; row < g->m; ++row) {
        float const *x = g->x ? g->x + row * g->x_stride : NULL;
        uint16_t const *x_bf16 = g->x_bf16 ? g->x_bf16 + row * g->x_stride : NULL;
        for (size_t column = n_begin; column < n_end; ++column) {
            uint16_t const *w_row = w + column * g->k; /* [k] */
            float sum = 0.0f;
            for (size_t i = 0; i < g->k; ++i) {
                float value = x_bf16 ? bf16_to_f32(x_bf16[i]) : x[i];
                sum += value * bf16_to_f32(w_row[i]);
            }
            if (g->bias) sum += g->bias[column];
            if (g->epilogue == KERNEL_EPILOGUE_GELU) sum = gelu(sum);
            if (g->residual) sum += g->residual[row * g->residual_stride + column];
            g->y[row * g->y_stride + column] = sum;
        }
    }
}
