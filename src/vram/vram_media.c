/* The media verbs on a VRAM executor whose items are prepared on the host: image_encode of files and of
 * encoded images in memory, video_encode, audio_encode and audio_encode_samples.
 *
 *   read     (files) through the executor's ring, as on host executors (src/encode/media_read.h);
 *   prepare  each item's patch rows on the host, exactly as host executors prepare them (images and clips:
 *            decoded, resized, cropped, normalized, image_source_patches; sounds: decoded, resampled and
 *            turned into log-mel patches, audio_clips_prepare), on the executor's host team
 *            (vram_workers), a chunk at a time over all its threads, into one of two sets of pinned rows
 *            while the devices compute the chunks before from the other;
 *   stage    per chunk, the kept items' rows packed in place (failed items' left out) and the chunk's
 *            index arrays (vram_units_plan) written into a pinned staging slot of its device;
 *   compute  chunk k on device k mod N (vram_place): one copy of the indices and one of the rows, the rows
 *            to BF16, the patch GEMM, class tokens and positions, the tower (bidirectional, no rotary),
 *            the outputs of the chunk's items [first, last) (a failed item's rows zero, gathered as such),
 *            pooled per clip for video (vram_output_clips), written into the arena (from another device,
 *            through its scratch: vram_views_t).
 *
 * The turn of chunk k waits (media_read.h, `ready`) until chunk k - 2 was copied in (its set of rows is
 * k's) and its device slot is free; the call polls the devices' events on a timer meanwhile, and once
 * the run has ended until every chunk is done. Progress counts a chunk once it is enqueued. The log-mel
 * front end runs on the host, overlapped with the devices, as its FFT is libavutil's. Token vectors of
 * sounds are packed as on host executors: item i owns rows [item_offsets[i], item_offsets[i + 1]). */
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "audio.h"
#include "call.h"
#include "executor.h"
#include "image.h"
#include "model.h"
#include "vram.h"

#if UFORM_WITH_CUDA

#define MEDIA_CHUNK_TOKENS 16384 /* tokens of a chunk, its items counted at their most */
#define MEDIA_CHUNK_MAX    256   /* items of a chunk */

typedef struct vram_media_call {
    call_t call;
    encode_call_t encode;
    media_run_t run;
    vram_units_kind_t kind;
    image_source_t source; /* images and clips */
    audio_input_t audio_input;
    size_t rate;               /* of the samples */
    struct audio_clips *clips; /* sounds (with FFmpeg) */
    size_t row_floats;         /* one patch row: 3 patch^2, or patch_frames * mels */
    size_t item_patches;       /* patch rows an item has at the most: frames * patches, or max_patches */
    size_t image_patches;      /* per image */
    size_t leading;            /* tokens before each unit's patches: its class token, then its registers */
    size_t *token_offsets;     /* sounds with token vectors: [items + 1] */
    size_t token_rows;
    loop_op_t poll;
    bool polling; /* the poll timer is armed */
    bool ended;   /* the run ended: the call waits for the devices */
} vram_media_call_t;

static vram_t *vram_media_devices(vram_media_call_t const *media) {
    return vram_of(media->call.executor);
}

/* The tower the call runs, on device `d`. */
static vram_tower_t const *vram_media_tower(vram_media_call_t const *media, size_t d) {
    vram_replica_t const *replica = &media->encode.model->device->replicas[d];
    return media->kind == VRAM_UNITS_SOUNDS ? &replica->audio : &replica->image;
}

/* ---- The end ------------------------------------------------------------------------------------ */

static void vram_media_finish(vram_media_call_t *media) {
    encode_call_t *encode = &media->encode;
    vram_t *vram = vram_media_devices(media);
    /* A chunk that failed half enqueued may still read the rows: nothing is freed before it ends. */
    for (size_t d = 0; encode->failure != UFORM_OK && d < vram->count; ++d)
        cudaStreamSynchronize(vram->devices[d].stream);
    encode->stats.total_ns = loop_now_ns() - encode->started_ns;
    uint64_t host = encode->stats.decode_ns + encode->stats.read_ns;
    encode->stats.compute_ns = encode->stats.total_ns > host ? encode->stats.total_ns - host : 0;
    media_close(&media->run);
#if UFORM_WITH_FFMPEG
    audio_clips_free(media->clips);
#endif
    if (encode->failure == UFORM_OK && media->token_offsets)
        encode->encoded.token_vectors.rows = media->token_rows;
    encode_end(encode, media->call.outcome, encode->failure);
    uform_status_t status = encode->failure;
    char const *message = encode->message;
    /* call_finish ends the call; the state goes first, as nothing may touch it after. */
    call_t ending = media->call;
    free(media);
    call_finish(&ending, status, message);
}

