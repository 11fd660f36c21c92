/* Calls (call.h): the hold of an executor, a call's begin, submission and finish, and the public verbs
 * that wait until no call holds an executor. */
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "call.h"
#include "futex.h"

/* Lets the next call take the executor (before the outcome turns final, so that a caller who saw it
 * final can submit at once). */
static void executor_unhold(uform_executor_t *executor) {
    atomic_store_explicit(&executor->holder, NULL, memory_order_release);
}

/* Once the finishing call touches nothing more: counts it out, and wakes drain and free when none is
 * left. */
static void executor_settle(uform_executor_t *executor) {
    uint32_t previous = atomic_fetch_sub_explicit(&executor->active, 1, memory_order_acq_rel);
    if (previous == (1u | EXECUTOR_WAITERS)) {
        atomic_fetch_and_explicit(&executor->active, ~EXECUTOR_WAITERS, memory_order_acq_rel);
        futex_wake_all(&executor->active);
    }
}

/* Blocks until no call holds the executor and every call has finished finishing. */
static void executor_await_idle(uform_executor_t *executor) {
    for (;;) {
        uint32_t active = atomic_load_explicit(&executor->active, memory_order_acquire);
        bool held = atomic_load_explicit(&executor->holder, memory_order_acquire) != NULL;
        if (!(active & ~EXECUTOR_WAITERS)) {
            if (!held) return;
            sched_yield(); /* a call was just taken and has not counted itself yet */
            continue;
        }
        if (!(active & EXECUTOR_WAITERS) &&
            !atomic_compare_exchange_weak(&executor->active, &active, active | EXECUTOR_WAITERS))
            continue;
        futex_wait(&executor->active, active | EXECUTOR_WAITERS);
    }
}

UFORM_EXPORT void uform_executor_free(uform_executor_t *executor) {
    if (!executor) return;
    executor_await_idle(executor);
    executor_release(executor);
}

UFORM_EXPORT uform_status_t uform_executor_drain(uform_executor_t *executor, uform_mood_t mood) {
    static char const entry[] = "uform_executor_drain";
    if (!executor) return failed(UFORM_INVALID_ARGUMENT, entry, "executor is NULL");
    if (mood != UFORM_SLEEPING && mood != UFORM_SPINNING)
        return failed(UFORM_INVALID_ARGUMENT, entry, "unknown mood");
    executor_await_idle(executor);
    atomic_store_explicit(&executor->mood, (uint32_t)mood, memory_order_relaxed);
    atomic_store_explicit(&executor->spin_held, mood == UFORM_SPINNING, memory_order_relaxed);
    /* Threads asleep or polling in the old mood pick the new one up at once. */
    if (executor->threaded) loop_wake(executor->loop);
    if (executor->ops->wake_idle) executor->ops->wake_idle(executor);
    return UFORM_OK;
}

uform_status_t call_refuse(uform_outcome_t *public_outcome, uform_status_t status, char const *entry,
                           char const *message) {
    failed(status, entry, message);
    if (!public_outcome) return status;
    outcome_t *outcome = outcome_of(public_outcome);
    if (!outcome_is_initialized(outcome)) return status;
    if (outcome_word_status(atomic_load(&outcome->word)) == UFORM_PENDING)
        return status; /* not ours to end */
    error_keep(&outcome->error, outcome->message, status, entry, message);
    outcome_drop_product(outcome);
    outcome_finalize(outcome, status, NULL);
    return status;
}

uform_status_t call_begin(call_t *call, uform_executor_t *executor, outcome_t *outcome, char const *entry) {
    if (!outcome_is_initialized(outcome))
        return failed(UFORM_INVALID_ARGUMENT, entry, "outcome was not initialized (uform_outcome_init)");
    if (outcome_word_status(atomic_load(&outcome->word)) == UFORM_PENDING)
        return failed(UFORM_INVALID_ARGUMENT, entry, "outcome is still pending with another call");
    if (!executor) {
        uform_status_t status =
            failed(UFORM_OUT_OF_MEMORY, entry, "cannot make the calling thread's executor");
        error_keep(&outcome->error, outcome->message, status, entry, uform_last_error().message);
        outcome_finalize(outcome, status, NULL);
        return status;
    }
    call_t *expected = NULL;
    if (!atomic_compare_exchange_strong_explicit(&executor->holder, &expected, call, memory_order_acquire,
                                                 memory_order_relaxed)) {
        uform_status_t status = failed(UFORM_CONTENDED, entry, "another call holds the executor");
        error_keep(&outcome->error, outcome->message, status, entry, uform_last_error().message);
        outcome->product = OUTCOME_PRODUCT_NONE;
        outcome_finalize(outcome, status, NULL);
        return status;
    }
    atomic_fetch_add_explicit(&executor->active, 1, memory_order_acq_rel);
    /* The spin a drain left ends with this call: afterwards idle threads poll spin_ns at most. */
    if (executor_spin_held(executor))
        atomic_store_explicit(&executor->spin_held, false, memory_order_relaxed);
    call->executor = executor;
    call->outcome = outcome;
    call->entry = entry;
    outcome->error = (uform_error_t){UFORM_OK, "", ""};
    outcome_drop_product(outcome);
    atomic_store_explicit(&outcome->word, UFORM_PENDING, memory_order_release);
    return UFORM_OK;
}

