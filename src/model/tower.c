/* The shared transformer: preparing weights for the kernel path (walking the tower's tensors in the
 * checkpoint schema), and the forward pass, its work split by tower_fork.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "executor.h"
#include "kernels.h"
#include "model.h"
#include "tower.h"
#include "tower_fork.h"

/* ---- Preparation -------------------------------------------------------------------------------- */

/* A BF16 vector of the checkpoint as F32, in memory placed like the tower. */
static float *prepare_vector(tower_t *tower, uint16_t const *values, size_t n) {
    float *vector = executor_allocate(tower->placement, n * sizeof(float));
    if (!vector) return NULL;
    tower->kernels->bf16_to_f32(vector, values, n);
    tower->bytes += n * sizeof(float);
    return vector;
}

/* Bytes of a layer's packed weights. */
static size_t linear_packed_size(tower_t const *tower, tower_linear_t const *layer) {
    kernels_t const *kernels = tower->kernels;
    return layer->i8 ? kernels->gemm_i8_packed_size(layer->n, layer->k)
                     : kernels->gemm_packed_size(layer->n, layer->k);
}

/* I8 weights [n, k] quantized per row from BF16 ones, their scales [n] after them, malloc'ed; NULL when
 * out of memory. */
static int8_t *quantize_weights(uint16_t const *values, size_t n, size_t k) {
    int8_t *q = malloc(n * k + n * sizeof(float));
    for (size_t row = 0; q && row < n; ++row) {
        float scale;
        kernel_quantize_weights(q + row * k, &scale, values + row * k, k);
        memcpy(q + n * k + row * sizeof(float), &scale, sizeof scale);
    }
    return q;
}

/* BF16 weights [n, k] from I8 ones and their scales: q * scale rounded, malloc'ed; NULL when out of
 * memory. */
static uint16_t *widen_weights(int8_t const *q, float const *scales, size_t n, size_t k) {
    uint16_t *values = malloc(n * k * sizeof(uint16_t));
    for (size_t i = 0; values && i < n * k; ++i)
        values[i] = f32_to_bf16((float)q[i] * scales[i / k]);
    return values;
}

/* Packs weight `tensor` [n, k] for the kernel path, in memory placed like the tower: I8 where it is stored
 * so (unless the model asks for BF16) or where the model asks for I8 and the layer may be, else BF16;
 * stored weights of the other kind are converted first. */
static bool prepare_linear(tower_t *tower, uform_model_t const *model,
                           checkpoint_schema_tensor_t const *tensor, tower_linear_t *layer) {
    checkpoint_tensor_t const *stored = NULL;
    void const *values = model_tensor(model, tensor->name, &stored);
    char scales_name[sizeof tensor->name + sizeof CHECKPOINT_SCALE_SUFFIX];
    snprintf(scales_name, sizeof scales_name, "%s%s", tensor->name, CHECKPOINT_SCALE_SUFFIX);
    float const *scales = model_tensor(model, scales_name, NULL); /* stored I8 only */
    size_t const n = (size_t)tensor->shape[0], k = (size_t)tensor->shape[1];
    bool const stored_i8 = stored->dtype == CHECKPOINT_I8;
    *layer = (tower_linear_t){.n = n, .k = k};
    layer->i8 = stored_i8 ? model->weights != UFORM_WEIGHTS_BF16
                          : model->weights == UFORM_WEIGHTS_I8 && checkpoint_quantizable(tensor);
    void *converted = layer->i8 == stored_i8 ? NULL
                      : stored_i8            ? (void *)widen_weights(values, scales, n, k)
                                             : (void *)quantize_weights(values, n, k);
    if (layer->i8 != stored_i8 && !converted) return false;
    if (converted) values = converted;
    if (converted && layer->i8) scales = (float const *)(void const *)((int8_t const *)converted + n * k);
    size_t bytes = linear_packed_size(tower, layer);
    layer->packed = executor_allocate(tower->placement, bytes);
    if (layer->packed && layer->i8) tower->kernels->gemm_i8_pack(layer->packed, values, scales, n, k);
    if (layer->packed && !layer->i8) tower->kernels->gemm_pack(layer->packed, values, n, k);
    if (layer->i8 && k > tower->i8_inputs) tower->i8_inputs = k;
    tower->bytes += bytes;
    free(converted);
    return layer->packed != NULL;
}

