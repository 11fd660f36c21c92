/* SentencePiece model files cut as transformers' slow tokenizers (4.44) cut with them (spiece.h). A text
 * goes the way PreTrainedTokenizer.tokenize and the class's _tokenize take it, as code points that carry
 * the original bytes they came from (pieces.h's spans):
 *
 *   UTF-8 -> code points -> [SigLIP: "▁" + text with "▁" as " ", lowercased]
 *         -> split around the class's special tokens (tokens_trie.split), their lstrip and rstrip
 *         -> each stretch of text: [SigLIP: canonicalized, "<unk>" before it] -> SentencePiece's Encode
 *         -> pieces [SigLIP: less those of "<unk>"] -> ids by the class's conversion -> special tokens
 *
 * SentencePiece's pieces carry the bytes of its own input they cover; each byte of that input carries the
 * original span of the code point it came from, so that a token spans from its first byte's begin to its
 * last byte's end, and spans stay within the text and in order. Where SigLIP's preprocessing removed text
 * (punctuation, whitespace stripped or collapsed), no token covers it unless it lay inside a token's run;
 * the "▁" and "<unk>" it inserts cover nothing ([b, b) at the next original byte), and a byte piece that
 * SentencePiece gives no bytes of its own (byte fallback, before a character's last byte) spans the code
 * point it lies in. A special token of the text spans its own bytes and the whitespace its lstrip or
 * rstrip took. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "json_fault.h"
#include "sentencepiece.h"
#include "spiece.h"

#define SPIECE_TOKENS_MAX 5
#define SPACE_SYMBOL      0x2581u /* "▁", SentencePiece's space */

static char const unk_token[] = "<unk>";

typedef enum spiece_class { SPIECE_PLAIN, SPIECE_XLM_ROBERTA, SPIECE_SIGLIP } spiece_class_t;

/* A special token the class splits the text around (its AddedToken), with its id. */
typedef struct spiece_token {
    char const *content; /* ASCII */
    int32_t id;
    bool lstrip, rstrip;
} spiece_token_t;

struct spiece {
    sentencepiece_model_t *model; /* SigLIP's with add_dummy_prefix off, as its get_spm_processor loads it */
    spiece_class_t kind;
    spiece_token_t tokens[SPIECE_TOKENS_MAX];
    size_t token_count;
    bool lower;        /* SigLIP's do_lower_case */
    size_t unk_pieces; /* SigLIP: the pieces of "<unk>" alone (its unk_token_length) */
    int32_t bos, eos;  /* the ids put around a text (-1: none) */
    size_t vocabulary, special_added;
    char model_name[16];
};

/* A stretch of text between special tokens, or one of them: code points [begin, end); a token covers
 * [cover_begin, cover_end), its own and the whitespace its strips took. */
typedef struct spiece_segment {
    uint32_t begin, end, cover_begin, cover_end;
    int32_t token; /* index into the tokens, or -1 for text */
} spiece_segment_t;

/* What SentencePiece encodes: bytes, each with the original span of the code point it came from (NULL
 * spans: the bytes are the text's own, from byte `base`). */
typedef struct spiece_input {
    char const *bytes;
    size_t length;
    piece_span_t const *spans;
    uint32_t base;
} spiece_input_t;

/* Per-thread scratch, kept in work->spiece between texts. */
typedef struct spiece_work {
    spiece_segment_t *segments;
    size_t segments_count, segments_capacity;
    char *bytes;
    piece_span_t *spans; /* per byte of `bytes` */
    size_t bytes_capacity;
    sentencepiece_pieces_t encoded;
} spiece_work_t;

/* The shim's statuses as the engine's. */
static uform_status_t status_of(sentencepiece_status_t status) {
    switch (status) {
    case SENTENCEPIECE_OK:
        return UFORM_OK;
    case SENTENCEPIECE_FORMAT:
        return UFORM_FORMAT;
    case SENTENCEPIECE_OUT_OF_MEMORY:
        return UFORM_OUT_OF_MEMORY;
    default:
        return UFORM_INTERNAL;
    }
}

/* ---- Python's text functions ------------------------------------------------------------------- */

