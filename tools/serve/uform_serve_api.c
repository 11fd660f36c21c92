/* The bodies of `uform serve`: POST /v1/embeddings (OpenAI's) parsed and answered, POST /tokenize
 * (text-embeddings-inference's) answered, the model list, and errors in OpenAI's shape. Answers are built in
 * a serve_text_t and handed to libmicrohttpd, which frees them once sent. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "uform_serve.h"

/* ---- text -------------------------------------------------------------------------------------- */

static bool text_reserve(serve_text_t *text, size_t more) {
    if (text->failed) return false;
    if (command_reserve(&text->data, &text->capacity, text->length + more + 1, 1024)) return true;
    text->failed = true;
    return false;
}

void text_append(serve_text_t *text, char const *bytes, size_t length) {
    if (!text_reserve(text, length)) return;
    memcpy(text->data + text->length, bytes, length);
    text->length += length;
    text->data[text->length] = '\0';
}

void text_puts(serve_text_t *text, char const *string) {
    text_append(text, string, strlen(string));
}

void text_printf(serve_text_t *text, char const *format, ...) {
    if (!text_reserve(text, 64)) return;
    for (;;) {
        va_list arguments;
        va_start(arguments, format);
        size_t room = text->capacity - text->length;
        int length = vsnprintf(text->data + text->length, room, format, arguments);
        va_end(arguments);
        if (length < 0) {
            text->failed = true;
            return;
        }
        if ((size_t)length < room) {
            text->length += (size_t)length;
            return;
        }
        if (!text_reserve(text, (size_t)length)) return;
    }
}

void text_free(serve_text_t *text) {
    free(text->data);
    *text = (serve_text_t){0};
}

/* ---- answers ----------------------------------------------------------------------------------- */

/* Said when even an error's body cannot be allocated. */
static char const out_of_memory_body[] =
    "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}";

static void answer_static(serve_request_t *request, unsigned status, char const *body,
                          char const *content_type) {
    struct MHD_Response *response =
        MHD_create_response_from_buffer(strlen(body), (void *)(uintptr_t)body, MHD_RESPMEM_PERSISTENT);
    if (response) MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    request->status = status;
    request->response = response;
}

void api_answer_text(serve_request_t *request, unsigned status, serve_text_t *text,
                     char const *content_type) {
    if (request->response) MHD_destroy_response(request->response);
    request->response = NULL;
    if (text->failed || !text->data) {
        text_free(text);
        answer_static(request, MHD_HTTP_INTERNAL_SERVER_ERROR, out_of_memory_body, "application/json");
        return;
    }
    /* MHD_RESPMEM_MUST_FREE hands the buffer to libmicrohttpd, which calls free() once it is sent. */
    struct MHD_Response *response =
        MHD_create_response_from_buffer(text->length, text->data, MHD_RESPMEM_MUST_FREE);
    if (!response) {
        text_free(text);
        answer_static(request, MHD_HTTP_INTERNAL_SERVER_ERROR, out_of_memory_body, "application/json");
        return;
    }
    *text = (serve_text_t){0};
    MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    request->status = status;
    request->response = response;
}

/* Replaces each byte that does not begin a well-formed UTF-8 sequence (RFC 3629: no overlong forms, no
 * surrogates, nothing past U+10FFFF) with '?': messages quote a client's bytes (a URL, a model name, a
 * parser's excerpt) and may cut a sequence short, and JSON strings must be UTF-8. */
static void utf8_sanitize(char *text) {
    unsigned char *at = (unsigned char *)text;
    while (*at) {
        size_t length = *at < 0x80             ? 1
                        : (*at & 0xE0) == 0xC0 ? 2
                        : (*at & 0xF0) == 0xE0 ? 3
                        : (*at & 0xF8) == 0xF0 ? 4
                                               : 0;
        bool valid = length > 0;
        uint32_t point = length == 1   ? *at
                         : length == 2 ? *at & 0x1Fu
                         : length == 3 ? *at & 0x0Fu
                                       : *at & 0x07u;
        for (size_t i = 1; valid && i < length; ++i) {
            valid = (at[i] & 0xC0) == 0x80; /* the terminating NUL fails this too */
            point = point << 6 | (at[i] & 0x3Fu);
        }
        if (valid && length > 1) {
            static uint32_t const smallest[] = {0, 0, 0x80, 0x800, 0x10000};
            valid = point >= smallest[length] && point <= 0x10FFFF && (point < 0xD800 || point > 0xDFFF);
        }
        if (!valid) {
            *at++ = '?';
            continue;
        }
        at += length;
    }
}

