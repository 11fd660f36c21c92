/* The trainer's parameters (src/train/train_params.c): the model a config describes and every refusal, the
 * seeded start, names and shapes against uform_tiny_checkpoint's, AdamW against a reference computed in
 * double, the same bits whatever the thread split, save and load (bit-exact, and resumed runs equal to
 * uninterrupted ones), states that belong to another checkpoint, missing files, and saves killed at
 * random moments. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "checkpoint.h"
#include "fixtures.h"
#include "small_config.h"
#include "train.h"

/* ---------------------------------------------------------------------------------------------- */
/* A fault in the k-th file system call                                                           */
/* ---------------------------------------------------------------------------------------------- */

/* The test binary is linked with --wrap for each call below (tests/meson.build): while
 * filesystem_fail_at is k > 0, the k-th such call made by this thread fails, a write with ENOSPC and the
 * others with EIO; a close closes first. filesystem_calls counts them. */
static _Thread_local size_t filesystem_calls, filesystem_fail_at;

static bool filesystem_fails(int error) {
    if (!filesystem_fail_at || ++filesystem_calls != filesystem_fail_at) return false;
    errno = error;
    return true;
}

int __real_open64(char const *path, int flags, ...);
int __real_mkostemp64(char *pattern, int flags);
int __real_fchmod(int fd, mode_t mode);
ssize_t __real_write(int fd, void const *data, size_t size);
int __real_fsync(int fd);
int __real_close(int fd);
int __real_rename(char const *from, char const *to);
int __real_unlink(char const *path);
DIR *__real_opendir(char const *path);

int __wrap_open64(char const *path, int flags, ...);
int __wrap_open64(char const *path, int flags, ...) {
    va_list arguments;
    va_start(arguments, flags);
    mode_t const mode = (flags & O_CREAT) ? (mode_t)va_arg(arguments, int) : 0;
    va_end(arguments);
    return filesystem_fails(EIO) ? -1 : __real_open64(path, flags, mode);
}

int __wrap_mkostemp64(char *pattern, int flags);
int __wrap_mkostemp64(char *pattern, int flags) {
    return filesystem_fails(ENOSPC) ? -1 : __real_mkostemp64(pattern, flags);
}

int __wrap_fchmod(int fd, mode_t mode);
int __wrap_fchmod(int fd, mode_t mode) {
    return filesystem_fails(EIO) ? -1 : __real_fchmod(fd, mode);
}

ssize_t __wrap_write(int fd, void const *data, size_t size);
ssize_t __wrap_write(int fd, void const *data, size_t size) {
    return filesystem_fails(ENOSPC) ? -1 : __real_write(fd, data, size);
}

int __wrap_fsync(int fd);
int __wrap_fsync(int fd) {
    return filesystem_fails(EIO) ? -1 : __real_fsync(fd);
}

int __wrap_close(int fd);
int __wrap_close(int fd) {
    int const closed = __real_close(fd);
    return filesystem_fails(EIO) ? -1 : closed;
}

int __wrap_rename(char const *from, char const *to);
int __wrap_rename(char const *from, char const *to) {
    return filesystem_fails(EIO) ? -1 : __real_rename(from, to);
}

int __wrap_unlink(char const *path);
int __wrap_unlink(char const *path) {
    return filesystem_fails(EIO) ? -1 : __real_unlink(path);
}

DIR *__wrap_opendir(char const *path);
DIR *__wrap_opendir(char const *path) {
    return filesystem_fails(EIO) ? NULL : __real_opendir(path);
}

/* ---------------------------------------------------------------------------------------------- */
/* Helpers                                                                                        */
/* ---------------------------------------------------------------------------------------------- */

/* Where a failed save or load writes its reason (the tests run one at a time). */
static char reason[UFORM_ERROR_MESSAGE_SIZE];

/* A small model: every tower, depth 1, hidden 64, dims 16, short audio. */
static uform_trainer_config_t small_config(void) {
    uform_trainer_config_t config = small_config_of(16, 16);
    config.audio_seconds = 0.5;
    return config;
}

static void small_params(train_params_t *params, uint64_t seed) {
    uform_trainer_config_t const config = small_config();
    uform_model_info_t info;
    char const *message = NULL;
    assert_int_equal(train_info_from_config(&config, &info, &message), UFORM_OK);
    assert_int_equal(train_params_init(params, &info, seed), UFORM_OK);
    params->optimizer = (train_optimizer_t){
        .learning_rate = 3e-3,
        .weight_decay = 0.05,
        .beta1 = 0.9,
        .beta2 = 0.95,
        .epsilon = 1e-8,
        .clip_norm = 0.5,
        .warmup_steps = 3,
        .total_steps = 12,
    };
}

/* Gradients that depend on the step and on the current values, as real ones do. */
static void synthetic_grads(train_params_t *params) {
    for (size_t t = 0; t < params->count; t++) {
        train_tensor_t *tensor = &params->tensors[t];
        for (size_t i = 0; i < tensor->count; i++)
            tensor->grad[i] = (float)(0.01 * sin(0.37 * (double)i + 1.3 * (double)t + (double)params->step) +
                                      0.1 * tensor->value[i]);
    }
}

static void steps(train_params_t *params, uform_executor_t *executor, size_t count) {
    for (size_t s = 0; s < count; s++) {
        synthetic_grads(params);
        double rate = -1;
        double const norm = train_params_update(params, executor, &rate);
        assert_true(norm > 0 && isfinite(norm));
        assert_true(rate == train_learning_rate(&params->optimizer, params->step));
    }
}

/* Values, moments, step and settings bitwise equal; with `moments` false, values only. */
static void assert_same_params(train_params_t const *a, train_params_t const *b, bool moments) {
    assert_int_equal(a->count, b->count);
    for (size_t t = 0; t < a->count; t++) {
        train_tensor_t const *x = &a->tensors[t], *y = &b->tensors[t];
        assert_string_equal(x->name, y->name);
        assert_int_equal(x->count, y->count);
        if (memcmp(x->value, y->value, x->count * sizeof(float)) != 0) fail_msg("%s: values differ", x->name);
        if (!moments) continue;
        if (memcmp(x->m, y->m, x->count * sizeof(float)) != 0) fail_msg("%s: m differs", x->name);
        if (memcmp(x->v, y->v, x->count * sizeof(float)) != 0) fail_msg("%s: v differs", x->name);
    }
    if (!moments) return;
    assert_int_equal(a->step, b->step);
    assert_memory_equal(&a->optimizer, &b->optimizer, sizeof a->optimizer);
}

static void assert_transformer_equal(uform_transformer_info_t const *a, uform_transformer_info_t const *b) {
    assert_int_equal(a->depth, b->depth);
    assert_int_equal(a->hidden, b->hidden);
    assert_int_equal(a->heads, b->heads);
    assert_int_equal(a->mlp, b->mlp);
}

