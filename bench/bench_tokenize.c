/* Tokens per second of uform_text_tokenize: a tokenizer file, a corpus of one text per line, a RAM
 * executor of THREADS threads; passes over the whole corpus until MIN_SECONDS have gone, the best pass
 * kept. Prints one JSON object: texts, bytes, tokens, seconds (of the best pass), tokens_per_second.
 * bench_tokenize.py runs it beside Hugging Face's tokenizers.
 *
 *   bench_tokenize TOKENIZER CORPUS [THREADS [MIN_SECONDS]] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <uform.h>

static double now(void) {
    struct timespec at;
    clock_gettime(CLOCK_MONOTONIC, &at);
    return (double)at.tv_sec + (double)at.tv_nsec * 1e-9;
}

/* The corpus: every line, without its "\n" or "\r\n", end to end, and count + 1 offsets. */
static int read_corpus(char const *path, char **data, size_t **offsets, size_t *count) {
    FILE *file = fopen(path, "rb");
    if (!file) return -1;
    fseek(file, 0, SEEK_END);
    long size = ftell(file);
    fseek(file, 0, SEEK_SET);
    char *bytes = malloc((size_t)size + 1);
    size_t lines = 0, *ends = malloc(((size_t)size + 2) * sizeof *ends);
    if (!bytes || !ends || fread(bytes, 1, (size_t)size, file) != (size_t)size) {
        fclose(file);
        return -1;
    }
    fclose(file);
    size_t kept = 0;
    ends[0] = 0;
    for (size_t at = 0, begin = 0; at <= (size_t)size; ++at) {
        if (at < (size_t)size && bytes[at] != '\n') continue;
        size_t end = at;
        if (at == (size_t)size && begin == at) break; /* no last line after the final "\n" */
        if (end > begin && bytes[end - 1] == '\r') end--;
        memmove(bytes + kept, bytes + begin, end - begin);
        kept += end - begin;
        ends[++lines] = kept;
        begin = at + 1;
    }
    *data = bytes;
    *offsets = ends;
    *count = lines;
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bench_tokenize TOKENIZER CORPUS [THREADS [MIN_SECONDS]]\n");
        return 2;
    }
    size_t threads = argc > 3 ? strtoul(argv[3], NULL, 10) : 1;
    double min_seconds = argc > 4 ? strtod(argv[4], NULL) : 3.0;
    char *data = NULL;
    size_t *offsets = NULL, count = 0;
    if (read_corpus(argv[2], &data, &offsets, &count) != 0 || count == 0) {
        fprintf(stderr, "bench_tokenize: cannot read %s\n", argv[2]);
        return 1;
    }
    uform_tokenizer_t *tokenizer = NULL;
    uform_executor_t *executor = NULL;
    uform_arena_t *arena = NULL;
    uform_ram_options_t options = uform_ram_options_default();
    options.threads = threads;
    if (uform_tokenizer_open(argv[1], &tokenizer) != UFORM_OK ||
        uform_executor_create_ram(&options, &executor) != UFORM_OK ||
        uform_arena_create(executor, &arena) != UFORM_OK) {
        char text[256];
        uform_error_t error = uform_last_error();
        uform_error_render(&error, text, sizeof text);
        fprintf(stderr, "bench_tokenize: %s\n", text);
        return 1;
    }
    uform_tokenized_t tokenized;
    uform_tokenize_stats_t stats;
    uform_tokenize_config_t config = {.stats = &stats};
    uform_text_tokenize_args_t args = {
        .tokenizer = tokenizer,
        .executor = executor,
        .texts = {.data = data, .offsets = offsets, .count = count, .length = offsets[count]},
        .arena = arena,
        .config = &config,
        .tokenized = &tokenized,
    };
    double best = 1e30, started = now();
    size_t passes = 0;
    do {
        double begin = now();
        if (uform_text_tokenize(&args) != UFORM_OK) {
            fprintf(stderr, "bench_tokenize: the call failed\n");
            return 1;
        }
        double took = now() - begin;
        if (took < best) best = took;
        passes++;
    } while (now() - started < min_seconds || passes < 2);
    printf("{\"texts\": %zu, \"bytes\": %zu, \"tokens\": %zu, \"failed\": %zu, \"passes\": %zu, \"seconds\": "
           "%.6f, "
           "\"tokens_per_second\": %.1f}\n",
           count, offsets[count], stats.tokens, stats.failed, passes, best, (double)stats.tokens / best);
    uform_arena_free(arena);
    uform_executor_free(executor);
    uform_tokenizer_free(tokenizer);
    free(data);
    free(offsets);
    return 0;
}
