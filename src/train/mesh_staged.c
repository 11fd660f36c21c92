/* The staged road of a VRAM mesh (mesh.h): device collectives through pinned host memory over MPI, for
 * processes that share a device where the NCCL found cannot, or where some process has no NCCL.
 *
 *   post       each collective's data copied from the device into its pinned buffer (an allreduce's
 *              values; an allgatherv's own part, at its offset in the whole), then a mark:    OUT
 *   OUT        the mark reached: MPI_Iallreduce, or MPI_Iallgatherv, in place on the pinned buffers
 *                                                                                        REDUCING
 *   REDUCING   every request tested complete: the buffers copied back to the device, a mark:  IN
 *   IN         the mark reached: done.                                                    IDLE
 *
 * The device's copies and marks go through the mesh's mesh_device_ops_t (the trainer's stream and an event,
 * mesh_device.c; host copies in tests/train/mesh_staged_test.c). Timeouts are the caller's
 * (mesh_device_test). Built with MPI. */
#include <limits.h>
#include <stdlib.h>

#include "mesh.h"

#if UFORM_WITH_MPI

static size_t scalar_bytes(mesh_scalar_t scalar) {
    return scalar == MESH_F32 ? sizeof(float) : sizeof(double);
}

static MPI_Datatype scalar_type(mesh_scalar_t scalar) {
    return scalar == MESH_F32 ? MPI_FLOAT : MPI_DOUBLE;
}

/* The scalars a collective moves, in all; for an allgatherv, also its counts and offsets in scalars.
 * false when they do not fit MPI's int. */
static bool staged_shape(mesh_staged_t *staged, size_t size, mesh_collective_t const *collective,
                         size_t *scalars) {
    if (collective->operation == MESH_ALLREDUCE) return (*scalars = collective->count) <= INT_MAX;
    *scalars = 0;
    for (size_t p = 0; p < size; ++p) {
        if (collective->counts[p] > INT_MAX || *scalars > INT_MAX) return false;
        staged->counts[p] = (int)collective->counts[p];
        staged->displacements[p] = (int)*scalars;
        *scalars += collective->counts[p];
    }
    return *scalars <= INT_MAX;
}

/* Collective i's pinned buffer, grown to `bytes`. */
static void *staged_buffer(uform_mesh_t *mesh, size_t i, size_t bytes) {
    mesh_staged_t *staged = &mesh->staged;
    if (staged->pinned_bytes[i] >= bytes && staged->pinned[i]) return staged->pinned[i];
    if (staged->pinned[i]) mesh->device_ops->unpin(mesh->device_context, staged->pinned[i]);
    staged->pinned_bytes[i] = 0;
    if (!(staged->pinned[i] = mesh->device_ops->pin(mesh->device_context, bytes ? bytes : 1))) return NULL;
    staged->pinned_bytes[i] = bytes;
    return staged->pinned[i];
}

/* Collective i's data, out to its pinned buffer. */
static uform_status_t staged_out(uform_mesh_t *mesh, size_t i, char const **message) {
    mesh_staged_t *staged = &mesh->staged;
    mesh_collective_t const *collective = &staged->posted[i];
    size_t scalars = 0, unit = scalar_bytes(collective->scalar);
    if (!staged_shape(staged, mesh->size, collective, &scalars))
        return *message = "a collective of the mesh exceeds MPI's counts", UFORM_INVALID_ARGUMENT;
    char *pinned = staged_buffer(mesh, i, scalars * unit);
    if (!pinned) return *message = "cannot allocate the mesh's pinned staging", UFORM_OUT_OF_MEMORY;
    bool gather = collective->operation == MESH_ALLGATHERV;
    void const *from = gather ? collective->local : collective->device;
    size_t at = gather ? (size_t)staged->displacements[mesh->rank] * unit : 0;
    size_t bytes = gather ? collective->counts[mesh->rank] * unit : scalars * unit;
    if (mesh->device_ops->copy(mesh->device_context, pinned + at, from, bytes, true))
        return *message = "cannot copy a collective's data from the device", UFORM_DEVICE;
    return UFORM_OK;
}

uform_status_t staged_post(uform_mesh_t *mesh, mesh_collective_t const *collectives, size_t count,
                           char const **message) {
    mesh_staged_t *staged = &mesh->staged;
    if (!staged->counts && (!(staged->counts = malloc(mesh->size * sizeof(int))) ||
                            !(staged->displacements = malloc(mesh->size * sizeof(int)))))
        return *message = "cannot allocate the mesh's staging", UFORM_OUT_OF_MEMORY;
    staged->count = count;
    uform_status_t status = UFORM_OK;
    for (size_t i = 0; i < count && status == UFORM_OK; ++i) {
        staged->posted[i] = collectives[i];
        status = staged_out(mesh, i, message);
    }
    if (status == UFORM_OK && mesh->device_ops->mark(mesh->device_context))
        status = (*message = "cannot record a mark on the device", UFORM_DEVICE);
    staged->phase = status == UFORM_OK ? STAGED_OUT : STAGED_IDLE;
    return status;
}

