/* Meshes over Open MPI. Bootstrap initializes MPI on the executor's loop thread when nobody has (asking
 * MPI_THREAD_SERIALIZED: every later MPI call of the engine comes from a loop thread, one at a time), or
 * checks that the application initialized it so, and duplicates the communicator it joins (the options'
 * one, else MPI_COMM_WORLD) with errors returned, so a failing collective is a status, never an abort.
 * The trainer's collectives are non-blocking (MPI_Iallgather(v), MPI_Iallreduce): posted by a step and
 * tested by the loop on a short, growing timer, as VRAM executors poll CUDA events. Freeing the last mesh
 * finalizes MPI when the engine initialized it. Over a VRAM executor a process alone meshes (its VRAM
 * trainer steps alone); several processes would need device collectives, which are not built, and answer
 * UFORM_UNSUPPORTED, every one of them alike. */
#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "call.h"
#include "executor.h"
#include "mesh.h"

#if UFORM_WITH_MPI

static atomic_size_t meshes_alive;
static atomic_bool mpi_initialized_here;

static uform_status_t posted(int code) {
    return code == MPI_SUCCESS ? UFORM_OK : UFORM_IO;
}

uform_status_t mesh_allgather_u64(uform_mesh_t *mesh, uint64_t const *local, size_t count, uint64_t *all,
                                  mesh_request_t *request) {
    if (count > INT_MAX) return UFORM_INVALID_ARGUMENT;
    return posted(MPI_Iallgather(local, (int)count, MPI_UINT64_T, all, (int)count, MPI_UINT64_T, mesh->comm,
                                 request));
}

uform_status_t mesh_allgatherv_f64(uform_mesh_t *mesh, double const *local, size_t count, double *all,
                                   int const *counts, int const *displacements, mesh_request_t *request) {
    if (count > INT_MAX) return UFORM_INVALID_ARGUMENT;
    return posted(MPI_Iallgatherv(local, (int)count, MPI_DOUBLE, all, counts, displacements, MPI_DOUBLE,
                                  mesh->comm, request));
}

uform_status_t mesh_allreduce_f32(uform_mesh_t *mesh, float *values, size_t count, mesh_request_t *request) {
    if (count > INT_MAX) return UFORM_INVALID_ARGUMENT;
    return posted(MPI_Iallreduce(MPI_IN_PLACE, values, (int)count, MPI_FLOAT, MPI_SUM, mesh->comm, request));
}

uform_status_t mesh_allreduce_f64(uform_mesh_t *mesh, double *values, size_t count, mesh_request_t *request) {
    if (count > INT_MAX) return UFORM_INVALID_ARGUMENT;
    return posted(MPI_Iallreduce(MPI_IN_PLACE, values, (int)count, MPI_DOUBLE, MPI_SUM, mesh->comm, request));
}

uform_status_t mesh_test(mesh_request_t *request, bool *done) {
    int flag = 0;
    int code = MPI_Test(request, &flag, MPI_STATUS_IGNORE);
    *done = flag != 0;
    return posted(code);
}

typedef struct bootstrap_call {
    call_t call;
    uform_mesh_t **mesh;
    MPI_Comm joined; /* the options' communicator, or MPI_COMM_WORLD */
} bootstrap_call_t;

