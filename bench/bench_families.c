/* A pretrained folder (or converted checkpoint) on a VRAM executor against the same on a RAM executor: the
 * text embeddings of both for the same texts, and with --images the image embeddings of both for the same
 * image files, compared item by item, then items per second of each.
 *
 *     bench_families MODEL [--texts N] [--images LIST] [--seconds S] [--threshold C]
 *
 * The texts: a fixed list (empty, blank, short, multilingual, emoji, past every context) then printable
 * ASCII of 16 to 400 bytes from a fixed seed, N in all (256 by default). LIST names image files (JPEG or
 * PNG), one path a line; with an image tower, pixels of a few sides too (image_encode_pixels from host
 * memory). Both executors encode each kind's items in one call (F32 embeddings); every item
 * must have the same status on both, each item encoded on both a cosine of at least C (0.9999 by
 * default), and each failed item zero rows on both. Then each executor encodes the same call again and again
 * for S seconds (1.0 by default; at least 3 calls, after one warm-up call). One JSON line per kind: the
 * model, the kind, items, the worst cosine and its item, items/s of each executor; a kind the VRAM path
 * refuses prints its message instead. Exit 0 when every item compared matched, 1 when one did not (or a call
 * failed), 77 without a CUDA device or when the VRAM path refuses the whole model. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "uform.h"

static char const *const fixed_texts[] = {
    "",
    " ",
    "a cat sits on the mat",
    "A photo of two dogs playing in the snow, taken at dusk.",
    "Привет, мир! Καλημέρα κόσμε. 你好，世界。 مرحبا بالعالم",
    "emoji \xf0\x9f\x90\x88\xe2\x80\x8d\xe2\xac\x9b and marks \xc3\xa9 \xc3\xb1 \xc3\xbc",
    "not UTF-8 \xff\xfe", /* fails alone on a model that reads tokens: zero rows on both */
};

static void *allocate(size_t bytes) {
    void *memory = calloc(1, bytes ? bytes : 1);
    if (!memory) {
        fprintf(stderr, "bench_families: out of memory\n");
        exit(1);
    }
    return memory;
}

/* N texts end to end: the fixed ones, one past every context ("word " 600 times), then random ASCII. */
static uform_tape_t make_texts(size_t count) {
    size_t const fixed = sizeof fixed_texts / sizeof *fixed_texts, long_words = 600;
    size_t capacity = long_words * 5 + count * 400 + 4096;
    char *data = allocate(capacity);
    size_t *offsets = allocate((count + 1) * sizeof(size_t));
    uint64_t state = 0x2545f4914f6cdd1dull;
    size_t at = 0;
    for (size_t i = 0; i < count; ++i) {
        offsets[i] = at;
        if (i < fixed) {
            size_t length = strlen(fixed_texts[i]);
            memcpy(data + at, fixed_texts[i], length);
            at += length;
        } else if (i == fixed) {
            for (size_t w = 0; w < long_words; ++w, at += 5)
                memcpy(data + at, "word ", 5);
        } else {
            size_t length = 16 + bench_xorshift(&state) % 385;
            for (size_t j = 0; j < length; ++j)
                data[at++] = (char)(' ' + bench_xorshift(&state) % 95);
        }
    }
    offsets[count] = at;
    return (uform_tape_t){.data = data, .offsets = offsets, .count = count, .length = at};
}

typedef struct side {
    uform_executor_t *executor;
    uform_model_t *model;
    uform_arena_t *arena;
} side_t;

typedef enum kind { TEXTS, IMAGES, PIXELS } kind_t;

/* The pixels' sides (PIXELS): odd, square, wide and tall images, one a single pixel. */
static size_t const pixel_heights[] = {1, 37, 224, 240, 480, 300, 97};
static size_t const pixel_widths[] = {1, 51, 224, 320, 640, 200, 1001};
#define PIXEL_IMAGES (sizeof pixel_heights / sizeof *pixel_heights)

static uform_status_t encode(side_t const *side, kind_t kind, uform_tape_t const *items,
                             uform_encoded_t *encoded) {
#define COMMON                                                                                               \
    .model = side->model, .executor = side->executor, .outputs = UFORM_OUTPUT_EMBEDDINGS,                    \
    .arena = side->arena, .encoded = encoded
    uform_text_encode_args_t texts = {COMMON, .texts = *items};
    uform_image_encode_args_t images = {COMMON, .images = *items, .source = UFORM_SOURCE_FILES};
    uform_image_encode_pixels_args_t pixels = {COMMON, .pixels = *items, .heights = pixel_heights,
                                               .widths = pixel_widths};
#undef COMMON
    return kind == TEXTS    ? uform_text_encode(&texts)
           : kind == IMAGES ? uform_image_encode(&images)
                            : uform_image_encode_pixels(&pixels);
}

