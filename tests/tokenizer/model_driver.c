/* The tokenizer's models as a filter, for tests/tokenizer/test_models.py (which compares them with
 * Hugging Face's tokenizers):
 *
 *     model_driver MODEL.json TEXTS.json          cuts each text as one piece
 *     model_driver --bench MODEL.json TEXT ROUNDS  cuts TEXT's words, ROUNDS times, and says how fast
 *
 * MODEL.json is a model object, or a tokenizer.json whose "model" is taken. TEXTS.json is an array of
 * strings; for each, one line: "id:begin-end ..." (original bytes of the text), or "error: MESSAGE" when
 * the cut fails. When the model cannot be read, one line "refused STATUS: MESSAGE". In --bench, TEXT is
 * split at ASCII white space and each word is one piece, as a pre-tokenizer would give them. Exit
 * status: 0, or 1 on bad arguments or input. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "components.h"
#include "models.h"

static void work_release(tokenizer_work_t *work) {
    model_work_free(work);
    for (size_t i = 0; i < TOKENIZER_WORK_TEMPS; ++i)
        pieces_free(&work->temps[i]);
    free(work->bytes);
}

static model_t *model_load(char const *path) {
    json_error_t error;
    json_t *root = json_load_file(path, 0, &error);
    if (!root) {
        fprintf(stderr, "%s: %s\n", path, error.text);
        return NULL;
    }
    json_t const *object = json_object_get(root, "model");
    tokenizer_fault_t fault = {{0}};
    model_t *model = NULL;
    uform_status_t status = model_parse(object ? object : root, &model, &fault);
    if (status != UFORM_OK) printf("refused %s: %s\n", uform_status_name(status), fault.message);
    json_decref(root);
    return model;
}

/* Cuts one text as one piece into `tokens` (emptied first). */
static uform_status_t cut(model_t const *model, uint8_t const *text, size_t length, pieces_t *pieces,
                          tokens_t *tokens, tokenizer_work_t *work) {
    size_t bad;
    pieces_clear(pieces);
    tokens->count = 0;
    uform_status_t status = pieces_from_utf8(pieces, text, length, &bad);
    for (size_t i = 0; i < pieces->count && status == UFORM_OK; ++i)
        status = model_tokenize(model, pieces, i, tokens, work);
    return status;
}

static int run_texts(model_t const *model, char const *path) {
    json_error_t error;
    json_t *texts = json_load_file(path, 0, &error);
    if (!json_is_array(texts)) {
        fprintf(stderr, "%s: not an array of strings\n", path);
        json_decref(texts);
        return 1;
    }
    tokenizer_work_t work = {0};
    pieces_t pieces = {0};
    tokens_t tokens = {0};
    size_t index;
    json_t *text;
    json_array_foreach(texts, index, text) {
        uform_status_t status = cut(model, (uint8_t const *)json_string_value(text), json_string_length(text),
                                    &pieces, &tokens, &work);
        if (status != UFORM_OK) {
            printf("error: %s\n",
                   status == UFORM_FORMAT ? model_work_fault(&work) : uform_status_name(status));
            continue;
        }
        for (size_t i = 0; i < tokens.count; ++i)
            printf("%s%u:%u-%u", i ? " " : "", tokens.ids[i], tokens.spans[i].begin, tokens.spans[i].end);
        printf("\n");
    }
    pieces_free(&pieces);
    tokens_free(&tokens);
    work_release(&work);
    json_decref(texts);
    return 0;
}

static char *read_file(char const *path, size_t *length) {
    FILE *file = fopen(path, "rb");
    if (!file) return NULL;
    char *bytes = NULL;
    if (fseek(file, 0, SEEK_END) == 0) {
        long size = ftell(file);
        if (size >= 0 && fseek(file, 0, SEEK_SET) == 0 && (bytes = malloc((size_t)size + 1))) {
            *length = fread(bytes, 1, (size_t)size, file);
            bytes[*length] = '\0';
        }
    }
    fclose(file);
    return bytes;
}

static bool blank(char c) {
    return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

static int run_bench(model_t const *model, char const *path, long rounds) {
    size_t length;
    char *text = read_file(path, &length);
    if (!text) {
        fprintf(stderr, "%s: cannot read\n", path);
        return 1;
    }
    tokenizer_work_t work = {0};
    pieces_t pieces = {0};
    tokens_t tokens = {0};
    size_t words = 0, made = 0;
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    uform_status_t status = UFORM_OK;
    for (long round = 0; round < rounds && status == UFORM_OK; ++round) {
        for (size_t at = 0; at < length && status == UFORM_OK;) {
            while (at < length && blank(text[at]))
                at++;
            size_t begin = at;
            while (at < length && !blank(text[at]))
                at++;
            if (at == begin) break;
            status = cut(model, (uint8_t const *)text + begin, at - begin, &pieces, &tokens, &work);
            words++;
            made += tokens.count;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    double seconds = (double)(end.tv_sec - start.tv_sec) + 1e-9 * (double)(end.tv_nsec - start.tv_nsec);
    printf("%zu words, %zu tokens, %.3f s: %.0f words/s (%s)\n", words, made, seconds,
           (double)words / seconds, uform_status_name(status));
    pieces_free(&pieces);
    tokens_free(&tokens);
    work_release(&work);
    free(text);
    return status == UFORM_OK ? 0 : 1;
}

int main(int argc, char **argv) {
    bool bench = argc == 5 && strcmp(argv[1], "--bench") == 0;
    if (!bench && argc != 3) {
        fprintf(stderr, "usage: %s MODEL.json TEXTS.json | --bench MODEL.json TEXT ROUNDS\n", argv[0]);
        return 1;
    }
    model_t *model = model_load(argv[bench ? 2 : 1]);
    if (!model) return 0;
    int code = bench ? run_bench(model, argv[3], atol(argv[4])) : run_texts(model, argv[2]);
    model_free(model);
    return code;
}
