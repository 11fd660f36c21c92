/* The check that decoding overlaps compute, shared by the image, video and audio suites. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <unistd.h>

#include <cmocka.h>

#include "media_overlap.h"
#include "media_read.h"

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
            usleep(1000);
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

void assert_decoded_ahead(batch_encode_t encode, batch_t const *batch) {
    for (size_t threads = 1; threads <= 3; ++threads)
        check_decoded_ahead(encode, batch, threads);
    assert_same_on_every_receiver(encode, batch, NULL);
}
