/* libFuzzer: arbitrary bytes cut by every tokenizer of a folder (UFORM_FUZZ_TOKENIZERS, its *.json
 * files; by default the seed tokenizers of tests/fuzz-corpus/tokenizer_json), as one text, with and
 * without the special tokens. Bytes that are not UTF-8 must fail with UFORM_FORMAT and nothing else;
 * every token's span must lie within the text. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(uint8_t const *data, size_t size);

#define TOKENIZERS_MAX 16
static uform_tokenizer_t *tokenizers[TOKENIZERS_MAX];
static size_t tokenizers_count;
static tokenizer_work_t work;
static tokens_t tokens;
static post_tokens_t out = {.tokens = &tokens};

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    char const *folder = getenv("UFORM_FUZZ_TOKENIZERS");
    if (!folder) folder = UFORM_SOURCE_ROOT "/tests/fuzz-corpus/tokenizer_json";
    DIR *directory = opendir(folder);
    if (!directory) {
        fprintf(stderr, "fuzz_tokenize: cannot open %s\n", folder);
        return 1;
    }
    for (struct dirent *entry; (entry = readdir(directory)) && tokenizers_count < TOKENIZERS_MAX;) {
        size_t length = strlen(entry->d_name);
        char path[4096];
        if (length < 5 || strcmp(entry->d_name + length - 5, ".json") != 0) continue;
        snprintf(path, sizeof path, "%s/%s", folder, entry->d_name);
        if (uform_tokenizer_open(path, &tokenizers[tokenizers_count]) == UFORM_OK) tokenizers_count++;
    }
    closedir(directory);
    fprintf(stderr, "fuzz_tokenize: %zu tokenizers from %s\n", tokenizers_count, folder);
    return tokenizers_count ? 0 : 1;
}

int LLVMFuzzerTestOneInput(uint8_t const *data, size_t size) {
    if (!tokenizers_count && LLVMFuzzerInitialize(NULL, NULL) != 0) __builtin_trap();
    for (size_t t = 0; t < tokenizers_count; ++t)
        for (int special = 0; special < 2; ++special) {
            bool truncated;
            char const *message;
            uform_status_t status =
                tokenizer_cut(tokenizers[t], data, size, special, false, &work, &out, &truncated, &message);
            if (status != UFORM_OK && status != UFORM_FORMAT) __builtin_trap();
            for (size_t i = 0; status == UFORM_OK && i < tokens.count; ++i)
                if (tokens.spans[i].begin > tokens.spans[i].end || tokens.spans[i].end > size)
                    __builtin_trap();
        }
    return 0;
}
