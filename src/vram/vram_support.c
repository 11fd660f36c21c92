/* Which towers the VRAM path runs (vram_support.h): each tower's settings against what the device code
 * computes, the first missing piece named after the family that needs it. */
#include "vram_support.h"

#include <string.h>

#include "variant.h"

/* Whether a patch tower's settings are the engine's own (those the device's patch path computes). */
static bool patch_engine(uform_transformer_info_t const *transformer) {
    uform_transformer_info_t engine = *transformer;
    variant_defaults(&engine, false);
    return memcmp(&engine, transformer, sizeof engine) == 0;
}

static char const *image_refusal(uform_model_info_t const *info) {
    uform_transformer_info_t const *image = &info->image.transformer;
    if (image->pooling == UFORM_POOLING_HEAD) {
        if (image->class_token || image->registers)
            return "the VRAM path runs the attention-pooling head over towers without a class token or "
                   "registers only (SigLIP's): load it on a host executor";
    } else if (image->pooling != UFORM_POOLING_FIRST || !image->class_token) {
        return "the VRAM path pools image towers at their class token or through the attention-pooling "
               "head (SigLIP's), not by the mean: load it on a host executor";
    }
    if (image->head == 0 || image->head > VARIANT_HEAD_MAX || image->rotary)
        return "the VRAM path runs image heads of 1 to 256 columns without rotary positions: "
               "load it on a host executor";
    return NULL;
}

char const *vram_pixels_refusal(uform_model_info_t const *info) {
    uform_transformer_info_t const *image = &info->image.transformer;
    if (image->registers || !image->class_token || image->pooling != UFORM_POOLING_FIRST)
        return "image_encode_pixels in device memory: the device front end assembles a class token and "
               "patches, pooled at the class token, only; a tower with register tokens (UForm 3's large "
               "one) or the attention-pooling head (SigLIP's) takes pixels in host memory, which the host "
               "prepares";
    if (info->image.resize == UFORM_RESIZE_SHORT_SIDE &&
        info->image.resample == UFORM_RESAMPLE_FLOAT_BILINEAR)
        return NULL;
    return "image_encode_pixels in device memory: the device front end resizes with the engine's float "
           "bilinear filter only; this model's (Pillow's resampling and crop) takes pixels in host memory, "
           "which the host prepares";
}

static char const *text_refusal(uform_model_info_t const *info) {
    uform_transformer_info_t const *text = &info->text.transformer;
    if (info->text.vocab == 0) {
        uform_transformer_info_t engine = *text;
        variant_defaults(&engine, true);
        return memcmp(&engine, text, sizeof engine) == 0
                   ? NULL
                   : "the VRAM path runs text towers that read bytes with the engine's own settings only: "
                     "load it on a host executor";
    }
    if (text->pooling == UFORM_POOLING_HEAD)
        return "the VRAM path has no attention-pooling head on text towers: load it on a host executor";
    if (text->head == 0 || text->head > VARIANT_HEAD_MAX)
        return "the VRAM path runs heads of 1 to 256 columns: load it on a host executor";
    if (text->rotary && text->head != 64)
        return "the VRAM path rotates heads of 64 columns only: load it on a host executor";
    return NULL;
}

char const *vram_tower_refusal(uform_model_info_t const *info, char const *name) {
    if (strcmp(name, "text") == 0) return text_refusal(info);
    if (strcmp(name, "image") == 0) return image_refusal(info);
    return patch_engine(&info->audio.transformer)
               ? NULL
               : "the VRAM path runs audio towers with the engine's own settings only: load it on a host "
                 "executor";
}

char const *vram_model_refusal(uform_model_info_t const *info) {
    bool const present[] = {info->has_text, info->has_image, info->has_audio};
    char const *const names[] = {"text", "image", "audio"};
    char const *first = NULL;
    for (size_t i = 0; i < 3; ++i) {
        if (!present[i]) continue;
        char const *refusal = vram_tower_refusal(info, names[i]);
        if (!refusal) return NULL;
        if (!first) first = refusal;
    }
    return first ? first : "the model has no tower";
}
