/* Post-processors: what tokenizers does to one sequence's tokens once the model has cut them and the
 * truncation has run. BertProcessing and RobertaProcessing wrap the tokens in their class and
 * separator tokens; TemplateProcessing lays them out by its `single` template; ByteLevel and
 * RobertaProcessing (with trim_offsets) pull each token's span in over the spaces its string begins or
 * ends with; Sequence runs its children in order. Special tokens span [0, 0). Only one sequence is
 * ever processed here: the `pair` templates are read and checked, not used. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

typedef enum post_kind { POST_BERT, POST_ROBERTA, POST_BYTE_LEVEL, POST_TEMPLATE, POST_SEQUENCE } post_kind_t;

/* A special token as a template writes it: one or more ids, each with its string's blanks. */
typedef struct post_special {
    uint32_t *ids;
    token_blanks_t *blanks;
    size_t count;
} post_special_t;

/* One element of a template: the sequence itself (`special` NULL), or a special token. */
typedef struct template_piece {
    post_special_t const *special;
} template_piece_t;

struct post_processor {
    post_kind_t kind;
    bool trim_offsets, add_prefix_space; /* RobertaProcessing, ByteLevel */
    post_special_t cls, sep;             /* BertProcessing, RobertaProcessing */
    post_special_t *specials;            /* TemplateProcessing: its special_tokens */
    size_t specials_count;
    template_piece_t *single;
    size_t single_count;
    post_processor_t **children; /* Sequence */
    size_t children_count;
};

/* ---- token strings' blanks --------------------------------------------------------------------- */

/* Counts one more code point of a token's string into its blanks: a leading one while every one so far
 * was blank, and the run of trailing ones. */
static inline void blanks_count(token_blanks_t *blanks, bool *leading, uint32_t ch) {
    bool blank = ch == 0x120 || white_space(ch);
    *leading = *leading && blank;
    blanks->leading += *leading;
    blanks->trailing = blank ? blanks->trailing + 1 : 0;
}

/* The blanks of a UTF-8 token string: whitespace or 'Ġ' (U+0120, byte-level's space). A byte that is not
 * UTF-8 (none are: jansson checks the file's strings, and pieces are code points) ends the scan. */
static token_blanks_t blanks_of(char const *string, size_t length) {
    token_blanks_t blanks = {0, 0};
    bool leading = true;
    for (size_t at = 0, size; at < length; at += size) {
        uint32_t ch;
        size = utf8_next((uint8_t const *)string + at, length - at, &ch);
        if (size == 0) break;
        blanks_count(&blanks, &leading, ch);
    }
    return blanks;
}

token_blanks_t token_blanks(char const *string, size_t length) {
    return blanks_of(string, length);
}

token_blanks_t token_blanks_of_chars(uint32_t const *chars, size_t count) {
    token_blanks_t blanks = {0, 0};
    bool leading = true;
    for (size_t i = 0; i < count; ++i)
        blanks_count(&blanks, &leading, chars[i]);
    return blanks;
}

/* ---- reading --------------------------------------------------------------------------------- */

static void special_free(post_special_t *special) {
    free(special->ids);
    free(special->blanks);
    *special = (post_special_t){0};
}

void post_processor_free(post_processor_t *post) {
    if (!post) return;
    special_free(&post->cls);
    special_free(&post->sep);
    for (size_t i = 0; i < post->specials_count; ++i)
        special_free(&post->specials[i]);
    free(post->specials);
    free(post->single);
    for (size_t i = 0; i < post->children_count; ++i)
        post_processor_free(post->children[i]);
    free(post->children);
    free(post);
}

static uform_status_t special_one(post_special_t *special, char const *string, size_t length, uint32_t id) {
    special->ids = malloc(sizeof *special->ids);
    special->blanks = malloc(sizeof *special->blanks);
    if (!special->ids || !special->blanks) return UFORM_OUT_OF_MEMORY;
    special->ids[0] = id;
    special->blanks[0] = blanks_of(string, length);
    special->count = 1;
    return UFORM_OK;
}

