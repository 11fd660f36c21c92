/* Outcomes and the life of a call: begin on the calling thread, run on the loop, finish once. */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"

/* How long `wait` polls the word before sleeping: long enough to catch a call on spinning workers
 * (a few microseconds), short enough not to burn a core when the call is long. */
#define WAIT_SPIN_NS 20000u

void futex_wait(_Atomic uint32_t *word, uint32_t expected) {
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

void futex_wake_all(_Atomic uint32_t *word) {
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

void futex_wake_one(_Atomic uint32_t *word) {
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

static bool outcome_is_initialized(outcome_t const *outcome) {
    return outcome && outcome->magic == OUTCOME_MAGIC;
}

/* A model the last call produced and nobody took is released, not leaked. */
static void outcome_drop_product(outcome_t *outcome) {
    if (outcome->product == OUTCOME_PRODUCT_MODEL && outcome->model) uform_model_free(outcome->model);
    outcome->product = OUTCOME_PRODUCT_NONE;
}

static uform_status_t outcome_word_status(uint32_t word) {
    return (uform_status_t)(word & OUTCOME_STATUS_MASK);
}

/* ---- Public outcome functions ------------------------------------------------------------------- */

UFORM_EXPORT void uform_outcome_init(uform_outcome_t *public_outcome) {
    if (!public_outcome) return;
    outcome_t *outcome = outcome_of(public_outcome);
    memset(outcome, 0, sizeof *outcome);
    atomic_init(&outcome->word, UFORM_OK);
    outcome->magic = OUTCOME_MAGIC;
    outcome->notify_eventfd = -1;
    outcome->notify_ring_fd = -1;
    outcome->error = (uform_error_t){UFORM_OK, "", ""};
}

UFORM_EXPORT uform_status_t uform_outcome_status(uform_outcome_t const *public_outcome) {
    if (!public_outcome) return UFORM_INVALID_ARGUMENT;
    outcome_t const *outcome = (outcome_t const *)(void const *)public_outcome->opaque;
    if (!outcome_is_initialized(outcome)) return UFORM_INVALID_ARGUMENT;
    return outcome_word_status(atomic_load_explicit(&((outcome_t *)outcome)->word, memory_order_acquire));
}

static uform_status_t outcome_await(outcome_t *outcome) {
    uint32_t word = atomic_load_explicit(&outcome->word, memory_order_acquire);
    if (outcome_word_status(word) != UFORM_PENDING) return outcome_word_status(word);

    /* Poll first: with spinning workers the call is over in a few microseconds. */
    uint64_t deadline = loop_now_ns() + WAIT_SPIN_NS;
    for (unsigned spins = 1;; ++spins) {
        cpu_relax();
        word = atomic_load_explicit(&outcome->word, memory_order_acquire);
        if (outcome_word_status(word) != UFORM_PENDING) return outcome_word_status(word);
        if ((spins & 63) == 0 && loop_now_ns() > deadline) break;
    }
    /* Then sleep, announcing ourselves so that the finisher knows to wake us. */
    for (;;) {
        if (outcome_word_status(word) != UFORM_PENDING) return outcome_word_status(word);
        if (!(word & OUTCOME_WAITERS)) {
            uint32_t flagged = word | OUTCOME_WAITERS;
            if (!atomic_compare_exchange_weak_explicit(&outcome->word, &word, flagged, memory_order_acq_rel,
                                                       memory_order_acquire))
                continue;
            word = flagged;
        }
        futex_wait(&outcome->word, word);
        word = atomic_load_explicit(&outcome->word, memory_order_acquire);
    }
}

UFORM_EXPORT uform_status_t uform_outcome_wait(uform_outcome_t *public_outcome) {
    static char const entry[] = "uform_outcome_wait";
    if (!public_outcome) return failed(UFORM_INVALID_ARGUMENT, entry, "outcome is NULL");
    outcome_t *outcome = outcome_of(public_outcome);
    if (!outcome_is_initialized(outcome))
        return failed(UFORM_INVALID_ARGUMENT, entry, "outcome was not initialized");
    uform_status_t status = outcome_await(outcome);
    /* The thread that sees a failure can say what it was, as after a blocking call. */
    if (status != UFORM_OK) failed(status, outcome->error.entry, outcome->error.message);
    return status;
}

UFORM_EXPORT uform_error_t uform_outcome_error(uform_outcome_t const *public_outcome) {
    static char const empty[] = "";
    if (!public_outcome)
        return (uform_error_t){UFORM_INVALID_ARGUMENT, "uform_outcome_error", "outcome is NULL"};
    outcome_t const *outcome = (outcome_t const *)(void const *)public_outcome->opaque;
    if (!outcome_is_initialized(outcome))
        return (uform_error_t){UFORM_INVALID_ARGUMENT, "uform_outcome_error", "outcome was not initialized"};
    uform_status_t status =
        outcome_word_status(atomic_load_explicit(&((outcome_t *)outcome)->word, memory_order_acquire));
    if (status == UFORM_PENDING) return (uform_error_t){UFORM_PENDING, empty, empty};
    return outcome->error;
}

UFORM_EXPORT void uform_outcome_destroy(uform_outcome_t *public_outcome) {
    if (!public_outcome) return;
    outcome_t *outcome = outcome_of(public_outcome);
    if (!outcome_is_initialized(outcome)) return;
    outcome_await(outcome);
    outcome_drop_product(outcome);
    outcome->magic = 0;
}

/* The outcome behind `public_outcome` when its notification targets may change (initialized, not
 * pending); NULL after recording why not. */
static outcome_t *outcome_settable(uform_outcome_t *public_outcome, char const *entry) {
    if (!public_outcome) return failed(UFORM_INVALID_ARGUMENT, entry, "outcome is NULL"), NULL;
    outcome_t *outcome = outcome_of(public_outcome);
    if (!outcome_is_initialized(outcome))
        return failed(UFORM_INVALID_ARGUMENT, entry, "outcome was not initialized"), NULL;
    if (outcome_word_status(atomic_load(&outcome->word)) == UFORM_PENDING)
        return failed(UFORM_INVALID_ARGUMENT, entry, "outcome is pending"), NULL;
    return outcome;
}

UFORM_EXPORT uform_status_t uform_outcome_notify_eventfd(uform_outcome_t *public_outcome, int eventfd) {
    outcome_t *outcome = outcome_settable(public_outcome, "uform_outcome_notify_eventfd");
    if (!outcome) return UFORM_INVALID_ARGUMENT;
    outcome->notify_eventfd = eventfd < 0 ? -1 : eventfd;
    return UFORM_OK;
}

UFORM_EXPORT uform_status_t uform_outcome_notify_ring(uform_outcome_t *public_outcome, int ring_fd,
                                                      uint64_t user_data) {
    static char const entry[] = "uform_outcome_notify_ring";
    outcome_t *outcome = outcome_settable(public_outcome, entry);
    if (!outcome) return UFORM_INVALID_ARGUMENT;
    if (ring_fd >= 0 && !loop_uring_available())
        return failed(UFORM_UNSUPPORTED, entry, "io_uring is not available in this process");
    outcome->notify_ring_fd = ring_fd < 0 ? -1 : ring_fd;
    outcome->notify_user_data = user_data;
    return UFORM_OK;
}

UFORM_EXPORT uform_model_t *uform_outcome_model(uform_outcome_t *public_outcome) {
    if (!public_outcome) return NULL;
    outcome_t *outcome = outcome_of(public_outcome);
    if (!outcome_is_initialized(outcome)) return NULL;
    if (outcome_word_status(atomic_load_explicit(&outcome->word, memory_order_acquire)) != UFORM_OK)
        return NULL;
    if (outcome->product != OUTCOME_PRODUCT_MODEL) return NULL;
    uform_model_t *model = outcome->model;
    outcome->model = NULL;
    outcome->product = OUTCOME_PRODUCT_NONE;
    return model;
}

static uform_status_t outcome_product_status(outcome_t const *outcome, outcome_product_t product) {
    if (!outcome_is_initialized(outcome)) return UFORM_INVALID_ARGUMENT;
    uform_status_t status =
        outcome_word_status(atomic_load_explicit(&((outcome_t *)outcome)->word, memory_order_acquire));
    if (status != UFORM_OK) return status;
    return outcome->product == product ? UFORM_OK : UFORM_INVALID_ARGUMENT;
}

UFORM_EXPORT uform_status_t uform_outcome_encoded(uform_outcome_t const *public_outcome,
                                                  uform_encoded_t *encoded) {
    if (!public_outcome || !encoded) return UFORM_INVALID_ARGUMENT;
    outcome_t const *outcome = (outcome_t const *)(void const *)public_outcome->opaque;
    uform_status_t status = outcome_product_status(outcome, OUTCOME_PRODUCT_ENCODED);
    if (status == UFORM_OK) *encoded = outcome->encoded;
    return status;
}

UFORM_EXPORT uform_status_t uform_outcome_probabilities(uform_outcome_t const *public_outcome,
                                                        uform_view_t *view) {
    if (!public_outcome || !view) return UFORM_INVALID_ARGUMENT;
    outcome_t const *outcome = (outcome_t const *)(void const *)public_outcome->opaque;
    uform_status_t status = outcome_product_status(outcome, OUTCOME_PRODUCT_PROBABILITIES);
    if (status == UFORM_OK) *view = outcome->probabilities;
    return status;
}

/* ---- Calls -------------------------------------------------------------------------------------- */

/* Makes the outcome final and tells everyone who asked. The word is stored before any notification,
 * so a notified loop reads the final status at once; after the store the outcome may be freed by its
 * owner, so the notification targets are copied first and only the futex address is used after. */
static void outcome_finalize(outcome_t *outcome, uform_status_t status, bool from_loop_thread, loop_t *loop) {
    int eventfd = outcome->notify_eventfd;
    int ring_fd = outcome->notify_ring_fd;
    uint64_t user_data = outcome->notify_user_data;
    uint32_t previous = atomic_exchange_explicit(&outcome->word, (uint32_t)status, memory_order_acq_rel);
    if (previous & OUTCOME_WAITERS) futex_wake_all(&outcome->word);
    if (eventfd >= 0) {
        uint64_t one = 1;
        ssize_t written;
        do
            written = write(eventfd, &one, sizeof one);
        while (written < 0 && errno == EINTR);
    }
    if (ring_fd >= 0) loop_msg_ring(from_loop_thread ? loop : NULL, ring_fd, (int32_t)status, user_data);
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
    outcome_finalize(outcome, status, false, NULL);
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
        outcome_finalize(outcome, status, false, NULL);
        return status;
    }
    call_t *expected = NULL;
    if (!atomic_compare_exchange_strong_explicit(&executor->holder, &expected, call, memory_order_acquire,
                                                 memory_order_relaxed)) {
        uform_status_t status = failed(UFORM_CONTENDED, entry, "another call holds the executor");
        error_keep(&outcome->error, outcome->message, status, entry, uform_last_error().message);
        outcome->product = OUTCOME_PRODUCT_NONE;
        outcome_finalize(outcome, status, false, NULL);
        return status;
    }
    atomic_fetch_add_explicit(&executor->active, 1, memory_order_acq_rel);
    call->executor = executor;
    call->outcome = outcome;
    call->entry = entry;
    outcome->error = (uform_error_t){UFORM_OK, "", ""};
    outcome_drop_product(outcome);
    atomic_store_explicit(&outcome->word, UFORM_PENDING, memory_order_release);
    return UFORM_OK;
}

uform_status_t call_open(uform_executor_t *executor, uform_arena_t *arena, uform_outcome_t *outcome,
                         uform_outcome_t *own, size_t state_size, char const *entry, call_t **call) {
    executor = call_executor(executor);
    if (!executor)
        return call_refuse(outcome, UFORM_OUT_OF_MEMORY, entry, "cannot make the calling thread's executor");
    if (arena && arena_begin(arena) != UFORM_OK)
        return call_refuse(outcome, UFORM_CONTENDED, entry, "another call holds the arena");
    if (!outcome) uform_outcome_init(outcome = own);
    call_t *opened = (call_t *)(void *)executor->call_storage;
    uform_status_t status = call_begin(opened, executor, outcome_of(outcome), entry);
    if (status != UFORM_OK) {
        if (arena) arena_end(arena);
        return status;
    }
    /* Held: the storage is this call's; call_begin filled its header. */
    memset((char *)opened + sizeof *opened, 0, state_size - sizeof *opened);
    *call = opened;
    return UFORM_OK;
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
    if (!executor->loop) {
        loop_options_t options = {.backend = LOOP_BACKEND_AUTO, .single_issuer = false, .entries = 0};
        if (loop_create(&options, &executor->loop) != 0) executor->loop = NULL;
    }
    if (executor->loop) {
        call->start(call);
        while (outcome_word_status(atomic_load_explicit(&outcome->word, memory_order_acquire)) ==
               UFORM_PENDING)
            loop_run(executor->loop, true, 0);
    } else {
        call_finish(call, UFORM_IO, "cannot create the executor's event loop");
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
    outcome_finalize(outcome, status, threaded, loop);
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
