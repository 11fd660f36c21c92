/* The training forward pass of a tower's trunk, keeping what its backward pass needs, and that backward
 * pass (src/train/train.h). Per block, as in tower.c but over F32 weights:
 *   h1 = rms1(x_in); qkv = rope(h1 Wqkv^T + b); att = attention(qkv); x_mid = x_in + att Wout^T + b;
 *   h2 = rms2(x_mid); u = h2 Wup^T + b; g = gelu(u); x_out = x_mid + g Wdown^T + b.
 * Work split: GEMMs at KERNEL_GEMM_TILE columns; row kernels by rows; attention by (head, item); bias
 * gradients by columns; RMSNorm weight gradients by fixed blocks of TRAIN_ROW_BLOCK rows summed in order.
 * Every value is computed by the same code whatever the thread count. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "executor.h"
#include "kernels.h"
#include "train.h"

/* RMSNorm weight gradients are summed per block of this many rows, then over the blocks in order. */
#define TRAIN_ROW_BLOCK 64

static size_t executor_threads(uform_executor_t *executor) {
    return executor ? executor->threads : 1;
}

/* ---- GEMMs ---------------------------------------------------------------------------------------- */

typedef struct sgemm_job {
    kernels_t const *kernels;
    kernel_sgemm_t sgemm;
    size_t threads;
} sgemm_job_t;

static void sgemm_work(void *context, size_t thread) {
    sgemm_job_t const *job = context;
    size_t begin, end;
    if (thread_columns(job->sgemm.n, thread, job->threads, &begin, &end)) job->kernels->sgemm(&job->sgemm, begin, end);
}

static void run_sgemm(kernels_t const *kernels, uform_executor_t *executor, kernel_sgemm_t const *sgemm) {
    if (sgemm->m == 0 || sgemm->n == 0) return;
    sgemm_job_t job = {kernels, *sgemm, executor_threads(executor)};
    executor_for_threads(executor, sgemm_work, &job);
}

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
    columns_job_t job = {from, rows, n, to, executor_threads(executor)};
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
    run_sgemm(kernels, executor, &sgemm);
    if (bias) {
        bias_job_t job = {y, bias->value, m, n, executor_threads(executor)};
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
    run_sgemm(kernels, executor, &d_weight);
    if (bias) column_sums(executor, dy, m, n, bias->grad);
    if (dx) {
        /* dx [m, k] = dy [m, n] . W [n, k] */
        kernel_sgemm_t d_x = {.m = m, .n = k, .k = n, .a = dy, .a_stride = n, .b = weight->value, .b_stride = k,
                              .c = dx, .c_stride = k, .accumulate = accumulate_dx};
        run_sgemm(kernels, executor, &d_x);
    }
}

/* ---- Binding -------------------------------------------------------------------------------------- */

static train_tensor_t *bind(train_params_t const *params, char const *tower, char const *format, size_t block,
                            bool *ok) {
    char part[TRAIN_NAME_MAX], name[2 * TRAIN_NAME_MAX + 2];
    snprintf(part, sizeof part, format, block);
    snprintf(name, sizeof name, "%s.%s", tower, part);
    train_tensor_t *tensor = train_params_find(params, name);
    if (!tensor) *ok = false;
    return tensor;
}

