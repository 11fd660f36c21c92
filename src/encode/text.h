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
