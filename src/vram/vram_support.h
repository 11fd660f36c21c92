/* Which towers of a model the VRAM path runs, as data: the settings each tower was read with
 * (uform_transformer_info_t, src/model/variant.h), checked against what src/vram/vram.c and kernels/cuda
 * compute. Host code only, built with or without CUDA, so that its answers are tested on any machine.
 *
 * The VRAM path runs:
 * - text towers that read tokens (BERT family, XLM-RoBERTa, CLIP's and SigLIP's text towers, UForm 3's):
 *   RMSNorm or LayerNorm with biases, pre- or post-norm, input and final norms, the three GELUs, heads of
 *   1 to 256 columns, learned positions with their offset or rotary ones (heads of 64), the token type's
 *   row, causal or bidirectional attention, first, last, mean and end-of-text pooling, a projection with
 *   or without bias, or none;
 * - every tower with the engine's own settings (text read as bytes, image and audio patch towers).
 * It does not run patch towers with other settings: LayerNorm, an input norm, other GELUs, register
 * tokens, no class token, mean or attention-head pooling, Pillow's resampling (CLIP's, SigLIP's and
 * UForm 3's image towers); nor text towers that read bytes with other settings. */
#pragma once

#include "uform.h"

/* NULL when the VRAM path runs tower `name` ("text", "image", "audio") of `info` (present or not),
 * else a static message naming the first setting it lacks, for a UFORM_UNSUPPORTED answer. */
char const *vram_tower_refusal(uform_model_info_t const *info, char const *name);

/* NULL when the VRAM path runs some tower `info` has (a load then places those it runs, and the verbs of
 * the others answer their refusal); else the refusal of its first tower. */
char const *vram_model_refusal(uform_model_info_t const *info);
