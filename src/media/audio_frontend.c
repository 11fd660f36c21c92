/* The audio front end: resampling, the log-mel spectrogram and its patches (audio_frontend.h). */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <libavutil/channel_layout.h>
#include <libavutil/error.h>
#include <libavutil/mem.h>
#include <libavutil/tx.h>
#include <libswresample/swresample.h>

#include "audio_frontend.h"
#include "ffmpeg_io.h"

#define AUDIO_LOG_FLOOR 1e-10

/* ---- The window and the filters ----------------------------------------------------------------- */

static double hz_to_mel(double hz) {
    return 2595.0 * log10(1.0 + hz / 700.0);
}

static double mel_to_hz(double mel) {
    return 700.0 * (pow(10.0, mel / 2595.0) - 1.0);
}

void audio_frontend_free(audio_frontend_t *frontend) {
    void *const tables[] = {frontend->hann,  frontend->first,   frontend->count,
                            frontend->start, frontend->weights, frontend->chirp};
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++)
        free(tables[i]);
    av_free(frontend->kernel); /* FFmpeg's allocation */
    memset(frontend, 0, sizeof *frontend);
}

/* Triangles of peak 1 between mels + 2 points spaced evenly in HTK mel over 0 .. rate / 2; bin k sits at
 * k * rate / window Hz. Each bin falls in at most two triangles, so the weights are kept sparse. */
static bool frontend_filters(audio_frontend_t *frontend) {
    size_t const mels = frontend->mels, bins = frontend->bins;
    double *edges = malloc((mels + 2) * sizeof(double));
    frontend->first = calloc(mels, sizeof(size_t));
    frontend->count = calloc(mels, sizeof(size_t));
    frontend->start = calloc(mels, sizeof(size_t));
    frontend->weights = malloc(2 * bins * sizeof(float) + sizeof(float));
    if (!edges || !frontend->first || !frontend->count || !frontend->start || !frontend->weights) {
        free(edges);
        return false;
    }
    double const top = hz_to_mel((double)frontend->rate / 2);
    for (size_t i = 0; i < mels + 2; ++i)
        edges[i] = mel_to_hz(top * (double)i / (double)(mels + 1));
    size_t used = 0;
    for (size_t m = 0; m < mels; ++m) {
        double const low = edges[m], centre = edges[m + 1], high = edges[m + 2];
        frontend->start[m] = used;
        frontend->first[m] = bins;
        /* Only bins between the triangle's feet, widened by one each way against rounding, can weigh. */
        double const per_bin = (double)frontend->window / (double)frontend->rate;
        size_t const lowest = low * per_bin > 1 ? (size_t)(low * per_bin) - 1 : 0;
        size_t const highest = high * per_bin + 2 < (double)bins ? (size_t)(high * per_bin) + 2 : bins;
        for (size_t k = lowest; k < highest; ++k) {
            double const hz = (double)k * (double)frontend->rate / (double)frontend->window;
            double const up = (hz - low) / (centre - low), down = (high - hz) / (high - centre);
            double const weight = up < down ? up : down;
            if (!(weight > 0)) continue;
            if (frontend->first[m] == bins) frontend->first[m] = k;
            /* Triangles are convex: the bins with weight are consecutive. */
            frontend->weights[used++] = (float)weight;
            frontend->count[m] = k + 1 - frontend->first[m];
        }
        if (frontend->first[m] == bins) frontend->first[m] = 0;
    }
    free(edges);
    return true;
}

/* ---- The transforms ----------------------------------------------------------------------------- */

typedef struct transform {
    AVTXContext *context;
    av_tx_fn function;
} transform_t;

static uform_status_t transform_init(transform_t *transform, size_t points, bool inverse) {
    float const scale = 1.0f;
    if (points > INT_MAX) return UFORM_INVALID_ARGUMENT;
    ffmpeg_log_route(); /* av_tx_init logs */
    int error = av_tx_init(&transform->context, &transform->function, AV_TX_FLOAT_FFT, inverse, (int)points,
                           &scale, 0);
    if (error < 0) return error == AVERROR(ENOMEM) ? UFORM_OUT_OF_MEMORY : UFORM_INTERNAL;
    return UFORM_OK;
}

