/* uform_tiny_checkpoint: a small, seeded, fully valid format-4 checkpoint with every tower.
 *
 * Weights are drawn from a splitmix64 stream in the order the tensors are written, as
 * N(0, 0.02) approximated by a scaled sum of four uniforms (pure double arithmetic, no libm, so the
 * same seed writes the same bytes on every platform); norm weights are 1. Values are rounded to BF16
 * to nearest, ties to even. */
#include "checkpoint.h"
#include "errors.h"
#include "kernels.h"
#include "seeded.h"
#include "tiny_checkpoint.h"
#include "variant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TINY_ENTRY      "uform_tiny_checkpoint"
#define TINY_NAME_SIZE  64
#define TINY_HIDDEN     64
#define TINY_STD        0.02f
#define TINY_LOG_10     2.302585092994045684f /* logit.scale: exp(scale) = 10 */
#define TINY_LOGIT_BIAS (-10.0f)

/* The shapes of every tower, from the arguments. */
typedef struct tiny_sizes {
    size_t depth, hidden, heads, mlp, dims;
    size_t context;                                            /* text */
    size_t size, patch;                                        /* image */
    size_t frames;                                             /* video */
    size_t rate, mels, window, hop, patch_frames, max_patches; /* audio */
    double seconds;
} tiny_sizes_t;

/* Tensors gathered before writing: sources, their names and their BF16 buffers. */
typedef struct tiny_builder {
    checkpoint_source_t *sources;
    char (*names)[TINY_NAME_SIZE];
    uint16_t **buffers;
    size_t count, capacity;
    uint64_t random;
} tiny_builder_t;

/* ---------------------------------------------------------------------------------------------- */
/* Numbers                                                                                        */
/* ---------------------------------------------------------------------------------------------- */

