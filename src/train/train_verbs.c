/* The public trainer verbs (include/uform.h): each a call on the executor the trainer was made on, its
 * work done by the start callback on the loop thread, split over the executor's threads. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "call.h"
#include "mesh.h"
#include "tape.h"
#include "train_step.h"

typedef struct trainer_call {
    call_t call;
    uform_trainer_config_t config;
    uform_trainer_t **trainer;
    uform_trainer_t *made;
} trainer_init_call_t;

_Static_assert(sizeof(trainer_init_call_t) <= EXECUTOR_CALL_STORAGE, "trainer_init_call_t outgrew the call storage");
_Static_assert(offsetof(trainer_init_call_t, call) == 0, "open_call answers the state at its call");

/* Opens a call whose state (`size` bytes, the call_t at its start, as call_open lays it out) is started by
 * `start`: answers that state, or NULL when call_open refuses it, with the refusal (recorded) in *status. */
static void *open_call(uform_executor_t *executor, uform_outcome_t *outcome, uform_outcome_t *own,
                       size_t size, char const *entry, void (*start)(call_t *), uform_status_t *status) {
    call_t *call = NULL;
    *status = call_open(executor, NULL, outcome, own, size, entry, &call);
    if (*status != UFORM_OK) return NULL;
    call->start = start;
    return call;
}

/* Submits an opened call: UFORM_OK when it reports on the caller's outcome, else its status once done. */
static uform_status_t submit_call(call_t *call, uform_outcome_t *outcome, uform_outcome_t *own) {
    call_submit(call);
    return outcome ? UFORM_OK : call_wait(outcome_of(own));
}

static void init_start(call_t *call) {
    trainer_init_call_t *init = container_of(call, trainer_init_call_t, call);
    char const *message = NULL;
    char reason[UFORM_ERROR_MESSAGE_SIZE];
    uform_trainer_t *trainer = NULL;
    uform_status_t status = trainer_create(&init->config, &trainer, reason, &message);
    if (status == UFORM_OK) {
        trainer->executor = call->executor;
        trainer->mesh = init->config.mesh;
        *init->trainer = trainer;
    }
    call_finish(call, status, message);
}

UFORM_EXPORT uform_status_t uform_trainer_init_ram(uform_trainer_init_args_t const *args) {
    static char const entry[] = "uform_trainer_init_ram";
    if (!args) return failed(UFORM_INVALID_ARGUMENT, entry, "args is NULL");
    if (!args->executor || !args->config || !args->trainer)
        return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry, "executor, config or trainer is NULL");
    if (executor_on_device(args->executor))
        return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry,
                           "a RAM trainer runs on a host executor; VRAM executors take uform_trainer_init_vram");
    *args->trainer = NULL;
    uform_outcome_t own;
    uform_status_t status = UFORM_OK;
    trainer_init_call_t *init =
        open_call(args->executor, args->outcome, &own, sizeof *init, entry, init_start, &status);
    if (!init) return status;
    init->config = *args->config;
    init->trainer = args->trainer;
    return submit_call(&init->call, args->outcome, &own);
}

UFORM_EXPORT uform_status_t uform_trainer_init_vram(uform_trainer_init_args_t const *args) {
    static char const entry[] = "uform_trainer_init_vram";
    if (!args) return failed(UFORM_INVALID_ARGUMENT, entry, "args is NULL");
    if (!args->executor || !args->config || !args->trainer)
        return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry, "executor, config or trainer is NULL");
    return call_refuse(args->outcome, UFORM_UNSUPPORTED, entry,
                       "this version trains on host executors only: uform_trainer_init_ram");
}

UFORM_EXPORT void uform_trainer_free(uform_trainer_t *trainer) {
    trainer_destroy(trainer);
}

/* ---- Step ----------------------------------------------------------------------------------------- */

/* A step over a mesh of several processes exchanges, in turn: every process's item and predicted-byte
 * counts with its status (so that a process whose items fail or whose handler cancels takes the others
 * with it instead of leaving them waiting), every process's embeddings, then the sum of the gradients and
 * of the loss shares. Each exchange is posted and tested by the loop on a growing timer. */
typedef enum step_phase {
    STEP_COUNTS,
    STEP_EMBEDDINGS,
    STEP_REDUCE,
} step_phase_t;

