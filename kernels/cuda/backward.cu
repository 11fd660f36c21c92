/* The backward passes of the towers' row operations (cuda_train.h): GELU, sums over rows (bias gradients),
 * RMSNorm, and the gradients of the towers' inputs (the byte embedding, class tokens and positions).
 * Every output value is computed by one thread, its additions in an order the shapes fix: no atomics, so
 * every run gives the same bits. */
#include "cuda_common.cuh"
#include "cuda_train.h"

/* ---- GELU ----------------------------------------------------------------------------------------- */

#define GELU_C 0.797884561f /* sqrt(2 / pi), as kernels/gelu.h */
#define GELU_A 0.044715f

static __global__ void gelu_kernel(uint16_t *g, uint16_t const *u, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = bf16_value(u[i]);
        float inner = __fmul_rn(GELU_C, __fadd_rn(x, __fmul_rn(__fmul_rn(__fmul_rn(GELU_A, x), x), x)));
        g[i] = bf16_bits(__fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, tanhf(inner))));
    }
}

/* gelu_tanh'(x) in double from the F32 constants (kernels/gelu.h's gelu_tanh_derivative). */
static __device__ __forceinline__ double gelu_derivative(float x) {
    double const c = (double)GELU_C, a = (double)GELU_A, v = (double)x;
    double u = c * (v + a * v * v * v), t = tanh(u), cosine = cosh(u);
    return 0.5 * (1.0 + t) + 0.5 * v / (cosine * cosine) * c * (1.0 + 3.0 * a * v * v);
}

static __global__ void gelu_backward_kernel(uint16_t *du, uint16_t const *dg, uint16_t const *u, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        du[i] = bf16_bits(__fmul_rn(bf16_value(dg[i]), (float)gelu_derivative(bf16_value(u[i]))));
}

extern "C" cudaError_t cuda_gelu(uint16_t *g, uint16_t const *u, size_t n, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    gelu_kernel<<<cuda_blocks(n, CUDA_THREADS), CUDA_THREADS, 0, stream>>>(g, u, n);
    return cuda_launched();
}

extern "C" cudaError_t cuda_gelu_backward(uint16_t *du, uint16_t const *dg, uint16_t const *u, size_t n,
                                          cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    gelu_backward_kernel<<<cuda_blocks(n, CUDA_THREADS), CUDA_THREADS, 0, stream>>>(du, dg, u, n);
    return cuda_launched();
}

/* ---- Rows added ----------------------------------------------------------------------------------- */

static __global__ void add_kernel(float *dst, size_t dst_stride, float const *src, size_t src_stride,
                                  size_t rows, size_t columns) {
    for (size_t r = blockIdx.x; r < rows; r += gridDim.x)
        for (size_t c = threadIdx.x; c < columns; c += blockDim.x)
            dst[r * dst_stride + c] = __fadd_rn(dst[r * dst_stride + c], src[r * src_stride + c]);
}

static __global__ void scatter_add_kernel(float *dst, size_t dst_stride, float const *src, size_t src_stride,
                                          int32_t const *rows, size_t count, size_t columns) {
    for (size_t r = blockIdx.x; r < count; r += gridDim.x) {
        float *target = dst + (size_t)rows[r] * dst_stride; /* [columns] */
        for (size_t c = threadIdx.x; c < columns; c += blockDim.x)
            target[c] = __fadd_rn(target[c], src[r * src_stride + c]);
    }
}

extern "C" cudaError_t cuda_add(float *dst, size_t dst_stride, float const *src, size_t src_stride,
                                size_t rows, size_t columns, cudaStream_t stream) {
    if (rows == 0 || columns == 0) return cudaSuccess;
    add_kernel<<<cuda_blocks(rows, 1), CUDA_THREADS, 0, stream>>>(dst, dst_stride, src, src_stride, rows,
                                                                  columns);
    return cuda_launched();
}

extern "C" cudaError_t cuda_scatter_add_rows(float *dst, size_t dst_stride, float const *src,
                                             size_t src_stride, int32_t const *rows, size_t count,
                                             size_t columns, cudaStream_t stream) {
    if (count == 0 || columns == 0) return cudaSuccess;
    scatter_add_kernel<<<cuda_blocks(count, 1), CUDA_THREADS, 0, stream>>>(dst, dst_stride, src, src_stride,
                                                                           rows, count, columns);
    return cuda_launched();
}

/* ---- Column sums ---------------------------------------------------------------------------------- */

static __device__ __forceinline__ float element(void const *x, bool bf16, size_t at) {
    return bf16 ? bf16_value(((uint16_t const *)x)[at]) : ((float const *)x)[at];
}

