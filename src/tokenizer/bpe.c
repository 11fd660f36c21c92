/* BPE (tokenizers' models/bpe): a word becomes one symbol per code point (its string in the vocabulary,
 * behind `continuing_subword_prefix` past the first and before `end_of_word_suffix` on the last), then
 * symbols merge pair by pair, the pair of lowest merge rank first (leftmost among equals), each merge
 * giving the merged symbol the merge's new id, as word.rs's merge_all does with a priority queue.
 *
 * A code point whose string is not in the vocabulary becomes SentencePiece's byte tokens "<0xAB>" (one
 * per byte of that string, each one byte long, with byte_fallback, when all are in the vocabulary), or
 * the unk token (consecutive ones fused into one with fuse_unk), or nothing when there is no unk token.
 * A token covers the bytes that the lengths of the symbols before it add up to, which is the word's
 * bytes in every case but the odd ones tokenizers has too (dropped code points, byte tokens of a prefix
 * or suffix), reproduced here. */
#include <stdlib.h>
#include <string.h>

#include "models.h"

/* A merge: the pair (left id, right id) it applies to as key + 1 (0: an empty slot), its rank, its
 * new id. */
typedef struct bpe_merge {
    uint64_t key;
    uint32_t rank, id;
} bpe_merge_t;

struct bpe {
    bpe_merge_t *merges; /* open addressing, at most half full */
    size_t merge_mask;
    unsigned merge_shift;
    char *unk_token; /* NULL: none (unknown code points are dropped) */
    size_t unk_length;
    int64_t unk_id; /* -1: `unk_token` is not in the vocabulary (an error only when a word needs it) */
    char *prefix, *suffix;
    size_t prefix_length, suffix_length;
    bool fuse_unk, byte_fallback, ignore_merges;
    int64_t byte_ids[256];
};

#define BPE_HASH 0x9E3779B97F4A7C15ull
#define BPE_NONE UINT32_MAX /* no previous or next symbol */

static inline uint64_t bpe_key(uint32_t left, uint32_t right) {
    return ((uint64_t)left << 32 | right) + 1;
}

static inline bpe_merge_t const *bpe_merge_find(bpe_t const *bpe, uint32_t left, uint32_t right) {
    uint64_t key = bpe_key(left, right);
    for (size_t slot = (key * BPE_HASH) >> bpe->merge_shift;; slot = (slot + 1) & bpe->merge_mask) {
        bpe_merge_t const *merge = &bpe->merges[slot];
        if (merge->key == key) return merge;
        if (!merge->key) return NULL;
    }
}

/* ---- reading ------------------------------------------------------------------------------------- */

void bpe_free(bpe_t *bpe) {
    if (!bpe) return;
    free(bpe->merges);
    free(bpe->unk_token);
    free(bpe->prefix);
    free(bpe->suffix);
    free(bpe);
}

/* An optional string member (tokenizers' Option<String>) copied into `*copy` (NULL where absent). */
static uform_status_t bpe_option(json_t const *object, char const *key, char **copy, size_t *length,
                                 tokenizer_fault_t *fault) {
    char const *value;
    uform_status_t status = json_get_string(object, key, NULL, &value, length, "BPE", fault);
    if (status != UFORM_OK || !value) return status;
    if (!(*copy = model_copy_string(value, *length)))
        return tokenizer_fail(fault, UFORM_OUT_OF_MEMORY, "BPE: out of memory");
    return UFORM_OK;
}

/* Dropout draws at random which merges to skip, so a cut with it could not match tokenizers' id for id:
 * only none (or 0, which skips none) is taken. tokenizers refuses a dropout outside (0, 1]; one within is
 * refused here (UNSUPPORTED) only once the rest of the object has read, so that an object without a
 * "type" that tokenizers would not read as BPE goes on to the next model. */
