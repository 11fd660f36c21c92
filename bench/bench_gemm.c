/* GEMM throughput of every kernel path at the text tower's shapes (m = 512 tokens, hidden 768, MLP 3072):
 *   qkv (n, k) = (2304, 768), out (768, 768), up (3072, 768), down (768, 3072),
 * with bias, on one thread and on two threads splitting n at KERNEL_GEMM_TILE multiples, in GFLOP/s
 * (2 m n k / time, median of several runs), beside the machine's BF16 dot-product peak: independent
 * `vdpbf16ps` chains in registers, on one core and on two at once. Then the I8 GEMM of every path with one
 * (scalar avx2 avxvnni avx512vnni) at the same shapes, in GOP/s, beside the I8 dot-product peak (`vpdpbusd`
 * chains alike), and the time quantize_rows takes for its activations as a share of the GEMM's. It prints
 * figures; it never fails on time.
 * The AMX paths' peaks follow where the amx path runs: four independent tile multiplies per step.
 * Usage: bench_gemm [--json] [path...]   (paths: scalar avx2 avxvnni avx512 avx512vnni avx512bf16 amx;
 * default all)
 * --json prints one object per line: {"path", "shape": "n x k", "m", "threads", "gflops",
 * "ratio_to_peak"} per BF16 figure, and {"peak_gflops", "threads"} for 1 and 2 threads (none, and ratios 0,
 * without AVX512-BF16); {"path", "kind": "i8", "shape", "m", "threads", "gops", "ratio_to_peak",
 * "quantize_share"} per I8 figure and {"i8_peak_gops", "threads"} (none without AVX512-VNNI);
 * {"amx_peak_gflops", "threads"} and {"amx_i8_peak_gops", "threads"} where the amx path runs. */
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

/* ---- AMX peaks ----------------------------------------------------------------------------------- */

/* Four independent tile multiplies per step (accumulators 0-3, operands 4-7 of ones, loaded once): one
 * TDPBF16PS is 16 x 16 x 32 products (16384 FLOP), one TDPBUSD 16 x 16 x 64 (32768 OP). Each thread
 * configures its tiles and releases them; called only where the amx path runs (the process has the tiles'
 * permission). */
enum { AMX_STEPS = 2000000 };

typedef struct amx_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config_t;

/* Static, not a local: GCC 12 drops stores to a local config before `_tile_loadconfig` (kernels/gemm_amx.c).
 */
static _Alignas(64) amx_config_t const amx_config = {
    .palette = 1, .colsb = {64, 64, 64, 64, 64, 64, 64, 64}, .rows = {16, 16, 16, 16, 16, 16, 16, 16}};

__attribute__((target("amx-tile,amx-bf16,amx-int8"))) static double amx_peak_loop(bool i8) {
    static _Alignas(64)
        uint16_t const ones[16 * 32] = {[0 ... 16 * 32 - 1] = 0x3f80}; /* BF16 1.0, or bytes */
    _tile_loadconfig(&amx_config);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, ones, 64);
    _tile_loadd(5, ones, 64);
    _tile_loadd(6, ones, 64);
    _tile_loadd(7, ones, 64);
    for (long step = 0; step < AMX_STEPS; ++step)
        if (i8) {
            _tile_dpbusd(0, 4, 6);
            _tile_dpbusd(1, 4, 7);
            _tile_dpbusd(2, 5, 6);
            _tile_dpbusd(3, 5, 7);
        } else {
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
    _Alignas(64) float out[16 * 16];
    _tile_stored(0, out, 64);
    __asm__ volatile("" ::: "memory"); /* gcc 12's tile store is an asm without a memory clobber */
    _tile_release();
    return (double)out[0];
}

static void amx_peak_work(team_t *team, size_t thread) {
    (void)team;
    (void)thread;
    peak_sink = amx_peak_loop(false);
}

static void amx_i8_peak_work(team_t *team, size_t thread) {
    (void)team;
    (void)thread;
    peak_sink = amx_peak_loop(true);
}

