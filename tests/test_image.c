/* image_encode and image_encode_pixels through the public interface: outputs and their shapes, items
 * that do not depend on their batch, bitwise determinism across thread counts and receivers, files and
 * encoded images in memory against the pixels they decode to, hostile and broken files that fail
 * alone (truncated and corrupt JPEG and PNG, text named .jpg, 1x1 images, a 100000 x 100000 PNG
 * header, a 65000 x 65000 JPEG header, a missing file, a folder, a FIFO, an empty file, a file past the
 * size limit), chunked reads, progress and cancellation,
 * conversions, and bad arguments. Numbers against PyTorch and Pillow are checked by
 * tests/reference/test_image_reference.py. Test images are made here, with the codecs' encoders. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine.h"
#include "kernels.h"

#if UFORM_WITH_JPEG
#include <turbojpeg.h>
#endif
#if UFORM_WITH_SPNG
#include <spng.h>
#endif

#define EVERYTHING (UFORM_OUTPUT_EMBEDDINGS | UFORM_OUTPUT_TOKEN_VECTORS | UFORM_OUTPUT_STATES)
#define BATCH_MAX  256

static char directory[256], checkpoint[300];
static uform_model_t *model;
static uform_model_info_t info;
static size_t patches; /* per image */

/* ---- Pictures, encoded files, batches ------------------------------------------------------------ */

typedef struct picture {
    uint8_t *rgb;
    size_t height, width;
} picture_t;

typedef struct blob {
    uint8_t *data;
    size_t size;
} blob_t;

/* A smooth pattern with some texture, different per seed. */
static picture_t picture_make(size_t height, size_t width, unsigned seed) {
    picture_t picture = {malloc(height * width * 3), height, width};
    assert_non_null(picture.rgb);
    for (size_t y = 0; y < height; ++y)
        for (size_t x = 0; x < width; ++x)
            for (size_t c = 0; c < 3; ++c) {
                double value = 128 + 90 * sin(0.07 * (double)(x + seed) * (double)(c + 1)) +
                               30 * cos(0.13 * (double)y * (double)(seed % 3 + 1)) +
                               (double)((x * y + seed) % 7);
                picture.rgb[(y * width + x) * 3 + c] = (uint8_t)(value < 0 ? 0 : value > 255 ? 255 : value);
            }
    return picture;
}

static blob_t blob_copy(void const *data, size_t size) {
    blob_t blob = {malloc(size ? size : 1), size};
    assert_non_null(blob.data);
    if (size) memcpy(blob.data, data, size);
    return blob;
}

#if UFORM_WITH_JPEG
static blob_t jpeg_of(picture_t const *picture, int quality, int subsampling) {
    tjhandle handle = tjInitCompress();
    assert_non_null(handle);
    unsigned char *jpeg = NULL;
    unsigned long size = 0;
    assert_int_equal(tjCompress2(handle, picture->rgb, (int)picture->width, 0, (int)picture->height, TJPF_RGB,
                                 &jpeg, &size, subsampling, quality, 0),
                     0);
    blob_t blob = blob_copy(jpeg, size);
    tjFree(jpeg);
    tjDestroy(handle);
    return blob;
}

/* What libjpeg-turbo's default decode gives: the pixels the engine must encode for a JPEG. */
static picture_t jpeg_decoded(blob_t const *jpeg) {
    tjhandle handle = tjInitDecompress();
    assert_non_null(handle);
    int width = 0, height = 0, subsampling = 0, colorspace = 0;
    assert_int_equal(
        tjDecompressHeader3(handle, jpeg->data, jpeg->size, &width, &height, &subsampling, &colorspace), 0);
    picture_t picture = {malloc((size_t)width * (size_t)height * 3), (size_t)height, (size_t)width};
    assert_non_null(picture.rgb);
    assert_int_equal(
        tjDecompress2(handle, jpeg->data, jpeg->size, picture.rgb, width, 0, height, TJPF_RGB, 0), 0);
    tjDestroy(handle);
    return picture;
}
#endif

#if UFORM_WITH_SPNG
/* A PNG of the picture as truecolour (2), greyscale from its red channel (0), or truecolour with an
 * alpha channel (6), Adam7-interlaced or not; `expected` receives the RGB8 pixels the engine must see (grey
 * replicated, alpha dropped). */
static blob_t png_of(picture_t const *picture, int color_type, bool interlaced, picture_t *expected) {
    size_t pixels = picture->height * picture->width, channels = color_type == 0   ? 1
                                                                 : color_type == 6 ? 4
                                                                                   : 3;
    uint8_t *samples = malloc(pixels * channels);
    assert_non_null(samples);
    if (expected) *expected = (picture_t){malloc(pixels * 3), picture->height, picture->width};
    for (size_t i = 0; i < pixels; ++i)
        for (size_t c = 0; c < channels; ++c) {
            uint8_t value = c < 3 ? picture->rgb[i * 3 + (channels == 1 ? 0 : c)] : (uint8_t)(i * 37);
            samples[i * channels + c] = value;
            if (expected && c < 3)
                for (size_t k = (channels == 1 ? 0 : c); k < (channels == 1 ? 3 : c + 1); ++k)
                    expected->rgb[i * 3 + k] = value;
        }
    spng_ctx *context = spng_ctx_new(SPNG_CTX_ENCODER);
    assert_non_null(context);
    assert_int_equal(spng_set_option(context, SPNG_ENCODE_TO_BUFFER, 1), 0);
    struct spng_ihdr header = {.width = (uint32_t)picture->width,
                               .height = (uint32_t)picture->height,
                               .bit_depth = 8,
                               .color_type = (uint8_t)color_type,
                               .interlace_method = interlaced ? SPNG_INTERLACE_ADAM7 : SPNG_INTERLACE_NONE};
    assert_int_equal(spng_set_ihdr(context, &header), 0);
    assert_int_equal(
        spng_encode_image(context, samples, pixels * channels, SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE), 0);
    size_t size = 0;
    int error = 0;
    void *png = spng_get_png_buffer(context, &size, &error);
    assert_non_null(png);
    blob_t blob = blob_copy(png, size);
    free(png);
    spng_ctx_free(context);
    free(samples);
    return blob;
}
#endif

