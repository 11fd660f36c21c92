/* uform serve: an OpenAI-compatible embedding server on the engine's own event loop. This file holds
 * the command's flag table, libmicrohttpd driven from the loop, the route table (each endpoint's path,
 * methods and handler, walked by one dispatcher), signals and the shutdown; the bodies are in
 * uform_serve_api.c, the batcher in uform_serve_batch.c, the metrics in uform_serve_metrics.c, and
 * uform_serve.h tells how they fit. */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "uform_serve.h"

static char const help_head[] =
    "usage: uform serve [options]\n"
    "\n"
    "Serves models' embeddings over HTTP/1.1 with OpenAI's embeddings API, so that OpenAI's\n"
    "clients work against it with base_url http://HOST:PORT/v1; images, audio and video come as base64\n"
    "in an extension of it. Concurrent requests are gathered into one engine call per model and\n"
    "modality; a vector never depends on what it was batched with, and equals what 'uform encode'\n"
    "writes for the same text or file and width. Several models may be served at once: --model\n"
    "NAME=PATH, repeated; a request's \"model\" picks one, the first given where it names none.\n"
    "\n";

static char const help_tail[] =
    "\n"
    "Once it listens it prints one line on standard output:\n"
    "  uform serve: listening on http://HOST:PORT (model NAME)\n"
    "(https:// with --tls-cert; \"(models NAME, NAME, ...)\" with several).\n"
    "\n"
    "Listening on an address other than a loopback one without a key, it says so on standard error.\n"
    "\n"
    "Keys: with --api-key, --api-key-file or UFORM_API_KEY (every key any of them gives is taken), a\n"
    "request to any route but /health and /openapi.json must carry 'Authorization: Bearer KEY', as\n"
    "OpenAI's clients send their api_key; keys are compared in constant time. Without one, or with\n"
    "another, it is answered 401 {\"error\": {\"message\", \"type\": \"invalid_request_error\",\n"
    "\"param\": null, \"code\": \"invalid_api_key\"}} with 'WWW-Authenticate: Bearer'.\n"
    "\n"
    "Endpoints:\n"
    "  POST /v1/embeddings   OpenAI's request: \"input\" (a string or a list of up to 2048 strings; token\n"
    "                        ids are refused), \"model\" (a served name, or absent: the first), "
    "\"dimensions\" (a\n"
    "                        matryoshka width of the model, see 'uform info'), \"encoding_format\"\n"
    "                        (\"float\", or \"base64\": little-endian F32), \"user\" (ignored); and\n"
    "                        \"truncate\" (default true: texts longer than the model's context are cut\n"
    "                        to it and flagged \"truncated\": true in their data item; false answers 400\n"
    "                        context_length_exceeded instead). usage.prompt_tokens counts what the\n"
    "                        model read: a tokenized model's tokens (its prompt's and special\n"
    "                        tokens with them, the context counted so too), else the text bytes\n"
    "                        plus one per text. Errors are OpenAI's\n"
    "                        {\"error\": {\"message\", \"type\", \"param\", \"code\"}} with 400, 401\n"
    "                        (a key is required: see --api-key), 404 (a model not served:\n"
    "                        model_not_found), 405 (another method), 413, 429, 500, 503.\n"
    "                        Multimodal extension: a list item may be {\"text\": ...} or {\"image\" |\n"
    "                        \"audio\" | \"video\": \"data:<media type>;base64,<bytes>\"} (or the base64\n"
    "                        alone; the format is recognized by content): JPEG or PNG images, sounds\n"
    "                        and clips FFmpeg decodes. Media count no usage tokens and carry no\n"
    "                        \"truncated\". Bad base64: 400 invalid_value; a model or build without\n"
    "                        the modality: 400 unsupported_modality; an item the engine cannot decode:\n"
    "                        400 invalid_media (param \"input[i]\") for its request alone.\n"
    "  POST /tokenize        Hugging Face text-embeddings-inference's request: \"inputs\" (a string or\n"
    "                        a list of strings), \"add_special_tokens\" (default true), \"prompt_name\"\n"
    "                        (one of the model's prompts; absent: its default prompt, if any), and\n"
    "                        \"model\" (as above). Answers a list per input of its tokens, {\"id\",\n"
    "                        \"text\", \"special\", \"start\", \"stop\"}: a special token's string and null\n"
    "                        offsets, or the bytes [start, stop) of the (prompted) input it covers.\n"
    "                        Texts are cut whole, on the server's thread: at most --batch-bytes\n"
    "                        bytes a request, prompts included (413 inputs_too_large past them). A\n"
    "                        model that reads bytes has no tokenizer: 400 tokenizer_unavailable.\n"
    "  GET /v1/models        the served models, with their \"dimensions\" and \"context_length\" (also\n"
    "                        GET /v1/models/NAME)\n"
    "  GET /health           200 while the process serves\n"
    "  GET /openapi.json     the OpenAPI 3.0 document of these endpoints: every body, status and error\n"
    "                        shape, and the key as a bearer security scheme\n"
    "  GET /ready            200 while it takes requests, 503 once it shuts down\n"
    "  GET /metrics          Prometheus text: answers by route and status; seconds per stage (queue,\n"
    "                        decode (media batches), compute, encode, serialize, request); requests per\n"
    "                        batch; batches and inputs by modality; the queue; requests abandoned\n"
    "                        (uform_requests_abandoned_total: queued requests whose client closed\n"
    "                        before their batch, dropped without being encoded)\n"
    "\n"
    "SIGTERM or SIGINT stops it gracefully: no new connections, every request in flight is answered, and\n"
    "it exits 0 (a second signal, or 30 seconds, cuts the rest short and answers what is queued 503).\n"
    "\n";

enum { SERVE_DRAIN_SECONDS = 30 };

/* ---- flags ------------------------------------------------------------------------------------- */

static command_help_t const help = {
    .name = "serve", .head = help_head, .tail = help_tail, .column = 24, .model_help = true};

