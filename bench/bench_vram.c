/* Texts per second and latency of text_encode on a VRAM executor, at several batch sizes.
 *
 *     bench_vram CHECKPOINT [--batches 1,64,1024] [--texts-out FILE] [--embeddings-out FILE] [--seconds S]
 *                [--device N] [--copy]
 *
 * Texts are printable ASCII of 64 to 256 bytes from a fixed seed (the same generator as
 * bench/bench_gpu.py, which writes them to FILE for PyTorch to read). Embeddings land in a device arena
 * and stay there, as a GPU search service would keep them; --copy adds the copy-out to the timing.
 * Each batch size runs until --seconds passed (at least 5 calls) after two warm-up calls; prints one
 * JSON object per batch size: texts/s, and per-call latency p50 and p99 in microseconds. Prints
 * figures only: nothing here passes or fails on time. Exit 77 without a CUDA device.
 *
 * --images encodes RGB8 images of --image-height x --image-width (240 x 320 by default: resized and
 * cropped to the model's size on the device) through image_encode_pixels instead; --pixels-out writes
 * them, raw, for PyTorch. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_common.h"
#include "uform.h"

static uint64_t random_state = 0x9e3779b97f4a7c15ull;

static void die(char const *what) {
    uform_status_t status = bench_report_error("bench_vram", what);
    exit(status == UFORM_DEVICE || status == UFORM_UNSUPPORTED ? 77 : 1);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_vram CHECKPOINT [--batches 1,64,1024] [--texts-out FILE] [--seconds S] [--copy]\n");
        return 2;
    }
    char const *path = argv[1], *texts_out = NULL, *embeddings_out = NULL, *batches_text = "1,64,1024";
    double seconds = 3;
    bool copy = false, images = false;
    size_t image_height = 240, image_width = 320;
    char const *pixels_out = NULL;
    size_t device = 0;
    for (int i = 2; i < argc; ++i) {
        if (!strcmp(argv[i], "--batches") && i + 1 < argc) batches_text = argv[++i];
        else if (!strcmp(argv[i], "--texts-out") && i + 1 < argc) texts_out = argv[++i];
        else if (!strcmp(argv[i], "--embeddings-out") && i + 1 < argc) embeddings_out = argv[++i];
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--device") && i + 1 < argc) device = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--copy")) copy = true;
        else if (!strcmp(argv[i], "--images")) images = true;
        else if (!strcmp(argv[i], "--image-height") && i + 1 < argc) image_height = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--image-width") && i + 1 < argc) image_width = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--pixels-out") && i + 1 < argc) pixels_out = argv[++i];
        else {
            fprintf(stderr, "bench_vram: unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    size_t batches[16], batches_count = 0, largest = 1;
    for (char const *at = batches_text; *at && batches_count < 16;) {
        batches[batches_count] = (size_t)strtoul(at, (char **)&at, 10);
        if (batches[batches_count] > largest) largest = batches[batches_count];
        batches_count++;
        if (*at == ',') at++;
    }

    /* The texts: `largest` of them, 64..256 printable bytes each. */
    size_t *offsets = malloc((largest + 1) * sizeof(size_t));
    char *bytes = malloc(largest * 256);
    offsets[0] = 0;
    for (size_t i = 0; i < largest; ++i) {
        size_t length = 64 + bench_xorshift(&random_state) % 193;
        for (size_t j = 0; j < length; ++j)
            bytes[offsets[i] + j] = (char)(' ' + bench_xorshift(&random_state) % 95);
        offsets[i + 1] = offsets[i] + length;
    }
    if (texts_out) {
        FILE *file = fopen(texts_out, "w");
        if (!file) {
            perror(texts_out);
            return 1;
        }
        for (size_t i = 0; i < largest; ++i)
            fprintf(file, "%.*s\n", (int)(offsets[i + 1] - offsets[i]), bytes + offsets[i]);
        fclose(file);
    }

    /* With --images: `largest` RGB8 images of image_height x image_width, smooth gradients plus noise. */
    size_t image_bytes = image_height * image_width * 3;
    uint8_t *pixels = NULL;
    size_t *pixel_offsets = NULL, *heights = NULL, *widths = NULL;
    if (images) {
        pixels = malloc(largest * image_bytes);
        pixel_offsets = malloc((largest + 1) * sizeof(size_t));
        heights = malloc(largest * sizeof(size_t));
        widths = malloc(largest * sizeof(size_t));
        if (!pixels || !pixel_offsets || !heights || !widths) {
            fprintf(stderr, "bench_vram: out of memory for the images\n");
            return 1;
        }
        for (size_t i = 0; i < largest; ++i) {
            pixel_offsets[i] = i * image_bytes;
            heights[i] = image_height;
            widths[i] = image_width;
            for (size_t j = 0; j < image_bytes; ++j)
                pixels[i * image_bytes + j] = (uint8_t)((j / 3 % image_width) + (j / 3 / image_width) * (i + 1) +
                                                        (bench_xorshift(&random_state) & 31));
        }
        pixel_offsets[largest] = largest * image_bytes;
        if (pixels_out) {
            FILE *file = fopen(pixels_out, "wb");
            if (!file || fwrite(pixels, 1, largest * image_bytes, file) != largest * image_bytes) {
                perror(pixels_out);
                return 1;
            }
            fclose(file);
        }
    }

    uform_executor_t *executor = NULL;
    uform_vram_options_t options = {.devices = &device, .devices_count = 1};
    if (uform_executor_create_vram(&options, &executor) != UFORM_OK) die("cannot create a VRAM executor");
    uform_model_t *model = NULL;
    uint64_t loading = bench_now_ns();
    uform_model_load_args_t load = {.executor = executor, .path = path, .model = &model};
    if (uform_model_load_vram(&load) != UFORM_OK) die("cannot load the checkpoint");
    double load_ms = (double)(bench_now_ns() - loading) / 1e6;
    uform_arena_t *arena = NULL;
    if (uform_arena_create(executor, &arena) != UFORM_OK) die("cannot create an arena");
    uform_model_info_t info;
    uform_model_info(model, &info);
    float *host = malloc(largest * info.dims * sizeof(float));
    printf("{\"engine\": \"uform-vram\", \"load_ms\": %.1f, \"depth\": %zu, \"hidden\": %zu, \"context\": %zu}\n", load_ms,
           info.text.transformer.depth, info.text.transformer.hidden, info.text.context);

    for (size_t b = 0; b < batches_count; ++b) {
        size_t batch = batches[b];
        uform_tape_t tape = {.data = bytes, .offsets = offsets, .count = batch, .length = offsets[largest]};
        uform_encoded_t encoded;
        uform_text_encode_args_t args = {.model = model, .executor = executor, .outputs = UFORM_OUTPUT_EMBEDDINGS,
                                         .arena = arena, .encoded = &encoded, .texts = tape};
        uform_image_encode_pixels_args_t image_args = {
            .model = model, .executor = executor, .outputs = UFORM_OUTPUT_EMBEDDINGS, .arena = arena,
            .encoded = &encoded, .heights = heights, .widths = widths,
            .pixels = {.data = pixels, .offsets = pixel_offsets, .count = batch, .length = largest * image_bytes}};
        size_t capacity = 1 << 16, calls = 0;
        uint64_t *latencies = malloc(capacity * sizeof(uint64_t));
        for (int warm = 0; warm < 2; ++warm)
            if ((images ? uform_image_encode_pixels(&image_args) : uform_text_encode(&args)) != UFORM_OK) die("encode");
        uint64_t start = bench_now_ns();
        while (calls < capacity && (calls < 5 || (double)(bench_now_ns() - start) / 1e9 < seconds)) {
            uint64_t begin = bench_now_ns();
            if ((images ? uform_image_encode_pixels(&image_args) : uform_text_encode(&args)) != UFORM_OK) die("encode");
            if (copy && uform_view_copy(&encoded.embeddings, host, largest * info.dims * sizeof(float), NULL) != UFORM_OK)
                die("view_copy");
            latencies[calls++] = bench_now_ns() - begin;
        }
        double elapsed = (double)(bench_now_ns() - start) / 1e9;
        qsort(latencies, calls, sizeof *latencies, bench_compare_u64);
        printf("{\"engine\": \"uform-vram\", \"batch\": %zu, \"calls\": %zu, \"items_per_second\": %.1f, "
               "\"p50_us\": %.1f, \"p99_us\": %.1f, \"copy\": %s}\n",
               batch, calls, (double)(calls * batch) / elapsed, (double)latencies[calls / 2] / 1e3,
               (double)latencies[(calls * 99) / 100 < calls ? (calls * 99) / 100 : calls - 1] / 1e3,
               copy ? "true" : "false");
        fflush(stdout);
        free(latencies);
        /* The embeddings of the largest batch, raw F32, for bench_gpu.py to compare with PyTorch. */
        if (embeddings_out && batch == largest) {
            if (uform_view_copy(&encoded.embeddings, host, largest * info.dims * sizeof(float), NULL) != UFORM_OK)
                die("view_copy");
            FILE *file = fopen(embeddings_out, "wb");
            if (!file || fwrite(host, sizeof(float), batch * info.dims, file) != batch * info.dims) {
                perror(embeddings_out);
                return 1;
            }
            fclose(file);
        }
    }
    free(host);
    uform_arena_free(arena);
    uform_model_free(model);
    uform_executor_free(executor);
    free(offsets);
    free(bytes);
    free(pixels);
    free(pixel_offsets);
    free(heights);
    free(widths);
    return 0;
}
