/* The CUDA kernels of the engine, callable from C.
 *
 * Every function enqueues its work on `stream` and answers at once, without synchronizing: the
 * launch's cudaError_t (cudaSuccess when the work was enqueued). Pointers are device memory unless a
 * comment says otherwise; nothing here allocates. BF16 values are uint16_t on the C side (the bits
 * of __nv_bfloat16). Shapes follow kernels/kernels.h: row-major matrices with strides in elements,
 * weights `[out, in]`, a linear layer computes `x W^T + b`.
 *
 * The CPU scalar path (kernels/kernels.h) defines the numbers; tests/vram/test_cuda.c checks each function
 * against it on random data, within the tolerances written beside each function below. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CUDA_KERNELS_HEAD 64 /* the head of cuda_attention and of training */
#define CUDA_KERNELS_HEAD_MAX                                                                                \
    256 /* the widest head of cuda_attention_heads (kernels.h's KERNEL_HEAD_MAX)                             \
         */

/* ---- Conversions and gathers -------------------------------------------------------------------- */

/* out[i] = in[i] for n values, BF16 -> F32 (exact) and F32 -> BF16 (nearest even, NaN kept quiet:
 * bitwise equal to kernels.h's f32_to_bf16). */
cudaError_t cuda_bf16_to_f32(float *out, uint16_t const *in, size_t n, cudaStream_t stream);
cudaError_t cuda_f32_to_bf16(uint16_t *out, float const *in, size_t n, cudaStream_t stream);

/* x[r, :] = table[indices[r], :] as F32, for `rows` rows of `hidden`; table BF16 [?, hidden]
 * (the caller guarantees every index is in range). Exact. */
cudaError_t cuda_embed(float *x, uint16_t const *table, int32_t const *indices, size_t rows, size_t hidden,
                       cudaStream_t stream);

/* dst[r, :] = src[rows[r], :] for `count` rows of `columns` F32 (strides in elements); a row index below
 * 0 writes a row of zeros (a failed item's). Exact. */
cudaError_t cuda_gather_rows(float *dst, size_t dst_stride, float const *src, size_t src_stride,
                             int32_t const *rows, size_t count, size_t columns, cudaStream_t stream);

/* out[g, :] = the mean of rows [g * group, (g + 1) * group) of x, for `groups` groups of `columns` F32
 * (strides in elements): summed in row order in F32, then divided by `group`, as the host pools a clip's
 * frames (src/encode/video.c). group 0 answers cudaErrorInvalidValue. Bitwise equal to that loop. */
cudaError_t cuda_mean_rows(float *out, size_t out_stride, float const *x, size_t x_stride, size_t groups,
                           size_t group, size_t columns, cudaStream_t stream);

/* out[i, :] = the mean of rows [offsets[i], offsets[i + 1]) of x (F32, `columns` wide, strides in
 * elements; offsets device int32 [items + 1]), summed in row order in F32 then divided by the count, as
 * the host's mean pooling (tower_pool); an item without rows gets zeros. Bitwise equal to that loop. */
cudaError_t cuda_mean_segments(float *out, size_t out_stride, float const *x, size_t x_stride,
                               int32_t const *offsets, size_t items, size_t columns, cudaStream_t stream);

/* The input rows of a text tower that reads tokens: x[r, :] = table[ids[r], :] (BF16 [vocab, hidden]) +
 * token_type (F32 [hidden], or NULL) + positions[places[r], :] (F32 [?, hidden], or NULL: then `places` is
 * not read), added in that order in F32 as the host's tokens_embed does (the caller guarantees every id
 * and place is in range). Exact. positions without places: cudaErrorInvalidValue. */
cudaError_t cuda_embed_tokens(float *x, uint16_t const *table, int32_t const *ids, float const *token_type,
                              float const *positions, int32_t const *places, size_t rows, size_t hidden,
                              cudaStream_t stream);

/* x[r, :] += add[r % period, :] for `rows` rows of `columns` F32 (learned positions: `add` holds
 * `period` rows). Exact. */
cudaError_t cuda_add_rows(float *x, size_t x_stride, float const *add, size_t period, size_t rows,
                          size_t columns, cudaStream_t stream);

/* The token rows of the image and audio towers: item i has patches rows [offsets[i], offsets[i + 1])
 * of `patches` (F32 [?, hidden], the patch projections, bias included); its tokens start at row
 * offsets[i] + i of x: first the class token, cls + pos[0], then patch j as patches[offsets[i] + j] +
 * pos[1 + j] (pos F32 [1 + max patches, hidden], cls F32 [hidden]; offsets device int32). Exact. */
