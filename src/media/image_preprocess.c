/* Resize, centre crop, normalize and patchify: the conventions are spelled out in image_preprocess.h.
 * image_layout sizes the resized image and places the crop; then either the float path here (antialiased
 * bilinear) or Pillow's 8-bit resampling (image_resample.c) into a crop that is normalized from a table.
 * Only the cropped output samples are computed, and only the input rows they reach are filtered
 * horizontally. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "image_preprocess.h"
#include "image_resample.h"

/* One axis of the resampling, for the `size` output samples of the crop: output o reads `count[o]`
 * input samples from `first[o]` with the weights at `weights + o * taps`. */
typedef struct axis {
    size_t *first, *count;
    float *weights; /* [size, taps] */
    size_t taps;
} axis_t;

static double axis_scale(size_t in, size_t out) {
    return (double)in / (double)out;
}

/* An upper bound on the input samples one output reads: the window is 2 * support wide. */
static size_t axis_taps(size_t in, size_t out) {
    double scale = axis_scale(in, out);
    return (size_t)ceil(2.0 * (scale >= 1.0 ? scale : 1.0)) + 2;
}

static double triangle(double x) {
    x = fabs(x);
    return x < 1.0 ? 1.0 - x : 0.0;
}

/* Fills the axis for outputs [offset, offset + size) of a resampling from `in` to `out` samples. */
static void axis_fill(axis_t *axis, size_t in, size_t out, size_t offset, size_t size) {
    double scale = axis_scale(in, out);
    double support = scale >= 1.0 ? scale : 1.0, inverse = scale >= 1.0 ? 1.0 / scale : 1.0;
    for (size_t o = 0; o < size; ++o) {
        double center = scale * ((double)(offset + o) + 0.5);
        double low = center - support + 0.5, high = center + support + 0.5;
        size_t first = low > 0.0 ? (size_t)low : 0;
        size_t last = high < (double)in ? (size_t)high : in;
        float *weights = axis->weights + o * axis->taps;
        double total = 0.0;
        for (size_t j = first; j < last; ++j)
            total += triangle(((double)j - center + 0.5) * inverse);
        for (size_t j = first; j < last; ++j)
            weights[j - first] = (float)(triangle(((double)j - center + 0.5) * inverse) / total);
        axis->first[o] = first;
        axis->count[o] = last - first;
    }
}

/* The bytes of an axis of `size` outputs and `taps` taps, a multiple of 16 (0 on overflow): the
 * indices [2, size], then the weights. */
static size_t axis_bytes(size_t size, size_t taps) {
    size_t weights = 0;
    if (__builtin_mul_overflow(size * sizeof(float), taps, &weights) || weights > SIZE_MAX / 2) return 0;
    return (2 * size * sizeof(size_t) + weights + 15) & ~(size_t)15;
}

/* Carves an axis out of `memory` (16-byte aligned); answers the bytes it took. */
static size_t axis_carve(axis_t *axis, char *memory, size_t size, size_t taps) {
    axis->taps = taps;
    axis->first = (size_t *)(void *)memory;
    axis->count = axis->first + size;
    axis->weights = (float *)(void *)(axis->count + size);
    return axis_bytes(size, taps);
}

/* Where an odd excess places the crop: floor((out - size) / 2), or Python's round of it (half to even). */
static size_t crop_start(size_t excess, image_resize_t resize) {
    size_t half = excess / 2;
    return resize == IMAGE_RESIZE_SHORT_SIDE_ROUND_CROP && (excess & 1) && (half & 1) ? half + 1 : half;
}

uform_status_t image_layout(size_t height, size_t width, image_geometry_t const *geometry,
                            image_layout_t *layout) {
    size_t const size = geometry->size;
    if (height == 0 || width == 0 || size == 0 || (unsigned)geometry->resize > IMAGE_RESIZE_SQUARE ||
        (unsigned)geometry->resample > IMAGE_RESAMPLE_PILLOW_BILINEAR)
        return UFORM_INVALID_ARGUMENT;
    /* Short side `size`, long side floor(long * size / short); or both `size`. */
    size_t out_height = size, out_width = size, scaled = 0;
    if (geometry->resize != IMAGE_RESIZE_SQUARE && height < width) {
        if (__builtin_mul_overflow(width, size, &scaled)) return UFORM_INVALID_ARGUMENT;
        out_width = scaled / height;
    } else if (geometry->resize != IMAGE_RESIZE_SQUARE && width < height) {
        if (__builtin_mul_overflow(height, size, &scaled)) return UFORM_INVALID_ARGUMENT;
        out_height = scaled / width;
    }
    *layout = (image_layout_t){out_height, out_width, crop_start(out_height - size, geometry->resize),
                               crop_start(out_width - size, geometry->resize)};
    return UFORM_OK;
}

