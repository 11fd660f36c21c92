/* Which towers of a model the VRAM path runs, as data: the settings each tower was read with
 * (uform_transformer_info_t, src/model/variant.h), checked against what src/vram/vram.c and kernels/cuda
 * compute. Host code only, built with or without CUDA, so that its answers are tested on any machine.
 *
 * The block's settings every tower may have on the device: RMSNorm or LayerNorm with biases, pre- or
 * post-norm, input and final norms, the three GELUs, heads of 1 to 256 columns, a projection with or
 * without bias, or none. Besides, it runs:
 * - text towers that read tokens (BERT family, XLM-RoBERTa, MPNet, CLIP's, SigLIP's and UForm 3's text
 *   towers): learned positions with their offset or rotary ones (heads of 64), the token type's row, a
 *   bias by relative position (MPNet's), causal or bidirectional attention, first, last, mean and
 *   end-of-text pooling, tanh after the projection (a Dense module's); text read as bytes with the
 *   engine's own settings only;
 * - image towers with a class token, register tokens or not, pooled at the class token (the engine's,
 *   CLIP's, UForm 3's), and image towers of patches alone pooled by the attention-pooling head (SigLIP's),
 *   their items prepared on the host as host executors prepare them (Pillow's resampling included);
 *   pixels resized on the device with the engine's float bilinear filter, into a class token and
 *   patches pooled at the class token; other towers' pixels prepared on the host as image files are,
 *   where the host can read them (vram_pixels_refusal);
 * - audio towers with the engine's own settings.
 * It does not run image towers pooled by the mean, or the attention-pooling head over a class token or
 * registers. */
#pragma once

#include "uform.h"

/* NULL when the VRAM path runs tower `name` ("text", "image", "audio") of `info` (present or not),
 * else a static message naming the first setting it lacks, for a UFORM_UNSUPPORTED answer. */
char const *vram_tower_refusal(uform_model_info_t const *info, char const *name);

/* NULL when the device front end of image_encode_pixels on a VRAM executor prepares the model's images
 * as host executors do (the engine's short-side float bilinear filter, a class token, pooled there); else
 * why not, a static message: such pixels are prepared on the host, and refused with it (UFORM_UNSUPPORTED)
 * only where they are in device memory, which the host does not read. */
char const *vram_pixels_refusal(uform_model_info_t const *info);

/* NULL when the VRAM path runs some tower `info` has (a load then places those it runs, and the verbs of
 * the others answer their refusal); else the refusal of its first tower. */
char const *vram_model_refusal(uform_model_info_t const *info);
