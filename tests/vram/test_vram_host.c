/* The host side of VRAM executors, which runs without a device: the index arrays a media chunk stages
 * (vram_units_plan) for images, clips and sounds with failed items among them, checked against the
 * contract of the kernels that read them (cuda_assemble_tokens, cuda_gather_rows); chunks spread over
 * devices and slots (vram_place, the flights); where a tape's memory is (vram_memory_of, from what the
 * runtime answers); and the shadow outputs of a chunk on a device other than the arena's
 * (vram_views_make). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"
#include "vram.h"

#define COUNT(array) (sizeof(array) / sizeof((array)[0]))

/* The arrays of a plan written at `base`. */
typedef struct plan_arrays {
    int32_t const *patch_offsets, *token_offsets, *state_rows, *token_rows;
} plan_arrays_t;

static plan_arrays_t plan_arrays(vram_units_t const *units, int32_t const *base) {
    plan_arrays_t arrays = {base, base + units->units + 1, NULL, NULL};
    arrays.state_rows = arrays.token_offsets + units->units + 1;
    arrays.token_rows = arrays.state_rows + units->states;
    return arrays;
}

/* A plan sized, then written, and the four arrays' sizes equal to what the sizing said. */
static int32_t *plan_of(vram_units_kind_t kind, size_t const *patches, size_t count, size_t frames,
                        size_t image_patches, size_t leading, vram_units_t *units) {
    *units = vram_units_plan(kind, patches, count, frames, image_patches, leading, NULL);
    assert_int_equal(units->bytes,
                     (2 * (units->units + 1) + units->states + units->vectors) * sizeof(int32_t));
    int32_t *base = malloc(units->bytes);
    assert_non_null(base);
    memset(base, 0x7f, units->bytes);
    vram_units_t written = vram_units_plan(kind, patches, count, frames, image_patches, leading, base);
    assert_memory_equal(&written, units, sizeof written);
    return base;
}

/* What the kernels require of any plan: unit u's tokens start at patch_offsets[u] + u * leading (its class
 * token; cuda_assemble_leading), offsets grow by the unit's patches, and every row named is a row of x. */
static void assert_plan_consistent(vram_units_t const *units, plan_arrays_t const *arrays, size_t leading) {
    assert_int_equal(arrays->patch_offsets[units->units], (int32_t)units->patches);
    assert_int_equal(arrays->token_offsets[units->units], (int32_t)units->tokens);
    for (size_t u = 0; u < units->units; ++u) {
        assert_int_equal(arrays->token_offsets[u], arrays->patch_offsets[u] + (int32_t)(u * leading));
        int32_t length = arrays->patch_offsets[u + 1] - arrays->patch_offsets[u];
        assert_true(length >= 0 && (size_t)length <= units->longest);
    }
    for (size_t i = 0; i < units->states; ++i)
        assert_true(arrays->state_rows[i] >= -1 && arrays->state_rows[i] < (int32_t)units->tokens);
    for (size_t i = 0; i < units->vectors; ++i)
        assert_true(arrays->token_rows[i] >= -1 && arrays->token_rows[i] < (int32_t)units->tokens);
}

/* A plan and what it must be: its sizes, then its four arrays. */
typedef struct plan_case {
    vram_units_kind_t kind;
    size_t const *patches;
    size_t count, frames, image_patches;
    vram_units_t sizes; /* units, patches, tokens, longest, states, vectors; not bytes */
    int32_t const *patch_offsets, *token_offsets, *state_rows, *token_rows;
    size_t leading; /* the class token, then the registers */
} plan_case_t;

static void assert_plan(plan_case_t const *expected) {
    vram_units_t units;
    int32_t *base = plan_of(expected->kind, expected->patches, expected->count, expected->frames,
                            expected->image_patches, expected->leading, &units);
    plan_arrays_t arrays = plan_arrays(&units, base);
    vram_units_t sizes = expected->sizes;
    sizes.bytes = units.bytes;
    assert_memory_equal(&units, &sizes, sizeof units);
    assert_memory_equal(arrays.patch_offsets, expected->patch_offsets, (units.units + 1) * sizeof(int32_t));
    assert_memory_equal(arrays.token_offsets, expected->token_offsets, (units.units + 1) * sizeof(int32_t));
    assert_memory_equal(arrays.state_rows, expected->state_rows, units.states * sizeof(int32_t));
    if (units.vectors)
        assert_memory_equal(arrays.token_rows, expected->token_rows, units.vectors * sizeof(int32_t));
    assert_plan_consistent(&units, &arrays, expected->leading);
    free(base);
}

