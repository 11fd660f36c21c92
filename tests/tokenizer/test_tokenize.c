/* uform_text_tokenize and the tokenizer's lifetime through the public interface: a small BERT-like
 * tokenizer.json (its ids and offsets taken from Hugging Face's tokenizers 0.19.1 once, by hand), the
 * same tokens on every receiver, deferred calls, truncation and padding as the file asks, added tokens
 * in the text, a text that is not UTF-8 failing alone, progress and cancellation, and files and
 * arguments refused with the status that names their fault. Tokenizers against the reference on a real
 * corpus: tests/tokenizer/compare.py. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "fixtures.h"
#include "json_faults.h"
#include "uform_config.h"

/* WordPiece over 21 tokens, BertNormalizer (lowercase), BertPreTokenizer, "[CLS] $A [SEP]", the five
 * special tokens added as `normalized: false`. %s: the "truncation" and "padding" members. */
static char const tiny_format[] =
    "{\"version\": \"1.0\", %s, \"added_tokens\": ["
    "{\"id\": 0, \"content\": \"[PAD]\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
    "\"normalized\": false, \"special\": true},"
    "{\"id\": 1, \"content\": \"[UNK]\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
    "\"normalized\": false, \"special\": true},"
    "{\"id\": 2, \"content\": \"[CLS]\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
    "\"normalized\": false, \"special\": true},"
    "{\"id\": 3, \"content\": \"[SEP]\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
    "\"normalized\": false, \"special\": true},"
    "{\"id\": 4, \"content\": \"[MASK]\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
    "\"normalized\": false, \"special\": true}],"
    "\"normalizer\": {\"type\": \"BertNormalizer\", \"clean_text\": true, \"handle_chinese_chars\": true, "
    "\"strip_accents\": null, \"lowercase\": true},"
    "\"pre_tokenizer\": {\"type\": \"BertPreTokenizer\"},"
    "\"post_processor\": {\"type\": \"TemplateProcessing\","
    "\"single\": [{\"SpecialToken\": {\"id\": \"[CLS]\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", "
    "\"type_id\": 0}}, {\"SpecialToken\": {\"id\": \"[SEP]\", \"type_id\": 0}}],"
    "\"pair\": [{\"SpecialToken\": {\"id\": \"[CLS]\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", "
    "\"type_id\": 0}}, {\"SpecialToken\": {\"id\": \"[SEP]\", \"type_id\": 0}}, {\"Sequence\": {\"id\": "
    "\"B\", \"type_id\": 1}}, {\"SpecialToken\": {\"id\": \"[SEP]\", \"type_id\": 1}}],"
    "\"special_tokens\": {\"[CLS]\": {\"id\": \"[CLS]\", \"ids\": [2], \"tokens\": [\"[CLS]\"]}, \"[SEP]\": "
    "{\"id\": \"[SEP]\", \"ids\": [3], \"tokens\": [\"[SEP]\"]}}},"
    "\"decoder\": null,"
    "\"model\": {\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\", \"continuing_subword_prefix\": \"##\", "
    "\"max_input_chars_per_word\": 100,"
    "\"vocab\": {\"[PAD]\": 0, \"[UNK]\": 1, \"[CLS]\": 2, \"[SEP]\": 3, \"[MASK]\": 4, \"a\": 5, \"cat\": "
    "6, \"dog\": 7, \"the\": 8, \"on\": 9,"
    "\"mat\": 10, \"##s\": 11, \"sat\": 12, \"hello\": 13, \"world\": 14, \".\": 15, \",\": 16, \"!\": 17, "
    "\"caf\": 18, \"##e\": 19, \"\\u00e9\": 20}}}";

static char const no_options[] = "\"truncation\": null, \"padding\": null";

/* The texts and what tokenizers gives for each (offsets turned into bytes). */
typedef struct expected {
    char const *text;
    uint32_t ids[16];
    uint32_t spans[16][2];
    size_t count;
} expected_t;

