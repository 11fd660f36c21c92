/* Row reductions (cuda_kernels.h): RMSNorm, LayerNorm, L2 normalization and text_choose's softmax over legal
 * bytes.
 * One block per row; sums of squares, dot products and softmax denominators are accumulated in double,
 * as on every CPU path (kernels/vector_scalar.c), so that only the order of the additions differs from
 * the scalar path. The F32 products that follow are written with __fmul_rn in the scalar order. */
#include "cuda_common.cuh"

/* ---- RMSNorm ------------------------------------------------------------------------------------ */

/* y = x * (float)(1 / sqrt(mean(x^2) + eps)) * weight. In place (y_f32 == x) is safe: each thread reads
 * the values it writes, after the reduction has read them all. */
static __global__ void rmsnorm_kernel(uint16_t *y_bf16, size_t y_bf16_stride, float *y_f32,
                                      size_t y_f32_stride, float const *x, size_t x_stride,
                                      float const *weight, size_t rows, size_t n, float eps) {
    __shared__ double scratch[32];
    for (size_t r = blockIdx.x; r < rows; r += gridDim.x) {
        float const *row = x + r * x_stride; /* [n] */
        double squares = 0.0;
        for (size_t i = threadIdx.x; i < n; i += blockDim.x)
            squares += (double)row[i] * row[i];
        squares = block_reduce(squares, cuda_sum(), 0.0, scratch);
        float inverse = (float)(1.0 / sqrt(squares / (double)n + (double)eps));
        for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
            float value = __fmul_rn(__fmul_rn(row[i], inverse), weight[i]);
            if (y_f32) y_f32[r * y_f32_stride + i] = value;
            if (y_bf16) y_bf16[r * y_bf16_stride + i] = bf16_bits(value);
        }
    }
}

extern "C" cudaError_t cuda_rmsnorm(uint16_t *y_bf16, size_t y_bf16_stride, float *y_f32, size_t y_f32_stride,
                                    float const *x, size_t x_stride, float const *weight, size_t rows,
                                    size_t n, float eps, cudaStream_t stream) {
    if (rows == 0 || n == 0 || (!y_bf16 && !y_f32)) return cudaSuccess;
    rmsnorm_kernel<<<cuda_blocks(rows, 1), CUDA_THREADS, 0, stream>>>(
        y_bf16, y_bf16_stride, y_f32, y_f32_stride, x, x_stride, weight, rows, n, eps);
    return cuda_launched();
}

/* ---- LayerNorm ---------------------------------------------------------------------------------- */

/* As kernel_layernorm_scalar (kernels/vector_scalar.c): the mean in double, then the biased variance as the
 * mean of (x - mean)^2, each deviation in double; the output's deviation (x - high) - low, high the mean
 * rounded to F32 and low the rest, then the F32 products and the bias in the scalar order. In place
 * (y_f32 == x) is safe as in rmsnorm_kernel. */
static __global__ void layernorm_kernel(uint16_t *y_bf16, size_t y_bf16_stride, float *y_f32,
                                        size_t y_f32_stride, float const *x, size_t x_stride,
                                        float const *weight, float const *bias, size_t rows, size_t n,
                                        float eps) {
    __shared__ double scratch[32];
    for (size_t r = blockIdx.x; r < rows; r += gridDim.x) {
        float const *row = x + r * x_stride; /* [n] */
        double sum = 0.0, squares = 0.0;
        for (size_t i = threadIdx.x; i < n; i += blockDim.x)
            sum += row[i];
        double mean = block_reduce(sum, cuda_sum(), 0.0, scratch) / (double)n;
        for (size_t i = threadIdx.x; i < n; i += blockDim.x)
            squares += ((double)row[i] - mean) * ((double)row[i] - mean);
        squares = block_reduce(squares, cuda_sum(), 0.0, scratch);
        float inverse = (float)(1.0 / sqrt(squares / (double)n + (double)eps));
        float high = (float)mean, low = (float)(mean - (double)high);
        for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
            float deviation = __fsub_rn(__fsub_rn(row[i], high), low);
            float value = __fmul_rn(__fmul_rn(deviation, inverse), weight[i]);
            if (bias) value = __fadd_rn(value, bias[i]);
            if (y_f32) y_f32[r * y_f32_stride + i] = value;
            if (y_bf16) y_bf16[r * y_bf16_stride + i] = bf16_bits(value);
        }
    }
}

extern "C" cudaError_t cuda_layernorm(uint16_t *y_bf16, size_t y_bf16_stride, float *y_f32,
                                      size_t y_f32_stride, float const *x, size_t x_stride,
                                      float const *weight, float const *bias, size_t rows, size_t n,
                                      float eps, cudaStream_t stream) {
    if (rows == 0 || n == 0 || (!y_bf16 && !y_f32)) return cudaSuccess;
    layernorm_kernel<<<cuda_blocks(rows, 1), CUDA_THREADS, 0, stream>>>(
        y_bf16, y_bf16_stride, y_f32, y_f32_stride, x, x_stride, weight, bias, rows, n, eps);
    return cuda_launched();
}

