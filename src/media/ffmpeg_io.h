/* Encoded media in memory, opened by an FFmpeg demuxer (src/media/audio_decode.c, src/media/video_decode.c).
 * Built only with FFmpeg. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <libavformat/avformat.h>

#include "uform.h"

/* Routes FFmpeg's log through the engine, once per process (silent unless UFORM_LOG=debug). Whatever
 * calls into FFmpeg calls it first: ffmpeg_memory_open does, and so does the audio front end's transform
 * setup. */
void ffmpeg_log_route(void);

/* A demuxer reading bytes in memory through custom I/O. Demuxers that reach for other files or URLs
 * (playlists, concat lists, image sequences) get none. The I/O reads through the structure: it stays in
 * place while open. */
typedef struct ffmpeg_memory {
    uint8_t const *data;
    size_t size, position;
    AVIOContext *io;
    AVFormatContext *format; /* the opened demuxer; NULL until it opens */
} ffmpeg_memory_t;

/* Opens a demuxer over data[0, size) with an I/O buffer of `buffer_bytes`. Answers UFORM_OK,
 * UFORM_OUT_OF_MEMORY, or UFORM_FORMAT (no demuxer knows the bytes). Whatever it answers,
 * ffmpeg_memory_close frees what it made. */
uform_status_t ffmpeg_memory_open(ffmpeg_memory_t *memory, uint8_t const *data, size_t size,
                                  size_t buffer_bytes);
void ffmpeg_memory_close(ffmpeg_memory_t *memory);

/* Reads the streams' parameters (avformat_find_stream_info), each decoder it opens on one thread and,
 * when `max_pixels` is not 0, limited to that many pixels per frame. */
uform_status_t ffmpeg_find_streams(AVFormatContext *format, int64_t max_pixels);

/* An FFmpeg error as a status: UFORM_OUT_OF_MEMORY for ENOMEM, else UFORM_FORMAT. */
uform_status_t ffmpeg_status(int error);
