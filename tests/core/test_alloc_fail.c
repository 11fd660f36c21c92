/* Allocation failure, injected under tests/core/alloc_fail_shim.c (LD_PRELOAD): for every stage below,
 * and for every n from 1 to the number of allocations the stage makes, the stage runs with its n-th
 * allocation failing. Each run must end with a correct result or a clean status, never a crash, a leak or
 * a hang:
 *   - the call answers UFORM_OK with results bitwise equal to a run without failure, or UFORM_OK with
 *     some items UFORM_OUT_OF_MEMORY and every other item equal, or UFORM_OUT_OF_MEMORY;
 *   - the same stage then runs again without failure and answers what it answered before (nothing the
 *     failure touched stays broken: the executor, the model, the arena, the trainer, the files);
 *   - every block allocated during the run is freed once its products are (the shim counts live blocks);
 *   - a run that outlasts a minute fails the test, naming the stage and n.
 * Where the failed allocation was FFmpeg's own (its stack's first frame outside the C library and
 * libavutil is in libavformat, libavcodec, libswscale or libswresample), FFmpeg may not report it
 * (uform.h, the video verbs): UFORM_FORMAT, a different result and blocks left behind are counted and
 * printed instead. Each stage prints how its failures ended.
 * Stages: creating a RAM executor and an arena; loading the checkpoint, read through the ring and mapped,
 * and with I8 weights; writing it again with I8 weights (uform_checkpoint_quantize);
 * encoding texts, pixels, PNG and JPEG images from memory and from files, clips, sounds and samples;
 * creating a trainer, a training step over every modality the build decodes, and a save over a previous
 * checkpoint (the previous pair or the new one on disk after a failed save, nothing else beside them);
 * where the build has tokenizers, a sentence-transformers folder (the folder reader's seed): loading it,
 * writing it as one checkpoint (uform_checkpoint_convert), and encoding texts with its tokenizer.
 *
 * Outside the count, named: the machine's topology, loaded by the first RAM executor before any stage
 * (hwloc's window), and every allocation libjansson or libhwloc makes itself (the shim's head says why).
 *
 * Usage: test_alloc_fail FOLDER CORPUS [STAGE...], under LD_PRELOAD of the shim; CORPUS is
 * tests/fuzz-corpus. Without the shim it fails; stages whose decoder or tokenizers the build lacks are
 * skipped, said so.
 * ALLOC_FAIL_BACKTRACE=1 prints the stack of every injected failure. */
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <dirent.h>

#include "uform.h"
#include "../../fuzz/pretrained_pack.h"
#include "../train/small_config.h"

/* ---- The shim's controls -------------------------------------------------------------------------- */

static void (*arm)(size_t n);
static size_t (*counted)(void);
static bool (*injected)(uintptr_t *caller);
static long (*live)(void);
static int (*alloc_fail_stack)(void *const **frames);

static bool shim_found(void) {
    arm = (void (*)(size_t))dlsym(RTLD_DEFAULT, "alloc_fail_arm");
    counted = (size_t(*)(void))dlsym(RTLD_DEFAULT, "alloc_fail_counted");
    injected = (bool (*)(uintptr_t *))dlsym(RTLD_DEFAULT, "alloc_fail_injected");
    live = (long (*)(void))dlsym(RTLD_DEFAULT, "alloc_fail_live");
    alloc_fail_stack = (int (*)(void *const **))dlsym(RTLD_DEFAULT, "alloc_fail_injected_stack");
    return arm && counted && injected && live && alloc_fail_stack;
}

/* ---- Failing the test ----------------------------------------------------------------------------- */

static char const *current_stage = "setup";
static volatile size_t current_n;
static uintptr_t current_caller; /* of the allocation that failed, in the last run that reached it */
static bool current_ffmpeg;      /* whether that allocation was FFmpeg's own */
static size_t ffmpeg_leaks;      /* runs of the stage where FFmpeg's own failure left blocks behind */

static _Noreturn void failf(char const *format, ...) __attribute__((format(printf, 1, 2)));
static _Noreturn void failf(char const *format, ...) {
    va_list arguments;
    va_start(arguments, format);
    fprintf(stderr, "test_alloc_fail: stage %s, allocation %zu failed: ", current_stage, current_n);
    vfprintf(stderr, format, arguments);
    va_end(arguments);
    uform_error_t const error = uform_last_error();
    char text[256];
    uform_error_render(&error, text, sizeof text);
    fprintf(stderr, " (last error: %s)", text);
    Dl_info where;
    if (current_caller && dladdr((void *)current_caller, &where) && where.dli_fname)
        fprintf(stderr, "; the failed allocation was called from %s+%#lx (%s)", where.dli_fname,
                (unsigned long)(current_caller - (uintptr_t)where.dli_fbase),
                where.dli_sname ? where.dli_sname : "?");
    fputc('\n', stderr);
    exit(1);
}

