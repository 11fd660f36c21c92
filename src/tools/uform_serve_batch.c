/* The batcher of `uform serve`: parsed requests wait in one queue, oldest first; whenever the executor
 * is idle, the requests at the head that ask for the same width are copied end to end into one tape,
 * up to --batch-bytes (a request is never split, so one larger than the budget goes alone), and encoded
 * by one deferred uform_text_encode. A text's vector does not depend on the other texts of its call
 * (the engine guarantees it), so batching changes when an answer comes, never what it says. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "uform_serve.h"

/* ---- the eventfd the outcomes notify ----------------------------------------------------------- */

static void encoded_watch_done(loop_op_t *op) {
    serve_t *server = SERVE_CONTAINER_OF(op, serve_t, encoded_watch);
    server->encoded_armed = false;
    if (server->stopping) return;
    if (op->result > 0) {
        /* Resets the counter; EAGAIN only means another look already did. */
        uint64_t count;
        ssize_t got = read(server->encoded_fd, &count, sizeof count);
        (void)got;
        batch_encoded(server);
    } else if (op->result != -ECANCELED) {
        fprintf(stderr, "uform: cannot watch the engine's notifications: %s\n", strerror((int)-op->result));
    }
    if (server->stopping) return;
    loop_poll(server->loop, &server->encoded_watch, server->encoded_fd, POLLIN);
    server->encoded_armed = true;
}

int batch_open(serve_t *server) {
    server->encoded_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (server->encoded_fd < 0) return command_fail("cannot create an eventfd: %s", strerror(errno));
    for (size_t i = 0; i < 2; ++i)
        uform_outcome_init(&server->batches[i].outcome);
    for (size_t i = 0; i < 2; ++i) {
        serve_batch_t *batch = &server->batches[i];
        if (uform_outcome_notify_eventfd(&batch->outcome, server->encoded_fd) != UFORM_OK)
            return command_fail_engine();
        if (uform_arena_create(server->executor, &batch->arena) != UFORM_OK) return command_fail_engine();
    }
    server->encoded_watch.callback = encoded_watch_done;
    loop_poll(server->loop, &server->encoded_watch, server->encoded_fd, POLLIN);
    server->encoded_armed = true;
    return COMMAND_OK;
}

void batch_close(serve_t *server) {
    if (server->encoded_fd < 0) return; /* batch_open did not start */
    for (size_t i = 0; i < 2; ++i) {
        serve_batch_t *batch = &server->batches[i];
        uform_outcome_destroy(&batch->outcome); /* waits for a call in flight */
        uform_arena_free(batch->arena);
        free(batch->bytes);
        free(batch->offsets);
        *batch = (serve_batch_t){0};
    }
    if (server->encoded_fd >= 0) (void)close(server->encoded_fd);
    server->encoded_fd = -1;
}

/* ---- the queue --------------------------------------------------------------------------------- */

bool batch_enqueue(serve_t *server, serve_request_t *request) {
    if (server->queued >= server->flags.queue) return false;
    request->next = NULL;
    request->queued_ns = loop_now_ns();
    if (server->queue_tail)
        server->queue_tail->next = request;
    else
        server->queue_head = request;
    server->queue_tail = request;
    server->queued++;
    server->queued_bytes += request->bytes;
    return true;
}

/* Takes `request` out of the queue; `link` is the pointer that points at it. */
static void queue_unlink(serve_t *server, serve_request_t **link, serve_request_t *previous) {
    serve_request_t *request = *link;
    *link = request->next;
    if (server->queue_tail == request) server->queue_tail = previous;
    request->next = NULL;
    server->queued--;
    server->queued_bytes -= request->bytes;
}

void batch_refuse_queued(serve_t *server, unsigned status, char const *message) {
    while (server->queue_head) {
        serve_request_t *request = server->queue_head;
        queue_unlink(server, &server->queue_head, NULL);
        api_error(request, status, "server_error", NULL, "shutting_down", "%s", message);
        serve_request_resume(request);
    }
}

/* ---- batches ----------------------------------------------------------------------------------- */

/* Room for `bytes` more bytes and `items` more offsets. */
static bool batch_reserve(serve_batch_t *batch, size_t bytes, size_t items) {
    if (batch->length + bytes > batch->bytes_capacity) {
        size_t capacity = batch->bytes_capacity ? batch->bytes_capacity : 65536;
        while (capacity < batch->length + bytes)
            capacity *= 2;
        char *grown = realloc(batch->bytes, capacity);
        if (!grown) return false;
        batch->bytes = grown;
        batch->bytes_capacity = capacity;
    }
    if (batch->items + items + 1 > batch->offsets_capacity) {
        size_t capacity = batch->offsets_capacity ? batch->offsets_capacity : 256;
        while (capacity < batch->items + items + 1)
            capacity *= 2;
        size_t *grown = realloc(batch->offsets, capacity * sizeof *grown);
        if (!grown) return false;
        batch->offsets = grown;
        batch->offsets_capacity = capacity;
    }
    return true;
}

/* Appends a request's texts to the tape, in full: the engine itself reads at most its context of each. */
static void batch_add(serve_batch_t *batch, serve_request_t *request, serve_request_t **tail) {
    request->first_row = batch->items;
    for (size_t i = 0; i < request->count; ++i) {
        memcpy(batch->bytes + batch->length, request->inputs[i].bytes, request->inputs[i].length);
        batch->length += request->inputs[i].length;
        batch->offsets[++batch->items] = batch->length;
    }
    request->next = NULL;
    if (*tail)
        (*tail)->next = request;
    else
        batch->requests = request;
    *tail = request;
    batch->requests_count++;
}

