/* Training on RAM executors (docs/DESIGN.md, "Training"): F32 master weights, their gradients and AdamW
 * moments (train_params.c); the towers' forward passes keeping what their backward passes need, and
 * those backward passes (train_tower.c); the loss and one step over a batch of items of any modality
 * (train_step.c).
 *
 * Everything is F32, weights included: the trainer's forward pass is not the inference path (which
 * packs BF16 weights for its GEMMs) but the same model computed without rounding the weights, so that
 * gradients agree with an F64 autograd reference to F32 rounding (tests/reference/train_reference.py).
 * Work is split over the executor's threads so that every value is computed by the same code whatever
 * the thread count: a resumed run repeats an uninterrupted one bit for bit on the same kernel path. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "checkpoint.h"
#include "common.h"
#include "kernels.h"

/* ---- Parameters ---------------------------------------------------------------------------------- */

#define TRAIN_NAME_MAX 80

typedef struct train_tensor {
    char name[TRAIN_NAME_MAX]; /* the checkpoint's name, e.g. "text.blocks.0.attn.qkv.weight" */
    size_t rank;               /* 1 or 2 */
    size_t shape[2];           /* shape[1] is 1 for rank 1 */
    size_t count;              /* scalars */
    float *value;              /* the F32 master weights */
    float *grad;               /* the current step's loss gradient, accumulated by the backward passes */
    float *m, *v;              /* AdamW's first and second moments */
    bool decay;                /* weight decay applies: rank 2 and named "*.weight" */
} train_tensor_t;

typedef struct train_optimizer {
    double learning_rate, weight_decay, beta1, beta2, epsilon, clip_norm;
    size_t warmup_steps, total_steps;
} train_optimizer_t;

typedef struct train_params {
    uform_model_info_t info; /* towers and widths, as a checkpoint's metadata states them */
    train_tensor_t *tensors;
    size_t count;
    size_t step; /* optimizer steps taken */
    train_optimizer_t optimizer;
} train_params_t;

/* The model a config describes when it starts from scratch (sizes 0 take the defaults). Answers
 * UFORM_OK or UFORM_INVALID_ARGUMENT (hidden not a multiple of 64, dims odd or 0 after defaults, no
 * tower, an image size its patch does not divide, ...), with the reason in *message. */
uform_status_t train_info_from_config(uform_trainer_config_t const *config, uform_model_info_t *info,
                                      char const **message);

/* Every tensor of `info`'s towers (the names and shapes of docs/DESIGN.md's format 4, plus logit.scale and
 * logit.bias), seeded: N(0, 0.02) weights and embeddings, unit norms, zero biases, logit.scale log 10
 * and logit.bias -10; zero gradients and moments, step 0. UFORM_OK or UFORM_OUT_OF_MEMORY. */
uform_status_t train_params_init(train_params_t *params, uform_model_info_t const *info, uint64_t seed);

/* The weights of a format-4 checkpoint at `path` (BF16 widened), step 0 and zero moments; then, when
 * the optimizer state train_params_save wrote beside it exists and belongs to this checkpoint, the F32
 * master weights, moments and step it holds. A checkpoint without logit.scale/logit.bias gets the
 * seeded defaults. First, what a save to `path` that was interrupted left is settled, as the next save
 * would (train_params.c's head): its new pair taken when its state was in place, else removed.
 * UFORM_OK, UFORM_IO (with the file and the system's reason: "cannot rename into PATH: Permission
 * denied"), UFORM_FORMAT (not a checkpoint; a state that belongs to another checkpoint, with the
 * reason), UFORM_OUT_OF_MEMORY; the reason in *message, which may point into `reason`
 * (UFORM_ERROR_MESSAGE_SIZE bytes, the caller's, read before it is reused). */
uform_status_t train_params_load(train_params_t *params, char const *path, char *reason,
                                 char const **message);

void train_params_free(train_params_t *params);

/* The tensor named `name`, or NULL. */
train_tensor_t *train_params_find(train_params_t const *params, char const *name);

/* The model's own tensor of part `part` (CHECKPOINT_PART_LOGIT_SCALE or CHECKPOINT_PART_LOGIT_BIAS), by
 * the name the checkpoint schema gives it; NULL when absent. */
train_tensor_t *train_params_logit(train_params_t const *params, checkpoint_part_t part);

/* Sets every gradient to zero. */
void train_params_zero_grad(train_params_t *params);

/* The learning rate of step `step` (1-based): linear warmup, then cosine decay to 0. */
double train_learning_rate(train_optimizer_t const *optimizer, size_t step);

/* One optimizer step over the gradients: the global L2 norm of every gradient (computed in double,
 * tensors in order), clipping when it exceeds clip_norm, then AdamW on every tensor (decoupled decay
 * first, bias-corrected moments, epsilon outside the square root), split over the executor's threads by
 * fixed ranges of scalars. Increments `step`. Answers the unclipped norm; *learning_rate gets the rate
 * used. A norm that is not finite (a gradient overflowed or is NaN) is answered at once: nothing is
 * updated, `step` stays and *learning_rate is not written. */
double train_params_update(train_params_t *params, uform_executor_t *executor, double *learning_rate);

