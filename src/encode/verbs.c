/* The front doors of the encode verbs (verbs.h): each public verb checks its arguments once, in this
 * order, then hands the request to its model's implementations:
 *
 *   args -> the verb's own fields -> encode_check (or the choice's checks) -> the model's towers and
 *   the build's decoders -> encode_verbs_of(model)->verb: the host's, or the VRAM executor's.
 *
 * Where a model may run: host models on host executors, VRAM models on the VRAM executor that loaded
 * them (model_residency, src/model/model.c, part of every verb's checks). */
#include <stdalign.h>
#include <string.h>

#include "arena.h"
#include "call.h"
#include "model.h"
#include "tape.h"
#include "verbs.h"

encode_verbs_t const encode_verbs_host = {
    .text_encode = text_encode_host,
    .text_choose = text_choose_host,
    .image_encode = image_encode_host,
    .video_encode = image_encode_host, /* request->video: clips, their frames pooled (video.c) */
    .audio_encode = audio_encode_host,
};

/* The implementations a model's calls run: its residency's. */
static encode_verbs_t const *encode_verbs_of(uform_model_t const *model) {
    return model->verbs ? model->verbs : &encode_verbs_host;
}

/* ---- Text --------------------------------------------------------------------------------------- */

/* Whether the model has a text tower where it runs: a host model's prepared one, a VRAM model's
 * replicas'. */
static bool text_tower(uform_model_t const *model) {
    return model->device ? model->header.info.has_text : model->text != NULL;
}

UFORM_EXPORT uform_status_t uform_text_encode(uform_text_encode_args_t const *args) {
    static char const entry[] = "uform_text_encode";
    if (!args) return failed(UFORM_INVALID_ARGUMENT, entry, "args is NULL");
    encode_request_t const request = ENCODE_REQUEST(args, texts);
    char const *message = NULL;
    uform_status_t status = encode_check(&request, &message);
    if (status != UFORM_OK) return call_refuse(args->outcome, status, entry, message);
    if (!text_tower(args->model))
        return call_refuse(args->outcome, UFORM_UNSUPPORTED, entry, "the model has no text tower");
    char const *prompt = NULL;
    if (args->model->tokenizer && !text_prompt(args->model, args->config, &prompt))
        return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry,
                           "the model has no prompt of that name");
    if (!args->model->tokenizer && args->config &&
        ((args->config->prompt && *args->config->prompt) ||
         (args->config->prompt_name && *args->config->prompt_name)))
        return call_refuse(args->outcome, UFORM_UNSUPPORTED, entry,
                           "prompts are for models that read tokens");
    if (args->model->tokenizer && !args->model->device) return text_encode_tokens_host(&request);
    return encode_verbs_of(args->model)->text_encode(&request);
}

UFORM_EXPORT uform_status_t uform_model_prompt(uform_model_t const *model, char const *name, char *prompt,
                                               size_t capacity, size_t *length) {
    static char const entry[] = "uform_model_prompt";
    if (!model || !prompt || !length) return failed(UFORM_INVALID_ARGUMENT, entry, "an argument is NULL");
    *length = 0;
    if (capacity) *prompt = '\0';
    if (!model->tokenizer) {
        if (name && *name) return failed(UFORM_UNSUPPORTED, entry, "prompts are for models that read tokens");
        return capacity ? UFORM_OK : failed(UFORM_INVALID_ARGUMENT, entry, "no room for the prompt");
    }
    uform_encode_config_t const config = {.prompt_name = name};
    char const *found = NULL;
    if (!text_prompt(model, &config, &found))
        return failed(UFORM_INVALID_ARGUMENT, entry, "the model has no prompt of that name");
    size_t size = found ? strlen(found) : 0;
    *length = size;
    if (size >= capacity)
        return failed(UFORM_INVALID_ARGUMENT, entry, "the prompt is longer than the room given");
    if (size) memcpy(prompt, found, size + 1);
    return UFORM_OK;
}

