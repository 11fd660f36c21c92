/* Executors: where a call runs. Inline and pool executors run their loop on the calling thread; a RAM
 * executor has a loop thread (thread 0) and a team of workers (threads 1..n-1) for fork-join compute,
 * pinned to cores of its NUMA domains through hwloc. */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "vram.h"

#if UFORM_WITH_HWLOC
#include <hwloc.h>
#endif
#if UFORM_WITH_FORK_UNION
#include <fork_union.h>
#endif

#define DEFAULT_SPIN_NS 100000000ull /* 100 ms, like OpenMP runtimes' block time */

/* ---- Fork-join team ----------------------------------------------------------------------------- */

struct team {
    uform_executor_t *executor;
    size_t count; /* threads, the loop thread included */
    pthread_t *workers;
    size_t started;              /* workers created, for teardown after a partial start */
    _Atomic uint32_t generation; /* bumped for every fork; workers wait for it to change */
    _Atomic uint32_t sleepers;   /* workers asleep on `generation` */
    _Atomic uint32_t pending;    /* workers still running the current fork */
    _Atomic bool stopping;
    void (*work)(void *context, size_t thread);
    void *context;

    /* Lending the last worker (executor_lend): forks run over `forking` threads (count, or count - 1
     * while it is lent); `lent` goes NONE -> RUNNING (lent) -> DONE (its work returned) -> BACK
     * (reclaimed: it resumes waiting from `resume_generation`) -> NONE. */
    size_t forking;
    _Atomic uint32_t lent;
    void (*lent_work)(void *context);
    void *lent_context;
    uint32_t resume_generation;
};

enum { LENT_NONE = 0, LENT_RUNNING, LENT_DONE, LENT_BACK };

typedef struct worker_start {
    team_t *team;
    size_t index;
} worker_start_t;

static void thread_pin(uform_executor_t *executor, size_t index) {
#if UFORM_WITH_HWLOC
    if (!executor->pin || !executor->topology) return;
    hwloc_topology_t topology = executor->topology;
    hwloc_const_cpuset_t cpuset = executor->cpuset;
    int cores = hwloc_get_nbobjs_inside_cpuset_by_type(topology, cpuset, HWLOC_OBJ_CORE);
    if (cores <= 0) return;
    hwloc_obj_t core = hwloc_get_obj_inside_cpuset_by_type(topology, cpuset, HWLOC_OBJ_CORE,
                                                           (unsigned)(index % (size_t)cores));
    if (!core || !core->cpuset) return;
    /* A failed pin leaves the thread floating: slower, never wrong. */
    hwloc_set_cpubind(topology, core->cpuset, HWLOC_CPUBIND_THREAD);
#else
    (void)executor;
    (void)index;
#endif
}

/* Waits until *word differs from `seen`: polls for spin_ns in the spinning mood, then sleeps. */
static uint32_t team_await(team_t *team, _Atomic uint32_t *word, uint32_t seen) {
    uform_executor_t *executor = team->executor;
    uint32_t value = atomic_load_explicit(word, memory_order_acquire);
    if (value != seen) return value;
    if (atomic_load_explicit(&executor->mood, memory_order_relaxed) == UFORM_SPINNING) {
        uint64_t deadline = loop_now_ns() + executor->spin_ns;
        for (unsigned spins = 1;; ++spins) {
            cpu_relax();
            value = atomic_load_explicit(word, memory_order_acquire);
            if (value != seen) return value;
            if ((spins & 255) == 0 && loop_now_ns() > deadline) break;
        }
    }
    for (;;) {
        atomic_fetch_add_explicit(&team->sleepers, 1, memory_order_seq_cst);
        value = atomic_load_explicit(word, memory_order_seq_cst);
        if (value == seen) futex_wait(word, seen);
        atomic_fetch_sub_explicit(&team->sleepers, 1, memory_order_relaxed);
        value = atomic_load_explicit(word, memory_order_acquire);
        if (value != seen) return value;
    }
}

/* The fork that lends the last worker: nobody does anything in it, and the last worker, once it has
 * counted itself out, runs the lent work (team_worker). */
