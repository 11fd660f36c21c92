/* RAM executors: a loop thread (thread 0) and a team of workers (threads 1..n-1) for fork-join compute,
 * pinned to cores of its NUMA domains through hwloc, with memory bound to those domains; the team can
 * lend its last worker to work that runs beside the forks (executor_lend). The hwloc topology is the
 * process's, loaded once by the first executor and read by all. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "executor.h"
#include "futex.h"

#if UFORM_WITH_HWLOC
#include <hwloc.h>
#endif

typedef struct team team_t;

/* A RAM executor's state. */
typedef struct ram {
    team_t *team;
    void *topology; /* hwloc_topology_t when built with hwloc: the process's (ram_shared_topology) */
    void *cpuset;   /* hwloc_bitmap_t: where the threads run */
    void *nodeset;  /* hwloc_bitmap_t: where memory is bound, or NULL for no binding */
    bool pin;
} ram_t;

static executor_ops_t const ram_ops;

/* The team of a RAM executor, or NULL (any other kind, or a RAM executor of one thread). */
static team_t *team_of(uform_executor_t const *executor) {
    return executor->ops == &ram_ops ? ((ram_t *)executor->state)->team : NULL;
}

void const *executor_topology(uform_executor_t const *executor) {
    return executor->ops == &ram_ops ? ((ram_t const *)executor->state)->topology : NULL;
}

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
    ram_t const *ram = executor->state;
    if (!ram->pin || !ram->topology) return;
    hwloc_topology_t topology = ram->topology;
    hwloc_const_cpuset_t cpuset = ram->cpuset;
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

/* Polls *word while it equals `seen`: until the next call after uform_executor_drain(UFORM_SPINNING)
 * (executor_spin_held), else for `ns`, or, `in_call`, until no call holds the executor. Answers the last
 * value read, `seen` when the spin ran out. */
static uint32_t team_spin(uform_executor_t *executor, _Atomic uint32_t *word, uint32_t seen, uint64_t ns,
                          bool in_call) {
    uint64_t deadline = loop_now_ns() + ns;
    for (unsigned spins = 1;; ++spins) {
        cpu_relax();
        uint32_t value = atomic_load_explicit(word, memory_order_acquire);
        if (value != seen) return value;
        if ((spins & 255) != 0 || executor_spin_held(executor)) continue;
        if (loop_now_ns() > deadline) return value;
        if (in_call && !atomic_load_explicit(&executor->holder, memory_order_relaxed)) return value;
    }
}

/* Waits until *word differs from `seen`: polls (team_spin) for spin_ns in the spinning mood, and while a
 * call holds the executor for EXECUTOR_FORK_SPIN_NS in the sleeping one (or for that long at least), then
 * sleeps. A worker woken with nothing new (ram_wake_idle, after a drain into the spinning mood) polls
 * again. */
static uint32_t team_await(team_t *team, _Atomic uint32_t *word, uint32_t seen) {
    uform_executor_t *executor = team->executor;
    uint32_t value = atomic_load_explicit(word, memory_order_acquire);
    while (value == seen) {
        bool spinning = atomic_load_explicit(&executor->mood, memory_order_relaxed) == UFORM_SPINNING;
        bool in_call = atomic_load_explicit(&executor->holder, memory_order_relaxed) != NULL;
        uint64_t ns = spinning ? executor->spin_ns : 0;
        if (in_call && ns < EXECUTOR_FORK_SPIN_NS) ns = EXECUTOR_FORK_SPIN_NS;
        if (ns && (value = team_spin(executor, word, seen, ns, in_call && !spinning)) != seen) return value;
        atomic_fetch_add_explicit(&team->sleepers, 1, memory_order_seq_cst);
        value = atomic_load_explicit(word, memory_order_seq_cst);
        if (value == seen) futex_wait(word, seen);
        atomic_fetch_sub_explicit(&team->sleepers, 1, memory_order_relaxed);
        value = atomic_load_explicit(word, memory_order_acquire);
    }
    return value;
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
    team_t *team = team_of(executor);
    if (team && team->forking != team->count &&
        atomic_load_explicit(&team->lent, memory_order_acquire) == LENT_DONE)
        team_rejoin(executor, team);
    return executor->threads;
}

