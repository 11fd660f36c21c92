/* text_encode and text_choose through the public interface: outputs and their shapes, bitwise
 * determinism across thread counts and receivers, conversions, matryoshka widths, truncation, progress,
 * and bad input that leaves the model, executor and arena usable. Numbers against PyTorch are checked
 * by tests/reference/test_text_reference.py. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "fixtures.h"
#include "kernels.h"

static uform_model_t *model;
static uform_model_info_t info;

/* A batch of texts: empty, short, UTF-8, one longer than the tiny model's context (64). */
static char const *const samples[] = {
    "",
    "a",
    "a cat",
    "a dog on a sofa, sleeping",
    "\xd0\xba\xd0\xbe\xd1\x82 \xe7\x8c\xab \xf0\x9f\x90\x88",
    "The quick brown fox jumps over the lazy dog, and then it jumps over the lazy dog once more again.",
};
#define SAMPLES (sizeof samples / sizeof samples[0])

static char tape_bytes[4096];
static size_t tape_offsets[SAMPLES + 1];

static uform_tape_t sample_tape(void) {
    size_t used = 0;
    for (size_t i = 0; i < SAMPLES; ++i) {
        tape_offsets[i] = used;
        memcpy(tape_bytes + used, samples[i], strlen(samples[i]));
        used += strlen(samples[i]);
    }
    tape_offsets[SAMPLES] = used;
    return (uform_tape_t){tape_bytes, tape_offsets, SAMPLES, used};
}

/* The samples' tape encoded by `model` on the calling thread into `arena` and `encoded`. */
static uform_text_encode_args_t samples_args(uform_outputs_t outputs, uform_arena_t *arena,
                                             uform_encoded_t *encoded) {
    return (uform_text_encode_args_t){
        .model = model, .outputs = outputs, .arena = arena, .encoded = encoded, .texts = sample_tape()};
}

/* The sample texts as a batch, for the fixtures' checks. */
static batch_t *sample_batch(void) {
    batch_t *batch = batch_new(BATCH_TEXTS);
    for (size_t i = 0; i < SAMPLES; ++i)
        batch_add(batch, samples[i], strlen(samples[i]));
    return batch;
}

static uform_status_t text_encode(batch_t const *batch, uform_executor_t *executor, uform_outputs_t outputs,
                                  uform_arena_t *arena, uform_encode_config_t const *config,
                                  uform_outcome_t *outcome, uform_encoded_t *encoded) {
    uform_text_encode_args_t args = {ENCODE_ARGS(model), .texts = batch_tape(batch)};
    return uform_text_encode(&args);
}

static int setup(void **state) {
    (void)state;
    uform_tiny_checkpoint_args_t tiny = {.seed = 11, .depth = 2, .hidden = 128};
    return fixture_setup("text", &tiny, &model, &info);
}

static void outputs_have_their_shapes(void **state) {
    (void)state;
    uform_arena_t *arena = arena_on_host();
    uform_encoded_t encoded;
    uform_encode_stats_t stats;
    uform_encode_config_t config = {.stats = &stats};
    uform_text_encode_args_t args = samples_args(EVERYTHING, arena, &encoded);
    args.config = &config;
    assert_int_equal(uform_text_encode(&args), UFORM_OK);
    assert_int_equal(encoded.items, SAMPLES);
    assert_int_equal(encoded.embeddings.rows, SAMPLES);
    assert_int_equal(encoded.embeddings.columns, info.dims);
    assert_int_equal(encoded.states.columns, info.text.transformer.hidden);
    size_t kept = 0;
    for (size_t i = 0; i < SAMPLES; ++i) {
        size_t length = strlen(samples[i]);
        size_t item_kept = length < info.text.context ? length : info.text.context;
        assert_int_equal(encoded.token_vectors.item_offsets[i], kept);
        kept += item_kept;
        assert_int_equal(encoded.statuses[i], UFORM_OK);
        void const *row = NULL;
        assert_int_equal(uform_view_row(&encoded.embeddings, i, &row), UFORM_OK);
        assert_true(fabs(norm_of(row, info.dims) - 1.0) < 1e-4);
    }
    assert_int_equal(encoded.token_vectors.rows, kept);
    for (size_t row = 0; row < kept; ++row) {
        void const *values = NULL;
        assert_int_equal(uform_view_row(&encoded.token_vectors, row, &values), UFORM_OK);
        assert_true(fabs(norm_of(values, info.dims) - 1.0) < 1e-4);
    }
    /* Stats: one text is longer than the context. */
    assert_int_equal(stats.items, SAMPLES);
    assert_int_equal(stats.truncated, 1);
    assert_int_equal(stats.bytes, tape_offsets[SAMPLES]);
    assert_true(stats.total_ns >= stats.compute_ns);
    /* Different texts give different embeddings. */
    assert_memory_not_equal(encoded.embeddings.data,
                            (char *)encoded.embeddings.data + encoded.embeddings.row_stride,
                            encoded.embeddings.row_stride);
    uform_arena_free(arena);
}

