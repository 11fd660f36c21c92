/* A tokenizer read from tokenizer.json, and one text cut through it the way tokenizers' encode does:
 *
 *   UTF-8 -> one piece -> added tokens (raw) -> normalizer -> added tokens (normalized)
 *         -> pre-tokenizer -> model, piece by piece -> truncation -> post-processor -> padding
 *
 * Each stage reads one piece list and writes the next (two lists taken from the work, in turns). A folder
 * without tokenizer.json, or a file that is not JSON, is a SentencePiece model instead, which spiece.c
 * reads and cuts as transformers' slow tokenizers do. */
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <oniguruma.h>

#include "json_fault.h"
#include "models.h"
#include "tokenizer.h"

/* ---- reading tokenizer.json -------------------------------------------------------------------- */

static void tokenizer_destroy(uform_tokenizer_t *tokenizer) {
    if (!tokenizer) return;
    spiece_free(tokenizer->spiece);
    normalizer_free(tokenizer->normalizer);
    pre_tokenizer_free(tokenizer->pre_tokenizer);
    if (tokenizer->model) model_free(tokenizer->model);
    post_processor_free(tokenizer->post);
    added_tokens_free(&tokenizer->added);
    free(tokenizer);
}

/* "truncation": null, or {"direction", "max_length", "strategy", "stride"}. */
static uform_status_t truncation_parse(json_t const *object, uform_tokenizer_t *tokenizer,
                                       tokenizer_fault_t *fault) {
    static char const what[] = "truncation";
    if (!object || json_is_null(object)) return UFORM_OK;
    char const *direction, *strategy;
    size_t stride;
    uform_status_t status = json_get_string(object, "direction", "Right", &direction, NULL, what, fault);
    if (status == UFORM_OK) status = json_get_string(object, "strategy", NULL, &strategy, NULL, what, fault);
    if (status == UFORM_OK) status = json_get_size(object, "stride", 0, &stride, what, fault);
    if (status == UFORM_OK)
        status = json_get_size(object, "max_length", 0, &tokenizer->truncation.max_length, what, fault);
    if (status != UFORM_OK) return status;
    if (!json_is_integer(json_object_get(object, "max_length")) || !strategy)
        return tokenizer_fail(fault, UFORM_FORMAT, "truncation: \"max_length\" or \"strategy\" is missing");
    bool left = strcmp(direction, "Left") == 0;
    if (!left && strcmp(direction, "Right") != 0)
        return tokenizer_fail(fault, UFORM_FORMAT, "truncation: unknown direction \"%.40s\"", direction);
    bool only_second = strcmp(strategy, "OnlySecond") == 0;
    if (!only_second && strcmp(strategy, "LongestFirst") != 0 && strcmp(strategy, "OnlyFirst") != 0)
        return tokenizer_fail(fault, UFORM_FORMAT, "truncation: unknown strategy \"%.40s\"", strategy);
    tokenizer->truncation.on = true;
    tokenizer->truncation.only_second = only_second;
    tokenizer->truncation.direction = left ? TRUNCATE_LEFT : TRUNCATE_RIGHT;
    return UFORM_OK;
}

/* "padding": null, or {"strategy": "BatchLongest" | {"Fixed": n}, "direction", "pad_to_multiple_of",
 * "pad_id", "pad_type_id", "pad_token"}. */
