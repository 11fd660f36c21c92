/* uform eval: text-to-media retrieval over a JSONL manifest. Every item is embedded with its modality's
 * verb; for each media modality present, each text related to some item of that modality queries all
 * items of it, ranked by the dot product of unit embeddings, and recall@1 and recall@5 count the
 * queries whose first or first five candidates hold one sharing a group with the text. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "uform_manifest.h"

static char const help_head[] =
    "usage: uform eval --model CHECKPOINT --data MANIFEST [options]\n"
    "\n"
    "Measures text-to-media retrieval on MANIFEST, a JSON Lines file as 'uform dataset synth' writes it\n"
    "(see 'uform train --help'). Every item is embedded; then, for each of image, video and audio\n"
    "present, every text sharing a group with an item of that modality is a query, the candidates are\n"
    "all the items of that modality, ranked by cosine similarity (ties by manifest order), and a hit is\n"
    "a candidate sharing a group with the text, or one whose own group holds the very same text (two\n"
    "items drawn alike and captioned alike: the text describes both; --strict counts groups only).\n"
    "recall@K is the share of queries with a hit among the first K candidates.\n"
    "\n";

static char const help_tail[] =
    "\n"
    "An item that cannot be encoded ends the run with its line and status. Audio and video need a\n"
    "build with FFmpeg. Errors are one line on stderr: exit status 1 when the work failed, 2 for a\n"
    "wrong command line.\n"
    "\n";

typedef struct eval_flags {
    char const *model, *data;
    size_t batch, threads;
    int weights; /* a uform_weights_t */
    bool json, strict, help;
} eval_flags_t;

typedef struct recall {
    size_t queries, candidates, hits1, hits5;
} recall_t;

static command_help_t const help = {
    .name = "eval", .head = help_head, .tail = help_tail, .column = 21, .model_help = true};

static int parse_flags(int argc, char **argv, eval_flags_t *flags) {
    command_flag_t const table[] = {
        command_flag_model(&flags->model),
        {"--data", FLAG_STRING, &flags->data, .value = "FILE", .help = "the manifest (required)",
         .required = "--data MANIFEST is required"},
        {"--batch", FLAG_SIZE, &flags->batch, .value = "B", .minimum = 1, .maximum = ENCODE_BATCH_ITEMS,
         .help = "items per engine call, 1 to 256 (default 256)"},
        command_flag_threads(&flags->threads),
        command_flag_weights(&flags->weights),
        {"--strict", FLAG_SWITCH, &flags->strict,
         .help = "a hit shares a group with the text, whatever the captions say"},
        {"--json", FLAG_SWITCH, &flags->json,
         .help = "print one JSON object instead of the table:\n"
                 "{\"items\": N, \"modalities\": {\"image\": {\"queries\": Q, \"candidates\": C,\n"
                 "\"recall@1\": R1, \"recall@5\": R5}, ...}}"},
        {NULL},
    };
    command_spec_t const spec = {.help = &help, .flags = table};
    return command_flags_parse(&spec, argc, argv, &flags->help);
}

/* ---- embeddings --------------------------------------------------------------------------------- */

