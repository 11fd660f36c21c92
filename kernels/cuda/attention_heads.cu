/* Attention for heads of any width up to CUDA_KERNELS_HEAD_MAX (cuda_attention_heads in cuda_kernels.h):
 * the pretrained families' heads (BERT-family 32, CLIP and SigLIP 64, 80, 96, 128 ...). Heads of 64 without
 * the log-sum-exp go to cuda_attention's tensor-core kernel; every other width runs here, in F32 on the
 * SIMT cores.
 *
 * One block of 8 warps per (8 query rows, item, head); each warp owns one query row. The block walks the
 * item's keys in tiles of 32: K and V tiles [32][HEAD_MAX + 2] BF16 go to shared memory (rows 129 words
 * apart, so the 32 lanes reading one column of 32 keys fall on distinct banks), then per warp:
 *   s_c = q . k_c                lane c scores key c of the tile (F32 sums in column order);
 *   online softmax               the warp's max and sum over the tile (shuffles), running max and sum in F32;
 *   o = o correction + sum_c p_c v_c   lane l accumulates columns l, l + 32, ... of its row, p_c broadcast
 *                                from lane c.
 * Keys past the item's length (and past the query, when causal) weigh nothing. With a bias by relative
 * position (the kernel's `biased` instance), lane c adds its key's, bias[row - key] log2(e), to its scaled
 * score before the max. No [L, L] matrix in memory.
 * Tolerance against the scalar path on the same BF16 inputs: 2e-2 relative to max|v|, as cuda_attention. */
#include <climits>

#include "cuda_common.cuh"

#define HEADS_WARPS   8 /* query rows per block */
#define HEADS_THREADS (HEADS_WARPS * 32)
#define HEADS_KEYS    32 /* keys per tile */
#define HEADS_LD      (CUDA_KERNELS_HEAD_MAX + 2)
#define HEADS_LOG2E   1.4426950408889634f

struct heads_shared {
    uint16_t k[HEADS_KEYS * HEADS_LD];            /* [32 keys][HEADS_LD] */
    uint16_t v[HEADS_KEYS * HEADS_LD];            /* [32 keys][HEADS_LD] */
    float q[HEADS_WARPS * CUDA_KERNELS_HEAD_MAX]; /* per warp: its query row, F32 */
};

/* Rows [first, first + 32) of one head's k or v (source: the item's row 0 at the head's column, rows
 * `stride` apart) into a shared tile; rows from `length` on are zeros. */
static __device__ __forceinline__ void heads_load(uint16_t *tile, uint16_t const *source, size_t stride,
                                                  int first, int length, int head) {
    for (int e = threadIdx.x; e < HEADS_KEYS * head; e += HEADS_THREADS) {
        int row = e / head, column = e % head, position = first + row;
        tile[row * HEADS_LD + column] = position < length ? source[(size_t)position * stride + column] : 0;
    }
}

/* qkv [tokens][3 * heads * head], out [tokens][heads * head], both BF16. Block (x, y, z): query rows
 * 8x .. 8x + 7, items y, y + gridDim.y, ..., head z. `biased`: bias [heads][bias_stride] F32, head h's
 * bias at distance d (query row minus key row) at bias[h * bias_stride + d] (cuda_attention's). */
