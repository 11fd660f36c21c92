/* I8 weights (uform_weights_t): a checkpoint quantized ahead (uform_checkpoint_quantize) is a valid
 * format-4 file holding, for every block's linear layer, the bytes a load asking for I8 makes, and every
 * other tensor as it was; it embeds the same bits as that load, on every tower; BF16 widens it back, and
 * so does a trainer resuming from it; a layer of more than 65536 inputs stays BF16; a NaN in a weight fails
 * every item with I8 weights as with BF16 ones; bad arguments and files answer their statuses. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "checkpoint.h"
#include "fixtures.h"
#include "kernels.h"
#include "model.h"
#include "tower.h"

static char tiny_path[512], quantized_path[512];

static int setup(void **state) {
    uform_tiny_checkpoint_args_t tiny = {.seed = 5};
    if (fixture_setup("weights", &tiny, NULL, NULL)) return -1;
    fixture_path("tiny.safetensors", tiny_path, sizeof tiny_path);
    fixture_path("quantized.safetensors", quantized_path, sizeof quantized_path);
    uform_checkpoint_quantize_args_t args = {.input = tiny_path, .output = quantized_path};
    (void)state;
    return uform_checkpoint_quantize(&args) == UFORM_OK ? 0 : -1;
}

/* ---- Helpers ------------------------------------------------------------------------------------ */

static uform_model_t *load(char const *path, uform_weights_t weights, uform_executor_t *executor) {
    uform_load_config_t config = {.weights = weights};
    uform_model_t *model = NULL;
    uform_model_load_args_t args = {.executor = executor, .path = path, .config = &config, .model = &model};
    if (uform_model_load_ram(&args) != UFORM_OK) fail_msg("%s", last_error_text().text);
    return model;
}

/* A tiny checkpoint of one block whose MLP is `mlp` wide, `name`.safetensors in the folder, and its copy
 * quantized ahead, `name`-i8.safetensors: their paths into `path` and `quantized` (512 bytes each). */
static void write_one_block(char const *name, uint64_t seed, size_t mlp, char *path, char *quantized) {
    char file[64];
    snprintf(file, sizeof file, "%s.safetensors", name);
    fixture_path(file, path, 512);
    snprintf(file, sizeof file, "%s-i8.safetensors", name);
    fixture_path(file, quantized, 512);
    uform_tiny_checkpoint_args_t tiny = {.path = path, .seed = seed, .depth = 1, .mlp = mlp};
    assert_int_equal(uform_tiny_checkpoint(&tiny), UFORM_OK);
    uform_checkpoint_quantize_args_t args = {.input = path, .output = quantized};
    assert_int_equal(uform_checkpoint_quantize(&args), UFORM_OK);
}

/* A checkpoint's header, parsed. */
static checkpoint_header_t header_of(blob_t const *file) {
    uint64_t length = 0;
    char const *message = NULL;
    checkpoint_header_t header;
    assert_int_equal(checkpoint_prefix(file->data, 8, file->size, &length, &message), UFORM_OK);
    if (checkpoint_parse((char const *)file->data + 8, length, file->size, &header, &message) != UFORM_OK)
        fail_msg("%s", message);
    return header;
}

static uint8_t const *tensor_bytes(blob_t const *file, checkpoint_header_t const *header, char const *name,
                                   checkpoint_tensor_t const **tensor) {
    *tensor = checkpoint_find(header, name);
    assert_non_null(*tensor);
    return file->data + header->data_offset + (*tensor)->begin;
}

/* The embeddings (F32) of three texts, three images of 32 x 32 and two sounds of 1 s on `model`, one row
 * after another, into `rows` (room for 8 * 64). */
