/* One training step over a batch of items of any modality (src/train/train.h): the inputs prepared (texts
 * as bytes; images, clips and sounds decoded and turned into patch rows as the encode verbs do), each
 * tower's forward pass, the loss of docs/DESIGN.md (pairwise sigmoid over every matryoshka prefix plus the
 * next-byte loss), every backward pass, and the optimizer's update.
 *
 * The loss and its gradient with respect to the embeddings are computed in double (B^2 dims work, small
 * beside the towers); everything else in F32 on the kernels. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "audio_decode.h"
#include "audio_frontend.h"
#include "call.h"
#include "executor.h"
#include "image_preprocess.h"
#include "kernels.h"
#include "mesh.h"
#include "train.h"
#include "train_step.h"
#include "patches.h"

/* ---- The trainer ---------------------------------------------------------------------------------- */

static uform_status_t trainer_bind(uform_trainer_t *trainer, char const **message) {
    uform_model_info_t const *info = &trainer->params.info;
    if (info->has_text &&
        !train_tower_bind(&trainer->text, &trainer->params, "text", &info->text.transformer))
        goto missing;
    if (info->has_image &&
        !train_tower_bind(&trainer->image, &trainer->params, "image", &info->image.transformer))
        goto missing;
    if (info->has_audio &&
        !train_tower_bind(&trainer->audio, &trainer->params, "audio", &info->audio.transformer))
        goto missing;
    trainer->logit_scale = train_params_logit(&trainer->params, CHECKPOINT_PART_LOGIT_SCALE);
    trainer->logit_bias = train_params_logit(&trainer->params, CHECKPOINT_PART_LOGIT_BIAS);
    if (!trainer->logit_scale || !trainer->logit_bias) goto missing;
    if (info->has_image) {
        trainer->geometry.size = info->image.size;
        trainer->geometry.patch = info->image.patch;
        memcpy(trainer->geometry.mean, info->image.mean, sizeof trainer->geometry.mean);
        memcpy(trainer->geometry.std, info->image.std, sizeof trainer->geometry.std);
    }
#if UFORM_WITH_FFMPEG
    if (info->has_audio) {
        if (audio_frontend_init(&trainer->frontend, info) != UFORM_OK) {
            *message = "cannot prepare the audio front end";
            return UFORM_OUT_OF_MEMORY;
        }
        trainer->frontend_ready = true;
    }
#endif
    return UFORM_OK;
missing:
    *message = "a tensor of the model is missing, or out of memory";
    return UFORM_OUT_OF_MEMORY;
}

void trainer_destroy(uform_trainer_t *trainer) {
    if (!trainer) return;
    if (trainer->device_release) trainer->device_release(trainer);
    train_tower_t *const towers[] = {&trainer->text, &trainer->image, &trainer->audio};
    train_pass_t *const passes[] = {&trainer->text_pass, &trainer->image_pass, &trainer->audio_pass};
    for (size_t i = 0; i < 3; ++i) {
        train_tower_release(towers[i]);
        train_pass_release(passes[i]);
    }
#if UFORM_WITH_FFMPEG
    if (trainer->frontend_ready) audio_frontend_free(&trainer->frontend);
#endif
    train_params_free(&trainer->params);
    free(trainer);
}

uform_status_t trainer_create(uform_trainer_config_t const *config, uform_trainer_t **out, char *reason,
                              char const **message) {
    *out = NULL;
    uform_trainer_t *trainer = calloc(1, sizeof *trainer);
    if (!trainer) {
        *message = "cannot allocate the trainer";
        return UFORM_OUT_OF_MEMORY;
    }
    trainer->ops = &train_ram_ops;
    uform_status_t status;
    if (config->resume_path) {
        status = train_params_load(&trainer->params, config->resume_path, reason, message);
    } else {
        uform_model_info_t info;
        status = train_info_from_config(config, &info, message);
        if (status == UFORM_OK) {
            status = train_params_init(&trainer->params, &info, config->seed);
            if (status != UFORM_OK) *message = "cannot allocate the parameters";
        }
    }
    if (status == UFORM_OK && trainer->params.step == 0) {
        /* A fresh run (or a checkpoint without optimizer state) takes the config's optimizer. */
        trainer->params.optimizer = (train_optimizer_t){
            .learning_rate = config->learning_rate,
            .weight_decay = config->weight_decay,
            .beta1 = config->beta1,
            .beta2 = config->beta2,
            .epsilon = config->epsilon,
            .clip_norm = config->clip_norm,
            .warmup_steps = config->warmup_steps,
            .total_steps = config->total_steps,
        };
    }
    trainer->lm_weight = config->lm_weight;
    if (status == UFORM_OK) status = trainer_bind(trainer, message);
    if (status != UFORM_OK) {
        trainer_destroy(trainer);
        return status;
    }
    *out = trainer;
    return UFORM_OK;
}

/* ---- Inputs --------------------------------------------------------------------------------------- */

void plan_free(batch_plan_t *plan) {
    void *const buffers[] = {plan->text_items,  plan->text_offsets,  plan->tokens,
                             plan->image_items, plan->image_offsets, plan->image_patches,
                             plan->sound_items, plan->sound_offsets, plan->sound_patches};
    train_free_each(buffers, sizeof buffers / sizeof buffers[0]);
    memset(plan, 0, sizeof *plan);
}

#if UFORM_WITH_FFMPEG
/* One sound's patch rows (at most max_patches of them) into *rows (malloc'ed), as the audio verbs make
 * them: decoded, resampled, cut to the model's reach, log-mel. */
