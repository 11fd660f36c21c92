/* The families of pretrained folders (pretrained_internal.h): each config.json read into the block's settings
 * of its towers, as the family's reference implementation (transformers 4.44) builds it, and the names of
 * its weights. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "pretrained_internal.h"
#include "variant.h"

/* ---- Shared readers ----------------------------------------------------------------------------- */

/* depth, hidden, heads, mlp of a tower's config object under Hugging Face's keys, each with its default
 * (SIZE_MAX: required), and the heads' width checked. */
typedef struct sizes_defaults {
    size_t hidden, depth, heads, mlp;
} sizes_defaults_t;

/* t->head from t->hidden and t->heads, which must divide it into heads the engine runs. */
static uform_status_t head_width(uform_transformer_info_t *t, char const *file, char const **message) {
    if (t->hidden % t->heads != 0 || t->hidden / t->heads > VARIANT_HEAD_MAX)
        return pretrained_fault(message, UFORM_UNSUPPORTED, "%s: heads of %zu / %zu values", file, t->hidden,
                                t->heads);
    t->head = t->hidden / t->heads;
    return UFORM_OK;
}

/* A size of a config object: its key, its range, its default (SIZE_MAX: required) and where it goes. */
typedef struct size_key {
    char const *key;
    size_t low, high, fallback, *value;
} size_key_t;

/* Each of `count` sizes in turn (pretrained_size): the first fault ends the reading. */
static uform_status_t read_sizes(json_t const *config, char const *file, size_key_t const *sizes,
                                 size_t count, char const **message) {
    uform_status_t status = UFORM_OK;
    for (size_t i = 0; i < count && status == UFORM_OK; ++i)
        status = pretrained_size(config, file, sizes[i].key, sizes[i].low, sizes[i].high, sizes[i].fallback,
                                 sizes[i].value, message);
    return status;
}

static uform_status_t transformer_sizes(json_t const *config, char const *file, sizes_defaults_t defaults,
                                        uform_transformer_info_t *t, char const **message) {
    size_key_t const sizes[] = {
        {"hidden_size", 8, 65536, defaults.hidden, &t->hidden},
        {"num_hidden_layers", 1, 1024, defaults.depth, &t->depth},
        {"num_attention_heads", 1, 1024, defaults.heads, &t->heads},
        {"intermediate_size", 1, 1u << 20, defaults.mlp, &t->mlp},
    };
    uform_status_t status = read_sizes(config, file, sizes, sizeof sizes / sizeof sizes[0], message);
    return status == UFORM_OK ? head_width(t, file, message) : status;
}

/* The blocks stored as they are: block i is stored block i. */
static void identity_blocks(pretrained_tower_t *tower, size_t depth) {
    for (size_t i = 0; i < depth; ++i)
        tower->blocks[i] = i;
}

static void single_file(pretrained_t *folder) {
    folder->files = 1;
    snprintf(folder->weights[0].name, sizeof folder->weights[0].name, "model.safetensors");
}

/* ---- BERT, RoBERTa, XLM-RoBERTa ------------------------------------------------------------------ */

static pretrained_names_t const bert_names = {
    .layer = "encoder.layer.%zu.",
    .norm1 = "attention.output.LayerNorm",
    .norm2 = "output.LayerNorm",
    .q = "attention.self.query",
    .k = "attention.self.key",
    .v = "attention.self.value",
    .out = "attention.output.dense",
    .up = "intermediate.dense",
    .down = "output.dense",
    .input_norm = "embeddings.LayerNorm",
    .embed = "embeddings.word_embeddings.weight",
    .positions = "embeddings.position_embeddings.weight",
    .token_type = "embeddings.token_type_embeddings.weight",
};

/* What the towers of BertModel, (XLM-)RobertaModel and DistilBertModel share, over their sizes, positions
 * and token types: post-norm LayerNorm blocks (epsilon `epsilon`) over normed input embeddings, learned
 * positions (the context: those after position_offset), no mask, pooled at the class token unless
 * sentence-transformers' modules say otherwise, not projected; weights named by `names` (with or without
 * `prefix`) in model.safetensors. */
static void bert_tower(pretrained_t *folder, double epsilon, char const *family,
                       pretrained_names_t const *names, char const *prefix) {
    uform_model_info_t *info = &folder->info;
    uform_transformer_info_t *t = &info->text.transformer;
    t->norm = UFORM_NORM_LAYER;
    t->norm_eps = (float)epsilon;
    t->post_norm = true;
    t->input_norm = true;
    t->final_norm = false;
    t->rotary = false;
    t->causal = false;
    t->pooling = UFORM_POOLING_FIRST;
    t->projection = false;
    info->text.context = info->text.positions - info->text.position_offset;
    info->has_text = true;
    info->dims = t->hidden;
    info->normalized = false;
    snprintf(info->family, sizeof info->family, "%s", family);
    folder->text.names = names;
    snprintf(folder->text.prefix, sizeof folder->text.prefix, "%s", prefix);
    identity_blocks(&folder->text, t->depth);
    single_file(folder);
}

/* config.json of a BertModel or (XLM-)RobertaModel: a post-norm text tower, learned positions (RoBERTa's
 * from the padding id + 1), token type 0, pooled at the class token unless sentence-transformers' modules
 * say otherwise. */
