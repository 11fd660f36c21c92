/* Training steps per second of the RAM trainer, or of the VRAM trainer (--device cuda[:N]), on one
 * synthetic batch, stepped over and over.
 *
 *     bench_train [--depth 2] [--hidden 128] [--context 64] [--image-size 32] [--image-patch 8]
 *                 [--towers text|text,image] [--batch 32] [--text-bytes 64] [--threads 2]
 *                 [--warmup 2] [--steps 10] [--seed 42] [--save-initial PATH] [--save-batch DIR] [--json]
 *                 [--device cpu|cuda|cuda:N]
 *
 * The trainer is made by uform_trainer_init_ram (or uform_trainer_init_vram on device N) from
 * uform_trainer_config_default with the sizes of the flags (dims stays the default). The batch holds --batch
 * texts of --text-bytes random printable bytes and, with --towers text,image, as many 32-bit RGB PNGs of
 * --image-size pixels a side (written here with libspng; without it, images are refused and only texts run),
 * items in order text, image, text, image... Relations pair items 2k and 2k+1: a text with an image, or two
 * texts. --warmup steps run untimed, then --steps steps are timed, each a full uform_trainer_step: the PNGs
 * decoded, forward, backward, clipping and AdamW. Prints steps/s, items/s, tokens/s (a text counts its kept
 * bytes and BOS, an image its patches and class token) and the loss of the first and last step; --json prints
 * one JSON line instead, with the optimizer settings, for bench/bench_train.py to run PyTorch the same way.
 * The share of a step before its first progress report (the batch's items decoded and staged by the host) is
 * measured through a progress handler and printed beside the whole step's time: on a VRAM trainer the rest
 * is the device's forward, loss, backward and update.
 *
 * --save-initial PATH saves the seeded weights before the first step (uform_trainer_save); --save-batch
 * DIR writes the batch (the PNGs and batch.json in tests/reference/train_reference.py's format, naming
 * PATH as its checkpoint), so that PyTorch starts from the same weights on the same items. Prints figures
 * only: nothing here passes or fails on time. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_common.h"
#include "uform.h"
#include "uform_config.h"

#if UFORM_WITH_SPNG
#include <spng.h>
#endif

typedef struct options {
    uform_trainer_config_t config; /* the defaults with the flags' depth, hidden, context, image and seed */
    size_t batch, text_bytes, threads, warmup, steps;
    bool images, json;
    char const *save_initial, *save_batch;
    long device; /* the CUDA device, or -1 for a RAM trainer */
} options_t;

/* The batch: contents[offsets[i] .. offsets[i + 1]) is item i. */
typedef struct batch {
    uform_modality_t *modalities;
    uint8_t *data;
    size_t *offsets;
    size_t count, length;
    uint32_t *relations;
    size_t relations_count;
    size_t tokens; /* per step */
} batch_t;

static uint64_t random_state = 0x9e3779b97f4a7c15ull;

static int failed(char const *what) {
    bench_report_error("bench_train", what);
    return 1;
}

static bool parse_size(char const *text, size_t *value) {
    char *end = NULL;
    unsigned long long parsed = strtoull(text, &end, 10);
    if (!*text || *end) return false;
    *value = (size_t)parsed;
    return true;
}

