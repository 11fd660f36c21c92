/* The loop's costs, side by side with what they compete with:
 *   - a plain (indirect) function call;
 *   - the machine's own futex ping-pong between two threads on different CPUs (the floor for any
 *     hand-off that sleeps), beside the same ping-pong on the wait table of futex.h (what the
 *     POSIX-only build and systems without a futex sleep on);
 *   - the round trip of a doorbell rung back and forth between two threads that sleep in poll(2):
 *     the eventfd doorbell (Linux) beside the pipe one (every platform);
 *   - the round trip of an empty deferred call (submit, then wait) on the inline executor, on a RAM
 *     executor whose loop thread spins, and on one whose loop thread sleeps;
 *   - completions per second posted into one loop by two worker threads.
 * Medians of several rounds, in nanoseconds. It prints figures; it never fails on time.
 * Usage: bench_loop [seconds per figure, default 1] */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if UFORM_LINUX
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

#include "bench_common.h"
#include "common.h"
#include "doorbell.h"
#include "futex.h"
#include "loop.h"

#define ROUNDS 7

static double seconds_per_figure = 1.0;

static double median(double *values, size_t count) {
    qsort(values, count, sizeof *values, bench_compare_doubles);
    return values[count / 2];
}

/* Runs `round(context, iterations)` ROUNDS times, sized to take about seconds_per_figure in all, and
 * answers the median nanoseconds per iteration. */
static double measure(void (*round)(void *context, size_t iterations), void *context) {
    size_t iterations = 16;
    for (;;) { /* calibrate */
        uint64_t start = loop_now_ns();
        round(context, iterations);
        uint64_t elapsed = loop_now_ns() - start;
        if (elapsed > 20000000 || iterations > (1u << 30)) {
            double per = (double)elapsed / (double)iterations;
            double wanted = seconds_per_figure * 1e9 / ROUNDS / per;
            iterations = wanted < 16 ? 16 : (size_t)wanted;
            break;
        }
        iterations *= 4;
    }
    double results[ROUNDS];
    for (int i = 0; i < ROUNDS; ++i) {
        uint64_t start = loop_now_ns();
        round(context, iterations);
        results[i] = (double)(loop_now_ns() - start) / (double)iterations;
    }
    return median(results, ROUNDS);
}

static int last_cpu(void) {
    long count = sysconf(_SC_NPROCESSORS_ONLN);
    return count > 1 ? (int)count - 1 : 0;
}

/* ---- Plain call ----------------------------------------------------------------------------------- */

static __attribute__((noinline)) uint64_t empty_function(uint64_t value) {
    __asm__ __volatile__("" : "+r"(value));
    return value + 1;
}

static uint64_t (*volatile empty_pointer)(uint64_t) = empty_function;

static void plain_round(void *context, size_t iterations) {
    uint64_t value = 0;
    for (size_t i = 0; i < iterations; ++i)
        value = empty_pointer(value);
    *(uint64_t volatile *)context = value;
}

/* ---- Wait ping-pong: the futex and the wait table ------------------------------------------------ */

typedef struct ping_pong {
    _Atomic uint32_t word; /* even: the pinger's turn; odd: the ponger's */
    size_t iterations;
    _Atomic bool stop;
    void (*wait)(_Atomic uint32_t *word, uint32_t value); /* blocks while *word == value */
    void (*wake)(_Atomic uint32_t *word);
} ping_pong_t;

#if UFORM_LINUX
static void futex_raw_wait(_Atomic uint32_t *word, uint32_t value) {
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, value, NULL, NULL, 0);
}

static void futex_raw_wake(_Atomic uint32_t *word) {
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}
#endif

static void ping_wait_value(ping_pong_t *game, uint32_t value) {
    while (atomic_load_explicit(&game->word, memory_order_acquire) == value)
        game->wait(&game->word, value);
}

static void *ponger_main(void *argument) {
    ping_pong_t *game = argument;
    bench_pin_to_cpu(0);
    uint32_t expected = 1;
    for (;;) {
        ping_wait_value(game, expected - 1);
        if (atomic_load(&game->stop)) break;
        atomic_store_explicit(&game->word, expected + 1, memory_order_release);
        game->wake(&game->word);
        expected += 2;
    }
    return NULL;
}

static void ping_round(void *context, size_t iterations) {
    ping_pong_t *game = context;
    for (size_t i = 0; i < iterations; ++i) {
        uint32_t value = atomic_load_explicit(&game->word, memory_order_acquire);
        atomic_store_explicit(&game->word, value + 1, memory_order_release);
        game->wake(&game->word);
        ping_wait_value(game, value + 1);
    }
}

