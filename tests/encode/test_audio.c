/* audio_encode and audio_encode_samples through the public interface: outputs and their shapes (token
 * vectors packed per clip), tones and silence, lengths (shorter than a window, shorter than a patch,
 * exactly one patch, longer than `seconds`), any rate (1 Hz to UFORM_AUDIO_MAX_RATE, 8000, 44100 and
 * 48000 Hz against the model's own), NaN and infinite samples, a rate of 0, clips that do not depend on
 * their batch, bitwise determinism across thread counts and receivers, WAV files written here (RIFF
 * header and PCM16, mono and stereo) read from files and from memory against the samples they hold, and
 * bad sounds that fail alone (a text file, WAVs cut in their header and in their samples, an empty file,
 * a zero-length clip, files with no audio stream, a hostile rate, NaN in a float WAV, a missing file, a
 * folder, an empty path), chunked reads, progress and cancellation, decoding overlapped with compute
 * (each chunk after the first decoded ahead on RAM executors of 2 threads or more), conversions, bad
 * arguments. The
 * front end is checked here against a naive DFT and resampling a clip's start against resampling it
 * whole; numbers against PyTorch are checked by tests/reference/test_audio_reference.py. Without FFmpeg
 * only the arguments and the UNSUPPORTED answers are checked. */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kernels.h"
#include "fixtures.h"
#include "kernels.h"
#include "media_overlap.h"
#if UFORM_WITH_FFMPEG
#include <libavutil/log.h>

#include "audio_frontend.h"
#include "ffmpeg_io.h"
#endif

static uform_model_t *model;
static uform_model_info_t info;

/* ---- Sounds, WAV files, batches ------------------------------------------------------------------ */

typedef struct sound {
    float *samples;
    size_t length;
} sound_t;

/* Two tones, a slow glide and a little noise, different per seed: every mel band gets energy. */
static sound_t sound_make(size_t length, size_t rate, unsigned seed) {
    sound_t sound = {malloc(length * sizeof(float) + sizeof(float)), length};
    assert_non_null(sound.samples);
    double const pi = 3.14159265358979323846;
    uint64_t noise = 0x9E3779B97F4A7C15ull * (seed + 1);
    for (size_t i = 0; i < length; ++i) {
        double t = (double)i / (double)rate;
        noise = noise * 6364136223846793005ull + 1442695040888963407ull;
        double white = (double)(noise >> 11) * 0x1p-53 - 0.5;
        sound.samples[i] =
            (float)(0.3 * sin(2 * pi * (220.0 + 40 * seed) * t) +
                    0.2 * sin(2 * pi * (1500.0 + 300 * seed) * t + 0.3 * t * t * 1000) + 0.05 * white);
    }
    return sound;
}

static uform_status_t batch_encode(batch_t const *batch, uform_executor_t *executor, uform_outputs_t outputs,
                                   uform_arena_t *arena, uform_encode_config_t const *config,
                                   uform_outcome_t *outcome, uform_encoded_t *encoded) {
    if (batch->kind == BATCH_SAMPLES) {
        uform_audio_encode_samples_args_t args = {ENCODE_ARGS(model), .samples = batch_tape(batch),
                                                  .rate = batch->rate};
        return uform_audio_encode_samples(&args);
    }
    uform_audio_encode_args_t args = {ENCODE_ARGS(model), .sounds = batch_tape(batch),
                                      .source = batch->source};
    return uform_audio_encode(&args);
}

#if UFORM_WITH_FFMPEG

static sound_t sound_zero(size_t length) {
    sound_t sound = {calloc(length + 1, sizeof(float)), length};
    assert_non_null(sound.samples);
    return sound;
}

/* The samples a PCM16 WAV of `sound` holds: round(x * 32767) / 32768, as FFmpeg reads them back. */
static int16_t pcm16_of(float x) {
    double scaled = round((double)x * 32767);
    return (int16_t)(scaled > 32767 ? 32767 : scaled < -32768 ? -32768 : scaled);
}

static void put_le(uint8_t *target, uint32_t value, size_t bytes) {
    for (size_t i = 0; i < bytes; ++i)
        target[i] = (uint8_t)(value >> (8 * i));
}

/* A plain RIFF WAVE: a 16-byte fmt chunk (PCM, 16 bits) and the data chunk; `channels` copies of the
 * sound, the second one scaled by `second_gain`. */
static blob_t wav_of(sound_t const *sound, size_t rate, size_t channels, float second_gain) {
    size_t data = sound->length * channels * 2;
    blob_t blob = {malloc(44 + data), 44 + data};
    assert_non_null(blob.data);
    uint8_t *h = blob.data;
    memcpy(h, "RIFF", 4), put_le(h + 4, (uint32_t)(36 + data), 4), memcpy(h + 8, "WAVE", 4);
    memcpy(h + 12, "fmt ", 4), put_le(h + 16, 16, 4), put_le(h + 20, 1, 2),
        put_le(h + 22, (uint32_t)channels, 2);
    put_le(h + 24, (uint32_t)rate, 4), put_le(h + 28, (uint32_t)(rate * channels * 2), 4);
    put_le(h + 32, (uint32_t)(channels * 2), 2), put_le(h + 34, 16, 2);
    memcpy(h + 36, "data", 4), put_le(h + 40, (uint32_t)data, 4);
    for (size_t i = 0; i < sound->length; ++i)
        for (size_t c = 0; c < channels; ++c)
            put_le(h + 44 + (i * channels + c) * 2,
                   (uint16_t)pcm16_of(c == 1 ? sound->samples[i] * second_gain : sound->samples[i]), 2);
    return blob;
}

