/* The functions each dispatch path is assembled from (see kernels.h for their contracts). A path
 * without its own version of a function uses the scalar one; dispatch.c assembles the tables. */
#pragma once

#include "kernels.h"

#define KERNEL_GEMM_FUNCTIONS(path)                                                                          \
    void kernel_gemm_##path(kernel_gemm_t const *gemm, size_t n_begin, size_t n_end);                        \
    size_t kernel_gemm_packed_size_##path(size_t n, size_t k);                                               \
    void kernel_gemm_pack_##path(void *packed, uint16_t const *w, size_t n, size_t k);

/* The I8 GEMM of a path (gemm_i8_<path>.c, on gemm_driver.h but for scalar) and its packing. */
#define KERNEL_GEMM_I8_FUNCTIONS(path)                                                                       \
    void kernel_gemm_i8_##path(kernel_gemm_t const *gemm, size_t n_begin, size_t n_end);                     \
    size_t kernel_gemm_i8_packed_size_##path(size_t n, size_t k);                                            \
    void kernel_gemm_i8_pack_##path(void *packed, int8_t const *w, float const *scales, size_t n, size_t k);

/* quantize_rows and quantize_weights (kernels.h), in vector_<path>.c (the scalar quantize_weights is
 * kernel_quantize_weights, in gemm_scalar.c). */
#define KERNEL_QUANTIZE_FUNCTIONS(path)                                                                      \
    void kernel_quantize_rows_##path(uint8_t *q, size_t q_stride, float *scales, int32_t *zeros,             \
                                     float const *x, size_t x_stride, size_t rows, size_t k);                \
    void kernel_quantize_weights_##path(int8_t *q, float *scale, uint16_t const *w, size_t k);

#define KERNEL_VECTOR_FUNCTIONS(path)                                                                        \
    void kernel_rmsnorm_##path(float *y, size_t y_stride, float const *x, size_t x_stride,                   \
                               float const *weight, size_t rows, size_t n, float eps);                       \
    void kernel_layernorm_##path(float *y, size_t y_stride, float const *x, size_t x_stride,                 \
                                 float const *weight, float const *bias, size_t rows, size_t n, float eps);  \
    void kernel_attention_##path(kernel_attention_t const *attention, size_t item_begin, size_t item_end);   \
    void kernel_softmax_##path(float *x, size_t n);                                                          \
    void kernel_normalize_##path(float *x, size_t n);                                                        \
    void kernel_bf16_to_f32_##path(float *out, uint16_t const *x, size_t n);                                 \
    void kernel_f32_to_bf16_##path(uint16_t *out, float const *x, size_t n);

/* The training kernels a SIMD path brings: the F32 GEMM (sgemm_<path>.c, on the shared sgemm_driver.h), and
 * the backward passes and GELU (vector_<path>.c). rope_backward is scalar on every path, as rope is. */
#define KERNEL_TRAINING_FUNCTIONS(path)                                                                      \
    void kernel_sgemm_##path(kernel_sgemm_t const *sgemm, size_t n_begin, size_t n_end);                     \
    void kernel_rmsnorm_backward_##path(float *dx, size_t dx_stride, float *d_weight, float const *dy,       \
                                        size_t dy_stride, float const *x, size_t x_stride,                   \
                                        float const *weight, size_t rows, size_t n, float eps);              \
    void kernel_gelu_backward_##path(float *dx, float const *dy, float const *x, size_t n);                  \
    void kernel_gelu_##path(float *x, size_t n);                                                             \
    void kernel_attention_backward_##path(kernel_attention_backward_t const *attention, size_t item_begin,   \
                                          size_t item_end);

/* scalar: gemm_scalar.c and vector_scalar.c */
KERNEL_GEMM_FUNCTIONS(scalar)
KERNEL_GEMM_I8_FUNCTIONS(scalar)
KERNEL_QUANTIZE_FUNCTIONS(scalar)
KERNEL_VECTOR_FUNCTIONS(scalar)
void kernel_rope_scalar(float *x, size_t heads, size_t position);
void kernel_convert_scalar(void *out, float const *x, size_t n, uform_scalar_t scalar, float *scale);
KERNEL_TRAINING_FUNCTIONS(scalar)
void kernel_rope_backward_scalar(float *x, size_t heads, size_t position);

