/* The image front end's 8-bit crop and patch rows as a filter, for tests/encode/test_resample.py (the
 * library exports only uform_* symbols, so the test reaches image_crop_rgb8 and image_preprocess through
 * this program):
 *
 *     resample_driver < cases.bin > results.bin
 *
 * Each case, in the machine's byte order: 8 uint32 (height, width, padding, size, patch, resize,
 * resample, 0), 6 float32 (mean[3], std[3]), then `height` rows of width * 3 + padding bytes (the
 * padding is each row's stride beyond its pixels). Each result: the status names of image_crop_rgb8 and
 * of image_preprocess, 24 bytes each, NUL-padded; the crop's size * size * 3 bytes where the first is
 * "ok"; the (size / patch)^2 * 3 patch^2 float32 of the patch rows where the second is.
 * Exit status: 0, 1 on a short or malformed case or a failed write. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image_preprocess.h"

#define NAME_BYTES 24

static int write_status(uform_status_t status) {
    char name[NAME_BYTES] = {0};
    strncpy(name, uform_status_name(status), NAME_BYTES - 1);
    return fwrite(name, 1, NAME_BYTES, stdout) == NAME_BYTES;
}

/* Reads one case and writes its result; answers 1 on success, 0 at the end of the input, -1 on a fault. */
static int run_case(void) {
    uint32_t header[8];
    size_t got = fread(header, sizeof header[0], 8, stdin);
    if (got == 0 && feof(stdin)) return 0;
    float numbers[6];
    if (got != 8 || fread(numbers, sizeof numbers[0], 6, stdin) != 6) return -1;
    size_t const height = header[0], width = header[1], stride = (size_t)header[1] * 3 + header[2];
    size_t const size = header[3], patch = header[4];
    size_t bytes = 0;
    if (size == 0 || size > 4096 || patch == 0 || __builtin_mul_overflow(height, stride, &bytes) ||
        bytes > ((size_t)1 << 32))
        return -1;
    image_geometry_t geometry = {.size = size,
                                 .patch = patch,
                                 .resize = (image_resize_t)header[5],
                                 .resample = (image_resample_t)header[6]};
    memcpy(geometry.mean, numbers, sizeof geometry.mean);
    memcpy(geometry.std, numbers + 3, sizeof geometry.std);
    size_t const floats = size * size * 3;
    uint8_t *rgb = malloc(bytes + 1), *crop = malloc(floats);
    float *patches = malloc(floats * sizeof(float));
    int result = -1;
    if (rgb && crop && patches && fread(rgb, 1, bytes, stdin) == bytes) {
        uform_status_t cropped = image_crop_rgb8(rgb, height, width, stride, &geometry, crop);
        uform_status_t prepared = image_preprocess(rgb, height, width, stride, &geometry, patches);
        result = write_status(cropped) && write_status(prepared) &&
                         (cropped != UFORM_OK || fwrite(crop, 1, floats, stdout) == floats) &&
                         (prepared != UFORM_OK || fwrite(patches, sizeof(float), floats, stdout) == floats)
                     ? 1
                     : -1;
    }
    free(patches);
    free(crop);
    free(rgb);
    return result;
}

int main(int argc, char **argv) {
    if (argc != 1) {
        fprintf(stderr, "usage: %s < cases.bin > results.bin\n", argv[0]);
        return 1;
    }
    int status;
    while ((status = run_case()) > 0)
        ;
    if (status < 0) fprintf(stderr, "%s: a short or malformed case, or a failed write\n", argv[0]);
    return status < 0 || fflush(stdout) != 0 ? 1 : 0;
}