static uint32_t crc32_of(uint8_t const *data, size_t size) {
    uint32_t crc = 0xffffffffu;
    for (size_t i = 0; i < size; ++i) {
        crc ^= data[i];
        for (int bit = 0; bit < 8; ++bit)
            crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
    }
    return ~crc;
}

static void put_be32(uint8_t *target, uint32_t value) {
    target[0] = (uint8_t)(value >> 24), target[1] = (uint8_t)(value >> 16);
    target[2] = (uint8_t)(value >> 8), target[3] = (uint8_t)value;
}

/* A PNG signature and a valid IHDR (correct CRC) claiming 100000 x 100000 RGB8, then IEND. */
static blob_t huge_png_header(void) {
    uint8_t bytes[8 + 25 + 12] = {0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a};
    uint8_t *chunk = bytes + 8;
    put_be32(chunk, 13);
    memcpy(chunk + 4, "IHDR", 4);
    put_be32(chunk + 8, 100000);
    put_be32(chunk + 12, 100000);
    chunk[16] = 8, chunk[17] = 2, chunk[18] = 0, chunk[19] = 0, chunk[20] = 0;
    put_be32(chunk + 21, crc32_of(chunk + 4, 17));
    uint8_t *end = chunk + 25;
    put_be32(end, 0);
    memcpy(end + 4, "IEND", 4);
    put_be32(end + 8, crc32_of(end + 4, 4));
    return blob_copy(bytes, sizeof bytes);
}

typedef enum kind {
    KIND_PIXELS,
    KIND_FILES,
    KIND_MEMORY,
} kind_t;

typedef struct batch {
    kind_t kind;
    uint8_t *data;
    size_t length, count;
    size_t offsets[BATCH_MAX + 1], heights[BATCH_MAX], widths[BATCH_MAX];
} batch_t;

static batch_t *batch_new(kind_t kind) {
    batch_t *batch = calloc(1, sizeof *batch);
    assert_non_null(batch);
    batch->kind = kind;
    return batch;
}

static void batch_free(batch_t *batch) {
    free(batch->data);
    free(batch);
}

static void batch_add(batch_t *batch, void const *bytes, size_t size, size_t height, size_t width) {
    assert_true(batch->count < BATCH_MAX);
    batch->data = realloc(batch->data, batch->length + size + 1);
    assert_non_null(batch->data);
    if (size) memcpy(batch->data + batch->length, bytes, size);
    batch->offsets[batch->count] = batch->length;
    batch->heights[batch->count] = height;
    batch->widths[batch->count] = width;
    batch->length += size;
    batch->offsets[++batch->count] = batch->length;
}

static void batch_add_picture(batch_t *batch, picture_t const *picture) {
    batch_add(batch, picture->rgb, picture->height * picture->width * 3, picture->height, picture->width);
}

static void batch_add_path(batch_t *batch, char const *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", directory, name);
    batch_add(batch, path, strlen(path), 0, 0);
}

static uform_tape_t batch_tape(batch_t const *batch) {
    return (uform_tape_t){batch->data, batch->offsets, batch->count, batch->length};
}

static uform_status_t batch_encode(batch_t const *batch, uform_executor_t *executor, uform_outputs_t outputs,
                                   uform_arena_t *arena, uform_encode_config_t const *config,
                                   uform_outcome_t *outcome, uform_encoded_t *encoded) {
    if (batch->kind == KIND_PIXELS) {
        uform_image_encode_pixels_args_t args = {.model = model,
                                                 .executor = executor,
                                                 .outputs = outputs,
                                                 .arena = arena,
                                                 .config = config,
                                                 .encoded = encoded,
                                                 .outcome = outcome,
                                                 .pixels = batch_tape(batch),
                                                 .heights = batch->heights,
                                                 .widths = batch->widths};
        return uform_image_encode_pixels(&args);
    }
    uform_image_encode_args_t args = {.model = model,
                                      .executor = executor,
                                      .outputs = outputs,
                                      .arena = arena,
                                      .config = config,
                                      .encoded = encoded,
                                      .outcome = outcome,
                                      .images = batch_tape(batch),
                                      .source = batch->kind == KIND_FILES ? UFORM_SOURCE_FILES
                                                                          : UFORM_SOURCE_MEMORY};
    return uform_image_encode(&args);
}

static void write_file(char const *name, blob_t const *blob) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", directory, name);
    FILE *file = fopen(path, "wb");
    assert_non_null(file);
    assert_int_equal(fwrite(blob->data, 1, blob->size, file), blob->size);
    assert_int_equal(fclose(file), 0);
}

/* ---- Comparisons -------------------------------------------------------------------------------- */

static void const *row_of(uform_view_t const *view, size_t row) {
    return (unsigned char const *)view->data + row * view->row_stride;
}