/* call_open on `state`, or on the executor's call storage (zeroed past its call_t) for NULL. */
static uform_status_t call_hold(uform_executor_t *executor, uform_arena_t *arena, uform_outcome_t *outcome,
                                uform_outcome_t *own, size_t state_size, call_t *state, char const *entry,
                                call_t **call) {
    executor = call_executor(executor);
    if (!executor)
        return call_refuse(outcome, UFORM_OUT_OF_MEMORY, entry, "cannot make the calling thread's executor");
    if (arena && arena_begin(arena) != UFORM_OK)
        return call_refuse(outcome, UFORM_CONTENDED, entry, "another call holds the arena");
    if (!outcome) uform_outcome_init(outcome = own);
    call_t *opened = state ? state : (call_t *)(void *)executor->call_storage;
    uform_status_t status = call_begin(opened, executor, outcome_of(outcome), entry);
    if (status != UFORM_OK) {
        if (arena) arena_end(arena);
        return status;
    }
    /* Held: the storage is this call's; call_begin filled its header. */
    if (!state) memset((char *)opened + sizeof *opened, 0, state_size - sizeof *opened);
    *call = opened;
    return UFORM_OK;
}

uform_status_t call_open(uform_executor_t *executor, uform_arena_t *arena, uform_outcome_t *outcome,
                         uform_outcome_t *own, size_t state_size, char const *entry, call_t **call) {
    return call_hold(executor, arena, outcome, own, state_size, NULL, entry, call);
}

call_plan_t call_plan(char const *entry, uform_executor_t *executor, uform_arena_t *arena,
                      uform_outcome_t *outcome, size_t state_size, void (*start)(call_t *call)) {
    return (call_plan_t){
        .entry = entry,
        .executor = executor,
        .arena = arena,
        .outcome = outcome,
        .state_size = state_size,
        .start = start,
    };
}

uform_status_t call_run(call_plan_t const *plan) {
    uform_outcome_t own;
    call_t *call = NULL;
    uform_status_t status = call_hold(plan->executor, plan->arena, plan->outcome, &own, plan->state_size,
                                      plan->state, plan->entry, &call);
    if (status != UFORM_OK) {
        free(plan->state);
        return status;
    }
    call->start = plan->start;
    if (plan->fill.fill) plan->fill.fill(call, plan->fill.request);
    call_submit(call);
    if (plan->outcome) return UFORM_OK;
    status = call_wait(outcome_of(&own));
    if (plan->keep.keep) plan->keep.keep(&own, plan->keep.product);
    return status;
}

static void call_start(loop_op_t *op) {
    call_t *call = container_of(op, call_t, op);
    call->start(call);
}

void call_submit(call_t *call) {
    uform_executor_t *executor = call->executor;
    call->op.callback = call_start;
    call->op.result = 0;
    if (executor->threaded) {
        loop_post(executor->loop, &call->op);
        return;
    }
    /* The calling thread is the loop thread: drive it until this call is final. The loop is made by
     * the first call, under the executor's hold, and kept for the next ones. The hold is released
     * only once loop_run has returned, so that nobody frees the loop under our feet. */
    outcome_t *outcome = call->outcome;
    int created = 0;
    if (!executor->loop) {
        loop_options_t options = {.backend = LOOP_BACKEND_AUTO, .single_issuer = false, .entries = 0};
        created = loop_create(&options, &executor->loop);
        if (created != 0) executor->loop = NULL;
    }
    if (executor->loop) {
        call->start(call);
        while (outcome_status(outcome) == UFORM_PENDING)
            loop_run(executor->loop, true, 0);
    } else {
        char const *message;
        uform_status_t const status = executor_loop_failure(created, &message);
        call_finish(call, status, message);
    }
    executor_unhold(executor);
    executor_settle(executor);
}

void call_finish(call_t *call, uform_status_t status, char const *message) {
    uform_executor_t *executor = call->executor;
    outcome_t *outcome = call->outcome;
    bool threaded = executor->threaded;
    loop_t *loop = executor->loop;
    if (status == UFORM_OK)
        outcome->error = (uform_error_t){UFORM_OK, "", ""};
    else
        error_keep(&outcome->error, outcome->message, status, call->entry, message);
    /* A threaded executor is released before the outcome turns final, so that a caller who saw it
     * final can submit the next call at once. The state in `call` is dead from here on; the loop
     * thread outlives this callback, as freeing the executor joins it. */
    if (threaded) executor_unhold(executor);
    outcome_finalize(outcome, status, threaded ? loop : NULL);
    if (threaded) executor_settle(executor);
}

uform_status_t call_wait(outcome_t *outcome) {
    return uform_outcome_wait((uform_outcome_t *)(void *)outcome);
}

bool progress_report(uform_progress_t const *progress, size_t *next_step, size_t completed, size_t total) {
    if (!progress || !progress->handler) return false;
    size_t steps = progress->steps ? progress->steps : 100;
    if (*next_step > steps) return false;
    /* Threshold of step k: the first `completed` at or beyond k/steps of the total. */
    __uint128_t threshold = (__uint128_t)total * *next_step / steps;
    if ((__uint128_t)completed < threshold) return false;
    while (*next_step <= steps && (__uint128_t)completed >= (__uint128_t)total * *next_step / steps)
        ++*next_step;
    return progress->handler(progress->state, completed, total) == UFORM_CANCEL;
}
