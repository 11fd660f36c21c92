/* The VRAM executor's verbs (encode_verbs_vram, src/encode/verbs.h): text_encode and text_choose
 * (src/vram/vram_text.c), image_encode of pixels and of encoded images in memory
 * (src/vram/vram_image.c); video is not built on VRAM executors, and audio runs on host executors. */
#include "call.h"
#include "vram.h"

#if UFORM_WITH_CUDA

static uform_status_t vram_video_encode(char const *entry, image_request_t const *request) {
    return call_refuse(request->encode.outcome, UFORM_UNSUPPORTED, entry,
                       "video_encode runs on host executors: this VRAM executor encodes texts and images");
}

encode_verbs_t const encode_verbs_vram = {
    .text_encode = vram_text_encode,
    .text_choose = vram_text_choose,
    .image_encode = vram_image_encode,
    .video_encode = vram_video_encode,
    .audio_encode = audio_encode_host, /* refuses a VRAM model: its audio tower is not on the host */
};

#endif /* UFORM_WITH_CUDA */
