/* Pieces: growing the arrays, a rewrite begun (the transform rule itself is inline in pieces.h), UTF-8 in
 * and out. */
#include "pieces.h"

#include <stdlib.h>
#include <string.h>

void pieces_free(pieces_t *pieces) {
    free(pieces->chars);
    free(pieces->spans);
    free(pieces->starts);
    free(pieces->shifts);
    free(pieces->ids);
    *pieces = (pieces_t){0};
}

void pieces_clear(pieces_t *pieces) {
    pieces->count = 0;
    pieces->length = 0;
    pieces->open = false;
    if (pieces->starts) pieces->starts[0] = 0;
}

/* Grows an array to hold at least `need` elements of `size` bytes, by half again. */
static bool grow(void **array, size_t *capacity, size_t need, size_t size) {
    if (need <= *capacity) return true;
    size_t next = *capacity + *capacity / 2;
    if (next < need) next = need;
    if (next < 16) next = 16;
    void *moved = realloc(*array, next * size);
    if (!moved) return false;
    *array = moved;
    *capacity = next;
    return true;
}

static bool grow_pieces(pieces_t *pieces, size_t need) {
    if (need + 1 <= pieces->piece_capacity) return true;
    size_t capacity = pieces->piece_capacity;
    size_t c1 = capacity, c2 = capacity, c3 = capacity;
    if (!grow((void **)&pieces->starts, &c1, need + 1, sizeof *pieces->starts)) return false;
    if (!grow((void **)&pieces->shifts, &c2, need + 1, sizeof *pieces->shifts)) return false;
    if (!grow((void **)&pieces->ids, &c3, need + 1, sizeof *pieces->ids)) return false;
    pieces->piece_capacity = c1 < c2 ? (c1 < c3 ? c1 : c3) : (c2 < c3 ? c2 : c3);
    return true;
}

uform_status_t pieces_begin(pieces_t *pieces, uint32_t shift, int32_t id) {
    if (!grow_pieces(pieces, pieces->count + 1)) return UFORM_OUT_OF_MEMORY;
    if (pieces->count == 0) pieces->starts[0] = (uint32_t)pieces->length;
    pieces->shifts[pieces->count] = shift;
    pieces->ids[pieces->count] = id;
    pieces->open = true;
    return UFORM_OK;
}

uform_status_t pieces_reserve(pieces_t *pieces, size_t extra) {
    if (extra >= UINT32_MAX - pieces->length) return UFORM_OUT_OF_MEMORY;
    size_t need = pieces->length + extra, c1 = pieces->char_capacity, c2 = pieces->char_capacity;
    if (!grow((void **)&pieces->chars, &c1, need, sizeof *pieces->chars)) return UFORM_OUT_OF_MEMORY;
    if (!grow((void **)&pieces->spans, &c2, need, sizeof *pieces->spans)) return UFORM_OUT_OF_MEMORY;
    pieces->char_capacity = c1 < c2 ? c1 : c2;
    return UFORM_OK;
}

void pieces_end(pieces_t *pieces) {
    pieces->open = false;
    uint32_t start = pieces->starts[pieces->count];
    if (pieces->length == start && pieces->ids[pieces->count] == PIECE_OPEN) return; /* dropped */
    pieces->count++;
    pieces->starts[pieces->count] = (uint32_t)pieces->length;
}

uform_status_t pieces_copy(pieces_t *to, pieces_t const *from, size_t index) {
    uform_status_t status = pieces_begin(to, from->shifts[index], from->ids[index]);
    if (status == UFORM_OK)
        status =
            pieces_append(to, pieces_chars(from, index), pieces_spans(from, index), pieces_size(from, index));
    if (status == UFORM_OK) pieces_end(to);
    return status;
}