static uform_status_t bert_family(pretrained_t *folder, json_t const *config, char const *model_type,
                                  char const **message) {
    uform_model_info_t *info = &folder->info;
    uform_transformer_info_t *t = &info->text.transformer;
    static char const file[] = "config.json";
    uform_status_t status = transformer_sizes(
        config, file, (sizes_defaults_t){SIZE_MAX, SIZE_MAX, SIZE_MAX, SIZE_MAX}, t, message);
    size_t pad = 0, types = 0;
    size_key_t const sizes[] = {
        {"vocab_size", 1, 1u << 24, SIZE_MAX, &info->text.vocab},
        {"max_position_embeddings", 1, 1u << 20, SIZE_MAX, &info->text.positions},
        {"type_vocab_size", 0, 1u << 16, 2, &types},
        {"pad_token_id", 0, 1u << 24, 0, &pad},
    };
    if (status == UFORM_OK) status = read_sizes(config, file, sizes, sizeof sizes / sizeof sizes[0], message);
    if (status == UFORM_OK)
        status = pretrained_activation(config, file, "hidden_act", UFORM_ACTIVATION_GELU_ERF, &t->activation,
                                       message);
    double epsilon = 0;
    if (status == UFORM_OK)
        status = pretrained_real(config, file, "layer_norm_eps", 0, 0.1, 1e-12, &epsilon, message);
    if (status != UFORM_OK) return status;
    char const *positions = pretrained_string(config, "position_embedding_type");
    if (positions && strcmp(positions, "absolute") != 0)
        return pretrained_fault(message, UFORM_UNSUPPORTED, "%s: position_embedding_type \"%.40s\"", file,
                                positions);
    bool roberta = strcmp(model_type, "bert") != 0;
    info->text.position_offset = roberta ? pad + 1 : 0; /* RoBERTa counts positions from the padding id + 1 */
    info->text.pad_id = pad;
    if (info->text.position_offset >= info->text.positions)
        return pretrained_fault(message, UFORM_FORMAT, "%s: pad_token_id past max_position_embeddings", file);
    info->text.token_type = types > 0;
    bert_tower(folder, epsilon, model_type, &bert_names, roberta ? "roberta." : "bert.");
    return UFORM_OK;
}

/* ---- DistilBERT ---------------------------------------------------------------------------------- */

static pretrained_names_t const distilbert_names = {
    .layer = "transformer.layer.%zu.",
    .norm1 = "sa_layer_norm",
    .norm2 = "output_layer_norm",
    .q = "attention.q_lin",
    .k = "attention.k_lin",
    .v = "attention.v_lin",
    .out = "attention.out_lin",
    .up = "ffn.lin1",
    .down = "ffn.lin2",
    .input_norm = "embeddings.LayerNorm",
    .embed = "embeddings.word_embeddings.weight",
    .positions = "embeddings.position_embeddings.weight",
};

/* config.json of a DistilBertModel: BERT's post-norm tower under other names and keys (dim, n_layers,
 * n_heads, hidden_dim, activation), without token types, LayerNorm's epsilon fixed at 1e-12, learned
 * positions (sinusoidal ones are refused); pooled at the class token unless sentence-transformers' modules
 * say otherwise. */
static uform_status_t distilbert_family(pretrained_t *folder, json_t const *config, char const **message) {
    uform_model_info_t *info = &folder->info;
    uform_transformer_info_t *t = &info->text.transformer;
    static char const file[] = "config.json";
    size_key_t const sizes[] = {
        {"dim", 8, 65536, 768, &t->hidden},
        {"n_layers", 1, 1024, 6, &t->depth},
        {"n_heads", 1, 1024, 12, &t->heads},
        {"hidden_dim", 1, 1u << 20, 3072, &t->mlp},
        {"vocab_size", 1, 1u << 24, 30522, &info->text.vocab},
        {"max_position_embeddings", 1, 1u << 20, 512, &info->text.positions},
        {"pad_token_id", 0, 1u << 24, 0, &info->text.pad_id},
    };
    uform_status_t status = read_sizes(config, file, sizes, sizeof sizes / sizeof sizes[0], message);
    if (status == UFORM_OK)
        status = pretrained_activation(config, file, "activation", UFORM_ACTIVATION_GELU_ERF, &t->activation,
                                       message);
    if (status != UFORM_OK) return status;
    if (json_is_true(json_object_get(config, "sinusoidal_pos_embds")))
        return pretrained_fault(message, UFORM_UNSUPPORTED, "%s: sinusoidal_pos_embds", file);
    if ((status = head_width(t, file, message)) != UFORM_OK) return status;
    info->text.position_offset = 0;
    info->text.token_type = false;
    bert_tower(folder, 1e-12, "distilbert", &distilbert_names, "distilbert.");
    return UFORM_OK;
}

/* ---- MPNet --------------------------------------------------------------------------------------- */

static pretrained_names_t const mpnet_names = {
    .layer = "encoder.layer.%zu.",
    .norm1 = "attention.LayerNorm",
    .norm2 = "output.LayerNorm",
    .q = "attention.attn.q",
    .k = "attention.attn.k",
    .v = "attention.attn.v",
    .out = "attention.attn.o",
    .up = "intermediate.dense",
    .down = "output.dense",
    .input_norm = "embeddings.LayerNorm",
    .embed = "embeddings.word_embeddings.weight",
    .positions = "embeddings.position_embeddings.weight",
    .relative_bias = "encoder.relative_attention_bias.weight",
};