static double wait_ping_pong(void (*wait)(_Atomic uint32_t *, uint32_t), void (*wake)(_Atomic uint32_t *)) {
    ping_pong_t game = {.word = 0, .wait = wait, .wake = wake};
    pthread_t ponger;
    if (pthread_create(&ponger, NULL, ponger_main, &game) != 0) return 0;
    double result = measure(ping_round, &game);
    atomic_store(&game.stop, true);
    uint32_t value = atomic_load(&game.word);
    atomic_store(&game.word, value + 1);
    wake(&game.word);
    pthread_join(ponger, NULL);
    return result;
}

/* ---- Doorbell round trips: eventfd and pipe ------------------------------------------------------ */

typedef struct bell_pair {
    loop_doorbell_t there; /* rung by the pinger, slept on by the ponger */
    loop_doorbell_t back;  /* the other way */
    _Atomic bool stop;
} bell_pair_t;

static void bell_sleep(loop_doorbell_t const *bell) {
    struct pollfd poller = {.fd = bell->read_fd, .events = POLLIN};
    int ready;
    do
        ready = poll(&poller, 1, -1);
    while (ready < 0 && errno == EINTR);
    (void)loop_doorbell_drain(bell);
}

static void *bell_ponger_main(void *argument) {
    bell_pair_t *pair = argument;
    bench_pin_to_cpu(0);
    for (;;) {
        bell_sleep(&pair->there);
        if (atomic_load(&pair->stop)) break;
        loop_doorbell_ring(&pair->back);
    }
    return NULL;
}

static void bell_round(void *context, size_t iterations) {
    bell_pair_t *pair = context;
    for (size_t i = 0; i < iterations; ++i) {
        loop_doorbell_ring(&pair->there);
        bell_sleep(&pair->back);
    }
}

/* Nanoseconds per round trip over doorbells that `open` makes; 0 when they cannot be made. */
static double doorbell_round_trip(int (*open)(loop_doorbell_t *bell)) {
    bell_pair_t pair = {.stop = false};
    double result = 0;
    if (open(&pair.there) != 0) return 0;
    if (open(&pair.back) != 0) goto done;
    pthread_t ponger;
    if (pthread_create(&ponger, NULL, bell_ponger_main, &pair) != 0) goto done;
    result = measure(bell_round, &pair);
    atomic_store(&pair.stop, true);
    loop_doorbell_ring(&pair.there);
    pthread_join(ponger, NULL);
done:
    loop_doorbell_close(&pair.there);
    loop_doorbell_close(&pair.back);
    return result;
}

/* ---- Empty deferred calls ------------------------------------------------------------------------ */

typedef struct deferred {
    uform_executor_t *executor;
    uform_outcome_t outcome;
} deferred_t;

static void deferred_round(void *context, size_t iterations) {
    deferred_t *deferred = context;
    uform_executor_nop_args_t args = {.executor = deferred->executor, .outcome = &deferred->outcome};
    for (size_t i = 0; i < iterations; ++i) {
        if (uform_executor_nop(&args) != UFORM_OK || uform_outcome_wait(&deferred->outcome) != UFORM_OK) {
            fprintf(stderr, "the empty call failed\n");
            exit(1);
        }
    }
}

static double deferred_round_trip(uform_executor_t *executor) {
    deferred_t deferred = {.executor = executor};
    uform_outcome_init(&deferred.outcome);
    double result = measure(deferred_round, &deferred);
    uform_outcome_destroy(&deferred.outcome);
    return result;
}

/* ---- Posting completions ------------------------------------------------------------------------- */

#define POSTS_PER_PRODUCER 2000000u

typedef struct post_bench {
    loop_t *loop;
    loop_op_t *ops; /* POSTS_PER_PRODUCER per producer */
    size_t delivered;
    _Atomic bool go;
} post_bench_t;

typedef struct producer {
    post_bench_t *bench;
    size_t index;
} producer_t;

static void count_delivery(loop_op_t *op) {
    post_bench_t *bench = (post_bench_t *)(uintptr_t)op->result;
    bench->delivered++;
}

static void *producer_main(void *argument) {
    producer_t *producer = argument;
    post_bench_t *bench = producer->bench;
    bench_pin_to_cpu((int)producer->index % (last_cpu() + 1));
    while (!atomic_load_explicit(&bench->go, memory_order_acquire))
        sched_yield();
    loop_op_t *ops = bench->ops + producer->index * POSTS_PER_PRODUCER;
    for (size_t i = 0; i < POSTS_PER_PRODUCER; ++i)
        loop_post(bench->loop, &ops[i]);
    return NULL;
}

