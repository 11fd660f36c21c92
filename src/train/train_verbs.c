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
#include "train_vram.h"

typedef struct trainer_call {
    call_t call;
    uform_trainer_config_t config;
    uform_trainer_t **trainer;
    uform_trainer_t *made;
} trainer_init_call_t;

_Static_assert(sizeof(trainer_init_call_t) <= EXECUTOR_CALL_STORAGE,
               "trainer_init_call_t outgrew the call storage");
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
    }
#if UFORM_WITH_CUDA
    if (status == UFORM_OK && executor_on_device(call->executor) &&
        (status = train_vram_attach(trainer, call->executor, &message)) != UFORM_OK) {
        trainer_destroy(trainer);
        trainer = NULL;
    }
#endif
    if (status == UFORM_OK) *init->trainer = trainer;
    call_finish(call, status, message);
}

/* The init arguments' refusal, or UFORM_OK: a trainer runs on a VRAM executor when `device`, on a host
 * one otherwise (`elsewhere` says why not). */
static uform_status_t init_check(uform_trainer_init_args_t const *args, char const *entry, bool device,
                                 char const *elsewhere) {
    if (!args) return failed(UFORM_INVALID_ARGUMENT, entry, "args is NULL");
    if (!args->executor || !args->config || !args->trainer)
        return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry,
                           "executor, config or trainer is NULL");
    if (executor_on_device(args->executor) != device)
        return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry, elsewhere);
    return UFORM_OK;
}

/* Submits the init call of either residency, the arguments checked (init_check). */
static uform_status_t init_submit(uform_trainer_init_args_t const *args, char const *entry, bool device,
                                  char const *elsewhere) {
    uform_status_t status = init_check(args, entry, device, elsewhere);
    if (status != UFORM_OK) return status;
    *args->trainer = NULL;
    uform_outcome_t own;
    trainer_init_call_t *init =
        open_call(args->executor, args->outcome, &own, sizeof *init, entry, init_start, &status);
    if (!init) return status;
    init->config = *args->config;
    init->trainer = args->trainer;
    return submit_call(&init->call, args->outcome, &own);
}

UFORM_EXPORT uform_status_t uform_trainer_init_ram(uform_trainer_init_args_t const *args) {
    return init_submit(args, "uform_trainer_init_ram", false,
                       "a RAM trainer runs on a host executor; VRAM executors take uform_trainer_init_vram");
}

UFORM_EXPORT uform_status_t uform_trainer_init_vram(uform_trainer_init_args_t const *args) {
    return init_submit(args, "uform_trainer_init_vram", true,
                       "a VRAM trainer runs on a VRAM executor; host executors take uform_trainer_init_ram");
}

UFORM_EXPORT void uform_trainer_free(uform_trainer_t *trainer) {
    trainer_destroy(trainer);
}

/* ---- Step ----------------------------------------------------------------------------------------- */

/* A step runs the phases of its trainer's residency (train_step_ops_t) on the loop thread: forward; over a
 * mesh of several processes, every process's item and predicted-byte counts with its status (so that a
 * process whose items fail or whose handler cancels takes the others with it instead of leaving them
 * waiting), then the embeddings; backward; over a mesh, the sum of the gradients and of the loss shares;
 * the update. Whatever a phase posts (a collective) or enqueues (device work) the loop tests on a growing
 * timer before the next phase starts. */
typedef enum step_phase {
    STEP_COUNTS,
    STEP_EMBEDDINGS,
    STEP_REDUCE,
    STEP_UPDATE,
} step_phase_t;

typedef struct step_call {
    call_t call;
    train_step_t step;
    uform_progress_t progress;
    bool has_progress;
    uform_trainer_step_stats_t *stats;
    uform_status_t local_status;
    step_phase_t phase;
    loop_op_t poll;
    uint64_t polls;
    mesh_request_t counts; /* the counts' exchange, the only one of the step itself */
    bool counting;
    size_t *process_items; /* [size] */
} step_call_t;

_Static_assert(sizeof(step_call_t) <= EXECUTOR_CALL_STORAGE, "step_call_t outgrew the call storage");
_Static_assert(offsetof(step_call_t, call) == 0, "open_call answers the state at its call");

