/* The progress line of long work (`encode`, `search index`): drawn on stderr when it is a terminal,
 * never in a pipe or a log. */
#include <stdio.h>
#include <unistd.h>

#include "uform_command.h"

static double seconds_since(struct timespec const *since) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - since->tv_sec) + (double)(now.tv_nsec - since->tv_nsec) * 1e-9;
}

void progress_start(progress_t *progress, char const *label, char const *unit, size_t total) {
    *progress = (progress_t){.label = label, .unit = unit, .enabled = isatty(STDERR_FILENO), .total = total};
    clock_gettime(CLOCK_MONOTONIC, &progress->started);
}

void progress_draw(progress_t *progress, size_t done, bool last) {
    if (!progress->enabled) return;
    double seconds = seconds_since(&progress->started);
    if (!last && progress->drawn && seconds < progress->drawn_at + 0.1) return;
    progress->drawn_at = seconds;
    double rate = seconds > 0 ? (double)done / seconds : 0;
    fprintf(stderr, "\r\033[K%s: ", progress->label);
    if (progress->total) {
        enum { WIDTH = 30 };
        size_t filled = (done < progress->total ? done : progress->total) * WIDTH / progress->total;
        char bar[WIDTH + 1];
        for (size_t i = 0; i < WIDTH; ++i)
            bar[i] = i < filled ? '#' : '.';
        bar[WIDTH] = '\0';
        fprintf(stderr, "[%s] %zu/%zu", bar, done, progress->total);
    } else {
        fprintf(stderr, "%zu", done);
    }
    fprintf(stderr, " %s, %.0f %s/s", progress->unit, rate, progress->unit);
    fflush(stderr);
    progress->drawn = true;
}

void progress_clear(progress_t *progress) {
    if (!progress->drawn) return;
    fputs("\r\033[K", stderr);
    progress->drawn = false;
}

void progress_end(progress_t *progress, size_t done, bool succeeded) {
    if (succeeded) progress_draw(progress, done, true);
    if (progress->drawn) fputc('\n', stderr);
    progress->drawn = false;
}
