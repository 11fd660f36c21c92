/* Added tokens: tokenizer.json's "added_tokens", given ids as tokenizers' AddedVocabulary gives them,
 * and found in a text before anything else cuts it. tokenizers builds two Aho-Corasick automata
 * (leftmost-longest) over the contents, one over the raw text for tokens with `normalized: false`, one
 * over the normalizer's output for the others (their contents normalized first); here each set is a
 * list sorted by first code point, scanned left to right, longest match first, which finds the same
 * non-overlapping matches. A model's vocabulary of added tokens is small (a few to a few hundred). */
#include <stdlib.h>
#include <string.h>

#include <oniguruma.h>
#include <utf8proc.h>

#include "tokenizer.h"

/* Rust regex's `\w`: Alphabetic, marks, decimal digits, connector punctuation, joiners (utf8proc's
 * categories; Alphabetic's few symbols, such as circled letters, are not words here). */
static bool is_word(uint32_t ch) {
    if (ch < 0x80)
        return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_';
    if (ch == 0x200C || ch == 0x200D) return true;
    switch (utf8proc_category((utf8proc_int32_t)ch)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
        return true;
    default:
        return false;
    }
}

static void set_free(added_set_t *set) {
    for (size_t i = 0; i < set->count; ++i)
        free(set->patterns[i].chars);
    free(set->patterns);
    *set = (added_set_t){0};
}

void added_tokens_free(added_tokens_t *added) {
    set_free(&added->raw);
    set_free(&added->normalized);
    for (size_t i = 0; i < added->strings_count; ++i)
        free(added->strings[i].content);
    free(added->strings);
    added->strings = NULL;
    added->strings_count = 0;
}

static int string_order(void const *a, void const *b) {
    added_string_t const *x = a, *y = b;
    return x->id < y->id ? -1 : x->id > y->id;
}

char const *added_tokens_string(added_tokens_t const *added, uint32_t id, size_t *length) {
    added_string_t key = {.id = id};
    added_string_t const *found =
        added->strings_count ? bsearch(&key, added->strings, added->strings_count, sizeof key, string_order)
                             : NULL;
    if (!found) return NULL;
    *length = found->length;
    return found->content;
}

/* Keeps the content of an entry whose id no earlier entry took (tokenizers' added_tokens_map_r keeps the
 * first content given an id). */
static uform_status_t string_keep(added_tokens_t *added, char const *content, size_t length, uint32_t id) {
    for (size_t i = 0; i < added->strings_count; ++i)
        if (added->strings[i].id == id) return UFORM_OK;
    char *copy = malloc(length + 1);
    if (!copy) return UFORM_OUT_OF_MEMORY;
    memcpy(copy, content, length);
    copy[length] = '\0';
    added->strings[added->strings_count++] =
        (added_string_t){.id = id, .length = (uint32_t)length, .content = copy};
    return UFORM_OK;
}

