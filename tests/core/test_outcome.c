/* Outcomes, calls and executors: the three receivers, contention, waiting, notification of external
 * loops, draining, and freeing an executor with a call in flight; and the wait table of futex.h, which
 * the POSIX-only build waits on, checked directly in every build. */
#include <setjmp.h>
#include <stdio.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "call.h"
#include "fixtures.h"
#include "futex.h"

#if UFORM_LINUX
#include <sys/eventfd.h>
#endif
#if UFORM_WITH_URING
#include <liburing.h>
#endif
#if UFORM_WITH_FORK_UNION
#include <fork_union.h>
#endif

/* ---- Executors made every way ------------------------------------------------------------------ */

typedef struct test_pool {
    size_t threads;
    _Atomic size_t calls;
} test_pool_t;

static size_t test_pool_count(void *pool) {
    return ((test_pool_t *)pool)->threads;
}

/* A "pool" that runs every thread's share on the calling thread, in order: enough to check that the
 * executor fans out through the vtable and never starts threads. */
static void test_pool_for_threads(void *pool, void (*work)(void *, size_t), void *context) {
    test_pool_t *test = pool;
    atomic_fetch_add(&test->calls, 1);
    for (size_t thread = 0; thread < test->threads; ++thread)
        work(context, thread);
}

static uform_pool_vtable_t const test_pool_vtable = {test_pool_count, test_pool_for_threads};
static test_pool_t test_pool = {.threads = 3};

enum { KIND_INLINE, KIND_RAM, KIND_RAM_TWO, KIND_POOL, KIND_COUNT };

/* The receivers every test here runs on, in the order of the kinds above. */
static receiver_t const kinds[KIND_COUNT] = {RECEIVER_INLINE, RECEIVER_RAM, RECEIVER_RAM_TWO, RECEIVER_POOL};

static uform_executor_t *make_executor(int kind) {
    return receiver_make(kinds[kind], &test_pool_vtable, &test_pool);
}

/* A check of one executor, told its kind and the test's `context`. */
typedef void (*kind_check_t)(uform_executor_t *executor, int kind, void *context);

/* Runs `check` on a fresh executor of every kind, freeing each after. */
static void on_every_kind(kind_check_t check, void *context) {
    for (int kind = 0; kind < KIND_COUNT; ++kind) {
        uform_executor_t *executor = make_executor(kind);
        check(executor, kind, context);
        uform_executor_free(executor);
    }
}

/* The test of a check that needs no context: its state points to the check. */
static void test_every_kind(void **state) {
    kind_check_t const *check = *state;
    on_every_kind(*check, NULL);
}

/* A struct CMUnitTest named after `check_` (a kind_check_t) that runs it on every kind. */
#define EVERY_KIND_TEST(check_)                                                                              \
    {                                                                                                        \
        .name = #check_, .test_func = test_every_kind, .initial_state = &(kind_check_t) {                    \
            check_                                                                                           \
        }                                                                                                    \
    }

/* ---- Tests -------------------------------------------------------------------------------------- */

/* A deferred nop of `delay_ns` on `executor` into `outcome` (initialized), accepted. */
static void start_nop(uform_executor_t *executor, uint64_t delay_ns, uform_outcome_t *outcome) {
    uform_executor_nop_args_t args = {.executor = executor, .delay_ns = delay_ns, .outcome = outcome};
    assert_int_equal(uform_executor_nop(&args), UFORM_OK);
}

/* An executor of `kind` held by a deferred nop of `delay_ns` into `outcome`, which this initializes. */
static uform_executor_t *busy_executor(int kind, uint64_t delay_ns, uform_outcome_t *outcome) {
    uform_executor_t *executor = make_executor(kind);
    uform_outcome_init(outcome);
    start_nop(executor, delay_ns, outcome);
    return executor;
}

/* A call made on a thread of its own (a contender's on `executor`, a waiter's on `outcome`), and the
 * status it answered. */
typedef struct side_call {
    uform_executor_t *executor;
    uform_outcome_t *outcome;
    uform_status_t status;
} side_call_t;

