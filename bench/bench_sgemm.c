/* F32 GEMM (kernels_t.sgemm) throughput of every kernel path for the three products of a linear layer
 * y = x W^T, x [m, k], W [n, k], at the text tower's widths (hidden 768, MLP 3072):
 *   forward  y [m, n]  = x . W^T          (a = x, b = W transposed)
 *   dx       dx [m, k] = dy . W           (a = dy, b = W)
 *   dW       dW [n, k] += dy^T . x        (a = dy transposed, b = x, accumulate)
 * each 2 m n k flops, in GFLOP/s (median of several runs), on one thread and on two threads splitting the
 * output columns at KERNEL_GEMM_TILE multiples. The scalar path runs on m / SCALAR_DIVISOR tokens, or it
 * would take minutes; its rate is comparable all the same. It prints figures; it never fails on time.
 * Usage: bench_sgemm [tokens] [path...]   (tokens: m, default 2048; paths: scalar avx2 avx512 avx512bf16
 * neon; default all this CPU runs) */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_common.h"
#include "kernels.h"

#define MIN_RUNS       3
#define MAX_RUNS       21
#define MIN_SECONDS    0.3 /* per figure, unless MIN_RUNS take longer */
#define THREADS_MAX    2
#define SCALAR_DIVISOR 16

/* One thread's share of a product: whole tiles of KERNEL_GEMM_TILE columns. */
typedef struct share {
    kernels_t const *path;
    kernel_sgemm_t const *sgemm;
    size_t thread, threads;
} share_t;

static void *share_run(void *context) {
    share_t const *share = context;
    size_t begin, end;
    if (bench_share_columns(share->sgemm->n, KERNEL_GEMM_TILE, share->thread, share->threads, &begin, &end))
        share->path->sgemm(share->sgemm, begin, end);
    return NULL;
}

/* Seconds of one product on `threads` threads (the calling one and threads - 1 started for it), or a
 * negative number when a thread cannot start. */
static double run_once(kernels_t const *path, kernel_sgemm_t const *sgemm, size_t threads) {
    share_t shares[THREADS_MAX];
    pthread_t helpers[THREADS_MAX];
    if (threads > THREADS_MAX) threads = THREADS_MAX;
    double start = bench_now_seconds();
    for (size_t t = 0; t < threads; ++t)
        shares[t] = (share_t){.path = path, .sgemm = sgemm, .thread = t, .threads = threads};
    for (size_t t = 1; t < threads; ++t)
        if (pthread_create(&helpers[t], NULL, share_run, &shares[t]) != 0) {
            for (size_t u = 1; u < t; ++u)
                pthread_join(helpers[u], NULL);
            return -1.0;
        }
    share_run(&shares[0]);
    for (size_t t = 1; t < threads; ++t)
        pthread_join(helpers[t], NULL);
    return bench_now_seconds() - start;
}

/* Median seconds over enough runs, after one to warm caches; negative when threads cannot start. */
static double measure(kernels_t const *path, kernel_sgemm_t const *sgemm, size_t threads) {
    double times[MAX_RUNS], total = 0.0;
    size_t runs = 0;
    if (run_once(path, sgemm, threads) < 0) return -1.0;
    while (runs < MAX_RUNS && (runs < MIN_RUNS || total < MIN_SECONDS)) {
        times[runs] = run_once(path, sgemm, threads);
        if (times[runs] < 0) return -1.0;
        total += times[runs++];
    }
    qsort(times, runs, sizeof *times, bench_compare_doubles);
    return times[runs / 2];
}

static uint32_t random_state = 12345;

static bool wanted(int argc, char **argv, char const *name) {
    bool any = false;
    for (int i = 1; i < argc; ++i) {
        if (argv[i][0] >= '0' && argv[i][0] <= '9') continue;
        any = true;
        if (!strcmp(argv[i], name)) return true;
    }
    return !any;
}

/* The product `product` of a layer W [n, k] over m tokens: x and W's, or dy's with W (dx) or x (dW). */
static kernel_sgemm_t product_of(kernel_linear_product_t product, size_t m, size_t n, size_t k,
                                 float const *x, float const *w, float const *dy, float *out) {
    float const *a = product == KERNEL_LINEAR_FORWARD ? x : dy, *b = product == KERNEL_LINEAR_DW ? x : w;
    return kernel_sgemm_linear(product, m, n, k, a, b, out);
}

int main(int argc, char **argv) {
    size_t tokens = 2048;
    for (int i = 1; i < argc; ++i)
        if (argv[i][0] >= '0' && argv[i][0] <= '9') tokens = strtoul(argv[i], NULL, 10);
    if (tokens < SCALAR_DIVISOR) tokens = SCALAR_DIVISOR;
    static size_t const shapes[][2] = {{768, 768}, {3072, 768}, {768, 3072}}; /* (n, k) of W */
    static char const *const shape_names[] = {"out", "up", "down"};
    static char const *const product_names[] = {"forward", "dx", "dW"};
    static char const *const path_names[] = {"scalar", "avx2", "avx512", "avx512bf16", "neon"};
    size_t threads_max = sysconf(_SC_NPROCESSORS_ONLN) >= THREADS_MAX ? THREADS_MAX : 1;
    size_t width = 3072;
    float *x = malloc(tokens * width * sizeof(float)), *dy = malloc(tokens * width * sizeof(float));
    float *w = malloc(width * width * sizeof(float)), *out = malloc(tokens * width * sizeof(float));
    float *dw = malloc(width * width * sizeof(float));
    int status = 0;
    if (!x || !dy || !w || !out || !dw) {
        fprintf(stderr, "bench_sgemm: out of memory\n");
        status = 1;
        goto done;
    }
    for (size_t i = 0; i < tokens * width; ++i)
        x[i] = bench_uniform(&random_state), dy[i] = bench_uniform(&random_state);
    for (size_t i = 0; i < width * width; ++i)
        w[i] = 0.05f * bench_uniform(&random_state), dw[i] = 0.0f;

    printf("sgemm, m = %zu tokens (scalar: %zu), GFLOP/s\n", tokens, tokens / SCALAR_DIVISOR);
    printf("%-11s %-5s %-11s %-8s", "path", "layer", "n x k", "product");
    for (size_t threads = 1; threads <= threads_max; ++threads)
        printf(" %8zu thr", threads);
    printf("\n");
    for (size_t p = 0; p < sizeof path_names / sizeof path_names[0]; ++p) {
        kernels_t const *path = kernels_named(path_names[p]);
        if (!path || !wanted(argc, argv, path_names[p])) continue;
        size_t m = p == 0 ? tokens / SCALAR_DIVISOR : tokens;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s) {
            size_t n = shapes[s][0], k = shapes[s][1];
            for (size_t product = 0; product < 3; ++product) {
                kernel_sgemm_t sgemm =
                    product_of((kernel_linear_product_t)product, m, n, k, x, w, dy, product == 2 ? dw : out);
                printf("%-11s %-5s %4zu x %-4zu %-8s", path->name, shape_names[s], n, k,
                       product_names[product]);
                for (size_t threads = 1; threads <= threads_max; ++threads) {
                    double seconds = measure(path, &sgemm, threads);
                    if (seconds < 0) {
                        fprintf(stderr, "bench_sgemm: cannot start a thread\n");
                        status = 1;
                        goto done;
                    }
                    printf(" %12.1f", 2.0 * (double)m * (double)n * (double)k / seconds / 1e9);
                    fflush(stdout);
                }
                printf("\n");
            }
        }
    }

done:
    free(x);
    free(dy);
    free(w);
    free(out);
    free(dw);
    return status;
}
