/* What the models share (models.h): scratch buffers, words' tokens emitted as spans, faults, the
 * vocabulary read from a JSON object. The models call these; models.c dispatches to the models. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models.h"

void *model_reserve(void **buffer, size_t *capacity, size_t bytes) {
    if (bytes <= *capacity) return *buffer;
    size_t next = *capacity + *capacity / 2;
    if (next < bytes) next = bytes;
    if (next < 256) next = 256;
    void *moved = realloc(*buffer, next);
    if (!moved) return NULL;
    *buffer = moved;
    *capacity = next;
    return moved;
}

uform_status_t model_word_push(model_work_t *scratch, uint32_t id, uint32_t begin, uint32_t end) {
    size_t bytes = scratch->word_capacity * sizeof *scratch->word;
    if (scratch->word_count == scratch->word_capacity) {
        if (!model_reserve((void **)&scratch->word, &bytes,
                           (scratch->word_count + 1) * sizeof *scratch->word))
            return UFORM_OUT_OF_MEMORY;
        scratch->word_capacity = bytes / sizeof *scratch->word;
    }
    scratch->word[scratch->word_count++] = (word_token_t){id, begin, end};
    return UFORM_OK;
}

uform_status_t model_emit_word(model_text_t const *text, tokens_t *out, word_token_t const *tokens,
                               size_t count) {
    for (size_t i = 0; i < count; ++i) {
        uform_status_t status = model_emit(text, out, tokens[i].id, tokens[i].begin, tokens[i].end);
        if (status != UFORM_OK) return status;
    }
    return UFORM_OK;
}

uform_status_t model_refuse(model_work_t *scratch, char const *format, ...) {
    va_list list;
    va_start(list, format);
    vsnprintf(scratch->fault, sizeof scratch->fault, format, list);
    va_end(list);
    return UFORM_FORMAT;
}

char const *model_work_fault(tokenizer_work_t const *work) {
    model_work_t const *scratch = work->model;
    return scratch ? scratch->fault : "";
}

char *model_copy_string(char const *string, size_t length) {
    char *copy = malloc(length + 1);
    if (!copy) return NULL;
    memcpy(copy, string, length);
    copy[length] = '\0';
    return copy;
}

void model_byte_ids(vocab_t const *vocab, int64_t ids[256]) {
    for (int byte = 0; byte < 256; ++byte) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", byte);
        ids[byte] = vocab_find(vocab, name, 6);
    }
}

uform_status_t model_required_string(json_t const *object, char const *key, char const **value,
                                     size_t *length, char const *what, tokenizer_fault_t *fault) {
    json_t const *found = json_object_get(object, key);
    if (!found) return tokenizer_fail(fault, UFORM_FORMAT, "%s: \"%s\" is missing", what, key);
    if (!json_is_string(found))
        return tokenizer_fail(fault, UFORM_FORMAT, "%s: \"%s\" is not a string", what, key);
    *value = json_string_value(found);
    *length = json_string_length(found);
    return UFORM_OK;
}

uform_status_t model_vocab_object(json_t const *object, vocab_t *vocab, char const *what,
                                  tokenizer_fault_t *fault) {
    json_t const *found = json_object_get(object, "vocab");
    if (!found) return tokenizer_fail(fault, UFORM_FORMAT, "%s: \"vocab\" is missing", what);
    if (!json_is_object(found))
        return tokenizer_fail(fault, UFORM_FORMAT, "%s: \"vocab\" is not an object", what);
    size_t count = json_object_size(found);
    vocab_entry_t *entries = malloc((count ? count : 1) * sizeof *entries);
    if (!entries) return tokenizer_fail(fault, UFORM_OUT_OF_MEMORY, "%s: out of memory", what);
    size_t at = 0;
    char const *token;
    json_t *id;
    json_object_foreach((json_t *)found, token, id) {
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) > UINT32_MAX) {
            free(entries);
            return tokenizer_fail(fault, UFORM_FORMAT, "%s: the id of \"%.40s\" is not a u32", what, token);
        }
        entries[at++] = (vocab_entry_t){token, strlen(token), (uint32_t)json_integer_value(id)};
    }
    uform_status_t status = vocab_build(vocab, entries, at, what, fault);
    free(entries);
    return status;
}