/* str.isspace, and so str.strip and re's \s: bidirectional classes WS, B, S and category Zs. */
static bool python_space(uint32_t ch) {
    return (ch >= 0x09 && ch <= 0x0D) || (ch >= 0x1C && ch <= 0x20) || ch == 0x85 || ch == 0xA0 ||
           ch == 0x1680 || (ch >= 0x2000 && ch <= 0x200A) || ch == 0x2028 || ch == 0x2029 || ch == 0x202F ||
           ch == 0x205F || ch == 0x3000;
}

/* string.punctuation: ASCII's 32 punctuation characters. */
static bool python_punctuation(uint32_t ch) {
    return ch < 0x80 && ch > 0x20 && ch != 0x7F &&
           !((ch >= '0' && ch <= '9') || (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z'));
}

/* ---- reading the model and the folder's tokenizer_config.json ---------------------------------- */

/* A varint of a serialized protobuf at *at; false past the end. */
static bool proto_varint(uint8_t const *bytes, size_t length, size_t *at, uint64_t *value) {
    *value = 0;
    for (unsigned shift = 0; shift < 64 && *at < length; shift += 7) {
        uint8_t byte = bytes[(*at)++];
        *value |= (uint64_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80)) return true;
    }
    return false;
}

/* Walks one message's fields: calls `visit` with each field number, wire type and its payload (a varint's
 * value, or a length-delimited field's bytes); false where the bytes are malformed. */
typedef void proto_visit_t(void *context, uint64_t field, uint64_t value, uint8_t const *bytes,
                           size_t length);
static bool proto_walk(uint8_t const *bytes, size_t length, proto_visit_t *visit, void *context) {
    for (size_t at = 0; at < length;) {
        uint64_t key, value = 0;
        if (!proto_varint(bytes, length, &at, &key)) return false;
        switch (key & 7) {
        case 0:
            if (!proto_varint(bytes, length, &at, &value)) return false;
            visit(context, key >> 3, value, NULL, 0);
            break;
        case 1:
        case 5: {
            size_t size = (key & 7) == 1 ? 8 : 4;
            if (length - at < size) return false;
            at += size;
            break;
        }
        case 2:
            if (!proto_varint(bytes, length, &at, &value) || value > length - at) return false;
            visit(context, key >> 3, 0, bytes + at, (size_t)value);
            at += (size_t)value;
            break;
        default:
            return false;
        }
    }
    return true;
}

/* TrainerSpec.model_type (field 3): the last one read wins, as protobuf merges. */
static void trainer_spec_visit(void *context, uint64_t field, uint64_t value, uint8_t const *bytes,
                               size_t length) {
    (void)bytes;
    (void)length;
    if (field == 3 && !bytes) *(uint64_t *)context = value;
}

/* ModelProto.trainer_spec (field 2). */
static void model_proto_visit(void *context, uint64_t field, uint64_t value, uint8_t const *bytes,
                              size_t length) {
    (void)value;
    if (field == 2 && bytes) proto_walk(bytes, length, trainer_spec_visit, context);
}

/* The model's name from its trainer_spec's model_type (UNIGRAM 1, the default; BPE 2; WORD 3; CHAR 4). */
static void model_name(uint8_t const *bytes, size_t length, spiece_t *spiece) {
    uint64_t type = 1;
    proto_walk(bytes, length, model_proto_visit, &type);
    char const *name = type == 2 ? "BPE" : type == 3 ? "Word" : type == 4 ? "Char" : "Unigram";
    snprintf(spiece->model_name, sizeof spiece->model_name, "%s", name);
}

/* A special token of the config ("eos_token": "</s>", or an AddedToken's {"content": "</s>", ...}) must be
 * the class's own: another would cut otherwise than here. */
static uform_status_t config_token(json_t const *root, char const *key, char const *expected,
                                   tokenizer_fault_t *fault) {
    json_t const *value = json_object_get(root, key);
    if (json_is_object(value)) value = json_object_get(value, "content");
    if (!value || json_is_null(value)) return UFORM_OK;
    if (!json_is_string(value))
        return tokenizer_fail(fault, UFORM_FORMAT, "tokenizer_config.json: \"%s\" is not a token", key);
    if (strcmp(json_string_value(value), expected) == 0) return UFORM_OK;
    return tokenizer_fail(fault, UFORM_UNSUPPORTED,
                          "tokenizer_config.json: %s \"%.40s\" (the class's own \"%s\" is read)", key,
                          json_string_value(value), expected);
}

/* What the config may hold beside the class: no other special tokens, no sampling options. */
static uform_status_t config_check(json_t const *root, char const *const *keys, char const *const *expected,
                                   tokenizer_fault_t *fault) {
    uform_status_t status = UFORM_OK;
    for (size_t i = 0; keys[i] && status == UFORM_OK; ++i)
        status = config_token(root, keys[i], expected[i], fault);
    if (status != UFORM_OK) return status;
    json_t const *extra = json_object_get(root, "additional_special_tokens");
    if (extra && !json_is_null(extra) && !(json_is_array(extra) && json_array_size(extra) == 0))
        return tokenizer_fail(fault, UFORM_UNSUPPORTED,
                              "tokenizer_config.json: additional_special_tokens are not read");
    json_t const *kwargs = json_object_get(root, "sp_model_kwargs");
    if (kwargs && !json_is_null(kwargs) && !(json_is_object(kwargs) && json_object_size(kwargs) == 0))
        return tokenizer_fail(fault, UFORM_UNSUPPORTED,
                              "tokenizer_config.json: sp_model_kwargs are not read");
    return UFORM_OK;
}

/* The class and its settings from tokenizer_config.json. */
static uform_status_t config_read(char const *path, spiece_t *spiece, tokenizer_fault_t *fault) {
    static char const *const siglip_keys[] = {"eos_token", "unk_token", "pad_token", NULL};
    static char const *const siglip_tokens[] = {"</s>", "<unk>", "</s>"};
    static char const *const xlmr_keys[] = {"bos_token", "eos_token", "sep_token",  "cls_token",
                                            "unk_token", "pad_token", "mask_token", NULL};
    static char const *const xlmr_tokens[] = {"<s>", "</s>", "</s>", "<s>", "<unk>", "<pad>", "<mask>"};
    json_error_t error;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &error);
    if (!root) {
        if (json_fault_memory(&error))
            return tokenizer_fail(fault, UFORM_OUT_OF_MEMORY, "tokenizer_config.json: out of memory");
        if (json_error_code(&error) == json_error_cannot_open_file)
            return tokenizer_fail(fault, UFORM_IO,
                                  "cannot read the tokenizer_config.json beside the SentencePiece "
                                  "model (it names the tokenizer class)");
        return tokenizer_fail(fault, UFORM_FORMAT, "tokenizer_config.json, line %d: %.100s", error.line,
                              error.text);
    }
    char const *name = NULL;
    uform_status_t status =
        json_get_string(root, "tokenizer_class", NULL, &name, NULL, "tokenizer_config.json", fault);
    if (status == UFORM_OK && !name)
        status =
            tokenizer_fail(fault, UFORM_UNSUPPORTED, "tokenizer_config.json names no \"tokenizer_class\"");
    else if (status == UFORM_OK && strcmp(name, "SiglipTokenizer") == 0) {
        spiece->kind = SPIECE_SIGLIP;
        status = json_get_bool(root, "do_lower_case", true, &spiece->lower, "tokenizer_config.json", fault);
        if (status == UFORM_OK) status = config_check(root, siglip_keys, siglip_tokens, fault);
    } else if (status == UFORM_OK && strcmp(name, "XLMRobertaTokenizer") == 0) {
        spiece->kind = SPIECE_XLM_ROBERTA;
        status = config_check(root, xlmr_keys, xlmr_tokens, fault);
    } else if (status == UFORM_OK) {
        status = tokenizer_fail(fault, UFORM_UNSUPPORTED,
                                "tokenizer class \"%.60s\" with a SentencePiece model (SiglipTokenizer and "
                                "XLMRobertaTokenizer are read)",
                                name);
    }
    json_decref(root);
    return status;
}

