/* VRAM executors, device arenas and models against the CPU path on the same checkpoint.
 *
 * Without a CUDA device (every CI machine) the tests that need one are skipped with the reason, and
 * what must hold anyway is checked: creating a VRAM executor answers UFORM_DEVICE (or UNSUPPORTED in
 * builds without CUDA), a VRAM load refuses host executors, and nothing leaks. On a GPU machine
 * (bench/gpu_check.sh) every check runs: embeddings, token vectors and states of every scalar kind at
 * cosine >= 0.999 to a RAM executor's, for texts, pixels, images from files and from memory, clips and
 * sounds (files written by `uform dataset synth`, whose path is the program's argument, and samples),
 * with failing items among them answering the statuses the RAM executor answers; text_choose, device
 * views refusing host access, copy-out, stale views, cancellation, contention, a bad device ordinal; an
 * executor over two devices (where there are two) against the RAM executor; and pixels from pinned and
 * from device memory bitwise equal to the same pixels in pageable memory. */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"
#include "uform_config.h"

static char const *checkpoint;
static char base_checkpoint[512];
static char const *uform_command; /* the `uform` command, which writes the media files */
static bool have_device, have_media;
static uform_executor_t *vram, *ram;
static uform_model_t *vram_model, *ram_model;

/* Media files in the folder's synth/media/: 12 PNG images, 4 MP4 clips, 4 WAV sounds, as `uform dataset
 * synth` writes them (clips and sounds only where the build has FFmpeg). */
static bool media_write(void) {
    char folder[512], command[2048];
    fixture_path("synth", folder, sizeof folder);
    if (!uform_command) {
        fprintf(stderr, "no `uform` command given: the media checks skip\n");
        return false;
    }
    snprintf(command, sizeof command,
             "'%s' dataset synth --out '%s' --images 12 --videos 4 --sounds 4 --seed 1 --image-size 48 "
             "--video-frames 6 > /dev/null",
             uform_command, folder);
    return system(command) == 0;
}

static int setup(void **state) {
    (void)state;
    uform_tiny_checkpoint_args_t tiny = {.seed = 7, .depth = 2, .hidden = 128, .context = 96};
    if (fixture_setup("vram", &tiny, NULL, NULL) != 0) return -1;
    checkpoint = tiny.path;
    have_device = uform_executor_create_vram(NULL, &vram) == UFORM_OK;
    if (!have_device) {
        fprintf(stderr, "no VRAM executor here, device tests skip: %s\n", last_error_text().text);
        return 0;
    }
    /* A deeper, wider one, where BF16 rounding accumulates as in real models. */
    fixture_path("base.safetensors", base_checkpoint, sizeof base_checkpoint);
    uform_tiny_checkpoint_args_t base = {
        .path = base_checkpoint, .seed = 5, .depth = 6, .hidden = 384, .context = 200};
    if (uform_tiny_checkpoint(&base) != UFORM_OK) return -1;
    ram = ram_executor(2, false);
    uform_model_load_args_t load = {.executor = vram, .path = checkpoint, .model = &vram_model};
    if (uform_model_load_vram(&load) != UFORM_OK) {
        fprintf(stderr, "load_vram failed: %s\n", last_error_text().text);
        return -1;
    }
    load = (uform_model_load_args_t){.executor = ram, .path = checkpoint, .model = &ram_model};
    have_media = media_write();
    return uform_model_load_ram(&load) == UFORM_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    uform_model_free(vram_model);
    uform_model_free(ram_model);
    uform_executor_free(vram);
    uform_executor_free(ram);
    return fixture_teardown(state);
}

#define NEED_DEVICE()                                                                                        \
    do {                                                                                                     \
        if (!have_device) skip();                                                                            \
    } while (0)

/* ---- Without a device, too ---------------------------------------------------------------------- */

static void test_create_without_device_or_bad_ordinal(void **state) {
    (void)state;
    uform_executor_t *executor = NULL;
    size_t devices[] = {4096};
    uform_vram_options_t options = {.devices = devices, .devices_count = 1};
    uform_status_t status = uform_executor_create_vram(&options, &executor);
    assert_null(executor);
    assert_true(status == UFORM_DEVICE || status == UFORM_UNSUPPORTED);
    assert_int_equal(uform_last_error().status, status);
    assert_int_equal(uform_executor_create_vram(NULL, NULL), UFORM_INVALID_ARGUMENT);
    uform_vram_options_t broken = {.devices = NULL, .devices_count = 2};
    assert_int_equal(uform_executor_create_vram(&broken, &executor), UFORM_INVALID_ARGUMENT);
}

/* Options that are wrong whatever the machine are refused before the driver is asked: a device listed
 * twice, more than 16 devices, NULL devices with a count. A machine without a driver answered
 * UFORM_DEVICE for them, one with a driver UFORM_INVALID_ARGUMENT; and a build without CUDA answered
 * UFORM_UNSUPPORTED (vram_options_checked_only_with_cuda), though the header has arguments checked first:
 * UFORM_INVALID_ARGUMENT in every build. */