/* BertProcessing's and RobertaProcessing's ["[SEP]", 102]. */
static uform_status_t pair_parse(json_t const *object, char const *key, char const *what,
                                 post_special_t *special, tokenizer_fault_t *fault) {
    json_t const *pair = json_object_get(object, key);
    json_t const *string = json_array_get(pair, 0), *id = json_array_get(pair, 1);
    if (!json_is_array(pair) || json_array_size(pair) != 2 || !json_is_string(string) ||
        !json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) > UINT32_MAX)
        return tokenizer_fail(fault, UFORM_FORMAT, "%s: \"%s\" is not a [token, id] pair", what, key);
    if (special_one(special, json_string_value(string), json_string_length(string),
                    (uint32_t)json_integer_value(id)))
        return tokenizer_fail(fault, UFORM_OUT_OF_MEMORY, "%s: out of memory", what);
    return UFORM_OK;
}

static uform_status_t required_bool(json_t const *object, char const *key, bool *value, char const *what,
                                    tokenizer_fault_t *fault) {
    if (!json_is_boolean(json_object_get(object, key)))
        return tokenizer_fail(fault, UFORM_FORMAT, "%s: \"%s\" is missing or not a boolean", what, key);
    *value = json_is_true(json_object_get(object, key));
    return UFORM_OK;
}

static uform_status_t bert_parse(json_t const *object, post_processor_t *post, tokenizer_fault_t *fault) {
    uform_status_t status = pair_parse(object, "sep", "BertProcessing", &post->sep, fault);
    if (status == UFORM_OK) status = pair_parse(object, "cls", "BertProcessing", &post->cls, fault);
    return status;
}

static uform_status_t roberta_parse(json_t const *object, post_processor_t *post, tokenizer_fault_t *fault) {
    static char const what[] = "RobertaProcessing";
    uform_status_t status = pair_parse(object, "sep", what, &post->sep, fault);
    if (status == UFORM_OK) status = pair_parse(object, "cls", what, &post->cls, fault);
    if (status == UFORM_OK) status = required_bool(object, "trim_offsets", &post->trim_offsets, what, fault);
    if (status == UFORM_OK)
        status = required_bool(object, "add_prefix_space", &post->add_prefix_space, what, fault);
    return status;
}

/* ByteLevel as a post-processor reads the pre-tokenizer's fields; tokenizers defaults each one. */
static uform_status_t byte_level_parse(json_t const *object, post_processor_t *post,
                                       tokenizer_fault_t *fault) {
    static char const what[] = "ByteLevel post-processor";
    uform_status_t status = json_get_bool(object, "trim_offsets", true, &post->trim_offsets, what, fault);
    if (status == UFORM_OK)
        status = json_get_bool(object, "add_prefix_space", true, &post->add_prefix_space, what, fault);
    return status;
}

/* One entry of special_tokens: {"id": "[CLS]", "ids": [101], "tokens": ["[CLS]"]}. */
static uform_status_t template_special_parse(json_t const *value, post_special_t *special,
                                             tokenizer_fault_t *fault) {
    json_t const *ids = json_object_get(value, "ids"), *tokens = json_object_get(value, "tokens");
    if (!json_is_object(value) || !json_is_array(ids) || !json_is_array(tokens) ||
        json_array_size(ids) != json_array_size(tokens))
        return tokenizer_fail(fault, UFORM_FORMAT,
                              "TemplateProcessing: a special token needs as many ids as tokens");
    size_t count = json_array_size(ids);
    special->ids = calloc(count + 1, sizeof *special->ids);
    special->blanks = calloc(count + 1, sizeof *special->blanks);
    if (!special->ids || !special->blanks)
        return tokenizer_fail(fault, UFORM_OUT_OF_MEMORY, "TemplateProcessing: out of memory");
    for (size_t i = 0; i < count; ++i) {
        json_t const *id = json_array_get(ids, i), *token = json_array_get(tokens, i);
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) > UINT32_MAX ||
            !json_is_string(token))
            return tokenizer_fail(fault, UFORM_FORMAT,
                                  "TemplateProcessing: a special token's id or string is malformed");
        special->ids[i] = (uint32_t)json_integer_value(id);
        special->blanks[i] = blanks_of(json_string_value(token), json_string_length(token));
    }
    special->count = count;
    return UFORM_OK;
}

