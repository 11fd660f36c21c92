/* Pieces: a text on its way through a tokenizer, as Hugging Face's `tokenizers` carries it (its
 * PreTokenizedString of NormalizedStrings), in arrays.
 *
 * A piece list holds pieces end to end: each piece is a run of code points (`chars`), and every code
 * point carries the span of original bytes it came from (`spans`, offsets into the item's UTF-8 text),
 * so that every token can say which bytes of the input it covers, whatever the normalizers and
 * pre-tokenizers did on the way. Each stage reads one list and writes the next:
 *
 *   text --utf8--> [one piece] --added tokens--> pieces --normalizer--> pieces --pre-tokenizer--> pieces
 *        --model--> tokens --post-processor--> ids and spans
 *
 * A piece whose `ids` entry is not PIECE_OPEN is an added token already cut (its id): normalizers and
 * pre-tokenizers copy it through untouched and the model does not cut it.
 *
 * Alignment follows tokenizers' NormalizedString::transform: a stage that rewrites a piece emits each
 * new code point with a `change` (0: it replaces the next source code point; n > 0: it is inserted
 * before the next source code point; -n: it replaces the next source code point and the n after it are
 * removed). A replacing code point takes the span of the source code point it replaces; an inserted one
 * takes the span of the source code point before it, or the empty span at the piece's `shift` (the
 * original byte where the piece begins) when it is inserted before the first one. Source code points
 * that no emitted one replaced (removed, or left when the stage ends) vanish with their spans. */
#pragma once

#include <string.h>

#include "common.h"

/* Original bytes [begin, end) of the item's text. */
typedef struct piece_span {
    uint32_t begin, end;
} piece_span_t;

#define PIECE_OPEN (-1) /* a piece still to be cut by the model */

typedef struct pieces {
    uint32_t *chars;     /* code points of every piece, end to end: `length` */
    piece_span_t *spans; /* per code point: the original bytes it came from */
    uint32_t *starts;    /* `count + 1` offsets into chars: piece i is [starts[i], starts[i + 1]) */
    uint32_t *shifts;    /* per piece: the original byte it begins at (tokenizers' original_shift) */
    int32_t *ids;        /* per piece: PIECE_OPEN, or the id of the added token it is */
    size_t count, length;
    size_t piece_capacity, char_capacity;
    bool open; /* a piece was begun and not ended */
} pieces_t;

/* Frees the arrays; the list is empty and reusable after. */
void pieces_free(pieces_t *pieces);

/* Empties the list, keeping its memory. */
void pieces_clear(pieces_t *pieces);

/* Begins a piece at original byte `shift`, with `id` (PIECE_OPEN or an added token's id). */
uform_status_t pieces_begin(pieces_t *pieces, uint32_t shift, int32_t id);

/* Room for `extra` more code points (pieces_push's slow path). Answers UFORM_OK, or UFORM_OUT_OF_MEMORY
 * (a list of UINT32_MAX code points included: offsets are 32-bit). */
uform_status_t pieces_reserve(pieces_t *pieces, size_t extra);

/* Appends a code point with its span to the piece begun. Answers UFORM_OK or UFORM_OUT_OF_MEMORY. */
static inline uform_status_t pieces_push(pieces_t *pieces, uint32_t ch, piece_span_t span) {
    if (pieces->length == pieces->char_capacity) {
        uform_status_t status = pieces_reserve(pieces, 1);
        if (status != UFORM_OK) return status;
    }
    pieces->chars[pieces->length] = ch;
    pieces->spans[pieces->length] = span;
    pieces->length++;
    return UFORM_OK;
}

/* Appends `count` code points with their spans (a run of another piece, spans kept) to the piece begun.
 * Answers UFORM_OK or UFORM_OUT_OF_MEMORY. */
static inline uform_status_t pieces_append(pieces_t *pieces, uint32_t const *chars, piece_span_t const *spans,
                                           uint32_t count) {
    if (count == 0) return UFORM_OK;
    if (pieces->char_capacity - pieces->length < count) {
        uform_status_t status = pieces_reserve(pieces, count);
        if (status != UFORM_OK) return status;
    }
    memcpy(pieces->chars + pieces->length, chars, count * sizeof *chars);
    memcpy(pieces->spans + pieces->length, spans, count * sizeof *spans);
    pieces->length += count;
    return UFORM_OK;
}

/* Ends the piece begun; an empty one that is not an added token is dropped (tokenizers drops empty
 * splits). */
void pieces_end(pieces_t *pieces);