static uform_status_t plan_sound(uform_trainer_t const *trainer, uint8_t const *bytes, size_t span,
                                 float **rows, size_t *patches) {
    audio_frontend_t const *frontend = &trainer->frontend;
    audio_pcm_t pcm = {0};
    audio_spectrum_t spectrum = {0};
    float *clip = NULL;
    *rows = NULL;
    uform_status_t status = audio_decode(bytes, span, frontend, &pcm);
    if (status == UFORM_OK && pcm.length == 0) status = UFORM_FORMAT;
    if (status == UFORM_OK) {
        size_t full = pcm.more ? SIZE_MAX : audio_resampled_length(frontend, pcm.length, pcm.rate);
        size_t kept = full < frontend->reach ? full : frontend->reach;
        *patches = audio_frames(frontend, kept) / frontend->patch_frames;
        if (*patches > frontend->max_patches) *patches = frontend->max_patches;
        if (*patches == 0) status = UFORM_FORMAT;
    }
    if (status == UFORM_OK) status = audio_spectrum_init(&spectrum, frontend);
    if (status == UFORM_OK) {
        size_t frames = *patches * frontend->patch_frames,
               used = frontend->window + (frames - 1) * frontend->hop;
        clip = malloc(used * sizeof(float));
        *rows = malloc(frames * frontend->mels * sizeof(float));
        if (!clip || !*rows) status = UFORM_OUT_OF_MEMORY;
        if (status == UFORM_OK)
            status = audio_resample(frontend, pcm.samples, pcm.length, pcm.rate, clip, used);
        if (status == UFORM_INVALID_ARGUMENT) status = UFORM_FORMAT;
        if (status == UFORM_OK) audio_log_mel(frontend, &spectrum, clip, frames, *rows);
    }
    audio_spectrum_free(&spectrum);
    free(pcm.samples);
    free(clip);
    if (status != UFORM_OK) {
        free(*rows);
        *rows = NULL;
    }
    return status;
}
#endif

/* The media items of a batch, decoded into the slots the plan gave them: one item at a time per thread. */
typedef struct decode_job {
    uform_trainer_t const *trainer;
    train_batch_t const *batch;
    batch_plan_t *plan;
    size_t const *slots;      /* [items]: each media item's first image-trunk entry, or its sound */
    float **sound_rows;       /* [sounds] */
    size_t *sound_patches;    /* [sounds] */
    uform_status_t *statuses; /* [items] */
    size_t threads;
} decode_job_t;

static uform_status_t decode_item(decode_job_t const *job, size_t i) {
    batch_plan_t *plan = job->plan;
    uform_model_info_t const *info = &job->trainer->params.info;
    size_t begin = job->batch->contents.offsets[i], span = job->batch->contents.offsets[i + 1] - begin;
    uint8_t const *bytes = span ? (uint8_t const *)job->batch->contents.data + begin : NULL;
    uform_modality_t modality = job->batch->modalities[i];
    if (modality == UFORM_MODALITY_IMAGE || modality == UFORM_MODALITY_VIDEO) {
        size_t patch = info->image.patch, side = info->image.size / patch;
        float *rows = plan->image_patches + job->slots[i] * side * side * 3 * patch * patch;
        return media_patches(bytes, span, &job->trainer->geometry,
                             modality == UFORM_MODALITY_VIDEO ? info->video.frames : 0, rows);
    }
#if UFORM_WITH_FFMPEG
    size_t sound = job->slots[i];
    return plan_sound(job->trainer, bytes, span, &job->sound_rows[sound], &job->sound_patches[sound]);
#else
    return UFORM_UNSUPPORTED;
#endif
}

static void decode_work(void *context, size_t thread) {
    decode_job_t const *job = context;
    size_t first, last;
    thread_share(job->batch->items, thread, job->threads, &first, &last);
    for (size_t i = first; i < last; ++i)
        job->statuses[i] = job->batch->modalities[i] == UFORM_MODALITY_TEXT ? UFORM_OK : decode_item(job, i);
}

/* Counts the batch's items per trunk and allocates the plan's arrays. */
static bool plan_allocate(uform_model_info_t const *info, train_batch_t const *batch, batch_plan_t *plan) {
    size_t patch_floats = 0, per_image = 0, frames = info->video.frames, context = info->text.context;
    if (info->has_image) {
        size_t side = info->image.size / info->image.patch;
        per_image = side * side;
        patch_floats = 3 * info->image.patch * info->image.patch;
    }
    plan->items = batch->items;
    for (size_t i = 0; i < batch->items; ++i) {
        size_t span = batch->contents.offsets[i + 1] - batch->contents.offsets[i];
        switch (batch->modalities[i]) {
        case UFORM_MODALITY_TEXT:
            plan->texts++;
            plan->text_tokens += 1 + (span < context ? span : context);
            plan->predicted += span < context ? span : context;
            break;
        case UFORM_MODALITY_IMAGE:
            plan->images++;
            break;
        case UFORM_MODALITY_VIDEO:
            plan->images += frames;
            break;
        case UFORM_MODALITY_AUDIO:
            plan->sounds++;
            break;
        }
    }
    plan->image_rows = plan->images * per_image;
    plan->text_items = malloc((plan->texts + 1) * sizeof(size_t));
    plan->text_offsets = malloc((plan->texts + 1) * sizeof(size_t));
    plan->tokens = malloc((plan->text_tokens + 1) * sizeof(uint16_t));
    plan->image_items = malloc((plan->images + 1) * sizeof(size_t));
    plan->image_offsets = malloc((plan->images + 1) * sizeof(size_t));
    plan->image_patches = malloc((plan->image_rows * patch_floats + 1) * sizeof(float));
    plan->sound_items = malloc((plan->sounds + 1) * sizeof(size_t));
    plan->sound_offsets = malloc((plan->sounds + 1) * sizeof(size_t));
    return plan->text_items && plan->text_offsets && plan->tokens && plan->image_items &&
           plan->image_offsets && plan->image_patches && plan->sound_items && plan->sound_offsets;
}

/* The texts' tokens, and every media item's slot: its image-trunk entries or its sound. */
static void plan_fill(uform_model_info_t const *info, train_batch_t const *batch, batch_plan_t *plan,
                      size_t *slots) {
    size_t text = 0, token = 0, image = 0, sound = 0, context = info->text.context;
    size_t per_image =
        info->has_image ? (info->image.size / info->image.patch) * (info->image.size / info->image.patch) : 0;
    plan->text_offsets[0] = plan->image_offsets[0] = plan->sound_offsets[0] = 0;
    for (size_t i = 0; i < batch->items; ++i) {
        size_t begin = batch->contents.offsets[i], span = batch->contents.offsets[i + 1] - begin;
        uform_modality_t modality = batch->modalities[i];
        if (modality == UFORM_MODALITY_TEXT) {
            uint8_t const *bytes = span ? (uint8_t const *)batch->contents.data + begin : NULL;
            size_t kept = span < context ? span : context;
            plan->tokens[token++] = 256;
            for (size_t b = 0; b < kept; ++b)
                plan->tokens[token++] = bytes[b];
            plan->text_items[text] = i;
            plan->text_offsets[++text] = token;
        } else if (modality == UFORM_MODALITY_AUDIO) {
            plan->sound_items[sound] = i;
            slots[i] = sound++;
        } else {
            slots[i] = image;
            for (size_t k = 0; k < (modality == UFORM_MODALITY_VIDEO ? info->video.frames : 1);
                 ++k, ++image) {
                plan->image_items[image] = i;
                plan->image_offsets[image + 1] = plan->image_offsets[image] + 1 + per_image;
            }
        }
    }
}

