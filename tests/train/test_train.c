/* The trainer through its public verbs: configs and their errors, a loss that falls, bit-exact resume,
 * bad items and relations that change nothing, cancellation, deferred and contended calls. Its numbers
 * (losses, gradients, AdamW) are checked against PyTorch autograd by tests/reference/test_train_reference.py.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fixtures.h"
#include "small_config.h"
#include "train_step.h"

static uform_tiny_checkpoint_args_t tiny = {.seed = 7, .depth = 1, .hidden = 64, .context = 32};

static int setup(void **state) {
    (void)state;
    return fixture_setup("train", &tiny, NULL, NULL);
}

/* A small config: one block of 64 everywhere, texts and images only. */
static uform_trainer_config_t small_config(void) {
    uform_trainer_config_t config = small_config_of(32, 32);
    config.towers = (1u << UFORM_MODALITY_TEXT) | (1u << UFORM_MODALITY_IMAGE);
    config.learning_rate = 3e-3;
    config.warmup_steps = 2;
    config.total_steps = 100;
    config.epsilon = 1e-6;
    return config;
}

static uform_trainer_t *make_trainer(uform_executor_t *executor, uform_trainer_config_t const *config) {
    uform_trainer_t *trainer = NULL;
    uform_trainer_init_args_t init = {.executor = executor, .config = config, .trainer = &trainer};
    uform_status_t status = uform_trainer_init_ram(&init);
    if (status != UFORM_OK) fail_msg("%s", last_error_text().text);
    return trainer;
}

/* Four texts, two related pairs. */
static char const texts[] = "a red circlea round red thinga blue squarea square of blue";
static size_t const text_offsets[] = {0, 12, 28, 41, 58};
static uform_modality_t const text_modalities[] = {UFORM_MODALITY_TEXT, UFORM_MODALITY_TEXT,
                                                   UFORM_MODALITY_TEXT, UFORM_MODALITY_TEXT};
static uint32_t const text_relations[] = {0, 1, 2, 3};

static uform_trainer_step_args_t text_step(uform_trainer_t *trainer, uform_executor_t *executor,
                                           uform_trainer_step_stats_t *stats) {
    return (uform_trainer_step_args_t){
        .trainer = trainer,
        .executor = executor,
        .modalities = text_modalities,
        .contents = {.data = texts, .offsets = text_offsets, .count = 4, .length = 58},
        .relations = text_relations,
        .relations_count = 2,
        .stats = stats};
}

/* The trainer most tests step: small_config()'s, on a RAM executor of 2 threads, made before the test and
 * freed after it (the test's cmocka setup and teardown). */
typedef struct stepping {
    uform_executor_t *executor;
    uform_trainer_t *trainer;
} stepping_t;

static int stepping_setup(void **state) {
    static stepping_t stepping;
    uform_trainer_config_t const config = small_config();
    stepping.executor = ram_executor(2, false);
    stepping.trainer = make_trainer(stepping.executor, &config);
    *state = &stepping;
    return 0;
}

static int stepping_teardown(void **state) {
    stepping_t *stepping = *state;
    uform_trainer_free(stepping->trainer);
    uform_executor_free(stepping->executor);
    return 0;
}

/* Every master weight, moment and the step, bitwise. */
static void assert_same_params(train_params_t const *a, train_params_t const *b) {
    assert_int_equal(a->count, b->count);
    assert_int_equal(a->step, b->step);
    for (size_t i = 0; i < a->count; ++i) {
        assert_string_equal(a->tensors[i].name, b->tensors[i].name);
        size_t bytes = a->tensors[i].count * sizeof(float);
        if (memcmp(a->tensors[i].value, b->tensors[i].value, bytes) ||
            memcmp(a->tensors[i].m, b->tensors[i].m, bytes) ||
            memcmp(a->tensors[i].v, b->tensors[i].v, bytes))
            fail_msg("%s differs", a->tensors[i].name);
    }
}

