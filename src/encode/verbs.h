/* The encode verbs behind their front doors (src/encode/verbs.c).
 *
 * Each public verb checks its arguments once, then hands the checked request to its model's table of
 * implementations: the host's (src/encode/text.c, image.c, video.c, audio.c) for a host model, the
 * VRAM executor's (src/vram/) for a model loaded on one. An implementation trusts what the door
 * checked and answers what only its residency knows. */
#pragma once

#include "encode.h"

/* ---- Requests ----------------------------------------------------------------------------------- */

typedef enum image_input {
    IMAGE_INPUT_PIXELS = 0,
    IMAGE_INPUT_FILES,
    IMAGE_INPUT_MEMORY,
} image_input_t;

/* What the image and video doors hand to an implementation. */
typedef struct image_request {
    encode_request_t encode;
    image_input_t input;
    size_t const *heights, *widths; /* pixels only */
    bool video;                     /* the tape holds clips, or their paths */
} image_request_t;

typedef enum audio_input {
    AUDIO_INPUT_SAMPLES = 0,
    AUDIO_INPUT_FILES,
    AUDIO_INPUT_MEMORY,
} audio_input_t;

/* What the audio doors hand to an implementation. */
typedef struct audio_request {
    encode_request_t encode;
    audio_input_t input;
    size_t rate; /* of the samples */
} audio_request_t;

/* ---- Implementations ---------------------------------------------------------------------------- */

/* One residency's verbs, each given a checked request and the public entry's name for its messages.
 * Each answers as its public verb does: UFORM_OK once submitted with an outcome, else the call's
 * status, or the refusal of what this residency does not run. */
typedef struct encode_verbs {
    uform_status_t (*text_encode)(encode_request_t const *request);
    uform_status_t (*text_choose)(uform_text_choose_args_t const *args);
    uform_status_t (*image_encode)(char const *entry, image_request_t const *request);
    uform_status_t (*video_encode)(char const *entry, image_request_t const *request);
    uform_status_t (*audio_encode)(char const *entry, audio_request_t const *request);
} encode_verbs_t;

/* The host's verbs (src/encode; image_encode_host runs video too), every model's unless its load set
 * model->verbs, and the VRAM executor's (src/vram/vram_verbs.c, built with CUDA: the VRAM load sets
 * them). Audio runs on host executors only: both tables hold audio_encode_host, which refuses a model
 * whose audio tower is not on the host. */
extern encode_verbs_t const encode_verbs_host;
extern encode_verbs_t const encode_verbs_vram;

uform_status_t text_encode_host(encode_request_t const *request);
/* text_encode of a host model whose text tower reads tokens (text_tokens.c). */
uform_status_t text_encode_tokens_host(encode_request_t const *request);
/* The prompt a text_encode of such a model puts before each text (uform_encode_config_t): `*prompt` the text
 * (the config's, or the model's, valid until the calling thread's next call), or NULL for none. false for a
 * prompt name the model lacks. */
bool text_prompt(uform_model_t const *model, uform_encode_config_t const *config, char const **prompt);
uform_status_t text_choose_host(uform_text_choose_args_t const *args);
uform_status_t image_encode_host(char const *entry, image_request_t const *request);
uform_status_t audio_encode_host(char const *entry, audio_request_t const *request);