static void bitwise_identical_across_receivers(void **state) {
    (void)state;
    batch_t *batch = sample_batch();
    assert_same_on_every_receiver(text_encode, batch, NULL);
    batch_free(batch);
}

static void a_text_does_not_depend_on_its_batch(void **state) {
    (void)state;
    uform_arena_t *batch_arena = arena_on_host(), *single_arena = arena_on_host();
    uform_encoded_t batch, single;
    uform_text_encode_args_t args = samples_args(UFORM_OUTPUT_EMBEDDINGS, batch_arena, &batch);
    assert_int_equal(uform_text_encode(&args), UFORM_OK);
    for (size_t i = 0; i < SAMPLES; ++i) {
        size_t offsets[2] = {0, strlen(samples[i])};
        args.arena = single_arena;
        args.encoded = &single;
        args.texts = (uform_tape_t){samples[i], offsets, 1, offsets[1]};
        assert_int_equal(uform_text_encode(&args), UFORM_OK);
        assert_memory_equal(single.embeddings.data,
                            (char *)batch.embeddings.data + i * batch.embeddings.row_stride,
                            batch.embeddings.row_stride);
    }
    uform_arena_free(batch_arena);
    uform_arena_free(single_arena);
}

/* BF16, F16 and I8 outputs are the F32 output converted; a matryoshka width is the prefix of the full
 * embedding, renormalized. */
static void conversions_and_matryoshka(void **state) {
    (void)state;
    batch_t *batch = sample_batch();
    assert_conversions_and_matryoshka(text_encode, batch, UFORM_OUTPUT_EMBEDDINGS, &info,
                                      kernels_scalar()->convert);
    batch_free(batch);
}

static void progress_and_cancel(void **state) {
    (void)state;
    /* Many texts over several chunks: 300 texts of 200 bytes are 60300 tokens. */
    size_t const count = 300, length = 200;
    char text[200];
    batch_t *batch = batch_new(BATCH_TEXTS);
    for (size_t i = 0; i < count; ++i) {
        for (size_t j = 0; j < length; ++j)
            text[j] = (char)('a' + (i * length + j) % 26);
        batch_add(batch, text, length);
    }
    assert_progress_and_cancel(text_encode, batch, UFORM_OK);
    batch_free(batch);
}