static train_params_t snapshot(train_params_t const *params) {
    train_params_t copy = *params;
    copy.tensors = calloc(params->count, sizeof *copy.tensors);
    for (size_t i = 0; i < params->count; ++i) {
        copy.tensors[i] = params->tensors[i];
        size_t bytes = params->tensors[i].count * sizeof(float);
        copy.tensors[i].value = malloc(bytes);
        copy.tensors[i].m = malloc(bytes);
        copy.tensors[i].v = malloc(bytes);
        copy.tensors[i].grad = NULL;
        memcpy(copy.tensors[i].value, params->tensors[i].value, bytes);
        memcpy(copy.tensors[i].m, params->tensors[i].m, bytes);
        memcpy(copy.tensors[i].v, params->tensors[i].v, bytes);
    }
    return copy;
}

static void snapshot_free(train_params_t *copy) {
    for (size_t i = 0; i < copy->count; ++i) {
        free(copy->tensors[i].value);
        free(copy->tensors[i].m);
        free(copy->tensors[i].v);
    }
    free(copy->tensors);
}

static void configs_and_their_errors(void **state) {
    (void)state;
    uform_executor_t *executor = ram_executor(2, false);
    uform_trainer_config_t config;
    uform_trainer_config_default(&config);
    assert_int_equal(config.hidden, 128);
    assert_true(config.learning_rate > 0 && config.beta2 > config.beta1);
    uform_trainer_t *trainer = make_trainer(executor, &config);
    assert_non_null(trainer);
    uform_trainer_free(trainer);

    uform_trainer_t *none = NULL;
    uform_trainer_init_args_t init = {.executor = executor, .config = &config, .trainer = &none};
    config.hidden = 65;
    assert_int_equal(uform_trainer_init_ram(&init), UFORM_INVALID_ARGUMENT);
    assert_null(none);
    config = small_config();
    config.resume_path = "/nonexistent/model.safetensors";
    assert_int_equal(uform_trainer_init_ram(&init), UFORM_IO);
    assert_null(none);
    config.resume_path = NULL;
    assert_int_equal(uform_trainer_init_vram(&init), UFORM_INVALID_ARGUMENT); /* a host executor */
    assert_null(none);
    init.executor = NULL;
    assert_int_equal(uform_trainer_init_ram(&init), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_trainer_init_ram(NULL), UFORM_INVALID_ARGUMENT);
    /* A trainer from a checkpoint: the tiny one, with every tower. */
    char path[4096];
    fixture_path("tiny.safetensors", path, sizeof path);
    config.resume_path = path;
    init.executor = executor;
    assert_int_equal(uform_trainer_init_ram(&init), UFORM_OK);
    assert_non_null(none);
    assert_true(none->params.info.has_audio && none->params.info.has_video);
    uform_trainer_free(none);
    uform_executor_free(executor);
}

static void loss_falls(void **state) {
    stepping_t const *stepping = *state;
    uform_trainer_step_stats_t stats, first = {0};
    uform_trainer_step_args_t step = text_step(stepping->trainer, stepping->executor, &stats);
    for (int i = 0; i < 40; ++i) {
        assert_int_equal(uform_trainer_step(&step), UFORM_OK);
        assert_int_equal(stats.step, (size_t)i + 1);
        assert_true(stats.loss > 0 && stats.contrastive_loss > 0 && stats.lm_loss > 0);
        if (i == 0) first = stats;
    }
    /* The next-byte loss starts near log 256 and the pairs get told apart. */
    assert_true(first.lm_loss > 4.5 && first.lm_loss < 6.5);
    assert_true(stats.loss < 0.7 * first.loss);
    assert_true(stats.lm_loss < first.lm_loss && stats.contrastive_loss < first.contrastive_loss);
}

