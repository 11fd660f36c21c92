/* RGB8 pixels to BF16 patch rows on the device: see cuda_image.h. */
#include <cmath>

#include "cuda_common.cuh"
#include "cuda_image.h"

/* The resized shape: short side `size`, long side floor(long * size / short). */
static __device__ void resized(int64_t height, int64_t width, int64_t size, int64_t *out_height,
                                        int64_t *out_width) {
    *out_height = size, *out_width = size;
    if (height < width) *out_width = width * size / height;
    if (width < height) *out_height = height * size / width;
}

extern "C" size_t cuda_image_taps(size_t in, size_t out) {
    double scale = (double)in / (double)out;
    return (size_t)ceil(2.0 * (scale >= 1.0 ? scale : 1.0)) + 2;
}

/* Per item and axis: first[size], count[size] (int32), weights[size][taps] (float). */
typedef struct axes_layout {
    int32_t *first, *count;
    float *weights;
} axes_layout_t;

static __host__ __device__ size_t axis_bytes(size_t size, size_t taps) {
    return (2 * size * sizeof(int32_t) + size * taps * sizeof(float) + 255) & ~(size_t)255;
}

extern "C" size_t cuda_image_axes_bytes(size_t items, size_t size, size_t taps) {
    return 2 * items * axis_bytes(size, taps);
}

static __device__ axes_layout_t axis_at(void *axes, size_t item, int axis, size_t size, size_t taps) {
    char *base = (char *)axes + (2 * item + axis) * axis_bytes(size, taps);
    axes_layout_t layout;
    layout.first = (int32_t *)base;
    layout.count = layout.first + size;
    layout.weights = (float *)(layout.count + size);
    return layout;
}

static __device__ double triangle(double x) {
    x = fabs(x);
    return x < 1.0 ? 1.0 - x : 0.0;
}

/* One thread per (item, axis, output sample): the window and weights, as src/media/image_preprocess.c does. */
static __global__ void axes_kernel(void *axes, int32_t const *heights, int32_t const *widths, size_t items,
                                   int32_t size, size_t taps) {
    size_t total = items * 2 * (size_t)size;
    for (size_t unit = blockIdx.x * (size_t)blockDim.x + threadIdx.x; unit < total;
         unit += (size_t)gridDim.x * blockDim.x) {
        size_t item = unit / (2 * (size_t)size);
        int axis = (int)(unit / size % 2);
        int64_t o = (int64_t)(unit % size);
        int64_t out_height, out_width;
        resized(heights[item], widths[item], size, &out_height, &out_width);
        int64_t in = axis == 0 ? heights[item] : widths[item], out = axis == 0 ? out_height : out_width;
        int64_t offset = (out - size) / 2;
        double scale = (double)in / (double)out;
        double support = scale >= 1.0 ? scale : 1.0, inverse = scale >= 1.0 ? 1.0 / scale : 1.0;
        double center = scale * ((double)(offset + o) + 0.5);
        double low = center - support + 0.5, high = center + support + 0.5;
        int64_t first = low > 0.0 ? (int64_t)low : 0;
        int64_t last = high < (double)in ? (int64_t)high : in;
        if (last - first > (int64_t)taps) last = first + (int64_t)taps; /* cannot happen with the host's bound */
        axes_layout_t layout = axis_at(axes, item, axis, size, taps);
        double sum = 0.0;
        for (int64_t j = first; j < last; ++j)
            sum += triangle(((double)j - center + 0.5) * inverse);
        for (int64_t j = first; j < last; ++j)
            layout.weights[o * taps + (j - first)] = (float)(triangle(((double)j - center + 0.5) * inverse) / sum);
        layout.first[o] = (int32_t)first;
        layout.count[o] = (int32_t)(last - first);
    }
}

/* One thread per (item, output row, output column): three channels, summed as the host sums them. */
static __global__ void patches_kernel(uint16_t *patches, uint8_t const *rgb, int64_t const *pixel_offsets,
                                      int32_t const *widths, size_t items, cuda_image_geometry_t geometry,
                                      void *axes, size_t taps) {
    size_t const size = (size_t)geometry.size, patch = (size_t)geometry.patch, side = size / patch;
    size_t const row_values = 3 * patch * patch, per_item = side * side * row_values;
    size_t total = items * size * size;
    for (size_t unit = blockIdx.x * (size_t)blockDim.x + threadIdx.x; unit < total;
         unit += (size_t)gridDim.x * blockDim.x) {
        size_t item = unit / (size * size), y = unit / size % size, x = unit % size;
        axes_layout_t rows = axis_at(axes, item, 0, size, taps), columns = axis_at(axes, item, 1, size, taps);
        size_t stride = (size_t)widths[item] * 3;
        uint8_t const *image = rgb + pixel_offsets[item];
        float const *row_weights = rows.weights + y * taps, *column_weights = columns.weights + x * taps;
        int32_t column_first = columns.first[x], column_count = columns.count[x];
        float sums[3] = {0.0f, 0.0f, 0.0f};
        for (int32_t t = 0; t < rows.count[y]; ++t) {
            uint8_t const *pixel = image + (size_t)(rows.first[y] + t) * stride + (size_t)column_first * 3;
            float red = 0.0f, green = 0.0f, blue = 0.0f;
            for (int32_t u = 0; u < column_count; ++u, pixel += 3) {
                red = __fadd_rn(red, __fmul_rn(column_weights[u], (float)pixel[0]));
                green = __fadd_rn(green, __fmul_rn(column_weights[u], (float)pixel[1]));
                blue = __fadd_rn(blue, __fmul_rn(column_weights[u], (float)pixel[2]));
            }
            sums[0] = __fadd_rn(sums[0], __fmul_rn(row_weights[t], red));
            sums[1] = __fadd_rn(sums[1], __fmul_rn(row_weights[t], green));
            sums[2] = __fadd_rn(sums[2], __fmul_rn(row_weights[t], blue));
        }
        uint16_t *target = patches + item * per_item + ((y / patch) * side + x / patch) * row_values +
                           (y % patch) * patch + x % patch;
        for (int c = 0; c < 3; ++c) {
            float value = __fdiv_rn(__fsub_rn(__fdiv_rn(sums[c], 255.0f), geometry.mean[c]), geometry.std[c]);
            target[(size_t)c * patch * patch] = bf16_bits(value);
        }
    }
}

extern "C" cudaError_t cuda_image_patches(uint16_t *patches, uint8_t const *rgb, int64_t const *pixel_offsets,
                                          int32_t const *heights, int32_t const *widths, size_t items,
                                          cuda_image_geometry_t geometry, void *axes, size_t taps,
                                          cudaStream_t stream) {
    if (items == 0 || geometry.size <= 0 || geometry.patch <= 0) return cudaSuccess;
    size_t size = (size_t)geometry.size;
    axes_kernel<<<cuda_blocks(items * 2 * size, CUDA_THREADS), CUDA_THREADS, 0, stream>>>(
        axes, heights, widths, items, geometry.size, taps);
    cudaError_t error = cuda_launched();
    if (error != cudaSuccess) return error;
    patches_kernel<<<cuda_blocks(items * size * size, CUDA_THREADS), CUDA_THREADS, 0, stream>>>(
        patches, rgb, pixel_offsets, widths, items, geometry, axes, taps);
    return cuda_launched();
}
