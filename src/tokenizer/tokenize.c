/* uform_text_tokenize: texts cut into tokens on an executor, into an arena.
 *
 * The call runs in chunks of texts (at most TOKENIZE_CHUNK_TEXTS texts or TOKENIZE_CHUNK_BYTES bytes),
 * one chunk per loop turn, so that progress and cancellation are served between them. A chunk is
 * split over the executor's threads in contiguous shares; each thread cuts its texts with its own work
 * into its own growing lists, and records where each text's tokens lie. Once every text is cut, the
 * loop thread knows the total, takes the views from the arena and copies every text's tokens there in
 * order (padding them, for BatchLongest, to the longest). */
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "call.h"
#include "tape.h"

#if UFORM_WITH_TOKENIZERS
#include "tokenizer.h"
#endif

#define TOKENIZE_CHUNK_TEXTS 4096
#define TOKENIZE_CHUNK_BYTES (1u << 20)

static char const entry[] = "uform_text_tokenize";

static uform_status_t tokenize_check(uform_text_tokenize_args_t const *args, char const **message) {
    if (!args->tokenizer) return *message = "tokenizer is NULL", UFORM_INVALID_ARGUMENT;
    if (!args->arena) return *message = "arena is NULL", UFORM_INVALID_ARGUMENT;
    if (!args->outcome && !args->tokenized) return *message = "tokenized is NULL", UFORM_INVALID_ARGUMENT;
    if (args->arena->outputs.device)
        return *message = "the arena holds device memory", UFORM_INVALID_ARGUMENT;
    uform_status_t status = arena_check(args->arena, args->executor, message);
    if (status != UFORM_OK) return status;
    if (args->texts.count == 0) return *message = "the tape holds no items", UFORM_INVALID_ARGUMENT;
    status = tape_validate(&args->texts, message);
    if (status != UFORM_OK) return status;
    if (args->executor && executor_on_device(args->executor))
        return *message = "texts are tokenized on host executors", UFORM_UNSUPPORTED;
    if (!UFORM_WITH_TOKENIZERS)
        return *message = "built without tokenizers (utf8proc, Oniguruma)", UFORM_UNSUPPORTED;
    return UFORM_OK;
}

#if UFORM_WITH_TOKENIZERS

/* One thread's share: its work and what it cut, over the whole call. */
typedef struct tokenize_thread {
    tokenizer_work_t work;
    tokens_t sequence; /* one text's tokens while it is cut */
    post_tokens_t post;
    uint32_t *ids; /* every text this thread cut, end to end */
    piece_span_t *spans;
    uint8_t *special;
    size_t count, capacity;
    size_t failed, truncated;
    uform_status_t status; /* UFORM_OUT_OF_MEMORY when a list could not grow */
} tokenize_thread_t;

/* Where one text's tokens lie. */
typedef struct tokenize_item {
    uint32_t thread;
    uform_status_t status;
    size_t first, count;
} tokenize_item_t;

typedef struct tokenize_call {
    call_t call;
    uform_tokenizer_t const *tokenizer;
    uform_tape_t texts;
    uform_arena_t *arena;
    uform_tokenize_config_t config;
    uform_progress_t progress;
    size_t next_step;
    size_t next_item, chunk_end, threads;
    uint64_t started;
    tokenize_thread_t *shares;
    tokenize_item_t *items;
    uform_tokenized_t tokenized;
} tokenize_call_t;

_Static_assert(sizeof(tokenize_call_t) <= EXECUTOR_CALL_STORAGE, "tokenize_call_t outgrew the call storage");

static void tokenize_release(tokenize_call_t *call) {
    for (size_t t = 0; call->shares && t < call->threads; ++t) {
        tokenize_thread_t *share = &call->shares[t];
        tokenizer_work_free(&share->work);
        tokens_free(&share->sequence);
        free(share->post.blanks);
        free(share->ids);
        free(share->spans);
        free(share->special);
    }
    free(call->shares);
    free(call->items);
    call->shares = NULL;
    call->items = NULL;
}

static void tokenize_end(tokenize_call_t *call, uform_status_t status, char const *message) {
    if (call->config.stats) {
        uform_tokenize_stats_t *stats = call->config.stats;
        *stats = (uform_tokenize_stats_t){.items = call->texts.count};
        stats->bytes = call->texts.offsets[call->texts.count] - call->texts.offsets[0];
        for (size_t t = 0; call->shares && t < call->threads; ++t) {
            stats->failed += call->shares[t].failed;
            stats->truncated += call->shares[t].truncated;
        }
        stats->tokens = status == UFORM_OK ? call->tokenized.ids.rows : 0;
        stats->total_ns = loop_now_ns() - call->started;
    }
    tokenize_release(call);
    if (status == UFORM_OK) {
        call->call.outcome->product = OUTCOME_PRODUCT_TOKENIZED;
        call->call.outcome->tokenized = call->tokenized;
    }
    arena_end(call->arena);
    call_finish(&call->call, status, message);
}

