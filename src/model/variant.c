/* The block's settings in a tower's metadata (variant.h). */
#include "variant.h"

#include <math.h>
#include <string.h>

static char const *const norm_names[] = {[UFORM_NORM_RMS] = "rms", [UFORM_NORM_LAYER] = "layer"};
static char const *const activation_names[] = {[UFORM_ACTIVATION_GELU_TANH] = "gelu_tanh",
                                               [UFORM_ACTIVATION_GELU_ERF] = "gelu_erf",
                                               [UFORM_ACTIVATION_GELU_QUICK] = "gelu_quick"};
static char const *const pooling_names[] = {[UFORM_POOLING_LAST] = "last",
                                            [UFORM_POOLING_FIRST] = "first",
                                            [UFORM_POOLING_MEAN] = "mean",
                                            [UFORM_POOLING_END] = "end",
                                            [UFORM_POOLING_HEAD] = "head"};

#define COUNT(array) (sizeof(array) / sizeof((array)[0]))

static char const *name_of(char const *const *names, size_t count, size_t value) {
    return value < count ? names[value] : "unknown";
}

char const *variant_norm_name(uform_norm_t norm) {
    return name_of(norm_names, COUNT(norm_names), (size_t)norm);
}

char const *variant_activation_name(uform_activation_t activation) {
    return name_of(activation_names, COUNT(activation_names), (size_t)activation);
}

char const *variant_pooling_name(uform_pooling_t pooling) {
    return name_of(pooling_names, COUNT(pooling_names), (size_t)pooling);
}

void variant_defaults(uform_transformer_info_t *transformer, bool text) {
    transformer->head = transformer->heads ? transformer->hidden / transformer->heads : 0;
    transformer->norm = UFORM_NORM_RMS;
    transformer->norm_eps = 1e-6f;
    transformer->post_norm = false;
    transformer->input_norm = false;
    transformer->final_norm = true;
    transformer->activation = UFORM_ACTIVATION_GELU_TANH;
    transformer->rotary = text;
    transformer->causal = text;
    transformer->pooling = text ? UFORM_POOLING_LAST : UFORM_POOLING_FIRST;
    transformer->projection = true;
    transformer->projection_bias = false;
    transformer->class_token = !text;
    transformer->registers = 0;
    transformer->relative_buckets = 0;
    transformer->projection_tanh = false;
}

size_t variant_relative_bucket(long distance) {
    size_t const half = VARIANT_RELATIVE_BUCKETS / 2, exact = half / 2;
    size_t bucket = distance < 0 ? half : 0;
    unsigned long n = distance < 0 ? 0ul - (unsigned long)distance : (unsigned long)distance;
    if (n < exact) return bucket + n;
    /* log(n / 8) / log(128 / 8) * 8 in F32, truncated, as PyTorch computes it over an F32 tensor with the
     * Python float log(16) made F32: bit for bit at every distance the engine can meet. */
    float const scaled = logf((float)n / (float)exact) /
                         (float)log((double)VARIANT_RELATIVE_DISTANCE / exact) * (float)(half - exact);
    size_t large = exact + (scaled < (float)half ? (size_t)scaled : half);
    return bucket + (large < half - 1 ? large : half - 1);
}

/* An optional key: absent leaves `*value`; else it must be a boolean. */
static bool read_bool(json_t const *object, char const *key, bool *value) {
    json_t const *found = json_object_get(object, key);
    if (!found) return true;
    if (!json_is_boolean(found)) return false;
    *value = json_is_true(found);
    return true;
}

/* An optional key naming one of `names`. */
static bool read_choice(json_t const *object, char const *key, char const *const *names, size_t count,
                        int *value) {
    json_t const *found = json_object_get(object, key);
    if (!found) return true;
    if (!json_is_string(found)) return false;
    for (size_t i = 0; i < count; ++i)
        if (strcmp(json_string_value(found), names[i]) == 0) {
            *value = (int)i;
            return true;
        }
    return false;
}

/* An optional size in [low, high]. */
static bool read_size(json_t const *object, char const *key, size_t low, size_t high, size_t *value) {
    json_t const *found = json_object_get(object, key);
    if (!found) return true;
    if (!json_is_integer(found) || json_integer_value(found) < 0) return false;
    json_int_t number = json_integer_value(found);
    if ((uint64_t)number < low || (uint64_t)number > high) return false;
    *value = (size_t)number;
    return true;
}

static uform_status_t fault(char const **message, char const *text) {
    *message = text;
    return UFORM_FORMAT;
}