/* Blocking, then deferred on the same outcome many times. */
static void nop_blocking_and_deferred(uform_executor_t *executor, int kind, void *context) {
    (void)kind, (void)context;
    uform_executor_nop_args_t args = {.executor = executor};
    assert_int_equal(uform_executor_nop(&args), UFORM_OK);
    uform_outcome_t outcome;
    uform_outcome_init(&outcome);
    args.outcome = &outcome;
    for (int round = 0; round < 100; ++round) {
        args.delay_ns = round % 10 == 0 ? 100000 : 0;
        assert_int_equal(uform_executor_nop(&args), UFORM_OK);
        assert_int_equal(uform_outcome_wait(&outcome), UFORM_OK);
        assert_int_equal(uform_outcome_status(&outcome), UFORM_OK);
    }
    uform_outcome_destroy(&outcome);
}

static void nop_on_every_receiver(void **state) {
    (void)state;
    /* The calling thread. */
    uform_executor_nop_args_t args = {.executor = NULL};
    assert_int_equal(uform_executor_nop(&args), UFORM_OK);
    args.delay_ns = 1000000;
    assert_int_equal(uform_executor_nop(&args), UFORM_OK);
    on_every_kind(nop_blocking_and_deferred, NULL);
}

static void timer_delay_is_respected(uform_executor_t *executor, int kind, void *context) {
    (void)kind, (void)context;
    uint64_t start = loop_now_ns();
    uform_executor_nop_args_t args = {.executor = executor, .delay_ns = 20000000};
    assert_int_equal(uform_executor_nop(&args), UFORM_OK);
    assert_true(loop_now_ns() - start >= 20000000);
}

static void pending_then_final_and_wait_three_times(void **state) {
    (void)state;
    uform_outcome_t outcome;
    uform_executor_t *executor = busy_executor(KIND_RAM, 50000000, &outcome);
    /* The timer holds the call for 50 ms: the word is pending now. */
    assert_int_equal(uform_outcome_status(&outcome), UFORM_PENDING);
    assert_int_equal(uform_outcome_error(&outcome).status, UFORM_PENDING);
    for (int i = 0; i < 3; ++i)
        assert_int_equal(uform_outcome_wait(&outcome), UFORM_OK);
    assert_int_equal(uform_outcome_status(&outcome), UFORM_OK);
    assert_int_equal(uform_outcome_error(&outcome).status, UFORM_OK);
    uform_outcome_destroy(&outcome);
    uform_executor_free(executor);
}

static void *waiter_main(void *argument) {
    side_call_t *waiter = argument;
    waiter->status = uform_outcome_wait(waiter->outcome);
    return NULL;
}

static void many_threads_wait_one_outcome(void **state) {
    (void)state;
    uform_outcome_t outcome;
    uform_executor_t *executor = busy_executor(KIND_RAM, 30000000, &outcome);
    pthread_t threads[4];
    side_call_t waiters[4];
    for (int i = 0; i < 4; ++i) {
        waiters[i] = (side_call_t){.outcome = &outcome, .status = UFORM_PENDING};
        assert_int_equal(pthread_create(&threads[i], NULL, waiter_main, &waiters[i]), 0);
    }
    for (int i = 0; i < 4; ++i) {
        pthread_join(threads[i], NULL);
        assert_int_equal(waiters[i].status, UFORM_OK);
    }
    uform_outcome_destroy(&outcome);
    uform_executor_free(executor);
}

static void second_call_is_contended(void **state) {
    (void)state;
    uform_outcome_t first, second;
    uform_executor_t *executor = busy_executor(KIND_RAM, 100000000, &first);
    uform_outcome_init(&second);
    /* Deferred: finishes at once with CONTENDED, in the return value and in the outcome. */
    uform_executor_nop_args_t args = {.executor = executor, .outcome = &second};
    assert_int_equal(uform_executor_nop(&args), UFORM_CONTENDED);
    assert_int_equal(uform_outcome_status(&second), UFORM_CONTENDED);
    assert_string_equal(uform_outcome_error(&second).entry, "uform_executor_nop");
    /* Blocking: the same. */
    args.outcome = NULL;
    assert_int_equal(uform_executor_nop(&args), UFORM_CONTENDED);
    assert_int_equal(uform_last_error().status, UFORM_CONTENDED);
    /* Reusing a pending outcome is refused without touching it. */
    args.outcome = &first;
    assert_int_equal(uform_executor_nop(&args), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_outcome_wait(&first), UFORM_OK);
    /* Once final, the executor takes calls again. */
    args.outcome = &second;
    assert_int_equal(uform_executor_nop(&args), UFORM_OK);
    assert_int_equal(uform_outcome_wait(&second), UFORM_OK);
    uform_executor_free(executor);
}

