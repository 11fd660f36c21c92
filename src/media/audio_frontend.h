/* The audio tower's front end, from mono F32 samples at any rate to the rows its patch layer reads:
 *
 *   clip      the samples resampled to the model's `rate` (libswresample; none when the rates agree),
 *             cut to the model's reach;
 *   log-mel   a periodic Hann window of `window` samples every `hop` samples, no centre padding
 *             (1 + (n - window) / hop frames, none when n < window), the DFT of `window` points, the
 *             unscaled power spectrum of bins 0 .. window / 2, HTK-mel triangular filters of peak 1
 *             spread over 0 .. rate / 2, log10(max(mel, 1e-10));
 *   patches   `patch_frames` consecutive frames of every band, flattened frame-major, trailing frames
 *             dropped: the [frames, mels] log-mel matrix of the kept frames is the [patches,
 *             patch_frames * mels] patch matrix as it stands.
 *
 * Built only with FFmpeg (libavutil, libswresample). Everything here is thread-safe except an
 * audio_spectrum_t, which one thread uses at a time. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "uform.h"

typedef struct audio_frontend {
    size_t rate, mels, window, hop, patch_frames, max_patches;
    size_t bins;  /* window / 2 + 1 */
    size_t limit; /* floor(seconds * rate): the samples `seconds` allows */
    size_t reach; /* the samples the model reads at most: min(limit, window + (max_patches * patch_frames - 1)
                   * hop) */
    float *hann;  /* [window], periodic */
    /* The DFT of `window` points through libavutil's complex FFT (av_tx): directly when `window` is a
     * power of two; otherwise by Bluestein's chirp-z over FFTs of `fft` points, a power of two of at
     * least 2 window - 1 (libavutil 57 falls back to an O(n^2) transform that recomputes its twiddles
     * for lengths it has no factorization for, 400 among them, and its real-input transform miscomputes
     * lengths of 2 mod 4). */
    size_t fft;
    float *chirp;  /* [window] complex, interleaved: exp(-i pi t^2 / window); NULL when direct */
    float *kernel; /* [fft] complex: the FFT of the conjugate chirp wrapped around, divided by fft */
    /* Mel filter m weighs bins [first[m], first[m] + count[m]) with weights[start[m] ..]. */
    size_t *first, *count, *start;
    float *weights;
} audio_frontend_t;

/* Prepares the window and the filters for a model's audio metadata. UFORM_OK or UFORM_OUT_OF_MEMORY
 * (with nothing held). */
uform_status_t audio_frontend_init(audio_frontend_t *frontend, uform_model_info_t const *info);
void audio_frontend_free(audio_frontend_t *frontend);

/* Frames of `samples` samples at the model's rate: 1 + (samples - window) / hop, 0 when samples < window. */
size_t audio_frames(audio_frontend_t const *frontend, size_t samples);

/* The samples a clip of `samples` at `in_rate` holds at the model's rate: floor(samples * rate / in_rate),
 * exactly `samples` when the rates agree. */
size_t audio_resampled_length(audio_frontend_t const *frontend, size_t samples, size_t in_rate);

/* The input samples at `in_rate` that make the first `reach` samples at the model's rate exactly what the
 * whole clip would give: the reach in input samples plus the resampling filter's span. A clip holding
 * at least this many is longer than the reach. */
size_t audio_input_needed(audio_frontend_t const *frontend, size_t in_rate);

/* One thread's transforms (av_tx contexts are not shared between threads) and buffers. */
typedef struct audio_spectrum {
    void *forward, *inverse;       /* AVTXContext of `fft` points; `inverse` only for Bluestein */
    void *forward_fn, *inverse_fn; /* their av_tx_fn */
    float *in, *out;               /* [fft] complex, interleaved, av_malloc'ed (aligned) */
    double *power;                 /* [bins] */
} audio_spectrum_t;

/* UFORM_OK, UFORM_OUT_OF_MEMORY or UFORM_INTERNAL (libavutil refused the transform). */
uform_status_t audio_spectrum_init(audio_spectrum_t *spectrum, audio_frontend_t const *frontend);
void audio_spectrum_free(audio_spectrum_t *spectrum);

/* The log-mel matrix [frames, mels] of the first frames of `samples` (which holds at least
 * window + (frames - 1) * hop samples at the model's rate). */
void audio_log_mel(audio_frontend_t const *frontend, audio_spectrum_t *spectrum, float const *samples,
                   size_t frames, float *log_mel);

/* The first `count` samples at the model's rate of `length` samples at `in_rate`, through libswresample
 * with its defaults (the SWR engine: a windowed-sinc polyphase filter of 32 taps, 1024 phases with
 * linear interpolation between them, Kaiser window of beta 9, cutoff 0.97 of Nyquist, exact rational
 * ratios), mono F32 in and out, the filter flushed at the end of the input; samples it does not produce
 * are zero. Copied as they stand when the rates agree. UFORM_OK, UFORM_INVALID_ARGUMENT (libswresample
 * refused the rates) or UFORM_OUT_OF_MEMORY. */
uform_status_t audio_resample(audio_frontend_t const *frontend, float const *samples, size_t length,
                              size_t in_rate, float *clip, size_t count);
