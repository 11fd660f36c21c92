/* The trainer behind the public uform_trainer_* verbs (train_step.c, train_verbs.c), and the step every
 * residency shares: train_verbs.c runs its phases (train_step_ops_t), the RAM trainer's computed on the
 * host (train_step.c), the VRAM trainer's enqueued on its device (train_vram.c). */
#pragma once

#include "audio_frontend.h"
#include "image_preprocess.h"
#include "train.h"

typedef struct train_step_ops train_step_ops_t;

struct uform_trainer {
    train_step_ops_t const *ops; /* the residency's step: &train_ram_ops, or the VRAM trainer's */
    void *device;                /* the VRAM trainer's state, freed by device_release; NULL on RAM */
    void (*device_release)(uform_trainer_t *trainer);
    /* Brings params' values and moments up to date from the device before a save; NULL on RAM. */
    uform_status_t (*device_sync)(uform_trainer_t *trainer, char const **message);
    train_params_t params;
    double lm_weight;
    train_tower_t text, image, audio;
    train_pass_t text_pass, image_pass, audio_pass;
    train_tensor_t *logit_scale, *logit_bias;
    image_geometry_t geometry;
    audio_frontend_t frontend;
    bool frontend_ready;
    uform_executor_t *executor;             /* the executor it was made on */
    uform_mesh_t *mesh;                     /* NULL or one process: no collectives */
    char message[UFORM_ERROR_MESSAGE_SIZE]; /* a failing step's reason: call_finish copies it */
};

typedef struct train_batch {
    size_t items;
    uform_modality_t const *modalities;
    uform_tape_t contents;
    uint32_t const *relations;
    size_t relations_count;
} train_batch_t;

/* The batch, regrouped per tower: the host's part of a step, shared by every residency. */
typedef struct batch_plan {
    size_t items;
    /* text */
    size_t texts, text_tokens;
    size_t *text_items;   /* [texts]: the batch item of each text */
    size_t *text_offsets; /* [texts + 1] token offsets */
    uint16_t *tokens;     /* [text_tokens]: 256 for BOS, else the byte */
    size_t predicted;     /* positions with a next byte */
    /* image trunk: images and video frames, each one image of 1 + P tokens */
    size_t images, image_rows; /* image-trunk items, and their patch rows */
    size_t *image_items;       /* [images]: the batch item of each (a clip's frames are consecutive) */
    size_t *image_offsets;     /* [images + 1] token offsets */
    float *image_patches;      /* [image_rows, 3 patch^2] */
    /* audio trunk */
    size_t sounds, sound_rows;
    size_t *sound_items, *sound_offsets; /* [sounds], [sounds + 1] token offsets */
    float *sound_patches;                /* [sound_rows, mels * patch_frames] */
} batch_plan_t;

/* The batch's texts as tokens, and its images, clips and sounds decoded and turned into patch rows as
 * the encode verbs make them: on the calling thread, or over the threads of `workers` (an executor the
 * caller may fork on) one item each at a time; the numbers are the same either way. Answers UFORM_OK,
 * UFORM_FORMAT or UFORM_UNSUPPORTED (the first item that cannot be decoded, named in `message`),
 * UFORM_OUT_OF_MEMORY. */
uform_status_t plan_batch(uform_trainer_t const *trainer, train_batch_t const *batch,
                          uform_executor_t *workers, batch_plan_t *plan, char *message, size_t capacity);
void plan_free(batch_plan_t *plan);

typedef struct train_losses {
    double loss, contrastive, lm;
} train_losses_t;

/* Progress over a step's phases: inputs prepared, forward passes, the text tower's backward pass, the
 * other backward passes and the update. */
#define TRAIN_PHASES 4
typedef struct train_progress {
    uform_progress_t const *progress;
    size_t next_step;
} train_progress_t;

/* ---- A step on any residency -------------------------------------------------------------------- */

/* Why a step changed no weight although its work succeeded. */
typedef enum train_skip { TRAIN_SKIP_NONE, TRAIN_SKIP_LOSS, TRAIN_SKIP_NORM } train_skip_t;

/* What the phases of a step share: train_verbs.c fills the batch, the counts over the mesh and the
 * progress; the residency its work, the losses and the skip. */