/* Loads the model: SigLIP's with NormalizerSpec.add_dummy_prefix false, which transformers merges into
 * the proto; a serialized field appended to a message merges into it the same way. */
static uform_status_t model_load(void const *bytes, size_t length, spiece_t *spiece,
                                 tokenizer_fault_t *fault) {
    /* normalizer_spec { add_dummy_prefix: false } */
    static uint8_t const no_dummy_prefix[] = {0x1A, 0x02, 0x18, 0x00};
    if (length == 0)
        return tokenizer_fail(fault, UFORM_FORMAT, "not a SentencePiece model: the file is empty");
    uint8_t *merged = NULL;
    if (spiece->kind == SPIECE_SIGLIP) {
        merged = malloc(length + sizeof no_dummy_prefix);
        if (!merged) return tokenizer_fail(fault, UFORM_OUT_OF_MEMORY, "out of memory reading the model");
        memcpy(merged, bytes, length);
        memcpy(merged + length, no_dummy_prefix, sizeof no_dummy_prefix);
        bytes = merged;
        length += sizeof no_dummy_prefix;
    }
    sentencepiece_status_t status =
        sentencepiece_load(bytes, length, &spiece->model, fault->message, sizeof fault->message);
    free(merged);
    return status_of(status);
}

static void token_add(spiece_t *spiece, char const *content, int32_t id, bool lstrip, bool rstrip) {
    spiece->tokens[spiece->token_count++] = (spiece_token_t){content, id, lstrip, rstrip};
}

