/* libFuzzer: the body of POST /v1/embeddings as `uform serve` parses it (api_parse_embeddings: Jansson,
 * then every field, the inputs of every modality and their base64) on arbitrary bytes, for a served
 * model of width 256 (matryoshka 64 and 128), a text context of 64 bytes and every tower. A body it takes
 * must hold what the batcher reads; one it refuses must carry an error answer. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "uform_serve.h"

int LLVMFuzzerTestOneInput(uint8_t const *data, size_t size);

static serve_t server = {
    .name = "uform-tiny",
    .info = {.dims = 256,
             .matryoshka = {64, 128},
             .matryoshka_count = 2,
             .has_text = true,
             .has_image = true,
             .has_video = true,
             .has_audio = true,
             .text = {.context = 64}},
};

int LLVMFuzzerTestOneInput(uint8_t const *data, size_t size) {
    serve_request_t request = {.server = &server, .route = ROUTE_EMBEDDINGS};
    request.body = malloc(size ? size : 1);
    if (!request.body) return 0;
    memcpy(request.body, data, size);
    request.body_length = size;
    if (api_parse_embeddings(&server, &request)) {
        if (request.count == 0 || request.count > SERVE_MAX_ITEMS || !request.inputs || !request.vectors ||
            request.response)
            __builtin_trap();
        for (size_t i = 0; i < request.count; ++i) {
            serve_input_t const *input = &request.inputs[i];
            if (!input->bytes || input->length == 0 || input->budget == 0 || input->budget > input->taped)
                __builtin_trap();
            unsigned char sum = 0; /* every byte the batcher will read, under AddressSanitizer */
            for (size_t b = 0; b < input->length; ++b)
                sum ^= (unsigned char)input->bytes[b];
            (void)sum;
        }
        memset(request.vectors, 0, request.count * request.width * sizeof *request.vectors);
    } else if (request.status != 400 && request.status != 404 && request.status != 500) {
        __builtin_trap();
    }
    if (request.response) MHD_destroy_response(request.response);
    free(request.vectors);
    free(request.inputs);
    json_decref(request.json);
    return 0;
}