template <bool biased>
static __global__ void __launch_bounds__(HEADS_THREADS)
    attention_heads_kernel(uint16_t *out, uint16_t const *qkv, int32_t const *offsets, size_t items,
                           int heads, int head, bool causal, float scale_log2, float const *bias,
                           size_t bias_stride) {
    __shared__ heads_shared shared;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int head_index = blockIdx.z, q_first = blockIdx.x * HEADS_WARPS, q_index = q_first + warp;
    size_t out_stride = (size_t)heads * head, qkv_stride = 3 * out_stride;
    float *q = shared.q + warp * CUDA_KERNELS_HEAD_MAX; /* [head] */
    float const *table = biased ? bias + (size_t)head_index * bias_stride : NULL; /* at distance 0 */

    for (size_t item = blockIdx.y; item < items; item += gridDim.y) {
        int first = offsets[item], length = offsets[item + 1] - first;
        if (q_first >= length) continue; /* the same for the whole block */
        uint16_t const *q_source = qkv + (size_t)first * qkv_stride + (size_t)head_index * head;
        uint16_t const *k_source = q_source + out_stride, *v_source = q_source + 2 * out_stride;
        bool active = q_index < length;
        __syncwarp();
        for (int d = lane; d < head; d += 32)
            q[d] = active ? bf16_value(q_source[(size_t)q_index * qkv_stride + d]) : 0.0f;
        int key_limit = causal && active ? q_index + 1 : length; /* this row's keys [0, key_limit) */
        int block_last = q_first + HEADS_WARPS < length ? q_first + HEADS_WARPS : length;
        int key_end = causal ? block_last : length;
        float max = -INFINITY, sum = 0.0f;
        float o[CUDA_KERNELS_HEAD_MAX / 32]; /* columns lane, lane + 32, ... */
#pragma unroll
        for (int j = 0; j < CUDA_KERNELS_HEAD_MAX / 32; ++j)
            o[j] = 0.0f;

        for (int k_first = 0; k_first < key_end; k_first += HEADS_KEYS) {
            __syncthreads(); /* every warp is done with the previous tiles (and the q rows are written) */
            heads_load(shared.k, k_source, qkv_stride, k_first, length, head);
            heads_load(shared.v, v_source, qkv_stride, k_first, length, head);
            __syncthreads();
            if (!active) continue;
            int key = k_first + lane;
            float score = 0.0f;
            for (int d = 0; d < head; ++d)
                score = __fmaf_rn(q[d], bf16_value(shared.k[lane * HEADS_LD + d]), score);
            bool valid = key < key_limit;
            float scaled = valid ? score * scale_log2 : -INFINITY;
            if (biased && valid) /* q_index and key both in the item: |q_index - key| < length */
                scaled = fmaf(table[q_index - key], HEADS_LOG2E, scaled);
            float tile_max = scaled;
            for (int offset = 16; offset > 0; offset >>= 1)
                tile_max = fmaxf(tile_max, __shfl_xor_sync(CUDA_FULL_MASK, tile_max, offset));
            float new_max = fmaxf(max, tile_max);
            float base = new_max == -INFINITY ? 0.0f : new_max; /* a row with no key yet stays at zero */
            float correction = exp2f(max - base);
            float weight = valid ? exp2f(scaled - base) : 0.0f, tile_sum = weight;
            for (int offset = 16; offset > 0; offset >>= 1)
                tile_sum += __shfl_xor_sync(CUDA_FULL_MASK, tile_sum, offset);
            sum = sum * correction + tile_sum;
            max = new_max;
#pragma unroll
            for (int j = 0; j < CUDA_KERNELS_HEAD_MAX / 32; ++j)
                o[j] *= correction;
            for (int c = 0; c < HEADS_KEYS; ++c) {
                float p = __shfl_sync(CUDA_FULL_MASK, weight, c);
#pragma unroll
                for (int j = 0; j < CUDA_KERNELS_HEAD_MAX / 32; ++j) {
                    int d = lane + 32 * j;
                    if (d < head) o[j] = __fmaf_rn(p, bf16_value(shared.v[c * HEADS_LD + d]), o[j]);
                }
            }
        }
        if (!active) continue;
        /* A row of the item has seen its max key, whose weight is 1: sum >= 1. */
        uint16_t *row = out + (size_t)(first + q_index) * out_stride + (size_t)head_index * head;
#pragma unroll
        for (int j = 0; j < CUDA_KERNELS_HEAD_MAX / 32; ++j) {
            int d = lane + 32 * j;
            if (d < head) row[d] = bf16_bits(o[j] / sum);
        }
    }
}

extern "C" cudaError_t cuda_attention_heads(uint16_t *out, uint16_t const *qkv, int32_t const *offsets,
                                            size_t items, size_t heads, size_t head, size_t max_length,
                                            bool causal, bool rotary, float scale, float const *bias,
                                            size_t bias_stride, cudaStream_t stream) {
    if (head == CUDA_KERNELS_HEAD)
        return cuda_attention(out, qkv, offsets, items, heads, max_length, causal, rotary, scale, bias,
                              bias_stride, stream);
    if (items == 0 || heads == 0 || max_length == 0) return cudaSuccess;
    if (rotary || head == 0 || head > CUDA_KERNELS_HEAD_MAX || heads > 65535 ||
        max_length > (size_t)INT_MAX - HEADS_WARPS || !(scale > 0.0f) ||
        (bias && bias_stride < 2 * max_length - 1))
        return cudaErrorInvalidValue;
    size_t tiles = (max_length + HEADS_WARPS - 1) / HEADS_WARPS;
    if (tiles > INT_MAX) return cudaErrorInvalidValue;
    dim3 grid((unsigned)tiles, (unsigned)(items < 65535 ? items : 65535), (unsigned)heads);
    float scale_log2 = scale * HEADS_LOG2E;
    if (bias)
        attention_heads_kernel<true><<<grid, HEADS_THREADS, 0, stream>>>(
            out, qkv, offsets, items, (int)heads, (int)head, causal, scale_log2, bias, bias_stride);
    else
        attention_heads_kernel<false><<<grid, HEADS_THREADS, 0, stream>>>(
            out, qkv, offsets, items, (int)heads, (int)head, causal, scale_log2, NULL, 0);
    return cuda_launched();
}