static void release_linear(tower_t *tower, tower_linear_t *layer) {
    executor_deallocate(tower->placement, layer->packed, linear_packed_size(tower, layer));
    executor_deallocate(tower->placement, layer->bias, layer->n * sizeof(float));
}

/* The input of a patch tower: its layer packed and its bias in F32 (beside the tower's bytes), and
 * the positions with the class token (met before them in the schema) added to row 0. */
static bool prepare_patches(tower_t *tower, checkpoint_schema_tensor_t const *tensor, uint16_t const *values,
                            uint16_t const **cls) {
    tower_patches_t *patches = &tower->patches;
    kernels_t const *kernels = tower->kernels;
    size_t const hidden = tower->hidden;
    switch (tensor->part) {
    case CHECKPOINT_PART_PATCH_WEIGHT:
        patches->patch.n = hidden;
        patches->patch.k = (size_t)tensor->shape[1];
        patches->packed_bytes = kernels->gemm_packed_size(hidden, patches->patch.k);
        if (!(patches->patch.packed = executor_allocate(tower->placement, patches->packed_bytes)))
            return false;
        kernels->gemm_pack(patches->patch.packed, values, hidden, patches->patch.k);
        return true;
    case CHECKPOINT_PART_PATCH_BIAS:
        if (!(patches->patch.bias = malloc(hidden * sizeof(float)))) return false;
        kernels->bf16_to_f32(patches->patch.bias, values, hidden);
        return true;
    case CHECKPOINT_PART_CLS:
        *cls = values;
        return true;
    default: { /* CHECKPOINT_PART_POS */
        size_t const rows = (size_t)tensor->shape[0];
        float *class_token = malloc(hidden * sizeof(float));
        patches->positions = malloc(rows * hidden * sizeof(float));
        if (!patches->positions || !class_token) {
            free(class_token);
            return false;
        }
        kernels->bf16_to_f32(patches->positions, values, rows * hidden);
        kernels->bf16_to_f32(class_token, *cls, hidden);
        for (size_t h = 0; h < hidden; ++h)
            patches->positions[h] += class_token[h];
        free(class_token);
        return true;
    }
    }
}

typedef struct prepare_walk {
    tower_t *tower;
    uform_model_t const *model;
    uint16_t const *cls; /* the class token, until the positions come */
} prepare_walk_t;

/* Where a part of the schema goes: an F32 vector (norms, biases) or a packed layer (weights); neither
 * for a patch tower's input and text.embed. */
typedef struct part_place {
    float **vector;
    tower_linear_t *layer;
} part_place_t;

static part_place_t part_place(tower_t *tower, tower_block_t *block, checkpoint_part_t part) {
    part_place_t const places[] = {
        [CHECKPOINT_PART_NORM1] = {.vector = &block->norm1},
        [CHECKPOINT_PART_NORM2] = {.vector = &block->norm2},
        [CHECKPOINT_PART_QKV_WEIGHT] = {.layer = &block->qkv},
        [CHECKPOINT_PART_QKV_BIAS] = {.vector = &block->qkv.bias},
        [CHECKPOINT_PART_OUT_WEIGHT] = {.layer = &block->out},
        [CHECKPOINT_PART_OUT_BIAS] = {.vector = &block->out.bias},
        [CHECKPOINT_PART_UP_WEIGHT] = {.layer = &block->up},
        [CHECKPOINT_PART_UP_BIAS] = {.vector = &block->up.bias},
        [CHECKPOINT_PART_DOWN_WEIGHT] = {.layer = &block->down},
        [CHECKPOINT_PART_DOWN_BIAS] = {.vector = &block->down.bias},
        [CHECKPOINT_PART_NORM] = {.vector = &tower->norm},
        [CHECKPOINT_PART_PROJ] = {.layer = &tower->proj},
    };
    return (size_t)part < sizeof places / sizeof places[0] ? places[part] : (part_place_t){NULL, NULL};
}

/* One tensor of the tower's schema into its place. Names and shapes are checked by the checkpoint
 * parser; a failure here can only be memory (answered nonzero). text.embed stays in the checkpoint's
 * memory, where the text verbs read its rows (tower->embed). */
