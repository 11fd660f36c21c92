/* The host's image call, shared by the image verbs (src/encode/image.c) and the video verb
 * (src/encode/video.c): a video call is an image call (image_encode_host with request->video) whose
 * items are clips of `frames` images, their rows pooled per clip (clip_rows). */
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
    size_t const *heights, *widths;
    bool video;     /* items are clips (their bytes or paths) */
    size_t frames;  /* images per item: 1, or the model's frames per clip */
    size_t vectors; /* token vectors per item: patches per image, or frames per clip */
    image_geometry_t geometry;
    size_t patches; /* per image: (size / patch)^2 */
    image_rows_t *rows;
};

/* The rows of clips (video.c): `frames` images per item, pooled. */
image_rows_t clip_rows;
