/* Training parameters (train.h): the model a trainer config describes, the F32 master weights of its
 * tensors with their gradients and AdamW moments, the seeded start, the optimizer step, and the two
 * files a save writes: the BF16 inference checkpoint and, beside it, the F32 optimizer state.
 *
 * Numbers, pinned so that a resumed run repeats an uninterrupted one bit for bit:
 *   - the seeded start draws from one splitmix64 stream in tensor order, N(0, 0.02) approximated as in
 *     tiny_checkpoint.c (four uniforms, pure double arithmetic, no libm): the same seed gives the same
 *     bits on every machine;
 *   - the gradient norm sums squares in double over fixed segments of the concatenated tensors (each
 *     segment in element order), then the segments in order: the same bits whatever the thread count;
 *   - AdamW runs per element in double from the stored F32 values, with one rounding to F32 of each
 *     stored value (value, m, v); the step reads the moments as stored (rounded), so the state on disk
 *     is the whole state. Threads take fixed ranges of TRAIN_CHUNK scalars.
 *
 * Files: the checkpoint holds every tensor in BF16 (round to nearest even) but logit.scale and
 * logit.bias, which stay F32 (format 4 allows it) so that a resume from the checkpoint alone keeps the
 * loss's temperature exactly. The state, at train_state_path(path), is a safetensors file of F32
 * `value.<name>`, `m.<name>` and `v.<name>` tensors whose `__metadata__["uform"]` object holds the
 * step, the optimizer settings (reals to 17 digits: exact), the checkpoint's format-4 object, and the
 * FNV-1a 64 fingerprint of the checkpoint's data section, which ties the state to that checkpoint.
 *
 * A save replaces the pair (PATH, PATH.optimizer) so that at every instant a consistent pair is on
 * disk, the old one or the new one, and a resume can tell which:
 *   1. settle (below) what an interrupted save left;
 *   2. the new checkpoint to PATH.next, then the new state to PATH.optimizer.next, each written whole to
 *      a temporary beside it, synced and renamed there, the folder synced (checkpoint_write);
 *   3. PATH.optimizer.next renamed to PATH.optimizer, the folder synced: from here the state on disk is
 *      the new one, and the checkpoint it names is PATH.next;
 *   4. PATH.next renamed to PATH, the folder synced.
 * A failure or a kill before 3 leaves the old pair (a failed save removes its staged files), after it
 * the new one, with its checkpoint still at PATH.next until settled. Settling, at every save and every
 * load, reads PATH.next when there is one: when PATH.optimizer names its fingerprint (the save got past
 * 3), PATH.next is renamed to PATH; otherwise (it stopped before 3) PATH.next is removed. Then
 * PATH.optimizer.next and the temporaries of both staging names go. Nothing is removed while a file
 * that decides cannot be read. */
#include "checkpoint.h"
#include "executor.h"
#include "json_fault.h"
#include "kernels.h"
#include "seeded.h"
#include "tiny_checkpoint.h"
#include "variant.h"
#include "train.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#define TRAIN_ALIGNMENT     64
#define TRAIN_ALIGN_SCALARS (TRAIN_ALIGNMENT / sizeof(float))
#define TRAIN_CHUNK         4096 /* scalars a thread takes at once */
#define TRAIN_NORM_SEGMENTS 256  /* fixed partial sums of the gradient norm */
#define TRAIN_STD           0.02
#define TRAIN_LOG_10        2.302585092994045684 /* logit.scale: exp(scale) = 10 */
#define TRAIN_LOGIT_BIAS    (-10.0)
#define TRAIN_PI            3.14159265358979323846
#define STATE_SUFFIX        ".optimizer"
#define STATE_KIND          "uform optimizer state"
#define PREFIX_SIZE         8
#define FNV_OFFSET          0xcbf29ce484222325ull
#define FNV_PRIME           0x100000001b3ull
#define KNOWN_TOWERS                                                                                         \
    ((1u << UFORM_MODALITY_TEXT) | (1u << UFORM_MODALITY_IMAGE) | (1u << UFORM_MODALITY_VIDEO) |             \
     (1u << UFORM_MODALITY_AUDIO))

static uform_status_t answer(uform_status_t status, char const **message, char const *text) {
    *message = text;
    return status;
}

/* ---------------------------------------------------------------------------------------------- */
/* The tensors                                                                                    */
/* ---------------------------------------------------------------------------------------------- */

/* How a tensor starts: offset + scale * N(0, 1), no draws when scale is 0. */
typedef struct tensor_start {
    double offset, scale;
} tensor_start_t;

/* The tensors of a model in checkpoint order; with NULL arrays, only counted. */
typedef struct layout {
    train_tensor_t *tensors;
    tensor_start_t *starts;
    size_t count;
    size_t parameters, bytes; /* scalars, and bytes in the checkpoint a save writes */
} layout_t;

/* The checkpoint keeps these in F32; everything else in BF16. */
static bool stored_f32(char const *name) {
    return strncmp(name, "logit.", 6) == 0;
}

static void layout_add(layout_t *layout, char const *name, size_t rows, size_t columns, double offset,
                       double scale) {
    size_t const index = layout->count++, scalars = rows * (columns ? columns : 1);
    layout->parameters += scalars;
    layout->bytes += scalars * (stored_f32(name) ? sizeof(float) : sizeof(uint16_t));
    if (!layout->tensors) return;
    train_tensor_t *tensor = &layout->tensors[index];
    snprintf(tensor->name, sizeof tensor->name, "%s", name);
    tensor->rank = columns ? 2 : 1;
    tensor->shape[0] = rows;
    tensor->shape[1] = columns ? columns : 1;
    tensor->count = rows * tensor->shape[1];
    size_t const length = strlen(name);
    tensor->decay = tensor->rank == 2 && length > 7 && strcmp(name + length - 7, ".weight") == 0;
    layout->starts[index] = (tensor_start_t){offset, scale};
}

/* One tensor of the schema, started as its role asks: norms 1, biases 0, weights N(0, 0.02), logit.scale
 * log 10 and logit.bias -10. */
static int layout_visit(checkpoint_schema_tensor_t const *tensor, void *context) {
    static struct {
        double offset, scale;
    } const starts[] = {
        [CHECKPOINT_ROLE_NORM] = {1, 0},
        [CHECKPOINT_ROLE_BIAS] = {0, 0},
        [CHECKPOINT_ROLE_WEIGHT] = {0, TRAIN_STD},
        [CHECKPOINT_ROLE_LOGIT_SCALE] = {TRAIN_LOG_10, 0},
        [CHECKPOINT_ROLE_LOGIT_BIAS] = {TRAIN_LOGIT_BIAS, 0},
    };
    layout_add(context, tensor->name, tensor->shape[0], tensor->rank == 2 ? tensor->shape[1] : 0,
               starts[tensor->role].offset, starts[tensor->role].scale);
    return 0;
}

