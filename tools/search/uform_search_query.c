/* uform search query: embeds a text or a file with the model of an index and prints the index's items
 * most similar to it, by cosine: the dot product of unit vectors. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "uform_search.h"

static char const help_head[] =
    "usage: uform search query INDEX (TEXT | --file PATH) [options]\n"
    "\n"
    "Embeds TEXT, or the file at PATH, with the model the index was made with, and prints the K items of\n"
    "INDEX (made by 'uform search index') most similar to it by cosine, the best first: one line\n"
    "'RANK SCORE PATH' per item, or a JSON object per line with --format jsonl. Scores are dot products\n"
    "of unit vectors, in [-1, 1]: an item equal to the query scores 1. Paths are relative to the folder\n"
    "that was indexed; equal scores keep the index's order.\n"
    "\n";

static char const help_tail[] =
    "\n"
    "Errors are one line on stderr: exit status 1 when the work failed (an index that is missing or\n"
    "damaged, a query the model cannot encode), 2 for a wrong command line.\n"
    "\n";

typedef enum query_format { QUERY_TEXT = 0, QUERY_JSONL = 1 } query_format_t;

typedef struct query_flags {
    char const *index, *text, *file, *model;
    size_t threads, top;
    int weights; /* a uform_weights_t */
    int format;  /* by query_format_t */
    bool help;
} query_flags_t;

typedef struct scored {
    float score;
    size_t item;
} scored_t;

/* ---- flags ------------------------------------------------------------------------------------ */

/* The positional arguments: INDEX, then TEXT. */
static int take_positional(void *context, char const *argument, bool literal) {
    (void)literal;
    query_flags_t *flags = context;
    if (!flags->index)
        flags->index = argument;
    else if (!flags->text)
        flags->text = argument;
    else
        return command_usage("search query", "one TEXT at a time: quote '%s %s'", flags->text, argument);
    return COMMAND_OK;
}

static command_help_t const help = {.name = "search query",
                                    .head = help_head,
                                    .tail = help_tail,
                                    .column = 21,
                                    .positional = take_positional};

static int parse_flags(int argc, char **argv, query_flags_t *flags) {
    static char const *const formats[] = {"text", "jsonl"}; /* by query_format_t */
    command_flag_t const table[] = {
        {"--file", FLAG_STRING, &flags->file, .value = "PATH",
         .help = "the query is this file, its modality by its extension as 'search index' takes\n"
                 "it: an image, a sound, a clip, or a .txt file's text"},
        {"--top", FLAG_SIZE, &flags->top, .value = "K", .minimum = 1,
         .help = "how many items to print; default 10"},
        {"--format", FLAG_CHOICE, &flags->format, .value = "FORMAT", .choices = formats, .choice_count = 2,
         .help = "text (default): 'RANK SCORE PATH' lines, the score with 6 decimals;\n"
                 "jsonl: {\"rank\", \"score\", \"path\", \"modality\"}, the score to read back exactly\n"
                 "and bytes of a path that are not UTF-8 as U+FFFD"},
        {"--model", FLAG_STRING, &flags->model, .value = "PATH",
         .help = "the checkpoint; default: the one the index records. Its widths must include\n"
                 "the index's dims"},
        command_flag_threads(&flags->threads),
        command_flag_weights(&flags->weights),
        {"--", FLAG_LITERALS, NULL, .help = "what follows is the TEXT, even when it starts with '-'"},
        {NULL},
    };
    command_spec_t const spec = {.help = &help, .flags = table, .context = flags, .missing = "which INDEX?"};
    int code = command_flags_parse(&spec, argc, argv, &flags->help);
    if (code != COMMAND_OK || flags->help) return code;
    if (!flags->text == !flags->file) return command_usage(help.name, "a TEXT or a --file, one of the two");
    return COMMAND_OK;
}

/* ---- the query -------------------------------------------------------------------------------- */

/* The query as one item of a batch: the text, a .txt file's text, or a media file's path. */
static int query_item(query_flags_t const *flags, command_engine_t const *engine, encode_batch_t *batch) {
    if (flags->text) return encode_batch_add(batch, UFORM_MODALITY_TEXT, flags->text, strlen(flags->text));
    uform_modality_t modality = UFORM_MODALITY_TEXT;
    if (!input_file_modality(flags->file, strlen(flags->file), &modality))
        return command_usage("search query",
                             "--file %s: not an image, sound, clip or .txt file by its extension",
                             flags->file);
    if (modality != UFORM_MODALITY_TEXT)
        return encode_batch_add(batch, modality, flags->file, strlen(flags->file));
    char *text = NULL;
    size_t length = 0;
    char const *why = NULL;
    uform_status_t status = search_read_text(flags->file, engine->info.text.context, &text, &length, &why);
    if (status != UFORM_OK)
        return command_fail("--file %s: %s (%s)", flags->file, uform_status_name(status), why);
    int code = encode_batch_add(batch, UFORM_MODALITY_TEXT, text, length);
    free(text);
    return code;
}

/* Best first; equal scores in the index's order, so that the ranking is the same on every machine. */
static int compare_scored(void const *a, void const *b) {
    scored_t const *left = a, *right = b;
    if (left->score != right->score) return left->score > right->score ? -1 : 1;
    return left->item < right->item ? -1 : left->item > right->item;
}

/* The length of the valid UTF-8 sequence of 2 to 4 bytes at `bytes`, or 0: no overlong forms, no
 * surrogates, nothing past U+10FFFF. */
