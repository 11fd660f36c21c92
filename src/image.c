/* The image tower's verbs: image_encode (files, or encoded images in memory), image_encode_pixels, and
 * video_encode (clips through the same tower, one image per sampled frame).
 *
 * A call encodes its items in chunks of whole items (about IMAGE_CHUNK_TOKENS tokens, at least as
 * many items as the executor has threads, at most IMAGE_CHUNK_MAX), one chunk per loop turn. An item is
 * one image, or a clip of `frames` images:
 *
 *   read     (files only) open -> statx -> read through the ring for every item of chunk k + 1,
 *            issued before chunk k is decoded and computed, so that the kernel reads meanwhile;
 *   decode   the chunk's items decoded (JPEG, PNG; clips through video_decode.h), resized, cropped,
 *            normalized and patchified in parallel over the executor's threads, each thread taking the
 *            next item from a shared counter, so that one large item does not hold the others back;
 *   compute  the patch GEMM, class token and positions, the tower (bidirectional, no rotary) over every
 *            image of the chunk, the projections, and the outputs in the arena (for clips, the pooling
 *            of their frames' embeddings and states).
 *
 * An item that fails (unreadable, malformed, past the limits of image_decode.h or video_decode.h) keeps
 * its status in `statuses` and zero rows, and takes no part in the tower. The others are encoded as if
 * alone: images never attend to each other, and every GEMM row is computed by the same code whatever the
 * batch. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "image_decode.h"
#include "image_preprocess.h"
#include "tower.h"
#include "video_decode.h"
#if UFORM_WITH_CUDA
#include "vram.h"
#endif

#define IMAGE_CHUNK_TOKENS 2048
#define IMAGE_CHUNK_MAX    64
#define VIDEO_CHUNK_TOKENS 32768 /* a chunk of clips grows to one per thread only up to this */
#define IMAGE_PATH_MAX     4096

typedef enum image_input {
    IMAGE_INPUT_PIXELS = 0,
    IMAGE_INPUT_FILES,
    IMAGE_INPUT_MEMORY,
} image_input_t;

typedef struct image_call image_call_t;

/* A file being read: one ring operation at a time (open, statx, read). Slots [0, chunk_items) serve
 * the even chunks, the next chunk_items the odd ones, so that chunk k + 1 is read while k computes. */
typedef struct image_slot {
    loop_op_t op;
    image_call_t *image;
    size_t item;
    int fd;
    struct statx statx;
    uint8_t *buffer; /* the file's bytes; kept and grown across chunks */
    size_t capacity, size;
    char path[IMAGE_PATH_MAX];
} image_slot_t;

/* What a call holds outside the executor's call storage; freed when it ends. */
typedef struct image_work {
    tower_linear_t patch; /* image.patch packed for the kernels: [hidden, 3 patch^2] with its bias */
    size_t packed_bytes;
    float *positions; /* [1 + patches, hidden]: image.pos, with image.cls added to row 0 */
    size_t slots_count;
    image_slot_t slots[];
} image_work_t;

struct image_call {
    call_t call;
    uform_model_t *model;
    uform_arena_t *arena;
    image_input_t input;
    uform_tape_t tape;
    size_t const *heights, *widths;
    uform_outputs_t outputs;
    uform_scalar_t scalar;
    size_t width;     /* embedding and token-vector columns: dims or a matryoshka width */
    bool video;       /* items are clips (their bytes or paths) */
    size_t frames;    /* images per item: 1, or the model's frames per clip */
    size_t vectors;   /* token vectors per item: patches per image, or frames per clip */
    size_t max_bytes; /* per encoded item: UFORM_IMAGE_MAX_BYTES or UFORM_VIDEO_MAX_BYTES */
    uform_progress_t progress;
    size_t next_step;
    uform_encode_stats_t *stats_out;
    uform_encode_stats_t stats;
    uint64_t started_ns, waiting_since_ns;
    uform_encoded_t encoded;
    uform_status_t *statuses;
    image_geometry_t geometry;
    size_t patches; /* per image: (size / patch)^2 */
    size_t chunk_items, chunks, next_chunk;
    image_work_t *work;
    size_t in_flight;       /* ring operations not final */
    size_t pending[2];      /* files of the even and of the odd chunk not read yet */
    bool waiting;           /* the turn of `next_chunk` waits for its files */
    uform_status_t failure; /* once set, nothing new starts and the call ends when in-flight work drains */
    char const *message;
};

_Static_assert(sizeof(image_call_t) <= EXECUTOR_CALL_STORAGE, "image_call_t outgrew the call storage");

/* ---- Outputs ------------------------------------------------------------------------------------ */

/* A view of `rows` x `columns` in the requested scalar, with I8 scales beside it. */
static bool output_view(uform_arena_t *arena, size_t rows, size_t columns, uform_scalar_t scalar,
                        uform_view_t *view) {
    void *data = arena_allocate(arena, rows * columns * uform_scalar_size(scalar) + 1, 64);
    if (!data) return false;
    *view = arena_view(arena, data, rows, columns, scalar);
    if (scalar == UFORM_I8) {
        float *scales = arena_allocate(arena, rows * sizeof(float) + 1, 16);
        if (!scales) return false;
        view->scales = scales;
    }
    return true;
}

