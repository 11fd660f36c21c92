/* The chunked run of an image, video or audio call (src/image.c, src/audio.c), and the files it reads.
 *
 * The call's items go in chunks of `chunk_items`, one chunk per loop turn, so that progress reports,
 * cancellation and other completions are served between chunks. When the items are files (their paths in
 * the tape), every file of chunk k + 1 is opened, stat'ed and read through the executor's ring
 * (open -> statx -> read, one operation at a time per file) before chunk k is decoded and computed, so
 * that the kernel reads meanwhile; a chunk's turn waits until its files are read, and that wait counts in
 * stats.read_ns.
 *
 * A file that cannot be read keeps its status in the call's statuses, and its item is left for the
 * chunk to skip: UFORM_INVALID_ARGUMENT (an empty path, or one holding a NUL byte), UFORM_IO (a path
 * of MEDIA_PATH_MAX bytes or more, a file that cannot be opened, stat'ed or read, or is not a regular
 * file), UFORM_FORMAT (an empty file, or one over `max_bytes`), UFORM_OUT_OF_MEMORY.
 *
 * Once the call records a failure (encode_stop), no chunk and no file operation starts, and the call
 * ends when its file operations in flight have landed. Everything here runs on the loop thread. */
#pragma once

#include <sys/stat.h>

#include "encode.h"

#define MEDIA_PATH_MAX 4096

typedef struct media_run media_run_t;

/* A file being read: one ring operation at a time (open, statx, read). Slots [0, chunk_items) serve
 * the even chunks, the next chunk_items the odd ones, so that chunk k + 1 is read while k computes. */
typedef struct media_slot {
    loop_op_t op;
    media_run_t *run;
    size_t item;
    int fd;
    struct statx statx;
    uint8_t *buffer; /* the file's bytes; kept and grown across chunks */
    size_t capacity, size;
    char path[MEDIA_PATH_MAX];
} media_slot_t;

struct media_run {
    /* Set by the call before media_open. */
    uform_executor_t *executor;
    loop_op_t *turn;          /* the call's op, posted for each turn: its callback calls media_turn */
    encode_call_t *encode;    /* its failure stops the run; statuses, progress and stats are counted in it */
    uform_tape_t const *tape; /* the items; their paths when `files` */
    bool files;
    size_t max_bytes;   /* a larger file is UFORM_FORMAT */
    size_t chunk_items; /* items per chunk, wanted: media_open keeps it within [1, items] */
    void (*chunk)(media_run_t *run, size_t first, size_t last); /* decodes and computes items [first, last) */
    void (*end)(media_run_t *run);                              /* ends the call: nothing is in flight */

    /* The run's own. */
    size_t chunks, next_chunk;
    media_slot_t *slots; /* 2 chunk_items when `files`, else none */
    size_t slots_count;
    size_t in_flight;  /* ring operations not final */
    size_t pending[2]; /* files of the even and of the odd chunk not read yet */
    bool waiting;      /* the turn of `next_chunk` waits for its files */
    uint64_t waiting_since_ns;
};

/* Sizes the chunks and allocates the file slots. false when out of memory (media_close frees what was
 * made). */
bool media_open(media_run_t *run);
void media_close(media_run_t *run);

/* The first chunk's files are opened, then its turn runs; the run ends with `end`. */
void media_start(media_run_t *run);

/* A turn: waits for the next chunk's files (a file read later resumes it), opens the files of the
 * chunk after, runs `chunk`, reports progress, then posts the next turn or ends the run. */
void media_turn(media_run_t *run);

/* The bytes read for item `item` (a file) while its chunk is being decoded: *size is 0 for a file that
 * was not read. */
uint8_t const *media_file(media_run_t const *run, size_t item, size_t *size);
