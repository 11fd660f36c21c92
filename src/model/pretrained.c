/* Pretrained folders (pretrained.h): the configuration read into the model's info, the weights mapped and
 * converted to BF16 tensors of the checkpoint schema, the tokenizer opened and truncating at the context. */
#include "pretrained_internal.h"

#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "executor.h"
#include "kernels.h"
#include "tokenizer.h"
#include "variant.h"

#define PRETRAINED_ALIGNMENT 64

/* ---- sentence-transformers' modules ------------------------------------------------------------ */

/* What a folder's sentence-transformers modules say: where the Transformer module lives, Pooling's mode, a
 * Dense module after it, Normalize. */
typedef struct sentence {
    bool modules; /* the folder has modules.json */
    bool pooled;  /* a Pooling module: `pooling` */
    uform_pooling_t pooling;
    bool dense; /* a Dense module after the pooling: Linear(dense_in, dense_out, dense_bias), then tanh or not
                 */
    size_t dense_in, dense_out;
    bool dense_bias, dense_tanh;
    char dense_weights[64]; /* its weights, "<its path>/model.safetensors" */
    bool normalized;        /* a Normalize module */
    size_t context;         /* sentence_bert_config.json's max_seq_length; SIZE_MAX where it has none */
} sentence_t;

/* A Dense module's config.json (sentence-transformers' Dense: in_features, out_features, bias, and
 * activation_function, its default torch.nn.Tanh) in folder `inside`, `path` its path in modules.json. */
static uform_status_t dense_module(char const *inside, char const *path, sentence_t *sentence,
                                   char const **message) {
    json_t *config = NULL;
    uform_status_t status = pretrained_json(inside, "config.json", false, &config, message);
    if (status != UFORM_OK) return status;
    char file[96];
    snprintf(file, sizeof file, "%.60s/config.json", path);
    if (!json_is_object(config)) status = pretrained_fault(message, UFORM_FORMAT, "%s: not an object", file);
    if (status == UFORM_OK)
        status =
            pretrained_size(config, file, "in_features", 1, 65536, SIZE_MAX, &sentence->dense_in, message);
    if (status == UFORM_OK)
        status =
            pretrained_size(config, file, "out_features", 1, 65536, SIZE_MAX, &sentence->dense_out, message);
    json_t const *bias = json_object_get(config, "bias");
    if (status == UFORM_OK && bias && !json_is_boolean(bias))
        status = pretrained_fault(message, UFORM_FORMAT, "%s: bias is not a boolean", file);
    sentence->dense_bias = !bias || json_is_true(bias);
    json_t const *activation = json_object_get(config, "activation_function");
    char const *function = json_is_string(activation) ? json_string_value(activation) : NULL;
    if (status == UFORM_OK && activation && !function)
        status = pretrained_fault(message, UFORM_FORMAT, "%s: activation_function is not a string", file);
    if (status == UFORM_OK) {
        char const *name = function && strrchr(function, '.') ? strrchr(function, '.') + 1 : function;
        sentence->dense_tanh = !name || strcmp(name, "Tanh") == 0;
        if (name && !sentence->dense_tanh && strcmp(name, "Identity") != 0)
            status =
                pretrained_fault(message, UFORM_UNSUPPORTED, "%s: activation_function %.60s", file, function);
    }
    if (status == UFORM_OK &&
        (size_t)snprintf(sentence->dense_weights, sizeof sentence->dense_weights, "%s/model.safetensors",
                         path) >= sizeof sentence->dense_weights)
        status = pretrained_fault(message, UFORM_IO, "modules.json: path %.60s too long", path);
    json_decref(config);
    sentence->dense = status == UFORM_OK;
    return status;
}

