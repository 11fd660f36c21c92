/* RGB8 pixels to the image tower's patch rows: resize, centre crop, scale, normalize, patchify.
 *
 * Two choices of a geometry (image_geometry_t) say how, each with the engine's own convention as its zero
 * value; the others are those of the pretrained towers' reference preprocessors.
 *
 * `resize`, which sizes and which crop:
 *   - IMAGE_RESIZE_SHORT_SIDE (0): the short side becomes `size`, the long one floor(long * size / short)
 *     (integer arithmetic; Hugging Face's and torchvision's int(size * long / short) in Python floats give
 *     the same for every product below 2^53); the crop starts at floor((out - size) / 2) on each axis.
 *     Hugging Face's CLIPImageProcessor (size {"shortest_edge"}, then center_crop) does this.
 *   - IMAGE_RESIZE_SHORT_SIDE_ROUND_CROP: the same sizes; the crop starts at Python's round((out - size)
 *     / 2.0), half to even: an odd difference 2k + 1 starts at k for an even k, at k + 1 for an odd one.
 *     torchvision's Resize(size) then CenterCrop(size) (UForm 3's preprocessing) does this.
 *   - IMAGE_RESIZE_SQUARE: both sides become `size`, the aspect ratio lost, no crop (SiglipImageProcessor).
 *
 * `resample`, how the samples are computed:
 *   - IMAGE_RESAMPLE_FLOAT_BILINEAR (0), pinned so that an independent implementation agrees to float
 *     rounding (it is PyTorch's F.interpolate(mode="bilinear", align_corners=False, antialias=True), and
 *     Pillow's Image.resize(..., BILINEAR) without its 8-bit rounding): each axis separately, from `in` to
 *     `out` samples: scale = in / out, support = max(scale, 1); output sample o is centred at
 *     c = (o + 0.5) * scale and takes input samples j in [max(trunc(c - support + 0.5), 0),
 *     min(trunc(c + support + 0.5), in)) with weights max(0, 1 - |j + 0.5 - c| / max(scale, 1)), normalized
 *     to sum to 1 (a triangle filter widened by the scale when shrinking: antialiased; plain bilinear with
 *     half-pixel centres when growing, renormalized at the borders); only the cropped samples are
 *     computed, rows first, then columns, in float, without rounding between the passes; then
 *     value = (sample / 255 - mean[c]) / std[c].
 *   - IMAGE_RESAMPLE_PILLOW_BICUBIC, IMAGE_RESAMPLE_PILLOW_BILINEAR: Pillow's Image.resize(size, BICUBIC
 *     or BILINEAR) of an RGB image, bit for bit (Pillow 9.4, Debian 12's; image_resample.h spells out its
 *     fixed-point arithmetic), cropped in 8 bits; then value = ((float)pixel / 255 - mean[c]) / std[c] in
 *     float, which is torchvision's ToTensor and Normalize, and equals Hugging Face's rescale (the pixel
 *     times 1/255 in double, rounded to float) then normalize in float32, for every pixel value.
 *     Image.resize leaves reducing_gap at None (no reduce() step first) and takes the whole image as its
 *     box, as the references call it; neither is modelled.
 *
 * Patch (py, px) is row py * (size / patch) + px; within it, channel, then row, then column:
 * index c * patch^2 + dy * patch + dx. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "uform.h"

typedef enum image_resize {
    IMAGE_RESIZE_SHORT_SIDE = 0,
    IMAGE_RESIZE_SHORT_SIDE_ROUND_CROP,
    IMAGE_RESIZE_SQUARE,
} image_resize_t;

typedef enum image_resample {
    IMAGE_RESAMPLE_FLOAT_BILINEAR = 0,
    IMAGE_RESAMPLE_PILLOW_BICUBIC,
    IMAGE_RESAMPLE_PILLOW_BILINEAR,
} image_resample_t;

typedef struct image_geometry {
    size_t size, patch; /* size a multiple of patch */
    float mean[3], std[3];
    image_resize_t resize;
    image_resample_t resample;
} image_geometry_t;

/* Where the crop lies: the resized image is out_height x out_width, the crop its `size` x `size` samples
 * from row `top` and column `left`. */
typedef struct image_layout {
    size_t out_height, out_width;
    size_t top, left;
} image_layout_t;

/* The layout of an image of `height` x `width` under the geometry's `resize`. Answers UFORM_OK, or
 * UFORM_INVALID_ARGUMENT (an empty image, a size of 0, sizes whose product overflows, a resize or resample
 * out of its enumeration). Pure. */
uform_status_t image_layout(size_t height, size_t width, image_geometry_t const *geometry,
                            image_layout_t *layout);

/* Writes the (size / patch)^2 rows of 3 * patch^2 floats of one image to `patches`. `rgb` holds
 * `height` rows of `width` pixels (3 bytes each), `stride` bytes apart. Allocates its own temporaries
 * (about min(height, width) * size * 12 bytes for the float path, a quarter of that and the 8-bit crop
 * for Pillow's) and frees them. Answers UFORM_OK, UFORM_INVALID_ARGUMENT (as image_layout, or a patch of
 * 0), UFORM_OUT_OF_MEMORY. Thread-safe. */
uform_status_t image_preprocess(uint8_t const *rgb, size_t height, size_t width, size_t stride,
                                image_geometry_t const *geometry, float *patches);

/* The 8-bit stage of a Pillow resample: writes the `size` x `size` crop of the resized image to `crop`
 * (rows packed, 3 bytes a pixel), the pixels image_preprocess then normalizes. Answers UFORM_OK,
 * UFORM_INVALID_ARGUMENT (as image_layout), UFORM_UNSUPPORTED for IMAGE_RESAMPLE_FLOAT_BILINEAR, which
 * has no 8-bit stage, UFORM_OUT_OF_MEMORY. Allocates its temporaries and frees them. Thread-safe. */
uform_status_t image_crop_rgb8(uint8_t const *rgb, size_t height, size_t width, size_t stride,
                               image_geometry_t const *geometry, uint8_t *crop);
