/* Fused attention over items packed end to end (cuda_attention in cuda_kernels.h).
 *
 * One block of 4 warps per (query tile of 64 rows, item, head). The block walks the item's keys in tiles
 * of 64: K and V tiles go to shared memory (k rotated on the way when `rotary`), and each warp owns 16
 * query rows:
 *   S [16 x 64] = Q K^T       BF16 tensor cores (nvcuda::wmma 16x16x16, F32 accumulation), to shared;
 *   online softmax            SIMT over S: two lanes per row, running max and sum in F32, P = exp2(S - max)
 *                             rounded to BF16 (the sum adds the rounded values, so the weights sum to 1);
 *   O [16 x 64] = O c + P V   O stays in accumulator fragments; the per-row rescale c = exp2(old - new max)
 *                             reaches each fragment element through a "row probe" fragment, loaded once
 *                             from a matrix whose every element is its own row index, which tells which
 *                             row each element of this lane's fragments belongs to (whatever the
 *                             architecture's fragment layout is).
 * With a bias by relative position (the kernel's `biased` instance), each lane first adds, in place in
 * its S row, the bias of its query row's distance from each key to the scaled score, both in log2 units:
 * S = S scale log2(e) + bias[row - key] log2(e), and the softmax then reads S unscaled.
 * Keys past the item's length (and past the query, when causal) score -inf; their K and V rows are
 * zeros, never read from memory. Query rows past the length are computed on zeros and not written.
 *
 * Shared memory (static, 45.5 KiB): the Q tile, whose rows become each warp's P rows once the warp holds
 * its Q fragments; K and V tiles; each warp's F32 scores; the per-row corrections; the rotary
 * frequencies. Rows of the BF16 tiles are 72 wide (144 bytes) and the F32 ones 68: the 16-byte accesses
 * of 8 consecutive lanes and the fragment loads then fall on distinct banks, and every fragment pointer
 * stays 32-byte aligned as wmma requires. */
#include <climits>
#include <mma.h>

#include <cuda_bf16.h>

#include "cuda_common.cuh"
#include "cuda_train.h"

using namespace nvcuda;

#define TILE    64 /* query rows per block, keys per tile */
#define WARPS   4  /* each warp owns 16 query rows */
#define THREADS (WARPS * 32)
#define HEAD    CUDA_KERNELS_HEAD
#define LD      72 /* row stride of the BF16 tiles, elements */
#define LD_F32  68 /* row stride of the F32 score tiles, elements */
#define LOG2E   1.4426950408889634f

static_assert(HEAD == 64, "the tiles below are written for heads of 64");

struct __align__(128) attention_shared {
    __nv_bfloat16 qp[TILE * LD];  /* the Q tile [64][LD]; then warp w's P rows are its rows 16w .. 16w + 15 */
    __nv_bfloat16 k[TILE * LD];   /* [64 keys][LD] */
    __nv_bfloat16 v[TILE * LD];   /* [64 keys][LD] */
    float s[WARPS * 16 * LD_F32]; /* per warp [16][LD_F32]: scores, the row probe, the output */
    float correction[WARPS * 16]; /* per query row: exp2(old max - new max) of the current tile */
    double frequencies[HEAD / 2]; /* rotary_frequencies */
};

/* 10000^(-2i/64) for i = 0 .. 31, as glibc's pow computes it for the scalar rope (exact round trips). */
/* clang-format off */
__constant__ double rotary_frequencies[HEAD / 2] = {
    1, 0.74989420933245587, 0.56234132519034907, 0.42169650342858223,
    0.31622776601683794, 0.23713737056616552, 0.17782794100389229, 0.1333521432163324,
    0.10000000000000001, 0.074989420933245579, 0.056234132519034911, 0.042169650342858224,
    0.031622776601683791, 0.023713737056616554, 0.017782794100389229, 0.013335214321633241,
    0.01, 0.0074989420933245579, 0.005623413251903491, 0.0042169650342858229,
    0.0031622776601683794, 0.0023713737056616554, 0.0017782794100389228, 0.0013335214321633241,
    0.001, 0.00074989420933245586, 0.0005623413251903491, 0.00042169650342858224,
    0.00031622776601683794, 0.00023713737056616554, 0.00017782794100389227, 0.0001333521432163324,
};
/* clang-format on */

