/* GEMM throughput of every kernel path at the text tower's shapes (m = 512 tokens, hidden 768, MLP 3072):
 *   qkv (n, k) = (2304, 768), out (768, 768), up (3072, 768), down (768, 3072),
 * with bias, on one thread and on two threads splitting n at KERNEL_GEMM_TILE multiples, in GFLOP/s
 * (2 m n k / time: the median of several runs, in each of ROUNDS rounds in which the paths take turns, and
 * the best round kept, so that other work on a shared machine weighs on every path alike), each as a share
 * of its path's own peak (measured in rounds alike): the instruction its GEMM multiplies with, in
 * independent chains held in registers, on one core and on two at once (`vfmadd231ps` ymm for avx2, zmm for
 * avx512, `vdpbf16ps` for avx512bf16, `tdpbf16ps` tiles for amx). Then the I8 GEMM of every path with one
 * (scalar avx2 avxvnni avxvnni_evex avx512vnni) at the same shapes, in GOP/s, as a share of its own peak
 * (`vpmaddwd` with `vpaddd` for avx2, `vpdpbusd` on ymm for avxvnni, VEX, and avxvnni_evex, on zmm for
 * avx512vnni), and the time quantize_rows takes for its activations as a share of the GEMM's. It names the
 * CPU and the path the dispatcher chose with its reason, marks with `*` the GEMM that path runs, and ends
 * with each path's rate over the four shapes (their work over their summed time) and the chosen GEMM's ratio
 * to the fastest one measured: the dispatcher's check. It prints figures; it never fails on time.
 * bench_gemm.py runs it beside PyTorch's matmul. Usage: bench_gemm [--json] [--peaks] [path...]   (paths:
 * scalar avx2 avxvnni avxvnni_evex avx512 avx512vnni avx512bf16 amx; default all); --peaks measures the
 * peaks alone (the end-to-end benches print them beside their figures).
 * --json prints one object per line: {"cpu", "cpus_online", "kernels"}; {"<peak>_peak", "threads", "path",
 * "kind"} per peak measured (fma_ymm, fma_zmm, dpbf16, maddwd, dpbusd_vex, dpbusd_ymm, dpbusd_zmm, and
 * amx_bf16 and amx_i8 where the amx path runs: four independent tile multiplies a step), with
 * {"peak_gflops", "threads"} and {"i8_peak_gops", "threads"} repeating the dpbf16 and dpbusd_zmm ones;
 * {"path", "shape": "n x k", "m", "threads", "gflops", "ratio_to_peak", "ratio_to_own_peak", "chosen"} per
 * BF16 figure (ratio_to_peak: to the vdpbf16ps peak, 0 without AVX512-BF16); {"path", "kind": "i8", "shape",
 * "m", "threads", "gops", "ratio_to_peak" (to the zmm vpdpbusd peak), "ratio_to_own_peak", "chosen",
 * "quantize_share"} per I8 figure; and {"summary": "bf16" or "i8", "threads", "chosen", "fastest",
 * "chosen_rate", "fastest_rate", "ratio_to_fastest"}. */
#include <cpuid.h>
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

#include "amx_tiles.h"
#include "bench_common.h"
#include "kernels.h"

#define TOKENS      512
#define MIN_RUNS    5
#define MAX_RUNS    51
#define MIN_SECONDS 0.2 /* per figure and round, unless MIN_RUNS take longer */
#define THREADS_MAX 2
#define ROUNDS      3 /* turns the paths (and the peaks) take; each figure the best of its rounds */

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
    double (*peak_loop)(void);
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

/* ---- Peaks: each path's own instruction, in independent chains held in registers ------------------ */

enum { PEAK_CHAINS = 24, PEAK_STEPS = 20000000 };

/* PEAK_CHAINS independent accumulators of `vdpbf16ps` (the latency of about 6 cycles at 2 per cycle needs
 * 12 or more). Compiled for AVX512-BF16 only here, and called only when the CPU has it. */
