/* VRAM trainers against RAM trainers on the same config, seed and batch (texts, PNG images, an MP4 clip and
 * a WAV sound written by `uform dataset synth`, whose path is the program's argument; clips and sounds
 * where the build has FFmpeg):
 *   - the first three steps' losses within 1e-2 (relative) of the RAM trainer's, and after them every
 *     master weight at cosine >= 0.999 to the RAM trainer's, each tensor's change since the start at
 *     cosine >= 0.8 (BF16 gradients against F32 ones, through Adam's normalization);
 *   - a resumed run's saves byte for byte an uninterrupted one's, and two runs' the same bits;
 *   - saves that move between residencies: a VRAM trainer's save resumed by a RAM trainer and the reverse,
 *     each next step's loss within 2e-2 of the other residency's;
 *   - a loss or a gradient norm that is not finite (a temperature of exp(1000), of exp(100)) answering
 *     UFORM_INVALID_ARGUMENT naming which, and changing no byte of the next save; a cancelled step and an
 *     item that cannot be decoded changing nothing either;
 *   - a mesh of one process over the VRAM executor (outside mpirun), and a VRAM trainer stepping with it.
 * Without a CUDA device every check that needs one is skipped, saying why; what holds anyway is checked:
 * a VRAM trainer refuses a host executor. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"
#include "../train/small_config.h"
#include "train_step.h"
#include "uform_config.h"

static char const *uform_command;
static bool have_device;
static uform_executor_t *vram, *ram;

/* The batch: 4 texts, 4 images, a clip and a sound (the last two with FFmpeg), related in pairs. */
static batch_t *batch;
static uform_modality_t modalities[10];
static uint32_t relations[8];
static size_t relations_count;

#define NEED_DEVICE()                                                                                        \
    do {                                                                                                     \
        if (!have_device) skip();                                                                            \
    } while (0)

/* Appends the file `name` of the synthetic dataset's media folder. */
static void add_file(char const *name, uform_modality_t modality) {
    char path[600];
    fixture_path("synth/media/", path, sizeof path);
    strncat(path, name, sizeof path - strlen(path) - 1);
    blob_t blob = blob_read(path);
    modalities[batch_tape(batch).count] = modality;
    batch_add(batch, blob.data, blob.size);
    free(blob.data);
}

static bool batch_make(void) {
    char folder[512], command[2048];
    fixture_path("synth", folder, sizeof folder);
    if (!uform_command) return fprintf(stderr, "no `uform` command given: the media checks skip\n"), false;
    snprintf(command, sizeof command,
             "'%s' dataset synth --out '%s' --images 4 --videos 1 --sounds 1 --seed 3 --image-size 32 "
             "--video-frames 4 > /dev/null",
             uform_command, folder);
    if (system(command) != 0) return false;
    static char const *const texts[] = {"a red circle", "a round red thing", "a blue square",
                                        "a square of blue"};
    batch = batch_new(BATCH_MEMORY);
    for (size_t i = 0; i < 4; ++i) {
        modalities[i] = UFORM_MODALITY_TEXT;
        batch_add(batch, texts[i], strlen(texts[i]));
    }
    char const *const images[] = {"img-000000.png", "img-000001.png", "img-000002.png", "img-000003.png"};
    for (size_t i = 0; i < 4; ++i)
        add_file(images[i], UFORM_MODALITY_IMAGE);
    uint32_t const pairs[] = {0, 4, 1, 5, 2, 6, 3, 7};
    memcpy(relations, pairs, sizeof pairs);
    relations_count = 4;
#if UFORM_WITH_FFMPEG
    add_file("vid-000000.mp4", UFORM_MODALITY_VIDEO);
    add_file("snd-000000.wav", UFORM_MODALITY_AUDIO);
#endif
    return true;
}