bool train_trunk_bind(train_trunk_t *trunk, train_params_t const *params, char const *name,
                      uform_transformer_info_t const *info) {
    memset(trunk, 0, sizeof *trunk);
    trunk->kernels = kernels_active();
    trunk->depth = info->depth;
    trunk->hidden = info->hidden;
    trunk->heads = info->heads;
    trunk->mlp = info->mlp;
    trunk->dims = params->info.dims;
    trunk->blocks = calloc(trunk->depth ? trunk->depth : 1, sizeof *trunk->blocks);
    if (!trunk->blocks) return false;
    bool ok = true;
    for (size_t i = 0; i < trunk->depth; ++i) {
        train_block_t *b = &trunk->blocks[i];
        b->norm1 = bind(params, name, "blocks.%zu.norm1.weight", i, &ok);
        b->norm2 = bind(params, name, "blocks.%zu.norm2.weight", i, &ok);
        b->qkv_w = bind(params, name, "blocks.%zu.attn.qkv.weight", i, &ok);
        b->qkv_b = bind(params, name, "blocks.%zu.attn.qkv.bias", i, &ok);
        b->out_w = bind(params, name, "blocks.%zu.attn.out.weight", i, &ok);
        b->out_b = bind(params, name, "blocks.%zu.attn.out.bias", i, &ok);
        b->up_w = bind(params, name, "blocks.%zu.mlp.up.weight", i, &ok);
        b->up_b = bind(params, name, "blocks.%zu.mlp.up.bias", i, &ok);
        b->down_w = bind(params, name, "blocks.%zu.mlp.down.weight", i, &ok);
        b->down_b = bind(params, name, "blocks.%zu.mlp.down.bias", i, &ok);
    }
    trunk->norm = bind(params, name, "norm.weight", 0, &ok);
    trunk->proj = bind(params, name, "proj.weight", 0, &ok);
    if (!ok) train_trunk_release(trunk);
    return ok;
}

void train_trunk_release(train_trunk_t *trunk) {
    free(trunk->blocks);
    memset(trunk, 0, sizeof *trunk);
}

/* ---- Pass buffers --------------------------------------------------------------------------------- */

/* Floats one block keeps per token. */
static size_t block_floats(train_trunk_t const *trunk) {
    return 8 * trunk->hidden + 2 * trunk->mlp;
}

typedef struct saved_block {
    float *x_in, *h1, *qkv, *att, *x_mid, *h2, *u, *g;
} saved_block_t;

static saved_block_t saved_block(train_trunk_t const *trunk, train_pass_t const *pass, size_t block) {
    size_t t = pass->capacity, h = trunk->hidden;
    float *base = pass->saved + block * t * block_floats(trunk);
    saved_block_t saved = {.x_in = base};
    saved.h1 = saved.x_in + t * h;
    saved.qkv = saved.h1 + t * h;
    saved.att = saved.qkv + t * 3 * h;
    saved.x_mid = saved.att + t * h;
    saved.h2 = saved.x_mid + t * h;
    saved.u = saved.h2 + t * h;
    saved.g = saved.u + t * trunk->mlp;
    return saved;
}

/* The trunk's final-norm input, after the last block. */
static float *saved_final(train_trunk_t const *trunk, train_pass_t const *pass) {
    return pass->saved + trunk->depth * pass->capacity * block_floats(trunk);
}

void train_pass_release(train_pass_t *pass) {
    free(pass->positions);
    free(pass->saved);
    free(pass->states);
    free(pass->dx);
    free(pass->dh);
    free(pass->dqkv);
    free(pass->dmlp);
    free(pass->partial);
    memset(pass, 0, sizeof *pass);
}

static float *floats(size_t count) {
    return aligned_alloc(64, ((count * sizeof(float) + 63) / 64) * 64 + 64);
}

/* Buffers for `tokens` tokens of this trunk (grown, never shrunk). */
static bool pass_reserve(train_trunk_t const *trunk, train_pass_t *pass, size_t tokens) {
    size_t h = trunk->hidden, blocks = (tokens + TRAIN_ROW_BLOCK - 1) / TRAIN_ROW_BLOCK;
    if (pass->saved && pass->capacity >= tokens && pass->partial_rows >= blocks) return true;
    train_pass_release(pass);
    size_t t = tokens ? tokens : 1;
    pass->capacity = t;
    pass->partial_rows = (t + TRAIN_ROW_BLOCK - 1) / TRAIN_ROW_BLOCK;
    pass->positions = malloc(t * sizeof(uint32_t));
    pass->saved = floats(trunk->depth * t * block_floats(trunk) + t * h);
    pass->states = floats(t * h);
    pass->dx = floats(t * h);
    pass->dh = floats(t * h);
    pass->dqkv = floats(t * 3 * h);
    pass->dmlp = floats(t * trunk->mlp);
    pass->partial = floats(pass->partial_rows * h);
    if (pass->positions && pass->saved && pass->states && pass->dx && pass->dh && pass->dqkv && pass->dmlp &&
        pass->partial)
        return true;
    train_pass_release(pass);
    return false;
}

