/* Malformed checkpoints: a valid tiny checkpoint, edited one fault at a time. Most variants edit the
 * header as JSON (jansson) and re-serialize it with an adjusted prefix, keeping the data section as it
 * was; the rest are written byte by byte. */
#include "bad_checkpoints.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The first tensor of the tiny checkpoint's data section, at the odd offset make_odd_data_offset gives. */
#define ODD_OFFSET_MESSAGE                                                                                   \
    "tensor text.blocks.0.norm1.weight data at file offset 4649 is not aligned to its 2-byte dtype"

/* The valid checkpoint every variant starts from, and its header as JSON. */
typedef struct source_checkpoint {
    uint8_t *bytes;
    size_t size;
    size_t data_offset; /* 8 + header length */
    json_t *header;     /* with "__metadata__"."uform" still a string */
    json_t *model;      /* that string, parsed */
} source_checkpoint_t;

typedef struct buffer {
    uint8_t *data;
    size_t size;
} buffer_t;

/* Edits a copy of the header and of the model. An edit that sets `*model` to NULL has taken care of
 * `__metadata__` itself; otherwise the model is stored back as its string. */
typedef bool (*edit_t)(json_t *header, json_t **model, size_t data_size);

/* Makes the whole file, for faults JSON cannot express. */
typedef bool (*make_t)(source_checkpoint_t const *source, buffer_t *out);

typedef struct variant {
    char const *what;
    uform_status_t expected;
    char const *message;
    edit_t edit;
    make_t make;
    size_t extra; /* zero bytes appended to the data section, for tensors an edit adds */
} variant_t;

/* ---------------------------------------------------------------------------------------------- */
/* Assembling files                                                                               */
/* ---------------------------------------------------------------------------------------------- */

static void put_prefix(uint8_t *bytes, uint64_t header_length) {
    for (size_t i = 0; i < 8; i++)
        bytes[i] = (uint8_t)(header_length >> (8 * i));
}

/* prefix + header padded with spaces to a multiple of 8 + data + `extra` zero bytes. */
static bool assemble(char const *header, uint8_t const *data, size_t data_size, size_t extra, buffer_t *out) {
    size_t length = strlen(header), padded = (length + 7) / 8 * 8;
    out->size = 8 + padded + data_size + extra;
    out->data = calloc(1, out->size);
    if (!out->data) return false;
    put_prefix(out->data, padded);
    memcpy(out->data + 8, header, length);
    memset(out->data + 8 + length, ' ', padded - length);
    if (data_size > 0) memcpy(out->data + 8 + padded, data, data_size);
    return true;
}

static uint8_t const *source_data(source_checkpoint_t const *source) {
    return source->bytes + source->data_offset;
}

static size_t source_data_size(source_checkpoint_t const *source) {
    return source->size - source->data_offset;
}

/* The header text after `edit` (NULL: none), malloc'ed; NULL on failure. */
static char *edited_header(source_checkpoint_t const *source, edit_t edit) {
    json_t *header = json_deep_copy(source->header), *model = json_deep_copy(source->model);
    char *text = NULL, *model_text = NULL;
    if (!header || !model) goto done;
    if (edit && !edit(header, &model, source_data_size(source))) goto done;
    if (model) {
        model_text = json_dumps(model, JSON_COMPACT);
        json_t *metadata = json_object_get(header, "__metadata__");
        if (!model_text || json_object_set_new(metadata, "uform", json_string(model_text)) != 0) goto done;
    }
    text = json_dumps(header, JSON_COMPACT);
done:
    free(model_text);
    json_decref(model);
    json_decref(header);
    return text;
}

static bool make_edited(source_checkpoint_t const *source, edit_t edit, size_t extra, buffer_t *out) {
    char *header = edited_header(source, edit);
    bool made = header && assemble(header, source_data(source), source_data_size(source), extra, out);
    free(header);
    return made;
}

static bool copy_source(source_checkpoint_t const *source, size_t size, buffer_t *out) {
    out->size = size;
    out->data = malloc(size);
    if (!out->data) return false;
    memcpy(out->data, source->bytes, size);
    return true;
}

/* ---------------------------------------------------------------------------------------------- */
/* Faults in bytes                                                                                */
/* ---------------------------------------------------------------------------------------------- */