/* Items per second of one call over every item, repeated for `seconds` (at least 3 calls). */
static double items_per_second(side_t const *side, kind_t kind, uform_tape_t const *items, double seconds) {
    uform_encoded_t encoded;
    if (encode(side, kind, items, &encoded) != UFORM_OK) return 0.0;
    double start = bench_now_seconds(), elapsed = 0.0;
    size_t calls = 0;
    while (calls < 3 || elapsed < seconds) {
        if (encode(side, kind, items, &encoded) != UFORM_OK) return 0.0;
        ++calls;
        elapsed = bench_now_seconds() - start;
    }
    return (double)(calls * items->count) / elapsed;
}

/* RGB8 pixels of PIXEL_IMAGES images from a fixed seed, in host memory: smooth gradients with noise. */
static uform_tape_t make_pixels(void) {
    size_t total = 0;
    for (size_t i = 0; i < PIXEL_IMAGES; ++i)
        total += pixel_heights[i] * pixel_widths[i] * 3;
    unsigned char *data = allocate(total);
    size_t *offsets = allocate((PIXEL_IMAGES + 1) * sizeof(size_t));
    uint64_t state = 0x9e3779b97f4a7c15ull;
    size_t at = 0;
    for (size_t i = 0; i < PIXEL_IMAGES; ++i) {
        offsets[i] = at;
        for (size_t y = 0; y < pixel_heights[i]; ++y)
            for (size_t x = 0; x < pixel_widths[i]; ++x)
                for (size_t c = 0; c < 3; ++c)
                    data[at++] =
                        (unsigned char)((x * (c + 1) + y * (3 - c)) % 224 + bench_xorshift(&state) % 32);
    }
    offsets[PIXEL_IMAGES] = at;
    return (uform_tape_t){.data = data, .offsets = offsets, .count = PIXEL_IMAGES, .length = at};
}

/* The paths LIST names, one a line, end to end. */
static uform_tape_t read_list(char const *path) {
    FILE *file = fopen(path, "r");
    if (!file) {
        fprintf(stderr, "bench_families: cannot open %s\n", path);
        exit(1);
    }
    size_t capacity = 1 << 16, count = 0, at = 0, slots = 1024;
    char *data = allocate(capacity);
    size_t *offsets = allocate(slots * sizeof(size_t));
    char line[4096];
    while (fgets(line, sizeof line, file) && count + 1 < slots) {
        size_t length = strcspn(line, "\r\n");
        if (!length || at + length > capacity) continue;
        offsets[count++] = at;
        memcpy(data + at, line, length);
        at += length;
    }
    fclose(file);
    offsets[count] = at;
    return (uform_tape_t){.data = data, .offsets = offsets, .count = count, .length = at};
}

static double cosine(float const *a, float const *b, size_t n) {
    double dot = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < n; ++i) {
        dot += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    if (aa == 0 && bb == 0) return 1.0;
    return aa == 0 || bb == 0 ? 0.0 : dot / sqrt(aa * bb);
}

/* One kind of items on both executors: statuses alike, cosines at least `threshold`, then items/s. 1 when
 * an item did not match or a call failed, 0 otherwise (a kind the VRAM path refuses included). */
