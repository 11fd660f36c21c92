/* VRAM executors: devices, streams, memory, events; models' weights on devices (each tower's tensors as
 * the checkpoint schema walks them); the tower forward on a
 * device through kernels/cuda. See vram.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "executor.h"
#include "kernels.h"
#include "model.h"
#include "variant.h"
#include "vram.h"
#include "vram_support.h"

#if UFORM_WITH_CUDA

/* ---- Devices ------------------------------------------------------------------------------------ */

uform_status_t vram_use(vram_device_t const *device) {
    return cudaSetDevice(device->ordinal) == cudaSuccess ? UFORM_OK : UFORM_DEVICE;
}

/* The CUDA libraries loaded, and how many devices the driver sees. */
static uform_status_t vram_devices(int *count, char const **message) {
    if (!cuda_library_load(message)) return UFORM_DEVICE;
    cudaError_t error = cudaGetDeviceCount(count);
    cudaGetLastError(); /* an error is reported here; leave none sticky for the caller */
    if (error == cudaErrorInsufficientDriver)
        return *message = "the NVIDIA driver is older than the CUDA runtime the engine was built with",
               UFORM_DEVICE;
    if (error == cudaErrorNoDevice || (error == cudaSuccess && *count <= 0))
        return *message = "no CUDA device is present", UFORM_DEVICE;
    if (error != cudaSuccess) return *message = "the CUDA runtime cannot start on this machine", UFORM_DEVICE;
    return UFORM_OK;
}

/* A device's stream, events and cuBLASLt handle (the device current). */
static uform_status_t vram_device_open(vram_device_t *device, char const **message) {
    if (cudaSetDevice(device->ordinal) != cudaSuccess ||
        cudaStreamCreateWithFlags(&device->stream, cudaStreamNonBlocking) != cudaSuccess)
        return *message = "cannot create a stream on the device", UFORM_DEVICE;
    for (size_t s = 0; s < VRAM_SLOTS; ++s)
        if (cudaEventCreateWithFlags(&device->slots[s].done, cudaEventDisableTiming) != cudaSuccess ||
            cudaEventCreateWithFlags(&device->slots[s].copied, cudaEventDisableTiming) != cudaSuccess)
            return *message = "cannot create an event on the device", UFORM_DEVICE;
    if (cuda_gemm_create(&device->gemm, device->stream) != cudaSuccess)
        return *message = "cannot create the cuBLASLt handle", UFORM_DEVICE;
    return UFORM_OK;
}

/* Every other device copies straight into the first's memory where the two can (chunks' outputs land in
 * the arena there); where they cannot, cudaMemcpyPeerAsync goes through the host. */
static void vram_peers(vram_t *vram) {
    for (size_t d = 1; d < vram->count; ++d) {
        int can = 0;
        if (cudaDeviceCanAccessPeer(&can, vram->devices[d].ordinal, vram->devices[0].ordinal) ==
                cudaSuccess &&
            can && cudaSetDevice(vram->devices[d].ordinal) == cudaSuccess)
            cudaDeviceEnablePeerAccess(vram->devices[0].ordinal, 0); /* enabled already: no matter */
        cudaGetLastError();
    }
}

uform_status_t vram_open(uform_executor_t *executor, uform_vram_options_t const *options,
                         char const **message) {
    int count = 0;
    uform_status_t status = vram_devices(&count, message);
    if (status != UFORM_OK) return status;
    size_t wanted = options && options->devices_count ? options->devices_count : 1;
    for (size_t i = 0; options && i < options->devices_count; ++i)
        if (options->devices[i] >= (size_t)count) return *message = "no such CUDA device", UFORM_DEVICE;
    vram_t *vram = calloc(1, sizeof *vram);
    if (!vram) return *message = "cannot allocate the executor", UFORM_OUT_OF_MEMORY;
    executor->state = vram;
    int previous = 0;
    cudaGetDevice(&previous);
    for (size_t i = 0; i < wanted && status == UFORM_OK; ++i) {
        vram_device_t *device = &vram->devices[i];
        device->ordinal = options && options->devices_count ? (int)options->devices[i] : 0;
        vram->count = i + 1; /* vram_close frees what was made, also after a partial open */
        status = vram_device_open(device, message);
    }
    if (status == UFORM_OK) vram_peers(vram);
    cudaSetDevice(previous);
    executor->threads = 1;
    return status;
}

void vram_close(uform_executor_t *executor) {
    vram_t *vram = vram_of(executor);
    if (vram->workers) uform_executor_free(vram->workers);
    for (size_t i = 0; i < vram->count; ++i) {
        vram_device_t *device = &vram->devices[i];
        if (vram_use(device) != UFORM_OK) continue;
        if (device->stream) cudaStreamSynchronize(device->stream);
        if (device->gemm) cuda_gemm_destroy(device->gemm);
        cudaFree(device->scratch);
        for (size_t s = 0; s < VRAM_SLOTS; ++s) {
            cudaFreeHost(device->slots[s].staging);
            if (device->slots[s].done) cudaEventDestroy(device->slots[s].done);
            if (device->slots[s].copied) cudaEventDestroy(device->slots[s].copied);
        }
        if (device->stream) cudaStreamDestroy(device->stream);
    }
    cudaFreeHost(vram->pinned);
    free(vram);
    executor->state = NULL;
}