static uform_status_t bpe_dropout(json_t const *object, bool *dropping, tokenizer_fault_t *fault) {
    json_t const *dropout = json_object_get(object, "dropout");
    *dropping = false;
    if (!dropout || json_is_null(dropout)) return UFORM_OK;
    if (!json_is_number(dropout))
        return tokenizer_fail(fault, UFORM_FORMAT, "BPE: \"dropout\" is not a number");
    float p = (float)json_number_value(dropout);
    if (p < 0.0f || p > 1.0f)
        return tokenizer_fail(fault, UFORM_FORMAT, "BPE: dropout should be between 0 and 1");
    *dropping = p > 0.0f;
    return UFORM_OK;
}

static uform_status_t bpe_options(json_t const *object, bpe_t *bpe, bool *dropping,
                                  tokenizer_fault_t *fault) {
    uform_status_t status = bpe_dropout(object, dropping, fault);
    if (status == UFORM_OK)
        status = bpe_option(object, "unk_token", &bpe->unk_token, &bpe->unk_length, fault);
    if (status == UFORM_OK)
        status = bpe_option(object, "continuing_subword_prefix", &bpe->prefix, &bpe->prefix_length, fault);
    if (status == UFORM_OK)
        status = bpe_option(object, "end_of_word_suffix", &bpe->suffix, &bpe->suffix_length, fault);
    if (status == UFORM_OK) status = json_get_bool(object, "fuse_unk", false, &bpe->fuse_unk, "BPE", fault);
    if (status == UFORM_OK)
        status = json_get_bool(object, "byte_fallback", false, &bpe->byte_fallback, "BPE", fault);
    if (status == UFORM_OK)
        status = json_get_bool(object, "ignore_merges", false, &bpe->ignore_merges, "BPE", fault);
    return status;
}

/* A merge's two tokens: "a b" (split at its one space, as tokenizers 0.19 writes them) or ["a", "b"] (as
 * later versions do). Answers false for anything else. */
typedef struct bpe_pair {
    char const *left, *right;
    size_t left_length, right_length;
} bpe_pair_t;

static bool bpe_pair_read(json_t const *merge, bpe_pair_t *pair) {
    if (json_is_string(merge)) {
        char const *text = json_string_value(merge);
        size_t length = json_string_length(merge);
        char const *space = memchr(text, ' ', length);
        if (!space || memchr(space + 1, ' ', length - (size_t)(space + 1 - text))) return false;
        *pair = (bpe_pair_t){text, space + 1, (size_t)(space - text), length - (size_t)(space + 1 - text)};
        return true;
    }
    if (!json_is_array(merge) || json_array_size(merge) != 2) return false;
    json_t const *left = json_array_get(merge, 0), *right = json_array_get(merge, 1);
    if (!json_is_string(left) || !json_is_string(right)) return false;
    *pair = (bpe_pair_t){json_string_value(left), json_string_value(right), json_string_length(left),
                         json_string_length(right)};
    return true;
}

/* Sets the merge of pair (left, right); a pair given again takes the later rank and id, as tokenizers'
 * HashMap does. */
static void bpe_merge_set(bpe_t *bpe, uint32_t left, uint32_t right, uint32_t rank, uint32_t id) {
    uint64_t key = bpe_key(left, right);
    size_t slot = (key * BPE_HASH) >> bpe->merge_shift;
    while (bpe->merges[slot].key && bpe->merges[slot].key != key)
        slot = (slot + 1) & bpe->merge_mask;
    bpe->merges[slot] = (bpe_merge_t){key, rank, id};
}

/* The id of the merged token, left + right past the prefix's length (as tokenizers slices it, whether
 * or not right begins with the prefix): UFORM_FORMAT where it is not in the vocabulary or the slice
 * would cut a code point (where tokenizers panics). */
