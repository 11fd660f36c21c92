/* The audio tower's verbs on host executors: audio_encode (files, or encoded sounds in memory) and
 * audio_encode_samples, behind their front doors (src/encode/verbs.c), which checked the arguments.
 *
 * A call encodes its items in chunks of whole clips (about AUDIO_CHUNK_TOKENS tokens counted at the
 * model's longest clip, at least as many clips as the executor has threads, at most AUDIO_CHUNK_MAX),
 * one chunk per loop turn, as src/encode/image.c does (src/encode/media_read.h runs the chunks and reads the
 * files):
 *
 *   read     (files only) open -> statx -> read through the ring for every item of chunk k + 2,
 *            issued while chunk k is computed;
 *   prepare  the chunk's clips decoded (FFmpeg), downmixed, resampled, cut, and turned into log-mel
 *            patches (audio_decode.h, audio_frontend.h): on a RAM executor of 2 threads or more, by one
 *            lent worker while the previous chunk is computed on the others; otherwise, and for the
 *            first chunk, on the chunk's turn in parallel over the executor's threads, each thread
 *            taking the next clip from a shared counter;
 *   compute  the patch GEMM, class token and positions, the tower (bidirectional, no rotary), the
 *            projections, and the outputs in the arena.
 *
 * Clips have as many patches as their length gives (at most max_patches), so token vectors are packed:
 * item i owns rows [item_offsets[i], item_offsets[i + 1]), assigned in item order as chunks finish; the
 * arena holds room for the most every item could have. A failed item keeps its status, zero embedding
 * and state rows, no token vector, and takes no part in the tower; the others are encoded as if alone.
 *
 * Without FFmpeg none of this is built, and the verbs answer UFORM_UNSUPPORTED. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "call.h"
#include "kernels.h"
#include "model.h"
#include "tower.h"
#include "verbs.h"
#if UFORM_WITH_FFMPEG
#include "audio.h"
#endif

#if UFORM_WITH_FFMPEG

#define AUDIO_CHUNK_TOKENS 2048
#define AUDIO_CHUNK_MAX    64

typedef struct audio_call {
    call_t call;
    encode_call_t encode;
    media_run_t run;
    audio_input_t input;
    size_t rate;                    /* of the samples */
    size_t *token_offsets;          /* [items + 1] when token vectors are asked, filled chunk by chunk */
    size_t token_rows;              /* token-vector rows assigned so far */
    size_t max_patches, row_floats; /* per clip; patch_frames * mels */
    audio_clips_t *work;
} audio_call_t;

_Static_assert(sizeof(audio_call_t) <= EXECUTOR_CALL_STORAGE, "audio_call_t outgrew the call storage");

/* ---- The end ------------------------------------------------------------------------------------ */

static void audio_release_work(audio_call_t *audio) {
    media_close(&audio->run);
    audio_clips_free(audio->work);
    audio->work = NULL;
}

static void audio_end(media_run_t *run) {
    audio_call_t *audio = container_of(run, audio_call_t, run);
    audio->encode.stats.total_ns = loop_now_ns() - audio->encode.started_ns;
    audio_release_work(audio);
    if (audio->encode.failure == UFORM_OK) audio->encode.encoded.token_vectors.rows = audio->token_rows;
    encode_end(&audio->encode, audio->call.outcome, audio->encode.failure);
    call_finish(&audio->call, audio->encode.failure, audio->encode.message);
}

/* ---- Preparing clips ---------------------------------------------------------------------------- */

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

audio_clips_t *audio_clips_new(audio_input_t input, size_t rate, uform_model_info_t const *info, size_t items,
                               size_t threads) {
    audio_clips_t *clips = calloc(1, sizeof *clips);
    if (!clips) return NULL;
    clips->input = input;
    clips->rate = rate;
    clips->threads_count = threads ? threads : 1;
    clips->threads = calloc(clips->threads_count, sizeof *clips->threads);
    clips->patches = calloc(items, sizeof *clips->patches);
    clips->truncated = calloc(items, sizeof *clips->truncated);
    if (!clips->threads || !clips->patches || !clips->truncated ||
        audio_frontend_init(&clips->frontend, info) != UFORM_OK) {
        audio_clips_free(clips);
        return NULL;
    }
    clips->ready = true;
    return clips;
}

void audio_clips_free(audio_clips_t *clips) {
    if (!clips) return;
    for (size_t t = 0; clips->threads && t < clips->threads_count; ++t) {
        audio_thread_t *thread = &clips->threads[t];
        if (!thread->ready) continue;
        audio_spectrum_free(&thread->spectrum);
        free(thread->pcm.samples);
        free(thread->clip);
    }
    free(clips->threads);
    free(clips->patches);
    free(clips->truncated);
    if (clips->ready) audio_frontend_free(&clips->frontend);
    free(clips);
}

