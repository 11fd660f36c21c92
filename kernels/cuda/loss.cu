/* The loss of docs/DESIGN.md on the device (cuda_train.h): the next-byte cross-entropy, the embeddings
 * of a batch's items from their towers' projections, the pairwise sigmoid loss over every matryoshka
 * prefix, and the way back to the projections. Everything but the F32 gradients the towers take is in
 * double, as the RAM trainer computes it (src/train/train_step.c); each value is summed by one thread in
 * a fixed order, or by a fixed tree over the threads of one block: no atomics. */
#include "cuda_common.cuh"
#include "cuda_train.h"

/* ---- Next-byte loss --------------------------------------------------------------------------------- */

/* One block of 256 threads per row, thread j for byte j. */
static __global__ void cross_entropy_kernel(float *logits, uint16_t *d_bf16, double *loss,
                                            int32_t const *targets, size_t rows, double scale) {
    __shared__ double sums[32];
    __shared__ float maxima[32];
    unsigned j = threadIdx.x;
    for (size_t r = blockIdx.x; r < rows; r += gridDim.x) {
        float *row = logits + r * 256; /* [256] */
        int32_t target = targets[r];
        if (target < 0) {
            row[j] = 0.0f;
            d_bf16[r * 256 + j] = 0;
            if (j == 0) loss[r] = 0.0;
            continue; /* the same for the whole block */
        }
        float value = row[j];
        double max = (double)block_reduce(value, cuda_max(), -INFINITY, maxima);
        double weight = exp((double)value - max);
        double sum = block_reduce(weight, cuda_sum(), 0.0, sums);
        if (j == (unsigned)target) loss[r] = log(sum) + max - (double)value;
        float gradient = (float)(scale * (weight / sum - (j == (unsigned)target ? 1.0 : 0.0)));
        row[j] = gradient;
        d_bf16[r * 256 + j] = bf16_bits(gradient);
    }
}

extern "C" cudaError_t cuda_cross_entropy(float *logits, uint16_t *d_bf16, double *loss,
                                          int32_t const *targets, size_t rows, double scale,
                                          cudaStream_t stream) {
    if (rows == 0) return cudaSuccess;
    cross_entropy_kernel<<<cuda_blocks(rows, 1), 256, 0, stream>>>(logits, d_bf16, loss, targets, rows,
                                                                   scale);
    return cuda_launched();
}

/* ---- Sums of a few doubles ------------------------------------------------------------------------- */

static __global__ void sum_kernel(double *out, double const *values, size_t n, double divisor) {
    double sum = 0.0;
    for (size_t i = 0; i < n; ++i)
        sum += values[i];
    out[0] = divisor != 0.0 ? sum / divisor : 0.0;
}

static __global__ void total_kernel(double *loss, double const *shares, double lm_weight) {
    loss[0] = shares[0] + lm_weight * shares[1];
}

extern "C" cudaError_t cuda_sum_doubles(double *out, double const *values, size_t n, double divisor,
                                        cudaStream_t stream) {
    sum_kernel<<<1, 1, 0, stream>>>(out, values, n, divisor);
    return cuda_launched();
}

extern "C" cudaError_t cuda_total_loss(double *loss, double const *shares, double lm_weight,
                                       cudaStream_t stream) {
    total_kernel<<<1, 1, 0, stream>>>(loss, shares, lm_weight);
    return cuda_launched();
}

/* ---- Normalization in double, one block per vector ---------------------------------------------------- */

/* |v| over n values (every thread gets it). */
static __device__ double block_norm(double const *v, size_t n, double *scratch) {
    double squares = 0.0;
    for (size_t c = threadIdx.x; c < n; c += blockDim.x)
        squares += v[c] * v[c];
    return sqrt(block_reduce(squares, cuda_sum(), 0.0, scratch));
}

/* v / norm in place when norm > 0 (a zero vector stays zero). */
static __device__ void block_scale(double *v, size_t n, double norm) {
    if (!(norm > 0.0)) return;
    for (size_t c = threadIdx.x; c < n; c += blockDim.x)
        v[c] /= norm;
}

/* dy of v when y = v / |v|: (dy - y <y, dy>) / |v| in place; zeros when |v| is 0. */
static __device__ void block_normalize_backward(double *dy, double const *y, double norm, size_t n,
                                                double *scratch) {
    double dot = 0.0;
    for (size_t c = threadIdx.x; c < n; c += blockDim.x)
        dot += y[c] * dy[c];
    dot = block_reduce(dot, cuda_sum(), 0.0, scratch);
    for (size_t c = threadIdx.x; c < n; c += blockDim.x)
        dy[c] = norm > 0.0 ? (dy[c] - y[c] * dot) / norm : 0.0;
}

/* ---- Embeddings ------------------------------------------------------------------------------------ */

