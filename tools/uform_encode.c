/* uform encode: embeddings of texts and images from the arguments, standard input or a JSONL manifest,
 * encoded in batches on a RAM executor and written as JSONL, raw rows or .npy. Media items go to their
 * modality's verb, which answers UFORM_UNSUPPORTED in a build without its decoder. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "uform_command.h"

static char const help_head[] =
    "usage: uform encode [options] [TEXT | IMAGE ...]\n"
    "\n"
    "Embeds the TEXTs and IMAGEs given, or the items of a --manifest, or else one text per line of\n"
    "standard input (without its \\n or \\r\\n; an empty line is an empty text). An argument ending\n"
    "in .jpg, .jpeg or .png (any case) is the path of an image, decoded by its content (JPEG or PNG);\n"
    "any other argument is a text. Texts are bytes: the model reads at most its context of each (see\n"
    "'uform info'). Items are encoded in batches of up to 256 items or 1 MiB; a vector does not\n"
    "depend on its batch nor on the thread count. An item that cannot be read or decoded ends the\n"
    "run with its status (io, format, ...), unless --keep-going.\n"
    "\n";

static char const help_tail[] =
    "\n"
    "A progress line is drawn on stderr when stderr is a terminal. Errors are one line on stderr:\n"
    "exit status 1 when the work failed, 2 for a wrong command line.\n"
    "\n";

typedef struct encode_flags {
    char const *model, *output, *manifest, *prompt, *prompt_name;
    size_t threads, dims;
    bool normalize;
    int weights; /* a uform_weights_t */
    int scalar;  /* a uform_scalar_t */
    int format;  /* an output_format_t */
    bool tokens, keep_going, help;
    char const **texts; /* the positional arguments, argc of them at most */
    size_t texts_count;
    size_t literal_from; /* the first positional argument after `--`: texts, whatever they end with */
} encode_flags_t;

typedef struct encoder {
    command_engine_t engine;
    uform_encode_config_t config;
    uform_outputs_t outputs;
    output_t *output;
    bool keep_going;
    size_t written; /* items written so far: the index of the next one */
    size_t failed;  /* of them, the items whose rows hold "error" (--keep-going) */
    progress_t progress;
} encoder_t;

/* ---- flags ------------------------------------------------------------------------------------ */

/* A positional argument: a text, or an image's path unless it follows `--`. */
static int take_text(void *context, char const *argument, bool literal) {
    encode_flags_t *flags = context;
    if (literal && flags->literal_from > flags->texts_count) flags->literal_from = flags->texts_count;
    flags->texts[flags->texts_count++] = argument;
    return COMMAND_OK;
}

static command_help_t const help = {.name = "encode",
                                    .head = help_head,
                                    .tail = help_tail,
                                    .column = 21,
                                    .model_help = true,
                                    .positional = take_text};

