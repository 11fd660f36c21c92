/* The image tower's verbs on host executors: image_encode (files, or encoded images in memory) and
 * image_encode_pixels, behind their front doors (src/encode/verbs.c); the call they open also runs
 * video_encode (src/encode/video.c: clips through the same tower, one image per sampled frame).
 *
 * A call encodes its items in chunks of whole items (about IMAGE_CHUNK_TOKENS tokens, at least as
 * many items as the executor has threads, at most IMAGE_CHUNK_MAX), one chunk per loop turn. An item is
 * one image, or a clip of `frames` images:
 *
 *   read     (files only) open -> statx -> read through the ring for every item of chunk k + 2,
 *            issued while chunk k is computed, so that the kernel reads meanwhile (src/encode/media_read.h
 *            runs the chunks, reads the files and schedules the decoding);
 *   decode   the chunk's items decoded (JPEG, PNG; clips through video_decode.h), resized, cropped,
 *            normalized and patchified: on a RAM executor of 2 threads or more, by one lent worker
 *            while the previous chunk is computed on the others (each item posted to the loop as a
 *            completion); otherwise, and for the first chunk, on the chunk's turn in parallel over the
 *            executor's threads, each thread taking the next item from a shared counter;
 *   compute  the patch GEMM, class token and positions, the tower (bidirectional, no rotary) over every
 *            image of the chunk, the projections, and the outputs in the arena (for clips, the pooling
 *            of their frames' embeddings and states).
 *
 * An item that fails (unreadable, malformed, past the limits of image_decode.h or video_decode.h) keeps
 * its status in `statuses` and zero rows, and takes no part in the tower. The others are encoded as if
 * alone: images never attend to each other, and every GEMM row is computed by the same code whatever the
 * batch. */
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "call.h"
#include "image.h"
#include "image_decode.h"
#include "kernels.h"
#include "model.h"
#include "patches.h"
#include "video_decode.h"

#define IMAGE_CHUNK_TOKENS 2048
#define IMAGE_CHUNK_MAX    64
#define VIDEO_CHUNK_TOKENS 32768 /* a chunk of clips grows to one per thread only up to this */

_Static_assert(sizeof(image_call_t) <= EXECUTOR_CALL_STORAGE, "image_call_t outgrew the call storage");

/* ---- The end ------------------------------------------------------------------------------------ */

static void image_end(media_run_t *run) {
    image_call_t *image = container_of(run, image_call_t, run);
    image->encode.stats.total_ns = loop_now_ns() - image->encode.started_ns;
    media_close(&image->run);
    encode_end(&image->encode, image->call.outcome, image->encode.failure);
    call_finish(&image->call, image->encode.failure, image->encode.message);
}

/* ---- Decoding ----------------------------------------------------------------------------------- */

_Static_assert((int)UFORM_RESIZE_SQUARE == (int)IMAGE_RESIZE_SQUARE &&
                   (int)UFORM_RESIZE_SHORT_SIDE_ROUND_CROP == (int)IMAGE_RESIZE_SHORT_SIDE_ROUND_CROP &&
                   (int)UFORM_RESAMPLE_PILLOW_BICUBIC == (int)IMAGE_RESAMPLE_PILLOW_BICUBIC &&
                   (int)UFORM_RESAMPLE_PILLOW_BILINEAR == (int)IMAGE_RESAMPLE_PILLOW_BILINEAR,
               "the public resize and resample values are the front end's");

image_source_t image_source_of(image_request_t const *request) {
    uform_model_info_t const *info = &request->encode.model->header.info;
    size_t side = info->image.size / info->image.patch;
    return (image_source_t){
        .input = request->input,
        .heights = request->heights,
        .widths = request->widths,
        .geometry = {.size = info->image.size,
                     .patch = info->image.patch,
                     .mean = {info->image.mean[0], info->image.mean[1], info->image.mean[2]},
                     .std = {info->image.std[0], info->image.std[1], info->image.std[2]},
                     .resize = (image_resize_t)info->image.resize,
                     .resample = (image_resample_t)info->image.resample},
        .video = request->video,
        .frames = request->video ? info->video.frames : 1,
        .patches = side * side,
    };
}

uform_status_t image_source_patches(image_source_t const *source, uform_tape_t const *tape,
                                    media_run_t const *run, size_t item, float *patches) {
    size_t begin = tape->offsets[item], span = tape->offsets[item + 1] - begin;
    uint8_t const *bytes = span ? (uint8_t const *)tape->data + begin : NULL;
    if (source->input == IMAGE_INPUT_PIXELS) {
        size_t height = source->heights[item], width = source->widths[item], expected = 0;
        if (height == 0 || width == 0 || __builtin_mul_overflow(height, width, &expected) ||
            __builtin_mul_overflow(expected, 3, &expected) || expected != span)
            return UFORM_INVALID_ARGUMENT;
        return image_preprocess(bytes, height, width, width * 3, &source->geometry, patches);
    }
    if (source->input == IMAGE_INPUT_FILES) bytes = media_file(run, item, &span);
    return media_patches(bytes, span, &source->geometry, source->video ? source->frames : 0, patches);
}

