/* uform encode: embeddings of texts from the arguments, standard input or a JSONL manifest, encoded in
 * batches on a RAM executor and written as JSONL, raw rows or .npy. Media items of a manifest go to their
 * modality's verb, which answers UFORM_UNSUPPORTED until the engine builds it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "uform_command.h"

static char const help[] =
    "usage: uform encode [options] [TEXT ...]\n"
    "\n"
    "Embeds the TEXTs given, or the items of a --manifest, or else one text per line of standard input\n"
    "(without its \\n or \\r\\n; an empty line is an empty text). Texts are bytes: the model reads\n"
    "at most its context of each (see 'uform info'). Items are encoded in batches of up to 256 items or\n"
    "1 MiB; a text's vector does not depend on its batch nor on the thread count.\n"
    "\n"
    "  --model PATH       the checkpoint; default: the default model (below)\n"
    "  --threads N        worker threads; 0 (the default) takes 7/8 of the cores\n"
    "  --dims N           a matryoshka width of the model (see 'uform info'): each vector narrowed to\n"
    "                     its first N values, unit-norm again\n"
    "  --scalar KIND      f32 (default), bf16, f16, or i8 (scaled per row: value = q * scale)\n"
    "  --format FORMAT    jsonl (default): {\"index\": i, \"embedding\": [...]} per line, floats that read\n"
    "                     back exactly, and \"scale\" for i8;\n"
    "                     f32: the rows end to end, little-endian, in the --scalar's own bytes (so raw\n"
    "                     F32 by default);\n"
    "                     npy: a NumPy .npy array of shape (items, dims), dtype <f4, <f2 or |i1; bf16 is\n"
    "                     stored as <u2, its bits: view it with ml_dtypes.bfloat16, or widen it with\n"
    "                     (a.astype(np.uint32) << 16).view(np.float32).\n"
    "                     i8 rows of f32 and npy carry no scales: cosine similarity does not need them,\n"
    "                     and jsonl keeps them.\n"
    "  --output FILE      write there instead of the standard output; a failed run removes it. The\n"
    "                     binary formats are not written to a terminal.\n"
    "  --tokens           jsonl only: add each item's token vectors, one per byte the model kept, as\n"
    "                     \"tokens\" (and \"token_scales\" for i8)\n"
    "  --manifest FILE    one JSON object per line, {\"text\": \"...\"}, {\"image\": PATH}, {\"video\": "
    "PATH}\n"
    "                     or {\"audio\": PATH} (other keys are ignored; paths are relative to the working\n"
    "                     directory; '-' reads standard input). Images, video and audio are not built\n"
    "                     yet in the engine: such an item ends the run with the engine's error.\n"
    "  --                 what follows is text, even when it starts with '-'\n"
    "\n"
    "A progress line is drawn on stderr when stderr is a terminal. Errors are one line on stderr:\n"
    "exit status 1 when the work failed, 2 for a wrong command line.\n"
    "\n";

/* Bounds of one engine call: enough items to keep the threads busy, and bounded memory per batch. */
enum { BATCH_ITEMS = 256, BATCH_BYTES = 1 << 20 };

typedef struct encode_flags {
    char const *model, *output, *manifest;
    size_t threads, dims;
    uform_scalar_t scalar;
    output_format_t format;
    bool tokens, help;
    char **texts; /* the positional arguments, argc of them at most */
    size_t texts_count;
} encode_flags_t;

/* Items of one modality, end to end: the tape of one engine call. */
typedef struct batch {
    uform_modality_t modality;
    char *bytes;
    size_t length, capacity, count;
    size_t offsets[BATCH_ITEMS + 1];
} batch_t;

typedef struct encoder {
    uform_executor_t *executor;
    uform_model_t *model;
    uform_arena_t *arena;
    uform_encode_config_t config;
    uform_outputs_t outputs;
    output_t *output;
    size_t written; /* items written so far: the index of the next one */
    /* The progress line: drawn only on a terminal. */
    bool progress, drawn;
    double drawn_at; /* seconds after `started` */
    size_t total;    /* 0 when unknown */
    struct timespec started;
} encoder_t;

