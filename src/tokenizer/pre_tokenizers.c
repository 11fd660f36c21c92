/* Pre-tokenizers: each open piece cut into the pieces the model will cut, as Hugging Face's tokenizers
 * 0.19.1 cuts them (its pre_tokenizers folder), spans kept; ByteLevel and Metaspace rewrite theirs too.
 *
 *   BertPreTokenizer  whitespace removed, punctuation alone
 *   Whitespace        runs of \w, runs of [^\w\s] (the regex crate's classes), whitespace removed
 *   WhitespaceSplit   whitespace removed
 *   Punctuation       punctuation split off by a behavior (Removed, Isolated, MergedWithPrevious,
 *                     MergedWithNext, Contiguous: tokenizers' SplitDelimiterBehavior)
 *   Digits            numeric code points alone, or in runs
 *   Split             an Oniguruma pattern's matches (or the runs between them) split off by a behavior
 *   ByteLevel         a space prepended, GPT-2's pattern, each UTF-8 byte as one of GPT-2's characters
 *   Metaspace         ' ' replaced, the replacement prepended, cut before each replacement
 *   Sequence          each in turn (nested sequences flattened when read)
 *
 * A cut piece is a slice of its source: its code points keep their spans and it begins at the first
 * one's span (pieces_emit_range). Behaviors fold segments (runs and matches, end to end) as
 * NormalizedString::split folds them, one split held back while the next segment may still join it.
 *
 * Unicode: each class comes from the library whose tables match what tokenizers asks.
 *   - Rust's char::is_whitespace (White_Space) and char::is_numeric (Nd, Nl, No), and the
 *     unicode_categories crate's is_punctuation (Pc Pd Ps Pe Pi Pf Po), from utf8proc's categories
 *     (Unicode 15.0; Rust's std has 15.x, with the same sets for these). unicode_categories 0.1.1
 *     still has Unicode 8.0's tables: the 127 code points that became punctuation later (U+061D,
 *     U+2E43..U+2E5D, and in recent scripts: Newa, Adlam, Tangut, Kawi...) are punctuation here and not
 *     there, and U+166D and U+111C9, punctuation in 8.0 and no longer in 15.0, are punctuation there only.
 *   - Oniguruma's \p{L}, \p{N} and \s for GPT-2's pattern, from Oniguruma itself (6.9.8, Unicode 14.0:
 *     the very tables tokenizers' bundled Oniguruma 6.9.8 has).
 *   - The regex crate's \w (Alphabetic, M, Nd, Pc, Join_Control; regex-syntax 0.8 has Unicode 15.0):
 *     utf8proc's L, Nl, M, Nd, Pc, with Oniguruma's Alphabetic and Join_Control for the letters that
 *     are symbols by category (circled and squared Latin letters) and for U+200C, U+200D; a property
 *     that Unicode 15.0 gave a code point Oniguruma's 14.0 does not know is the one gap left. */
#include <oniguruma.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "regex.h"

typedef enum pre_tokenizer_kind {
    PRE_BERT,
    PRE_WHITESPACE,
    PRE_WHITESPACE_SPLIT,
    PRE_PUNCTUATION,
    PRE_DIGITS,
    PRE_SPLIT,
    PRE_BYTE_LEVEL,
    PRE_METASPACE,
    PRE_SEQUENCE,
} pre_tokenizer_kind_t;

typedef enum split_behavior {
    SPLIT_REMOVED,
    SPLIT_ISOLATED,
    SPLIT_MERGED_WITH_PREVIOUS,
    SPLIT_MERGED_WITH_NEXT,
    SPLIT_CONTIGUOUS,
} split_behavior_t;

typedef enum prepend_scheme {
    PREPEND_ALWAYS,
    PREPEND_FIRST, /* only to the piece that begins the text (original byte 0) */
    PREPEND_NEVER,
} prepend_scheme_t;

struct pre_tokenizer {
    pre_tokenizer_kind_t kind;
    split_behavior_t behavior; /* Punctuation, Digits, Split */
    bool invert;               /* Split: the runs between matches are the delimiters */
    tokenizer_regex_t *regex;  /* Split */
    bool add_prefix_space;     /* ByteLevel */
    bool use_regex;            /* ByteLevel */
    uint32_t replacement;      /* Metaspace */
    prepend_scheme_t prepend;  /* Metaspace */
    bool split;                /* Metaspace */
    pre_tokenizer_t **steps;   /* Sequence: none of them a Sequence */
    size_t step_count;
};

/* ---- character classes ------------------------------------------------------------------------ */

enum {
    CLASS_WHITESPACE = 1u << 0,  /* char::is_whitespace, and the regex crate's \s */
    CLASS_PUNCTUATION = 1u << 1, /* tokenizers' is_punc and is_bert_punc */
    CLASS_NUMERIC = 1u << 2,     /* char::is_numeric */
    CLASS_WORD = 1u << 3,        /* the regex crate's \w */
    CLASS_LETTER = 1u << 4,      /* Oniguruma's \p{L} */
    CLASS_NUMBER = 1u << 5,      /* Oniguruma's \p{N} */
    CLASS_SPACE = 1u << 6,       /* Oniguruma's \s */
};