/* The samples of clip `item` at their rate, and how many the whole clip has at the model's (SIZE_MAX:
 * more than it reads), from its samples or its decoded bytes; `bad` is the status of a clip too short. */
static uform_status_t clip_samples(audio_clips_t *clips, audio_thread_t *thread, uform_tape_t const *tape,
                                   media_run_t const *run, size_t item, float const **samples, size_t *length,
                                   size_t *rate, size_t *full, uform_status_t *bad) {
    audio_frontend_t const *frontend = &clips->frontend;
    size_t begin = tape->offsets[item], span = tape->offsets[item + 1] - begin;
    if (clips->input == AUDIO_INPUT_SAMPLES) {
        if (span > UFORM_AUDIO_MAX_SAMPLES) return UFORM_INVALID_ARGUMENT;
        *samples = span ? (float const *)tape->data + begin : NULL;
        for (size_t i = 0; i < span; ++i)
            if (!isfinite((*samples)[i])) return UFORM_INVALID_ARGUMENT;
        *rate = clips->rate;
        *full = audio_resampled_length(frontend, span, *rate);
        size_t needed = audio_input_needed(frontend, *rate);
        *length = span < needed ? span : needed;
        *bad = UFORM_INVALID_ARGUMENT;
        return UFORM_OK;
    }
    uint8_t const *bytes = span ? (uint8_t const *)tape->data + begin : NULL;
    if (clips->input == AUDIO_INPUT_FILES) bytes = media_file(run, item, &span);
    if (span > UFORM_AUDIO_MAX_BYTES) return UFORM_FORMAT;
    uform_status_t status = audio_decode(bytes, span, frontend, &thread->pcm);
    if (status != UFORM_OK) return status;
    if (thread->pcm.length == 0) return UFORM_FORMAT; /* a zero-length clip */
    *samples = thread->pcm.samples;
    *length = thread->pcm.length;
    *rate = thread->pcm.rate;
    *full = thread->pcm.more ? SIZE_MAX : audio_resampled_length(frontend, *length, *rate);
    *bad = UFORM_FORMAT;
    return UFORM_OK;
}

uform_status_t audio_clips_prepare(audio_clips_t *clips, uform_tape_t const *tape, media_run_t const *run,
                                   size_t thread_index, size_t item, float *rows) {
    audio_frontend_t const *frontend = &clips->frontend;
    audio_thread_t *thread = &clips->threads[thread_index];
    uform_status_t status = thread_ready(thread, frontend), bad = UFORM_FORMAT;
    float const *samples = NULL;
    size_t length = 0, rate = 0, full = 0;
    if (status == UFORM_OK)
        status = clip_samples(clips, thread, tape, run, item, &samples, &length, &rate, &full, &bad);
    if (status != UFORM_OK) return status;
    size_t const kept = full < frontend->reach ? full : frontend->reach;
    size_t patches = audio_frames(frontend, kept) / frontend->patch_frames;
    if (patches > frontend->max_patches) patches = frontend->max_patches;
    if (patches == 0) return bad;
    size_t const frames = patches * frontend->patch_frames,
                 used = frontend->window + (frames - 1) * frontend->hop;
    status = audio_resample(frontend, samples, length, rate, thread->clip, used);
    if (status != UFORM_OK) return status == UFORM_INVALID_ARGUMENT ? bad : status;
    audio_log_mel(frontend, &thread->spectrum, thread->clip, frames, rows);
    clips->patches[item] = patches;
    clips->truncated[item] = full > frontend->reach;
    return UFORM_OK;
}

bool audio_clips_rows(audio_clips_t const *clips, uform_tape_t const *tape, size_t *rows) {
    *rows = 0;
    for (size_t item = 0; item < tape->count; ++item)
        if (__builtin_add_overflow(*rows, audio_clips_bound(clips, tape, item), rows)) return false;
    return true;
}

size_t audio_clips_bound(audio_clips_t const *clips, uform_tape_t const *tape, size_t item) {
    audio_frontend_t const *frontend = &clips->frontend;
    if (clips->input != AUDIO_INPUT_SAMPLES) return frontend->max_patches;
    size_t span = tape->offsets[item + 1] - tape->offsets[item];
    size_t full = audio_resampled_length(frontend, span, clips->rate);
    size_t patches =
        audio_frames(frontend, full < frontend->reach ? full : frontend->reach) / frontend->patch_frames;
    return patches < frontend->max_patches ? patches : frontend->max_patches;
}

/* The run's `decode` (media_read.h), on executor thread `thread`, which alone uses its FFT and
 * buffers: a failed clip has no patches. [max_patches, patch_frames * mels] */
