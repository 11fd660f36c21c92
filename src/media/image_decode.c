/* JPEG and PNG decoding to RGB8, with the limits of image_decode.h checked before allocating. */
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "uform_config.h"
#include "image_decode.h"

#if UFORM_WITH_JPEG
#include <turbojpeg.h>
#endif
#if UFORM_WITH_SPNG
#include <spng.h>
#endif

static uint8_t const png_signature[8] = {0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a};

image_codec_t image_codec(uint8_t const *data, size_t size) {
    if (size >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff) return IMAGE_CODEC_JPEG;
    if (size >= sizeof png_signature && memcmp(data, png_signature, sizeof png_signature) == 0)
        return IMAGE_CODEC_PNG;
    return IMAGE_CODEC_NONE;
}

#if UFORM_WITH_JPEG || UFORM_WITH_SPNG
/* The RGB8 buffer of a height x width image within the limits, or NULL with the status why not. */
static uint8_t *pixels_for(size_t height, size_t width, uform_status_t *status) {
    if (height == 0 || width == 0 || height > UFORM_IMAGE_MAX_PIXELS / width) {
        *status = UFORM_FORMAT;
        return NULL;
    }
    uint8_t *pixels = malloc(height * width * 3);
    *status = pixels ? UFORM_OK : UFORM_OUT_OF_MEMORY;
    return pixels;
}
#endif

#if UFORM_WITH_JPEG
static uform_status_t decode_jpeg(uint8_t const *data, size_t size, image_rgb_t *image) {
    tjhandle handle = tjInitDecompress();
    if (!handle) return UFORM_OUT_OF_MEMORY;
    uform_status_t status = UFORM_FORMAT;
    int width = 0, height = 0, subsampling = 0, colorspace = 0;
    if (tjDecompressHeader3(handle, data, (unsigned long)size, &width, &height, &subsampling, &colorspace) !=
            0 ||
        width <= 0 || height <= 0)
        goto done;
    if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK) {
        status = UFORM_UNSUPPORTED;
        goto done;
    }
    uint8_t *pixels = pixels_for((size_t)height, (size_t)width, &status);
    if (!pixels) goto done;
    /* A warning (truncated data, corrupt entropy segments) stops the decode: the item fails rather
     * than being encoded from grey fill. LIMITSCANS bounds the work of a progressive bomb. */
    if (tjDecompress2(handle, data, (unsigned long)size, pixels, width, width * 3, height, TJPF_RGB,
                      TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS) != 0) {
        free(pixels);
        status = UFORM_FORMAT;
        goto done;
    }
    *image = (image_rgb_t){pixels, (size_t)height, (size_t)width};
done:
    tjDestroy(handle);
    return status;
}
#endif

#if UFORM_WITH_SPNG
static uform_status_t decode_png(uint8_t const *data, size_t size, image_rgb_t *image) {
    spng_ctx *context = spng_ctx_new(0);
    if (!context) return UFORM_OUT_OF_MEMORY;
    uform_status_t status = UFORM_FORMAT;
    struct spng_ihdr header;
    size_t bytes = 0;
    if (spng_set_chunk_limits(context, IMAGE_PNG_CHUNK_MAX, IMAGE_PNG_CHUNK_MAX) != SPNG_OK ||
        spng_set_png_buffer(context, data, size) != SPNG_OK || spng_get_ihdr(context, &header) != SPNG_OK)
        goto done;
    uint8_t *pixels = pixels_for(header.height, header.width, &status);
    if (!pixels) goto done;
    int error = spng_decoded_image_size(context, SPNG_FMT_RGB8, &bytes);
    if (error == SPNG_OK && bytes == (size_t)header.height * header.width * 3)
        error = spng_decode_image(context, pixels, bytes, SPNG_FMT_RGB8, 0);
    else if (error == SPNG_OK)
        error = SPNG_EOVERFLOW;
    if (error != SPNG_OK) {
        free(pixels);
        status = error == SPNG_EMEM ? UFORM_OUT_OF_MEMORY : UFORM_FORMAT;
        goto done;
    }
    *image = (image_rgb_t){pixels, header.height, header.width};
done:
    spng_ctx_free(context);
    return status;
}
#endif

uform_status_t image_decode(uint8_t const *data, size_t size, image_rgb_t *image) {
    *image = (image_rgb_t){0};
    if (size > UFORM_IMAGE_MAX_BYTES) return UFORM_FORMAT;
    image_codec_t codec = image_codec(data, size);
    if (codec == IMAGE_CODEC_NONE) return UFORM_FORMAT;
#if UFORM_WITH_JPEG
    if (codec == IMAGE_CODEC_JPEG) return decode_jpeg(data, size, image);
#endif
#if UFORM_WITH_SPNG
    if (codec == IMAGE_CODEC_PNG) return decode_png(data, size, image);
#endif
    return UFORM_UNSUPPORTED; /* a codec this build lacks */
}
