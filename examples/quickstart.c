#include <stdio.h>
#include <uform.h>

int main(int argc, char **argv) {
    char const *path = argc > 1 ? argv[1] : "tiny.safetensors";
    uform_executor_t *executor = NULL;
    uform_arena_t *arena = NULL;
    uform_model_t *model = NULL, *again = NULL;
    uform_outcome_t outcome;
    uform_outcome_init(&outcome);

    if (argc <= 1) { /* no checkpoint given: write the tiny seeded one, with every tower */
        uform_tiny_checkpoint_args_t tiny = {.path = path, .seed = 42};
        if (uform_tiny_checkpoint(&tiny) != UFORM_OK) goto fail;
    }
    if (uform_executor_create_ram(NULL, &executor) != UFORM_OK) goto fail; /* 7/8 of the cores */
    if (uform_arena_create(executor, &arena) != UFORM_OK) goto fail;

    /* Blocking: submit, then wait on the executor. */
    uform_model_load_args_t load = {.executor = executor, .path = path, .model = &model};
    if (uform_model_load_ram(&load) != UFORM_OK) goto fail;
    uform_model_info_t info;
    uform_model_info(model, &info);
    printf("%s: %zu parameters, embeddings of %zu, towers:%s%s%s%s\n", path, info.parameters, info.dims,
           info.has_text ? " text" : "", info.has_image ? " image" : "", info.has_video ? " video" : "",
           info.has_audio ? " audio" : "");

    /* Two texts end to end, with one more offset than texts. */
    char const texts[] = "a cata dog";
    size_t offsets[] = {0, 5, 10};
    uform_encoded_t encoded;
    uform_text_encode_args_t encode = {
        .model = model,
        .executor = executor,
        .outputs = UFORM_OUTPUT_EMBEDDINGS,
        .arena = arena,
        .encoded = &encoded,
        .texts = {.data = texts, .offsets = offsets, .count = 2, .length = 10},
    };
    if (uform_text_encode(&encode) != UFORM_OK) goto fail;
    for (size_t i = 0; i < encoded.items; ++i) {
        float const *row = NULL;
        if (uform_view_row(&encoded.embeddings, i, (void const **)&row) != UFORM_OK) goto fail;
        printf("text %zu: [%+.4f %+.4f %+.4f ...] of %zu\n", i, row[0], row[1], row[2],
               encoded.embeddings.columns);
    }

    /* Deferred: the same verb with an outcome; the call runs while this thread does something else. */
    load.outcome = &outcome;
    if (uform_model_load_ram(&load) != UFORM_OK) goto fail;
    if (uform_outcome_wait(&outcome) != UFORM_OK) goto fail;
    again = uform_outcome_model(&outcome);
    printf("loaded again, deferred: %zu bytes of weights\n", info.bytes);

    uform_model_free(again);
    uform_model_free(model);
    uform_arena_free(arena);
    uform_executor_free(executor);
    return 0;

fail:;
    uform_error_t error = uform_last_error();
    char text[256];
    uform_error_render(&error, text, sizeof text);
    fprintf(stderr, "%s\n", text);
    uform_model_free(model);
    uform_arena_free(arena);
    uform_executor_free(executor);
    return 1;
}