static void step_end(step_call_t *call, uform_status_t status) {
    train_step_t *step = &call->step;
    uform_trainer_t *trainer = step->trainer;
    if (status == UFORM_OK && step->skipped != TRAIN_SKIP_NONE) {
        status = UFORM_INVALID_ARGUMENT;
        snprintf(
            trainer->message, sizeof trainer->message,
            step->skipped == TRAIN_SKIP_LOSS
                ? "the loss is not finite (the run diverged: a lower learning rate may help); nothing was "
                  "updated"
                : "the gradient's norm is not finite (a gradient overflowed); nothing was updated");
    }
    trainer->ops->end(step, status);
    free(call->process_items);
    if (status != UFORM_OK) {
        call_finish(&call->call, status, trainer->message);
        return;
    }
    if (call->stats)
        *call->stats = (uform_trainer_step_stats_t){
            .loss = step->losses.loss,
            .contrastive_loss = step->losses.contrastive,
            .lm_loss = step->losses.lm,
            .learning_rate = train_learning_rate(&trainer->params.optimizer, trainer->params.step),
            .step = trainer->params.step};
    call_finish(&call->call, UFORM_OK, NULL);
}

static void step_wait(step_call_t *call);

/* After a phase that answered `status` (its reason in the trainer's message): waits for what it posted
 * (then `phase` follows), or ends the step. */
static void step_posted(step_call_t *call, uform_status_t status, step_phase_t phase) {
    if (status != UFORM_OK) {
        step_end(call, status);
        return;
    }
    call->phase = phase;
    call->polls = 0;
    step_wait(call);
}

/* The loss's share and gradients of this process; over a mesh, posts their sums; else the update. */
static void step_backward(step_call_t *call) {
    train_step_t *step = &call->step;
    train_step_ops_t const *ops = step->trainer->ops;
    uform_status_t status = ops->backward(step);
    if (status == UFORM_OK && !step->meshed &&
        progress_report(step->tracker.progress, &step->tracker.next_step, TRAIN_PHASES, TRAIN_PHASES)) {
        status = UFORM_CANCELLED;
        snprintf(step->trainer->message, sizeof step->trainer->message,
                 "the progress handler cancelled the step");
    }
    if (status == UFORM_OK && step->meshed) {
        step_posted(call, ops->reduce(step), STEP_REDUCE);
        return;
    }
    step_posted(call, status == UFORM_OK ? ops->update(step) : status, STEP_UPDATE);
}

/* Every process's counts are here: the failures of others end the step, else the embeddings' exchange. */
static void step_counted(step_call_t *call) {
    train_step_t *step = &call->step;
    uform_trainer_t *trainer = step->trainer;
    uform_mesh_t *mesh = trainer->mesh;
    uform_status_t worst = UFORM_OK;
    for (size_t p = 0; p < mesh->size; ++p) {
        uint64_t const *entry = mesh->counts_all + 3 * p;
        if (entry[2] != UFORM_OK && worst == UFORM_OK) worst = (uform_status_t)entry[2];
        if (p < mesh->rank) step->first += entry[0];
        call->process_items[p] = entry[0];
        step->global_items += entry[0];
        step->predicted += entry[1];
    }
    if (call->local_status != UFORM_OK) {
        step_end(call, call->local_status); /* the message is this process's own */
        return;
    }
    if (worst != UFORM_OK) {
        snprintf(trainer->message, sizeof trainer->message,
                 "another process of the mesh failed or cancelled this step");
        step_end(call, worst);
        return;
    }
    step->process_items = call->process_items;
    step_posted(call, trainer->ops->embeddings(step), STEP_EMBEDDINGS);
}

/* What the phase posted is complete: the next phase. */
static void step_advance(step_call_t *call) {
    switch (call->phase) {
    case STEP_COUNTS:
        step_counted(call);
        return;
    case STEP_EMBEDDINGS:
        step_backward(call);
        return;
    case STEP_REDUCE:
        step_posted(call, call->step.trainer->ops->update(&call->step), STEP_UPDATE);
        return;
    case STEP_UPDATE:
        step_end(call, UFORM_OK);
        return;
    }
}

static void step_poll(loop_op_t *op) {
    step_call_t *call = container_of(op, step_call_t, poll);
    train_step_t *step = &call->step;
    bool done = false;
    uform_status_t status;
    if (call->counting) {
        char const *message = "a collective of the mesh failed";
        status = mesh_test(step->trainer->mesh, &call->counts, &done);
        if (status == UFORM_DEVICE) mesh_usable(step->trainer->mesh, &message);
        if (status != UFORM_OK)
            snprintf(step->trainer->message, sizeof step->trainer->message, "%s", message);
        call->counting = status == UFORM_OK && !done;
    } else {
        status = step->trainer->ops->test(step, &done);
    }
    if (status != UFORM_OK) {
        step_end(call, status);
        return;
    }
    if (!done) {
        step_wait(call);
        return;
    }
    call->polls = 0;
    step_advance(call);
}

/* Tests again soon: 10 us, growing to 1 ms while nothing completes (mesh_poll_ns). */
static void step_wait(step_call_t *call) {
    call->poll.callback = step_poll;
    loop_timer(call->call.executor->loop, &call->poll, mesh_poll_ns(&call->polls));
}

