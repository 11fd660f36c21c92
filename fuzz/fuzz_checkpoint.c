/* libFuzzer: the checkpoint reader's validation (checkpoint_prefix, then checkpoint_parse of the JSON
 * header) on arbitrary bytes, taken twice: as a whole file, and as the first bytes of a much larger one
 * (as the loader sees them before it reads any tensor), so that offsets are checked both ways. */
#include <stdint.h>

#include "checkpoint.h"

int LLVMFuzzerTestOneInput(uint8_t const *data, size_t size);

static void parse(uint8_t const *data, size_t size, uint64_t file_size) {
    uint64_t length = 0;
    char const *message = NULL;
    if (checkpoint_prefix(data, size, file_size, &length, &message) != UFORM_OK) return;
    if (length > size - 8) return; /* the header lies past these bytes */
    checkpoint_header_t header;
    if (checkpoint_parse((char const *)data + 8, (size_t)length, file_size, &header, &message) != UFORM_OK)
        return;
    for (size_t i = 0; i < header.tensors_count; ++i)
        if (checkpoint_find(&header, header.tensors[i].name) != &header.tensors[i]) __builtin_trap();
    checkpoint_header_free(&header);
}

int LLVMFuzzerTestOneInput(uint8_t const *data, size_t size) {
    parse(data, size, size);
    parse(data, size, (uint64_t)size + ((uint64_t)1 << 32));
    return 0;
}
