/* Every status a public function can answer, function by function, for the functions whose other
 * suites do not already cover them (outcomes and executors: test_outcome; arenas and views:
 * test_arena; loads: test_model_load). Verbs a build lacks must validate exactly, then answer
 * UNSUPPORTED through the return value and through their outcome. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdalign.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "executor.h"
#include "loop.h"
#include "model.h"
#include "outcome.h"
#include "fixtures.h"
#include "kernels.h"

/* Every status with the name uform_status_name gives it, in the order of their values. */
static struct status_name {
    uform_status_t status;
    char const *name;
} const status_names[] = {
    {UFORM_OK, "ok"},
    {UFORM_PENDING, "pending"},
    {UFORM_CANCELLED, "cancelled"},
    {UFORM_CONTENDED, "contended"},
    {UFORM_INVALID_ARGUMENT, "invalid_argument"},
    {UFORM_IO, "io"},
    {UFORM_FORMAT, "format"},
    {UFORM_OUT_OF_MEMORY, "out_of_memory"},
    {UFORM_DEVICE, "device"},
    {UFORM_UNSUPPORTED, "unsupported"},
    {UFORM_INTERNAL, "internal"},
    {UFORM_MISSING_SYMBOL, "missing_symbol"},
};

static void names_and_rendering(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof status_names / sizeof status_names[0]; ++i) {
        assert_int_equal(status_names[i].status, (int)i); /* values are stable and dense */
        assert_string_equal(uform_status_name(status_names[i].status), status_names[i].name);
    }
    assert_string_equal(uform_status_name((uform_status_t)1000), "unknown");

    uform_error_t error = {UFORM_IO, "uform_model_load_ram", "cannot open checkpoint"};
    char text[128];
    size_t length = uform_error_render(&error, text, sizeof text);
    assert_string_equal(text, "UForm: io [uform_model_load_ram]: cannot open checkpoint");
    assert_int_equal(length, strlen(text));
    char small[10];
    assert_int_equal(uform_error_render(&error, small, sizeof small), length); /* as snprintf */
    assert_string_equal(small, "UForm: io");
    assert_int_equal(uform_error_render(&error, NULL, 0), length);

    int major = 0, minor = -1, patch = -1;
    uform_version(&major, &minor, &patch);
    assert_int_equal(major, UFORM_VERSION_MAJOR);
    assert_int_equal(minor, UFORM_VERSION_MINOR);
    uint32_t features = uform_features();
    assert_int_equal(!!(features & UFORM_FEATURE_HWLOC), UFORM_WITH_HWLOC);
    assert_int_equal(!!(features & UFORM_FEATURE_URING), UFORM_WITH_URING && loop_uring_available());
    assert_int_equal(!!(features & UFORM_FEATURE_JPEG), UFORM_WITH_JPEG);
    assert_int_equal(!!(features & UFORM_FEATURE_SPNG), UFORM_WITH_SPNG);
    assert_int_equal(!!(features & UFORM_FEATURE_FFMPEG), UFORM_WITH_FFMPEG);
    assert_int_equal(!!(features & UFORM_FEATURE_CUDA), UFORM_WITH_CUDA);
    assert_int_equal(!!(features & UFORM_FEATURE_MPI), UFORM_WITH_MPI);
    assert_int_equal(!!(features & UFORM_FEATURE_TOKENIZERS), UFORM_WITH_TOKENIZERS);
    assert_int_equal(!!(features & UFORM_FEATURE_SENTENCEPIECE), UFORM_WITH_SENTENCEPIECE);
    assert_false(features & (UFORM_FEATURE_NCCL | UFORM_FEATURE_MICROHTTPD));
    char const *reason = NULL, *amx = NULL;
    assert_string_equal(uform_kernels(&reason, &amx), kernels_active()->name);
    assert_string_equal(reason, kernels_reason());
    assert_string_equal(amx, kernels_amx_state());
    assert_string_equal(uform_kernels(NULL, NULL), kernels_active()->name);
}