static int32_t piece_id_of(spiece_t const *spiece, char const *piece) {
    return sentencepiece_piece_id(spiece->model, piece, strlen(piece));
}

/* XLMRobertaTokenizer: fairseq's four, then <mask> (lstrip) after the vocabulary shifted by one. */
static void xlm_roberta_setup(spiece_t *spiece) {
    size_t size = sentencepiece_size(spiece->model);
    token_add(spiece, "<s>", 0, false, false);
    token_add(spiece, "<pad>", 1, false, false);
    token_add(spiece, "</s>", 2, false, false);
    token_add(spiece, unk_token, 3, false, false);
    token_add(spiece, "<mask>", (int32_t)(size + 1), true, false);
    spiece->bos = 0;
    spiece->eos = 2;
    spiece->vocabulary = size + 2;
    spiece->special_added = 2;
}

/* SiglipTokenizer: </s> and <unk> (lstrip and rstrip), their ids SentencePiece's; unk_token_length. */
static uform_status_t siglip_setup(spiece_t *spiece, tokenizer_fault_t *fault) {
    spiece->eos = piece_id_of(spiece, "</s>");
    token_add(spiece, "</s>", spiece->eos, true, true);
    token_add(spiece, unk_token, piece_id_of(spiece, unk_token), true, true);
    spiece->bos = -1;
    spiece->vocabulary = sentencepiece_size(spiece->model);
    spiece->special_added = 1;
    sentencepiece_pieces_t pieces = {0};
    char const *message = NULL;
    uform_status_t status =
        status_of(sentencepiece_encode(spiece->model, unk_token, strlen(unk_token), &pieces, &message));
    spiece->unk_pieces = pieces.count;
    sentencepiece_pieces_free(&pieces);
    return status == UFORM_OK ? UFORM_OK : tokenizer_fail(fault, status, "%s", message);
}

uform_status_t spiece_read(void const *model, size_t length, char const *config, spiece_t **out,
                           tokenizer_fault_t *fault) {
    *out = NULL;
    spiece_t *spiece = calloc(1, sizeof *spiece);
    if (!spiece) return tokenizer_fail(fault, UFORM_OUT_OF_MEMORY, "out of memory");
    spiece->kind = SPIECE_PLAIN;
    spiece->bos = spiece->eos = -1;
    uform_status_t status = config ? config_read(config, spiece, fault) : UFORM_OK;
    if (status == UFORM_OK) status = model_load(model, length, spiece, fault);
    if (status == UFORM_OK) {
        model_name(model, length, spiece);
        spiece->vocabulary = sentencepiece_size(spiece->model);
        if (spiece->kind == SPIECE_XLM_ROBERTA) xlm_roberta_setup(spiece);
        if (spiece->kind == SPIECE_SIGLIP) status = siglip_setup(spiece, fault);
    }
    if (status != UFORM_OK) {
        spiece_free(spiece);
        return status;
    }
    *out = spiece;
    return UFORM_OK;
}

void spiece_free(spiece_t *spiece) {
    if (!spiece) return;
    sentencepiece_free(spiece->model);
    free(spiece);
}

void spiece_info(spiece_t const *spiece, uform_tokenizer_info_t *info) {
    *info =
        (uform_tokenizer_info_t){.vocabulary = spiece->vocabulary, .special_added = spiece->special_added};
    memcpy(info->model, spiece->model_name, sizeof info->model);
}

