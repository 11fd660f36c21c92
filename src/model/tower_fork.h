/* The work of a tower's passes split over an executor's threads, shared by the inference forward
 * (tower.c) and the training forward and backward (src/train/train_tower.c):
 *   GEMMs           by KERNEL_GEMM_TILE columns (thread_columns), packed BF16, I8 or F32 weights (the I8
 *                   GEMM's activations quantized first, by rows);
 *   row kernels     by rows (thread_share): rmsnorm, rope and its transpose, gelu and its derivative,
 *                   residual adds;
 *   attention       by (head, item) pairs, each pair computed whole, forward or backward.
 * Each fork splits by the threads it runs on (executor_fork_threads), and every value is computed by the
 * same code whatever the thread count. */
#pragma once

#include "kernels.h"

/* A batch as the forks see it: the tower's widths and the items packed end to end. */
typedef struct tower_fork {
    kernels_t const *kernels;
    size_t hidden, heads, mlp;
    size_t tokens, items;
    size_t const *offsets;     /* items + 1 token offsets */
    uint32_t const *positions; /* [tokens]: each token's position within its item (rope) */
    bool causal;
    size_t head;    /* each head's width; 0: KERNEL_HEAD */
    bool f32_attention; /* kernels->attention_f32 (the training forward, whose backward pass recomputes the
                           attention in F32); else kernels->attention */
    float norm_eps; /* LayerNorm's epsilon (tower_fork_norm) */
    /* The forward attention's scratch (kernel_attention_t.scratch): attention_scratch_bytes for each of
     * the first attention_threads threads of a fork, one after the other; NULL for none. */
    void *attention_scratch;
    size_t attention_scratch_bytes, attention_threads;
    /* The bias by relative position (kernel_attention_t.bias): head h's at relative + h * relative_stride,
     * at distance 0; NULL for none. Inference only: the backward pass takes none. */
    float const *relative;
    size_t relative_stride;
} tower_fork_t;

/* Fills positions[tokens] from the item offsets: each item's tokens count from 0. */
void tower_fork_positions(size_t const *offsets, size_t items, uint32_t *positions);

/* A whole GEMM (kernels->gemm over packed weights; kernels->sgemm over F32 ones, nothing when m or n
 * is 0), its columns split between the threads. */
void tower_fork_gemm(kernels_t const *kernels, uform_executor_t *executor, kernel_gemm_t const *gemm);

/* Activations quantized per row for an I8 GEMM (kernels->quantize_rows): rows [m, k], scales [m], zeros [m].
 */
typedef struct tower_quantized {
    uint8_t *rows;
    float *scales;
    int32_t *zeros;
} tower_quantized_t;

/* The I8 GEMM of `gemm` (weights packed by gemm_i8_pack) over its F32 rows x [m, k] at x_stride: the rows
 * quantized into `quantized` first, split by rows, then kernels->gemm_i8 over them, split by columns. */
void tower_fork_gemm_i8(kernels_t const *kernels, uform_executor_t *executor, kernel_gemm_t const *gemm,
                        tower_quantized_t const *quantized);
void tower_fork_sgemm(kernels_t const *kernels, uform_executor_t *executor, kernel_sgemm_t const *sgemm);

typedef enum tower_rows {
    TOWER_ROWS_RMSNORM,       /* to = rms(from) * weight, [tokens, hidden]; to may be from */
    TOWER_ROWS_ROPE,          /* rotates q and k of `to` [tokens, 3 hidden] at their positions */
    TOWER_ROWS_ROPE_BACKWARD, /* the transpose, on dq and dk of `to` */
    TOWER_ROWS_GELU,          /* to = gelu(from), [tokens, mlp] */
    TOWER_ROWS_GELU_BACKWARD, /* to = to * gelu'(from), [tokens, mlp] */
    TOWER_ROWS_ADD,           /* to += from, [tokens, hidden] */
} tower_rows_t;

/* One row kernel over every token of the batch. `from` and `weight` unused are NULL. */
void tower_fork_rows(tower_fork_t const *fork, uform_executor_t *executor, tower_rows_t kind,
                     float const *from, float const *weight, float *to);

/* to = LayerNorm(from) * weight + bias (bias may be NULL) with fork->norm_eps, [tokens, hidden]; to may be
 * from. */
void tower_fork_norm(tower_fork_t const *fork, uform_executor_t *executor, float const *from,
                     float const *weight, float const *bias, float *to);

/* out[tokens, hidden] = attention(q, k, v) of qkv [tokens, 3 hidden], within each item, heads of
 * fork->head values, scale 1/sqrt(head). The backward pass takes heads of KERNEL_HEAD only. */
void tower_fork_attention(tower_fork_t const *fork, uform_executor_t *executor, float const *qkv, float *out);

/* The gradients of tower_fork_attention: d_qkv [tokens, 3 hidden] from its input qkv, its output att and
 * the gradient d_att [tokens, hidden] with respect to att. */
void tower_fork_attention_backward(tower_fork_t const *fork, uform_executor_t *executor, float const *qkv,
                                   float const *att, float const *d_att, float *d_qkv);
