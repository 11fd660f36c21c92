/* Helpers the kernel suites share (kernel_fixtures.h). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "fixtures.h"
#include "kernel_fixtures.h"

float *floats_uniform(size_t n, float low, float high) {
    float *x = test_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; ++i)
        x[i] = random_uniform(low, high);
    return x;
}

float *floats_filled(size_t n, float value) {
    float *x = test_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; ++i)
        x[i] = value;
    return x;
}

void check_near(double actual, double expected, double tolerance, char const *what, size_t index) {
    if (fabs(actual - expected) <= tolerance) return;
    fail_msg("%s[%zu] = %.9g, expected %.9g within %.3g", what, index, actual, expected, tolerance);
}

size_t simd_paths(kernels_t const *paths[SIMD_PATHS]) {
    kernels_t const *candidates[SIMD_PATHS] = {kernels_avx2(), kernels_avx512(), kernels_avx512bf16(),
                                               kernels_neon()};
    size_t count = 0;
    for (size_t i = 0; i < COUNT(candidates); ++i)
        if (candidates[i]) paths[count++] = candidates[i];
    if (!count) {
        print_message("[  SKIP    ] no SIMD path runs on this CPU\n");
        skip();
    }
    return count;
}
