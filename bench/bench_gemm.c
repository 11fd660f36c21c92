/* GEMM throughput of every kernel path at the text tower's shapes (m = 512 tokens, hidden 768, MLP 3072):
 *   qkv (n, k) = (2304, 768), out (768, 768), up (3072, 768), down (768, 3072),
 * with bias, on one thread and on two threads splitting n at KERNEL_GEMM_TILE multiples, in GFLOP/s
 * (2 m n k / time, median of several runs), beside the machine's BF16 dot-product peak: independent
 * `vdpbf16ps` chains in registers, on one core and on two at once. Then the I8 GEMM of every path with one
 * (scalar avx2 avxvnni avx512vnni) at the same shapes, in GOP/s, beside the I8 dot-product peak (`vpdpbusd`
 * chains alike), and the time quantize_rows takes for its activations as a share of the GEMM's. It prints
 * figures; it never fails on time.
 * Usage: bench_gemm [--json] [path...]   (paths: scalar avx2 avxvnni avx512 avx512vnni avx512bf16;
 * default all)
 * --json prints one object per line: {"path", "shape": "n x k", "m", "threads", "gflops",
 * "ratio_to_peak"} per BF16 figure, and {"peak_gflops", "threads"} for 1 and 2 threads (none, and ratios 0,
 * without AVX512-BF16); {"path", "kind": "i8", "shape", "m", "threads", "gops", "ratio_to_peak",
 * "quantize_share"} per I8 figure and {"i8_peak_gops", "threads"} (none without AVX512-VNNI). */
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_common.h"
#include "kernels.h"

#define TOKENS      512
#define MIN_RUNS    5
#define MAX_RUNS    51
#define MIN_SECONDS 0.3 /* per figure, unless MIN_RUNS take longer */
#define THREADS_MAX 2

/* ---- Two threads, woken by spinning on a round counter (a sleeping hand-off would cost more than
 * the noise we measure); between two-thread figures the helper naps instead, so that its spinning
 * does not take the core's resources from one-thread figures (on an SMT sibling, or a vCPU sharing a
 * physical core, a spinning `pause` loop costs the other thread up to two thirds of its throughput) */

typedef struct team team_t;
typedef void (*team_work_t)(team_t *team, size_t thread);

struct team {
    atomic_size_t round, done; /* rounds started by the main thread, finished by the helper */
    atomic_bool quit;
    atomic_bool spin; /* two-thread figures are being measured: spin for the next round */
    team_work_t work;
    size_t threads;
    /* what the work reads */
    kernels_t const *path;
    kernel_gemm_t gemm;
    float const *x; /* quantize_work: [m, k] into gemm's x_u8, x_scales, x_zeros */
};

static void *helper_main(void *context) {
    team_t *team = context;
    bench_pin_to_cpu(1);
    size_t seen = 0;
    for (;;) {
        size_t round;
        while ((round = atomic_load_explicit(&team->round, memory_order_acquire)) == seen) {
            if (atomic_load_explicit(&team->quit, memory_order_relaxed)) return NULL;
            if (atomic_load_explicit(&team->spin, memory_order_relaxed))
                _mm_pause();
            else
                nanosleep(&(struct timespec){.tv_nsec = 100000}, NULL);
        }
        seen = round;
        team->work(team, 1);
        atomic_store_explicit(&team->done, round, memory_order_release);
    }
}

/* Runs `work` on `threads` (1 or 2) threads and answers the wall time. */
static double team_run(team_t *team, team_work_t work, size_t threads) {
    team->work = work;
    team->threads = threads;
    double start = bench_now_seconds();
    size_t round = 0;
    if (threads > 1) round = atomic_fetch_add_explicit(&team->round, 1, memory_order_acq_rel) + 1;
    work(team, 0);
    if (threads > 1)
        while (atomic_load_explicit(&team->done, memory_order_acquire) != round)
            _mm_pause();
    return bench_now_seconds() - start;
}

/* Median seconds of `work` over enough runs, after one to warm caches. */
static double measure(team_t *team, team_work_t work, size_t threads) {
    double times[MAX_RUNS], total = 0.0;
    size_t runs = 0;
    atomic_store_explicit(&team->spin, threads > 1, memory_order_relaxed);
    team_run(team, work, threads);
    while (runs < MAX_RUNS && (runs < MIN_RUNS || total < MIN_SECONDS)) {
        times[runs] = team_run(team, work, threads);
        total += times[runs++];
    }
    qsort(times, runs, sizeof *times, bench_compare_doubles);
    return times[runs / 2];
}

/* ---- Peak ---------------------------------------------------------------------------------------- */

