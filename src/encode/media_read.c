/* The chunked run of an image, video or audio call, the files it reads and the decoding of its items
 * (media_read.h). */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "call.h"
#include "media_read.h"

void (*media_observer)(media_event_t event, size_t chunk);

/* Ends the call once no ring operation and no decoding ahead is in flight (a stopping call waits for
 * its reads and its lent worker). */
static void media_settle(media_run_t *run) {
    if (run->in_flight == 0 && !run->lent) run->end(run);
}

/* The turn of `next_chunk` has what it waits for: its decoding ahead landed, its chunk's files read,
 * and the next chunk's when that one will be decoded ahead. */
static bool media_ready(media_run_t *run) {
    size_t chunk = run->next_chunk;
    if (run->lent) return false;
    if (run->ready && !run->ready(run, chunk)) return false;
    if (!run->files) return true;
    if (run->ahead_chunk != chunk && run->pending[chunk % 2] != 0) return false;
    bool ahead = run->sets == 2 && !run->workers; /* the next chunk will be decoded ahead */
    return !ahead || chunk + 1 >= run->chunks || run->pending[(chunk + 1) % 2] == 0;
}

/* A waiting turn whose wait is over goes on. */
static void media_resume(media_run_t *run) {
    if (!run->waiting || !media_ready(run)) return;
    run->waiting = false;
    run->encode->stats.read_ns += loop_now_ns() - run->waiting_since_ns;
    media_turn(run);
}

void media_poke(media_run_t *run) {
    media_resume(run);
}

/* The executor whose threads decode. */
static uform_executor_t *media_workers(media_run_t const *run) {
    return run->workers ? run->workers : run->call->executor;
}

/* ---- Reading files through the ring ------------------------------------------------------------- */

static media_slot_t *media_slot(media_run_t const *run, size_t item) {
    size_t set = (item / run->chunk_items) % 2;
    return &run->slots[set * run->chunk_items + item % run->chunk_items];
}

/* A file is read, or failed: the turn waiting for it may go on. */
static void slot_done(media_slot_t *slot, uform_status_t status) {
    media_run_t *run = slot->run;
    encode_call_t *encode = run->encode;
    if (slot->fd >= 0) close(slot->fd);
    slot->fd = -1;
    if (status != UFORM_OK) encode->statuses[slot->item] = status;
    run->pending[(slot->item / run->chunk_items) % 2]--;
    if (encode->failure != UFORM_OK) {
        media_settle(run);
        return;
    }
    media_resume(run);
}

/* Every completion lands here first: one operation fewer in flight, and a stopping call goes no
 * further with this file. */
static bool slot_landed(media_slot_t *slot) {
    slot->run->in_flight--;
    if (slot->run->encode->failure == UFORM_OK) return true;
    slot_done(slot, UFORM_OK);
    return false;
}

static void slot_read(loop_op_t *op) {
    media_slot_t *slot = container_of(op, media_slot_t, op);
    if (!slot_landed(slot)) return;
    if (op->result < 0) {
        slot_done(slot, UFORM_IO);
        return;
    }
    slot->size = (size_t)op->result; /* short only when the file shrank: the decoder sees the rest */
    slot->run->encode->stats.bytes += slot->size;
    slot_done(slot, UFORM_OK);
}

static void slot_statted(loop_op_t *op) {
    media_slot_t *slot = container_of(op, media_slot_t, op);
    if (!slot_landed(slot)) return;
    /* Opened without blocking (a FIFO would wait for a writer); a regular file reads blocking. */
    if (op->result < 0 || !S_ISREG(slot->statx.stx_mode) || fcntl(slot->fd, F_SETFL, 0) != 0) {
        slot_done(slot, UFORM_IO);
        return;
    }
    uint64_t size = slot->statx.stx_size;
    if (size == 0 || size > slot->run->max_bytes) {
        slot_done(slot, UFORM_FORMAT);
        return;
    }
    if (size > slot->capacity) {
        uint8_t *grown = malloc((size_t)size);
        if (!grown) {
            slot_done(slot, UFORM_OUT_OF_MEMORY);
            return;
        }
        free(slot->buffer);
        slot->buffer = grown;
        slot->capacity = (size_t)size;
    }
    slot->op.callback = slot_read;
    slot->run->in_flight++;
    loop_read(slot->run->call->executor->loop, &slot->op, slot->fd, slot->buffer, (size_t)size, 0);
}

static void slot_opened(loop_op_t *op) {
    media_slot_t *slot = container_of(op, media_slot_t, op);
    if (op->result >= 0) slot->fd = (int)op->result;
    if (!slot_landed(slot)) return;
    if (op->result < 0) {
        slot_done(slot, UFORM_IO);
        return;
    }
    slot->op.callback = slot_statted;
    slot->run->in_flight++;
    loop_statx(slot->run->call->executor->loop, &slot->op, slot->fd, &slot->statx);
}