static uform_status_t bpe_merged_id(bpe_t const *bpe, vocab_t const *vocab, bpe_pair_t const *pair,
                                    size_t rank, char **joined, size_t *capacity, uint32_t *id,
                                    tokenizer_fault_t *fault) {
    size_t cut = bpe->prefix ? bpe->prefix_length : 0;
    if (cut > pair->right_length || (cut < pair->right_length && ((uint8_t)pair->right[cut] & 0xC0) == 0x80))
        return tokenizer_fail(fault, UFORM_FORMAT,
                              "BPE: merge %zu: \"%.*s\" is shorter than the subword prefix", rank + 1,
                              (int)(pair->right_length < 40 ? pair->right_length : 40), pair->right);
    size_t length = pair->left_length + pair->right_length - cut;
    if (!model_reserve((void **)joined, capacity, length + 1))
        return tokenizer_fail(fault, UFORM_OUT_OF_MEMORY, "BPE: out of memory");
    memcpy(*joined, pair->left, pair->left_length);
    memcpy(*joined + pair->left_length, pair->right + cut, pair->right_length - cut);
    int64_t found = vocab_find(vocab, *joined, length);
    if (found < 0)
        return tokenizer_fail(fault, UFORM_FORMAT, "BPE: merge %zu: token \"%.*s\" is not in the vocabulary",
                              rank + 1, (int)(length < 40 ? length : 40), *joined);
    *id = (uint32_t)found;
    return UFORM_OK;
}

/* A token of a merge: its id, or UFORM_FORMAT naming it. */
static uform_status_t bpe_merge_token(vocab_t const *vocab, char const *token, size_t length, size_t rank,
                                      uint32_t *id, tokenizer_fault_t *fault) {
    int64_t found = vocab_find(vocab, token, length);
    if (found < 0)
        return tokenizer_fail(fault, UFORM_FORMAT, "BPE: merge %zu: token \"%.*s\" is not in the vocabulary",
                              rank + 1, (int)(length < 40 ? length : 40), token);
    *id = (uint32_t)found;
    return UFORM_OK;
}

/* The merge of rank `rank` (numbered from 1 in messages): its tokens and their merged token must be in the
 * vocabulary. */
static uform_status_t bpe_merge_read(bpe_t *bpe, vocab_t const *vocab, bpe_pair_t const *pair, size_t rank,
                                     char **joined, size_t *capacity, tokenizer_fault_t *fault) {
    uint32_t left = 0, right = 0, id = 0;
    uform_status_t status = bpe_merge_token(vocab, pair->left, pair->left_length, rank, &left, fault);
    if (status == UFORM_OK)
        status = bpe_merge_token(vocab, pair->right, pair->right_length, rank, &right, fault);
    if (status == UFORM_OK) status = bpe_merged_id(bpe, vocab, pair, rank, joined, capacity, &id, fault);
    if (status == UFORM_OK) bpe_merge_set(bpe, left, right, (uint32_t)rank, id);
    return status;
}

/* The merges in rank order; a string beginning "#version" (a merges.txt header) is skipped and takes no
 * rank, as tokenizers' convert_merges_to_hashmap does. */
static uform_status_t bpe_merges(json_t const *merges, bpe_t *bpe, vocab_t const *vocab,
                                 tokenizer_fault_t *fault) {
    if (!json_is_array(merges)) return tokenizer_fail(fault, UFORM_FORMAT, "BPE: \"merges\" is not an array");
    size_t count = json_array_size(merges), size = 16;
    while (size < 2 * count + 2)
        size *= 2;
    if (count >= UINT32_MAX / 2) return tokenizer_fail(fault, UFORM_FORMAT, "BPE: too many merges");
    if (!(bpe->merges = calloc(size, sizeof *bpe->merges)))
        return tokenizer_fail(fault, UFORM_OUT_OF_MEMORY, "BPE: out of memory");
    bpe->merge_mask = size - 1;
    bpe->merge_shift = 64;
    while (((size_t)1 << (64 - bpe->merge_shift)) < size)
        bpe->merge_shift--;
    char *joined = NULL;
    size_t capacity = 0, rank = 0;
    uform_status_t status = UFORM_OK;
    for (size_t i = 0; i < count && status == UFORM_OK; ++i) {
        json_t const *merge = json_array_get(merges, i);
        if (json_is_string(merge) && strncmp(json_string_value(merge), "#version", 8) == 0) continue;
        bpe_pair_t pair;
        if (!bpe_pair_read(merge, &pair))
            status = tokenizer_fail(fault, UFORM_FORMAT, "BPE: merge %zu is not two tokens", rank + 1);
        else
            status = bpe_merge_read(bpe, vocab, &pair, rank++, &joined, &capacity, fault);
    }
    free(joined);
    return status;
}

