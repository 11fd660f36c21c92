/* What every kernel file of kernels/cuda shares: launch shapes, the BF16 and F16 bit conversions of the
 * scalar path (kernels.h, kernels/vector_scalar.c) written again for the device, and block reductions.
 * Everything here is static: each .cu file gets its own copy. */
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "cuda_kernels.h"

#define CUDA_THREADS    256   /* threads per block of the row and element kernels */
#define CUDA_MAX_BLOCKS 16384 /* grid-stride loops cover the rest */
#define CUDA_FULL_MASK  0xffffffffu

/* The values of uform_scalar_t (include/uform.h is C only); tests/vram/test_cuda.c passes the enum's. */
enum { SCALAR_F32 = 0, SCALAR_BF16 = 1, SCALAR_F16 = 2, SCALAR_I8 = 3 };

/* Blocks for `units` of work handed out `per_block` at a time, at least 1 and at most CUDA_MAX_BLOCKS
 * (callers return early when there is no work at all). */
static inline unsigned cuda_blocks(size_t units, size_t per_block) {
    size_t blocks = (units + per_block - 1) / per_block;
    if (blocks < 1) blocks = 1;
    return blocks > CUDA_MAX_BLOCKS ? CUDA_MAX_BLOCKS : (unsigned)blocks;
}

/* The error of the launch just made (or of an earlier call that is still pending on this thread). */
static inline cudaError_t cuda_launched(void) {
    return cudaGetLastError();
}

/* ---- Bit conversions, exactly as kernels.h and vector_scalar.c compute them ----------------------- */

static __device__ __forceinline__ float bf16_value(uint16_t bits) {
    return __uint_as_float((uint32_t)bits << 16);
}

/* Nearest even; a NaN keeps its sign and the top of its payload, quieted. */
static __device__ __forceinline__ uint16_t bf16_bits(float value) {
    uint32_t bits = __float_as_uint(value);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

/* Nearest even like F16C's vcvtps2ph: subnormal halves rounded like normal ones, 65520 and up to
 * infinity, a NaN keeps its sign and the top of its payload with the quiet bit set. */
static __device__ __forceinline__ uint16_t f16_bits(float value) {
    uint32_t bits = __float_as_uint(value);
    uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
    if (magnitude >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (magnitude >= 0x38800000u) {
        uint32_t rebiased = magnitude - 0x38000000u;
        rebiased += 0xfffu + ((rebiased >> 13) & 1u);
        return (uint16_t)(sign | (rebiased >> 13));
    }
    uint32_t exponent = magnitude >> 23;
    if (exponent < 102) return sign;
    uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u, shift = 126 - exponent;
    uint32_t units = significand >> shift, rest = significand & ((1u << shift) - 1u),
             half = 1u << (shift - 1);
    if (rest > half || (rest == half && (units & 1u))) ++units;
    return (uint16_t)(sign | units);
}

/* ---- Block reductions (blockDim.x a multiple of 32, at most 1024) ---------------------------------- */

struct cuda_sum {
    __device__ __forceinline__ double operator()(double a, double b) const {
        return a + b;
    }
};

struct cuda_max {
    __device__ __forceinline__ float operator()(float a, float b) const {
        return fmaxf(a, b);
    }
};

/* Every thread of the block gets op over every thread's `value`. `scratch` holds 32 values; the leading
 * barrier lets a block call this again right after a previous reduction over the same scratch. */
template <typename T, typename Op>
static __device__ __forceinline__ T block_reduce(T value, Op op, T identity, T *scratch) {
    for (int offset = 16; offset > 0; offset >>= 1)
        value = op(value, __shfl_xor_sync(CUDA_FULL_MASK, value, offset));
    unsigned warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0) scratch[warp] = value;
    __syncthreads();
    value = lane < (blockDim.x >> 5) ? scratch[lane] : identity;
    for (int offset = 16; offset > 0; offset >>= 1)
        value = op(value, __shfl_xor_sync(CUDA_FULL_MASK, value, offset));
    return value;
}