static void resume_is_bit_exact(void **state) {
    (void)state;
    uform_executor_t *executor = ram_executor(2, false);
    uform_trainer_config_t config = small_config();
    uform_trainer_step_stats_t stats;
    /* Ten steps straight. */
    uform_trainer_t *straight = make_trainer(executor, &config);
    uform_trainer_step_args_t step = text_step(straight, executor, &stats);
    for (int i = 0; i < 10; ++i)
        assert_int_equal(uform_trainer_step(&step), UFORM_OK);
    /* Five, save, a new trainer from the save, five more. */
    uform_trainer_t *first = make_trainer(executor, &config);
    step = text_step(first, executor, &stats);
    for (int i = 0; i < 5; ++i)
        assert_int_equal(uform_trainer_step(&step), UFORM_OK);
    char path[4096];
    fixture_path("resume.safetensors", path, sizeof path);
    uform_trainer_save_args_t save = {.trainer = first, .executor = executor, .path = path};
    assert_int_equal(uform_trainer_save(&save), UFORM_OK);
    uform_trainer_free(first);
    config.resume_path = path;
    uform_trainer_t *resumed = make_trainer(executor, &config);
    assert_int_equal(resumed->params.step, 5);
    step = text_step(resumed, executor, &stats);
    for (int i = 0; i < 5; ++i)
        assert_int_equal(uform_trainer_step(&step), UFORM_OK);
    assert_int_equal(stats.step, 10);
    assert_same_params(&straight->params, &resumed->params);
    /* The save is an inference checkpoint too. */
    uform_model_t *model = NULL;
    uform_model_load_args_t load = {.executor = executor, .path = path, .model = &model};
    assert_int_equal(uform_model_load_ram(&load), UFORM_OK);
    uform_model_free(model);
    uform_trainer_free(straight);
    uform_trainer_free(resumed);
    uform_executor_free(executor);
}

/* The same steps on one thread and on three: the same bits (what lets `uform train` document its demo
 * model's bytes whatever --threads), with two blocks of 128 so that heads and columns split unevenly. */
static void steps_do_not_depend_on_threads(void **state) {
    (void)state;
    uform_executor_t *executors[2] = {ram_executor(1, false), ram_executor(3, false)};
    uform_trainer_config_t config = small_config();
    config.depth = 2;
    config.hidden = 128;
    uform_trainer_t *trainers[2];
    uform_trainer_step_stats_t stats[2];
    for (size_t t = 0; t < 2; ++t) {
        trainers[t] = make_trainer(executors[t], &config);
        uform_trainer_step_args_t step = text_step(trainers[t], executors[t], &stats[t]);
        for (int i = 0; i < 4; ++i)
            assert_int_equal(uform_trainer_step(&step), UFORM_OK);
    }
    assert_memory_equal(&stats[0].loss, &stats[1].loss, sizeof stats[0].loss);
    assert_same_params(&trainers[0]->params, &trainers[1]->params);
    for (size_t t = 0; t < 2; ++t) {
        uform_trainer_free(trainers[t]);
        uform_executor_free(executors[t]);
    }
}

/* A bad item, a bad relation or a foreign executor: the status, and nothing changed. */
static void bad_steps_change_nothing(void **state) {
    stepping_t const *stepping = *state;
    uform_executor_t *executor = stepping->executor, *other = ram_executor(1, false);
    uform_trainer_t *trainer = stepping->trainer;
    uform_trainer_step_stats_t stats;
    uform_trainer_step_args_t step = text_step(trainer, executor, &stats);
    assert_int_equal(uform_trainer_step(&step), UFORM_OK);
    train_params_t before = snapshot(&trainer->params);

    /* Not an image. */
    static uform_modality_t const with_image[] = {UFORM_MODALITY_TEXT, UFORM_MODALITY_IMAGE,
                                                  UFORM_MODALITY_TEXT, UFORM_MODALITY_TEXT};
    step.modalities = with_image;
    assert_int_equal(uform_trainer_step(&step), UFORM_FORMAT);
    assert_non_null(strstr(uform_last_error().message, "item 1"));
    /* A tower the model lacks. */
    static uform_modality_t const with_audio[] = {UFORM_MODALITY_TEXT, UFORM_MODALITY_AUDIO,
                                                  UFORM_MODALITY_TEXT, UFORM_MODALITY_TEXT};
    step.modalities = with_audio;
    assert_int_equal(uform_trainer_step(&step), UFORM_UNSUPPORTED);
    /* An unknown modality, a relation of an item with itself, one past the batch. */
    static uform_modality_t const unknown[] = {UFORM_MODALITY_TEXT, (uform_modality_t)9, UFORM_MODALITY_TEXT,
                                               UFORM_MODALITY_TEXT};
    step.modalities = unknown;
    assert_int_equal(uform_trainer_step(&step), UFORM_INVALID_ARGUMENT);
    step.modalities = text_modalities;
    static uint32_t const itself[] = {2, 2}, past[] = {0, 4};
    step.relations = itself;
    step.relations_count = 1;
    assert_int_equal(uform_trainer_step(&step), UFORM_INVALID_ARGUMENT);
    step.relations = past;
    assert_int_equal(uform_trainer_step(&step), UFORM_INVALID_ARGUMENT);
    step.relations = NULL;
    assert_int_equal(uform_trainer_step(&step), UFORM_INVALID_ARGUMENT);
    step.relations = text_relations;
    step.relations_count = 2;
    /* Another executor, no executor, no items. */
    step.executor = other;
    assert_int_equal(uform_trainer_step(&step), UFORM_INVALID_ARGUMENT);
    step.executor = NULL;
    assert_int_equal(uform_trainer_step(&step), UFORM_INVALID_ARGUMENT);
    step.executor = executor;
    step.contents.count = 0;
    assert_int_equal(uform_trainer_step(&step), UFORM_INVALID_ARGUMENT);
    uform_trainer_save_args_t save = {
        .trainer = trainer, .executor = executor, .path = "/nonexistent/dir/x.safetensors"};
    assert_int_equal(uform_trainer_save(&save), UFORM_IO);

    assert_same_params(&before, &trainer->params);
    /* And the trainer goes on. */
    step = text_step(trainer, executor, &stats);
    assert_int_equal(uform_trainer_step(&step), UFORM_OK);
    assert_int_equal(stats.step, 2);
    snapshot_free(&before);
    uform_executor_free(other);
}

