/* The optimizer on the device (cuda_train.h): the gradient's global norm and AdamW, over a flat buffer of
 * chunks of CUDA_TRAIN_CHUNK scalars. The update reads the norm and the loss where the device left them,
 * so a step clips and skips without the host waiting for either. AdamW's arithmetic is the RAM trainer's
 * (src/train/train_params.c) operation for operation, in double with explicit roundings that nvcc cannot
 * contract into fused multiply-adds: from the same stored values and gradient both write the same bits. */
#include "cuda_common.cuh"
#include "cuda_train.h"

#define NORM_THREADS 1024

/* One block per chunk: its squares in a fixed tree. */
static __global__ void chunk_squares_kernel(double *chunk_sums, float const *grad, size_t chunks) {
    __shared__ double scratch[32];
    for (size_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
        float const *g = grad + chunk * CUDA_TRAIN_CHUNK; /* [CUDA_TRAIN_CHUNK] */
        double sum = 0.0;
        for (size_t i = threadIdx.x; i < CUDA_TRAIN_CHUNK; i += blockDim.x)
            sum = __dadd_rn(sum, __dmul_rn((double)g[i], (double)g[i]));
        sum = block_reduce(sum, cuda_sum(), 0.0, scratch);
        if (threadIdx.x == 0) chunk_sums[chunk] = sum;
    }
}

/* One block: each thread its chunks in order, then a fixed tree. */
static __global__ void norm_total_kernel(double *norm_squared, double const *chunk_sums, size_t chunks) {
    __shared__ double scratch[32];
    double sum = 0.0;
    for (size_t c = threadIdx.x; c < chunks; c += blockDim.x)
        sum = __dadd_rn(sum, chunk_sums[c]);
    sum = block_reduce(sum, cuda_sum(), 0.0, scratch);
    if (threadIdx.x == 0) norm_squared[0] = sum;
}

extern "C" cudaError_t cuda_gradient_norm(double *norm_squared, double *chunk_sums, float const *grad,
                                          size_t chunks, cudaStream_t stream) {
    if (chunks == 0) return cudaMemsetAsync(norm_squared, 0, sizeof(double), stream);
    chunk_squares_kernel<<<cuda_blocks(chunks, 1), CUDA_THREADS, 0, stream>>>(chunk_sums, grad, chunks);
    cudaError_t error = cuda_launched();
    if (error) return error;
    norm_total_kernel<<<1, NORM_THREADS, 0, stream>>>(norm_squared, chunk_sums, chunks);
    return cuda_launched();
}

/* One block per chunk. Every thread decides the skip alike from the same two values. */
static __global__ void adamw_kernel(float *value, uint16_t *value_bf16, float *m, float *v, float const *grad,
                                    uint8_t const *decay, size_t chunks, double const *norm_squared,
                                    double const *loss, uint32_t *skipped, cuda_adamw_t adamw) {
    double norm = sqrt(norm_squared[0]);
    bool finite = isfinite(norm) && isfinite(loss[0]);
    if (blockIdx.x == 0 && threadIdx.x == 0) skipped[0] = finite ? 0u : 1u;
    if (!finite) return;
    double scale = adamw.clip_norm > 0 && norm > adamw.clip_norm ? __ddiv_rn(adamw.clip_norm, norm) : 1.0;
    for (size_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
        double factor = decay[chunk] ? adamw.decay : 1.0;
        for (size_t i = chunk * CUDA_TRAIN_CHUNK + threadIdx.x; i < (chunk + 1) * CUDA_TRAIN_CHUNK;
             i += blockDim.x) {
            double g = __dmul_rn((double)grad[i], scale);
            float m_new =
                (float)__dadd_rn(__dmul_rn(adamw.beta1, (double)m[i]), __dmul_rn(1 - adamw.beta1, g));
            float v_new = (float)__dadd_rn(__dmul_rn(adamw.beta2, (double)v[i]),
                                           __dmul_rn(__dmul_rn(1 - adamw.beta2, g), g));
            double m_hat = __ddiv_rn((double)m_new, adamw.correction1);
            double v_hat = __ddiv_rn((double)v_new, adamw.correction2);
            double p = __dmul_rn((double)value[i], factor);
            double step =
                __ddiv_rn(__dmul_rn(adamw.learning_rate, m_hat), __dadd_rn(__dsqrt_rn(v_hat), adamw.epsilon));
            float updated = (float)__dsub_rn(p, step);
            value[i] = updated;
            value_bf16[i] = bf16_bits(updated);
            m[i] = m_new;
            v[i] = v_new;
        }
    }
}

extern "C" cudaError_t cuda_adamw_update(float *value, uint16_t *value_bf16, float *m, float *v,
                                         float const *grad, uint8_t const *decay, size_t chunks,
                                         double const *norm_squared, double const *loss, uint32_t *skipped,
                                         cuda_adamw_t const *adamw, cudaStream_t stream) {
    adamw_kernel<<<cuda_blocks(chunks, 1), CUDA_THREADS, 0, stream>>>(
        value, value_bf16, m, v, grad, decay, chunks, norm_squared, loss, skipped, *adamw);
    return cuda_launched();
}