/* ---- flags ------------------------------------------------------------------------------------ */

static int parse_choice(char const *flag, char const *value, char const *const *names, size_t count,
                        int *choice) {
    for (size_t i = 0; i < count; ++i) {
        if (strcmp(value, names[i]) != 0) continue;
        *choice = (int)i;
        return COMMAND_OK;
    }
    return command_usage("encode", "%s takes %s, not '%s'", flag,
                         count == 4 ? "f32, bf16, f16 or i8" : "jsonl, f32 or npy", value);
}

static int parse_flags(int argc, char **argv, encode_flags_t *flags) {
    static char const *const scalars[] = {"f32", "bf16", "f16", "i8"}; /* by uform_scalar_t */
    static char const *const formats[] = {"jsonl", "f32", "npy"};      /* by output_format_t */
    bool texts_only = false;
    for (int i = 1; i < argc; ++i) {
        char const *value = NULL;
        int matched = 0, choice = 0, code = COMMAND_OK;
        if (texts_only || argv[i][0] != '-' || argv[i][1] == '\0') {
            flags->texts[flags->texts_count++] = argv[i];
        } else if (!strcmp(argv[i], "--")) {
            texts_only = true;
        } else if (command_is_help(argv[i])) {
            printf("%s%s", help, command_default_model_help);
            flags->help = true;
            return COMMAND_OK;
        } else if (!strcmp(argv[i], "--tokens")) {
            flags->tokens = true;
        } else if ((matched = command_option(argc, argv, &i, "encode", "--model", &value)) != 0) {
            flags->model = value;
        } else if ((matched = command_option(argc, argv, &i, "encode", "--output", &value)) != 0) {
            flags->output = value;
        } else if ((matched = command_option(argc, argv, &i, "encode", "--manifest", &value)) != 0) {
            flags->manifest = value;
        } else if ((matched = command_option(argc, argv, &i, "encode", "--threads", &value)) != 0) {
            if (matched > 0 && command_parse_size(value, &flags->threads) != 0)
                return command_usage("encode", "--threads takes a number, not '%s'", value);
        } else if ((matched = command_option(argc, argv, &i, "encode", "--dims", &value)) != 0) {
            if (matched > 0 && command_parse_size(value, &flags->dims) != 0)
                return command_usage("encode", "--dims takes a number, not '%s'", value);
        } else if ((matched = command_option(argc, argv, &i, "encode", "--scalar", &value)) != 0) {
            if (matched > 0 && (code = parse_choice("--scalar", value, scalars, 4, &choice)) == COMMAND_OK)
                flags->scalar = (uform_scalar_t)choice;
        } else if ((matched = command_option(argc, argv, &i, "encode", "--format", &value)) != 0) {
            if (matched > 0 && (code = parse_choice("--format", value, formats, 3, &choice)) == COMMAND_OK)
                flags->format = (output_format_t)choice;
        } else {
            return command_usage("encode", "unknown flag '%s'", argv[i]);
        }
        if (matched < 0) return COMMAND_USAGE;
        if (code != COMMAND_OK) return code;
    }
    if (flags->manifest && flags->texts_count)
        return command_usage("encode", "texts and --manifest exclude each other");
    if (flags->tokens && flags->format != OUTPUT_JSONL)
        return command_usage("encode", "--tokens needs --format jsonl");
    if (!flags->output && flags->format != OUTPUT_JSONL && isatty(STDOUT_FILENO))
        return command_usage("encode", "binary output to a terminal: pass --output FILE, or pipe it");
    return COMMAND_OK;
}

/* ---- progress --------------------------------------------------------------------------------- */

static double seconds_since(struct timespec const *since) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - since->tv_sec) + (double)(now.tv_nsec - since->tv_nsec) * 1e-9;
}