static int parse_flags(int argc, char **argv, encode_flags_t *flags) {
    static char const *const scalars[] = {"f32", "bf16", "f16", "i8"}; /* by uform_scalar_t */
    static char const *const formats[] = {"jsonl", "f32", "npy"};      /* by output_format_t */
    command_flag_t const table[] = {
        command_flag_model(&flags->model),
        command_flag_threads(&flags->threads),
        command_flag_weights(&flags->weights),
        {"--dims", FLAG_SIZE, &flags->dims, .value = "N",
         .help = "a matryoshka width of the model (see 'uform info'): each vector narrowed to\n"
                 "its first N values, unit-norm again"},
        {"--scalar", FLAG_CHOICE, &flags->scalar, .value = "KIND", .choices = scalars, .choice_count = 4,
         .help = "f32 (default), bf16, f16, or i8 (scaled per row: value = q * scale)"},
        {"--format", FLAG_CHOICE, &flags->format, .value = "FORMAT", .choices = formats, .choice_count = 3,
         .help = "jsonl (default): {\"index\": i, \"embedding\": [...]} per line, floats that read\n"
                 "back exactly, and \"scale\" for i8;\n"
                 "f32: the rows end to end, little-endian, in the --scalar's own bytes (so raw\n"
                 "F32 by default);\n"
                 "npy: a NumPy .npy array of shape (items, dims), dtype <f4, <f2 or |i1; bf16 is\n"
                 "stored as <u2, its bits: view it with ml_dtypes.bfloat16, or widen it with\n"
                 "(a.astype(np.uint32) << 16).view(np.float32).\n"
                 "i8 rows of f32 and npy carry no scales: cosine similarity does not need them,\n"
                 "and jsonl keeps them."},
        {"--output", FLAG_STRING, &flags->output, .value = "FILE",
         .help = "write there instead of the standard output: a file beside it, renamed over\n"
                 "it once whole, so that a failed or killed run leaves what was there. The\n"
                 "binary formats are not written to a terminal."},
        {"--prompt-name", FLAG_STRING, &flags->prompt_name, .value = "NAME",
         .help = "a model that reads tokens: put its prompt NAME (config_sentence_transformers.json)\n"
                 "before each text, as sentence-transformers' prompt_name; by default the model's\n"
                 "default prompt, if it names one; \"\" for none"},
        {"--prompt", FLAG_STRING, &flags->prompt, .value = "TEXT",
         .help = "the same with TEXT itself as the prompt"},
        {"--normalize", FLAG_SWITCH, &flags->normalize,
         .help = "unit vectors even from a model whose family gives them unnormalized (CLIP, SigLIP,\n"
                 "UForm 3, sentence-transformers models without Normalize: see 'uform info')"},
        {"--tokens", FLAG_SWITCH, &flags->tokens,
         .help = "jsonl only: add each item's token vectors, one per byte the model kept of a\n"
                 "text (per token, with the bytes [begin, end) each covers as \"spans\", for a model\n"
                 "that reads tokens) and one per patch of an image, as \"tokens\" (and\n"
                 "\"token_scales\" for i8)"},
        {"--manifest", FLAG_STRING, &flags->manifest, .value = "FILE",
         .help = "one JSON object per line, {\"text\": \"...\"}, {\"image\": PATH}, {\"video\": PATH}\n"
                 "or {\"audio\": PATH} (other keys are ignored; paths are relative to the working\n"
                 "directory; '-' reads standard input). In a build without FFmpeg, a video\n"
                 "or audio item ends the run with the engine's error (unsupported)."},
        {"--keep-going", FLAG_SWITCH, &flags->keep_going,
         .help = "jsonl only: an item that fails gets the row {\"index\": i, \"error\": STATUS}\n"
                 "(io, format, unsupported, ...) and a line on stderr, and the others their\n"
                 "vectors; the file is written whole, and the run ends with exit status 1 and\n"
                 "the count of the items that failed"},
        {"--", FLAG_LITERALS, NULL,
         .help = "what follows is text, even when it starts with '-' or ends in .jpg"},
        {NULL},
    };
    command_spec_t const spec = {.help = &help, .flags = table, .context = flags};
    flags->literal_from = (size_t)argc;
    int code = command_flags_parse(&spec, argc, argv, &flags->help);
    if (code != COMMAND_OK || flags->help) return code;
    if (flags->manifest && flags->texts_count)
        return command_usage("encode", "texts and --manifest exclude each other");
    if (flags->tokens && flags->format != OUTPUT_JSONL)
        return command_usage("encode", "--tokens needs --format jsonl");
    if (flags->keep_going && flags->format != OUTPUT_JSONL)
        return command_usage("encode", "--keep-going needs --format jsonl");
    if (!flags->output && flags->format != OUTPUT_JSONL && isatty(STDOUT_FILENO))
        return command_usage("encode", "binary output to a terminal: pass --output FILE, or pipe it");
    return COMMAND_OK;
}

/* ---- batches ---------------------------------------------------------------------------------- */

/* What a media file's path says of an item that answered UFORM_IO: " (no such file or folder)" and the
 * like, where stat or access names a cause; "" otherwise (a read that failed past the open). */
static char const *io_cause(char const *path, size_t length) {
    char copy[PATH_MAX];
    if (length >= sizeof copy) return "";
    memcpy(copy, path, length);
    copy[length] = '\0';
    struct stat about;
    if (stat(copy, &about) != 0) {
        switch (errno) {
        case ENOENT:
            return " (no such file or folder)";
        case EACCES:
            return " (permission denied)";
        case ENOTDIR:
            return " (a part of its path is not a folder)";
        default:
            return "";
        }
    }
    if (S_ISDIR(about.st_mode)) return " (a folder, not a file)";
    return access(copy, R_OK) != 0 ? " (permission denied)" : "";
}

