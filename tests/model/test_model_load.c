/* The load verb end to end: every receiver gives the same model, deferred or blocking, read through
 * the ring or mapped; progress and cancellation; bad checkpoints answer FORMAT or IO and leave the
 * executor usable. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bad_checkpoints.h"
#include "fixtures.h"
#include "model.h"

static char directory[256];
static char tiny_path[300];
static char large_path[300];

static int setup(void **state) {
    (void)state;
    char const *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(directory, sizeof directory, "%s/uform-load-XXXXXX", base);
    if (!mkdtemp(directory)) return -1;
    snprintf(tiny_path, sizeof tiny_path, "%s/tiny.safetensors", directory);
    snprintf(large_path, sizeof large_path, "%s/large.safetensors", directory);
    uform_tiny_checkpoint_args_t tiny = {.path = tiny_path, .seed = 7};
    if (uform_tiny_checkpoint(&tiny) != UFORM_OK) return -1;
    /* Depth 4, hidden 256: about 30 MB, so a load takes many chunks and progress steps. */
    uform_tiny_checkpoint_args_t large = {.path = large_path, .seed = 8, .depth = 4, .hidden = 256};
    if (uform_tiny_checkpoint(&large) != UFORM_OK) return -1;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    unlink(tiny_path);
    unlink(large_path);
    rmdir(directory);
    return 0;
}

static void assert_model_matches_file(uform_model_t *model, char const *path) {
    blob_t file = blob_read(path);
    checkpoint_header_t const *header = &model->header;
    assert_int_equal(header->data_offset + header->data_size, file.size);
    assert_memory_equal(model->data, file.data + header->data_offset, header->data_size);
    free(file.data);
}

/* Loads `path` on `executor` (NULL: the calling thread) into `*model`, blocking; answers the status. */
static uform_status_t load_blocking(uform_executor_t *executor, char const *path,
                                    uform_load_config_t const *config, uform_model_t **model) {
    uform_model_load_args_t args = {.executor = executor, .path = path, .config = config, .model = model};
    return uform_model_load_ram(&args);
}

/* The same load deferred to `outcome`, which the caller initialized; answers what the call answers. */
static uform_status_t load_deferred(uform_executor_t *executor, char const *path,
                                    uform_load_config_t const *config, uform_outcome_t *outcome) {
    uform_model_load_args_t args = {.executor = executor, .path = path, .config = config, .outcome = outcome};
    return uform_model_load_ram(&args);
}

static void assert_same_info(uform_model_info_t const *a, uform_model_info_t const *b) {
    assert_memory_equal(a, b, sizeof *a);
}

static size_t one_thread(void *pool) {
    (void)pool;
    return 1;
}

static void run_on_caller(void *pool, void (*work)(void *, size_t), void *context) {
    (void)pool;
    work(context, 0);
}

static uform_pool_vtable_t const pool_vtable = {one_thread, run_on_caller};

/* Every receiver a load may run on, the calling thread first. */
static receiver_t const receivers[] = {RECEIVER_THREAD, RECEIVER_INLINE, RECEIVER_RAM, RECEIVER_POOL,
                                       RECEIVER_RAM_DOMAIN};
#define RECEIVERS (sizeof receivers / sizeof receivers[0])

static uform_executor_t *make_receiver(size_t receiver) {
    return receiver_make(receivers[receiver], &pool_vtable, NULL);
}

/* A load of the tiny checkpoint still works on `executor`, which is then freed. */
static void assert_usable_then_free(uform_executor_t *executor) {
    uform_model_t *model = NULL;
    assert_int_equal(load_blocking(executor, tiny_path, NULL, &model), UFORM_OK);
    uform_model_free(model);
    uform_executor_free(executor);
}

static void blocking_and_deferred_agree(void **state) {
    (void)state;
    uform_model_info_t reference;
    memset(&reference, 0, sizeof reference);
    for (size_t receiver = 0; receiver < RECEIVERS; ++receiver) {
        for (int map = 0; map < 2; ++map) {
            uform_executor_t *executor = make_receiver(receiver);
            uform_load_config_t config = {.map = map};
            uform_model_t *blocking = NULL;
            assert_int_equal(load_blocking(executor, large_path, &config, &blocking), UFORM_OK);
            assert_non_null(blocking);

            uform_outcome_t outcome;
            uform_outcome_init(&outcome);
            assert_int_equal(load_deferred(executor, large_path, &config, &outcome), UFORM_OK);
            assert_int_equal(uform_outcome_wait(&outcome), UFORM_OK);
            uform_model_t *deferred = uform_outcome_model(&outcome);
            assert_non_null(deferred);
            assert_null(uform_outcome_model(&outcome)); /* taken once */

            uform_model_info_t a, b;
            assert_int_equal(uform_model_info(blocking, &a), UFORM_OK);
            assert_int_equal(uform_model_info(deferred, &b), UFORM_OK);
            assert_same_info(&a, &b);
            if (receiver == 0 && map == 0) reference = a;
            assert_same_info(&a, &reference);
            assert_model_matches_file(blocking, large_path);
            assert_model_matches_file(deferred, large_path);
            assert_true(a.has_text && a.has_image && a.has_video && a.has_audio && a.has_logit);
            assert_int_equal(a.text.transformer.hidden, 256);
            assert_int_equal(a.text.transformer.depth, 4);

            uform_outcome_destroy(&outcome);
            uform_model_free(blocking);
            /* The model outlives the executor it was loaded on. */
            uform_executor_free(executor);
            checkpoint_tensor_t const *tensor = NULL;
            assert_non_null(model_tensor(deferred, "text.embed", &tensor));
            assert_int_equal(tensor->shape[0], 257);
            uform_model_free(deferred);
        }
    }
}

