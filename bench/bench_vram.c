/* Items per second and latency of the encode verbs on a VRAM executor, at several batch sizes.
 *
 *     bench_vram CHECKPOINT [--batches 1,64,1024] [--seconds S] [--device N] [--copy]
 *                [--embeddings-out FILE] [KIND]
 *
 * KIND, the items (texts by default):
 *   --texts-out FILE         texts: printable ASCII of 64 to 256 bytes from a fixed seed, written to FILE
 *                            for PyTorch to read (the same generator as bench/bench_gpu.py's);
 *   --images                 RGB8 pixels of --image-height x --image-width (240 x 320 by default: resized
 *                            and cropped on the device) through image_encode_pixels; --pixels-out writes
 *                            them, raw, for PyTorch;
 *   --files LIST --kind K    the files LIST names (one path a line; batches longer than the list take its
 *                            paths again), end to end from disk: K is images (image_encode), clips
 *                            (video_encode) or sounds (audio_encode);
 *   --samples                sounds as F32 samples at --sample-rate (16000) of --sample-seconds (2), tones
 *                            and noise from a fixed seed, through audio_encode_samples; --samples-out
 *                            writes them, raw, for PyTorch.
 *
 * Embeddings land in a device arena and stay there, as a GPU search service would keep them; --copy adds
 * the copy-out to the timing. Each batch size runs until --seconds passed (at least 5 calls) after two
 * warm-up calls; prints one JSON object per batch size: items/s, and per-call latency p50 and p99 in
 * microseconds, and the stats of the last call (decode, read and compute time, failed items). Prints
 * figures only: nothing here passes or fails on time. Exit 77 without a CUDA device. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "uform.h"

static uint64_t random_state = 0x9e3779b97f4a7c15ull;

static void die(char const *what) {
    uform_status_t status = bench_report_error("bench_vram", what);
    exit(status == UFORM_DEVICE || status == UFORM_UNSUPPORTED ? 77 : 1);
}

typedef enum kind { TEXTS, PIXELS, IMAGE_FILES, CLIP_FILES, SOUND_FILES, SAMPLES } kind_t;

typedef struct options {
    char const *checkpoint, *batches, *texts_out, *embeddings_out, *pixels_out, *samples_out, *list;
    double seconds, sample_seconds;
    size_t device, image_height, image_width, sample_rate;
    bool copy;
    kind_t kind;
} options_t;

/* The items of the largest batch on one tape, with what each verb takes beside it. */
typedef struct items {
    uform_tape_t tape; /* `largest` items */
    size_t *heights, *widths;
    char *data;
} items_t;

static void write_file(char const *path, void const *data, size_t bytes) {
    FILE *file = fopen(path, "wb");
    if (!file || fwrite(data, 1, bytes, file) != bytes || fclose(file) != 0) {
        perror(path);
        exit(1);
    }
}

static void *allocate(size_t bytes) {
    void *memory = malloc(bytes ? bytes : 1);
    if (!memory) {
        fprintf(stderr, "bench_vram: out of memory for the items\n");
        exit(1);
    }
    return memory;
}

/* `count` texts, 64..256 printable bytes each. */
static items_t texts_make(size_t count, char const *out) {
    items_t items = {.data = allocate(count * 256)};
    size_t *offsets = allocate((count + 1) * sizeof(size_t));
    offsets[0] = 0;
    for (size_t i = 0; i < count; ++i) {
        size_t length = 64 + bench_xorshift(&random_state) % 193;
        for (size_t j = 0; j < length; ++j)
            items.data[offsets[i] + j] = (char)(' ' + bench_xorshift(&random_state) % 95);
        offsets[i + 1] = offsets[i] + length;
    }
    if (out) {
        FILE *file = fopen(out, "w");
        if (!file) {
            perror(out);
            exit(1);
        }
        for (size_t i = 0; i < count; ++i)
            fprintf(file, "%.*s\n", (int)(offsets[i + 1] - offsets[i]), items.data + offsets[i]);
        fclose(file);
    }
    items.tape =
        (uform_tape_t){.data = items.data, .offsets = offsets, .count = count, .length = offsets[count]};
    return items;
}

