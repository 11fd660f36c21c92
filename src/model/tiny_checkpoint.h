/* The small model's sizes (tiny_checkpoint.c): written once for the tiny checkpoint and for a trainer that
 * starts from scratch, so that the two make the same towers where a caller names no size. */
#pragma once

#include "uform.h"

/* Sets the model sizes of `config`: depth 2 in every tower, dims 64, context 64, images of 32 pixels in
 * patches of 8, 4 frames a clip, audio at 16 kHz with 32 mels over 2 s; nothing else. The widths are each
 * one's own: the tiny checkpoint's hidden 64 and mlp 2 hidden, a trainer's hidden 128 and mlp 4 hidden. */
void tiny_model_sizes(uform_trainer_config_t *config);