static void test_bad_options_refused_before_the_driver(void **state) {
    (void)state;
    uform_executor_t *executor = NULL;
    size_t twice[] = {0, 0}, many[17] = {0};
    for (size_t i = 0; i < 17; ++i)
        many[i] = i;
    uform_vram_options_t options = {.devices = twice, .devices_count = 2};
    assert_int_equal(uform_executor_create_vram(&options, &executor), UFORM_INVALID_ARGUMENT);
    assert_string_equal(uform_last_error().message, "a device is listed twice");
    options = (uform_vram_options_t){.devices = many, .devices_count = 17};
    assert_int_equal(uform_executor_create_vram(&options, &executor), UFORM_INVALID_ARGUMENT);
    assert_string_equal(uform_last_error().message, "more than 16 devices");
    options = (uform_vram_options_t){.devices = NULL, .devices_count = 1};
    assert_int_equal(uform_executor_create_vram(&options, &executor), UFORM_INVALID_ARGUMENT);
    assert_null(executor);
}

static void test_load_vram_needs_vram_executor(void **state) {
    (void)state;
    uform_model_t *model = NULL;
    uform_model_load_args_t load = {.executor = NULL, .path = checkpoint, .model = &model};
    uform_status_t status = uform_model_load_vram(&load);
    assert_true(status == UFORM_INVALID_ARGUMENT || status == UFORM_UNSUPPORTED);
    assert_null(model);
    uform_outcome_t outcome;
    uform_outcome_init(&outcome);
    load.outcome = &outcome;
    assert_int_equal(uform_model_load_vram(&load), status);
    assert_int_equal(uform_outcome_status(&outcome), status);
    uform_outcome_destroy(&outcome);
}

/* The VRAM load's front door answers alike in builds with and without CUDA: an empty path first, then
 * (without CUDA) UNSUPPORTED, or (with it) the executor's kind, each with its message and entry. */
static void test_load_vram_refusals(void **state) {
    (void)state;
    uform_model_t *model = NULL;
    uform_model_load_args_t load = {.path = "", .model = &model};
    assert_int_equal(uform_model_load_vram(&load), UFORM_INVALID_ARGUMENT);
    assert_string_equal(uform_last_error().entry, "uform_model_load_vram");
    assert_string_equal(uform_last_error().message, "path is NULL or empty");
    load.path = checkpoint;
    bool cuda = uform_features() & UFORM_FEATURE_CUDA;
    assert_int_equal(uform_model_load_vram(&load), cuda ? UFORM_INVALID_ARGUMENT : UFORM_UNSUPPORTED);
    assert_string_equal(uform_last_error().message,
                        cuda ? "uform_model_load_vram needs a VRAM executor" : "built without CUDA");
    assert_null(model);
}

/* ---- Helpers ------------------------------------------------------------------------------------ */

static char const *const texts[] = {
    "a cat sits on the mat",
    "",
    "x",
    ("The quick brown fox jumps over the lazy dog, again and again, until the text is longer than the "
     "context of the tiny model so that it is cut and counted as truncated by both paths."),
    "embeddings on the GPU",
    "\xff\x00\x01 bytes, not characters",
};
#define TEXTS (sizeof texts / sizeof *texts)

static uform_tape_t text_tape(size_t *offsets, char *buffer, size_t count) {
    size_t at = 0;
    offsets[0] = 0;
    for (size_t i = 0; i < count; ++i) {
        size_t length = i == 5 ? 23 : strlen(texts[i % TEXTS]);
        memcpy(buffer + at, texts[i % TEXTS], length);
        at += length;
        offsets[i + 1] = at;
    }
    return (uform_tape_t){.data = buffer, .offsets = offsets, .count = count, .length = at};
}

/* `count` texts (text_tape) in buffers of their own; text_batch_free frees them. */
typedef struct text_batch {
    size_t *offsets;
    char *buffer;
    uform_tape_t tape;
} text_batch_t;

static text_batch_t text_batch(size_t count) {
    text_batch_t batch = {.offsets = malloc((count + 1) * sizeof(size_t)), .buffer = malloc(count * 256)};
    assert_non_null(batch.offsets);
    assert_non_null(batch.buffer);
    batch.tape = text_tape(batch.offsets, batch.buffer, count);
    return batch;
}

static void text_batch_free(text_batch_t *batch) {
    free(batch->offsets);
    free(batch->buffer);
}

/* An arena of `executor`; the caller frees it. */
static uform_arena_t *arena_of(uform_executor_t *executor) {
    uform_arena_t *arena = NULL;
    assert_int_equal(uform_arena_create(executor, &arena), UFORM_OK);
    return arena;
}

/* The arguments of a blocking text_encode of `tape` on `executor` with `model`, into `arena` and
 * `encoded`; a test sets the rest. */
static uform_text_encode_args_t text_args(uform_model_t *model, uform_executor_t *executor,
                                          uform_outputs_t outputs, uform_arena_t *arena,
                                          uform_encoded_t *encoded, uform_tape_t tape) {
    return (uform_text_encode_args_t){.model = model,
                                      .executor = executor,
                                      .outputs = outputs,
                                      .arena = arena,
                                      .encoded = encoded,
                                      .texts = tape};
}

