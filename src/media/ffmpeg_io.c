/* Encoded media in memory, opened by an FFmpeg demuxer (ffmpeg_io.h). */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libavutil/log.h>

#include "ffmpeg_io.h"

/* FFmpeg's log, routed through the engine: silent unless UFORM_LOG=debug, then each line on stderr after
 * "uform: ffmpeg: " (a message of several lines gets it on each), up to the level av_log_set_level sets.
 * FFmpeg logs from any thread: the lock keeps each message whole and the state of a line that arrives
 * in pieces. Every entry into FFmpeg calls ffmpeg_log_route first: its pthread_once orders each thread's
 * reads of log_debug after the one write, and no FFmpeg line reaches FFmpeg's own default printer. */
static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static bool log_debug;
static int log_at_line_start = 1;

static void log_line(void *object, int level, char const *format, va_list arguments) {
    if (!log_debug || level > av_log_get_level()) return;
    char message[1024];
    pthread_mutex_lock(&log_lock);
    bool at_start = log_at_line_start;
    if (av_log_format_line2(object, level, format, arguments, message, sizeof message, &log_at_line_start) >=
        0) {
        for (char const *line = message; *line;) {
            char const *newline = strchr(line, '\n');
            size_t length = newline ? (size_t)(newline - line) + 1 : strlen(line);
            fprintf(stderr, "%s%.*s", at_start ? "uform: ffmpeg: " : "", (int)length, line);
            at_start = newline != NULL;
            line += length;
        }
    }
    pthread_mutex_unlock(&log_lock);
}

static void log_install(void) {
    char const *choice = getenv("UFORM_LOG");
    log_debug = choice && strcmp(choice, "debug") == 0;
    av_log_set_callback(log_line);
}

void ffmpeg_log_route(void) {
    pthread_once(&log_once, log_install);
}

static int memory_read(void *opaque, uint8_t *buffer, int capacity) {
    ffmpeg_memory_t *memory = opaque;
    size_t count = memory->size - memory->position;
    if (capacity <= 0 || count == 0) return AVERROR_EOF;
    if (count > (size_t)capacity) count = (size_t)capacity;
    memcpy(buffer, memory->data + memory->position, count);
    memory->position += count;
    return (int)count;
}

static int64_t memory_seek(void *opaque, int64_t offset, int whence) {
    ffmpeg_memory_t *memory = opaque;
    whence &= ~AVSEEK_FORCE;
    if (whence == AVSEEK_SIZE) return (int64_t)memory->size;
    int64_t base = whence == SEEK_SET   ? 0
                   : whence == SEEK_CUR ? (int64_t)memory->position
                   : whence == SEEK_END ? (int64_t)memory->size
                                        : -1;
    int64_t target = 0;
    if (base < 0 || __builtin_add_overflow(base, offset, &target) || target < 0 ||
        (uint64_t)target > memory->size)
        return AVERROR(EINVAL);
    memory->position = (size_t)target;
    return target;
}

static int refuse_open(AVFormatContext *format, AVIOContext **io, char const *url, int flags,
                       AVDictionary **options) {
    (void)format, (void)io, (void)url, (void)flags, (void)options;
    return AVERROR(EPERM);
}

uform_status_t ffmpeg_memory_open(ffmpeg_memory_t *memory, uint8_t const *data, size_t size,
                                  size_t buffer_bytes) {
    *memory = (ffmpeg_memory_t){.data = data, .size = size};
    ffmpeg_log_route();
    uint8_t *buffer = av_malloc(buffer_bytes);
    if (!buffer) return UFORM_OUT_OF_MEMORY;
    memory->io = avio_alloc_context(buffer, (int)buffer_bytes, 0, memory, memory_read, NULL, memory_seek);
    if (!memory->io) {
        av_free(buffer);
        return UFORM_OUT_OF_MEMORY;
    }
    AVFormatContext *format = avformat_alloc_context();
    if (!format) return UFORM_OUT_OF_MEMORY;
    format->pb = memory->io;
    format->flags |= AVFMT_FLAG_CUSTOM_IO;
    format->io_open = refuse_open;
    int error = avformat_open_input(&format, NULL, NULL, NULL); /* frees the context on failure */
    if (error < 0) return ffmpeg_status(error);
    memory->format = format;
    return UFORM_OK;
}

void ffmpeg_memory_close(ffmpeg_memory_t *memory) {
    avformat_close_input(&memory->format); /* custom I/O: the I/O context is ours to free */
    if (memory->io) {
        av_freep(&memory->io->buffer); /* FFmpeg may have swapped the buffer for one of its own */
        avio_context_free(&memory->io);
    }
}

uform_status_t ffmpeg_find_streams(AVFormatContext *format, int64_t max_pixels) {
    unsigned streams = format->nb_streams;
    AVDictionary **options = streams ? calloc(streams, sizeof *options) : NULL;
    if (streams && !options) return UFORM_OUT_OF_MEMORY;
    uform_status_t status = UFORM_OK;
    for (unsigned i = 0; i < streams && status == UFORM_OK; ++i)
        if ((max_pixels && av_dict_set_int(&options[i], "max_pixels", max_pixels, 0) < 0) ||
            av_dict_set(&options[i], "threads", "1", 0) < 0)
            status = UFORM_OUT_OF_MEMORY;
    if (status == UFORM_OK) {
        int error = avformat_find_stream_info(format, options);
        if (error < 0) status = ffmpeg_status(error);
    }
    for (unsigned i = 0; i < streams; ++i)
        av_dict_free(&options[i]);
    free(options);
    return status;
}

uform_status_t ffmpeg_status(int error) {
    return error == AVERROR(ENOMEM) ? UFORM_OUT_OF_MEMORY : UFORM_FORMAT;
}
