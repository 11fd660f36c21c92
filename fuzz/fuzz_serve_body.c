/* libFuzzer: a request body as `uform serve` parses it, on arbitrary bytes, for two served models: one
 * that reads bytes ("uform-tiny": width 256, matryoshka 64 and 128, a text context of 64 bytes, every
 * tower) and one that reads tokens ("tokens": width 64, a small WordPiece tokenizer). Each body goes
 * through both parsers:
 *   - POST /v1/embeddings (api_parse_embeddings: Jansson, then every field, the model, the inputs of every
 *     modality and their base64): a body it takes must hold what the batcher reads;
 *   - POST /tokenize (api_parse_tokenize, then api_answer_tokenize with no prompt: the texts cut and every
 *     token written as JSON, lossy UTF-8 included): a body it takes must be answered.
 * A body either refuses must carry an error answer of 400, 404, 413 (tokenize past --batch-bytes) or 500. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "uform_serve.h"

int LLVMFuzzerTestOneInput(uint8_t const *data, size_t size);

/* WordPiece over a few tokens, lowercased, "[CLS] $A [SEP]", [MASK] an added special token. */
static char const tokenizer_json[] =
    "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":["
    "{\"id\":0,\"content\":\"[UNK]\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
    "\"normalized\":false,\"special\":true},"
    "{\"id\":1,\"content\":\"[CLS]\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
    "\"normalized\":false,\"special\":true},"
    "{\"id\":2,\"content\":\"[SEP]\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
    "\"normalized\":false,\"special\":true},"
    "{\"id\":9,\"content\":\"[MASK]\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
    "\"normalized\":false,\"special\":true}],"
    "\"normalizer\":{\"type\":\"BertNormalizer\",\"clean_text\":true,\"handle_chinese_chars\":true,"
    "\"strip_accents\":null,\"lowercase\":true},\"pre_tokenizer\":{\"type\":\"BertPreTokenizer\"},"
    "\"post_processor\":{\"type\":\"BertProcessing\",\"sep\":[\"[SEP]\",2],\"cls\":[\"[CLS]\",1]},"
    "\"decoder\":null,\"model\":{\"type\":\"WordPiece\",\"unk_token\":\"[UNK]\","
    "\"continuing_subword_prefix\":\"##\",\"max_input_chars_per_word\":100,\"vocab\":{\"[UNK]\":0,"
    "\"[CLS]\":1,\"[SEP]\":2,\"a\":3,\"cat\":4,\"##s\":5,\"\\u00e9\":6,\".\":7,\"the\":8}}}";

static serve_t server = {
    .flags = {.batch_bytes = 262144},
    .models = {{.name = "uform-tiny",
                .info = {.dims = 256,
                         .matryoshka = {64, 128},
                         .matryoshka_count = 2,
                         .has_text = true,
                         .has_image = true,
                         .has_video = true,
                         .has_audio = true,
                         .text = {.context = 64}}},
               {.name = "tokens",
                .info = {.dims = 64, .has_text = true, .text = {.context = 16, .vocab = 10}}}},
    .models_count = 2,
};

/* The tokenizer and the arena, made on the first input. */
static bool prepare(void) {
    static uform_tokenizer_t *tokenizer;
    if (server.tokenize_arena) return true;
    if (uform_tokenizer_parse(tokenizer_json, sizeof tokenizer_json - 1, &tokenizer) != UFORM_OK ||
        uform_arena_create_host(&server.tokenize_arena) != UFORM_OK)
        __builtin_trap();
    server.models[1].tokenizer = tokenizer;
    return true;
}

static serve_request_t request_of(uint8_t const *data, size_t size, serve_route_t route) {
    serve_request_t request = {.server = &server, .route = route};
    request.body = malloc(size ? size : 1);
    if (!request.body) __builtin_trap();
    memcpy(request.body, data, size);
    request.body_length = size;
    return request;
}

static void request_release(serve_request_t *request) {
    if (request->response) MHD_destroy_response(request->response);
    free(request->vectors);
    free(request->inputs);
    json_decref(request->json);
}

/* A refusal: an error answer of 400, 404 or 500, or for /tokenize 413 too. */
static void refused(serve_request_t const *request, bool tokenize) {
    unsigned status = request->status;
    if (!request->response ||
        (status != 400 && status != 404 && status != 500 && !(tokenize && status == 413)))
        __builtin_trap();
}

static void embeddings(uint8_t const *data, size_t size) {
    serve_request_t request = request_of(data, size, ROUTE_EMBEDDINGS);
    if (api_parse_embeddings(&server, &request)) {
        if (request.count == 0 || request.count > SERVE_MAX_ITEMS || !request.inputs || !request.vectors ||
            request.response || !request.model)
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
    } else {
        refused(&request, false);
    }
    request_release(&request);
}

static void tokenize(uint8_t const *data, size_t size) {
    serve_request_t request = request_of(data, size, ROUTE_TOKENIZE);
    serve_tokenize_t options;
    if (api_parse_tokenize(&server, &request, &options)) {
        if (request.count == 0 || request.count > SERVE_MAX_ITEMS || !request.inputs || request.response ||
            request.model != &server.models[1])
            __builtin_trap();
        api_answer_tokenize(&server, &request, &options, "");
        if (!request.response) __builtin_trap();
        if (request.status != 200) refused(&request, true);
    } else {
        refused(&request, true);
    }
    request_release(&request);
}

int LLVMFuzzerTestOneInput(uint8_t const *data, size_t size) {
    prepare();
    embeddings(data, size);
    tokenize(data, size);
    return 0;
}
