/* A pretrained model's folder packed into bytes, as the folder reader's fuzz target reads its inputs and
 * tests/model/pretrained_seeds.py writes its seeds: a list of files, each `index` (1 byte, which of
 * PRETRAINED_PACK_FILES, modulo their count), `length` (2 bytes, little-endian) and its bytes, the last one
 * cut at the end of the input. Shared by fuzz_pretrained.c and tests/core/test_alloc_fail.c. */
#ifndef UFORM_FUZZ_PRETRAINED_PACK_H
#define UFORM_FUZZ_PRETRAINED_PACK_H

#include <stddef.h>
#include <stdint.h>

static char const *const PRETRAINED_PACK_FILES[] = {"config.json",
                                                    "modules.json",
                                                    "1_Pooling/config.json",
                                                    "sentence_bert_config.json",
                                                    "tokenizer.json",
                                                    "model.safetensors",
                                                    "text_encoder.safetensors",
                                                    "image_encoder.safetensors",
                                                    "preprocessor_config.json",
                                                    "model.safetensors.index.json",
                                                    "model-00001-of-00002.safetensors",
                                                    "model-00002-of-00002.safetensors",
                                                    "config_sentence_transformers.json",
                                                    "spiece.model",
                                                    "tokenizer_config.json",
                                                    "2_Dense/config.json",
                                                    "2_Dense/model.safetensors"};
#define PRETRAINED_PACK_FILE_COUNT (sizeof PRETRAINED_PACK_FILES / sizeof PRETRAINED_PACK_FILES[0])

/* Calls `each` for every file of the pack, in order: its index in PRETRAINED_PACK_FILES and its bytes. */
static inline void pretrained_pack_each(uint8_t const *data, size_t size,
                                        void (*each)(size_t index, uint8_t const *bytes, size_t length,
                                                     void *context),
                                        void *context) {
    size_t at = 0;
    while (at + 3 <= size) {
        size_t index = data[at] % PRETRAINED_PACK_FILE_COUNT;
        size_t length = (size_t)data[at + 1] | (size_t)data[at + 2] << 8;
        at += 3;
        if (length > size - at) length = size - at;
        each(index, data + at, length, context);
        at += length;
    }
}

#endif