/* A mono WAV of IEEE floats (format 3, 32 bits), the samples as they stand: NaN survives. */
static blob_t float_wav_of(sound_t const *sound, size_t rate) {
    size_t data = sound->length * 4;
    blob_t blob = {malloc(44 + data), 44 + data};
    assert_non_null(blob.data);
    uint8_t *h = blob.data;
    memcpy(h, "RIFF", 4), put_le(h + 4, (uint32_t)(36 + data), 4), memcpy(h + 8, "WAVE", 4);
    memcpy(h + 12, "fmt ", 4), put_le(h + 16, 16, 4), put_le(h + 20, 3, 2), put_le(h + 22, 1, 2);
    put_le(h + 24, (uint32_t)rate, 4), put_le(h + 28, (uint32_t)(rate * 4), 4);
    put_le(h + 32, 4, 2), put_le(h + 34, 32, 2);
    memcpy(h + 36, "data", 4), put_le(h + 40, (uint32_t)data, 4);
    memcpy(h + 44, sound->samples, data);
    return blob;
}

/* The mono samples FFmpeg gives for a mono PCM16 WAV of `sound`. */
static sound_t wav_samples(sound_t const *sound) {
    sound_t read = {malloc(sound->length * sizeof(float) + sizeof(float)), sound->length};
    assert_non_null(read.samples);
    for (size_t i = 0; i < sound->length; ++i)
        read.samples[i] = (float)pcm16_of(sound->samples[i]) / 32768.0f;
    return read;
}

static batch_t *samples_batch(size_t rate) {
    batch_t *batch = batch_new(BATCH_SAMPLES);
    batch->rate = rate;
    return batch;
}

static void batch_add_sound(batch_t *batch, sound_t const *sound) {
    batch_add(batch, sound->samples, sound->length);
}

static void batch_add_blob(batch_t *batch, blob_t const *blob) {
    batch_add(batch, blob->data, blob->size);
}

/* ---- Comparisons -------------------------------------------------------------------------------- */

static size_t token_count(uform_encoded_t const *encoded, size_t item) {
    return encoded->token_vectors.item_offsets[item + 1] - encoded->token_vectors.item_offsets[item];
}

/* A clip that failed: zero rows, and no token vectors at all. */
static void assert_failed_clip(uform_encoded_t const *encoded, size_t i) {
    assert_zero_item(encoded, i);
    if (encoded->token_vectors.data) assert_int_equal(token_count(encoded, i), 0);
}

/* ---- The model's geometry ----------------------------------------------------------------------- */

static size_t one_patch(void) { /* samples one patch spans */
    return info.audio.window + (info.audio.patch_frames - 1) * info.audio.hop;
}

static size_t reach(void) {
    size_t limit = (size_t)floor(info.audio.seconds * (double)info.audio.rate);
    size_t span = info.audio.window + (info.audio.max_patches * info.audio.patch_frames - 1) * info.audio.hop;
    return span < limit ? span : limit;
}

/* Patches of a clip of `length` samples at the model's rate. */
static size_t patches_of(size_t length) {
    if (length > reach()) length = reach();
    if (length < info.audio.window) return 0;
    size_t patches = (1 + (length - info.audio.window) / info.audio.hop) / info.audio.patch_frames;
    return patches < info.audio.max_patches ? patches : info.audio.max_patches;
}

/* Frees what `count` sounds hold. */
static void sounds_free(sound_t *sounds, size_t count) {
    for (size_t i = 0; i < count; ++i)
        free(sounds[i].samples);
}

/* ---- Tests -------------------------------------------------------------------------------------- */

/* Lengths around the edges at the model's rate: nothing, shorter than a window, one sample short of a
 * patch, exactly one patch, a few patches, exactly the reach, exactly `seconds`, and longer. */
static batch_t *varied_lengths(sound_t *sounds, size_t *count) {
    size_t const rate = info.audio.rate, patch = one_patch();
    size_t const lengths[] = {0,
                              info.audio.window - 1,
                              patch - 1,
                              patch,
                              5000,
                              reach(),
                              (size_t)(info.audio.seconds * (double)rate),
                              3 * rate + 17};
    *count = sizeof lengths / sizeof lengths[0];
    batch_t *batch = samples_batch(rate);
    for (size_t i = 0; i < *count; ++i) {
        sounds[i] = sound_make(lengths[i], rate, (unsigned)i);
        batch_add_sound(batch, &sounds[i]);
    }
    return batch;
}

/* Regression, ffmpeg_log_setting_raced_the_first_transform: FFmpeg's log callback was installed only
 * where a demuxer opened, so a thread setting up its spectrum transform (av_tx_init, which logs) while
 * another opened the first demuxer read the callback's setting unordered, a data race ThreadSanitizer
 * reports. The transform thread here waits on a relaxed flag, which orders nothing: only the engine's
 * own ordering keeps the two apart. Runs first, before any other case routes the log. */
static atomic_bool demuxer_opened;

static void *open_first_demuxer(void *unused) {
    (void)unused;
    static uint8_t const junk[64];
    ffmpeg_memory_t memory;
    assert_int_equal(ffmpeg_memory_open(&memory, junk, sizeof junk, 4096), UFORM_FORMAT);
    ffmpeg_memory_close(&memory);
    atomic_store_explicit(&demuxer_opened, true, memory_order_relaxed);
    return NULL;
}

static void *set_up_transform(void *unused) {
    (void)unused;
    while (!atomic_load_explicit(&demuxer_opened, memory_order_relaxed))
        sched_yield();
    audio_frontend_t frontend;
    audio_spectrum_t spectrum;
    assert_int_equal(audio_frontend_init(&frontend, &info), UFORM_OK);
    assert_int_equal(audio_spectrum_init(&spectrum, &frontend), UFORM_OK);
    audio_spectrum_free(&spectrum);
    audio_frontend_free(&frontend);
    return NULL;
}

