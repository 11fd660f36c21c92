/* The pre-tokenizers as a filter, for tests/tokenizer/test_pre_tokenizers.py:
 *
 *     pre_tokenize_driver PRE_TOKENIZER.json < texts > pieces
 *
 * reads a pre-tokenizer's JSON object (as tokenizer.json has it), then texts, one JSON string a line;
 * for each writes one line, a JSON array of [piece, begin, end]: the piece's UTF-8 and the original
 * bytes from its first code point's begin to its last one's end. Exit status: 0; 1 on bad arguments or
 * input; 2 when the pre-tokenizer cannot be read, with "error STATUS MESSAGE" on standard output. */
#include <oniguruma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "components.h"

static void work_free(tokenizer_work_t *work) {
    for (size_t i = 0; i < TOKENIZER_WORK_TEMPS; ++i)
        pieces_free(&work->temps[i]);
    free(work->bytes);
    if (work->region) onig_region_free(work->region, 1);
}

/* One piece as [utf8, begin, end], or NULL when memory fails. */
static json_t *piece_json(pieces_t const *pieces, size_t index) {
    uint32_t size = pieces_size(pieces, index);
    uint32_t const *chars = pieces_chars(pieces, index);
    piece_span_t const *spans = pieces_spans(pieces, index);
    uint8_t *bytes = malloc(4 * (size_t)size + 1);
    if (!bytes) return NULL;
    size_t length = 0;
    for (uint32_t i = 0; i < size; ++i)
        length += utf8_put(bytes + length, chars[i]);
    json_t *entry = json_pack("[s%II]", (char const *)bytes, length, (json_int_t)(size ? spans[0].begin : 0),
                              (json_int_t)(size ? spans[size - 1].end : 0));
    free(bytes);
    return entry;
}

/* Pre-tokenizes one text and prints its line; 0, or 1 on bad input or failure. */
static int run_text(pre_tokenizer_t const *pre_tokenizer, char const *line, tokenizer_work_t *work,
                    pieces_t *in, pieces_t *out) {
    json_t *text = json_loads(line, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    if (!json_is_string(text)) {
        json_decref(text);
        return 1;
    }
    size_t bad = 0;
    pieces_clear(in);
    pieces_clear(out);
    uform_status_t status =
        pieces_from_utf8(in, (uint8_t const *)json_string_value(text), json_string_length(text), &bad);
    json_decref(text);
    if (status == UFORM_OK) status = pre_tokenizer_apply(pre_tokenizer, in, out, work);
    json_t *list = status == UFORM_OK ? json_array() : NULL;
    for (size_t i = 0; list && i < out->count; ++i)
        if (json_array_append_new(list, piece_json(out, i)) != 0) json_decref(list), list = NULL;
    char *dumped = list ? json_dumps(list, JSON_COMPACT) : NULL;
    json_decref(list);
    if (!dumped) return 1;
    printf("%s\n", dumped);
    free(dumped);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s PRE_TOKENIZER.json < texts > pieces\n", argv[0]);
        return 1;
    }
    json_error_t error;
    json_t *object = json_load_file(argv[1], 0, &error);
    if (!object) {
        fprintf(stderr, "%s: %s\n", argv[1], error.text);
        return 1;
    }
    tokenizer_fault_t fault = {{0}};
    pre_tokenizer_t *pre_tokenizer = NULL;
    uform_status_t status = pre_tokenizer_parse(object, &pre_tokenizer, &fault);
    json_decref(object);
    if (status != UFORM_OK) {
        printf("error %s %s\n", uform_status_name(status), fault.message);
        return 2;
    }
    tokenizer_work_t work = {0};
    pieces_t in = {0}, out = {0};
    char *line = NULL;
    size_t capacity = 0;
    int result = 0;
    while (result == 0 && getline(&line, &capacity, stdin) > 0)
        result = run_text(pre_tokenizer, line, &work, &in, &out);
    free(line);
    pieces_free(&in);
    pieces_free(&out);
    work_free(&work);
    pre_tokenizer_free(pre_tokenizer);
    return result;
}