/* `count` RGB8 images of height x width: smooth gradients plus noise. */
static items_t pixels_make(size_t count, size_t height, size_t width, char const *out) {
    size_t bytes = height * width * 3;
    items_t items = {.data = allocate(count * bytes),
                     .heights = allocate(count * sizeof(size_t)),
                     .widths = allocate(count * sizeof(size_t))};
    size_t *offsets = allocate((count + 1) * sizeof(size_t));
    for (size_t i = 0; i <= count; ++i)
        offsets[i] = i * bytes;
    for (size_t i = 0; i < count; ++i) {
        items.heights[i] = height, items.widths[i] = width;
        for (size_t j = 0; j < bytes; ++j)
            items.data[i * bytes + j] = (char)(uint8_t)((j / 3 % width) + (j / 3 / width) * (i + 1) +
                                                        (bench_xorshift(&random_state) & 31));
    }
    if (out) write_file(out, items.data, count * bytes);
    items.tape =
        (uform_tape_t){.data = items.data, .offsets = offsets, .count = count, .length = count * bytes};
    return items;
}

/* `count` paths from the lines of `list`, taken again from the first when it has fewer. */
static items_t paths_read(size_t count, char const *list) {
    FILE *file = fopen(list, "r");
    if (!file) {
        perror(list);
        exit(1);
    }
    char line[4096], *paths = NULL;
    size_t used = 0, lines = 0;
    size_t *ends = NULL;
    while (fgets(line, sizeof line, file)) {
        size_t length = strcspn(line, "\r\n");
        if (!length) continue;
        paths = realloc(paths, used + length);
        ends = realloc(ends, (lines + 1) * sizeof(size_t));
        if (!paths || !ends) exit(1);
        memcpy(paths + used, line, length);
        used += length;
        ends[lines++] = used;
    }
    fclose(file);
    if (!lines) {
        fprintf(stderr, "bench_vram: %s names no file\n", list);
        exit(1);
    }
    items_t items = {.data = allocate(count * 4096)};
    size_t *offsets = allocate((count + 1) * sizeof(size_t));
    offsets[0] = 0;
    for (size_t i = 0; i < count; ++i) {
        size_t k = i % lines, begin = k ? ends[k - 1] : 0;
        memcpy(items.data + offsets[i], paths + begin, ends[k] - begin);
        offsets[i + 1] = offsets[i] + ends[k] - begin;
    }
    free(paths), free(ends);
    items.tape =
        (uform_tape_t){.data = items.data, .offsets = offsets, .count = count, .length = offsets[count]};
    return items;
}

/* `count` sounds of `length` samples: two tones of each sound's own pitch, plus noise. */
static items_t samples_make(size_t count, size_t length, char const *out) {
    items_t items = {.data = allocate(count * length * sizeof(float))};
    float *samples = (float *)(void *)items.data;
    size_t *offsets = allocate((count + 1) * sizeof(size_t));
    for (size_t i = 0; i <= count; ++i)
        offsets[i] = i * length;
    for (size_t i = 0; i < count; ++i) {
        float pitch = 0.02f + 0.0007f * (float)(i % 97);
        for (size_t j = 0; j < length; ++j)
            samples[i * length + j] = 0.4f * sinf(pitch * (float)j) + 0.2f * sinf(2.7f * pitch * (float)j) +
                                      0.05f * ((float)(bench_xorshift(&random_state) & 1023) / 512.0f - 1.0f);
    }
    if (out) write_file(out, items.data, count * length * sizeof(float));
    items.tape =
        (uform_tape_t){.data = items.data, .offsets = offsets, .count = count, .length = count * length};
    return items;
}

/* One call of the kind's verb over the first `batch` items. */
static uform_status_t encode(options_t const *options, uform_model_t *model, uform_executor_t *executor,
                             uform_arena_t *arena, items_t const *items, size_t batch,
                             uform_encoded_t *encoded, uform_encode_stats_t *stats) {
    uform_encode_config_t config = {.stats = stats};
    uform_tape_t tape = items->tape;
    tape.count = batch;
#define COMMON                                                                                               \
    .model = model, .executor = executor, .outputs = UFORM_OUTPUT_EMBEDDINGS, .arena = arena,                \
    .config = &config, .encoded = encoded
    uform_text_encode_args_t texts = {COMMON, .texts = tape};
    uform_image_encode_pixels_args_t pixels = {COMMON, .pixels = tape, .heights = items->heights,
                                               .widths = items->widths};
    uform_image_encode_args_t images = {COMMON, .source = UFORM_SOURCE_FILES, .images = tape};
    uform_video_encode_args_t clips = {COMMON, .source = UFORM_SOURCE_FILES, .videos = tape};
    uform_audio_encode_args_t sounds = {COMMON, .source = UFORM_SOURCE_FILES, .sounds = tape};
    uform_audio_encode_samples_args_t samples = {COMMON, .samples = tape, .rate = options->sample_rate};
#undef COMMON
    switch (options->kind) {
    case PIXELS:
        return uform_image_encode_pixels(&pixels);
    case IMAGE_FILES:
        return uform_image_encode(&images);
    case CLIP_FILES:
        return uform_video_encode(&clips);
    case SOUND_FILES:
        return uform_audio_encode(&sounds);
    case SAMPLES:
        return uform_audio_encode_samples(&samples);
    default:
        return uform_text_encode(&texts);
    }
}