static void ffmpeg_log_setting_raced_the_first_transform(void **state) {
    (void)state;
    pthread_t transform, demuxer;
    assert_int_equal(pthread_create(&transform, NULL, set_up_transform, NULL), 0);
    assert_int_equal(pthread_create(&demuxer, NULL, open_first_demuxer, NULL), 0);
    assert_int_equal(pthread_join(demuxer, NULL), 0);
    assert_int_equal(pthread_join(transform, NULL), 0);
}

static void samples_outputs_have_their_shapes(void **state) {
    (void)state;
    sound_t sounds[16];
    size_t count = 0;
    batch_t *batch = varied_lengths(sounds, &count);
    uform_arena_t *arena = arena_on_host();
    uform_encode_stats_t stats;
    uform_encode_config_t config = {.stats = &stats};
    uform_encoded_t encoded;
    assert_int_equal(batch_encode(batch, NULL, EVERYTHING, arena, &config, NULL, &encoded), UFORM_OK);
    assert_int_equal(encoded.items, count);
    assert_int_equal(encoded.embeddings.rows, count);
    assert_int_equal(encoded.embeddings.columns, info.dims);
    assert_int_equal(encoded.states.columns, info.audio.transformer.hidden);
    assert_int_equal(encoded.token_vectors.items, count);
    size_t failed = 0, truncated = 0, rows = 0;
    for (size_t i = 0; i < count; ++i) {
        size_t patches = patches_of(sounds[i].length);
        assert_int_equal(encoded.token_vectors.item_offsets[i], rows);
        assert_int_equal(token_count(&encoded, i), patches);
        rows += patches;
        truncated += sounds[i].length > reach();
        if (patches == 0) {
            assert_int_equal(encoded.statuses[i], UFORM_INVALID_ARGUMENT);
            assert_failed_clip(&encoded, i);
            failed++;
            continue;
        }
        assert_int_equal(encoded.statuses[i], UFORM_OK);
        assert_true(fabs(norm_of(row_of(&encoded.embeddings, i), info.dims) - 1) < 1e-4);
        for (size_t r = 0; r < patches; ++r)
            assert_true(
                fabs(norm_of(row_of(&encoded.token_vectors, encoded.token_vectors.item_offsets[i] + r),
                             info.dims) -
                     1) < 1e-4);
    }
    assert_int_equal(encoded.token_vectors.rows, rows);
    assert_int_equal(encoded.token_vectors.item_offsets[count], rows);
    assert_int_equal(failed, 3);
    assert_int_equal(truncated, 2);
    assert_int_equal(stats.items, count);
    assert_int_equal(stats.failed, failed);
    assert_int_equal(stats.truncated, truncated);
    assert_int_equal(stats.bytes, batch->bytes);
    /* Exactly the reach and longer clips keep the same samples: the same rows. */
    sound_t longer = sound_make(4 * info.audio.rate, info.audio.rate, 5);
    batch_t *cut = samples_batch(info.audio.rate);
    batch_add(cut, longer.samples, reach());
    batch_add_sound(cut, &longer);
    uform_encoded_t same;
    assert_int_equal(batch_encode(cut, NULL, EVERYTHING, arena, &config, NULL, &same), UFORM_OK);
    assert_same_item(&same, 0, &same, 1);
    assert_int_equal(stats.truncated, 1);
    batch_free(cut);
    free(longer.samples);
    uform_arena_free(arena);
    batch_free(batch);
    sounds_free(sounds, count);
}

/* Silence is a valid clip whose log-mel is the floor everywhere; a tone is not silence. */
static void tones_and_silence(void **state) {
    (void)state;
    size_t const rate = info.audio.rate;
    sound_t silence = sound_zero(rate), tone = sound_make(rate, rate, 3), quiet = sound_make(rate, rate, 3);
    for (size_t i = 0; i < quiet.length; ++i)
        quiet.samples[i] *= 1e-3f;
    batch_t *batch = samples_batch(rate);
    batch_add_sound(batch, &silence);
    batch_add_sound(batch, &tone);
    batch_add_sound(batch, &quiet);
    uform_arena_t *arena = arena_on_host();
    uform_encoded_t encoded;
    assert_int_equal(batch_encode(batch, NULL, EVERYTHING, arena, NULL, NULL, &encoded), UFORM_OK);
    for (size_t i = 0; i < 3; ++i) {
        assert_int_equal(encoded.statuses[i], UFORM_OK);
        float const *row = row_of(&encoded.embeddings, i);
        for (size_t j = 0; j < info.dims; ++j)
            assert_true(isfinite(row[j]));
    }
    assert_true(cosine_of(row_of(&encoded.embeddings, 0), row_of(&encoded.embeddings, 1), info.dims) <
                0.9999);
    assert_true(cosine_of(row_of(&encoded.embeddings, 1), row_of(&encoded.embeddings, 2), info.dims) <
                0.9999);

    audio_frontend_t frontend;
    audio_spectrum_t spectrum;
    assert_int_equal(audio_frontend_init(&frontend, &info), UFORM_OK);
    assert_int_equal(audio_spectrum_init(&spectrum, &frontend), UFORM_OK);
    size_t frames = audio_frames(&frontend, silence.length);
    float *log_mel = malloc(frames * frontend.mels * sizeof(float));
    assert_non_null(log_mel);
    audio_log_mel(&frontend, &spectrum, silence.samples, frames, log_mel);
    for (size_t i = 0; i < frames * frontend.mels; ++i)
        assert_true(log_mel[i] == -10.0f);
    free(log_mel);
    audio_spectrum_free(&spectrum);
    audio_frontend_free(&frontend);
    uform_arena_free(arena);
    batch_free(batch);
    free(silence.samples), free(tone.samples), free(quiet.samples);
}