/* The code points below this have their classes in a table (the BMP and the SMP, emoji among them);
 * the others ask the libraries each time. */
#define TABLED_END 0x20000u

/* Read-only once made (pthread_once): the classes of the tabled code points, Oniguruma's property
 * numbers, and GPT-2's characters for the bytes. */
static struct {
    pthread_once_t once;
    uform_status_t status;
    OnigCtype letter, number, alphabetic, join_control;
    uint16_t byte_chars[256];
    uint8_t classes[TABLED_END];
} tables = {.once = PTHREAD_ONCE_INIT, .status = UFORM_INTERNAL};

static bool onig_is(uint32_t ch, OnigCtype ctype) {
    return ONIGENC_IS_CODE_CTYPE(ONIG_ENCODING_UTF8, ch, ctype) > 0;
}

/* The classes that come from utf8proc's categories, \w only partly (onig_classes adds the rest). */
static unsigned category_classes(uint32_t ch) {
    utf8proc_category_t category = utf8proc_category((utf8proc_int32_t)ch);
    bool ascii_punctuation = (ch >= 0x21 && ch <= 0x2F) || (ch >= 0x3A && ch <= 0x40) ||
                             (ch >= 0x5B && ch <= 0x60) || (ch >= 0x7B && ch <= 0x7E);
    unsigned classes = 0;
    if (category == UTF8PROC_CATEGORY_ZS || category == UTF8PROC_CATEGORY_ZL ||
        category == UTF8PROC_CATEGORY_ZP || (ch >= 0x09 && ch <= 0x0D) || ch == 0x85)
        classes |= CLASS_WHITESPACE;
    if (ascii_punctuation || (category >= UTF8PROC_CATEGORY_PC && category <= UTF8PROC_CATEGORY_PO))
        classes |= CLASS_PUNCTUATION;
    if (category >= UTF8PROC_CATEGORY_ND && category <= UTF8PROC_CATEGORY_NO) classes |= CLASS_NUMERIC;
    if ((category >= UTF8PROC_CATEGORY_LU && category <= UTF8PROC_CATEGORY_NL) ||
        category == UTF8PROC_CATEGORY_PC)
        classes |= CLASS_WORD;
    return classes;
}

/* The classes that come from Oniguruma's properties, among `wanted`. */
static unsigned onig_classes(uint32_t ch, unsigned wanted) {
    unsigned classes = 0;
    if (wanted & CLASS_WORD && (onig_is(ch, tables.alphabetic) || onig_is(ch, tables.join_control)))
        classes |= CLASS_WORD;
    if (wanted & CLASS_LETTER && onig_is(ch, tables.letter)) classes |= CLASS_LETTER;
    if (wanted & CLASS_NUMBER && onig_is(ch, tables.number)) classes |= CLASS_NUMBER;
    if (wanted & CLASS_SPACE && onig_is(ch, ONIGENC_CTYPE_SPACE)) classes |= CLASS_SPACE;
    return classes;
}

/* The classes among `wanted` that `ch` has. */
static inline unsigned classes_of(uint32_t ch, unsigned wanted) {
    if (ch < TABLED_END) return tables.classes[ch] & wanted;
    unsigned classes = category_classes(ch) & wanted;
    return classes | onig_classes(ch, wanted & ~classes);
}

static bool onig_property(char const *name, OnigCtype *ctype) {
    OnigUChar buffer[32];
    size_t length = strlen(name);
    memcpy(buffer, name, length);
    int found = ONIGENC_PROPERTY_NAME_TO_CTYPE(ONIG_ENCODING_UTF8, buffer, buffer + length);
    *ctype = (OnigCtype)found;
    return found >= 0;
}

/* Sets `class` on the tabled code points of an Oniguruma property, from its list of ranges (Latin-1's
 * code points one by one: Oniguruma answers them from a table of its own). */
static bool table_property(OnigCtype ctype, unsigned class) {
    OnigCodePoint single_bytes;
    OnigCodePoint const *ranges;
    if (ONIGENC_GET_CTYPE_CODE_RANGE(ONIG_ENCODING_UTF8, ctype, &single_bytes, &ranges) != 0) return false;
    for (uint32_t ch = 0; ch < 0x100; ++ch)
        if (onig_is(ch, ctype)) tables.classes[ch] |= (uint8_t) class;
    for (OnigCodePoint i = 0; i < ranges[0]; ++i) {
        uint32_t from = ranges[1 + 2 * i], to = ranges[2 + 2 * i];
        for (uint32_t ch = from < 0x100 ? 0x100 : from; ch <= to && ch < TABLED_END; ++ch)
            tables.classes[ch] |= (uint8_t) class;
    }
    return true;
}

/* GPT-2's bytes_to_unicode: the printable bytes stand for themselves, the others, in order, for the
 * code points from U+0100 on. */
static void make_byte_chars(void) {
    uint16_t next = 0x100;
    for (unsigned byte = 0; byte < 256; ++byte) {
        bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || byte >= 0xAE;
        tables.byte_chars[byte] = printable ? (uint16_t)byte : next++;
    }
}

