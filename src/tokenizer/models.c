/* Models: reading tokenizer.json's "model" as tokenizers' ModelWrapper does, and cutting a piece.
 *
 * ModelWrapper is an untagged enum: tokenizers tries BPE, WordPiece, WordLevel and Unigram in that order
 * and keeps the first that reads (each refuses a "type" other than its own), so a "type" names the model,
 * and an object without one is the first model whose fields it has.
 *
 * To cut a piece, its code points are written once as UTF-8 with the maps between bytes and code points
 * (`model_text_t`), and the model works on those bytes as tokenizers' does on a &str. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models.h"

typedef struct model_reader {
    char const *type;
    uform_status_t (*parse)(json_t const *object, model_t *model, tokenizer_fault_t *fault);
} model_reader_t;

/* In the order tokenizers tries them (WordPiece before WordLevel, whose fields are a subset). */
static model_reader_t const readers[] = {
    {"BPE", bpe_parse},
    {"WordPiece", wordpiece_parse},
    {"WordLevel", wordlevel_parse},
    {"Unigram", unigram_parse},
};

static atomic_uint_fast64_t model_serials = 1;

/* ---- reading ------------------------------------------------------------------------------------- */

void model_free(model_t *model) {
    if (!model) return;
    switch (model->kind) {
    case MODEL_BPE:
        bpe_free(model->bpe);
        break;
    case MODEL_WORDPIECE:
        wordpiece_free(model->wordpiece);
        break;
    case MODEL_WORDLEVEL:
        wordlevel_free(model->wordlevel);
        break;
    case MODEL_UNIGRAM:
        unigram_free(model->unigram);
        break;
    }
    vocab_free(&model->vocab);
    free(model);
}

/* One reader over a fresh model; the model is freed when it fails. */
static uform_status_t model_read(model_reader_t const *reader, json_t const *object, model_t **out,
                                 tokenizer_fault_t *fault) {
    model_t *model = calloc(1, sizeof *model);
    if (!model) return tokenizer_fail(fault, UFORM_OUT_OF_MEMORY, "model: out of memory");
    uform_status_t status = reader->parse(object, model, fault);
    if (status != UFORM_OK) {
        model_free(model);
        return status;
    }
    model->serial = atomic_fetch_add(&model_serials, 1);
    *out = model;
    return UFORM_OK;
}

/* No "type": the first model whose fields the object has. A model that reads but is refused for what it
 * asks (BPE's dropout) or for memory ends the search, as tokenizers would have kept it. */
static uform_status_t model_guess(json_t const *object, model_t **model, tokenizer_fault_t *fault) {
    for (size_t i = 0; i < sizeof readers / sizeof *readers; ++i) {
        uform_status_t status = model_read(&readers[i], object, model, fault);
        if (status != UFORM_FORMAT) return status;
    }
    return tokenizer_fail(fault, UFORM_FORMAT, "model: no \"type\", and the fields fit no model");
}

uform_status_t model_parse(json_t const *object, model_t **model, tokenizer_fault_t *fault) {
    *model = NULL;
    if (!json_is_object(object)) return tokenizer_fail(fault, UFORM_FORMAT, "model is not an object");
    json_t const *type = json_object_get(object, "type");
    if (!type) return model_guess(object, model, fault);
    if (!json_is_string(type)) return tokenizer_fail(fault, UFORM_FORMAT, "model: \"type\" is not a string");
    for (size_t i = 0; i < sizeof readers / sizeof *readers; ++i)
        if (strcmp(json_string_value(type), readers[i].type) == 0)
            return model_read(&readers[i], object, model, fault);
    return tokenizer_fail(fault, UFORM_UNSUPPORTED, "model: unsupported type \"%.60s\"",
                          json_string_value(type));
}

vocab_t const *model_vocab(model_t const *model) {
    return &model->vocab;
}

/* ---- cutting ------------------------------------------------------------------------------------- */

void model_work_free(tokenizer_work_t *work) {
    model_work_t *scratch = work->model;
    if (!scratch) return;
    free(scratch->char_at);
    free(scratch->offsets);
    free(scratch->word);
    free(scratch->symbols);
    free(scratch->queue);
    free(scratch->key);
    word_cache_free(&scratch->cache);
    free(scratch);
    work->model = NULL;
}

/* The work's scratch, made on first use; its cache emptied when it held another model's words. */
static model_work_t *model_scratch(tokenizer_work_t *work, model_t const *model) {
    model_work_t *scratch = work->model;
    if (!scratch) {
        if (!(scratch = calloc(1, sizeof *scratch))) return NULL;
        work->model = scratch;
    }
    if (scratch->serial != model->serial) {
        word_cache_clear(&scratch->cache);
        scratch->serial = model->serial;
    }
    scratch->fault[0] = '\0';
    scratch->word_count = 0;
    return scratch;
}

/* Writes piece `index` as UTF-8 into the work's bytes, with the maps between bytes and code points. */
static uform_status_t model_text_make(model_text_t *text, pieces_t const *in, size_t index,
                                      tokenizer_work_t *work, model_work_t *scratch) {
    uint32_t length = pieces_size(in, index);
    uint32_t const *chars = pieces_chars(in, index);
    size_t most = (size_t)length * 4;
    if (most >= UINT32_MAX)
        return model_refuse(scratch, "model: a piece of %u code points is too long", length);
    uint8_t *bytes = work_bytes(work, most);
    uint32_t *offsets = model_reserve((void **)&scratch->offsets, &scratch->offsets_capacity,
                                      ((size_t)length + 1) * sizeof *offsets);
    uint32_t *char_at =
        model_reserve((void **)&scratch->char_at, &scratch->char_at_capacity, most * sizeof *char_at);
    if (!bytes || !offsets || !char_at) return UFORM_OUT_OF_MEMORY;
    uint32_t size = 0;
    for (uint32_t i = 0; i < length; ++i) {
        offsets[i] = size;
        uint32_t written = (uint32_t)utf8_put(bytes + size, chars[i]);
        for (uint32_t b = 0; b < written; ++b)
            char_at[size + b] = i;
        size += written;
    }
    offsets[length] = size;
    *text = (model_text_t){
        .bytes = bytes,
        .size = size,
        .length = length,
        .char_at = char_at,
        .offsets = offsets,
        .spans = pieces_spans(in, index),
        .shift = in->shifts[index],
    };
    return UFORM_OK;
}

uform_status_t model_tokenize(model_t const *model, pieces_t const *in, size_t index, tokens_t *out,
                              tokenizer_work_t *work) {
    if (pieces_size(in, index) == 0) return UFORM_OK; /* tokenizers cuts no empty split */
    model_work_t *scratch = model_scratch(work, model);
    if (!scratch) return UFORM_OUT_OF_MEMORY;
    model_text_t text;
    uform_status_t status = model_text_make(&text, in, index, work, scratch);
    if (status != UFORM_OK) return status;
    switch (model->kind) {
    case MODEL_BPE:
        return bpe_tokenize(model, &text, out, scratch);
    case MODEL_WORDPIECE:
        return wordpiece_tokenize(model, &text, out, scratch);
    case MODEL_WORDLEVEL:
        return wordlevel_tokenize(model, &text, out, scratch);
    case MODEL_UNIGRAM:
        return unigram_tokenize(model, &text, out, scratch);
    }
    return UFORM_INVALID_ARGUMENT;
}