static void outcome_arguments(void **state) {
    (void)state;
    assert_int_equal(uform_outcome_status(NULL), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_outcome_wait(NULL), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_outcome_error(NULL).status, UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_outcome_notify_eventfd(NULL, 3), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_outcome_notify_ring(NULL, 3, 0), UFORM_INVALID_ARGUMENT);
    assert_null(uform_outcome_model(NULL));
    uform_encoded_t encoded;
    uform_view_t view;
    assert_int_equal(uform_outcome_encoded(NULL, &encoded), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_outcome_probabilities(NULL, &view), UFORM_INVALID_ARGUMENT);
    uform_outcome_destroy(NULL);
    uform_outcome_init(NULL);

    uform_outcome_t outcome;
    memset(&outcome, 0, sizeof outcome);
    assert_int_equal(uform_outcome_status(&outcome), UFORM_INVALID_ARGUMENT); /* not initialized */
    assert_int_equal(uform_outcome_wait(&outcome), UFORM_INVALID_ARGUMENT);
    uform_outcome_init(&outcome);
    assert_int_equal(uform_outcome_status(&outcome), UFORM_OK);
    assert_int_equal(uform_outcome_notify_eventfd(&outcome, -1), UFORM_OK);
    assert_int_equal(uform_outcome_notify_ring(&outcome, -1, 0), UFORM_OK);
    /* A final outcome of another verb holds no encoded results. */
    uform_executor_nop_args_t nop = {.outcome = &outcome};
    assert_int_equal(uform_executor_nop(&nop), UFORM_OK);
    assert_int_equal(uform_outcome_encoded(&outcome, &encoded), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_outcome_probabilities(&outcome, &view), UFORM_INVALID_ARGUMENT);
    assert_null(uform_outcome_model(&outcome));
    assert_int_equal(uform_executor_nop(NULL), UFORM_INVALID_ARGUMENT);
    uform_outcome_destroy(&outcome);
}

/* A recorded message is a copy, cut at UFORM_ERROR_MESSAGE_SIZE - 1 bytes: the caller's buffer may change
 * or die at once. A failure passed on with the thread's own message (an entry point wrapping another)
 * keeps it whole. */
static void messages_are_copied_and_cut(void **state) {
    (void)state;
    char text[2 * UFORM_ERROR_MESSAGE_SIZE];
    memset(text, 'x', sizeof text - 1);
    text[sizeof text - 1] = '\0';
    assert_int_equal(failed(UFORM_IO, "uform_inner", text), UFORM_IO);
    text[0] = 'y';
    uform_error_t error = uform_last_error();
    assert_int_equal(strlen(error.message), UFORM_ERROR_MESSAGE_SIZE - 1);
    assert_int_equal(error.message[0], 'x');
    assert_int_equal(failed(UFORM_FORMAT, "uform_outer", uform_last_error().message), UFORM_FORMAT);
    assert_int_equal(strlen(uform_last_error().message), UFORM_ERROR_MESSAGE_SIZE - 1);
    assert_string_equal(uform_last_error().entry, "uform_outer");
    assert_int_equal(failed(UFORM_IO, NULL, NULL), UFORM_IO);
    assert_string_equal(uform_last_error().message, "");
    assert_string_equal(uform_last_error().entry, "");
}

/* An outcome keeps its own copy of its failure's message: a later failure on the thread, which
 * overwrites the thread's last error, leaves the outcome's as it was. */