static void make_tables(void) {
    if (tokenizer_onig_init() != UFORM_OK) return;
    if (!onig_property("L", &tables.letter) || !onig_property("N", &tables.number) ||
        !onig_property("Alphabetic", &tables.alphabetic) ||
        !onig_property("Join_Control", &tables.join_control))
        return;
    for (uint32_t ch = 0; ch < TABLED_END; ++ch)
        tables.classes[ch] = (uint8_t)category_classes(ch);
    if (!table_property(tables.alphabetic, CLASS_WORD) || !table_property(tables.join_control, CLASS_WORD) ||
        !table_property(tables.letter, CLASS_LETTER) || !table_property(tables.number, CLASS_NUMBER) ||
        !table_property(ONIGENC_CTYPE_SPACE, CLASS_SPACE))
        return;
    make_byte_chars();
    tables.status = UFORM_OK;
}

static uform_status_t tables_ready(void) {
    if (pthread_once(&tables.once, make_tables) != 0) return UFORM_INTERNAL;
    return tables.status;
}

/* ---- splitting by behavior -------------------------------------------------------------------- */

/* NormalizedString::split's fold, one segment at a time: the split made last is held back while the
 * next segment may still join it. */
typedef struct splitter {
    pieces_t *out;
    pieces_t const *in;
    size_t index;
    split_behavior_t behavior;
    uint32_t begin, end; /* the split held back */
    bool held;
    bool previous_match;
} splitter_t;

static uform_status_t splitter_flush(splitter_t *splitter) {
    if (!splitter->held) return UFORM_OK;
    splitter->held = false;
    return pieces_emit_range(splitter->out, splitter->in, splitter->index, splitter->begin, splitter->end);
}

/* Whether a segment joins the split held back: Contiguous joins like to like; MergedWithPrevious
 * a match to the run before it; MergedWithNext (tokenizers folds it from the end) a run to the
 * match before it, which stands alone since a match never joins anything under it. */
static bool splitter_joins(splitter_t const *splitter, bool is_match) {
    if (!splitter->held) return false;
    switch (splitter->behavior) {
    case SPLIT_CONTIGUOUS:
        return is_match == splitter->previous_match;
    case SPLIT_MERGED_WITH_PREVIOUS:
        return is_match && !splitter->previous_match;
    case SPLIT_MERGED_WITH_NEXT:
        return !is_match && splitter->previous_match;
    default:
        return false;
    }
}

static uform_status_t splitter_push(splitter_t *splitter, uint32_t begin, uint32_t end, bool is_match) {
    if (splitter->behavior == SPLIT_REMOVED && is_match) return UFORM_OK;
    bool joins = splitter_joins(splitter, is_match);
    splitter->previous_match = is_match;
    if (joins) {
        splitter->end = end;
        return UFORM_OK;
    }
    uform_status_t status = splitter_flush(splitter);
    splitter->begin = begin;
    splitter->end = end;
    splitter->held = true;
    return status;
}

/* Every code point of a class a match of its own, the runs between them not: tokenizers' patterns
 * of a char predicate. */
static uform_status_t split_class_by(splitter_t *splitter, unsigned wanted) {
    uint32_t const *chars = pieces_chars(splitter->in, splitter->index);
    uint32_t size = pieces_size(splitter->in, splitter->index), run = 0;
    uform_status_t status = UFORM_OK;
    for (uint32_t i = 0; i < size && status == UFORM_OK; ++i) {
        if (!classes_of(chars[i], wanted)) continue;
        if (run < i) status = splitter_push(splitter, run, i, false);
        if (status == UFORM_OK) status = splitter_push(splitter, i, i + 1, true);
        run = i + 1;
    }
    if (status == UFORM_OK && run < size) status = splitter_push(splitter, run, size, false);
    return status == UFORM_OK ? splitter_flush(splitter) : status;
}

static uform_status_t split_regex(pre_tokenizer_t const *pre_tokenizer, splitter_t *splitter,
                                  tokenizer_work_t *work) {
    tokenizer_regex_segments_t segments;
    uform_status_t status = tokenizer_regex_segments_begin(&segments, pre_tokenizer->regex,
                                                           pieces_chars(splitter->in, splitter->index),
                                                           pieces_size(splitter->in, splitter->index), work);
    for (bool more = true; status == UFORM_OK;) {
        tokenizer_regex_segment_t segment;
        status = tokenizer_regex_segments_next(&segments, &segment, &more);
        if (status != UFORM_OK || !more) break;
        status =
            splitter_push(splitter, segment.begin, segment.end, segment.is_match != pre_tokenizer->invert);
    }
    return status == UFORM_OK ? splitter_flush(splitter) : status;
}

/* ---- splits of a fixed shape ------------------------------------------------------------------- */

/* Code points of `drop` removed, those of `alone` each a piece, the runs between them pieces:
 * BertPreTokenizer (whitespace, then punctuation) and WhitespaceSplit in one pass. */