/* The naive DFT in double, the HTK triangles written again, log10 of the floored sum. */
static void naive_log_mel(audio_frontend_t const *frontend, float const *samples, size_t frames,
                          double *out) {
    double const pi = 3.14159265358979323846;
    size_t const window = frontend->window, bins = window / 2 + 1, rate = frontend->rate;
    double *power = malloc(bins * sizeof(double));
    assert_non_null(power);
    double top = 2595.0 * log10(1.0 + (double)rate / 2 / 700.0);
    for (size_t f = 0; f < frames; ++f) {
        for (size_t k = 0; k < bins; ++k) {
            double re = 0, im = 0;
            for (size_t t = 0; t < window; ++t) {
                double x =
                    samples[f * frontend->hop + t] * (0.5 - 0.5 * cos(2 * pi * (double)t / (double)window));
                re += x * cos(2 * pi * (double)(k * t % window) / (double)window);
                im -= x * sin(2 * pi * (double)(k * t % window) / (double)window);
            }
            power[k] = re * re + im * im;
        }
        for (size_t m = 0; m < frontend->mels; ++m) {
            double edge[3];
            for (size_t e = 0; e < 3; ++e)
                edge[e] =
                    700.0 * (pow(10.0, top * (double)(m + e) / (double)(frontend->mels + 1) / 2595.0) - 1);
            double mel = 0;
            for (size_t k = 0; k < bins; ++k) {
                double hz = (double)k * (double)rate / (double)window;
                double w = fmin((hz - edge[0]) / (edge[1] - edge[0]), (edge[2] - hz) / (edge[2] - edge[1]));
                if (w > 0) mel += w * power[k];
            }
            out[f * frontend->mels + m] = log10(fmax(mel, 1e-10));
        }
    }
    free(power);
}

/* The front end against the naive transform for windows of 0, 2 (which libavutil 57's real transform
 * gets wrong) and 1 mod 4, and both sides of the model's shapes. */
static void log_mel_against_a_naive_dft(void **state) {
    (void)state;
    struct {
        size_t rate, mels, window, hop;
    } const shapes[] = {
        {16000, 32, 400, 160}, {16000, 40, 398, 100}, {8000, 20, 201, 80}, {22050, 64, 512, 256}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s) {
        uform_model_info_t custom = info;
        custom.audio.rate = shapes[s].rate, custom.audio.mels = shapes[s].mels;
        custom.audio.window = shapes[s].window, custom.audio.hop = shapes[s].hop;
        audio_frontend_t frontend;
        audio_spectrum_t spectrum;
        assert_int_equal(audio_frontend_init(&frontend, &custom), UFORM_OK);
        assert_int_equal(audio_spectrum_init(&spectrum, &frontend), UFORM_OK);
        sound_t sound = sound_make(frontend.window + 5 * frontend.hop, frontend.rate, (unsigned)s);
        size_t frames = audio_frames(&frontend, sound.length);
        assert_int_equal(frames, 6);
        float *got = malloc(frames * frontend.mels * sizeof(float));
        double *want = malloc(frames * frontend.mels * sizeof(double));
        assert_non_null(got), assert_non_null(want);
        audio_log_mel(&frontend, &spectrum, sound.samples, frames, got);
        naive_log_mel(&frontend, sound.samples, frames, want);
        double worst = 0;
        for (size_t i = 0; i < frames * frontend.mels; ++i)
            worst = fmax(worst, fabs(got[i] - want[i]));
        printf("  window %zu (%s): log-mel within %.2e of the naive DFT\n", frontend.window,
               frontend.chirp ? "Bluestein" : "direct", worst);
        if (worst > 1e-4) fail_msg("window %zu: log-mel off by %g", frontend.window, worst);
        free(got), free(want), free(sound.samples);
        audio_spectrum_free(&spectrum);
        audio_frontend_free(&frontend);
    }
}

/* Resampling a clip's first samples gives what resampling the whole clip gives, over the reach; and
 * the engine resamples from any rate. */
static void any_rate(void **state) {
    (void)state;
    audio_frontend_t frontend;
    assert_int_equal(audio_frontend_init(&frontend, &info), UFORM_OK);
    size_t const rates[] = {8000, 22050, 44100, 48000, 96000, 11025};
    for (size_t r = 0; r < sizeof rates / sizeof rates[0]; ++r) {
        sound_t sound = sound_make(4 * rates[r], rates[r], (unsigned)r);
        size_t needed = audio_input_needed(&frontend, rates[r]);
        assert_true(needed < sound.length);
        assert_true(audio_resampled_length(&frontend, needed, rates[r]) > frontend.reach);
        float *whole = malloc(frontend.reach * sizeof(float)),
              *prefix = malloc(frontend.reach * sizeof(float));
        assert_non_null(whole), assert_non_null(prefix);
        assert_int_equal(
            audio_resample(&frontend, sound.samples, sound.length, rates[r], whole, frontend.reach),
            UFORM_OK);
        assert_int_equal(audio_resample(&frontend, sound.samples, needed, rates[r], prefix, frontend.reach),
                         UFORM_OK);
        assert_memory_equal(whole, prefix, frontend.reach * sizeof(float));
        free(whole), free(prefix), free(sound.samples);
    }
    audio_frontend_free(&frontend);

    /* One second of the same sound at 8, 16, 44.1 and 48 kHz: the rows of a clip resampled from each
     * rate are close to those of the clip at the model's rate. */
    size_t const inputs[] = {8000, 44100, 48000};
    sound_t native = sound_make(info.audio.rate, info.audio.rate, 9);
    for (size_t i = 0; i < native.length; ++i) /* band-limited under 4 kHz, so 8 kHz keeps it all */
        native.samples[i] =
            (float)(0.4 * sin(2 * 3.14159265358979 * 440 * (double)i / (double)info.audio.rate) +
                    0.3 * sin(2 * 3.14159265358979 * 1234 * (double)i / (double)info.audio.rate));
    uform_arena_t *arena = arena_on_host(), *native_arena = arena_on_host();
    batch_t *reference = samples_batch(info.audio.rate);
    batch_add_sound(reference, &native);
    uform_encoded_t expected, encoded;
    assert_int_equal(batch_encode(reference, NULL, EVERYTHING, native_arena, NULL, NULL, &expected),
                     UFORM_OK);
    for (size_t r = 0; r < sizeof inputs / sizeof inputs[0]; ++r) {
        sound_t sound = sound_make(inputs[r], inputs[r], 9);
        for (size_t i = 0; i < sound.length; ++i)
            sound.samples[i] =
                (float)(0.4 * sin(2 * 3.14159265358979 * 440 * (double)i / (double)inputs[r]) +
                        0.3 * sin(2 * 3.14159265358979 * 1234 * (double)i / (double)inputs[r]));
        batch_t *batch = samples_batch(inputs[r]);
        batch_add_sound(batch, &sound);
        assert_int_equal(batch_encode(batch, NULL, EVERYTHING, arena, NULL, NULL, &encoded), UFORM_OK);
        assert_int_equal(encoded.statuses[0], UFORM_OK);
        assert_int_equal(token_count(&encoded, 0), patches_of(info.audio.rate));
        double cosine = cosine_of(row_of(&encoded.embeddings, 0), row_of(&expected.embeddings, 0), info.dims);
        printf("  %zu Hz: cosine %.6f to the clip at the model's rate\n", inputs[r], cosine);
        if (cosine < 0.99) fail_msg("%zu Hz: cosine %f to the clip at the model's rate", inputs[r], cosine);
        batch_free(batch);
        free(sound.samples);
    }
    batch_free(reference);
    free(native.samples);
    uform_arena_free(arena);
    uform_arena_free(native_arena);
}