typedef union eight_bf16 {
    uint4 vector;
    uint16_t bits[8];
} eight_bf16_t;

/* 8 consecutive BF16 values: one 16-byte load when the addresses allow it. */
static __device__ __forceinline__ eight_bf16_t load_eight(uint16_t const *at, bool vector) {
    eight_bf16_t values;
    if (vector) {
        values.vector = *(uint4 const *)at;
    } else {
#pragma unroll
        for (int e = 0; e < 8; ++e)
            values.bits[e] = at[e];
    }
    return values;
}

/* Rotary positions on pairs (i, i + 32), i = first .. first + 7: low holds elements i, high elements i + 32.
 * The angle p * 10000^(-2i/64) is formed in double like the scalar rope and reduced to [-pi, pi] in
 * double; only then is it rounded to F32 for the hardware's __sincosf (absolute error under 4e-7 there),
 * so cos and sin stay within 1e-6 of the scalar path's whatever the position, far below the BF16
 * rounding of the rotated values. */
static __device__ __forceinline__ void rotary_sincos(int position, double frequency, float *sine,
                                                     float *cosine) {
    double angle = (double)position * frequency;
    double turns = rint(angle * 0.15915494309189535); /* 1 / (2 pi) */
    float reduced = (float)fma(-turns, 6.283185307179586, angle);
    __sincosf(reduced, sine, cosine);
}

static __device__ __forceinline__ void rotate_eight(eight_bf16_t *low, eight_bf16_t *high, int position,
                                                    double const *frequencies) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        float sine, cosine;
        rotary_sincos(position, frequencies[e], &sine, &cosine);
        float first = bf16_value(low->bits[e]), second = bf16_value(high->bits[e]);
        low->bits[e] = bf16_bits(__fsub_rn(__fmul_rn(first, cosine), __fmul_rn(second, sine)));
        high->bits[e] = bf16_bits(__fadd_rn(__fmul_rn(second, cosine), __fmul_rn(first, sine)));
    }
}

/* Rows [first, first + 64) of one head's q, k or v into a shared tile [64][LD]: `source` is the item's
 * row 0 at the head's first column, rows `stride` elements apart. Rows from `length` on are zeros. Each
 * thread moves units of 8 columns together with the 8 columns 32 further, the rotary pairs. */
static __device__ __forceinline__ void load_tile(__nv_bfloat16 *tile, uint16_t const *source, size_t stride,
                                                 int first, int length, bool rotate, bool vector,
                                                 double const *frequencies) {
    for (int unit = threadIdx.x; unit < TILE * 4; unit += THREADS) {
        int row = unit >> 2, chunk = unit & 3, position = first + row;
        eight_bf16_t low, high;
        low.vector = high.vector = make_uint4(0, 0, 0, 0);
        if (position < length) {
            uint16_t const *at = source + (size_t)position * stride + 8 * chunk;
            low = load_eight(at, vector);
            high = load_eight(at + HEAD / 2, vector);
            if (rotate) rotate_eight(&low, &high, position, frequencies + 8 * chunk);
        }
        *(uint4 *)(tile + row * LD + 8 * chunk) = low.vector;
        *(uint4 *)(tile + row * LD + HEAD / 2 + 8 * chunk) = high.vector;
    }
}

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fragment_a;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fragment_b_transposed;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fragment_b;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> fragment_accumulator;

