/* The text tower's verbs on a VRAM executor.
 *
 * text_encode: texts are packed in chunks of at most VRAM_CHUNK_TOKENS tokens, spread over the executor's
 * devices (vram_place: chunk k on device k mod N). For each chunk the host writes the byte indices, item
 * offsets and the rows to project into a pinned staging slot of its device; one copy takes them to the
 * device, then the embedding gather, the tower, the projections and the output conversions are enqueued
 * on the device's stream, writing into the device arena (from another device, into its scratch, then
 * copied to the arena's device: vram_views_t); an event closes the chunk. Two slots per device: the host
 * fills one while the device runs the other. The loop polls the events; each chunk that completes reports
 * progress. Outputs are device views: copy them out with uform_view_copy.
 *
 * text_choose: the legal bytes and offsets go to the first device in one copy, the states are read where
 * they are (device views of an earlier call, or host rows copied in), one kernel computes every item's
 * softmax into the device arena. */
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "call.h"
#include "kernels.h"
#include "model.h"
#include "text.h"
#include "vram.h"
#include "vram_support.h"
#include "verbs.h"

#if UFORM_WITH_CUDA

#define VRAM_CHUNK_TOKENS 65536

typedef struct vram_text_call {
    call_t call;
    encode_call_t encode;
    uint64_t polled_ns;
    size_t next_item, done_items;
    loop_op_t poll;
    uint8_t const *bytes; /* host copy of the texts when the tape lives on a device */
    /* A tower that reads tokens (the model has a tokenizer): the texts cut on the host when the call
     * starts, and the prompt put before each. */
    bool reads_tokens;
    bool prompt_failed; /* copying the prompt ran out of memory */
    char *prompt;
    text_tokens_t tokens;
} vram_text_call_t;

_Static_assert(sizeof(vram_text_call_t) <= EXECUTOR_CALL_STORAGE,
               "vram_text_call_t outgrew the call storage");

static void text_end(vram_text_call_t *text) {
    text->encode.stats.total_ns = loop_now_ns() - text->encode.started_ns;
    text->encode.stats.compute_ns = text->encode.stats.total_ns;
    if (text->bytes) free((void *)text->bytes);
    free(text->prompt);
    text_tokens_free(&text->tokens);
    encode_end(&text->encode, text->call.outcome, text->encode.failure);
    call_finish(&text->call, text->encode.failure, text->encode.message);
}

/* The rows item `item` puts in x: BOS and its kept bytes, or its tokens (none for a text the tokenizer
 * refused). */
static size_t text_rows(vram_text_call_t const *text, size_t item) {
    if (text->reads_tokens) return text->tokens.offsets[item + 1] - text->tokens.offsets[item];
    return text_kept(text->encode.model, &text->encode.tape, item) + 1;
}

/* Its token vectors: every byte kept (BOS has none), or every token. */
static size_t text_vectors(vram_text_call_t const *text, size_t item) {
    return text->reads_tokens ? text_rows(text, item) : text_rows(text, item) - 1;
}

/* A chunk's inputs, int32 elements end to end: indices [tokens] (bytes, BOS, or token ids), places
 * [tokens] (learned positions' rows; tokens only), offsets [items + 1], state rows [items], token rows
 * [kept]. */
typedef struct chunk_inputs {
    int32_t *indices, *places, *offsets, *state_rows, *token_rows;
    size_t bytes;
} chunk_inputs_t;

static chunk_inputs_t chunk_inputs(void *base, size_t tokens, size_t items, size_t kept) {
    chunk_inputs_t inputs = {.bytes = (2 * tokens + 2 * items + 1 + kept) * sizeof(int32_t)};
    if (!base) return inputs; /* sizing only */
    inputs.indices = base;
    inputs.places = inputs.indices + tokens;
    inputs.offsets = inputs.places + tokens;
    inputs.state_rows = inputs.offsets + items + 1;
    inputs.token_rows = inputs.state_rows + items;
    return inputs;
}

/* The host side of a chunk of items [first, last) of texts read as bytes: BOS then the kept bytes, the
 * state at the last position, a token vector per byte. */
static void text_pack_bytes(vram_text_call_t const *text, chunk_inputs_t const *host, size_t first,
                            size_t last) {
    uint8_t const *bytes = text->bytes ? text->bytes : text->encode.tape.data;
    size_t row = 0, kept_row = 0;
    for (size_t item = first; item < last; ++item) {
        host->offsets[item - first] = (int32_t)row;
        host->indices[row++] = TEXT_BOS;
        uint8_t const *item_bytes = bytes + text->encode.tape.offsets[item];
        for (size_t i = 0, kept = text_kept(text->encode.model, &text->encode.tape, item); i < kept; ++i) {
            host->token_rows[kept_row++] = (int32_t)row;
            host->indices[row++] = item_bytes[i];
        }
        host->state_rows[item - first] = (int32_t)(row - 1);
    }
    host->offsets[last - first] = (int32_t)row;
}