/* Encodes the batch and copies its rows, normalized, to the rows of `embeddings` its items own. */
static int flush(command_engine_t *engine, manifest_t const *manifest, encode_batch_t *batch,
                 size_t const *indices, float *embeddings) {
    size_t const dims = engine->info.dims;
    uform_encoded_t encoded;
    uform_encode_config_t config = {.outputs_scalar = UFORM_F32};
    if (encode_batch_run(engine, UFORM_OUTPUT_EMBEDDINGS, &config, batch, &encoded) != UFORM_OK)
        return command_fail_engine();
    for (size_t i = 0; i < batch->count; ++i) {
        manifest_item_t const *item = &manifest->items[indices[i]];
        if (encoded.statuses[i] != UFORM_OK)
            return command_fail("%s line %zu: %s%s%s: %s", manifest->path, item->line,
                                command_modality_names[item->modality],
                                item->modality == UFORM_MODALITY_TEXT ? "" : " ",
                                item->modality == UFORM_MODALITY_TEXT ? "" : item->bytes,
                                uform_status_name(encoded.statuses[i]));
        void const *row = NULL;
        if (uform_view_row(&encoded.embeddings, i, &row) != UFORM_OK) return command_fail_engine();
        float *out = embeddings + indices[i] * dims;
        memcpy(out, row, dims * sizeof(float));
        double norm = 0;
        for (size_t d = 0; d < dims; ++d)
            norm += (double)out[d] * out[d];
        norm = sqrt(norm);
        for (size_t d = 0; d < dims && norm > 0; ++d)
            out[d] = (float)(out[d] / norm);
    }
    encode_batch_clear(batch);
    return COMMAND_OK;
}

/* Every item's unit embedding, in manifest order, one modality after another. */
static int embed_all(command_engine_t *engine, manifest_t const *manifest, size_t batch_items,
                     float *embeddings) {
    encode_batch_t *batch = calloc(1, sizeof *batch);
    size_t *indices = malloc(ENCODE_BATCH_ITEMS * sizeof *indices);
    int code = COMMAND_OK;
    if (!batch || !indices) {
        code = command_fail("out of memory");
        goto done;
    }
    progress_t progress;
    progress_start(&progress, "eval", "items", manifest->count);
    size_t done_items = 0;
    for (size_t modality = 0; modality < 4 && code == COMMAND_OK; ++modality) {
        for (size_t i = 0; i < manifest->count && code == COMMAND_OK; ++i) {
            manifest_item_t const *item = &manifest->items[i];
            if (item->modality != (uform_modality_t)modality) continue;
            indices[batch->count] = i;
            if ((code = encode_batch_add(batch, item->modality, item->bytes, item->length)) != COMMAND_OK)
                break;
            if (batch->count < batch_items && !encode_batch_full(batch)) continue;
            done_items += batch->count;
            code = flush(engine, manifest, batch, indices, embeddings);
            progress_draw(&progress, done_items, false);
        }
        if (code == COMMAND_OK && batch->count) {
            done_items += batch->count;
            code = flush(engine, manifest, batch, indices, embeddings);
        }
    }
    progress_end(&progress, done_items, code == COMMAND_OK);
done:
    if (batch) encode_batch_release(batch);
    free(batch);
    free(indices);
    return code;
}

/* ---- recall ------------------------------------------------------------------------------------- */

static float dot(float const *a, float const *b, size_t dims) {
    double sum = 0;
    for (size_t d = 0; d < dims; ++d)
        sum += (double)a[d] * b[d];
    return (float)sum;
}

/* Text-to-`modality` recall; `candidates` receives that modality's items. */
static recall_t measure(manifest_t const *manifest, float const *embeddings, size_t dims,
                        uform_modality_t modality, size_t *candidates, bool strict) {
    recall_t recall = {0};
    for (size_t i = 0; i < manifest->count; ++i)
        if (manifest->items[i].modality == modality) candidates[recall.candidates++] = i;
    for (size_t query = 0; query < manifest->count; ++query) {
        if (manifest->items[query].modality != UFORM_MODALITY_TEXT) continue;
        float const *q = embeddings + query * dims;
        /* The best-ranked hit: highest score, ties to the earlier item. */
        size_t best = SIZE_MAX;
        float best_score = 0;
        for (size_t c = 0; c < recall.candidates; ++c) {
            bool hit = strict ? manifest_related(manifest, query, candidates[c])
                              : manifest_alike(manifest, query, candidates[c]);
            if (!hit) continue;
            float score = dot(q, embeddings + candidates[c] * dims, dims);
            if (best == SIZE_MAX || score > best_score) best = c, best_score = score;
        }
        if (best == SIZE_MAX) continue; /* the text has no item of this modality */
        size_t ahead = 0;               /* candidates ranked before the best hit */
        for (size_t c = 0; c < recall.candidates; ++c) {
            float score = dot(q, embeddings + candidates[c] * dims, dims);
            ahead += score > best_score || (score == best_score && c < best);
        }
        recall.queries++;
        recall.hits1 += ahead < 1;
        recall.hits5 += ahead < 5;
    }
    return recall;
}

