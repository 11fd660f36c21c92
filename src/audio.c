/* The audio tower's verbs: audio_encode (files, or encoded sounds in memory) and audio_encode_samples.
 *
 * A call encodes its items in chunks of whole clips (about AUDIO_CHUNK_TOKENS tokens counted at the
 * model's longest clip, at least as many clips as the executor has threads, at most AUDIO_CHUNK_MAX),
 * one chunk per loop turn, as src/image.c does:
 *
 *   read     (files only) open -> statx -> read through the ring for every item of chunk k + 1,
 *            issued before chunk k is decoded and computed;
 *   prepare  the chunk's clips decoded (FFmpeg), downmixed, resampled, cut, and turned into log-mel
 *            patches in parallel over the executor's threads, each thread taking the next clip from a
 *            shared counter (audio_decode.h, audio_frontend.h);
 *   compute  the patch GEMM, class token and positions, the tower (bidirectional, no rotary), the
 *            projections, and the outputs in the arena.
 *
 * Clips have as many patches as their length gives (at most max_patches), so token vectors are packed:
 * item i owns rows [item_offsets[i], item_offsets[i + 1]), assigned in item order as chunks finish; the
 * arena holds room for the most every item could have. A failed item keeps its status, zero embedding
 * and state rows, no token vector, and takes no part in the tower; the others are encoded as if alone.
 *
 * Without FFmpeg only the verbs' validation is built, and they answer UFORM_UNSUPPORTED. */
#include <fcntl.h>
#include <math.h>
#include <stdalign.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tower.h"
#if UFORM_WITH_FFMPEG
#include "audio_decode.h"
#include "audio_frontend.h"
#endif

typedef enum audio_input {
    AUDIO_INPUT_SAMPLES = 0,
    AUDIO_INPUT_FILES,
    AUDIO_INPUT_MEMORY,
} audio_input_t;

#if UFORM_WITH_FFMPEG

#define AUDIO_CHUNK_TOKENS 2048
#define AUDIO_CHUNK_MAX    64
#define AUDIO_PATH_MAX     4096

typedef struct audio_call audio_call_t;

/* A file being read: one ring operation at a time (open, statx, read). Slots [0, chunk_items) serve
 * the even chunks, the next chunk_items the odd ones, so that chunk k + 1 is read while k computes. */
typedef struct audio_slot {
    loop_op_t op;
    audio_call_t *audio;
    size_t item;
    int fd;
    struct statx statx;
    uint8_t *buffer; /* the file's bytes; kept and grown across chunks */
    size_t capacity, size;
    char path[AUDIO_PATH_MAX];
} audio_slot_t;

/* One executor thread's FFT and buffers, made with its first clip and kept for the call. */
typedef struct audio_thread {
    bool ready;
    audio_spectrum_t spectrum;
    audio_pcm_t pcm; /* a decoded clip at its own rate */
    float *clip;     /* [reach]: the clip at the model's rate */
} audio_thread_t;

/* What a call holds outside the executor's call storage; freed when it ends. */
typedef struct audio_work {
    tower_linear_t
        patch; /* audio.patch packed for the kernels: [hidden, patch_frames * mels] with its bias */
    size_t packed_bytes;
    float *positions; /* [1 + max_patches, hidden]: audio.pos, with audio.cls added to row 0 */
    audio_frontend_t frontend;
    size_t *patches;    /* [items]: each prepared clip's patches (0 for a failed one) */
    uint8_t *truncated; /* [items]: the clip was longer than the model's reach */
    size_t threads_count;
    audio_thread_t *threads;
    size_t slots_count;
    audio_slot_t slots[];
} audio_work_t;

struct audio_call {
    call_t call;
    uform_model_t *model;
    uform_arena_t *arena;
    audio_input_t input;
    uform_tape_t tape;
    size_t rate; /* of the samples */
    uform_outputs_t outputs;
    uform_scalar_t scalar;
    size_t width; /* embedding and token-vector columns: dims or a matryoshka width */
    uform_progress_t progress;
    size_t next_step;
    uform_encode_stats_t *stats_out;
    uform_encode_stats_t stats;
    uint64_t started_ns, waiting_since_ns;
    uform_encoded_t encoded;
    uform_status_t *statuses;
    size_t *token_offsets;          /* [items + 1] when token vectors are asked, filled chunk by chunk */
    size_t token_rows;              /* token-vector rows assigned so far */
    size_t max_patches, row_floats; /* per clip; patch_frames * mels */
    size_t chunk_items, chunks, next_chunk;
    audio_work_t *work;
    size_t in_flight;       /* ring operations not final */
    size_t pending[2];      /* files of the even and of the odd chunk not read yet */
    bool waiting;           /* the turn of `next_chunk` waits for its files */
    uform_status_t failure; /* once set, nothing new starts and the call ends when in-flight work drains */
    char const *message;
};

