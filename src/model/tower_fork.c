/* The thread-split work of a tower's passes (tower_fork.h): a job per kind of fork, each thread taking
 * its share of columns, rows or (head, item) pairs. */
#include <math.h>
#include <string.h>

#include "executor.h"
#include "kernels.h"
#include "tower_fork.h"

void tower_fork_positions(size_t const *offsets, size_t items, uint32_t *positions) {
    for (size_t item = 0; item < items; ++item)
        for (size_t row = offsets[item]; row < offsets[item + 1]; ++row)
            positions[row] = (uint32_t)(row - offsets[item]);
}

/* ---- GEMMs -------------------------------------------------------------------------------------- */

typedef struct gemm_job {
    kernels_t const *kernels;
    kernel_gemm_t gemm;
    kernel_sgemm_t sgemm;
    tower_quantized_t quantized; /* the I8 GEMM's activations */
    size_t threads;
} gemm_job_t;

static void gemm_work(void *context, size_t thread) {
    gemm_job_t const *job = context;
    size_t begin, end;
    if (thread_columns(job->gemm.n, thread, job->threads, &begin, &end))
        job->kernels->gemm(&job->gemm, begin, end);
}

static void gemm_i8_work(void *context, size_t thread) {
    gemm_job_t const *job = context;
    size_t begin, end;
    if (thread_columns(job->gemm.n, thread, job->threads, &begin, &end))
        job->kernels->gemm_i8(&job->gemm, begin, end);
}

/* Rows of the I8 GEMM's x quantized at the same stride. */
static void quantize_work(void *context, size_t thread) {
    gemm_job_t const *job = context;
    kernel_gemm_t const *g = &job->gemm;
    tower_quantized_t const *q = &job->quantized;
    size_t first, last;
    thread_share(g->m, thread, job->threads, &first, &last);
    if (first < last)
        job->kernels->quantize_rows(q->rows + first * g->x_stride, g->x_stride, q->scales + first,
                                    q->zeros + first, g->x + first * g->x_stride, g->x_stride, last - first,
                                    g->k);
}

static void sgemm_work(void *context, size_t thread) {
    gemm_job_t const *job = context;
    size_t begin, end;
    if (thread_columns(job->sgemm.n, thread, job->threads, &begin, &end))
        job->kernels->sgemm(&job->sgemm, begin, end);
}

void tower_fork_gemm(kernels_t const *kernels, uform_executor_t *executor, kernel_gemm_t const *gemm) {
    gemm_job_t job = {.kernels = kernels, .gemm = *gemm, .threads = executor_fork_threads(executor)};
    executor_for_threads(executor, gemm_work, &job);
}

void tower_fork_gemm_i8(kernels_t const *kernels, uform_executor_t *executor, kernel_gemm_t const *gemm,
                        tower_quantized_t const *quantized) {
    gemm_job_t job = {.kernels = kernels,
                      .gemm = *gemm,
                      .quantized = *quantized,
                      .threads = executor_fork_threads(executor)};
    job.gemm.x_u8 = quantized->rows;
    job.gemm.x_scales = quantized->scales;
    job.gemm.x_zeros = quantized->zeros;
    executor_for_threads(executor, quantize_work, &job);
    executor_for_threads(executor, gemm_i8_work, &job);
}

void tower_fork_sgemm(kernels_t const *kernels, uform_executor_t *executor, kernel_sgemm_t const *sgemm) {
    if (sgemm->m == 0 || sgemm->n == 0) return;
    gemm_job_t job = {.kernels = kernels, .sgemm = *sgemm, .threads = executor_fork_threads(executor)};
    executor_for_threads(executor, sgemm_work, &job);
}

/* ---- Rows --------------------------------------------------------------------------------------- */

typedef struct rows_job {
    tower_fork_t const *fork;
    tower_rows_t kind;
    float const *from, *weight;
    float *to;
    size_t threads;
    float const *bias; /* LayerNorm (norm_work) */
} rows_job_t;

