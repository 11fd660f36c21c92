/* A call's life: the verb validates its arguments on the calling thread, acquires the executor
 * (`call_begin`, which answers UFORM_CONTENDED at once when another call holds it), prepares its state,
 * and submits it (`call_submit`); `call_run` does all of it from the verb's plan. The state machine then runs
 * on the executor's loop thread as loop callbacks, and ends with exactly one `call_finish`, which releases
 * the executor, makes the outcome final, and notifies external loops. Nothing touches the call's state after
 * `call_finish`.
 *
 * The hold is here too: which call holds an executor, how many are still finishing, and the public
 * verbs that wait for none (uform_executor_drain, uform_executor_free). */
#pragma once

#include "common.h"
#include "executor.h"
#include "loop.h"
#include "outcome.h"

typedef struct call call_t;
struct call {
    loop_op_t op; /* the post that starts the call on the loop thread */
    void (*start)(call_t *call);
    uform_executor_t *executor;
    outcome_t *outcome;
    char const *entry; /* the public entry point, for errors */
};

/* Starts a call on the calling thread: checks that the outcome was initialized and is not pending,
 * acquires the executor (UFORM_CONTENDED if held), and marks the outcome pending. On failure the
 * outcome (when initialized) is made final with the same status, the failure is recorded, and the
 * status is answered. */
uform_status_t call_begin(call_t *call, uform_executor_t *executor, outcome_t *outcome, char const *entry);

/* The common opening of a verb whose state lives in the executor's call storage: resolves the
 * executor (NULL: the calling thread's), takes `arena` (when not NULL; UFORM_CONTENDED if held), then
 * the executor (call_begin), on `outcome`, or on `own` (initialized here) for a blocking call. On
 * UFORM_OK, `*call` is the call at the start of the storage and the `state_size - sizeof(call_t)` bytes
 * after it are zeroed; on failure nothing is held and the failure is recorded. */
uform_status_t call_open(uform_executor_t *executor, uform_arena_t *arena, uform_outcome_t *outcome,
                         uform_outcome_t *own, size_t state_size, char const *entry, call_t **call);

/* Fills an opened state (in the storage: zeroed past its call_t) from `request`, on the calling thread. */
typedef struct call_fill {
    void (*fill)(call_t *call, void const *request);
    void const *request;
} call_fill_t;

/* A blocking call, once final (whatever its status): takes its product from `own` into `product`. */
typedef struct call_keep {
    void (*keep)(uform_outcome_t *own, void *product);
    void *product;
} call_keep_t;

/* A verb's call from its opening to its submission (call_run). */
typedef struct call_plan {
    char const *entry;
    uform_executor_t *executor; /* NULL: the calling thread's */
    uform_arena_t *arena;       /* taken before the executor, when not NULL */
    uform_outcome_t *outcome;   /* NULL: a blocking call, on an outcome of call_run's own */
    size_t state_size;          /* the state in the executor's call storage, its call_t first */
    /* NULL: the state lives in the storage; else the verb's own, malloc'ed with its call_t first, and
     * freed by call_run when the call cannot open. */
    call_t *state;
    void (*start)(call_t *call);
    call_fill_t fill; /* NULL fill: nothing to fill */
    call_keep_t keep; /* NULL keep: a call with no product */
} call_plan_t;

/* The plan of a call in the executor's storage, with nothing to fill and no product yet. */
call_plan_t call_plan(char const *entry, uform_executor_t *executor, uform_arena_t *arena,
                      uform_outcome_t *outcome, size_t state_size, void (*start)(call_t *call));

/* Opens the plan's call (as call_open does, on `state` when it has one), fills it and submits it. A
 * deferred call answers UFORM_OK; a blocking one waits, keeps its product and answers its status. On a
 * failure to open, nothing is held and the failure is recorded (and `state` freed). */
uform_status_t call_run(call_plan_t const *plan);

/* Hands a begun call to its executor: its `start` runs on the loop thread. Inline and pool executors
 * run the loop on the calling thread until the outcome is final, then release the executor. */
void call_submit(call_t *call);

/* Ends a call: records the failure (message NULL for UFORM_OK), releases a threaded executor (the
 * calling thread releases the others once its loop returns), makes the outcome final, wakes its
 * waiters and notifies its external loops. Products must be stored in the outcome before. Runs on the
 * loop thread. */
void call_finish(call_t *call, uform_status_t status, char const *message);

/* A verb's failure before submission: records it and, when an initialized outcome was given, makes
 * that outcome final with it (with notifications). Answers `status`. */
uform_status_t call_refuse(uform_outcome_t *outcome, uform_status_t status, char const *entry,
                           char const *message);

/* A blocking call's tail: waits on its own outcome and records a failure on the calling thread. */
uform_status_t call_wait(outcome_t *outcome);

/* Runs a progress handler if the step threshold was crossed; answers true when it asks to cancel.
 * `next_step` is the caller's cursor, starting at 1. */
bool progress_report(uform_progress_t const *progress, size_t *next_step, size_t completed, size_t total);