/* Looks at the chunks in flight; a device fault stops the call. */
static void vram_media_sweep(vram_media_call_t *media) {
    vram_flights_sweep_encode(vram_media_devices(media), &media->encode, NULL, NULL);
}

static void vram_media_arm(vram_media_call_t *media) {
    if (media->polling) return;
    media->polling = true;
    loop_timer(media->call.executor->loop, &media->poll,
               vram_poll_ns(loop_now_ns() - media->encode.started_ns));
}

/* The run has ended: once no chunk is on a device, the call ends (by the poll, when one is armed: the
 * state is freed at the end, and an armed poll still holds it). */
static void vram_media_settle(vram_media_call_t *media) {
    vram_media_sweep(media);
    if (media->polling) return;
    if (vram_flights_busy(vram_media_devices(media), false)) {
        vram_media_arm(media);
        return;
    }
    vram_media_finish(media);
}

static void vram_media_poll(loop_op_t *op) {
    vram_media_call_t *media = container_of(op, vram_media_call_t, poll);
    media->polling = false;
    if (media->ended) {
        vram_media_settle(media);
        return;
    }
    vram_media_sweep(media);
    media_poke(&media->run);
}

static void vram_media_end(media_run_t *run) {
    vram_media_call_t *media = container_of(run, vram_media_call_t, run);
    media->ended = true;
    vram_media_settle(media);
}

/* The turn of `chunk` may start once chunk - 2 was copied in (its rows are this chunk's set) and the
 * chunk's device slot is free. */
static bool vram_media_ready(media_run_t *run, size_t chunk) {
    vram_media_call_t *media = container_of(run, vram_media_call_t, run);
    vram_t *vram = vram_media_devices(media);
    vram_media_sweep(media);
    vram_flight_t const *before = chunk >= 2 ? vram_flights_of(vram, chunk - 2) : NULL;
    if ((before && before->copying) || !vram_flights_free(vram)) {
        vram_media_arm(media);
        return false;
    }
    return true;
}

/* ---- Preparing items ---------------------------------------------------------------------------- */

/* The run's `decode` (media_read.h), on a thread of the host team. */
static void vram_media_decode(media_run_t *run, size_t item, float *rows, size_t thread) {
    vram_media_call_t *media = container_of(run, vram_media_call_t, run);
    uform_status_t status = media->encode.statuses[item]; /* a file that could not be read */
    if (status == UFORM_OK && media->kind != VRAM_UNITS_SOUNDS)
        status = image_source_patches(&media->source, &media->encode.tape, run, item, rows);
#if UFORM_WITH_FFMPEG
    if (status == UFORM_OK && media->kind == VRAM_UNITS_SOUNDS)
        status = audio_clips_prepare(media->clips, &media->encode.tape, run, thread, item, rows);
    if (status != UFORM_OK && media->clips) media->clips->patches[item] = 0;
#else
    (void)thread;
#endif
    if (status != UFORM_OK) media->encode.statuses[item] = status;
}

/* The patch rows of item `item` once prepared: 0 for a failed one. */
static size_t vram_media_item_patches(vram_media_call_t const *media, size_t item) {
    if (media->encode.statuses[item] != UFORM_OK) return 0;
#if UFORM_WITH_FFMPEG
    if (media->kind == VRAM_UNITS_SOUNDS) return media->clips->patches[item];
#endif
    return media->item_patches;
}

/* ---- A chunk on a device ------------------------------------------------------------------------ */

/* The device scratch of a chunk: the indices, the rows in F32 and BF16, their projection, the shadow of
 * the outputs (off the arena's device), then the pass. */