static uform_status_t padding_parse(json_t const *object, uform_tokenizer_t *tokenizer,
                                    tokenizer_fault_t *fault) {
    static char const what[] = "padding";
    if (!object || json_is_null(object)) return UFORM_OK;
    if (!json_is_object(object)) return tokenizer_fail(fault, UFORM_FORMAT, "\"padding\" is not an object");
    json_t const *strategy = json_object_get(object, "strategy");
    json_t const *fixed = json_object_get(strategy, "Fixed");
    if (json_is_string(strategy) && strcmp(json_string_value(strategy), "BatchLongest") == 0)
        tokenizer->padding.batch_longest = true;
    else if (json_is_integer(fixed) && json_integer_value(fixed) >= 0 &&
             json_integer_value(fixed) <= UINT32_MAX)
        tokenizer->padding.length = (size_t)json_integer_value(fixed);
    else
        return tokenizer_fail(fault, UFORM_FORMAT, "padding: unknown strategy");
    char const *direction;
    size_t id;
    uform_status_t status = json_get_string(object, "direction", NULL, &direction, NULL, what, fault);
    if (status == UFORM_OK)
        status = json_get_size(object, "pad_to_multiple_of", 0, &tokenizer->padding.multiple, what, fault);
    if (status == UFORM_OK) status = json_get_size(object, "pad_id", 0, &id, what, fault);
    if (status != UFORM_OK) return status;
    if (!direction || (strcmp(direction, "Left") != 0 && strcmp(direction, "Right") != 0))
        return tokenizer_fail(fault, UFORM_FORMAT, "padding: \"direction\" is missing or unknown");
    if (id > UINT32_MAX || tokenizer->padding.multiple > UINT32_MAX)
        return tokenizer_fail(fault, UFORM_FORMAT,
                              "padding: \"pad_id\" or \"pad_to_multiple_of\" out of range");
    tokenizer->padding.on = true;
    tokenizer->padding.left = strcmp(direction, "Left") == 0;
    tokenizer->padding.id = (uint32_t)id;
    return UFORM_OK;
}

/* The model's name for uform_tokenizer_info: its "type", or the name tokenizers would guess. */
static void model_name(json_t const *object, uform_tokenizer_t *tokenizer) {
    json_t const *type = json_object_get(object, "type");
    char const *name = json_is_string(type)                                  ? json_string_value(type)
                       : json_object_get(object, "merges")                   ? "BPE"
                       : json_is_array(json_object_get(object, "vocab"))     ? "Unigram"
                       : json_object_get(object, "max_input_chars_per_word") ? "WordPiece"
                                                                             : "WordLevel";
    snprintf(tokenizer->model_name, sizeof tokenizer->model_name, "%s", name);
}

/* A component slot: null (none) or an object. */
static json_t const *slot(json_t const *root, char const *key) {
    json_t const *value = json_object_get(root, key);
    return value && !json_is_null(value) ? value : NULL;
}

static uform_status_t root_parse(json_t const *root, uform_tokenizer_t *tokenizer, tokenizer_fault_t *fault) {
    if (!json_is_object(root)) return tokenizer_fail(fault, UFORM_FORMAT, "tokenizer.json is not an object");
    json_t const *version = json_object_get(root, "version");
    if (version && !(json_is_string(version) && strcmp(json_string_value(version), "1.0") == 0))
        return tokenizer_fail(fault, UFORM_UNSUPPORTED, "tokenizer.json: unknown version (1.0 is read)");
    json_t const *model = slot(root, "model");
    if (!model) return tokenizer_fail(fault, UFORM_FORMAT, "tokenizer.json has no \"model\"");
    uform_status_t status = UFORM_OK;
    if (slot(root, "normalizer"))
        status = normalizer_parse(slot(root, "normalizer"), &tokenizer->normalizer, fault);
    if (status == UFORM_OK && slot(root, "pre_tokenizer"))
        status = pre_tokenizer_parse(slot(root, "pre_tokenizer"), &tokenizer->pre_tokenizer, fault);
    if (status == UFORM_OK) status = model_parse(model, &tokenizer->model, fault);
    if (status == UFORM_OK && slot(root, "post_processor"))
        status = post_processor_parse(slot(root, "post_processor"), &tokenizer->post, fault);
    if (status == UFORM_OK && tokenizer->post) { /* read once: every text asks */
        tokenizer->special_added = post_processor_added(tokenizer->post);
        tokenizer->trims = post_processor_trims(tokenizer->post);
    }
    if (status == UFORM_OK) status = truncation_parse(json_object_get(root, "truncation"), tokenizer, fault);
    if (status == UFORM_OK) status = padding_parse(json_object_get(root, "padding"), tokenizer, fault);
    if (status == UFORM_OK)
        status = added_tokens_parse(json_object_get(root, "added_tokens"), tokenizer->model,
                                    tokenizer->normalizer, &tokenizer->added, fault);
    if (status == UFORM_OK) model_name(model, tokenizer);
    return status;
}