static uform_status_t choose_check(uform_text_choose_args_t const *args, char const **message) {
    uform_model_t const *model = args->model;
    if (!model || !args->states || !args->arena)
        return *message = "model, states or arena is NULL", UFORM_INVALID_ARGUMENT;
    if (!args->outcome && !args->probabilities)
        return *message = "probabilities is NULL", UFORM_INVALID_ARGUMENT;
    uform_status_t status = model_residency(model, args->executor, message);
    if (status != UFORM_OK) return status;
    uform_tape_t const *choices = &args->choices;
    if (choices->count == 0) return *message = "the tape holds no items", UFORM_INVALID_ARGUMENT;
    status = tape_validate(choices, message);
    if (status != UFORM_OK) return status;
    for (size_t item = 0; item < choices->count; ++item) {
        uint8_t const *legal = (uint8_t const *)choices->data + choices->offsets[item];
        size_t count = choices->offsets[item + 1] - choices->offsets[item];
        bool seen[256] = {false};
        if (count == 0) return *message = "an item has no legal byte", UFORM_INVALID_ARGUMENT;
        for (size_t i = 0; i < count; seen[legal[i++]] = true)
            if (seen[legal[i]]) return *message = "an item repeats a legal byte", UFORM_INVALID_ARGUMENT;
    }
    if ((status = arena_check(args->arena, args->executor, message)) != UFORM_OK) return status;
    uform_view_t const *states = args->states;
    if (states->arena == args->arena)
        return *message = "states live in the arena this call rewinds: pass another arena",
               UFORM_INVALID_ARGUMENT;
    /* A VRAM call reads states where they are: device views of its own executor's arenas, or host views. */
    bool device_states =
        states->device && model->device && states->arena && states->arena->executor == args->executor;
    if (!device_states && (status = uform_view_check(states)) != UFORM_OK)
        return *message = uform_last_error().message, status;
    if (device_states && states->generation != atomic_load(&states->arena->generation))
        return *message = "stale view: its arena was rewound by a later call", UFORM_INVALID_ARGUMENT;
    if (!text_tower(model)) return *message = "the model has no text tower", UFORM_UNSUPPORTED;
    if (model->tokenizer)
        return *message = "text_choose reads a byte table: the model reads tokens", UFORM_UNSUPPORTED;
    if (states->columns != model->header.info.text.transformer.hidden ||
        (states->scalar != UFORM_F32 && states->scalar != UFORM_BF16))
        return *message = "states are not F32 or BF16 rows of the model's hidden width",
               UFORM_INVALID_ARGUMENT;
    if (choices->count != states->rows)
        return *message = "choices and states hold different counts of items", UFORM_INVALID_ARGUMENT;
    return UFORM_OK;
}

UFORM_EXPORT uform_status_t uform_text_choose(uform_text_choose_args_t const *args) {
    static char const entry[] = "uform_text_choose";
    if (!args) return failed(UFORM_INVALID_ARGUMENT, entry, "args is NULL");
    char const *message = NULL;
    uform_status_t status = choose_check(args, &message);
    if (status != UFORM_OK) return call_refuse(args->outcome, status, entry, message);
    return encode_verbs_of(args->model)->text_choose(args);
}

/* ---- Images and video --------------------------------------------------------------------------- */

/* The checks the image and video verbs share once their own fields are checked. */
static uform_status_t image_check(image_request_t const *request, char const **message) {
    uform_status_t status = encode_check(&request->encode, message);
    if (status != UFORM_OK) return status;
    uform_model_info_t const *info = &request->encode.model->header.info;
    if (request->video && !info->has_video)
        return *message = "the model has no video tower", UFORM_UNSUPPORTED;
    if (!info->has_image) return *message = "the model has no image tower", UFORM_UNSUPPORTED;
    if (request->video && !UFORM_WITH_FFMPEG)
        return *message = "video needs FFmpeg, which this build lacks", UFORM_UNSUPPORTED;
    return UFORM_OK;
}

/* Whether `source` is one the media verbs know: files, or encoded media in memory. */
static bool source_known(uform_source_t source) {
    return source == UFORM_SOURCE_FILES || source == UFORM_SOURCE_MEMORY;
}

/* The image and video doors' end once their own fields are checked: the shared checks, then the model's
 * implementation of the verb. */
static uform_status_t image_open(char const *entry, image_request_t const *request) {
    char const *message = NULL;
    uform_status_t status = image_check(request, &message);
    if (status != UFORM_OK) return call_refuse(request->encode.outcome, status, entry, message);
    encode_verbs_t const *verbs = encode_verbs_of(request->encode.model);
    return (request->video ? verbs->video_encode : verbs->image_encode)(entry, request);
}