static bool power_of_two(size_t n) {
    return (n & (n - 1)) == 0;
}

/* Bluestein: kt = (t^2 + k^2 - (k - t)^2) / 2, so with c_m = exp(-i pi m^2 / n),
 * X_k = sum_t x_t exp(-2 i pi k t / n) = c_k sum_t (x_t c_t) conj(c_{k - t}): a circular convolution of
 * fft >= 2n - 1 points with the conjugate chirp wrapped around (b_m = b_{fft - m} = conj(c_m), m < n).
 * Angles are reduced as m^2 mod 2n in integers, then taken in double. */
static uform_status_t frontend_chirp(audio_frontend_t *frontend) {
    size_t const n = frontend->window, fft = frontend->fft;
    double const pi = 3.14159265358979323846;
    frontend->chirp = malloc(2 * n * sizeof(float));
    frontend->kernel = av_malloc(2 * fft * sizeof(float));
    float *wrapped = av_mallocz(2 * fft * sizeof(float));
    transform_t forward = {0};
    uform_status_t status = UFORM_OUT_OF_MEMORY;
    if (frontend->chirp && frontend->kernel && wrapped) status = transform_init(&forward, fft, false);
    if (status == UFORM_OK) {
        for (size_t m = 0; m < n; ++m) {
            unsigned __int128 square = (unsigned __int128)m * m % (2 * n);
            double angle = pi * (double)square / (double)n;
            frontend->chirp[2 * m] = (float)cos(angle);
            frontend->chirp[2 * m + 1] = (float)-sin(angle);
            size_t const slots[2] = {m, (fft - m) % fft};
            for (size_t j = 0; j < (m ? 2u : 1u); ++j) {
                wrapped[2 * slots[j]] = (float)(cos(angle) / (double)fft);
                wrapped[2 * slots[j] + 1] = (float)(sin(angle) / (double)fft);
            }
        }
        forward.function(forward.context, frontend->kernel, wrapped, 2 * sizeof(float));
    }
    av_tx_uninit(&forward.context);
    av_free(wrapped);
    return status;
}

/* ---- The front end ------------------------------------------------------------------------------ */

uform_status_t audio_frontend_init(audio_frontend_t *frontend, uform_model_info_t const *info) {
    memset(frontend, 0, sizeof *frontend);
    frontend->rate = info->audio.rate;
    frontend->mels = info->audio.mels;
    frontend->window = info->audio.window;
    frontend->hop = info->audio.hop;
    frontend->patch_frames = info->audio.patch_frames;
    frontend->max_patches = info->audio.max_patches;
    frontend->bins = frontend->window / 2 + 1;
    /* The checkpoint reader bounds seconds (86400) and rate (2^20), so the product fits. */
    frontend->limit = (size_t)floor(info->audio.seconds * (double)frontend->rate);
    size_t span = frontend->window, frames = 0, hops = 0;
    if (!__builtin_mul_overflow(frontend->max_patches, frontend->patch_frames, &frames) &&
        !__builtin_mul_overflow(frames - 1, frontend->hop, &hops) &&
        !__builtin_add_overflow(span, hops, &span))
        frontend->reach = span < frontend->limit ? span : frontend->limit;
    else
        frontend->reach = frontend->limit;
    frontend->fft = frontend->window;
    if (!power_of_two(frontend->window)) {
        frontend->fft = 1;
        while (frontend->fft < 2 * frontend->window - 1)
            frontend->fft *= 2;
    }
    frontend->hann = malloc(frontend->window * sizeof(float));
    uform_status_t status = frontend->hann && frontend_filters(frontend) ? UFORM_OK : UFORM_OUT_OF_MEMORY;
    if (status == UFORM_OK && frontend->fft != frontend->window) status = frontend_chirp(frontend);
    if (status != UFORM_OK) {
        audio_frontend_free(frontend);
        return status;
    }
    double const pi = 3.14159265358979323846;
    for (size_t t = 0; t < frontend->window; ++t)
        frontend->hann[t] = (float)(0.5 - 0.5 * cos(2 * pi * (double)t / (double)frontend->window));
    return UFORM_OK;
}