/* Parses a tokenizer.json held in memory; `fault` names what was wrong. */
static uform_status_t tokenizer_read(void const *json, size_t length, uform_tokenizer_t **out,
                                     tokenizer_fault_t *fault) {
    json_error_t error;
    json_t *root = json_loadb(json, length, JSON_REJECT_DUPLICATES, &error);
    if (!root && json_fault_memory(&error))
        return tokenizer_fail(fault, UFORM_OUT_OF_MEMORY, "tokenizer.json: out of memory");
    if (!root)
        return tokenizer_fail(fault, UFORM_FORMAT, "tokenizer.json, line %d: %.100s", error.line, error.text);
    uform_tokenizer_t *tokenizer = calloc(1, sizeof *tokenizer);
    uform_status_t status = tokenizer ? root_parse(root, tokenizer, fault)
                                      : tokenizer_fail(fault, UFORM_OUT_OF_MEMORY, "out of memory");
    json_decref(root);
    if (status != UFORM_OK) {
        tokenizer_destroy(tokenizer);
        return status;
    }
    *out = tokenizer;
    return UFORM_OK;
}

/* ---- cutting one text -------------------------------------------------------------------------- */

/* The tokens of one piece: an added token's id, or what the model cuts it into; their blanks beside
 * them where the post-processor trims. */
static uform_status_t cut_piece(uform_tokenizer_t const *tokenizer, pieces_t const *pieces, size_t index,
                                tokenizer_work_t *work, post_tokens_t *out) {
    tokens_t *tokens = out->tokens;
    size_t first = tokens->count;
    uform_status_t status;
    if (pieces->ids[index] != PIECE_OPEN)
        status = tokens_push_range(tokens, (uint32_t)pieces->ids[index], pieces_spans(pieces, index), 0,
                                   pieces_size(pieces, index));
    else
        status = model_tokenize(tokenizer->model, pieces, index, tokens, work);
    if (status != UFORM_OK || !tokenizer->trims) return status;
    if (post_blanks_fit(out, tokens->capacity) != UFORM_OK) return UFORM_OUT_OF_MEMORY;
    for (size_t i = first; i < tokens->count; ++i) {
        if (pieces->ids[index] != PIECE_OPEN) { /* an added token's string is the piece */
            out->blanks[i] = token_blanks_of_chars(pieces_chars(pieces, index), pieces_size(pieces, index));
            continue;
        }
        size_t length = 0;
        char const *string = vocab_token(model_vocab(tokenizer->model), tokens->ids[i], &length);
        out->blanks[i] = string ? token_blanks(string, length) : (token_blanks_t){0, 0};
    }
    return UFORM_OK;
}

/* Keeps `keep` tokens of the sequence: its first (right truncation) or its last. */
static void truncate_to(post_tokens_t *out, size_t keep, truncation_direction_t direction) {
    tokens_t *tokens = out->tokens;
    if (tokens->count <= keep) return;
    if (direction == TRUNCATE_LEFT) {
        size_t drop = tokens->count - keep;
        memmove(tokens->ids, tokens->ids + drop, keep * sizeof *tokens->ids);
        memmove(tokens->spans, tokens->spans + drop, keep * sizeof *tokens->spans);
        memmove(tokens->special, tokens->special + drop, keep * sizeof *tokens->special);
        if (out->blanks) memmove(out->blanks, out->blanks + drop, keep * sizeof *out->blanks);
    }
    tokens->count = keep;
}

/* tokenizers' post_process, step 1: max_length less the special tokens to come. Where max_length is
 * smaller than those, tokenizers' unsigned subtraction wraps (release builds do not check it) and
 * nothing is cut; so here too. */
static uform_status_t truncation_apply(uform_tokenizer_t const *tokenizer, bool add_special,
                                       post_tokens_t *out, bool *truncated, char const **message) {
    if (!tokenizer->truncation.on) return UFORM_OK;
    size_t max_length = tokenizer->truncation.max_length;
    size_t added = add_special ? tokenizer->special_added : 0;
    if (added > 0) {
        if (max_length < added) return UFORM_OK;
        max_length -= added;
    }
    if (out->tokens->count <= max_length && max_length > 0) return UFORM_OK;
    if (max_length > 0 && tokenizer->truncation.only_second)
        return *message = "the truncation strategy only_second needs a second sequence", UFORM_FORMAT;
    *truncated = out->tokens->count > max_length;
    truncate_to(out, max_length, tokenizer->truncation.direction);
    return UFORM_OK;
}