/* ---- the scratch ------------------------------------------------------------------------------- */

static spiece_work_t *work_of(tokenizer_work_t *work) {
    if (!work->spiece) work->spiece = calloc(1, sizeof(spiece_work_t));
    return work->spiece;
}

void spiece_work_free(tokenizer_work_t *work) {
    spiece_work_t *scratch = work->spiece;
    if (!scratch) return;
    free(scratch->segments);
    free(scratch->bytes);
    free(scratch->spans);
    sentencepiece_pieces_free(&scratch->encoded);
    free(scratch);
    work->spiece = NULL;
}

static uform_status_t bytes_reserve(spiece_work_t *scratch, size_t size) {
    if (size <= scratch->bytes_capacity) return UFORM_OK;
    char *bytes = realloc(scratch->bytes, size);
    if (bytes) scratch->bytes = bytes;
    piece_span_t *spans = bytes ? realloc(scratch->spans, size * sizeof *spans) : NULL;
    if (!spans) return UFORM_OUT_OF_MEMORY;
    scratch->spans = spans;
    scratch->bytes_capacity = size;
    return UFORM_OK;
}

static uform_status_t segment_push(spiece_work_t *scratch, uint32_t begin, uint32_t end, int32_t token) {
    if (scratch->segments_count == scratch->segments_capacity) {
        size_t capacity = scratch->segments_capacity ? 2 * scratch->segments_capacity : 16;
        spiece_segment_t *grown = realloc(scratch->segments, capacity * sizeof *grown);
        if (!grown) return UFORM_OUT_OF_MEMORY;
        scratch->segments = grown;
        scratch->segments_capacity = capacity;
    }
    scratch->segments[scratch->segments_count++] = (spiece_segment_t){begin, end, begin, end, token};
    return UFORM_OK;
}

/* ---- splitting around the special tokens ------------------------------------------------------- */

/* The longest special token at code point `at` of `chars`, or -1. */
static int32_t token_at(spiece_t const *spiece, uint32_t const *chars, size_t count, size_t at) {
    int32_t found = -1;
    size_t longest = 0;
    for (size_t t = 0; t < spiece->token_count; ++t) {
        char const *content = spiece->tokens[t].content;
        size_t size = strlen(content), i = 0;
        while (i < size && at + i < count && chars[at + i] == (uint8_t)content[i])
            i++;
        if (i == size && size > longest) found = (int32_t)t, longest = size;
    }
    return found;
}

/* tokens_trie.split: the text cut at the leftmost (then longest) match of each special token, empty
 * stretches dropped. The classes' tokens all begin with '<' and none is a prefix or infix of another, so
 * that this is what the trie's walk finds. */
static uform_status_t split(spiece_t const *spiece, uint32_t const *chars, size_t count,
                            spiece_work_t *scratch) {
    scratch->segments_count = 0;
    uform_status_t status = UFORM_OK;
    size_t start = 0;
    for (size_t at = 0; at < count && status == UFORM_OK;) {
        int32_t token = chars[at] == '<' ? token_at(spiece, chars, count, at) : -1;
        if (token < 0) {
            at++;
            continue;
        }
        if (at > start) status = segment_push(scratch, (uint32_t)start, (uint32_t)at, -1);
        size_t end = at + strlen(spiece->tokens[token].content);
        if (status == UFORM_OK) status = segment_push(scratch, (uint32_t)at, (uint32_t)end, token);
        start = at = end;
    }
    if (status == UFORM_OK && count > start)
        status = segment_push(scratch, (uint32_t)start, (uint32_t)count, -1);
    return status;
}

/* PreTrainedTokenizer.tokenize's strips: a token with rstrip takes the whitespace at the start of the
 * text after it, one with lstrip that at the end of the text before it. */
static void strip(spiece_t const *spiece, uint32_t const *chars, spiece_work_t *scratch) {
    spiece_segment_t *segments = scratch->segments;
    for (size_t i = 0; i < scratch->segments_count; ++i) {
        if (segments[i].token < 0) continue;
        spiece_token_t const *token = &spiece->tokens[segments[i].token];
        spiece_segment_t *right = i + 1 < scratch->segments_count ? &segments[i + 1] : NULL;
        spiece_segment_t *left = i > 0 ? &segments[i - 1] : NULL;
        if (token->rstrip && right && right->token < 0) {
            while (right->begin < right->end && python_space(chars[right->begin]))
                right->begin++;
            segments[i].cover_end = right->begin;
        }
        if (token->lstrip && left && left->token < 0) {
            while (left->end > left->begin && python_space(chars[left->end - 1]))
                left->end--;
            segments[i].cover_begin = left->end;
        }
    }
}

