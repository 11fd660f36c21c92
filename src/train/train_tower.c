/* The training forward pass of a tower's transformer, keeping what its backward pass needs, and that
 * backward pass (src/train/train.h), bound to the tensors of the checkpoint schema. Per block, as in
 * src/model/tower.c but over F32 weights:
 *   h1 = rms1(x_in); qkv = rope(h1 Wqkv^T + b); att = attention(qkv); x_mid = x_in + att Wout^T + b;
 *   h2 = rms2(x_mid); u = h2 Wup^T + b; g = gelu(u); x_out = x_mid + g Wdown^T + b.
 * Work split: GEMMs at KERNEL_GEMM_TILE columns; row kernels by rows; attention by (head, item); bias
 * gradients by columns; RMSNorm weight gradients by fixed blocks of TRAIN_ROW_BLOCK rows summed in order.
 * Every value is computed by the same code whatever the thread count. */
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "executor.h"
#include "kernels.h"
#include "tower_fork.h"
#include "train.h"

/* RMSNorm weight gradients are summed per block of this many rows, then over the blocks in order. */
#define TRAIN_ROW_BLOCK 64

/* ---- GEMMs ---------------------------------------------------------------------------------------- */

typedef struct columns_job {
    float const *from; /* [rows, n] */
    size_t rows, n;
    float *to; /* to[j] += sum over rows of from[r, j], rows in order */
    size_t threads;
} columns_job_t;

static void columns_work(void *context, size_t thread) {
    columns_job_t const *job = context;
    size_t first, last;
    thread_share(job->n, thread, job->threads, &first, &last);
    for (size_t r = 0; r < job->rows; ++r) {
        float const *row = job->from + r * job->n;
        for (size_t j = first; j < last; ++j)
            job->to[j] += row[j];
    }
}

static void column_sums(uform_executor_t *executor, float const *from, size_t rows, size_t n, float *to) {
    columns_job_t job = {from, rows, n, to, executor_fork_threads(executor)};
    executor_for_threads(executor, columns_work, &job);
}

typedef struct bias_job {
    float *y;
    float const *bias;
    size_t m, n, threads;
} bias_job_t;

static void bias_work(void *context, size_t thread) {
    bias_job_t const *job = context;
    size_t first, last;
    thread_share(job->m, thread, job->threads, &first, &last);
    for (size_t r = first; r < last; ++r)
        for (size_t j = 0; j < job->n; ++j)
            job->y[r * job->n + j] += job->bias[j];
}

void train_linear(kernels_t const *kernels, uform_executor_t *executor, float const *x, size_t m,
                  train_tensor_t const *weight, size_t n, train_tensor_t const *bias, float *y) {
    size_t k = weight->shape[1];
    kernel_sgemm_t sgemm = {.m = m, .n = n, .k = k, .a = x, .a_stride = k, .b = weight->value, .b_stride = k,
                            .b_transposed = true, .c = y, .c_stride = n};
    tower_fork_sgemm(kernels, executor, &sgemm);
    if (bias) {
        bias_job_t job = {y, bias->value, m, n, executor_fork_threads(executor)};
        executor_for_threads(executor, bias_work, &job);
    }
}

void train_linear_backward(kernels_t const *kernels, uform_executor_t *executor, float const *x, size_t m,
                           train_tensor_t *weight, size_t n, train_tensor_t *bias, float const *dy, float *dx,
                           bool accumulate_dx) {
    size_t k = weight->shape[1];
    /* W.grad[n, k] += dy^T [n, m] . x [m, k] */
    kernel_sgemm_t d_weight = {.m = n, .n = k, .k = m, .a = dy, .a_stride = n, .a_transposed = true, .b = x,
                               .b_stride = k, .c = weight->grad, .c_stride = k, .accumulate = true};
    tower_fork_sgemm(kernels, executor, &d_weight);
    if (bias) column_sums(executor, dy, m, n, bias->grad);
    if (dx) {
        /* dx [m, k] = dy [m, n] . W [n, k] */
        kernel_sgemm_t d_x = {.m = m, .n = k, .k = n, .a = dy, .a_stride = n, .b = weight->value, .b_stride = k,
                              .c = dx, .c_stride = k, .accumulate = accumulate_dx};
        tower_fork_sgemm(kernels, executor, &d_x);
    }
}

/* ---- Binding -------------------------------------------------------------------------------------- */

