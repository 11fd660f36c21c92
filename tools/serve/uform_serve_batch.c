/* The batcher of `uform serve`. A parsed request is split into parts, one per modality it holds
 * (texts, images, audio, video), and the parts of every model's requests wait in one queue, oldest first.
 * Whenever the executor is idle, the parts at the head that share the head's model, modality and width
 * are copied end to end into one tape, media decoded from base64 on the way, up to --batch-bytes (a part is
 * never split, so one larger than the budget goes alone), and encoded by one deferred call of that modality's
 * verb: uform_text_encode, or uform_image_encode, uform_audio_encode or uform_video_encode from memory. Each
 * finished part's rows are copied into its request, which is answered once its last part is done.
 *
 * The models share the one executor, which runs one call at a time, and the one queue: a batch is the
 * oldest part's model's, so that no model waits behind another's later requests, and a model's failure
 * (an input it cannot encode) fails that request alone.
 *
 * An input's vector does not depend on the other inputs of its call (the engine guarantees it), so
 * batching changes when an answer comes, never what it says. An input the engine cannot encode (a
 * corrupt image) fails its own request, whose other parts are then dropped, and no other.
 *
 * A queued request's connection is suspended, so libmicrohttpd reads nothing of it; before a part goes
 * into a batch, its socket is peeked, and a request whose client has closed (a FIN or a reset waiting)
 * is dropped unencoded and counted in uform_requests_abandoned_total. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
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
    request->queued_ns = loop_now_ns();
    for (size_t i = 0; i < request->count; ++i) {
        serve_input_t const *input = &request->inputs[i];
        serve_part_t *part = &request->parts[input->modality];
        part->count++;
        part->budget += input->budget;
        part->taped += input->taped;
    }
    for (size_t modality = 0; modality < SERVE_MODALITIES; ++modality) {
        serve_part_t *part = &request->parts[modality];
        if (!part->count) continue;
        part->request = request;
        part->modality = (uform_modality_t)modality;
        part->next = NULL;
        if (server->queue_tail)
            server->queue_tail->next = part;
        else
            server->queue_head = part;
        server->queue_tail = part;
        server->queued_bytes += part->budget;
        request->parts_queued++;
        request->parts_pending++;
    }
    server->queued++;
    return true;
}

/* Takes the part `*link` points at out of the queue; `previous` is the part before it, if any. */
static void queue_unlink(serve_t *server, serve_part_t **link, serve_part_t *previous) {
    serve_part_t *part = *link;
    *link = part->next;
    if (server->queue_tail == part) server->queue_tail = previous;
    part->next = NULL;
    server->queued_bytes -= part->budget;
    if (--part->request->parts_queued == 0) server->queued--;
}

/* A request with no part pending is answered: the error its failure set, or its vectors. */
static void request_settle(serve_t *server, serve_request_t *request) {
    if (request->parts_pending || request->settled) return;
    request->settled = true;
    uint64_t serializing = loop_now_ns();
    if (!request->failed) {
        api_answer_embeddings(server, request);
        server->metrics.bytes += request->bytes;
        server->metrics.tokens += request->tokens;
    }
    metrics_observe(&server->metrics, STAGE_SERIALIZE, loop_now_ns() - serializing);
    serve_request_resume(request);
}

/* Drops the queued parts of failed requests, and answers those left with nothing pending. */
static void queue_drop_failed(serve_t *server) {
    serve_part_t *previous = NULL;
    for (serve_part_t **link = &server->queue_head; *link;) {
        serve_part_t *part = *link;
        serve_request_t *request = part->request;
        if (!request->failed) {
            previous = part;
            link = &part->next;
            continue;
        }
        queue_unlink(server, link, previous);
        request->parts_pending--;
        request_settle(server, request);
    }
}

void batch_refuse_queued(serve_t *server, unsigned status, char const *message) {
    for (serve_part_t *part = server->queue_head; part; part = part->next) {
        serve_request_t *request = part->request;
        if (request->failed) continue;
        request->failed = true;
        api_error(request, status, "server_error", NULL, "shutting_down", "%s", message);
    }
    queue_drop_failed(server);
}

/* ---- batches ----------------------------------------------------------------------------------- */

/* Whether the client of a queued request has closed its connection: a FIN waiting (recv answers 0) or
 * a reset. What the client sent after its request stays unread. */