char const *spiece_token(spiece_t const *spiece, uint32_t id, size_t *length) {
    if (spiece->kind != SPIECE_PLAIN)
        for (size_t t = 0; t < spiece->token_count; ++t)
            if (spiece->tokens[t].id >= 0 && (uint32_t)spiece->tokens[t].id == id) {
                *length = strlen(spiece->tokens[t].content);
                return spiece->tokens[t].content;
            }
    if (id > INT32_MAX) return NULL;
    int32_t piece = (int32_t)id;
    if (spiece->kind == SPIECE_XLM_ROBERTA) {
        if (piece == 0) return NULL; /* fairseq's <s> took SentencePiece's id 0 (its <unk>) */
        piece -= 1;
    }
    return sentencepiece_piece(spiece->model, piece, length);
}

/* ---- pieces to ids ----------------------------------------------------------------------------- */

/* The class's _convert_token_to_id_with_added_voc on a piece's string: a special token's id; else
 * SentencePiece's PieceToId (the piece's own id, save for unknown pieces, whose string is looked up);
 * XLM-R's shifted by fairseq's offset, its id 0 as <unk>. A bare model's encode gives the ids as they
 * are. `special`: the string is one of the special tokens. */
static int32_t piece_convert(spiece_t const *spiece, sentencepiece_pieces_t const *encoded, size_t index,
                             bool *special) {
    sentencepiece_piece_t const *piece = &encoded->pieces[index];
    char const *string = encoded->strings + piece->string;
    *special = false;
    if (spiece->kind == SPIECE_PLAIN) return piece->id;
    for (size_t t = 0; t < spiece->token_count; ++t)
        if (strlen(spiece->tokens[t].content) == piece->length &&
            memcmp(spiece->tokens[t].content, string, piece->length) == 0) {
            *special = true;
            return spiece->tokens[t].id;
        }
    int32_t id = piece->unknown ? sentencepiece_piece_id(spiece->model, string, piece->length) : piece->id;
    if (spiece->kind == SPIECE_XLM_ROBERTA) return id ? id + 1 : 3;
    return id;
}

/* The original span of SentencePiece's input bytes [begin, end): from the first byte's begin to the last
 * one's end. An empty piece (a byte piece before the last of its character) takes the whole span of the
 * code point it lies in: where preprocessing made two code points of one (SigLIP's İ, lowercased), an
 * empty span inside the original one would go back from the token before it. */
static piece_span_t input_span(spiece_input_t const *input, uint32_t begin, uint32_t end) {
    if (!input->spans) return (piece_span_t){input->base + begin, input->base + end};
    if (begin >= input->length) {
        uint32_t last = input->spans[input->length - 1].end;
        return (piece_span_t){last, last};
    }
    return end > begin ? (piece_span_t){input->spans[begin].begin, input->spans[end - 1].end}
                       : input->spans[begin];
}

/* Encodes one input and appends its tokens from piece `skip` on. */
static uform_status_t encode_append(spiece_t const *spiece, spiece_input_t const *input, size_t skip,
                                    spiece_work_t *scratch, tokens_t *out, char const **message) {
    sentencepiece_pieces_t *encoded = &scratch->encoded;
    uform_status_t status =
        status_of(sentencepiece_encode(spiece->model, input->bytes, input->length, encoded, message));
    if (encoded->count < skip) skip = 0; /* `tokens[unk_token_length:] if len(tokens) >= unk_token_length` */
    for (size_t i = skip; i < encoded->count && status == UFORM_OK; ++i) {
        bool special;
        int32_t id = piece_convert(spiece, encoded, i, &special);
        piece_span_t span = input_span(input, encoded->pieces[i].begin, encoded->pieces[i].end);
        status = tokens_push(out, (uint32_t)id, span, special);
    }
    return status;
}

/* ---- the classes' texts ------------------------------------------------------------------------ */

