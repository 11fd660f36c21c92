/* Meshes over Open MPI (mesh.h). Bootstrap, a call on the executor's loop:
 *
 *   start     MPI initialized on the loop thread when nobody has (MPI_THREAD_SERIALIZED: every later MPI
 *             call of the engine comes from a loop thread, one at a time), or checked to be so; the
 *             joined communicator (the options' one, else MPI_COMM_WORLD) duplicated with errors
 *             returned, so a failing collective is a status, never an abort; the local rank from the
 *             processes sharing this node's memory (MPI_Comm_split_type);
 *   device    over a VRAM executor: the process's device (mesh_device_bind: local rank modulo the
 *             executor's devices), then every process's device identity and NCCL version gathered into
 *             one choice of collectives (mesh_agree), NCCL or staged, the same everywhere;
 *   NCCL      rank 0's unique id broadcast, a non-blocking communicator started (mesh_nccl_start), then
 *             polled from a loop timer until ready, or aborted past the timeout.
 *
 * The trainer's collectives are non-blocking (MPI_Iallgather(v), MPI_Iallreduce on the host; NCCL's or the
 * staged road's on devices): posted by a step and tested by the loop on a short, growing timer, as VRAM
 * executors poll CUDA events. On VRAM meshes each has the mesh's timeout: past it the mesh breaks
 * (mesh_break). Freeing the last mesh finalizes MPI when the engine initialized it and no request of a
 * broken mesh is left pending, whose buffers MPI may still write: those stay allocated. */
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "call.h"
#include "executor.h"
#include "mesh.h"

#define MESH_TIMEOUT_DEFAULT 300.0 /* seconds */

uform_mesh_collectives_t mesh_choose(bool shared, int nccl_version, char const *multi_rank) {
    if (nccl_version <= 0) return UFORM_MESH_STAGED;
    if (shared && (nccl_version < 23000 || (multi_rank && strcmp(multi_rank, "0") == 0)))
        return UFORM_MESH_STAGED;
    return UFORM_MESH_NCCL;
}

uform_status_t mesh_usable(uform_mesh_t const *mesh, char const **message) {
    if (!mesh || !mesh->broken) return UFORM_OK;
    *message = mesh->broken;
    return UFORM_DEVICE;
}

uint64_t mesh_poll_ns(uint64_t *polls) {
    uint64_t delay = 10000u << (*polls < 7 ? *polls : 7);
    ++*polls;
    return delay < 1000000 ? delay : 1000000;
}

UFORM_EXPORT size_t uform_mesh_rank(uform_mesh_t const *mesh) {
    return mesh ? mesh->rank : 0;
}

UFORM_EXPORT size_t uform_mesh_size(uform_mesh_t const *mesh) {
    return mesh ? mesh->size : 1;
}

UFORM_EXPORT uform_status_t uform_mesh_info(uform_mesh_t const *mesh, uform_mesh_info_t *info) {
    if (!info) return failed(UFORM_INVALID_ARGUMENT, "uform_mesh_info", "info is NULL");
    *info = (uform_mesh_info_t){.size = 1, .local_size = 1, .device = -1, .usable = true};
    if (!mesh) return UFORM_OK;
    *info = (uform_mesh_info_t){.rank = mesh->rank,
                                .size = mesh->size,
                                .local_rank = mesh->local_rank,
                                .local_size = mesh->local_size,
                                .collectives = mesh->collectives,
                                .device = mesh->ordinal,
                                .shared_device = mesh->shared_device,
                                .usable = mesh->broken == NULL,
                                .timeout_seconds = (double)mesh->timeout_ns * 1e-9,
                                .broken = mesh->broken};
    return UFORM_OK;
}

#if UFORM_WITH_MPI

static atomic_size_t meshes_alive;
static atomic_bool mpi_initialized_here;
static atomic_bool mpi_left_pending; /* a broken mesh left a request: MPI is not finalized */

static uform_status_t posted(int code, mesh_request_t *request) {
    request->posted_ns = loop_now_ns();
    return code == MPI_SUCCESS ? UFORM_OK : UFORM_IO;
}

uform_status_t mesh_allgather_u64(uform_mesh_t *mesh, uint64_t const *local, size_t count, uint64_t *all,
                                  mesh_request_t *request) {
    if (count > INT_MAX) return UFORM_INVALID_ARGUMENT;
    return posted(MPI_Iallgather(local, (int)count, MPI_UINT64_T, all, (int)count, MPI_UINT64_T, mesh->comm,
                                 &request->mpi),
                  request);
}

