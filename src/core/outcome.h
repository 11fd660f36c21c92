/* Outcomes: the status word a deferred call ends on, who to tell when it does, and what it produced.
 * A leaf of the core: an outcome knows no executor, call or model. A product that must be released when
 * nobody takes it (a loaded model) carries its own release function. */
#pragma once

#include "common.h"
#include "loop.h"

#define OUTCOME_MAGIC       0x75666f72u /* "ufor": set by uform_outcome_init */
#define OUTCOME_WAITERS     (1u << 31)  /* a thread sleeps on the word: the finisher must wake it */
#define OUTCOME_STATUS_MASK 0xffffu

typedef enum outcome_product {
    OUTCOME_PRODUCT_NONE = 0,
    OUTCOME_PRODUCT_OBJECT,        /* `object`, released by `release` unless the caller takes it */
    OUTCOME_PRODUCT_ENCODED,       /* views into the caller's arena: nothing to release */
    OUTCOME_PRODUCT_PROBABILITIES, /* likewise */
    OUTCOME_PRODUCT_TOKENIZED,     /* likewise */
} outcome_product_t;

typedef struct outcome {
    _Atomic uint32_t word; /* uform_status_t | OUTCOME_WAITERS */
    uint32_t magic;
    int notify_eventfd; /* -1: none */
    int notify_ring_fd; /* -1: none */
    uint64_t notify_user_data;
    uform_error_t error; /* its message points into `message` (error_keep) or at static text */
    char message[UFORM_ERROR_MESSAGE_SIZE];
    outcome_product_t product;
    union {
        struct {
            void *object;
            void (*release)(void *object); /* also tells one kind of object from another */
        };
        uform_encoded_t encoded;
        uform_view_t probabilities;
        uform_tokenized_t tokenized;
    };
} outcome_t;

_Static_assert(sizeof(outcome_t) <= UFORM_OUTCOME_SIZE, "outcome_t outgrew UFORM_OUTCOME_SIZE");
_Static_assert(alignof(outcome_t) <= UFORM_OUTCOME_ALIGNMENT, "outcome_t alignment");

static inline outcome_t *outcome_of(uform_outcome_t *outcome) {
    return (outcome_t *)(void *)outcome->opaque;
}

static inline bool outcome_is_initialized(outcome_t const *outcome) {
    return outcome && outcome->magic == OUTCOME_MAGIC;
}

static inline uform_status_t outcome_word_status(uint32_t word) {
    return (uform_status_t)(word & OUTCOME_STATUS_MASK);
}

static inline uform_status_t outcome_status(outcome_t *outcome) {
    return outcome_word_status(atomic_load_explicit(&outcome->word, memory_order_acquire));
}

/* Blocks until the outcome is final (polling briefly, then on the futex) and answers its status. */
uform_status_t outcome_await(outcome_t *outcome);

/* Makes the outcome final with `status`, wakes its waiters and notifies its eventfd and ring. `loop`: the
 * loop thread's own loop when called from it (its ring sends the message), else NULL. After the store
 * the outcome may be freed by its owner: nothing of it is read afterwards. */
void outcome_finalize(outcome_t *outcome, uform_status_t status, loop_t *loop);

/* Releases an object nobody took and forgets the product. */
void outcome_drop_product(outcome_t *outcome);

/* Stores an object product; `release` frees it if the caller never takes it. */
void outcome_set_object(outcome_t *outcome, void *object, void (*release)(void *object));

/* The object of a final, successful outcome whose product was stored with `release`, handed over
 * (the outcome forgets it); NULL otherwise. */
void *outcome_take_object(uform_outcome_t *public_outcome, void (*release)(void *object));