/* The flags that take a value: where each goes, as a string, a size or a number of seconds. */
typedef struct flag {
    char const *name;
    char const **text;
    size_t *size;
    double *seconds;
} flag_t;

static void parse(int argc, char **argv, options_t *options) {
    *options = (options_t){.checkpoint = argv[1],
                           .batches = "1,64,1024",
                           .seconds = 3,
                           .image_height = 240,
                           .image_width = 320,
                           .sample_rate = 16000,
                           .sample_seconds = 2};
    char const *kind = NULL;
    flag_t const flags[] = {
        {"--batches", &options->batches},
        {"--texts-out", &options->texts_out},
        {"--embeddings-out", &options->embeddings_out},
        {"--pixels-out", &options->pixels_out},
        {"--samples-out", &options->samples_out},
        {"--files", &options->list},
        {"--kind", &kind},
        {"--device", .size = &options->device},
        {"--image-height", .size = &options->image_height},
        {"--image-width", .size = &options->image_width},
        {"--sample-rate", .size = &options->sample_rate},
        {"--seconds", .seconds = &options->seconds},
        {"--sample-seconds", .seconds = &options->sample_seconds},
    };
    for (int i = 2; i < argc; ++i) {
        char const *name = argv[i];
        flag_t const *flag = NULL;
        for (size_t f = 0; f < sizeof flags / sizeof *flags && i + 1 < argc; ++f)
            if (!strcmp(name, flags[f].name)) flag = &flags[f];
        if (flag) {
            char const *value = argv[++i];
            if (flag->text) *flag->text = value;
            if (flag->size) *flag->size = (size_t)atol(value);
            if (flag->seconds) *flag->seconds = atof(value);
        } else if (!strcmp(name, "--copy") || !strcmp(name, "--images") || !strcmp(name, "--samples")) {
            options->copy |= name[2] == 'c';
            if (name[2] != 'c') options->kind = name[2] == 'i' ? PIXELS : SAMPLES;
        } else {
            fprintf(stderr, "bench_vram: unknown argument %s\n", name);
            exit(2);
        }
    }
    if (!options->list) return;
    kind_t const kinds[] = {IMAGE_FILES, CLIP_FILES, SOUND_FILES};
    char const *const names[] = {"images", "clips", "sounds"};
    options->kind = IMAGE_FILES;
    for (size_t k = 0; kind && k < 3; ++k)
        if (!strcmp(kind, names[k])) options->kind = kinds[k];
    if (kind && strcmp(kind, "images") && options->kind == IMAGE_FILES) {
        fprintf(stderr, "bench_vram: --kind is images, clips or sounds, not %s\n", kind);
        exit(2);
    }
}

static char const *kind_name(kind_t kind) {
    static char const *const names[] = {"texts",      "pixels",      "image files",
                                        "clip files", "sound files", "samples"};
    return names[kind];
}

