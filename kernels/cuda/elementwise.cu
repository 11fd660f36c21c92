/* Conversions, gathers and the output conversion `convert` (cuda_kernels.h). Every result is exact, or
 * bitwise equal to the scalar path: the roundings are integer operations on the bits, and the only F32
 * arithmetic (the I8 scale and quotient, the sums of two values) goes through __fdiv_rn and single
 * additions, which nvcc cannot contract. */
#include "cuda_common.cuh"

/* ---- Conversions -------------------------------------------------------------------------------- */

static __global__ void bf16_to_f32_kernel(float *out, uint16_t const *in, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = bf16_value(in[i]);
}

static __global__ void f32_to_bf16_kernel(uint16_t *out, float const *in, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = bf16_bits(in[i]);
}

extern "C" cudaError_t cuda_bf16_to_f32(float *out, uint16_t const *in, size_t n, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    bf16_to_f32_kernel<<<cuda_blocks(n, CUDA_THREADS), CUDA_THREADS, 0, stream>>>(out, in, n);
    return cuda_launched();
}

extern "C" cudaError_t cuda_f32_to_bf16(uint16_t *out, float const *in, size_t n, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    f32_to_bf16_kernel<<<cuda_blocks(n, CUDA_THREADS), CUDA_THREADS, 0, stream>>>(out, in, n);
    return cuda_launched();
}

/* ---- Gathers: one block per row, its threads over the columns ----------------------------------- */

static __global__ void embed_kernel(float *x, uint16_t const *table, int32_t const *indices, size_t rows,
                                    size_t hidden) {
    for (size_t r = blockIdx.x; r < rows; r += gridDim.x) {
        uint16_t const *source = table + (size_t)indices[r] * hidden; /* [hidden] */
        for (size_t c = threadIdx.x; c < hidden; c += blockDim.x)
            x[r * hidden + c] = bf16_value(source[c]);
    }
}

extern "C" cudaError_t cuda_embed(float *x, uint16_t const *table, int32_t const *indices, size_t rows,
                                  size_t hidden, cudaStream_t stream) {
    if (rows == 0 || hidden == 0) return cudaSuccess;
    embed_kernel<<<cuda_blocks(rows, 1), CUDA_THREADS, 0, stream>>>(x, table, indices, rows, hidden);
    return cuda_launched();
}

static __global__ void gather_rows_kernel(float *dst, size_t dst_stride, float const *src, size_t src_stride,
                                          int32_t const *rows, size_t count, size_t columns) {
    for (size_t r = blockIdx.x; r < count; r += gridDim.x) {
        int32_t row = rows[r];
        float const *source = src + (size_t)(row < 0 ? 0 : row) * src_stride;
        for (size_t c = threadIdx.x; c < columns; c += blockDim.x)
            dst[r * dst_stride + c] = row < 0 ? 0.0f : source[c];
    }
}

extern "C" cudaError_t cuda_gather_rows(float *dst, size_t dst_stride, float const *src, size_t src_stride,
                                        int32_t const *rows, size_t count, size_t columns,
                                        cudaStream_t stream) {
    if (count == 0 || columns == 0) return cudaSuccess;
    gather_rows_kernel<<<cuda_blocks(count, 1), CUDA_THREADS, 0, stream>>>(dst, dst_stride, src, src_stride,
                                                                           rows, count, columns);
    return cuda_launched();
}

static __global__ void zero_failed_rows_kernel(float *x, size_t stride, int32_t const *rows, size_t count,
                                               size_t columns) {
    for (size_t r = blockIdx.x; r < count; r += gridDim.x)
        if (rows[r] < 0)
            for (size_t c = threadIdx.x; c < columns; c += blockDim.x)
                x[r * stride + c] = 0.0f;
}