/* qkv [tokens][3 * heads * 64], out [tokens][heads * 64], both BF16. Block (x, y, z): query tile
 * gridDim.x - 1 - x (the long causal tiles start first), items y, y + gridDim.y, ..., head z.
 * `biased`: bias [heads][bias_stride] F32, head h's bias at distance d (query row minus key row) at
 * bias[h * bias_stride + d] (cuda_attention's); the instance without one reads and adds nothing. 4 blocks
 * per SM, as many as the shared memory allows: 128 registers (a few bytes spill), which ran about 10%
 * faster on an H200 than the 158 the compiler takes unbounded. */
template <bool biased>
static __global__ void __launch_bounds__(THREADS, 4)
    attention_kernel(uint16_t *out, float *lse, uint16_t const *qkv, int32_t const *offsets, size_t items,
                     int heads, bool causal, bool rotary, float scale_log2, bool vector, float const *bias,
                     size_t bias_stride) {
    __shared__ attention_shared shared;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int row = lane & 15, half = lane >> 4; /* this lane's row of its warp's 16, and half of the 64 columns */
    int head = blockIdx.z, q_first = (gridDim.x - 1 - blockIdx.x) * TILE;
    size_t qkv_stride = (size_t)3 * heads * HEAD, out_stride = (size_t)heads * HEAD;
    float *scores = shared.s + warp * 16 * LD_F32;      /* [16][LD_F32] */
    __nv_bfloat16 *p_rows = shared.qp + warp * 16 * LD; /* [16][LD] */
    if (threadIdx.x < HEAD / 2) shared.frequencies[threadIdx.x] = rotary_frequencies[threadIdx.x];

    for (size_t item = blockIdx.y; item < items; item += gridDim.y) {
        int first = offsets[item], length = offsets[item + 1] - first;
        if (q_first >= length) continue; /* the same for the whole block */
        __syncthreads(); /* the previous item is done with the shared tiles; the frequencies are written */
        uint16_t const *q_source = qkv + (size_t)first * qkv_stride + (size_t)head * HEAD;
        uint16_t const *k_source = q_source + out_stride, *v_source = q_source + 2 * out_stride;
        load_tile(shared.qp, q_source, qkv_stride, q_first, length, rotary, vector, shared.frequencies);
        __syncthreads();

        fragment_a q[HEAD / 16]; /* this warp's 16 query rows, by 16 columns */
#pragma unroll
        for (int d = 0; d < HEAD / 16; ++d)
            wmma::load_matrix_sync(q[d], p_rows + 16 * d, LD);
        for (int e = lane; e < 256; e += 32)
            scores[(e >> 4) * LD_F32 + (e & 15)] = (float)(e >> 4);
        __syncwarp();
        fragment_accumulator rows; /* rows.x[i]: the row of element i of any accumulator fragment */
        wmma::load_matrix_sync(rows, scores, LD_F32, wmma::mem_row_major);
        fragment_accumulator o[HEAD / 16]; /* [16 rows][64 columns] by 16 columns */
#pragma unroll
        for (int f = 0; f < HEAD / 16; ++f)
            wmma::fill_fragment(o[f], 0.0f);

        int q_index = q_first + warp * 16 + row;                               /* position in the item */
        int bias_row = q_index < length ? q_index : length - 1; /* rows past the item: any row of it */
        int key_limit = causal && q_index + 1 < length ? q_index + 1 : length; /* keys [0, key_limit) */
        int key_end = causal && q_first + TILE < length ? q_first + TILE : length;
        bool active = q_first + warp * 16 < length;
        float max = -INFINITY, sum = 0.0f; /* this lane's row: log2-scaled running max, sum of weights */

        for (int k_first = 0; k_first < key_end; k_first += TILE) {
            __syncthreads(); /* every warp is done with the previous K and V */
            load_tile(shared.k, k_source, qkv_stride, k_first, length, rotary, vector, shared.frequencies);
            load_tile(shared.v, v_source, qkv_stride, k_first, length, false, vector, shared.frequencies);
            __syncthreads();
            if (!active) continue;

            /* S = Q K^T: K [keys][64] row-major is K^T column-major. */
            __syncwarp();
#pragma unroll
            for (int f = 0; f < TILE / 16; ++f) {
                fragment_accumulator s;
                wmma::fill_fragment(s, 0.0f);
#pragma unroll
                for (int d = 0; d < HEAD / 16; ++d) {
                    fragment_b_transposed k;
                    wmma::load_matrix_sync(k, shared.k + 16 * f * LD + 16 * d, LD);
                    wmma::mma_sync(s, q[d], k, s);
                }
                wmma::store_matrix_sync(scores + 16 * f, s, LD_F32, wmma::mem_row_major);
            }
            __syncwarp();

            /* Online softmax of this lane's 32 scores: row `row`, columns 32 half .. 32 half + 31. */
            float *mine = scores + row * LD_F32 + 32 * half;
            int key = k_first + 32 * half;
            float factor = scale_log2; /* what turns S into log2-scaled logits */
            if (biased) {
                /* The bias of the distance bias_row - (key + c), real keys only: every such distance is
                 * within the item's, -(length - 1) .. length - 1. */
                float const *table = bias + (size_t)head * bias_stride;
#pragma unroll
                for (int c = 0; c < 32; ++c)
                    if (key + c < key_limit)
                        mine[c] = fmaf(table[bias_row - (key + c)], LOG2E, mine[c] * scale_log2);
                factor = 1.0f;
            }
            float tile_max = -INFINITY;
#pragma unroll
            for (int c = 0; c < 32; ++c)
                if (key + c < key_limit) tile_max = fmaxf(tile_max, mine[c] * factor);
            tile_max = fmaxf(tile_max, __shfl_xor_sync(CUDA_FULL_MASK, tile_max, 16));
            float new_max = fmaxf(max, tile_max);
            float base = new_max == -INFINITY ? 0.0f : new_max; /* a row with no key yet stays at zero */
            float correction = exp2f(max - base), tile_sum = 0.0f;
            eight_bf16_t weights[4];
#pragma unroll
            for (int c = 0; c < 32; ++c) {
                float weight = key + c < key_limit ? exp2f(mine[c] * factor - base) : 0.0f;
                uint16_t bits = bf16_bits(weight);
                weights[c >> 3].bits[c & 7] = bits;
                tile_sum += bf16_value(bits);
            }
            tile_sum += __shfl_xor_sync(CUDA_FULL_MASK, tile_sum, 16);
            sum = sum * correction + tile_sum;
            max = new_max;
#pragma unroll
            for (int c = 0; c < 4; ++c)
                *(uint4 *)(p_rows + row * LD + 32 * half + 8 * c) = weights[c].vector;
            if (half == 0) shared.correction[warp * 16 + row] = correction;
            __syncwarp();

            /* O = O correction + P V */
#pragma unroll
            for (int f = 0; f < HEAD / 16; ++f)
#pragma unroll
                for (int i = 0; i < o[f].num_elements; ++i)
                    o[f].x[i] *= shared.correction[warp * 16 + (int)rows.x[i]];
#pragma unroll
            for (int j = 0; j < TILE / 16; ++j) {
                fragment_a p;
                wmma::load_matrix_sync(p, p_rows + 16 * j, LD);
#pragma unroll
                for (int f = 0; f < HEAD / 16; ++f) {
                    fragment_b v;
                    wmma::load_matrix_sync(v, shared.v + 16 * j * LD + 16 * f, LD);
                    wmma::mma_sync(o[f], p, v, o[f]);
                }
            }
        }
        if (!active) continue;

        /* out = O / sum, through this warp's score rows. A row that is the item's has seen its max key,
         * whose weight is 1, so its sum is at least 1. */
        __syncwarp();
#pragma unroll
        for (int f = 0; f < HEAD / 16; ++f)
            wmma::store_matrix_sync(scores + 16 * f, o[f], LD_F32, wmma::mem_row_major);
        __syncwarp();
        if (q_index < length && lse && half == 0)
            lse[(size_t)(first + q_index) * heads + head] = max + log2f(sum);
        if (q_index < length) {
            float const *values = scores + row * LD_F32 + 32 * half;
            float inverse = 1.0f / sum;
            uint16_t *target = out + (size_t)(first + q_index) * out_stride + (size_t)head * HEAD + 32 * half;
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                eight_bf16_t packed;
#pragma unroll
                for (int e = 0; e < 8; ++e)
                    packed.bits[e] = bf16_bits(values[8 * c + e] * inverse);
                if (vector) {
                    *(uint4 *)(target + 8 * c) = packed.vector;
                } else {
#pragma unroll
                    for (int e = 0; e < 8; ++e)
                        target[8 * c + e] = packed.bits[e];
                }
            }
        }
    }
}