/* Writes one F32 row into row `row` of an output view, converting to its scalar. */
static void output_row(kernels_t const *kernels, uform_view_t *view, size_t row, float const *values) {
    void *target = (unsigned char *)view->data + row * view->row_stride;
    float *scale = view->scales ? (float *)view->scales + row : NULL;
    float ignored;
    kernels->convert(target, values, view->columns, view->scalar, scale ? scale : &ignored);
}

/* Zeroes `count` rows from `row` of a view (a failed item's), with their I8 scales. */
static void output_zero(uform_view_t *view, size_t row, size_t count) {
    if (!view->data) return;
    memset((unsigned char *)view->data + row * view->row_stride, 0, count * view->row_stride);
    if (view->scales) memset((float *)view->scales + row, 0, count * sizeof(float));
}

/* ---- The end ------------------------------------------------------------------------------------ */

static void image_release_work(image_call_t *image) {
    image_work_t *work = image->work;
    if (!work) return;
    for (size_t i = 0; i < work->slots_count; ++i)
        free(work->slots[i].buffer);
    executor_deallocate(image->call.executor, work->patch.packed, work->packed_bytes);
    free(work->patch.bias);
    free(work->positions);
    free(work);
    image->work = NULL;
}

static void image_end(image_call_t *image) {
    uform_status_t status = image->failure;
    for (size_t item = 0; item < image->tape.count && image->statuses; ++item)
        image->stats.failed += image->statuses[item] != UFORM_OK;
    image->stats.total_ns = loop_now_ns() - image->started_ns;
    if (image->stats_out) *image->stats_out = image->stats;
    if (status == UFORM_OK) {
        image->call.outcome->product = OUTCOME_PRODUCT_ENCODED;
        image->call.outcome->encoded = image->encoded;
    }
    image_release_work(image);
    arena_end(image->arena);
    uform_model_free(image->model);
    call_finish(&image->call, status, image->message);
}

/* Records the first failure; the call ends once nothing is in flight. */
static void image_stop(image_call_t *image, uform_status_t status, char const *message) {
    if (image->failure != UFORM_OK) return;
    image->failure = status;
    image->message = message;
}

/* Ends the call once no ring operation is in flight (a stopping call waits for its reads). */
static void image_settle(image_call_t *image) {
    if (image->in_flight == 0) image_end(image);
}

static void image_turn(loop_op_t *op);

/* ---- Reading files through the ring ------------------------------------------------------------- */

static image_slot_t *image_slot(image_call_t *image, size_t item) {
    size_t set = (item / image->chunk_items) % 2;
    return &image->work->slots[set * image->chunk_items + item % image->chunk_items];
}

/* A file is read, or failed: the turn waiting for it may go on. */
static void slot_done(image_slot_t *slot, uform_status_t status) {
    image_call_t *image = slot->image;
    if (slot->fd >= 0) close(slot->fd);
    slot->fd = -1;
    if (status != UFORM_OK) image->statuses[slot->item] = status;
    image->pending[(slot->item / image->chunk_items) % 2]--;
    if (image->failure != UFORM_OK) {
        image_settle(image);
        return;
    }
    if (image->waiting && image->pending[image->next_chunk % 2] == 0) {
        image->waiting = false;
        image->stats.read_ns += loop_now_ns() - image->waiting_since_ns;
        image_turn(&image->call.op);
    }
}

/* Every completion lands here first: one operation fewer in flight, and a stopping call goes no
 * further with this file. */
static bool slot_landed(image_slot_t *slot) {
    slot->image->in_flight--;
    if (slot->image->failure == UFORM_OK) return true;
    slot_done(slot, UFORM_OK);
    return false;
}

static void slot_read(loop_op_t *op) {
    image_slot_t *slot = container_of(op, image_slot_t, op);
    if (!slot_landed(slot)) return;
    if (op->result < 0) {
        slot_done(slot, UFORM_IO);
        return;
    }
    slot->size = (size_t)op->result; /* short only when the file shrank: the decoder sees the rest */
    slot->image->stats.bytes += slot->size;
    slot_done(slot, UFORM_OK);
}