static int compare(char const *path, uform_model_info_t const *info, side_t const *ram, side_t const *vram,
                   kind_t kind, uform_tape_t const *items, double seconds, double threshold) {
    char const *name = kind == TEXTS ? "texts" : kind == IMAGES ? "images" : "pixels";
    size_t count = items->count, dims = info->dims;
    uform_encoded_t on_ram, on_vram;
    uform_status_t ram_status = encode(ram, kind, items, &on_ram);
    if (ram_status != UFORM_OK) {
        bench_report_error("bench_families", "encode on the RAM executor");
        return 1;
    }
    uform_status_t vram_status = encode(vram, kind, items, &on_vram);
    if (vram_status == UFORM_UNSUPPORTED) {
        uform_error_t error = uform_last_error();
        char rendered[512];
        uform_error_render(&error, rendered, sizeof rendered);
        printf("{\"model\": \"%s\", \"kind\": \"%s\", \"vram\": \"refused\", \"why\": \"%s\"}\n", path, name,
               rendered);
        return 0;
    }
    if (vram_status != UFORM_OK) {
        bench_report_error("bench_families", "encode on the VRAM executor");
        return 1;
    }
    float *host = allocate(count * dims * sizeof(float)),
          *device_rows = allocate(count * dims * sizeof(float));
    if (uform_view_copy(&on_ram.embeddings, host, count * dims * sizeof(float), NULL) != UFORM_OK ||
        uform_view_copy(&on_vram.embeddings, device_rows, count * dims * sizeof(float), NULL) != UFORM_OK) {
        bench_report_error("bench_families", "view_copy");
        return 1;
    }
    double worst = 2.0;
    size_t worst_item = 0, mismatched = 0, below = 0, compared = 0;
    for (size_t i = 0; i < count; ++i) {
        if (on_ram.statuses[i] != on_vram.statuses[i]) {
            fprintf(stderr, "%s item %zu: status %d on RAM, %d on VRAM\n", name, i, (int)on_ram.statuses[i],
                    (int)on_vram.statuses[i]);
            ++mismatched;
            continue;
        }
        if (on_ram.statuses[i] != UFORM_OK) {
            bool zeros = true;
            for (size_t j = 0; j < dims; ++j)
                zeros = zeros && host[i * dims + j] == 0 && device_rows[i * dims + j] == 0;
            if (!zeros) {
                fprintf(stderr, "%s item %zu failed, and its rows are not zeros (RAM %g, VRAM %g)\n", name, i,
                        host[i * dims], device_rows[i * dims]);
                ++mismatched;
            }
            continue;
        }
        ++compared;
        double c = cosine(host + i * dims, device_rows + i * dims, dims);
        if (c < worst) worst = c, worst_item = i;
        if (c < threshold) {
            ++below;
            fprintf(stderr, "%s item %zu: cosine %.6f (RAM %g %g %g, VRAM %g %g %g)\n", name, i, c,
                    host[i * dims], host[i * dims + 1], host[i * dims + 2], device_rows[i * dims],
                    device_rows[i * dims + 1], device_rows[i * dims + 2]);
        }
    }
    free(host);
    free(device_rows);
    double ram_rate = items_per_second(ram, kind, items, seconds);
    double vram_rate = items_per_second(vram, kind, items, seconds);
    printf("{\"model\": \"%s\", \"family\": \"%s\", \"kind\": \"%s\", \"items\": %zu, \"compared\": %zu, "
           "\"worst_cosine\": %.6f, \"worst_item\": %zu, \"mismatches\": %zu, \"below_threshold\": %zu, "
           "\"per_s_ram\": %.1f, \"per_s_vram\": %.1f}\n",
           path, info->family, name, count, compared, worst, worst_item, mismatched, below, ram_rate,
           vram_rate);
    fflush(stdout);
    return mismatched || below || !compared ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr,
                "usage: bench_families MODEL [--texts N] [--images LIST] [--seconds S] [--threshold C]\n");
        return 2;
    }
    char const *path = argv[1];
    size_t count = 256;
    double seconds = 1.0, threshold = 0.9999;
    char const *images_list = NULL;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--texts"))
            count = (size_t)atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--images"))
            images_list = argv[i + 1];
        else if (!strcmp(argv[i], "--seconds"))
            seconds = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--threshold"))
            threshold = atof(argv[i + 1]);
        else {
            fprintf(stderr, "bench_families: unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    if (count < 8) count = 8;
    uform_tape_t texts = make_texts(count);

    side_t ram = {0}, vram = {0};
    uform_ram_options_t ram_options = uform_ram_options_default();
    if (uform_executor_create_ram(&ram_options, &ram.executor) != UFORM_OK ||
        uform_model_load_ram(&(uform_model_load_args_t){
            .executor = ram.executor, .path = path, .model = &ram.model}) != UFORM_OK ||
        uform_arena_create_host(&ram.arena) != UFORM_OK) {
        bench_report_error("bench_families", "the RAM side");
        return 1;
    }
    size_t device = 0;
    uform_vram_options_t vram_options = {.devices = &device, .devices_count = 1};
    if (uform_executor_create_vram(&vram_options, &vram.executor) != UFORM_OK) {
        bench_report_error("bench_families", "cannot create a VRAM executor");
        return 77;
    }
    uform_status_t loaded = uform_model_load_vram(
        &(uform_model_load_args_t){.executor = vram.executor, .path = path, .model = &vram.model});
    if (loaded != UFORM_OK) {
        uform_status_t status = bench_report_error("bench_families", "the VRAM load");
        printf("{\"model\": \"%s\", \"vram\": \"refused\", \"status\": %d}\n", path, (int)status);
        return status == UFORM_UNSUPPORTED ? 77 : 1;
    }
    if (uform_arena_create(vram.executor, &vram.arena) != UFORM_OK) {
        bench_report_error("bench_families", "cannot create a device arena");
        return 1;
    }
    uform_model_info_t info;
    uform_model_info(ram.model, &info);
    int failed = 0;
    if (info.has_text) failed |= compare(path, &info, &ram, &vram, TEXTS, &texts, seconds, threshold);
    if (info.has_image && images_list) {
        uform_tape_t images = read_list(images_list);
        failed |= compare(path, &info, &ram, &vram, IMAGES, &images, seconds, threshold);
        free((void *)images.data);
        free((void *)images.offsets);
    }
    if (info.has_image) {
        uform_tape_t pixels = make_pixels();
        failed |= compare(path, &info, &ram, &vram, PIXELS, &pixels, seconds, threshold);
        free((void *)pixels.data);
        free((void *)pixels.offsets);
    }
    uform_arena_free(vram.arena);
    uform_arena_free(ram.arena);
    uform_model_free(vram.model);
    uform_model_free(ram.model);
    uform_executor_free(vram.executor);
    uform_executor_free(ram.executor);
    free((void *)texts.data);
    free((void *)texts.offsets);
    return failed;
}
