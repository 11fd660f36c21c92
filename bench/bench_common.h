/* What the C benchmarks share: the clock, the sort order their medians use, CPU pinning, the fixed-seed
 * generators their inputs come from, the split of a product's columns between threads, and the report of
 * the library's last error. Header only: each benchmark is one executable. */
#pragma once

#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "uform.h"

/* CLOCK_MONOTONIC in nanoseconds, and in seconds. */
static inline uint64_t bench_now_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
}

static inline double bench_now_seconds(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
}

/* qsort orders, ascending. */
static inline int bench_compare_doubles(void const *a, void const *b) {
    double x = *(double const *)a, y = *(double const *)b;
    return (x > y) - (x < y);
}

static inline int bench_compare_u64(void const *a, void const *b) {
    uint64_t x = *(uint64_t const *)a, y = *(uint64_t const *)b;
    return x < y ? -1 : x > y;
}

/* Keeps the calling thread on `cpu`; a CPU it cannot have leaves it where it is, and so does a system
 * without thread affinity (the POSIX-only build, macOS). */
static inline void bench_pin_to_cpu(int cpu) {
#if UFORM_LINUX
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
#else
    (void)cpu;
#endif
}

/* Uniform in [-1, 1), from a 32-bit linear congruential state. */
static inline float bench_uniform(uint32_t *state) {
    *state = *state * 1664525u + 1013904223u;
    return (float)(*state >> 8) / 8388608.0f - 1.0f;
}

/* The next value of a 64-bit xorshift state (13, 7, 17), never 0 from a state that is not. */
static inline uint64_t bench_xorshift(uint64_t *state) {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

/* Thread `thread` of `threads`' share of n columns in whole tiles of `tile` columns: [*begin, *end),
 * false when the share is empty. */
static inline bool bench_share_columns(size_t n, size_t tile, size_t thread, size_t threads, size_t *begin,
                                       size_t *end) {
    size_t tiles = (n + tile - 1) / tile;
    size_t first = tiles * thread / threads, last = tiles * (thread + 1) / threads;
    *begin = first * tile;
    *end = last * tile < n ? last * tile : n;
    return first < last;
}

/* Prints "program: what: " and the calling thread's last uform error to stderr; answers its status. */
static inline uform_status_t bench_report_error(char const *program, char const *what) {
    uform_error_t error = uform_last_error();
    char rendered[512];
    uform_error_render(&error, rendered, sizeof rendered);
    fprintf(stderr, "%s: %s: %s\n", program, what, rendered);
    return error.status;
}