/* Times `batch` on the executor and prints its record. */
static void run_batch(options_t const *options, uform_model_t *model, uform_executor_t *executor,
                      uform_arena_t *arena, items_t const *items, size_t batch, float *host, size_t dims) {
    bool largest = batch == items->tape.count;
    uform_encoded_t encoded;
    uform_encode_stats_t stats = {0};
    size_t capacity = 1 << 16, calls = 0;
    uint64_t *latencies = allocate(capacity * sizeof(uint64_t));
    for (int warm = 0; warm < 2; ++warm)
        if (encode(options, model, executor, arena, items, batch, &encoded, &stats) != UFORM_OK)
            die("encode");
    uint64_t start = bench_now_ns();
    while (calls < capacity && (calls < 5 || (double)(bench_now_ns() - start) / 1e9 < options->seconds)) {
        uint64_t begin = bench_now_ns();
        if (encode(options, model, executor, arena, items, batch, &encoded, &stats) != UFORM_OK)
            die("encode");
        if (options->copy &&
            uform_view_copy(&encoded.embeddings, host, batch * dims * sizeof(float), NULL) != UFORM_OK)
            die("view_copy");
        latencies[calls++] = bench_now_ns() - begin;
    }
    double elapsed = (double)(bench_now_ns() - start) / 1e9;
    qsort(latencies, calls, sizeof *latencies, bench_compare_u64);
    printf(
        "{\"engine\": \"uform-vram\", \"kind\": \"%s\", \"batch\": %zu, \"calls\": %zu, "
        "\"items_per_second\": %.1f, \"p50_us\": %.1f, \"p99_us\": %.1f, \"copy\": %s, \"decode_ms\": %.2f, "
        "\"read_ms\": %.2f, \"total_ms\": %.2f, \"failed\": %zu}\n",
        kind_name(options->kind), batch, calls, (double)(calls * batch) / elapsed,
        (double)latencies[calls / 2] / 1e3,
        (double)latencies[(calls * 99) / 100 < calls ? (calls * 99) / 100 : calls - 1] / 1e3,
        options->copy ? "true" : "false", (double)stats.decode_ns / 1e6, (double)stats.read_ns / 1e6,
        (double)stats.total_ns / 1e6, stats.failed);
    fflush(stdout);
    free(latencies);
    /* The embeddings of the largest batch, raw F32, for bench_gpu.py to compare with PyTorch. */
    if (options->embeddings_out && largest) {
        if (uform_view_copy(&encoded.embeddings, host, batch * dims * sizeof(float), NULL) != UFORM_OK)
            die("view_copy");
        write_file(options->embeddings_out, host, batch * dims * sizeof(float));
    }
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr,
                "usage: bench_vram CHECKPOINT [--batches 1,64,1024] [--seconds S] [--copy] [--images | "
                "--files LIST --kind images|clips|sounds | --samples] (see the file's head)\n");
        return 2;
    }
    options_t options;
    parse(argc, argv, &options);
    size_t batches[16], batches_count = 0, largest = 1;
    for (char const *at = options.batches; *at && batches_count < 16;) {
        batches[batches_count] = (size_t)strtoul(at, (char **)&at, 10);
        if (batches[batches_count] > largest) largest = batches[batches_count];
        batches_count++;
        if (*at == ',') at++;
    }
    items_t items =
        options.kind == PIXELS
            ? pixels_make(largest, options.image_height, options.image_width, options.pixels_out)
        : options.kind == SAMPLES
            ? samples_make(largest, (size_t)(options.sample_seconds * (double)options.sample_rate),
                           options.samples_out)
        : options.list ? paths_read(largest, options.list)
                       : texts_make(largest, options.texts_out);

    uform_executor_t *executor = NULL;
    uform_vram_options_t vram = {.devices = &options.device, .devices_count = 1};
    if (uform_executor_create_vram(&vram, &executor) != UFORM_OK) die("cannot create a VRAM executor");
    uform_model_t *model = NULL;
    uint64_t loading = bench_now_ns();
    uform_model_load_args_t load = {.executor = executor, .path = options.checkpoint, .model = &model};
    if (uform_model_load_vram(&load) != UFORM_OK) die("cannot load the checkpoint");
    double load_ms = (double)(bench_now_ns() - loading) / 1e6;
    uform_arena_t *arena = NULL;
    if (uform_arena_create(executor, &arena) != UFORM_OK) die("cannot create an arena");
    uform_model_info_t info;
    uform_model_info(model, &info);
    float *host = allocate(largest * info.dims * sizeof(float));
    printf("{\"engine\": \"uform-vram\", \"load_ms\": %.1f, \"depth\": %zu, \"hidden\": %zu, \"context\": "
           "%zu}\n",
           load_ms, info.text.transformer.depth, info.text.transformer.hidden, info.text.context);
    for (size_t b = 0; b < batches_count; ++b)
        run_batch(&options, model, executor, arena, &items, batches[b], host, info.dims);
    free(host);
    uform_arena_free(arena);
    uform_model_free(model);
    uform_executor_free(executor);
    free((void *)items.tape.offsets);
    free(items.data), free(items.heights), free(items.widths);
    return 0;
}
