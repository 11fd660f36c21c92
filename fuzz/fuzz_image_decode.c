/* libFuzzer: image_decode (JPEG through libjpeg-turbo, PNG through libspng, chosen by content) on
 * arbitrary bytes, then image_preprocess of what decodes, so that every decoded pixel is read. */
#include <stdlib.h>

#include "image_decode.h"
#include "image_preprocess.h"

int LLVMFuzzerTestOneInput(uint8_t const *data, size_t size);

int LLVMFuzzerTestOneInput(uint8_t const *data, size_t size) {
    image_rgb_t rgb;
    if (image_decode(data, size, &rgb) != UFORM_OK) return 0;
    image_geometry_t const geometry = {
        .size = 16, .patch = 8, .mean = {0.5f, 0.5f, 0.5f}, .std = {0.25f, 0.25f, 0.25f}};
    float patches[4 * 3 * 8 * 8];
    (void)image_preprocess(rgb.pixels, rgb.height, rgb.width, rgb.width * 3, &geometry, patches);
    free(rgb.pixels);
    return 0;
}
