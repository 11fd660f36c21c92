/* VRAM executors and models: devices, streams, device memory, and the towers on the GPU.
 *
 * A VRAM executor has one host thread (its loop) and, per device, one stream, a cuBLASLt handle, a
 * device scratch buffer and two pinned staging slots, so that the host prepares chunk k + 1 while the
 * device runs chunk k. A call's chunks are spread over the devices (chunk k on device k mod N, in slot
 * (k / N) mod 2: vram_place), and each chunk's outputs land in the arena, which is on the first device:
 * a chunk on another device writes them into its own scratch and copies them there (vram_views_t). The
 * media verbs prepare their items on the host first, on the executor's host team (vram_workers: a RAM
 * executor of its own, made by the first media call), into pinned memory (the executor's host
 * allocations are pinned: vram_host_allocate). Device work is tracked by CUDA events that the loop
 * polls on a short timer (docs/DESIGN.md: "CUDA work is tracked by events the loop polls"): a fault in
 * a kernel surfaces as an error from cudaEventQuery and ends the call with UFORM_DEVICE instead of
 * hanging it.
 *
 * A VRAM model holds, per device, every tower's weights in one device allocation: BF16 matrices
 * `[out, in]` as the checkpoint stores them (cuBLASLt reads them in place, 256-byte aligned) and norms,
 * biases, class tokens and positions converted to F32; a text tower's bias by relative position as each
 * head's F32 table over every distance its items can have (built on the host at load). The raw
 * checkpoint bytes are not kept.
 *
 * Everything below the entry points exists only in builds with CUDA (UFORM_WITH_CUDA); a build without
 * it has the entry points from src/vram/vram_executor.c, answering UFORM_UNSUPPORTED. The CUDA
 * libraries are opened by the first VRAM executor (kernels/cuda/cuda_library.h). */
#pragma once

#include "verbs.h"

/* The most devices one executor drives (uform_vram_options_t.devices_count), in every build. */
#define VRAM_MAX_DEVICES 16

#if UFORM_WITH_CUDA
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda/cuda_kernels.h"
#include "cuda/cuda_library.h"

#define VRAM_SLOTS 2 /* chunks in flight per device */

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
    cudaEvent_t copied; /* recorded once the chunk's inputs are on the device */
    cudaEvent_t done;   /* recorded after the chunk's last operation */
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

/* Where chunk `chunk` of a call runs over `devices` devices: device chunk mod devices, in slot
 * (chunk / devices) mod VRAM_SLOTS. */
static inline void vram_place(size_t chunk, size_t devices, size_t *device, size_t *slot) {
    *device = chunk % devices;
    *slot = (chunk / devices) % VRAM_SLOTS;
}

/* A chunk a slot holds: its items, and which of its events have not been seen complete. */
typedef struct vram_flight {
    size_t chunk, first, last;
    bool busy;    /* `done` not seen yet */
    bool copying; /* `copied` not seen yet */
} vram_flight_t;

/* The chunks of the executor's call in flight on its devices (one call at a time: the executor keeps
 * them, and each call starts them afresh). */
typedef struct vram_flights {
    size_t issued; /* chunks enqueued so far: the next is chunk `issued` */
    vram_flight_t slots[VRAM_MAX_DEVICES][VRAM_SLOTS];
} vram_flights_t;