typedef struct chunk_scratch {
    int32_t *indices;
    float *rows;
    uint16_t *rows_bf16;
    float *patch_f32;
    void *views;
    void *head; /* the attention-pooling head's (vram_head_scratch), with pooling "head" */
    vram_pass_t pass;
} chunk_scratch_t;

static bool chunk_scratch(vram_media_call_t const *media, vram_device_t *device, size_t d,
                          vram_units_t const *units, size_t count, chunk_scratch_t *scratch) {
    vram_tower_t const *tower = vram_media_tower(media, d);
    size_t hidden = tower->hidden, width = media->encode.width, rows = count, tokens = units->vectors;
    if (media->kind == VRAM_UNITS_CLIPS) {
        rows = units->states; /* every frame of every clip */
        tokens = units->states;
        width = tower->dims > hidden ? tower->dims : hidden;
    }
    if (units->vectors > rows) rows = units->vectors;
    size_t const sizes[] = {
        units->bytes,
        units->patches * media->row_floats * sizeof(float),
        units->patches * media->row_floats * 2,
        units->patches * hidden * sizeof(float),
        d ? vram_views_bytes(&media->encode, count, tokens, hidden) : 0,
        tower->settings.pooling == UFORM_POOLING_HEAD ? vram_head_scratch(tower, units->tokens, units->units)
                                                      : 0,
    };
    void *parts[6];
    if (!vram_chunk_scratch(device, tower, sizes, 6, parts, units->tokens, rows, width, &scratch->pass))
        return false;
    scratch->indices = parts[0], scratch->rows = parts[1], scratch->rows_bf16 = parts[2];
    scratch->patch_f32 = parts[3], scratch->views = d ? parts[4] : NULL;
    scratch->head = parts[5];
    return true;
}

/* Packs the kept items' rows of a chunk end to end in place (moves only go backwards); answers their
 * patch counts in `patches` [count]. */
static void chunk_pack(vram_media_call_t const *media, size_t first, size_t count, float *rows,
                       size_t *patches) {
    size_t packed = 0, item_floats = media->item_patches * media->row_floats;
    for (size_t index = 0; index < count; ++index) {
        patches[index] = vram_media_item_patches(media, first + index);
        size_t floats = patches[index] * media->row_floats;
        if (floats) memmove(rows + packed, rows + index * item_floats, floats * sizeof(float));
        packed += floats;
    }
}

/* The copies of a chunk's indices and rows, then the rows to BF16, the patch GEMM and the tokens. */
static uform_status_t chunk_tokens(vram_media_call_t const *media, vram_device_t *device, vram_slot_t *slot,
                                   vram_tower_t const *tower, vram_units_t const *units,
                                   chunk_scratch_t const *scratch, float const *rows, char const **message) {
    cudaStream_t stream = device->stream;
    size_t floats = units->patches * media->row_floats;
    int32_t const *patch_offsets = scratch->indices;
    VRAM_TRY(cudaMemcpyAsync(scratch->indices, slot->staging, units->bytes, cudaMemcpyHostToDevice, stream),
             "cannot copy the chunk's indices to the device");
    VRAM_TRY(cudaMemcpyAsync(scratch->rows, rows, floats * sizeof(float), cudaMemcpyHostToDevice, stream),
             "cannot copy the chunk's patch rows to the device");
    VRAM_TRY(cudaEventRecord(slot->copied, stream), "cannot record an event");
    VRAM_TRY(cuda_f32_to_bf16(scratch->rows_bf16, scratch->rows, floats, stream),
             "cannot convert the patch rows");
    uform_status_t status =
        vram_patch_project(device, tower, scratch->rows_bf16, units->patches, scratch->patch_f32, message);
    if (status != UFORM_OK) return status;
    VRAM_TRY(cuda_assemble_leading(scratch->pass.x, scratch->patch_f32, tower->cls, tower->pos, patch_offsets,
                                   units->units, units->longest, media->leading, tower->hidden, stream),
             "cannot launch the token assembly");
    return UFORM_OK;
}

