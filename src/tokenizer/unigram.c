/* Unigram (tokenizers' models/unigram): the cut of highest total score, by Viterbi over the word's bytes
 * as model.rs's encode_optimized does. From each code point boundary (left to right), every piece that
 * begins there (found shortest first in a trie of the pieces' bytes) offers the best path to its end its
 * score plus the best path to its start; the first offer is taken, and a later one only when strictly
 * better. A code point no one-code-point piece covers offers itself as unk, scored the lowest score less
 * 10 (kUnkPenalty). Walking back from the end, consecutive unk tokens fuse into one string; a fused
 * string is looked up whole (it may be a piece), then as byte tokens "<0xAB>" with byte_fallback (each
 * over the whole string), then is unk. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "models.h"

#define UNIGRAM_UNK_PENALTY 10.0
#define UNIGRAM_HASH        0x9E3779B97F4A7C15ull
#define UNIGRAM_NONE        UINT32_MAX
#define UNIGRAM_LOOKUP      UINT32_MAX /* a fused string still to be looked up */

/* An edge of the trie: (parent node << 8 | byte), parent > 0 (the root's edges are an array), to child. */
typedef struct unigram_edge {
    uint64_t key;
    uint32_t child;
} unigram_edge_t;

struct unigram {
    double *scores;   /* per id */
    double unk_score; /* the lowest score less the penalty */
    int64_t unk_id;   /* -1: none (an error only when a word needs it) */
    bool byte_fallback;
    int64_t byte_ids[256];
    uint32_t root[256];    /* the root's child per byte, 0 for none */
    unigram_edge_t *edges; /* open addressing, at most half full */
    size_t edge_mask;
    unsigned edge_shift;
    int32_t *node_token; /* per node: the id of the piece ending there, or -1 */
    uint32_t node_count;
};

void unigram_free(unigram_t *unigram) {
    if (!unigram) return;
    free(unigram->scores);
    free(unigram->edges);
    free(unigram->node_token);
    free(unigram);
}

/* ---- the trie ------------------------------------------------------------------------------------ */

static inline size_t unigram_slot(unigram_t const *unigram, uint64_t key) {
    return (key * UNIGRAM_HASH) >> unigram->edge_shift;
}

/* The child of `node` by `byte`, or 0. */
static inline uint32_t unigram_child(unigram_t const *unigram, uint32_t node, uint8_t byte) {
    if (node == 0) return unigram->root[byte];
    uint64_t key = (uint64_t)node << 8 | byte;
    for (size_t slot = unigram_slot(unigram, key);; slot = (slot + 1) & unigram->edge_mask) {
        if (unigram->edges[slot].key == key) return unigram->edges[slot].child;
        if (!unigram->edges[slot].key) return 0;
    }
}

static uint32_t unigram_add_child(unigram_t *unigram, uint32_t node, uint8_t byte) {
    uint32_t child = unigram->node_count++;
    unigram->node_token[child] = -1;
    if (node == 0) {
        unigram->root[byte] = child;
        return child;
    }
    uint64_t key = (uint64_t)node << 8 | byte;
    size_t slot = unigram_slot(unigram, key);
    while (unigram->edges[slot].key)
        slot = (slot + 1) & unigram->edge_mask;
    unigram->edges[slot] = (unigram_edge_t){key, child};
    return child;
}

/* Every piece's bytes into the trie: at most one node per byte of the vocabulary, and the root. */
static uform_status_t unigram_trie(unigram_t *unigram, vocab_t const *vocab, tokenizer_fault_t *fault) {
    size_t bytes = vocab->offsets[vocab->count], size = 16;
    while (size < 2 * bytes + 2)
        size *= 2;
    unigram->edges = calloc(size, sizeof *unigram->edges);
    unigram->node_token = malloc((bytes + 1) * sizeof *unigram->node_token);
    if (!unigram->edges || !unigram->node_token)
        return tokenizer_fail(fault, UFORM_OUT_OF_MEMORY, "Unigram: out of memory");
    unigram->edge_mask = size - 1;
    unigram->edge_shift = 64;
    while (((size_t)1 << (64 - unigram->edge_shift)) < size)
        unigram->edge_shift--;
    unigram->node_count = 1;
    unigram->node_token[0] = -1; /* an empty piece: the search never stops at the root */
    for (uint32_t id = 0; id < vocab->count; ++id) {
        uint8_t const *token = (uint8_t const *)vocab->bytes + vocab->offsets[id];
        uint32_t node = 0;
        for (uint32_t i = 0, n = vocab->offsets[id + 1] - vocab->offsets[id]; i < n; ++i) {
            uint32_t child = unigram_child(unigram, node, token[i]);
            node = child ? child : unigram_add_child(unigram, node, token[i]);
        }
        unigram->node_token[node] = (int32_t)id;
    }
    return UFORM_OK;
}

