/* libFuzzer: tokenizer.json parsing (uform_tokenizer_parse) on arbitrary bytes; a file that parses is then
 * used, to cut a few texts, so that what a parser accepted is also safe to apply. */
#include <stdint.h>
#include <string.h>

#include "tokenizer.h"

int LLVMFuzzerTestOneInput(uint8_t const *data, size_t size);

static char const *const texts[] = {
    "",
    "Hello, world! It's 3.14",
    "  naïve café — [MASK] <mask> <s> 日本語 🐈‍⬛ e\xcc\x81",
    "a\tb\nc\x00d",
};

int LLVMFuzzerTestOneInput(uint8_t const *data, size_t size) {
    uform_tokenizer_t *tokenizer = NULL;
    if (uform_tokenizer_parse(data, size, &tokenizer) != UFORM_OK) return 0;
    tokenizer_work_t work = {0};
    tokens_t tokens = {0};
    post_tokens_t out = {.tokens = &tokens};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; ++i) {
        bool truncated;
        char const *message;
        size_t length = i == 3 ? 7 : strlen(texts[i]);
        if (tokenizer_cut(tokenizer, (uint8_t const *)texts[i], length, true, false, &work, &out, &truncated,
                          &message) == UFORM_INTERNAL)
            __builtin_trap();
    }
    free(out.blanks);
    tokens_free(&tokens);
    tokenizer_work_free(&work);
    uform_tokenizer_free(tokenizer);
    return 0;
}
