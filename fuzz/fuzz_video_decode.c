/* libFuzzer: video_decode (libavformat demuxing over the bytes, libavcodec decoding, libswscale
 * conversion, the sampling of 4 frames) on arbitrary bytes; every byte of every frame handed out is
 * read, so that a short buffer shows under AddressSanitizer. */
#include <stdint.h>

#include "uform_config.h"
#include "video_decode.h"

#if UFORM_WITH_FFMPEG
#include <libavutil/log.h>
#endif

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(uint8_t const *data, size_t size);

static uform_status_t read_frame(void *context, size_t first, size_t count, video_frame_t const *frame) {
    uint32_t *sum = context;
    if (first + count > 4 || count == 0) return UFORM_INTERNAL; /* each sample exactly once, in order */
    for (size_t y = 0; y < frame->height; ++y)
        for (size_t x = 0; x < frame->width * 3; ++x)
            *sum += frame->rgb[y * frame->stride + x];
    return UFORM_OK;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
#if UFORM_WITH_FFMPEG
    av_log_set_level(AV_LOG_QUIET);
#endif
    return 0;
}

int LLVMFuzzerTestOneInput(uint8_t const *data, size_t size) {
    uint32_t sum = 0;
    uform_status_t status = video_decode(data, size, 4, read_frame, &sum);
    if (status == UFORM_INTERNAL) __builtin_trap(); /* the sampler broke its promise */
    return 0;
}