/* Redrawn at most ten times a second, and once more at the end with `last`. */
static void progress_draw(encoder_t *encoder, bool last) {
    if (!encoder->progress) return;
    double seconds = seconds_since(&encoder->started);
    if (!last && seconds < encoder->drawn_at + 0.1) return;
    encoder->drawn_at = seconds;
    double rate = seconds > 0 ? (double)encoder->written / seconds : 0;
    fputs("\r\033[Kencode: ", stderr);
    if (encoder->total) {
        enum { WIDTH = 30 };
        size_t filled = encoder->written * WIDTH / encoder->total;
        char bar[WIDTH + 1];
        for (size_t i = 0; i < WIDTH; ++i)
            bar[i] = i < filled ? '#' : '.';
        bar[WIDTH] = '\0';
        fprintf(stderr, "[%s] %zu/%zu", bar, encoder->written, encoder->total);
    } else {
        fprintf(stderr, "%zu", encoder->written);
    }
    fprintf(stderr, " items, %.0f items/s", rate);
    fflush(stderr);
    encoder->drawn = true;
}

/* The final count after a success; after a failure, the line ends so the error starts its own. */
static void progress_end(encoder_t *encoder, bool succeeded) {
    if (succeeded) progress_draw(encoder, true);
    if (encoder->drawn) fputc('\n', stderr);
}

/* ---- batches ---------------------------------------------------------------------------------- */

static int batch_add(batch_t *batch, input_item_t const *item) {
    if (batch->length + item->length > batch->capacity) {
        size_t capacity = batch->capacity ? batch->capacity : BATCH_BYTES;
        while (capacity < batch->length + item->length)
            capacity *= 2;
        char *grown = realloc(batch->bytes, capacity);
        if (!grown) return command_fail("out of memory for an item of %zu bytes", item->length);
        batch->bytes = grown;
        batch->capacity = capacity;
    }
    if (!batch->count) batch->modality = item->modality;
    memcpy(batch->bytes + batch->length, item->bytes, item->length);
    batch->length += item->length;
    batch->offsets[++batch->count] = batch->length;
    return COMMAND_OK;
}

/* The verb of the batch's modality; media come as file paths. */
static uform_status_t batch_encode(encoder_t *encoder, batch_t const *batch, uform_encoded_t *encoded) {
    uform_tape_t tape = {
        .data = batch->bytes, .offsets = batch->offsets, .count = batch->count, .length = batch->length};
#define COMMON_ARGS                                                                                          \
    .model = encoder->model, .executor = encoder->executor, .outputs = encoder->outputs,                     \
    .arena = encoder->arena, .config = &encoder->config, .encoded = encoded
    switch (batch->modality) {
    case UFORM_MODALITY_TEXT:
        return uform_text_encode(&(uform_text_encode_args_t){COMMON_ARGS, .texts = tape});
    case UFORM_MODALITY_IMAGE:
        return uform_image_encode(
            &(uform_image_encode_args_t){COMMON_ARGS, .images = tape, .source = UFORM_SOURCE_FILES});
    case UFORM_MODALITY_VIDEO:
        return uform_video_encode(
            &(uform_video_encode_args_t){COMMON_ARGS, .videos = tape, .source = UFORM_SOURCE_FILES});
    case UFORM_MODALITY_AUDIO:
        return uform_audio_encode(
            &(uform_audio_encode_args_t){COMMON_ARGS, .sounds = tape, .source = UFORM_SOURCE_FILES});
    }
#undef COMMON_ARGS
    return UFORM_INVALID_ARGUMENT;
}

static int batch_flush(encoder_t *encoder, batch_t *batch) {
    uform_encoded_t encoded;
    if (batch_encode(encoder, batch, &encoded) != UFORM_OK) return command_fail_engine();
    /* A failed item has zero rows in the output; writing them would pass a bad file off as a vector. */
    for (size_t item = 0; item < encoded.items; ++item)
        if (encoded.statuses[item] != UFORM_OK)
            return command_fail("item %zu: %s", encoder->written + item,
                                uform_status_name(encoded.statuses[item]));
    int code = output_write(encoder->output, &encoded, encoder->written);
    if (code != COMMAND_OK) return code;
    encoder->written += batch->count;
    batch->length = batch->count = 0;
    progress_draw(encoder, false);
    return COMMAND_OK;
}