/* A temperature so high (exp(100)) that the loss stays finite but the gradient of logit.scale overflows F32:
 * the norm is not finite, and the step answers so and changes nothing, where it used to answer UFORM_OK with
 * every weight turned NaN. */
static void nonfinite_norm_step_changes_nothing(void **state) {
    stepping_t const *stepping = *state;
    uform_trainer_t *trainer = stepping->trainer;
    trainer->logit_scale->value[0] = 100.0f;
    train_params_t before = snapshot(&trainer->params);
    uform_trainer_step_stats_t stats = {0};
    uform_trainer_step_args_t step = text_step(trainer, stepping->executor, &stats);
    assert_int_equal(uform_trainer_step(&step), UFORM_INVALID_ARGUMENT);
    assert_non_null(strstr(uform_last_error().message, "norm is not finite"));
    assert_same_params(&before, &trainer->params);
    trainer->logit_scale->value[0] = 1.0f; /* and it goes on */
    assert_int_equal(uform_trainer_step(&step), UFORM_OK);
    assert_int_equal(stats.step, 1);
    snapshot_free(&before);
}

static uform_continuation_t cancel_halfway(void *state, size_t completed, size_t total) {
    size_t *calls = state;
    ++*calls;
    return 2 * completed >= total ? UFORM_CANCEL : UFORM_CONTINUE;
}

static void cancel_deferred_and_contended(void **state) {
    stepping_t const *stepping = *state;
    uform_executor_t *executor = stepping->executor;
    uform_trainer_t *trainer = stepping->trainer;
    uform_trainer_step_stats_t stats = {0};
    train_params_t before = snapshot(&trainer->params);
    size_t calls = 0;
    uform_progress_t progress = {.handler = cancel_halfway, .state = &calls, .steps = TRAIN_PHASES};
    uform_trainer_step_args_t step = text_step(trainer, executor, &stats);
    step.progress = &progress;
    assert_int_equal(uform_trainer_step(&step), UFORM_CANCELLED);
    assert_true(calls >= 2);
    assert_same_params(&before, &trainer->params);
    snapshot_free(&before);

    /* Deferred: the outcome, waited twice; the stats written when final. */
    uform_outcome_t outcome;
    uform_outcome_init(&outcome);
    step.progress = NULL;
    step.outcome = &outcome;
    assert_int_equal(uform_trainer_step(&step), UFORM_OK);
    assert_int_equal(uform_outcome_wait(&outcome), UFORM_OK);
    assert_int_equal(uform_outcome_wait(&outcome), UFORM_OK);
    assert_int_equal(stats.step, 1);
    /* A call holding the executor: the step is contended, and nothing moves. */
    uform_outcome_t held;
    uform_outcome_init(&held);
    uform_executor_nop_args_t nop = {.executor = executor, .delay_ns = 200000000, .outcome = &held};
    assert_int_equal(uform_executor_nop(&nop), UFORM_OK);
    step.outcome = NULL;
    assert_int_equal(uform_trainer_step(&step), UFORM_CONTENDED);
    assert_int_equal(uform_outcome_wait(&held), UFORM_OK);
    assert_int_equal(trainer->params.step, 1);
    uform_outcome_destroy(&held);
    uform_outcome_destroy(&outcome);
}

