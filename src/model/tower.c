/* The shared transformer: preparing weights for the kernel path (walking the tower's tensors in the
 * checkpoint schema), and the forward pass, its work split by tower_fork.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "executor.h"
#include "kernels.h"
#include "model.h"
#include "tower.h"
#include "tower_fork.h"
#include "variant.h"

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
static int8_t *quantize_weights(kernels_t const *kernels, uint16_t const *values, size_t n, size_t k) {
    int8_t *q = malloc(n * k + n * sizeof(float));
    for (size_t row = 0; q && row < n; ++row) {
        float scale;
        kernels->quantize_weights(q + row * k, &scale, values + row * k, k);
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
                                             : (void *)quantize_weights(tower->kernels, values, n, k);
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
        patches->leading = (tower->settings.class_token ? 1 : 0) + tower->settings.registers;
        float *class_token = malloc(hidden * sizeof(float));
        patches->positions = malloc(rows * hidden * sizeof(float));
        if (!patches->positions || !class_token) {
            free(class_token);
            return false;
        }
        kernels->bf16_to_f32(patches->positions, values, rows * hidden);
        if (*cls) kernels->bf16_to_f32(class_token, *cls, hidden);
        for (size_t h = 0; *cls && h < hidden; ++h)
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
        [CHECKPOINT_PART_NORM1] = {.vector = &block->norm1.weight},
        [CHECKPOINT_PART_NORM1_BIAS] = {.vector = &block->norm1.bias},
        [CHECKPOINT_PART_NORM2] = {.vector = &block->norm2.weight},
        [CHECKPOINT_PART_NORM2_BIAS] = {.vector = &block->norm2.bias},
        [CHECKPOINT_PART_NORM_BIAS] = {.vector = &tower->norm.bias},
        [CHECKPOINT_PART_INPUT_NORM] = {.vector = &tower->input_norm.weight},
        [CHECKPOINT_PART_INPUT_NORM_BIAS] = {.vector = &tower->input_norm.bias},
        [CHECKPOINT_PART_TEXT_POSITIONS] = {.vector = &tower->positions},
        [CHECKPOINT_PART_TOKEN_TYPE] = {.vector = &tower->token_type},
        [CHECKPOINT_PART_PROJ_BIAS] = {.vector = &tower->proj.bias},
        [CHECKPOINT_PART_RELATIVE_BIAS] = {.vector = &tower->relative_bias},
        [CHECKPOINT_PART_HEAD_PROBE] = {.vector = &tower->head.probe},
        [CHECKPOINT_PART_HEAD_QKV_WEIGHT] = {.layer = &tower->head.qkv},
        [CHECKPOINT_PART_HEAD_QKV_BIAS] = {.vector = &tower->head.qkv.bias},
        [CHECKPOINT_PART_HEAD_OUT_WEIGHT] = {.layer = &tower->head.out},
        [CHECKPOINT_PART_HEAD_OUT_BIAS] = {.vector = &tower->head.out.bias},
        [CHECKPOINT_PART_HEAD_NORM] = {.vector = &tower->head_norm.weight},
        [CHECKPOINT_PART_HEAD_NORM_BIAS] = {.vector = &tower->head_norm.bias},
        [CHECKPOINT_PART_HEAD_UP_WEIGHT] = {.layer = &tower->head.up},
        [CHECKPOINT_PART_HEAD_UP_BIAS] = {.vector = &tower->head.up.bias},
        [CHECKPOINT_PART_HEAD_DOWN_WEIGHT] = {.layer = &tower->head.down},
        [CHECKPOINT_PART_HEAD_DOWN_BIAS] = {.vector = &tower->head.down.bias},
        [CHECKPOINT_PART_QKV_WEIGHT] = {.layer = &block->qkv},
        [CHECKPOINT_PART_QKV_BIAS] = {.vector = &block->qkv.bias},
        [CHECKPOINT_PART_OUT_WEIGHT] = {.layer = &block->out},
        [CHECKPOINT_PART_OUT_BIAS] = {.vector = &block->out.bias},
        [CHECKPOINT_PART_UP_WEIGHT] = {.layer = &block->up},
        [CHECKPOINT_PART_UP_BIAS] = {.vector = &block->up.bias},
        [CHECKPOINT_PART_DOWN_WEIGHT] = {.layer = &block->down},
        [CHECKPOINT_PART_DOWN_BIAS] = {.vector = &block->down.bias},
        [CHECKPOINT_PART_NORM] = {.vector = &tower->norm.weight},
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
    size_t const n = (size_t)tensor->shape[0] * (tensor->rank == 2 ? (size_t)tensor->shape[1] : 1);
    part_place_t const place = part_place(tower, &tower->blocks[tensor->block], tensor->part);
    if (tensor->part == CHECKPOINT_PART_TEXT_POSITIONS) tower->positions_count = (size_t)tensor->shape[0];
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

static void release_norm(tower_t *tower, tower_norm_t *norm) {
    executor_deallocate(tower->placement, norm->weight, tower->hidden * sizeof(float));
    executor_deallocate(tower->placement, norm->bias, tower->hidden * sizeof(float));
}

void tower_release(tower_t *tower) {
    if (!tower->kernels) return;
    for (size_t i = 0; tower->blocks && i < tower->depth; ++i) {
        tower_block_t *block = &tower->blocks[i];
        release_norm(tower, &block->norm1);
        release_norm(tower, &block->norm2);
        release_linear(tower, &block->qkv);
        release_linear(tower, &block->out);
        release_linear(tower, &block->up);
        release_linear(tower, &block->down);
    }
    free(tower->blocks);
    release_norm(tower, &tower->norm);
    release_norm(tower, &tower->input_norm);
    executor_deallocate(tower->placement, tower->positions,
                        tower->positions_count * tower->hidden * sizeof(float));
    executor_deallocate(tower->placement, tower->token_type, tower->hidden * sizeof(float));
    executor_deallocate(tower->placement, tower->relative_bias,
                        tower->settings.relative_buckets * tower->heads * sizeof(float));
    if (tower->proj.packed) release_linear(tower, &tower->proj);
    tower_linear_t *head[] = {&tower->head.qkv, &tower->head.out, &tower->head.up, &tower->head.down};
    for (size_t i = 0; i < 4; ++i)
        if (head[i]->packed) release_linear(tower, head[i]);
    executor_deallocate(tower->placement, tower->head.probe, tower->hidden * sizeof(float));
    release_norm(tower, &tower->head_norm);
    tower_patches_release(&tower->patches, tower->placement);
    memset(tower, 0, sizeof *tower);
}

static size_t chunk_tokens(tower_t const *tower) {
    size_t const sample = TOWER_CHUNK_TOKENS_MAX;
    size_t row_bytes =
        (tower_scratch_bytes(tower, sample, 1) + sample * tower->hidden * sizeof(float)) / sample;
    size_t tokens = TOWER_CHUNK_BYTES / (row_bytes ? row_bytes : 1);
    return tokens < TOWER_CHUNK_TOKENS_MIN   ? TOWER_CHUNK_TOKENS_MIN
           : tokens > TOWER_CHUNK_TOKENS_MAX ? TOWER_CHUNK_TOKENS_MAX
                                             : tokens;
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
    tower->settings = *info;
    tower->dims = info->projection ? model->header.info.dims : info->hidden;
    tower->blocks = calloc(tower->depth, sizeof *tower->blocks);
    prepare_walk_t walk = {tower, model, NULL};
    if (!tower->blocks || checkpoint_schema_tower(&model->header.info, name, prepare_visit, &walk)) {
        tower_release(tower);
        return UFORM_OUT_OF_MEMORY;
    }
    tower->chunk_tokens = chunk_tokens(tower);
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
    void *attention;        /* [threads][attention_bytes]: each thread's attention scratch */
    size_t attention_bytes; /* each thread's: 0 where the attention does not round */
    float *relative;        /* with a bias by relative position: [heads][relative_span(tokens)] */
} scratch_layout_t;

