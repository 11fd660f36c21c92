/* The image, video and audio suites' check that decoding overlaps compute (media_overlap.c), through
 * the engine's test hook (media_read.h). */
#pragma once

#include <stddef.h>

#include "fixtures.h"

/* Encodes `batch` (several chunks) on a RAM executor of `threads` threads, watching the run: with 2 or
 * more, every chunk but the first is decoded ahead, during the previous chunk's compute; with 1, none. */
void check_decoded_ahead(batch_encode_t encode, batch_t const *batch, size_t threads);

/* check_decoded_ahead on 1, 2 and 3 threads, and the outputs bitwise the same on every receiver. */
void assert_decoded_ahead(batch_encode_t encode, batch_t const *batch);
