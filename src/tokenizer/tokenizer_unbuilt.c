/* The tokenizer entry points of a build without utf8proc and Oniguruma: each checks its arguments,
 * then answers UFORM_UNSUPPORTED. */
#include "common.h"

static char const unbuilt[] = "built without tokenizers (utf8proc and Oniguruma)";

UFORM_EXPORT uform_status_t uform_tokenizer_open(char const *path, uform_tokenizer_t **tokenizer) {
    if (!path || !tokenizer)
        return failed(UFORM_INVALID_ARGUMENT, "uform_tokenizer_open", "path or tokenizer is NULL");
    *tokenizer = NULL;
    return failed(UFORM_UNSUPPORTED, "uform_tokenizer_open", unbuilt);
}

UFORM_EXPORT uform_status_t uform_tokenizer_parse(void const *json, size_t length,
                                                  uform_tokenizer_t **tokenizer) {
    if (!tokenizer || (!json && length))
        return failed(UFORM_INVALID_ARGUMENT, "uform_tokenizer_parse", "json or tokenizer is NULL");
    *tokenizer = NULL;
    return failed(UFORM_UNSUPPORTED, "uform_tokenizer_parse", unbuilt);
}

UFORM_EXPORT void uform_tokenizer_free(uform_tokenizer_t *tokenizer) {
    (void)tokenizer;
}

UFORM_EXPORT uform_status_t uform_tokenizer_info(uform_tokenizer_t const *tokenizer,
                                                 uform_tokenizer_info_t *info) {
    (void)tokenizer;
    (void)info;
    return failed(UFORM_UNSUPPORTED, "uform_tokenizer_info", unbuilt);
}

UFORM_EXPORT uform_status_t uform_tokenizer_token(uform_tokenizer_t const *tokenizer, uint32_t id,
                                                  char const **string, size_t *length) {
    (void)tokenizer;
    (void)id;
    if (string) *string = NULL;
    if (length) *length = 0;
    return failed(UFORM_UNSUPPORTED, "uform_tokenizer_token", unbuilt);
}