static expected_t const cases[] = {
    {"The cats sat on the mat.",
     {2, 8, 6, 11, 12, 9, 8, 10, 15, 3},
     {{0, 0}, {0, 3}, {4, 7}, {7, 8}, {9, 12}, {13, 15}, {16, 19}, {20, 23}, {23, 24}, {0, 0}},
     10},
    {"", {2, 3}, {{0, 0}, {0, 0}}, 2},
    {"Hello, [MASK] world!",
     {2, 13, 16, 4, 14, 17, 3},
     {{0, 0}, {0, 5}, {5, 6}, {7, 13}, {14, 19}, {19, 20}, {0, 0}},
     7},
    {"Caf\xc3\xa9 ZZZ", {2, 18, 19, 1, 3}, {{0, 0}, {0, 3}, {3, 5}, {6, 9}, {0, 0}}, 5},
    {"a dog", {2, 5, 7, 3}, {{0, 0}, {0, 1}, {2, 5}, {0, 0}}, 4},
};
#define CASES (sizeof cases / sizeof cases[0])

static uform_tokenizer_t *tiny(char const *options) {
    char json[sizeof tiny_format + 512];
    snprintf(json, sizeof json, tiny_format, options);
    uform_tokenizer_t *tokenizer = NULL;
    assert_int_equal(uform_tokenizer_parse(json, strlen(json), &tokenizer), UFORM_OK);
    return tokenizer;
}

static batch_t *cases_batch(void) {
    batch_t *batch = batch_new(BATCH_TEXTS);
    for (size_t i = 0; i < CASES; ++i)
        batch_add(batch, cases[i].text, strlen(cases[i].text));
    return batch;
}

/* Asserts that text `item` of `tokenized` holds `count` tokens: `ids` and `spans`. */
static void assert_tokens(uform_tokenized_t const *tokenized, size_t item, uint32_t const *ids,
                          uint32_t const (*spans)[2], size_t count) {
    assert_int_equal(tokenized->statuses[item], UFORM_OK);
    size_t first = tokenized->ids.item_offsets[item];
    assert_int_equal(tokenized->ids.item_offsets[item + 1] - first, count);
    uint32_t const *got_ids = tokenized->ids.data, *got_spans = tokenized->spans.data;
    for (size_t t = 0; t < count; ++t) {
        assert_int_equal(got_ids[first + t], ids[t]);
        assert_int_equal(got_spans[2 * (first + t)], spans[t][0]);
        assert_int_equal(got_spans[2 * (first + t) + 1], spans[t][1]);
    }
}

/* Asserts the special flags of text `item`: tokenizers' special_tokens_mask, given as a string of '0'
 * and '1' per token. */
static void assert_special(uform_tokenized_t const *tokenized, size_t item, char const *mask) {
    size_t first = tokenized->ids.item_offsets[item];
    assert_int_equal(tokenized->ids.item_offsets[item + 1] - first, strlen(mask));
    for (size_t t = 0; mask[t]; ++t)
        assert_int_equal(tokenized->special[first + t], mask[t] - '0');
}

/* tokenizers' special_tokens_mask of the cases: [CLS] and [SEP] of the post-processor are special, the
 * [MASK] found in the text is not (an added token matched in a text is masked 0). */
static char const *const cases_special[] = {"1000000001", "11", "1000001", "10001", "1001"};

static void assert_cases(uform_tokenized_t const *tokenized) {
    assert_int_equal(tokenized->items, CASES);
    assert_int_equal(tokenized->ids.scalar, UFORM_U32);
    assert_int_equal(tokenized->spans.columns, 2);
    for (size_t i = 0; i < CASES; ++i) {
        assert_tokens(tokenized, i, cases[i].ids, cases[i].spans, cases[i].count);
        assert_special(tokenized, i, cases_special[i]);
    }
}

