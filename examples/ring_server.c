/* A server that runs its own io_uring loop and receives UForm's completions in it.
 *
 * It submits several deferred text encodes, each on its own executor and outcome, asks each outcome
 * to post a completion into this program's ring (IORING_OP_MSG_RING) with the request's index as
 * user_data, and then only ever waits on its own ring: each completion says which request is final
 * and with which status, and its embeddings are read from its outcome at once.
 *
 * Usage: uform_ring_server [checkpoint]   (without one, it writes the tiny seeded checkpoint) */
#include <liburing.h>
#include <stdio.h>
#include <string.h>

#include <uform.h>

#define REQUESTS 4

typedef struct request {
    uform_executor_t *executor;
    uform_arena_t *arena;
    uform_outcome_t outcome;
    char const *text;
    size_t offsets[2];
} request_t;

static int report(char const *what) {
    uform_error_t error = uform_last_error();
    char text[256];
    uform_error_render(&error, text, sizeof text);
    fprintf(stderr, "%s: %s\n", what, text);
    return 1;
}

int main(int argc, char **argv) {
    char const *path = argc > 1 ? argv[1] : "ring-server-tiny.safetensors";
    static char const *const texts[REQUESTS] = {"a cat", "a dog", "a cat on a mat", "an embedding server"};
    static request_t requests[REQUESTS];
    uform_model_t *model = NULL;
    struct io_uring ring;
    int status = 1;

    if (argc <= 1) {
        uform_tiny_checkpoint_args_t tiny = {.path = path, .seed = 42};
        if (uform_tiny_checkpoint(&tiny) != UFORM_OK) return report("checkpoint");
    }
    if (io_uring_queue_init(8, &ring, 0) != 0) {
        fprintf(stderr, "io_uring is not available here\n");
        return 77; /* the test harness's "skipped" */
    }
    uform_model_load_args_t load = {.path = path, .model = &model};
    if (uform_model_load_ram(&load) != UFORM_OK) {
        report("load");
        goto done;
    }

    /* One executor per request, since an executor runs one call at a time. */
    for (size_t i = 0; i < REQUESTS; ++i) {
        request_t *request = &requests[i];
        uform_ram_options_t options = uform_ram_options_default();
        options.threads = 1;
        request->text = texts[i];
        request->offsets[1] = strlen(texts[i]);
        uform_outcome_init(&request->outcome);
        if (uform_executor_create_ram(&options, &request->executor) != UFORM_OK ||
            uform_arena_create(request->executor, &request->arena) != UFORM_OK ||
            uform_outcome_notify_ring(&request->outcome, ring.ring_fd, i) != UFORM_OK) {
            report("setup");
            goto done;
        }
        uform_text_encode_args_t encode = {
            .model = model,
            .executor = request->executor,
            .outputs = UFORM_OUTPUT_EMBEDDINGS,
            .arena = request->arena,
            .outcome = &request->outcome,
            .texts = {request->text, request->offsets, 1, request->offsets[1]},
        };
        if (uform_text_encode(&encode) != UFORM_OK) {
            report("submit");
            goto done;
        }
    }

    /* The server's own loop: nothing but its ring. */
    for (size_t received = 0; received < REQUESTS; ++received) {
        struct io_uring_cqe *cqe = NULL;
        if (io_uring_wait_cqe(&ring, &cqe) != 0) goto done;
        size_t index = (size_t)cqe->user_data;
        int final = cqe->res;
        io_uring_cqe_seen(&ring, cqe);
        if (index >= REQUESTS || final != UFORM_OK ||
            uform_outcome_status(&requests[index].outcome) != (uform_status_t) final) {
            fprintf(stderr, "completion %zu: status %d\n", index, final);
            goto done;
        }
        uform_encoded_t encoded;
        float const *row = NULL;
        if (uform_outcome_encoded(&requests[index].outcome, &encoded) != UFORM_OK ||
            uform_view_row(&encoded.embeddings, 0, (void const **)&row) != UFORM_OK)
            goto done;
        printf("request %zu (\"%s\") final: [%+.4f %+.4f ...] of %zu\n", index, requests[index].text, row[0],
               row[1], encoded.embeddings.columns);
    }
    status = 0;

done:
    for (size_t i = 0; i < REQUESTS; ++i) {
        uform_outcome_destroy(&requests[i].outcome); /* waits for a call still in flight */
        uform_arena_free(requests[i].arena);
        uform_executor_free(requests[i].executor);
    }
    uform_model_free(model);
    io_uring_queue_exit(&ring);
    return status;
}