static void outcomes_keep_their_messages(void **state) {
    (void)state;
    uform_ram_options_t options = uform_ram_options_default();
    options.threads = 1;
    options.pin = false;
    uform_executor_t *executor = NULL;
    assert_int_equal(uform_executor_create_ram(&options, &executor), UFORM_OK);
    uform_outcome_t held, contended;
    uform_outcome_init(&held);
    uform_outcome_init(&contended);
    uform_executor_nop_args_t nop = {.executor = executor, .delay_ns = 200000000, .outcome = &held};
    assert_int_equal(uform_executor_nop(&nop), UFORM_OK);
    nop.outcome = &contended;
    assert_int_equal(uform_executor_nop(&nop), UFORM_CONTENDED);
    assert_string_equal(uform_outcome_error(&contended).message, "another call holds the executor");
    assert_int_equal(uform_outcome_wait(NULL), UFORM_INVALID_ARGUMENT);
    assert_string_equal(uform_last_error().message, "outcome is NULL");
    assert_string_equal(uform_outcome_error(&contended).message, "another call holds the executor");
    assert_string_equal(uform_outcome_error(&contended).entry, "uform_executor_nop");
    assert_int_equal(uform_outcome_wait(&held), UFORM_OK);
    uform_outcome_destroy(&held);
    uform_outcome_destroy(&contended);
    uform_executor_free(executor);
}

/* Regression (executor_misaligned_call_storage): executors came from calloc, 16-byte aligned, while their
 * call storage is declared 64-byte aligned, which UBSan's alignment check reported. Eight of each kind, so
 * that a 16-byte-aligned allocator is caught for certain but in one run in 65,536. */
static void executor_misaligned_call_storage(void **state) {
    (void)state;
    uform_ram_options_t options = uform_ram_options_default();
    options.threads = 1;
    options.pin = false;
    uform_executor_t *executors[16];
    for (size_t i = 0; i < 16; i += 2) {
        assert_int_equal(uform_executor_create_inline(&executors[i]), UFORM_OK);
        assert_int_equal(uform_executor_create_ram(&options, &executors[i + 1]), UFORM_OK);
    }
    for (size_t i = 0; i < 16; ++i) {
        assert_int_equal((uintptr_t)executors[i] % alignof(uform_executor_t), 0);
        assert_int_equal((uintptr_t)executors[i]->call_storage % 64, 0);
    }
    for (size_t i = 0; i < 16; ++i)
        uform_executor_free(executors[i]);
}

static void executor_constructors(void **state) {
    (void)state;
    uform_executor_t *executor = (uform_executor_t *)&executor;
    assert_int_equal(uform_executor_create_inline(NULL), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_executor_create_ram(NULL, NULL), UFORM_INVALID_ARGUMENT);
    uform_ram_options_t options = uform_ram_options_default();
    options.threads = 5000;
    assert_int_equal(uform_executor_create_ram(&options, &executor), UFORM_INVALID_ARGUMENT);
    assert_null(executor);
    options = uform_ram_options_default();
    options.domains_count = 1;
    assert_int_equal(uform_executor_create_ram(&options, &executor), UFORM_INVALID_ARGUMENT);
#if !UFORM_WITH_HWLOC
    size_t domain = 0;
    options.domains = &domain;
    assert_int_equal(uform_executor_create_ram(&options, &executor), UFORM_UNSUPPORTED);
#endif

    uform_pool_vtable_t vtable = {NULL, NULL};
    assert_int_equal(uform_executor_create_pool(&vtable, NULL, &executor), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_executor_create_pool(NULL, NULL, &executor), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_executor_create_pool(&vtable, NULL, NULL), UFORM_INVALID_ARGUMENT);

    int pool = 0;
    assert_int_equal(uform_executor_create_fork_union(NULL, &executor), UFORM_INVALID_ARGUMENT);
#if !UFORM_WITH_FORK_UNION
    assert_int_equal(uform_executor_create_fork_union(&pool, &executor), UFORM_UNSUPPORTED);
#endif
    (void)pool;
    assert_int_equal(uform_executor_create_vram(NULL, NULL), UFORM_INVALID_ARGUMENT);
    uform_vram_options_t vram = {.devices = NULL, .devices_count = 2};
    assert_int_equal(uform_executor_create_vram(&vram, &executor), UFORM_INVALID_ARGUMENT);
    /* Built with CUDA: DEVICE where no device is present; without: UNSUPPORTED (tests/vram/test_vram.c
     * checks a VRAM executor where a device is present). */
    uform_status_t vram_status = uform_executor_create_vram(NULL, &executor);
    if (vram_status == UFORM_OK) {
        uform_executor_free(executor);
        executor = NULL;
        vram_status = uform_executor_create_vram(
            &(uform_vram_options_t){.devices = (size_t[]){4096}, .devices_count = 1}, &executor);
    }
    assert_int_equal(vram_status, UFORM_WITH_CUDA ? UFORM_DEVICE : UFORM_UNSUPPORTED);
    assert_null(executor);
    assert_string_equal(uform_last_error().entry, "uform_executor_create_vram");
    uform_executor_free(NULL);
}

