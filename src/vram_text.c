/* The text tower's verbs on a VRAM executor.
 *
 * text_encode: texts are packed in chunks of at most VRAM_CHUNK_TOKENS tokens. For each chunk the host
 * writes the byte indices, item offsets and the rows to project into a pinned staging slot; one copy
 * takes them to the device, then the embedding gather, the tower, the projections and the output
 * conversions are enqueued on the device's stream, writing straight into the device arena; an event
 * closes the chunk. Two slots per device: the host fills one while the device runs the other. The
 * loop polls the events; each chunk that completes reports progress. Outputs are device views: copy
 * them out with uform_view_copy.
 *
 * text_choose: the legal bytes and offsets go to the device in one copy, the states are read where
 * they are (device views of an earlier call, or host rows copied in), one kernel computes every
 * item's softmax into the device arena. */
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "vram.h"

#if UFORM_WITH_CUDA

#define VRAM_CHUNK_TOKENS 65536
#define TEXT_BOS          256

#define LAUNCH_OR(call, what)                                                                                \
    do {                                                                                                     \
        if ((call) != cudaSuccess) {                                                                         \
            cudaGetLastError();                                                                              \
            *message = what;                                                                                 \
            return UFORM_DEVICE;                                                                             \
        }                                                                                                    \
    } while (0)

typedef struct vram_chunk {
    size_t first, last; /* items */
    bool busy;
} vram_chunk_t;

typedef struct vram_text_call {
    call_t call;
    uform_model_t *model;
    uform_arena_t *arena;
    uform_tape_t texts;
    uform_outputs_t outputs;
    uform_scalar_t scalar;
    size_t width;
    uform_progress_t progress;
    size_t next_step;
    uform_encode_stats_t *stats_out;
    uform_encode_stats_t stats;
    uint64_t started_ns, polled_ns;
    size_t next_item, done_items;
    size_t next_slot;
    vram_chunk_t chunks[VRAM_SLOTS];
    loop_op_t poll;
    uform_status_t failure;
    char const *message;
    uint8_t const *bytes; /* host copy of the texts when the tape lives on a device */
    uform_encoded_t encoded;
} vram_text_call_t;

_Static_assert(sizeof(vram_text_call_t) <= EXECUTOR_CALL_STORAGE, "vram_text_call_t outgrew the call storage");

static size_t text_kept(vram_text_call_t const *text, size_t item) {
    size_t length = text->texts.offsets[item + 1] - text->texts.offsets[item];
    size_t context = text->model->header.info.text.context;
    return length < context ? length : context;
}

static void text_end(vram_text_call_t *text) {
    text->stats.total_ns = loop_now_ns() - text->started_ns;
    text->stats.compute_ns = text->stats.total_ns;
    if (text->stats_out) *text->stats_out = text->stats;
    if (text->failure == UFORM_OK) {
        text->call.outcome->product = OUTCOME_PRODUCT_ENCODED;
        text->call.outcome->encoded = text->encoded;
    }
    if (text->bytes) free((void *)text->bytes);
    arena_end(text->arena);
    uform_model_free(text->model);
    call_finish(&text->call, text->failure, text->message);
}

static void text_stop(vram_text_call_t *text, uform_status_t status, char const *message) {
    if (text->failure != UFORM_OK) return;
    text->failure = status;
    text->message = message;
}

/* Sizes of a chunk's inputs, in int32 elements: indices [tokens], offsets [items + 1], last rows
 * [items], token rows [kept]. */
typedef struct chunk_inputs {
    int32_t *indices, *offsets, *last_rows, *token_rows;
    size_t bytes;
} chunk_inputs_t;

static chunk_inputs_t chunk_inputs(void *base, size_t tokens, size_t items, size_t kept) {
    chunk_inputs_t inputs = {.bytes = (tokens + 2 * items + 1 + kept) * sizeof(int32_t)};
    if (!base) return inputs; /* sizing only */
    inputs.indices = base;
    inputs.offsets = inputs.indices + tokens;
    inputs.last_rows = inputs.offsets + items + 1;
    inputs.token_rows = inputs.last_rows + items;
    return inputs;
}

