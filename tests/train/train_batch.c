/* The engine's side of tests/reference/test_train_reference.py: `train_batch BATCH.json OUT.safetensors`
 * reads a batch in train_reference.py's format, makes a RAM trainer from its checkpoint and optimizer,
 * writes the gradient of the loss at the initial weights as `grad.<name>`, then takes `steps` steps on the
 * same batch through the public uform_trainer_step and writes the weights as `param.<name>` (F32), with
 * the per-step `loss`, `contrastive`, `lm` and `lr` (before each update) in `__metadata__`. */
#include <jansson.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train_step.h"

static int fail(char const *what) {
    fprintf(stderr, "train_batch: %s\n", what);
    return 1;
}

static char *read_file(char const *path, size_t *size) {
    FILE *file = fopen(path, "rb");
    if (!file) return NULL;
    fseek(file, 0, SEEK_END);
    long length = ftell(file);
    fseek(file, 0, SEEK_SET);
    char *data = malloc((size_t)(length > 0 ? length : 1));
    if (data && fread(data, 1, (size_t)length, file) != (size_t)length) {
        free(data);
        data = NULL;
    }
    fclose(file);
    *size = (size_t)length;
    return data;
}

/* One list of per-step values, as the JSON text the reference's metadata holds. */
static void append(json_t *lists, char const *key, double value) {
    json_array_append_new(json_object_get(lists, key), json_real(value));
}

static int write_tensors(char const *path, train_params_t const *params, float *const *grads, json_t *lists,
                         bool with_params) {
    json_t *header = json_object(), *metadata = json_object();
    char const *keys[] = {"loss", "contrastive", "lm", "lr"};
    for (size_t k = 0; k < 4; ++k) {
        char *text = json_dumps(json_object_get(lists, keys[k]), JSON_COMPACT | JSON_REAL_PRECISION(17));
        json_object_set_new(metadata, keys[k], json_string(text));
        free(text);
    }
    json_object_set_new(header, "__metadata__", metadata);
    size_t offset = 0;
    for (int pass = 0; pass < (with_params ? 2 : 1); ++pass)
        for (size_t i = 0; i < params->count; ++i) {
            train_tensor_t const *t = &params->tensors[i];
            char name[TRAIN_NAME_MAX + 8];
            snprintf(name, sizeof name, "%s.%s", pass == 0 ? "grad" : "param", t->name);
            json_t *shape = t->rank == 1 ? json_pack("[I]", (json_int_t)t->shape[0])
                                         : json_pack("[I, I]", (json_int_t)t->shape[0], (json_int_t)t->shape[1]);
            json_object_set_new(header, name,
                                json_pack("{s:s, s:o, s:[I, I]}", "dtype", "F32", "shape", shape, "data_offsets",
                                          (json_int_t)offset, (json_int_t)(offset + t->count * 4)));
            offset += t->count * 4;
        }
    char *text = json_dumps(header, JSON_COMPACT);
    json_decref(header);
    FILE *file = fopen(path, "wb");
    if (!file || !text) return fail("cannot write the output");
    size_t length = strlen(text), padded = (length + 7) / 8 * 8;
    uint64_t header_length = padded;
    fwrite(&header_length, 8, 1, file);
    fwrite(text, 1, length, file);
    for (size_t i = length; i < padded; ++i)
        fputc(' ', file);
    for (int pass = 0; pass < (with_params ? 2 : 1); ++pass)
        for (size_t i = 0; i < params->count; ++i)
            fwrite(pass == 0 ? grads[i] : params->tensors[i].value, 4, params->tensors[i].count, file);
    free(text);
    return fclose(file) == 0 ? 0 : fail("cannot write the output");
}