static int parse(int argc, char **argv, options_t *options) {
    *options =
        (options_t){.batch = 32, .text_bytes = 64, .threads = 2, .warmup = 2, .steps = 10, .device = -1};
    uform_trainer_config_t *config = &options->config;
    uform_trainer_config_default(config);
    for (int i = 1; i < argc; ++i) {
        char const *flag = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        size_t *size = !strcmp(flag, "--depth")         ? &config->depth
                       : !strcmp(flag, "--hidden")      ? &config->hidden
                       : !strcmp(flag, "--context")     ? &config->context
                       : !strcmp(flag, "--image-size")  ? &config->image_size
                       : !strcmp(flag, "--image-patch") ? &config->image_patch
                       : !strcmp(flag, "--batch")       ? &options->batch
                       : !strcmp(flag, "--text-bytes")  ? &options->text_bytes
                       : !strcmp(flag, "--threads")     ? &options->threads
                       : !strcmp(flag, "--warmup")      ? &options->warmup
                       : !strcmp(flag, "--steps")       ? &options->steps
                                                        : NULL;
        if (size && value && parse_size(value, size)) {
            ++i;
        } else if (!strcmp(flag, "--seed") && value) {
            size_t seed = 0;
            if (!parse_size(value, &seed)) {
                fprintf(stderr, "bench_train: bad --seed %s\n", value);
                return 2;
            }
            config->seed = seed;
            ++i;
        } else if (!strcmp(flag, "--towers") && value &&
                   (!strcmp(value, "text") || !strcmp(value, "text,image"))) {
            options->images = !strcmp(value, "text,image");
            ++i;
        } else if (!strcmp(flag, "--save-initial") && value) {
            options->save_initial = argv[++i];
        } else if (!strcmp(flag, "--save-batch") && value) {
            options->save_batch = argv[++i];
        } else if (!strcmp(flag, "--device") && value &&
                   (!strcmp(value, "cpu") || !strcmp(value, "cuda") || !strncmp(value, "cuda:", 5))) {
            size_t ordinal = 0;
            if (!strncmp(value, "cuda:", 5) && !parse_size(value + 5, &ordinal)) {
                fprintf(stderr, "bench_train: bad --device %s\n", value);
                return 2;
            }
            options->device = strcmp(value, "cpu") ? (long)ordinal : -1;
            ++i;
        } else if (!strcmp(flag, "--json")) {
            options->json = true;
        } else {
            fprintf(stderr,
                    "bench_train: bad argument %s (see the comment at the top of bench/bench_train.c)\n",
                    flag);
            return 2;
        }
    }
    if (!options->batch || !options->steps || !options->threads) {
        fprintf(stderr, "bench_train: --batch, --steps and --threads must be positive\n");
        return 2;
    }
    if (options->save_batch && !options->save_initial) {
        fprintf(stderr, "bench_train: --save-batch names the --save-initial checkpoint; give both\n");
        return 2;
    }
    return 0;
}

/* An RGB PNG of size x size: smooth stripes plus noise, different per item. Answers its bytes (malloc'd)
 * or NULL, with the reason printed. */
static uint8_t *png_of(size_t size, size_t item, size_t *bytes) {
#if UFORM_WITH_SPNG
    size_t const samples_count = size * size * 3;
    uint8_t *samples = malloc(samples_count), *png = NULL;
    spng_ctx *context = spng_ctx_new(SPNG_CTX_ENCODER);
    if (!samples || !context) goto done;
    for (size_t i = 0; i < samples_count; ++i)
        samples[i] = (uint8_t)((i / 3 % size) * (item % 7 + 1) + (i / 3 / size) * 3 + (i % 3) * 40 +
                               (bench_xorshift(&random_state) & 31));
    struct spng_ihdr header = {
        .width = (uint32_t)size, .height = (uint32_t)size, .bit_depth = 8, .color_type = 2};
    int error = spng_set_option(context, SPNG_ENCODE_TO_BUFFER, 1);
    if (!error) error = spng_set_ihdr(context, &header);
    if (!error)
        error = spng_encode_image(context, samples, samples_count, SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE);
    if (!error) png = spng_get_png_buffer(context, bytes, &error);
    if (error) fprintf(stderr, "bench_train: libspng: %s\n", spng_strerror(error));
done:
    if (!samples || !context) fprintf(stderr, "bench_train: out of memory for a PNG\n");
    spng_ctx_free(context);
    free(samples);
    return png;
#else
    (void)size;
    (void)item;
    (void)bytes;
    fprintf(stderr, "bench_train: this build has no libspng to write PNGs; run with --towers text\n");
    return NULL;
#endif
}

static void batch_free(batch_t *batch) {
    free(batch->modalities);
    free(batch->data);
    free(batch->offsets);
    free(batch->relations);
}