/* Images of 4 patches, the second failed: its state and token rows -1. */
static size_t const image_patches[] = {4, 0, 4, 4};
static int32_t const image_patch_offsets[] = {0, 4, 8, 12}, image_token_offsets[] = {0, 5, 10, 15};
static int32_t const image_states[] = {0, -1, 5, 10};
static int32_t const image_vectors[] = {1, 2, 3, 4, -1, -1, -1, -1, 6, 7, 8, 9, 11, 12, 13, 14};

/* Clips of 2 frames of 4 patches, the second failed: a unit per frame, a state row per frame. */
static size_t const clip_patches[] = {8, 0, 8};
static int32_t const clip_patch_offsets[] = {0, 4, 8, 12, 16}, clip_token_offsets[] = {0, 5, 10, 15, 20};
static int32_t const clip_states[] = {0, 5, -1, -1, 10, 15};

/* Sounds of as many patches as each clip has, the second failed: token rows packed, none for it. */
static size_t const sound_patches[] = {3, 0, 5, 1};
static int32_t const sound_patch_offsets[] = {0, 3, 8, 9}, sound_token_offsets[] = {0, 4, 10, 12};
static int32_t const sound_states[] = {0, -1, 4, 10}, sound_vectors[] = {1, 2, 3, 5, 6, 7, 8, 9, 11};

/* Images that all failed: no unit, and every row named -1. */
static size_t const failed_patches[] = {0, 0};
static int32_t const failed_offsets[] = {0}, failed_states[] = {-1, -1},
                     failed_vectors[] = {-1, -1, -1, -1, -1, -1};

/* Images of 4 patches after a class token and 2 registers (UForm 3 large's), the second failed. */
static size_t const register_patches[] = {4, 0, 4};
static int32_t const register_patch_offsets[] = {0, 4, 8}, register_token_offsets[] = {0, 7, 14};
static int32_t const register_states[] = {0, -1, 7};
static int32_t const register_vectors[] = {3, 4, 5, 6, -1, -1, -1, -1, 10, 11, 12, 13};

static void units_plans(void **state) {
    (void)state;
    plan_case_t const cases[] = {
        {VRAM_UNITS_IMAGES,
         image_patches,
         4,
         1,
         4,
         {3, 12, 15, 4, 4, 16, 0},
         image_patch_offsets,
         image_token_offsets,
         image_states,
         image_vectors,
         1},
        {VRAM_UNITS_CLIPS,
         clip_patches,
         3,
         2,
         4,
         {4, 16, 20, 4, 6, 0, 0},
         clip_patch_offsets,
         clip_token_offsets,
         clip_states,
         NULL,
         1},
        {VRAM_UNITS_SOUNDS,
         sound_patches,
         4,
         1,
         0,
         {3, 9, 12, 5, 4, 9, 0},
         sound_patch_offsets,
         sound_token_offsets,
         sound_states,
         sound_vectors,
         1},
        {VRAM_UNITS_IMAGES,
         failed_patches,
         2,
         1,
         3,
         {0, 0, 0, 0, 2, 6, 0},
         failed_offsets,
         failed_offsets,
         failed_states,
         failed_vectors,
         1},
        {VRAM_UNITS_IMAGES,
         register_patches,
         3,
         1,
         4,
         {2, 8, 14, 4, 3, 12, 0},
         register_patch_offsets,
         register_token_offsets,
         register_states,
         register_vectors,
         3},
    };
    for (size_t i = 0; i < COUNT(cases); ++i)
        assert_plan(&cases[i]);
}

/* Chunks go round the devices, then round each device's slots; the flights follow them. */
static void chunks_spread_over_devices(void **state) {
    (void)state;
    size_t device, slot;
    for (size_t chunk = 0; chunk < 24; ++chunk) {
        vram_place(chunk, 3, &device, &slot);
        assert_int_equal(device, chunk % 3);
        assert_int_equal(slot, (chunk / 3) % VRAM_SLOTS);
    }
    vram_t *vram = calloc(1, sizeof *vram);
    assert_non_null(vram);
    vram->count = 3;
    vram_flights_start(vram);
    bool free_slot = false;
    for (size_t chunk = 0; chunk < 3 * VRAM_SLOTS; ++chunk) {
        vram_flight_t *next = vram_flights_next(vram, &free_slot);
        assert_true(free_slot);
        vram_flights_issue(vram, chunk * 10, chunk * 10 + 10);
        assert_ptr_equal(vram_flights_of(vram, chunk), next);
        assert_int_equal(next->first, chunk * 10);
        assert_true(next->busy && next->copying);
    }
    vram_flights_next(vram, &free_slot); /* chunk 6 would take chunk 0's slot, still in flight */
    assert_false(free_slot);
    assert_true(vram_flights_busy(vram, false));
    assert_true(vram_flights_busy(vram, true));
    assert_null(vram_flights_of(vram, 3 * VRAM_SLOTS));
    free(vram);
}

