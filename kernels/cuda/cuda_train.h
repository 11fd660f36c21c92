/* The CUDA kernels of training, callable from C: the backward passes of the towers' operations, the loss
 * of docs/DESIGN.md, the gradient norm and the fused AdamW update (kernels/cuda/backward.cu, loss.cu,
 * adamw.cu, attention.cu; linear layers' backward products in linear.cu, beside cuda_linear).
 *
 * Conventions are cuda_kernels.h's: every function enqueues its work on `stream` (or the gemm's) and
 * answers the launch's cudaError_t at once; pointers are device memory; BF16 values are uint16_t; shapes
 * are row-major with strides in elements. Every kernel is deterministic: each output value is computed by
 * one thread in an order fixed by the shapes alone, with no atomic operation, so the same inputs give the
 * same bits on every run. Sums that reduce many values (norms, loss sums, softmax denominators) are
 * accumulated in double.
 *
 * The CPU scalar path (kernels/kernels.h) and the RAM trainer (src/train) define the numbers;
 * tests/vram/test_cuda.c checks each function against them within the tolerance written beside it. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "cuda_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CUDA_TRAIN_ROW_BLOCK 64   /* rows per partial sum of an RMSNorm weight gradient */
#define CUDA_TRAIN_SUM_ROWS  256  /* rows per partial sum of cuda_column_sums */
#define CUDA_TRAIN_CHUNK     4096 /* scalars per chunk of the optimizer: norms and AdamW per chunk */
#define CUDA_TRAIN_PREFIXES  16   /* matryoshka widths at most */

/* ---- Elementwise ---------------------------------------------------------------------------------- */

/* g = gelu_tanh(u) over n BF16 values (kernels/gelu.h's function in F32, rounded to BF16). */
cudaError_t cuda_gelu(uint16_t *g, uint16_t const *u, size_t n, cudaStream_t stream);

/* du = dg * gelu_tanh'(u) over n values, BF16 (the derivative in double as kernels/gelu.h computes it).
 * Tolerance: one BF16 rounding of the scalar gelu_backward on the same inputs. */
cudaError_t cuda_gelu_backward(uint16_t *du, uint16_t const *dg, uint16_t const *u, size_t n,
                               cudaStream_t stream);

/* dst[r, :] += src[r, :] for `rows` rows of `columns` F32 (strides in elements). Exact in F32. */
cudaError_t cuda_add(float *dst, size_t dst_stride, float const *src, size_t src_stride, size_t rows,
                     size_t columns, cudaStream_t stream);

/* dst[rows[r], :] += src[r, :] for `count` rows of `columns` F32; every index in `rows` is distinct and
 * in range (the caller's), so each row of dst is written by one thread. */
cudaError_t cuda_scatter_add_rows(float *dst, size_t dst_stride, float const *src, size_t src_stride,
                                  int32_t const *rows, size_t count, size_t columns, cudaStream_t stream);

/* ---- Reductions over rows ---------------------------------------------------------------------------- */

/* Scratch floats cuda_column_sums needs for `rows` rows of `columns`. */
size_t cuda_column_sums_scratch(size_t rows, size_t columns);

/* out[c] += sum over the rows of x[r, c], for `rows` rows of `columns` (F32 x, or BF16 when x_bf16):
 * each block of CUDA_TRAIN_SUM_ROWS rows summed in row order in F32 into `scratch`, then the blocks in
 * order. A linear layer's bias gradient. Tolerance 1e-5 relative to sum |x|. */
cudaError_t cuda_column_sums(float *out, void const *x, bool x_bf16, size_t x_stride, size_t rows,
                             size_t columns, float *scratch, cudaStream_t stream);

/* The backward pass of RMSNorm (kernels.h's rmsnorm_backward, the same formula): for y = x / r * weight,
 * dx = weight * dy / r - x * sum(weight * dy * x) / (n r^3), written (or added to dx when accumulate),
 * and the weight's gradient: d_weight[c] += sum over rows of dy[c] x[c] / r, summed per block of
 * CUDA_TRAIN_ROW_BLOCK rows in `partial` [ceil(rows / CUDA_TRAIN_ROW_BLOCK), n], then over the blocks in
 * order (as the RAM trainer sums it). dx may be dy (not when accumulating). Tolerance: kernels.h's. */
cudaError_t cuda_rmsnorm_backward(float *dx, bool accumulate, float *d_weight, float *partial,
                                  float const *dy, float const *x, float const *weight, size_t rows, size_t n,
                                  float eps, cudaStream_t stream);

/* ---- Gradients of the towers' inputs ------------------------------------------------------------- */

/* The embedding table's gradient: table_grad[b, :] += sum of dx[t, :] over the tokens t of byte b, in
 * ascending t: order[starts[b] .. starts[b + 1]) lists them (int32; starts has table_rows + 1 entries).
 * One block per row of the table, no atomics. Exact sums in F32 in the listed order. */