uform_status_t mesh_allgatherv_f64(uform_mesh_t *mesh, double const *local, size_t count, double *all,
                                   int const *counts, int const *displacements, mesh_request_t *request) {
    if (count > INT_MAX) return UFORM_INVALID_ARGUMENT;
    return posted(MPI_Iallgatherv(local, (int)count, MPI_DOUBLE, all, counts, displacements, MPI_DOUBLE,
                                  mesh->comm, &request->mpi),
                  request);
}

uform_status_t mesh_allreduce_f32(uform_mesh_t *mesh, float *values, size_t count, mesh_request_t *request) {
    if (count > INT_MAX) return UFORM_INVALID_ARGUMENT;
    return posted(
        MPI_Iallreduce(MPI_IN_PLACE, values, (int)count, MPI_FLOAT, MPI_SUM, mesh->comm, &request->mpi),
        request);
}

uform_status_t mesh_allreduce_f64(uform_mesh_t *mesh, double *values, size_t count, mesh_request_t *request) {
    if (count > INT_MAX) return UFORM_INVALID_ARGUMENT;
    return posted(
        MPI_Iallreduce(MPI_IN_PLACE, values, (int)count, MPI_DOUBLE, MPI_SUM, mesh->comm, &request->mpi),
        request);
}

/* Whether the mesh's timeout passed since `posted_ns`: then the mesh is broken with `why`. */
static bool timed_out(uform_mesh_t *mesh, uint64_t posted_ns, char const *why) {
    if (!mesh->timeout_ns || loop_now_ns() - posted_ns <= mesh->timeout_ns) return false;
    mesh_break(mesh, why);
    return true;
}

uform_status_t mesh_test(uform_mesh_t *mesh, mesh_request_t *request, bool *done) {
    int flag = 0;
    int code = MPI_Test(&request->mpi, &flag, MPI_STATUS_IGNORE);
    *done = flag != 0;
    if (code != MPI_SUCCESS) return UFORM_IO;
    if (!*done &&
        timed_out(mesh, request->posted_ns, "a collective of the mesh timed out: the mesh is unusable"))
        return UFORM_DEVICE;
    return UFORM_OK;
}

void mesh_break(uform_mesh_t *mesh, char const *why) {
    if (mesh->broken) return;
    mesh->broken = why;
#if UFORM_WITH_NCCL
    if (mesh->nccl) mesh_nccl_abort(mesh);
#endif
}

uform_status_t mesh_device_post(uform_mesh_t *mesh, mesh_collective_t const *collectives, size_t count,
                                char const **message) {
    if (mesh_usable(mesh, message) != UFORM_OK) return UFORM_DEVICE;
    if (mesh->in_flight || count == 0 || count > MESH_COLLECTIVES)
        return *message = "the mesh's collectives were posted out of turn", UFORM_INVALID_ARGUMENT;
    mesh->posted_ns = loop_now_ns();
    uform_status_t status = UFORM_UNSUPPORTED;
    *message = "this build has no device collectives";
    if (mesh->collectives == UFORM_MESH_STAGED) status = staged_post(mesh, collectives, count, message);
#if UFORM_WITH_NCCL
    if (mesh->collectives == UFORM_MESH_NCCL) status = mesh_nccl_post(mesh, collectives, count, message);
#endif
    mesh->in_flight = status == UFORM_OK;
    return status;
}

uform_status_t mesh_device_test(uform_mesh_t *mesh, bool *done, char const **message) {
    *done = true;
    if (!mesh->in_flight) return UFORM_OK;
    uform_status_t status = UFORM_UNSUPPORTED;
    if (mesh->collectives == UFORM_MESH_STAGED) status = staged_test(mesh, done, message);
#if UFORM_WITH_NCCL
    if (mesh->collectives == UFORM_MESH_NCCL) status = mesh_nccl_test(mesh, done, message);
#endif
    if (status == UFORM_OK && !*done &&
        timed_out(mesh, mesh->posted_ns, "a device collective of the mesh timed out: the mesh is unusable")) {
        *message = mesh->broken;
        status = UFORM_DEVICE;
    }
    if (status != UFORM_OK || *done) mesh->in_flight = false;
    if (status != UFORM_OK) mesh_break(mesh, *message);
    return status;
}

/* ---- The choice ----------------------------------------------------------------------------------- */

/* Whether two of the `count` 16-byte identities are equal. */
static bool identities_repeat(uint8_t const *identities, size_t count) {
    for (size_t i = 0; i < count; ++i)
        for (size_t j = i + 1; j < count; ++j)
            if (memcmp(identities + 16 * i, identities + 16 * j, 16) == 0) return true;
    return false;
}