/* Every receiver, blocking and deferred, cuts the same tokens as tokenizers. */
static void test_receivers(void **state) {
    (void)state;
    uform_tokenizer_t *tokenizer = tiny(no_options);
    batch_t *batch = cases_batch();
    receiver_t const receivers[] = {RECEIVER_THREAD, RECEIVER_INLINE, RECEIVER_RAM, RECEIVER_RAM_TWO};
    for (size_t r = 0; r < sizeof receivers / sizeof receivers[0]; ++r) {
        uform_executor_t *executor = receiver_make(receivers[r], NULL, NULL);
        uform_arena_t *arena = NULL;
        assert_int_equal(executor ? uform_arena_create(executor, &arena) : uform_arena_create_host(&arena),
                         UFORM_OK);
        uform_tokenized_t tokenized;
        uform_tokenize_stats_t stats;
        uform_tokenize_config_t config = {.stats = &stats};
        uform_text_tokenize_args_t args = {.tokenizer = tokenizer,
                                           .executor = executor,
                                           .texts = batch_tape(batch),
                                           .arena = arena,
                                           .config = &config,
                                           .tokenized = &tokenized};
        assert_int_equal(uform_text_tokenize(&args), UFORM_OK);
        assert_cases(&tokenized);
        assert_int_equal(stats.items, CASES);
        assert_int_equal(stats.failed, 0);
        assert_int_equal(stats.tokens, 10 + 2 + 7 + 5 + 4);
        if (executor) { /* deferred */
            uform_outcome_t outcome;
            uform_outcome_init(&outcome);
            args.tokenized = NULL;
            args.outcome = &outcome;
            assert_int_equal(uform_text_tokenize(&args), UFORM_OK);
            assert_int_equal(uform_outcome_wait(&outcome), UFORM_OK);
            assert_int_equal(uform_outcome_tokenized(&outcome, &tokenized), UFORM_OK);
            assert_cases(&tokenized);
            uform_outcome_destroy(&outcome);
        }
        uform_arena_free(arena);
        uform_executor_free(executor);
    }
    batch_free(batch);
    uform_tokenizer_free(tokenizer);
}

/* Cuts the texts of `batch` with `tokenizer` and `config` into `tokenized`; the call must succeed. */
static void cut_batch(uform_tokenizer_t const *tokenizer, batch_t const *batch,
                      uform_tokenize_config_t const *config, uform_arena_t *arena,
                      uform_tokenized_t *tokenized) {
    uform_text_tokenize_args_t args = {.tokenizer = tokenizer,
                                       .texts = batch_tape(batch),
                                       .arena = arena,
                                       .config = config,
                                       .tokenized = tokenized};
    assert_int_equal(uform_text_tokenize(&args), UFORM_OK);
}

/* A text that is not UTF-8 fails alone, with no tokens; the others are cut as if alone. */
static void test_invalid_utf8_fails_alone(void **state) {
    (void)state;
    uform_tokenizer_t *tokenizer = tiny(no_options);
    static char const *const bad[] = {("a\xff"
                                       "dog"),
                                      "\xc0\xaf", "\xed\xa0\x80", "caf\xc3"};
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; ++b) {
        batch_t *batch = batch_new(BATCH_TEXTS);
        batch_add(batch, cases[0].text, strlen(cases[0].text));
        batch_add(batch, bad[b], strlen(bad[b]));
        batch_add(batch, cases[4].text, strlen(cases[4].text));
        uform_arena_t *arena = arena_on_host();
        uform_tokenized_t tokenized;
        uform_tokenize_stats_t stats;
        uform_tokenize_config_t config = {.stats = &stats};
        cut_batch(tokenizer, batch, &config, arena, &tokenized);
        assert_int_equal(tokenized.statuses[1], UFORM_FORMAT);
        assert_int_equal(tokenized.ids.item_offsets[2] - tokenized.ids.item_offsets[1], 0);
        assert_tokens(&tokenized, 0, cases[0].ids, cases[0].spans, cases[0].count);
        assert_tokens(&tokenized, 2, cases[4].ids, cases[4].spans, cases[4].count);
        assert_int_equal(stats.failed, 1);
        uform_arena_free(arena);
        batch_free(batch);
    }
    uform_tokenizer_free(tokenizer);
}

/* Cuts one text with `tokenizer` on the calling thread; answers its token count. */
static size_t cut_one(uform_tokenizer_t const *tokenizer, char const *text, bool plain, uform_arena_t *arena,
                      uform_tokenized_t *tokenized) {
    size_t offsets[2] = {0, strlen(text)};
    uform_tokenize_config_t config = {.without_special_tokens = plain};
    uform_text_tokenize_args_t args = {.tokenizer = tokenizer,
                                       .texts = {text, offsets, 1, offsets[1]},
                                       .arena = arena,
                                       .config = &config,
                                       .tokenized = tokenized};
    assert_int_equal(uform_text_tokenize(&args), UFORM_OK);
    return tokenized->ids.item_offsets[1];
}

