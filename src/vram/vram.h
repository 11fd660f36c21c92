/* VRAM executors and models: devices, streams, device memory, and the towers on the GPU.
 *
 * A VRAM executor has one host thread (its loop) and, per device, one stream, a cuBLASLt handle, a
 * device scratch buffer and two pinned staging slots, so that the host prepares chunk k + 1 while the
 * device runs chunk k. Device work is tracked by CUDA events that the loop polls on a short timer
 * (docs/DESIGN.md: "CUDA work is tracked by events the loop polls"): a fault in a kernel surfaces as an
 * error from cudaEventQuery and ends the call with UFORM_DEVICE instead of hanging it.
 *
 * A VRAM model holds, per device, every tower's weights in one device allocation: BF16 matrices
 * `[out, in]` as the checkpoint stores them (cuBLASLt reads them in place, 256-byte aligned) and norms,
 * biases, class tokens and positions converted to F32. The raw checkpoint bytes are not kept.
 *
 * Everything below the entry points exists only in builds with CUDA (UFORM_WITH_CUDA); a build without
 * it has the entry points from src/vram/vram_none.c, answering UFORM_UNSUPPORTED. */
#pragma once

#include "verbs.h"

#if UFORM_WITH_CUDA
#include <cuda_runtime_api.h>

#include "cuda/cuda_kernels.h"
#include "cuda/cuda_library.h"

#define VRAM_MAX_DEVICES 16
#define VRAM_SLOTS       2 /* chunks in flight per device */

/* Bytes rounded up to a multiple of 256: the alignment of device buffers carved in pieces. */
static inline size_t round_up_256(size_t bytes) {
    return (bytes + 255) & ~(size_t)255;
}

/* Makes the enclosing function answer UFORM_DEVICE, with `what` in *message, when a CUDA call fails
 * (its error cleared from the thread). */
#define VRAM_TRY(call, what)                                                                                 \
    do {                                                                                                     \
        if ((call) != cudaSuccess) {                                                                         \
            cudaGetLastError();                                                                              \
            *message = what;                                                                                 \
            return UFORM_DEVICE;                                                                             \
        }                                                                                                    \
    } while (0)

typedef struct vram_slot {
    void *staging; /* pinned host memory: a chunk's inputs on the way in */
    size_t staging_bytes;
    cudaEvent_t done; /* recorded after the chunk's last operation */
    bool busy;
} vram_slot_t;

typedef struct vram_device {
    int ordinal;
    cudaStream_t stream;
    cuda_gemm_t *gemm;
    void *scratch; /* device memory for a chunk's activations */
    size_t scratch_bytes;
    vram_slot_t slots[VRAM_SLOTS];
} vram_device_t;

/* Frees a VRAM model's device weights (model->device), when its last reference goes
 * (model->device_release, set by the VRAM load). */
void vram_model_release(uform_model_t *model);

typedef struct vram {
    size_t count;
    vram_device_t devices[VRAM_MAX_DEVICES];
} vram_t;

/* A VRAM executor's state: its devices. */
static inline vram_t *vram_of(uform_executor_t const *executor) {
    return executor->state;
}

/* Opens the devices of `options` (NULL: device 0) for a VRAM executor, first loading the CUDA libraries
 * (cuda_library_load: the first VRAM executor of the process loads them): UFORM_OK, UFORM_DEVICE (a
 * library or the driver missing, no device, no such device), UFORM_OUT_OF_MEMORY, with a message. */
uform_status_t vram_open(uform_executor_t *executor, uform_vram_options_t const *options,
                         char const **message);
/* Waits for the devices' streams and frees everything `vram_open` made. */
void vram_close(uform_executor_t *executor);

/* Device memory on the executor's first device (arenas), and its release. NULL when out of memory. */
void *vram_allocate(uform_executor_t *executor, size_t bytes);
void vram_deallocate(uform_executor_t *executor, void *memory);

/* A synchronous 2D copy from the executor's first device to host memory: `rows` rows of `width` bytes.
 * Keeps the calling thread's current device. UFORM_OK or UFORM_DEVICE. */
uform_status_t vram_copy_to_host(uform_executor_t *executor, void *host, size_t host_pitch,
                                 void const *device, size_t device_pitch, size_t width, size_t rows);

/* The device's scratch, grown to at least `bytes` (contents not kept; waits for the device's stream
 * before replacing it). NULL when out of memory. Loop thread only. */
void *vram_scratch(vram_device_t *device, size_t bytes);
/* A slot's pinned staging, grown to at least `bytes`. NULL when out of memory. */
void *vram_staging(vram_slot_t *slot, size_t bytes);

/* Makes `device` current on the calling thread. */
uform_status_t vram_use(vram_device_t const *device);

/* UFORM_OK with *done = true when every operation enqueued before the event was recorded finished,
 * *done = false while some run, UFORM_DEVICE on a device fault. */
uform_status_t vram_event_done(cudaEvent_t event, bool *done);

/* The poll period for device work that started `elapsed_ns` ago: short at first, for latency, longer
 * for long work, so the loop thread stays nearly idle. */
uint64_t vram_poll_ns(uint64_t elapsed_ns);

/* ---- Models on devices -------------------------------------------------------------------------- */