typedef struct step_call {
    call_t call;
    uform_trainer_t *trainer;
    train_batch_t batch;
    uform_progress_t progress;
    bool has_progress;
    uform_trainer_step_stats_t *stats;
    train_work_t *work;
    train_progress_t tracker;
    uform_status_t local_status;
    /* The mesh's exchanges. */
    step_phase_t phase;
    loop_op_t poll;
    uint64_t polls;
    mesh_request_t requests[2];
    size_t pending; /* requests in flight */
    uint64_t local[3]; /* items, predicted positions, status */
    uint64_t *all;     /* [size * 3] */
    int *counts, *displacements;
    double *global;
    float *packed;
    double shares[2]; /* contrastive, lm */
    size_t global_items, first, predicted;
} step_call_t;

_Static_assert(sizeof(step_call_t) <= EXECUTOR_CALL_STORAGE, "step_call_t outgrew the call storage");
_Static_assert(offsetof(step_call_t, call) == 0, "open_call answers the state at its call");

static void step_end(step_call_t *step, uform_status_t status, train_losses_t const *losses) {
    uform_trainer_t *trainer = step->trainer;
    train_work_free(step->work);
    void *const exchanges[] = {step->all, step->counts, step->displacements, step->global, step->packed};
    train_free_each(exchanges, sizeof exchanges / sizeof exchanges[0]);
    if (status == UFORM_OK && !isfinite(losses->loss)) {
        status = UFORM_INVALID_ARGUMENT;
        snprintf(trainer->message, sizeof trainer->message,
                 "the loss is not finite (the run diverged: a lower learning rate may help); nothing was updated");
    }
    if (status != UFORM_OK) {
        train_params_zero_grad(&trainer->params); /* nothing of a failed step stays */
        call_finish(&step->call, status, trainer->message);
        return;
    }
    double rate = 0;
    train_params_update(&trainer->params, step->call.executor, &rate);
    if (step->stats)
        *step->stats = (uform_trainer_step_stats_t){.loss = losses->loss,
                                                    .contrastive_loss = losses->contrastive,
                                                    .lm_loss = losses->lm,
                                                    .learning_rate = rate,
                                                    .step = trainer->params.step};
    call_finish(&step->call, UFORM_OK, NULL);
}

static void step_wait(step_call_t *step);

static void step_failed(step_call_t *step, uform_status_t status, char const *what) {
    snprintf(step->trainer->message, sizeof step->trainer->message, "%s", what);
    step_end(step, status, NULL);
}

/* After posting `pending` requests of exchange `phase` (`status`, the posting's): waits for them, or ends the
 * step with `failure` when the posting failed. */
static void step_posted(step_call_t *step, uform_status_t status, size_t pending, step_phase_t phase,
                        char const *failure) {
    if (status != UFORM_OK) {
        step_failed(step, status, failure);
        return;
    }
    step->pending = pending;
    step->phase = phase;
    step_wait(step);
}

/* Every process's embeddings are here: this process's share of the loss and of the gradients, then their
 * sums over the mesh. */
static void step_reduce(step_call_t *step) {
    uform_trainer_t *trainer = step->trainer;
    train_params_t *params = &trainer->params;
    train_losses_t losses;
    uform_status_t status =
        train_backward(trainer, step->call.executor, step->work, step->global, step->global_items, step->first,
                       step->predicted, &losses, NULL, trainer->message, sizeof trainer->message);
    if (status != UFORM_OK) {
        step_end(step, status, NULL);
        return;
    }
    size_t total = 0;
    for (size_t i = 0; i < params->count; ++i)
        total += params->tensors[i].count;
    step->packed = malloc((total + 1) * sizeof(float));
    if (!step->packed) {
        step_failed(step, UFORM_OUT_OF_MEMORY, "cannot allocate the gradients' exchange");
        return;
    }
    for (size_t i = 0, at = 0; i < params->count; at += params->tensors[i].count, ++i)
        memcpy(step->packed + at, params->tensors[i].grad, params->tensors[i].count * sizeof(float));
    step->shares[0] = losses.contrastive;
    step->shares[1] = losses.lm;
    status = mesh_allreduce_f32(trainer->mesh, step->packed, total, &step->requests[0]);
    if (status == UFORM_OK) status = mesh_allreduce_f64(trainer->mesh, step->shares, 2, &step->requests[1]);
    step_posted(step, status, 2, STEP_REDUCE, "posting the gradients' sum over the mesh failed");
}

