/* A VRAM mesh's device (mesh.h): the executor's device this process steps on (its local rank modulo the
 * executor's devices), what identifies it to the other processes (its UUID), the NCCL version this
 * process can load (0: none), and the copies and marks of the staged road on that device's stream
 * (copies with cudaMemcpyAsync, marks with an event the loop polls, pinned memory from cudaHostAlloc).
 * Built with CUDA and MPI. */
#include <stdlib.h>

#include "executor.h"
#include "mesh.h"

#if UFORM_WITH_CUDA && UFORM_WITH_MPI
#include "vram.h"
#if UFORM_WITH_NCCL
#include <nccl.h>
#endif

typedef struct mesh_device {
    vram_device_t *device;
    cudaEvent_t mark;
} mesh_device_t;

static int device_copy(void *context, void *to, void const *from, size_t bytes, bool to_host) {
    mesh_device_t *device = context;
    return cudaMemcpyAsync(to, from, bytes, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice,
                           device->device->stream) != cudaSuccess;
}

static int device_mark(void *context) {
    mesh_device_t *device = context;
    return cudaEventRecord(device->mark, device->device->stream) != cudaSuccess;
}

static int device_reached(void *context, bool *done) {
    mesh_device_t *device = context;
    return vram_event_done(device->mark, done) != UFORM_OK;
}

static void *device_pin(void *context, size_t bytes) {
    (void)context;
    void *memory = NULL;
    if (cudaHostAlloc(&memory, bytes, cudaHostAllocPortable) == cudaSuccess) return memory;
    cudaGetLastError();
    return NULL;
}

static void device_unpin(void *context, void *memory) {
    (void)context;
    cudaFreeHost(memory);
}

static mesh_device_ops_t const device_ops = {
    .copy = device_copy,
    .mark = device_mark,
    .reached = device_reached,
    .pin = device_pin,
    .unpin = device_unpin,
};

/* The version of the NCCL this process can open, or 0. */
static int nccl_version_loadable(void) {
#if UFORM_WITH_NCCL
    char const *ignored = NULL;
    int version = 0;
    if (cuda_library_load_nccl(&ignored) && ncclGetVersion(&version) == ncclSuccess) return version;
#endif
    return 0;
}

uform_status_t mesh_device_bind(uform_mesh_t *mesh, uform_executor_t *executor, uint8_t identity[16],
                                int *nccl_version, char const **message) {
    vram_t *vram = vram_of(executor);
    mesh->device_index = mesh->local_rank % vram->count;
    mesh_device_t *device = calloc(1, sizeof *device);
    if (!device) return *message = "cannot allocate the mesh", UFORM_OUT_OF_MEMORY;
    device->device = &vram->devices[mesh->device_index];
    mesh->ordinal = device->device->ordinal;
    mesh->device_context = device;
    mesh->device_ops = &device_ops;
    struct cudaDeviceProp properties;
    if (vram_use(device->device) != UFORM_OK ||
        cudaEventCreateWithFlags(&device->mark, cudaEventDisableTiming) != cudaSuccess ||
        cudaGetDeviceProperties(&properties, mesh->ordinal) != cudaSuccess) {
        cudaGetLastError();
        return *message = "cannot use the mesh's device", UFORM_DEVICE;
    }
    memcpy(identity, properties.uuid.bytes, 16);
    *nccl_version = nccl_version_loadable();
    return UFORM_OK;
}

void mesh_device_unbind(uform_mesh_t *mesh) {
    mesh_device_t *device = mesh->device_context;
    if (!device) return;
    if (device->mark && vram_use(device->device) == UFORM_OK) {
        cudaStreamSynchronize(device->device->stream);
        cudaEventDestroy(device->mark);
    }
    cudaGetLastError();
    staged_release(mesh); /* its pinned buffers, while the ops are there */
    free(device);
    mesh->device_context = NULL;
}

#endif /* UFORM_WITH_CUDA && UFORM_WITH_MPI */
