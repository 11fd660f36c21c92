/* The trainer behind the public uform_trainer_* verbs (train_step.c, train_verbs.c). */
#pragma once

#include "audio_frontend.h"
#include "image_preprocess.h"
#include "train.h"

struct uform_trainer {
    train_params_t params;
    double lm_weight;
    train_tower_t text, image, audio;
    train_pass_t text_pass, image_pass, audio_pass;
    train_tensor_t *logit_scale, *logit_bias;
    image_geometry_t geometry;
    audio_frontend_t frontend;
    bool frontend_ready;
    uform_executor_t *executor; /* the executor it was made on */
    uform_mesh_t *mesh;         /* NULL or one process: no collectives */
    char message[UFORM_ERROR_MESSAGE_SIZE]; /* a failing step's reason: call_finish copies it */
};

typedef struct train_batch {
    size_t items;
    uform_modality_t const *modalities;
    uform_tape_t contents;
    uint32_t const *relations;
    size_t relations_count;
} train_batch_t;

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
                             train_losses_t *losses, train_progress_t *progress, char *message, size_t capacity);

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
                              train_losses_t *losses, train_progress_t *progress, char *message, size_t capacity);
void train_work_free(train_work_t *work);
