/* image_encode_pixels on a VRAM executor; image_encode of files and encoded images goes to the media call
 * (src/vram/vram_media.c), which decodes on the host.
 *
 * The host (the executor's loop thread) checks each item and gathers chunks of consecutive good ones (at
 * most VRAM_IMAGE_CHUNK, or VRAM_IMAGE_BYTES of pixels unless one image alone is larger), spread over the
 * devices (chunk k on device k mod N). The chunk's index arrays go into a pinned staging slot of its
 * device; its pixels reach the device without a host copy when the tape is in pinned or device memory
 * (vram_memory: one cudaMemcpyAsync from the tape), else they are copied into the slot's staging first,
 * over the executor's host team. The device does the rest: resize, crop and normalize into BF16 patch
 * rows (kernels/cuda/cuda_image.h, the host's convention), the patch GEMM, class token and positions, the
 * tower (bidirectional, no rotary), the projections and the outputs, written into the device arena (from
 * another device, through its scratch: vram_views_t). Two slots per device: the host fills one while the
 * device runs the other. Failed items keep their status and zero rows, as on host executors. */
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "call.h"
#include "executor.h"
#include "model.h"
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
    size_t next_item, done_items;
    vram_memory_t memory;                                       /* where the tape's pixels are */
    size_t heights[VRAM_IMAGE_CHUNK], widths[VRAM_IMAGE_CHUNK]; /* the current run's */
    loop_op_t poll;
} vram_image_call_t;

/* The call's state is larger than the executor's call storage: it is allocated, its call first
 * (call_run's own state). */

static void image_end(vram_image_call_t *image) {
    image->encode.stats.total_ns = loop_now_ns() - image->encode.started_ns;
    image->encode.stats.compute_ns = image->encode.stats.total_ns;
    encode_end(&image->encode, image->call.outcome, image->encode.failure);
    uform_status_t status = image->encode.failure;
    char const *message = image->encode.message;
    /* call_finish ends the call; the state goes first, as nothing may touch it after. */
    call_t ending = image->call;
    free(image);
    call_finish(&ending, status, message);
}

/* Item `item`'s pixels checked: UFORM_OK, or UFORM_INVALID_ARGUMENT for dimensions its span does not
 * hold or that the front end cannot take. */
static uform_status_t image_pixels(vram_image_call_t const *image, size_t item) {
    uform_tape_t const *tape = &image->request.encode.tape;
    size_t size = tape->offsets[item + 1] - tape->offsets[item];
    size_t height = image->request.heights[item], width = image->request.widths[item], pixels = 0, bytes = 0;
    if (height == 0 || width == 0 || __builtin_mul_overflow(height, width, &pixels) ||
        pixels > UFORM_IMAGE_MAX_PIXELS || height > INT32_MAX || width > INT32_MAX ||
        __builtin_mul_overflow(pixels, (size_t)3, &bytes) || bytes != size)
        return UFORM_INVALID_ARGUMENT;
    return UFORM_OK;
}

/* Finds the next chunk from `next_item`: skips failed items (recording their statuses) and gathers a
 * run of good ones. Answers the run [*first, *last) (empty when none is left). */
static void image_next_run(vram_image_call_t *image, size_t *first, size_t *last) {
    uform_tape_t const *tape = &image->request.encode.tape;
    size_t items = tape->count;
    *first = *last = image->next_item;
    for (size_t item = image->next_item; item < items && *last - *first < VRAM_IMAGE_CHUNK; ++item) {
        uform_status_t status = image_pixels(image, item);
        if (status != UFORM_OK) {
            image->encode.statuses[item] = status;
            if (*last == *first) {
                *first = *last = item + 1; /* nothing gathered yet: skip it */
                continue;
            }
            break; /* the run ends; this item is checked again (and fails again) by the next one */
        }
        if (*last > *first && tape->offsets[item + 1] - tape->offsets[*first] > VRAM_IMAGE_BYTES) break;
        image->heights[item - *first] = image->request.heights[item];
        image->widths[item - *first] = image->request.widths[item];
        *last = item + 1;
    }
}

/* The host side of a chunk: pixel offsets int64 [items], heights and widths int32 [items], token
 * offsets int32 [items + 1], patch offsets int32 [items + 1], class rows int32 [items], patch rows int32
 * [items * patches]. */
typedef struct image_indices {
    int64_t *pixel_offsets;
    int32_t *heights, *widths, *token_offsets, *patch_offsets, *class_rows, *patch_rows;
    size_t bytes;
} image_indices_t;