static bool request_abandoned(serve_request_t const *request) {
    union MHD_ConnectionInfo const *info =
        MHD_get_connection_info(request->connection, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!info) return false;
    char byte;
    ssize_t got = recv(info->connect_fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* Room for `bytes` more bytes and `items` more offsets. */
static bool batch_reserve(serve_batch_t *batch, size_t bytes, size_t items) {
    if (!command_reserve(&batch->bytes, &batch->bytes_capacity, batch->length + bytes, 65536)) return false;
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

/* Appends a part's inputs to the tape in input order: texts in full (the engine itself reads at most its
 * context of each), media decoded from the base64 that api_parse_embeddings validated. */
static void batch_add(serve_batch_t *batch, serve_part_t *part, serve_part_t **tail) {
    serve_request_t *request = part->request;
    part->first_row = batch->items;
    for (size_t i = 0; i < request->count; ++i) {
        serve_input_t const *input = &request->inputs[i];
        if (input->modality != part->modality) continue;
        char *at = batch->bytes + batch->length;
        size_t bad = 0;
        if (input->modality == UFORM_MODALITY_TEXT)
            memcpy(at, input->bytes, input->length);
        else
            (void)api_base64_decode(input->bytes, input->length, (unsigned char *)at, &bad);
        batch->length += input->taped;
        batch->offsets[++batch->items] = batch->length;
    }
    part->next = NULL;
    if (*tail)
        (*tail)->next = part;
    else
        batch->parts = part;
    *tail = part;
    batch->parts_count++;
}

/* Submits the batch's tape to its modality's verb. A refusal finalizes the outcome and notifies the
 * eventfd as a finished call does: the answers are written in one place, batch_encoded. */
static void batch_call(serve_t *server, serve_batch_t *batch) {
    command_encode_call_t call = {.model = batch->model->model,
                                  .executor = server->executor,
                                  .outputs = UFORM_OUTPUT_EMBEDDINGS,
                                  .arena = batch->arena,
                                  .config = &batch->config,
                                  .outcome = &batch->outcome,
                                  .modality = batch->modality,
                                  .tape = {.data = batch->bytes,
                                           .offsets = batch->offsets,
                                           .count = batch->items,
                                           .length = batch->length},
                                  .source = UFORM_SOURCE_MEMORY};
    (void)command_encode_verb(&call);
}

/* Gathers the head's batch from the queue and submits it. */
static void batch_submit(serve_t *server) {
    serve_batch_t *batch = &server->batches[server->next_batch];
    serve_model_t *model = server->queue_head->request->model;
    uform_modality_t modality = server->queue_head->modality;
    size_t width = server->queue_head->request->dimensions;
    size_t budget = server->flags.batch_bytes, bytes = 0;
    uint64_t now = loop_now_ns();
    serve_part_t *tail = NULL;
    batch->length = batch->items = batch->parts_count = 0;
    batch->parts = NULL;
    batch->model = model;
    batch->modality = modality;

    serve_part_t *previous = NULL;
    for (serve_part_t **link = &server->queue_head; *link;) {
        serve_part_t *part = *link;
        serve_request_t *request = part->request;
        if (request->model != model || part->modality != modality || request->dimensions != width) {
            previous = part;
            link = &part->next;
            continue;
        }
        if (batch->parts_count && bytes + part->budget > budget) break;
        queue_unlink(server, link, previous);
        if (request_abandoned(request)) {
            /* Its other parts are dropped below, as a failed request's are. */
            request->parts_pending--;
            request->abandoned = request->failed = true;
            server->metrics.abandoned++;
            request_settle(server, request);
            continue;
        }
        if (request->parts_queued == 0)
            metrics_observe(&server->metrics, STAGE_QUEUE, now - request->queued_ns);
        if (!batch_reserve(batch, part->taped, part->count)) {
            /* Its other parts are dropped below, once this walk no longer holds links into the queue. */
            request->parts_pending--;
            request->failed = true;
            api_error(request, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", NULL, NULL,
                      "out of memory for the batch: try again");
            request_settle(server, request);
            continue;
        }
        batch_add(batch, part, &tail);
        bytes += part->budget;
    }
    queue_drop_failed(server);
    if (!batch->parts) return;

    batch->offsets[0] = 0;
    batch->stats = (uform_encode_stats_t){0};
    batch->config =
        (uform_encode_config_t){.outputs_scalar = UFORM_F32, .matryoshka = width, .stats = &batch->stats};
    batch->submitted_ns = now;
    server->encoding = batch;
    server->next_batch ^= 1;
    batch_call(server, batch);
    metrics_observe_batch(&server->metrics, batch->parts_count);
}

void batch_kick(serve_t *server) {
    /* A batch whose every request failed before it was submitted leaves the executor idle: go again. */
    while (!server->encoding && server->queue_head && !server->stopping) {
        uint64_t due = server->queue_head->request->queued_ns + server->flags.batch_delay_us * 1000u;
        if (!server->draining && server->queued_bytes < server->flags.batch_bytes && loop_now_ns() < due) {
            serve_timer_want(server, &server->batch_timer, due);
            return;
        }
        batch_submit(server);
    }
}

/* ---- answers ----------------------------------------------------------------------------------- */

/* The call failed as a whole: every request of it answers the rendered failure. */
static void answer_failure(serve_request_t *request, uform_error_t const *error) {
    char rendered[256];
    uform_error_render(error, rendered, sizeof rendered);
    request->failed = true;
    api_error(request, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", NULL, "engine_error", "%s", rendered);
}

/* An input the engine could not encode fails its request: a 400 where the input is at fault (or needs a
 * decoder this build lacks), a 500 where the server is. */
static void answer_item_failure(serve_request_t *request, size_t index, uform_status_t status) {
    char const *modality = command_modality_names[request->inputs[index].modality];
    char param[32];
    snprintf(param, sizeof param, "input[%zu]", index);
    request->failed = true;
    char const *name = uform_status_name(status);
    if (status != UFORM_FORMAT && status != UFORM_INVALID_ARGUMENT && status != UFORM_UNSUPPORTED) {
        api_error(request, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", param, "engine_error",
                  "input[%zu]: the engine could not encode the %s: %s", index, modality, name);
        return;
    }
    bool unsupported = status == UFORM_UNSUPPORTED;
    char const *why = unsupported ? "its format or codec is not built into this server"
                                  : "malformed, truncated, or not a format the engine recognizes by content";
    api_error(request, MHD_HTTP_BAD_REQUEST, "invalid_request_error", param,
              unsupported ? "unsupported_modality" : "invalid_media",
              "input[%zu]: the %s could not be encoded: %s (%s)", index, modality, name, why);
}

/* Copies a finished part's rows into its request's vectors, in input order; an input that failed fails
 * the request instead. */
static void part_take(serve_part_t *part, uform_encoded_t const *encoded) {
    serve_request_t *request = part->request;
    uform_view_t const *embeddings = &encoded->embeddings;
    size_t row = part->first_row;
    for (size_t i = 0; i < request->count; ++i) {
        if (request->inputs[i].modality != part->modality) continue;
        uform_status_t item = encoded->statuses[row];
        if (item != UFORM_OK) {
            answer_item_failure(request, i, item);
            return;
        }
        void const *data = NULL;
        if (uform_view_row(embeddings, row, &data) != UFORM_OK || embeddings->scalar != UFORM_F32 ||
            embeddings->columns != request->width) {
            request->failed = true;
            api_error(request, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", NULL, "engine_error",
                      "the engine's embeddings could not be read");
            return;
        }
        memcpy(request->vectors + i * request->width, data, request->width * sizeof(float));
        ++row;
    }
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
    if (batch->modality != UFORM_MODALITY_TEXT)
        metrics_observe(metrics, STAGE_DECODE, batch->stats.read_ns + batch->stats.decode_ns);
    metrics_observe(metrics, STAGE_COMPUTE, batch->stats.compute_ns);
    metrics->batches++;
    metrics->items += batch->items;
    metrics->modality_batches[batch->modality]++;
    metrics->modality_items[batch->modality] += batch->items;
    metrics->truncated += batch->stats.truncated;

    uform_encoded_t encoded;
    memset(&encoded, 0, sizeof encoded);
    uform_status_t products = uform_outcome_encoded(&batch->outcome, &encoded);
    uform_error_t error = uform_outcome_error(&batch->outcome);

    /* The rows go into their requests before the next call is gathered, so that the parts of a request
     * that failed here are dropped rather than encoded. */
    for (serve_part_t *part = batch->parts; part; part = part->next) {
        serve_request_t *request = part->request;
        request->parts_pending--;
        if (request->failed) continue;
        if (status != UFORM_OK || products != UFORM_OK)
            answer_failure(request, &error);
        else
            part_take(part, &encoded);
    }
    queue_drop_failed(server);

    /* The executor takes the next batch, into the other arena, while these answers are written. */
    batch_kick(server);

    for (serve_part_t *part = batch->parts, *next = NULL; part; part = next) {
        next = part->next;
        part->next = NULL;
        request_settle(server, part->request);
    }
    batch->parts = NULL;
    batch->parts_count = 0;
    serve_drain_check(server);
}