/* config.json of an MPNetModel (all-mpnet-base-v2, multi-qa-mpnet-base-*): BERT's post-norm tower under
 * its own names, without token types, with learned positions counted from its padding id (1, which
 * MPNetEmbeddings fixes whatever pad_token_id says) + 1, as RoBERTa's, and every block's attention biased
 * by relative position (encoder.relative_attention_bias [32, heads]: the 32 buckets MPNet's encoder
 * computes whatever relative_attention_num_buckets says, so that another count is refused). Pooled at the
 * class token unless sentence-transformers' modules say otherwise. */
static uform_status_t mpnet_family(pretrained_t *folder, json_t const *config, char const **message) {
    uform_model_info_t *info = &folder->info;
    uform_transformer_info_t *t = &info->text.transformer;
    static char const file[] = "config.json";
    uform_status_t status =
        transformer_sizes(config, file, (sizes_defaults_t){768, 12, 12, 3072}, t, message);
    size_t buckets = 0;
    size_key_t const sizes[] = {
        {"vocab_size", 1, 1u << 24, 30527, &info->text.vocab},
        {"max_position_embeddings", 3, 1u << 20, 512, &info->text.positions},
        {"relative_attention_num_buckets", 1, 1u << 16, VARIANT_RELATIVE_BUCKETS, &buckets},
    };
    if (status == UFORM_OK) status = read_sizes(config, file, sizes, sizeof sizes / sizeof sizes[0], message);
    if (status == UFORM_OK)
        status = pretrained_activation(config, file, "hidden_act", UFORM_ACTIVATION_GELU_ERF, &t->activation,
                                       message);
    double epsilon = 0;
    if (status == UFORM_OK)
        status = pretrained_real(config, file, "layer_norm_eps", 0, 0.1, 1e-12, &epsilon, message);
    if (status != UFORM_OK) return status;
    if (buckets != VARIANT_RELATIVE_BUCKETS)
        return pretrained_fault(message, UFORM_UNSUPPORTED,
                                "%s: relative_attention_num_buckets %zu (MPNet's encoder computes %d)", file,
                                buckets, VARIANT_RELATIVE_BUCKETS);
    info->text.pad_id = 1;
    info->text.position_offset = 2;
    info->text.token_type = false;
    t->relative_buckets = VARIANT_RELATIVE_BUCKETS;
    bert_tower(folder, epsilon, "mpnet", &mpnet_names, "mpnet.");
    return UFORM_OK;
}

/* ---- CLIP ---------------------------------------------------------------------------------------- */

#define CLIP_BLOCK                                                                                           \
    .norm1 = "layer_norm1", .norm2 = "layer_norm2", .q = "self_attn.q_proj", .k = "self_attn.k_proj",        \
    .v = "self_attn.v_proj", .out = "self_attn.out_proj", .up = "mlp.fc1", .down = "mlp.fc2"

static pretrained_names_t const clip_text_names = {
    .layer = "text_model.encoder.layers.%zu.",
    CLIP_BLOCK,
    .final_norm = "text_model.final_layer_norm",
    .proj = "text_projection.weight",
    .embed = "text_model.embeddings.token_embedding.weight",
    .positions = "text_model.embeddings.position_embedding.weight",
};

static pretrained_names_t const clip_image_names = {
    .layer = "vision_model.encoder.layers.%zu.",
    CLIP_BLOCK,
    .final_norm = "vision_model.post_layernorm",
    .input_norm = "vision_model.pre_layrnorm",
    .proj = "visual_projection.weight",
    .patch = "vision_model.embeddings.patch_embedding.weight",
    .cls = "vision_model.embeddings.class_embedding",
    .positions = "vision_model.embeddings.position_embedding.weight",
};

/* A pre-norm CLIP tower (CLIPEncoderLayer) with transformers' CLIPTextConfig or CLIPVisionConfig defaults
 * where `config` is sparse. */
static uform_status_t clip_tower(json_t const *config, char const *file, sizes_defaults_t defaults,
                                 double eps, uform_activation_t activation, uform_transformer_info_t *t,
                                 char const **message) {
    uform_status_t status = transformer_sizes(config, file, defaults, t, message);
    if (status == UFORM_OK)
        status = pretrained_activation(config, file, "hidden_act", activation, &t->activation, message);
    double epsilon = 0;
    if (status == UFORM_OK)
        status = pretrained_real(config, file, "layer_norm_eps", 0, 0.1, eps, &epsilon, message);
    t->norm = UFORM_NORM_LAYER;
    t->norm_eps = (float)epsilon;
    t->post_norm = false;
    t->final_norm = true;
    t->rotary = false;
    t->projection = true;
    return status;
}

/* The image processor's size and normalization (preprocessor_config.json, CLIPImageProcessor), or
 * OpenAI CLIP's where the folder has none. */
/* A size of the image processor: a number, or {"height", "width"} (square), or {"shortest_edge"}; 0 where
 * absent. */