/* Rows of a view as F32 on the host (device views through uform_view_copy). */
static float *view_rows(uform_view_t const *view) {
    size_t size = uform_scalar_size(view->scalar), bytes = view->rows * view->columns * size;
    unsigned char *raw = malloc(bytes + 1);
    float *scales = malloc(view->rows * sizeof(float) + 1);
    float *out = malloc(view->rows * view->columns * sizeof(float) + 1);
    assert_non_null(raw);
    assert_non_null(out);
    assert_int_equal(uform_view_copy(view, raw, bytes, scales), UFORM_OK);
    for (size_t r = 0; r < view->rows; ++r)
        for (size_t c = 0; c < view->columns; ++c) {
            size_t i = r * view->columns + c;
            float value = 0;
            switch (view->scalar) {
            case UFORM_F32:
                memcpy(&value, raw + i * 4, 4);
                break;
            case UFORM_BF16: {
                uint16_t bits;
                memcpy(&bits, raw + i * 2, 2);
                uint32_t wide = (uint32_t)bits << 16;
                memcpy(&value, &wide, 4);
                break;
            }
            case UFORM_F16: {
                uint16_t bits;
                memcpy(&bits, raw + i * 2, 2);
                value = float_of_half(bits);
                break;
            }
            case UFORM_I8:
                value = (float)(int8_t)raw[i] * scales[r];
                break;
            case UFORM_U32: /* no tower writes it */
                fail_msg("a U32 view of embeddings");
            }
            out[i] = value;
        }
    free(raw);
    free(scales);
    return out;
}

/* Worst row cosine between two views of the same shape. */
static double worst_cosine(uform_view_t const *device, uform_view_t const *host) {
    assert_int_equal(device->rows, host->rows);
    assert_int_equal(device->columns, host->columns);
    float *a = view_rows(device), *b = view_rows(host);
    double worst = 1;
    for (size_t r = 0; r < host->rows; ++r) {
        double c = cosine_of(a + r * host->columns, b + r * host->columns, host->columns);
        if (c < worst) worst = c;
    }
    free(a);
    free(b);
    return worst;
}

/* Every output of the device's encoding at cosine >= 0.999 to the host's, row by row; the worst of each
 * printed after `what`. */
static void assert_outputs_agree(uform_encoded_t const *on_device, uform_encoded_t const *on_host,
                                 char const *what) {
    double embeddings = worst_cosine(&on_device->embeddings, &on_host->embeddings);
    double tokens = worst_cosine(&on_device->token_vectors, &on_host->token_vectors);
    double states = worst_cosine(&on_device->states, &on_host->states);
    fprintf(stderr, "  %s: worst cosine embeddings %.6f, token vectors %.6f, states %.6f\n", what, embeddings,
            tokens, states);
    assert_true(embeddings >= 0.999);
    assert_true(tokens >= 0.999);
    assert_true(states >= 0.999);
}

static void compare_models(uform_model_t *device_model, uform_model_t *host_model, size_t count,
                           uform_scalar_t scalar, size_t matryoshka) {
    text_batch_t batch = text_batch(count);
    uform_arena_t *device_arena = arena_of(vram), *host_arena = arena_of(ram);
    uform_encode_stats_t device_stats = {0}, host_stats = {0};
    uform_encode_config_t device_config = {
        .outputs_scalar = scalar, .matryoshka = matryoshka, .stats = &device_stats};
    uform_encode_config_t host_config = {
        .outputs_scalar = scalar, .matryoshka = matryoshka, .stats = &host_stats};
    uform_encoded_t on_device, on_host;
    uform_text_encode_args_t args =
        text_args(device_model, vram, EVERYTHING, device_arena, &on_device, batch.tape);
    args.config = &device_config;
    uform_status_t status = uform_text_encode(&args);
    if (status != UFORM_OK) fail_msg("VRAM text_encode: %s", last_error_text().text);
    args.model = host_model, args.executor = ram, args.arena = host_arena, args.config = &host_config;
    args.encoded = &on_host;
    assert_int_equal(uform_text_encode(&args), UFORM_OK);
    assert_true(on_device.embeddings.device);
    assert_int_equal(device_stats.truncated, host_stats.truncated);
    assert_int_equal(on_device.token_vectors.items, count);
    for (size_t i = 0; i <= count; ++i)
        assert_int_equal(on_device.token_vectors.item_offsets[i], on_host.token_vectors.item_offsets[i]);
    for (size_t i = 0; i < count; ++i)
        assert_int_equal(on_device.statuses[i], UFORM_OK);
    char what[96];
    snprintf(what, sizeof what, "%zu texts, scalar %d, width %zu", count, (int)scalar, matryoshka);
    assert_outputs_agree(&on_device, &on_host, what);
    uform_arena_free(device_arena);
    uform_arena_free(host_arena);
    text_batch_free(&batch);
}

/* ---- With a device ------------------------------------------------------------------------------ */