static void slot_statted(loop_op_t *op) {
    image_slot_t *slot = container_of(op, image_slot_t, op);
    if (!slot_landed(slot)) return;
    /* Opened without blocking (a FIFO would wait for a writer); a regular file reads blocking. */
    if (op->result < 0 || !S_ISREG(slot->statx.stx_mode) || fcntl(slot->fd, F_SETFL, 0) != 0) {
        slot_done(slot, UFORM_IO);
        return;
    }
    uint64_t size = slot->statx.stx_size;
    if (size == 0 || size > slot->image->max_bytes) {
        slot_done(slot, UFORM_FORMAT);
        return;
    }
    if (size > slot->capacity) {
        uint8_t *grown = malloc((size_t)size);
        if (!grown) {
            slot_done(slot, UFORM_OUT_OF_MEMORY);
            return;
        }
        free(slot->buffer);
        slot->buffer = grown;
        slot->capacity = (size_t)size;
    }
    slot->op.callback = slot_read;
    slot->image->in_flight++;
    loop_read(slot->image->call.executor->loop, &slot->op, slot->fd, slot->buffer, (size_t)size, 0);
}

static void slot_opened(loop_op_t *op) {
    image_slot_t *slot = container_of(op, image_slot_t, op);
    if (op->result >= 0) slot->fd = (int)op->result;
    if (!slot_landed(slot)) return;
    if (op->result < 0) {
        slot_done(slot, UFORM_IO);
        return;
    }
    slot->op.callback = slot_statted;
    slot->image->in_flight++;
    loop_statx(slot->image->call.executor->loop, &slot->op, slot->fd, &slot->statx);
}

/* Opens every file of `chunk`. A path that is empty or holds a NUL byte fails at once. */
static void image_read(image_call_t *image, size_t chunk) {
    size_t first = chunk * image->chunk_items, last = first + image->chunk_items;
    if (last > image->tape.count) last = image->tape.count;
    for (size_t item = first; item < last; ++item) {
        image_slot_t *slot = image_slot(image, item);
        slot->image = image;
        slot->item = item;
        slot->fd = -1;
        slot->size = 0;
        size_t length = image->tape.offsets[item + 1] - image->tape.offsets[item];
        char const *path = length ? (char const *)image->tape.data + image->tape.offsets[item] : NULL;
        if (length == 0 || memchr(path, 0, length)) {
            image->statuses[item] = UFORM_INVALID_ARGUMENT;
            continue;
        }
        if (length >= IMAGE_PATH_MAX) { /* the kernel would answer ENAMETOOLONG */
            image->statuses[item] = UFORM_IO;
            continue;
        }
        memcpy(slot->path, path, length);
        slot->path[length] = '\0';
        slot->op.callback = slot_opened;
        image->pending[chunk % 2]++;
        image->in_flight++;
        loop_open(image->call.executor->loop, &slot->op, slot->path, O_RDONLY | O_NONBLOCK);
    }
}

/* ---- Decoding, in parallel ---------------------------------------------------------------------- */

typedef struct decode_job {
    image_call_t *image;
    size_t first, count;
    float *patches; /* [count, frames, patches, 3 patch^2] */
    _Atomic size_t next;
} decode_job_t;

/* Where a clip's samples land: sample k's patch rows at patches + k * floats. */
typedef struct clip_target {
    image_geometry_t const *geometry;
    float *patches;
    size_t floats; /* per frame: patches * 3 patch^2 */
} clip_target_t;

/* A frame that video_decode picked for samples [first, first + count): prepared once, then copied. */
static uform_status_t clip_frame(void *context, size_t first, size_t count, video_frame_t const *frame) {
    clip_target_t const *target = context;
    float *rows = target->patches + first * target->floats;
    uform_status_t status =
        image_preprocess(frame->rgb, frame->height, frame->width, frame->stride, target->geometry, rows);
    for (size_t k = 1; k < count && status == UFORM_OK; ++k)
        memcpy(rows + k * target->floats, rows, target->floats * sizeof(float));
    return status;
}

/* One item's patch rows, from its pixels, its file's bytes or its encoded bytes in the tape: one image's,
 * or every sample's of a clip. */
static uform_status_t image_prepare(image_call_t *image, size_t item, float *patches) {
    size_t begin = image->tape.offsets[item], span = image->tape.offsets[item + 1] - begin;
    uint8_t const *bytes = span ? (uint8_t const *)image->tape.data + begin : NULL;
    if (image->input == IMAGE_INPUT_PIXELS) {
        size_t height = image->heights[item], width = image->widths[item], expected = 0;
        if (height == 0 || width == 0 || __builtin_mul_overflow(height, width, &expected) ||
            __builtin_mul_overflow(expected, 3, &expected) || expected != span)
            return UFORM_INVALID_ARGUMENT;
        return image_preprocess(bytes, height, width, width * 3, &image->geometry, patches);
    }
    if (image->input == IMAGE_INPUT_FILES) {
        image_slot_t const *slot = image_slot(image, item);
        bytes = slot->buffer;
        span = slot->size;
    }
    if (image->video) {
        size_t patch = image->geometry.patch;
        clip_target_t target = {&image->geometry, patches, image->patches * 3 * patch * patch};
        return video_decode(bytes, span, image->frames, clip_frame, &target);
    }
    image_rgb_t rgb;
    uform_status_t status = image_decode(bytes, span, &rgb);
    if (status != UFORM_OK) return status;
    status = image_preprocess(rgb.pixels, rgb.height, rgb.width, rgb.width * 3, &image->geometry, patches);
    free(rgb.pixels);
    return status;
}