static uform_status_t sentence_modules(pretrained_t *folder, sentence_t *sentence, char const **message) {
    json_t *modules = NULL;
    uform_status_t status = pretrained_json(folder->root, "modules.json", true, &modules, message);
    if (status != UFORM_OK || !modules) return status;
    sentence->modules = true;
    if (!json_is_array(modules)) {
        json_decref(modules);
        return pretrained_fault(message, UFORM_FORMAT, "modules.json: not an array");
    }
    size_t index;
    json_t const *module;
    json_array_foreach(modules, index, module) {
        char const *type = pretrained_string(module, "type"), *path = pretrained_string(module, "path");
        if (!type || !path || strstr(path, "..") || path[0] == '/') {
            status = pretrained_fault(message, UFORM_FORMAT,
                                      "modules.json: module %zu without a type or a path inside", index);
            break;
        }
        char const *name = strrchr(type, '.') ? strrchr(type, '.') + 1 : type;
        if (strcmp(name, "Transformer") == 0) {
            if (index != 0 || (path[0] && !pretrained_join(folder->transformer, folder->root, path))) {
                status = pretrained_fault(message, UFORM_FORMAT,
                                          "modules.json: the Transformer module is not the first");
                break;
            }
        } else if (strcmp(name, "Pooling") == 0) {
            json_t *pooling = NULL;
            char inside[PATH_MAX];
            if (!pretrained_join(inside, folder->root, path)) {
                status = pretrained_fault(message, UFORM_IO, "modules.json: path too long");
                break;
            }
            status = pretrained_json(inside, "config.json", false, &pooling, message);
            if (status != UFORM_OK) break;
            static char const *const modes[] = {"pooling_mode_cls_token",
                                                "pooling_mode_mean_tokens",
                                                "pooling_mode_lasttoken",
                                                "pooling_mode_max_tokens",
                                                "pooling_mode_mean_sqrt_len_tokens",
                                                "pooling_mode_weightedmean_tokens"};
            static uform_pooling_t const poolings[] = {UFORM_POOLING_FIRST, UFORM_POOLING_MEAN,
                                                       UFORM_POOLING_LAST};
            size_t chosen = 0, count = 0;
            /* sentence-transformers' Pooling takes its constructor's defaults for keys a file lacks:
             * mean tokens on, the others off. */
            for (size_t m = 0; m < sizeof modes / sizeof modes[0]; ++m) {
                json_t const *mode = json_object_get(pooling, modes[m]);
                if (mode ? json_is_true(mode) : m == 1) chosen = m, count++;
            }
            json_t const *include_prompt = json_object_get(pooling, "include_prompt");
            json_decref(pooling);
            if (count != 1 || chosen >= 3) {
                status = pretrained_fault(
                    message, UFORM_UNSUPPORTED,
                    "%s/config.json: pooling other than one of cls, mean and last token", path);
                break;
            }
            if (include_prompt && !json_is_true(include_prompt)) {
                status = pretrained_fault(message, UFORM_UNSUPPORTED,
                                          "%s/config.json: pooling without the prompt", path);
                break;
            }
            sentence->pooled = true;
            sentence->pooling = poolings[chosen];
        } else if (strcmp(name, "Dense") == 0) {
            char inside[PATH_MAX];
            if (!sentence->pooled || sentence->dense || sentence->normalized) {
                status = pretrained_fault(message, UFORM_UNSUPPORTED,
                                          "modules.json: a Dense module other than one after the pooling");
                break;
            }
            if (!pretrained_join(inside, folder->root, path)) {
                status = pretrained_fault(message, UFORM_IO, "modules.json: path too long");
                break;
            }
            if ((status = dense_module(inside, path, sentence, message)) != UFORM_OK) break;
        } else if (strcmp(name, "Normalize") == 0) {
            sentence->normalized = true;
        } else {
            status = pretrained_fault(message, UFORM_UNSUPPORTED, "modules.json: module %.60s", type);
            break;
        }
    }
    json_decref(modules);
    if (status != UFORM_OK) return status;
    /* sentence_bert_config.json's max_seq_length: the context. */
    json_t *settings = NULL;
    status = pretrained_json(folder->root, "sentence_bert_config.json", true, &settings, message);
    if (status != UFORM_OK || !settings) return status;
    size_t length = 0;
    status = pretrained_size(settings, "sentence_bert_config.json", "max_seq_length", 1, 1u << 20, 0, &length,
                             message);
    if (status == UFORM_OK && json_is_true(json_object_get(settings, "do_lower_case")))
        status = pretrained_fault(message, UFORM_UNSUPPORTED,
                                  "sentence_bert_config.json: do_lower_case (texts lowercased by Python)");
    json_decref(settings);
    if (status == UFORM_OK && length) sentence->context = length;
    return status;
}

/* ---- The weights -------------------------------------------------------------------------------- */

/* The folder a weights file's name is in. */
static char const *weights_folder(pretrained_t const *folder, pretrained_weights_t const *file) {
    return file->in_root ? folder->root : folder->transformer;
}

/* Opens and maps `shard` (its name set) in folder `base` and reads its header; *error is the open's errno
 * where it failed (ENOENT: no such file). */
static uform_status_t map_shard(char const *base, pretrained_shard_t *shard, int *error,
                                char const **message) {
    char path[PATH_MAX];
    char const *name = shard->name;
    *error = 0;
    if (!pretrained_join(path, base, name))
        return pretrained_fault(message, UFORM_IO, "%s: path too long", name);
    shard->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (shard->fd < 0) {
        *error = errno;
        return pretrained_fault(message, UFORM_IO, "%s: cannot open it in %s", name, base);
    }
    struct stat about;
    if (fstat(shard->fd, &about) != 0 || !S_ISREG(about.st_mode))
        return pretrained_fault(message, UFORM_IO, "%s: not a regular file", name);
    shard->size = (size_t)about.st_size;
    if (shard->size < 8) return pretrained_fault(message, UFORM_FORMAT, "%s: shorter than its header", name);
    void *mapping = mmap(NULL, shard->size, PROT_READ, MAP_PRIVATE, shard->fd, 0);
    if (mapping == MAP_FAILED) return pretrained_fault(message, UFORM_IO, "%s: cannot map it", name);
    shard->mapping = mapping;
    uint64_t header_length = 0;
    char const *why = NULL;
    uform_status_t status = checkpoint_prefix(shard->mapping, 8, shard->size, &header_length, &why);
    if (status == UFORM_OK)
        status = checkpoint_parse_tensors((char const *)shard->mapping + 8, header_length, shard->size,
                                          &shard->header, &why);
    if (status != UFORM_OK) return pretrained_fault(message, status, "%s: %s", name, why);
    return UFORM_OK;
}

/* Whether an index may name this shard: a file of the folder itself ("model-00001-of-00002.safetensors"),
 * without a path, that fits `capacity` bytes with its terminator. */
static bool shard_name_valid(char const *name, size_t capacity) {
    size_t length = strlen(name);
    return length > 0 && length < capacity && !strchr(name, '/') && name[0] != '.';
}

