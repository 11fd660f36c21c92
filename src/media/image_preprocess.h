/* RGB8 pixels to the image tower's patch rows: resize, centre crop, scale, normalize, patchify.
 *
 * The convention, pinned so that an independent implementation agrees to float rounding (it is
 * PyTorch's F.interpolate(mode="bilinear", align_corners=False, antialias=True), and Pillow's
 * Image.resize(..., BILINEAR) without its 8-bit rounding):
 *   - the short side becomes `size`, the long one floor(long * size / short) (integer arithmetic);
 *   - each axis separately, from `in` to `out` samples: scale = in / out, support = max(scale, 1);
 *     output sample o is centred at c = (o + 0.5) * scale and takes input samples j in
 *     [max(trunc(c - support + 0.5), 0), min(trunc(c + support + 0.5), in)) with weights
 *     max(0, 1 - |j + 0.5 - c| / max(scale, 1)), normalized to sum to 1 (a triangle filter widened
 *     by the scale when shrinking: antialiased; plain bilinear with half-pixel centres when growing,
 *     renormalized at the borders);
 *   - the centre crop starts at floor((out - size) / 2) on each axis; only the cropped samples are
 *     computed, rows first, then columns, in float, without rounding between the passes;
 *   - value = (sample / 255 - mean[c]) / std[c];
 *   - patch (py, px) is row py * (size / patch) + px; within it, channel, then row, then column:
 *     index c * patch^2 + dy * patch + dx. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "uform.h"

typedef struct image_geometry {
    size_t size, patch;
    float mean[3], std[3];
} image_geometry_t;

/* Writes the (size / patch)^2 rows of 3 * patch^2 floats of one image to `patches`. `rgb` holds
 * `height` rows of `width` pixels (3 bytes each), `stride` bytes apart. Allocates its own temporary
 * (about min(height, width) * size * 12 bytes) and frees it. Answers UFORM_OK, UFORM_INVALID_ARGUMENT
 * (an empty image, or sizes whose product overflows), UFORM_OUT_OF_MEMORY. Thread-safe. */
uform_status_t image_preprocess(uint8_t const *rgb, size_t height, size_t width, size_t stride,
                                image_geometry_t const *geometry, float *patches);
