/* The reference GEMM: plain loops that define the numbers every SIMD path is tested against.
 * y[m, n] = residual + epilogue(x[m, k] . w[n, k]^T + bias), each output summed in F32 in k order; the I8
 * GEMM, its sum exact in int32 and then scaled (kernels.h), and the weights' quantization; and the
 * training GEMM, c[m, n] (+)= op(a)[m, k] . op(b)[k, n], each output summed in F32 in k order and then
 * added to c. */
#include <math.h>
#include <stdbool.h>
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

/* The activation `kind` of x (kernels.h). */
static float activate(kernel_epilogue_t kind, float x) {
    switch (kind) {
    case KERNEL_EPILOGUE_GELU:
        return gelu_tanh(x);
    case KERNEL_EPILOGUE_GELU_ERF:
        return gelu_erf(x);
    case KERNEL_EPILOGUE_GELU_QUICK:
        return gelu_quick(x);
    case KERNEL_EPILOGUE_NONE:
        break;
    }
    return x;
}

/* y[row, column] = residual + epilogue(sum + bias). */
static void epilogue(kernel_gemm_t const *g, size_t row, size_t column, float sum) {
    if (g->bias) sum += g->bias[column];
    sum = activate(g->epilogue, sum);
    if (g->residual) sum += g->residual[row * g->residual_stride + column];
    g->y[row * g->y_stride + column] = sum;
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
            epilogue(g, row, column, sum);
        }
    }
}

/* ---- I8 ------------------------------------------------------------------------------------------ */

/* No loop tests a weight: the largest magnitude is the largest of the BF16 bits without their sign, and
 * each weight's rounding and clamp are arithmetic and selects (kernel_quantize_weight). */
void kernel_quantize_weights(int8_t *q, float *scale, uint16_t const *w, size_t k) {
    uint16_t largest_bits = 0;
    for (size_t i = 0; i < k; ++i) {
        uint16_t magnitude = w[i] & 0x7fffu;
        largest_bits = magnitude > largest_bits ? magnitude : largest_bits;
    }
    if (!kernel_weights_scale(largest_bits, scale)) {
        memset(q, 0, k);
        return;
    }
    float const divisor = *scale;
    for (size_t i = 0; i < k; ++i)
        q[i] = kernel_quantize_weight(w[i], divisor);
}

/* The scalar packing: w [n, k] as it is, then the scales [n] at the next multiple of 64 bytes. */
static size_t scales_offset(size_t n, size_t k) {
    return (n * k + 63) / 64 * 64;
}

size_t kernel_gemm_i8_packed_size_scalar(size_t n, size_t k) {
    return scales_offset(n, k) + n * sizeof(float);
}

void kernel_gemm_i8_pack_scalar(void *packed, int8_t const *w, float const *scales, size_t n, size_t k) {
    memcpy(packed, w, n * k);
    memcpy((char *)packed + scales_offset(n, k), scales, n * sizeof(float));
}

/* S = sum_k (x - zero) w in int32, exact for k <= KERNEL_I8_DEPTH_MAX; then y = S (x_scale w_scale). */
void kernel_gemm_i8_scalar(kernel_gemm_t const *g, size_t n_begin, size_t n_end) {
    int8_t const *w = g->w;
    float const *w_scales = (float const *)(void const *)((char const *)g->w + scales_offset(g->n, g->k));
    for (size_t row = 0; row < g->m; ++row) {
        uint8_t const *x = g->x_u8 + row * g->x_stride;
        int32_t zero = g->x_zeros[row];
        for (size_t column = n_begin; column < n_end; ++column) {
            int8_t const *w_row = w + column * g->k; /* [k] */
            int32_t sum = 0;
            for (size_t i = 0; i < g->k; ++i)
                sum += ((int32_t)x[i] - zero) * w_row[i];
            epilogue(g, row, column, (float)sum * (g->x_scales[row] * w_scales[column]));
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
