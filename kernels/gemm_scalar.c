/* The reference GEMM: plain loops that define the numbers every SIMD path is tested against.
 * y[m, n] = residual + epilogue(x[m, k] . w[n, k]^T + bias), each output summed in F32 in k order; and
 * the training GEMM, c[m, n] (+)= op(a)[m, k] . op(b)[k, n], each output summed in F32 in k order and then
 * added to c. */
#include <string.h>

#include "gelu.h"
#include "paths.h"

/* Packing is a plain copy of w [n, k]. */
size_t kernel_gemm_packed_size_scalar(size_t n, size_t k) {
    return n * k * sizeof(uint16_t);
}

void kernel_gemm_pack_scalar(void *packed, uint16_t const *w, size_t n, size_t k) {
    memcpy(packed, w, n * k * sizeof(uint16_t));
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
            if (g->epilogue == KERNEL_EPILOGUE_GELU) sum = gelu_tanh(sum);
            if (g->residual) sum += g->residual[row * g->residual_stride + column];
            g->y[row * g->y_stride + column] = sum;
        }
    }
}

/* c[m, n] (+)= op(a) . op(b): a dot product per output, k ascending, then added to the old c. */
void kernel_sgemm_scalar(kernel_sgemm_t const *s, size_t n_begin, size_t n_end) {
    for (size_t row = 0; row < s->m; ++row) {
        for (size_t column = n_begin; column < n_end; ++column) {
            float sum = 0.0f;
            for (size_t p = 0; p < s->k; ++p) {
                float a = s->a_transposed ? s->a[p * s->a_stride + row] : s->a[row * s->a_stride + p];
                float b = s->b_transposed ? s->b[column * s->b_stride + p] : s->b[p * s->b_stride + column];
                sum += a * b;
            }
            float *c = s->c + row * s->c_stride + column;
            *c = s->accumulate ? *c + sum : sum;
        }
    }
}