/* Copies piece `index` of `from` whole into `to` (begun and ended there). */
uform_status_t pieces_copy(pieces_t *to, pieces_t const *from, size_t index);

/* The code points and spans of piece `index`. */
static inline uint32_t pieces_size(pieces_t const *pieces, size_t index) {
    return pieces->starts[index + 1] - pieces->starts[index];
}
static inline uint32_t const *pieces_chars(pieces_t const *pieces, size_t index) {
    return pieces->chars + pieces->starts[index];
}
static inline piece_span_t const *pieces_spans(pieces_t const *pieces, size_t index) {
    return pieces->spans + pieces->starts[index];
}

/* Rewriting one source piece into a new piece of `out`, by tokenizers' transform rule (the file's
 * head): begin it, emit code points with their changes, end it. `skip` source code points at the start
 * are removed before the first emitted one (tokenizers' initial_offset). */
typedef struct piece_rewrite {
    pieces_t *out;
    uint32_t const *chars; /* the source piece */
    piece_span_t const *spans;
    uint32_t size;
    uint32_t shift;
    uint32_t next; /* the next source code point */
} piece_rewrite_t;

uform_status_t piece_rewrite_begin(piece_rewrite_t *rewrite, pieces_t *out, pieces_t const *in, size_t index,
                                   uint32_t skip);

/* The span a code point emitted with `change` takes, the source cursor moved past the code points it
 * replaces and removes: the rule alone, for a stage that writes something else than what it emits
 * (or nothing). Inline, as the emit below: the stages emit every code point they write. */
static inline piece_span_t piece_rewrite_span(piece_rewrite_t *rewrite, int change) {
    piece_span_t const start = {rewrite->shift, rewrite->shift};
    if (change > 0) return rewrite->next > 0 ? rewrite->spans[rewrite->next - 1] : start;
    /* A replacing code point past the source's end has nothing to take its span from: tokenizers
     * would index out of bounds, so a stage never emits one; the last span stands in. */
    uint32_t at = rewrite->next < rewrite->size ? rewrite->next : rewrite->size - 1;
    piece_span_t span = rewrite->size ? rewrite->spans[at] : start;
    uint32_t consumed = 1u + (uint32_t)(-change);
    rewrite->next = rewrite->size - rewrite->next < consumed ? rewrite->size : rewrite->next + consumed;
    return span;
}

/* Appends `ch` to the new piece with the span the rule gives it. Answers UFORM_OK or UFORM_OUT_OF_MEMORY. */
static inline uform_status_t piece_rewrite_emit(piece_rewrite_t *rewrite, uint32_t ch, int change) {
    return pieces_push(rewrite->out, ch, piece_rewrite_span(rewrite, change));
}

void piece_rewrite_end(piece_rewrite_t *rewrite);

/* Sub-pieces: a stage that splits a piece without rewriting it (pre-tokenizers) emits source code
 * points [begin, end) of piece `index` as a new piece, spans kept; its shift is the span begin of its
 * first code point (tokenizers' slice), or the source piece's shift for an empty range. */
uform_status_t pieces_emit_range(pieces_t *out, pieces_t const *in, size_t index, uint32_t begin,
                                 uint32_t end);

/* UTF-8 decoding of an item's text into one open piece. Answers UFORM_OK, UFORM_FORMAT for text that
 * is not valid UTF-8 (*bad set to the byte offset of the first fault), UFORM_OUT_OF_MEMORY. */
uform_status_t pieces_from_utf8(pieces_t *out, uint8_t const *text, size_t length, size_t *bad);

/* The White_Space property: Rust's char::is_whitespace and the regex crate's \s, which tokenizers'
 * lstrip, rstrip and offset trimming read. */
static inline bool white_space(uint32_t ch) {
    if (ch < 0x80) return ch == ' ' || (ch >= '\t' && ch <= '\r');
    return ch == 0x85 || ch == 0xA0 || ch == 0x1680 || (ch >= 0x2000 && ch <= 0x200A) || ch == 0x2028 ||
           ch == 0x2029 || ch == 0x202F || ch == 0x205F || ch == 0x3000;
}

/* One code point of well-formed UTF-8 at text[0 .. available): its length, or 0 where the bytes are not
 * (overlong forms, surrogates and values past U+10FFFF included). */
size_t utf8_next(uint8_t const *text, size_t available, uint32_t *ch);

/* Appends the UTF-8 encoding of `ch` to `buffer` (4 bytes of room needed); answers the bytes written. */
size_t utf8_put(uint8_t *buffer, uint32_t ch);