uform_status_t mesh_agree(MPI_Comm comm, uint8_t const identity[16], int nccl_version, char const *multi_rank,
                          uform_mesh_collectives_t *collectives, bool *shared) {
    int size = 1, lowest = 0;
    MPI_Comm_size(comm, &size);
    uint8_t *identities = malloc(16 * (size_t)size);
    if (!identities) return UFORM_OUT_OF_MEMORY;
    bool ok = MPI_Allgather(identity, 16, MPI_BYTE, identities, 16, MPI_BYTE, comm) == MPI_SUCCESS &&
              MPI_Allreduce(&nccl_version, &lowest, 1, MPI_INT, MPI_MIN, comm) == MPI_SUCCESS;
    *shared = ok && identities_repeat(identities, (size_t)size);
    free(identities);
    *collectives = mesh_choose(*shared, lowest, multi_rank);
    return ok ? UFORM_OK : UFORM_IO;
}

/* ---- Bootstrap ------------------------------------------------------------------------------------ */

typedef struct bootstrap_call {
    call_t call;
    uform_mesh_t **mesh;
    uform_mesh_t *made;
    MPI_Comm joined; /* the options' communicator, or MPI_COMM_WORLD */
    double timeout_seconds;
    loop_op_t poll;
    uint64_t polls, started_ns;
} bootstrap_call_t;

_Static_assert(sizeof(bootstrap_call_t) <= EXECUTOR_CALL_STORAGE,
               "bootstrap_call_t outgrew the call storage");

static void mesh_destroy(uform_mesh_t *mesh);

static void bootstrap_end(bootstrap_call_t *bootstrap, uform_status_t status, char const *message) {
    if (status == UFORM_OK) {
        atomic_fetch_add(&meshes_alive, 1);
        *bootstrap->mesh = bootstrap->made;
    } else if (bootstrap->made) {
        mesh_destroy(bootstrap->made);
    }
    call_finish(&bootstrap->call, status, message);
}

/* MPI initialized on this thread, or checked to allow calls from it. */
static uform_status_t mpi_ready(char const **message) {
    int initialized = 0, finalized = 0, provided = MPI_THREAD_SINGLE;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (finalized)
        return *message = "MPI was finalized in this process: it cannot start again", UFORM_UNSUPPORTED;
    if (!initialized) {
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
            return *message = "MPI_Init_thread failed", UFORM_IO;
        atomic_store(&mpi_initialized_here, true);
        return UFORM_OK;
    }
    if (MPI_Query_thread(&provided) != MPI_SUCCESS || provided < MPI_THREAD_SERIALIZED)
        return *message = "MPI was initialized below MPI_THREAD_SERIALIZED: the engine calls it from its "
                          "loop thread",
               UFORM_UNSUPPORTED;
    return UFORM_OK;
}