/* The chunk's outputs from the tower's final states, into its views. */
static uform_status_t chunk_outputs(vram_media_call_t const *media, vram_device_t *device,
                                    vram_tower_t const *tower, vram_units_t const *units,
                                    chunk_scratch_t const *scratch, vram_views_t const *views,
                                    char const **message) {
    int32_t const *state_rows = scratch->indices + 2 * (units->units + 1);
    float const *states = scratch->pass.x; /* what the state rows index */
    if (tower->settings.pooling == UFORM_POOLING_HEAD) {
        /* The head's pooled rows, each put at its unit's first token row of the patch projections' scratch
         * (free since the tokens were assembled; towers with the head have no leading token, so it holds a
         * row per token), where the state rows point. */
        int32_t const *token_offsets = scratch->indices + units->units + 1;
        float *pooled = NULL;
        uform_status_t status =
            vram_head_pool(device, tower, scratch->pass.x, units->tokens, token_offsets, units->units,
                           units->longest + media->leading, scratch->head, &pooled, message);
        if (status != UFORM_OK) return status;
        VRAM_TRY(cuda_scatter_rows(scratch->patch_f32, tower->hidden, pooled, tower->hidden, token_offsets,
                                   units->units, tower->hidden, device->stream),
                 "cannot place the pooled rows");
        states = scratch->patch_f32;
    }
    if (media->kind == VRAM_UNITS_CLIPS)
        return vram_output_clips(device, tower, &media->encode, views, states, &scratch->pass, state_rows,
                                 views->items, media->source.frames, message);
    vram_output_rows_t const rows = {
        .state_rows = state_rows,
        .state_source = states,
        .items = views->items,
        .token_rows = state_rows + units->states,
        .tokens = units->vectors,
        .gather_failed = "cannot gather the outputs' rows",
        .convert_failed = "cannot convert the outputs",
    };
    return vram_output_write(device, tower, &media->encode, views, scratch->pass.x, &scratch->pass, &rows,
                             message);
}

/* The views of a chunk of items [first, first + count): token vectors at the item's rows (images and
 * clips) or packed from token_offsets[first] (sounds). */
static vram_views_t chunk_views(vram_media_call_t const *media, chunk_scratch_t const *scratch,
                                vram_units_t const *units, size_t first, size_t count, size_t hidden) {
    size_t token_first = first * media->image_patches, tokens = units->vectors;
    if (media->kind == VRAM_UNITS_CLIPS) token_first = first * media->source.frames, tokens = units->states;
    if (media->kind == VRAM_UNITS_SOUNDS)
        token_first = media->token_offsets ? media->token_offsets[first] : 0;
    return vram_views_make(&media->encode, scratch->views, first, count, token_first, tokens, hidden);
}

/* Enqueues the chunk of items [first, last), its rows packed at `rows`, on its device and slot. */
static uform_status_t chunk_issue(vram_media_call_t *media, size_t first, size_t last, float *rows,
                                  size_t const *patches, char const **message) {
    vram_t *vram = vram_media_devices(media);
    size_t d, s, count = last - first;
    vram_place(vram->flights.issued, vram->count, &d, &s);
    vram_device_t *device = &vram->devices[d];
    vram_tower_t const *tower = vram_media_tower(media, d);
    vram_slot_t *slot = &device->slots[s];
    size_t frames = media->kind == VRAM_UNITS_CLIPS ? media->source.frames : 1;
    vram_units_t units =
        vram_units_plan(media->kind, patches, count, frames, media->image_patches, media->leading, NULL);
    if (vram_use(device) != UFORM_OK) return *message = "cannot use the device", UFORM_DEVICE;
    if (!vram_staging(slot, units.bytes))
        return *message = "cannot allocate pinned staging memory", UFORM_OUT_OF_MEMORY;
    vram_units_plan(media->kind, patches, count, frames, media->image_patches, media->leading, slot->staging);
    chunk_scratch_t scratch;
    if (!chunk_scratch(media, device, d, &units, count, &scratch))
        return *message = "cannot allocate device scratch", UFORM_OUT_OF_MEMORY;
    uform_status_t status = chunk_tokens(media, device, slot, tower, &units, &scratch, rows, message);
    if (status == UFORM_OK)
        status = vram_forward(device, tower, scratch.pass.x, units.tokens, scratch.indices + units.units + 1,
                              units.units, units.longest + media->leading, false, false, scratch.pass.forward,
                              message);
    vram_views_t views = chunk_views(media, &scratch, &units, first, count, tower->hidden);
    if (status == UFORM_OK) status = chunk_outputs(media, device, tower, &units, &scratch, &views, message);
    if (status == UFORM_OK) status = vram_views_land(vram, device, &views, message);
    if (status != UFORM_OK) return status;
    VRAM_TRY(cudaEventRecord(slot->done, device->stream), "cannot record an event");
    vram_flights_issue(vram, first, last);
    return UFORM_OK;
}