/* Every field; parameters and bytes only when `counts`. */
static void assert_info_equal(uform_model_info_t const *a, uform_model_info_t const *b, bool counts) {
    assert_int_equal(a->dims, b->dims);
    assert_int_equal(a->matryoshka_count, b->matryoshka_count);
    for (size_t i = 0; i < a->matryoshka_count; i++)
        assert_int_equal(a->matryoshka[i], b->matryoshka[i]);
    if (counts) {
        assert_int_equal(a->parameters, b->parameters);
        assert_int_equal(a->bytes, b->bytes);
    }
    assert_int_equal(a->has_text, b->has_text);
    assert_int_equal(a->has_image, b->has_image);
    assert_int_equal(a->has_video, b->has_video);
    assert_int_equal(a->has_audio, b->has_audio);
    assert_int_equal(a->has_logit, b->has_logit);
    assert_transformer_equal(&a->text.transformer, &b->text.transformer);
    assert_int_equal(a->text.context, b->text.context);
    assert_transformer_equal(&a->image.transformer, &b->image.transformer);
    assert_int_equal(a->image.size, b->image.size);
    assert_int_equal(a->image.patch, b->image.patch);
    assert_memory_equal(a->image.mean, b->image.mean, sizeof a->image.mean);
    assert_memory_equal(a->image.std, b->image.std, sizeof a->image.std);
    assert_int_equal(a->video.frames, b->video.frames);
    assert_transformer_equal(&a->audio.transformer, &b->audio.transformer);
    assert_int_equal(a->audio.rate, b->audio.rate);
    assert_int_equal(a->audio.mels, b->audio.mels);
    assert_int_equal(a->audio.window, b->audio.window);
    assert_int_equal(a->audio.hop, b->audio.hop);
    assert_int_equal(a->audio.patch_frames, b->audio.patch_frames);
    assert_int_equal(a->audio.max_patches, b->audio.max_patches);
    assert_true(a->audio.seconds == b->audio.seconds);
}

/* Prefix and header of a file, as a loader reads them. */
static void parse_header(char const *path, checkpoint_header_t *header, blob_t *blob) {
    *blob = blob_read(path);
    uint64_t length = 0;
    char const *message = NULL;
    if (checkpoint_prefix(blob->data, blob->size, blob->size, &length, &message) != UFORM_OK ||
        checkpoint_parse((char const *)blob->data + 8, (size_t)length, blob->size, header, &message) !=
            UFORM_OK)
        fail_msg("%s: %s", path, message);
}

/* `__metadata__["uform"]` of a safetensors file, malloc'ed. */
static char *metadata_of(char const *path) {
    blob_t blob = blob_read(path);
    uint64_t length = 0;
    for (size_t i = 0; i < 8; i++)
        length |= (uint64_t)blob.data[i] << (8 * i);
    json_t *root = json_loadb((char const *)blob.data + 8, (size_t)length, 0, NULL);
    assert_non_null(root);
    json_t *text = json_object_get(json_object_get(root, "__metadata__"), "uform");
    assert_true(json_is_string(text));
    char *copy = strdup(json_string_value(text));
    json_decref(root);
    free(blob.data);
    return copy;
}

static bool file_exists(char const *path) {
    struct stat status;
    return stat(path, &status) == 0;
}

static void state_path(char const *path, char *out, size_t capacity) {
    assert_true(train_state_path(path, out, capacity));
}

/* What a save test works on: its checkpoint `name` in the suite's folder, the optimizer state's path beside
 * it, and the small model's parameters of `seed` to save there. The test's cmocka setup makes them from the
 * name and seed its entry of the table gives (SAVING_TEST); its teardown frees the parameters. */
typedef struct saving {
    char const *name;
    uint64_t seed;
    char path[512], optimizer[600];
    train_params_t params;
} saving_t;

static int saving_setup(void **state) {
    saving_t *saving = *state;
    fixture_path(saving->name, saving->path, sizeof saving->path);
    state_path(saving->path, saving->optimizer, sizeof saving->optimizer);
    small_params(&saving->params, saving->seed);
    return 0;
}

static int saving_teardown(void **state) {
    saving_t *saving = *state;
    train_params_free(&saving->params);
    return 0;
}

/* The entry of `test_` in a table: a saving_t of the file `name_` and the seed `seed_` as its state. */
#define SAVING_TEST(test_, name_, seed_)                                                                     \
    cmocka_unit_test_prestate_setup_teardown(test_, saving_setup, saving_teardown,                           \
                                             (&(saving_t){.name = (name_), .seed = (seed_)}))

/* A caller's pool of three "threads" run one after another, last first. */
static size_t reversed_count(void *pool) {
    (void)pool;
    return 3;
}

static void reversed_for_threads(void *pool, void (*work)(void *context, size_t thread), void *context) {
    (void)pool;
    for (size_t thread = 3; thread-- > 0;)
        work(context, thread);
}

static uform_pool_vtable_t const reversed_pool = {reversed_count, reversed_for_threads};

/* ---------------------------------------------------------------------------------------------- */
/* The config                                                                                     */
/* ---------------------------------------------------------------------------------------------- */

static void test_config_default(void **state) {
    (void)state;
    uform_trainer_config_t config;
    memset(&config, 0xff, sizeof config);
    uform_trainer_config_default(&config);
    assert_int_equal(config.depth, 2);
    assert_int_equal(config.hidden, 128);
    assert_int_equal(config.dims, 64);
    assert_int_equal(config.towers, 0xf);
    assert_int_equal(config.context, 64);
    assert_int_equal(config.image_size, 32);
    assert_int_equal(config.image_patch, 8);
    assert_int_equal(config.video_frames, 4);
    assert_int_equal(config.audio_rate, 16000);
    assert_int_equal(config.audio_mels, 32);
    assert_true(config.audio_seconds == 2);
    assert_true(config.learning_rate == 1e-3 && config.weight_decay == 0.01);
    assert_true(config.beta1 == 0.9 && config.beta2 == 0.999 && config.epsilon == 1e-8);
    assert_true(config.clip_norm == 1 && config.lm_weight == 0.1);
    assert_int_equal(config.warmup_steps, 100);
    assert_int_equal(config.total_steps, 10000);
    assert_int_equal(config.seed, 42);
    assert_null(config.resume_path);
    assert_null(config.mesh);
    uform_trainer_config_default(NULL); /* ignored */
}

/* Scalars of the default model, counted by hand: hidden 128, mlp 512, dims 64, image 32 / 8 (16
 * patches of 192 inputs), audio 32 mels x 4 frames and 49 patches, and the logit parameters. */
static size_t default_parameters(void) {
    size_t const h = 128, m = 512, dims = 64, depth = 2;
    size_t const block = 2 * h + (3 * h * h + 3 * h) + (h * h + h) + (m * h + m) + (h * m + h);
    size_t const tower = depth * block + h + dims * h;
    return (tower + 257 * h) + (tower + h * 192 + h + h + 17 * h) + (tower + h * 128 + h + h + 50 * h) + 2;
}