uform_status_t variant_parse(json_t const *tower, uform_transformer_info_t *transformer, bool text,
                             char const **message) {
    variant_defaults(transformer, text);
    if (transformer->hidden % transformer->heads != 0)
        return fault(message, "tower hidden is not a multiple of heads");
    if (transformer->head > VARIANT_HEAD_MAX) return fault(message, "tower head width out of range");
    int norm = (int)transformer->norm, activation = (int)transformer->activation,
        pooling = (int)transformer->pooling;
    if (!read_choice(tower, "norm", norm_names, COUNT(norm_names), &norm))
        return fault(message, "tower norm is not rms or layer");
    if (!read_choice(tower, "activation", activation_names, COUNT(activation_names), &activation))
        return fault(message, "tower activation is not gelu_tanh, gelu_erf or gelu_quick");
    if (!read_choice(tower, "pooling", pooling_names, COUNT(pooling_names), &pooling))
        return fault(message, "tower pooling is not last, first, mean, end or head");
    transformer->norm = (uform_norm_t)norm;
    transformer->activation = (uform_activation_t)activation;
    transformer->pooling = (uform_pooling_t)pooling;
    json_t const *eps = json_object_get(tower, "norm_eps");
    if (eps) {
        double value = json_is_number(eps) ? json_number_value(eps) : -1.0;
        if (!(value > 0 && value <= 1e-1)) return fault(message, "tower norm_eps out of range");
        transformer->norm_eps = (float)value;
    }
    if (!read_bool(tower, "post_norm", &transformer->post_norm) ||
        !read_bool(tower, "input_norm", &transformer->input_norm) ||
        !read_bool(tower, "final_norm", &transformer->final_norm) ||
        !read_bool(tower, "rotary", &transformer->rotary) ||
        !read_bool(tower, "causal", &transformer->causal) ||
        !read_bool(tower, "projection", &transformer->projection) ||
        !read_bool(tower, "projection_bias", &transformer->projection_bias) ||
        !read_bool(tower, "class_token", &transformer->class_token) ||
        !read_bool(tower, "projection_tanh", &transformer->projection_tanh))
        return fault(message, "tower setting is not a boolean");
    if (!read_size(tower, "registers", 0, VARIANT_REGISTERS_MAX, &transformer->registers))
        return fault(message, "tower registers out of range");
    if (!read_size(tower, "relative_buckets", 0, VARIANT_RELATIVE_BUCKETS, &transformer->relative_buckets) ||
        (transformer->relative_buckets != 0 && transformer->relative_buckets != VARIANT_RELATIVE_BUCKETS))
        return fault(message, "tower relative_buckets is not 0 or 32");
    if (transformer->relative_buckets && !text)
        return fault(message, "relative positions are a text tower's");
    if (transformer->registers && (text || !transformer->class_token))
        return fault(message, "register tokens follow a patch tower's class token");
    if (transformer->projection_bias && !transformer->projection)
        return fault(message, "a projection bias without projection");
    if (transformer->projection_tanh && (!transformer->projection || !text))
        return fault(message, "tanh after a projection is a projected text tower's");
    if (text && transformer->class_token) return fault(message, "a text tower has no class token");
    if (!transformer->class_token && transformer->pooling == UFORM_POOLING_FIRST && !text)
        return fault(message, "class pooling without a class token");
    if (text && transformer->pooling == UFORM_POOLING_HEAD)
        return fault(message, "head pooling is a patch tower's");
    if (transformer->rotary && transformer->head != 64)
        return fault(message, "rotary positions need heads of 64");
    if (!text && transformer->rotary) return fault(message, "a patch tower has learned positions");
    if (!text && transformer->pooling == UFORM_POOLING_END)
        return fault(message, "end-of-text pooling is a text tower's");
    return UFORM_OK;
}

/* Sets `key` to `value` unless it is the default. */
static bool write_bool(json_t *tower, char const *key, bool value, bool fallback) {
    return value == fallback || json_object_set_new(tower, key, json_boolean(value)) == 0;
}

static bool write_choice(json_t *tower, char const *key, char const *const *names, int value, int fallback) {
    return value == fallback || json_object_set_new(tower, key, json_string(names[value])) == 0;
}

