/* WordPiece (tokenizers' models/wordpiece): greedy longest-match-first. From each start, the longest
 * byte range [start, end) of the word (ends on code point boundaries, tried from the word's end down)
 * whose string, behind `continuing_subword_prefix` past the word's first token, is in the vocabulary; a
 * word with a start no token fits, or of more than `max_input_chars_per_word` code points, is one unk
 * token over the whole word.
 *
 * tokenizers tries every end; a range longer than the vocabulary's longest token cannot match, so the
 * search begins at the longest range that could, which finds the same token. */
#include <stdlib.h>
#include <string.h>

#include "models.h"

struct wordpiece {
    int64_t unk_id; /* -1: `unk_token` is not in the vocabulary (an error only when a word needs it) */
    char *unk_token;
    char *prefix;
    size_t prefix_length;
    size_t max_chars;
    size_t longest; /* the vocabulary's longest token, in bytes */
};

void wordpiece_free(wordpiece_t *wordpiece) {
    if (!wordpiece) return;
    free(wordpiece->unk_token);
    free(wordpiece->prefix);
    free(wordpiece);
}

/* Every field is required, as tokenizers' WordPieceVisitor requires them ("type" aside). */
uform_status_t wordpiece_parse(json_t const *object, model_t *model, tokenizer_fault_t *fault) {
    static char const what[] = "WordPiece";
    model->kind = MODEL_WORDPIECE;
    char const *unk, *prefix;
    size_t unk_length, prefix_length, max_chars;
    uform_status_t status = model_required_string(object, "unk_token", &unk, &unk_length, what, fault);
    if (status == UFORM_OK)
        status =
            model_required_string(object, "continuing_subword_prefix", &prefix, &prefix_length, what, fault);
    if (status != UFORM_OK) return status;
    json_t const *max = json_object_get(object, "max_input_chars_per_word");
    if (!max || json_is_null(max))
        return tokenizer_fail(fault, UFORM_FORMAT, "%s: \"max_input_chars_per_word\" is missing", what);
    if ((status = json_get_size(object, "max_input_chars_per_word", 0, &max_chars, what, fault)) != UFORM_OK)
        return status;
    if ((status = model_vocab_object(object, &model->vocab, what, fault)) != UFORM_OK) return status;
    wordpiece_t *wordpiece = model->wordpiece = calloc(1, sizeof *wordpiece);
    if (!wordpiece) return tokenizer_fail(fault, UFORM_OUT_OF_MEMORY, "%s: out of memory", what);
    wordpiece->unk_token = model_copy_string(unk, unk_length);
    wordpiece->prefix = model_copy_string(prefix, prefix_length);
    if (!wordpiece->unk_token || !wordpiece->prefix)
        return tokenizer_fail(fault, UFORM_OUT_OF_MEMORY, "%s: out of memory", what);
    wordpiece->prefix_length = prefix_length;
    wordpiece->max_chars = max_chars;
    wordpiece->unk_id = vocab_find(&model->vocab, unk, unk_length);
    for (uint32_t id = 0; id < model->vocab.count; ++id) {
        size_t length = model->vocab.offsets[id + 1] - model->vocab.offsets[id];
        if (length > wordpiece->longest) wordpiece->longest = length;
    }
    return UFORM_OK;
}

/* The whole word as one unk token. */
static uform_status_t wordpiece_unknown(wordpiece_t const *wordpiece, model_text_t const *text, tokens_t *out,
                                        model_work_t *scratch) {
    if (wordpiece->unk_id < 0)
        return model_refuse(scratch, "WordPiece: the unk token \"%.40s\" is missing from the vocabulary",
                            wordpiece->unk_token);
    return model_emit(text, out, (uint32_t)wordpiece->unk_id, 0, text->size);
}

/* The longest end for a token from `start` whose string (with `extra` bytes of prefix) could be in the
 * vocabulary: the word's end, or the last code point boundary that keeps it within the longest token;
 * `start` itself when none could. Candidates are the ranges [start, end) up to it. */
static uint32_t wordpiece_first_end(wordpiece_t const *wordpiece, model_text_t const *text, uint32_t start,
                                    size_t extra) {
    if (wordpiece->longest < extra) return start;
    size_t most = wordpiece->longest - extra;
    if (text->size - start <= most) return text->size;
    uint32_t cap = start + (uint32_t)most;
    return text->offsets[text->char_at[cap]];
}

uform_status_t wordpiece_tokenize(model_t const *model, model_text_t const *text, tokens_t *out,
                                  model_work_t *scratch) {
    wordpiece_t const *wordpiece = model->wordpiece;
    if (text->length > wordpiece->max_chars) return wordpiece_unknown(wordpiece, text, out, scratch);
    /* The key: the prefix, then the word from `start` on; a candidate is its first bytes. */
    uint8_t *key =
        model_reserve((void **)&scratch->key, &scratch->key_capacity, wordpiece->prefix_length + text->size);
    if (!key) return UFORM_OUT_OF_MEMORY;
    memcpy(key, wordpiece->prefix, wordpiece->prefix_length);
    size_t kept = out->count;
    for (uint32_t start = 0; start < text->size;) {
        size_t extra = start > 0 ? wordpiece->prefix_length : 0;
        uint8_t const *candidate = start > 0 ? key : text->bytes;
        int64_t id = -1;
        uint32_t end = wordpiece_first_end(wordpiece, text, start, extra);
        if (start > 0) memcpy(key + extra, text->bytes + start, end - start);
        for (; end > start; end = text->offsets[text->char_at[end - 1]])
            if ((id = vocab_find(&model->vocab, (char const *)candidate, extra + end - start)) >= 0) break;
        if (id < 0) {
            out->count = kept; /* the tokens found so far give way to one unk */
            return wordpiece_unknown(wordpiece, text, out, scratch);
        }
        uform_status_t status = model_emit(text, out, (uint32_t)id, start, end);
        if (status != UFORM_OK) return status;
        start = end;
    }
    return UFORM_OK;
}