/* The distances a head's table of the bias by relative position spans for items of up to `rows` rows:
 * -(rows - 1) to rows - 1 + KERNEL_ATTENTION_BIAS_LANES - 1 (kernel_attention_t.bias). */
static size_t relative_span(size_t rows) {
    return 2 * rows - 1 + KERNEL_ATTENTION_BIAS_LANES - 1;
}

/* Each thread's attention scratch for items of up to `tokens` rows: what the longest takes, up to
 * KERNEL_ATTENTION_SCRATCH; none where the tower's attention does not round (it never uses any). */
static size_t attention_scratch_bytes(tower_t const *tower, size_t tokens) {
    if (!kernel_attention_rounds(tower->kernels)) return 0;
    size_t bytes =
        kernel_attention_scratch_bytes(tokens, tower->settings.head ? tower->settings.head : KERNEL_HEAD);
    return round_up_64(bytes < KERNEL_ATTENTION_SCRATCH ? bytes : KERNEL_ATTENTION_SCRATCH);
}

static scratch_layout_t scratch_layout(tower_t const *tower, void *scratch, size_t tokens, size_t threads,
                                       size_t *bytes) {
    size_t const attention = attention_scratch_bytes(tower, tokens);
    size_t const sizes[] = {
        round_up_64(tokens * tower->hidden * sizeof(float)),
        round_up_64(tokens * 3 * tower->hidden * sizeof(float)),
        round_up_64(tokens * tower->mlp * sizeof(float)),
        round_up_64(tokens * sizeof(uint32_t)),
        round_up_64(tokens * tower->i8_inputs),
        round_up_64(tower->i8_inputs ? tokens * sizeof(float) : 0),
        round_up_64(tower->i8_inputs ? tokens * sizeof(int32_t) : 0),
        threads * attention,
        round_up_64(tower->relative_bias ? tower->heads * relative_span(tokens) * sizeof(float) : 0),
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
        .attention = attention ? base + at[7] : NULL,
        .attention_bytes = attention,
        .relative = tower->relative_bias ? (float *)(void *)(base + at[8]) : NULL,
    };
}

