/* Executors: where a call runs. An executor is its operations (executor_ops_t, one table per kind:
 * inline and RAM here and in executor_ram.c, pools in executor_pool.c, VRAM in src/vram) over what every
 * kind shares: the references, the hold of the call in flight (call.h), the loop, the call storage and
 * scratch. The kind's own state (a RAM executor's team and topology, a pool's vtable, a VRAM executor's
 * devices) is behind `state`, read only by that kind's files. */
#pragma once

#include <pthread.h>

#include "common.h"
#include "kernels.h"
#include "loop.h"

#define EXECUTOR_CALL_STORAGE 1152
#define EXECUTOR_WAITERS      (1u << 31)   /* drain or free sleeps on `active` */
#define EXECUTOR_SPIN_NS      100000000ull /* the default spin: 100 ms, like OpenMP runtimes' block time */
/* How long a worker polls for the next fork while a call holds the executor, in either mood, before it
 * sleeps: the forks of one call follow each other within microseconds, and a worker woken from its futex
 * for each one started it late (tens of microseconds on a virtual machine) while the loop thread waited. */
#define EXECUTOR_FORK_SPIN_NS 200000ull

struct call;

/* A device executor's memory: its arenas' output memory, and a synchronous 2D copy of `rows` rows of
 * `width` bytes out of it. */
typedef struct executor_device_ops {
    void *(*allocate)(uform_executor_t *executor, size_t bytes);
    void (*deallocate)(uform_executor_t *executor, void *memory);
    uform_status_t (*copy_to_host)(uform_executor_t *executor, void *host, size_t host_pitch,
                                   void const *device, size_t device_pitch, size_t width, size_t rows);
} executor_device_ops_t;

/* What makes one kind of executor differ from another. NULL members take the default named. */
typedef struct executor_ops {
    uform_executor_kind_t kind;
    /* Frees the kind's state (the loop thread is stopped and the scratch freed before). NULL: none. */
    void (*destroy)(uform_executor_t *executor);
    /* Makes idle threads read the mood again (a drain changed it). NULL: none but the loop thread. */
    void (*wake_idle)(uform_executor_t *executor);
    /* The loop thread's first act, on that thread (RAM: pin it). NULL: nothing. */
    void (*loop_thread_start)(uform_executor_t *executor);
    /* Runs work(context, thread) on every thread of the executor. NULL: once, on the calling thread. */
    void (*for_threads)(uform_executor_t *executor, void (*work)(void *context, size_t thread),
                        void *context);
    /* Every thread, a lent one included (uform_executor_info). NULL: `threads`. */
    size_t (*threads_total)(uform_executor_t const *executor);
    /* Host memory where the executor computes, 64-byte aligned. NULL: aligned_alloc and free. */
    void *(*allocate)(uform_executor_t *executor, size_t bytes);
    void (*deallocate)(uform_executor_t *executor, void *memory, size_t bytes);
    /* Device executors' memory (VRAM). NULL members: the executor computes in host memory. */
    executor_device_ops_t device;
} executor_ops_t;

struct uform_executor {
    executor_ops_t const *ops;
    _Atomic size_t references;
    _Atomic(struct call *) holder; /* the call holding the executor, or NULL (call.h) */
    _Atomic uint32_t active;       /* calls begun and not settled, | EXECUTOR_WAITERS */
    _Atomic uint32_t mood;         /* uform_mood_t: how idle threads wait */
    _Atomic bool spin_held;        /* drained into UFORM_SPINNING: poll until the next call begins */
    uint64_t spin_ns;              /* otherwise idle threads in UFORM_SPINNING poll this long, then sleep */
    size_t threads;
    size_t domains_count;
    loop_t *loop;  /* inline and pool: created by the first call, driven by the calling thread */
    bool threaded; /* the loop has a thread of its own (RAM, VRAM) */

    /* The loop thread of threaded executors. */
    pthread_t loop_thread;
    _Atomic bool stopping;
    _Atomic uint32_t rung;    /* the destroying thread has rung the doorbell: the loop may be freed */
    _Atomic uint32_t started; /* loop thread start: 0 pending, 1 running, 2 failed */
    int loop_error;           /* loop_create's answer, once started is 2 */

    void *state; /* the kind's own */