/* Every tensor of `info` in the checkpoint's order, the logit parameters always (a trainer learns them). */
static void layout_model(layout_t *layout, uform_model_info_t const *info) {
    uform_model_info_t trained = *info;
    trained.has_logit = true;
    checkpoint_schema_each(&trained, layout_visit, layout);
}

/* ---------------------------------------------------------------------------------------------- */
/* The config                                                                                     */
/* ---------------------------------------------------------------------------------------------- */

UFORM_EXPORT void uform_trainer_config_default(uform_trainer_config_t *config) {
    if (!config) return;
    *config = (uform_trainer_config_t){
        .hidden = 128,
        .towers = KNOWN_TOWERS,
        .learning_rate = 1e-3,
        .weight_decay = 0.01,
        .beta1 = 0.9,
        .beta2 = 0.999,
        .epsilon = 1e-8,
        .clip_norm = 1,
        .lm_weight = 0.1,
        .warmup_steps = 100,
        .total_steps = 10000,
        .seed = 42,
        .resume_path = NULL,
        .mesh = NULL,
    };
    tiny_model_sizes(config); /* the tiny checkpoint's sizes, but hidden and mlp */
}

static size_t or_default(size_t value, size_t fallback) {
    return value ? value : fallback;
}

/* The audio front end of docs/DESIGN.md: window 25 ms, hop 10 ms, 4 frames a patch, as many patches as
 * `seconds` holds. Limits are the checkpoint reader's, so that what a trainer saves loads. */
static uform_status_t audio_info(uform_trainer_config_t const *config, uform_trainer_config_t const *defaults,
                                 uform_model_info_t *info, char const **message) {
    size_t const rate = or_default(config->audio_rate, defaults->audio_rate),
                 mels = or_default(config->audio_mels, defaults->audio_mels);
    double seconds = config->audio_seconds != 0 ? config->audio_seconds : defaults->audio_seconds;
    if (rate < 100 || rate > UFORM_AUDIO_MAX_RATE)
        return answer(UFORM_INVALID_ARGUMENT, message, "audio_rate under 100 Hz or over 1048576 Hz");
    if (mels > 1024) return answer(UFORM_INVALID_ARGUMENT, message, "audio_mels over 1024");
    if (!(seconds > 0 && seconds <= 86400))
        return answer(UFORM_INVALID_ARGUMENT, message, "audio_seconds not in (0, 86400]");
    /* Kept to the 9 significant digits a checkpoint stores, so that a model reloaded from its checkpoint
     * has the same info, and its trainer cuts clips where this one does. */
    char digits[32];
    snprintf(digits, sizeof digits, "%.9g", seconds);
    seconds = strtod(digits, NULL);
    size_t const window = rate / 40, hop = rate / 100, patch_frames = 4;
    size_t const samples = (size_t)(seconds * (double)rate);
    if (samples < window)
        return answer(UFORM_INVALID_ARGUMENT, message, "audio_seconds shorter than one window");
    size_t const max_patches = (1 + (samples - window) / hop) / patch_frames;
    if (max_patches < 1)
        return answer(UFORM_INVALID_ARGUMENT, message, "audio_seconds shorter than one patch");
    if (max_patches > (1u << 20))
        return answer(UFORM_INVALID_ARGUMENT, message, "audio_seconds holds over 1048576 patches");
    info->audio.rate = rate;
    info->audio.mels = mels;
    info->audio.window = window;
    info->audio.hop = hop;
    info->audio.patch_frames = patch_frames;
    info->audio.max_patches = max_patches;
    info->audio.seconds = seconds;
    return UFORM_OK;
}

static uform_status_t image_info(uform_trainer_config_t const *config, uform_trainer_config_t const *defaults,
                                 uform_model_info_t *info, char const **message) {
    size_t const size = or_default(config->image_size, defaults->image_size),
                 patch = or_default(config->image_patch, defaults->image_patch);
    if (size > 8192) return answer(UFORM_INVALID_ARGUMENT, message, "image_size over 8192");
    if (size % patch != 0)
        return answer(UFORM_INVALID_ARGUMENT, message, "image_size is not a multiple of image_patch");
    info->image.size = size;
    info->image.patch = patch;
    for (size_t i = 0; i < 3; i++) {
        info->image.mean[i] = (float)checkpoint_clip_mean[i];
        info->image.std[i] = (float)checkpoint_clip_std[i];
    }
    return UFORM_OK;
}

