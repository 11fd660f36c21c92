/* The address-keyed wait table (futex.h): POSIX mutexes and condition variables only. */
#include <pthread.h>
#include <stddef.h>

#include "futex.h"

typedef struct futex_slot {
    pthread_mutex_t mutex;
    pthread_cond_t waiters;
} futex_slot_t;

/* 64 pairs: a few words sleep at once per executor, so collisions are rare and only cost a look. */
#define FUTEX_SLOT                                                                                           \
    { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER }
#define FUTEX_SLOTS_8                                                                                        \
    FUTEX_SLOT, FUTEX_SLOT, FUTEX_SLOT, FUTEX_SLOT, FUTEX_SLOT, FUTEX_SLOT, FUTEX_SLOT, FUTEX_SLOT
static futex_slot_t futex_slots[64] = {FUTEX_SLOTS_8, FUTEX_SLOTS_8, FUTEX_SLOTS_8, FUTEX_SLOTS_8,
                                       FUTEX_SLOTS_8, FUTEX_SLOTS_8, FUTEX_SLOTS_8, FUTEX_SLOTS_8};

static futex_slot_t *futex_slot_of(_Atomic uint32_t *word) {
    /* Fibonacci hashing of the word's index: neighbouring words land in different slots. */
    uint64_t index = (uint64_t)((uintptr_t)word / sizeof *word);
    return &futex_slots[(index * UINT64_C(0x9E3779B97F4A7C15)) >> 58];
}

void futex_table_wait(_Atomic uint32_t *word, uint32_t expected) {
    futex_slot_t *slot = futex_slot_of(word);
    /* Locking fails only on misuse; the wait then returns at once, which callers take as spurious. */
    if (pthread_mutex_lock(&slot->mutex) != 0) return;
    /* A failed wait is a spurious return as well. */
    if (atomic_load(word) == expected) (void)pthread_cond_wait(&slot->waiters, &slot->mutex);
    (void)pthread_mutex_unlock(&slot->mutex);
}

void futex_table_wake_all(_Atomic uint32_t *word) {
    futex_slot_t *slot = futex_slot_of(word);
    /* Taking the mutex orders the broadcast after any waiter that read the old word and has not yet
     * slept; a lock that failed (misuse) still broadcasts to those already asleep. */
    int locked = pthread_mutex_lock(&slot->mutex);
    (void)pthread_cond_broadcast(&slot->waiters);
    if (locked == 0) (void)pthread_mutex_unlock(&slot->mutex);
}
