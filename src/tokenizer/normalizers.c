/* Normalizers: Hugging Face tokenizers' (0.19.1) BertNormalizer, Strip, StripAccents, NFC, NFD, NFKC, NFKD,
 * Sequence, Lowercase, Nmt, Precompiled, Replace and Prepend, read from tokenizer.json and applied to
 * pieces.
 *
 * Reading follows serde's untagged NormalizerWrapper: its variants are tried in the order above and the
 * first whose fields parse wins. Only the unit variants (StripAccents, NF*, Lowercase, Nmt) check "type";
 * the others take any object with their fields ({"type": "NFC", "strip_left": true, "strip_right": true}
 * is a Strip), and serde also takes a struct's fields as an array in declaration order. A failure is
 * reported for the variant that "type" names, or as an unsupported type.
 *
 * Applying rewrites each open piece by tokenizers' transform rule (pieces.h). Most stages keep each code
 * point's own span: that is what the rule gives the change lists of filter, map, lowercase, Strip and
 * BertNormalizer's padding of CJK characters. The normal forms emit the changes of tokenizers'
 * unicode-normalization-alignments (decomposed marks inserted after their base, canonical reordering
 * carrying the changes along, compositions replacing with removal) through piece_rewrite, and so do
 * Precompiled (SentencePiece's charsmap, per grapheme cluster) and Replace (the content inserted after
 * the removed match).
 *
 * Unicode versions. utf8proc 2.8 carries Unicode 15.0; tokenizers 0.19.1's tables are older, and some
 * characters assigned since then are treated differently (every code point was compared alone):
 * - NFC, NFD, NFKC, NFKD (unicode-normalization-alignments 0.1.12: Unicode 9.0). Characters assigned after
 *   9.0 have no decomposition there: U+11938 (canonical); U+32FF, U+A7F2 to U+A7F4, U+AB69, U+10781 to
 *   U+107BA, U+1E030 to U+1E06D, U+1F16C, U+1FBF0 to U+1FBF9 (compatibility) decompose here only. Marks
 *   assigned after 9.0 have combining class 0 there, so they are not reordered and block composition.
 * - StripAccents (the same crate's General_Category M, 9.0): 357 marks assigned after 9.0 (e.g. U+0898 to
 *   U+089F, U+1ABF, U+11930 and the other new Brahmic signs) are removed here only.
 * - BertNormalizer (unicode_categories 0.1.1: Unicode 8.0). clean_text removes the format characters
 *   assigned after 8.0 (U+0890, U+0891, U+08E2, U+110CD, U+13430 to U+1343F) here only; strip_accents
 *   removes the nonspacing marks assigned after 8.0 (e.g. U+0898 to U+089F, U+1ABF) and U+1885, U+1886
 *   (Lo in 8.0, Mn since 9.0) here only, and U+1734 (Mn in 8.0, Mc since 14.0) there only.
 * - Lowercase (Rust's std, Unicode 15.1), Nmt and Precompiled agree for every code point of 15.0.
 *   Precompiled's grapheme clusters are unicode-segmentation 1.11's there (Unicode 15.1 without rule
 *   GB9c), utf8proc's here (15.0, also without GB9c).
 * Where tokenizers panics (a charsmap whose trie points outside itself, a regex search that fails), that
 * lookup or search finds nothing here. */
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <oniguruma.h>
#include <utf8proc.h>

#include "components.h"

/* ---- the normalizers ------------------------------------------------------------------------- */

/* In the order serde tries NormalizerWrapper's variants. */
typedef enum normalizer_kind {
    KIND_BERT,
    KIND_STRIP,
    KIND_STRIP_ACCENTS,
    KIND_NFC,
    KIND_NFD,
    KIND_NFKC,
    KIND_NFKD,
    KIND_SEQUENCE,
    KIND_LOWERCASE,
    KIND_NMT,
    KIND_PRECOMPILED,
    KIND_REPLACE,
    KIND_PREPEND,
    KIND_COUNT
} normalizer_kind_t;

static char const *const kind_names[KIND_COUNT] = {
    "BertNormalizer", "Strip",     "StripAccents", "NFC",         "NFD",     "NFKC",    "NFKD",
    "Sequence",       "Lowercase", "Nmt",          "Precompiled", "Replace", "Prepend",
};

#define DROPPED (-1)

typedef struct bert {
    bool clean_text, chinese, strip_accents, lowercase;
    int16_t clean[128]; /* per ASCII code point: what clean_text makes of it, or DROPPED */
    int16_t whole[128]; /* and what the whole normalizer makes of it */
} bert_t;

/* SentencePiece's precompiled charsmap: a double-array trie over UTF-8 keys whose leaves are offsets of
 * NUL-ended replacements in `normalized`. */
typedef struct precompiled {
    uint32_t *units;
    size_t unit_count;
    uint8_t *charsmap; /* the decoded bytes, which `normalized` points into */
    uint8_t const *normalized;
    size_t normalized_size;
    int32_t ascii[128]; /* per ASCII code point: the offset of its replacement, or -1 */
} precompiled_t;

typedef struct replace {
    OnigRegex regex;  /* NULL for a literal of one code point, */
    uint32_t literal; /* which is found without it */
    uint32_t *content;
    size_t content_size;
} replace_t;

struct normalizer {
    normalizer_kind_t kind;
    union {
        bert_t bert;
        struct {
            bool left, right;
        } strip;
        struct {
            normalizer_t **items; /* nested sequences are spliced in */
            size_t count;
        } sequence;
        precompiled_t precompiled;
        replace_t replace;
        struct {
            uint32_t *chars;
            size_t size;
        } prepend;
    };
};

/* ---- Unicode ----------------------------------------------------------------------------------- */

typedef utf8proc_property_t property_t;

static inline property_t const *property(uint32_t ch) {
    return utf8proc_get_property((utf8proc_int32_t)ch);
}

static inline bool is_separator(int kind) {
    return kind == UTF8PROC_CATEGORY_ZS || kind == UTF8PROC_CATEGORY_ZL || kind == UTF8PROC_CATEGORY_ZP;
}

/* Rust's char::is_whitespace (White_Space): the separators (space, line, paragraph), and the controls TAB
 * to CR and NEL. */
static bool is_white_space(uint32_t ch) {
    if (ch < 0x80) return ch == ' ' || (ch >= '\t' && ch <= '\r');
    return ch == 0x85 || is_separator(property(ch)->category);
}

/* unicode_categories' is_other: control, format, private use (surrogates are not code points here). */
static inline bool is_other(int kind) {
    return kind == UTF8PROC_CATEGORY_CC || kind == UTF8PROC_CATEGORY_CF || kind == UTF8PROC_CATEGORY_CO;
}

/* unicode-normalization's is_combining_mark: General_Category M. */
static bool is_mark(uint32_t ch) {
    int kind = property(ch)->category;
    return kind == UTF8PROC_CATEGORY_MN || kind == UTF8PROC_CATEGORY_MC || kind == UTF8PROC_CATEGORY_ME;
}

/* BertNormalizer's CJK blocks, which it pads with spaces. */
static bool is_chinese(uint32_t ch) {
    return (ch >= 0x4E00 && ch <= 0x9FFF) || (ch >= 0x3400 && ch <= 0x4DBF) ||
           (ch >= 0x20000 && ch <= 0x2A6DF) || (ch >= 0x2A700 && ch <= 0x2B73F) ||
           (ch >= 0x2B740 && ch <= 0x2B81F) || (ch >= 0x2B920 && ch <= 0x2CEAF) ||
           (ch >= 0xF900 && ch <= 0xFAFF) || (ch >= 0x2F800 && ch <= 0x2FA1F);
}

#define CAPITAL_I_WITH_DOT 0x130

/* Rust's char::to_lowercase past ASCII: the simple mapping, which utf8proc gives, except for the one code
 * point whose full mapping (SpecialCasing.txt, unconditional) is longer: U+0130 is "i" and U+0307.
 * Answers how many code points it wrote. */
static int lowercase_of(uint32_t ch, property_t const *properties, uint32_t lower[2]) {
    if (ch == CAPITAL_I_WITH_DOT) {
        lower[0] = 'i';
        lower[1] = 0x307;
        return 2;
    }
    bool mapped = properties->lowercase_seqindex != UINT16_MAX;
    lower[0] = mapped ? (uint32_t)utf8proc_tolower((utf8proc_int32_t)ch) : ch;
    return 1;
}

static inline uint32_t ascii_lowercase(uint32_t ch) {
    return ch - 'A' < 26u ? ch + ('a' - 'A') : ch;
}

static int lowercase(uint32_t ch, uint32_t lower[2]) {
    if (ch >= 0x80) return lowercase_of(ch, property(ch), lower);
    lower[0] = ascii_lowercase(ch);
    return 1;
}

/* The longest full decomposition utf8proc writes is 18 code points (U+FDFA, compatibility). */
#define DECOMPOSITION_MAX 32