static size_t round_up_256(size_t bytes) {
    return (bytes + 255) & ~(size_t)255;
}

/* Enqueues the chunk of items [first, last) in slot `s` of the first device. */
static uform_status_t text_issue(vram_text_call_t *text, size_t s, size_t first, size_t last, char const **message) {
    vram_device_t *device = &text->call.executor->vram->devices[0];
    vram_tower_t const *tower = &text->model->device->replicas[0].text;
    size_t hidden = tower->hidden, items = last - first, tokens = 0, kept_total = 0, max_length = 0;
    for (size_t item = first; item < last; ++item) {
        size_t kept = text_kept(text, item);
        tokens += kept + 1;
        kept_total += kept;
        if (kept + 1 > max_length) max_length = kept + 1;
    }
    vram_slot_t *slot = &device->slots[s];
    chunk_inputs_t sizing = chunk_inputs(NULL, tokens, items, kept_total);
    void *staging = vram_staging(slot, sizing.bytes);
    if (!staging) return *message = "cannot allocate pinned staging memory", UFORM_OUT_OF_MEMORY;
    chunk_inputs_t host = chunk_inputs(staging, tokens, items, kept_total);
    uint8_t const *bytes = text->bytes ? text->bytes : text->texts.data;
    size_t row = 0, kept_row = 0;
    for (size_t item = first; item < last; ++item) {
        host.offsets[item - first] = (int32_t)row;
        host.indices[row++] = TEXT_BOS;
        uint8_t const *item_bytes = bytes + text->texts.offsets[item];
        for (size_t i = 0, kept = text_kept(text, item); i < kept; ++i) {
            host.token_rows[kept_row++] = (int32_t)row;
            host.indices[row++] = item_bytes[i];
        }
        host.last_rows[item - first] = (int32_t)(row - 1);
    }
    host.offsets[items] = (int32_t)row;

    /* Device scratch: inputs, x [tokens, hidden] F32, the forward's, gathered rows F32 and BF16
     * [rows, hidden], projections [rows, width]. */
    size_t rows = items > kept_total ? items : kept_total;
    size_t sizes[] = {
        round_up_256(sizing.bytes),
        round_up_256(tokens * hidden * sizeof(float)),
        round_up_256(vram_forward_scratch(tower, tokens)),
        round_up_256(rows * hidden * sizeof(float)),
        round_up_256(rows * hidden * 2),
        round_up_256(rows * text->width * sizeof(float)),
    };
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; ++i)
        total += sizes[i];
    char *base = vram_scratch(device, total);
    if (!base) return *message = "cannot allocate device scratch", UFORM_OUT_OF_MEMORY;
    chunk_inputs_t inputs = chunk_inputs(base, tokens, items, kept_total);
    float *x = (float *)(base += sizes[0]);
    void *forward = base += sizes[1];
    float *gathered = (float *)(base += sizes[2]);
    uint16_t *gathered_bf16 = (uint16_t *)(base += sizes[3]);
    float *projected = (float *)(base + sizes[4]);
    cudaStream_t stream = device->stream;

    LAUNCH_OR(cudaMemcpyAsync(inputs.indices, staging, sizing.bytes, cudaMemcpyHostToDevice, stream),
              "cannot copy the chunk to the device");
    LAUNCH_OR(cuda_embed(x, tower->embed, inputs.indices, tokens, hidden, stream), "cannot launch embed");
    uform_status_t status = vram_forward(device, tower, x, tokens, inputs.offsets, items, max_length, true, true,
                                         forward, message);
    if (status != UFORM_OK) return status;

    uform_encoded_t *encoded = &text->encoded;
    if (text->outputs & (UFORM_OUTPUT_EMBEDDINGS | UFORM_OUTPUT_STATES)) {
        LAUNCH_OR(cuda_gather_rows(gathered, hidden, x, hidden, inputs.last_rows, items, hidden, stream),
                  "cannot launch gather");
        if (text->outputs & UFORM_OUTPUT_STATES) {
            uform_view_t const *states = &encoded->states;
            float *scales = states->scales ? (float *)states->scales + first : NULL;
            LAUNCH_OR(cuda_convert((unsigned char *)states->data + first * states->row_stride, states->row_stride,
                                   scales, gathered, hidden, items, hidden, (int)states->scalar, stream),
                      "cannot launch convert");
        }
        if (text->outputs & UFORM_OUTPUT_EMBEDDINGS) {
            LAUNCH_OR(cuda_f32_to_bf16(gathered_bf16, gathered, items * hidden, stream), "cannot launch convert");
            status = vram_project(device, tower, gathered_bf16, items, text->width, projected, &encoded->embeddings,
                                  first, message);
            if (status != UFORM_OK) return status;
        }
    }
    if ((text->outputs & UFORM_OUTPUT_TOKEN_VECTORS) && kept_total) {
        LAUNCH_OR(cuda_gather_rows(gathered, hidden, x, hidden, inputs.token_rows, kept_total, hidden, stream),
                  "cannot launch gather");
        LAUNCH_OR(cuda_f32_to_bf16(gathered_bf16, gathered, kept_total * hidden, stream), "cannot launch convert");
        status = vram_project(device, tower, gathered_bf16, kept_total, text->width, projected,
                              &encoded->token_vectors, encoded->token_vectors.item_offsets[first], message);
        if (status != UFORM_OK) return status;
    }
    LAUNCH_OR(cudaEventRecord(slot->done, stream), "cannot record an event");
    return UFORM_OK;
}

