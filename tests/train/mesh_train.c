/* A data-parallel run equals one process on the concatenated batch (tests/train/mesh_train.sh):
 *   mesh_train mesh OUT      under `mpirun -n N`: each rank steps on its share of the batch, over a mesh;
 *   mesh_train joined OUT    under `mpirun -n 3`: the application initializes MPI and splits the run into
 *                            meshes it joins (options.communicator): ranks 0 and 1 a mesh of two, each on
 *                            half the batch, saving OUT-0.safetensors; rank 2 a mesh of one, on the whole
 *                            batch, saving OUT-1.safetensors; MPI stays the application's to finalize;
 *   mesh_train single OUT    one process, the whole batch, no mesh;
 *   mesh_train compare A B [TOLERANCE]   the two saves' master weights agree to rounding (relative to each
 *                            tensor's largest, 1e-4 unless TOLERANCE);
 *   mesh_train vram MODE ...  mesh, single and fault on a VRAM executor over device 0, its VRAM trainer (the
 *                            GPU check: every rank on the one device, staged or NCCL's multi-rank mode);
 *   mesh_train vram fault OUT  under `mpirun -n 2`, a mesh with a 5 s timeout: two steps together, then rank
 * 1 stays away from the third for 1.5 timeouts; each rank's third step must end with UFORM_DEVICE within the
 * timeout of its own collective (plus 2 s), the mesh unusable after, saying so: each prints "rank R: step 3:
 * device after S s". Exit status 77 (skip) when this build has no MPI, or in vram mode without a device. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "small_config.h"
#include "train_step.h"
#if UFORM_WITH_MPI
#include <mpi.h>
#endif

#define ITEMS   8
#define STEPS   4
#define TIMEOUT 5.0 /* seconds: the fault mode's mesh */

static bool on_device; /* vram mode: VRAM executor and trainer */
static bool faulting;  /* fault mode */

static char const *const texts[ITEMS] = {
    "a red circle", "a round red thing", "a blue square",  "a square of blue",
    "a green star", "a star, green",     "a yellow cross", "a cross in yellow",
};

static int fail(char const *what) {
    uform_error_t error = uform_last_error();
    fprintf(stderr, "mesh_train: %s: %s (%s)\n", what, uform_status_name(error.status), error.message);
    return 1;
}

static uform_trainer_config_t config_of(uform_mesh_t *mesh) {
    uform_trainer_config_t config = small_config_of(32, 32);
    config.towers = 1u << UFORM_MODALITY_TEXT;
    config.learning_rate = 3e-3;
    config.warmup_steps = 1;
    config.total_steps = 10;
    config.epsilon = 1e-3; /* keeps each update a smooth function of its gradient (test_train_reference.py) */
    config.mesh = mesh;
    return config;
}

/* Sleeps `seconds` (nanosleep: usleep is not in POSIX.1-2008, which the POSIX-only build compiles to). */
static void sleep_for(double seconds) {
    struct timespec time = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&time, &time) != 0 && errno == EINTR)
        continue; /* interrupted: the rest of it */
}

/* The third step of the fault mode: rank 1 comes 1.5 timeouts late; each rank's step must end with
 * UFORM_DEVICE within its collective's timeout, and the mesh refuse the next, saying so. Rank 0 stays
 * until rank 1 has failed too (an exit would end the run under it). */
static int fault(uform_trainer_step_args_t *step, uform_mesh_t *mesh) {
    size_t rank = uform_mesh_rank(mesh);
    if (rank == 1) sleep_for(1.5 * TIMEOUT);
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    uform_status_t status = uform_trainer_step(step);
    clock_gettime(CLOCK_MONOTONIC, &end);
    double seconds = (double)(end.tv_sec - start.tv_sec) + 1e-9 * (double)(end.tv_nsec - start.tv_nsec);
    uform_error_t error = uform_last_error();
    printf("rank %zu: step 3: %s after %.2f s (timeout %.0f s): %s\n", rank, uform_status_name(status),
           seconds, TIMEOUT, error.message);
    uform_mesh_info_t info;
    uform_mesh_info(mesh, &info);
    bool refused = uform_trainer_step(step) == UFORM_DEVICE && strstr(uform_last_error().message, "unusable");
    printf("rank %zu: mesh usable %d, the next step refused %d\n", rank, info.usable, refused);
    fflush(stdout);
    if (rank == 0) sleep_for(2 * TIMEOUT);
    bool ok = status == UFORM_DEVICE && seconds < 2.5 * TIMEOUT + 2 && !info.usable && refused;
    return ok ? 0 : 1;
}

