/* image_encode and image_encode_pixels through the public interface: outputs and their shapes, items
 * that do not depend on their batch, bitwise determinism across thread counts and receivers, files and
 * encoded images in memory against the pixels they decode to, hostile and broken files that fail
 * alone (truncated and corrupt JPEG and PNG, text named .jpg, 1x1 images, a 100000 x 100000 PNG
 * header, a 65000 x 65000 JPEG header, a missing file, a folder, a FIFO, an empty file, a file past the
 * size limit), chunked reads, progress and cancellation, decoding overlapped with compute,
 * conversions, and bad arguments. Numbers against PyTorch and Pillow are checked by
 * tests/reference/test_image_reference.py. Test images are made here, with the codecs' encoders. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "kernels.h"
#include "fixtures.h"
#include "kernels.h"
#include "media_overlap.h"

#if UFORM_WITH_JPEG
#include <turbojpeg.h>
#endif
#if UFORM_WITH_SPNG
#include <spng.h>
#endif

static uform_model_t *model;
static uform_model_info_t info;
static size_t patches; /* per image */

/* ---- Pictures, encoded files, batches ------------------------------------------------------------ */

typedef struct picture {
    uint8_t *rgb;
    size_t height, width;
} picture_t;

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

static void batch_add_picture(batch_t *batch, picture_t const *picture) {
    batch_add_pixels(batch, picture->rgb, picture->height * picture->width * 3, picture->height,
                     picture->width);
}

static uform_status_t batch_encode(batch_t const *batch, uform_executor_t *executor, uform_outputs_t outputs,
                                   uform_arena_t *arena, uform_encode_config_t const *config,
                                   uform_outcome_t *outcome, uform_encoded_t *encoded) {
    if (batch->kind == BATCH_PIXELS) {
        uform_image_encode_pixels_args_t args = {ENCODE_ARGS(model), .pixels = batch_tape(batch),
                                                 .heights = batch->heights, .widths = batch->widths};
        return uform_image_encode_pixels(&args);
    }
    uform_image_encode_args_t args = {ENCODE_ARGS(model), .images = batch_tape(batch),
                                      .source = batch->source};
    return uform_image_encode(&args);
}

/* ---- Tests -------------------------------------------------------------------------------------- */

/* Pictures of varied shapes and the batch of them, in that order. */
typedef struct varied {
    picture_t pictures[16];
    size_t count;
    batch_t *batch;
} varied_t;

/* 1x1, thin both ways, exactly `size`, larger, and not square. */
static varied_t varied_pixels(void) {
    size_t const shapes[][2] = {{1, 1}, {7, 300},   {300, 7},  {32, 32},  {64, 48},    {45, 100},
                                {3, 2}, {200, 200}, {1, 5000}, {4000, 3}, {1100, 1500}};
    varied_t varied = {.count = sizeof shapes / sizeof shapes[0], .batch = batch_new(BATCH_PIXELS)};
    for (size_t i = 0; i < varied.count; ++i) {
        varied.pictures[i] = picture_make(shapes[i][0], shapes[i][1], (unsigned)i + 1);
        batch_add_picture(varied.batch, &varied.pictures[i]);
    }
    return varied;
}

static void varied_free(varied_t *varied) {
    batch_free(varied->batch);
    for (size_t i = 0; i < varied->count; ++i)
        free(varied->pictures[i].rgb);
}

static void pixels_outputs_have_their_shapes(void **state) {
    (void)state;
    varied_t varied = varied_pixels();
    uform_arena_t *arena = arena_on_host();
    uform_encoded_t encoded;
    uform_encode_stats_t stats;
    uform_encode_config_t config = {.stats = &stats};
    assert_int_equal(batch_encode(varied.batch, NULL, EVERYTHING, arena, &config, NULL, &encoded), UFORM_OK);
    assert_int_equal(encoded.items, varied.count);
    assert_int_equal(encoded.embeddings.rows, varied.count);
    assert_int_equal(encoded.embeddings.columns, info.dims);
    assert_int_equal(encoded.states.rows, varied.count);
    assert_int_equal(encoded.states.columns, info.image.transformer.hidden);
    assert_int_equal(encoded.token_vectors.rows, varied.count * patches);
    assert_int_equal(encoded.token_vectors.columns, info.dims);
    assert_int_equal(encoded.token_vectors.items, varied.count);
    for (size_t i = 0; i < varied.count; ++i) {
        assert_int_equal(encoded.statuses[i], UFORM_OK);
        assert_int_equal(encoded.token_vectors.item_offsets[i], i * patches);
        assert_true(fabs(norm_of(row_of(&encoded.embeddings, i), info.dims) - 1.0) < 1e-4);
        assert_true(norm_of(row_of(&encoded.states, i), info.image.transformer.hidden) > 0);
    }
    for (size_t row = 0; row < varied.count * patches; ++row)
        assert_true(fabs(norm_of(row_of(&encoded.token_vectors, row), info.dims) - 1.0) < 1e-4);
    assert_int_equal(stats.items, varied.count);
    assert_int_equal(stats.failed, 0);
    assert_int_equal(stats.bytes, varied.batch->bytes);
    assert_int_equal(stats.truncated, 0);
    assert_true(stats.total_ns >= stats.compute_ns);
    /* Different pictures give different embeddings. */
    assert_memory_not_equal(row_of(&encoded.embeddings, 3), row_of(&encoded.embeddings, 4),
                            encoded.embeddings.row_stride);
    uform_arena_free(arena);
    varied_free(&varied);
}