/* A template: [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}].
 * `single` lays out its pieces; `pair` is only checked. */
static uform_status_t template_parse(json_t const *object, char const *key, json_t const *specials,
                                     post_processor_t *post, bool single, tokenizer_fault_t *fault) {
    json_t const *template = json_object_get(object, key);
    if (!json_is_array(template))
        return tokenizer_fail(fault, UFORM_FORMAT, "TemplateProcessing: \"%s\" is not a list", key);
    size_t count = json_array_size(template);
    bool has_a = false, has_b = false;
    if (single && !(post->single = calloc(count + 1, sizeof *post->single)))
        return tokenizer_fail(fault, UFORM_OUT_OF_MEMORY, "TemplateProcessing: out of memory");
    for (size_t i = 0; i < count; ++i) {
        json_t const *piece = json_array_get(template, i);
        json_t const *sequence = json_object_get(piece, "Sequence"),
                     *token = json_object_get(piece, "SpecialToken");
        json_t const *id = json_object_get(sequence ? sequence : token, "id");
        if (!json_is_object(piece) || json_object_size(piece) != 1 || !json_is_string(id))
            return tokenizer_fail(fault, UFORM_FORMAT, "TemplateProcessing: a piece of \"%s\" is malformed",
                                  key);
        if (sequence) {
            bool a = strcmp(json_string_value(id), "A") == 0;
            if (!a && strcmp(json_string_value(id), "B") != 0)
                return tokenizer_fail(fault, UFORM_FORMAT, "TemplateProcessing: unknown sequence in \"%s\"",
                                      key);
            has_a |= a;
            has_b |= !a;
            if (single && !a)
                return tokenizer_fail(fault, UFORM_FORMAT, "TemplateProcessing: \"single\" names sequence B");
            if (single) post->single[post->single_count++] = (template_piece_t){NULL};
            continue;
        }
        json_t const *entry = json_object_get(specials, json_string_value(id));
        if (!entry)
            return tokenizer_fail(fault, UFORM_FORMAT, "TemplateProcessing: missing special token \"%.60s\"",
                                  json_string_value(id));
        /* The specials were read in the object's order: find this one's slot. */
        size_t slot = 0;
        for (void *iter = json_object_iter((json_t *)specials); iter;
             iter = json_object_iter_next((json_t *)specials, iter), ++slot)
            if (json_object_iter_value(iter) == entry) break;
        if (single) post->single[post->single_count++] = (template_piece_t){&post->specials[slot]};
    }
    if (!single && !(has_a && has_b))
        return tokenizer_fail(fault, UFORM_FORMAT, "TemplateProcessing: \"pair\" must use both sequences");
    return UFORM_OK;
}

static uform_status_t template_processing_parse(json_t const *object, post_processor_t *post,
                                                tokenizer_fault_t *fault) {
    json_t const *specials = json_object_get(object, "special_tokens");
    if (!json_is_object(specials))
        return tokenizer_fail(fault, UFORM_FORMAT, "TemplateProcessing: \"special_tokens\" is not an object");
    post->specials = calloc(json_object_size(specials) + 1, sizeof *post->specials);
    if (!post->specials)
        return tokenizer_fail(fault, UFORM_OUT_OF_MEMORY, "TemplateProcessing: out of memory");
    uform_status_t status = UFORM_OK;
    for (void *iter = json_object_iter((json_t *)specials); iter && status == UFORM_OK;
         iter = json_object_iter_next((json_t *)specials, iter))
        status = template_special_parse(json_object_iter_value(iter), &post->specials[post->specials_count++],
                                        fault);
    if (status == UFORM_OK) status = template_parse(object, "single", specials, post, true, fault);
    if (status == UFORM_OK) status = template_parse(object, "pair", specials, post, false, fault);
    return status;
}