static void embed_everything(uform_model_t *model, uform_executor_t *executor, float *rows) {
    uform_arena_t *arena = executor ? NULL : arena_on_host();
    if (executor) assert_int_equal(uform_arena_create(executor, &arena), UFORM_OK);
    char const texts[] = "a cata dogsomething longer than the others";
    size_t text_offsets[] = {0, 5, 10, sizeof texts - 1};
    static uint8_t pixels[3 * 32 * 32 * 3];
    static float samples[2 * 16000];
    random_seed(9);
    for (size_t i = 0; i < sizeof pixels; ++i)
        pixels[i] = (uint8_t)random_below(256);
    for (size_t i = 0; i < 2 * 16000; ++i)
        samples[i] = sinf((float)i * (i < 16000 ? 0.05f : 0.11f));
    size_t pixel_offsets[] = {0, 3072, 6144, 9216}, heights[] = {32, 32, 32}, widths[] = {32, 32, 32};
    size_t sample_offsets[] = {0, 16000, 32000};
    uform_encoded_t encoded;
    uform_text_encode_args_t text = {.model = model,
                                     .executor = executor,
                                     .outputs = UFORM_OUTPUT_EMBEDDINGS,
                                     .arena = arena,
                                     .encoded = &encoded,
                                     .texts = {texts, text_offsets, 3, sizeof texts - 1}};
    assert_int_equal(uform_text_encode(&text), UFORM_OK);
    memcpy(rows, encoded.embeddings.data, 3 * 64 * sizeof(float));
    uform_image_encode_pixels_args_t image = {.model = model,
                                              .executor = executor,
                                              .outputs = UFORM_OUTPUT_EMBEDDINGS,
                                              .arena = arena,
                                              .encoded = &encoded,
                                              .pixels = {pixels, pixel_offsets, 3, sizeof pixels},
                                              .heights = heights,
                                              .widths = widths};
    assert_int_equal(uform_image_encode_pixels(&image), UFORM_OK);
    memcpy(rows + 3 * 64, encoded.embeddings.data, 3 * 64 * sizeof(float));
    uform_audio_encode_samples_args_t audio = {.model = model,
                                               .executor = executor,
                                               .outputs = UFORM_OUTPUT_EMBEDDINGS,
                                               .arena = arena,
                                               .encoded = &encoded,
                                               .samples = {samples, sample_offsets, 2, 2 * 16000},
                                               .rate = 16000};
    uform_status_t status = uform_audio_encode_samples(&audio);
    if (status == UFORM_OK) memcpy(rows + 6 * 64, encoded.embeddings.data, 2 * 64 * sizeof(float));
    if (status != UFORM_OK) memset(rows + 6 * 64, 0, 2 * 64 * sizeof(float)); /* a build without FFmpeg */
    uform_arena_free(arena);
}

/* ---- The quantized file ------------------------------------------------------------------------- */

typedef struct file_pair {
    blob_t tiny, quantized;
    checkpoint_header_t tiny_header, quantized_header;
    size_t layers, others;
} file_pair_t;

/* Every tensor of the schema: a quantizable BF16 weight became I8 with the bytes kernel_quantize_weights
 * makes, its scales beside it; the others are the same bytes. */
static int check_tensor(checkpoint_schema_tensor_t const *tensor, void *context) {
    file_pair_t *pair = context;
    checkpoint_tensor_t const *before, *after, *scales;
    uint8_t const *old = tensor_bytes(&pair->tiny, &pair->tiny_header, tensor->name, &before);
    uint8_t const *new = tensor_bytes(&pair->quantized, &pair->quantized_header, tensor->name, &after);
    char name[sizeof tensor->name + sizeof CHECKPOINT_SCALE_SUFFIX];
    snprintf(name, sizeof name, "%s%s", tensor->name, CHECKPOINT_SCALE_SUFFIX);
    if (!checkpoint_quantizable(tensor)) {
        assert_int_equal(after->dtype, before->dtype);
        assert_memory_equal(new, old, before->end - before->begin);
        assert_null(checkpoint_find(&pair->quantized_header, name));
        ++pair->others;
        return 0;
    }
    size_t n = (size_t)tensor->shape[0], k = (size_t)tensor->shape[1];
    assert_int_equal(after->dtype, CHECKPOINT_I8);
    float const *stored_scales =
        (float const *)(void const *)tensor_bytes(&pair->quantized, &pair->quantized_header, name, &scales);
    assert_int_equal(scales->dtype, CHECKPOINT_F32);
    int8_t *q = malloc(k);
    for (size_t row = 0; row < n; ++row) {
        float scale;
        kernel_quantize_weights(q, &scale, (uint16_t const *)(void const *)old + row * k, k);
        assert_memory_equal(new + row *k, q, k);
        assert_memory_equal(&stored_scales[row], &scale, sizeof scale);
    }
    free(q);
    ++pair->layers;
    return 0;
}