static void on_alarm(int signal_number) {
    (void)signal_number;
    static char const message[] = "test_alloc_fail: a run outlasted 60 s (a hang): see the stage above\n";
    ssize_t ignored = write(2, message, sizeof message - 1);
    (void)ignored;
    _exit(1);
}

#define CHECK(condition)                                                                                     \
    do {                                                                                                     \
        if (!(condition)) failf("%s:%d: %s", __FILE__, __LINE__, #condition);                                \
    } while (0)

/* ---- The world every stage runs in ------------------------------------------------------------------ */

typedef struct blob {
    uint8_t *data;
    size_t size;
} blob_t;

typedef struct world {
    char folder[512], checkpoint[600], saved[600], pretrained[600], sharded[600];
    char const *unpacking; /* the folder unpack_file writes into */
    uform_executor_t *executor;
    uform_arena_t *arena;
    uform_model_t *model;
    uform_model_info_t info;
    blob_t png, jpeg, clip, wav, previous_checkpoint, previous_state;
    uform_trainer_t *trainer; /* of the trainer stages */
} world_t;

static blob_t blob_read(char const *path) {
    FILE *file = fopen(path, "rb");
    if (!file) failf("cannot open %s: %s", path, strerror(errno));
    blob_t blob = {0};
    CHECK(fseek(file, 0, SEEK_END) == 0);
    long const size = ftell(file);
    CHECK(size >= 0 && fseek(file, 0, SEEK_SET) == 0);
    blob.size = (size_t)size;
    blob.data = malloc(blob.size ? blob.size : 1);
    CHECK(blob.data && fread(blob.data, 1, blob.size, file) == blob.size);
    fclose(file);
    return blob;
}

static void blob_write(char const *path, blob_t const *blob) {
    FILE *file = fopen(path, "wb");
    CHECK(file && fwrite(blob->data, 1, blob->size, file) == blob->size && fclose(file) == 0);
}

static bool blob_equals_file(blob_t const *blob, char const *path) {
    struct stat status;
    if (stat(path, &status) != 0 || (size_t)status.st_size != blob->size) return false;
    blob_t file = blob_read(path);
    bool const same = memcmp(file.data, blob->data, blob->size) == 0;
    free(file.data);
    return same;
}

/* A WAV of `seconds` of a 440 Hz tone, mono PCM16 at 16 kHz. */
static blob_t wav_tone(double seconds) {
    size_t const rate = 16000, samples = (size_t)(seconds * (double)rate), data = 2 * samples;
    blob_t blob = {malloc(44 + data), 44 + data};
    CHECK(blob.data);
    uint8_t *at = blob.data;
#define PUT(bytes, n) (memcpy(at, (bytes), (n)), at += (n))
#define PUT32(v)      PUT(&(uint32_t){(uint32_t)(v)}, 4)
#define PUT16(v)      PUT(&(uint16_t){(uint16_t)(v)}, 2)
    PUT("RIFF", 4), PUT32(36 + data), PUT("WAVEfmt ", 8), PUT32(16), PUT16(1), PUT16(1), PUT32(rate),
        PUT32(2 * rate), PUT16(2), PUT16(16), PUT("data", 4), PUT32(data);
    for (size_t i = 0; i < samples; ++i)
        PUT16((int16_t)(12000.0 * sin(2.0 * 3.14159265358979 * 440.0 * (double)i / (double)rate)));
#undef PUT16
#undef PUT32
#undef PUT
    return blob;
}

/* ---- Results: what a stage produced, to compare with its run without failure --------------------------- */

typedef struct result {
    uform_status_t status; /* the call's */
    size_t items;          /* 0 for calls without items */
    uform_status_t statuses[8];
    size_t row_bytes;       /* per item, of `rows` */
    uint8_t rows[8 * 4096]; /* each item's embedding row, F32 */
    double number;          /* a step's loss */
} result_t;

static void result_of_encode(result_t *result, uform_status_t status, uform_encoded_t const *encoded) {
    *result = (result_t){.status = status};
    if (status != UFORM_OK) return;
    CHECK(encoded->items <= 8);
    result->items = encoded->items;
    result->row_bytes = encoded->embeddings.columns * sizeof(float);
    CHECK(result->row_bytes <= 4096 && encoded->embeddings.scalar == UFORM_F32);
    for (size_t i = 0; i < encoded->items; ++i) {
        result->statuses[i] = encoded->statuses[i];
        void const *row = NULL;
        CHECK(uform_view_row(&encoded->embeddings, i, &row) == UFORM_OK);
        memcpy(result->rows + i * result->row_bytes, row, result->row_bytes);
    }
}

/* How a run under failure compares with the run without. */
typedef enum verdict {
    SAME,        /* the same result */
    FAILED,      /* the call answered UFORM_OUT_OF_MEMORY */
    ITEM_FAILED, /* some items answered UFORM_OUT_OF_MEMORY, the others the same */
    MISREPORTED, /* lenient only: FFmpeg's own allocation failed, and the item or call answered
                    UFORM_FORMAT, or came out different */
} verdict_t;

/* What a run under failure may answer, against the run without: see the head. `lenient` when the failed
 * allocation was FFmpeg's own (a demuxer's or a decoder's), which FFmpeg does not always report: a
 * demuxer may take it for a malformed file (UFORM_FORMAT) or go on without what it could not allocate (a
 * different result). Anything else fails the test. */
static verdict_t judge(result_t const *got, result_t const *expected, bool lenient) {
    CHECK(expected->status == UFORM_OK);
    if (got->status == UFORM_OUT_OF_MEMORY) return FAILED;
    if (lenient && got->status == UFORM_FORMAT) return MISREPORTED;
    if (got->status != UFORM_OK) failf("the call answered %s", uform_status_name(got->status));
    CHECK(got->items == expected->items && got->row_bytes == expected->row_bytes);
    verdict_t verdict = SAME;
    for (size_t i = 0; i < got->items; ++i) {
        if (got->statuses[i] == UFORM_OUT_OF_MEMORY && expected->statuses[i] == UFORM_OK) {
            if (verdict == SAME) verdict = ITEM_FAILED;
            continue;
        }
        bool const same =
            got->statuses[i] == expected->statuses[i] &&
            !memcmp(got->rows + i * got->row_bytes, expected->rows + i * got->row_bytes, got->row_bytes);
        if (same) continue;
        if (lenient) {
            verdict = MISREPORTED;
            continue;
        }
        if (got->statuses[i] != expected->statuses[i])
            failf("item %zu answered %s, %s without failure", i, uform_status_name(got->statuses[i]),
                  uform_status_name(expected->statuses[i]));
        failf("item %zu differs from its run without failure", i);
    }
    if (got->number != expected->number) {
        if (!lenient) failf("%.9g, %.9g without failure", got->number, expected->number);
        verdict = MISREPORTED;
    }
    return verdict;
}

/* Whether the allocation that failed was FFmpeg's own: the first frame of its stack outside the shim,
 * the C library and libavutil (whose av_malloc the engine calls too) is in another FFmpeg library. */
static bool ffmpeg_asked(void) {
    void *const *frames = NULL;
    int const depth = alloc_fail_stack(&frames);
    for (int i = 0; i < depth; ++i) {
        Dl_info where;
        if (!dladdr(frames[i], &where) || !where.dli_fname) return false;
        char const *name = where.dli_fname;
        if (strstr(name, "alloc_fail_shim") || strstr(name, "libc.so") || strstr(name, "libavutil.so"))
            continue;
        return strstr(name, "libavformat.so") || strstr(name, "libavcodec.so") ||
               strstr(name, "libswscale.so") || strstr(name, "libswresample.so");
    }
    return false;
}

/* ---- Stages ------------------------------------------------------------------------------------------ */

/* prepare (not counted), run (counted: the stage's own calls), then release (not counted: frees what
 * prepare and run made). */
typedef struct stage {
    char const *name;
    uint32_t needs; /* uform_feature_t bits */
    void (*prepare)(world_t *world);
    void (*run)(world_t *world, result_t *result);
    void (*release)(world_t *world);
} stage_t;

static void nothing(world_t *world) {
    (void)world;
}

static uform_executor_t *new_executor(uform_status_t *status) {
    uform_ram_options_t options = uform_ram_options_default();
    options.threads = 2;
    options.pin = false;
    uform_executor_t *executor = NULL;
    *status = uform_executor_create_ram(&options, &executor);
    return executor;
}

static uform_executor_t *stage_executor;
static void run_executor(world_t *world, result_t *result) {
    (void)world;
    uform_status_t status;
    stage_executor = new_executor(&status);
    *result = (result_t){.status = status};
}
static void release_executor(world_t *world) {
    (void)world;
    uform_executor_free(stage_executor);
    stage_executor = NULL;
}

static uform_arena_t *stage_arena;
static void run_arena(world_t *world, result_t *result) {
    *result = (result_t){.status = uform_arena_create(world->executor, &stage_arena)};
    if (result->status == UFORM_OK) result->status = uform_arena_reserve(stage_arena, 1 << 20);
}
static void release_arena(world_t *world) {
    (void)world;
    uform_arena_free(stage_arena);
    stage_arena = NULL;
}

/* A loaded model's result: its status, and its counts of parameters and bytes. */
static uform_model_t *stage_model;
static void load(world_t *world, result_t *result, char const *path, bool map, uform_weights_t weights) {
    uform_load_config_t config = {.map = map, .weights = weights};
    uform_model_load_args_t args = {.executor = world->executor, .path = path, .config = &config, .model = &stage_model};
    *result = (result_t){.status = uform_model_load_ram(&args)};
    if (result->status != UFORM_OK) return;
    uform_model_info_t info;
    CHECK(uform_model_info(stage_model, &info) == UFORM_OK);
    result->number = (double)info.parameters + (double)info.bytes;
}
static void run_load(world_t *world, result_t *result) {
    load(world, result, world->checkpoint, false, UFORM_WEIGHTS_STORED);
}
static void run_load_mapped(world_t *world, result_t *result) {
    load(world, result, world->checkpoint, true, UFORM_WEIGHTS_STORED);
}
static void run_load_i8(world_t *world, result_t *result) {
    load(world, result, world->checkpoint, false, UFORM_WEIGHTS_I8);
}

/* A writer's result: its status, and the size of the file it wrote at `output`, removed. */
static void written(result_t *result, uform_status_t status, char const *output) {
    *result = (result_t){.status = status};
    struct stat file;
    if (status == UFORM_OK && stat(output, &file) == 0) result->number = (double)file.st_size;
    unlink(output);
}

/* The checkpoint written again with I8 weights. */
static void run_quantize(world_t *world, result_t *result) {
    char output[700];
    snprintf(output, sizeof output, "%s/quantized.safetensors", world->folder);
    uform_checkpoint_quantize_args_t args = {.input = world->checkpoint, .output = output};
    written(result, uform_checkpoint_quantize(&args), output);
}
static void release_load(world_t *world) {
    (void)world;
    uform_model_free(stage_model);
    stage_model = NULL;
}

/* A sentence-transformers folder (the folder reader's seed, unpacked in main): loaded, and its model's
 * parameters and bytes; written as one checkpoint, and its size; and its texts encoded (their tokenizer's
 * cut, token vectors with their spans), on the model loaded outside the count.
 * tokenizer_file_out_of_memory_read_as_io: the tokenizer's file was read through stdio, whose stream
 * allocates; its failure answered UFORM_IO, and the folder stage failed at its 12th allocation. */
static void run_folder(world_t *world, result_t *result) {
    load(world, result, world->pretrained, false, UFORM_WEIGHTS_STORED);
}
/* The seed whose weights are in two shards with their index, and whose prompts are in
 * config_sentence_transformers.json. */
static void run_sharded_folder(world_t *world, result_t *result) {
    load(world, result, world->sharded, false, UFORM_WEIGHTS_STORED);
}
static void run_convert(world_t *world, result_t *result) {
    char output[700];
    snprintf(output, sizeof output, "%s/converted.safetensors", world->folder);
    uform_checkpoint_convert_args_t args = {.input = world->pretrained, .output = output};
    written(result, uform_checkpoint_convert(&args), output);
}
static void prepare_folder_text(world_t *world) {
    uform_model_load_args_t args = {
        .executor = world->executor, .path = world->pretrained, .model = &stage_model};
    CHECK(uform_model_load_ram(&args) == UFORM_OK);
}
static void run_folder_text(world_t *world, result_t *result) {
    static char const words[] = "a cat sits on the mat\xff\xfe  the mat ";
    static size_t const offsets[] = {0, 21, 23, sizeof words - 1};
    uform_encoded_t encoded;
    uform_text_encode_args_t args = {.model = stage_model,
                                     .executor = world->executor,
                                     .arena = world->arena,
                                     .encoded = &encoded,
                                     .outputs = UFORM_OUTPUT_EMBEDDINGS | UFORM_OUTPUT_TOKEN_VECTORS,
                                     .texts = {words, offsets, 3, sizeof words - 1}};
    result_of_encode(result, uform_text_encode(&args), &encoded);
}

static void unpack_file(size_t index, uint8_t const *bytes, size_t length, void *context) {
    world_t const *world = context;
    char path[900];
    snprintf(path, sizeof path, "%s/%s", world->unpacking, PRETRAINED_PACK_FILES[index]);
    blob_t const blob = {.data = (uint8_t *)bytes, .size = length};
    blob_write(path, &blob);
}

static char const texts[] = "a red circlean image of the seaunicode: naïve café";
static size_t const text_offsets[] = {0, 12, 31, sizeof texts - 1};

static void run_text(world_t *world, result_t *result) {
    uform_encoded_t encoded;
    uform_text_encode_args_t args = {.model = world->model,
                                     .executor = world->executor,
                                     .arena = world->arena,
                                     .encoded = &encoded,
                                     .outputs = UFORM_OUTPUT_EMBEDDINGS | UFORM_OUTPUT_TOKEN_VECTORS |
                                                UFORM_OUTPUT_STATES,
                                     .texts = {texts, text_offsets, 3, sizeof texts - 1}};
    result_of_encode(result, uform_text_encode(&args), &encoded);
}

static void run_pixels(world_t *world, result_t *result) {
    static uint8_t pixels[2 * 40 * 48 * 3];
    for (size_t i = 0; i < sizeof pixels; ++i)
        pixels[i] = (uint8_t)(i * 7 + i / 97);
    size_t const offsets[] = {0, 40 * 48 * 3, 2 * 40 * 48 * 3}, heights[] = {40, 48}, widths[] = {48, 40};
    uform_encoded_t encoded;
    uform_image_encode_pixels_args_t args = {.model = world->model,
                                             .executor = world->executor,
                                             .arena = world->arena,
                                             .encoded = &encoded,
                                             .outputs = UFORM_OUTPUT_EMBEDDINGS | UFORM_OUTPUT_TOKEN_VECTORS,
                                             .pixels = {pixels, offsets, 2, sizeof pixels},
                                             .heights = heights,
                                             .widths = widths};
    result_of_encode(result, uform_image_encode_pixels(&args), &encoded);
}

/* Two encoded items in memory, one after the other on a tape. */
typedef struct pair {
    uint8_t *data;
    size_t offsets[3];
} pair_t;

static pair_t pair_of(blob_t const *a, blob_t const *b) {
    pair_t pair = {malloc(a->size + b->size), {0, a->size, a->size + b->size}};
    CHECK(pair.data);
    memcpy(pair.data, a->data, a->size);
    memcpy(pair.data + a->size, b->data, b->size);
    return pair;
}

/* The pair a media stage encodes, and how: its verb (image, video or audio), where the tape's items come
 * from, and the outputs asked for. */
static struct staged {
    pair_t pair;
    uform_modality_t modality;
    uform_source_t source;
    uform_outputs_t outputs;
} staged;

static void stage_pair(pair_t pair, uform_modality_t modality, uform_source_t source,
                       uform_outputs_t outputs) {
    staged = (struct staged){pair, modality, source, outputs};
}
static void release_pair(world_t *world) {
    (void)world;
    free(staged.pair.data);
    staged.pair.data = NULL;
}

static void prepare_images(world_t *world) {
    stage_pair(pair_of(&world->png, &world->jpeg), UFORM_MODALITY_IMAGE, UFORM_SOURCE_MEMORY,
               UFORM_OUTPUT_EMBEDDINGS | UFORM_OUTPUT_TOKEN_VECTORS);
}

/* The same two images from files, read through the executor's ring. */
static void prepare_image_files(world_t *world) {
    char png[700], jpeg[700];
    snprintf(png, sizeof png, "%s/image.png", world->folder);
    snprintf(jpeg, sizeof jpeg, "%s/image.jpg", world->folder);
    blob_t paths[2] = {{(uint8_t *)png, strlen(png)}, {(uint8_t *)jpeg, strlen(jpeg)}};
    stage_pair(pair_of(&paths[0], &paths[1]), UFORM_MODALITY_IMAGE, UFORM_SOURCE_FILES,
               UFORM_OUTPUT_EMBEDDINGS);
}

static void prepare_video(world_t *world) {
    stage_pair(pair_of(&world->clip, &world->clip), UFORM_MODALITY_VIDEO, UFORM_SOURCE_MEMORY,
               UFORM_OUTPUT_EMBEDDINGS | UFORM_OUTPUT_TOKEN_VECTORS);
}

static void prepare_audio(world_t *world) {
    stage_pair(pair_of(&world->wav, &world->wav), UFORM_MODALITY_AUDIO, UFORM_SOURCE_MEMORY,
               UFORM_OUTPUT_EMBEDDINGS | UFORM_OUTPUT_TOKEN_VECTORS);
}

/* The arguments the image, video and audio verbs share (their structures differ only in the tape's name),
 * for the staged pair on `world`'s receiver into `encoded`. */
#define STAGED_ARGS                                                                                          \
    .model = world->model, .executor = world->executor, .arena = world->arena, .encoded = &encoded,          \
    .outputs = staged.outputs, .source = staged.source

/* The staged pair through its verb. */
static void run_staged(world_t *world, result_t *result) {
    uform_encoded_t encoded;
    uform_tape_t const tape = {staged.pair.data, staged.pair.offsets, 2, staged.pair.offsets[2]};
    uform_image_encode_args_t const images = {STAGED_ARGS, .images = tape};
    uform_video_encode_args_t const videos = {STAGED_ARGS, .videos = tape};
    uform_audio_encode_args_t const sounds = {STAGED_ARGS, .sounds = tape};
    uform_status_t const status = staged.modality == UFORM_MODALITY_IMAGE   ? uform_image_encode(&images)
                                  : staged.modality == UFORM_MODALITY_VIDEO ? uform_video_encode(&videos)
                                                                            : uform_audio_encode(&sounds);
    result_of_encode(result, status, &encoded);
}

static void run_samples(world_t *world, result_t *result) {
    static float samples[2 * 22050];
    for (size_t i = 0; i < 2 * 22050; ++i)
        samples[i] = (float)(0.3 * sin((double)i * (i < 22050 ? 0.07 : 0.19)));
    size_t const offsets[] = {0, 22050, 2 * 22050};
    uform_encoded_t encoded;
    uform_audio_encode_samples_args_t args = {.model = world->model,
                                              .executor = world->executor,
                                              .arena = world->arena,
                                              .encoded = &encoded,
                                              .outputs = UFORM_OUTPUT_EMBEDDINGS,
                                              .samples = {samples, offsets, 2, 2 * 22050},
                                              .rate = 22050};
    result_of_encode(result, uform_audio_encode_samples(&args), &encoded);
}

/* The trainers' suites' small model over the default context (64 bytes), with a second of audio. */
static void trainer_config(uform_trainer_config_t *config) {
    *config = small_config_of(32, 64);
    config->audio_seconds = 1.0;
    config->warmup_steps = 1;
    config->total_steps = 10;
}

static uform_status_t new_trainer(world_t *world, uform_trainer_t **trainer) {
    uform_trainer_config_t config;
    trainer_config(&config);
    uform_trainer_init_args_t args = {.executor = world->executor, .config = &config, .trainer = trainer};
    return uform_trainer_init_ram(&args);
}

static void run_trainer(world_t *world, result_t *result) {
    *result = (result_t){.status = new_trainer(world, &world->trainer)};
}
static void release_trainer(world_t *world) {
    uform_trainer_free(world->trainer);
    world->trainer = NULL;
}

/* The training batch: two texts, and the image, the clip and the sound the build can decode, the first
 * text related to the image, the second to the clip and the sound (without media, to each other). */
typedef struct training_batch {
    uint8_t *bytes;
    size_t offsets[6];
    uform_modality_t modalities[5];
    uint32_t relations[6];
    size_t items, relations_count;
} training_batch_t;

static training_batch_t batch;

static void batch_add(uform_modality_t modality, void const *data, size_t size) {
    size_t const at = batch.offsets[batch.items];
    uint8_t *grown = realloc(batch.bytes, at + size);
    CHECK(grown);
    batch.bytes = grown;
    memcpy(batch.bytes + at, data, size);
    batch.modalities[batch.items++] = modality;
    batch.offsets[batch.items] = at + size;
}

static void batch_relate(uint32_t a, uint32_t b) {
    batch.relations[2 * batch.relations_count] = a;
    batch.relations[2 * batch.relations_count++ + 1] = b;
}

static void batch_make(world_t const *world, uint32_t features) {
    batch_add(UFORM_MODALITY_TEXT, texts, 12);
    batch_add(UFORM_MODALITY_TEXT, texts + 12, 19);
    if (features & UFORM_FEATURE_SPNG) {
        batch_add(UFORM_MODALITY_IMAGE, world->png.data, world->png.size);
        batch_relate(0, (uint32_t)batch.items - 1);
    }
    if (features & UFORM_FEATURE_FFMPEG) {
        batch_add(UFORM_MODALITY_VIDEO, world->clip.data, world->clip.size);
        batch_relate(1, (uint32_t)batch.items - 1);
        batch_add(UFORM_MODALITY_AUDIO, world->wav.data, world->wav.size);
        batch_relate(1, (uint32_t)batch.items - 1);
    }
    if (batch.relations_count == 0) batch_relate(0, 1);
}

static uform_status_t step(world_t *world, double *loss) {
    uform_trainer_step_stats_t stats = {0};
    uform_trainer_step_args_t args = {
        .trainer = world->trainer,
        .executor = world->executor,
        .modalities = batch.modalities,
        .contents = {batch.bytes, batch.offsets, batch.items, batch.offsets[batch.items]},
        .relations = batch.relations,
        .relations_count = batch.relations_count,
        .stats = &stats};
    uform_status_t const status = uform_trainer_step(&args);
    *loss = stats.loss;
    return status;
}

static void prepare_step(world_t *world) {
    if (new_trainer(world, &world->trainer) != UFORM_OK) failf("no trainer to step");
}
static void run_step(world_t *world, result_t *result) {
    double loss = 0;
    *result = (result_t){.status = step(world, &loss)};
    if (result->status == UFORM_OK) result->number = loss;
}

static uform_status_t save(world_t *world) {
    uform_trainer_save_args_t args = {
        .trainer = world->trainer, .executor = world->executor, .path = world->saved};
    return uform_trainer_save(&args);
}

/* The previous pair on disk, the trainer one step further; after the run, the pair on disk. */
static void prepare_save(world_t *world) {
    char state[700];
    snprintf(state, sizeof state, "%s.optimizer", world->saved);
    blob_write(world->saved, &world->previous_checkpoint);
    blob_write(state, &world->previous_state);
    prepare_step(world);
    double loss;
    if (step(world, &loss) != UFORM_OK) failf("the step before the save failed");
}
static void run_save(world_t *world, result_t *result) {
    *result = (result_t){.status = save(world)};
}

/* The pair a save writes, read after the stage's run without failure; then every run must leave the
 * previous pair or that one, and nothing else in the folder. */
static blob_t saved_new_checkpoint, saved_new_state;
static void release_save(world_t *world) {
    char state[700];
    snprintf(state, sizeof state, "%s.optimizer", world->saved);
    bool const previous = blob_equals_file(&world->previous_checkpoint, world->saved) &&
                          blob_equals_file(&world->previous_state, state);
    bool const next = saved_new_checkpoint.data && blob_equals_file(&saved_new_checkpoint, world->saved) &&
                      blob_equals_file(&saved_new_state, state);
    if (!previous && !next && saved_new_checkpoint.data)
        failf("the files on disk are neither the previous pair nor the new one");
    char folder[600];
    snprintf(folder, sizeof folder, "%s/saves", world->folder);
    DIR *directory = opendir(folder);
    CHECK(directory);
    size_t files = 0;
    for (struct dirent *entry; (entry = readdir(directory));)
        if (entry->d_name[0] != '.') ++files;
    closedir(directory);
    if (files != 2) failf("%zu files beside the saved pair's folder, 2 expected", files);
    release_trainer(world);
}

static stage_t const stages[] = {
    {"executor", 0, nothing, run_executor, release_executor},
    {"arena", 0, nothing, run_arena, release_arena},
    {"load", 0, nothing, run_load, release_load},
    {"load-mapped", 0, nothing, run_load_mapped, release_load},
    {"load-i8", 0, nothing, run_load_i8, release_load},
    {"quantize", 0, nothing, run_quantize, nothing},
    {"text", 0, nothing, run_text, nothing},
    {"pixels", 0, nothing, run_pixels, nothing},
    {"images", UFORM_FEATURE_SPNG | UFORM_FEATURE_JPEG, prepare_images, run_staged, release_pair},
    {"image-files", UFORM_FEATURE_SPNG | UFORM_FEATURE_JPEG, prepare_image_files, run_staged, release_pair},
    {"video", UFORM_FEATURE_FFMPEG, prepare_video, run_staged, release_pair},
    {"audio", UFORM_FEATURE_FFMPEG, prepare_audio, run_staged, release_pair},
    {"samples", UFORM_FEATURE_FFMPEG, nothing, run_samples, nothing},
    {"trainer", 0, nothing, run_trainer, release_trainer},
    {"step", 0, prepare_step, run_step, release_trainer},
    {"save", 0, prepare_save, run_save, release_save},
    {"folder", UFORM_FEATURE_TOKENIZERS, nothing, run_folder, release_load},
    {"sharded-folder", UFORM_FEATURE_TOKENIZERS, nothing, run_sharded_folder, release_load},
    {"convert", UFORM_FEATURE_TOKENIZERS, nothing, run_convert, nothing},
    {"folder-text", UFORM_FEATURE_TOKENIZERS, prepare_folder_text, run_folder_text, release_load},
};

/* ---- The sweep --------------------------------------------------------------------------------------- */

/* One run of `stage` with allocation n failing (0: none): its result, the allocations it counted, and
 * whether the failure was injected. Checks that every block the run allocated is freed by its release,
 * unless `warming`: the stage's first run may keep what stays for the process. */
static void run_once(world_t *world, stage_t const *stage, size_t n, result_t *result, size_t *allocations,
                     bool *hit, bool warming) {
    current_n = n;
    long const before = live();
    stage->prepare(world);
    alarm(60);
    arm(n);
    stage->run(world, result);
    *allocations = counted();
    current_caller = 0;
    *hit = injected(&current_caller);
    current_ffmpeg = *hit && ffmpeg_asked();
    arm(0);
    alarm(0);
    stage->release(world);
    long const after = live();
    if (warming || after == before) return;
    if (!current_ffmpeg) failf("%ld blocks allocated and not freed", after - before);
    ++ffmpeg_leaks; /* FFmpeg's own failure path (libswresample's buffer growth keeps the old buffer) */
}

/* Every n for one stage; exits with the failure. */
static void sweep(world_t *world, stage_t const *stage) {
    current_stage = stage->name;
    static result_t expected, got, again;
    size_t total = 0, allocations;
    bool hit;
    /* Twice without failure: the first may fill what stays for the process (FFmpeg's tables, the
     * arena's blocks); the second is the count and the result to compare with. */
    run_once(world, stage, 0, &expected, &allocations, &hit, true);
    if (expected.status != UFORM_OK)
        failf("the stage answered %s without failure", uform_status_name(expected.status));
    run_once(world, stage, 0, &expected, &total, &hit, false);
    if (stage->release == release_save) {
        saved_new_checkpoint = blob_read(world->saved);
        char state[700];
        snprintf(state, sizeof state, "%s.optimizer", world->saved);
        saved_new_state = blob_read(state);
    }
    size_t verdicts[4] = {0}, reached = 0;
    ffmpeg_leaks = 0;
    for (size_t n = 1; n <= total; ++n) {
        run_once(world, stage, n, &got, &allocations, &hit, false);
        if (!hit) { /* this run made fewer allocations than the count: it must be the run without failure */
            if (judge(&got, &expected, false) != SAME) failf("the stage answered otherwise, nothing failed");
            continue;
        }
        ++reached;
        ++verdicts[judge(&got, &expected, current_ffmpeg)];
        run_once(world, stage, 0, &again, &allocations, &hit, false);
        if (judge(&again, &expected, false) != SAME) failf("after the failure, the stage answered otherwise");
    }
    printf("%-12s %5zu allocations, %5zu failed: the call out_of_memory %5zu, an item %4zu, absorbed %4zu, "
           "FFmpeg's own misreported %3zu, leaked by FFmpeg %zu\n",
           stage->name, total, reached, verdicts[FAILED], verdicts[ITEM_FAILED], verdicts[SAME],
           verdicts[MISREPORTED], ffmpeg_leaks);
    fflush(stdout);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: test_alloc_fail FOLDER CORPUS [STAGE...]\n");
        return 2;
    }
    if (!shim_found()) {
        fprintf(stderr,
                "test_alloc_fail: the allocator shim is not loaded (LD_PRELOAD=alloc_fail_shim.so)\n");
        return 1;
    }
    signal(SIGALRM, on_alarm);
    static world_t world;
    snprintf(world.folder, sizeof world.folder, "%s", argv[1]);
    mkdir(world.folder, 0755);
    snprintf(world.checkpoint, sizeof world.checkpoint, "%s/tiny.safetensors", world.folder);
    char saves[560];
    snprintf(saves, sizeof saves, "%s/saves", world.folder);
    mkdir(saves, 0755);
    snprintf(world.saved, sizeof world.saved, "%s/model.safetensors", saves);
    uform_tiny_checkpoint_args_t tiny = {.path = world.checkpoint, .seed = 5, .depth = 1, .hidden = 64};
    CHECK(uform_tiny_checkpoint(&tiny) == UFORM_OK);

    uint32_t const features = uform_features();
    char path[1024];
    if (features & UFORM_FEATURE_SPNG) {
        snprintf(path, sizeof path, "%s/image_decode/rgb.png", argv[2]);
        world.png = blob_read(path);
        snprintf(path, sizeof path, "%s/image.png", world.folder);
        blob_write(path, &world.png);
    }
    if (features & UFORM_FEATURE_JPEG) {
        snprintf(path, sizeof path, "%s/image_decode/q80-420.jpg", argv[2]);
        world.jpeg = blob_read(path);
        snprintf(path, sizeof path, "%s/image.jpg", world.folder);
        blob_write(path, &world.jpeg);
    }
    if (features & UFORM_FEATURE_FFMPEG) {
        snprintf(path, sizeof path, "%s/video_decode/mpeg4.mp4", argv[2]);
        world.clip = blob_read(path);
    }
    world.wav = wav_tone(0.5);
    if (features & UFORM_FEATURE_TOKENIZERS) {
        char const *const seeds[] = {"sentence-transformers-mean", "sentence-transformers-sharded-prompts"};
        char *const folders[] = {world.pretrained, world.sharded};
        for (size_t i = 0; i < 2; ++i) {
            snprintf(folders[i], sizeof world.pretrained, "%s/%s", world.folder, seeds[i]);
            snprintf(path, sizeof path, "%s/1_Pooling", folders[i]);
            mkdir(folders[i], 0755);
            mkdir(path, 0755);
            snprintf(path, sizeof path, "%s/pretrained/%s.bin", argv[2], seeds[i]);
            blob_t pack = blob_read(path);
            world.unpacking = folders[i];
            pretrained_pack_each(pack.data, pack.size, unpack_file, &world);
            free(pack.data);
        }
    }

    /* hwloc's window: the first RAM executor loads the topology, outside every count. */
    uform_status_t status;
    world.executor = new_executor(&status);
    CHECK(status == UFORM_OK);
    CHECK(uform_arena_create(world.executor, &world.arena) == UFORM_OK);
    uform_model_load_args_t load_args = {
        .executor = world.executor, .path = world.checkpoint, .model = &world.model};
    CHECK(uform_model_load_ram(&load_args) == UFORM_OK);
    CHECK(uform_model_info(world.model, &world.info) == UFORM_OK);

    batch_make(&world, features);
    { /* the pair a save replaces */
        prepare_step(&world);
        CHECK(save(&world) == UFORM_OK);
        world.previous_checkpoint = blob_read(world.saved);
        snprintf(path, sizeof path, "%s.optimizer", world.saved);
        world.previous_state = blob_read(path);
        release_trainer(&world);
    }

    for (size_t i = 0; i < sizeof stages / sizeof stages[0]; ++i) {
        stage_t const *stage = &stages[i];
        bool chosen = argc == 3;
        for (int j = 3; j < argc; ++j)
            chosen |= strcmp(argv[j], stage->name) == 0;
        if (!chosen) continue;
        if ((features & stage->needs) != stage->needs) {
            printf("%-12s skipped: this build lacks its decoders or tokenizers\n", stage->name);
            continue;
        }
        sweep(&world, stage);
    }
    uform_model_free(world.model);
    uform_arena_free(world.arena);
    uform_executor_free(world.executor);
    free(world.png.data), free(world.jpeg.data), free(world.clip.data), free(world.wav.data);
    free(world.previous_checkpoint.data), free(world.previous_state.data);
    free(saved_new_checkpoint.data), free(saved_new_state.data), free(batch.bytes);
    return 0;
}