typedef struct bind_walk {
    train_tower_t *tower;
    train_params_t const *params;
    bool ok;
} bind_walk_t;

/* The parameter of one tensor of the tower's schema into its place. */
static int bind_visit(checkpoint_schema_tensor_t const *tensor, void *context) {
    bind_walk_t *walk = context;
    train_tower_t *tower = walk->tower;
    train_tensor_t *found = train_params_find(walk->params, tensor->name);
    if (!found) walk->ok = false;
    /* The tower's own parts, CHECKPOINT_PART_NORM .. CHECKPOINT_PART_POS in order. */
    train_tensor_t **const slots[] = {&tower->norm,       &tower->proj,       &tower->embed,
                                      &tower->patches[0], &tower->patches[1], &tower->patches[2],
                                      &tower->patches[3]};
    _Static_assert(CHECKPOINT_PART_POS - CHECKPOINT_PART_NORM == 6, "the tower's parts follow its slots");
    size_t const part = tensor->part;
    if (part <= CHECKPOINT_PART_DOWN_BIAS)
        tower->blocks[tensor->block].parts[part] = found;
    else if (part - CHECKPOINT_PART_NORM < sizeof slots / sizeof slots[0])
        *slots[part - CHECKPOINT_PART_NORM] = found;
    return 0;
}

bool train_tower_bind(train_tower_t *tower, train_params_t const *params, char const *name,
                      uform_transformer_info_t const *info) {
    *tower = (train_tower_t){.kernels = kernels_active(),
                             .depth = info->depth,
                             .hidden = info->hidden,
                             .heads = info->heads,
                             .mlp = info->mlp,
                             .dims = params->info.dims};
    tower->blocks = calloc(tower->depth ? tower->depth : 1, sizeof *tower->blocks);
    if (!tower->blocks) return false;
    bind_walk_t walk = {tower, params, true};
    checkpoint_schema_tower(&params->info, name, bind_visit, &walk);
    if (!walk.ok) train_tower_release(tower);
    return walk.ok;
}

void train_tower_release(train_tower_t *tower) {
    free(tower->blocks);
    memset(tower, 0, sizeof *tower);
}

/* ---- Pass buffers --------------------------------------------------------------------------------- */

/* Floats one block keeps per token. */
static size_t block_floats(train_tower_t const *tower) {
    return 8 * tower->hidden + 2 * tower->mlp;
}

typedef struct saved_block {
    float *x_in, *h1, *qkv, *att, *x_mid, *h2, *u, *g;
} saved_block_t;

static saved_block_t saved_block(train_tower_t const *tower, train_pass_t const *pass, size_t block) {
    size_t t = pass->capacity, h = tower->hidden;
    float *base = pass->saved + block * t * block_floats(tower);
    saved_block_t saved = {.x_in = base};
    saved.h1 = saved.x_in + t * h;
    saved.qkv = saved.h1 + t * h;
    saved.att = saved.qkv + t * 3 * h;
    saved.x_mid = saved.att + t * h;
    saved.h2 = saved.x_mid + t * h;
    saved.u = saved.h2 + t * h;
    saved.g = saved.u + t * tower->mlp;
    return saved;
}

/* The final-norm input, after the last block. */
static float *saved_final(train_tower_t const *tower, train_pass_t const *pass) {
    return pass->saved + tower->depth * pass->capacity * block_floats(tower);
}

void train_free_each(void *const *buffers, size_t count) {
    for (size_t i = 0; i < count; ++i)
        free(buffers[i]);
}

void train_pass_release(train_pass_t *pass) {
    void *const buffers[] = {pass->positions, pass->saved, pass->states, pass->dx,
                             pass->dh,        pass->dqkv,  pass->dmlp,   pass->partial};
    train_free_each(buffers, sizeof buffers / sizeof buffers[0]);
    memset(pass, 0, sizeof *pass);
}

static float *floats(size_t count) {
    return aligned_alloc(64, ((count * sizeof(float) + 63) / 64) * 64 + 64);
}