/* ---- Row work ------------------------------------------------------------------------------------- */

typedef enum rows_kind {
    ROWS_RMSNORM,     /* to = rms(from) * weight */
    ROWS_ROPE,        /* rotates q and k of `to` ([rows, 3 hidden]) at their positions */
    ROWS_ROPE_BACK,   /* the transpose, on dq and dk */
    ROWS_GELU,        /* to = gelu(from), mlp wide */
    ROWS_GELU_BACK,   /* to = to * gelu'(from), mlp wide */
    ROWS_ADD,         /* to += from, hidden wide */
} rows_kind_t;

typedef struct rows_job {
    train_trunk_t const *trunk;
    train_pass_t const *pass;
    rows_kind_t kind;
    float const *from, *weight;
    float *to;
    size_t threads;
} rows_job_t;

static void rows_work(void *context, size_t thread) {
    rows_job_t const *job = context;
    kernels_t const *kernels = job->trunk->kernels;
    size_t h = job->trunk->hidden, mlp = job->trunk->mlp, heads = job->trunk->heads, first, last;
    thread_share(job->pass->tokens, thread, job->threads, &first, &last);
    if (first == last) return;
    size_t rows = last - first;
    switch (job->kind) {
    case ROWS_RMSNORM:
        kernels->rmsnorm(job->to + first * h, h, job->from + first * h, h, job->weight, rows, h, 1e-6f);
        break;
    case ROWS_ROPE:
    case ROWS_ROPE_BACK:
        for (size_t r = first; r < last; ++r) {
            float *q = job->to + r * 3 * h;
            uint32_t position = job->pass->positions[r];
            void (*rotate)(float *, size_t, size_t) = job->kind == ROWS_ROPE ? kernels->rope : kernels->rope_backward;
            rotate(q, heads, position);
            rotate(q + h, heads, position);
        }
        break;
    case ROWS_GELU:
        memcpy(job->to + first * mlp, job->from + first * mlp, rows * mlp * sizeof(float));
        kernels->gelu(job->to + first * mlp, rows * mlp);
        break;
    case ROWS_GELU_BACK:
        kernels->gelu_backward(job->to + first * mlp, job->to + first * mlp, job->from + first * mlp, rows * mlp);
        break;
    case ROWS_ADD:
        for (size_t i = first * h; i < last * h; ++i)
            job->to[i] += job->from[i];
        break;
    }
}

static void run_rows(train_trunk_t const *trunk, uform_executor_t *executor, train_pass_t const *pass,
                     rows_kind_t kind, float const *from, float const *weight, float *to) {
    rows_job_t job = {trunk, pass, kind, from, weight, to, executor_threads(executor)};
    executor_for_threads(executor, rows_work, &job);
}

/* The RMSNorm backward pass: dy (overwritten with dx) given the norm's input x; the weight's gradient
 * from per-block partials summed in block order. */
typedef struct rms_back_job {
    train_trunk_t const *trunk;
    train_pass_t const *pass;
    float *dy;
    float const *x, *weight;
    size_t threads;
} rms_back_job_t;

static void rms_back_work(void *context, size_t thread) {
    rms_back_job_t const *job = context;
    size_t h = job->trunk->hidden, tokens = job->pass->tokens;
    size_t blocks = (tokens + TRAIN_ROW_BLOCK - 1) / TRAIN_ROW_BLOCK, first, last;
    thread_share(blocks, thread, job->threads, &first, &last);
    for (size_t b = first; b < last; ++b) {
        size_t begin = b * TRAIN_ROW_BLOCK, end = begin + TRAIN_ROW_BLOCK < tokens ? begin + TRAIN_ROW_BLOCK : tokens;
        float *partial = job->pass->partial + b * h;
        memset(partial, 0, h * sizeof(float));
        job->trunk->kernels->rmsnorm_backward(job->dy + begin * h, h, partial, job->dy + begin * h, h,
                                              job->x + begin * h, h, job->weight, end - begin, h, 1e-6f);
    }
}