/* The sounds' rows end to end, and their token offsets. */
static uform_status_t plan_sounds(uform_model_info_t const *info, batch_plan_t *plan,
                                  float *const *sound_rows, size_t const *sound_patches) {
    size_t floats = info->audio.mels * info->audio.patch_frames;
    for (size_t s = 0; s < plan->sounds; ++s) {
        plan->sound_offsets[s + 1] = plan->sound_offsets[s] + 1 + sound_patches[s];
        plan->sound_rows += sound_patches[s];
    }
    plan->sound_patches = malloc((plan->sound_rows * floats + 1) * sizeof(float));
    if (!plan->sound_patches) return UFORM_OUT_OF_MEMORY;
    for (size_t s = 0, row = 0; s < plan->sounds; row += sound_patches[s], ++s)
        memcpy(plan->sound_patches + row * floats, sound_rows[s], sound_patches[s] * floats * sizeof(float));
    return UFORM_OK;
}

uform_status_t plan_batch(uform_trainer_t const *trainer, train_batch_t const *batch,
                          uform_executor_t *workers, batch_plan_t *plan, char *message, size_t capacity) {
    uform_model_info_t const *info = &trainer->params.info;
    memset(plan, 0, sizeof *plan);
    decode_job_t job = {.trainer = trainer, .batch = batch, .plan = plan, .threads = 1};
    size_t *slots = malloc((batch->items + 1) * sizeof(size_t));
    job.statuses = malloc((batch->items + 1) * sizeof(uform_status_t));
    uform_status_t status = UFORM_OK;
    if (!slots || !job.statuses || !plan_allocate(info, batch, plan) ||
        !(job.sound_rows = calloc(plan->sounds + 1, sizeof(float *))) ||
        !(job.sound_patches = calloc(plan->sounds + 1, sizeof(size_t)))) {
        snprintf(message, capacity, "cannot allocate the batch's inputs");
        status = UFORM_OUT_OF_MEMORY;
        goto done;
    }
    plan_fill(info, batch, plan, slots);
    job.slots = slots;
    if (workers && (job.threads = executor_fork_threads(workers)) > 1)
        executor_for_threads(workers, decode_work, &job);
    else
        decode_work(&job, 0);
    for (size_t i = 0; i < batch->items && status == UFORM_OK; ++i) /* the first item that failed */
        if ((status = job.statuses[i]) != UFORM_OK)
            snprintf(message, capacity, "item %zu: the %s cannot be decoded (%s)", i,
                     batch->modalities[i] == UFORM_MODALITY_AUDIO   ? "sound"
                     : batch->modalities[i] == UFORM_MODALITY_VIDEO ? "clip"
                                                                    : "image",
                     uform_status_name(status));
    if (status == UFORM_OK && plan->sounds &&
        (status = plan_sounds(info, plan, job.sound_rows, job.sound_patches)))
        snprintf(message, capacity, "cannot allocate the sounds' patches");
done:
    for (size_t s = 0; job.sound_rows && s < plan->sounds; ++s)
        free(job.sound_rows[s]);
    void *const buffers[] = {slots, job.statuses, job.sound_rows, job.sound_patches};
    train_free_each(buffers, sizeof buffers / sizeof buffers[0]);
    if (status != UFORM_OK) plan_free(plan);
    return status;
}

/* ---- The loss ------------------------------------------------------------------------------------- */

/* v / |v| in double (zero stays zero); answers |v|. */
static double normalize_double(double *v, size_t n) {
    double sum = 0;
    for (size_t j = 0; j < n; ++j)
        sum += v[j] * v[j];
    double norm = sqrt(sum);
    if (norm > 0)
        for (size_t j = 0; j < n; ++j)
            v[j] /= norm;
    return norm;
}

/* dv of v when y = v / |v|: (dy - y <y, dy>) / |v|, written over dy. */
static void normalize_backward(double *dy, double const *y, double norm, size_t n) {
    if (norm <= 0) {
        memset(dy, 0, n * sizeof(double));
        return;
    }
    double dot = 0;
    for (size_t j = 0; j < n; ++j)
        dot += y[j] * dy[j];
    for (size_t j = 0; j < n; ++j)
        dy[j] = (dy[j] - y[j] * dot) / norm;
}

/* log(1 + exp(x)) without overflow. */
static double softplus(double x) {
    return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x));
}

static double sigmoid(double x) {
    return x >= 0 ? 1 / (1 + exp(-x)) : exp(x) / (1 + exp(x));
}

/* The contrastive loss's share of this process: over the ordered pairs (i, j) of the whole batch
 * (`global` items, e [global, dims] unit rows) whose first item is one of this process's `local` items,
 * which start at `first`. Writes the gradient with respect to those items' embeddings into de [local,
 * dims] and adds the logit parameters' gradients. s_ij is symmetric, so the gradient of item i is
 * 2 sum_j dL/ds_ij t x_j: each process computes its items' whole gradient from the gathered batch.
 * `related` [local, local]: nonzero where two of this process's items are related (pairs across
 * processes are never related). NaN when out of memory. */
