/* text_encode on host executors for models whose text tower reads tokens (pretrained families): each text
 * cut by the model's tokenizer (truncated at the model's context, special tokens kept), the tokens'
 * embeddings plus their learned positions and token type, the tower, then the tower's pooling, its
 * projection where it has one, and unit length where the family's reference gives it.
 *
 * The texts are cut when the call starts, on the loop thread; then, as for texts read as bytes (text.c),
 * items go in chunks of at most the tower's chunk_tokens tokens packed end to end without padding, one
 * chunk per loop turn. A text the tokenizer refuses (not UTF-8) or that leaves no token fails alone with
 * UFORM_FORMAT. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "call.h"
#include "kernels.h"
#include "model.h"
#include "tape.h"
#include "text.h"
#include "tokenizer.h"
#include "tower.h"
#include "verbs.h"

typedef struct tokens_call {
    call_t call;
    encode_call_t encode;
    size_t next_item;
    char *prompt;       /* put before every text, or NULL */
    bool prompt_failed; /* copying it ran out of memory */
    text_tokens_t tokens;
} tokens_call_t;

_Static_assert(sizeof(tokens_call_t) <= EXECUTOR_CALL_STORAGE, "tokens_call_t outgrew the call storage");

void text_tokens_free(text_tokens_t *tokens) {
    free(tokens->ids);
    free(tokens->spans);
    free(tokens->offsets);
    free(tokens->refused);
    memset(tokens, 0, sizeof *tokens);
}

static void tokens_end(tokens_call_t *text, uform_status_t status, char const *message) {
    free(text->prompt);
    text_tokens_free(&text->tokens);
    text->encode.stats.total_ns = loop_now_ns() - text->encode.started_ns;
    encode_end(&text->encode, text->call.outcome, status);
    call_finish(&text->call, status, message);
}

#if UFORM_WITH_TOKENIZERS
/* Narrows a text to what Python's str.strip() keeps: whitespace is White_Space and the separators U+001C to
 * U+001F (str.isspace). A text that is not UTF-8 is left as it is, for the tokenizer to refuse. */
static void python_strip(uint8_t const **text, size_t *length) {
    size_t at = 0, first = SIZE_MAX, end = 0;
    while (at < *length) {
        uint32_t ch;
        size_t size = utf8_next(*text + at, *length - at, &ch);
        if (size == 0) return;
        if (!white_space(ch) && !(ch >= 0x1C && ch <= 0x1F)) {
            if (first == SIZE_MAX) first = at;
            end = at + size;
        }
        at += size;
    }
    if (first == SIZE_MAX) first = end = 0;
    *text += first;
    *length = end - first;
}

/* Each token's span in the text as the caller gave it: the tokenizer cut the prompt and the text joined
 * (`prompted` bytes of prompt), from `skipped` bytes into them (what the strip took off the front). A token
 * of the prompt, and the special and padding tokens, which cover no byte, span [0, 0). */
static void tokens_spans(tokens_t const *sequence, size_t count, size_t prompted, size_t skipped,
                         uint32_t *spans) {
    for (size_t t = 0; t < count; ++t) {
        uint32_t begin = 0, end = 0;
        if (t < sequence->count && !sequence->special[t] && sequence->spans[t].begin + skipped >= prompted) {
            begin = (uint32_t)(sequence->spans[t].begin + skipped - prompted);
            end = (uint32_t)(sequence->spans[t].end + skipped - prompted);
        }
        spans[2 * t] = begin;
        spans[2 * t + 1] = end;
    }
}
#endif