/* A trainer builds its failures' messages ("relation 0: ...") in a buffer of its own. Those messages are
 * copied where they are kept: a deferred step's outcome keeps its message through the trainer's next
 * failure, and neither that message nor the thread's last error dies with the trainer (read after
 * uform_trainer_free, which the ASan build checks byte by byte). */
static void trainer_messages_outlive_the_trainer(void **state) {
    (void)state;
    static char const relation[] = "relation 0: (2, 2) is not a pair of two distinct items of 4";
    static char const image[] = "item 1: the image cannot be decoded (format)";
    uform_executor_t *executor = ram_executor(1, false);
    uform_trainer_config_t config = small_config();
    uform_trainer_t *trainer = make_trainer(executor, &config);
    uform_trainer_step_stats_t stats;
    uform_trainer_step_args_t step = text_step(trainer, executor, &stats);
    static uint32_t const itself[] = {2, 2};
    step.relations = itself;
    step.relations_count = 1;
    uform_outcome_t outcome;
    uform_outcome_init(&outcome);
    step.outcome = &outcome;
    assert_int_equal(uform_trainer_step(&step), UFORM_OK); /* relations are checked on the loop */
    assert_int_equal(uform_outcome_wait(&outcome), UFORM_INVALID_ARGUMENT);
    assert_string_equal(uform_outcome_error(&outcome).message, relation);
    assert_string_equal(uform_last_error().message, relation);

    /* The trainer's next failure, blocking: the outcome still tells its own. */
    step = text_step(trainer, executor, &stats);
    static uform_modality_t const with_image[] = {UFORM_MODALITY_TEXT, UFORM_MODALITY_IMAGE,
                                                  UFORM_MODALITY_TEXT, UFORM_MODALITY_TEXT};
    step.modalities = with_image;
    assert_int_equal(uform_trainer_step(&step), UFORM_FORMAT);
    uform_error_t last = uform_last_error();
    assert_string_equal(last.message, image);
    assert_string_equal(uform_outcome_error(&outcome).message, relation);

    uform_trainer_free(trainer);
    assert_string_equal(last.message, image);
    assert_string_equal(uform_last_error().message, image);
    assert_string_equal(uform_last_error().entry, "uform_trainer_step");
    assert_string_equal(uform_outcome_error(&outcome).message, relation);
    char text[UFORM_ERROR_MESSAGE_SIZE + 64];
    uform_error_render(&last, text, sizeof text);
    assert_string_equal(text,
                        "UForm: format [uform_trainer_step]: item 1: the image cannot be decoded (format)");
    uform_outcome_destroy(&outcome);
    uform_executor_free(executor);
}

int main(void) {
    struct CMUnitTest const tests[] = {
        cmocka_unit_test(configs_and_their_errors),
        cmocka_unit_test_setup_teardown(loss_falls, stepping_setup, stepping_teardown),
        cmocka_unit_test(resume_is_bit_exact),
        cmocka_unit_test(steps_do_not_depend_on_threads),
        cmocka_unit_test_setup_teardown(bad_steps_change_nothing, stepping_setup, stepping_teardown),
        cmocka_unit_test_setup_teardown(nonfinite_norm_step_changes_nothing, stepping_setup,
                                        stepping_teardown),
        cmocka_unit_test_setup_teardown(cancel_deferred_and_contended, stepping_setup, stepping_teardown),
        cmocka_unit_test(trainer_messages_outlive_the_trainer),
    };
    return cmocka_run_group_tests(tests, setup, fixture_teardown);
}
