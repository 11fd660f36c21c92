/* Reading tokenizer.json's objects: typed members with defaults, faults that name what was wrong, and
 * the per-thread scratch every component shares. */
#include <stdarg.h>
#include <string.h>
#include <stdio.h>
#include <stdlib.h>

#include "components.h"

uform_status_t tokenizer_fail(tokenizer_fault_t *fault, uform_status_t status, char const *format, ...) {
    va_list list;
    va_start(list, format);
    vsnprintf(fault->message, sizeof fault->message, format, list);
    va_end(list);
    return status;
}

/* The member, or NULL when absent or JSON null. */
static json_t const *member(json_t const *object, char const *key) {
    json_t const *value = json_object_get(object, key);
    return value && !json_is_null(value) ? value : NULL;
}

uform_status_t json_get_bool(json_t const *object, char const *key, bool fallback, bool *value,
                             char const *what, tokenizer_fault_t *fault) {
    json_t const *found = member(object, key);
    if (!found) {
        *value = fallback;
        return UFORM_OK;
    }
    if (!json_is_boolean(found))
        return tokenizer_fail(fault, UFORM_FORMAT, "%s: \"%s\" is not a boolean", what, key);
    *value = json_is_true(found);
    return UFORM_OK;
}

uform_status_t json_get_size(json_t const *object, char const *key, size_t fallback, size_t *value,
                             char const *what, tokenizer_fault_t *fault) {
    json_t const *found = member(object, key);
    if (!found) {
        *value = fallback;
        return UFORM_OK;
    }
    if (!json_is_integer(found) || json_integer_value(found) < 0)
        return tokenizer_fail(fault, UFORM_FORMAT, "%s: \"%s\" is not a count", what, key);
    *value = (size_t)json_integer_value(found);
    return UFORM_OK;
}

uform_status_t json_get_string(json_t const *object, char const *key, char const *fallback,
                               char const **value, size_t *length, char const *what,
                               tokenizer_fault_t *fault) {
    json_t const *found = member(object, key);
    if (!found) {
        *value = fallback;
        if (length) *length = fallback ? strlen(fallback) : 0;
        return UFORM_OK;
    }
    if (!json_is_string(found))
        return tokenizer_fail(fault, UFORM_FORMAT, "%s: \"%s\" is not a string", what, key);
    *value = json_string_value(found);
    if (length) *length = json_string_length(found);
    return UFORM_OK;
}

uform_status_t json_get_type(json_t const *object, char const **type, char const *what,
                             tokenizer_fault_t *fault) {
    if (!json_is_object(object)) return tokenizer_fail(fault, UFORM_FORMAT, "%s is not an object", what);
    json_t const *found = json_object_get(object, "type");
    if (!found || !json_is_string(found))
        return tokenizer_fail(fault, UFORM_FORMAT, "%s has no \"type\" string", what);
    *type = json_string_value(found);
    return UFORM_OK;
}

pieces_t *work_take(tokenizer_work_t *work) {
    if (work->temps_taken == TOKENIZER_WORK_TEMPS) return NULL;
    pieces_t *temp = &work->temps[work->temps_taken++];
    pieces_clear(temp);
    return temp;
}

void work_give(tokenizer_work_t *work) {
    if (work->temps_taken) work->temps_taken--;
}

uint8_t *work_bytes(tokenizer_work_t *work, size_t size) {
    if (size <= work->bytes_capacity) return work->bytes;
    size_t capacity = work->bytes_capacity + work->bytes_capacity / 2;
    if (capacity < size) capacity = size;
    uint8_t *bytes = realloc(work->bytes, capacity);
    if (!bytes) return NULL;
    work->bytes = bytes;
    work->bytes_capacity = capacity;
    return bytes;
}
