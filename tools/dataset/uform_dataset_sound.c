/* The sounds of `uform dataset synth`: pure tones, triads, bursts of coloured noise, rhythms of beeps,
 * and words spoken by espeak-ng where the build has it; written as 16-bit PCM mono WAV. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if UFORM_DATASET_WITH_ESPEAK
#include <espeak-ng/espeak_ng.h>
#endif

#include "uform_command.h"
#include "uform_dataset.h"

char const *const dataset_sound_kind_names[DATASET_SOUND_KINDS] = {"tone", "chord", "noise", "rhythm",
                                                                   "speech"};
char const *const dataset_pitch_names[DATASET_PITCHES] = {"low", "middle", "high"};
char const *const dataset_words[DATASET_WORDS] = {
    "zero", "one", "two",  "three", "four",  "five", "six", "seven", "eight", "nine", "ten", "yes",
    "no",   "up",  "down", "left",  "right", "stop", "go",  "red",   "green", "blue", "cat", "dog"};

static double const pi = 3.14159265358979323846;

/* ---- notes ------------------------------------------------------------------------------------- */

static char const *const note_names[12] = {"C",       "C sharp", "D",       "D sharp", "E",       "F",
                                           "F sharp", "G",       "G sharp", "A",       "A sharp", "B"};
static char const *const note_symbols[12] = {"C", "C#", "D", "D#", "E", "F", "F#", "G", "G#", "A", "A#", "B"};

char const *dataset_note_name(size_t note) {
    return note_names[note % 12];
}

void dataset_note_label(size_t note, char *label, size_t capacity) {
    snprintf(label, capacity, "%s%d", note_symbols[note % 12], (int)(note / 12) - 1); /* MIDI 60 is C4 */
}

static double note_frequency(size_t note) {
    return 440 * pow(2, ((double)note - 69) / 12);
}

/* ---- synthesis ------------------------------------------------------------------------------------ */

/* A linear fade in and out of `edge` seconds over `length` seconds, at `time` seconds from its start. */
static double envelope(double time, double length, double edge) {
    if (time < 0 || time >= length) return 0;
    double in = time / edge, out = (length - time) / edge;
    double level = in < out ? in : out;
    return level < 1 ? level : 1;
}

/* Adds `gain` times a sum of sines at the notes (equal weights, peak `gain`) between `start` and
 * `start + length` seconds. */
static void add_notes(float *samples, size_t count, size_t rate, size_t const *notes, size_t note_count,
                      double start, double length, double gain) {
    size_t first = (size_t)(start * (double)rate);
    for (size_t i = first; i < count; ++i) {
        double time = (double)i / (double)rate - start;
        double level = envelope(time, length, 0.01);
        if (level <= 0) {
            if (time >= length) break;
            continue;
        }
        double value = 0;
        for (size_t n = 0; n < note_count; ++n)
            value += sin(2 * pi * note_frequency(notes[n]) * time);
        samples[i] += (float)(gain * level * value / (double)note_count);
    }
}

/* A burst of noise, low (one-pole low-pass near 300 Hz: a rumble), middle (white) or high (the first
 * difference of white noise: a hiss), scaled to the peak `gain`. */
static void add_noise(float *samples, size_t count, size_t rate, size_t pitch, double start, double length,
                      double gain, random_stream_t *random) {
    size_t first = (size_t)(start * (double)rate), last = first + (size_t)(length * (double)rate);
    if (last > count) last = count;
    double smoothing = 1 - exp(-2 * pi * 300 / (double)rate), state = 0, previous = 0, peak = 0;
    for (size_t i = first; i < last; ++i) {
        double white = 2 * random_stream_unit(random) - 1, value = white;
        if (pitch == 0) value = state += smoothing * (white - state);
        if (pitch == 2) value = white - previous;
        previous = white;
        samples[i] = (float)value;
        if (fabs(value) > peak) peak = fabs(value);
    }
    for (size_t i = first; i < last; ++i) {
        double time = (double)(i - first) / (double)rate;
        samples[i] = (float)(samples[i] / (peak > 0 ? peak : 1) * gain * envelope(time, length, 0.005));
    }
}

/* A natural note (no sharps) of the register: octaves 2-3 low, 4 middle, 5 high (and 6 for tones). */
static size_t draw_note(size_t pitch, bool wide, random_stream_t *random) {
    static size_t const naturals[7] = {0, 2, 4, 5, 7, 9, 11};
    size_t octave = pitch == 0   ? 2 + random_stream_below(random, 2)
                    : pitch == 1 ? 4
                                 : 5 + (wide ? random_stream_below(random, 2) : 0);
    return 12 * (octave + 1) + naturals[random_stream_below(random, 7)];
}

/* ---- speech ---------------------------------------------------------------------------------------- */

#if UFORM_DATASET_WITH_ESPEAK