static void rows_work(void *context, size_t thread) {
    rows_job_t const *job = context;
    tower_fork_t const *fork = job->fork;
    kernels_t const *kernels = fork->kernels;
    size_t h = fork->hidden, mlp = fork->mlp, first, last;
    thread_share(fork->tokens, thread, job->threads, &first, &last);
    if (first == last) return;
    size_t rows = last - first;
    switch (job->kind) {
    case TOWER_ROWS_RMSNORM:
        kernels->rmsnorm(job->to + first * h, h, job->from + first * h, h, job->weight, rows, h, 1e-6f);
        break;
    case TOWER_ROWS_ROPE:
    case TOWER_ROWS_ROPE_BACKWARD: {
        void (*rotate)(float *, size_t, size_t) =
            job->kind == TOWER_ROWS_ROPE ? kernels->rope : kernels->rope_backward;
        for (size_t r = first; r < last; ++r) {
            float *q = job->to + r * 3 * h;
            rotate(q, fork->heads, fork->positions[r]);     /* queries */
            rotate(q + h, fork->heads, fork->positions[r]); /* keys */
        }
        break;
    }
    case TOWER_ROWS_GELU:
        memcpy(job->to + first * mlp, job->from + first * mlp, rows * mlp * sizeof(float));
        kernels->gelu(job->to + first * mlp, rows * mlp);
        break;
    case TOWER_ROWS_GELU_BACKWARD:
        kernels->gelu_backward(job->to + first * mlp, job->to + first * mlp, job->from + first * mlp,
                               rows * mlp);
        break;
    case TOWER_ROWS_ADD:
        for (size_t i = first * h; i < last * h; ++i)
            job->to[i] += job->from[i];
        break;
    }
}

void tower_fork_rows(tower_fork_t const *fork, uform_executor_t *executor, tower_rows_t kind,
                     float const *from, float const *weight, float *to) {
    rows_job_t job = {fork, kind, from, weight, to, executor_fork_threads(executor), NULL};
    executor_for_threads(executor, rows_work, &job);
}

static void norm_work(void *context, size_t thread) {
    rows_job_t const *job = context;
    tower_fork_t const *fork = job->fork;
    size_t h = fork->hidden, first, last;
    thread_share(fork->tokens, thread, job->threads, &first, &last);
    if (first < last)
        fork->kernels->layernorm(job->to + first * h, h, job->from + first * h, h, job->weight, job->bias,
                                 last - first, h, fork->norm_eps);
}

void tower_fork_norm(tower_fork_t const *fork, uform_executor_t *executor, float const *from,
                     float const *weight, float const *bias, float *to) {
    rows_job_t job = {fork, TOWER_ROWS_RMSNORM, from, weight, to, executor_fork_threads(executor), bias};
    executor_for_threads(executor, norm_work, &job);
}

/* ---- Attention ---------------------------------------------------------------------------------- */

typedef struct attention_job {
    tower_fork_t const *fork;
    float const *qkv, *att, *d_att; /* att, d_att: backward only */
    float *out;                     /* forward: att; backward: d_qkv */
    bool backward;
    size_t threads;
} attention_job_t;

/* One head's attention over the fork's items: q, k and v of qkv [tokens, 3h], `out` [tokens, h] set by
 * the caller. */
static kernel_attention_t head_attention(tower_fork_t const *fork, float const *qkv) {
    size_t h = fork->hidden, head = fork->head ? fork->head : KERNEL_HEAD;
    return (kernel_attention_t){
        .head = head,
        .q = qkv,
        .k = qkv + h,
        .v = qkv + 2 * h,
        .stride = 3 * h,
        .out_stride = h,
        .offsets = fork->offsets,
        .items = fork->items,
        .causal = fork->causal,
        .scale = (float)(1.0 / sqrt((double)head)),
    };
}

