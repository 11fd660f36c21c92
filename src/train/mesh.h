/* Meshes (include/uform.h): the processes of one run, joined through MPI (Open MPI), and the
 * non-blocking collectives a trainer's step posts and the executor's loop progresses (mesh.c).
 *
 * Over RAM executors the collectives are MPI's on host memory. Over VRAM executors they are on device
 * memory, by one of two roads chosen at bootstrap, the same on every process (mesh_choose):
 *   NCCL     a non-blocking communicator (mesh_nccl.c): a step's collectives enqueued on the trainer's
 *            stream in one group, an event recorded after them and polled;
 *   staged   through pinned host memory (mesh_staged.c): device to host, MPI's non-blocking collective,
 *            host to device, each copy followed by a mark the loop polls; the device's copies and marks
 *            go through mesh_device_ops_t, which tests replace by host copies.
 * Every collective of a VRAM mesh, the counts' exchange over MPI included, has the mesh's timeout: one
 * not complete within it breaks the mesh (mesh_break: NCCL's communicator aborted), ends the step with
 * UFORM_DEVICE, and the mesh refuses every later step, saying why. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"

#if UFORM_WITH_MPI
#include <mpi.h>
#endif

/* One MPI request of a step, and when it was posted (for the mesh's timeout). */
typedef struct mesh_request {
#if UFORM_WITH_MPI
    MPI_Request mpi;
#endif
    uint64_t posted_ns;
} mesh_request_t;

/* Where a VRAM mesh copies and what it waits on: the trainer's device (mesh_device.c), or a test's host
 * memory. Each answers 0 on success. */
typedef struct mesh_device_ops {
    /* Enqueues a copy of `bytes` between device memory and `host` (pinned) memory. */
    int (*copy)(void *context, void *to, void const *from, size_t bytes, bool to_host);
    /* Records a mark after everything enqueued so far; `reached` says whether the device passed the last
     * one (non-zero: a device fault). */
    int (*mark)(void *context);
    int (*reached)(void *context, bool *done);
    /* Pinned host memory, and its release. */
    void *(*pin)(void *context, size_t bytes);
    void (*unpin)(void *context, void *memory);
} mesh_device_ops_t;

typedef enum mesh_scalar { MESH_F32, MESH_F64 } mesh_scalar_t;

typedef enum mesh_operation {
    MESH_ALLREDUCE,  /* device[count]: the sum over the processes, in place */
    MESH_ALLGATHERV, /* device[sum of counts]: process p's counts[p] scalars of `local` at their offset */
} mesh_operation_t;

/* One device collective of a step. */
typedef struct mesh_collective {
    mesh_operation_t operation;
    mesh_scalar_t scalar;
    void *device;
    void const *local;    /* allgatherv: this process's scalars, device memory */
    size_t count;         /* allreduce: scalars */
    size_t const *counts; /* allgatherv: [size] scalars of each process */
} mesh_collective_t;

#define MESH_COLLECTIVES 2 /* posted together, at most */

/* The staged road's state (mesh_staged.c). */
typedef enum staged_phase { STAGED_IDLE, STAGED_OUT, STAGED_REDUCING, STAGED_IN } staged_phase_t;

typedef struct mesh_staged {
    staged_phase_t phase;
    mesh_collective_t posted[MESH_COLLECTIVES];
    size_t count;
    void *pinned[MESH_COLLECTIVES]; /* per collective, grown: what goes out, then what comes back */
    size_t pinned_bytes[MESH_COLLECTIVES];
    int *counts, *displacements; /* [size] for an allgatherv, in scalars */
    mesh_request_t requests[MESH_COLLECTIVES];
} mesh_staged_t;

