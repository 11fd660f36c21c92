/* The text tower's verbs on host executors: text_encode and text_choose, behind their front doors
 * (src/encode/verbs.c), which checked the arguments.
 *
 * text_encode packs texts end to end without padding (BOS, then at most `context` bytes each), in
 * chunks of at most the tower's chunk_tokens tokens (a longer text is a chunk of its own), runs the tower
 * on each chunk, and writes the requested outputs into the arena. One chunk runs per loop turn, so
 * progress reports, cancellation and other completions are served between chunks. */
#include <string.h>
#include <time.h>

#include "arena.h"
#include "call.h"
#include "kernels.h"
#include "model.h"
#include "tape.h"
#include "text.h"
#include "tower.h"
#include "verbs.h"

typedef struct text_call {
    call_t call;
    encode_call_t encode;
    size_t next_item;
} text_call_t;

_Static_assert(sizeof(text_call_t) <= EXECUTOR_CALL_STORAGE, "text_call_t outgrew the call storage");

/* ---- text_encode -------------------------------------------------------------------------------- */

size_t text_count(encode_call_t *encode, uform_tape_t const *texts) {
    size_t items = texts->count, kept_total = 0;
    for (size_t item = 0; item < items; ++item) {
        size_t kept = text_kept(encode->model, texts, item);
        kept_total += kept;
        encode->stats.truncated += kept < texts->offsets[item + 1] - texts->offsets[item];
    }
    encode->stats.items = items;
    encode->stats.bytes = texts->offsets[items] - texts->offsets[0];
    return kept_total;
}

bool text_outputs(encode_call_t *encode, uform_tape_t const *texts, size_t hidden, size_t kept_total) {
    uform_arena_t *arena = encode->arena;
    uform_encoded_t *encoded = &encode->encoded;
    size_t items = texts->count;
    if (!encode_outputs(encode, items, hidden, output_view)) return false;
    if (encode->outputs & UFORM_OUTPUT_TOKEN_VECTORS) {
        if (!output_view(arena, kept_total, encode->width, encode->scalar, &encoded->token_vectors))
            return false;
        size_t *offsets = arena_allocate_host(arena, (items + 1) * sizeof(size_t), 16);
        if (!offsets) return false;
        offsets[0] = 0;
        for (size_t item = 0; item < items; ++item)
            offsets[item + 1] = offsets[item] + text_kept(encode->model, texts, item);
        encoded->token_vectors.item_offsets = offsets;
        encoded->token_vectors.items = items;
    }
    return true;
}

static void text_end(text_call_t *text, uform_status_t status, char const *message) {
    text->encode.stats.total_ns = loop_now_ns() - text->encode.started_ns;
    encode_end(&text->encode, text->call.outcome, status);
    call_finish(&text->call, status, message);
}

static void text_chunk(loop_op_t *op);

/* Allocates every output in the arena, then starts the first chunk. */
static void text_start(call_t *call) {
    text_call_t *text = container_of(call, text_call_t, call);
    size_t kept_total = text_count(&text->encode, &text->encode.tape);
    if (!text_outputs(&text->encode, &text->encode.tape, text->encode.model->text->hidden, kept_total)) {
        text_end(text, UFORM_OUT_OF_MEMORY, "cannot allocate the outputs in the arena");
        return;
    }
    text->call.op.callback = text_chunk;
    text_chunk(&text->call.op);
}

/* The chunk's scratch: the tower's, then x [tokens, hidden], token offsets [items + 1], rows to
 * project [tokens, hidden] and their projections [tokens, dims]. */
typedef struct text_scratch {
    void *tower;
    size_t threads; /* the threads the tower's scratch is for */
    float *x, *rows, *projected;
    size_t *offsets;
} text_scratch_t;

static bool text_scratch(text_call_t *text, size_t tokens, text_scratch_t *scratch) {
    tower_t const *tower = text->encode.model->text;
    size_t threads = executor_fork_threads(text->call.executor);
    size_t sizes[] = {
        round_up_64(tower_scratch_bytes(tower, tokens, threads)),
        round_up_64(tokens * tower->hidden * sizeof(float)),
        round_up_64(tokens * tower->hidden * sizeof(float)),
        round_up_64(tokens * tower->dims * sizeof(float)),
        round_up_64((tokens + 1) * sizeof(size_t)),
    };
    size_t total = 0;
    for (size_t i = 0; i < 5; ++i)
        total += sizes[i];
    char *base = executor_scratch(text->call.executor, total);
    if (!base) return false;
    scratch->tower = base;
    scratch->threads = threads;
    scratch->x = (float *)(base += sizes[0]);
    scratch->rows = (float *)(base += sizes[1]);
    scratch->projected = (float *)(base += sizes[2]);
    scratch->offsets = (size_t *)(base + sizes[3]);
    return true;
}