static void test_info_defaults(void **state) {
    (void)state;
    uform_trainer_config_t zero = {0}, defaults;
    uform_trainer_config_default(&defaults);
    uform_model_info_t info, from_defaults;
    char const *message = NULL;
    assert_int_equal(train_info_from_config(&zero, &info, &message), UFORM_OK);
    assert_int_equal(train_info_from_config(&defaults, &from_defaults, &message), UFORM_OK);
    assert_info_equal(&info, &from_defaults, true);

    assert_int_equal(info.dims, 64);
    assert_int_equal(info.matryoshka_count, 2);
    assert_int_equal(info.matryoshka[0], 32);
    assert_int_equal(info.matryoshka[1], 64);
    assert_true(info.has_text && info.has_image && info.has_video && info.has_audio && info.has_logit);
    uform_transformer_info_t const expected = {2, 128, 2, 512};
    assert_transformer_equal(&info.text.transformer, &expected);
    assert_transformer_equal(&info.image.transformer, &expected);
    assert_transformer_equal(&info.audio.transformer, &expected);
    assert_int_equal(info.text.context, 64);
    assert_int_equal(info.image.size, 32);
    assert_int_equal(info.image.patch, 8);
    for (size_t i = 0; i < 3; i++) {
        assert_true(info.image.mean[i] == (float)checkpoint_clip_mean[i]);
        assert_true(info.image.std[i] == (float)checkpoint_clip_std[i]);
    }
    assert_int_equal(info.video.frames, 4);
    assert_int_equal(info.audio.rate, 16000);
    assert_int_equal(info.audio.mels, 32);
    assert_int_equal(info.audio.window, 400);
    assert_int_equal(info.audio.hop, 160);
    assert_int_equal(info.audio.patch_frames, 4);
    assert_int_equal(info.audio.max_patches, 49); /* (1 + (32000 - 400) / 160) / 4 */
    assert_true(info.audio.seconds == 2);
    assert_int_equal(info.parameters, default_parameters());
    assert_int_equal(info.bytes, 2 * (default_parameters() - 2) + 2 * 4); /* logit.* in F32 */
}

static void test_info_choices(void **state) {
    (void)state;
    uform_model_info_t info;
    char const *message = NULL;
    struct {
        size_t dims, count, first;
    } const widths[] = {{2, 1, 2}, {4, 2, 2}, {6, 1, 6}, {10, 1, 10}, {12, 2, 6}, {64, 2, 32}};
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++) {
        uform_trainer_config_t config = {.dims = widths[i].dims};
        assert_int_equal(train_info_from_config(&config, &info, &message), UFORM_OK);
        assert_int_equal(info.matryoshka_count, widths[i].count);
        assert_int_equal(info.matryoshka[0], widths[i].first);
        assert_int_equal(info.matryoshka[widths[i].count - 1], widths[i].dims);
    }

    /* One tower: the others are absent and their sizes ignored, even when they would be refused. */
    uform_trainer_config_t text = {.towers = 1u << UFORM_MODALITY_TEXT, .image_size = 30, .audio_rate = 5};
    assert_int_equal(train_info_from_config(&text, &info, &message), UFORM_OK);
    assert_true(info.has_text && !info.has_image && !info.has_video && !info.has_audio && info.has_logit);
    assert_int_equal(info.image.size, 0);
    assert_int_equal(info.audio.rate, 0);
    uform_trainer_config_t image = {
        .towers = 1u << UFORM_MODALITY_IMAGE | 1u << UFORM_MODALITY_VIDEO, .video_frames = 7, .hidden = 192};
    assert_int_equal(train_info_from_config(&image, &info, &message), UFORM_OK);
    assert_true(!info.has_text && info.has_image && info.has_video && !info.has_audio);
    assert_int_equal(info.video.frames, 7);
    assert_int_equal(info.image.transformer.heads, 3);
    assert_int_equal(info.image.transformer.mlp, 768);

    /* Audio at 8 kHz over 1 s: window 200, hop 80, (1 + 7800 / 80) / 4 = 24 patches. */
    uform_trainer_config_t audio = {
        .towers = 1u << UFORM_MODALITY_AUDIO, .audio_rate = 8000, .audio_seconds = 1};
    assert_int_equal(train_info_from_config(&audio, &info, &message), UFORM_OK);
    assert_true(!info.has_text && !info.has_image && info.has_audio);
    assert_int_equal(info.audio.window, 200);
    assert_int_equal(info.audio.hop, 80);
    assert_int_equal(info.audio.max_patches, 24);
    /* seconds are kept to the 9 digits a checkpoint stores */
    audio.audio_seconds = 1.23456789012345;
    assert_int_equal(train_info_from_config(&audio, &info, &message), UFORM_OK);
    assert_true(info.audio.seconds == 1.23456789);
}

static void assert_refused(uform_trainer_config_t const *config, char const *expected) {
    uform_model_info_t info;
    char const *message = NULL;
    assert_int_equal(train_info_from_config(config, &info, &message), UFORM_INVALID_ARGUMENT);
    assert_non_null(message);
    assert_string_equal(message, expected);
}