static bool make_empty(source_checkpoint_t const *source, buffer_t *out) {
    (void)source;
    out->data = NULL;
    out->size = 0;
    return true;
}

static bool make_truncated(source_checkpoint_t const *source, buffer_t *out) {
    return copy_source(source, source->data_offset + source_data_size(source) / 2, out);
}

static bool make_prefix(source_checkpoint_t const *source, uint64_t header_length, buffer_t *out) {
    if (!copy_source(source, source->size, out)) return false;
    put_prefix(out->data, header_length);
    return true;
}

/* The header one space longer, its tensors' offsets unchanged: the data section starts at an odd file
 * offset, so the first BF16 tensor's data is misaligned (the JSON still valid). */
static bool make_odd_data_offset(source_checkpoint_t const *source, buffer_t *out) {
    size_t const header_length = source->data_offset - 8 + 1;
    out->size = source->size + 1;
    out->data = malloc(out->size);
    if (!out->data) return false;
    put_prefix(out->data, header_length);
    memcpy(out->data + 8, source->bytes + 8, header_length - 1);
    out->data[8 + header_length - 1] = ' ';
    memcpy(out->data + 8 + header_length, source_data(source), source_data_size(source));
    return true;
}

static bool make_length_beyond(source_checkpoint_t const *source, buffer_t *out) {
    return make_prefix(source, source->size - 8 + 1, out);
}

static bool make_length_zero(source_checkpoint_t const *source, buffer_t *out) {
    return make_prefix(source, 0, out);
}

static bool make_length_over_cap(source_checkpoint_t const *source, buffer_t *out) {
    return make_prefix(source, UINT64_C(1) << 40, out);
}

static bool make_not_json(source_checkpoint_t const *source, buffer_t *out) {
    return assemble("{\"text.embed\": this is not JSON", source_data(source), source_data_size(source), 0,
                    out);
}

static bool make_not_object(source_checkpoint_t const *source, buffer_t *out) {
    return assemble("[1, 2, 3]", source_data(source), source_data_size(source), 0, out);
}

static bool make_prefix_only(source_checkpoint_t const *source, buffer_t *out) {
    return copy_source(source, 7, out);
}

/* The valid header with one tensor entry repeated in front: jansson cannot build that. */
static bool make_duplicate_key(source_checkpoint_t const *source, buffer_t *out) {
    char *header = edited_header(source, NULL);
    char *entry = json_dumps(json_object_get(source->header, "text.norm.weight"), JSON_COMPACT);
    static char const key[] = "{\"text.norm.weight\":";
    char *doubled = header && entry ? malloc(sizeof key + strlen(entry) + 1 + strlen(header)) : NULL;
    bool made = false;
    if (doubled) {
        snprintf(doubled, sizeof key + strlen(entry) + 1 + strlen(header), "%s%s,%s", key, entry, header + 1);
        made = assemble(doubled, source_data(source), source_data_size(source), 0, out);
        free(doubled);
    }
    free(entry);
    free(header);
    return made;
}

/* ---------------------------------------------------------------------------------------------- */
/* Faults in tensor entries                                                                       */
/* ---------------------------------------------------------------------------------------------- */

static bool set_field(json_t *header, char const *tensor, char const *field, json_t *value) {
    return json_object_set_new(json_object_get(header, tensor), field, value) == 0;
}

static bool edit_overlap(json_t *header, json_t **model, size_t data_size) {
    (void)model, (void)data_size;
    json_t *offsets = json_object_get(json_object_get(header, "text.blocks.0.norm1.weight"), "data_offsets");
    return set_field(header, "text.blocks.0.norm2.weight", "data_offsets", json_deep_copy(offsets));
}

static bool edit_beyond(json_t *header, json_t **model, size_t data_size) {
    (void)model;
    json_t *offsets = json_object_get(json_object_get(header, "text.norm.weight"), "data_offsets");
    json_int_t bytes =
        json_integer_value(json_array_get(offsets, 1)) - json_integer_value(json_array_get(offsets, 0));
    return set_field(header, "text.norm.weight", "data_offsets",
                     json_pack("[I, I]", (json_int_t)data_size, (json_int_t)data_size + bytes));
}

static bool edit_end_before_begin(json_t *header, json_t **model, size_t data_size) {
    (void)model, (void)data_size;
    return set_field(header, "text.norm.weight", "data_offsets", json_pack("[i, i]", 128, 0));
}