/* Every output of item `i` of `a` equals every output of item `j` of `b`, bitwise. */
static void assert_same_item(uform_encoded_t const *a, size_t i, uform_encoded_t const *b, size_t j) {
    assert_int_equal(a->statuses[i], b->statuses[j]);
    if (a->embeddings.data)
        assert_memory_equal(row_of(&a->embeddings, i), row_of(&b->embeddings, j), a->embeddings.row_stride);
    if (a->states.data)
        assert_memory_equal(row_of(&a->states, i), row_of(&b->states, j), a->states.row_stride);
    if (a->token_vectors.data)
        assert_memory_equal(row_of(&a->token_vectors, a->token_vectors.item_offsets[i]),
                            row_of(&b->token_vectors, b->token_vectors.item_offsets[j]),
                            patches * a->token_vectors.row_stride);
}

static void assert_zero_item(uform_encoded_t const *encoded, size_t i) {
    uform_view_t const *views[] = {&encoded->embeddings, &encoded->states, &encoded->token_vectors};
    for (size_t v = 0; v < 3; ++v) {
        if (!views[v]->data) continue;
        size_t first = views[v]->item_offsets ? views[v]->item_offsets[i] : i;
        size_t count = views[v]->item_offsets ? views[v]->item_offsets[i + 1] - first : 1;
        unsigned char const *bytes = row_of(views[v], first);
        for (size_t k = 0; k < count * views[v]->row_stride; ++k)
            assert_int_equal(bytes[k], 0);
    }
}

static double norm_of(float const *x, size_t n) {
    double sum = 0;
    for (size_t i = 0; i < n; ++i)
        sum += (double)x[i] * x[i];
    return sqrt(sum);
}

/* ---- Fixtures ----------------------------------------------------------------------------------- */

