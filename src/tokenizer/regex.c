/* Oniguruma for the tokenizers: one initialization per process, patterns compiled as tokenizers'
 * SysRegex compiles them (regex.h), and the segments of a piece's code points as its find_matches
 * cuts them.
 *
 * The text is searched as UTF-8, as tokenizers searches it: patterns that name raw bytes (\xE2\x96\x81)
 * match as there, and Oniguruma is faster over UTF-8 than over UTF-32 (1.2 to 2 times, on Llama 3's
 * and GPT-2's patterns). Byte offsets come back to code-point indices through a cursor that only moves
 * forward, since segments come in order. */
#include <oniguruma.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "regex.h"

struct tokenizer_regex {
    OnigRegex onig;  /* NULL for a literal of one code point, */
    uint32_t single; /* which a scan finds */
};

static pthread_once_t onig_once = PTHREAD_ONCE_INIT;
static uform_status_t onig_status = UFORM_INTERNAL;
/* The onig crate compiles under a lock of its own too: onig_new shares tables between compilations. */
static pthread_mutex_t compile_lock = PTHREAD_MUTEX_INITIALIZER;

static void onig_init_once(void) {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_status = onig_initialize(encodings, 1) == ONIG_NORMAL ? UFORM_OK : UFORM_INTERNAL;
}

uform_status_t tokenizer_onig_init(void) {
    if (pthread_once(&onig_once, onig_init_once) != 0) return UFORM_INTERNAL;
    return onig_status;
}

/* The regex crate's escape: these characters, and only these, get a backslash. */
static bool is_meta_character(char ch) {
    return ch && strchr("\\.+*?()|[]{}^$#&-~", ch);
}

/* The pattern, escaped for `literal`, into a new string of `*size` bytes. */
static uform_status_t copy_pattern(char const *pattern, size_t length, bool literal, char **copy,
                                   size_t *size, char const *what, tokenizer_fault_t *fault) {
    for (size_t at = 0; at < length;) {
        utf8proc_int32_t ch;
        utf8proc_ssize_t used =
            utf8proc_iterate((utf8proc_uint8_t const *)pattern + at, (utf8proc_ssize_t)(length - at), &ch);
        if (used <= 0) return tokenizer_fail(fault, UFORM_FORMAT, "%s: the pattern is not UTF-8", what);
        at += (size_t)used;
    }
    char *out = malloc(2 * length + 1);
    if (!out) return tokenizer_fail(fault, UFORM_OUT_OF_MEMORY, "%s: out of memory", what);
    size_t count = 0;
    for (size_t at = 0; at < length; ++at) {
        if (literal && is_meta_character(pattern[at])) out[count++] = '\\';
        out[count++] = pattern[at];
    }
    *copy = out;
    *size = count;
    return UFORM_OK;
}

/* The code point a pattern is, when it is one alone. */
static bool one_code_point(char const *pattern, size_t length, uint32_t *ch) {
    utf8proc_int32_t value = -1;
    utf8proc_ssize_t used =
        utf8proc_iterate((utf8proc_uint8_t const *)pattern, (utf8proc_ssize_t)length, &value);
    if (length == 0 || used != (utf8proc_ssize_t)length) return false;
    *ch = (uint32_t)value;
    return true;
}

static uform_status_t onig_compile(char const *pattern, size_t length, bool literal, OnigRegex *onig,
                                   char const *what, tokenizer_fault_t *fault) {
    if (tokenizer_onig_init() != UFORM_OK)
        return tokenizer_fail(fault, UFORM_INTERNAL, "%s: Oniguruma could not be initialized", what);
    char *copy = NULL;
    size_t size = 0;
    uform_status_t status = copy_pattern(pattern, length, literal, &copy, &size, what, fault);
    if (status != UFORM_OK) return status;
    OnigErrorInfo info = {0};
    OnigUChar const *begin = (OnigUChar const *)copy;
    pthread_mutex_lock(&compile_lock);
    int result =
        onig_new(onig, begin, begin + size, ONIG_OPTION_NONE, ONIG_ENCODING_UTF8, ONIG_SYNTAX_DEFAULT, &info);
    pthread_mutex_unlock(&compile_lock);
    if (result == ONIG_NORMAL) {
        free(copy);
        return UFORM_OK;
    }
    *onig = NULL;
    OnigUChar message[ONIG_MAX_ERROR_MESSAGE_LEN];
    onig_error_code_to_str(message, result, &info); /* before the copy goes: `info` may point into it */
    free(copy);
    if (result == ONIGERR_MEMORY)
        return tokenizer_fail(fault, UFORM_OUT_OF_MEMORY, "%s: out of memory", what);
    return tokenizer_fail(fault, UFORM_FORMAT, "%s: bad regular expression: %s", what, (char const *)message);
}

uform_status_t tokenizer_regex_compile(char const *pattern, size_t length, bool literal,
                                       tokenizer_regex_t **regex, char const *what,
                                       tokenizer_fault_t *fault) {
    tokenizer_regex_t *made = calloc(1, sizeof *made);
    *regex = NULL;
    if (!made) return tokenizer_fail(fault, UFORM_OUT_OF_MEMORY, "%s: out of memory", what);
    uform_status_t status = UFORM_OK;
    if (!literal || !one_code_point(pattern, length, &made->single))
        status = onig_compile(pattern, length, literal, &made->onig, what, fault);
    if (status == UFORM_OK)
        *regex = made;
    else
        free(made);
    return status;
}

void tokenizer_regex_free(tokenizer_regex_t *regex) {
    if (!regex) return;
    if (regex->onig) onig_free(regex->onig);
    free(regex);
}