uform_status_t text_tokens_cut(encode_call_t const *encode, char const *prompt, text_tokens_t *text) {
#if !UFORM_WITH_TOKENIZERS
    (void)encode, (void)prompt;
    memset(text, 0, sizeof *text);
    return UFORM_UNSUPPORTED; /* no model reads tokens in a build without tokenizers */
#else
    memset(text, 0, sizeof *text);
    uform_tape_t const *texts = &encode->tape;
    uform_tokenizer_t const *tokenizer = encode->model->tokenizer;
    size_t items = texts->count, capacity = 0, count = 0;
    text->offsets = malloc((items + 1) * sizeof *text->offsets);
    text->refused = malloc(items * sizeof *text->refused);
    if (!text->offsets || !text->refused) return UFORM_OUT_OF_MEMORY;
    tokenizer_work_t work = {0};
    tokens_t sequence = {0};
    post_tokens_t post = {.tokens = &sequence};
    uform_status_t status = UFORM_OK;
    uint8_t const *data = texts->data;
    uform_model_info_t const *info = &encode->model->header.info;
    size_t const context = info->text.context;
    uform_tokenizer_info_t about = {0};
    uform_tokenizer_info(tokenizer, &about);
    bool const tokenizer_special = about.special_added > 0;
    size_t const prompted = prompt ? strlen(prompt) : 0;
    uint8_t *joined = NULL; /* the prompt, then the text */
    size_t joined_capacity = 0;
    bool const want_spans = encode->outputs & UFORM_OUTPUT_TOKEN_VECTORS;
    for (size_t item = 0; item < items && status == UFORM_OK; ++item) {
        size_t begin = texts->offsets[item], end = texts->offsets[item + 1];
        bool truncated = false;
        char const *message = NULL;
        text->offsets[item] = count;
        uint8_t const *bytes = data + begin;
        size_t length = end - begin;
        if (prompted) {
            if (prompted + length > joined_capacity) {
                uint8_t *grown = realloc(joined, prompted + length);
                if (!grown) {
                    status = UFORM_OUT_OF_MEMORY;
                    break;
                }
                joined = grown;
                joined_capacity = prompted + length;
            }
            memcpy(joined, prompt, prompted);
            if (length) memcpy(joined + prompted, bytes, length);
            bytes = joined;
            length += prompted;
        }
        uint8_t const *joined_start = bytes;
        if (info->text.strip) python_strip(&bytes, &length);
        uform_status_t cut =
            tokenizer_cut(tokenizer, bytes, length, true, false, &work, &post, &truncated, &message);
        if (cut == UFORM_OK && sequence.count > context) { /* past the tokenizer's own truncation, if any */
            /* A SentencePiece model's text ends with its special token, which truncation keeps; UForm 3's
             * processor cuts the ids as they are. */
            if (!info->text.cut_ids && tokenizer_special) {
                sequence.ids[context - 1] = sequence.ids[sequence.count - 1];
                sequence.spans[context - 1] = sequence.spans[sequence.count - 1];
                sequence.special[context - 1] = sequence.special[sequence.count - 1];
            }
            sequence.count = context;
            truncated = true;
        }
        text->truncated += truncated;
        if (cut == UFORM_OK && sequence.count == 0) cut = UFORM_FORMAT;
        text->refused[item] = cut;
        if (cut == UFORM_OUT_OF_MEMORY) status = cut;
        if (cut != UFORM_OK) continue;
        size_t need = count + (info->text.padded ? context : sequence.count);
        if (need > capacity) {
            size_t grown = 2 * capacity > need ? 2 * capacity : need + 1024;
            uint32_t *ids = realloc(text->ids, grown * sizeof *ids);
            if (ids) text->ids = ids;
            uint32_t *spans = ids && want_spans ? realloc(text->spans, 2 * grown * sizeof *spans) : NULL;
            if (spans) text->spans = spans;
            if (!ids || (want_spans && !spans)) {
                status = UFORM_OUT_OF_MEMORY;
                break;
            }
            capacity = grown;
        }
        memcpy(text->ids + count, sequence.ids, sequence.count * sizeof *sequence.ids);
        /* Padded to the context with the padding id, attended whole (SigLIP). */
        for (size_t t = sequence.count; info->text.padded && t < context; ++t)
            text->ids[count + t] = (uint32_t)info->text.pad_id;
        if (want_spans)
            tokens_spans(&sequence, info->text.padded ? context : sequence.count, prompted,
                         (size_t)(bytes - joined_start), text->spans + 2 * count);
        count += info->text.padded ? context : sequence.count;
    }
    text->offsets[items] = count;
    free(joined);
    tokens_free(&sequence);
    free(post.blanks);
    tokenizer_work_free(&work);
    return status;
#endif
}

static void tokens_chunk(loop_op_t *op);

bool text_tokens_vectors(encode_call_t *encode, text_tokens_t const *text, output_view_t *make_view) {
    uform_encoded_t *encoded = &encode->encoded;
    if (!(encode->outputs & UFORM_OUTPUT_TOKEN_VECTORS)) return true;
    size_t items = encode->tape.count, tokens = text->offsets[items];
    if (!make_view(encode->arena, tokens, encode->width, encode->scalar, &encoded->token_vectors))
        return false;
    size_t *offsets = arena_allocate_host(encode->arena, (items + 1) * sizeof(size_t), 16);
    uint32_t *spans = arena_allocate_host(encode->arena, 2 * tokens * sizeof(uint32_t) + 1, 16);
    if (!offsets || !spans) return false;
    memcpy(offsets, text->offsets, (items + 1) * sizeof(size_t));
    if (tokens) memcpy(spans, text->spans, 2 * tokens * sizeof(uint32_t));
    encoded->token_spans = arena_view(encode->arena, spans, tokens, 2, UFORM_U32);
    encoded->token_vectors.item_offsets = encoded->token_spans.item_offsets = offsets;
    encoded->token_vectors.items = encoded->token_spans.items = items;
    return true;
}