static __global__ void embeddings_kernel(double *e, double *item_norms, double *unit, double *unit_norms,
                                         float const *projected, int32_t const *first, int32_t const *count,
                                         size_t items, size_t dims) {
    __shared__ double scratch[32];
    for (size_t i = blockIdx.x; i < items; i += gridDim.x) {
        double *row = e + i * dims; /* [dims] */
        for (int32_t u = first[i]; u < first[i] + count[i]; ++u) {
            double *vector = unit + (size_t)u * dims;
            for (size_t c = threadIdx.x; c < dims; c += blockDim.x)
                vector[c] = (double)projected[(size_t)u * dims + c];
            double norm = block_norm(vector, dims, scratch);
            block_scale(vector, dims, norm);
            if (threadIdx.x == 0) unit_norms[u] = norm;
        }
        __syncthreads(); /* the units' rows are written */
        for (size_t c = threadIdx.x; c < dims; c += blockDim.x) {
            double sum = 0.0;
            for (int32_t u = first[i]; u < first[i] + count[i]; ++u)
                sum += unit[(size_t)u * dims + c];
            row[c] = count[i] > 1 ? sum / (double)count[i] : sum;
        }
        if (count[i] > 1) {
            double norm = block_norm(row, dims, scratch);
            block_scale(row, dims, norm);
            if (threadIdx.x == 0) item_norms[i] = norm;
        }
    }
}

extern "C" cudaError_t cuda_embeddings(double *e, double *item_norms, double *unit, double *unit_norms,
                                       float const *projected, int32_t const *first, int32_t const *count,
                                       size_t items, size_t dims, cudaStream_t stream) {
    if (items == 0 || dims == 0) return cudaSuccess;
    embeddings_kernel<<<cuda_blocks(items, 1), CUDA_THREADS, 0, stream>>>(
        e, item_norms, unit, unit_norms, projected, first, count, items, dims);
    return cuda_launched();
}

static __global__ void embeddings_backward_kernel(float *d_projected, double *de, double const *e,
                                                  double const *item_norms, double const *unit,
                                                  double const *unit_norms, int32_t const *first,
                                                  int32_t const *count, size_t items, size_t dims) {
    __shared__ double scratch[32];
    for (size_t i = blockIdx.x; i < items; i += gridDim.x) {
        double *d = de + i * dims; /* [dims]: the item's gradient, then each unit's share */
        if (count[i] > 1) {
            block_normalize_backward(d, e + i * dims, item_norms[i], dims, scratch);
            for (size_t c = threadIdx.x; c < dims; c += blockDim.x)
                d[c] /= (double)count[i];
        }
        for (int32_t u = first[i]; u < first[i] + count[i]; ++u) {
            double dot = 0.0, norm = unit_norms[u];
            double const *y = unit + (size_t)u * dims;
            for (size_t c = threadIdx.x; c < dims; c += blockDim.x)
                dot += y[c] * d[c];
            dot = block_reduce(dot, cuda_sum(), 0.0, scratch);
            for (size_t c = threadIdx.x; c < dims; c += blockDim.x)
                d_projected[(size_t)u * dims + c] = norm > 0.0 ? (float)((d[c] - y[c] * dot) / norm) : 0.0f;
        }
    }
}

extern "C" cudaError_t cuda_embeddings_backward(float *d_projected, double *de, double const *e,
                                                double const *item_norms, double const *unit,
                                                double const *unit_norms, int32_t const *first,
                                                int32_t const *count, size_t items, size_t dims,
                                                cudaStream_t stream) {
    if (items == 0 || dims == 0) return cudaSuccess;
    embeddings_backward_kernel<<<cuda_blocks(items, 1), CUDA_THREADS, 0, stream>>>(
        d_projected, de, e, item_norms, unit, unit_norms, first, count, items, dims);
    return cuda_launched();
}

/* ---- The pairwise sigmoid loss ----------------------------------------------------------------------- */

/* log(1 + exp(x)) without overflow, and the logistic function, as the RAM trainer computes them. */
static __device__ __forceinline__ double softplus(double x) {
    return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x));
}

static __device__ __forceinline__ double sigmoid(double x) {
    return x >= 0 ? 1 / (1 + exp(-x)) : exp(x) / (1 + exp(x));
}

/* Block (g, p): item g's first widths[p] values normalized into x [p, g, :], its norm into norms [p, g]. */
static __global__ void prefixes_kernel(double *x, double *norms, double const *e, cuda_contrastive_t loss) {
    __shared__ double scratch[32];
    size_t g = blockIdx.x, p = blockIdx.y, k = loss.widths[p];
    double *row = x + (p * loss.global + g) * loss.dims; /* [dims]: the first k used */
    for (size_t c = threadIdx.x; c < k; c += blockDim.x)
        row[c] = e[g * loss.dims + c];
    double norm = block_norm(row, k, scratch);
    block_scale(row, k, norm);
    if (threadIdx.x == 0) norms[p * loss.global + g] = norm;
}