size_t tower_scratch_bytes(tower_t const *tower, size_t tokens, size_t threads) {
    size_t bytes = 0;
    scratch_layout(tower, NULL, tokens, threads, &bytes);
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

void tower_project(tower_t const *tower, uform_executor_t *executor, float const *x, size_t x_stride,
                   size_t m, size_t n_out, float *y, size_t y_stride) {
    if (tower->proj.packed) {
        tower_linear(tower, executor, &tower->proj, x, x_stride, m, n_out, y, y_stride);
        for (size_t r = 0; tower->settings.projection_tanh && r < m; ++r)
            for (size_t c = 0; c < n_out; ++c)
                y[r * y_stride + c] = tanhf(y[r * y_stride + c]);
        return;
    }
    for (size_t r = 0; r < m; ++r)
        memmove(y + r * y_stride, x + r * x_stride, n_out * sizeof(float));
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

/* The GEMM epilogue of the tower's activation. */
static kernel_epilogue_t activation_epilogue(uform_activation_t activation) {
    switch (activation) {
    case UFORM_ACTIVATION_GELU_ERF:
        return KERNEL_EPILOGUE_GELU_ERF;
    case UFORM_ACTIVATION_GELU_QUICK:
        return KERNEL_EPILOGUE_GELU_QUICK;
    default:
        return KERNEL_EPILOGUE_GELU;
    }
}

/* y[tokens, n] = act(h[tokens, k] W^T + b), the tower's activation. */
static void linear_activation(tower_t const *tower, uform_executor_t *executor, tower_linear_t const *layer,
                              size_t tokens, float const *h, float *y, tower_quantized_t const *quantized) {
    kernel_gemm_t gemm = layer_gemm(layer, tokens, h, y);
    gemm.epilogue = activation_epilogue(tower->settings.activation);
    block_linear(tower, executor, layer, &gemm, quantized);
}

/* to = norm(from) with the tower's kind of norm: RMSNorm, or LayerNorm with its bias. */
static void tower_norm(tower_t const *tower, tower_fork_t const *fork, uform_executor_t *executor,
                       tower_norm_t const *norm, float const *from, float *to) {
    if (tower->settings.norm == UFORM_NORM_LAYER)
        tower_fork_norm(fork, executor, from, norm->weight, norm->bias, to);
    else
        tower_fork_rows(fork, executor, TOWER_ROWS_RMSNORM, from, norm->weight, to);
}

/* ---- Forward ------------------------------------------------------------------------------------ */

/* Each head's table of the bias by relative position for items of up to `rows` rows into `tables`
 * [heads][relative_span(rows)]; answers the table's stride. Head h's bias at distance d (query row minus
 * key row) is relative_bias[bucket(d), h]. */
static size_t relative_tables(tower_t const *tower, size_t rows, float *tables) {
    size_t const span = relative_span(rows), heads = tower->heads;
    for (size_t at = 0; at < span; ++at) {
        float const *row =
            tower->relative_bias + variant_relative_bucket((long)at - (long)(rows - 1)) * heads;
        for (size_t h = 0; h < heads; ++h)
            tables[h * span + at] = row[h];
    }
    return span;
}

void tower_forward(tower_t const *tower, uform_executor_t *executor, tower_batch_t const *batch) {
    size_t bytes = 0, hidden = tower->hidden, tokens = batch->tokens;
    scratch_layout_t scratch = scratch_layout(tower, batch->scratch, tokens, batch->threads, &bytes);
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
                         .causal = tower->settings.causal,
                         .head = tower->settings.head,
                         .norm_eps = tower->settings.norm_eps,
                         .attention_scratch = scratch.attention,
                         .attention_scratch_bytes = scratch.attention_bytes,
                         .attention_threads = batch->threads};
    if (scratch.relative) {
        size_t longest = 0;
        for (size_t item = 0; item < batch->items; ++item)
            if (batch->offsets[item + 1] - batch->offsets[item] > longest)
                longest = batch->offsets[item + 1] - batch->offsets[item];
        if (longest) {
            fork.relative_stride = relative_tables(tower, longest, scratch.relative);
            fork.relative = scratch.relative + (longest - 1); /* each head's table at distance 0 */
        }
    }
    float *x = batch->x;
    bool const post = tower->settings.post_norm;
    if (tower->settings.input_norm) tower_norm(tower, &fork, executor, &tower->input_norm, x, x);
    for (size_t i = 0; i < tower->depth; ++i) {
        tower_block_t const *block = &tower->blocks[i];
        /* qkv = rope(h Wqkv^T + b), h = norm1(x) before the branch, x itself after [tokens, 3 * hidden] */
        float const *in = x;
        if (!post) tower_norm(tower, &fork, executor, &block->norm1, x, scratch.h);
        if (!post) in = scratch.h;
        kernel_gemm_t qkv = layer_gemm(&block->qkv, tokens, in, scratch.qkv);
        block_linear(tower, executor, &block->qkv, &qkv, quantized);
        if (tower->settings.rotary)
            tower_fork_rows(&fork, executor, TOWER_ROWS_ROPE, NULL, NULL, scratch.qkv);
        /* h = attention(q, k, v); x += h Wout^T + b (then x = norm1(x) after)   [tokens, hidden] */
        tower_fork_attention(&fork, executor, scratch.qkv, scratch.h);
        linear_residual(tower, executor, &block->out, tokens, scratch.h, x, quantized);
        if (post) tower_norm(tower, &fork, executor, &block->norm1, x, x);
        /* mlp = act(h Wup^T + b), h = norm2(x) or x; x += mlp Wdown^T + b         [tokens, mlp] */
        in = x;
        if (!post) tower_norm(tower, &fork, executor, &block->norm2, x, scratch.h);
        if (!post) in = scratch.h;
        linear_activation(tower, executor, &block->up, tokens, in, scratch.mlp, quantized);
        linear_residual(tower, executor, &block->down, tokens, scratch.mlp, x, quantized);
        if (post) tower_norm(tower, &fork, executor, &block->norm2, x, x);
    }
    /* x = norm(x) with the final norm */
    if (tower->settings.final_norm) tower_norm(tower, &fork, executor, &tower->norm, x, x);
}

/* ---- Patch towers ------------------------------------------------------------------------------- */

size_t tower_head_scratch_bytes(tower_t const *tower, size_t tokens, size_t items);

void tower_patches_release(tower_patches_t *patches, uform_executor_t *executor) {
    executor_deallocate(executor, patches->patch.packed, patches->packed_bytes);
    free(patches->patch.bias);
    free(patches->positions);
    memset(patches, 0, sizeof *patches);
}

void tower_patches_tokens(tower_patches_t const *patches, size_t hidden, float const *embedded, size_t count,
                          float *x) {
    size_t const leading = patches->leading;
    if (leading) memcpy(x, patches->positions, leading * hidden * sizeof(float));
    for (size_t p = 0; p < count; ++p) {
        float *token = x + (leading + p) * hidden;
        float const *row = embedded + p * hidden;
        float const *position = patches->positions + (leading + p) * hidden;
        for (size_t h = 0; h < hidden; ++h)
            token[h] = row[h] + position[h];
    }
}

bool tower_patches_scratch(tower_t const *tower, uform_executor_t *executor, size_t images, size_t rows,
                           size_t inputs, size_t pooled, patch_scratch_t *scratch) {
    size_t tokens = rows + images * tower->patches.leading, threads = executor_fork_threads(executor);
    size_t sizes[] = {
        round_up_64(tower_scratch_bytes(tower, tokens, threads)),
        round_up_64(tokens * tower->hidden * sizeof(float)),
        round_up_64(rows * inputs * sizeof(float)),
        round_up_64(rows * tower->hidden * sizeof(float)),
        round_up_64(rows * tower->dims * sizeof(float)),
        round_up_64(pooled * sizeof(float)),
        round_up_64((images + 1) * sizeof(size_t)),
        round_up_64(images * sizeof(size_t)),
        round_up_64(tower_head_scratch_bytes(tower, tokens, images)),
    };
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i)
        total += sizes[i];
    char *base = executor_scratch(executor, total);
    if (!base) return false;
    scratch->tower = base;
    scratch->threads = threads;
    scratch->x = (float *)(void *)(base += sizes[0]);
    scratch->patches = (float *)(void *)(base += sizes[1]);
    scratch->rows = (float *)(void *)(base += sizes[2]);
    scratch->projected = (float *)(void *)(base += sizes[3]);
    scratch->pooled = (float *)(void *)(base += sizes[4]);
    scratch->offsets = (size_t *)(void *)(base += sizes[5]);
    scratch->items = (size_t *)(void *)(base += sizes[6]);
    scratch->head = base + sizes[7];
    return true;
}