cudaError_t cuda_embed_backward(float *table_grad, float const *dx, int32_t const *starts,
                                int32_t const *order, size_t table_rows, size_t hidden, cudaStream_t stream);

/* The backward pass of cuda_assemble_tokens over d_x [tokens, hidden] (F32, the rows of x it wrote):
 * d_patches[offsets[i] + j] = d_x[offsets[i] + i + 1 + j]; d_pos[t] += sum over the items i with at
 * least t patches (t = 0: every item) of d_x[offsets[i] + i + t], items in order; d_cls += the same sum
 * of t = 0. One block per position and one per patch row, no atomics. */
cudaError_t cuda_assemble_tokens_backward(float *d_patches, float *d_cls, float *d_pos, float const *d_x,
                                          int32_t const *offsets, size_t items, size_t max_patches,
                                          size_t hidden, cudaStream_t stream);

/* ---- Attention ------------------------------------------------------------------------------------- */

/* cuda_attention without a bias, also writing lse [tokens, heads] (F32): per query row and head, the log2 of
 * its softmax denominator in the log2-scaled units the kernel works in (max + log2(sum), scores scaled by
 * scale * log2(e)), which the backward pass recomputes the probabilities from. */
cudaError_t cuda_attention_lse(uint16_t *out, float *lse, uint16_t const *qkv, int32_t const *offsets,
                               size_t items, size_t heads, size_t max_length, bool causal, bool rotary,
                               float scale, cudaStream_t stream);

/* The backward pass of cuda_attention_lse, FlashAttention-2 style: with the forward's qkv, out and lse
 * and the output's gradient d_out (BF16 [tokens, heads * 64]), writes d_qkv (BF16 [tokens, 3 * heads *
 * 64]: dq, dk, dv in qkv's columns) with the rotary rotation undone for dq and dk (the gradient with
 * respect to qkv as the QKV projection wrote it), over the `tokens` rows of the items. First d_rows
 * [tokens, heads] (F32 scratch) = rowsum(dO *
 * O); then one block per (key tile, item, head) accumulates dK and dV over the query tiles, and one block
 * per (query tile, item, head) accumulates dQ over the key tiles: every sum in a fixed order, no atomics.
 * Probabilities are recomputed in F32 as P = exp2(scaled score - lse) from q and k rotated and rounded to
 * BF16 as the forward pass rounds them.
 * Tolerance against the scalar attention_backward (then rope_backward) on the same BF16 inputs: 3e-2
 * relative to the largest |d| of the item and head. */
cudaError_t cuda_attention_backward(uint16_t *d_qkv, float *d_rows, uint16_t const *qkv, uint16_t const *out,
                                    uint16_t const *d_out, float const *lse, int32_t const *offsets,
                                    size_t items, size_t tokens, size_t heads, size_t max_length, bool causal,
                                    bool rotary, float scale, cudaStream_t stream);

/* ---- Linear layers' backward products (cuBLASLt) ------------------------------------------------------ */

/* The gradients of y = x W^T + b (W [n, k]) given dy [m, n]: BF16 inputs, F32 accumulation. */
typedef struct cuda_linear_backward {
    size_t m, n, k;
    uint16_t const *x; /* BF16 [m, k], row stride x_stride: the forward's input */
    size_t x_stride;
    uint16_t const *w;  /* BF16 [n, k], contiguous */
    uint16_t const *dy; /* BF16 [m, n], row stride dy_stride */
    size_t dy_stride;
    float *dw; /* F32 [n, k] += dy^T x (contiguous); NULL: not computed */
    void *dx;  /* [m, k] = dy W, row stride dx_stride, F32 or BF16 (dx_bf16); NULL: not computed */
    size_t dx_stride;
    bool dx_bf16;
    bool dx_accumulate; /* F32 dx only: dx += dy W */
} cuda_linear_backward_t;

/* Enqueues dw then dx on the gemm's stream: cuBLASLt's default epilogue, the algorithm chosen once per
 * shape as cuda_linear chooses it (the bias gradient is cuda_column_sums of dy). cudaSuccess, or an error
 * with *message naming the step that failed. Tolerance against the scalar F32 GEMM on the same BF16
 * inputs: kernels.h's GEMM tolerance. */
cudaError_t cuda_linear_backward(cuda_gemm_t *gemm, cuda_linear_backward_t const *linear,
                                 char const **message);

/* ---- The loss -------------------------------------------------------------------------------------- */

/* The next-byte loss over `rows` rows of logits [rows, 256] (F32, from states . embed[0:256]^T): per row
 * with targets[r] >= 0, loss[r] = log(sum exp(l - max)) + max - l[target] (double), and the row becomes its
 * gradient scale * (softmax - one_hot(target)) in F32 and in d_bf16 [rows, 256]; a row whose target is -1
 * (an item's last position) gets loss 0 and a zero gradient. As the RAM trainer computes it. */
cudaError_t cuda_cross_entropy(float *logits, uint16_t *d_bf16, double *loss, int32_t const *targets,
                               size_t rows, double scale, cudaStream_t stream);