static void bad_input_leaves_everything_usable(void **state) {
    (void)state;
    uform_executor_t *executor = NULL, *other = NULL;
    assert_int_equal(uform_executor_create_ram(NULL, &executor), UFORM_OK);
    assert_int_equal(uform_executor_create_inline(&other), UFORM_OK);
    uform_arena_t *arena = NULL, *foreign = NULL;
    assert_int_equal(uform_arena_create(executor, &arena), UFORM_OK);
    assert_int_equal(uform_arena_create(other, &foreign), UFORM_OK);
    uform_encoded_t encoded;
    uform_text_encode_args_t good = samples_args(UFORM_OUTPUT_EMBEDDINGS, arena, &encoded);
    good.executor = executor;
    size_t backwards[] = {0, 4, 2}, beyond[] = {0, 4, 5000};
    struct {
        char const *what;
        uform_text_encode_args_t args;
        uform_status_t expected;
    } cases[] = {
        {"offsets out of order", good, UFORM_INVALID_ARGUMENT},
        {"offsets past the tape", good, UFORM_INVALID_ARGUMENT},
        {"no items", good, UFORM_INVALID_ARGUMENT},
        {"an arena of another executor", good, UFORM_INVALID_ARGUMENT},
    };
    cases[0].args.texts = (uform_tape_t){tape_bytes, backwards, 2, 100};
    cases[1].args.texts = (uform_tape_t){tape_bytes, beyond, 2, 100};
    cases[2].args.texts = (uform_tape_t){tape_bytes, tape_offsets, 0, 0};
    cases[3].args.arena = foreign;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        uform_status_t status = uform_text_encode(&cases[i].args);
        if (status != cases[i].expected) fail_msg("%s: %s", cases[i].what, uform_status_name(status));
        assert_int_equal(uform_text_encode(&good), UFORM_OK);
    }
    /* Deferred after all that: fine. */
    uform_outcome_t outcome;
    uform_outcome_init(&outcome);
    uform_text_encode_args_t deferred = good;
    deferred.outcome = &outcome;
    assert_int_equal(uform_text_encode(&deferred), UFORM_OK);
    assert_int_equal(uform_outcome_wait(&outcome), UFORM_OK);
    uform_outcome_destroy(&outcome);
    uform_arena_free(arena);
    uform_arena_free(foreign);
    uform_executor_free(executor);
    uform_executor_free(other);
}

static void choose_gives_probabilities(void **state) {
    (void)state;
    uform_arena_t *states_arena = arena_on_host(), *arena = arena_on_host();
    uform_encoded_t encoded;
    uform_text_encode_args_t encode = samples_args(UFORM_OUTPUT_STATES, states_arena, &encoded);
    assert_int_equal(uform_text_encode(&encode), UFORM_OK);

    /* Legal bytes per item: one, two, ten, every byte, three, one. */
    uint8_t legal[300];
    size_t offsets[SAMPLES + 1], used = 0, sizes[SAMPLES] = {1, 2, 10, 256, 3, 1};
    for (size_t item = 0; item < SAMPLES; ++item) {
        offsets[item] = used;
        for (size_t i = 0; i < sizes[item]; ++i)
            legal[used++] = (uint8_t)((i * 37 + item) % 256);
    }
    offsets[SAMPLES] = used;
    uform_view_t probabilities;
    uform_text_choose_args_t choose = {.model = model,
                                       .states = &encoded.states,
                                       .choices = {legal, offsets, SAMPLES, used},
                                       .arena = arena,
                                       .probabilities = &probabilities};
    assert_int_equal(uform_text_choose(&choose), UFORM_OK);
    assert_int_equal(probabilities.rows, used);
    for (size_t item = 0; item < SAMPLES; ++item) {
        double sum = 0;
        for (size_t i = probabilities.item_offsets[item]; i < probabilities.item_offsets[item + 1]; ++i) {
            float p = ((float const *)probabilities.data)[i];
            assert_true(p >= 0 && p <= 1);
            sum += p;
        }
        assert_true(fabs(sum - 1) < 1e-5);
    }
    assert_true(((float const *)probabilities.data)[0] == 1.0f); /* one legal byte: certain */

    /* Bad choices: an item without a legal byte, a repeated byte, a count mismatch, the states' arena. */
    uint8_t repeated[] = {'a', 'a'};
    size_t empty_offsets[SAMPLES + 1] = {0};
    uform_text_choose_args_t bad = choose;
    bad.choices = (uform_tape_t){legal, empty_offsets, SAMPLES, used};
    assert_int_equal(uform_text_choose(&bad), UFORM_INVALID_ARGUMENT);
    assert_string_equal(uform_last_error().message, "an item has no legal byte");
    size_t repeat_offsets[SAMPLES + 1] = {0, 2, 2, 2, 2, 2, 2};
    repeat_offsets[1] = 2;
    bad.choices = (uform_tape_t){repeated, repeat_offsets, SAMPLES, 2};
    assert_int_equal(uform_text_choose(&bad), UFORM_INVALID_ARGUMENT);
    bad.choices = (uform_tape_t){legal, offsets, SAMPLES - 1, used};
    assert_int_equal(uform_text_choose(&bad), UFORM_INVALID_ARGUMENT);
    bad = choose;
    bad.arena = states_arena;
    assert_int_equal(uform_text_choose(&bad), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_text_choose(&choose), UFORM_OK);

    /* States of an older generation are stale. */
    assert_int_equal(uform_text_encode(&encode), UFORM_OK);
    uform_view_t stale = encoded.states;
    assert_int_equal(uform_text_encode(&encode), UFORM_OK);
    choose.states = &stale;
    assert_int_equal(uform_text_choose(&choose), UFORM_INVALID_ARGUMENT);
    uform_arena_free(states_arena);
    uform_arena_free(arena);
}