static uform_status_t sequence_parse(json_t const *object, post_processor_t *post, tokenizer_fault_t *fault) {
    json_t const *children = json_object_get(object, "processors");
    if (!json_is_array(children))
        return tokenizer_fail(fault, UFORM_FORMAT, "post-processor Sequence: \"processors\" is not a list");
    post->children = calloc(json_array_size(children) + 1, sizeof *post->children);
    if (!post->children)
        return tokenizer_fail(fault, UFORM_OUT_OF_MEMORY, "post-processor Sequence: out of memory");
    uform_status_t status = UFORM_OK;
    for (size_t i = 0; i < json_array_size(children) && status == UFORM_OK; ++i) {
        status = post_processor_parse(json_array_get(children, i), &post->children[i], fault);
        if (status == UFORM_OK) post->children_count++;
    }
    return status;
}

uform_status_t post_processor_parse(json_t const *object, post_processor_t **out, tokenizer_fault_t *fault) {
    char const *type;
    uform_status_t status = json_get_type(object, &type, "post-processor", fault);
    if (status != UFORM_OK) return status;
    post_processor_t *post = calloc(1, sizeof *post);
    if (!post) return tokenizer_fail(fault, UFORM_OUT_OF_MEMORY, "post-processor: out of memory");
    if (strcmp(type, "BertProcessing") == 0)
        post->kind = POST_BERT, status = bert_parse(object, post, fault);
    else if (strcmp(type, "RobertaProcessing") == 0)
        post->kind = POST_ROBERTA, status = roberta_parse(object, post, fault);
    else if (strcmp(type, "ByteLevel") == 0)
        post->kind = POST_BYTE_LEVEL, status = byte_level_parse(object, post, fault);
    else if (strcmp(type, "TemplateProcessing") == 0)
        post->kind = POST_TEMPLATE, status = template_processing_parse(object, post, fault);
    else if (strcmp(type, "Sequence") == 0)
        post->kind = POST_SEQUENCE, status = sequence_parse(object, post, fault);
    else
        status = tokenizer_fail(fault, UFORM_UNSUPPORTED, "post-processor: unsupported type \"%.60s\"", type);
    if (status != UFORM_OK) {
        post_processor_free(post);
        return status;
    }
    *out = post;
    return UFORM_OK;
}

size_t post_processor_added(post_processor_t const *post) {
    size_t added = 0;
    switch (post->kind) {
    case POST_BERT:
    case POST_ROBERTA:
        return 2;
    case POST_BYTE_LEVEL:
        return 0;
    case POST_TEMPLATE:
        for (size_t i = 0; i < post->single_count; ++i)
            added += post->single[i].special ? post->single[i].special->count : 0;
        return added;
    case POST_SEQUENCE:
        for (size_t i = 0; i < post->children_count; ++i)
            added += post_processor_added(post->children[i]);
        return added;
    }
    return 0;
}

bool post_processor_trims(post_processor_t const *post) {
    if ((post->kind == POST_ROBERTA || post->kind == POST_BYTE_LEVEL) && post->trim_offsets) return true;
    for (size_t i = 0; i < post->children_count; ++i)
        if (post_processor_trims(post->children[i])) return true;
    return false;
}

/* ---- applying ---------------------------------------------------------------------------------- */

/* tokenizers' process_offsets: a token's span loses its leading and trailing spaces (a first token
 * keeps the one space add_prefix_space put there). Spans are bytes: the spaces counted are code
 * points, as tokenizers adds a count of characters to byte offsets. */
static void trim_offsets(post_tokens_t *tokens, bool add_prefix_space) {
    tokens_t *list = tokens->tokens;
    for (size_t i = 0; i < list->count; ++i) {
        token_blanks_t blanks = tokens->blanks[i];
        piece_span_t *span = &list->spans[i];
        uint32_t leading = blanks.leading;
        if (leading > 0) {
            bool first = i == 0 || span->begin == 0;
            if (first && add_prefix_space && leading == 1) leading = 0;
            span->begin = span->begin + leading < span->end ? span->begin + leading : span->end;
        }
        if (blanks.trailing > 0 && span->end >= blanks.trailing)
            span->end = span->end - blanks.trailing > span->begin ? span->end - blanks.trailing : span->begin;
    }
}

uform_status_t post_blanks_fit(post_tokens_t *tokens, size_t count) {
    if (count <= tokens->blanks_capacity) return UFORM_OK;
    token_blanks_t *blanks = realloc(tokens->blanks, count * sizeof *blanks);
    if (!blanks) return UFORM_OUT_OF_MEMORY;
    tokens->blanks = blanks;
    tokens->blanks_capacity = count;
    return UFORM_OK;
}