void tower_patches_forward(tower_t const *tower, uform_executor_t *executor, patch_scratch_t const *scratch,
                           size_t tokens, size_t items) {
    if (items == 0) return;
    tower_batch_t batch = {
        .tokens = tokens,
        .items = items,
        .offsets = scratch->offsets,
        .x = scratch->x,
        .scratch = scratch->tower,
        .threads = scratch->threads,
    };
    tower_forward(tower, executor, &batch);
}

/* ---- Pooling ------------------------------------------------------------------------------------ */

/* The pooling head's scratch for `tokens` tokens of `items` items: qkv of every token [tokens, 3 hidden],
 * the probe's [3 hidden], then per item the attention's output, the state and the normed state
 * [items, hidden] each, and the MLP's [items, mlp]. */
typedef struct head_scratch {
    float *qkv, *probe, *attended, *state, *normed, *mlp, *scores;
} head_scratch_t;

static head_scratch_t head_layout(tower_t const *tower, void *scratch, size_t tokens, size_t items,
                                  size_t *bytes) {
    size_t const hidden = tower->hidden;
    size_t const sizes[] = {
        round_up_64(tokens * 3 * hidden * sizeof(float)),
        round_up_64(3 * hidden * sizeof(float)),
        round_up_64(items * hidden * sizeof(float)),
        round_up_64(items * hidden * sizeof(float)),
        round_up_64(items * hidden * sizeof(float)),
        round_up_64(items * tower->mlp * sizeof(float)),
        round_up_64(tokens * sizeof(float)),
    };
    size_t at[8] = {0};
    for (size_t i = 0; i < 7; ++i)
        at[i + 1] = at[i] + sizes[i];
    *bytes = tower->settings.pooling == UFORM_POOLING_HEAD ? at[7] : 0;
    char *base = scratch;
    if (!base) return (head_scratch_t){0};
    return (head_scratch_t){(float *)(void *)base,           (float *)(void *)(base + at[1]),
                            (float *)(void *)(base + at[2]), (float *)(void *)(base + at[3]),
                            (float *)(void *)(base + at[4]), (float *)(void *)(base + at[5]),
                            (float *)(void *)(base + at[6])};
}