static void quantized_file_holds_i8_layers(void **state) {
    (void)state;
    file_pair_t pair = {.tiny = blob_read(tiny_path), .quantized = blob_read(quantized_path)};
    pair.tiny_header = header_of(&pair.tiny);
    pair.quantized_header = header_of(&pair.quantized);
    checkpoint_schema_each(&pair.tiny_header.info, check_tensor, &pair);
    assert_int_equal(pair.layers, 3 * 2 * 4); /* text, image, audio: 2 blocks of qkv, out, up, down */
    assert_int_equal(pair.quantized_header.tensors_count, pair.tiny_header.tensors_count + pair.layers);
    assert_int_equal(pair.quantized_header.info.parameters, pair.tiny_header.info.parameters);
    assert_true(pair.quantized.size < pair.tiny.size * 7 / 10);
    checkpoint_header_free(&pair.tiny_header);
    checkpoint_header_free(&pair.quantized_header);
    free(pair.tiny.data);
    free(pair.quantized.data);
}

/* ---- Loads -------------------------------------------------------------------------------------- */

/* Which layers of a loaded tower hold I8 weights: the blocks' four as asked, the projection never; and the
 * model's info says so. */
static void assert_layers(uform_model_t const *model, bool i8) {
    uform_model_info_t info;
    assert_int_equal(uform_model_info(model, &info), UFORM_OK);
    assert_int_equal(info.weights, i8 ? UFORM_WEIGHTS_I8 : UFORM_WEIGHTS_BF16);
    struct tower const *towers[] = {model->text, model->image, model->audio};
    for (size_t t = 0; t < 3; ++t)
        for (size_t b = 0; b < towers[t]->depth; ++b) {
            tower_block_t const *block = &towers[t]->blocks[b];
            assert_true(block->qkv.i8 == i8 && block->out.i8 == i8 && block->up.i8 == i8 &&
                        block->down.i8 == i8);
            assert_false(towers[t]->proj.i8);
            assert_false(towers[t]->patches.patch.i8);
        }
}

static double cosine(float const *a, float const *b, size_t n) {
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < n; ++i)
        ab += (double)a[i] * b[i], aa += (double)a[i] * a[i], bb += (double)b[i] * b[i];
    return aa == 0 && bb == 0 ? 1.0 : ab / sqrt(aa * bb);
}

/* The quantized file loads as I8 and embeds, on every tower, the bits a BF16 file asked to load as I8
 * embeds, on the calling thread and on a RAM executor of 2 threads; widened back to BF16 it stays near. */
static void quantized_file_embeds_as_i8_load(void **state) {
    (void)state;
    static float stored[8 * 64], asked[8 * 64], widened[8 * 64], bf16[8 * 64];
    uform_executor_t *executors[] = {NULL, ram_executor(2, false)};
    for (size_t e = 0; e < 2; ++e) {
        uform_model_t *models[] = {load(quantized_path, UFORM_WEIGHTS_STORED, executors[e]),
                                   load(tiny_path, UFORM_WEIGHTS_I8, executors[e]),
                                   load(quantized_path, UFORM_WEIGHTS_BF16, executors[e]),
                                   load(tiny_path, UFORM_WEIGHTS_STORED, executors[e])};
        float *rows[] = {stored, asked, widened, bf16};
        for (size_t m = 0; m < 4; ++m) {
            assert_layers(models[m], m < 2);
            embed_everything(models[m], executors[e], rows[m]);
            uform_model_free(models[m]);
        }
        assert_memory_equal(stored, asked, sizeof stored);
        for (size_t row = 0; row < 8; ++row) {
            assert_true(cosine(widened + row * 64, asked + row * 64, 64) >= 0.999);
            assert_true(cosine(bf16 + row * 64, asked + row * 64, 64) >= 0.99);
        }
    }
    uform_executor_free(executors[1]);
}

