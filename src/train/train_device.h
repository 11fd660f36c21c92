/* The host side of the VRAM trainer (src/train/train_vram.c), which needs no device and is checked on
 * any machine (tests/train/test_train_device.c): where every tensor lives in the device's flat buffers,
 * the copies between those buffers and the trainer's parameters that a save and a resume go through, and
 * the arrays a step stages for the device from a batch's plan.
 *
 * The flat buffers. Master weights, gradients and both AdamW moments are each one F32 buffer, the
 * weights' BF16 copy a fifth, all with one layout: the tensors of train_params_t in its order (the
 * checkpoint schema's), each starting at a multiple of TRAIN_DEVICE_CHUNK scalars, the padding zero. A
 * chunk then belongs to one tensor, so that the optimizer (cuda_adamw_update) knows from a byte per
 * chunk whether it decays, and the gradient norm sums fixed chunks. The save format is the RAM
 * trainer's: train_device_unpack fills train_params_t's tensors, and train_params_save writes them. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "train.h"
#include "train_step.h"

#define TRAIN_DEVICE_CHUNK 4096 /* scalars; cuda_train.h's CUDA_TRAIN_CHUNK */

typedef struct train_device_layout {
    size_t count;    /* tensors */
    size_t *offsets; /* [count]: each tensor's first scalar */
    size_t chunks;   /* of TRAIN_DEVICE_CHUNK scalars, end to end */
    uint8_t *decay;  /* [chunks]: 1 where the chunk's tensor takes weight decay */
} train_device_layout_t;

/* The layout of `params`' tensors. false when out of memory (nothing held). */
bool train_device_layout(train_device_layout_t *layout, train_params_t const *params);
void train_device_layout_free(train_device_layout_t *layout);

/* Which of a tensor's arrays a copy moves. */
typedef enum train_device_field { TRAIN_DEVICE_VALUE, TRAIN_DEVICE_M, TRAIN_DEVICE_V } train_device_field_t;

/* flat [chunks * TRAIN_DEVICE_CHUNK] = `field` of every tensor at its offset, zero between them. */
void train_device_pack(train_device_layout_t const *layout, train_params_t const *params,
                       train_device_field_t field, float *flat);
/* `field` of every tensor = its part of flat. */
void train_device_unpack(train_device_layout_t const *layout, train_params_t *params,
                         train_device_field_t field, float const *flat);

/* The tokens of each row of the 257-row byte table, for its gradient without atomics: starts [258] and
 * order [count] such that order[starts[b] .. starts[b + 1]) are the positions t with tokens[t] == b, in
 * ascending order (a counting sort). */
void train_device_token_order(uint16_t const *tokens, size_t count, int32_t *starts, int32_t *order);

/* ---- A step's arrays ---------------------------------------------------------------------------- */

/* One trunk's arrays (int32 unless said): its token offsets [items + 1] and the rows whose states are
 * projected [items] (each item's last token for texts, its class token otherwise); for patch trunks its
 * patch offsets [items + 1] and its patch rows, BF16 [rows, inputs]. */
typedef struct train_device_trunk {
    size_t items, tokens, rows, inputs;                     /* rows of patches, of `inputs` values each */
    size_t longest;                                         /* the most tokens of one item */
    size_t token_offsets, patch_offsets, selected, patches; /* byte offsets in the block */
} train_device_trunk_t;

/* Where everything a step stages lies in one block (the same offsets on the host's pinned staging and on
 * the device), each piece 256-byte aligned, and what the pieces hold. */
typedef struct train_device_batch {
    size_t items, units, bytes;
    train_device_trunk_t text, image, audio;
    size_t tokens;       /* text: int32 [text tokens], the byte table's row of each */
    size_t targets;      /* text: int32 [text tokens], the next token, -1 at an item's last */
    size_t token_starts; /* text: int32 [258] */
    size_t token_order;  /* text: int32 [text tokens] */
    size_t unit_first;   /* int32 [items]: each item's first unit (a projected row) */
    size_t unit_count;   /* int32 [items]: 1, or a clip's frames */
    size_t related;      /* uint8 [items, items] */
} train_device_batch_t;

/* The block of `plan` (sizes only, when base is NULL) and, at `base`, its contents: units are the texts
 * in order, then the image trunk's entries (a clip's frames consecutive), then the sounds; `relations`
 * pairs (relations_count of them) mark `related` both ways. */
train_device_batch_t train_device_batch_plan(batch_plan_t const *plan, uform_model_info_t const *info,
                                             uint32_t const *relations, size_t relations_count, void *base);