/* Appends one text's tokens to its thread's lists. */
static uform_status_t share_keep(tokenize_thread_t *share, tokens_t const *tokens) {
    if (tokens->count == 0) return UFORM_OK; /* its lists may not exist yet: no memcpy from NULL */
    if (share->count + tokens->count > share->capacity) {
        size_t capacity = share->capacity + share->capacity / 2;
        if (capacity < share->count + tokens->count) capacity = share->count + tokens->count;
        if (capacity < 1024) capacity = 1024;
        uint32_t *ids = realloc(share->ids, capacity * sizeof *ids);
        if (ids) share->ids = ids;
        piece_span_t *spans = ids ? realloc(share->spans, capacity * sizeof *spans) : NULL;
        if (spans) share->spans = spans;
        uint8_t *special = spans ? realloc(share->special, capacity * sizeof *special) : NULL;
        if (!special) return UFORM_OUT_OF_MEMORY;
        share->special = special;
        share->capacity = capacity;
    }
    memcpy(share->ids + share->count, tokens->ids, tokens->count * sizeof *tokens->ids);
    memcpy(share->spans + share->count, tokens->spans, tokens->count * sizeof *tokens->spans);
    memcpy(share->special + share->count, tokens->special, tokens->count * sizeof *tokens->special);
    share->count += tokens->count;
    return UFORM_OK;
}

/* One thread's texts of the chunk. */
static void tokenize_share(void *context, size_t thread) {
    tokenize_call_t *call = context;
    tokenize_thread_t *share = &call->shares[thread];
    size_t first, last, chunk = call->chunk_end - call->next_item;
    thread_share(chunk, thread, call->threads, &first, &last);
    share->post.tokens = &share->sequence;
    bool special = !call->config.without_special_tokens, untruncated = call->config.without_truncation;
    uint8_t const *data = call->texts.data;
    for (size_t item = call->next_item + first; item < call->next_item + last && share->status == UFORM_OK;
         ++item) {
        size_t begin = call->texts.offsets[item], end = call->texts.offsets[item + 1];
        bool truncated = false;
        char const *message = NULL;
        uform_status_t status = tokenizer_cut(call->tokenizer, data + begin, end - begin, special,
                                              untruncated, &share->work, &share->post, &truncated, &message);
        tokenize_item_t *record = &call->items[item];
        *record = (tokenize_item_t){.thread = (uint32_t)thread, .status = status, .first = share->count};
        if (status == UFORM_OK) status = share_keep(share, &share->sequence);
        if (status == UFORM_OK)
            record->count = share->sequence.count;
        else if (status == UFORM_FORMAT)
            share->failed++;
        else
            share->status = status;
        share->truncated += truncated;
    }
}

/* The longest text, for BatchLongest padding (rounded up to the multiple asked). */
static size_t padded_length(tokenize_call_t const *call) {
    uform_tokenizer_t const *tokenizer = call->tokenizer;
    if (!tokenizer->padding.on || !tokenizer->padding.batch_longest) return 0;
    size_t longest = 0;
    for (size_t i = 0; i < call->texts.count; ++i)
        if (call->items[i].count > longest) longest = call->items[i].count;
    size_t multiple = tokenizer->padding.multiple;
    if (multiple > 0 && longest % multiple) longest += multiple - longest % multiple;
    return longest;
}

/* Copies every text's tokens into the arena, padded to `padded` tokens where that is longer. */
static uform_status_t tokenize_output(tokenize_call_t *call) {
    size_t items = call->texts.count, padded = padded_length(call), total = 0;
    for (size_t i = 0; i < items; ++i)
        total += call->items[i].status != UFORM_OK ? 0
                 : call->items[i].count > padded   ? call->items[i].count
                                                   : padded;
    uint32_t *ids = arena_allocate(call->arena, total * sizeof *ids + 1, 64);
    uint32_t *spans = arena_allocate(call->arena, 2 * total * sizeof *spans + 1, 64);
    uint8_t *special = arena_allocate_host(call->arena, total + 1, 16);
    size_t *offsets = arena_allocate_host(call->arena, (items + 1) * sizeof *offsets, 16);
    uform_status_t *statuses = arena_allocate_host(call->arena, items * sizeof *statuses, 16);
    if (!ids || !spans || !special || !offsets || !statuses) return UFORM_OUT_OF_MEMORY;
    bool left = call->tokenizer->padding.left;
    uint32_t pad = call->tokenizer->padding.id;
    size_t row = 0;
    for (size_t i = 0; i < items; ++i) {
        tokenize_item_t const *item = &call->items[i];
        tokenize_thread_t const *share = &call->shares[item->thread];
        statuses[i] = item->status;
        offsets[i] = row;
        if (item->status != UFORM_OK) continue;
        size_t pads = padded > item->count ? padded - item->count : 0;
        size_t at = row + (left ? pads : 0);
        if (item->count) { /* a thread that cut no token at all has no buffers */
            memcpy(ids + at, share->ids + item->first, item->count * sizeof *ids);
            memcpy(special + at, share->special + item->first, item->count);
        }
        for (size_t k = 0; k < item->count; ++k) {
            spans[2 * (at + k)] = share->spans[item->first + k].begin;
            spans[2 * (at + k) + 1] = share->spans[item->first + k].end;
        }
        size_t pad_at = left ? row : row + item->count;
        for (size_t k = 0; k < pads; ++k) {
            ids[pad_at + k] = pad;
            special[pad_at + k] = 1;
            spans[2 * (pad_at + k)] = spans[2 * (pad_at + k) + 1] = 0;
        }
        row += item->count + pads;
    }
    offsets[items] = row;
    call->tokenized.ids = arena_view(call->arena, ids, total, 1, UFORM_U32);
    call->tokenized.spans = arena_view(call->arena, spans, total, 2, UFORM_U32);
    call->tokenized.ids.item_offsets = call->tokenized.spans.item_offsets = offsets;
    call->tokenized.ids.items = call->tokenized.spans.items = items;
    call->tokenized.statuses = statuses;
    call->tokenized.special = special;
    call->tokenized.items = items;
    return UFORM_OK;
}

