/* Helpers the kernel suites share (test_kernels.c, test_kernels_backward.c): cmocka-allocated float
 * buffers, element checks, and the SIMD paths this CPU runs. */
#pragma once

#include <stddef.h>

#include "kernels.h"

#define COUNT(array) (sizeof(array) / sizeof((array)[0]))
#define SENTINEL     12345.0f /* written around outputs: a kernel must leave it alone */
#define SIMD_PATHS   4        /* avx2, avx512, avx512bf16, neon */

/* n floats from test_malloc: uniform in [low, high), or all `value`. */
float *floats_uniform(size_t n, float low, float high);
float *floats_filled(size_t n, float value);

/* Fails the test when |actual - expected| > tolerance, naming what[index]. */
void check_near(double actual, double expected, double tolerance, char const *what, size_t index);

/* The SIMD paths this CPU and build run, into `paths`; skips the test when there is none. */
size_t simd_paths(kernels_t const *paths[SIMD_PATHS]);