static void team_lend(void *context, size_t thread) {
    (void)context;
    (void)thread;
}

/* Waits while team->lent == seen, spinning a little, then on the futex; answers the new value. */
static uint32_t lent_await(team_t *team, uint32_t seen) {
    uint32_t value;
    while ((value = atomic_load_explicit(&team->lent, memory_order_acquire)) == seen) {
        for (unsigned spins = 0; spins < 4096 && value == seen; ++spins) {
            cpu_relax();
            value = atomic_load_explicit(&team->lent, memory_order_acquire);
        }
        if (value != seen) break;
        futex_wait(&team->lent, seen);
    }
    return value;
}

/* The lent worker's turn: runs the lent work, says so, and waits to be reclaimed. Forks made meanwhile
 * did not count it; it resumes from the generation the reclaim saw. */
static uint32_t team_lent(team_t *team) {
    team->lent_work(team->lent_context);
    atomic_store_explicit(&team->lent, LENT_DONE, memory_order_release);
    futex_wake_all(&team->lent);
    while (lent_await(team, LENT_DONE) != LENT_BACK)
        continue;
    uint32_t seen = team->resume_generation;
    atomic_store_explicit(&team->lent, LENT_NONE, memory_order_release);
    futex_wake_all(&team->lent);
    return seen;
}

static void *team_worker(void *argument) {
    worker_start_t start = *(worker_start_t *)argument;
    free(argument);
    team_t *team = start.team;
    thread_pin(team->executor, start.index);
    uint32_t seen = 0;
    for (;;) {
        seen = team_await(team, &team->generation, seen);
        if (atomic_load_explicit(&team->stopping, memory_order_acquire)) break;
        team->work(team->context, start.index);
        /* Read before counting out: the loop thread changes `work` only once every worker has. */
        bool lent = team->work == team_lend && start.index == team->count - 1;
        if (atomic_fetch_sub_explicit(&team->pending, 1, memory_order_acq_rel) == 1)
            futex_wake_all(&team->pending);
        if (lent) seen = team_lent(team);
    }
    return NULL;
}

static void team_fork(team_t *team) {
    atomic_fetch_add_explicit(&team->generation, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&team->sleepers, memory_order_seq_cst)) futex_wake_all(&team->generation);
}

static void team_stop(team_t *team) {
    if (!team) return;
    atomic_store_explicit(&team->stopping, true, memory_order_release);
    team_fork(team);
    for (size_t i = 0; i < team->started; ++i)
        pthread_join(team->workers[i], NULL);
    free(team->workers);
    free(team);
}

static uform_status_t team_start(uform_executor_t *executor, size_t count, team_t **out) {
    *out = NULL;
    if (count <= 1) return UFORM_OK;
    team_t *team = calloc(1, sizeof *team);
    if (!team) return UFORM_OUT_OF_MEMORY;
    team->executor = executor;
    team->count = count;
    team->forking = count;
    team->workers = calloc(count - 1, sizeof *team->workers);
    if (!team->workers) goto fail;
    for (size_t i = 1; i < count; ++i) {
        worker_start_t *start = malloc(sizeof *start);
        if (!start) goto fail;
        *start = (worker_start_t){team, i};
        if (pthread_create(&team->workers[i - 1], NULL, team_worker, start) != 0) {
            free(start);
            goto fail;
        }
        team->started++;
    }
    *out = team;
    return UFORM_OK;
fail:
    team_stop(team);
    return UFORM_OUT_OF_MEMORY;
}

/* Loop thread, between forks: the lent worker, its work returned, goes back to forks. It resumes waiting
 * from the generation seen here, so forks made while it was lent are not run again. */
static void team_rejoin(uform_executor_t *executor, team_t *team) {
    team->resume_generation = atomic_load_explicit(&team->generation, memory_order_relaxed);
    team->forking = team->count;
    executor->threads = team->count;
    atomic_store_explicit(&team->lent, LENT_BACK, memory_order_release);
    futex_wake_all(&team->lent);
}