/* Prints the AMX BF16 and I8 peaks on 1 to threads_max threads, or why they are not measured. */
static void amx_peaks(team_t *team, size_t threads_max, bool json) {
    if (!kernels_named("amx")) {
        if (!json) printf("AMX peaks: skipped, %s\n", kernels_amx_state());
        return;
    }
    for (int i8 = 0; i8 < 2; ++i8)
        for (size_t threads = 1; threads <= threads_max; ++threads) {
            double ops = (double)AMX_STEPS * 4 * 16 * 16 * (i8 ? 64 : 32) * 2 * (double)threads;
            double rate = ops / measure(team, i8 ? amx_i8_peak_work : amx_peak_work, threads) / 1e9;
            if (json)
                printf("{\"%s\": %.1f, \"threads\": %zu}\n", i8 ? "amx_i8_peak_gops" : "amx_peak_gflops",
                       rate, threads);
            else
                printf("AMX %s peak (4 %s chains), %zu thread%s: %.1f %s\n", i8 ? "I8" : "BF16",
                       i8 ? "tdpbusd" : "tdpbf16ps", threads, threads > 1 ? "s" : "", rate,
                       i8 ? "GOP/s" : "GFLOP/s");
        }
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

/* The inputs every figure reads: activations, bias and output, BF16 weights, and the I8 weights and
 * activations made from them. */
typedef struct inputs {
    float *x, *bias, *y;
    uint16_t *w;
    int8_t *w_i8;
    uint8_t *x_u8;
    float *w_scales, *x_scales;
    int32_t *x_zeros;
} inputs_t;

/* team->gemm of shape (n, k) on team->path, its weights packed as BF16 or quantized to I8: answers the
 * packed weights (free() them), NULL when out of memory. */
static void *prepare_shape(team_t *team, inputs_t const *in, bool i8, size_t n, size_t k) {
    kernels_t const *path = team->path;
    size_t bytes = i8 ? path->gemm_i8_packed_size(n, k) : path->gemm_packed_size(n, k);
    void *packed = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!packed) return NULL;
    for (size_t c = 0; i8 && c < n; ++c)
        kernel_quantize_weights(in->w_i8 + c * k, &in->w_scales[c], in->w + c * k, k);
    if (i8)
        path->gemm_i8_pack(packed, in->w_i8, in->w_scales, n, k);
    else
        path->gemm_pack(packed, in->w, n, k);
    team->x = in->x;
    team->gemm = (kernel_gemm_t){.m = TOKENS,
                                 .n = n,
                                 .k = k,
                                 .x = i8 ? NULL : in->x,
                                 .x_stride = k,
                                 .w = packed,
                                 .bias = in->bias,
                                 .y = in->y,
                                 .y_stride = n,
                                 .x_u8 = i8 ? in->x_u8 : NULL,
                                 .x_scales = i8 ? in->x_scales : NULL,
                                 .x_zeros = i8 ? in->x_zeros : NULL};
    return packed;
}

