/* The image tower's verbs on a VRAM executor: image_encode_pixels, and image_encode of encoded images
 * in memory.
 *
 * The host (the executor's one thread) checks each item, decodes encoded ones (JPEG, PNG: src/image_
 * decode.h), and copies each chunk's RGB8 pixels into a pinned staging slot; the device does the rest:
 * resize, crop and normalize into BF16 patch rows (kernels/cuda/cuda_image.h, the host's convention),
 * the patch GEMM, class token and positions, the tower (bidirectional, no rotary), the projections and
 * the outputs, written into the device arena. Two slots: the host fills one while the device runs the
 * other. A chunk is a run of consecutive good items (at most VRAM_IMAGE_CHUNK, or VRAM_IMAGE_BYTES of
 * pixels unless one image alone is larger); failed items keep their status and zero rows, as on host
 * executors. Files (UFORM_SOURCE_FILES) are not read on VRAM executors: they answer UNSUPPORTED. */
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "call.h"
#include "model.h"
#include "image_decode.h"
#include "vram.h"

#if UFORM_WITH_CUDA
#include "cuda/cuda_image.h"

#define VRAM_IMAGE_CHUNK 256
#define VRAM_IMAGE_BYTES ((size_t)256 << 20)

typedef struct vram_image_call {
    call_t call;
    encode_call_t encode;
    image_request_t request;
    size_t patches; /* per image */
    size_t next_item, done_items, next_slot;
    struct {
        size_t first, last;
        bool busy;
    } chunks[VRAM_SLOTS];
    image_rgb_t decoded[VRAM_IMAGE_CHUNK]; /* the current run's decoded images (memory source) */
    image_rgb_t run[VRAM_IMAGE_CHUNK];     /* the current run's pixels */
    loop_op_t poll;
} vram_image_call_t;

/* The call's state is larger than the executor's call storage (the decoded images): it is allocated,
 * its call first (call_run's own state). */

static void image_end(vram_image_call_t *image) {
    image->encode.stats.total_ns = loop_now_ns() - image->encode.started_ns;
    image->encode.stats.compute_ns = image->encode.stats.total_ns - image->encode.stats.decode_ns;
    encode_end(&image->encode, image->call.outcome, image->encode.failure);
    for (size_t i = 0; i < VRAM_IMAGE_CHUNK; ++i)
        free(image->decoded[i].pixels);
    uform_status_t status = image->encode.failure;
    char const *message = image->encode.message;
    /* call_finish ends the call; the state goes first, as nothing may touch it after. */
    call_t ending = image->call;
    free(image);
    call_finish(&ending, status, message);
}

/* The pixels of item `item` (decoding it for the memory source), or a status for it. */
static uform_status_t image_pixels(vram_image_call_t *image, size_t item, size_t slot_index,
                                   image_rgb_t *rgb) {
    image_request_t const *request = &image->request;
    uform_tape_t const *tape = &request->encode.tape;
    uint8_t const *data = (uint8_t const *)tape->data + tape->offsets[item];
    size_t size = tape->offsets[item + 1] - tape->offsets[item];
    if (request->input == IMAGE_INPUT_PIXELS) {
        size_t height = request->heights[item], width = request->widths[item], pixels = 0, bytes = 0;
        if (height == 0 || width == 0 || __builtin_mul_overflow(height, width, &pixels) ||
            pixels > UFORM_IMAGE_MAX_PIXELS || height > INT32_MAX || width > INT32_MAX ||
            __builtin_mul_overflow(pixels, (size_t)3, &bytes) || bytes != size)
            return UFORM_INVALID_ARGUMENT;
        *rgb = (image_rgb_t){.pixels = (uint8_t *)data, .height = height, .width = width};
        return UFORM_OK;
    }
    uint64_t decoding = loop_now_ns();
    image_rgb_t *decoded = &image->decoded[slot_index];
    free(decoded->pixels);
    memset(decoded, 0, sizeof *decoded);
    uform_status_t status = image_decode(data, size, decoded);
    image->encode.stats.decode_ns += loop_now_ns() - decoding;
    if (status != UFORM_OK) return status;
    if (decoded->height > INT32_MAX || decoded->width > INT32_MAX) return UFORM_FORMAT;
    *rgb = *decoded;
    return UFORM_OK;
}

/* Finds the next chunk from `next_item`: skips failed items (recording their statuses) and gathers a
 * run of good ones. Answers the run [*first, *last) (empty when none is left). */
