/* The VRAM mesh's logic that needs no device, under `mpirun -n N` (tests/train/mesh_staged.sh):
 *   - the choice of collectives every process agrees on (mesh_agree: device identities gathered, the
 *     lowest NCCL version): NCCL on distinct devices, staged where devices are shared and NCCL is older
 *     than 2.30 or its multi-rank mode is switched off, staged where any process lacks NCCL;
 *   - the staged road (mesh_staged.c) through mesh_device_post and mesh_device_test, with a test double
 *     for the device: its "device memory" is host memory, its copies are queued and done only when a
 *     mark is polled a few times, so that each phase (copied out, MPI_Iallreduce / MPI_Iallgatherv in
 *     flight, copied back) is seen pending before it completes; the sums and the gathered rows are
 *     checked exactly;
 *   - the timeout: rank 1 stays away from a collective past the mesh's timeout, and rank 0's ends with
 *     UFORM_DEVICE inside it (plus the poll's slack), the mesh refusing what follows, saying why.
 * Exit status 77 (skip) when this build has no MPI. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loop.h"
#include "mesh.h"

#define CHECK(condition)                                                                                     \
    do {                                                                                                     \
        if (!(condition)) {                                                                                  \
            fprintf(stderr, "mesh_staged: rank %d: %s:%d: %s\n", rank, __FILE__, __LINE__, #condition);      \
            failures++;                                                                                      \
        }                                                                                                    \
    } while (0)

#if UFORM_WITH_MPI

static int rank, size, failures;

/* Sleeps `seconds` (nanosleep: usleep is not in POSIX.1-2008, which the POSIX-only build compiles to). */
static void sleep_for(double seconds) {
    struct timespec time = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&time, &time) != 0 && errno == EINTR)
        continue; /* interrupted: the rest of it */
}

/* ---- The device's double -------------------------------------------------------------------------- */

typedef struct copy {
    void *to;
    void const *from;
    size_t bytes;
} copy_t;

typedef struct device_double {
    copy_t queued[8];
    size_t count;
    size_t polls_left; /* of the last mark, before it is reached */
    size_t copies_out, copies_in, marks, pins;
} device_double_t;

static int double_copy(void *context, void *to, void const *from, size_t bytes, bool to_host) {
    device_double_t *device = context;
    if (device->count == 8) return 1;
    device->queued[device->count++] = (copy_t){to, from, bytes};
    ++*(to_host ? &device->copies_out : &device->copies_in);
    return 0;
}

static int double_mark(void *context) {
    device_double_t *device = context;
    device->marks++;
    device->polls_left = 2;
    return 0;
}

static int double_reached(void *context, bool *done) {
    device_double_t *device = context;
    *done = device->polls_left == 0;
    if (!*done) {
        device->polls_left--;
        return 0;
    }
    for (size_t i = 0; i < device->count; ++i)
        memcpy(device->queued[i].to, device->queued[i].from, device->queued[i].bytes);
    device->count = 0;
    return 0;
}

static void *double_pin(void *context, size_t bytes) {
    ((device_double_t *)context)->pins++;
    return malloc(bytes);
}

static void double_unpin(void *context, void *memory) {
    (void)context;
    free(memory);
}

static mesh_device_ops_t const double_ops = {double_copy, double_mark, double_reached, double_pin,
                                             double_unpin};

/* A staged mesh over MPI_COMM_WORLD with the double for its device. */
static void mesh_make(uform_mesh_t *mesh, device_double_t *device, double timeout_seconds) {
    *mesh = (uform_mesh_t){.rank = (size_t)rank,
                           .size = (size_t)size,
                           .collectives = UFORM_MESH_STAGED,
                           .timeout_ns = (uint64_t)(timeout_seconds * 1e9),
                           .device_ops = &double_ops,
                           .device_context = device,
                           .ordinal = 0};
    MPI_Comm_dup(MPI_COMM_WORLD, &mesh->comm);
    MPI_Comm_set_errhandler(mesh->comm, MPI_ERRORS_RETURN);
}

static void mesh_unmake(uform_mesh_t *mesh) {
    staged_release(mesh);
    MPI_Comm_free(&mesh->comm);
}

/* Tests until done (each test counted in *tests), or a failure. */
static uform_status_t drive(uform_mesh_t *mesh, size_t *tests, char const **message) {
    bool done = false;
    uform_status_t status = UFORM_OK;
    for (*tests = 0; status == UFORM_OK && !done; ++*tests) {
        status = mesh_device_test(mesh, &done, message);
        if (!done) sleep_for(200e-6);
    }
    return status;
}