static struct speech {
    bool started, failed;
    int rate;
    short *samples;
    size_t count, capacity;
    char version[64];
} speech;

/* espeak-ng's callback in synchronous mode: appends a chunk; answering 1 stops the synthesis. */
static int speech_collect(short *chunk, int count, espeak_EVENT *events) {
    (void)events;
    if (!chunk || count <= 0) return 0;
    if (speech.count + (size_t)count > speech.capacity) {
        size_t capacity = (speech.capacity ? speech.capacity * 2 : 1 << 15) + (size_t)count;
        short *grown = realloc(speech.samples, capacity * sizeof *grown);
        if (!grown) {
            speech.failed = true;
            return 1;
        }
        speech.samples = grown;
        speech.capacity = capacity;
    }
    memcpy(speech.samples + speech.count, chunk, (size_t)count * sizeof *chunk);
    speech.count += (size_t)count;
    return 0;
}

char const *dataset_speech_start(void) {
    if (speech.started) return NULL;
    espeak_ng_InitializePath(NULL);
    espeak_ng_ERROR_CONTEXT context = NULL;
    espeak_ng_STATUS status = espeak_ng_Initialize(&context);
    espeak_ng_ClearErrorContext(&context);
    if (status != ENS_OK) return "espeak-ng did not start (is its data installed?)";
    if (espeak_ng_InitializeOutput(ENOUTPUT_MODE_SYNCHRONOUS, 0, NULL) != ENS_OK ||
        espeak_ng_SetVoiceByName("en") != ENS_OK) {
        espeak_ng_Terminate();
        return "espeak-ng has no English voice";
    }
    espeak_SetSynthCallback(speech_collect);
    speech.rate = espeak_ng_GetSampleRate();
    snprintf(speech.version, sizeof speech.version, "espeak-ng %s", espeak_Info(NULL));
    speech.started = true;
    return NULL;
}

void dataset_speech_stop(void) {
    if (speech.started) espeak_ng_Terminate();
    free(speech.samples);
    speech = (struct speech){0};
}

char const *dataset_speech_version(void) {
    return speech.started ? speech.version : NULL;
}

/* The word at espeak-ng's rate into speech.samples: base pitch 15, 50 or 85 of 100 by register. */
static int speech_say(char const *word, size_t pitch) {
    static int const pitches[DATASET_PITCHES] = {15, 50, 85};
    if (!speech.started) return command_fail("cannot speak '%s': the synthesizer is not started", word);
    speech.count = 0;
    speech.failed = false;
    if (espeak_ng_SetParameter(espeakPITCH, pitches[pitch], 0) != ENS_OK ||
        espeak_ng_SetParameter(espeakRATE, 160, 0) != ENS_OK ||
        espeak_ng_Synthesize(word, strlen(word) + 1, 0, POS_CHARACTER, 0, espeakCHARS_UTF8, NULL, NULL) !=
            ENS_OK ||
        espeak_ng_Synchronize() != ENS_OK || speech.failed)
        return command_fail("cannot speak '%s': espeak-ng failed%s", word,
                            speech.failed ? " (out of memory)" : "");
    return COMMAND_OK;
}

#else

char const *dataset_speech_start(void) {
    return "this build has no espeak-ng";
}

void dataset_speech_stop(void) {}

char const *dataset_speech_version(void) {
    return NULL;
}

#endif

/* Adds the spoken word from `start` seconds on, resampled from the synthesizer's rate to `rate` by a
 * Hann-windowed sinc of 16 taps a side, cut at the lower Nyquist frequency; scaled to the peak `gain`. */
static int add_speech(float *samples, size_t count, size_t rate, dataset_sound_t const *sound, double start,
                      double gain) {
#if UFORM_DATASET_WITH_ESPEAK
    int code = speech_say(dataset_words[sound->word], sound->pitch);
    if (code != COMMAND_OK) return code;
    enum { TAPS = 16 };
    double step = (double)speech.rate / (double)rate, cutoff = step > 1 ? 0.95 / step : 0.95, peak = 0;
    size_t first = (size_t)(start * (double)rate);
    for (size_t i = first; i < count; ++i) {
        double position = (double)(i - first) * step;
        long centre = (long)floor(position);
        if (centre - TAPS >= (long)speech.count) break;
        double value = 0;
        for (long k = centre - TAPS + 1; k <= centre + TAPS; ++k) {
            if (k < 0 || k >= (long)speech.count) continue;
            double distance = position - (double)k;
            double x = pi * cutoff * distance;
            double sinc = fabs(x) < 1e-9 ? 1 : sin(x) / x;
            double window = 0.5 + 0.5 * cos(pi * distance / TAPS);
            value += speech.samples[k] * cutoff * sinc * window;
        }
        samples[i] = (float)value;
        if (fabs(value) > peak) peak = fabs(value);
    }
    for (size_t i = first; i < count && peak > 0; ++i)
        samples[i] = (float)(samples[i] / peak * gain);
    return COMMAND_OK;
#else
    (void)samples;
    (void)count;
    (void)rate;
    (void)start;
    (void)gain;
    return command_fail("cannot speak '%s': %s", dataset_words[sound->word], dataset_speech_start());
#endif
}