void api_error(serve_request_t *request, unsigned status, char const *type, char const *param,
               char const *code, char const *format, ...) {
    char message[512];
    va_list arguments;
    va_start(arguments, format);
    vsnprintf(message, sizeof message, format, arguments);
    va_end(arguments);
    utf8_sanitize(message);
    /* "s?" packs NULL as JSON null. */
    json_t *body = json_pack("{s:{s:s, s:s, s:s?, s:s?}}", "error", "message", message, "type", type, "param",
                             param, "code", code);
    char *dumped = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    serve_text_t text = {.data = dumped, .length = dumped ? strlen(dumped) : 0};
    text.capacity = text.length + 1;
    api_answer_text(request, status, &text, "application/json");
}

/* A 400 for the request's body, as OpenAI words its type. */
#define INVALID(request, param, code, ...)                                                                   \
    api_error(request, MHD_HTTP_BAD_REQUEST, "invalid_request_error", param, code, __VA_ARGS__)

/* ---- POST /v1/embeddings: the request ---------------------------------------------------------- */

/* ---- base64 ----------------------------------------------------------------------------------- */

/* The value of a character of the standard alphabet, or -1. */
static int base64_value(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

size_t api_base64_decode(char const *text, size_t length, unsigned char *out, size_t *bad) {
    uint32_t group = 0; /* the sextets of the group being read */
    size_t sextets = 0, pads = 0, written = 0;
    for (size_t i = 0; i < length; ++i) {
        unsigned char c = (unsigned char)text[i];
        int value = base64_value(c);
        /* '=' pads a group of 2 or 3 characters to 4, and nothing follows a padded group. */
        bool fault = c == '=' ? sextets < 2 || sextets + pads == 4 : value < 0 || pads > 0;
        if (fault) {
            *bad = i;
            return SIZE_MAX;
        }
        if (c == '=') {
            pads++;
            continue;
        }
        group = group << 6 | (uint32_t)value;
        if (++sextets < 4) continue;
        if (out) {
            out[written] = (unsigned char)(group >> 16);
            out[written + 1] = (unsigned char)(group >> 8);
            out[written + 2] = (unsigned char)group;
        }
        written += 3;
        group = 0;
        sextets = 0;
    }
    /* One character alone holds no byte; padding, where present, must fill its group. */
    if (sextets == 1 || (pads > 0 && sextets + pads != 4)) {
        *bad = length;
        return SIZE_MAX;
    }
    /* 2 characters hold one byte (12 bits, 4 dropped), 3 hold two (18 bits, 2 dropped). */
    if (sextets == 2 && out) out[written] = (unsigned char)(group >> 4);
    if (sextets == 3 && out) {
        out[written] = (unsigned char)(group >> 10);
        out[written + 1] = (unsigned char)(group >> 2);
    }
    return written + (sextets ? sextets - 1 : 0);
}

/* ---- POST /v1/embeddings: the request ---------------------------------------------------------- */

/* ---- the model a body names ------------------------------------------------------------------- */

/* The served models' names, quoted and joined, for messages. */
static void model_names(serve_t const *server, char *names, size_t size) {
    size_t used = 0;
    names[0] = '\0';
    for (size_t i = 0; i < server->models_count && used < size; ++i)
        used += (size_t)snprintf(names + used, size - used, "%s'%s'", i ? ", " : "", server->models[i].name);
}

static serve_model_t *model_named(serve_t *server, char const *name) {
    for (size_t i = 0; i < server->models_count; ++i)
        if (!strcmp(server->models[i].name, name)) return &server->models[i];
    return NULL;
}

serve_model_t *api_parse_model(serve_t *server, serve_request_t *request, json_t *root) {
    json_t *value = json_object_get(root, "model");
    if (!value || json_is_null(value)) return &server->models[0];
    char names[256];
    model_names(server, names, sizeof names);
    if (!json_is_string(value)) {
        INVALID(request, "model", "invalid_type", "model must be a string: this server serves %s", names);
        return NULL;
    }
    serve_model_t *model = model_named(server, json_string_value(value));
    if (!model)
        api_error(request, MHD_HTTP_NOT_FOUND, "invalid_request_error", "model", "model_not_found",
                  "the model '%s' does not exist: this server serves %s", json_string_value(value), names);
    return model;
}

/* ---- POST /v1/embeddings: the inputs ----------------------------------------------------------- */

/* Where the model or the build cannot encode a modality, the reason; NULL where it can. */
static char const *modality_missing(serve_model_t const *model, uform_modality_t modality) {
    uint32_t features = uform_features();
    switch (modality) {
    case UFORM_MODALITY_TEXT:
        return NULL; /* the server starts only with text towers */
    case UFORM_MODALITY_IMAGE:
        if (!model->info.has_image) return "this model has no image tower";
        if (!(features & (UFORM_FEATURE_JPEG | UFORM_FEATURE_SPNG)))
            return "this build decodes no image format (it has neither libjpeg-turbo nor libspng)";
        return NULL;
    case UFORM_MODALITY_VIDEO:
        if (!model->info.has_video) return "this model has no video tower";
        if (!(features & UFORM_FEATURE_FFMPEG)) return "this build has no FFmpeg to decode clips";
        return NULL;
    case UFORM_MODALITY_AUDIO:
        if (!model->info.has_audio) return "this model has no audio tower";
        if (!(features & UFORM_FEATURE_FFMPEG)) return "this build has no FFmpeg to decode sounds";
        return NULL;
    }
    return "an unknown modality";
}

/* The multimodal extension: {"image" | "audio" | "video": "data:<media type>;base64,<bytes>"}, or the
 * base64 alone. The media type is not used: the engine recognizes formats by content. The base64 is
 * validated here and decoded only into the batch's tape. */
static bool parse_media_item(serve_request_t *request, json_t *value, size_t index,
                             uform_modality_t modality) {
    char const *key = command_modality_names[modality];
    if (!json_is_string(value)) {
        INVALID(request, "input", "invalid_type", "input[%zu].%s must be a string: a base64 data URL", index,
                key);
        return false;
    }
    char const *payload = json_string_value(value);
    size_t length = json_string_length(value);
    if (length >= 5 && strncasecmp(payload, "data:", 5) == 0) {
        char const *comma = memchr(payload, ',', length);
        size_t head = comma ? (size_t)(comma - payload) : 0;
        if (!comma || head < 12 || strncasecmp(comma - 7, ";base64", 7) != 0) {
            INVALID(request, "input", "invalid_value",
                    "input[%zu].%s must be a base64 data URL, data:<media type>;base64,<bytes>, or the "
                    "base64 alone",
                    index, key);
            return false;
        }
        payload = comma + 1;
        length -= head + 1;
    }
    size_t bad = 0;
    size_t decoded = api_base64_decode(payload, length, NULL, &bad);
    if (decoded == SIZE_MAX) {
        if (bad < length)
            INVALID(request, "input", "invalid_value",
                    "input[%zu].%s is not base64: byte 0x%02x at offset %zu of the data", index, key,
                    (unsigned char)payload[bad], bad);
        else
            INVALID(request, "input", "invalid_value",
                    "input[%zu].%s is not base64: the data ends within a group of 4 characters", index, key);
        return false;
    }
    if (decoded == 0) {
        INVALID(request, "input", "invalid_value", "input[%zu].%s is empty", index, key);
        return false;
    }
    char const *missing = modality_missing(request->model, modality);
    if (missing) {
        INVALID(request, "input", "unsupported_modality", "input[%zu]: %s inputs are not supported: %s",
                index, key, missing);
        return false;
    }
    request->inputs[index] = (serve_input_t){
        .modality = modality, .bytes = payload, .length = length, .budget = decoded, .taped = decoded};
    return true;
}

/* One text of the input, a string. */
static bool parse_text(serve_request_t *request, json_t *item, size_t index) {
    if (!json_is_string(item)) {
        INVALID(request, "input", "invalid_type", "input[%zu] must be a string", index);
        return false;
    }
    size_t length = json_string_length(item);
    if (length == 0) {
        INVALID(request, "input", "invalid_value", "input[%zu] is empty", index);
        return false;
    }
    request->inputs[index] =
        (serve_input_t){.modality = UFORM_MODALITY_TEXT, .bytes = json_string_value(item), .length = length};
    return true;
}

/* One item of an input list: a string, or an object of the multimodal extension holding exactly one of
 * "text", "image", "audio" and "video" (other keys are ignored). */
static bool parse_item(serve_request_t *request, json_t *item, size_t index) {
    if (!json_is_object(item)) return parse_text(request, item, index);
    json_t *value = NULL;
    uform_modality_t modality = UFORM_MODALITY_TEXT;
    for (size_t m = 0; m < SERVE_MODALITIES; ++m) {
        json_t *found = json_object_get(item, command_modality_names[m]);
        if (!found) continue;
        if (value) {
            INVALID(request, "input", "invalid_value",
                    "input[%zu] holds more than one of \"text\", \"image\", \"audio\" and \"video\"", index);
            return false;
        }
        value = found;
        modality = (uform_modality_t)m;
    }
    if (!value) {
        INVALID(request, "input", "invalid_value",
                "input[%zu] is an object without \"text\", \"image\", \"audio\" or \"video\"", index);
        return false;
    }
    if (modality == UFORM_MODALITY_TEXT) return parse_text(request, value, index);
    return parse_media_item(request, value, index, modality);
}

static bool parse_input(serve_t *server, serve_request_t *request, json_t *input, bool truncate) {
    if (!input || json_is_null(input)) {
        INVALID(request, "input", "missing_required_parameter",
                "input is required: a string or a list of strings");
        return false;
    }
    if (json_is_string(input)) {
        if (json_string_length(input) == 0) {
            INVALID(request, "input", "invalid_value", "input is empty");
            return false;
        }
        request->count = 1;
    } else if (json_is_array(input)) {
        request->count = json_array_size(input);
        if (request->count == 0) {
            INVALID(request, "input", "invalid_value", "input is an empty list");
            return false;
        }
        /* OpenAI also takes token ids: a list of integers, or a list of such lists. */
        json_t *first = json_array_get(input, 0);
        if (json_is_integer(first) || json_is_array(first)) {
            INVALID(request, "input", "unsupported_input",
                    "token ids are not supported: this model reads the bytes of texts; send strings");
            return false;
        }
        if (request->count > SERVE_MAX_ITEMS) {
            INVALID(request, "input", "invalid_value", "input has %zu items; at most %d are taken at once",
                    request->count, SERVE_MAX_ITEMS);
            return false;
        }
    } else {
        INVALID(request, "input", "invalid_type", "input must be a string or a list of strings");
        return false;
    }
    request->inputs = calloc(request->count, sizeof *request->inputs);
    if (!request->inputs) {
        api_error(request, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", NULL, NULL, "out of memory");
        return false;
    }
    if (json_is_string(input)) {
        if (!parse_text(request, input, 0)) return false;
    } else {
        for (size_t i = 0; i < request->count; ++i)
            if (!parse_item(request, json_array_get(input, i), i)) return false;
    }
    size_t context = request->model->info.text.context;
    /* A model with a tokenizer reads tokens: each text's count, as the engine will cut it. */
    bool tokens = request->model->tokenizer != NULL;
    size_t *counts = tokens ? calloc(request->count, sizeof *counts) : NULL;
    if (tokens && !counts) {
        api_error(request, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", NULL, NULL, "out of memory");
        return false;
    }
    if (tokens && !api_count_tokens(server, request, counts)) {
        free(counts);
        return false;
    }
    for (size_t i = 0; i < request->count; ++i) {
        serve_input_t *item = &request->inputs[i];
        if (item->modality != UFORM_MODALITY_TEXT) {
            request->bytes += item->budget;
            continue;
        }
        size_t length = tokens ? counts[i] : item->length;
        if (length > context) {
            if (!truncate) {
                INVALID(request, "input", "context_length_exceeded",
                        "input[%zu] is %zu %s and the model reads at most %zu: shorten it, or leave "
                        "\"truncate\" true to embed its first %zu",
                        i, length, tokens ? "tokens" : "bytes", context, context);
                free(counts);
                return false;
            }
            request->truncated++;
            item->truncated = true;
            length = context;
        }
        /* A batch's budget is in bytes: a tokenized text's whole bytes go to its tokenizer. */
        item->budget = tokens ? item->length : length;
        item->taped = item->length;
        request->bytes += item->budget;
        request->tokens += tokens ? length : length + 1; /* the engine's own models: one BOS */
    }
    free(counts);
    request->width = request->dimensions ? request->dimensions : request->model->info.dims;
    request->vectors = malloc(request->count * request->width * sizeof *request->vectors);
    if (!request->vectors) {
        api_error(request, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", NULL, NULL, "out of memory");
        return false;
    }
    return true;
}

static bool parse_dimensions(serve_request_t *request, json_t *value) {
    if (!value || json_is_null(value)) return true;
    uform_model_info_t const *info = &request->model->info;
    char widths[256] = "";
    size_t used = 0;
    for (size_t i = 0; i < info->matryoshka_count && used < sizeof widths; ++i)
        used += (size_t)snprintf(widths + used, sizeof widths - used, "%s%zu", i ? ", " : "",
                                 info->matryoshka[i]);
    if (!json_is_integer(value)) {
        INVALID(request, "dimensions", "invalid_type", "dimensions must be an integer, one of %s", widths);
        return false;
    }
    json_int_t asked = json_integer_value(value);
    if (asked > 0 && (size_t)asked == info->dims) return true;
    for (size_t i = 0; i < info->matryoshka_count; ++i) {
        if (asked <= 0 || (size_t)asked != info->matryoshka[i]) continue;
        request->dimensions = (size_t)asked;
        return true;
    }
    INVALID(request, "dimensions", "invalid_value", "dimensions %lld is not a width of this model: one of %s",
            (long long)asked, widths);
    return false;
}

json_t *api_parse_body(serve_t *server, serve_request_t *request) {
    json_error_t error;
    request->json =
        json_loadb(request->body ? request->body : "", request->body_length, JSON_ALLOW_NUL, &error);
    free(request->body);
    request->body = NULL;
    json_t *root = request->json;
    /* jansson leaves its error's text empty (and its code unwritten) when an allocation fails. */
    if (!root && error.text[0] == '\0') {
        api_error(request, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", NULL, NULL, "out of memory");
        return NULL;
    }
    if (!root) {
        INVALID(request, NULL, "invalid_json", "the body is not valid JSON: %s (line %d, column %d)",
                error.text, error.line, error.column);
        return NULL;
    }
    if (!json_is_object(root)) {
        INVALID(request, NULL, "invalid_type", "the body must be a JSON object");
        return NULL;
    }
    return (request->model = api_parse_model(server, request, root)) ? root : NULL;
}

bool api_parse_embeddings(serve_t *server, serve_request_t *request) {
    json_t *root = api_parse_body(server, request);
    if (!root) return false;

    json_t *format = json_object_get(root, "encoding_format");
    if (format && !json_is_null(format)) {
        char const *name = json_string_value(format);
        if (!name || (strcmp(name, "float") != 0 && strcmp(name, "base64") != 0)) {
            INVALID(request, "encoding_format", "invalid_value",
                    "encoding_format must be \"float\" or \"base64\"");
            return false;
        }
        request->base64 = !strcmp(name, "base64");
    }

    json_t *truncate = json_object_get(root, "truncate");
    if (truncate && !json_is_null(truncate) && !json_is_boolean(truncate)) {
        INVALID(request, "truncate", "invalid_type", "truncate must be true or false");
        return false;
    }
    json_t *user = json_object_get(root, "user");
    if (user && !json_is_null(user) && !json_is_string(user)) {
        INVALID(request, "user", "invalid_type", "user must be a string");
        return false;
    }
    if (!parse_dimensions(request, json_object_get(root, "dimensions"))) return false;
    return parse_input(server, request, json_object_get(root, "input"), !truncate || !json_is_false(truncate));
}

/* ---- POST /v1/embeddings: the answer ----------------------------------------------------------- */

/* %.9g prints every float so that it reads back to the same float, as `uform encode` writes them; JSON
 * has no NaN or infinity. */
static void text_float(serve_text_t *text, float value) {
    if (value - value == 0)
        text_printf(text, "%.9g", (double)value);
    else
        text_puts(text, "null");
}

/* The row's F32 values as little-endian bytes in standard base64, as OpenAI's "base64" format. */
static void text_base64(serve_text_t *text, float const *row, size_t columns) {
    static char const alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t bytes = columns * sizeof(float);
    if (!text_reserve(text, (bytes + 2) / 3 * 4)) return;
    unsigned char const *data = (unsigned char const *)row;
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    unsigned char swapped[4 * 4096];
    if (bytes > sizeof swapped) {
        text->failed = true;
        return;
    }
    for (size_t i = 0; i < bytes; ++i)
        swapped[i] = data[(i & ~(size_t)3) + 3 - (i & 3)];
    data = swapped;
#endif
    char *out = text->data + text->length;
    size_t i = 0;
    for (; i + 3 <= bytes; i += 3) {
        uint32_t triple = (uint32_t)data[i] << 16 | (uint32_t)data[i + 1] << 8 | data[i + 2];
        *out++ = alphabet[triple >> 18 & 63];
        *out++ = alphabet[triple >> 12 & 63];
        *out++ = alphabet[triple >> 6 & 63];
        *out++ = alphabet[triple & 63];
    }
    if (i < bytes) {
        uint32_t triple = (uint32_t)data[i] << 16 | (i + 1 < bytes ? (uint32_t)data[i + 1] << 8 : 0);
        *out++ = alphabet[triple >> 18 & 63];
        *out++ = alphabet[triple >> 12 & 63];
        *out++ = i + 1 < bytes ? alphabet[triple >> 6 & 63] : '=';
        *out++ = '=';
    }
    text->length = (size_t)(out - text->data);
    text->data[text->length] = '\0';
}

void api_answer_embeddings(serve_t *server, serve_request_t *request) {
    (void)server;
    serve_text_t text = {0};
    text_puts(&text, "{\"object\":\"list\",\"data\":[");
    for (size_t i = 0; i < request->count; ++i) {
        serve_input_t const *input = &request->inputs[i];
        float const *values = request->vectors + i * request->width;
        text_printf(&text, "%s{\"object\":\"embedding\",\"index\":%zu,\"embedding\":", i ? "," : "", i);
        if (request->base64) {
            text_puts(&text, "\"");
            text_base64(&text, values, request->width);
            text_puts(&text, "\"");
        } else {
            text_puts(&text, "[");
            for (size_t column = 0; column < request->width; ++column) {
                if (column) text_puts(&text, ",");
                text_float(&text, values[column]);
            }
            text_puts(&text, "]");
        }
        /* Media items carry no flag: the engine reads a fixed span of each (an image resized, a clip's
         * frames sampled, a sound cut to the model's reach) and reports none per item. */
        if (input->modality == UFORM_MODALITY_TEXT)
            text_printf(&text, ",\"truncated\":%s", input->truncated ? "true" : "false");
        text_puts(&text, "}");
    }
    text_printf(&text, "],\"model\":%s,\"usage\":{\"prompt_tokens\":%zu,\"total_tokens\":%zu}}",
                request->model->name_json, request->tokens, request->tokens);
    api_answer_text(request, MHD_HTTP_OK, &text, "application/json");
}

/* ---- GET /v1/models ---------------------------------------------------------------------------- */

/* OpenAI's id, object, created and owned_by, then the model's widths and context: "dimensions" (its
 * full width) and "context_length" (what it reads of a text at most: bytes, or tokens with the special
 * ones where it has a tokenizer), "matryoshka" (the narrower widths it answers), "tokenizer" (whether
 * POST /tokenize cuts for it); "dims" and "context" repeat the first two. */
static void text_model(serve_text_t *text, serve_model_t const *model) {
    text_printf(text,
                "{\"id\":%s,\"object\":\"model\",\"created\":%lld,\"owned_by\":\"uform\",\"dimensions\":%zu,"
                "\"context_length\":%zu,\"tokenizer\":%s,\"dims\":%zu,\"context\":%zu,\"matryoshka\":[",
                model->name_json, model->created, model->info.dims, model->info.text.context,
                model->tokenizer ? "true" : "false", model->info.dims, model->info.text.context);
    for (size_t i = 0; i < model->info.matryoshka_count; ++i)
        text_printf(text, "%s%zu", i ? "," : "", model->info.matryoshka[i]);
    text_puts(text, "]}");
}

void api_answer_models(serve_t *server, serve_request_t *request, char const *name) {
    serve_text_t text = {0};
    serve_model_t const *model = name ? model_named(server, name) : NULL;
    if (!name) {
        text_puts(&text, "{\"object\":\"list\",\"data\":[");
        for (size_t i = 0; i < server->models_count; ++i) {
            if (i) text_puts(&text, ",");
            text_model(&text, &server->models[i]);
        }
        text_puts(&text, "]}");
    } else if (model) {
        text_model(&text, model);
    } else {
        char names[256];
        model_names(server, names, sizeof names);
        api_error(request, MHD_HTTP_NOT_FOUND, "invalid_request_error", "model", "model_not_found",
                  "the model '%s' does not exist: this server serves %s", name, names);
        return;
    }
    api_answer_text(request, MHD_HTTP_OK, &text, "application/json");
}