typedef struct vram {
    size_t count;
    vram_device_t devices[VRAM_MAX_DEVICES]; /* devices[0] holds the arenas */
    uform_executor_t *workers;               /* the host team, once a media call made it */
    void *pinned;                            /* the pinned block vram_host_allocate hands out and keeps */
    size_t pinned_bytes;
    bool pinned_lent;
    vram_flights_t flights; /* the call's chunks */
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

/* The executor's host allocations (executor_allocate: a media call's rows), pinned so that they are copied
 * to the devices without staging: one block is kept between calls and handed out again when it is large
 * enough. NULL when out of memory. */
void *vram_host_allocate(uform_executor_t *executor, size_t bytes);
void vram_host_deallocate(uform_executor_t *executor, void *memory, size_t bytes);

/* The executor's host team, made on first use: a RAM executor of 7/8 of the cores, unpinned, whose
 * threads the media calls decode on (media_read.h, `workers`). NULL with a message when it cannot be
 * made. Loop thread. */
uform_executor_t *vram_workers(uform_executor_t *executor, char const **message);

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

/* ---- Chunks in flight ---------------------------------------------------------------------------- */

/* A new call's flights: nothing issued, every slot free. */
static inline void vram_flights_start(vram_t *vram) {
    memset(&vram->flights, 0, sizeof vram->flights);
}

/* The slot of the next chunk (`issued`), and whether it is free (its last chunk done). */
vram_flight_t *vram_flights_next(vram_t *vram, bool *free);

/* Whether the slot of the next chunk is free. */
static inline bool vram_flights_free(vram_t *vram) {
    bool free_slot = false;
    vram_flights_next(vram, &free_slot);
    return free_slot;
}

/* Records chunk `issued` in its slot as enqueued (both events recorded), for items [first, last). */
void vram_flights_issue(vram_t *vram, size_t first, size_t last);

/* Looks at the events of every slot in use: clears `copying` and `busy` as they complete, telling
 * done(context, flight) of each chunk done. A slot whose events answer a fault is cleared too, and the
 * answer is UFORM_DEVICE (with *message); else UFORM_OK. Loop thread. */
uform_status_t vram_flights_sweep(vram_t *vram, void (*done)(void *context, vram_flight_t const *flight),
                                  void *context, char const **message);

/* vram_flights_sweep for an encode call: a fault stops it (encode_stop, UFORM_DEVICE). */
void vram_flights_sweep_encode(vram_t *vram, encode_call_t *encode,
                               void (*done)(void *context, vram_flight_t const *flight), void *context);

/* Whether some chunk's `done` (with `copied` true: or its `copied`) has not been seen yet. */
bool vram_flights_busy(vram_t const *vram, bool copied);

/* The flight of chunk `chunk` if it is still the one its slot holds, else NULL. */
vram_flight_t *vram_flights_of(vram_t *vram, size_t chunk);

/* ---- Models on devices -------------------------------------------------------------------------- */

typedef struct vram_linear {
    uint16_t const *w; /* BF16 [n, k] */
    float const *bias; /* F32 [n] or NULL */
    size_t n, k;
} vram_linear_t;

typedef struct vram_block {
    float const *norm1, *norm2;
    float const *norm1_bias, *norm2_bias; /* LayerNorm's, else NULL */
    vram_linear_t qkv, out, up, down;
} vram_block_t;

typedef struct vram_tower {
    size_t depth, hidden, heads, mlp, dims;
    uform_transformer_info_t settings; /* the block's settings (src/model/variant.h), as the tower was read */
    vram_block_t *blocks;              /* host array of device pointers */
    float const *norm, *norm_bias;     /* the final norm, with settings.final_norm */
    float const *input_norm, *input_norm_bias; /* with settings.input_norm */
    vram_linear_t proj;                        /* w NULL without settings.projection (dims == hidden) */
    /* text */
    uint16_t const *embed;   /* BF16 [257, hidden], or [vocab, hidden] for a tower that reads tokens */
    float const *token_type; /* [hidden], the token type's row, or NULL */
    /* With settings.relative_buckets: each head's bias by relative position (cuda_attention's bias) for
     * items of up to relative_rows rows, head h's at distance d at relative[h * relative_stride + d], d from
     * -(relative_rows - 1) to relative_rows - 1: text.relative_bias [buckets, heads] at
     * variant_relative_bucket(d), the host path's buckets. NULL without. */
    float const *relative;
    size_t relative_stride, relative_rows;
    /* image and audio */
    vram_linear_t head_qkv, head_out, head_up, head_down; /* the attention-pooling head's (pooling "head") */
    float const *probe, *head_norm, *head_norm_bias;      /* [hidden] each */
    vram_linear_t patch;
    float const *cls, *pos; /* [hidden], [1 + patches, hidden]; text: learned positions [positions, hidden] */
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

/* Enqueues y = x[m, k] W^T + b of `layer` through cuBLASLt, y [m, n] at y_stride in the form `kind` asks.
 * UFORM_OK or UFORM_DEVICE with a message. */
uform_status_t vram_linear_run(vram_device_t *device, vram_linear_t const *layer, size_t m, uint16_t const *x,
                               void *y, size_t y_stride, cuda_linear_kind_t kind, char const **message);

/* Device scratch a forward over `tokens` tokens needs (beside x), in bytes. */
size_t vram_forward_scratch(vram_tower_t const *tower, size_t tokens);

/* Enqueues the input norm, every block and the final norm over x (F32 [tokens, hidden], in place) on the
 * device's stream, as the tower's settings have them (the norm and its place, the activation, the head
 * width; `causal` and `rotary` as the caller's items need). `offsets`: device int32 [items + 1]. UFORM_OK or
 * UFORM_DEVICE with a message. */
uform_status_t vram_forward(vram_device_t *device, vram_tower_t const *tower, float *x, size_t tokens,
                            int32_t const *offsets, size_t items, size_t max_length, bool causal, bool rotary,
                            void *scratch, char const **message);

/* The device scratch of a chunk's pass through a tower: x F32 [tokens, hidden], the forward's, rows
 * gathered from x in F32 and BF16 [rows, hidden], their projections F32 [rows, width], and rows pooled
 * from them F32 [rows, width] (clips). */
typedef struct vram_pass {
    float *x;
    void *forward;
    float *gathered;
    uint16_t *gathered_bf16;
    float *projected;
    float *pooled;
} vram_pass_t;

/* Carves the device's scratch (vram_scratch): first the chunk's own `count` parts of sizes[i] bytes
 * (parts[i]), then its pass through `tower` over `tokens` tokens and `rows` rows at `width` (*pass);
 * every piece 256-byte aligned. false when out of memory. Loop thread only. */
bool vram_chunk_scratch(vram_device_t *device, vram_tower_t const *tower, size_t const *sizes, size_t count,
                        void **parts, size_t tokens, size_t rows, size_t width, vram_pass_t *pass);

/* Enqueues the conversion of `rows` F32 rows of `columns` (x, stride x_stride) into rows [first, first +
 * rows) of `view` (device memory), with their I8 scales. The launch's error. */
cudaError_t vram_convert_rows(vram_device_t const *device, uform_view_t const *view, size_t first,
                              float const *x, size_t x_stride, size_t rows, size_t columns);

/* Enqueues y[m, hidden] = x_bf16[m, k] . patch^T + bias, F32: the patch layer of an image or audio tower.
 * UFORM_OK or UFORM_DEVICE with a message. */
uform_status_t vram_patch_project(vram_device_t *device, vram_tower_t const *tower, uint16_t const *x_bf16,
                                  size_t m, float *y, char const **message);

/* Enqueues projected[m, width] = x_bf16[m, hidden] . proj[:width]^T (+ its bias), F32, or for a tower
 * without a projection x[m, :width] as it is (x F32 [m, hidden], the rows x_bf16 rounds); then, with
 * `normalize`, each row scaled to unit length. */
uform_status_t vram_project_rows(vram_device_t *device, vram_tower_t const *tower, float const *x,
                                 uint16_t const *x_bf16, size_t m, size_t width, bool normalize,
                                 float *projected, char const **message);

/* Enqueues vram_project_rows, zero rows for the failed items (`rows`, device [m]: the rows' sources,
 * below 0 for a failed item's; NULL: none failed), then the conversion into rows [first, first + m) of
 * `view` (device memory). A failed item's row is zeros in every output, as on the host: its projection
 * would hold the projection's bias. `projected` is F32 scratch [m, width]. */
uform_status_t vram_project(vram_device_t *device, vram_tower_t const *tower, float const *x,
                            uint16_t const *x_bf16, size_t m, size_t width, bool normalize, float *projected,
                            int32_t const *rows, uform_view_t const *view, size_t first,
                            char const **message);

/* Device scratch of vram_head_pool over `tokens` tokens of `units` units, in bytes. */
size_t vram_head_scratch(vram_tower_t const *tower, size_t tokens, size_t units);

/* The attention-pooling head (pooling "head", SigLIP's) over x (F32 [tokens, hidden], final-normed) of
 * `units` units by `offsets` (device int32 [units + 1], each at most `max_length` long), as pool_head does
 * on the host: the probe's query against each unit's keys, the output layer, then h +=
 * down(act(up(norm(h)))). Writes pooled F32 [units, hidden] into `scratch` (vram_head_scratch of it) and
 * answers where, through *pooled. UFORM_OK or UFORM_DEVICE with a message. */
uform_status_t vram_head_pool(vram_device_t *device, vram_tower_t const *tower, float const *x, size_t tokens,
                              int32_t const *offsets, size_t units, size_t max_length, void *scratch,
                              float **pooled, char const **message);

/* ---- Outputs ------------------------------------------------------------------------------------ */

/* Where a chunk's outputs are written: the arena's views, at the chunk's rows, when the chunk runs on
 * the arena's device; else views of the same shape over the chunk's device scratch, its rows from 0, that
 * vram_views_land copies to the arena's rows after. */
typedef struct vram_views {
    uform_encoded_t out;                   /* embeddings, states and token vectors written: data and scales */
    uform_encoded_t const *arena;          /* the call's views in the arena */
    size_t first, token_first;             /* the chunk's first rows in `out` */
    size_t items, tokens;                  /* its rows of embeddings and states, and of token vectors */
    size_t arena_first, arena_token_first; /* its rows in the arena */
    bool shadow;                           /* `out` is the device's, not the arena's */
} vram_views_t;

/* Bytes of device scratch the views of a chunk of `items` rows and `tokens` token-vector rows take when
 * they are a shadow (each piece 256-byte aligned). */
size_t vram_views_bytes(encode_call_t const *encode, size_t items, size_t tokens, size_t hidden);

/* The views of a chunk of rows [first, first + items) and token-vector rows [token_first, token_first +
 * tokens): the arena's, or (`scratch` not NULL, vram_views_bytes of it) a shadow over it. */
vram_views_t vram_views_make(encode_call_t const *encode, void *scratch, size_t first, size_t items,
                             size_t token_first, size_t tokens, size_t hidden);

/* Enqueues, on `device`'s stream, the copies of a shadow's rows to the arena's on the first device
 * (nothing for views that are the arena's). UFORM_OK or UFORM_DEVICE with a message. */
uform_status_t vram_views_land(vram_t const *vram, vram_device_t *device, vram_views_t const *views,
                               char const **message);

/* The rows of a chunk's final states that become its outputs. */
typedef struct vram_output_rows {
    int32_t const *state_rows; /* device [items]: each item's row in x, or -1 (a failed item: zero rows) */
    float const *state_source; /* F32 [?, hidden] the state rows index, or NULL: x (the head's pooled rows) */
    int32_t const *mean_offsets; /* device [items + 1], or NULL: each item's state is the mean of its rows
                                    [mean_offsets[i], mean_offsets[i + 1]) of x instead (none: zero rows) */
    size_t items;
    int32_t const *token_rows; /* device [tokens]: the rows of x whose projections are token vectors (-1:
                                  zero rows) */
    size_t tokens;
    char const *gather_failed, *convert_failed; /* the verb's messages for a launch that failed */
} vram_output_rows_t;

/* Enqueues the requested outputs of a chunk from x (F32 [tokens, hidden], after vram_forward) on the
 * device's stream into `views`, through the pass's gathered and projected scratch: the states at the item
 * rows, converted; their projections (vram_project) the embeddings; the token rows' projections the token
 * vectors (none when `tokens` is 0). UFORM_OK or UFORM_DEVICE with a message (src/vram/vram_output.c). */
uform_status_t vram_output_write(vram_device_t *device, vram_tower_t const *tower,
                                 encode_call_t const *encode, vram_views_t const *views, float const *x,
                                 vram_pass_t const *pass, vram_output_rows_t const *rows,
                                 char const **message);

/* The outputs of a chunk of `clips` clips of `frames` frames each, pooled as the host pools them
 * (src/encode/video.c): `frame_rows` device [clips * frames], each frame's class row in x (-1: a failed
 * clip's). Each frame's state projected at the full dims and normalized is a token vector (its prefix at
 * the output width, renormalized); the clip's embedding is the normalized mean of those, its prefix
 * renormalized; its state the mean of the frames' states. The pass's rows hold clips * frames rows of
 * max(hidden, dims). UFORM_OK or UFORM_DEVICE with a message. */
uform_status_t vram_output_clips(vram_device_t *device, vram_tower_t const *tower,
                                 encode_call_t const *encode, vram_views_t const *views, float const *x,
                                 vram_pass_t const *pass, int32_t const *frame_rows, size_t clips,
                                 size_t frames, char const **message);

/* The views of the arena a verb makes (output_view), zeroed on the device with their I8 scales, so that
 * the rows of items that fail are zero whether or not a chunk writes them. */
output_view_t vram_output_view_zeroed;

/* ---- Host memory -------------------------------------------------------------------------------- */

/* Where a pointer's memory is, as the CUDA runtime classifies it: host memory it does not know (pageable:
 * copied to a device through pinned staging), pinned host memory, device memory, or managed memory (the
 * last three copied by the runtime straight, cudaMemcpyDefault). */
typedef enum vram_memory {
    VRAM_PAGEABLE = 0,
    VRAM_PINNED,
    VRAM_ON_DEVICE,
    VRAM_MANAGED,
} vram_memory_t;

/* The class of what cudaPointerGetAttributes answered (`error`, and `attributes` when it succeeded): an
 * error or an unregistered pointer is pageable. For tests, beside vram_memory. */
vram_memory_t vram_memory_of(cudaError_t error, struct cudaPointerAttributes const *attributes);

/* The class of `pointer`'s memory (NULL: pageable); the runtime's error, if any, is cleared. */
vram_memory_t vram_memory(void const *pointer);

/* Copies `bytes` from `from` to `to` on the executor's host team (vram_workers), each thread a share;
 * on the calling thread alone when the team cannot be made. Loop thread. */
void vram_copy(uform_executor_t *executor, void *to, void const *from, size_t bytes);

/* ---- The units of a media chunk ------------------------------------------------------------------ */

/* What a media chunk holds: images (one class token each), clips (one per frame), or sounds (one each, with
 * as many patches as the clip). */
typedef enum vram_units_kind {
    VRAM_UNITS_IMAGES = 0,
    VRAM_UNITS_CLIPS,
    VRAM_UNITS_SOUNDS,
} vram_units_kind_t;

/* The plan of a chunk of media items through a tower: its units (the sequences of a class token, the
 * tower's register tokens and the patches: kept images, the frames of kept clips, kept sounds), and the
 * sizes of its index arrays. */
typedef struct vram_units {
    size_t units;   /* class tokens */
    size_t patches; /* patch rows of the kept items, packed in item order */
    size_t tokens;  /* rows of x: patches + units * leading */
    size_t longest; /* the most patches of one unit */
    size_t states;  /* entries of state_rows: items, or items * frames for clips */
    size_t vectors; /* entries of token_rows: items * patches of an image, patches for sounds, 0 for clips */
    size_t bytes;   /* of the four arrays, int32 each, end to end */
} vram_units_t;

/* The plan of a chunk of `count` items whose prepared patch rows are patches[i] (0: a failed item; a
 * clip's `frames` frames share its rows equally; an image has `image_patches`), and, when `base` is not
 * NULL, its index arrays written there, int32 each, end to end: patch offsets [units + 1] into the packed
 * rows, token offsets [units + 1] into x (each unit's `leading` tokens, its class token first, then its
 * patches; cuda_assemble_leading's layout), state rows [states]
 * (each item's class token row, or each frame's for clips; -1 for a failed item) and token rows [vectors]
 * (the rows of x whose projections are token vectors: every patch of every image, -1 for a failed
 * image's; every patch of every kept sound). */
vram_units_t vram_units_plan(vram_units_kind_t kind, size_t const *patches, size_t count, size_t frames,
                             size_t image_patches, size_t leading, void *base);

/* ---- Verbs -------------------------------------------------------------------------------------- */

uform_status_t vram_text_encode(encode_request_t const *request);
uform_status_t vram_text_choose(uform_text_choose_args_t const *args);

/* image_encode_pixels (src/vram/vram_image.c); image_encode of files and encoded images, which it hands
 * to vram_media_encode. */
uform_status_t vram_image_encode(char const *entry, image_request_t const *request);

/* Images from files or memory, clips and sounds (src/vram/vram_media.c): prepared on the host team,
 * computed on the devices. */
uform_status_t vram_media_encode(char const *entry, image_request_t const *images,
                                 audio_request_t const *sounds);

#endif /* UFORM_WITH_CUDA */