/* NaN and infinities anywhere fail their item alone; a rate of 0 or past the limit fails the call. */
static void nan_inf_and_bad_rates(void **state) {
    (void)state;
    size_t const rate = info.audio.rate;
    sound_t good = sound_make(rate, rate, 1), other = sound_make(rate / 2, rate, 2);
    sound_t nan_first = sound_make(rate, rate, 3), inf_middle = sound_make(rate, rate, 4),
            inf_late = sound_make(3 * rate, rate, 5);
    nan_first.samples[0] = NAN;
    inf_middle.samples[rate / 2] = INFINITY;
    inf_late.samples[3 * rate - 1] = -INFINITY; /* past the reach: still read, still refused */
    batch_t *batch = samples_batch(rate), *alone = samples_batch(rate);
    sound_t const *order[] = {&nan_first, &good, &inf_middle, &other, &inf_late};
    for (size_t i = 0; i < 5; ++i)
        batch_add_sound(batch, order[i]);
    batch_add_sound(alone, &good);
    batch_add_sound(alone, &other);
    uform_arena_t *arena = arena_on_host(), *alone_arena = arena_on_host();
    uform_encoded_t encoded, expected;
    uform_encode_stats_t stats;
    uform_encode_config_t config = {.stats = &stats};
    assert_int_equal(batch_encode(batch, NULL, EVERYTHING, arena, &config, NULL, &encoded), UFORM_OK);
    assert_int_equal(batch_encode(alone, NULL, EVERYTHING, alone_arena, NULL, NULL, &expected), UFORM_OK);
    uform_status_t const statuses[] = {UFORM_INVALID_ARGUMENT, UFORM_OK, UFORM_INVALID_ARGUMENT, UFORM_OK,
                                       UFORM_INVALID_ARGUMENT};
    for (size_t i = 0; i < 5; ++i) {
        assert_int_equal(encoded.statuses[i], statuses[i]);
        if (statuses[i] != UFORM_OK) assert_failed_clip(&encoded, i);
    }
    assert_same_item(&encoded, 1, &expected, 0);
    assert_same_item(&encoded, 3, &expected, 1);
    assert_int_equal(stats.failed, 3);

    /* A rate of 0 or past UFORM_AUDIO_MAX_RATE: the call is refused, blocking and deferred alike. */
    size_t const bad_rates[] = {0, UFORM_AUDIO_MAX_RATE + 1};
    char const *messages[] = {"rate is 0", "rate over UFORM_AUDIO_MAX_RATE"};
    for (size_t r = 0; r < 2; ++r) {
        batch->rate = bad_rates[r];
        assert_int_equal(batch_encode(batch, NULL, EVERYTHING, arena, NULL, NULL, &encoded),
                         UFORM_INVALID_ARGUMENT);
        assert_string_equal(uform_last_error().message, messages[r]);
        uform_outcome_t outcome;
        uform_outcome_init(&outcome);
        assert_int_equal(batch_encode(batch, NULL, EVERYTHING, arena, NULL, &outcome, NULL),
                         UFORM_INVALID_ARGUMENT);
        assert_int_equal(uform_outcome_status(&outcome), UFORM_INVALID_ARGUMENT);
        uform_outcome_destroy(&outcome);
    }
    /* The lowest and highest rates work. */
    sound_t tiny = sound_make(1, 1, 0);
    batch_t *slow = samples_batch(1);
    batch_add_sound(slow, &tiny);
    assert_int_equal(batch_encode(slow, NULL, EVERYTHING, arena, NULL, NULL, &encoded), UFORM_OK);
    assert_int_equal(encoded.statuses[0], UFORM_OK); /* 1 sample at 1 Hz: a second at the model's rate */
    assert_int_equal(token_count(&encoded, 0), patches_of(info.audio.rate));
    sound_t fast = sound_make(UFORM_AUDIO_MAX_RATE / 4, UFORM_AUDIO_MAX_RATE, 0);
    batch_t *quick = samples_batch(UFORM_AUDIO_MAX_RATE);
    batch_add_sound(quick, &fast);
    assert_int_equal(batch_encode(quick, NULL, EVERYTHING, arena, NULL, NULL, &encoded), UFORM_OK);
    assert_int_equal(encoded.statuses[0], UFORM_OK);
    assert_int_equal(token_count(&encoded, 0), patches_of(info.audio.rate / 4));

    /* An item claiming more than UFORM_AUDIO_MAX_SAMPLES fails before a sample is read. */
    size_t huge_offsets[] = {0, UFORM_AUDIO_MAX_SAMPLES + 1, UFORM_AUDIO_MAX_SAMPLES + 1 + good.length};
    uform_audio_encode_samples_args_t huge = {
        .model = model,
        .outputs = EVERYTHING,
        .arena = arena,
        .encoded = &encoded,
        .samples = {good.samples, huge_offsets, 1, UFORM_AUDIO_MAX_SAMPLES + 1},
        .rate = rate};
    assert_int_equal(uform_audio_encode_samples(&huge), UFORM_OK);
    assert_int_equal(encoded.statuses[0], UFORM_INVALID_ARGUMENT);
    batch_free(slow), batch_free(quick), free(tiny.samples), free(fast.samples);
    uform_arena_free(arena);
    uform_arena_free(alone_arena);
    batch_free(batch);
    batch_free(alone);
    for (size_t i = 0; i < 5; ++i)
        free(order[i]->samples);
}

