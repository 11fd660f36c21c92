/* What the encode verbs share (text, image, video and audio, on host and VRAM executors): their
 * arguments and the checks on them, the state a call keeps from its start to its end, and the outputs
 * it writes into the arena.
 *
 * A verb's life with these: encode_check on the request at its front door (src/encode/verbs.c); then,
 * in its host or VRAM implementation, call_run of its encode_plan, encode_call_init on its state; on the
 * loop thread encode_outputs (encode_statuses, output_view) for the outputs, output_row (or device kernels)
 * for the rows, encode_stop on a failure; at the end encode_end, then call_finish. */
#pragma once

#include "call.h"
#include "kernels.h"

/* ---- Arguments ---------------------------------------------------------------------------------- */

/* The arguments every encode verb takes, with its tape of items. */
typedef struct encode_request {
    UFORM_ENCODE_COMMON;
    uform_tape_t tape;
} encode_request_t;

/* The request of a verb's `args` (any `uform_*_encode*_args_t`), whose items are in `args->tape_field`. */
#define ENCODE_REQUEST(args, tape_field)                                                                     \
    ((encode_request_t){                                                                                     \
        .model = (args)->model,                                                                              \
        .executor = (args)->executor,                                                                        \
        .outputs = (args)->outputs,                                                                          \
        .arena = (args)->arena,                                                                              \
        .config = (args)->config,                                                                            \
        .encoded = (args)->encoded,                                                                          \
        .outcome = (args)->outcome,                                                                          \
        .tape = (args)->tape_field,                                                                          \
    })

/* The checks every encode verb makes before submission: model, arena (and its executor), outputs,
 * config (scalar, matryoshka width), the results slot of a blocking call, and a non-empty, ordered
 * tape. UFORM_OK, or UFORM_INVALID_ARGUMENT with a message. */
uform_status_t encode_check(encode_request_t const *request, char const **message);

/* ---- The call ----------------------------------------------------------------------------------- */

/* The state every encode call keeps: a member of each verb's call state. */
typedef struct encode_call {
    uform_model_t *model; /* retained by encode_call_init, released by encode_end */
    uform_arena_t *arena; /* taken by call_run, ended by encode_end */
    uform_tape_t tape;    /* the items */
    uform_outputs_t outputs;
    uform_scalar_t scalar;
    size_t width;   /* embedding and token-vector columns: dims or a matryoshka width */
    bool normalize; /* unit vectors: the model's family gives them so, or the config asks for them */
    uform_progress_t progress;
    size_t next_step;
    uform_encode_stats_t *stats_out; /* the caller's, written by encode_end; may be NULL */
    uform_encode_stats_t stats;
    uint64_t started_ns;
    uform_status_t *statuses; /* [items] in host memory (encode_statuses), or NULL before */
    uform_status_t failure;   /* the first failure (encode_stop): once set, nothing new starts */
    char const *message;
    uform_encoded_t encoded; /* the product, handed to the outcome by encode_end on success */
} encode_call_t;

/* Fills a zeroed `encode` from a checked request, on the calling thread: retains the model, takes the
 * arena (already held by call_run), the tape and the outputs, reads the config (NULL: F32 at the model's full
 * width, no progress, no stats) and starts the clock. */
void encode_call_init(encode_call_t *encode, encode_request_t const *request);

/* The plan (call_run) of an encode call of `state_size` bytes from its checked request: the arena first,
 * then the executor, both held until the call is final; `fill` fills the state from `context` (the
 * request, or the image or audio request around it); a blocking call stores its product in
 * `request->encoded` on success. */
call_plan_t encode_plan(char const *entry, encode_request_t const *request, size_t state_size,
                        void (*start)(call_t *call), void (*fill)(call_t *call, void const *context),
                        void const *context);

/* call_run of encode_plan: the call of a state in the executor's call storage. */
uform_status_t encode_run(char const *entry, encode_request_t const *request, size_t state_size,
                          void (*start)(call_t *call), void (*fill)(call_t *call, void const *context),
                          void const *context);

/* Records the first failure, with its message (static storage); later ones are dropped. */
void encode_stop(encode_call_t *encode, uform_status_t status, char const *message);

/* The end of an encode call on the loop thread, just before call_finish: counts the failed items in
 * the stats (the caller sets total_ns first), writes the stats to the caller's, hands the product to
 * `outcome` when `status` is UFORM_OK, ends the arena and releases the model. */
void encode_end(encode_call_t *encode, outcome_t *outcome, uform_status_t status);

/* ---- Outputs ------------------------------------------------------------------------------------ */

/* Empties `encode->encoded` for `items` items and gives it their statuses, all UFORM_OK, in host memory
 * of the arena (encode->statuses). false when out of memory. */
bool encode_statuses(encode_call_t *encode, size_t items);

/* The way a verb makes its output views: output_view, or one that also zeroes them (VRAM images). */
typedef bool output_view_t(uform_arena_t *arena, size_t rows, size_t columns, uform_scalar_t scalar,
                           uform_view_t *view);

/* The outputs every encode verb makes alike, through `view`: the statuses (encode_statuses), then
 * embeddings [items, width] and states [items, hidden] where asked; token vectors are each verb's.
 * false when out of memory. */
bool encode_outputs(encode_call_t *encode, size_t items, size_t hidden, output_view_t *view);

/* The token vectors of `items` items, through `view`: `rows` rows at the output width, and the items'
 * offsets [items + 1] in host memory of the arena, item i owning rows [i * per_item, (i + 1) * per_item)
 * (per_item 0: all 0, for a verb that packs them as its chunks finish). Answers the offsets, which the
 * view's item_offsets holds too, or NULL when out of memory. */
size_t *encode_token_vectors(encode_call_t *encode, size_t items, size_t rows, size_t per_item,
                             output_view_t *view);

/* A view of `rows` x `columns` in `scalar` in the arena (device memory in device arenas; not zeroed),
 * with one F32 scale per row beside it for I8. Each allocation has one byte more than it holds, so
 * that an empty view still has an address. false when out of memory. */
output_view_t output_view;

/* Writes one F32 row into row `row` of a host output view, converting to its scalar (and I8 scale). */
void output_row(kernels_t const *kernels, uform_view_t *view, size_t row, float const *values);

/* Zeroes `count` rows from `row` of a host output view (a failed item's), with their I8 scales; a view
 * not asked for (data NULL) is left alone. */
void output_zero(uform_view_t *view, size_t row, size_t count);