/* The next chunk's end: TOKENIZE_CHUNK_TEXTS texts or TOKENIZE_CHUNK_BYTES bytes, at least one text. */
static size_t chunk_end(tokenize_call_t const *call) {
    size_t const *offsets = call->texts.offsets;
    size_t end = call->next_item + 1, limit = call->next_item + TOKENIZE_CHUNK_TEXTS;
    if (limit > call->texts.count) limit = call->texts.count;
    while (end < limit && offsets[end + 1] - offsets[call->next_item] <= TOKENIZE_CHUNK_BYTES)
        end++;
    return end;
}

static void tokenize_step(call_t *base) {
    tokenize_call_t *call = container_of(base, tokenize_call_t, call);
    size_t items = call->texts.count;
    call->chunk_end = chunk_end(call);
    executor_for_threads(base->executor, tokenize_share, call);
    for (size_t t = 0; t < call->threads; ++t)
        if (call->shares[t].status != UFORM_OK) {
            tokenize_end(call, call->shares[t].status, "out of memory cutting the texts");
            return;
        }
    call->next_item = call->chunk_end;
    if (progress_report(&call->progress, &call->next_step, call->next_item, items)) {
        tokenize_end(call, UFORM_CANCELLED, "cancelled by the progress handler");
        return;
    }
    if (call->next_item < items) {
        loop_post(base->executor->loop, &base->op); /* the next chunk on the next turn */
        return;
    }
    uform_status_t status = tokenize_output(call);
    tokenize_end(call, status, status == UFORM_OK ? NULL : "cannot allocate the tokens in the arena");
}

static void tokenize_start(call_t *base) {
    tokenize_call_t *call = container_of(base, tokenize_call_t, call);
    call->started = loop_now_ns();
    call->threads = executor_fork_threads(base->executor);
    call->shares = calloc(call->threads, sizeof *call->shares);
    call->items = calloc(call->texts.count, sizeof *call->items);
    if (!call->shares || !call->items) {
        tokenize_end(call, UFORM_OUT_OF_MEMORY, "cannot allocate the call's state");
        return;
    }
    base->start = tokenize_step;
    tokenize_step(base);
}

static void tokenize_fill(call_t *base, void const *request) {
    uform_text_tokenize_args_t const *args = request;
    tokenize_call_t *call = container_of(base, tokenize_call_t, call);
    call->tokenizer = args->tokenizer;
    call->texts = args->texts;
    call->arena = args->arena;
    if (args->config) call->config = *args->config;
    call->progress = call->config.progress;
    call->next_step = 1;
    call->next_item = 0;
}

static void tokenize_keep(uform_outcome_t *own, void *tokenized) {
    uform_outcome_tokenized(own, tokenized);
}

#endif

UFORM_EXPORT uform_status_t uform_text_tokenize(uform_text_tokenize_args_t const *args) {
    if (!args) return failed(UFORM_INVALID_ARGUMENT, entry, "args is NULL");
    char const *message = NULL;
    uform_status_t status = tokenize_check(args, &message);
    if (status != UFORM_OK) return call_refuse(args->outcome, status, entry, message);
#if UFORM_WITH_TOKENIZERS
    call_plan_t plan =
        call_plan(entry, args->executor, args->arena, args->outcome, sizeof(tokenize_call_t), tokenize_start);
    plan.fill = (call_fill_t){tokenize_fill, args};
    plan.keep = (call_keep_t){tokenize_keep, args->tokenized};
    return call_run(&plan);
#else
    return UFORM_INTERNAL;
#endif
}