/* The launch of attention_kernel, with or without the log-sum-exp, with or without a bias. */
static cudaError_t attention_launch(uint16_t *out, float *lse, uint16_t const *qkv, int32_t const *offsets,
                                    size_t items, size_t heads, size_t max_length, bool causal, bool rotary,
                                    float scale, float const *bias, size_t bias_stride, cudaStream_t stream) {
    if (items == 0 || heads == 0 || max_length == 0) return cudaSuccess;
    if (heads > 65535 || max_length > (size_t)INT_MAX - TILE || !(scale > 0.0f) ||
        (bias && bias_stride < 2 * max_length - 1))
        return cudaErrorInvalidValue;
    size_t tiles = (max_length + TILE - 1) / TILE;
    bool vector = (uintptr_t)qkv % 16 == 0 && (uintptr_t)out % 16 == 0;
    dim3 grid((unsigned)tiles, (unsigned)(items < 65535 ? items : 65535), (unsigned)heads);
    if (bias)
        attention_kernel<true><<<grid, THREADS, 0, stream>>>(out, lse, qkv, offsets, items, (int)heads,
                                                             causal, rotary, scale * LOG2E, vector, bias,
                                                             bias_stride);
    else
        attention_kernel<false><<<grid, THREADS, 0, stream>>>(out, lse, qkv, offsets, items, (int)heads,
                                                              causal, rotary, scale * LOG2E, vector, NULL, 0);
    return cuda_launched();
}