#if defined(__x86_64__)
/* avx2 (with FMA and F16C): gemm_fma.c, sgemm_avx2.c and vector_avx2.c */
KERNEL_GEMM_FUNCTIONS(avx2)
KERNEL_GEMM_I8_FUNCTIONS(avx2)
KERNEL_QUANTIZE_FUNCTIONS(avx2)
void kernel_quantize_weights_avx2(int8_t *q, float *scale, uint16_t const *w, size_t k);
KERNEL_VECTOR_FUNCTIONS(avx2)
KERNEL_TRAINING_FUNCTIONS(avx2)
/* avxvnni adds its I8 GEMM (gemm_i8_avxvnni.c), compiled again for AVX512-VNNI and VL as avxvnni_evex */
KERNEL_GEMM_I8_FUNCTIONS(avxvnni)
KERNEL_GEMM_I8_FUNCTIONS(avxvnni_evex)
/* avx512 (F, BW, DQ, VL): gemm_fma.c, sgemm_avx512.c and vector_avx512.c; avx512vnni adds its I8 GEMM,
 * avx512bf16 its GEMM */
KERNEL_GEMM_FUNCTIONS(avx512)
KERNEL_QUANTIZE_FUNCTIONS(avx512)
void kernel_quantize_weights_avx512(int8_t *q, float *scale, uint16_t const *w, size_t k);
KERNEL_VECTOR_FUNCTIONS(avx512)
KERNEL_TRAINING_FUNCTIONS(avx512)
void kernel_convert_avx512(void *out, float const *x, size_t n, uform_scalar_t scalar, float *scale);
KERNEL_GEMM_I8_FUNCTIONS(avx512vnni)
KERNEL_GEMM_FUNCTIONS(avx512bf16)
/* avx512bf16's attention, with BF16 products (vector_avx512.c, built for AVX512-BF16 by its target) */
void kernel_attention_avx512bf16(kernel_attention_t const *attention, size_t item_begin, size_t item_end);
/* amx: its GEMM and I8 GEMM on the tiles (gemm_amx.c), avx512bf16's attention, avx512's other kernels;
 * amx_emulated is the same
 * file built for tests/kernels/test_gemm_amx.c with the tile instructions emulated */
KERNEL_GEMM_FUNCTIONS(amx)
KERNEL_GEMM_I8_FUNCTIONS(amx)
KERNEL_GEMM_FUNCTIONS(amx_emulated)
KERNEL_GEMM_I8_FUNCTIONS(amx_emulated)
#endif

#if defined(__aarch64__)
/* neon (baseline ARMv8-A Advanced SIMD): gemm_neon.c, sgemm_neon.c and vector_neon.c; its attention
 * backward pass is the scalar one */
KERNEL_GEMM_FUNCTIONS(neon)
KERNEL_QUANTIZE_FUNCTIONS(neon)
KERNEL_VECTOR_FUNCTIONS(neon)
/* The I8 GEMMs: gemm_i8_neon.c with its dot product widened by SMULL (neon) or SDOT (neondot, compiled
 * for armv8.2-a+dotprod), and gemm_i8_neoni8mm.c (armv8.6-a+i8mm) */
KERNEL_GEMM_I8_FUNCTIONS(neon)
KERNEL_GEMM_I8_FUNCTIONS(neondot)
KERNEL_GEMM_I8_FUNCTIONS(neoni8mm)
void kernel_sgemm_neon(kernel_sgemm_t const *sgemm, size_t n_begin, size_t n_end);
void kernel_rmsnorm_backward_neon(float *dx, size_t dx_stride, float *d_weight, float const *dy,
                                  size_t dy_stride, float const *x, size_t x_stride, float const *weight,
                                  size_t rows, size_t n, float eps);
void kernel_gelu_backward_neon(float *dx, float const *dy, float const *x, size_t n);
void kernel_gelu_neon(float *x, size_t n);
#endif

/* A path's conversions of n F32 values, for its kernel_convert (kernels.h): F32 is a copy on every path. */
typedef struct kernel_converters {
    void (*bf16)(uint16_t *out, float const *x, size_t n);
    void (*f16)(uint16_t *out, float const *x, size_t n);
    void (*i8)(int8_t *out, float const *x, size_t n, float *scale); /* the row's scale into *scale */
} kernel_converters_t;

/* kernel_convert by a path's conversions: `scale` is written for I8 only. */
static inline void kernel_convert_by(kernel_converters_t const *to, void *out, float const *x, size_t n,
                                     uform_scalar_t scalar, float *scale) {
    switch (scalar) {
    case UFORM_F32:
        memcpy(out, x, n * sizeof(float));
        break;
    case UFORM_BF16:
        to->bf16(out, x, n);
        break;
    case UFORM_F16:
        to->f16(out, x, n);
        break;
    case UFORM_I8:
        to->i8(out, x, n, scale);
        break;
    case UFORM_U32: /* not a kind the towers write: uform_encode_config_t refuses it */
        break;
    }
}