/* ---- the command ------------------------------------------------------------------------------ */

int command_eval(int argc, char **argv) {
    eval_flags_t flags = {.batch = ENCODE_BATCH_ITEMS};
    manifest_t manifest = {0};
    command_engine_t engine = {0};
    float *embeddings = NULL;
    size_t *candidates = NULL;
    char buffer[4096];
    char const *path = NULL;
    int code = COMMAND_OK;
    if ((code = parse_flags(argc, argv, &flags)) != COMMAND_OK || flags.help) return code;
    if ((code = command_model_path(flags.model, buffer, sizeof buffer, &path)) != COMMAND_OK) return code;
    if ((code = manifest_read(flags.data, &manifest)) != COMMAND_OK) return code;
    if (manifest.modality_counts[UFORM_MODALITY_TEXT] == 0) {
        code = command_fail("%s holds no text: nothing to query with", flags.data);
        goto done;
    }
    if ((code = command_engine_open(path, flags.threads, flags.weights, &engine)) != COMMAND_OK) goto done;
    size_t const dims = engine.info.dims;
    embeddings = calloc(manifest.count * dims, sizeof(float));
    candidates = malloc(manifest.count * sizeof *candidates);
    if (!embeddings || !candidates) {
        code = command_fail("out of memory for %zu embeddings", manifest.count);
        goto done;
    }
    if ((code = embed_all(&engine, &manifest, flags.batch, embeddings)) != COMMAND_OK) goto done;

    recall_t recalls[4] = {{0}};
    for (size_t m = UFORM_MODALITY_IMAGE; m <= UFORM_MODALITY_AUDIO; ++m)
        if (manifest.modality_counts[m])
            recalls[m] = measure(&manifest, embeddings, dims, (uform_modality_t)m, candidates, flags.strict);
    if (flags.json) {
        printf("{\"items\": %zu, \"modalities\": {", manifest.count);
        bool first = true;
        for (size_t m = UFORM_MODALITY_IMAGE; m <= UFORM_MODALITY_AUDIO; ++m) {
            recall_t const *r = &recalls[m];
            if (!manifest.modality_counts[m]) continue;
            printf(
                "%s\"%s\": {\"queries\": %zu, \"candidates\": %zu, \"recall@1\": %.6f, \"recall@5\": %.6f}",
                first ? "" : ", ", command_modality_names[m], r->queries, r->candidates,
                r->queries ? (double)r->hits1 / (double)r->queries : 0.0,
                r->queries ? (double)r->hits5 / (double)r->queries : 0.0);
            first = false;
        }
        printf("}}\n");
    } else {
        printf("%-10s %8s %11s %9s %9s\n", "modality", "queries", "candidates", "recall@1", "recall@5");
        for (size_t m = UFORM_MODALITY_IMAGE; m <= UFORM_MODALITY_AUDIO; ++m) {
            recall_t const *r = &recalls[m];
            if (!manifest.modality_counts[m]) continue;
            printf("%-10s %8zu %11zu %9.4f %9.4f\n", command_modality_names[m], r->queries, r->candidates,
                   r->queries ? (double)r->hits1 / (double)r->queries : 0.0,
                   r->queries ? (double)r->hits5 / (double)r->queries : 0.0);
        }
    }
    if (fflush(stdout) != 0) code = command_fail("cannot write the standard output");

done:
    free(embeddings);
    free(candidates);
    command_engine_close(&engine);
    manifest_free(&manifest);
    return code;
}