uform_status_t bpe_parse(json_t const *object, model_t *model, tokenizer_fault_t *fault) {
    model->kind = MODEL_BPE;
    bpe_t *bpe = model->bpe = calloc(1, sizeof *bpe);
    if (!bpe) return tokenizer_fail(fault, UFORM_OUT_OF_MEMORY, "BPE: out of memory");
    bool dropping;
    uform_status_t status = bpe_options(object, bpe, &dropping, fault);
    if (status != UFORM_OK) return status;
    json_t const *merges = json_object_get(object, "merges");
    if (!json_object_get(object, "vocab") || !merges)
        return tokenizer_fail(fault, UFORM_FORMAT, "BPE: \"vocab\" or \"merges\" is missing");
    if ((status = model_vocab_object(object, &model->vocab, "BPE", fault)) != UFORM_OK) return status;
    if ((status = bpe_merges(merges, bpe, &model->vocab, fault)) != UFORM_OK) return status;
    if (dropping) return tokenizer_fail(fault, UFORM_UNSUPPORTED, "BPE dropout");
    bpe->unk_id = bpe->unk_token ? vocab_find(&model->vocab, bpe->unk_token, bpe->unk_length) : -1;
    model_byte_ids(&model->vocab, bpe->byte_ids);
    return UFORM_OK;
}

/* ---- a word's symbols ------------------------------------------------------------------------------ */

typedef struct bpe_symbol {
    uint32_t id;
    uint32_t prev, next; /* BPE_NONE at the ends */
    uint32_t length;     /* bytes; 0 once merged into the symbol on its left */
} bpe_symbol_t;

typedef struct bpe_word {
    bpe_symbol_t *symbols;
    size_t count, capacity; /* capacity in bytes */
    model_work_t *scratch;
} bpe_word_t;

/* word.rs's Word::add. */
static uform_status_t bpe_add(bpe_word_t *word, uint32_t id, uint32_t length) {
    if (word->count >= BPE_NONE - 1) return UFORM_OUT_OF_MEMORY;
    if (!model_reserve(&word->scratch->symbols, &word->scratch->symbols_capacity,
                       (word->count + 1) * sizeof *word->symbols))
        return UFORM_OUT_OF_MEMORY;
    word->symbols = word->scratch->symbols;
    uint32_t at = (uint32_t)word->count++;
    if (at) word->symbols[at - 1].next = at;
    word->symbols[at] = (bpe_symbol_t){id, at ? at - 1 : BPE_NONE, BPE_NONE, length};
    return UFORM_OK;
}

/* The string a code point is looked up as: its bytes with the prefix before (past the first) and the
 * suffix after (on the last); `*size` bytes, in the scratch's key where anything is added (an empty
 * prefix or suffix, as CLIP's and RoBERTa's files give, adds nothing). */
static uint8_t const *bpe_unit(bpe_t const *bpe, model_text_t const *text, uint32_t index,
                               model_work_t *scratch, size_t *size) {
    uint8_t const *bytes = text->bytes + text->offsets[index];
    size_t length = text->offsets[index + 1] - text->offsets[index];
    bool prefixed = index > 0 && bpe->prefix_length,
         suffixed = index + 1 == text->length && bpe->suffix_length;
    if (!prefixed && !suffixed) {
        *size = length;
        return bytes;
    }
    size_t before = prefixed ? bpe->prefix_length : 0, after = suffixed ? bpe->suffix_length : 0;
    uint8_t *key = model_reserve((void **)&scratch->key, &scratch->key_capacity, before + length + after);
    if (!key) return NULL;
    if (before) memcpy(key, bpe->prefix, before);
    memcpy(key + before, bytes, length);
    if (after) memcpy(key + before + length, bpe->suffix, after);
    *size = before + length + after;
    return key;
}

/* byte_fallback: one byte token per byte of the unit, when every one is in the vocabulary. */
static uform_status_t bpe_bytes(bpe_t const *bpe, bpe_word_t *word, uint8_t const *unit, size_t size,
                                bool *done) {
    *done = false;
    for (size_t i = 0; i < size; ++i)
        if (bpe->byte_ids[unit[i]] < 0) return UFORM_OK;
    for (size_t i = 0; i < size; ++i) {
        uform_status_t status = bpe_add(word, (uint32_t)bpe->byte_ids[unit[i]], 1);
        if (status != UFORM_OK) return status;
    }
    *done = true;
    return UFORM_OK;
}

