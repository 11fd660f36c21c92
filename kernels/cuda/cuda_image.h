/* The image tower's front end on the device: RGB8 pixels to BF16 patch rows, with the convention of
 * src/media/image_preprocess.h (antialiased bilinear resize of the short side to `size`, centre crop, scale
 * to [0, 1], normalize by mean and std, patchify channel, row, column). The axis weights are computed
 * in double exactly as the host computes them, and each output sums the horizontally filtered input
 * rows in the host's order, so the two agree to float rounding (FMA contraction aside); the result is
 * then rounded to BF16, the GEMM's input. Pointers are device memory; enqueued on `stream`. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cuda_image_geometry {
    int32_t size, patch;
    float mean[3], std[3];
} cuda_image_geometry_t;

/* The most input samples one output reads along an axis of `in` samples resized to `out`: the same
 * bound as the host's, for sizing `axes`. */
size_t cuda_image_taps(size_t in, size_t out);

/* Bytes of the axis tables for `items` images with at most `taps` taps per axis. */
size_t cuda_image_axes_bytes(size_t items, size_t size, size_t taps);

/* Item i: `heights[i]` rows of `widths[i]` RGB8 pixels at rgb + pixel_offsets[i] (rows packed, 3 bytes a
 * pixel); its (size / patch)^2 rows of 3 * patch^2 BF16 go to patches + i * (size / patch)^2 * 3 * patch^2.
 * `axes` is scratch of cuda_image_axes_bytes(items, size, taps) with `taps` at least cuda_image_taps of
 * every item's axes. */
cudaError_t cuda_image_patches(uint16_t *patches, uint8_t const *rgb, int64_t const *pixel_offsets,
                               int32_t const *heights, int32_t const *widths, size_t items,
                               cuda_image_geometry_t geometry, void *axes, size_t taps, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
