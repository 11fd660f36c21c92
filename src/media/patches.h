/* The image tower's patch rows of one encoded item, an image or a clip: what the image and video verbs
 * (src/encode/image.c) and the trainer (src/train/train_step.c) both feed the tower. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "image_preprocess.h"
#include "uform.h"

/* The patch rows of `span` encoded bytes: an image (frames 0: decoded, resized, cropped, normalized,
 * patchified into `patches`, (size / patch)^2 rows of 3 patch^2 floats), or a clip whose `frames`
 * samples land one after another, each prepared once per decoded frame and copied to the samples that
 * repeat it. Answers what image_decode, image_preprocess or video_decode answer. */
uform_status_t media_patches(uint8_t const *bytes, size_t span, image_geometry_t const *geometry,
                             size_t frames, float *patches);
