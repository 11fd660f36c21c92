/* The clips of an audio call and their preparation for the tower: what the host's audio call
 * (src/encode/audio.c) and a VRAM executor's media call (src/vram/vram_media.c) share. Built with FFmpeg
 * only: without it the audio verbs answer UFORM_UNSUPPORTED before anything here is needed.
 *
 *   samples, a file's bytes or encoded bytes -> decoded (FFmpeg), downmixed, resampled to the model's
 *   rate and cut at its reach -> log-mel frames -> patch rows [max_patches, patch_frames * mels], of
 *   which the clip fills `patches[item]`. */
#pragma once

#include "verbs.h"

#if UFORM_WITH_FFMPEG
#include "audio_decode.h"
#include "audio_frontend.h"
#include "media_read.h"

/* One executor thread's FFT and buffers, made with its first clip and kept for the call. */
typedef struct audio_thread {
    bool ready;
    audio_spectrum_t spectrum;
    audio_pcm_t pcm; /* a decoded clip at its own rate */
    float *clip;     /* [reach]: the clip at the model's rate */
} audio_thread_t;

/* A call's clips: how they come, the front end, and what each prepared clip has. */
typedef struct audio_clips {
    audio_input_t input;
    size_t rate; /* of the samples */
    bool ready;  /* the front end is made */
    audio_frontend_t frontend;
    size_t *patches;    /* [items]: each prepared clip's patches (0 for a failed one) */
    uint8_t *truncated; /* [items]: the clip was longer than the model's reach */
    size_t threads_count;
    audio_thread_t *threads; /* [threads_count], each made by its thread's first clip */
} audio_clips_t;

/* The clips of a call of `items` items prepared on up to `threads` threads, with the front end of the
 * model `info` describes. NULL when out of memory. */
audio_clips_t *audio_clips_new(audio_input_t input, size_t rate, uform_model_info_t const *info, size_t items,
                               size_t threads);
void audio_clips_free(audio_clips_t *clips);

/* Clip `item`'s patch rows into `rows` [max_patches, patch_frames * mels], on executor thread `thread`
 * (which alone uses its buffers), from its samples, its file's bytes (read by `run`) or its encoded bytes
 * in `tape`; records patches[item] and truncated[item]. Bad samples answer UFORM_INVALID_ARGUMENT, bad
 * sounds UFORM_FORMAT. */
uform_status_t audio_clips_prepare(audio_clips_t *clips, uform_tape_t const *tape, media_run_t const *run,
                                   size_t thread, size_t item, float *rows);

/* The most patches item `item` can have: from its length for samples, max_patches for encoded sounds. */
size_t audio_clips_bound(audio_clips_t const *clips, uform_tape_t const *tape, size_t item);

/* The most token-vector rows every clip of `tape` together can have (the sum of audio_clips_bound):
 * false when it overflows. */
bool audio_clips_rows(audio_clips_t const *clips, uform_tape_t const *tape, size_t *rows);
#endif