static int prepare_visit(checkpoint_schema_tensor_t const *tensor, void *context) {
    prepare_walk_t *walk = context;
    tower_t *tower = walk->tower;
    uint16_t const *values = model_tensor(walk->model, tensor->name, NULL);
    size_t const n = (size_t)tensor->shape[0];
    part_place_t const place = part_place(tower, &tower->blocks[tensor->block], tensor->part);
    if (place.vector) return !(*place.vector = prepare_vector(tower, values, n));
    if (place.layer) return !prepare_linear(tower, walk->model, tensor, place.layer);
    switch (tensor->part) {
    case CHECKPOINT_PART_PATCH_WEIGHT:
    case CHECKPOINT_PART_PATCH_BIAS:
    case CHECKPOINT_PART_CLS:
    case CHECKPOINT_PART_POS:
        return !prepare_patches(tower, tensor, values, &walk->cls);
    default: /* text.embed */
        tower->embed = values;
        return 0;
    }
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
    prepare_walk_t walk = {tower, model, NULL};
    if (!tower->blocks || checkpoint_schema_tower(&model->header.info, name, prepare_visit, &walk)) {
        tower_release(tower);
        return UFORM_OUT_OF_MEMORY;
    }
    return UFORM_OK;
}

/* ---- Scratch ------------------------------------------------------------------------------------ */

typedef struct scratch_layout {
    float *h;            /* [tokens, hidden]: norm outputs and attention outputs */
    float *qkv;          /* [tokens, 3 * hidden] */
    float *mlp;          /* [tokens, mlp] */
    uint32_t *positions; /* [tokens]: the position of each token within its item */
    tower_quantized_t
        quantized; /* towers with I8 layers: [tokens, k] of the widest, each row's scale and zero */
} scratch_layout_t;

static scratch_layout_t scratch_layout(tower_t const *tower, void *scratch, size_t tokens, size_t *bytes) {
    size_t const sizes[] = {
        round_up_64(tokens * tower->hidden * sizeof(float)),
        round_up_64(tokens * 3 * tower->hidden * sizeof(float)),
        round_up_64(tokens * tower->mlp * sizeof(float)),
        round_up_64(tokens * sizeof(uint32_t)),
        round_up_64(tokens * tower->i8_inputs),
        round_up_64(tower->i8_inputs ? tokens * sizeof(float) : 0),
        round_up_64(tower->i8_inputs ? tokens * sizeof(int32_t) : 0),
    };
    size_t at[sizeof sizes / sizeof sizes[0] + 1] = {0};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i)
        at[i + 1] = at[i] + sizes[i];
    *bytes = at[sizeof sizes / sizeof sizes[0]];
    char *base = scratch;
    if (!base) return (scratch_layout_t){0};
    return (scratch_layout_t){
        .h = (float *)base,
        .qkv = (float *)(void *)(base + at[1]),
        .mlp = (float *)(void *)(base + at[2]),
        .positions = (uint32_t *)(void *)(base + at[3]),
        .quantized = {.rows = (uint8_t *)(base + at[4]),
                      .scales = (float *)(void *)(base + at[5]),
                      .zeros = (int32_t *)(void *)(base + at[6])},
    };
}

size_t tower_scratch_bytes(tower_t const *tower, size_t tokens) {
    size_t bytes = 0;
    scratch_layout(tower, NULL, tokens, &bytes);
    return bytes;
}

/* ---- Linear layers ------------------------------------------------------------------------------ */

/* The GEMM of `layer` over `tokens` rows of h[tokens, k] into y[tokens, n]: y = h W^T + b, before the
 * caller adds a residual or an epilogue. */
static kernel_gemm_t layer_gemm(tower_linear_t const *layer, size_t tokens, float const *h, float *y) {
    return (kernel_gemm_t){.m = tokens,
                           .n = layer->n,
                           .k = layer->k,
                           .x = h,
                           .x_stride = layer->k,
                           .w = layer->packed,
                           .bias = layer->bias,
                           .y = y,
                           .y_stride = layer->n};
}

/* A prefix of `layer`'s outputs (n_out of them: a projection at a matryoshka width) over rows of x at
 * their own strides. */