static size_t utf8_sequence(unsigned char const *bytes, size_t available) {
    size_t length = 0;
    uint32_t point = 0, least = 0;
    if (bytes[0] >= 0xc2 && bytes[0] <= 0xdf)
        length = 2, point = bytes[0] & 0x1f, least = 0x80;
    else if ((bytes[0] & 0xf0) == 0xe0)
        length = 3, point = bytes[0] & 0x0f, least = 0x800;
    else if (bytes[0] >= 0xf0 && bytes[0] <= 0xf4)
        length = 4, point = bytes[0] & 0x07, least = 0x10000;
    if (!length || available < length) return 0;
    for (size_t i = 1; i < length; ++i) {
        if ((bytes[i] & 0xc0) != 0x80) return 0;
        point = point << 6 | (bytes[i] & 0x3f);
    }
    if (point < least || point > 0x10ffff || (point >= 0xd800 && point <= 0xdfff)) return 0;
    return length;
}

/* A JSON string of a path's bytes, which need not be UTF-8. */
static void write_json_string(char const *text, size_t length) {
    unsigned char const *bytes = (unsigned char const *)text;
    putchar('"');
    for (size_t i = 0; i < length;) {
        if (bytes[i] < 0x80) {
            if (bytes[i] == '"' || bytes[i] == '\\')
                printf("\\%c", bytes[i]);
            else if (bytes[i] < 0x20)
                printf("\\u%04x", bytes[i]);
            else
                putchar(bytes[i]);
            ++i;
            continue;
        }
        size_t sequence = utf8_sequence(bytes + i, length - i);
        if (sequence)
            fwrite(bytes + i, 1, sequence, stdout);
        else
            fputs("\\ufffd", stdout);
        i += sequence ? sequence : 1;
    }
    putchar('"');
}

static int print_ranking(search_index_t const *index, float const *query, size_t top, bool jsonl) {
    scored_t *scores = malloc((index->items ? index->items : 1) * sizeof *scores);
    if (!scores) return command_fail("out of memory for %zu scores", index->items);
    for (size_t item = 0; item < index->items; ++item) {
        float const *vector = index->vectors + item * index->dims;
        double dot = 0;
        for (size_t column = 0; column < index->dims; ++column)
            dot += (double)query[column] * vector[column];
        scores[item] = (scored_t){(float)dot, item};
    }
    qsort(scores, index->items, sizeof *scores, compare_scored);
    for (size_t rank = 0; rank < top && rank < index->items; ++rank) {
        size_t length = 0, item = scores[rank].item;
        char const *path = search_index_path(index, item, &length);
        if (jsonl) {
            printf("{\"rank\":%zu,\"score\":%.9g,\"path\":", rank + 1, (double)scores[rank].score);
            write_json_string(path, length);
            printf(",\"modality\":\"%s\"}\n", command_modality_names[index->modalities[item]]);
        } else {
            printf("%zu %.6f %.*s\n", rank + 1, (double)scores[rank].score, (int)length, path);
        }
    }
    free(scores);
    if (fflush(stdout) != 0 || ferror(stdout))
        return command_fail("cannot write the standard output: %s", strerror(errno ? errno : EIO));
    return COMMAND_OK;
}

/* ---- the command ------------------------------------------------------------------------------ */

int search_query(int argc, char **argv) {
    query_flags_t flags = {.top = 10};
    search_index_t index = {0};
    command_engine_t engine = {0};
    encode_batch_t *batch = calloc(1, sizeof *batch);
    int code = COMMAND_OK;
    if (!batch) return command_fail("out of memory");
    if ((code = parse_flags(argc, argv, &flags)) != COMMAND_OK || flags.help) goto done;
    if ((code = search_index_read(flags.index, &index)) != COMMAND_OK) goto done;

    char const *model = flags.model ? flags.model : index.model;
    if (!flags.model && access(model, R_OK) != 0) {
        code = command_fail("cannot read the index's model %s: %s (pass --model)", model, strerror(errno));
        goto done;
    }
    if ((code = command_engine_open(model, flags.threads, flags.weights, &engine)) != COMMAND_OK) goto done;
    uform_encode_config_t config = {.outputs_scalar = UFORM_F32};
    if ((code = command_matryoshka(&engine, index.dims, "the index's dims", &config.matryoshka)) !=
        COMMAND_OK)
        goto done;
    if ((code = query_item(&flags, &engine, batch)) != COMMAND_OK) goto done;

    uform_encoded_t encoded;
    if (encode_batch_run(&engine, UFORM_OUTPUT_EMBEDDINGS, &config, batch, &encoded) != UFORM_OK) {
        code = command_fail_engine();
        goto done;
    }
    if (encoded.statuses[0] != UFORM_OK) {
        code = flags.text
                   ? command_fail("the query: %s", uform_status_name(encoded.statuses[0]))
                   : command_fail("--file %s (%s): %s", flags.file, command_modality_names[batch->modality],
                                  uform_status_name(encoded.statuses[0]));
        goto done;
    }
    void const *query = NULL;
    if (uform_view_row(&encoded.embeddings, 0, &query) != UFORM_OK) {
        code = command_fail_engine();
        goto done;
    }
    code = print_ranking(&index, query, flags.top, flags.format == QUERY_JSONL);

done:
    command_engine_close(&engine);
    search_index_free(&index);
    encode_batch_release(batch);
    free(batch);
    return code;
}