static void decode_work(void *context, size_t thread) {
    (void)thread;
    decode_job_t *job = context;
    image_call_t *image = job->image;
    size_t floats = image->frames * image->patches * 3 * image->geometry.patch * image->geometry.patch;
    for (;;) {
        size_t index = atomic_fetch_add_explicit(&job->next, 1, memory_order_relaxed);
        if (index >= job->count) return;
        size_t item = job->first + index;
        float *patches = job->patches + index * floats;
        uform_status_t status = image->statuses[item]; /* a file that could not be read */
        if (status == UFORM_OK) status = image_prepare(image, item, patches);
        if (status != UFORM_OK) {
            image->statuses[item] = status;
            memset(patches, 0, floats * sizeof(float));
        }
    }
}

/* ---- Compute ------------------------------------------------------------------------------------ */

/* The chunk's scratch, for `images` = items * frames: the tower's; x [tokens, hidden]; patch rows
 * [images * patches, 3 patch^2]; rows [images * patches, hidden] (patch embeddings, then the states to
 * project); their projections [images * patches, dims]; pooled [max(dims, hidden)] (a clip's means);
 * token offsets [images + 1] and the item of each image kept [images]. */
typedef struct image_scratch {
    void *tower;
    float *x, *patches, *rows, *projected, *pooled;
    size_t *offsets, *items;
} image_scratch_t;

static bool image_scratch(image_call_t *image, size_t count, image_scratch_t *scratch) {
    tower_t const *tower = image->model->image;
    size_t patch = image->geometry.patch, images = count * image->frames, rows = images * image->patches;
    size_t tokens = rows + images, pooled = tower->dims > tower->hidden ? tower->dims : tower->hidden;
    size_t sizes[] = {
        round_up_64(tower_scratch_bytes(tower, tokens)),
        round_up_64(tokens * tower->hidden * sizeof(float)),
        round_up_64(rows * 3 * patch * patch * sizeof(float)),
        round_up_64(rows * tower->hidden * sizeof(float)),
        round_up_64(rows * tower->dims * sizeof(float)),
        round_up_64(pooled * sizeof(float)),
        round_up_64((images + 1) * sizeof(size_t)),
        round_up_64(images * sizeof(size_t)),
    };
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i)
        total += sizes[i];
    char *base = executor_scratch(image->call.executor, total);
    if (!base) return false;
    scratch->tower = base;
    scratch->x = (float *)(void *)(base += sizes[0]);
    scratch->patches = (float *)(void *)(base += sizes[1]);
    scratch->rows = (float *)(void *)(base += sizes[2]);
    scratch->projected = (float *)(void *)(base += sizes[3]);
    scratch->pooled = (float *)(void *)(base += sizes[4]);
    scratch->offsets = (size_t *)(void *)(base += sizes[5]);
    scratch->items = (size_t *)(void *)(base + sizes[6]);
    return true;
}

/* Projects `kept * per_item` rows of final states, normalizes them at the output width, and writes
 * row r of kept item q to row items[q] * per_item + r of `view`. */
static void image_project(image_call_t *image, image_scratch_t const *scratch, size_t kept, size_t per_item,
                          uform_view_t *view) {
    tower_t const *tower = image->model->image;
    size_t count = kept * per_item;
    if (count == 0) return;
    tower_linear(tower, image->call.executor, &tower->proj, scratch->rows, tower->hidden, count, image->width,
                 scratch->projected, image->width);
    uint64_t converting = loop_now_ns();
    for (size_t q = 0; q < kept; ++q)
        for (size_t r = 0; r < per_item; ++r) {
            float *values = scratch->projected + (q * per_item + r) * image->width;
            tower->kernels->normalize(values, image->width);
            output_row(tower->kernels, view, scratch->items[q] * per_item + r, values);
        }
    image->stats.convert_ns += loop_now_ns() - converting;
}

/* Images: the class token's state is the item's; its projection the embedding; the patches' projections
 * its token vectors. `kept` images, one per item. */
static void image_rows(image_call_t *image, image_scratch_t const *scratch, size_t kept) {
    tower_t const *tower = image->model->image;
    size_t const hidden = tower->hidden, patches = image->patches;
    uform_encoded_t *encoded = &image->encoded;
    for (size_t q = 0; q < kept; ++q) {
        float const *state = scratch->x + scratch->offsets[q] * hidden;
        memcpy(scratch->rows + q * hidden, state, hidden * sizeof(float));
        if (image->outputs & UFORM_OUTPUT_STATES)
            output_row(tower->kernels, &encoded->states, scratch->items[q], state);
    }
    if (image->outputs & UFORM_OUTPUT_EMBEDDINGS)
        image_project(image, scratch, kept, 1, &encoded->embeddings);
    if (image->outputs & UFORM_OUTPUT_TOKEN_VECTORS) {
        for (size_t q = 0; q < kept; ++q)
            memcpy(scratch->rows + q * patches * hidden, scratch->x + (scratch->offsets[q] + 1) * hidden,
                   patches * hidden * sizeof(float));
        image_project(image, scratch, kept, patches, &encoded->token_vectors);
    }
}

