/* libFuzzer: a pretrained model's folder (src/model/pretrained.c) from arbitrary bytes. The input is a
 * list of files (pretrained_pack.h); they are written into a folder of this process, every file the input
 * does not give removed, and the folder is loaded through the public verb; a folder that loads then encodes a
 * few texts and an image, so that what the reader accepted is also safe to run. The seeds
 * (tests/fuzz-corpus/pretrained) are small folders of every family in this form, written by
 * tests/model/pretrained_seeds.py.
 * The hub ids' parser and refs reader (src/model/hub_cache.c) take the same input: its first line as an id,
 * and its first 48 bytes as refs/main of a cache (HF_HUB_CACHE) whose one snapshot is the folder; the folder
 * loads by the id "fuzz/model" where that ref names the snapshot. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pretrained_pack.h"
#include "uform.h"

int LLVMFuzzerTestOneInput(uint8_t const *data, size_t size);

static char folder[64], ref[160];

#define FUZZ_COMMIT "0123456789abcdef0123456789abcdef01234567"

static void make_folder(void) {
    if (folder[0]) return;
    snprintf(folder, sizeof folder, "/tmp/uform-fuzz-pretrained-XXXXXX");
    if (!mkdtemp(folder)) __builtin_trap();
    char path[160];
    snprintf(path, sizeof path, "%s/1_Pooling", folder);
    mkdir(path, 0700);
    snprintf(path, sizeof path, "%s/2_Dense", folder);
    mkdir(path, 0700);
    char const *const parts[] = {"-hub", "-hub/models--fuzz--model", "-hub/models--fuzz--model/refs",
                                 "-hub/models--fuzz--model/snapshots"};
    for (size_t i = 0; i < sizeof parts / sizeof *parts; ++i) {
        snprintf(path, sizeof path, "%s%s", folder, parts[i]);
        if (mkdir(path, 0700) != 0) __builtin_trap();
    }
    snprintf(path, sizeof path, "%s-hub/models--fuzz--model/snapshots/" FUZZ_COMMIT, folder);
    if (symlink(folder, path) != 0) __builtin_trap();
    snprintf(ref, sizeof ref, "%s-hub/models--fuzz--model/refs/main", folder);
    snprintf(path, sizeof path, "%s-hub", folder);
    setenv("HF_HUB_CACHE", path, 1);
}

/* The input's first line as a hub id, its first 48 bytes as refs/main; whether that ref names the folder. */
static bool hub_check(uint8_t const *data, size_t size) {
    FILE *file = fopen(ref, "wb");
    if (!file) __builtin_trap();
    size_t head = size < 48 ? size : 48;
    if (head && fwrite(data, 1, head, file) != head) __builtin_trap();
    fclose(file);
    char id[129], found[4096];
    size_t length = 0, line = 0;
    while (line < size && line < sizeof id - 1 && data[line] != '\n' && data[line] != '\0') {
        id[line] = (char)data[line];
        ++line;
    }
    id[line] = '\0';
    if (uform_hub_folder(id, found, sizeof found, &length) == UFORM_INTERNAL) __builtin_trap();
    if (length != strlen(found)) __builtin_trap();
    return uform_hub_folder("fuzz/model", found, sizeof found, &length) == UFORM_OK;
}

static void put(size_t index, uint8_t const *bytes, size_t length, void *context) {
    bool *given = context;
    char path[128];
    snprintf(path, sizeof path, "%s/%s", folder, PRETRAINED_PACK_FILES[index]);
    FILE *file = fopen(path, "wb");
    if (!file) __builtin_trap();
    if (length && fwrite(bytes, 1, length, file) != length) __builtin_trap();
    fclose(file);
    given[index] = true;
}

int LLVMFuzzerTestOneInput(uint8_t const *data, size_t size) {
    make_folder();
    bool given[PRETRAINED_PACK_FILE_COUNT] = {false};
    pretrained_pack_each(data, size, put, given);
    for (size_t i = 0; i < PRETRAINED_PACK_FILE_COUNT; ++i)
        if (!given[i]) {
            char path[128];
            snprintf(path, sizeof path, "%s/%s", folder, PRETRAINED_PACK_FILES[i]);
            unlink(path);
        }
    bool by_id = hub_check(data, size);
    uform_model_t *model = NULL;
    uform_model_load_args_t load = {.path = by_id ? "fuzz/model" : folder, .model = &model};
    uform_status_t status = uform_model_load_ram(&load);
    if (status == UFORM_INTERNAL) __builtin_trap();
    if (status != UFORM_OK) return 0;
    /* An image of 5 x 3 RGB pixels, then texts. */
    static uint8_t const pixels[5 * 3 * 3] = {0,   10,  20,  30,  40,  50,  60,  70,  80,
                                              90,  100, 110, 120, 130, 140, 150, 160, 170,
                                              180, 190, 200, 210, 220, 230, 240, 250, 255};
    uform_model_info_t info;
    uform_model_info(model, &info);
    if (info.has_image) {
        uform_arena_t *arena = NULL;
        if (uform_arena_create_host(&arena) == UFORM_OK) {
            uform_encoded_t encoded;
            size_t const offsets[] = {0, sizeof pixels}, heights[] = {3}, widths[] = {5};
            uform_image_encode_pixels_args_t args = {
                .model = model,
                .outputs = UFORM_OUTPUT_EMBEDDINGS | UFORM_OUTPUT_STATES,
                .arena = arena,
                .encoded = &encoded,
                .pixels = {.data = pixels, .offsets = offsets, .count = 1, .length = sizeof pixels},
                .heights = heights,
                .widths = widths};
            if (uform_image_encode_pixels(&args) == UFORM_INTERNAL) __builtin_trap();
            uform_arena_free(arena);
        }
    }
    if (!info.has_text) {
        uform_model_free(model);
        return 0;
    }
    static char const texts[] = "a cat sits on the mat\xff\xfe";
    size_t offsets[] = {0, 21, 21, 23};
    uform_arena_t *arena = NULL;
    if (uform_arena_create_host(&arena) == UFORM_OK) {
        uform_encoded_t encoded;
        uform_text_encode_args_t args = {
            .model = model,
            .outputs = UFORM_OUTPUT_EMBEDDINGS | UFORM_OUTPUT_STATES,
            .arena = arena,
            .encoded = &encoded,
            .texts = {.data = texts, .offsets = offsets, .count = 3, .length = 23}};
        if (uform_text_encode(&args) == UFORM_INTERNAL) __builtin_trap();
        uform_arena_free(arena);
    }
    uform_model_free(model);
    return 0;
}