/* The row of an item's state under the tower's pooling (tower_pool's choice), rows [first, first + count)
 * of x, count > 0; mean pooling reads the offsets instead. */
static int32_t text_state_row(uform_pooling_t pooling, uint32_t const *ids, size_t first, size_t count) {
    size_t row = 0;
    if (pooling == UFORM_POOLING_LAST) row = count - 1;
    if (pooling == UFORM_POOLING_END) /* the first position of the largest id */
        for (size_t t = 1; t < count; ++t)
            if (ids[t] > ids[row]) row = t;
    return (int32_t)(first + row);
}

/* The host side of a chunk of texts cut into tokens: each token's id (past the vocabulary: 0, as the host
 * reads it) and its learned position's row, the state row of the tower's pooling (-1 for a refused text),
 * a token vector per token. */
static void text_pack_tokens(vram_text_call_t const *text, chunk_inputs_t const *host, size_t first,
                             size_t last) {
    uform_model_info_t const *info = &text->encode.model->header.info;
    uform_pooling_t pooling = info->text.transformer.pooling;
    size_t const *offsets = text->tokens.offsets;
    size_t row = 0;
    for (size_t item = first; item < last; ++item) {
        uint32_t const *ids = text->tokens.ids + offsets[item];
        size_t count = offsets[item + 1] - offsets[item], placed = 0;
        host->offsets[item - first] = (int32_t)row;
        host->state_rows[item - first] = count ? text_state_row(pooling, ids, row, count) : -1;
        for (size_t t = 0; t < count; ++t, ++row) {
            host->indices[row] = (int32_t)(ids[t] < info->text.vocab ? ids[t] : 0);
            host->places[row] = info->text.positions ? (int32_t)text_position(info, ids[t], t, &placed) : 0;
            host->token_rows[row] = (int32_t)row;
        }
    }
    host->offsets[last - first] = (int32_t)row;
}

/* x from the chunk's inputs: the byte table's rows, or each token's embedding, token type and position. */
static cudaError_t text_embed(vram_text_call_t const *text, vram_tower_t const *tower, float *x,
                              chunk_inputs_t const *inputs, size_t tokens, cudaStream_t stream) {
    if (!text->reads_tokens)
        return cuda_embed(x, tower->embed, inputs->indices, tokens, tower->hidden, stream);
    return cuda_embed_tokens(x, tower->embed, inputs->indices, tower->token_type, tower->pos, inputs->places,
                             tokens, tower->hidden, stream);
}

/* Enqueues the next chunk, items [first, last), on its device and slot (vram_place). */
static uform_status_t text_issue(vram_text_call_t *text, size_t first, size_t last, char const **message) {
    vram_t *vram = vram_of(text->call.executor);
    size_t d, s;
    vram_place(vram->flights.issued, vram->count, &d, &s);
    vram_device_t *device = &vram->devices[d];
    vram_tower_t const *tower = &text->encode.model->device->replicas[d].text;
    size_t hidden = tower->hidden, items = last - first, tokens = 0, kept_total = 0, max_length = 0;
    for (size_t item = first; item < last; ++item) {
        size_t rows = text_rows(text, item);
        tokens += rows;
        kept_total += text_vectors(text, item);
        if (rows > max_length) max_length = rows;
    }
    if (vram_use(device) != UFORM_OK) return *message = "cannot use the device", UFORM_DEVICE;
    vram_slot_t *slot = &device->slots[s];
    chunk_inputs_t sizing = chunk_inputs(NULL, tokens, items, kept_total);
    void *staging = vram_staging(slot, sizing.bytes);
    if (!staging) return *message = "cannot allocate pinned staging memory", UFORM_OUT_OF_MEMORY;
    chunk_inputs_t host = chunk_inputs(staging, tokens, items, kept_total);
    if (text->reads_tokens)
        text_pack_tokens(text, &host, first, last);
    else
        text_pack_bytes(text, &host, first, last);

    /* Device scratch: inputs, the shadow of the outputs on a device other than the arena's, then the
     * pass through the tower over [rows, hidden]. */
    uform_encoded_t const *encoded = &text->encode.encoded;
    size_t token_first =
        (text->encode.outputs & UFORM_OUTPUT_TOKEN_VECTORS) ? encoded->token_vectors.item_offsets[first] : 0;
    size_t rows = items > kept_total ? items : kept_total;
    size_t const sizes[] = {sizing.bytes, d ? vram_views_bytes(&text->encode, items, kept_total, hidden) : 0};
    void *parts[2];
    vram_pass_t pass;
    if (!vram_chunk_scratch(device, tower, sizes, 2, parts, tokens, rows, text->encode.width, &pass))
        return *message = "cannot allocate device scratch", UFORM_OUT_OF_MEMORY;
    chunk_inputs_t inputs = chunk_inputs(parts[0], tokens, items, kept_total);
    vram_views_t views =
        vram_views_make(&text->encode, d ? parts[1] : NULL, first, items, token_first, kept_total, hidden);
    float *x = pass.x;
    cudaStream_t stream = device->stream;

    VRAM_TRY(cudaMemcpyAsync(inputs.indices, staging, sizing.bytes, cudaMemcpyHostToDevice, stream),
             "cannot copy the chunk to the device");
    VRAM_TRY(cudaEventRecord(slot->copied, stream), "cannot record an event");
    VRAM_TRY(text_embed(text, tower, x, &inputs, tokens, stream), "cannot launch embed");
    uform_transformer_info_t const *settings = &tower->settings;
    uform_status_t status = vram_forward(device, tower, x, tokens, inputs.offsets, items, max_length,
                                         settings->causal, settings->rotary, pass.forward, message);
    if (status != UFORM_OK) return status;
    vram_output_rows_t const output = {
        .state_rows = inputs.state_rows,
        .mean_offsets = text->reads_tokens && settings->pooling == UFORM_POOLING_MEAN ? inputs.offsets : NULL,
        .items = items,
        .token_rows = inputs.token_rows,
        .tokens = kept_total,
        .gather_failed = "cannot launch gather",
        .convert_failed = "cannot launch convert",
    };
    if ((status = vram_output_write(device, tower, &text->encode, &views, x, &pass, &output, message)) !=
            UFORM_OK ||
        (status = vram_views_land(vram, device, &views, message)) != UFORM_OK)
        return status;
    VRAM_TRY(cudaEventRecord(slot->done, stream), "cannot record an event");
    vram_flights_issue(vram, first, last);
    return UFORM_OK;
}