/* The full decomposition of `ch` (itself when it has none). */
static int decompose(uint32_t ch, bool compat, uint32_t parts[DECOMPOSITION_MAX]) {
    int boundclass = 0;
    utf8proc_option_t options = UTF8PROC_DECOMPOSE | (compat ? UTF8PROC_COMPAT : 0);
    utf8proc_ssize_t count = utf8proc_decompose_char((utf8proc_int32_t)ch, (utf8proc_int32_t *)parts,
                                                     DECOMPOSITION_MAX, options, &boundclass);
    if (count < 1 || count > DECOMPOSITION_MAX) {
        parts[0] = ch;
        return 1;
    }
    return (int)count;
}

/* Hangul's arithmetic composition, as unicode-normalization has it (a trailing consonant is past
 * T_BASE; utf8proc would also take T_BASE itself). */
#define HANGUL_S_BASE  0xAC00
#define HANGUL_L_BASE  0x1100
#define HANGUL_V_BASE  0x1161
#define HANGUL_T_BASE  0x11A7
#define HANGUL_L_COUNT 19
#define HANGUL_V_COUNT 21
#define HANGUL_T_COUNT 28
#define HANGUL_S_COUNT (HANGUL_L_COUNT * HANGUL_V_COUNT * HANGUL_T_COUNT)

static bool compose_hangul(uint32_t a, uint32_t b, uint32_t *composed) {
    if (a - HANGUL_L_BASE < HANGUL_L_COUNT && b - HANGUL_V_BASE < HANGUL_V_COUNT) {
        *composed =
            HANGUL_S_BASE + ((a - HANGUL_L_BASE) * HANGUL_V_COUNT + (b - HANGUL_V_BASE)) * HANGUL_T_COUNT;
        return true;
    }
    if (a - HANGUL_S_BASE < HANGUL_S_COUNT && (a - HANGUL_S_BASE) % HANGUL_T_COUNT == 0 &&
        b - (HANGUL_T_BASE + 1) < HANGUL_T_COUNT - 1) {
        *composed = a + (b - HANGUL_T_BASE);
        return true;
    }
    return false;
}

/* The primary composite of `a` and `b`, if any. utf8proc composes through a buffer (STABLE: without it,
 * it would also make the composites excluded since Unicode 3.1, U+2ADC and the musical symbols); most
 * code points take no part in any composition (comb_index UINT16_MAX), and those are answered at once. */
static bool compose(uint32_t a, uint32_t b, uint32_t *composed) {
    bool hangul = a - HANGUL_L_BASE < HANGUL_L_COUNT || a - HANGUL_S_BASE < HANGUL_S_COUNT;
    if (hangul || b - HANGUL_V_BASE < HANGUL_T_BASE + HANGUL_T_COUNT - HANGUL_V_BASE)
        return compose_hangul(a, b, composed);
    if (utf8proc_get_property((utf8proc_int32_t)b)->comb_index == UINT16_MAX) return false;
    utf8proc_int32_t pair[2] = {(utf8proc_int32_t)a, (utf8proc_int32_t)b};
    if (utf8proc_normalize_utf32(pair, 2, UTF8PROC_COMPOSE | UTF8PROC_STABLE) != 1) return false;
    *composed = (uint32_t)pair[0];
    return true;
}

/* UTF-8 of text already known to be well formed (the charsmap's replacements, checked when read). */
static uint32_t utf8_take(uint8_t const *text, size_t *at) {
    uint8_t lead = text[(*at)++];
    if (lead < 0x80) return lead;
    int extra = lead >= 0xF0 ? 3 : lead >= 0xE0 ? 2 : 1;
    uint32_t ch = lead & (0x3F >> extra);
    while (extra--)
        ch = ch << 6 | (text[(*at)++] & 0x3F);
    return ch;
}

/* utf8_put, with ASCII inline. */
static inline size_t put_utf8(uint8_t *text, uint32_t ch) {
    if (ch >= 0x80) return utf8_put(text, ch);
    *text = (uint8_t)ch;
    return 1;
}

static size_t utf8_size(uint32_t ch) {
    return ch < 0x80 ? 1 : ch < 0x800 ? 2 : ch < 0x10000 ? 3 : 4;
}

/* ---- pushing and the transform rule --------------------------------------------------------- */

/* pieces_push, with the common case (room left) inline: the stages push every code point they write. */
static inline uform_status_t push(pieces_t *out, uint32_t ch, piece_span_t span) {
    if (out->length >= out->char_capacity) return pieces_push(out, ch, span);
    out->chars[out->length] = ch;
    out->spans[out->length] = span;
    out->length++;
    return UFORM_OK;
}

/* piece_rewrite_emit's rule: the span a code point emitted with `change` takes, and the step over the
 * source; emit pushes it inline, and BertNormalizer writes something else than what was emitted. */
static piece_span_t rewrite_span(piece_rewrite_t *rewrite, int change) {
    if (change > 0)
        return rewrite->next > 0 ? rewrite->spans[rewrite->next - 1]
                                 : (piece_span_t){rewrite->shift, rewrite->shift};
    uint32_t at = rewrite->next < rewrite->size ? rewrite->next : rewrite->size - 1;
    piece_span_t span = rewrite->size ? rewrite->spans[at] : (piece_span_t){rewrite->shift, rewrite->shift};
    uint32_t consumed = 1u + (uint32_t)(-change);
    rewrite->next = rewrite->size - rewrite->next < consumed ? rewrite->size : rewrite->next + consumed;
    return span;
}

static inline uform_status_t emit(piece_rewrite_t *rewrite, uint32_t ch, int change) {
    return push(rewrite->out, ch, rewrite_span(rewrite, change));
}

/* ---- stages that keep each code point's span ----------------------------------------------------- */

/* Begins the rewrite of piece `index` of `in` in `out`: same shift, same id. */
static uform_status_t piece_open(pieces_t *out, pieces_t const *in, size_t index) {
    return pieces_begin(out, in->shifts[index], in->ids[index]);
}

static uform_status_t push_lowercase(pieces_t *out, uint32_t ch, piece_span_t span) {
    uint32_t lower[2];
    int count = lowercase(ch, lower);
    uform_status_t status = push(out, lower[0], span);
    if (status == UFORM_OK && count == 2) status = push(out, lower[1], span);
    return status;
}

static uform_status_t lowercase_piece(pieces_t const *in, size_t index, pieces_t *out) {
    uint32_t const *chars = pieces_chars(in, index);
    piece_span_t const *spans = pieces_spans(in, index);
    uform_status_t status = piece_open(out, in, index);
    for (uint32_t i = 0, n = pieces_size(in, index); i < n && status == UFORM_OK; ++i)
        status = push_lowercase(out, chars[i], spans[i]);
    if (status == UFORM_OK) pieces_end(out);
    return status;
}

/* StripAccents: the combining marks removed. */
static uform_status_t strip_accents_piece(pieces_t const *in, size_t index, pieces_t *out) {
    uint32_t const *chars = pieces_chars(in, index);
    piece_span_t const *spans = pieces_spans(in, index);
    uform_status_t status = piece_open(out, in, index);
    for (uint32_t i = 0, n = pieces_size(in, index); i < n && status == UFORM_OK; ++i)
        if (chars[i] < 0x300 || !is_mark(chars[i])) status = push(out, chars[i], spans[i]);
    if (status == UFORM_OK) pieces_end(out);
    return status;
}

/* Strip: the white space at either end removed. (tokenizers gives the last kept code point a removal of
 * the trailing ones, counting in bytes: it changes nothing, since what is left unconsumed is dropped.) */
static uform_status_t strip_piece(normalizer_t const *normalizer, pieces_t const *in, size_t index,
                                  pieces_t *out) {
    uint32_t const *chars = pieces_chars(in, index);
    piece_span_t const *spans = pieces_spans(in, index);
    uint32_t begin = 0, end = pieces_size(in, index);
    if (normalizer->strip.left)
        while (begin < end && is_white_space(chars[begin]))
            begin++;
    if (normalizer->strip.right)
        while (end > begin && is_white_space(chars[end - 1]))
            end--;
    uform_status_t status = piece_open(out, in, index);
    for (uint32_t i = begin; i < end && status == UFORM_OK; ++i)
        status = push(out, chars[i], spans[i]);
    if (status == UFORM_OK) pieces_end(out);
    return status;
}

/* Nmt: some controls removed, other controls and separators made spaces. */
static int32_t nmt_map(uint32_t ch) {
    if ((ch >= 0x01 && ch <= 0x08) || ch == 0x0B || (ch >= 0x0E && ch <= 0x1F) || ch == 0x7F || ch == 0x8F ||
        ch == 0x9F)
        return DROPPED;
    if (ch == 0x09 || ch == 0x0A || ch == 0x0C || ch == 0x0D || ch == 0x1680 ||
        (ch >= 0x200B && ch <= 0x200F) || ch == 0x2028 || ch == 0x2029 || ch == 0x2581 || ch == 0xFEFF ||
        ch == 0xFFFD)
        return ' ';
    return (int32_t)ch;
}