struct uform_mesh {
#if UFORM_WITH_MPI
    MPI_Comm comm; /* a duplicate of the joined communicator, errors returned rather than fatal */
#endif
    size_t rank, size, local_rank, local_size;
    uform_mesh_collectives_t collectives;
    bool shared_device; /* some processes of a VRAM mesh share a device */
    uform_executor_t *executor;
    size_t device_index; /* of the executor's devices: the one this process's VRAM trainer steps on */
    int ordinal;         /* its CUDA ordinal; -1 over a RAM executor */
    uint64_t timeout_ns; /* VRAM meshes; 0 over RAM executors: MPI's own waiting */
    char const *broken;  /* why the mesh is unusable, or NULL */
    uint64_t counts_local[3], *counts_all; /* the step's counts' exchange: [3], [size * 3] */
    mesh_device_ops_t const *device_ops;
    void *device_context;
    uint64_t posted_ns; /* of the device collectives in flight */
    bool in_flight;
    mesh_staged_t staged;
    void *nccl; /* mesh_nccl.c's state */
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
/* Whether a posted operation is complete (UFORM_OK with *done), or its failure (UFORM_IO); on a VRAM mesh
 * one older than the timeout breaks the mesh (UFORM_DEVICE). */
uform_status_t mesh_test(uform_mesh_t *mesh, mesh_request_t *request, bool *done);

/* Marks the mesh unusable for `why` (a static sentence), aborting NCCL's communicator; later steps are
 * refused with it. Loop thread. */
void mesh_break(uform_mesh_t *mesh, char const *why);

/* UFORM_OK when the mesh may run a step, else UFORM_DEVICE with the reason in *message. */
uform_status_t mesh_usable(uform_mesh_t const *mesh, char const **message);

/* The delay before polling again what was polled `*polls` times without completing (counted here):
 * 10 us, doubling to 1 ms. */
uint64_t mesh_poll_ns(uint64_t *polls);

/* ---- Device collectives of a VRAM mesh ------------------------------------------------------------ */

/* Posts `count` collectives (at most MESH_COLLECTIVES) over the mesh's road, after the device work
 * enqueued so far: UFORM_OK, or UFORM_DEVICE / UFORM_IO / UFORM_OUT_OF_MEMORY with *message. One batch
 * is in flight at a time. */
uform_status_t mesh_device_post(uform_mesh_t *mesh, mesh_collective_t const *collectives, size_t count,
                                char const **message);
/* Whether the batch posted is complete; past the timeout it breaks the mesh (UFORM_DEVICE). */
uform_status_t mesh_device_test(uform_mesh_t *mesh, bool *done, char const **message);

/* The staged road (mesh_staged.c): the same two, and the release of its pinned buffers. */
uform_status_t staged_post(uform_mesh_t *mesh, mesh_collective_t const *collectives, size_t count,
                           char const **message);
uform_status_t staged_test(uform_mesh_t *mesh, bool *done, char const **message);
void staged_release(uform_mesh_t *mesh);

/* ---- The choice ----------------------------------------------------------------------------------- */

/* The road of a VRAM mesh from what its processes found: whether two share a device, the lowest NCCL
 * version any could load (0: one could not), and NCCL_MULTI_RANK_GPU_ENABLE (NULL when unset). NCCL
 * unless some process lacks it, or devices are shared and NCCL is older than 2.30 (its multi-rank mode)
 * or that variable is "0": then staged. */
uform_mesh_collectives_t mesh_choose(bool shared, int nccl_version, char const *multi_rank);

#if UFORM_WITH_MPI
/* A collective over `comm`: every process's device identity (16 bytes: its UUID) and the NCCL version
 * it can load, into the road every process takes (mesh_choose) and whether devices are shared. Blocking.
 * UFORM_OK or UFORM_IO. */
uform_status_t mesh_agree(MPI_Comm comm, uint8_t const identity[16], int nccl_version, char const *multi_rank,
                          uform_mesh_collectives_t *collectives, bool *shared);
#endif

/* ---- The device side (mesh_device.c, mesh_nccl.c; CUDA builds) ------------------------------------ */

/* Binds a VRAM mesh to its executor's device of this process (local rank modulo the executor's
 * devices): its index, ordinal, identity, the NCCL version it can load, and the device ops over that
 * device's stream. UFORM_OK or UFORM_DEVICE. */
uform_status_t mesh_device_bind(uform_mesh_t *mesh, uform_executor_t *executor, uint8_t identity[16],
                                int *nccl_version, char const **message);
void mesh_device_unbind(uform_mesh_t *mesh);

/* NCCL's communicator: started (rank 0's unique id broadcast over MPI, a non-blocking init), then
 * polled until ready. UFORM_OK, UFORM_DEVICE or UFORM_IO with *message. */
uform_status_t mesh_nccl_start(uform_mesh_t *mesh, char const **message);
uform_status_t mesh_nccl_ready(uform_mesh_t *mesh, bool *done, char const **message);
uform_status_t mesh_nccl_post(uform_mesh_t *mesh, mesh_collective_t const *collectives, size_t count,
                              char const **message);
uform_status_t mesh_nccl_test(uform_mesh_t *mesh, bool *done, char const **message);
/* ncclCommAbort, for a broken mesh; ncclCommDestroy, for one freed whole. */
void mesh_nccl_abort(uform_mesh_t *mesh);
void mesh_nccl_release(uform_mesh_t *mesh);