static void audio_decode_item(media_run_t *run, size_t item, float *rows, size_t thread) {
    audio_call_t *audio = container_of(run, audio_call_t, run);
    audio_clips_t *clips = audio->work;
    uform_status_t status = audio->encode.statuses[item]; /* a file that could not be read */
    if (status == UFORM_OK) status = audio_clips_prepare(clips, &audio->encode.tape, run, thread, item, rows);
    if (status != UFORM_OK) {
        audio->encode.statuses[item] = status;
        clips->patches[item] = 0;
    }
}

/* ---- Compute ------------------------------------------------------------------------------------ */

/* The chunk's scratch, for `count` clips of up to max_patches patches each; their patch rows live in the
 * run (media_read.h), so none here. */
static bool audio_scratch(audio_call_t *audio, size_t count, patch_scratch_t *scratch) {
    return tower_patches_scratch(audio->encode.model->audio, audio->call.executor, count,
                                 count * audio->max_patches, 0, 0, scratch);
}

/* Projects `count` rows of final states in scratch->rows, normalizes them at the output width, and
 * writes row r to row targets[r] of `view` (targets NULL: row first + r). */
static void audio_project(audio_call_t *audio, patch_scratch_t const *scratch, size_t count,
                          size_t const *targets, size_t first, uform_view_t *view) {
    tower_t const *tower = audio->encode.model->audio;
    if (count == 0) return;
    tower_linear(tower, audio->call.executor, &tower->proj, scratch->rows, tower->hidden, count,
                 audio->encode.width, scratch->projected, audio->encode.width);
    uint64_t converting = loop_now_ns();
    for (size_t r = 0; r < count; ++r) {
        float *values = scratch->projected + r * audio->encode.width;
        if (audio->encode.normalize) tower->kernels->normalize(values, audio->encode.width);
        output_row(tower->kernels, view, targets ? targets[r] : first + r, values);
    }
    audio->encode.stats.convert_ns += loop_now_ns() - converting;
}

/* Encodes the prepared clips [first, last) of one chunk, clip `index`'s patch rows at `decoded` from row
 * index * max_patches [count, max_patches, patch_frames * mels]. */
static void audio_chunk(media_run_t *run, size_t first, size_t last, float *decoded) {
    audio_call_t *audio = container_of(run, audio_call_t, run);
    tower_t const *tower = audio->encode.model->audio;
    kernels_t const *kernels = tower->kernels;
    uform_executor_t *executor = audio->call.executor;
    audio_clips_t const *work = audio->work;
    size_t const hidden = tower->hidden, max_patches = audio->max_patches, row_floats = audio->row_floats;
    size_t const count = last - first;
    uint64_t computing = loop_now_ns();
    patch_scratch_t scratch;
    if (!audio_scratch(audio, count, &scratch)) {
        encode_stop(&audio->encode, UFORM_OUT_OF_MEMORY, "cannot allocate the executor's scratch");
        return;
    }

    /* The kept clips' patch rows packed end to end (moves only go backwards), then embedded. */
    size_t kept = 0, packed = 0;
    for (size_t index = 0; index < count; ++index) {
        size_t item = first + index, patches = work->patches[item];
        audio->encode.stats.truncated += work->truncated[item];
        if (audio->encode.statuses[item] != UFORM_OK) continue;
        scratch.items[kept++] = item;
        memmove(decoded + packed * row_floats, decoded + index * max_patches * row_floats,
                patches * row_floats * sizeof(float));
        packed += patches;
    }
    tower_linear(tower, executor, &tower->patches.patch, decoded, row_floats, packed, hidden, scratch.rows,
                 hidden);

    /* x: per kept clip, the class token, then its patches, each plus its position.  [tokens, hidden] */
    size_t row = 0, patch_row = 0;
    for (size_t q = 0; q < kept; ++q) {
        size_t patches = work->patches[scratch.items[q]];
        scratch.offsets[q] = row;
        tower_patches_tokens(&tower->patches, hidden, scratch.rows + patch_row * hidden, patches,
                             scratch.x + row * hidden);
        row += 1 + patches;
        patch_row += patches;
    }
    scratch.offsets[kept] = row;
    tower_patches_forward(tower, executor, &scratch, row, kept);

    /* The class token's state is the clip's; its projection the embedding; the patches' projections
     * its token vectors, packed in item order. */
    uform_encoded_t *encoded = &audio->encode.encoded;
    for (size_t q = 0; q < kept; ++q) {
        float const *state = scratch.x + scratch.offsets[q] * hidden;
        memcpy(scratch.rows + q * hidden, state, hidden * sizeof(float));
        if (audio->encode.outputs & UFORM_OUTPUT_STATES)
            output_row(kernels, &encoded->states, scratch.items[q], state);
    }
    if (audio->encode.outputs & UFORM_OUTPUT_EMBEDDINGS)
        audio_project(audio, &scratch, kept, scratch.items, 0, &encoded->embeddings);
    if (audio->encode.outputs & UFORM_OUTPUT_TOKEN_VECTORS) {
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
        if (audio->encode.statuses[item] == UFORM_OK) continue;
        output_zero(&encoded->embeddings, item, 1);
        output_zero(&encoded->states, item, 1);
    }
    audio->encode.stats.compute_ns += loop_now_ns() - computing;
}

