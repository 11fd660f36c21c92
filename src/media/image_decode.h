/* Encoded images to interleaved RGB8: JPEG through libjpeg-turbo, PNG through libspng, chosen by the
 * first bytes, never by a file name. The limits below bound what a hostile file can cost: they are
 * checked against the header's dimensions before a pixel buffer is allocated. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "uform.h"

/* UFORM_IMAGE_MAX_PIXELS per decoded image and UFORM_IMAGE_MAX_BYTES per encoded one (uform.h), and: */
#define IMAGE_PNG_CHUNK_MAX ((size_t)1 << 24) /* 16 MiB per ancillary PNG chunk, and in all */

typedef enum image_codec {
    IMAGE_CODEC_NONE = 0, /* neither signature */
    IMAGE_CODEC_JPEG,     /* FF D8 FF */
    IMAGE_CODEC_PNG,      /* 89 'P' 'N' 'G' 0D 0A 1A 0A */
} image_codec_t;

typedef struct image_rgb {
    uint8_t *pixels; /* height rows of width * 3 bytes, malloc'ed: the caller frees it */
    size_t height, width;
} image_rgb_t;

/* The codec a buffer's first bytes name. */
image_codec_t image_codec(uint8_t const *data, size_t size);

/* Decodes `size` bytes at `data` to RGB8: JPEG with libjpeg-turbo's defaults (accurate integer DCT,
 * smooth chroma upsampling, the same as Pillow's), PNG of any colour type and depth with alpha dropped
 * and 16-bit samples reduced to their high byte; neither applies gamma, colour profiles or EXIF
 * orientation. Answers UFORM_OK (then `image` owns the pixels), UFORM_FORMAT (neither signature,
 * malformed, truncated, any libjpeg-turbo warning, a CRC error in a critical PNG chunk, more than
 * UFORM_IMAGE_MAX_PIXELS or UFORM_IMAGE_MAX_BYTES), UFORM_UNSUPPORTED (a codec this build lacks; CMYK and
 * YCCK JPEG), UFORM_OUT_OF_MEMORY. Thread-safe: every decoder state is its own. */
uform_status_t image_decode(uint8_t const *data, size_t size, image_rgb_t *image);