static void image_next_run(vram_image_call_t *image, size_t *first, size_t *last) {
    size_t items = image->request.encode.tape.count, bytes = 0;
    *first = *last = image->next_item;
    for (size_t item = image->next_item; item < items && *last - *first < VRAM_IMAGE_CHUNK; ++item) {
        image_rgb_t rgb;
        uform_status_t status = image_pixels(image, item, item - *first, &rgb);
        if (status == UFORM_OK) image->run[item - *first] = rgb;
        if (status != UFORM_OK) {
            image->encode.statuses[item] = status;
            if (*last == *first) {
                *first = *last = item + 1; /* nothing gathered yet: skip it */
                continue;
            }
            break; /* the run ends; this item is checked again (and fails again) by the next one */
        }
        size_t size = rgb.height * rgb.width * 3;
        if (*last > *first && bytes + size > VRAM_IMAGE_BYTES) break;
        bytes += size;
        *last = item + 1;
    }
}

static uform_status_t image_issue(vram_image_call_t *image, size_t s, size_t first, size_t last,
                                  char const **message) {
    vram_device_t *device = &vram_of(image->call.executor)->devices[0];
    vram_tower_t const *tower = &image->encode.model->device->replicas[0].image;
    uform_model_info_t const *info = &image->encode.model->header.info;
    size_t items = last - first, patches = image->patches, hidden = tower->hidden;
    size_t size = info->image.size, patch = info->image.patch, inputs = 3 * patch * patch;
    size_t tokens = items * (patches + 1);

    /* Host staging: pixel offsets int64 [items], heights and widths int32 [items], token offsets
     * int32 [items + 1], patch offsets int32 [items + 1], class rows int32 [items], patch rows int32
     * [items * patches], then the pixels. */
    size_t pixel_bytes = 0, taps = 1;
    image_rgb_t const *rgbs = image->run;
    for (size_t item = first; item < last; ++item) {
        pixel_bytes += rgbs[item - first].height * rgbs[item - first].width * 3;
        size_t height = rgbs[item - first].height, width = rgbs[item - first].width;
        size_t out_height = height < width ? size : height * size / width;
        size_t out_width = width < height ? size : width * size / height;
        size_t a = cuda_image_taps(height, out_height), b = cuda_image_taps(width, out_width);
        taps = a > taps ? a : taps;
        taps = b > taps ? b : taps;
    }
    size_t index_bytes =
        round_up_256(items * 8 + items * 4 * 2 + (items + 1) * 4 * 2 + items * 4 + items * patches * 4);
    vram_slot_t *slot = &device->slots[s];
    char *staging = vram_staging(slot, index_bytes + pixel_bytes);
    if (!staging) return *message = "cannot allocate pinned staging memory", UFORM_OUT_OF_MEMORY;
    int64_t *pixel_offsets = (int64_t *)staging;
    int32_t *heights = (int32_t *)(pixel_offsets + items), *widths = heights + items;
    int32_t *token_offsets = widths + items, *patch_offsets = token_offsets + items + 1;
    int32_t *class_rows = patch_offsets + items + 1, *patch_rows = class_rows + items;
    size_t at = 0;
    for (size_t i = 0; i < items; ++i) {
        pixel_offsets[i] = (int64_t)at;
        heights[i] = (int32_t)rgbs[i].height;
        widths[i] = (int32_t)rgbs[i].width;
        memcpy(staging + index_bytes + at, rgbs[i].pixels, rgbs[i].height * rgbs[i].width * 3);
        at += rgbs[i].height * rgbs[i].width * 3;
        token_offsets[i] = (int32_t)(i * (patches + 1));
        patch_offsets[i] = (int32_t)(i * patches);
        class_rows[i] = (int32_t)(i * (patches + 1));
        for (size_t p = 0; p < patches; ++p)
            patch_rows[i * patches + p] = (int32_t)(i * (patches + 1) + 1 + p);
    }
    token_offsets[items] = (int32_t)tokens;
    patch_offsets[items] = (int32_t)(items * patches);

    /* Device scratch: the staged bytes, the axes, patch rows BF16 [items * patches, inputs], their
     * projection F32 [items * patches, hidden], x F32 [tokens, hidden], the forward's, gathered rows
     * F32 and BF16 [rows, hidden], projections [rows, width]. */
    size_t rows = items * patches;
    size_t const sizes[] = {
        index_bytes + pixel_bytes,
        cuda_image_axes_bytes(items, size, taps),
        rows * inputs * 2,
        rows * hidden * sizeof(float),
    };
    void *parts[4];
    vram_pass_t pass;
    if (!vram_chunk_scratch(device, tower, sizes, 4, parts, tokens, rows, image->encode.width, &pass))
        return *message = "cannot allocate device scratch", UFORM_OUT_OF_MEMORY;
    char *staged = parts[0];
    void *axes = parts[1];
    uint16_t *patch_bf16 = parts[2];
    float *patch_f32 = parts[3];
    float *x = pass.x;
    int64_t const *device_pixel_offsets = (int64_t const *)staged;
    int32_t const *device_heights = (int32_t const *)(device_pixel_offsets + items);
    int32_t const *device_widths = device_heights + items, *device_tokens = device_widths + items;
    int32_t const *device_patches = device_tokens + items + 1, *device_classes = device_patches + items + 1;
    int32_t const *device_patch_rows = device_classes + items;
    cudaStream_t stream = device->stream;

    VRAM_TRY(cudaMemcpyAsync(staged, staging, index_bytes + pixel_bytes, cudaMemcpyHostToDevice, stream),
             "cannot copy the chunk to the device");
    cuda_image_geometry_t geometry = {.size = (int32_t)size, .patch = (int32_t)patch};
    for (size_t c = 0; c < 3; ++c)
        geometry.mean[c] = info->image.mean[c], geometry.std[c] = info->image.std[c];
    VRAM_TRY(cuda_image_patches(patch_bf16, (uint8_t const *)staged + index_bytes, device_pixel_offsets,
                                device_heights, device_widths, items, geometry, axes, taps, stream),
             "cannot launch the image front end");
    cuda_linear_t job = {.m = rows,
                         .n = hidden,
                         .k = inputs,
                         .x = patch_bf16,
                         .x_stride = inputs,
                         .w = tower->patch.w,
                         .bias = tower->patch.bias,
                         .y = patch_f32,
                         .y_stride = hidden,
                         .kind = CUDA_LINEAR_F32};
    VRAM_TRY(cuda_linear(device->gemm, &job, message), "cannot run the patch projection");
    VRAM_TRY(cuda_assemble_tokens(x, patch_f32, tower->cls, tower->pos, device_patches, items, patches,
                                  hidden, stream),
             "cannot launch the token assembly");
    uform_status_t status = vram_forward(device, tower, x, tokens, device_tokens, items, patches + 1, false,
                                         false, pass.forward, message);
    if (status != UFORM_OK) return status;

    vram_output_rows_t const output = {
        .state_rows = device_classes,
        .items = items,
        .first = first,
        .token_rows = device_patch_rows,
        .tokens = rows,
        .token_first = first * patches,
        .gather_failed = "cannot gather",
        .convert_failed = "cannot convert",
    };
    if ((status = vram_output_write(device, tower, &image->encode, x, &pass, &output, message)) != UFORM_OK)
        return status;
    VRAM_TRY(cudaEventRecord(slot->done, stream), "cannot record an event");
    return UFORM_OK;
}