static uform_status_t split_drop_alone(pieces_t const *in, size_t index, pieces_t *out, unsigned drop,
                                       unsigned alone) {
    uint32_t const *chars = pieces_chars(in, index);
    uint32_t size = pieces_size(in, index), run = 0;
    uform_status_t status = UFORM_OK;
    for (uint32_t i = 0; i < size && status == UFORM_OK; ++i) {
        unsigned classes = classes_of(chars[i], drop | alone);
        if (!classes) continue;
        if (run < i) status = pieces_emit_range(out, in, index, run, i);
        if (status == UFORM_OK && !(classes & drop)) status = pieces_emit_range(out, in, index, i, i + 1);
        run = i + 1;
    }
    if (status == UFORM_OK && run < size) status = pieces_emit_range(out, in, index, run, size);
    return status;
}

/* Whitespace's \w+|[^\w\s]+, the matches kept: runs of word code points and runs of the others,
 * whitespace removed. */
static uform_status_t split_words(pieces_t const *in, size_t index, pieces_t *out) {
    enum { SPACE, WORD, OTHER };
    uint32_t const *chars = pieces_chars(in, index);
    uint32_t size = pieces_size(in, index), run = 0;
    int run_kind = SPACE;
    uform_status_t status = UFORM_OK;
    for (uint32_t i = 0; i <= size && status == UFORM_OK; ++i) {
        int kind = SPACE;
        if (i < size) {
            unsigned classes = classes_of(chars[i], CLASS_WORD | CLASS_WHITESPACE);
            kind = classes & CLASS_WORD ? WORD : classes & CLASS_WHITESPACE ? SPACE : OTHER;
        }
        if (kind == run_kind && i < size) continue;
        if (run_kind != SPACE) status = pieces_emit_range(out, in, index, run, i);
        run = i;
        run_kind = kind;
    }
    return status;
}

/* ---- ByteLevel --------------------------------------------------------------------------------- */

enum { GPT2_OTHER, GPT2_LETTER, GPT2_NUMBER, GPT2_SPACE };

static int gpt2_kind(uint32_t ch) {
    unsigned classes = classes_of(ch, CLASS_LETTER | CLASS_NUMBER | CLASS_SPACE);
    return classes & CLASS_LETTER   ? GPT2_LETTER
           : classes & CLASS_NUMBER ? GPT2_NUMBER
           : classes & CLASS_SPACE  ? GPT2_SPACE
                                    : GPT2_OTHER;
}

static uint32_t gpt2_run(uint32_t const *text, uint32_t size, uint32_t at, int kind) {
    while (at < size && gpt2_kind(text[at]) == kind)
        at++;
    return at;
}

/* The contraction 's 't 'm 'd 're 've 'll at text[at] (an apostrophe): its end, or 0. */
static uint32_t gpt2_contraction(uint32_t const *text, uint32_t size, uint32_t at) {
    if (at + 1 >= size) return 0;
    uint32_t next = text[at + 1];
    if (next == 's' || next == 't' || next == 'm' || next == 'd') return at + 2;
    if (at + 2 >= size) return 0;
    uint32_t last = text[at + 2];
    bool pair = (next == 'r' && last == 'e') || (next == 'v' && last == 'e') || (next == 'l' && last == 'l');
    return pair ? at + 3 : 0;
}

/* The end of the match of GPT-2's pattern that begins at `at`:
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * Every code point is a letter, a number, a space or none of them, so a match begins wherever the
 * last ended and the matches cover the text. */
static uint32_t gpt2_match_end(uint32_t const *text, uint32_t size, uint32_t at) {
    uint32_t ch = text[at];
    if (ch == '\'') {
        uint32_t end = gpt2_contraction(text, size, at);
        if (end) return end;
    }
    if (ch == ' ' && at + 1 < size) {
        int next = gpt2_kind(text[at + 1]);
        if (next != GPT2_SPACE) return gpt2_run(text, size, at + 1, next);
    }
    int kind = gpt2_kind(ch);
    uint32_t end = gpt2_run(text, size, at, kind);
    /* \s+(?!\S) leaves the last space of a run that a non-space follows to the next match; a run of
     * one is \s+ whole. */
    if (kind == GPT2_SPACE && end < size && end - at > 1) end--;
    return end;
}

/* Code points text[begin, end) as GPT-2's byte characters, a new piece of `out`; each code point's
 * bytes take its span (tokenizers' transform: the first replaces it, the others are inserted after
 * it). With `prefixed`, text[0] is the prepended space, which has the span of the piece's first. */
static uform_status_t byte_level_emit(pieces_t *out, uint32_t const *text, piece_span_t const *spans,
                                      bool prefixed, uint32_t begin, uint32_t end, uint32_t shift,
                                      int32_t id) {
    uform_status_t status = pieces_begin(out, shift, id);
    for (uint32_t i = begin; i < end && status == UFORM_OK; ++i) {
        piece_span_t span = spans[prefixed && i > 0 ? i - 1 : i];
        uint8_t bytes[4];
        size_t count = text[i] < 0x80 ? (bytes[0] = (uint8_t)text[i], 1) : utf8_put(bytes, text[i]);
        for (size_t k = 0; k < count && status == UFORM_OK; ++k)
            status = pieces_push(out, tables.byte_chars[bytes[k]], span);
    }
    if (status == UFORM_OK) pieces_end(out);
    return status;
}

