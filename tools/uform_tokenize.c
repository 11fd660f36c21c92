/* uform tokenize: the token ids and byte spans of texts from the arguments, standard input or a JSONL
 * manifest, cut by a tokenizer file (or a model folder's) in batches on a RAM executor, one JSON line
 * per text. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "uform_command.h"

static char const help_head[] =
    "usage: uform tokenize (--tokenizer FILE | --model PATH) [options] [TEXT ...]\n"
    "\n"
    "Cuts the TEXTs given, or the texts of a --manifest, or else one text per line of standard input\n"
    "(without its \\n or \\r\\n; an empty line is an empty text) into the token ids a pretrained\n"
    "model reads, exactly as Hugging Face's tokenizers cuts them from the same tokenizer.json, with the\n"
    "special tokens its post-processor adds (a SentencePiece model as transformers' slow tokenizer of\n"
    "the folder's tokenizer_config.json cuts with it, or a bare .model file as SentencePiece encodes).\n"
    "Prints one JSON line per text:\n"
    "  {\"index\": 0, \"ids\": [101, 7592, 102], \"spans\": [[0, 0], [0, 5], [0, 0]],\n"
    "   \"special\": [1, 0, 1]}\n"
    "where each span is the bytes [begin, end) of the text that the token covers ([0, 0] for special\n"
    "tokens), and \"special\" is tokenizers' special_tokens_mask: 1 for the tokens the post-processor\n"
    "or padding added. A text that is not valid UTF-8 prints {\"index\": i, \"error\": \"...\"} and the run "
    "goes on;\n"
    "it then ends with status 1.\n"
    "\n";

static char const help_tail[] =
    "\n"
    "Texts are cut in batches of up to 4096 texts or 1 MiB. Errors are one line on stderr: exit status\n"
    "1 when the work failed, 2 for a wrong command line.\n"
    "\n";

typedef struct tokenize_flags {
    char const *tokenizer, *model, *manifest;
    size_t threads;
    bool plain, help;
    char const **texts;
    size_t texts_count;
} tokenize_flags_t;

static int take_text(void *context, char const *argument, bool literal) {
    (void)literal;
    tokenize_flags_t *flags = context;
    flags->texts[flags->texts_count++] = argument;
    return COMMAND_OK;
}

static command_help_t const help = {
    .name = "tokenize", .head = help_head, .tail = help_tail, .column = 21, .positional = take_text};

static int parse_flags(int argc, char **argv, tokenize_flags_t *flags) {
    command_flag_t const table[] = {
        {"--tokenizer", FLAG_STRING, &flags->tokenizer, .value = "FILE",
         .help = "a tokenizer.json (Hugging Face tokenizers' format), or a SentencePiece .model"},
        {"--model", FLAG_STRING, &flags->model, .value = "PATH",
         .help = "a model folder as published (its tokenizer.json, or its spiece.model or\n"
                 "sentencepiece.bpe.model with tokenizer_config.json), or a tokenizer file;\n"
                 "where none of that name exists, a hub id in the local Hugging Face cache"},
        {"--manifest", FLAG_STRING, &flags->manifest, .value = "PATH",
         .help = "a JSONL file of {\"text\": ...} objects, one per line ('-': standard input);\n"
                 "texts may then hold newlines"},
        command_flag_threads(&flags->threads),
        {"--no-special", FLAG_SWITCH, &flags->plain,
         .help = "without the post-processor's special tokens (add_special_tokens=False)"},
        {"--", FLAG_LITERALS, NULL, .help = "what follows is text, even when it starts with '-'"},
        {NULL},
    };
    command_spec_t spec = {.help = &help, .flags = table, .context = flags};
    int code = command_flags_parse(&spec, argc, argv, &flags->help);
    if (code != COMMAND_OK || flags->help) return code;
    if (!flags->tokenizer == !flags->model)
        return command_usage("tokenize", "give one of --tokenizer FILE and --model PATH");
    if (flags->manifest && flags->texts_count)
        return command_usage("tokenize", "give texts as arguments or a --manifest, not both");
    return COMMAND_OK;
}

/* ---- batches ----------------------------------------------------------------------------------- */

typedef struct tokenize_run {
    uform_tokenizer_t *tokenizer;
    uform_executor_t *executor;
    uform_arena_t *arena;
    uform_tokenize_config_t config;
    char *bytes;
    size_t *offsets;
    size_t count, length, bytes_capacity;
    size_t written, failed;
    char *line; /* the JSON line being written */
    size_t line_capacity;
} tokenize_run_t;

enum { BATCH_TEXTS = 4096, BATCH_BYTES = 1 << 20 };

/* Appends the decimal digits of `value` to `out`; answers the bytes written. */
static size_t put_number(char *out, size_t value) {
    char digits[24];
    size_t count = 0;
    do
        digits[count++] = (char)('0' + value % 10);
    while (value /= 10);
    for (size_t i = 0; i < count; ++i)
        out[i] = digits[count - 1 - i];
    return count;
}

