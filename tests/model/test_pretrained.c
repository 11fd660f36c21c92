/* Pretrained folders (src/model/pretrained.c) through the public load verb: a small sentence-transformers
 * BERT folder written here loads, describes itself and encodes texts; damaged and unsupported folders
 * end in UFORM_IO, UFORM_FORMAT or UFORM_UNSUPPORTED naming the file and the fault, and leave the
 * executor usable. Faithfulness to sentence-transformers is test_pretrained_reference.py's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "model.h"

#define HIDDEN    64
#define HEADS     2
#define MLP       128
#define DEPTH     2
#define POSITIONS 40
#define VOCAB     16
#define CONTEXT   12 /* sentence_bert_config.json's max_seq_length */

static char folder[256];

static char const tokenizer_json[] =
    "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":["
    "{\"id\":0,\"content\":\"[PAD]\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":"
    "false,"
    "\"special\":true},"
    "{\"id\":1,\"content\":\"[UNK]\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":"
    "false,"
    "\"special\":true},"
    "{\"id\":2,\"content\":\"[CLS]\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":"
    "false,"
    "\"special\":true},"
    "{\"id\":3,\"content\":\"[SEP]\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":"
    "false,"
    "\"special\":true}],"
    "\"normalizer\":{\"type\":\"BertNormalizer\",\"clean_text\":true,\"handle_chinese_chars\":true,"
    "\"strip_accents\":null,\"lowercase\":true},"
    "\"pre_tokenizer\":{\"type\":\"BertPreTokenizer\"},"
    "\"post_processor\":{\"type\":\"BertProcessing\",\"sep\":[\"[SEP]\",3],\"cls\":[\"[CLS]\",2]},"
    "\"decoder\":null,"
    "\"model\":{\"type\":\"WordPiece\",\"unk_token\":\"[UNK]\",\"continuing_subword_prefix\":\"##\","
    "\"max_input_chars_per_word\":100,\"vocab\":{\"[PAD]\":0,\"[UNK]\":1,\"[CLS]\":2,\"[SEP]\":3,\"a\":4,"
    "\"cat\":5,\"sits\":6,\"on\":7,\"the\":8,\"mat\":9,\"##s\":10,\"kitten\":11,\"rug\":12,\"stock\":13,"
    "\"markets\":14,\".\":15}}}";

static char const modules_json[] =
    "[{\"idx\":0,\"name\":\"0\",\"path\":\"\",\"type\":\"sentence_transformers.models.Transformer\"},"
    "{\"idx\":1,\"name\":\"1\",\"path\":\"1_Pooling\",\"type\":\"sentence_transformers.models.Pooling\"},"
    "{\"idx\":2,\"name\":\"2\",\"path\":\"2_Normalize\",\"type\":\"sentence_transformers.models.Normalize\"}"
    "]";

static char const pooling_json[] = "{\"word_embedding_dimension\":64,\"pooling_mode_cls_token\":false,"
                                   "\"pooling_mode_mean_tokens\":true,\"pooling_mode_max_tokens\":false,"
                                   "\"pooling_mode_mean_sqrt_len_tokens\":false}";

/* ---- writing a folder --------------------------------------------------------------------------- */

static void write_text(char const *name, char const *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", folder, name);
    FILE *file = fopen(path, "wb");
    assert_non_null(file);
    assert_int_equal(fwrite(text, 1, strlen(text), file), strlen(text));
    assert_int_equal(fclose(file), 0);
}

static void remove_file(char const *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", folder, name);
    unlink(path);
}

static void write_config(char const *model_type, size_t hidden, size_t heads, size_t mlp, char const *act) {
    char text[1024];
    snprintf(text, sizeof text,
             "{\"architectures\":[\"BertModel\"],\"model_type\":\"%s\",\"hidden_size\":%zu,"
             "\"num_hidden_layers\":%d,\"num_attention_heads\":%zu,\"intermediate_size\":%zu,"
             "\"hidden_act\":\"%s\",\"layer_norm_eps\":1e-12,\"max_position_embeddings\":%d,"
             "\"type_vocab_size\":2,\"vocab_size\":%d,\"pad_token_id\":0,\"position_embedding_type\":"
             "\"absolute\"}",
             model_type, hidden, DEPTH, heads, mlp, act, POSITIONS, VOCAB);
    write_text("config.json", text);
}

/* Deterministic values in [-scale, scale] (plus `offset`), F32. */
static float *values(size_t count, unsigned seed, float scale, float offset) {
    float *out = malloc(count * sizeof *out);
    assert_non_null(out);
    unsigned state = seed * 2654435761u + 1;
    for (size_t i = 0; i < count; ++i) {
        state = state * 1664525u + 1013904223u;
        out[i] = offset + scale * ((float)(state >> 8) / (float)(1u << 24) * 2.0f - 1.0f);
    }
    return out;
}

/* The dtype write_weights stores: F32, or F16 (as `model.half()` saves). */
static checkpoint_dtype_t weights_dtype = CHECKPOINT_F32;

/* A float as an IEEE half, to nearest even; the test's values are normal or flush to zero. */
static uint16_t f32_to_f16(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    uint32_t sign = (bits >> 16) & 0x8000u, mantissa = bits & 0x7FFFFFu;
    int32_t exponent = (int32_t)((bits >> 23) & 0xFFu) - 127 + 15;
    if (exponent <= 0) return (uint16_t)sign;
    uint32_t half = sign | ((uint32_t)exponent << 10) | (mantissa >> 13), rest = mantissa & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) half++;
    return (uint16_t)half;
}

/* The two shards write_weights_sharded writes, as transformers names them. */
static char const *const shard_names[] = {"model-00001-of-00002.safetensors",
                                          "model-00002-of-00002.safetensors"};

/* The weights of a BertModel, every tensor but `skip` (NULL: none): in model.safetensors, or with `sharded`
 * the first half of the tensors in shard_names[0], the rest in shard_names[1] and their index in
 * model.safetensors.index.json, as transformers saves a large model. */