/* A chunk whose items all failed: nothing to compute (their rows are zero already), but its place in
 * the flights is taken, so that chunk k stays on slot vram_place(k). */
static uform_status_t chunk_skip(vram_media_call_t *media, size_t first, size_t last, char const **message) {
    vram_t *vram = vram_media_devices(media);
    size_t d, s;
    vram_place(vram->flights.issued, vram->count, &d, &s);
    vram_device_t *device = &vram->devices[d];
    if (vram_use(device) != UFORM_OK) return *message = "cannot use the device", UFORM_DEVICE;
    VRAM_TRY(cudaEventRecord(device->slots[s].copied, device->stream), "cannot record an event");
    VRAM_TRY(cudaEventRecord(device->slots[s].done, device->stream), "cannot record an event");
    vram_flights_issue(vram, first, last);
    return UFORM_OK;
}

/* The run's `chunk` (media_read.h): the decoded items [first, last), their rows at `rows`. */
static void vram_media_chunk(media_run_t *run, size_t first, size_t last, float *rows) {
    vram_media_call_t *media = container_of(run, vram_media_call_t, run);
    size_t patches[MEDIA_CHUNK_MAX], kept = 0;
    if (media->encode.failure != UFORM_OK) return;
    chunk_pack(media, first, last - first, rows, patches);
    for (size_t item = first; item < last; ++item) {
#if UFORM_WITH_FFMPEG
        media->encode.stats.truncated += media->clips && media->clips->truncated[item];
#endif
        kept += patches[item - first] != 0;
        if (!media->token_offsets) continue;
        media->token_offsets[item] = media->token_rows;
        media->token_rows += patches[item - first];
    }
    if (media->token_offsets) media->token_offsets[last] = media->token_rows;
    char const *message = NULL;
    uform_status_t status = kept ? chunk_issue(media, first, last, rows, patches, &message)
                                 : chunk_skip(media, first, last, &message);
    if (status != UFORM_OK) encode_stop(&media->encode, status, message);
}

/* ---- The plan of a chunk's units ---------------------------------------------------------------- */

vram_units_t vram_units_plan(vram_units_kind_t kind, size_t const *patches, size_t count, size_t frames,
                             size_t image_patches, size_t leading, void *base) {
    size_t per_item = kind == VRAM_UNITS_CLIPS ? frames : 1;
    vram_units_t units = {.states = count * per_item};
    for (size_t i = 0; i < count; ++i) {
        if (!patches[i]) continue;
        units.units += per_item;
        units.patches += patches[i];
        if (patches[i] / per_item > units.longest) units.longest = patches[i] / per_item;
    }
    units.tokens = units.patches + units.units * leading;
    units.vectors = kind == VRAM_UNITS_IMAGES   ? count * image_patches
                    : kind == VRAM_UNITS_SOUNDS ? units.patches
                                                : 0;
    units.bytes = (2 * (units.units + 1) + units.states + units.vectors) * sizeof(int32_t);
    if (!base) return units;
    int32_t *patch_offsets = base, *token_offsets = patch_offsets + units.units + 1;
    int32_t *state_rows = token_offsets + units.units + 1, *token_rows = state_rows + units.states;
    size_t unit = 0, at = 0, vector = 0;
    for (size_t i = 0; i < count; ++i)
        for (size_t f = 0; f < per_item; ++f) {
            size_t unit_patches = patches[i] / per_item;
            int32_t row = patches[i] ? (int32_t)(at + unit * leading) : -1; /* the unit's class token in x */
            if (patches[i]) {
                patch_offsets[unit] = (int32_t)at;
                token_offsets[unit++] = row;
                at += unit_patches;
            }
            state_rows[i * per_item + f] = row;
            size_t vectors = kind == VRAM_UNITS_IMAGES   ? image_patches
                             : kind == VRAM_UNITS_SOUNDS ? unit_patches
                                                         : 0;
            for (size_t p = 0; p < vectors; ++p)
                token_rows[vector++] = row < 0 ? -1 : row + (int32_t)(leading + p);
        }
    patch_offsets[unit] = (int32_t)at;
    token_offsets[unit] = (int32_t)(at + unit * leading);
    return units;
}