/* One text's line: its ids, spans and special flags, or its error. */
static int write_item(tokenize_run_t *run, uform_tokenized_t const *tokenized, size_t item) {
    size_t first = tokenized->ids.item_offsets[item], last = tokenized->ids.item_offsets[item + 1];
    if (!command_reserve(&run->line, &run->line_capacity, 112 + (last - first) * 51, 4096))
        return command_fail("out of memory");
    char *out = run->line;
    size_t at = (size_t)sprintf(out, "{\"index\": ");
    at += put_number(out + at, run->written + item);
    if (tokenized->statuses[item] != UFORM_OK) {
        at +=
            (size_t)sprintf(out + at, ", \"error\": \"%s\"}\n", uform_status_name(tokenized->statuses[item]));
        run->failed++;
        return fwrite(out, 1, at, stdout) == at ? COMMAND_OK : command_fail("cannot write standard output");
    }
    uint32_t const *ids = tokenized->ids.data, *spans = tokenized->spans.data;
    memcpy(out + at, ", \"ids\": [", 10), at += 10;
    for (size_t t = first; t < last; ++t) {
        if (t > first) out[at++] = ',', out[at++] = ' ';
        at += put_number(out + at, ids[t]);
    }
    memcpy(out + at, "], \"spans\": [", 13), at += 13;
    for (size_t t = first; t < last; ++t) {
        if (t > first) out[at++] = ',', out[at++] = ' ';
        out[at++] = '[';
        at += put_number(out + at, spans[2 * t]);
        out[at++] = ',', out[at++] = ' ';
        at += put_number(out + at, spans[2 * t + 1]);
        out[at++] = ']';
    }
    memcpy(out + at, "], \"special\": [", 15), at += 15;
    for (size_t t = first; t < last; ++t) {
        if (t > first) out[at++] = ',', out[at++] = ' ';
        out[at++] = tokenized->special[t] ? '1' : '0';
    }
    memcpy(out + at, "]}\n", 3), at += 3;
    return fwrite(out, 1, at, stdout) == at ? COMMAND_OK : command_fail("cannot write standard output");
}

static int flush_batch(tokenize_run_t *run) {
    if (run->count == 0) return COMMAND_OK;
    uform_tokenized_t tokenized;
    uform_text_tokenize_args_t args = {
        .tokenizer = run->tokenizer,
        .executor = run->executor,
        .texts = {.data = run->bytes, .offsets = run->offsets, .count = run->count, .length = run->length},
        .arena = run->arena,
        .config = &run->config,
        .tokenized = &tokenized,
    };
    if (uform_text_tokenize(&args) != UFORM_OK) return command_fail_engine();
    for (size_t item = 0; item < run->count; ++item) {
        int code = write_item(run, &tokenized, item);
        if (code != COMMAND_OK) return code;
    }
    run->written += run->count;
    run->count = 0;
    run->length = 0;
    return COMMAND_OK;
}

static int add_text(tokenize_run_t *run, char const *text, size_t length) {
    if (run->count == BATCH_TEXTS || (run->count && run->length + length > BATCH_BYTES)) {
        int code = flush_batch(run);
        if (code != COMMAND_OK) return code;
    }
    if (!command_reserve(&run->bytes, &run->bytes_capacity, run->length + length + 1, BATCH_BYTES))
        return command_fail("out of memory");
    memcpy(run->bytes + run->length, text, length);
    run->offsets[run->count] = run->length;
    run->length += length;
    run->offsets[++run->count] = run->length;
    return COMMAND_OK;
}

static int tokenize_all(tokenize_run_t *run, tokenize_flags_t const *flags) {
    input_t *input = NULL;
    int code = input_open(flags->texts, flags->texts_count, 0, flags->manifest, &input);
    for (bool done = false; code == COMMAND_OK;) {
        input_item_t item;
        code = input_next(input, &item, &done);
        if (code != COMMAND_OK || done) break;
        if (item.modality != UFORM_MODALITY_TEXT) {
            code = command_fail("item %zu is not a text: uform tokenize cuts texts only",
                                run->written + run->count);
            break;
        }
        code = add_text(run, item.bytes, item.length);
    }
    input_close(input);
    if (code == COMMAND_OK) code = flush_batch(run);
    if (code == COMMAND_OK && fflush(stdout) != 0) code = command_fail("cannot write standard output");
    if (code == COMMAND_OK && run->failed)
        code = command_fail("%zu of %zu texts could not be cut", run->failed, run->written);
    return code;
}

int command_tokenize(int argc, char **argv) {
    tokenize_flags_t flags = {.texts = calloc((size_t)argc + 1, sizeof(char const *))};
    if (!flags.texts) return command_fail("out of memory");
    tokenize_run_t run = {.offsets = malloc((BATCH_TEXTS + 1) * sizeof(size_t))};
    int code = run.offsets ? parse_flags(argc, argv, &flags) : command_fail("out of memory");
    if (code != COMMAND_OK || flags.help) goto done;
    char const *path = flags.tokenizer ? flags.tokenizer : flags.model;
    size_t length = strlen(path);
    if (flags.model && length > 12 && strcmp(path + length - 12, ".safetensors") == 0) {
        code = command_fail("%s is a checkpoint of the engine's own format, whose texts are bytes: it has no "
                            "tokenizer",
                            path);
        goto done;
    }
    /* A model named by its hub id where no such file or folder exists, as the other commands load it. */
    char folder[4096];
    if (flags.model && command_hub_folder(path, folder, sizeof folder)) path = folder;
    uform_ram_options_t options = uform_ram_options_default();
    options.threads = flags.threads;
    run.config.without_special_tokens = flags.plain;
    if (uform_tokenizer_open(path, &run.tokenizer) != UFORM_OK ||
        uform_executor_create_ram(&options, &run.executor) != UFORM_OK ||
        uform_arena_create(run.executor, &run.arena) != UFORM_OK) {
        code = command_fail_engine();
        goto done;
    }
    code = tokenize_all(&run, &flags);
done:
    uform_arena_free(run.arena);
    uform_executor_free(run.executor);
    uform_tokenizer_free(run.tokenizer);
    free(run.bytes);
    free(run.offsets);
    free(run.line);
    free(flags.texts);
    return code;
}
