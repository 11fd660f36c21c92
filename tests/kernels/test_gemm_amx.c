/* The AMX GEMMs' logic on CPUs without AMX: kernels/gemm_amx.c built again with UFORM_AMX_EMULATED, its
 * tile instructions emulated in C (amx_emulated.h), as a path whose other kernels are avx512bf16's (the
 * file's own AVX-512 code runs as it is, so this needs AVX512-BF16 and skips, saying so, without it).
 * Against the scalar path as test_gemm.c and test_gemm_i8.c compare the real paths: every row count from 1
 * to 70 (partial tiles of rows), n and k off the tiles' 16 columns and 32 or 64 values, depth and column
 * blocks, every epilogue with bias and residual, F32 and BF16 activations, within kernels.h's tolerance;
 * the I8 GEMM's integer sums bitwise, up to KERNEL_I8_DEPTH_MAX; every output bitwise unchanged when the
 * columns are split between calls. And the tiles' life: configured once per thread on its first GEMM,
 * released when the thread ends, never used in a way the hardware would fault on. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "amx_emulated.h"
#include "fixtures.h"
#include "gemm_problem.h"
#include "kernel_fixtures.h"
#include "paths.h"

static kernels_t emulated;

/* avx512bf16's table with the emulated GEMMs, when this CPU runs avx512bf16. */
static int emulated_setup(void **state) {
    (void)state;
    kernels_t const *base = kernels_named("avx512bf16");
    if (!base) return 0;
    emulated = *base;
    emulated.name = "amx (emulated)";
    emulated.gemm = kernel_gemm_amx_emulated;
    emulated.gemm_packed_size = kernel_gemm_packed_size_amx_emulated;
    emulated.gemm_pack = kernel_gemm_pack_amx_emulated;
    emulated.gemm_i8 = kernel_gemm_i8_amx_emulated;
    emulated.gemm_i8_packed_size = kernel_gemm_i8_packed_size_amx_emulated;
    emulated.gemm_i8_pack = kernel_gemm_i8_pack_amx_emulated;
    return 0;
}

/* The emulated path, or the test skipped. */
static kernels_t const *emulated_path(void) {
    if (!emulated.name) {
        print_message("[  SKIP    ] the emulated AMX GEMMs run gemm_amx.c's AVX-512 code: this CPU lacks "
                      "AVX512-BF16\n");
        skip();
    }
    return &emulated;
}

/* Fails when the emulation counted a use the hardware would fault on. */
static void assert_no_faults(void) {
    assert_int_equal(amx_emulated_counts().faults, 0);
}

static void compare(size_t m, size_t n, size_t k, options_t options) {
    kernels_t const *path = emulated_path();
    problem_compare(&path, 1, m, n, k, options);
}

static size_t const odd_n[] = {1, 17, 33, 47, 70, 100, 130};
static size_t const odd_k[] = {1, 3, 31, 33, 63, 100, 1100};

/* ---- BF16 weights ---------------------------------------------------------------------------------- */

/* Every row count from 1 to 70 with the next n, k and combination of options_numbered each. */
static void test_bf16_every_row_count(void **state) {
    (void)state;
    emulated_path();
    random_seed(11);
    for (size_t m = 1; m <= 70; ++m)
        compare(m, odd_n[m % COUNT(odd_n)], odd_k[m / COUNT(odd_n) % COUNT(odd_k)],
                options_numbered(false, m % 47));
    assert_no_faults();
}

/* Every combination (bias, each epilogue, F32 and BF16 x, residual none, separate or in y) on shapes that
 * cross the tiles' rows, the depth blocks (1024) and the column blocks (512). */
static void test_bf16_every_epilogue(void **state) {
    (void)state;
    emulated_path();
    random_seed(12);
    static size_t const shapes[][3] = {
        {17, 47, 100}, {33, 70, 1100}, {70, 130, 33}, {5, 1100, 65}, {1, 16, 0}};
    for (size_t s = 0; s < COUNT(shapes); ++s)
        for (size_t number = 0; number < OPTIONS_COUNT; ++number)
            compare(shapes[s][0], shapes[s][1], shapes[s][2], options_numbered(false, number));
    assert_no_faults();
}

static void test_bf16_splits(void **state) {
    (void)state;
    kernels_t const *path = emulated_path();
    random_seed(13);
    static size_t const cases[][4] = {
        {13, 200, 127, 35}, {40, 330, 65, 21}, {7, 517, 1100, 47}, {2, 1100, 65, 25}};
    for (size_t c = 0; c < COUNT(cases); ++c)
        problem_check_splits(path, cases[c][0], cases[c][1], cases[c][2],
                             options_numbered(false, cases[c][3]));
    assert_no_faults();
}

/* ---- I8 weights ------------------------------------------------------------------------------------ */

static options_t const EXACT = {.i8 = true};