/* ---- reading ------------------------------------------------------------------------------------- */

/* "vocab": [[piece, score], ...], the id of each its place. */
static uform_status_t unigram_vocab(json_t const *list, unigram_t *unigram, vocab_t *vocab,
                                    tokenizer_fault_t *fault) {
    if (!json_is_array(list))
        return tokenizer_fail(fault, UFORM_FORMAT, "Unigram: \"vocab\" is not an array");
    size_t count = json_array_size(list);
    vocab_entry_t *entries = malloc((count ? count : 1) * sizeof *entries);
    unigram->scores = malloc((count ? count : 1) * sizeof *unigram->scores);
    if (!entries || !unigram->scores) {
        free(entries);
        return tokenizer_fail(fault, UFORM_OUT_OF_MEMORY, "Unigram: out of memory");
    }
    double lowest = INFINITY;
    for (size_t i = 0; i < count; ++i) {
        json_t const *item = json_array_get(list, i);
        json_t const *piece = json_array_get(item, 0), *score = json_array_get(item, 1);
        if (!json_is_array(item) || json_array_size(item) != 2 || !json_is_string(piece) ||
            !json_is_number(score) || !isfinite(json_number_value(score))) {
            free(entries);
            return tokenizer_fail(fault, UFORM_FORMAT, "Unigram: vocab entry %zu is not [piece, score]", i);
        }
        entries[i] = (vocab_entry_t){json_string_value(piece), json_string_length(piece), (uint32_t)i};
        unigram->scores[i] = json_number_value(score);
        if (unigram->scores[i] < lowest) lowest = unigram->scores[i];
    }
    unigram->unk_score = lowest - UNIGRAM_UNK_PENALTY;
    uform_status_t status = vocab_build(vocab, entries, count, "Unigram", fault);
    free(entries);
    return status;
}

/* "unk_id": null or an index into the vocabulary; "byte_fallback": a boolean when present. */
static uform_status_t unigram_options(json_t const *object, unigram_t *unigram, size_t count,
                                      tokenizer_fault_t *fault) {
    json_t const *unk = json_object_get(object, "unk_id");
    unigram->unk_id = -1;
    if (unk && !json_is_null(unk)) {
        if (!json_is_integer(unk) || json_integer_value(unk) < 0)
            return tokenizer_fail(fault, UFORM_FORMAT, "Unigram: \"unk_id\" is not an index");
        if (count == 0)
            return tokenizer_fail(fault, UFORM_FORMAT,
                                  "Unigram: the vocabulary is empty but at least <unk> is needed");
        if ((size_t)json_integer_value(unk) >= count)
            return tokenizer_fail(fault, UFORM_FORMAT, "Unigram: \"unk_id\" is larger than the vocabulary");
        unigram->unk_id = json_integer_value(unk);
    }
    json_t const *fallback = json_object_get(object, "byte_fallback");
    if (fallback && !json_is_boolean(fallback))
        return tokenizer_fail(fault, UFORM_FORMAT, "Unigram: \"byte_fallback\" is not a boolean");
    unigram->byte_fallback = fallback && json_is_true(fallback);
    return UFORM_OK;
}

uform_status_t unigram_parse(json_t const *object, model_t *model, tokenizer_fault_t *fault) {
    model->kind = MODEL_UNIGRAM;
    unigram_t *unigram = model->unigram = calloc(1, sizeof *unigram);
    if (!unigram) return tokenizer_fail(fault, UFORM_OUT_OF_MEMORY, "Unigram: out of memory");
    json_t const *list = json_object_get(object, "vocab");
    if (!list) return tokenizer_fail(fault, UFORM_FORMAT, "Unigram: \"vocab\" is missing");
    uform_status_t status = unigram_vocab(list, unigram, &model->vocab, fault);
    if (status == UFORM_OK) status = unigram_options(object, unigram, json_array_size(list), fault);
    if (status == UFORM_OK) status = unigram_trie(unigram, &model->vocab, fault);
    if (status == UFORM_OK) model_byte_ids(&model->vocab, unigram->byte_ids);
    return status;
}

/* ---- cutting ------------------------------------------------------------------------------------- */

/* The best path ending at a byte: its score, where its last token starts (UNIGRAM_NONE: no path yet),
 * that token's id. */
typedef struct unigram_node {
    double score;
    uint32_t start, id;
} unigram_node_t;

static inline void unigram_offer(unigram_node_t *target, double score, uint32_t start, uint32_t id) {
    if (target->start == UNIGRAM_NONE || score > target->score) *target = (unigram_node_t){score, start, id};
}