static uform_status_t byte_level_piece(pre_tokenizer_t const *pre_tokenizer, pieces_t const *in, size_t index,
                                       pieces_t *out, tokenizer_work_t *work) {
    uint32_t const *chars = pieces_chars(in, index);
    piece_span_t const *spans = pieces_spans(in, index);
    uint32_t size = pieces_size(in, index);
    int32_t id = in->ids[index];
    bool prefixed = pre_tokenizer->add_prefix_space && size && chars[0] != ' ';
    uint32_t const *text = chars;
    if (prefixed) {
        uint32_t *copy = (uint32_t *)work_bytes(work, ((size_t)size + 1) * sizeof *copy);
        if (!copy) return UFORM_OUT_OF_MEMORY;
        copy[0] = ' ';
        memcpy(copy + 1, chars, (size_t)size * sizeof *copy);
        text = copy;
    }
    uint32_t length = size + prefixed;
    if (!pre_tokenizer->use_regex)
        return byte_level_emit(out, text, spans, prefixed, 0, length, in->shifts[index], id);
    uform_status_t status = UFORM_OK;
    for (uint32_t at = 0, end; at < length && status == UFORM_OK; at = end) {
        end = gpt2_match_end(text, length, at);
        status = byte_level_emit(out, text, spans, prefixed, at, end,
                                 spans[prefixed && at ? at - 1 : at].begin, id);
    }
    return status;
}

/* ---- Metaspace --------------------------------------------------------------------------------- */

/* ' ' replaced (each replacement takes the space's span), the replacement prepended per the scheme
 * (with the first code point's span, as NormalizedString::prepend gives), and with `split` a cut
 * before every replacement (MergedWithNext on a one-character pattern). */
static uform_status_t metaspace_piece(pre_tokenizer_t const *pre_tokenizer, pieces_t const *in, size_t index,
                                      pieces_t *out) {
    uint32_t const *chars = pieces_chars(in, index);
    piece_span_t const *spans = pieces_spans(in, index);
    uint32_t size = pieces_size(in, index), replacement = pre_tokenizer->replacement;
    int32_t id = in->ids[index];
    if (!size) return UFORM_OK;
    bool starts = chars[0] == ' ' || chars[0] == replacement;
    bool prepend = !starts && (pre_tokenizer->prepend == PREPEND_ALWAYS ||
                               (pre_tokenizer->prepend == PREPEND_FIRST && in->shifts[index] == 0));
    uform_status_t status = pieces_begin(out, pre_tokenizer->split ? spans[0].begin : in->shifts[index], id);
    bool begun = prepend;
    if (prepend && status == UFORM_OK) status = pieces_push(out, replacement, spans[0]);
    for (uint32_t i = 0; i < size && status == UFORM_OK; ++i) {
        uint32_t ch = chars[i] == ' ' ? replacement : chars[i];
        if (pre_tokenizer->split && ch == replacement && begun) {
            pieces_end(out);
            status = pieces_begin(out, spans[i].begin, id);
        }
        if (status == UFORM_OK) status = pieces_push(out, ch, spans[i]);
        begun = true;
    }
    if (status == UFORM_OK) pieces_end(out);
    return status;
}

/* ---- applying ---------------------------------------------------------------------------------- */

static uform_status_t split_piece(pre_tokenizer_t const *pre_tokenizer, pieces_t const *in, size_t index,
                                  pieces_t *out, tokenizer_work_t *work) {
    splitter_t splitter = {.out = out, .in = in, .index = index, .behavior = pre_tokenizer->behavior};
    switch (pre_tokenizer->kind) {
    case PRE_BERT:
        return split_drop_alone(in, index, out, CLASS_WHITESPACE, CLASS_PUNCTUATION);
    case PRE_WHITESPACE:
        return split_words(in, index, out);
    case PRE_WHITESPACE_SPLIT:
        return split_drop_alone(in, index, out, CLASS_WHITESPACE, 0);
    case PRE_PUNCTUATION:
        return split_class_by(&splitter, CLASS_PUNCTUATION);
    case PRE_DIGITS:
        return split_class_by(&splitter, CLASS_NUMERIC);
    case PRE_SPLIT:
        return split_regex(pre_tokenizer, &splitter, work);
    case PRE_BYTE_LEVEL:
        return byte_level_piece(pre_tokenizer, in, index, out, work);
    case PRE_METASPACE:
        return metaspace_piece(pre_tokenizer, in, index, out);
    default:
        return UFORM_INTERNAL; /* a Sequence is applied whole */
    }
}

/* One pre-tokenizer that is not a Sequence over every piece; added tokens pass through. */
static uform_status_t apply_step(pre_tokenizer_t const *pre_tokenizer, pieces_t const *in, pieces_t *out,
                                 tokenizer_work_t *work) {
    uform_status_t status = UFORM_OK;
    for (size_t i = 0; i < in->count && status == UFORM_OK; ++i)
        status =
            in->ids[i] == PIECE_OPEN ? split_piece(pre_tokenizer, in, i, out, work) : pieces_copy(out, in, i);
    return status;
}