static int parse_flags(int argc, char **argv, serve_flags_t *flags) {
    flags->models = (command_strings_t){.values = flags->model_values};
    command_flag_t const table[] = {
        {"--model", FLAG_STRINGS, &flags->models, .value = "[NAME=]PATH", .maximum = SERVE_MODELS_MAX,
         .help = "a model to serve, a checkpoint or a pretrained folder, named NAME in\n"
                 "requests and in /v1/models; repeated for several (at most 16), the first\n"
                 "answering requests that name none. A value whose first '=' comes before any\n"
                 "'/' is NAME=PATH; else it is a PATH alone, named by --name (one model), by\n"
                 "its hub id (OWNER/NAME[@REVISION] in the local Hugging Face cache, where\n"
                 "no such file or folder exists) or by its file or folder name without\n"
                 ".safetensors. Default: the default model (below)"},
        {"--name", FLAG_STRING, &flags->name, .value = "NAME",
         .help = "the name of the one model served without NAME=; default: the checkpoint's\n"
                 "file name without .safetensors (tiny-42 for the default model)"},
        {"--threads", FLAG_SIZE, &flags->threads, .value = "N", .maximum = 4096,
         .help = "the executor's worker threads; 0 (the default) takes 7/8 of the cores"},
        command_flag_weights(&flags->weights),
        {"--host", FLAG_STRING, &flags->host, .value = "ADDRESS",
         .help = "the address to listen on (default 127.0.0.1; 0.0.0.0 or :: for all)"},
        {"--port", FLAG_UNSIGNED, &flags->port, .value = "N", .maximum = 65535,
         .help = "the TCP port (default 8080); 0 picks a free one"},
        {"--batch-bytes", FLAG_SIZE, &flags->batch_bytes, .value = "N", .maximum = SIZE_MAX / 2,
         .help = "the input bytes one engine call gathers at most (default 262144): text bytes\n"
                 "up to the context, media bytes once decoded; a request's inputs of one\n"
                 "modality are never split, so a larger request goes alone"},
        {"--batch-delay-us", FLAG_U64, &flags->batch_delay_us, .value = "N", .maximum = 60000000,
         .help = "how long the oldest queued request may wait for others to join its batch\n"
                 "while the executor is idle (default 0: at once; requests arriving while it\n"
                 "computes are batched anyway)"},
        {"--queue", FLAG_SIZE, &flags->queue, .value = "N", .minimum = 1, .maximum = 1000000,
         .help = "requests waiting for the executor at most (default 1024); more are answered\n"
                 "429 with Retry-After"},
        {"--body-limit", FLAG_SIZE, &flags->body_limit, .value = "N", .maximum = (uint64_t)1 << 40,
         .help = "request bodies over N bytes are answered 413 without being read (default\n"
                 "16777216)"},
        {"--timeout", FLAG_UNSIGNED, &flags->timeout_s, .value = "SECONDS", .maximum = 86400,
         .help = "idle connections are closed after this (default 60)"},
        {"--ip-connections", FLAG_UNSIGNED, &flags->ip_connections, .value = "N", .minimum = 1,
         .maximum = 100000,
         .help = "connections one client address may hold at once (default 128); more are\n"
                 "closed as they come. The server holds about 1,000 connections in all (the\n"
                 "FD_SETSIZE of select, which drives libmicrohttpd: no descriptor past 1023);\n"
                 "one more is closed as it comes"},
        {"--api-key", FLAG_STRING, &flags->api_key, .value = "KEY",
         .help = "requests must send 'Authorization: Bearer KEY' on every route but /health\n"
                 "and /openapi.json (see Keys below; default: UFORM_API_KEY, or no key)"},
        {"--api-key-file", FLAG_STRING, &flags->api_key_file, .value = "PATH",
         .help = "keys taken as well, one per line (blank lines and lines starting with #\n"
                 "are skipped, spaces around a key are not part of it)"},
        {"--tls-cert", FLAG_STRING, &flags->tls_cert, .value = "PATH",
         .help = "serves HTTPS (libmicrohttpd's TLS) with this PEM certificate, or chain,\n"
                 "whose key is --tls-key"},
        {"--tls-key", FLAG_STRING, &flags->tls_key, .value = "PATH",
         .help = "the unencrypted PEM private key of --tls-cert"},
        {NULL},
    };
    command_spec_t const spec = {.help = &help, .flags = table};
    int code = command_flags_parse(&spec, argc, argv, &flags->help);
    if (code != COMMAND_OK || flags->help) return code;
    if (flags->batch_bytes == 0) return command_usage(help.name, "--batch-bytes must be at least 1");
    if (!flags->tls_cert != !flags->tls_key)
        return command_usage(help.name, "--tls-cert and --tls-key go together");
    if (flags->api_key && !flags->api_key[0]) return command_usage(help.name, "--api-key must not be empty");
    return COMMAND_OK;
}

/* ---- timers and libmicrohttpd on the loop ------------------------------------------------------ */

static void timer_done(loop_op_t *op) {
    serve_timer_t *timer = SERVE_CONTAINER_OF(op, serve_timer_t, op);
    timer->armed = false;
    timer->cancelling = false;
    /* A cancelled timer was shortened: `fire` works out what is due and arms it again. */
    if (!timer->server->stopping) timer->fire(timer->server);
}

void serve_timer_want(serve_t *server, serve_timer_t *timer, uint64_t deadline_ns) {
    if (server->stopping) return;
    if (!timer->armed) {
        uint64_t now = loop_now_ns();
        timer->deadline_ns = deadline_ns;
        timer->armed = true;
        loop_timer(server->loop, &timer->op, deadline_ns > now ? deadline_ns - now : 0);
        return;
    }
    /* An armed timer due by then (within 100 us) serves; an earlier deadline cancels it. */
    if (timer->cancelling || deadline_ns + 100000 >= timer->deadline_ns) return;
    timer->cancelling = true;
    loop_cancel(server->loop, &timer->op);
}

static void serve_post_pump(serve_t *server) {
    if (server->pump_posted || server->stopping) return;
    server->pump_posted = true;
    loop_post(server->loop, &server->pump);
}

static void serve_stop(serve_t *server);

/* Sets what the epoll set holds for `fd` (0: nothing). A failure leaves the entry as it was, so that
 * the next sync tries again; the warning is said once. */
