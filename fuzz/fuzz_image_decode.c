/* libFuzzer: image_decode (JPEG through libjpeg-turbo, PNG through libspng, chosen by content) on
 * arbitrary bytes, then image_preprocess of what decodes, so that every decoded pixel is read: through the
 * engine's float path, and through Pillow's 8-bit bicubic with torchvision's crop and with the square. */
#include <stdlib.h>

#include "image_decode.h"
#include "image_preprocess.h"

int LLVMFuzzerTestOneInput(uint8_t const *data, size_t size);

int LLVMFuzzerTestOneInput(uint8_t const *data, size_t size) {
    image_rgb_t rgb;
    if (image_decode(data, size, &rgb) != UFORM_OK) return 0;
    image_geometry_t geometry = {
        .size = 16, .patch = 8, .mean = {0.5f, 0.5f, 0.5f}, .std = {0.25f, 0.25f, 0.25f}};
    float patches[4 * 3 * 8 * 8];
    (void)image_preprocess(rgb.pixels, rgb.height, rgb.width, rgb.width * 3, &geometry, patches);
    geometry.resample = IMAGE_RESAMPLE_PILLOW_BICUBIC;
    geometry.resize = IMAGE_RESIZE_SHORT_SIDE_ROUND_CROP;
    (void)image_preprocess(rgb.pixels, rgb.height, rgb.width, rgb.width * 3, &geometry, patches);
    geometry.resize = IMAGE_RESIZE_SQUARE;
    (void)image_preprocess(rgb.pixels, rgb.height, rgb.width, rgb.width * 3, &geometry, patches);
    free(rgb.pixels);
    return 0;
}