static uform_status_t nmt_piece(pieces_t const *in, size_t index, pieces_t *out) {
    uint32_t const *chars = pieces_chars(in, index);
    piece_span_t const *spans = pieces_spans(in, index);
    uform_status_t status = piece_open(out, in, index);
    for (uint32_t i = 0, n = pieces_size(in, index); i < n && status == UFORM_OK; ++i) {
        int32_t mapped = nmt_map(chars[i]);
        if (mapped != DROPPED) status = push(out, (uint32_t)mapped, spans[i]);
    }
    if (status == UFORM_OK) pieces_end(out);
    return status;
}

/* Prepend: the text put before the first code point, all of it with that code point's span. An empty
 * one still rewrites the first code point, as inserted before anything: it takes the empty span at the
 * piece's start. */
static uform_status_t prepend_piece(normalizer_t const *normalizer, pieces_t const *in, size_t index,
                                    pieces_t *out) {
    uint32_t const *chars = pieces_chars(in, index);
    piece_span_t const *spans = pieces_spans(in, index);
    uint32_t size = pieces_size(in, index);
    if (size == 0) return pieces_copy(out, in, index);
    piece_span_t first =
        normalizer->prepend.size ? spans[0] : (piece_span_t){in->shifts[index], in->shifts[index]};
    uform_status_t status = piece_open(out, in, index);
    for (size_t i = 0; i < normalizer->prepend.size && status == UFORM_OK; ++i)
        status = push(out, normalizer->prepend.chars[i], first);
    if (status == UFORM_OK) status = push(out, chars[0], first);
    for (uint32_t i = 1; i < size && status == UFORM_OK; ++i)
        status = push(out, chars[i], spans[i]);
    if (status == UFORM_OK) pieces_end(out);
    return status;
}

/* ---- normal forms ------------------------------------------------------------------------------- */

/* unicode-normalization-alignments' Decompositions and Recompositions, streamed: each code point is
 * decomposed (its first part changes nothing, the others are inserted); a run of nonstarters is sorted
 * by combining class, stably, when a starter or the end comes; composition then folds a part into the
 * starter before it (the composite's change is the sum of both, less one), unless a part of the same or
 * a higher class stands between them. Starters pass on at once; the run waits in work->bytes, and the
 * parts that composition leaves behind its starter (blocked) are kept at the run's front. */
typedef struct form {
    bool compat, compose;
    bool strip_marks, lowercase; /* BertNormalizer: marks Mn dropped and the rest lowercased, */
    pieces_t *out;               /* written here with the rule's spans */
    piece_rewrite_t rewrite;
    tokenizer_work_t *work;
    uint64_t *run; /* pending nonstarters, packed by run_entry */
    size_t run_count, run_capacity, blocked;
    bool has_composee;
    uint32_t composee;
    int composee_change;
    int last_class; /* of the last blocked part, or -1 */
} form_t;

/* A pending nonstarter as one integer whose order is (class, arrival): sorting the integers sorts the
 * run stably by class. */
static inline uint64_t run_entry(uint32_t ch, int change, uint32_t ccc, uint64_t arrival) {
    return (uint64_t)ccc << 54 | arrival << 22 | (uint64_t)(change != 0) << 21 | ch;
}
static inline uint32_t run_char(uint64_t entry) {
    return (uint32_t)(entry & 0x1FFFFF);
}
static inline int run_change(uint64_t entry) {
    return (int)(entry >> 21 & 1);
}
static inline uint32_t run_class(uint64_t entry) {
    return (uint32_t)(entry >> 54);
}

static uform_status_t form_emit(form_t *form, uint32_t ch, int change) {
    if (!form->strip_marks) return emit(&form->rewrite, ch, change);
    piece_span_t span = rewrite_span(&form->rewrite, change);
    if (ch < 0x80) return push(form->out, form->lowercase ? ascii_lowercase(ch) : ch, span);
    property_t const *properties = property(ch);
    if (properties->category == UTF8PROC_CATEGORY_MN) return UFORM_OK;
    if (!form->lowercase) return push(form->out, ch, span);
    uint32_t lower[2];
    uform_status_t status = UFORM_OK;
    for (int i = 0, count = lowercase_of(ch, properties, lower); i < count && status == UFORM_OK; ++i)
        status = push(form->out, lower[i], span);
    return status;
}

/* Emits the composee and the parts blocked behind it. */
static uform_status_t form_release(form_t *form) {
    uform_status_t status = UFORM_OK;
    if (form->has_composee) status = form_emit(form, form->composee, form->composee_change);
    for (size_t i = 0; i < form->blocked && status == UFORM_OK; ++i)
        status = form_emit(form, run_char(form->run[i]), run_change(form->run[i]));
    form->has_composee = false;
    form->blocked = 0;
    form->last_class = -1;
    return status;
}

static void form_block(form_t *form, uint32_t ch, int change, uint32_t ccc) {
    form->run[form->blocked++] = run_entry(ch, change, ccc, 0);
    form->last_class = (int)ccc;
}

static bool form_fold(form_t *form, uint32_t ch, int change) {
    uint32_t composed;
    if (!compose(form->composee, ch, &composed)) return false;
    form->composee = composed;
    form->composee_change = form->composee_change + change - 1;
    return true;
}

/* Recompositions' step for one decomposed part (its "Composing" state). */
static uform_status_t form_compose(form_t *form, uint32_t ch, int change, uint32_t ccc) {
    if (!form->has_composee) {
        if (ccc != 0) return form_emit(form, ch, change);
        form->has_composee = true, form->composee = ch, form->composee_change = change;
        return UFORM_OK;
    }
    bool blocked = form->last_class >= 0 && (uint32_t)form->last_class >= ccc;
    if (!blocked && form_fold(form, ch, change)) return UFORM_OK;
    if (ccc != 0) {
        form_block(form, ch, change, ccc);
        return UFORM_OK;
    }
    uform_status_t status = form_release(form);
    form->has_composee = true, form->composee = ch, form->composee_change = change;
    return status;
}

static uform_status_t form_take(form_t *form, uint32_t ch, int change, uint32_t ccc) {
    return form->compose ? form_compose(form, ch, change, ccc) : form_emit(form, ch, change);
}

static int compare_entries(void const *a, void const *b) {
    uint64_t x = *(uint64_t const *)a, y = *(uint64_t const *)b;
    return (x > y) - (x < y);
}

static void run_sort(uint64_t *run, size_t count) {
    if (count > 16) {
        qsort(run, count, sizeof *run, compare_entries);
        return;
    }
    for (size_t i = 1; i < count; ++i) {
        uint64_t entry = run[i];
        size_t j = i;
        for (; j > 0 && run[j - 1] > entry; --j)
            run[j] = run[j - 1];
        run[j] = entry;
    }
}

/* Sorts the pending nonstarters (canonical order) and passes them on; composition may leave some
 * blocked at the run's front. */
static uform_status_t form_flush(form_t *form) {
    size_t count = form->run_count;
    for (size_t i = 1; i < count; ++i)
        if (run_class(form->run[i - 1]) > run_class(form->run[i])) {
            run_sort(form->run, count);
            break;
        }
    uform_status_t status = UFORM_OK;
    for (size_t i = 0; i < count && status == UFORM_OK; ++i)
        status = form_take(form, run_char(form->run[i]), run_change(form->run[i]), run_class(form->run[i]));
    form->run_count = 0;
    return status;
}

static uform_status_t form_queue(form_t *form, uint32_t ch, int change, uint32_t ccc) {
    if (form->run_count == form->run_capacity) {
        size_t capacity = form->run_capacity ? form->run_capacity * 2 : 64;
        uint8_t *bytes =
            capacity <= SIZE_MAX / sizeof *form->run ? work_bytes(form->work, capacity * 8) : NULL;
        if (!bytes) return UFORM_OUT_OF_MEMORY;
        form->run = (uint64_t *)bytes;
        form->run_capacity = capacity;
    }
    if (form->run_count > UINT32_MAX) return UFORM_OUT_OF_MEMORY; /* arrivals are 32 bits */
    form->run[form->run_count] = run_entry(ch, change, ccc, form->run_count);
    form->run_count++;
    return UFORM_OK;
}

static uform_status_t form_part(form_t *form, uint32_t ch, int change, uint32_t ccc) {
    if (ccc) return form_queue(form, ch, change, ccc);
    uform_status_t status = form->run_count ? form_flush(form) : UFORM_OK;
    return status == UFORM_OK ? form_take(form, ch, change, 0) : status;
}

/* A code point without a decomposition (most) is its own single part: one property lookup. */
static uform_status_t form_feed(form_t *form, uint32_t ch) {
    property_t const *properties = property(ch);
    if (properties->decomp_seqindex == UINT16_MAX && ch - HANGUL_S_BASE >= HANGUL_S_COUNT)
        return form_part(form, ch, 0, properties->combining_class);
    uint32_t parts[DECOMPOSITION_MAX];
    int count = decompose(ch, form->compat, parts);
    uform_status_t status = UFORM_OK;
    for (int i = 0; i < count && status == UFORM_OK; ++i)
        status = form_part(form, parts[i], i > 0, property(parts[i])->combining_class);
    return status;
}