/* ---- The start ---------------------------------------------------------------------------------- */

/* One chunk per loop turn (media_read.h). */
static void audio_turn(loop_op_t *op) {
    media_turn(&container_of(op, audio_call_t, call.op)->run);
}

/* Every output in the arena: statuses, embeddings, states, and room for every token vector. */
static bool audio_outputs(audio_call_t *audio) {
    size_t items = audio->encode.tape.count, rows = 0;
    if (!encode_outputs(&audio->encode, items, audio->encode.model->audio->hidden, output_view)) return false;
    if (!(audio->encode.outputs & UFORM_OUTPUT_TOKEN_VECTORS)) return true;
    return audio_clips_rows(audio->work, &audio->encode.tape, &rows) &&
           (audio->token_offsets = encode_token_vectors(&audio->encode, items, rows, 0, output_view));
}

static void audio_start(call_t *call) {
    audio_call_t *audio = container_of(call, audio_call_t, call);
    uform_model_info_t const *info = &audio->encode.model->header.info;
    audio->max_patches = info->audio.max_patches;
    audio->row_floats = info->audio.patch_frames * info->audio.mels;
    size_t items = audio->encode.tape.count;
    audio->encode.stats.items = items;
    size_t span = audio->encode.tape.offsets[items] - audio->encode.tape.offsets[0];
    if (audio->input == AUDIO_INPUT_SAMPLES) audio->encode.stats.bytes = span * sizeof(float);
    if (audio->input == AUDIO_INPUT_MEMORY) audio->encode.stats.bytes = span;

    /* Chunks: about AUDIO_CHUNK_TOKENS tokens of the longest clips, at least one clip per thread, at
     * most the batch. */
    size_t chunk_items = AUDIO_CHUNK_TOKENS / (1 + audio->max_patches);
    if (chunk_items < call->executor->threads) chunk_items = call->executor->threads;
    if (chunk_items > AUDIO_CHUNK_MAX) chunk_items = AUDIO_CHUNK_MAX;
    audio->call.op.callback = audio_turn;
    audio->run = (media_run_t){
        .call = call,
        .encode = &audio->encode,
        .files = audio->input == AUDIO_INPUT_FILES,
        .max_bytes = UFORM_AUDIO_MAX_BYTES,
        .chunk_items = chunk_items,
        .item_floats = audio->max_patches * audio->row_floats,
        .decode = audio_decode_item,
        .chunk = audio_chunk,
        .end = audio_end,
    };

    audio->work = audio_clips_new(audio->input, audio->rate, info, items, call->executor->threads);
    if (!audio->work || !media_open(&audio->run)) {
        encode_stop(&audio->encode, UFORM_OUT_OF_MEMORY, "cannot allocate the front end and the patch layer");
    } else if (!audio_outputs(audio)) {
        encode_stop(&audio->encode, UFORM_OUT_OF_MEMORY, "cannot allocate the outputs in the arena");
    }
    media_start(&audio->run);
}

/* The call's state from its audio request, on the calling thread. */
static void audio_fill(call_t *call, void const *context) {
    audio_request_t const *request = context;
    audio_call_t *audio = container_of(call, audio_call_t, call);
    encode_call_init(&audio->encode, &request->encode);
    audio->input = request->input;
    audio->rate = request->rate;
}

#endif /* UFORM_WITH_FFMPEG */

/* ---- The verbs ---------------------------------------------------------------------------------- */

uform_status_t audio_encode_host(char const *entry, audio_request_t const *request) {
    encode_request_t const *encode = &request->encode;
    uform_outcome_t *outcome = encode->outcome;
#if !UFORM_WITH_FFMPEG
    return call_refuse(outcome, UFORM_UNSUPPORTED, entry,
                       "built without FFmpeg: sounds cannot be decoded, resampled or transformed");
#else
    if (!encode->model->audio) /* a VRAM model: its audio tower is not prepared on the host */
        return call_refuse(
            outcome, UFORM_UNSUPPORTED, entry,
            "the audio tower runs on host executors: load the model with uform_model_load_ram");
    return encode_run(entry, encode, sizeof(audio_call_t), audio_start, audio_fill, request);
#endif
}