/* ---- The choice ----------------------------------------------------------------------------------- */

static void check_choice(char const *what, bool same_device, int version, int lacking_rank,
                         char const *multi_rank, uform_mesh_collectives_t expected, bool expected_shared) {
    uint8_t identity[16] = {0};
    if (!same_device) identity[0] = (uint8_t)(rank + 1);
    uform_mesh_collectives_t collectives = UFORM_MESH_HOST;
    bool shared = false;
    int own = rank == lacking_rank ? 0 : version;
    CHECK(mesh_agree(MPI_COMM_WORLD, identity, own, multi_rank, &collectives, &shared) == UFORM_OK);
    if (collectives != expected || shared != expected_shared) {
        fprintf(stderr, "mesh_staged: rank %d: %s: collectives %d shared %d, not %d and %d\n", rank, what,
                collectives, shared, expected, expected_shared);
        failures++;
    }
}

static void choice(void) {
    check_choice("distinct devices, NCCL 2.28", false, 22809, -1, NULL, UFORM_MESH_NCCL, false);
    check_choice("one device, NCCL 2.28", true, 22809, -1, NULL, UFORM_MESH_STAGED, true);
    check_choice("one device, NCCL 2.30", true, 23000, -1, NULL, UFORM_MESH_NCCL, true);
    check_choice("one device, NCCL 2.30, multi-rank off", true, 23000, -1, "0", UFORM_MESH_STAGED, true);
    check_choice("one device, NCCL 2.30, multi-rank on", true, 23000, -1, "1", UFORM_MESH_NCCL, true);
    check_choice("distinct devices, rank 1 without NCCL", false, 22809, 1, NULL, UFORM_MESH_STAGED, false);
    CHECK(mesh_choose(false, 0, NULL) == UFORM_MESH_STAGED);
}

/* ---- The staged road ------------------------------------------------------------------------------ */

#define VALUES 1000

static void staged_sums(void) {
    device_double_t device = {0};
    uform_mesh_t mesh;
    mesh_make(&mesh, &device, 60);
    float *grad = malloc(VALUES * sizeof(float)); /* the "device" buffers */
    double shares[2] = {0.25 * (rank + 1), -1.0 * rank};
    for (size_t i = 0; i < VALUES; ++i)
        grad[i] = (float)((rank + 1) * (double)i);
    mesh_collective_t const sums[2] = {
        {.operation = MESH_ALLREDUCE, .scalar = MESH_F32, .device = grad, .count = VALUES},
        {.operation = MESH_ALLREDUCE, .scalar = MESH_F64, .device = shares, .count = 2},
    };
    char const *message = NULL;
    size_t tests = 0;
    CHECK(mesh_device_post(&mesh, sums, 2, &message) == UFORM_OK);
    CHECK(mesh.staged.phase == STAGED_OUT && device.copies_out == 2 && device.marks == 1);
    CHECK(grad[1] == (float)(rank + 1)); /* nothing changes before the copies back */
    CHECK(mesh_device_post(&mesh, sums, 1, &message) == UFORM_INVALID_ARGUMENT); /* one batch at a time */
    CHECK(drive(&mesh, &tests, &message) == UFORM_OK);
    CHECK(tests >= 5); /* the marks out and in each polled pending twice */
    CHECK(device.copies_in == 2 && device.marks == 2 && device.pins == 2 && !mesh.in_flight);
    double total = (double)size * (size + 1) / 2;
    for (size_t i = 0; i < VALUES; ++i)
        if (grad[i] != (float)(total * (double)i)) {
            fprintf(stderr, "mesh_staged: rank %d: grad[%zu] = %g, not %g\n", rank, i, grad[i], total * i);
            failures++;
            break;
        }
    CHECK(shares[0] == 0.25 * total && shares[1] == -(double)size * (size - 1) / 2);
    /* Again on the same buffers: nothing pinned anew. */
    CHECK(mesh_device_post(&mesh, sums, 2, &message) == UFORM_OK);
    CHECK(drive(&mesh, &tests, &message) == UFORM_OK);
    CHECK(device.pins == 2 && grad[1] == (float)(size * total)); /* each process held the sums */
    free(grad);
    mesh_unmake(&mesh);
}

#define DIMS 3

