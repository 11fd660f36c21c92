/* uform serve: what its files share.
 *
 * One thread runs all of it: the loop (loop/loop.h), libmicrohttpd's callbacks, the batcher and the
 * serializer. libmicrohttpd runs without threads of its own, in its external select mode: after each
 * MHD_run the descriptors it wants read or written (MHD_get_fdset2) are mirrored into the server's own
 * level-triggered epoll set, whose descriptor is polled on the loop, and MHD_run is called again when it
 * is readable or when libmicrohttpd's timeout is due. Level-triggered, every readable socket is read
 * until libmicrohttpd has taken what it holds, a peer's FIN included, so a connection its client closed
 * is closed at once instead of waiting for --timeout (libmicrohttpd's own edge-triggered epoll mode
 * misses a FIN that arrives with a request's last bytes). Select's sets bound the descriptors to
 * FD_SETSIZE (1024): libmicrohttpd holds at most about 1,000 connections at once and closes one whose
 * descriptor would be past them as it comes; --ip-connections bounds those of one address. A request for
 * embeddings is parsed when its body is complete, queued, and its connection suspended; the batcher gathers
 * the queued inputs of one model and modality into one deferred call on the RAM executor (uform_text_encode,
 * or uform_image_encode, uform_audio_encode, uform_video_encode from memory), whose outcome notifies an
 * eventfd polled on the loop; a request is answered, and its connection resumed, once every one of its
 * inputs is encoded. The server holds one or more models (--model, repeated), all on that executor; a
 * request's "model" picks one, the first given by default. A request to POST /tokenize is answered when
 * its body is complete, its texts cut on the loop thread.
 *
 *   uform_serve.c          flags, the loop, libmicrohttpd, the route table, signals and shutdown
 *   uform_serve_api.c      the OpenAI-compatible bodies: requests parsed, answers and errors written
 *   uform_serve_tokenize.c POST /tokenize: texts cut by a model's tokenizer, as text-embeddings-inference
 *   uform_serve_batch.c    the queue, the batches and the executor
 *   uform_serve_metrics.c  counters and histograms, rendered for Prometheus */
#ifndef UFORM_SERVE_H
#define UFORM_SERVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <microhttpd.h>

#include "loop.h"
#include "uform_command.h"

/* OpenAI's own bound on the items of one request; the modalities, indexed by uform_modality_t; the
 * models one server holds at most (--model, repeated). */
enum { SERVE_MAX_ITEMS = 2048, SERVE_MODALITIES = 4, SERVE_MODELS_MAX = 16 };

#define SERVE_CONTAINER_OF(pointer, type, member) ((type *)(void *)((char *)(pointer)-offsetof(type, member)))

typedef struct serve serve_t;
typedef struct serve_request serve_request_t;
typedef struct serve_part serve_part_t;

/* ---- text: a growable byte buffer for bodies (uform_serve_api.c) ------------------------------ */

/* A failed allocation sets `failed` and makes every later append a no-op, so a body is built without
 * checks at each step and checked once. */
typedef struct serve_text {
    char *data;
    size_t length, capacity;
    bool failed;
} serve_text_t;

void text_append(serve_text_t *text, char const *bytes, size_t length);
void text_puts(serve_text_t *text, char const *string);
__attribute__((format(printf, 2, 3))) void text_printf(serve_text_t *text, char const *format, ...);
void text_free(serve_text_t *text);

/* ---- metrics (uform_serve_metrics.c) ---------------------------------------------------------- */

typedef enum serve_route {
    ROUTE_EMBEDDINGS = 0,
    ROUTE_TOKENIZE,
    ROUTE_MODELS,
    ROUTE_HEALTH,
    ROUTE_READY,
    ROUTE_METRICS,
    ROUTE_OPENAPI,
    ROUTE_OTHER,
    ROUTE_COUNT,
} serve_route_t;

/* Stages timed per request (queue, serialize, request) or per batch (decode, compute, encode). */
typedef enum serve_stage {
    STAGE_QUEUE = 0, /* queued until its batch was submitted */
    STAGE_DECODE,    /* the engine's read and decode time of a batch (media; 0 for texts) */
    STAGE_COMPUTE,   /* the engine's compute time of a batch (uform_encode_stats_t) */
    STAGE_ENCODE,    /* a batch from submission to its outcome's notification */
    STAGE_SERIALIZE, /* one answer written */
    STAGE_REQUEST,   /* one embeddings request from its headers to its answer */
    STAGE_COUNT,
} serve_stage_t;

enum { METRICS_BUCKETS = 20, METRICS_STATUSES = 24 };