uform_status_t tokenizer_regex_segments_begin(tokenizer_regex_segments_t *segments,
                                              tokenizer_regex_t const *regex, uint32_t const *chars,
                                              uint32_t size, tokenizer_work_t *work) {
    *segments =
        (tokenizer_regex_segments_t){.regex = regex, .chars = chars, .size = size, .last_match_end = -1};
    if (size == 0) {
        /* find_matches answers an empty text with one empty run, unsearched. */
        segments->done = true;
        segments->match_pending = true;
        return UFORM_OK;
    }
    if (!regex->onig) return UFORM_OK; /* a literal of one code point: scanned for in `chars` */
    if (!work->region && !(work->region = onig_region_new())) return UFORM_OUT_OF_MEMORY;
    segments->region = work->region;
    uint8_t *text = work_bytes(work, 4 * (size_t)size + 1);
    if (!text) return UFORM_OUT_OF_MEMORY;
    size_t length = 0;
    for (uint32_t i = 0; i < size; ++i) {
        if (chars[i] < 0x80)
            text[length++] = (uint8_t)chars[i];
        else
            length += utf8_put(text + length, chars[i]);
    }
    segments->text = text;
    segments->length = length;
    return UFORM_OK;
}

/* The bytes of the UTF-8 sequence its lead byte begins. */
static size_t utf8_size(uint8_t lead) {
    return lead < 0xC0 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

/* The code-point index of byte offset `byte` (never before the cursor), or false inside a code point. */
static bool char_index(tokenizer_regex_segments_t *segments, size_t byte, uint32_t *index) {
    while (segments->at_byte < byte) {
        segments->at_byte += utf8_size(segments->text[segments->at_byte]);
        segments->at_char++;
    }
    *index = segments->at_char;
    return segments->at_byte == byte;
}

/* The next match as the onig crate's FindMatches gives it, in bytes: *found false when none is left. */
static uform_status_t search_next(tokenizer_regex_segments_t *segments, size_t *begin, size_t *end,
                                  bool *found) {
    OnigUChar const *text = segments->text, *stop = text + segments->length;
    OnigRegion *region = segments->region;
    for (*found = false; segments->from <= segments->length;) {
        int result = onig_search(segments->regex->onig, text, stop, text + segments->from, stop, region,
                                 ONIG_OPTION_NONE);
        if (result == ONIG_MISMATCH) return UFORM_OK;
        if (result < 0) return result == ONIGERR_MEMORY ? UFORM_OUT_OF_MEMORY : UFORM_UNSUPPORTED;
        size_t first = (size_t)region->beg[0], last = (size_t)region->end[0];
        if (first == last && segments->last_match_end == (int64_t)last) {
            /* An empty match where the last one ended: one code point on (one byte at the end). */
            segments->from += segments->from < segments->length ? utf8_size(text[segments->from]) : 1;
            continue;
        }
        segments->from = last;
        segments->last_match_end = (int64_t)last;
        *begin = first;
        *end = last;
        *found = true;
        return UFORM_OK;
    }
    return UFORM_OK;
}

/* The next occurrence of a literal of one code point, from where the last match ended: its matches
 * as Oniguruma finds them (never empty, each search from the last end). */
static bool scan_next(tokenizer_regex_segments_t const *segments, uint32_t *at) {
    for (uint32_t i = segments->covered; i < segments->size; ++i)
        if (segments->chars[i] == segments->regex->single) {
            *at = i;
            return true;
        }
    return false;
}

/* The next match in code points: *found false when none is left. */
static uform_status_t next_match(tokenizer_regex_segments_t *segments, uint32_t *begin, uint32_t *end,
                                 bool *found) {
    if (!segments->regex->onig) {
        *found = scan_next(segments, begin);
        *end = *begin + 1;
        return UFORM_OK;
    }
    size_t begin_byte, end_byte;
    uform_status_t status = search_next(segments, &begin_byte, &end_byte, found);
    if (status != UFORM_OK || !*found) return status;
    if (!char_index(segments, begin_byte, begin) || !char_index(segments, end_byte, end))
        return UFORM_UNSUPPORTED; /* tokenizers cannot slice there either: "bad split" */
    return UFORM_OK;
}

/* The next match, with the run before it when there is one. */
static uform_status_t next_from_search(tokenizer_regex_segments_t *segments,
                                       tokenizer_regex_segment_t *segment, bool *found) {
    uint32_t begin = 0, end = 0;
    uform_status_t status = next_match(segments, &begin, &end, found);
    if (status != UFORM_OK || !*found) return status;
    tokenizer_regex_segment_t match = {begin, end, true};
    uint32_t covered = segments->covered;
    segments->covered = end;
    if (covered == begin) {
        *segment = match;
        return UFORM_OK;
    }
    segments->match = match;
    segments->match_pending = true;
    *segment = (tokenizer_regex_segment_t){covered, begin, false};
    return UFORM_OK;
}

uform_status_t tokenizer_regex_segments_search(tokenizer_regex_segments_t *segments,
                                               tokenizer_regex_segment_t *segment, bool *more) {
    *more = true;
    if (!segments->done) {
        bool found;
        uform_status_t status = next_from_search(segments, segment, &found);
        if (status != UFORM_OK || found) return status;
        segments->done = true;
    }
    if (segments->covered == segments->size) {
        *more = false;
        return UFORM_OK;
    }
    *segment = (tokenizer_regex_segment_t){segments->covered, segments->size, false};
    segments->covered = segments->size;
    return UFORM_OK;
}
