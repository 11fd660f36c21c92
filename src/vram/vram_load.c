/* The VRAM target of a model load (src/model/model_load.h): the weights on every device of a VRAM
 * executor.
 *
 *   the raw data section allocated on every device, LOAD_READS pinned staging buffers, their events
 *   -> each read lands in a staging buffer -> copied to every device on its stream, an event after
 *   -> the buffer is reused once its copies' events completed (polled on a timer while no read runs)
 *   -> every tower prepared on each device from the raw bytes (vram_model_prepare) -> the raw bytes,
 *      the staging buffers and the events freed.
 * A pretrained folder is read into host memory first (pretrained.h, converted there to the checkpoint
 * schema), then copied whole to every device as the raw bytes (vram_load_placed), and prepared the same
 * way. The towers the device path does not run (vram_support.h) are not placed; a model none of whose
 * towers it runs is refused with the first one's reason. */
#include "executor.h"
#include "loop.h"
#include "model.h"
#include "model_load.h"
#include "vram.h"
#include "vram_support.h"

#if UFORM_WITH_CUDA

typedef struct vram_load {
    load_call_t *load;
    void *raw[VRAM_MAX_DEVICES]; /* the data section on each device, until prepared */
    void *staging[LOAD_READS];
    cudaEvent_t copied[LOAD_READS][VRAM_MAX_DEVICES];
    loop_op_t poll;
    uint64_t polls;
} vram_load_t;

static vram_load_t *vram_load_of(load_call_t *load) {
    return (vram_load_t *)(void *)load->target_state;
}

/* Prepares the towers on every device from the raw bytes, then frees the raw bytes, the staging
 * buffers and the events. */
static void vram_load_finish(load_call_t *load) {
    vram_load_t *state = vram_load_of(load);
    uform_executor_t *executor = load->call.executor;
    vram_t *vram = vram_of(executor);
    if (load->failure == UFORM_OK) {
        char const *message = NULL;
        uform_status_t status = vram_model_prepare(load->model, executor, state->raw, &message);
        if (status != UFORM_OK) load_stop(load, status, message);
    }
    for (size_t d = 0; d < vram->count; ++d) {
        vram_use(&vram->devices[d]);
        cudaStreamSynchronize(vram->devices[d].stream);
        cudaFree(state->raw[d]);
        for (size_t i = 0; i < LOAD_READS; ++i)
            if (state->copied[i][d]) cudaEventDestroy(state->copied[i][d]);
    }
    for (size_t i = 0; i < LOAD_READS; ++i)
        cudaFreeHost(state->staging[i]);
    cudaGetLastError();
}

/* Frees the staging buffers whose copies completed; answers whether some are still copying. */
static bool vram_load_pending(load_call_t *load) {
    vram_load_t *state = vram_load_of(load);
    vram_t *vram = vram_of(load->call.executor);
    bool pending = false;
    for (size_t i = 0; i < LOAD_READS; ++i) {
        load_read_t *read = &load->reads[i];
        if (!read->copying) continue;
        bool all = true;
        for (size_t d = 0; d < vram->count && all; ++d) {
            bool done = false;
            if (vram_event_done(state->copied[i][d], &done) != UFORM_OK) {
                load_stop(load, UFORM_DEVICE, "cannot copy the weights to the device");
                cudaStreamSynchronize(vram->devices[d].stream);
                done = true;
            }
            all = done;
        }
        read->copying = !all;
        pending |= !all;
    }
    return pending;
}

/* A read landed in staging buffer `i`: copy it to every device. */
static void vram_load_landed(load_call_t *load, size_t i, size_t length) {
    vram_load_t *state = vram_load_of(load);
    vram_t *vram = vram_of(load->call.executor);
    load_read_t *read = &load->reads[i];
    for (size_t d = 0; d < vram->count; ++d) {
        vram_device_t *device = &vram->devices[d];
        if (vram_use(device) != UFORM_OK ||
            cudaMemcpyAsync((uint8_t *)state->raw[d] + read->at, state->staging[i], length,
                            cudaMemcpyHostToDevice, device->stream) != cudaSuccess ||
            cudaEventRecord(state->copied[i][d], device->stream) != cudaSuccess) {
            cudaGetLastError();
            load_stop(load, UFORM_DEVICE, "cannot copy the weights to the device");
            cudaStreamSynchronize(device->stream);
            return;
        }
        read->copying = true;
    }
}