_Static_assert(sizeof(audio_call_t) <= EXECUTOR_CALL_STORAGE, "audio_call_t outgrew the call storage");

/* ---- Outputs (as src/image.c writes them) -------------------------------------------------------- */

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

/* Zeroes row `row` of a view (a failed item's), with its I8 scale. */
static void output_zero(uform_view_t *view, size_t row) {
    if (!view->data) return;
    memset((unsigned char *)view->data + row * view->row_stride, 0, view->row_stride);
    if (view->scales) memset((float *)view->scales + row, 0, sizeof(float));
}

/* ---- The end ------------------------------------------------------------------------------------ */

static void audio_release_work(audio_call_t *audio) {
    audio_work_t *work = audio->work;
    if (!work) return;
    for (size_t i = 0; i < work->slots_count; ++i)
        free(work->slots[i].buffer);
    for (size_t t = 0; work->threads && t < work->threads_count; ++t) {
        audio_thread_t *thread = &work->threads[t];
        if (!thread->ready) continue;
        audio_spectrum_free(&thread->spectrum);
        free(thread->pcm.samples);
        free(thread->clip);
    }
    free(work->threads);
    free(work->patches);
    free(work->truncated);
    audio_frontend_free(&work->frontend);
    executor_deallocate(audio->call.executor, work->patch.packed, work->packed_bytes);
    free(work->patch.bias);
    free(work->positions);
    free(work);
    audio->work = NULL;
}

static void audio_end(audio_call_t *audio) {
    uform_status_t status = audio->failure;
    for (size_t item = 0; item < audio->tape.count && audio->statuses; ++item)
        audio->stats.failed += audio->statuses[item] != UFORM_OK;
    audio->stats.total_ns = loop_now_ns() - audio->started_ns;
    if (audio->stats_out) *audio->stats_out = audio->stats;
    if (status == UFORM_OK) {
        audio->encoded.token_vectors.rows = audio->token_rows;
        audio->call.outcome->product = OUTCOME_PRODUCT_ENCODED;
        audio->call.outcome->encoded = audio->encoded;
    }
    audio_release_work(audio);
    arena_end(audio->arena);
    uform_model_free(audio->model);
    call_finish(&audio->call, status, audio->message);
}

/* Records the first failure; the call ends once nothing is in flight. */
static void audio_stop(audio_call_t *audio, uform_status_t status, char const *message) {
    if (audio->failure != UFORM_OK) return;
    audio->failure = status;
    audio->message = message;
}

static void audio_settle(audio_call_t *audio) {
    if (audio->in_flight == 0) audio_end(audio);
}

static void audio_turn(loop_op_t *op);

/* ---- Reading files through the ring (as src/image.c reads them) ---------------------------------- */

static audio_slot_t *audio_slot(audio_call_t *audio, size_t item) {
    size_t set = (item / audio->chunk_items) % 2;
    return &audio->work->slots[set * audio->chunk_items + item % audio->chunk_items];
}

/* A file is read, or failed: the turn waiting for it may go on. */
static void slot_done(audio_slot_t *slot, uform_status_t status) {
    audio_call_t *audio = slot->audio;
    if (slot->fd >= 0) close(slot->fd);
    slot->fd = -1;
    if (status != UFORM_OK) audio->statuses[slot->item] = status;
    audio->pending[(slot->item / audio->chunk_items) % 2]--;
    if (audio->failure != UFORM_OK) {
        audio_settle(audio);
        return;
    }
    if (audio->waiting && audio->pending[audio->next_chunk % 2] == 0) {
        audio->waiting = false;
        audio->stats.read_ns += loop_now_ns() - audio->waiting_since_ns;
        audio_turn(&audio->call.op);
    }
}

/* Every completion lands here first: one operation fewer in flight, and a stopping call goes no
 * further with this file. */
static bool slot_landed(audio_slot_t *slot) {
    slot->audio->in_flight--;
    if (slot->audio->failure == UFORM_OK) return true;
    slot_done(slot, UFORM_OK);
    return false;
}

static void slot_read(loop_op_t *op) {
    audio_slot_t *slot = container_of(op, audio_slot_t, op);
    if (!slot_landed(slot)) return;
    if (op->result < 0) {
        slot_done(slot, UFORM_IO);
        return;
    }
    slot->size = (size_t)op->result; /* short only when the file shrank: the demuxer sees the rest */
    slot->audio->stats.bytes += slot->size;
    slot_done(slot, UFORM_OK);
}