/* Over a mesh: every process learns every other's counts and status first, in the mesh's own buffers
 * (which outlive a step whose exchange timed out). */
static void step_count(step_call_t *call) {
    train_step_t *step = &call->step;
    uform_mesh_t *mesh = step->trainer->mesh;
    mesh->counts_local[0] = step->local_items;
    mesh->counts_local[1] = step->local_predicted;
    mesh->counts_local[2] = (uint64_t)call->local_status;
    call->process_items = malloc(mesh->size * sizeof(size_t));
    uform_status_t status = UFORM_OUT_OF_MEMORY;
    snprintf(step->trainer->message, sizeof step->trainer->message, "cannot allocate the counts' exchange");
    if (call->process_items && (status = mesh_allgather_u64(mesh, mesh->counts_local, 3, mesh->counts_all,
                                                            &call->counts)) != UFORM_OK)
        snprintf(step->trainer->message, sizeof step->trainer->message,
                 "posting the counts' exchange over the mesh failed");
    call->counting = status == UFORM_OK;
    step_posted(call, status, STEP_COUNTS);
}

static void step_start(call_t *base) {
    step_call_t *call = container_of(base, step_call_t, call);
    train_step_t *step = &call->step;
    uform_trainer_t *trainer = step->trainer;
    step->executor = base->executor;
    step->tracker = (train_progress_t){call->has_progress ? &call->progress : NULL, 1};
    step->meshed = trainer->mesh && trainer->mesh->size > 1;
    char const *broken = NULL;
    if (mesh_usable(trainer->mesh, &broken) != UFORM_OK) { /* every process of it broke alike */
        snprintf(trainer->message, sizeof trainer->message, "%s", broken);
        step_end(call, UFORM_DEVICE);
        return;
    }
    call->local_status = trainer->ops->forward(step);
    if (step->meshed) {
        step_count(call);
        return;
    }
    if (call->local_status != UFORM_OK) {
        step_end(call, call->local_status);
        return;
    }
    step->global_items = step->local_items;
    step->predicted = step->local_predicted;
    step_backward(call);
}

static uform_status_t check_trainer(uform_trainer_t *trainer, uform_executor_t *executor,
                                    uform_outcome_t *outcome, char const *entry) {
    if (!trainer || !executor)
        return call_refuse(outcome, UFORM_INVALID_ARGUMENT, entry, "trainer or executor is NULL");
    if (trainer->executor != executor)
        return call_refuse(outcome, UFORM_INVALID_ARGUMENT, entry,
                           "a trainer runs on the executor it was made on");
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
    if (args->contents.count == 0)
        return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry, "no item");
    if (!args->modalities)
        return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry, "modalities is NULL");
    if (args->relations_count && !args->relations)
        return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry, "relations is NULL");
    uform_outcome_t own;
    step_call_t *call =
        open_call(args->executor, args->outcome, &own, sizeof *call, entry, step_start, &status);
    if (!call) return status;
    call->step.trainer = args->trainer;
    call->step.batch = (train_batch_t){.items = args->contents.count,
                                       .modalities = args->modalities,
                                       .contents = args->contents,
                                       .relations = args->relations,
                                       .relations_count = args->relations_count};
    if (args->progress) call->progress = *args->progress, call->has_progress = true;
    call->stats = args->stats;
    return submit_call(&call->call, args->outcome, &own);
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
    uform_trainer_t *trainer = save->trainer;
    /* Over a mesh every process holds the same weights: the first one writes them. */
    if (trainer->mesh && trainer->mesh->rank > 0) {
        call_finish(call, UFORM_OK, NULL);
        return;
    }
    uform_status_t status = trainer->device_sync ? trainer->device_sync(trainer, &message) : UFORM_OK;
    if (status == UFORM_OK) status = train_params_save(&trainer->params, save->path, reason, &message);
    call_finish(call, status, message);
}

UFORM_EXPORT uform_status_t uform_trainer_save(uform_trainer_save_args_t const *args) {
    static char const entry[] = "uform_trainer_save";
    if (!args) return failed(UFORM_INVALID_ARGUMENT, entry, "args is NULL");
    uform_status_t status = check_trainer(args->trainer, args->executor, args->outcome, entry);
    if (status != UFORM_OK) return status;
    if (!args->path || !*args->path)
        return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry, "path is empty");
    uform_outcome_t own;
    save_call_t *save =
        open_call(args->executor, args->outcome, &own, sizeof *save, entry, save_start, &status);
    if (!save) return status;
    save->trainer = args->trainer;
    save->path = args->path;
    return submit_call(&save->call, args->outcome, &own);
}