/* Each item of a batch, bad spans among them, equals its solo encoding; bad items fail alone. */
static void an_image_does_not_depend_on_its_batch(void **state) {
    (void)state;
    varied_t varied = varied_pixels();
    batch_t *batch = batch_new(BATCH_PIXELS);
    uform_status_t expected[32];
    size_t items = 0;
    for (size_t i = 0; i < varied.count; ++i) {
        batch_add_picture(batch, &varied.pictures[i]);
        expected[items++] = UFORM_OK;
        if (i == 2) { /* a span one byte short of its height x width x 3 */
            batch_add_pixels(batch, varied.pictures[3].rgb,
                             varied.pictures[3].height * varied.pictures[3].width * 3 - 1,
                             varied.pictures[3].height, varied.pictures[3].width);
            expected[items++] = UFORM_INVALID_ARGUMENT;
        }
        if (i == 4) { /* a height of 0, and a product that overflows */
            batch_add_pixels(batch, NULL, 0, 0, 5);
            expected[items++] = UFORM_INVALID_ARGUMENT;
            batch_add_pixels(batch, varied.pictures[0].rgb, 3, SIZE_MAX / 2, 3);
            expected[items++] = UFORM_INVALID_ARGUMENT;
        }
    }
    assert_int_equal(items, batch->count);
    assert_items_fail_alone(batch_encode, batch, expected, NULL);
    batch_free(batch);
    varied_free(&varied);
}

static void bitwise_identical_across_receivers(void **state) {
    (void)state;
    varied_t varied = varied_pixels();
    assert_same_on_every_receiver(batch_encode, varied.batch, NULL);
    varied_free(&varied);
}