/* The mean of `count` rows of `columns` floats, `stride` floats apart, summed in order. [columns] */
static void rows_mean(float const *rows, size_t count, size_t stride, size_t columns, float *mean) {
    memset(mean, 0, columns * sizeof(float));
    for (size_t r = 0; r < count; ++r)
        for (size_t c = 0; c < columns; ++c)
            mean[c] += rows[r * stride + c];
    for (size_t c = 0; c < columns; ++c)
        mean[c] /= (float)count;
}

/* Clips: `kept` images, `frames` per clip, in order. Each frame's class state s_k is projected at the
 * full dims and normalized: f_k [dims]. Per clip, token vectors f_k at the output width (the prefix,
 * renormalized), the embedding normalize(mean_k f_k) at the width (the same prefix rule), the state
 * mean_k s_k [hidden]. */
static void clip_rows(image_call_t *image, image_scratch_t const *scratch, size_t kept) {
    tower_t const *tower = image->model->image;
    kernels_t const *kernels = tower->kernels;
    size_t const hidden = tower->hidden, dims = tower->dims, width = image->width, frames = image->frames;
    uform_encoded_t *encoded = &image->encoded;
    if (kept == 0) return;
    for (size_t q = 0; q < kept; ++q) /* the states to project [kept, hidden] */
        memcpy(scratch->rows + q * hidden, scratch->x + scratch->offsets[q] * hidden, hidden * sizeof(float));
    bool project = image->outputs & (UFORM_OUTPUT_EMBEDDINGS | UFORM_OUTPUT_TOKEN_VECTORS);
    if (project)
        tower_linear(tower, image->call.executor, &tower->proj, scratch->rows, hidden, kept, dims,
                     scratch->projected, dims);
    uint64_t converting = loop_now_ns();
    float *pooled = scratch->pooled;
    for (size_t clip = 0; clip < kept / frames; ++clip) {
        size_t item = scratch->items[clip * frames];
        float *embedded = scratch->projected + clip * frames * dims; /* f_k [frames, dims] */
        for (size_t k = 0; k < frames && project; ++k)
            kernels->normalize(embedded + k * dims, dims);
        for (size_t k = 0; k < frames && (image->outputs & UFORM_OUTPUT_TOKEN_VECTORS); ++k) {
            float const *vector = embedded + k * dims;
            if (width < dims) {
                memcpy(pooled, vector, width * sizeof(float));
                kernels->normalize(pooled, width);
                vector = pooled;
            }
            output_row(kernels, &encoded->token_vectors, item * frames + k, vector);
        }
        if (image->outputs & UFORM_OUTPUT_EMBEDDINGS) {
            rows_mean(embedded, frames, dims, dims, pooled);
            kernels->normalize(pooled, dims);
            if (width < dims) kernels->normalize(pooled, width);
            output_row(kernels, &encoded->embeddings, item, pooled);
        }
        if (image->outputs & UFORM_OUTPUT_STATES) {
            rows_mean(scratch->rows + clip * frames * hidden, frames, hidden, hidden, pooled);
            output_row(kernels, &encoded->states, item, pooled);
        }
    }
    image->stats.convert_ns += loop_now_ns() - converting;
}

