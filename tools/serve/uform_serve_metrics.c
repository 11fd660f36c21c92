/* The metrics of `uform serve`, kept by the loop thread alone (no atomics) and rendered for Prometheus
 * at GET /metrics: answers by route and status, histograms of each stage's seconds, batch sizes, and
 * the queue's state. */
#include <stdio.h>
#include <string.h>

#include "uform_serve.h"

static char const *const route_names[ROUTE_COUNT] = {"embeddings", "tokenize", "models",  "health",
                                                     "ready",      "metrics",  "openapi", "other"};
static char const *const stage_names[STAGE_COUNT] = {"queue",  "decode",    "compute",
                                                     "encode", "serialize", "request"};

/* Upper bounds of the seconds buckets, in nanoseconds: 10 us to 10 s, then +Inf. */
static uint64_t const seconds_bounds[METRICS_BUCKETS - 1] = {
    10000,     25000,      50000,      100000,     250000,      500000,    1000000,
    2500000,   5000000,    10000000,   25000000,   50000000,    100000000, 250000000,
    500000000, 1000000000, 2500000000, 5000000000, 10000000000,
};

/* Upper bounds of the requests-per-batch buckets: 1, 2, 4, ... 2^18, then +Inf. */
static uint64_t count_bound(size_t bucket) {
    return (uint64_t)1 << bucket;
}

void metrics_count(serve_metrics_t *metrics, serve_route_t route, unsigned status) {
    size_t i = 0;
    while (i < metrics->statuses_count && metrics->statuses[i].status != status)
        ++i;
    if (i == metrics->statuses_count) {
        if (i == METRICS_STATUSES) return; /* more distinct statuses than any route answers */
        metrics->statuses[i].status = status;
        metrics->statuses_count++;
    }
    metrics->statuses[i].counts[route]++;
}

static void histogram_add(serve_histogram_t *histogram, size_t bucket, uint64_t value) {
    histogram->buckets[bucket]++;
    histogram->count++;
    histogram->sum_ns += value;
}

void metrics_observe(serve_metrics_t *metrics, serve_stage_t stage, uint64_t nanoseconds) {
    size_t bucket = 0;
    while (bucket < METRICS_BUCKETS - 1 && nanoseconds > seconds_bounds[bucket])
        ++bucket;
    histogram_add(&metrics->stages[stage], bucket, nanoseconds);
}

void metrics_observe_batch(serve_metrics_t *metrics, size_t requests) {
    size_t bucket = 0;
    while (bucket < METRICS_BUCKETS - 1 && requests > count_bound(bucket))
        ++bucket;
    histogram_add(&metrics->batch_requests, bucket, requests);
}

/* A label value: backslash, double quote and line feed escaped. */
static void text_label(serve_text_t *text, char const *value) {
    for (char const *c = value; *c; ++c) {
        if (*c == '\\' || *c == '"')
            text_printf(text, "\\%c", *c);
        else if (*c == '\n')
            text_puts(text, "\\n");
        else
            text_append(text, c, 1);
    }
}

