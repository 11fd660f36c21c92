/* POST /tokenize of `uform serve`, as Hugging Face's text-embeddings-inference answers it: the body
 * {"inputs": "text" | ["text", ...], "add_special_tokens": true, "prompt_name": null, "model": ...}, the
 * answer one list per input of its tokens, {"id", "text", "special", "start", "stop"}. The texts are cut
 * whole (no truncation, as TEI's tokenize route), each after the prompt it takes, by the model's own
 * tokenizer on the calling (loop) thread into the server's tokenize arena; so that other clients wait
 * little, a request cuts at most --batch-bytes bytes, prompts included (413 inputs_too_large past them):
 *
 *   body -> api_parse_tokenize (model, inputs, options) -> the prompt (uform_model_prompt)
 *        -> api_answer_tokenize: uform_text_tokenize -> per token, a special one's string
 *           (uform_tokenizer_token) with null offsets, or the bytes [start, stop) of the prompted input
 *           it covers, made valid UTF-8 as Rust's from_utf8_lossy makes it (U+FFFD per maximal invalid
 *           subpart). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "uform_serve.h"

#define INVALID(request, param, code, ...)                                                                   \
    api_error(request, MHD_HTTP_BAD_REQUEST, "invalid_request_error", param, code, __VA_ARGS__)

/* ---- the body ---------------------------------------------------------------------------------- */

/* One text of "inputs": a string that is not empty. */
static bool parse_input(serve_request_t *request, json_t *item, size_t index) {
    if (!json_is_string(item)) {
        INVALID(request, "inputs", "invalid_type", "inputs[%zu] must be a string", index);
        return false;
    }
    if (json_string_length(item) == 0) {
        INVALID(request, "inputs", "invalid_value", "inputs[%zu] is empty", index);
        return false;
    }
    request->inputs[index] = (serve_input_t){.modality = UFORM_MODALITY_TEXT,
                                             .bytes = json_string_value(item),
                                             .length = json_string_length(item)};
    return true;
}