/* A clip's rows do not depend on the rest of its batch, nor on the receiver or thread count. */
static void a_clip_does_not_depend_on_its_batch(void **state) {
    (void)state;
    sound_t sounds[16];
    size_t count = 0;
    batch_t *batch = varied_lengths(sounds, &count);
    uform_arena_t *arena = arena_on_host(), *alone_arena = arena_on_host();
    uform_encoded_t encoded, alone;
    assert_int_equal(batch_encode(batch, NULL, EVERYTHING, arena, NULL, NULL, &encoded), UFORM_OK);
    for (size_t i = 0; i < count; ++i) {
        batch_t *one = samples_batch(info.audio.rate);
        batch_add_sound(one, &sounds[i]);
        assert_int_equal(batch_encode(one, NULL, EVERYTHING, alone_arena, NULL, NULL, &alone), UFORM_OK);
        assert_same_item(&encoded, i, &alone, 0);
        batch_free(one);
    }
    /* Reversed, and 40 clips so that chunks hold several. */
    batch_t *many = samples_batch(info.audio.rate);
    for (size_t i = 0; i < 40; ++i)
        batch_add_sound(many, &sounds[(count - 1 - i % count)]);
    uform_encoded_t reversed;
    assert_int_equal(batch_encode(many, NULL, EVERYTHING, alone_arena, NULL, NULL, &reversed), UFORM_OK);
    for (size_t i = 0; i < 40; ++i)
        assert_same_item(&reversed, i, &encoded, count - 1 - i % count);

    /* RAM executors of 1 and 3 threads, blocking and deferred: bitwise the calling thread's. */
    for (size_t threads = 1; threads <= 3; threads += 2) {
        uform_executor_t *ram = ram_executor(threads, false);
        uform_arena_t *ram_arena = NULL;
        assert_int_equal(uform_arena_create(ram, &ram_arena), UFORM_OK);
        uform_encoded_t on_ram;
        assert_int_equal(batch_encode(many, ram, EVERYTHING, ram_arena, NULL, NULL, &on_ram), UFORM_OK);
        for (size_t i = 0; i < 40; ++i)
            assert_same_item(&on_ram, i, &reversed, i);
        uform_outcome_t outcome;
        uform_outcome_init(&outcome);
        assert_int_equal(batch_encode(many, ram, EVERYTHING, ram_arena, NULL, &outcome, NULL), UFORM_OK);
        assert_int_equal(uform_outcome_wait(&outcome), UFORM_OK);
        assert_int_equal(uform_outcome_encoded(&outcome, &on_ram), UFORM_OK);
        for (size_t i = 0; i < 40; ++i)
            assert_same_item(&on_ram, i, &reversed, i);
        uform_outcome_destroy(&outcome);
        uform_arena_free(ram_arena);
        uform_executor_free(ram);
    }
    batch_free(many);
    uform_arena_free(arena);
    uform_arena_free(alone_arena);
    batch_free(batch);
    sounds_free(sounds, count);
}

/* WAV files, from files and from memory, give what their samples give: bitwise for mono PCM16 (FFmpeg
 * reads x / 32768, and the mean of one channel is itself), the mean of the channels for stereo. */
static void wav_files_and_memory_match_their_samples(void **state) {
    (void)state;
    size_t const rates[] = {info.audio.rate, 44100, 8000};
    for (size_t r = 0; r < 3; ++r) {
        size_t rate = rates[r];
        sound_t sound = sound_make(rate + rate / 3, rate, (unsigned)r), read = wav_samples(&sound);
        blob_t mono = wav_of(&sound, rate, 1, 0), stereo = wav_of(&sound, rate, 2, 0.5f);
        char mono_name[64], stereo_name[64];
        snprintf(mono_name, sizeof mono_name, "mono-%zu.wav", rate);
        snprintf(stereo_name, sizeof stereo_name, "stereo-%zu.wav", rate);
        blob_write(mono_name, &mono);
        blob_write(stereo_name, &stereo);
        sound_t mean = {malloc(sound.length * sizeof(float)), sound.length};
        assert_non_null(mean.samples);
        for (size_t i = 0; i < sound.length; ++i)
            mean.samples[i] = ((float)pcm16_of(sound.samples[i]) / 32768.0f +
                               (float)pcm16_of(sound.samples[i] * 0.5f) / 32768.0f) *
                              0.5f;
        batch_t *samples = samples_batch(rate), *files = batch_new(BATCH_FILES),
                *memory = batch_new(BATCH_MEMORY);
        batch_add_sound(samples, &read);
        batch_add_sound(samples, &mean);
        batch_add_path(files, mono_name);
        batch_add_path(files, stereo_name);
        batch_add_blob(memory, &mono);
        batch_add_blob(memory, &stereo);
        uform_arena_t *arenas[3];
        uform_encoded_t encoded[3];
        uform_encode_stats_t stats[3];
        batch_t *batches[] = {samples, files, memory};
        for (size_t b = 0; b < 3; ++b) {
            uform_encode_config_t config = {.stats = &stats[b]};
            assert_int_equal(uform_arena_create_host(&arenas[b]), UFORM_OK);
            assert_int_equal(
                batch_encode(batches[b], NULL, EVERYTHING, arenas[b], &config, NULL, &encoded[b]), UFORM_OK);
            assert_int_equal(encoded[b].statuses[0], UFORM_OK);
            assert_int_equal(encoded[b].statuses[1], UFORM_OK);
        }
        assert_int_equal(stats[1].bytes, mono.size + stereo.size);
        assert_int_equal(stats[2].bytes, mono.size + stereo.size);
        for (size_t b = 1; b < 3; ++b) {
            assert_same_item(&encoded[b], 0, &encoded[0], 0);
            assert_int_equal(token_count(&encoded[b], 1), token_count(&encoded[0], 1));
            double cosine =
                cosine_of(row_of(&encoded[b].embeddings, 1), row_of(&encoded[0].embeddings, 1), info.dims);
            if (cosine < 0.99999)
                fail_msg("stereo at %zu Hz: cosine %f to the mean of its channels", rate, cosine);
        }
        for (size_t b = 0; b < 3; ++b)
            uform_arena_free(arenas[b]);
        batch_free(samples), batch_free(files), batch_free(memory);
        free(sound.samples), free(read.samples), free(mean.samples), free(mono.data), free(stereo.data);
    }
}