static uform_status_t processor_side(json_t const *processor, char const *file, char const *key, size_t *side,
                                     char const **message) {
    json_t const *value = json_object_get(processor, key);
    *side = 0;
    if (!value) return UFORM_OK;
    if (!json_is_object(value))
        return pretrained_size(processor, file, key, 1, 8192, SIZE_MAX, side, message);
    if (json_object_get(value, "shortest_edge"))
        return pretrained_size(value, file, "shortest_edge", 1, 8192, SIZE_MAX, side, message);
    size_t height = 0;
    uform_status_t status = pretrained_size(value, file, "width", 1, 8192, SIZE_MAX, side, message);
    if (status == UFORM_OK)
        status = pretrained_size(value, file, "height", 1, 8192, SIZE_MAX, &height, message);
    if (status == UFORM_OK && height != *side)
        status = pretrained_fault(message, UFORM_UNSUPPORTED, "%s: a %s that is not square", file, key);
    return status;
}

/* The image processor of a Hugging Face folder (preprocessor_config.json: CLIPImageProcessor, with the short
 * side resized and the centre cropped; SiglipImageProcessor, resized to the square), or its class's
 * defaults where the folder has none: Pillow's resampling (BICUBIC unless it says BILINEAR), the mean and the
 * std. Its sizes must be the tower's image_size. */
static uform_status_t clip_preprocessor(pretrained_t *folder, size_t image_size, float const mean[3],
                                        float const std[3], uform_image_resize_t resize,
                                        char const **message) {
    uform_model_info_t *info = &folder->info;
    memcpy(info->image.mean, mean, 3 * sizeof(float));
    memcpy(info->image.std, std, 3 * sizeof(float));
    info->image.size = image_size;
    info->image.resize = resize;
    info->image.resample = UFORM_RESAMPLE_PILLOW_BICUBIC;
    json_t *processor = NULL;
    static char const file[] = "preprocessor_config.json";
    uform_status_t status = pretrained_json(folder->transformer, file, true, &processor, message);
    if (status != UFORM_OK || !processor) return status;
    json_t const *triples[] = {json_object_get(processor, "image_mean"),
                               json_object_get(processor, "image_std")};
    float *targets[] = {info->image.mean, info->image.std};
    for (size_t k = 0; k < 2 && status == UFORM_OK; ++k) {
        if (!triples[k]) continue;
        if (!json_is_array(triples[k]) || json_array_size(triples[k]) != 3) {
            status = pretrained_fault(message, UFORM_FORMAT,
                                      "%s: image_mean or image_std is not three numbers", file);
            break;
        }
        for (size_t c = 0; c < 3; ++c) {
            json_t const *value = json_array_get(triples[k], c);
            double number = json_is_number(value) ? json_number_value(value) : -1e9;
            if (!(number > (k ? 1.0 / 1024 : -8.0) && number <= (k ? 1024.0 : 8.0))) {
                status =
                    pretrained_fault(message, UFORM_FORMAT, "%s: image_mean or image_std out of range", file);
                break;
            }
            targets[k][c] = (float)number;
        }
    }
    /* The sizes: the tower's positions fix them to image_size. */
    static char const *const sides[] = {"size", "crop_size"};
    for (size_t k = 0; k < 2 && status == UFORM_OK; ++k) {
        size_t side = 0;
        status = processor_side(processor, file, sides[k], &side, message);
        if (status == UFORM_OK && side && side != image_size)
            status =
                pretrained_fault(message, UFORM_UNSUPPORTED, "%s: %s %zu, not the tower's image_size %zu",
                                 file, sides[k], side, image_size);
    }
    /* PIL's resampling filters: 2 BILINEAR, 3 BICUBIC. */
    size_t filter = 3;
    if (status == UFORM_OK) status = pretrained_size(processor, file, "resample", 0, 5, 3, &filter, message);
    if (status == UFORM_OK && filter != 2 && filter != 3)
        status = pretrained_fault(message, UFORM_UNSUPPORTED,
                                  "%s: resample %zu (only 2, bilinear, and 3, bicubic)", file, filter);
    if (filter == 2) info->image.resample = UFORM_RESAMPLE_PILLOW_BILINEAR;
    json_t const *switches[] = {
        json_object_get(processor, "do_resize"), json_object_get(processor, "do_normalize"),
        json_object_get(processor, "do_rescale"),
        resize == UFORM_RESIZE_SQUARE ? NULL : json_object_get(processor, "do_center_crop")};
    for (size_t k = 0; k < 4 && status == UFORM_OK; ++k)
        if (switches[k] && !json_is_true(switches[k]))
            status =
                pretrained_fault(message, UFORM_UNSUPPORTED, "%s: a step of the processor turned off", file);
    json_t const *rescale = json_object_get(processor, "rescale_factor");
    if (status == UFORM_OK && rescale &&
        !(json_is_number(rescale) && fabs(json_number_value(rescale) - 1.0 / 255) < 1e-9))
        status = pretrained_fault(message, UFORM_UNSUPPORTED, "%s: a rescale_factor other than 1/255", file);
    json_decref(processor);
    return status;
}

/* transformers' defaults of a two-tower model's text_config and vision_config. */
typedef struct two_tower_defaults {
    sizes_defaults_t text, vision;
    double eps;                    /* layer_norm_eps */
    uform_activation_t activation; /* hidden_act */
    size_t vocab, positions;       /* vocab_size, max_position_embeddings */
    size_t image_size, patch;      /* image_size, patch_size */
} two_tower_defaults_t;

