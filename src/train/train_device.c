/* The host side of the VRAM trainer: the flat buffers' layout, the copies a save and a resume go through,
 * and a step's staged arrays (train_device.h). Plain C on host memory: no device is touched here. */
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "train_device.h"

#define PIECE 256 /* bytes: the alignment of each array of a step's block */

/* ---- The flat buffers ----------------------------------------------------------------------------- */

static size_t chunks_of(size_t scalars) {
    return (scalars + TRAIN_DEVICE_CHUNK - 1) / TRAIN_DEVICE_CHUNK;
}

bool train_device_layout(train_device_layout_t *layout, train_params_t const *params) {
    memset(layout, 0, sizeof *layout);
    layout->count = params->count;
    layout->offsets = malloc((params->count + 1) * sizeof(size_t));
    for (size_t i = 0; i < params->count; ++i)
        layout->chunks += chunks_of(params->tensors[i].count);
    layout->decay = calloc(layout->chunks + 1, 1);
    if (!layout->offsets || !layout->decay) {
        train_device_layout_free(layout);
        return false;
    }
    for (size_t i = 0, chunk = 0; i < params->count; ++i) {
        train_tensor_t const *tensor = &params->tensors[i];
        layout->offsets[i] = chunk * TRAIN_DEVICE_CHUNK;
        for (size_t c = 0; c < chunks_of(tensor->count); ++c, ++chunk)
            layout->decay[chunk] = tensor->decay;
    }
    return true;
}

void train_device_layout_free(train_device_layout_t *layout) {
    free(layout->offsets);
    free(layout->decay);
    memset(layout, 0, sizeof *layout);
}

static float *field_of(train_tensor_t const *tensor, train_device_field_t field) {
    return field == TRAIN_DEVICE_VALUE ? tensor->value : field == TRAIN_DEVICE_M ? tensor->m : tensor->v;
}

void train_device_pack(train_device_layout_t const *layout, train_params_t const *params,
                       train_device_field_t field, float *flat) {
    memset(flat, 0, layout->chunks * TRAIN_DEVICE_CHUNK * sizeof(float));
    for (size_t i = 0; i < params->count; ++i)
        memcpy(flat + layout->offsets[i], field_of(&params->tensors[i], field),
               params->tensors[i].count * sizeof(float));
}

void train_device_unpack(train_device_layout_t const *layout, train_params_t *params,
                         train_device_field_t field, float const *flat) {
    for (size_t i = 0; i < params->count; ++i)
        memcpy(field_of(&params->tensors[i], field), flat + layout->offsets[i],
               params->tensors[i].count * sizeof(float));
}

void train_device_token_order(uint16_t const *tokens, size_t count, int32_t *starts, int32_t *order) {
    memset(starts, 0, 258 * sizeof(int32_t));
    for (size_t t = 0; t < count; ++t)
        starts[tokens[t] + 1]++;
    for (size_t b = 0; b < 257; ++b)
        starts[b + 1] += starts[b];
    int32_t next[257];
    memcpy(next, starts, sizeof next);
    for (size_t t = 0; t < count; ++t)
        order[next[tokens[t]]++] = (int32_t)t;
}

/* ---- A step's arrays ------------------------------------------------------------------------------ */

/* Takes `bytes` from the block being sized or filled: their offset. */
static size_t take(size_t *used, size_t bytes) {
    size_t at = *used;
    *used += (bytes + PIECE - 1) / PIECE * PIECE;
    return at;
}

/* Offsets of a trunk's arrays: its token offsets and selected rows, and for patch trunks its patch offsets
 * and patch rows. */
static void trunk_take(train_device_trunk_t *trunk, size_t *used, bool patches) {
    trunk->token_offsets = take(used, (trunk->items + 1) * sizeof(int32_t));
    trunk->selected = take(used, (trunk->items + 1) * sizeof(int32_t));
    if (!patches) return;
    trunk->patch_offsets = take(used, (trunk->items + 1) * sizeof(int32_t));
    trunk->patches = take(used, (trunk->rows * trunk->inputs + 1) * sizeof(uint16_t));
}

/* A trunk's sizes from its token offsets [items + 1]. */
static train_device_trunk_t trunk_sizes(size_t items, size_t const *offsets, size_t inputs) {
    train_device_trunk_t trunk = {.items = items, .tokens = offsets[items], .inputs = inputs};
    trunk.rows = trunk.tokens - items;
    for (size_t i = 0; i < items; ++i)
        if (offsets[i + 1] - offsets[i] > trunk.longest) trunk.longest = offsets[i + 1] - offsets[i];
    return trunk;
}

/* The arrays of a trunk of token offsets `offsets`: each item's selected row is its last token (texts) or
 * its class token, its first (patch trunks, whose patch offsets are the token offsets less the class
 * tokens before). */
