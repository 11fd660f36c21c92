/* The models' common ground: what models.c (the dispatch) shares with each model's file (wordpiece.c,
 * bpe.c, unigram.c, wordlevel.c) and with the word cache (word_cache.c).
 *
 * A model cuts one piece at a time. models.c writes the piece once as UTF-8 (`model_text_t`, with the
 * maps between bytes and code points), since tokenizers' models work on the bytes of a `&str`: every
 * token they make covers a byte range [begin, end) of the piece, and `model_emit` turns that range into
 * original bytes exactly as tokenizers' PreTokenizedString::into_encoding does (convert_offsets over the
 * piece's alignments), odd ranges included. Each thread's scratch (`model_work_t`) lives in
 * work->model. */
#pragma once

#include "components.h"

/* ---- the piece being cut ------------------------------------------------------------------------ */

typedef struct model_text {
    uint8_t const *bytes;      /* the piece's UTF-8: `size` bytes */
    uint32_t size;             /* bytes */
    uint32_t length;           /* code points */
    uint32_t const *char_at;   /* per byte: the code point it belongs to */
    uint32_t const *offsets;   /* `length + 1`: the byte each code point begins at */
    piece_span_t const *spans; /* per code point: its original bytes */
    uint32_t shift;            /* the original byte the piece begins at */
} model_text_t;

/* Appends a token over bytes [begin, end) of the piece (begin <= end), with the original span
 * tokenizers gives it: an empty range stays empty at the piece's shift plus `begin`; a range past the
 * piece's end is kept as it is (tokenizers finds no alignment for it and keeps the model's offsets); any
 * other runs from the first byte's code point to the last byte's. */
static inline uform_status_t model_emit(model_text_t const *text, tokens_t *out, uint32_t id, uint32_t begin,
                                        uint32_t end) {
    piece_span_t span;
    if (begin == end)
        span = (piece_span_t){text->shift + begin, text->shift + begin};
    else if (end > text->size)
        span = (piece_span_t){begin, end};
    else
        span =
            (piece_span_t){text->spans[text->char_at[begin]].begin, text->spans[text->char_at[end - 1]].end};
    return tokens_push(out, id, span, false);
}

/* ---- a word's tokens, and the cache of them --------------------------------------------------------- */

/* A token a model made from a word: its id and the bytes [begin, end) of the word it covers. */
typedef struct word_token {
    uint32_t id, begin, end;
} word_token_t;

typedef struct word_cache_entry {
    uint64_t hash;
    uint32_t key, size;    /* the word: cache bytes [key, key + size) */
    uint32_t first, count; /* its tokens: cache tokens [first, first + count) */
} word_cache_entry_t;

/* Words already cut, with their tokens: tokenizers' BPE and Unigram keep such a cache too, and a cut
 * depends on the word alone, so the tokens are the same with or without it. Bounded: when a part is
 * full the cache is emptied, and a word longer than WORD_CACHE_LONGEST bytes is not kept. */
typedef struct word_cache {
    uint32_t *slots; /* open addressing: entry index + 1, or 0 for empty */
    word_cache_entry_t *entries;
    uint8_t *keys;
    word_token_t *tokens;
    uint32_t entry_count, key_bytes, token_count;
    bool failed; /* its memory could not be had: the models run without it */
} word_cache_t;

#define WORD_CACHE_LONGEST 256

/* Appends a word's tokens with model_emit. */
uform_status_t model_emit_word(model_text_t const *text, tokens_t *out, word_token_t const *tokens,
                               size_t count);

uint64_t word_hash(uint8_t const *bytes, size_t size);
/* The tokens of a word met before (`*count` of them), or NULL. */
word_token_t const *word_cache_find(word_cache_t const *cache, uint8_t const *word, uint32_t size,
                                    uint64_t hash, uint32_t *count);
/* Keeps a word's tokens; does nothing where the word is too long or memory fails. */
void word_cache_put(word_cache_t *cache, uint8_t const *word, uint32_t size, uint64_t hash,
                    word_token_t const *tokens, uint32_t count);
void word_cache_clear(word_cache_t *cache);
void word_cache_free(word_cache_t *cache);

/* ---- per-thread scratch -------------------------------------------------------------------------- */

