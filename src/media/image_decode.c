/* JPEG and PNG decoding to RGB8, with the limits of image_decode.h checked before allocating. */
#include <stdbool.h>
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

/* The buffer of pixels_for, decoded (`status` UFORM_OK) into a height x width image, or freed. */
static uform_status_t pixels_keep(uint8_t *pixels, size_t height, size_t width, uform_status_t status,
                                  image_rgb_t *image) {
    if (status == UFORM_OK)
        *image = (image_rgb_t){pixels, height, width};
    else
        free(pixels);
    return status;
}
#endif

#if UFORM_WITH_JPEG
/* A TurboJPEG failure as a status. It says only in words that memory ran out: libjpeg's
 * JERR_OUT_OF_MEMORY ("Insufficient memory (case N)") or its own "Memory allocation failure". */
static uform_status_t jpeg_status(tjhandle handle) {
    char const *text = tjGetErrorStr2(handle);
    bool const memory =
        text && (strstr(text, "Insufficient memory") || strstr(text, "Memory allocation failure"));
    return memory ? UFORM_OUT_OF_MEMORY : UFORM_FORMAT;
}

static uform_status_t decode_jpeg(uint8_t const *data, size_t size, image_rgb_t *image) {
    tjhandle handle = tjInitDecompress();
    if (!handle) return UFORM_OUT_OF_MEMORY;
    uform_status_t status = UFORM_FORMAT;
    int width = 0, height = 0, subsampling = 0, colorspace = 0;
    if (tjDecompressHeader3(handle, data, (unsigned long)size, &width, &height, &subsampling, &colorspace) !=
        0) {
        status = jpeg_status(handle);
        goto done;
    }
    if (width <= 0 || height <= 0) goto done;
    if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK) {
        status = UFORM_UNSUPPORTED;
        goto done;
    }
    uint8_t *pixels = pixels_for((size_t)height, (size_t)width, &status);
    if (!pixels) goto done;
    /* A warning (truncated data, corrupt entropy segments) stops the decode: the item fails rather
     * than being encoded from grey fill. LIMITSCANS bounds the work of a progressive bomb. */
    bool const failed = tjDecompress2(handle, data, (unsigned long)size, pixels, width, width * 3, height,
                                      TJPF_RGB, TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS) != 0;
    status =
        pixels_keep(pixels, (size_t)height, (size_t)width, failed ? jpeg_status(handle) : UFORM_OK, image);
done:
    tjDestroy(handle);
    return status;
}
#endif

#if UFORM_WITH_SPNG
/* libspng's allocations, and zlib's through it, noting a failure: libspng answers SPNG_EZLIB alike for
 * a corrupt stream and for inflate out of memory. One image decodes on one thread, so the note is the
 * thread's. */
static _Thread_local bool png_memory_failed;

static void *png_malloc(size_t size) {
    void *block = malloc(size);
    if (!block) png_memory_failed = true;
    return block;
}

static void *png_realloc(void *block, size_t size) {
    void *grown = realloc(block, size);
    if (!grown && size) png_memory_failed = true;
    return grown;
}

static void *png_calloc(size_t count, size_t size) {
    void *block = calloc(count, size);
    if (!block) png_memory_failed = true;
    return block;
}

static struct spng_alloc png_allocator = {png_malloc, png_realloc, png_calloc, free};

/* A libspng answer as a status. */
static uform_status_t png_status(int error) {
    if (error == SPNG_OK) return UFORM_OK;
    return error == SPNG_EMEM || png_memory_failed ? UFORM_OUT_OF_MEMORY : UFORM_FORMAT;
}

static uform_status_t decode_png(uint8_t const *data, size_t size, image_rgb_t *image) {
    png_memory_failed = false;
    spng_ctx *context = spng_ctx_new2(&png_allocator, 0);
    if (!context) return UFORM_OUT_OF_MEMORY;
    uform_status_t status = UFORM_FORMAT;
    struct spng_ihdr header;
    size_t bytes = 0;
    int error = spng_set_chunk_limits(context, IMAGE_PNG_CHUNK_MAX, IMAGE_PNG_CHUNK_MAX);
    if (error == SPNG_OK) error = spng_set_png_buffer(context, data, size);
    if (error == SPNG_OK) error = spng_get_ihdr(context, &header); /* reads chunks: may allocate */
    if (error != SPNG_OK) {
        status = png_status(error);
        goto done;
    }
    uint8_t *pixels = pixels_for(header.height, header.width, &status);
    if (!pixels) goto done;
    error = spng_decoded_image_size(context, SPNG_FMT_RGB8, &bytes);
    if (error == SPNG_OK && bytes == (size_t)header.height * header.width * 3)
        error = spng_decode_image(context, pixels, bytes, SPNG_FMT_RGB8, 0);
    else if (error == SPNG_OK)
        error = SPNG_EOVERFLOW;
    status = pixels_keep(pixels, header.height, header.width, png_status(error), image);
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
