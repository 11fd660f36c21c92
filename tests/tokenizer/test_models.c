/* The tokenizer's models without Python: cuts whose ids and spans tokenizers 0.19.1 gave (written down
 * here; test_models.py compares many more against tokenizers itself), the statuses of models refused,
 * a cut that needs a missing unk token, spans of a piece that does not start at byte 0, and one work
 * shared by two models (the word cache must not answer for the wrong one). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models.h"

typedef struct golden {
    char const *model; /* JSON */
    char const *text;
    char const *tokens; /* "id:begin-end ..." as tokenizers gives them, offsets in bytes */
} golden_t;

#define WORDPIECE                                                                                            \
    "{\"type\":\"WordPiece\",\"unk_token\":\"[UNK]\",\"continuing_subword_prefix\":\"##\","                  \
    "\"max_input_chars_per_word\":10,\"vocab\":{\"[UNK]\":0,\"un\":1,\"##aff\":2,\"##able\":3,\"u\":4,"      \
    "\"##n\":5,\"é\":6,\"##语\":7,\"##a\":8}}"
#define BPE_MERGES                                                                                           \
    "\"vocab\":{\"<unk>\":0,\"a\":1,\"b\":2,\"c\":3,\"ab\":4,\"bc\":5,\"abc\":6,\"é\":7},"                  \
    "\"merges\":[\"b c\",\"a b\",\"a bc\"]}"
#define BPE       "{\"type\":\"BPE\",\"unk_token\":\"<unk>\"," BPE_MERGES
#define BPE_FUSED "{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":true," BPE_MERGES
#define BPE_IGNORE                                                                                           \
    "{\"type\":\"BPE\",\"ignore_merges\":true,\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\"]}"
#define BPE_BYTES                                                                                            \
    "{\"type\":\"BPE\",\"byte_fallback\":true,\"unk_token\":\"<unk>\",\"merges\":[],"                        \
    "\"vocab\":{\"a\":0,\"<0xC3>\":1,\"<0xA9>\":2,\"<unk>\":3}}"
#define BPE_SUFFIX                                                                                           \
    "{\"type\":\"BPE\",\"end_of_word_suffix\":\"</w>\",\"merges\":[[\"a\",\"b</w>\"]],"                      \
    "\"vocab\":{\"a\":0,\"b\":1,\"a</w>\":2,\"b</w>\":3,\"ab</w>\":4}}"
#define UNIGRAM                                                                                              \
    "{\"type\":\"Unigram\",\"unk_id\":0,\"vocab\":[[\"<unk>\",0],[\"a\",-1],[\"b\",-1],[\"ab\",-2],"         \
    "[\"abc\",-2.5],[\"c\",-1.5],[\"x\",5]]}"
#define UNIGRAM_BYTES                                                                                        \
    "{\"type\":\"Unigram\",\"unk_id\":0,\"byte_fallback\":true,\"vocab\":[[\"<unk>\",0],[\"a\",-1],"         \
    "[\"<0xC3>\",-5],[\"<0xA9>\",-5]]}"
#define WORDLEVEL "{\"type\":\"WordLevel\",\"unk_token\":\"<unk>\",\"vocab\":{\"<unk>\":0,\"hello\":1}}"

static golden_t const goldens[] = {
    {WORDPIECE, "unaffable", "1:0-2 2:2-5 3:5-9"},
    {WORDPIECE, "unaffables", "0:0-10"},  /* no token for "##s": the whole word is unk */
    {WORDPIECE, "unaffableaa", "0:0-11"}, /* past max_input_chars_per_word */
    {WORDPIECE, "é语", "6:0-2 7:2-5"},
    {BPE, "abc", "6:0-3"}, /* "b c" ranks before "a b" */
    {BPE, "abcab", "6:0-3 4:3-5"},
    {BPE, "xxaby", "0:0-1 0:1-2 4:2-4 0:4-5"},
    {BPE_FUSED, "xxaby", "0:0-2 4:2-4 0:4-5"},
    {BPE_IGNORE, "ab", "2:0-0"},  /* a word in the vocabulary: tokenizers 0.19 gives it empty offsets */
    {BPE_IGNORE, "aXb", "2:0-2"}, /* no unk token: X is dropped, and its byte with it */
    {BPE_BYTES, "aéa", "0:0-1 1:1-3 2:1-3 0:3-4"},
    {BPE_BYTES, "a语", "0:0-1 3:1-4"},
    {BPE_SUFFIX, "aab", "0:0-1 4:1-3"},
    {BPE_SUFFIX, "ba", "1:0-1 2:1-2"},
    {UNIGRAM, "ab", "3:0-2"}, /* a+b ties ab: the first offer stands */
    {UNIGRAM, "abc", "4:0-3"},
    {UNIGRAM, "xzzx", "6:0-1 0:1-3 6:3-4"}, /* unknown code points fused */
    {UNIGRAM, "<unk>z", "0:0-6"},           /* ... with the unk piece itself */
    {UNIGRAM_BYTES, "aéa", "1:0-1 2:1-3 3:1-3 1:3-4"},
    {UNIGRAM_BYTES, "a语", "1:0-1 0:1-4"},
    {WORDLEVEL, "hello", "1:0-5"},
    {WORDLEVEL, "hell", "0:0-4"},
};