static double contrastive(uform_trainer_t *trainer, double const *e, size_t global, size_t first,
                          size_t local, uint8_t const *related, double *de) {
    size_t dims = trainer->params.info.dims;
    memset(de, 0, local * dims * sizeof(double));
    if (global < 2) return 0;
    uform_model_info_t const *info = &trainer->params.info;
    double t = exp((double)trainer->logit_scale->value[0]), b = trainer->logit_bias->value[0];
    double loss = 0, d_scale = 0, d_bias = 0;
    double *x = malloc(global * dims * sizeof(double)), *norms = malloc(global * sizeof(double));
    double *dx = malloc((local + 1) * dims * sizeof(double));
    if (!x || !norms || !dx) {
        free(x);
        free(norms);
        free(dx);
        return NAN;
    }
    size_t prefixes = info->matryoshka_count ? info->matryoshka_count : 1;
    for (size_t p = 0; p < prefixes; ++p) {
        size_t k = info->matryoshka_count ? info->matryoshka[p] : dims;
        for (size_t i = 0; i < global; ++i) {
            memcpy(x + i * dims, e + i * dims, k * sizeof(double));
            norms[i] = normalize_double(x + i * dims, k);
        }
        memset(dx, 0, local * dims * sizeof(double));
        for (size_t i = 0; i < local; ++i) {
            double const *xi = x + (first + i) * dims;
            for (size_t j = 0; j < global; ++j) {
                if (j == first + i) continue;
                double const *xj = x + j * dims;
                double dot = 0;
                for (size_t c = 0; c < k; ++c)
                    dot += xi[c] * xj[c];
                bool is_related = j >= first && j < first + local && related[i * local + (j - first)];
                double z = is_related ? 1 : -1, s = t * dot + b;
                loss += softplus(-z * s) / (double)global;
                double ds = -z * sigmoid(-z * s) / (double)global;
                d_scale += ds * dot * t;
                d_bias += ds;
                for (size_t c = 0; c < k; ++c)
                    dx[i * dims + c] += 2 * ds * t * xj[c];
            }
        }
        for (size_t i = 0; i < local; ++i) {
            normalize_backward(dx + i * dims, x + (first + i) * dims, norms[first + i], k);
            for (size_t c = 0; c < k; ++c)
                de[i * dims + c] += dx[i * dims + c];
        }
    }
    trainer->logit_scale->grad[0] += (float)d_scale;
    trainer->logit_bias->grad[0] += (float)d_bias;
    free(x);
    free(norms);
    free(dx);
    return loss;
}

/* ---- Towers --------------------------------------------------------------------------------------- */

/* One trunk's items as the loss sees them: the rows whose projection is an embedding (`selected`, one
 * per trunk item), their raw projections and norms, and the gradients flowing back. */
typedef struct trunk_out {
    size_t count;
    float *selected;    /* [count, hidden]: the states projected */
    float *projected;   /* [count, dims] */
    double *unit;       /* [count, dims]: normalized */
    double *norms;      /* [count] */
    double *d_unit;     /* [count, dims] */
    float *d_projected; /* [count, dims] */
    float *d_selected;  /* [count, hidden] */
} trunk_out_t;

static void trunk_out_free(trunk_out_t *out) {
    void *const buffers[] = {out->selected, out->projected,   out->unit,      out->norms,
                             out->d_unit,   out->d_projected, out->d_selected};
    train_free_each(buffers, sizeof buffers / sizeof buffers[0]);
    memset(out, 0, sizeof *out);
}

static bool trunk_out_make(trunk_out_t *out, size_t count, size_t hidden, size_t dims) {
    memset(out, 0, sizeof *out);
    out->count = count;
    size_t n = count ? count : 1;
    out->selected = malloc(n * hidden * sizeof(float));
    out->projected = malloc(n * dims * sizeof(float));
    out->unit = malloc(n * dims * sizeof(double));
    out->norms = malloc(n * sizeof(double));
    out->d_unit = calloc(n * dims, sizeof(double));
    out->d_projected = malloc(n * dims * sizeof(float));
    out->d_selected = malloc(n * hidden * sizeof(float));
    return out->selected && out->projected && out->unit && out->norms && out->d_unit && out->d_projected &&
           out->d_selected;
}

/* Gathers the rows `rows[i]` of the trunk's states, projects and normalizes them. */
static void trunk_out_forward(uform_executor_t *executor, train_tower_t const *trunk,
                              train_pass_t const *pass, size_t const *rows, trunk_out_t *out) {
    size_t hidden = trunk->hidden, dims = trunk->dims;
    for (size_t i = 0; i < out->count; ++i)
        memcpy(out->selected + i * hidden, pass->states + rows[i] * hidden, hidden * sizeof(float));
    train_linear(trunk->kernels, executor, out->selected, out->count, trunk->proj, dims, NULL,
                 out->projected);
    for (size_t i = 0; i < out->count; ++i) {
        for (size_t c = 0; c < dims; ++c)
            out->unit[i * dims + c] = out->projected[i * dims + c];
        out->norms[i] = normalize_double(out->unit + i * dims, dims);
    }
}

/* From d_unit to the trunk's d_states (zeroed first, then the selected rows). */
static void trunk_out_backward(uform_executor_t *executor, train_tower_t const *trunk, size_t const *rows,
                               trunk_out_t *out, float *d_states) {
    size_t hidden = trunk->hidden, dims = trunk->dims;
    for (size_t i = 0; i < out->count; ++i) {
        normalize_backward(out->d_unit + i * dims, out->unit + i * dims, out->norms[i], dims);
        for (size_t c = 0; c < dims; ++c)
            out->d_projected[i * dims + c] = (float)out->d_unit[i * dims + c];
    }
    train_linear_backward(trunk->kernels, executor, out->selected, out->count, trunk->proj, dims, NULL,
                          out->d_projected, out->d_selected, false);
    for (size_t i = 0; i < out->count; ++i) {
        float *row = d_states + rows[i] * hidden;
        for (size_t c = 0; c < hidden; ++c)
            row[c] += out->d_selected[i * hidden + c];
    }
}

/* The input tokens of a patch trunk: per item, the class token plus position 0, then each patch's
 * embedding plus its position. */
static bool patch_tokens(train_tower_t const *trunk, uform_executor_t *executor,
                         train_tensor_t *const parts[4], float const *patches, size_t rows,
                         size_t const *offsets, size_t items, float **x, float **embedded) {
    size_t hidden = trunk->hidden, tokens = offsets[items];
    *x = malloc((tokens + 1) * hidden * sizeof(float));
    *embedded = malloc((rows + 1) * hidden * sizeof(float));
    if (!*x || !*embedded) return false;
    train_linear(trunk->kernels, executor, patches, rows, parts[0], hidden, parts[1], *embedded);
    float const *cls = parts[2]->value, *pos = parts[3]->value;
    for (size_t item = 0, row = 0; item < items; ++item) {
        float *token = *x + offsets[item] * hidden;
        for (size_t c = 0; c < hidden; ++c)
            token[c] = cls[c] + pos[c];
        size_t count = offsets[item + 1] - offsets[item] - 1;
        for (size_t p = 0; p < count; ++p, ++row)
            for (size_t c = 0; c < hidden; ++c)
                token[(1 + p) * hidden + c] = (*embedded)[row * hidden + c] + pos[(1 + p) * hidden + c];
    }
    return true;
}