extern "C" cudaError_t cuda_attention(uint16_t *out, uint16_t const *qkv, int32_t const *offsets,
                                      size_t items, size_t heads, size_t max_length, bool causal, bool rotary,
                                      float scale, float const *bias, size_t bias_stride,
                                      cudaStream_t stream) {
    return attention_launch(out, NULL, qkv, offsets, items, heads, max_length, causal, rotary, scale, bias,
                            bias_stride, stream);
}

extern "C" cudaError_t cuda_attention_lse(uint16_t *out, float *lse, uint16_t const *qkv,
                                          int32_t const *offsets, size_t items, size_t heads,
                                          size_t max_length, bool causal, bool rotary, float scale,
                                          cudaStream_t stream) {
    return attention_launch(out, lse, qkv, offsets, items, heads, max_length, causal, rotary, scale, NULL, 0,
                            stream);
}

/* ---- The backward pass ------------------------------------------------------------------------------ *
 *
 * SIMT in F32 over tiles of 32 rows (BACK_TILE), 256 threads a block, everything in static shared memory
 * (42 KiB): the block's own tile of two operands (K and V, or Q and dO), the streamed tile of the other two,
 * and P and dS [32][33]. A score entry (q, k) is thread e % 32's key against row e / 32 for e = tid + 256 m,
 * so a warp reads 32 keys' rows on 32 distinct banks (rows 65 floats apart) against one broadcast query
 * row; an accumulated row of 64 is 8 threads' share, thread t holding columns t % 8 + 8 m, which puts each
 * rotary pair (i, i + 32) in one thread. */

#define BACK_TILE    32
#define BACK_THREADS 256
#define BACK_LD      (HEAD + 1)