static void test_info_errors(void **state) {
    (void)state;
    struct {
        uform_trainer_config_t config;
        char const *message;
    } const cases[] = {
        {{.depth = 1025}, "depth over 1024"},
        {{.hidden = 96}, "hidden is not a multiple of 64"},
        {{.hidden = 65600}, "hidden over 65536"},
        {{.dims = 63}, "dims is odd"},
        {{.dims = 65538}, "dims over 65536"},
        {{.towers = 1u << 4}, "towers holds an unknown modality"},
        {{.towers = 1u << UFORM_MODALITY_TEXT | 1u << 9}, "towers holds an unknown modality"},
        {{.towers = 1u << UFORM_MODALITY_VIDEO}, "the video tower needs the image tower"},
        {{.towers = 1u << UFORM_MODALITY_VIDEO | 1u << UFORM_MODALITY_AUDIO},
         "the video tower needs the image tower"},
        {{.context = (1u << 24) + 1}, "context over 16777216"},
        {{.image_size = 30}, "image_size is not a multiple of image_patch"},
        {{.image_size = 32, .image_patch = 64}, "image_size is not a multiple of image_patch"},
        {{.image_size = 8200, .image_patch = 8}, "image_size over 8192"},
        {{.video_frames = 1025}, "video_frames over 1024"},
        {{.audio_rate = 99}, "audio_rate under 100 Hz or over 1048576 Hz"},
        {{.audio_rate = (1u << 20) + 1}, "audio_rate under 100 Hz or over 1048576 Hz"},
        {{.audio_mels = 1025}, "audio_mels over 1024"},
        {{.audio_seconds = -1}, "audio_seconds not in (0, 86400]"},
        {{.audio_seconds = NAN}, "audio_seconds not in (0, 86400]"},
        {{.audio_seconds = INFINITY}, "audio_seconds not in (0, 86400]"},
        {{.audio_seconds = 86401}, "audio_seconds not in (0, 86400]"},
        {{.audio_seconds = 0.02}, "audio_seconds shorter than one window"},
        {{.audio_seconds = 0.03}, "audio_seconds shorter than one patch"},
        {{.audio_rate = 1u << 20, .audio_seconds = 86400}, "audio_seconds holds over 1048576 patches"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        assert_refused(&cases[i].config, cases[i].message);
}

/* ---------------------------------------------------------------------------------------------- */
/* The seeded start                                                                               */
/* ---------------------------------------------------------------------------------------------- */

static void test_init(void **state) {
    (void)state;
    train_params_t a, b, c;
    small_params(&a, 7);
    small_params(&b, 7);
    small_params(&c, 8);
    assert_same_params(&a, &b, true);
    bool differs = false;
    size_t parameters = 0;
    for (size_t t = 0; t < a.count; t++) {
        train_tensor_t const *tensor = &a.tensors[t];
        parameters += tensor->count;
        differs |= memcmp(tensor->value, c.tensors[t].value, tensor->count * sizeof(float)) != 0;
        assert_int_equal((uintptr_t)tensor->value % 64, 0);
        assert_int_equal((uintptr_t)tensor->grad % 64, 0);
        assert_int_equal((uintptr_t)tensor->m % 64, 0);
        assert_int_equal((uintptr_t)tensor->v % 64, 0);
        assert_int_equal(tensor->count, tensor->shape[0] * tensor->shape[1]);
        if (tensor->rank == 1) assert_int_equal(tensor->shape[1], 1);
        for (size_t i = 0; i < tensor->count; i++)
            if (tensor->grad[i] != 0 || tensor->m[i] != 0 || tensor->v[i] != 0)
                fail_msg("%s: not zero", tensor->name);
    }
    assert_true(differs);
    assert_int_equal(parameters, a.info.parameters);
    assert_int_equal(a.step, 0);

    struct {
        char const *name;
        bool decay;
        double value; /* NAN: noise of std 0.02 */
    } const expected[] = {
        {"text.blocks.0.norm1.weight", false, 1},
        {"text.blocks.0.attn.qkv.weight", true, NAN},
        {"text.blocks.0.attn.qkv.bias", false, 0},
        {"text.blocks.0.mlp.down.weight", true, NAN},
        {"text.norm.weight", false, 1},
        {"text.proj.weight", true, NAN},
        {"text.embed", false, NAN},
        {"image.patch.weight", true, NAN},
        {"image.patch.bias", false, 0},
        {"image.cls", false, NAN},
        {"image.pos", false, NAN},
        {"audio.pos", false, NAN},
        {"logit.scale", false, log(10.0)},
        {"logit.bias", false, -10},
    };
    for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++) {
        train_tensor_t const *tensor = train_params_find(&a, expected[i].name);
        if (!tensor) fail_msg("no tensor %s", expected[i].name);
        assert_int_equal(tensor->decay, expected[i].decay);
        if (isnan(expected[i].value)) {
            double sum = 0, squares = 0;
            for (size_t j = 0; j < tensor->count; j++)
                sum += tensor->value[j], squares += (double)tensor->value[j] * tensor->value[j];
            double const mean = sum / (double)tensor->count,
                         std = sqrt(squares / (double)tensor->count - mean * mean);
            if (fabs(mean) > 0.01 || std < 0.015 || std > 0.025)
                fail_msg("%s: mean %g std %g", tensor->name, mean, std);
        } else {
            for (size_t j = 0; j < tensor->count; j++)
                assert_true(tensor->value[j] == (float)expected[i].value);
        }
    }
    assert_null(train_params_find(&a, "text.blocks.1.norm1.weight"));
    train_params_zero_grad(&a);
    train_params_free(&a);
    train_params_free(&b);
    train_params_free(&c);
    train_params_free(&a); /* freed params are empty */
}

/* The same names and shapes as uform_tiny_checkpoint's for the same sizes, and the same metadata. */
static void test_names_match_tiny(void **state) {
    (void)state;
    char tiny_path[512], saved[512];
    fixture_path("match-tiny.safetensors", tiny_path, sizeof tiny_path);
    fixture_path("match-train.safetensors", saved, sizeof saved);
    uform_tiny_checkpoint_args_t const tiny = {.path = tiny_path,
                                               .depth = 3,
                                               .hidden = 128,
                                               .mlp = 512,
                                               .context = 40,
                                               .image_size = 48,
                                               .image_patch = 16};
    assert_int_equal(uform_tiny_checkpoint(&tiny), UFORM_OK);
    uform_trainer_config_t const config = {
        .depth = 3, .hidden = 128, .context = 40, .image_size = 48, .image_patch = 16};
    uform_model_info_t info;
    char const *message = NULL;
    train_params_t params;
    assert_int_equal(train_info_from_config(&config, &info, &message), UFORM_OK);
    assert_int_equal(train_params_init(&params, &info, 1), UFORM_OK);

    checkpoint_header_t header;
    blob_t blob;
    parse_header(tiny_path, &header, &blob);
    assert_int_equal(header.tensors_count, params.count);
    for (size_t i = 0; i < params.count; i++) {
        train_tensor_t const *tensor = &params.tensors[i];
        checkpoint_tensor_t const *stored = checkpoint_find(&header, tensor->name);
        if (!stored) fail_msg("tiny has no %s", tensor->name);
        assert_int_equal(stored->rank, tensor->rank);
        assert_int_equal(stored->shape[0], tensor->shape[0]);
        if (stored->rank == 2) assert_int_equal(stored->shape[1], tensor->shape[1]);
    }
    assert_info_equal(&header.info, &info, false);
    assert_int_equal(header.info.parameters, info.parameters);
    assert_int_equal(header.info.bytes + 4, info.bytes); /* tiny's logit.* are BF16 */

    assert_int_equal(train_params_save(&params, saved, reason, &message), UFORM_OK);
    char *tiny_metadata = metadata_of(tiny_path), *train_metadata = metadata_of(saved);
    assert_string_equal(tiny_metadata, train_metadata);
    free(tiny_metadata);
    free(train_metadata);
    checkpoint_header_free(&header);
    free(blob.data);
    train_params_free(&params);
}

/* ---------------------------------------------------------------------------------------------- */
/* The optimizer                                                                                  */
/* ---------------------------------------------------------------------------------------------- */

static void test_learning_rate(void **state) {
    (void)state;
    double const pi = 3.14159265358979323846;
    train_optimizer_t optimizer = {.learning_rate = 0.1, .warmup_steps = 4, .total_steps = 14};
    assert_true(train_learning_rate(&optimizer, 1) == 0.1 * 1 / 4);
    assert_true(train_learning_rate(&optimizer, 3) == 0.1 * 3 / 4);
    assert_true(train_learning_rate(&optimizer, 4) == 0.1);
    assert_true(fabs(train_learning_rate(&optimizer, 5) - 0.05 * (1 + cos(pi * 0.1))) < 1e-17);
    assert_true(fabs(train_learning_rate(&optimizer, 9) - 0.05) < 1e-16);
    assert_true(fabs(train_learning_rate(&optimizer, 14)) < 1e-17);
    assert_true(fabs(train_learning_rate(&optimizer, 100)) < 1e-17);
    optimizer.warmup_steps = 0; /* no warmup: the cosine from step 0 */
    assert_true(train_learning_rate(&optimizer, 0) == 0.1);
    assert_true(fabs(train_learning_rate(&optimizer, 7) - 0.05 * (1 + cos(pi * 0.5))) < 1e-17);
    optimizer.warmup_steps = 20; /* total before the warmup ends: 0 after it */
    assert_true(train_learning_rate(&optimizer, 20) == 0.1);
    assert_true(fabs(train_learning_rate(&optimizer, 21)) < 1e-17);
}

/* A model of two hand-made tensors: [50, 100] "w.weight" (decayed, two chunks of 4096 and a part) and
 * [7] "b.bias". */
typedef struct hand_model {
    train_params_t params;
    train_tensor_t tensors[2];
    float storage[2][4][5120];
} hand_model_t;

static void hand_model(hand_model_t *model, double clip_norm) {
    memset(model, 0, sizeof *model);
    struct {
        char const *name;
        size_t rank, rows, columns;
        bool decay;
    } const shapes[2] = {{"w.weight", 2, 50, 100, true}, {"b.bias", 1, 7, 1, false}};
    random_seed(11);
    for (size_t t = 0; t < 2; t++) {
        train_tensor_t *tensor = &model->tensors[t];
        snprintf(tensor->name, sizeof tensor->name, "%s", shapes[t].name);
        tensor->rank = shapes[t].rank;
        tensor->shape[0] = shapes[t].rows;
        tensor->shape[1] = shapes[t].columns;
        tensor->count = shapes[t].rows * shapes[t].columns;
        tensor->decay = shapes[t].decay;
        tensor->value = model->storage[t][0];
        tensor->grad = model->storage[t][1];
        tensor->m = model->storage[t][2];
        tensor->v = model->storage[t][3];
        for (size_t i = 0; i < tensor->count; i++)
            tensor->value[i] = random_uniform(-1, 1);
    }
    model->params.tensors = model->tensors;
    model->params.count = 2;
    model->params.optimizer = (train_optimizer_t){
        .learning_rate = 0.01,
        .weight_decay = 0.1,
        .beta1 = 0.8,
        .beta2 = 0.9,
        .epsilon = 1e-6,
        .clip_norm = clip_norm,
        .warmup_steps = 3,
        .total_steps = 8,
    };
}

/* AdamW as the header writes it, all in double, moments kept in double. */
typedef struct reference {
    double value[2][5000], m[2][5000], v[2][5000];
} reference_t;

static double reference_step(reference_t *reference, hand_model_t const *model, size_t step) {
    train_optimizer_t const *o = &model->params.optimizer;
    double sum = 0;
    for (size_t t = 0; t < 2; t++)
        for (size_t i = 0; i < model->tensors[t].count; i++)
            sum += (double)model->tensors[t].grad[i] * model->tensors[t].grad[i];
    double const norm = sqrt(sum);
    double const scale = o->clip_norm > 0 && norm > o->clip_norm ? o->clip_norm / norm : 1;
    double lr;
    if (step <= o->warmup_steps)
        lr = o->learning_rate * (double)step / (double)o->warmup_steps;
    else {
        double progress = (double)(step - o->warmup_steps) / (double)(o->total_steps - o->warmup_steps);
        lr = o->learning_rate * 0.5 * (1 + cos(3.14159265358979323846 * (progress < 1 ? progress : 1)));
    }
    for (size_t t = 0; t < 2; t++) {
        for (size_t i = 0; i < model->tensors[t].count; i++) {
            double const g = model->tensors[t].grad[i] * scale;
            double *p = &reference->value[t][i], *m = &reference->m[t][i], *v = &reference->v[t][i];
            if (model->tensors[t].decay) *p *= 1 - lr * o->weight_decay;
            *m = o->beta1 * *m + (1 - o->beta1) * g;
            *v = o->beta2 * *v + (1 - o->beta2) * g * g;
            double const m_hat = *m / (1 - pow(o->beta1, (double)step)),
                         v_hat = *v / (1 - pow(o->beta2, (double)step));
            *p -= lr * m_hat / (sqrt(v_hat) + o->epsilon);
        }
    }
    return norm;
}

/* Within `tolerance` of `scale`, the largest magnitude of its kind: F32 state rounds each step. */
static void assert_close(double actual, double expected, double tolerance, double scale, char const *what,
                         size_t step) {
    if (!(fabs(actual - expected) <= tolerance * scale))
        fail_msg("step %zu: %s %.9g, reference %.9g", step, what, actual, expected);
}

static double largest(double const *x, size_t n) {
    double most = 0;
    for (size_t i = 0; i < n; i++)
        most = fabs(x[i]) > most ? fabs(x[i]) : most;
    return most;
}

/* Clipping off (0), not reached (1e9) and on (0.5), on the calling thread and over a pool of three
 * threads run in reverse order: the reference to F32 rounding, and the two bitwise equal. */
static void test_update_reference(void **state) {
    (void)state;
    uform_executor_t *pool = NULL;
    assert_int_equal(uform_executor_create_pool(&reversed_pool, NULL, &pool), UFORM_OK);
    double const clips[] = {0, 1e9, 0.5};
    for (size_t c = 0; c < sizeof clips / sizeof clips[0]; c++) {
        hand_model_t *model = malloc(sizeof *model), *pooled = malloc(sizeof *pooled);
        reference_t *reference = calloc(1, sizeof *reference);
        assert_non_null(model);
        assert_non_null(pooled);
        assert_non_null(reference);
        hand_model(model, clips[c]);
        hand_model(pooled, clips[c]);
        for (size_t t = 0; t < 2; t++)
            for (size_t i = 0; i < model->tensors[t].count; i++)
                reference->value[t][i] = model->tensors[t].value[i];
        bool clipped = false;
        for (size_t step = 1; step <= 10; step++) { /* warmup 3, cosine to step 8, then rate 0 */
            for (size_t t = 0; t < 2; t++) {
                for (size_t i = 0; i < model->tensors[t].count; i++) {
                    float const g = (float)(sin(0.1 * (double)(i + 31 * t + 7 * step)) * (1 + (double)t));
                    model->tensors[t].grad[i] = g;
                    pooled->tensors[t].grad[i] = g;
                }
            }
            double rate = -1, pooled_rate = -1;
            double const norm = train_params_update(&model->params, NULL, &rate);
            double const pooled_norm = train_params_update(&pooled->params, pool, &pooled_rate);
            double const expected_norm = reference_step(reference, model, step);
            clipped |= clips[c] > 0 && expected_norm > clips[c];
            assert_int_equal(model->params.step, step);
            assert_close(norm, expected_norm, 1e-12, expected_norm, "norm", step);
            assert_true(norm == pooled_norm && rate == pooled_rate);
            assert_true(rate == train_learning_rate(&model->params.optimizer, step));
            for (size_t t = 0; t < 2; t++) {
                train_tensor_t const *tensor = &model->tensors[t];
                double const value_scale = largest(reference->value[t], tensor->count),
                             m_scale = largest(reference->m[t], tensor->count),
                             v_scale = largest(reference->v[t], tensor->count);
                for (size_t i = 0; i < tensor->count; i++) {
                    assert_close(tensor->value[i], reference->value[t][i], 1e-6, value_scale, "value", step);
                    assert_close(tensor->m[i], reference->m[t][i], 1e-5, m_scale, "m", step);
                    assert_close(tensor->v[i], reference->v[t][i], 1e-5, v_scale, "v", step);
                }
                assert_memory_equal(tensor->value, pooled->tensors[t].value, tensor->count * sizeof(float));
                assert_memory_equal(tensor->m, pooled->tensors[t].m, tensor->count * sizeof(float));
                assert_memory_equal(tensor->v, pooled->tensors[t].v, tensor->count * sizeof(float));
            }
        }
        assert_int_equal(clipped, clips[c] == 0.5);
        free(model);
        free(pooled);
        free(reference);
    }
    uform_executor_free(pool);
}

/* A whole model: the calling thread, RAM executors of 2 and 3 threads and the reversed pool agree
 * bitwise. */
static void test_update_threads(void **state) {
    (void)state;
    uform_executor_t *executors[3] = {ram_executor(2, false), ram_executor(3, false), NULL};
    assert_int_equal(uform_executor_create_pool(&reversed_pool, NULL, &executors[2]), UFORM_OK);
    train_params_t alone;
    small_params(&alone, 3);
    steps(&alone, NULL, 4);
    for (size_t e = 0; e < 3; e++) {
        train_params_t threaded;
        small_params(&threaded, 3);
        steps(&threaded, executors[e], 4);
        assert_same_params(&alone, &threaded, true);
        train_params_free(&threaded);
        uform_executor_free(executors[e]);
    }
    train_params_free(&alone);
}

/* A gradient that overflowed to infinity (or NaN) makes the norm not finite: the update is skipped whole,
 * the step not counted, and every value and moment keeps its bits, where it used to update with a clip
 * factor of 1 and write NaN into every weight. */
static void test_nonfinite_gradient_norm_skips_update(void **state) {
    (void)state;
    float const poisons[] = {INFINITY, NAN};
    for (size_t p = 0; p < 2; p++) {
        train_params_t params, before;
        small_params(&params, 5);
        small_params(&before, 5);
        steps(&params, NULL, 2);
        steps(&before, NULL, 2);
        synthetic_grads(&params);
        params.tensors[params.count / 2].grad[1] = poisons[p];
        double rate = -1;
        double const norm = train_params_update(&params, NULL, &rate);
        assert_false(isfinite(norm));
        assert_true(rate == -1);
        assert_same_params(&before, &params, true);
        train_params_free(&params);
        train_params_free(&before);
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* Saving and loading                                                                             */
/* ---------------------------------------------------------------------------------------------- */

/* The checkpoint loads for inference and states the same model; its tensors are the BF16 values. */
static void test_save_loads(void **state) {
    saving_t *saving = *state;
    char const *path = saving->path, *optimizer = saving->optimizer;
    train_params_t *params = &saving->params;
    char const *message = NULL;
    assert_int_equal(train_params_save(params, path, reason, &message), UFORM_OK);
    assert_true(file_exists(optimizer));

    uform_model_t *model = NULL;
    uform_model_load_args_t const load = {.path = path, .model = &model};
    assert_int_equal(uform_model_load_ram(&load), UFORM_OK);
    uform_model_info_t info;
    assert_int_equal(uform_model_info(model, &info), UFORM_OK);
    assert_info_equal(&params->info, &info, true);
    uform_model_free(model);

    /* Without the state: the BF16 weights widened, logit.* exact (F32), step 0, no moments. */
    assert_int_equal(unlink(optimizer), 0);
    train_params_t loaded;
    assert_int_equal(train_params_load(&loaded, path, reason, &message), UFORM_OK);
    assert_info_equal(&params->info, &loaded.info, true);
    assert_int_equal(loaded.count, params->count);
    assert_int_equal(loaded.step, 0);
    for (size_t t = 0; t < params->count; t++) {
        train_tensor_t const *a = &params->tensors[t], *b = &loaded.tensors[t];
        bool const exact = strncmp(a->name, "logit.", 6) == 0;
        for (size_t i = 0; i < a->count; i++) {
            float const expected = exact ? a->value[i] : bf16_to_f32(f32_to_bf16(a->value[i]));
            if (memcmp(&expected, &b->value[i], sizeof expected) != 0) fail_msg("%s[%zu]", a->name, i);
            assert_true(b->m[i] == 0 && b->v[i] == 0 && b->grad[i] == 0);
        }
    }
    train_params_free(&loaded);
}

/* A tiny checkpoint (logit.* in BF16) loads too; a text-only one without logit.* gets their defaults. */
static void test_load_other_checkpoints(void **state) {
    (void)state;
    char path[512];
    fixture_path("tiny.safetensors", path, sizeof path);
    train_params_t params;
    char const *message = NULL;
    assert_int_equal(train_params_load(&params, path, reason, &message), UFORM_OK);
    assert_true(train_params_find(&params, "logit.scale")->value[0] ==
                bf16_to_f32(f32_to_bf16(2.302585093f)));
    train_params_free(&params);

    /* text only, no logit: written by hand */
    fixture_path("no-logit.safetensors", path, sizeof path);
    uform_trainer_config_t const config = {
        .towers = 1u << UFORM_MODALITY_TEXT, .depth = 1, .hidden = 64, .dims = 8};
    uform_model_info_t info;
    assert_int_equal(train_info_from_config(&config, &info, &message), UFORM_OK);
    info.has_logit = false;
    train_params_t source;
    assert_int_equal(train_params_init(&source, &info, 9), UFORM_OK);
    checkpoint_source_t sources[32];
    uint16_t *buffers[32] = {0};
    size_t count = 0;
    for (size_t t = 0; t < source.count; t++) {
        train_tensor_t const *tensor = &source.tensors[t];
        if (strncmp(tensor->name, "logit.", 6) == 0) continue;
        buffers[count] = malloc(tensor->count * sizeof(uint16_t));
        assert_non_null(buffers[count]);
        for (size_t i = 0; i < tensor->count; i++)
            buffers[count][i] = f32_to_bf16(tensor->value[i]);
        sources[count] = (checkpoint_source_t){tensor->name,
                                               CHECKPOINT_BF16,
                                               tensor->rank,
                                               {tensor->shape[0], tensor->shape[1]},
                                               buffers[count]};
        count++;
    }
    char *metadata = checkpoint_metadata_text(&info, NULL);
    assert_int_equal(checkpoint_write(path, metadata, sources, count, &message), UFORM_OK);
    assert_int_equal(train_params_load(&params, path, reason, &message), UFORM_OK);
    assert_true(params.info.has_text && !params.info.has_image && !params.info.has_audio &&
                params.info.has_logit);
    assert_int_equal(params.count, count + 2);
    assert_true(train_params_find(&params, "logit.scale")->value[0] == (float)log(10.0));
    assert_true(train_params_find(&params, "logit.bias")->value[0] == -10.0f);
    train_params_free(&params);
    for (size_t i = 0; i < count; i++)
        free(buffers[i]);
    free(metadata);
    train_params_free(&source);
}

/* After a few updates, save then load gives back every bit: values, moments, step, settings. */
static void test_round_trip(void **state) {
    saving_t *saving = *state;
    train_params_t *params = &saving->params;
    train_params_t loaded;
    steps(params, NULL, 3);
    params->optimizer.learning_rate = 1.0 / 3; /* digits a short decimal does not hold */
    params->optimizer.epsilon = 1e-8 / 7;
    char const *message = NULL;
    assert_int_equal(train_params_save(params, saving->path, reason, &message), UFORM_OK);
    assert_int_equal(train_params_load(&loaded, saving->path, reason, &message), UFORM_OK);
    assert_same_params(params, &loaded, true);
    assert_info_equal(&params->info, &loaded.info, true);
    train_params_free(&loaded);
}

/* 10 updates equal 5 updates, a save and a load, and 5 more: bitwise. */
static void test_resume(void **state) {
    (void)state;
    char path[512];
    fixture_path("resume.safetensors", path, sizeof path);
    uform_executor_t *executor = ram_executor(2, false);
    train_params_t straight, first, resumed;
    small_params(&straight, 4);
    steps(&straight, executor, 10);
    small_params(&first, 4);
    steps(&first, NULL, 5);
    char const *message = NULL;
    assert_int_equal(train_params_save(&first, path, reason, &message), UFORM_OK);
    train_params_free(&first);
    assert_int_equal(train_params_load(&resumed, path, reason, &message), UFORM_OK);
    assert_int_equal(resumed.step, 5);
    steps(&resumed, executor, 5);
    assert_same_params(&straight, &resumed, true);
    train_params_free(&straight);
    train_params_free(&resumed);
    uform_executor_free(executor);
}

/* A state whose checkpoint was replaced belongs to another checkpoint; a broken one is malformed. */
static void test_state_of_another_checkpoint(void **state) {
    (void)state;
    char a[512], b[512], a_state[600];
    fixture_path("owner-a.safetensors", a, sizeof a);
    fixture_path("owner-b.safetensors", b, sizeof b);
    state_path(a, a_state, sizeof a_state);
    train_params_t params;
    char const *message = NULL;
    small_params(&params, 1);
    assert_int_equal(train_params_save(&params, a, reason, &message), UFORM_OK);
    steps(&params, NULL, 1);
    assert_int_equal(train_params_save(&params, b, reason, &message), UFORM_OK);
    train_params_free(&params);
    assert_int_equal(rename(b, a), 0); /* a's checkpoint replaced, a's state left */

    message = NULL;
    assert_int_equal(train_params_load(&params, a, reason, &message), UFORM_FORMAT);
    assert_string_equal(message, "the optimizer state belongs to another checkpoint");
    assert_int_equal(params.count, 0);
    assert_null(params.tensors);

    blob_t const garbage = blob_copy("\x08\0\0\0\0\0\0\0{}      ", 16);
    FILE *file = fopen(a_state, "wb");
    assert_non_null(file);
    assert_int_equal(fwrite(garbage.data, 1, garbage.size, file), garbage.size);
    assert_int_equal(fclose(file), 0);
    free(garbage.data);
    assert_int_equal(train_params_load(&params, a, reason, &message), UFORM_FORMAT);
    assert_string_equal(message, "the optimizer state is malformed");
    assert_int_equal(unlink(a_state), 0);
    assert_int_equal(train_params_load(&params, a, reason, &message), UFORM_OK); /* no state: weights alone */
    assert_int_equal(params.step, 0);
    train_params_free(&params);
}

static void test_missing_and_bad_files(void **state) {
    (void)state;
    char path[512];
    train_params_t params;
    char const *message = NULL;
    fixture_path("missing.safetensors", path, sizeof path);
    assert_int_equal(train_params_load(&params, path, reason, &message), UFORM_IO);
    assert_string_equal(message, "cannot open the checkpoint");
    assert_int_equal(params.count, 0);
    fixture_path("", path, sizeof path); /* the folder */
    assert_int_equal(train_params_load(&params, path, reason, &message), UFORM_IO);
    fixture_path("not-a-checkpoint", path, sizeof path);
    blob_t const text = blob_copy("hello", 5);
    blob_write("not-a-checkpoint", &text);
    free(text.data);
    assert_int_equal(train_params_load(&params, path, reason, &message), UFORM_FORMAT);
    /* a save into a folder that does not exist */
    fixture_path("no-folder/model.safetensors", path, sizeof path);
    small_params(&params, 1);
    assert_int_equal(train_params_save(&params, path, reason, &message), UFORM_IO);
    char small[8];
    assert_false(train_state_path(path, small, sizeof small));
    train_params_free(&params);
}

/* Nothing of a save is left beside `path` once a load settled it: no staged file, no temporary. */
static void assert_no_staged_files(char const *path) {
    char const *slash = strrchr(path, '/');
    assert_non_null(slash);
    char folder[512];
    snprintf(folder, sizeof folder, "%.*s", (int)(slash - path), path);
    DIR *listing = opendir(folder);
    assert_non_null(listing);
    for (struct dirent *entry; (entry = readdir(listing));) {
        if (strncmp(entry->d_name, slash + 1, strlen(slash + 1)) != 0) continue;
        char const *rest = entry->d_name + strlen(slash + 1);
        if (strcmp(rest, "") != 0 && strcmp(rest, ".optimizer") != 0)
            fail_msg("left beside %s: %s", path, rest);
    }
    closedir(listing);
}

/* The save to `path` of `params` at `step`, with tensor 0's first value `mark`. */
static void save_marked(train_params_t *params, char const *path, size_t step, float mark) {
    char const *message = NULL;
    params->step = step;
    params->tensors[0].value[0] = mark;
    if (train_params_save(params, path, reason, &message) != UFORM_OK) fail_msg("%s", message);
}

/* The pair at `path` loads, for training and for inference, and is the one of `step` and `mark`. */
static bool pair_is(char const *path, size_t step, float mark) {
    char const *message = NULL;
    train_params_t loaded;
    if (train_params_load(&loaded, path, reason, &message) != UFORM_OK) fail_msg("%s", message);
    bool const same = loaded.step == step && loaded.tensors[0].value[0] == mark;
    train_params_free(&loaded);
    uform_model_t *model = NULL;
    uform_model_load_args_t const load = {.path = path, .model = &model};
    if (uform_model_load_ram(&load) != UFORM_OK) fail_msg("%s", last_error_text().text);
    uform_model_free(model);
    return same;
}

/* A child saves over and over; killed at random moments, it always leaves a whole checkpoint and an
 * optimizer state of its own. */
static void test_killed_saves(void **state) {
    saving_t *saving = *state;
    char const *path = saving->path;
    train_params_t *params = &saving->params;
    char const *message = NULL;
    assert_int_equal(train_params_save(params, path, reason, &message), UFORM_OK);
    random_seed(99);
    for (size_t round = 0; round < 6; round++) {
        fflush(NULL);
        pid_t const child = fork();
        assert_true(child >= 0);
        if (child == 0) {
            for (;;) {
                params->tensors[0].value[0] += 1;
                if (train_params_save(params, path, reason, &message) != UFORM_OK) _exit(1);
            }
        }
        struct timespec pause = {0, (long)(1000 + random_below(40000)) * 1000};
        nanosleep(&pause, NULL);
        assert_int_equal(kill(child, SIGKILL), 0);
        int status = 0;
        assert_int_equal(waitpid(child, &status, 0), child);
        assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

        uform_model_t *model = NULL;
        uform_model_load_args_t const load = {.path = path, .model = &model};
        if (uform_model_load_ram(&load) != UFORM_OK) fail_msg("round %zu: %s", round, last_error_text().text);
        uform_model_free(model);
        /* a kill at any point leaves a pair that resumes: the old one or a newer one */
        train_params_t loaded;
        if (train_params_load(&loaded, path, reason, &message) != UFORM_OK)
            fail_msg("round %zu: %s", round, message);
        assert_true(loaded.tensors[0].value[0] >= params->tensors[0].value[0]);
        assert_no_staged_files(path);
        train_params_free(&loaded);
    }
}

/* ---- faults in a save ------------------------------------------------------------------------------ */

/* The k-th file system call of a save fails, for every k: the save answers UFORM_IO naming the file and
 * the cause, and the previous pair, or the new one, resumes; or, where the call was a close that loses
 * nothing, it answers UFORM_OK and the new pair resumes. */
static void test_failed_save_loses_checkpoint(void **state) {
    saving_t *saving = *state;
    char const *path = saving->path;
    train_params_t *params = &saving->params;
    char const *message = NULL;
    size_t k = 1, olds = 0, news = 0, closes_ignored = 0;
    for (;; k++) {
        save_marked(params, path, 5, 0.25f);
        params->step = 6;
        params->tensors[0].value[0] = 0.5f;
        filesystem_calls = 0;
        filesystem_fail_at = k;
        uform_status_t const status = train_params_save(params, path, reason, &message);
        filesystem_fail_at = 0;
        if (status == UFORM_OK && filesystem_calls < k) break; /* every call was tried */
        if (status == UFORM_OK) { /* a close that loses nothing (a read-only file, a folder) */
            if (!pair_is(path, 6, 0.5f))
                fail_msg("call %zu failed, the save answered ok, the pair is old", k);
            closes_ignored++;
            continue;
        }
        if (status != UFORM_IO || strncmp(message, "cannot ", 7) != 0 || strstr(message, path) == NULL ||
            (strstr(message, strerror(ENOSPC)) == NULL && strstr(message, strerror(EIO)) == NULL))
            fail_msg("call %zu: %s: %s", k, uform_status_name(status), message);
        if (pair_is(path, 5, 0.25f))
            olds++;
        else if (pair_is(path, 6, 0.5f))
            news++;
        else
            fail_msg("call %zu failed: the pair on disk is neither the old one nor the new one", k);
        assert_no_staged_files(path);
    }
    assert_true(k > 20 && olds > 10 && news >= 1 && closes_ignored < k / 2);
}

/* A file size limit (RLIMIT_FSIZE, SIGXFSZ ignored) that the checkpoint fits in and its state does not:
 * the save answers "cannot write PATH.optimizer: File too large" and the previous pair resumes. */
static void test_save_error_names_no_file(void **state) {
    saving_t *saving = *state;
    char const *path = saving->path, *optimizer = saving->optimizer;
    train_params_t *params = &saving->params;
    save_marked(params, path, 7, 0.125f);
    struct stat checkpoint;
    assert_int_equal(stat(path, &checkpoint), 0);
    int channel[2];
    assert_int_equal(pipe(channel), 0);
    fflush(NULL);
    pid_t const child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        struct rlimit const limit = {(rlim_t)checkpoint.st_size + 4096, (rlim_t)checkpoint.st_size + 4096};
        char const *message = "";
        signal(SIGXFSZ, SIG_IGN);
        params->step = 8;
        params->tensors[0].value[0] = 0.75f;
        if (setrlimit(RLIMIT_FSIZE, &limit) != 0 ||
            train_params_save(params, path, reason, &message) != UFORM_IO)
            _exit(1);
        size_t const length = strlen(message);
        _exit(write(channel[1], message, length) == (ssize_t)length ? 0 : 1);
    }
    close(channel[1]);
    char got[UFORM_ERROR_MESSAGE_SIZE + 1] = {0};
    ssize_t const length = read(channel[0], got, UFORM_ERROR_MESSAGE_SIZE);
    close(channel[0]);
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0 && length > 0);
    char expected[1024];
    snprintf(expected, sizeof expected, "cannot write %s: %s", optimizer, strerror(EFBIG));
    expected[UFORM_ERROR_MESSAGE_SIZE - 1] = '\0'; /* where a message is cut */
    assert_string_equal(got, expected);
    assert_true(pair_is(path, 7, 0.125f));
    assert_no_staged_files(path);
}

/* What a killed save left is settled by the next load: a checkpoint staged before its state was in
 * place is removed, with its staged state and the temporaries; one whose state is in place replaces
 * the old checkpoint. */
static void test_interrupted_save_settles(void **state) {
    saving_t *saving = *state;
    char const *path = saving->path, *optimizer = saving->optimizer;
    train_params_t *params = &saving->params;
    char next[600], next_state[700], staged_state[700], stale[700];
    snprintf(next, sizeof next, "%s.next", path);
    snprintf(next_state, sizeof next_state, "%s.optimizer", next);
    snprintf(staged_state, sizeof staged_state, "%s.next", optimizer);
    snprintf(stale, sizeof stale, "%s.next.tmp.Ab3dE6", path);
    save_marked(params, path, 8, 1.25f);
    /* killed before the state's rename: both staged, the old pair in place */
    save_marked(params, next, 9, 1.5f);
    assert_int_equal(rename(next_state, staged_state), 0);
    FILE *file = fopen(stale, "wb");
    assert_non_null(file);
    assert_int_equal(fwrite("half", 1, 4, file), 4);
    assert_int_equal(fclose(file), 0);
    assert_true(pair_is(path, 8, 1.25f));
    assert_false(file_exists(next) || file_exists(staged_state) || file_exists(stale));
    /* killed after the state's rename: the new pair, its checkpoint still staged */
    save_marked(params, next, 9, 1.5f);
    assert_int_equal(rename(next_state, optimizer), 0);
    assert_true(pair_is(path, 9, 1.5f));
    assert_false(file_exists(next));
    assert_no_staged_files(path);
}

static int group_setup(void **state) {
    (void)state;
    uform_tiny_checkpoint_args_t tiny = {.seed = 42};
    return fixture_setup("train-params", &tiny, NULL, NULL);
}

int main(void) {
    struct CMUnitTest const tests[] = {
        cmocka_unit_test(test_config_default),
        cmocka_unit_test(test_info_defaults),
        cmocka_unit_test(test_info_choices),
        cmocka_unit_test(test_info_errors),
        cmocka_unit_test(test_init),
        cmocka_unit_test(test_names_match_tiny),
        cmocka_unit_test(test_learning_rate),
        cmocka_unit_test(test_update_reference),
        cmocka_unit_test(test_update_threads),
        cmocka_unit_test(test_nonfinite_gradient_norm_skips_update),
        SAVING_TEST(test_save_loads, "loads.safetensors", 5),
        cmocka_unit_test(test_load_other_checkpoints),
        SAVING_TEST(test_round_trip, "round-trip.safetensors", 21),
        cmocka_unit_test(test_resume),
        cmocka_unit_test(test_state_of_another_checkpoint),
        cmocka_unit_test(test_missing_and_bad_files),
        SAVING_TEST(test_killed_saves, "killed.safetensors", 2),
        SAVING_TEST(test_failed_save_loses_checkpoint, "faults.safetensors", 3),
        SAVING_TEST(test_save_error_names_no_file, "limited.safetensors", 4),
        SAVING_TEST(test_interrupted_save_settles, "settle.safetensors", 6),
    };
    return cmocka_run_group_tests(tests, group_setup, fixture_teardown);
}
