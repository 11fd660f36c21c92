/* The host side of the VRAM trainer (src/train/train_device.h), which needs no device: the flat buffers'
 * layout over the trainer's tensors (chunk-aligned, in order, a decay byte per chunk as the tensor says),
 * the copies a save and a resume go through (a trainer's parameters packed and unpacked into other
 * parameters save the same bytes, checkpoint and optimizer state, as the original: the save format is the
 * RAM trainer's), the byte table's token lists, and a step's staged arrays for a batch of every modality
 * checked value by value against what the kernels that read them require. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"
#include "kernels.h"
#include "small_config.h"
#include "train_device.h"

#define COUNT(array) (sizeof(array) / sizeof((array)[0]))

static void params_of(train_params_t *params, uint64_t seed) {
    uform_trainer_config_t const config = small_config_of(32, 16);
    uform_model_info_t info;
    char const *message = NULL;
    assert_int_equal(train_info_from_config(&config, &info, &message), UFORM_OK);
    assert_int_equal(train_params_init(params, &info, seed), UFORM_OK);
}

/* Every tensor at a chunk boundary, in order, none overlapping the next; the chunks end to end; each chunk
 * decays as its tensor does. */
static void test_layout(void **state) {
    (void)state;
    train_params_t params;
    params_of(&params, 1);
    train_device_layout_t layout;
    assert_true(train_device_layout(&layout, &params));
    assert_int_equal(layout.count, params.count);
    size_t chunk = 0;
    for (size_t i = 0; i < params.count; ++i) {
        train_tensor_t const *tensor = &params.tensors[i];
        assert_int_equal(layout.offsets[i], chunk * TRAIN_DEVICE_CHUNK);
        size_t chunks = (tensor->count + TRAIN_DEVICE_CHUNK - 1) / TRAIN_DEVICE_CHUNK;
        for (size_t c = 0; c < chunks; ++c)
            assert_int_equal(layout.decay[chunk + c], tensor->decay);
        chunk += chunks;
        if (i + 1 < params.count) assert_true(layout.offsets[i] + tensor->count <= layout.offsets[i + 1]);
    }
    assert_int_equal(layout.chunks, chunk);
    size_t decayed = 0;
    for (size_t c = 0; c < layout.chunks; ++c)
        decayed += layout.decay[c];
    assert_true(decayed > 0 && decayed < layout.chunks); /* weights decay; norms, biases, embeddings do not */
    train_device_layout_free(&layout);
    train_params_free(&params);
}

/* Values and moments through the flat buffers into parameters seeded otherwise: the padding zero, and the
 * two saves (checkpoint and optimizer state) byte for byte the same. */
static void test_pack_round_trip_saves_the_same(void **state) {
    (void)state;
    train_params_t original, copy;
    params_of(&original, 7);
    params_of(&copy, 8);
    for (size_t i = 0; i < original.count; ++i) /* moments and a step that are not the start's */
        for (size_t j = 0; j < original.tensors[i].count; ++j) {
            original.tensors[i].m[j] = (float)(0.001 * (double)(i + j));
            original.tensors[i].v[j] = (float)(1e-6 * (double)(i * j + 1));
        }
    original.step = copy.step = 12;
    copy.optimizer = original.optimizer;
    train_device_layout_t layout;
    assert_true(train_device_layout(&layout, &original));
    size_t scalars = layout.chunks * TRAIN_DEVICE_CHUNK;
    float *flat = malloc(scalars * sizeof(float));
    assert_non_null(flat);
    train_device_field_t const fields[] = {TRAIN_DEVICE_VALUE, TRAIN_DEVICE_M, TRAIN_DEVICE_V};
    for (size_t f = 0; f < COUNT(fields); ++f) {
        memset(flat, 0xff, scalars * sizeof(float));
        train_device_pack(&layout, &original, fields[f], flat);
        for (size_t i = 0; i < original.count; ++i) {
            size_t end = i + 1 < original.count ? layout.offsets[i + 1] : scalars;
            for (size_t at = layout.offsets[i] + original.tensors[i].count; at < end; ++at)
                assert_true(flat[at] == 0.0f);
        }
        train_device_unpack(&layout, &copy, fields[f], flat);
    }
    char first[512], second[512], reason[UFORM_ERROR_MESSAGE_SIZE];
    char const *message = NULL;
    fixture_path("original.safetensors", first, sizeof first);
    fixture_path("copy.safetensors", second, sizeof second);
    assert_int_equal(train_params_save(&original, first, reason, &message), UFORM_OK);
    assert_int_equal(train_params_save(&copy, second, reason, &message), UFORM_OK);
    char const *suffixes[] = {"", ".optimizer"};
    for (size_t s = 0; s < COUNT(suffixes); ++s) {
        char a[600], b[600];
        snprintf(a, sizeof a, "%s%s", first, suffixes[s]);
        snprintf(b, sizeof b, "%s%s", second, suffixes[s]);
        blob_t x = blob_read(a), y = blob_read(b);
        assert_int_equal(x.size, y.size);
        assert_memory_equal(x.data, y.data, x.size);
        free(x.data), free(y.data);
    }
    free(flat);
    train_device_layout_free(&layout);
    train_params_free(&original);
    train_params_free(&copy);
}