/* The items [*first, *last) of `chunk`. */
static void media_chunk(media_run_t const *run, size_t chunk, size_t *first, size_t *last) {
    *first = chunk * run->chunk_items;
    *last = *first + run->chunk_items;
    if (*last > run->encode->tape.count) *last = run->encode->tape.count;
}

/* Opens every file of `chunk`. A path that is empty or holds a NUL byte fails at once. */
static void media_read(media_run_t *run, size_t chunk) {
    uform_tape_t const *tape = &run->encode->tape;
    size_t first, last;
    media_chunk(run, chunk, &first, &last);
    for (size_t item = first; item < last; ++item) {
        media_slot_t *slot = media_slot(run, item);
        slot->run = run;
        slot->item = item;
        slot->fd = -1;
        slot->size = 0;
        size_t length = tape->offsets[item + 1] - tape->offsets[item];
        char const *path = length ? (char const *)tape->data + tape->offsets[item] : NULL;
        if (length == 0 || memchr(path, 0, length)) {
            run->encode->statuses[item] = UFORM_INVALID_ARGUMENT;
            continue;
        }
        if (length >= MEDIA_PATH_MAX) { /* the kernel would answer ENAMETOOLONG */
            run->encode->statuses[item] = UFORM_IO;
            continue;
        }
        memcpy(slot->path, path, length);
        slot->path[length] = '\0';
        slot->op.callback = slot_opened;
        run->pending[chunk % 2]++;
        run->in_flight++;
        loop_open(run->call->executor->loop, &slot->op, slot->path, O_RDONLY | O_NONBLOCK);
    }
}

uint8_t const *media_file(media_run_t const *run, size_t item, size_t *size) {
    media_slot_t const *slot = media_slot(run, item);
    *size = slot->size;
    return slot->buffer;
}

/* ---- Decoding ----------------------------------------------------------------------------------- */

static float *media_rows(media_run_t const *run, size_t chunk) {
    return run->rows + (chunk % run->sets) * run->chunk_items * run->item_floats;
}

typedef struct media_decode_job {
    media_run_t *run;
    size_t first, count;
    float *rows;
    _Atomic size_t next;
} media_decode_job_t;

/* A chunk decoded on its turn: each thread takes the next item from a shared counter, so that one
 * large item does not hold the others back. */
static void media_decode_work(void *context, size_t thread) {
    media_decode_job_t *job = context;
    media_run_t *run = job->run;
    if (thread >= run->threads) return; /* a pool grown since the call began: the others cover it */
    for (;;) {
        size_t index = atomic_fetch_add_explicit(&job->next, 1, memory_order_relaxed);
        if (index >= job->count) return;
        run->decode(run, job->first + index, job->rows + index * run->item_floats, thread);
    }
}

/* The lent worker's work: chunk `ahead_chunk`, item by item, each posted to the loop once decoded.
 * After its last post the loop may reclaim the worker and reuse everything: it touches nothing more. */
static void media_decode_ahead(void *context) {
    media_run_t *run = context;
    uint64_t started = loop_now_ns();
    size_t chunk = run->ahead_chunk, thread = run->decoder_thread, floats = run->item_floats;
    size_t first, last;
    media_chunk(run, chunk, &first, &last);
    float *rows = media_rows(run, chunk);
    loop_t *loop = run->call->executor->loop;
    media_decoded_t *decoded = run->decoded;
    for (size_t item = first; item < last; ++item) {
        run->decode(run, item, rows + (item - first) * floats, thread);
        if (media_observer) media_observer(MEDIA_EVENT_DECODED, chunk);
        if (item + 1 == last) run->ahead_ns = loop_now_ns() - started;
        loop_post(loop, &decoded[item - first].op);
    }
}

/* An item decoded ahead landed; after the chunk's last, the worker goes back to the executor. */
static void media_decoded(loop_op_t *op) {
    media_run_t *run = container_of(op, media_decoded_t, op)->run;
    if (--run->undecoded != 0) return;
    executor_reclaim(media_workers(run));
    run->lent = false;
    run->encode->stats.decode_ns += run->ahead_ns;
    /* A turn's wait for its chunk is in decode_ns already (the worker's time): from here on, only the
     * wait for files counts in read_ns. */
    if (run->waiting) run->waiting_since_ns = loop_now_ns();
    if (run->encode->failure != UFORM_OK) {
        media_settle(run);
        return;
    }
    media_resume(run);
}

