/* Pillow's resampling of RGB8 images, bit for bit: the part of Image.resize((out_width, out_height),
 * BICUBIC or BILINEAR) that a crop keeps, as Pillow 9.4 computes it (libImaging/Resample.c, 8 bits per
 * channel; its later releases compute the same numbers).
 *
 * The convention, along each axis from `in` samples to `out` (the whole image as the box):
 *   - scale = (double)(float)in / out (Pillow holds the box in floats), filterscale = max(scale, 1),
 *     support = radius * filterscale, with radius 2 for bicubic and 1 for bilinear;
 *   - output o is centred at c = (o + 0.5) * scale and reads input samples j in
 *     [max((int)(c - support + 0.5), 0), min((int)(c + support + 0.5), in)) with weights
 *     filter(((j - c) + 0.5) * (1 / filterscale)) in double; bicubic is Keys' cubic with a = -0.5,
 *     ((a + 2)|x| - (a + 3))x^2 + 1 below 1, (((|x| - 5)|x| + 8)|x| - 4)a below 2; bilinear the triangle
 *     1 - |x| below 1;
 *   - the weights are divided by their sum (left as they are if it is 0), then made fixed point with 22
 *     fraction bits, (int)(w * 2^22 + 0.5) or (int)(w * 2^22 - 0.5) for a negative w;
 *   - the horizontal pass runs first, over the input rows the vertical pass reads, then the vertical
 *     pass; each output sums pixel * weight in integers from 2^21, shifts right by 22 and clamps to
 *     [0, 255]: every pass rounds to 8 bits. An axis whose size does not change passes its samples
 *     unchanged, as Pillow's skipped pass does.
 * This file is compiled without floating-point contraction (-ffp-contract=off): the doubles are those of a
 * machine without fused multiply-add, as Debian's x86-64 Pillow computes them. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "image_preprocess.h"

/* Writes the `size` x `size` crop at (layout->top, layout->left) of `rgb` (`height` rows of `width`
 * pixels, 3 bytes each, `stride` bytes apart) resized to layout->out_height x layout->out_width with
 * `filter` (IMAGE_RESAMPLE_PILLOW_BICUBIC or IMAGE_RESAMPLE_PILLOW_BILINEAR) to `crop`, rows packed.
 * The layout is image_layout's. Allocates its temporaries (coefficients, and the horizontally resampled
 * rows the crop reads: about min(height, width) * size * 3 bytes) and frees them. Answers UFORM_OK,
 * UFORM_INVALID_ARGUMENT (another filter, sizes whose product overflows), UFORM_OUT_OF_MEMORY.
 * Thread-safe. */
uform_status_t image_resample_pillow(uint8_t const *rgb, size_t height, size_t width, size_t stride,
                                     image_resample_t filter, image_layout_t const *layout, size_t size,
                                     uint8_t *crop);