static int setup(void **state) {
    (void)state;
    snprintf(directory, sizeof directory, "%s/uform-image-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(directory)) return -1;
    snprintf(checkpoint, sizeof checkpoint, "%s/tiny.safetensors", directory);
    uform_tiny_checkpoint_args_t tiny = {.path = checkpoint, .seed = 13, .depth = 2, .hidden = 128};
    if (uform_tiny_checkpoint(&tiny) != UFORM_OK) return -1;
    uform_model_load_args_t load = {.path = checkpoint, .model = &model};
    if (uform_model_load_ram(&load) != UFORM_OK) return -1;
    if (uform_model_info(model, &info) != UFORM_OK) return -1;
    patches = (info.image.size / info.image.patch) * (info.image.size / info.image.patch);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    uform_model_free(model);
    char command[600];
    snprintf(command, sizeof command, "rm -rf '%s'", directory);
    return system(command) == 0 ? 0 : -1;
}

/* ---- Tests -------------------------------------------------------------------------------------- */

/* Pictures of varied shapes: 1x1, thin both ways, exactly `size`, larger, and not square. */
static batch_t *varied_pixels(picture_t *pictures, size_t *count) {
    size_t const shapes[][2] = {{1, 1}, {7, 300},   {300, 7},  {32, 32},  {64, 48},    {45, 100},
                                {3, 2}, {200, 200}, {1, 5000}, {4000, 3}, {1100, 1500}};
    *count = sizeof shapes / sizeof shapes[0];
    batch_t *batch = batch_new(KIND_PIXELS);
    for (size_t i = 0; i < *count; ++i) {
        pictures[i] = picture_make(shapes[i][0], shapes[i][1], (unsigned)i + 1);
        batch_add_picture(batch, &pictures[i]);
    }
    return batch;
}

static void pixels_outputs_have_their_shapes(void **state) {
    (void)state;
    picture_t pictures[16];
    size_t count = 0;
    batch_t *batch = varied_pixels(pictures, &count);
    uform_arena_t *arena = NULL;
    assert_int_equal(uform_arena_create_host(&arena), UFORM_OK);
    uform_encoded_t encoded;
    uform_encode_stats_t stats;
    uform_encode_config_t config = {.stats = &stats};
    assert_int_equal(batch_encode(batch, NULL, EVERYTHING, arena, &config, NULL, &encoded), UFORM_OK);
    assert_int_equal(encoded.items, count);
    assert_int_equal(encoded.embeddings.rows, count);
    assert_int_equal(encoded.embeddings.columns, info.dims);
    assert_int_equal(encoded.states.rows, count);
    assert_int_equal(encoded.states.columns, info.image.transformer.hidden);
    assert_int_equal(encoded.token_vectors.rows, count * patches);
    assert_int_equal(encoded.token_vectors.columns, info.dims);
    assert_int_equal(encoded.token_vectors.items, count);
    for (size_t i = 0; i < count; ++i) {
        assert_int_equal(encoded.statuses[i], UFORM_OK);
        assert_int_equal(encoded.token_vectors.item_offsets[i], i * patches);
        assert_true(fabs(norm_of(row_of(&encoded.embeddings, i), info.dims) - 1.0) < 1e-4);
        assert_true(norm_of(row_of(&encoded.states, i), info.image.transformer.hidden) > 0);
    }
    for (size_t row = 0; row < count * patches; ++row)
        assert_true(fabs(norm_of(row_of(&encoded.token_vectors, row), info.dims) - 1.0) < 1e-4);
    assert_int_equal(stats.items, count);
    assert_int_equal(stats.failed, 0);
    assert_int_equal(stats.bytes, batch->length);
    assert_int_equal(stats.truncated, 0);
    assert_true(stats.total_ns >= stats.compute_ns);
    /* Different pictures give different embeddings. */
    assert_memory_not_equal(row_of(&encoded.embeddings, 3), row_of(&encoded.embeddings, 4),
                            encoded.embeddings.row_stride);
    uform_arena_free(arena);
    batch_free(batch);
    for (size_t i = 0; i < count; ++i)
        free(pictures[i].rgb);
}

/* Each item of a batch, bad spans among them, equals its solo encoding; bad items fail alone. */
static void an_image_does_not_depend_on_its_batch(void **state) {
    (void)state;
    picture_t pictures[16];
    size_t count = 0;
    batch_t *good = varied_pixels(pictures, &count);
    batch_t *batch = batch_new(KIND_PIXELS);
    uform_status_t expected[32];
    size_t items = 0;
    for (size_t i = 0; i < count; ++i) {
        batch_add_picture(batch, &pictures[i]);
        expected[items++] = UFORM_OK;
        if (i == 2) { /* a span one byte short of its height x width x 3 */
            batch_add(batch, pictures[3].rgb, pictures[3].height * pictures[3].width * 3 - 1,
                      pictures[3].height, pictures[3].width);
            expected[items++] = UFORM_INVALID_ARGUMENT;
        }
        if (i == 4) { /* a height of 0, and a product that overflows */
            batch_add(batch, NULL, 0, 0, 5);
            expected[items++] = UFORM_INVALID_ARGUMENT;
            batch_add(batch, pictures[0].rgb, 3, SIZE_MAX / 2, 3);
            expected[items++] = UFORM_INVALID_ARGUMENT;
        }
    }
    uform_arena_t *batch_arena = NULL, *single_arena = NULL;
    assert_int_equal(uform_arena_create_host(&batch_arena), UFORM_OK);
    assert_int_equal(uform_arena_create_host(&single_arena), UFORM_OK);
    uform_encoded_t together, alone;
    uform_encode_stats_t stats;
    uform_encode_config_t config = {.stats = &stats};
    assert_int_equal(batch_encode(batch, NULL, EVERYTHING, batch_arena, &config, NULL, &together), UFORM_OK);
    assert_int_equal(stats.failed, 3);
    for (size_t i = 0, picture = 0; i < items; ++i) {
        assert_int_equal(together.statuses[i], expected[i]);
        if (expected[i] != UFORM_OK) {
            assert_zero_item(&together, i);
            continue;
        }
        batch_t *solo = batch_new(KIND_PIXELS);
        batch_add_picture(solo, &pictures[picture++]);
        assert_int_equal(batch_encode(solo, NULL, EVERYTHING, single_arena, NULL, NULL, &alone), UFORM_OK);
        assert_same_item(&together, i, &alone, 0);
        batch_free(solo);
    }
    uform_arena_free(batch_arena);
    uform_arena_free(single_arena);
    batch_free(batch);
    batch_free(good);
    for (size_t i = 0; i < count; ++i)
        free(pictures[i].rgb);
}

/* Encodes `batch` on `executor`, blocking or deferred, and copies every output's bytes to `copy`. */
static size_t encode_copy(batch_t const *batch, uform_executor_t *executor, bool deferred,
                          unsigned char *copy) {
    uform_arena_t *arena = NULL;
    assert_int_equal(uform_arena_create_host(&arena), UFORM_OK);
    uform_encoded_t encoded;
    uform_outcome_t outcome;
    uform_outcome_init(&outcome);
    assert_int_equal(
        batch_encode(batch, executor, EVERYTHING, arena, NULL, deferred ? &outcome : NULL, &encoded),
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

static void bitwise_identical_across_receivers(void **state) {
    (void)state;
    picture_t pictures[16];
    size_t count = 0;
    batch_t *batch = varied_pixels(pictures, &count);
    size_t capacity = 1 << 22;
    unsigned char *reference = malloc(capacity), *other = malloc(capacity);
    assert_non_null(reference);
    assert_non_null(other);
    size_t bytes = encode_copy(batch, NULL, false, reference);
    assert_true(bytes < capacity);
    for (size_t threads = 1; threads <= 3; ++threads) {
        uform_ram_options_t options = uform_ram_options_default();
        options.threads = threads;
        uform_executor_t *executor = NULL;
        assert_int_equal(uform_executor_create_ram(&options, &executor), UFORM_OK);
        for (int deferred = 0; deferred < 2; ++deferred) {
            assert_int_equal(encode_copy(batch, executor, deferred, other), bytes);
            assert_memory_equal(reference, other, bytes);
        }
        uform_executor_free(executor);
    }
    uform_executor_t *executor = NULL;
    assert_int_equal(uform_executor_create_inline(&executor), UFORM_OK);
    assert_int_equal(encode_copy(batch, executor, true, other), bytes);
    assert_memory_equal(reference, other, bytes);
    uform_executor_free(executor);
    free(reference);
    free(other);
    batch_free(batch);
    for (size_t i = 0; i < count; ++i)
        free(pictures[i].rgb);
}

#if UFORM_WITH_JPEG || UFORM_WITH_SPNG
/* A file and the same bytes in memory encode alike, and as the pixels they decode to. */
static void check_encoded_as(blob_t const *blob, char const *name, picture_t const *decoded) {
    write_file(name, blob);
    batch_t *files = batch_new(KIND_FILES), *memory = batch_new(KIND_MEMORY),
            *pixels = batch_new(KIND_PIXELS);
    batch_add_path(files, name);
    batch_add(memory, blob->data, blob->size, 0, 0);
    batch_add_picture(pixels, decoded);
    uform_arena_t *arenas[3];
    uform_encoded_t encoded[3];
    batch_t *batches[] = {files, memory, pixels};
    for (size_t i = 0; i < 3; ++i) {
        assert_int_equal(uform_arena_create_host(&arenas[i]), UFORM_OK);
        uform_encode_stats_t stats;
        uform_encode_config_t config = {.stats = &stats};
        assert_int_equal(batch_encode(batches[i], NULL, EVERYTHING, arenas[i], &config, NULL, &encoded[i]),
                         UFORM_OK);
        if (encoded[i].statuses[0] != UFORM_OK)
            fail_msg("%s: %s", name, uform_status_name(encoded[i].statuses[0]));
        if (i < 2) assert_int_equal(stats.bytes, blob->size);
    }
    assert_same_item(&encoded[0], 0, &encoded[1], 0);
    assert_same_item(&encoded[0], 0, &encoded[2], 0);
    for (size_t i = 0; i < 3; ++i) {
        uform_arena_free(arenas[i]);
        batch_free(batches[i]);
    }
}
#endif

static void files_and_memory_match_their_pixels(void **state) {
    (void)state;
    picture_t picture = picture_make(40, 56, 5);
#if UFORM_WITH_SPNG
    int const color_types[] = {2, 0, 6, 2};
    for (size_t i = 0; i < 4; ++i) {
        picture_t expected;
        blob_t png = png_of(&picture, color_types[i], i == 3, &expected);
        check_encoded_as(&png, "match.png", &expected);
        free(png.data);
        free(expected.rgb);
    }
#endif
#if UFORM_WITH_JPEG
    int const subsamplings[] = {TJSAMP_444, TJSAMP_420, TJSAMP_GRAY};
    for (size_t i = 0; i < 3; ++i) {
        blob_t jpeg = jpeg_of(&picture, 90, subsamplings[i]);
        picture_t decoded = jpeg_decoded(&jpeg);
        check_encoded_as(&jpeg, "match.jpg", &decoded);
        free(jpeg.data);
        free(decoded.rgb);
    }
#endif
    free(picture.rgb);
}

/* The broken and hostile files, in one batch with good ones. */
typedef struct bad_case {
    char const *name; /* a file in `directory`; NULL ends the list */
    blob_t blob;      /* its bytes (data NULL: not written, e.g. the missing file) */
    uform_status_t expected;
    bool memory; /* also tried from memory */
} bad_case_t;

static size_t bad_cases(bad_case_t *cases) {
    size_t n = 0;
    picture_t picture = picture_make(48, 36, 9), one = picture_make(1, 1, 2);
    static char const text[] = "this is a text file, not a JPEG\n";
    uint8_t const fake_jpeg[] = {0xff, 0xd8, 0xff, 0xe0, 0, 16, 'J', 'F', 'I', 'F', 0};
    uint8_t const fake_png[] = {0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0};
#if UFORM_WITH_SPNG
    blob_t png = png_of(&picture, 2, false, NULL);
    cases[n++] = (bad_case_t){"good.png", png, UFORM_OK, true};
    cases[n++] = (bad_case_t){"truncated.png", blob_copy(png.data, png.size / 2), UFORM_FORMAT, true};
    blob_t corrupt_png = blob_copy(png.data, png.size);
    corrupt_png.data[png.size / 2] ^= 0x5a; /* inside IDAT: its CRC no longer matches */
    cases[n++] = (bad_case_t){"corrupt.png", corrupt_png, UFORM_FORMAT, true};
    cases[n++] = (bad_case_t){"one.png", png_of(&one, 2, false, NULL), UFORM_OK, true};
#else
    cases[n++] = (bad_case_t){"fake.png", blob_copy(fake_png, sizeof fake_png), UFORM_UNSUPPORTED, true};
#endif
#if UFORM_WITH_JPEG
    blob_t jpeg = jpeg_of(&picture, 85, TJSAMP_420);
    cases[n++] = (bad_case_t){"good.jpg", jpeg, UFORM_OK, true};
    cases[n++] = (bad_case_t){"truncated.jpg", blob_copy(jpeg.data, jpeg.size * 2 / 3), UFORM_FORMAT, true};
    blob_t corrupt_jpeg = blob_copy(jpeg.data, jpeg.size);
    for (size_t i = 2; i + 8 < corrupt_jpeg.size; ++i)
        if (corrupt_jpeg.data[i] == 0xff &&
            corrupt_jpeg.data[i + 1] == 0xc0) { /* SOF0: zero the dimensions */
            memset(corrupt_jpeg.data + i + 5, 0, 4);
            break;
        }
    cases[n++] = (bad_case_t){"corrupt.jpg", corrupt_jpeg, UFORM_FORMAT, true};
    blob_t huge_jpeg = blob_copy(jpeg.data, jpeg.size);
    for (size_t i = 2; i + 8 < huge_jpeg.size; ++i)
        if (huge_jpeg.data[i] == 0xff && huge_jpeg.data[i + 1] == 0xc0) { /* SOF0: 65000 x 65000 */
            huge_jpeg.data[i + 5] = huge_jpeg.data[i + 7] = 0xfd;
            huge_jpeg.data[i + 6] = huge_jpeg.data[i + 8] = 0xe8;
            break;
        }
    cases[n++] = (bad_case_t){"huge.jpg", huge_jpeg, UFORM_FORMAT, true};
    cases[n++] = (bad_case_t){"one.jpg", jpeg_of(&one, 90, TJSAMP_444), UFORM_OK, true};
#else
    cases[n++] = (bad_case_t){"fake.jpg", blob_copy(fake_jpeg, sizeof fake_jpeg), UFORM_UNSUPPORTED, true};
#endif
    (void)fake_jpeg, (void)fake_png;
    cases[n++] = (bad_case_t){"text.jpg", blob_copy(text, sizeof text - 1), UFORM_FORMAT, true};
    cases[n++] =
        (bad_case_t){"huge.png", huge_png_header(), UFORM_WITH_SPNG ? UFORM_FORMAT : UFORM_UNSUPPORTED, true};
    cases[n++] = (bad_case_t){"empty.jpg", blob_copy("", 0), UFORM_FORMAT, true};
    cases[n++] = (bad_case_t){"absent.jpg", {NULL, 0}, UFORM_IO, false};
    cases[n++] = (bad_case_t){".", {NULL, 0}, UFORM_IO, false};              /* the folder itself */
    cases[n++] = (bad_case_t){"fifo.png", {NULL, 0}, UFORM_IO, false};       /* opening it must not block */
    cases[n++] = (bad_case_t){"sparse.png", {NULL, 0}, UFORM_FORMAT, false}; /* past the size limit */
    free(picture.rgb);
    free(one.rgb);
    for (size_t i = 0; i < n; ++i)
        if (cases[i].blob.data) write_file(cases[i].name, &cases[i].blob);
    char path[512];
    snprintf(path, sizeof path, "%s/fifo.png", directory);
    unlink(path);
    assert_int_equal(mkfifo(path, 0600), 0);
    snprintf(path, sizeof path, "%s/sparse.png", directory);
    FILE *sparse = fopen(path, "wb");
    assert_non_null(sparse);
    assert_int_equal(fclose(sparse), 0);
    assert_int_equal(truncate(path, (off_t)UFORM_IMAGE_MAX_BYTES + 1), 0);
    return n;
}

/* Encodes `batch` on `executor` and checks every status against `expected`, failed rows zero and
 * good items equal to their solo encodings. */
static void check_bad_batch(batch_t const *batch, uform_status_t const *expected,
                            uform_executor_t *executor) {
    uform_arena_t *arena = NULL, *single_arena = NULL;
    assert_int_equal(uform_arena_create_host(&arena), UFORM_OK);
    assert_int_equal(uform_arena_create_host(&single_arena), UFORM_OK);
    uform_encoded_t together, alone;
    uform_encode_stats_t stats;
    uform_encode_config_t config = {.stats = &stats};
    assert_int_equal(batch_encode(batch, executor, EVERYTHING, arena, &config, NULL, &together), UFORM_OK);
    size_t failed = 0;
    for (size_t i = 0; i < batch->count; ++i) {
        if (together.statuses[i] != expected[i])
            fail_msg("item %zu (%.*s): %s, expected %s", i, (int)(batch->offsets[i + 1] - batch->offsets[i]),
                     batch->kind == KIND_FILES ? (char const *)batch->data + batch->offsets[i] : "in memory",
                     uform_status_name(together.statuses[i]), uform_status_name(expected[i]));
        if (expected[i] != UFORM_OK) {
            failed++;
            assert_zero_item(&together, i);
            continue;
        }
        batch_t *solo = batch_new(batch->kind);
        batch_add(solo, batch->data + batch->offsets[i], batch->offsets[i + 1] - batch->offsets[i], 0, 0);
        assert_int_equal(batch_encode(solo, executor, EVERYTHING, single_arena, NULL, NULL, &alone),
                         UFORM_OK);
        assert_same_item(&together, i, &alone, 0);
        batch_free(solo);
    }
    assert_int_equal(stats.failed, failed);
    assert_int_equal(stats.items, batch->count);
    uform_arena_free(arena);
    uform_arena_free(single_arena);
}

static void bad_files_fail_alone(void **state) {
    (void)state;
    bad_case_t cases[32];
    size_t n = bad_cases(cases);
    batch_t *files = batch_new(KIND_FILES), *memory = batch_new(KIND_MEMORY);
    uform_status_t file_expected[64], memory_expected[64];
    for (size_t i = 0; i < n; ++i) {
        batch_add_path(files, cases[i].name);
        file_expected[i] = cases[i].expected;
        if (cases[i].memory) {
            memory_expected[memory->count] = cases[i].expected;
            batch_add(memory, cases[i].blob.data, cases[i].blob.size, 0, 0);
        }
    }
    /* Paths the engine refuses before opening: empty, and holding a NUL byte. */
    batch_add(files, "", 0, 0, 0);
    file_expected[files->count - 1] = UFORM_INVALID_ARGUMENT;
    batch_add(files, "a\0b", 3, 0, 0);
    file_expected[files->count - 1] = UFORM_INVALID_ARGUMENT;

    uform_ram_options_t options = uform_ram_options_default();
    options.threads = 2;
    uform_executor_t *ram = NULL;
    assert_int_equal(uform_executor_create_ram(&options, &ram), UFORM_OK);
    uform_executor_t *executors[] = {NULL, ram};
    for (size_t e = 0; e < 2; ++e) {
        check_bad_batch(files, file_expected, executors[e]);
        check_bad_batch(memory, memory_expected, executors[e]);
    }
    /* The executor is still fine for a good batch, deferred. */
    picture_t picture = picture_make(20, 30, 3);
    batch_t *pixels = batch_new(KIND_PIXELS);
    batch_add_picture(pixels, &picture);
    uform_arena_t *arena = NULL;
    assert_int_equal(uform_arena_create(ram, &arena), UFORM_OK);
    uform_outcome_t outcome;
    uform_outcome_init(&outcome);
    uform_encoded_t encoded;
    assert_int_equal(batch_encode(pixels, ram, EVERYTHING, arena, NULL, &outcome, NULL), UFORM_OK);
    assert_int_equal(uform_outcome_wait(&outcome), UFORM_OK);
    assert_int_equal(uform_outcome_encoded(&outcome, &encoded), UFORM_OK);
    assert_int_equal(encoded.statuses[0], UFORM_OK);
    uform_outcome_destroy(&outcome);
    uform_arena_free(arena);
    uform_executor_free(ram);
    free(picture.rgb);
    batch_free(pixels);
    batch_free(files);
    batch_free(memory);
    for (size_t i = 0; i < n; ++i)
        free(cases[i].blob.data);
}

/* Many files over several chunks: the next chunk's reads are in flight while one computes, and
 * every item equals the first of its kind. */
static void chunked_reads(void **state) {
    (void)state;
    bad_case_t cases[32];
    size_t n = bad_cases(cases);
    batch_t *files = batch_new(KIND_FILES);
    uform_status_t expected[BATCH_MAX];
    while (files->count + 1 < 150) {
        size_t i = files->count % n;
        batch_add_path(files, cases[i].name);
        expected[files->count - 1] = cases[i].expected;
    }
    uform_ram_options_t options = uform_ram_options_default();
    options.threads = 2;
    uform_executor_t *ram = NULL;
    assert_int_equal(uform_executor_create_ram(&options, &ram), UFORM_OK);
    uform_executor_t *executors[] = {NULL, ram};
    for (size_t e = 0; e < 2; ++e) {
        uform_arena_t *arena = NULL;
        assert_int_equal(uform_arena_create_host(&arena), UFORM_OK);
        uform_encoded_t encoded;
        assert_int_equal(batch_encode(files, executors[e], EVERYTHING, arena, NULL, NULL, &encoded),
                         UFORM_OK);
        for (size_t i = 0; i < files->count; ++i) {
            assert_int_equal(encoded.statuses[i], expected[i]);
            assert_same_item(&encoded, i, &encoded, i % n);
        }
        uform_arena_free(arena);
    }
    uform_executor_free(ram);
    batch_free(files);
    for (size_t i = 0; i < n; ++i)
        free(cases[i].blob.data);
}

typedef struct counter {
    size_t calls, last, cancel_at;
} counter_t;

static uform_continuation_t count_items(void *state, size_t completed, size_t total) {
    counter_t *counter = state;
    counter->calls++;
    counter->last = completed;
    (void)total;
    return counter->cancel_at && completed >= counter->cancel_at ? UFORM_CANCEL : UFORM_CONTINUE;
}

static void progress_and_cancel(void **state) {
    (void)state;
    picture_t picture = picture_make(24, 40, 4);
#if UFORM_WITH_SPNG
    picture_t expected;
    blob_t png = png_of(&picture, 2, false, &expected);
    write_file("progress.png", &png);
    free(png.data);
    free(expected.rgb);
#endif
    batch_t *pixels = batch_new(KIND_PIXELS), *files = batch_new(KIND_FILES);
    for (size_t i = 0; i < 200; ++i) {
        batch_add_picture(pixels, &picture);
        batch_add_path(files, "progress.png");
    }
    uform_ram_options_t options = uform_ram_options_default();
    options.threads = 2;
    uform_executor_t *ram = NULL;
    assert_int_equal(uform_executor_create_ram(&options, &ram), UFORM_OK);
    batch_t *batches[] = {pixels, files};
    uform_executor_t *executors[] = {NULL, ram};
    for (size_t b = 0; b < 2; ++b)
        for (size_t e = 0; e < 2; ++e) {
            uform_arena_t *arena = NULL;
            assert_int_equal(uform_arena_create_host(&arena), UFORM_OK);
            counter_t counter = {0};
            uform_encode_config_t config = {.progress = {count_items, &counter, 4}};
            uform_encoded_t encoded;
            assert_int_equal(batch_encode(batches[b], executors[e], UFORM_OUTPUT_EMBEDDINGS, arena, &config,
                                          NULL, &encoded),
                             UFORM_OK);
            assert_true(counter.calls >= 2 && counter.calls <= 4);
            assert_int_equal(counter.last, 200);
            counter = (counter_t){.cancel_at = 1};
            assert_int_equal(batch_encode(batches[b], executors[e], UFORM_OUTPUT_EMBEDDINGS, arena, &config,
                                          NULL, &encoded),
                             UFORM_CANCELLED);
            assert_true(counter.last < 200);
            config.progress.handler = NULL;
            assert_int_equal(batch_encode(batches[b], executors[e], UFORM_OUTPUT_EMBEDDINGS, arena, &config,
                                          NULL, &encoded),
                             UFORM_OK);
            assert_int_equal(encoded.statuses[199], UFORM_WITH_SPNG || b == 0 ? UFORM_OK : UFORM_IO);
            uform_arena_free(arena);
        }
    uform_executor_free(ram);
    batch_free(pixels);
    batch_free(files);
    free(picture.rgb);
}

static void conversions_and_matryoshka(void **state) {
    (void)state;
    picture_t pictures[16];
    size_t count = 0;
    batch_t *batch = varied_pixels(pictures, &count);
    uform_arena_t *full_arena = NULL, *arena = NULL;
    assert_int_equal(uform_arena_create_host(&full_arena), UFORM_OK);
    assert_int_equal(uform_arena_create_host(&arena), UFORM_OK);
    uform_encoded_t full, converted;
    assert_int_equal(batch_encode(batch, NULL, EVERYTHING, full_arena, NULL, NULL, &full), UFORM_OK);
    kernels_t const *kernels = kernels_scalar();
    uform_scalar_t const kinds[] = {UFORM_BF16, UFORM_F16, UFORM_I8};
    for (size_t k = 0; k < 3; ++k) {
        uform_encode_config_t config = {.outputs_scalar = kinds[k]};
        assert_int_equal(batch_encode(batch, NULL, EVERYTHING, arena, &config, NULL, &converted), UFORM_OK);
        uform_view_t const *pairs[][2] = {{&full.embeddings, &converted.embeddings},
                                          {&full.states, &converted.states},
                                          {&full.token_vectors, &converted.token_vectors}};
        for (size_t v = 0; v < 3; ++v) {
            assert_int_equal(pairs[v][1]->scalar, kinds[k]);
            for (size_t row = 0; row < pairs[v][0]->rows; ++row) {
                unsigned char expected[1024 * 4];
                float scale = 0;
                kernels->convert(expected, row_of(pairs[v][0], row), pairs[v][0]->columns, kinds[k], &scale);
                assert_memory_equal(row_of(pairs[v][1], row), expected, pairs[v][1]->row_stride);
                if (kinds[k] == UFORM_I8) assert_true(pairs[v][1]->scales[row] == scale);
            }
        }
    }
    for (size_t m = 0; m < info.matryoshka_count; ++m) {
        size_t width = info.matryoshka[m];
        uform_encode_config_t config = {.matryoshka = width};
        assert_int_equal(batch_encode(batch, NULL, EVERYTHING, arena, &config, NULL, &converted), UFORM_OK);
        assert_int_equal(converted.embeddings.columns, width);
        assert_int_equal(converted.token_vectors.columns, width);
        for (size_t row = 0; row < count; ++row) {
            float const *prefix = row_of(&full.embeddings, row),
                        *short_row = row_of(&converted.embeddings, row);
            double prefix_norm = norm_of(prefix, width);
            for (size_t j = 0; j < width; ++j)
                assert_true(fabs(prefix[j] / prefix_norm - short_row[j]) < 1e-5);
        }
    }
    uform_arena_free(full_arena);
    uform_arena_free(arena);
    batch_free(batch);
    for (size_t i = 0; i < count; ++i)
        free(pictures[i].rgb);
}

static void bad_arguments_fail_at_once(void **state) {
    (void)state;
    picture_t picture = picture_make(8, 8, 1);
    uform_arena_t *arena = NULL;
    assert_int_equal(uform_arena_create_host(&arena), UFORM_OK);
    uform_encoded_t encoded;
    size_t heights[] = {8}, widths[] = {8}, offsets[] = {0, 192}, backwards[] = {192, 0}, beyond[] = {0, 500};
    uform_image_encode_pixels_args_t good = {.model = model,
                                             .outputs = UFORM_OUTPUT_EMBEDDINGS,
                                             .arena = arena,
                                             .encoded = &encoded,
                                             .pixels = {picture.rgb, offsets, 1, 192},
                                             .heights = heights,
                                             .widths = widths};
    struct {
        char const *what;
        uform_image_encode_pixels_args_t args;
    } cases[] = {{"heights NULL", good},
                 {"widths NULL", good},
                 {"no items", good},
                 {"offsets out of order", good},
                 {"offsets past the tape", good},
                 {"no outputs", good},
                 {"arena NULL", good}};
    cases[0].args.heights = NULL;
    cases[1].args.widths = NULL;
    cases[2].args.pixels.count = 0;
    cases[3].args.pixels.offsets = backwards;
    cases[4].args.pixels.offsets = beyond;
    cases[5].args.outputs = 0;
    cases[6].args.arena = NULL;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        uform_status_t status = uform_image_encode_pixels(&cases[i].args);
        if (status != UFORM_INVALID_ARGUMENT) fail_msg("%s: %s", cases[i].what, uform_status_name(status));
        assert_int_equal(uform_image_encode_pixels(&good), UFORM_OK);
    }
    char const path[] = "x.png";
    size_t path_offsets[] = {0, sizeof path - 1};
    uform_image_encode_args_t files = {.model = model,
                                       .outputs = UFORM_OUTPUT_EMBEDDINGS,
                                       .arena = arena,
                                       .encoded = &encoded,
                                       .images = {path, path_offsets, 1, sizeof path - 1},
                                       .source = (uform_source_t)7};
    assert_int_equal(uform_image_encode(&files), UFORM_INVALID_ARGUMENT);
    assert_string_equal(uform_last_error().message, "unknown source");
    assert_int_equal(uform_image_encode(NULL), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_image_encode_pixels(NULL), UFORM_INVALID_ARGUMENT);
    /* A refused deferred call leaves its outcome final with the same status. */
    uform_outcome_t outcome;
    uform_outcome_init(&outcome);
    files.outcome = &outcome;
    assert_int_equal(uform_image_encode(&files), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_outcome_status(&outcome), UFORM_INVALID_ARGUMENT);
    files.source = UFORM_SOURCE_FILES;
    assert_int_equal(uform_image_encode(&files), UFORM_OK);
    assert_int_equal(uform_outcome_wait(&outcome), UFORM_OK);
    assert_int_equal(uform_outcome_encoded(&outcome, &encoded), UFORM_OK);
    assert_int_equal(encoded.statuses[0], UFORM_IO); /* no such file: the call itself worked */
    uform_outcome_destroy(&outcome);
    uform_arena_free(arena);
    free(picture.rgb);
}

int main(void) {
    struct CMUnitTest const tests[] = {
        cmocka_unit_test(pixels_outputs_have_their_shapes),
        cmocka_unit_test(an_image_does_not_depend_on_its_batch),
        cmocka_unit_test(bitwise_identical_across_receivers),
        cmocka_unit_test(files_and_memory_match_their_pixels),
        cmocka_unit_test(bad_files_fail_alone),
        cmocka_unit_test(chunked_reads),
        cmocka_unit_test(progress_and_cancel),
        cmocka_unit_test(conversions_and_matryoshka),
        cmocka_unit_test(bad_arguments_fail_at_once),
    };
    printf("kernels: %s, jpeg: %d, png: %d\n", kernels_active()->name, UFORM_WITH_JPEG, UFORM_WITH_SPNG);
    return cmocka_run_group_tests(tests, setup, teardown);
}