static void watch_set(serve_t *server, int fd, uint32_t events) {
    struct epoll_event event = {.events = events, .data.fd = fd};
    int done;
    if (!events) {
        /* A descriptor closed already left the set with it. */
        (void)epoll_ctl(server->epoll_fd, EPOLL_CTL_DEL, fd, NULL);
        server->watched[fd] = 0;
        return;
    }
    if (server->watched[fd]) {
        done = epoll_ctl(server->epoll_fd, EPOLL_CTL_MOD, fd, &event);
        if (done < 0 && errno == ENOENT) done = epoll_ctl(server->epoll_fd, EPOLL_CTL_ADD, fd, &event);
    } else {
        done = epoll_ctl(server->epoll_fd, EPOLL_CTL_ADD, fd, &event);
        if (done < 0 && errno == EEXIST) done = epoll_ctl(server->epoll_fd, EPOLL_CTL_MOD, fd, &event);
    }
    if (done == 0) {
        server->watched[fd] = events;
        return;
    }
    static bool warned;
    if (!warned) fprintf(stderr, "uform: cannot watch socket %d: %s\n", fd, strerror(errno));
    warned = true;
}

/* Mirrors the descriptors libmicrohttpd wants read or written into the epoll set. */
static void watch_sync(serve_t *server) {
    fd_set reads, writes, errors;
    FD_ZERO(&reads);
    FD_ZERO(&writes);
    FD_ZERO(&errors);
    MHD_socket top = -1;
    /* MHD_NO still leaves in the sets every descriptor that fits them, and those are served. */
    (void)MHD_get_fdset2(server->daemon, &reads, &writes, &errors, &top, FD_SETSIZE);
    int last = top > server->watched_top ? top : server->watched_top, held = -1;
    for (int fd = 0; fd <= last; ++fd) {
        uint32_t events = 0;
        if (fd <= top)
            events = (FD_ISSET(fd, &reads) ? EPOLLIN : 0u) | (FD_ISSET(fd, &writes) ? EPOLLOUT : 0u);
        if (events != server->watched[fd]) watch_set(server, fd, events);
        if (server->watched[fd]) held = fd;
    }
    server->watched_top = held;
}

/* libmicrohttpd closes a connection: its descriptor leaves the set before its number can be reused. */
static void serve_connection_notify(void *cls, struct MHD_Connection *connection, void **socket_context,
                                    enum MHD_ConnectionNotificationCode code) {
    (void)socket_context;
    serve_t *server = cls;
    if (code != MHD_CONNECTION_NOTIFY_CLOSED) return;
    union MHD_ConnectionInfo const *info =
        MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (info && info->connect_fd >= 0 && info->connect_fd < FD_SETSIZE && server->watched[info->connect_fd])
        watch_set(server, info->connect_fd, 0);
}

/* Lets libmicrohttpd do what it can without blocking, then arranges to be called again when its
 * timeout says: at once (a post to the loop) or by a timer. The epoll set's poll covers the rest. */
static void serve_pump(serve_t *server) {
    if (server->stopping) return;
    MHD_run(server->daemon);
    if (server->finishing) {
        serve_stop(server);
        return;
    }
    watch_sync(server);
    MHD_UNSIGNED_LONG_LONG milliseconds = 0;
    if (server->stopping || MHD_get_timeout(server->daemon, &milliseconds) != MHD_YES) return;
    if (milliseconds == 0)
        serve_post_pump(server);
    else
        serve_timer_want(server, &server->http_timer, loop_now_ns() + milliseconds * 1000000u);
}

static void pump_done(loop_op_t *op) {
    serve_t *server = SERVE_CONTAINER_OF(op, serve_t, pump);
    server->pump_posted = false;
    serve_pump(server);
}

static void http_watch_done(loop_op_t *op) {
    serve_t *server = SERVE_CONTAINER_OF(op, serve_t, http_watch);
    server->http_armed = false;
    if (server->stopping) return;
    if (op->result < 0 && op->result != -ECANCELED)
        fprintf(stderr, "uform: cannot watch the server's sockets: %s\n", strerror((int)-op->result));
    serve_pump(server);
    if (server->stopping) return;
    loop_poll(server->loop, &server->http_watch, server->epoll_fd, POLLIN);
    server->http_armed = true;
}

static void http_timer_fire(serve_t *server) {
    serve_pump(server);
}

/* ---- requests ---------------------------------------------------------------------------------- */

static enum MHD_Result request_queue(serve_request_t *request) {
    serve_t *server = request->server;
    struct MHD_Response *response = request->response;
    request->response = NULL;
    if (!response) return MHD_NO; /* not even a static answer could be made: drop the connection */
    if (server->draining) MHD_add_response_header(response, MHD_HTTP_HEADER_CONNECTION, "close");
    request->answered = true;
    enum MHD_Result queued = MHD_queue_response(request->connection, request->status, response);
    MHD_destroy_response(response);
    metrics_count(&server->metrics, request->route, request->status);
    if (request->route == ROUTE_EMBEDDINGS)
        metrics_observe(&server->metrics, STAGE_REQUEST, loop_now_ns() - request->started_ns);
    return queued;
}

void serve_request_resume(serve_request_t *request) {
    if (!request->suspended) return;
    request->suspended = false;
    MHD_resume_connection(request->connection);
    serve_post_pump(request->server);
}

/* A plain JSON body, for the small answers. */
static void answer_json(serve_request_t *request, unsigned status, char const *body) {
    serve_text_t text = {0};
    text_puts(&text, body);
    api_answer_text(request, status, &text, "application/json");
}

