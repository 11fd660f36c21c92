/* Encoded images and clips to the image tower's patch rows (patches.h): image_decode then
 * image_preprocess for an image; video_decode with a sink preprocessing each sampled frame for a clip. */
#include <stdlib.h>
#include <string.h>

#include "image_decode.h"
#include "patches.h"
#include "video_decode.h"

/* Where a clip's samples land: sample k's rows at patches + k * floats. */
typedef struct video_patches {
    image_geometry_t const *geometry;
    float *patches;
    size_t floats; /* per sample: (size / patch)^2 * 3 patch^2 */
} video_patches_t;

/* Prepares the frame once into the first sample's rows, then copies them to the samples that repeat it. */
static uform_status_t video_patches_sink(void *context, size_t first, size_t count,
                                         video_frame_t const *frame) {
    video_patches_t const *target = context;
    float *rows = target->patches + first * target->floats;
    uform_status_t status =
        image_preprocess(frame->rgb, frame->height, frame->width, frame->stride, target->geometry, rows);
    for (size_t k = 1; k < count && status == UFORM_OK; ++k)
        memcpy(rows + k * target->floats, rows, target->floats * sizeof(float));
    return status;
}

uform_status_t media_patches(uint8_t const *bytes, size_t span, image_geometry_t const *geometry,
                             size_t frames, float *patches) {
    if (frames) {
        size_t side = geometry->size / geometry->patch;
        video_patches_t target = {geometry, patches, side * side * 3 * geometry->patch * geometry->patch};
        return video_decode(bytes, span, frames, video_patches_sink, &target);
    }
    image_rgb_t rgb;
    uform_status_t status = image_decode(bytes, span, &rgb);
    if (status != UFORM_OK) return status;
    status = image_preprocess(rgb.pixels, rgb.height, rgb.width, rgb.width * 3, geometry, patches);
    free(rgb.pixels);
    return status;
}
