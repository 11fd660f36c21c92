/* The engine's internal types: outcomes, calls, executors, arenas, models.
 *
 * A call's life: the verb validates its arguments on the calling thread, acquires the executor
 * (`call_begin`, which answers UFORM_CONTENDED at once when another call holds it), prepares its state,
 * and submits it (`call_submit`). The state machine then runs on the executor's loop thread as loop
 * callbacks, and ends with exactly one `call_finish`, which releases the executor, makes the outcome
 * final, and notifies external loops. Nothing touches the call's state after `call_finish`. */
#pragma once

#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>

#include "uform.h"
#include "uform_config.h"
#include "checkpoint.h"
#include "errors.h"
#include "kernels.h"
#include "loop.h"

#define container_of(pointer, type, member) ((type *)((char *)(pointer)-offsetof(type, member)))

/* A pause in a spin loop, so that the sibling hyperthread and the memory system get a turn. */
static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Bytes rounded up to a multiple of 64: cache lines, and the alignment of scratch carved in pieces. */
static inline size_t round_up_64(size_t bytes) {
    return (bytes + 63) & ~(size_t)63;
}

/* ---- Futex words -------------------------------------------------------------------------------- */

/* Blocks while *word == expected (private futex); spurious returns are possible. */
void futex_wait(_Atomic uint32_t *word, uint32_t expected);
void futex_wake_all(_Atomic uint32_t *word);
void futex_wake_one(_Atomic uint32_t *word);

/* ---- Outcomes ----------------------------------------------------------------------------------- */

#define OUTCOME_MAGIC       0x75666f72u /* "ufor": set by uform_outcome_init */
#define OUTCOME_WAITERS     (1u << 31)  /* a thread sleeps on the word: the finisher must wake it */
#define OUTCOME_STATUS_MASK 0xffffu

typedef enum outcome_product {
    OUTCOME_PRODUCT_NONE = 0,
    OUTCOME_PRODUCT_MODEL,
    OUTCOME_PRODUCT_ENCODED,
    OUTCOME_PRODUCT_PROBABILITIES,
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
        uform_model_t *model;
        uform_encoded_t encoded;
        uform_view_t probabilities;
    };
} outcome_t;

_Static_assert(sizeof(outcome_t) <= UFORM_OUTCOME_SIZE, "outcome_t outgrew UFORM_OUTCOME_SIZE");
_Static_assert(alignof(outcome_t) <= UFORM_OUTCOME_ALIGNMENT, "outcome_t alignment");

static inline outcome_t *outcome_of(uform_outcome_t *outcome) {
    return (outcome_t *)(void *)outcome->opaque;
}

/* ---- Calls -------------------------------------------------------------------------------------- */

typedef struct call call_t;
struct call {
    loop_op_t op; /* the post that starts the call on the loop thread */
    void (*start)(call_t *call);
    uform_executor_t *executor;
    outcome_t *outcome;
    char const *entry; /* the public entry point, for errors */
};

/* The executor a verb runs on: `executor`, or the calling thread's own inline executor for NULL.
 * Answers NULL only when that inline executor cannot be made (out of memory). */
uform_executor_t *call_executor(uform_executor_t *executor);

/* Starts a call on the calling thread: checks that the outcome was initialized and is not pending,
 * acquires the executor (UFORM_CONTENDED if held), and marks the outcome pending. On failure the
 * outcome (when initialized) is made final with the same status, the failure is recorded, and the
 * status is answered. */
uform_status_t call_begin(call_t *call, uform_executor_t *executor, outcome_t *outcome, char const *entry);

/* The common opening of a verb whose state lives in the executor's call storage: resolves the
 * executor (NULL: the calling thread's), takes `arena` (when not NULL; UFORM_CONTENDED if held), then
 * the executor (call_begin), on `outcome`, or on `own` (initialized here) for a blocking call. On
 * UFORM_OK, `*call` is the call at the start of the storage and the `state_size - sizeof(call_t)` bytes
 * after it are zeroed; on failure nothing is held and the failure is recorded. */
uform_status_t call_open(uform_executor_t *executor, uform_arena_t *arena, uform_outcome_t *outcome,
                         uform_outcome_t *own, size_t state_size, char const *entry, call_t **call);

/* Hands a begun call to its executor: its `start` runs on the loop thread. Inline and pool executors
 * run the loop on the calling thread until the outcome is final, then release the executor. */
void call_submit(call_t *call);

/* Ends a call: records the failure (message NULL for UFORM_OK), releases a threaded executor (the
 * calling thread releases the others once its loop returns), makes the outcome final, wakes its
 * waiters and notifies its external loops. Products must be stored in the outcome before. Runs on the
 * loop thread. */
void call_finish(call_t *call, uform_status_t status, char const *message);

/* A verb's failure before submission: records it and, when an initialized outcome was given, makes
 * that outcome final with it (with notifications). Answers `status`. */