/* Block (column block x, row block y): each thread one column, its rows in order, into scratch [y, :]. */
static __global__ void column_partials_kernel(float *scratch, void const *x, bool bf16, size_t stride,
                                              size_t rows, size_t columns) {
    size_t c = blockIdx.x * (size_t)blockDim.x + threadIdx.x,
           first = blockIdx.y * (size_t)CUDA_TRAIN_SUM_ROWS;
    if (c >= columns) return;
    size_t end = first + CUDA_TRAIN_SUM_ROWS < rows ? first + CUDA_TRAIN_SUM_ROWS : rows;
    float sum = 0.0f;
    for (size_t r = first; r < end; ++r)
        sum = __fadd_rn(sum, element(x, bf16, r * stride + c));
    scratch[blockIdx.y * columns + c] = sum;
}

/* out[c] += the `blocks` partial rows [blocks, columns] in order: one thread per column. */
static __global__ void column_total_kernel(float *out, float const *partials, size_t blocks, size_t columns) {
    for (size_t c = blockIdx.x * (size_t)blockDim.x + threadIdx.x; c < columns;
         c += (size_t)gridDim.x * blockDim.x) {
        float sum = out[c];
        for (size_t b = 0; b < blocks; ++b)
            sum = __fadd_rn(sum, partials[b * columns + c]);
        out[c] = sum;
    }
}

extern "C" size_t cuda_column_sums_scratch(size_t rows, size_t columns) {
    return (rows + CUDA_TRAIN_SUM_ROWS - 1) / CUDA_TRAIN_SUM_ROWS * columns;
}

extern "C" cudaError_t cuda_column_sums(float *out, void const *x, bool x_bf16, size_t x_stride, size_t rows,
                                        size_t columns, float *scratch, cudaStream_t stream) {
    if (rows == 0 || columns == 0) return cudaSuccess;
    size_t blocks = (rows + CUDA_TRAIN_SUM_ROWS - 1) / CUDA_TRAIN_SUM_ROWS;
    if (blocks > 65535) return cudaErrorInvalidValue;
    dim3 grid((unsigned)((columns + CUDA_THREADS - 1) / CUDA_THREADS), (unsigned)blocks);
    column_partials_kernel<<<grid, CUDA_THREADS, 0, stream>>>(scratch, x, x_bf16, x_stride, rows, columns);
    cudaError_t error = cuda_launched();
    if (error) return error;
    column_total_kernel<<<cuda_blocks(columns, CUDA_THREADS), CUDA_THREADS, 0, stream>>>(out, scratch, blocks,
                                                                                         columns);
    return cuda_launched();
}

/* ---- RMSNorm -------------------------------------------------------------------------------------- */

/* One block per CUDA_TRAIN_ROW_BLOCK rows: per row, the sums of x^2 and weight * dy * x (double) over the
 * block, then each thread its columns: dx, and the block's partial weight gradient (the thread's own
 * columns, rows in order). */
static __global__ void rmsnorm_backward_kernel(float *dx, bool accumulate, float *partial, float const *dy,
                                               float const *x, float const *weight, size_t rows, size_t n,
                                               float eps) {
    __shared__ double scratch[32];
    size_t blocks = (rows + CUDA_TRAIN_ROW_BLOCK - 1) / CUDA_TRAIN_ROW_BLOCK;
    for (size_t b = blockIdx.x; b < blocks; b += gridDim.x) {
        float *sums = partial + b * n; /* [n] */
        for (size_t i = threadIdx.x; i < n; i += blockDim.x)
            sums[i] = 0.0f;
        size_t end = (b + 1) * CUDA_TRAIN_ROW_BLOCK < rows ? (b + 1) * CUDA_TRAIN_ROW_BLOCK : rows;
        for (size_t r = b * CUDA_TRAIN_ROW_BLOCK; r < end; ++r) {
            float const *xr = x + r * n, *dyr = dy + r * n; /* [n] */
            double squares = 0.0, dot = 0.0;
            for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
                squares += (double)xr[i] * xr[i];
                dot += (double)weight[i] * dyr[i] * xr[i];
            }
            squares = block_reduce(squares, cuda_sum(), 0.0, scratch);
            dot = block_reduce(dot, cuda_sum(), 0.0, scratch);
            double inverse = 1.0 / sqrt(squares / (double)n + (double)eps);
            float inverse_f32 = (float)inverse,
                  coefficient = (float)(dot / (double)n * inverse * inverse * inverse);
            for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
                float gradient = dyr[i], value = xr[i];
                sums[i] = __fadd_rn(sums[i], __fmul_rn(__fmul_rn(gradient, value), inverse_f32));
                float d = __fsub_rn(__fmul_rn(__fmul_rn(weight[i], gradient), inverse_f32),
                                    __fmul_rn(value, coefficient));
                dx[r * n + i] = accumulate ? __fadd_rn(dx[r * n + i], d) : d;
            }
        }
    }
}