/* Pads one text to `length` tokens (rounded up to the multiple asked) with the pad id, spans [0, 0). */
static uform_status_t tokenizer_pad(uform_tokenizer_t const *tokenizer, tokens_t *tokens, size_t length) {
    size_t multiple = tokenizer->padding.multiple;
    if (multiple > 0 && length % multiple) length += multiple - length % multiple;
    size_t old = tokens->count;
    if (old >= length) return UFORM_OK;
    for (size_t i = old; i < length; ++i)
        if (tokens_push(tokens, tokenizer->padding.id, (piece_span_t){0, 0}, true) != UFORM_OK)
            return UFORM_OUT_OF_MEMORY;
    if (!tokenizer->padding.left) return UFORM_OK;
    size_t pads = length - old;
    memmove(tokens->ids + pads, tokens->ids, old * sizeof *tokens->ids);
    memmove(tokens->spans + pads, tokens->spans, old * sizeof *tokens->spans);
    memmove(tokens->special + pads, tokens->special, old * sizeof *tokens->special);
    for (size_t i = 0; i < pads; ++i) {
        tokens->ids[i] = tokenizer->padding.id;
        tokens->spans[i] = (piece_span_t){0, 0};
        tokens->special[i] = 1;
    }
    return UFORM_OK;
}

/* The stages up to the model, from `text` into the pieces the model cuts; answers the last list. */
static uform_status_t pieces_stages(uform_tokenizer_t const *tokenizer, uint8_t const *text, size_t length,
                                    tokenizer_work_t *work, pieces_t *a, pieces_t *b, pieces_t **last,
                                    char const **message) {
    size_t bad = 0;
    uform_status_t status = pieces_from_utf8(a, text, length, &bad);
    if (status == UFORM_FORMAT)
        *message = length > UINT32_MAX ? "text longer than 4 GiB" : "text is not valid UTF-8";
    pieces_t *from = a, *to = b;
#define STAGE(call)                                                                                          \
    do {                                                                                                     \
        if (status != UFORM_OK) break;                                                                       \
        pieces_clear(to);                                                                                    \
        status = (call);                                                                                     \
        pieces_t *swap = from;                                                                               \
        from = to;                                                                                           \
        to = swap;                                                                                           \
    } while (0)
    if (tokenizer->added.raw.count) STAGE(added_tokens_split(&tokenizer->added.raw, from, to));
    if (tokenizer->normalizer) STAGE(normalizer_apply(tokenizer->normalizer, from, to, work));
    if (tokenizer->added.normalized.count) STAGE(added_tokens_split(&tokenizer->added.normalized, from, to));
    if (tokenizer->pre_tokenizer) STAGE(pre_tokenizer_apply(tokenizer->pre_tokenizer, from, to, work));
#undef STAGE
    *last = from;
    return status;
}

uform_status_t tokenizer_cut(uform_tokenizer_t const *tokenizer, uint8_t const *text, size_t length,
                             bool add_special, bool untruncated, tokenizer_work_t *work, post_tokens_t *out,
                             bool *truncated, char const **message) {
    out->tokens->count = 0;
    *truncated = false;
    *message = NULL;
    if (tokenizer->spiece)
        return spiece_cut(tokenizer->spiece, text, length, add_special, work, out->tokens, message);
    pieces_t *a = work_take(work), *b = work_take(work), *last = NULL;
    if (!a || !b) return UFORM_INTERNAL;
    uform_status_t status = pieces_stages(tokenizer, text, length, work, a, b, &last, message);
    for (size_t i = 0; status == UFORM_OK && i < last->count; ++i)
        status = cut_piece(tokenizer, last, i, work, out);
    work_give(work);
    work_give(work);
    if (status == UFORM_OK && !untruncated)
        status = truncation_apply(tokenizer, add_special, out, truncated, message);
    if (status == UFORM_OK && tokenizer->post)
        status = post_processor_apply(tokenizer->post, out, add_special);
    if (status == UFORM_OK && tokenizer->padding.on && !tokenizer->padding.batch_longest)
        status = tokenizer_pad(tokenizer, out->tokens, tokenizer->padding.length);
    if (status == UFORM_FORMAT && !*message)
        *message = *model_work_fault(work) ? model_work_fault(work) : "the model cannot cut the text";
    return status;
}