static void text_poll(loop_op_t *op);

/* Issues chunks into free slots, then polls the busy ones; ends the call when nothing is left. */
static void text_advance(vram_text_call_t *text) {
    vram_device_t *device = &text->call.executor->vram->devices[0];
    size_t items = text->texts.count;
    for (size_t s = 0; s < VRAM_SLOTS; ++s) {
        vram_chunk_t *chunk = &text->chunks[s];
        if (!chunk->busy) continue;
        bool done = false;
        if (vram_event_done(device->slots[s].done, &done) != UFORM_OK) {
            text_stop(text, UFORM_DEVICE, "a device operation failed");
            chunk->busy = false;
            continue;
        }
        if (!done) continue;
        chunk->busy = false;
        text->done_items += chunk->last - chunk->first;
        if (text->failure == UFORM_OK &&
            progress_report(&text->progress, &text->next_step, text->done_items, items))
            text_stop(text, UFORM_CANCELLED, "cancelled by the progress handler");
    }
    while (text->failure == UFORM_OK && text->next_item < items && !text->chunks[text->next_slot].busy) {
        size_t s = text->next_slot, first = text->next_item, last = first, tokens = 0;
        while (last < items && (last == first || tokens + text_kept(text, last) + 1 <= VRAM_CHUNK_TOKENS))
            tokens += text_kept(text, last++) + 1;
        char const *message = NULL;
        uform_status_t status = text_issue(text, s, first, last, &message);
        if (status != UFORM_OK) {
            text_stop(text, status, message);
            break;
        }
        text->chunks[s] = (vram_chunk_t){first, last, true};
        text->next_item = last;
        text->next_slot = (s + 1) % VRAM_SLOTS;
    }
    bool busy = false;
    for (size_t s = 0; s < VRAM_SLOTS; ++s)
        busy |= text->chunks[s].busy;
    if (!busy) {
        /* Nothing runs: on failure, make sure nothing enqueued still writes, then end. */
        if (text->failure != UFORM_OK) cudaStreamSynchronize(device->stream);
        text_end(text);
        return;
    }
    uint64_t now = loop_now_ns();
    loop_timer(text->call.executor->loop, &text->poll, vram_poll_ns(now - text->polled_ns));
}

static void text_poll(loop_op_t *op) {
    vram_text_call_t *text = container_of(op, vram_text_call_t, poll);
    text_advance(text);
}