cudaError_t cuda_assemble_tokens(float *x, float const *patches, float const *cls, float const *pos,
                                 int32_t const *offsets, size_t items, size_t max_patches, size_t hidden,
                                 cudaStream_t stream);

/* cuda_assemble_tokens with `leading` tokens before each item's patches: the class token, cls + pos[0],
 * then the register tokens, rows 1 .. leading - 1 of pos as they are (registers have no position); none
 * with leading 0 (no class token: cls is not read). Item i's tokens start at row offsets[i] + i * leading,
 * patch j is patches[offsets[i] + j] + pos[leading + j]. Exact. */
cudaError_t cuda_assemble_leading(float *x, float const *patches, float const *cls, float const *pos,
                                  int32_t const *offsets, size_t items, size_t max_patches, size_t leading,
                                  size_t hidden, cudaStream_t stream);

/* ---- Normalization ------------------------------------------------------------------------------ */

/* y = x / sqrt(mean(x^2) + eps) * weight per row of n, F32 in (stride x_stride). Either output may
 * be NULL: y_bf16 (BF16, stride y_bf16_stride) feeds the next GEMM, y_f32 (F32, stride y_f32_stride;
 * may equal x) keeps the states. Tolerance: 1e-5 relative for F32, one BF16 rounding for BF16. */
cudaError_t cuda_rmsnorm(uint16_t *y_bf16, size_t y_bf16_stride, float *y_f32, size_t y_f32_stride,
                         float const *x, size_t x_stride, float const *weight, size_t rows, size_t n,
                         float eps, cudaStream_t stream);

/* y = (x - mean) / sqrt(var + eps) * weight + bias per row of n, F32 in (stride x_stride), as kernels.h's
 * layernorm: the row's mean and biased variance in two passes, summed in double. bias may be NULL (none).
 * Either output may be NULL, as in cuda_rmsnorm (y_f32 may equal x). Tolerance: 1e-5 relative to
 * |(x - mean) / sqrt(var + eps) * weight| + |bias| for F32, one BF16 rounding more for BF16. */
cudaError_t cuda_layernorm(uint16_t *y_bf16, size_t y_bf16_stride, float *y_f32, size_t y_f32_stride,
                           float const *x, size_t x_stride, float const *weight, float const *bias,
                           size_t rows, size_t n, float eps, cudaStream_t stream);

/* Scales each of `rows` F32 rows of `columns` (stride in elements) to unit L2 norm; a zero row stays
 * zero. Tolerance 1e-6 relative. */
cudaError_t cuda_normalize(float *x, size_t stride, size_t rows, size_t columns, cudaStream_t stream);

/* x[i] = tanh(x[i]) for n F32 values, in place (a projection's tanh: sentence-transformers' Dense module).
 * Tolerance against glibc's tanhf: 2 ulp. */
cudaError_t cuda_tanh(float *x, size_t n, cudaStream_t stream);

/* Writes `rows` F32 rows of `columns` as `scalar` (0 F32, 1 BF16, 2 F16, 3 I8, the values of
 * uform_scalar_t): BF16 and F16 round to nearest even; I8 per row with scale = max|x| / 127 (0 for a
 * zero row), q = round(x / scale) half away from zero, the scale in scales[r] (device). Bitwise equal
 * to kernels.h's scalar `convert`. Rows of `out` are `out_stride` bytes apart (`out` and `out_stride`
 * aligned to the element size). An unknown `scalar`, or I8 without `scales`: cudaErrorInvalidValue. */
cudaError_t cuda_convert(void *out, size_t out_stride, float *scales, float const *x, size_t x_stride,
                         size_t rows, size_t columns, int scalar, cudaStream_t stream);

/* ---- Attention ---------------------------------------------------------------------------------- */

