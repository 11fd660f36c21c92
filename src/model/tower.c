/* The shared transformer: preparing weights for the kernel path, and the forward pass. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "executor.h"
#include "kernels.h"
#include "model.h"
#include "tower.h"

/* ---- Preparation -------------------------------------------------------------------------------- */

/* A BF16 vector of the checkpoint as F32, in memory placed like the tower. */
static float *prepare_vector(tower_t *tower, uform_model_t const *model, char const *name, size_t n) {
    checkpoint_tensor_t const *tensor = NULL;
    uint16_t const *values = model_tensor(model, name, &tensor);
    if (!values || tensor->dtype != CHECKPOINT_BF16) return NULL;
    float *vector = executor_allocate(tower->placement, n * sizeof(float));
    if (!vector) return NULL;
    tower->kernels->bf16_to_f32(vector, values, n);
    tower->bytes += n * sizeof(float);
    return vector;
}

static bool prepare_linear(tower_t *tower, uform_model_t const *model, char const *weight, char const *bias,
                           tower_linear_t *layer) {
    checkpoint_tensor_t const *tensor = NULL;
    uint16_t const *values = model_tensor(model, weight, &tensor);
    if (!values || tensor->rank != 2) return false;
    layer->n = (size_t)tensor->shape[0];
    layer->k = (size_t)tensor->shape[1];
    size_t bytes = tower->kernels->gemm_packed_size(layer->n, layer->k);
    layer->packed = executor_allocate(tower->placement, bytes);
    if (!layer->packed) return false;
    tower->kernels->gemm_pack(layer->packed, values, layer->n, layer->k);
    tower->bytes += bytes;
    if (bias && !(layer->bias = prepare_vector(tower, model, bias, layer->n))) return false;
    return true;
}

static void release_linear(tower_t *tower, tower_linear_t *layer) {
    executor_deallocate(tower->placement, layer->packed,
                        tower->kernels->gemm_packed_size(layer->n, layer->k));
    executor_deallocate(tower->placement, layer->bias, layer->n * sizeof(float));
}

void tower_release(tower_t *tower) {
    if (!tower->kernels) return;
    for (size_t i = 0; tower->blocks && i < tower->depth; ++i) {
        tower_block_t *block = &tower->blocks[i];
        executor_deallocate(tower->placement, block->norm1, tower->hidden * sizeof(float));
        executor_deallocate(tower->placement, block->norm2, tower->hidden * sizeof(float));
        release_linear(tower, &block->qkv);
        release_linear(tower, &block->out);
        release_linear(tower, &block->up);
        release_linear(tower, &block->down);
    }
    free(tower->blocks);
    executor_deallocate(tower->placement, tower->norm, tower->hidden * sizeof(float));
    release_linear(tower, &tower->proj);
    tower_patches_release(&tower->patches, tower->placement);
    memset(tower, 0, sizeof *tower);
}

uform_status_t tower_prepare(tower_t *tower, uform_model_t const *model, char const *name,
                             uform_transformer_info_t const *info) {
    memset(tower, 0, sizeof *tower);
    tower->kernels = kernels_active();
    tower->placement = model->executor;
    tower->depth = info->depth;
    tower->hidden = info->hidden;
    tower->heads = info->heads;
    tower->mlp = info->mlp;
    tower->dims = model->header.info.dims;
    tower->blocks = calloc(tower->depth, sizeof *tower->blocks);
    if (!tower->blocks) goto fail;
    /* Names are checked by the checkpoint parser; a miss here can only be memory. */
    char weight[96], bias[96];
    for (size_t i = 0; i < tower->depth; ++i) {
        tower_block_t *block = &tower->blocks[i];
        snprintf(weight, sizeof weight, "%s.blocks.%zu.norm1.weight", name, i);
        if (!(block->norm1 = prepare_vector(tower, model, weight, tower->hidden))) goto fail;
        snprintf(weight, sizeof weight, "%s.blocks.%zu.norm2.weight", name, i);
        if (!(block->norm2 = prepare_vector(tower, model, weight, tower->hidden))) goto fail;
        static char const *const layers[] = {"attn.qkv", "attn.out", "mlp.up", "mlp.down"};
        tower_linear_t *targets[] = {&block->qkv, &block->out, &block->up, &block->down};
        for (size_t j = 0; j < 4; ++j) {
            snprintf(weight, sizeof weight, "%s.blocks.%zu.%s.weight", name, i, layers[j]);
            snprintf(bias, sizeof bias, "%s.blocks.%zu.%s.bias", name, i, layers[j]);
            if (!prepare_linear(tower, model, weight, bias, targets[j])) goto fail;
        }
    }
    snprintf(weight, sizeof weight, "%s.norm.weight", name);
    if (!(tower->norm = prepare_vector(tower, model, weight, tower->hidden))) goto fail;
    snprintf(weight, sizeof weight, "%s.proj.weight", name);
    if (!prepare_linear(tower, model, weight, NULL, &tower->proj)) goto fail;
    return UFORM_OK;
fail:
    tower_release(tower);
    return UFORM_OUT_OF_MEMORY;
}