enum { PEAK_CHAINS = 24, PEAK_STEPS = 20000000 };

/* PEAK_CHAINS independent accumulators (the latency of about 6 cycles at 2 per cycle needs 12 or more),
 * all in registers. Compiled for AVX512-BF16 only here, and called only when the CPU has it. */
__attribute__((target("avx512f,avx512bf16"))) static double peak_loop(void) {
    __m512 sums[PEAK_CHAINS];
    for (int i = 0; i < PEAK_CHAINS; ++i)
        sums[i] = _mm512_setzero_ps();
    __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80), b = a; /* pairs of 1.0: no denormals */
    for (long step = 0; step < PEAK_STEPS; ++step) {
#pragma GCC unroll 24
        for (int i = 0; i < PEAK_CHAINS; ++i)
            sums[i] = _mm512_dpbf16_ps(sums[i], a, b);
    }
    float total = 0.0f;
    for (int i = 0; i < PEAK_CHAINS; ++i)
        total += _mm512_reduce_add_ps(sums[i]);
    return (double)total;
}

/* The same for `vpdpbusd` (four u8 by four s8 products into each int32 lane), written in assembly: GCC 12
 * moves an array of integer vectors through memory at every step, which would measure the moves. */
#define DPBUSD_CHAIN(register) "vpdpbusd %%zmm24, %%zmm25, %%zmm" #register "\n\t"
__attribute__((target("avx512f,avx512vnni"))) static double i8_peak_loop(void) {
    long steps = PEAK_STEPS;
    __asm__ volatile("vpternlogd $0xff, %%zmm24, %%zmm24, %%zmm24\n\t"
                     "vpabsb %%zmm24, %%zmm25\n\t" /* bytes of 1 */
                     "1:\n\t" DPBUSD_CHAIN(0) DPBUSD_CHAIN(1) DPBUSD_CHAIN(2) DPBUSD_CHAIN(3) DPBUSD_CHAIN(4)
                         DPBUSD_CHAIN(5) DPBUSD_CHAIN(6) DPBUSD_CHAIN(7) DPBUSD_CHAIN(8) DPBUSD_CHAIN(9)
                             DPBUSD_CHAIN(10) DPBUSD_CHAIN(11) DPBUSD_CHAIN(12) DPBUSD_CHAIN(13)
                                 DPBUSD_CHAIN(14) DPBUSD_CHAIN(15) DPBUSD_CHAIN(16) DPBUSD_CHAIN(17)
                                     DPBUSD_CHAIN(18) DPBUSD_CHAIN(19) DPBUSD_CHAIN(20) DPBUSD_CHAIN(21)
                                         DPBUSD_CHAIN(22) DPBUSD_CHAIN(23) "dec %0\n\t"
                                                                           "jnz 1b\n\t"
                     : "+r"(steps)
                     :
                     : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
                       "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18",
                       "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24", "xmm25", "cc");
    return (double)steps;
}
#undef DPBUSD_CHAIN

static double volatile peak_sink; /* keeps the loop's result, so that the loop is not removed */

static void peak_work(team_t *team, size_t thread) {
    (void)team;
    (void)thread;
    peak_sink = peak_loop();
}

static void i8_peak_work(team_t *team, size_t thread) {
    (void)team;
    (void)thread;
    peak_sink = i8_peak_loop();
}

/* ---- GEMM ---------------------------------------------------------------------------------------- */

static void gemm_work(team_t *team, size_t thread) {
    size_t begin, end;
    if (bench_share_columns(team->gemm.n, KERNEL_GEMM_TILE, thread, team->threads, &begin, &end))
        team->path->gemm(&team->gemm, begin, end);
}

static void gemm_i8_work(team_t *team, size_t thread) {
    size_t begin, end;
    if (bench_share_columns(team->gemm.n, KERNEL_GEMM_TILE, thread, team->threads, &begin, &end))
        team->path->gemm_i8(&team->gemm, begin, end);
}

/* The activations of gemm_i8_work, each thread its share of the rows. */
static void quantize_work(team_t *team, size_t thread) {
    kernel_gemm_t const *g = &team->gemm;
    size_t first = g->m * thread / team->threads, last = g->m * (thread + 1) / team->threads;
    team->path->quantize_rows((uint8_t *)(uintptr_t)g->x_u8 + first * g->x_stride, g->x_stride,
                              (float *)(uintptr_t)g->x_scales + first,
                              (int32_t *)(uintptr_t)g->x_zeros + first, team->x + first * g->k, g->k,
                              last - first, g->k);
}

static uint32_t random_state = 12345;