bool variant_write(json_t *tower, uform_transformer_info_t const *transformer, bool text) {
    uform_transformer_info_t defaults = *transformer;
    variant_defaults(&defaults, text);
    return write_choice(tower, "norm", norm_names, (int)transformer->norm, (int)defaults.norm) &&
           (transformer->norm_eps == defaults.norm_eps ||
            json_object_set_new(tower, "norm_eps", json_real((double)transformer->norm_eps)) == 0) &&
           write_bool(tower, "post_norm", transformer->post_norm, defaults.post_norm) &&
           write_bool(tower, "input_norm", transformer->input_norm, defaults.input_norm) &&
           write_bool(tower, "final_norm", transformer->final_norm, defaults.final_norm) &&
           write_choice(tower, "activation", activation_names, (int)transformer->activation,
                        (int)defaults.activation) &&
           write_bool(tower, "rotary", transformer->rotary, defaults.rotary) &&
           write_bool(tower, "causal", transformer->causal, defaults.causal) &&
           write_choice(tower, "pooling", pooling_names, (int)transformer->pooling, (int)defaults.pooling) &&
           write_bool(tower, "projection", transformer->projection, defaults.projection) &&
           write_bool(tower, "projection_bias", transformer->projection_bias, defaults.projection_bias) &&
           write_bool(tower, "class_token", transformer->class_token, defaults.class_token) &&
           write_bool(tower, "projection_tanh", transformer->projection_tanh, defaults.projection_tanh) &&
           (transformer->registers == defaults.registers ||
            json_object_set_new(tower, "registers", json_integer((json_int_t)transformer->registers)) == 0) &&
           (transformer->relative_buckets == defaults.relative_buckets ||
            json_object_set_new(tower, "relative_buckets",
                                json_integer((json_int_t)transformer->relative_buckets)) == 0);
}

#define VOCAB_MAX     (1u << 24)
#define POSITIONS_MAX (1u << 20)

uform_status_t variant_parse_text(json_t const *tower, uform_model_info_t *info, char const **message) {
    info->text.vocab = 0;
    info->text.positions = 0;
    info->text.position_offset = 0;
    info->text.token_type = false;
    info->text.cut_ids = false;
    info->text.padded = false;
    info->text.pad_id = 0;
    info->text.strip = false;
    uform_transformer_info_t const *transformer = &info->text.transformer;
    if (!read_size(tower, "vocab", 1, VOCAB_MAX, &info->text.vocab))
        return fault(message, "text vocab out of range");
    if (!read_size(tower, "positions", 1, POSITIONS_MAX, &info->text.positions))
        return fault(message, "text positions out of range");
    if (!read_size(tower, "position_offset", 0, POSITIONS_MAX, &info->text.position_offset))
        return fault(message, "text position_offset out of range");
    if (!read_bool(tower, "token_type", &info->text.token_type) ||
        !read_bool(tower, "cut_ids", &info->text.cut_ids) ||
        !read_bool(tower, "padded", &info->text.padded) || !read_bool(tower, "strip", &info->text.strip))
        return fault(message, "text token_type, cut_ids or padded is not a boolean");
    if (!read_size(tower, "pad_id", 0, VOCAB_MAX, &info->text.pad_id))
        return fault(message, "text pad_id out of range");
    if (info->text.vocab && info->text.pad_id >= info->text.vocab)
        return fault(message, "text pad_id past the vocabulary");
    if (transformer->rotary != (info->text.positions == 0))
        return fault(message, "text positions go with learned positions, and only with them");
    if (info->text.positions && info->text.position_offset + info->text.context > info->text.positions)
        return fault(message, "text context past the positions");
    if (info->text.vocab == 0 && (info->text.token_type || info->text.cut_ids || info->text.padded ||
                                  info->text.strip || transformer->pooling == UFORM_POOLING_END))
        return fault(message, "text token settings on a model that reads bytes");
    return UFORM_OK;
}

bool variant_write_text(json_t *tower, uform_model_info_t const *info) {
    struct {
        char const *key;
        size_t value;
    } const sizes[] = {{"vocab", info->text.vocab},
                       {"positions", info->text.positions},
                       {"position_offset", info->text.position_offset}};
    for (size_t i = 0; i < COUNT(sizes); ++i)
        if (sizes[i].value &&
            json_object_set_new(tower, sizes[i].key, json_integer((json_int_t)sizes[i].value)))
            return false;
    return write_bool(tower, "token_type", info->text.token_type, false) &&
           write_bool(tower, "cut_ids", info->text.cut_ids, false) &&
           write_bool(tower, "padded", info->text.padded, false) &&
           write_bool(tower, "strip", info->text.strip, false) &&
           (!info->text.pad_id ||
            json_object_set_new(tower, "pad_id", json_integer((json_int_t)info->text.pad_id)) == 0);
}