/* Two threads on an inline executor: the first holds it inside a call (its timer), the second finds
 * it held. The holder is observed through the executor's word, so the order is not left to timing. */
static void *contender_main(void *argument) {
    side_call_t *contender = argument;
    uform_executor_nop_args_t args = {.executor = contender->executor, .delay_ns = 200000000};
    contender->status = uform_executor_nop(&args);
    return NULL;
}

static void two_threads_on_one_executor(uform_executor_t *executor, int kind, void *context) {
    (void)kind, (void)context;
    side_call_t holder = {.executor = executor, .status = UFORM_PENDING};
    pthread_t thread;
    assert_int_equal(pthread_create(&thread, NULL, contender_main, &holder), 0);
    while (!atomic_load(&executor->holder))
        sched_yield();
    uform_executor_nop_args_t args = {.executor = executor};
    assert_int_equal(uform_executor_nop(&args), UFORM_CONTENDED);
    pthread_join(thread, NULL);
    assert_int_equal(holder.status, UFORM_OK);
    assert_int_equal(uform_executor_nop(&args), UFORM_OK);
}

static void free_waits_for_call_in_flight(void **state) {
    (void)state;
    uform_outcome_t outcome;
    uform_executor_t *executor = busy_executor(KIND_RAM_TWO, 50000000, &outcome);
    assert_int_equal(uform_outcome_status(&outcome), UFORM_PENDING);
    uform_executor_free(executor);
    /* Freeing waited: the call is final without asking the outcome to wait. */
    assert_int_equal(uform_outcome_status(&outcome), UFORM_OK);
    uform_outcome_destroy(&outcome);
}

static void drain_moods(void **state) {
    (void)state;
    uform_ram_options_t options = uform_ram_options_default();
    options.threads = 2;
    options.spin_ns = 5000000;
    uform_executor_t *executor = NULL;
    assert_int_equal(uform_executor_create_ram(&options, &executor), UFORM_OK);
    uform_outcome_t outcome;
    uform_outcome_init(&outcome);
    start_nop(executor, 20000000, &outcome);
    /* Drain waits for the call, then the mood holds for the next calls. */
    assert_int_equal(uform_executor_drain(executor, UFORM_SPINNING), UFORM_OK);
    assert_int_equal(uform_outcome_status(&outcome), UFORM_OK);
    uform_executor_nop_args_t args = {.executor = executor};
    for (int i = 0; i < 1000; ++i)
        assert_int_equal(uform_executor_nop(&args), UFORM_OK);
    assert_int_equal(uform_executor_drain(executor, UFORM_SLEEPING), UFORM_OK);
    for (int i = 0; i < 100; ++i)
        assert_int_equal(uform_executor_nop(&args), UFORM_OK);
    assert_int_equal(uform_executor_drain(executor, (uform_mood_t)7), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_executor_drain(NULL, UFORM_SLEEPING), UFORM_INVALID_ARGUMENT);
    uform_executor_free(executor);
}

/* CPU seconds the process spends while the calling thread sleeps for `seconds`. */
static double idle_cpu_seconds(double seconds) {
    struct timespec before, after, pause = {0, (long)(seconds * 1e9)};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &before);
    while (nanosleep(&pause, &pause) != 0)
        continue;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &after);
    return (double)(after.tv_sec - before.tv_sec) + (double)(after.tv_nsec - before.tv_nsec) * 1e-9;
}

/* A drain into UFORM_SPINNING keeps the idle threads polling until the next call, not only for spin_ns
 * (1 ms here): over 0.3 s they use CPU; after the next call, and after a drain into UFORM_SLEEPING,
 * they sleep. The bounds are far apart: two polling threads use up to 0.6 s, sleeping ones about 0. */
