/* Arenas, views and tapes: generations and stale views, growth that never moves outputs, coalescing
 * so that a steady loop allocates once, device views, contention, placement on NUMA domains. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "tape.h"

static void stale_view_is_refused(void **state) {
    (void)state;
    uform_arena_t *arena = NULL;
    assert_int_equal(uform_arena_create_host(&arena), UFORM_OK);
    assert_int_equal(arena_begin(arena), UFORM_OK);
    float *rows = arena_allocate(arena, 4 * 8 * sizeof(float), 64);
    assert_non_null(rows);
    for (int i = 0; i < 32; ++i)
        rows[i] = (float)i;
    uform_view_t view = arena_view(arena, rows, 4, 8, UFORM_F32);
    arena_end(arena);

    assert_int_equal(uform_view_check(&view), UFORM_OK);
    void const *row = NULL;
    assert_int_equal(uform_view_row(&view, 3, &row), UFORM_OK);
    assert_true(((float const *)row)[0] == 24.0f);
    assert_int_equal(uform_view_row(&view, 4, &row), UFORM_INVALID_ARGUMENT);
    assert_null(row);

    /* The next call rewinds the arena: the old view is stale, whatever its memory now holds. */
    uint64_t generation = uform_arena_generation(arena);
    assert_int_equal(arena_begin(arena), UFORM_OK);
    assert_int_equal(uform_arena_generation(arena), generation + 1);
    arena_end(arena);
    assert_int_equal(uform_view_check(&view), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_view_row(&view, 0, &row), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_last_error().status, UFORM_INVALID_ARGUMENT);
    assert_non_null(strstr(uform_last_error().message, "stale"));
    assert_int_equal(uform_view_check(NULL), UFORM_INVALID_ARGUMENT);
    uform_arena_free(arena);
}

static void device_view_refuses_host_access(void **state) {
    (void)state;
    uform_arena_t *arena = NULL;
    assert_int_equal(uform_arena_create_host(&arena), UFORM_OK);
    assert_int_equal(arena_begin(arena), UFORM_OK);
    uform_view_t view = arena_view(arena, arena_allocate(arena, 64, 64), 1, 16, UFORM_F32);
    arena_end(arena);
    view.device = true; /* as a VRAM executor's arena marks them */
    void const *row = NULL;
    assert_int_equal(uform_view_check(&view), UFORM_DEVICE);
    assert_int_equal(uform_view_row(&view, 0, &row), UFORM_DEVICE);
    uform_arena_free(arena);
}

static void growth_never_moves_outputs(void **state) {
    (void)state;
    uform_executor_t *executor = NULL;
    assert_int_equal(uform_executor_create_ram(NULL, &executor), UFORM_OK);
    uform_arena_t *arena = NULL;
    assert_int_equal(uform_arena_create(executor, &arena), UFORM_OK);
    uform_executor_free(executor); /* the arena keeps it alive */

    for (int call = 0; call < 3; ++call) {
        size_t capacity_before = uform_arena_capacity(arena);
        assert_int_equal(arena_begin(arena), UFORM_OK);
        size_t capacity_rewound = uform_arena_capacity(arena);
        unsigned char *pieces[16];
        size_t const size = 100000; /* 16 of these outgrow the first block several times */
        for (int i = 0; i < 16; ++i) {
            pieces[i] = arena_allocate(arena, size, 64);
            assert_non_null(pieces[i]);
            assert_int_equal((uintptr_t)pieces[i] % 64, 0);
            memset(pieces[i], i + 1, size);
        }
        for (int i = 0; i < 16; ++i)
            for (size_t j = 0; j < size; j += 997)
                assert_int_equal(pieces[i][j], i + 1);
        arena_end(arena);
        /* The first call grows; the next rewind coalesces into one block that holds a whole call, so
         * from then on neither calls nor rewinds allocate. */
        if (call >= 1) assert_int_equal(uform_arena_capacity(arena), capacity_rewound);
        if (call >= 2) assert_int_equal(capacity_rewound, capacity_before);
    }
    uform_arena_free(arena);
}