static image_indices_t image_indices(void *base, size_t items, size_t patches) {
    image_indices_t indices = {.bytes = round_up_256(items * 8 + items * 4 * 2 + (items + 1) * 4 * 2 +
                                                     items * 4 + items * patches * 4)};
    if (!base) return indices; /* sizing only */
    indices.pixel_offsets = base;
    indices.heights = (int32_t *)(indices.pixel_offsets + items);
    indices.widths = indices.heights + items;
    indices.token_offsets = indices.widths + items;
    indices.patch_offsets = indices.token_offsets + items + 1;
    indices.class_rows = indices.patch_offsets + items + 1;
    indices.patch_rows = indices.class_rows + items;
    return indices;
}

/* Fills the chunk [first, last)'s indices; answers the most taps an axis needs. */
static size_t image_pack(vram_image_call_t const *image, image_indices_t const *host, size_t first,
                         size_t last, size_t size) {
    uform_tape_t const *tape = &image->request.encode.tape;
    size_t items = last - first, patches = image->patches, taps = 1;
    for (size_t i = 0; i < items; ++i) {
        size_t height = image->heights[i], width = image->widths[i];
        size_t out_height = height < width ? size : height * size / width;
        size_t out_width = width < height ? size : width * size / height;
        size_t a = cuda_image_taps(height, out_height), b = cuda_image_taps(width, out_width);
        taps = a > taps ? a : taps;
        taps = b > taps ? b : taps;
        host->pixel_offsets[i] = (int64_t)(tape->offsets[first + i] - tape->offsets[first]);
        host->heights[i] = (int32_t)height;
        host->widths[i] = (int32_t)width;
        host->token_offsets[i] = (int32_t)(i * (patches + 1));
        host->patch_offsets[i] = (int32_t)(i * patches);
        host->class_rows[i] = (int32_t)(i * (patches + 1));
        for (size_t p = 0; p < patches; ++p)
            host->patch_rows[i * patches + p] = (int32_t)(i * (patches + 1) + 1 + p);
    }
    host->token_offsets[items] = (int32_t)(items * (patches + 1));
    host->patch_offsets[items] = (int32_t)(items * patches);
    return taps;
}

/* Enqueues the copy of the chunk's indices and pixels into `staged` (the indices' bytes, then the
 * pixels): the pixels straight from a pinned or device tape, or through the staging slot. */
static uform_status_t image_stage(vram_image_call_t *image, vram_device_t *device, vram_slot_t *slot,
                                  image_indices_t const *host, void *staged, size_t first, size_t last,
                                  char const **message) {
    uform_tape_t const *tape = &image->request.encode.tape;
    size_t pixel_bytes = tape->offsets[last] - tape->offsets[first];
    uint8_t const *pixels = (uint8_t const *)tape->data + tape->offsets[first];
    cudaStream_t stream = device->stream;
    if (image->memory == VRAM_PAGEABLE) {
        uint8_t *staging = (uint8_t *)slot->staging + host->bytes;
        vram_copy(image->call.executor, staging, pixels, pixel_bytes);
        pixels = staging;
    }
    size_t bytes = image->memory == VRAM_PAGEABLE ? host->bytes + pixel_bytes : host->bytes;
    VRAM_TRY(cudaMemcpyAsync(staged, slot->staging, bytes, cudaMemcpyHostToDevice, stream),
             "cannot copy the chunk to the device");
    if (image->memory != VRAM_PAGEABLE)
        VRAM_TRY(
            cudaMemcpyAsync((char *)staged + host->bytes, pixels, pixel_bytes, cudaMemcpyDefault, stream),
            "cannot copy the chunk's pixels to the device");
    VRAM_TRY(cudaEventRecord(slot->copied, stream), "cannot record an event");
    return UFORM_OK;
}

/* The device scratch of a chunk: the staged indices and pixels, the axes, patch rows BF16 [rows, inputs],
 * their projection F32 [rows, hidden], the shadow of the outputs (off the arena's device), then the pass
 * (x F32 [tokens, hidden], the forward's, gathered rows, projections). */
typedef struct image_scratch {
    void *staged, *axes, *views;
    uint16_t *patch_bf16;
    float *patch_f32;
    vram_pass_t pass;
} image_scratch_t;