static void write_weights_as(char const *skip, bool sharded) {
    checkpoint_source_t tensors[128];
    float *owned[128];
    size_t count = 0;
    char names[128][96];
#define TENSOR(rows, columns, scale, offset, ...)                                                            \
    do {                                                                                                     \
        snprintf(names[count], sizeof names[count], __VA_ARGS__);                                            \
        if (skip && strcmp(names[count], skip) == 0) break;                                                  \
        size_t n = (rows) * ((columns) ? (columns) : 1);                                                     \
        owned[count] = values(n, (unsigned)count + 1, scale, offset);                                        \
        if (weights_dtype == CHECKPOINT_F16) {                                                               \
            uint16_t *halves = (uint16_t *)(void *)owned[count]; /* in place: 2 bytes from every 4 */        \
            for (size_t e = 0; e < n; ++e)                                                                   \
                halves[e] = f32_to_f16(owned[count][e]);                                                     \
        }                                                                                                    \
        tensors[count] = (checkpoint_source_t){.name = names[count],                                         \
                                               .dtype = weights_dtype,                                       \
                                               .rank = (columns) ? 2 : 1,                                    \
                                               .shape = {(rows), (columns)},                                 \
                                               .data = owned[count]};                                        \
        count++;                                                                                             \
    } while (0)
    TENSOR(VOCAB, HIDDEN, 0.5f, 0.0f, "embeddings.word_embeddings.weight");
    TENSOR(POSITIONS, HIDDEN, 0.5f, 0.0f, "embeddings.position_embeddings.weight");
    TENSOR(2, HIDDEN, 0.5f, 0.0f, "embeddings.token_type_embeddings.weight");
    TENSOR(HIDDEN, 0, 0.1f, 1.0f, "embeddings.LayerNorm.weight");
    TENSOR(HIDDEN, 0, 0.1f, 0.0f, "embeddings.LayerNorm.bias");
    for (int i = 0; i < DEPTH; ++i) {
        char const *const attention[] = {"query", "key", "value"};
        for (int a = 0; a < 3; ++a) {
            TENSOR(HIDDEN, HIDDEN, 0.15f, 0.0f, "encoder.layer.%d.attention.self.%s.weight", i, attention[a]);
            TENSOR(HIDDEN, 0, 0.05f, 0.0f, "encoder.layer.%d.attention.self.%s.bias", i, attention[a]);
        }
        TENSOR(HIDDEN, HIDDEN, 0.15f, 0.0f, "encoder.layer.%d.attention.output.dense.weight", i);
        TENSOR(HIDDEN, 0, 0.05f, 0.0f, "encoder.layer.%d.attention.output.dense.bias", i);
        TENSOR(HIDDEN, 0, 0.1f, 1.0f, "encoder.layer.%d.attention.output.LayerNorm.weight", i);
        TENSOR(HIDDEN, 0, 0.1f, 0.0f, "encoder.layer.%d.attention.output.LayerNorm.bias", i);
        TENSOR(MLP, HIDDEN, 0.15f, 0.0f, "encoder.layer.%d.intermediate.dense.weight", i);
        TENSOR(MLP, 0, 0.05f, 0.0f, "encoder.layer.%d.intermediate.dense.bias", i);
        TENSOR(HIDDEN, MLP, 0.1f, 0.0f, "encoder.layer.%d.output.dense.weight", i);
        TENSOR(HIDDEN, 0, 0.05f, 0.0f, "encoder.layer.%d.output.dense.bias", i);
        TENSOR(HIDDEN, 0, 0.1f, 1.0f, "encoder.layer.%d.output.LayerNorm.weight", i);
        TENSOR(HIDDEN, 0, 0.1f, 0.0f, "encoder.layer.%d.output.LayerNorm.bias", i);
    }
#undef TENSOR
    char path[512];
    char const *message = NULL;
    if (!sharded) {
        snprintf(path, sizeof path, "%s/model.safetensors", folder);
        assert_int_equal(checkpoint_write(path, NULL, tensors, count, &message), UFORM_OK);
    } else {
        size_t half = count / 2;
        for (size_t s = 0; s < 2; ++s) {
            snprintf(path, sizeof path, "%s/%s", folder, shard_names[s]);
            assert_int_equal(
                checkpoint_write(path, NULL, tensors + s * half, s ? count - half : half, &message),
                UFORM_OK);
        }
        static char index[16384];
        size_t at =
            (size_t)snprintf(index, sizeof index, "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {");
        for (size_t i = 0; i < count; ++i)
            at += (size_t)snprintf(index + at, sizeof index - at, "%s\"%s\": \"%s\"", i ? ", " : "", names[i],
                                   shard_names[i >= half]);
        assert_true(at + 3 < sizeof index);
        snprintf(index + at, sizeof index - at, "}}");
        write_text("model.safetensors.index.json", index);
    }
    for (size_t i = 0; i < count; ++i)
        free(owned[i]);
}

static void write_weights(char const *skip) {
    write_weights_as(skip, false);
}

/* The folder as sentence-transformers saves all-MiniLM-L6-v2's, in small. */
static void write_folder(void) {
    write_config("bert", HIDDEN, HEADS, MLP, "gelu");
    write_weights(NULL);
    write_text("tokenizer.json", tokenizer_json);
    write_text("modules.json", modules_json);
    write_text("1_Pooling/config.json", pooling_json);
    write_text("sentence_bert_config.json", "{\"max_seq_length\": 12, \"do_lower_case\": false}");
}

static int setup(void **state) {
    (void)state;
    char const *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(folder, sizeof folder, "%s/uform-pretrained-XXXXXX", base);
    if (!mkdtemp(folder)) return -1;
    char path[512];
    snprintf(path, sizeof path, "%s/1_Pooling", folder);
    if (mkdir(path, 0700) != 0) return -1;
    snprintf(path, sizeof path, "%s/2_Normalize", folder);
    if (mkdir(path, 0700) != 0) return -1;
    snprintf(path, sizeof path, "%s/2_Dense", folder);
    if (mkdir(path, 0700) != 0) return -1;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char const *const files[] = {"config.json",
                                 "model.safetensors",
                                 "tokenizer.json",
                                 "modules.json",
                                 "1_Pooling/config.json",
                                 "sentence_bert_config.json",
                                 "pytorch_model.bin",
                                 "config_sentence_transformers.json",
                                 "tiny.safetensors",
                                 "model.safetensors.index.json",
                                 "model-00001-of-00002.safetensors",
                                 "model-00002-of-00002.safetensors",
                                 "2_Dense/config.json",
                                 "2_Dense/pytorch_model.bin"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; ++i)
        remove_file(files[i]);
    char path[512];
    snprintf(path, sizeof path, "%s/1_Pooling", folder);
    rmdir(path);
    snprintf(path, sizeof path, "%s/2_Normalize", folder);
    rmdir(path);
    snprintf(path, sizeof path, "%s/2_Dense", folder);
    rmdir(path);
    rmdir(folder);
    return 0;
}

/* ---- helpers ------------------------------------------------------------------------------------ */

static uform_status_t load(uform_model_t **model) {
    uform_model_load_args_t args = {.path = folder, .model = model};
    return uform_model_load_ram(&args);
}

