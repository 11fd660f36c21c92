/* The VRAM entry points of a build without CUDA (src/vram/vram.h): loading onto a VRAM executor
 * answers UFORM_UNSUPPORTED, so no model is ever on a device; the VRAM verbs, which only a model on a
 * device reaches, answer the same. */
#include "call.h"
#include "vram.h"

static char const no_cuda[] = "built without CUDA";

uform_status_t vram_model_load(uform_model_load_args_t const *args, char const *entry) {
    if (!args->path || !args->path[0])
        return call_refuse(args->outcome, UFORM_INVALID_ARGUMENT, entry, "path is NULL or empty");
    return call_refuse(args->outcome, UFORM_UNSUPPORTED, entry, no_cuda);
}

/* No model has device weights in this build: there is nothing to free. */
void vram_model_release(uform_model_t *model) {
    (void)model;
}

static uform_status_t text_encode_none(encode_request_t const *request) {
    return call_refuse(request->outcome, UFORM_UNSUPPORTED, "uform_text_encode", no_cuda);
}

static uform_status_t text_choose_none(uform_text_choose_args_t const *args) {
    return call_refuse(args->outcome, UFORM_UNSUPPORTED, "uform_text_choose", no_cuda);
}

static uform_status_t image_encode_none(char const *entry, image_request_t const *request) {
    return call_refuse(request->encode.outcome, UFORM_UNSUPPORTED, entry, no_cuda);
}

encode_verbs_t const encode_verbs_vram = {
    .text_encode = text_encode_none,
    .text_choose = text_choose_none,
    .image_encode = image_encode_none,
    .video_encode = image_encode_none,
    .audio_encode = audio_encode_host, /* audio runs on host executors in every build */
};
