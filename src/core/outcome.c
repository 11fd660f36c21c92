/* Outcomes (outcome.h): initialization, waiting, notification targets, products, and the public
 * functions that read them. */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "futex.h"
#include "outcome.h"

/* How long `wait` polls the word before sleeping: long enough to catch a call on spinning workers
 * (a few microseconds), short enough not to burn a core when the call is long. */
#define WAIT_SPIN_NS 20000u

/* An object the last call produced and nobody took is released, not leaked. */
void outcome_drop_product(outcome_t *outcome) {
    if (outcome->product == OUTCOME_PRODUCT_OBJECT && outcome->object && outcome->release)
        outcome->release(outcome->object);
    outcome->product = OUTCOME_PRODUCT_NONE;
}

void outcome_set_object(outcome_t *outcome, void *object, void (*release)(void *object)) {
    outcome->product = OUTCOME_PRODUCT_OBJECT;
    outcome->object = object;
    outcome->release = release;
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

uform_status_t outcome_await(outcome_t *outcome) {
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

void *outcome_take_object(uform_outcome_t *public_outcome, void (*release)(void *object)) {
    if (!public_outcome) return NULL;
    outcome_t *outcome = outcome_of(public_outcome);
    if (!outcome_is_initialized(outcome) || outcome_status(outcome) != UFORM_OK) return NULL;
    if (outcome->product != OUTCOME_PRODUCT_OBJECT || outcome->release != release) return NULL;
    void *object = outcome->object;
    outcome->object = NULL;
    outcome->product = OUTCOME_PRODUCT_NONE;
    return object;
}

/* Copies the product of a final, successful outcome holding a `product` (its `size` bytes) into `out`;
 * answers INVALID_ARGUMENT, or the call's failure, without copying otherwise. */
static uform_status_t outcome_read(uform_outcome_t const *public_outcome, outcome_product_t product,
                                   void *out, size_t size) {
    if (!public_outcome || !out) return UFORM_INVALID_ARGUMENT;
    outcome_t const *outcome = (outcome_t const *)(void const *)public_outcome->opaque;
    if (!outcome_is_initialized(outcome)) return UFORM_INVALID_ARGUMENT;
    uform_status_t status =
        outcome_word_status(atomic_load_explicit(&((outcome_t *)outcome)->word, memory_order_acquire));
    if (status != UFORM_OK) return status;
    if (outcome->product != product) return UFORM_INVALID_ARGUMENT;
    void const *held = product == OUTCOME_PRODUCT_ENCODED         ? (void const *)&outcome->encoded
                       : product == OUTCOME_PRODUCT_PROBABILITIES ? (void const *)&outcome->probabilities
                                                                  : (void const *)&outcome->tokenized;
    memcpy(out, held, size);
    return UFORM_OK;
}

UFORM_EXPORT uform_status_t uform_outcome_encoded(uform_outcome_t const *public_outcome,
                                                  uform_encoded_t *encoded) {
    return outcome_read(public_outcome, OUTCOME_PRODUCT_ENCODED, encoded, sizeof *encoded);
}

UFORM_EXPORT uform_status_t uform_outcome_probabilities(uform_outcome_t const *public_outcome,
                                                        uform_view_t *view) {
    return outcome_read(public_outcome, OUTCOME_PRODUCT_PROBABILITIES, view, sizeof *view);
}

UFORM_EXPORT uform_status_t uform_outcome_tokenized(uform_outcome_t const *public_outcome,
                                                    uform_tokenized_t *tokenized) {
    return outcome_read(public_outcome, OUTCOME_PRODUCT_TOKENIZED, tokenized, sizeof *tokenized);
}

/* The word is stored before any notification, so a notified loop reads the final status at once; after
 * the store the outcome may be freed by its owner, so the notification targets are copied first and only
 * the futex address is used after. */
void outcome_finalize(outcome_t *outcome, uform_status_t status, loop_t *loop) {
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
    if (ring_fd >= 0) loop_msg_ring(loop, ring_fd, (int32_t)status, user_data);
}