/* What CLIP's and SigLIP's config.json share: text_config and vision_config (absent: the defaults), each a
 * pre-norm tower of CLIP's layers, the text tower's vocabulary and positions, the image's size
 * and patches. Sets `*text` and `*vision` to the towers' objects (borrowed from `config` or `empty`). */
static uform_status_t two_tower_config(pretrained_t *folder, json_t const *config, json_t const *empty,
                                       two_tower_defaults_t const *defaults, json_t const **text,
                                       json_t const **vision, size_t *image_size, char const **message) {
    uform_model_info_t *info = &folder->info;
    static char const tfile[] = "config.json text_config", vfile[] = "config.json vision_config";
    *text = json_object_get(config, "text_config");
    *vision = json_object_get(config, "vision_config");
    if ((*text && !json_is_object(*text)) || (*vision && !json_is_object(*vision)))
        return pretrained_fault(message, UFORM_FORMAT,
                                "config.json: text_config or vision_config is not an object");
    if (!*text) *text = empty;
    if (!*vision) *vision = empty;
    uform_transformer_info_t *tt = &info->text.transformer, *vt = &info->image.transformer;
    uform_status_t status =
        clip_tower(*text, tfile, defaults->text, defaults->eps, defaults->activation, tt, message);
    if (status == UFORM_OK)
        status =
            clip_tower(*vision, vfile, defaults->vision, defaults->eps, defaults->activation, vt, message);
    struct {
        json_t const *object;
        char const *file, *key;
        size_t high, fallback, *value;
    } const sizes[] = {
        {*text, tfile, "vocab_size", 1u << 24, defaults->vocab, &info->text.vocab},
        {*text, tfile, "max_position_embeddings", 1u << 20, defaults->positions, &info->text.positions},
        {*vision, vfile, "image_size", 8192, defaults->image_size, image_size},
        {*vision, vfile, "patch_size", 8192, defaults->patch, &info->image.patch},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0] && status == UFORM_OK; ++i)
        status = pretrained_size(sizes[i].object, sizes[i].file, sizes[i].key, 1, sizes[i].high,
                                 sizes[i].fallback, sizes[i].value, message);
    if (status != UFORM_OK) return status;
    if (*image_size % info->image.patch != 0)
        return pretrained_fault(message, UFORM_FORMAT,
                                "config.json: image_size is not a multiple of patch_size");
    info->has_text = info->has_image = true;
    info->normalized = false;
    identity_blocks(&folder->text, tt->depth);
    identity_blocks(&folder->image, vt->depth);
    single_file(folder);
    return UFORM_OK;
}

/* config.json of a CLIPModel: text_config and vision_config over transformers' defaults. */
static uform_status_t clip_family(pretrained_t *folder, json_t const *config, char const **message) {
    uform_model_info_t *info = &folder->info;
    static char const file[] = "config.json";
    static two_tower_defaults_t const defaults = {.text = {512, 12, 8, 2048},
                                                  .vision = {768, 12, 12, 3072},
                                                  .eps = 1e-5,
                                                  .activation = UFORM_ACTIVATION_GELU_QUICK,
                                                  .vocab = 49408,
                                                  .positions = 77,
                                                  .image_size = 224,
                                                  .patch = 32};
    json_t *empty = json_object();
    json_t const *text = NULL, *vision = NULL;
    uform_transformer_info_t *tt = &info->text.transformer, *vt = &info->image.transformer;
    size_t eos = 0, image_size = 0;
    uform_status_t status =
        pretrained_size(config, file, "projection_dim", 1, 65536, 512, &info->dims, message);
    if (status == UFORM_OK)
        status = two_tower_config(folder, config, empty, &defaults, &text, &vision, &image_size, message);
    if (status == UFORM_OK)
        status = pretrained_size(text, "config.json text_config", "eos_token_id", 0, 1u << 24, 49407, &eos,
                                 message);
    json_decref(empty);
    if (status != UFORM_OK) return status;
    /* The pooled token: transformers takes the largest id where eos_token_id is 2 (older configs), else the
     * first eos_token_id; both are the end-of-text token's position when it is the vocabulary's last id. */
    if (eos != 2 && eos != info->text.vocab - 1)
        return pretrained_fault(message, UFORM_UNSUPPORTED,
                                "%s: an eos_token_id that is not the vocabulary's last", file);
    tt->causal = true;
    tt->input_norm = false;
    tt->pooling = UFORM_POOLING_END;
    vt->causal = false;
    vt->input_norm = true;
    vt->pooling = UFORM_POOLING_FIRST;
    info->text.context = info->text.positions;
    snprintf(info->family, sizeof info->family, "clip");
    folder->text.names = &clip_text_names;
    folder->image.names = &clip_image_names;
    static float const mean[3] = {0.48145466f, 0.4578275f, 0.40821073f},
                       std[3] = {0.26862954f, 0.26130258f, 0.27577711f};
    return clip_preprocessor(folder, image_size, mean, std, UFORM_RESIZE_SHORT_SIDE, message);
}

/* ---- UForm 3 ------------------------------------------------------------------------------------- */