static void test_text_matches_cpu(void **state) {
    (void)state;
    NEED_DEVICE();
    uform_model_info_t info;
    assert_int_equal(uform_model_info(vram_model, &info), UFORM_OK);
    compare_models(vram_model, ram_model, TEXTS, UFORM_F32, 0);
    compare_models(vram_model, ram_model, 300, UFORM_F32, 0);
    compare_models(vram_model, ram_model, 17, UFORM_BF16, 0);
    compare_models(vram_model, ram_model, 17, UFORM_F16, 0);
    compare_models(vram_model, ram_model, 17, UFORM_I8, 0);
    if (info.matryoshka_count) compare_models(vram_model, ram_model, 9, UFORM_F32, info.matryoshka[0]);
}

static void test_base_model_matches_cpu(void **state) {
    (void)state;
    NEED_DEVICE();
    if (getenv("UFORM_VRAM_QUICK")) skip(); /* under compute-sanitizer: the tiny model is enough */
    uform_model_t *device_model = NULL, *host_model = NULL;
    uform_model_load_args_t load = {.executor = vram, .path = base_checkpoint, .model = &device_model};
    assert_int_equal(uform_model_load_vram(&load), UFORM_OK);
    load = (uform_model_load_args_t){.executor = ram, .path = base_checkpoint, .model = &host_model};
    assert_int_equal(uform_model_load_ram(&load), UFORM_OK);
    compare_models(device_model, host_model, 64, UFORM_F32, 0);
    uform_model_free(device_model);
    uform_model_free(host_model);
}

static void test_device_views(void **state) {
    (void)state;
    NEED_DEVICE();
    text_batch_t batch = text_batch(TEXTS);
    uform_arena_t *arena = arena_of(vram), *host_arena = arena_on_host();
    uform_encoded_t encoded;
    uform_text_encode_args_t args =
        text_args(vram_model, vram, UFORM_OUTPUT_EMBEDDINGS, arena, &encoded, batch.tape);
    assert_int_equal(uform_text_encode(&args), UFORM_OK);
    void const *row = NULL;
    assert_int_equal(uform_view_check(&encoded.embeddings), UFORM_DEVICE);
    assert_int_equal(uform_view_row(&encoded.embeddings, 0, &row), UFORM_DEVICE);
    assert_null(row);
    float small[4];
    assert_int_equal(uform_view_copy(&encoded.embeddings, small, sizeof small, NULL), UFORM_INVALID_ARGUMENT);
    /* Each embedding is unit length once copied out. */
    float *rows = view_rows(&encoded.embeddings);
    for (size_t r = 0; r < TEXTS; ++r) {
        double norm = 0;
        for (size_t c = 0; c < encoded.embeddings.columns; ++c)
            norm +=
                (double)rows[r * encoded.embeddings.columns + c] * rows[r * encoded.embeddings.columns + c];
        assert_true(fabs(norm - 1) < 1e-4);
    }
    free(rows);
    uform_view_t stale = encoded.embeddings;
    assert_int_equal(uform_text_encode(&args), UFORM_OK);
    float *copy = malloc(stale.rows * stale.columns * 4);
    assert_int_equal(uform_view_copy(&stale, copy, stale.rows * stale.columns * 4, NULL),
                     UFORM_INVALID_ARGUMENT);
    free(copy);
    /* Host arenas and host models do not mix with a VRAM executor. */
    args.arena = host_arena;
    assert_int_equal(uform_text_encode(&args), UFORM_INVALID_ARGUMENT);
    args.arena = arena, args.model = ram_model;
    assert_int_equal(uform_text_encode(&args), UFORM_INVALID_ARGUMENT);
    args.model = vram_model, args.executor = ram;
    assert_int_equal(uform_text_encode(&args), UFORM_INVALID_ARGUMENT);
    uform_arena_free(arena);
    uform_arena_free(host_arena);
    text_batch_free(&batch);
}

/* text_choose of `choices` over `states` on `executor` with `model`, into `arena`: the probabilities. */
static uform_view_t choose_on(uform_model_t *model, uform_executor_t *executor, uform_view_t const *states,
                              uform_tape_t choices, uform_arena_t *arena) {
    uform_view_t probabilities;
    uform_text_choose_args_t choose = {.model = model,
                                       .executor = executor,
                                       .states = states,
                                       .choices = choices,
                                       .arena = arena,
                                       .probabilities = &probabilities};
    assert_int_equal(uform_text_choose(&choose), UFORM_OK);
    return probabilities;
}

