/* Regular expressions as Hugging Face's tokenizers runs them (its SysRegex): Oniguruma, compiled with
 * its default syntax and no options as the onig crate 6.4 compiles them, and searched, as there, in the
 * UTF-8 of a piece's code points; matches come back as code-point indices.
 *
 * A compiled pattern is read-only: any number of threads may search it at once, each with its own
 * tokenizer_work_t (whose `region` holds Oniguruma's match state, made on first use). */
#pragma once

#include "components.h"

typedef struct tokenizer_regex tokenizer_regex_t;

/* Initializes Oniguruma for UTF-8 and UTF-32 once per process; every later call waits for the first
 * and answers its status (UFORM_OK, or UFORM_INTERNAL where Oniguruma failed). */
uform_status_t tokenizer_onig_init(void);

/* Compiles `pattern` (`length` bytes of UTF-8): a regular expression, or with `literal` a string
 * matched as it is, escaped as tokenizers escapes its String patterns (the regex crate's escape). A
 * literal of one code point, whose matches are its occurrences, is found by a scan of the code points
 * without Oniguruma. Answers UFORM_OK, UFORM_FORMAT naming `what` and Oniguruma's message for a pattern it
 * rejects (or that is not UTF-8), UFORM_OUT_OF_MEMORY. */
uform_status_t tokenizer_regex_compile(char const *pattern, size_t length, bool literal,
                                       tokenizer_regex_t **regex, char const *what, tokenizer_fault_t *fault);
void tokenizer_regex_free(tokenizer_regex_t *regex);

/* Segments: what tokenizers' Pattern::find_matches gives for a SysRegex over code points
 * chars[0, size): runs no match covers and the matches (empty ones included), in order, end to end.
 * Successive matches follow the onig crate's find_iter: each search starts where the last match
 * ended, and an empty match at the very end of the last one is skipped by one code point. An empty
 * text is one empty run, never searched. */
typedef struct tokenizer_regex_segment {
    uint32_t begin, end;
    bool is_match;
} tokenizer_regex_segment_t;

typedef struct tokenizer_regex_segments {
    tokenizer_regex_t const *regex;
    uint32_t const *chars; /* the text, where a literal of one code point is scanned for */
    uint8_t const *text;   /* the code points' UTF-8 (in work->bytes), where Oniguruma searches */
    size_t length;         /* its bytes */
    uint32_t size;         /* its code points */
    void *region;
    size_t from;            /* the byte where the next search starts; past `length` when none is left */
    int64_t last_match_end; /* its byte; -1 before the first match */
    size_t at_byte;         /* a code point's first byte ... */
    uint32_t at_char;       /* ... and its index: where byte offsets are read from, in order */
    uint32_t covered;       /* the segments given so far cover code points [0, covered) */
    tokenizer_regex_segment_t match;
    bool match_pending; /* `match` follows the run just given */
    bool done;
} tokenizer_regex_segments_t;

/* Starts the segments of chars[0, size) (read until the last segment), whose UTF-8 it writes to
 * work->bytes (theirs until the last segment) where Oniguruma searches them; makes work->region on
 * first use. Answers UFORM_OK or UFORM_OUT_OF_MEMORY. */
uform_status_t tokenizer_regex_segments_begin(tokenizer_regex_segments_t *segments,
                                              tokenizer_regex_t const *regex, uint32_t const *chars,
                                              uint32_t size, tokenizer_work_t *work);
/* The segment after those given, found by a search (tokenizer_regex_segments_next's slow path). */
uform_status_t tokenizer_regex_segments_search(tokenizer_regex_segments_t *segments,
                                               tokenizer_regex_segment_t *segment, bool *more);

/* The next segment in `*segment`, with *more true; *more false after the last one. Answers UFORM_OK,
 * UFORM_OUT_OF_MEMORY, or UFORM_UNSUPPORTED where tokenizers panics: Oniguruma gave up on the text
 * (its retry limit), or a pattern of raw bytes matched inside a code point. A match found with the run
 * before it comes inline: a text of many short matches makes two segments a search. */
static inline uform_status_t tokenizer_regex_segments_next(tokenizer_regex_segments_t *segments,
                                                           tokenizer_regex_segment_t *segment, bool *more) {
    if (!segments->match_pending) return tokenizer_regex_segments_search(segments, segment, more);
    segments->match_pending = false;
    *segment = segments->match;
    *more = true;
    return UFORM_OK;
}