static int pattern_order(void const *a, void const *b) {
    added_pattern_t const *x = a, *y = b;
    if (x->chars[0] != y->chars[0]) return x->chars[0] < y->chars[0] ? -1 : 1;
    if (x->size != y->size) return x->size > y->size ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* One token as read from the file. */
typedef struct added_entry {
    char const *content;
    size_t length;
    bool single_word, lstrip, rstrip, normalized, special;
} added_entry_t;

static uform_status_t entry_parse(json_t const *object, added_entry_t *entry, tokenizer_fault_t *fault) {
    static char const what[] = "added token";
    if (!json_is_object(object))
        return tokenizer_fail(fault, UFORM_FORMAT, "added_tokens: an entry is not an object");
    uform_status_t status =
        json_get_string(object, "content", NULL, &entry->content, &entry->length, what, fault);
    if (status == UFORM_OK && !entry->content)
        return tokenizer_fail(fault, UFORM_FORMAT, "added_tokens: an entry has no \"content\"");
    if (status == UFORM_OK)
        status = json_get_bool(object, "single_word", false, &entry->single_word, what, fault);
    if (status == UFORM_OK) status = json_get_bool(object, "lstrip", false, &entry->lstrip, what, fault);
    if (status == UFORM_OK) status = json_get_bool(object, "rstrip", false, &entry->rstrip, what, fault);
    if (status == UFORM_OK) status = json_get_bool(object, "special", false, &entry->special, what, fault);
    if (status == UFORM_OK)
        status = json_get_bool(object, "normalized", !entry->special, &entry->normalized, what, fault);
    return status;
}

/* The code points of `piece` 0 of `pieces` into a new pattern. */
static uform_status_t pattern_from(pieces_t const *pieces, added_entry_t const *entry, uint32_t id,
                                   added_pattern_t *pattern) {
    uint32_t size = pieces->count ? pieces_size(pieces, 0) : 0;
    *pattern = (added_pattern_t){.size = size,
                                 .id = id,
                                 .single_word = entry->single_word,
                                 .lstrip = entry->lstrip,
                                 .rstrip = entry->rstrip};
    if (!size) return UFORM_OK;
    pattern->chars = malloc(size * sizeof *pattern->chars);
    if (!pattern->chars) return UFORM_OUT_OF_MEMORY;
    memcpy(pattern->chars, pieces_chars(pieces, 0), size * sizeof *pattern->chars);
    return UFORM_OK;
}

/* The id tokenizers gives a token: its content's id among the added tokens met so far, else in the
 * model's vocabulary, else the next after both. */
static uint32_t entry_id(added_entry_t const *entries, uint32_t const *ids, size_t index,
                         vocab_t const *vocab, uint32_t *next_id) {
    for (size_t i = 0; i < index; ++i)
        if (entries[i].length == entries[index].length &&
            memcmp(entries[i].content, entries[index].content, entries[index].length) == 0)
            return ids[i];
    int64_t found = vocab_find(vocab, entries[index].content, entries[index].length);
    if (found >= 0) return (uint32_t)found;
    return (*next_id)++;
}

/* Adds the pattern of entry `entry` to `set`, its content normalized first when asked. An empty
 * content (as given, or once normalized) matches nothing: tokenizers ignores the first, and the
 * second would match everywhere. */
static uform_status_t set_add(added_set_t *set, added_entry_t const *entry, uint32_t id,
                              normalizer_t const *normalizer, tokenizer_work_t *work) {
    pieces_t *raw = work_take(work), *normal = work_take(work);
    size_t bad;
    uform_status_t status = pieces_from_utf8(raw, (uint8_t const *)entry->content, entry->length, &bad);
    pieces_t *source = raw;
    if (status == UFORM_OK && entry->normalized && normalizer) {
        status = normalizer_apply(normalizer, raw, normal, work);
        source = normal;
    }
    added_pattern_t pattern = {0};
    if (status == UFORM_OK) status = pattern_from(source, entry, id, &pattern);
    if (status == UFORM_OK && pattern.size) set->patterns[set->count++] = pattern;
    work_give(work);
    work_give(work);
    return status;
}

uform_status_t added_tokens_parse(json_t const *array, model_t const *model, normalizer_t const *normalizer,
                                  added_tokens_t *added, tokenizer_fault_t *fault) {
    vocab_t const *vocab = model_vocab(model);
    *added = (added_tokens_t){.next_id = (uint32_t)vocab->count};
    if (!array || json_is_null(array)) return UFORM_OK;
    if (!json_is_array(array)) return tokenizer_fail(fault, UFORM_FORMAT, "\"added_tokens\" is not an array");
    size_t count = json_array_size(array);
    added_entry_t *entries = calloc(count + 1, sizeof *entries);
    uint32_t *ids = calloc(count + 1, sizeof *ids);
    added->raw.patterns = calloc(count + 1, sizeof *added->raw.patterns);
    added->normalized.patterns = calloc(count + 1, sizeof *added->normalized.patterns);
    added->strings = calloc(count + 1, sizeof *added->strings);
    tokenizer_work_t work = {0};
    uform_status_t status = UFORM_OK;
    if (!entries || !ids || !added->raw.patterns || !added->normalized.patterns || !added->strings)
        status = UFORM_OUT_OF_MEMORY;
    for (size_t i = 0; i < count && status == UFORM_OK; ++i) {
        status = entry_parse(json_array_get(array, i), &entries[i], fault);
        if (status != UFORM_OK || entries[i].length == 0) continue;
        ids[i] = entry_id(entries, ids, i, vocab, &added->next_id);
        status = string_keep(added, entries[i].content, entries[i].length, ids[i]);
        if (status == UFORM_OK)
            status = set_add(entries[i].normalized ? &added->normalized : &added->raw, &entries[i], ids[i],
                             normalizer, &work);
        if (status == UFORM_FORMAT)
            status = tokenizer_fail(fault, UFORM_FORMAT, "added_tokens: content is not UTF-8");
    }
    for (size_t t = 0; t < TOKENIZER_WORK_TEMPS; ++t)
        pieces_free(&work.temps[t]);
    free(work.bytes);
    if (work.region) onig_region_free(work.region, 1); /* a Replace normalizer's searches made it */
    free(entries);
    free(ids);
    if (status == UFORM_OUT_OF_MEMORY) status = tokenizer_fail(fault, status, "added_tokens: out of memory");
    if (status != UFORM_OK) {
        added_tokens_free(added);
        return status;
    }
    qsort(added->strings, added->strings_count, sizeof *added->strings, string_order);
    qsort(added->raw.patterns, added->raw.count, sizeof *added->raw.patterns, pattern_order);
    qsort(added->normalized.patterns, added->normalized.count, sizeof *added->normalized.patterns,
          pattern_order);
    return UFORM_OK;
}

/* The longest pattern matching `chars` at `at`, or NULL. */
static added_pattern_t const *match_at(added_set_t const *set, uint32_t const *chars, uint32_t size,
                                       uint32_t at) {
    size_t low = 0, high = set->count;
    while (low < high) {
        size_t middle = (low + high) / 2;
        if (set->patterns[middle].chars[0] < chars[at])
            low = middle + 1;
        else
            high = middle;
    }
    for (size_t i = low; i < set->count && set->patterns[i].chars[0] == chars[at]; ++i) {
        added_pattern_t const *pattern = &set->patterns[i];
        if (pattern->size <= size - at &&
            memcmp(pattern->chars, chars + at, pattern->size * sizeof *chars) == 0)
            return pattern;
    }
    return NULL;
}

/* Emits a piece for source code points [begin, end) of piece `index`, as an added token when `id`
 * is not PIECE_OPEN (tokenizers' split_with_indices: a slice, its spans kept). */
static uform_status_t emit(pieces_t *out, pieces_t const *in, size_t index, uint32_t begin, uint32_t end,
                           int32_t id) {
    if (id == PIECE_OPEN) return pieces_emit_range(out, in, index, begin, end);
    size_t first = out->count;
    uform_status_t status = pieces_emit_range(out, in, index, begin, end);
    if (status == UFORM_OK && out->count > first) out->ids[first] = id;
    return status;
}

/* tokenizers' find_matches over one open piece. */
static uform_status_t split_piece(added_set_t const *set, pieces_t const *in, size_t index, pieces_t *out) {
    uint32_t const *chars = pieces_chars(in, index);
    uint32_t size = pieces_size(in, index), start_offset = 0;
    uform_status_t status = UFORM_OK;
    for (uint32_t at = 0; at < size && status == UFORM_OK;) {
        added_pattern_t const *pattern = match_at(set, chars, size, at);
        if (!pattern) {
            at++;
            continue;
        }
        uint32_t start = at, stop = at + pattern->size;
        at = stop; /* the automaton goes on after the match, whatever is made of it */
        if (pattern->single_word &&
            ((start > 0 && is_word(chars[start - 1])) || (stop < size && is_word(chars[stop]))))
            continue;
        if (pattern->lstrip) {
            uint32_t left = start;
            while (left > 0 && white_space(chars[left - 1]))
                left--;
            start = left > start_offset ? left : start_offset;
        }
        if (pattern->rstrip)
            while (stop < size && white_space(chars[stop]))
                stop++;
        if (start_offset < start) status = emit(out, in, index, start_offset, start, PIECE_OPEN);
        if (status == UFORM_OK) status = emit(out, in, index, start, stop, (int32_t)pattern->id);
        start_offset = stop;
    }
    if (status == UFORM_OK && start_offset < size)
        status = emit(out, in, index, start_offset, size, PIECE_OPEN);
    return status;
}

uform_status_t added_tokens_split(added_set_t const *set, pieces_t const *in, pieces_t *out) {
    uform_status_t status = UFORM_OK;
    for (size_t i = 0; i < in->count && status == UFORM_OK; ++i)
        status = in->ids[i] == PIECE_OPEN ? split_piece(set, in, i, out) : pieces_copy(out, in, i);
    return status;
}