/* SiglipTokenizer.canonicalize_text on code points [begin, end) of `text`, then "<unk>" before it, into
 * the scratch's bytes: punctuation removed, each run of whitespace one " " (spanning the run), the ends
 * stripped. The "<unk>" covers nothing, at the stretch's first original byte. */
static uform_status_t siglip_canonical(pieces_t const *text, spiece_segment_t const *segment,
                                       spiece_work_t *scratch, spiece_input_t *input) {
    size_t prefix = strlen(unk_token);
    if (bytes_reserve(scratch, prefix + 4 * (size_t)(segment->end - segment->begin)) != UFORM_OK)
        return UFORM_OUT_OF_MEMORY;
    uint32_t at = text->spans[segment->begin].begin;
    memcpy(scratch->bytes, unk_token, prefix);
    for (size_t i = 0; i < prefix; ++i)
        scratch->spans[i] = (piece_span_t){at, at};
    size_t length = prefix;
    bool pending = false; /* a run of whitespace seen after some text */
    piece_span_t run = {0, 0};
    for (uint32_t i = segment->begin; i < segment->end; ++i) {
        uint32_t ch = text->chars[i];
        if (python_punctuation(ch)) continue;
        if (python_space(ch)) {
            if (length > prefix && !pending) run.begin = text->spans[i].begin;
            pending = length > prefix;
            run.end = text->spans[i].end;
            continue;
        }
        if (pending) {
            scratch->bytes[length] = ' ';
            scratch->spans[length++] = run;
            pending = false;
        }
        size_t size = utf8_put((uint8_t *)scratch->bytes + length, ch);
        for (size_t b = 0; b < size; ++b)
            scratch->spans[length + b] = text->spans[i];
        length += size;
    }
    *input = (spiece_input_t){scratch->bytes, length, scratch->spans, 0};
    return UFORM_OK;
}

/* Python's str.lower, one code point at a time (as the do_lower_case substitution calls it): Unicode's
 * simple lowercase mapping, and İ (U+0130) to i and U+0307, its one unconditional full mapping. */
static uform_status_t lower_push(pieces_t *out, uint32_t ch, piece_span_t span) {
    if (ch == 0x130) {
        uform_status_t status = pieces_push(out, 'i', span);
        return status == UFORM_OK ? pieces_push(out, 0x307, span) : status;
    }
    return pieces_push(out, (uint32_t)utf8proc_tolower((utf8proc_int32_t)ch), span);
}

/* SiglipTokenizer.tokenize's text before the split: "▁" + text with every "▁" as " ", lowercased. */
static uform_status_t siglip_text(spiece_t const *spiece, pieces_t const *in, pieces_t *out) {
    uform_status_t status = pieces_begin(out, 0, PIECE_OPEN);
    if (status == UFORM_OK) status = pieces_push(out, SPACE_SYMBOL, (piece_span_t){0, 0});
    for (size_t i = 0; i < in->length && status == UFORM_OK; ++i) {
        uint32_t ch = in->chars[i] == SPACE_SYMBOL ? ' ' : in->chars[i];
        status = spiece->lower ? lower_push(out, ch, in->spans[i]) : pieces_push(out, ch, in->spans[i]);
    }
    if (status == UFORM_OK) pieces_end(out);
    return status;
}

/* Whether piece `skip`, the text's first token, is "▁" (SiglipTokenizer.tokenize drops it before a
 * special token). */
static bool first_is_space(sentencepiece_pieces_t const *encoded, size_t skip) {
    if (encoded->count <= skip) return false;
    sentencepiece_piece_t const *piece = &encoded->pieces[skip];
    return piece->length == 3 && memcmp(encoded->strings + piece->string, "\xE2\x96\x81", 3) == 0;
}