/* A model made by hand, with only the towers a test wants: the verbs below read nothing else. */
static uform_model_t *fake_model(bool text, bool image, bool audio) {
    uform_model_t *model = calloc(1, sizeof *model);
    assert_non_null(model);
    atomic_init(&model->references, 1);
    model->header.info.dims = 64;
    model->header.info.matryoshka[0] = 32;
    model->header.info.matryoshka[1] = 64;
    model->header.info.matryoshka_count = 2;
    model->header.info.has_text = text;
    model->header.info.has_image = model->header.info.has_video = image;
    model->header.info.has_audio = audio;
    return model;
}

/* A call of a verb and what it answers: `expected` and, where `message` is not NULL, that last error. */
typedef struct verb_case {
    char const *what;
    verb_t verb;
    void const *args; /* NULL: the verb's NULL */
    uform_status_t expected;
    char const *message;
} verb_case_t;

/* The calls in order, each named in a failure. */
static void assert_verb_cases(verb_case_t const *cases, size_t count) {
    for (size_t i = 0; i < count; ++i) {
        uform_status_t status = cases[i].verb(cases[i].args);
        if (status != cases[i].expected)
            fail_msg("%s: %s, expected %s", cases[i].what, uform_status_name(status),
                     uform_status_name(cases[i].expected));
        if (cases[i].message) assert_string_equal(uform_last_error().message, cases[i].message);
    }
}

/* The fields every verb's arguments share below: the fake model, the arena and the results. */
#define COMMON_ARGS(outputs_) .model = model, .outputs = (outputs_), .arena = arena, .encoded = &encoded

