/* The host's image call, shared by the image verbs (src/encode/image.c) and the video verb
 * (src/encode/video.c): a video call is an image call (image_encode_host with request->video) whose
 * items are clips of `frames` images, their rows pooled per clip (clip_rows). */
#pragma once

#include "image_preprocess.h"
#include "media_read.h"
#include "tower.h"
#include "verbs.h"

/* Where a call's images or clips come from and how each is prepared for the tower: what the host's image
 * call and a VRAM executor's media call (src/vram/vram_media.c) share. */
typedef struct image_source {
    image_input_t input;
    size_t const *heights, *widths; /* pixels only */
    image_geometry_t geometry;
    bool video;     /* items are clips */
    size_t frames;  /* images per item: 1, or the model's frames per clip */
    size_t patches; /* per image: (size / patch)^2 */
} image_source_t;

/* The source of a checked request, with its model's geometry and frames. */
image_source_t image_source_of(image_request_t const *request);

/* Item `item`'s patch rows, [frames, patches, 3 patch^2]: from its pixels, its file's bytes (read by
 * `run`) or its encoded bytes in `tape`; an image, or every sampled frame of a clip. On any executor
 * thread. Answers UFORM_INVALID_ARGUMENT for pixels whose span is wrong, else what media_patches
 * answers; the rows are then undefined. */
uform_status_t image_source_patches(image_source_t const *source, uform_tape_t const *tape,
                                    media_run_t const *run, size_t item, float *patches);

typedef struct image_call image_call_t;

/* Writes the outputs of the `kept` decoded images of a chunk from the tower's final states in
 * `scratch`: one row per image (image.c), or pooled per clip of `frames` images in order (video.c). */
typedef void image_rows_t(image_call_t *image, patch_scratch_t const *scratch, size_t kept);

struct image_call {
    call_t call;
    encode_call_t encode;
    media_run_t run;
    image_source_t source;
    size_t vectors; /* token vectors per item: patches per image, or frames per clip */
    image_rows_t *rows;
};

/* The rows of clips (video.c): `frames` images per item, pooled. */
image_rows_t clip_rows;