static model_t *parse(char const *text, uform_status_t expected) {
    json_error_t error;
    json_t *object = json_loads(text, 0, &error);
    assert_non_null(object);
    model_t *model = NULL;
    tokenizer_fault_t fault = {{0}};
    uform_status_t status = model_parse(object, &model, &fault);
    json_decref(object);
    if (status != expected)
        fail_msg("%s: status %d (%s), expected %d", text, status, fault.message, expected);
    assert_true(status == UFORM_OK ? model != NULL : model == NULL && fault.message[0]);
    return model;
}

/* The tokens as "id:begin-end ..." */
static void tokens_text(tokens_t const *tokens, char *text, size_t size) {
    size_t at = 0;
    text[0] = '\0';
    for (size_t i = 0; i < tokens->count && at < size; ++i)
        at += (size_t)snprintf(text + at, size - at, "%s%u:%u-%u", i ? " " : "", tokens->ids[i],
                               tokens->spans[i].begin, tokens->spans[i].end);
}

static uform_status_t cut(model_t const *model, char const *text, tokens_t *tokens, tokenizer_work_t *work) {
    pieces_t pieces = {0};
    size_t bad;
    tokens->count = 0;
    uform_status_t status = pieces_from_utf8(&pieces, (uint8_t const *)text, strlen(text), &bad);
    for (size_t i = 0; i < pieces.count && status == UFORM_OK; ++i)
        status = model_tokenize(model, &pieces, i, tokens, work);
    pieces_free(&pieces);
    return status;
}

static void work_release(tokenizer_work_t *work) {
    model_work_free(work);
    free(work->bytes);
}

static void cuts_match_tokenizers(void **state) {
    (void)state;
    tokenizer_work_t work = {0};
    tokens_t tokens = {0};
    for (size_t i = 0; i < sizeof goldens / sizeof *goldens; ++i) {
        model_t *model = parse(goldens[i].model, UFORM_OK);
        for (int round = 0; round < 2; ++round) { /* the second from the word cache */
            char text[256];
            assert_int_equal(cut(model, goldens[i].text, &tokens, &work), UFORM_OK);
            tokens_text(&tokens, text, sizeof text);
            if (strcmp(text, goldens[i].tokens) != 0)
                fail_msg("%s on \"%s\": %s, expected %s", goldens[i].model, goldens[i].text, text,
                         goldens[i].tokens);
        }
        model_free(model);
    }
    tokens_free(&tokens);
    work_release(&work);
}

static void refusals_name_their_status(void **state) {
    (void)state;
    static struct {
        char const *model;
        uform_status_t status;
    } const cases[] = {
        {"{\"type\":\"Pretend\"}", UFORM_UNSUPPORTED},
        {"{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[],\"dropout\":0.5}", UFORM_UNSUPPORTED},
        {"{\"vocab\":{\"a\":0},\"merges\":[],\"dropout\":0.5}", UFORM_UNSUPPORTED},
        {"{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[],\"dropout\":1.5}", UFORM_FORMAT},
        {"{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a b\"]}", UFORM_FORMAT},
        {"{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":0},\"merges\":[]}", UFORM_FORMAT},
        {"{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\"],"
         "\"continuing_subword_prefix\":\"##\"}",
         UFORM_FORMAT},
        {"{\"type\":\"WordPiece\",\"vocab\":{\"a\":0},\"unk_token\":\"a\",\"continuing_subword_prefix\":\"##"
         "\"}",
         UFORM_FORMAT},
        {"{\"type\":\"Unigram\",\"vocab\":[[\"a\",0]],\"unk_id\":1}", UFORM_FORMAT},
        {"{\"type\":\"Unigram\",\"vocab\":[[\"a\",\"0\"]]}", UFORM_FORMAT},
        {"{\"type\":3}", UFORM_FORMAT},
        {"{\"vocab\":3}", UFORM_FORMAT},
        {"[]", UFORM_FORMAT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; ++i)
        parse(cases[i].model, cases[i].status);
    /* Without "type": the first model whose fields the object has, as tokenizers' untagged enum. */
    model_t *model = parse("{\"vocab\":{\"a\":0},\"unk_token\":\"a\"}", UFORM_OK);
    assert_int_equal(model->kind, MODEL_WORDLEVEL);
    model_free(model);
    model = parse("{\"vocab\":[[\"a\",0]]}", UFORM_OK);
    assert_int_equal(model->kind, MODEL_UNIGRAM);
    model_free(model);
}

