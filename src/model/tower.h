/* The transformer every tower shares: weights prepared once for the active kernel path, and a forward
 * pass over a batch of items packed end to end, split over the executor's threads.
 *
 * Per block (docs/DESIGN.md, pre-norm):  x += out(attention(rope(qkv(rms1(x)))))
 *                                   x += down(gelu(up(rms2(x))))
 * then x = rms(x) with the final norm. Shapes: x [tokens, hidden], qkv [tokens, 3 * hidden] (q, k, v
 * each [tokens, heads * 64]), mlp [tokens, mlp].
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
} tower_patches_t;

typedef struct tower_block {
    float *norm1, *norm2; /* [hidden] */
    tower_linear_t qkv, out, up, down;
} tower_block_t;

typedef struct tower {
    kernels_t const *kernels;    /* the path the weights were packed for */
    uform_executor_t *placement; /* where its memory lives (NULL: plain host memory) */
    size_t depth, hidden, heads, mlp, dims;
    tower_block_t *blocks;
    float *norm;             /* [hidden] */
    tower_linear_t proj;     /* [dims, hidden], no bias */
    tower_patches_t patches; /* image and audio towers: their input layer; zeroed for text */
    uint16_t const *embed;   /* text: the byte table text.embed BF16 [257, hidden], in the model's memory */
    size_t i8_inputs;        /* the widest k of its I8 layers (0: none), for the quantized activations */
    size_t bytes;            /* memory it holds */
} tower_t;

/* Prepares tower `name` ("text", "image", "audio") of a loaded model from its tensors in the checkpoint
 * schema (checkpoint_schema_tower): packs every weight, BF16 or I8 as the model's `weights` and the
 * stored dtypes say (uform_weights_t), converts norms and biases to F32, and, for a patch tower, prepares
 * its input layer. Answers UFORM_OK or UFORM_OUT_OF_MEMORY (with nothing held). */
uform_status_t tower_prepare(tower_t *tower, uform_model_t const *model, char const *name,
                             uform_transformer_info_t const *info);
void tower_release(tower_t *tower);

/* Scratch a forward pass over up to `tokens` tokens needs, in bytes. */
size_t tower_scratch_bytes(tower_t const *tower, size_t tokens);

typedef struct tower_batch {
    size_t tokens; /* rows of x */
    size_t items;
    size_t const *offsets; /* items + 1 token offsets into x; positions restart at 0 for each item */
    bool causal, rotary;
    float *x;      /* [tokens, hidden]: the input embeddings; the final-normed states on return */
    void *scratch; /* tower_scratch_bytes(tokens), 64-byte aligned */
} tower_batch_t;

/* Runs every block and the final norm over the batch, on the executor's threads. */
void tower_forward(tower_t const *tower, uform_executor_t *executor, tower_batch_t const *batch);

/* y[m, n_out] = x[m, k] . W^T (+ bias) for one prepared linear layer, over the executor's threads,
 * using only its first `n_out` output columns (n_out <= layer.n): matryoshka projections. */
void tower_linear(tower_t const *tower, uform_executor_t *executor, tower_linear_t const *layer,
                  float const *x, size_t x_stride, size_t m, size_t n_out, float *y, size_t y_stride);

/* ---- Patch towers (image, audio) ---------------------------------------------------------------- */

void tower_patches_release(tower_patches_t *patches, uform_executor_t *executor);

/* One item's tokens [1 + count, hidden] at x: the class token, then patch p's embedding (row p of
 * `embedded` [count, hidden]) plus its position. */
void tower_patches_tokens(tower_patches_t const *patches, size_t hidden, float const *embedded, size_t count,
                          float *x);

/* A chunk's scratch on a patch tower, for `images` images of `rows` patch rows in all (their tokens:
 * rows + images, a class token each): the tower's; x [tokens, hidden]; patch rows [rows, inputs]; rows
 * [rows, hidden] (patch embeddings, then the states to project); their projections [rows, dims]; pooled
 * [pooled] floats; token offsets [images + 1] and the item of each image kept [images]. */
typedef struct patch_scratch {
    void *tower;
    float *x, *patches, *rows, *projected, *pooled;
    size_t *offsets, *items;
} patch_scratch_t;

/* Carves `scratch` from the executor's scratch (executor_scratch). false when out of memory. */
bool tower_patches_scratch(tower_t const *tower, uform_executor_t *executor, size_t images, size_t rows,
                           size_t inputs, size_t pooled, patch_scratch_t *scratch);

/* Runs the tower over `items` items of patch tokens in scratch->x [tokens, hidden], item q from
 * scratch->offsets[q]: attention within each item, both ways, without rotary. No item: nothing runs. */
void tower_patches_forward(tower_t const *tower, uform_executor_t *executor, patch_scratch_t const *scratch,
                           size_t tokens, size_t items);