static void progress_and_cancellation(void **state) {
    (void)state;
    for (size_t receiver = 0; receiver < RECEIVERS; ++receiver) {
        uform_executor_t *executor = make_receiver(receiver);
        /* Progress: `steps` reports at most, ending at the total. */
        progress_counter_t counter = {0};
        uform_load_config_t config = {.progress = {count_progress, &counter, 10}};
        uform_model_t *model = NULL;
        assert_int_equal(load_blocking(executor, large_path, &config, &model), UFORM_OK);
        assert_true(counter.calls >= 2 && counter.calls <= 10);
        assert_int_equal(counter.last, counter.total);
        uform_model_free(model);

        /* Cancellation halfway: CANCELLED, no model, nothing leaked, the executor usable. */
        progress_counter_t canceller = {.cancel_halfway = true};
        config.progress = (uform_progress_t){count_progress, &canceller, 10};
        uform_outcome_t outcome;
        uform_outcome_init(&outcome);
        assert_int_equal(load_deferred(executor, large_path, &config, &outcome), UFORM_OK);
        assert_int_equal(uform_outcome_wait(&outcome), UFORM_CANCELLED);
        assert_null(uform_outcome_model(&outcome));
        assert_int_equal(uform_outcome_error(&outcome).status, UFORM_CANCELLED);
        assert_string_equal(uform_outcome_error(&outcome).entry, "uform_model_load_ram");
        assert_true(canceller.last < canceller.total);
        assert_true(2 * canceller.last >= canceller.total);

        /* Blocking: the same status and the thread's last error. */
        canceller = (progress_counter_t){.cancel_halfway = true}; /* counted afresh, from 0 */
        model = (uform_model_t *)&model;
        assert_int_equal(load_blocking(executor, large_path, &config, &model), UFORM_CANCELLED);
        assert_null(model);
        assert_int_equal(uform_last_error().status, UFORM_CANCELLED);

        uform_outcome_destroy(&outcome);
        assert_usable_then_free(executor);
    }
}

static void bad_checkpoints_answer_format(void **state) {
    (void)state;
    bad_checkpoint_t bad[BAD_CHECKPOINTS_MAX];
    size_t count = bad_checkpoints_write(directory, bad, BAD_CHECKPOINTS_MAX);
    assert_true(count >= 20 && count <= BAD_CHECKPOINTS_MAX);
    for (size_t receiver = 0; receiver < RECEIVERS; ++receiver) {
        uform_executor_t *executor = make_receiver(receiver);
        for (size_t i = 0; i < count; ++i) {
            for (int map = 0; map < 2; ++map) {
                uform_load_config_t config = {.map = map};
                uform_model_t *model = NULL;
                uform_status_t status = load_blocking(executor, bad[i].path, &config, &model);
                if (status != bad[i].expected)
                    fail_msg("%s (%s): got %s, expected %s", bad[i].what, bad[i].path,
                             uform_status_name(status), uform_status_name(bad[i].expected));
                if (status == UFORM_OK) {
                    uform_model_free(model);
                    continue;
                }
                assert_null(model);
                uform_error_t error = uform_last_error();
                assert_string_equal(error.entry, "uform_model_load_ram");
                if (bad[i].message) assert_string_equal(error.message, bad[i].message);
            }
        }
        assert_usable_then_free(executor);
    }
    bad_checkpoints_remove(bad, count);
}

/* The bad checkpoint described as `what`, loaded mapped and through the ring on the calling thread and
 * on a RAM executor: FORMAT with its message both ways, nothing loaded. */
static void assert_variant_refused(char const *what) {
    bad_checkpoint_t bad[BAD_CHECKPOINTS_MAX];
    size_t count = bad_checkpoints_write(directory, bad, BAD_CHECKPOINTS_MAX);
    assert_true(count > 0);
    size_t found = count;
    for (size_t i = 0; i < count; ++i)
        if (strcmp(bad[i].what, what) == 0) found = i;
    if (found == count) fail_msg("no bad checkpoint \"%s\"", what);
    receiver_t const kinds[] = {RECEIVER_THREAD, RECEIVER_RAM_TWO};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; ++k) {
        uform_executor_t *executor = receiver_make(kinds[k], NULL, NULL);
        for (int map = 0; map < 2; ++map) {
            uform_load_config_t config = {.map = map};
            uform_model_t *model = NULL;
            uform_status_t status = load_blocking(executor, bad[found].path, &config, &model);
            if (status != UFORM_FORMAT)
                fail_msg("%s, %s: %s", what, map ? "mapped" : "ring", uform_status_name(status));
            assert_null(model);
            assert_string_equal(uform_last_error().message, bad[found].message);
        }
        uform_executor_free(executor);
    }
    bad_checkpoints_remove(bad, count);
}

