/* Checkpoints: parsing and validating a safetensors header with format-4 metadata, and writing one.
 * See checkpoint.h for what is checked. Every fault answers a static message; nothing here calls
 * fail(): the public verbs that use this module record the failure under their own name. */
#include "checkpoint.h"
#include "json_fault.h"
#include "variant.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHECKPOINT_NAME_LIMIT  255
#define CHECKPOINT_PREFIX_SIZE 8
#define CHECKPOINT_ALIGNMENT   8
#define METADATA_KEY           "__metadata__"
#define MODEL_KEY              "uform"
#define MODEL_FORMAT           4
#define LOGIT_SCALE            "logit.scale"
#define LOGIT_BIAS             "logit.bias"

static struct {
    char const *name;
    size_t size;
} const dtypes[] = {
    [CHECKPOINT_BF16] = {"BF16", 2}, [CHECKPOINT_F16] = {"F16", 2}, [CHECKPOINT_F32] = {"F32", 4},
    [CHECKPOINT_F64] = {"F64", 8},   [CHECKPOINT_I8] = {"I8", 1},   [CHECKPOINT_U8] = {"U8", 1},
    [CHECKPOINT_I16] = {"I16", 2},   [CHECKPOINT_I32] = {"I32", 4}, [CHECKPOINT_I64] = {"I64", 8},
    [CHECKPOINT_BOOL] = {"BOOL", 1},
};
#define DTYPES_COUNT (sizeof dtypes / sizeof dtypes[0])

size_t checkpoint_dtype_size(checkpoint_dtype_t dtype) {
    return (size_t)dtype < DTYPES_COUNT ? dtypes[dtype].size : 0;
}

/* NULL for a value outside the enumeration. */
char const *checkpoint_dtype_name(checkpoint_dtype_t dtype) {
    return (size_t)dtype < DTYPES_COUNT ? dtypes[dtype].name : NULL;
}

static uform_status_t answer(uform_status_t status, char const **message, char const *text) {
    *message = text;
    return status;
}

static uform_status_t malformed(char const **message, char const *text) {
    return answer(UFORM_FORMAT, message, text);
}

/* Elements and bytes of a shape; false when either overflows 64 bits. A zero dimension makes the
 * product zero whatever the others are. */
static bool count_shape(size_t rank, uint64_t const *shape, size_t dtype_size, uint64_t *elements,
                        uint64_t *bytes) {
    uint64_t product = 1;
    bool overflow = false;
    for (size_t i = 0; i < rank; i++) {
        if (shape[i] == 0) {
            product = 0;
            overflow = false;
            break;
        }
        overflow |= __builtin_mul_overflow(product, shape[i], &product);
    }
    if (overflow || __builtin_mul_overflow(product, (uint64_t)dtype_size, bytes)) return false;
    *elements = product;
    return true;
}

/* ---------------------------------------------------------------------------------------------- */
/* The prefix and the tensor entries                                                              */
/* ---------------------------------------------------------------------------------------------- */

uform_status_t checkpoint_prefix(uint8_t const *prefix, size_t prefix_length, uint64_t file_size,
                                 uint64_t *header_length, char const **message) {
    *header_length = 0;
    if (prefix_length < CHECKPOINT_PREFIX_SIZE || file_size < CHECKPOINT_PREFIX_SIZE)
        return malformed(message, "file too short for a checkpoint");
    uint64_t length = 0;
    for (size_t i = 0; i < CHECKPOINT_PREFIX_SIZE; i++)
        length |= (uint64_t)prefix[i] << (8 * i);
    if (length == 0) return malformed(message, "checkpoint header is empty");
    if (length > CHECKPOINT_HEADER_LIMIT) return malformed(message, "checkpoint header over 100 MiB");
    if (length > file_size - CHECKPOINT_PREFIX_SIZE)
        return malformed(message, "header length beyond the file");
    *header_length = length;
    return UFORM_OK;
}

/* ---- Telling malformed JSON from a failed allocation ----------------------------------------------- */

/* jansson does not always say that an allocation failed: one inside its lexer reads as a syntax error
 * ("string or '}' expected"). So when it refuses a text, the text is checked here, allocating nothing,
 * against what jansson accepts (an object or array at the top, at most JSON_CHECK_DEPTH deep, strict
 * UTF-8, no NUL, paired surrogates, integers within 64 bits, reals that do not overflow): a text that
 * passes was refused for memory. */
#define JSON_CHECK_DEPTH 2048 /* jansson's JSON_PARSER_MAX_DEPTH */

typedef struct json_check {
    unsigned char const *at, *end;
    size_t depth;
    uint8_t in_object[JSON_CHECK_DEPTH / 8]; /* per open container: an object (1) or an array (0) */
} json_check_t;

static void json_check_space(json_check_t *check) {
    while (check->at < check->end &&
           (*check->at == ' ' || *check->at == '\t' || *check->at == '\n' || *check->at == '\r'))
        check->at++;
}

static bool json_check_byte(json_check_t *check, unsigned char byte) {
    json_check_space(check);
    if (check->at == check->end || *check->at != byte) return false;
    check->at++;
    return true;
}

/* Four hex digits after "\u". */
static bool json_check_hex(json_check_t *check, uint32_t *value) {
    if (check->end - check->at < 4) return false;
    *value = 0;
    for (int i = 0; i < 4; ++i) {
        unsigned char c = *check->at++;
        uint32_t digit = c >= '0' && c <= '9'   ? c - (uint32_t)'0'
                         : c >= 'a' && c <= 'f' ? c - (uint32_t)'a' + 10u
                         : c >= 'A' && c <= 'F' ? c - (uint32_t)'A' + 10u
                                                : 16u;
        if (digit == 16u) return false;
        *value = *value * 16 + digit;
    }
    return true;
}

static bool json_check_escape(json_check_t *check) {
    if (check->at == check->end) return false;
    unsigned char c = *check->at++;
    if (c != 'u') return strchr("\"\\/bfnrt", c) != NULL && c != '\0';
    uint32_t unit, low;
    if (!json_check_hex(check, &unit) || unit == 0 || (unit >= 0xDC00 && unit <= 0xDFFF)) return false;
    if (unit < 0xD800 || unit > 0xDBFF) return true;
    return check->end - check->at >= 2 && check->at[0] == '\\' && check->at[1] == 'u' &&
           (check->at += 2, json_check_hex(check, &low)) && low >= 0xDC00 && low <= 0xDFFF;
}

/* One UTF-8 sequence of two to four bytes, its first byte `lead` read: shortest form, no surrogate,
 * at most U+10FFFF. */
static bool json_check_utf8(json_check_t *check, unsigned char lead) {
    size_t extra = lead >= 0xF0 ? 3 : lead >= 0xE0 ? 2 : 1;
    if (lead < 0xC2 || lead > 0xF4 || (size_t)(check->end - check->at) < extra) return false;
    uint32_t point = lead & (0x3Fu >> extra);
    for (size_t i = 0; i < extra; ++i) {
        unsigned char c = *check->at++;
        if ((c & 0xC0) != 0x80) return false;
        point = point << 6 | (c & 0x3Fu);
    }
    uint32_t const shortest[] = {0, 0x80, 0x800, 0x10000};
    return point >= shortest[extra] && point <= 0x10FFFF && !(point >= 0xD800 && point <= 0xDFFF);
}

static bool json_check_string(json_check_t *check) {
    if (!json_check_byte(check, '"')) return false;
    while (check->at < check->end) {
        unsigned char c = *check->at++;
        if (c == '"') return true;
        if (c < 0x20) return false;
        if (c == '\\' && !json_check_escape(check)) return false;
        if (c >= 0x80 && !json_check_utf8(check, c)) return false;
    }
    return false;
}

static size_t json_check_digits(json_check_t *check) {
    size_t count = 0;
    while (check->at < check->end && *check->at >= '0' && *check->at <= '9')
        check->at++, count++;
    return count;
}

/* A number by JSON's grammar; an integer within int64_t, a real whose value is finite (as jansson's
 * strtoll and strtod read them). */