static void tape_memory_classified(void **state) {
    (void)state;
    struct cudaPointerAttributes attributes;
    memset(&attributes, 0, sizeof attributes);
    assert_int_equal(vram_memory_of(cudaErrorInvalidValue, &attributes), VRAM_PAGEABLE);
    attributes.type = cudaMemoryTypeUnregistered;
    assert_int_equal(vram_memory_of(cudaSuccess, &attributes), VRAM_PAGEABLE);
    attributes.type = cudaMemoryTypeHost;
    assert_int_equal(vram_memory_of(cudaSuccess, &attributes), VRAM_PINNED);
    attributes.type = cudaMemoryTypeDevice;
    assert_int_equal(vram_memory_of(cudaSuccess, &attributes), VRAM_ON_DEVICE);
    attributes.type = cudaMemoryTypeManaged;
    assert_int_equal(vram_memory_of(cudaSuccess, &attributes), VRAM_MANAGED);
    /* Without the runtime loaded, every pointer is host memory it does not know. */
    int local = 0;
    if (!cuda_library_loaded()) assert_int_equal(vram_memory(&local), VRAM_PAGEABLE);
    assert_int_equal(vram_memory(NULL), VRAM_PAGEABLE);
}

/* A chunk's views: the arena's at the chunk's rows on the arena's device, else shadows over the
 * scratch, each piece inside it and 256-byte aligned, rows from 0, the arena's rows kept for the copy. */
static void views_shadow_the_arena(void **state) {
    (void)state;
    static unsigned char arena_data[3][4096];
    static float arena_scales[3][64];
    encode_call_t encode = {.outputs = EVERYTHING, .scalar = UFORM_I8, .width = 16};
    size_t const hidden = 40, items = 5, tokens = 12;
    uform_view_t *views[] = {&encode.encoded.embeddings, &encode.encoded.states,
                             &encode.encoded.token_vectors};
    size_t const columns[] = {16, hidden, 16};
    for (size_t i = 0; i < 3; ++i)
        *views[i] = (uform_view_t){.data = arena_data[i],
                                   .scales = arena_scales[i],
                                   .rows = 60,
                                   .columns = columns[i],
                                   .row_stride = columns[i],
                                   .scalar = UFORM_I8,
                                   .device = true};
    vram_views_t own = vram_views_make(&encode, NULL, 7, items, 30, tokens, hidden);
    assert_false(own.shadow);
    assert_ptr_equal(own.out.states.data, arena_data[1]);
    assert_int_equal(own.first, 7);
    assert_int_equal(own.token_first, 30);
    size_t bytes = vram_views_bytes(&encode, items, tokens, hidden);
    unsigned char *scratch = aligned_alloc(256, bytes);
    assert_non_null(scratch);
    vram_views_t shadow = vram_views_make(&encode, scratch, 7, items, 30, tokens, hidden);
    assert_true(shadow.shadow);
    assert_int_equal(shadow.first, 0);
    assert_int_equal(shadow.token_first, 0);
    assert_int_equal(shadow.arena_first, 7);
    assert_int_equal(shadow.arena_token_first, 30);
    assert_ptr_equal(shadow.arena, &encode.encoded);
    uform_view_t const *out[] = {&shadow.out.embeddings, &shadow.out.states, &shadow.out.token_vectors};
    size_t const rows[] = {items, items, tokens};
    for (size_t i = 0; i < 3; ++i) {
        unsigned char const *data = out[i]->data, *scales = (unsigned char const *)out[i]->scales;
        assert_true(data >= scratch && data + rows[i] * out[i]->row_stride <= scratch + bytes);
        assert_true(scales >= scratch && scales + rows[i] * sizeof(float) <= scratch + bytes);
        assert_int_equal((uintptr_t)data % 256, 0);
        assert_int_equal((uintptr_t)scales % 256, 0);
        assert_int_equal(out[i]->rows, rows[i]);
        assert_int_equal(out[i]->row_stride, views[i]->row_stride);
    }
    free(scratch);
    /* Outputs not asked for take no room. */
    encode.outputs = UFORM_OUTPUT_EMBEDDINGS, encode.scalar = UFORM_F32;
    assert_int_equal(vram_views_bytes(&encode, items, tokens, hidden), 512);
}

int main(void) {
    struct CMUnitTest const tests[] = {
        cmocka_unit_test(units_plans),
        cmocka_unit_test(chunks_spread_over_devices),
        cmocka_unit_test(tape_memory_classified),
        cmocka_unit_test(views_shadow_the_arena),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
