/* SentencePiece's own encoder behind a C interface (sentencepiece.cc, a C++ shim over libsentencepiece,
 * the library transformers' slow tokenizers call through its Python wrapper): a model read from the bytes
 * of a .model file, texts encoded into pieces that carry the input bytes they cover, and the vocabulary's
 * lookups. No C++ exception crosses this interface: the shim catches every one and answers a status
 * (SENTENCEPIECE_OUT_OF_MEMORY for std::bad_alloc, SENTENCEPIECE_FAILED for any other). A model is
 * read-only once loaded: any number of threads may encode with it at once, each into its own pieces.
 * This header is C and C++ alike (uform.h is C only): its statuses are its own. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sentencepiece_status {
    SENTENCEPIECE_OK = 0,
    SENTENCEPIECE_FORMAT,        /* the bytes are not a model SentencePiece accepts */
    SENTENCEPIECE_OUT_OF_MEMORY, /* std::bad_alloc, or an array that could not grow */
    SENTENCEPIECE_FAILED,        /* SentencePiece refused, or threw anything else */
} sentencepiece_status_t;

typedef struct sentencepiece_model sentencepiece_model_t;

/* One piece of an encoded text. */
typedef struct sentencepiece_piece {
    int32_t id;              /* SentencePiece's id (its unknown id for an unknown piece) */
    uint32_t begin, end;     /* the input bytes it covers; begin == end for a byte piece (byte fallback) that
                                is not the last of its character, and for a piece the normalizer inserted */
    uint32_t string, length; /* its string (SentencePiece's piece, spaces as U+2581): `strings` bytes
                                [string, string + length) */
    bool unknown;
} sentencepiece_piece_t;

/* An encoded text: pieces in order, their strings end to end. Grown by sentencepiece_encode, kept between
 * texts, freed with sentencepiece_pieces_free. */
typedef struct sentencepiece_pieces {
    sentencepiece_piece_t *pieces;
    size_t count, capacity;
    char *strings;
    size_t strings_length, strings_capacity;
} sentencepiece_pieces_t;

/* Reads a model from the `length` bytes of a serialized ModelProto (a .model file; read only during the
 * call). On failure `message` (`size` bytes) says why, SentencePiece's own words for FORMAT. */
sentencepiece_status_t sentencepiece_load(void const *bytes, size_t length, sentencepiece_model_t **model,
                                          char *message, size_t size);
void sentencepiece_free(sentencepiece_model_t *model);

/* SentencePiece's Encode of `length` bytes of UTF-8 into `out` (cleared first): the pieces
 * SentencePieceProcessor.encode gives, with their ids, strings and spans. Answers SENTENCEPIECE_OK,
 * SENTENCEPIECE_OUT_OF_MEMORY, SENTENCEPIECE_FAILED; `*message` says why (static text). */
sentencepiece_status_t sentencepiece_encode(sentencepiece_model_t const *model, char const *text,
                                            size_t length, sentencepiece_pieces_t *out, char const **message);
void sentencepiece_pieces_free(sentencepiece_pieces_t *pieces);

/* The vocabulary: its size (GetPieceSize), the id of a piece's string (PieceToId: the unknown id for a
 * string that is no piece), the unknown id. None fails or blocks. */
size_t sentencepiece_size(sentencepiece_model_t const *model);
int32_t sentencepiece_piece_id(sentencepiece_model_t const *model, char const *piece, size_t length);
int32_t sentencepiece_unknown_id(sentencepiece_model_t const *model);
/* The string of piece `id` (IdToPiece), `*length` bytes held by the model while it lives; NULL for an id
 * past the vocabulary. Never fails or blocks. */
char const *sentencepiece_piece(sentencepiece_model_t const *model, int32_t id, size_t *length);

#ifdef __cplusplus
}
#endif