void *vram_host_allocate(uform_executor_t *executor, size_t bytes) {
    vram_t *vram = vram_of(executor);
    void *memory = NULL;
    if (vram->pinned_lent || bytes <= vram->pinned_bytes) {
        if (!vram->pinned_lent) return vram->pinned_lent = true, vram->pinned;
        return cudaHostAlloc(&memory, bytes ? bytes : 1, cudaHostAllocPortable) == cudaSuccess ? memory
                                                                                               : NULL;
    }
    cudaFreeHost(vram->pinned);
    vram->pinned = NULL, vram->pinned_bytes = 0;
    if (cudaHostAlloc(&memory, bytes, cudaHostAllocPortable) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    vram->pinned = memory, vram->pinned_bytes = bytes, vram->pinned_lent = true;
    return memory;
}

void vram_host_deallocate(uform_executor_t *executor, void *memory, size_t bytes) {
    (void)bytes;
    vram_t *vram = vram_of(executor);
    if (memory && memory == vram->pinned)
        vram->pinned_lent = false;
    else
        cudaFreeHost(memory);
}

uform_executor_t *vram_workers(uform_executor_t *executor, char const **message) {
    vram_t *vram = vram_of(executor);
    if (vram->workers) return vram->workers;
    uform_ram_options_t options = uform_ram_options_default();
    options.pin = false;
    if (uform_executor_create_ram(&options, &vram->workers) != UFORM_OK) {
        vram->workers = NULL;
        *message = "cannot start the executor's host threads";
    }
    return vram->workers;
}

void *vram_allocate(uform_executor_t *executor, size_t bytes) {
    int previous = 0;
    cudaGetDevice(&previous);
    void *memory = NULL;
    if (vram_use(&vram_of(executor)->devices[0]) != UFORM_OK ||
        cudaMalloc(&memory, bytes ? bytes : 1) != cudaSuccess)
        memory = NULL;
    cudaGetLastError();
    cudaSetDevice(previous);
    return memory;
}

void vram_deallocate(uform_executor_t *executor, void *memory) {
    if (!memory) return;
    int previous = 0;
    cudaGetDevice(&previous);
    vram_use(&vram_of(executor)->devices[0]);
    cudaFree(memory);
    cudaSetDevice(previous);
}

uform_status_t vram_copy_to_host(uform_executor_t *executor, void *host, size_t host_pitch,
                                 void const *device, size_t device_pitch, size_t width, size_t rows) {
    int previous = 0;
    cudaGetDevice(&previous);
    bool ok = vram_use(&vram_of(executor)->devices[0]) == UFORM_OK &&
              cudaMemcpy2D(host, host_pitch, device, device_pitch, width, rows, cudaMemcpyDeviceToHost) ==
                  cudaSuccess;
    cudaGetLastError();
    cudaSetDevice(previous);
    return ok ? UFORM_OK : UFORM_DEVICE;
}

void *vram_scratch(vram_device_t *device, size_t bytes) {
    if (device->scratch_bytes >= bytes) return device->scratch;
    cudaStreamSynchronize(device->stream); /* work in flight may still use the old scratch */
    cudaFree(device->scratch);
    device->scratch = NULL;
    device->scratch_bytes = 0;
    size_t grown = bytes + bytes / 4;
    if (cudaMalloc(&device->scratch, grown) != cudaSuccess) {
        cudaGetLastError();
        device->scratch = NULL;
        return NULL;
    }
    device->scratch_bytes = grown;
    return device->scratch;
}

void *vram_staging(vram_slot_t *slot, size_t bytes) {
    if (slot->staging_bytes >= bytes) return slot->staging;
    cudaFreeHost(slot->staging);
    slot->staging = NULL;
    slot->staging_bytes = 0;
    size_t grown = bytes + bytes / 4;
    if (cudaHostAlloc(&slot->staging, grown, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError();
        slot->staging = NULL;
        return NULL;
    }
    slot->staging_bytes = grown;
    return slot->staging;
}

uform_status_t vram_event_done(cudaEvent_t event, bool *done) {
    cudaError_t error = cudaEventQuery(event);
    *done = error == cudaSuccess;
    if (error == cudaSuccess || error == cudaErrorNotReady) return UFORM_OK;
    cudaGetLastError();
    return UFORM_DEVICE;
}

uint64_t vram_poll_ns(uint64_t elapsed_ns) {
    uint64_t period = elapsed_ns / 16;
    if (period < 5000) period = 5000;
    if (period > 200000) period = 200000;
    return period;
}

/* ---- Host memory -------------------------------------------------------------------------------- */

vram_memory_t vram_memory_of(cudaError_t error, struct cudaPointerAttributes const *attributes) {
    if (error != cudaSuccess) return VRAM_PAGEABLE;
    switch (attributes->type) {
    case cudaMemoryTypeHost:
        return VRAM_PINNED;
    case cudaMemoryTypeDevice:
        return VRAM_ON_DEVICE;
    case cudaMemoryTypeManaged:
        return VRAM_MANAGED;
    default:
        return VRAM_PAGEABLE;
    }
}

vram_memory_t vram_memory(void const *pointer) {
    struct cudaPointerAttributes attributes;
    memset(&attributes, 0, sizeof attributes);
    if (!pointer) return VRAM_PAGEABLE;
    cudaError_t error = cudaPointerGetAttributes(&attributes, pointer);
    cudaGetLastError();
    return vram_memory_of(error, &attributes);
}

typedef struct copy_job {
    unsigned char *to;
    unsigned char const *from;
    size_t bytes, threads;
} copy_job_t;

static void copy_share(void *context, size_t thread) {
    copy_job_t const *job = context;
    size_t first, last;
    thread_share(job->bytes, thread, job->threads, &first, &last);
    memcpy(job->to + first, job->from + first, last - first);
}

void vram_copy(uform_executor_t *executor, void *to, void const *from, size_t bytes) {
    char const *ignored = NULL;
    uform_executor_t *workers = bytes >= ((size_t)1 << 20) ? vram_workers(executor, &ignored) : NULL;
    if (!workers) {
        memcpy(to, from, bytes);
        return;
    }
    copy_job_t job = {to, from, bytes, executor_fork_threads(workers)};
    executor_for_threads(workers, copy_share, &job);
}

/* ---- Chunks in flight ---------------------------------------------------------------------------- */

vram_flight_t *vram_flights_next(vram_t *vram, bool *free) {
    size_t device, slot;
    vram_place(vram->flights.issued, vram->count, &device, &slot);
    vram_flight_t *flight = &vram->flights.slots[device][slot];
    *free = !flight->busy && !flight->copying;
    return flight;
}

void vram_flights_issue(vram_t *vram, size_t first, size_t last) {
    bool free = false;
    vram_flight_t *flight = vram_flights_next(vram, &free);
    *flight = (vram_flight_t){
        .chunk = vram->flights.issued++, .first = first, .last = last, .busy = true, .copying = true};
}

/* One event of a flight: *pending cleared once it completed; false on a fault. */
static bool flight_event(cudaEvent_t event, bool *pending) {
    bool done = false;
    if (!*pending) return true;
    if (vram_event_done(event, &done) != UFORM_OK) return false;
    *pending = !done;
    return true;
}

uform_status_t vram_flights_sweep(vram_t *vram, void (*done)(void *context, vram_flight_t const *flight),
                                  void *context, char const **message) {
    uform_status_t status = UFORM_OK;
    for (size_t d = 0; d < vram->count; ++d)
        for (size_t s = 0; s < VRAM_SLOTS; ++s) {
            vram_flight_t *flight = &vram->flights.slots[d][s];
            vram_slot_t const *slot = &vram->devices[d].slots[s];
            bool was_busy = flight->busy;
            if (!flight_event(slot->copied, &flight->copying) || !flight_event(slot->done, &flight->busy)) {
                flight->busy = flight->copying = false;
                status = UFORM_DEVICE;
                *message = "a device operation failed";
                continue;
            }
            if (was_busy && !flight->busy && done) done(context, flight);
        }
    return status;
}

void vram_flights_sweep_encode(vram_t *vram, encode_call_t *encode,
                               void (*done)(void *context, vram_flight_t const *flight), void *context) {
    char const *message = NULL;
    if (vram_flights_sweep(vram, done, context, &message) != UFORM_OK)
        encode_stop(encode, UFORM_DEVICE, message);
}

bool vram_flights_busy(vram_t const *vram, bool copied) {
    for (size_t d = 0; d < vram->count; ++d)
        for (size_t s = 0; s < VRAM_SLOTS; ++s)
            if (copied ? vram->flights.slots[d][s].copying : vram->flights.slots[d][s].busy) return true;
    return false;
}

vram_flight_t *vram_flights_of(vram_t *vram, size_t chunk) {
    size_t device, slot;
    vram_place(chunk, vram->count, &device, &slot);
    vram_flight_t *flight = &vram->flights.slots[device][slot];
    return flight->chunk == chunk ? flight : NULL;
}

/* ---- Weights on devices ------------------------------------------------------------------------- */

/* Carves one device allocation: a sizing pass (base 0) measures it, a second pass fills it. */
typedef struct carve {
    uintptr_t base; /* 0 while sizing */
    size_t used;
    uint8_t const *raw; /* the checkpoint's data section on the device */
    checkpoint_header_t const *header;
    cudaStream_t stream;
    bool failed;
} carve_t;

static void *carve_take(carve_t *carve, size_t bytes) {
    size_t at = (carve->used + 255) & ~(size_t)255;
    carve->used = at + bytes;
    return (void *)(carve->base + at);
}

static checkpoint_tensor_t const *carve_tensor(carve_t *carve, char const *name, size_t count) {
    checkpoint_tensor_t const *tensor = checkpoint_find(carve->header, name);
    if (!tensor || tensor->dtype != CHECKPOINT_BF16 || tensor->end - tensor->begin != count * 2) {
        carve->failed = true;
        return NULL;
    }
    return tensor;
}

static uint16_t const *carve_bf16(carve_t *carve, char const *name, size_t count) {
    checkpoint_tensor_t const *tensor = carve_tensor(carve, name, count);
    void *target = carve_take(carve, count * 2);
    if (carve->base && tensor &&
        cudaMemcpyAsync(target, carve->raw + tensor->begin, count * 2, cudaMemcpyDeviceToDevice,
                        carve->stream) != cudaSuccess)
        carve->failed = true;
    return target;
}

static float const *carve_f32(carve_t *carve, char const *name, size_t count) {
    checkpoint_tensor_t const *tensor = carve_tensor(carve, name, count);
    float *target = carve_take(carve, count * sizeof(float));
    if (carve->base && tensor &&
        cuda_bf16_to_f32(target, (uint16_t const *)(carve->raw + tensor->begin), count, carve->stream) !=
            cudaSuccess)
        carve->failed = true;
    return target;
}

/* The bias by relative position: text.relative_bias [buckets, heads] (BF16, at `name`) read back to the
 * host, where each head's table over the distances of items of up to `rows` rows, -(rows - 1) .. rows - 1,
 * is made by variant_relative_bucket as the host path makes it, then copied into its place: F32 [heads][2
 * rows - 1]. Synchronous on the carve's stream. */
static void carve_relative(carve_t *carve, vram_tower_t *tower, char const *name, size_t buckets,
                           size_t heads, size_t rows) {
    checkpoint_tensor_t const *tensor = carve_tensor(carve, name, buckets * heads);
    if (buckets != VARIANT_RELATIVE_BUCKETS || rows == 0) {
        carve->failed = true;
        return;
    }
    size_t const span = 2 * rows - 1;
    float *table = carve_take(carve, heads * span * sizeof(float));
    tower->relative = carve->base ? table + (rows - 1) : NULL; /* head 0's distance 0 */
    tower->relative_stride = span;
    tower->relative_rows = rows;
    if (!carve->base || !tensor || carve->failed) return;
    uint16_t *weights = malloc(buckets * heads * sizeof *weights);
    float *host = malloc(heads * span * sizeof *host);
    bool ok = weights && host &&
              cudaMemcpyAsync(weights, carve->raw + tensor->begin, buckets * heads * sizeof *weights,
                              cudaMemcpyDeviceToHost, carve->stream) == cudaSuccess &&
              cudaStreamSynchronize(carve->stream) == cudaSuccess;
    if (ok) {
        for (size_t at = 0; at < span; ++at) {
            uint16_t const *row = weights + variant_relative_bucket((long)at - (long)(rows - 1)) * heads;
            for (size_t h = 0; h < heads; ++h)
                host[h * span + at] = bf16_to_f32(row[h]);
        }
        ok = cudaMemcpyAsync(table, host, heads * span * sizeof *host, cudaMemcpyHostToDevice,
                             carve->stream) == cudaSuccess &&
             cudaStreamSynchronize(carve->stream) == cudaSuccess;
    }
    if (!ok) {
        cudaGetLastError();
        carve->failed = true;
    }
    free(weights);
    free(host);
}

typedef struct carve_walk {
    carve_t *carve;
    vram_tower_t *tower;
    size_t rows; /* the most rows of an item: a text tower's context */
} carve_walk_t;

/* One tensor of the tower's schema into its place: matrices BF16 as stored, vectors F32. */
static int carve_visit(checkpoint_schema_tensor_t const *tensor, void *context) {
    carve_walk_t const *walk = context;
    carve_t *carve = walk->carve;
    vram_tower_t *tower = walk->tower;
    vram_block_t *block = &tower->blocks[tensor->block];
    size_t const n = (size_t)tensor->shape[0], k = tensor->rank == 2 ? (size_t)tensor->shape[1] : 1;
    vram_linear_t *layers[] = {
        [CHECKPOINT_PART_QKV_WEIGHT] = &block->qkv,
        [CHECKPOINT_PART_OUT_WEIGHT] = &block->out,
        [CHECKPOINT_PART_UP_WEIGHT] = &block->up,
        [CHECKPOINT_PART_DOWN_WEIGHT] = &block->down,
        [CHECKPOINT_PART_PROJ] = &tower->proj,
        [CHECKPOINT_PART_PATCH_WEIGHT] = &tower->patch,
        [CHECKPOINT_PART_HEAD_QKV_WEIGHT] = &tower->head_qkv,
        [CHECKPOINT_PART_HEAD_OUT_WEIGHT] = &tower->head_out,
        [CHECKPOINT_PART_HEAD_UP_WEIGHT] = &tower->head_up,
        [CHECKPOINT_PART_HEAD_DOWN_WEIGHT] = &tower->head_down,
    };
    float const **vectors[] = {
        [CHECKPOINT_PART_NORM1] = &block->norm1,
        [CHECKPOINT_PART_NORM2] = &block->norm2,
        [CHECKPOINT_PART_QKV_BIAS] = &block->qkv.bias,
        [CHECKPOINT_PART_OUT_BIAS] = &block->out.bias,
        [CHECKPOINT_PART_UP_BIAS] = &block->up.bias,
        [CHECKPOINT_PART_DOWN_BIAS] = &block->down.bias,
        [CHECKPOINT_PART_NORM] = &tower->norm,
        [CHECKPOINT_PART_PATCH_BIAS] = &tower->patch.bias,
        [CHECKPOINT_PART_CLS] = &tower->cls,
        [CHECKPOINT_PART_NORM1_BIAS] = &block->norm1_bias,
        [CHECKPOINT_PART_NORM2_BIAS] = &block->norm2_bias,
        [CHECKPOINT_PART_NORM_BIAS] = &tower->norm_bias,
        [CHECKPOINT_PART_INPUT_NORM] = &tower->input_norm,
        [CHECKPOINT_PART_INPUT_NORM_BIAS] = &tower->input_norm_bias,
        [CHECKPOINT_PART_TOKEN_TYPE] = &tower->token_type,
        [CHECKPOINT_PART_PROJ_BIAS] = &tower->proj.bias,
        [CHECKPOINT_PART_HEAD_PROBE] = &tower->probe,
        [CHECKPOINT_PART_HEAD_QKV_BIAS] = &tower->head_qkv.bias,
        [CHECKPOINT_PART_HEAD_OUT_BIAS] = &tower->head_out.bias,
        [CHECKPOINT_PART_HEAD_NORM] = &tower->head_norm,
        [CHECKPOINT_PART_HEAD_NORM_BIAS] = &tower->head_norm_bias,
        [CHECKPOINT_PART_HEAD_UP_BIAS] = &tower->head_up.bias,
        [CHECKPOINT_PART_HEAD_DOWN_BIAS] = &tower->head_down.bias,
    };
    size_t const part = (size_t)tensor->part;
    vram_linear_t *layer = part < sizeof layers / sizeof layers[0] ? layers[part] : NULL;
    float const **vector = part < sizeof vectors / sizeof vectors[0] ? vectors[part] : NULL;
    if (vector) {
        *vector = carve_f32(carve, tensor->name, n);
    } else if (layer) {
        layer->n = n;
        layer->k = k;
        layer->w = carve_bf16(carve, tensor->name, n * k);
    } else if (tensor->part == CHECKPOINT_PART_EMBED) {
        tower->embed = carve_bf16(carve, tensor->name, n * k);
    } else if (tensor->part == CHECKPOINT_PART_POS || tensor->part == CHECKPOINT_PART_TEXT_POSITIONS) {
        tower->pos = carve_f32(carve, tensor->name, n * k);
        tower->positions = n;
    } else if (tensor->part == CHECKPOINT_PART_RELATIVE_BIAS) {
        carve_relative(carve, tower, tensor->name, n, k, walk->rows);
    } else { /* a part the schema of a tower has not */
        carve->failed = true;
    }
    return 0;
}

/* Tower `name`'s tensors, in the checkpoint schema's order. false when out of host memory. */
static bool carve_tower(carve_t *carve, vram_tower_t *tower, uform_model_info_t const *info, char const *name,
                        uform_transformer_info_t const *transformer) {
    tower->depth = transformer->depth;
    tower->hidden = transformer->hidden;
    tower->heads = transformer->heads;
    tower->mlp = transformer->mlp;
    tower->dims = info->dims;
    tower->settings = *transformer;
    if (!tower->blocks &&
        !(tower->blocks = calloc(transformer->depth ? transformer->depth : 1, sizeof *tower->blocks)))
        return false;
    carve_walk_t walk = {carve, tower, strcmp(name, "text") == 0 ? info->text.context : 0};
    checkpoint_schema_tower(info, name, carve_visit, &walk);
    return true;
}

static bool carve_model(carve_t *carve, vram_replica_t *replica, uform_model_info_t const *info) {
    bool ok = true;
    /* Only the towers the device path runs (vram_support.h); the verbs of the others refuse. */
    if ((replica->has_text = info->has_text && !vram_tower_refusal(info, "text")))
        ok = ok && carve_tower(carve, &replica->text, info, "text", &info->text.transformer);
    if ((replica->has_image = info->has_image && !vram_tower_refusal(info, "image")))
        ok = ok && carve_tower(carve, &replica->image, info, "image", &info->image.transformer);
    if ((replica->has_audio = info->has_audio && !vram_tower_refusal(info, "audio")))
        ok = ok && carve_tower(carve, &replica->audio, info, "audio", &info->audio.transformer);
    return ok && !carve->failed;
}

static void replica_release(vram_replica_t *replica) {
    cudaFree(replica->weights);
    free(replica->text.blocks);
    free(replica->image.blocks);
    free(replica->audio.blocks);
    memset(replica, 0, sizeof *replica);
}

uform_status_t vram_model_prepare(uform_model_t *model, uform_executor_t *executor, void *const *raw,
                                  char const **message) {
    vram_t *vram = vram_of(executor);
    struct vram_model *prepared = calloc(1, sizeof *prepared);
    if (!prepared) return *message = "cannot allocate the model", UFORM_OUT_OF_MEMORY;
    model->device = prepared;
    for (size_t d = 0; d < vram->count; ++d) {
        vram_device_t *device = &vram->devices[d];
        vram_replica_t *replica = &prepared->replicas[d];
        prepared->count = d + 1;
        if (vram_use(device) != UFORM_OK) return *message = "cannot use the device", UFORM_DEVICE;
        carve_t carve = {.raw = raw[d], .header = &model->header, .stream = device->stream};
        if (!carve_model(&carve, replica, &model->header.info))
            return *message = "a tower's tensor has an unexpected shape", UFORM_FORMAT;
        if (cudaMalloc(&replica->weights, carve.used) != cudaSuccess) {
            cudaGetLastError();
            replica->weights = NULL;
            return *message = "cannot allocate the weights on the device", UFORM_OUT_OF_MEMORY;
        }
        replica->bytes = carve.used;
        carve = (carve_t){.base = (uintptr_t)replica->weights,
                          .raw = raw[d],
                          .header = &model->header,
                          .stream = device->stream};
        bool ok = carve_model(&carve, replica, &model->header.info);
        if (cudaStreamSynchronize(device->stream) != cudaSuccess || !ok || carve.failed) {
            cudaGetLastError();
            return *message = "cannot prepare the weights on the device", UFORM_DEVICE;
        }
    }
    return UFORM_OK;
}

void vram_model_release(uform_model_t *model) {
    struct vram_model *prepared = model->device;
    if (!prepared) return;
    uform_executor_t *executor = model->executor;
    int previous = 0;
    cudaGetDevice(&previous);
    for (size_t d = 0; d < prepared->count; ++d) {
        if (executor && vram_of(executor)) vram_use(&vram_of(executor)->devices[d]);
        replica_release(&prepared->replicas[d]);
    }
    cudaSetDevice(previous);
    free(prepared);
    model->device = NULL;
}

/* ---- The forward pass --------------------------------------------------------------------------- */

typedef struct forward_layout {
    uint16_t *h;   /* [tokens, hidden]: norm outputs, then attention outputs */
    uint16_t *qkv; /* [tokens, 3 * hidden] */
    uint16_t *mlp; /* [tokens, mlp] */
} forward_layout_t;

static forward_layout_t forward_layout(vram_tower_t const *tower, void *scratch, size_t tokens,
                                       size_t *bytes) {
    size_t h = round_up_256(tokens * tower->hidden * 2);
    size_t qkv = round_up_256(tokens * 3 * tower->hidden * 2);
    size_t mlp = round_up_256(tokens * tower->mlp * 2);
    *bytes = h + qkv + mlp;
    char *base = scratch;
    if (!base) return (forward_layout_t){0};
    return (forward_layout_t){(uint16_t *)base, (uint16_t *)(base + h), (uint16_t *)(base + h + qkv)};
}

size_t vram_forward_scratch(vram_tower_t const *tower, size_t tokens) {
    size_t bytes = 0;
    forward_layout(tower, NULL, tokens, &bytes);
    return bytes;
}

bool vram_chunk_scratch(vram_device_t *device, vram_tower_t const *tower, size_t const *sizes, size_t count,
                        void **parts, size_t tokens, size_t rows, size_t width, vram_pass_t *pass) {
    size_t hidden = tower->hidden;
    size_t pieces[] = {
        round_up_256(tokens * hidden * sizeof(float)), round_up_256(vram_forward_scratch(tower, tokens)),
        round_up_256(rows * hidden * sizeof(float)),   round_up_256(rows * hidden * 2),
        round_up_256(rows * width * sizeof(float)),    round_up_256(rows * width * sizeof(float)),
    };
    size_t total = 0;
    for (size_t i = 0; i < count; ++i)
        total += round_up_256(sizes[i]);
    for (size_t i = 0; i < sizeof pieces / sizeof *pieces; ++i)
        total += pieces[i];
    char *base = vram_scratch(device, total);
    if (!base) return false;
    for (size_t i = 0; i < count; base += round_up_256(sizes[i++]))
        parts[i] = base;
    pass->x = (float *)base;
    pass->forward = base += pieces[0];
    pass->gathered = (float *)(base += pieces[1]);
    pass->gathered_bf16 = (uint16_t *)(base += pieces[2]);
    pass->projected = (float *)(base += pieces[3]);
    pass->pooled = (float *)(base + pieces[4]);
    return true;
}

uform_status_t vram_linear_run(vram_device_t *device, vram_linear_t const *layer, size_t m, uint16_t const *x,
                               void *y, size_t y_stride, cuda_linear_kind_t kind, char const **message) {
    cuda_linear_t job = {
        .m = m,
        .n = layer->n,
        .k = layer->k,
        .x = x,
        .x_stride = layer->k,
        .w = layer->w,
        .bias = layer->bias,
        .y = y,
        .y_stride = y_stride,
        .kind = kind,
    };
    return cuda_linear(device->gemm, &job, message) == cudaSuccess ? UFORM_OK : UFORM_DEVICE;
}

/* A norm of the tower's kind over `rows` rows of x (F32, stride hidden) into y_bf16 and/or y_f32 (either
 * NULL; y_f32 may be x). */
static cudaError_t forward_norm(vram_tower_t const *tower, uint16_t *y_bf16, float *y_f32, float const *x,
                                float const *weight, float const *bias, size_t rows, cudaStream_t stream) {
    size_t hidden = tower->hidden;
    float eps = tower->settings.norm_eps;
    if (tower->settings.norm == UFORM_NORM_LAYER)
        return cuda_layernorm(y_bf16, hidden, y_f32, hidden, x, hidden, weight, bias, rows, hidden, eps,
                              stream);
    return cuda_rmsnorm(y_bf16, hidden, y_f32, hidden, x, hidden, weight, rows, hidden, eps, stream);
}

/* The MLP's first layer fused with the tower's activation. */
static cuda_linear_kind_t forward_activation(vram_tower_t const *tower) {
    switch (tower->settings.activation) {
    case UFORM_ACTIVATION_GELU_ERF:
        return CUDA_LINEAR_GELU_ERF_BF16;
    case UFORM_ACTIVATION_GELU_QUICK:
        return CUDA_LINEAR_GELU_QUICK_BF16;
    default:
        return CUDA_LINEAR_GELU_BF16;
    }
}

/* One block. Pre-norm (the engine's own, CLIP's, SigLIP's):
 *     x += out(attention(qkv(norm1(x))));  x += down(act(up(norm2(x))))
 * post-norm (BERT's), layout.h holding BF16 x on entry (the previous block's norm2 or the input's):
 *     x = norm1(x + out(attention(qkv(x))));  x = norm2(x + down(act(up(x)))), each norm written to x
 *     and, BF16, to layout.h for the next product. */
static uform_status_t forward_block(vram_device_t *device, vram_tower_t const *tower,
                                    vram_block_t const *block, forward_layout_t const *layout, float *x,
                                    size_t tokens, int32_t const *offsets, size_t items, size_t max_length,
                                    bool causal, bool rotary, char const **message) {
    size_t hidden = tower->hidden, head = tower->settings.head;
    bool post = tower->settings.post_norm;
    cudaStream_t stream = device->stream;
    uform_status_t status = UFORM_OK;
    if (!post)
        VRAM_TRY(forward_norm(tower, layout->h, NULL, x, block->norm1, block->norm1_bias, tokens, stream),
                 "cannot launch the norm");
    if ((status = vram_linear_run(device, &block->qkv, tokens, layout->h, layout->qkv, 3 * hidden,
                                  CUDA_LINEAR_BF16, message)) != UFORM_OK)
        return status;
    VRAM_TRY(cuda_attention_heads(layout->h, layout->qkv, offsets, items, tower->heads, head, max_length,
                                  causal, rotary, (float)(1.0 / sqrt((double)head)), tower->relative,
                                  tower->relative_stride, stream),
             "cannot launch attention");
    if ((status = vram_linear_run(device, &block->out, tokens, layout->h, x, hidden, CUDA_LINEAR_RESIDUAL,
                                  message)) != UFORM_OK)
        return status;
    float const *weight = post ? block->norm1 : block->norm2,
                *bias = post ? block->norm1_bias : block->norm2_bias;
    VRAM_TRY(forward_norm(tower, layout->h, post ? x : NULL, x, weight, bias, tokens, stream),
             "cannot launch the norm");
    if ((status = vram_linear_run(device, &block->up, tokens, layout->h, layout->mlp, tower->mlp,
                                  forward_activation(tower), message)) != UFORM_OK)
        return status;
    if ((status = vram_linear_run(device, &block->down, tokens, layout->mlp, x, hidden, CUDA_LINEAR_RESIDUAL,
                                  message)) != UFORM_OK)
        return status;
    if (post)
        VRAM_TRY(forward_norm(tower, layout->h, x, x, block->norm2, block->norm2_bias, tokens, stream),
                 "cannot launch the norm");
    return UFORM_OK;
}

uform_status_t vram_forward(vram_device_t *device, vram_tower_t const *tower, float *x, size_t tokens,
                            int32_t const *offsets, size_t items, size_t max_length, bool causal, bool rotary,
                            void *scratch, char const **message) {
    size_t hidden = tower->hidden, bytes = 0;
    forward_layout_t layout = forward_layout(tower, scratch, tokens, &bytes);
    cudaStream_t stream = device->stream;
    uform_status_t status = UFORM_OK;
    if (tower->relative && max_length > tower->relative_rows)
        return *message = "an item is longer than the text tower's context", UFORM_INTERNAL;
    if (tower->settings.input_norm)
        VRAM_TRY(forward_norm(tower, NULL, x, x, tower->input_norm, tower->input_norm_bias, tokens, stream),
                 "cannot launch the norm");
    if (tower->settings.post_norm) /* the first block's products read x as it is */
        VRAM_TRY(cuda_f32_to_bf16(layout.h, x, tokens * hidden, stream), "cannot launch convert");
    for (size_t i = 0; i < tower->depth; ++i)
        if ((status = forward_block(device, tower, &tower->blocks[i], &layout, x, tokens, offsets, items,
                                    max_length, causal, rotary, message)) != UFORM_OK)
            return status;
    if (tower->settings.final_norm)
        VRAM_TRY(forward_norm(tower, NULL, x, x, tower->norm, tower->norm_bias, tokens, stream),
                 "cannot launch the norm");
    return UFORM_OK;
}

/* ---- The attention-pooling head ------------------------------------------------------------------ */

typedef struct head_layout {
    uint16_t *x_bf16;                 /* [tokens, hidden] */
    uint16_t *qkv;                    /* [tokens, 3 hidden] */
    uint16_t *probe;                  /* [hidden] */
    float *q;                         /* [3 hidden]: the probe through qkv, its first third the query */
    float *attended;                  /* [units, hidden] */
    uint16_t *attended_bf16, *normed; /* [units, hidden] */
    float *state;                     /* [units, hidden]: the output layer's, then the pooled rows */
    uint16_t *mlp;                    /* [units, mlp] */
} head_layout_t;

static head_layout_t head_layout(vram_tower_t const *tower, void *scratch, size_t tokens, size_t units,
                                 size_t *bytes) {
    size_t const h = tower->hidden;
    size_t const sizes[] = {tokens * h * 2, tokens * 3 * h * 2, h * 2,
                            3 * h * 4,      units * h * 4,      units * h * 2,
                            units * h * 2,  units * h * 4,      units * tower->mlp * 2};
    char *at[9], *base = scratch;
    *bytes = 0;
    for (size_t i = 0; i < 9; ++i) {
        at[i] = base + *bytes;
        *bytes += round_up_256(sizes[i] ? sizes[i] : 1);
    }
    if (!scratch) return (head_layout_t){0};
    return (head_layout_t){(uint16_t *)at[0], (uint16_t *)at[1], (uint16_t *)at[2],
                           (float *)at[3],    (float *)at[4],    (uint16_t *)at[5],
                           (uint16_t *)at[6], (float *)at[7],    (uint16_t *)at[8]};
}

size_t vram_head_scratch(vram_tower_t const *tower, size_t tokens, size_t units) {
    size_t bytes = 0;
    head_layout(tower, NULL, tokens, units, &bytes);
    return bytes;
}

uform_status_t vram_head_pool(vram_device_t *device, vram_tower_t const *tower, float const *x, size_t tokens,
                              int32_t const *offsets, size_t units, size_t max_length, void *scratch,
                              float **pooled, char const **message) {
    size_t const hidden = tower->hidden, head = tower->settings.head;
    size_t bytes = 0;
    head_layout_t s = head_layout(tower, scratch, tokens, units, &bytes);
    cudaStream_t stream = device->stream;
    uform_status_t status = UFORM_OK;
    *pooled = s.state;
    if (units == 0) return UFORM_OK;
    /* k and v of every token, and the probe's query, through the head's qkv layer */
    VRAM_TRY(cuda_f32_to_bf16(s.x_bf16, x, tokens * hidden, stream), "cannot launch convert");
    VRAM_TRY(cuda_f32_to_bf16(s.probe, tower->probe, hidden, stream), "cannot launch convert");
    if ((status = vram_linear_run(device, &tower->head_qkv, tokens, s.x_bf16, s.qkv, 3 * hidden,
                                  CUDA_LINEAR_BF16, message)) != UFORM_OK ||
        (status = vram_linear_run(device, &tower->head_qkv, 1, s.probe, s.q, 3 * hidden, CUDA_LINEAR_F32,
                                  message)) != UFORM_OK)
        return status;
    VRAM_TRY(cuda_attention_probe(s.attended, hidden, s.q, s.qkv, offsets, units, tower->heads, head,
                                  max_length, (float)(1.0 / sqrt((double)head)), stream),
             "cannot launch the pooling head's attention");
    /* state = attended Wout^T + b; pooled = state + down(act(up(norm(state)))) */
    VRAM_TRY(cuda_f32_to_bf16(s.attended_bf16, s.attended, units * hidden, stream), "cannot launch convert");
    if ((status = vram_linear_run(device, &tower->head_out, units, s.attended_bf16, s.state, hidden,
                                  CUDA_LINEAR_F32, message)) != UFORM_OK)
        return status;
    VRAM_TRY(
        forward_norm(tower, s.normed, NULL, s.state, tower->head_norm, tower->head_norm_bias, units, stream),
        "cannot launch the norm");
    if ((status = vram_linear_run(device, &tower->head_up, units, s.normed, s.mlp, tower->mlp,
                                  forward_activation(tower), message)) != UFORM_OK)
        return status;
    return vram_linear_run(device, &tower->head_down, units, s.mlp, s.state, hidden, CUDA_LINEAR_RESIDUAL,
                           message);
}

uform_status_t vram_project_rows(vram_device_t *device, vram_tower_t const *tower, float const *x,
                                 uint16_t const *x_bf16, size_t m, size_t width, bool normalize,
                                 float *projected, char const **message) {
    if (m == 0) return UFORM_OK;
    if (tower->proj.w) {
        vram_linear_t narrowed = tower->proj;
        narrowed.n = width; /* a matryoshka width: the first rows of the projection (and of its bias) */
        uform_status_t status =
            vram_linear_run(device, &narrowed, m, x_bf16, projected, width, CUDA_LINEAR_F32, message);
        if (status != UFORM_OK) return status;
        if (tower->settings.projection_tanh)
            VRAM_TRY(cuda_tanh(projected, m * width, device->stream), "cannot launch tanh");
    } else { /* no projection: the states' first columns, as tower_project gives them */
        VRAM_TRY(cudaMemcpy2DAsync(projected, width * sizeof(float), x, tower->hidden * sizeof(float),
                                   width * sizeof(float), m, cudaMemcpyDeviceToDevice, device->stream),
                 "cannot copy the states");
    }
    if (normalize)
        VRAM_TRY(cuda_normalize(projected, width, m, width, device->stream), "cannot launch normalize");
    return UFORM_OK;
}

cudaError_t vram_convert_rows(vram_device_t const *device, uform_view_t const *view, size_t first,
                              float const *x, size_t x_stride, size_t rows, size_t columns) {
    float *scales = view->scales ? (float *)view->scales + first : NULL;
    return cuda_convert((unsigned char *)view->data + first * view->row_stride, view->row_stride, scales, x,
                        x_stride, rows, columns, (int)view->scalar, device->stream);
}

uform_status_t vram_project(vram_device_t *device, vram_tower_t const *tower, float const *x,
                            uint16_t const *x_bf16, size_t m, size_t width, bool normalize, float *projected,
                            int32_t const *rows, uform_view_t const *view, size_t first,
                            char const **message) {
    uform_status_t status =
        vram_project_rows(device, tower, x, x_bf16, m, width, normalize, projected, message);
    if (status != UFORM_OK || m == 0) return status;
    if (rows)
        VRAM_TRY(cuda_zero_failed_rows(projected, width, rows, m, width, device->stream),
                 "cannot launch zero rows");
    VRAM_TRY(vram_convert_rows(device, view, first, projected, width, m, width), "cannot launch convert");
    return UFORM_OK;
}

uform_status_t vram_patch_project(vram_device_t *device, vram_tower_t const *tower, uint16_t const *x_bf16,
                                  size_t m, float *y, char const **message) {
    uform_status_t status =
        vram_linear_run(device, &tower->patch, m, x_bf16, y, tower->hidden, CUDA_LINEAR_F32, message);
    if (status != UFORM_OK) *message = "cannot run the patch projection";
    return status;
}

#endif /* UFORM_WITH_CUDA */