void tokenizer_work_free(tokenizer_work_t *work) {
    for (size_t t = 0; t < TOKENIZER_WORK_TEMPS; ++t)
        pieces_free(&work->temps[t]);
    free(work->bytes);
    if (work->region) onig_region_free(work->region, 1);
    model_work_free(work);
    spiece_work_free(work);
    *work = (tokenizer_work_t){0};
}

/* ---- the public functions ---------------------------------------------------------------------- */

UFORM_EXPORT uform_status_t uform_tokenizer_parse(void const *json, size_t length,
                                                  uform_tokenizer_t **tokenizer) {
    static char const entry[] = "uform_tokenizer_parse";
    if (!tokenizer || (!json && length))
        return failed(UFORM_INVALID_ARGUMENT, entry, "json or tokenizer is NULL");
    *tokenizer = NULL;
    tokenizer_fault_t fault = {{0}};
    uform_status_t status = tokenizer_read(json ? json : "", length, tokenizer, &fault);
    return status == UFORM_OK ? UFORM_OK : failed(status, entry, fault.message);
}

#define TOKENIZER_PATH_SIZE 4096

/* A folder's tokenizer files: its tokenizer.json; else its SentencePiece model (spiece.model, as SigLIP's
 * and T5's folders hold it, or sentencepiece.bpe.model, as XLM-R's) and the tokenizer_config.json beside
 * it into `config`. */
static uform_status_t folder_files(char const *folder, char *file, char *config, char const **message) {
    static char const *const names[] = {"tokenizer.json", "spiece.model", "sentencepiece.bpe.model"};
    for (size_t i = 0; i < sizeof names / sizeof *names; ++i) {
        struct stat about;
        if (snprintf(file, TOKENIZER_PATH_SIZE, "%s/%s", folder, names[i]) >= TOKENIZER_PATH_SIZE ||
            snprintf(config, TOKENIZER_PATH_SIZE, "%s/tokenizer_config.json", folder) >= TOKENIZER_PATH_SIZE)
            return *message = "the folder's path is too long", UFORM_INVALID_ARGUMENT;
        if (stat(file, &about) != 0) continue;
        if (i == 0) config[0] = '\0';
        return UFORM_OK;
    }
    return *message = "the folder holds no tokenizer.json, spiece.model or sentencepiece.bpe.model", UFORM_IO;
}

/* The whole file at `path` into a new buffer. Read with open and read, which allocate nothing: only the
 * buffer's allocation can fail for want of memory, and it says so (stdio's streams allocate, and their
 * failure reads as an I/O error). */
static uform_status_t file_read(char const *path, char **data, size_t *length, char const **message) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return *message = "cannot open the tokenizer file", errno == ENOMEM ? UFORM_OUT_OF_MEMORY : UFORM_IO;
    struct stat about;
    char *buffer = NULL;
    uform_status_t status = UFORM_OK;
    if (fstat(fd, &about) != 0 || !S_ISREG(about.st_mode) || (uint64_t)about.st_size >= SIZE_MAX) {
        *message = "cannot read the tokenizer file", status = UFORM_IO;
    } else if (!(buffer = malloc((size_t)about.st_size + 1))) {
        *message = "out of memory reading the tokenizer file", status = UFORM_OUT_OF_MEMORY;
    }
    size_t size = status == UFORM_OK ? (size_t)about.st_size : 0, done = 0;
    while (status == UFORM_OK && done < size) {
        ssize_t got = read(fd, buffer + done, size - done);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0)
            *message = "cannot read the tokenizer file", status = UFORM_IO;
        else
            done += (size_t)got;
    }
    close(fd);
    if (status != UFORM_OK) {
        free(buffer);
        return status;
    }
    *data = buffer;
    *length = size;
    return UFORM_OK;
}