typedef struct model_work {
    uint64_t serial; /* the model whose words the cache holds */
    uint32_t *char_at, *offsets;
    size_t char_at_capacity, offsets_capacity;
    word_token_t *word; /* a word's tokens as a model makes them */
    size_t word_count, word_capacity;
    void *symbols, *queue; /* a model's own arrays (BPE's symbols and merge queue, Unigram's lattice) */
    size_t symbols_capacity, queue_capacity;
    uint8_t *key; /* a token's string composed before lookup (prefixes, suffixes) */
    size_t key_capacity;
    word_cache_t cache;
    char fault[UFORM_ERROR_MESSAGE_SIZE]; /* why the last model_tokenize failed */
} model_work_t;

/* At least `bytes` bytes in `*buffer` (grown by half again, contents kept), or NULL. */
void *model_reserve(void **buffer, size_t *capacity, size_t bytes);
/* Appends a token to the word's list. */
uform_status_t model_word_push(model_work_t *scratch, uint32_t id, uint32_t begin, uint32_t end);
/* Writes the fault of a cut into the scratch and answers UFORM_FORMAT. */
uform_status_t model_refuse(model_work_t *scratch, char const *format, ...)
    __attribute__((format(printf, 2, 3)));

/* Why the last model_tokenize on this work failed (UFORM_FORMAT: an unknown token the model cannot
 * name), or "" when none did. */
char const *model_work_fault(tokenizer_work_t const *work);

/* ---- the models ---------------------------------------------------------------------------------- */

typedef enum model_kind { MODEL_BPE, MODEL_WORDPIECE, MODEL_WORDLEVEL, MODEL_UNIGRAM } model_kind_t;

typedef struct wordpiece wordpiece_t;
typedef struct bpe bpe_t;
typedef struct unigram unigram_t;
typedef struct wordlevel wordlevel_t;

struct model {
    model_kind_t kind;
    uint64_t serial; /* unique to this model in the process: a work's cache says whose words it holds */
    vocab_t vocab;
    union {
        wordpiece_t *wordpiece;
        bpe_t *bpe;
        unigram_t *unigram;
        wordlevel_t *wordlevel;
    };
};

/* Reads a vocabulary object {"token": id, ...} (tokenizers' HashMap<String, u32>) into `vocab`. */
uform_status_t model_vocab_object(json_t const *object, vocab_t *vocab, char const *what,
                                  tokenizer_fault_t *fault);
/* A string member that must be present and not null (tokenizers' String fields). */
uform_status_t model_required_string(json_t const *object, char const *key, char const **value,
                                     size_t *length, char const *what, tokenizer_fault_t *fault);
/* Copies `length` bytes and a NUL; NULL when memory fails. */
char *model_copy_string(char const *string, size_t length);

/* Each model reads its object into `model` (kind, vocab and its own state; all freed by model_free when
 * it fails part way) and cuts one piece into `out`. */
uform_status_t wordpiece_parse(json_t const *object, model_t *model, tokenizer_fault_t *fault);
void wordpiece_free(wordpiece_t *wordpiece);
uform_status_t wordpiece_tokenize(model_t const *model, model_text_t const *text, tokens_t *out,
                                  model_work_t *scratch);

uform_status_t bpe_parse(json_t const *object, model_t *model, tokenizer_fault_t *fault);
void bpe_free(bpe_t *bpe);
uform_status_t bpe_tokenize(model_t const *model, model_text_t const *text, tokens_t *out,
                            model_work_t *scratch);

uform_status_t unigram_parse(json_t const *object, model_t *model, tokenizer_fault_t *fault);
void unigram_free(unigram_t *unigram);
uform_status_t unigram_tokenize(model_t const *model, model_text_t const *text, tokens_t *out,
                                model_work_t *scratch);

uform_status_t wordlevel_parse(json_t const *object, model_t *model, tokenizer_fault_t *fault);
void wordlevel_free(wordlevel_t *wordlevel);
uform_status_t wordlevel_tokenize(model_t const *model, model_text_t const *text, tokens_t *out,
                                  model_work_t *scratch);

/* The ids of SentencePiece's byte tokens "<0x00>" .. "<0xFF>" (-1 where absent), for byte_fallback. */
void model_byte_ids(vocab_t const *vocab, int64_t ids[256]);