/* The batch's items as the step reads them. */
static uform_tape_t batch_contents(batch_t const *batch) {
    return (uform_tape_t){
        .data = batch->data, .offsets = batch->offsets, .count = batch->count, .length = batch->length};
}

/* Items alternate text and image with images; texts only otherwise. Relations (2k, 2k + 1). */
static int batch_make(options_t const *options, batch_t *batch) {
    size_t const count = options->batch;
    *batch = (batch_t){.count = count};
    batch->modalities = malloc(count * sizeof *batch->modalities);
    batch->offsets = malloc((count + 1) * sizeof *batch->offsets);
    batch->relations = malloc(count * sizeof *batch->relations);
    if (!batch->modalities || !batch->offsets || !batch->relations) goto out_of_memory;
    size_t const kept = options->text_bytes < options->config.context ? options->text_bytes
                                                                      : options->config.context,
                 patches = options->config.image_patch
                               ? (options->config.image_size / options->config.image_patch)
                               : 0;
    batch->offsets[0] = 0;
    for (size_t i = 0; i < count; ++i) {
        bool image = options->images && i % 2 == 1;
        uint8_t *item = NULL;
        size_t bytes = options->text_bytes;
        if (image) {
            item = png_of(options->config.image_size, i, &bytes);
            if (!item) return 1;
        }
        uint8_t *grown = realloc(batch->data, batch->length + bytes + 1);
        if (!grown) {
            free(item);
            goto out_of_memory;
        }
        batch->data = grown;
        if (image) {
            memcpy(batch->data + batch->length, item, bytes);
            free(item);
        } else {
            for (size_t j = 0; j < bytes; ++j)
                batch->data[batch->length + j] = (uint8_t)(' ' + bench_xorshift(&random_state) % 95);
        }
        batch->modalities[i] = image ? UFORM_MODALITY_IMAGE : UFORM_MODALITY_TEXT;
        batch->length += bytes;
        batch->offsets[i + 1] = batch->length;
        batch->tokens += image ? patches * patches + 1 : kept + 1;
    }
    for (size_t k = 0; 2 * k + 1 < count; ++k) {
        batch->relations[2 * k] = (uint32_t)(2 * k);
        batch->relations[2 * k + 1] = (uint32_t)(2 * k + 1);
        batch->relations_count++;
    }
    return 0;
out_of_memory:
    fprintf(stderr, "bench_train: out of memory for the batch\n");
    return 1;
}

/* DIR/item-N.png and DIR/batch.json (train_reference.py's batch format). */
static int batch_save(batch_t const *batch, options_t const *options, uform_trainer_config_t const *config) {
    char path[4096];
    snprintf(path, sizeof path, "%s/batch.json", options->save_batch);
    FILE *json = fopen(path, "w");
    if (!json) {
        perror(path);
        return 1;
    }
    fputs("{\"checkpoint\": \"", json);
    for (char const *c = options->save_initial; *c; ++c)
        fprintf(json, *c == '"' || *c == '\\' ? "\\%c" : "%c", *c);
    fputs("\",\n \"items\": [\n", json);
    for (size_t i = 0; i < batch->count; ++i) {
        uint8_t const *item = batch->data + batch->offsets[i];
        size_t const bytes = batch->offsets[i + 1] - batch->offsets[i];
        if (batch->modalities[i] == UFORM_MODALITY_IMAGE) {
            char name[64];
            snprintf(name, sizeof name, "item-%zu.png", i);
            snprintf(path, sizeof path, "%s/%s", options->save_batch, name);
            FILE *png = fopen(path, "wb");
            if (!png || fwrite(item, 1, bytes, png) != bytes || fclose(png)) {
                perror(path);
                fclose(json);
                return 1;
            }
            fprintf(json, "  {\"modality\": \"image\", \"path\": \"%s\"}", name);
        } else {
            fputs("  {\"modality\": \"text\", \"text\": \"", json);
            for (size_t j = 0; j < bytes; ++j)
                fprintf(json, item[j] == '"' || item[j] == '\\' ? "\\%c" : "%c", item[j]);
            fputs("\"}", json);
        }
        fputs(i + 1 < batch->count ? ",\n" : "\n", json);
    }
    fputs(" ],\n \"relations\": [", json);
    for (size_t k = 0; k < batch->relations_count; ++k)
        fprintf(json, "%s[%u, %u]", k ? ", " : "", batch->relations[2 * k], batch->relations[2 * k + 1]);
    fprintf(json,
            "],\n \"lm_weight\": %.17g, \"steps\": %zu,\n"
            " \"optimizer\": {\"learning_rate\": %.17g, \"weight_decay\": %.17g, \"beta1\": %.17g, "
            "\"beta2\": %.17g,\n"
            "  \"epsilon\": %.17g, \"warmup_steps\": %zu, \"total_steps\": %zu, \"clip_norm\": %.17g}}\n",
            config->lm_weight, options->warmup + options->steps, config->learning_rate, config->weight_decay,
            config->beta1, config->beta2, config->epsilon, config->warmup_steps, config->total_steps,
            config->clip_norm);
    if (fclose(json)) {
        perror(options->save_batch);
        return 1;
    }
    return 0;
}