size_t tower_head_scratch_bytes(tower_t const *tower, size_t tokens, size_t items) {
    size_t bytes = 0;
    head_layout(tower, NULL, tokens, items, &bytes);
    return bytes;
}

/* The attention-pooling head over every item: q from the probe, k and v from the item's tokens, one query
 * per head (scale 1/sqrt(head)), the output projection, then the residual MLP over its norm. */
static void pool_head(tower_t const *tower, uform_executor_t *executor, float const *x, size_t const *offsets,
                      size_t tokens, size_t items, void *scratch, float *pooled) {
    size_t const hidden = tower->hidden, width = tower->settings.head, heads = tower->heads;
    size_t bytes = 0;
    head_scratch_t s = head_layout(tower, scratch, tokens, items, &bytes);
    tower_head_t const *head = &tower->head;
    kernel_gemm_t gemm = layer_gemm(&head->qkv, tokens, x, s.qkv);
    tower_fork_gemm(tower->kernels, executor, &gemm);
    gemm = layer_gemm(&head->qkv, 1, head->probe, s.probe);
    tower_fork_gemm(tower->kernels, executor, &gemm);
    float const scale = (float)(1.0 / sqrt((double)width));
    for (size_t item = 0; item < items; ++item) {
        size_t first = offsets[item], end = offsets[item + 1];
        float *out = s.attended + item * hidden;
        for (size_t h = 0; h < heads; ++h) {
            float const *q = s.probe + h * width;
            float max = -INFINITY, sum = 0;
            for (size_t t = first; t < end; ++t) {
                float const *k = s.qkv + t * 3 * hidden + hidden + h * width;
                float dot = 0;
                for (size_t d = 0; d < width; ++d)
                    dot += q[d] * k[d];
                s.scores[t - first] = dot * scale;
                if (s.scores[t - first] > max) max = s.scores[t - first];
            }
            for (size_t t = first; t < end; ++t)
                sum += s.scores[t - first] = expf(s.scores[t - first] - max);
            float *o = out + h * width;
            memset(o, 0, width * sizeof(float));
            for (size_t t = first; t < end; ++t) {
                float const *v = s.qkv + t * 3 * hidden + 2 * hidden + h * width;
                float const p = s.scores[t - first] / sum;
                for (size_t d = 0; d < width; ++d)
                    o[d] += p * v[d];
            }
        }
    }
    /* state = attended Wout^T + b; normed = norm(state); pooled = state + down(act(up(normed))) */
    gemm = layer_gemm(&head->out, items, s.attended, s.state);
    tower_fork_gemm(tower->kernels, executor, &gemm);
    if (tower->settings.norm == UFORM_NORM_LAYER)
        tower->kernels->layernorm(s.normed, hidden, s.state, hidden, tower->head_norm.weight,
                                  tower->head_norm.bias, items, hidden, tower->settings.norm_eps);
    else
        tower->kernels->rmsnorm(s.normed, hidden, s.state, hidden, tower->head_norm.weight, items, hidden,
                                tower->settings.norm_eps);
    gemm = layer_gemm(&head->up, items, s.normed, s.mlp);
    gemm.epilogue = activation_epilogue(tower->settings.activation);
    tower_fork_gemm(tower->kernels, executor, &gemm);
    gemm = layer_gemm(&head->down, items, s.mlp, pooled);
    gemm.residual = s.state;
    gemm.residual_stride = hidden;
    tower_fork_gemm(tower->kernels, executor, &gemm);
}