typedef struct serve_histogram {
    uint64_t buckets[METRICS_BUCKETS]; /* not cumulative; the last one is +Inf */
    uint64_t count;
    uint64_t sum_ns;
} serve_histogram_t;

typedef struct serve_metrics {
    struct {
        unsigned status;
        uint64_t counts[ROUTE_COUNT];
    } statuses[METRICS_STATUSES];
    size_t statuses_count;
    serve_histogram_t stages[STAGE_COUNT];
    serve_histogram_t batch_requests; /* requests per batch, buckets by count */
    uint64_t batches, items, bytes, tokens, truncated, rejected_full;
    uint64_t abandoned; /* queued requests whose client closed before their batch: dropped */
    uint64_t modality_batches[SERVE_MODALITIES], modality_items[SERVE_MODALITIES];
} serve_metrics_t;

void metrics_count(serve_metrics_t *metrics, serve_route_t route, unsigned status);
void metrics_observe(serve_metrics_t *metrics, serve_stage_t stage, uint64_t nanoseconds);
void metrics_observe_batch(serve_metrics_t *metrics, size_t requests);
/* The Prometheus text exposition format, version 0.0.4. */
void metrics_render(serve_t const *server, serve_text_t *text);

/* ---- the server (uform_serve.c) ---------------------------------------------------------------- */

typedef struct serve_flags {
    char const *model_values[SERVE_MODELS_MAX];
    command_strings_t models; /* --model [NAME=]PATH, in order, over `model_values` */
    char const *name, *host;
    size_t threads;
    int weights; /* a uform_weights_t */
    unsigned port;
    size_t batch_bytes;
    uint64_t batch_delay_us;
    size_t queue;
    size_t body_limit;
    unsigned timeout_s;
    unsigned ip_connections;
    char const *api_key, *api_key_file;
    char const *tls_cert, *tls_key;
    bool help;
} serve_flags_t;

/* One served model: the first given answers requests that name none. */
typedef struct serve_model {
    char *name;      /* in requests and in /v1/models */
    char *name_json; /* the same as a JSON string, quoted and escaped */
    uform_model_t *model;
    uform_model_info_t info;
    uform_tokenizer_t const *tokenizer; /* lent by `model` where it reads tokens; NULL where it reads bytes */
    long long created;                  /* when it was loaded, Unix seconds, for /v1/models */
} serve_model_t;

/* One input of a request, inside the request's parsed JSON: a text's bytes, or a media item's base64
 * characters (what follows the data URL's comma). */
typedef struct serve_input {
    uform_modality_t modality;
    char const *bytes;
    size_t length; /* of `bytes` */
    size_t budget; /* what it counts against --batch-bytes: a text's bytes up to the context, or the
                      media's decoded bytes */
    size_t taped;  /* what it takes on a batch's tape: the whole text, or the decoded media */
    bool truncated; /* a text longer than the model's context (bytes, or tokens with its tokenizer) */
} serve_input_t;

/* The inputs of one modality of a request. A request has a part for each modality it holds; each part
 * waits in the queue and goes whole into one batch of its modality. */
struct serve_part {
    serve_request_t *request;
    serve_part_t *next; /* links the queue, then the batch */
    uform_modality_t modality;
    size_t count;     /* inputs */
    size_t budget;    /* the sum of its inputs' */
    size_t taped;     /* the sum of its inputs' */
    size_t first_row; /* of its first input in the batch's embeddings */
};

struct serve_request {
    serve_t *server;
    struct MHD_Connection *connection;
    serve_route_t route;
    serve_model_t *model; /* the model its body names, once parsed */
    uint64_t started_ns, queued_ns;
    /* The body, gathered until complete; `oversize` discards the rest of one past the limit. */
    char *body;
    size_t body_length, body_capacity;
    bool oversize;
    /* The parsed request (uform_serve_api.c); `json` keeps the inputs' bytes alive. */
    json_t *json;
    serve_input_t *inputs;
    size_t count;
    size_t bytes;      /* texts: bytes the model reads (each up to the context); media: decoded bytes */
    size_t tokens;     /* usage: the texts' bytes read plus one BOS per text; media count none */
    size_t truncated;  /* texts longer than the context */
    size_t dimensions; /* the matryoshka width asked; 0 for the model's full width */
    size_t width;      /* the width answered: `dimensions`, or the model's */
    bool base64;
    /* Queued, then batched part by part: each finished part's rows are copied into `vectors` (count x
     * width F32), and the request is answered once no part is pending. The first failure sets the
     * request's error answer and `failed`; its parts still queued are then dropped. */
    serve_part_t parts[SERVE_MODALITIES];
    size_t parts_queued, parts_pending;
    float *vectors;
    bool failed;
    bool settled; /* answered by the batcher: its connection resumed */
    bool suspended;
    bool answered;  /* its answer is queued: later calls only drain what the client still sends */
    bool abandoned; /* its client closed while it was queued: its connection is dropped unanswered */
    /* The answer, queued on the connection when the access handler next runs. */
    unsigned status;
    struct MHD_Response *response;
};