/* The items of the chunk from `first`: at most VRAM_CHUNK_TOKENS tokens, at least one item. */
static size_t text_chunk_last(vram_text_call_t const *text, size_t first) {
    size_t last = first, tokens = 0, items = text->encode.tape.count;
    while (last < items && (last == first || tokens + text_rows(text, last) <= VRAM_CHUNK_TOKENS))
        tokens += text_rows(text, last++);
    return last;
}

/* A chunk done: progress, and cancellation. */
static void text_done(void *context, vram_flight_t const *flight) {
    vram_text_call_t *text = context;
    text->done_items += flight->last - flight->first;
    if (text->encode.failure == UFORM_OK && progress_report(&text->encode.progress, &text->encode.next_step,
                                                            text->done_items, text->encode.tape.count))
        encode_stop(&text->encode, UFORM_CANCELLED, "cancelled by the progress handler");
}

static void text_poll(loop_op_t *op);

/* Polls the chunks in flight, issues chunks into free slots; ends the call when nothing is left. */
static void text_advance(vram_text_call_t *text) {
    vram_t *vram = vram_of(text->call.executor);
    size_t items = text->encode.tape.count;
    char const *message = NULL;
    vram_flights_sweep_encode(vram, &text->encode, text_done, text);
    while (text->encode.failure == UFORM_OK && text->next_item < items && vram_flights_free(vram)) {
        size_t last = text_chunk_last(text, text->next_item);
        uform_status_t status = text_issue(text, text->next_item, last, &message);
        if (status != UFORM_OK) {
            encode_stop(&text->encode, status, message);
            break;
        }
        text->next_item = last;
    }
    if (!vram_flights_busy(vram, false)) {
        /* Nothing runs: on failure, make sure nothing enqueued still writes, then end. */
        for (size_t d = 0; text->encode.failure != UFORM_OK && d < vram->count; ++d)
            cudaStreamSynchronize(vram->devices[d].stream);
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

/* The texts cut into tokens on the host (read where the tape is, or from the host copy), each refused
 * text's status recorded; then the outputs: a row per text, a token vector per token. false with the
 * call stopped. */
static bool text_start_tokens(vram_text_call_t *text, size_t hidden) {
    encode_call_t *encode = &text->encode;
    encode_call_t reading = *encode; /* the cut reads the tape's bytes on the host */
    if (text->bytes) reading.tape.data = text->bytes;
    uform_status_t status =
        text->prompt_failed ? UFORM_OUT_OF_MEMORY : text_tokens_cut(&reading, text->prompt, &text->tokens);
    if (status != UFORM_OK) {
        encode_stop(encode, status,
                    status == UFORM_UNSUPPORTED ? "built without tokenizers: the model's texts cannot be cut"
                                                : "cannot allocate the tokens");
        return false;
    }
    size_t items = encode->tape.count;
    encode->stats.items = items;
    encode->stats.bytes = encode->tape.offsets[items] - encode->tape.offsets[0];
    encode->stats.truncated += text->tokens.truncated;
    if (!encode_outputs(encode, items, hidden, vram_output_view_zeroed) ||
        !text_tokens_vectors(encode, &text->tokens, vram_output_view_zeroed)) {
        encode_stop(encode, UFORM_OUT_OF_MEMORY, "cannot allocate the outputs in the arena");
        return false;
    }
    for (size_t item = 0; item < items; ++item)
        encode->statuses[item] = text->tokens.refused[item];
    return true;
}

static void text_start(call_t *call) {
    vram_text_call_t *text = container_of(call, vram_text_call_t, call);
    vram_device_t *device = &vram_of(call->executor)->devices[0];
    vram_flights_start(vram_of(call->executor));
    size_t items = text->encode.tape.count;
    size_t hidden = text->encode.model->header.info.text.transformer.hidden;
    text->poll.callback = text_poll;
    text->polled_ns = loop_now_ns();
    if (vram_use(device) != UFORM_OK) {
        encode_stop(&text->encode, UFORM_DEVICE, "cannot use the device");
        text_end(text);
        return;
    }

    /* A tape in device memory is read on the host: the bytes are indices the host packs, or texts its
     * tokenizer cuts (pinned and managed memory the host reads where it is). */
    if (vram_memory(text->encode.tape.data) == VRAM_ON_DEVICE) {
        size_t length = text->encode.tape.offsets[items];
        uint8_t *copy = malloc(length ? length : 1);
        if (!copy || cudaMemcpy(copy, text->encode.tape.data, length, cudaMemcpyDefault) != cudaSuccess) {
            cudaGetLastError();
            free(copy);
            encode_stop(&text->encode, UFORM_DEVICE, "cannot copy the texts from the device");
            text_end(text);
            return;
        }
        text->bytes = copy;
    }

    if (text->reads_tokens) {
        if (!text_start_tokens(text, hidden)) {
            text_end(text);
            return;
        }
    } else {
        size_t kept_total = text_count(&text->encode, &text->encode.tape);
        if (!text_outputs(&text->encode, &text->encode.tape, hidden, kept_total)) {
            encode_stop(&text->encode, UFORM_OUT_OF_MEMORY, "cannot allocate the outputs in the arena");
            text_end(text);
            return;
        }
    }
    text_advance(text);
}

/* The call's state from its request, on the calling thread: with a tokenizer, the prompt (checked at
 * the front door) copied. */
static void text_fill(call_t *call, void const *request) {
    vram_text_call_t *text = container_of(call, vram_text_call_t, call);
    encode_request_t const *asked = request;
    encode_call_init(&text->encode, request);
    text->reads_tokens = asked->model->tokenizer != NULL;
    char const *prompt = NULL;
    if (text->reads_tokens) text_prompt(asked->model, asked->config, &prompt);
    if (prompt && *prompt && !(text->prompt = strdup(prompt))) text->prompt_failed = true;
}

uform_status_t vram_text_encode(encode_request_t const *request) {
    if (!request->model->device->replicas[0].has_text) {
        char const *refusal = vram_tower_refusal(&request->model->header.info, "text");
        return call_refuse(request->outcome, UFORM_UNSUPPORTED, "uform_text_encode",
                           refusal ? refusal : "the model has no text tower");
    }
    return encode_run("uform_text_encode", request, sizeof(vram_text_call_t), text_start, text_fill, request);
}

/* ---- text_choose -------------------------------------------------------------------------------- */

static void choose_poll(loop_op_t *op) {
    choose_call_t *choose = container_of(op, choose_call_t, poll);
    vram_device_t *device = &vram_of(choose->call.executor)->devices[0];
    bool done = false;
    if (vram_event_done(device->slots[0].done, &done) != UFORM_OK) {
        cudaStreamSynchronize(device->stream);
        choose_end(choose, UFORM_DEVICE, "a device operation failed");
        return;
    }
    if (!done) {
        loop_timer(choose->call.executor->loop, &choose->poll,
                   vram_poll_ns(loop_now_ns() - choose->started_ns));
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
    choose_call_t *choose = container_of(call, choose_call_t, call);
    vram_device_t *device = &vram_of(call->executor)->devices[0];
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
            ok = cudaMemcpyAsync(states, view->data, states_bytes, cudaMemcpyDeviceToDevice, stream) ==
                 cudaSuccess;
    }
    ok = ok && cuda_choose(probabilities, states, hidden, tower->embed,
                           (uint8_t const *)scratch + round_up_256(offsets_bytes), (int64_t const *)scratch,
                           items, hidden, stream) == cudaSuccess;
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
    return choose_submit(args, choose_start);
}

#endif /* UFORM_WITH_CUDA */