/* Regression (null_share_of_texts_without_tokens): texts that cut to no tokens at all (empty, or only
 * marks a normalizer strips, without special tokens) leave the threads' token buffers unallocated; the
 * output used to copy from them at a null pointer. Each gets an empty row, and the call succeeds. */
static void test_null_share_of_texts_without_tokens(void **state) {
    (void)state;
    uform_tokenizer_t *tokenizer = tiny(no_options);
    uform_arena_t *arena = arena_on_host();
    uform_tokenized_t tokenized;
    assert_int_equal(cut_one(tokenizer, "", true, arena, &tokenized), 0);
    assert_int_equal(tokenized.statuses[0], UFORM_OK);
    batch_t *batch = batch_new(BATCH_TEXTS);
    batch_add(batch, "", 0);
    batch_add(batch, " \t ", 3);
    batch_add(batch, "", 0);
    cut_batch(tokenizer, batch, &(uform_tokenize_config_t){.without_special_tokens = true}, arena,
              &tokenized);
    assert_int_equal(tokenized.items, 3);
    for (size_t i = 0; i < 3; ++i) {
        assert_int_equal(tokenized.statuses[i], UFORM_OK);
        assert_int_equal(tokenized.ids.item_offsets[i + 1], 0);
    }
    uform_arena_free(arena);
    batch_free(batch);
    uform_tokenizer_free(tokenizer);
}

/* A tokenizer.json whose parse fails for memory is OUT_OF_MEMORY: jansson says nothing when an
 * allocation fails (its error's code, the last byte of its text, stays unwritten), and the parse read
 * that code, FORMAT where the stack held another. */
static void test_json_error_unset_read_as_format(void **state) {
    (void)state;
    char json[sizeof tiny_format + 512];
    snprintf(json, sizeof json, tiny_format, no_options);
    uform_tokenizer_t *tokenizer = NULL;
    json_fail_allocation(1);
    stack_paint((unsigned char)json_error_invalid_syntax);
    uform_status_t status = uform_tokenizer_parse(json, strlen(json), &tokenizer);
    json_allocations_restore();
    assert_int_equal(status, UFORM_OUT_OF_MEMORY);
    assert_null(tokenizer);
    uform_error_t error = uform_last_error();
    assert_string_equal(error.message, "tokenizer.json: out of memory");
    assert_int_equal(uform_tokenizer_parse(json, strlen(json), &tokenizer), UFORM_OK);
    uform_tokenizer_free(tokenizer);
}

/* Truncation keeps max_length tokens with the special ones (from either end); padding pads Fixed to
 * its length and BatchLongest to the call's longest text, left or right, with the pad id. */
