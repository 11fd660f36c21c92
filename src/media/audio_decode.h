/* Encoded sounds to mono F32 samples at their own rate: FFmpeg's libavformat demuxes the bytes in memory
 * (a custom AVIOContext, the format probed from the content, never from a name), libavcodec decodes the
 * first audio stream, and libswresample converts every sample format to F32 and downmixes to mono as
 * the mean of all channels. Decoding stops once the model's front end has every sample it will read
 * (audio_input_needed), so a long clip costs what its first `seconds` cost. Built only with FFmpeg. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "audio_frontend.h"

/* Channels of a decoded stream, and packets demuxed per clip (of any stream); more answer UFORM_FORMAT. */
#define AUDIO_CHANNELS_MAX 64
#define AUDIO_PACKETS_MAX  ((size_t)1 << 20)

typedef struct audio_pcm {
    float *samples;  /* malloc'ed and grown; the caller keeps it across items and frees it */
    size_t capacity; /* samples it holds room for */
    size_t length;   /* samples decoded */
    size_t rate;     /* the stream's rate, in Hz */
    bool more;       /* decoding stopped before the end of the stream: the clip is longer than `length` */
} audio_pcm_t;

/* Decodes `size` bytes at `data` into `pcm` (its buffer kept when large enough). Answers UFORM_OK (an
 * empty stream included: `length` 0), UFORM_FORMAT (not a format FFmpeg recognizes, malformed or
 * truncated so that demuxing or decoding reports an error or a corrupt packet, no audio stream, more
 * than AUDIO_PACKETS_MAX packets before the samples it needs, a rate of 0 or over
 * UFORM_AUDIO_MAX_RATE, no channel or more than AUDIO_CHANNELS_MAX, a change of rate, format or channels
 * within the stream, a NaN or infinite sample), UFORM_UNSUPPORTED (a codec this FFmpeg cannot decode),
 * UFORM_OUT_OF_MEMORY. Thread-safe: every FFmpeg context is its own. */
uform_status_t audio_decode(uint8_t const *data, size_t size, audio_frontend_t const *frontend,
                            audio_pcm_t *pcm);
