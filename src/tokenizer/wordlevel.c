/* WordLevel (tokenizers' models/wordlevel): the whole word is one token, its own or the unk token. */
#include <stdlib.h>

#include "models.h"

struct wordlevel {
    int64_t unk_id; /* -1: `unk_token` is not in the vocabulary (an error only when a word needs it) */
    char *unk_token;
};

void wordlevel_free(wordlevel_t *wordlevel) {
    if (!wordlevel) return;
    free(wordlevel->unk_token);
    free(wordlevel);
}

/* "vocab" and "unk_token" are required, as tokenizers' WordLevelVisitor requires them. */
uform_status_t wordlevel_parse(json_t const *object, model_t *model, tokenizer_fault_t *fault) {
    static char const what[] = "WordLevel";
    model->kind = MODEL_WORDLEVEL;
    char const *unk;
    size_t unk_length;
    uform_status_t status = model_required_string(object, "unk_token", &unk, &unk_length, what, fault);
    if (status == UFORM_OK) status = model_vocab_object(object, &model->vocab, what, fault);
    if (status != UFORM_OK) return status;
    wordlevel_t *wordlevel = model->wordlevel = calloc(1, sizeof *wordlevel);
    if (!wordlevel || !(wordlevel->unk_token = model_copy_string(unk, unk_length)))
        return tokenizer_fail(fault, UFORM_OUT_OF_MEMORY, "%s: out of memory", what);
    wordlevel->unk_id = vocab_find(&model->vocab, unk, unk_length);
    return UFORM_OK;
}

uform_status_t wordlevel_tokenize(model_t const *model, model_text_t const *text, tokens_t *out,
                                  model_work_t *scratch) {
    wordlevel_t const *wordlevel = model->wordlevel;
    int64_t id = vocab_find(&model->vocab, (char const *)text->bytes, text->size);
    if (id < 0) id = wordlevel->unk_id;
    if (id < 0)
        return model_refuse(scratch, "WordLevel: the unk token \"%.40s\" is missing from the vocabulary",
                            wordlevel->unk_token);
    return model_emit(text, out, (uint32_t)id, 0, text->size);
}
