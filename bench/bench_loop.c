/* The loop's costs, side by side with what they compete with:
 *   - a plain (indirect) function call;
 *   - the machine's own futex ping-pong between two threads on different CPUs (the floor for any
 *     hand-off that sleeps);
 *   - the round trip of an empty deferred call (submit, then wait) on the inline executor, on a RAM
 *     executor whose loop thread spins, and on one whose loop thread sleeps;
 *   - completions per second posted into one loop by two worker threads.
 * Medians of several rounds, in nanoseconds. It prints figures; it never fails on time.
 * Usage: bench_loop [seconds per figure, default 1] */
#include <inttypes.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "bench_common.h"
#include "common.h"
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

/* ---- Futex ping-pong ----------------------------------------------------------------------------- */

typedef struct ping_pong {
    _Atomic uint32_t word; /* even: the pinger's turn; odd: the ponger's */
    size_t iterations;
    _Atomic bool stop;
} ping_pong_t;

static void futex_wait_value(_Atomic uint32_t *word, uint32_t value) {
    while (atomic_load_explicit(word, memory_order_acquire) == value)
        syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, value, NULL, NULL, 0);
}

static void *ponger_main(void *argument) {
    ping_pong_t *game = argument;
    bench_pin_to_cpu(0);
    uint32_t expected = 1;
    for (;;) {
        futex_wait_value(&game->word, expected - 1);
        if (atomic_load(&game->stop)) break;
        atomic_store_explicit(&game->word, expected + 1, memory_order_release);
        syscall(SYS_futex, (uint32_t *)&game->word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
        expected += 2;
    }
    return NULL;
}

static void ping_round(void *context, size_t iterations) {
    ping_pong_t *game = context;
    for (size_t i = 0; i < iterations; ++i) {
        uint32_t value = atomic_load_explicit(&game->word, memory_order_acquire);
        atomic_store_explicit(&game->word, value + 1, memory_order_release);
        syscall(SYS_futex, (uint32_t *)&game->word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
        futex_wait_value(&game->word, value + 1);
    }
}

static double futex_ping_pong(void) {
    ping_pong_t game = {.word = 0};
    pthread_t ponger;
    if (pthread_create(&ponger, NULL, ponger_main, &game) != 0) return 0;
    double result = measure(ping_round, &game);
    atomic_store(&game.stop, true);
    uint32_t value = atomic_load(&game.word);
    atomic_store(&game.word, value + 1);
    syscall(SYS_futex, (uint32_t *)&game.word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
    pthread_join(ponger, NULL);
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
    double ping = futex_ping_pong();

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
    printf("%-52s %12.1f %10s\n", "futex ping-pong round trip across CPUs", ping, "");
    printf("%-52s %12.1f %10.2f  (x futex ping-pong)\n", "empty deferred call, RAM executor, sleeping",
           on_sleeping, on_sleeping / ping);
    printf("\n%-52s %12s\n", "completions posted by two worker threads", "per second");
    printf("%-52s %12.3g\n", "  io_uring loop",
           loop_uring_available() ? posts_per_second(LOOP_BACKEND_URING) : 0.0);
    printf("%-52s %12.3g\n", "  portable loop", posts_per_second(LOOP_BACKEND_PORTABLE));
    return 0;
}