#if UFORM_WITH_JPEG || UFORM_WITH_SPNG
/* A file and the same bytes in memory encode alike, and as the pixels they decode to. */
static void check_encoded_as(blob_t const *blob, char const *name, picture_t const *decoded) {
    blob_write(name, blob);
    batch_t *files = batch_new(BATCH_FILES), *memory = batch_new(BATCH_MEMORY),
            *pixels = batch_new(BATCH_PIXELS);
    batch_add_path(files, name);
    batch_add(memory, blob->data, blob->size);
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

/* The broken and hostile files, in one batch with good ones, written into the folder. */
static size_t bad_cases(file_case_t *cases) {
    size_t n = 0;
    picture_t picture = picture_make(48, 36, 9), one = picture_make(1, 1, 2);
    static char const text[] = "this is a text file, not a JPEG\n";
    uint8_t const fake_jpeg[] = {0xff, 0xd8, 0xff, 0xe0, 0, 16, 'J', 'F', 'I', 'F', 0};
    uint8_t const fake_png[] = {0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0};
#if UFORM_WITH_SPNG
    blob_t png = png_of(&picture, 2, false, NULL);
    cases[n++] = (file_case_t){"good.png", png, UFORM_OK};
    cases[n++] = (file_case_t){"truncated.png", blob_copy(png.data, png.size / 2), UFORM_FORMAT};
    blob_t corrupt_png = blob_copy(png.data, png.size);
    corrupt_png.data[png.size / 2] ^= 0x5a; /* inside IDAT: its CRC no longer matches */
    cases[n++] = (file_case_t){"corrupt.png", corrupt_png, UFORM_FORMAT};
    cases[n++] = (file_case_t){"one.png", png_of(&one, 2, false, NULL), UFORM_OK};
#else
    cases[n++] = (file_case_t){"fake.png", blob_copy(fake_png, sizeof fake_png), UFORM_UNSUPPORTED};
#endif
#if UFORM_WITH_JPEG
    blob_t jpeg = jpeg_of(&picture, 85, TJSAMP_420);
    cases[n++] = (file_case_t){"good.jpg", jpeg, UFORM_OK};
    cases[n++] = (file_case_t){"truncated.jpg", blob_copy(jpeg.data, jpeg.size * 2 / 3), UFORM_FORMAT};
    blob_t corrupt_jpeg = blob_copy(jpeg.data, jpeg.size);
    for (size_t i = 2; i + 8 < corrupt_jpeg.size; ++i)
        if (corrupt_jpeg.data[i] == 0xff &&
            corrupt_jpeg.data[i + 1] == 0xc0) { /* SOF0: zero the dimensions */
            memset(corrupt_jpeg.data + i + 5, 0, 4);
            break;
        }
    cases[n++] = (file_case_t){"corrupt.jpg", corrupt_jpeg, UFORM_FORMAT};
    blob_t huge_jpeg = blob_copy(jpeg.data, jpeg.size);
    for (size_t i = 2; i + 8 < huge_jpeg.size; ++i)
        if (huge_jpeg.data[i] == 0xff && huge_jpeg.data[i + 1] == 0xc0) { /* SOF0: 65000 x 65000 */
            huge_jpeg.data[i + 5] = huge_jpeg.data[i + 7] = 0xfd;
            huge_jpeg.data[i + 6] = huge_jpeg.data[i + 8] = 0xe8;
            break;
        }
    cases[n++] = (file_case_t){"huge.jpg", huge_jpeg, UFORM_FORMAT};
    cases[n++] = (file_case_t){"one.jpg", jpeg_of(&one, 90, TJSAMP_444), UFORM_OK};
#else
    cases[n++] = (file_case_t){"fake.jpg", blob_copy(fake_jpeg, sizeof fake_jpeg), UFORM_UNSUPPORTED};
#endif
    (void)fake_jpeg, (void)fake_png;
    cases[n++] = (file_case_t){"text.jpg", blob_copy(text, sizeof text - 1), UFORM_FORMAT};
    cases[n++] =
        (file_case_t){"huge.png", huge_png_header(), UFORM_WITH_SPNG ? UFORM_FORMAT : UFORM_UNSUPPORTED};
    cases[n++] = (file_case_t){"empty.jpg", blob_copy("", 0), UFORM_FORMAT};
    cases[n++] = (file_case_t){"absent.jpg", {NULL, 0}, UFORM_IO, true};
    cases[n++] = (file_case_t){".", {NULL, 0}, UFORM_IO, true};              /* the folder itself */
    cases[n++] = (file_case_t){"fifo.png", {NULL, 0}, UFORM_IO, true};       /* opening it must not block */
    cases[n++] = (file_case_t){"sparse.png", {NULL, 0}, UFORM_FORMAT, true}; /* past the size limit */
    free(picture.rgb);
    free(one.rgb);
    cases_write(cases, n);
    char path[512];
    fixture_path("fifo.png", path, sizeof path);
    unlink(path);
    assert_int_equal(mkfifo(path, 0600), 0);
    sparse_write("sparse.png", (size_t)UFORM_IMAGE_MAX_BYTES + 1);
    return n;
}

/* Each bad file fails alone; many files over several chunks: the next chunk's reads are in flight while
 * one computes, and every item equals the first of its kind. */
static file_cases_t image_cases = {batch_encode, bad_cases};

static void progress_and_cancel(void **state) {
    (void)state;
    picture_t picture = picture_make(24, 40, 4);
#if UFORM_WITH_SPNG
    picture_t expected;
    blob_t png = png_of(&picture, 2, false, &expected);
    blob_write("progress.png", &png);
    free(png.data);
    free(expected.rgb);
#endif
    batch_t *pixels = batch_new(BATCH_PIXELS), *files = batch_new(BATCH_FILES);
    for (size_t i = 0; i < 200; ++i) {
        batch_add_picture(pixels, &picture);
        batch_add_path(files, "progress.png");
    }
    assert_progress_and_cancel(batch_encode, pixels, UFORM_OK);
    assert_progress_and_cancel(batch_encode, files, UFORM_WITH_SPNG ? UFORM_OK : UFORM_IO);
    batch_free(pixels);
    batch_free(files);
    free(picture.rgb);
}

/* ---- Decoding ahead ------------------------------------------------------------------------------ */

/* 150 images, pixels and (with a codec) files, over several chunks: decoded ahead while the chunk before
 * computes, and the same bitwise whatever the thread count. */
static void decoding_overlaps_compute(void **state) {
    (void)state;
    picture_t pictures[4];
    for (size_t i = 0; i < 4; ++i)
        pictures[i] = picture_make(20 + 7 * i, 50 - 9 * i, (unsigned)i + 21);
    batch_t *pixels = batch_new(BATCH_PIXELS);
    for (size_t i = 0; i < 150; ++i)
        batch_add_picture(pixels, &pictures[i % 4]);
    assert_decoded_ahead(batch_encode, pixels);
    batch_free(pixels);
#if UFORM_WITH_JPEG
    batch_t *files = batch_new(BATCH_FILES);
    for (size_t i = 0; i < 4; ++i) {
        blob_t jpeg = jpeg_of(&pictures[i], 90, TJSAMP_420);
        char name[32];
        snprintf(name, sizeof name, "ahead%zu.jpg", i);
        blob_write(name, &jpeg);
        free(jpeg.data);
    }
    for (size_t i = 0; i < 150; ++i) {
        char name[32];
        snprintf(name, sizeof name, "ahead%zu.jpg", i % 4);
        batch_add_path(files, name);
    }
    assert_decoded_ahead(batch_encode, files);
    batch_free(files);
#endif
    for (size_t i = 0; i < 4; ++i)
        free(pictures[i].rgb);
}

static void conversions_and_matryoshka(void **state) {
    (void)state;
    varied_t varied = varied_pixels();
    assert_conversions_and_matryoshka(batch_encode, varied.batch, EVERYTHING, &info,
                                      kernels_scalar()->convert);
    varied_free(&varied);
}

static void bad_arguments_fail_at_once(void **state) {
    (void)state;
    picture_t picture = picture_make(8, 8, 1);
    uform_arena_t *arena = arena_on_host();
    uform_encoded_t encoded;
    size_t heights[] = {8}, widths[] = {8}, offsets[] = {0, 192}, backwards[] = {192, 0}, beyond[] = {0, 500};
    uform_image_encode_pixels_args_t good = {.model = model,
                                             .outputs = UFORM_OUTPUT_EMBEDDINGS,
                                             .arena = arena,
                                             .encoded = &encoded,
                                             .pixels = {picture.rgb, offsets, 1, 192},
                                             .heights = heights,
                                             .widths = widths};
    char const *const what[] = {"heights NULL",          "widths NULL", "no items",  "offsets out of order",
                                "offsets past the tape", "no outputs",  "arena NULL"};
    uform_image_encode_pixels_args_t bad[sizeof what / sizeof what[0]];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i)
        bad[i] = good;
    bad[0].heights = NULL;
    bad[1].widths = NULL;
    bad[2].pixels.count = 0;
    bad[3].pixels.offsets = backwards;
    bad[4].pixels.offsets = beyond;
    bad[5].outputs = 0;
    bad[6].arena = NULL;
    assert_bad_arguments(image_encode_pixels_verb, &good, bad, sizeof bad[0], what,
                         sizeof bad / sizeof bad[0], UFORM_OK);
    assert_int_equal(uform_image_encode(NULL), UFORM_INVALID_ARGUMENT);
    assert_sources_checked(batch_encode, UFORM_OK, NULL);
    uform_arena_free(arena);
    free(picture.rgb);
}