static void arena_contention_and_reserve(void **state) {
    (void)state;
    uform_arena_t *arena = NULL;
    assert_int_equal(uform_arena_create_host(&arena), UFORM_OK);
    assert_int_equal(uform_arena_reserve(arena, 1 << 20), UFORM_OK);
    assert_true(uform_arena_capacity(arena) >= (1 << 20));
    assert_int_equal(arena_begin(arena), UFORM_OK);
    assert_int_equal(arena_begin(arena), UFORM_CONTENDED);
    assert_int_equal(uform_arena_reserve(arena, 2 << 20), UFORM_CONTENDED);
    arena_end(arena);
    assert_int_equal(uform_arena_reserve(arena, SIZE_MAX / 4), UFORM_OUT_OF_MEMORY);
    assert_int_equal(uform_last_error().status, UFORM_OUT_OF_MEMORY);
    /* Still usable after the failure. */
    assert_int_equal(arena_begin(arena), UFORM_OK);
    assert_non_null(arena_allocate(arena, 1000, 16));
    arena_end(arena);
    uform_arena_free(arena);

    assert_int_equal(uform_arena_create(NULL, &arena), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_arena_create_host(NULL), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_arena_reserve(NULL, 1), UFORM_INVALID_ARGUMENT);
    uform_arena_free(NULL);
}

static void arena_on_a_domain(void **state) {
    (void)state;
#if UFORM_WITH_HWLOC
    size_t domain = 0;
    uform_ram_options_t options = uform_ram_options_default();
    options.domains = &domain;
    options.domains_count = 1;
    uform_executor_t *executor = NULL;
    assert_int_equal(uform_executor_create_ram(&options, &executor), UFORM_OK);
    uform_arena_t *arena = NULL;
    assert_int_equal(uform_arena_create(executor, &arena), UFORM_OK);
    assert_int_equal(uform_arena_reserve(arena, 3 << 20), UFORM_OK);
    assert_int_equal(arena_begin(arena), UFORM_OK);
    unsigned char *bytes = arena_allocate(arena, 5 << 20, 64);
    assert_non_null(bytes);
    memset(bytes, 7, 5 << 20);
    arena_end(arena);
    uform_arena_free(arena);
    uform_executor_free(executor);
#else
    skip();
#endif
}

static void tapes_are_validated(void **state) {
    (void)state;
    char const text[] = "a cata dog";
    size_t offsets[] = {0, 5, 10};
    char const *message = NULL;
    uform_tape_t tape = {text, offsets, 2, 10};
    assert_int_equal(tape_validate(&tape, &message), UFORM_OK);
    size_t backwards[] = {0, 6, 5};
    tape.offsets = backwards;
    assert_int_equal(tape_validate(&tape, &message), UFORM_INVALID_ARGUMENT);
    assert_string_equal(message, "tape offsets out of order");
    size_t beyond[] = {0, 5, 11};
    tape.offsets = beyond;
    assert_int_equal(tape_validate(&tape, &message), UFORM_INVALID_ARGUMENT);
    assert_string_equal(message, "tape offsets past the end of the tape");
    tape = (uform_tape_t){NULL, offsets, 2, 10};
    assert_int_equal(tape_validate(&tape, &message), UFORM_INVALID_ARGUMENT);
    tape = (uform_tape_t){text, NULL, 2, 10};
    assert_int_equal(tape_validate(&tape, &message), UFORM_INVALID_ARGUMENT);
    tape = (uform_tape_t){NULL, NULL, 0};
    assert_int_equal(tape_validate(&tape, &message), UFORM_OK);
}

static void scalar_sizes(void **state) {
    (void)state;
    struct {
        uform_scalar_t scalar;
        size_t size;
    } const cases[] = {
        {UFORM_F32, 4}, {UFORM_BF16, 2}, {UFORM_F16, 2}, {UFORM_I8, 1}, {(uform_scalar_t)99, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
        assert_int_equal(uform_scalar_size(cases[i].scalar), cases[i].size);
}

int main(void) {
    struct CMUnitTest const tests[] = {
        cmocka_unit_test(stale_view_is_refused),
        cmocka_unit_test(device_view_refuses_host_access),
        cmocka_unit_test(growth_never_moves_outputs),
        cmocka_unit_test(arena_contention_and_reserve),
        cmocka_unit_test(arena_on_a_domain),
        cmocka_unit_test(tapes_are_validated),
        cmocka_unit_test(scalar_sizes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