/* Broken and hostile sounds, each with the status it must answer, and good ones among them. */
static size_t bad_cases(file_case_t *cases) {
    size_t const rate = info.audio.rate;
    sound_t sound = sound_make(rate, rate, 7), short_sound = sound_make(one_patch() - 1, rate, 8);
    blob_t floats = float_wav_of(&sound, rate);
    sound.samples[rate / 3] = NAN;
    blob_t nan_floats = float_wav_of(&sound, rate);
    blob_t good = wav_of(&sound, rate, 1, 0), too_short = wav_of(&short_sound, rate, 1, 0);
    sound_t nothing = {NULL, 0};
    blob_t empty_clip = wav_of(&nothing, rate, 1, 0);
    blob_t hostile_rate = blob_copy(good.data, good.size);
    put_le(hostile_rate.data + 24, 3000000, 4), put_le(hostile_rate.data + 28, 6000000, 4);
    blob_t truncated_samples = blob_copy(good.data, 44 + 2 * (one_patch() - 1)); /* data chunk cut short */
    blob_t truncated_enough = blob_copy(good.data, 44 + 2 * (rate / 2) + 1);     /* half a clip, and a byte */
    char const subtitles[] = "1\n00:00:00,000 --> 00:00:01,000\nNo sound here.\n\n2\n00:00:01,500 --> "
                             "00:00:02,000\nNor here.\n";
    char const y4m[] = "YUV4MPEG2 W2 H2 F25:1 Ip A1:1 C420jpeg\nFRAME\n\x10\x10\x10\x10\x80\x80";
    size_t n = 0;
    cases[n++] = (file_case_t){"good.wav", good, UFORM_OK};
    cases[n++] = (file_case_t){"text.wav", blob_copy("this is not a sound at all\n", 27), UFORM_FORMAT};
    cases[n++] = (file_case_t){"truncated-header.wav", blob_copy(good.data, 30), UFORM_FORMAT};
    cases[n++] = (file_case_t){"truncated-samples.wav", truncated_samples, UFORM_FORMAT};
    cases[n++] = (file_case_t){"truncated-enough.wav", truncated_enough, UFORM_FORMAT};
    cases[n++] = (file_case_t){"empty.wav", blob_copy("", 0), UFORM_FORMAT};
    cases[n++] = (file_case_t){"zero-length.wav", empty_clip, UFORM_FORMAT};
    cases[n++] = (file_case_t){"too-short.wav", too_short, UFORM_FORMAT};
    cases[n++] = (file_case_t){"hostile-rate.wav", hostile_rate, UFORM_FORMAT};
    cases[n++] = (file_case_t){"subtitles.srt", blob_copy(subtitles, sizeof subtitles - 1), UFORM_FORMAT};
    cases[n++] = (file_case_t){"video.y4m", blob_copy(y4m, sizeof y4m - 1), UFORM_FORMAT};
    cases[n++] = (file_case_t){"float.wav", floats, UFORM_OK};
    cases[n++] = (file_case_t){"nan-float.wav", nan_floats, UFORM_FORMAT};
    cases[n++] = (file_case_t){"good-again.wav", blob_copy(good.data, good.size), UFORM_OK};
    cases_write(cases, n);
    free(sound.samples), free(short_sound.samples);
    return n;
}

/* Each bad sound fails alone; more files than two chunks hold are read through the ring while earlier
 * chunks compute. */
static file_cases_t sound_cases = {batch_encode, bad_cases};

static void progress_and_cancel(void **state) {
    (void)state;
    sound_t sound = sound_make(info.audio.rate / 4, info.audio.rate, 4);
    blob_t wav = wav_of(&sound, info.audio.rate, 1, 0);
    blob_write("progress.wav", &wav);
    batch_t *samples = samples_batch(info.audio.rate), *files = batch_new(BATCH_FILES);
    for (size_t i = 0; i < 200; ++i) {
        batch_add_sound(samples, &sound);
        batch_add_path(files, "progress.wav");
    }
    assert_progress_and_cancel(batch_encode, samples, UFORM_OK);
    assert_progress_and_cancel(batch_encode, files, UFORM_OK);
    batch_free(samples);
    batch_free(files);
    free(sound.samples);
    free(wav.data);
}

/* ---- Decoding ahead ------------------------------------------------------------------------------ */