/* The tokens of each row of the byte table, ascending, every position once. */
static void test_token_order(void **state) {
    (void)state;
    random_seed(3);
    size_t const count = 5000;
    uint16_t *tokens = malloc(count * sizeof(uint16_t));
    int32_t starts[258], *order = malloc(count * sizeof(int32_t));
    assert_non_null(tokens), assert_non_null(order);
    for (size_t t = 0; t < count; ++t)
        tokens[t] = t % 61 == 0 ? 256 : (uint16_t)random_below(t % 2 ? 256 : 8);
    train_device_token_order(tokens, count, starts, order);
    assert_int_equal(starts[0], 0);
    assert_int_equal(starts[257], (int32_t)count);
    for (size_t b = 0; b < 257; ++b) {
        assert_true(starts[b] <= starts[b + 1]);
        for (int32_t at = starts[b]; at < starts[b + 1]; ++at) {
            assert_int_equal(tokens[order[at]], b);
            if (at > starts[b]) assert_true(order[at - 1] < order[at]);
        }
    }
    train_device_token_order(tokens, 0, starts, order);
    for (size_t b = 0; b < 258; ++b)
        assert_int_equal(starts[b], 0);
    free(tokens), free(order);
}

/* A plan of every modality, by hand: a text "ab", an image of 4 patches, a clip of 2 frames, an empty text
 * and a sound of 3 patches; relations (0, 1) and (2, 4). */
typedef struct hand_plan {
    batch_plan_t plan;
    uform_model_info_t info;
    size_t text_items[2], text_offsets[3], image_items[3], image_offsets[4], sound_items[1], sound_offsets[2];
    uint16_t tokens[4];
    float image_patches[12 * 12], sound_patches[3 * 4];
} hand_plan_t;

static void hand_plan(hand_plan_t *h) {
    memset(h, 0, sizeof *h);
    h->info.has_text = h->info.has_image = h->info.has_video = h->info.has_audio = true;
    h->info.dims = 8;
    h->info.image.size = 4, h->info.image.patch = 2, h->info.video.frames = 2;
    h->info.audio.mels = 2, h->info.audio.patch_frames = 2;
    size_t const text_items[] = {0, 3}, text_offsets[] = {0, 3, 4}, image_items[] = {1, 2, 2},
                 image_offsets[] = {0, 5, 10, 15}, sound_offsets[] = {0, 4};
    uint16_t const tokens[] = {256, 'a', 'b', 256};
    memcpy(h->text_items, text_items, sizeof text_items);
    memcpy(h->text_offsets, text_offsets, sizeof text_offsets);
    memcpy(h->image_items, image_items, sizeof image_items);
    memcpy(h->image_offsets, image_offsets, sizeof image_offsets);
    memcpy(h->sound_offsets, sound_offsets, sizeof sound_offsets);
    memcpy(h->tokens, tokens, sizeof tokens);
    h->sound_items[0] = 4;
    for (size_t i = 0; i < COUNT(h->image_patches); ++i)
        h->image_patches[i] = 0.01f * (float)i - 0.5f;
    for (size_t i = 0; i < COUNT(h->sound_patches); ++i)
        h->sound_patches[i] = 1.0f + 0.3f * (float)i;
    h->plan = (batch_plan_t){.items = 5,
                             .texts = 2,
                             .text_tokens = 4,
                             .text_items = h->text_items,
                             .text_offsets = h->text_offsets,
                             .tokens = h->tokens,
                             .predicted = 2,
                             .images = 3,
                             .image_rows = 12,
                             .image_items = h->image_items,
                             .image_offsets = h->image_offsets,
                             .image_patches = h->image_patches,
                             .sounds = 1,
                             .sound_rows = 3,
                             .sound_items = h->sound_items,
                             .sound_offsets = h->sound_offsets,
                             .sound_patches = h->sound_patches};
}

static int32_t const *ints(char const *block, size_t offset) {
    return (int32_t const *)(block + offset);
}

static void assert_ints(char const *block, size_t offset, int32_t const *expected, size_t count) {
    for (size_t i = 0; i < count; ++i)
        if (ints(block, offset)[i] != expected[i])
            fail_msg("element %zu is %d, expected %d", i, ints(block, offset)[i], expected[i]);
}