static void rms_backward(train_trunk_t const *trunk, uform_executor_t *executor, train_pass_t const *pass,
                         float *dy, float const *x, train_tensor_t *weight) {
    rms_back_job_t job = {trunk, pass, dy, x, weight->value, executor_threads(executor)};
    executor_for_threads(executor, rms_back_work, &job);
    size_t blocks = (pass->tokens + TRAIN_ROW_BLOCK - 1) / TRAIN_ROW_BLOCK;
    column_sums(executor, pass->partial, blocks, trunk->hidden, weight->grad);
}

/* ---- Attention ------------------------------------------------------------------------------------ */

typedef struct attention_job {
    train_trunk_t const *trunk;
    train_pass_t const *pass;
    float const *qkv, *att, *d_att;
    float *d_qkv; /* NULL: forward into `out` */
    float *out;
    size_t threads;
} attention_job_t;

static void attention_work(void *context, size_t thread) {
    attention_job_t const *job = context;
    train_pass_t const *pass = job->pass;
    size_t h = job->trunk->hidden, items = pass->items, first, last;
    thread_share(job->trunk->heads * items, thread, job->threads, &first, &last);
    while (first < last) {
        size_t head = first / items, item = first % items;
        size_t end = last - head * items < items ? last - head * items : items;
        float const *qkv = job->qkv + head * KERNEL_HEAD;
        if (!job->d_qkv) {
            kernel_attention_t attention = {.q = qkv, .k = qkv + h, .v = qkv + 2 * h, .stride = 3 * h,
                                            .out = job->out + head * KERNEL_HEAD, .out_stride = h,
                                            .offsets = pass->offsets, .items = items, .causal = pass->causal,
                                            .scale = 0.125f};
            job->trunk->kernels->attention(&attention, item, end);
        } else {
            float *d = job->d_qkv + head * KERNEL_HEAD;
            kernel_attention_backward_t backward = {
                .q = qkv, .k = qkv + h, .v = qkv + 2 * h, .stride = 3 * h,
                .out = job->att + head * KERNEL_HEAD, .d_out = job->d_att + head * KERNEL_HEAD, .out_stride = h,
                .d_q = d, .d_k = d + h, .d_v = d + 2 * h,
                .offsets = pass->offsets, .items = items, .causal = pass->causal, .scale = 0.125f};
            job->trunk->kernels->attention_backward(&backward, item, end);
        }
        first += end - item;
    }
}

/* ---- Forward -------------------------------------------------------------------------------------- */

