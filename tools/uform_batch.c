/* The engine a subcommand holds (a RAM executor, a model, an arena), the one switch from a modality to
 * its verb, and the batches it sends through the verbs: what `encode`, `search`, `eval` and `serve`
 * share. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "uform_command.h"

char const *const command_modality_names[4] = {"text", "image", "video", "audio"}; /* by uform_modality_t */

/* ---- the engine ------------------------------------------------------------------------------- */

int command_engine_open(char const *path, size_t threads, int weights, command_engine_t *engine) {
    *engine = (command_engine_t){0};
    uform_ram_options_t options = uform_ram_options_default();
    options.threads = threads;
    if (uform_executor_create_ram(&options, &engine->executor) != UFORM_OK) goto fail;
    uform_load_config_t config = {.weights = (uform_weights_t)weights};
    uform_model_load_args_t load = {
        .executor = engine->executor, .path = path, .config = &config, .model = &engine->model};
    if (uform_model_load_ram(&load) != UFORM_OK) goto fail;
    if (uform_arena_create(engine->executor, &engine->arena) != UFORM_OK) goto fail;
    if (uform_model_info(engine->model, &engine->info) != UFORM_OK) goto fail;
    return COMMAND_OK;
fail:;
    int code = command_fail_engine(); /* before freeing, which could record errors of its own */
    command_engine_close(engine);
    return code;
}

void command_engine_close(command_engine_t *engine) {
    uform_arena_free(engine->arena);
    uform_model_free(engine->model);
    uform_executor_free(engine->executor);
    *engine = (command_engine_t){0};
}

int command_matryoshka(command_engine_t const *engine, size_t dims, char const *what, size_t *matryoshka) {
    uform_model_info_t const *info = &engine->info;
    *matryoshka = 0;
    if (dims == info->dims) return COMMAND_OK;
    for (size_t i = 0; i < info->matryoshka_count; ++i)
        if (info->matryoshka[i] == dims) {
            *matryoshka = dims;
            return COMMAND_OK;
        }
    char widths[UFORM_MATRYOSHKA_MAX * 21] = "";
    size_t used = 0;
    for (size_t i = 0; i < info->matryoshka_count && used < sizeof widths; ++i)
        used += (size_t)snprintf(widths + used, sizeof widths - used, "%s%zu", i ? ", " : "",
                                 info->matryoshka[i]);
    return command_fail("%s %zu: not a width of the model (%zu; matryoshka: %s)", what, dims, info->dims,
                        info->matryoshka_count ? widths : "none");
}

/* ---- batches ---------------------------------------------------------------------------------- */

int encode_batch_add(encode_batch_t *batch, uform_modality_t modality, char const *bytes, size_t length) {
    if (!command_reserve(&batch->bytes, &batch->capacity, batch->length + length, ENCODE_BATCH_BYTES))
        return command_fail("out of memory for an item of %zu bytes", length);
    if (!batch->count) batch->modality = modality;
    if (length) memcpy(batch->bytes + batch->length, bytes, length); /* an empty first item: bytes NULL */
    batch->length += length;
    batch->offsets[++batch->count] = batch->length;
    return COMMAND_OK;
}

bool encode_batch_full(encode_batch_t const *batch) {
    return batch->count == ENCODE_BATCH_ITEMS || batch->length >= ENCODE_BATCH_BYTES;
}

uform_status_t command_encode_verb(command_encode_call_t const *call) {
#define COMMON_ARGS                                                                                          \
    .model = call->model, .executor = call->executor, .outputs = call->outputs, .arena = call->arena,        \
    .config = call->config, .encoded = call->encoded, .outcome = call->outcome
    switch (call->modality) {
    case UFORM_MODALITY_TEXT:
        return uform_text_encode(&(uform_text_encode_args_t){COMMON_ARGS, .texts = call->tape});
    case UFORM_MODALITY_IMAGE:
        return uform_image_encode(
            &(uform_image_encode_args_t){COMMON_ARGS, .images = call->tape, .source = call->source});
    case UFORM_MODALITY_VIDEO:
        return uform_video_encode(
            &(uform_video_encode_args_t){COMMON_ARGS, .videos = call->tape, .source = call->source});
    case UFORM_MODALITY_AUDIO:
        return uform_audio_encode(
            &(uform_audio_encode_args_t){COMMON_ARGS, .sounds = call->tape, .source = call->source});
    }
#undef COMMON_ARGS
    return UFORM_INVALID_ARGUMENT;
}

uform_status_t encode_batch_run(command_engine_t *engine, uform_outputs_t outputs,
                                uform_encode_config_t const *config, encode_batch_t const *batch,
                                uform_encoded_t *encoded) {
    uform_tape_t tape = {
        .data = batch->bytes, .offsets = batch->offsets, .count = batch->count, .length = batch->length};
    command_encode_call_t call = {.model = engine->model,
                                  .executor = engine->executor,
                                  .outputs = outputs,
                                  .arena = engine->arena,
                                  .config = config,
                                  .encoded = encoded,
                                  .modality = batch->modality,
                                  .tape = tape,
                                  .source = UFORM_SOURCE_FILES};
    return command_encode_verb(&call);
}

void encode_batch_clear(encode_batch_t *batch) {
    batch->length = batch->count = 0;
}

void encode_batch_release(encode_batch_t *batch) {
    free(batch->bytes);
    batch->bytes = NULL;
    batch->length = batch->capacity = batch->count = 0;
}