size_t executor_fork_threads(uform_executor_t *executor) {
    team_t *team = executor->kind == UFORM_EXECUTOR_RAM ? executor->team : NULL;
    if (team && team->forking != team->count &&
        atomic_load_explicit(&team->lent, memory_order_acquire) == LENT_DONE)
        team_rejoin(executor, team);
    return executor->threads;
}

void executor_for_threads(uform_executor_t *executor, void (*work)(void *context, size_t thread),
                          void *context) {
    if (executor->kind == UFORM_EXECUTOR_POOL) {
        executor->pool_vtable.for_threads(executor->pool, work, context);
        return;
    }
    team_t *team = executor->team;
    if (!team) {
        work(context, 0);
        return;
    }
    /* A lent worker whose work has returned takes part again from this fork on; work split for one
     * thread fewer gives it nothing (thread_share), so callers split by executor_fork_threads. */
    executor_fork_threads(executor);
    if (team->forking == 1) { /* the only worker is lent */
        work(context, 0);
        return;
    }
    team->work = work;
    team->context = context;
    atomic_store_explicit(&team->pending, (uint32_t)(team->forking - 1), memory_order_relaxed);
    team_fork(team);
    work(context, 0);
    uint32_t pending;
    while ((pending = atomic_load_explicit(&team->pending, memory_order_acquire)) != 0) {
        for (unsigned spins = 0; spins < 4096 && pending; ++spins) {
            cpu_relax();
            pending = atomic_load_explicit(&team->pending, memory_order_acquire);
        }
        if (pending) futex_wait(&team->pending, pending);
    }
}

bool executor_lend(uform_executor_t *executor, void (*work)(void *context), void *context) {
    team_t *team = executor->kind == UFORM_EXECUTOR_RAM ? executor->team : NULL;
    if (!team || team->forking != team->count) return false;
    /* The last lend's worker, given back, may not have said so yet. */
    while (atomic_load_explicit(&team->lent, memory_order_acquire) != LENT_NONE)
        lent_await(team, LENT_BACK);
    team->lent_work = work;
    team->lent_context = context;
    atomic_store_explicit(&team->lent, LENT_RUNNING, memory_order_relaxed);
    executor_for_threads(executor, team_lend, NULL);
    team->forking = team->count - 1;
    executor->threads = team->count - 1;
    return true;
}

void executor_reclaim(uform_executor_t *executor) {
    team_t *team = executor->kind == UFORM_EXECUTOR_RAM ? executor->team : NULL;
    if (!team || team->forking == team->count) return;
    while (lent_await(team, LENT_RUNNING) != LENT_DONE)
        continue;
    team_rejoin(executor, team);
}

/* ---- Holding and lifetime ----------------------------------------------------------------------- */

void executor_unhold(uform_executor_t *executor) {
    atomic_store_explicit(&executor->holder, NULL, memory_order_release);
}

void executor_settle(uform_executor_t *executor) {
    uint32_t previous = atomic_fetch_sub_explicit(&executor->active, 1, memory_order_acq_rel);
    if (previous == (1u | EXECUTOR_WAITERS)) {
        atomic_fetch_and_explicit(&executor->active, ~EXECUTOR_WAITERS, memory_order_acq_rel);
        futex_wake_all(&executor->active);
    }
}

/* Blocks until no call holds the executor and every call has finished finishing. */
static void executor_await_idle(uform_executor_t *executor) {
    for (;;) {
        uint32_t active = atomic_load_explicit(&executor->active, memory_order_acquire);
        bool held = atomic_load_explicit(&executor->holder, memory_order_acquire) != NULL;
        if (!(active & ~EXECUTOR_WAITERS)) {
            if (!held) return;
            sched_yield(); /* a call was just taken and has not counted itself yet */
            continue;
        }
        if (!(active & EXECUTOR_WAITERS) &&
            !atomic_compare_exchange_weak(&executor->active, &active, active | EXECUTOR_WAITERS))
            continue;
        futex_wait(&executor->active, active | EXECUTOR_WAITERS);
    }
}

static void *ram_loop_main(void *argument);
static uform_status_t executor_start_loop(uform_executor_t *executor, char const **message);