size_t audio_frames(audio_frontend_t const *frontend, size_t samples) {
    if (samples < frontend->window) return 0;
    return 1 + (samples - frontend->window) / frontend->hop;
}

size_t audio_resampled_length(audio_frontend_t const *frontend, size_t samples, size_t in_rate) {
    if (in_rate == frontend->rate) return samples;
    if (in_rate == 0) return 0;
    unsigned __int128 scaled = (unsigned __int128)samples * frontend->rate / in_rate;
    return scaled > SIZE_MAX ? SIZE_MAX : (size_t)scaled;
}

size_t audio_input_needed(audio_frontend_t const *frontend, size_t in_rate) {
    if (in_rate == frontend->rate) return frontend->reach + 1;
    /* ceil(reach * in_rate / rate), plus the filter's reach on either side: 32 taps at the lower of
     * the two rates, widened by the ratio when shrinking, with room to spare. */
    unsigned __int128 input =
        ((unsigned __int128)frontend->reach * in_rate + frontend->rate - 1) / frontend->rate;
    input += 64 * ((unsigned __int128)in_rate / frontend->rate + 2);
    return input > SIZE_MAX ? SIZE_MAX : (size_t)input;
}

/* ---- The spectrum ------------------------------------------------------------------------------- */

uform_status_t audio_spectrum_init(audio_spectrum_t *spectrum, audio_frontend_t const *frontend) {
    memset(spectrum, 0, sizeof *spectrum);
    transform_t forward = {0}, inverse = {0};
    uform_status_t status = transform_init(&forward, frontend->fft, false);
    spectrum->forward = forward.context;
    spectrum->forward_fn = (void *)forward.function;
    if (status == UFORM_OK && frontend->chirp) {
        status = transform_init(&inverse, frontend->fft, true);
        spectrum->inverse = inverse.context;
        spectrum->inverse_fn = (void *)inverse.function;
    }
    if (status == UFORM_OK) {
        spectrum->in = av_malloc(2 * frontend->fft * sizeof(float));
        spectrum->out = av_malloc(2 * frontend->fft * sizeof(float));
        spectrum->power = malloc(frontend->bins * sizeof(double));
        if (!spectrum->in || !spectrum->out || !spectrum->power) status = UFORM_OUT_OF_MEMORY;
    }
    if (status != UFORM_OK) audio_spectrum_free(spectrum);
    return status;
}

void audio_spectrum_free(audio_spectrum_t *spectrum) {
    AVTXContext *forward = spectrum->forward, *inverse = spectrum->inverse;
    av_tx_uninit(&forward);
    av_tx_uninit(&inverse);
    av_free(spectrum->in);
    av_free(spectrum->out);
    free(spectrum->power);
    memset(spectrum, 0, sizeof *spectrum);
}

/* The power of bins 0 .. window / 2 of one windowed frame. */
static void frame_power(audio_frontend_t const *frontend, audio_spectrum_t *spectrum, float const *frame) {
    size_t const n = frontend->window, fft = frontend->fft;
    float *in = spectrum->in, *out = spectrum->out;
    float const *chirp = frontend->chirp;
    av_tx_fn forward = (av_tx_fn)spectrum->forward_fn;
    if (!chirp) {
        for (size_t t = 0; t < n; ++t)
            in[2 * t] = frame[t] * frontend->hann[t], in[2 * t + 1] = 0;
        forward(spectrum->forward, out, in, 2 * sizeof(float));
    } else {
        for (size_t t = 0; t < n; ++t) {
            float x = frame[t] * frontend->hann[t];
            in[2 * t] = x * chirp[2 * t], in[2 * t + 1] = x * chirp[2 * t + 1];
        }
        memset(in + 2 * n, 0, 2 * (fft - n) * sizeof(float));
        forward(spectrum->forward, out, in, 2 * sizeof(float));
        float const *kernel = frontend->kernel;
        for (size_t j = 0; j < fft; ++j) {
            float re = out[2 * j], im = out[2 * j + 1], kr = kernel[2 * j], ki = kernel[2 * j + 1];
            in[2 * j] = re * kr - im * ki, in[2 * j + 1] = re * ki + im * kr;
        }
        /* X_k = c_k conv_k, and |c_k| = 1: the power is that of the convolution. */
        ((av_tx_fn)spectrum->inverse_fn)(spectrum->inverse, out, in, 2 * sizeof(float));
    }
    for (size_t k = 0; k < frontend->bins; ++k) {
        double const re = out[2 * k], im = out[2 * k + 1];
        spectrum->power[k] = re * re + im * im;
    }
}