static void ram_for_threads(uform_executor_t *executor, void (*work)(void *context, size_t thread),
                            void *context) {
    team_t *team = team_of(executor);
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

bool executor_lends(uform_executor_t const *executor) {
    return team_of(executor) && executor->threads >= 2;
}

bool executor_lend(uform_executor_t *executor, void (*work)(void *context), void *context) {
    team_t *team = team_of(executor);
    if (!team || team->forking != team->count) return false;
    /* The last lend's worker, given back, may not have said so yet. */
    while (atomic_load_explicit(&team->lent, memory_order_acquire) != LENT_NONE)
        lent_await(team, LENT_BACK);
    team->lent_work = work;
    team->lent_context = context;
    atomic_store_explicit(&team->lent, LENT_RUNNING, memory_order_relaxed);
    ram_for_threads(executor, team_lend, NULL);
    team->forking = team->count - 1;
    executor->threads = team->count - 1;
    return true;
}

void executor_reclaim(uform_executor_t *executor) {
    team_t *team = team_of(executor);
    if (!team || team->forking == team->count) return;
    while (lent_await(team, LENT_RUNNING) != LENT_DONE)
        continue;
    team_rejoin(executor, team);
}

/* ---- RAM ----------------------------------------------------------------------------------------- */

UFORM_EXPORT uform_ram_options_t uform_ram_options_default(void) {
    return (uform_ram_options_t){
        .domains = NULL, .domains_count = 0, .threads = 0, .spin_ns = 0, .pin = true};
}

UFORM_EXPORT void uform_ram_options_init(uform_ram_options_t *options) {
    if (options) *options = uform_ram_options_default();
}

static void ram_loop_thread_start(uform_executor_t *executor) {
    thread_pin(executor, 0);
}

static size_t ram_threads_total(uform_executor_t const *executor) {
    team_t const *team = team_of(executor);
    return team ? team->count : executor->threads; /* lent or not */
}

static void *ram_allocate(uform_executor_t *executor, size_t bytes) {
#if UFORM_WITH_HWLOC
    ram_t const *ram = executor->state;
    if (ram->topology && ram->nodeset)
        return hwloc_alloc_membind(ram->topology, bytes, ram->nodeset, HWLOC_MEMBIND_BIND,
                                   HWLOC_MEMBIND_BYNODESET);
#else
    (void)executor;
#endif
    return executor_host_allocate(bytes);
}

static void ram_deallocate(uform_executor_t *executor, void *memory, size_t bytes) {
#if UFORM_WITH_HWLOC
    ram_t const *ram = executor->state;
    if (ram->topology && ram->nodeset) {
        hwloc_free(ram->topology, memory, bytes);
        return;
    }
#else
    (void)executor;
#endif
    (void)bytes;
    free(memory);
}

static void ram_destroy(uform_executor_t *executor) {
    ram_t *ram = executor->state;
    if (!ram) return;
    team_stop(ram->team);
#if UFORM_WITH_HWLOC
    if (ram->cpuset) hwloc_bitmap_free(ram->cpuset);
    if (ram->nodeset) hwloc_bitmap_free(ram->nodeset);
#endif
    free(ram);
}

/* Wakes the workers asleep on the team's generation, so that they read the mood again. */
static void ram_wake_idle(uform_executor_t *executor) {
    team_t *team = team_of(executor);
    if (team) futex_wake_all(&team->generation);
}

static executor_ops_t const ram_ops = {
    .kind = UFORM_EXECUTOR_RAM,
    .destroy = ram_destroy,
    .wake_idle = ram_wake_idle,
    .loop_thread_start = ram_loop_thread_start,
    .for_threads = ram_for_threads,
    .threads_total = ram_threads_total,
    .allocate = ram_allocate,
    .deallocate = ram_deallocate,
};

#if UFORM_WITH_HWLOC
/* The machine's topology, loaded by the first RAM executor and shared by every later one for the rest
 * of the process (hwloc's queries, binding and allocation only read it, from any thread). A failed
 * load keeps nothing, and the next executor tries again. */
static hwloc_topology_t shared_topology;
static pthread_mutex_t shared_topology_lock = PTHREAD_MUTEX_INITIALIZER;

/* hwloc's failure: OUT_OF_MEMORY where it says ENOMEM, else IO (the system's description unreadable). */
static uform_status_t topology_failure(int error, char const **message) {
    if (error == ENOMEM) return *message = "out of memory reading the topology", UFORM_OUT_OF_MEMORY;
    return *message = "cannot read the topology", UFORM_IO;
}

static uform_status_t ram_shared_topology(hwloc_topology_t *out, char const **message) {
    uform_status_t status = UFORM_OK;
    if (pthread_mutex_lock(&shared_topology_lock) != 0)
        return *message = "cannot lock the topology", UFORM_INTERNAL;
    if (!shared_topology) {
        hwloc_topology_t topology;
        errno = 0;
        if (hwloc_topology_init(&topology) != 0) {
            status = topology_failure(errno, message);
        } else {
            errno = 0;
            if (hwloc_topology_load(topology) == 0) {
                shared_topology = topology;
            } else {
                status = topology_failure(errno, message);
                hwloc_topology_destroy(topology);
            }
        }
    }
    *out = shared_topology;
    pthread_mutex_unlock(&shared_topology_lock);
    return status;
}
#endif

/* Resolves the domains into where threads run and where memory binds, and the default thread count. */
static uform_status_t ram_topology(uform_executor_t *executor, uform_ram_options_t const *options,
                                   size_t *cores, char const **message) {
    ram_t *ram = executor->state;
#if UFORM_WITH_HWLOC
    hwloc_topology_t topology;
    uform_status_t status = ram_shared_topology(&topology, message);
    if (status != UFORM_OK) return status;
    ram->topology = topology;
    hwloc_bitmap_t cpuset = hwloc_bitmap_alloc();
    ram->cpuset = cpuset;
    if (!cpuset) return *message = "cannot allocate a cpuset", UFORM_OUT_OF_MEMORY;
    if (options->domains_count == 0) {
        hwloc_bitmap_copy(cpuset, hwloc_topology_get_topology_cpuset(topology));
        int nodes = hwloc_get_nbobjs_by_type(topology, HWLOC_OBJ_NUMANODE);
        executor->domains_count = nodes > 0 ? (size_t)nodes : 0;
    } else {
        hwloc_bitmap_t nodeset = hwloc_bitmap_alloc();
        ram->nodeset = nodeset;
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
    (void)ram;
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

    uform_executor_t *executor = executor_new(&ram_ops);
    ram_t *ram = executor ? calloc(1, sizeof *ram) : NULL;
    if (!ram) {
        free(executor);
        return failed(UFORM_OUT_OF_MEMORY, entry, "cannot allocate the executor");
    }
    executor->state = ram;
    ram->pin = options->pin;
    executor->spin_ns = options->spin_ns ? options->spin_ns : EXECUTOR_SPIN_NS;
    char const *message = NULL;
    size_t cores = 1;
    uform_status_t status = ram_topology(executor, options, &cores, &message);
    if (status != UFORM_OK) goto fail;
    executor->threads = options->threads ? options->threads : (cores * 7 / 8 ? cores * 7 / 8 : 1);

    status = team_start(executor, executor->threads, &ram->team);
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