static pretrained_names_t const uform3_text_names = {
    .layer = "blocks.%zu.",
    .norm1 = "norm_attn",
    .norm2 = "norm_mlp",
    .q = "attention.query",
    .k = "attention.key",
    .v = "attention.value",
    .out = "attention.out",
    .up = "mlp.hidden_layer",
    .down = "mlp.output_layer",
    .input_norm = "layer_norm",
    .proj = "embedding_projection.weight",
    .embed = "word_embeddings.weight",
    .positions = "position_embeddings.weight",
};

static pretrained_names_t const uform3_image_names = {
    .layer = "blocks.%zu.",
    .norm1 = "norm1",
    .norm2 = "norm2",
    .q = "attn.query",
    .k = "attn.key",
    .v = "attn.value",
    .out = "attn.out",
    .up = "mlp.hidden_layer",
    .down = "mlp.output_layer",
    .final_norm = "norm",
    .proj = "embedding_projection.weight",
    .patch = "patch_embed.weight",
    .patch_bias = "patch_embed.bias",
    .cls = "cls_token",
    .positions = "pos_embed",
    .scale1 = "ls1.gamma",
    .scale2 = "ls2.gamma",
    .class_unplaced = true,
    .registers = "reg_token",
};

/* "pooling": "cls" or "mean" (both towers). */
static uform_status_t uform3_pooling(json_t const *tower, char const *file, uform_pooling_t *pooling,
                                     char const **message) {
    char const *name = pretrained_string(tower, "pooling");
    if (!name || strcmp(name, "cls") == 0)
        *pooling = UFORM_POOLING_FIRST;
    else if (strcmp(name, "mean") == 0)
        *pooling = UFORM_POOLING_MEAN;
    else
        return pretrained_fault(message, UFORM_UNSUPPORTED, "%s: pooling \"%.40s\"", file, name);
    return UFORM_OK;
}

/* The text encoder: a post-norm BERT without token types that runs only the blocks outside
 * multimodal_layers_ids (the others cross-attend to an image, for re-ranking), its ids cut at the context
 * after the tokenizer, pooled by its class token or the mean, projected without bias. */
static uform_status_t uform3_text(pretrained_t *folder, json_t const *tower, char const **message) {
    static char const file[] = "config.json text_encoder";
    uform_model_info_t *info = &folder->info;
    uform_transformer_info_t *t = &info->text.transformer;
    size_t layers = 0, pad = 0, dims = 0;
    uform_status_t status = UFORM_OK;
    struct {
        char const *key;
        size_t low, high, fallback, *value;
    } const sizes[] = {
        {"dim", 8, 65536, SIZE_MAX, &t->hidden},
        {"num_layers", 1, 1024, SIZE_MAX, &layers},
        {"num_heads", 1, 1024, SIZE_MAX, &t->heads},
        {"vocab_size", 1, 1u << 24, SIZE_MAX, &info->text.vocab},
        {"padding_idx", 0, 1u << 24, 0, &pad},
        {"embedding_dim", 1, 65536, SIZE_MAX, &dims},
        {"max_position_embeddings", 1, 1u << 20, 77, &info->text.positions},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0] && status == UFORM_OK; ++i)
        status = pretrained_size(tower, file, sizes[i].key, sizes[i].low, sizes[i].high, sizes[i].fallback,
                                 sizes[i].value, message);
    if (status == UFORM_OK) status = uform3_pooling(tower, file, &t->pooling, message);
    if (status != UFORM_OK) return status;
    char const *model_type = pretrained_string(tower, "model_type");
    if (model_type && strcmp(model_type, "bert") != 0)
        return pretrained_fault(message, UFORM_UNSUPPORTED, "%s: model_type \"%.40s\"", file, model_type);
    if (t->hidden % t->heads != 0 || t->hidden / t->heads > VARIANT_HEAD_MAX)
        return pretrained_fault(message, UFORM_UNSUPPORTED, "%s: heads of %zu / %zu values", file, t->hidden,
                                t->heads);
    /* The blocks that run: those not listed in multimodal_layers_ids. */
    bool multimodal[1024] = {false};
    json_t const *ids = json_object_get(tower, "multimodal_layers_ids");
    if (ids && !json_is_array(ids))
        return pretrained_fault(message, UFORM_FORMAT, "%s: multimodal_layers_ids is not a list", file);
    size_t index;
    json_t const *id;
    json_array_foreach(ids, index, id) {
        if (!json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= (json_int_t)layers)
            return pretrained_fault(message, UFORM_FORMAT, "%s: multimodal_layers_ids out of range", file);
        multimodal[json_integer_value(id)] = true;
    }
    t->depth = 0;
    for (size_t i = 0; i < layers; ++i)
        if (!multimodal[i]) folder->text.blocks[t->depth++] = i;
    if (t->depth == 0) return pretrained_fault(message, UFORM_FORMAT, "%s: every block is multimodal", file);
    t->head = t->hidden / t->heads;
    t->mlp = 4 * t->hidden;
    t->norm = UFORM_NORM_LAYER;
    t->norm_eps = 1e-12f;
    t->post_norm = true;
    t->input_norm = true;
    t->final_norm = false;
    t->activation = UFORM_ACTIVATION_GELU_ERF;
    t->rotary = false;
    t->causal = false;
    t->projection = true;
    info->text.context = info->text.positions;
    info->text.cut_ids = true;
    info->dims = dims;
    info->has_text = true;
    folder->text.names = &uform3_text_names;
    folder->text.file = 0;
    return UFORM_OK;
}