/* Everything pending passed on: at the end, or before an ASCII code point that nothing composes with. */
static uform_status_t form_settle(form_t *form) {
    uform_status_t status = form->run_count ? form_flush(form) : UFORM_OK;
    if (status == UFORM_OK && form->compose) status = form_release(form);
    return status;
}

/* An ASCII code point with nothing pending before it: the changes emitted so far consumed every code
 * point before it (a composite's consumption is its parts'), so it replaces itself, keeping its span. */
static inline uform_status_t form_ascii(form_t *form, uint32_t ch, uint32_t at) {
    form->rewrite.next = at + 1;
    uint32_t written = form->strip_marks && form->lowercase ? ascii_lowercase(ch) : ch;
    return push(form->out, written, form->rewrite.spans[at]);
}

/* Rewrites piece `index` of `in` into the normal form. An ASCII code point is its own decomposition
 * and a starter; followed by another, it composes with nothing and passes at once. */
static uform_status_t form_piece(form_t *form, pieces_t const *in, size_t index) {
    uint32_t const *chars = pieces_chars(in, index);
    uint32_t size = pieces_size(in, index);
    uform_status_t status = piece_rewrite_begin(&form->rewrite, form->out, in, index, 0);
    for (uint32_t i = 0; i < size && status == UFORM_OK; ++i) {
        uint32_t ch = chars[i];
        if (ch < 0x80 && (!form->compose || i + 1 == size || chars[i + 1] < 0x80)) {
            if (form->run_count || form->has_composee) status = form_settle(form);
            if (status == UFORM_OK) status = form_ascii(form, ch, i);
        } else {
            status = form_feed(form, ch);
        }
    }
    if (status == UFORM_OK) status = form_settle(form);
    if (status == UFORM_OK) piece_rewrite_end(&form->rewrite);
    return status;
}

static form_t form_make(pieces_t *out, tokenizer_work_t *work, bool compat, bool compose) {
    return (form_t){.compat = compat, .compose = compose, .out = out, .work = work, .last_class = -1};
}

/* ---- BertNormalizer ----------------------------------------------------------------------------- */

/* clean_text and handle_chinese_chars on one code point past ASCII: what they write (0 to 3). */
static int bert_clean(bert_t const *bert, uint32_t ch, uint32_t written[3]) {
    if (bert->chinese && is_chinese(ch)) { /* letters (Lo), which clean_text keeps */
        written[0] = ' ', written[1] = ch, written[2] = ' ';
        return 3;
    }
    int kind = bert->clean_text ? property(ch)->category : UTF8PROC_CATEGORY_LO;
    if (ch == 0xFFFD && bert->clean_text) return 0;
    if (is_other(kind)) return 0; /* NEL, a control, goes before it would be a space */
    written[0] = is_separator(kind) ? ' ' : ch;
    return 1;
}

/* Without accent stripping every step keeps spans: one pass. */
static uform_status_t bert_keeping(bert_t const *bert, pieces_t const *in, size_t index, pieces_t *out) {
    uint32_t const *chars = pieces_chars(in, index);
    piece_span_t const *spans = pieces_spans(in, index);
    uform_status_t status = piece_open(out, in, index);
    for (uint32_t i = 0, n = pieces_size(in, index); i < n && status == UFORM_OK; ++i) {
        if (chars[i] < 0x80) {
            if (bert->whole[chars[i]] != DROPPED)
                status = push(out, (uint32_t)bert->whole[chars[i]], spans[i]);
            continue;
        }
        uint32_t written[3];
        for (int j = 0, count = bert_clean(bert, chars[i], written); j < count && status == UFORM_OK; ++j)
            status =
                bert->lowercase ? push_lowercase(out, written[j], spans[i]) : push(out, written[j], spans[i]);
    }
    if (status == UFORM_OK) pieces_end(out);
    return status;
}

/* clean_text and handle_chinese_chars alone, into `out`. */
static uform_status_t bert_clean_piece(bert_t const *bert, pieces_t const *in, size_t index, pieces_t *out) {
    uint32_t const *chars = pieces_chars(in, index);
    piece_span_t const *spans = pieces_spans(in, index);
    uform_status_t status = piece_open(out, in, index);
    for (uint32_t i = 0, n = pieces_size(in, index); i < n && status == UFORM_OK; ++i) {
        if (chars[i] < 0x80) {
            if (bert->clean[chars[i]] != DROPPED)
                status = push(out, (uint32_t)bert->clean[chars[i]], spans[i]);
            continue;
        }
        uint32_t written[3];
        for (int j = 0, count = bert_clean(bert, chars[i], written); j < count && status == UFORM_OK; ++j)
            status = push(out, written[j], spans[i]);
    }
    if (status == UFORM_OK) pieces_end(out);
    return status;
}

/* With accent stripping: clean_text and handle_chinese_chars into a temporary piece, then its NFD, which
 * moves spans when it reorders marks, with the marks dropped and the rest lowercased on the way out. */
static uform_status_t bert_stripping(bert_t const *bert, pieces_t const *in, size_t index, pieces_t *out,
                                     tokenizer_work_t *work) {
    form_t form = form_make(out, work, false, false);
    form.strip_marks = true;
    form.lowercase = bert->lowercase;
    if (!bert->clean_text && !bert->chinese) return form_piece(&form, in, index);
    pieces_t *cleaned = work_take(work);
    if (!cleaned) return UFORM_OUT_OF_MEMORY;
    uform_status_t status = bert_clean_piece(bert, in, index, cleaned);
    if (status == UFORM_OK && cleaned->count) status = form_piece(&form, cleaned, 0);
    work_give(work);
    return status;
}

static bool piece_is_ascii(pieces_t const *in, size_t index) {
    uint32_t const *chars = pieces_chars(in, index);
    uint32_t any = 0;
    for (uint32_t i = 0, n = pieces_size(in, index); i < n; ++i)
        any |= chars[i];
    return any < 0x80;
}

static uform_status_t bert_piece(bert_t const *bert, pieces_t const *in, size_t index, pieces_t *out,
                                 tokenizer_work_t *work) {
    if (!bert->strip_accents || piece_is_ascii(in, index)) return bert_keeping(bert, in, index, out);
    return bert_stripping(bert, in, index, out, work);
}

/* ---- Precompiled -------------------------------------------------------------------------------- */

/* The double array's units, as SentencePiece's Darts-clone packs them. */
static inline uint64_t unit_offset(uint64_t unit) {
    return (unit >> 10) << ((unit & (1u << 9)) >> 6);
}
static inline bool unit_has_leaf(uint64_t unit) {
    return unit >> 8 & 1;
}
static inline uint64_t unit_label(uint64_t unit) {
    return unit & ((1u << 31) | 0xFF);
}
static inline uint64_t unit_value(uint64_t unit) {
    return unit & ((1u << 31) - 1);
}

/* The replacement at `offset`: up to its NUL. An offset past the end or inside a code point is refused
 * (tokenizers panics there). */
static bool precompiled_replacement(precompiled_t const *map, uint64_t offset, uint8_t const **text,
                                    size_t *length) {
    if (offset > map->normalized_size) return false;
    if (offset < map->normalized_size && (map->normalized[offset] & 0xC0) == 0x80) return false;
    uint8_t const *begin = map->normalized + offset;
    uint8_t const *nul = memchr(begin, 0, map->normalized_size - offset);
    *text = begin;
    *length = nul ? (size_t)(nul - begin) : map->normalized_size - offset;
    return true;
}

/* spm_precompiled's transform: the replacement of the shortest prefix of `key` the trie holds (not
 * necessarily the whole key), searched up to a NUL byte. An index outside the trie ends the search. */
static bool precompiled_find(precompiled_t const *map, uint8_t const *key, size_t size, uint8_t const **text,
                             size_t *length) {
    if (map->unit_count == 0) return false;
    uint64_t node = unit_offset(map->units[0]);
    for (size_t i = 0; i < size && key[i]; ++i) {
        node ^= key[i];
        if (node >= map->unit_count) return false;
        uint64_t unit = map->units[node];
        if (unit_label(unit) != key[i]) return false;
        node ^= unit_offset(unit);
        if (unit_has_leaf(unit)) {
            if (node >= map->unit_count) return false;
            return precompiled_replacement(map, unit_value(map->units[node]), text, length);
        }
    }
    return false;
}

/* tokenizers' list of (code point, change) built for Precompiled, written one behind: a removal is
 * added to the last code point already listed, or lost when there is none. */
typedef struct delayed {
    piece_rewrite_t rewrite;
    bool pending;
    uint32_t ch;
    int change;
} delayed_t;