static bool parse_inputs(serve_request_t *request, json_t *inputs) {
    if (!inputs || json_is_null(inputs)) {
        INVALID(request, "inputs", "missing_required_parameter",
                "inputs is required: a string or a list of strings");
        return false;
    }
    if (json_is_string(inputs)) {
        request->count = 1;
    } else if (json_is_array(inputs)) {
        request->count = json_array_size(inputs);
        if (request->count == 0) {
            INVALID(request, "inputs", "invalid_value", "inputs is an empty list");
            return false;
        }
        if (request->count > SERVE_MAX_ITEMS) {
            INVALID(request, "inputs", "invalid_value", "inputs has %zu items; at most %d are taken at once",
                    request->count, SERVE_MAX_ITEMS);
            return false;
        }
    } else {
        INVALID(request, "inputs", "invalid_type", "inputs must be a string or a list of strings");
        return false;
    }
    request->inputs = calloc(request->count, sizeof *request->inputs);
    if (!request->inputs) {
        api_error(request, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", NULL, NULL, "out of memory");
        return false;
    }
    if (json_is_string(inputs)) return parse_input(request, inputs, 0);
    for (size_t i = 0; i < request->count; ++i)
        if (!parse_input(request, json_array_get(inputs, i), i)) return false;
    return true;
}

bool api_parse_tokenize(serve_t *server, serve_request_t *request, serve_tokenize_t *options) {
    *options = (serve_tokenize_t){.add_special_tokens = true};
    json_t *root = api_parse_body(server, request);
    if (!root) return false;
    json_t *special = json_object_get(root, "add_special_tokens");
    if (special && !json_is_null(special)) {
        if (!json_is_boolean(special)) {
            INVALID(request, "add_special_tokens", "invalid_type",
                    "add_special_tokens must be true or false");
            return false;
        }
        options->add_special_tokens = json_is_true(special);
    }
    json_t *prompt = json_object_get(root, "prompt_name");
    if (prompt && !json_is_null(prompt)) {
        if (!json_is_string(prompt) || strlen(json_string_value(prompt)) != json_string_length(prompt)) {
            INVALID(request, "prompt_name", "invalid_type", "prompt_name must be a string without NUL");
            return false;
        }
        options->prompt_name = json_string_value(prompt);
    }
    if (!parse_inputs(request, json_object_get(root, "inputs"))) return false;
    if (!request->model->tokenizer) {
        api_error(request, MHD_HTTP_BAD_REQUEST, "invalid_request_error", "model", "tokenizer_unavailable",
                  "the model '%s' reads the bytes of texts and has no tokenizer: /tokenize cuts for models "
                  "that read tokens (GET /v1/models says which: \"tokenizer\": true)",
                  request->model->name);
        return false;
    }
    return true;
}

/* ---- the answer -------------------------------------------------------------------------------- */

/* The length of the well-formed UTF-8 sequence at `bytes` (of `length`), or 0 with `*skip` the bytes of
 * its maximal invalid subpart (at least 1): what one U+FFFD replaces, as Unicode's "substitution of
 * maximal subparts" and Rust's from_utf8_lossy count. */
static size_t utf8_sequence(unsigned char const *bytes, size_t length, size_t *skip) {
    unsigned char lead = bytes[0];
    size_t need = lead < 0x80                    ? 1
                  : lead >= 0xC2 && lead <= 0xDF ? 2
                  : lead >= 0xE0 && lead <= 0xEF ? 3
                  : lead >= 0xF0 && lead <= 0xF4 ? 4
                                                 : 0;
    *skip = 1;
    if (need <= 1) return need;
    /* The second byte's range narrows after E0, ED, F0 and F4 (no overlong forms, surrogates, or past
     * U+10FFFF); every later one is 80..BF. */
    unsigned char low = lead == 0xE0 ? 0xA0 : lead == 0xF0 ? 0x90 : 0x80;
    unsigned char high = lead == 0xED ? 0x9F : lead == 0xF4 ? 0x8F : 0xBF;
    for (size_t i = 1; i < need; ++i) {
        if (i >= length || bytes[i] < low || bytes[i] > high) {
            *skip = i;
            return 0;
        }
        low = 0x80;
        high = 0xBF;
    }
    return need;
}

/* `length` bytes as a JSON string: escaped, and made valid UTF-8 (lossy). */
static void text_json_lossy(serve_text_t *text, char const *bytes, size_t length) {
    unsigned char const *at = (unsigned char const *)bytes, *end = at + length;
    text_puts(text, "\"");
    while (at < end) {
        size_t skip = 1, size = utf8_sequence(at, (size_t)(end - at), &skip);
        if (size == 0) {
            text_puts(text, "\xEF\xBF\xBD"); /* U+FFFD */
            at += skip;
        } else if (*at == '"' || *at == '\\') {
            text_printf(text, "\\%c", *at++);
        } else if (*at < 0x20) {
            text_printf(text, "\\u%04x", *at++);
        } else {
            text_append(text, (char const *)at, size);
            at += size;
        }
    }
    text_puts(text, "\"");
}

/* The bytes of every input after the prompt. */
static size_t prompted_bytes(serve_request_t const *request, char const *prompt) {
    size_t total = 0;
    for (size_t i = 0; i < request->count; ++i)
        total += strlen(prompt) + request->inputs[i].length;
    return total;
}

/* Tape of every input after the prompt: `count` texts into `*bytes` and `*offsets` (malloc'ed). */
static bool tape_prompted(serve_request_t const *request, char const *prompt, char **bytes,
                          size_t **offsets) {
    size_t prompted = strlen(prompt), total = prompted_bytes(request, prompt);
    *bytes = malloc(total ? total : 1);
    *offsets = malloc((request->count + 1) * sizeof **offsets);
    if (!*bytes || !*offsets) return false;
    size_t at = 0;
    (*offsets)[0] = 0;
    for (size_t i = 0; i < request->count; ++i) {
        memcpy(*bytes + at, prompt, prompted);
        memcpy(*bytes + at + prompted, request->inputs[i].bytes, request->inputs[i].length);
        at += prompted + request->inputs[i].length;
        (*offsets)[i + 1] = at;
    }
    return true;
}

/* One token: {"id", "text", "special", "start", "stop"}. */
static void text_token(serve_text_t *text, uform_tokenizer_t const *tokenizer, uint32_t id, bool special,
                       char const *input, uint32_t start, uint32_t stop) {
    text_printf(text, "{\"id\":%u,\"text\":", (unsigned)id);
    if (special) {
        char const *string = NULL;
        size_t length = 0;
        if (uform_tokenizer_token(tokenizer, id, &string, &length) != UFORM_OK) length = 0;
        text_json_lossy(text, string, length);
        text_puts(text, ",\"special\":true,\"start\":null,\"stop\":null}");
        return;
    }
    text_json_lossy(text, input + start, stop > start ? stop - start : 0);
    text_printf(text, ",\"special\":false,\"start\":%u,\"stop\":%u}", (unsigned)start, (unsigned)stop);
}

void api_answer_tokenize(serve_t *server, serve_request_t *request, serve_tokenize_t const *options,
                         char const *prompt) {
    char *bytes = NULL;
    size_t *offsets = NULL;
    serve_text_t text = {0};
    uform_tokenizer_t const *tokenizer = request->model->tokenizer;
    size_t total = prompted_bytes(request, prompt);
    if (total > server->flags.batch_bytes) {
        /* The cut runs on the loop thread: a bound on it is a bound on how long other clients wait. */
        api_error(request, MHD_HTTP_CONTENT_TOO_LARGE, "invalid_request_error", "inputs", "inputs_too_large",
                  "the inputs are %zu bytes with their prompts; /tokenize cuts at most %zu at once "
                  "(--batch-bytes): send fewer or shorter texts",
                  total, server->flags.batch_bytes);
        return;
    }
    if (!tape_prompted(request, prompt, &bytes, &offsets)) {
        api_error(request, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", NULL, NULL, "out of memory");
        goto done;
    }
    uform_tokenized_t tokenized;
    uform_tokenize_config_t config = {.without_special_tokens = !options->add_special_tokens,
                                      .without_truncation = true};
    uform_text_tokenize_args_t args = {.tokenizer = tokenizer,
                                       .texts = {.data = bytes,
                                                 .offsets = offsets,
                                                 .count = request->count,
                                                 .length = offsets[request->count]},
                                       .arena = server->tokenize_arena,
                                       .config = &config,
                                       .tokenized = &tokenized};
    if (uform_text_tokenize(&args) != UFORM_OK) {
        char rendered[256];
        uform_error_t error = uform_last_error();
        uform_error_render(&error, rendered, sizeof rendered);
        api_error(request, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", NULL, "engine_error", "%s",
                  rendered);
        goto done;
    }
    uint32_t const *ids = tokenized.ids.data, *spans = tokenized.spans.data;
    text_puts(&text, "[");
    for (size_t i = 0; i < request->count; ++i) {
        if (tokenized.statuses[i] != UFORM_OK) {
            text_free(&text);
            INVALID(request, "inputs", "invalid_value", "inputs[%zu] cannot be cut: %s", i,
                    uform_status_name(tokenized.statuses[i]));
            goto done;
        }
        text_puts(&text, i ? ",[" : "[");
        for (size_t t = tokenized.ids.item_offsets[i]; t < tokenized.ids.item_offsets[i + 1]; ++t) {
            if (t > tokenized.ids.item_offsets[i]) text_puts(&text, ",");
            text_token(&text, tokenizer, ids[t], tokenized.special[t], bytes + offsets[i], spans[2 * t],
                       spans[2 * t + 1]);
        }
        text_puts(&text, "]");
    }
    text_puts(&text, "]");
    api_answer_text(request, MHD_HTTP_OK, &text, "application/json");
done:
    text_free(&text);
    free(bytes);
    free(offsets);
}

void api_tokenize(serve_t *server, serve_request_t *request) {
    serve_tokenize_t options;
    if (!api_parse_tokenize(server, request, &options)) return;
    char prompt[4096];
    size_t length = 0;
    uform_status_t status =
        uform_model_prompt(request->model->model, options.prompt_name, prompt, sizeof prompt, &length);
    if (status != UFORM_OK && options.prompt_name) {
        INVALID(request, "prompt_name", "invalid_value", "the model '%s' has no prompt named '%s'",
                request->model->name, options.prompt_name);
        return;
    }
    if (status != UFORM_OK) {
        api_error(request, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", NULL, "engine_error",
                  "the model's default prompt cannot be read: %s", uform_status_name(status));
        return;
    }
    api_answer_tokenize(server, request, &options, prompt);
}

/* Whether `byte` starts no character Python's str.strip() keeps at an end: ASCII's blanks and the
 * separators U+001C to U+001F (str.isspace). Other Unicode blanks are kept here, which the engine's own
 * strip takes off: a text that ends in one counts their tokens too. */
static bool ascii_blank(unsigned char byte) {
    return byte == ' ' || (byte >= '\t' && byte <= '\r') || (byte >= 0x1C && byte <= 0x1F);
}

bool api_count_tokens(serve_t *server, serve_request_t *request, size_t *counts) {
    uform_model_t *model = request->model->model;
    char prompt[4096];
    size_t prompted = 0;
    if (uform_model_prompt(model, NULL, prompt, sizeof prompt, &prompted) != UFORM_OK) {
        api_error(request, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", NULL, "engine_error",
                  "the model's default prompt cannot be read");
        return false;
    }
    bool strip = request->model->info.text.strip;
    size_t total = 0;
    for (size_t i = 0; i < request->count; ++i)
        total += prompted + request->inputs[i].length;
    char *bytes = malloc(total ? total : 1);
    size_t *offsets = malloc((request->count + 1) * sizeof *offsets);
    bool ok = bytes && offsets;
    size_t at = 0;
    for (size_t i = 0; ok && i < request->count; ++i) {
        offsets[i] = at;
        serve_input_t const *input = &request->inputs[i];
        if (input->modality != UFORM_MODALITY_TEXT) continue;
        size_t begin = at;
        memcpy(bytes + at, prompt, prompted);
        memcpy(bytes + at + prompted, input->bytes, input->length);
        at += prompted + input->length;
        size_t first = begin;
        while (strip && first < at && ascii_blank((unsigned char)bytes[first]))
            first++;
        while (strip && at > first && ascii_blank((unsigned char)bytes[at - 1]))
            at--;
        memmove(bytes + begin, bytes + first, at - first);
        at = begin + (at - first);
    }
    uform_tokenized_t tokenized;
    uform_status_t status = UFORM_OUT_OF_MEMORY;
    if (ok) {
        offsets[request->count] = at;
        uform_tokenize_config_t config = {.without_truncation = true};
        uform_text_tokenize_args_t args = {
            .tokenizer = request->model->tokenizer,
            .texts = {.data = bytes, .offsets = offsets, .count = request->count, .length = at},
            .arena = server->tokenize_arena,
            .config = &config,
            .tokenized = &tokenized};
        status = uform_text_tokenize(&args);
    }
    for (size_t i = 0; status == UFORM_OK && i < request->count; ++i)
        counts[i] = request->inputs[i].modality != UFORM_MODALITY_TEXT || tokenized.statuses[i] != UFORM_OK
                        ? 0 /* media; a text that is not UTF-8 fails at the engine, alone */
                        : tokenized.ids.item_offsets[i + 1] - tokenized.ids.item_offsets[i];
    free(bytes);
    free(offsets);
    if (status != UFORM_OK)
        api_error(request, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", NULL, "engine_error",
                  "cannot count the texts' tokens: %s", uform_status_name(status));
    return status == UFORM_OK;
}
