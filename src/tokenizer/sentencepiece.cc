/* The C shim over libsentencepiece (sentencepiece.h): a SentencePieceProcessor loaded from a serialized
 * model, and its Encode into an ImmutableSentencePieceText whose pieces are copied into C arrays (grown
 * with realloc, so that the C side owns and frees them). Every entry point catches every exception:
 * std::bad_alloc becomes SENTENCEPIECE_OUT_OF_MEMORY, anything else SENTENCEPIECE_FAILED; SentencePiece's
 * own failures come back as its util::Status and become statuses with its message. */
#include "sentencepiece.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include <sentencepiece_processor.h>

struct sentencepiece_model {
    sentencepiece::SentencePieceProcessor processor;
};

namespace {

void message_write(char *message, size_t size, char const *what, char const *detail) {
    std::snprintf(message, size, "%s%s", what, detail ? detail : "");
}

/* SentencePiece's message without the source file and line it begins with ("./src/x.cc(232) [check] why"),
 * and its protobuf's failure in words. */
char const *status_words(sentencepiece::util::Status const &status) {
    char const *text = status.error_message();
    char const *location = std::strstr(text, ") [");
    if (location && std::strchr(text, '(') < location) text = location + 2;
    if (std::strstr(text, "ParseFromArray")) return "the bytes are not a serialized ModelProto";
    return text;
}

/* Room for `count` pieces and `bytes` more string bytes. */
bool pieces_reserve(sentencepiece_pieces_t *out, size_t count, size_t bytes) {
    if (count > out->capacity) {
        size_t capacity = out->capacity ? out->capacity + out->capacity / 2 : 64;
        if (capacity < count) capacity = count;
        void *grown = std::realloc(out->pieces, capacity * sizeof *out->pieces);
        if (!grown) return false;
        out->pieces = static_cast<sentencepiece_piece_t *>(grown);
        out->capacity = capacity;
    }
    size_t need = out->strings_length + bytes;
    if (need > out->strings_capacity) {
        size_t capacity = out->strings_capacity ? out->strings_capacity + out->strings_capacity / 2 : 1024;
        if (capacity < need) capacity = need;
        void *grown = std::realloc(out->strings, capacity);
        if (!grown) return false;
        out->strings = static_cast<char *>(grown);
        out->strings_capacity = capacity;
    }
    return true;
}

/* Copies the pieces of `text` into `out`. */
sentencepiece_status_t pieces_copy(sentencepiece::ImmutableSentencePieceText const &text,
                                   sentencepiece::SentencePieceProcessor const &processor,
                                   sentencepiece_pieces_t *out) {
    size_t count = text.pieces_size();
    if (!pieces_reserve(out, count, 0)) return SENTENCEPIECE_OUT_OF_MEMORY;
    for (size_t i = 0; i < count; ++i) {
        auto const piece = text.pieces(static_cast<int>(i));
        std::string const &string = piece.piece();
        if (string.size() > UINT32_MAX || out->strings_length + string.size() > UINT32_MAX)
            return SENTENCEPIECE_OUT_OF_MEMORY;
        if (!pieces_reserve(out, count, string.size())) return SENTENCEPIECE_OUT_OF_MEMORY;
        std::memcpy(out->strings + out->strings_length, string.data(), string.size());
        out->pieces[i] = sentencepiece_piece_t{static_cast<int32_t>(piece.id()),
                                               piece.begin(),
                                               piece.end(),
                                               static_cast<uint32_t>(out->strings_length),
                                               static_cast<uint32_t>(string.size()),
                                               processor.IsUnknown(static_cast<int>(piece.id()))};
        out->strings_length += string.size();
    }
    out->count = count;
    return SENTENCEPIECE_OK;
}

} // namespace

extern "C" sentencepiece_status_t sentencepiece_load(void const *bytes, size_t length,
                                                     sentencepiece_model_t **model, char *message,
                                                     size_t size) {
    *model = nullptr;
    sentencepiece_model_t *loaded = nullptr;
    try {
        loaded = new sentencepiece_model_t;
        auto status = loaded->processor.LoadFromSerializedProto(
            std::string_view(static_cast<char const *>(bytes), length));
        if (!status.ok()) {
            message_write(message, size, "not a SentencePiece model: ", status_words(status));
            delete loaded;
            return SENTENCEPIECE_FORMAT;
        }
    } catch (std::bad_alloc const &) {
        delete loaded;
        message_write(message, size, "out of memory reading the SentencePiece model", nullptr);
        return SENTENCEPIECE_OUT_OF_MEMORY;
    } catch (...) {
        delete loaded;
        message_write(message, size, "SentencePiece failed reading the model", nullptr);
        return SENTENCEPIECE_FAILED;
    }
    *model = loaded;
    return SENTENCEPIECE_OK;
}

extern "C" void sentencepiece_free(sentencepiece_model_t *model) {
    delete model;
}

extern "C" sentencepiece_status_t sentencepiece_encode(sentencepiece_model_t const *model, char const *text,
                                                       size_t length, sentencepiece_pieces_t *out,
                                                       char const **message) {
    out->count = 0;
    out->strings_length = 0;
    try {
        sentencepiece::ImmutableSentencePieceText encoded;
        auto status = model->processor.Encode(std::string_view(text, length), encoded.mutable_proto());
        if (!status.ok()) return *message = "SentencePiece cannot encode the text", SENTENCEPIECE_FAILED;
        return pieces_copy(encoded, model->processor, out);
    } catch (std::bad_alloc const &) {
        return *message = "out of memory encoding the text", SENTENCEPIECE_OUT_OF_MEMORY;
    } catch (...) {
        return *message = "SentencePiece failed encoding the text", SENTENCEPIECE_FAILED;
    }
}

extern "C" void sentencepiece_pieces_free(sentencepiece_pieces_t *pieces) {
    std::free(pieces->pieces);
    std::free(pieces->strings);
    *pieces = sentencepiece_pieces_t{};
}

extern "C" size_t sentencepiece_size(sentencepiece_model_t const *model) {
    return static_cast<size_t>(model->processor.GetPieceSize());
}

extern "C" int32_t sentencepiece_piece_id(sentencepiece_model_t const *model, char const *piece,
                                          size_t length) {
    try {
        return model->processor.PieceToId(std::string_view(piece, length));
    } catch (...) {
        return model->processor.unk_id();
    }
}

extern "C" int32_t sentencepiece_unknown_id(sentencepiece_model_t const *model) {
    return model->processor.unk_id();
}

extern "C" char const *sentencepiece_piece(sentencepiece_model_t const *model, int32_t id, size_t *length) {
    if (id < 0 || id >= model->processor.GetPieceSize()) return nullptr;
    std::string const &piece = model->processor.IdToPiece(id);
    *length = piece.size();
    return piece.data();
}