/* Embeds `count` texts into `out` [count, HIDDEN]; answers the call's status, item statuses in `statuses`. */
static uform_status_t embed(uform_model_t *model, char const *const *texts, size_t count, float *out,
                            uform_status_t *statuses, uform_encode_stats_t *stats) {
    size_t offsets[16] = {0};
    char data[4096];
    for (size_t i = 0; i < count; ++i) {
        size_t length = strlen(texts[i]);
        memcpy(data + offsets[i], texts[i], length);
        offsets[i + 1] = offsets[i] + length;
    }
    uform_arena_t *arena = NULL;
    assert_int_equal(uform_arena_create_host(&arena), UFORM_OK);
    uform_encoded_t encoded;
    uform_encode_config_t config = {.stats = stats};
    uform_text_encode_args_t args = {
        .model = model,
        .outputs = UFORM_OUTPUT_EMBEDDINGS,
        .arena = arena,
        .config = &config,
        .encoded = &encoded,
        .texts = {.data = data, .offsets = offsets, .count = count, .length = offsets[count]}};
    uform_status_t status = uform_text_encode(&args);
    if (status == UFORM_OK) {
        assert_int_equal(encoded.embeddings.columns, HIDDEN);
        for (size_t i = 0; i < count; ++i) {
            memcpy(out + i * HIDDEN,
                   (char const *)encoded.embeddings.data + i * encoded.embeddings.row_stride,
                   HIDDEN * sizeof(float));
            statuses[i] = encoded.statuses[i];
        }
    }
    uform_arena_free(arena);
    return status;
}

/* ---- tests -------------------------------------------------------------------------------------- */

static void folder_loads_and_describes_itself(void **state) {
    (void)state;
    write_folder();
    uform_model_t *model = NULL;
    assert_int_equal(load(&model), UFORM_OK);
    uform_model_info_t info;
    assert_int_equal(uform_model_info(model, &info), UFORM_OK);
    assert_string_equal(info.family, "bert");
    assert_true(info.normalized);
    assert_true(info.has_text);
    assert_false(info.has_image);
    assert_int_equal(info.dims, HIDDEN);
    assert_int_equal(info.text.vocab, VOCAB);
    assert_int_equal(info.text.context, CONTEXT);
    assert_int_equal(info.text.positions, POSITIONS);
    assert_int_equal(info.text.position_offset, 0);
    assert_true(info.text.token_type);
    uform_transformer_info_t const *t = &info.text.transformer;
    assert_int_equal(t->depth, DEPTH);
    assert_int_equal(t->heads, HEADS);
    assert_int_equal(t->head, HIDDEN / HEADS);
    assert_int_equal(t->norm, UFORM_NORM_LAYER);
    assert_true(t->post_norm);
    assert_true(t->input_norm);
    assert_false(t->final_norm);
    assert_int_equal(t->activation, UFORM_ACTIVATION_GELU_ERF);
    assert_false(t->rotary);
    assert_false(t->causal);
    assert_int_equal(t->pooling, UFORM_POOLING_MEAN);
    assert_false(t->projection);
    uform_model_free(model);
}

/* Unit vectors (the folder normalizes), each text's the same alone and in a batch, a long text cut at
 * the context and counted, an empty text its special tokens', invalid UTF-8 failing alone. */
static void folder_encodes_texts(void **state) {
    (void)state;
    write_folder();
    uform_model_t *model = NULL;
    assert_int_equal(load(&model), UFORM_OK);
    char const *const texts[] = {"a cat sits on the mat", "", "a kitten rests on a rug",
                                 "stock markets fell sharply. the the the the the the the the the the",
                                 "\xff\xfe"};
    float batch[5 * HIDDEN], alone[HIDDEN];
    uform_status_t statuses[5], status;
    uform_encode_stats_t stats;
    assert_int_equal(embed(model, texts, 5, batch, statuses, &stats), UFORM_OK);
    assert_int_equal(stats.truncated, 1);
    assert_int_equal(stats.failed, 1);
    assert_int_equal(statuses[4], UFORM_FORMAT);
    for (size_t i = 0; i < 4; ++i) {
        assert_int_equal(statuses[i], UFORM_OK);
        double norm = 0;
        for (size_t h = 0; h < HIDDEN; ++h)
            norm += (double)batch[i * HIDDEN + h] * batch[i * HIDDEN + h];
        assert_true(fabs(norm - 1.0) < 1e-5);
        assert_int_equal(embed(model, &texts[i], 1, alone, &status, NULL), UFORM_OK);
        assert_memory_equal(alone, batch + i * HIDDEN, sizeof alone);
    }
    for (size_t h = 0; h < HIDDEN; ++h)
        assert_true(batch[4 * HIDDEN + h] == 0.0f);
    /* Different texts, different vectors. */
    assert_memory_not_equal(batch, batch + HIDDEN, HIDDEN * sizeof(float));
    uform_model_free(model);
}

/* Weights sharded as transformers shards a large model's (model-0000K-of-0000N.safetensors and their
 * index) load to the embeddings of the same weights in one model.safetensors, bit for bit. */
static void sharded_weights_load_as_the_whole_file(void **state) {
    (void)state;
    char const *const texts[] = {"a cat sits on the mat", "stock markets", ""};
    float whole[3 * HIDDEN], sharded[3 * HIDDEN];
    uform_status_t statuses[3];
    write_folder();
    uform_model_t *model = NULL;
    assert_int_equal(load(&model), UFORM_OK);
    assert_int_equal(embed(model, texts, 3, whole, statuses, NULL), UFORM_OK);
    uform_model_free(model);
    remove_file("model.safetensors");
    write_weights_as(NULL, true);
    model = NULL;
    assert_int_equal(load(&model), UFORM_OK);
    assert_int_equal(embed(model, texts, 3, sharded, statuses, NULL), UFORM_OK);
    assert_memory_equal(whole, sharded, sizeof whole);
    uform_model_free(model);
    remove_file("model.safetensors.index.json");
    remove_file(shard_names[0]);
    remove_file(shard_names[1]);
}

/* every_text_refused_offset_null_ids: a batch whose every text the tokenizer refuses holds no token ids
 * at all (NULL); embedding its items offset that NULL by 0, undefined behaviour that UBSan reported. Each
 * item answers its status and a zero row, and the model goes on. */
static void every_text_refused_offset_null_ids(void **state) {
    (void)state;
    write_folder();
    uform_model_t *model = NULL;
    assert_int_equal(load(&model), UFORM_OK);
    char const *const refused[] = {"\xff\xfe", "\xc3"};
    float rows[2 * HIDDEN], alone[HIDDEN];
    uform_status_t statuses[2], status;
    uform_encode_stats_t stats;
    assert_int_equal(embed(model, refused, 2, rows, statuses, &stats), UFORM_OK);
    assert_int_equal(stats.failed, 2);
    for (size_t i = 0; i < 2; ++i) {
        assert_int_equal(statuses[i], UFORM_FORMAT);
        for (size_t h = 0; h < HIDDEN; ++h)
            assert_true(rows[i * HIDDEN + h] == 0.0f);
    }
    char const *const fine[] = {"a cat"};
    assert_int_equal(embed(model, fine, 1, alone, &status, NULL), UFORM_OK);
    assert_int_equal(status, UFORM_OK);
    uform_model_free(model);
}