static void image_advance(vram_image_call_t *image) {
    vram_device_t *device = &vram_of(image->call.executor)->devices[0];
    size_t items = image->request.encode.tape.count;
    for (size_t s = 0; s < VRAM_SLOTS; ++s) {
        if (!image->chunks[s].busy) continue;
        bool done = false;
        if (vram_event_done(device->slots[s].done, &done) != UFORM_OK) {
            encode_stop(&image->encode, UFORM_DEVICE, "a device operation failed");
            image->chunks[s].busy = false;
            continue;
        }
        if (!done) continue;
        image->chunks[s].busy = false;
        image->done_items = image->chunks[s].last;
        if (image->encode.failure == UFORM_OK &&
            progress_report(&image->encode.progress, &image->encode.next_step, image->done_items, items))
            encode_stop(&image->encode, UFORM_CANCELLED, "cancelled by the progress handler");
    }
    while (image->encode.failure == UFORM_OK && image->next_item < items &&
           !image->chunks[image->next_slot].busy) {
        size_t first, last;
        image_next_run(image, &first, &last);
        image->next_item = last;
        if (first == last) continue; /* only failed items were left */
        char const *message = NULL;
        uform_status_t status = image_issue(image, image->next_slot, first, last, &message);
        if (status != UFORM_OK) {
            encode_stop(&image->encode, status, message);
            break;
        }
        image->chunks[image->next_slot].first = first;
        image->chunks[image->next_slot].last = last;
        image->chunks[image->next_slot].busy = true;
        image->next_slot = (image->next_slot + 1) % VRAM_SLOTS;
    }
    bool busy = false;
    for (size_t s = 0; s < VRAM_SLOTS; ++s)
        busy |= image->chunks[s].busy;
    if (!busy) {
        cudaStreamSynchronize(device->stream);
        image_end(image);
        return;
    }
    loop_timer(image->call.executor->loop, &image->poll,
               vram_poll_ns(loop_now_ns() - image->encode.started_ns));
}