static void render_header(serve_text_t *text, char const *name, char const *type, char const *help) {
    text_printf(text, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void render_stage(serve_text_t *text, serve_histogram_t const *histogram, char const *stage) {
    uint64_t cumulative = 0;
    for (size_t bucket = 0; bucket < METRICS_BUCKETS; ++bucket) {
        cumulative += histogram->buckets[bucket];
        text_printf(text, "uform_stage_seconds_bucket{stage=\"%s\",le=\"", stage);
        if (bucket < METRICS_BUCKETS - 1)
            text_printf(text, "%g", (double)seconds_bounds[bucket] * 1e-9);
        else
            text_puts(text, "+Inf");
        text_printf(text, "\"} %llu\n", (unsigned long long)cumulative);
    }
    text_printf(text, "uform_stage_seconds_sum{stage=\"%s\"} %.9f\n", stage,
                (double)histogram->sum_ns * 1e-9);
    text_printf(text, "uform_stage_seconds_count{stage=\"%s\"} %llu\n", stage,
                (unsigned long long)histogram->count);
}

static void render_counter(serve_text_t *text, char const *name, char const *help, uint64_t value) {
    render_header(text, name, "counter", help);
    text_printf(text, "%s %llu\n", name, (unsigned long long)value);
}

static void render_gauge(serve_text_t *text, char const *name, char const *help, uint64_t value) {
    render_header(text, name, "gauge", help);
    text_printf(text, "%s %llu\n", name, (unsigned long long)value);
}

void metrics_render(serve_t const *server, serve_text_t *text) {
    serve_metrics_t const *metrics = &server->metrics;

    render_header(text, "uform_requests_total", "counter", "HTTP requests answered, by route and status.");
    for (size_t i = 0; i < metrics->statuses_count; ++i)
        for (size_t route = 0; route < ROUTE_COUNT; ++route)
            if (metrics->statuses[i].counts[route])
                text_printf(text, "uform_requests_total{route=\"%s\",status=\"%u\"} %llu\n",
                            route_names[route], metrics->statuses[i].status,
                            (unsigned long long)metrics->statuses[i].counts[route]);

    render_header(
        text, "uform_stage_seconds", "histogram",
        "Seconds per stage: queue (per request, until its last batch is submitted), decode (per media "
        "batch) and compute (per batch), the engine's own figures, encode (per batch, submission to "
        "notification), serialize (per answer), request (per embeddings request, headers to answer).");
    for (size_t stage = 0; stage < STAGE_COUNT; ++stage)
        render_stage(text, &metrics->stages[stage], stage_names[stage]);

    render_header(text, "uform_batch_requests", "histogram", "Requests gathered into one engine call.");
    uint64_t cumulative = 0;
    for (size_t bucket = 0; bucket < METRICS_BUCKETS; ++bucket) {
        cumulative += metrics->batch_requests.buckets[bucket];
        if (bucket < METRICS_BUCKETS - 1)
            text_printf(text, "uform_batch_requests_bucket{le=\"%llu\"} %llu\n",
                        (unsigned long long)count_bound(bucket), (unsigned long long)cumulative);
        else
            text_printf(text, "uform_batch_requests_bucket{le=\"+Inf\"} %llu\n",
                        (unsigned long long)cumulative);
    }
    text_printf(text, "uform_batch_requests_sum %llu\nuform_batch_requests_count %llu\n",
                (unsigned long long)metrics->batch_requests.sum_ns,
                (unsigned long long)metrics->batch_requests.count);

    render_counter(text, "uform_batches_total", "Engine calls finished.", metrics->batches);
    render_counter(text, "uform_inputs_total", "Inputs encoded.", metrics->items);
    render_header(text, "uform_modality_batches_total", "counter", "Engine calls finished, by modality.");
    for (size_t modality = 0; modality < SERVE_MODALITIES; ++modality)
        text_printf(text, "uform_modality_batches_total{modality=\"%s\"} %llu\n",
                    command_modality_names[modality],
                    (unsigned long long)metrics->modality_batches[modality]);
    render_header(text, "uform_modality_inputs_total", "counter", "Inputs encoded, by modality.");
    for (size_t modality = 0; modality < SERVE_MODALITIES; ++modality)
        text_printf(text, "uform_modality_inputs_total{modality=\"%s\"} %llu\n",
                    command_modality_names[modality], (unsigned long long)metrics->modality_items[modality]);
    render_counter(text, "uform_input_bytes_total",
                   "Input bytes of answered requests: text bytes the model read (each up to its context), "
                   "media bytes decoded from base64.",
                   metrics->bytes);
    render_counter(text, "uform_input_tokens_total",
                   "Tokens billed in usage: a tokenized model's tokens, else text bytes read plus one per text.", metrics->tokens);
    render_counter(text, "uform_truncated_inputs_total",
                   "Inputs cut: texts longer than the context, sounds longer than the model reads.",
                   metrics->truncated);
    render_counter(text, "uform_queue_full_total", "Requests answered 429 because the queue was full.",
                   metrics->rejected_full);
    render_counter(text, "uform_requests_abandoned_total",
                   "Queued requests whose client closed its connection before their batch: dropped "
                   "without being encoded.",
                   metrics->abandoned);
    render_gauge(text, "uform_queue_requests", "Requests waiting for the executor.", server->queued);
    render_gauge(text, "uform_queue_bytes",
                 "Input bytes waiting for the executor, as --batch-bytes counts them.", server->queued_bytes);
    render_gauge(text, "uform_requests_in_flight", "Requests received and not yet finished.",
                 server->requests);
    render_gauge(text, "uform_encoding", "1 while the executor runs a batch.", server->encoding != NULL);
    render_gauge(text, "uform_ready", "1 while new requests are taken, 0 while shutting down.",
                 !server->draining);

    render_header(text, "uform_model_info", "gauge",
                  "The served models: each one's name, width and context.");
    for (size_t i = 0; i < server->models_count; ++i) {
        serve_model_t const *model = &server->models[i];
        text_puts(text, "uform_model_info{name=\"");
        text_label(text, model->name);
        text_printf(text, "\",dims=\"%zu\",context=\"%zu\"} 1\n", model->info.dims, model->info.text.context);
    }
}