/* ---- The attention-pooling head's attention ---------------------------------------------------------- *
 *
 * One learned query (the head's probe, projected) against every token of an item: one block of 128 threads
 * per (item, head). The item's scores go to shared memory (F32 sums of q . k in column order, times
 * `scale`), their max and sum are block reductions (the sum in double), and each thread sums the weighted
 * values of some columns over the item's tokens in order, as pool_head does on the host. */

#define PROBE_THREADS 128
#define PROBE_LENGTH  12288 /* tokens of one item at most: their scores fill 48 KiB */

static __global__ void __launch_bounds__(PROBE_THREADS)
    attention_probe_kernel(float *out, size_t out_stride, float const *q, uint16_t const *qkv,
                           int32_t const *offsets, size_t items, int heads, int head, float scale) {
    extern __shared__ float scores[]; /* [the longest item] */
    __shared__ float maxima[32];
    __shared__ double sums[32];
    int head_index = blockIdx.y;
    size_t hidden = (size_t)heads * head, stride = 3 * hidden;
    float const *query = q + (size_t)head_index * head; /* [head] */
    for (size_t item = blockIdx.x; item < items; item += gridDim.x) {
        int first = offsets[item], length = offsets[item + 1] - first;
        uint16_t const *keys = qkv + (size_t)first * stride + hidden + (size_t)head_index * head;
        uint16_t const *values = keys + hidden;
        float max = -INFINITY;
        for (int t = threadIdx.x; t < length; t += PROBE_THREADS) {
            float dot = 0.0f;
            for (int d = 0; d < head; ++d)
                dot = __fmaf_rn(query[d], bf16_value(keys[(size_t)t * stride + d]), dot);
            scores[t] = dot * scale;
            max = fmaxf(max, scores[t]);
        }
        max = block_reduce(max, cuda_max(), -INFINITY, maxima);
        double sum = 0.0;
        for (int t = threadIdx.x; t < length; t += PROBE_THREADS) {
            float weight = expf(scores[t] - max);
            scores[t] = weight;
            sum += weight;
        }
        sum = block_reduce(sum, cuda_sum(), 0.0, sums); /* its barrier makes every weight visible */
        float total = (float)sum;
        for (int d = threadIdx.x; d < head; d += PROBE_THREADS) {
            float o = 0.0f;
            for (int t = 0; t < length; ++t)
                o = __fmaf_rn(scores[t] / total, bf16_value(values[(size_t)t * stride + d]), o);
            out[item * out_stride + (size_t)head_index * head + d] = o;
        }
        __syncthreads(); /* every thread is done with the scores before the next item's */
    }
}

extern "C" cudaError_t cuda_attention_probe(float *out, size_t out_stride, float const *q,
                                            uint16_t const *qkv, int32_t const *offsets, size_t items,
                                            size_t heads, size_t head, size_t max_length, float scale,
                                            cudaStream_t stream) {
    if (items == 0 || heads == 0) return cudaSuccess;
    if (head == 0 || head > CUDA_KERNELS_HEAD_MAX || heads > 65535 || max_length > PROBE_LENGTH ||
        !(scale > 0.0f))
        return cudaErrorInvalidValue;
    dim3 grid((unsigned)(items < 65535 ? items : 65535), (unsigned)heads);
    size_t shared = (max_length ? max_length : 1) * sizeof(float);
    attention_probe_kernel<<<grid, PROBE_THREADS, shared, stream>>>(out, out_stride, q, qkv, offsets, items,
                                                                    (int)heads, (int)head, scale);
    return cuda_launched();
}