static void test_truncation_and_padding(void **state) {
    (void)state;
    uform_arena_t *arena = arena_on_host();
    uform_tokenized_t tokenized;
    uform_tokenizer_t *right =
        tiny("\"truncation\": {\"direction\": \"Right\", \"max_length\": 5, \"strategy\": "
             "\"LongestFirst\", \"stride\": 0}, \"padding\": null");
    assert_int_equal(cut_one(right, cases[0].text, false, arena, &tokenized), 5);
    assert_tokens(&tokenized, 0, (uint32_t[]){2, 8, 6, 11, 3},
                  (uint32_t const[][2]){{0, 0}, {0, 3}, {4, 7}, {7, 8}, {0, 0}}, 5);
    assert_special(&tokenized, 0, "10001");
    assert_int_equal(cut_one(right, cases[0].text, true, arena, &tokenized),
                     5); /* no special tokens: 5 kept */
    assert_special(&tokenized, 0, "00000");
    /* without_truncation: the whole text, as tokenizers' with_truncation(None) cuts it */
    size_t offsets[2] = {0, strlen(cases[0].text)};
    uform_tokenize_config_t whole = {.without_truncation = true};
    uform_text_tokenize_args_t untruncated = {.tokenizer = right,
                                              .texts = {cases[0].text, offsets, 1, offsets[1]},
                                              .arena = arena,
                                              .config = &whole,
                                              .tokenized = &tokenized};
    assert_int_equal(uform_text_tokenize(&untruncated), UFORM_OK);
    assert_tokens(&tokenized, 0, cases[0].ids, cases[0].spans, cases[0].count);
    assert_special(&tokenized, 0, cases_special[0]);
    uform_tokenizer_info_t info;
    assert_int_equal(uform_tokenizer_info(right, &info), UFORM_OK);
    assert_int_equal(info.max_length, 5);
    assert_int_equal(info.special_added, 2);
    assert_string_equal(info.model, "WordPiece");
    uform_tokenizer_free(right);
    uform_tokenizer_t *left =
        tiny("\"truncation\": {\"direction\": \"Left\", \"max_length\": 4, \"strategy\": "
             "\"LongestFirst\", \"stride\": 0}, \"padding\": null");
    assert_int_equal(cut_one(left, cases[0].text, false, arena, &tokenized), 4);
    assert_tokens(&tokenized, 0, (uint32_t[]){2, 10, 15, 3},
                  (uint32_t const[][2]){{0, 0}, {20, 23}, {23, 24}, {0, 0}}, 4);
    uform_tokenizer_free(left);
    uform_tokenizer_t *fixed =
        tiny("\"truncation\": null, \"padding\": {\"strategy\": {\"Fixed\": 6}, \"direction\": "
             "\"Left\", \"pad_to_multiple_of\": null, \"pad_id\": 0, \"pad_type_id\": 0, \"pad_token\": "
             "\"[PAD]\"}");
    assert_int_equal(cut_one(fixed, "a dog", false, arena, &tokenized), 6);
    assert_tokens(&tokenized, 0, (uint32_t[]){0, 0, 2, 5, 7, 3},
                  (uint32_t const[][2]){{0, 0}, {0, 0}, {0, 0}, {0, 1}, {2, 5}, {0, 0}}, 6);
    assert_special(&tokenized, 0, "111001"); /* padding is special too */
    uform_tokenizer_free(fixed);
    uform_tokenizer_t *longest = tiny(
        "\"truncation\": null, \"padding\": {\"strategy\": \"BatchLongest\", \"direction\": "
        "\"Right\", \"pad_to_multiple_of\": 4, \"pad_id\": 0, \"pad_type_id\": 0, \"pad_token\": \"[PAD]\"}");
    batch_t *batch = cases_batch();
    uform_text_tokenize_args_t args = {
        .tokenizer = longest, .texts = batch_tape(batch), .arena = arena, .tokenized = &tokenized};
    assert_int_equal(uform_text_tokenize(&args), UFORM_OK);
    for (size_t i = 0; i < CASES; ++i) {
        uint32_t ids[12] = {0}, spans[12][2] = {{0}};
        memcpy(ids, cases[i].ids, cases[i].count * sizeof *ids);
        memcpy(spans, cases[i].spans, cases[i].count * sizeof *spans);
        assert_tokens(&tokenized, i, ids, (uint32_t const(*)[2])spans, 12); /* the longest, 10, up to 12 */
        char mask[13] = "111111111111";
        memcpy(mask, cases_special[i], strlen(cases_special[i]));
        assert_special(&tokenized, i, mask);
    }
    batch_free(batch);
    uform_tokenizer_free(longest);
    uform_arena_free(arena);
}

/* A token's string by id, as tokenizers' id_to_token: the vocabulary's entries and the added tokens'
 * contents; an id no token has is refused. */
static void test_token_strings(void **state) {
    (void)state;
    uform_tokenizer_t *tokenizer = tiny(no_options);
    static struct {
        uint32_t id;
        char const *string;
    } const known[] = {{0, "[PAD]"}, {3, "[SEP]"}, {4, "[MASK]"}, {8, "the"}, {11, "##s"}, {20, "\xc3\xa9"}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; ++i) {
        char const *string = NULL;
        size_t length = 0;
        assert_int_equal(uform_tokenizer_token(tokenizer, known[i].id, &string, &length), UFORM_OK);
        assert_int_equal(length, strlen(known[i].string));
        assert_memory_equal(string, known[i].string, length);
    }
    char const *string = "unchanged";
    size_t length = 7;
    assert_int_equal(uform_tokenizer_token(tokenizer, 21, &string, &length), UFORM_INVALID_ARGUMENT);
    assert_null(string);
    assert_int_equal(length, 0);
    assert_int_equal(uform_tokenizer_token(tokenizer, UINT32_MAX, &string, &length), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_tokenizer_token(NULL, 0, &string, &length), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_tokenizer_token(tokenizer, 0, NULL, &length), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_tokenizer_token(tokenizer, 0, &string, NULL), UFORM_INVALID_ARGUMENT);
    uform_tokenizer_free(tokenizer);
}