/* One figure: G(FL)OP/s, its share of the peak and, for I8, the share quantize_rows adds. */
static void print_figure(bool json, bool i8, char const *path, char const *layer, size_t n, size_t k,
                         size_t threads, double rate, double ratio, double quantize) {
    if (json && i8)
        printf("{\"path\": \"%s\", \"kind\": \"i8\", \"shape\": \"%zu x %zu\", \"m\": %d, \"threads\": %zu, "
               "\"gops\": %.1f, \"ratio_to_peak\": %.3f, \"quantize_share\": %.3f}\n",
               path, n, k, TOKENS, threads, rate, ratio, quantize);
    else if (json)
        printf("{\"path\": \"%s\", \"shape\": \"%zu x %zu\", \"m\": %d, \"threads\": %zu, \"gflops\": %.1f, "
               "\"ratio_to_peak\": %.3f}\n",
               path, n, k, TOKENS, threads, rate, ratio);
    else if (i8)
        printf("%-11s %-5s %4zu x %-5zu %7zu %10.1f %7.1f%% %8.1f%%\n", path, layer, n, k, threads, rate,
               100.0 * ratio, 100.0 * quantize);
    else
        printf("%-11s %-5s %4zu x %-5zu %7zu %10.1f %7.1f%%\n", path, layer, n, k, threads, rate,
               100.0 * ratio);
    fflush(stdout);
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
    static char const *const path_names[] = {"scalar", "avx2", "avx512", "avx512bf16", "amx"};

    team_t team = {0};
    pthread_t helper;
    size_t threads_max = sysconf(_SC_NPROCESSORS_ONLN) >= 2 ? 2 : 1;
    bench_pin_to_cpu(0);
    if (threads_max > 1 && pthread_create(&helper, NULL, helper_main, &team) != 0) threads_max = 1;

    /* The peaks, BF16 then I8: peaks[0] in GFLOP/s, peaks[1] in GOP/s, per thread count (0: not measured). */
    double peaks[2][THREADS_MAX + 1] = {{0}};
    __builtin_cpu_init();
    struct {
        bool has;
        team_work_t work;
        double ops; /* per step: lanes x products x 2 */
        char const *key, *what, *unit, *lacking;
    } const kinds[2] = {
        {__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16"), peak_work, 16 * 2 * 2,
         "peak_gflops", "BF16 dot-product peak (24 vdpbf16ps chains)", "GFLOP/s", "AVX512-BF16"},
        {__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vnni"), i8_peak_work, 16 * 4 * 2,
         "i8_peak_gops", "I8 dot-product peak (24 vpdpbusd chains)", "GOP/s", "AVX512-VNNI"},
    };
    for (size_t kind = 0; kind < 2; ++kind) {
        for (size_t threads = 1; kinds[kind].has && threads <= threads_max; ++threads) {
            double ops = (double)PEAK_STEPS * PEAK_CHAINS * kinds[kind].ops;
            peaks[kind][threads] = ops * (double)threads / measure(&team, kinds[kind].work, threads) / 1e9;
            if (json)
                printf("{\"%s\": %.1f, \"threads\": %zu}\n", kinds[kind].key, peaks[kind][threads], threads);
            else
                printf("%s, %zu thread%s: %.1f %s\n", kinds[kind].what, threads, threads > 1 ? "s" : "",
                       peaks[kind][threads], kinds[kind].unit);
        }
        if (!kinds[kind].has && !json)
            printf("%s: this CPU has no %s\n", kinds[kind].what, kinds[kind].lacking);
    }
    amx_peaks(&team, threads_max, json);
    size_t k_max = 3072, n_max = 3072;
    inputs_t in = {.x = aligned_alloc(64, TOKENS * k_max * sizeof(float)),
                   .bias = aligned_alloc(64, n_max * sizeof(float)),
                   .y = aligned_alloc(64, TOKENS * n_max * sizeof(float)),
                   .w = aligned_alloc(64, n_max * k_max * sizeof(uint16_t)),
                   .w_i8 = aligned_alloc(64, n_max * k_max),
                   .x_u8 = aligned_alloc(64, TOKENS * k_max),
                   .w_scales = aligned_alloc(64, n_max * sizeof(float)),
                   .x_scales = aligned_alloc(64, TOKENS * sizeof(float)),
                   .x_zeros = aligned_alloc(64, TOKENS * sizeof(int32_t))};
    int status = 0;
    if (!in.x || !in.bias || !in.y || !in.w || !in.w_i8 || !in.x_u8 || !in.w_scales || !in.x_scales ||
        !in.x_zeros) {
        fprintf(stderr, "bench_gemm: out of memory\n");
        status = 1;
        goto done;
    }
    for (size_t i = 0; i < TOKENS * k_max; ++i)
        in.x[i] = bench_uniform(&random_state);
    for (size_t i = 0; i < n_max; ++i)
        in.bias[i] = bench_uniform(&random_state);
    for (size_t i = 0; i < n_max * k_max; ++i)
        in.w[i] = f32_to_bf16(0.05f * bench_uniform(&random_state));

    static char const *const i8_path_names[] = {"scalar", "avx2", "avxvnni", "avx512vnni", "amx"};
    for (int i8 = 0; i8 < 2; ++i8) {
        if (!json && i8)
            printf("\n%-11s %-5s %-12s %7s %10s %8s %9s\n", "I8 path", "layer", "n x k", "threads", "GOP/s",
                   "peak", "quantize");
        else if (!json)
            printf("\n%-11s %-5s %-12s %7s %10s %8s\n", "path", "layer", "n x k", "threads", "GFLOP/s",
                   "peak");
        char const *const *names = i8 ? i8_path_names : path_names;
        size_t count = i8 ? sizeof i8_path_names / sizeof *names : sizeof path_names / sizeof *names;
        for (size_t p = 0; p < count; ++p) {
            team.path = kernels_named(names[p]);
            if (!team.path || !wanted(argc, argv, names[p])) continue;
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s) {
                size_t n = shapes[s][0], k = shapes[s][1];
                void *packed = prepare_shape(&team, &in, i8, n, k);
                if (!packed) {
                    fprintf(stderr, "bench_gemm: out of memory\n");
                    status = 1;
                    goto done;
                }
                for (size_t threads = 1; threads <= threads_max; ++threads) {
                    double quantize = i8 ? measure(&team, quantize_work, threads) : 0.0;
                    double seconds = measure(&team, i8 ? gemm_i8_work : gemm_work, threads);
                    double rate = 2.0 * TOKENS * (double)n * (double)k / seconds / 1e9;
                    double top = peaks[i8][threads];
                    print_figure(json, i8, team.path->name, shape_names[s], n, k, threads, rate,
                                 top > 0 ? rate / top : 0.0, quantize / seconds);
                }
                free(packed);
            }
        }
    }

done:
    if (threads_max > 1) {
        atomic_store(&team.quit, true);
        pthread_join(helper, NULL);
    }
    void *buffers[] = {in.x, in.bias, in.y, in.w, in.w_i8, in.x_u8, in.w_scales, in.x_scales, in.x_zeros};
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; ++i)
        free(buffers[i]);
    return status;
}
