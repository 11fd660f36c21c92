/* libFuzzer: audio_decode (libavformat demuxing over the bytes, libavcodec decoding of the first audio
 * stream, libswresample conversion to mono F32) on arbitrary bytes, for the audio front end of a model of
 * 16 kHz, 25 ms windows and 10 s clips; every sample decoded is read, so that a short buffer shows under
 * AddressSanitizer. */
#include <stdint.h>

#include "audio_decode.h"
#include "audio_frontend.h"

#include <libavutil/log.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(uint8_t const *data, size_t size);

static audio_frontend_t frontend;
static audio_pcm_t pcm;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    av_log_set_level(AV_LOG_QUIET);
    uform_model_info_t info = {.audio = {.rate = 16000,
                                         .mels = 64,
                                         .window = 400,
                                         .hop = 160,
                                         .patch_frames = 16,
                                         .max_patches = 64,
                                         .seconds = 10.0}};
    if (audio_frontend_init(&frontend, &info) != UFORM_OK) __builtin_trap();
    return 0;
}

int LLVMFuzzerTestOneInput(uint8_t const *data, size_t size) {
    uform_status_t status = audio_decode(data, size, &frontend, &pcm);
    if (status != UFORM_OK) return 0;
    if (pcm.length > pcm.capacity || (pcm.length && pcm.rate == 0)) __builtin_trap();
    for (size_t i = 0; i < pcm.length; ++i)
        if (pcm.samples[i] - pcm.samples[i] != 0) __builtin_trap(); /* NaN and infinity answer UFORM_FORMAT */
    return 0;
}