static bool edit_size_mismatch(json_t *header, json_t **model, size_t data_size) {
    (void)model, (void)data_size;
    return set_field(header, "text.norm.weight", "shape", json_pack("[i]", 32));
}

/* F32 of the same byte count, so that only the dtype is wrong. */
static bool edit_wrong_dtype(json_t *header, json_t **model, size_t data_size) {
    (void)model, (void)data_size;
    return set_field(header, "text.blocks.0.norm1.weight", "dtype", json_string("F32")) &&
           set_field(header, "text.blocks.0.norm1.weight", "shape", json_pack("[i]", 32));
}

static bool edit_logit_dtype(json_t *header, json_t **model, size_t data_size) {
    (void)model, (void)data_size;
    return set_field(header, "logit.scale", "dtype", json_string("I16"));
}

static bool edit_unknown_dtype(json_t *header, json_t **model, size_t data_size) {
    (void)model, (void)data_size;
    return set_field(header, "text.norm.weight", "dtype", json_string("Q4_K"));
}

static bool edit_shape_overflow(json_t *header, json_t **model, size_t data_size) {
    (void)model, (void)data_size;
    return set_field(header, "text.norm.weight", "shape",
                     json_pack("[I, I]", (json_int_t)1 << 32, (json_int_t)1 << 32));
}

static bool edit_negative_shape(json_t *header, json_t **model, size_t data_size) {
    (void)model, (void)data_size;
    return set_field(header, "text.norm.weight", "shape", json_pack("[i]", -64));
}

static bool edit_rank_over_4(json_t *header, json_t **model, size_t data_size) {
    (void)model, (void)data_size;
    return set_field(header, "text.norm.weight", "shape", json_pack("[i, i, i, i, i]", 1, 1, 1, 1, 64));
}

static bool edit_entry_not_object(json_t *header, json_t **model, size_t data_size) {
    (void)model, (void)data_size;
    return json_object_set_new(header, "text.norm.weight", json_string("BF16")) == 0;
}

/* Swaps the two dimensions: the same bytes, the wrong shape. */
static bool edit_metadata_shape(json_t *header, json_t **model, size_t data_size) {
    (void)model, (void)data_size;
    json_t *shape = json_object_get(json_object_get(header, "image.pos"), "shape");
    return set_field(header, "image.pos", "shape",
                     json_pack("[O, O]", json_array_get(shape, 1), json_array_get(shape, 0)));
}

static bool edit_missing_tensor(json_t *header, json_t **model, size_t data_size) {
    (void)model, (void)data_size;
    return json_object_del(header, "audio.pos") == 0;
}

static bool edit_missing_logit_bias(json_t *header, json_t **model, size_t data_size) {
    (void)model, (void)data_size;
    return json_object_del(header, "logit.bias") == 0;
}

/* A well-formed extra tensor over 8 zero bytes appended to the data section. */
static bool add_tensor(json_t *header, char const *name, size_t data_size) {
    json_t *entry = json_pack("{s:s, s:[i], s:[I, I]}", "dtype", "BF16", "shape", 4, "data_offsets",
                              (json_int_t)data_size, (json_int_t)data_size + 8);
    return json_object_set_new(header, name, entry) == 0;
}

static bool edit_unexpected_tensor(json_t *header, json_t **model, size_t data_size) {
    (void)model;
    return add_tensor(header, "text.extra.weight", data_size);
}

