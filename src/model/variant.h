/* The block's settings as data (uform_transformer_info_t): their defaults, which are the engine's own
 * towers', and their optional keys in a tower's format-4 metadata, read and written here so that a
 * checkpoint of a pretrained family (written by `uform convert`) and the engine's own checkpoints share
 * one format. Keys absent from a tower's object take the defaults; the writer writes only the keys whose
 * values differ from them, so that the engine's own checkpoints keep their metadata as it was. */
#pragma once

#include <jansson.h>

#include "uform.h"

/* The widest head a tower may have (kernels.h's KERNEL_HEAD_MAX). */
#define VARIANT_HEAD_MAX 256
#define VARIANT_REGISTERS_MAX 1024 /* register tokens of a patch tower */
/* The buckets of the bias by relative position the engine computes (MPNet's relative_position_bucket: 16
 * each way, exact to a distance of 8, logarithmic to 128, the last bucket beyond). */
#define VARIANT_RELATIVE_BUCKETS  32
#define VARIANT_RELATIVE_DISTANCE 128

/* The bucket of a query's distance from a key, query row minus key row (MPNet's relative_position_bucket,
 * computed in F32 as PyTorch computes it). */
size_t variant_relative_bucket(long distance);

/* The engine's own settings for a text tower (causal, rotary, pooled at the last position) or a patch
 * tower (bidirectional, learned positions, pooled at the class token). Leaves depth, hidden, heads and
 * mlp alone; sets head to hidden / heads. */
void variant_defaults(uform_transformer_info_t *transformer, bool text);

/* Reads the optional keys of a tower's object over the defaults (variant_defaults first) and checks
 * them against each other: UFORM_OK, or UFORM_FORMAT with a static message naming the fault. */
uform_status_t variant_parse(json_t const *tower, uform_transformer_info_t *transformer, bool text,
                             char const **message);

/* Sets the keys of `transformer` that differ from the defaults on `tower`: false when out of memory. */
bool variant_write(json_t *tower, uform_transformer_info_t const *transformer, bool text);

/* The optional keys of a text tower that reads tokens: vocab, positions, position_offset, token_type;
 * and of the model: family, normalized. Same rules. */
uform_status_t variant_parse_text(json_t const *tower, uform_model_info_t *info, char const **message);
bool variant_write_text(json_t *tower, uform_model_info_t const *info);
uform_status_t variant_parse_model(json_t const *model, uform_model_info_t *info, char const **message);
/* An image tower's `resize` and `resample` (defaults: the engine's short side and float bilinear). */
uform_status_t variant_parse_image(json_t const *tower, uform_model_info_t *info, char const **message);
bool variant_write_image(json_t *tower, uform_model_info_t const *info);
char const *variant_resize_name(uform_image_resize_t resize);
char const *variant_resample_name(uform_image_resample_t resample);
bool variant_write_model(json_t *model, uform_model_info_t const *info);

/* The names the metadata and `uform info` use: "rms", "layer"; "gelu_tanh", "gelu_erf", "gelu_quick";
 * "last", "first", "mean", "end". */
char const *variant_norm_name(uform_norm_t norm);
char const *variant_activation_name(uform_activation_t activation);
char const *variant_pooling_name(uform_pooling_t pooling);

/* Every tower of `info` (present or not) with the engine's own settings, the family "uform", normalized:
 * what a model built from sizes (the tiny checkpoint, a trainer from scratch) is. */
void variant_engine_model(uform_model_info_t *info);

/* Whether `info` is the engine's own architecture in every tower it has: what the trainer and the VRAM
 * executors run. */
bool variant_is_engine(uform_model_info_t const *info);