/* A deadline on the loop: armed once, shortened by cancelling and re-arming. */
typedef struct serve_timer {
    loop_op_t op;
    serve_t *server;
    void (*fire)(serve_t *server);
    uint64_t deadline_ns;
    bool armed, cancelling;
} serve_timer_t;

/* One engine call of one modality and width: its outcome, its arena and its tape. Two alternate, so
 * that the next batch computes in one while the rows of the last are read from the other's views. */
typedef struct serve_batch {
    serve_model_t *model;
    uform_modality_t modality;
    uform_outcome_t outcome;
    uform_arena_t *arena;
    uform_encode_stats_t stats;
    uform_encode_config_t config;
    char *bytes;
    size_t bytes_capacity, length;
    size_t *offsets;
    size_t offsets_capacity, items;
    serve_part_t *parts; /* in row order, through next */
    size_t parts_count;
    uint64_t submitted_ns;
} serve_batch_t;

struct serve {
    serve_flags_t flags;
    loop_t *loop;
    struct MHD_Daemon *daemon;
    uform_executor_t *executor; /* every model's, loaded onto it; one batch runs on it at a time */
    serve_model_t models[SERVE_MODELS_MAX];
    size_t models_count;
    uform_arena_t *tokenize_arena; /* POST /tokenize's cuts, on the loop thread */

    /* Parts waiting for the executor, oldest first; `queued` counts the requests they belong to, and
     * `queued_bytes` their budgets. */
    serve_part_t *queue_head, *queue_tail;
    size_t queued, queued_bytes;
    serve_batch_t batches[2];
    serve_batch_t *encoding; /* the batch the executor runs; NULL when idle */
    size_t next_batch;       /* which of `batches` the next call uses */

    /* The keys a request must carry as `Authorization: Bearer KEY` on every route but /health; none
     * when `keys_count` is 0. */
    char **keys;
    size_t *key_lengths;
    size_t keys_count;
    /* The PEM certificate and key, read whole, for libmicrohttpd's TLS. */
    char *tls_cert, *tls_key;

    /* What the loop watches. `epoll_fd` mirrors libmicrohttpd's sockets: `watched[fd]` is what the set
     * holds for each descriptor below FD_SETSIZE (EPOLLIN, EPOLLOUT), `watched_top` the highest held. */
    int epoll_fd, encoded_fd, signal_fd;
    uint32_t *watched;
    int watched_top;
    loop_op_t http_watch, encoded_watch, signal_watch, pump;
    bool http_armed, encoded_armed, signal_armed, pump_posted;
    serve_timer_t http_timer, batch_timer, drain_timer;

    size_t requests; /* in flight: from their headers until libmicrohttpd is done with them */
    bool draining;   /* a signal came: no new connections, the rest answered */
    bool forced;     /* the drain's deadline passed, or a second signal came */
    bool finishing;  /* forced: the queue was refused; the next pump sends what it can and stops */
    bool stopping;   /* everything answered: the watches are being ended */
    serve_metrics_t metrics;

    /* libmicrohttpd's messages: printed in the second from `log_window_ns`, and not printed since. */
    uint64_t log_window_ns;
    size_t log_printed, log_unprinted;
};

/* Arms `timer` to fire by `deadline_ns` (an earlier one than armed cancels and re-arms). */
void serve_timer_want(serve_t *server, serve_timer_t *timer, uint64_t deadline_ns);

/* Resumes a request's suspended connection once its answer is ready, and lets libmicrohttpd run. */
void serve_request_resume(serve_request_t *request);

/* After any change that may end a drain: stops the server once nothing is left to answer. */
void serve_drain_check(serve_t *server);

/* ---- the API (uform_serve_api.c) --------------------------------------------------------------- */

/* Parses a complete POST /v1/embeddings body into the request's model, inputs and options, media items
 * checked (their base64 validated, their tower and decoder present) but not decoded. Answers true, or
 * false after setting the request's error answer (400, 404, 500). */
bool api_parse_embeddings(serve_t *server, serve_request_t *request);
/* The tokens each text input of an embeddings request is read as by its model, which has a tokenizer (the
 * model's default prompt and the text, stripped as the model strips texts, cut whole with the special
 * tokens): into counts[request->count] (media: 0). false, the request answered, where it cannot. */