static void drain_spinning_outlasts_spin_ns(void **state) {
    (void)state;
    uform_ram_options_t options = uform_ram_options_default();
    options.threads = 2;
    options.spin_ns = 1000000;
    options.pin = false;
    uform_executor_t *executor = NULL;
    assert_int_equal(uform_executor_create_ram(&options, &executor), UFORM_OK);
    uform_executor_nop_args_t args = {.executor = executor};
    assert_int_equal(uform_executor_drain(executor, UFORM_SPINNING), UFORM_OK);
    double spinning = idle_cpu_seconds(0.3);
    assert_int_equal(uform_executor_nop(&args), UFORM_OK);
    double after_call = idle_cpu_seconds(0.3);
    assert_int_equal(uform_executor_drain(executor, UFORM_SPINNING), UFORM_OK);
    assert_int_equal(uform_executor_drain(executor, UFORM_SLEEPING), UFORM_OK);
    double sleeping = idle_cpu_seconds(0.3);
    uform_executor_free(executor);
    assert_true(spinning > 0.03);
    assert_true(after_call < 0.02);
    assert_true(sleeping < 0.02);
}

/* Each final call notifies `fd` once (its 8 bytes read from `read_fd`: an eventfd's counter, or a pipe's
 * contents), and so does a refusal at submission. */
static void notification_check(uform_executor_t *executor, int kind, int fd, int read_fd) {
    uform_outcome_t outcome;
    uform_outcome_init(&outcome);
    assert_int_equal(uform_outcome_notify_eventfd(&outcome, fd), UFORM_OK);
    for (int round = 0; round < 3; ++round) {
        start_nop(executor, 5000000, &outcome);
        /* Read the counter as an epoll server would, without waiting on the outcome itself. */
        struct pollfd poller = {.fd = read_fd, .events = POLLIN};
        assert_int_equal(poll(&poller, 1, 10000), 1);
        uint64_t count = 0;
        assert_int_equal(read(read_fd, &count, sizeof count), (ssize_t)sizeof count);
        assert_int_equal(count, 1);
        /* The word was final before the notification. */
        assert_int_equal(uform_outcome_status(&outcome), UFORM_OK);
    }
    /* Failures at submission notify too: CONTENDED while another call holds a RAM executor. */
    if (kind == KIND_RAM || kind == KIND_RAM_TWO) {
        uform_outcome_t holder;
        uform_outcome_init(&holder);
        start_nop(executor, 50000000, &holder);
        uform_executor_nop_args_t args = {.executor = executor, .outcome = &outcome};
        assert_int_equal(uform_executor_nop(&args), UFORM_CONTENDED);
        uint64_t count = 0;
        assert_int_equal(read(read_fd, &count, sizeof count), (ssize_t)sizeof count);
        assert_int_equal(count, 1);
        assert_int_equal(uform_outcome_wait(&holder), UFORM_OK);
    }
    /* Nothing more was written than one notification per final call. */
    struct pollfd poller = {.fd = read_fd, .events = POLLIN};
    assert_int_equal(poll(&poller, 1, 0), 0);
    uform_outcome_destroy(&outcome);
}

#if UFORM_LINUX
/* Linux's notification descriptor: an eventfd, one descriptor for both sides. */
static void eventfd_notification(uform_executor_t *executor, int kind, void *context) {
    (void)context;
    int fd = eventfd(0, EFD_CLOEXEC);
    assert_true(fd >= 0);
    notification_check(executor, kind, fd, fd);
    assert_int_equal(close(fd), 0);
}
#endif

/* Every platform's: the write end of a non-blocking pipe, the loop watching its read end. */
static void pipe_notification(uform_executor_t *executor, int kind, void *context) {
    (void)context;
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    int flags = fcntl(fds[1], F_GETFL);
    assert_true(flags >= 0);
    assert_int_equal(fcntl(fds[1], F_SETFL, flags | O_NONBLOCK), 0);
    notification_check(executor, kind, fds[1], fds[0]);
    assert_int_equal(close(fds[0]), 0);
    assert_int_equal(close(fds[1]), 0);
}