struct backward_shared {
    float own[2][BACK_TILE * BACK_LD];     /* the block's tile: K and V, or Q and dO */
    float seen[2][BACK_TILE * BACK_LD];    /* the tile streamed past it: Q and dO, or K and V */
    float p[BACK_TILE * (BACK_TILE + 1)];  /* P [q][k] */
    float ds[BACK_TILE * (BACK_TILE + 1)]; /* dS [q][k] */
    float lse[BACK_TILE], d_rows[BACK_TILE];
    double frequencies[HEAD / 2];
};

/* Rows [first, first + 32) of one head's q, k, v or dO (source: the item's row 0 at the head's column)
 * into tile [32][BACK_LD] as F32, rotated when `rotate` (and rounded to BF16, the values the forward pass's
 * products saw, so that its log-sum-exp normalizes the probabilities recomputed here); rows from `length`
 * on are zeros. */
static __device__ void load_back_tile(float *tile, uint16_t const *source, size_t stride, int first,
                                      int length, bool rotate, double const *frequencies) {
    for (int unit = threadIdx.x; unit < BACK_TILE * HEAD / 2; unit += BACK_THREADS) {
        int row = unit / (HEAD / 2), i = unit % (HEAD / 2), position = first + row;
        float low = 0.0f, high = 0.0f;
        if (position < length) {
            low = bf16_value(source[(size_t)position * stride + i]);
            high = bf16_value(source[(size_t)position * stride + i + HEAD / 2]);
        }
        if (rotate && position < length) {
            float sine, cosine;
            rotary_sincos(position, frequencies[i], &sine, &cosine);
            float first_value = low; /* rotated, then rounded to BF16 as the forward pass rounds them */
            low = bf16_value(bf16_bits(__fsub_rn(__fmul_rn(low, cosine), __fmul_rn(high, sine))));
            high = bf16_value(bf16_bits(__fadd_rn(__fmul_rn(high, cosine), __fmul_rn(first_value, sine))));
        }
        tile[row * BACK_LD + i] = low;
        tile[row * BACK_LD + i + HEAD / 2] = high;
    }
}

/* The softmax statistics of query rows [first, first + 32): lse and rowsum(dO * O), +inf and 0 past the
 * item (so that their probabilities are 0). */
static __device__ void load_back_rows(backward_shared *shared, float const *lse, float const *d_rows,
                                      int first, int length, int heads, int head, int item_first) {
    if (threadIdx.x < BACK_TILE) {
        int position = first + (int)threadIdx.x;
        bool inside = position < length;
        size_t at = (size_t)(item_first + position) * heads + head;
        shared->lse[threadIdx.x] = inside ? lse[at] : INFINITY;
        shared->d_rows[threadIdx.x] = inside ? d_rows[at] : 0.0f;
    }
}

/* P and dS of the tile pair: queries in q_tile (rows of q and dO) against keys in k_tile (rows of k and v),
 * query rows from q_first, keys from k_first. */
static __device__ void back_scores(backward_shared *shared, float const *q, float const *d_out,
                                   float const *k, float const *v, int q_first, int k_first, int length,
                                   bool causal, float scale_log2) {
    for (int e = threadIdx.x; e < BACK_TILE * BACK_TILE; e += BACK_THREADS) {
        int qi = e / BACK_TILE, ki = e % BACK_TILE, query = q_first + qi, key = k_first + ki;
        bool valid = query < length && key < length && (!causal || key <= query);
        float score = 0.0f, dp = 0.0f;
        for (int d = 0; d < HEAD; ++d) {
            score = __fmaf_rn(q[qi * BACK_LD + d], k[ki * BACK_LD + d], score);
            dp = __fmaf_rn(d_out[qi * BACK_LD + d], v[ki * BACK_LD + d], dp);
        }
        float p = valid ? exp2f(score * scale_log2 - shared->lse[qi]) : 0.0f;
        shared->p[qi * (BACK_TILE + 1) + ki] = p;
        shared->ds[qi * (BACK_TILE + 1) + ki] = p * (dp - shared->d_rows[qi]);
    }
}