static bool output_view(uform_arena_t *arena, size_t rows, size_t columns, uform_scalar_t scalar,
                        uform_view_t *view) {
    void *data = arena_allocate(arena, rows * columns * uform_scalar_size(scalar) + 1, 64);
    if (!data) return false;
    *view = arena_view(arena, data, rows, columns, scalar);
    if (scalar == UFORM_I8) {
        float *scales = arena_allocate(arena, rows * sizeof(float) + 1, 16);
        if (!scales) return false;
        view->scales = scales;
    }
    return true;
}

static void text_start(call_t *call) {
    vram_text_call_t *text = container_of(call, vram_text_call_t, call);
    uform_arena_t *arena = text->arena;
    vram_device_t *device = &call->executor->vram->devices[0];
    size_t items = text->texts.count, kept_total = 0;
    size_t hidden = text->model->header.info.text.transformer.hidden;
    text->poll.callback = text_poll;
    text->polled_ns = loop_now_ns();
    if (vram_use(device) != UFORM_OK) {
        text_stop(text, UFORM_DEVICE, "cannot use the device");
        text_end(text);
        return;
    }
    for (size_t item = 0; item < items; ++item) {
        size_t kept = text_kept(text, item);
        kept_total += kept;
        text->stats.truncated += kept < text->texts.offsets[item + 1] - text->texts.offsets[item];
    }
    text->stats.items = items;
    text->stats.bytes = text->texts.offsets[items] - text->texts.offsets[0];

    /* A tape in device memory is read on the host: the bytes are indices the host packs. */
    struct cudaPointerAttributes attributes;
    if (text->texts.data && cudaPointerGetAttributes(&attributes, text->texts.data) == cudaSuccess &&
        attributes.type == cudaMemoryTypeDevice) {
        size_t length = text->texts.offsets[items];
        uint8_t *copy = malloc(length ? length : 1);
        if (!copy || cudaMemcpy(copy, text->texts.data, length, cudaMemcpyDeviceToHost) != cudaSuccess) {
            free(copy);
            text_stop(text, UFORM_DEVICE, "cannot copy the texts from the device");
            text_end(text);
            return;
        }
        text->bytes = copy;
    }
    cudaGetLastError();

    uform_encoded_t *encoded = &text->encoded;
    memset(encoded, 0, sizeof *encoded);
    encoded->items = items;
    uform_status_t *statuses = arena_allocate_host(arena, items * sizeof *statuses, 16);
    bool ok = statuses != NULL;
    if (ok) {
        memset(statuses, 0, items * sizeof *statuses);
        encoded->statuses = statuses;
    }
    if (ok && (text->outputs & UFORM_OUTPUT_EMBEDDINGS))
        ok = output_view(arena, items, text->width, text->scalar, &encoded->embeddings);
    if (ok && (text->outputs & UFORM_OUTPUT_STATES))
        ok = output_view(arena, items, hidden, text->scalar, &encoded->states);
    if (ok && (text->outputs & UFORM_OUTPUT_TOKEN_VECTORS)) {
        ok = output_view(arena, kept_total, text->width, text->scalar, &encoded->token_vectors);
        size_t *offsets = ok ? arena_allocate_host(arena, (items + 1) * sizeof(size_t), 16) : NULL;
        if ((ok = offsets != NULL)) {
            offsets[0] = 0;
            for (size_t item = 0; item < items; ++item)
                offsets[item + 1] = offsets[item] + text_kept(text, item);
            encoded->token_vectors.item_offsets = offsets;
            encoded->token_vectors.items = items;
        }
    }
    if (!ok) {
        text_stop(text, UFORM_OUT_OF_MEMORY, "cannot allocate the outputs in the arena");
        text_end(text);
        return;
    }
    text_advance(text);
}