static bool json_check_number(json_check_t *check) {
    unsigned char const *start = check->at;
    if (check->at < check->end && *check->at == '-') check->at++;
    unsigned char const *digits = check->at;
    size_t count = json_check_digits(check);
    if (count == 0 || (count > 1 && *digits == '0')) return false;
    bool real = false;
    if (check->at < check->end && *check->at == '.') {
        check->at++, real = true;
        if (json_check_digits(check) == 0) return false;
    }
    if (check->at < check->end && (*check->at == 'e' || *check->at == 'E')) {
        check->at++, real = true;
        if (check->at < check->end && (*check->at == '+' || *check->at == '-')) check->at++;
        if (json_check_digits(check) == 0) return false;
    }
    char copy[512];
    size_t length = (size_t)(check->at - start);
    if (length >= sizeof copy) return false;
    memcpy(copy, start, length);
    copy[length] = '\0';
    errno = 0;
    if (real) {
        double value = strtod(copy, NULL);
        return !(errno == ERANGE && isinf(value));
    }
    (void)strtoll(copy, NULL, 10);
    return errno != ERANGE;
}

static bool json_check_word(json_check_t *check, char const *word) {
    size_t length = strlen(word);
    if ((size_t)(check->end - check->at) < length || memcmp(check->at, word, length) != 0) return false;
    check->at += length;
    return true;
}

/* A scalar value, or the opening of a container (pushed). */
static bool json_check_value(json_check_t *check) {
    json_check_space(check);
    if (check->at == check->end) return false;
    switch (*check->at) {
    case '"':
        return json_check_string(check);
    case '{':
    case '[':
        if (check->depth == JSON_CHECK_DEPTH) return false;
        if (*check->at == '{')
            check->in_object[check->depth / 8] |= (uint8_t)(1u << (check->depth % 8));
        else
            check->in_object[check->depth / 8] &= (uint8_t) ~(1u << (check->depth % 8));
        check->depth++;
        check->at++;
        return true;
    case 't':
        return json_check_word(check, "true");
    case 'f':
        return json_check_word(check, "false");
    case 'n':
        return json_check_word(check, "null");
    default:
        return json_check_number(check);
    }
}

static bool json_check_in_object(json_check_t const *check) {
    size_t top = check->depth - 1;
    return (check->in_object[top / 8] >> (top % 8)) & 1u;
}

/* The key of an object's member and its colon. */
static bool json_check_key(json_check_t *check) {
    json_check_space(check);
    return json_check_string(check) && json_check_byte(check, ':');
}

/* The whole text is one object or array, as jansson (without JSON_DECODE_ANY) accepts it. */
static bool json_text_valid(char const *text, size_t length) {
    json_check_t check = {(unsigned char const *)text, (unsigned char const *)text + length, 0, {0}};
    json_check_space(&check);
    if (check.at == check.end || (*check.at != '{' && *check.at != '[')) return false;
    if (!json_check_value(&check)) return false;
    /* Just after an opening: its first member, or its end. */
    bool opened = true;
    while (check.depth > 0) {
        bool object = json_check_in_object(&check);
        json_check_space(&check);
        if (check.at < check.end && *check.at == (object ? '}' : ']')) {
            check.at++, check.depth--, opened = false;
            continue;
        }
        if (!opened && !json_check_byte(&check, ',')) return false;
        if (object && !json_check_key(&check)) return false;
        size_t depth = check.depth;
        if (!json_check_value(&check)) return false;
        opened = check.depth > depth;
    }
    json_check_space(&check);
    return check.at == check.end;
}

/* Parses JSON text, rejecting duplicate keys; `not_json` names any fault other than those two. */
static uform_status_t load_json(char const *text, size_t length, char const *not_json, json_t **value,
                                char const **message) {
    json_error_t error;
    *value = json_loadb(text, length, JSON_REJECT_DUPLICATES, &error);
    if (*value) return UFORM_OK;
    if (json_fault_memory(&error))
        return answer(UFORM_OUT_OF_MEMORY, message, "out of memory parsing checkpoint JSON");
    switch (json_error_code(&error)) {
    case json_error_duplicate_key:
        return malformed(message, "duplicate key in checkpoint JSON");
    default:
        if (json_text_valid(text, length))
            return answer(UFORM_OUT_OF_MEMORY, message, "out of memory parsing checkpoint JSON");
        return malformed(message, not_json);
    }
}

static bool read_offset(json_t const *value, uint64_t *offset) {
    if (!json_is_integer(value) || json_integer_value(value) < 0) return false;
    *offset = (uint64_t)json_integer_value(value);
    return true;
}

static uform_status_t parse_dtype(json_t const *value, checkpoint_dtype_t *dtype, char const **message) {
    if (!json_is_string(value)) return malformed(message, "tensor dtype is not a string");
    for (size_t i = 0; i < DTYPES_COUNT; i++) {
        if (strcmp(json_string_value(value), dtypes[i].name) == 0) {
            *dtype = (checkpoint_dtype_t)i;
            return UFORM_OK;
        }
    }
    return malformed(message, "unknown tensor dtype");
}

static uform_status_t parse_shape(json_t const *value, checkpoint_tensor_t *tensor, char const **message) {
    if (!json_is_array(value)) return malformed(message, "tensor shape malformed");
    if (json_array_size(value) > CHECKPOINT_RANK_LIMIT) return malformed(message, "tensor rank over 4");
    tensor->rank = json_array_size(value);
    for (size_t i = 0; i < tensor->rank; i++)
        if (!read_offset(json_array_get(value, i), &tensor->shape[i]))
            return malformed(message, "tensor shape malformed");
    return UFORM_OK;
}