static void test_choose_matches_cpu(void **state) {
    (void)state;
    NEED_DEVICE();
    text_batch_t batch = text_batch(TEXTS);
    uform_arena_t *device_states = arena_of(vram), *device_out = arena_of(vram), *host_states = arena_of(ram),
                  *host_out = arena_of(ram);
    uform_encoded_t on_device, on_host;
    uform_text_encode_args_t args =
        text_args(vram_model, vram, UFORM_OUTPUT_STATES, device_states, &on_device, batch.tape);
    assert_int_equal(uform_text_encode(&args), UFORM_OK);
    args.model = ram_model, args.executor = ram, args.arena = host_states, args.encoded = &on_host;
    assert_int_equal(uform_text_encode(&args), UFORM_OK);
    uint8_t legal[TEXTS * 5];
    size_t legal_offsets[TEXTS + 1] = {0};
    for (size_t i = 0; i < TEXTS; ++i) {
        for (size_t j = 0; j < 5; ++j)
            legal[i * 5 + j] = (uint8_t)('a' + i + 7 * j);
        legal_offsets[i + 1] = (i + 1) * 5;
    }
    uform_tape_t choices = {.data = legal, .offsets = legal_offsets, .count = TEXTS, .length = sizeof legal};
    uform_view_t device_probabilities = choose_on(vram_model, vram, &on_device.states, choices, device_out);
    uform_view_t host_probabilities = choose_on(ram_model, ram, &on_host.states, choices, host_out);
    float *a = view_rows(&device_probabilities), *b = view_rows(&host_probabilities);
    double worst = 0;
    for (size_t i = 0; i < TEXTS * 5; ++i)
        worst = fmax(worst, fabs((double)a[i] - b[i]));
    fprintf(stderr, "  text_choose: max |p_gpu - p_cpu| = %.2e\n", worst);
    assert_true(worst < 2e-2);
    free(a);
    free(b);
    uform_arena_free(device_states);
    uform_arena_free(device_out);
    uform_arena_free(host_states);
    uform_arena_free(host_out);
    text_batch_free(&batch);
}

static uform_continuation_t cancel_at_once(void *state, size_t completed, size_t total) {
    (void)state;
    (void)completed;
    (void)total;
    return UFORM_CANCEL;
}

static void test_deferred_cancel_contended(void **state) {
    (void)state;
    NEED_DEVICE();
    size_t count = 4000;
    text_batch_t batch = text_batch(count);
    uform_arena_t *arena = arena_of(vram);
    uform_outcome_t outcome, other;
    uform_outcome_init(&outcome);
    uform_outcome_init(&other);
    uform_encode_config_t config = {.progress = {.handler = cancel_at_once, .steps = 100}};
    uform_text_encode_args_t args =
        text_args(vram_model, vram, UFORM_OUTPUT_EMBEDDINGS, arena, NULL, batch.tape);
    args.config = &config;
    args.outcome = &outcome;
    assert_int_equal(uform_text_encode(&args), UFORM_OK);
    /* The executor is held: a second call is refused at once. */
    uform_executor_nop_args_t nop = {.executor = vram, .outcome = &other};
    uform_status_t contended = uform_executor_nop(&nop);
    assert_true(contended == UFORM_CONTENDED || contended == UFORM_OK);
    assert_int_equal(uform_outcome_wait(&outcome), UFORM_CANCELLED);
    assert_int_equal(uform_outcome_wait(&outcome), UFORM_CANCELLED);
    uform_outcome_wait(&other);
    /* And the executor is usable after. */
    config.progress.handler = NULL;
    args.outcome = NULL;
    uform_encoded_t encoded;
    args.encoded = &encoded;
    assert_int_equal(uform_text_encode(&args), UFORM_OK);
    assert_int_equal(encoded.items, count);
    uform_outcome_destroy(&outcome);
    uform_outcome_destroy(&other);
    uform_arena_free(arena);
    text_batch_free(&batch);
}

static void test_images_match_cpu(void **state) {
    (void)state;
    NEED_DEVICE();
    /* Pixels of several shapes (shrunk, grown, square, long), and one bad item whose span is wrong. */
    size_t const heights[] = {64, 300, 17, 224, 480, 5, 100};
    size_t const widths[] = {64, 200, 33, 224, 640, 5, 100};
    size_t const count = sizeof heights / sizeof *heights;
    size_t offsets[sizeof heights / sizeof *heights + 1] = {0};
    for (size_t i = 0; i < count; ++i)
        offsets[i + 1] = offsets[i] + heights[i] * widths[i] * 3 - (i == 5 ? 1 : 0);
    uint8_t *pixels = malloc(offsets[count]);
    uint64_t seed = 42;
    for (size_t i = 0; i < offsets[count]; ++i) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        pixels[i] = (uint8_t)(seed >> 56);
    }
    uform_tape_t tape = {.data = pixels, .offsets = offsets, .count = count, .length = offsets[count]};
    uform_arena_t *device_arena = arena_of(vram), *host_arena = arena_of(ram);
    uform_scalar_t const scalars[] = {UFORM_F32, UFORM_BF16, UFORM_I8};
    for (size_t k = 0; k < 3; ++k) {
        uform_encode_config_t config = {.outputs_scalar = scalars[k]};
        uform_encoded_t on_device, on_host;
        uform_outputs_t outputs = EVERYTHING;
        uform_image_encode_pixels_args_t args = {.model = vram_model,
                                                 .executor = vram,
                                                 .outputs = outputs,
                                                 .arena = device_arena,
                                                 .config = &config,
                                                 .encoded = &on_device,
                                                 .pixels = tape,
                                                 .heights = heights,
                                                 .widths = widths};
        uform_status_t status = uform_image_encode_pixels(&args);
        if (status != UFORM_OK) fail_msg("VRAM image_encode_pixels: %s", last_error_text().text);
        args.model = ram_model, args.executor = ram, args.arena = host_arena, args.encoded = &on_host;
        assert_int_equal(uform_image_encode_pixels(&args), UFORM_OK);
        for (size_t i = 0; i < count; ++i)
            assert_int_equal(on_device.statuses[i], on_host.statuses[i]);
        assert_int_equal(on_device.statuses[5], UFORM_INVALID_ARGUMENT);
        char what[32];
        snprintf(what, sizeof what, "images, scalar %d", (int)scalars[k]);
        assert_outputs_agree(&on_device, &on_host, what);
    }
    uform_arena_free(device_arena);
    uform_arena_free(host_arena);
    free(pixels);
}

