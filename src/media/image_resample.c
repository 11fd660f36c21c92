/* Pillow's fixed-point resampling of RGB8 images, for the samples a crop keeps: the convention is spelled
 * out in image_resample.h. The coefficients of each axis first (double, then fixed point), then the
 * horizontal pass over the input rows the crop reaches, rounded to 8 bits, then the vertical pass into the
 * crop, rounded to 8 bits. Compiled with -ffp-contract=off (src/meson.build). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "image_resample.h"

/* Fraction bits of the fixed-point weights: 32 bits less 8 for the pixel and 2 for the sum's overshoot. */
#define RESAMPLE_BITS 22

typedef struct resample_filter {
    double (*at)(double x);
    double radius;
} resample_filter_t;

/* One axis, for the `size` outputs of the crop: output o reads count[o] input samples from first[o] with
 * the fixed-point weights at weights + o * taps. */
typedef struct resample_axis {
    size_t *first, *count;
    int32_t *weights; /* [size, taps] */
    size_t taps;
} resample_axis_t;

/* Keys' cubic convolution with a = -0.5, in the order Pillow evaluates it. */
static double bicubic(double x) {
    double const a = -0.5;
    if (x < 0.0) x = -x;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
    return 0.0;
}

static double triangle(double x) {
    if (x < 0.0) x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

static resample_filter_t const bicubic_filter = {bicubic, 2.0}, triangle_filter = {triangle, 1.0};

/* in / out as Pillow computes it: the input size passes through the float of its box. */
static double axis_scale(size_t in, size_t out) {
    return (double)(float)in / (double)out;
}

static double axis_filterscale(size_t in, size_t out) {
    double scale = axis_scale(in, out);
    return scale < 1.0 ? 1.0 : scale;
}

/* The most input samples one output reads (Pillow's kernel size), or 0 past what memory could hold. */
static size_t axis_taps(resample_filter_t const *filter, size_t in, size_t out) {
    double support = ceil(filter->radius * axis_filterscale(in, out));
    if (support > (double)(SIZE_MAX / 8)) return 0;
    return (size_t)support * 2 + 1;
}

static int32_t fixed_point(double weight) {
    double const one = (double)(1 << RESAMPLE_BITS);
    return (int32_t)(weight < 0.0 ? -0.5 + weight * one : 0.5 + weight * one);
}

/* Fills the axis for outputs [offset, offset + size) of a resampling from `in` to `out` samples. The
 * filter is evaluated twice per tap, for the sum and for the weight: the same double both times. */
static void axis_fill(resample_axis_t *axis, resample_filter_t const *filter, size_t in, size_t out,
                      size_t offset, size_t size) {
    double const scale = axis_scale(in, out), filterscale = axis_filterscale(in, out);
    double const support = filter->radius * filterscale, inverse = 1.0 / filterscale;
    for (size_t o = 0; o < size; ++o) {
        double const center = ((double)(offset + o) + 0.5) * scale;
        double const low = center - support + 0.5, high = center + support + 0.5;
        size_t const first = low > 0.0 ? (size_t)low : 0;
        size_t const last = high < (double)in ? (size_t)high : in;
        double total = 0.0;
        for (size_t j = first; j < last; ++j)
            total += filter->at(((double)j - center + 0.5) * inverse);
        int32_t *weights = axis->weights + o * axis->taps;
        for (size_t j = first; j < last; ++j) {
            double weight = filter->at(((double)j - center + 0.5) * inverse);
            weights[j - first] = fixed_point(total != 0.0 ? weight / total : weight);
        }
        axis->first[o] = first;
        axis->count[o] = last - first;
    }
}

/* The bytes of an axis of `size` outputs and `taps` taps, a multiple of 16 (0 on overflow): the indices
 * [2, size], then the weights. */
static size_t axis_bytes(size_t size, size_t taps) {
    size_t weights = 0;
    if (taps == 0 || __builtin_mul_overflow(size * sizeof(int32_t), taps, &weights) || weights > SIZE_MAX / 4)
        return 0;
    return (2 * size * sizeof(size_t) + weights + 15) & ~(size_t)15;
}

/* Carves an axis out of `memory` (16-byte aligned); answers the bytes it took. */
static size_t axis_carve(resample_axis_t *axis, char *memory, size_t size, size_t taps) {
    axis->taps = taps;
    axis->first = (size_t *)(void *)memory;
    axis->count = axis->first + size;
    axis->weights = (int32_t *)(void *)(axis->count + size);
    return axis_bytes(size, taps);
}

/* A fixed-point sum to 8 bits: the integer part, clamped (Pillow's clip8). */
static uint8_t clip8(int64_t sum) {
    if (sum < 0) return 0;
    sum >>= RESAMPLE_BITS;
    return sum > 255 ? 255 : (uint8_t)sum;
}

/* Horizontally: the `needed` input rows from `row_first`, each to the crop's `size` columns.
 *                                                                              [needed, size, 3] */
static void pass_horizontal(uint8_t const *rgb, size_t stride, size_t row_first, size_t needed,
                            resample_axis_t const *columns, size_t size, uint8_t *rows) {
    int64_t const half = (int64_t)1 << (RESAMPLE_BITS - 1);
    for (size_t r = 0; r < needed; ++r) {
        uint8_t const *source = rgb + (row_first + r) * stride;
        uint8_t *target = rows + r * size * 3;
        for (size_t o = 0; o < size; ++o) {
            int32_t const *weights = columns->weights + o * columns->taps;
            uint8_t const *pixel = source + columns->first[o] * 3;
            int64_t red = half, green = half, blue = half;
            for (size_t t = 0; t < columns->count[o]; ++t, pixel += 3) {
                red += (int64_t)pixel[0] * weights[t];
                green += (int64_t)pixel[1] * weights[t];
                blue += (int64_t)pixel[2] * weights[t];
            }
            target[3 * o] = clip8(red), target[3 * o + 1] = clip8(green), target[3 * o + 2] = clip8(blue);
        }
    }
}

/* Vertically: each crop row from the horizontally resampled rows, one sum per sample.     [size, size, 3] */
static void pass_vertical(uint8_t const *rows, size_t row_first, resample_axis_t const *axis, size_t size,
                          int64_t *sums, uint8_t *crop) {
    size_t const line = size * 3;
    for (size_t o = 0; o < size; ++o) {
        int32_t const *weights = axis->weights + o * axis->taps;
        for (size_t k = 0; k < line; ++k)
            sums[k] = (int64_t)1 << (RESAMPLE_BITS - 1);
        for (size_t t = 0; t < axis->count[o]; ++t) {
            uint8_t const *input = rows + (axis->first[o] + t - row_first) * line;
            for (size_t k = 0; k < line; ++k)
                sums[k] += (int64_t)input[k] * weights[t];
        }
        for (size_t k = 0; k < line; ++k)
            crop[o * line + k] = clip8(sums[k]);
    }
}

uform_status_t image_resample_pillow(uint8_t const *rgb, size_t height, size_t width, size_t stride,
                                     image_resample_t filter, image_layout_t const *layout, size_t size,
                                     uint8_t *crop) {
    resample_filter_t const *chosen = filter == IMAGE_RESAMPLE_PILLOW_BICUBIC    ? &bicubic_filter
                                      : filter == IMAGE_RESAMPLE_PILLOW_BILINEAR ? &triangle_filter
                                                                                 : NULL;
    if (!chosen || height == 0 || width == 0 || size == 0 || size > SIZE_MAX / 3 / sizeof(int64_t))
        return UFORM_INVALID_ARGUMENT;
    size_t const line = size * 3;
    size_t const rows_taps = axis_taps(chosen, height, layout->out_height);
    size_t const columns_taps = axis_taps(chosen, width, layout->out_width);
    size_t const rows_bytes = axis_bytes(size, rows_taps), columns_bytes = axis_bytes(size, columns_taps);
    size_t head = 0;
    if (rows_bytes == 0 || columns_bytes == 0 || __builtin_add_overflow(rows_bytes, columns_bytes, &head) ||
        __builtin_add_overflow(head, line * sizeof(int64_t), &head))
        return UFORM_INVALID_ARGUMENT;

    /* Both axes and the vertical pass's sums [size, 3] in one block; the horizontally resampled rows the
     * crop reaches [needed, size, 3], whose count the rows axis tells, in another. */
    char *header = malloc(head);
    if (!header) return UFORM_OUT_OF_MEMORY;
    resample_axis_t rows, columns;
    size_t used = axis_carve(&rows, header, size, rows_taps);
    used += axis_carve(&columns, header + used, size, columns_taps);
    int64_t *sums = (int64_t *)(void *)(header + used);
    axis_fill(&rows, chosen, height, layout->out_height, layout->top, size);
    axis_fill(&columns, chosen, width, layout->out_width, layout->left, size);
    size_t const row_first = rows.first[0], needed = rows.first[size - 1] + rows.count[size - 1] - row_first;
    size_t resampled_bytes = 0;
    uint8_t *resampled = NULL;
    if (!__builtin_mul_overflow(needed, line, &resampled_bytes)) resampled = malloc(resampled_bytes);
    if (!resampled) {
        free(header);
        return UFORM_OUT_OF_MEMORY;
    }
    pass_horizontal(rgb, stride, row_first, needed, &columns, size, resampled);
    pass_vertical(resampled, row_first, &rows, size, sums, crop);
    free(resampled);
    free(header);
    return UFORM_OK;
}