/* 150 clips of three lengths, samples, WAV files and WAVs in memory, over several chunks: decoded ahead
 * while the chunk before computes (on 2 and 3 threads; not on 1), and the same bitwise on every
 * receiver. */
static void decoding_overlaps_compute(void **state) {
    (void)state;
    size_t const rate = info.audio.rate;
    sound_t sounds[3];
    batch_t *samples = samples_batch(rate), *files = batch_new(BATCH_FILES),
            *memory = batch_new(BATCH_MEMORY);
    blob_t wavs[3];
    for (size_t i = 0; i < 3; ++i) {
        sounds[i] = sound_make(rate / 4 + i * rate / 3, rate, (unsigned)i + 31);
        wavs[i] = wav_of(&sounds[i], rate, 1, 0);
        char name[32];
        snprintf(name, sizeof name, "ahead%zu.wav", i);
        blob_write(name, &wavs[i]);
    }
    for (size_t i = 0; i < 150; ++i) {
        char name[32];
        snprintf(name, sizeof name, "ahead%zu.wav", i % 3);
        batch_add_sound(samples, &sounds[i % 3]);
        batch_add_path(files, name);
        batch_add_blob(memory, &wavs[i % 3]);
    }
    for (size_t threads = 1; threads <= 3; ++threads) {
        check_decoded_ahead(batch_encode, samples, threads);
        check_decoded_ahead(batch_encode, files, threads);
        check_decoded_ahead(batch_encode, memory, threads);
    }
    assert_same_on_every_receiver(batch_encode, memory, files);
    batch_free(samples);
    batch_free(files);
    batch_free(memory);
    for (size_t i = 0; i < 3; ++i) {
        free(sounds[i].samples);
        free(wavs[i].data);
    }
}

static void conversions_and_matryoshka(void **state) {
    (void)state;
    sound_t sounds[16];
    size_t count = 0;
    batch_t *batch = varied_lengths(sounds, &count);
    assert_conversions_and_matryoshka(batch_encode, batch, EVERYTHING, &info, kernels_scalar()->convert);
    batch_free(batch);
    sounds_free(sounds, count);
}

#endif /* UFORM_WITH_FFMPEG */

/* Bad arguments fail before submission, the same way in every build; a build without FFmpeg answers
 * UNSUPPORTED for good ones. */
static void bad_arguments_fail_at_once(void **state) {
    (void)state;
    sound_t sound = sound_make(info.audio.rate, info.audio.rate, 1);
    uform_arena_t *arena = arena_on_host();
    uform_encoded_t encoded;
    size_t offsets[] = {0, sound.length}, backwards[] = {sound.length, 0}, beyond[] = {0, sound.length + 1};
    uform_audio_encode_samples_args_t good = {.model = model,
                                              .outputs = UFORM_OUTPUT_EMBEDDINGS,
                                              .arena = arena,
                                              .encoded = &encoded,
                                              .samples = {sound.samples, offsets, 1, sound.length},
                                              .rate = info.audio.rate};
    uform_status_t const expected = UFORM_WITH_FFMPEG ? UFORM_OK : UFORM_UNSUPPORTED;
    char const *const what[] = {"rate 0",     "no items",   "offsets out of order", "offsets past the tape",
                                "no outputs", "arena NULL", "misaligned samples",   "encoded NULL"};
    uform_audio_encode_samples_args_t bad[sizeof what / sizeof what[0]];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i)
        bad[i] = good;
    bad[0].rate = 0;
    bad[1].samples.count = 0;
    bad[2].samples.offsets = backwards;
    bad[3].samples.offsets = beyond;
    bad[4].outputs = 0;
    bad[5].arena = NULL;
    bad[6].samples.data = (char const *)sound.samples + 1;
    bad[7].encoded = NULL;
    assert_bad_arguments(audio_encode_samples_verb, &good, bad, sizeof bad[0], what,
                         sizeof bad / sizeof bad[0], expected);
    assert_int_equal(uform_audio_encode(NULL), UFORM_INVALID_ARGUMENT);
    assert_sources_checked(batch_encode, expected,
                           "built without FFmpeg: sounds cannot be decoded, resampled or transformed");
    uform_arena_free(arena);
    free(sound.samples);
}

/* ---- Fixtures ----------------------------------------------------------------------------------- */

static int setup(void **state) {
    (void)state;
    uform_tiny_checkpoint_args_t tiny = {.seed = 13, .depth = 2, .hidden = 128};
    return fixture_setup("audio", &tiny, &model, &info);
}

int main(void) {
    struct CMUnitTest const tests[] = {
#if UFORM_WITH_FFMPEG
        cmocka_unit_test(ffmpeg_log_setting_raced_the_first_transform), /* first: see there */
        cmocka_unit_test(samples_outputs_have_their_shapes),
        cmocka_unit_test(tones_and_silence),
        cmocka_unit_test(log_mel_against_a_naive_dft),
        cmocka_unit_test(any_rate),
        cmocka_unit_test(nan_inf_and_bad_rates),
        cmocka_unit_test(a_clip_does_not_depend_on_its_batch),
        cmocka_unit_test(wav_files_and_memory_match_their_samples),
        FILE_CASES_TESTS("bad_sounds_fail_alone", &sound_cases),
        cmocka_unit_test(progress_and_cancel),
        cmocka_unit_test(decoding_overlaps_compute),
        cmocka_unit_test(conversions_and_matryoshka),
#endif
        cmocka_unit_test(bad_arguments_fail_at_once),
    };
#if UFORM_WITH_FFMPEG
    av_log_set_level(AV_LOG_FATAL); /* the broken files are meant: FFmpeg need not say so */
#endif
    printf("kernels: %s, ffmpeg: %d\n", kernels_active()->name, UFORM_WITH_FFMPEG);
    return cmocka_run_group_tests(tests, setup, fixture_teardown);
}