static int setup(void **state) {
    (void)state;
    uform_tiny_checkpoint_args_t tiny = {.seed = 1};
    if (fixture_setup("vram-train", &tiny, NULL, NULL) != 0) return -1;
    ram = ram_executor(2, false);
    have_device = uform_executor_create_vram(NULL, &vram) == UFORM_OK;
    if (!have_device) {
        fprintf(stderr, "no VRAM executor here, device tests skip: %s\n", last_error_text().text);
        return 0;
    }
    if (!batch_make()) have_device = false, fprintf(stderr, "no media for the batch: device tests skip\n");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    if (batch) batch_free(batch);
    uform_executor_free(vram);
    uform_executor_free(ram);
    return fixture_teardown(state);
}

/* Two blocks of 128 in every tower, images of 32 in patches of 8, clips of 4 frames. */
static uform_trainer_config_t config_of(char const *resume) {
    uform_trainer_config_t config = small_config_of(64, 32);
    config.depth = 2;
    config.hidden = 128;
    config.towers = (1u << UFORM_MODALITY_TEXT) | (1u << UFORM_MODALITY_IMAGE);
#if UFORM_WITH_FFMPEG
    config.towers |= (1u << UFORM_MODALITY_VIDEO) | (1u << UFORM_MODALITY_AUDIO);
#endif
    config.audio_seconds = 1.0;
    config.learning_rate = 1e-3;
    config.warmup_steps = 1;
    config.total_steps = 20;
    config.resume_path = resume;
    return config;
}

static uform_trainer_t *trainer_on(uform_executor_t *executor, char const *resume) {
    uform_trainer_config_t config = config_of(resume);
    uform_trainer_t *trainer = NULL;
    uform_trainer_init_args_t init = {.executor = executor, .config = &config, .trainer = &trainer};
    uform_status_t status = executor == ram ? uform_trainer_init_ram(&init) : uform_trainer_init_vram(&init);
    if (status != UFORM_OK) fail_msg("trainer: %s", last_error_text().text);
    return trainer;
}

/* A step of the trainer on the batch, its stats into `stats`. */
static uform_trainer_step_args_t step_args(uform_trainer_t *trainer, uform_executor_t *executor,
                                           uform_trainer_step_stats_t *stats) {
    return (uform_trainer_step_args_t){.trainer = trainer,
                                       .executor = executor,
                                       .modalities = modalities,
                                       .contents = batch_tape(batch),
                                       .relations = relations,
                                       .relations_count = relations_count,
                                       .stats = stats};
}

static uform_status_t step_of(uform_trainer_t *trainer, uform_executor_t *executor,
                              uform_trainer_step_stats_t *stats) {
    uform_trainer_step_args_t args = step_args(trainer, executor, stats);
    return uform_trainer_step(&args);
}

static void steps(uform_trainer_t *trainer, uform_executor_t *executor, size_t count,
                  uform_trainer_step_stats_t *stats) {
    for (size_t i = 0; i < count; ++i)
        if (step_of(trainer, executor, &stats[i]) != UFORM_OK)
            fail_msg("step %zu: %s", i + 1, last_error_text().text);
}

static void save_to(uform_trainer_t *trainer, uform_executor_t *executor, char const *name, char *path,
                    size_t capacity) {
    fixture_path(name, path, capacity);
    uform_trainer_save_args_t save = {.trainer = trainer, .executor = executor, .path = path};
    if (uform_trainer_save(&save) != UFORM_OK) fail_msg("save: %s", last_error_text().text);
}

/* A save's checkpoint and optimizer state, byte for byte another's. */
static void assert_same_saves(char const *a, char const *b) {
    char const *suffixes[] = {"", ".optimizer"};
    for (size_t s = 0; s < 2; ++s) {
        char x_path[700], y_path[700];
        snprintf(x_path, sizeof x_path, "%s%s", a, suffixes[s]);
        snprintf(y_path, sizeof y_path, "%s%s", b, suffixes[s]);
        blob_t x = blob_read(x_path), y = blob_read(y_path);
        if (x.size != y.size || memcmp(x.data, y.data, x.size)) fail_msg("%s and %s differ", x_path, y_path);
        free(x.data), free(y.data);
    }
}