static void encode_verbs_validate_then_refuse(void **state) {
    (void)state;
    uform_model_t *model = fake_model(true, true, true);
    uform_model_t *empty = fake_model(false, false, false);
    uform_arena_t *arena = NULL;
    assert_int_equal(uform_arena_create_host(&arena), UFORM_OK);
    char const text[] = "a cata dog";
    size_t offsets[] = {0, 5, 10}, backwards[] = {0, 6, 5}, sides[] = {1, 1};
    uform_tape_t good = {text, offsets, 2, 10}, bad = {text, backwards, 2, 10};
    uform_encoded_t encoded;
    uform_outcome_t outcome;
    uform_outcome_init(&outcome);

    /* Text, one field wrong at a time; the calls from the narrow BF16 width on keep that config. */
    uform_encode_config_t const bad_scalar = {.outputs_scalar = (uform_scalar_t)9},
                                too_wide = {.outputs_scalar = UFORM_BF16, .matryoshka = 48},
                                narrow = {.outputs_scalar = UFORM_BF16, .matryoshka = 32};
    uform_text_encode_args_t texts[11] = {{COMMON_ARGS(UFORM_OUTPUT_EMBEDDINGS), .texts = good}};
    for (size_t i = 1; i < 11; ++i)
        texts[i] = texts[0];
    texts[1].texts = bad;
    texts[2].outputs = 0;
    texts[3].outputs = (uform_outputs_t)(1u << 7);
    texts[4].config = &bad_scalar;
    texts[5].config = &too_wide;
    for (size_t i = 6; i < 11; ++i)
        texts[i].config = &narrow;
    texts[7].arena = NULL;
    texts[8].model = NULL;
    texts[9].model = empty;
    texts[10].encoded = NULL;
    verb_case_t const text_cases[] = {
        {"text NULL", text_encode_verb, NULL, UFORM_INVALID_ARGUMENT, NULL},
        {"text", text_encode_verb, &texts[0], UFORM_UNSUPPORTED, NULL}, /* no prepared text tower */
        {"text offsets", text_encode_verb, &texts[1], UFORM_INVALID_ARGUMENT, "tape offsets out of order"},
        {"text no outputs", text_encode_verb, &texts[2], UFORM_INVALID_ARGUMENT, NULL},
        {"text unknown output", text_encode_verb, &texts[3], UFORM_INVALID_ARGUMENT, NULL},
        {"text unknown scalar", text_encode_verb, &texts[4], UFORM_INVALID_ARGUMENT, NULL},
        {"text width of no matryoshka", text_encode_verb, &texts[5], UFORM_INVALID_ARGUMENT, NULL},
        {"text narrow BF16", text_encode_verb, &texts[6], UFORM_UNSUPPORTED, NULL},
        {"text arena NULL", text_encode_verb, &texts[7], UFORM_INVALID_ARGUMENT, NULL},
        {"text model NULL", text_encode_verb, &texts[8], UFORM_INVALID_ARGUMENT, NULL},
        {"text tower absent", text_encode_verb, &texts[9], UFORM_UNSUPPORTED, "the model has no text tower"},
        {"text encoded NULL", text_encode_verb, &texts[10], UFORM_INVALID_ARGUMENT, NULL},
    };
    assert_verb_cases(text_cases, sizeof text_cases / sizeof text_cases[0]);
    /* Deferred: the same status, and the outcome is final with it. */
    uform_text_encode_args_t deferred = texts[10];
    deferred.outcome = &outcome;
    assert_int_equal(uform_text_encode(&deferred), UFORM_UNSUPPORTED);
    assert_int_equal(uform_outcome_status(&outcome), UFORM_UNSUPPORTED);
    assert_string_equal(uform_outcome_error(&outcome).entry, "uform_text_encode");
    deferred.texts = bad;
    assert_int_equal(uform_text_encode(&deferred), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_outcome_wait(&outcome), UFORM_INVALID_ARGUMENT);

    /* The media verbs: a good call, the fields each checks of its own, a model without the tower. */
    uform_image_encode_args_t images[3] = {
        {COMMON_ARGS(UFORM_OUTPUT_EMBEDDINGS), .images = good, .source = UFORM_SOURCE_FILES}};
    images[1] = images[2] = images[0];
    images[1].source = (uform_source_t)5;
    images[2].source = UFORM_SOURCE_MEMORY, images[2].model = empty;
    uform_image_encode_pixels_args_t pixels[2] = {
        {COMMON_ARGS(UFORM_OUTPUT_EMBEDDINGS), .pixels = good, .heights = sides, .widths = sides}};
    pixels[1] = pixels[0];
    pixels[1].widths = NULL;
    verb_case_t const media_cases[] = {
        {"image", image_encode_verb, &images[0], UFORM_UNSUPPORTED, NULL},
        {"image source", image_encode_verb, &images[1], UFORM_INVALID_ARGUMENT, NULL},
        {"image tower absent", image_encode_verb, &images[2], UFORM_UNSUPPORTED, NULL},
        {"image NULL", image_encode_verb, NULL, UFORM_INVALID_ARGUMENT, NULL},
        {"pixels", image_encode_pixels_verb, &pixels[0], UFORM_UNSUPPORTED, NULL},
        {"pixels widths NULL", image_encode_pixels_verb, &pixels[1], UFORM_INVALID_ARGUMENT, NULL},
        {"pixels NULL", image_encode_pixels_verb, NULL, UFORM_INVALID_ARGUMENT, NULL},
    };
    assert_verb_cases(media_cases, sizeof media_cases / sizeof media_cases[0]);

    uform_video_encode_args_t video = {COMMON_ARGS(UFORM_OUTPUT_TOKEN_VECTORS), .videos = good};
    assert_int_equal(uform_video_encode(&video), UFORM_UNSUPPORTED);
    video.videos = bad;
    assert_int_equal(uform_video_encode(&video), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_video_encode(NULL), UFORM_INVALID_ARGUMENT);

    uform_audio_encode_args_t audio = {COMMON_ARGS(UFORM_OUTPUT_STATES), .sounds = good};
    assert_int_equal(uform_audio_encode(&audio), UFORM_UNSUPPORTED);
    audio.model = empty;
    assert_int_equal(uform_audio_encode(&audio), UFORM_UNSUPPORTED);
    assert_string_equal(uform_last_error().message, "the model has no audio tower");
    assert_int_equal(uform_audio_encode(NULL), UFORM_INVALID_ARGUMENT);

    float samples[4] = {0};
    size_t sample_offsets[] = {0, 4};
    uform_audio_encode_samples_args_t sound = {COMMON_ARGS(UFORM_OUTPUT_EMBEDDINGS),
                                               .samples = {samples, sample_offsets, 1, 4}, .rate = 16000};
    assert_int_equal(uform_audio_encode_samples(&sound), UFORM_UNSUPPORTED);
    sound.rate = 0;
    assert_int_equal(uform_audio_encode_samples(&sound), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_audio_encode_samples(NULL), UFORM_INVALID_ARGUMENT);

    /* States in an arena of their own; the fake model has no prepared tower to read them with. */
    uform_arena_t *states_arena = NULL;
    assert_int_equal(uform_arena_create_host(&states_arena), UFORM_OK);
    assert_int_equal(arena_begin(states_arena), UFORM_OK);
    uform_view_t states = arena_view(states_arena, arena_allocate(states_arena, 2 * 64 * sizeof(float), 64),
                                     2, 64, UFORM_F32),
                 probabilities;
    arena_end(states_arena);
    char const legal[] = "abcdef";
    size_t legal_offsets[] = {0, 3, 6};
    uform_tape_t distinct = {legal, legal_offsets, 2, 6};
    uform_text_choose_args_t choose = {.model = model,
                                       .states = &states,
                                       .choices = distinct,
                                       .arena = arena,
                                       .probabilities = &probabilities};
    assert_int_equal(uform_text_choose(&choose), UFORM_UNSUPPORTED);
    choose.choices = bad;
    assert_int_equal(uform_text_choose(&choose), UFORM_INVALID_ARGUMENT);
    choose.choices = distinct;
    choose.model = empty;
    assert_int_equal(uform_text_choose(&choose), UFORM_UNSUPPORTED);
    choose.states = NULL;
    assert_int_equal(uform_text_choose(&choose), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_text_choose(NULL), UFORM_INVALID_ARGUMENT);

    uform_outcome_destroy(&outcome);
    uform_arena_free(arena);
    uform_arena_free(states_arena);
    uform_model_free(model);
    uform_model_free(empty);
}