/* Block i, one of this process's items: its pairs' terms over every prefix, its gradient into de [i],
 * and its sums of the loss, d scale and d bias into losses [3, local]. rows [i]: ds of each pair, then the
 * item's gradient at the prefix. */
static __global__ void pairs_kernel(double *de, double *losses, double *rows, double const *x,
                                    double const *norms, uint8_t const *related, cuda_contrastive_t loss) {
    __shared__ double scratch[32];
    size_t i = blockIdx.x, self = loss.first + i, width = loss.global + loss.dims;
    double t = exp((double)loss.logit_scale[0]), b = (double)loss.logit_bias[0];
    double *ds = rows + i * width, *dx = ds + loss.global; /* [global], [dims] */
    for (size_t c = threadIdx.x; c < loss.dims; c += blockDim.x)
        de[i * loss.dims + c] = 0.0;
    double sums[3] = {0.0, 0.0, 0.0}; /* loss, d scale, d bias of this thread's pairs */
    for (size_t p = 0; p < loss.prefixes; ++p) {
        size_t k = loss.widths[p];
        double const *xs = x + p * loss.global * loss.dims, *xi = xs + self * loss.dims;
        for (size_t j = threadIdx.x; j < loss.global; j += blockDim.x) {
            if (j == self) {
                ds[j] = 0.0;
                continue;
            }
            double dot = 0.0;
            for (size_t c = 0; c < k; ++c)
                dot += xi[c] * xs[j * loss.dims + c];
            bool is_related =
                j >= loss.first && j < loss.first + loss.local && related[i * loss.local + (j - loss.first)];
            double z = is_related ? 1 : -1, s = t * dot + b;
            sums[0] += softplus(-z * s) / (double)loss.global;
            double d = -z * sigmoid(-z * s) / (double)loss.global;
            sums[1] += d * dot * t;
            sums[2] += d;
            ds[j] = d;
        }
        __syncthreads(); /* every pair's ds is written */
        for (size_t c = threadIdx.x; c < k; c += blockDim.x) {
            double sum = 0.0;
            for (size_t j = 0; j < loss.global; ++j)
                if (j != self) sum += 2 * ds[j] * t * xs[j * loss.dims + c];
            dx[c] = sum;
        }
        block_normalize_backward(dx, xi, norms[p * loss.global + self], k, scratch);
        for (size_t c = threadIdx.x; c < k; c += blockDim.x)
            de[i * loss.dims + c] += dx[c];
        __syncthreads(); /* ds and dx are free for the next prefix */
    }
    for (int s = 0; s < 3; ++s) {
        double total = block_reduce(sums[s], cuda_sum(), 0.0, scratch);
        if (threadIdx.x == 0) losses[s * loss.local + i] = total;
    }
}

/* One thread: the items' sums in order, the share written and the logit gradients added. */
static __global__ void pairs_total_kernel(double *share, double const *losses, cuda_contrastive_t loss) {
    double totals[3] = {0.0, 0.0, 0.0};
    for (int s = 0; s < 3; ++s)
        for (size_t i = 0; i < loss.local; ++i)
            totals[s] += losses[s * loss.local + i];
    share[0] = totals[0];
    loss.d_logit_scale[0] += (float)totals[1];
    loss.d_logit_bias[0] += (float)totals[2];
}

extern "C" cudaError_t cuda_contrastive(cuda_contrastive_t const *loss, double const *e,
                                        uint8_t const *related, double *de, double *share, double *x,
                                        double *norms, double *rows, double *losses, cudaStream_t stream) {
    if (loss->prefixes == 0 || loss->prefixes > CUDA_TRAIN_PREFIXES || loss->global > 65535 ||
        loss->first + loss->local > loss->global)
        return cudaErrorInvalidValue;
    for (size_t p = 0; p < loss->prefixes; ++p)
        if (loss->widths[p] == 0 || loss->widths[p] > loss->dims) return cudaErrorInvalidValue;
    if (loss->global < 2 || loss->local == 0) { /* no pair: no loss, no gradient */
        cudaError_t error = loss->local
                                ? cudaMemsetAsync(de, 0, loss->local * loss->dims * sizeof(double), stream)
                                : cudaSuccess;
        return error ? error : cudaMemsetAsync(share, 0, sizeof(double), stream);
    }
    prefixes_kernel<<<dim3((unsigned)loss->global, (unsigned)loss->prefixes), CUDA_THREADS, 0, stream>>>(
        x, norms, e, *loss);
    cudaError_t error = cuda_launched();
    if (error) return error;
    pairs_kernel<<<(unsigned)loss->local, CUDA_THREADS, 0, stream>>>(de, losses, rows, x, norms, related,
                                                                     *loss);
    if ((error = cuda_launched())) return error;
    pairs_total_kernel<<<1, 1, 0, stream>>>(share, losses, *loss);
    return cuda_launched();
}