static void staged_gather(void) {
    device_double_t device = {0};
    uform_mesh_t mesh;
    mesh_make(&mesh, &device, 60);
    size_t *counts = malloc((size_t)size * sizeof(size_t)), total = 0;
    for (int p = 0; p < size; ++p) { /* process p has p + 1 items of DIMS */
        counts[p] = (size_t)(p + 1) * DIMS;
        total += counts[p];
    }
    double *local = malloc(counts[rank] * sizeof(double)), *all = calloc(total, sizeof(double));
    for (size_t i = 0; i < counts[rank]; ++i)
        local[i] = 1000.0 * rank + (double)i;
    mesh_collective_t gather = {
        .operation = MESH_ALLGATHERV, .scalar = MESH_F64, .device = all, .local = local, .counts = counts};
    char const *message = NULL;
    size_t tests = 0;
    CHECK(mesh_device_post(&mesh, &gather, 1, &message) == UFORM_OK);
    CHECK(drive(&mesh, &tests, &message) == UFORM_OK);
    CHECK(device.copies_out == 1 && device.copies_in == 1);
    for (int p = 0, at = 0; p < size; at += (int)counts[p++])
        for (size_t i = 0; i < counts[p]; ++i)
            if (all[at + (int)i] != 1000.0 * p + (double)i) {
                fprintf(stderr, "mesh_staged: rank %d: row of process %d wrong at %zu: %g\n", rank, p, i,
                        all[at + (int)i]);
                failures++;
                break;
            }
    free(local);
    free(all);
    free(counts);
    mesh_unmake(&mesh);
}

/* ---- The timeout ---------------------------------------------------------------------------------- */

#define TIMEOUT 0.5

static double seconds_since(uint64_t start) {
    return (double)(loop_now_ns() - start) * 1e-9;
}

static void staged_timeout(void) {
    device_double_t device = {0};
    uform_mesh_t mesh;
    mesh_make(&mesh, &device, TIMEOUT);
    double value = 1;
    mesh_collective_t sum = {.operation = MESH_ALLREDUCE, .scalar = MESH_F64, .device = &value, .count = 1};
    char const *message = NULL;
    size_t tests = 0;
    if (rank == 1) { /* away past the others' timeout, then there, so that MPI's requests complete */
        sleep_for(3 * TIMEOUT);
    } else {
        uint64_t start = loop_now_ns();
        CHECK(mesh_device_post(&mesh, &sum, 1, &message) == UFORM_OK);
        uform_status_t status = drive(&mesh, &tests, &message);
        double elapsed = seconds_since(start);
        printf("rank %d: %s after %.3f s (timeout %.1f s): %s\n", rank, uform_status_name(status), elapsed,
               TIMEOUT, message ? message : "");
        CHECK(status == UFORM_DEVICE && elapsed >= TIMEOUT && elapsed < TIMEOUT + 0.5);
        CHECK(mesh.broken && strstr(message, "timed out"));
        CHECK(mesh_usable(&mesh, &message) == UFORM_DEVICE && strstr(message, "unusable"));
        CHECK(mesh_device_post(&mesh, &sum, 1, &message) == UFORM_DEVICE);
        uform_mesh_info_t info;
        CHECK(uform_mesh_info(&mesh, &info) == UFORM_OK && !info.usable && info.broken == mesh.broken);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    /* The abandoned collective's requests are completed by hand, for a clean MPI_Finalize. */
    if (rank == 1) {
        CHECK(mesh_device_post(&mesh, &sum, 1, &message) == UFORM_OK);
        CHECK(drive(&mesh, &tests, &message) == UFORM_OK);
    } else if (mesh.staged.phase == STAGED_REDUCING) {
        MPI_Wait(&mesh.staged.requests[0].mpi, MPI_STATUS_IGNORE);
    } else {
        double ignored = 0;
        MPI_Allreduce(MPI_IN_PLACE, &ignored, 1, MPI_DOUBLE, MPI_SUM, mesh.comm);
    }
    mesh_unmake(&mesh);
}

int main(int argc, char **argv) {
    (void)argc, (void)argv;
    int provided = 0;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) return 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size < 2) {
        fprintf(stderr, "mesh_staged: runs under mpirun -n 2 or more\n");
        MPI_Finalize();
        return 2;
    }
    choice();
    staged_sums();
    staged_gather();
    staged_timeout();
    int all = 0;
    MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) printf("mesh_staged: %d processes, %d failures\n", size, all);
    MPI_Finalize();
    return all ? 1 : 0;
}

#else

int main(void) {
    printf("SKIP: this build has no MPI\n");
    return 77;
}

#endif