/* The gradients of patch_tokens from d_x [tokens, hidden]; `embedded` is reused as d_embedded. */
static void patch_tokens_backward(train_tower_t const *trunk, uform_executor_t *executor,
                                  train_tensor_t *const parts[4], float const *patches, size_t rows,
                                  size_t const *offsets, size_t items, float const *d_x, float *d_embedded) {
    size_t hidden = trunk->hidden;
    float *d_cls = parts[2]->grad, *d_pos = parts[3]->grad;
    for (size_t item = 0, row = 0; item < items; ++item) {
        float const *token = d_x + offsets[item] * hidden;
        for (size_t c = 0; c < hidden; ++c) {
            d_cls[c] += token[c];
            d_pos[c] += token[c];
        }
        size_t count = offsets[item + 1] - offsets[item] - 1;
        for (size_t p = 0; p < count; ++p, ++row)
            for (size_t c = 0; c < hidden; ++c) {
                float g = token[(1 + p) * hidden + c];
                d_embedded[row * hidden + c] = g;
                d_pos[(1 + p) * hidden + c] += g;
            }
    }
    train_linear_backward(trunk->kernels, executor, patches, rows, parts[0], hidden, parts[1], d_embedded,
                          NULL, false);
}

/* The forward pass of a patch trunk (image or audio) over its `items`, patch rows [rows, inputs] at token
 * `offsets`: its tokens into *x (and the patches' embeddings into *embedded), the transformer, and the
 * projections of each item's class token (`selected` gets their rows) into `out`. false when out of memory.
 */
static bool patch_trunk_forward(train_tower_t const *trunk, uform_executor_t *executor, train_pass_t *pass,
                                float const *patches, size_t rows, size_t const *offsets, size_t items,
                                size_t dims, trunk_out_t *out, float **x, float **embedded,
                                size_t *selected) {
    if (!trunk_out_make(out, items, trunk->hidden, dims) ||
        !patch_tokens(trunk, executor, trunk->patches, patches, rows, offsets, items, x, embedded) ||
        !train_tower_forward(trunk, executor, pass, *x, offsets[items], offsets, items, false, false))
        return false;
    for (size_t i = 0; i < items; ++i)
        selected[i] = offsets[i];
    trunk_out_forward(executor, trunk, pass, selected, out);
    return true;
}

/* The backward pass of patch_trunk_forward, from out->d_unit to every parameter of the trunk; d_states and
 * d_x are scratch [tokens, hidden], `embedded` is reused as d_embedded. */
static void patch_trunk_backward(train_tower_t const *trunk, uform_executor_t *executor, train_pass_t *pass,
                                 float const *patches, size_t rows, size_t const *offsets, size_t items,
                                 trunk_out_t *out, size_t const *selected, float *d_states, float *d_x,
                                 float *embedded) {
    memset(d_states, 0, offsets[items] * trunk->hidden * sizeof(float));
    trunk_out_backward(executor, trunk, selected, out, d_states);
    train_tower_backward(trunk, executor, pass, d_states, d_x);
    patch_tokens_backward(trunk, executor, trunk->patches, patches, rows, offsets, items, d_x, embedded);
}

/* ---- The step ------------------------------------------------------------------------------------- */

struct train_work {
    train_batch_t batch;
    batch_plan_t plan;
    float *text_x, *image_x, *image_embedded, *sound_x, *sound_embedded, *d_states, *d_x, *logits;
    size_t *text_rows, *image_rows, *sound_rows;
    trunk_out_t text_out, image_out, sound_out;
    double *e, *de;      /* [items, dims]: this process's embeddings, and their gradients */
    double *video_norms; /* [items]: a clip's norm before its normalization */
    uint8_t *related;    /* [items, items] */
};

void train_work_free(train_work_t *w) {
    if (!w) return;
    plan_free(&w->plan);
    trunk_out_free(&w->text_out);
    trunk_out_free(&w->image_out);
    trunk_out_free(&w->sound_out);
    void *const buffers[] = {
        w->text_x, w->image_x,     w->image_embedded, w->sound_x,    w->sound_embedded, w->d_states,
        w->d_x,    w->logits,      w->text_rows,      w->image_rows, w->sound_rows,     w->e,
        w->de,     w->video_norms, w->related};
    train_free_each(buffers, sizeof buffers / sizeof buffers[0]);
    free(w);
}

size_t train_work_items(train_work_t const *work) {
    return work->batch.items;
}

size_t train_work_predicted(train_work_t const *work) {
    return work->plan.predicted;
}

double const *train_work_embeddings(train_work_t const *work) {
    return work->e;
}

/* The next-byte loss's share of this process (its cross-entropy sum over `predicted` positions of the
 * whole batch), its gradient added into d_states and text.embed. */
static double lm_loss(uform_trainer_t *trainer, uform_executor_t *executor, train_work_t *w, size_t predicted,
                      float *d_states) {
    batch_plan_t const *plan = &w->plan;
    train_tower_t const *trunk = &trainer->text;
    float const *states = trainer->text_pass.states;
    size_t tokens = plan->text_tokens;
    if (plan->predicted == 0) return 0;
    /* logits [tokens, 256] = states . embed[0:256]^T */
    train_linear(trunk->kernels, executor, states, tokens, trunk->embed, 256, NULL, w->logits);
    double loss = 0, scale = trainer->lm_weight / (double)predicted;
    for (size_t t = 0; t < plan->texts; ++t)
        for (size_t row = plan->text_offsets[t]; row < plan->text_offsets[t + 1]; ++row) {
            float *l = w->logits + row * 256;
            if (row + 1 == plan->text_offsets[t + 1]) { /* the last position predicts nothing */
                memset(l, 0, 256 * sizeof(float));
                continue;
            }
            unsigned target = plan->tokens[row + 1];
            double max = l[0], sum = 0;
            for (int j = 1; j < 256; ++j)
                max = l[j] > max ? l[j] : max;
            for (int j = 0; j < 256; ++j)
                sum += exp(l[j] - max);
            loss += log(sum) + max - l[target];
            for (int j = 0; j < 256; ++j)
                l[j] = (float)(scale * (exp(l[j] - max) / sum - (j == (int)target)));
        }
    /* embed.grad[0:256] += dlogits^T states; d_states += dlogits . embed[0:256] */
    train_linear_backward(trunk->kernels, executor, states, tokens, trunk->embed, 256, NULL, w->logits,
                          d_states, true);
    return loss / (double)predicted;
}