bool train_trunk_forward(train_trunk_t const *trunk, uform_executor_t *executor, train_pass_t *pass,
                         float const *x, size_t tokens, size_t const *offsets, size_t items, bool causal,
                         bool rotary) {
    if (!pass_reserve(trunk, pass, tokens)) return false;
    pass->tokens = tokens;
    pass->items = items;
    pass->offsets = offsets;
    pass->causal = causal;
    pass->rotary = rotary;
    for (size_t item = 0; item < items; ++item)
        for (size_t row = offsets[item]; row < offsets[item + 1]; ++row)
            pass->positions[row] = (uint32_t)(row - offsets[item]);
    kernels_t const *kernels = trunk->kernels;
    size_t h = trunk->hidden;
    float *x_in = trunk->depth ? saved_block(trunk, pass, 0).x_in : saved_final(trunk, pass);
    memcpy(x_in, x, tokens * h * sizeof(float));
    for (size_t i = 0; i < trunk->depth; ++i) {
        train_block_t const *b = &trunk->blocks[i];
        saved_block_t s = saved_block(trunk, pass, i);
        float *x_out = i + 1 < trunk->depth ? saved_block(trunk, pass, i + 1).x_in : saved_final(trunk, pass);
        run_rows(trunk, executor, pass, ROWS_RMSNORM, s.x_in, b->norm1->value, s.h1);
        train_linear(kernels, executor, s.h1, tokens, b->qkv_w, 3 * h, b->qkv_b, s.qkv);
        if (rotary) run_rows(trunk, executor, pass, ROWS_ROPE, NULL, NULL, s.qkv);
        attention_job_t attention = {trunk, pass, s.qkv, NULL, NULL, NULL, s.att, executor_threads(executor)};
        executor_for_threads(executor, attention_work, &attention);
        train_linear(kernels, executor, s.att, tokens, b->out_w, h, b->out_b, s.x_mid);
        run_rows(trunk, executor, pass, ROWS_ADD, s.x_in, NULL, s.x_mid);
        run_rows(trunk, executor, pass, ROWS_RMSNORM, s.x_mid, b->norm2->value, s.h2);
        train_linear(kernels, executor, s.h2, tokens, b->up_w, trunk->mlp, b->up_b, s.u);
        run_rows(trunk, executor, pass, ROWS_GELU, s.u, NULL, s.g);
        train_linear(kernels, executor, s.g, tokens, b->down_w, h, b->down_b, x_out);
        run_rows(trunk, executor, pass, ROWS_ADD, s.x_mid, NULL, x_out);
    }
    run_rows(trunk, executor, pass, ROWS_RMSNORM, saved_final(trunk, pass), trunk->norm->value, pass->states);
    return true;
}

/* ---- Backward ------------------------------------------------------------------------------------- */

void train_trunk_backward(train_trunk_t const *trunk, uform_executor_t *executor, train_pass_t *pass,
                          float *d_states, float *d_x) {
    kernels_t const *kernels = trunk->kernels;
    size_t h = trunk->hidden, tokens = pass->tokens;
    /* dx: the gradient with respect to the current block's output, carried down the residual stream. */
    float *dx = pass->dx;
    rms_backward(trunk, executor, pass, d_states, saved_final(trunk, pass), trunk->norm);
    memcpy(dx, d_states, tokens * h * sizeof(float));
    for (size_t i = trunk->depth; i-- > 0;) {
        train_block_t const *b = &trunk->blocks[i];
        saved_block_t s = saved_block(trunk, pass, i);
        /* MLP: x_out = x_mid + g Wdown^T + b. */
        train_linear_backward(kernels, executor, s.g, tokens, b->down_w, h, b->down_b, dx, pass->dmlp, false);
        run_rows(trunk, executor, pass, ROWS_GELU_BACK, s.u, NULL, pass->dmlp);
        train_linear_backward(kernels, executor, s.h2, tokens, b->up_w, trunk->mlp, b->up_b, pass->dmlp,
                              pass->dh, false);
        rms_backward(trunk, executor, pass, pass->dh, s.x_mid, b->norm2);
        run_rows(trunk, executor, pass, ROWS_ADD, pass->dh, NULL, dx); /* dx is now d x_mid */
        /* Attention: x_mid = x_in + att Wout^T + b. */
        train_linear_backward(kernels, executor, s.att, tokens, b->out_w, h, b->out_b, dx, pass->dh, false);
        attention_job_t attention = {trunk, pass, s.qkv, s.att, pass->dh, pass->dqkv, NULL,
                                     executor_threads(executor)};
        executor_for_threads(executor, attention_work, &attention);
        if (pass->rotary) run_rows(trunk, executor, pass, ROWS_ROPE_BACK, NULL, NULL, pass->dqkv);
        train_linear_backward(kernels, executor, s.h1, tokens, b->qkv_w, 3 * h, b->qkv_b, pass->dqkv, pass->dh,
                              false);
        rms_backward(trunk, executor, pass, pass->dh, s.x_in, b->norm1);
        run_rows(trunk, executor, pass, ROWS_ADD, pass->dh, NULL, dx); /* dx is now d x_in */
    }
    memcpy(d_x, dx, tokens * h * sizeof(float));
}