/* Hands `chunk` (its files read) to the executor's last worker; on an executor that cannot lend one,
 * the chunk is decoded on its turn. */
static void media_ahead(media_run_t *run, size_t chunk) {
    size_t first, last;
    media_chunk(run, chunk, &first, &last);
    for (size_t index = 0; index < last - first; ++index)
        run->decoded[index] = (media_decoded_t){.op = {.callback = media_decoded}, .run = run};
    run->ahead_chunk = chunk;
    run->undecoded = last - first;
    run->decoder_thread = media_workers(run)->threads - 1;
    run->lent = executor_lend(media_workers(run), media_decode_ahead, run);
    if (!run->lent) {
        run->ahead_chunk = SIZE_MAX;
        return;
    }
    if (media_observer) media_observer(MEDIA_EVENT_AHEAD, chunk);
}

/* ---- The run ------------------------------------------------------------------------------------ */

bool media_open(media_run_t *run) {
    size_t items = run->encode->tape.count;
    uform_executor_t *executor = run->call->executor;
    if (run->chunk_items > items) run->chunk_items = items;
    if (run->chunk_items == 0) run->chunk_items = 1;
    run->chunks = (items + run->chunk_items - 1) / run->chunk_items;
    run->ahead_chunk = SIZE_MAX;
    run->threads = media_workers(run)->threads;
    /* Only a RAM executor lends a worker (executor_lend), and only a second chunk can use it; another
     * executor's workers decode every chunk on its turn, beside the devices. */
    bool ahead = !run->workers && executor_lends(executor) && run->chunks >= 2;
    run->sets = ahead || (run->workers && run->chunks >= 2) ? 2 : 1;
    size_t floats = 0, bytes = 0;
    if (__builtin_mul_overflow(run->sets * run->chunk_items, run->item_floats, &floats) ||
        __builtin_mul_overflow(floats, sizeof(float), &bytes))
        return false;
    run->rows = executor_allocate(executor, bytes);
    if (!run->rows) return false;
    if (ahead) {
        run->decoded = calloc(run->chunk_items, sizeof *run->decoded);
        if (!run->decoded) return false;
    }
    run->slots_count = run->files ? 2 * run->chunk_items : 0;
    if (run->slots_count == 0) return true;
    run->slots = calloc(run->slots_count, sizeof *run->slots);
    return run->slots != NULL;
}

void media_close(media_run_t *run) {
    for (size_t i = 0; run->slots && i < run->slots_count; ++i)
        free(run->slots[i].buffer);
    free(run->slots);
    run->slots = NULL;
    free(run->decoded);
    run->decoded = NULL;
    if (run->rows)
        executor_deallocate(run->call->executor, run->rows,
                            run->sets * run->chunk_items * run->item_floats * sizeof(float));
    run->rows = NULL;
}

void media_turn(media_run_t *run) {
    encode_call_t *encode = run->encode;
    size_t chunk = run->next_chunk, items = run->encode->tape.count;
    if (!media_ready(run)) {
        run->waiting = true;
        run->waiting_since_ns = loop_now_ns();
        return;
    }
    size_t first, last;
    media_chunk(run, chunk, &first, &last);
    float *rows = media_rows(run, chunk);
    if (run->ahead_chunk != chunk) {
        uint64_t decoding = loop_now_ns();
        media_decode_job_t job = {.run = run, .first = first, .count = last - first, .rows = rows};
        atomic_init(&job.next, 0);
        executor_for_threads(media_workers(run), media_decode_work, &job);
        encode->stats.decode_ns += loop_now_ns() - decoding;
    }
    run->ahead_chunk = SIZE_MAX;
    /* This chunk's file buffers are free now: the chunk after next is read into them. */
    if (run->files && chunk + 2 < run->chunks) media_read(run, chunk + 2);
    if (run->sets == 2 && !run->workers && chunk + 1 < run->chunks) media_ahead(run, chunk + 1);
    if (media_observer) media_observer(MEDIA_EVENT_COMPUTE, chunk);
    run->chunk(run, first, last, rows);
    run->next_chunk = ++chunk;
    if (encode->failure == UFORM_OK && progress_report(&encode->progress, &encode->next_step, last, items))
        encode_stop(encode, UFORM_CANCELLED, "cancelled by the progress handler");
    if (encode->failure != UFORM_OK || chunk == run->chunks) {
        media_settle(run);
        return;
    }
    loop_post(run->call->executor->loop, &run->call->op);
}

void media_start(media_run_t *run) {
    if (run->encode->failure != UFORM_OK) { /* the call failed before its run could start */
        run->end(run);
        return;
    }
    if (run->files) {
        media_read(run, 0);
        if (run->chunks > 1) media_read(run, 1);
    }
    media_turn(run);
}