/* The shards of weights file `file` from its index `index_name` (JSON, as transformers writes it): the
 * distinct files its weight_map names, in the order they first appear, each mapped; no tensor may be in
 * two of them. */
static uform_status_t map_sharded(pretrained_t const *folder, pretrained_weights_t *file,
                                  char const *index_name, char const **message) {
    json_t *index = NULL;
    uform_status_t status = pretrained_json(weights_folder(folder, file), index_name, false, &index, message);
    if (status != UFORM_OK) return status;
    json_t *map = json_is_object(index) ? json_object_get(index, "weight_map") : NULL;
    if (!json_is_object(map) || json_object_size(map) == 0) {
        json_decref(index);
        return pretrained_fault(message, UFORM_FORMAT, "%s: no weight_map of tensors to files", index_name);
    }
    file->shards = calloc(PRETRAINED_SHARDS_MAX, sizeof *file->shards);
    if (!file->shards) {
        json_decref(index);
        return pretrained_fault(message, UFORM_OUT_OF_MEMORY, "%s: out of memory", index_name);
    }
    char const *tensor;
    json_t *value;
    json_object_foreach(map, tensor, value) {
        char const *name = json_string_value(value);
        if (!name || !shard_name_valid(name, sizeof file->shards[0].name)) {
            status = pretrained_fault(message, UFORM_FORMAT, "%s: %.80s is not in a file of the folder",
                                      index_name, tensor);
            break;
        }
        size_t known = 0;
        while (known < file->shard_count && strcmp(file->shards[known].name, name) != 0)
            ++known;
        if (known < file->shard_count) continue;
        if (file->shard_count == PRETRAINED_SHARDS_MAX) {
            status = pretrained_fault(message, UFORM_UNSUPPORTED, "%s: more than %d files", index_name,
                                      PRETRAINED_SHARDS_MAX);
            break;
        }
        pretrained_shard_t *shard = &file->shards[file->shard_count++];
        shard->fd = -1;
        snprintf(shard->name, sizeof shard->name, "%s", name);
    }
    json_decref(index);
    int error = 0;
    for (size_t i = 0; i < file->shard_count && status == UFORM_OK; ++i)
        status = map_shard(weights_folder(folder, file), &file->shards[i], &error, message);
    for (size_t i = 0; i < file->shard_count && status == UFORM_OK; ++i) {
        checkpoint_header_t const *header = &file->shards[i].header;
        for (size_t t = 0; t < header->tensors_count && status == UFORM_OK; ++t)
            for (size_t other = i + 1; other < file->shard_count && status == UFORM_OK; ++other)
                if (checkpoint_find(&file->shards[other].header, header->tensors[t].name))
                    status = pretrained_fault(message, UFORM_FORMAT, "%s and %s both hold %.80s",
                                              file->shards[i].name, file->shards[other].name,
                                              header->tensors[t].name);
    }
    return status;
}

/* Maps weights file `index` of the folder and reads its header: the file itself, or, where it is missing
 * and its index ("model.safetensors.index.json") is there, the shards the index names. */
static uform_status_t map_weights(pretrained_t *folder, size_t index, char const **message) {
    pretrained_weights_t *file = &folder->weights[index];
    file->shards = calloc(1, sizeof *file->shards);
    if (!file->shards) return pretrained_fault(message, UFORM_OUT_OF_MEMORY, "out of memory");
    file->shard_count = 1;
    file->shards[0].fd = -1;
    snprintf(file->shards[0].name, sizeof file->shards[0].name, "%s", file->name);
    int error = 0;
    char const *base = weights_folder(folder, file);
    uform_status_t status = map_shard(base, &file->shards[0], &error, message);
    if (error != ENOENT) return status;
    char index_name[sizeof file->name], other[PATH_MAX];
    bool fits =
        (size_t)snprintf(index_name, sizeof index_name, "%s.index.json", file->name) < sizeof index_name;
    if (fits && pretrained_join(other, base, index_name) && access(other, F_OK) == 0) {
        free(file->shards);
        file->shards = NULL;
        file->shard_count = 0;
        memcpy(file->name, index_name, sizeof index_name); /* the faults name the index */
        return map_sharded(folder, file, file->name, message);
    }
    /* pytorch_model.bin beside where the file was looked for (its folder inside `base`, if any). */
    char pickle[sizeof file->name + 32];
    char const *slash = strrchr(file->name, '/');
    snprintf(pickle, sizeof pickle, "%.*spytorch_model.bin", slash ? (int)(slash - file->name + 1) : 0,
             file->name);
    if (pretrained_join(other, base, pickle) && access(other, F_OK) == 0)
        return pretrained_fault(message, UFORM_UNSUPPORTED, "weights in %s (pickle): save them as %s", pickle,
                                file->name);
    return status;
}

/* The weights of `tower` named `name` in its weights file `index`, as it is or with the tower's prefix, and
 * the shard that holds it. */
static checkpoint_tensor_t const *weight(pretrained_t const *folder, pretrained_tower_t const *tower,
                                         size_t index, char const *name, pretrained_shard_t const **shard) {
    pretrained_weights_t const *file = &folder->weights[index];
    char prefixed[PRETRAINED_NAME_LIMIT + 32];
    snprintf(prefixed, sizeof prefixed, "%s%s", tower->prefix, name);
    for (int pass = 0; pass < (tower->prefix[0] ? 2 : 1); ++pass)
        for (size_t i = 0; i < file->shard_count; ++i) {
            checkpoint_tensor_t const *found =
                checkpoint_find(&file->shards[i].header, pass ? prefixed : name);
            if (found) {
                *shard = &file->shards[i];
                return found;
            }
        }
    return NULL;
}