/* A trainer resuming from the quantized file starts from q * scale: saved at once, its block weights are
 * what a BF16 load of the quantized file holds, q * scale rounded. */
static void trainer_resumes_from_quantized(void **state) {
    (void)state;
    char saved[512];
    fixture_path("resumed.safetensors", saved, sizeof saved);
    uform_trainer_config_t config;
    uform_trainer_config_default(&config);
    config.resume_path = quantized_path;
    uform_trainer_t *trainer = NULL;
    uform_executor_t *executor = ram_executor(1, false);
    uform_trainer_init_args_t init = {.executor = executor, .config = &config, .trainer = &trainer};
    assert_int_equal(uform_trainer_init_ram(&init), UFORM_OK);
    uform_trainer_save_args_t save = {.trainer = trainer, .executor = executor, .path = saved};
    assert_int_equal(uform_trainer_save(&save), UFORM_OK);
    uform_trainer_free(trainer);
    uform_executor_free(executor);
    blob_t file = blob_read(saved), quantized = blob_read(quantized_path);
    checkpoint_header_t header = header_of(&file), quantized_header = header_of(&quantized);
    checkpoint_tensor_t const *tensor, *weight, *scales;
    uint16_t const *widened =
        (uint16_t const *)(void const *)tensor_bytes(&file, &header, "text.blocks.1.mlp.up.weight", &tensor);
    int8_t const *q =
        (int8_t const *)tensor_bytes(&quantized, &quantized_header, "text.blocks.1.mlp.up.weight", &weight);
    float const *scale = (float const *)(void const *)tensor_bytes(
        &quantized, &quantized_header, "text.blocks.1.mlp.up.weight.scale", &scales);
    assert_int_equal(tensor->dtype, CHECKPOINT_BF16);
    for (size_t i = 0; i < tensor->shape[0] * tensor->shape[1]; ++i)
        assert_int_equal(widened[i], f32_to_bf16((float)q[i] * scale[i / tensor->shape[1]]));
    checkpoint_header_free(&header);
    checkpoint_header_free(&quantized_header);
    free(file.data);
    free(quantized.data);
}

/* A layer of 65537 inputs keeps BF16 weights, asked for I8 at load or quantized ahead: mlp.down of a model
 * whose MLP is 65537 wide, while mlp.up, of 64 inputs, is I8. */
static void wide_layer_stays_bf16(void **state) {
    (void)state;
    char wide[512], wide_quantized[512];
    write_one_block("wide", 3, KERNEL_I8_DEPTH_MAX + 1, wide, wide_quantized);
    uform_model_t *model = load(wide, UFORM_WEIGHTS_I8, NULL);
    assert_true(model->text->blocks[0].up.i8);
    assert_false(model->text->blocks[0].down.i8);
    uform_model_info_t info;
    assert_int_equal(uform_model_info(model, &info), UFORM_OK);
    assert_int_equal(info.weights, UFORM_WEIGHTS_I8); /* some of its layers are */
    uform_model_free(model);
    blob_t file = blob_read(wide_quantized);
    checkpoint_header_t header = header_of(&file);
    assert_int_equal(checkpoint_find(&header, "text.blocks.0.mlp.up.weight")->dtype, CHECKPOINT_I8);
    assert_int_equal(checkpoint_find(&header, "text.blocks.0.mlp.down.weight")->dtype, CHECKPOINT_BF16);
    assert_null(checkpoint_find(&header, "text.blocks.0.mlp.down.weight.scale"));
    checkpoint_header_free(&header);
    /* Stored I8 all the same, with its scales: the reader refuses it. */
    uint64_t length = 0;
    char const *message = NULL;
    assert_int_equal(checkpoint_prefix(file.data, 8, file.size, &length, &message), UFORM_OK);
    json_t *root = json_loadb((char const *)file.data + 8, (size_t)length, 0, NULL);
    json_t *down = json_object_get(root, "text.blocks.0.mlp.down.weight");
    json_int_t begin = json_integer_value(json_array_get(json_object_get(down, "data_offsets"), 0));
    json_object_set_new(down, "dtype", json_string("I8"));
    json_object_set_new(down, "data_offsets",
                        json_pack("[I, I]", begin, begin + 64 * (KERNEL_I8_DEPTH_MAX + 1)));
    json_int_t scales_at = (begin + 2 * 64 * (KERNEL_I8_DEPTH_MAX + 1) - 256) / 4 * 4; /* in the old bytes */
    json_object_set_new(root, "text.blocks.0.mlp.down.weight.scale",
                        json_pack("{s:s, s:[i], s:[I, I]}", "dtype", "F32", "shape", 64, "data_offsets",
                                  scales_at, scales_at + 256));
    char *text = json_dumps(root, JSON_COMPACT);
    size_t used = strlen(text), padded = used + ((size_t)length - used) % 8; /* the data stays aligned */
    char *spaced = malloc(padded);
    memset(spaced, ' ', padded);
    memcpy(spaced, text, used);
    assert_int_equal(checkpoint_parse(spaced, padded, file.size - (size_t)length + padded, &header, &message),
                     UFORM_FORMAT);
    assert_string_equal(message, "I8 weight of more than 65536 inputs");
    free(spaced);
    free(text);
    json_decref(root);
    free(file.data);
}

