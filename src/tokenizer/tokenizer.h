/* The tokenizer as a whole (tokenizer.c): its parts read from tokenizer.json, and cutting one text into
 * tokens; the added tokens (added_tokens.c) and the post-processors (post_processors.c) it runs around
 * the components of components.h; or, for a SentencePiece model file, the slow tokenizer of spiece.h.
 * The public functions (uform_tokenizer_*, uform_text_tokenize) are built on these. */
#pragma once

#include "components.h"
#include "spiece.h"

/* ---- added tokens ------------------------------------------------------------------------------ */

/* One pattern to find in a piece: an added token's content (raw, or as the normalizer writes it). */
typedef struct added_pattern {
    uint32_t *chars;
    uint32_t size;
    uint32_t id;
    bool single_word, lstrip, rstrip;
} added_pattern_t;

/* Patterns sorted by their first code point, then longest first. */
typedef struct added_set {
    added_pattern_t *patterns;
    size_t count;
} added_set_t;

/* An added token's id and its content as the file writes it: what id_to_token answers for the id. */
typedef struct added_string {
    uint32_t id;
    uint32_t length;
    char *content;
} added_string_t;

typedef struct added_tokens {
    added_set_t raw;         /* `normalized: false`: matched on the text as given */
    added_set_t normalized;  /* matched on the normalizer's output */
    added_string_t *strings; /* one per distinct id, sorted by id */
    size_t strings_count;
    uint32_t next_id; /* ids of the model's vocabulary and of the added tokens are below */
} added_tokens_t;

/* Reads tokenizer.json's "added_tokens" (NULL or an array), giving each token its id as tokenizers
 * does (the id of its content in the model's vocabulary, else the next free one) and normalizing the
 * contents of `normalized` ones with `normalizer` (may be NULL). */
uform_status_t added_tokens_parse(json_t const *array, model_t const *model, normalizer_t const *normalizer,
                                  added_tokens_t *added, tokenizer_fault_t *fault);
void added_tokens_free(added_tokens_t *added);
/* The content of the added token `id` (`*length` bytes, not NUL-terminated), or NULL for an id no added
 * token has. */
char const *added_tokens_string(added_tokens_t const *added, uint32_t id, size_t *length);

/* Splits every open piece of `in` around the leftmost-longest matches of `set` into `out`: a match
 * becomes a piece with its token's id (grown over the whitespace around it for lstrip and rstrip), the
 * text between matches open pieces; a single_word pattern inside a word is passed over. */
uform_status_t added_tokens_split(added_set_t const *set, pieces_t const *in, pieces_t *out);

/* ---- post-processors --------------------------------------------------------------------------- */

typedef struct post_processor post_processor_t;

/* BertProcessing, RobertaProcessing, TemplateProcessing, ByteLevel, Sequence. */
uform_status_t post_processor_parse(json_t const *object, post_processor_t **post, tokenizer_fault_t *fault);
void post_processor_free(post_processor_t *post);
/* Special tokens it adds to one sequence (tokenizers' added_tokens(false)). */
size_t post_processor_added(post_processor_t const *post);
/* Whether it trims offsets anywhere (ByteLevel's and RobertaProcessing's trim_offsets). */
bool post_processor_trims(post_processor_t const *post);

/* Per token, the code points of its string that are spaces ('Ġ', U+0120, or whitespace) at its start
 * and at its end: what trimming offsets reads. Kept beside the tokens only where the post-processor
 * trims. */
typedef struct token_blanks {
    uint32_t leading, trailing;
} token_blanks_t;

/* The blanks of a token's UTF-8 string, or of its code points. */
token_blanks_t token_blanks(char const *string, size_t length);
token_blanks_t token_blanks_of_chars(uint32_t const *chars, size_t count);

/* Rewrites `tokens` (one sequence, truncated) in place: trims offsets, adds the special tokens (with
 * `add_special`). `blanks` runs beside the tokens (NULL when the post-processor does not trim) and is
 * kept beside them; `capacity` of both grows as tokens_push grows them. */
typedef struct post_tokens {
    tokens_t *tokens;
    token_blanks_t *blanks;
    size_t blanks_capacity;
} post_tokens_t;
/* Room for `count` blanks beside the tokens. */
uform_status_t post_blanks_fit(post_tokens_t *tokens, size_t count);

uform_status_t post_processor_apply(post_processor_t const *post, post_tokens_t *tokens, bool add_special);

/* ---- the tokenizer ----------------------------------------------------------------------------- */

typedef enum truncation_direction { TRUNCATE_RIGHT, TRUNCATE_LEFT } truncation_direction_t;

struct uform_tokenizer {
    spiece_t *spiece;               /* a SentencePiece model file's: then it alone cuts, nothing below */
    normalizer_t *normalizer;       /* NULL: none */
    pre_tokenizer_t *pre_tokenizer; /* NULL: none */
    model_t *model;
    post_processor_t *post; /* NULL: none */
    size_t special_added;   /* tokens `post` adds to one text (0 without one) */
    bool trims;             /* `post` trims offsets somewhere: tokens carry their blanks */
    added_tokens_t added;
    struct {
        bool on, only_second;
        size_t max_length;
        truncation_direction_t direction;
    } truncation;
    struct {
        bool on, batch_longest, left;
        size_t length, multiple;
        uint32_t id;
    } padding;
    char model_name[16];
};

/* Cuts one text into `out` (cleared first): UFORM_OK; UFORM_FORMAT with `*message` for a text that is
 * not UTF-8, longer than 4 GiB, or that the truncation cannot cut; UFORM_OUT_OF_MEMORY. `truncated` is
 * set when the truncation cut the text; with `untruncated` the tokenizer's truncation is not applied.
 * Padding to a batch's longest text is the caller's. */
uform_status_t tokenizer_cut(uform_tokenizer_t const *tokenizer, uint8_t const *text, size_t length,
                             bool add_special, bool untruncated, tokenizer_work_t *work, post_tokens_t *out,
                             bool *truncated, char const **message);

/* Frees everything a work holds (the regular expressions' region, the model's scratch). */
void tokenizer_work_free(tokenizer_work_t *work);