/* Unit scales, no bias, no epilogue: y is the integer sum, bitwise the scalar path's. */
static void test_i8_sums_exact(void **state) {
    (void)state;
    emulated_path();
    random_seed(21);
    for (size_t m = 1; m <= 70; ++m)
        compare(m, odd_n[m % COUNT(odd_n)], odd_k[m / COUNT(odd_n) % COUNT(odd_k)], EXACT);
    compare(19, 33, 2100, EXACT); /* two depth blocks (2048) */
    assert_no_faults();
}

static void test_i8_every_epilogue(void **state) {
    (void)state;
    emulated_path();
    random_seed(22);
    static size_t const shapes[][3] = {{17, 47, 100}, {33, 70, 2100}, {70, 130, 33}, {5, 1100, 65}};
    for (size_t s = 0; s < COUNT(shapes); ++s)
        for (size_t number = 0; number < OPTIONS_COUNT; ++number)
            compare(shapes[s][0], shapes[s][1], shapes[s][2], options_numbered(true, number));
    assert_no_faults();
}

/* At k = KERNEL_I8_DEPTH_MAX, x 255 over a zero point 0 (or 0 over 255) and weights -128 or 127: |S| just
 * under 2^31, exactly (float)S. */
static void test_i8_largest_sums(void **state) {
    (void)state;
    kernels_t const *path = emulated_path();
    problem_t p;
    random_seed(23);
    problem_make_largest_sums(&p, 3, 64);
    problem_run_whole(path, &p, p.y);
    problem_check_largest_sums(&p);
    problem_free(&p);
    assert_no_faults();
}

static void test_i8_splits(void **state) {
    (void)state;
    kernels_t const *path = emulated_path();
    random_seed(24);
    static size_t const cases[][4] = {
        {13, 200, 127, 45}, {40, 330, 65, 25}, {7, 517, 2100, 15}, {2, 1100, 65, 43}};
    for (size_t c = 0; c < COUNT(cases); ++c)
        problem_check_splits(path, cases[c][0], cases[c][1], cases[c][2],
                             options_numbered(true, cases[c][3]));
    assert_no_faults();
}

/* ---- The tiles' life ------------------------------------------------------------------------------- */

/* Two GEMMs, BF16 then I8, on the calling thread. */
static void *two_gemms(void *unused) {
    (void)unused;
    problem_t p;
    problem_make(&p, 20, 40, 70, (options_t){0});
    problem_run_whole(&emulated, &p, p.y);
    problem_free(&p);
    problem_make(&p, 20, 40, 70, EXACT);
    problem_run_whole(&emulated, &p, p.y);
    problem_free(&p);
    return NULL;
}

/* A thread configures its tiles once, on its first GEMM, and releases them when it ends. */
static void test_tiles_configured_once_released_at_exit(void **state) {
    (void)state;
    emulated_path();
    random_seed(31);
    amx_emulated_counts_t before = amx_emulated_counts();
    pthread_t thread;
    assert_int_equal(pthread_create(&thread, NULL, two_gemms, NULL), 0);
    assert_int_equal(pthread_join(thread, NULL), 0);
    amx_emulated_counts_t after = amx_emulated_counts();
    assert_int_equal(after.configs - before.configs, 1);
    assert_int_equal(after.releases - before.releases, 1);
    assert_no_faults();
}

/* The emulation itself: a configuration out of bounds and a multiply whose shapes disagree are counted. */
static void *faulting_uses(void *unused) {
    (void)unused;
    _Alignas(64) uint8_t config[64] = {1};
    config[16] = 64, config[48] = 17; /* tile 0: 17 rows */
    amx_emulated_loadconfig(config);
    config[48] = 16, config[18] = 32, config[49] = 16; /* tile 1: 32 bytes a row */
    amx_emulated_loadconfig(config);
    amx_emulated_dpbf16ps(0, 0, 1); /* c of 64 bytes a row, b of 32 */
    amx_emulated_zero(2);           /* not configured */
    amx_emulated_release();
    return NULL;
}

static void test_emulation_counts_faults(void **state) {
    (void)state;
    size_t before = amx_emulated_counts().faults;
    pthread_t thread;
    assert_int_equal(pthread_create(&thread, NULL, faulting_uses, NULL), 0);
    assert_int_equal(pthread_join(thread, NULL), 0);
    assert_int_equal(amx_emulated_counts().faults - before, 3);
}

int main(void) {
    struct CMUnitTest const tests[] = {
        cmocka_unit_test(test_bf16_every_row_count),
        cmocka_unit_test(test_bf16_every_epilogue),
        cmocka_unit_test(test_bf16_splits),
        cmocka_unit_test(test_i8_sums_exact),
        cmocka_unit_test(test_i8_every_epilogue),
        cmocka_unit_test(test_i8_largest_sums),
        cmocka_unit_test(test_i8_splits),
        cmocka_unit_test(test_tiles_configured_once_released_at_exit),
        cmocka_unit_test(test_emulation_counts_faults),
    };
    return cmocka_run_group_tests(tests, emulated_setup, NULL);
}