/* ---- L2 normalization --------------------------------------------------------------------------- */

static __global__ void normalize_kernel(float *x, size_t stride, size_t rows, size_t columns) {
    __shared__ double scratch[32];
    for (size_t r = blockIdx.x; r < rows; r += gridDim.x) {
        float *row = x + r * stride; /* [columns] */
        double squares = 0.0;
        for (size_t i = threadIdx.x; i < columns; i += blockDim.x)
            squares += (double)row[i] * row[i];
        squares = block_reduce(squares, cuda_sum(), 0.0, scratch);
        if (squares == 0.0) continue; /* the same for the whole block */
        float inverse = (float)(1.0 / sqrt(squares));
        for (size_t i = threadIdx.x; i < columns; i += blockDim.x)
            row[i] = __fmul_rn(row[i], inverse);
    }
}

extern "C" cudaError_t cuda_normalize(float *x, size_t stride, size_t rows, size_t columns,
                                      cudaStream_t stream) {
    if (rows == 0 || columns == 0) return cudaSuccess;
    normalize_kernel<<<cuda_blocks(rows, 1), CUDA_THREADS, 0, stream>>>(x, stride, rows, columns);
    return cuda_launched();
}

/* ---- tanh --------------------------------------------------------------------------------------- */

static __global__ void tanh_kernel(float *x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = tanhf(x[i]);
}

extern "C" cudaError_t cuda_tanh(float *x, size_t n, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    tanh_kernel<<<cuda_blocks(n, CUDA_THREADS), CUDA_THREADS, 0, stream>>>(x, n);
    return cuda_launched();
}

/* ---- text_choose -------------------------------------------------------------------------------- */

/* One block per item: each warp computes the logits of some legal bytes (a dot product over `hidden`
 * spread over its lanes) straight into the item's probabilities, then the block turns them into the
 * softmax exp(x - max) / sum, as kernels.h's softmax computes it. */
static __global__ void choose_kernel(float *probabilities, float const *states, size_t states_stride,
                                     uint16_t const *table, uint8_t const *legal, int64_t const *offsets,
                                     size_t items, size_t hidden) {
    __shared__ double sums[32];
    __shared__ float maxima[32];
    unsigned warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (size_t item = blockIdx.x; item < items; item += gridDim.x) {
        size_t begin = (size_t)(offsets[item] - offsets[0]),
               count = (size_t)(offsets[item + 1] - offsets[item]);
        float *logits = probabilities + begin;              /* [count] */
        float const *state = states + item * states_stride; /* [hidden] */
        uint8_t const *bytes = legal + offsets[item];
        for (size_t j = warp; j < count; j += warps) {
            uint16_t const *embedding = table + (size_t)bytes[j] * hidden; /* [hidden] */
            double dot = 0.0;
            for (size_t i = lane; i < hidden; i += 32)
                dot += (double)state[i] * bf16_value(embedding[i]);
            for (int offset = 16; offset > 0; offset >>= 1)
                dot += __shfl_xor_sync(CUDA_FULL_MASK, dot, offset);
            if (lane == 0) logits[j] = (float)dot;
        }
        __syncthreads(); /* the logits written by each warp's lane 0 are seen by the whole block */
        float max = -INFINITY;
        for (size_t j = threadIdx.x; j < count; j += blockDim.x)
            max = fmaxf(max, logits[j]);
        max = block_reduce(max, cuda_max(), -INFINITY, maxima);
        double sum = 0.0;
        for (size_t j = threadIdx.x; j < count; j += blockDim.x) {
            float weight = expf(__fsub_rn(logits[j], max));
            logits[j] = weight;
            sum += weight;
        }
        sum = block_reduce(sum, cuda_sum(), 0.0, sums);
        float inverse = (float)(1.0 / sum);
        for (size_t j = threadIdx.x; j < count; j += blockDim.x)
            logits[j] = __fmul_rn(logits[j], inverse);
    }
}

extern "C" cudaError_t cuda_choose(float *probabilities, float const *states, size_t states_stride,
                                   uint16_t const *table, uint8_t const *legal, int64_t const *offsets,
                                   size_t items, size_t hidden, cudaStream_t stream) {
    if (items == 0) return cudaSuccess;
    choose_kernel<<<cuda_blocks(items, 1), CUDA_THREADS, 0, stream>>>(probabilities, states, states_stride,
                                                                      table, legal, offsets, items, hidden);
    return cuda_launched();
}