static bool image_scratch(vram_image_call_t const *image, vram_device_t *device, vram_tower_t const *tower,
                          size_t d, size_t items, size_t staged_bytes, size_t taps,
                          image_scratch_t *scratch) {
    uform_model_info_t const *info = &image->encode.model->header.info;
    size_t patches = image->patches, rows = items * patches,
           inputs = 3 * info->image.patch * info->image.patch;
    size_t const sizes[] = {
        staged_bytes,
        cuda_image_axes_bytes(items, info->image.size, taps),
        rows * inputs * 2,
        rows * tower->hidden * sizeof(float),
        d ? vram_views_bytes(&image->encode, items, rows, tower->hidden) : 0,
    };
    void *parts[5];
    if (!vram_chunk_scratch(device, tower, sizes, 5, parts, items * (patches + 1), rows, image->encode.width,
                            &scratch->pass))
        return false;
    scratch->staged = parts[0], scratch->axes = parts[1], scratch->views = d ? parts[4] : NULL;
    scratch->patch_bf16 = parts[2], scratch->patch_f32 = parts[3];
    return true;
}

/* The front end, the patch GEMM and the token assembly of a staged chunk, into the pass's x. */
static uform_status_t image_tokens(vram_image_call_t const *image, vram_device_t *device,
                                   vram_tower_t const *tower, image_scratch_t const *scratch, size_t items,
                                   size_t taps, char const **message) {
    uform_model_info_t const *info = &image->encode.model->header.info;
    size_t patch = info->image.patch, patches = image->patches;
    image_indices_t device_indices = image_indices(scratch->staged, items, patches);
    cuda_image_geometry_t geometry = {.size = (int32_t)info->image.size, .patch = (int32_t)patch};
    for (size_t c = 0; c < 3; ++c)
        geometry.mean[c] = info->image.mean[c], geometry.std[c] = info->image.std[c];
    VRAM_TRY(cuda_image_patches(scratch->patch_bf16, (uint8_t const *)scratch->staged + device_indices.bytes,
                                device_indices.pixel_offsets, device_indices.heights, device_indices.widths,
                                items, geometry, scratch->axes, taps, device->stream),
             "cannot launch the image front end");
    uform_status_t status =
        vram_patch_project(device, tower, scratch->patch_bf16, items * patches, scratch->patch_f32, message);
    if (status != UFORM_OK) return status;
    VRAM_TRY(cuda_assemble_tokens(scratch->pass.x, scratch->patch_f32, tower->cls, tower->pos,
                                  device_indices.patch_offsets, items, patches, tower->hidden,
                                  device->stream),
             "cannot launch the token assembly");
    return UFORM_OK;
}

/* Enqueues the chunk of items [first, last) on its device and slot (vram_place). */
static uform_status_t image_issue(vram_image_call_t *image, size_t first, size_t last, char const **message) {
    vram_t *vram = vram_of(image->call.executor);
    size_t d, s, items = last - first, patches = image->patches;
    vram_place(vram->flights.issued, vram->count, &d, &s);
    vram_device_t *device = &vram->devices[d];
    vram_tower_t const *tower = &image->encode.model->device->replicas[d].image;
    uform_tape_t const *tape = &image->request.encode.tape;
    size_t pixel_bytes = tape->offsets[last] - tape->offsets[first];
    if (vram_use(device) != UFORM_OK) return *message = "cannot use the device", UFORM_DEVICE;
    image_indices_t host = image_indices(NULL, items, patches);
    size_t staging_bytes = host.bytes + (image->memory == VRAM_PAGEABLE ? pixel_bytes : 0);
    vram_slot_t *slot = &device->slots[s];
    if (!vram_staging(slot, staging_bytes))
        return *message = "cannot allocate pinned staging memory", UFORM_OUT_OF_MEMORY;
    host = image_indices(slot->staging, items, patches);
    size_t taps = image_pack(image, &host, first, last, image->encode.model->header.info.image.size);
    image_scratch_t scratch;
    if (!image_scratch(image, device, tower, d, items, host.bytes + pixel_bytes, taps, &scratch))
        return *message = "cannot allocate device scratch", UFORM_OUT_OF_MEMORY;
    uform_status_t status = image_stage(image, device, slot, &host, scratch.staged, first, last, message);
    if (status == UFORM_OK) status = image_tokens(image, device, tower, &scratch, items, taps, message);
    image_indices_t device_indices = image_indices(scratch.staged, items, patches);
    if (status == UFORM_OK)
        status =
            vram_forward(device, tower, scratch.pass.x, items * (patches + 1), device_indices.token_offsets,
                         items, patches + 1, false, false, scratch.pass.forward, message);
    if (status != UFORM_OK) return status;
    vram_views_t views = vram_views_make(&image->encode, scratch.views, first, items, first * patches,
                                         items * patches, tower->hidden);
    vram_output_rows_t const output = {
        .state_rows = device_indices.class_rows,
        .items = items,
        .token_rows = device_indices.patch_rows,
        .tokens = items * patches,
        .gather_failed = "cannot gather",
        .convert_failed = "cannot convert",
    };
    if ((status = vram_output_write(device, tower, &image->encode, &views, scratch.pass.x, &scratch.pass,
                                    &output, message)) != UFORM_OK ||
        (status = vram_views_land(vram, device, &views, message)) != UFORM_OK)
        return status;
    VRAM_TRY(cudaEventRecord(slot->done, device->stream), "cannot record an event");
    vram_flights_issue(vram, first, last);
    return UFORM_OK;
}