/* The tokens of every segment: special tokens as they are, each stretch of text encoded. */
static uform_status_t segments_cut(spiece_t const *spiece, pieces_t const *text, uint8_t const *original,
                                   spiece_work_t *scratch, tokens_t *out, bool *space_first,
                                   char const **message) {
    uform_status_t status = UFORM_OK;
    *space_first = false;
    for (size_t s = 0; s < scratch->segments_count && status == UFORM_OK; ++s) {
        spiece_segment_t const *segment = &scratch->segments[s];
        if (segment->token >= 0) {
            piece_span_t span = {text->spans[segment->cover_begin].begin,
                                 text->spans[segment->cover_end - 1].end};
            status = tokens_push(out, (uint32_t)spiece->tokens[segment->token].id, span, true);
            continue;
        }
        if (segment->begin == segment->end) continue;
        spiece_input_t input;
        size_t skip = 0, first = out->count;
        if (spiece->kind == SPIECE_SIGLIP) {
            status = siglip_canonical(text, segment, scratch, &input);
            skip = spiece->unk_pieces;
        } else {
            uint32_t begin = text->spans[segment->begin].begin, end = text->spans[segment->end - 1].end;
            input = (spiece_input_t){(char const *)original + begin, end - begin, NULL, begin};
        }
        if (status == UFORM_OK) status = encode_append(spiece, &input, skip, scratch, out, message);
        if (status == UFORM_OK && first == 0 && out->count > 0)
            *space_first = first_is_space(&scratch->encoded, scratch->encoded.count < skip ? 0 : skip);
    }
    return status;
}

/* Drops token 0 (SiglipTokenizer.tokenize's "▁" before a special token). */
static void drop_first(tokens_t *out) {
    out->count--;
    memmove(out->ids, out->ids + 1, out->count * sizeof *out->ids);
    memmove(out->spans, out->spans + 1, out->count * sizeof *out->spans);
    memmove(out->special, out->special + 1, out->count * sizeof *out->special);
}

/* XLM-R and SigLIP: the text split around the special tokens, each stretch cut, the special tokens the
 * class adds around it. */
static uform_status_t class_cut(spiece_t const *spiece, uint8_t const *text, pieces_t *decoded,
                                pieces_t *rewritten, spiece_work_t *scratch, bool add_special, tokens_t *out,
                                char const **message) {
    pieces_t *chars = decoded;
    uform_status_t status = UFORM_OK;
    if (spiece->kind == SPIECE_SIGLIP) {
        status = siglip_text(spiece, decoded, rewritten);
        chars = rewritten;
    }
    if (status == UFORM_OK) status = split(spiece, chars->chars, chars->length, scratch);
    if (status != UFORM_OK) return status;
    strip(spiece, chars->chars, scratch);
    if (add_special && spiece->bos >= 0)
        status = tokens_push(out, (uint32_t)spiece->bos, (piece_span_t){0, 0}, true);
    bool space_first = false;
    if (status == UFORM_OK) status = segments_cut(spiece, chars, text, scratch, out, &space_first, message);
    if (status != UFORM_OK) return status;
    if (spiece->kind == SPIECE_SIGLIP && space_first && out->count > 1 && out->special[1]) drop_first(out);
    /* SigLIP's _add_eos_if_not_present: no second </s> after one the text ends with. */
    bool ends_with_eos =
        spiece->kind == SPIECE_SIGLIP && out->count > 0 && out->ids[out->count - 1] == (uint32_t)spiece->eos;
    if (add_special && spiece->eos >= 0 && !ends_with_eos)
        status = tokens_push(out, (uint32_t)spiece->eos, (piece_span_t){0, 0}, true);
    return status;
}

uform_status_t spiece_cut(spiece_t const *spiece, uint8_t const *text, size_t length, bool add_special,
                          tokenizer_work_t *work, tokens_t *out, char const **message) {
    out->count = 0;
    *message = NULL;
    spiece_work_t *scratch = work_of(work);
    pieces_t *decoded = work_take(work), *rewritten = work_take(work);
    if (!scratch || !decoded || !rewritten) {
        if (decoded) work_give(work);
        if (rewritten) work_give(work);
        return scratch ? UFORM_INTERNAL : UFORM_OUT_OF_MEMORY;
    }
    size_t bad = 0;
    uform_status_t status = pieces_from_utf8(decoded, text, length, &bad);
    if (status == UFORM_FORMAT)
        *message = length > UINT32_MAX ? "text longer than 4 GiB" : "text is not valid UTF-8";
    if (status == UFORM_OK && spiece->kind == SPIECE_PLAIN) {
        spiece_input_t input = {(char const *)text, length, NULL, 0};
        status = encode_append(spiece, &input, 0, scratch, out, message);
    } else if (status == UFORM_OK) {
        status = class_cut(spiece, text, decoded, rewritten, scratch, add_special, out, message);
    }
    work_give(work);
    work_give(work);
    return status;
}