/* ---- The start ---------------------------------------------------------------------------------- */

/* Every output in the arena, zeroed: statuses, embeddings, states, and token vectors, per item for images
 * and clips, with room for every sound's most. */
static bool vram_media_outputs(vram_media_call_t *media, size_t hidden) {
    encode_call_t *encode = &media->encode;
    size_t items = encode->tape.count;
    size_t per_item = media->kind == VRAM_UNITS_CLIPS ? media->source.frames : media->image_patches;
    size_t rows = items * per_item;
    if (!encode_outputs(encode, items, hidden, vram_output_view_zeroed)) return false;
    if (!(encode->outputs & UFORM_OUTPUT_TOKEN_VECTORS)) return true;
#if UFORM_WITH_FFMPEG
    if (media->kind == VRAM_UNITS_SOUNDS)
        return audio_clips_rows(media->clips, &encode->tape, &rows) &&
               (media->token_offsets = encode_token_vectors(encode, items, rows, 0, vram_output_view_zeroed));
#endif
    return encode_token_vectors(encode, items, rows, per_item, vram_output_view_zeroed);
}

/* The run: chunks of about MEDIA_CHUNK_TOKENS tokens of items at their most, decoded on `workers`. */
static void vram_media_run(vram_media_call_t *media, uform_executor_t *workers) {
    size_t units = media->kind == VRAM_UNITS_CLIPS ? media->source.frames : 1;
    size_t item_tokens = media->item_patches + units, chunk_items = MEDIA_CHUNK_TOKENS / item_tokens;
    if (chunk_items < 1) chunk_items = 1;
    if (chunk_items > MEDIA_CHUNK_MAX) chunk_items = MEDIA_CHUNK_MAX;
    bool files = media->kind == VRAM_UNITS_SOUNDS ? media->audio_input == AUDIO_INPUT_FILES
                                                  : media->source.input == IMAGE_INPUT_FILES;
    size_t max_bytes = media->kind == VRAM_UNITS_SOUNDS  ? UFORM_AUDIO_MAX_BYTES
                       : media->kind == VRAM_UNITS_CLIPS ? UFORM_VIDEO_MAX_BYTES
                                                         : UFORM_IMAGE_MAX_BYTES;
    media->run = (media_run_t){
        .call = &media->call,
        .encode = &media->encode,
        .files = files,
        .max_bytes = max_bytes,
        .chunk_items = chunk_items,
        .item_floats = media->item_patches * media->row_floats,
        .decode = vram_media_decode,
        .chunk = vram_media_chunk,
        .end = vram_media_end,
        .workers = workers,
        .ready = vram_media_ready,
    };
}

/* The clips of sounds, the outputs and the run's rows; a failure stops the call. */
static void vram_media_prepare(vram_media_call_t *media) {
    encode_call_t *encode = &media->encode;
    uform_model_info_t const *info = &encode->model->header.info;
    bool sounds = media->kind == VRAM_UNITS_SOUNDS;
    size_t hidden = sounds ? info->audio.transformer.hidden : info->image.transformer.hidden;
#if UFORM_WITH_FFMPEG
    if (sounds && !(media->clips = audio_clips_new(media->audio_input, media->rate, info, encode->tape.count,
                                                   media->run.workers->threads))) {
        encode_stop(encode, UFORM_OUT_OF_MEMORY, "cannot allocate the front end");
        return;
    }
#endif
    if (!vram_media_outputs(media, hidden) || cudaDeviceSynchronize() != cudaSuccess) {
        cudaGetLastError();
        encode_stop(encode, UFORM_OUT_OF_MEMORY, "cannot allocate the outputs in the arena");
    } else if (!media_open(&media->run)) {
        encode_stop(encode, UFORM_OUT_OF_MEMORY, "cannot allocate the patch rows and read buffers");
    }
}