static void assert_close(double got, double expected, double relative, char const *what) {
    print_message("  %-40s %.6f vs %.6f (relative %.2e)\n", what, got, expected,
                  fabs(got - expected) / fabs(expected));
    if (!(fabs(got - expected) <= relative * fabs(expected)))
        fail_msg("%s: %.9g, expected %.9g", what, got, expected);
}

static double cosine(float const *a, float const *b, float const *minus, size_t n) {
    double dot = 0.0, aa = 0.0, bb = 0.0;
    for (size_t i = 0; i < n; ++i) {
        double x = a[i] - (minus ? minus[i] : 0.0f), y = b[i] - (minus ? minus[i] : 0.0f);
        dot += x * y, aa += x * x, bb += y * y;
    }
    return aa == 0.0 && bb == 0.0 ? 1.0 : dot / sqrt(aa * bb);
}

static void params_load(char const *path, train_params_t *params) {
    char reason[UFORM_ERROR_MESSAGE_SIZE];
    char const *message = NULL;
    if (train_params_load(params, path, reason, &message) != UFORM_OK) fail_msg("%s: %s", path, message);
}

/* ---- Without a device, too ---------------------------------------------------------------------- */

static void vram_trainer_refuses_host_executors(void **state) {
    (void)state;
    uform_trainer_config_t config = config_of(NULL);
    uform_trainer_t *trainer = NULL;
    uform_trainer_init_args_t init = {.executor = ram, .config = &config, .trainer = &trainer};
    assert_int_equal(uform_trainer_init_vram(&init), UFORM_INVALID_ARGUMENT);
    assert_null(trainer);
    assert_int_equal(uform_trainer_init_vram(NULL), UFORM_INVALID_ARGUMENT);
    init.executor = NULL;
    assert_int_equal(uform_trainer_init_vram(&init), UFORM_INVALID_ARGUMENT);
}

/* ---- Against a RAM trainer ---------------------------------------------------------------------- */

static void vram_trainer_matches_ram_trainer(void **state) {
    (void)state;
    NEED_DEVICE();
    uform_trainer_t *on_device = trainer_on(vram, NULL), *on_host = trainer_on(ram, NULL);
    char start[600], device_path[600], host_path[600];
    save_to(on_host, ram, "start.safetensors", start, sizeof start);
    uform_trainer_step_stats_t device_stats[3], host_stats[3];
    steps(on_device, vram, 3, device_stats);
    steps(on_host, ram, 3, host_stats);
    for (size_t i = 0; i < 3; ++i) {
        char what[64];
        snprintf(what, sizeof what, "step %zu loss", i + 1);
        assert_close(device_stats[i].loss, host_stats[i].loss, 1e-2, what);
        snprintf(what, sizeof what, "step %zu contrastive loss", i + 1);
        assert_close(device_stats[i].contrastive_loss, host_stats[i].contrastive_loss, 1e-2, what);
        snprintf(what, sizeof what, "step %zu next-byte loss", i + 1);
        assert_close(device_stats[i].lm_loss, host_stats[i].lm_loss, 1e-2, what);
        assert_int_equal(device_stats[i].step, i + 1);
    }
    save_to(on_device, vram, "device.safetensors", device_path, sizeof device_path);
    save_to(on_host, ram, "host.safetensors", host_path, sizeof host_path);
    train_params_t first, device, host;
    params_load(start, &first), params_load(device_path, &device), params_load(host_path, &host);
    double worst = 1.0, worst_change = 1.0;
    for (size_t t = 0; t < host.count; ++t) {
        train_tensor_t const *d = &device.tensors[t], *h = &host.tensors[t];
        double weights = cosine(d->value, h->value, NULL, h->count);
        double change = cosine(d->value, h->value, first.tensors[t].value, h->count);
        worst = fmin(worst, weights), worst_change = fmin(worst_change, change);
        if (weights < 0.999) fail_msg("%s: weights at cosine %.6f", h->name, weights);
        if (change < 0.8) fail_msg("%s: its change since the start at cosine %.4f", h->name, change);
    }
    print_message("  %zu tensors after 3 steps: weights at cosine >= %.6f, changes at >= %.4f\n", host.count,
                  worst, worst_change);
    train_params_free(&first), train_params_free(&device), train_params_free(&host);
    uform_trainer_free(on_device);
    uform_trainer_free(on_host);
}