/* A data section at an odd file offset: refused on both paths, instead of a mapped load whose BF16
 * weights sit at odd addresses. */
static void odd_data_offset_misaligns_mapped_load(void **state) {
    (void)state;
    assert_variant_refused("data section at an odd offset");
}

/* An image std of 1e-45 (and a mean of -3e38): refused, instead of a model whose images embed to NaN. */
static void tiny_image_std_embeds_nan(void **state) {
    (void)state;
    assert_variant_refused("image std 1e-45");
    assert_variant_refused("image mean 3e38");
}

static void missing_files_answer_io(void **state) {
    (void)state;
    char missing[400], through_file[400];
    snprintf(missing, sizeof missing, "%s/missing.safetensors", directory);
    snprintf(through_file, sizeof through_file, "%s/model.safetensors", tiny_path);
    for (size_t receiver = 0; receiver < RECEIVERS; ++receiver) {
        uform_executor_t *executor = make_receiver(receiver);
        uform_model_t *model = NULL;
        assert_int_equal(load_blocking(executor, missing, NULL, &model), UFORM_IO);
        uform_error_t error = uform_last_error();
        char text[200];
        uform_error_render(&error, text, sizeof text);
        assert_string_equal(
            text, "UForm: io [uform_model_load_ram]: cannot open checkpoint: no such file or folder");
        /* a path through a file, as if it were a folder: the open says why */
        assert_int_equal(load_blocking(executor, through_file, NULL, &model), UFORM_IO);
        assert_string_equal(uform_last_error().message,
                            "cannot open checkpoint: a part of its path is not a folder");
        /* A directory is read as a pretrained model's folder, which this one is not. */
        assert_int_equal(load_blocking(executor, directory, NULL, &model), UFORM_IO);
        assert_non_null(strstr(uform_last_error().message, "config.json: cannot open it in"));
        uform_executor_free(executor);
    }
}

static void wrong_arguments(void **state) {
    (void)state;
    uform_model_t *model = NULL;
    assert_int_equal(uform_model_load_ram(NULL), UFORM_INVALID_ARGUMENT);
    uform_model_load_args_t args = {.path = NULL, .model = &model};
    assert_int_equal(uform_model_load_ram(&args), UFORM_INVALID_ARGUMENT);
    args.path = "";
    assert_int_equal(uform_model_load_ram(&args), UFORM_INVALID_ARGUMENT);
    args = (uform_model_load_args_t){.path = tiny_path, .model = NULL};
    assert_int_equal(uform_model_load_ram(&args), UFORM_INVALID_ARGUMENT);
    /* An outcome that was never initialized is refused, and left alone. */
    uform_outcome_t outcome;
    memset(&outcome, 0xab, sizeof outcome);
    args = (uform_model_load_args_t){.path = tiny_path, .outcome = &outcome};
    assert_int_equal(uform_model_load_ram(&args), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_outcome_status(&outcome), UFORM_INVALID_ARGUMENT);
    /* An outcome whose model is never taken releases it (LeakSanitizer checks). */
    uform_outcome_init(&outcome);
    assert_int_equal(uform_model_load_ram(&args), UFORM_OK);
    assert_int_equal(uform_outcome_wait(&outcome), UFORM_OK);
    assert_int_equal(uform_model_load_ram(&args), UFORM_OK); /* reused: the first model is released */
    assert_int_equal(uform_outcome_wait(&outcome), UFORM_OK);
    uform_outcome_destroy(&outcome);
    assert_int_equal(uform_model_info(NULL, NULL), UFORM_INVALID_ARGUMENT);
    /* With CUDA, a VRAM load needs a VRAM executor; without, it is not built. */
    assert_int_equal(uform_model_load_vram(&args),
                     UFORM_WITH_CUDA ? UFORM_INVALID_ARGUMENT : UFORM_UNSUPPORTED);
}

int main(void) {
    struct CMUnitTest const tests[] = {
        cmocka_unit_test(blocking_and_deferred_agree),
        cmocka_unit_test(progress_and_cancellation),
        cmocka_unit_test(bad_checkpoints_answer_format),
        cmocka_unit_test(odd_data_offset_misaligns_mapped_load),
        cmocka_unit_test(tiny_image_std_embeds_nan),
        cmocka_unit_test(missing_files_answer_io),
        cmocka_unit_test(wrong_arguments),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