uform_status_t call_refuse(uform_outcome_t *outcome, uform_status_t status, char const *entry,
                           char const *message);

/* A blocking call's tail: waits on its own outcome and records a failure on the calling thread. */
uform_status_t call_wait(outcome_t *outcome);

/* Runs a progress handler if the step threshold was crossed; answers true when it asks to cancel.
 * `next_step` is the caller's cursor, starting at 1. */
bool progress_report(uform_progress_t const *progress, size_t *next_step, size_t completed, size_t total);

/* ---- Executors ---------------------------------------------------------------------------------- */

typedef struct team team_t;

#define EXECUTOR_CALL_STORAGE 1024

struct uform_executor {
    uform_executor_kind_t kind;
    _Atomic size_t references;
    _Atomic(call_t *) holder; /* the call holding the executor, or NULL */
    _Atomic uint32_t active;  /* calls begun and not settled, | EXECUTOR_WAITERS */
    _Atomic uint32_t mood;
    uint64_t spin_ns;
    size_t threads;
    size_t domains_count;
    loop_t *loop;  /* inline and pool: created by the first call, driven by the calling thread */
    bool threaded; /* the loop has a thread of its own (RAM) */

    /* RAM */
    pthread_t loop_thread;
    _Atomic bool stopping;
    _Atomic uint32_t started; /* loop thread start: 0 pending, 1 running, 2 failed */
    team_t *team;
    void *topology; /* hwloc_topology_t when built with hwloc */
    void *cpuset;   /* hwloc_bitmap_t: where the threads run */
    void *nodeset;  /* hwloc_bitmap_t: where memory is bound, or NULL for no binding */
    bool pin;

    /* pool */
    uform_pool_vtable_t pool_vtable;
    void *pool;

    /* VRAM: the devices, their streams and buffers (src/vram/vram.h) */
    struct vram *vram;

    /* One call at a time: the state of the verb in flight and its scratch live here, so a steady loop
     * of calls allocates nothing. */
    alignas(64) unsigned char call_storage[EXECUTOR_CALL_STORAGE];
    void *scratch;
    size_t scratch_bytes;

    /* The empty verb's state. */
    struct {
        call_t call;
        loop_op_t timer;
        uint64_t delay_ns;
    } nop;
};

#define EXECUTOR_WAITERS (1u << 31) /* drain or free sleeps on `active` */

/* Executors are kept alive by their creator's reference and by every arena and model placed on them.
 * A call takes no reference: freeing an executor first waits until no call holds it. */
void executor_retain(uform_executor_t *executor);
void executor_release(uform_executor_t *executor);

/* Lets the next call take the executor (before the outcome turns final, so that a caller who saw it
 * final can submit at once); then, once the finishing call touches nothing more, `executor_settle`
 * counts it out and wakes drain and free when none is left. */
void executor_unhold(uform_executor_t *executor);
void executor_settle(uform_executor_t *executor);

/* Runs work(context, thread) once for every thread of the executor, the calling (loop) thread as
 * thread 0, and returns when all have. */
void executor_for_threads(uform_executor_t *executor, void (*work)(void *context, size_t thread),
                          void *context);

/* Loop thread, between forks: lends a RAM executor's last worker to run work(context) once, alone,
 * while the loop thread goes on with forks over the other threads. While it is lent,
 * executor_for_threads runs over threads - 1 threads and `executor->threads` reads threads - 1, so that
 * work split by it covers exactly those (uform_executor_info still reports every thread). Once the work
 * has returned, the next executor_for_threads (or executor_reclaim) gives the worker back: work split
 * for threads - 1 before then gives it nothing (thread_share), work split after covers it. The work
 * must end on its own and tell the loop so (loop_post). false, with nothing lent, for inline, pool and
 * VRAM executors, a RAM executor of one thread, or one whose worker is lent already. */
bool executor_lend(uform_executor_t *executor, void (*work)(void *context), void *context);

/* Loop thread, between forks: the threads the next executor_for_threads runs over, to split its work
 * by. A lent worker whose work has returned is given back here, so work split right after counts it:
 * a job that reads this once and forks many times keeps, through all of them, the thread count of its
 * first (a whole tower pass on one thread of two, when it began while a worker was lent). */
size_t executor_fork_threads(uform_executor_t *executor);

/* Loop thread, between forks: waits until the lent work has returned (callers wait for its last
 * completion first, so this is short) and gives its worker back to forks. Nothing lent, or already
 * given back: no-op. */
void executor_reclaim(uform_executor_t *executor);

/* The share [first, last) of `count` units that thread `thread` of `threads` takes under
 * executor_for_threads: contiguous, in thread order, sizes differing by at most one. A thread at or
 * past `threads` (a lent worker back in a fork whose work was split without it) takes nothing. */
static inline void thread_share(size_t count, size_t thread, size_t threads, size_t *first, size_t *last) {
    if (thread >= threads) {
        *first = *last = count;
        return;
    }
    *first = count * thread / threads;
    *last = count * (thread + 1) / threads;
}