/* f16_weights_load_as_f32_ones: weights saved in F16 convert to BF16 through their exact float values, and
 * embed as the same weights saved in F32 do, to the rounding F16 adds. */
static void f16_weights_load_as_f32_ones(void **state) {
    (void)state;
    char const *const texts[] = {"a cat sits on the mat", "stock markets"};
    float vectors[2][2 * HIDDEN];
    uform_status_t statuses[2];
    for (size_t k = 0; k < 2; ++k) {
        weights_dtype = k ? CHECKPOINT_F16 : CHECKPOINT_F32;
        write_folder();
        uform_model_t *model = NULL;
        assert_int_equal(load(&model), UFORM_OK);
        assert_int_equal(embed(model, texts, 2, vectors[k], statuses, NULL), UFORM_OK);
        uform_model_free(model);
    }
    weights_dtype = CHECKPOINT_F32;
    for (size_t t = 0; t < 2; ++t) {
        double dot = 0;
        for (size_t h = 0; h < HIDDEN; ++h)
            dot += (double)vectors[0][t * HIDDEN + h] * vectors[1][t * HIDDEN + h];
        if (!(dot > 0.999)) fail_msg("text %zu: cosine %f between F32 and F16 weights", t, dot);
    }
}

/* A fault written into the folder, and what loading it must answer. */
typedef struct fault {
    char const *what;
    void (*damage)(void);
    uform_status_t status;
    char const *message; /* a part of the error's message */
} fault_t;

static void no_config(void) {
    remove_file("config.json");
}
static void config_not_json(void) {
    write_text("config.json", "{\"model_type\": \"bert\",");
}
static void other_model_type(void) {
    write_config("gpt2", HIDDEN, HEADS, MLP, "gelu");
}
static void huge_hidden(void) {
    write_config("bert", 1000000000000ull, HEADS, MLP, "gelu");
}
static void uneven_heads(void) {
    write_config("bert", HIDDEN, 3, MLP, "gelu");
}
static void unknown_activation(void) {
    write_config("bert", HIDDEN, HEADS, MLP, "relu");
}
static void wrong_mlp(void) {
    write_config("bert", HIDDEN, HEADS, 2 * MLP, "gelu");
}
static void no_weights(void) {
    remove_file("model.safetensors");
}
static void pickled_weights(void) {
    remove_file("model.safetensors");
    write_text("pytorch_model.bin", "PK");
}
static void weights_not_safetensors(void) {
    write_text("model.safetensors", "\x10\0\0\0\0\0\0\0{\"a\": 1}");
}
static void missing_tensor(void) {
    write_weights("encoder.layer.1.attention.self.value.bias");
}
static void dense_module(void) {
    write_text(
        "modules.json",
        "[{\"idx\":0,\"name\":\"0\",\"path\":\"\",\"type\":\"sentence_transformers.models.Transformer\"},"
        "{\"idx\":1,\"name\":\"1\",\"path\":\"2_Dense\",\"type\":\"sentence_transformers.models.Dense\"}]");
}
/* A Dense module after the pooling, its config.json `config`. */
static void dense_after_pooling(char const *config) {
    write_text(
        "modules.json",
        "[{\"idx\":0,\"name\":\"0\",\"path\":\"\",\"type\":\"sentence_transformers.models.Transformer\"},"
        "{\"idx\":1,\"name\":\"1\",\"path\":\"1_Pooling\",\"type\":\"sentence_transformers.models.Pooling\"},"
        "{\"idx\":2,\"name\":\"2\",\"path\":\"2_Dense\",\"type\":\"sentence_transformers.models.Dense\"}]");
    write_text("2_Dense/config.json", config);
}
static void dense_relu(void) {
    dense_after_pooling("{\"in_features\": 64, \"out_features\": 32, \"bias\": true, "
                        "\"activation_function\": \"torch.nn.modules.activation.ReLU\"}");
}
static void dense_other_width(void) {
    dense_after_pooling("{\"in_features\": 32, \"out_features\": 32}");
}
static void dense_without_weights(void) {
    dense_after_pooling("{\"in_features\": 64, \"out_features\": 32}");
}
static void dense_pickled(void) {
    dense_after_pooling("{\"in_features\": 64, \"out_features\": 32}");
    write_text("2_Dense/pytorch_model.bin", "PK");
}
static void max_pooling(void) {
    write_text("1_Pooling/config.json", "{\"pooling_mode_max_tokens\": true}");
}
/* pooling_without_mean_key_is_cls_and_mean: sentence-transformers reads an absent mean key as true, so a file
 * naming only cls concatenates cls and mean pooling, which the engine does not do. */
static void cls_without_mean_key(void) {
    write_text("1_Pooling/config.json", "{\"pooling_mode_cls_token\": true}");
}
static void escaping_module(void) {
    write_text("modules.json", "[{\"idx\":0,\"name\":\"0\",\"path\":\"../"
                               "..\",\"type\":\"sentence_transformers.models.Transformer\"}]");
}
static void no_tokenizer(void) {
    remove_file("tokenizer.json");
}
static void tokenizer_past_vocabulary(void) {
    char text[sizeof tokenizer_json + 32];
    snprintf(text, sizeof text, "%s", tokenizer_json);
    char *at = strstr(text, "\".\":15");
    assert_non_null(at);
    memcpy(at, "\".\":99", 6);
    write_text("tokenizer.json", text);
}
/* The folder's weights in two shards and their index, the index then rewritten by `edit` (NULL: as written):
 * the first occurrence of `from` replaced by `to`. */