extern "C" cudaError_t cuda_zero_failed_rows(float *x, size_t stride, int32_t const *rows, size_t count,
                                             size_t columns, cudaStream_t stream) {
    if (count == 0 || columns == 0) return cudaSuccess;
    zero_failed_rows_kernel<<<cuda_blocks(count, 1), CUDA_THREADS, 0, stream>>>(x, stride, rows, count,
                                                                                columns);
    return cuda_launched();
}

static __global__ void scatter_rows_kernel(float *dst, size_t dst_stride, float const *src, size_t src_stride,
                                           int32_t const *rows, size_t count, size_t columns) {
    for (size_t r = blockIdx.x; r < count; r += gridDim.x) {
        float *target = dst + (size_t)rows[r] * dst_stride;
        for (size_t c = threadIdx.x; c < columns; c += blockDim.x)
            target[c] = src[r * src_stride + c];
    }
}

extern "C" cudaError_t cuda_scatter_rows(float *dst, size_t dst_stride, float const *src, size_t src_stride,
                                         int32_t const *rows, size_t count, size_t columns,
                                         cudaStream_t stream) {
    if (count == 0 || columns == 0) return cudaSuccess;
    scatter_rows_kernel<<<cuda_blocks(count, 1), CUDA_THREADS, 0, stream>>>(dst, dst_stride, src, src_stride,
                                                                            rows, count, columns);
    return cuda_launched();
}

/* out[g, c] = (x[g * group, c] + ... + x[g * group + group - 1, c]) / group, summed in row order in F32 as
 * the host's clip pooling does (src/encode/video.c). */
static __global__ void mean_rows_kernel(float *out, size_t out_stride, float const *x, size_t x_stride,
                                        size_t groups, size_t group, size_t columns) {
    for (size_t g = blockIdx.x; g < groups; g += gridDim.x) {
        float const *rows = x + g * group * x_stride; /* [group, columns] */
        for (size_t c = threadIdx.x; c < columns; c += blockDim.x) {
            float sum = 0.0f;
            for (size_t k = 0; k < group; ++k)
                sum = __fadd_rn(sum, rows[k * x_stride + c]);
            out[g * out_stride + c] = __fdiv_rn(sum, (float)group);
        }
    }
}

extern "C" cudaError_t cuda_mean_rows(float *out, size_t out_stride, float const *x, size_t x_stride,
                                      size_t groups, size_t group, size_t columns, cudaStream_t stream) {
    if (groups == 0 || columns == 0) return cudaSuccess;
    if (group == 0) return cudaErrorInvalidValue;
    mean_rows_kernel<<<cuda_blocks(groups, 1), CUDA_THREADS, 0, stream>>>(out, out_stride, x, x_stride,
                                                                          groups, group, columns);
    return cuda_launched();
}

/* out[i, c] = the mean of rows [offsets[i], offsets[i + 1]) of x, summed in row order in F32 then divided
 * by the count, as the host's mean pooling (tower_pool); an item without rows gets a row of zeros. */
static __global__ void mean_segments_kernel(float *out, size_t out_stride, float const *x, size_t x_stride,
                                            int32_t const *offsets, size_t items, size_t columns) {
    for (size_t i = blockIdx.x; i < items; i += gridDim.x) {
        size_t first = (size_t)offsets[i], count = (size_t)(offsets[i + 1] - offsets[i]);
        for (size_t c = threadIdx.x; c < columns; c += blockDim.x) {
            float sum = 0.0f;
            for (size_t k = 0; k < count; ++k)
                sum = __fadd_rn(sum, x[(first + k) * x_stride + c]);
            out[i * out_stride + c] = count ? __fdiv_rn(sum, (float)count) : 0.0f;
        }
    }
}

extern "C" cudaError_t cuda_mean_segments(float *out, size_t out_stride, float const *x, size_t x_stride,
                                          int32_t const *offsets, size_t items, size_t columns,
                                          cudaStream_t stream) {
    if (items == 0 || columns == 0) return cudaSuccess;
    mean_segments_kernel<<<cuda_blocks(items, 1), CUDA_THREADS, 0, stream>>>(out, out_stride, x, x_stride,
                                                                             offsets, items, columns);
    return cuda_launched();
}