/* The mesh's communicator, ranks and counts' buffer. */
static uform_status_t mesh_join(uform_mesh_t *mesh, MPI_Comm joined, char const **message) {
    int rank = 0, size = 1, local_rank = 0, local_size = 1;
    if (MPI_Comm_dup(joined, &mesh->comm) != MPI_SUCCESS) {
        mesh->comm = MPI_COMM_NULL;
        return *message = "MPI_Comm_dup failed", UFORM_IO;
    }
    MPI_Comm_set_errhandler(mesh->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(mesh->comm, &rank);
    MPI_Comm_size(mesh->comm, &size);
    MPI_Comm node = MPI_COMM_NULL;
    if (MPI_Comm_split_type(mesh->comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node) != MPI_SUCCESS)
        return *message = "MPI_Comm_split_type failed", UFORM_IO;
    MPI_Comm_rank(node, &local_rank);
    MPI_Comm_size(node, &local_size);
    MPI_Comm_free(&node);
    mesh->rank = (size_t)rank, mesh->size = (size_t)size;
    mesh->local_rank = (size_t)local_rank, mesh->local_size = (size_t)local_size;
    if (!(mesh->counts_all = calloc(3 * mesh->size, sizeof(uint64_t))))
        return *message = "cannot allocate the mesh", UFORM_OUT_OF_MEMORY;
    return UFORM_OK;
}

static void bootstrap_wait(bootstrap_call_t *bootstrap);

/* NCCL's communicator is polled until it is ready, or aborted past the timeout. */
static void bootstrap_poll(loop_op_t *op) {
    bootstrap_call_t *bootstrap = container_of(op, bootstrap_call_t, poll);
    bool done = false;
    char const *message = NULL;
    uform_status_t status = UFORM_UNSUPPORTED;
#if UFORM_WITH_NCCL
    status = mesh_nccl_ready(bootstrap->made, &done, &message);
#endif
    uform_mesh_t *mesh = bootstrap->made;
    if (status == UFORM_OK && !done && loop_now_ns() - bootstrap->started_ns > mesh->timeout_ns) {
        mesh_break(mesh, "NCCL's communicator did not start within the mesh's timeout");
        status = UFORM_DEVICE, message = mesh->broken;
    }
    if (status != UFORM_OK || done) {
        bootstrap_end(bootstrap, status, message);
        return;
    }
    bootstrap_wait(bootstrap);
}

/* Polls again soon (mesh_poll_ns). */
static void bootstrap_wait(bootstrap_call_t *bootstrap) {
    bootstrap->poll.callback = bootstrap_poll;
    loop_timer(bootstrap->call.executor->loop, &bootstrap->poll, mesh_poll_ns(&bootstrap->polls));
}

/* Over a VRAM executor: the device, the choice of collectives, and NCCL's communicator started. */
static uform_status_t bootstrap_device(bootstrap_call_t *bootstrap, char const **message) {
    uform_mesh_t *mesh = bootstrap->made;
    mesh->timeout_ns = (uint64_t)(bootstrap->timeout_seconds * 1e9);
#if UFORM_WITH_CUDA
    uint8_t identity[16] = {0};
    int nccl_version = 0;
    uform_status_t status =
        mesh_device_bind(mesh, bootstrap->call.executor, identity, &nccl_version, message);
    if (status == UFORM_OK &&
        (status = mesh_agree(mesh->comm, identity, nccl_version, getenv("NCCL_MULTI_RANK_GPU_ENABLE"),
                             &mesh->collectives, &mesh->shared_device)) != UFORM_OK)
        *message = "the processes' devices could not be gathered over MPI";
    if (status != UFORM_OK || mesh->collectives != UFORM_MESH_NCCL) return status;
#if UFORM_WITH_NCCL
    bootstrap->started_ns = loop_now_ns();
    return mesh_nccl_start(mesh, message);
#endif
#endif
    (void)bootstrap;
    return *message = "a mesh over a VRAM executor needs CUDA", UFORM_UNSUPPORTED;
}

static void bootstrap_start(call_t *call) {
    bootstrap_call_t *bootstrap = container_of(call, bootstrap_call_t, call);
    char const *message = NULL;
    uform_status_t status = mpi_ready(&message);
    if (status != UFORM_OK) {
        call_finish(call, status, message);
        return;
    }
    uform_mesh_t *mesh = bootstrap->made = calloc(1, sizeof *mesh);
    if (!mesh) {
        bootstrap_end(bootstrap, UFORM_OUT_OF_MEMORY, "cannot allocate the mesh");
        return;
    }
    *mesh = (uform_mesh_t){.comm = MPI_COMM_NULL, .executor = call->executor, .ordinal = -1};
    status = mesh_join(mesh, bootstrap->joined, &message);
    if (status == UFORM_OK && executor_on_device(call->executor))
        status = bootstrap_device(bootstrap, &message);
    if (status != UFORM_OK || !mesh->nccl) {
        bootstrap_end(bootstrap, status, message);
        return;
    }
    bootstrap_wait(bootstrap);
}

/* The options' communicator, checked on the calling thread. */
static uform_status_t joined_of(uform_mesh_options_t const *options, MPI_Comm *joined, char const **message) {
    *joined = MPI_COMM_WORLD;
    if (!options || !options->communicator) return UFORM_OK;
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized)
        return *message = "options.communicator needs MPI initialized by the application, and not finalized",
               UFORM_INVALID_ARGUMENT;
    *joined = *(MPI_Comm const *)options->communicator;
    if (*joined == MPI_COMM_NULL)
        return *message = "options.communicator is MPI_COMM_NULL", UFORM_INVALID_ARGUMENT;
    return UFORM_OK;
}

/* Submits the bootstrap, its executor and mesh given; the options are checked first. */
static uform_status_t bootstrap_submit(uform_mesh_bootstrap_args_t const *args, char const *entry) {
    double timeout = args->options ? args->options->timeout_seconds : 0;
    if (!isfinite(timeout) || timeout < 0 || timeout > 1e9)
        return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry,
                           "options.timeout_seconds is negative, too large or not a number");
    MPI_Comm joined;
    char const *message = NULL;
    if (joined_of(args->options, &joined, &message) != UFORM_OK)
        return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry, message);
    *args->mesh = NULL;
    uform_outcome_t own;
    call_t *call = NULL;
    uform_status_t status =
        call_open(args->executor, NULL, args->outcome, &own, sizeof(bootstrap_call_t), entry, &call);
    if (status != UFORM_OK) return status;
    bootstrap_call_t *bootstrap = container_of(call, bootstrap_call_t, call);
    call->start = bootstrap_start;
    bootstrap->mesh = args->mesh;
    bootstrap->joined = joined;
    bootstrap->timeout_seconds = timeout > 0 ? timeout : MESH_TIMEOUT_DEFAULT;
    call_submit(call);
    return args->outcome ? UFORM_OK : call_wait(outcome_of(&own));
}