/* An MLP of odd width gives BF16 tensors of odd counts (the biases) before the F32 scales: each tensor's
 * data still starts at a multiple of its dtype's size, so the quantized file loads (mapped too). */
static void odd_counts_stay_aligned(void **state) {
    (void)state;
    char odd[512], odd_quantized[512];
    write_one_block("odd", 4, 129, odd, odd_quantized);
    for (int map = 0; map < 2; ++map) {
        uform_load_config_t config = {.map = map};
        uform_model_t *model = NULL;
        uform_model_load_args_t load = {.path = odd_quantized, .config = &config, .model = &model};
        if (uform_model_load_ram(&load) != UFORM_OK) fail_msg("%s", last_error_text().text);
        assert_true(model->text->blocks[0].up.i8);
        uform_model_free(model);
    }
}

/* A NaN in a block's weight: every text fails with FORMAT and zero rows with I8 weights, as with BF16. */
static void nan_weight_fails_every_item(void **state) {
    (void)state;
    char path[512];
    blob_t file = blob_read(tiny_path);
    checkpoint_header_t header = header_of(&file);
    checkpoint_tensor_t const *tensor;
    uint8_t *at = (uint8_t *)(uintptr_t)tensor_bytes(&file, &header, "text.blocks.0.mlp.up.weight", &tensor);
    at[2 * 70] = 0xc0, at[2 * 70 + 1] = 0x7f; /* little-endian 0x7FC0: a quiet NaN */
    blob_write("nan.safetensors", &file);
    fixture_path("nan.safetensors", path, sizeof path);
    checkpoint_header_free(&header);
    free(file.data);
    char const texts[] = "a cata dog";
    size_t offsets[] = {0, 5, 10};
    uform_weights_t const kinds[] = {UFORM_WEIGHTS_STORED, UFORM_WEIGHTS_I8};
    for (size_t w = 0; w < 2; ++w) {
        uform_model_t *model = load(path, kinds[w], NULL);
        uform_arena_t *arena = arena_on_host();
        uform_encoded_t encoded;
        uform_text_encode_args_t args = {.model = model,
                                         .outputs = UFORM_OUTPUT_EMBEDDINGS,
                                         .arena = arena,
                                         .encoded = &encoded,
                                         .texts = {texts, offsets, 2, 10}};
        assert_int_equal(uform_text_encode(&args), UFORM_OK);
        for (size_t i = 0; i < 2; ++i) {
            assert_int_equal(encoded.statuses[i], UFORM_FORMAT);
            for (size_t c = 0; c < 64; ++c)
                assert_true(((float const *)encoded.embeddings.data)[i * 64 + c] == 0.0f);
        }
        uform_arena_free(arena);
        uform_model_free(model);
    }
}

/* ---- Arguments and files ------------------------------------------------------------------------ */