/* The unk token waiting to be added (model.rs's `unk`): it goes in before the next known code point. */
typedef struct bpe_unknown {
    bool waiting;
    uint32_t id, length;
} bpe_unknown_t;

static uform_status_t bpe_unknown(bpe_t const *bpe, bpe_word_t *word, bpe_unknown_t *unknown,
                                  uint32_t length) {
    if (!bpe->unk_token) return UFORM_OK; /* dropped, its bytes with it */
    if (unknown->waiting && bpe->fuse_unk) {
        unknown->length += length;
        return UFORM_OK;
    }
    if (unknown->waiting) {
        uform_status_t status = bpe_add(word, unknown->id, unknown->length);
        if (status != UFORM_OK) return status;
    }
    if (bpe->unk_id < 0)
        return model_refuse(word->scratch, "BPE: the unk token \"%.40s\" is not in the vocabulary",
                            bpe->unk_token);
    *unknown = (bpe_unknown_t){true, (uint32_t)bpe->unk_id, length};
    return UFORM_OK;
}

/* model.rs's merge_word before the merges: one symbol per code point, or its byte tokens, or unk. */
static uform_status_t bpe_symbols(bpe_t const *bpe, vocab_t const *vocab, model_text_t const *text,
                                  bpe_word_t *word) {
    bpe_unknown_t unknown = {0};
    for (uint32_t i = 0; i < text->length; ++i) {
        size_t size;
        uint8_t const *unit = bpe_unit(bpe, text, i, word->scratch, &size);
        if (!unit) return UFORM_OUT_OF_MEMORY;
        uint32_t length = text->offsets[i + 1] - text->offsets[i];
        int64_t id = vocab_find(vocab, (char const *)unit, size);
        uform_status_t status = UFORM_OK;
        if (id >= 0) {
            if (unknown.waiting) status = bpe_add(word, unknown.id, unknown.length);
            unknown.waiting = false;
            if (status == UFORM_OK) status = bpe_add(word, (uint32_t)id, length);
        } else {
            bool done = false;
            if (bpe->byte_fallback) status = bpe_bytes(bpe, word, unit, size, &done);
            if (status == UFORM_OK && !done) status = bpe_unknown(bpe, word, &unknown, length);
        }
        if (status != UFORM_OK) return status;
    }
    return unknown.waiting ? bpe_add(word, unknown.id, unknown.length) : UFORM_OK;
}

/* ---- merging ------------------------------------------------------------------------------------- */

/* A queued merge at symbol `pos`; the queue is a binary min-heap on (rank, pos). */
typedef struct bpe_queued {
    uint32_t rank, pos, id;
} bpe_queued_t;

typedef struct bpe_queue {
    bpe_queued_t *items;
    size_t count;
    model_work_t *scratch;
} bpe_queue_t;

static inline bool bpe_before(bpe_queued_t a, bpe_queued_t b) {
    return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos;
}

static uform_status_t bpe_push(bpe_queue_t *queue, bpe_queued_t item) {
    if (!model_reserve(&queue->scratch->queue, &queue->scratch->queue_capacity,
                       (queue->count + 1) * sizeof *queue->items))
        return UFORM_OUT_OF_MEMORY;
    bpe_queued_t *items = queue->items = queue->scratch->queue;
    size_t at = queue->count++;
    for (; at > 0 && bpe_before(item, items[(at - 1) / 2]); at = (at - 1) / 2)
        items[at] = items[(at - 1) / 2];
    items[at] = item;
    return UFORM_OK;
}

static bpe_queued_t bpe_pop(bpe_queue_t *queue) {
    bpe_queued_t *items = queue->items, top = items[0], last = items[--queue->count];
    size_t at = 0, count = queue->count;
    for (;;) {
        size_t child = 2 * at + 1;
        if (child >= count) break;
        if (child + 1 < count && bpe_before(items[child + 1], items[child])) child++;
        if (!bpe_before(items[child], last)) break;
        items[at] = items[child];
        at = child;
    }
    if (count) items[at] = last;
    return top;
}