/* x[r] = table[ids[r]] + token_type + positions[places[r]], added in that order in F32 (tokens_embed). */
static __global__ void embed_tokens_kernel(float *x, uint16_t const *table, int32_t const *ids,
                                           float const *token_type, float const *positions,
                                           int32_t const *places, size_t rows, size_t hidden) {
    for (size_t r = blockIdx.x; r < rows; r += gridDim.x) {
        uint16_t const *source = table + (size_t)ids[r] * hidden; /* [hidden] */
        float const *position = positions ? positions + (size_t)places[r] * hidden : NULL;
        for (size_t c = threadIdx.x; c < hidden; c += blockDim.x) {
            float value = bf16_value(source[c]);
            if (token_type) value = __fadd_rn(value, token_type[c]);
            if (position) value = __fadd_rn(value, position[c]);
            x[r * hidden + c] = value;
        }
    }
}

extern "C" cudaError_t cuda_embed_tokens(float *x, uint16_t const *table, int32_t const *ids,
                                         float const *token_type, float const *positions,
                                         int32_t const *places, size_t rows, size_t hidden,
                                         cudaStream_t stream) {
    if (rows == 0 || hidden == 0) return cudaSuccess;
    if (positions && !places) return cudaErrorInvalidValue;
    embed_tokens_kernel<<<cuda_blocks(rows, 1), CUDA_THREADS, 0, stream>>>(x, table, ids, token_type,
                                                                           positions, places, rows, hidden);
    return cuda_launched();
}

static __global__ void add_rows_kernel(float *x, size_t x_stride, float const *add, size_t period,
                                       size_t rows, size_t columns) {
    for (size_t r = blockIdx.x; r < rows; r += gridDim.x) {
        float const *addend = add + (r % period) * columns;
        for (size_t c = threadIdx.x; c < columns; c += blockDim.x)
            x[r * x_stride + c] = __fadd_rn(x[r * x_stride + c], addend[c]);
    }
}

extern "C" cudaError_t cuda_add_rows(float *x, size_t x_stride, float const *add, size_t period, size_t rows,
                                     size_t columns, cudaStream_t stream) {
    if (rows == 0 || columns == 0) return cudaSuccess;
    if (period == 0) return cudaErrorInvalidValue;
    add_rows_kernel<<<cuda_blocks(rows, 1), CUDA_THREADS, 0, stream>>>(x, x_stride, add, period, rows,
                                                                       columns);
    return cuda_launched();
}

/* Token t of item i (t in [0, max_patches + leading)) is row offsets[i] + i * leading + t of x: the class
 * token for t = 0 < leading, register t - 1 (its row of pos, as it is) for t < leading, patch t - leading
 * otherwise (every token a patch with leading 0: no class token); tokens past the item's patch count are
 * not the item's and are left alone. */
static __global__ void assemble_tokens_kernel(float *x, float const *patches, float const *cls,
                                              float const *pos, int32_t const *offsets, size_t items,
                                              size_t max_patches, size_t leading, size_t hidden) {
    size_t tokens = max_patches + leading;
    for (size_t slot = blockIdx.x; slot < items * tokens; slot += gridDim.x) {
        size_t item = slot / tokens, token = slot % tokens;
        size_t first = (size_t)offsets[item], count = (size_t)(offsets[item + 1] - offsets[item]);
        if (token >= count + leading) continue;
        float *row = x + (first + item * leading + token) * hidden;
        float const *position = pos + token * hidden;
        if (token > 0 && token < leading) { /* a register: the token itself */
            for (size_t c = threadIdx.x; c < hidden; c += blockDim.x)
                row[c] = position[c];
            continue;
        }
        float const *source = token < leading ? cls : patches + (first + token - leading) * hidden;
        for (size_t c = threadIdx.x; c < hidden; c += blockDim.x)
            row[c] = __fadd_rn(source[c], position[c]);
    }
}