/* ---- Media from files and memory ----------------------------------------------------------------- */

static uform_model_t *encoding;              /* the model media_encode runs */
static enum { IMAGES, CLIPS, SOUNDS } media; /* the verb media_encode runs */

/* The media verb `media` over a batch of files, encoded media in memory, or samples. */
static uform_status_t media_encode(batch_t const *batch, uform_executor_t *executor, uform_outputs_t outputs,
                                   uform_arena_t *arena, uform_encode_config_t const *config,
                                   uform_outcome_t *outcome, uform_encoded_t *encoded) {
    uform_tape_t tape = batch_tape(batch);
    uform_audio_encode_samples_args_t samples = {ENCODE_ARGS(encoding), .samples = tape, .rate = batch->rate};
    uform_image_encode_args_t images = {ENCODE_ARGS(encoding), .source = batch->source, .images = tape};
    uform_video_encode_args_t clips = {ENCODE_ARGS(encoding), .source = batch->source, .videos = tape};
    uform_audio_encode_args_t sounds = {ENCODE_ARGS(encoding), .source = batch->source, .sounds = tape};
    if (media == IMAGES) return uform_image_encode(&images);
    if (media == CLIPS) return uform_video_encode(&clips);
    return batch->kind == BATCH_SAMPLES ? uform_audio_encode_samples(&samples) : uform_audio_encode(&sounds);
}

/* `batch` encoded on the VRAM and the RAM executor, every output, in `scalar` at `width`: the same
 * statuses, the same token vectors per item, and every row at cosine >= 0.999. */
static void compare_batch(batch_encode_t encode, batch_t const *batch, uform_scalar_t scalar, size_t width,
                          char const *what) {
    uform_arena_t *device_arena = arena_of(vram), *host_arena = arena_of(ram);
    uform_encode_config_t config = {.outputs_scalar = scalar, .matryoshka = width};
    uform_encoded_t on_device, on_host;
    encoding = vram_model;
    uform_status_t status = encode(batch, vram, EVERYTHING, device_arena, &config, NULL, &on_device);
    if (status != UFORM_OK) fail_msg("VRAM %s: %s", what, last_error_text().text);
    encoding = ram_model;
    assert_int_equal(encode(batch, ram, EVERYTHING, host_arena, &config, NULL, &on_host), UFORM_OK);
    assert_int_equal(on_device.items, on_host.items);
    for (size_t i = 0; i < on_host.items; ++i) {
        if (on_device.statuses[i] != on_host.statuses[i])
            fail_msg("%s: item %zu answers %d on the device, %d on the host", what, i, on_device.statuses[i],
                     on_host.statuses[i]);
        assert_int_equal(on_device.token_vectors.item_offsets[i + 1],
                         on_host.token_vectors.item_offsets[i + 1]);
    }
    assert_outputs_agree(&on_device, &on_host, what);
    uform_arena_free(device_arena);
    uform_arena_free(host_arena);
}

/* Every file of synth/media/ named `prefix`NNNNNN`suffix` (from 0 until one is missing), then a missing
 * file and an empty path; and the same in memory, with a truncated copy of the first for the two. */
static void media_batches(char const *prefix, char const *suffix, batch_t *files, batch_t *memory) {
    char name[128], path[512];
    blob_t first = {0};
    for (size_t i = 0;; ++i) {
        snprintf(name, sizeof name, "synth/media/%s%06zu%s", prefix, i, suffix);
        fixture_path(name, path, sizeof path);
        FILE *file = fopen(path, "rb");
        if (!file) break;
        fclose(file);
        batch_add_path(files, name);
        blob_t blob = blob_read(path);
        batch_add(memory, blob.data, blob.size);
        if (i == 0)
            first = blob;
        else
            free(blob.data);
    }
    assert_non_null(first.data);
    batch_add_path(files, "synth/media/absent");
    batch_add(files, "", 0);
    batch_add(memory, first.data, first.size / 3);
    batch_add(memory, "", 0);
    free(first.data);
}