/* A tokenizer.json begins with '{', after whitespace; anything else is read as a SentencePiece model. */
static bool json_file(char const *data, size_t length) {
    size_t at = 0;
    while (at < length && (data[at] == ' ' || data[at] == '\t' || data[at] == '\n' || data[at] == '\r'))
        at++;
    return at < length && data[at] == '{';
}

/* A tokenizer over a SentencePiece model's bytes (spiece.h); `config` NULL for a bare model file. */
static uform_status_t spiece_tokenizer(void const *model, size_t length, char const *config,
                                       uform_tokenizer_t **out, tokenizer_fault_t *fault) {
    uform_tokenizer_t *tokenizer = calloc(1, sizeof *tokenizer);
    if (!tokenizer) return tokenizer_fail(fault, UFORM_OUT_OF_MEMORY, "out of memory");
    uform_status_t status = spiece_read(model, length, config, &tokenizer->spiece, fault);
    if (status != UFORM_OK) {
        free(tokenizer);
        return status;
    }
    *out = tokenizer;
    return UFORM_OK;
}

UFORM_EXPORT uform_status_t uform_tokenizer_open(char const *path, uform_tokenizer_t **tokenizer) {
    static char const entry[] = "uform_tokenizer_open";
    if (!path || !tokenizer) return failed(UFORM_INVALID_ARGUMENT, entry, "path or tokenizer is NULL");
    *tokenizer = NULL;
    char file[TOKENIZER_PATH_SIZE], config[TOKENIZER_PATH_SIZE] = "";
    char const *message = NULL;
    struct stat about;
    bool folder = stat(path, &about) == 0 && S_ISDIR(about.st_mode);
    uform_status_t status = folder ? folder_files(path, file, config, &message) : UFORM_OK;
    char *data = NULL;
    size_t length = 0;
    if (status == UFORM_OK) status = file_read(folder ? file : path, &data, &length, &message);
    if (status != UFORM_OK) return failed(status, entry, message);
    tokenizer_fault_t fault = {{0}};
    if (folder ? !config[0] : json_file(data, length))
        status = tokenizer_read(data, length, tokenizer, &fault);
    else
        status = spiece_tokenizer(data, length, folder ? config : NULL, tokenizer, &fault);
    free(data);
    return status == UFORM_OK ? UFORM_OK : failed(status, entry, fault.message);
}

UFORM_EXPORT void uform_tokenizer_free(uform_tokenizer_t *tokenizer) {
    tokenizer_destroy(tokenizer);
}

UFORM_EXPORT uform_status_t uform_tokenizer_token(uform_tokenizer_t const *tokenizer, uint32_t id,
                                                  char const **string, size_t *length) {
    static char const entry[] = "uform_tokenizer_token";
    if (!tokenizer || !string || !length) return failed(UFORM_INVALID_ARGUMENT, entry, "an argument is NULL");
    *string = NULL;
    *length = 0;
    size_t size = 0;
    char const *found = NULL;
    if (tokenizer->spiece)
        found = spiece_token(tokenizer->spiece, id, &size);
    else if (!(found = added_tokens_string(&tokenizer->added, id, &size)))
        found = vocab_token(model_vocab(tokenizer->model), id, &size);
    if (!found) {
        char message[64];
        snprintf(message, sizeof message, "no token has the id %u", (unsigned)id);
        return failed(UFORM_INVALID_ARGUMENT, entry, message);
    }
    *string = found;
    *length = size;
    return UFORM_OK;
}

UFORM_EXPORT uform_status_t uform_tokenizer_info(uform_tokenizer_t const *tokenizer,
                                                 uform_tokenizer_info_t *info) {
    if (!tokenizer || !info)
        return failed(UFORM_INVALID_ARGUMENT, "uform_tokenizer_info", "tokenizer or info is NULL");
    if (tokenizer->spiece) {
        spiece_info(tokenizer->spiece, info);
        return UFORM_OK;
    }
    *info = (uform_tokenizer_info_t){
        .vocabulary = tokenizer->added.next_id,
        .max_length = tokenizer->truncation.on ? tokenizer->truncation.max_length : 0,
        .special_added = tokenizer->special_added,
    };
    memcpy(info->model, tokenizer->model_name, sizeof info->model);
    return UFORM_OK;
}