/* The best paths to every code point boundary. */
static uform_status_t unigram_viterbi(unigram_t const *unigram, model_text_t const *text,
                                      unigram_node_t *nodes, model_work_t *scratch) {
    for (uint32_t at = 0; at <= text->size; ++at)
        nodes[at] = (unigram_node_t){0.0, UNIGRAM_NONE, 0};
    for (uint32_t start = 0; start < text->size;) {
        double before = nodes[start].score;
        uint32_t width = text->offsets[text->char_at[start] + 1] - start;
        bool single = false;
        uint32_t node = 0;
        for (uint32_t at = start;
             at < text->size && (node = unigram_child(unigram, node, text->bytes[at]));) {
            ++at;
            int32_t id = unigram->node_token[node];
            if (id < 0) continue;
            unigram_offer(&nodes[at], unigram->scores[id] + before, start, (uint32_t)id);
            single = single || at - start == width;
        }
        if (!single) {
            unigram_node_t *target = &nodes[start + width];
            double score = unigram->unk_score + before;
            if (target->start == UNIGRAM_NONE || score > target->score) {
                if (unigram->unk_id < 0)
                    return model_refuse(scratch,
                                        "Unigram: an unknown token was met but \"unk_id\" is missing");
                *target = (unigram_node_t){score, start, (uint32_t)unigram->unk_id};
            }
        }
        start += width;
    }
    return UFORM_OK;
}

/* Walks the best path back from the end into `path` (last token first), fusing runs of unk tokens into
 * one UNIGRAM_LOOKUP entry; answers the entries. */
static size_t unigram_backtrack(unigram_t const *unigram, unigram_node_t const *nodes, uint32_t size,
                                word_token_t *path) {
    size_t count = 0;
    bool fusing = false;
    for (uint32_t end = size; end > 0;) {
        unigram_node_t const *node = &nodes[end];
        bool unknown = unigram->unk_id >= 0 && node->id == (uint32_t)unigram->unk_id;
        if (unknown && fusing)
            path[count - 1].begin = node->start;
        else
            path[count++] = (word_token_t){unknown ? UNIGRAM_LOOKUP : node->id, node->start, end};
        fusing = unknown;
        end = node->start;
    }
    return count;
}

/* A fused string's tokens: its own id, its byte tokens, or unk. */
static uform_status_t unigram_resolve(unigram_t const *unigram, vocab_t const *vocab,
                                      model_text_t const *text, word_token_t fused, model_work_t *scratch) {
    int64_t id = vocab_find(vocab, (char const *)text->bytes + fused.begin, fused.end - fused.begin);
    if (id >= 0) return model_word_push(scratch, (uint32_t)id, fused.begin, fused.end);
    bool bytes = unigram->byte_fallback;
    for (uint32_t at = fused.begin; at < fused.end && bytes; ++at)
        bytes = unigram->byte_ids[text->bytes[at]] >= 0;
    if (!bytes) return model_word_push(scratch, (uint32_t)unigram->unk_id, fused.begin, fused.end);
    for (uint32_t at = fused.begin; at < fused.end; ++at) {
        uform_status_t status =
            model_word_push(scratch, (uint32_t)unigram->byte_ids[text->bytes[at]], fused.begin, fused.end);
        if (status != UFORM_OK) return status;
    }
    return UFORM_OK;
}

/* The word's tokens into the scratch's list. */
static uform_status_t unigram_word(unigram_t const *unigram, vocab_t const *vocab, model_text_t const *text,
                                   model_work_t *scratch) {
    unigram_node_t *nodes =
        model_reserve(&scratch->queue, &scratch->queue_capacity, ((size_t)text->size + 1) * sizeof *nodes);
    word_token_t *path =
        model_reserve(&scratch->symbols, &scratch->symbols_capacity, (size_t)text->size * sizeof *path);
    if (!nodes || !path) return UFORM_OUT_OF_MEMORY;
    uform_status_t status = unigram_viterbi(unigram, text, nodes, scratch);
    if (status != UFORM_OK) return status;
    for (size_t i = unigram_backtrack(unigram, nodes, text->size, path); i-- > 0 && status == UFORM_OK;)
        status = path[i].id == UNIGRAM_LOOKUP
                     ? unigram_resolve(unigram, vocab, text, path[i], scratch)
                     : model_word_push(scratch, path[i].id, path[i].begin, path[i].end);
    return status;
}

uform_status_t unigram_tokenize(model_t const *model, model_text_t const *text, tokens_t *out,
                                model_work_t *scratch) {
    uint64_t hash = word_hash(text->bytes, text->size);
    uint32_t count;
    word_token_t const *cached = word_cache_find(&scratch->cache, text->bytes, text->size, hash, &count);
    if (cached) return model_emit_word(text, out, cached, count);
    uform_status_t status = unigram_word(model->unigram, &model->vocab, text, scratch);
    if (status != UFORM_OK) return status;
    word_cache_put(&scratch->cache, text->bytes, text->size, hash, scratch->word,
                   (uint32_t)scratch->word_count);
    return model_emit_word(text, out, scratch->word, scratch->word_count);
}