/* Whether some MPI request of the mesh's may still be written by MPI. */
static bool requests_pending(uform_mesh_t const *mesh) {
    return mesh->broken && mesh->size > 1; /* the counts' exchange is over MPI on either road */
}

/* Frees what the mesh holds but a broken mesh's buffers that MPI may still write, and those of its
 * communicator: they stay, and MPI is then never finalized by the engine. */
static void mesh_destroy(uform_mesh_t *mesh) {
    bool pending = requests_pending(mesh);
#if UFORM_WITH_NCCL
    if (mesh->nccl) mesh_nccl_release(mesh);
#endif
#if UFORM_WITH_CUDA
    if (!pending) mesh_device_unbind(mesh);
#endif
    if (pending) {
        atomic_store(&mpi_left_pending, true);
        return;
    }
    staged_release(mesh);
    free(mesh->counts_all);
    if (mesh->comm != MPI_COMM_NULL) MPI_Comm_free(&mesh->comm);
    free(mesh);
}

UFORM_EXPORT void uform_mesh_free(uform_mesh_t *mesh) {
    if (!mesh) return;
    mesh_destroy(mesh);
    if (atomic_fetch_sub(&meshes_alive, 1) == 1 && atomic_load(&mpi_initialized_here) &&
        !atomic_load(&mpi_left_pending)) {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Finalize();
    }
}

#else /* no MPI in this build */

uform_status_t mesh_allgather_u64(uform_mesh_t *mesh, uint64_t const *local, size_t count, uint64_t *all,
                                  mesh_request_t *request) {
    (void)mesh, (void)local, (void)count, (void)all, (void)request;
    return UFORM_UNSUPPORTED;
}

uform_status_t mesh_allgatherv_f64(uform_mesh_t *mesh, double const *local, size_t count, double *all,
                                   int const *counts, int const *displacements, mesh_request_t *request) {
    (void)mesh, (void)local, (void)count, (void)all, (void)counts, (void)displacements, (void)request;
    return UFORM_UNSUPPORTED;
}

uform_status_t mesh_allreduce_f32(uform_mesh_t *mesh, float *values, size_t count, mesh_request_t *request) {
    (void)mesh, (void)values, (void)count, (void)request;
    return UFORM_UNSUPPORTED;
}

uform_status_t mesh_allreduce_f64(uform_mesh_t *mesh, double *values, size_t count, mesh_request_t *request) {
    (void)mesh, (void)values, (void)count, (void)request;
    return UFORM_UNSUPPORTED;
}

uform_status_t mesh_test(uform_mesh_t *mesh, mesh_request_t *request, bool *done) {
    (void)mesh, (void)request;
    *done = true;
    return UFORM_UNSUPPORTED;
}

void mesh_break(uform_mesh_t *mesh, char const *why) {
    mesh->broken = why;
}

uform_status_t mesh_device_post(uform_mesh_t *mesh, mesh_collective_t const *collectives, size_t count,
                                char const **message) {
    (void)mesh, (void)collectives, (void)count;
    return *message = "this build has no MPI (the `mpi` feature)", UFORM_UNSUPPORTED;
}

uform_status_t mesh_device_test(uform_mesh_t *mesh, bool *done, char const **message) {
    (void)mesh, (void)message;
    *done = true;
    return UFORM_OK;
}

/* Without MPI no mesh can be made. */
static uform_status_t bootstrap_submit(uform_mesh_bootstrap_args_t const *args, char const *entry) {
    return call_refuse(args->outcome, UFORM_UNSUPPORTED, entry, "this build has no MPI (the `mpi` feature)");
}

UFORM_EXPORT void uform_mesh_free(uform_mesh_t *mesh) {
    (void)mesh; /* none can exist without MPI */
}

#endif

UFORM_EXPORT uform_status_t uform_mesh_bootstrap(uform_mesh_bootstrap_args_t const *args) {
    static char const entry[] = "uform_mesh_bootstrap";
    if (!args) return failed(UFORM_INVALID_ARGUMENT, entry, "args is NULL");
    if (!args->executor || !args->mesh)
        return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry, "executor or mesh is NULL");
    return bootstrap_submit(args, entry);
}