/* The executor of --device and a trainer on it: 0, or 1 on failure (the engine's error kept). */
static int trainer_make(options_t const *options, uform_trainer_config_t const *config,
                        uform_executor_t **executor, uform_trainer_t **trainer) {
    uform_trainer_init_args_t init = {.config = config, .trainer = trainer};
    if (options->device >= 0) {
        size_t device = (size_t)options->device;
        uform_vram_options_t vram = {.devices = &device, .devices_count = 1};
        if (uform_executor_create_vram(&vram, executor) != UFORM_OK) return 1;
        init.executor = *executor;
        return uform_trainer_init_vram(&init) != UFORM_OK;
    }
    uform_ram_options_t ram = uform_ram_options_default();
    ram.threads = options->threads;
    if (uform_executor_create_ram(&ram, executor) != UFORM_OK) return 1;
    init.executor = *executor;
    return uform_trainer_init_ram(&init) != UFORM_OK;
}

/* The progress of a timed step: when its inputs were ready (the first report). */
typedef struct host_share {
    uint64_t started, prepared, total; /* ns: the step's start, its first report, the sum of those spans */
} host_share_t;

static uform_continuation_t on_progress(void *state, size_t completed, size_t total) {
    host_share_t *share = state;
    (void)total;
    if (completed == 1 && !share->prepared) share->prepared = bench_now_ns();
    return UFORM_CONTINUE;
}