uform_status_t pieces_emit_range(pieces_t *out, pieces_t const *in, size_t index, uint32_t begin,
                                 uint32_t end) {
    piece_span_t const *spans = pieces_spans(in, index);
    uint32_t const *chars = pieces_chars(in, index);
    uint32_t shift = begin < end ? spans[begin].begin : in->shifts[index];
    uform_status_t status = pieces_begin(out, shift, in->ids[index]);
    if (status == UFORM_OK) status = pieces_append(out, chars + begin, spans + begin, end - begin);
    if (status == UFORM_OK) pieces_end(out);
    return status;
}

uform_status_t piece_rewrite_begin(piece_rewrite_t *rewrite, pieces_t *out, pieces_t const *in, size_t index,
                                   uint32_t skip) {
    *rewrite = (piece_rewrite_t){
        .out = out,
        .chars = pieces_chars(in, index),
        .spans = pieces_spans(in, index),
        .size = pieces_size(in, index),
        .shift = in->shifts[index],
        .next = skip,
    };
    if (rewrite->next > rewrite->size) rewrite->next = rewrite->size;
    return pieces_begin(out, in->shifts[index], in->ids[index]);
}

void piece_rewrite_end(piece_rewrite_t *rewrite) {
    pieces_end(rewrite->out);
}

size_t utf8_put(uint8_t *buffer, uint32_t ch) {
    if (ch < 0x80) {
        buffer[0] = (uint8_t)ch;
        return 1;
    }
    if (ch < 0x800) {
        buffer[0] = (uint8_t)(0xC0 | (ch >> 6));
        buffer[1] = (uint8_t)(0x80 | (ch & 0x3F));
        return 2;
    }
    if (ch < 0x10000) {
        buffer[0] = (uint8_t)(0xE0 | (ch >> 12));
        buffer[1] = (uint8_t)(0x80 | ((ch >> 6) & 0x3F));
        buffer[2] = (uint8_t)(0x80 | (ch & 0x3F));
        return 3;
    }
    buffer[0] = (uint8_t)(0xF0 | (ch >> 18));
    buffer[1] = (uint8_t)(0x80 | ((ch >> 12) & 0x3F));
    buffer[2] = (uint8_t)(0x80 | ((ch >> 6) & 0x3F));
    buffer[3] = (uint8_t)(0x80 | (ch & 0x3F));
    return 4;
}

size_t utf8_next(uint8_t const *text, size_t available, uint32_t *ch) {
    uint8_t lead = text[0];
    if (lead < 0x80) {
        *ch = lead;
        return 1;
    }
    size_t size;
    uint32_t value, least;
    if (lead >= 0xC2 && lead <= 0xDF)
        size = 2, value = lead & 0x1F, least = 0x80;
    else if (lead >= 0xE0 && lead <= 0xEF)
        size = 3, value = lead & 0x0F, least = 0x800;
    else if (lead >= 0xF0 && lead <= 0xF4)
        size = 4, value = lead & 0x07, least = 0x10000;
    else
        return 0;
    if (available < size) return 0;
    for (size_t i = 1; i < size; ++i) {
        if ((text[i] & 0xC0) != 0x80) return 0;
        value = value << 6 | (text[i] & 0x3F);
    }
    if (value < least || value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) return 0;
    *ch = value;
    return size;
}

uform_status_t pieces_from_utf8(pieces_t *out, uint8_t const *text, size_t length, size_t *bad) {
    if (length > UINT32_MAX) return UFORM_FORMAT;
    uform_status_t status = pieces_begin(out, 0, PIECE_OPEN);
    for (size_t at = 0; at < length && status == UFORM_OK;) {
        uint32_t ch;
        size_t size = utf8_next(text + at, length - at, &ch);
        if (size == 0) {
            *bad = at;
            out->open = false;
            return UFORM_FORMAT;
        }
        status = pieces_push(out, ch, (piece_span_t){(uint32_t)at, (uint32_t)(at + size)});
        at += size;
    }
    if (status == UFORM_OK) pieces_end(out);
    return status;
}