void tower_pool(tower_t const *tower, uform_executor_t *executor, float const *x, size_t const *offsets,
                size_t items, uint32_t const *ids, void *scratch, float *pooled) {
    size_t const hidden = tower->hidden;
    if (items == 0) return;
    if (tower->settings.pooling == UFORM_POOLING_HEAD) {
        pool_head(tower, executor, x, offsets, offsets[items] - offsets[0], items, scratch, pooled);
        return;
    }
    for (size_t item = 0; item < items; ++item) {
        size_t first = offsets[item], count = offsets[item + 1] - first, row = first;
        float *out = pooled + item * hidden;
        switch (tower->settings.pooling) {
        case UFORM_POOLING_MEAN:
            memset(out, 0, hidden * sizeof(float));
            for (size_t t = first; t < first + count; ++t)
                for (size_t h = 0; h < hidden; ++h)
                    out[h] += x[t * hidden + h];
            for (size_t h = 0; h < hidden; ++h)
                out[h] /= (float)count;
            continue;
        case UFORM_POOLING_END: /* the first position of the largest id */
            for (size_t t = first + 1; ids && t < first + count; ++t)
                if (ids[t] > ids[row]) row = t;
            break;
        case UFORM_POOLING_LAST:
            row = first + count - 1;
            break;
        default: /* UFORM_POOLING_FIRST */
            break;
        }
        memcpy(out, x + row * hidden, hidden * sizeof(float));
    }
}

void tower_patches_pool(tower_t const *tower, uform_executor_t *executor, patch_scratch_t const *scratch,
                        size_t tokens, size_t items) {
    (void)tokens;
    tower_pool(tower, executor, scratch->x, scratch->offsets, items, NULL, scratch->head, scratch->rows);
}