/* Decodes, then encodes, the items of one chunk: every image of every item through the tower together. */
static void image_chunk(image_call_t *image, size_t chunk) {
    tower_t const *tower = image->model->image;
    uform_executor_t *executor = image->call.executor;
    size_t const hidden = tower->hidden, patches = image->patches, tokens_per_image = 1 + patches;
    size_t const row_floats = 3 * image->geometry.patch * image->geometry.patch, frames = image->frames;
    size_t first = chunk * image->chunk_items, last = first + image->chunk_items;
    if (last > image->tape.count) last = image->tape.count;
    size_t const count = last - first;
    image_scratch_t scratch;
    if (!image_scratch(image, count, &scratch)) {
        image_stop(image, UFORM_OUT_OF_MEMORY, "cannot allocate the executor's scratch");
        return;
    }

    uint64_t decoding = loop_now_ns();
    decode_job_t job = {.image = image, .first = first, .count = count, .patches = scratch.patches};
    atomic_init(&job.next, 0);
    executor_for_threads(executor, decode_work, &job);
    uint64_t computing = loop_now_ns();
    image->stats.decode_ns += computing - decoding;

    /* Patch embeddings of every image, failed items' included (their rows are zero). [rows, hidden] */
    image_work_t const *work = image->work;
    tower_linear(tower, executor, &work->patch, scratch.patches, row_floats, count * frames * patches, hidden,
                 scratch.rows, hidden);

    /* x: per image of a decoded item, the class token, then its patches, each plus its position.
     * [tokens, hidden] */
    size_t kept = 0, row = 0;
    for (size_t index = 0; index < count; ++index) {
        if (image->statuses[first + index] != UFORM_OK) continue;
        for (size_t frame = 0; frame < frames; ++frame) {
            size_t source = index * frames + frame;
            scratch.items[kept] = first + index;
            scratch.offsets[kept++] = row;
            memcpy(scratch.x + row * hidden, work->positions, hidden * sizeof(float));
            for (size_t p = 0; p < patches; ++p) {
                float *x = scratch.x + (row + 1 + p) * hidden;
                float const *embedded = scratch.rows + (source * patches + p) * hidden;
                float const *position = work->positions + (1 + p) * hidden;
                for (size_t h = 0; h < hidden; ++h)
                    x[h] = embedded[h] + position[h];
            }
            row += tokens_per_image;
        }
    }
    scratch.offsets[kept] = row;
    if (kept) {
        tower_batch_t batch = {
            .tokens = row,
            .items = kept,
            .offsets = scratch.offsets,
            .causal = false,
            .rotary = false,
            .x = scratch.x,
            .scratch = scratch.tower,
        };
        tower_forward(tower, executor, &batch);
    }

    if (image->video)
        clip_rows(image, &scratch, kept);
    else
        image_rows(image, &scratch, kept);
    uform_encoded_t *encoded = &image->encoded;
    for (size_t item = first; item < last; ++item) {
        if (image->statuses[item] == UFORM_OK) continue;
        output_zero(&encoded->embeddings, item, 1);
        output_zero(&encoded->states, item, 1);
        output_zero(&encoded->token_vectors, item * image->vectors, image->vectors);
    }
    image->stats.compute_ns += loop_now_ns() - computing;
}

/* One chunk per loop turn; with files, it first waits for its reads and issues the next chunk's. */
static void image_turn(loop_op_t *op) {
    image_call_t *image = container_of(op, image_call_t, call.op);
    size_t chunk = image->next_chunk;
    if (image->input == IMAGE_INPUT_FILES) {
        if (image->pending[chunk % 2] != 0) {
            image->waiting = true;
            image->waiting_since_ns = loop_now_ns();
            return;
        }
        if (chunk + 1 < image->chunks) image_read(image, chunk + 1);
    }
    image_chunk(image, chunk);
    image->next_chunk = ++chunk;
    size_t done =
        chunk * image->chunk_items < image->tape.count ? chunk * image->chunk_items : image->tape.count;
    if (image->failure == UFORM_OK &&
        progress_report(&image->progress, &image->next_step, done, image->tape.count))
        image_stop(image, UFORM_CANCELLED, "cancelled by the progress handler");
    if (image->failure != UFORM_OK || chunk == image->chunks) {
        image_settle(image);
        return;
    }
    loop_post(image->call.executor->loop, &image->call.op);
}

/* ---- The start ---------------------------------------------------------------------------------- */

/* Every output in the arena: statuses, embeddings, states, and token vectors grouped per item. */
static bool image_outputs(image_call_t *image) {
    uform_arena_t *arena = image->arena;
    size_t items = image->tape.count;
    uform_encoded_t *encoded = &image->encoded;
    memset(encoded, 0, sizeof *encoded);
    encoded->items = items;
    image->statuses = arena_allocate(arena, items * sizeof *image->statuses, 16);
    if (!image->statuses) return false;
    memset(image->statuses, 0, items * sizeof *image->statuses);
    encoded->statuses = image->statuses;
    if ((image->outputs & UFORM_OUTPUT_EMBEDDINGS) &&
        !output_view(arena, items, image->width, image->scalar, &encoded->embeddings))
        return false;
    if ((image->outputs & UFORM_OUTPUT_STATES) &&
        !output_view(arena, items, image->model->image->hidden, image->scalar, &encoded->states))
        return false;
    if (image->outputs & UFORM_OUTPUT_TOKEN_VECTORS) {
        if (!output_view(arena, items * image->vectors, image->width, image->scalar, &encoded->token_vectors))
            return false;
        size_t *offsets = arena_allocate(arena, (items + 1) * sizeof(size_t), 16);
        if (!offsets) return false;
        for (size_t item = 0; item <= items; ++item)
            offsets[item] = item * image->vectors;
        encoded->token_vectors.item_offsets = offsets;
        encoded->token_vectors.items = items;
    }
    return true;
}

