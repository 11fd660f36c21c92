/* The VRAM executor's verbs (encode_verbs_vram, src/encode/verbs.h): text_encode and text_choose
 * (src/vram/vram_text.c), image_encode_pixels (src/vram/vram_image.c), and image_encode of files and
 * encoded images, video_encode, audio_encode and audio_encode_samples (src/vram/vram_media.c). */
#include "call.h"
#include "model.h"
#include "vram.h"
#include "vram_support.h"

#if UFORM_WITH_CUDA

/* A tower the model has but the load did not place (vram_support.h): its refusal, else NULL. */
static char const *vram_unplaced(encode_request_t const *request, char const *name, bool placed) {
    return placed ? NULL : vram_tower_refusal(&request->model->header.info, name);
}

static uform_status_t vram_image_verb(char const *entry, image_request_t const *request) {
    uform_model_t const *model = request->encode.model;
    char const *refusal = vram_unplaced(&request->encode, "image", model->device->replicas[0].has_image);
    if (refusal) return call_refuse(request->encode.outcome, UFORM_UNSUPPORTED, entry, refusal);
    /* Pixels the device front end does not prepare as the model's own does: on the host, as image files
     * are, where the host reads them. */
    char const *on_host =
        request->input == IMAGE_INPUT_PIXELS ? vram_pixels_refusal(&model->header.info) : NULL;
    if (on_host && vram_memory(request->encode.tape.data) == VRAM_ON_DEVICE)
        return call_refuse(request->encode.outcome, UFORM_UNSUPPORTED, entry, on_host);
    if (on_host) return vram_media_encode(entry, request, NULL);
    return vram_image_encode(entry, request);
}

static uform_status_t vram_video_encode(char const *entry, image_request_t const *request) {
    char const *refusal =
        vram_unplaced(&request->encode, "image", request->encode.model->device->replicas[0].has_image);
    if (refusal) return call_refuse(request->encode.outcome, UFORM_UNSUPPORTED, entry, refusal);
    return vram_media_encode(entry, request, NULL);
}

static uform_status_t vram_audio_encode(char const *entry, audio_request_t const *request) {
    char const *refusal =
        vram_unplaced(&request->encode, "audio", request->encode.model->device->replicas[0].has_audio);
    if (refusal) return call_refuse(request->encode.outcome, UFORM_UNSUPPORTED, entry, refusal);
    return vram_media_encode(entry, NULL, request);
}

encode_verbs_t const encode_verbs_vram = {
    .text_encode = vram_text_encode,
    .text_choose = vram_text_choose,
    .image_encode = vram_image_verb,
    .video_encode = vram_video_encode,
    .audio_encode = vram_audio_encode,
};

#endif /* UFORM_WITH_CUDA */