static void test_batch_arrays(void **state) {
    (void)state;
    hand_plan_t h;
    hand_plan(&h);
    uint32_t const relations[] = {0, 1, 2, 4};
    train_device_batch_t sized = train_device_batch_plan(&h.plan, &h.info, relations, 2, NULL);
    char *block = malloc(sized.bytes);
    assert_non_null(block);
    memset(block, 0x7f, sized.bytes);
    train_device_batch_t batch = train_device_batch_plan(&h.plan, &h.info, relations, 2, block);
    assert_memory_equal(&batch, &sized, sizeof batch);
    assert_int_equal(batch.items, 5);
    assert_int_equal(batch.units, 2 + 3 + 1);
    size_t const offsets[] = {batch.tokens,      batch.targets,       batch.token_starts,
                              batch.token_order, batch.unit_first,    batch.unit_count,
                              batch.related,     batch.image.patches, batch.audio.patches};
    for (size_t i = 0; i < COUNT(offsets); ++i)
        assert_int_equal(offsets[i] % 256, 0);
    /* texts: tokens, next tokens (-1 at each text's last), token offsets, the last rows */
    int32_t const tokens[] = {256, 'a', 'b', 256}, targets[] = {'a', 'b', -1, -1}, text_offsets[] = {0, 3, 4},
                  text_selected[] = {2, 3};
    assert_ints(block, batch.tokens, tokens, 4);
    assert_ints(block, batch.targets, targets, 4);
    assert_ints(block, batch.text.token_offsets, text_offsets, 3);
    assert_ints(block, batch.text.selected, text_selected, 2);
    assert_int_equal(batch.text.longest, 3);
    assert_int_equal(ints(block, batch.token_starts)['a'], 0);
    assert_int_equal(ints(block, batch.token_starts)[257], 4);
    int32_t const order_a[] = {1}, order_bos[] = {0, 3};
    assert_ints(block, batch.token_order + ints(block, batch.token_starts)['a'] * sizeof(int32_t), order_a,
                1);
    assert_ints(block, batch.token_order + ints(block, batch.token_starts)[256] * sizeof(int32_t), order_bos,
                2);
    /* the image trunk: an image and a clip's two frames, 4 patches of 12 values each */
    int32_t const image_tokens[] = {0, 5, 10, 15}, image_patches[] = {0, 4, 8, 12},
                  image_selected[] = {0, 5, 10};
    assert_ints(block, batch.image.token_offsets, image_tokens, 4);
    assert_ints(block, batch.image.patch_offsets, image_patches, 4);
    assert_ints(block, batch.image.selected, image_selected, 3);
    assert_int_equal(batch.image.rows, 12);
    assert_int_equal(batch.image.inputs, 12);
    assert_int_equal(batch.image.longest, 5);
    uint16_t expected[12 * 12];
    kernels_scalar()->f32_to_bf16(expected, h.image_patches, 12 * 12);
    assert_memory_equal(block + batch.image.patches, expected, sizeof expected);
    /* the sound: 3 patches of 4 */
    int32_t const sound_tokens[] = {0, 4}, sound_patches[] = {0, 3}, sound_selected[] = {0};
    assert_ints(block, batch.audio.token_offsets, sound_tokens, 2);
    assert_ints(block, batch.audio.patch_offsets, sound_patches, 2);
    assert_ints(block, batch.audio.selected, sound_selected, 1);
    kernels_scalar()->f32_to_bf16(expected, h.sound_patches, 3 * 4);
    assert_memory_equal(block + batch.audio.patches, expected, 3 * 4 * sizeof(uint16_t));
    /* units: texts, then the image trunk's entries, then sounds; a clip owns its frames' */
    int32_t const first[] = {0, 2, 3, 1, 5}, count[] = {1, 1, 2, 1, 1};
    assert_ints(block, batch.unit_first, first, 5);
    assert_ints(block, batch.unit_count, count, 5);
    uint8_t const *related = (uint8_t const *)block + batch.related;
    for (size_t i = 0; i < 5; ++i)
        for (size_t j = 0; j < 5; ++j) {
            bool pair = (i == 0 && j == 1) || (i == 1 && j == 0) || (i == 2 && j == 4) || (i == 4 && j == 2);
            assert_int_equal(related[i * 5 + j], pair);
        }
    free(block);
}

static int group_setup(void **state) {
    (void)state;
    uform_tiny_checkpoint_args_t tiny = {.seed = 1};
    return fixture_setup("train-device", &tiny, NULL, NULL);
}

int main(void) {
    struct CMUnitTest const tests[] = {
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_pack_round_trip_saves_the_same),
        cmocka_unit_test(test_token_order),
        cmocka_unit_test(test_batch_arrays),
    };
    return cmocka_run_group_tests(tests, group_setup, fixture_teardown);
}