/* Steps on items [first, first + count) of the batch, related in pairs (2k, 2k + 1), then saves. */
static int train(uform_executor_t *executor, uform_mesh_t *mesh, size_t first, size_t count,
                 char const *out) {
    uform_trainer_config_t config = config_of(mesh);
    uform_trainer_t *trainer = NULL;
    uform_trainer_init_args_t init = {.executor = executor, .config = &config, .trainer = &trainer};
    if ((on_device ? uform_trainer_init_vram(&init) : uform_trainer_init_ram(&init)) != UFORM_OK)
        return fail("uform_trainer_init");
    char data[256] = {0};
    size_t offsets[ITEMS + 1] = {0};
    uform_modality_t modalities[ITEMS];
    uint32_t relations[ITEMS];
    size_t used = 0, relations_count = 0;
    for (size_t i = 0; i < count; ++i) {
        size_t length = strlen(texts[first + i]);
        memcpy(data + used, texts[first + i], length);
        used += length;
        offsets[i + 1] = used;
        modalities[i] = UFORM_MODALITY_TEXT;
        if (i % 2 == 1)
            relations[2 * relations_count] = (uint32_t)(i - 1),
                          relations[2 * relations_count++ + 1] = (uint32_t)i;
    }
    uform_trainer_step_stats_t stats;
    uform_trainer_step_args_t step = {
        .trainer = trainer,
        .executor = executor,
        .modalities = modalities,
        .contents = {.data = data, .offsets = offsets, .count = count, .length = used},
        .relations = relations,
        .relations_count = relations_count,
        .stats = &stats};
    for (int s = 0; s < STEPS; ++s) {
        if (faulting && s == 2) return fault(&step, mesh);
        if (uform_trainer_step(&step) != UFORM_OK) return fail("uform_trainer_step");
        printf("rank %zu step %zu loss %.9f contrastive %.9f lm %.9f\n", uform_mesh_rank(mesh), stats.step,
               stats.loss, stats.contrastive_loss, stats.lm_loss);
    }
    uform_trainer_save_args_t save = {.trainer = trainer, .executor = executor, .path = out};
    if (uform_trainer_save(&save) != UFORM_OK) return fail("uform_trainer_save");
    uform_trainer_free(trainer);
    return 0;
}

static int compare(char const *a_path, char const *b_path, double tolerance) {
    train_params_t a, b;
    char const *message = NULL;
    char reason[UFORM_ERROR_MESSAGE_SIZE];
    if (train_params_load(&a, a_path, reason, &message) != UFORM_OK ||
        train_params_load(&b, b_path, reason, &message) != UFORM_OK) {
        fprintf(stderr, "mesh_train: %s\n", message);
        return 1;
    }
    int failures = 0;
    if (a.step != b.step || a.count != b.count) {
        fprintf(stderr, "mesh_train: steps %zu and %zu, tensors %zu and %zu\n", a.step, b.step, a.count,
                b.count);
        return 1;
    }
    double worst = 0;
    for (size_t i = 0; i < a.count; ++i) {
        double largest = 0, error = 0;
        for (size_t j = 0; j < a.tensors[i].count; ++j) {
            largest = fmax(largest, fabs((double)b.tensors[i].value[j]));
            error = fmax(error, fabs((double)a.tensors[i].value[j] - (double)b.tensors[i].value[j]));
        }
        double relative = largest > 0 ? error / largest : error;
        worst = fmax(worst, relative);
        /* F32 sums over half the tokens, then over the two halves, against one sum over all: rounding
         * only, which Adam's update (epsilon 1e-3) keeps far below 1e-4 of the weights. */
        if (relative > tolerance) {
            fprintf(stderr, "mesh_train: %s differs: %.3g relative\n", a.tensors[i].name, relative);
            failures++;
        }
    }
    printf("%zu tensors after %zu steps: worst relative difference %.3g\n", a.count, a.step, worst);
    train_params_free(&a);
    train_params_free(&b);
    return failures ? 1 : 0;
}

/* Steps on this process's share of the batch over `mesh`, of `expected_size` processes. */
static int train_share(uform_executor_t *executor, uform_mesh_t *mesh, size_t expected_rank,
                       size_t expected_size, char const *out) {
    size_t rank = uform_mesh_rank(mesh), size = uform_mesh_size(mesh);
    if (rank != expected_rank || size != expected_size) {
        fprintf(stderr, "mesh_train: rank %zu of %zu, where the communicator says %zu of %zu\n", rank, size,
                expected_rank, expected_size);
        return 1;
    }
    if (ITEMS % (2 * size)) {
        fprintf(stderr, "mesh_train: %d items do not split into pairs over %zu ranks\n", ITEMS, size);
        return 2;
    }
    size_t share = ITEMS / size;
    return train(executor, mesh, rank * share, share, out);
}