/* ---- Scratch ------------------------------------------------------------------------------------ */

typedef struct scratch_layout {
    float *h;            /* [tokens, hidden]: norm outputs and attention outputs */
    float *qkv;          /* [tokens, 3 * hidden] */
    float *mlp;          /* [tokens, mlp] */
    uint32_t *positions; /* [tokens]: the position of each token within its item */
} scratch_layout_t;

static scratch_layout_t scratch_layout(tower_t const *tower, void *scratch, size_t tokens, size_t *bytes) {
    size_t h = round_up_64(tokens * tower->hidden * sizeof(float));
    size_t qkv = round_up_64(tokens * 3 * tower->hidden * sizeof(float));
    size_t mlp = round_up_64(tokens * tower->mlp * sizeof(float));
    size_t positions = round_up_64(tokens * sizeof(uint32_t));
    *bytes = h + qkv + mlp + positions;
    char *base = scratch;
    if (!base) return (scratch_layout_t){0};
    return (scratch_layout_t){
        .h = (float *)base,
        .qkv = (float *)(base + h),
        .mlp = (float *)(base + h + qkv),
        .positions = (uint32_t *)(base + h + qkv + mlp),
    };
}

size_t tower_scratch_bytes(tower_t const *tower, size_t tokens) {
    size_t bytes = 0;
    scratch_layout(tower, NULL, tokens, &bytes);
    return bytes;
}

/* ---- Work split over threads -------------------------------------------------------------------- */

typedef struct gemm_job {
    kernels_t const *kernels;
    kernel_gemm_t gemm;
    size_t threads;
} gemm_job_t;

static void gemm_work(void *context, size_t thread) {
    gemm_job_t const *job = context;
    size_t begin, end;
    if (thread_columns(job->gemm.n, thread, job->threads, &begin, &end))
        job->kernels->gemm(&job->gemm, begin, end);
}

static void run_gemm(tower_t const *tower, uform_executor_t *executor, kernel_gemm_t const *gemm) {
    gemm_job_t job = {tower->kernels, *gemm, executor_fork_threads(executor)};
    executor_for_threads(executor, gemm_work, &job);
}

void tower_linear(tower_t const *tower, uform_executor_t *executor, tower_linear_t const *layer,
                  float const *x, size_t x_stride, size_t m, size_t n_out, float *y, size_t y_stride) {
    kernel_gemm_t gemm = {
        .m = m,
        .n = n_out,
        .k = layer->k,
        .x = x,
        .x_stride = x_stride,
        .w = layer->packed,
        .bias = layer->bias,
        .y = y,
        .y_stride = y_stride,
    };
    run_gemm(tower, executor, &gemm);
}

typedef struct rows_job {
    tower_t const *tower;
    tower_batch_t const *batch;
    scratch_layout_t const *scratch;
    float const *norm; /* rmsnorm: the weight; NULL for rope */
    float const *from;
    float *to;
    size_t threads;
} rows_job_t;

static void rmsnorm_work(void *context, size_t thread) {
    rows_job_t const *job = context;
    size_t first, last, hidden = job->tower->hidden;
    thread_share(job->batch->tokens, thread, job->threads, &first, &last);
    if (first == last) return;
    job->tower->kernels->rmsnorm(job->to + first * hidden, hidden, job->from + first * hidden, hidden,
                                 job->norm, last - first, hidden, 1e-6f);
}

static void rope_work(void *context, size_t thread) {
    rows_job_t const *job = context;
    size_t first, last, hidden = job->tower->hidden, heads = job->tower->heads;
    thread_share(job->batch->tokens, thread, job->threads, &first, &last);
    for (size_t row = first; row < last; ++row) {
        float *q = job->scratch->qkv + row * 3 * hidden;
        job->tower->kernels->rope(q, heads, job->scratch->positions[row]);          /* queries */
        job->tower->kernels->rope(q + hidden, heads, job->scratch->positions[row]); /* keys */
    }
}

