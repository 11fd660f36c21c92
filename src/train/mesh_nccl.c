/* The NCCL road of a VRAM mesh (mesh.h): a non-blocking communicator (config.blocking = 0), after NCCL's
 * rules for those: while a call answered ncclInProgress, no other NCCL call is made and nothing is
 * launched on its stream until ncclCommGetAsyncError leaves ncclInProgress.
 *
 *   start      rank 0's ncclGetUniqueId broadcast over MPI; ncclCommInitRankConfig on the mesh's device:
 *                                                                                         STARTING
 *   STARTING   polled (mesh_nccl_ready) until the communicator's async state is ncclSuccess:    READY
 *   post       the batch's collectives in one group on the trainer's stream: an allreduce in place; an
 *              allgatherv as one ncclBroadcast per process from its part; ncclGroupEnd answering
 *              ncclInProgress:                                                          ENQUEUING
 *              else an event recorded after the group:                                    RUNNING
 *   ENQUEUING  polled until the async state is ncclSuccess, then the event recorded:        RUNNING
 *   RUNNING    the event polled (and the async state, for errors): done.                    READY
 *
 * NCCL reports no completion of its own: the event does. A mesh that breaks (a timeout, a failure) has its
 * communicator aborted with ncclCommAbort, which ends its kernels in flight; a mesh freed whole destroys
 * it. Built with CUDA, NCCL and MPI. */
#include <stdlib.h>

#include "executor.h"
#include "mesh.h"

#if UFORM_WITH_NCCL && UFORM_WITH_MPI
#include <nccl.h>

#include "vram.h"

typedef enum nccl_phase { NCCL_STARTING, NCCL_READY, NCCL_ENQUEUING, NCCL_RUNNING } nccl_phase_t;

typedef struct mesh_nccl {
    ncclComm_t comm;
    nccl_phase_t phase;
    vram_device_t *device;
    cudaEvent_t done;
    bool aborted;
} mesh_nccl_t;

static ncclDataType_t nccl_type(mesh_scalar_t scalar) {
    return scalar == MESH_F32 ? ncclFloat32 : ncclFloat64;
}

static size_t nccl_bytes(mesh_scalar_t scalar) {
    return scalar == MESH_F32 ? sizeof(float) : sizeof(double);
}

uform_status_t mesh_nccl_start(uform_mesh_t *mesh, char const **message) {
    mesh_nccl_t *nccl = calloc(1, sizeof *nccl);
    if (!nccl) return *message = "cannot allocate the mesh", UFORM_OUT_OF_MEMORY;
    mesh->nccl = nccl;
    nccl->device = &vram_of(mesh->executor)->devices[mesh->device_index];
    ncclUniqueId id = {0};
    if (mesh->rank == 0 && ncclGetUniqueId(&id) != ncclSuccess) memset(&id, 0, sizeof id); /* refused below */
    if (MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, mesh->comm) != MPI_SUCCESS)
        return *message = "broadcasting NCCL's unique id over MPI failed", UFORM_IO;
    static ncclUniqueId const none;
    if (memcmp(&id, &none, sizeof id) == 0) /* every process sees rank 0's failure alike */
        return *message = "rank 0 could not make NCCL's unique id", UFORM_DEVICE;
    if (vram_use(nccl->device) != UFORM_OK ||
        cudaEventCreateWithFlags(&nccl->done, cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();
        return *message = "cannot use the mesh's device", UFORM_DEVICE;
    }
    if (mesh->shared_device && !getenv("NCCL_MULTI_RANK_GPU_ENABLE"))
        setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1", 0); /* mesh_choose took NCCL's multi-rank mode */
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t result = ncclCommInitRankConfig(&nccl->comm, (int)mesh->size, id, (int)mesh->rank, &config);
    if (result != ncclSuccess && result != ncclInProgress)
        return *message = "NCCL's communicator could not start", UFORM_DEVICE;
    nccl->phase = NCCL_STARTING;
    return UFORM_OK;
}

/* The communicator's async state: UFORM_OK with *ready once it is ncclSuccess. */
static uform_status_t nccl_settled(mesh_nccl_t *nccl, bool *ready, char const **message) {
    ncclResult_t state = ncclInProgress;
    if (ncclCommGetAsyncError(nccl->comm, &state) != ncclSuccess ||
        (state != ncclSuccess && state != ncclInProgress))
        return *message = "NCCL's communicator failed", UFORM_DEVICE;
    *ready = state == ncclSuccess;
    return UFORM_OK;
}