/* Two producers post into a loop that the main thread runs; answers completions per second. */
static double posts_per_second(loop_backend_t backend) {
    post_bench_t bench = {0};
    loop_options_t options = {.backend = backend, .single_issuer = true};
    if (loop_create(&options, &bench.loop) != 0) return 0;
    bench.ops = calloc(2 * POSTS_PER_PRODUCER, sizeof *bench.ops);
    if (!bench.ops) return 0;
    for (size_t i = 0; i < 2 * POSTS_PER_PRODUCER; ++i) {
        bench.ops[i].callback = count_delivery;
        bench.ops[i].result = (int64_t)(uintptr_t)&bench;
    }
    pthread_t threads[2];
    producer_t producers[2] = {{&bench, 0}, {&bench, 1}};
    for (int i = 0; i < 2; ++i)
        pthread_create(&threads[i], NULL, producer_main, &producers[i]);
    uint64_t start = loop_now_ns();
    atomic_store_explicit(&bench.go, true, memory_order_release);
    while (bench.delivered < 2 * POSTS_PER_PRODUCER)
        loop_run(bench.loop, true, 1000000);
    uint64_t elapsed = loop_now_ns() - start;
    for (int i = 0; i < 2; ++i)
        pthread_join(threads[i], NULL);
    loop_destroy(bench.loop);
    free(bench.ops);
    return 2.0 * POSTS_PER_PRODUCER / ((double)elapsed / 1e9);
}

int main(int argc, char **argv) {
    if (argc > 1) seconds_per_figure = atof(argv[1]) > 0 ? atof(argv[1]) : 1.0;
    bench_pin_to_cpu(last_cpu());
    printf("UForm loop benchmark: %ld CPUs, loop backend %s, medians of %d rounds\n\n",
           sysconf(_SC_NPROCESSORS_ONLN),
           loop_default_backend() == LOOP_BACKEND_URING ? "io_uring" : "portable", ROUNDS);

    uint64_t sink = 0;
    double plain = measure(plain_round, &sink);
#if UFORM_LINUX
    double futex_ping = wait_ping_pong(futex_raw_wait, futex_raw_wake);
#endif
    double table_ping = wait_ping_pong(futex_table_wait, futex_table_wake_all);
#if UFORM_LINUX
    double eventfd_bell = doorbell_round_trip(loop_doorbell_open);
#endif
    double pipe_bell = doorbell_round_trip(loop_doorbell_open_pipe);

    uform_executor_t *inline_executor = NULL, *ram = NULL;
    uform_ram_options_t options = uform_ram_options_default();
    options.threads = 1;
    if (uform_executor_create_inline(&inline_executor) != UFORM_OK ||
        uform_executor_create_ram(&options, &ram) != UFORM_OK) {
        fprintf(stderr, "cannot create the executors\n");
        return 1;
    }
    double on_inline = deferred_round_trip(inline_executor);
    uform_executor_drain(ram, UFORM_SPINNING);
    double on_spinning = deferred_round_trip(ram);
    uform_executor_drain(ram, UFORM_SLEEPING);
    double on_sleeping = deferred_round_trip(ram);
    uform_executor_free(ram);
    uform_executor_free(inline_executor);

    printf("%-52s %12s %10s\n", "figure", "ns", "ratio");
    printf("%-52s %12.1f %10s\n", "plain function call", plain, "1");
    printf("%-52s %12.1f %10.1f\n", "empty deferred call, inline executor", on_inline, on_inline / plain);
    printf("%-52s %12.1f %10.1f  (goal < 2000)\n", "empty deferred call, RAM executor, spinning", on_spinning,
           on_spinning / plain);
#if UFORM_LINUX
    printf("%-52s %12.1f %10s\n", "futex ping-pong round trip across CPUs", futex_ping, "");
    printf("%-52s %12.1f %10.2f  (x futex ping-pong)\n", "wait table ping-pong round trip across CPUs",
           table_ping, table_ping / futex_ping);
    printf("%-52s %12.1f %10.2f  (x futex ping-pong)\n", "eventfd doorbell round trip across CPUs",
           eventfd_bell, eventfd_bell / futex_ping);
    printf("%-52s %12.1f %10.2f  (x futex ping-pong)\n", "pipe doorbell round trip across CPUs", pipe_bell,
           pipe_bell / futex_ping);
    printf("%-52s %12.1f %10.2f  (x futex ping-pong)\n", "empty deferred call, RAM executor, sleeping",
           on_sleeping, on_sleeping / futex_ping);
#else
    printf("%-52s %12.1f %10s\n", "wait table ping-pong round trip across CPUs", table_ping, "");
    printf("%-52s %12.1f %10.2f  (x wait table ping-pong)\n", "pipe doorbell round trip across CPUs",
           pipe_bell, pipe_bell / table_ping);
    printf("%-52s %12.1f %10.2f  (x wait table ping-pong)\n", "empty deferred call, RAM executor, sleeping",
           on_sleeping, on_sleeping / table_ping);
#endif
    printf("\n%-52s %12s\n", "completions posted by two worker threads", "per second");
    printf("%-52s %12.3g\n", "  io_uring loop",
           loop_uring_available() ? posts_per_second(LOOP_BACKEND_URING) : 0.0);
    printf("%-52s %12.3g\n", "  portable loop", posts_per_second(LOOP_BACKEND_PORTABLE));
    return 0;
}