#if UFORM_WITH_URING
/* Completions posted into `context`, a ring: the call's, then (RAM executors) a refusal's. */
static void ring_on(uform_executor_t *executor, int kind, void *context) {
    struct io_uring *ring = context;
    uform_outcome_t outcome;
    uform_outcome_init(&outcome);
    uint64_t const user_data = 0xfeedface00000000ull | (uint64_t)kind;
    assert_int_equal(uform_outcome_notify_ring(&outcome, ring->ring_fd, user_data), UFORM_OK);
    uform_executor_nop_args_t args = {.executor = executor, .delay_ns = 5000000, .outcome = &outcome};
    assert_int_equal(uform_executor_nop(&args), UFORM_OK);
    struct io_uring_cqe *cqe = NULL;
    assert_int_equal(io_uring_wait_cqe(ring, &cqe), 0);
    assert_int_equal(cqe->user_data, user_data);
    assert_int_equal(cqe->res, UFORM_OK);
    io_uring_cqe_seen(ring, cqe);
    assert_int_equal(uform_outcome_status(&outcome), UFORM_OK);

    /* A failure carries its status: CONTENDED at submission, from the submitting thread. */
    uform_outcome_t holder;
    uform_outcome_init(&holder);
    uform_executor_nop_args_t hold = {.executor = executor, .delay_ns = 50000000, .outcome = &holder};
    if (kind == KIND_RAM || kind == KIND_RAM_TWO) {
        assert_int_equal(uform_executor_nop(&hold), UFORM_OK);
        args.delay_ns = 0;
        assert_int_equal(uform_executor_nop(&args), UFORM_CONTENDED);
        assert_int_equal(io_uring_wait_cqe(ring, &cqe), 0);
        assert_int_equal(cqe->user_data, user_data);
        assert_int_equal(cqe->res, UFORM_CONTENDED);
        io_uring_cqe_seen(ring, cqe);
        assert_int_equal(uform_outcome_wait(&holder), UFORM_OK);
    }
    uform_outcome_destroy(&outcome);
}
#endif

static void ring_notification(void **state) {
    (void)state;
#if UFORM_WITH_URING
    if (!loop_uring_available()) {
        uform_outcome_t outcome;
        uform_outcome_init(&outcome);
        assert_int_equal(uform_outcome_notify_ring(&outcome, 3, 1), UFORM_UNSUPPORTED);
        skip();
    }
    struct io_uring ring;
    assert_int_equal(io_uring_queue_init(8, &ring, 0), 0);
    on_every_kind(ring_on, &ring);
    io_uring_queue_exit(&ring);
#else
    uform_outcome_t outcome;
    uform_outcome_init(&outcome);
    assert_int_equal(uform_outcome_notify_ring(&outcome, 3, 1), UFORM_UNSUPPORTED);
    skip();
#endif
}

/* ---- Fork-join through every executor ---------------------------------------------------------- */

/* A call that forks `rounds` times over its executor's threads, counting each thread's visits. */
typedef struct fork_call {
    call_t call;
    size_t rounds;
    _Atomic size_t visits[8]; /* of threads 0 to 7 */
} fork_call_t;

static void visit(void *context, size_t thread) {
    fork_call_t *fork = context;
    if (thread < 8) atomic_fetch_add(&fork->visits[thread], 1);
}

static void fork_start(call_t *call) {
    fork_call_t *fork = container_of(call, fork_call_t, call);
    for (size_t i = 0; i < fork->rounds; ++i)
        executor_for_threads(call->executor, visit, fork);
    call_finish(call, UFORM_OK, NULL);
}

/* Runs `fork` (its rounds set) on `executor` as a deferred call, until final: OK. */
static void fork_run(fork_call_t *fork, uform_executor_t *executor) {
    uform_outcome_t outcome;
    uform_outcome_init(&outcome);
    assert_int_equal(call_begin(&fork->call, executor, outcome_of(&outcome), "test"), UFORM_OK);
    fork->call.start = fork_start;
    call_submit(&fork->call);
    assert_int_equal(uform_outcome_wait(&outcome), UFORM_OK);
}

static void for_threads_reaches_every_thread(uform_executor_t *executor, int kind, void *context) {
    (void)kind, (void)context;
    uform_executor_info_t info;
    assert_int_equal(uform_executor_info(executor, &info), UFORM_OK);
    fork_call_t fork = {.rounds = 1000};
    fork_run(&fork, executor);
    for (size_t thread = 0; thread < 8; ++thread)
        assert_int_equal(atomic_load(&fork.visits[thread]), thread < info.threads ? 1000 : 0);
}