/* The patch layer packed for the tower's kernels, its bias, and the positions with the class token. */
static image_work_t *image_work(image_call_t *image, size_t slots) {
    tower_t const *tower = image->model->image;
    kernels_t const *kernels = tower->kernels;
    size_t const hidden = tower->hidden, inputs = 3 * image->geometry.patch * image->geometry.patch;
    image_work_t *work = calloc(1, sizeof *work + slots * sizeof(image_slot_t));
    if (!work) return NULL;
    image->work = work;
    work->slots_count = slots;
    uint16_t const *weight = model_tensor(image->model, "image.patch.weight", NULL);
    uint16_t const *bias = model_tensor(image->model, "image.patch.bias", NULL);
    uint16_t const *cls = model_tensor(image->model, "image.cls", NULL);
    uint16_t const *pos = model_tensor(image->model, "image.pos", NULL);
    work->packed_bytes = kernels->gemm_packed_size(hidden, inputs);
    work->patch.packed = executor_allocate(image->call.executor, work->packed_bytes);
    work->patch.bias = malloc(hidden * sizeof(float));
    work->patch.n = hidden;
    work->patch.k = inputs;
    work->positions = malloc((1 + image->patches) * hidden * sizeof(float));
    float *class_token = malloc(hidden * sizeof(float));
    if (!work->patch.packed || !work->patch.bias || !work->positions || !class_token) {
        free(class_token);
        return NULL;
    }
    kernels->gemm_pack(work->patch.packed, weight, hidden, inputs);
    kernels->bf16_to_f32(work->patch.bias, bias, hidden);
    kernels->bf16_to_f32(work->positions, pos, (1 + image->patches) * hidden);
    kernels->bf16_to_f32(class_token, cls, hidden);
    for (size_t h = 0; h < hidden; ++h)
        work->positions[h] += class_token[h];
    free(class_token);
    return work;
}

static void image_start(call_t *call) {
    image_call_t *image = container_of(call, image_call_t, call);
    size_t items = image->tape.count;
    image->stats.items = items;
    if (image->input != IMAGE_INPUT_FILES)
        image->stats.bytes = image->tape.offsets[items] - image->tape.offsets[0];

    /* Chunks: about IMAGE_CHUNK_TOKENS tokens, at least one item per thread (for clips, only while that
     * stays within VIDEO_CHUNK_TOKENS), at most the batch. */
    size_t item_tokens = image->frames * (1 + image->patches), threads = call->executor->threads;
    if (image->video && threads > VIDEO_CHUNK_TOKENS / item_tokens)
        threads = VIDEO_CHUNK_TOKENS / item_tokens;
    size_t chunk_items = IMAGE_CHUNK_TOKENS / item_tokens;
    if (chunk_items < threads) chunk_items = threads;
    if (chunk_items > IMAGE_CHUNK_MAX) chunk_items = IMAGE_CHUNK_MAX;
    if (chunk_items > items) chunk_items = items;
    if (chunk_items == 0) chunk_items = 1;
    image->chunk_items = chunk_items;
    image->chunks = (items + chunk_items - 1) / chunk_items;

    size_t slots = image->input == IMAGE_INPUT_FILES ? 2 * chunk_items : 0;
    if (!image_outputs(image)) {
        image_stop(image, UFORM_OUT_OF_MEMORY, "cannot allocate the outputs in the arena");
    } else if (!image_work(image, slots)) {
        image_stop(image, UFORM_OUT_OF_MEMORY, "cannot allocate the patch layer");
    }
    if (image->failure != UFORM_OK) {
        image_end(image);
        return;
    }
    if (image->input == IMAGE_INPUT_FILES) image_read(image, 0);
    image->call.op.callback = image_turn;
    image_turn(&image->call.op);
}

/* ---- The verbs ---------------------------------------------------------------------------------- */

/* What both verbs hand to the call. */
typedef struct image_request {
    uform_model_t *model;
    uform_executor_t *executor;
    uform_outputs_t outputs;
    uform_arena_t *arena;
    uform_encode_config_t const *config;
    uform_encoded_t *encoded;
    uform_outcome_t *outcome;
    uform_tape_t tape;
    image_input_t input;
    size_t const *heights, *widths;
    bool video; /* the tape holds clips, or their paths */
} image_request_t;

