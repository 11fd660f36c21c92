/* The word cache: words a model has cut, with their tokens, per thread (models.h says why the tokens are
 * the same with or without it). One allocation of fixed parts made on first use: an open-addressing table
 * (linear probing, at most half full) over entries whose words and tokens lie end to end in two arrays.
 * When any part is full the cache is emptied whole, which keeps it bounded without any bookkeeping of
 * which word was used last; a text's frequent words come back at once. */
#include <stdlib.h>
#include <string.h>

#include "models.h"

#define WORD_CACHE_SLOTS   (1u << 15)
#define WORD_CACHE_ENTRIES (WORD_CACHE_SLOTS / 2)
#define WORD_CACHE_BYTES   (1u << 19)
#define WORD_CACHE_TOKENS  (1u << 17)

uint64_t word_hash(uint8_t const *bytes, size_t size) {
    uint64_t hash = 0x9E3779B97F4A7C15ull ^ size;
    size_t at = 0;
    for (; at + 8 <= size; at += 8) {
        uint64_t word;
        memcpy(&word, bytes + at, 8);
        hash = (hash ^ word) * 0xFF51AFD7ED558CCDull;
        hash ^= hash >> 32;
    }
    uint64_t tail = 0;
    memcpy(&tail, bytes + at, size - at);
    hash = (hash ^ tail) * 0xC4CEB9FE1A85EC53ull;
    return hash ^ (hash >> 29);
}

/* Makes the parts on first use; false when memory fails (the cache then stays off). */
static bool word_cache_ready(word_cache_t *cache) {
    if (cache->slots) return true;
    if (cache->failed) return false;
    cache->slots = calloc(WORD_CACHE_SLOTS, sizeof *cache->slots);
    cache->entries = malloc(WORD_CACHE_ENTRIES * sizeof *cache->entries);
    cache->keys = malloc(WORD_CACHE_BYTES);
    cache->tokens = malloc(WORD_CACHE_TOKENS * sizeof *cache->tokens);
    if (cache->slots && cache->entries && cache->keys && cache->tokens) return true;
    word_cache_free(cache);
    cache->failed = true;
    return false;
}

word_token_t const *word_cache_find(word_cache_t const *cache, uint8_t const *word, uint32_t size,
                                    uint64_t hash, uint32_t *count) {
    if (!cache->slots) return NULL;
    for (uint32_t slot = (uint32_t)hash & (WORD_CACHE_SLOTS - 1);;
         slot = (slot + 1) & (WORD_CACHE_SLOTS - 1)) {
        uint32_t index = cache->slots[slot];
        if (!index) return NULL;
        word_cache_entry_t const *entry = &cache->entries[index - 1];
        if (entry->hash == hash && entry->size == size && memcmp(cache->keys + entry->key, word, size) == 0) {
            *count = entry->count;
            return cache->tokens + entry->first;
        }
    }
}

void word_cache_put(word_cache_t *cache, uint8_t const *word, uint32_t size, uint64_t hash,
                    word_token_t const *tokens, uint32_t count) {
    if (size > WORD_CACHE_LONGEST || count > WORD_CACHE_TOKENS || !word_cache_ready(cache)) return;
    if (cache->entry_count == WORD_CACHE_ENTRIES || cache->key_bytes + size > WORD_CACHE_BYTES ||
        cache->token_count + count > WORD_CACHE_TOKENS)
        word_cache_clear(cache);
    word_cache_entry_t *entry = &cache->entries[cache->entry_count];
    *entry = (word_cache_entry_t){hash, cache->key_bytes, size, cache->token_count, count};
    memcpy(cache->keys + cache->key_bytes, word, size);
    if (count) /* a word may have no tokens (BPE drops unknown code points without an unk token) */
        memcpy(cache->tokens + cache->token_count, tokens, count * sizeof *tokens);
    cache->key_bytes += size;
    cache->token_count += count;
    uint32_t slot = (uint32_t)hash & (WORD_CACHE_SLOTS - 1);
    while (cache->slots[slot])
        slot = (slot + 1) & (WORD_CACHE_SLOTS - 1);
    cache->slots[slot] = ++cache->entry_count;
}

void word_cache_clear(word_cache_t *cache) {
    if (cache->slots && cache->entry_count) memset(cache->slots, 0, WORD_CACHE_SLOTS * sizeof *cache->slots);
    cache->entry_count = cache->key_bytes = cache->token_count = 0;
}

void word_cache_free(word_cache_t *cache) {
    free(cache->slots);
    free(cache->entries);
    free(cache->keys);
    free(cache->tokens);
    *cache = (word_cache_t){0};
}