uform_status_t vram_text_encode(uform_text_encode_args_t const *args) {
    static char const entry[] = "uform_text_encode";
    uform_outcome_t *outcome = args->outcome;
    uform_outcome_t own;
    call_t *call = NULL;
    uform_status_t status =
        call_open(args->executor, args->arena, outcome, &own, sizeof(vram_text_call_t), entry, &call);
    if (status != UFORM_OK) return status;
    vram_text_call_t *text = container_of(call, vram_text_call_t, call);
    text->call.start = text_start;
    uform_encode_config_t const *config = args->config;
    text->model = args->model;
    model_retain(text->model);
    text->arena = args->arena;
    text->texts = args->texts;
    text->outputs = args->outputs;
    text->scalar = config ? config->outputs_scalar : UFORM_F32;
    text->width = config && config->matryoshka ? config->matryoshka : args->model->header.info.dims;
    if (config) text->progress = config->progress;
    text->next_step = 1;
    text->stats_out = config ? config->stats : NULL;
    text->started_ns = loop_now_ns();
    call_submit(&text->call);
    if (outcome) return UFORM_OK;
    status = call_wait(outcome_of(&own));
    if (status == UFORM_OK) uform_outcome_encoded(&own, args->encoded);
    return status;
}

/* ---- text_choose -------------------------------------------------------------------------------- */

typedef struct vram_choose_call {
    call_t call;
    uform_model_t *model;
    uform_arena_t *arena;
    uform_view_t states;
    uform_tape_t choices;
    uform_progress_t progress;
    size_t next_step;
    uint64_t started_ns;
    loop_op_t poll;
    uform_view_t probabilities;
} vram_choose_call_t;

_Static_assert(sizeof(vram_choose_call_t) <= EXECUTOR_CALL_STORAGE, "vram_choose_call_t outgrew the call storage");

static void choose_end(vram_choose_call_t *choose, uform_status_t status, char const *message) {
    if (status == UFORM_OK) {
        choose->call.outcome->product = OUTCOME_PRODUCT_PROBABILITIES;
        choose->call.outcome->probabilities = choose->probabilities;
    }
    arena_end(choose->arena);
    uform_model_free(choose->model);
    call_finish(&choose->call, status, message);
}

static void choose_poll(loop_op_t *op) {
    vram_choose_call_t *choose = container_of(op, vram_choose_call_t, poll);
    vram_device_t *device = &choose->call.executor->vram->devices[0];
    bool done = false;
    if (vram_event_done(device->slots[0].done, &done) != UFORM_OK) {
        cudaStreamSynchronize(device->stream);
        choose_end(choose, UFORM_DEVICE, "a device operation failed");
        return;
    }
    if (!done) {
        loop_timer(choose->call.executor->loop, &choose->poll, vram_poll_ns(loop_now_ns() - choose->started_ns));
        return;
    }
    size_t items = choose->choices.count;
    if (progress_report(&choose->progress, &choose->next_step, items, items)) {
        choose_end(choose, UFORM_CANCELLED, "cancelled by the progress handler");
        return;
    }
    choose_end(choose, UFORM_OK, NULL);
}