static void executor_info_and_options(void **state) {
    (void)state;
    uform_executor_t *executor = make_executor(KIND_RAM_TWO);
    uform_executor_info_t info;
    assert_int_equal(uform_executor_info(executor, &info), UFORM_OK);
    assert_int_equal(info.kind, UFORM_EXECUTOR_RAM);
    assert_int_equal(info.threads, 2);
    assert_int_equal(info.uring, loop_default_backend() == LOOP_BACKEND_URING);
    uform_executor_free(executor);

    /* Zero threads takes 7/8 of the cores, at least one. */
    assert_int_equal(uform_executor_create_ram(NULL, &executor), UFORM_OK);
    assert_int_equal(uform_executor_info(executor, &info), UFORM_OK);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    assert_true(info.threads >= 1 && info.threads <= (size_t)(cores > 0 ? cores : 1));
    uform_executor_free(executor);

#if UFORM_WITH_HWLOC
    size_t domain = 0;
    uform_ram_options_t options = uform_ram_options_default();
    options.domains = &domain;
    options.domains_count = 1;
    assert_int_equal(uform_executor_create_ram(&options, &executor), UFORM_OK);
    assert_int_equal(uform_executor_info(executor, &info), UFORM_OK);
    assert_int_equal(info.domains_count, 1);
    uform_executor_nop_args_t args = {.executor = executor};
    assert_int_equal(uform_executor_nop(&args), UFORM_OK);
    uform_executor_free(executor);
    domain = 4096;
    assert_int_equal(uform_executor_create_ram(&options, &executor), UFORM_INVALID_ARGUMENT);
    assert_null(executor);
#endif
    assert_int_equal(uform_executor_info(NULL, &info), UFORM_INVALID_ARGUMENT);
}

static void *calling_thread_main(void *argument) {
    (void)argument;
    uform_executor_nop_args_t args = {.executor = NULL, .delay_ns = 1000};
    for (int i = 0; i < 10; ++i)
        if (uform_executor_nop(&args) != UFORM_OK) return (void *)1;
    return NULL;
}

static void thread_exit_frees_its_executor(void **state) {
    (void)state;
    /* Each thread's own inline executor is released when the thread exits (LeakSanitizer checks). */
    for (int i = 0; i < 8; ++i) {
        pthread_t thread;
        void *result = (void *)1;
        assert_int_equal(pthread_create(&thread, NULL, calling_thread_main, NULL), 0);
        pthread_join(thread, &result);
        assert_null(result);
    }
}

/* executor_destroy's window between storing `stopping` and ringing the doorbell, held open: the loop
 * thread is woken another way (as by a completion) and given up to a second to leave its loop. The
 * loop must still be there when the destroying thread rings it. */
static _Atomic size_t stop_observed;
static _Atomic bool stop_saw_loop_freed;