    /* One call at a time: the state of the verb in flight and its scratch live here, so a steady loop
     * of calls allocates nothing. A verb asserts that its state fits:
     * _Static_assert(sizeof(state) <= EXECUTOR_CALL_STORAGE, ...). */
    alignas(64) unsigned char call_storage[EXECUTOR_CALL_STORAGE];
    void *scratch;
    size_t scratch_bytes;
};

/* True while idle threads poll without a deadline: from uform_executor_drain(UFORM_SPINNING) until the
 * next call begins or a drain into UFORM_SLEEPING. */
static inline bool executor_spin_held(uform_executor_t const *executor) {
    return atomic_load_explicit(&executor->spin_held, memory_order_relaxed);
}

/* How long the loop thread polls before it sleeps, in the executor's mood. */
static inline uint64_t executor_spin_ns(uform_executor_t const *executor) {
    if (atomic_load_explicit(&executor->mood, memory_order_relaxed) != UFORM_SPINNING) return 0;
    return executor_spin_held(executor) ? UINT64_MAX : executor->spin_ns;
}

/* A new executor of the kind `ops`, with one reference and one thread; NULL when out of memory. */
uform_executor_t *executor_new(executor_ops_t const *ops);

/* The status and static message of a loop that could not be made from loop_create's answer (-errno):
 * UFORM_OUT_OF_MEMORY for ENOMEM, else UFORM_IO. */
uform_status_t executor_loop_failure(int error, char const **message);

/* Starts the loop thread of a threaded executor (its loop made on that thread). UFORM_OK, or a failure
 * with a static message. */
uform_status_t executor_start_loop(uform_executor_t *executor, char const **message);

/* Test hook: when not NULL, called by executor_destroy on the destroying thread of a threaded executor
 * between storing `stopping` and ringing the loop's doorbell, the window in which the loop thread may
 * already be leaving its loop. Set it before the executors it watches are freed. */
extern void (*executor_stop_observer)(uform_executor_t *executor);

/* Stops the loop thread, frees the scratch, the kind's state and the executor. For executors nobody
 * else has seen (a failed create); the others go through executor_release. */
void executor_destroy(uform_executor_t *executor);

/* Executors are kept alive by their creator's reference and by every arena and model placed on them.
 * A call takes no reference: freeing an executor first waits until no call holds it (call.h). */
void executor_retain(uform_executor_t *executor);
void executor_release(uform_executor_t *executor);

/* The executor a verb runs on: `executor`, or the calling thread's own inline executor for NULL.
 * Answers NULL only when that inline executor cannot be made (out of memory). */
uform_executor_t *call_executor(uform_executor_t *executor);

/* Computes in device memory (a VRAM executor): its arenas hold device memory. */
static inline bool executor_on_device(uform_executor_t const *executor) {
    return executor->ops->device.allocate != NULL;
}

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

/* The hwloc topology a RAM executor reads (the process's, shared by every RAM executor), or NULL: any
 * other kind, or a build without hwloc. */
void const *executor_topology(uform_executor_t const *executor);

/* Can lend a worker now: a RAM executor of two threads or more, none lent. */
bool executor_lends(uform_executor_t const *executor);

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

/* Plain host memory, 64-byte aligned (freed with free): what executors without `allocate` compute in,
 * and a RAM executor bound to no domain. NULL when out of memory. */
void *executor_host_allocate(size_t bytes);

/* Host memory placed where the executor computes: 64-byte aligned, bound to its NUMA domains. NULL
 * executor: plain host memory. Answers NULL when out of memory. */
void *executor_allocate(uform_executor_t *executor, size_t bytes);
void executor_deallocate(uform_executor_t *executor, void *memory, size_t bytes);

/* A device executor's memory (executor_on_device), and a copy out of it; NULL or UFORM_DEVICE on failure. */
void *executor_device_allocate(uform_executor_t *executor, size_t bytes);
void executor_device_deallocate(uform_executor_t *executor, void *memory);
uform_status_t executor_device_copy_to_host(uform_executor_t *executor, void *host, size_t host_pitch,
                                            void const *device, size_t device_pitch, size_t width,
                                            size_t rows);

/* The held executor's scratch, grown to at least `bytes` (its contents are not kept); NULL when out
 * of memory. Valid until the next call on the executor. */
void *executor_scratch(uform_executor_t *executor, size_t bytes);