/* Collective i's MPI request, in place on its pinned buffer. */
static int staged_reduce(uform_mesh_t *mesh, size_t i) {
    mesh_staged_t *staged = &mesh->staged;
    mesh_collective_t const *collective = &staged->posted[i];
    MPI_Request *request = &staged->requests[i].mpi;
    MPI_Datatype type = scalar_type(collective->scalar);
    size_t scalars = 0;
    staged_shape(staged, mesh->size, collective, &scalars); /* checked at the post */
    if (collective->operation == MESH_ALLREDUCE)
        return MPI_Iallreduce(MPI_IN_PLACE, staged->pinned[i], (int)scalars, type, MPI_SUM, mesh->comm,
                              request);
    return MPI_Iallgatherv(MPI_IN_PLACE, 0, type, staged->pinned[i], staged->counts, staged->displacements,
                           type, mesh->comm, request);
}

/* Collective i's result, back to the device. */
static int staged_in(uform_mesh_t *mesh, size_t i) {
    mesh_staged_t *staged = &mesh->staged;
    mesh_collective_t const *collective = &staged->posted[i];
    size_t scalars = 0;
    staged_shape(staged, mesh->size, collective, &scalars);
    return mesh->device_ops->copy(mesh->device_context, collective->device, staged->pinned[i],
                                  scalars * scalar_bytes(collective->scalar), false);
}

/* Whether every request posted is complete (each becomes MPI_REQUEST_NULL, which tests complete). */
static uform_status_t staged_reduced(mesh_staged_t *staged, bool *done) {
    *done = true;
    for (size_t i = 0; i < staged->count; ++i) {
        int flag = 0;
        if (MPI_Test(&staged->requests[i].mpi, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) return UFORM_IO;
        *done = *done && flag;
    }
    return UFORM_OK;
}

/* The next phase, once the last one's work is complete. */
static uform_status_t staged_advance(uform_mesh_t *mesh, bool *done, char const **message) {
    mesh_staged_t *staged = &mesh->staged;
    *done = false;
    if (staged->phase == STAGED_OUT) {
        for (size_t i = 0; i < staged->count; ++i)
            if (staged_reduce(mesh, i) != MPI_SUCCESS)
                return *message = "posting a collective over MPI failed", UFORM_IO;
        staged->phase = STAGED_REDUCING;
        return UFORM_OK;
    }
    if (staged->phase == STAGED_REDUCING) {
        for (size_t i = 0; i < staged->count; ++i)
            if (staged_in(mesh, i))
                return *message = "cannot copy a collective's result to the device", UFORM_DEVICE;
        if (mesh->device_ops->mark(mesh->device_context))
            return *message = "cannot record a mark on the device", UFORM_DEVICE;
        staged->phase = STAGED_IN;
        return UFORM_OK;
    }
    staged->phase = STAGED_IDLE;
    *done = true;
    return UFORM_OK;
}

uform_status_t staged_test(uform_mesh_t *mesh, bool *done, char const **message) {
    mesh_staged_t *staged = &mesh->staged;
    *done = staged->phase == STAGED_IDLE;
    while (!*done) {
        bool complete = false;
        if (staged->phase == STAGED_REDUCING) {
            if (staged_reduced(staged, &complete) != UFORM_OK)
                return *message = "a collective of the mesh failed", UFORM_IO;
        } else if (mesh->device_ops->reached(mesh->device_context, &complete)) {
            staged->phase = STAGED_IDLE;
            return *message = "a device operation of the mesh's staging failed", UFORM_DEVICE;
        }
        if (!complete) return UFORM_OK;
        uform_status_t status = staged_advance(mesh, done, message);
        if (status != UFORM_OK) {
            staged->phase = STAGED_IDLE;
            return status;
        }
    }
    return UFORM_OK;
}

void staged_release(uform_mesh_t *mesh) {
    mesh_staged_t *staged = &mesh->staged;
    for (size_t i = 0; i < MESH_COLLECTIVES; ++i)
        if (staged->pinned[i]) mesh->device_ops->unpin(mesh->device_context, staged->pinned[i]);
    free(staged->counts);
    free(staged->displacements);
    *staged = (mesh_staged_t){0};
}

#endif /* UFORM_WITH_MPI */
