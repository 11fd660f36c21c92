/* The engine's log-mel front end as a filter, for tests/reference/test_audio_reference.py (the library
 * exports only uform_* symbols, so the reference reaches the front end through this program):
 *
 *     audio_log_mel RATE MELS WINDOW HOP < samples.f32 > log_mel.f32
 *
 * reads native-endian F32 samples at RATE from standard input and writes the [frames, MELS] log-mel
 * matrix of all their frames, F32, row-major. Exit status: 0, 1 on bad arguments or input, 2 when
 * the front end cannot be made. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "audio_frontend.h"

static int parse(char const *text, size_t *value) {
    char *end = NULL;
    unsigned long long parsed = strtoull(text, &end, 10);
    if (!*text || *end || parsed == 0 || parsed > (1u << 20)) return 0;
    *value = (size_t)parsed;
    return 1;
}

int main(int argc, char **argv) {
    uform_model_info_t info;
    memset(&info, 0, sizeof info);
    if (argc != 5 || !parse(argv[1], &info.audio.rate) || !parse(argv[2], &info.audio.mels) ||
        !parse(argv[3], &info.audio.window) || !parse(argv[4], &info.audio.hop) || info.audio.window < 2) {
        fprintf(stderr, "usage: %s RATE MELS WINDOW HOP < samples.f32 > log_mel.f32\n", argv[0]);
        return 1;
    }
    info.audio.patch_frames = 1;
    info.audio.max_patches = 1;
    info.audio.seconds = 1;
    size_t capacity = 1 << 16, length = 0;
    float *samples = malloc(capacity * sizeof(float));
    while (samples) {
        length += fread(samples + length, sizeof(float), capacity - length, stdin);
        if (length < capacity) break;
        float *grown = realloc(samples, 2 * capacity * sizeof(float));
        if (!grown) free(samples);
        samples = grown;
        capacity *= 2;
    }
    if (!samples || ferror(stdin)) {
        fprintf(stderr, "%s: cannot read the samples\n", argv[0]);
        free(samples);
        return 1;
    }
    audio_frontend_t frontend;
    audio_spectrum_t spectrum;
    if (audio_frontend_init(&frontend, &info) != UFORM_OK) {
        free(samples);
        return 2;
    }
    if (audio_spectrum_init(&spectrum, &frontend) != UFORM_OK) {
        audio_frontend_free(&frontend);
        free(samples);
        return 2;
    }
    size_t frames = audio_frames(&frontend, length);
    float *log_mel = malloc(frames * frontend.mels * sizeof(float) + 1);
    int status = 2;
    if (log_mel) {
        audio_log_mel(&frontend, &spectrum, samples, frames, log_mel);
        status =
            fwrite(log_mel, sizeof(float), frames * frontend.mels, stdout) == frames * frontend.mels ? 0 : 1;
    }
    free(log_mel);
    audio_spectrum_free(&spectrum);
    audio_frontend_free(&frontend);
    free(samples);
    return status;
}