/* What the contrastive loss needs to know of a batch. */
typedef struct cuda_contrastive {
    size_t dims;
    size_t prefixes;                       /* matryoshka widths */
    uint32_t widths[CUDA_TRAIN_PREFIXES];  /* ascending, each at most dims */
    size_t global, first, local;           /* items over the mesh; this process's [first, first + local) */
    float const *logit_scale, *logit_bias; /* device [1] each: t = exp(scale), b */
    float *d_logit_scale, *d_logit_bias;   /* device [1] each, added to */
} cuda_contrastive_t;

/* The embeddings of a process's items from their projected units (the rows the towers projected:
 * projected [units, dims] F32): item i owns units [first[i], first[i] + count[i]); one unit's embedding
 * is its row normalized, several (a clip's frames) give the normalized mean of their normalized rows.
 * Writes unit [units, dims] (each row normalized, double), unit_norms [units], e [items, dims] (double)
 * and item_norms [items] (a clip's mean's norm before its normalization; unused otherwise). */
cudaError_t cuda_embeddings(double *e, double *item_norms, double *unit, double *unit_norms,
                            float const *projected, int32_t const *first, int32_t const *count, size_t items,
                            size_t dims, cudaStream_t stream);

/* The contrastive loss of docs/DESIGN.md over the mesh's items (e [global, dims], every process's
 * embeddings in rank order): this process's items' share (pairs (i, j), i one of its items), its gradient
 * with respect to their embeddings de [local, dims] (double, written), the logit parameters' gradients
 * (added), and the share's value. related [local, local]: nonzero where two of the process's items are
 * related. One block per item of this process computes its pairs' terms, each thread its own pairs in
 * order, then fixed-tree sums. Scratch (double): x [prefixes, global, dims] and norms [prefixes, global]
 * (the prefixes normalized), rows [local, global + dims], losses [3, local]. The share, d scale and d bias
 * are summed over the items in order into *share (device), then added to the logit gradients (F32).
 * Tolerance against the RAM trainer's double loss: 1e-9 relative. */
cudaError_t cuda_contrastive(cuda_contrastive_t const *loss, double const *e, uint8_t const *related,
                             double *de, double *share, double *x, double *norms, double *rows,
                             double *losses, cudaStream_t stream);

/* The backward pass of cuda_embeddings: from de [items, dims] (overwritten: a clip's gradient per frame) to
 * d_projected [units, dims] (F32). */
cudaError_t cuda_embeddings_backward(float *d_projected, double *de, double const *e,
                                     double const *item_norms, double const *unit, double const *unit_norms,
                                     int32_t const *first, int32_t const *count, size_t items, size_t dims,
                                     cudaStream_t stream);

/* out[0] = the sum of values[0 .. n) in order (double, one thread) divided by `divisor` (0 when divisor
 * is 0): the next-byte loss's share, its row losses over the positions the whole batch predicts. */
cudaError_t cuda_sum_doubles(double *out, double const *values, size_t n, double divisor,
                             cudaStream_t stream);

/* loss[0] = shares[0] + lm_weight * shares[1]: the step's loss once the shares (contrastive, next-byte)
 * are summed over the mesh. */
cudaError_t cuda_total_loss(double *loss, double const *shares, double lm_weight, cudaStream_t stream);

/* ---- The optimizer --------------------------------------------------------------------------------- */

/* The squares of a flat gradient of `chunks` chunks of CUDA_TRAIN_CHUNK scalars, summed in double: per
 * chunk in a fixed tree into chunk_sums [chunks], then the chunks in a fixed tree into norm_squared[0].
 * Never read by the host before the update: the update reads it on the device. */
cudaError_t cuda_gradient_norm(double *norm_squared, double *chunk_sums, float const *grad, size_t chunks,
                               cudaStream_t stream);

/* One AdamW step of the RAM trainer's formula (src/train/train_params.c), per element in double from the
 * stored F32 values, over `chunks` chunks of CUDA_TRAIN_CHUNK scalars, chunk c decayed when decay[c]:
 * the clip factor min(1, clip_norm / norm) (1 when clip_norm is 0) from norm_squared on the device. When
 * the loss or the norm is not finite nothing is written but skipped[0] = 1 (else 0): the step is skipped
 * without the host reading either first. value_bf16 gets each new value rounded to nearest even. */
typedef struct cuda_adamw {
    double learning_rate, decay; /* decay: 1 - learning_rate * weight_decay */
    double beta1, beta2, correction1, correction2, epsilon, clip_norm;
} cuda_adamw_t;

cudaError_t cuda_adamw_update(float *value, uint16_t *value_bf16, float *m, float *v, float const *grad,
                              uint8_t const *decay, size_t chunks, double const *norm_squared,
                              double const *loss, uint32_t *skipped, cuda_adamw_t const *adamw,
                              cudaStream_t stream);

#ifdef __cplusplus
}
#endif