/* Progress counts texts; a handler's cancel ends the call with CANCELLED, the arena and tokenizer
 * usable after. */
static void test_progress_and_cancel(void **state) {
    (void)state;
    uform_tokenizer_t *tokenizer = tiny(no_options);
    batch_t *batch = batch_new(BATCH_TEXTS);
    for (size_t i = 0; i < BATCH_MAX; ++i)
        batch_add(batch, cases[i % CASES].text, strlen(cases[i % CASES].text));
    uform_arena_t *arena = arena_on_host();
    uform_tokenized_t tokenized;
    progress_counter_t counter = {0};
    uform_tokenize_config_t config = {.progress = {count_progress, &counter, 0}};
    uform_text_tokenize_args_t args = {.tokenizer = tokenizer,
                                       .texts = batch_tape(batch),
                                       .arena = arena,
                                       .config = &config,
                                       .tokenized = &tokenized};
    assert_int_equal(uform_text_tokenize(&args), UFORM_OK);
    assert_true(counter.calls >= 1);
    assert_int_equal(counter.last, BATCH_MAX);
    assert_int_equal(counter.total, BATCH_MAX);
    counter = (progress_counter_t){.cancel_at = 1};
    assert_int_equal(uform_text_tokenize(&args), UFORM_CANCELLED);
    config = (uform_tokenize_config_t){0};
    assert_int_equal(uform_text_tokenize(&args), UFORM_OK);
    assert_int_equal(tokenized.items, BATCH_MAX);
    uform_arena_free(arena);
    batch_free(batch);
    uform_tokenizer_free(tokenizer);
}

/* Bad arguments answer INVALID_ARGUMENT before anything runs; with an outcome, it is final with it. */
static void test_bad_arguments(void **state) {
    (void)state;
    uform_tokenizer_t *tokenizer = tiny(no_options);
    uform_arena_t *arena = arena_on_host();
    uform_tokenized_t tokenized;
    size_t offsets[] = {0, 3, 1};
    uform_text_tokenize_args_t good = {
        .tokenizer = tokenizer, .texts = {"abc", offsets, 1, 3}, .arena = arena, .tokenized = &tokenized};
    assert_int_equal(uform_text_tokenize(NULL), UFORM_INVALID_ARGUMENT);
    uform_text_tokenize_args_t args = good;
    args.tokenizer = NULL;
    assert_int_equal(uform_text_tokenize(&args), UFORM_INVALID_ARGUMENT);
    args = good;
    args.arena = NULL;
    assert_int_equal(uform_text_tokenize(&args), UFORM_INVALID_ARGUMENT);
    args = good;
    args.texts.count = 0;
    assert_int_equal(uform_text_tokenize(&args), UFORM_INVALID_ARGUMENT);
    args = good;
    args.texts.count = 2; /* offsets out of order */
    uform_outcome_t outcome;
    uform_outcome_init(&outcome);
    args.executor = receiver_make(RECEIVER_INLINE, NULL, NULL);
    args.outcome = &outcome;
    assert_int_equal(uform_text_tokenize(&args), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_outcome_status(&outcome), UFORM_INVALID_ARGUMENT);
    uform_outcome_destroy(&outcome);
    uform_executor_free(args.executor);
    assert_int_equal(uform_text_tokenize(&good), UFORM_OK);
    uform_arena_free(arena);
    uform_tokenizer_free(tokenizer);
}

