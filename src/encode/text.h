/* What the host and VRAM forms of the text verbs share (src/encode/text.c, src/vram/vram_text.c): how much of
 * each text the model reads, the outputs of text_encode, and the call of text_choose. */
#pragma once

#include "encode.h"

#define TEXT_BOS 256 /* the byte table's row that starts every text */

/* The bytes of text `item` the model reads: at most its context. */
static inline size_t text_kept(uform_model_t const *model, uform_tape_t const *texts, size_t item) {
    size_t length = texts->offsets[item + 1] - texts->offsets[item];
    size_t context = model->header.info.text.context;
    return length < context ? length : context;
}

/* ---- text_encode -------------------------------------------------------------------------------- */

/* Counts `texts` in the call's stats (items, bytes, texts cut at the context); answers the bytes kept
 * of them all. */
size_t text_count(encode_call_t *encode, uform_tape_t const *texts);

/* Every output of text_encode in the arena: statuses, embeddings, states [items, hidden], and token
 * vectors [kept_total, width] grouped per text by item offsets in host memory. false when out of
 * memory. */
bool text_outputs(encode_call_t *encode, uform_tape_t const *texts, size_t hidden, size_t kept_total);

/* ---- text_encode of a tower that reads tokens (text_tokens.c; the VRAM form in src/vram/vram_text.c) ------
 */

/* Every text of a call cut by the model's tokenizer (the prompt put before each, stripped where the model
 * says, truncated at the context, padded where it is padded). */
typedef struct text_tokens {
    uint32_t *ids;           /* every kept token of every text, end to end */
    uint32_t *spans;         /* with TOKEN_VECTORS: each token's [begin, end) bytes in its text, or NULL */
    size_t *offsets;         /* [items + 1] into ids */
    uform_status_t *refused; /* [items]: UFORM_OK, or the status of a text that failed (it holds no id) */
    size_t truncated;        /* texts cut at the context */
} text_tokens_t;

/* Cuts the call's texts into `tokens` (zeroed first), `prompt` (or NULL) before each. UFORM_OK,
 * UFORM_OUT_OF_MEMORY, or UFORM_UNSUPPORTED in a build without tokenizers; a text that cannot be cut is
 * recorded in tokens->refused. Free with text_tokens_free whatever it answered. */
uform_status_t text_tokens_cut(encode_call_t const *encode, char const *prompt, text_tokens_t *tokens);
void text_tokens_free(text_tokens_t *tokens);

/* With TOKEN_VECTORS: the view of a row for every token the tower runs (through `make_view`), and the
 * views of their spans, grouped per text as the ids. false when out of memory. */
bool text_tokens_vectors(encode_call_t *encode, text_tokens_t const *tokens, output_view_t *make_view);

/* The row of the learned positions that token t of a text takes, id its id: position_offset + t; with a
 * position_offset (RoBERTa's), a pad_id token takes row pad_id and the others count from the offset only
 * the tokens that are not pad_id (*placed: how many so far, 0 at a text's first token). */
static inline size_t text_position(uform_model_info_t const *info, uint32_t id, size_t t, size_t *placed) {
    if (!info->text.position_offset) return t;
    return id == info->text.pad_id ? info->text.pad_id : info->text.position_offset + (*placed)++;
}

/* ---- text_choose -------------------------------------------------------------------------------- */

typedef struct choose_call {
    call_t call;
    uform_model_t *model; /* retained until choose_end */
    uform_arena_t *arena;
    uform_view_t states;
    uform_tape_t choices;
    uform_progress_t progress;
    size_t next_step;
    uform_view_t probabilities; /* the product */
    uint64_t started_ns;        /* VRAM: when the device work was issued */
    loop_op_t poll;             /* VRAM: the timer that polls the device */
} choose_call_t;

/* Opens text_choose's call from checked arguments, with `start` to run on the loop thread, and submits
 * it; a blocking call waits and stores its probabilities. Answers as uform_text_choose does. */
uform_status_t choose_submit(uform_text_choose_args_t const *args, void (*start)(call_t *call));

/* Ends text_choose on the loop thread: the probabilities to the outcome on success, the arena ended,
 * the model released, the call finished. */
void choose_end(choose_call_t *choose, uform_status_t status, char const *message);