void audio_log_mel(audio_frontend_t const *frontend, audio_spectrum_t *spectrum, float const *samples,
                   size_t frames, float *log_mel) {
    size_t const mels = frontend->mels;
    for (size_t f = 0; f < frames; ++f) {
        frame_power(frontend, spectrum, samples + f * frontend->hop);
        float *row = log_mel + f * mels;
        for (size_t m = 0; m < mels; ++m) {
            double mel = 0;
            float const *weights = frontend->weights + frontend->start[m];
            double const *power = spectrum->power + frontend->first[m];
            for (size_t k = 0; k < frontend->count[m]; ++k)
                mel += weights[k] * power[k];
            row[m] = (float)log10(mel > AUDIO_LOG_FLOOR ? mel : AUDIO_LOG_FLOOR);
        }
    }
}

/* ---- Resampling --------------------------------------------------------------------------------- */

uform_status_t audio_resample(audio_frontend_t const *frontend, float const *samples, size_t length,
                              size_t in_rate, float *clip, size_t count) {
    if (in_rate == frontend->rate) {
        size_t copied = length < count ? length : count;
        memcpy(clip, samples, copied * sizeof(float));
        memset(clip + copied, 0, (count - copied) * sizeof(float));
        return UFORM_OK;
    }
    if (in_rate == 0 || in_rate > UFORM_AUDIO_MAX_RATE) return UFORM_INVALID_ARGUMENT;
    ffmpeg_log_route(); /* swresample logs */
    SwrContext *swr = NULL;
    AVChannelLayout mono = AV_CHANNEL_LAYOUT_MONO;
    int error = swr_alloc_set_opts2(&swr, &mono, AV_SAMPLE_FMT_FLT, (int)frontend->rate, &mono,
                                    AV_SAMPLE_FMT_FLT, (int)in_rate, 0, NULL);
    if (error >= 0) error = swr_init(swr);
    size_t made = 0, fed = 0;
    /* Pieces of at most 2^20 samples each way: swr_convert counts in int. */
    size_t const piece = (size_t)1 << 20;
    while (error >= 0 && made < count && fed < length) {
        size_t in = length - fed < piece ? length - fed : piece;
        size_t out = count - made < piece ? count - made : piece;
        uint8_t const *source = (uint8_t const *)(samples + fed);
        uint8_t *target = (uint8_t *)(clip + made);
        error = swr_convert(swr, &target, (int)out, &source, (int)in);
        if (error >= 0) made += (size_t)error, fed += in;
    }
    while (error >= 0 && made < count) { /* the filter's tail, until it gives nothing more */
        size_t out = count - made < piece ? count - made : piece;
        uint8_t *target = (uint8_t *)(clip + made);
        error = swr_convert(swr, &target, (int)out, NULL, 0);
        if (error == 0) break;
        if (error > 0) made += (size_t)error;
    }
    swr_free(&swr);
    if (error < 0) return error == AVERROR(ENOMEM) ? UFORM_OUT_OF_MEMORY : UFORM_INVALID_ARGUMENT;
    memset(clip + made, 0, (count - made) * sizeof(float));
    return UFORM_OK;
}
