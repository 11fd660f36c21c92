/* A CPU-only process of a CUDA-enabled build maps no CUDA library: libuform links neither the CUDA runtime
 * nor cuBLASLt, and opens them, after the driver, only when the first VRAM executor is made
 * (kernels/cuda/cuda_library.h). Linked to libuform.so as a user's program is.
 *
 * The process's mappings (/proc/self/maps) are read at start, then after CPU work of every kind (a RAM
 * executor, a model loaded, texts and pixels encoded, arenas), then after uform_executor_create_vram:
 * where that fails because the driver is missing (every CI machine), it answers UFORM_DEVICE naming
 * libcuda.so.1 and still nothing of CUDA is mapped; where the driver is there, the runtime and cuBLASLt
 * are mapped from then on, which shows that the check sees them, and NCCL still is not (only a mesh over
 * VRAM executors opens it). A build without CUDA answers
 * UFORM_UNSUPPORTED and maps nothing either. Before the engine opened them itself, the first check
 * failed: every process linked to libuform.so mapped libcudart and libcublasLt at start. Skipped where
 * /proc/self/maps cannot be read. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"

#define SKIP 77

static char const *const cuda_libraries[] = {"libcudart", "libcublasLt", "libcublas.", "libcuda.so",
                                             "libnccl"};
static uform_model_t *model; /* on the host */

/* The path of the first mapping of /proc/self/maps whose file names `library` (any of cuda_libraries
 * for NULL), in `found`; false when none is mapped. */
static bool mapped(char const *library, char *found, size_t capacity) {
    FILE *maps = fopen("/proc/self/maps", "r");
    assert_non_null(maps);
    char line[4096];
    bool seen = false;
    while (!seen && fgets(line, sizeof line, maps)) {
        char const *path = strchr(line, '/');
        for (size_t i = 0; path && !seen && i < sizeof cuda_libraries / sizeof *cuda_libraries; ++i) {
            char const *name = library ? library : cuda_libraries[i];
            seen = strstr(path, name) != NULL;
        }
        if (seen) snprintf(found, capacity, "%s", path);
    }
    fclose(maps);
    return seen;
}

static void assert_nothing_of_cuda_mapped(char const *when) {
    char found[4096];
    if (mapped(NULL, found, sizeof found)) fail_msg("%s, the process maps %s", when, found);
}

static uform_status_t encode_texts(batch_t const *batch, uform_executor_t *executor, uform_outputs_t outputs,
                                   uform_arena_t *arena, uform_encode_config_t const *config,
                                   uform_outcome_t *outcome, uform_encoded_t *encoded) {
    uform_text_encode_args_t args = {ENCODE_ARGS(model), .texts = batch_tape(batch)};
    return uform_text_encode(&args);
}

static uform_status_t encode_pixels(batch_t const *batch, uform_executor_t *executor, uform_outputs_t outputs,
                                    uform_arena_t *arena, uform_encode_config_t const *config,
                                    uform_outcome_t *outcome, uform_encoded_t *encoded) {
    uform_image_encode_pixels_args_t args = {ENCODE_ARGS(model), .pixels = batch_tape(batch),
                                             .heights = batch->heights, .widths = batch->widths};
    return uform_image_encode_pixels(&args);
}

static void cpu_process_maps_no_cuda(void **state) {
    (void)state;
    assert_nothing_of_cuda_mapped("at start");
    batch_t *texts = batch_new(BATCH_TEXTS), *pixels = batch_new(BATCH_PIXELS);
    batch_add(texts, "a cat", 5);
    batch_add(texts, "a dog", 5);
    uint8_t rgb[40 * 30 * 3];
    for (size_t i = 0; i < sizeof rgb; ++i)
        rgb[i] = (uint8_t)(i * 7);
    batch_add_pixels(pixels, rgb, sizeof rgb, 40, 30);
    batch_add_pixels(pixels, rgb, sizeof rgb, 30, 40);
    uform_executor_t *executor = ram_executor(2, false);
    static unsigned char copy[1 << 20];
    for (int deferred = 0; deferred < 2; ++deferred) {
        encode_copy(encode_texts, texts, executor, deferred, copy);
        encode_copy(encode_pixels, pixels, executor, deferred, copy);
    }
    encode_copy(encode_texts, texts, NULL, false, copy);
    uform_executor_free(executor);
    batch_free(texts);
    batch_free(pixels);
    assert_nothing_of_cuda_mapped("after CPU work");
}

static void vram_executor_loads_cuda_or_names_what_is_missing(void **state) {
    (void)state;
    uform_executor_t *vram = NULL;
    uform_status_t status = uform_executor_create_vram(NULL, &vram);
    char found[4096];
    if (status == UFORM_OK) {
        assert_true(mapped("libcudart", found, sizeof found));
        assert_true(mapped("libcublasLt", found, sizeof found));
        if (mapped("libnccl", found, sizeof found)) fail_msg("a VRAM executor alone maps %s", found);
        uform_executor_free(vram);
        return;
    }
    uform_error_t error = uform_last_error();
    fprintf(stderr, "  uform_executor_create_vram: %s\n", last_error_text().text);
    assert_null(vram);
    if (!(uform_features() & UFORM_FEATURE_CUDA)) {
        assert_int_equal(status, UFORM_UNSUPPORTED);
        assert_nothing_of_cuda_mapped("after a VRAM executor refused");
        return;
    }
    assert_int_equal(status, UFORM_DEVICE);
    assert_string_equal(error.entry, "uform_executor_create_vram");
    if (strstr(error.message, "libcuda.so.1")) assert_nothing_of_cuda_mapped("without a driver");
    /* A second try answers alike: a failed load keeps nothing and is tried again. */
    assert_int_equal(uform_executor_create_vram(NULL, &vram), status);
    assert_string_equal(uform_last_error().message, error.message);
}

int main(void) {
    FILE *maps = fopen("/proc/self/maps", "r");
    if (!maps) {
        printf("SKIP: /proc/self/maps cannot be read here\n");
        return SKIP;
    }
    fclose(maps);
    uform_tiny_checkpoint_args_t tiny = {.seed = 3};
    uform_model_info_t info;
    if (fixture_setup("maps", &tiny, &model, &info) != 0) return 1;
    struct CMUnitTest const tests[] = {
        cmocka_unit_test(cpu_process_maps_no_cuda),
        cmocka_unit_test(vram_executor_loads_cuda_or_names_what_is_missing),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    fixture_teardown(NULL);
    return failed;
}
