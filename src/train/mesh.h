/* Meshes (include/uform.h): the processes of one run, joined through MPI (Open MPI), and the
 * non-blocking collectives a trainer's step posts and the executor's loop progresses (mesh.c). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"

#if UFORM_WITH_MPI
#include <mpi.h>
typedef MPI_Request mesh_request_t;
#else
typedef int mesh_request_t;
#endif

struct uform_mesh {
#if UFORM_WITH_MPI
    MPI_Comm comm; /* a duplicate of the joined communicator, errors returned rather than fatal */
#endif
    size_t rank, size;
};

/* Every process's `count` uint64 values into all [size * count], in rank order. */
uform_status_t mesh_allgather_u64(uform_mesh_t *mesh, uint64_t const *local, size_t count, uint64_t *all,
                                  mesh_request_t *request);
/* Every process's doubles into all, process p's `counts[p]` at `displacements[p]`. */
uform_status_t mesh_allgatherv_f64(uform_mesh_t *mesh, double const *local, size_t count, double *all,
                                   int const *counts, int const *displacements, mesh_request_t *request);
/* In place: the sum over the processes. */
uform_status_t mesh_allreduce_f32(uform_mesh_t *mesh, float *values, size_t count, mesh_request_t *request);
uform_status_t mesh_allreduce_f64(uform_mesh_t *mesh, double *values, size_t count, mesh_request_t *request);
/* Whether a posted operation is complete (UFORM_OK with *done), or its failure (UFORM_IO). */
uform_status_t mesh_test(mesh_request_t *request, bool *done);