static void slot_statted(loop_op_t *op) {
    audio_slot_t *slot = container_of(op, audio_slot_t, op);
    if (!slot_landed(slot)) return;
    /* Opened without blocking (a FIFO would wait for a writer); a regular file reads blocking. */
    if (op->result < 0 || !S_ISREG(slot->statx.stx_mode) || fcntl(slot->fd, F_SETFL, 0) != 0) {
        slot_done(slot, UFORM_IO);
        return;
    }
    uint64_t size = slot->statx.stx_size;
    if (size == 0 || size > UFORM_AUDIO_MAX_BYTES) {
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
    slot->audio->in_flight++;
    loop_read(slot->audio->call.executor->loop, &slot->op, slot->fd, slot->buffer, (size_t)size, 0);
}

static void slot_opened(loop_op_t *op) {
    audio_slot_t *slot = container_of(op, audio_slot_t, op);
    if (op->result >= 0) slot->fd = (int)op->result;
    if (!slot_landed(slot)) return;
    if (op->result < 0) {
        slot_done(slot, UFORM_IO);
        return;
    }
    slot->op.callback = slot_statted;
    slot->audio->in_flight++;
    loop_statx(slot->audio->call.executor->loop, &slot->op, slot->fd, &slot->statx);
}

/* Opens every file of `chunk`. A path that is empty or holds a NUL byte fails at once. */
static void audio_read(audio_call_t *audio, size_t chunk) {
    size_t first = chunk * audio->chunk_items, last = first + audio->chunk_items;
    if (last > audio->tape.count) last = audio->tape.count;
    for (size_t item = first; item < last; ++item) {
        audio_slot_t *slot = audio_slot(audio, item);
        slot->audio = audio;
        slot->item = item;
        slot->fd = -1;
        slot->size = 0;
        size_t length = audio->tape.offsets[item + 1] - audio->tape.offsets[item];
        char const *path = length ? (char const *)audio->tape.data + audio->tape.offsets[item] : NULL;
        if (length == 0 || memchr(path, 0, length)) {
            audio->statuses[item] = UFORM_INVALID_ARGUMENT;
            continue;
        }
        if (length >= AUDIO_PATH_MAX) { /* the kernel would answer ENAMETOOLONG */
            audio->statuses[item] = UFORM_IO;
            continue;
        }
        memcpy(slot->path, path, length);
        slot->path[length] = '\0';
        slot->op.callback = slot_opened;
        audio->pending[chunk % 2]++;
        audio->in_flight++;
        loop_open(audio->call.executor->loop, &slot->op, slot->path, O_RDONLY | O_NONBLOCK);
    }
}

/* ---- Preparing clips, in parallel --------------------------------------------------------------- */

typedef struct prepare_job {
    audio_call_t *audio;
    size_t first, count;
    float *rows; /* [count, max_patches, patch_frames * mels]: clip `index` from row index * max_patches */
    _Atomic size_t next;
} prepare_job_t;

/* A thread's FFT and buffers, on its first clip. */
static uform_status_t thread_ready(audio_thread_t *thread, audio_frontend_t const *frontend) {
    if (thread->ready) return UFORM_OK;
    uform_status_t status = audio_spectrum_init(&thread->spectrum, frontend);
    if (status != UFORM_OK) return status;
    thread->clip = malloc(frontend->reach * sizeof(float) + sizeof(float));
    if (!thread->clip) {
        audio_spectrum_free(&thread->spectrum);
        return UFORM_OUT_OF_MEMORY;
    }
    thread->ready = true;
    return UFORM_OK;
}

/* One clip's patch rows, from its samples, its file's bytes or its encoded bytes in the tape. Bad
 * samples answer UFORM_INVALID_ARGUMENT, bad sounds UFORM_FORMAT. */
static uform_status_t audio_prepare(audio_call_t *audio, audio_thread_t *thread, size_t item, float *rows) {
    audio_work_t *work = audio->work;
    audio_frontend_t const *frontend = &work->frontend;
    uform_status_t status = thread_ready(thread, frontend);
    if (status != UFORM_OK) return status;
    size_t begin = audio->tape.offsets[item], span = audio->tape.offsets[item + 1] - begin;
    float const *samples;
    size_t length, rate, full; /* samples at `rate`, and how many the whole clip has at the model's rate */
    uform_status_t bad;
    if (audio->input == AUDIO_INPUT_SAMPLES) {
        if (span > UFORM_AUDIO_MAX_SAMPLES) return UFORM_INVALID_ARGUMENT;
        samples = span ? (float const *)audio->tape.data + begin : NULL;
        for (size_t i = 0; i < span; ++i)
            if (!isfinite(samples[i])) return UFORM_INVALID_ARGUMENT;
        rate = audio->rate;
        full = audio_resampled_length(frontend, span, rate);
        size_t needed = audio_input_needed(frontend, rate);
        length = span < needed ? span : needed;
        bad = UFORM_INVALID_ARGUMENT;
    } else {
        uint8_t const *bytes = span ? (uint8_t const *)audio->tape.data + begin : NULL;
        if (audio->input == AUDIO_INPUT_FILES) {
            audio_slot_t const *slot = audio_slot(audio, item);
            bytes = slot->buffer;
            span = slot->size;
        }
        if (span > UFORM_AUDIO_MAX_BYTES) return UFORM_FORMAT;
        status = audio_decode(bytes, span, frontend, &thread->pcm);
        if (status != UFORM_OK) return status;
        if (thread->pcm.length == 0) return UFORM_FORMAT; /* a zero-length clip */
        samples = thread->pcm.samples;
        length = thread->pcm.length;
        rate = thread->pcm.rate;
        full = thread->pcm.more ? SIZE_MAX : audio_resampled_length(frontend, length, rate);
        bad = UFORM_FORMAT;
    }
    size_t const kept = full < frontend->reach ? full : frontend->reach;
    size_t patches = audio_frames(frontend, kept) / frontend->patch_frames;
    if (patches > frontend->max_patches) patches = frontend->max_patches;
    if (patches == 0) return bad;
    size_t const frames = patches * frontend->patch_frames,
                 used = frontend->window + (frames - 1) * frontend->hop;
    status = audio_resample(frontend, samples, length, rate, thread->clip, used);
    if (status != UFORM_OK) return status == UFORM_INVALID_ARGUMENT ? bad : status;
    audio_log_mel(frontend, &thread->spectrum, thread->clip, frames, rows);
    work->patches[item] = patches;
    work->truncated[item] = full > frontend->reach;
    return UFORM_OK;
}

static void prepare_work(void *context, size_t thread) {
    prepare_job_t *job = context;
    audio_call_t *audio = job->audio;
    audio_work_t *work = audio->work;
    if (thread >= work->threads_count) return; /* a pool grown since the call began: the others cover it */
    for (;;) {
        size_t index = atomic_fetch_add_explicit(&job->next, 1, memory_order_relaxed);
        if (index >= job->count) return;
        size_t item = job->first + index;
        float *rows = job->rows + index * audio->max_patches * audio->row_floats;
        uform_status_t status = audio->statuses[item]; /* a file that could not be read */
        if (status == UFORM_OK) status = audio_prepare(audio, &work->threads[thread], item, rows);
        if (status != UFORM_OK) {
            audio->statuses[item] = status;
            work->patches[item] = 0;
        }
    }
}

/* ---- Compute ------------------------------------------------------------------------------------ */

/* The chunk's scratch: the tower's; x [tokens, hidden]; patch rows [count * max_patches, patch_frames *
 * mels]; rows [count * max_patches, hidden] (patch embeddings, then the states to project); their
 * projections [count * max_patches, width]; token offsets [count + 1] and the items kept [count]. */
typedef struct audio_scratch {
    void *tower;
    float *x, *patches, *rows, *projected;
    size_t *offsets, *items;
} audio_scratch_t;

static bool audio_scratch(audio_call_t *audio, size_t count, audio_scratch_t *scratch) {
    tower_t const *tower = audio->model->audio;
    size_t rows = count * audio->max_patches, tokens = rows + count;
    size_t sizes[] = {
        round_up_64(tower_scratch_bytes(tower, tokens)),
        round_up_64(tokens * tower->hidden * sizeof(float)),
        round_up_64(rows * audio->row_floats * sizeof(float)),
        round_up_64(rows * tower->hidden * sizeof(float)),
        round_up_64(rows * tower->dims * sizeof(float)),
        round_up_64((count + 1) * sizeof(size_t)),
        round_up_64(count * sizeof(size_t)),
    };
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i)
        total += sizes[i];
    char *base = executor_scratch(audio->call.executor, total);
    if (!base) return false;
    scratch->tower = base;
    scratch->x = (float *)(void *)(base += sizes[0]);
    scratch->patches = (float *)(void *)(base += sizes[1]);
    scratch->rows = (float *)(void *)(base += sizes[2]);
    scratch->projected = (float *)(void *)(base += sizes[3]);
    scratch->offsets = (size_t *)(void *)(base += sizes[4]);
    scratch->items = (size_t *)(void *)(base + sizes[5]);
    return true;
}