/* The GEMM columns [*begin, *end) of `n` that thread `thread` of `threads` takes: whole tiles of
 * KERNEL_GEMM_TILE (the last one cut at n) shared as thread_share shares units. false when none. */
static inline bool thread_columns(size_t n, size_t thread, size_t threads, size_t *begin, size_t *end) {
    size_t tiles = (n + KERNEL_GEMM_TILE - 1) / KERNEL_GEMM_TILE, first, last;
    thread_share(tiles, thread, threads, &first, &last);
    *begin = first * KERNEL_GEMM_TILE;
    *end = last * KERNEL_GEMM_TILE < n ? last * KERNEL_GEMM_TILE : n;
    return first < last;
}

/* Host memory placed where the executor computes: 64-byte aligned, bound to its NUMA domains. NULL
 * executor: plain host memory. Answers NULL when out of memory. */
void *executor_allocate(uform_executor_t *executor, size_t bytes);
void executor_deallocate(uform_executor_t *executor, void *memory, size_t bytes);

/* The held executor's scratch, grown to at least `bytes` (its contents are not kept); NULL when out
 * of memory. Valid until the next call on the executor. */
void *executor_scratch(uform_executor_t *executor, size_t bytes);

/* A verb whose state lives in `call_storage` asserts that it fits:
 * _Static_assert(sizeof(state) <= EXECUTOR_CALL_STORAGE, ...). */

/* ---- Arenas ------------------------------------------------------------------------------------- */

typedef struct arena_block arena_block_t;

/* Blocks of one kind of memory, bumped newest first. */
typedef struct arena_pool {
    arena_block_t *blocks; /* newest first */
    size_t capacity;       /* bytes in every block */
    size_t used_total;     /* bytes handed out since the rewind, for coalescing */
    bool device;           /* blocks of device memory (headers stay on the host) */
} arena_pool_t;

struct uform_arena {
    uform_executor_t *executor; /* NULL for host arenas */
    _Atomic uint64_t generation;
    _Atomic bool busy; /* a call writes into it */
    arena_pool_t outputs;
    arena_pool_t host; /* device arenas: what the host reads (statuses, item offsets) */
};

/* Takes the arena for one call (UFORM_CONTENDED when another call has it), rewinds it (coalescing
 * its blocks into one when the last call needed several) and bumps its generation. */
uform_status_t arena_begin(uform_arena_t *arena);
void arena_end(uform_arena_t *arena);

/* Aligned memory for this call's outputs (device memory in device arenas); never moves what was
 * handed out earlier in the call. Answers NULL when out of memory. */
void *arena_allocate(uform_arena_t *arena, size_t bytes, size_t alignment);
/* The same in host memory, whatever the arena: per-item statuses and item offsets. */
void *arena_allocate_host(uform_arena_t *arena, size_t bytes, size_t alignment);

/* A view over `rows` x `columns` of `scalar` at `data`, in the arena's current generation. */
uform_view_t arena_view(uform_arena_t *arena, void *data, size_t rows, size_t columns, uform_scalar_t scalar);

/* ---- Models ------------------------------------------------------------------------------------- */

struct tower;

struct uform_model {
    _Atomic size_t references;
    struct tower *text;         /* prepared for the kernels when the model has a text tower */
    struct tower *image;        /* the image tower (video uses it too), when present */
    struct tower *audio;        /* the audio tower, when present */
    struct vram_model *device;  /* VRAM models: the weights on each device (src/vram/vram.h); NULL on host */
    uform_executor_t *executor; /* owns the placement of `data`; NULL: plain host memory */
    checkpoint_header_t header;
    uint8_t *data; /* the data section: tensor t spans data + begin .. data + end */
    size_t data_size;
    void *mapping; /* when mapped: the whole file */
    size_t mapping_size;
};

void model_retain(uform_model_t *model);

/* Arenas of an executor serve its calls and calling-thread calls; host arenas serve any host call.
 * UFORM_OK, or UFORM_INVALID_ARGUMENT with a message. */
uform_status_t arena_check(uform_arena_t const *arena, uform_executor_t const *executor,
                           char const **message);

/* The bytes of a tensor, or NULL when absent. */
void const *model_tensor(uform_model_t const *model, char const *name, checkpoint_tensor_t const **tensor);

/* A VRAM model runs on the VRAM executor that loaded it; a host model on host executors.
 * UFORM_OK, or UFORM_INVALID_ARGUMENT with a message. */
uform_status_t model_residency(uform_model_t const *model, uform_executor_t const *executor,
                               char const **message);

/* ---- Tapes -------------------------------------------------------------------------------------- */

/* UFORM_OK, or UFORM_INVALID_ARGUMENT with a message (NULL offsets with count > 0, NULL data with a
 * non-empty span, offsets out of order). */
uform_status_t tape_validate(uform_tape_t const *tape, char const **message);
