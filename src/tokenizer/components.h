/* The components of a tokenizer, each as Hugging Face's `tokenizers` defines it and reads it from its
 * JSON object in tokenizer.json: normalizers, pre-tokenizers, models, post-processors. Each kind is a
 * tagged structure made by its `_parse` function (which answers UFORM_UNSUPPORTED naming a type it does
 * not know, UFORM_FORMAT naming the fault of a malformed object, UFORM_OUT_OF_MEMORY) and freed by its
 * `_free`; once made it is read-only, and any number of threads may apply it at once, each with its
 * own `tokenizer_work_t`. */
#pragma once

#include <jansson.h>

#include "pieces.h"

/* ---- faults met while reading a file ---------------------------------------------------------- */

typedef struct tokenizer_fault {
    char message[UFORM_ERROR_MESSAGE_SIZE]; /* "normalizer: unsupported type \"Foo\"" */
} tokenizer_fault_t;

/* Writes a message (printf's format) into `fault` and answers `status`. */
uform_status_t tokenizer_fail(tokenizer_fault_t *fault, uform_status_t status, char const *format, ...)
    __attribute__((format(printf, 3, 4)));

/* JSON helpers: a member's value of the right type, or a default when absent or null. Each answers
 * UFORM_FORMAT through `fault` for a member present with another type; `what` names the object in
 * the message ("BertNormalizer"). */
uform_status_t json_get_bool(json_t const *object, char const *key, bool fallback, bool *value,
                             char const *what, tokenizer_fault_t *fault);
uform_status_t json_get_size(json_t const *object, char const *key, size_t fallback, size_t *value,
                             char const *what, tokenizer_fault_t *fault);
/* A string member (not copied: it lives as long as `object`); `fallback` may be NULL. */
uform_status_t json_get_string(json_t const *object, char const *key, char const *fallback,
                               char const **value, size_t *length, char const *what,
                               tokenizer_fault_t *fault);
/* A type tag: the member "type" as a string; UFORM_FORMAT when missing. */
uform_status_t json_get_type(json_t const *object, char const **type, char const *what,
                             tokenizer_fault_t *fault);

/* ---- the vocabulary: token strings to ids and back --------------------------------------------- */

typedef struct vocab {
    char *bytes;       /* every token's UTF-8, end to end */
    uint32_t *offsets; /* `count + 1`: token id i is bytes [offsets[i], offsets[i + 1]); ids are dense */
    bool *present;     /* per id: false for an id no token has (a gap in the file's ids) */
    uint32_t *table;   /* open addressing: id + 1, or 0 for empty */
    size_t count, table_size;
} vocab_t;

/* Builds a vocabulary from `count` (string, length, id) entries; ids must be below `count` and each
 * string unique (UFORM_FORMAT otherwise, naming `what`). Gaps are allowed. */
typedef struct vocab_entry {
    char const *string;
    size_t length;
    uint32_t id;
} vocab_entry_t;
uform_status_t vocab_build(vocab_t *vocab, vocab_entry_t const *entries, size_t count, char const *what,
                           tokenizer_fault_t *fault);
void vocab_free(vocab_t *vocab);
/* The id of a token string, or -1. */
int64_t vocab_find(vocab_t const *vocab, char const *string, size_t length);
/* The string of id `id` (NULL where no token has it); its length in `*length`. */
char const *vocab_token(vocab_t const *vocab, uint32_t id, size_t *length);

/* ---- per-thread scratch ------------------------------------------------------------------------ */

#define TOKENIZER_WORK_TEMPS 8

/* What applying components needs besides their inputs and outputs: temporary piece lists (a stack,
 * for sequences and multi-step stages), bytes, and the regular expressions' match state. Grown as
 * needed, kept between texts, freed with tokenizer_work_free. */
typedef struct tokenizer_work {
    pieces_t temps[TOKENIZER_WORK_TEMPS];
    size_t temps_taken;
    uint8_t *bytes;
    size_t bytes_capacity;
    void *region; /* an OnigRegion, made on first use */
    void *model;  /* the model's own scratch (model_work_free frees it) */
    void *spiece; /* a SentencePiece tokenizer's scratch (spiece_work_free frees it) */
} tokenizer_work_t;