/* ---- Bits ----------------------------------------------------------------------------------------- */

static void vram_resume_and_repeat_are_bit_exact(void **state) {
    (void)state;
    NEED_DEVICE();
    uform_trainer_step_stats_t stats[3];
    char straight[600], again[600], halfway[600], resumed_path[600];
    uform_trainer_t *trainer = trainer_on(vram, NULL);
    steps(trainer, vram, 3, stats);
    save_to(trainer, vram, "straight.safetensors", straight, sizeof straight);
    uform_trainer_free(trainer);
    trainer = trainer_on(vram, NULL); /* the same run again */
    steps(trainer, vram, 3, stats);
    save_to(trainer, vram, "again.safetensors", again, sizeof again);
    uform_trainer_free(trainer);
    assert_same_saves(straight, again);
    trainer = trainer_on(vram, NULL); /* one step, a save, a new trainer from it, two more */
    steps(trainer, vram, 1, stats);
    save_to(trainer, vram, "halfway.safetensors", halfway, sizeof halfway);
    uform_trainer_free(trainer);
    trainer = trainer_on(vram, halfway);
    steps(trainer, vram, 2, stats);
    assert_int_equal(stats[1].step, 3);
    save_to(trainer, vram, "resumed.safetensors", resumed_path, sizeof resumed_path);
    uform_trainer_free(trainer);
    assert_same_saves(straight, resumed_path);
}

/* ---- Between residencies -------------------------------------------------------------------------- */

static void saves_move_between_residencies(void **state) {
    (void)state;
    NEED_DEVICE();
    uform_trainer_step_stats_t stats[2], other[2];
    char from_device[600], from_host[600];
    uform_trainer_t *trainer = trainer_on(vram, NULL);
    steps(trainer, vram, 2, stats);
    save_to(trainer, vram, "from-device.safetensors", from_device, sizeof from_device);
    steps(trainer, vram, 1, stats);
    uform_trainer_t *host = trainer_on(ram, from_device);
    steps(host, ram, 1, other);
    assert_int_equal(other[0].step, 3);
    assert_close(other[0].loss, stats[0].loss, 2e-2, "a RAM trainer from a VRAM trainer's save");
    save_to(host, ram, "from-host.safetensors", from_host, sizeof from_host);
    steps(host, ram, 1, other);
    uform_trainer_free(trainer);
    trainer = trainer_on(vram, from_host);
    steps(trainer, vram, 1, stats);
    assert_int_equal(stats[0].step, 4);
    assert_close(stats[0].loss, other[0].loss, 2e-2, "a VRAM trainer from a RAM trainer's save");
    uform_trainer_free(trainer);
    uform_trainer_free(host);
}

/* ---- Steps that change nothing -------------------------------------------------------------------- */

/* A save of a RAM trainer whose temperature is exp(`scale`). */
static void save_with_scale(float scale, char const *name, char *path, size_t capacity) {
    uform_trainer_t *host = trainer_on(ram, NULL);
    host->logit_scale->value[0] = scale;
    save_to(host, ram, name, path, capacity);
    uform_trainer_free(host);
}

static uform_continuation_t cancel_at_forward(void *state, size_t completed, size_t total) {
    (void)state, (void)total;
    return completed >= 2 ? UFORM_CANCEL : UFORM_CONTINUE;
}