uform_status_t variant_parse_model(json_t const *model, uform_model_info_t *info, char const **message) {
    strcpy(info->family, "uform");
    info->normalized = true;
    json_t const *family = json_object_get(model, "family");
    if (family) {
        if (!json_is_string(family) || json_string_length(family) == 0 ||
            json_string_length(family) >= sizeof info->family)
            return fault(message, "family is not a short string");
        for (char const *c = json_string_value(family); *c; ++c)
            if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '-'))
                return fault(message, "family is not lowercase letters, digits and dashes");
        strcpy(info->family, json_string_value(family));
    }
    if (!read_bool(model, "normalized", &info->normalized))
        return fault(message, "normalized is not a boolean");
    return UFORM_OK;
}

static char const *const resize_names[] = {[UFORM_RESIZE_SHORT_SIDE] = "short_side",
                                           [UFORM_RESIZE_SHORT_SIDE_ROUND_CROP] = "short_side_round_crop",
                                           [UFORM_RESIZE_SQUARE] = "square"};
static char const *const resample_names[] = {[UFORM_RESAMPLE_FLOAT_BILINEAR] = "float_bilinear",
                                             [UFORM_RESAMPLE_PILLOW_BICUBIC] = "pillow_bicubic",
                                             [UFORM_RESAMPLE_PILLOW_BILINEAR] = "pillow_bilinear"};

uform_status_t variant_parse_image(json_t const *tower, uform_model_info_t *info, char const **message) {
    int resize = UFORM_RESIZE_SHORT_SIDE, resample = UFORM_RESAMPLE_FLOAT_BILINEAR;
    if (!read_choice(tower, "resize", resize_names, COUNT(resize_names), &resize))
        return fault(message, "image resize is not short_side, short_side_round_crop or square");
    if (!read_choice(tower, "resample", resample_names, COUNT(resample_names), &resample))
        return fault(message, "image resample is not float_bilinear, pillow_bicubic or pillow_bilinear");
    info->image.resize = (uform_image_resize_t)resize;
    info->image.resample = (uform_image_resample_t)resample;
    return UFORM_OK;
}

bool variant_write_image(json_t *tower, uform_model_info_t const *info) {
    return write_choice(tower, "resize", resize_names, (int)info->image.resize, UFORM_RESIZE_SHORT_SIDE) &&
           write_choice(tower, "resample", resample_names, (int)info->image.resample,
                        UFORM_RESAMPLE_FLOAT_BILINEAR);
}

char const *variant_resize_name(uform_image_resize_t resize) {
    return name_of(resize_names, COUNT(resize_names), (size_t)resize);
}

char const *variant_resample_name(uform_image_resample_t resample) {
    return name_of(resample_names, COUNT(resample_names), (size_t)resample);
}

bool variant_write_model(json_t *model, uform_model_info_t const *info) {
    return (strcmp(info->family, "uform") == 0 || info->family[0] == '\0' ||
            json_object_set_new(model, "family", json_string(info->family)) == 0) &&
           write_bool(model, "normalized", info->normalized, true);
}

void variant_engine_model(uform_model_info_t *info) {
    variant_defaults(&info->text.transformer, true);
    variant_defaults(&info->image.transformer, false);
    variant_defaults(&info->audio.transformer, false);
    info->text.vocab = info->text.positions = info->text.position_offset = 0;
    info->text.token_type = info->text.cut_ids = info->text.padded = info->text.strip = false;
    info->text.pad_id = 0;
    info->image.resize = UFORM_RESIZE_SHORT_SIDE;
    info->image.resample = UFORM_RESAMPLE_FLOAT_BILINEAR;
    strcpy(info->family, "uform");
    info->normalized = true;
}

bool variant_is_engine(uform_model_info_t const *info) {
    if (strcmp(info->family, "uform") != 0) return false;
    uform_model_info_t engine = *info;
    variant_engine_model(&engine);
    uform_transformer_info_t const *ours[] = {&info->text.transformer, &info->image.transformer,
                                              &info->audio.transformer};
    uform_transformer_info_t const *theirs[] = {&engine.text.transformer, &engine.image.transformer,
                                                &engine.audio.transformer};
    bool const present[] = {info->has_text, info->has_image, info->has_audio};
    for (size_t i = 0; i < 3; ++i)
        if (present[i] && memcmp(ours[i], theirs[i], sizeof *ours[i]) != 0) return false;
    return info->text.vocab == 0 && info->normalized &&
           (!info->has_image || (info->image.resize == 0 && info->image.resample == 0));
}