uform_status_t train_info_from_config(uform_trainer_config_t const *config, uform_model_info_t *info,
                                      char const **message) {
    uform_trainer_config_t defaults;
    uform_trainer_config_default(&defaults);
    memset(info, 0, sizeof *info);
    size_t const depth = or_default(config->depth, defaults.depth),
                 hidden = or_default(config->hidden, defaults.hidden),
                 dims = or_default(config->dims, defaults.dims),
                 context = or_default(config->context, defaults.context);
    uint32_t const towers = config->towers ? config->towers : defaults.towers;
    if (depth > 1024) return answer(UFORM_INVALID_ARGUMENT, message, "depth over 1024");
    if (hidden % 64 != 0) return answer(UFORM_INVALID_ARGUMENT, message, "hidden is not a multiple of 64");
    if (hidden > 65536) return answer(UFORM_INVALID_ARGUMENT, message, "hidden over 65536");
    if (dims % 2 != 0) return answer(UFORM_INVALID_ARGUMENT, message, "dims is odd");
    if (dims > 65536) return answer(UFORM_INVALID_ARGUMENT, message, "dims over 65536");
    if (towers & ~KNOWN_TOWERS)
        return answer(UFORM_INVALID_ARGUMENT, message, "towers holds an unknown modality");
    info->has_text = towers & (1u << UFORM_MODALITY_TEXT);
    info->has_image = towers & (1u << UFORM_MODALITY_IMAGE);
    info->has_video = towers & (1u << UFORM_MODALITY_VIDEO);
    info->has_audio = towers & (1u << UFORM_MODALITY_AUDIO);
    info->has_logit = true;
    if (info->has_video && !info->has_image)
        return answer(UFORM_INVALID_ARGUMENT, message, "the video tower needs the image tower");

    info->dims = dims;
    info->matryoshka_count = 0;
    if (dims / 2 % 2 == 0) info->matryoshka[info->matryoshka_count++] = dims / 2;
    info->matryoshka[info->matryoshka_count++] = dims;
    uform_transformer_info_t const transformer = {depth, hidden, hidden / 64, 4 * hidden};
    uform_status_t status = UFORM_OK;
    if (info->has_text) {
        if (context > (1u << 24)) return answer(UFORM_INVALID_ARGUMENT, message, "context over 16777216");
        info->text.transformer = transformer;
        info->text.context = context;
    }
    if (info->has_image) {
        info->image.transformer = transformer;
        status = image_info(config, &defaults, info, message);
        if (status != UFORM_OK) return status;
    }
    if (info->has_video) {
        size_t const frames = or_default(config->video_frames, defaults.video_frames);
        if (frames > 1024) return answer(UFORM_INVALID_ARGUMENT, message, "video_frames over 1024");
        info->video.frames = frames;
    }
    if (info->has_audio) {
        info->audio.transformer = transformer;
        status = audio_info(config, &defaults, info, message);
        if (status != UFORM_OK) return status;
    }
    variant_engine_model(info);
    layout_t counted = {0};
    layout_model(&counted, info);
    info->parameters = counted.parameters;
    info->bytes = counted.bytes;
    return UFORM_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* The parameters                                                                                 */
/* ---------------------------------------------------------------------------------------------- */

static float *aligned_floats(size_t count) {
    size_t bytes = 0;
    if (__builtin_mul_overflow(count, sizeof(float), &bytes)) return NULL;
    return aligned_alloc(TRAIN_ALIGNMENT, bytes);
}

/* The tensors of `info` with zero values, gradients and moments, and how each starts (`*starts`, owned
 * by the caller). Each of the four arrays is one allocation whose tensors sit at 64-byte aligned
 * offsets; tensors[0] holds its start, which train_params_free frees. */
static uform_status_t params_allocate(train_params_t *params, uform_model_info_t const *info,
                                      tensor_start_t **starts) {
    memset(params, 0, sizeof *params);
    *starts = NULL;
    layout_t layout = {0};
    layout_model(&layout, info);
    layout.tensors = calloc(layout.count, sizeof *layout.tensors);
    layout.starts = calloc(layout.count, sizeof *layout.starts);
    if (!layout.tensors || !layout.starts) goto fail;
    size_t const count = layout.count;
    layout.count = layout.parameters = layout.bytes = 0;
    layout_model(&layout, info);

    size_t total = 0;
    for (size_t i = 0; i < count; i++) {
        size_t const padded =
            (layout.tensors[i].count + TRAIN_ALIGN_SCALARS - 1) / TRAIN_ALIGN_SCALARS * TRAIN_ALIGN_SCALARS;
        if (__builtin_add_overflow(total, padded, &total)) goto fail;
    }
    float *arrays[4] = {aligned_floats(total), aligned_floats(total), aligned_floats(total),
                        aligned_floats(total)};
    if (!arrays[0] || !arrays[1] || !arrays[2] || !arrays[3]) {
        for (size_t i = 0; i < 4; i++)
            free(arrays[i]);
        goto fail;
    }
    memset(arrays[1], 0, total * sizeof(float));
    memset(arrays[2], 0, total * sizeof(float));
    memset(arrays[3], 0, total * sizeof(float));
    for (size_t i = 0, at = 0; i < count; i++) {
        train_tensor_t *tensor = &layout.tensors[i];
        tensor->value = arrays[0] + at;
        tensor->grad = arrays[1] + at;
        tensor->m = arrays[2] + at;
        tensor->v = arrays[3] + at;
        at += (tensor->count + TRAIN_ALIGN_SCALARS - 1) / TRAIN_ALIGN_SCALARS * TRAIN_ALIGN_SCALARS;
    }
    params->info = *info;
    params->info.has_logit = true;
    params->info.parameters = layout.parameters;
    params->info.bytes = layout.bytes;
    params->tensors = layout.tensors;
    params->count = count;
    *starts = layout.starts;
    return UFORM_OK;
fail:
    free(layout.tensors);
    free(layout.starts);
    return UFORM_OUT_OF_MEMORY;
}

void train_params_free(train_params_t *params) {
    if (!params) return;
    if (params->count > 0) {
        free(params->tensors[0].value);
        free(params->tensors[0].grad);
        free(params->tensors[0].m);
        free(params->tensors[0].v);
    }
    free(params->tensors);
    memset(params, 0, sizeof *params);
}

/* ---------------------------------------------------------------------------------------------- */
/* The seeded start                                                                               */
/* ---------------------------------------------------------------------------------------------- */

static void tensor_start(train_tensor_t *tensor, tensor_start_t const *start, uint64_t *random) {
    for (size_t i = 0; i < tensor->count; i++) {
        double const noise = start->scale != 0 ? standard_normal(random) : 0;
        tensor->value[i] = (float)(start->offset + start->scale * noise);
    }
}

uform_status_t train_params_init(train_params_t *params, uform_model_info_t const *info, uint64_t seed) {
    tensor_start_t *starts = NULL;
    uform_status_t status = params_allocate(params, info, &starts);
    if (status != UFORM_OK) return status;
    uint64_t random = seed;
    for (size_t i = 0; i < params->count; i++)
        tensor_start(&params->tensors[i], &starts[i], &random);
    free(starts);
    return UFORM_OK;
}

train_tensor_t *train_params_find(train_params_t const *params, char const *name) {
    for (size_t i = 0; i < params->count; i++)
        if (strcmp(params->tensors[i].name, name) == 0) return &params->tensors[i];
    return NULL;
}

typedef struct logit_walk {
    train_params_t const *params;
    checkpoint_part_t part;
    train_tensor_t *found;
} logit_walk_t;

/* Stops at the model's own tensor (no tower) of the part sought. */
static int logit_visit(checkpoint_schema_tensor_t const *tensor, void *context) {
    logit_walk_t *walk = context;
    if (tensor->tower || tensor->part != walk->part) return 0;
    walk->found = train_params_find(walk->params, tensor->name);
    return 1;
}

train_tensor_t *train_params_logit(train_params_t const *params, checkpoint_part_t part) {
    uform_model_info_t trained = params->info;
    trained.has_logit = true; /* a trainer learns them whatever the checkpoint held */
    logit_walk_t walk = {params, part, NULL};
    checkpoint_schema_each(&trained, logit_visit, &walk);
    return walk.found;
}

void train_params_zero_grad(train_params_t *params) {
    for (size_t i = 0; i < params->count; i++)
        memset(params->tensors[i].grad, 0, params->tensors[i].count * sizeof(float));
}

/* ---------------------------------------------------------------------------------------------- */
/* The optimizer                                                                                  */
/* ---------------------------------------------------------------------------------------------- */

double train_learning_rate(train_optimizer_t const *optimizer, size_t step) {
    size_t const warmup = optimizer->warmup_steps;
    if (warmup > 0 && step <= warmup) return optimizer->learning_rate * (double)step / (double)warmup;
    double const span = optimizer->total_steps > warmup ? (double)(optimizer->total_steps - warmup) : 1;
    double progress = (double)(step - warmup) / span;
    if (progress > 1) progress = 1;
    return optimizer->learning_rate * 0.5 * (1 + cos(TRAIN_PI * progress));
}

/* One optimizer step, shared by the threads. */
typedef struct update_job {
    train_params_t *params;
    size_t threads, chunks;
    double segments[TRAIN_NORM_SEGMENTS]; /* sums of squares, one per fixed segment of chunks */
    double scale;                         /* the clipping factor of every gradient */
    double learning_rate, decay;          /* decay: 1 - lr * weight_decay */
    double beta1, beta2, correction1, correction2, epsilon;
} update_job_t;

static size_t tensor_chunks(train_tensor_t const *tensor) {
    return (tensor->count + TRAIN_CHUNK - 1) / TRAIN_CHUNK;
}

/* Calls visit(context, tensor, begin, end) for the scalars of chunks [first, last) of the concatenated
 * tensors (chunks never straddle two tensors), in order. */
static void for_chunks(train_params_t const *params, size_t first, size_t last,
                       void (*visit)(void *context, train_tensor_t *tensor, size_t begin, size_t end),
                       void *context) {
    size_t base = 0;
    for (size_t i = 0; i < params->count && base < last; i++) {
        train_tensor_t *tensor = &params->tensors[i];
        size_t const chunks = tensor_chunks(tensor);
        size_t const from = first > base ? first - base : 0, to = last - base < chunks ? last - base : chunks;
        if (from < to) {
            size_t const end = to * TRAIN_CHUNK < tensor->count ? to * TRAIN_CHUNK : tensor->count;
            visit(context, tensor, from * TRAIN_CHUNK, end);
        }
        base += chunks;
    }
}

static void add_squares(void *context, train_tensor_t *tensor, size_t begin, size_t end) {
    double *sum = context;
    for (size_t i = begin; i < end; i++)
        *sum += (double)tensor->grad[i] * (double)tensor->grad[i];
}

/* Thread `thread` sums the segments thread, thread + threads, ...: each segment in element order. */
static void norm_work(void *context, size_t thread) {
    update_job_t *job = context;
    for (size_t s = thread; s < TRAIN_NORM_SEGMENTS; s += job->threads) {
        double sum = 0;
        for_chunks(job->params, s * job->chunks / TRAIN_NORM_SEGMENTS,
                   (s + 1) * job->chunks / TRAIN_NORM_SEGMENTS, add_squares, &sum);
        job->segments[s] = sum;
    }
}

/* AdamW on scalars [begin, end) of one tensor, in double, each stored value rounded once to F32. */
static void adamw(void *context, train_tensor_t *tensor, size_t begin, size_t end) {
    update_job_t const *job = context;
    double const decay = tensor->decay ? job->decay : 1;
    for (size_t i = begin; i < end; i++) {
        double const g = (double)tensor->grad[i] * job->scale;
        float const m = (float)(job->beta1 * (double)tensor->m[i] + (1 - job->beta1) * g);
        float const v = (float)(job->beta2 * (double)tensor->v[i] + (1 - job->beta2) * g * g);
        double const m_hat = (double)m / job->correction1, v_hat = (double)v / job->correction2;
        double const p = (double)tensor->value[i] * decay;
        tensor->value[i] = (float)(p - job->learning_rate * m_hat / (sqrt(v_hat) + job->epsilon));
        tensor->m[i] = m;
        tensor->v[i] = v;
    }
}

/* Thread `thread` of `threads` updates chunks [thread * chunks / threads, (thread + 1) * chunks / threads).
 */
static void update_work(void *context, size_t thread) {
    update_job_t *job = context;
    for_chunks(job->params, thread * job->chunks / job->threads, (thread + 1) * job->chunks / job->threads,
               adamw, job);
}

static void run_threads(uform_executor_t *executor, update_job_t *job,
                        void (*work)(void *context, size_t thread)) {
    if (job->threads > 1)
        executor_for_threads(executor, work, job);
    else
        work(job, 0);
}

double train_params_update(train_params_t *params, uform_executor_t *executor, double *learning_rate) {
    train_optimizer_t const *optimizer = &params->optimizer;
    update_job_t job = {.params = params,
                        .threads = executor && executor->threads > 1 ? executor->threads : 1};
    for (size_t i = 0; i < params->count; i++)
        job.chunks += tensor_chunks(&params->tensors[i]);

    run_threads(executor, &job, norm_work);
    double sum = 0;
    for (size_t s = 0; s < TRAIN_NORM_SEGMENTS; s++)
        sum += job.segments[s];
    double const norm = sqrt(sum);
    if (!isfinite(norm)) return norm; /* a gradient overflowed: nothing is updated, the step not counted */

    size_t const step = ++params->step;
    double const rate = train_learning_rate(optimizer, step);
    job.scale = optimizer->clip_norm > 0 && norm > optimizer->clip_norm ? optimizer->clip_norm / norm : 1;
    job.learning_rate = rate;
    job.decay = 1 - rate * optimizer->weight_decay;
    job.beta1 = optimizer->beta1;
    job.beta2 = optimizer->beta2;
    job.correction1 = 1 - pow(optimizer->beta1, (double)step);
    job.correction2 = 1 - pow(optimizer->beta2, (double)step);
    job.epsilon = optimizer->epsilon;
    run_threads(executor, &job, update_work);
    if (learning_rate) *learning_rate = rate;
    return norm;
}

/* ---------------------------------------------------------------------------------------------- */
/* Saving                                                                                         */
/* ---------------------------------------------------------------------------------------------- */

bool train_state_path(char const *path, char *out, size_t capacity) {
    int const length = snprintf(out, capacity, "%s%s", path, STATE_SUFFIX);
    return length >= 0 && (size_t)length < capacity;
}

/* The state path of `path`, malloc'ed, or NULL when out of memory. */
static char *state_path_of(char const *path) {
    size_t const capacity = strlen(path) + sizeof STATE_SUFFIX;
    char *state = malloc(capacity);
    if (state && !train_state_path(path, state, capacity)) {
        free(state);
        return NULL;
    }
    return state;
}

static uint64_t fnv1a(uint64_t hash, void const *data, size_t size) {
    unsigned char const *bytes = data;
    for (size_t i = 0; i < size; i++)
        hash = (hash ^ bytes[i]) * FNV_PRIME;
    return hash;
}

/* The fingerprint as the state stores it. */
static void fingerprint_text(uint64_t fingerprint, char text[17]) {
    snprintf(text, 17, "%016" PRIx64, fingerprint);
}

/* The state's metadata object as JSON text (malloc'ed), or NULL when out of memory. */
static char *state_metadata(train_params_t const *params, char const *model, uint64_t fingerprint) {
    train_optimizer_t const *optimizer = &params->optimizer;
    char fingerprint_hex[17];
    fingerprint_text(fingerprint, fingerprint_hex);
    json_t *state =
        json_pack("{s:s, s:s, s:I, s:{s:f, s:f, s:f, s:f, s:f, s:f, s:I, s:I}, s:o}", "kind", STATE_KIND,
                  "checkpoint", fingerprint_hex, "step", (json_int_t)params->step, "optimizer",
                  "learning_rate", optimizer->learning_rate, "weight_decay", optimizer->weight_decay, "beta1",
                  optimizer->beta1, "beta2", optimizer->beta2, "epsilon", optimizer->epsilon, "clip_norm",
                  optimizer->clip_norm, "warmup_steps", (json_int_t)optimizer->warmup_steps, "total_steps",
                  (json_int_t)optimizer->total_steps, "model", json_loads(model, 0, NULL));
    if (!state) return NULL;
    char *text = json_dumps(state, JSON_COMPACT | JSON_REAL_PRECISION(17));
    json_decref(state);
    return text;
}

/* What a save writes: the checkpoint's sources (BF16 copies, logit in F32) and the state's. */
typedef struct save_plan {
    checkpoint_source_t *model, *state;
    char (*state_names)[TRAIN_NAME_MAX + 8];
    uint16_t *bf16;
} save_plan_t;

static uform_status_t plan_save(train_params_t const *params, save_plan_t *plan, uint64_t *fingerprint,
                                char const **message) {
    size_t const count = params->count;
    size_t scalars = 0;
    for (size_t i = 0; i < count; i++)
        scalars += params->tensors[i].count;
    plan->model = calloc(count, sizeof *plan->model);
    plan->state = calloc(3 * count, sizeof *plan->state);
    plan->state_names = calloc(3 * count, sizeof *plan->state_names);
    plan->bf16 = malloc(scalars * sizeof *plan->bf16);
    if (!plan->model || !plan->state || !plan->state_names || !plan->bf16)
        return answer(UFORM_OUT_OF_MEMORY, message, "cannot allocate the checkpoint's buffers");
    uint64_t hash = FNV_OFFSET;
    uint16_t *bf16 = plan->bf16;
    for (size_t i = 0; i < count; i++) {
        train_tensor_t const *tensor = &params->tensors[i];
        checkpoint_source_t *source = &plan->model[i];
        *source =
            (checkpoint_source_t){.name = tensor->name, .rank = tensor->rank, .shape = {tensor->shape[0]}};
        if (tensor->rank == 2) source->shape[1] = tensor->shape[1];
        if (stored_f32(tensor->name)) {
            source->dtype = CHECKPOINT_F32;
            source->data = tensor->value;
            hash = fnv1a(hash, tensor->value, tensor->count * sizeof(float));
        } else {
            source->dtype = CHECKPOINT_BF16;
            source->data = bf16;
            for (size_t j = 0; j < tensor->count; j++)
                bf16[j] = f32_to_bf16(tensor->value[j]);
            hash = fnv1a(hash, bf16, tensor->count * sizeof *bf16);
            bf16 += tensor->count;
        }
        static char const *const kinds[3] = {"value", "m", "v"};
        float *const arrays[3] = {tensor->value, tensor->m, tensor->v};
        for (size_t k = 0; k < 3; k++) {
            size_t const index = k * count + i;
            snprintf(plan->state_names[index], sizeof plan->state_names[index], "%s.%s", kinds[k],
                     tensor->name);
            plan->state[index] = *source;
            plan->state[index].name = plan->state_names[index];
            plan->state[index].dtype = CHECKPOINT_F32;
            plan->state[index].data = arrays[k];
        }
    }
    *fingerprint = hash;
    return UFORM_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* Loading                                                                                        */
/* ---------------------------------------------------------------------------------------------- */

/* Reads `length` bytes at `offset`: UFORM_IO on an error, UFORM_FORMAT when the file ends first. */
static uform_status_t read_at(int fd, void *buffer, size_t length, uint64_t offset, char const **message) {
    unsigned char *cursor = buffer;
    while (length > 0) {
        size_t const asked = length < (1u << 30) ? length : (1u << 30);
        ssize_t const got = pread(fd, cursor, asked, (off_t)offset);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return answer(UFORM_IO, message, "cannot read the checkpoint");
        if (got == 0) return answer(UFORM_FORMAT, message, "checkpoint truncated");
        cursor += got;
        offset += (uint64_t)got;
        length -= (size_t)got;
    }
    return UFORM_OK;
}

/* An open safetensors file: its size and JSON header. */
typedef struct open_file {
    int fd;
    uint64_t size;
    char *json;
    uint64_t json_length;
} open_file_t;

static void file_close(open_file_t *file) {
    if (file->fd >= 0) close(file->fd);
    free(file->json);
    *file = (open_file_t){.fd = -1};
}

/* Opens `path` and reads its header. With `optional`, a missing file answers UFORM_OK with fd -1. */
static uform_status_t file_open(char const *path, bool optional, open_file_t *file, char const **message) {
    *file = (open_file_t){.fd = open(path, O_RDONLY | O_CLOEXEC)};
    if (file->fd < 0) {
        if (optional && errno == ENOENT) return UFORM_OK;
        return answer(UFORM_IO, message,
                      optional ? "cannot open the optimizer state" : "cannot open the checkpoint");
    }
    struct stat stat_buffer;
    uform_status_t status = UFORM_OK;
    if (fstat(file->fd, &stat_buffer) != 0 || !S_ISREG(stat_buffer.st_mode))
        status = answer(UFORM_IO, message,
                        optional ? "the optimizer state is not a regular file"
                                 : "the checkpoint is not a regular file");
    else
        file->size = (uint64_t)stat_buffer.st_size;
    uint8_t prefix[PREFIX_SIZE] = {0};
    size_t const prefix_length = file->size < PREFIX_SIZE ? (size_t)file->size : PREFIX_SIZE;
    if (status == UFORM_OK) status = read_at(file->fd, prefix, prefix_length, 0, message);
    if (status == UFORM_OK)
        status = checkpoint_prefix(prefix, prefix_length, file->size, &file->json_length, message);
    if (status == UFORM_OK && !(file->json = malloc((size_t)file->json_length)))
        status = answer(UFORM_OUT_OF_MEMORY, message, "cannot allocate the checkpoint header");
    if (status == UFORM_OK)
        status = read_at(file->fd, file->json, (size_t)file->json_length, PREFIX_SIZE, message);
    if (status != UFORM_OK) file_close(file);
    return status;
}

/* The scales of a checkpoint's I8 weight `name` [out, in]: F32 [out], checked by the parser. */
static float scale_of(checkpoint_header_t const *header, uint8_t const *data, char const *name, size_t row) {
    char scales_name[TRAIN_NAME_MAX + sizeof CHECKPOINT_SCALE_SUFFIX];
    snprintf(scales_name, sizeof scales_name, "%s%s", name, CHECKPOINT_SCALE_SUFFIX);
    float scale;
    memcpy(&scale, data + checkpoint_find(header, scales_name)->begin + row * sizeof scale, sizeof scale);
    return scale;
}

/* Widens the checkpoint's tensors into the master weights (I8 weights as q * scale); absent ones (logit)
 * keep their start. */
static void widen(train_params_t *params, checkpoint_header_t const *header, uint8_t const *data,
                  tensor_start_t const *starts) {
    uint64_t none = 0;
    for (size_t i = 0; i < params->count; i++) {
        train_tensor_t *tensor = &params->tensors[i];
        checkpoint_tensor_t const *stored = checkpoint_find(header, tensor->name);
        if (!stored) {
            tensor_start(tensor, &starts[i], &none); /* constants: no draws */
            continue;
        }
        uint8_t const *bytes = data + stored->begin;
        for (size_t j = 0; j < tensor->count; j++) {
            if (stored->dtype == CHECKPOINT_F32) {
                memcpy(&tensor->value[j], bytes + 4 * j, sizeof(float));
            } else if (stored->dtype == CHECKPOINT_I8) {
                size_t row = j / (size_t)stored->shape[1];
                tensor->value[j] = (float)(int8_t)bytes[j] * scale_of(header, data, tensor->name, row);
            } else {
                uint16_t bits;
                memcpy(&bits, bytes + 2 * j, sizeof bits);
                tensor->value[j] = bf16_to_f32(bits);
            }
        }
    }
}

/* The checkpoint at `path` into fresh params; *fingerprint gets its data section's. */
static uform_status_t load_checkpoint(train_params_t *params, char const *path, uint64_t *fingerprint,
                                      char const **message) {
    open_file_t file;
    checkpoint_header_t header = {0};
    uint8_t *data = NULL;
    tensor_start_t *starts = NULL;
    uform_status_t status = file_open(path, false, &file, message);
    if (status != UFORM_OK) return status;
    status = checkpoint_parse(file.json, (size_t)file.json_length, file.size, &header, message);
    if (status == UFORM_OK && !variant_is_engine(&header.info))
        status = answer(UFORM_UNSUPPORTED, message,
                        "training runs the engine's own architecture, not a pretrained family");
    if (status == UFORM_OK && !(data = malloc(header.data_size ? (size_t)header.data_size : 1)))
        status = answer(UFORM_OUT_OF_MEMORY, message, "cannot allocate the checkpoint's tensors");
    if (status == UFORM_OK)
        status = read_at(file.fd, data, (size_t)header.data_size, header.data_offset, message);
    if (status == UFORM_OK) {
        status = params_allocate(params, &header.info, &starts);
        if (status != UFORM_OK) *message = "cannot allocate the parameters";
    }
    if (status == UFORM_OK) {
        widen(params, &header, data, starts);
        *fingerprint = fnv1a(FNV_OFFSET, data, (size_t)header.data_size);
    }
    free(starts);
    free(data);
    checkpoint_header_free(&header);
    file_close(&file);
    return status;
}

/* The state's `__metadata__["uform"]` object, parsed; NULL when absent or malformed. */
static json_t *state_object(json_t *root) {
    json_t const *text = json_object_get(json_object_get(root, "__metadata__"), "uform");
    if (!json_is_string(text)) return NULL;
    json_t *object =
        json_loadb(json_string_value(text), json_string_length(text), JSON_REJECT_DUPLICATES, NULL);
    if (json_is_object(object)) return object;
    json_decref(object);
    return NULL;
}

/* The step and the optimizer settings of a state object: each setting a number into `real`, or a count (a
 * non-negative integer) into `count`. */
static bool read_settings(json_t const *object, train_params_t *params) {
    json_t const *step = json_object_get(object, "step"), *optimizer = json_object_get(object, "optimizer");
    train_optimizer_t *settings = &params->optimizer;
    struct {
        char const *key;
        double *real;
        size_t *count;
    } const fields[] = {
        {"learning_rate", &settings->learning_rate, NULL},
        {"weight_decay", &settings->weight_decay, NULL},
        {"beta1", &settings->beta1, NULL},
        {"beta2", &settings->beta2, NULL},
        {"epsilon", &settings->epsilon, NULL},
        {"clip_norm", &settings->clip_norm, NULL},
        {"warmup_steps", NULL, &settings->warmup_steps},
        {"total_steps", NULL, &settings->total_steps},
    };
    if (!json_is_integer(step) || json_integer_value(step) < 0 || !json_is_object(optimizer)) return false;
    params->step = (size_t)json_integer_value(step);
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        json_t const *value = json_object_get(optimizer, fields[i].key);
        if (fields[i].real && !json_is_number(value)) return false;
        if (fields[i].count && (!json_is_integer(value) || json_integer_value(value) < 0)) return false;
        if (fields[i].real) *fields[i].real = json_number_value(value);
        if (fields[i].count) *fields[i].count = (size_t)json_integer_value(value);
    }
    return true;
}

/* Where the state's F32 copy of `name` lies in the file, checked against `tensor`'s shape. */
static bool state_entry(json_t const *root, char const *name, train_tensor_t const *tensor,
                        uint64_t data_offset, uint64_t file_size, uint64_t *at) {
    json_t const *entry = json_object_get(root, name);
    json_t const *dtype = json_object_get(entry, "dtype"), *shape = json_object_get(entry, "shape"),
                 *offsets = json_object_get(entry, "data_offsets");
    if (!json_is_string(dtype) || strcmp(json_string_value(dtype), "F32") != 0) return false;
    if (!json_is_array(shape) || json_array_size(shape) != tensor->rank) return false;
    for (size_t i = 0; i < tensor->rank; i++) {
        json_t const *extent = json_array_get(shape, i);
        if (!json_is_integer(extent) || (uint64_t)json_integer_value(extent) != tensor->shape[i])
            return false;
    }
    if (!json_is_array(offsets) || json_array_size(offsets) != 2) return false;
    json_t const *begin = json_array_get(offsets, 0), *end = json_array_get(offsets, 1);
    if (!json_is_integer(begin) || !json_is_integer(end) || json_integer_value(begin) < 0) return false;
    uint64_t const first = (uint64_t)json_integer_value(begin), last = (uint64_t)json_integer_value(end);
    if (last < first || last - first != tensor->count * sizeof(float)) return false;
    if (last > file_size - data_offset) return false;
    *at = data_offset + first;
    return true;
}

/* The state beside the checkpoint, when there is one and it belongs to it. */
static uform_status_t load_state(train_params_t *params, char const *path, uint64_t fingerprint,
                                 char const **message) {
    char *state_path = state_path_of(path);
    if (!state_path) return answer(UFORM_OUT_OF_MEMORY, message, "out of memory");
    open_file_t file;
    json_t *root = NULL, *object = NULL;
    uform_status_t status = file_open(state_path, true, &file, message);
    free(state_path);
    if (status != UFORM_OK || file.fd < 0) return status;
    uint64_t const data_offset = PREFIX_SIZE + file.json_length;
    root = json_loadb(file.json, (size_t)file.json_length, JSON_REJECT_DUPLICATES, NULL);
    object = json_is_object(root) ? state_object(root) : NULL;
    json_t const *kind = json_object_get(object, "kind"), *owner = json_object_get(object, "checkpoint");
    char expected[17];
    fingerprint_text(fingerprint, expected);
    if (!object || !json_is_string(kind) || strcmp(json_string_value(kind), STATE_KIND) != 0 ||
        !json_is_string(owner) || !read_settings(object, params)) {
        status = answer(UFORM_FORMAT, message, "the optimizer state is malformed");
    } else if (strcmp(json_string_value(owner), expected) != 0) {
        status = answer(UFORM_FORMAT, message, "the optimizer state belongs to another checkpoint");
    } else if (json_object_size(root) != 3 * params->count + 1) {
        status = answer(UFORM_FORMAT, message, "the optimizer state does not match the checkpoint's tensors");
    }
    static char const *const kinds[3] = {"value", "m", "v"};
    for (size_t i = 0; i < params->count && status == UFORM_OK; i++) {
        train_tensor_t *tensor = &params->tensors[i];
        float *const arrays[3] = {tensor->value, tensor->m, tensor->v};
        for (size_t k = 0; k < 3 && status == UFORM_OK; k++) {
            char name[TRAIN_NAME_MAX + 8];
            uint64_t at = 0;
            snprintf(name, sizeof name, "%s.%s", kinds[k], tensor->name);
            if (!state_entry(root, name, tensor, data_offset, file.size, &at))
                status = answer(UFORM_FORMAT, message,
                                "the optimizer state does not match the checkpoint's tensors");
            else
                status = read_at(file.fd, arrays[k], tensor->count * sizeof(float), at, message);
        }
    }
    json_decref(object);
    json_decref(root);
    file_close(&file);
    return status;
}

/* ---------------------------------------------------------------------------------------------- */
/* The pair on disk (the state machine of a save is in the file's head)                           */
/* ---------------------------------------------------------------------------------------------- */

#define NEXT_SUFFIX      ".next"
#define TEMPORARY_SUFFIX ".tmp." /* checkpoint_write's temporaries: the target, ".tmp.", six characters */
#define TEMPORARY_RANDOM 6
#define HASH_CHUNK       (1u << 20)

/* The four names of a save to `path`, malloc'ed together. */
typedef struct save_names {
    char *checkpoint, *state, *next, *state_next; /* PATH, PATH.optimizer, and their ".next" */
} save_names_t;

static void names_free(save_names_t *names) {
    free(names->checkpoint);
    *names = (save_names_t){0};
}

static bool names_of(char const *path, save_names_t *names) {
    size_t const length = strlen(path), each = length + sizeof STATE_SUFFIX + sizeof NEXT_SUFFIX;
    char *block = malloc(4 * each);
    *names = (save_names_t){0};
    if (!block) return false;
    *names = (save_names_t){block, block + each, block + 2 * each, block + 3 * each};
    snprintf(names->checkpoint, each, "%s", path);
    snprintf(names->state, each, "%s%s", path, STATE_SUFFIX);
    snprintf(names->next, each, "%s%s", path, NEXT_SUFFIX);
    snprintf(names->state_next, each, "%s%s%s", path, STATE_SUFFIX, NEXT_SUFFIX);
    return true;
}

/* A system call on `path` failed with `error`: "cannot write PATH: No space left on device" into
 * `reason` (UFORM_ERROR_MESSAGE_SIZE bytes, the text cut there). UFORM_IO, or UFORM_OUT_OF_MEMORY for
 * ENOMEM (opendir's buffer, the kernel's own). */
static uform_status_t fault(char *reason, char const **message, char const *verb, char const *path,
                            int error) {
    snprintf(reason, UFORM_ERROR_MESSAGE_SIZE, "cannot %s %s: %s", verb, path, strerror(error ? error : EIO));
    *message = reason;
    return error == ENOMEM ? UFORM_OUT_OF_MEMORY : UFORM_IO;
}

/* The folder of `path` synced, so that the renames in it are durable. Filesystems that cannot sync a
 * folder answer EINVAL; that is no fault. */
static uform_status_t sync_folder(char const *path, char *reason, char const **message) {
    /* No allocation: a save that has renamed its state must not fail for memory before its checkpoint
     * follows. A folder name longer than PATH_MAX could not be opened anyway. */
    char folder[PATH_MAX];
    char const *slash = strrchr(path, '/');
    size_t const length = slash ? (slash == path ? 1 : (size_t)(slash - path)) : 1;
    if (length >= sizeof folder) return fault(reason, message, "sync the folder of", path, ENAMETOOLONG);
    memcpy(folder, slash ? path : ".", length);
    folder[length] = '\0';
    uform_status_t status = UFORM_OK;
    int const fd = open(folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || (fsync(fd) != 0 && errno != EINVAL))
        status = fault(reason, message, "sync the folder of", path, errno);
    if (fd >= 0) close(fd);
    return status;
}

static uform_status_t rename_into(char const *from, char const *to, char *reason, char const **message) {
    if (rename(from, to) != 0) return fault(reason, message, "rename into", to, errno);
    return sync_folder(to, reason, message);
}

/* Removes `path`; a file that is not there is no fault. */
static uform_status_t remove_file(char const *path, char *reason, char const **message) {
    if (unlink(path) != 0 && errno != ENOENT) return fault(reason, message, "remove", path, errno);
    return UFORM_OK;
}

/* Removes the temporaries checkpoint_write left beside `target` when its process was killed. */
static uform_status_t remove_temporaries(char const *target, char *reason, char const **message) {
    char const *slash = strrchr(target, '/');
    char const *base = slash ? slash + 1 : target;
    size_t const folder_length = (size_t)(base - target), base_length = strlen(base);
    char *folder = folder_length ? strndup(target, folder_length) : strdup(".");
    if (!folder) return answer(UFORM_OUT_OF_MEMORY, message, "out of memory");
    uform_status_t status = UFORM_OK;
    DIR *listing = opendir(folder);
    if (!listing && errno != ENOENT) status = fault(reason, message, "list the folder of", target, errno);
    for (struct dirent *entry; listing && status == UFORM_OK && (errno = 0, entry = readdir(listing));) {
        char const *name = entry->d_name;
        size_t const suffix = sizeof TEMPORARY_SUFFIX - 1;
        if (strncmp(name, base, base_length) != 0 ||
            strncmp(name + base_length, TEMPORARY_SUFFIX, suffix) != 0 ||
            strlen(name) != base_length + suffix + TEMPORARY_RANDOM)
            continue;
        char *stale = malloc(folder_length + strlen(name) + 1);
        if (!stale) {
            status = answer(UFORM_OUT_OF_MEMORY, message, "out of memory");
            break;
        }
        memcpy(stale, target, folder_length);
        strcpy(stale + folder_length, name);
        status = remove_file(stale, reason, message);
        free(stale);
    }
    if (listing && status == UFORM_OK && errno != 0)
        status = fault(reason, message, "list the folder of", target, errno);
    if (listing) closedir(listing);
    free(folder);
    return status;
}

/* The fingerprint of the data section of the checkpoint at `path`: UFORM_FORMAT when it is no
 * checkpoint, UFORM_IO or UFORM_OUT_OF_MEMORY when that cannot be told. */
static uform_status_t file_fingerprint(char const *path, uint64_t *fingerprint, char const **message) {
    open_file_t file;
    checkpoint_header_t header = {0};
    uint8_t *chunk = NULL;
    uform_status_t status = file_open(path, false, &file, message);
    if (status != UFORM_OK) return status;
    status = checkpoint_parse(file.json, (size_t)file.json_length, file.size, &header, message);
    if (status == UFORM_OK && !(chunk = malloc(HASH_CHUNK)))
        status = answer(UFORM_OUT_OF_MEMORY, message, "out of memory");
    uint64_t hash = FNV_OFFSET;
    for (uint64_t done = 0; status == UFORM_OK && done < header.data_size;) {
        size_t const length =
            header.data_size - done < HASH_CHUNK ? (size_t)(header.data_size - done) : HASH_CHUNK;
        status = read_at(file.fd, chunk, length, header.data_offset + done, message);
        hash = fnv1a(hash, chunk, length);
        done += length;
    }
    *fingerprint = hash;
    free(chunk);
    checkpoint_header_free(&header);
    file_close(&file);
    return status;
}

/* Whether the state at `state_path` names `fingerprint` as its checkpoint's: *owns false when it is
 * missing or malformed; UFORM_IO or UFORM_OUT_OF_MEMORY when that cannot be told. */
static uform_status_t state_owns(char const *state_path, uint64_t fingerprint, bool *owns,
                                 char const **message) {
    open_file_t file;
    *owns = false;
    uform_status_t status = file_open(state_path, true, &file, message);
    if (status == UFORM_FORMAT) return UFORM_OK;
    if (status != UFORM_OK || file.fd < 0) return status;
    json_error_t error;
    json_t *root = json_loadb(file.json, (size_t)file.json_length, JSON_REJECT_DUPLICATES, &error);
    json_t *object = json_is_object(root) ? state_object(root) : NULL;
    json_t const *owner = json_object_get(object, "checkpoint");
    char expected[17];
    fingerprint_text(fingerprint, expected);
    *owns = json_is_string(owner) && strcmp(json_string_value(owner), expected) == 0;
    if (!root && json_fault_memory(&error))
        status = answer(UFORM_OUT_OF_MEMORY, message, "cannot parse the optimizer state");
    json_decref(object);
    json_decref(root);
    file_close(&file);
    return status;
}

/* Finishes or discards what an interrupted save left: PATH.next becomes PATH when PATH.optimizer is
 * its state, and is removed otherwise; PATH.optimizer.next and the temporaries go. Nothing is removed
 * while it cannot be told which. */
static uform_status_t settle(save_names_t const *names, char *reason, char const **message) {
    uint64_t fingerprint = 0;
    bool owns = false;
    struct stat next;
    uform_status_t status = UFORM_OK;
    if (lstat(names->next, &next) == 0) {
        status = file_fingerprint(names->next, &fingerprint, message);
        if (status == UFORM_OK)
            status = state_owns(names->state, fingerprint, &owns, message);
        else if (status == UFORM_FORMAT)
            status = UFORM_OK; /* no checkpoint: a state cannot own it */
        if (status == UFORM_OK && owns) status = rename_into(names->next, names->checkpoint, reason, message);
        if (status == UFORM_OK && !owns) status = remove_file(names->next, reason, message);
    } else if (errno != ENOENT) {
        status = fault(reason, message, "read", names->next, errno);
    }
    if (status == UFORM_OK) status = remove_file(names->state_next, reason, message);
    if (status == UFORM_OK) status = remove_temporaries(names->next, reason, message);
    if (status == UFORM_OK) status = remove_temporaries(names->state_next, reason, message);
    return status;
}

/* checkpoint_write to `staged` on behalf of `target`; its failing system call leaves errno set (the
 * cleanup after it, close and unlink of its temporary, succeeds and keeps it). */
static uform_status_t stage(char const *staged, char const *target, char const *metadata,
                            checkpoint_source_t const *sources, size_t count, char *reason,
                            char const **message) {
    errno = 0;
    uform_status_t const status = checkpoint_write(staged, metadata, sources, count, message);
    if (status == UFORM_IO) return fault(reason, message, "write", target, errno);
    return status;
}

uform_status_t train_params_save(train_params_t const *params, char const *path, char *reason,
                                 char const **message) {
    train_optimizer_t const *optimizer = &params->optimizer;
    double const settings[] = {optimizer->learning_rate, optimizer->weight_decay, optimizer->beta1,
                               optimizer->beta2,         optimizer->epsilon,      optimizer->clip_norm};
    for (size_t i = 0; i < sizeof settings / sizeof settings[0]; i++)
        if (!isfinite(settings[i]))
            return answer(UFORM_INVALID_ARGUMENT, message, "optimizer settings are not finite");
    save_plan_t plan = {0};
    save_names_t names;
    char *model = NULL, *state = NULL;
    uint64_t fingerprint = 0;
    bool settled = false, renamed_state = false;
    uform_status_t status =
        names_of(path, &names) ? UFORM_OK : answer(UFORM_OUT_OF_MEMORY, message, "out of memory");
    if (status == UFORM_OK) status = plan_save(params, &plan, &fingerprint, message);
    if (status == UFORM_OK) {
        model = checkpoint_metadata_text(&params->info, NULL);
        state = model ? state_metadata(params, model, fingerprint) : NULL;
        if (!state) status = answer(UFORM_OUT_OF_MEMORY, message, "cannot write the checkpoint's metadata");
    }
    if (status == UFORM_OK) settled = (status = settle(&names, reason, message)) == UFORM_OK;
    if (status == UFORM_OK)
        status = stage(names.next, names.checkpoint, model, plan.model, params->count, reason, message);
    if (status == UFORM_OK)
        status = stage(names.state_next, names.state, state, plan.state, 3 * params->count, reason, message);
    if (status == UFORM_OK) {
        renamed_state = rename(names.state_next, names.state) == 0;
        status = renamed_state ? sync_folder(names.state, reason, message)
                               : fault(reason, message, "rename into", names.state, errno);
    }
    if (status == UFORM_OK) status = rename_into(names.next, names.checkpoint, reason, message);
    if (status != UFORM_OK && settled && !renamed_state) { /* the old pair stands: drop the new files */
        unlink(names.next);
        unlink(names.state_next);
    }
    free(plan.model);
    free(plan.state);
    free(plan.state_names);
    free(plan.bf16);
    free(model);
    free(state);
    names_free(&names);
    return status;
}

uform_status_t train_params_load(train_params_t *params, char const *path, char *reason,
                                 char const **message) {
    uint64_t fingerprint = 0;
    save_names_t names;
    memset(params, 0, sizeof *params);
    uform_status_t status =
        names_of(path, &names) ? UFORM_OK : answer(UFORM_OUT_OF_MEMORY, message, "out of memory");
    if (status == UFORM_OK) status = settle(&names, reason, message);
    names_free(&names);
    if (status == UFORM_OK) status = load_checkpoint(params, path, &fingerprint, message);
    if (status == UFORM_OK) status = load_state(params, path, fingerprint, message);
    if (status != UFORM_OK) train_params_free(params);
    return status;
}