/* Buffers for `tokens` tokens of this tower (grown, never shrunk). */
static bool pass_reserve(train_tower_t const *tower, train_pass_t *pass, size_t tokens) {
    size_t h = tower->hidden, blocks = (tokens + TRAIN_ROW_BLOCK - 1) / TRAIN_ROW_BLOCK;
    if (pass->saved && pass->capacity >= tokens && pass->partial_rows >= blocks) return true;
    train_pass_release(pass);
    size_t t = tokens ? tokens : 1;
    pass->capacity = t;
    pass->partial_rows = (t + TRAIN_ROW_BLOCK - 1) / TRAIN_ROW_BLOCK;
    pass->positions = malloc(t * sizeof(uint32_t));
    pass->saved = floats(tower->depth * t * block_floats(tower) + t * h);
    pass->states = floats(t * h);
    pass->dx = floats(t * h);
    pass->dh = floats(t * h);
    pass->dqkv = floats(t * 3 * h);
    pass->dmlp = floats(t * tower->mlp);
    pass->partial = floats(pass->partial_rows * h);
    if (pass->positions && pass->saved && pass->states && pass->dx && pass->dh && pass->dqkv && pass->dmlp &&
        pass->partial)
        return true;
    train_pass_release(pass);
    return false;
}

/* ---- Row work ------------------------------------------------------------------------------------- */

/* The batch of the pass as the forks see it. */
static tower_fork_t pass_fork(train_tower_t const *tower, train_pass_t const *pass) {
    return (tower_fork_t){.kernels = tower->kernels,
                          .hidden = tower->hidden,
                          .heads = tower->heads,
                          .mlp = tower->mlp,
                          .tokens = pass->tokens,
                          .items = pass->items,
                          .offsets = pass->offsets,
                          .positions = pass->positions,
                          .causal = pass->causal,
                          .f32_attention = true};
}

/* The RMSNorm backward pass: dy (overwritten with dx) given the norm's input x; the weight's gradient
 * from per-block partials summed in block order. */
typedef struct rms_back_job {
    train_tower_t const *tower;
    train_pass_t const *pass;
    float *dy;
    float const *x, *weight;
    size_t threads;
} rms_back_job_t;

static void rms_back_work(void *context, size_t thread) {
    rms_back_job_t const *job = context;
    size_t h = job->tower->hidden, tokens = job->pass->tokens;
    size_t blocks = (tokens + TRAIN_ROW_BLOCK - 1) / TRAIN_ROW_BLOCK, first, last;
    thread_share(blocks, thread, job->threads, &first, &last);
    for (size_t b = first; b < last; ++b) {
        size_t begin = b * TRAIN_ROW_BLOCK, end = begin + TRAIN_ROW_BLOCK < tokens ? begin + TRAIN_ROW_BLOCK : tokens;
        float *partial = job->pass->partial + b * h;
        memset(partial, 0, h * sizeof(float));
        job->tower->kernels->rmsnorm_backward(job->dy + begin * h, h, partial, job->dy + begin * h, h,
                                              job->x + begin * h, h, job->weight, end - begin, h, 1e-6f);
    }
}

static void rms_backward(train_tower_t const *tower, uform_executor_t *executor, train_pass_t const *pass,
                         float *dy, float const *x, train_tensor_t *weight) {
    rms_back_job_t job = {tower, pass, dy, x, weight->value, executor_fork_threads(executor)};
    executor_for_threads(executor, rms_back_work, &job);
    size_t blocks = (pass->tokens + TRAIN_ROW_BLOCK - 1) / TRAIN_ROW_BLOCK;
    column_sums(executor, pass->partial, blocks, tower->hidden, weight->grad);
}

/* ---- Forward -------------------------------------------------------------------------------------- */