/* Files refused with the status naming their fault; a folder stands for its tokenizer.json. */
static void test_files(void **state) {
    (void)state;
    uform_tokenizer_t *tokenizer = NULL;
    assert_int_equal(uform_tokenizer_open(NULL, &tokenizer), UFORM_INVALID_ARGUMENT);
    char path[4096];
    fixture_path("absent.json", path, sizeof path);
    assert_int_equal(uform_tokenizer_open(path, &tokenizer), UFORM_IO);
    char json[sizeof tiny_format + 512];
    snprintf(json, sizeof json, tiny_format, no_options);
    blob_t blob = blob_copy(json, strlen(json));
    blob_write("tokenizer.json", &blob);
    free(blob.data);
    fixture_path("", path, sizeof path);
    assert_int_equal(uform_tokenizer_open(path, &tokenizer), UFORM_OK);
    uform_tokenizer_free(tokenizer);
    static struct {
        char const *json;
        uform_status_t status;
        char const *named;
    } const bad[] = {
        {"{", UFORM_FORMAT, "line"},
        {"[]", UFORM_FORMAT, "not an object"},
        {"{\"version\": \"1.0\"}", UFORM_FORMAT, "model"},
        {"{\"version\": \"2.0\", \"model\": {}}", UFORM_UNSUPPORTED, "version"},
        {"{\"post_processor\": {\"type\": \"Nope\"}, \"model\": {\"type\": \"WordLevel\", \"vocab\": {\"a\": "
         "0}, \"unk_token\": \"a\"}}",
         UFORM_UNSUPPORTED, "Nope"},
        {"{\"truncation\": {\"max_length\": 3}, \"model\": {\"type\": \"WordLevel\", \"vocab\": {\"a\": 0}, "
         "\"unk_token\": \"a\"}}",
         UFORM_FORMAT, "truncation"},
        {"{\"padding\": {\"strategy\": \"Sometimes\"}, \"model\": {\"type\": \"WordLevel\", \"vocab\": "
         "{\"a\": 0}, \"unk_token\": \"a\"}}",
         UFORM_FORMAT, "padding"},
        {"{\"added_tokens\": [{\"id\": 0}], \"model\": {\"type\": \"WordLevel\", \"vocab\": {\"a\": 0}, "
         "\"unk_token\": \"a\"}}",
         UFORM_FORMAT, "content"},
        {"{\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": "
         "\"X\", \"type_id\": 0}}], "
         "\"pair\": [], \"special_tokens\": {}}, \"model\": {\"type\": \"WordLevel\", \"vocab\": {\"a\": 0}, "
         "\"unk_token\": \"a\"}}",
         UFORM_FORMAT, "X"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        tokenizer = (uform_tokenizer_t *)1;
        assert_int_equal(uform_tokenizer_parse(bad[i].json, strlen(bad[i].json), &tokenizer), bad[i].status);
        assert_null(tokenizer);
        uform_error_t error = uform_last_error();
        assert_string_equal(error.entry, "uform_tokenizer_parse");
        if (!strstr(error.message, bad[i].named))
            fail_msg("case %zu: \"%s\" does not name %s", i, error.message, bad[i].named);
    }
}

/* A file that is not JSON is read as a SentencePiece model (tests/tokenizer/test_spiece.py cuts real
 * ones): an empty or a corrupt one is refused with UFORM_FORMAT naming the fault, a folder's model with
 * no tokenizer_config.json with UFORM_IO, an unknown tokenizer class with UFORM_UNSUPPORTED; a build
 * without libsentencepiece refuses each as UFORM_UNSUPPORTED, saying so. */
static void test_sentencepiece_files(void **state) {
    (void)state;
    uint8_t noise[4096];
    random_seed(5);
    for (size_t i = 0; i < sizeof noise; ++i)
        noise[i] = (uint8_t)(random_bits() | 0x80);
    static uint8_t const header[] = {0x0A, 0x0B, 0x0A, 0x05, 0x3C, 0x75, 0x6E, 0x6B}; /* a piece cut short */
    struct {
        char const *name;
        void const *data;
        size_t size;
        uform_status_t status;
        char const *named;
    } const files[] = {
        {"empty.model", "", 0, UFORM_FORMAT, "empty"},
        {"noise.model", noise, sizeof noise, UFORM_FORMAT, "not a SentencePiece model"},
        {"header.model", header, sizeof header, UFORM_FORMAT, "not a SentencePiece model"},
    };
    char path[4096], folder[4096];
    uform_tokenizer_t *tokenizer = NULL;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; ++i) {
        blob_t blob = blob_copy(files[i].data, files[i].size);
        blob_write(files[i].name, &blob);
        free(blob.data);
        fixture_path(files[i].name, path, sizeof path);
        tokenizer = (uform_tokenizer_t *)1;
        uform_status_t expected = UFORM_WITH_SENTENCEPIECE ? files[i].status : UFORM_UNSUPPORTED;
        assert_int_equal(uform_tokenizer_open(path, &tokenizer), expected);
        assert_null(tokenizer);
        char const *named = UFORM_WITH_SENTENCEPIECE ? files[i].named : "built without SentencePiece";
        if (!strstr(uform_last_error().message, named))
            fail_msg("%s: \"%s\" does not name %s", files[i].name, uform_last_error().message, named);
    }
    fixture_path("t5", folder, sizeof folder);
    assert_true(mkdir(folder, 0755) == 0 || errno == EEXIST);
    blob_t blob = blob_copy(noise, sizeof noise);
    blob_write("t5/spiece.model", &blob);
    free(blob.data);
    assert_int_equal(uform_tokenizer_open(folder, &tokenizer),
                     UFORM_WITH_SENTENCEPIECE ? UFORM_IO : UFORM_UNSUPPORTED);
    static char const config[] = "{\"tokenizer_class\": \"T5Tokenizer\"}";
    blob = blob_copy(config, strlen(config));
    blob_write("t5/tokenizer_config.json", &blob);
    free(blob.data);
    assert_int_equal(uform_tokenizer_open(folder, &tokenizer), UFORM_UNSUPPORTED);
    char const *named = UFORM_WITH_SENTENCEPIECE ? "T5Tokenizer" : "built without SentencePiece";
    if (!strstr(uform_last_error().message, named))
        fail_msg("\"%s\" does not name %s", uform_last_error().message, named);
}