static void sharded_with(char const *from, char const *to) {
    remove_file("model.safetensors");
    write_weights_as(NULL, true);
    if (!from) return;
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", folder);
    FILE *file = fopen(path, "rb");
    assert_non_null(file);
    static char text[16384], edited[16384];
    size_t length = fread(text, 1, sizeof text - 1, file);
    fclose(file);
    text[length] = '\0';
    char *at = strstr(text, from);
    assert_non_null(at);
    snprintf(edited, sizeof edited, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    write_text("model.safetensors.index.json", edited);
}
static void shard_outside_the_folder(void) {
    sharded_with("\"model-00002-of-00002.safetensors\"", "\"../model-00002-of-00002.safetensors\"");
}
static void index_without_weight_map(void) {
    sharded_with("weight_map", "weights");
}
static void index_not_json(void) {
    sharded_with("{", "[");
}
static void missing_shard(void) {
    sharded_with(NULL, NULL);
    remove_file(shard_names[1]);
}
static void tensor_in_two_shards(void) {
    sharded_with(NULL, NULL);
    write_weights(NULL); /* every tensor, then moved over the second shard: it holds the first's too */
    char whole[512], second[512];
    snprintf(whole, sizeof whole, "%s/model.safetensors", folder);
    snprintf(second, sizeof second, "%s/%s", folder, shard_names[1]);
    assert_int_equal(rename(whole, second), 0);
}
static void sinusoidal_distilbert(void) {
    write_text("config.json",
               "{\"model_type\": \"distilbert\", \"dim\": 64, \"n_layers\": 2, \"n_heads\": 2, "
               "\"hidden_dim\": 128, \"vocab_size\": 16, \"sinusoidal_pos_embds\": true}");
}
static void distilbert_relu(void) {
    write_text("config.json",
               "{\"model_type\": \"distilbert\", \"dim\": 64, \"n_layers\": 2, \"n_heads\": 2, "
               "\"hidden_dim\": 128, \"vocab_size\": 16, \"activation\": \"relu\"}");
}
static void distilbert_of_bert_weights(void) {
    write_text("config.json",
               "{\"model_type\": \"distilbert\", \"dim\": 64, \"n_layers\": 2, \"n_heads\": 2, "
               "\"hidden_dim\": 128, \"vocab_size\": 16, \"max_position_embeddings\": 40}");
}
static void mpnet_other_buckets(void) {
    write_text("config.json", "{\"model_type\": \"mpnet\", \"hidden_size\": 64, \"num_hidden_layers\": 2, "
                              "\"num_attention_heads\": 2, \"intermediate_size\": 128, \"vocab_size\": 16, "
                              "\"relative_attention_num_buckets\": 64}");
}
static void mpnet_of_bert_weights(void) {
    write_text("config.json", "{\"model_type\": \"mpnet\", \"hidden_size\": 64, \"num_hidden_layers\": 2, "
                              "\"num_attention_heads\": 2, \"intermediate_size\": 128, \"vocab_size\": 16, "
                              "\"max_position_embeddings\": 40}");
}
static void uform3_folder(void) {
    write_text("config.json", "{\"text_encoder\": {}, \"image_encoder\": {}}");
}

static void damaged_folders_fail_clearly(void **state) {
    (void)state;
    fault_t const faults[] = {
        {"no config.json", no_config, UFORM_IO, "config.json"},
        {"config.json not JSON", config_not_json, UFORM_FORMAT, "config.json: not JSON"},
        {"another model_type", other_model_type, UFORM_UNSUPPORTED, "gpt2"},
        {"a huge hidden_size", huge_hidden, UFORM_FORMAT, "hidden_size"},
        {"heads that do not divide hidden", uneven_heads, UFORM_UNSUPPORTED, "heads"},
        {"an unknown activation", unknown_activation, UFORM_UNSUPPORTED, "relu"},
        {"shapes the configuration does not give", wrong_mlp, UFORM_FORMAT, "intermediate.dense.weight"},
        {"no weights", no_weights, UFORM_IO, "model.safetensors"},
        {"pickled weights", pickled_weights, UFORM_UNSUPPORTED, "pytorch_model.bin"},
        {"weights not safetensors", weights_not_safetensors, UFORM_FORMAT, "model.safetensors"},
        {"a missing tensor", missing_tensor, UFORM_FORMAT, "value.bias"},
        {"a Dense module before the pooling", dense_module, UFORM_UNSUPPORTED, "Dense"},
        {"a Dense module of ReLU", dense_relu, UFORM_UNSUPPORTED,
         "activation_function torch.nn.modules.activation.ReLU"},
        {"a Dense module of another width", dense_other_width, UFORM_FORMAT, "in_features 32"},
        {"a Dense module without weights", dense_without_weights, UFORM_IO, "2_Dense/model.safetensors"},
        {"a Dense module of pickled weights", dense_pickled, UFORM_UNSUPPORTED, "2_Dense/pytorch_model.bin"},
        {"max pooling", max_pooling, UFORM_UNSUPPORTED, "pooling"},
        {"cls pooling without the mean key", cls_without_mean_key, UFORM_UNSUPPORTED, "pooling"},
        {"a module outside the folder", escaping_module, UFORM_FORMAT, "modules.json"},
        {"no tokenizer", no_tokenizer, UFORM_IO, "tokenizer"},
        {"tokenizer ids past the vocabulary", tokenizer_past_vocabulary, UFORM_FORMAT, "vocabulary"},
        {"a UForm 3 folder without sizes", uform3_folder, UFORM_FORMAT, "text_encoder: \"dim\""},
        {"a DistilBERT of sinusoidal positions", sinusoidal_distilbert, UFORM_UNSUPPORTED,
         "sinusoidal_pos_embds"},
        {"a DistilBERT with ReLU", distilbert_relu, UFORM_UNSUPPORTED, "activation \"relu\""},
        {"a DistilBERT folder of BERT's weights", distilbert_of_bert_weights, UFORM_FORMAT, "no tensor"},
        {"an MPNet of 64 buckets", mpnet_other_buckets, UFORM_UNSUPPORTED,
         "relative_attention_num_buckets 64"},
        {"an MPNet folder of BERT's weights", mpnet_of_bert_weights, UFORM_FORMAT, "no tensor"},
        {"a shard outside the folder", shard_outside_the_folder, UFORM_FORMAT, "not in a file of the folder"},
        {"an index without weight_map", index_without_weight_map, UFORM_FORMAT, "no weight_map"},
        {"an index that is not an object", index_not_json, UFORM_FORMAT, "model.safetensors.index.json"},
        {"a missing shard", missing_shard, UFORM_IO, "model-00002-of-00002.safetensors: cannot open it"},
        {"a tensor in two shards", tensor_in_two_shards, UFORM_FORMAT, "both hold"},
    };
    uform_executor_t *executor = NULL;
    assert_int_equal(uform_executor_create_ram(NULL, &executor), UFORM_OK);
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; ++i) {
        write_folder();
        remove_file("pytorch_model.bin");
        remove_file("model.safetensors.index.json");
        remove_file(shard_names[0]);
        remove_file(shard_names[1]);
        remove_file("2_Dense/config.json");
        remove_file("2_Dense/pytorch_model.bin");
        faults[i].damage();
        uform_model_t *model = NULL;
        uform_model_load_args_t args = {.executor = executor, .path = folder, .model = &model};
        uform_status_t status = uform_model_load_ram(&args);
        uform_error_t error = uform_last_error();
        if (status != faults[i].status || !strstr(error.message, faults[i].message))
            fail_msg("%s: status %d, message \"%s\"; expected %d with \"%s\"", faults[i].what, status,
                     error.message, faults[i].status, faults[i].message);
        assert_null(model);
    }
    /* Nothing disturbed: the executor loads and runs the folder as written. */
    write_folder();
    remove_file("pytorch_model.bin");
    uform_model_t *model = NULL;
    uform_model_load_args_t args = {.executor = executor, .path = folder, .model = &model};
    assert_int_equal(uform_model_load_ram(&args), UFORM_OK);
    uform_model_free(model);
    uform_executor_free(executor);
}