/* Writes a row share of 8 columns (t % 8 + 8 m) as BF16 at `target` (the row's head columns), times
 * `scale`, the rotary rotation undone when `rotate` (pairs m and m + 4). */
static __device__ void write_back_row(uint16_t *target, float const values[8], float scale, int position,
                                      bool rotate, double const *frequencies) {
    int j = threadIdx.x % 8;
    float out[8];
#pragma unroll
    for (int m = 0; m < 8; ++m)
        out[m] = values[m] * scale;
    if (rotate) {
#pragma unroll
        for (int m = 0; m < 4; ++m) {
            float sine, cosine, low = out[m], high = out[m + 4];
            rotary_sincos(position, frequencies[j + 8 * m], &sine, &cosine);
            out[m] = __fadd_rn(__fmul_rn(low, cosine), __fmul_rn(high, sine));
            out[m + 4] = __fsub_rn(__fmul_rn(high, cosine), __fmul_rn(low, sine));
        }
    }
#pragma unroll
    for (int m = 0; m < 8; ++m)
        target[j + 8 * m] = bf16_bits(out[m]);
}

/* d_rows [tokens, heads] = rowsum(dO * O) per head, one thread per (row, head), in column order. */
static __global__ void attention_rows_kernel(float *d_rows, uint16_t const *out, uint16_t const *d_out,
                                             size_t tokens, size_t heads) {
    for (size_t unit = blockIdx.x * (size_t)blockDim.x + threadIdx.x; unit < tokens * heads;
         unit += (size_t)gridDim.x * blockDim.x) {
        size_t at = unit / heads * heads * HEAD + unit % heads * HEAD;
        float sum = 0.0f;
        for (int d = 0; d < HEAD; ++d)
            sum = __fmaf_rn(bf16_value(d_out[at + d]), bf16_value(out[at + d]), sum);
        d_rows[unit] = sum;
    }
}

/* The tiles a block holds: with `keys`, tile x of the item's keys (K and V), accumulating dK and dV over
 * the query tiles that see it; else tile x of its queries (Q and dO, with their rows' statistics),
 * accumulating dQ over the key tiles it sees. Block (x, items y, y + gridDim.y, ..., head z). */