/* Every seed tokenizer of the fuzz corpus, cut short at many lengths and with bytes changed at many
 * places: each answers OK, FORMAT or UNSUPPORTED with a message, and one that opens still cuts texts. */
static void test_corrupted_files(void **state) {
    (void)state;
    static char const *const names[] = {"wordpiece_bert.json", "bpe_byte_level.json", "bpe_clip.json",
                                        "unigram_metaspace.json", "wordlevel.json"};
    uform_arena_t *arena = arena_on_host();
    uform_tokenized_t tokenized;
    size_t refused = 0, opened = 0;
    for (size_t n = 0; n < sizeof names / sizeof names[0]; ++n) {
        char path[4096];
        snprintf(path, sizeof path, "%s/tests/fuzz-corpus/tokenizer_json/%s", UFORM_SOURCE_ROOT, names[n]);
        blob_t blob = blob_read(path);
        uint8_t *copy = malloc(blob.size);
        assert_non_null(copy);
        for (size_t trial = 0; trial < 200; ++trial) {
            size_t length = blob.size;
            memcpy(copy, blob.data, blob.size);
            if (trial % 2)
                length = random_below(blob.size);
            else
                for (size_t flips = 1 + random_below(4); flips; --flips)
                    copy[random_below(blob.size)] = (uint8_t)random_bits();
            uform_tokenizer_t *tokenizer = NULL;
            uform_status_t status = uform_tokenizer_parse(copy, length, &tokenizer);
            if (status != UFORM_OK) {
                if (status != UFORM_FORMAT && status != UFORM_UNSUPPORTED) fail_msg("status %d", status);
                assert_true(strlen(uform_last_error().message) > 0);
                assert_null(tokenizer);
                refused++;
                continue;
            }
            opened++;
            cut_one(tokenizer, "Hello, [MASK] world! \xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82", false,
                    arena, &tokenized);
            uform_tokenizer_free(tokenizer);
        }
        free(copy);
        free(blob.data);
    }
    assert_true(refused > 0);
    uform_arena_free(arena);
}

static int tokenize_setup(void **state) {
    (void)state;
    uform_tiny_checkpoint_args_t tiny_checkpoint = {.seed = 1};
    return fixture_setup("tokenize", &tiny_checkpoint, NULL, NULL);
}

int main(void) {
    struct CMUnitTest const tests[] = {
        cmocka_unit_test(test_receivers),
        cmocka_unit_test(test_invalid_utf8_fails_alone),
        cmocka_unit_test(test_truncation_and_padding),
        cmocka_unit_test(test_null_share_of_texts_without_tokens),
        cmocka_unit_test(test_json_error_unset_read_as_format),
        cmocka_unit_test(test_token_strings),
        cmocka_unit_test(test_progress_and_cancel),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_files),
        cmocka_unit_test(test_sentencepiece_files),
        cmocka_unit_test(test_corrupted_files),
    };
    return cmocka_run_group_tests_name("tokenize", tests, tokenize_setup, fixture_teardown);
}