static void executor_destroy(uform_executor_t *executor) {
    if (executor->threaded && atomic_load(&executor->started) == 1) {
        atomic_store_explicit(&executor->stopping, true, memory_order_release);
        loop_wake(executor->loop);
        pthread_join(executor->loop_thread, NULL);
    } else if (executor->loop) {
        loop_destroy(executor->loop);
    }
    team_stop(executor->team);
    executor_deallocate(executor, executor->scratch, executor->scratch_bytes);
#if UFORM_WITH_CUDA
    if (executor->vram) vram_close(executor);
#endif
#if UFORM_WITH_HWLOC
    if (executor->cpuset) hwloc_bitmap_free(executor->cpuset);
    if (executor->nodeset) hwloc_bitmap_free(executor->nodeset);
    if (executor->topology) hwloc_topology_destroy(executor->topology);
#endif
    free(executor);
}

void executor_retain(uform_executor_t *executor) {
    atomic_fetch_add_explicit(&executor->references, 1, memory_order_relaxed);
}

void executor_release(uform_executor_t *executor) {
    if (atomic_fetch_sub_explicit(&executor->references, 1, memory_order_acq_rel) == 1)
        executor_destroy(executor);
}

static uform_executor_t *executor_new(uform_executor_kind_t kind) {
    uform_executor_t *executor = calloc(1, sizeof *executor);
    if (!executor) return NULL;
    executor->kind = kind;
    atomic_init(&executor->references, 1);
    atomic_init(&executor->holder, NULL);
    atomic_init(&executor->active, 0);
    atomic_init(&executor->mood, UFORM_SLEEPING);
    executor->spin_ns = DEFAULT_SPIN_NS;
    executor->threads = 1;
    return executor;
}

UFORM_EXPORT void uform_executor_free(uform_executor_t *executor) {
    if (!executor) return;
    executor_await_idle(executor);
    executor_release(executor);
}

UFORM_EXPORT uform_status_t uform_executor_drain(uform_executor_t *executor, uform_mood_t mood) {
    static char const entry[] = "uform_executor_drain";
    if (!executor) return failed(UFORM_INVALID_ARGUMENT, entry, "executor is NULL");
    if (mood != UFORM_SLEEPING && mood != UFORM_SPINNING)
        return failed(UFORM_INVALID_ARGUMENT, entry, "unknown mood");
    executor_await_idle(executor);
    atomic_store_explicit(&executor->mood, (uint32_t)mood, memory_order_relaxed);
    /* A loop thread asleep in the old mood picks the new one up on its next round. */
    if (executor->threaded) loop_wake(executor->loop);
    return UFORM_OK;
}

UFORM_EXPORT uform_status_t uform_executor_info(uform_executor_t const *executor,
                                                uform_executor_info_t *info) {
    static char const entry[] = "uform_executor_info";
    if (!executor || !info) return failed(UFORM_INVALID_ARGUMENT, entry, "executor or info is NULL");
    info->kind = executor->kind;
    info->threads = executor->team ? executor->team->count : executor->threads; /* lent or not */
    info->domains_count = executor->domains_count;
    info->uring = executor->loop ? loop_backend(executor->loop) == LOOP_BACKEND_URING
                                 : loop_default_backend() == LOOP_BACKEND_URING;
    return UFORM_OK;
}

/* ---- Inline and the calling thread ------------------------------------------------------------- */

UFORM_EXPORT uform_status_t uform_executor_create_inline(uform_executor_t **out) {
    static char const entry[] = "uform_executor_create_inline";
    if (!out) return failed(UFORM_INVALID_ARGUMENT, entry, "executor is NULL");
    *out = executor_new(UFORM_EXECUTOR_INLINE);
    return *out ? UFORM_OK : failed(UFORM_OUT_OF_MEMORY, entry, "cannot allocate the executor");
}

static pthread_key_t thread_executor_key;
static pthread_once_t thread_executor_once = PTHREAD_ONCE_INIT;
static _Thread_local uform_executor_t *thread_executor;

static void thread_executor_exit(void *executor) {
    uform_executor_free(executor);
}

static void thread_executor_key_create(void) {
    pthread_key_create(&thread_executor_key, thread_executor_exit);
}