/* Cuts the texts, allocates the outputs in the arena, then starts the first chunk. */
static void tokens_start(call_t *call) {
    tokens_call_t *text = container_of(call, tokens_call_t, call);
    encode_call_t *encode = &text->encode;
    uform_tape_t const *texts = &encode->tape;
    encode->stats.items = texts->count;
    encode->stats.bytes = texts->offsets[texts->count] - texts->offsets[0];
    if (text->prompt_failed || text_tokens_cut(encode, text->prompt, &text->tokens) != UFORM_OK ||
        !encode_outputs(encode, texts->count, encode->model->text->hidden, output_view) ||
        !text_tokens_vectors(encode, &text->tokens, output_view)) {
        tokens_end(text, UFORM_OUT_OF_MEMORY, "cannot allocate the tokens or the outputs");
        return;
    }
    encode->stats.truncated += text->tokens.truncated;
    for (size_t item = 0; item < texts->count; ++item)
        encode->statuses[item] = text->tokens.refused[item];
    text->call.op.callback = tokens_chunk;
    tokens_chunk(&text->call.op);
}

/* The chunk's scratch: the tower's, x [tokens, hidden], token offsets [items + 1], pooled states
 * [items, hidden] and their projections [items, dims], or with TOKEN_VECTORS [max(items, tokens), dims]. */
typedef struct tokens_scratch {
    void *tower;
    size_t threads; /* the threads the tower's scratch is for */
    float *x, *pooled, *projected;
    size_t *offsets;
} tokens_scratch_t;

static bool tokens_scratch(tokens_call_t *text, size_t tokens, size_t items, tokens_scratch_t *scratch) {
    tower_t const *tower = text->encode.model->text;
    bool const vectors = text->encode.outputs & UFORM_OUTPUT_TOKEN_VECTORS;
    size_t const threads = executor_fork_threads(text->call.executor);
    size_t const sizes[] = {
        round_up_64(tower_scratch_bytes(tower, tokens, threads)),
        round_up_64(tokens * tower->hidden * sizeof(float)),
        round_up_64(items * tower->hidden * sizeof(float)),
        round_up_64((vectors && tokens > items ? tokens : items) * tower->dims * sizeof(float)),
        round_up_64((items + 1) * sizeof(size_t)),
    };
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i)
        total += sizes[i];
    char *base = executor_scratch(text->call.executor, total);
    if (!base) return false;
    scratch->tower = base;
    scratch->threads = threads;
    scratch->x = (float *)(void *)(base += sizes[0]);
    scratch->pooled = (float *)(void *)(base += sizes[1]);
    scratch->projected = (float *)(void *)(base += sizes[2]);
    scratch->offsets = (size_t *)(void *)(base + sizes[3]);
    return true;
}

/* x's rows of one text: each token's embedding, plus the token type's row, plus its position's row, in
 * that order (BERT's and RoBERTa's sums). */
static void tokens_embed(tower_t const *tower, uform_model_info_t const *info, uint32_t const *ids,
                         size_t count, float *x) {
    size_t hidden = tower->hidden, vocab = info->text.vocab, placed = 0;
    for (size_t t = 0; t < count; ++t) {
        float *row = x + t * hidden;
        uint32_t id = ids[t] < vocab ? ids[t] : 0; /* a tokenizer's ids past the table were refused at load */
        tower->kernels->bf16_to_f32(row, tower->embed + (size_t)id * hidden, hidden);
        if (tower->token_type)
            for (size_t h = 0; h < hidden; ++h)
                row[h] += tower->token_type[h];
        if (tower->positions) {
            float const *position = tower->positions + text_position(info, ids[t], t, &placed) * hidden;
            for (size_t h = 0; h < hidden; ++h)
                row[h] += position[h];
        }
    }
}

/* The token vectors of `count` rows of final states x: projected as the embeddings are (unit vectors where
 * they are), written to rows [first_row, first_row + count) of `view`. */
static void tokens_project(tokens_call_t *text, float const *x, size_t count, float *projected,
                           uform_view_t *view, size_t first_row) {
    encode_call_t *encode = &text->encode;
    tower_t const *tower = encode->model->text;
    size_t width = encode->width;
    tower_project(tower, text->call.executor, x, tower->hidden, count, width, projected, width);
    uint64_t converting = loop_now_ns();
    for (size_t row = 0; row < count; ++row) {
        float *values = projected + row * width;
        if (encode->normalize) tower->kernels->normalize(values, width);
        output_row(tower->kernels, view, first_row + row, values);
    }
    encode->stats.convert_ns += loop_now_ns() - converting;
}