__attribute__((target("avx512f,avx512bf16"))) static double dpbf16_loop(void) {
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

/* The same for `vfmadd231ps` on zmm (the avx512 GEMM's), and on ymm (the avx2 GEMM's: 12 chains, as AVX2 has
 * 16 registers; 2 per cycle at a latency of 4 needs 8). Multiplying by 1 and adding 0 keeps the values. */
__attribute__((target("avx512f"))) static double fma_zmm_loop(void) {
    __m512 sums[PEAK_CHAINS];
    for (int i = 0; i < PEAK_CHAINS; ++i)
        sums[i] = _mm512_set1_ps((float)i);
    __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
    for (long step = 0; step < PEAK_STEPS; ++step) {
#pragma GCC unroll 24
        for (int i = 0; i < PEAK_CHAINS; ++i)
            sums[i] = _mm512_fmadd_ps(sums[i], one, zero);
    }
    float total = 0.0f;
    for (int i = 0; i < PEAK_CHAINS; ++i)
        total += _mm512_reduce_add_ps(sums[i]);
    return (double)total;
}

enum { YMM_CHAINS = 12 };

__attribute__((target("avx2,fma"))) static double fma_ymm_loop(void) {
    __m256 sums[YMM_CHAINS];
    for (int i = 0; i < YMM_CHAINS; ++i)
        sums[i] = _mm256_set1_ps((float)i);
    __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    for (long step = 0; step < PEAK_STEPS; ++step) {
#pragma GCC unroll 12
        for (int i = 0; i < YMM_CHAINS; ++i)
            sums[i] = _mm256_fmadd_ps(sums[i], one, zero);
    }
    float total = 0.0f;
    for (int i = 0; i < YMM_CHAINS; ++i)
        total += sums[i][0];
    return (double)total;
}

/* The I8 dot products, written in assembly: GCC 12 moves an array of integer vectors through memory at every
 * step, which would measure the moves. `vpdpbusd` (four u8 by four s8 products into each int32 lane) on zmm
 * (avx512vnni's) and on ymm, EVEX-encoded (avxvnni_evex's) or VEX-encoded (avxvnni's, AVX-VNNI); avx2's
 * `vpmaddwd` (two s16 by s16 products into each int32 lane) with the `vpaddd` that accumulates it. */
#define CHAINS_24(step)                                                                                      \
    step(0) step(1) step(2) step(3) step(4) step(5) step(6) step(7) step(8) step(9) step(10) step(11)        \
        step(12) step(13) step(14) step(15) step(16) step(17) step(18) step(19) step(20) step(21) step(22)   \
            step(23)
#define CLOBBERS_24                                                                                          \
    "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",        \
        "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22",   \
        "xmm23", "xmm24", "xmm25", "cc"
#define DPBUSD_ZMM(register) "vpdpbusd %%zmm24, %%zmm25, %%zmm" #register "\n\t"
#define DPBUSD_YMM(register) "vpdpbusd %%ymm24, %%ymm25, %%ymm" #register "\n\t"
#define DPBUSD_VEX(register) "%{vex%} vpdpbusd %%ymm12, %%ymm13, %%ymm" #register "\n\t"
#define MADDWD(products, sums)                                                                               \
    "vpmaddwd %%ymm12, %%ymm13, %%ymm" #products "\n\t"                                                      \
    "vpaddd %%ymm" #products ", %%ymm" #sums ", %%ymm" #sums "\n\t"
#define MADDWD_6 MADDWD(0, 6) MADDWD(1, 7) MADDWD(2, 8) MADDWD(3, 9) MADDWD(4, 10) MADDWD(5, 11)

__attribute__((target("avx512f,avx512vnni"))) static double dpbusd_zmm_loop(void) {
    long steps = PEAK_STEPS;
    __asm__ volatile("vpternlogd $0xff, %%zmm24, %%zmm24, %%zmm24\n\t"
                     "vpabsb %%zmm24, %%zmm25\n\t" /* bytes of 1 */
                     "1:\n\t" CHAINS_24(DPBUSD_ZMM) "dec %0\n\t"
                                                    "jnz 1b\n\t"
                     : "+r"(steps)
                     :
                     : CLOBBERS_24);
    return (double)steps;
}

__attribute__((target("avx512f,avx512vl,avx512vnni"))) static double dpbusd_ymm_loop(void) {
    long steps = PEAK_STEPS;
    __asm__ volatile("vpternlogd $0xff, %%ymm24, %%ymm24, %%ymm24\n\t"
                     "vpabsb %%ymm24, %%ymm25\n\t"
                     "1:\n\t" CHAINS_24(DPBUSD_YMM) "dec %0\n\t"
                                                    "jnz 1b\n\t"
                     : "+r"(steps)
                     :
                     : CLOBBERS_24);
    return (double)steps;
}

#define CHAINS_12(step)                                                                                      \
    step(0) step(1) step(2) step(3) step(4) step(5) step(6) step(7) step(8) step(9) step(10) step(11)
#define CLOBBERS_14                                                                                          \
    "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",        \
        "xmm12", "xmm13", "cc"

__attribute__((target("avx2"))) static double dpbusd_vex_loop(void) {
    long steps = PEAK_STEPS;
    __asm__ volatile("vpcmpeqd %%ymm12, %%ymm12, %%ymm12\n\t"
                     "vpabsb %%ymm12, %%ymm13\n\t"
                     "1:\n\t" CHAINS_12(DPBUSD_VEX) "dec %0\n\t"
                                                    "jnz 1b\n\t"
                     : "+r"(steps)
                     :
                     : CLOBBERS_14);
    return (double)steps;
}

/* 12 vpmaddwd a step, into 6 chains of vpaddd (whose latency of 1 is the only dependence). */
__attribute__((target("avx2"))) static double maddwd_loop(void) {
    long steps = PEAK_STEPS;
    __asm__ volatile("vpcmpeqd %%ymm12, %%ymm12, %%ymm12\n\t"
                     "vpabsw %%ymm12, %%ymm13\n\t" /* s16 of 1 */
                     "1:\n\t" MADDWD_6 MADDWD_6 "dec %0\n\t"
                     "jnz 1b\n\t"
                     : "+r"(steps)
                     :
                     : CLOBBERS_14);
    return (double)steps;
}

/* AMX: four independent tile multiplies a step (accumulators 0-3, operands 4-7 of ones, loaded once): one
 * TDPBF16PS is 16 x 16 x 32 products, one TDPBUSD 16 x 16 x 64. The thread configures its tiles and releases
 * them; measured only where the amx path runs (the process holds the tiles' permission). */
__attribute__((target("amx-tile,amx-bf16,amx-int8"))) static double amx_loop(bool i8) {
    static _Alignas(64)
        uint16_t const ones[16 * 32] = {[0 ... 16 * 32 - 1] = 0x3f80}; /* BF16 1.0, or bytes */
    _tile_loadconfig(&amx_tile_config);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, ones, 64);
    _tile_loadd(5, ones, 64);
    _tile_loadd(6, ones, 64);
    _tile_loadd(7, ones, 64);
    for (long step = 0; step < PEAK_STEPS; ++step)
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

static double amx_bf16_loop(void) {
    return amx_loop(false);
}

static double amx_i8_loop(void) {
    return amx_loop(true);
}

static double volatile peak_sink; /* keeps a loop's result, so that the loop is not removed */

/* The peaks bench_gemm measures, and which path's GEMM each is the peak of. */
typedef struct peak {
    char const *key;  /* its JSON key: "<key>_peak" */
    char const *what; /* what it runs */
    double (*loop)(void);
    double ops; /* per step: chains x lanes x products x 2 */
    bool i8;
    char const *path; /* whose GEMM (BF16) or I8 GEMM (i8) it is the peak of */
} peak_t;

static peak_t const peaks_table[] = {
    {"fma_ymm", "12 vfmadd231ps ymm chains", fma_ymm_loop, YMM_CHAINS * 8 * 2, false, "avx2"},
    {"fma_zmm", "24 vfmadd231ps zmm chains", fma_zmm_loop, PEAK_CHAINS * 16 * 2, false, "avx512"},
    {"dpbf16", "24 vdpbf16ps zmm chains", dpbf16_loop, PEAK_CHAINS * 16 * 2 * 2, false, "avx512bf16"},
    {"maddwd", "12 vpmaddwd ymm into 6 vpaddd chains", maddwd_loop, 12 * 8 * 2 * 2, true, "avx2"},
    {"dpbusd_vex", "12 {vex} vpdpbusd ymm chains", dpbusd_vex_loop, 12 * 8 * 4 * 2, true, "avxvnni"},
    {"dpbusd_ymm", "24 vpdpbusd ymm chains", dpbusd_ymm_loop, PEAK_CHAINS * 8 * 4 * 2, true, "avxvnni_evex"},
    {"dpbusd_zmm", "24 vpdpbusd zmm chains", dpbusd_zmm_loop, PEAK_CHAINS * 16 * 4 * 2, true, "avx512vnni"},
    {"amx_bf16", "4 tdpbf16ps tile chains", amx_bf16_loop, 4 * 16 * 16 * 32 * 2, false, "amx"},
    {"amx_i8", "4 tdpbusd tile chains", amx_i8_loop, 4 * 16 * 16 * 64 * 2, true, "amx"},
};
static void peak_work(team_t *team, size_t thread) {
    (void)thread;
    peak_sink = team->peak_loop();
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

/* One figure: G(FL)OP/s, its share of the path's own peak and of the vdpbf16ps / zmm vpdpbusd one, whether
 * it is the GEMM the dispatcher chose, and for I8 the share quantize_rows adds. */
typedef struct figure {
    char const *path, *layer;
    size_t n, k, threads;
    double rate, own, ratio, quantize;
    bool chosen;
} figure_t;

static void print_figure(bool json, bool i8, figure_t const *f) {
    if (json && i8)
        printf("{\"path\": \"%s\", \"kind\": \"i8\", \"shape\": \"%zu x %zu\", \"m\": %d, \"threads\": %zu, "
               "\"gops\": %.1f, \"ratio_to_peak\": %.3f, \"ratio_to_own_peak\": %.3f, \"chosen\": %s, "
               "\"quantize_share\": %.3f}\n",
               f->path, f->n, f->k, TOKENS, f->threads, f->rate, f->ratio, f->own,
               f->chosen ? "true" : "false", f->quantize);
    else if (json)
        printf("{\"path\": \"%s\", \"shape\": \"%zu x %zu\", \"m\": %d, \"threads\": %zu, \"gflops\": %.1f, "
               "\"ratio_to_peak\": %.3f, \"ratio_to_own_peak\": %.3f, \"chosen\": %s}\n",
               f->path, f->n, f->k, TOKENS, f->threads, f->rate, f->ratio, f->own,
               f->chosen ? "true" : "false");
    else if (i8)
        printf("%-12s %c %-5s %4zu x %-5zu %7zu %10.1f %8.1f%% %8.1f%%\n", f->path, f->chosen ? '*' : ' ',
               f->layer, f->n, f->k, f->threads, f->rate, 100.0 * f->own, 100.0 * f->quantize);
    else
        printf("%-12s %c %-5s %4zu x %-5zu %7zu %10.1f %8.1f%%\n", f->path, f->chosen ? '*' : ' ', f->layer,
               f->n, f->k, f->threads, f->rate, 100.0 * f->own);
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

/* The CPU's brand string, vendor, family and model (CPUID), as "AMD EPYC (AuthenticAMD family 25 model 17)".
 */
static void cpu_describe(char *text, size_t capacity) {
    unsigned regs[12] = {0}, eax = 0, ebx = 0, ecx = 0, edx = 0;
    char vendor[13] = "", brand[49] = "";
    if (__get_cpuid(0, &eax, &ebx, &ecx, &edx)) {
        memcpy(vendor, &ebx, 4);
        memcpy(vendor + 4, &edx, 4);
        memcpy(vendor + 8, &ecx, 4);
    }
    for (unsigned leaf = 0; leaf < 3; ++leaf)
        __get_cpuid(0x80000002u + leaf, &regs[4 * leaf], &regs[4 * leaf + 1], &regs[4 * leaf + 2],
                    &regs[4 * leaf + 3]);
    memcpy(brand, regs, 48);
    char const *start = brand;
    while (*start == ' ')
        ++start;
    unsigned family = 0, model = 0;
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx)) {
        family = ((eax >> 8) & 0xf) + (((eax >> 8) & 0xf) == 0xf ? (eax >> 20) & 0xff : 0);
        model = ((eax >> 4) & 0xf) | ((((eax >> 8) & 0xf) >= 6 ? (eax >> 16) & 0xf : 0) << 4);
    }
    snprintf(text, capacity, "%s (%s family %u model %u)", start, vendor, family, model);
}

/* The paths of each kind (BF16, I8) and, per thread count, their work and time summed over the shapes. */
enum { PATHS_MAX = 6 };
static char const *const path_names[2][PATHS_MAX] = {
    {"scalar", "avx2", "avx512", "avx512bf16", "amx"},
    {"scalar", "avx2", "avxvnni", "avxvnni_evex", "avx512vnni", "amx"}};

typedef struct totals {
    double ops[PATHS_MAX][THREADS_MAX + 1], seconds[PATHS_MAX][THREADS_MAX + 1];
} totals_t;

/* Whether `path`'s GEMM (or I8 GEMM) is the one of the table the dispatcher chose. */
static bool is_chosen(kernels_t const *path, bool i8) {
    kernels_t const *active = kernels_active();
    return i8 ? path->gemm_i8 == active->gemm_i8 : path->gemm == active->gemm;
}

/* Per kind and thread count: every measured path's rate over the four shapes, the chosen one's, and its
 * ratio to the fastest: the dispatcher's check. */
static void print_summary(bool json, totals_t const totals[2], size_t threads_max) {
    if (!json) printf("\nOver the four shapes (their work over their summed time):\n");
    for (int i8 = 0; i8 < 2; ++i8)
        for (size_t threads = 1; threads <= threads_max; ++threads) {
            int chosen = -1, fastest = -1;
            double rates[PATHS_MAX] = {0};
            if (!json) printf("%-4s %zu thread%s:", i8 ? "I8" : "BF16", threads, threads > 1 ? "s" : " ");
            for (int p = 0; p < PATHS_MAX; ++p) {
                if (!(totals[i8].seconds[p][threads] > 0)) continue;
                rates[p] = totals[i8].ops[p][threads] / totals[i8].seconds[p][threads] / 1e9;
                if (!json) printf(" %s %.1f", path_names[i8][p], rates[p]);
                if (fastest < 0 || rates[p] > rates[fastest]) fastest = p;
                if (is_chosen(kernels_named(path_names[i8][p]), i8)) chosen = p;
            }
            if (fastest < 0) {
                if (!json) printf(" nothing measured\n");
                continue;
            }
            double ratio = chosen >= 0 ? rates[chosen] / rates[fastest] : 0.0;
            char const *chosen_name = chosen >= 0 ? path_names[i8][chosen] : "not measured";
            if (json)
                printf("{\"summary\": \"%s\", \"threads\": %zu, \"chosen\": \"%s\", \"fastest\": \"%s\", "
                       "\"chosen_rate\": %.1f, \"fastest_rate\": %.1f, \"ratio_to_fastest\": %.3f}\n",
                       i8 ? "i8" : "bf16", threads, chosen_name, path_names[i8][fastest],
                       chosen >= 0 ? rates[chosen] : 0.0, rates[fastest], ratio);
            else
                printf(" %s; chosen %s, fastest %s: chosen/fastest %.3f%s\n", i8 ? "GOP/s" : "GFLOP/s",
                       chosen_name, path_names[i8][fastest], ratio,
                       chosen < 0      ? ""
                       : ratio >= 0.95 ? " (within 5%)"
                                       : " (NOT within 5%)");
        }
}

/* Measures every peak this CPU runs, on 1 and 2 threads, into peaks[i][threads] (0: not measured): the best
 * of ROUNDS rounds in which the peaks take turns, as the GEMMs' figures are. */
static void measure_peaks(bool json, team_t *team, size_t threads_max, double peaks[][THREADS_MAX + 1]) {
    size_t const count = sizeof peaks_table / sizeof peaks_table[0];
    for (size_t round = 0; round < ROUNDS; ++round)
        for (size_t i = 0; i < count; ++i)
            for (size_t threads = 1; kernels_named(peaks_table[i].path) && threads <= threads_max;
                 ++threads) {
                team->peak_loop = peaks_table[i].loop;
                double ops = (double)PEAK_STEPS * peaks_table[i].ops;
                double rate = ops * (double)threads / measure(team, peak_work, threads) / 1e9;
                peaks[i][threads] = rate > peaks[i][threads] ? rate : peaks[i][threads];
            }
    for (size_t i = 0; i < count; ++i) {
        peak_t const *peak = &peaks_table[i];
        if (!kernels_named(peak->path)) {
            if (!json)
                printf("peak %-10s %-38s: this CPU does not run %s\n", peak->key, peak->what, peak->path);
            continue;
        }
        if (!json) printf("peak %-10s %-38s:", peak->key, peak->what);
        for (size_t threads = 1; threads <= threads_max; ++threads) {
            if (json)
                printf("{\"%s_peak\": %.1f, \"threads\": %zu, \"path\": \"%s\", \"kind\": \"%s\"}\n",
                       peak->key, peaks[i][threads], threads, peak->path, peak->i8 ? "i8" : "bf16");
            else
                printf(" %8.1f %s, %zu thread%s", peaks[i][threads], peak->i8 ? "GOP/s" : "GFLOP/s", threads,
                       threads > 1 ? "s" : "");
            /* The keys bench_text.py reads: the vdpbf16ps and zmm vpdpbusd peaks. */
            if (json && !strcmp(peak->key, "dpbf16"))
                printf("{\"peak_gflops\": %.1f, \"threads\": %zu}\n", peaks[i][threads], threads);
            if (json && !strcmp(peak->key, "dpbusd_zmm"))
                printf("{\"i8_peak_gops\": %.1f, \"threads\": %zu}\n", peaks[i][threads], threads);
        }
        if (!json) printf("\n");
    }
    fflush(stdout);
}

/* The measured peak of `path`'s own instruction (GEMM or I8 GEMM), and the vdpbf16ps (zmm vpdpbusd) one. */
static double peak_of(double const peaks[][THREADS_MAX + 1], bool i8, char const *path, size_t threads) {
    for (size_t i = 0; i < sizeof peaks_table / sizeof peaks_table[0]; ++i)
        if (peaks_table[i].i8 == i8 && !strcmp(peaks_table[i].path, path)) return peaks[i][threads];
    return 0.0;
}

/* One shape of one kind (BF16 or I8) on every wanted path: weights packed for each, then ROUNDS rounds in
 * which the paths take turns, each figure the best of its rounds' medians, so that other work on a shared
 * machine weighs on every path alike. Prints the figures and adds them to the totals; answers 1 when out of
 * memory. */

typedef struct shape {
    bool json, i8;
    size_t threads_max;
    double const (*peaks)[THREADS_MAX + 1];
    totals_t *totals;
    char const *layer;
    kernels_t const *paths[PATHS_MAX]; /* NULL: not measured */
} shape_t;

static int measure_shape(team_t *team, inputs_t const *in, shape_t const *shape, size_t n, size_t k) {
    bool const i8 = shape->i8;
    void *packed[PATHS_MAX] = {NULL};
    kernel_gemm_t gemms[PATHS_MAX];
    int status = 0;
    for (size_t p = 0; p < PATHS_MAX; ++p) {
        if (!shape->paths[p]) continue;
        team->path = shape->paths[p];
        if (!(packed[p] = prepare_shape(team, in, i8, n, k))) status = 1;
        gemms[p] = team->gemm;
    }
    double const ops = 2.0 * TOKENS * (double)n * (double)k;
    for (size_t threads = 1; !status && threads <= shape->threads_max; ++threads) {
        double seconds[PATHS_MAX], quantize[PATHS_MAX];
        for (size_t round = 0; round < ROUNDS; ++round)
            for (size_t p = 0; p < PATHS_MAX; ++p) {
                if (!shape->paths[p]) continue;
                team->path = shape->paths[p];
                team->gemm = gemms[p];
                double q = i8 ? measure(team, quantize_work, threads) : 0.0;
                double t = measure(team, i8 ? gemm_i8_work : gemm_work, threads);
                seconds[p] = round && seconds[p] < t ? seconds[p] : t;
                quantize[p] = round && quantize[p] < q ? quantize[p] : q;
            }
        for (size_t p = 0; p < PATHS_MAX; ++p) {
            if (!shape->paths[p]) continue;
            double rate = ops / seconds[p] / 1e9;
            double own = peak_of(shape->peaks, i8, path_names[i8][p], threads);
            double top = peak_of(shape->peaks, i8, i8 ? "avx512vnni" : "avx512bf16", threads);
            shape->totals->ops[p][threads] += ops;
            shape->totals->seconds[p][threads] += seconds[p];
            figure_t const figure = {.path = path_names[i8][p],
                                     .layer = shape->layer,
                                     .n = n,
                                     .k = k,
                                     .threads = threads,
                                     .rate = rate,
                                     .own = own > 0 ? rate / own : 0.0,
                                     .ratio = top > 0 ? rate / top : 0.0,
                                     .quantize = quantize[p] / seconds[p],
                                     .chosen = is_chosen(shape->paths[p], i8)};
            print_figure(shape->json, i8, &figure);
        }
    }
    for (size_t p = 0; p < PATHS_MAX; ++p)
        free(packed[p]);
    return status;
}

int main(int argc, char **argv) {
    bool json = false, peaks_only = false;
    for (int i = 1; i < argc; ++i) {
        json |= !strcmp(argv[i], "--json");
        peaks_only |= !strcmp(argv[i], "--peaks");
    }
    static size_t const shapes[][2] = {{2304, 768}, {768, 768}, {3072, 768}, {768, 3072}}; /* (n, k) */
    static char const *const shape_names[] = {"qkv", "out", "up", "down"};

    team_t team = {0};
    pthread_t helper;
    size_t threads_max = sysconf(_SC_NPROCESSORS_ONLN) >= 2 ? 2 : 1;
    bench_pin_to_cpu(0);
    if (threads_max > 1 && pthread_create(&helper, NULL, helper_main, &team) != 0) threads_max = 1;

    char cpu[160];
    cpu_describe(cpu, sizeof cpu);
    char const *reason = kernels_reason();
    if (json)
        printf("{\"cpu\": \"%s\", \"cpus_online\": %ld, \"kernels\": \"%s\"}\n", cpu,
               sysconf(_SC_NPROCESSORS_ONLN), kernels_active()->name);
    else
        printf("CPU: %s, %ld online; m = %d; each figure the best of %d rounds' medians, the paths taking "
               "turns\n"
               "kernels chosen: %s (%s)\n",
               cpu, sysconf(_SC_NPROCESSORS_ONLN), TOKENS, ROUNDS, kernels_active()->name, reason);

    double peaks[sizeof peaks_table / sizeof peaks_table[0]][THREADS_MAX + 1] = {{0}};
    measure_peaks(json, &team, threads_max, peaks);
    if (peaks_only) {
        if (threads_max > 1) {
            atomic_store(&team.quit, true);
            pthread_join(helper, NULL);
        }
        return 0;
    }
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
        status = 1;
        goto done;
    }
    for (size_t i = 0; i < TOKENS * k_max; ++i)
        in.x[i] = bench_uniform(&random_state);
    for (size_t i = 0; i < n_max; ++i)
        in.bias[i] = bench_uniform(&random_state);
    for (size_t i = 0; i < n_max * k_max; ++i)
        in.w[i] = f32_to_bf16(0.05f * bench_uniform(&random_state));

    totals_t totals[2] = {{{{0}}}};
    for (int i8 = 0; i8 < 2 && !status; ++i8) {
        if (!json && i8)
            printf("\n%-14s %-5s %-12s %7s %10s %9s %9s\n", "I8 path", "layer", "n x k", "threads", "GOP/s",
                   "own peak", "quantize");
        else if (!json)
            printf("\n%-14s %-5s %-12s %7s %10s %9s\n", "path", "layer", "n x k", "threads", "GFLOP/s",
                   "own peak");
        shape_t shape = {
            .json = json, .i8 = i8, .threads_max = threads_max, .peaks = peaks, .totals = &totals[i8]};
        for (size_t p = 0; p < PATHS_MAX && path_names[i8][p]; ++p) {
            kernels_t const *path = kernels_named(path_names[i8][p]);
            shape.paths[p] = path && wanted(argc, argv, path_names[i8][p]) ? path : NULL;
        }
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0] && !status; ++s) {
            shape.layer = shape_names[s];
            status = measure_shape(&team, &in, &shape, shapes[s][0], shapes[s][1]);
        }
    }
    if (!status) print_summary(json, totals, threads_max);

done:
    if (status) fprintf(stderr, "bench_gemm: out of memory\n");
    if (threads_max > 1) {
        atomic_store(&team.quit, true);
        pthread_join(helper, NULL);
    }
    void *buffers[] = {in.x, in.bias, in.y, in.w, in.w_i8, in.x_u8, in.w_scales, in.x_scales, in.x_zeros};
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; ++i)
        free(buffers[i]);
    return status;
}
