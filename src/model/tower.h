/* The transformer every tower shares: weights prepared once for the active kernel path, and a forward
 * pass over a batch of items packed end to end, split over the executor's threads.
 *
 * Per block (docs/DESIGN.md), with the engine's own settings (pre-norm, RMSNorm, rotary, tanh GELU):
 *     x += out(attention(rope(qkv(norm1(x)))))
 *     x += down(gelu(up(norm2(x))))
 * then x = norm(x) with the final norm. With post_norm (BERT): x = norm1(x + out(attention(qkv(x)))),
 * x = norm2(x + down(act(up(x)))). The tower's settings (uform_transformer_info_t) choose the norm
 * (RMSNorm, or LayerNorm with biases), its place, the activation, rotary or learned positions, the
 * mask, an input norm, the final norm and the head width. Shapes: x [tokens, hidden], qkv [tokens,
 * 3 * hidden] (q, k, v each [tokens, heads * head]), mlp [tokens, mlp].
 *
 * Determinism: every GEMM is split at KERNEL_GEMM_TILE columns, rmsnorm and rope by rows, attention by
 * (head, item); each value is computed by the same code whatever the thread count. */
#pragma once

#include "common.h"
#include "kernels.h"

/* A linear layer `x W^T + b`: W packed for the kernel path, BF16 (gemm_pack) or I8 with its scales
 * (gemm_i8_pack), the bias in F32. */
typedef struct tower_linear {
    void *packed;
    float *bias; /* NULL when the layer has none */
    size_t n, k; /* out, in */
    bool i8;     /* I8 weights: the layer quantizes its activations per row as it runs */
} tower_linear_t;

/* The input of a tower over patches, prepared once with the tower (tower_prepare) for its kernels: the patch
 * layer
 * `<name>.patch` packed [hidden, inputs] with its bias, and the positions `<name>.pos` [1 + patches,
 * hidden] with the class token `<name>.cls` added to row 0. */
typedef struct tower_patches {
    tower_linear_t patch;
    size_t packed_bytes;
    float *positions;
    size_t leading; /* tokens before the patches: the class token (where there is one), then the registers */
} tower_patches_t;

/* The attention-pooling head (pooling "head", SigLIP's): a learned query `probe` attends through `qkv` and
 * `out` to every token of an item, then h += down(act(up(norm(h)))). */
typedef struct tower_head {
    float *probe; /* [hidden] */
    tower_linear_t qkv, out, up, down;
} tower_head_t;

/* A norm's weight and, for LayerNorm, its bias (else NULL), both [hidden]. */
typedef struct tower_norm {
    float *weight, *bias;
} tower_norm_t;

typedef struct tower_block {
    tower_norm_t norm1, norm2;
    tower_linear_t qkv, out, up, down;
} tower_block_t;

typedef struct tower {
    kernels_t const *kernels;    /* the path the weights were packed for */
    uform_executor_t *placement; /* where its memory lives (NULL: plain host memory) */
    size_t depth, hidden, heads, mlp, dims;
    uform_transformer_info_t settings; /* the block's settings (variant.h) */
    tower_block_t *blocks;
    tower_norm_t norm;       /* the final norm, when settings.final_norm */
    tower_norm_t input_norm; /* the norm over the inputs, when settings.input_norm */
    tower_head_t head;       /* pooling "head" */
    tower_norm_t head_norm;
    tower_linear_t proj;     /* [dims, hidden], no bias; packed NULL without settings.projection */
    tower_patches_t patches; /* image and audio towers: their input layer; zeroed for text */
    uint16_t const *embed;   /* text: text.embed BF16 [257 or vocab, hidden], in the model's memory */
    float *positions;        /* text with learned positions: [positions, hidden] */
    float *token_type;       /* text with a token type: [hidden] */
    float *relative_bias;    /* with settings.relative_buckets: [buckets, heads], every block's */
    size_t positions_count;
    size_t i8_inputs;    /* the widest k of its I8 layers (0: none), for the quantized activations */
    size_t chunk_tokens; /* tokens of a chunk of texts on a host executor (TOWER_CHUNK_BYTES) */
    size_t bytes;        /* memory it holds */
} tower_t;

/* Prepares tower `name` ("text", "image", "audio") of a loaded model from its tensors in the checkpoint
 * schema (checkpoint_schema_tower): packs every weight, BF16 or I8 as the model's `weights` and the
 * stored dtypes say (uform_weights_t), converts norms and biases to F32, and, for a patch tower, prepares
 * its input layer. Answers UFORM_OK or UFORM_OUT_OF_MEMORY (with nothing held). */
uform_status_t tower_prepare(tower_t *tower, uform_model_t const *model, char const *name,
                             uform_transformer_info_t const *info);
void tower_release(tower_t *tower);

/* Scratch a forward pass over up to `tokens` tokens needs, in bytes, on an executor of `threads` threads
 * (executor_fork_threads): where the tower's attention rounds to BF16 (kernel_attention_rounds), each
 * thread gets attention scratch of its own (kernel_attention_t.scratch); a tower with a bias by relative
 * position takes each head's table of it over the distances of the batch's longest item too. */
size_t tower_scratch_bytes(tower_t const *tower, size_t tokens, size_t threads);