static uform_status_t copy_all(pieces_t const *in, pieces_t *out) {
    uform_status_t status = UFORM_OK;
    for (size_t i = 0; i < in->count && status == UFORM_OK; ++i)
        status = pieces_copy(out, in, i);
    return status;
}

/* The steps in turn, between two of the work's lists, the last into `out`. */
static uform_status_t apply_sequence(pre_tokenizer_t const *sequence, pieces_t const *in, pieces_t *out,
                                     tokenizer_work_t *work) {
    size_t count = sequence->step_count;
    if (count == 0) return copy_all(in, out);
    if (count == 1) return apply_step(sequence->steps[0], in, out, work);
    pieces_t *temps[2] = {work_take(work), NULL};
    if (temps[0]) temps[1] = work_take(work);
    uform_status_t status = temps[1] ? UFORM_OK : UFORM_INTERNAL;
    pieces_t const *from = in;
    for (size_t k = 0; k < count && status == UFORM_OK; ++k) {
        pieces_t *to = k + 1 == count ? out : temps[k % 2];
        if (to != out) pieces_clear(to);
        status = apply_step(sequence->steps[k], from, to, work);
        from = to;
    }
    if (temps[1]) work_give(work);
    if (temps[0]) work_give(work);
    return status;
}

uform_status_t pre_tokenizer_apply(pre_tokenizer_t const *pre_tokenizer, pieces_t const *in, pieces_t *out,
                                   tokenizer_work_t *work) {
    if (pre_tokenizer->kind == PRE_SEQUENCE) return apply_sequence(pre_tokenizer, in, out, work);
    return apply_step(pre_tokenizer, in, out, work);
}

/* ---- reading tokenizer.json -------------------------------------------------------------------- */

/* serde_json's own limit on nesting. */
#define MAX_DEPTH 128

static uform_status_t parse_node(json_t const *object, size_t depth, pre_tokenizer_t **made,
                                 tokenizer_fault_t *fault);

void pre_tokenizer_free(pre_tokenizer_t *pre_tokenizer) {
    if (!pre_tokenizer) return;
    for (size_t i = 0; i < pre_tokenizer->step_count; ++i)
        pre_tokenizer_free(pre_tokenizer->steps[i]);
    free(pre_tokenizer->steps);
    tokenizer_regex_free(pre_tokenizer->regex);
    free(pre_tokenizer);
}

/* A member serde requires (no default): present and not null. */
static json_t const *required(json_t const *object, char const *key) {
    json_t const *value = json_object_get(object, key);
    return value && !json_is_null(value) ? value : NULL;
}

/* serde takes null for an Option alone: a member with a default is absent or of its type. */
static uform_status_t reject_null(json_t const *object, char const *key, char const *what,
                                  tokenizer_fault_t *fault) {
    json_t const *value = json_object_get(object, key);
    if (value && json_is_null(value))
        return tokenizer_fail(fault, UFORM_FORMAT, "%s: \"%s\" is null", what, key);
    return UFORM_OK;
}

static uform_status_t read_required_bool(json_t const *object, char const *key, bool *value, char const *what,
                                         tokenizer_fault_t *fault) {
    if (!required(object, key))
        return tokenizer_fail(fault, UFORM_FORMAT, "%s: \"%s\" is missing", what, key);
    return json_get_bool(object, key, false, value, what, fault);
}

/* A SplitDelimiterBehavior by its serde name; `fallback` where absent, or required when negative. */
static uform_status_t read_behavior(json_t const *object, int fallback, split_behavior_t *behavior,
                                    char const *what, tokenizer_fault_t *fault) {
    static char const *const names[] = {
        [SPLIT_REMOVED] = "Removed",
        [SPLIT_ISOLATED] = "Isolated",
        [SPLIT_MERGED_WITH_PREVIOUS] = "MergedWithPrevious",
        [SPLIT_MERGED_WITH_NEXT] = "MergedWithNext",
        [SPLIT_CONTIGUOUS] = "Contiguous",
    };
    char const *name;
    uform_status_t status = reject_null(object, "behavior", what, fault);
    if (status == UFORM_OK) status = json_get_string(object, "behavior", NULL, &name, NULL, what, fault);
    if (status != UFORM_OK) return status;
    if (!name && fallback < 0)
        return tokenizer_fail(fault, UFORM_FORMAT, "%s: \"behavior\" is missing", what);
    if (!name) {
        *behavior = (split_behavior_t)fallback;
        return UFORM_OK;
    }
    for (size_t i = 0; i < sizeof names / sizeof *names; ++i) {
        if (strcmp(name, names[i]) != 0) continue;
        *behavior = (split_behavior_t)i;
        return UFORM_OK;
    }
    return tokenizer_fail(fault, UFORM_FORMAT, "%s: unknown behavior \"%s\"", what, name);
}

