/* The SentencePiece tokenizers of a build without libsentencepiece (spiece.h): reading a model answers
 * UFORM_UNSUPPORTED, so that no tokenizer holds one and nothing else here is ever called. */
#include "spiece.h"

uform_status_t spiece_read(void const *model, size_t length, char const *config, spiece_t **out,
                           tokenizer_fault_t *fault) {
    (void)model;
    (void)length;
    (void)config;
    *out = NULL;
    return tokenizer_fail(fault, UFORM_UNSUPPORTED, "built without SentencePiece (libsentencepiece)");
}

void spiece_free(spiece_t *spiece) {
    (void)spiece;
}

uform_status_t spiece_cut(spiece_t const *spiece, uint8_t const *text, size_t length, bool add_special,
                          tokenizer_work_t *work, tokens_t *out, char const **message) {
    (void)spiece;
    (void)text;
    (void)length;
    (void)add_special;
    (void)work;
    (void)out;
    *message = "built without SentencePiece (libsentencepiece)";
    return UFORM_UNSUPPORTED;
}

void spiece_info(spiece_t const *spiece, uform_tokenizer_info_t *info) {
    (void)spiece;
    (void)info;
}

char const *spiece_token(spiece_t const *spiece, uint32_t id, size_t *length) {
    (void)spiece;
    (void)id;
    (void)length;
    return NULL;
}

void spiece_work_free(tokenizer_work_t *work) {
    (void)work;
}
