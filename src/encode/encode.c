/* What the encode verbs share (encode.h). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "arena.h"
#include "call.h"
#include "encode.h"
#include "kernels.h"
#include "model.h"
#include "tape.h"

/* ---- Arguments ---------------------------------------------------------------------------------- */

uform_status_t encode_check(encode_request_t const *request, char const **message) {
    uform_model_t const *model = request->model;
    uform_executor_t const *executor = request->executor;
    uform_arena_t const *arena = request->arena;
    uform_encode_config_t const *config = request->config;
    if (!model) return *message = "model is NULL", UFORM_INVALID_ARGUMENT;
    if (!arena) return *message = "arena is NULL", UFORM_INVALID_ARGUMENT;
    uint32_t known = UFORM_OUTPUT_EMBEDDINGS | UFORM_OUTPUT_TOKEN_VECTORS | UFORM_OUTPUT_STATES;
    if (request->outputs == 0 || ((uint32_t)request->outputs & ~known))
        return *message = "outputs is empty or unknown", UFORM_INVALID_ARGUMENT;
    if (!request->outcome && !request->encoded) return *message = "encoded is NULL", UFORM_INVALID_ARGUMENT;
    uform_status_t residency = model_residency(model, executor, message);
    if (residency != UFORM_OK) return residency;
    if (config) {
        if (uform_scalar_size(config->outputs_scalar) == 0 || config->outputs_scalar == UFORM_U32)
            return *message = "unknown outputs scalar", UFORM_INVALID_ARGUMENT;
        if (config->matryoshka) {
            uform_model_info_t const *info = &model->header.info;
            bool listed = config->matryoshka == info->dims;
            for (size_t i = 0; i < info->matryoshka_count; ++i)
                listed |= info->matryoshka[i] == config->matryoshka;
            if (!listed)
                return *message = "matryoshka width is not one of the model's", UFORM_INVALID_ARGUMENT;
        }
    }
    uform_status_t status = arena_check(arena, executor, message);
    if (status != UFORM_OK) return status;
    if (request->tape.count == 0) return *message = "the tape holds no items", UFORM_INVALID_ARGUMENT;
    return tape_validate(&request->tape, message);
}

/* ---- The call ----------------------------------------------------------------------------------- */

void encode_call_init(encode_call_t *encode, encode_request_t const *request) {
    uform_encode_config_t const *config = request->config;
    encode->model = request->model;
    model_retain(encode->model);
    encode->arena = request->arena;
    encode->tape = request->tape;
    encode->outputs = request->outputs;
    encode->scalar = config ? config->outputs_scalar : UFORM_F32;
    encode->width = config && config->matryoshka ? config->matryoshka : request->model->header.info.dims;
    encode->normalize = request->model->header.info.normalized || (config && config->normalize);
    if (config) encode->progress = config->progress;
    encode->next_step = 1;
    encode->stats_out = config ? config->stats : NULL;
    encode->started_ns = loop_now_ns();
}

/* call_run's keep: the encoded views of a successful blocking call (nothing for a failed one). */
static void encode_keep(uform_outcome_t *own, void *encoded) {
    uform_outcome_encoded(own, encoded);
}

call_plan_t encode_plan(char const *entry, encode_request_t const *request, size_t state_size,
                        void (*start)(call_t *call), void (*fill)(call_t *call, void const *context),
                        void const *context) {
    call_plan_t plan =
        call_plan(entry, request->executor, request->arena, request->outcome, state_size, start);
    plan.fill = (call_fill_t){fill, context};
    plan.keep = (call_keep_t){encode_keep, request->encoded};
    return plan;
}

uform_status_t encode_run(char const *entry, encode_request_t const *request, size_t state_size,
                          void (*start)(call_t *call), void (*fill)(call_t *call, void const *context),
                          void const *context) {
    call_plan_t const plan = encode_plan(entry, request, state_size, start, fill, context);
    return call_run(&plan);
}

void encode_stop(encode_call_t *encode, uform_status_t status, char const *message) {
    if (encode->failure != UFORM_OK) return;
    encode->failure = status;
    encode->message = message;
}

/* ---- Non-finite outputs -------------------------------------------------------------------------- */

/* Every element of row `row` is finite: F32 by value, BF16 and F16 by their exponent bits (all ones is
 * an infinity or a NaN), I8 by its scale (output_row makes it NaN for a row of non-finite values). */
static bool row_finite(uform_view_t const *view, size_t row) {
    unsigned char const *data = (unsigned char const *)view->data + row * view->row_stride;
    uint16_t bits;
    for (size_t column = 0; column < view->columns; ++column) {
        switch (view->scalar) {
        case UFORM_F32: {
            float value;
            memcpy(&value, data + column * sizeof value, sizeof value);
            if (!isfinite(value)) return false;
            break;
        }
        case UFORM_BF16:
            memcpy(&bits, data + column * sizeof bits, sizeof bits);
            if ((bits & 0x7F80u) == 0x7F80u) return false;
            break;
        case UFORM_F16:
            memcpy(&bits, data + column * sizeof bits, sizeof bits);
            if ((bits & 0x7C00u) == 0x7C00u) return false;
            break;
        case UFORM_I8:
            return isfinite(view->scales[row]);
        case UFORM_U32: /* integers are finite */
            return true;
        }
    }
    return true;
}