/* The weights that make one schema tensor: up to three sources stacked by rows (q, k and v into qkv), the
 * first row of one (token type 0), or zeros (a part the family lacks, such as CLIP's patch bias). */
typedef struct recipe {
    char names[3][PRETRAINED_NAME_LIMIT];
    size_t count; /* 0: zeros */
    bool first_row;
    bool zero_row;                     /* a row of zeros first (the class token's unplaced position) */
    char scale[PRETRAINED_NAME_LIMIT]; /* a vector scaling the rows (LayerScale), or "" */
    size_t file;                       /* the weights file that holds them */
} recipe_t;

/* The names of a tower's part, the block's parts after its layer's prefix; "weight" or "bias" after the
 * norms and linear layers. false when the family has no such part. */
static bool recipe_of(pretrained_tower_t const *tower, checkpoint_schema_tensor_t const *tensor,
                      recipe_t *recipe) {
    pretrained_names_t const *names = tower->names;
    *recipe = (recipe_t){.count = 1, .file = tower->file};
    char const *what = strrchr(tensor->name, '.') + 1; /* "weight" or "bias" for the norms and layers */
    char layer[64] = "";
    snprintf(layer, sizeof layer, names->layer, tower->blocks[tensor->block]);
    char const *block = NULL, *whole = NULL, *stacked[3] = {NULL, NULL, NULL};
    switch (tensor->part) {
    case CHECKPOINT_PART_NORM1:
    case CHECKPOINT_PART_NORM1_BIAS:
        block = names->norm1;
        break;
    case CHECKPOINT_PART_NORM2:
    case CHECKPOINT_PART_NORM2_BIAS:
        block = names->norm2;
        break;
    case CHECKPOINT_PART_QKV_WEIGHT:
    case CHECKPOINT_PART_QKV_BIAS:
        stacked[0] = names->q, stacked[1] = names->k, stacked[2] = names->v;
        break;
    case CHECKPOINT_PART_OUT_WEIGHT:
    case CHECKPOINT_PART_OUT_BIAS:
        block = names->out;
        if (names->scale1) snprintf(recipe->scale, sizeof recipe->scale, "%s%s", layer, names->scale1);
        break;
    case CHECKPOINT_PART_UP_WEIGHT:
    case CHECKPOINT_PART_UP_BIAS:
        block = names->up;
        break;
    case CHECKPOINT_PART_DOWN_WEIGHT:
    case CHECKPOINT_PART_DOWN_BIAS:
        block = names->down;
        if (names->scale2) snprintf(recipe->scale, sizeof recipe->scale, "%s%s", layer, names->scale2);
        break;
    case CHECKPOINT_PART_NORM:
    case CHECKPOINT_PART_NORM_BIAS:
        snprintf(recipe->names[0], sizeof recipe->names[0], "%s.%s", names->final_norm, what);
        return names->final_norm != NULL;
    case CHECKPOINT_PART_INPUT_NORM:
    case CHECKPOINT_PART_INPUT_NORM_BIAS:
        snprintf(recipe->names[0], sizeof recipe->names[0], "%s.%s", names->input_norm, what);
        return names->input_norm != NULL;
    case CHECKPOINT_PART_PROJ:
    case CHECKPOINT_PART_PROJ_BIAS:
        if (tower->dense) { /* a Dense module's Linear, in a file of its own */
            recipe->file = tower->dense_file;
            snprintf(recipe->names[0], sizeof recipe->names[0], "linear.%s", what);
            return true;
        }
        whole = tensor->part == CHECKPOINT_PART_PROJ ? names->proj : names->proj_bias;
        break;
    case CHECKPOINT_PART_EMBED:
        whole = names->embed;
        break;
    case CHECKPOINT_PART_TEXT_POSITIONS:
        whole = names->positions;
        break;
    case CHECKPOINT_PART_POS:
        whole = names->positions;
        recipe->zero_row = names->class_unplaced;
        if (tower->registers) { /* the registers' rows between the class token's and the patches' */
            snprintf(recipe->names[0], sizeof recipe->names[0], "%s", names->registers);
            snprintf(recipe->names[1], sizeof recipe->names[1], "%s", names->positions);
            recipe->count = 2;
            return names->registers != NULL && names->class_unplaced;
        }
        break;
    case CHECKPOINT_PART_TOKEN_TYPE:
        whole = names->token_type;
        recipe->first_row = true;
        break;
    case CHECKPOINT_PART_PATCH_WEIGHT:
        whole = names->patch;
        break;
    case CHECKPOINT_PART_PATCH_BIAS:
        if (!names->patch_bias) recipe->count = 0; /* no bias: zeros */
        if (!names->patch_bias) return true;
        whole = names->patch_bias;
        break;
    case CHECKPOINT_PART_CLS:
        whole = names->cls;
        break;
    case CHECKPOINT_PART_RELATIVE_BIAS:
        whole = names->relative_bias;
        break;
    case CHECKPOINT_PART_HEAD_PROBE:
        whole = names->head_probe;
        break;
    case CHECKPOINT_PART_HEAD_QKV_WEIGHT:
        whole = names->head_qkv_weight;
        break;
    case CHECKPOINT_PART_HEAD_QKV_BIAS:
        whole = names->head_qkv_bias;
        break;
    case CHECKPOINT_PART_HEAD_OUT_WEIGHT:
    case CHECKPOINT_PART_HEAD_OUT_BIAS:
        snprintf(recipe->names[0], sizeof recipe->names[0], "%s.%s", names->head_out, what);
        return names->head_out != NULL;
    case CHECKPOINT_PART_HEAD_NORM:
    case CHECKPOINT_PART_HEAD_NORM_BIAS:
        snprintf(recipe->names[0], sizeof recipe->names[0], "%s.%s", names->head_norm, what);
        return names->head_norm != NULL;
    case CHECKPOINT_PART_HEAD_UP_WEIGHT:
    case CHECKPOINT_PART_HEAD_UP_BIAS:
        snprintf(recipe->names[0], sizeof recipe->names[0], "%s.%s", names->head_up, what);
        return names->head_up != NULL;
    case CHECKPOINT_PART_HEAD_DOWN_WEIGHT:
    case CHECKPOINT_PART_HEAD_DOWN_BIAS:
        snprintf(recipe->names[0], sizeof recipe->names[0], "%s.%s", names->head_down, what);
        return names->head_down != NULL;
    default:
        return false;
    }
    if (whole) return snprintf(recipe->names[0], sizeof recipe->names[0], "%s", whole) > 0;
    if (stacked[0]) {
        for (size_t i = 0; i < 3; ++i)
            snprintf(recipe->names[i], sizeof recipe->names[i], "%s%s.%s", layer, stacked[i], what);
        recipe->count = 3;
        return true;
    }
    if (!block) return false;
    snprintf(recipe->names[0], sizeof recipe->names[0], "%s%s.%s", layer, block, what);
    return true;
}