static void stop_wake_and_linger(uform_executor_t *executor) {
    loop_t *loop = executor->loop;
    loop_wake(loop);
    /* The hang guard: with the loop kept alive, the loop thread waits for the doorbell's end. */
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    bool freed = false;
    do {
        freed = __atomic_load_n(&executor->loop, __ATOMIC_ACQUIRE) == NULL;
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while (!freed &&
             (now.tv_sec - start.tv_sec) * 1000000000L + (now.tv_nsec - start.tv_nsec) < 1000000000L);
    atomic_store(&stop_saw_loop_freed, freed);
    atomic_fetch_add(&stop_observed, 1);
}

static void executor_destroy_rings_freed_loop(void **state) {
    (void)state;
    uform_executor_t *executor = receiver_make(RECEIVER_RAM_TWO, NULL, NULL);
    assert_non_null(executor);
    executor_stop_observer = stop_wake_and_linger;
    uform_executor_free(executor);
    executor_stop_observer = NULL;
    assert_int_equal(atomic_load(&stop_observed), 1);
    assert_false(atomic_load(&stop_saw_loop_freed));
}

/* The topology is loaded once per process: every RAM executor, made while others live or after they
 * are gone, reads the same one. */
static void ram_executors_share_one_topology(void **state) {
    (void)state;
#if UFORM_WITH_HWLOC
    uform_executor_t *first = receiver_make(RECEIVER_RAM_TWO, NULL, NULL);
    uform_executor_t *second = receiver_make(RECEIVER_RAM, NULL, NULL);
    void const *topology = executor_topology(first);
    assert_non_null(topology);
    assert_ptr_equal(executor_topology(second), topology);
    uform_executor_free(first);
    uform_executor_free(second);
    uform_executor_t *third = receiver_make(RECEIVER_RAM_TWO, NULL, NULL);
    assert_ptr_equal(executor_topology(third), topology);
    uform_executor_free(third);
#else
    uform_executor_t *executor = receiver_make(RECEIVER_RAM_TWO, NULL, NULL);
    assert_null(executor_topology(executor));
    uform_executor_free(executor);
    skip();
#endif
}

static void fork_union_pool(void **state) {
    (void)state;
#if UFORM_WITH_FORK_UNION
    fu_pool_t *pool = fu_pool_new("uform-test");
    assert_non_null(pool);
    assert_true(fu_pool_spawn(pool, 2, fu_caller_inclusive_k));
    uform_executor_t *executor = NULL;
    assert_int_equal(uform_executor_create_fork_union(pool, &executor), UFORM_OK);
    uform_executor_info_t info;
    assert_int_equal(uform_executor_info(executor, &info), UFORM_OK);
    assert_int_equal(info.kind, UFORM_EXECUTOR_POOL);
    assert_int_equal(info.threads, 2);
    fork_call_t fork = {.rounds = 100};
    fork_run(&fork, executor);
    assert_int_equal(atomic_load(&fork.visits[0]), 100);
    assert_int_equal(atomic_load(&fork.visits[1]), 100);
    uform_executor_free(executor);
    fu_pool_delete(pool);
#else
    int pool = 0;
    uform_executor_t *executor = NULL;
    assert_int_equal(uform_executor_create_fork_union(&pool, &executor), UFORM_UNSUPPORTED);
    skip();
#endif
}

/* ---- The wait table (futex.h) ------------------------------------------------------------------- */

/* A word that no longer holds the expected value is never slept on, and a wake with no waiter is no
 * fault. */
static void wait_table_returns_when_the_word_changed(void **state) {
    (void)state;
    _Atomic uint32_t word = 5;
    futex_table_wake_all(&word);
    futex_table_wait(&word, 4);
    futex_table_wait(&word, UINT32_MAX);
    assert_int_equal(atomic_load(&word), 5);
}

/* The outcome's protocol, over the table alone: a waiter flags the word before it sleeps, and the
 * thread that changes the word wakes only when it finds the flag (as outcome_finalize does). */
#define TABLE_WAITERS 0x80000000u
#define TABLE_ROUNDS  20000u

typedef struct table_player {
    _Atomic uint32_t *word; /* whose turn it is, | TABLE_WAITERS; shared by both players */
    uint32_t parity;        /* this player's turns: parity, parity + 2, ... */
    bool spins;             /* polls the word instead of sleeping on it */
    uint32_t sleeps;
} table_player_t;

static void table_await_turn(table_player_t *player, uint32_t turn) {
    for (;;) {
        uint32_t value = atomic_load(player->word);
        if ((value & ~TABLE_WAITERS) == turn) return;
        if (player->spins) continue;
        if (!(value & TABLE_WAITERS)) {
            if (!atomic_compare_exchange_weak(player->word, &value, value | TABLE_WAITERS)) continue;
            value |= TABLE_WAITERS;
        }
        player->sleeps++;
        futex_table_wait(player->word, value);
    }
}

static void *table_player_main(void *argument) {
    table_player_t *player = argument;
    for (uint32_t turn = player->parity; turn < 2 * TABLE_ROUNDS; turn += 2) {
        table_await_turn(player, turn);
        if (atomic_exchange(player->word, turn + 1) & TABLE_WAITERS) futex_table_wake_all(player->word);
    }
    return NULL;
}

/* Two threads hand a word back and forth, each sleeping until it is its turn, then one sleeping and
 * one polling (which answers within the sleeper's way from its look at the word to its sleep): a
 * wake-up lost in that gap (the case the loop's doorbell fence closes on AArch64) leaves the sleeper
 * asleep for good, and the suite's timeout fails the test. The sleepers slept, so the table is what
 * woke them. */
static void table_ping_pong(bool second_spins) {
    _Atomic uint32_t word = 0;
    table_player_t players[2] = {{.word = &word, .parity = 0},
                                 {.word = &word, .parity = 1, .spins = second_spins}};
    pthread_t threads[2];
    for (int i = 0; i < 2; ++i)
        assert_int_equal(pthread_create(&threads[i], NULL, table_player_main, &players[i]), 0);
    for (int i = 0; i < 2; ++i)
        assert_int_equal(pthread_join(threads[i], NULL), 0);
    assert_int_equal(atomic_load(&word) & ~TABLE_WAITERS, 2 * TABLE_ROUNDS);
    assert_true(players[0].sleeps > 0);
}

static void wait_table_ping_pong_loses_no_wake_up(void **state) {
    (void)state;
    table_ping_pong(false);
    table_ping_pong(true);
}

/* Eight words side by side (some share a pair of the table) and a sleeper on each: changing one word
 * and waking it releases its sleeper alone; the others, woken or not, find their words unchanged. */
#define TABLE_SLEEPERS 8

typedef struct table_sleeper {
    _Atomic uint32_t *word;
    _Atomic uint32_t *returned;
} table_sleeper_t;

static void *table_sleeper_main(void *argument) {
    table_sleeper_t *sleeper = argument;
    while (atomic_load(sleeper->word) == 0)
        futex_table_wait(sleeper->word, 0);
    atomic_fetch_add(sleeper->returned, 1);
    return NULL;
}

static void wait_table_wakes_every_waiter(void **state) {
    (void)state;
    _Atomic uint32_t words[TABLE_SLEEPERS];
    _Atomic uint32_t returned = 0;
    table_sleeper_t sleepers[TABLE_SLEEPERS];
    pthread_t threads[TABLE_SLEEPERS];
    for (int i = 0; i < TABLE_SLEEPERS; ++i) {
        atomic_init(&words[i], 0);
        sleepers[i] = (table_sleeper_t){.word = &words[i], .returned = &returned};
        assert_int_equal(pthread_create(&threads[i], NULL, table_sleeper_main, &sleepers[i]), 0);
    }
    for (int i = 0; i < TABLE_SLEEPERS; ++i) {
        atomic_store(&words[i], 1);
        futex_table_wake_all(&words[i]);
        assert_int_equal(pthread_join(threads[i], NULL), 0);
        assert_int_equal(atomic_load(&returned), (uint32_t)i + 1);
    }
}

int main(void) {
    struct CMUnitTest const tests[] = {
        cmocka_unit_test(nop_on_every_receiver),
        EVERY_KIND_TEST(timer_delay_is_respected),
        cmocka_unit_test(pending_then_final_and_wait_three_times),
        cmocka_unit_test(many_threads_wait_one_outcome),
        cmocka_unit_test(second_call_is_contended),
        EVERY_KIND_TEST(two_threads_on_one_executor),
        cmocka_unit_test(free_waits_for_call_in_flight),
        cmocka_unit_test(drain_moods),
        cmocka_unit_test(drain_spinning_outlasts_spin_ns),
#if UFORM_LINUX
        EVERY_KIND_TEST(eventfd_notification),
#endif
        EVERY_KIND_TEST(pipe_notification),
        cmocka_unit_test(wait_table_returns_when_the_word_changed),
        cmocka_unit_test(wait_table_ping_pong_loses_no_wake_up),
        cmocka_unit_test(wait_table_wakes_every_waiter),
        cmocka_unit_test(ring_notification),
        EVERY_KIND_TEST(for_threads_reaches_every_thread),
        cmocka_unit_test(executor_info_and_options),
        cmocka_unit_test(thread_exit_frees_its_executor),
        cmocka_unit_test(fork_union_pool),
        cmocka_unit_test(executor_destroy_rings_freed_loop),
        cmocka_unit_test(ram_executors_share_one_topology),
    };
    printf("loop backend: %s\n", loop_default_backend() == LOOP_BACKEND_URING ? "io_uring" : "portable");
    return cmocka_run_group_tests(tests, NULL, NULL);
}