/* One entry {"dtype", "shape", "data_offsets"}; `data_limit` is the size of the data section. */
static uform_status_t parse_tensor(json_t const *entry, uint64_t data_limit, checkpoint_tensor_t *tensor,
                                   char const **message) {
    if (!json_is_object(entry)) return malformed(message, "tensor entry is not an object");
    uform_status_t status = parse_dtype(json_object_get(entry, "dtype"), &tensor->dtype, message);
    if (status != UFORM_OK) return status;
    status = parse_shape(json_object_get(entry, "shape"), tensor, message);
    if (status != UFORM_OK) return status;
    json_t const *offsets = json_object_get(entry, "data_offsets");
    if (!json_is_array(offsets) || json_array_size(offsets) != 2 ||
        !read_offset(json_array_get(offsets, 0), &tensor->begin) ||
        !read_offset(json_array_get(offsets, 1), &tensor->end))
        return malformed(message, "tensor data_offsets malformed");
    if (tensor->end < tensor->begin) return malformed(message, "tensor data ends before it begins");
    uint64_t elements = 0, bytes = 0;
    if (!count_shape(tensor->rank, tensor->shape, dtypes[tensor->dtype].size, &elements, &bytes))
        return malformed(message, "tensor shape overflows");
    if (tensor->end - tensor->begin != bytes)
        return malformed(message, "tensor bytes do not match its shape");
    if (tensor->end > data_limit) return malformed(message, "tensor data beyond the file");
    return UFORM_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* The tensor table                                                                               */
/* ---------------------------------------------------------------------------------------------- */

static int compare_by_begin(void const *left, void const *right) {
    checkpoint_tensor_t const *a = left, *b = right;
    if (a->begin != b->begin) return a->begin < b->begin ? -1 : 1;
    if (a->end != b->end) return a->end < b->end ? -1 : 1;
    return 0;
}

static int compare_by_name(void const *left, void const *right) {
    checkpoint_tensor_t const *a = left, *b = right;
    return strcmp(a->name, b->name);
}

/* Sizes the table and the name storage from the root object's keys. */
static uform_status_t allocate_table(json_t *root, checkpoint_header_t *header, char const **message) {
    size_t count = 0, names_size = 0;
    char const *key;
    json_t *value;
    json_object_foreach(root, key, value) {
        if (strcmp(key, METADATA_KEY) == 0) continue;
        size_t length = strlen(key);
        if (length == 0 || length > CHECKPOINT_NAME_LIMIT)
            return malformed(message, "tensor name empty or over 255 bytes");
        count++;
        names_size += length + 1;
    }
    if (count == 0) return malformed(message, "checkpoint has no tensors");
    header->tensors = calloc(count, sizeof *header->tensors);
    header->names = malloc(names_size);
    if (!header->tensors || !header->names) return answer(UFORM_OUT_OF_MEMORY, message, "out of memory");
    return UFORM_OK;
}

/* The fault of a tensor whose data is not aligned to its dtype, naming the tensor and the offset: built
 * per thread, valid until the thread's next parse. */
static _Thread_local char misaligned_message[CHECKPOINT_NAME_LIMIT + 96];

/* The data of every tensor starts at a file offset that is a multiple of its dtype's size, so that a
 * mapped load (the file mapped at a page boundary) and a load through the ring read its elements at
 * aligned addresses alike. */
static uform_status_t check_alignment(checkpoint_tensor_t const *tensor, uint64_t data_offset,
                                      char const **message) {
    uint64_t const offset = data_offset + tensor->begin;
    if (offset % dtypes[tensor->dtype].size == 0) return UFORM_OK;
    snprintf(misaligned_message, sizeof misaligned_message,
             "tensor %s data at file offset %llu is not aligned to its %zu-byte dtype", tensor->name,
             (unsigned long long)offset, dtypes[tensor->dtype].size);
    return malformed(message, misaligned_message);
}

/* Fills the table from every entry but the metadata, sums the sizes, and rejects overlaps and data
 * misaligned for its dtype. The table ends sorted by name. */
static uform_status_t collect_tensors(json_t *root, uint64_t data_offset, uint64_t data_limit,
                                      checkpoint_header_t *header, char const **message) {
    uform_status_t status = allocate_table(root, header, message);
    if (status != UFORM_OK) return status;
    char *names = header->names;
    char const *key;
    json_t *value;
    json_object_foreach(root, key, value) {
        if (strcmp(key, METADATA_KEY) == 0) continue;
        checkpoint_tensor_t *tensor = &header->tensors[header->tensors_count];
        status = parse_tensor(value, data_limit, tensor, message);
        if (status != UFORM_OK) return status;
        size_t length = strlen(key) + 1;
        tensor->name = memcpy(names, key, length);
        names += length;
        header->tensors_count++;
    }
    qsort(header->tensors, header->tensors_count, sizeof *header->tensors, compare_by_begin);
    /* Once no two tensors overlap, neither sum can exceed the data section. */
    uint64_t parameters = 0, bytes = 0;
    for (size_t i = 0; i < header->tensors_count; i++) {
        checkpoint_tensor_t const *tensor = &header->tensors[i];
        if (i > 0 && tensor->begin < header->tensors[i - 1].end) return malformed(message, "tensors overlap");
        status = check_alignment(tensor, data_offset, message);
        if (status != UFORM_OK) return status;
        bytes += tensor->end - tensor->begin;
        parameters += (tensor->end - tensor->begin) / dtypes[tensor->dtype].size;
    }
    header->data_size = header->tensors[header->tensors_count - 1].end;
    header->info.parameters = (size_t)parameters;
    header->info.bytes = (size_t)bytes;
    qsort(header->tensors, header->tensors_count, sizeof *header->tensors, compare_by_name);
    return UFORM_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* Format-4 metadata                                                                              */
/* ---------------------------------------------------------------------------------------------- */

/* An integer field of the metadata and the range it must lie in. */
typedef struct size_rule {
    char const *key;
    size_t low, high;
    size_t *value;
    char const *message;
} size_rule_t;

static uform_status_t read_sizes(json_t const *object, size_rule_t const *rules, size_t count,
                                 char const **message) {
    for (size_t i = 0; i < count; i++) {
        json_t const *value = json_object_get(object, rules[i].key);
        if (!json_is_integer(value) || json_integer_value(value) < 0)
            return malformed(message, rules[i].message);
        uint64_t number = (uint64_t)json_integer_value(value);
        if (number < rules[i].low || number > rules[i].high) return malformed(message, rules[i].message);
        *rules[i].value = (size_t)number;
    }
    return UFORM_OK;
}

#define ARRAY_COUNT(array) (sizeof(array) / sizeof((array)[0]))

/* depth, hidden, heads, mlp: the four numbers every transformer tower shares. */
/* depth, hidden, heads, mlp: the four numbers every transformer tower shares; then the block's settings
 * (variant.h), whose defaults are the engine's own. */
static uform_status_t parse_transformer(json_t const *tower, uform_transformer_info_t *info, bool text,
                                        char const **message) {
    size_rule_t const rules[] = {
        {"depth", 1, 1024, &info->depth, "tower depth out of range"},
        {"hidden", 8, 65536, &info->hidden, "tower hidden out of range"},
        {"heads", 1, 1024, &info->heads, "tower heads out of range"},
        {"mlp", 1, 1u << 20, &info->mlp, "tower mlp out of range"},
    };
    uform_status_t status = read_sizes(tower, rules, ARRAY_COUNT(rules), message);
    if (status != UFORM_OK) return status;
    return variant_parse(tower, info, text, message);
}

static uform_status_t parse_text(json_t const *tower, uform_model_info_t *info, char const **message) {
    uform_status_t status = parse_transformer(tower, &info->text.transformer, true, message);
    if (status != UFORM_OK) return status;
    size_rule_t const rules[] = {{"context", 1, 1u << 24, &info->text.context, "text context out of range"}};
    status = read_sizes(tower, rules, ARRAY_COUNT(rules), message);
    return status == UFORM_OK ? variant_parse_text(tower, info, message) : status;
}

/* The image normalization's ranges: pixels in [0, 1] become (pixel - mean) / std, so these bounds keep
 * every normalized value within 9 * 1024 in magnitude, far from what F32 and BF16 can hold. */
#define IMAGE_MEAN_LIMIT 8.0
#define IMAGE_STD_LOW    (1.0 / 1024)
#define IMAGE_STD_HIGH   1024.0

/* Three numbers, each in [low, high]. */
static bool read_triple(json_t const *value, double low, double high, float triple[3]) {
    if (!json_is_array(value) || json_array_size(value) != 3) return false;
    for (size_t i = 0; i < 3; i++) {
        json_t const *number = json_array_get(value, i);
        if (!json_is_number(number)) return false;
        double const read = json_number_value(number);
        if (!(read >= low && read <= high)) return false;
        triple[i] = (float)read;
    }
    return true;
}

static uform_status_t parse_image(json_t const *tower, uform_model_info_t *info, char const **message) {
    uform_status_t status = parse_transformer(tower, &info->image.transformer, false, message);
    if (status != UFORM_OK) return status;
    size_rule_t const rules[] = {
        {"size", 1, 8192, &info->image.size, "image size out of range"},
        {"patch", 1, 8192, &info->image.patch, "image patch out of range"},
    };
    status = read_sizes(tower, rules, ARRAY_COUNT(rules), message);
    if (status != UFORM_OK) return status;
    if (info->image.size % info->image.patch != 0)
        return malformed(message, "image size is not a multiple of patch");
    if (!read_triple(json_object_get(tower, "mean"), -IMAGE_MEAN_LIMIT, IMAGE_MEAN_LIMIT, info->image.mean))
        return malformed(message, "image mean malformed or out of range");
    if (!read_triple(json_object_get(tower, "std"), IMAGE_STD_LOW, IMAGE_STD_HIGH, info->image.std))
        return malformed(message, "image std malformed or out of range");
    return variant_parse_image(tower, info, message);
}

static uform_status_t parse_video(json_t const *tower, uform_model_info_t *info, char const **message) {
    size_rule_t const rules[] = {{"frames", 1, 1024, &info->video.frames, "video frames out of range"}};
    return read_sizes(tower, rules, ARRAY_COUNT(rules), message);
}

/* `seconds` is capped at a day so that rate * seconds stays far from overflowing. */
static uform_status_t parse_audio(json_t const *tower, uform_model_info_t *info, char const **message) {
    uform_status_t status = parse_transformer(tower, &info->audio.transformer, false, message);
    if (status != UFORM_OK) return status;
    size_rule_t const rules[] = {
        {"rate", 1, 1u << 20, &info->audio.rate, "audio rate out of range"},
        {"mels", 1, 1024, &info->audio.mels, "audio mels out of range"},
        {"window", 2, 1u << 16, &info->audio.window, "audio window out of range"},
        {"hop", 1, 1u << 16, &info->audio.hop, "audio hop out of range"},
        {"patch_frames", 1, 1u << 16, &info->audio.patch_frames, "audio patch_frames out of range"},
        {"max_patches", 1, 1u << 20, &info->audio.max_patches, "audio max_patches out of range"},
    };
    status = read_sizes(tower, rules, ARRAY_COUNT(rules), message);
    if (status != UFORM_OK) return status;
    json_t const *seconds = json_object_get(tower, "seconds");
    if (!json_is_number(seconds)) return malformed(message, "audio seconds out of range");
    info->audio.seconds = json_number_value(seconds);
    if (!(info->audio.seconds > 0 && info->audio.seconds <= 86400))
        return malformed(message, "audio seconds out of range");
    return UFORM_OK;
}

static uform_status_t parse_matryoshka(json_t const *value, uform_model_info_t *info, char const **message) {
    if (!json_is_array(value) || json_array_size(value) == 0 || json_array_size(value) > UFORM_MATRYOSHKA_MAX)
        return malformed(message, "matryoshka malformed");
    info->matryoshka_count = json_array_size(value);
    for (size_t i = 0; i < info->matryoshka_count; i++) {
        json_t const *width = json_array_get(value, i);
        if (!json_is_integer(width) || json_integer_value(width) < 1 ||
            (uint64_t)json_integer_value(width) > info->dims)
            return malformed(message, "matryoshka width out of range");
        info->matryoshka[i] = (size_t)json_integer_value(width);
        if (i > 0 && info->matryoshka[i] <= info->matryoshka[i - 1])
            return malformed(message, "matryoshka widths not ascending");
    }
    return UFORM_OK;
}

/* A tower's entry: absent, or an object handed to its parser. */
static uform_status_t parse_tower(json_t const *model, char const *key, bool *present,
                                  uform_status_t (*parse)(json_t const *, uform_model_info_t *,
                                                          char const **),
                                  uform_model_info_t *info, char const **message) {
    json_t const *tower = json_object_get(model, key);
    *present = tower != NULL;
    if (!tower) return UFORM_OK;
    if (!json_is_object(tower)) return malformed(message, "tower metadata is not an object");
    return parse(tower, info, message);
}

/* The tokenizer of a text tower that reads tokens: its tokenizer.json text, required there and only there;
 * and its prompts, an object of strings, with the default prompt one of their names. */
static uform_status_t parse_tokenizer(json_t const *model, uform_model_info_t const *info,
                                      checkpoint_header_t *header, char const **message) {
    json_t const *text = json_object_get(model, "tokenizer");
    json_t const *prompts = json_object_get(model, "prompts"),
                 *chosen = json_object_get(model, "default_prompt");
    if (!text && !info->text.vocab && !prompts && !chosen) return UFORM_OK;
    if (!json_is_string(text) || !info->has_text || !info->text.vocab)
        return malformed(message, "tokenizer goes with, and only with, a text tower that reads tokens");
    if (prompts) {
        char const *key;
        json_t const *value;
        if (!json_is_object(prompts)) return malformed(message, "prompts is not an object of strings");
        json_object_foreach((json_t *)prompts, key, value) {
            if (!json_is_string(value)) return malformed(message, "prompts is not an object of strings");
        }
    }
    if (chosen &&
        (!json_is_string(chosen) || !prompts || !json_object_get(prompts, json_string_value(chosen))))
        return malformed(message, "default_prompt is not one of the prompts");
    header->tokenizer = strdup(json_string_value(text));
    header->prompts = prompts ? json_deep_copy(prompts) : NULL;
    header->default_prompt = chosen ? strdup(json_string_value(chosen)) : NULL;
    if (!header->tokenizer || (prompts && !header->prompts) || (chosen && !header->default_prompt))
        return answer(UFORM_OUT_OF_MEMORY, message, "out of memory");
    return UFORM_OK;
}

static uform_status_t parse_model(json_t const *model, uform_model_info_t *info, checkpoint_header_t *header,
                                  char const **message) {
    if (!json_is_object(model)) return malformed(message, "uform metadata is not an object");
    json_t const *format = json_object_get(model, "format");
    if (!json_is_integer(format) || json_integer_value(format) != MODEL_FORMAT)
        return malformed(message, "metadata of another format");
    size_rule_t const rules[] = {{"dims", 1, 65536, &info->dims, "dims out of range"}};
    uform_status_t status = read_sizes(model, rules, ARRAY_COUNT(rules), message);
    if (status == UFORM_OK) status = variant_parse_model(model, info, message);
    if (status == UFORM_OK) status = parse_matryoshka(json_object_get(model, "matryoshka"), info, message);
    if (status == UFORM_OK) status = parse_tower(model, "text", &info->has_text, parse_text, info, message);
    if (status == UFORM_OK)
        status = parse_tower(model, "image", &info->has_image, parse_image, info, message);
    if (status == UFORM_OK)
        status = parse_tower(model, "video", &info->has_video, parse_video, info, message);
    if (status == UFORM_OK)
        status = parse_tower(model, "audio", &info->has_audio, parse_audio, info, message);
    if (status != UFORM_OK) return status;
    if (info->has_video && !info->has_image) return malformed(message, "video needs the image tower");
    if (!info->has_text && !info->has_image && !info->has_audio)
        return malformed(message, "model has no tower");
    uform_transformer_info_t const *towers[] = {&info->text.transformer, &info->image.transformer,
                                                &info->audio.transformer};
    bool const present[] = {info->has_text, info->has_image, info->has_audio};
    for (size_t i = 0; i < 3; ++i)
        if (present[i] && !towers[i]->projection && info->dims != towers[i]->hidden)
            return malformed(message, "a tower without projection whose hidden is not dims");
    return parse_tokenizer(model, info, header, message);
}

/* `__metadata__` is an object of strings (safetensors); its "uform" entry is the model, as a string
 * holding a JSON object or, leniently, as the object itself. */
static uform_status_t parse_metadata(json_t *metadata, uform_model_info_t *info, checkpoint_header_t *header,
                                     char const **message) {
    if (!metadata) return malformed(message, "missing uform metadata");
    if (!json_is_object(metadata)) return malformed(message, "metadata is not an object of strings");
    char const *key;
    json_t *value;
    json_object_foreach(metadata, key, value) {
        if (!json_is_string(value) && strcmp(key, MODEL_KEY) != 0)
            return malformed(message, "metadata is not an object of strings");
    }
    json_t *model = json_object_get(metadata, MODEL_KEY);
    if (!model) return malformed(message, "missing uform metadata");
    if (!json_is_string(model)) return parse_model(model, info, header, message);
    json_t *loaded = NULL;
    uform_status_t status = load_json(json_string_value(model), json_string_length(model),
                                      "uform metadata is not JSON", &loaded, message);
    if (status != UFORM_OK) return status;
    status = parse_model(loaded, info, header, message);
    json_decref(loaded);
    return status;
}

/* ---------------------------------------------------------------------------------------------- */
/* The tensors of format 4                                                                        */
/* ---------------------------------------------------------------------------------------------- */

typedef struct schema_walk {
    int (*visit)(checkpoint_schema_tensor_t const *tensor, void *context);
    void *context;
    int answer;
} schema_walk_t;

/* One tensor of `tower` (NULL: the model's own), `{tower}.{suffix}` or `suffix` alone, unless an earlier
 * one stopped the walk. */
static void schema_visit(schema_walk_t *walk, char const *tower, char const *suffix, checkpoint_part_t part,
                         checkpoint_role_t role, uint64_t rows, uint64_t columns) {
    if (walk->answer) return;
    checkpoint_schema_tensor_t tensor = {
        .tower = tower, .part = part, .rank = columns ? 2 : 1, .shape = {rows, columns}, .role = role};
    snprintf(tensor.name, sizeof tensor.name, "%s%s%s", tower ? tower : "", tower ? "." : "", suffix);
    walk->answer = walk->visit(&tensor, walk->context);
}

/* A tower's blocks, final norm and projection. */
static void schema_trunk(schema_walk_t *walk, char const *tower, uform_transformer_info_t const *transformer,
                         uint64_t dims) {
    uint64_t const hidden = transformer->hidden, mlp = transformer->mlp;
    struct {
        char const *suffix;
        checkpoint_part_t part;
        checkpoint_role_t role;
        uint64_t rows, columns;
    } const block[] = {
        {"norm1.weight", CHECKPOINT_PART_NORM1, CHECKPOINT_ROLE_NORM, hidden, 0},
        {"norm1.bias", CHECKPOINT_PART_NORM1_BIAS, CHECKPOINT_ROLE_BIAS, hidden, 0},
        {"norm2.weight", CHECKPOINT_PART_NORM2, CHECKPOINT_ROLE_NORM, hidden, 0},
        {"norm2.bias", CHECKPOINT_PART_NORM2_BIAS, CHECKPOINT_ROLE_BIAS, hidden, 0},
        {"attn.qkv.weight", CHECKPOINT_PART_QKV_WEIGHT, CHECKPOINT_ROLE_WEIGHT, 3 * hidden, hidden},
        {"attn.qkv.bias", CHECKPOINT_PART_QKV_BIAS, CHECKPOINT_ROLE_BIAS, 3 * hidden, 0},
        {"attn.out.weight", CHECKPOINT_PART_OUT_WEIGHT, CHECKPOINT_ROLE_WEIGHT, hidden, hidden},
        {"attn.out.bias", CHECKPOINT_PART_OUT_BIAS, CHECKPOINT_ROLE_BIAS, hidden, 0},
        {"mlp.up.weight", CHECKPOINT_PART_UP_WEIGHT, CHECKPOINT_ROLE_WEIGHT, mlp, hidden},
        {"mlp.up.bias", CHECKPOINT_PART_UP_BIAS, CHECKPOINT_ROLE_BIAS, mlp, 0},
        {"mlp.down.weight", CHECKPOINT_PART_DOWN_WEIGHT, CHECKPOINT_ROLE_WEIGHT, hidden, mlp},
        {"mlp.down.bias", CHECKPOINT_PART_DOWN_BIAS, CHECKPOINT_ROLE_BIAS, hidden, 0},
    };
    bool const biased = transformer->norm == UFORM_NORM_LAYER;
    char suffix[48];
    for (size_t i = 0; i < transformer->depth; i++)
        for (size_t j = 0; j < ARRAY_COUNT(block) && !walk->answer; j++) {
            if (!biased &&
                (block[j].part == CHECKPOINT_PART_NORM1_BIAS || block[j].part == CHECKPOINT_PART_NORM2_BIAS))
                continue;
            checkpoint_schema_tensor_t tensor = {.tower = tower,
                                                 .part = block[j].part,
                                                 .block = i,
                                                 .rank = block[j].columns ? 2 : 1,
                                                 .shape = {block[j].rows, block[j].columns},
                                                 .role = block[j].role};
            snprintf(suffix, sizeof suffix, "blocks.%zu.%s", i, block[j].suffix);
            snprintf(tensor.name, sizeof tensor.name, "%s.%s", tower, suffix);
            walk->answer = walk->visit(&tensor, walk->context);
        }
    if (transformer->final_norm) {
        schema_visit(walk, tower, "norm.weight", CHECKPOINT_PART_NORM, CHECKPOINT_ROLE_NORM, hidden, 0);
        if (biased)
            schema_visit(walk, tower, "norm.bias", CHECKPOINT_PART_NORM_BIAS, CHECKPOINT_ROLE_BIAS, hidden,
                         0);
    }
    if (transformer->projection)
        schema_visit(walk, tower, "proj.weight", CHECKPOINT_PART_PROJ, CHECKPOINT_ROLE_WEIGHT, dims, hidden);
    if (transformer->projection_bias)
        schema_visit(walk, tower, "proj.bias", CHECKPOINT_PART_PROJ_BIAS, CHECKPOINT_ROLE_BIAS, dims, 0);
    if (transformer->pooling == UFORM_POOLING_HEAD) {
        struct {
            char const *suffix;
            checkpoint_part_t part;
            checkpoint_role_t role;
            uint64_t rows, columns;
        } const head[] = {
            {"head.probe", CHECKPOINT_PART_HEAD_PROBE, CHECKPOINT_ROLE_WEIGHT, hidden, 0},
            {"head.qkv.weight", CHECKPOINT_PART_HEAD_QKV_WEIGHT, CHECKPOINT_ROLE_WEIGHT, 3 * hidden, hidden},
            {"head.qkv.bias", CHECKPOINT_PART_HEAD_QKV_BIAS, CHECKPOINT_ROLE_BIAS, 3 * hidden, 0},
            {"head.out.weight", CHECKPOINT_PART_HEAD_OUT_WEIGHT, CHECKPOINT_ROLE_WEIGHT, hidden, hidden},
            {"head.out.bias", CHECKPOINT_PART_HEAD_OUT_BIAS, CHECKPOINT_ROLE_BIAS, hidden, 0},
            {"head.norm.weight", CHECKPOINT_PART_HEAD_NORM, CHECKPOINT_ROLE_NORM, hidden, 0},
            {"head.norm.bias", CHECKPOINT_PART_HEAD_NORM_BIAS, CHECKPOINT_ROLE_BIAS, hidden, 0},
            {"head.up.weight", CHECKPOINT_PART_HEAD_UP_WEIGHT, CHECKPOINT_ROLE_WEIGHT, mlp, hidden},
            {"head.up.bias", CHECKPOINT_PART_HEAD_UP_BIAS, CHECKPOINT_ROLE_BIAS, mlp, 0},
            {"head.down.weight", CHECKPOINT_PART_HEAD_DOWN_WEIGHT, CHECKPOINT_ROLE_WEIGHT, hidden, mlp},
            {"head.down.bias", CHECKPOINT_PART_HEAD_DOWN_BIAS, CHECKPOINT_ROLE_BIAS, hidden, 0},
        };
        for (size_t j = 0; j < ARRAY_COUNT(head); j++)
            if (biased || head[j].part != CHECKPOINT_PART_HEAD_NORM_BIAS)
                schema_visit(walk, tower, head[j].suffix, head[j].part, head[j].role, head[j].rows,
                             head[j].columns);
    }
    if (transformer->relative_buckets)
        schema_visit(walk, tower, "relative_bias", CHECKPOINT_PART_RELATIVE_BIAS, CHECKPOINT_ROLE_WEIGHT,
                     transformer->relative_buckets, transformer->heads);
    if (transformer->input_norm) {
        schema_visit(walk, tower, "input_norm.weight", CHECKPOINT_PART_INPUT_NORM, CHECKPOINT_ROLE_NORM,
                     hidden, 0);
        if (biased)
            schema_visit(walk, tower, "input_norm.bias", CHECKPOINT_PART_INPUT_NORM_BIAS,
                         CHECKPOINT_ROLE_BIAS, hidden, 0);
    }
}

/* The patch embedding [hidden, inputs] and its bias, the class token (where the tower has one) and the
 * positions, the class token's first: `patches` rows, plus one with a class token, plus one per register
 * token between them (each register's row is the token itself: registers have no position). */
static void schema_patches(schema_walk_t *walk, char const *tower,
                           uform_transformer_info_t const *transformer, uint64_t inputs, uint64_t patches) {
    uint64_t const hidden = transformer->hidden;
    schema_visit(walk, tower, "patch.weight", CHECKPOINT_PART_PATCH_WEIGHT, CHECKPOINT_ROLE_WEIGHT, hidden,
                 inputs);
    schema_visit(walk, tower, "patch.bias", CHECKPOINT_PART_PATCH_BIAS, CHECKPOINT_ROLE_BIAS, hidden, 0);
    if (transformer->class_token)
        schema_visit(walk, tower, "cls", CHECKPOINT_PART_CLS, CHECKPOINT_ROLE_WEIGHT, hidden, 0);
    schema_visit(walk, tower, "pos", CHECKPOINT_PART_POS, CHECKPOINT_ROLE_WEIGHT,
                 patches + (transformer->class_token ? 1 : 0) + transformer->registers, hidden);
}

/* One tower of `info`, when it has it: trunk, then input. */
static void schema_tower(schema_walk_t *walk, uform_model_info_t const *info, char const *tower) {
    if (info->has_text && strcmp(tower, "text") == 0) {
        uint64_t const hidden = info->text.transformer.hidden;
        schema_trunk(walk, "text", &info->text.transformer, info->dims);
        schema_visit(walk, "text", "embed", CHECKPOINT_PART_EMBED, CHECKPOINT_ROLE_WEIGHT,
                     info->text.vocab ? info->text.vocab : 257, hidden);
        if (info->text.positions)
            schema_visit(walk, "text", "positions", CHECKPOINT_PART_TEXT_POSITIONS, CHECKPOINT_ROLE_WEIGHT,
                         info->text.positions, hidden);
        if (info->text.token_type)
            schema_visit(walk, "text", "token_type", CHECKPOINT_PART_TOKEN_TYPE, CHECKPOINT_ROLE_WEIGHT,
                         hidden, 0);
    } else if (info->has_image && strcmp(tower, "image") == 0) {
        uint64_t const side = info->image.size / info->image.patch, patch = info->image.patch;
        schema_trunk(walk, "image", &info->image.transformer, info->dims);
        schema_patches(walk, "image", &info->image.transformer, 3 * patch * patch, side * side);
    } else if (info->has_audio && strcmp(tower, "audio") == 0) {
        schema_trunk(walk, "audio", &info->audio.transformer, info->dims);
        schema_patches(walk, "audio", &info->audio.transformer,
                       (uint64_t)info->audio.mels * info->audio.patch_frames,
                       (uint64_t)info->audio.max_patches);
    }
}

int checkpoint_schema_tower(uform_model_info_t const *info, char const *tower,
                            int (*visit)(checkpoint_schema_tensor_t const *tensor, void *context),
                            void *context) {
    schema_walk_t walk = {visit, context, 0};
    schema_tower(&walk, info, tower);
    return walk.answer;
}

int checkpoint_schema_each(uform_model_info_t const *info,
                           int (*visit)(checkpoint_schema_tensor_t const *tensor, void *context),
                           void *context) {
    schema_walk_t walk = {visit, context, 0};
    schema_tower(&walk, info, "text");
    schema_tower(&walk, info, "image");
    schema_tower(&walk, info, "audio");
    if (info->has_logit) {
        schema_visit(&walk, NULL, LOGIT_SCALE, CHECKPOINT_PART_LOGIT_SCALE, CHECKPOINT_ROLE_LOGIT_SCALE, 1,
                     0);
        schema_visit(&walk, NULL, LOGIT_BIAS, CHECKPOINT_PART_LOGIT_BIAS, CHECKPOINT_ROLE_LOGIT_BIAS, 1, 0);
    }
    return walk.answer;
}

/* ---------------------------------------------------------------------------------------------- */
/* The tensors a header must hold                                                                 */
/* ---------------------------------------------------------------------------------------------- */

typedef struct expectation {
    checkpoint_header_t const *header;
    size_t matched; /* tensors found as expected */
    size_t scales;  /* values of the I8 weights' scales among them, which are not parameters */
    char const **message;
    uform_status_t status;
} expectation_t;

/* A block's linear weight: attn.qkv, attn.out, mlp.up or mlp.down. */
static bool block_weight(checkpoint_part_t part) {
    return part == CHECKPOINT_PART_QKV_WEIGHT || part == CHECKPOINT_PART_OUT_WEIGHT ||
           part == CHECKPOINT_PART_UP_WEIGHT || part == CHECKPOINT_PART_DOWN_WEIGHT;
}

bool checkpoint_quantizable(checkpoint_schema_tensor_t const *tensor) {
    return block_weight(tensor->part) && tensor->shape[1] <= CHECKPOINT_I8_INPUTS_MAX;
}

/* The scales of the I8 weight `expected` are there, F32 [out], and counted; else the fault. */
static char const *expect_scales(expectation_t *expectation, checkpoint_schema_tensor_t const *expected) {
    char name[sizeof expected->name + sizeof CHECKPOINT_SCALE_SUFFIX];
    snprintf(name, sizeof name, "%s%s", expected->name, CHECKPOINT_SCALE_SUFFIX);
    checkpoint_tensor_t const *scales = checkpoint_find(expectation->header, name);
    if (!scales) return "I8 weight without its scales";
    if (scales->dtype != CHECKPOINT_F32 || scales->rank != 1 || scales->shape[0] != expected->shape[0])
        return "I8 weight's scales are not F32 [out]";
    expectation->matched++;
    expectation->scales += expected->shape[0];
    return NULL;
}

/* The tensor's dtype is one its part allows; else the fault. */
static char const *expect_dtype(checkpoint_schema_tensor_t const *expected,
                                checkpoint_tensor_t const *tensor) {
    bool const f32_allowed =
        expected->role == CHECKPOINT_ROLE_LOGIT_SCALE || expected->role == CHECKPOINT_ROLE_LOGIT_BIAS;
    if (tensor->dtype == CHECKPOINT_BF16 || (f32_allowed && tensor->dtype == CHECKPOINT_F32)) return NULL;
    if (tensor->dtype == CHECKPOINT_I8 && block_weight(expected->part))
        return checkpoint_quantizable(expected) ? NULL : "I8 weight of more than 65536 inputs";
    return f32_allowed                    ? "tensor dtype is not BF16 or F32"
           : block_weight(expected->part) ? "tensor dtype is not BF16 or I8"
                                          : "tensor dtype is not BF16";
}

/* The tensor is there with a dtype its part allows (BF16; F32 for the logit parameters; I8 with its
 * scales for a block's linear weight) and that shape, and counted. */
static int expect_tensor(checkpoint_schema_tensor_t const *expected, void *context) {
    expectation_t *expectation = context;
    checkpoint_tensor_t const *tensor = checkpoint_find(expectation->header, expected->name);
    char const *fault = tensor ? expect_dtype(expected, tensor) : "missing tensor";
    if (!fault && tensor->rank != expected->rank) fault = "tensor shape does not match the metadata";
    for (size_t i = 0; !fault && i < expected->rank; i++)
        if (tensor->shape[i] != expected->shape[i]) fault = "tensor shape does not match the metadata";
    if (!fault && tensor->dtype == CHECKPOINT_I8) fault = expect_scales(expectation, expected);
    if (fault) {
        expectation->status = malformed(expectation->message, fault);
        return 1;
    }
    expectation->matched++;
    return 0;
}

/* Every tensor the metadata implies is there, and nothing else: names are unique, so the matches
 * must account for the whole table. logit.scale and logit.bias are optional, both or neither. */
static uform_status_t check_tensors(checkpoint_header_t *header, char const **message) {
    bool const scale = checkpoint_find(header, LOGIT_SCALE) != NULL,
               bias = checkpoint_find(header, LOGIT_BIAS) != NULL;
    if (scale != bias) return malformed(message, "logit.scale and logit.bias go together");
    header->info.has_logit = scale;
    expectation_t expectation = {header, 0, 0, message, UFORM_OK};
    if (checkpoint_schema_each(&header->info, expect_tensor, &expectation)) return expectation.status;
    if (expectation.matched != header->tensors_count) return malformed(message, "unexpected tensor");
    header->info.parameters -= expectation.scales;
    return UFORM_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* Parsing                                                                                        */
/* ---------------------------------------------------------------------------------------------- */

/* The safetensors container alone (checkpoint_parse_tensors), or with the format-4 metadata. */
static uform_status_t parse_header(char const *json, size_t length, uint64_t file_size, bool metadata,
                                   checkpoint_header_t *header, char const **message) {
    checkpoint_header_t parsed = {0};
    json_t *root = NULL;
    uform_status_t status = UFORM_OK;
    memset(header, 0, sizeof *header);
    if (file_size < CHECKPOINT_PREFIX_SIZE || length > file_size - CHECKPOINT_PREFIX_SIZE) {
        status = malformed(message, "header length beyond the file");
        goto fail;
    }
    parsed.data_offset = CHECKPOINT_PREFIX_SIZE + (uint64_t)length;
    status = load_json(json, length, "header is not JSON", &root, message);
    if (status != UFORM_OK) goto fail;
    if (!json_is_object(root)) {
        status = malformed(message, "header is not a JSON object");
        goto fail;
    }
    status = collect_tensors(root, parsed.data_offset, file_size - parsed.data_offset, &parsed, message);
    if (status != UFORM_OK) goto fail;
    if (metadata)
        status = parse_metadata(json_object_get(root, METADATA_KEY), &parsed.info, &parsed, message);
    if (status != UFORM_OK) goto fail;
    if (metadata) status = check_tensors(&parsed, message);
    if (status != UFORM_OK) goto fail;
    json_decref(root);
    *header = parsed;
    return UFORM_OK;
fail:
    json_decref(root);
    checkpoint_header_free(&parsed);
    return status;
}

uform_status_t checkpoint_parse(char const *json, size_t length, uint64_t file_size,
                                checkpoint_header_t *header, char const **message) {
    return parse_header(json, length, file_size, true, header, message);
}

uform_status_t checkpoint_parse_tensors(char const *json, size_t length, uint64_t file_size,
                                        checkpoint_header_t *header, char const **message) {
    return parse_header(json, length, file_size, false, header, message);
}

void checkpoint_header_free(checkpoint_header_t *header) {
    if (!header) return;
    free(header->tensors);
    free(header->names);
    free(header->tokenizer);
    json_decref(header->prompts);
    free(header->default_prompt);
    memset(header, 0, sizeof *header);
}

checkpoint_tensor_t const *checkpoint_find(checkpoint_header_t const *header, char const *name) {
    if (!header || !name || header->tensors_count == 0) return NULL;
    checkpoint_tensor_t const key = {.name = name};
    return bsearch(&key, header->tensors, header->tensors_count, sizeof key, compare_by_name);
}

/* ---------------------------------------------------------------------------------------------- */
/* Writing the format-4 metadata                                                                  */
/* ---------------------------------------------------------------------------------------------- */

double const checkpoint_clip_mean[3] = {0.48145466, 0.4578275, 0.40821073};
double const checkpoint_clip_std[3] = {0.26862954, 0.26130258, 0.27577711};

/* Three reals, each with CLIP's digits where it is CLIP's value as an F32. */
static json_t *triple_entry(float const triple[3], double const clip[3]) {
    double values[3];
    for (size_t i = 0; i < 3; i++)
        values[i] = triple[i] == (float)clip[i] ? clip[i] : (double)triple[i];
    return json_pack("[f, f, f]", values[0], values[1], values[2]);
}

/* {depth, hidden, heads, mlp}: what every transformer tower's object starts with. */
#define TRANSFORMER_FORMAT "s:I, s:I, s:I, s:I"
#define TRANSFORMER_VALUES(transformer)                                                                      \
    "depth", (json_int_t)(transformer).depth, "hidden", (json_int_t)(transformer).hidden, "heads",           \
        (json_int_t)(transformer).heads, "mlp", (json_int_t)(transformer).mlp

/* Each tower's object, or NULL when out of memory. json_pack takes the references of "o" values whether
 * or not it succeeds, so a failure leaks nothing. */
/* A tower's object with its block's settings where they are not the engine's own; NULL when out of
 * memory. */
static json_t *with_variant(json_t *tower, uform_transformer_info_t const *transformer, bool text) {
    if (tower && !variant_write(tower, transformer, text)) {
        json_decref(tower);
        return NULL;
    }
    return tower;
}

static json_t *text_entry(uform_model_info_t const *info) {
    json_t *tower =
        with_variant(json_pack("{" TRANSFORMER_FORMAT ", s:I}", TRANSFORMER_VALUES(info->text.transformer),
                               "context", (json_int_t)info->text.context),
                     &info->text.transformer, true);
    if (tower && !variant_write_text(tower, info)) {
        json_decref(tower);
        return NULL;
    }
    return tower;
}

static json_t *image_entry(uform_model_info_t const *info) {
    json_t *tower = with_variant(
        json_pack("{" TRANSFORMER_FORMAT ", s:I, s:I, s:o, s:o}", TRANSFORMER_VALUES(info->image.transformer),
                  "size", (json_int_t)info->image.size, "patch", (json_int_t)info->image.patch, "mean",
                  triple_entry(info->image.mean, checkpoint_clip_mean), "std",
                  triple_entry(info->image.std, checkpoint_clip_std)),
        &info->image.transformer, false);
    if (tower && !variant_write_image(tower, info)) {
        json_decref(tower);
        return NULL;
    }
    return tower;
}

static json_t *video_entry(uform_model_info_t const *info) {
    return json_pack("{s:I}", "frames", (json_int_t)info->video.frames);
}

static json_t *audio_entry(uform_model_info_t const *info) {
    return with_variant(
        json_pack("{" TRANSFORMER_FORMAT ", s:I, s:I, s:I, s:I, s:I, s:f, s:I}",
                  TRANSFORMER_VALUES(info->audio.transformer), "rate", (json_int_t)info->audio.rate, "mels",
                  (json_int_t)info->audio.mels, "window", (json_int_t)info->audio.window, "hop",
                  (json_int_t)info->audio.hop, "patch_frames", (json_int_t)info->audio.patch_frames,
                  "seconds", info->audio.seconds, "max_patches", (json_int_t)info->audio.max_patches),
        &info->audio.transformer, false);
}

#undef TRANSFORMER_FORMAT
#undef TRANSFORMER_VALUES

char *checkpoint_metadata_text(uform_model_info_t const *info, checkpoint_header_t const *header) {
    char const *tokenizer = header ? header->tokenizer : NULL;
    json_t *prompts = header ? header->prompts : NULL;
    char const *chosen = header ? header->default_prompt : NULL;
    json_t *matryoshka = json_array();
    for (size_t i = 0; matryoshka && i < info->matryoshka_count; i++) {
        if (json_array_append_new(matryoshka, json_integer((json_int_t)info->matryoshka[i])) != 0) {
            json_decref(matryoshka);
            matryoshka = NULL;
        }
    }
    json_t *model = json_pack("{s:i, s:I, s:o}", "format", MODEL_FORMAT, "dims", (json_int_t)info->dims,
                              "matryoshka", matryoshka);
    if (model && (!variant_write_model(model, info) ||
                  (tokenizer && json_object_set_new(model, "tokenizer", json_string(tokenizer)) != 0) ||
                  (prompts && json_object_set(model, "prompts", prompts) != 0) ||
                  (chosen && json_object_set_new(model, "default_prompt", json_string(chosen)) != 0))) {
        json_decref(model);
        model = NULL;
    }
    struct {
        bool present;
        char const *key;
        json_t *(*entry)(uform_model_info_t const *info);
    } const towers[] = {
        {info->has_text, "text", text_entry},
        {info->has_image, "image", image_entry},
        {info->has_video, "video", video_entry},
        {info->has_audio, "audio", audio_entry},
    };
    for (size_t i = 0; model && i < ARRAY_COUNT(towers); i++) {
        if (towers[i].present && json_object_set_new(model, towers[i].key, towers[i].entry(info)) != 0) {
            json_decref(model);
            model = NULL;
        }
    }
    if (!model) return NULL;
    char *dumped = json_dumps(model, JSON_COMPACT | JSON_REAL_PRECISION(9));
    json_decref(model);
    return dumped;
}

/* ---------------------------------------------------------------------------------------------- */
/* Writing                                                                                        */
/* ---------------------------------------------------------------------------------------------- */

/* Tensor names written here are printable ASCII, which JSON takes as is. */
static bool valid_name(char const *name) {
    if (!name || name[0] == '\0' || strlen(name) > CHECKPOINT_NAME_LIMIT || strcmp(name, METADATA_KEY) == 0)
        return false;
    for (char const *c = name; *c; c++)
        if (*c < 0x20 || *c > 0x7e) return false;
    return true;
}

/* Checks a source and answers its byte count. */
static uform_status_t check_source(checkpoint_source_t const *source, uint64_t *bytes, char const **message) {
    if (!valid_name(source->name)) return answer(UFORM_INVALID_ARGUMENT, message, "tensor name invalid");
    if (checkpoint_dtype_size(source->dtype) == 0)
        return answer(UFORM_INVALID_ARGUMENT, message, "tensor dtype invalid");
    if (source->rank > CHECKPOINT_RANK_LIMIT)
        return answer(UFORM_INVALID_ARGUMENT, message, "tensor rank over 4");
    uint64_t elements = 0;
    if (!count_shape(source->rank, source->shape, checkpoint_dtype_size(source->dtype), &elements, bytes) ||
        (uint64_t)(size_t)*bytes != *bytes || *bytes > (uint64_t)INT64_MAX)
        return answer(UFORM_INVALID_ARGUMENT, message, "tensor shape overflows");
    for (size_t i = 0; i < source->rank; i++)
        if (source->shape[i] > (uint64_t)INT64_MAX)
            return answer(UFORM_INVALID_ARGUMENT, message, "tensor shape overflows");
    if (*bytes > 0 && !source->data) return answer(UFORM_INVALID_ARGUMENT, message, "tensor data is NULL");
    return UFORM_OK;
}

/* {"dtype", "shape", "data_offsets"} of one source placed at `begin`. */
static json_t *tensor_entry(checkpoint_source_t const *source, uint64_t begin, uint64_t end) {
    json_t *shape = json_array();
    for (size_t i = 0; shape && i < source->rank; i++) {
        if (json_array_append_new(shape, json_integer((json_int_t)source->shape[i])) != 0) {
            json_decref(shape);
            shape = NULL;
        }
    }
    if (!shape) return NULL;
    return json_pack("{s:s, s:o, s:[I, I]}", "dtype", checkpoint_dtype_name(source->dtype), "shape", shape,
                     "data_offsets", (json_int_t)begin, (json_int_t)end);
}

/* The metadata must itself be a JSON object: it is stored as a string and parsed back on load. */
static uform_status_t metadata_entry(char const *metadata, json_t **entry, char const **message) {
    json_t *parsed = NULL;
    uform_status_t status = load_json(metadata, strlen(metadata), "metadata is not JSON", &parsed, message);
    if (status == UFORM_FORMAT) status = UFORM_INVALID_ARGUMENT;
    if (status != UFORM_OK) return status;
    bool object = json_is_object(parsed);
    json_decref(parsed);
    if (!object) return answer(UFORM_INVALID_ARGUMENT, message, "metadata is not a JSON object");
    *entry = json_pack("{s:s}", MODEL_KEY, metadata);
    if (!*entry) return answer(UFORM_OUT_OF_MEMORY, message, "out of memory");
    return UFORM_OK;
}

/* The header object: tensors in the order given with consecutive offsets, then the metadata. */
static uform_status_t header_object(char const *metadata, checkpoint_source_t const *tensors, size_t count,
                                    json_t **header, char const **message) {
    json_t *root = json_object();
    uform_status_t status = root ? UFORM_OK : answer(UFORM_OUT_OF_MEMORY, message, "out of memory");
    uint64_t offset = 0;
    for (size_t i = 0; i < count && status == UFORM_OK; i++) {
        uint64_t bytes = 0;
        status = check_source(&tensors[i], &bytes, message);
        if (status != UFORM_OK) break;
        if (json_object_get(root, tensors[i].name)) {
            status = answer(UFORM_INVALID_ARGUMENT, message, "duplicate tensor name");
        } else if (bytes > (uint64_t)INT64_MAX - offset) {
            status = answer(UFORM_INVALID_ARGUMENT, message, "tensors too large");
        } else if (json_object_set_new(root, tensors[i].name,
                                       tensor_entry(&tensors[i], offset, offset + bytes))) {
            status = answer(UFORM_OUT_OF_MEMORY, message, "out of memory");
        }
        offset += bytes;
    }
    json_t *entry = NULL;
    if (status == UFORM_OK && metadata) status = metadata_entry(metadata, &entry, message);
    if (status == UFORM_OK && entry && json_object_set_new(root, METADATA_KEY, entry) != 0)
        status = answer(UFORM_OUT_OF_MEMORY, message, "out of memory");
    if (status != UFORM_OK) {
        json_decref(root);
        return status;
    }
    *header = root;
    return UFORM_OK;
}

/* The header text padded with spaces so that the data section starts 8-byte aligned. */
static uform_status_t header_text(json_t const *header, char **text, size_t *length, char const **message) {
    char *dumped = json_dumps(header, JSON_COMPACT);
    if (!dumped) return answer(UFORM_OUT_OF_MEMORY, message, "out of memory");
    size_t dumped_length = strlen(dumped);
    size_t padded = (dumped_length + CHECKPOINT_ALIGNMENT - 1) / CHECKPOINT_ALIGNMENT * CHECKPOINT_ALIGNMENT;
    if (padded > CHECKPOINT_HEADER_LIMIT) {
        free(dumped);
        return answer(UFORM_INVALID_ARGUMENT, message, "checkpoint header over 100 MiB");
    }
    char *grown = realloc(dumped, padded + 1);
    if (!grown) {
        free(dumped);
        return answer(UFORM_OUT_OF_MEMORY, message, "out of memory");
    }
    memset(grown + dumped_length, ' ', padded - dumped_length);
    grown[padded] = '\0';
    *text = grown;
    *length = padded;
    return UFORM_OK;
}

/* Writes all of `data`, resuming after short writes and interruptions. */
static bool write_all(int fd, void const *data, size_t size) {
    unsigned char const *cursor = data;
    while (size > 0) {
        ssize_t written = write(fd, cursor, size < (1u << 30) ? size : (1u << 30));
        if (written < 0 && errno == EINTR) continue;
        if (written <= 0) return false;
        cursor += written;
        size -= (size_t)written;
    }
    return true;
}

static bool write_contents(int fd, char const *header, size_t header_length,
                           checkpoint_source_t const *tensors, size_t count) {
    uint8_t prefix[CHECKPOINT_PREFIX_SIZE];
    for (size_t i = 0; i < CHECKPOINT_PREFIX_SIZE; i++)
        prefix[i] = (uint8_t)((uint64_t)header_length >> (8 * i));
    if (!write_all(fd, prefix, sizeof prefix) || !write_all(fd, header, header_length)) return false;
    for (size_t i = 0; i < count; i++) {
        uint64_t elements = 0, bytes = 0;
        count_shape(tensors[i].rank, tensors[i].shape, checkpoint_dtype_size(tensors[i].dtype), &elements,
                    &bytes);
        if (!write_all(fd, tensors[i].data, (size_t)bytes)) return false;
    }
    return true;
}

/* Makes the rename durable. Filesystems that cannot sync a directory answer EINVAL; that is no fault. */
/* Syncs the folder of `path`, its name written into `scratch` (strlen(path) + 2 bytes at least): nothing
 * is allocated once the file is in place, so that only the system can fail the sync. */
static bool sync_directory(char const *path, char *scratch) {
    char const *slash = strrchr(path, '/');
    size_t length = !slash ? 1 : slash == path ? 1 : (size_t)(slash - path);
    memcpy(scratch, slash ? path : ".", length);
    scratch[length] = '\0';
    int fd = open(scratch, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return false;
    bool synced = fsync(fd) == 0 || errno == EINVAL;
    return (close(fd) == 0 || errno == EINTR) && synced;
}

static uform_status_t write_file(char const *path, char const *header, size_t header_length,
                                 checkpoint_source_t const *tensors, size_t count, char const **message) {
    static char const suffix[] = ".tmp.XXXXXX";
    uform_status_t status = UFORM_IO;
    bool created = false;
    size_t path_length = strlen(path);
    char *temporary = malloc(path_length + sizeof suffix);
    if (!temporary) return answer(UFORM_OUT_OF_MEMORY, message, "out of memory");
    memcpy(temporary, path, path_length);
    memcpy(temporary + path_length, suffix, sizeof suffix);
#if UFORM_LINUX
    int fd = mkostemp(temporary, O_CLOEXEC);
#else
    /* POSIX 2008 has no mkostemp: the flag is set just after. */
    int fd = mkstemp(temporary);
    if (fd >= 0 && fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) {
        (void)close(fd);
        (void)unlink(temporary);
        fd = -1;
    }
#endif
    if (fd < 0) {
        *message = "cannot create a temporary checkpoint";
        goto fail;
    }
    created = true;
    /* mkostemp creates the file 0600; a checkpoint is meant to be read by others, as a plain file is. */
    if (fchmod(fd, 0644) != 0 || !write_contents(fd, header, header_length, tensors, count)) {
        *message = "cannot write checkpoint";
        goto fail;
    }
    if (fsync(fd) != 0) {
        *message = "cannot sync checkpoint";
        goto fail;
    }
    int closed = close(fd);
    fd = -1;
    /* After EINTR the descriptor is closed on Linux, and the data was already synced. */
    if (closed != 0 && errno != EINTR) {
        *message = "cannot close checkpoint";
        goto fail;
    }
    if (rename(temporary, path) != 0) {
        *message = "cannot rename checkpoint into place";
        goto fail;
    }
    status = sync_directory(path, temporary) ? UFORM_OK
                                             : answer(UFORM_IO, message, "cannot sync checkpoint directory");
    free(temporary);
    return status;
fail:
    if (fd >= 0) close(fd);
    if (created) unlink(temporary);
    free(temporary);
    return status;
}

uform_status_t checkpoint_write(char const *path, char const *metadata, checkpoint_source_t const *tensors,
                                size_t count, char const **message) {
    if (!path || path[0] == '\0') return answer(UFORM_INVALID_ARGUMENT, message, "checkpoint path is empty");
    if (!tensors && count > 0) return answer(UFORM_INVALID_ARGUMENT, message, "tensors are NULL");
    json_t *header = NULL;
    char *text = NULL;
    size_t length = 0;
    uform_status_t status = header_object(metadata, tensors, count, &header, message);
    if (status == UFORM_OK) status = header_text(header, &text, &length, message);
    if (status == UFORM_OK) status = write_file(path, text, length, tensors, count, message);
    json_decref(header);
    free(text);
    return status;
}