static size_t request_input_bytes(serve_request_t const *request) {
    size_t bytes = 0;
    for (size_t i = 0; i < request->count; ++i)
        bytes += request->inputs[i].length;
    return bytes;
}

/* Gathers the head's batch from the queue and submits it. */
static void batch_submit(serve_t *server) {
    serve_batch_t *batch = &server->batches[server->next_batch];
    size_t width = server->queue_head->dimensions;
    size_t budget = server->flags.batch_bytes, bytes = 0;
    uint64_t now = loop_now_ns();
    serve_request_t *tail = NULL;
    batch->length = batch->items = batch->requests_count = 0;
    batch->requests = NULL;

    serve_request_t *previous = NULL;
    for (serve_request_t **link = &server->queue_head; *link;) {
        serve_request_t *request = *link;
        if (request->dimensions != width) {
            previous = request;
            link = &request->next;
            continue;
        }
        if (batch->requests_count && bytes + request->bytes > budget) break;
        queue_unlink(server, link, previous);
        metrics_observe(&server->metrics, STAGE_QUEUE, now - request->queued_ns);
        if (!batch_reserve(batch, request_input_bytes(request), request->count)) {
            api_error(request, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", NULL, NULL,
                      "out of memory for the batch: try again");
            serve_request_resume(request);
            continue;
        }
        batch_add(batch, request, &tail);
        bytes += request->bytes;
    }
    if (!batch->requests) return;

    batch->offsets[0] = 0;
    batch->stats = (uform_encode_stats_t){0};
    batch->config =
        (uform_encode_config_t){.outputs_scalar = UFORM_F32, .matryoshka = width, .stats = &batch->stats};
    uform_text_encode_args_t args = {
        .model = server->model,
        .executor = server->executor,
        .outputs = UFORM_OUTPUT_EMBEDDINGS,
        .arena = batch->arena,
        .config = &batch->config,
        .outcome = &batch->outcome,
        .texts = {.data = batch->bytes,
                  .offsets = batch->offsets,
                  .count = batch->items,
                  .length = batch->length},
    };
    batch->submitted_ns = now;
    server->encoding = batch;
    server->next_batch ^= 1;
    /* A refusal finalizes the outcome and notifies the eventfd as a finished call does: the answers are
     * written in one place, batch_encoded. */
    (void)uform_text_encode(&args);
    metrics_observe_batch(&server->metrics, batch->requests_count);
}

void batch_kick(serve_t *server) {
    if (server->encoding || !server->queue_head || server->stopping) return;
    uint64_t due = server->queue_head->queued_ns + server->flags.batch_delay_us * 1000u;
    if (!server->draining && server->queued_bytes < server->flags.batch_bytes && loop_now_ns() < due) {
        serve_timer_want(server, &server->batch_timer, due);
        return;
    }
    batch_submit(server);
}

/* The rendered failure of a call, for the answers of its requests. */
static void answer_failure(serve_request_t *request, uform_error_t const *error) {
    char rendered[256];
    uform_error_render(error, rendered, sizeof rendered);
    api_error(request, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", NULL, "engine_error", "%s", rendered);
}

void batch_encoded(serve_t *server) {
    serve_batch_t *batch = server->encoding;
    if (!batch) return;
    uform_status_t status = uform_outcome_status(&batch->outcome);
    if (status == UFORM_PENDING) return;
    server->encoding = NULL;
    uint64_t now = loop_now_ns();
    serve_metrics_t *metrics = &server->metrics;
    metrics_observe(metrics, STAGE_ENCODE, now - batch->submitted_ns);
    metrics_observe(metrics, STAGE_DECODE, batch->stats.read_ns + batch->stats.decode_ns);
    metrics_observe(metrics, STAGE_COMPUTE, batch->stats.compute_ns);
    metrics->batches++;
    metrics->items += batch->items;
    metrics->truncated += batch->stats.truncated;

    uform_encoded_t encoded;
    memset(&encoded, 0, sizeof encoded);
    uform_status_t products = uform_outcome_encoded(&batch->outcome, &encoded);
    uform_error_t error = uform_outcome_error(&batch->outcome);

    /* The executor takes the next batch, into the other arena, while these answers are written. */
    batch_kick(server);

    for (serve_request_t *request = batch->requests, *next = NULL; request; request = next) {
        next = request->next;
        request->next = NULL;
        uint64_t serializing = loop_now_ns();
        if (status != UFORM_OK || products != UFORM_OK) {
            answer_failure(request, &error);
        } else {
            uform_status_t item = UFORM_OK;
            for (size_t i = 0; i < request->count && item == UFORM_OK; ++i)
                item = encoded.statuses[request->first_row + i];
            if (item != UFORM_OK)
                api_error(request, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", "input", "engine_error",
                          "the engine could not encode an input: %s", uform_status_name(item));
            else
                api_answer_embeddings(server, request, &encoded.embeddings);
            metrics->bytes += request->bytes;
            metrics->tokens += request->tokens;
        }
        metrics_observe(metrics, STAGE_SERIALIZE, loop_now_ns() - serializing);
        serve_request_resume(request);
    }
    batch->requests = NULL;
    batch->requests_count = 0;
    serve_drain_check(server);
}
