/* The vocabulary: token strings to dense ids through an open-addressing table (FNV-1a, linear
 * probing, at most half full), and ids back to their strings. */
#include <stdlib.h>
#include <string.h>

#include "components.h"

static uint64_t hash_bytes(char const *string, size_t length) {
    uint64_t hash = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < length; ++i)
        hash = (hash ^ (uint8_t)string[i]) * 0x100000001b3ull;
    return hash;
}

void vocab_free(vocab_t *vocab) {
    free(vocab->bytes);
    free(vocab->offsets);
    free(vocab->present);
    free(vocab->table);
    *vocab = (vocab_t){0};
}

uform_status_t vocab_build(vocab_t *vocab, vocab_entry_t const *entries, size_t count, char const *what,
                           tokenizer_fault_t *fault) {
    *vocab = (vocab_t){0};
    if (count >= UINT32_MAX / 2) return tokenizer_fail(fault, UFORM_FORMAT, "%s: too many tokens", what);
    size_t ids = 0, bytes = 0;
    for (size_t i = 0; i < count; ++i) {
        if (entries[i].id >= ids) ids = (size_t)entries[i].id + 1;
        bytes += entries[i].length;
    }
    if (ids > count + count / 2 + 1024)
        return tokenizer_fail(fault, UFORM_FORMAT, "%s: token ids leave most of their range unused", what);
    if (bytes >= UINT32_MAX) return tokenizer_fail(fault, UFORM_FORMAT, "%s: tokens too long", what);
    size_t table_size = 16;
    while (table_size < 2 * count + 2)
        table_size *= 2;
    vocab->bytes = malloc(bytes + 1);
    vocab->offsets = calloc(ids + 1, sizeof *vocab->offsets);
    vocab->present = calloc(ids + 1, sizeof *vocab->present);
    vocab->table = calloc(table_size, sizeof *vocab->table);
    if (!vocab->bytes || !vocab->offsets || !vocab->present || !vocab->table) {
        vocab_free(vocab);
        return tokenizer_fail(fault, UFORM_OUT_OF_MEMORY, "%s: out of memory", what);
    }
    vocab->count = ids;
    vocab->table_size = table_size;
    /* Lengths by id first, then offsets as their running sum, then the bytes in id order. */
    uint32_t *lengths = calloc(ids + 1, sizeof *lengths);
    if (!lengths) {
        vocab_free(vocab);
        return tokenizer_fail(fault, UFORM_OUT_OF_MEMORY, "%s: out of memory", what);
    }
    for (size_t i = 0; i < count; ++i) {
        if (vocab->present[entries[i].id]) {
            free(lengths);
            vocab_free(vocab);
            return tokenizer_fail(fault, UFORM_FORMAT, "%s: id %u given twice", what, entries[i].id);
        }
        vocab->present[entries[i].id] = true;
        lengths[entries[i].id] = (uint32_t)entries[i].length;
    }
    for (size_t id = 0; id < ids; ++id)
        vocab->offsets[id + 1] = vocab->offsets[id] + lengths[id];
    free(lengths);
    for (size_t i = 0; i < count; ++i) {
        vocab_entry_t const *entry = &entries[i];
        if (vocab_find(vocab, entry->string, entry->length) >= 0) {
            vocab_free(vocab);
            return tokenizer_fail(fault, UFORM_FORMAT, "%s: a token is given twice", what);
        }
        memcpy(vocab->bytes + vocab->offsets[entry->id], entry->string, entry->length);
        size_t slot = hash_bytes(entry->string, entry->length) & (table_size - 1);
        while (vocab->table[slot])
            slot = (slot + 1) & (table_size - 1);
        vocab->table[slot] = entry->id + 1;
    }
    return UFORM_OK;
}

int64_t vocab_find(vocab_t const *vocab, char const *string, size_t length) {
    if (!vocab->table_size) return -1;
    size_t mask = vocab->table_size - 1;
    for (size_t slot = hash_bytes(string, length) & mask;; slot = (slot + 1) & mask) {
        uint32_t entry = vocab->table[slot];
        if (!entry) return -1;
        uint32_t id = entry - 1;
        size_t size = vocab->offsets[id + 1] - vocab->offsets[id];
        if (size == length && memcmp(vocab->bytes + vocab->offsets[id], string, length) == 0) return id;
    }
}

char const *vocab_token(vocab_t const *vocab, uint32_t id, size_t *length) {
    if (id >= vocab->count || !vocab->present[id]) return NULL;
    *length = vocab->offsets[id + 1] - vocab->offsets[id];
    return vocab->bytes + vocab->offsets[id];
}