/* The rows of `item` in `view`: one, or those its item_offsets give. */
static void item_rows(uform_view_t const *view, size_t item, size_t *first, size_t *count) {
    *first = view->item_offsets ? view->item_offsets[item] : item;
    *count = view->item_offsets ? view->item_offsets[item + 1] - *first : 1;
}

static bool item_finite(uform_view_t const *view, size_t item) {
    if (!view->data || view->device) return true;
    size_t first, count;
    item_rows(view, item, &first, &count);
    for (size_t row = first; row < first + count; ++row)
        if (!row_finite(view, row)) return false;
    return true;
}

/* An item whose host outputs hold a NaN or an infinity (weights that carry it there) fails with
 * UFORM_FORMAT and zero rows, as any failed item, instead of handing the caller a non-finite vector. */
static void encode_refuse_non_finite(encode_call_t *encode) {
    uform_encoded_t *encoded = &encode->encoded;
    uform_view_t *const views[] = {&encoded->embeddings, &encoded->states, &encoded->token_vectors};
    for (size_t item = 0; item < encoded->items; ++item) {
        if (encode->statuses[item] != UFORM_OK) continue;
        bool finite = true;
        for (size_t i = 0; i < sizeof views / sizeof views[0] && finite; ++i)
            finite = item_finite(views[i], item);
        if (finite) continue;
        encode->statuses[item] = UFORM_FORMAT;
        for (size_t i = 0; i < sizeof views / sizeof views[0]; ++i) {
            if (!views[i]->data || views[i]->device) continue;
            size_t first, count;
            item_rows(views[i], item, &first, &count);
            output_zero(views[i], first, count);
        }
    }
}

void encode_end(encode_call_t *encode, outcome_t *outcome, uform_status_t status) {
    if (status == UFORM_OK && encode->statuses) encode_refuse_non_finite(encode);
    for (size_t item = 0; item < encode->stats.items && encode->statuses; ++item)
        encode->stats.failed += encode->statuses[item] != UFORM_OK;
    if (encode->stats_out) *encode->stats_out = encode->stats;
    if (status == UFORM_OK) {
        outcome->product = OUTCOME_PRODUCT_ENCODED;
        outcome->encoded = encode->encoded;
    }
    arena_end(encode->arena);
    uform_model_free(encode->model);
}

/* ---- Outputs ------------------------------------------------------------------------------------ */

bool encode_statuses(encode_call_t *encode, size_t items) {
    uform_encoded_t *encoded = &encode->encoded;
    memset(encoded, 0, sizeof *encoded);
    encoded->items = items;
    encode->statuses = arena_allocate_host(encode->arena, items * sizeof *encode->statuses, 16);
    if (!encode->statuses) return false;
    memset(encode->statuses, 0, items * sizeof *encode->statuses);
    encoded->statuses = encode->statuses;
    return true;
}

bool encode_outputs(encode_call_t *encode, size_t items, size_t hidden, output_view_t *view) {
    uform_encoded_t *encoded = &encode->encoded;
    if (!encode_statuses(encode, items)) return false;
    if ((encode->outputs & UFORM_OUTPUT_EMBEDDINGS) &&
        !view(encode->arena, items, encode->width, encode->scalar, &encoded->embeddings))
        return false;
    return !(encode->outputs & UFORM_OUTPUT_STATES) ||
           view(encode->arena, items, hidden, encode->scalar, &encoded->states);
}

size_t *encode_token_vectors(encode_call_t *encode, size_t items, size_t rows, size_t per_item,
                             output_view_t *view) {
    uform_view_t *vectors = &encode->encoded.token_vectors;
    size_t bytes = 0; /* what `view` will ask for, checked here for overflow */
    if (__builtin_mul_overflow(rows, encode->width * uform_scalar_size(encode->scalar), &bytes) ||
        !view(encode->arena, rows, encode->width, encode->scalar, vectors))
        return NULL;
    size_t *offsets = arena_allocate_host(encode->arena, (items + 1) * sizeof(size_t), 16);
    if (!offsets) return NULL;
    for (size_t item = 0; item <= items; ++item)
        offsets[item] = item * per_item;
    vectors->item_offsets = offsets;
    vectors->items = items;
    return offsets;
}

bool output_view(uform_arena_t *arena, size_t rows, size_t columns, uform_scalar_t scalar,
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

void output_row(kernels_t const *kernels, uform_view_t *view, size_t row, float const *values) {
    void *target = (unsigned char *)view->data + row * view->row_stride;
    float *scale = view->scales ? (float *)view->scales + row : NULL;
    float ignored;
    kernels->convert(target, values, view->columns, view->scalar, scale ? scale : &ignored);
    /* Quantized, a non-finite value leaves no trace: the scale says it (encode_refuse_non_finite). */
    if (scale)
        for (size_t column = 0; column < view->columns; ++column)
            if (!isfinite(values[column])) {
                *scale = NAN;
                break;
            }
}

void output_zero(uform_view_t *view, size_t row, size_t count) {
    if (!view->data) return;
    memset((unsigned char *)view->data + row * view->row_stride, 0, count * view->row_stride);
    if (view->scales) memset((float *)view->scales + row, 0, count * sizeof(float));
}