/* ---- Fixtures ----------------------------------------------------------------------------------- */

static int setup(void **state) {
    (void)state;
    uform_tiny_checkpoint_args_t tiny = {.seed = 13, .depth = 2, .hidden = 128};
    if (fixture_setup("image", &tiny, &model, &info) != 0) return -1;
    patches = (info.image.size / info.image.patch) * (info.image.size / info.image.patch);
    return 0;
}

int main(void) {
    struct CMUnitTest const tests[] = {
        cmocka_unit_test(pixels_outputs_have_their_shapes),
        cmocka_unit_test(an_image_does_not_depend_on_its_batch),
        cmocka_unit_test(bitwise_identical_across_receivers),
        cmocka_unit_test(files_and_memory_match_their_pixels),
        FILE_CASES_TESTS("bad_files_fail_alone", &image_cases),
        cmocka_unit_test(progress_and_cancel),
        cmocka_unit_test(decoding_overlaps_compute),
        cmocka_unit_test(conversions_and_matryoshka),
        cmocka_unit_test(bad_arguments_fail_at_once),
    };
    printf("kernels: %s, jpeg: %d, png: %d\n", kernels_active()->name, UFORM_WITH_JPEG, UFORM_WITH_SPNG);
    return cmocka_run_group_tests(tests, setup, fixture_teardown);
}