static uform_status_t image_submit(char const *entry, image_request_t const *request) {
    uform_outcome_t *outcome = request->outcome;
    char const *message = NULL;
    uform_status_t status =
        encode_check(request->model, request->executor, request->outputs, request->arena, request->config,
                     request->encoded, outcome, &request->tape, &message);
    if (status != UFORM_OK) return call_refuse(outcome, status, entry, message);
    if (request->video && !request->model->header.info.has_video)
        return call_refuse(outcome, UFORM_UNSUPPORTED, entry, "the model has no video tower");
    if (!request->model->header.info.has_image)
        return call_refuse(outcome, UFORM_UNSUPPORTED, entry, "the model has no image tower");
    if (request->video && !UFORM_WITH_FFMPEG)
        return call_refuse(outcome, UFORM_UNSUPPORTED, entry, "video needs FFmpeg, which this build lacks");
    if (request->video && request->model->device)
        return call_refuse(outcome, UFORM_UNSUPPORTED, entry, "video is not built on VRAM executors yet");
#if UFORM_WITH_CUDA
    if (request->model->device) { /* a VRAM model, on its own executor (encode_check saw to that) */
        vram_image_request_t vram = {
            .model = request->model,
            .executor = request->executor,
            .outputs = request->outputs,
            .arena = request->arena,
            .config = request->config,
            .encoded = request->encoded,
            .outcome = outcome,
            .tape = request->tape,
            .pixels = request->input == IMAGE_INPUT_PIXELS,
            .files = request->input == IMAGE_INPUT_FILES,
            .heights = request->heights,
            .widths = request->widths,
        };
        return vram_image_encode(entry, &vram);
    }
#endif
    if (!request->model->image) /* a model whose image tower is not prepared on the host */
        return call_refuse(outcome, UFORM_UNSUPPORTED, entry, "the model's image tower is not on the host");
    /* The arena first, then the executor: the call holds both until it is final. */
    uform_outcome_t own;
    call_t *call = NULL;
    status = call_open(request->executor, request->arena, outcome, &own, sizeof(image_call_t), entry, &call);
    if (status != UFORM_OK) return status;
    image_call_t *image = container_of(call, image_call_t, call);
    image->call.start = image_start;
    uform_encode_config_t const *config = request->config;
    uform_model_info_t const *info = &request->model->header.info;
    image->model = request->model;
    model_retain(image->model);
    image->arena = request->arena;
    image->input = request->input;
    image->tape = request->tape;
    image->heights = request->heights;
    image->widths = request->widths;
    image->outputs = request->outputs;
    image->scalar = config ? config->outputs_scalar : UFORM_F32;
    image->width = config && config->matryoshka ? config->matryoshka : info->dims;
    if (config) image->progress = config->progress;
    image->next_step = 1;
    image->stats_out = config ? config->stats : NULL;
    image->geometry = (image_geometry_t){
        .size = info->image.size,
        .patch = info->image.patch,
        .mean = {info->image.mean[0], info->image.mean[1], info->image.mean[2]},
        .std = {info->image.std[0], info->image.std[1], info->image.std[2]},
    };
    size_t side = info->image.size / info->image.patch;
    image->patches = side * side;
    image->video = request->video;
    image->frames = request->video ? info->video.frames : 1;
    image->vectors = request->video ? image->frames : image->patches;
    image->max_bytes = request->video ? UFORM_VIDEO_MAX_BYTES : UFORM_IMAGE_MAX_BYTES;
    image->started_ns = loop_now_ns();
    call_submit(&image->call);
    if (outcome) return UFORM_OK;
    status = call_wait(outcome_of(&own));
    if (status == UFORM_OK) uform_outcome_encoded(&own, request->encoded);
    return status;
}

UFORM_EXPORT uform_status_t uform_image_encode(uform_image_encode_args_t const *args) {
    static char const entry[] = "uform_image_encode";
    if (!args) return failed(UFORM_INVALID_ARGUMENT, entry, "args is NULL");
    if (args->source != UFORM_SOURCE_FILES && args->source != UFORM_SOURCE_MEMORY)
        return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry, "unknown source");
    image_request_t request = {
        .model = args->model,
        .executor = args->executor,
        .outputs = args->outputs,
        .arena = args->arena,
        .config = args->config,
        .encoded = args->encoded,
        .outcome = args->outcome,
        .tape = args->images,
        .input = args->source == UFORM_SOURCE_FILES ? IMAGE_INPUT_FILES : IMAGE_INPUT_MEMORY,
    };
    return image_submit(entry, &request);
}

UFORM_EXPORT uform_status_t uform_image_encode_pixels(uform_image_encode_pixels_args_t const *args) {
    static char const entry[] = "uform_image_encode_pixels";
    if (!args) return failed(UFORM_INVALID_ARGUMENT, entry, "args is NULL");
    if (args->pixels.count && (!args->heights || !args->widths))
        return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry, "heights or widths is NULL");
    image_request_t request = {
        .model = args->model,
        .executor = args->executor,
        .outputs = args->outputs,
        .arena = args->arena,
        .config = args->config,
        .encoded = args->encoded,
        .outcome = args->outcome,
        .tape = args->pixels,
        .input = IMAGE_INPUT_PIXELS,
        .heights = args->heights,
        .widths = args->widths,
    };
    return image_submit(entry, &request);
}

UFORM_EXPORT uform_status_t uform_video_encode(uform_video_encode_args_t const *args) {
    static char const entry[] = "uform_video_encode";
    if (!args) return failed(UFORM_INVALID_ARGUMENT, entry, "args is NULL");
    if (args->source != UFORM_SOURCE_FILES && args->source != UFORM_SOURCE_MEMORY)
        return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry, "unknown source");
    image_request_t request = {
        .model = args->model,
        .executor = args->executor,
        .outputs = args->outputs,
        .arena = args->arena,
        .config = args->config,
        .encoded = args->encoded,
        .outcome = args->outcome,
        .tape = args->videos,
        .input = args->source == UFORM_SOURCE_FILES ? IMAGE_INPUT_FILES : IMAGE_INPUT_MEMORY,
        .video = true,
    };
    return image_submit(entry, &request);
}