static void step_exchanged(step_call_t *step) {
    uform_trainer_t *trainer = step->trainer;
    uform_mesh_t *mesh = trainer->mesh;
    size_t dims = trainer->params.info.dims;
    switch (step->phase) {
    case STEP_COUNTS: {
        uform_status_t worst = UFORM_OK;
        step->global_items = step->first = step->predicted = 0;
        for (size_t p = 0; p < mesh->size; ++p) {
            uint64_t const *entry = step->all + 3 * p;
            if (entry[2] != UFORM_OK && worst == UFORM_OK) worst = (uform_status_t)entry[2];
            if (p < mesh->rank) step->first += entry[0];
            step->global_items += entry[0];
            step->predicted += entry[1];
        }
        if (step->local_status != UFORM_OK) {
            step_end(step, step->local_status, NULL); /* the message is this process's own */
            return;
        }
        if (worst != UFORM_OK) {
            step_failed(step, worst, "another process of the mesh failed or cancelled this step");
            return;
        }
        step->counts = malloc(mesh->size * sizeof(int));
        step->displacements = malloc(mesh->size * sizeof(int));
        step->global = malloc((step->global_items * dims + 1) * sizeof(double));
        if (!step->counts || !step->displacements || !step->global) {
            step_failed(step, UFORM_OUT_OF_MEMORY, "cannot allocate the embeddings' exchange");
            return;
        }
        for (size_t p = 0, at = 0; p < mesh->size; ++p) {
            step->counts[p] = (int)(step->all[3 * p] * dims);
            step->displacements[p] = (int)at;
            at += step->all[3 * p] * dims;
        }
        size_t items = train_work_items(step->work);
        uform_status_t status = mesh_allgatherv_f64(mesh, train_work_embeddings(step->work), items * dims,
                                                    step->global, step->counts, step->displacements,
                                                    &step->requests[0]);
        step_posted(step, status, 1, STEP_EMBEDDINGS,
                    "posting the embeddings' exchange over the mesh failed");
        return;
    }
    case STEP_EMBEDDINGS:
        step_reduce(step);
        return;
    case STEP_REDUCE: {
        train_params_t *params = &trainer->params;
        for (size_t i = 0, at = 0; i < params->count; at += params->tensors[i].count, ++i)
            memcpy(params->tensors[i].grad, step->packed + at, params->tensors[i].count * sizeof(float));
        train_losses_t losses = {.contrastive = step->shares[0], .lm = step->shares[1]};
        losses.loss = losses.contrastive + trainer->lm_weight * losses.lm;
        step_end(step, UFORM_OK, &losses);
        return;
    }
    }
}

static void step_poll(loop_op_t *op) {
    step_call_t *step = container_of(op, step_call_t, poll);
    while (step->pending > 0) {
        bool done = false;
        if (mesh_test(&step->requests[step->pending - 1], &done) != UFORM_OK) {
            step_failed(step, UFORM_IO, "a collective of the mesh failed");
            return;
        }
        if (!done) {
            step_wait(step);
            return;
        }
        step->pending--;
    }
    step->polls = 0;
    step_exchanged(step);
}

/* Tests again soon: 10 us, growing to 1 ms while nothing arrives. */
static void step_wait(step_call_t *step) {
    uint64_t delay = 10000u << (step->polls < 7 ? step->polls : 7);
    step->polls++;
    step->poll.callback = step_poll;
    loop_timer(step->call.executor->loop, &step->poll, delay < 1000000 ? delay : 1000000);
}