/* The backward of `forward`, whose output was `out`: the output's gradient d_out, and the gradients of q,
 * k and v into d_qkv [tokens, 3h]. */
static kernel_attention_backward_t head_backward(kernel_attention_t const *forward, float const *out,
                                                 float const *d_out, float *d_qkv) {
    size_t h = forward->out_stride;
    return (kernel_attention_backward_t){
        .q = forward->q,
        .k = forward->k,
        .v = forward->v,
        .stride = forward->stride,
        .out = out,
        .d_out = d_out,
        .out_stride = forward->out_stride,
        .d_q = d_qkv,
        .d_k = d_qkv + h,
        .d_v = d_qkv + 2 * h,
        .offsets = forward->offsets,
        .items = forward->items,
        .causal = forward->causal,
        .scale = forward->scale,
    };
}

/* One head's attention, or its backward pass, over the items [item, end), on thread `thread` of the fork. */
static void attention_head(attention_job_t const *job, size_t head, size_t item, size_t end, size_t thread) {
    tower_fork_t const *fork = job->fork;
    size_t width = fork->head ? fork->head : KERNEL_HEAD;
    kernel_attention_t attention = head_attention(fork, job->qkv + head * width);
    if (!job->backward) {
        attention.out = job->out + head * width;
        if (fork->relative) attention.bias = fork->relative + head * fork->relative_stride;
        if (fork->attention_scratch && thread < fork->attention_threads) {
            attention.scratch = (char *)fork->attention_scratch + thread * fork->attention_scratch_bytes;
            attention.scratch_bytes = fork->attention_scratch_bytes;
        }
        (fork->f32_attention ? fork->kernels->attention_f32 : fork->kernels->attention)(&attention, item,
                                                                                        end);
    } else {
        kernel_attention_backward_t backward =
            head_backward(&attention, job->att + head * KERNEL_HEAD, job->d_att + head * KERNEL_HEAD,
                          job->out + head * KERNEL_HEAD);
        fork->kernels->attention_backward(&backward, item, end);
    }
}

/* The (head, item) pairs are split between threads head by head, so that each thread takes whole heads where
 * it can: every head costs the same. A thread's whole heads run item by item, the item's heads in turn: each
 * head's columns of an item's rows lie next to the previous head's, where the hardware prefetchers fetch
 * them, while a walk down one head's columns over every item steps 3 hidden values at a time (more than a
 * page at hidden 384), which no prefetcher follows. The part heads at either end of its share run alone. */
static void attention_work(void *context, size_t thread) {
    attention_job_t const *job = context;
    size_t items = job->fork->items, first, last;
    thread_share(job->fork->heads * items, thread, job->threads, &first, &last);
    if (first >= last) return;
    /* Its whole heads: [whole_first, whole_end); none when the share lies within one head. */
    size_t whole_first = (first + items - 1) / items, whole_end = last / items;
    if (whole_first > whole_end) {
        attention_head(job, first / items, first % items, last - first / items * items, thread);
        return;
    }
    if (first % items) attention_head(job, first / items, first % items, items, thread);
    if (whole_first < whole_end)
        for (size_t item = 0; item < items; ++item)
            for (size_t head = whole_first; head < whole_end; ++head)
                attention_head(job, head, item, item + 1, thread);
    if (last % items) attention_head(job, whole_end, 0, last % items, thread);
}

void tower_fork_attention(tower_fork_t const *fork, uform_executor_t *executor, float const *qkv,
                          float *out) {
    attention_job_t job = {fork, qkv, NULL, NULL, out, false, executor_fork_threads(executor)};
    executor_for_threads(executor, attention_work, &job);
}

void tower_fork_attention_backward(tower_fork_t const *fork, uform_executor_t *executor, float const *qkv,
                                   float const *att, float const *d_att, float *d_qkv) {
    attention_job_t job = {fork, qkv, att, d_att, d_qkv, true, executor_fork_threads(executor)};
    executor_for_threads(executor, attention_work, &job);
}