static bool cancelled(train_progress_t *progress, size_t phase) {
    return progress && progress_report(progress->progress, &progress->next_step, phase, TRAIN_PHASES);
}

uform_status_t train_validate(uform_trainer_t const *trainer, train_batch_t const *batch, char *message,
                              size_t capacity) {
    uform_model_info_t const *info = &trainer->params.info;
    size_t items = batch->items;
    for (size_t i = 0; i < items; ++i) {
        uform_modality_t m = batch->modalities[i];
        if ((unsigned)m > UFORM_MODALITY_AUDIO) {
            snprintf(message, capacity, "item %zu: modality %u is not one of text, image, video, audio", i,
                     (unsigned)m);
            return UFORM_INVALID_ARGUMENT;
        }
        bool present = (m == UFORM_MODALITY_TEXT && info->has_text) ||
                       (m == UFORM_MODALITY_IMAGE && info->has_image) ||
                       (m == UFORM_MODALITY_VIDEO && info->has_image && info->has_video) ||
                       (m == UFORM_MODALITY_AUDIO && info->has_audio);
        if (!present) {
            snprintf(message, capacity, "item %zu: the model has no tower for its modality", i);
            return UFORM_UNSUPPORTED;
        }
    }
    for (size_t r = 0; r < batch->relations_count; ++r) {
        uint32_t a = batch->relations[2 * r], b = batch->relations[2 * r + 1];
        if (a >= items || b >= items || a == b) {
            snprintf(message, capacity, "relation %zu: (%u, %u) is not a pair of two distinct items of %zu",
                     r, a, b, items);
            return UFORM_INVALID_ARGUMENT;
        }
    }
    return UFORM_OK;
}

uform_status_t train_forward(uform_trainer_t *trainer, uform_executor_t *executor, train_batch_t const *batch,
                             train_progress_t *progress, train_work_t **out, char *message, size_t capacity) {
    *out = NULL;
    uform_status_t status = train_validate(trainer, batch, message, capacity);
    if (status != UFORM_OK) return status;
    train_work_t *w = calloc(1, sizeof *w);
    if (!w) {
        snprintf(message, capacity, "cannot allocate the step");
        return UFORM_OUT_OF_MEMORY;
    }
    w->batch = *batch;
    uform_model_info_t const *info = &trainer->params.info;
    size_t items = batch->items, dims = info->dims;
    status = plan_batch(trainer, batch, NULL, &w->plan, message, capacity);
    if (status != UFORM_OK) {
        train_work_free(w);
        return status;
    }
    batch_plan_t const *plan = &w->plan;
    status = UFORM_OUT_OF_MEMORY;
    snprintf(message, capacity, "cannot allocate the step's buffers");
    size_t max_hidden = 0, max_tokens = plan->text_tokens;
    if (info->has_text) max_hidden = info->text.transformer.hidden;
    if (info->has_image && info->image.transformer.hidden > max_hidden)
        max_hidden = info->image.transformer.hidden;
    if (info->has_audio && info->audio.transformer.hidden > max_hidden)
        max_hidden = info->audio.transformer.hidden;
    if (plan->image_rows + plan->images > max_tokens) max_tokens = plan->image_rows + plan->images;
    if (plan->sound_rows + plan->sounds > max_tokens) max_tokens = plan->sound_rows + plan->sounds;
    w->d_states = malloc((max_tokens + 1) * max_hidden * sizeof(float));
    w->d_x = malloc((max_tokens + 1) * max_hidden * sizeof(float));
    w->e = calloc((items + 1) * dims, sizeof(double));
    w->de = malloc((items + 1) * dims * sizeof(double));
    w->video_norms = calloc(items + 1, sizeof(double));
    w->related = calloc(items * items + 1, 1);
    w->text_rows = malloc((plan->texts + 1) * sizeof(size_t));
    w->image_rows = malloc((plan->images + 1) * sizeof(size_t));
    w->sound_rows = malloc((plan->sounds + 1) * sizeof(size_t));
    if (!w->d_states || !w->d_x || !w->e || !w->de || !w->video_norms || !w->related || !w->text_rows ||
        !w->image_rows || !w->sound_rows)
        goto fail;
    for (size_t r = 0; r < batch->relations_count; ++r) {
        uint32_t a = batch->relations[2 * r], b = batch->relations[2 * r + 1];
        w->related[a * items + b] = w->related[b * items + a] = 1;
    }
    if (cancelled(progress, 1)) goto cancel;

    if (plan->texts) {
        train_tower_t const *trunk = &trainer->text;
        size_t hidden = trunk->hidden;
        w->text_x = malloc(plan->text_tokens * hidden * sizeof(float));
        w->logits = malloc(plan->text_tokens * 256 * sizeof(float));
        if (!w->text_x || !w->logits || !trunk_out_make(&w->text_out, plan->texts, hidden, dims)) goto fail;
        for (size_t t = 0; t < plan->text_tokens; ++t)
            memcpy(w->text_x + t * hidden, trainer->text.embed->value + plan->tokens[t] * hidden,
                   hidden * sizeof(float));
        if (!train_tower_forward(trunk, executor, &trainer->text_pass, w->text_x, plan->text_tokens,
                                 plan->text_offsets, plan->texts, true, true))
            goto fail;
        for (size_t t = 0; t < plan->texts; ++t)
            w->text_rows[t] = plan->text_offsets[t + 1] - 1;
        trunk_out_forward(executor, trunk, &trainer->text_pass, w->text_rows, &w->text_out);
    }
    if (plan->images &&
        !patch_trunk_forward(&trainer->image, executor, &trainer->image_pass, plan->image_patches,
                             plan->image_rows, plan->image_offsets, plan->images, dims, &w->image_out,
                             &w->image_x, &w->image_embedded, w->image_rows))
        goto fail;
    if (plan->sounds &&
        !patch_trunk_forward(&trainer->audio, executor, &trainer->audio_pass, plan->sound_patches,
                             plan->sound_rows, plan->sound_offsets, plan->sounds, dims, &w->sound_out,
                             &w->sound_x, &w->sound_embedded, w->sound_rows))
        goto fail;
    if (cancelled(progress, 2)) goto cancel;

    /* The embeddings: a clip's is the normalized mean of its frames'. */
    for (size_t t = 0; t < plan->texts; ++t)
        memcpy(w->e + plan->text_items[t] * dims, w->text_out.unit + t * dims, dims * sizeof(double));
    for (size_t i = 0; i < plan->images; ++i)
        for (size_t c = 0; c < dims; ++c)
            w->e[plan->image_items[i] * dims + c] += w->image_out.unit[i * dims + c];
    for (size_t i = 0; i < plan->sounds; ++i)
        memcpy(w->e + plan->sound_items[i] * dims, w->sound_out.unit + i * dims, dims * sizeof(double));
    for (size_t i = 0; i < items; ++i)
        if (batch->modalities[i] == UFORM_MODALITY_VIDEO) {
            for (size_t c = 0; c < dims; ++c)
                w->e[i * dims + c] /= (double)info->video.frames;
            w->video_norms[i] = normalize_double(w->e + i * dims, dims);
        }
    message[0] = '\0';
    *out = w;
    return UFORM_OK;
cancel:
    status = UFORM_CANCELLED;
    snprintf(message, capacity, "the progress handler cancelled the step");
fail:
    train_work_free(w);
    return status;
}