/* Attention of every head over every item of a batch packed end to end, without padding.
 * - qkv: BF16 [tokens, 3 * heads * 64]: q in columns [0, H*64), k in [H*64, 2*H*64), v after; head h
 *   uses columns h*64 .. h*64+63 of each;
 * - out: BF16 [tokens, heads * 64], head outputs in head order;
 * - offsets: device int32 [items + 1]: item i owns rows [offsets[i], offsets[i + 1]); positions
 *   restart at 0 for each item; `max_length` bounds offsets[i + 1] - offsets[i];
 * - rotary: q and k rotated before the scores, pairs (i, i + 32) of each head by the angle
 *   p * 10000^(-2i/64) at position p (kernels.h's rope), in F32;
 * - causal: row r attends to rows <= r of its item; else to every row of its item;
 * - scale: 1/sqrt(64);
 * - bias: NULL, or a bias by relative position (MPNet's), F32 [heads][bias_stride]: head h's at distance
 *   d = r - c (query row r, key row c, both counted from the item's first row) is bias[h * bias_stride +
 *   d], read for d from -(max_length - 1) to max_length - 1 (`bias` points at head 0's distance 0; its
 *   table reaches max_length - 1 either way, bias_stride >= 2 * max_length - 1). It is added in F32 to
 *   the scaled score of every real key, before the causal mask and the softmax (kernels.h's
 *   kernel_attention_t.bias). Without one the kernel reads and adds nothing.
 * Online softmax over tiles of keys with F32 accumulation; no [L, L] matrix in memory. The products run
 * on BF16 tensor cores: rotated q and k, and the softmax weights, are rounded to BF16 before them.
 * Items may be empty; heads > 65535, a scale that is not positive or a bias_stride below 2 * max_length
 * - 1 answers cudaErrorInvalidValue. Tolerance against the scalar path on the same (BF16-rounded) inputs:
 * 2e-2 relative to max|v|. */
cudaError_t cuda_attention(uint16_t *out, uint16_t const *qkv, int32_t const *offsets, size_t items,
                           size_t heads, size_t max_length, bool causal, bool rotary, float scale,
                           float const *bias, size_t bias_stride, cudaStream_t stream);

/* cuda_attention for heads of `head` columns, 1 .. CUDA_KERNELS_HEAD_MAX: qkv BF16 [tokens, 3 * heads *
 * head], out BF16 [tokens, heads * head], head h at columns h * head of each third; `scale` multiplies the
 * scores (1/sqrt(head) for every family the engine reads); `bias` and `bias_stride` as cuda_attention's.
 * Heads of 64 run cuda_attention itself; other widths run a SIMT kernel with F32 products and the same
 * online softmax, without rotary positions (rotary with another width, a head of 0 or past the maximum,
 * heads > 65535, a scale that is not positive or a bias_stride below 2 * max_length - 1:
 * cudaErrorInvalidValue). Tolerance as cuda_attention's. */
cudaError_t cuda_attention_heads(uint16_t *out, uint16_t const *qkv, int32_t const *offsets, size_t items,
                                 size_t heads, size_t head, size_t max_length, bool causal, bool rotary,
                                 float scale, float const *bias, size_t bias_stride, cudaStream_t stream);

/* The attention of the attention-pooling head (SigLIP's image pooling): for each item (rows [offsets[i],
 * offsets[i + 1]) of qkv, BF16 [tokens, 3 * heads * head] as a block's, its k and v thirds read) and head h,
 * out[i, h * head ..] = softmax(q_h . k_t * scale over the item's tokens t) . v_t, F32; q F32 [heads * head],
 * the probe's query, the same for every item. Scores and sums in F32 (the softmax's sum in double),
 * values summed in token order. An empty item gets zeros. `max_length` bounds every item's length (at most
 * 12288); past it, a head of 0 or past CUDA_KERNELS_HEAD_MAX, heads > 65535 or a scale that is not positive:
 * cudaErrorInvalidValue. Tolerance against the host's pool_head on the same inputs: 1e-5 relative to
 * max|v|. */
cudaError_t cuda_attention_probe(float *out, size_t out_stride, float const *q, uint16_t const *qkv,
                                 int32_t const *offsets, size_t items, size_t heads, size_t head,
                                 size_t max_length, float scale, cudaStream_t stream);

/* x[r, :] = 0 for each r < `count` whose rows[r] is below 0 (a failed item's, as cuda_gather_rows marks
 * it), `columns` F32 (stride in elements); other rows are left as they are. Exact. */
cudaError_t cuda_zero_failed_rows(float *x, size_t stride, int32_t const *rows, size_t count, size_t columns,
                                  cudaStream_t stream);

/* dst[rows[r], :] = src[r, :] for `count` rows of `columns` F32 (strides in elements): the inverse of
 * cuda_gather_rows (distinct rows; the caller guarantees they are in range). Exact. */