/* Writes the BF16 inference checkpoint at `path` and the optimizer state at
 * train_state_path(path) (F32 master weights, moments, step, the optimizer settings, and a fingerprint
 * of the checkpoint it belongs to): both written whole and synced under staging names before either
 * replaces its file, in the order of train_params.c's head, so that a failure or a kill at any point
 * leaves on disk the previous pair or the new one, each consistent, and train_params_load takes it.
 * Stale temporaries of killed saves to `path` are removed. UFORM_OK, UFORM_IO (with the file and the
 * system's reason: "cannot write PATH: No space left on device"), UFORM_OUT_OF_MEMORY,
 * UFORM_INVALID_ARGUMENT; the reason in *message, which may point into `reason` as for
 * train_params_load. */
uform_status_t train_params_save(train_params_t const *params, char const *path, char *reason,
                                 char const **message);

/* `path` + ".optimizer" into `out` of `capacity` bytes; false when it does not fit. */
bool train_state_path(char const *path, char *out, size_t capacity);

/* ---- Buffers (train_tower.c) ----------------------------------------------------------------------- */

/* Frees each of the `count` buffers (NULL ones are skipped by free): the trainer's structs list their
 * buffers once, in a table, to release them. */
void train_free_each(void *const *buffers, size_t count);

/* ---- Towers (train_tower.c) ------------------------------------------------------------------------ */

/* A block's parameters, by name or by checkpoint part: parts[CHECKPOINT_PART_NORM1 ..
 * CHECKPOINT_PART_DOWN_BIAS] are the named fields in that order. */
typedef union train_block {
    struct {
        train_tensor_t *norm1, *norm2, *qkv_w, *qkv_b, *out_w, *out_b, *up_w, *up_b, *down_w, *down_b;
    };
    train_tensor_t *parts[CHECKPOINT_PART_DOWN_BIAS + 1];
} train_block_t;

_Static_assert(offsetof(train_block_t, down_b) == CHECKPOINT_PART_DOWN_BIAS * sizeof(train_tensor_t *) &&
                   sizeof(train_block_t) == sizeof(((train_block_t *)0)->parts),
               "train_block_t's fields follow the checkpoint's block parts");

/* A tower as the trainer sees it: its transformer, projection and input, bound to the parameters of its
 * tensors in the checkpoint schema (checkpoint_schema_tower). */
typedef struct train_tower {
    kernels_t const *kernels;
    size_t depth, hidden, heads, mlp, dims;
    train_block_t *blocks;
    train_tensor_t *norm, *proj;
    train_tensor_t *embed;      /* text: text.embed [257, hidden] */
    train_tensor_t *patches[4]; /* image and audio: patch.weight, patch.bias, cls, pos */
} train_tower_t;

/* Binds tower `name` ("text", "image", "audio") of `params`. false when a tensor is missing or out of
 * memory (nothing held). */
bool train_tower_bind(train_tower_t *tower, train_params_t const *params, char const *name,
                      uform_transformer_info_t const *info);
void train_tower_release(train_tower_t *tower);

/* What a forward pass over a batch keeps for its backward pass, and the backward pass's own buffers;
 * grown as batches need, reused across steps. */
typedef struct train_pass {
    size_t tokens, items, capacity; /* capacity: tokens the buffers hold */
    size_t const *offsets;          /* items + 1 token offsets, borrowed for the pass */
    bool causal, rotary;
    uint32_t *positions;                    /* [tokens] */
    float *saved;                           /* per block: x_in, h1, qkv, att, x_mid, h2, u, g; then x_final */
    float *states;                          /* [tokens, hidden]: the final-normed states */
    float *dx, *dh, *dqkv, *dmlp, *partial; /* backward buffers */
    size_t partial_rows;
} train_pass_t;

void train_pass_release(train_pass_t *pass);

/* Runs the tower's transformer over `tokens` rows of input x [tokens, hidden] (copied in), items at
 * `offsets`. The final-normed states land in pass->states. false when out of memory. */
bool train_tower_forward(train_tower_t const *tower, uform_executor_t *executor, train_pass_t *pass,
                         float const *x, size_t tokens, size_t const *offsets, size_t items, bool causal,
                         bool rotary);

/* The backward pass of the last forward: given d_states [tokens, hidden] (the loss's gradient with
 * respect to pass->states; overwritten), accumulates every transformer parameter's gradient and writes the
 * gradient with respect to the input x into d_x [tokens, hidden]. */
void train_tower_backward(train_tower_t const *tower, uform_executor_t *executor, train_pass_t *pass,
                          float *d_states, float *d_x);

/* y[m, n] = x[m, k] W^T (+ b) with W a [n, k] parameter (only its first n rows), over the threads. */
void train_linear(kernels_t const *kernels, uform_executor_t *executor, float const *x, size_t m,
                  train_tensor_t const *weight, size_t n, train_tensor_t const *bias, float *y);

/* The gradients of train_linear: W.grad[:n] += dy^T x, b.grad += colsum(dy) (when bias), and, when
 * dx is not NULL, dx[m, k] = dy W[:n] (overwritten, or added when accumulate_dx). */
void train_linear_backward(kernels_t const *kernels, uform_executor_t *executor, float const *x, size_t m,
                           train_tensor_t *weight, size_t n, train_tensor_t *bias, float const *dy, float *dx,
                           bool accumulate_dx);