/* The float path: antialiased bilinear, no rounding between the passes. */
static uform_status_t preprocess_float(uint8_t const *rgb, size_t height, size_t width, size_t stride,
                                       image_geometry_t const *geometry, image_layout_t const *layout,
                                       float *patches) {
    size_t const size = geometry->size, patch = geometry->patch, side = size / patch;
    size_t const row_floats = patch * patch * 3;
    size_t const out_height = layout->out_height, out_width = layout->out_width;
    size_t const rows_taps = axis_taps(height, out_height), columns_taps = axis_taps(width, out_width);
    size_t const rows_bytes = axis_bytes(size, rows_taps), columns_bytes = axis_bytes(size, columns_taps);
    if (rows_bytes == 0 || columns_bytes == 0) return UFORM_INVALID_ARGUMENT;

    /* Everything in one block: both axes, the accumulator row [size, 3], and the horizontally
     * filtered input rows the crop reaches [needed, size, 3], whose count the rows axis tells. */
    size_t const line = size * 3, head = rows_bytes + columns_bytes + line * sizeof(float);
    char *header = malloc(head);
    if (!header) return UFORM_OUT_OF_MEMORY;
    axis_t rows, columns;
    size_t used = axis_carve(&rows, header, size, rows_taps);
    used += axis_carve(&columns, header + used, size, columns_taps);
    float *sums = (float *)(void *)(header + used);
    axis_fill(&rows, height, out_height, layout->top, size);
    axis_fill(&columns, width, out_width, layout->left, size);
    size_t const row_first = rows.first[0], needed = rows.first[size - 1] + rows.count[size - 1] - row_first;
    size_t filtered_bytes = 0;
    float *filtered = NULL;
    if (!__builtin_mul_overflow(needed, line * sizeof(float), &filtered_bytes))
        filtered = malloc(filtered_bytes);
    if (!filtered) {
        free(header);
        return UFORM_OUT_OF_MEMORY;
    }

    /* Horizontally: every input row the crop reaches, to `size` columns.         [needed, size, 3] */
    for (size_t r = 0; r < needed; ++r) {
        uint8_t const *source = rgb + (row_first + r) * stride;
        float *target = filtered + r * line;
        for (size_t o = 0; o < size; ++o) {
            float const *weights = columns.weights + o * columns.taps;
            uint8_t const *pixel = source + columns.first[o] * 3;
            float red = 0.0f, green = 0.0f, blue = 0.0f;
            for (size_t t = 0; t < columns.count[o]; ++t, pixel += 3) {
                red += weights[t] * (float)pixel[0];
                green += weights[t] * (float)pixel[1];
                blue += weights[t] * (float)pixel[2];
            }
            target[3 * o] = red, target[3 * o + 1] = green, target[3 * o + 2] = blue;
        }
    }

    /* Vertically, one output row at a time, then normalized into its patches.   [side^2, 3 patch^2] */
    for (size_t o = 0; o < size; ++o) {
        memset(sums, 0, line * sizeof(float));
        float const *weights = rows.weights + o * rows.taps;
        for (size_t t = 0; t < rows.count[o]; ++t) {
            float const *input = filtered + (rows.first[o] + t - row_first) * line;
            for (size_t k = 0; k < line; ++k)
                sums[k] += weights[t] * input[k];
        }
        size_t const dy = o % patch;
        float *row_patches = patches + (o / patch) * side * row_floats + dy * patch;
        for (size_t x = 0; x < size; ++x)
            for (size_t c = 0; c < 3; ++c)
                row_patches[(x / patch) * row_floats + c * patch * patch + x % patch] =
                    (sums[3 * x + c] / 255.0f - geometry->mean[c]) / geometry->std[c];
    }
    free(filtered);
    free(header);
    return UFORM_OK;
}

/* Scales and normalizes the 8-bit crop [size, size, 3] into its patches, through a table of the 256 values
 * of each channel.                                                                  [side^2, 3 patch^2] */
static void patches_from_rgb8(uint8_t const *crop, image_geometry_t const *geometry, float *patches) {
    size_t const size = geometry->size, patch = geometry->patch, side = size / patch;
    size_t const row_floats = patch * patch * 3;
    float values[3][256];
    for (size_t c = 0; c < 3; ++c)
        for (size_t v = 0; v < 256; ++v)
            values[c][v] = ((float)v / 255.0f - geometry->mean[c]) / geometry->std[c];
    for (size_t y = 0; y < size; ++y) {
        uint8_t const *pixel = crop + y * size * 3;
        float *row_patches = patches + (y / patch) * side * row_floats + (y % patch) * patch;
        for (size_t x = 0; x < size; ++x, pixel += 3)
            for (size_t c = 0; c < 3; ++c)
                row_patches[(x / patch) * row_floats + c * patch * patch + x % patch] = values[c][pixel[c]];
    }
}

uform_status_t image_crop_rgb8(uint8_t const *rgb, size_t height, size_t width, size_t stride,
                               image_geometry_t const *geometry, uint8_t *crop) {
    image_layout_t layout;
    uform_status_t status = image_layout(height, width, geometry, &layout);
    if (status != UFORM_OK) return status;
    if (geometry->resample == IMAGE_RESAMPLE_FLOAT_BILINEAR) return UFORM_UNSUPPORTED;
    return image_resample_pillow(rgb, height, width, stride, geometry->resample, &layout, geometry->size,
                                 crop);
}

uform_status_t image_preprocess(uint8_t const *rgb, size_t height, size_t width, size_t stride,
                                image_geometry_t const *geometry, float *patches) {
    size_t const size = geometry->size, patch = geometry->patch;
    if (patch == 0 || size % patch != 0) return UFORM_INVALID_ARGUMENT;
    image_layout_t layout;
    uform_status_t status = image_layout(height, width, geometry, &layout);
    if (status != UFORM_OK) return status;
    if (geometry->resample == IMAGE_RESAMPLE_FLOAT_BILINEAR)
        return preprocess_float(rgb, height, width, stride, geometry, &layout, patches);
    size_t crop_bytes = 0;
    if (__builtin_mul_overflow(size, size, &crop_bytes) || crop_bytes > SIZE_MAX / 3)
        return UFORM_INVALID_ARGUMENT;
    crop_bytes *= 3;
    uint8_t *crop = malloc(crop_bytes);
    if (!crop) return UFORM_OUT_OF_MEMORY;
    status = image_resample_pillow(rgb, height, width, stride, geometry->resample, &layout, size, crop);
    if (status == UFORM_OK) patches_from_rgb8(crop, geometry, patches);
    free(crop);
    return status;
}