/* Inserts `count` special tokens at `at`: ids, spans [0, 0), blanks. */
static uform_status_t insert(post_tokens_t *tokens, size_t at, uint32_t const *ids,
                             token_blanks_t const *blanks, size_t count) {
    tokens_t *list = tokens->tokens;
    size_t old = list->count;
    for (size_t i = 0; i < count; ++i)
        if (tokens_push(list, 0, (piece_span_t){0, 0}, true) != UFORM_OK) return UFORM_OUT_OF_MEMORY;
    memmove(list->ids + at + count, list->ids + at, (old - at) * sizeof *list->ids);
    memmove(list->spans + at + count, list->spans + at, (old - at) * sizeof *list->spans);
    memmove(list->special + at + count, list->special + at, (old - at) * sizeof *list->special);
    for (size_t i = 0; i < count; ++i) {
        list->ids[at + i] = ids[i];
        list->spans[at + i] = (piece_span_t){0, 0};
        list->special[at + i] = 1;
    }
    if (!tokens->blanks) return UFORM_OK;
    if (post_blanks_fit(tokens, list->count) != UFORM_OK) return UFORM_OUT_OF_MEMORY;
    memmove(tokens->blanks + at + count, tokens->blanks + at, (old - at) * sizeof *tokens->blanks);
    memcpy(tokens->blanks + at, blanks, count * sizeof *blanks);
    return UFORM_OK;
}

/* TemplateProcessing's single template: its special tokens around (and between, for a template that
 * names the sequence twice) copies of the sequence. */
static uform_status_t apply_template(post_processor_t const *post, post_tokens_t *tokens) {
    tokens_t *list = tokens->tokens;
    size_t sequence = list->count, sequences = 0, at = 0;
    for (size_t i = 0; i < post->single_count; ++i)
        sequences += post->single[i].special == NULL;
    if (sequences == 0) {
        list->count = 0;
    } else {
        for (size_t copy = 1; copy < sequences; ++copy) /* a template naming $A again repeats it */
            for (size_t i = 0; i < sequence; ++i) {
                if (tokens_push(list, list->ids[i], list->spans[i], list->special[i]) != UFORM_OK)
                    return UFORM_OUT_OF_MEMORY;
                if (tokens->blanks) {
                    if (post_blanks_fit(tokens, list->count) != UFORM_OK) return UFORM_OUT_OF_MEMORY;
                    tokens->blanks[list->count - 1] = tokens->blanks[i];
                }
            }
    }
    for (size_t i = 0; i < post->single_count; ++i) {
        post_special_t const *special = post->single[i].special;
        if (!special) {
            at += sequence;
            continue;
        }
        if (insert(tokens, at, special->ids, special->blanks, special->count) != UFORM_OK)
            return UFORM_OUT_OF_MEMORY;
        at += special->count;
    }
    return UFORM_OK;
}

uform_status_t post_processor_apply(post_processor_t const *post, post_tokens_t *tokens, bool add_special) {
    uform_status_t status = UFORM_OK;
    switch (post->kind) {
    case POST_BYTE_LEVEL:
        if (post->trim_offsets) trim_offsets(tokens, post->add_prefix_space);
        return UFORM_OK;
    case POST_ROBERTA:
        if (post->trim_offsets) trim_offsets(tokens, post->add_prefix_space);
        __attribute__((fallthrough)); /* then the same wrapping as BERT's */
    case POST_BERT:
        if (!add_special) return UFORM_OK;
        status = insert(tokens, 0, post->cls.ids, post->cls.blanks, 1);
        if (status == UFORM_OK)
            status = insert(tokens, tokens->tokens->count, post->sep.ids, post->sep.blanks, 1);
        return status;
    case POST_TEMPLATE:
        return add_special ? apply_template(post, tokens) : UFORM_OK;
    case POST_SEQUENCE:
        for (size_t i = 0; i < post->children_count && status == UFORM_OK; ++i)
            status = post_processor_apply(post->children[i], tokens, add_special);
        return status;
    }
    return UFORM_INTERNAL;
}