/* The tiny checkpoint with the first weight of text.proj.weight made +infinity in BF16, written as
 * `name` in the folder; answers its path in `path` (512 bytes). */
static void write_infinite_projection(char const *name, char *path) {
    fixture_path(name, path, 512);
    uform_tiny_checkpoint_args_t const tiny = {.path = path, .seed = 11, .depth = 1, .hidden = 64};
    assert_int_equal(uform_tiny_checkpoint(&tiny), UFORM_OK);
    blob_t blob = blob_read(path);
    assert_true(blob.size > 8);
    uint64_t header_length = 0;
    for (size_t i = 0; i < 8; ++i)
        header_length |= (uint64_t)blob.data[i] << (8 * i);
    json_t *header = json_loadb((char const *)blob.data + 8, (size_t)header_length, 0, NULL);
    assert_non_null(header);
    json_t const *offsets = json_object_get(json_object_get(header, "text.proj.weight"), "data_offsets");
    assert_true(json_is_integer(json_array_get(offsets, 0)));
    size_t const at = 8 + (size_t)header_length + (size_t)json_integer_value(json_array_get(offsets, 0));
    json_decref(header);
    blob.data[at] = 0x80, blob.data[at + 1] = 0x7F; /* little-endian 0x7F80 */
    blob_write(name, &blob);
    free(blob.data);
}

/* A model whose weights carry every text to an infinite projection: each item fails with
 * UFORM_FORMAT and zero rows, in every output scalar, instead of a NaN vector with status OK. */
static void non_finite_output_has_status(void **state) {
    (void)state;
    char path[512];
    write_infinite_projection("infinite.safetensors", path);
    uform_model_t *infinite = NULL;
    uform_model_load_args_t const load = {.path = path, .model = &infinite};
    assert_int_equal(uform_model_load_ram(&load), UFORM_OK);
    uform_scalar_t const scalars[] = {UFORM_F32, UFORM_BF16, UFORM_F16, UFORM_I8};
    for (size_t s = 0; s < sizeof scalars / sizeof scalars[0]; ++s) {
        uform_arena_t *arena = arena_on_host();
        uform_encode_stats_t stats = {0};
        uform_encode_config_t const config = {.outputs_scalar = scalars[s], .stats = &stats};
        uform_encoded_t encoded;
        uform_text_encode_args_t args = {.model = infinite,
                                         .outputs = EVERYTHING,
                                         .arena = arena,
                                         .config = &config,
                                         .encoded = &encoded,
                                         .texts = sample_tape()};
        assert_int_equal(uform_text_encode(&args), UFORM_OK);
        assert_int_equal(stats.failed, SAMPLES);
        for (size_t i = 0; i < SAMPLES; ++i) {
            if (encoded.statuses[i] != UFORM_FORMAT)
                fail_msg("scalar %d, text %zu: status %s", (int)scalars[s], i,
                         uform_status_name(encoded.statuses[i]));
            assert_zero_item(&encoded, i);
        }
        uform_arena_free(arena);
    }
    uform_model_free(infinite);
}

int main(void) {
    struct CMUnitTest const tests[] = {
        cmocka_unit_test(outputs_have_their_shapes),
        cmocka_unit_test(bitwise_identical_across_receivers),
        cmocka_unit_test(a_text_does_not_depend_on_its_batch),
        cmocka_unit_test(conversions_and_matryoshka),
        cmocka_unit_test(progress_and_cancel),
        cmocka_unit_test(bad_input_leaves_everything_usable),
        cmocka_unit_test(choose_gives_probabilities),
        cmocka_unit_test(non_finite_output_has_status),
    };
    printf("kernels: %s\n", kernels_active()->name);
    return cmocka_run_group_tests(tests, setup, fixture_teardown);
}
