/* The suites' shared fixtures and checks: see fixtures.h. */
#include "fixtures.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- Seeded random numbers ------------------------------------------------------------------------ */

static uint64_t random_state;

void random_seed(uint64_t seed) {
    random_state = seed;
}

uint64_t random_bits(void) { /* splitmix64 */
    uint64_t z = (random_state += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

float random_uniform(float low, float high) {
    return low + (high - low) * (float)((double)(random_bits() >> 40) * 0x1p-24);
}

size_t random_below(size_t bound) {
    return (size_t)(random_bits() % bound);
}

/* ---- The suite's folder and model ----------------------------------------------------------------- */

static char folder[256], checkpoint[300];
static uform_model_t **loaded; /* the suite's model, freed by fixture_teardown */

error_text_t last_error_text(void) {
    error_text_t rendered;
    uform_error_t error = uform_last_error();
    uform_error_render(&error, rendered.text, sizeof rendered.text);
    return rendered;
}

__attribute__((noinline)) void stack_paint(unsigned char byte) {
    volatile unsigned char below[1u << 16];
    for (size_t i = 0; i < sizeof below; ++i)
        below[i] = byte;
}

int fixture_setup(char const *suite, uform_tiny_checkpoint_args_t *tiny, uform_model_t **model,
                  uform_model_info_t *info) {
    char const *temporary = getenv("TMPDIR");
    snprintf(folder, sizeof folder, "%s/uform-%s-XXXXXX", temporary && *temporary ? temporary : "/tmp",
             suite);
    if (!mkdtemp(folder)) {
        perror(folder);
        return -1;
    }
    fixture_path("tiny.safetensors", checkpoint, sizeof checkpoint);
    if (!tiny->path) tiny->path = checkpoint;
    if (uform_tiny_checkpoint(tiny) != UFORM_OK) {
        fprintf(stderr, "uform_tiny_checkpoint: %s\n", last_error_text().text);
        return -1;
    }
    if (!model) return 0;
    loaded = model;
    uform_model_load_args_t load = {.path = tiny->path, .model = model};
    if (uform_model_load_ram(&load) != UFORM_OK || uform_model_info(*model, info) != UFORM_OK) {
        fprintf(stderr, "loading %s: %s\n", tiny->path, last_error_text().text);
        return -1;
    }
    return 0;
}

int fixture_teardown(void **state) {
    (void)state;
    if (loaded) uform_model_free(*loaded);
    char command[600];
    snprintf(command, sizeof command, "rm -rf '%s'", folder);
    return system(command) == 0 ? 0 : -1;
}

void fixture_path(char const *name, char *path, size_t capacity) {
    snprintf(path, capacity, "%s/%s", folder, name);
}

uform_executor_t *ram_executor(size_t threads, bool pin) {
    uform_ram_options_t options = uform_ram_options_default();
    options.threads = threads;
    options.pin = pin;
    uform_executor_t *executor = NULL;
    assert_int_equal(uform_executor_create_ram(&options, &executor), UFORM_OK);
    return executor;
}

uform_arena_t *arena_on_host(void) {
    uform_arena_t *arena = NULL;
    assert_int_equal(uform_arena_create_host(&arena), UFORM_OK);
    return arena;
}

/* ---- Receivers and progress ------------------------------------------------------------------------ */

uform_executor_t *receiver_make(receiver_t receiver, uform_pool_vtable_t const *vtable, void *pool) {
    uform_executor_t *executor = NULL;
    uform_ram_options_t options = uform_ram_options_default();
    size_t domain = 0;
    switch (receiver) {
    case RECEIVER_THREAD:
        return NULL;
    case RECEIVER_INLINE:
        assert_int_equal(uform_executor_create_inline(&executor), UFORM_OK);
        break;
    case RECEIVER_RAM:
        assert_int_equal(uform_executor_create_ram(NULL, &executor), UFORM_OK);
        break;
    case RECEIVER_RAM_TWO:
        options.threads = 2;
        assert_int_equal(uform_executor_create_ram(&options, &executor), UFORM_OK);
        break;
    case RECEIVER_RAM_DOMAIN:
        options.domains = &domain;
        options.domains_count = uform_features() & UFORM_FEATURE_HWLOC ? 1 : 0; /* bound where built */
        assert_int_equal(uform_executor_create_ram(&options, &executor), UFORM_OK);
        break;
    case RECEIVER_POOL:
        assert_int_equal(uform_executor_create_pool(vtable, pool, &executor), UFORM_OK);
        break;
    }
    assert_non_null(executor);
    return executor;
}

uform_continuation_t count_progress(void *state, size_t completed, size_t total) {
    progress_counter_t *counter = state;
    assert_true(completed >= counter->last && completed <= total);
    counter->calls++;
    counter->last = completed;
    counter->total = total;
    bool cancel = counter->cancel_halfway ? 2 * completed >= total
                                          : counter->cancel_at && completed >= counter->cancel_at;
    return cancel ? UFORM_CANCEL : UFORM_CONTINUE;
}

/* ---- Files ---------------------------------------------------------------------------------------- */

blob_t blob_copy(void const *data, size_t size) {
    blob_t blob = {malloc(size ? size : 1), size};
    assert_non_null(blob.data);
    if (size) memcpy(blob.data, data, size);
    return blob;
}

blob_t blob_read(char const *path) {
    FILE *file = fopen(path, "rb");
    assert_non_null(file);
    assert_int_equal(fseek(file, 0, SEEK_END), 0);
    long size = ftell(file);
    assert_true(size >= 0);
    assert_int_equal(fseek(file, 0, SEEK_SET), 0);
    blob_t blob = {malloc((size_t)size + 1), (size_t)size};
    assert_non_null(blob.data);
    assert_int_equal(fread(blob.data, 1, (size_t)size, file), (size_t)size);
    assert_int_equal(fclose(file), 0);
    return blob;
}

void blob_write(char const *name, blob_t const *blob) {
    char path[512];
    fixture_path(name, path, sizeof path);
    FILE *file = fopen(path, "wb");
    assert_non_null(file);
    assert_int_equal(fwrite(blob->data, 1, blob->size, file), blob->size);
    assert_int_equal(fclose(file), 0);
}

void sparse_write(char const *name, size_t size) {
    char path[512];
    fixture_path(name, path, sizeof path);
    FILE *file = fopen(path, "wb");
    assert_non_null(file);
    assert_int_equal(fclose(file), 0);
    assert_int_equal(truncate(path, (off_t)size), 0);
}

void cases_write(file_case_t const *cases, size_t n) {
    for (size_t i = 0; i < n; ++i)
        if (cases[i].blob.data) blob_write(cases[i].name, &cases[i].blob);
}

static void cases_free(file_case_t *cases, size_t n) {
    for (size_t i = 0; i < n; ++i)
        free(cases[i].blob.data);
}

/* ---- Batches -------------------------------------------------------------------------------------- */

static size_t element_size(batch_t const *batch) {
    return batch->kind == BATCH_SAMPLES ? sizeof(float) : 1;
}

batch_t *batch_new(batch_kind_t kind) {
    batch_t *batch = calloc(1, sizeof *batch);
    assert_non_null(batch);
    batch->kind = kind;
    batch->source = kind == BATCH_FILES ? UFORM_SOURCE_FILES : UFORM_SOURCE_MEMORY;
    return batch;
}

void batch_free(batch_t *batch) {
    free(batch->data);
    free(batch);
}

void batch_add(batch_t *batch, void const *data, size_t elements) {
    assert_true(batch->count < BATCH_MAX);
    size_t size = elements * element_size(batch);
    batch->data = realloc(batch->data, batch->bytes + size + sizeof(float));
    assert_non_null(batch->data);
    if (size) memcpy(batch->data + batch->bytes, data, size);
    batch->bytes += size;
    batch->offsets[++batch->count] = batch->bytes / element_size(batch);
}

void batch_add_path(batch_t *batch, char const *name) {
    char path[512];
    fixture_path(name, path, sizeof path);
    batch_add(batch, path, strlen(path));
}

void batch_add_pixels(batch_t *batch, void const *rgb, size_t bytes, size_t height, size_t width) {
    assert_true(batch->count < BATCH_MAX);
    batch->heights[batch->count] = height;
    batch->widths[batch->count] = width;
    batch_add(batch, rgb, bytes);
}

uform_tape_t batch_tape(batch_t const *batch) {
    return (uform_tape_t){batch->data, batch->offsets, batch->count, batch->bytes / element_size(batch)};
}

/* ---- Comparisons ---------------------------------------------------------------------------------- */

void const *row_of(uform_view_t const *view, size_t row) {
    return (unsigned char const *)view->data + row * view->row_stride;
}

static double dot_of(float const *a, float const *b, size_t n) {
    double sum = 0;
    for (size_t i = 0; i < n; ++i)
        sum += (double)a[i] * b[i];
    return sum;
}

double norm_of(float const *x, size_t n) {
    return sqrt(dot_of(x, x, n));
}

float float_of_half(uint16_t bits) {
    uint32_t const sign = (uint32_t)(bits >> 15) << 31, exponent = (bits >> 10) & 0x1f,
                   mantissa = bits & 0x3ff;
    if (exponent == 0) { /* zero and subnormals: mantissa * 2^-24, exact in F32 */
        float const magnitude = (float)mantissa * 0x1p-24f;
        return sign ? -magnitude : magnitude;
    }
    uint32_t const wide = exponent == 0x1f ? sign | 0x7f800000u | mantissa << 13 /* infinities, NaNs */
                                           : sign | (exponent + 112) << 23 | mantissa << 13;
    float value;
    memcpy(&value, &wide, sizeof value);
    return value;
}

double cosine_of(float const *a, float const *b, size_t n) {
    double aa = dot_of(a, a, n), bb = dot_of(b, b, n);
    if (aa == 0 && bb == 0) return 1;
    return dot_of(a, b, n) / sqrt(aa * bb);
}

/* Rows of item `i` in a view: [first, first + count). */
static void item_rows(uform_view_t const *view, size_t i, size_t *first, size_t *count) {
    *first = view->item_offsets ? view->item_offsets[i] : i;
    *count = view->item_offsets ? view->item_offsets[i + 1] - *first : 1;
}

void assert_same_item(uform_encoded_t const *a, size_t i, uform_encoded_t const *b, size_t j) {
    assert_int_equal(a->statuses[i], b->statuses[j]);
    uform_view_t const *as[] = {&a->embeddings, &a->states, &a->token_vectors};
    uform_view_t const *bs[] = {&b->embeddings, &b->states, &b->token_vectors};
    for (size_t v = 0; v < 3; ++v) {
        if (!as[v]->data) continue;
        size_t a_first, a_count, b_first, b_count;
        item_rows(as[v], i, &a_first, &a_count);
        item_rows(bs[v], j, &b_first, &b_count);
        assert_int_equal(a_count, b_count);
        if (a_count)
            assert_memory_equal(row_of(as[v], a_first), row_of(bs[v], b_first), a_count * as[v]->row_stride);
    }
}

void assert_zero_item(uform_encoded_t const *encoded, size_t i) {
    uform_view_t const *views[] = {&encoded->embeddings, &encoded->states, &encoded->token_vectors};
    for (size_t v = 0; v < 3; ++v) {
        if (!views[v]->data) continue;
        size_t first, count;
        item_rows(views[v], i, &first, &count);
        unsigned char const *bytes = count ? row_of(views[v], first) : NULL;
        for (size_t k = 0; k < count * views[v]->row_stride; ++k)
            assert_int_equal(bytes[k], 0);
    }
}

/* Every row of every output of `full` converted to `scalar` is the row of `converted`. */
static void assert_converted(uform_encoded_t const *full, uform_encoded_t const *converted,
                             uform_scalar_t scalar, convert_t convert) {
    uform_view_t const *pairs[][2] = {{&full->embeddings, &converted->embeddings},
                                      {&full->states, &converted->states},
                                      {&full->token_vectors, &converted->token_vectors}};
    for (size_t v = 0; v < 3; ++v) {
        uform_view_t const *from = pairs[v][0], *to = pairs[v][1];
        if (!from->data) continue;
        assert_int_equal(to->scalar, scalar);
        assert_int_equal(to->rows, from->rows);
        unsigned char *expected = malloc(from->columns * sizeof(float));
        assert_non_null(expected);
        for (size_t row = 0; row < from->rows; ++row) {
            float scale = 0;
            convert(expected, row_of(from, row), from->columns, scalar, &scale);
            assert_memory_equal(row_of(to, row), expected, from->columns * uform_scalar_size(scalar));
            if (scalar == UFORM_I8) assert_true(to->scales[row] == scale);
        }
        free(expected);
    }
}

static void assert_matryoshka_prefix(uform_encoded_t const *full, uform_encoded_t const *narrow,
                                     size_t width) {
    assert_int_equal(narrow->embeddings.columns, width);
    if (narrow->token_vectors.data) assert_int_equal(narrow->token_vectors.columns, width);
    for (size_t row = 0; row < full->items; ++row) {
        if (full->statuses[row] != UFORM_OK) continue;
        float const *prefix = row_of(&full->embeddings, row), *short_row = row_of(&narrow->embeddings, row);
        double prefix_norm = norm_of(prefix, width);
        for (size_t j = 0; j < width; ++j)
            assert_true(fabs(prefix[j] / prefix_norm - short_row[j]) < 1e-5);
    }
}

/* ---- Checks every encode verb passes ---------------------------------------------------------------- */

size_t encode_copy(batch_encode_t encode, batch_t const *batch, uform_executor_t *executor, bool deferred,
                   unsigned char *copy) {
    uform_arena_t *arena = arena_on_host();
    uform_encoded_t encoded;
    uform_outcome_t outcome;
    uform_outcome_init(&outcome);
    assert_int_equal(encode(batch, executor, EVERYTHING, arena, NULL, deferred ? &outcome : NULL, &encoded),
                     UFORM_OK);
    if (deferred) {
        assert_int_equal(uform_outcome_wait(&outcome), UFORM_OK);
        assert_int_equal(uform_outcome_encoded(&outcome, &encoded), UFORM_OK);
    }
    size_t bytes = 0;
    uform_view_t const *views[] = {&encoded.embeddings, &encoded.token_vectors, &encoded.states};
    for (size_t v = 0; v < 3; ++v) {
        memcpy(copy + bytes, views[v]->data, views[v]->rows * views[v]->row_stride);
        bytes += views[v]->rows * views[v]->row_stride;
    }
    memcpy(copy + bytes, encoded.statuses, encoded.items * sizeof *encoded.statuses);
    bytes += encoded.items * sizeof *encoded.statuses;
    uform_outcome_destroy(&outcome);
    uform_arena_free(arena);
    return bytes;
}

void assert_same_on_every_receiver(batch_encode_t encode, batch_t const *batch, batch_t const *twin) {
    if (!twin) twin = batch;
    size_t capacity = 1 << 22;
    unsigned char *reference = malloc(capacity), *other = malloc(capacity);
    assert_non_null(reference);
    assert_non_null(other);
    size_t bytes = encode_copy(encode, batch, NULL, false, reference);
    assert_true(bytes < capacity);
    assert_int_equal(encode_copy(encode, twin, NULL, false, other), bytes);
    assert_memory_equal(reference, other, bytes);
    for (size_t threads = 1; threads <= 3; ++threads) {
        uform_executor_t *executor = ram_executor(threads, true);
        for (int deferred = 0; deferred < 2; ++deferred) {
            assert_int_equal(encode_copy(encode, deferred ? twin : batch, executor, deferred, other), bytes);
            assert_memory_equal(reference, other, bytes);
        }
        uform_executor_free(executor);
    }
    uform_executor_t *executor = NULL;
    assert_int_equal(uform_executor_create_inline(&executor), UFORM_OK);
    assert_int_equal(encode_copy(encode, twin, executor, true, other), bytes);
    assert_memory_equal(reference, other, bytes);
    uform_executor_free(executor);
    free(reference);
    free(other);
}

/* assert_progress_and_cancel on one receiver. */
static void check_progress(batch_encode_t encode, batch_t const *batch, uform_executor_t *executor,
                           uform_status_t expected) {
    uform_arena_t *arena = arena_on_host();
    progress_counter_t counter = {0};
    uform_encode_config_t config = {.progress = {count_progress, &counter, 4}};
    uform_encoded_t encoded;
    assert_int_equal(encode(batch, executor, UFORM_OUTPUT_EMBEDDINGS, arena, &config, NULL, &encoded),
                     UFORM_OK);
    assert_true(counter.calls >= 2 && counter.calls <= 4);
    assert_int_equal(counter.last, batch->count);
    counter = (progress_counter_t){.cancel_at = 1};
    assert_int_equal(encode(batch, executor, UFORM_OUTPUT_EMBEDDINGS, arena, &config, NULL, &encoded),
                     UFORM_CANCELLED);
    assert_true(counter.last < batch->count);
    config.progress.handler = NULL;
    assert_int_equal(encode(batch, executor, UFORM_OUTPUT_EMBEDDINGS, arena, &config, NULL, &encoded),
                     UFORM_OK);
    for (size_t i = 0; i < batch->count; ++i)
        assert_int_equal(encoded.statuses[i], expected);
    uform_arena_free(arena);
}

void assert_progress_and_cancel(batch_encode_t encode, batch_t const *batch, uform_status_t expected) {
    check_progress(encode, batch, NULL, expected);
    uform_executor_t *ram = ram_executor(2, true);
    check_progress(encode, batch, ram, expected);
    uform_executor_free(ram);
}

void assert_sources_checked(batch_encode_t encode, uform_status_t expected, char const *why) {
    batch_t *batch = batch_new(BATCH_FILES);
    batch_add_path(batch, "absent");
    batch->source = (uform_source_t)7;
    uform_arena_t *arena = arena_on_host();
    uform_encoded_t encoded;
    assert_int_equal(encode(batch, NULL, UFORM_OUTPUT_EMBEDDINGS, arena, NULL, NULL, &encoded),
                     UFORM_INVALID_ARGUMENT);
    assert_string_equal(uform_last_error().message, "unknown source");
    uform_outcome_t outcome;
    uform_outcome_init(&outcome);
    assert_int_equal(encode(batch, NULL, UFORM_OUTPUT_EMBEDDINGS, arena, NULL, &outcome, &encoded),
                     UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_outcome_status(&outcome), UFORM_INVALID_ARGUMENT);
    batch->source = UFORM_SOURCE_FILES;
    assert_int_equal(encode(batch, NULL, UFORM_OUTPUT_EMBEDDINGS, arena, NULL, &outcome, &encoded), expected);
    if (expected == UFORM_OK) {
        assert_int_equal(uform_outcome_wait(&outcome), UFORM_OK);
        assert_int_equal(uform_outcome_encoded(&outcome, &encoded), UFORM_OK);
        assert_int_equal(encoded.statuses[0], UFORM_IO); /* no such file: the call itself worked */
    } else {
        assert_int_equal(uform_outcome_status(&outcome), expected);
        assert_string_equal(uform_last_error().message, why);
    }
    uform_outcome_destroy(&outcome);
    uform_arena_free(arena);
    batch_free(batch);
}

void assert_items_fail_alone(batch_encode_t encode, batch_t const *batch, uform_status_t const *expected,
                             uform_executor_t *executor) {
    uform_arena_t *arena = arena_on_host(), *single_arena = arena_on_host();
    uform_encoded_t together, alone;
    uform_encode_stats_t stats;
    uform_encode_config_t config = {.stats = &stats};
    assert_int_equal(encode(batch, executor, EVERYTHING, arena, &config, NULL, &together), UFORM_OK);
    size_t failed = 0, element = element_size(batch);
    for (size_t i = 0; i < batch->count; ++i) {
        size_t begin = batch->offsets[i], length = batch->offsets[i + 1] - begin;
        if (together.statuses[i] != expected[i])
            fail_msg("item %zu (%.*s): %s, expected %s", i, (int)length,
                     batch->kind == BATCH_FILES ? (char const *)batch->data + begin : "in memory",
                     uform_status_name(together.statuses[i]), uform_status_name(expected[i]));
        if (expected[i] != UFORM_OK) {
            failed++;
            assert_zero_item(&together, i);
        }
        batch_t *solo = batch_new(batch->kind);
        solo->rate = batch->rate;
        solo->heights[0] = batch->heights[i];
        solo->widths[0] = batch->widths[i];
        batch_add(solo, batch->data + begin * element, length);
        assert_int_equal(encode(solo, executor, EVERYTHING, single_arena, NULL, NULL, &alone), UFORM_OK);
        assert_same_item(&together, i, &alone, 0);
        batch_free(solo);
    }
    assert_int_equal(stats.failed, failed);
    assert_int_equal(stats.items, batch->count);
    uform_arena_free(arena);
    uform_arena_free(single_arena);
}

uform_status_t text_encode_verb(void const *args) {
    return uform_text_encode(args);
}

uform_status_t image_encode_verb(void const *args) {
    return uform_image_encode(args);
}

uform_status_t image_encode_pixels_verb(void const *args) {
    return uform_image_encode_pixels(args);
}

uform_status_t audio_encode_samples_verb(void const *args) {
    return uform_audio_encode_samples(args);
}

void assert_bad_arguments(verb_t verb, void const *good, void const *bad, size_t size,
                          char const *const *what, size_t count, uform_status_t expected) {
    assert_int_equal(verb(NULL), UFORM_INVALID_ARGUMENT);
    for (size_t i = 0; i < count; ++i) {
        uform_status_t status = verb((unsigned char const *)bad + i * size);
        if (status != UFORM_INVALID_ARGUMENT) fail_msg("%s: %s", what[i], uform_status_name(status));
        assert_int_equal(verb(good), expected);
    }
}

void assert_conversions_and_matryoshka(batch_encode_t encode, batch_t const *batch, uform_outputs_t outputs,
                                       uform_model_info_t const *info, convert_t convert) {
    uform_arena_t *full_arena = arena_on_host(), *arena = arena_on_host();
    uform_encoded_t full, other;
    assert_int_equal(encode(batch, NULL, outputs, full_arena, NULL, NULL, &full), UFORM_OK);
    uform_scalar_t const kinds[] = {UFORM_BF16, UFORM_F16, UFORM_I8};
    for (size_t k = 0; k < 3; ++k) {
        uform_encode_config_t config = {.outputs_scalar = kinds[k]};
        assert_int_equal(encode(batch, NULL, outputs, arena, &config, NULL, &other), UFORM_OK);
        assert_converted(&full, &other, kinds[k], convert);
    }
    for (size_t m = 0; m < info->matryoshka_count; ++m) {
        uform_encode_config_t config = {.matryoshka = info->matryoshka[m]};
        assert_int_equal(encode(batch, NULL, outputs, arena, &config, NULL, &other), UFORM_OK);
        assert_matryoshka_prefix(&full, &other, info->matryoshka[m]);
    }
    uform_arena_free(full_arena);
    uform_arena_free(arena);
}

void assert_cases_fail_alone(batch_encode_t encode, make_cases_t make) {
    file_case_t cases[CASES_MAX];
    size_t n = make(cases), good = n;
    batch_t *files = batch_new(BATCH_FILES), *memory = batch_new(BATCH_MEMORY);
    uform_status_t file_expected[BATCH_MAX], memory_expected[BATCH_MAX];
    for (size_t i = 0; i < n; ++i) {
        file_expected[files->count] = cases[i].expected;
        batch_add_path(files, cases[i].name);
        if (cases[i].file_only) continue;
        if (good == n && cases[i].expected == UFORM_OK) good = i;
        memory_expected[memory->count] = cases[i].expected;
        batch_add(memory, cases[i].blob.data, cases[i].blob.size);
    }
    file_expected[files->count] = UFORM_IO;
    batch_add_path(files, "absent");
    file_expected[files->count] = UFORM_IO;
    batch_add_path(files, ".");
    file_expected[files->count] = UFORM_INVALID_ARGUMENT; /* refused before opening */
    batch_add(files, "", 0);
    file_expected[files->count] = UFORM_INVALID_ARGUMENT;
    batch_add(files, "a\0b", 3);
    uform_executor_t *ram = ram_executor(2, true);
    uform_executor_t *executors[] = {NULL, ram};
    for (size_t e = 0; e < 2; ++e) {
        assert_items_fail_alone(encode, files, file_expected, executors[e]);
        assert_items_fail_alone(encode, memory, memory_expected, executors[e]);
    }

    /* The executor still works after all that, deferred, on a good item (none in builds without the
     * decoders, where every file answers UNSUPPORTED: then the loops above were the check). */
    if (good == n) {
        uform_executor_free(ram);
        batch_free(files);
        batch_free(memory);
        cases_free(cases, n);
        return;
    }
    batch_t *again = batch_new(BATCH_MEMORY);
    batch_add(again, cases[good].blob.data, cases[good].blob.size);
    uform_arena_t *arena = NULL;
    assert_int_equal(uform_arena_create(ram, &arena), UFORM_OK);
    uform_outcome_t outcome;
    uform_outcome_init(&outcome);
    uform_encoded_t encoded;
    assert_int_equal(encode(again, ram, EVERYTHING, arena, NULL, &outcome, NULL), UFORM_OK);
    assert_int_equal(uform_outcome_wait(&outcome), UFORM_OK);
    assert_int_equal(uform_outcome_encoded(&outcome, &encoded), UFORM_OK);
    assert_int_equal(encoded.statuses[0], UFORM_OK);
    uform_outcome_destroy(&outcome);
    uform_arena_free(arena);
    uform_executor_free(ram);
    batch_free(again);
    batch_free(files);
    batch_free(memory);
    cases_free(cases, n);
}

void assert_chunked_reads(batch_encode_t encode, make_cases_t make) {
    file_case_t cases[CASES_MAX];
    size_t n = make(cases);
    batch_t *files = batch_new(BATCH_FILES);
    while (files->count < 150)
        batch_add_path(files, cases[files->count % n].name);
    uform_executor_t *ram = ram_executor(2, true);
    uform_executor_t *executors[] = {NULL, ram};
    for (size_t e = 0; e < 2; ++e) {
        uform_arena_t *arena = arena_on_host();
        uform_encoded_t encoded;
        assert_int_equal(encode(files, executors[e], EVERYTHING, arena, NULL, NULL, &encoded), UFORM_OK);
        for (size_t i = 0; i < files->count; ++i) {
            if (encoded.statuses[i] != cases[i % n].expected)
                fail_msg("item %zu (%s): %s, expected %s", i, cases[i % n].name,
                         uform_status_name(encoded.statuses[i]), uform_status_name(cases[i % n].expected));
            assert_same_item(&encoded, i, &encoded, i % n);
        }
        uform_arena_free(arena);
    }
    uform_executor_free(ram);
    batch_free(files);
    cases_free(cases, n);
}

void test_cases_fail_alone(void **state) {
    file_cases_t const *cases = *state;
    assert_cases_fail_alone(cases->encode, cases->make);
}

void test_chunked_reads(void **state) {
    file_cases_t const *cases = *state;
    assert_chunked_reads(cases->encode, cases->make);
}