static uform_status_t delayed_push(delayed_t *list, uint32_t ch, int change) {
    uform_status_t status = list->pending ? emit(&list->rewrite, list->ch, list->change) : UFORM_OK;
    list->pending = true, list->ch = ch, list->change = change;
    return status;
}

/* precompiled.rs' replace: `old_count` code points become the replacement; the ones past the old count
 * are inserted, and a shorter replacement removes the rest through the last code point listed. */
static uform_status_t delayed_replace(delayed_t *list, uint32_t old_count, uint8_t const *text,
                                      size_t length) {
    uint32_t new_count = 0;
    for (size_t i = 0; i < length; ++i)
        new_count += (text[i] & 0xC0) != 0x80;
    uform_status_t status = UFORM_OK;
    uint32_t j = 0;
    for (size_t at = 0; at < length && status == UFORM_OK; ++j)
        status = delayed_push(list, utf8_take(text, &at), j >= old_count);
    if (new_count < old_count && list->pending && list->change > INT_MIN / 2)
        list->change -= (int)(old_count - new_count);
    return status;
}

/* One code point alone: replaced, or listed as it is. */
static uform_status_t precompiled_char(precompiled_t const *map, delayed_t *list, uint32_t ch) {
    uint8_t const *text;
    size_t length;
    if (ch < 0x80) {
        if (map->ascii[ch] < 0) return delayed_push(list, ch, 0);
        precompiled_replacement(map, (uint64_t)map->ascii[ch], &text, &length);
        return delayed_replace(list, 1, text, length);
    }
    uint8_t key[4];
    if (!precompiled_find(map, key, utf8_put(key, ch), &text, &length)) return delayed_push(list, ch, 0);
    return delayed_replace(list, 1, text, length);
}

/* A grapheme cluster of fewer than 6 bytes is looked up whole first; otherwise, or when that fails, each
 * code point alone. */
static uform_status_t precompiled_cluster(precompiled_t const *map, delayed_t *list, uint32_t const *chars,
                                          uint32_t count) {
    size_t size = 0;
    for (uint32_t i = 0; i < count && size < 6; ++i)
        size += utf8_size(chars[i]);
    if (count > 1 && size < 6) {
        uint8_t key[8], *end = key;
        for (uint32_t i = 0; i < count; ++i)
            end += utf8_put(end, chars[i]);
        uint8_t const *text;
        size_t length;
        if (precompiled_find(map, key, (size_t)(end - key), &text, &length))
            return delayed_replace(list, count, text, length);
    }
    uform_status_t status = UFORM_OK;
    for (uint32_t i = 0; i < count && status == UFORM_OK; ++i)
        status = precompiled_char(map, list, chars[i]);
    return status;
}

/* Extended grapheme cluster boundaries. Two ASCII code points are always apart but for CR LF, and past
 * an ASCII one utf8proc's state is that code point's class, which a fresh state takes from it. */
static bool grapheme_break(uint32_t a, uint32_t b, utf8proc_int32_t *state) {
    if ((a | b) < 0x80) {
        *state = 0;
        return !(a == '\r' && b == '\n');
    }
    return utf8proc_grapheme_break_stateful((utf8proc_int32_t)a, (utf8proc_int32_t)b, state);
}

static uform_status_t precompiled_piece(precompiled_t const *map, pieces_t const *in, size_t index,
                                        pieces_t *out) {
    uint32_t const *chars = pieces_chars(in, index);
    uint32_t size = pieces_size(in, index);
    delayed_t list = {0};
    uform_status_t status = piece_rewrite_begin(&list.rewrite, out, in, index, 0);
    utf8proc_int32_t state = 0;
    for (uint32_t begin = 0, i = 1; i <= size && status == UFORM_OK; ++i) {
        if (i < size && !grapheme_break(chars[i - 1], chars[i], &state)) continue;
        status = precompiled_cluster(map, &list, chars + begin, i - begin);
        begin = i;
    }
    if (status == UFORM_OK && list.pending) status = emit(&list.rewrite, list.ch, list.change);
    if (status == UFORM_OK) piece_rewrite_end(&list.rewrite);
    return status;
}

/* ---- Replace ------------------------------------------------------------------------------------ */

static pthread_once_t onig_once = PTHREAD_ONCE_INIT;
/* onig_new one at a time, as the onig crate holds a global lock around it. */
static pthread_mutex_t onig_compile_lock = PTHREAD_MUTEX_INITIALIZER;

static void onig_start(void) {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
}

/* The content, inserted where the match ends: every code point of it takes the span of the match's last
 * code point, or of the one before an empty match (the empty span at the piece's start before the
 * first). */
static uform_status_t replace_content(replace_t const *replace, pieces_t const *in, size_t index,
                                      uint32_t end, pieces_t *out) {
    piece_span_t span =
        end ? pieces_spans(in, index)[end - 1] : (piece_span_t){in->shifts[index], in->shifts[index]};
    uform_status_t status = UFORM_OK;
    for (size_t i = 0; i < replace->content_size && status == UFORM_OK; ++i)
        status = push(out, replace->content[i], span);
    return status;
}

static uform_status_t copy_range(pieces_t const *in, size_t index, uint32_t begin, uint32_t end,
                                 pieces_t *out) {
    uint32_t const *chars = pieces_chars(in, index);
    piece_span_t const *spans = pieces_spans(in, index);
    uform_status_t status = UFORM_OK;
    for (uint32_t i = begin; i < end && status == UFORM_OK; ++i)
        status = push(out, chars[i], spans[i]);
    return status;
}

/* Code points [begin, end) of the piece matched: what lies between the last match and this one copied,
 * the match replaced. */
typedef struct replacing {
    replace_t const *replace;
    pieces_t const *in;
    size_t index;
    pieces_t *out;
    uint32_t copied; /* code points of the source written or replaced so far */
} replacing_t;

static uform_status_t replacing_match(replacing_t *replacing, uint32_t begin, uint32_t end) {
    uform_status_t status =
        copy_range(replacing->in, replacing->index, replacing->copied, begin, replacing->out);
    if (status == UFORM_OK)
        status = replace_content(replacing->replace, replacing->in, replacing->index, end, replacing->out);
    replacing->copied = end;
    return status;
}

static uform_status_t replace_literal(replacing_t *replacing) {
    uint32_t const *chars = pieces_chars(replacing->in, replacing->index);
    uform_status_t status = UFORM_OK;
    for (uint32_t i = 0, n = pieces_size(replacing->in, replacing->index); i < n && status == UFORM_OK; ++i)
        if (chars[i] == replacing->replace->literal) status = replacing_match(replacing, i, i + 1);
    return status;
}

/* Byte offsets of the UTF-8 text to code point indices, for offsets that only grow. */
typedef struct utf8_cursor {
    uint8_t const *text;
    size_t byte;
    uint32_t index;
} utf8_cursor_t;

static uint32_t cursor_index(utf8_cursor_t *cursor, size_t byte) {
    for (; cursor->byte < byte; cursor->byte++)
        cursor->index += (cursor->text[cursor->byte] & 0xC0) != 0x80;
    return cursor->index;
}

/* onig's find_iter (6.4) over the piece as UTF-8: each search starts where the last match ended; an
 * empty match where the last match ended is skipped, and the search starts a code point further. A
 * failed search (a retry limit) ends the matches. */
typedef struct finder {
    OnigRegex regex;
    OnigRegion *region;
    uint32_t const *chars;
    utf8_cursor_t cursor; /* over the piece's UTF-8 */
    size_t length, from, last_end;
    bool matched;
} finder_t;

/* The next match, as code points [*begin, *end). */
static bool finder_next(finder_t *finder, uint32_t *begin, uint32_t *end) {
    uint8_t const *text = finder->cursor.text, *stop = text + finder->length;
    while (finder->from <= finder->length) {
        onig_region_clear(finder->region);
        if (onig_search(finder->regex, text, stop, text + finder->from, stop, finder->region,
                        ONIG_OPTION_NONE) < 0)
            return false;
        size_t first = (size_t)finder->region->beg[0], last = (size_t)finder->region->end[0];
        if (first == last && finder->matched && last == finder->last_end) {
            bool inside = finder->from < finder->length;
            finder->from +=
                inside ? utf8_size(finder->chars[cursor_index(&finder->cursor, finder->from)]) : 1;
            continue;
        }
        finder->from = finder->last_end = last;
        finder->matched = true;
        *begin = cursor_index(&finder->cursor, first);
        *end = cursor_index(&finder->cursor, last);
        return true;
    }
    return false;
}

static uform_status_t replace_regex(replacing_t *replacing, tokenizer_work_t *work) {
    uint32_t const *chars = pieces_chars(replacing->in, replacing->index);
    uint32_t size = pieces_size(replacing->in, replacing->index);
    uint8_t *text = work_bytes(work, (size_t)size * 4 + 1); /* the piece's chars took as many bytes */
    if (!text) return UFORM_OUT_OF_MEMORY;
    if (!work->region && !(work->region = onig_region_new())) return UFORM_OUT_OF_MEMORY;
    finder_t finder = {
        .regex = replacing->replace->regex, .region = work->region, .chars = chars, .cursor.text = text};
    for (uint32_t i = 0; i < size; ++i)
        finder.length += put_utf8(text + finder.length, chars[i]);
    uform_status_t status = UFORM_OK;
    for (uint32_t begin, end; status == UFORM_OK && finder_next(&finder, &begin, &end);)
        status = replacing_match(replacing, begin, end);
    return status;
}