/* A chunk done: progress, and cancellation. */
static void image_done(void *context, vram_flight_t const *flight) {
    vram_image_call_t *image = context;
    if (flight->last > image->done_items) image->done_items = flight->last;
    if (image->encode.failure == UFORM_OK &&
        progress_report(&image->encode.progress, &image->encode.next_step, image->done_items,
                        image->request.encode.tape.count))
        encode_stop(&image->encode, UFORM_CANCELLED, "cancelled by the progress handler");
}

static void image_advance(vram_image_call_t *image) {
    vram_t *vram = vram_of(image->call.executor);
    size_t items = image->request.encode.tape.count;
    char const *message = NULL;
    vram_flights_sweep_encode(vram, &image->encode, image_done, image);
    while (image->encode.failure == UFORM_OK && image->next_item < items && vram_flights_free(vram)) {
        size_t first, last;
        image_next_run(image, &first, &last);
        image->next_item = last;
        if (first == last) continue; /* only failed items were left */
        uform_status_t status = image_issue(image, first, last, &message);
        if (status != UFORM_OK) {
            encode_stop(&image->encode, status, message);
            break;
        }
    }
    if (!vram_flights_busy(vram, false)) {
        for (size_t d = 0; d < vram->count; ++d)
            cudaStreamSynchronize(vram->devices[d].stream);
        image_end(image);
        return;
    }
    loop_timer(image->call.executor->loop, &image->poll,
               vram_poll_ns(loop_now_ns() - image->encode.started_ns));
}

static void image_poll(loop_op_t *op) {
    image_advance(container_of(op, vram_image_call_t, poll));
}

/* Every output in the arena, zeroed (failed items keep zero rows): statuses, embeddings, states, token
 * vectors grouped per item. */
static bool image_outputs(vram_image_call_t *image, size_t items, size_t hidden) {
    size_t patches = image->patches;
    return encode_outputs(&image->encode, items, hidden, vram_output_view_zeroed) &&
           (!(image->encode.outputs & UFORM_OUTPUT_TOKEN_VECTORS) ||
            encode_token_vectors(&image->encode, items, items * patches, patches, vram_output_view_zeroed));
}

static void image_start(call_t *call) {
    vram_image_call_t *image = container_of(call, vram_image_call_t, call);
    vram_t *vram = vram_of(call->executor);
    size_t items = image->request.encode.tape.count;
    image->poll.callback = image_poll;
    vram_flights_start(vram);
    image->encode.stats.items = items;
    image->encode.stats.bytes =
        image->request.encode.tape.offsets[items] - image->request.encode.tape.offsets[0];
    image->memory = vram_memory(image->request.encode.tape.data);
    /* The memsets of the zeroed outputs run on the legacy stream, which the executor's streams do not
     * wait for (they are non-blocking): synchronize once. */
    bool ok = vram_use(&vram->devices[0]) == UFORM_OK &&
              image_outputs(image, items, image->encode.model->header.info.image.transformer.hidden) &&
              cudaDeviceSynchronize() == cudaSuccess;
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
    if (request->input != IMAGE_INPUT_PIXELS) return vram_media_encode(entry, request, NULL);
    vram_image_call_t *image = calloc(1, sizeof *image);
    if (!image) return call_refuse(outcome, UFORM_OUT_OF_MEMORY, entry, "cannot allocate the call");
    call_plan_t plan = encode_plan(entry, &request->encode, sizeof *image, image_start, image_fill, request);
    plan.state = &image->call; /* freed by call_run if the call cannot open, else by image_end */
    return call_run(&plan);
}

#endif /* UFORM_WITH_CUDA */