/* Queues the merge of symbols `pos` and its next, if the pair has one. */
static uform_status_t bpe_offer(bpe_t const *bpe, bpe_queue_t *queue, bpe_symbol_t const *symbols,
                                uint32_t pos) {
    bpe_merge_t const *merge = bpe_merge_find(bpe, symbols[pos].id, symbols[symbols[pos].next].id);
    return merge ? bpe_push(queue, (bpe_queued_t){merge->rank, pos, merge->id}) : UFORM_OK;
}

/* word.rs's merge_all without dropout: an entry whose pair has changed since it was queued (its left
 * symbol merged away, or its pair now merges into another id) is dropped. */
static uform_status_t bpe_merge_all(bpe_t const *bpe, bpe_word_t *word) {
    bpe_queue_t queue = {.scratch = word->scratch};
    bpe_symbol_t *symbols = word->symbols;
    uform_status_t status = UFORM_OK;
    for (uint32_t pos = 0; pos + 1 < word->count && status == UFORM_OK; ++pos)
        status = bpe_offer(bpe, &queue, symbols, pos);
    while (queue.count && status == UFORM_OK) {
        bpe_queued_t top = bpe_pop(&queue);
        bpe_symbol_t *left = &symbols[top.pos];
        if (left->length == 0 || left->next == BPE_NONE) continue;
        bpe_symbol_t right = symbols[left->next];
        bpe_merge_t const *merge = bpe_merge_find(bpe, left->id, right.id);
        if (!merge || merge->id != top.id) continue;
        symbols[left->next].length = 0;
        left->id = top.id;
        left->length += right.length;
        left->next = right.next;
        if (right.next != BPE_NONE) symbols[right.next].prev = top.pos;
        if (left->prev != BPE_NONE) status = bpe_offer(bpe, &queue, symbols, left->prev);
        if (status == UFORM_OK && left->next != BPE_NONE) status = bpe_offer(bpe, &queue, symbols, top.pos);
    }
    return status;
}

/* The word's tokens into the scratch's list: the symbols left, each over the bytes that the lengths
 * before it add up to (word.rs's get_offsets_iter). */
static uform_status_t bpe_word_tokens(bpe_word_t const *word) {
    uint32_t at = 0;
    for (size_t i = 0; i < word->count; ++i) {
        bpe_symbol_t const *symbol = &word->symbols[i];
        if (!symbol->length) continue;
        uform_status_t status = model_word_push(word->scratch, symbol->id, at, at + symbol->length);
        if (status != UFORM_OK) return status;
        at += symbol->length;
    }
    return UFORM_OK;
}

uform_status_t bpe_tokenize(model_t const *model, model_text_t const *text, tokens_t *out,
                            model_work_t *scratch) {
    bpe_t const *bpe = model->bpe;
    if (bpe->ignore_merges) {
        /* A word in the vocabulary is its token, with the empty offsets tokenizers 0.19 gives it. */
        int64_t id = vocab_find(&model->vocab, (char const *)text->bytes, text->size);
        if (id >= 0) return model_emit(text, out, (uint32_t)id, 0, 0);
    }
    uint64_t hash = word_hash(text->bytes, text->size);
    uint32_t count;
    word_token_t const *cached = word_cache_find(&scratch->cache, text->bytes, text->size, hash, &count);
    if (cached) return model_emit_word(text, out, cached, count);
    bpe_word_t word = {.scratch = scratch};
    uform_status_t status = bpe_symbols(bpe, &model->vocab, text, &word);
    if (status == UFORM_OK) status = bpe_merge_all(bpe, &word);
    if (status == UFORM_OK) status = bpe_word_tokens(&word);
    if (status != UFORM_OK) return status;
    word_cache_put(&scratch->cache, text->bytes, text->size, hash, scratch->word,
                   (uint32_t)scratch->word_count);
    return model_emit_word(text, out, scratch->word, scratch->word_count);
}
