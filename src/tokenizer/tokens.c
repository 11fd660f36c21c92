/* Tokens: ids with the original bytes each covers, grown by half again. */
#include <stdlib.h>

#include "components.h"

uform_status_t tokens_push(tokens_t *tokens, uint32_t id, piece_span_t span, bool special) {
    if (tokens->count == tokens->capacity) {
        size_t capacity = tokens->capacity ? tokens->capacity + tokens->capacity / 2 : 64;
        uint32_t *ids = realloc(tokens->ids, capacity * sizeof *ids);
        if (ids) tokens->ids = ids;
        piece_span_t *spans = ids ? realloc(tokens->spans, capacity * sizeof *spans) : NULL;
        if (spans) tokens->spans = spans;
        uint8_t *specials = spans ? realloc(tokens->special, capacity * sizeof *specials) : NULL;
        if (!specials) return UFORM_OUT_OF_MEMORY;
        tokens->special = specials;
        tokens->capacity = capacity;
    }
    tokens->ids[tokens->count] = id;
    tokens->spans[tokens->count] = span;
    tokens->special[tokens->count] = special;
    tokens->count++;
    return UFORM_OK;
}

void tokens_free(tokens_t *tokens) {
    free(tokens->ids);
    free(tokens->spans);
    free(tokens->special);
    *tokens = (tokens_t){0};
}