static void mesh_refuses_trainer_checks(void **state) {
    (void)state;
    uform_executor_t *executor = NULL;
    assert_int_equal(uform_executor_create_inline(&executor), UFORM_OK);
    uform_mesh_t *mesh = NULL;
    uform_mesh_bootstrap_args_t bootstrap = {.executor = executor, .mesh = &mesh};
    /* A real bootstrap starts MPI in this process: tests/train/mesh_train.sh runs one under mpirun. */
    if (!UFORM_WITH_MPI) assert_int_equal(uform_mesh_bootstrap(&bootstrap), UFORM_UNSUPPORTED);
    /* A communicator to join needs MPI initialized by the application: refused before it is read. */
    static int const not_initialized_yet = 0;
    uform_mesh_options_t joined = {.communicator = &not_initialized_yet};
    bootstrap.options = &joined;
    assert_int_equal(uform_mesh_bootstrap(&bootstrap),
                     UFORM_WITH_MPI ? UFORM_INVALID_ARGUMENT : UFORM_UNSUPPORTED);
    if (UFORM_WITH_MPI) assert_non_null(strstr(uform_last_error().message, "options.communicator"));
    uform_outcome_t outcome;
    uform_outcome_init(&outcome);
    bootstrap.outcome = &outcome;
    assert_int_equal(uform_mesh_bootstrap(&bootstrap),
                     UFORM_WITH_MPI ? UFORM_INVALID_ARGUMENT : UFORM_UNSUPPORTED);
    assert_int_equal(uform_outcome_status(&outcome),
                     UFORM_WITH_MPI ? UFORM_INVALID_ARGUMENT : UFORM_UNSUPPORTED);
    bootstrap.outcome = NULL;
    uform_outcome_destroy(&outcome);
    assert_null(mesh);
    bootstrap.options = NULL;
    bootstrap.executor = NULL;
    assert_int_equal(uform_mesh_bootstrap(&bootstrap), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_mesh_bootstrap(NULL), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_mesh_rank(NULL), 0);
    assert_int_equal(uform_mesh_size(NULL), 1);
    uform_mesh_free(NULL);

    /* A RAM trainer on a host executor; a VRAM trainer needs a VRAM executor (tests/vram/test_vram.c). */
    uform_trainer_t *trainer = NULL;
    uform_trainer_config_t config;
    uform_trainer_config_default(&config);
    config.depth = 1;
    config.hidden = 64;
    uform_trainer_init_args_t init = {.executor = executor, .config = &config, .trainer = &trainer};
    assert_int_equal(uform_trainer_init_vram(&init), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_trainer_init_ram(&init), UFORM_OK);
    assert_non_null(trainer);
    uform_trainer_free(trainer);
    trainer = NULL;
    config.hidden = 65;
    assert_int_equal(uform_trainer_init_ram(&init), UFORM_INVALID_ARGUMENT);
    assert_null(trainer);
    init.config = NULL;
    assert_int_equal(uform_trainer_init_ram(&init), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_trainer_init_ram(NULL), UFORM_INVALID_ARGUMENT);

    uform_trainer_step_args_t step = {.trainer = NULL, .executor = executor};
    assert_int_equal(uform_trainer_step(&step), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_trainer_step(NULL), UFORM_INVALID_ARGUMENT);
    uform_trainer_save_args_t save = {.trainer = NULL, .executor = executor, .path = "x.safetensors"};
    assert_int_equal(uform_trainer_save(&save), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_trainer_save(NULL), UFORM_INVALID_ARGUMENT);
    uform_trainer_free(NULL);
    uform_executor_free(executor);
}

static void tiny_checkpoint_arguments(void **state) {
    (void)state;
    assert_int_equal(uform_tiny_checkpoint(NULL), UFORM_INVALID_ARGUMENT);
    uform_tiny_checkpoint_args_t args = {.path = NULL};
    assert_int_equal(uform_tiny_checkpoint(&args), UFORM_INVALID_ARGUMENT);
    args = (uform_tiny_checkpoint_args_t){.path = "/nonexistent-directory/tiny.safetensors"};
    assert_int_equal(uform_tiny_checkpoint(&args), UFORM_IO);
    assert_string_equal(uform_last_error().entry, "uform_tiny_checkpoint");
}

int main(void) {
    struct CMUnitTest const tests[] = {
        cmocka_unit_test(names_and_rendering),
        cmocka_unit_test(outcome_arguments),
        cmocka_unit_test(executor_constructors),
        cmocka_unit_test(executor_misaligned_call_storage),
        cmocka_unit_test(encode_verbs_validate_then_refuse),
        cmocka_unit_test(mesh_refuses_trainer_checks),
        cmocka_unit_test(tiny_checkpoint_arguments),
        cmocka_unit_test(messages_are_copied_and_cut),
        cmocka_unit_test(outcomes_keep_their_messages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