void tower_linear(tower_t const *tower, uform_executor_t *executor, tower_linear_t const *layer,
                  float const *x, size_t x_stride, size_t m, size_t n_out, float *y, size_t y_stride) {
    kernel_gemm_t gemm = layer_gemm(layer, m, x, y);
    gemm.n = n_out;
    gemm.x_stride = x_stride;
    gemm.y_stride = y_stride;
    tower_fork_gemm(tower->kernels, executor, &gemm);
}

/* A block's layer over `gemm`'s rows: the BF16 GEMM, or the rows quantized into `quantized` and the I8
 * GEMM. */
static void block_linear(tower_t const *tower, uform_executor_t *executor, tower_linear_t const *layer,
                         kernel_gemm_t const *gemm, tower_quantized_t const *quantized) {
    if (layer->i8)
        tower_fork_gemm_i8(tower->kernels, executor, gemm, quantized);
    else
        tower_fork_gemm(tower->kernels, executor, gemm);
}

/* x[tokens, n] += h[tokens, k] W^T + b: a layer writing into the residual stream. */
static void linear_residual(tower_t const *tower, uform_executor_t *executor, tower_linear_t const *layer,
                            size_t tokens, float const *h, float *x, tower_quantized_t const *quantized) {
    kernel_gemm_t gemm = layer_gemm(layer, tokens, h, x);
    gemm.residual = x;
    gemm.residual_stride = layer->n;
    block_linear(tower, executor, layer, &gemm, quantized);
}

/* y[tokens, n] = gelu(h[tokens, k] W^T + b). */
static void linear_gelu(tower_t const *tower, uform_executor_t *executor, tower_linear_t const *layer,
                        size_t tokens, float const *h, float *y, tower_quantized_t const *quantized) {
    kernel_gemm_t gemm = layer_gemm(layer, tokens, h, y);
    gemm.epilogue = KERNEL_EPILOGUE_GELU;
    block_linear(tower, executor, layer, &gemm, quantized);
}

/* ---- Forward ------------------------------------------------------------------------------------ */

void tower_forward(tower_t const *tower, uform_executor_t *executor, tower_batch_t const *batch) {
    size_t bytes = 0, hidden = tower->hidden, tokens = batch->tokens;
    scratch_layout_t scratch = scratch_layout(tower, batch->scratch, tokens, &bytes);
    tower_quantized_t const *quantized = &scratch.quantized;
    tower_fork_positions(batch->offsets, batch->items, scratch.positions);
    tower_fork_t fork = {.kernels = tower->kernels,
                         .hidden = hidden,
                         .heads = tower->heads,
                         .mlp = tower->mlp,
                         .tokens = tokens,
                         .items = batch->items,
                         .offsets = batch->offsets,
                         .positions = scratch.positions,
                         .causal = batch->causal};
    float *x = batch->x;
    for (size_t i = 0; i < tower->depth; ++i) {
        tower_block_t const *block = &tower->blocks[i];
        /* h = rms1(x); qkv = rope(h Wqkv^T + b)                             [tokens, 3 * hidden] */
        tower_fork_rows(&fork, executor, TOWER_ROWS_RMSNORM, x, block->norm1, scratch.h);
        kernel_gemm_t qkv = layer_gemm(&block->qkv, tokens, scratch.h, scratch.qkv);
        block_linear(tower, executor, &block->qkv, &qkv, quantized);
        if (batch->rotary) tower_fork_rows(&fork, executor, TOWER_ROWS_ROPE, NULL, NULL, scratch.qkv);
        /* h = attention(q, k, v); x += h Wout^T + b                          [tokens, hidden] */
        tower_fork_attention(&fork, executor, scratch.qkv, scratch.h);
        linear_residual(tower, executor, &block->out, tokens, scratch.h, x, quantized);
        /* h = rms2(x); mlp = gelu(h Wup^T + b); x += mlp Wdown^T + b          [tokens, mlp] */
        tower_fork_rows(&fork, executor, TOWER_ROWS_RMSNORM, x, block->norm2, scratch.h);
        linear_gelu(tower, executor, &block->up, tokens, scratch.h, scratch.mlp, quantized);
        linear_residual(tower, executor, &block->down, tokens, scratch.mlp, x, quantized);
    }
    /* x = rms(x) with the final norm */
    tower_fork_rows(&fork, executor, TOWER_ROWS_RMSNORM, x, tower->norm, x);
}

/* ---- Patch towers ------------------------------------------------------------------------------- */

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