static void step_start(call_t *call) {
    step_call_t *step = container_of(call, step_call_t, call);
    uform_trainer_t *trainer = step->trainer;
    step->tracker = (train_progress_t){step->has_progress ? &step->progress : NULL, 1};
    train_params_zero_grad(&trainer->params);
    step->local_status = train_forward(trainer, call->executor, &step->batch, &step->tracker, &step->work,
                                       trainer->message, sizeof trainer->message);
    uform_mesh_t *mesh = trainer->mesh;
    if (!mesh || mesh->size < 2) {
        if (step->local_status != UFORM_OK) {
            step_end(step, step->local_status, NULL);
            return;
        }
        train_losses_t losses;
        uform_status_t status = train_backward(trainer, call->executor, step->work, train_work_embeddings(step->work),
                                               train_work_items(step->work), 0, train_work_predicted(step->work),
                                               &losses, &step->tracker, trainer->message, sizeof trainer->message);
        if (status == UFORM_OK &&
            progress_report(step->tracker.progress, &step->tracker.next_step, TRAIN_PHASES, TRAIN_PHASES)) {
            status = UFORM_CANCELLED;
            snprintf(trainer->message, sizeof trainer->message, "the progress handler cancelled the step");
        }
        step_end(step, status, &losses);
        return;
    }
    /* Over a mesh: every process learns every other's counts and status first. */
    step->local[0] = step->work ? train_work_items(step->work) : 0;
    step->local[1] = step->work ? train_work_predicted(step->work) : 0;
    step->local[2] = (uint64_t)step->local_status;
    step->all = malloc(3 * mesh->size * sizeof(uint64_t));
    if (!step->all) {
        step_failed(step, UFORM_OUT_OF_MEMORY, "cannot allocate the counts' exchange");
        return;
    }
    uform_status_t status = mesh_allgather_u64(mesh, step->local, 3, step->all, &step->requests[0]);
    step_posted(step, status, 1, STEP_COUNTS, "posting the counts' exchange over the mesh failed");
}

static uform_status_t check_trainer(uform_trainer_t *trainer, uform_executor_t *executor, uform_outcome_t *outcome,
                                    char const *entry) {
    if (!trainer || !executor)
        return call_refuse(outcome, UFORM_INVALID_ARGUMENT, entry, "trainer or executor is NULL");
    if (trainer->executor != executor)
        return call_refuse(outcome, UFORM_INVALID_ARGUMENT, entry, "a trainer runs on the executor it was made on");
    return UFORM_OK;
}

UFORM_EXPORT uform_status_t uform_trainer_step(uform_trainer_step_args_t const *args) {
    static char const entry[] = "uform_trainer_step";
    if (!args) return failed(UFORM_INVALID_ARGUMENT, entry, "args is NULL");
    uform_status_t status = check_trainer(args->trainer, args->executor, args->outcome, entry);
    if (status != UFORM_OK) return status;
    char const *message = NULL;
    if (tape_validate(&args->contents, &message) != UFORM_OK)
        return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry, message);
    if (args->contents.count == 0) return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry, "no item");
    if (!args->modalities) return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry, "modalities is NULL");
    if (args->relations_count && !args->relations)
        return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry, "relations is NULL");
    uform_outcome_t own;
    step_call_t *step =
        open_call(args->executor, args->outcome, &own, sizeof *step, entry, step_start, &status);
    if (!step) return status;
    step->trainer = args->trainer;
    step->batch = (train_batch_t){.items = args->contents.count,
                                  .modalities = args->modalities,
                                  .contents = args->contents,
                                  .relations = args->relations,
                                  .relations_count = args->relations_count};
    if (args->progress) step->progress = *args->progress, step->has_progress = true;
    step->stats = args->stats;
    return submit_call(&step->call, args->outcome, &own);
}

/* ---- Save ----------------------------------------------------------------------------------------- */

typedef struct save_call {
    call_t call;
    uform_trainer_t *trainer;
    char const *path;
} save_call_t;

_Static_assert(offsetof(save_call_t, call) == 0, "open_call answers the state at its call");

static void save_start(call_t *call) {
    save_call_t *save = container_of(call, save_call_t, call);
    char const *message = NULL;
    char reason[UFORM_ERROR_MESSAGE_SIZE];
    uform_mesh_t *mesh = save->trainer->mesh;
    /* Over a mesh every process holds the same weights: the first one writes them. */
    uform_status_t status = mesh && mesh->rank > 0
                                ? UFORM_OK
                                : train_params_save(&save->trainer->params, save->path, reason, &message);
    call_finish(call, status, message);
}

UFORM_EXPORT uform_status_t uform_trainer_save(uform_trainer_save_args_t const *args) {
    static char const entry[] = "uform_trainer_save";
    if (!args) return failed(UFORM_INVALID_ARGUMENT, entry, "args is NULL");
    uform_status_t status = check_trainer(args->trainer, args->executor, args->outcome, entry);
    if (status != UFORM_OK) return status;
    if (!args->path || !*args->path) return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry, "path is empty");
    uform_outcome_t own;
    save_call_t *save =
        open_call(args->executor, args->outcome, &own, sizeof *save, entry, save_start, &status);
    if (!save) return status;
    save->trainer = args->trainer;
    save->path = args->path;
    return submit_call(&save->call, args->outcome, &own);
}