/* The run's `decode` (media_read.h), on any executor thread: a failed item's rows are zero, for the
 * patch GEMM runs over every item of the chunk. [frames, patches, 3 patch^2] */
static void image_decode_item(media_run_t *run, size_t item, float *patches, size_t thread) {
    (void)thread;
    image_call_t *image = container_of(run, image_call_t, run);
    uform_status_t status = image->encode.statuses[item]; /* a file that could not be read */
    if (status == UFORM_OK)
        status = image_source_patches(&image->source, &image->encode.tape, &image->run, item, patches);
    if (status != UFORM_OK) {
        image->encode.statuses[item] = status;
        memset(patches, 0, run->item_floats * sizeof(float));
    }
}

/* ---- Compute ------------------------------------------------------------------------------------ */

/* The chunk's scratch, for `count` items of `frames` images (pooled: a clip's means, [max(dims, hidden)]);
 * its patch rows live in the run (media_read.h), so none here. */
static bool image_scratch(image_call_t *image, size_t count, patch_scratch_t *scratch) {
    tower_t const *tower = image->encode.model->image;
    size_t images = count * image->source.frames;
    size_t pooled = tower->dims > tower->hidden ? tower->dims : tower->hidden;
    return tower_patches_scratch(tower, image->call.executor, images, images * image->source.patches, 0,
                                 pooled, scratch);
}

/* Projects `kept * per_item` rows of final states, normalizes them at the output width (where the model's
 * family or the config asks for unit vectors: encode_call_t.normalize), and writes
 * row r of kept item q to row items[q] * per_item + r of `view`. */
static void image_project(image_call_t *image, patch_scratch_t const *scratch, size_t kept, size_t per_item,
                          uform_view_t *view) {
    tower_t const *tower = image->encode.model->image;
    size_t count = kept * per_item;
    if (count == 0) return;
    tower_project(tower, image->call.executor, scratch->rows, tower->hidden, count, image->encode.width,
                  scratch->projected, image->encode.width);
    uint64_t converting = loop_now_ns();
    for (size_t q = 0; q < kept; ++q)
        for (size_t r = 0; r < per_item; ++r) {
            float *values = scratch->projected + (q * per_item + r) * image->encode.width;
            if (image->encode.normalize) tower->kernels->normalize(values, image->encode.width);
            output_row(tower->kernels, view, scratch->items[q] * per_item + r, values);
        }
    image->encode.stats.convert_ns += loop_now_ns() - converting;
}

/* Images: the class token's state is the item's; its projection the embedding; the patches' projections
 * its token vectors. `kept` images, one per item. */
static void image_rows(image_call_t *image, patch_scratch_t const *scratch, size_t kept) {
    tower_t const *tower = image->encode.model->image;
    size_t const hidden = tower->hidden, patches = image->source.patches;
    uform_encoded_t *encoded = &image->encode.encoded;
    for (size_t q = 0; q < kept; ++q) /* the pooled states, in scratch->rows (tower_patches_pool) */
        if (image->encode.outputs & UFORM_OUTPUT_STATES)
            output_row(tower->kernels, &encoded->states, scratch->items[q], scratch->rows + q * hidden);
    if (image->encode.outputs & UFORM_OUTPUT_EMBEDDINGS)
        image_project(image, scratch, kept, 1, &encoded->embeddings);
    if (image->encode.outputs & UFORM_OUTPUT_TOKEN_VECTORS) {
        for (size_t q = 0; q < kept; ++q)
            memcpy(scratch->rows + q * patches * hidden,
                   scratch->x + (scratch->offsets[q] + tower->patches.leading) * hidden,
                   patches * hidden * sizeof(float));
        image_project(image, scratch, kept, patches, &encoded->token_vectors);
    }
}

/* Encodes the decoded items [first, last) of one chunk, their patch rows at `decoded` [count, frames,
 * patches, 3 patch^2]: every image of every item through the tower together. */