static void trunk_fill(train_device_trunk_t const *trunk, size_t const *offsets, bool patches, char *base) {
    int32_t *tokens = (int32_t *)(base + trunk->token_offsets),
            *selected = (int32_t *)(base + trunk->selected);
    int32_t *patch_offsets = patches ? (int32_t *)(base + trunk->patch_offsets) : NULL;
    for (size_t i = 0; i <= trunk->items; ++i) {
        tokens[i] = (int32_t)offsets[i];
        if (patch_offsets) patch_offsets[i] = (int32_t)(offsets[i] - i);
        if (i < trunk->items) selected[i] = (int32_t)(patches ? offsets[i] : offsets[i + 1] - 1);
    }
}

static void text_fill(train_device_batch_t const *batch, batch_plan_t const *plan, char *base) {
    int32_t *tokens = (int32_t *)(base + batch->tokens), *targets = (int32_t *)(base + batch->targets);
    trunk_fill(&batch->text, plan->text_offsets, false, base);
    for (size_t t = 0; t < plan->texts; ++t)
        for (size_t row = plan->text_offsets[t]; row < plan->text_offsets[t + 1]; ++row) {
            tokens[row] = plan->tokens[row];
            targets[row] = row + 1 < plan->text_offsets[t + 1] ? plan->tokens[row + 1] : -1;
        }
    train_device_token_order(plan->tokens, plan->text_tokens, (int32_t *)(base + batch->token_starts),
                             (int32_t *)(base + batch->token_order));
}

/* Each item's units: its text, its image-trunk entries, or its sound, in that order of the trunks. */
static void units_fill(train_device_batch_t const *batch, batch_plan_t const *plan, char *base) {
    int32_t *first = (int32_t *)(base + batch->unit_first), *count = (int32_t *)(base + batch->unit_count);
    memset(count, 0, plan->items * sizeof(int32_t));
    for (size_t t = 0; t < plan->texts; ++t)
        first[plan->text_items[t]] = (int32_t)t, count[plan->text_items[t]] = 1;
    for (size_t e = plan->images; e-- > 0;) /* backwards: a clip's first frame is written last */
        first[plan->image_items[e]] = (int32_t)(plan->texts + e), count[plan->image_items[e]]++;
    for (size_t s = 0; s < plan->sounds; ++s)
        first[plan->sound_items[s]] = (int32_t)(plan->texts + plan->images + s),
        count[plan->sound_items[s]] = 1;
}

train_device_batch_t train_device_batch_plan(batch_plan_t const *plan, uform_model_info_t const *info,
                                             uint32_t const *relations, size_t relations_count, void *base) {
    size_t image_inputs = info->has_image ? 3 * info->image.patch * info->image.patch : 0;
    size_t audio_inputs = info->has_audio ? info->audio.mels * info->audio.patch_frames : 0;
    train_device_batch_t batch = {.items = plan->items, .units = plan->texts + plan->images + plan->sounds};
    batch.text = trunk_sizes(plan->texts, plan->text_offsets, 0);
    batch.text.rows = 0;
    batch.image = trunk_sizes(plan->images, plan->image_offsets, image_inputs);
    batch.audio = trunk_sizes(plan->sounds, plan->sound_offsets, audio_inputs);
    size_t used = 0, tokens = plan->text_tokens + 1;
    batch.tokens = take(&used, tokens * sizeof(int32_t));
    batch.targets = take(&used, tokens * sizeof(int32_t));
    batch.token_starts = take(&used, 258 * sizeof(int32_t));
    batch.token_order = take(&used, tokens * sizeof(int32_t));
    trunk_take(&batch.text, &used, false);
    trunk_take(&batch.image, &used, true);
    trunk_take(&batch.audio, &used, true);
    batch.unit_first = take(&used, (plan->items + 1) * sizeof(int32_t));
    batch.unit_count = take(&used, (plan->items + 1) * sizeof(int32_t));
    batch.related = take(&used, plan->items * plan->items + 1);
    batch.bytes = used;
    if (!base) return batch;
    char *block = base;
    text_fill(&batch, plan, block);
    trunk_fill(&batch.image, plan->image_offsets, true, block);
    trunk_fill(&batch.audio, plan->sound_offsets, true, block);
    kernels_t const *kernels = kernels_active();
    kernels->f32_to_bf16((uint16_t *)(block + batch.image.patches), plan->image_patches,
                         plan->image_rows * image_inputs);
    kernels->f32_to_bf16((uint16_t *)(block + batch.audio.patches), plan->sound_patches,
                         plan->sound_rows * audio_inputs);
    units_fill(&batch, plan, block);
    uint8_t *related = (uint8_t *)(block + batch.related);
    memset(related, 0, plan->items * plan->items);
    for (size_t r = 0; r < relations_count; ++r) {
        uint32_t a = relations[2 * r], b = relations[2 * r + 1];
        related[a * plan->items + b] = related[b * plan->items + a] = 1;
    }
    return batch;
}