uform_status_t train_backward(uform_trainer_t *trainer, uform_executor_t *executor, train_work_t *w,
                              double const *global, size_t global_items, size_t first, size_t predicted,
                              train_losses_t *losses, train_progress_t *progress, char *message,
                              size_t capacity) {
    uform_model_info_t const *info = &trainer->params.info;
    batch_plan_t const *plan = &w->plan;
    size_t items = w->batch.items, dims = info->dims;
    memset(losses, 0, sizeof *losses);
    losses->contrastive = contrastive(trainer, global, global_items, first, items, w->related, w->de);
    if (isnan(losses->contrastive)) {
        snprintf(message, capacity, "cannot allocate the loss's buffers");
        return UFORM_OUT_OF_MEMORY;
    }
    for (size_t i = 0; i < items; ++i)
        if (w->batch.modalities[i] == UFORM_MODALITY_VIDEO) {
            normalize_backward(w->de + i * dims, w->e + i * dims, w->video_norms[i], dims);
            for (size_t c = 0; c < dims; ++c)
                w->de[i * dims + c] /= (double)info->video.frames;
        }
    for (size_t t = 0; t < plan->texts; ++t)
        memcpy(w->text_out.d_unit + t * dims, w->de + plan->text_items[t] * dims, dims * sizeof(double));
    for (size_t i = 0; i < plan->images; ++i)
        memcpy(w->image_out.d_unit + i * dims, w->de + plan->image_items[i] * dims, dims * sizeof(double));
    for (size_t i = 0; i < plan->sounds; ++i)
        memcpy(w->sound_out.d_unit + i * dims, w->de + plan->sound_items[i] * dims, dims * sizeof(double));

    /* Texts: the next-byte loss joins the embedding's gradient at the states. */
    if (plan->texts) {
        train_tower_t const *trunk = &trainer->text;
        size_t hidden = trunk->hidden;
        memset(w->d_states, 0, plan->text_tokens * hidden * sizeof(float));
        losses->lm = lm_loss(trainer, executor, w, predicted, w->d_states);
        trunk_out_backward(executor, trunk, w->text_rows, &w->text_out, w->d_states);
        train_tower_backward(trunk, executor, &trainer->text_pass, w->d_states, w->d_x);
        for (size_t t = 0; t < plan->text_tokens; ++t) {
            float *row = trainer->text.embed->grad + plan->tokens[t] * hidden;
            for (size_t c = 0; c < hidden; ++c)
                row[c] += w->d_x[t * hidden + c];
        }
    }
    if (cancelled(progress, 3)) {
        snprintf(message, capacity, "the progress handler cancelled the step");
        return UFORM_CANCELLED;
    }
    if (plan->images)
        patch_trunk_backward(&trainer->image, executor, &trainer->image_pass, plan->image_patches,
                             plan->image_rows, plan->image_offsets, plan->images, &w->image_out,
                             w->image_rows, w->d_states, w->d_x, w->image_embedded);
    if (plan->sounds)
        patch_trunk_backward(&trainer->audio, executor, &trainer->audio_pass, plan->sound_patches,
                             plan->sound_rows, plan->sound_offsets, plan->sounds, &w->sound_out,
                             w->sound_rows, w->d_states, w->d_x, w->sound_embedded);
    losses->loss = losses->contrastive + trainer->lm_weight * losses->lm;
    message[0] = '\0';
    return UFORM_OK;
}

uform_status_t train_compute(uform_trainer_t *trainer, uform_executor_t *executor, train_batch_t const *batch,
                             train_losses_t *losses, train_progress_t *progress, char *message,
                             size_t capacity) {
    memset(losses, 0, sizeof *losses);
    train_work_t *work = NULL;
    uform_status_t status = train_forward(trainer, executor, batch, progress, &work, message, capacity);
    if (status != UFORM_OK) return status;
    status = train_backward(trainer, executor, work, work->e, work->batch.items, 0, work->plan.predicted,
                            losses, progress, message, capacity);
    train_work_free(work);
    return status;
}

/* ---- The RAM trainer's step ------------------------------------------------------------------------ */

/* A step's work on the host, with its exchanges over the mesh. */
typedef struct ram_step {
    train_work_t *work;
    mesh_request_t requests[2];
    size_t pending; /* requests in flight */
    int *counts, *displacements;
    double *global;   /* [global items, dims] */
    float *packed;    /* every gradient end to end */
    double shares[2]; /* contrastive, next-byte */
} ram_step_t;