static void missing_unk_fails_the_cut(void **state) {
    (void)state;
    static char const *const models[] = {
        "{\"type\":\"BPE\",\"unk_token\":\"<none>\",\"vocab\":{\"a\":0},\"merges\":[]}",
        ("{\"type\":\"WordPiece\",\"unk_token\":\"[UNK]\",\"continuing_subword_prefix\":\"##\","
         "\"max_input_chars_per_word\":100,\"vocab\":{\"a\":0}}"),
        "{\"type\":\"WordLevel\",\"unk_token\":\"<unk>\",\"vocab\":{\"a\":0}}",
        "{\"type\":\"Unigram\",\"vocab\":[[\"a\",0]]}",
    };
    tokenizer_work_t work = {0};
    tokens_t tokens = {0};
    for (size_t i = 0; i < sizeof models / sizeof *models; ++i) {
        model_t *model = parse(models[i], UFORM_OK);
        assert_int_equal(cut(model, "a", &tokens, &work), UFORM_OK);
        assert_string_equal(model_work_fault(&work), "");
        assert_int_equal(cut(model, "b", &tokens, &work), UFORM_FORMAT);
        assert_true(strstr(model_work_fault(&work), "unk") != NULL);
        model_free(model);
    }
    tokens_free(&tokens);
    work_release(&work);
}

/* A piece that begins at original byte 10, each code point from 2 original bytes (as after a
 * normalizer): spans come from the code points, an empty range sits at the shift, a range past the
 * piece's end (byte tokens of a prefix) keeps the model's own offsets, as tokenizers does. */
static void spans_follow_the_piece(void **state) {
    (void)state;
    pieces_t pieces = {0};
    assert_int_equal(pieces_begin(&pieces, 10, PIECE_OPEN), UFORM_OK);
    uint32_t const chars[] = {'a', 0xE9, 'b'};
    for (uint32_t i = 0; i < 3; ++i)
        assert_int_equal(pieces_push(&pieces, chars[i], (piece_span_t){10 + 2 * i, 12 + 2 * i}), UFORM_OK);
    pieces_end(&pieces);
    static struct {
        char const *model, *tokens;
    } const cases[] = {
        {"{\"type\":\"BPE\",\"ignore_merges\":true,\"vocab\":{\"a\":0,\"aéb\":1},\"merges\":[]}", "1:10-10"},
        {"{\"type\":\"BPE\",\"byte_fallback\":true,\"continuing_subword_prefix\":\"#\",\"merges\":[],"
         "\"vocab\":{\"a\":0,\"#b\":1,\"<0x23>\":2,\"<0xC3>\":3,\"<0xA9>\":4}}",
         "0:10-12 2:12-14 3:12-14 4:14-16 1:4-5"},
        {WORDPIECE, "0:10-16"},
    };
    tokenizer_work_t work = {0};
    tokens_t tokens = {0};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; ++i) {
        model_t *model = parse(cases[i].model, UFORM_OK);
        char text[256];
        tokens.count = 0;
        assert_int_equal(model_tokenize(model, &pieces, 0, &tokens, &work), UFORM_OK);
        tokens_text(&tokens, text, sizeof text);
        assert_string_equal(text, cases[i].tokens);
        model_free(model);
    }
    tokens_free(&tokens);
    pieces_free(&pieces);
    work_release(&work);
}

/* Two models on one work in turns: each cut equals the one a fresh work gives. */
static void one_work_two_models(void **state) {
    (void)state;
    model_t *first = parse(BPE, UFORM_OK), *second = parse(BPE_FUSED, UFORM_OK);
    tokenizer_work_t work = {0};
    tokens_t tokens = {0};
    char text[256];
    for (int round = 0; round < 3; ++round) {
        assert_int_equal(cut(first, "xxaby", &tokens, &work), UFORM_OK);
        tokens_text(&tokens, text, sizeof text);
        assert_string_equal(text, "0:0-1 0:1-2 4:2-4 0:4-5");
        assert_int_equal(cut(second, "xxaby", &tokens, &work), UFORM_OK);
        tokens_text(&tokens, text, sizeof text);
        assert_string_equal(text, "0:0-2 4:2-4 0:4-5");
    }
    model_free(first);
    model_free(second);
    tokens_free(&tokens);
    work_release(&work);
}

int main(void) {
    struct CMUnitTest const tests[] = {
        cmocka_unit_test(cuts_match_tokenizers),     cmocka_unit_test(refusals_name_their_status),
        cmocka_unit_test(missing_unk_fails_the_cut), cmocka_unit_test(spans_follow_the_piece),
        cmocka_unit_test(one_work_two_models),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