extern "C" cudaError_t cuda_assemble_leading(float *x, float const *patches, float const *cls,
                                             float const *pos, int32_t const *offsets, size_t items,
                                             size_t max_patches, size_t leading, size_t hidden,
                                             cudaStream_t stream) {
    if (items == 0 || hidden == 0) return cudaSuccess;
    assemble_tokens_kernel<<<cuda_blocks(items * (max_patches + leading), 1), CUDA_THREADS, 0, stream>>>(
        x, patches, cls, pos, offsets, items, max_patches, leading, hidden);
    return cuda_launched();
}

extern "C" cudaError_t cuda_assemble_tokens(float *x, float const *patches, float const *cls,
                                            float const *pos, int32_t const *offsets, size_t items,
                                            size_t max_patches, size_t hidden, cudaStream_t stream) {
    return cuda_assemble_leading(x, patches, cls, pos, offsets, items, max_patches, 1, hidden, stream);
}

/* ---- convert: one block per row ----------------------------------------------------------------- */

/* roundf: to nearest, half away from zero. v - trunc(v) is exact for every finite F32. */
static __device__ __forceinline__ float round_half_away(float v) {
    float whole = truncf(v);
    if (fabsf(__fsub_rn(v, whole)) >= 0.5f) whole = __fadd_rn(whole, copysignf(1.0f, v));
    return whole;
}

static __global__ void convert_kernel(unsigned char *out, size_t out_stride, float *scales, float const *x,
                                      size_t x_stride, size_t rows, size_t columns, int scalar) {
    __shared__ float scratch[32];
    for (size_t r = blockIdx.x; r < rows; r += gridDim.x) {
        float const *row = x + r * x_stride; /* [columns] */
        unsigned char *target = out + r * out_stride;
        if (scalar == SCALAR_F32) {
            for (size_t c = threadIdx.x; c < columns; c += blockDim.x)
                ((float *)target)[c] = row[c];
        } else if (scalar == SCALAR_BF16) {
            for (size_t c = threadIdx.x; c < columns; c += blockDim.x)
                ((uint16_t *)target)[c] = bf16_bits(row[c]);
        } else if (scalar == SCALAR_F16) {
            for (size_t c = threadIdx.x; c < columns; c += blockDim.x)
                ((uint16_t *)target)[c] = f16_bits(row[c]);
        } else { /* SCALAR_I8: the max of |x| is the same whatever the order, so the scale is the scalar one
                  */
            float max = 0.0f;
            for (size_t c = threadIdx.x; c < columns; c += blockDim.x)
                max = fmaxf(max, fabsf(row[c]));
            max = block_reduce(max, cuda_max(), 0.0f, scratch);
            float scale = __fdiv_rn(max, 127.0f);
            if (threadIdx.x == 0) scales[r] = scale;
            for (size_t c = threadIdx.x; c < columns; c += blockDim.x)
                ((int8_t *)target)[c] = max == 0.0f ? 0 : (int8_t)round_half_away(__fdiv_rn(row[c], scale));
        }
    }
}

extern "C" cudaError_t cuda_convert(void *out, size_t out_stride, float *scales, float const *x,
                                    size_t x_stride, size_t rows, size_t columns, int scalar,
                                    cudaStream_t stream) {
    if (scalar != SCALAR_F32 && scalar != SCALAR_BF16 && scalar != SCALAR_F16 && scalar != SCALAR_I8)
        return cudaErrorInvalidValue;
    if (scalar == SCALAR_I8 && !scales && rows) return cudaErrorInvalidValue;
    if (rows == 0) return cudaSuccess;
    convert_kernel<<<cuda_blocks(rows, 1), CUDA_THREADS, 0, stream>>>(
        (unsigned char *)out, out_stride, scales, x, x_stride, rows, columns, scalar);
    return cuda_launched();
}
