/* The chunked run of an image, video or audio call (src/encode/image.c, src/encode/audio.c), the files it
 * reads and the decoding of its items.
 *
 * The call's items go in chunks of `chunk_items`, one chunk per loop turn, so that progress reports,
 * cancellation and other completions are served between chunks. A turn decodes its chunk's items into
 * patch rows (unless they were decoded ahead), then computes the chunk (the tower, the outputs).
 *
 * Decoding ahead: on a RAM executor of N >= 2 threads, each turn k lends the executor's last worker
 * (executor_lend) to decode chunk k + 1 into the other set of patch rows while the loop thread and the
 * N - 1 others compute chunk k; every item it decodes is posted to the loop as a completion, and turn
 * k + 1 starts once all of them have landed. The tower runs on N - 1 threads only while the worker
 * decodes: once done, it rejoins the forks (executor_lend). A turn whose chunk was not decoded ahead
 * (the first, or one whose files were not read in time) decodes it in parallel over all N threads.
 * Inline, pool and one-thread executors decode each chunk on its turn, in parallel over their
 * threads. Which thread decodes an item never changes its rows, and the tower's rows do not depend on
 * the thread count, so the outputs are bitwise the same either way. Memory: two chunks of patch rows
 * (one without decoding ahead).
 *
 * Files: when the items are files (their paths in the tape), every file of chunk k + 2 is opened,
 * stat'ed and read through the executor's ring (open -> statx -> read, one operation at a time per
 * file) from turn k, once chunk k is decoded and its file buffers are free, so that the kernel reads
 * while chunks k and k + 1 are computed and decoded; a turn waits until its chunk's files are read (and
 * the next chunk's, to decode them ahead), and that wait counts in stats.read_ns. decode_ns counts the
 * decoding on turns plus the lent worker's time, so with decoding ahead decode_ns + compute_ns may
 * exceed total_ns.
 *
 * A file that cannot be read keeps its status in the call's statuses, and its item is left for the
 * chunk to skip: UFORM_INVALID_ARGUMENT (an empty path, or one holding a NUL byte), UFORM_IO (a path
 * of MEDIA_PATH_MAX bytes or more, a file that cannot be opened, stat'ed or read, or is not a regular
 * file), UFORM_FORMAT (an empty file, or one over `max_bytes`), UFORM_OUT_OF_MEMORY.
 *
 * Another executor's workers: a call on a VRAM executor computes on its devices, so every host thread
 * may decode. It names its executor's host team as `workers`; each chunk is then decoded on its turn over
 * all of the team's threads (none is lent), into the other of two sets of rows, while the devices compute
 * the chunks before from theirs; `ready` says when the turn of a chunk may start (its set of rows, and a
 * device slot, free again), and the call pokes the run (media_poke) when that may have changed. The wait
 * for it counts in stats.read_ns with the wait for files.
 *
 * Once the call records a failure (encode_stop), no chunk, decode or file operation starts, and the call
 * ends when its file operations and its decoding ahead in flight have landed. Everything here runs on
 * the loop thread, but `decode`, which runs on executor threads. */
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
    loop_stat_t statx;
    uint8_t *buffer; /* the file's bytes; kept and grown across chunks */
    size_t capacity, size;
    char path[MEDIA_PATH_MAX];
} media_slot_t;

/* One item decoded ahead: posted to the loop by the lent worker. */
typedef struct media_decoded {
    loop_op_t op;
    media_run_t *run;
} media_decoded_t;

struct media_run {
    /* Set by the call before media_open. */
    call_t *call; /* on its executor; its op is posted for each turn: its callback calls media_turn */
    encode_call_t *encode; /* its tape holds the items (their paths when `files`); its failure stops the
                              run; statuses, progress and stats are counted in it */
    bool files;
    size_t max_bytes;   /* a larger file is UFORM_FORMAT */
    size_t chunk_items; /* items per chunk, wanted: media_open keeps it within [1, items] */
    size_t item_floats; /* patch-row floats per item */
    /* Decodes item `item` into its patch rows [item_floats] on executor thread `thread` (any thread,
     * concurrently with the loop thread's compute of another chunk and with other items of its chunk):
     * an item whose status is not UFORM_OK already (a file not read) or that fails records its status
     * and whatever its chunk needs to skip it. It touches only that item's state. */
    void (*decode)(media_run_t *run, size_t item, float *rows, size_t thread);
    /* Computes the decoded items [first, last), their patch rows at `rows`, on the loop thread. */
    void (*chunk)(media_run_t *run, size_t first, size_t last, float *rows);
    void (*end)(media_run_t *run); /* ends the call: nothing is in flight */
    /* Optional. The executor whose threads decode, when not the call's (a VRAM executor's host team). */
    uform_executor_t *workers;
    /* Optional. Whether the turn of `chunk` may start; while false the turn waits for media_poke. */
    bool (*ready)(media_run_t *run, size_t chunk);

    /* The run's own. */
    size_t chunks, next_chunk;
    size_t threads;      /* the executor's at media_open: `decode` sees thread indices below it */
    float *rows;         /* [sets, chunk_items, item_floats]: chunk k's patch rows in set k % sets */
    size_t sets;         /* 2 when chunks are decoded ahead, else 1 */
    media_slot_t *slots; /* 2 chunk_items when `files`, else none */
    size_t slots_count;
    size_t in_flight;  /* ring operations not final */
    size_t pending[2]; /* files of the even and of the odd chunk not read yet */
    bool waiting;      /* the turn of `next_chunk` waits for files or for its decoding ahead */
    uint64_t waiting_since_ns;

    /* Decoding ahead. */
    media_decoded_t *decoded; /* [chunk_items] when sets == 2 */
    size_t ahead_chunk;       /* the chunk decoded ahead, or SIZE_MAX */
    size_t undecoded;         /* its items not landed yet */
    bool lent;                /* the executor's last worker decodes it */
    size_t decoder_thread;    /* that worker's index, for `decode` */
    uint64_t ahead_ns;        /* the worker's time on the chunk: written before its last post */
};

/* Sizes the chunks, allocates the patch rows and the file slots. false when out of memory (media_close
 * frees what was made). */
bool media_open(media_run_t *run);
void media_close(media_run_t *run);

/* The first chunks' files are opened, then the first turn runs; the run ends with `end`, at once for a
 * call that failed already (encode_stop: its outputs, say, could not be allocated). */
void media_start(media_run_t *run);

/* A turn: waits for its chunk's decoding ahead and for the files it needs, decodes its chunk if that
 * was not done ahead, hands the next chunk to the lent worker, opens the files of the chunk after, runs
 * `chunk`, reports progress, then posts the next turn or ends the run. */
void media_turn(media_run_t *run);

/* A turn waiting for `ready` looks again, and goes on if it may. */
void media_poke(media_run_t *run);

/* The bytes read for item `item` (a file) while its chunk is being decoded: *size is 0 for a file that
 * was not read. */
uint8_t const *media_file(media_run_t const *run, size_t item, size_t *size);

/* Test hook: when not NULL, told of a run's steps: MEDIA_EVENT_AHEAD when `chunk` is handed to the lent
 * worker, MEDIA_EVENT_COMPUTE just before `chunk` is computed (both on the loop thread), and
 * MEDIA_EVENT_DECODED when the lent worker has decoded an item of `chunk` (on that worker). Set it
 * before the calls it watches. */
typedef enum media_event {
    MEDIA_EVENT_AHEAD,
    MEDIA_EVENT_COMPUTE,
    MEDIA_EVENT_DECODED,
} media_event_t;

extern void (*media_observer)(media_event_t event, size_t chunk);