/* The doors of images and clips from a source: files, or encoded bytes in memory. */
static uform_status_t image_source_open(char const *entry, uform_source_t source, image_request_t *request) {
    if (!source_known(source))
        return call_refuse(request->encode.outcome, UFORM_INVALID_ARGUMENT, entry, "unknown source");
    request->input = source == UFORM_SOURCE_FILES ? IMAGE_INPUT_FILES : IMAGE_INPUT_MEMORY;
    return image_open(entry, request);
}

UFORM_EXPORT uform_status_t uform_image_encode(uform_image_encode_args_t const *args) {
    static char const entry[] = "uform_image_encode";
    if (!args) return failed(UFORM_INVALID_ARGUMENT, entry, "args is NULL");
    image_request_t request = {.encode = ENCODE_REQUEST(args, images)};
    return image_source_open(entry, args->source, &request);
}

UFORM_EXPORT uform_status_t uform_image_encode_pixels(uform_image_encode_pixels_args_t const *args) {
    static char const entry[] = "uform_image_encode_pixels";
    if (!args) return failed(UFORM_INVALID_ARGUMENT, entry, "args is NULL");
    if (args->pixels.count && (!args->heights || !args->widths))
        return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry, "heights or widths is NULL");
    image_request_t const request = {
        .encode = ENCODE_REQUEST(args, pixels),
        .input = IMAGE_INPUT_PIXELS,
        .heights = args->heights,
        .widths = args->widths,
    };
    return image_open(entry, &request);
}

UFORM_EXPORT uform_status_t uform_video_encode(uform_video_encode_args_t const *args) {
    static char const entry[] = "uform_video_encode";
    if (!args) return failed(UFORM_INVALID_ARGUMENT, entry, "args is NULL");
    image_request_t request = {.encode = ENCODE_REQUEST(args, videos), .video = true};
    return image_source_open(entry, args->source, &request);
}

/* ---- Audio -------------------------------------------------------------------------------------- */

/* The checks both audio verbs share once their own fields are checked. */
static uform_status_t audio_check(audio_request_t const *request, char const **message) {
    uform_status_t status = encode_check(&request->encode, message);
    if (status != UFORM_OK) return status;
    if (!request->encode.model->header.info.has_audio)
        return *message = "the model has no audio tower", UFORM_UNSUPPORTED;
    return UFORM_OK;
}

/* The audio doors' end once their own fields are checked: the shared checks, then the model's
 * implementation. */
static uform_status_t audio_open(char const *entry, audio_request_t const *request) {
    char const *message = NULL;
    uform_status_t status = audio_check(request, &message);
    if (status != UFORM_OK) return call_refuse(request->encode.outcome, status, entry, message);
    return encode_verbs_of(request->encode.model)->audio_encode(entry, request);
}

UFORM_EXPORT uform_status_t uform_audio_encode(uform_audio_encode_args_t const *args) {
    static char const entry[] = "uform_audio_encode";
    if (!args) return failed(UFORM_INVALID_ARGUMENT, entry, "args is NULL");
    if (!source_known(args->source))
        return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry, "unknown source");
    audio_request_t const request = {
        .encode = ENCODE_REQUEST(args, sounds),
        .input = args->source == UFORM_SOURCE_FILES ? AUDIO_INPUT_FILES : AUDIO_INPUT_MEMORY,
    };
    return audio_open(entry, &request);
}

UFORM_EXPORT uform_status_t uform_audio_encode_samples(uform_audio_encode_samples_args_t const *args) {
    static char const entry[] = "uform_audio_encode_samples";
    if (!args) return failed(UFORM_INVALID_ARGUMENT, entry, "args is NULL");
    if (args->rate == 0) return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry, "rate is 0");
    if (args->rate > UFORM_AUDIO_MAX_RATE)
        return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry, "rate over UFORM_AUDIO_MAX_RATE");
    if ((uintptr_t)args->samples.data % alignof(float))
        return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry,
                           "samples are not aligned to a float");
    audio_request_t const request = {
        .encode = ENCODE_REQUEST(args, samples),
        .input = AUDIO_INPUT_SAMPLES,
        .rate = args->rate,
    };
    return audio_open(entry, &request);
}