typedef struct vram_linear {
    uint16_t const *w; /* BF16 [n, k] */
    float const *bias; /* F32 [n] or NULL */
    size_t n, k;
} vram_linear_t;

typedef struct vram_block {
    float const *norm1, *norm2;
    vram_linear_t qkv, out, up, down;
} vram_block_t;

typedef struct vram_tower {
    size_t depth, hidden, heads, mlp, dims;
    vram_block_t *blocks; /* host array of device pointers */
    float const *norm;
    vram_linear_t proj;
    /* text */
    uint16_t const *embed; /* BF16 [257, hidden] */
    /* image and audio */
    vram_linear_t patch;
    float const *cls, *pos; /* [hidden], [1 + patches, hidden] */
    size_t positions;       /* rows of pos */
} vram_tower_t;

typedef struct vram_replica {
    void *weights; /* the one device allocation */
    size_t bytes;
    vram_tower_t text, image, audio;
    bool has_text, has_image, has_audio;
} vram_replica_t;

struct vram_model {
    size_t count; /* replicas, one per device of the executor that loaded it */
    vram_replica_t replicas[VRAM_MAX_DEVICES];
};

/* Prepares every tower of `model` on each device from its raw checkpoint bytes already on that device
 * (`raw[d]`, the data section), then the raw bytes may be freed. Runs on the loop thread, synchronous
 * per device. UFORM_OK, UFORM_OUT_OF_MEMORY or UFORM_DEVICE with a message. */
uform_status_t vram_model_prepare(uform_model_t *model, uform_executor_t *executor, void *const *raw,
                                  char const **message);

/* ---- The tower forward on a device -------------------------------------------------------------- */

/* Device scratch a forward over `tokens` tokens needs (beside x), in bytes. */
size_t vram_forward_scratch(vram_tower_t const *tower, size_t tokens);

/* Enqueues every block and the final norm over x (F32 [tokens, hidden], in place) on the device's
 * stream. `offsets`: device int32 [items + 1]. UFORM_OK or UFORM_DEVICE with a message. */
uform_status_t vram_forward(vram_device_t *device, vram_tower_t const *tower, float *x, size_t tokens,
                            int32_t const *offsets, size_t items, size_t max_length, bool causal, bool rotary,
                            void *scratch, char const **message);

/* The device scratch of a chunk's pass through a tower: x F32 [tokens, hidden], the forward's, rows
 * gathered from x in F32 and BF16 [rows, hidden], and their projections F32 [rows, width]. */
typedef struct vram_pass {
    float *x;
    void *forward;
    float *gathered;
    uint16_t *gathered_bf16;
    float *projected;
} vram_pass_t;

/* Carves the device's scratch (vram_scratch): first the chunk's own `count` parts of sizes[i] bytes
 * (parts[i]), then its pass through `tower` over `tokens` tokens and `rows` rows at `width` (*pass);
 * every piece 256-byte aligned. false when out of memory. Loop thread only. */
bool vram_chunk_scratch(vram_device_t *device, vram_tower_t const *tower, size_t const *sizes, size_t count,
                        void **parts, size_t tokens, size_t rows, size_t width, vram_pass_t *pass);

/* Enqueues y[m, width] = normalize(x_bf16[m, hidden] . proj[:width]^T) then the conversion into rows
 * [first, first + m) of `view` (device memory). `projected` is F32 scratch [m, width]. */
uform_status_t vram_project(vram_device_t *device, vram_tower_t const *tower, uint16_t const *x_bf16,
                            size_t m, size_t width, float *projected, uform_view_t const *view, size_t first,
                            char const **message);

/* ---- Outputs ------------------------------------------------------------------------------------ */

/* The rows of a chunk's final states that become its outputs, and where they go. */
typedef struct vram_output_rows {
    int32_t const *state_rows;  /* device [items]: each item's row in x */
    size_t items, first;        /* the chunk's items: rows [first, first + items) of embeddings and states */
    int32_t const *token_rows;  /* device [tokens]: the rows of x whose projections are token vectors */
    size_t tokens, token_first; /* rows [token_first, token_first + tokens) of the token vectors */
    char const *gather_failed, *convert_failed; /* the verb's messages for a launch that failed */
} vram_output_rows_t;

/* Enqueues the requested outputs of a chunk from x (F32 [tokens, hidden], after vram_forward) on the
 * device's stream, through the pass's gathered and projected scratch: the states at the item rows,
 * converted; their projections (vram_project) the embeddings; the token rows' projections the token
 * vectors (none when `tokens` is 0). UFORM_OK or UFORM_DEVICE with a message (src/vram/vram_output.c). */
uform_status_t vram_output_write(vram_device_t *device, vram_tower_t const *tower,
                                 encode_call_t const *encode, float const *x, vram_pass_t const *pass,
                                 vram_output_rows_t const *rows, char const **message);

/* ---- Verbs -------------------------------------------------------------------------------------- */

uform_status_t vram_text_encode(encode_request_t const *request);

uform_status_t vram_image_encode(char const *entry, image_request_t const *request);
uform_status_t vram_text_choose(uform_text_choose_args_t const *args);

#endif /* UFORM_WITH_CUDA */