uform_executor_t *call_executor(uform_executor_t *executor) {
    if (executor) return executor;
    if (thread_executor) return thread_executor;
    pthread_once(&thread_executor_once, thread_executor_key_create);
    thread_executor = executor_new(UFORM_EXECUTOR_INLINE);
    /* Freed when the thread exits; the main thread's lives as long as the process. */
    if (thread_executor) pthread_setspecific(thread_executor_key, thread_executor);
    return thread_executor;
}

/* ---- Pools --------------------------------------------------------------------------------------- */

UFORM_EXPORT uform_status_t uform_executor_create_pool(uform_pool_vtable_t const *vtable, void *pool,
                                                       uform_executor_t **out) {
    static char const entry[] = "uform_executor_create_pool";
    if (!out) return failed(UFORM_INVALID_ARGUMENT, entry, "executor is NULL");
    *out = NULL;
    if (!vtable || !vtable->count_threads || !vtable->for_threads)
        return failed(UFORM_INVALID_ARGUMENT, entry, "the pool vtable lacks a function");
    size_t threads = vtable->count_threads(pool);
    if (threads == 0) return failed(UFORM_INVALID_ARGUMENT, entry, "the pool has no threads");
    uform_executor_t *executor = executor_new(UFORM_EXECUTOR_POOL);
    if (!executor) return failed(UFORM_OUT_OF_MEMORY, entry, "cannot allocate the executor");
    executor->pool_vtable = *vtable;
    executor->pool = pool;
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

UFORM_EXPORT uform_status_t uform_executor_create_vram(uform_vram_options_t const *options,
                                                       uform_executor_t **out) {
    static char const entry[] = "uform_executor_create_vram";
    if (out) *out = NULL;
    if (!out) return failed(UFORM_INVALID_ARGUMENT, entry, "executor is NULL");
    if (options && options->devices_count && !options->devices)
        return failed(UFORM_INVALID_ARGUMENT, entry, "devices is NULL with a non-zero count");
#if UFORM_WITH_CUDA
    uform_executor_t *executor = executor_new(UFORM_EXECUTOR_VRAM);
    if (!executor) return failed(UFORM_OUT_OF_MEMORY, entry, "cannot allocate the executor");
    executor->threaded = true;
    char const *message = NULL;
    uform_status_t status = vram_open(executor, options, &message);
    if (status == UFORM_OK) status = executor_start_loop(executor, &message);
    if (status != UFORM_OK) {
        executor_destroy(executor);
        return failed(status, entry, message);
    }
    *out = executor;
    return UFORM_OK;
#else
    return failed(UFORM_UNSUPPORTED, entry, "built without CUDA");
#endif
}

/* ---- RAM ----------------------------------------------------------------------------------------- */

UFORM_EXPORT uform_ram_options_t uform_ram_options_default(void) {
    return (uform_ram_options_t){
        .domains = NULL, .domains_count = 0, .threads = 0, .spin_ns = 0, .pin = true};
}

UFORM_EXPORT void uform_ram_options_init(uform_ram_options_t *options) {
    if (options) *options = uform_ram_options_default();
}

static void *ram_loop_main(void *argument) {
    uform_executor_t *executor = argument;
    thread_pin(executor, 0);
    /* The ring is made here, on the only thread that will ever use it. */
    loop_options_t options = {.backend = LOOP_BACKEND_AUTO, .single_issuer = true, .entries = 0};
    int created = loop_create(&options, &executor->loop);
    atomic_store_explicit(&executor->started, created == 0 ? 1u : 2u, memory_order_release);
    futex_wake_all(&executor->started);
    if (created != 0) return NULL;
    while (!atomic_load_explicit(&executor->stopping, memory_order_acquire)) {
        bool spinning = atomic_load_explicit(&executor->mood, memory_order_relaxed) == UFORM_SPINNING;
        loop_run(executor->loop, true, spinning ? executor->spin_ns : 0);
    }
    loop_destroy(executor->loop);
    executor->loop = NULL;
    return NULL;
}

static uform_status_t executor_start_loop(uform_executor_t *executor, char const **message) {
    if (pthread_create(&executor->loop_thread, NULL, ram_loop_main, executor) != 0)
        return *message = "cannot start the loop thread", UFORM_OUT_OF_MEMORY;
    uint32_t started;
    while ((started = atomic_load_explicit(&executor->started, memory_order_acquire)) == 0)
        futex_wait(&executor->started, 0);
    if (started != 1) {
        pthread_join(executor->loop_thread, NULL);
        atomic_store_explicit(&executor->started, 0, memory_order_relaxed);
        return *message = "cannot create the executor's event loop", UFORM_IO;
    }
    return UFORM_OK;
}

/* Resolves the domains into where threads run and where memory binds, and the default thread count. */
static uform_status_t ram_topology(uform_executor_t *executor, uform_ram_options_t const *options,
                                   size_t *cores, char const **message) {
#if UFORM_WITH_HWLOC
    hwloc_topology_t topology;
    if (hwloc_topology_init(&topology) != 0)
        return *message = "cannot read the topology", UFORM_OUT_OF_MEMORY;
    executor->topology = topology;
    if (hwloc_topology_load(topology) != 0) return *message = "cannot read the topology", UFORM_OUT_OF_MEMORY;
    hwloc_bitmap_t cpuset = hwloc_bitmap_alloc();
    executor->cpuset = cpuset;
    if (!cpuset) return *message = "cannot allocate a cpuset", UFORM_OUT_OF_MEMORY;
    if (options->domains_count == 0) {
        hwloc_bitmap_copy(cpuset, hwloc_topology_get_topology_cpuset(topology));
        int nodes = hwloc_get_nbobjs_by_type(topology, HWLOC_OBJ_NUMANODE);
        executor->domains_count = nodes > 0 ? (size_t)nodes : 0;
    } else {
        hwloc_bitmap_t nodeset = hwloc_bitmap_alloc();
        executor->nodeset = nodeset;
        if (!nodeset) return *message = "cannot allocate a nodeset", UFORM_OUT_OF_MEMORY;
        for (size_t i = 0; i < options->domains_count; ++i) {
            hwloc_obj_t node =
                hwloc_get_obj_by_type(topology, HWLOC_OBJ_NUMANODE, (unsigned)options->domains[i]);
            if (!node || options->domains[i] > UINT32_MAX)
                return *message = "no such NUMA domain", UFORM_INVALID_ARGUMENT;
            hwloc_bitmap_or(cpuset, cpuset, node->cpuset);
            hwloc_bitmap_or(nodeset, nodeset, node->nodeset);
        }
        executor->domains_count = options->domains_count;
    }
    int count = hwloc_get_nbobjs_inside_cpuset_by_type(topology, cpuset, HWLOC_OBJ_CORE);
    if (count <= 0) count = hwloc_get_nbobjs_inside_cpuset_by_type(topology, cpuset, HWLOC_OBJ_PU);
    if (count <= 0) return *message = "the domains have no cores", UFORM_INVALID_ARGUMENT;
    *cores = (size_t)count;
    return UFORM_OK;
#else
    if (options->domains_count)
        return *message = "NUMA domains need hwloc, which this build lacks", UFORM_UNSUPPORTED;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    *cores = online > 0 ? (size_t)online : 1;
    executor->domains_count = 0;
    return UFORM_OK;
#endif
}

UFORM_EXPORT uform_status_t uform_executor_create_ram(uform_ram_options_t const *options,
                                                      uform_executor_t **out) {
    static char const entry[] = "uform_executor_create_ram";
    if (!out) return failed(UFORM_INVALID_ARGUMENT, entry, "executor is NULL");
    *out = NULL;
    uform_ram_options_t defaults = uform_ram_options_default();
    if (!options) options = &defaults;
    if (options->domains_count && !options->domains)
        return failed(UFORM_INVALID_ARGUMENT, entry, "domains is NULL with a non-zero count");
    if (options->threads > 4096) return failed(UFORM_INVALID_ARGUMENT, entry, "more than 4096 threads");

    uform_executor_t *executor = executor_new(UFORM_EXECUTOR_RAM);
    if (!executor) return failed(UFORM_OUT_OF_MEMORY, entry, "cannot allocate the executor");
    executor->pin = options->pin;
    executor->spin_ns = options->spin_ns ? options->spin_ns : DEFAULT_SPIN_NS;
    executor->threaded = true;
    char const *message = NULL;
    size_t cores = 1;
    uform_status_t status = ram_topology(executor, options, &cores, &message);
    if (status != UFORM_OK) goto fail;
    executor->threads = options->threads ? options->threads : (cores * 7 / 8 ? cores * 7 / 8 : 1);

    status = team_start(executor, executor->threads, &executor->team);
    if (status != UFORM_OK) {
        message = "cannot start the worker threads";
        goto fail;
    }
    if ((status = executor_start_loop(executor, &message)) != UFORM_OK) goto fail;
    *out = executor;
    return UFORM_OK;
fail:
    executor_destroy(executor);
    return failed(status, entry, message);
}

/* ---- Memory placement --------------------------------------------------------------------------- */

void *executor_allocate(uform_executor_t *executor, size_t bytes) {
    if (bytes == 0) bytes = 1;
#if UFORM_WITH_HWLOC
    if (executor && executor->topology && executor->nodeset)
        return hwloc_alloc_membind(executor->topology, bytes, executor->nodeset, HWLOC_MEMBIND_BIND,
                                   HWLOC_MEMBIND_BYNODESET);
#else
    (void)executor;
#endif
    if (bytes > SIZE_MAX - 63) return NULL;
    return aligned_alloc(64, round_up_64(bytes));
}

void executor_deallocate(uform_executor_t *executor, void *memory, size_t bytes) {
    if (!memory) return;
#if UFORM_WITH_HWLOC
    if (executor && executor->topology && executor->nodeset) {
        hwloc_free(executor->topology, memory, bytes ? bytes : 1);
        return;
    }
#else
    (void)executor;
#endif
    (void)bytes;
    free(memory);
}

void *executor_scratch(uform_executor_t *executor, size_t bytes) {
    if (executor->scratch_bytes >= bytes) return executor->scratch;
    /* Grow by half again, so that slowly growing batches settle after a few calls. */
    size_t grown = bytes + bytes / 2;
    void *scratch = executor_allocate(executor, grown);
    if (!scratch) return NULL;
    executor_deallocate(executor, executor->scratch, executor->scratch_bytes);
    executor->scratch = scratch;
    executor->scratch_bytes = grown;
    return scratch;
}

/* ---- The empty verb ------------------------------------------------------------------------------ */

static void nop_timer_done(loop_op_t *op) {
    uform_executor_t *executor = container_of(op, uform_executor_t, nop.timer);
    call_finish(&executor->nop.call, UFORM_OK, NULL);
}

static void nop_start(call_t *call) {
    uform_executor_t *executor = call->executor;
    if (executor->nop.delay_ns == 0) {
        call_finish(call, UFORM_OK, NULL);
        return;
    }
    executor->nop.timer.callback = nop_timer_done;
    loop_timer(executor->loop, &executor->nop.timer, executor->nop.delay_ns);
}

UFORM_EXPORT uform_status_t uform_executor_nop(uform_executor_nop_args_t const *args) {
    static char const entry[] = "uform_executor_nop";
    if (!args) return failed(UFORM_INVALID_ARGUMENT, entry, "args is NULL");
    uform_outcome_t own;
    uform_outcome_t *outcome = args->outcome;
    if (!outcome) uform_outcome_init(outcome = &own);
    uform_executor_t *executor = call_executor(args->executor);
    /* The state lives in the executor: call_begin writes it only once the executor is held. */
    if (!executor)
        return call_refuse(outcome, UFORM_OUT_OF_MEMORY, entry, "cannot make the calling thread's executor");
    uform_status_t status = call_begin(&executor->nop.call, executor, outcome_of(outcome), entry);
    if (status != UFORM_OK) return status;
    executor->nop.call.start = nop_start;
    executor->nop.delay_ns = args->delay_ns;
    call_submit(&executor->nop.call);
    return args->outcome ? UFORM_OK : call_wait(outcome_of(outcome));
}
