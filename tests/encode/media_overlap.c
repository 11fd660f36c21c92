/* The check that decoding overlaps compute, shared by the image, video and audio suites. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "executor.h"
#include "media_overlap.h"
#include "media_read.h"

/* Sleeps about `microseconds` (nanosleep: POSIX 2008 has no usleep). */
static void overlap_sleep_us(long microseconds) {
    struct timespec pause = {microseconds / 1000000, (microseconds % 1000000) * 1000};
    nanosleep(&pause, NULL);
}

/* What the run's test hook saw (media_read.h): which chunks were handed to the lent worker, how many
 * of their items it decoded, and how many computes found the next chunk's decoding under way. */
#define OVERLAP_CHUNKS 64
static _Atomic size_t overlap_decoded[OVERLAP_CHUNKS];
static bool overlap_handed[OVERLAP_CHUNKS];
static size_t overlap_ahead, overlap_computed, overlap_seen;

/* On the loop thread, as chunk k's compute begins: when chunk k + 1 was handed ahead, waits (10 s at
 * most) for the lent worker to decode one of its items. Were decoding not overlapped with compute, no
 * item of chunk k + 1 could be decoded before chunk k is computed, and the wait would run out. */
static void overlap_observe(media_event_t event, size_t chunk) {
    if (chunk >= OVERLAP_CHUNKS) return;
    if (event == MEDIA_EVENT_DECODED) {
        atomic_fetch_add(&overlap_decoded[chunk], 1);
    } else if (event == MEDIA_EVENT_AHEAD) {
        overlap_handed[chunk] = true;
        overlap_ahead++;
    } else {
        overlap_computed++;
        if (chunk + 1 >= OVERLAP_CHUNKS || !overlap_handed[chunk + 1]) return;
        for (int waited = 0; waited < 10000 && atomic_load(&overlap_decoded[chunk + 1]) == 0; ++waited)
            overlap_sleep_us(1000);
        overlap_seen += atomic_load(&overlap_decoded[chunk + 1]) != 0;
    }
}

void check_decoded_ahead(batch_encode_t encode, batch_t const *batch, size_t threads) {
    for (size_t chunk = 0; chunk < OVERLAP_CHUNKS; ++chunk) {
        atomic_store(&overlap_decoded[chunk], 0);
        overlap_handed[chunk] = false;
    }
    overlap_ahead = overlap_computed = overlap_seen = 0;
    uform_executor_t *executor = ram_executor(threads, true);
    uform_arena_t *arena = NULL;
    assert_int_equal(uform_arena_create(executor, &arena), UFORM_OK);
    uform_encoded_t encoded;
    media_observer = overlap_observe;
    assert_int_equal(encode(batch, executor, UFORM_OUTPUT_EMBEDDINGS, arena, NULL, NULL, &encoded), UFORM_OK);
    media_observer = NULL;
    for (size_t item = 0; item < batch->count; ++item)
        assert_int_equal(encoded.statuses[item], UFORM_OK);
    assert_true(overlap_computed >= 3);
    assert_int_equal(overlap_ahead, threads >= 2 ? overlap_computed - 1 : 0);
    assert_int_equal(overlap_seen, overlap_ahead);
    uform_arena_free(arena);
    uform_executor_free(executor);
}

/* The lent worker's work: holds until released, then says it has returned. */
static _Atomic bool lent_release, lent_returned;
static void lent_hold(void *context) {
    (void)context;
    while (!atomic_load(&lent_release))
        overlap_sleep_us(100);
    atomic_store(&lent_returned, true);
}

static void count_thread(void *context, size_t thread) {
    atomic_fetch_or((_Atomic unsigned *)context, 1u << thread);
}

/* A lent worker is out of every split while its work runs, and in the first one after it returns: work
 * split by executor_fork_threads counts it at once, not at the fork after (a tower pass that began while
 * a worker decoded ahead would otherwise keep its norms and attention on one thread of two). */
static void check_lent_worker_rejoins(void) {
    uform_executor_t *executor = ram_executor(2, true);
    atomic_store(&lent_release, false);
    atomic_store(&lent_returned, false);
    assert_int_equal(executor_fork_threads(executor), 2);
    assert_true(executor_lend(executor, lent_hold, NULL));
    assert_int_equal(executor_fork_threads(executor), 1);
    _Atomic unsigned ran = 0;
    executor_for_threads(executor, count_thread, &ran);
    assert_int_equal(atomic_load(&ran), 1u);
    atomic_store(&lent_release, true);
    for (int waited = 0; waited < 10000 && !atomic_load(&lent_returned); ++waited)
        overlap_sleep_us(1000);
    size_t threads = 1;
    for (int waited = 0; waited < 10000 && (threads = executor_fork_threads(executor)) != 2; ++waited)
        overlap_sleep_us(1000); /* `returned` is set just before the worker says so */
    assert_int_equal(threads, 2);
    atomic_store(&ran, 0);
    executor_for_threads(executor, count_thread, &ran);
    assert_int_equal(atomic_load(&ran), 3u);
    executor_reclaim(executor);
    uform_executor_free(executor);
}

void assert_decoded_ahead(batch_encode_t encode, batch_t const *batch) {
    check_lent_worker_rejoins();
    for (size_t threads = 1; threads <= 3; ++threads)
        check_decoded_ahead(encode, batch, threads);
    assert_same_on_every_receiver(encode, batch, NULL);
}