static bool wanted(int argc, char **argv, char const *name) {
    bool any = false;
    for (int i = 1; i < argc; ++i) {
        if (argv[i][0] == '-') continue;
        any = true;
        if (!strcmp(argv[i], name)) return true;
    }
    return !any;
}

int main(int argc, char **argv) {
    bool json = false;
    for (int i = 1; i < argc; ++i)
        json |= !strcmp(argv[i], "--json");
    static size_t const shapes[][2] = {{2304, 768}, {768, 768}, {3072, 768}, {768, 3072}}; /* (n, k) */
    static char const *const shape_names[] = {"qkv", "out", "up", "down"};
    static char const *const path_names[] = {"scalar", "avx2", "avx512", "avx512bf16"};

    team_t team = {0};
    pthread_t helper;
    size_t threads_max = sysconf(_SC_NPROCESSORS_ONLN) >= 2 ? 2 : 1;
    bench_pin_to_cpu(0);
    if (threads_max > 1 && pthread_create(&helper, NULL, helper_main, &team) != 0) threads_max = 1;

    double peak[THREADS_MAX + 1] = {0}, i8_peak[THREADS_MAX + 1] = {0};
    __builtin_cpu_init();
    bool has_peak = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
    for (size_t threads = 1; has_peak && threads <= threads_max; ++threads) {
        double flops = (double)PEAK_STEPS * PEAK_CHAINS * 64.0; /* 16 lanes x 2 products x 2 flops */
        peak[threads] = flops * (double)threads / measure(&team, peak_work, threads) / 1e9;
        if (json)
            printf("{\"peak_gflops\": %.1f, \"threads\": %zu}\n", peak[threads], threads);
        else
            printf("BF16 dot-product peak (%d vdpbf16ps chains), %zu thread%s: %.1f GFLOP/s\n", PEAK_CHAINS,
                   threads, threads > 1 ? "s" : "", peak[threads]);
    }
    if (!has_peak && !json) printf("BF16 dot-product peak: this CPU has no AVX512-BF16\n");
    bool has_i8_peak = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vnni");
    for (size_t threads = 1; has_i8_peak && threads <= threads_max; ++threads) {
        double ops = (double)PEAK_STEPS * PEAK_CHAINS * 128.0; /* 16 lanes x 4 products x 2 ops */
        i8_peak[threads] = ops * (double)threads / measure(&team, i8_peak_work, threads) / 1e9;
        if (json)
            printf("{\"i8_peak_gops\": %.1f, \"threads\": %zu}\n", i8_peak[threads], threads);
        else
            printf("I8 dot-product peak (%d vpdpbusd chains), %zu thread%s: %.1f GOP/s\n", PEAK_CHAINS,
                   threads, threads > 1 ? "s" : "", i8_peak[threads]);
    }
    if (!has_i8_peak && !json) printf("I8 dot-product peak: this CPU has no AVX512-VNNI\n");
    if (!json)
        printf("\n%-11s %-5s %-12s %7s %10s %8s\n", "path", "layer", "n x k", "threads", "GFLOP/s", "peak");

    size_t k_max = 3072, n_max = 3072;
    float *x = aligned_alloc(64, TOKENS * k_max * sizeof(float));
    float *bias = aligned_alloc(64, n_max * sizeof(float));
    float *y = aligned_alloc(64, TOKENS * n_max * sizeof(float));
    uint16_t *w = aligned_alloc(64, n_max * k_max * sizeof(uint16_t));
    int8_t *w_i8 = aligned_alloc(64, n_max * k_max);
    uint8_t *x_u8 = aligned_alloc(64, TOKENS * k_max);
    float *w_scales = aligned_alloc(64, n_max * sizeof(float)),
          *x_scales = aligned_alloc(64, TOKENS * sizeof(float));
    int32_t *x_zeros = aligned_alloc(64, TOKENS * sizeof(int32_t));
    int status = 0;
    if (!x || !bias || !y || !w || !w_i8 || !x_u8 || !w_scales || !x_scales || !x_zeros) {
        fprintf(stderr, "bench_gemm: out of memory\n");
        status = 1;
        goto done;
    }
    for (size_t i = 0; i < TOKENS * k_max; ++i)
        x[i] = bench_uniform(&random_state);
    for (size_t i = 0; i < n_max; ++i)
        bias[i] = bench_uniform(&random_state);
    for (size_t i = 0; i < n_max * k_max; ++i)
        w[i] = f32_to_bf16(0.05f * bench_uniform(&random_state));

    for (size_t p = 0; p < sizeof path_names / sizeof path_names[0]; ++p) {
        kernels_t const *path = kernels_named(path_names[p]);
        if (!path || !wanted(argc, argv, path_names[p])) continue;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s) {
            size_t n = shapes[s][0], k = shapes[s][1];
            size_t bytes = (path->gemm_packed_size(n, k) + 63) / 64 * 64;
            void *packed = aligned_alloc(64, bytes);
            if (!packed) {
                fprintf(stderr, "bench_gemm: out of memory\n");
                status = 1;
                goto done;
            }
            path->gemm_pack(packed, w, n, k);
            team.path = path;
            team.gemm = (kernel_gemm_t){.m = TOKENS,
                                        .n = n,
                                        .k = k,
                                        .x = x,
                                        .x_stride = k,
                                        .w = packed,
                                        .bias = bias,
                                        .y = y,
                                        .y_stride = n};
            for (size_t threads = 1; threads <= threads_max; ++threads) {
                double gflops =
                    2.0 * TOKENS * (double)n * (double)k / measure(&team, gemm_work, threads) / 1e9;
                double ratio = peak[threads] > 0 ? gflops / peak[threads] : 0.0;
                if (json)
                    printf("{\"path\": \"%s\", \"shape\": \"%zu x %zu\", \"m\": %d, \"threads\": %zu, "
                           "\"gflops\": %.1f, \"ratio_to_peak\": %.3f}\n",
                           path->name, n, k, TOKENS, threads, gflops, ratio);
                else
                    printf("%-11s %-5s %4zu x %-5zu %7zu %10.1f %7.1f%%\n", path->name, shape_names[s], n, k,
                           threads, gflops, 100.0 * ratio);
                fflush(stdout);
            }
            free(packed);
        }
    }

    if (!json)
        printf("\n%-11s %-5s %-12s %7s %10s %8s %9s\n", "I8 path", "layer", "n x k", "threads", "GOP/s",
               "peak", "quantize");
    static char const *const i8_path_names[] = {"scalar", "avx2", "avxvnni", "avx512vnni"};
    for (size_t p = 0; p < sizeof i8_path_names / sizeof i8_path_names[0]; ++p) {
        kernels_t const *path = kernels_named(i8_path_names[p]);
        if (!path || !wanted(argc, argv, i8_path_names[p])) continue;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s) {
            size_t n = shapes[s][0], k = shapes[s][1];
            for (size_t c = 0; c < n; ++c)
                kernel_quantize_weights(w_i8 + c * k, &w_scales[c], w + c * k, k);
            void *packed = aligned_alloc(64, (path->gemm_i8_packed_size(n, k) + 63) / 64 * 64);
            if (!packed) {
                fprintf(stderr, "bench_gemm: out of memory\n");
                status = 1;
                goto done;
            }
            path->gemm_i8_pack(packed, w_i8, w_scales, n, k);
            team.path = path;
            team.x = x;
            team.gemm = (kernel_gemm_t){.m = TOKENS,
                                        .n = n,
                                        .k = k,
                                        .x_stride = k,
                                        .w = packed,
                                        .bias = bias,
                                        .y = y,
                                        .y_stride = n,
                                        .x_u8 = x_u8,
                                        .x_scales = x_scales,
                                        .x_zeros = x_zeros};
            for (size_t threads = 1; threads <= threads_max; ++threads) {
                double quantize = measure(&team, quantize_work, threads),
                       seconds = measure(&team, gemm_i8_work, threads);
                double gops = 2.0 * TOKENS * (double)n * (double)k / seconds / 1e9;
                double ratio = i8_peak[threads] > 0 ? gops / i8_peak[threads] : 0.0;
                if (json)
                    printf("{\"path\": \"%s\", \"kind\": \"i8\", \"shape\": \"%zu x %zu\", \"m\": %d, "
                           "\"threads\": %zu, \"gops\": %.1f, \"ratio_to_peak\": %.3f, \"quantize_share\": "
                           "%.3f}\n",
                           path->name, n, k, TOKENS, threads, gops, ratio, quantize / seconds);
                else
                    printf("%-11s %-5s %4zu x %-5zu %7zu %10.1f %7.1f%% %8.1f%%\n", path->name,
                           shape_names[s], n, k, threads, gops, 100.0 * ratio, 100.0 * quantize / seconds);
                fflush(stdout);
            }
            free(packed);
        }
    }

done:
    if (threads_max > 1) {
        atomic_store(&team.quit, true);
        pthread_join(helper, NULL);
    }
    free(x);
    free(bias);
    free(y);
    free(w);
    free(w_i8);
    free(x_u8);
    free(w_scales);
    free(x_scales);
    free(x_zeros);
    return status;
}