/* Attention: the (head, item) pairs are split between threads, each pair computed whole. */
static void attention_work(void *context, size_t thread) {
    rows_job_t const *job = context;
    tower_batch_t const *batch = job->batch;
    size_t hidden = job->tower->hidden, items = batch->items, first, last;
    thread_share(job->tower->heads * items, thread, job->threads, &first, &last);
    while (first < last) {
        size_t head = first / items, item = first % items;
        size_t end = last - head * items < items ? last - head * items : items;
        float const *qkv = job->scratch->qkv + head * KERNEL_HEAD;
        kernel_attention_t attention = {
            .q = qkv,
            .k = qkv + hidden,
            .v = qkv + 2 * hidden,
            .stride = 3 * hidden,
            .out = job->scratch->h + head * KERNEL_HEAD,
            .out_stride = hidden,
            .offsets = batch->offsets,
            .items = items,
            .causal = batch->causal,
            .scale = 0.125f, /* 1 / sqrt(64) */
        };
        job->tower->kernels->attention(&attention, item, end);
        first += end - item;
    }
}

/* ---- Forward ------------------------------------------------------------------------------------ */

static void for_rows(uform_executor_t *executor, void (*work)(void *context, size_t thread),
                     rows_job_t *rows) {
    rows->threads = executor_fork_threads(executor);
    executor_for_threads(executor, work, rows);
}

void tower_forward(tower_t const *tower, uform_executor_t *executor, tower_batch_t const *batch) {
    size_t bytes = 0, hidden = tower->hidden, tokens = batch->tokens;
    scratch_layout_t scratch = scratch_layout(tower, batch->scratch, tokens, &bytes);
    for (size_t item = 0; item < batch->items; ++item)
        for (size_t row = batch->offsets[item]; row < batch->offsets[item + 1]; ++row)
            scratch.positions[row] = (uint32_t)(row - batch->offsets[item]);

    /* Each fork splits by the threads it runs on (a decoding worker may come back between two). */
    rows_job_t rows = {tower, batch, &scratch, NULL, NULL, NULL, 0};
    for (size_t i = 0; i < tower->depth; ++i) {
        tower_block_t const *block = &tower->blocks[i];
        /* h = rms1(x); qkv = h Wqkv^T + b                                   [tokens, 3 * hidden] */
        rows.norm = block->norm1, rows.from = batch->x, rows.to = scratch.h;
        for_rows(executor, rmsnorm_work, &rows);
        tower_linear(tower, executor, &block->qkv, scratch.h, hidden, tokens, block->qkv.n, scratch.qkv,
                     3 * hidden);
        if (batch->rotary) for_rows(executor, rope_work, &rows);
        /* h = attention(q, k, v); x += h Wout^T + b                          [tokens, hidden] */
        for_rows(executor, attention_work, &rows);
        kernel_gemm_t out = {.m = tokens,
                             .n = hidden,
                             .k = hidden,
                             .x = scratch.h,
                             .x_stride = hidden,
                             .w = block->out.packed,
                             .bias = block->out.bias,
                             .residual = batch->x,
                             .residual_stride = hidden,
                             .y = batch->x,
                             .y_stride = hidden};
        run_gemm(tower, executor, &out);
        /* h = rms2(x); mlp = gelu(h Wup^T + b); x += mlp Wdown^T + b          [tokens, mlp] */
        rows.norm = block->norm2, rows.from = batch->x, rows.to = scratch.h;
        for_rows(executor, rmsnorm_work, &rows);
        kernel_gemm_t up = {.m = tokens,
                            .n = tower->mlp,
                            .k = hidden,
                            .x = scratch.h,
                            .x_stride = hidden,
                            .w = block->up.packed,
                            .bias = block->up.bias,
                            .y = scratch.mlp,
                            .y_stride = tower->mlp,
                            .epilogue = KERNEL_EPILOGUE_GELU};
        run_gemm(tower, executor, &up);
        kernel_gemm_t down = {.m = tokens,
                              .n = hidden,
                              .k = tower->mlp,
                              .x = scratch.mlp,
                              .x_stride = tower->mlp,
                              .w = block->down.packed,
                              .bias = block->down.bias,
                              .residual = batch->x,
                              .residual_stride = hidden,
                              .y = batch->x,
                              .y_stride = hidden};
        run_gemm(tower, executor, &down);
    }
    rows.norm = tower->norm, rows.from = batch->x, rows.to = batch->x;
    for_rows(executor, rmsnorm_work, &rows);
}

/* ---- Patch towers ------------------------------------------------------------------------------- */