static bool edit_long_name(json_t *header, json_t **model, size_t data_size) {
    (void)model;
    char name[301];
    memset(name, 'x', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    return add_tensor(header, name, data_size);
}

/* text.blocks.0.attn.out.weight [64, 64] made I8: its first 4096 bytes, the rest of its BF16 bytes left
 * unnamed. */
static bool make_i8(json_t *header, char const *name) {
    json_t *offsets = json_object_get(json_object_get(header, name), "data_offsets");
    json_int_t begin = json_integer_value(json_array_get(offsets, 0));
    return set_field(header, name, "dtype", json_string("I8")) &&
           set_field(header, name, "data_offsets", json_pack("[I, I]", begin, begin + 64 * 64));
}

/* A tensor over `bytes` zero bytes appended to the data section. */
static bool add_sized(json_t *header, char const *name, char const *dtype, size_t count, size_t data_size) {
    json_t *entry =
        json_pack("{s:s, s:[I], s:[I, I]}", "dtype", dtype, "shape", (json_int_t)count, "data_offsets",
                  (json_int_t)data_size, (json_int_t)(data_size + count * (strcmp(dtype, "F32") ? 2 : 4)));
    return json_object_set_new(header, name, entry) == 0;
}

#define OUT_WEIGHT "text.blocks.0.attn.out.weight"

static bool edit_i8_without_scales(json_t *header, json_t **model, size_t data_size) {
    (void)model, (void)data_size;
    return make_i8(header, OUT_WEIGHT);
}

static bool edit_i8_scales_bf16(json_t *header, json_t **model, size_t data_size) {
    (void)model;
    return make_i8(header, OUT_WEIGHT) && add_sized(header, OUT_WEIGHT ".scale", "BF16", 64, data_size);
}

static bool edit_i8_scales_short(json_t *header, json_t **model, size_t data_size) {
    (void)model;
    return make_i8(header, OUT_WEIGHT) && add_sized(header, OUT_WEIGHT ".scale", "F32", 32, data_size);
}

static bool edit_scales_beside_bf16(json_t *header, json_t **model, size_t data_size) {
    (void)model;
    return add_sized(header, OUT_WEIGHT ".scale", "F32", 64, data_size);
}

static bool edit_i8_projection(json_t *header, json_t **model, size_t data_size) {
    (void)model, (void)data_size;
    return make_i8(header, "text.proj.weight");
}

/* F32 of the same byte count: the dtype is refused before the shape. */
static bool edit_f32_block_weight(json_t *header, json_t **model, size_t data_size) {
    (void)model, (void)data_size;
    return set_field(header, OUT_WEIGHT, "dtype", json_string("F32")) &&
           set_field(header, OUT_WEIGHT, "shape", json_pack("[i, i]", 64, 32));
}

static bool edit_i8_with_scales(json_t *header, json_t **model, size_t data_size) {
    (void)model;
    return make_i8(header, OUT_WEIGHT) && add_sized(header, OUT_WEIGHT ".scale", "F32", 64, data_size);
}

#undef OUT_WEIGHT

/* ---------------------------------------------------------------------------------------------- */
/* Faults in the metadata                                                                         */
/* ---------------------------------------------------------------------------------------------- */

static bool set_model(json_t *model, char const *tower, char const *key, json_t *value) {
    json_t *object = tower ? json_object_get(model, tower) : model;
    return json_object_set_new(object, key, value) == 0;
}

static bool edit_format_3(json_t *header, json_t **model, size_t data_size) {
    (void)header, (void)data_size;
    return set_model(*model, NULL, "format", json_integer(3));
}

static bool edit_metadata_missing(json_t *header, json_t **model, size_t data_size) {
    (void)data_size;
    json_decref(*model);
    *model = NULL;
    return json_object_del(header, "__metadata__") == 0;
}

static bool edit_metadata_not_json(json_t *header, json_t **model, size_t data_size) {
    (void)data_size;
    json_decref(*model);
    *model = NULL;
    return set_model(json_object_get(header, "__metadata__"), NULL, "uform", json_string("{\"format\": 4,"));
}

static bool edit_metadata_object(json_t *header, json_t **model, size_t data_size) {
    (void)data_size;
    json_t *object = *model;
    *model = NULL;
    return set_model(json_object_get(header, "__metadata__"), NULL, "uform", object);
}

static bool edit_metadata_number(json_t *header, json_t **model, size_t data_size) {
    (void)model, (void)data_size;
    return set_model(json_object_get(header, "__metadata__"), NULL, "note", json_integer(5));
}

static bool edit_heads(json_t *header, json_t **model, size_t data_size) {
    (void)header, (void)data_size;
    return set_model(*model, "text", "heads", json_integer(2));
}

static bool edit_hidden(json_t *header, json_t **model, size_t data_size) {
    (void)header, (void)data_size;
    return set_model(*model, "text", "heads", json_integer(3));
}

static bool edit_norm(json_t *header, json_t **model, size_t data_size) {
    (void)header, (void)data_size;
    return set_model(*model, "text", "norm", json_string("batch"));
}

static bool edit_layer_norm(json_t *header, json_t **model, size_t data_size) {
    (void)header, (void)data_size;
    return set_model(*model, "text", "norm", json_string("layer"));
}

static bool edit_relative_64(json_t *header, json_t **model, size_t data_size) {
    (void)header, (void)data_size;
    return set_model(*model, "text", "relative_buckets", json_integer(64));
}

static bool edit_relative_32(json_t *header, json_t **model, size_t data_size) {
    (void)header, (void)data_size;
    return set_model(*model, "text", "relative_buckets", json_integer(32));
}

static bool edit_relative_image(json_t *header, json_t **model, size_t data_size) {
    (void)header, (void)data_size;
    return set_model(*model, "image", "relative_buckets", json_integer(32));
}

static bool edit_vocab(json_t *header, json_t **model, size_t data_size) {
    (void)header, (void)data_size;
    return set_model(*model, "text", "vocab", json_integer(1000));
}

static bool edit_matryoshka_order(json_t *header, json_t **model, size_t data_size) {
    (void)header, (void)data_size;
    return set_model(*model, NULL, "matryoshka", json_pack("[i, i]", 64, 32));
}

static bool edit_matryoshka_wide(json_t *header, json_t **model, size_t data_size) {
    (void)header, (void)data_size;
    return set_model(*model, NULL, "matryoshka", json_pack("[i, i]", 32, 128));
}

static bool edit_dims_zero(json_t *header, json_t **model, size_t data_size) {
    (void)header, (void)data_size;
    return set_model(*model, NULL, "dims", json_integer(0));
}

static bool edit_std_zero(json_t *header, json_t **model, size_t data_size) {
    (void)header, (void)data_size;
    return set_model(*model, "image", "std", json_pack("[f, f, f]", 0.25, 0.0, 0.25));
}

static bool edit_std_tiny(json_t *header, json_t **model, size_t data_size) {
    (void)header, (void)data_size;
    return set_model(*model, "image", "std", json_pack("[f, f, f]", 0.25, 1e-45, 0.25));
}

static bool edit_mean_huge(json_t *header, json_t **model, size_t data_size) {
    (void)header, (void)data_size;
    return set_model(*model, "image", "mean", json_pack("[f, f, f]", 0.5, -3e38, 0.5));
}

static bool edit_image_size(json_t *header, json_t **model, size_t data_size) {
    (void)header, (void)data_size;
    return set_model(*model, "image", "size", json_integer(33));
}

static bool edit_audio_seconds(json_t *header, json_t **model, size_t data_size) {
    (void)header, (void)data_size;
    return set_model(*model, "audio", "seconds", json_real(-1.0));
}

static bool edit_tower_not_object(json_t *header, json_t **model, size_t data_size) {
    (void)header, (void)data_size;
    return set_model(*model, NULL, "audio", json_integer(5));
}

static bool edit_video_without_image(json_t *header, json_t **model, size_t data_size) {
    (void)header, (void)data_size;
    return json_object_del(*model, "image") == 0;
}

static bool edit_no_tower(json_t *header, json_t **model, size_t data_size) {
    (void)header, (void)data_size;
    return json_object_del(*model, "text") == 0 && json_object_del(*model, "image") == 0 &&
           json_object_del(*model, "video") == 0 && json_object_del(*model, "audio") == 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* The variants                                                                                   */
/* ---------------------------------------------------------------------------------------------- */

#define BYTES(what, message, make)                                                                           \
    { what, UFORM_FORMAT, message, NULL, make, 0 }
#define EDIT(what, message, edit)                                                                            \
    { what, UFORM_FORMAT, message, edit, NULL, 0 }

static variant_t const variants[] = {
    BYTES("empty file", "file too short for a checkpoint", make_empty),
    BYTES("7 bytes", "file too short for a checkpoint", make_prefix_only),
    BYTES("truncated in the data", "tensor data beyond the file", make_truncated),
    BYTES("header length beyond the file", "header length beyond the file", make_length_beyond),
    BYTES("header length 0", "checkpoint header is empty", make_length_zero),
    BYTES("header length over the cap", "checkpoint header over 100 MiB", make_length_over_cap),
    BYTES("header not JSON", "header is not JSON", make_not_json),
    BYTES("header not an object", "header is not a JSON object", make_not_object),
    BYTES("duplicate keys", "duplicate key in checkpoint JSON", make_duplicate_key),
    BYTES("data section at an odd offset", ODD_OFFSET_MESSAGE, make_odd_data_offset),
    EDIT("overlapping offsets", "tensors overlap", edit_overlap),
    EDIT("offsets beyond the file", "tensor data beyond the file", edit_beyond),
    EDIT("end before begin", "tensor data ends before it begins", edit_end_before_begin),
    EDIT("bytes do not match the shape", "tensor bytes do not match its shape", edit_size_mismatch),
    EDIT("F32 block weight", "tensor dtype is not BF16", edit_wrong_dtype),
    EDIT("I16 logit.scale", "tensor dtype is not BF16 or F32", edit_logit_dtype),
    EDIT("unknown dtype", "unknown tensor dtype", edit_unknown_dtype),
    EDIT("shape product overflows", "tensor shape overflows", edit_shape_overflow),
    EDIT("negative shape", "tensor shape malformed", edit_negative_shape),
    EDIT("rank 5", "tensor rank over 4", edit_rank_over_4),
    EDIT("tensor entry not an object", "tensor entry is not an object", edit_entry_not_object),
    EDIT("shape other than the metadata's", "tensor shape does not match the metadata", edit_metadata_shape),
    EDIT("missing tensor", "missing tensor", edit_missing_tensor),
    EDIT("logit.scale without logit.bias", "logit.scale and logit.bias go together", edit_missing_logit_bias),
    {"unexpected tensor", UFORM_FORMAT, "unexpected tensor", edit_unexpected_tensor, NULL, 8},
    EDIT("I8 block weight without its scales", "I8 weight without its scales", edit_i8_without_scales),
    {"I8 block weight with BF16 scales", UFORM_FORMAT, "I8 weight's scales are not F32 [out]",
     edit_i8_scales_bf16, NULL, 128},
    {"I8 block weight with 32 scales", UFORM_FORMAT, "I8 weight's scales are not F32 [out]",
     edit_i8_scales_short, NULL, 128},
    {"scales beside a BF16 weight", UFORM_FORMAT, "unexpected tensor", edit_scales_beside_bf16, NULL, 256},
    EDIT("I8 projection", "tensor dtype is not BF16", edit_i8_projection),
    EDIT("F32 block linear weight", "tensor dtype is not BF16 or I8", edit_f32_block_weight),
    {"I8 block weight with its scales (valid)", UFORM_OK, NULL, edit_i8_with_scales, NULL, 256},
    {"tensor name of 300 bytes", UFORM_FORMAT, "tensor name empty or over 255 bytes", edit_long_name, NULL,
     8},
    EDIT("metadata of format 3", "metadata of another format", edit_format_3),
    EDIT("metadata missing", "missing uform metadata", edit_metadata_missing),
    EDIT("metadata string not JSON", "uform metadata is not JSON", edit_metadata_not_json),
    EDIT("metadata value not a string", "metadata is not an object of strings", edit_metadata_number),
    EDIT("rotary heads not 64 wide", "rotary positions need heads of 64", edit_heads),
    EDIT("hidden not a multiple of heads", "tower hidden is not a multiple of heads", edit_hidden),
    EDIT("an unknown norm", "tower norm is not rms or layer", edit_norm),
    EDIT("LayerNorm without its biases", "missing tensor", edit_layer_norm),
    EDIT("relative positions of 64 buckets", "tower relative_buckets is not 0 or 32", edit_relative_64),
    EDIT("relative positions without their table", "missing tensor", edit_relative_32),
    EDIT("relative positions on an image tower", "relative positions are a text tower's",
         edit_relative_image),
    EDIT("a token vocabulary without a tokenizer",
         "tokenizer goes with, and only with, a text tower that reads tokens", edit_vocab),
    EDIT("matryoshka not ascending", "matryoshka widths not ascending", edit_matryoshka_order),
    EDIT("matryoshka wider than dims", "matryoshka width out of range", edit_matryoshka_wide),
    EDIT("dims 0", "dims out of range", edit_dims_zero),
    EDIT("image std 0", "image std malformed or out of range", edit_std_zero),
    EDIT("image std 1e-45", "image std malformed or out of range", edit_std_tiny),
    EDIT("image mean 3e38", "image mean malformed or out of range", edit_mean_huge),
    EDIT("image size not a multiple of patch", "image size is not a multiple of patch", edit_image_size),
    EDIT("audio seconds negative", "audio seconds out of range", edit_audio_seconds),
    EDIT("tower not an object", "tower metadata is not an object", edit_tower_not_object),
    EDIT("video without image", "video needs the image tower", edit_video_without_image),
    EDIT("no tower", "model has no tower", edit_no_tower),
    {"metadata as a JSON object (valid)", UFORM_OK, NULL, edit_metadata_object, NULL, 0},
};

#undef BYTES
#undef EDIT

#define VARIANTS_COUNT (sizeof variants / sizeof variants[0])
_Static_assert(VARIANTS_COUNT <= BAD_CHECKPOINTS_MAX, "raise BAD_CHECKPOINTS_MAX");

/* ---------------------------------------------------------------------------------------------- */
/* Files                                                                                          */
/* ---------------------------------------------------------------------------------------------- */

static bool read_file(char const *path, uint8_t **bytes, size_t *size) {
    FILE *file = fopen(path, "rb");
    if (!file) return false;
    bool read = false;
    long length = -1;
    if (fseek(file, 0, SEEK_END) == 0 && (length = ftell(file)) > 0 && fseek(file, 0, SEEK_SET) == 0) {
        *bytes = malloc((size_t)length);
        read = *bytes && fread(*bytes, 1, (size_t)length, file) == (size_t)length;
        *size = (size_t)length;
    }
    fclose(file);
    return read;
}

static bool write_file(char const *path, buffer_t const *buffer) {
    FILE *file = fopen(path, "wb");
    if (!file) return false;
    bool written = buffer->size == 0 || fwrite(buffer->data, 1, buffer->size, file) == buffer->size;
    return fclose(file) == 0 && written;
}

static void source_free(source_checkpoint_t *source) {
    free(source->bytes);
    json_decref(source->header);
    json_decref(source->model);
    memset(source, 0, sizeof *source);
}

/* Writes a tiny checkpoint (depth 1, hidden 64) beside the variants, reads it back and removes it. */
static bool source_load(char const *directory, source_checkpoint_t *source) {
    char path[512];
    memset(source, 0, sizeof *source);
    snprintf(path, sizeof path, "%s/bad-source.safetensors", directory);
    uform_tiny_checkpoint_args_t const args = {.path = path, .seed = 7, .depth = 1, .hidden = 64};
    if (uform_tiny_checkpoint(&args) != UFORM_OK) return false;
    bool read = read_file(path, &source->bytes, &source->size);
    unlink(path);
    if (!read || source->size < 8) return false;
    uint64_t header_length = 0;
    for (size_t i = 0; i < 8; i++)
        header_length |= (uint64_t)source->bytes[i] << (8 * i);
    source->data_offset = 8 + (size_t)header_length;
    source->header = json_loadb((char const *)source->bytes + 8, (size_t)header_length, 0, NULL);
    json_t const *model = json_object_get(json_object_get(source->header, "__metadata__"), "uform");
    source->model = json_loads(json_string_value(model) ? json_string_value(model) : "", 0, NULL);
    return source->header && source->model;
}

size_t bad_checkpoints_write(char const *directory, bad_checkpoint_t *out, size_t capacity) {
    source_checkpoint_t source;
    if (!source_load(directory, &source)) {
        fprintf(stderr, "bad_checkpoints: cannot make the valid tiny checkpoint in %s\n", directory);
        source_free(&source);
        return 0;
    }
    size_t written = 0;
    for (; written < VARIANTS_COUNT && written < capacity; written++) {
        variant_t const *variant = &variants[written];
        bad_checkpoint_t *bad = &out[written];
        buffer_t buffer = {0};
        bool made = variant->make ? variant->make(&source, &buffer)
                                  : make_edited(&source, variant->edit, variant->extra, &buffer);
        snprintf(bad->path, sizeof bad->path, "%s/bad-%02zu.safetensors", directory, written);
        made = made && write_file(bad->path, &buffer);
        free(buffer.data);
        if (!made) {
            fprintf(stderr, "bad_checkpoints: cannot write \"%s\" to %s\n", variant->what, bad->path);
            break;
        }
        bad->what = variant->what;
        bad->expected = variant->expected;
        bad->message = variant->message;
    }
    source_free(&source);
    return written == VARIANTS_COUNT || written == capacity ? VARIANTS_COUNT : 0;
}

void bad_checkpoints_remove(bad_checkpoint_t const *bad, size_t count) {
    for (size_t i = 0; i < count; ++i)
        unlink(bad[i].path);
}
