/* The host's image call, shared by the image verbs (src/encode/image.c) and the video verb
 * (src/encode/video.c): a video call is an image call (image_encode_call with request->video) whose
 * items are clips of `frames` images, their rows pooled per clip. */
#pragma once

#include "image_preprocess.h"
#include "media_read.h"
#include "tower.h"
#include "verbs.h"

typedef struct image_call image_call_t;

/* Writes the outputs of the `kept` decoded images of a chunk from the tower's final states in
 * `scratch`: one row per image (image.c), or pooled per clip of `frames` images in order (video.c). */
typedef void image_rows_t(image_call_t *image, patch_scratch_t const *scratch, size_t kept);

struct image_call {
    call_t call;
    encode_call_t encode;
    media_run_t run;
    image_input_t input;
    uform_tape_t tape;
    size_t const *heights, *widths;
    bool video;     /* items are clips (their bytes or paths) */
    size_t frames;  /* images per item: 1, or the model's frames per clip */
    size_t vectors; /* token vectors per item: patches per image, or frames per clip */
    image_geometry_t geometry;
    size_t patches; /* per image: (size / patch)^2 */
    image_rows_t *rows;
};

/* The image call of `request` (image_encode_host's), its rows written by `rows`. */
uform_status_t image_encode_call(char const *entry, image_request_t const *request, image_rows_t *rows);