bool train_tower_forward(train_tower_t const *tower, uform_executor_t *executor, train_pass_t *pass,
                         float const *x, size_t tokens, size_t const *offsets, size_t items, bool causal,
                         bool rotary) {
    if (!pass_reserve(tower, pass, tokens)) return false;
    pass->tokens = tokens;
    pass->items = items;
    pass->offsets = offsets;
    pass->causal = causal;
    pass->rotary = rotary;
    tower_fork_positions(offsets, items, pass->positions);
    tower_fork_t fork = pass_fork(tower, pass);
    kernels_t const *kernels = tower->kernels;
    size_t h = tower->hidden;
    float *x_in = tower->depth ? saved_block(tower, pass, 0).x_in : saved_final(tower, pass);
    memcpy(x_in, x, tokens * h * sizeof(float));
    for (size_t i = 0; i < tower->depth; ++i) {
        train_block_t const *b = &tower->blocks[i];
        saved_block_t s = saved_block(tower, pass, i);
        float *x_out = i + 1 < tower->depth ? saved_block(tower, pass, i + 1).x_in : saved_final(tower, pass);
        /* h1 = rms1(x_in); qkv = rope(h1 Wqkv^T + b)                      [tokens, 3 hidden] */
        tower_fork_rows(&fork, executor, TOWER_ROWS_RMSNORM, s.x_in, b->norm1->value, s.h1);
        train_linear(kernels, executor, s.h1, tokens, b->qkv_w, 3 * h, b->qkv_b, s.qkv);
        if (rotary) tower_fork_rows(&fork, executor, TOWER_ROWS_ROPE, NULL, NULL, s.qkv);
        /* att = attention(qkv); x_mid = x_in + att Wout^T + b               [tokens, hidden] */
        tower_fork_attention(&fork, executor, s.qkv, s.att);
        train_linear(kernels, executor, s.att, tokens, b->out_w, h, b->out_b, s.x_mid);
        tower_fork_rows(&fork, executor, TOWER_ROWS_ADD, s.x_in, NULL, s.x_mid);
        /* h2 = rms2(x_mid); g = gelu(h2 Wup^T + b); x_out = x_mid + g Wdown^T + b  [tokens, mlp] */
        tower_fork_rows(&fork, executor, TOWER_ROWS_RMSNORM, s.x_mid, b->norm2->value, s.h2);
        train_linear(kernels, executor, s.h2, tokens, b->up_w, tower->mlp, b->up_b, s.u);
        tower_fork_rows(&fork, executor, TOWER_ROWS_GELU, s.u, NULL, s.g);
        train_linear(kernels, executor, s.g, tokens, b->down_w, h, b->down_b, x_out);
        tower_fork_rows(&fork, executor, TOWER_ROWS_ADD, s.x_mid, NULL, x_out);
    }
    /* states = rms(x_final) with the final norm */
    tower_fork_rows(&fork, executor, TOWER_ROWS_RMSNORM, saved_final(tower, pass), tower->norm->value,
                    pass->states);
    return true;
}

/* ---- Backward ------------------------------------------------------------------------------------- */

void train_tower_backward(train_tower_t const *tower, uform_executor_t *executor, train_pass_t *pass,
                          float *d_states, float *d_x) {
    kernels_t const *kernels = tower->kernels;
    size_t h = tower->hidden, tokens = pass->tokens;
    tower_fork_t fork = pass_fork(tower, pass);
    /* dx: the gradient with respect to the current block's output, carried down the residual stream. */
    float *dx = pass->dx;
    rms_backward(tower, executor, pass, d_states, saved_final(tower, pass), tower->norm);
    memcpy(dx, d_states, tokens * h * sizeof(float));
    for (size_t i = tower->depth; i-- > 0;) {
        train_block_t const *b = &tower->blocks[i];
        saved_block_t s = saved_block(tower, pass, i);
        /* MLP: x_out = x_mid + g Wdown^T + b. */
        train_linear_backward(kernels, executor, s.g, tokens, b->down_w, h, b->down_b, dx, pass->dmlp, false);
        tower_fork_rows(&fork, executor, TOWER_ROWS_GELU_BACKWARD, s.u, NULL, pass->dmlp);
        train_linear_backward(kernels, executor, s.h2, tokens, b->up_w, tower->mlp, b->up_b, pass->dmlp,
                              pass->dh, false);
        rms_backward(tower, executor, pass, pass->dh, s.x_mid, b->norm2);
        tower_fork_rows(&fork, executor, TOWER_ROWS_ADD, pass->dh, NULL, dx); /* dx is now d x_mid */
        /* Attention: x_mid = x_in + att Wout^T + b. */
        train_linear_backward(kernels, executor, s.att, tokens, b->out_w, h, b->out_b, dx, pass->dh, false);
        tower_fork_attention_backward(&fork, executor, s.qkv, s.att, pass->dh, pass->dqkv);
        if (pass->rotary) tower_fork_rows(&fork, executor, TOWER_ROWS_ROPE_BACKWARD, NULL, NULL, pass->dqkv);
        train_linear_backward(kernels, executor, s.h1, tokens, b->qkv_w, 3 * h, b->qkv_b, pass->dqkv, pass->dh,
                              false);
        rms_backward(tower, executor, pass, pass->dh, s.x_in, b->norm1);
        tower_fork_rows(&fork, executor, TOWER_ROWS_ADD, pass->dh, NULL, dx); /* dx is now d x_in */
    }
    memcpy(d_x, dx, tokens * h * sizeof(float));
}