static void *vram_load_buffer(load_call_t *load, size_t read) {
    return vram_load_of(load)->staging[read];
}

static void vram_load_poll(loop_op_t *op) {
    load_issue_reads(container_of(op, vram_load_t, poll)->load);
}

/* Only copies run: poll their events. */
static void vram_load_idle(load_call_t *load) {
    vram_load_t *state = vram_load_of(load);
    loop_timer(load->call.executor->loop, &state->poll, vram_poll_ns(++state->polls * 20000));
}

/* The raw data section on every device, the staging buffers and the events, then the reads. */
static void vram_load_weights(load_call_t *load) {
    vram_load_t *state = vram_load_of(load);
    vram_t *vram = vram_of(load->call.executor);
    load->model->device_release = vram_model_release;
    load->model->verbs = &encode_verbs_vram;
    state->load = load;
    state->poll.callback = vram_load_poll;
    for (size_t d = 0; d < vram->count; ++d) {
        if (vram_use(&vram->devices[d]) != UFORM_OK) {
            load_fail(load, UFORM_DEVICE, "cannot use the device");
            return;
        }
        if (cudaMalloc(&state->raw[d], load->model->data_size ? load->model->data_size : 1) != cudaSuccess) {
            cudaGetLastError();
            state->raw[d] = NULL;
            load_fail(load, UFORM_OUT_OF_MEMORY, "cannot allocate the weights on the device");
            return;
        }
        for (size_t i = 0; i < LOAD_READS; ++i)
            if (cudaEventCreateWithFlags(&state->copied[i][d], cudaEventDisableTiming) != cudaSuccess) {
                cudaGetLastError();
                state->copied[i][d] = NULL;
                load_fail(load, UFORM_DEVICE, "cannot create an event on the device");
                return;
            }
    }
    for (size_t i = 0; i < LOAD_READS; ++i)
        if (cudaHostAlloc(&state->staging[i], LOAD_CHUNK, cudaHostAllocDefault) != cudaSuccess) {
            cudaGetLastError();
            state->staging[i] = NULL;
            load_fail(load, UFORM_OUT_OF_MEMORY, "cannot allocate pinned staging memory");
            return;
        }
    load_issue_reads(load);
}

/* A folder's weights, converted in host memory: copied to every device as the raw data section, then the
 * host copy freed. */
static uform_status_t vram_load_placed(load_call_t *load, char const **message) {
    vram_load_t *state = vram_load_of(load);
    uform_executor_t *executor = load->call.executor;
    vram_t *vram = vram_of(executor);
    uform_model_t *model = load->model;
    model->device_release = vram_model_release;
    model->verbs = &encode_verbs_vram;
    size_t bytes = model->data_size ? model->data_size : 1;
    for (size_t d = 0; d < vram->count; ++d) {
        if (vram_use(&vram->devices[d]) != UFORM_OK) return *message = "cannot use the device", UFORM_DEVICE;
        if (cudaMalloc(&state->raw[d], bytes) != cudaSuccess) {
            cudaGetLastError();
            state->raw[d] = NULL;
            return *message = "cannot allocate the weights on the device", UFORM_OUT_OF_MEMORY;
        }
        VRAM_TRY(cudaMemcpy(state->raw[d], model->data, model->data_size, cudaMemcpyHostToDevice),
                 "cannot copy the weights to the device");
    }
    executor_deallocate(executor, model->data, model->data_size);
    model->data = NULL;
    return UFORM_OK;
}

static model_load_target_t const vram_load_target = {
    .device = true,
    .state_bytes = sizeof(vram_load_t),
    .refusal = vram_model_refusal,
    .placed = vram_load_placed,
    .weights = vram_load_weights,
    .buffer = vram_load_buffer,
    .landed = vram_load_landed,
    .pending = vram_load_pending,
    .idle = vram_load_idle,
    .finish = vram_load_finish,
};

UFORM_EXPORT uform_status_t uform_model_load_vram(uform_model_load_args_t const *args) {
    static char const entry[] = "uform_model_load_vram";
    if (!args) return failed(UFORM_INVALID_ARGUMENT, entry, "args is NULL");
    return model_load(args, &vram_load_target, entry);
}

#endif /* UFORM_WITH_CUDA */