/* Projects `count` rows of final states in scratch->rows, normalizes them at the output width, and
 * writes row r to row targets[r] of `view` (targets NULL: row first + r). */
static void audio_project(audio_call_t *audio, audio_scratch_t const *scratch, size_t count,
                          size_t const *targets, size_t first, uform_view_t *view) {
    tower_t const *tower = audio->model->audio;
    if (count == 0) return;
    tower_linear(tower, audio->call.executor, &tower->proj, scratch->rows, tower->hidden, count, audio->width,
                 scratch->projected, audio->width);
    uint64_t converting = loop_now_ns();
    for (size_t r = 0; r < count; ++r) {
        float *values = scratch->projected + r * audio->width;
        tower->kernels->normalize(values, audio->width);
        output_row(tower->kernels, view, targets ? targets[r] : first + r, values);
    }
    audio->stats.convert_ns += loop_now_ns() - converting;
}

/* Prepares, then encodes, the clips of one chunk. */
static void audio_chunk(audio_call_t *audio, size_t chunk) {
    tower_t const *tower = audio->model->audio;
    kernels_t const *kernels = tower->kernels;
    uform_executor_t *executor = audio->call.executor;
    audio_work_t const *work = audio->work;
    size_t const hidden = tower->hidden, max_patches = audio->max_patches, row_floats = audio->row_floats;
    size_t first = chunk * audio->chunk_items, last = first + audio->chunk_items;
    if (last > audio->tape.count) last = audio->tape.count;
    size_t const count = last - first;
    audio_scratch_t scratch;
    if (!audio_scratch(audio, count, &scratch)) {
        audio_stop(audio, UFORM_OUT_OF_MEMORY, "cannot allocate the executor's scratch");
        return;
    }

    uint64_t preparing = loop_now_ns();
    prepare_job_t job = {.audio = audio, .first = first, .count = count, .rows = scratch.patches};
    atomic_init(&job.next, 0);
    executor_for_threads(executor, prepare_work, &job);
    uint64_t computing = loop_now_ns();
    audio->stats.decode_ns += computing - preparing;

    /* The kept clips' patch rows packed end to end (moves only go backwards), then embedded. */
    size_t kept = 0, packed = 0;
    for (size_t index = 0; index < count; ++index) {
        size_t item = first + index, patches = work->patches[item];
        audio->stats.truncated += work->truncated[item];
        if (audio->statuses[item] != UFORM_OK) continue;
        scratch.items[kept++] = item;
        memmove(scratch.patches + packed * row_floats, scratch.patches + index * max_patches * row_floats,
                patches * row_floats * sizeof(float));
        packed += patches;
    }
    tower_linear(tower, executor, &work->patch, scratch.patches, row_floats, packed, hidden, scratch.rows,
                 hidden);

    /* x: per kept clip, the class token, then its patches, each plus its position.  [tokens, hidden] */
    size_t row = 0, patch_row = 0;
    for (size_t q = 0; q < kept; ++q) {
        size_t patches = work->patches[scratch.items[q]];
        scratch.offsets[q] = row;
        memcpy(scratch.x + row * hidden, work->positions, hidden * sizeof(float));
        for (size_t p = 0; p < patches; ++p) {
            float *x = scratch.x + (row + 1 + p) * hidden;
            float const *embedded = scratch.rows + (patch_row + p) * hidden;
            float const *position = work->positions + (1 + p) * hidden;
            for (size_t h = 0; h < hidden; ++h)
                x[h] = embedded[h] + position[h];
        }
        row += 1 + patches;
        patch_row += patches;
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

    /* The class token's state is the clip's; its projection the embedding; the patches' projections
     * its token vectors, packed in item order. */
    uform_encoded_t *encoded = &audio->encoded;
    for (size_t q = 0; q < kept; ++q) {
        float const *state = scratch.x + scratch.offsets[q] * hidden;
        memcpy(scratch.rows + q * hidden, state, hidden * sizeof(float));
        if (audio->outputs & UFORM_OUTPUT_STATES)
            output_row(kernels, &encoded->states, scratch.items[q], state);
    }
    if (audio->outputs & UFORM_OUTPUT_EMBEDDINGS)
        audio_project(audio, &scratch, kept, scratch.items, 0, &encoded->embeddings);
    if (audio->outputs & UFORM_OUTPUT_TOKEN_VECTORS) {
        for (size_t item = first; item < last; ++item) {
            audio->token_offsets[item] = audio->token_rows;
            audio->token_rows += work->patches[item];
        }
        audio->token_offsets[last] = audio->token_rows;
        for (size_t q = 0, packed_row = 0; q < kept; ++q) {
            size_t patches = work->patches[scratch.items[q]];
            memcpy(scratch.rows + packed_row * hidden, scratch.x + (scratch.offsets[q] + 1) * hidden,
                   patches * hidden * sizeof(float));
            packed_row += patches;
        }
        audio_project(audio, &scratch, packed, NULL, audio->token_offsets[first], &encoded->token_vectors);
    }
    for (size_t item = first; item < last; ++item) {
        if (audio->statuses[item] == UFORM_OK) continue;
        output_zero(&encoded->embeddings, item);
        output_zero(&encoded->states, item);
    }
    audio->stats.compute_ns += loop_now_ns() - computing;
}

/* One chunk per loop turn; with files, it first waits for its reads and issues the next chunk's. */
static void audio_turn(loop_op_t *op) {
    audio_call_t *audio = container_of(op, audio_call_t, call.op);
    size_t chunk = audio->next_chunk;
    if (audio->input == AUDIO_INPUT_FILES) {
        if (audio->pending[chunk % 2] != 0) {
            audio->waiting = true;
            audio->waiting_since_ns = loop_now_ns();
            return;
        }
        if (chunk + 1 < audio->chunks) audio_read(audio, chunk + 1);
    }
    audio_chunk(audio, chunk);
    audio->next_chunk = ++chunk;
    size_t done =
        chunk * audio->chunk_items < audio->tape.count ? chunk * audio->chunk_items : audio->tape.count;
    if (audio->failure == UFORM_OK &&
        progress_report(&audio->progress, &audio->next_step, done, audio->tape.count))
        audio_stop(audio, UFORM_CANCELLED, "cancelled by the progress handler");
    if (audio->failure != UFORM_OK || chunk == audio->chunks) {
        audio_settle(audio);
        return;
    }
    loop_post(audio->call.executor->loop, &audio->call.op);
}

/* ---- The start ---------------------------------------------------------------------------------- */

/* The most patches item `item` can have: from its length for samples, max_patches for encoded sounds. */
static size_t audio_patches_bound(audio_call_t const *audio, size_t item) {
    audio_frontend_t const *frontend = &audio->work->frontend;
    if (audio->input != AUDIO_INPUT_SAMPLES) return frontend->max_patches;
    size_t span = audio->tape.offsets[item + 1] - audio->tape.offsets[item];
    size_t full = audio_resampled_length(frontend, span, audio->rate);
    size_t patches =
        audio_frames(frontend, full < frontend->reach ? full : frontend->reach) / frontend->patch_frames;
    return patches < frontend->max_patches ? patches : frontend->max_patches;
}

/* Every output in the arena: statuses, embeddings, states, and room for every token vector. */
static bool audio_outputs(audio_call_t *audio) {
    uform_arena_t *arena = audio->arena;
    size_t items = audio->tape.count;
    uform_encoded_t *encoded = &audio->encoded;
    memset(encoded, 0, sizeof *encoded);
    encoded->items = items;
    audio->statuses = arena_allocate(arena, items * sizeof *audio->statuses, 16);
    if (!audio->statuses) return false;
    memset(audio->statuses, 0, items * sizeof *audio->statuses);
    encoded->statuses = audio->statuses;
    if ((audio->outputs & UFORM_OUTPUT_EMBEDDINGS) &&
        !output_view(arena, items, audio->width, audio->scalar, &encoded->embeddings))
        return false;
    if ((audio->outputs & UFORM_OUTPUT_STATES) &&
        !output_view(arena, items, audio->model->audio->hidden, audio->scalar, &encoded->states))
        return false;
    if (audio->outputs & UFORM_OUTPUT_TOKEN_VECTORS) {
        size_t rows = 0;
        for (size_t item = 0; item < items; ++item)
            if (__builtin_add_overflow(rows, audio_patches_bound(audio, item), &rows)) return false;
        size_t bytes = 0; /* what output_view will ask for, checked here for overflow */
        if (__builtin_mul_overflow(rows, audio->width * uform_scalar_size(audio->scalar), &bytes))
            return false;
        (void)bytes;
        if (!output_view(arena, rows, audio->width, audio->scalar, &encoded->token_vectors)) return false;
        audio->token_offsets = arena_allocate(arena, (items + 1) * sizeof(size_t), 16);
        if (!audio->token_offsets) return false;
        memset(audio->token_offsets, 0, (items + 1) * sizeof(size_t));
        encoded->token_vectors.item_offsets = audio->token_offsets;
        encoded->token_vectors.items = items;
    }
    return true;
}

/* The front end, the patch layer packed for the tower's kernels, its bias, the positions with the
 * class token, and the per-item and per-thread state. */
static audio_work_t *audio_work(audio_call_t *audio, size_t slots) {
    tower_t const *tower = audio->model->audio;
    kernels_t const *kernels = tower->kernels;
    size_t const hidden = tower->hidden, inputs = audio->row_floats, items = audio->tape.count;
    audio_work_t *work = calloc(1, sizeof *work + slots * sizeof(audio_slot_t));
    if (!work) return NULL;
    audio->work = work;
    work->slots_count = slots;
    if (audio_frontend_init(&work->frontend, &audio->model->header.info) != UFORM_OK) return NULL;
    work->threads_count = audio->call.executor->threads ? audio->call.executor->threads : 1;
    work->threads = calloc(work->threads_count, sizeof *work->threads);
    work->patches = calloc(items, sizeof *work->patches);
    work->truncated = calloc(items, sizeof *work->truncated);
    uint16_t const *weight = model_tensor(audio->model, "audio.patch.weight", NULL);
    uint16_t const *bias = model_tensor(audio->model, "audio.patch.bias", NULL);
    uint16_t const *cls = model_tensor(audio->model, "audio.cls", NULL);
    uint16_t const *pos = model_tensor(audio->model, "audio.pos", NULL);
    work->packed_bytes = kernels->gemm_packed_size(hidden, inputs);
    work->patch.packed = executor_allocate(audio->call.executor, work->packed_bytes);
    work->patch.bias = malloc(hidden * sizeof(float));
    work->patch.n = hidden;
    work->patch.k = inputs;
    work->positions = malloc((1 + audio->max_patches) * hidden * sizeof(float));
    float *class_token = malloc(hidden * sizeof(float));
    if (!work->threads || !work->patches || !work->truncated || !work->patch.packed || !work->patch.bias ||
        !work->positions || !class_token) {
        free(class_token);
        return NULL;
    }
    kernels->gemm_pack(work->patch.packed, weight, hidden, inputs);
    kernels->bf16_to_f32(work->patch.bias, bias, hidden);
    kernels->bf16_to_f32(work->positions, pos, (1 + audio->max_patches) * hidden);
    kernels->bf16_to_f32(class_token, cls, hidden);
    for (size_t h = 0; h < hidden; ++h)
        work->positions[h] += class_token[h];
    free(class_token);
    return work;
}

static void audio_start(call_t *call) {
    audio_call_t *audio = container_of(call, audio_call_t, call);
    size_t items = audio->tape.count;
    audio->stats.items = items;
    size_t span = audio->tape.offsets[items] - audio->tape.offsets[0];
    if (audio->input == AUDIO_INPUT_SAMPLES) audio->stats.bytes = span * sizeof(float);
    if (audio->input == AUDIO_INPUT_MEMORY) audio->stats.bytes = span;

    /* Chunks: about AUDIO_CHUNK_TOKENS tokens of the longest clips, at least one clip per thread, at
     * most the batch. */
    size_t chunk_items = AUDIO_CHUNK_TOKENS / (1 + audio->max_patches);
    if (chunk_items < call->executor->threads) chunk_items = call->executor->threads;
    if (chunk_items > AUDIO_CHUNK_MAX) chunk_items = AUDIO_CHUNK_MAX;
    if (chunk_items > items) chunk_items = items;
    if (chunk_items == 0) chunk_items = 1;
    audio->chunk_items = chunk_items;
    audio->chunks = (items + chunk_items - 1) / chunk_items;

    size_t slots = audio->input == AUDIO_INPUT_FILES ? 2 * chunk_items : 0;
    if (!audio_work(audio, slots)) {
        audio_stop(audio, UFORM_OUT_OF_MEMORY, "cannot allocate the front end and the patch layer");
    } else if (!audio_outputs(audio)) {
        audio_stop(audio, UFORM_OUT_OF_MEMORY, "cannot allocate the outputs in the arena");
    }
    if (audio->failure != UFORM_OK) {
        audio_end(audio);
        return;
    }
    if (audio->input == AUDIO_INPUT_FILES) audio_read(audio, 0);
    audio->call.op.callback = audio_turn;
    audio_turn(&audio->call.op);
}

#endif /* UFORM_WITH_FFMPEG */

/* ---- The verbs ---------------------------------------------------------------------------------- */

/* What both verbs hand to the call. */
typedef struct audio_request {
    uform_model_t *model;
    uform_executor_t *executor;
    uform_outputs_t outputs;
    uform_arena_t *arena;
    uform_encode_config_t const *config;
    uform_encoded_t *encoded;
    uform_outcome_t *outcome;
    uform_tape_t tape;
    audio_input_t input;
    size_t rate;
} audio_request_t;

static uform_status_t audio_submit(char const *entry, audio_request_t const *request) {
    uform_outcome_t *outcome = request->outcome;
    char const *message = NULL;
    uform_status_t status =
        encode_check(request->model, request->executor, request->outputs, request->arena, request->config,
                     request->encoded, outcome, &request->tape, &message);
    if (status != UFORM_OK) return call_refuse(outcome, status, entry, message);
    if (!request->model->header.info.has_audio)
        return call_refuse(outcome, UFORM_UNSUPPORTED, entry, "the model has no audio tower");
#if !UFORM_WITH_FFMPEG
    return call_refuse(outcome, UFORM_UNSUPPORTED, entry,
                       "built without FFmpeg: sounds cannot be decoded, resampled or transformed");
#else
    if (!request->model->audio) /* a VRAM model: its audio tower is not prepared on the host */
        return call_refuse(
            outcome, UFORM_UNSUPPORTED, entry,
            "the audio tower runs on host executors: load the model with uform_model_load_ram");
    /* The arena first, then the executor: the call holds both until it is final. */
    uform_outcome_t own;
    call_t *call = NULL;
    status = call_open(request->executor, request->arena, outcome, &own, sizeof(audio_call_t), entry, &call);
    if (status != UFORM_OK) return status;
    audio_call_t *audio = container_of(call, audio_call_t, call);
    audio->call.start = audio_start;
    uform_encode_config_t const *config = request->config;
    uform_model_info_t const *info = &request->model->header.info;
    audio->model = request->model;
    model_retain(audio->model);
    audio->arena = request->arena;
    audio->input = request->input;
    audio->tape = request->tape;
    audio->rate = request->rate;
    audio->outputs = request->outputs;
    audio->scalar = config ? config->outputs_scalar : UFORM_F32;
    audio->width = config && config->matryoshka ? config->matryoshka : info->dims;
    if (config) audio->progress = config->progress;
    audio->next_step = 1;
    audio->stats_out = config ? config->stats : NULL;
    audio->max_patches = info->audio.max_patches;
    audio->row_floats = info->audio.patch_frames * info->audio.mels;
    audio->started_ns = loop_now_ns();
    call_submit(&audio->call);
    if (outcome) return UFORM_OK;
    status = call_wait(outcome_of(&own));
    if (status == UFORM_OK) uform_outcome_encoded(&own, request->encoded);
    return status;
#endif
}

UFORM_EXPORT uform_status_t uform_audio_encode(uform_audio_encode_args_t const *args) {
    static char const entry[] = "uform_audio_encode";
    if (!args) return failed(UFORM_INVALID_ARGUMENT, entry, "args is NULL");
    if (args->source != UFORM_SOURCE_FILES && args->source != UFORM_SOURCE_MEMORY)
        return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry, "unknown source");
    audio_request_t request = {
        .model = args->model,
        .executor = args->executor,
        .outputs = args->outputs,
        .arena = args->arena,
        .config = args->config,
        .encoded = args->encoded,
        .outcome = args->outcome,
        .tape = args->sounds,
        .input = args->source == UFORM_SOURCE_FILES ? AUDIO_INPUT_FILES : AUDIO_INPUT_MEMORY,
    };
    return audio_submit(entry, &request);
}

UFORM_EXPORT uform_status_t uform_audio_encode_samples(uform_audio_encode_samples_args_t const *args) {
    static char const entry[] = "uform_audio_encode_samples";
    if (!args) return failed(UFORM_INVALID_ARGUMENT, entry, "args is NULL");
    if (args->rate == 0) return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry, "rate is 0");
    if (args->rate > UFORM_AUDIO_MAX_RATE)
        return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry, "rate over UFORM_AUDIO_MAX_RATE");
    if ((uintptr_t)args->samples.data % alignof(float))
        return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry,
                           "samples are not aligned to a float");
    audio_request_t request = {
        .model = args->model,
        .executor = args->executor,
        .outputs = args->outputs,
        .arena = args->arena,
        .config = args->config,
        .encoded = args->encoded,
        .outcome = args->outcome,
        .tape = args->samples,
        .input = AUDIO_INPUT_SAMPLES,
        .rate = args->rate,
    };
    return audio_submit(entry, &request);
}