static uform_status_t replace_piece(replace_t const *replace, pieces_t const *in, size_t index, pieces_t *out,
                                    tokenizer_work_t *work) {
    replacing_t replacing = {.replace = replace, .in = in, .index = index, .out = out};
    uform_status_t status = piece_open(out, in, index);
    if (status == UFORM_OK)
        status = replace->regex ? replace_regex(&replacing, work) : replace_literal(&replacing);
    if (status == UFORM_OK) status = copy_range(in, index, replacing.copied, pieces_size(in, index), out);
    if (status == UFORM_OK) pieces_end(out);
    return status;
}

/* ---- applying ----------------------------------------------------------------------------------- */

static uform_status_t apply_piece(normalizer_t const *normalizer, pieces_t const *in, size_t index,
                                  pieces_t *out, tokenizer_work_t *work) {
    form_t form;
    switch (normalizer->kind) {
    case KIND_BERT:
        return bert_piece(&normalizer->bert, in, index, out, work);
    case KIND_STRIP:
        return strip_piece(normalizer, in, index, out);
    case KIND_STRIP_ACCENTS:
        return strip_accents_piece(in, index, out);
    case KIND_NFC:
    case KIND_NFD:
    case KIND_NFKC:
    case KIND_NFKD:
        form = form_make(out, work, normalizer->kind == KIND_NFKC || normalizer->kind == KIND_NFKD,
                         normalizer->kind == KIND_NFC || normalizer->kind == KIND_NFKC);
        return form_piece(&form, in, index);
    case KIND_LOWERCASE:
        return lowercase_piece(in, index, out);
    case KIND_NMT:
        return nmt_piece(in, index, out);
    case KIND_PRECOMPILED:
        return precompiled_piece(&normalizer->precompiled, in, index, out);
    case KIND_REPLACE:
        return replace_piece(&normalizer->replace, in, index, out, work);
    case KIND_PREPEND:
        return prepend_piece(normalizer, in, index, out);
    default:
        return pieces_copy(out, in, index);
    }
}

static uform_status_t apply_pieces(normalizer_t const *normalizer, pieces_t const *in, pieces_t *out,
                                   tokenizer_work_t *work) {
    uform_status_t status = UFORM_OK;
    for (size_t i = 0; i < in->count && status == UFORM_OK; ++i)
        status =
            in->ids[i] == PIECE_OPEN ? apply_piece(normalizer, in, i, out, work) : pieces_copy(out, in, i);
    return status;
}

/* A sequence (flat: nested ones were spliced in when read) goes through two temporary lists in turn; its
 * last normalizer writes `out`. */
static uform_status_t apply_sequence(normalizer_t const *normalizer, pieces_t const *in, pieces_t *out,
                                     tokenizer_work_t *work) {
    size_t count = normalizer->sequence.count;
    uform_status_t status = UFORM_OK;
    for (size_t i = 0; i < in->count && status == UFORM_OK && count == 0; ++i)
        status = pieces_copy(out, in, i);
    if (count == 0) return status;
    if (count == 1) return apply_pieces(normalizer->sequence.items[0], in, out, work);
    pieces_t *temps[2] = {work_take(work), NULL};
    temps[1] = temps[0] ? work_take(work) : NULL;
    status = temps[1] ? UFORM_OK : UFORM_OUT_OF_MEMORY;
    pieces_t const *from = in;
    for (size_t i = 0; i < count && status == UFORM_OK; ++i) {
        pieces_t *to = i + 1 == count ? out : temps[i % 2];
        if (to != out) pieces_clear(to);
        status = apply_pieces(normalizer->sequence.items[i], from, to, work);
        from = to;
    }
    if (temps[1]) work_give(work);
    if (temps[0]) work_give(work);
    return status;
}

uform_status_t normalizer_apply(normalizer_t const *normalizer, pieces_t const *in, pieces_t *out,
                                tokenizer_work_t *work) {
    if (normalizer->kind == KIND_SEQUENCE) return apply_sequence(normalizer, in, out, work);
    return apply_pieces(normalizer, in, out, work);
}

/* ---- reading ------------------------------------------------------------------------------------ */

/* A struct's fields as serde reads them: by name from an object, or by position from an array, which
 * must then hold exactly `count` elements. */
typedef struct fields {
    json_t const *json;
    char const *what;
} fields_t;

static bool fields_arity(fields_t const *fields, size_t count, tokenizer_fault_t *fault) {
    if (!json_is_array(fields->json) || json_array_size(fields->json) == count) return true;
    tokenizer_fail(fault, UFORM_FORMAT, "%s: an array of %zu fields, not %zu", fields->what, count,
                   json_array_size(fields->json));
    return false;
}

/* The field, or NULL when absent or null. */
static json_t const *field(fields_t const *fields, size_t position, char const *key) {
    json_t const *value = json_is_array(fields->json) ? json_array_get(fields->json, position)
                                                      : json_object_get(fields->json, key);
    return value && !json_is_null(value) ? value : NULL;
}

static uform_status_t field_bool(fields_t const *fields, size_t position, char const *key, bool *value,
                                 tokenizer_fault_t *fault) {
    json_t const *found = field(fields, position, key);
    if (!found) return tokenizer_fail(fault, UFORM_FORMAT, "%s: \"%s\" is missing", fields->what, key);
    if (!json_is_boolean(found))
        return tokenizer_fail(fault, UFORM_FORMAT, "%s: \"%s\" is not a boolean", fields->what, key);
    *value = json_is_true(found);
    return UFORM_OK;
}

static uform_status_t field_string(fields_t const *fields, size_t position, char const *key,
                                   json_t const **value, tokenizer_fault_t *fault) {
    *value = field(fields, position, key);
    if (!*value) return tokenizer_fail(fault, UFORM_FORMAT, "%s: \"%s\" is missing", fields->what, key);
    if (!json_is_string(*value))
        return tokenizer_fail(fault, UFORM_FORMAT, "%s: \"%s\" is not a string", fields->what, key);
    return UFORM_OK;
}

/* A JSON string's code points (NULL for none). */
static uform_status_t decode_string(json_t const *string, uint32_t **chars, size_t *size, char const *what,
                                    tokenizer_fault_t *fault) {
    pieces_t decoded = {0};
    size_t bad = 0;
    uform_status_t status = pieces_from_utf8(&decoded, (uint8_t const *)json_string_value(string),
                                             json_string_length(string), &bad);
    *chars = status == UFORM_OK ? decoded.chars : NULL; /* taken from the list, which frees the rest */
    *size = status == UFORM_OK ? decoded.length : 0;
    if (status == UFORM_OK) decoded.chars = NULL;
    pieces_free(&decoded);
    if (status == UFORM_FORMAT) return tokenizer_fail(fault, UFORM_FORMAT, "%s: a string is not UTF-8", what);
    return status;
}

typedef uform_status_t (*variant_parse_t)(fields_t const *fields, normalizer_t *normalizer,
                                          tokenizer_fault_t *fault, tokenizer_fault_t *scratch);

static void bert_tables(bert_t *bert) {
    for (uint32_t ch = 0; ch < 128; ++ch) {
        int16_t clean = (int16_t)ch;
        if (bert->clean_text && (ch < 0x20 || ch == 0x7F) && ch != '\t' && ch != '\n' && ch != '\r')
            clean = DROPPED;
        else if (bert->clean_text && is_white_space(ch))
            clean = ' ';
        bert->clean[ch] = clean;
        bert->whole[ch] =
            bert->lowercase && clean >= 'A' && clean <= 'Z' ? (int16_t)(clean + ('a' - 'A')) : clean;
    }
}

static uform_status_t parse_bert(fields_t const *fields, normalizer_t *normalizer, tokenizer_fault_t *fault,
                                 tokenizer_fault_t *scratch) {
    (void)scratch;
    bert_t *bert = &normalizer->bert;
    if (!fields_arity(fields, 4, fault)) return UFORM_FORMAT;
    uform_status_t status = field_bool(fields, 0, "clean_text", &bert->clean_text, fault);
    if (status == UFORM_OK) status = field_bool(fields, 1, "handle_chinese_chars", &bert->chinese, fault);
    if (status == UFORM_OK) status = field_bool(fields, 3, "lowercase", &bert->lowercase, fault);
    if (status != UFORM_OK) return status;
    json_t const *strip = field(fields, 2, "strip_accents");
    if (strip && !json_is_boolean(strip))
        return tokenizer_fail(fault, UFORM_FORMAT, "BertNormalizer: \"strip_accents\" is not a boolean");
    bert->strip_accents = strip ? json_is_true(strip) : bert->lowercase; /* null follows lowercase */
    normalizer->kind = KIND_BERT;
    bert_tables(bert);
    return UFORM_OK;
}