/* Takes the next temporary list (cleared), or NULL when TOKENIZER_WORK_TEMPS are taken; give it back
 * with work_give (last taken, first given). */
pieces_t *work_take(tokenizer_work_t *work);
void work_give(tokenizer_work_t *work);
/* At least `size` bytes of scratch; NULL when memory fails. */
uint8_t *work_bytes(tokenizer_work_t *work, size_t size);

/* ---- normalizers ------------------------------------------------------------------------------- */

typedef struct normalizer normalizer_t;

/* BertNormalizer, NFC, NFD, NFKC, NFKD, Lowercase, Nmt, Strip, StripAccents, Replace, Prepend,
 * Precompiled, Sequence. */
uform_status_t normalizer_parse(json_t const *object, normalizer_t **normalizer, tokenizer_fault_t *fault);
void normalizer_free(normalizer_t *normalizer);
/* Rewrites every open piece of `in` into `out` (added-token pieces copied through). Answers UFORM_OK,
 * UFORM_OUT_OF_MEMORY, or UFORM_UNSUPPORTED where tokenizers panics (Replace's search: regex.h). */
uform_status_t normalizer_apply(normalizer_t const *normalizer, pieces_t const *in, pieces_t *out,
                                tokenizer_work_t *work);

/* ---- pre-tokenizers ---------------------------------------------------------------------------- */

typedef struct pre_tokenizer pre_tokenizer_t;

/* BertPreTokenizer, Whitespace, WhitespaceSplit, Punctuation, Split, ByteLevel, Metaspace, Digits,
 * Sequence. */
uform_status_t pre_tokenizer_parse(json_t const *object, pre_tokenizer_t **pre_tokenizer,
                                   tokenizer_fault_t *fault);
void pre_tokenizer_free(pre_tokenizer_t *pre_tokenizer);
/* Splits (and, for ByteLevel and Metaspace, rewrites) every open piece of `in` into pieces of `out`. */
uform_status_t pre_tokenizer_apply(pre_tokenizer_t const *pre_tokenizer, pieces_t const *in, pieces_t *out,
                                   tokenizer_work_t *work);

/* ---- models ------------------------------------------------------------------------------------ */

/* Tokens: ids with the original bytes each covers, and whether a post-processor added it. */
typedef struct tokens {
    uint32_t *ids;
    piece_span_t *spans;
    uint8_t *special; /* 1 for tokens a post-processor or padding added (tokenizers' special_tokens_mask),
                         and a SentencePiece class's special tokens wherever they come from */
    size_t count, capacity;
} tokens_t;

uform_status_t tokens_push(tokens_t *tokens, uint32_t id, piece_span_t span, bool special);
/* A token over code points [begin, end) of a piece: its span runs from spans[begin].begin to
 * spans[end - 1].end (tokenizers' convert_offsets). */
static inline uform_status_t tokens_push_range(tokens_t *tokens, uint32_t id, piece_span_t const *spans,
                                               uint32_t begin, uint32_t end) {
    return tokens_push(tokens, id, (piece_span_t){spans[begin].begin, spans[end - 1].end}, false);
}
void tokens_free(tokens_t *tokens);

typedef struct model model_t;

/* WordPiece, BPE, Unigram, WordLevel: `object` is tokenizer.json's "model" (its "type" may be absent,
 * as tokenizers then guesses the model from its fields). */
uform_status_t model_parse(json_t const *object, model_t **model, tokenizer_fault_t *fault);
void model_free(model_t *model);
/* Cuts piece `index` of `in` (an open piece) into tokens appended to `out`. */
uform_status_t model_tokenize(model_t const *model, pieces_t const *in, size_t index, tokens_t *out,
                              tokenizer_work_t *work);
/* The model's vocabulary (every model has one). */
vocab_t const *model_vocab(model_t const *model);
/* Frees what model_tokenize kept in work->model. */
void model_work_free(tokenizer_work_t *work);