static void compare_media(char const *prefix, char const *suffix, char const *what) {
    batch_encode_t encode = media_encode;
    batch_t *files = batch_new(BATCH_FILES), *memory = batch_new(BATCH_MEMORY);
    media_batches(prefix, suffix, files, memory);
    uform_model_info_t info;
    assert_int_equal(uform_model_info(vram_model, &info), UFORM_OK);
    char name[96];
    snprintf(name, sizeof name, "%s from files", what);
    compare_batch(encode, files, UFORM_F32, 0, name);
    snprintf(name, sizeof name, "%s from memory", what);
    compare_batch(encode, memory, UFORM_F32, 0, name);
    snprintf(name, sizeof name, "%s from files, I8", what);
    compare_batch(encode, files, UFORM_I8, 0, name);
    if (info.matryoshka_count) {
        snprintf(name, sizeof name, "%s from memory, BF16 at a matryoshka width", what);
        compare_batch(encode, memory, UFORM_BF16, info.matryoshka[0], name);
    }
    batch_free(files);
    batch_free(memory);
}

#define NEED_MEDIA()                                                                                         \
    do {                                                                                                     \
        NEED_DEVICE();                                                                                       \
        if (!have_media) skip();                                                                             \
    } while (0)

/* Images (PNG), clips (MP4) and sounds (WAV) from files and from memory, with failing items. */
static void test_media_match_cpu(void **state) {
    (void)state;
    NEED_MEDIA();
    bool ffmpeg = uform_features() & UFORM_FEATURE_FFMPEG;
    media = IMAGES;
    compare_media("img-", ".png", "images");
    if (!ffmpeg) return;
    media = CLIPS;
    compare_media("vid-", ".mp4", "clips");
    media = SOUNDS;
    compare_media("snd-", ".wav", "sounds");
}

static void test_sound_samples_match_cpu(void **state) {
    (void)state;
    NEED_DEVICE();
    if (!(uform_features() & UFORM_FEATURE_FFMPEG)) skip();
    media = SOUNDS;
    /* Samples at 22050 Hz of several lengths (one past the model's reach), and one holding a NaN. */
    batch_t *samples = batch_new(BATCH_SAMPLES);
    samples->rate = 22050;
    size_t const lengths[] = {22050, 4000, 90000, 300, 12345};
    for (size_t k = 0; k < sizeof lengths / sizeof *lengths; ++k) {
        float *wave = malloc(lengths[k] * sizeof(float));
        assert_non_null(wave);
        for (size_t i = 0; i < lengths[k]; ++i)
            wave[i] = 0.5f * sinf((float)i * (0.01f + 0.013f * (float)k)) + 0.1f * sinf((float)i * 0.31f);
        if (k == 3) wave[7] = NAN;
        batch_add(samples, wave, lengths[k]);
        free(wave);
    }
    compare_batch(media_encode, samples, UFORM_F32, 0, "sound samples");
    compare_batch(media_encode, samples, UFORM_F16, 0, "sound samples, F16");
    batch_free(samples);
}

/* ---- Several devices ------------------------------------------------------------------------------ */

static void test_two_devices_match_cpu(void **state) {
    (void)state;
    NEED_DEVICE();
    size_t devices[] = {0, 1};
    uform_vram_options_t options = {.devices = devices, .devices_count = 2};
    uform_executor_t *pair = NULL;
    if (uform_executor_create_vram(&options, &pair) != UFORM_OK) {
        fprintf(stderr, "  two devices: skipped: %s\n", last_error_text().text);
        skip();
    }
    uform_model_t *model = NULL;
    uform_model_load_args_t load = {.executor = pair, .path = checkpoint, .model = &model};
    assert_int_equal(uform_model_load_vram(&load), UFORM_OK);
    /* Enough texts for several chunks, so that both devices take some. */
    text_batch_t batch = text_batch(4000);
    uform_arena_t *device_arena = arena_of(pair), *host_arena = arena_of(ram);
    uform_encoded_t on_device, on_host;
    uform_text_encode_args_t args = text_args(model, pair, EVERYTHING, device_arena, &on_device, batch.tape);
    assert_int_equal(uform_text_encode(&args), UFORM_OK);
    args = text_args(ram_model, ram, EVERYTHING, host_arena, &on_host, batch.tape);
    assert_int_equal(uform_text_encode(&args), UFORM_OK);
    assert_outputs_agree(&on_device, &on_host, "4000 texts on two devices");
    if (have_media) { /* as many image files as a batch takes: two chunks of the media call */
        uform_executor_t *single = vram;
        uform_model_t *single_model = vram_model;
        vram_model = model, vram = pair; /* compare_batch's receiver, for this one */
        batch_t *files = batch_new(BATCH_FILES), *memory = batch_new(BATCH_MEMORY);
        media_batches("img-", ".png", files, memory);
        for (size_t i = 0; files->count < BATCH_MAX - 1; ++i)
            batch_add(files, files->data + files->offsets[i], files->offsets[i + 1] - files->offsets[i]);
        media = IMAGES;
        compare_batch(media_encode, files, UFORM_F32, 0, "images from files on two devices");
        vram_model = single_model, vram = single;
        batch_free(files);
        batch_free(memory);
    }
    uform_arena_free(device_arena);
    uform_arena_free(host_arena);
    text_batch_free(&batch);
    uform_model_free(model);
    uform_executor_free(pair);
}