/* A char of serde's: a string of exactly one code point. */
static uform_status_t read_char(json_t const *object, char const *key, uint32_t *ch, char const *what,
                                tokenizer_fault_t *fault) {
    char const *string;
    size_t length;
    uform_status_t status = json_get_string(object, key, NULL, &string, &length, what, fault);
    if (status != UFORM_OK) return status;
    if (!string) return tokenizer_fail(fault, UFORM_FORMAT, "%s: \"%s\" is missing", what, key);
    utf8proc_int32_t value = -1;
    utf8proc_ssize_t used =
        utf8proc_iterate((utf8proc_uint8_t const *)string, (utf8proc_ssize_t)length, &value);
    if (length == 0 || used != (utf8proc_ssize_t)length)
        return tokenizer_fail(fault, UFORM_FORMAT, "%s: \"%s\" is not one character", what, key);
    *ch = (uint32_t)value;
    return UFORM_OK;
}

/* Split's pattern: {"String": "..."} (matched as it is) or {"Regex": "..."}, serde's externally tagged
 * enum. */
static uform_status_t parse_split(json_t const *object, pre_tokenizer_t *split, tokenizer_fault_t *fault) {
    char const *what = "pre-tokenizer Split";
    json_t const *pattern = required(object, "pattern");
    if (!json_is_object(pattern) || json_object_size(pattern) != 1)
        return tokenizer_fail(fault, UFORM_FORMAT,
                              "%s: \"pattern\" is not {\"String\": ...} or {\"Regex\": ...}", what);
    char const *key = json_object_iter_key(json_object_iter((json_t *)pattern));
    json_t const *value = json_object_iter_value(json_object_iter((json_t *)pattern));
    bool literal = strcmp(key, "String") == 0;
    if ((!literal && strcmp(key, "Regex") != 0) || !json_is_string(value))
        return tokenizer_fail(fault, UFORM_FORMAT,
                              "%s: \"pattern\" is not {\"String\": ...} or {\"Regex\": ...}", what);
    uform_status_t status = read_behavior(object, -1, &split->behavior, what, fault);
    if (status == UFORM_OK) status = read_required_bool(object, "invert", &split->invert, what, fault);
    if (status != UFORM_OK) return status;
    return tokenizer_regex_compile(json_string_value(value), json_string_length(value), literal,
                                   &split->regex, what, fault);
}

/* ByteLevel's trim_offsets is required but serves its post-processor alone (a ByteLevel object of its
 * own in tokenizer.json): read and left. */
static uform_status_t parse_byte_level(json_t const *object, pre_tokenizer_t *byte_level,
                                       tokenizer_fault_t *fault) {
    char const *what = "pre-tokenizer ByteLevel";
    bool trim_offsets;
    uform_status_t status =
        read_required_bool(object, "add_prefix_space", &byte_level->add_prefix_space, what, fault);
    if (status == UFORM_OK) status = read_required_bool(object, "trim_offsets", &trim_offsets, what, fault);
    if (status == UFORM_OK) status = reject_null(object, "use_regex", what, fault);
    if (status == UFORM_OK)
        status = json_get_bool(object, "use_regex", true, &byte_level->use_regex, what, fault);
    return status;
}

/* Metaspace: prepend_scheme "always" unless given; the legacy add_prefix_space false means "never",
 * and contradicts any other scheme given. */
static uform_status_t parse_metaspace(json_t const *object, pre_tokenizer_t *metaspace,
                                      tokenizer_fault_t *fault) {
    static char const *const schemes[] = {
        [PREPEND_ALWAYS] = "always", [PREPEND_FIRST] = "first", [PREPEND_NEVER] = "never"};
    char const *what = "pre-tokenizer Metaspace", *scheme, *str_rep;
    bool add_prefix_space;
    uform_status_t status = read_char(object, "replacement", &metaspace->replacement, what, fault);
    if (status == UFORM_OK) status = reject_null(object, "prepend_scheme", what, fault);
    if (status == UFORM_OK)
        status = json_get_string(object, "prepend_scheme", "always", &scheme, NULL, what, fault);
    if (status == UFORM_OK)
        status = json_get_bool(object, "add_prefix_space", true, &add_prefix_space, what, fault);
    if (status == UFORM_OK) status = json_get_bool(object, "split", true, &metaspace->split, what, fault);
    if (status == UFORM_OK) status = json_get_string(object, "str_rep", NULL, &str_rep, NULL, what, fault);
    if (status != UFORM_OK) return status;
    size_t i = 0;
    while (i < sizeof schemes / sizeof *schemes && strcmp(scheme, schemes[i]) != 0)
        i++;
    if (i == sizeof schemes / sizeof *schemes)
        return tokenizer_fail(fault, UFORM_FORMAT, "%s: unknown prepend_scheme \"%s\"", what, scheme);
    metaspace->prepend = (prepend_scheme_t)i;
    if (!add_prefix_space && metaspace->prepend != PREPEND_NEVER)
        return tokenizer_fail(fault, UFORM_FORMAT,
                              "%s: add_prefix_space does not match declared prepend_scheme", what);
    return UFORM_OK;
}

/* Appends a step to a Sequence, the steps of a nested Sequence in its place (applying a Sequence is
 * applying its steps in turn); takes `step` in every case. */