cudaError_t cuda_scatter_rows(float *dst, size_t dst_stride, float const *src, size_t src_stride,
                              int32_t const *rows, size_t count, size_t columns, cudaStream_t stream);

/* ---- text_choose -------------------------------------------------------------------------------- */

/* For each item i, over its legal bytes legal[offsets[i] .. offsets[i + 1]) (offsets: device int64,
 * offsets[0] may be non-zero): logits[j] = states[i] . table[legal[j]] with table BF16 [257, hidden]
 * and states F32 rows (stride in elements), then probabilities[offsets[i] - offsets[0] + j] =
 * softmax over the item's logits. Tolerance 1e-5 absolute. */
cudaError_t cuda_choose(float *probabilities, float const *states, size_t states_stride,
                        uint16_t const *table, uint8_t const *legal, int64_t const *offsets, size_t items,
                        size_t hidden, cudaStream_t stream);

/* ---- Linear layers through cuBLASLt -------------------------------------------------------------- */

typedef struct cuda_gemm cuda_gemm_t;

/* A cuBLASLt handle, its workspace and a cache of chosen algorithms, for one device and stream (the
 * device current when it is created). cudaSuccess, or an error with nothing held. */
cudaError_t cuda_gemm_create(cuda_gemm_t **gemm, cudaStream_t stream);
void cuda_gemm_destroy(cuda_gemm_t *gemm);

/* The GELUs are kernels.h's epilogues. cuBLASLt has the tanh one; the exact and the quick one always run in
 * a kernel of ours after the product (see cuda_linear). */
typedef enum cuda_linear_kind {
    CUDA_LINEAR_BF16 = 0,            /* y BF16 = x W^T + b */
    CUDA_LINEAR_GELU_BF16 = 1,       /* y BF16 = gelu_tanh(x W^T + b) */
    CUDA_LINEAR_RESIDUAL = 2,        /* y F32 += x W^T + b (y is read and written) */
    CUDA_LINEAR_F32 = 3,             /* y F32 = x W^T + b */
    CUDA_LINEAR_GELU_ERF_BF16 = 4,   /* y BF16 = gelu_erf(x W^T + b): 0.5x(1 + erf(x / sqrt 2)) */
    CUDA_LINEAR_GELU_QUICK_BF16 = 5, /* y BF16 = gelu_quick(x W^T + b): x sigmoid(1.702x) */
} cuda_linear_kind_t;

typedef struct cuda_linear {
    size_t m, n, k;
    uint16_t const *x; /* BF16 [m, k], row stride x_stride */
    size_t x_stride;
    uint16_t const *w; /* BF16 [n, k], contiguous, 16-byte aligned */
    float const *bias; /* F32 [n], or NULL */
    void *y;           /* [m, n] of the kind's type, row stride y_stride (elements) */
    size_t y_stride;
    cuda_linear_kind_t kind;
} cuda_linear_t;

/* Enqueues one linear layer on the gemm's stream: BF16 inputs, F32 accumulation, the bias and GELU
 * fused as cuBLASLt epilogues where it offers them (beside a BF16 output the bias is first rounded to
 * BF16, the bias type cuBLASLt takes there), else a kernel of ours after the product (which for BF16
 * outputs rounds the product to BF16 before the bias), and always so for the exact and the quick GELU.
 * The first call for a shape, strides, kind and pointer alignments asks cuBLASLt's heuristic (host work,
 * microseconds); later ones reuse its answer. A gemm serves one thread at a time.
 * Answers cudaSuccess, or an error with `*message` naming the step that failed (a static string).
 * Tolerance against the scalar GEMM on the same BF16 inputs: kernels.h's GEMM tolerance. */
cudaError_t cuda_linear(cuda_gemm_t *gemm, cuda_linear_t const *linear, char const **message);

/* For tests, benchmarks and diagnostics. With `fuse` false, later calls never ask cuBLASLt for an
 * epilogue and always take the fallback (true when created). `last_fused`: whether the last successful
 * cuda_linear ran as cuBLASLt alone, its bias and GELU (if any) in the epilogue. `last_status`: the
 * cublasStatus_t of the last cuBLASLt call that failed (0 when none has). */
void cuda_gemm_set_fuse(cuda_gemm_t *gemm, bool fuse);
bool cuda_gemm_last_fused(cuda_gemm_t const *gemm);
int cuda_gemm_last_status(cuda_gemm_t const *gemm);

#ifdef __cplusplus
}
#endif