static uint16_t bf16_from_f32(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((bits >> 16) | 0x0040u); /* quiet NaN */
    bits += 0x7FFFu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

/* ---------------------------------------------------------------------------------------------- */
/* Tensors                                                                                        */
/* ---------------------------------------------------------------------------------------------- */

static uform_status_t builder_init(tiny_builder_t *builder, size_t capacity, uint64_t seed) {
    memset(builder, 0, sizeof *builder);
    builder->sources = calloc(capacity, sizeof *builder->sources);
    builder->names = calloc(capacity, sizeof *builder->names);
    builder->buffers = calloc(capacity, sizeof *builder->buffers);
    builder->capacity = capacity;
    builder->random = seed;
    if (!builder->sources || !builder->names || !builder->buffers)
        return failed(UFORM_OUT_OF_MEMORY, TINY_ENTRY, "out of memory");
    return UFORM_OK;
}

static void builder_free(tiny_builder_t *builder) {
    for (size_t i = 0; builder->buffers && i < builder->count; i++)
        free(builder->buffers[i]);
    free(builder->sources);
    free(builder->names);
    free(builder->buffers);
    memset(builder, 0, sizeof *builder);
}

/* A BF16 tensor of shape [rows] (columns == 0) or [rows, columns], each value
 * `offset + scale * N(0, 1)`; no draws when `scale` is 0. */
static uform_status_t builder_add(tiny_builder_t *builder, char const *name, size_t rows, size_t columns,
                                  float offset, float scale) {
    if (builder->count == builder->capacity)
        return failed(UFORM_INTERNAL, TINY_ENTRY, "tensor count miscounted");
    size_t elements = 0, bytes = 0;
    uint16_t *buffer = NULL;
    if (!__builtin_mul_overflow(rows, columns ? columns : 1, &elements) &&
        !__builtin_mul_overflow(elements, sizeof *buffer, &bytes))
        buffer = malloc(bytes);
    if (!buffer) return failed(UFORM_OUT_OF_MEMORY, TINY_ENTRY, "out of memory");
    for (size_t i = 0; i < elements; i++) {
        double noise = scale != 0 ? standard_normal(&builder->random) : 0;
        buffer[i] = bf16_from_f32((float)(offset + scale * noise));
    }
    size_t index = builder->count++;
    builder->buffers[index] = buffer;
    snprintf(builder->names[index], TINY_NAME_SIZE, "%s", name);
    builder->sources[index] = (checkpoint_source_t){
        .name = builder->names[index],
        .dtype = CHECKPOINT_BF16,
        .rank = columns ? 2 : 1,
        .shape = {rows, columns},
        .data = buffer,
    };
    return UFORM_OK;
}

/* One tensor of the schema: norm weights 1, logit.scale log 10, logit.bias -10, everything else noise. */
static int add_visit(checkpoint_schema_tensor_t const *tensor, void *context) {
    float offset = 0, scale = TINY_STD;
    if (tensor->role == CHECKPOINT_ROLE_NORM) offset = 1, scale = 0;
    if (tensor->role == CHECKPOINT_ROLE_LOGIT_SCALE) offset = TINY_LOG_10, scale = 0;
    if (tensor->role == CHECKPOINT_ROLE_LOGIT_BIAS) offset = TINY_LOGIT_BIAS, scale = 0;
    return (int)builder_add(context, tensor->name, tensor->shape[0], tensor->rank == 2 ? tensor->shape[1] : 0,
                            offset, scale);
}

static int count_visit(checkpoint_schema_tensor_t const *tensor, void *context) {
    (void)tensor;
    ++*(size_t *)context;
    return 0;
}

/* Every tensor of the model, in checkpoint_schema_each's order (the order of the draws). */
static uform_status_t add_tensors(tiny_builder_t *builder, uform_model_info_t const *info) {
    return (uform_status_t)checkpoint_schema_each(info, add_visit, builder);
}

/* ---------------------------------------------------------------------------------------------- */
/* Metadata                                                                                       */
/* ---------------------------------------------------------------------------------------------- */

/* The model the sizes describe, for checkpoint_metadata_text: every tower, CLIP's normalization. */
static uform_model_info_t tiny_info(tiny_sizes_t const *sizes) {
    uform_transformer_info_t const transformer = {sizes->depth, sizes->hidden, sizes->heads, sizes->mlp};
    uform_model_info_t info = {
        .dims = sizes->dims,
        .matryoshka = {sizes->dims / 2, sizes->dims},
        .matryoshka_count = 2,
        .has_text = true,
        .has_image = true,
        .has_video = true,
        .has_audio = true,
        .has_logit = true,
        .text = {transformer, sizes->context},
        .image = {.transformer = transformer, .size = sizes->size, .patch = sizes->patch},
        .video = {sizes->frames},
        .audio = {transformer, sizes->rate, sizes->mels, sizes->window, sizes->hop, sizes->patch_frames,
                  sizes->max_patches, sizes->seconds},
    };
    for (size_t i = 0; i < 3; i++) {
        info.image.mean[i] = (float)checkpoint_clip_mean[i];
        info.image.std[i] = (float)checkpoint_clip_std[i];
    }
    variant_engine_model(&info);
    return info;
}

/* ---------------------------------------------------------------------------------------------- */
/* The verb                                                                                       */
/* ---------------------------------------------------------------------------------------------- */

void tiny_model_sizes(uform_trainer_config_t *config) {
    config->depth = 2;
    config->dims = 64;
    config->context = 64;
    config->image_size = 32;
    config->image_patch = 8;
    config->video_frames = 4;
    config->audio_rate = 16000;
    config->audio_mels = 32;
    config->audio_seconds = 2;
}

/* Every tower shares depth, hidden and mlp; the rest are the small model's sizes, its audio front end
 * docs/DESIGN.md's: window 25 ms, hop 10 ms, 4 frames a patch. */
static tiny_sizes_t tiny_sizes(uform_trainer_config_t const *model, size_t depth, size_t hidden, size_t mlp,
                               size_t context, size_t size, size_t patch) {
    size_t const rate = model->audio_rate;
    tiny_sizes_t sizes = {
        .depth = depth,
        .hidden = hidden,
        .heads = hidden / 64,
        .mlp = mlp,
        .dims = model->dims,
        .context = context,
        .size = size,
        .patch = patch,
        .frames = model->video_frames,
        .rate = rate,
        .mels = model->audio_mels,
        .window = rate / 40,
        .hop = rate / 100,
        .patch_frames = 4,
        .seconds = model->audio_seconds,
    };
    size_t const samples = (size_t)((double)sizes.rate * sizes.seconds);
    sizes.max_patches = (1 + (samples - sizes.window) / sizes.hop) / sizes.patch_frames;
    return sizes;
}

UFORM_EXPORT uform_status_t uform_tiny_checkpoint(uform_tiny_checkpoint_args_t const *args) {
    if (!args) return failed(UFORM_INVALID_ARGUMENT, TINY_ENTRY, "args is NULL");
    if (!args->path || args->path[0] == '\0')
        return failed(UFORM_INVALID_ARGUMENT, TINY_ENTRY, "path is empty");
    uform_trainer_config_t model = {0};
    tiny_model_sizes(&model);
    size_t const depth = args->depth ? args->depth : model.depth,
                 hidden = args->hidden ? args->hidden : TINY_HIDDEN, mlp = args->mlp ? args->mlp : 2 * hidden,
                 context = args->context ? args->context : model.context,
                 image_size = args->image_size ? args->image_size : model.image_size,
                 image_patch = args->image_patch ? args->image_patch : model.image_patch;
    if (hidden % 64 != 0) return failed(UFORM_INVALID_ARGUMENT, TINY_ENTRY, "hidden is not a multiple of 64");
    if (hidden > 65536) return failed(UFORM_INVALID_ARGUMENT, TINY_ENTRY, "hidden over 65536");
    if (depth > 1024) return failed(UFORM_INVALID_ARGUMENT, TINY_ENTRY, "depth over 1024");
    if (mlp > (1u << 20)) return failed(UFORM_INVALID_ARGUMENT, TINY_ENTRY, "mlp over 1048576");
    if (context > (1u << 24)) return failed(UFORM_INVALID_ARGUMENT, TINY_ENTRY, "context over 16777216");
    if (image_size > 4096 || image_size % image_patch != 0)
        return failed(UFORM_INVALID_ARGUMENT, TINY_ENTRY,
                      "image_size over 4096 or not a multiple of image_patch");

    tiny_sizes_t const sizes = tiny_sizes(&model, depth, hidden, mlp, context, image_size, image_patch);
    uform_model_info_t const info = tiny_info(&sizes);
    size_t count = 0;
    checkpoint_schema_each(&info, count_visit, &count);
    tiny_builder_t builder;
    char *metadata = NULL;
    char const *message = NULL;
    uform_status_t status = builder_init(&builder, count, args->seed);
    if (status != UFORM_OK) goto fail;
    status = add_tensors(&builder, &info);
    if (status != UFORM_OK) goto fail;
    metadata = checkpoint_metadata_text(&info, NULL);
    if (!metadata) {
        status = failed(UFORM_OUT_OF_MEMORY, TINY_ENTRY, "out of memory");
        goto fail;
    }
    status = checkpoint_write(args->path, metadata, builder.sources, builder.count, &message);
    if (status != UFORM_OK) failed(status, TINY_ENTRY, message);
fail:
    free(metadata);
    builder_free(&builder);
    return status;
}