/* An IEEE half as a float: exact (every half is a float), subnormals, infinities and NaNs included. */
static float f16_to_f32(uint16_t half) {
    uint32_t sign = (uint32_t)(half & 0x8000u) << 16, exponent = (half >> 10) & 0x1Fu,
             mantissa = half & 0x3FFu;
    uint32_t bits;
    if (exponent == 0x1F) {
        bits = sign | 0x7F800000u | (mantissa << 13); /* infinity or NaN */
    } else if (exponent != 0) {
        bits = sign | ((exponent + 112u) << 23) | (mantissa << 13); /* 127 - 15 = 112 */
    } else if (mantissa == 0) {
        bits = sign; /* zero */
    } else {         /* subnormal: mantissa * 2^-24, normalized */
        exponent = 113;
        while (!(mantissa & 0x400u)) {
            mantissa <<= 1;
            exponent--;
        }
        bits = sign | (exponent << 23) | ((mantissa & 0x3FFu) << 13);
    }
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* `count` values of a source tensor as BF16; F32 through the active kernels' converter (f32_to_bf16's
 * bits, a vector at a time: one value at a time, it took a tenth of a small model's load). The reader
 * refuses tensors whose data is not aligned to their dtype (check_alignment in checkpoint.c). */
static void to_bf16(uint16_t *out, void const *values, checkpoint_dtype_t dtype, size_t count) {
    uint8_t const *bytes = values;
    switch (dtype) {
    case CHECKPOINT_F32:
        kernels_active()->f32_to_bf16(out, values, count);
        return;
    case CHECKPOINT_F16:
        for (size_t i = 0; i < count; ++i) {
            uint16_t half;
            memcpy(&half, bytes + 2 * i, 2);
            out[i] = f32_to_bf16(f16_to_f32(half));
        }
        return;
    default: /* CHECKPOINT_BF16 */
        memcpy(out, bytes, 2 * count);
        return;
    }
}

/* Where the schema's tensors go in the data, and filling them (layout_visit). */
typedef struct layout {
    pretrained_t const *folder;
    checkpoint_header_t *header;
    uint8_t *data; /* NULL while sizing */
    uint64_t size;
    size_t names_size;
    char *names;
    char const **message;
    uform_status_t status;
} layout_t;

/* Row r of a converted weight (or element r of a bias) times element r of the recipe's scale, rounded to BF16
 * again: LayerScale folded into the layer before it. Checks the scale's shape while sizing (`out` NULL). */
static bool scale_rows(layout_t *layout, pretrained_tower_t const *tower, recipe_t const *recipe,
                       checkpoint_schema_tensor_t const *tensor, uint16_t *out) {
    pretrained_t const *folder = layout->folder;
    pretrained_shard_t const *shard = NULL;
    checkpoint_tensor_t const *scale = weight(folder, tower, recipe->file, recipe->scale, &shard);
    uint64_t rows = tensor->shape[0], columns = tensor->rank == 2 ? tensor->shape[1] : 1, elements = 1;
    for (size_t d = 0; scale && d < scale->rank; ++d)
        elements *= scale->shape[d];
    if (!scale || elements != rows ||
        (scale->dtype != CHECKPOINT_F32 && scale->dtype != CHECKPOINT_F16 &&
         scale->dtype != CHECKPOINT_BF16)) {
        layout->status =
            pretrained_fault(layout->message, UFORM_FORMAT, "%s: no scale %s of %llu values",
                             folder->weights[recipe->file].name, recipe->scale, (unsigned long long)rows);
        return false;
    }
    if (!out) return true;
    uint8_t const *values = shard->mapping + shard->header.data_offset + scale->begin;
    for (uint64_t r = 0; r < rows; ++r) {
        uint16_t factor;
        to_bf16(&factor, values + r * checkpoint_dtype_size(scale->dtype), scale->dtype, 1);
        for (uint64_t c = 0; c < columns; ++c)
            out[r * columns + c] = f32_to_bf16(bf16_to_f32(out[r * columns + c]) * bf16_to_f32(factor));
    }
    return true;
}

static int layout_visit(checkpoint_schema_tensor_t const *tensor, void *context) {
    layout_t *layout = context;
    uint64_t rows = tensor->shape[0], columns = tensor->rank == 2 ? tensor->shape[1] : 1;
    uint64_t bytes = rows * columns * sizeof(uint16_t);
    uint64_t begin = (layout->size + PRETRAINED_ALIGNMENT - 1) / PRETRAINED_ALIGNMENT * PRETRAINED_ALIGNMENT;
    layout->size = begin + bytes;
    size_t name_length = strlen(tensor->name) + 1;
    if (!layout->data) {
        layout->names_size += name_length;
        layout->header->tensors_count++;
    } else {
        checkpoint_tensor_t *entry = &layout->header->tensors[layout->header->tensors_count++];
        *entry = (checkpoint_tensor_t){.name = memcpy(layout->names, tensor->name, name_length),
                                       .dtype = CHECKPOINT_BF16,
                                       .rank = tensor->rank,
                                       .shape = {tensor->shape[0], tensor->shape[1]},
                                       .begin = begin,
                                       .end = begin + bytes};
        layout->names += name_length;
    }
    /* Sizing checks every source, so that nothing is allocated for weights the file does not hold. */
    pretrained_t const *folder = layout->folder;
    pretrained_tower_t const *tower = strcmp(tensor->tower, "text") == 0 ? &folder->text : &folder->image;
    recipe_t recipe;
    if (!recipe_of(tower, tensor, &recipe)) {
        layout->status = pretrained_fault(layout->message, UFORM_INTERNAL, "no weights for %s", tensor->name);
        return 1;
    }
    char const *file = folder->weights[recipe.file].name;
    uint16_t *out = layout->data ? (uint16_t *)(void *)(layout->data + begin) : NULL;
    uint64_t filled = recipe.zero_row ? columns : 0; /* the zero row: the data is zeroed */
    for (size_t s = 0; s < recipe.count; ++s) {
        pretrained_shard_t const *shard = NULL;
        checkpoint_tensor_t const *source = weight(folder, tower, recipe.file, recipe.names[s], &shard);
        if (!source) {
            layout->status = pretrained_fault(layout->message, UFORM_FORMAT, "%s: no tensor %s (for %s)",
                                              file, recipe.names[s], tensor->name);
            return 1;
        }
        if (source->dtype != CHECKPOINT_F32 && source->dtype != CHECKPOINT_F16 &&
            source->dtype != CHECKPOINT_BF16) {
            layout->status =
                pretrained_fault(layout->message, UFORM_UNSUPPORTED, "%s: %s is %s, not F32, F16 or BF16",
                                 file, recipe.names[s], checkpoint_dtype_name(source->dtype));
            return 1;
        }
        /* Rows and the elements of each, leading dimensions of 1 dropped ([1, 1, H] is [H]): a convolution's
         * [H, 3, P, P] is the patch layer's [H, 3P^2]. */
        size_t first = 0;
        while (!recipe.first_row && first + 1 < source->rank && source->shape[first] == 1 &&
               source->rank - first > tensor->rank)
            first++;
        size_t rank = source->rank - first;
        uint64_t source_rows = rank >= 1 ? source->shape[first] : 1, source_columns = 1;
        for (size_t d = first + 1; d < source->rank; ++d)
            source_columns *= source->shape[d];
        bool fits = recipe.first_row
                        ? rank == 2 && source_rows >= 1 && source_columns == tensor->shape[0]
                        : (tensor->rank == 1 ? rank == 1 : rank >= 2) && source_columns == columns &&
                              filled + source_rows * columns <= rows * columns;
        if (!fits) {
            layout->status =
                pretrained_fault(layout->message, UFORM_FORMAT,
                                 "%s: %s has a shape the configuration does not give", file, recipe.names[s]);
            return 1;
        }
        uint64_t take = recipe.first_row ? tensor->shape[0] : source_rows * source_columns;
        uint8_t const *values = shard->mapping + shard->header.data_offset + source->begin;
        if (out) to_bf16(out + filled, values, source->dtype, (size_t)take);
        filled += take;
    }
    if (recipe.scale[0] && !scale_rows(layout, tower, &recipe, tensor, out)) return 1;
    if (recipe.count > 0 && filled != rows * columns) {
        layout->status =
            pretrained_fault(layout->message, UFORM_FORMAT,
                             "%s: %s has a shape the configuration does not give", file, recipe.names[0]);
        return 1;
    }
    return 0;
}

static int compare_names(void const *left, void const *right) {
    return strcmp(((checkpoint_tensor_t const *)left)->name, ((checkpoint_tensor_t const *)right)->name);
}

/* The model's data section and header from the folder's weights. */
static uform_status_t build_data(pretrained_t *folder, pretrained_model_t *model, uform_executor_t *executor,
                                 char const **message) {
    checkpoint_header_t *header = &model->header;
    layout_t sizing = {.folder = folder, .header = header, .message = message, .status = UFORM_OK};
    if (checkpoint_schema_each(&folder->info, layout_visit, &sizing)) return sizing.status;
    header->info = folder->info;
    header->tensors = calloc(header->tensors_count, sizeof *header->tensors);
    header->names = malloc(sizing.names_size);
    model->data_size = (size_t)sizing.size;
    model->data = executor_allocate(executor, model->data_size);
    if (!header->tensors || !header->names || !model->data)
        return pretrained_fault(message, UFORM_OUT_OF_MEMORY, "out of memory for the weights");
    memset(model->data, 0, model->data_size);
    layout_t filling = {.folder = folder,
                        .header = header,
                        .data = model->data,
                        .names = header->names,
                        .message = message,
                        .status = UFORM_OK};
    header->tensors_count = 0;
    if (checkpoint_schema_each(&folder->info, layout_visit, &filling)) return filling.status;
    qsort(header->tensors, header->tensors_count, sizeof *header->tensors, compare_names);
    header->data_size = sizing.size;
    size_t parameters = 0;
    for (size_t i = 0; i < header->tensors_count; ++i)
        parameters += (size_t)((header->tensors[i].end - header->tensors[i].begin) / sizeof(uint16_t));
    header->info.parameters = parameters;
    header->info.bytes = 2 * parameters;
    return UFORM_OK;
}

/* The folder's tokenizer, truncating at the context as sentence-transformers asks its tokenizer to (over
 * the file's own truncation), without the file's padding: sentence-transformers pads to the batch's
 * longest text and masks the padding out, which packing without padding matches. */
static uform_status_t open_tokenizer(pretrained_t const *folder, pretrained_model_t *model,
                                     char const **message) {
    uform_status_t status = uform_tokenizer_open(folder->transformer, &model->tokenizer);
    if (status != UFORM_OK)
        return pretrained_fault(message, status, "tokenizer: %s", uform_last_error().message);
    uform_tokenizer_info_t about;
    uform_tokenizer_info(model->tokenizer, &about);
    if (about.vocabulary > folder->info.text.vocab)
        return pretrained_fault(message, UFORM_FORMAT,
                                "tokenizer: ids up to %zu past the model's vocabulary of %zu",
                                about.vocabulary, folder->info.text.vocab);
    if (about.special_added >= folder->info.text.context)
        return pretrained_fault(message, UFORM_FORMAT, "tokenizer: its special tokens fill the context");
    pretrained_tokenizer_fit(model->tokenizer, folder->info.text.context, !folder->info.text.cut_ids);
#if UFORM_WITH_TOKENIZERS
    /* A tokenizer.json travels with a converted checkpoint (uform_checkpoint_convert). */
    if (!model->tokenizer->spiece) {
        json_t *text = NULL;
        status = pretrained_json(folder->transformer, "tokenizer.json", false, &text, message);
        if (status != UFORM_OK) return status;
        model->header.tokenizer = json_dumps(text, JSON_COMPACT);
        json_decref(text);
        if (!model->header.tokenizer)
            return pretrained_fault(message, UFORM_OUT_OF_MEMORY, "tokenizer: out of memory");
    }
#endif
    return UFORM_OK;
}

void pretrained_tokenizer_fit(uform_tokenizer_t *tokenizer, size_t context, bool truncate) {
#if UFORM_WITH_TOKENIZERS
    if (truncate) {
        tokenizer->truncation.on = true;
        tokenizer->truncation.only_second = false;
        tokenizer->truncation.max_length = context;
        tokenizer->truncation.direction = TRUNCATE_RIGHT;
    }
    tokenizer->padding.on = false; /* texts are packed without padding */
#else
    (void)tokenizer;
    (void)context;
    (void)truncate;
#endif
}

/* config_sentence_transformers.json's prompts (an object of names and texts) and default_prompt_name. */
static uform_status_t read_prompts(pretrained_t const *folder, pretrained_model_t *model,
                                   char const **message) {
    static char const file[] = "config_sentence_transformers.json";
    json_t *config = NULL;
    uform_status_t status = pretrained_json(folder->root, file, true, &config, message);
    if (status != UFORM_OK || !config) return status;
    json_t const *prompts = json_object_get(config, "prompts"),
                 *chosen = json_object_get(config, "default_prompt_name");
    if (prompts && !json_is_object(prompts))
        status = pretrained_fault(message, UFORM_FORMAT, "%s: prompts is not an object", file);
    char const *key;
    json_t const *value;
    if (status == UFORM_OK && prompts) json_object_foreach((json_t *)prompts, key, value) {
            if (!json_is_string(value))
                status =
                    pretrained_fault(message, UFORM_FORMAT, "%s: prompt %.40s is not a string", file, key);
        }
    if (status == UFORM_OK && chosen && !json_is_null(chosen) &&
        (!json_is_string(chosen) || !prompts || !json_object_get(prompts, json_string_value(chosen))))
        status = pretrained_fault(message, UFORM_FORMAT, "%s: default_prompt_name is not one of its prompts",
                                  file);
    if (status == UFORM_OK && prompts && json_object_size(prompts) > 0) {
        model->header.prompts = json_deep_copy(prompts);
        if (!model->header.prompts)
            status = pretrained_fault(message, UFORM_OUT_OF_MEMORY, "%s: out of memory", file);
    }
    if (status == UFORM_OK && json_is_string(chosen)) {
        model->header.default_prompt = strdup(json_string_value(chosen));
        if (!model->header.default_prompt)
            status = pretrained_fault(message, UFORM_OUT_OF_MEMORY, "%s: out of memory", file);
    }
    json_decref(config);
    return status;
}

static uform_status_t read_folder(pretrained_t *folder, pretrained_model_t *model, uform_executor_t *executor,
                                  char const **message) {
    /* sentence-transformers' modules first: the Transformer module may live in a folder of its own. */
    sentence_t sentence = {.context = SIZE_MAX};
    uform_status_t status = sentence_modules(folder, &sentence, message);
    if (status != UFORM_OK) return status;
    json_t *config = NULL;
    status = pretrained_json(folder->transformer, "config.json", false, &config, message);
    if (status != UFORM_OK) return status;
    if (!json_is_object(config)) {
        json_decref(config);
        return pretrained_fault(message, UFORM_FORMAT, "config.json: not an object");
    }
    /* The engine's settings, which each family overrides where its towers differ. */
    variant_defaults(&folder->info.text.transformer, true);
    variant_defaults(&folder->info.image.transformer, false);
    status = pretrained_family(folder, config, message);
    json_decref(config);
    if (status != UFORM_OK) return status;
    uform_model_info_t *info = &folder->info;
    if (sentence.modules && !info->has_text)
        return pretrained_fault(message, UFORM_UNSUPPORTED,
                                "modules.json: sentence-transformers modules over %s", info->family);
    /* The modules' settings over the configuration's. */
    if (sentence.pooled) info->text.transformer.pooling = sentence.pooling;
    if (sentence.modules) info->normalized = sentence.normalized;
    if (sentence.dense) { /* the pooled state through the Dense module: the tower's projection */
        uform_transformer_info_t *t = &info->text.transformer;
        if (t->projection)
            return pretrained_fault(message, UFORM_UNSUPPORTED,
                                    "modules.json: a Dense module after %s's projection", info->family);
        if (sentence.dense_in != t->hidden)
            return pretrained_fault(
                message, UFORM_FORMAT,
                "modules.json: the Dense module's in_features %zu, not the pooled width %zu",
                sentence.dense_in, t->hidden);
        pretrained_weights_t *file = &folder->weights[folder->files];
        snprintf(file->name, sizeof file->name, "%s", sentence.dense_weights);
        file->in_root = true;
        folder->text.dense = true;
        folder->text.dense_file = folder->files++;
        t->projection = true;
        t->projection_bias = sentence.dense_bias;
        t->projection_tanh = sentence.dense_tanh;
        info->dims = sentence.dense_out;
    }
    info->text.strip = sentence.modules && info->has_text; /* sentence-transformers strips every text */
    if (sentence.context < info->text.context) info->text.context = sentence.context;
    /* Clips through the image tower, as the engine's own models take them: PRETRAINED_VIDEO_FRAMES frames,
     * the unit mean of their unit embeddings (CLIP's frame-averaging baseline for video retrieval). */
    info->has_video = info->has_image;
    info->video.frames = info->has_image ? PRETRAINED_VIDEO_FRAMES : 0;
    info->matryoshka[0] = info->dims;
    info->matryoshka_count = 1;
    for (size_t i = 0; i < folder->files && status == UFORM_OK; ++i)
        status = map_weights(folder, i, message);
    if (status == UFORM_OK) status = build_data(folder, model, executor, message);
    if (status == UFORM_OK && info->has_text) status = open_tokenizer(folder, model, message);
    if (status == UFORM_OK && info->has_text) status = read_prompts(folder, model, message);
    return status;
}

uform_status_t pretrained_read(char const *path, uform_executor_t *executor, pretrained_model_t *model,
                               char const **message) {
    memset(model, 0, sizeof *model);
    pretrained_t *folder = calloc(1, sizeof *folder);
    if (!folder) return pretrained_fault(message, UFORM_OUT_OF_MEMORY, "out of memory");
    uform_status_t status = UFORM_OK;
    if (snprintf(folder->root, PATH_MAX, "%s", path) >= PATH_MAX)
        status = pretrained_fault(message, UFORM_IO, "folder path too long");
    if (status == UFORM_OK) {
        memcpy(folder->transformer, folder->root, sizeof folder->root);
        status = read_folder(folder, model, executor, message);
    }
    for (size_t i = 0; i < PRETRAINED_FILES; ++i) {
        pretrained_weights_t *file = &folder->weights[i];
        for (size_t s = 0; file->shards && s < file->shard_count; ++s) {
            pretrained_shard_t *shard = &file->shards[s];
            if (shard->mapping) munmap(shard->mapping, shard->size);
            if (shard->fd >= 0) close(shard->fd);
            checkpoint_header_free(&shard->header);
        }
        free(file->shards);
    }
    free(folder);
    if (status != UFORM_OK) {
        executor_deallocate(executor, model->data, model->data_size);
        checkpoint_header_free(&model->header);
        uform_tokenizer_free(model->tokenizer);
        memset(model, 0, sizeof *model);
    }
    return status;
}