static uform_status_t sequence_append(pre_tokenizer_t *sequence, pre_tokenizer_t *step,
                                      tokenizer_fault_t *fault) {
    bool nested = step->kind == PRE_SEQUENCE;
    size_t adding = nested ? step->step_count : 1;
    pre_tokenizer_t **steps = realloc(sequence->steps, (sequence->step_count + adding + 1) * sizeof *steps);
    if (!steps) {
        pre_tokenizer_free(step);
        return tokenizer_fail(fault, UFORM_OUT_OF_MEMORY, "pre-tokenizer Sequence: out of memory");
    }
    sequence->steps = steps;
    if (!nested) {
        steps[sequence->step_count++] = step;
        return UFORM_OK;
    }
    memcpy(steps + sequence->step_count, step->steps, adding * sizeof *steps);
    sequence->step_count += adding;
    step->step_count = 0;
    pre_tokenizer_free(step);
    return UFORM_OK;
}

static uform_status_t parse_sequence(json_t const *object, size_t depth, pre_tokenizer_t *sequence,
                                     tokenizer_fault_t *fault) {
    json_t const *list = required(object, "pretokenizers");
    if (!json_is_array(list))
        return tokenizer_fail(fault, UFORM_FORMAT, "pre-tokenizer Sequence: \"pretokenizers\" is not a list");
    uform_status_t status = UFORM_OK;
    for (size_t i = 0; i < json_array_size(list) && status == UFORM_OK; ++i) {
        pre_tokenizer_t *step;
        status = parse_node(json_array_get(list, i), depth + 1, &step, fault);
        if (status == UFORM_OK) status = sequence_append(sequence, step, fault);
    }
    return status;
}

static uform_status_t parse_fields(json_t const *object, size_t depth, pre_tokenizer_t *made,
                                   tokenizer_fault_t *fault) {
    switch (made->kind) {
    case PRE_PUNCTUATION:
        return read_behavior(object, SPLIT_ISOLATED, &made->behavior, "pre-tokenizer Punctuation", fault);
    case PRE_DIGITS: {
        bool individual = false;
        uform_status_t status =
            read_required_bool(object, "individual_digits", &individual, "pre-tokenizer Digits", fault);
        made->behavior = individual ? SPLIT_ISOLATED : SPLIT_CONTIGUOUS;
        return status;
    }
    case PRE_SPLIT:
        return parse_split(object, made, fault);
    case PRE_BYTE_LEVEL:
        return parse_byte_level(object, made, fault);
    case PRE_METASPACE:
        return parse_metaspace(object, made, fault);
    case PRE_SEQUENCE:
        return parse_sequence(object, depth, made, fault);
    default:
        return UFORM_OK; /* BertPreTokenizer, Whitespace, WhitespaceSplit have no fields */
    }
}

static uform_status_t parse_node(json_t const *object, size_t depth, pre_tokenizer_t **made,
                                 tokenizer_fault_t *fault) {
    static struct {
        char const *name;
        pre_tokenizer_kind_t kind;
    } const kinds[] = {
        {"BertPreTokenizer", PRE_BERT},
        {"Whitespace", PRE_WHITESPACE},
        {"WhitespaceSplit", PRE_WHITESPACE_SPLIT},
        {"Punctuation", PRE_PUNCTUATION},
        {"Digits", PRE_DIGITS},
        {"Split", PRE_SPLIT},
        {"ByteLevel", PRE_BYTE_LEVEL},
        {"Metaspace", PRE_METASPACE},
        {"Sequence", PRE_SEQUENCE},
    };
    *made = NULL;
    if (depth > MAX_DEPTH)
        return tokenizer_fail(fault, UFORM_FORMAT, "pre-tokenizer: sequences nested too deeply");
    char const *type;
    uform_status_t status = json_get_type(object, &type, "pre-tokenizer", fault);
    if (status != UFORM_OK) return status;
    size_t i = 0;
    while (i < sizeof kinds / sizeof *kinds && strcmp(type, kinds[i].name) != 0)
        i++;
    if (i == sizeof kinds / sizeof *kinds)
        return tokenizer_fail(fault, UFORM_UNSUPPORTED, "pre-tokenizer: unsupported type \"%s\"", type);
    pre_tokenizer_t *node = calloc(1, sizeof *node);
    if (!node) return tokenizer_fail(fault, UFORM_OUT_OF_MEMORY, "pre-tokenizer: out of memory");
    node->kind = kinds[i].kind;
    status = parse_fields(object, depth, node, fault);
    if (status != UFORM_OK) {
        pre_tokenizer_free(node);
        return status;
    }
    *made = node;
    return UFORM_OK;
}

uform_status_t pre_tokenizer_parse(json_t const *object, pre_tokenizer_t **pre_tokenizer,
                                   tokenizer_fault_t *fault) {
    *pre_tokenizer = NULL;
    if (tables_ready() != UFORM_OK)
        return tokenizer_fail(fault, UFORM_INTERNAL,
                              "pre-tokenizer: Oniguruma's Unicode tables could not be read");
    return parse_node(object, 0, pre_tokenizer, fault);
}