/* Projects `count` rows of the final states, normalizes them (at the output width) and writes them to
 * rows [first_row, first_row + count) of `view`. */
static void text_project(text_call_t *text, text_scratch_t *scratch, float const *rows, size_t count,
                         uform_view_t *view, size_t first_row) {
    tower_t const *tower = text->encode.model->text;
    uform_executor_t *executor = text->call.executor;
    if (count == 0) return;
    tower_linear(tower, executor, &tower->proj, rows, tower->hidden, count, text->encode.width,
                 scratch->projected, text->encode.width);
    uint64_t converting = loop_now_ns();
    for (size_t row = 0; row < count; ++row) {
        float *values = scratch->projected + row * text->encode.width;
        tower->kernels->normalize(values, text->encode.width);
        output_row(tower->kernels, view, first_row + row, values);
    }
    text->encode.stats.convert_ns += loop_now_ns() - converting;
}

static void text_chunk(loop_op_t *op) {
    text_call_t *text = container_of(op, text_call_t, call.op);
    uform_model_t const *model = text->encode.model;
    uform_tape_t const *texts = &text->encode.tape;
    tower_t const *tower = model->text;
    kernels_t const *kernels = tower->kernels;
    uform_executor_t *executor = text->call.executor;
    size_t hidden = tower->hidden, items = texts->count;

    /* The chunk: items [first, last), at least one. */
    size_t first = text->next_item, last = first, tokens = 0, most = tower->chunk_tokens;
    while (last < items && (last == first || tokens + text_kept(model, texts, last) + 1 <= most))
        tokens += text_kept(model, texts, last++) + 1;
    text_scratch_t scratch;
    if (!text_scratch(text, tokens, &scratch)) {
        text_end(text, UFORM_OUT_OF_MEMORY, "cannot allocate the executor's scratch");
        return;
    }
    uint64_t computing = loop_now_ns();

    /* x = the byte table's rows: BOS, then the kept bytes of each text.        [tokens, hidden] */
    uint16_t const *embed = tower->embed;
    uint8_t const *bytes = texts->data;
    size_t row = 0;
    for (size_t item = first; item < last; ++item) {
        scratch.offsets[item - first] = row;
        kernels->bf16_to_f32(scratch.x + row++ * hidden, embed + TEXT_BOS * hidden, hidden);
        uint8_t const *item_bytes = bytes + texts->offsets[item];
        for (size_t i = 0, kept = text_kept(model, texts, item); i < kept; ++i)
            kernels->bf16_to_f32(scratch.x + row++ * hidden, embed + (size_t)item_bytes[i] * hidden, hidden);
    }
    scratch.offsets[last - first] = row;

    tower_batch_t batch = {
        .tokens = tokens,
        .items = last - first,
        .offsets = scratch.offsets,
        .x = scratch.x,
        .scratch = scratch.tower,
        .threads = scratch.threads,
    };
    tower_forward(tower, executor, &batch);

    /* The state of an item is its last position; token vectors are every position but BOS. */
    uform_encoded_t *encoded = &text->encode.encoded;
    for (size_t item = first; item < last; ++item) {
        float const *state = scratch.x + (scratch.offsets[item - first + 1] - 1) * hidden;
        memcpy(scratch.rows + (item - first) * hidden, state, hidden * sizeof(float));
        if (text->encode.outputs & UFORM_OUTPUT_STATES) output_row(kernels, &encoded->states, item, state);
    }
    if (text->encode.outputs & UFORM_OUTPUT_EMBEDDINGS)
        text_project(text, &scratch, scratch.rows, last - first, &encoded->embeddings, first);
    if (text->encode.outputs & UFORM_OUTPUT_TOKEN_VECTORS) {
        size_t kept_rows = 0;
        for (size_t item = first; item < last; ++item) {
            size_t kept = text_kept(model, texts, item);
            memcpy(scratch.rows + kept_rows * hidden,
                   scratch.x + (scratch.offsets[item - first] + 1) * hidden, kept * hidden * sizeof(float));
            kept_rows += kept;
        }
        text_project(text, &scratch, scratch.rows, kept_rows, &encoded->token_vectors,
                     encoded->token_vectors.item_offsets[first]);
    }
    text->encode.stats.compute_ns += loop_now_ns() - computing;
    text->next_item = last;

    if (progress_report(&text->encode.progress, &text->encode.next_step, last, items)) {
        text_end(text, UFORM_CANCELLED, "cancelled by the progress handler");
        return;
    }
    if (last == items) {
        text_end(text, UFORM_OK, NULL);
        return;
    }
    /* The next chunk runs on the next loop turn. */
    loop_post(executor->loop, &text->call.op);
}