/* Token vectors of a model that reads tokens: one unit row per token its tokenizer cuts (the folder has
 * Normalize), grouped per text as the tokenizer's ids, each with the tokenizer's byte span; a text that is
 * not UTF-8 fails alone, without rows. */
static void token_vectors_follow_the_tokenizer(void **state) {
    (void)state;
    write_folder();
    uform_model_t *model = NULL;
    assert_int_equal(load(&model), UFORM_OK);
    uform_arena_t *arena = NULL, *cut_arena = NULL;
    assert_int_equal(uform_arena_create_host(&arena), UFORM_OK);
    assert_int_equal(uform_arena_create_host(&cut_arena), UFORM_OK);
    char const data[] = " a cat sat \xff\xfe";
    size_t offsets[] = {0, 11, 11, 13};
    uform_tape_t texts = {.data = data, .offsets = offsets, .count = 3, .length = 13};
    uform_encoded_t encoded;
    uform_text_encode_args_t args = {.model = model,
                                     .outputs = UFORM_OUTPUT_TOKEN_VECTORS | UFORM_OUTPUT_STATES,
                                     .arena = arena,
                                     .encoded = &encoded,
                                     .texts = texts};
    assert_int_equal(uform_text_encode(&args), UFORM_OK);
    uform_tokenizer_t *tokenizer = NULL;
    assert_int_equal(uform_tokenizer_open(folder, &tokenizer), UFORM_OK);
    uform_tokenized_t cut;
    uform_text_tokenize_args_t cutting = {
        .tokenizer = tokenizer, .texts = texts, .arena = cut_arena, .tokenized = &cut};
    assert_int_equal(uform_text_tokenize(&cutting), UFORM_OK);

    uform_view_t const *vectors = &encoded.token_vectors, *spans = &encoded.token_spans;
    assert_int_equal(vectors->items, 3);
    assert_int_equal(spans->items, 3);
    assert_int_equal(vectors->columns, HIDDEN);
    assert_int_equal(spans->columns, 2);
    assert_int_equal(encoded.statuses[0], UFORM_OK);
    assert_int_equal(encoded.statuses[1], UFORM_OK);
    assert_int_equal(encoded.statuses[2], UFORM_FORMAT);
    assert_int_equal(cut.statuses[2], UFORM_FORMAT);
    for (size_t item = 0; item <= 3; ++item) {
        assert_int_equal(vectors->item_offsets[item], cut.ids.item_offsets[item]);
        assert_int_equal(spans->item_offsets[item], cut.ids.item_offsets[item]);
    }
    size_t rows = vectors->item_offsets[3];
    assert_int_equal(rows, 7); /* [CLS] a cat sat [SEP], then [CLS] [SEP] */
    assert_int_equal(vectors->rows, rows);
    assert_int_equal(spans->rows, rows);
    for (size_t row = 0; row < rows; ++row) {
        uint32_t const *ours =
            (uint32_t const *)(void const *)((char const *)spans->data + row * spans->row_stride);
        uint32_t const *theirs =
            (uint32_t const *)(void const *)((char const *)cut.spans.data + row * cut.spans.row_stride);
        assert_int_equal(ours[0], theirs[0]);
        assert_int_equal(ours[1], theirs[1]);
        float const *vector =
            (float const *)(void const *)((char const *)vectors->data + row * vectors->row_stride);
        double norm = 0;
        for (size_t h = 0; h < HIDDEN; ++h)
            norm += (double)vector[h] * vector[h];
        assert_true(fabs(norm - 1.0) < 1e-4);
    }
    /* " a cat sat ": the words' bytes, the special tokens none. */
    uint32_t const *first = spans->data;
    assert_int_equal(first[2], 1);
    assert_int_equal(first[3], 2);
    assert_int_equal(first[0], 0);
    assert_int_equal(first[1], 0);
    uform_tokenizer_free(tokenizer);
    uform_arena_free(cut_arena);
    uform_arena_free(arena);
    uform_model_free(model);
}

/* Cuts one text with `tokenizer` on the calling thread into `tokenized`; answers its token count. */
static size_t cut(uform_tokenizer_t const *tokenizer, char const *text, bool whole, uform_arena_t *arena,
                  uform_tokenized_t *tokenized) {
    size_t offsets[2] = {0, strlen(text)};
    uform_tokenize_config_t config = {.without_truncation = whole};
    uform_text_tokenize_args_t args = {.tokenizer = tokenizer,
                                       .texts = {text, offsets, 1, offsets[1]},
                                       .arena = arena,
                                       .config = &config,
                                       .tokenized = tokenized};
    assert_int_equal(uform_text_tokenize(&args), UFORM_OK);
    return tokenized->ids.item_offsets[1];
}

/* A model that reads tokens lends its tokenizer, truncating at the context unless asked not to, and
 * says its prompts; the engine's own models, which read bytes, have neither. */
