/* The engine's normalizers as a filter, for tests/tokenizer/test_normalizers.py (the library exports only
 * uform_* symbols, so the test reaches them through this program):
 *
 *     normalize_driver [--repeat N] < runs.json > results.json
 *
 * reads {"runs": [{"normalizer": {...}, "cases": [CASE, ...]}, ...]} where a CASE is a text, or a list
 * of [text, id] segments (id null for text to normalize, a number for an added token), and writes
 * {"runs": [{"status": S, "message": M, "results": [[PIECE, ...], ...]}, ...]} where S is "ok",
 * "format", "unsupported" or "memory", and a PIECE is {"text", "id", "shift", "spans": [[begin, end],
 * ...]} (byte offsets into the case's text, one pair per code point; left out where the run says
 * "text_only": true). With --repeat N each case is
 * normalized N times and the seconds spent, reading excluded, are written as "seconds" per run.
 * Exit status: 0, 1 on bad arguments or input. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <oniguruma.h>

#include "components.h"

static char const *status_name(uform_status_t status) {
    switch (status) {
    case UFORM_OK:
        return "ok";
    case UFORM_FORMAT:
        return "format";
    case UFORM_UNSUPPORTED:
        return "unsupported";
    case UFORM_OUT_OF_MEMORY:
        return "memory";
    default:
        return "other";
    }
}

/* One segment of a case as a piece of `list` beginning at byte `shift` of the case's text. */
static int add_segment(pieces_t *list, char const *text, size_t length, uint32_t shift, int32_t id) {
    pieces_t decoded = {0};
    size_t bad = 0;
    int ok = pieces_from_utf8(&decoded, (uint8_t const *)text, length, &bad) == UFORM_OK &&
             pieces_begin(list, shift, id) == UFORM_OK;
    for (size_t i = 0; ok && i < decoded.length; ++i) {
        piece_span_t span = {decoded.spans[i].begin + shift, decoded.spans[i].end + shift};
        ok = pieces_push(list, decoded.chars[i], span) == UFORM_OK;
    }
    if (ok) pieces_end(list);
    pieces_free(&decoded);
    return ok;
}

/* A case (a text, or [text, id] segments) as a piece list. */
static int read_case(json_t const *item, pieces_t *list) {
    if (json_is_string(item))
        return add_segment(list, json_string_value(item), json_string_length(item), 0, PIECE_OPEN);
    if (!json_is_array(item)) return 0;
    uint32_t shift = 0;
    for (size_t i = 0; i < json_array_size(item); ++i) {
        json_t const *text = json_array_get(json_array_get(item, i), 0);
        json_t const *id = json_array_get(json_array_get(item, i), 1);
        if (!json_is_string(text)) return 0;
        int32_t piece_id = json_is_integer(id) ? (int32_t)json_integer_value(id) : PIECE_OPEN;
        if (!add_segment(list, json_string_value(text), json_string_length(text), shift, piece_id)) return 0;
        shift += (uint32_t)json_string_length(text);
    }
    return 1;
}

static json_t *piece_json(pieces_t const *list, size_t index, bool text_only) {
    uint32_t size = pieces_size(list, index);
    char *text = malloc((size_t)size * 4 + 1);
    json_t *spans = json_array();
    size_t length = 0;
    for (uint32_t i = 0; text && spans && i < size; ++i) {
        length += utf8_put((uint8_t *)text + length, pieces_chars(list, index)[i]);
        piece_span_t span = pieces_spans(list, index)[i];
        if (!text_only)
            json_array_append_new(spans, json_pack("[II]", (json_int_t)span.begin, (json_int_t)span.end));
    }
    json_t *piece = text && spans ? json_pack("{s:s%,s:I,s:I,s:o}", "text", text, length, "id",
                                              (json_int_t)list->ids[index], "shift",
                                              (json_int_t)list->shifts[index], "spans", spans)
                                  : NULL;
    free(text);
    return piece;
}

static json_t *list_json(pieces_t const *list, bool text_only) {
    json_t *pieces = json_array();
    for (size_t i = 0; pieces && i < list->count; ++i)
        json_array_append_new(pieces, piece_json(list, i, text_only));
    return pieces;
}

static void work_free(tokenizer_work_t *work) {
    for (size_t i = 0; i < TOKENIZER_WORK_TEMPS; ++i)
        pieces_free(&work->temps[i]);
    free(work->bytes);
    if (work->region) onig_region_free(work->region, 1);
}

/* Normalizes every case of a run `repeat` times; answers the results of the last time. */
static json_t *run_cases(normalizer_t const *normalizer, json_t const *cases, bool text_only, long repeat,
                         double *seconds) {
    tokenizer_work_t work = {0};
    pieces_t in = {0}, out = {0};
    json_t *results = json_array();
    struct timespec start, end;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start);
    for (size_t i = 0; results && i < json_array_size(cases); ++i) {
        pieces_clear(&in);
        uform_status_t status = read_case(json_array_get(cases, i), &in) ? UFORM_OK : UFORM_FORMAT;
        for (long r = 0; r < repeat && status == UFORM_OK; ++r) {
            pieces_clear(&out);
            status = normalizer_apply(normalizer, &in, &out, &work);
        }
        json_array_append_new(results, status == UFORM_OK ? list_json(&out, text_only)
                                                          : json_string(status_name(status)));
    }
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &end);
    *seconds = (double)(end.tv_sec - start.tv_sec) + 1e-9 * (double)(end.tv_nsec - start.tv_nsec);
    pieces_free(&in);
    pieces_free(&out);
    work_free(&work);
    return results;
}

static json_t *run_one(json_t const *run, long repeat) {
    normalizer_t *normalizer = NULL;
    tokenizer_fault_t fault = {{0}};
    uform_status_t status = normalizer_parse(json_object_get(run, "normalizer"), &normalizer, &fault);
    json_t *result = json_pack("{s:s,s:s}", "status", status_name(status), "message", fault.message);
    if (status != UFORM_OK || !result) return result;
    double seconds = 0;
    bool text_only = json_is_true(json_object_get(run, "text_only"));
    json_object_set_new(result, "results",
                        run_cases(normalizer, json_object_get(run, "cases"), text_only, repeat, &seconds));
    if (repeat > 1) json_object_set_new(result, "seconds", json_real(seconds));
    normalizer_free(normalizer);
    return result;
}

int main(int argc, char **argv) {
    long repeat = 1;
    if (argc == 3 && strcmp(argv[1], "--repeat") == 0) repeat = strtol(argv[2], NULL, 10);
    if ((argc != 1 && argc != 3) || repeat < 1) {
        fprintf(stderr, "usage: %s [--repeat N] < runs.json > results.json\n", argv[0]);
        return 1;
    }
    json_error_t error;
    json_t *input = json_loadf(stdin, JSON_ALLOW_NUL, &error);
    json_t *runs = json_object_get(input, "runs");
    if (!json_is_array(runs)) {
        fprintf(stderr, "%s: no \"runs\" array in the input: %s\n", argv[0], error.text);
        return 1;
    }
    json_t *results = json_array();
    for (size_t i = 0; i < json_array_size(runs); ++i)
        json_array_append_new(results, run_one(json_array_get(runs, i), repeat));
    json_t *output = json_pack("{s:o}", "runs", results);
    int ok = output && json_dumpf(output, stdout, JSON_COMPACT) == 0;
    json_decref(output);
    json_decref(input);
    return ok ? 0 : 1;
}