static int encode_all(encoder_t *encoder, input_t *input, batch_t *batch) {
    for (;;) {
        input_item_t item;
        bool done = false;
        int code = input_next(input, &item, &done);
        if (code != COMMAND_OK) return code;
        if (done) return batch->count ? batch_flush(encoder, batch) : COMMAND_OK;
        if (batch->count && batch->modality != item.modality &&
            (code = batch_flush(encoder, batch)) != COMMAND_OK)
            return code;
        if ((code = batch_add(batch, &item)) != COMMAND_OK) return code;
        if ((batch->count == BATCH_ITEMS || batch->length >= BATCH_BYTES) &&
            (code = batch_flush(encoder, batch)) != COMMAND_OK)
            return code;
    }
}

/* ---- the command ------------------------------------------------------------------------------ */

int command_encode(int argc, char **argv) {
    encode_flags_t flags = {
        .scalar = UFORM_F32, .format = OUTPUT_JSONL, .texts = calloc((size_t)argc, sizeof(char *))};
    encoder_t encoder = {.outputs = UFORM_OUTPUT_EMBEDDINGS};
    input_t *input = NULL;
    batch_t *batch = calloc(1, sizeof *batch);
    char buffer[4096];
    char const *path = NULL;
    int code = COMMAND_OK;
    if (!flags.texts || !batch) {
        code = command_fail("out of memory");
        goto done;
    }
    if ((code = parse_flags(argc, argv, &flags)) != COMMAND_OK || flags.help) goto done;
    if ((code = command_model_path(flags.model, buffer, sizeof buffer, &path)) != COMMAND_OK) goto done;
    if ((code = input_open(flags.texts, flags.texts_count, flags.manifest, &input)) != COMMAND_OK) goto done;

    uform_ram_options_t options = uform_ram_options_default();
    options.threads = flags.threads;
    if (uform_executor_create_ram(&options, &encoder.executor) != UFORM_OK) goto engine_failed;
    uform_model_load_args_t load = {.executor = encoder.executor, .path = path, .model = &encoder.model};
    if (uform_model_load_ram(&load) != UFORM_OK) goto engine_failed;
    if (uform_arena_create(encoder.executor, &encoder.arena) != UFORM_OK) goto engine_failed;
    uform_model_info_t info;
    if (uform_model_info(encoder.model, &info) != UFORM_OK) goto engine_failed;

    encoder.config = (uform_encode_config_t){.outputs_scalar = flags.scalar, .matryoshka = flags.dims};
    if (flags.tokens) encoder.outputs |= UFORM_OUTPUT_TOKEN_VECTORS;
    encoder.progress = isatty(STDERR_FILENO);
    encoder.total = input_total(input);
    clock_gettime(CLOCK_MONOTONIC, &encoder.started);
    /* Opened only now, so that a model that does not load leaves an existing file as it was. */
    size_t columns = flags.dims ? flags.dims : info.dims;
    if ((code = output_open(flags.format, flags.output, flags.scalar, columns, flags.tokens,
                            &encoder.output)) != COMMAND_OK)
        goto done;
    code = encode_all(&encoder, input, batch);
    progress_end(&encoder, code == COMMAND_OK);
    goto done;

engine_failed:
    code = command_fail_engine();
done:;
    int closed = output_close(encoder.output, code == COMMAND_OK);
    if (code == COMMAND_OK) code = closed;
    uform_arena_free(encoder.arena);
    uform_model_free(encoder.model);
    uform_executor_free(encoder.executor);
    input_close(input);
    if (batch) free(batch->bytes);
    free(batch);
    free(flags.texts);
    return code;
}