int main(int argc, char **argv) {
    options_t options;
    int status = parse(argc, argv, &options);
    if (status) return status;
    random_state ^= options.config.seed * 0x2545f4914f6cdd1dull;

    uform_trainer_config_t config = options.config;
    config.towers = (1u << UFORM_MODALITY_TEXT) | (options.images ? 1u << UFORM_MODALITY_IMAGE : 0);

    batch_t batch;
    uform_executor_t *executor = NULL;
    uform_trainer_t *trainer = NULL;
    status = 1;
    if (batch_make(&options, &batch)) goto done;
    if (trainer_make(&options, &config, &executor, &trainer)) {
        status = failed("cannot make the trainer");
        goto done;
    }
    if (options.save_initial) {
        uform_trainer_save_args_t save = {
            .trainer = trainer, .executor = executor, .path = options.save_initial};
        if (uform_trainer_save(&save) != UFORM_OK) {
            status = failed("cannot save the initial weights");
            goto done;
        }
        if (options.save_batch && batch_save(&batch, &options, &config)) goto done;
    }

    uform_trainer_step_stats_t stats = {0}, first = {0};
    uform_trainer_step_args_t step = {.trainer = trainer,
                                      .executor = executor,
                                      .modalities = batch.modalities,
                                      .contents = batch_contents(&batch),
                                      .relations = batch.relations,
                                      .relations_count = batch.relations_count,
                                      .stats = &stats};
    for (size_t i = 0; i < options.warmup; ++i) {
        if (uform_trainer_step(&step) != UFORM_OK) {
            status = failed("a warm-up step");
            goto done;
        }
        if (i == 0) first = stats;
    }
    host_share_t share = {0};
    uform_progress_t progress = {.handler = on_progress, .state = &share, .steps = 4};
    step.progress = &progress;
    uint64_t start = bench_now_ns();
    for (size_t i = 0; i < options.steps; ++i) {
        share.started = bench_now_ns(), share.prepared = 0;
        if (uform_trainer_step(&step) != UFORM_OK) {
            status = failed("a timed step");
            goto done;
        }
        share.total += (share.prepared ? share.prepared : bench_now_ns()) - share.started;
        if (i == 0 && !options.warmup) first = stats;
    }
    double const seconds = (double)(bench_now_ns() - start) / 1e9,
                 steps_per_second = (double)options.steps / seconds,
                 host = (double)share.total / 1e9 / seconds;
    if (options.json) {
        printf(
            "{\"engine\": \"%s\", \"host_share\": %.4f, \"depth\": %zu, \"hidden\": %zu, \"context\": %zu, "
            "\"towers\": \"%s\", \"image_size\": %zu, \"image_patch\": %zu, \"batch\": %zu, "
            "\"text_bytes\": %zu, "
            "\"threads\": %zu, \"warmup\": %zu, \"steps\": %zu, \"seconds\": %.6f, \"steps_per_second\": "
            "%.4f, "
            "\"items_per_second\": %.2f, \"tokens_per_second\": %.1f, \"tokens_per_step\": %zu, "
            "\"first_loss\": %.9g, \"first_contrastive\": %.9g, \"first_lm\": %.9g, "
            "\"last_loss\": %.9g, \"last_contrastive\": %.9g, \"last_lm\": %.9g, \"last_step\": %zu, "
            "\"learning_rate\": %.17g, \"weight_decay\": %.17g, \"beta1\": %.17g, \"beta2\": %.17g, "
            "\"epsilon\": %.17g, \"clip_norm\": %.17g, \"lm_weight\": %.17g, \"warmup_steps\": %zu, "
            "\"total_steps\": %zu}\n",
            options.device >= 0 ? "uform-vram-trainer" : "uform-ram-trainer", host, config.depth,
            config.hidden, config.context, options.images ? "text,image" : "text", config.image_size,
            config.image_patch, options.batch, options.text_bytes, options.threads, options.warmup,
            options.steps, seconds, steps_per_second, steps_per_second * (double)batch.count,
            steps_per_second * (double)batch.tokens, batch.tokens, first.loss, first.contrastive_loss,
            first.lm_loss, stats.loss, stats.contrastive_loss, stats.lm_loss, stats.step,
            config.learning_rate, config.weight_decay, config.beta1, config.beta2, config.epsilon,
            config.clip_norm, config.lm_weight, config.warmup_steps, config.total_steps);
    } else {
        printf("depth %zu, hidden %zu, context %zu, towers %s, batch %zu (%zu tokens), %zu threads\n",
               config.depth, config.hidden, config.context, options.images ? "text,image" : "text",
               options.batch, batch.tokens, options.threads);
        printf(
            "%zu steps in %.3f s: %.3f steps/s, %.1f items/s, %.0f tokens/s; %.1f%% of each step preparing "
            "its inputs on the host\n",
            options.steps, seconds, steps_per_second, steps_per_second * (double)batch.count,
            steps_per_second * (double)batch.tokens, 100 * host);
        printf("loss: step 1 %.6f (contrastive %.6f, lm %.6f), step %zu %.6f (contrastive %.6f, lm %.6f)\n",
               first.loss, first.contrastive_loss, first.lm_loss, stats.step, stats.loss,
               stats.contrastive_loss, stats.lm_loss);
    }
    status = 0;
done:
    uform_trainer_free(trainer);
    uform_executor_free(executor);
    batch_free(&batch);
    return status;
}