static void choose_start(call_t *call) {
    vram_choose_call_t *choose = container_of(call, vram_choose_call_t, call);
    vram_device_t *device = &call->executor->vram->devices[0];
    vram_tower_t const *tower = &choose->model->device->replicas[0].text;
    size_t hidden = tower->hidden, items = choose->choices.count;
    size_t const *offsets = choose->choices.offsets;
    size_t total = offsets[items] - offsets[0];
    choose->poll.callback = choose_poll;
    choose->started_ns = loop_now_ns();
    if (vram_use(device) != UFORM_OK) {
        choose_end(choose, UFORM_DEVICE, "cannot use the device");
        return;
    }
    float *probabilities = arena_allocate(choose->arena, total * sizeof(float) + 1, 64);
    size_t *item_offsets = arena_allocate_host(choose->arena, (items + 1) * sizeof(size_t), 16);
    /* Staging: offsets int64 [items + 1], the legal bytes, then host states as F32 when they are not
     * on the device. */
    bool host_states = !choose->states.device;
    size_t offsets_bytes = (items + 1) * sizeof(int64_t);
    size_t legal_bytes = round_up_256(total);
    size_t states_bytes = items * hidden * sizeof(float);
    size_t staged = round_up_256(offsets_bytes) + legal_bytes + (host_states ? states_bytes : 0);
    char *staging = vram_staging(&device->slots[0], staged);
    char *scratch = vram_scratch(device, staged + states_bytes);
    if (!probabilities || !item_offsets || !staging || !scratch) {
        choose_end(choose, UFORM_OUT_OF_MEMORY, "cannot allocate the probabilities");
        return;
    }
    int64_t *host_offsets = (int64_t *)staging;
    for (size_t item = 0; item <= items; ++item) {
        host_offsets[item] = (int64_t)(offsets[item] - offsets[0]);
        item_offsets[item] = offsets[item] - offsets[0];
    }
    memcpy(staging + round_up_256(offsets_bytes), (uint8_t const *)choose->choices.data + offsets[0], total);
    float *states = (float *)(scratch + staged);
    uform_view_t const *view = &choose->states;
    if (host_states) {
        float *rows = (float *)(staging + round_up_256(offsets_bytes) + legal_bytes);
        for (size_t item = 0; item < items; ++item) {
            void const *source = (unsigned char const *)view->data + item * view->row_stride;
            if (view->scalar == UFORM_BF16)
                for (size_t j = 0; j < hidden; ++j)
                    rows[item * hidden + j] = bf16_to_f32(((uint16_t const *)source)[j]);
            else
                memcpy(rows + item * hidden, source, hidden * sizeof(float));
        }
        states = (float *)(scratch + round_up_256(offsets_bytes) + legal_bytes);
    }
    cudaStream_t stream = device->stream;
    bool ok = cudaMemcpyAsync(scratch, staging, staged, cudaMemcpyHostToDevice, stream) == cudaSuccess;
    if (ok && !host_states) {
        if (view->scalar == UFORM_BF16)
            ok = cuda_bf16_to_f32(states, view->data, items * hidden, stream) == cudaSuccess;
        else
            ok = cudaMemcpyAsync(states, view->data, states_bytes, cudaMemcpyDeviceToDevice, stream) == cudaSuccess;
    }
    ok = ok && cuda_choose(probabilities, states, hidden, tower->embed, (uint8_t const *)scratch + round_up_256(offsets_bytes),
                           (int64_t const *)scratch, items, hidden, stream) == cudaSuccess;
    ok = ok && cudaEventRecord(device->slots[0].done, stream) == cudaSuccess;
    if (!ok) {
        cudaGetLastError();
        cudaStreamSynchronize(stream);
        choose_end(choose, UFORM_DEVICE, "cannot launch the choice on the device");
        return;
    }
    choose->probabilities = arena_view(choose->arena, probabilities, total, 1, UFORM_F32);
    choose->probabilities.item_offsets = item_offsets;
    choose->probabilities.items = items;
    loop_timer(call->executor->loop, &choose->poll, vram_poll_ns(0));
}

uform_status_t vram_text_choose(uform_text_choose_args_t const *args) {
    static char const entry[] = "uform_text_choose";
    uform_outcome_t *outcome = args->outcome;
    uform_outcome_t own;
    call_t *call = NULL;
    uform_status_t status =
        call_open(args->executor, args->arena, outcome, &own, sizeof(vram_choose_call_t), entry, &call);
    if (status != UFORM_OK) return status;
    vram_choose_call_t *choose = container_of(call, vram_choose_call_t, call);
    choose->call.start = choose_start;
    choose->model = args->model;
    model_retain(choose->model);
    choose->arena = args->arena;
    choose->states = *args->states;
    choose->choices = args->choices;
    if (args->progress) choose->progress = *args->progress;
    choose->next_step = 1;
    call_submit(&choose->call);
    if (outcome) return UFORM_OK;
    status = call_wait(outcome_of(&own));
    if (status == UFORM_OK) uform_outcome_probabilities(&own, args->probabilities);
    return status;
}

#endif /* UFORM_WITH_CUDA */