/* The image encoder: a pre-norm ViT with LayerScale, its class token unplaced, positions on the patches. */
static uform_status_t uform3_image(pretrained_t *folder, json_t const *tower, char const **message) {
    static char const file[] = "config.json image_encoder";
    uform_model_info_t *info = &folder->info;
    uform_transformer_info_t *t = &info->image.transformer;
    size_t dims = 0, registers = 0;
    uform_status_t status = UFORM_OK;
    struct {
        char const *key;
        size_t low, high, fallback, *value;
    } const sizes[] = {
        {"dim", 8, 65536, SIZE_MAX, &t->hidden},
        {"num_layers", 1, 1024, SIZE_MAX, &t->depth},
        {"num_heads", 1, 1024, SIZE_MAX, &t->heads},
        {"patch_size", 1, 8192, SIZE_MAX, &info->image.patch},
        {"image_size", 1, 8192, SIZE_MAX, &info->image.size},
        {"embedding_dim", 1, 65536, SIZE_MAX, &dims},
        {"num_reg_tokens", 0, VARIANT_REGISTERS_MAX, 0, &registers},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0] && status == UFORM_OK; ++i)
        status = pretrained_size(tower, file, sizes[i].key, sizes[i].low, sizes[i].high, sizes[i].fallback,
                                 sizes[i].value, message);
    if (status == UFORM_OK) status = uform3_pooling(tower, file, &t->pooling, message);
    if (status != UFORM_OK) return status;
    if (t->pooling != UFORM_POOLING_FIRST)
        return pretrained_fault(message, UFORM_UNSUPPORTED, "%s: image pooling other than cls", file);
    if (info->image.size % info->image.patch != 0)
        return pretrained_fault(message, UFORM_FORMAT, "%s: image_size is not a multiple of patch_size",
                                file);
    if (t->hidden % t->heads != 0 || t->hidden / t->heads > VARIANT_HEAD_MAX)
        return pretrained_fault(message, UFORM_UNSUPPORTED, "%s: heads of %zu / %zu values", file, t->hidden,
                                t->heads);
    if (dims != info->dims)
        return pretrained_fault(message, UFORM_FORMAT, "config.json: the towers' embedding_dim differ");
    json_t const *triples[] = {json_object_get(tower, "normalization_means"),
                               json_object_get(tower, "normalization_deviations")};
    float *targets[] = {info->image.mean, info->image.std};
    for (size_t k = 0; k < 2; ++k) {
        if (!json_is_array(triples[k]) || json_array_size(triples[k]) != 3)
            return pretrained_fault(message, UFORM_FORMAT,
                                    "%s: normalization_means or _deviations is not three numbers", file);
        for (size_t c = 0; c < 3; ++c) {
            json_t const *value = json_array_get(triples[k], c);
            double number = json_is_number(value) ? json_number_value(value) : -1e9;
            if (!(number > (k ? 1.0 / 1024 : -8.0) && number <= (k ? 1024.0 : 8.0)))
                return pretrained_fault(message, UFORM_FORMAT, "%s: normalization out of range", file);
            targets[k][c] = (float)number;
        }
    }
    info->image.resize = UFORM_RESIZE_SHORT_SIDE_ROUND_CROP; /* torchvision's Resize and CenterCrop */
    info->image.resample = UFORM_RESAMPLE_PILLOW_BICUBIC;
    t->head = t->hidden / t->heads;
    t->mlp = 4 * t->hidden;
    t->norm = UFORM_NORM_LAYER;
    t->norm_eps = 1e-6f;
    t->post_norm = false;
    t->input_norm = false;
    t->final_norm = true;
    t->activation = UFORM_ACTIVATION_GELU_ERF;
    t->rotary = false;
    t->causal = false;
    t->projection = true;
    info->has_image = true;
    folder->image.names = &uform3_image_names;
    folder->image.file = 1;
    folder->image.registers = registers > 0;
    t->registers = registers;
    identity_blocks(&folder->image, t->depth);
    return UFORM_OK;
}

/* config.json with text_encoder and image_encoder (unum-cloud/uform3-image-text-*): text_encoder.safetensors
 * and image_encoder.safetensors. */
static uform_status_t uform3_family(pretrained_t *folder, json_t const *config, char const **message) {
    json_t const *text = json_object_get(config, "text_encoder"),
                 *image = json_object_get(config, "image_encoder");
    if (!json_is_object(text) || !json_is_object(image))
        return pretrained_fault(message, UFORM_FORMAT,
                                "config.json: text_encoder or image_encoder is not an object");
    uform_status_t status = uform3_text(folder, text, message);
    if (status == UFORM_OK) status = uform3_image(folder, image, message);
    if (status != UFORM_OK) return status;
    folder->info.normalized = false;
    snprintf(folder->info.family, sizeof folder->info.family, "uform3");
    folder->files = 2;
    snprintf(folder->weights[0].name, sizeof folder->weights[0].name, "text_encoder.safetensors");
    snprintf(folder->weights[1].name, sizeof folder->weights[1].name, "image_encoder.safetensors");
    return UFORM_OK;
}