static uform_status_t ram_forward(train_step_t *step) {
    uform_trainer_t *trainer = step->trainer;
    ram_step_t *ram = calloc(1, sizeof *ram);
    if (!ram) {
        snprintf(trainer->message, sizeof trainer->message, "cannot allocate the step");
        return UFORM_OUT_OF_MEMORY;
    }
    step->work = ram;
    train_params_zero_grad(&trainer->params);
    uform_status_t status = train_forward(trainer, step->executor, &step->batch, &step->tracker, &ram->work,
                                          trainer->message, sizeof trainer->message);
    if (status != UFORM_OK) return status;
    step->local_items = train_work_items(ram->work);
    step->local_predicted = train_work_predicted(ram->work);
    return UFORM_OK;
}

/* The status of posting an exchange, its failure named in the trainer's message. */
static uform_status_t ram_posted(train_step_t *step, uform_status_t status, char const *exchange) {
    if (status != UFORM_OK)
        snprintf(step->trainer->message, sizeof step->trainer->message,
                 "posting the %s exchange over the mesh failed", exchange);
    return status;
}

static uform_status_t ram_embeddings(train_step_t *step) {
    uform_trainer_t *trainer = step->trainer;
    uform_mesh_t *mesh = trainer->mesh;
    ram_step_t *ram = step->work;
    size_t dims = trainer->params.info.dims;
    ram->counts = malloc(mesh->size * sizeof(int));
    ram->displacements = malloc(mesh->size * sizeof(int));
    ram->global = malloc((step->global_items * dims + 1) * sizeof(double));
    if (!ram->counts || !ram->displacements || !ram->global) {
        snprintf(trainer->message, sizeof trainer->message, "cannot allocate the embeddings' exchange");
        return UFORM_OUT_OF_MEMORY;
    }
    for (size_t p = 0, at = 0; p < mesh->size; at += step->process_items[p] * dims, ++p) {
        ram->counts[p] = (int)(step->process_items[p] * dims);
        ram->displacements[p] = (int)at;
    }
    ram->pending = 1;
    return ram_posted(step,
                      mesh_allgatherv_f64(mesh, train_work_embeddings(ram->work), step->local_items * dims,
                                          ram->global, ram->counts, ram->displacements, &ram->requests[0]),
                      "embeddings'");
}

static uform_status_t ram_backward(train_step_t *step) {
    uform_trainer_t *trainer = step->trainer;
    ram_step_t *ram = step->work;
    double const *global = step->meshed ? ram->global : train_work_embeddings(ram->work);
    uform_status_t status = train_backward(
        trainer, step->executor, ram->work, global, step->global_items, step->first, step->predicted,
        &step->losses, step->meshed ? NULL : &step->tracker, trainer->message, sizeof trainer->message);
    ram->shares[0] = step->losses.contrastive;
    ram->shares[1] = step->losses.lm;
    return status;
}

/* Every gradient into `packed`, end to end, or back from it. */
static void grads_copy(train_params_t *params, float *packed, bool into_packed) {
    for (size_t i = 0, at = 0; i < params->count; at += params->tensors[i].count, ++i) {
        float *grad = params->tensors[i].grad;
        size_t bytes = params->tensors[i].count * sizeof(float);
        memcpy(into_packed ? packed + at : grad, into_packed ? grad : packed + at, bytes);
    }
}

static uform_status_t ram_reduce(train_step_t *step) {
    uform_trainer_t *trainer = step->trainer;
    train_params_t *params = &trainer->params;
    ram_step_t *ram = step->work;
    size_t total = 0;
    for (size_t i = 0; i < params->count; ++i)
        total += params->tensors[i].count;
    if (!(ram->packed = malloc((total + 1) * sizeof(float)))) {
        snprintf(trainer->message, sizeof trainer->message, "cannot allocate the gradients' exchange");
        return UFORM_OUT_OF_MEMORY;
    }
    grads_copy(params, ram->packed, true);
    ram->pending = 2;
    uform_status_t status = mesh_allreduce_f32(trainer->mesh, ram->packed, total, &ram->requests[0]);
    if (status == UFORM_OK) status = mesh_allreduce_f64(trainer->mesh, ram->shares, 2, &ram->requests[1]);
    return ram_posted(step, status, "gradients' sum");
}

static uform_status_t ram_update(train_step_t *step) {
    uform_trainer_t *trainer = step->trainer;
    train_params_t *params = &trainer->params;
    ram_step_t *ram = step->work;
    if (step->meshed) {
        grads_copy(params, ram->packed, false);
        step->losses = (train_losses_t){.contrastive = ram->shares[0], .lm = ram->shares[1]};
        step->losses.loss = step->losses.contrastive + trainer->lm_weight * step->losses.lm;
    }
    if (!isfinite(step->losses.loss)) {
        step->skipped = TRAIN_SKIP_LOSS;
        return UFORM_OK;
    }
    if (!isfinite(train_params_update(params, step->executor, NULL))) step->skipped = TRAIN_SKIP_NORM;
    return UFORM_OK;
}

static uform_status_t ram_test(train_step_t *step, bool *done) {
    ram_step_t *ram = step->work;
    *done = false;
    while (ram->pending > 0) {
        bool complete = false;
        if (mesh_test(step->trainer->mesh, &ram->requests[ram->pending - 1], &complete) != UFORM_OK) {
            snprintf(step->trainer->message, sizeof step->trainer->message,
                     "a collective of the mesh failed");
            return UFORM_IO;
        }
        if (!complete) return UFORM_OK;
        ram->pending--;
    }
    *done = true;
    return UFORM_OK;
}

static void ram_end(train_step_t *step, uform_status_t status) {
    ram_step_t *ram = step->work;
    if (status != UFORM_OK)
        train_params_zero_grad(&step->trainer->params); /* nothing of a failed step stays */
    if (!ram) return;
    train_work_free(ram->work);
    void *const buffers[] = {ram->counts, ram->displacements, ram->global, ram->packed, ram};
    train_free_each(buffers, sizeof buffers / sizeof buffers[0]);
    step->work = NULL;
}

train_step_ops_t const train_ram_ops = {
    .forward = ram_forward,
    .embeddings = ram_embeddings,
    .backward = ram_backward,
    .reduce = ram_reduce,
    .update = ram_update,
    .test = ram_test,
    .end = ram_end,
};