/* 429, with Retry-After: the queue holds --queue requests already. */
static enum MHD_Result answer_queue_full(serve_t *server, serve_request_t *request) {
    server->metrics.rejected_full++;
    api_error(request, MHD_HTTP_TOO_MANY_REQUESTS, "rate_limit_error", NULL, "queue_full",
              "the queue is full (%zu requests): retry later", server->queued);
    if (request->response) MHD_add_response_header(request->response, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    return request_queue(request);
}

static enum MHD_Result answer_shutting_down(serve_request_t *request) {
    api_error(request, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", NULL, "shutting_down",
              "the server is shutting down");
    return request_queue(request);
}

/* POST /v1/embeddings and POST /tokenize: refused at once while shutting down, when the body is
 * announced too large, or (embeddings) when the queue is full; else MHD_YES, to take the body in the next
 * calls. */
static enum MHD_Result route_body(serve_t *server, serve_request_t *request, char const *name) {
    (void)name;
    if (server->draining) {
        return answer_shutting_down(request); /* at once, without reading the body */
    }
    if (request->route == ROUTE_EMBEDDINGS && server->queued >= server->flags.queue) {
        return answer_queue_full(server, request);
    }
    char const *length =
        MHD_lookup_connection_value(request->connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    uint64_t bytes = 0;
    if (length && command_parse_u64(length, &bytes) == 0 && bytes > server->flags.body_limit) {
        api_error(request, MHD_HTTP_CONTENT_TOO_LARGE, "invalid_request_error", NULL, "body_too_large",
                  "the body is %llu bytes; this server takes at most %zu (--body-limit)",
                  (unsigned long long)bytes, server->flags.body_limit);
        return request_queue(request);
    }
    /* Room for what the client announced, up to 1 MiB; more grows as it comes. */
    size_t reserve = bytes < ((size_t)1 << 20) ? (size_t)bytes : (size_t)1 << 20;
    if (length && reserve > 0) {
        request->body = malloc(reserve);
        request->body_capacity = request->body ? reserve : 0;
    }
    return MHD_YES;
}

static enum MHD_Result route_health(serve_t *server, serve_request_t *request, char const *name) {
    (void)server;
    (void)name;
    answer_json(request, MHD_HTTP_OK, "{\"status\":\"ok\"}");
    return MHD_YES;
}

static enum MHD_Result route_ready(serve_t *server, serve_request_t *request, char const *name) {
    (void)name;
    if (server->draining)
        answer_json(request, MHD_HTTP_SERVICE_UNAVAILABLE, "{\"status\":\"shutting down\"}");
    else
        answer_json(request, MHD_HTTP_OK, "{\"status\":\"ready\"}");
    return MHD_YES;
}

static enum MHD_Result route_metrics(serve_t *server, serve_request_t *request, char const *name) {
    (void)name;
    serve_text_t text = {0};
    metrics_render(server, &text);
    api_answer_text(request, MHD_HTTP_OK, &text, "text/plain; version=0.0.4; charset=utf-8");
    return MHD_YES;
}

static enum MHD_Result route_openapi(serve_t *server, serve_request_t *request, char const *name) {
    (void)name;
    api_answer_openapi(server, request);
    return MHD_YES;
}

static enum MHD_Result route_models(serve_t *server, serve_request_t *request, char const *name) {
    api_answer_models(server, request, name);
    return MHD_YES;
}

/* Whether `given` is one of the server's keys. Every byte of every key is compared, whatever matched,
 * so that the time taken tells nothing of how much of a key was right. */
static bool key_matches(serve_t const *server, char const *given, size_t length) {
    unsigned matched = 0;
    for (size_t k = 0; k < server->keys_count; ++k) {
        unsigned char const *key = (unsigned char const *)server->keys[k];
        size_t key_length = server->key_lengths[k];
        unsigned difference = key_length != length;
        for (size_t i = 0; i < key_length; ++i)
            difference |= key[i] ^ (i < length ? (unsigned char)given[i] : 0u);
        matched |= difference == 0;
    }
    return matched != 0;
}

/* Whether the request carries one of the keys as `Authorization: Bearer KEY`; else sets its 401. */
static bool request_authorized(serve_t *server, serve_request_t *request) {
    char const *header =
        MHD_lookup_connection_value(request->connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    static char const scheme[] = "Bearer ";
    bool bearer = header && !strncasecmp(header, scheme, sizeof scheme - 1);
    if (bearer) {
        char const *given = header + sizeof scheme - 1;
        while (*given == ' ')
            ++given;
        size_t length = strlen(given);
        while (length > 0 && given[length - 1] == ' ')
            --length;
        if (key_matches(server, given, length)) return true;
    }
    api_error(request, MHD_HTTP_UNAUTHORIZED, "invalid_request_error", NULL, "invalid_api_key",
              bearer ? "Incorrect API key provided: this server takes none of it"
                     : "You didn't provide an API key: send it as 'Authorization: Bearer KEY' (OpenAI's "
                       "clients: api_key=KEY)");
    if (request->response)
        MHD_add_response_header(request->response, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    return false;
}

/* One endpoint: its path (with `/NAME` after it too when `named`), the methods it takes, and the
 * handler of a request's first call, given the NAME or NULL. A handler answers at once (request_queue),
 * or leaves an answer for the next call, or returns MHD_YES with none to take a body. */
typedef struct serve_endpoint {
    char const *path;
    bool named;
    serve_route_t route;
    char const *methods[2]; /* NULL where fewer */
    char const *allowed;    /* the Allow header of a 405 */
    enum MHD_Result (*handler)(serve_t *server, serve_request_t *request, char const *name);
} serve_endpoint_t;

static serve_endpoint_t const endpoints[] = {
    {"/v1/embeddings", false, ROUTE_EMBEDDINGS, {MHD_HTTP_METHOD_POST}, "POST", route_body},
    {"/tokenize", false, ROUTE_TOKENIZE, {MHD_HTTP_METHOD_POST}, "POST", route_body},
    {"/health", false, ROUTE_HEALTH, {MHD_HTTP_METHOD_GET, MHD_HTTP_METHOD_HEAD}, "GET, HEAD", route_health},
    {"/ready", false, ROUTE_READY, {MHD_HTTP_METHOD_GET, MHD_HTTP_METHOD_HEAD}, "GET, HEAD", route_ready},
    {"/metrics",
     false,
     ROUTE_METRICS,
     {MHD_HTTP_METHOD_GET, MHD_HTTP_METHOD_HEAD},
     "GET, HEAD",
     route_metrics},
    {"/v1/models",
     true,
     ROUTE_MODELS,
     {MHD_HTTP_METHOD_GET, MHD_HTTP_METHOD_HEAD},
     "GET, HEAD",
     route_models},
    {"/openapi.json",
     false,
     ROUTE_OPENAPI,
     {MHD_HTTP_METHOD_GET, MHD_HTTP_METHOD_HEAD},
     "GET, HEAD",
     route_openapi},
};

static bool endpoint_takes(serve_endpoint_t const *endpoint, char const *method) {
    for (size_t i = 0; i < sizeof endpoint->methods / sizeof endpoint->methods[0]; ++i)
        if (endpoint->methods[i] && !strcmp(endpoint->methods[i], method)) return true;
    return false;
}

/* The first call of a request, with its headers: answers at once, or returns MHD_YES to take its body.
 * An answer left for the next call is queued once the request is whole: one queued with the headers
 * alone would close a keep-alive connection. */
static enum MHD_Result route_request(serve_t *server, serve_request_t *request, char const *url,
                                     char const *method) {
    for (size_t i = 0; i < sizeof endpoints / sizeof endpoints[0]; ++i) {
        serve_endpoint_t const *endpoint = &endpoints[i];
        size_t length = strlen(endpoint->path);
        if (strncmp(url, endpoint->path, length) != 0) continue;
        char const *rest = url + length;
        if (*rest != '\0' && !(endpoint->named && *rest == '/')) continue;
        request->route = endpoint->route;
        bool keyless = endpoint->route == ROUTE_HEALTH || endpoint->route == ROUTE_OPENAPI;
        if (!keyless && server->keys_count && !request_authorized(server, request)) return MHD_YES;
        if (endpoint_takes(endpoint, method))
            return endpoint->handler(server, request, *rest ? rest + 1 : NULL);
        api_error(request, MHD_HTTP_METHOD_NOT_ALLOWED, "invalid_request_error", NULL, "method_not_allowed",
                  "%s takes %s, not %s", url, endpoint->allowed, method);
        if (request->response)
            MHD_add_response_header(request->response, MHD_HTTP_HEADER_ALLOW, endpoint->allowed);
        return MHD_YES;
    }
    request->route = ROUTE_OTHER;
    if (server->keys_count && !request_authorized(server, request)) return MHD_YES;
    api_error(request, MHD_HTTP_NOT_FOUND, "invalid_request_error", NULL, "not_found",
              "no such endpoint: %s %s (see 'uform serve --help')", method, url);
    return MHD_YES;
}

/* A piece of the body: kept up to the limit; past it, the rest is read and dropped, and the answer is
 * 413 (a body whose Content-Length says too much is refused before any of it is read). */
static void take_body(serve_t *server, serve_request_t *request, char const *data, size_t size) {
    if (request->oversize) return;
    if (size > server->flags.body_limit - request->body_length) {
        request->oversize = true;
        free(request->body);
        request->body = NULL;
        request->body_length = request->body_capacity = 0;
        return;
    }
    if (request->body_length + size > request->body_capacity) {
        size_t capacity = request->body_capacity ? request->body_capacity : 4096;
        while (capacity < request->body_length + size)
            capacity *= 2;
        if (capacity > server->flags.body_limit) capacity = server->flags.body_limit;
        char *grown = realloc(request->body, capacity);
        if (!grown) {
            request->oversize = true; /* answered 413 all the same: the server cannot hold it */
            return;
        }
        request->body = grown;
        request->body_capacity = capacity;
    }
    memcpy(request->body + request->body_length, data, size);
    request->body_length += size;
}

/* The body is complete: answer at once, or queue it and suspend the connection until it is encoded. */
static enum MHD_Result finish_body(serve_t *server, serve_request_t *request) {
    if (request->oversize) {
        api_error(request, MHD_HTTP_CONTENT_TOO_LARGE, "invalid_request_error", NULL, "body_too_large",
                  "the body is larger than this server takes: %zu bytes (--body-limit)",
                  server->flags.body_limit);
        return request_queue(request);
    }
    /* A request begun before a shutdown is answered in full, unless the shutdown was cut short. */
    if (server->forced) {
        return answer_shutting_down(request);
    }
    if (request->route == ROUTE_TOKENIZE) {
        api_tokenize(server, request);
        return request_queue(request);
    }
    if (!api_parse_embeddings(server, request)) return request_queue(request);
    if (!batch_enqueue(server, request)) {
        return answer_queue_full(server, request);
    }
    request->suspended = true;
    MHD_suspend_connection(request->connection);
    batch_kick(server);
    return MHD_YES;
}

static enum MHD_Result serve_access(void *cls, struct MHD_Connection *connection, char const *url,
                                    char const *method, char const *version, char const *upload_data,
                                    size_t *upload_data_size, void **state) {
    (void)version;
    serve_t *server = cls;
    serve_request_t *request = *state;
    if (!request) {
        request = calloc(1, sizeof *request);
        if (!request) return MHD_NO;
        request->server = server;
        request->connection = connection;
        request->started_ns = loop_now_ns();
        *state = request;
        server->requests++;
        return route_request(server, request, url, method);
    }
    if (request->abandoned) return MHD_NO; /* no one to answer: the connection is closed */
    if (request->answered) {
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        /* Only embeddings and tokenize take a body; another route's is read and dropped. */
        if (!request->response) take_body(server, request, upload_data, *upload_data_size);
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (request->response) return request_queue(request); /* a route's answer, or resumed with one */
    return finish_body(server, request);
}

/* libmicrohttpd is done with a request: answered and sent, or its connection failed or timed out. */
static void serve_completed(void *cls, struct MHD_Connection *connection, void **state,
                            enum MHD_RequestTerminationCode reason) {
    (void)connection;
    (void)reason;
    serve_t *server = cls;
    serve_request_t *request = *state;
    if (!request) return;
    *state = NULL;
    if (request->response) MHD_destroy_response(request->response);
    json_decref(request->json);
    free(request->inputs);
    free(request->vectors);
    free(request->body);
    free(request);
    server->requests--;
    serve_drain_check(server);
}

/* libmicrohttpd's messages go to stderr, at most SERVE_LOG_PER_SECOND in a second: a flood of clients that
 * each earn one ("Connection was closed by remote side with incomplete request") does not flood the
 * log. The others are counted, and the count printed before the next message printed, or at the end. */
#define SERVE_LOG_PER_SECOND 10

static void serve_log_unprinted(serve_t *server) {
    if (server->log_unprinted)
        fprintf(stderr, "uform: http: %zu more messages not printed (at most %d a second)\n",
                server->log_unprinted, SERVE_LOG_PER_SECOND);
    server->log_unprinted = 0;
}

static void serve_log(void *cls, char const *format, va_list arguments) {
    serve_t *server = cls;
    uint64_t const now = loop_now_ns();
    if (now - server->log_window_ns >= 1000000000u) {
        server->log_window_ns = now;
        server->log_printed = 0;
    }
    if (server->log_printed == SERVE_LOG_PER_SECOND) {
        server->log_unprinted++;
        return;
    }
    server->log_printed++;
    serve_log_unprinted(server);
    fputs("uform: http: ", stderr);
    vfprintf(stderr, format, arguments);
}

/* ---- signals and shutdown ---------------------------------------------------------------------- */

/* Ends every watch; the loop runs until their callbacks have come, then the command returns. */
static void serve_stop(serve_t *server) {
    if (server->stopping) return;
    server->stopping = true;
    if (server->http_armed) loop_cancel(server->loop, &server->http_watch);
    if (server->encoded_armed) loop_cancel(server->loop, &server->encoded_watch);
    if (server->signal_armed) loop_cancel(server->loop, &server->signal_watch);
    serve_timer_t *timers[] = {&server->http_timer, &server->batch_timer, &server->drain_timer};
    for (size_t i = 0; i < sizeof timers / sizeof timers[0]; ++i)
        if (timers[i]->armed && !timers[i]->cancelling) loop_cancel(server->loop, &timers[i]->op);
}

void serve_drain_check(serve_t *server) {
    if (!server->draining || server->stopping || server->finishing) return;
    if (server->forced) {
        if (server->encoding) return; /* its answers come first */
        batch_refuse_queued(server, MHD_HTTP_SERVICE_UNAVAILABLE, "the server is shutting down");
        /* This may run inside libmicrohttpd's callbacks: the next pump sends what the sockets take at
         * once, then stops. */
        server->finishing = true;
        serve_post_pump(server);
        return;
    }
    if (server->requests == 0 && !server->encoding && !server->queue_head) serve_stop(server);
}

static void drain_timer_fire(serve_t *server) {
    server->forced = true;
    serve_drain_check(server);
}

static void serve_drain(serve_t *server, int signal) {
    if (server->draining) {
        fprintf(stderr, "uform: SIG%s again: stopping now\n", sigabbrev_np(signal));
        server->forced = true;
        serve_drain_check(server);
        return;
    }
    server->draining = true;
    fprintf(stderr, "uform: SIG%s: answering %zu requests in flight, then stopping\n", sigabbrev_np(signal),
            server->requests);
    /* No new connections; those open finish what they asked. */
    MHD_socket listening = MHD_quiesce_daemon(server->daemon);
    if (listening != MHD_INVALID_SOCKET) {
        if (listening < FD_SETSIZE && server->watched[listening]) watch_set(server, listening, 0);
        (void)close(listening);
    }
    serve_timer_want(server, &server->drain_timer,
                     loop_now_ns() + (uint64_t)SERVE_DRAIN_SECONDS * 1000000000u);
    batch_kick(server); /* the queue goes without waiting for its delay */
    serve_drain_check(server);
    serve_post_pump(server);
}

static void signal_watch_done(loop_op_t *op) {
    serve_t *server = SERVE_CONTAINER_OF(op, serve_t, signal_watch);
    server->signal_armed = false;
    if (server->stopping) return;
    struct signalfd_siginfo info;
    while (op->result > 0 && read(server->signal_fd, &info, sizeof info) == (ssize_t)sizeof info) {
        serve_drain(server, (int)info.ssi_signo);
        if (server->stopping) return;
    }
    loop_poll(server->loop, &server->signal_watch, server->signal_fd, POLLIN);
    server->signal_armed = true;
}

/* ---- setup ------------------------------------------------------------------------------------- */

/* The checkpoint's file name without its directory and .safetensors. */
static char *default_name(char const *path) {
    char const *slash = strrchr(path, '/');
    char const *base = slash ? slash + 1 : path;
    size_t length = strlen(base);
    static char const suffix[] = ".safetensors";
    if (length > sizeof suffix - 1 && !strcmp(base + length - (sizeof suffix - 1), suffix))
        length -= sizeof suffix - 1;
    return strndup(base, length);
}

/* Reads the file `path` (named by `flag` in errors) whole, NUL-terminated, into `*text`. */
static int read_text(char const *flag, char const *path, char **text) {
    FILE *file = fopen(path, "rb");
    if (!file) return command_fail("cannot open %s %s: %s", flag, path, strerror(errno));
    char *data = NULL;
    size_t length = 0, capacity = 0;
    int code = COMMAND_OK;
    for (;;) {
        if (!command_reserve(&data, &capacity, length + 4097, 4096)) {
            code = command_fail("cannot read %s %s: out of memory", flag, path);
            goto done;
        }
        size_t got = fread(data + length, 1, 4096, file);
        length += got;
        if (got < 4096) break;
    }
    if (ferror(file)) {
        code = command_fail("cannot read %s %s: %s", flag, path, strerror(errno));
        goto done;
    }
    data[length] = '\0';
    if (strlen(data) != length) {
        code = command_fail("cannot read %s %s: it holds a NUL byte, not text", flag, path);
        goto done;
    }
    *text = data;
    data = NULL;
done:
    free(data);
    (void)fclose(file);
    return code;
}

/* Takes one key (copied), ignoring spaces around it and a blank or # line. */
static int keys_add(serve_t *server, char const *key, size_t length) {
    while (length > 0 && (*key == ' ' || *key == '\t'))
        ++key, --length;
    while (length > 0 && (key[length - 1] == ' ' || key[length - 1] == '\t' || key[length - 1] == '\r'))
        --length;
    if (length == 0 || key[0] == '#') return COMMAND_OK;
    char **keys = realloc(server->keys, (server->keys_count + 1) * sizeof *keys);
    if (keys) server->keys = keys;
    size_t *lengths = realloc(server->key_lengths, (server->keys_count + 1) * sizeof *lengths);
    if (lengths) server->key_lengths = lengths;
    char *copy = keys && lengths ? strndup(key, length) : NULL;
    if (!copy) return command_fail("out of memory for the API keys");
    server->keys[server->keys_count] = copy;
    server->key_lengths[server->keys_count++] = length;
    return COMMAND_OK;
}

/* The keys of --api-key, --api-key-file and UFORM_API_KEY. */
static int keys_load(serve_t *server) {
    char const *variable = getenv("UFORM_API_KEY");
    int code = COMMAND_OK;
    if (server->flags.api_key) code = keys_add(server, server->flags.api_key, strlen(server->flags.api_key));
    if (code == COMMAND_OK && variable && variable[0]) code = keys_add(server, variable, strlen(variable));
    if (code != COMMAND_OK || !server->flags.api_key_file) return code;
    char *text = NULL;
    if ((code = read_text("--api-key-file", server->flags.api_key_file, &text)) != COMMAND_OK) return code;
    size_t before = server->keys_count;
    for (char const *line = text; code == COMMAND_OK && *line;) {
        char const *end = strchr(line, '\n');
        size_t length = end ? (size_t)(end - line) : strlen(line);
        code = keys_add(server, line, length);
        line += length + (end != NULL);
    }
    free(text);
    if (code == COMMAND_OK && server->keys_count == before)
        code = command_fail("--api-key-file %s holds no key", server->flags.api_key_file);
    return code;
}

static void keys_free(serve_t *server) {
    for (size_t k = 0; k < server->keys_count; ++k) {
        /* The key's bytes do not outlive the server in freed memory. */
        memset(server->keys[k], 0, server->key_lengths[k]);
        free(server->keys[k]);
    }
    free(server->keys);
    free(server->key_lengths);
}

/* The PEM files of --tls-cert and --tls-key, where this libmicrohttpd has TLS. */
static int tls_load(serve_t *server) {
    if (!server->flags.tls_cert) return COMMAND_OK;
    if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES)
        return command_fail("--tls-cert: this libmicrohttpd was built without TLS (GnuTLS)");
    int code = read_text("--tls-cert", server->flags.tls_cert, &server->tls_cert);
    if (code == COMMAND_OK) code = read_text("--tls-key", server->flags.tls_key, &server->tls_key);
    return code;
}

/* Whether the address is a loopback one (127.0.0.0/8, ::1), which only this machine reaches. */
static bool address_loopback(struct sockaddr const *address) {
    if (address->sa_family == AF_INET)
        return (ntohl(((struct sockaddr_in const *)(void const *)address)->sin_addr.s_addr) >> 24) == 127;
    if (address->sa_family == AF_INET6) {
        struct in6_addr const *six = &((struct sockaddr_in6 const *)(void const *)address)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(six)) return six->s6_addr[12] == 127;
        return IN6_IS_ADDR_LOOPBACK(six);
    }
    return false;
}

static int serve_listen(serve_t *server, struct addrinfo **address) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    char port[16];
    snprintf(port, sizeof port, "%u", server->flags.port);
    int found = getaddrinfo(server->flags.host, port, &hints, address);
    if (found != 0)
        return command_fail("cannot resolve --host %s: %s", server->flags.host, gai_strerror(found));
    server->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    if (server->epoll_fd < 0) return command_fail("cannot create an epoll descriptor: %s", strerror(errno));
    server->watched = calloc(FD_SETSIZE, sizeof *server->watched);
    if (!server->watched) return command_fail("out of memory for the server's sockets");
    server->watched_top = -1;
    /* No polling flag: external select mode, whose descriptors watch_sync mirrors. */
    unsigned flags = MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if ((*address)->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    if (server->tls_cert) flags |= MHD_USE_TLS;
    struct MHD_OptionItem tls[] = {
        {server->tls_cert ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END, 0, server->tls_cert},
        {MHD_OPTION_HTTPS_MEM_KEY, 0, server->tls_key},
        {MHD_OPTION_END, 0, NULL},
    };
    errno = 0;
    server->daemon = MHD_start_daemon(
        flags, (uint16_t)server->flags.port, NULL, NULL, serve_access, server, MHD_OPTION_EXTERNAL_LOGGER,
        serve_log, server, MHD_OPTION_NOTIFY_COMPLETED, serve_completed, server, MHD_OPTION_NOTIFY_CONNECTION,
        serve_connection_notify, server, MHD_OPTION_CONNECTION_TIMEOUT, server->flags.timeout_s,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, server->flags.ip_connections, MHD_OPTION_SOCK_ADDR,
        (*address)->ai_addr, MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u, MHD_OPTION_ARRAY, tls, MHD_OPTION_END);
    if (!server->daemon && server->tls_cert)
        return command_fail(
            "cannot listen on %s port %u with --tls-cert %s and --tls-key %s: %s (each must be "
            "PEM, the key unencrypted and the certificate's)",
            server->flags.host, server->flags.port, server->flags.tls_cert, server->flags.tls_key,
            errno ? strerror(errno) : "libmicrohttpd refused them");
    if (!server->daemon)
        return command_fail("cannot listen on %s port %u: %s", server->flags.host, server->flags.port,
                            errno ? strerror(errno) : "libmicrohttpd refused");
    union MHD_DaemonInfo const *bound = MHD_get_daemon_info(server->daemon, MHD_DAEMON_INFO_BIND_PORT);
    if (!bound) return command_fail("libmicrohttpd gives no port");
    server->flags.port = bound->port;
    bool six = (*address)->ai_family == AF_INET6;
    printf("uform serve: listening on %s://%s%s%s:%u (model%s ", server->tls_cert ? "https" : "http",
           six ? "[" : "", server->flags.host, six ? "]" : "", server->flags.port,
           server->models_count > 1 ? "s" : "");
    for (size_t i = 0; i < server->models_count; ++i)
        printf("%s%s", i ? ", " : "", server->models[i].name);
    printf(")\n");
    fflush(stdout);
    if (!server->keys_count && !address_loopback((*address)->ai_addr))
        fprintf(stderr,
                "uform serve: listening on %s without an API key: anyone who reaches the port may use it "
                "(--api-key)\n",
                server->flags.host);
    return COMMAND_OK;
}

/* The name a model given without NAME= takes: --name where it is the only model, else the hub id it was
 * given by (where no file or folder of that name exists), else its file or folder name without
 * .safetensors. */
static char *model_default_name(serve_t const *server, char const *path) {
    if (server->flags.name && server->flags.models.count <= 1) return strdup(server->flags.name);
    char folder[4096];
    if (command_hub_folder(path, folder, sizeof folder)) return strdup(path);
    size_t length = strlen(path);
    while (length > 1 && path[length - 1] == '/') /* a folder given as "minilm/" */
        --length;
    char *trimmed = strndup(path, length);
    char *name = trimmed ? default_name(trimmed) : NULL;
    free(trimmed);
    return name;
}

/* Splits one --model value into its name (NULL: none given) and its path: NAME=PATH where the text
 * before the first '=' is not empty and holds no '/'. */
static void model_value_split(char const *value, char **name, char const **path) {
    char const *equals = strchr(value, '=');
    char const *slash = strchr(value, '/');
    bool named = equals && equals > value && (!slash || slash > equals);
    *name = named ? strndup(value, (size_t)(equals - value)) : NULL;
    *path = named ? equals + 1 : value;
}

/* Loads the model of one --model value (NULL: the default model) onto the executor. */
static int model_load(serve_t *server, char const *value) {
    char buffer[4096];
    char const *path = NULL;
    char *name = NULL;
    if (value) model_value_split(value, &name, &path);
    int code = command_model_path(value ? path : NULL, buffer, sizeof buffer, &path);
    if (code != COMMAND_OK) {
        free(name);
        return code;
    }
    serve_model_t *model = &server->models[server->models_count++];
    model->name = name ? name : model_default_name(server, path);
    if (!model->name) return command_fail("out of memory");
    for (size_t i = 0; i + 1 < server->models_count; ++i)
        if (!strcmp(server->models[i].name, model->name))
            return command_usage(
                help.name, "two models are named '%s': name them apart with --model NAME=PATH", model->name);
    json_t *quoted = json_string(model->name);
    model->name_json = quoted ? json_dumps(quoted, JSON_ENCODE_ANY) : NULL;
    json_decref(quoted);
    if (!model->name_json) return command_fail("the model name '%s' must be UTF-8 text", model->name);
    uform_load_config_t config = {.weights = (uform_weights_t)server->flags.weights};
    uform_model_load_args_t load = {
        .executor = server->executor, .path = path, .config = &config, .model = &model->model};
    if (uform_model_load_ram(&load) != UFORM_OK) return command_fail_engine();
    if (uform_model_info(model->model, &model->info) != UFORM_OK) return command_fail_engine();
    if (!model->info.has_text) return command_fail("%s has no text tower: uform serve needs one", path);
    if (uform_model_tokenizer(model->model, &model->tokenizer) != UFORM_OK) model->tokenizer = NULL;
    model->created = (long long)time(NULL);
    return COMMAND_OK;
}

static int serve_run(serve_t *server, sigset_t const *signals) {
    struct addrinfo *address = NULL;
    int code = COMMAND_OK;
    if (server->flags.name && server->flags.models.count > 1)
        return command_usage(help.name, "--name names the one model served: with several, give each as "
                                        "--model NAME=PATH");
    if (server->flags.name && server->flags.models.count == 1) {
        char *named = NULL;
        char const *path = NULL;
        model_value_split(server->flags.models.values[0], &named, &path);
        bool twice = named != NULL;
        free(named);
        if (twice) return command_usage(help.name, "--name and --model NAME=PATH both name the model: give one");
    }

    if ((code = keys_load(server)) != COMMAND_OK || (code = tls_load(server)) != COMMAND_OK) return code;
    server->signal_fd = signalfd(-1, signals, SFD_NONBLOCK | SFD_CLOEXEC);
    if (server->signal_fd < 0) return command_fail("cannot create a signalfd: %s", strerror(errno));
    uform_ram_options_t options = uform_ram_options_default();
    options.threads = server->flags.threads;
    if (uform_executor_create_ram(&options, &server->executor) != UFORM_OK) return command_fail_engine();
    size_t given = server->flags.models.count;
    for (size_t i = 0; i < (given ? given : 1) && code == COMMAND_OK; ++i)
        code = model_load(server, given ? server->flags.models.values[i] : NULL);
    if (code != COMMAND_OK) return code;
    if (uform_arena_create_host(&server->tokenize_arena) != UFORM_OK) return command_fail_engine();

    loop_options_t loop_options = {.backend = LOOP_BACKEND_AUTO, .single_issuer = true, .entries = 0};
    int created = loop_create(&loop_options, &server->loop);
    if (created < 0) return command_fail("cannot create the server's event loop: %s", strerror(-created));
    if ((code = batch_open(server)) != COMMAND_OK) return code;
    code = serve_listen(server, &address);
    if (address) freeaddrinfo(address);
    if (code != COMMAND_OK) return code;

    server->pump.callback = pump_done;
    server->http_watch.callback = http_watch_done;
    server->signal_watch.callback = signal_watch_done;
    serve_timer_t *timers[] = {&server->http_timer, &server->batch_timer, &server->drain_timer};
    void (*fires[])(serve_t *) = {http_timer_fire, batch_kick, drain_timer_fire};
    for (size_t i = 0; i < 3; ++i)
        *timers[i] = (serve_timer_t){.op.callback = timer_done, .server = server, .fire = fires[i]};
    loop_poll(server->loop, &server->http_watch, server->epoll_fd, POLLIN);
    server->http_armed = true;
    loop_poll(server->loop, &server->signal_watch, server->signal_fd, POLLIN);
    server->signal_armed = true;
    serve_pump(server);

    while (!server->stopping || loop_in_flight(server->loop) > 0 || server->pump_posted)
        loop_run(server->loop, true, 0);
    return COMMAND_OK;
}

int command_serve(int argc, char **argv) {
    serve_t server = {
        .flags = {.host = "127.0.0.1",
                  .port = 8080,
                  .batch_bytes = 262144,
                  .queue = 1024,
                  .body_limit = 16u << 20,
                  .timeout_s = 60,
                  .ip_connections = 128},
        .epoll_fd = -1,
        .encoded_fd = -1,
        .signal_fd = -1,
    };
    int code = parse_flags(argc, argv, &server.flags);
    if (code != COMMAND_OK || server.flags.help) return code;

    /* Blocked before any thread starts, so that every thread inherits the mask and the signals reach
     * only the signalfd. Peers that go away must not kill the process. */
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGTERM);
    sigaddset(&signals, SIGINT);
    if (pthread_sigmask(SIG_BLOCK, &signals, NULL) != 0)
        return command_fail("cannot block SIGTERM and SIGINT");
    signal(SIGPIPE, SIG_IGN);

    code = serve_run(&server, &signals);

    /* After a failure too, every watch ends before the loop goes (a success has ended them already). */
    if (server.loop) {
        serve_stop(&server);
        while (loop_in_flight(server.loop) > 0 || server.pump_posted)
            loop_run(server.loop, true, 0);
    }
    if (server.daemon) MHD_stop_daemon(server.daemon);
    serve_log_unprinted(&server);
    batch_close(&server);
    loop_destroy(server.loop);
    if (server.signal_fd >= 0) (void)close(server.signal_fd);
    if (server.epoll_fd >= 0) (void)close(server.epoll_fd);
    free(server.watched);
    keys_free(&server);
    free(server.tls_cert);
    free(server.tls_key);
    uform_arena_free(server.tokenize_arena);
    for (size_t i = 0; i < server.models_count; ++i) {
        uform_model_free(server.models[i].model);
        free(server.models[i].name);
        free(server.models[i].name_json);
    }
    uform_executor_free(server.executor);
    return code;
}