static void model_lends_its_tokenizer(void **state) {
    (void)state;
    write_folder();
    write_text("config_sentence_transformers.json",
               "{\"prompts\": {\"query\": \"query: \", \"passage\": \"\"}, \"default_prompt_name\": null}");
    uform_model_t *model = NULL;
    assert_int_equal(load(&model), UFORM_OK);
    uform_tokenizer_t const *tokenizer = NULL;
    assert_int_equal(uform_model_tokenizer(model, &tokenizer), UFORM_OK);
    assert_non_null(tokenizer);
    uform_arena_t *arena = NULL;
    assert_int_equal(uform_arena_create_host(&arena), UFORM_OK);
    uform_tokenized_t tokenized;
    /* 16 words: 18 tokens whole, CONTEXT (12) with [CLS] and [SEP] kept where truncated. */
    char const *text = "a cat sits on the mat a cat sits on the mat a cat sits on";
    assert_int_equal(cut(tokenizer, text, false, arena, &tokenized), CONTEXT);
    uint32_t const *ids = tokenized.ids.data;
    assert_int_equal(ids[0], 2);
    assert_int_equal(ids[CONTEXT - 1], 3);
    assert_int_equal(tokenized.special[0], 1);
    assert_int_equal(tokenized.special[1], 0);
    assert_int_equal(tokenized.special[CONTEXT - 1], 1);
    assert_int_equal(cut(tokenizer, text, true, arena, &tokenized), 18);
    char const *string = NULL;
    size_t length = 0;
    assert_int_equal(uform_tokenizer_token(tokenizer, 5, &string, &length), UFORM_OK);
    assert_int_equal(length, 3);
    assert_memory_equal(string, "cat", 3);
    assert_int_equal(uform_tokenizer_token(tokenizer, 10, &string, &length), UFORM_OK);
    assert_memory_equal(string, "##s", 3);

    char prompt[16];
    assert_int_equal(uform_model_prompt(model, "query", prompt, sizeof prompt, &length), UFORM_OK);
    assert_string_equal(prompt, "query: ");
    assert_int_equal(length, 7);
    assert_int_equal(uform_model_prompt(model, NULL, prompt, sizeof prompt, &length), UFORM_OK);
    assert_string_equal(prompt, "");
    assert_int_equal(uform_model_prompt(model, "passage", prompt, sizeof prompt, &length), UFORM_OK);
    assert_int_equal(length, 0);
    assert_int_equal(uform_model_prompt(model, "title", prompt, sizeof prompt, &length),
                     UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_model_prompt(model, "query", prompt, 7, &length), UFORM_INVALID_ARGUMENT);
    assert_int_equal(length, 7);
    assert_int_equal(uform_model_tokenizer(NULL, &tokenizer), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_model_tokenizer(model, NULL), UFORM_INVALID_ARGUMENT);
    uform_arena_free(arena);
    uform_model_free(model);
    remove_file("config_sentence_transformers.json");

    char path[512];
    snprintf(path, sizeof path, "%s/tiny.safetensors", folder);
    uform_tiny_checkpoint_args_t tiny = {.path = path, .seed = 7};
    assert_int_equal(uform_tiny_checkpoint(&tiny), UFORM_OK);
    uform_model_load_args_t args = {.path = path, .model = &model};
    assert_int_equal(uform_model_load_ram(&args), UFORM_OK);
    tokenizer = (uform_tokenizer_t const *)1;
    assert_int_equal(uform_model_tokenizer(model, &tokenizer), UFORM_UNSUPPORTED);
    assert_null(tokenizer);
    assert_int_equal(uform_model_prompt(model, NULL, prompt, sizeof prompt, &length), UFORM_OK);
    assert_int_equal(length, 0);
    assert_int_equal(uform_model_prompt(model, "query", prompt, sizeof prompt, &length), UFORM_UNSUPPORTED);
    uform_model_free(model);
    remove_file("tiny.safetensors");
}

/* ---- hub ids in the local Hugging Face cache ------------------------------------------------------ */

#define COMMIT_A "0123456789abcdef0123456789abcdef01234567"
#define COMMIT_B "fedcba9876543210fedcba9876543210fedcba98"

static char hub_root[300];

/* `cache`/models--owner--tiny-bert as huggingface_hub lays it out: refs/main names COMMIT_A, refs/v1
 * COMMIT_B (with a newline); each snapshot a folder of links to the written folder's files. */
static void hub_cache_write(char const *cache) {
    char path[768], target[768];
    char const *const folders[] = {"", "/models--owner--tiny-bert", "/models--owner--tiny-bert/refs",
                                   "/models--owner--tiny-bert/snapshots"};
    for (size_t i = 0; i < 4; ++i) {
        snprintf(path, sizeof path, "%s%s", cache, folders[i]);
        assert_true(mkdir(path, 0700) == 0);
    }
    char const *const commits[] = {COMMIT_A, COMMIT_B};
    char const *const files[] = {"config.json",  "model.safetensors",         "tokenizer.json",
                                 "modules.json", "sentence_bert_config.json", "1_Pooling/config.json"};
    for (size_t c = 0; c < 2; ++c) {
        char const *const subfolders[] = {"", "/1_Pooling", "/2_Normalize"};
        for (size_t i = 0; i < 3; ++i) {
            snprintf(path, sizeof path, "%s/models--owner--tiny-bert/snapshots/%s%s", cache, commits[c],
                     subfolders[i]);
            assert_true(mkdir(path, 0700) == 0);
        }
        for (size_t i = 0; i < sizeof files / sizeof *files; ++i) {
            snprintf(path, sizeof path, "%s/models--owner--tiny-bert/snapshots/%s/%s", cache, commits[c],
                     files[i]);
            snprintf(target, sizeof target, "%s/%s", folder, files[i]);
            assert_true(symlink(target, path) == 0);
        }
    }
    FILE *file;
    snprintf(path, sizeof path, "%s/models--owner--tiny-bert/refs/main", cache);
    assert_non_null(file = fopen(path, "w"));
    fputs(COMMIT_A, file);
    fclose(file);
    snprintf(path, sizeof path, "%s/models--owner--tiny-bert/refs/v1", cache);
    assert_non_null(file = fopen(path, "w"));
    fputs(COMMIT_B "\n", file);
    fclose(file);
}

static void hub_expect(char const *id, char const *cache, char const *commit) {
    char found[1024], expected[1024];
    size_t length = 0;
    assert_int_equal(uform_hub_folder(id, found, sizeof found, &length), UFORM_OK);
    snprintf(expected, sizeof expected, "%s/models--owner--tiny-bert/snapshots/%s", cache, commit);
    assert_string_equal(found, expected);
    assert_int_equal(length, strlen(expected));
}

/* `parent` made, and in it `huggingface`, a link to the folder whose hub/ is the cache. */
static void hub_root_linked(char const *parent) {
    char link[700];
    assert_true(mkdir(parent, 0700) == 0);
    snprintf(link, sizeof link, "%s/huggingface", parent);
    assert_true(symlink(hub_root, link) == 0);
}

static void hub_environment_clear(void) {
    char const *const names[] = {"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"};
    for (size_t i = 0; i < 4; ++i)
        unsetenv(names[i]);
}

/* A hub id finds its snapshot as huggingface_hub does offline: every revision form, every variable that
 * places the cache; loads through the links to the same embeddings as the folder; a path that exists is
 * read as a path first; ids that are not ones, and models not cached, fail clearly. */