extern "C" cudaError_t cuda_rmsnorm_backward(float *dx, bool accumulate, float *d_weight, float *partial,
                                             float const *dy, float const *x, float const *weight,
                                             size_t rows, size_t n, float eps, cudaStream_t stream) {
    if (rows == 0 || n == 0) return cudaSuccess;
    size_t blocks = (rows + CUDA_TRAIN_ROW_BLOCK - 1) / CUDA_TRAIN_ROW_BLOCK;
    rmsnorm_backward_kernel<<<cuda_blocks(blocks, 1), CUDA_THREADS, 0, stream>>>(dx, accumulate, partial, dy,
                                                                                 x, weight, rows, n, eps);
    cudaError_t error = cuda_launched();
    if (error) return error;
    column_total_kernel<<<cuda_blocks(n, CUDA_THREADS), CUDA_THREADS, 0, stream>>>(d_weight, partial, blocks,
                                                                                   n);
    return cuda_launched();
}

/* ---- Inputs of the towers ------------------------------------------------------------------------- */

static __global__ void embed_backward_kernel(float *table_grad, float const *dx, int32_t const *starts,
                                             int32_t const *order, size_t table_rows, size_t hidden) {
    for (size_t b = blockIdx.x; b < table_rows; b += gridDim.x) {
        int32_t first = starts[b], end = starts[b + 1];
        for (size_t c = threadIdx.x; c < hidden; c += blockDim.x) {
            float sum = table_grad[b * hidden + c];
            for (int32_t at = first; at < end; ++at)
                sum = __fadd_rn(sum, dx[(size_t)order[at] * hidden + c]);
            table_grad[b * hidden + c] = sum;
        }
    }
}

extern "C" cudaError_t cuda_embed_backward(float *table_grad, float const *dx, int32_t const *starts,
                                           int32_t const *order, size_t table_rows, size_t hidden,
                                           cudaStream_t stream) {
    if (table_rows == 0 || hidden == 0) return cudaSuccess;
    embed_backward_kernel<<<cuda_blocks(table_rows, 1), CUDA_THREADS, 0, stream>>>(table_grad, dx, starts,
                                                                                   order, table_rows, hidden);
    return cuda_launched();
}

/* Slot (item, token t >= 1) copies the gradient of token t's row into its patch row. */
static __global__ void token_patches_kernel(float *d_patches, float const *d_x, int32_t const *offsets,
                                            size_t items, size_t max_patches, size_t hidden) {
    for (size_t slot = blockIdx.x; slot < items * max_patches; slot += gridDim.x) {
        size_t item = slot / max_patches, patch = slot % max_patches;
        size_t first = (size_t)offsets[item], count = (size_t)(offsets[item + 1] - offsets[item]);
        if (patch >= count) continue;
        float const *source = d_x + (first + item + 1 + patch) * hidden;
        float *target = d_patches + (first + patch) * hidden;
        for (size_t c = threadIdx.x; c < hidden; c += blockDim.x)
            target[c] = source[c];
    }
}

/* Block per position t: d_pos[t] (and d_cls for t = 0) += token t of every item that has it, in order. */
static __global__ void token_positions_kernel(float *d_cls, float *d_pos, float const *d_x,
                                              int32_t const *offsets, size_t items, size_t max_patches,
                                              size_t hidden) {
    for (size_t t = blockIdx.x; t <= max_patches; t += gridDim.x) {
        for (size_t c = threadIdx.x; c < hidden; c += blockDim.x) {
            float position = d_pos[t * hidden + c], cls = t == 0 ? d_cls[c] : 0.0f;
            for (size_t item = 0; item < items; ++item) {
                size_t first = (size_t)offsets[item], count = (size_t)(offsets[item + 1] - offsets[item]);
                if (t > count) continue;
                float g = d_x[(first + item + t) * hidden + c];
                position = __fadd_rn(position, g);
                if (t == 0) cls = __fadd_rn(cls, g);
            }
            d_pos[t * hidden + c] = position;
            if (t == 0) d_cls[c] = cls;
        }
    }
}

extern "C" cudaError_t cuda_assemble_tokens_backward(float *d_patches, float *d_cls, float *d_pos,
                                                     float const *d_x, int32_t const *offsets, size_t items,
                                                     size_t max_patches, size_t hidden, cudaStream_t stream) {
    if (items == 0 || hidden == 0) return cudaSuccess;
    if (max_patches > 0) {
        token_patches_kernel<<<cuda_blocks(items * max_patches, 1), CUDA_THREADS, 0, stream>>>(
            d_patches, d_x, offsets, items, max_patches, hidden);
        cudaError_t error = cuda_launched();
        if (error) return error;
    }
    token_positions_kernel<<<cuda_blocks(max_patches + 1, 1), CUDA_THREADS, 0, stream>>>(
        d_cls, d_pos, d_x, offsets, items, max_patches, hidden);
    return cuda_launched();
}