static void image_poll(loop_op_t *op) {
    image_advance(container_of(op, vram_image_call_t, poll));
}

/* An output view (output_view) zeroed on the device, with its I8 scales: failed items keep zero rows. */
static bool output_view_zeroed(uform_arena_t *arena, size_t rows, size_t columns, uform_scalar_t scalar,
                               uform_view_t *view) {
    if (!output_view(arena, rows, columns, scalar, view)) return false;
    size_t bytes = rows * columns * uform_scalar_size(scalar) + 1; /* as output_view allocated them */
    if (cudaMemsetAsync(view->data, 0, bytes, 0) != cudaSuccess) return false;
    return !view->scales ||
           cudaMemsetAsync((void *)view->scales, 0, rows * sizeof(float) + 1, 0) == cudaSuccess;
}

static void image_start(call_t *call) {
    vram_image_call_t *image = container_of(call, vram_image_call_t, call);
    vram_device_t *device = &vram_of(call->executor)->devices[0];
    image->poll.callback = image_poll;
    if (vram_use(device) != UFORM_OK) {
        encode_stop(&image->encode, UFORM_DEVICE, "cannot use the device");
        image_end(image);
        return;
    }
    uform_arena_t *arena = image->encode.arena;
    size_t items = image->request.encode.tape.count,
           hidden = image->encode.model->header.info.image.transformer.hidden;
    image->encode.stats.items = items;
    image->encode.stats.bytes =
        image->request.encode.tape.offsets[items] - image->request.encode.tape.offsets[0];
    uform_encoded_t *encoded = &image->encode.encoded;
    /* Zeroed outputs (the legacy stream orders the memsets before the executor's stream's work, which
     * waits for it: the executor's stream is created non-blocking, so synchronize once instead). */
    bool ok = encode_outputs(&image->encode, items, hidden, output_view_zeroed);
    if (ok && (image->encode.outputs & UFORM_OUTPUT_TOKEN_VECTORS)) {
        ok = output_view_zeroed(arena, items * image->patches, image->encode.width, image->encode.scalar,
                                &encoded->token_vectors);
        size_t *offsets = ok ? arena_allocate_host(arena, (items + 1) * sizeof(size_t), 16) : NULL;
        if ((ok = offsets != NULL)) {
            for (size_t item = 0; item <= items; ++item)
                offsets[item] = item * image->patches;
            encoded->token_vectors.item_offsets = offsets;
            encoded->token_vectors.items = items;
        }
    }
    ok = ok && cudaDeviceSynchronize() == cudaSuccess;
    if (!ok) {
        cudaGetLastError();
        encode_stop(&image->encode, UFORM_OUT_OF_MEMORY, "cannot allocate the outputs in the arena");
        image_end(image);
        return;
    }
    image_advance(image);
}

/* The call's state from its image request, on the calling thread. */
static void image_fill(call_t *call, void const *context) {
    image_request_t const *request = context;
    vram_image_call_t *image = container_of(call, vram_image_call_t, call);
    encode_call_init(&image->encode, &request->encode);
    image->request = *request;
    uform_model_info_t const *info = &request->encode.model->header.info;
    size_t side = info->image.size / info->image.patch;
    image->patches = side * side;
}

uform_status_t vram_image_encode(char const *entry, image_request_t const *request) {
    uform_outcome_t *outcome = request->encode.outcome;
    if (request->input == IMAGE_INPUT_FILES)
        return call_refuse(outcome, UFORM_UNSUPPORTED, entry,
                           "VRAM executors read encoded images from memory: pass UFORM_SOURCE_MEMORY");
    vram_image_call_t *image = calloc(1, sizeof *image);
    if (!image) return call_refuse(outcome, UFORM_OUT_OF_MEMORY, entry, "cannot allocate the call");
    call_plan_t plan = encode_plan(entry, &request->encode, sizeof *image, image_start, image_fill, request);
    plan.state = &image->call; /* freed by call_run if the call cannot open, else by image_end */
    return call_run(&plan);
}

#endif /* UFORM_WITH_CUDA */