/* ---- SigLIP -------------------------------------------------------------------------------------- */

static pretrained_names_t const siglip_text_names = {
    .layer = "text_model.encoder.layers.%zu.",
    CLIP_BLOCK,
    .final_norm = "text_model.final_layer_norm",
    .proj = "text_model.head.weight",
    .proj_bias = "text_model.head.bias",
    .embed = "text_model.embeddings.token_embedding.weight",
    .positions = "text_model.embeddings.position_embedding.weight",
};

static pretrained_names_t const siglip_image_names = {
    .layer = "vision_model.encoder.layers.%zu.",
    CLIP_BLOCK,
    .final_norm = "vision_model.post_layernorm",
    .patch = "vision_model.embeddings.patch_embedding.weight",
    .patch_bias = "vision_model.embeddings.patch_embedding.bias",
    .positions = "vision_model.embeddings.position_embedding.weight",
    .head_probe = "vision_model.head.probe",
    .head_qkv_weight = "vision_model.head.attention.in_proj_weight",
    .head_qkv_bias = "vision_model.head.attention.in_proj_bias",
    .head_out = "vision_model.head.attention.out_proj",
    .head_norm = "vision_model.head.layernorm",
    .head_up = "vision_model.head.mlp.fc1",
    .head_down = "vision_model.head.mlp.fc2",
};

/* config.json of a SiglipModel: text_config and vision_config over transformers' defaults. The text tower
 * reads texts padded to its context with the padding id (as SigLIP was trained, and as transformers'
 * documentation calls it: padding="max_length"), attends to every position and pools the last through
 * its head; the image tower has no class token and pools through its attention head. */
static uform_status_t siglip_family(pretrained_t *folder, json_t const *config, char const **message) {
    uform_model_info_t *info = &folder->info;
    static char const file[] = "config.json";
    static two_tower_defaults_t const defaults = {.text = {768, 12, 12, 3072},
                                                  .vision = {768, 12, 12, 3072},
                                                  .eps = 1e-6,
                                                  .activation = UFORM_ACTIVATION_GELU_TANH,
                                                  .vocab = 32000,
                                                  .positions = 64,
                                                  .image_size = 224,
                                                  .patch = 16};
    json_t *empty = json_object();
    json_t const *text = NULL, *vision = NULL;
    uform_transformer_info_t *tt = &info->text.transformer, *vt = &info->image.transformer;
    size_t image_size = 0;
    uform_status_t status =
        two_tower_config(folder, config, empty, &defaults, &text, &vision, &image_size, message);
    if (status == UFORM_OK)
        status = pretrained_size(text, "config.json text_config", "pad_token_id", 0, 1u << 24, 1,
                                 &info->text.pad_id, message);
    json_t const *head = status == UFORM_OK ? json_object_get(vision, "vision_use_head") : NULL;
    bool without_head = head && !json_is_true(head);
    json_decref(empty);
    if (status != UFORM_OK) return status;
    if (without_head)
        return pretrained_fault(message, UFORM_UNSUPPORTED, "%s: a vision tower without its head", file);
    if (tt->hidden != vt->hidden)
        return pretrained_fault(message, UFORM_FORMAT, "%s: the towers' hidden sizes differ", file);
    if (info->text.pad_id >= info->text.vocab)
        return pretrained_fault(message, UFORM_FORMAT, "%s: pad_token_id past the vocabulary", file);
    tt->causal = false;
    tt->input_norm = false;
    tt->pooling = UFORM_POOLING_LAST;
    tt->projection = true;
    tt->projection_bias = true;
    vt->causal = false;
    vt->input_norm = false;
    vt->pooling = UFORM_POOLING_HEAD;
    vt->projection = false;
    vt->class_token = false;
    info->dims = tt->hidden;
    info->text.context = info->text.positions;
    info->text.padded = true;
    snprintf(info->family, sizeof info->family, "siglip");
    folder->text.names = &siglip_text_names;
    folder->image.names = &siglip_image_names;
    static float const half[3] = {0.5f, 0.5f, 0.5f};
    return clip_preprocessor(folder, image_size, half, half, UFORM_RESIZE_SQUARE, message);
}

/* ---- Dispatch ------------------------------------------------------------------------------------ */

uform_status_t pretrained_family(pretrained_t *folder, json_t const *config, char const **message) {
    char const *model_type = pretrained_string(config, "model_type");
    if (json_object_get(config, "text_encoder") && json_object_get(config, "image_encoder"))
        return uform3_family(folder, config, message);
    if (!model_type) return pretrained_fault(message, UFORM_FORMAT, "config.json: no model_type");
    if (strcmp(model_type, "bert") == 0 || strcmp(model_type, "roberta") == 0 ||
        strcmp(model_type, "xlm-roberta") == 0)
        return bert_family(folder, config, model_type, message);
    if (strcmp(model_type, "distilbert") == 0) return distilbert_family(folder, config, message);
    if (strcmp(model_type, "mpnet") == 0) return mpnet_family(folder, config, message);
    if (strcmp(model_type, "clip") == 0) return clip_family(folder, config, message);
    if (strcmp(model_type, "siglip") == 0) return siglip_family(folder, config, message);
    return pretrained_fault(message, UFORM_UNSUPPORTED, "config.json: model_type \"%.40s\"", model_type);
}