typedef struct train_step {
    uform_trainer_t *trainer;
    uform_executor_t *executor;
    train_batch_t batch;
    train_progress_t tracker;
    void *work;                            /* the residency's, from forward to end */
    size_t local_items, local_predicted;   /* this process's, once forward answered */
    size_t global_items, first, predicted; /* over the mesh (this process's items from `first`), or local */
    bool meshed;                           /* over a mesh of two processes or more */
    size_t const *process_items;           /* [mesh size]: every process's items, once the counts are in */
    train_losses_t losses;                 /* final once update answered */
    train_skip_t skipped;
} train_step_t;

/* The phases, in order: forward; on a mesh, the counts (train_verbs.c) and embeddings; backward; on a mesh
 * reduce; update; then end. After embeddings, reduce and update, test says when what they posted or
 * enqueued is complete, the loop asking again on a growing timer. Each answers a status with the reason in
 * trainer->message; a failure ends the step. end runs once, whatever happened: on a failure it zeroes the
 * gradients, and it releases the step's work once nothing in flight uses it. */
struct train_step_ops {
    uform_status_t (*forward)(train_step_t *step);
    uform_status_t (*embeddings)(train_step_t *step);
    uform_status_t (*backward)(train_step_t *step);
    uform_status_t (*reduce)(train_step_t *step);
    uform_status_t (*update)(train_step_t *step);
    uform_status_t (*test)(train_step_t *step, bool *done);
    void (*end)(train_step_t *step, uform_status_t status);
};

/* The RAM trainer's step (train_step.c). */
extern train_step_ops_t const train_ram_ops;

/* The checks of a batch against the model that need no decoding: modalities the model has, relations
 * between distinct items. UFORM_OK, UFORM_INVALID_ARGUMENT or UFORM_UNSUPPORTED with the reason. */
uform_status_t train_validate(uform_trainer_t const *trainer, train_batch_t const *batch, char *message,
                              size_t capacity);

/* A trainer for `config`: from a checkpoint (resume_path) or seeded. The reason in *message, which may
 * point into `reason` (UFORM_ERROR_MESSAGE_SIZE bytes: see train_params_load). */
uform_status_t trainer_create(uform_trainer_config_t const *config, uform_trainer_t **trainer, char *reason,
                              char const **message);
void trainer_destroy(uform_trainer_t *trainer);

/* The loss of a batch at the current weights, and its gradient accumulated into every parameter's
 * `grad` (not zeroed here). Answers UFORM_OK, UFORM_INVALID_ARGUMENT (a bad modality or relation),
 * UFORM_UNSUPPORTED (a modality the model lacks, or one this build cannot decode), UFORM_FORMAT (an item
 * that cannot be decoded: the message names it), UFORM_OUT_OF_MEMORY, UFORM_CANCELLED; the reason in
 * `message`. */
uform_status_t train_compute(uform_trainer_t *trainer, uform_executor_t *executor, train_batch_t const *batch,
                             train_losses_t *losses, train_progress_t *progress, char *message,
                             size_t capacity);

/* The two halves of train_compute, for a step whose loss spans the processes of a mesh: the forward
 * passes and this process's embeddings; then, given the embeddings of the whole batch (this process's at
 * rows [first, first + items)) and the positions the whole batch predicts, this process's share of the
 * loss and its gradients. A cancelled or failed half leaves the parameters' gradients to be zeroed by the
 * caller. */
typedef struct train_work train_work_t;
uform_status_t train_forward(uform_trainer_t *trainer, uform_executor_t *executor, train_batch_t const *batch,
                             train_progress_t *progress, train_work_t **work, char *message, size_t capacity);
size_t train_work_items(train_work_t const *work);
size_t train_work_predicted(train_work_t const *work);
double const *train_work_embeddings(train_work_t const *work); /* [items, dims] */
uform_status_t train_backward(uform_trainer_t *trainer, uform_executor_t *executor, train_work_t *work,
                              double const *global, size_t global_items, size_t first, size_t predicted,
                              train_losses_t *losses, train_progress_t *progress, char *message,
                              size_t capacity);
void train_work_free(train_work_t *work);