int main(int argc, char **argv) {
    if (argc != 3) return fail("usage: train_batch BATCH.json OUT.safetensors");
    json_error_t error;
    json_t *batch = json_load_file(argv[1], 0, &error);
    if (!batch) return fail(error.text);
    char *batch_path = strdup(argv[1]);
    char const *folder = dirname(batch_path);
    char checkpoint[4096];
    snprintf(checkpoint, sizeof checkpoint, "%s/%s", folder, json_string_value(json_object_get(batch, "checkpoint")));
    if (json_string_value(json_object_get(batch, "checkpoint"))[0] == '/')
        snprintf(checkpoint, sizeof checkpoint, "%s", json_string_value(json_object_get(batch, "checkpoint")));

    uform_trainer_config_t config;
    uform_trainer_config_default(&config);
    config.resume_path = checkpoint;
    config.lm_weight = json_number_value(json_object_get(batch, "lm_weight"));
    json_t *optimizer = json_object_get(batch, "optimizer");
    if (optimizer) {
        config.learning_rate = json_number_value(json_object_get(optimizer, "learning_rate"));
        config.weight_decay = json_number_value(json_object_get(optimizer, "weight_decay"));
        config.beta1 = json_number_value(json_object_get(optimizer, "beta1"));
        config.beta2 = json_number_value(json_object_get(optimizer, "beta2"));
        config.epsilon = json_number_value(json_object_get(optimizer, "epsilon"));
        config.clip_norm = json_number_value(json_object_get(optimizer, "clip_norm"));
        config.warmup_steps = (size_t)json_integer_value(json_object_get(optimizer, "warmup_steps"));
        config.total_steps = (size_t)json_integer_value(json_object_get(optimizer, "total_steps"));
    }
    size_t steps = (size_t)json_integer_value(json_object_get(batch, "steps"));

    /* The items: contents end to end. */
    json_t *items = json_object_get(batch, "items");
    size_t count = json_array_size(items), used = 0, capacity = 1;
    uform_modality_t *modalities = calloc(count + 1, sizeof *modalities);
    size_t *offsets = calloc(count + 1, sizeof *offsets);
    char *data = malloc(capacity);
    for (size_t i = 0; i < count; ++i) {
        json_t *item = json_array_get(items, i);
        char const *modality = json_string_value(json_object_get(item, "modality"));
        char const *content = NULL;
        char *file = NULL;
        size_t size = 0;
        if (!strcmp(modality, "text")) {
            modalities[i] = UFORM_MODALITY_TEXT;
            content = json_string_value(json_object_get(item, "text"));
            size = strlen(content);
        } else {
            modalities[i] = !strcmp(modality, "image")   ? UFORM_MODALITY_IMAGE
                            : !strcmp(modality, "video") ? UFORM_MODALITY_VIDEO
                                                         : UFORM_MODALITY_AUDIO;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", folder, json_string_value(json_object_get(item, "path")));
            content = file = read_file(path, &size);
            if (!file) return fail(path);
        }
        data = realloc(data, used + size + 1);
        memcpy(data + used, content, size);
        used += size;
        offsets[i + 1] = used;
        free(file);
    }
    json_t *relations_json = json_object_get(batch, "relations");
    size_t relations_count = json_array_size(relations_json);
    uint32_t *relations = calloc(2 * relations_count + 1, sizeof *relations);
    for (size_t r = 0; r < relations_count; ++r)
        for (size_t k = 0; k < 2; ++k)
            relations[2 * r + k] = (uint32_t)json_integer_value(json_array_get(json_array_get(relations_json, r), k));

    uform_executor_t *executor = NULL;
    uform_ram_options_t options = uform_ram_options_default();
    options.threads = 2;
    if (uform_executor_create_ram(&options, &executor) != UFORM_OK) return fail("cannot make the executor");
    uform_trainer_t *trainer = NULL;
    uform_trainer_init_args_t init = {.executor = executor, .config = &config, .trainer = &trainer};
    if (uform_trainer_init_ram(&init) != UFORM_OK) return fail(uform_last_error().message);

    /* The gradient at the initial weights, through the step's own computation. */
    json_t *lists = json_pack("{s:[], s:[], s:[], s:[]}", "loss", "contrastive", "lm", "lr");
    train_batch_t train = {.items = count,
                           .modalities = modalities,
                           .contents = {.data = data, .offsets = offsets, .count = count, .length = used},
                           .relations = relations,
                           .relations_count = relations_count};
    train_losses_t losses;
    char message[256];
    train_params_zero_grad(&trainer->params);
    uform_status_t status = train_compute(trainer, executor, &train, &losses, NULL, message, sizeof message);
    if (status != UFORM_OK) return fail(message);
    float **grads = calloc(trainer->params.count, sizeof *grads);
    for (size_t i = 0; i < trainer->params.count; ++i) {
        train_tensor_t const *t = &trainer->params.tensors[i];
        grads[i] = malloc(t->count * sizeof(float));
        memcpy(grads[i], t->grad, t->count * sizeof(float));
    }
    if (steps == 0) {
        append(lists, "loss", losses.loss);
        append(lists, "contrastive", losses.contrastive);
        append(lists, "lm", losses.lm);
        append(lists, "lr", 0);
    }
    for (size_t s = 0; s < steps; ++s) {
        uform_trainer_step_stats_t stats;
        uform_trainer_step_args_t step = {.trainer = trainer,
                                          .executor = executor,
                                          .modalities = modalities,
                                          .contents = train.contents,
                                          .relations = relations,
                                          .relations_count = relations_count,
                                          .stats = &stats};
        if (uform_trainer_step(&step) != UFORM_OK) return fail(uform_last_error().message);
        append(lists, "loss", stats.loss);
        append(lists, "contrastive", stats.contrastive_loss);
        append(lists, "lm", stats.lm_loss);
        append(lists, "lr", stats.learning_rate);
    }
    int rc = write_tensors(argv[2], &trainer->params, grads, lists, steps > 0);
    for (size_t i = 0; i < trainer->params.count; ++i)
        free(grads[i]);
    free(grads);
    json_decref(lists);
    uform_trainer_free(trainer);
    uform_executor_free(executor);
    free(relations);
    free(data);
    free(offsets);
    free(modalities);
    free(batch_path);
    json_decref(batch);
    return rc;
}