static void hub_ids_find_cached_snapshots(void **state) {
    (void)state;
    write_folder();
    char const *home = getenv("HOME");
    char saved_home[512] = "";
    if (home) snprintf(saved_home, sizeof saved_home, "%s", home);
    snprintf(hub_root, sizeof hub_root, "%s-hub", folder);
    assert_true(mkdir(hub_root, 0700) == 0);
    char cache[512];
    snprintf(cache, sizeof cache, "%s/hub", hub_root);
    hub_cache_write(cache);

    hub_environment_clear();
    setenv("HF_HUB_CACHE", cache, 1);
    hub_expect("owner/tiny-bert", cache, COMMIT_A);
    hub_expect("owner/tiny-bert@main", cache, COMMIT_A);
    hub_expect("owner/tiny-bert@v1", cache, COMMIT_B);
    hub_expect("owner/tiny-bert@" COMMIT_B, cache, COMMIT_B);

    /* Loaded by its id, through the links: the folder's embeddings, bit for bit. */
    char const *const texts[] = {"a cat sits on the mat", "stock markets"};
    float direct[2 * HIDDEN], hub[2 * HIDDEN];
    uform_status_t statuses[2];
    uform_model_t *model = NULL;
    assert_int_equal(load(&model), UFORM_OK);
    assert_int_equal(embed(model, texts, 2, direct, statuses, NULL), UFORM_OK);
    uform_model_free(model);
    model = NULL;
    uform_model_load_args_t args = {.path = "owner/tiny-bert@v1", .model = &model};
    assert_int_equal(uform_model_load_ram(&args), UFORM_OK);
    assert_int_equal(embed(model, texts, 2, hub, statuses, NULL), UFORM_OK);
    assert_memory_equal(direct, hub, sizeof hub);
    uform_model_free(model);

    /* Not cached: UFORM_IO naming where it looked; the revision's ref or snapshot missing alike. */
    char const *const absent[] = {"owner/absent", "owner/tiny-bert@v2", "tiny-bert",
                                  "owner/tiny-bert@" COMMIT_A "0"};
    for (size_t i = 0; i < sizeof absent / sizeof *absent; ++i) {
        char found[256];
        size_t length = 1;
        /* (41 digits are a branch's name, and no such ref is there) */
        assert_int_equal(uform_hub_folder(absent[i], found, sizeof found, &length), UFORM_IO);
        assert_int_equal(length, 0);
        assert_non_null(strstr(uform_last_error().message, "not in the Hugging Face cache"));
        args.path = absent[i];
        model = NULL;
        assert_int_equal(uform_model_load_ram(&args), UFORM_IO);
        assert_non_null(strstr(uform_last_error().message, "no such file or folder"));
        assert_null(model);
    }
    /* Not ids: refused as such; their loads fail as paths that do not exist. */
    char const *const not_ids[] = {
        "",         "owner//tiny-bert", "a/b/c",        "../tiny-bert",    "owner/tiny--bert", "-owner/x",
        "owner/x.", "owner/x@",         "owner/x@../y", "owner/x@refs//y", "owner/x@/y",       "owner/x y"};
    for (size_t i = 0; i < sizeof not_ids / sizeof *not_ids; ++i) {
        char found[256];
        size_t length = 1;
        assert_int_equal(uform_hub_folder(not_ids[i], found, sizeof found, &length), UFORM_INVALID_ARGUMENT);
        assert_int_equal(length, 0);
    }
    args.path = "owner//tiny-bert";
    assert_int_equal(uform_model_load_ram(&args), UFORM_IO);
    char small[8];
    size_t length = 0;
    assert_int_equal(uform_hub_folder("owner/tiny-bert", small, sizeof small, &length),
                     UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_hub_folder(NULL, small, sizeof small, &length), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_hub_folder("owner/tiny-bert", NULL, 0, &length), UFORM_INVALID_ARGUMENT);
    assert_int_equal(uform_hub_folder("owner/tiny-bert", small, sizeof small, NULL), UFORM_INVALID_ARGUMENT);

    /* Where the cache is: HUGGINGFACE_HUB_CACHE, HF_HOME/hub, XDG_CACHE_HOME/huggingface/hub,
     * ~/.cache/huggingface/hub, and "~/" in a variable read as $HOME. */
    char place[600], link[700];
    hub_environment_clear();
    setenv("HUGGINGFACE_HUB_CACHE", cache, 1);
    hub_expect("owner/tiny-bert", cache, COMMIT_A);
    hub_environment_clear();
    setenv("HF_HOME", hub_root, 1);
    hub_expect("owner/tiny-bert", cache, COMMIT_A);
    hub_environment_clear();
    snprintf(place, sizeof place, "%s/xdg", hub_root);
    hub_root_linked(place);
    setenv("XDG_CACHE_HOME", place, 1);
    snprintf(link, sizeof link, "%s/huggingface/hub", place);
    hub_expect("owner/tiny-bert", link, COMMIT_A);
    hub_environment_clear();
    snprintf(place, sizeof place, "%s/.cache", hub_root);
    hub_root_linked(place);
    setenv("HOME", hub_root, 1);
    snprintf(link, sizeof link, "%s/.cache/huggingface/hub", hub_root);
    hub_expect("owner/tiny-bert", link, COMMIT_A);
    setenv("HF_HUB_CACHE", "~/hub", 1);
    hub_expect("owner/tiny-bert", cache, COMMIT_A);

    /* A path that exists is read as one: "owner/tiny-bert" under the working folder, a file that is no
     * checkpoint, fails as that file (UFORM_FORMAT), though the cache holds the model. */
    char working[512];
    assert_non_null(getcwd(working, sizeof working));
    assert_int_equal(chdir(hub_root), 0);
    assert_int_equal(mkdir("owner", 0700), 0);
    FILE *file = fopen("owner/tiny-bert", "w");
    assert_non_null(file);
    fputs("not a checkpoint, but long enough to read", file);
    fclose(file);
    args.path = "owner/tiny-bert";
    assert_int_equal(uform_model_load_ram(&args), UFORM_FORMAT);
    assert_int_equal(chdir(working), 0);

    hub_environment_clear();
    if (saved_home[0]) setenv("HOME", saved_home, 1);
    char command[700];
    snprintf(command, sizeof command, "rm -rf '%s'", hub_root);
    assert_int_equal(system(command), 0);
}

int main(void) {
    struct CMUnitTest const tests[] = {
        cmocka_unit_test(folder_loads_and_describes_itself),
        cmocka_unit_test(folder_encodes_texts),
        cmocka_unit_test(f16_weights_load_as_f32_ones),
        cmocka_unit_test(damaged_folders_fail_clearly),
        cmocka_unit_test(sharded_weights_load_as_the_whole_file),
        cmocka_unit_test(every_text_refused_offset_null_ids),
        cmocka_unit_test(token_vectors_follow_the_tokenizer),
        cmocka_unit_test(model_lends_its_tokenizer),
        cmocka_unit_test(hub_ids_find_cached_snapshots),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