bool api_count_tokens(serve_t *server, serve_request_t *request, size_t *counts);

/* The model a body's "model" names: where absent or null, the first served. Answers NULL after setting
 * the request's error: 400 for a model that is not a string, 404 model_not_found for a name not served. */
serve_model_t *api_parse_model(serve_t *server, serve_request_t *request, json_t *root);
/* A request's body parsed (request->json, the body's bytes freed) as a JSON object, and the model it names
 * in request->model: the object, or NULL with the request answered (400, or 404 for an unknown model). */
json_t *api_parse_body(serve_t *server, serve_request_t *request);

/* ---- POST /tokenize (uform_serve_tokenize.c) --------------------------------------------------- */

/* What a /tokenize body asks besides its model and inputs. */
typedef struct serve_tokenize {
    bool add_special_tokens; /* default true */
    char const *prompt_name; /* inside the request's JSON; NULL: the model's default prompt */
} serve_tokenize_t;

/* Parses a complete POST /tokenize body into the request's model and inputs (texts, none empty, at most
 * SERVE_MAX_ITEMS) and `options`. Answers true, or false after setting the request's error answer: 400
 * (a malformed body; a model that reads bytes: tokenizer_unavailable), 404 (a model not served), 500. */
bool api_parse_tokenize(serve_t *server, serve_request_t *request, serve_tokenize_t *options);

/* Sets the request's answer to its inputs' tokens, each input cut after `prompt` by its model's tokenizer,
 * whole, on the calling thread, in the server's tokenize arena: one list per input of {"id", "text",
 * "special", "start", "stop"}, as Hugging Face's text-embeddings-inference answers; or its error (413
 * inputs_too_large past --batch-bytes bytes with the prompts, 400 for a text that cannot be cut, 500). */
void api_answer_tokenize(serve_t *server, serve_request_t *request, serve_tokenize_t const *options,
                         char const *prompt);

/* POST /tokenize whole: the body parsed, the prompt looked up (400 for a prompt_name the model lacks), the
 * answer set. */
void api_tokenize(serve_t *server, serve_request_t *request);

/* Decodes standard base64 (RFC 4648, section 4), strictly: no whitespace nor any character outside the
 * alphabet; the '=' padding may be left out, but where present it completes the last group and ends the
 * text; the bits a short last group leaves over are ignored. Writes
 * the bytes to `out` (room for the length a first call with `out` NULL answered) unless NULL. Answers
 * the decoded length, or SIZE_MAX for malformed text, with `*bad` the offset of the fault. */
size_t api_base64_decode(char const *text, size_t length, unsigned char *out, size_t *bad);

/* Sets the request's answer to an error in OpenAI's shape, {"error": {"message", "type", "param",
 * "code"}}; `param` and `code` may be NULL (JSON null). */
__attribute__((format(printf, 6, 7))) void api_error(serve_request_t *request, unsigned status,
                                                     char const *type, char const *param, char const *code,
                                                     char const *format, ...);

/* Sets the request's answer to its embeddings, from its `vectors`. */
void api_answer_embeddings(serve_t *server, serve_request_t *request);

/* Sets the request's answer to `text` (taken: freed by libmicrohttpd) as `content_type`. */
void api_answer_text(serve_request_t *request, unsigned status, serve_text_t *text, char const *content_type);

/* The bodies of GET /v1/models (every model, in the order given) and GET /v1/models/{name}. */
void api_answer_models(serve_t *server, serve_request_t *request, char const *name);

/* The body of GET /openapi.json: the OpenAPI 3.0 document of every route, with the models' widths as
 * the values "dimensions" takes (uform_serve_openapi.c). */
void api_answer_openapi(serve_t const *server, serve_request_t *request);

/* ---- the batcher (uform_serve_batch.c) --------------------------------------------------------- */

/* Prepares the arenas and the eventfd the outcomes notify. Answers an exit code. */
int batch_open(serve_t *server);
void batch_close(serve_t *server);

/* Queues a parsed request's parts; false when the queue is full. */
bool batch_enqueue(serve_t *server, serve_request_t *request);

/* Starts the next engine call when the executor is idle and the queue's head has waited its delay, or
 * the queue holds a batch's worth of bytes, or the server drains; else arms the batch timer. */
void batch_kick(serve_t *server);

/* The eventfd's poll: a finished call's rows are copied into their requests, the next call started, and
 * the requests with nothing left pending answered. */
void batch_encoded(serve_t *server);

/* Answers every queued request with `status` (a forced shutdown, with no call in flight). */
void batch_refuse_queued(serve_t *server, unsigned status, char const *message);

#endif /* UFORM_SERVE_H */