#if UFORM_WITH_MPI
/* The application's own MPI: initialized here, split in two communicators, each joined as a mesh. */
static int joined(uform_executor_t *executor, char const *out) {
    int provided = 0, world_rank = 0, world_size = 0;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS ||
        provided < MPI_THREAD_SERIALIZED) {
        fprintf(stderr, "mesh_train: MPI_Init_thread gave no MPI_THREAD_SERIALIZED\n");
        return 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    if (world_size != 3) {
        fprintf(stderr, "mesh_train: joined runs on 3 ranks, not %d\n", world_size);
        MPI_Finalize();
        return 2;
    }
    int color = world_rank < 2 ? 0 : 1, rank = 0, size = 0;
    MPI_Comm split = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, color, world_rank, &split);
    MPI_Comm_rank(split, &rank);
    MPI_Comm_size(split, &size);
    uform_mesh_t *mesh = NULL;
    uform_mesh_options_t options = {.communicator = &split};
    uform_mesh_bootstrap_args_t bootstrap = {.executor = executor, .options = &options, .mesh = &mesh};
    int rc = uform_mesh_bootstrap(&bootstrap) == UFORM_OK ? 0 : fail("uform_mesh_bootstrap");
    char path[1024];
    snprintf(path, sizeof path, "%s-%d.safetensors", out, color);
    if (rc == 0) rc = train_share(executor, mesh, (size_t)rank, (size_t)size, path);
    uform_mesh_free(mesh);
    int finalized = 1;
    MPI_Finalized(&finalized);
    if (finalized) {
        fprintf(stderr, "mesh_train: freeing the mesh finalized the application's MPI\n");
        return 1;
    }
    MPI_Comm_free(&split);
    MPI_Finalize();
    return rc;
}
#endif

/* The executor of the run: one host thread, or device 0. */
static int executor_make(uform_executor_t **executor) {
    if (on_device) {
        if (uform_executor_create_vram(NULL, executor) == UFORM_OK) return 0;
        printf("SKIP: no VRAM executor: %s\n", uform_last_error().message);
        return 77;
    }
    uform_ram_options_t options = uform_ram_options_default();
    options.threads = 1;
    options.pin = false;
    return uform_executor_create_ram(&options, executor) == UFORM_OK ? 0 : fail("uform_executor_create_ram");
}

int main(int argc, char **argv) {
    if ((argc == 4 || argc == 5) && !strcmp(argv[1], "compare"))
        return compare(argv[2], argv[3], argc == 5 ? atof(argv[4]) : 1e-4);
    if (argc == 4 && !strcmp(argv[1], "vram")) {
        on_device = true, faulting = !strcmp(argv[2], "fault");
        argv++, argc--;
        if (faulting) argv[1] = "mesh";
    }
    if (argc != 3 || (strcmp(argv[1], "mesh") && strcmp(argv[1], "joined") && strcmp(argv[1], "single"))) {
        fprintf(stderr, "usage: mesh_train [vram] mesh|joined|single OUT | mesh_train vram fault OUT | "
                        "mesh_train compare A B [TOLERANCE]\n");
        return 2;
    }
    if (!(uform_features() & UFORM_FEATURE_MPI)) {
        printf("SKIP: this build has no MPI\n");
        return 77;
    }
    uform_executor_t *executor = NULL;
    int made = executor_make(&executor);
    if (made) return made;
    int rc;
    if (!strcmp(argv[1], "single")) {
        rc = train(executor, NULL, 0, ITEMS, argv[2]);
#if UFORM_WITH_MPI
    } else if (!strcmp(argv[1], "joined")) {
        rc = joined(executor, argv[2]);
#endif
    } else {
        uform_mesh_t *mesh = NULL;
        uform_mesh_options_t options = {.timeout_seconds = faulting ? TIMEOUT : 0};
        uform_mesh_bootstrap_args_t bootstrap = {.executor = executor, .options = &options, .mesh = &mesh};
        if (uform_mesh_bootstrap(&bootstrap) != UFORM_OK) return fail("uform_mesh_bootstrap");
        uform_mesh_info_t info;
        uform_mesh_info(mesh, &info);
        printf("rank %zu of %zu: collectives %s, device %d%s\n", info.rank, info.size,
               info.collectives == UFORM_MESH_NCCL     ? "NCCL"
               : info.collectives == UFORM_MESH_STAGED ? "staged"
                                                       : "host",
               info.device, info.shared_device ? " (shared)" : "");
        rc = train_share(executor, mesh, uform_mesh_rank(mesh), uform_mesh_size(mesh), argv[2]);
        uform_mesh_free(mesh);
    }
    uform_executor_free(executor);
    return rc;
}