/* The call's state from its request, on the calling thread. */
static void text_fill(call_t *call, void const *request) {
    text_call_t *text = container_of(call, text_call_t, call);
    encode_call_init(&text->encode, request);
}

uform_status_t text_encode_host(encode_request_t const *request) {
    return encode_run("uform_text_encode", request, sizeof(text_call_t), text_start, text_fill, request);
}

/* ---- text_choose -------------------------------------------------------------------------------- */

_Static_assert(sizeof(choose_call_t) <= EXECUTOR_CALL_STORAGE, "choose_call_t outgrew the call storage");

void choose_end(choose_call_t *choose, uform_status_t status, char const *message) {
    if (status == UFORM_OK) {
        choose->call.outcome->product = OUTCOME_PRODUCT_PROBABILITIES;
        choose->call.outcome->probabilities = choose->probabilities;
    }
    arena_end(choose->arena);
    uform_model_free(choose->model);
    call_finish(&choose->call, status, message);
}

/* The call's state from its checked arguments, on the calling thread. */
static void choose_fill(call_t *call, void const *request) {
    uform_text_choose_args_t const *args = request;
    choose_call_t *choose = container_of(call, choose_call_t, call);
    choose->model = args->model;
    model_retain(choose->model);
    choose->arena = args->arena;
    choose->states = *args->states;
    choose->choices = args->choices;
    if (args->progress) choose->progress = *args->progress;
    choose->next_step = 1;
}

/* call_run's keep: the probabilities of a successful blocking call (nothing for a failed one). */
static void choose_keep(uform_outcome_t *own, void *probabilities) {
    uform_outcome_probabilities(own, probabilities);
}

uform_status_t choose_submit(uform_text_choose_args_t const *args, void (*start)(call_t *call)) {
    call_plan_t plan = call_plan("uform_text_choose", args->executor, args->arena, args->outcome,
                                 sizeof(choose_call_t), start);
    plan.fill = (call_fill_t){choose_fill, args};
    plan.keep = (call_keep_t){choose_keep, args->probabilities};
    return call_run(&plan);
}

/* Per item: logits = state . embed[legal]^T through the tied byte table, then the softmax over them.
 * One F32 per legal byte, in the order the item lists them. */
static void choose_start(call_t *call) {
    choose_call_t *choose = container_of(call, choose_call_t, call);
    tower_t const *tower = choose->model->text;
    kernels_t const *kernels = tower->kernels;
    size_t hidden = tower->hidden, items = choose->choices.count;
    size_t const *offsets = choose->choices.offsets;
    size_t total = offsets[items] - offsets[0];
    float *probabilities = arena_allocate(choose->arena, total * sizeof(float) + 1, 64);
    size_t *item_offsets = arena_allocate(choose->arena, (items + 1) * sizeof(size_t), 16);
    float *state = executor_scratch(call->executor, 2 * hidden * sizeof(float));
    if (!probabilities || !item_offsets || !state) {
        choose_end(choose, UFORM_OUT_OF_MEMORY, "cannot allocate the probabilities");
        return;
    }
    float *row = state + hidden;
    uint16_t const *embed = tower->embed;
    uint8_t const *legal = choose->choices.data;
    for (size_t item = 0; item < items; ++item) {
        item_offsets[item] = offsets[item] - offsets[0];
        void const *source = (unsigned char const *)choose->states.data + item * choose->states.row_stride;
        if (choose->states.scalar == UFORM_BF16)
            kernels->bf16_to_f32(state, source, hidden);
        else
            memcpy(state, source, hidden * sizeof(float));
        float *logits = probabilities + item_offsets[item];
        for (size_t i = offsets[item]; i < offsets[item + 1]; ++i) {
            kernels->bf16_to_f32(row, embed + (size_t)legal[i] * hidden, hidden);
            float sum = 0;
            for (size_t j = 0; j < hidden; ++j)
                sum += state[j] * row[j];
            logits[i - offsets[item]] = sum;
        }
        kernels->softmax(logits, offsets[item + 1] - offsets[item]);
        if (progress_report(&choose->progress, &choose->next_step, item + 1, items)) {
            choose_end(choose, UFORM_CANCELLED, "cancelled by the progress handler");
            return;
        }
    }
    item_offsets[items] = total;
    choose->probabilities = arena_view(choose->arena, probabilities, total, 1, UFORM_F32);
    choose->probabilities.item_offsets = item_offsets;
    choose->probabilities.items = items;
    choose_end(choose, UFORM_OK, NULL);
}

uform_status_t text_choose_host(uform_text_choose_args_t const *args) {
    return choose_submit(args, choose_start);
}