static void image_chunk(media_run_t *run, size_t first, size_t last, float *decoded) {
    image_call_t *image = container_of(run, image_call_t, run);
    tower_t const *tower = image->encode.model->image;
    uform_executor_t *executor = image->call.executor;
    size_t const hidden = tower->hidden, patches = image->source.patches,
                 tokens_per_image = tower->patches.leading + patches;
    size_t const row_floats = 3 * image->source.geometry.patch * image->source.geometry.patch,
                 frames = image->source.frames;
    size_t const count = last - first;
    uint64_t computing = loop_now_ns();
    patch_scratch_t scratch;
    if (!image_scratch(image, count, &scratch)) {
        encode_stop(&image->encode, UFORM_OUT_OF_MEMORY, "cannot allocate the executor's scratch");
        return;
    }

    /* Patch embeddings of every image, failed items' included (their rows are zero). [rows, hidden] */
    tower_patches_t const *patch_layer = &tower->patches; /* prepared with the model */
    tower_linear(tower, executor, &patch_layer->patch, decoded, row_floats, count * frames * patches, hidden,
                 scratch.rows, hidden);

    /* x: per image of a decoded item, the class token, then its patches, each plus its position.
     * [tokens, hidden] */
    size_t kept = 0, row = 0;
    for (size_t index = 0; index < count; ++index) {
        if (image->encode.statuses[first + index] != UFORM_OK) continue;
        for (size_t frame = 0; frame < frames; ++frame) {
            size_t source = index * frames + frame;
            scratch.items[kept] = first + index;
            scratch.offsets[kept++] = row;
            tower_patches_tokens(patch_layer, hidden, scratch.rows + source * patches * hidden, patches,
                                 scratch.x + row * hidden);
            row += tokens_per_image;
        }
    }
    scratch.offsets[kept] = row;
    tower_patches_forward(tower, executor, &scratch, row, kept);
    tower_patches_pool(tower, executor, &scratch, row, kept);

    image->rows(image, &scratch, kept);
    uform_encoded_t *encoded = &image->encode.encoded;
    for (size_t item = first; item < last; ++item) {
        if (image->encode.statuses[item] == UFORM_OK) continue;
        output_zero(&encoded->embeddings, item, 1);
        output_zero(&encoded->states, item, 1);
        output_zero(&encoded->token_vectors, item * image->vectors, image->vectors);
    }
    image->encode.stats.compute_ns += loop_now_ns() - computing;
}

/* ---- The start ---------------------------------------------------------------------------------- */

/* One chunk per loop turn (media_read.h). */
static void image_turn(loop_op_t *op) {
    media_turn(&container_of(op, image_call_t, call.op)->run);
}

/* Every output in the arena: statuses, embeddings, states, and token vectors grouped per item. */
static bool image_outputs(image_call_t *image) {
    size_t items = image->encode.tape.count;
    if (!encode_outputs(&image->encode, items, image->encode.model->image->hidden, output_view)) return false;
    return !(image->encode.outputs & UFORM_OUTPUT_TOKEN_VECTORS) ||
           encode_token_vectors(&image->encode, items, items * image->vectors, image->vectors, output_view);
}

static void image_start(call_t *call) {
    image_call_t *image = container_of(call, image_call_t, call);
    size_t items = image->encode.tape.count;
    image->encode.stats.items = items;
    if (image->source.input != IMAGE_INPUT_FILES)
        image->encode.stats.bytes = image->encode.tape.offsets[items] - image->encode.tape.offsets[0];

    /* Chunks: about IMAGE_CHUNK_TOKENS tokens, at least one item per thread (for clips, only while that
     * stays within VIDEO_CHUNK_TOKENS), at most the batch. */
    size_t item_tokens = image->source.frames * (1 + image->source.patches),
           threads = call->executor->threads;
    if (image->source.video && threads > VIDEO_CHUNK_TOKENS / item_tokens)
        threads = VIDEO_CHUNK_TOKENS / item_tokens;
    size_t chunk_items = IMAGE_CHUNK_TOKENS / item_tokens;
    if (chunk_items < threads) chunk_items = threads;
    if (chunk_items > IMAGE_CHUNK_MAX) chunk_items = IMAGE_CHUNK_MAX;
    image->call.op.callback = image_turn;
    image->run = (media_run_t){
        .call = call,
        .encode = &image->encode,
        .files = image->source.input == IMAGE_INPUT_FILES,
        .max_bytes = image->source.video ? UFORM_VIDEO_MAX_BYTES : UFORM_IMAGE_MAX_BYTES,
        .chunk_items = chunk_items,
        .item_floats = image->source.frames * image->source.patches * 3 * image->source.geometry.patch *
                       image->source.geometry.patch,
        .decode = image_decode_item,
        .chunk = image_chunk,
        .end = image_end,
    };

    if (!image_outputs(image)) {
        encode_stop(&image->encode, UFORM_OUT_OF_MEMORY, "cannot allocate the outputs in the arena");
    } else if (!media_open(&image->run)) {
        encode_stop(&image->encode, UFORM_OUT_OF_MEMORY, "cannot allocate the patch rows and read buffers");
    }
    media_start(&image->run);
}

/* ---- The verbs ---------------------------------------------------------------------------------- */

/* The call's state from its image request, on the calling thread. */
static void image_fill(call_t *call, void const *context) {
    image_request_t const *request = context;
    image_call_t *image = container_of(call, image_call_t, call);
    encode_call_init(&image->encode, &request->encode);
    image->source = image_source_of(request);
    image->rows = request->video ? clip_rows : image_rows;
    image->vectors = request->video ? image->source.frames : image->source.patches;
}

uform_status_t image_encode_host(char const *entry, image_request_t const *request) {
    encode_request_t const *encode = &request->encode;
    if (!encode->model->image) /* a model whose image tower is not prepared on the host */
        return call_refuse(encode->outcome, UFORM_UNSUPPORTED, entry,
                           "the model's image tower is not on the host");
    return encode_run(entry, encode, sizeof(image_call_t), image_start, image_fill, request);
}