static uform_status_t parse_strip(fields_t const *fields, normalizer_t *normalizer, tokenizer_fault_t *fault,
                                  tokenizer_fault_t *scratch) {
    (void)scratch;
    if (!fields_arity(fields, 2, fault)) return UFORM_FORMAT;
    uform_status_t status = field_bool(fields, 0, "strip_left", &normalizer->strip.left, fault);
    if (status == UFORM_OK) status = field_bool(fields, 1, "strip_right", &normalizer->strip.right, fault);
    if (status == UFORM_OK) normalizer->kind = KIND_STRIP;
    return status;
}

/* ---- reading Precompiled ---- */

static int base64_value(uint8_t c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

/* Standard base64 as the base64 crate 0.13 decodes it (spm_precompiled's): padding optional, but only
 * the last quantum's third and fourth symbols may be '='; a length of 4n + 1 and bits left in the last
 * symbol are refused. Answers the size decoded, or -1. */
static long long base64_decode(uint8_t const *text, size_t length, uint8_t *bytes) {
    size_t symbols = length;
    while (symbols && text[symbols - 1] == '=')
        symbols--;
    if (length % 4 == 1 || (symbols < length && (symbols % 4 < 2 || length > symbols + (4 - symbols % 4))))
        return -1;
    uint32_t bits = 0;
    size_t size = 0;
    for (size_t i = 0; i < symbols; ++i) {
        int value = base64_value(text[i]);
        if (value < 0) return -1;
        bits = bits << 6 | (uint32_t)value;
        if (i % 4 == 3)
            bytes[size++] = (uint8_t)(bits >> 16), bytes[size++] = (uint8_t)(bits >> 8),
            bytes[size++] = (uint8_t)bits;
    }
    if (symbols % 4 == 2 && (bits & 0xF)) return -1;
    if (symbols % 4 == 3 && (bits & 0x3)) return -1;
    if (symbols % 4 == 2) bytes[size++] = (uint8_t)(bits >> 4);
    if (symbols % 4 == 3) bytes[size++] = (uint8_t)(bits >> 10), bytes[size++] = (uint8_t)(bits >> 2);
    return (long long)size;
}

static void precompiled_free(precompiled_t *map) {
    free(map->units);
    free(map->charsmap);
}

/* The charsmap: a little-endian u32 trie size in bytes, the trie's units, then the replacements, which
 * must be UTF-8 (NULs included). */
static uform_status_t precompiled_read(precompiled_t *map, size_t size, tokenizer_fault_t *fault) {
    uint8_t const *bytes = map->charsmap;
    if (size < 4) return tokenizer_fail(fault, UFORM_FORMAT, "Precompiled: the charsmap has no trie size");
    size_t count = (size_t)(bytes[0] | bytes[1] << 8 | bytes[2] << 16 | (uint32_t)bytes[3] << 24) / 4;
    if (count > (size - 4) / 4)
        return tokenizer_fail(fault, UFORM_FORMAT, "Precompiled: the trie runs past the charsmap");
    if (!(map->units = malloc(count ? count * sizeof *map->units : 1))) return UFORM_OUT_OF_MEMORY;
    for (size_t i = 0; i < count; ++i) {
        uint8_t const *unit = bytes + 4 + 4 * i;
        map->units[i] = unit[0] | unit[1] << 8 | unit[2] << 16 | (uint32_t)unit[3] << 24;
    }
    map->unit_count = count;
    map->normalized = bytes + 4 + 4 * count;
    map->normalized_size = size - 4 - 4 * count;
    pieces_t check = {0};
    size_t bad = 0;
    uform_status_t status = pieces_from_utf8(&check, map->normalized, map->normalized_size, &bad);
    pieces_free(&check);
    if (status == UFORM_FORMAT)
        return tokenizer_fail(fault, UFORM_FORMAT, "Precompiled: the replacements are not UTF-8 (byte %zu)",
                              bad);
    return status;
}

static void precompiled_ascii(precompiled_t *map) {
    for (uint8_t ch = 0; ch < 128; ++ch) {
        uint8_t const *text;
        size_t length;
        map->ascii[ch] = -1;
        if (precompiled_find(map, &ch, 1, &text, &length)) map->ascii[ch] = (int32_t)(text - map->normalized);
    }
}

static uform_status_t parse_precompiled(fields_t const *fields, normalizer_t *normalizer,
                                        tokenizer_fault_t *fault, tokenizer_fault_t *scratch) {
    (void)scratch;
    json_t const *encoded;
    if (!fields_arity(fields, 1, fault)) return UFORM_FORMAT;
    uform_status_t status = field_string(fields, 0, "precompiled_charsmap", &encoded, fault);
    if (status != UFORM_OK) return status;
    precompiled_t map = {0};
    size_t length = json_string_length(encoded);
    if (!(map.charsmap = malloc(length / 4 * 3 + 3))) return UFORM_OUT_OF_MEMORY;
    long long size = base64_decode((uint8_t const *)json_string_value(encoded), length, map.charsmap);
    if (size < 0)
        status = tokenizer_fail(fault, UFORM_FORMAT, "Precompiled: \"precompiled_charsmap\" is not base64");
    if (status == UFORM_OK) status = precompiled_read(&map, (size_t)size, fault);
    if (status == UFORM_OK && map.normalized_size > INT32_MAX)
        status = tokenizer_fail(fault, UFORM_FORMAT, "Precompiled: the charsmap is too large");
    if (status != UFORM_OK) {
        precompiled_free(&map);
        return status;
    }
    precompiled_ascii(&map);
    normalizer->precompiled = map;
    normalizer->kind = KIND_PRECOMPILED;
    return UFORM_OK;
}

/* ---- reading Replace ---- */

/* A literal goes through onig as plain text (tokenizers escapes it as a regex). */
static uform_status_t regex_compile(json_t const *pattern, bool literal, OnigRegex *regex,
                                    tokenizer_fault_t *fault) {
    pthread_once(&onig_once, onig_start);
    OnigErrorInfo info = {0};
    OnigUChar const *text = (OnigUChar const *)json_string_value(pattern);
    pthread_mutex_lock(&onig_compile_lock);
    int code = onig_new(regex, text, text + json_string_length(pattern), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8,
                        literal ? ONIG_SYNTAX_ASIS : ONIG_SYNTAX_DEFAULT, &info);
    pthread_mutex_unlock(&onig_compile_lock);
    if (code == ONIG_NORMAL) return UFORM_OK;
    *regex = NULL;
    if (code == ONIGERR_MEMORY) return UFORM_OUT_OF_MEMORY;
    OnigUChar message[ONIG_MAX_ERROR_MESSAGE_LEN];
    onig_error_code_to_str(message, code, &info);
    return tokenizer_fail(fault, UFORM_FORMAT, "Replace: bad regex: %s", (char const *)message);
}

/* ReplacePattern, an externally tagged enum: {"String": "..."} or {"Regex": "..."}. */
static uform_status_t replace_pattern(json_t const *pattern, replace_t *replace, tokenizer_fault_t *fault) {
    char const *tag = json_is_object(pattern) && json_object_size(pattern) == 1
                          ? json_object_iter_key(json_object_iter((json_t *)pattern))
                          : NULL;
    bool literal = tag && strcmp(tag, "String") == 0;
    json_t const *value = tag ? json_object_get(pattern, tag) : NULL;
    if (!tag || (!literal && strcmp(tag, "Regex") != 0) || !json_is_string(value))
        return tokenizer_fail(fault, UFORM_FORMAT,
                              "Replace: \"pattern\" is not {\"String\": ...} or {\"Regex\": ...}");
    if (literal) {
        uint32_t *chars;
        size_t size;
        uform_status_t status = decode_string(value, &chars, &size, "Replace", fault);
        if (status == UFORM_OK && size == 1) replace->literal = chars[0];
        free(chars);
        if (status != UFORM_OK || size == 1) return status;
    }
    return regex_compile(value, literal, &replace->regex, fault);
}

static void replace_free(replace_t *replace) {
    if (replace->regex) onig_free(replace->regex);
    free(replace->content);
}

static uform_status_t parse_replace(fields_t const *fields, normalizer_t *normalizer,
                                    tokenizer_fault_t *fault, tokenizer_fault_t *scratch) {
    (void)scratch;
    json_t const *pattern = field(fields, 0, "pattern"), *content;
    if (!fields_arity(fields, 2, fault)) return UFORM_FORMAT;
    if (!pattern) return tokenizer_fail(fault, UFORM_FORMAT, "Replace: \"pattern\" is missing");
    uform_status_t status = field_string(fields, 1, "content", &content, fault);
    replace_t replace = {0};
    if (status == UFORM_OK) status = replace_pattern(pattern, &replace, fault);
    if (status == UFORM_OK)
        status = decode_string(content, &replace.content, &replace.content_size, "Replace", fault);
    if (status != UFORM_OK) {
        replace_free(&replace);
        return status;
    }
    normalizer->replace = replace;
    normalizer->kind = KIND_REPLACE;
    return UFORM_OK;
}

static uform_status_t parse_prepend(fields_t const *fields, normalizer_t *normalizer,
                                    tokenizer_fault_t *fault, tokenizer_fault_t *scratch) {
    (void)scratch;
    json_t const *prepend;
    if (!fields_arity(fields, 1, fault)) return UFORM_FORMAT;
    uform_status_t status = field_string(fields, 0, "prepend", &prepend, fault);
    if (status == UFORM_OK)
        status =
            decode_string(prepend, &normalizer->prepend.chars, &normalizer->prepend.size, "Prepend", fault);
    if (status == UFORM_OK) normalizer->kind = KIND_PREPEND;
    return status;
}

/* ---- reading the unit variants and Sequence ---- */

/* StripAccents, NFC, NFD, NFKC, NFKD, Lowercase, Nmt: their "type" (or an array of it alone) must name
 * them. */
static uform_status_t parse_unit(fields_t const *fields, normalizer_t *normalizer, normalizer_kind_t kind,
                                 tokenizer_fault_t *fault) {
    json_t const *type = field(fields, 0, "type");
    if (!fields_arity(fields, 1, fault)) return UFORM_FORMAT;
    if (!type || !json_is_string(type) || strcmp(json_string_value(type), kind_names[kind]) != 0)
        return tokenizer_fail(fault, UFORM_FORMAT, "%s: \"type\" is not \"%s\"", kind_names[kind],
                              kind_names[kind]);
    normalizer->kind = kind;
    return UFORM_OK;
}

#define UNIT_PARSER(name, kind)                                                                              \
    static uform_status_t name(fields_t const *fields, normalizer_t *normalizer, tokenizer_fault_t *fault,   \
                               tokenizer_fault_t *scratch) {                                                 \
        (void)scratch;                                                                                       \
        return parse_unit(fields, normalizer, kind, fault);                                                  \
    }
UNIT_PARSER(parse_strip_accents, KIND_STRIP_ACCENTS)
UNIT_PARSER(parse_nfc, KIND_NFC)
UNIT_PARSER(parse_nfd, KIND_NFD)
UNIT_PARSER(parse_nfkc, KIND_NFKC)
UNIT_PARSER(parse_nfkd, KIND_NFKD)
UNIT_PARSER(parse_lowercase, KIND_LOWERCASE)
UNIT_PARSER(parse_nmt, KIND_NMT)

static uform_status_t parse_one(json_t const *json, normalizer_t **normalizer, tokenizer_fault_t *fault,
                                tokenizer_fault_t *scratch);

/* Appends `child` to the sequence, or its own items when it is a sequence (it is freed then). */
static uform_status_t sequence_add(normalizer_t *sequence, normalizer_t *child, size_t *capacity) {
    bool splice = child->kind == KIND_SEQUENCE;
    size_t adding = splice ? child->sequence.count : 1;
    size_t count = sequence->sequence.count;
    if (count + adding > *capacity) {
        size_t next = (count + adding) * 2;
        normalizer_t **items = realloc(sequence->sequence.items, next * sizeof *items);
        if (!items) return UFORM_OUT_OF_MEMORY;
        sequence->sequence.items = items;
        *capacity = next;
    }
    if (!splice) {
        sequence->sequence.items[sequence->sequence.count++] = child;
        return UFORM_OK;
    }
    if (adding)
        memcpy(sequence->sequence.items + count, child->sequence.items,
               adding * sizeof *child->sequence.items);
    sequence->sequence.count += adding;
    free(child->sequence.items);
    free(child);
    return UFORM_OK;
}

static uform_status_t parse_sequence(fields_t const *fields, normalizer_t *normalizer,
                                     tokenizer_fault_t *fault, tokenizer_fault_t *scratch) {
    json_t const *list = field(fields, 0, "normalizers");
    if (!fields_arity(fields, 1, fault)) return UFORM_FORMAT;
    if (!list || !json_is_array(list))
        return tokenizer_fail(fault, UFORM_FORMAT, "Sequence: \"normalizers\" is not an array");
    normalizer_t sequence = {.kind = KIND_SEQUENCE};
    size_t capacity = 0;
    uform_status_t status = UFORM_OK;
    for (size_t i = 0; i < json_array_size(list) && status == UFORM_OK; ++i) {
        normalizer_t *child = NULL;
        status = parse_one(json_array_get(list, i), &child, fault, scratch);
        if (status == UFORM_OK) status = sequence_add(&sequence, child, &capacity);
        if (status != UFORM_OK) normalizer_free(child);
    }
    if (status != UFORM_OK) {
        for (size_t i = 0; i < sequence.sequence.count; ++i)
            normalizer_free(sequence.sequence.items[i]);
        free(sequence.sequence.items);
        return status;
    }
    *normalizer = sequence;
    return UFORM_OK;
}

static variant_parse_t const variant_parsers[KIND_COUNT] = {
    parse_bert,        parse_strip,   parse_strip_accents, parse_nfc,       parse_nfd,
    parse_nfkc,        parse_nfkd,    parse_sequence,      parse_lowercase, parse_nmt,
    parse_precompiled, parse_replace, parse_prepend,
};

/* The variant an object's "type" names, or KIND_COUNT. */
static normalizer_kind_t named_kind(json_t const *json) {
    json_t const *type = json_is_object(json) ? json_object_get(json, "type") : NULL;
    if (!type || !json_is_string(type)) return KIND_COUNT;
    for (int kind = 0; kind < KIND_COUNT; ++kind)
        if (strcmp(json_string_value(type), kind_names[kind]) == 0) return (normalizer_kind_t)kind;
    return KIND_COUNT;
}

/* Why no variant took it: the named variant's fault (already in `fault`), an unknown type, or no type. */
static uform_status_t parse_failure(json_t const *json, normalizer_kind_t named, uform_status_t named_status,
                                    tokenizer_fault_t *fault) {
    if (named != KIND_COUNT) return named_status;
    if (!json_is_object(json) && !json_is_array(json))
        return tokenizer_fail(fault, UFORM_FORMAT, "normalizer is not an object");
    json_t const *type = json_is_object(json) ? json_object_get(json, "type") : NULL;
    if (type && json_is_string(type))
        return tokenizer_fail(fault, UFORM_UNSUPPORTED, "normalizer: unsupported type \"%s\"",
                              json_string_value(type));
    if (json_is_array(json))
        return tokenizer_fail(fault, UFORM_FORMAT, "normalizer: the array fits no normalizer");
    return tokenizer_fail(fault, UFORM_FORMAT, "normalizer has no \"type\" string");
}

/* serde's untagged enum: each variant in turn, the first that reads wins. The named variant reports its
 * fault into `fault`, the others into `scratch`. */
static uform_status_t parse_one(json_t const *json, normalizer_t **normalizer, tokenizer_fault_t *fault,
                                tokenizer_fault_t *scratch) {
    normalizer_kind_t named = named_kind(json);
    uform_status_t named_status = UFORM_FORMAT;
    normalizer_t *made = calloc(1, sizeof *made);
    if (!made) return tokenizer_fail(fault, UFORM_OUT_OF_MEMORY, "normalizer: out of memory");
    for (int kind = 0; kind < KIND_COUNT && (json_is_object(json) || json_is_array(json)); ++kind) {
        fields_t fields = {.json = json, .what = kind_names[kind]};
        uform_status_t status =
            variant_parsers[kind](&fields, made, kind == (int)named ? fault : scratch, scratch);
        if (status == UFORM_OK) {
            *normalizer = made;
            return UFORM_OK;
        }
        if (status == UFORM_OUT_OF_MEMORY) {
            free(made);
            return tokenizer_fail(fault, UFORM_OUT_OF_MEMORY, "normalizer: out of memory");
        }
        if (kind == (int)named) named_status = status;
    }
    free(made);
    return parse_failure(json, named, named_status, fault);
}

uform_status_t normalizer_parse(json_t const *object, normalizer_t **normalizer, tokenizer_fault_t *fault) {
    tokenizer_fault_t scratch;
    *normalizer = NULL;
    return parse_one(object, normalizer, fault, &scratch);
}

void normalizer_free(normalizer_t *normalizer) {
    if (!normalizer) return;
    switch (normalizer->kind) {
    case KIND_SEQUENCE:
        for (size_t i = 0; i < normalizer->sequence.count; ++i)
            normalizer_free(normalizer->sequence.items[i]);
        free(normalizer->sequence.items);
        break;
    case KIND_PRECOMPILED:
        precompiled_free(&normalizer->precompiled);
        break;
    case KIND_REPLACE:
        replace_free(&normalizer->replace);
        break;
    case KIND_PREPEND:
        free(normalizer->prepend.chars);
        break;
    default:
        break;
    }
    free(normalizer);
}