static void vram_steps_that_change_nothing(void **state) {
    (void)state;
    NEED_DEVICE();
    float const scales[] = {1000.0f, 100.0f};
    char const *const reasons[] = {"loss is not finite", "norm is not finite"};
    for (size_t k = 0; k < 2; ++k) {
        char start[600], after[600];
        save_with_scale(scales[k], k ? "hot.safetensors" : "overflow.safetensors", start, sizeof start);
        uform_trainer_t *trainer = trainer_on(vram, start);
        uform_trainer_step_stats_t stats = {0};
        assert_int_equal(step_of(trainer, vram, &stats), UFORM_INVALID_ARGUMENT);
        assert_non_null(strstr(uform_last_error().message, reasons[k]));
        save_to(trainer, vram, "unchanged.safetensors", after, sizeof after);
        assert_same_saves(start, after);
        uform_trainer_free(trainer);
    }
    char start[600], after[600];
    uform_trainer_t *trainer = trainer_on(vram, NULL);
    save_to(trainer, vram, "before.safetensors", start, sizeof start);
    uform_progress_t progress = {.handler = cancel_at_forward, .steps = TRAIN_PHASES};
    uform_trainer_step_args_t args = step_args(trainer, vram, NULL);
    args.progress = &progress;
    assert_int_equal(uform_trainer_step(&args), UFORM_CANCELLED);
    uform_modality_t broken[10];
    memcpy(broken, modalities, sizeof broken);
    broken[0] = UFORM_MODALITY_IMAGE; /* a text is not an image */
    args.progress = NULL, args.modalities = broken;
    assert_int_equal(uform_trainer_step(&args), UFORM_FORMAT);
    assert_non_null(strstr(uform_last_error().message, "item 0"));
    save_to(trainer, vram, "after.safetensors", after, sizeof after);
    assert_same_saves(start, after);
    uform_trainer_step_stats_t stats = {0};
    assert_int_equal(step_of(trainer, vram, &stats), UFORM_OK); /* and it goes on */
    assert_int_equal(stats.step, 1);
    uform_trainer_free(trainer);
}

/* The contract's Training example on one device, outside mpirun: a mesh of one process over the VRAM
 * executor (its collectives chosen: with NCCL, a communicator of one started and destroyed), and a VRAM
 * trainer made with it steps on device 0. Last: freeing the mesh finalizes MPI. */
static void vram_mesh_of_one_process(void **state) {
    (void)state;
    NEED_DEVICE();
    if (!UFORM_WITH_MPI) skip();
    uform_mesh_t *mesh = NULL;
    uform_mesh_bootstrap_args_t bootstrap = {.executor = vram, .mesh = &mesh};
    if (uform_mesh_bootstrap(&bootstrap) != UFORM_OK) fail_msg("bootstrap: %s", last_error_text().text);
    assert_int_equal(uform_mesh_size(mesh), 1);
    uform_mesh_info_t info;
    assert_int_equal(uform_mesh_info(mesh, &info), UFORM_OK);
    fprintf(stderr, "  a mesh of one: collectives %d, device %d\n", info.collectives, info.device);
    assert_true(info.usable && info.device == 0 && info.collectives != UFORM_MESH_HOST &&
                !info.shared_device);
    uform_trainer_config_t config = config_of(NULL);
    config.mesh = mesh;
    uform_trainer_t *trainer = NULL;
    uform_trainer_init_args_t init = {.executor = vram, .config = &config, .trainer = &trainer};
    if (uform_trainer_init_vram(&init) != UFORM_OK) fail_msg("trainer: %s", last_error_text().text);
    uform_trainer_step_stats_t stats = {0};
    assert_int_equal(step_of(trainer, vram, &stats), UFORM_OK);
    assert_int_equal(stats.step, 1);
    char path[600];
    save_to(trainer, vram, "meshed.safetensors", path, sizeof path);
    uform_trainer_free(trainer);
    uform_mesh_free(mesh);
}

int main(int argc, char **argv) {
    uform_command = argc > 1 ? argv[1] : NULL;
    struct CMUnitTest const tests[] = {
        cmocka_unit_test(vram_trainer_refuses_host_executors),
        cmocka_unit_test(vram_trainer_matches_ram_trainer),
        cmocka_unit_test(vram_resume_and_repeat_are_bit_exact),
        cmocka_unit_test(saves_move_between_residencies),
        cmocka_unit_test(vram_steps_that_change_nothing),
        cmocka_unit_test(vram_mesh_of_one_process),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