static void tokens_chunk(loop_op_t *op) {
    tokens_call_t *text = container_of(op, tokens_call_t, call.op);
    encode_call_t *encode = &text->encode;
    uform_model_t const *model = encode->model;
    uform_model_info_t const *info = &model->header.info;
    tower_t const *tower = model->text;
    kernels_t const *kernels = tower->kernels;
    uform_executor_t *executor = text->call.executor;
    size_t hidden = tower->hidden, items = encode->tape.count;
    size_t const *offsets = text->tokens.offsets;

    /* The chunk: items [first, last), at least one. */
    size_t first = text->next_item, last = first, tokens = 0, most = tower->chunk_tokens;
    while (last < items && (last == first || tokens + offsets[last + 1] - offsets[last] <= most))
        tokens += offsets[last + 1] - offsets[last], ++last;
    tokens_scratch_t scratch;
    if (!tokens_scratch(text, tokens, last - first, &scratch)) {
        tokens_end(text, UFORM_OUT_OF_MEMORY, "cannot allocate the executor's scratch");
        return;
    }
    uint64_t computing = loop_now_ns();
    size_t row = 0;
    for (size_t item = first; item < last; ++item) {
        size_t count = offsets[item + 1] - offsets[item];
        scratch.offsets[item - first] = row;
        if (count == 0)
            continue; /* a refused text: no rows, and no ids at all where every text was refused */
        tokens_embed(tower, info, text->tokens.ids + offsets[item], count, scratch.x + row * hidden);
        row += count;
    }
    scratch.offsets[last - first] = row;
    /* Items without tokens (refused) hold no rows: the tower's offsets skip them alike. */
    tower_batch_t batch = {
        .tokens = tokens,
        .items = last - first,
        .offsets = scratch.offsets,
        .x = scratch.x,
        .scratch = scratch.tower,
        .threads = scratch.threads,
    };
    if (tokens) tower_forward(tower, executor, &batch);
    if (tokens && (encode->outputs & UFORM_OUTPUT_TOKEN_VECTORS))
        tokens_project(text, scratch.x, tokens, scratch.projected, &encode->encoded.token_vectors,
                       offsets[first]);

    uform_encoded_t *encoded = &encode->encoded;
    for (size_t item = first; item < last; ++item) {
        size_t count = offsets[item + 1] - offsets[item];
        float *pooled = scratch.pooled + (item - first) * hidden;
        if (count == 0) { /* a refused text: its rows stay zero */
            output_zero(&encoded->states, item, 1);
            output_zero(&encoded->embeddings, item, 1);
            continue;
        }
        size_t const rows[] = {0, count};
        tower_pool(tower, executor, scratch.x + scratch.offsets[item - first] * hidden, rows, 1,
                   text->tokens.ids + offsets[item], NULL, pooled);
        if (encode->outputs & UFORM_OUTPUT_STATES) output_row(kernels, &encoded->states, item, pooled);
    }
    if (encode->outputs & UFORM_OUTPUT_EMBEDDINGS) {
        size_t width = encode->width, count = last - first;
        tower_project(tower, executor, scratch.pooled, hidden, count, width, scratch.projected, width);
        uint64_t converting = loop_now_ns();
        for (size_t item = first; item < last; ++item) {
            if (offsets[item + 1] == offsets[item]) continue;
            float *values = scratch.projected + (item - first) * width;
            if (encode->normalize) kernels->normalize(values, width);
            output_row(kernels, &encoded->embeddings, item, values);
        }
        encode->stats.convert_ns += loop_now_ns() - converting;
    }
    encode->stats.compute_ns += loop_now_ns() - computing;
    text->next_item = last;

    if (progress_report(&encode->progress, &encode->next_step, last, items)) {
        tokens_end(text, UFORM_CANCELLED, "cancelled by the progress handler");
        return;
    }
    if (last == items) {
        tokens_end(text, UFORM_OK, NULL);
        return;
    }
    loop_post(executor->loop, &text->call.op);
}

static void tokens_fill(call_t *call, void const *request) {
    tokens_call_t *text = container_of(call, tokens_call_t, call);
    encode_call_init(&text->encode, request);
    encode_request_t const *asked = request;
    char const *prompt = NULL;
    text_prompt(asked->model, asked->config, &prompt); /* checked at the front door */
    if (prompt && *prompt && !(text->prompt = strdup(prompt))) text->prompt_failed = true;
}

bool text_prompt(uform_model_t const *model, uform_encode_config_t const *config, char const **prompt) {
    checkpoint_header_t const *header = &model->header;
    char const *name = config ? config->prompt_name : NULL;
    *prompt = config ? config->prompt : NULL;
    if (*prompt) return true;
    if (!name) name = header->default_prompt;
    if (!name || !*name) return true;
    /* The prompts, parsed at load, are only read since: a lookup from any thread. */
    json_t const *value = json_object_get(header->prompts, name);
    if (!json_is_string(value)) return false;
    *prompt = json_string_value(value);
    return true;
}

uform_status_t text_encode_tokens_host(encode_request_t const *request) {
    return encode_run("uform_text_encode", request, sizeof(tokens_call_t), tokens_start, tokens_fill,
                      request);
}
