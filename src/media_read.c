/* The chunked run of an image, video or audio call, and the files it reads (media_read.h). */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "media_read.h"

/* Ends the call once no ring operation is in flight (a stopping call waits for its reads). */
static void media_settle(media_run_t *run) {
    if (run->in_flight == 0) run->end(run);
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
    if (run->waiting && run->pending[run->next_chunk % 2] == 0) {
        run->waiting = false;
        encode->stats.read_ns += loop_now_ns() - run->waiting_since_ns;
        media_turn(run);
    }
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
    loop_read(slot->run->executor->loop, &slot->op, slot->fd, slot->buffer, (size_t)size, 0);
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
    loop_statx(slot->run->executor->loop, &slot->op, slot->fd, &slot->statx);
}

/* The items [*first, *last) of `chunk`. */
static void media_chunk(media_run_t const *run, size_t chunk, size_t *first, size_t *last) {
    *first = chunk * run->chunk_items;
    *last = *first + run->chunk_items;
    if (*last > run->tape->count) *last = run->tape->count;
}

/* Opens every file of `chunk`. A path that is empty or holds a NUL byte fails at once. */
static void media_read(media_run_t *run, size_t chunk) {
    uform_tape_t const *tape = run->tape;
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
        loop_open(run->executor->loop, &slot->op, slot->path, O_RDONLY | O_NONBLOCK);
    }
}

uint8_t const *media_file(media_run_t const *run, size_t item, size_t *size) {
    media_slot_t const *slot = media_slot(run, item);
    *size = slot->size;
    return slot->buffer;
}

/* ---- The run ------------------------------------------------------------------------------------ */

bool media_open(media_run_t *run) {
    size_t items = run->tape->count;
    if (run->chunk_items > items) run->chunk_items = items;
    if (run->chunk_items == 0) run->chunk_items = 1;
    run->chunks = (items + run->chunk_items - 1) / run->chunk_items;
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
}

void media_turn(media_run_t *run) {
    encode_call_t *encode = run->encode;
    size_t chunk = run->next_chunk, items = run->tape->count;
    if (run->files) {
        if (run->pending[chunk % 2] != 0) {
            run->waiting = true;
            run->waiting_since_ns = loop_now_ns();
            return;
        }
        if (chunk + 1 < run->chunks) media_read(run, chunk + 1);
    }
    size_t first, last;
    media_chunk(run, chunk, &first, &last);
    run->chunk(run, first, last);
    run->next_chunk = ++chunk;
    if (encode->failure == UFORM_OK && progress_report(&encode->progress, &encode->next_step, last, items))
        encode_stop(encode, UFORM_CANCELLED, "cancelled by the progress handler");
    if (encode->failure != UFORM_OK || chunk == run->chunks) {
        media_settle(run);
        return;
    }
    loop_post(run->executor->loop, run->turn);
}

void media_start(media_run_t *run) {
    if (run->files) media_read(run, 0);
    media_turn(run);
}