template <bool keys>
static __global__ void __launch_bounds__(BACK_THREADS)
    attention_back_kernel(uint16_t *d_qkv, uint16_t const *qkv, uint16_t const *d_out, float const *lse,
                          float const *d_rows, int32_t const *offsets, size_t items, int heads, bool causal,
                          bool rotary, float scale, float scale_log2) {
    __shared__ backward_shared shared;
    int head = blockIdx.z, own_first = blockIdx.x * BACK_TILE, row = threadIdx.x / 8, j = threadIdx.x % 8;
    size_t qkv_stride = (size_t)3 * heads * HEAD, out_stride = (size_t)heads * HEAD;
    if (threadIdx.x < HEAD / 2) shared.frequencies[threadIdx.x] = rotary_frequencies[threadIdx.x];
    for (size_t item = blockIdx.y; item < items; item += gridDim.y) {
        int first = offsets[item], length = offsets[item + 1] - first;
        if (own_first >= length) continue;
        __syncthreads(); /* the previous item is done with the tiles; the frequencies are written */
        uint16_t const *q = qkv + (size_t)first * qkv_stride + (size_t)head * HEAD, *k = q + out_stride;
        uint16_t const *v = k + out_stride, *o = d_out + (size_t)first * out_stride + (size_t)head * HEAD;
        /* own[0], own[1]: K and V, or Q and dO; seen[0], seen[1] the others, streamed */
        load_back_tile(shared.own[0], keys ? k : q, qkv_stride, own_first, length, rotary,
                       shared.frequencies);
        load_back_tile(shared.own[1], keys ? v : o, keys ? qkv_stride : out_stride, own_first, length, false,
                       shared.frequencies);
        if (!keys) load_back_rows(&shared, lse, d_rows, own_first, length, heads, head, first);
        float first_sums[8] = {0}, second_sums[8] = {0}; /* dK and dV, or dQ */
        int begin = keys && causal ? own_first : 0;
        int end = !keys && causal && own_first + BACK_TILE < length ? own_first + BACK_TILE : length;
        for (int seen_first = begin; seen_first < end; seen_first += BACK_TILE) {
            __syncthreads(); /* every thread is done with the previous tile seen */
            load_back_tile(shared.seen[0], keys ? q : k, qkv_stride, seen_first, length, rotary,
                           shared.frequencies);
            load_back_tile(shared.seen[1], keys ? o : v, keys ? out_stride : qkv_stride, seen_first, length,
                           false, shared.frequencies);
            if (keys) load_back_rows(&shared, lse, d_rows, seen_first, length, heads, head, first);
            __syncthreads();
            if (keys)
                back_scores(&shared, shared.seen[0], shared.seen[1], shared.own[0], shared.own[1], seen_first,
                            own_first, length, causal, scale_log2);
            else
                back_scores(&shared, shared.own[0], shared.own[1], shared.seen[0], shared.seen[1], own_first,
                            seen_first, length, causal, scale_log2);
            __syncthreads();
            for (int i = 0; i < BACK_TILE; ++i) {
                /* keys: dK[row] += dS[i][row] q_i, dV[row] += P[i][row] dO_i; else dQ[row] += dS[row][i] k_i
                 */
                int entry = keys ? i * (BACK_TILE + 1) + row : row * (BACK_TILE + 1) + i;
                float ds = shared.ds[entry], p = shared.p[entry];
#pragma unroll
                for (int m = 0; m < 8; ++m) {
                    first_sums[m] = __fmaf_rn(ds, shared.seen[0][i * BACK_LD + j + 8 * m], first_sums[m]);
                    if (keys)
                        second_sums[m] =
                            __fmaf_rn(p, shared.seen[1][i * BACK_LD + j + 8 * m], second_sums[m]);
                }
            }
        }
        int position = own_first + row;
        if (position >= length) continue;
        uint16_t *target = d_qkv + (size_t)(first + position) * qkv_stride + (size_t)head * HEAD;
        write_back_row(keys ? target + out_stride : target, first_sums, scale, position, rotary,
                       shared.frequencies);
        if (keys)
            write_back_row(target + 2 * out_stride, second_sums, 1.0f, position, false, shared.frequencies);
    }
}

extern "C" cudaError_t cuda_attention_backward(uint16_t *d_qkv, float *d_rows, uint16_t const *qkv,
                                               uint16_t const *out, uint16_t const *d_out, float const *lse,
                                               int32_t const *offsets, size_t items, size_t tokens,
                                               size_t heads, size_t max_length, bool causal, bool rotary,
                                               float scale, cudaStream_t stream) {
    if (items == 0 || heads == 0 || max_length == 0 || tokens == 0) return cudaSuccess;
    if (heads > 65535 || max_length > (size_t)INT_MAX - TILE || !(scale > 0.0f)) return cudaErrorInvalidValue;
    attention_rows_kernel<<<cuda_blocks(tokens * heads, BACK_THREADS), BACK_THREADS, 0, stream>>>(
        d_rows, out, d_out, tokens, heads);
    cudaError_t error = cuda_launched();
    if (error) return error;
    dim3 grid((unsigned)((max_length + BACK_TILE - 1) / BACK_TILE), (unsigned)(items < 65535 ? items : 65535),
              (unsigned)heads);
    attention_back_kernel<true><<<grid, BACK_THREADS, 0, stream>>>(
        d_qkv, qkv, d_out, lse, d_rows, offsets, items, (int)heads, causal, rotary, scale, scale * LOG2E);
    if ((error = cuda_launched())) return error;
    attention_back_kernel<false><<<grid, BACK_THREADS, 0, stream>>>(
        d_qkv, qkv, d_out, lse, d_rows, offsets, items, (int)heads, causal, rotary, scale, scale * LOG2E);
    return cuda_launched();
}