/* The output may be the input: quantizing in place writes the same bytes; quantizing a quantized file
 * changes nothing. */
static void quantize_in_place(void **state) {
    (void)state;
    char copy[512];
    fixture_path("in-place.safetensors", copy, sizeof copy);
    blob_t tiny = blob_read(tiny_path), quantized = blob_read(quantized_path);
    blob_write("in-place.safetensors", &tiny);
    for (size_t round = 0; round < 2; ++round) {
        uform_checkpoint_quantize_args_t args = {.input = copy, .output = copy};
        assert_int_equal(uform_checkpoint_quantize(&args), UFORM_OK);
        blob_t again = blob_read(copy);
        assert_int_equal(again.size, quantized.size);
        assert_memory_equal(again.data, quantized.data, quantized.size);
        free(again.data);
    }
    free(tiny.data);
    free(quantized.data);
}

static void bad_arguments_and_files(void **state) {
    (void)state;
    assert_int_equal(uform_checkpoint_quantize(NULL), UFORM_INVALID_ARGUMENT);
    uform_checkpoint_quantize_args_t args = {.input = tiny_path, .output = ""};
    assert_int_equal(uform_checkpoint_quantize(&args), UFORM_INVALID_ARGUMENT);
    args = (uform_checkpoint_quantize_args_t){.input = NULL, .output = quantized_path};
    assert_int_equal(uform_checkpoint_quantize(&args), UFORM_INVALID_ARGUMENT);
    char missing[512], nowhere[512];
    fixture_path("missing.safetensors", missing, sizeof missing);
    fixture_path("no-such-folder/out.safetensors", nowhere, sizeof nowhere);
    args = (uform_checkpoint_quantize_args_t){.input = missing, .output = nowhere};
    assert_int_equal(uform_checkpoint_quantize(&args), UFORM_IO);
    assert_string_equal(
        last_error_text().text,
        "UForm: io [uform_checkpoint_quantize]: cannot open checkpoint: no such file or folder");
    args.input = tiny_path;
    assert_int_equal(uform_checkpoint_quantize(&args), UFORM_IO);
    assert_string_equal(uform_last_error().entry, "uform_checkpoint_quantize");
    /* A weights value outside the enumeration, on the calling thread and deferred alike. */
    uform_load_config_t config = {.weights = (uform_weights_t)3};
    uform_model_t *model = NULL;
    uform_model_load_args_t load = {.path = tiny_path, .config = &config, .model = &model};
    assert_int_equal(uform_model_load_ram(&load), UFORM_INVALID_ARGUMENT);
    assert_string_equal(uform_last_error().message, "config->weights is not a uform_weights_t");
    uform_outcome_t outcome;
    uform_outcome_init(&outcome);
    load = (uform_model_load_args_t){.path = tiny_path, .config = &config, .outcome = &outcome};
    assert_int_equal(uform_model_load_ram(&load), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_outcome_wait(&outcome), UFORM_INVALID_ARGUMENT);
    uform_outcome_destroy(&outcome);
    /* A VRAM load of I8 weights: refused in every build (without CUDA, as every VRAM load). */
    config.weights = UFORM_WEIGHTS_I8;
    load = (uform_model_load_args_t){.path = tiny_path, .config = &config, .model = &model};
    assert_int_equal(uform_model_load_vram(&load),
                     UFORM_WITH_CUDA ? UFORM_INVALID_ARGUMENT : UFORM_UNSUPPORTED);
}

int main(void) {
    struct CMUnitTest const tests[] = {
        cmocka_unit_test(quantized_file_holds_i8_layers),
        cmocka_unit_test(quantized_file_embeds_as_i8_load),
        cmocka_unit_test(trainer_resumes_from_quantized),
        cmocka_unit_test(wide_layer_stays_bf16),
        cmocka_unit_test(odd_counts_stay_aligned),
        cmocka_unit_test(nan_weight_fails_every_item),
        cmocka_unit_test(quantize_in_place),
        cmocka_unit_test(bad_arguments_and_files),
    };
    return cmocka_run_group_tests(tests, setup, fixture_teardown);
}