static int batch_flush(encoder_t *encoder, encode_batch_t *batch) {
    uform_encoded_t encoded;
    if (encode_batch_run(&encoder->engine, encoder->outputs, &encoder->config, batch, &encoded) != UFORM_OK)
        return command_fail_engine();
    /* A failed item has zero rows in the output; writing them would pass a bad file off as a vector. With
     * --keep-going its row says why instead (output_write). */
    for (size_t item = 0; item < encoded.items; ++item) {
        if (encoded.statuses[item] == UFORM_OK) continue;
        char const *status = uform_status_name(encoded.statuses[item]);
        char const *path = batch->bytes + batch->offsets[item];
        size_t length = batch->offsets[item + 1] - batch->offsets[item];
        int failed = batch->modality == UFORM_MODALITY_TEXT
                         ? command_fail("item %zu: %s", encoder->written + item, status)
                         : command_fail("item %zu: %s '%.*s': %s%s", encoder->written + item,
                                        command_modality_names[batch->modality], (int)length, path, status,
                                        encoded.statuses[item] == UFORM_IO ? io_cause(path, length) : "");
        if (!encoder->keep_going) return failed;
        ++encoder->failed;
    }
    int code = output_write(encoder->output, &encoded, encoder->written);
    if (code != COMMAND_OK) return code;
    encoder->written += batch->count;
    encode_batch_clear(batch);
    progress_draw(&encoder->progress, encoder->written, false);
    return COMMAND_OK;
}

static int encode_all(encoder_t *encoder, input_t *input, encode_batch_t *batch) {
    for (;;) {
        input_item_t item;
        bool done = false;
        int code = input_next(input, &item, &done);
        if (code != COMMAND_OK) return code;
        if (done) return batch->count ? batch_flush(encoder, batch) : COMMAND_OK;
        if (batch->count && batch->modality != item.modality &&
            (code = batch_flush(encoder, batch)) != COMMAND_OK)
            return code;
        if ((code = encode_batch_add(batch, item.modality, item.bytes, item.length)) != COMMAND_OK)
            return code;
        if (encode_batch_full(batch) && (code = batch_flush(encoder, batch)) != COMMAND_OK) return code;
    }
}

/* ---- the command ------------------------------------------------------------------------------ */

int command_encode(int argc, char **argv) {
    encode_flags_t flags = {
        .scalar = UFORM_F32, .format = OUTPUT_JSONL, .texts = calloc((size_t)argc, sizeof(char const *))};
    encoder_t encoder = {.outputs = UFORM_OUTPUT_EMBEDDINGS};
    input_t *input = NULL;
    encode_batch_t *batch = calloc(1, sizeof *batch);
    char buffer[4096];
    char const *path = NULL;
    int code = COMMAND_OK;
    if (!flags.texts || !batch) {
        code = command_fail("out of memory");
        goto done;
    }
    if ((code = parse_flags(argc, argv, &flags)) != COMMAND_OK || flags.help) goto done;
    if ((code = command_model_path(flags.model, buffer, sizeof buffer, &path)) != COMMAND_OK) goto done;
    if ((code = input_open(flags.texts, flags.texts_count, flags.literal_from, flags.manifest, &input)) !=
        COMMAND_OK)
        goto done;

    if ((code = command_engine_open(path, flags.threads, flags.weights, &encoder.engine)) != COMMAND_OK)
        goto done;

    encoder.keep_going = flags.keep_going;
    encoder.config = (uform_encode_config_t){.outputs_scalar = (uform_scalar_t)flags.scalar,
                                             .matryoshka = flags.dims,
                                             .normalize = flags.normalize,
                                             .prompt = flags.prompt,
                                             .prompt_name = flags.prompt_name};
    if (flags.tokens) encoder.outputs |= UFORM_OUTPUT_TOKEN_VECTORS;
    progress_start(&encoder.progress, "encode", "items", input_total(input));
    /* Opened only now, so that a model that does not load leaves an existing file as it was. */
    size_t columns = flags.dims ? flags.dims : encoder.engine.info.dims;
    if ((code = output_open((output_format_t)flags.format, flags.output, (uform_scalar_t)flags.scalar,
                            columns, flags.tokens, &encoder.output)) != COMMAND_OK)
        goto done;
    code = encode_all(&encoder, input, batch);
    progress_end(&encoder.progress, encoder.written, code == COMMAND_OK);

done:;
    int closed = output_close(encoder.output, code == COMMAND_OK);
    if (code == COMMAND_OK) code = closed;
    if (code == COMMAND_OK && encoder.failed)
        code = command_fail("%zu of %zu items failed; their rows hold \"error\"", encoder.failed,
                            encoder.written);
    command_engine_close(&encoder.engine);
    input_close(input);
    if (batch) encode_batch_release(batch);
    free(batch);
    free(flags.texts);
    return code;
}