/* The items and, for what is not read from files, the bytes of the call, in its stats. */
static void vram_media_stats(vram_media_call_t *media) {
    encode_call_t *encode = &media->encode;
    size_t items = encode->tape.count, span = encode->tape.offsets[items] - encode->tape.offsets[0];
    encode->stats.items = items;
    if (media->run.files) return; /* counted as they are read */
    bool samples = media->kind == VRAM_UNITS_SOUNDS && media->audio_input == AUDIO_INPUT_SAMPLES;
    encode->stats.bytes = samples ? span * sizeof(float) : span;
}

static void vram_media_turn(loop_op_t *op) {
    media_turn(&container_of(op, vram_media_call_t, call.op)->run);
}

static void vram_media_start(call_t *call) {
    vram_media_call_t *media = container_of(call, vram_media_call_t, call);
    vram_t *vram = vram_of(call->executor);
    char const *message = NULL;
    media->poll.callback = vram_media_poll;
    call->op.callback = vram_media_turn;
    vram_flights_start(vram);
    uform_executor_t *workers = vram_workers(call->executor, &message);
    vram_media_run(media, workers);
    vram_media_stats(media);
    if (!workers)
        encode_stop(&media->encode, UFORM_OUT_OF_MEMORY, message);
    else if (vram_use(&vram->devices[0]) != UFORM_OK)
        encode_stop(&media->encode, UFORM_DEVICE, "cannot use the device");
    else
        vram_media_prepare(media);
    media_start(&media->run);
}

/* ---- The verbs ---------------------------------------------------------------------------------- */

/* The call's state from its request (an image request, or an audio one), on the calling thread. */
static void vram_media_fill(call_t *call, void const *context) {
    vram_media_call_t *media = container_of(call, vram_media_call_t, call);
    uform_model_info_t const *info = NULL;
    if (media->kind == VRAM_UNITS_SOUNDS) {
        audio_request_t const *request = context;
        encode_call_init(&media->encode, &request->encode);
        media->audio_input = request->input;
        media->rate = request->rate;
        info = &request->encode.model->header.info;
        media->row_floats = info->audio.patch_frames * info->audio.mels;
        media->item_patches = info->audio.max_patches;
        media->leading = 1 + info->audio.transformer.registers;
        return;
    }
    image_request_t const *request = context;
    encode_call_init(&media->encode, &request->encode);
    media->source = image_source_of(request);
    info = &request->encode.model->header.info;
    media->row_floats = 3 * info->image.patch * info->image.patch;
    media->image_patches = media->source.patches;
    media->item_patches = media->source.frames * media->source.patches;
    media->leading = info->image.transformer.class_token + info->image.transformer.registers;
}

uform_status_t vram_media_encode(char const *entry, image_request_t const *images,
                                 audio_request_t const *sounds) {
    encode_request_t const *encode = images ? &images->encode : &sounds->encode;
    if (sounds && !UFORM_WITH_FFMPEG)
        return call_refuse(encode->outcome, UFORM_UNSUPPORTED, entry,
                           "built without FFmpeg: sounds cannot be decoded, resampled or transformed");
    vram_media_call_t *media = calloc(1, sizeof *media);
    if (!media) return call_refuse(encode->outcome, UFORM_OUT_OF_MEMORY, entry, "cannot allocate the call");
    media->kind = sounds ? VRAM_UNITS_SOUNDS : images->video ? VRAM_UNITS_CLIPS : VRAM_UNITS_IMAGES;
    void const *context = images ? (void const *)images : (void const *)sounds;
    call_plan_t plan = encode_plan(entry, encode, sizeof *media, vram_media_start, vram_media_fill, context);
    plan.state = &media->call; /* freed by call_run if the call cannot open, else by vram_media_finish */
    return call_run(&plan);
}

#endif /* UFORM_WITH_CUDA */