/* ---- Pinned and device tapes ---------------------------------------------------------------------- */

typedef struct runtime {
    int (*host_alloc)(void **pointer, size_t bytes, unsigned flags);
    int (*free_host)(void *pointer);
    int (*device_alloc)(void **pointer, size_t bytes);
    int (*device_free)(void *pointer);
    int (*copy)(void *to, void const *from, size_t bytes, int kind);
} runtime_t;

/* The CUDA runtime the engine opened (the same library, opened again). */
static runtime_t runtime_open(void) {
    runtime_t runtime = {0};
#ifdef UFORM_CUDART_SONAME
    void *library = dlopen(UFORM_CUDART_SONAME, RTLD_NOW | RTLD_NOLOAD);
    if (!library) return runtime;
    *(void **)&runtime.host_alloc = dlsym(library, "cudaHostAlloc");
    *(void **)&runtime.free_host = dlsym(library, "cudaFreeHost");
    *(void **)&runtime.device_alloc = dlsym(library, "cudaMalloc");
    *(void **)&runtime.device_free = dlsym(library, "cudaFree");
    *(void **)&runtime.copy = dlsym(library, "cudaMemcpy");
#endif
    return runtime;
}

/* The embeddings of `tape`'s pixels on the VRAM executor, copied out: [count, width] F32. */
static float *pixels_embedded(uform_tape_t tape, size_t const *heights, size_t const *widths) {
    uform_arena_t *arena = arena_of(vram);
    uform_encoded_t encoded;
    uform_image_encode_pixels_args_t args = {.model = vram_model,
                                             .executor = vram,
                                             .outputs = UFORM_OUTPUT_EMBEDDINGS,
                                             .arena = arena,
                                             .encoded = &encoded,
                                             .pixels = tape,
                                             .heights = heights,
                                             .widths = widths};
    assert_int_equal(uform_image_encode_pixels(&args), UFORM_OK);
    float *rows = view_rows(&encoded.embeddings);
    uform_arena_free(arena);
    return rows;
}

static void test_pinned_and_device_pixels_bitwise(void **state) {
    (void)state;
    NEED_DEVICE();
    runtime_t runtime = runtime_open();
    if (!runtime.host_alloc || !runtime.copy) skip();
    size_t const count = 40, height = 50, width = 70, bytes = count * height * width * 3;
    size_t offsets[41], heights[40], widths[40];
    uint8_t *pageable = malloc(bytes), *pinned = NULL, *device = NULL;
    assert_non_null(pageable);
    for (size_t i = 0; i < bytes; ++i)
        pageable[i] = (uint8_t)(i * 2654435761u >> 24);
    for (size_t i = 0; i <= count; ++i)
        offsets[i] = i * height * width * 3;
    for (size_t i = 0; i < count; ++i)
        heights[i] = height, widths[i] = width;
    assert_int_equal(runtime.host_alloc((void **)&pinned, bytes, 0), 0);
    assert_int_equal(runtime.device_alloc((void **)&device, bytes), 0);
    memcpy(pinned, pageable, bytes);
    assert_int_equal(runtime.copy(device, pageable, bytes, 1 /* host to device */), 0);
    uform_tape_t tape = {.data = pageable, .offsets = offsets, .count = count, .length = bytes};
    float *expected = pixels_embedded(tape, heights, widths);
    tape.data = pinned;
    float *from_pinned = pixels_embedded(tape, heights, widths);
    tape.data = device;
    float *from_device = pixels_embedded(tape, heights, widths);
    uform_model_info_t info;
    assert_int_equal(uform_model_info(vram_model, &info), UFORM_OK);
    size_t floats = count * info.dims;
    assert_memory_equal(from_pinned, expected, floats * sizeof(float));
    assert_memory_equal(from_device, expected, floats * sizeof(float));
    fprintf(stderr, "  pixels from pinned and from device memory: bitwise the pageable tape's\n");
    free(expected), free(from_pinned), free(from_device), free(pageable);
    runtime.free_host(pinned);
    runtime.device_free(device);
}

int main(int argc, char **argv) {
    uform_command = argc > 1 ? argv[1] : NULL;
    struct CMUnitTest const tests[] = {
        cmocka_unit_test(test_create_without_device_or_bad_ordinal),
        cmocka_unit_test(test_bad_options_refused_before_the_driver),
        cmocka_unit_test(test_load_vram_needs_vram_executor),
        cmocka_unit_test(test_load_vram_refusals),
        cmocka_unit_test(test_text_matches_cpu),
        cmocka_unit_test(test_base_model_matches_cpu),
        cmocka_unit_test(test_device_views),
        cmocka_unit_test(test_choose_matches_cpu),
        cmocka_unit_test(test_deferred_cancel_contended),
        cmocka_unit_test(test_images_match_cpu),
        cmocka_unit_test(test_media_match_cpu),
        cmocka_unit_test(test_sound_samples_match_cpu),
        cmocka_unit_test(test_pinned_and_device_pixels_bitwise),
        cmocka_unit_test(test_two_devices_match_cpu),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