uform_status_t mesh_nccl_ready(uform_mesh_t *mesh, bool *done, char const **message) {
    mesh_nccl_t *nccl = mesh->nccl;
    uform_status_t status = nccl_settled(nccl, done, message);
    if (status == UFORM_OK && *done) nccl->phase = NCCL_READY;
    return status;
}

/* One collective into the open group. */
static ncclResult_t nccl_enqueue(uform_mesh_t *mesh, mesh_collective_t const *collective,
                                 cudaStream_t stream) {
    mesh_nccl_t *nccl = mesh->nccl;
    ncclDataType_t type = nccl_type(collective->scalar);
    if (collective->operation == MESH_ALLREDUCE)
        return ncclAllReduce(collective->device, collective->device, collective->count, type, ncclSum,
                             nccl->comm, stream);
    char *all = collective->device;
    ncclResult_t result = ncclSuccess;
    for (size_t p = 0, at = 0; p < mesh->size && result == ncclSuccess; at += collective->counts[p++]) {
        if (collective->counts[p] == 0) continue;
        void const *part = p == mesh->rank ? collective->local : all + at * nccl_bytes(collective->scalar);
        result = ncclBroadcast(part, all + at * nccl_bytes(collective->scalar), collective->counts[p], type,
                               (int)p, nccl->comm, stream);
    }
    return result;
}

/* The event after the group, recorded once NCCL has enqueued it. */
static uform_status_t nccl_record(mesh_nccl_t *nccl, char const **message) {
    if (cudaEventRecord(nccl->done, nccl->device->stream) != cudaSuccess) {
        cudaGetLastError();
        return *message = "cannot record an event after the mesh's collectives", UFORM_DEVICE;
    }
    nccl->phase = NCCL_RUNNING;
    return UFORM_OK;
}

uform_status_t mesh_nccl_post(uform_mesh_t *mesh, mesh_collective_t const *collectives, size_t count,
                              char const **message) {
    mesh_nccl_t *nccl = mesh->nccl;
    if (nccl->phase != NCCL_READY) return *message = "NCCL's communicator is not ready", UFORM_DEVICE;
    ncclResult_t result = ncclGroupStart();
    for (size_t i = 0; i < count && result == ncclSuccess; ++i)
        result = nccl_enqueue(mesh, &collectives[i], nccl->device->stream);
    ncclResult_t ended = ncclGroupEnd();
    if (result != ncclSuccess || (ended != ncclSuccess && ended != ncclInProgress))
        return *message = "NCCL refused the mesh's collectives", UFORM_DEVICE;
    if (ended == ncclInProgress) {
        nccl->phase = NCCL_ENQUEUING;
        return UFORM_OK;
    }
    return nccl_record(nccl, message);
}

uform_status_t mesh_nccl_test(uform_mesh_t *mesh, bool *done, char const **message) {
    mesh_nccl_t *nccl = mesh->nccl;
    bool settled = false;
    *done = false;
    uform_status_t status = nccl_settled(nccl, &settled, message);
    if (status != UFORM_OK || !settled) return status;
    if (nccl->phase == NCCL_ENQUEUING) return nccl_record(nccl, message);
    if (vram_event_done(nccl->done, done) != UFORM_OK)
        return *message = "a collective of the mesh failed on the device", UFORM_DEVICE;
    if (*done) nccl->phase = NCCL_READY;
    return UFORM_OK;
}

void mesh_nccl_abort(uform_mesh_t *mesh) {
    mesh_nccl_t *nccl = mesh->nccl;
    if (!nccl || nccl->aborted || !nccl->comm) return;
    nccl->aborted = true;
    vram_use(nccl->device);
    ncclCommAbort(nccl->comm);
    nccl->comm = NULL;
}

void mesh_nccl_release(uform_mesh_t *mesh) {
    mesh_nccl_t *nccl = mesh->nccl;
    if (!nccl) return;
    if (nccl->comm && vram_use(nccl->device) == UFORM_OK) {
        bool ready = nccl->phase == NCCL_READY;
        if (!ready)
            ncclCommAbort(nccl->comm); /* something in flight or never started: do not wait */
        else
            ncclCommDestroy(nccl->comm);
    }
    if (nccl->done) cudaEventDestroy(nccl->done);
    cudaGetLastError();
    free(nccl);
    mesh->nccl = NULL;
}

#endif /* UFORM_WITH_NCCL && UFORM_WITH_MPI */
