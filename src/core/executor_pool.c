/* Pool executors: the caller's own thread pool behind a vtable (uform_executor_create_pool), and
 * fork_union's pools through the same vtable. Calls run their loop on the calling thread; forks go to
 * the pool. */
#include <stdlib.h>

#include "executor.h"

#if UFORM_WITH_FORK_UNION
#include <fork_union.h>
#endif

/* A pool executor's state. */
typedef struct pool {
    uform_pool_vtable_t vtable;
    void *pool;
} pool_t;

static void pool_for_threads(uform_executor_t *executor, void (*work)(void *context, size_t thread),
                             void *context) {
    pool_t const *pool = executor->state;
    pool->vtable.for_threads(pool->pool, work, context);
}

static void pool_destroy(uform_executor_t *executor) {
    free(executor->state);
}

static executor_ops_t const pool_ops = {
    .kind = UFORM_EXECUTOR_POOL,
    .destroy = pool_destroy,
    .for_threads = pool_for_threads,
};

UFORM_EXPORT uform_status_t uform_executor_create_pool(uform_pool_vtable_t const *vtable, void *pool,
                                                       uform_executor_t **out) {
    static char const entry[] = "uform_executor_create_pool";
    if (!out) return failed(UFORM_INVALID_ARGUMENT, entry, "executor is NULL");
    *out = NULL;
    if (!vtable || !vtable->count_threads || !vtable->for_threads)
        return failed(UFORM_INVALID_ARGUMENT, entry, "the pool vtable lacks a function");
    size_t threads = vtable->count_threads(pool);
    if (threads == 0) return failed(UFORM_INVALID_ARGUMENT, entry, "the pool has no threads");
    uform_executor_t *executor = executor_new(&pool_ops);
    pool_t *state = executor ? malloc(sizeof *state) : NULL;
    if (!state) {
        free(executor);
        return failed(UFORM_OUT_OF_MEMORY, entry, "cannot allocate the executor");
    }
    *state = (pool_t){*vtable, pool};
    executor->state = state;
    executor->threads = threads;
    *out = executor;
    return UFORM_OK;
}

#if UFORM_WITH_FORK_UNION
/* fork_union's callbacks also name the thread's colocation, which executors do not use. */
typedef struct fork_union_work {
    void (*work)(void *context, size_t thread);
    void *context;
} fork_union_work_t;

static void fork_union_trampoline(void *context, size_t thread, size_t colocation) {
    (void)colocation;
    fork_union_work_t const *work = context;
    work->work(work->context, thread);
}

static size_t fork_union_count_threads(void *pool) {
    return fu_pool_count_threads(pool);
}

static void fork_union_for_threads(void *pool, void (*work)(void *context, size_t thread), void *context) {
    fork_union_work_t forwarded = {work, context};
    fu_pool_for_threads(pool, fork_union_trampoline, &forwarded);
}

static uform_pool_vtable_t const fork_union_vtable = {fork_union_count_threads, fork_union_for_threads};
#endif

UFORM_EXPORT uform_status_t uform_executor_create_fork_union(void *fu_pool, uform_executor_t **out) {
    static char const entry[] = "uform_executor_create_fork_union";
    if (out) *out = NULL;
    if (!fu_pool || !out) return failed(UFORM_INVALID_ARGUMENT, entry, "pool or executor is NULL");
#if UFORM_WITH_FORK_UNION
    uform_status_t status = uform_executor_create_pool(&fork_union_vtable, fu_pool, out);
    return status == UFORM_OK ? status : failed(status, entry, uform_last_error().message);
#else
    return failed(UFORM_UNSUPPORTED, entry,
                  "built without fork_union; wrap the pool with uform_executor_create_pool");
#endif
}