/* tower_t.chunk_tokens, set by tower_prepare: the tokens of a chunk of texts on a host executor, as many
 * as keep the forward pass's rows (x and tower_scratch_bytes) within TOWER_CHUNK_BYTES, from
 * TOWER_CHUNK_TOKENS_MIN to TOWER_CHUNK_TOKENS_MAX.
 * Rows that stay in the last-level cache between layers are read back at its speed: on a 2-core AMD Zen 4
 * (1 MiB of L2 a core, a 32 MiB L3) chunks of 512 tokens ran all-MiniLM-L6-v2 (hidden 384) 8% faster than
 * chunks of 2,048, and a hidden-768 tower 4% faster; 256 to 512 tokens were alike, 768 and more slower. */
#define TOWER_CHUNK_BYTES      (8u << 20)
#define TOWER_CHUNK_TOKENS_MIN 256
#define TOWER_CHUNK_TOKENS_MAX 2048

typedef struct tower_batch {
    size_t tokens; /* rows of x */
    size_t items;
    size_t const *offsets; /* items + 1 token offsets into x; positions restart at 0 for each item */
    float *x;              /* [tokens, hidden]: the input embeddings; the final-normed states on return */
    void *scratch;         /* tower_scratch_bytes(tokens, threads), 64-byte aligned */
    size_t threads;        /* the threads tower_scratch_bytes was given */
} tower_batch_t;

/* Runs the input norm, every block and the final norm over the batch (as the tower's settings have
 * them: the mask, rotary positions), on the executor's threads. */
void tower_forward(tower_t const *tower, uform_executor_t *executor, tower_batch_t const *batch);

/* y[m, n_out] = x[m, k] . W^T (+ bias) for one prepared linear layer, over the executor's threads,
 * using only its first `n_out` output columns (n_out <= layer.n): matryoshka projections. */
void tower_linear(tower_t const *tower, uform_executor_t *executor, tower_linear_t const *layer,
                  float const *x, size_t x_stride, size_t m, size_t n_out, float *y, size_t y_stride);

/* The pooled state of `items` items packed in x [tokens, hidden] (item i at rows offsets[i] ..
 * offsets[i + 1] - 1, at least one each) into pooled [items, hidden], by the tower's pooling: the first or
 * last position, the mean, the end-of-text token (the first position of the largest of `ids`, the tokens'
 * ids by the same offsets), or the attention-pooling head (which needs `scratch` of
 * tower_head_scratch_bytes). */
void tower_pool(tower_t const *tower, uform_executor_t *executor, float const *x, size_t const *offsets,
                size_t items, uint32_t const *ids, void *scratch, float *pooled);
size_t tower_head_scratch_bytes(tower_t const *tower, size_t tokens, size_t items);

/* y [m, n_out] = the projection of x [m, hidden] (stride x_stride), its first n_out outputs (then their
 * tanh with settings.projection_tanh); for a tower without one (dims == hidden), x's first n_out columns as
 * they are. */
void tower_project(tower_t const *tower, uform_executor_t *executor, float const *x, size_t x_stride,
                   size_t m, size_t n_out, float *y, size_t y_stride);

/* ---- Patch towers (image, audio) ---------------------------------------------------------------- */

void tower_patches_release(tower_patches_t *patches, uform_executor_t *executor);

/* One item's tokens [leading + count, hidden] at x: the class token (where the tower has one), then patch
 * p's embedding (row p of `embedded` [count, hidden]) plus its position. */
void tower_patches_tokens(tower_patches_t const *patches, size_t hidden, float const *embedded, size_t count,
                          float *x);

/* A chunk's scratch on a patch tower, for `images` images of `rows` patch rows in all (their tokens:
 * rows + images, a class token each): the tower's; x [tokens, hidden]; patch rows [rows, inputs]; rows
 * [rows, hidden] (patch embeddings, then the states to project); their projections [rows, dims]; pooled
 * [pooled] floats; token offsets [images + 1] and the item of each image kept [images]. */
typedef struct patch_scratch {
    void *tower;
    size_t threads; /* the threads the tower's scratch is for (tower_scratch_bytes) */
    float *x, *patches, *rows, *projected, *pooled;
    size_t *offsets, *items;
    void *head; /* the pooling head's (tower_pool) */
} patch_scratch_t;

/* Carves `scratch` from the executor's scratch (executor_scratch). false when out of memory. */
bool tower_patches_scratch(tower_t const *tower, uform_executor_t *executor, size_t images, size_t rows,
                           size_t inputs, size_t pooled, patch_scratch_t *scratch);

/* Runs the tower over `items` items of patch tokens in scratch->x [tokens, hidden], item q from
 * scratch->offsets[q]: attention within each item, both ways, without rotary. No item: nothing runs. */
void tower_patches_forward(tower_t const *tower, uform_executor_t *executor, patch_scratch_t const *scratch,
                           size_t tokens, size_t items);

/* The pooled state of each of the `items` items of a patch tower's forward (scratch->x, by scratch->offsets)
 * into scratch->rows [items, hidden], by the tower's pooling: the class token's, the mean of every token's,
 * or the attention-pooling head's. */
void tower_patches_pool(tower_t const *tower, uform_executor_t *executor, patch_scratch_t const *scratch,
                        size_t tokens, size_t items);