static void bootstrap_start(call_t *call) {
    bootstrap_call_t *bootstrap = container_of(call, bootstrap_call_t, call);
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (finalized) {
        call_finish(call, UFORM_UNSUPPORTED, "MPI was finalized in this process: it cannot start again");
        return;
    }
    if (!initialized) {
        int provided = 0;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
            call_finish(call, UFORM_IO, "MPI_Init_thread failed");
            return;
        }
        atomic_store(&mpi_initialized_here, true);
    } else {
        int provided = MPI_THREAD_SINGLE;
        if (MPI_Query_thread(&provided) != MPI_SUCCESS || provided < MPI_THREAD_SERIALIZED) {
            call_finish(
                call, UFORM_UNSUPPORTED,
                "MPI was initialized below MPI_THREAD_SERIALIZED: the engine calls it from its loop thread");
            return;
        }
    }
    uform_mesh_t *mesh = calloc(1, sizeof *mesh);
    if (!mesh) {
        call_finish(call, UFORM_OUT_OF_MEMORY, "cannot allocate the mesh");
        return;
    }
    int rank = 0, size = 1;
    if (MPI_Comm_dup(bootstrap->joined, &mesh->comm) != MPI_SUCCESS) {
        free(mesh);
        call_finish(call, UFORM_IO, "MPI_Comm_dup failed");
        return;
    }
    MPI_Comm_set_errhandler(mesh->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(mesh->comm, &rank);
    MPI_Comm_size(mesh->comm, &size);
    if (size > 1 && executor_on_device(call->executor)) { /* every process of the run answers alike */
        MPI_Comm_free(&mesh->comm);
        free(mesh);
        call_finish(
            call, UFORM_UNSUPPORTED,
            "a mesh of several processes over VRAM executors needs device collectives (NCCL), which this "
            "version does not build; a process alone meshes");
        return;
    }
    mesh->rank = (size_t)rank;
    mesh->size = (size_t)size;
    atomic_fetch_add(&meshes_alive, 1);
    *bootstrap->mesh = mesh;
    call_finish(call, UFORM_OK, NULL);
}

UFORM_EXPORT uform_status_t uform_mesh_bootstrap(uform_mesh_bootstrap_args_t const *args) {
    static char const entry[] = "uform_mesh_bootstrap";
    if (!args) return failed(UFORM_INVALID_ARGUMENT, entry, "args is NULL");
    if (!args->executor || !args->mesh)
        return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry, "executor or mesh is NULL");
    MPI_Comm joined = MPI_COMM_WORLD;
    if (args->options && args->options->communicator) {
        int initialized = 0, finalized = 0;
        MPI_Initialized(&initialized);
        MPI_Finalized(&finalized);
        if (!initialized || finalized)
            return call_refuse(
                args->outcome, UFORM_INVALID_ARGUMENT, entry,
                "options.communicator needs MPI initialized by the application, and not finalized");
        joined = *(MPI_Comm const *)args->options->communicator;
        if (joined == MPI_COMM_NULL)
            return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry,
                               "options.communicator is MPI_COMM_NULL");
    }
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
    call_submit(call);
    return args->outcome ? UFORM_OK : call_wait(outcome_of(&own));
}

UFORM_EXPORT void uform_mesh_free(uform_mesh_t *mesh) {
    if (!mesh) return;
    MPI_Comm_free(&mesh->comm);
    free(mesh);
    if (atomic_fetch_sub(&meshes_alive, 1) == 1 && atomic_load(&mpi_initialized_here)) {
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

uform_status_t mesh_test(mesh_request_t *request, bool *done) {
    (void)request;
    *done = true;
    return UFORM_UNSUPPORTED;
}

UFORM_EXPORT uform_status_t uform_mesh_bootstrap(uform_mesh_bootstrap_args_t const *args) {
    static char const entry[] = "uform_mesh_bootstrap";
    if (!args) return failed(UFORM_INVALID_ARGUMENT, entry, "args is NULL");
    if (!args->executor || !args->mesh)
        return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry, "executor or mesh is NULL");
    return call_refuse(args->outcome, UFORM_UNSUPPORTED, entry, "this build has no MPI (the `mpi` feature)");
}

UFORM_EXPORT void uform_mesh_free(uform_mesh_t *mesh) {
    (void)mesh; /* none can exist without MPI */
}

#endif

UFORM_EXPORT size_t uform_mesh_rank(uform_mesh_t const *mesh) {
    return mesh ? mesh->rank : 0;
}

UFORM_EXPORT size_t uform_mesh_size(uform_mesh_t const *mesh) {
    return mesh ? mesh->size : 1;
}