int dataset_sound_render(dataset_sound_t const *sound, float *samples, size_t count, size_t rate,
                         random_stream_t *random) {
    memset(samples, 0, count * sizeof *samples);
    double gain = random_stream_between(random, 0.3, 0.7);
    switch (sound->kind) {
    case DATASET_TONE: {
        double start = random_stream_between(random, 0.02, 0.15),
               length = random_stream_between(random, 0.5, 0.8);
        add_notes(samples, count, rate, &sound->note, 1, start, length, gain);
        return COMMAND_OK;
    }
    case DATASET_CHORD: {
        size_t notes[3] = {sound->note, sound->note + (sound->variant ? 3 : 4), sound->note + 7};
        double start = random_stream_between(random, 0.02, 0.15),
               length = random_stream_between(random, 0.5, 0.8);
        add_notes(samples, count, rate, notes, 3, start, length, gain);
        return COMMAND_OK;
    }
    case DATASET_NOISE: {
        double length = sound->variant ? random_stream_between(random, 0.5, 0.8)
                                       : random_stream_between(random, 0.1, 0.25);
        double start = random_stream_between(random, 0.02, 0.95 - length);
        add_noise(samples, count, rate, sound->pitch, start, length, gain, random);
        return COMMAND_OK;
    }
    case DATASET_RHYTHM: {
        /* Beeps of 60 ms: 2-3 a second slow, 7-10 fast. */
        double interval = sound->variant ? random_stream_between(random, 0.1, 0.14)
                                         : random_stream_between(random, 0.33, 0.5);
        for (double start = random_stream_between(random, 0.0, 0.08); start + 0.06 <= 1.0; start += interval)
            add_notes(samples, count, rate, &sound->note, 1, start, 0.06, gain);
        return COMMAND_OK;
    }
    case DATASET_SPEECH:
        return add_speech(samples, count, rate, sound, random_stream_between(random, 0, 0.1), gain);
    case DATASET_SOUND_KINDS:
        break;
    }
    return command_fail("unknown kind of sound %d", (int)sound->kind);
}

size_t dataset_sound_note(dataset_sound_kind_t kind, size_t pitch, random_stream_t *random) {
    if (kind != DATASET_TONE && kind != DATASET_CHORD && kind != DATASET_RHYTHM) return 0;
    return draw_note(pitch, kind == DATASET_TONE, random);
}

/* ---- WAV ----------------------------------------------------------------------------------------- */

static void put_u32(uint8_t *at, uint32_t value) {
    for (int i = 0; i < 4; ++i)
        at[i] = (uint8_t)(value >> (8 * i));
}

static void put_u16(uint8_t *at, uint16_t value) {
    at[0] = (uint8_t)value;
    at[1] = (uint8_t)(value >> 8);
}

int dataset_wav_write(char const *path, float const *samples, size_t count, size_t rate) {
    size_t bytes = count * 2;
    uint8_t *data = malloc(44 + bytes);
    if (!data) return command_fail("out of memory");
    memcpy(data, "RIFF", 4);
    put_u32(data + 4, (uint32_t)(36 + bytes));
    memcpy(data + 8, "WAVEfmt ", 8);
    put_u32(data + 16, 16);
    put_u16(data + 20, 1); /* PCM */
    put_u16(data + 22, 1); /* mono */
    put_u32(data + 24, (uint32_t)rate);
    put_u32(data + 28, (uint32_t)(rate * 2));
    put_u16(data + 32, 2);
    put_u16(data + 34, 16);
    memcpy(data + 36, "data", 4);
    put_u32(data + 40, (uint32_t)bytes);
    for (size_t i = 0; i < count; ++i) {
        double value = samples[i] < -1 ? -1 : samples[i] > 1 ? 1 : samples[i];
        put_u16(data + 44 + 2 * i, (uint16_t)(int16_t)lround(value * 32767));
    }
    int code = COMMAND_OK;
    FILE *file = fopen(path, "wb");
    if (!file) {
        code = command_fail("cannot create %s: %s", path, strerror(errno));
    } else {
        bool written = fwrite(data, 1, 44 + bytes, file) == 44 + bytes;
        int error = errno;
        if (fclose(file) != 0 && written) {
            error = errno;
            written = false;
        }
        if (!written) {
            code = command_fail("cannot write %s: %s", path, strerror(error));
            remove(path);
        }
    }
    free(data);
    return code;
}