/* The BF16 tensor `<name>.<part>` of a tower (names are checked by the checkpoint parser). */
static uint16_t const *patches_tensor(uform_model_t const *model, char const *name, char const *part) {
    char full[96];
    snprintf(full, sizeof full, "%s.%s", name, part);
    return model_tensor(model, full, NULL);
}

bool tower_patches_prepare(tower_patches_t *patches, tower_t const *tower, uform_model_t const *model,
                           char const *name, size_t inputs, size_t count, uform_executor_t *executor) {
    kernels_t const *kernels = tower->kernels;
    size_t const hidden = tower->hidden;
    uint16_t const *weight = patches_tensor(model, name, "patch.weight");
    uint16_t const *bias = patches_tensor(model, name, "patch.bias");
    uint16_t const *cls = patches_tensor(model, name, "cls");
    uint16_t const *pos = patches_tensor(model, name, "pos");
    patches->packed_bytes = kernels->gemm_packed_size(hidden, inputs);
    patches->patch.packed = executor_allocate(executor, patches->packed_bytes);
    patches->patch.bias = malloc(hidden * sizeof(float));
    patches->patch.n = hidden;
    patches->patch.k = inputs;
    patches->positions = malloc((1 + count) * hidden * sizeof(float));
    float *class_token = malloc(hidden * sizeof(float));
    if (!patches->patch.packed || !patches->patch.bias || !patches->positions || !class_token) {
        free(class_token);
        return false;
    }
    kernels->gemm_pack(patches->patch.packed, weight, hidden, inputs);
    kernels->bf16_to_f32(patches->patch.bias, bias, hidden);
    kernels->bf16_to_f32(patches->positions, pos, (1 + count) * hidden);
    kernels->bf16_to_f32(class_token, cls, hidden);
    for (size_t h = 0; h < hidden; ++h)
        patches->positions[h] += class_token[h];
    free(class_token);
    return true;
}

void tower_patches_release(tower_patches_t *patches, uform_executor_t *executor) {
    executor_deallocate(executor, patches->patch.packed, patches->packed_bytes);
    free(patches->patch.bias);
    free(patches->positions);
    memset(patches, 0, sizeof *patches);
}

void tower_patches_tokens(tower_patches_t const *patches, size_t hidden, float const *embedded, size_t count,
                          float *x) {
    memcpy(x, patches->positions, hidden * sizeof(float));
    for (size_t p = 0; p < count; ++p) {
        float *token = x + (1 + p) * hidden;
        float const *row = embedded + p * hidden;
        float const *position = patches->positions + (1 + p) * hidden;
        for (size_t h = 0; h < hidden; ++h)
            token[h] = row[h] + position[h];
    }
}

bool tower_patches_scratch(tower_t const *tower, uform_executor_t *executor, size_t images, size_t rows,
                           size_t inputs, size_t pooled, patch_scratch_t *scratch) {
    size_t tokens = rows + images;
    size_t sizes[] = {
        round_up_64(tower_scratch_bytes(tower, tokens)), round_up_64(tokens * tower->hidden * sizeof(float)),
        round_up_64(rows * inputs * sizeof(float)),      round_up_64(rows * tower->hidden * sizeof(float)),
        round_up_64(rows * tower->dims * sizeof(float)), round_up_64(pooled * sizeof(float)),
        round_up_64((images + 1) * sizeof(size_t)),      round_up_64(images * sizeof(size_t)),
    };
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i)
        total += sizes[i];
    char *base = executor_scratch(executor, total);
    if (!base) return false;
    scratch->tower = base;
    scratch->x = (float *)(void *)(base += sizes[0]);
    scratch->patches = (float *)(void *)(base += sizes[1]);
    scratch->rows = (float *)(void *)(base += sizes[2]);
    scratch->projected = (float *)(void *)(base += sizes[3]);
    scratch->pooled = (float *)(void *)(base += sizes[4]);
    scratch->offsets = (size_t *)(void *)(base += sizes[5]);
    scratch->items = (size_t *)(void *)(base + sizes[6]);
    return true;
}

void tower_patches_forward(tower_t const *tower, uform_executor_t *executor, patch_scratch_t const *scratch,
                           size_t tokens, size_t items) {
    if (items == 0) return;
    tower_batch_t batch = {
        .tokens = tokens,
        .items = items,
        .offsets = scratch->offsets,
        .causal = false,
        .rotary = false,
        .x = scratch->x,
        .scratch = scratch->tower,
    };
    tower_forward(tower, executor, &batch);
}
